"""Our fp32 GEMM kernels (kernels/sgemm.hpp), through the ops that use them.

``functional.linear`` (more than 32 rows), ``backward.linear_backward`` and attention run fp32
products on our AVX-512 or AVX2 micro-kernels. Each output element is one FMA chain over the inner
dimension in order, so:

* every ISA this CPU has gives the same bits (``quantization.set_isa`` switches them), and so do 1
  and 2 threads;
* results match torch in fp64 to fp32 rounding (relative 1e-5 of the row's scale).

Shapes cross every edge where the kernels change path: micro-tile rows (AVX-512 12, AVX2 6), the
panel width 32 and the half panel 16, the 16 × 16 transposes of the weight packing (k = 15, 16, 17),
the linear tiles (96 rows × 128 columns), the weight chunk (2**21 floats: n = 1025 at k = 2048),
and the inner blocks of 256 of the per-task GEMM (255, 256, 257, 511, 512, 513), and the
backward's 1024-row × 384-column tiles (1023, 1024, 1025 rows; 383, 384, 385 in_features).
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import transformer_core as tc
from transformer_core import backward, functional, quantization

ISAS = quantization.supported_isas()  # what this CPU can run: every one of them is tested


@contextlib.contextmanager
def isa_and_threads(isa: str, threads: int):
    old_isa, old_threads = quantization.isa(), tc.get_num_threads()
    quantization.set_isa(isa)
    tc.set_num_threads(threads)
    try:
        yield
    finally:
        quantization.set_isa(old_isa)
        tc.set_num_threads(old_threads)


def _all_paths(fn):
    """fn() on every (ISA, thread count); asserts all equal bitwise; returns one result."""
    results = []
    for isa in ISAS:
        for threads in (1, 2):
            with isa_and_threads(isa, threads):
                results.append((isa, threads, fn()))
    first = results[0][2]
    for isa, threads, r in results[1:]:
        for a, b in zip(first if isinstance(first, tuple) else (first,), r if isinstance(r, tuple) else (r,)):
            if a is None:
                assert b is None
                continue
            assert np.array_equal(a, b, equal_nan=True), f"{isa}, {threads} threads differ from {results[0][:2]}"
    return first


def _close_to_fp64(actual, ref64, rtol=1e-5):
    """|actual - ref| <= rtol · (largest |ref| of the output) + fp32 resolution."""
    scale = max(1.0, float(np.abs(ref64).max()))
    np.testing.assert_allclose(actual, ref64, rtol=0, atol=rtol * scale)


LINEAR_SHAPES = [  # (rows, in_features, out_features)
    # more than 32 rows (fewer stream the weight: linear_small.hpp); 24 rows + 9, 11, 12, 13
    (33, 1, 1), (33, 7, 5), (35, 16, 16), (36, 15, 31), (37, 17, 32), (47, 33, 33), (48, 64, 47),
    (95, 128, 127), (96, 384, 128), (97, 385, 129), (100, 16, 255), (193, 31, 257),
    (40, 2048, 1025),  # the weight packed in two chunks (2**21 floats = 1024 columns at k = 2048)
    (300, 40, 500),
]


@pytest.mark.parametrize("shape", LINEAR_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_linear_every_isa_and_thread_count_bitwise_and_matches_torch(shape, activation):
    m, k, n = shape
    rng = np.random.default_rng(m * 1000 + k + n)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    if activation is None:
        y = _all_paths(lambda: functional.linear(x, w, b))
    else:
        y = _all_paths(lambda: tc._core.linear_f32(x, w, b, activation))
    ref = torch.nn.functional.linear(*(torch.from_numpy(a).double() for a in (x, w, b)))
    if activation == "gelu":
        ref = torch.nn.functional.gelu(ref)
    _close_to_fp64(y, ref.numpy())


def test_linear_propagates_nan_and_inf_as_torch():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((40, 37), dtype=np.float32)
    w = rng.standard_normal((70, 37), dtype=np.float32)
    x[3, 5] = np.nan
    x[17, 0] = np.inf
    y = _all_paths(lambda: functional.linear(x, w))
    ref = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(y[finite], ref[finite], atol=1e-4, rtol=1e-5)


BACKWARD_SHAPES = [  # (rows, in_features, out_features): inner dims across the 256-blocks, tile edges
    (9, 5, 7), (40, 33, 65), (255, 24, 257), (256, 130, 33), (511, 17, 600), (513, 385, 40),
    (70, 383, 1100), (1023, 40, 12), (1025, 384, 9),
]


@pytest.mark.parametrize("shape", BACKWARD_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["out_in", "in_out"])
def test_linear_backward_every_isa_and_thread_count_bitwise_and_matches_torch(shape, layout):
    m, k, n = shape
    rng = np.random.default_rng(m + 7 * k + 11 * n)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k) if layout == "out_in" else (k, n), dtype=np.float32)
    g = rng.standard_normal((m, n), dtype=np.float32)
    start = rng.standard_normal(w.shape, dtype=np.float32)  # accumulated into

    def run():
        gw = start.copy()
        gx, gw, gb = backward.linear_backward(x, w, g, True, grad_weight=gw, weight_layout=layout)
        return gx, gw, gb

    gx, gw, gb = _all_paths(run)
    tx = torch.from_numpy(x).double().requires_grad_()
    tw = torch.from_numpy(w).double().requires_grad_()
    y = tx @ (tw.T if layout == "out_in" else tw)
    y.backward(torch.from_numpy(g).double())
    _close_to_fp64(gx, tx.grad.numpy())
    _close_to_fp64(gw, start.astype(np.float64) + tw.grad.numpy())
    _close_to_fp64(gb, g.astype(np.float64).sum(0))


ATTENTION_SHAPES = [  # (N, H, L, S, D): MiniLM's short rows, odd sizes, tile edges of the flash kernel
    (2, 3, 1, 1, 8), (2, 12, 35, 35, 32), (1, 2, 13, 47, 17), (3, 2, 129, 257, 64), (1, 1, 40, 600, 32),
]


@pytest.mark.parametrize("shape", ATTENTION_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("is_causal", [False, True])
def test_attention_every_isa_and_thread_count_bitwise_and_matches_torch(shape, is_causal):
    N, H, L, S, D = shape
    rng = np.random.default_rng(N + H + L + S + D)
    q = rng.standard_normal((N, H, L, D), dtype=np.float32)
    k = rng.standard_normal((N, H, S, D), dtype=np.float32)
    v = rng.standard_normal((N, H, S, D), dtype=np.float32)
    mask = np.ones((N, 1, 1, S), dtype=bool)
    mask[0, ..., S // 2:] = False  # padding in the first sequence
    out = _all_paths(lambda: functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal))
    tq, tk, tv = (torch.from_numpy(a).double() for a in (q, k, v))
    tmask = torch.from_numpy(mask)
    if is_causal:  # torch takes one mask: padding and causal (s <= l) combined
        tmask = tmask & torch.ones(L, S, dtype=torch.bool).tril()  # top-left, as torch
    ref = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tmask).numpy()
    ref = np.where(tmask.any(-1, keepdim=True).numpy(), ref, 0.0)  # rows with no key: zeros (our rule)
    _close_to_fp64(out, ref)
