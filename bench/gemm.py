"""Our fp32 GEMM kernels (kernels/sgemm.hpp) against torch's (MKL), on the linear layers' shapes.

Usage::

    .venv/bin/python bench/gemm.py                     # 1 and 2 threads, every ISA this CPU has
    .venv/bin/python bench/gemm.py --threads 2 --repeats 30

Each row times ``functional.linear(x, w, b)`` (x: [rows, in], w: [out, in]; the weight packed once
per call, then the tiles in parallel) for each of our ISAs (``quantization.set_isa``: "avx512vnni"
runs the AVX-512 kernel, "avx2" the AVX2 one) and ``torch.nn.functional.linear`` on the same
arrays, in one process, interleaved: after one warm-up call of each, every repeat calls each ISA of
ours once and then torch once (ours avx2, ours avx512vnni, torch, ours avx2, ...), so a noisy
minute falls on all of them; each keeps its best of ``--repeats``. It prints GFLOP/s (2 · rows · in ·
out per call) of each, the ratio of our best ISA to torch, and the largest absolute difference
between any ISA's output and torch's (``max err``: a wrong kernel shows; float32 sums in another
order differ by ~1e-5 to 1e-4 at these depths). The ISA active at start is set again at the end.
Shapes: all-MiniLM-L6-v2 on a 32-sentence batch (900 rows), SmolLM2-135M's prefill (512 rows),
GPT-2-small's training batch (2048 rows), and 2048³. Markdown goes to stdout.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import MAX_THREADS, cpu_isa, cpu_name, int_in, int_list, load_average  # noqa: E402

SHAPES = [  # (label, rows, in_features, out_features)
    ("MiniLM QKV", 900, 384, 1152),
    ("MiniLM FFN1", 900, 384, 1536),
    ("MiniLM FFN2", 900, 1536, 384),
    ("SmolLM2 gate/up", 512, 576, 1536),
    ("SmolLM2 down", 512, 1536, 576),
    ("GPT-2 FFN1", 2048, 768, 3072),
    ("2048³", 2048, 2048, 2048),
]


def best_times(calls, repeats: int) -> list[float]:
    """Best seconds of each call, timed interleaved. ``calls``: ``(prepare, fn)`` pairs; ``prepare()``
    runs untimed before each ``fn()`` (it selects the ISA). One warm-up call of each, then ``repeats``
    rounds, each calling every one once in turn."""
    for prepare, fn in calls:
        prepare()
        fn()
    best = [float("inf")] * len(calls)
    for _ in range(repeats):
        for i, (prepare, fn) in enumerate(calls):
            prepare()
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int_list(1, MAX_THREADS), default=[1, 2],
                   help=f"comma-separated thread counts, each 1 to {MAX_THREADS} (default 1,2)")
    p.add_argument("--repeats", type=int_in(1), default=15, help="timed calls of each side (default 15)")
    args = p.parse_args(argv)
    threads = args.threads

    import torch
    import transformer_core as tc
    from transformer_core import functional, quantization

    isas = [i for i in quantization.supported_isas() if i != "scalar"]  # scalar runs the AVX2 kernels
    start_isa = quantization.isa()
    cpu = cpu_name()
    print(f"# fp32 linear: ours ({', '.join(isas)}) vs torch {torch.__version__}, GFLOP/s")
    print(f"\n{cpu}, {cpu_isa()}; load average at start {load_average()}; best of {args.repeats} interleaved "
          "repeats\n")
    print("| shape | rows × in × out | threads | " + " | ".join(f"ours {i}" for i in isas)
          + " | torch | ours/torch | max err |")
    print("|---|---|---|" + "---|" * len(isas) + "---|---|---|")
    rng = np.random.default_rng(0)
    try:
        with torch.inference_mode():
            for label, m, k, n in SHAPES:
                x = rng.standard_normal((m, k), dtype=np.float32)
                w = rng.standard_normal((n, k), dtype=np.float32)
                b = rng.standard_normal(n, dtype=np.float32)
                tx, tw, tb = (torch.from_numpy(a) for a in (x, w, b))
                flops = 2.0 * m * n * k
                ref = torch.nn.functional.linear(tx, tw, tb).numpy()
                err = 0.0
                for isa in isas:
                    quantization.set_isa(isa)
                    err = max(err, float(np.max(np.abs(functional.linear(x, w, b) - ref))))
                for t in threads:
                    tc.set_num_threads(t)
                    torch.set_num_threads(t)
                    calls = [(lambda isa=isa: quantization.set_isa(isa), lambda: functional.linear(x, w, b))
                             for isa in isas]
                    calls.append((lambda: None, lambda: torch.nn.functional.linear(tx, tw, tb)))
                    rates = [flops / s / 1e9 for s in best_times(calls, args.repeats)]
                    ours, theirs = rates[:-1], rates[-1]
                    cells = " | ".join(f"{r:.0f}" for r in ours)
                    print(f"| {label} | {m} × {k} × {n} | {t} | {cells} | {theirs:.0f} | {max(ours) / theirs:.2f} | "
                          f"{err:.1e} |", flush=True)
    finally:
        quantization.set_isa(start_isa)
    print(f"\nload average at end {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
