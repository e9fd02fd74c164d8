"""Our fp32 GEMM kernels (kernels/sgemm.hpp), through the ops that use them.

``functional.linear`` (more than 32 rows), ``backward.linear_backward`` and attention run fp32
products on our AVX-512 or AVX2 micro-kernels. Each output element is one FMA chain over the inner
dimension in order, so:

* every ISA this CPU has gives the same bits (``quantization.set_isa`` switches them), and so do 1
  and 2 threads;
* results match torch in fp64 to fp32 rounding (relative 1e-5 of the row's scale).

One exception: on the ``amx`` ISA the linear layer's product runs on AMX tiles as six bf16 products
of three-way split values (sgemm.hpp, ``split``), summed in another order. Its bits are its own
(the same for 1 and 2 threads), and its error against fp64 is held to the FMA kernels' own.

Shapes cross every edge where the kernels change path: micro-tile rows (AVX-512 12, AVX2 6), the
panel width 32 and the half panel 16, the 16 × 16 transposes of the weight packing (k = 15, 16, 17),
the linear tiles (96 rows × 128 columns), the weight chunk (2**21 floats: n = 1025 at k = 2048),
and the inner blocks of 256 of the per-task GEMM (255, 256, 257, 511, 512, 513), and the
backward's 1024-row × 384-column tiles (1023, 1024, 1025 rows; 383, 384, 385 in_features).
Products of 1 to 3 rows (a decoding step's query) stream the other operand instead of packing it
(kernels/gemv.hpp): the attention test on few query rows crosses its edges.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import transformer_core as tc
from transformer_core import backward, functional, quantization
from transformer_core._runtime import core

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


def _paths_by_family(fn, family):
    """fn() on every (ISA, thread count); asserts equal bits inside each family (family(isa) names
    it); returns {family: one result}."""
    firsts = {}
    for isa in ISAS:
        for threads in (1, 2):
            with isa_and_threads(isa, threads):
                r = fn()
            name = family(isa)
            if name not in firsts:
                firsts[name] = (isa, threads, r)
                continue
            first = firsts[name][2]
            for a, b in zip(first if isinstance(first, tuple) else (first,), r if isinstance(r, tuple) else (r,)):
                if a is None:
                    assert b is None
                    continue
                assert np.array_equal(a, b, equal_nan=True), f"{isa}, {threads} threads differ from {firsts[name][:2]}"
    return {name: r for name, (_, _, r) in firsts.items()}


def _all_paths(fn):
    """fn() on every (ISA, thread count); asserts all equal bitwise; returns one result."""
    return _paths_by_family(fn, lambda isa: "all")["all"]


def _linear_paths(fn):
    """As _all_paths for the linear layer: the FMA ISAs agree bitwise, and amx with itself (its
    split bf16 products sum in another order); returns {"fma": result, "amx": result if present}."""
    return _paths_by_family(fn, lambda isa: "amx" if isa == "amx" else "fma")


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
        ys = _linear_paths(lambda: functional.linear(x, w, b))
    else:
        ys = _linear_paths(lambda: tc._core.linear_f32(x, w, b, activation))
    ref = torch.nn.functional.linear(*(torch.from_numpy(a).double() for a in (x, w, b)))
    if activation == "gelu":
        ref = torch.nn.functional.gelu(ref)
    for y in ys.values():
        _close_to_fp64(y, ref.numpy())


@pytest.mark.parametrize("k", [513, 1536, 16384])
def test_linear_deep_products_sum_blocks_and_stay_within_fp32s_tolerance(k):
    """One FMA chain over all of in_features: at k = 16384 (33 rows, outputs of size ~3) the error
    against fp64 was 1.9e-5, past the 1e-5 of torch (torch: 1.3e-6). The FMA tiles now sum blocks of
    512 (kernels/linear.hpp): the error stays near one block's. Every FMA ISA and thread count
    gives the same bits; the depth-block edges (k = 513: a block of 1) included."""
    rng = np.random.default_rng(16)
    w = (rng.standard_normal((64, k)) / np.sqrt(k)).astype(np.float32)
    x = rng.standard_normal((33, k)).astype(np.float32)
    ys = _linear_paths(lambda: functional.linear(x, w))
    ref = torch.nn.functional.linear(torch.from_numpy(x).double(), torch.from_numpy(w).double()).numpy()
    torch_err = np.abs(torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(w)).numpy() - ref).max()
    err = np.abs(ys["fma"] - ref).max()
    assert err <= max(4e-6, 3 * torch_err), (err, torch_err)


@pytest.mark.parametrize("where", ["x", "w"])
def test_linear_propagates_nan_and_inf_as_torch(where):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((40, 37), dtype=np.float32)
    w = rng.standard_normal((70, 37), dtype=np.float32)
    a = x if where == "x" else w
    a[3, 5] = np.nan
    a[17, 0] = np.inf
    a[30, 36] = -np.inf
    ref = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    for y in _linear_paths(lambda: functional.linear(x, w)).values():
        np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
        np.testing.assert_array_equal(np.isinf(y), np.isinf(ref))
        finite = np.isfinite(ref)
        np.testing.assert_allclose(y[finite], ref[finite], atol=1e-4, rtol=1e-5)


# The small-row path (kernels/linear_small.hpp: up to 32 rows stream w): rows across its blocks (one
# block of up to 8 rows with 3 rows of w on AVX-512, blocks of 4 × 4 above; 2 × 4 on AVX2) and the
# 96-column tasks (kLinearSmallCols), k across the SIMD width (the tail after the last full vector).
SMALL_ROWS = [1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 31, 32]
# (97, 1536), (5, 1543) and (3, 6200): rows × k past kSmallL1Floats, so the columns are swept once per
# depth block of 512 with the accumulators kept in between (MiniLM's FFN2 has k = 1536).
SMALL_SHAPES = [(1, 1), (2, 15), (3, 16), (4, 17), (5, 33), (7, 64), (64, 384), (65, 100), (67, 31), (130, 385),
                (97, 1536), (5, 1543), (3, 6200)]


@pytest.mark.parametrize("m", SMALL_ROWS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_small_rows_every_block_shape(m, dtype):
    rng = np.random.default_rng(m)
    for n, k in SMALL_SHAPES:
        x = rng.standard_normal((m, k)).astype(dtype)
        w = rng.standard_normal((n, k)).astype(dtype)
        b = rng.standard_normal(n).astype(dtype)
        y = _all_paths(lambda: functional.linear(x, w, b))
        ref = x.astype(np.float64) @ w.astype(np.float64).T + b
        if dtype == np.float64:
            np.testing.assert_allclose(y, ref, rtol=0, atol=1e-10 * max(1.0, np.abs(ref).max()))
        else:
            _close_to_fp64(y, ref)


@pytest.mark.parametrize("k", [384, 1536, 1543])
def test_linear_small_rows_a_row_gives_the_same_bits_alone_or_with_others(k):
    """Each output of the small-row kernel is one chain of SIMD accumulators, whatever the block of
    rows it is computed in and whether the depth is swept in blocks (rows × k past 24 KiB): a row
    alone (never depth-blocked) and the same row among 9 or 32 (depth-blocked for k ≥ 1536) give the
    same bits."""
    rng = np.random.default_rng(k)
    x = rng.standard_normal((32, k)).astype(np.float32)
    w = rng.standard_normal((200, k)).astype(np.float32)
    b = rng.standard_normal(200).astype(np.float32)
    alone = np.concatenate([functional.linear(x[i:i + 1], w, b) for i in range(32)])
    np.testing.assert_array_equal(functional.linear(x[:9], w, b), alone[:9])
    np.testing.assert_array_equal(functional.linear(x, w, b), alone)
    _close_to_fp64(alone, x.astype(np.float64) @ w.astype(np.float64).T + b)


needs_amx = pytest.mark.skipif("amx" not in ISAS, reason="the CPU has no AMX (or Linux did not grant the tile state)")

# rows across the kernel's 32-row steps and the 96-row tiles; k across the 32-value tiles and the
# 16-value halves of the split; columns across the 16-column tiles, the 32-column steps and the
# 128-column tasks
AMX_SHAPES = [  # (rows, in_features, out_features)
    (33, 1, 1), (34, 15, 15), (47, 16, 16), (63, 17, 17), (64, 31, 31), (65, 32, 32), (95, 33, 33),
    (96, 63, 127), (97, 64, 128), (127, 65, 129), (128, 384, 255), (129, 385, 257), (193, 1536, 384),
    (40, 2048, 1025),  # two chunks of the weight
]


def _amx_and_fma(fn):
    with isa_and_threads("amx", 2):
        amx = fn()
    with isa_and_threads("avx512vnni", 2):
        fma = fn()
    return amx, fma


@needs_amx
@pytest.mark.parametrize("shape", AMX_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("spread", [0, 6], ids=["normal", "magnitudes-1e-6-1e6"])
def test_linear_on_amx_is_as_accurate_as_fp32_fma(shape, spread):
    """The split bf16 products' error against fp64 stays at the FMA chain's own (the three dropped
    terms are below 2^-23 of each product), on values of one scale and on values spread over 12
    orders of magnitude."""
    m, k, n = shape
    rng = np.random.default_rng(m * 7 + k * 3 + n + spread)
    x = (rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-spread, spread, (m, k))).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 10.0 ** rng.uniform(-spread, spread, (n, k))).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    amx, fma = _amx_and_fma(lambda: functional.linear(x, w, b))
    ref = x.astype(np.float64) @ w.astype(np.float64).T + b
    # per output: error relative to Σ |x·w| (the size that fp32 rounding scales with)
    size = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T + np.abs(b)
    err_amx = np.abs(amx - ref) / size
    err_fma = np.abs(fma - ref) / size
    eps = np.finfo(np.float32).eps
    assert err_amx.max() <= max(2 * err_fma.max(), 4 * eps), (err_amx.max(), err_fma.max())
    assert err_amx.mean() <= 2 * err_fma.mean() + eps / 8, (err_amx.mean(), err_fma.mean())


@needs_amx
def test_linear_on_amx_near_the_ends_of_the_fp32_range():
    """Values that round up to Inf in bf16 (within half a bf16 step of FLT_MAX) keep a truncated high
    part and their exact residuals. At the other end, tdpbf16ps flushes products below fp32's normal
    range (2^-126) to zero: an absolute error floor of 6 · k · 2^-126 (1e-35 at k = 48)."""
    rng = np.random.default_rng(11)
    m, k, n = 40, 48, 36
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 1e-3).astype(np.float32)
    x[5, :] = np.float32(3.4028e38) * np.sign(x[5, :])  # 0x7F7FFxxx: bf16 rounding would overflow
    x[6, :] = np.float32(3.3962e38)
    x[7, :] *= np.float32(1e-33)  # products near 1e-36: their smaller parts' products underflow
    w[:, 3] = 0.0
    amx, fma = _amx_and_fma(lambda: functional.linear(x, w))
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.isfinite(amx).all()
    size = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    eps = np.finfo(np.float32).eps
    normal = np.arange(m) != 7
    assert (np.abs(amx - ref) / size)[normal].max() <= 8 * eps
    assert (np.abs(fma - ref) / size).max() <= 8 * eps
    floor = 6 * k * 2.0**-126
    assert np.abs(amx - ref)[7].max() <= floor
    assert np.abs(amx - ref)[7].max() > (8 * eps * size[7]).max()  # the floor is real: it shows here


@needs_amx
@pytest.mark.parametrize("where", ["x", "w"])
def test_linear_on_amx_hands_inf_and_nan_to_the_fma_kernels(where):
    """A row of x (or the 128-column tile of w) holding Inf or NaN is computed by the FMA kernels:
    exactly their bits there, bias added after the product as they add it; the other rows keep the
    AMX product, which starts from the bias."""
    rng = np.random.default_rng(3)
    m, k, n = 100, 70, 300
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    if where == "x":
        x[[4, 50, 99], [0, 69, 33]] = [np.inf, np.nan, -np.inf]
    else:
        w[130, 7] = np.inf  # the second column tile (128 … 255)
    amx, fma = _amx_and_fma(lambda: functional.linear(x, w, b))
    with isa_and_threads("amx", 2):
        clean = functional.linear(np.nan_to_num(x, posinf=0, neginf=0), np.nan_to_num(w, posinf=0, neginf=0), b)
    if where == "x":
        fallback = np.zeros((m, n), dtype=bool)
        fallback[[4, 50, 99]] = True
    else:
        fallback = np.zeros((m, n), dtype=bool)
        fallback[:, 128:256] = True
    np.testing.assert_array_equal(amx[fallback], fma[fallback])
    assert not np.array_equal(clean[~fallback], fma[~fallback])  # elsewhere: the AMX bits
    np.testing.assert_array_equal(amx[~fallback], clean[~fallback])


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


FEW_ROW_SHAPES = [  # (L, S, D, Dv): 1-3 query rows stream k and v (kernels/gemv.hpp); blocks of 8 or 16
    # keys (the register's lanes) and the short last block, k tails (D mod 8, 16), v's column chains
    # of 4 registers (32 or 64 columns), single registers and the scalar tail
    (1, 1, 1, 1), (1, 7, 8, 5), (1, 8, 7, 15), (1, 9, 16, 16), (1, 15, 17, 17), (1, 16, 33, 63),
    (1, 17, 64, 64), (2, 31, 31, 65), (3, 33, 32, 130), (1, 100, 48, 80), (2, 600, 64, 64),
]


@pytest.mark.parametrize("shape", FEW_ROW_SHAPES, ids=lambda s: "L{}-S{}-D{}-Dv{}".format(*s))
@pytest.mark.parametrize("path", ["reference", "flash"])
def test_attention_few_query_rows_stream_k_and_v_and_match_torch(shape, path):
    """The reference path runs its products through gemm_on_thread at every size; the flash path
    does above its small-problem plan (the larger shapes here)."""
    L, S, D, Dv = shape
    rng = np.random.default_rng(L * 1000 + S + D + Dv)
    q = rng.standard_normal((2, 3, L, D), dtype=np.float32)
    k = rng.standard_normal((2, 3, S, D), dtype=np.float32)
    v = rng.standard_normal((2, 3, S, Dv), dtype=np.float32)
    key_mask = np.ones((2, S), dtype=bool)
    key_mask[1, : S // 3] = False  # the second sequence's first keys hidden
    scale = 1.0 / np.sqrt(D)
    out = _all_paths(lambda: core.scaled_dot_product_attention_f32(
        q, k, v, None, None, key_mask, False, 0, scale, False, path, return_lse=False))
    tq, tk, tv = (torch.from_numpy(a).double() for a in (q, k, v))
    tmask = torch.from_numpy(key_mask)[:, None, None, :]
    ref = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tmask, scale=scale).numpy()
    _close_to_fp64(out, ref)


@pytest.mark.parametrize("shape", [(2, 31, 31, 65), (3, 33, 32, 130), (3, 600, 64, 64), (2, 100, 17, 33)],
                         ids=lambda s: "L{}-S{}-D{}-Dv{}".format(*s))
def test_attention_few_query_rows_together_give_each_row_its_bits_alone(shape):
    """Two or three query rows stream k and v once for all of them (kernels/gemv.hpp, as a GQA
    decoding step's query heads do): each row's output is bit for bit the one it gets alone. The
    reference path runs its products through gemm_on_thread whatever the size."""
    L, S, D, Dv = shape
    rng = np.random.default_rng(L + S + D + Dv)
    q = rng.standard_normal((2, 3, L, D), dtype=np.float32)
    k = rng.standard_normal((2, 3, S, D), dtype=np.float32)
    v = rng.standard_normal((2, 3, S, Dv), dtype=np.float32)
    scale = 1.0 / np.sqrt(D)

    def sdpa(queries):
        return _all_paths(lambda: core.scaled_dot_product_attention_f32(
            queries, k, v, None, None, None, False, 0, scale, False, "reference", return_lse=False))

    together = sdpa(q)
    for row in range(L):
        np.testing.assert_array_equal(together[:, :, row:row + 1], sdpa(np.ascontiguousarray(q[:, :, row:row + 1])))


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
