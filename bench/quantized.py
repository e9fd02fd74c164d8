"""Benchmarks the quantized linear kernels (transformer_core.quantization) against fp32 OpenBLAS.

Usage::

    .venv/bin/python bench/quantized.py                    # every case, 1 and 2 threads
    .venv/bin/python bench/quantized.py --quick            # fewer shapes, smaller working set
    .venv/bin/python bench/quantized.py --threads 1 --isas avx2,avx512vnni --working-set-mib 1024

What it measures:
    * matrix-vector products (decoding: one row of x) for SmolLM2-135M's shapes — q/o 576x576,
      k/v 192x576, gate/up 1536x576, down 576x1536, lm head 49152x576 — for every format (int8,
      GGUF Q8_0/Q4_0/Q4_1 with fp32 activations ("f32") and with Q8 activations ("q8x")), every
      instruction set the CPU supports, and fp32 sgemv (OpenBLAS, what ``tc.functional.linear``
      calls with one row). GB/s = bytes of weights / time; GFLOP/s = 2·out·in / time;
      "vs fp32" = fp32 time / this time (> 1: faster than fp32).
    * The weights stream from memory as in decoding: each case cycles through enough copies of its
      weights to cover ``--working-set-mib`` (default 512 MiB), so they are not cache-resident.
    * matrix-matrix products (prefill) at 128 and 512 rows: GFLOP/s and the ratio to fp32 sgemm.
    * Each time is the median of single calls (after a warm-up), within a time budget per case.
      The compiled functions are called directly (``transformer_core._core``: the arrays are
      already validated), so Python's argument checking (~2-3 µs) is not in the figures.
    * The machine's memory bandwidth: a single-threaded numpy copy of 512 MiB ((read + write) / time).

The table is printed and written as Markdown to ``bench/results/quantized.md`` (git-ignored).
Timings on a shared machine are noisy: the header records the load average.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_FILE = BENCH_DIR / "results" / "quantized.md"
MIB = 1024 * 1024

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


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown CPU"


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--isas", default="", help="comma-separated ISAs (default: all supported)")
    ap.add_argument("--working-set-mib", type=int, default=512, help="weights cycled per matrix-vector case")
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per case (default 0.3)")
    ap.add_argument("--quick", action="store_true", help="3 shapes, 128 MiB working set, 128-row prefill only")
    args = ap.parse_args()

    sys.path.insert(0, str(BENCH_DIR.parent / "python"))
    import transformer_core as tc
    from gguf import GGMLQuantizationType
    from gguf import quants as gq

    core = tc._core
    isas = [s for s in args.isas.split(",") if s] or tc.quantization.supported_isas()
    threads = [int(t) for t in args.threads.split(",")]
    working_set = (128 if args.quick else args.working_set_mib) * MIB
    shapes = {k: SHAPES[k] for k in (QUICK_SHAPES if args.quick else SHAPES)}
    matmat_rows = [128] if args.quick else [128, 512]
    rng = np.random.default_rng(0)

    lines: list[str] = []

    def emit(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    bw = memory_bandwidth()
    load = os.getloadavg()
    emit(f"# Quantized linear kernels — {datetime.now():%Y-%m-%d %H:%M}")
    emit()
    emit(f"- CPU: {cpu_model()} ({os.cpu_count()} logical CPUs); ISAs: {', '.join(tc.quantization.supported_isas())}")
    emit(f"- memory bandwidth (numpy copy of 512 MiB, 1 thread, read + write): **{bw:.1f} GB/s**")
    emit(f"- load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
         + (" — **busy machine: noisy timings**" if load[0] > (os.cpu_count() or 1) * 0.5 else ""))
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
            ws = [w] + [w.copy() for _ in range(copies_for(w.nbytes, working_set) - 1)]
            t32 = median_call([lambda ww=ww: core.linear_f32(x, ww, None, "") for ww in ws], args.budget)
            del ws
            emit(f"| {name} | fp32 (OpenBLAS sgemv) | — | {nt} | {t32 * 1e6:.1f} | {w.nbytes / t32 / 1e9:.1f} | "
                 f"{flops / t32 / 1e9:.1f} | 1.00 |")
            cases = [("int8", qw.nbytes, [qw] + [qw.copy() for _ in range(copies_for(qw.nbytes, working_set) - 1)],
                      lambda q: core.linear_int8(x=x, qweight=q, scales=scales, bias=None))]
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
                t32 = median_call([lambda: core.linear_f32(x, w, None, "")], args.budget)
                emit(f"| {name} | {rows} | fp32 (OpenBLAS sgemm) | — | {nt} | {t32 * 1e3:.2f} | "
                     f"{flops / t32 / 1e9:.1f} | 1.00 |")
                for isa in simd:
                    tc.quantization.set_isa(isa)
                    cases = [("int8", lambda: core.linear_int8(x=x, qweight=qw, scales=scales, bias=None))]
                    for t in GGUF_TYPES:
                        for qa in (False, True):
                            cases.append((f"{t} {'q8x' if qa else 'f32'}", lambda t=t, qa=qa: core.linear_gguf(
                                x=x, blocks=blocks[t], ggml_type=t, out_features=n, in_features=k, bias=None,
                                quantize_activations=qa)))
                    for label, fn in cases:
                        tt = median_call([fn], args.budget)
                        emit(f"| {name} | {rows} | {label} | {isa} | {nt} | {tt * 1e3:.2f} | "
                             f"{flops / tt / 1e9:.1f} | {t32 / tt:.2f} |")

    RESULTS_FILE.parent.mkdir(exist_ok=True)
    RESULTS_FILE.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"\nwritten to {RESULTS_FILE}")


if __name__ == "__main__":
    main()
