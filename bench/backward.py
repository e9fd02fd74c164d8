"""Backward passes, ours against torch autograd, in one process, fp32, the same thread count.

Usage::

    .venv/bin/python bench/backward.py                 # 2 threads, 7 repeats
    .venv/bin/python bench/backward.py --threads 1 --repeats 3

Cases:
    attention   scaled_dot_product_attention backward, (N, H, L, D) = (8, 12, 256, 64), causal:
                ours (FlashAttention-2 backward, two deterministic passes) vs torch's
                F.scaled_dot_product_attention backward (torch.autograd.grad on a retained graph);
    dropout     attention with dropout on the probabilities (dropout_p 0.1), (4, 12, 256, 64),
                forward and backward together: ours (the mask regenerated from its seed in the
                backward) vs torch's F.scaled_dot_product_attention(dropout_p=0.1) and its
                autograd (torch's math path, which stores the mask). The error column compares
                ours with torch's math given our mask (torch draws its own);
    linear      linear backward, x (2048, 768), weight (3072, 768), bias: grad_x, grad_weight,
                grad_bias vs torch.autograd.grad of F.linear.

Only the backward is timed: the forward (and, for ours, the log-sum-exp, computed by torch here)
is done once. Ours and torch run interleaved after a warm-up; each figure is the median. The last
column is the largest absolute difference between our gradients and torch's, so that a fast wrong
answer shows. On a shared machine the numbers are noisy.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import MAX_THREADS, cpu_isa, cpu_name, int_in  # noqa: E402


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def interleave(ours, theirs, repeats: int) -> tuple[float, float]:
    ours(), theirs()  # warm-up
    a, b = [], []
    for _ in range(repeats):
        a += timed(ours, 1)
        b += timed(theirs, 1)
    return statistics.median(a), statistics.median(b)


def bench_attention(B, torch, repeats: int):
    import torch.nn.functional as TF

    N, H, L, D = 8, 12, 256, 64
    rng = np.random.default_rng(0)
    q, k, v, gout = (rng.standard_normal((N, H, L, D)).astype(np.float32) for _ in range(4))
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out_t = TF.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    gout_t = torch.tensor(gout)
    with torch.no_grad():
        s = (qt @ kt.transpose(-2, -1)) / math.sqrt(D)
        s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
        lse = torch.logsumexp(s, -1).numpy()
    out = out_t.detach().numpy()

    def ours():
        return B.scaled_dot_product_attention_backward(q, k, v, out, gout, lse, is_causal=True)

    def theirs():
        return torch.autograd.grad(out_t, (qt, kt, vt), gout_t, retain_graph=True)

    err = max(float(np.abs(a - b.numpy()).max()) for a, b in zip(ours(), theirs()))
    flops = 2.0 * 2 * N * H * L * L * D * 2.5 / 2  # 2.5 forward's matmuls, causal half
    return "attention backward (8,12,256,64) causal", interleave(ours, theirs, repeats), err, flops


def bench_dropout(B, torch, repeats: int):
    import torch.nn.functional as TF
    from transformer_core import functional as F

    N, H, L, D, p, seed = 4, 12, 256, 64, 0.1, 7
    rng = np.random.default_rng(2)
    q, k, v, gout = (rng.standard_normal((N, H, L, D)).astype(np.float32) for _ in range(4))
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    gout_t = torch.tensor(gout)

    def ours():
        out, lse = F.scaled_dot_product_attention(q, k, v, dropout_p=p, seed=seed, return_lse=True)
        return (out,) + B.scaled_dot_product_attention_backward(q, k, v, out, gout, lse, dropout_p=p, seed=seed)

    def theirs():
        out_t = TF.scaled_dot_product_attention(qt, kt, vt, dropout_p=p)
        return (out_t,) + torch.autograd.grad(out_t, (qt, kt, vt), gout_t)

    # the error: ours against torch's math with our mask (keep / (1 - p), functional.dropout of ones)
    factor = torch.tensor(F.dropout(np.ones((N, H, L, L), np.float32), p, seed))
    want = (torch.softmax(qt @ kt.transpose(-2, -1) / math.sqrt(D), -1) * factor) @ vt
    ref = (want,) + torch.autograd.grad(want, (qt, kt, vt), gout_t)
    err = max(float(np.abs(a - b.detach().numpy()).max()) for a, b in zip(ours(), ref))
    flops = 2.0 * 2 * N * H * L * L * D * 3.5  # the forward's two products and the backward's five
    return "attention fwd+bwd dropout 0.1 (4,12,256,64)", interleave(ours, theirs, repeats), err, flops


def bench_linear(B, torch, repeats: int):
    import torch.nn.functional as TF

    rows, d_in, d_out = 2048, 768, 3072
    rng = np.random.default_rng(1)
    x = rng.standard_normal((rows, d_in)).astype(np.float32)
    w = (rng.standard_normal((d_out, d_in)) * 0.02).astype(np.float32)
    b = np.zeros(d_out, np.float32)
    gy = rng.standard_normal((rows, d_out)).astype(np.float32)
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    yt = TF.linear(xt, wt, bt)
    gyt = torch.tensor(gy)

    def ours():
        return B.linear_backward(x, w, gy)

    def theirs():
        return torch.autograd.grad(yt, (xt, wt, bt), gyt, retain_graph=True)

    err = max(float(np.abs(a - c.numpy()).max()) for a, c in zip(ours(), theirs()))
    flops = 2.0 * 2 * rows * d_in * d_out
    return "linear backward 2048x768 -> 3072", interleave(ours, theirs, repeats), err, flops


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int_in(1, MAX_THREADS), default=2,
                        help=f"threads for ours and torch, 1 to {MAX_THREADS} (default 2)")
    parser.add_argument("--repeats", type=int_in(1), default=7, help="timed calls of each side (default 7)")
    args = parser.parse_args(argv)

    import torch
    import transformer_core as tc
    from transformer_core import backward as B

    torch.set_num_threads(args.threads)
    tc.set_num_threads(args.threads)
    print(f"# {cpu_name()}, {os.cpu_count()} CPUs, {cpu_isa()}, load {os.getloadavg()[0]:.2f}; torch {torch.__version__}; "
          f"threads {args.threads}; fp32; median of {args.repeats} (noisy on a shared machine)")
    print(f"{'case':42s} {'ours ms':>9s} {'torch ms':>9s} {'torch/ours':>10s} {'ours GFLOP/s':>12s} {'max err':>9s}")
    for case in (bench_attention, bench_dropout, bench_linear):
        name, (ours_ms, torch_ms), err, flops = case(B, torch, args.repeats)
        print(f"{name:42s} {ours_ms:9.2f} {torch_ms:9.2f} {torch_ms / ours_ms:10.2f} "
              f"{flops / ours_ms / 1e6:12.1f} {err:9.2e}")


if __name__ == "__main__":
    main()
