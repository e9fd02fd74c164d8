"""Our fp32 GEMM kernels (kernels/sgemm.hpp) against torch's (MKL), on the linear layers' shapes.

Usage::

    .venv/bin/python bench/gemm.py                     # 1 and 2 threads, every ISA this CPU has
    .venv/bin/python bench/gemm.py --threads 2 --repeats 30

Each row times ``functional.linear(x, w, b)`` (x: [rows, in], w: [out, in]; the weight packed once
per call, then the tiles in parallel) and ``torch.nn.functional.linear`` on the same arrays, in one
process, interleaved, best of ``--repeats`` after a warm-up, and prints GFLOP/s (2 · rows · in · out
per call) for each of our ISAs (``quantization.set_isa``: "avx512vnni" runs the AVX-512 kernel,
"avx2" the AVX2 one) and torch's, and the ratio of our best ISA to torch. Shapes: all-MiniLM-L6-v2 on
a 32-sentence batch (900 rows), SmolLM2-135M's prefill (512 rows), GPT-2-small's training batch
(2048 rows), and 2048³. Markdown goes to stdout.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import cpu_isa, cpu_name, load_average  # noqa: E402

SHAPES = [  # (label, rows, in_features, out_features)
    ("MiniLM QKV", 900, 384, 1152),
    ("MiniLM FFN1", 900, 384, 1536),
    ("MiniLM FFN2", 900, 1536, 384),
    ("SmolLM2 gate/up", 512, 576, 1536),
    ("SmolLM2 down", 512, 1536, 576),
    ("GPT-2 FFN1", 2048, 768, 3072),
    ("2048³", 2048, 2048, 2048),
]


def best_time(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args(argv)
    try:
        threads = [int(t) for t in args.threads.split(",") if t]
    except ValueError:
        p.error(f"--threads: expected comma-separated integers, got {args.threads!r}")
    if not threads or min(threads) < 1 or args.repeats < 1:
        p.error("--threads and --repeats: expected positive integers")

    import torch
    import transformer_core as tc
    from transformer_core import functional, quantization

    isas = [i for i in quantization.supported_isas() if i != "scalar"]  # scalar runs the AVX2 kernels
    cpu = cpu_name()
    print(f"# fp32 linear: ours ({', '.join(isas)}) vs torch {torch.__version__}, GFLOP/s")
    print(f"\n{cpu}, {cpu_isa()}; load average at start {load_average()}\n")
    print("| shape | rows × in × out | threads | " + " | ".join(f"ours {i}" for i in isas) + " | torch | ours/torch |")
    print("|---|---|---|" + "---|" * len(isas) + "---|---|")
    rng = np.random.default_rng(0)
    for label, m, k, n in SHAPES:
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((n, k), dtype=np.float32)
        b = rng.standard_normal(n, dtype=np.float32)
        tx, tw, tb = (torch.from_numpy(a) for a in (x, w, b))
        flops = 2.0 * m * n * k
        for t in threads:
            tc.set_num_threads(t)
            torch.set_num_threads(t)
            rates = []
            for isa in isas:
                quantization.set_isa(isa)
                rates.append(flops / best_time(lambda: functional.linear(x, w, b), args.repeats) / 1e9)
            with torch.inference_mode():
                ref = flops / best_time(lambda: torch.nn.functional.linear(tx, tw, tb), args.repeats) / 1e9
            cells = " | ".join(f"{r:.0f}" for r in rates)
            print(f"| {label} | {m} × {k} × {n} | {t} | {cells} | {ref:.0f} | {max(rates) / ref:.2f} |")
    print(f"\nload average at end {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
