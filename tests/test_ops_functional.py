"""transformer_core.functional element-wise / row ops vs torch.nn.functional."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
import transformer_core as tc
from conftest import DTYPE_IDS, FLOAT_DTYPES, assert_close, randn, to_torch

F = tc.functional

LEAD_SHAPES = [(), (1,), (7,), (2, 9), (9, 9), (3, 1, 5)]
LEAD_IDS = ["lead()", "lead1", "lead7", "lead2x9", "lead9x9", "lead3x1x5"]


# ------------------------------------------------------------------------------------------ linear
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("in_f,out_f", [(1, 1), (17, 7), (9, 65), (65, 17)])
@pytest.mark.parametrize("lead", LEAD_SHAPES, ids=LEAD_IDS)
def test_linear_matches_torch(rng, lead, in_f, out_f, bias, dtype):
    x = randn(rng, lead + (in_f,), dtype)
    w = randn(rng, (out_f, in_f), dtype, scale=1.0 / np.sqrt(in_f))
    b = randn(rng, (out_f,), dtype) if bias else None
    ours = F.linear(x, w, b) if bias else F.linear(x, w)
    ref = TF.linear(to_torch(x), to_torch(w), None if b is None else to_torch(b))
    assert_close(ours, ref, dtype, what="linear")


def test_linear_bias_keyword(rng):
    x = randn(rng, (3, 9))
    w = randn(rng, (5, 9))
    b = randn(rng, (5,))
    ref = TF.linear(to_torch(x), to_torch(w), to_torch(b))
    assert_close(F.linear(x, w, bias=b), ref, np.float32)
    assert_close(F.linear(x, w, bias=None), TF.linear(to_torch(x), to_torch(w)), np.float32)


# ----------------------------------------------------------------------------------------- softmax
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,axis", [
    ((1,), -1), ((7,), 0), ((9, 17), -1), ((9, 17), 0), ((2, 7, 65), -1), ((2, 7, 65), 1),
    ((2, 7, 65), -3), ((1, 1), -1), ((4, 3, 2, 5), 2),
    # a register's edges on the last dim (16 floats, 8 doubles on AVX-512; 8 and 4 on AVX2) ...
    ((3, 4), -1), ((3, 8), -1), ((3, 15), -1), ((3, 16), -1), ((3, 17), -1), ((2, 33), -1),
    # ... and the other dims' column blocks (256 columns): below, at and past one block, and n = 1
    ((3, 255), 0), ((2, 5, 256), 1), ((2, 5, 257), 0), ((6, 3, 513), 0), ((1, 300), 0), ((300, 1), 0),
])
def test_softmax_matches_torch(rng, shape, axis, dtype):
    x = randn(rng, shape, dtype, scale=3.0)
    ours = F.softmax(x, dim=axis)
    assert_close(ours, torch.softmax(to_torch(x), dim=axis), dtype, what="softmax")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_softmax_default_axis_is_last(rng, dtype):
    x = randn(rng, (3, 5, 7), dtype)
    assert_close(F.softmax(x), torch.softmax(to_torch(x), dim=-1), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("offset", [0.0, 1000.0, -1000.0, 1e4])
def test_softmax_is_shift_stable(rng, offset, dtype):
    x = randn(rng, (5, 9), dtype)
    xs = (x + dtype(offset)).astype(dtype)
    ours = F.softmax(xs, dim=-1)
    ref = torch.softmax(to_torch(xs), dim=-1)
    assert np.all(np.isfinite(ours))
    assert_close(ours, ref, dtype)
    np.testing.assert_allclose(ours.sum(-1), 1.0, atol=10 * np.finfo(dtype).eps * 9)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_softmax_neg_inf(rng, dtype):
    x = randn(rng, (4, 7), dtype)
    x[0, :] = -np.inf           # fully -inf row -> zeros in ours (torch: NaN)
    x[1, [0, 3, 6]] = -np.inf   # partially masked row
    x[2, 1:] = -np.inf          # a single finite entry -> one-hot
    ours = F.softmax(x, dim=-1)
    ref = torch.softmax(to_torch(x), dim=-1).numpy()
    assert ours.dtype == np.dtype(dtype)
    assert np.array_equal(ours[0], np.zeros(7, dtype)), ours[0]
    assert_close(ours[1:], ref[1:], dtype)
    assert np.array_equal(ours[2], np.eye(7, dtype=dtype)[0])
    assert np.all(ours[1, [0, 3, 6]] == 0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_softmax_nan_propagates(rng, dtype):
    x = randn(rng, (3, 5), dtype)
    x[1, 2] = np.nan
    ours = F.softmax(x, dim=-1)
    assert np.all(np.isnan(ours[1]))
    ref = torch.softmax(to_torch(x), dim=-1).numpy()
    assert_close(ours[[0, 2]], ref[[0, 2]], dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("cols", [7, 300])
def test_softmax_over_another_dim_special_values(rng, dtype, cols):
    """softmax over dim 0 (the column kernel) keeps softmax's rules: an all -inf slice gives
    zeros, a NaN anywhere in a slice NaN in all of it, a +inf NaN (torch's too), a slice with one
    finite value a one-hot; the others are torch's values."""
    x = randn(rng, (5, cols), dtype, scale=3.0)
    x[:, 0] = -np.inf
    x[[0, 3], 1] = -np.inf
    x[1:, 2] = -np.inf
    x[2, 3] = np.nan
    x[4, 4] = np.inf
    ours = F.softmax(x, dim=0)
    ref = torch.softmax(to_torch(x), dim=0).numpy()
    assert np.array_equal(ours[:, 0], np.zeros(5, dtype))
    assert np.array_equal(ours[:, 2], np.eye(5, dtype=dtype)[0])
    assert np.all(np.isnan(ours[:, 3])) and np.all(np.isnan(ours[:, 4])) and np.all(np.isnan(ref[:, 4]))
    assert_close(ours[:, [1] + list(range(5, cols))], ref[:, [1] + list(range(5, cols))], dtype)


# The column kernel takes a register of neighbouring columns down the rows (16 floats, 8 doubles
# on AVX-512; 8 and 4 on AVX2), the last columns of a 256-column block in one padded register:
# widths at each register's edges, one row and several, and a block's last register part-filled.
COLUMN_WIDTHS = [1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 255, 257, 271, 273]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows", [1, 2, 9])
@pytest.mark.parametrize("cols", COLUMN_WIDTHS)
def test_softmax_over_columns_at_register_edges(rng, dtype, rows, cols):
    x = randn(rng, (rows, cols), dtype, scale=3.0)
    assert_close(F.softmax(x, dim=0), torch.softmax(to_torch(x), dim=0), dtype, what="softmax dim 0")
    x3 = randn(rng, (2, rows, cols), dtype, scale=3.0)  # two slabs: the second starts past the first's end
    assert_close(F.softmax(x3, dim=1), torch.softmax(to_torch(x3), dim=1), dtype, what="softmax dim 1")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("cols", [9, 17, 33, 261])
def test_softmax_over_columns_special_values_in_the_last_register(rng, dtype, cols):
    """The special columns of the test above, as the last five columns: in the padded register
    (or the last full one) of the last block."""
    x = randn(rng, (5, cols), dtype, scale=3.0)
    c = cols - 5
    x[:, c] = -np.inf
    x[[0, 3], c + 1] = -np.inf
    x[1:, c + 2] = -np.inf
    x[2, c + 3] = np.nan
    x[4, c + 4] = np.inf
    ours = F.softmax(x, dim=0)
    ref = torch.softmax(to_torch(x), dim=0).numpy()
    assert np.array_equal(ours[:, c], np.zeros(5, dtype))
    assert np.array_equal(ours[:, c + 2], np.eye(5, dtype=dtype)[0])
    assert np.all(np.isnan(ours[:, c + 3])) and np.all(np.isnan(ours[:, c + 4]))
    assert_close(ours[:, list(range(c)) + [c + 1]], ref[:, list(range(c)) + [c + 1]], dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_softmax_is_the_same_for_any_thread_count(rng, dtype):
    """Both kernels (last dim, other dims) cut the work by the shape alone: the same bits on 1, 2
    and 3 threads."""
    x = randn(rng, (6, 40, 300), dtype, scale=3.0)
    before = tc.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            tc.set_num_threads(threads)
            results.append([F.softmax(x, dim) for dim in (0, 1, 2)])
    finally:
        tc.set_num_threads(before)
    for other in results[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(results[0], other))


def test_softmax_axis_keyword_still_works_with_a_deprecation_warning(rng):
    """``axis=`` was numpy's name of torch's ``dim``: taken for one release, warning, as ``dim=``;
    ``axis=`` and ``dim=`` together are a TypeError."""
    x = randn(rng, (4, 6), np.float64)
    with pytest.warns(DeprecationWarning, match=r"axis= is deprecated, use dim="):
        ours = F.softmax(x, axis=0)
    assert_close(ours, torch.softmax(to_torch(x), dim=0), np.float64)
    assert_close(F.softmax(x, 0), torch.softmax(to_torch(x), dim=0), np.float64)  # positional, as torch's
    with pytest.raises(TypeError, match=r"^axis: the former name of dim; got both"):
        F.softmax(x, axis=0, dim=0)


# -------------------------------------------------------------------------------------- layer_norm
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("eps", [1e-5, 1e-12, 0.1])
# 31, 32, 33, 384: the float rows' sums run in blocks of 32 double lanes plus a tail
@pytest.mark.parametrize("shape", [(1,), (7,), (1, 17), (9, 65), (2, 7, 9), (9, 9, 1), (3, 31), (3, 32), (2, 33),
                                   (4, 384)], ids=lambda s: "x".join(map(str, s)))
def test_layer_norm_matches_torch(rng, shape, eps, dtype):
    E = shape[-1]
    x = randn(rng, shape, dtype, scale=2.0) + dtype(0.5)
    w = randn(rng, (E,), dtype)
    b = randn(rng, (E,), dtype)
    ours = F.layer_norm(x, w, b, eps=eps)
    ref = TF.layer_norm(to_torch(x), (E,), to_torch(w), to_torch(b), eps)
    assert_close(ours, ref, dtype, what="layer_norm")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_layer_norm_default_eps(rng, dtype):
    x = randn(rng, (5, 17), dtype, scale=1e-3)  # small variance: eps matters
    w = randn(rng, (17,), dtype)
    b = randn(rng, (17,), dtype)
    ref = TF.layer_norm(to_torch(x), (17,), to_torch(w), to_torch(b), 1e-5)
    assert_close(F.layer_norm(x, w, b), ref, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_layer_norm_large_mean(rng, dtype):
    """Catastrophic cancellation check: a large offset must not destroy the variance."""
    x = randn(rng, (4, 65), dtype) + dtype(1000.0)
    w = np.ones(65, dtype)
    b = np.zeros(65, dtype)
    ref = TF.layer_norm(to_torch(x).double(), (65,), eps=1e-5).numpy()
    tol = 2e-3 if dtype == np.float32 else 1e-9  # fp32 input itself only has ~6e-5 resolution at 1000
    assert_close(F.layer_norm(x, w, b), ref, dtype, atol_=tol)


# --------------------------------------------------------------------------------------- rms_norm
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_rms_norm_default_eps_is_torchs(rng, dtype):
    """With defaults, eps is torch's: ``finfo(dtype).eps`` (torch's ``eps=None``), not 1e-6. Rows
    of small RMS (1e-3 and 1e-5) make eps matter: 1e-6 gives other values."""
    E = 24
    x = randn(rng, (6, E), dtype, scale=1e-3)
    x[3:] *= dtype(1e-2)
    w = randn(rng, (E,), dtype)
    ref = TF.rms_norm(to_torch(x), (E,), to_torch(w))
    ours = F.rms_norm(x, w)
    assert_close(ours, ref, dtype, what="rms_norm default eps")
    assert_close(ours, F.rms_norm(x, w, eps=float(np.finfo(dtype).eps)), dtype, atol_=0.0, rtol_=0.0)
    assert np.abs(F.rms_norm(x, w, eps=1e-6) - ours).max() > 0.1  # the old default is far off here
    assert_close(F.rms_norm(x), TF.rms_norm(to_torch(x), (E,)), dtype, what="rms_norm default eps, no weight")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_rms_norm_backward_default_eps_is_torchs(rng, dtype):
    """``rms_norm_backward``'s default eps is the forward's (torch's ``finfo(dtype).eps``):
    autograd of torch's ``F.rms_norm`` with its defaults."""
    from transformer_core import backward as B

    E = 16
    x = randn(rng, (5, E), dtype, scale=1e-3)
    w = randn(rng, (E,), dtype)
    g = randn(rng, (5, E), dtype)
    xt, wt = to_torch(x).requires_grad_(), to_torch(w).requires_grad_()
    TF.rms_norm(xt, (E,), wt).backward(to_torch(g))
    gx, gw = B.rms_norm_backward(x, w, g)
    tol = 1e-3 if dtype == np.float32 else 1e-9  # rstd ~ 1e3: the gradients are ~1e3 too
    assert_close(gx, xt.grad, dtype, rtol_=tol, atol_=tol, what="rms_norm_backward grad_x")
    assert_close(gw, wt.grad, dtype, rtol_=tol, atol_=tol, what="rms_norm_backward grad_weight")


def test_rms_norm_float16_computes_with_float32_eps(rng):
    """A float16 input computes in float32 with float32's eps, as torch's default for float16."""
    x = randn(rng, (3, 8), np.float16, scale=1e-3)
    ref = TF.rms_norm(to_torch(x.astype(np.float32)), (8,), eps=float(np.finfo(np.float32).eps))
    assert_close(F.rms_norm(x), ref, np.float32)
    assert_close(F.rms_norm(x), TF.rms_norm(torch.from_numpy(x), (8,)).float(), np.float32, atol_=2e-3, rtol_=2e-3)


# ------------------------------------------------------------------------------------ activations
ACT_SHAPES = [(1,), (7,), (9, 17), (2, 7, 65), (3, 48)]  # 48: whole registers of 8 and 16, no tail


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", ACT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gelu_matches_torch(rng, shape, approximate, dtype):
    x = randn(rng, shape, dtype, scale=4.0)
    x.flat[0] = -30.0
    if x.size > 1:
        x.flat[1] = 30.0
    ours = F.gelu(x, approximate=approximate)
    assert_close(ours, TF.gelu(to_torch(x), approximate=approximate), dtype, what="gelu")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_gelu_default_is_exact(rng, dtype):
    x = randn(rng, (9, 17), dtype, scale=3.0)
    assert_close(F.gelu(x), TF.gelu(to_torch(x)), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", ACT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_relu_matches_torch(rng, shape, dtype):
    x = randn(rng, shape, dtype)
    x.flat[0] = 0.0
    ours = F.relu(x)
    assert_close(ours, TF.relu(to_torch(x)), dtype, atol_=0.0, rtol_=0.0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", [5, 16, 40])  # a padded register only, whole registers, both
def test_activations_keep_special_values_as_torch(dtype, n):
    """NaN stays NaN in each activation and its backward, in the registers and in the padded tail
    (xsimd's v != v is false for a NaN: relu gave 0); ±inf, ±0 and huge values give torch's
    results (xsimd's float64 erf gave NaN beyond |x| ~ 1.2e62: GELU of 1e70 was NaN)."""
    big = 1e30 if dtype == np.float32 else 1e70
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, big, -big, 3.0, -3.0, 1e-30], dtype)
    x = np.resize(special, n).astype(dtype)
    g = np.ones(n, dtype)
    tx, tg = to_torch(x), to_torch(g)
    pairs = [(F.relu(x), TF.relu(tx)), (F.silu(x), TF.silu(tx)),
             (tc.backward.silu_backward(x, g), torch.ops.aten.silu_backward(tg, tx))]
    if dtype == np.float64:  # float32 GELU of ±inf: inf, where torch gives NaN (documented)
        pairs += [(F.gelu(x), TF.gelu(tx)), (F.gelu(x, "tanh"), TF.gelu(tx, approximate="tanh")),
                  (tc.backward.gelu_backward(x, g), torch.ops.aten.gelu_backward(tg, tx))]
    for ours, ref in pairs:
        ref = ref.numpy()
        assert np.array_equal(np.isnan(ours), np.isnan(ref)), (x, ours, ref)
        finite = ~np.isnan(ref)
        np.testing.assert_allclose(ours[finite], ref[finite], rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", [5, 16, 40])
def test_softmax_nan_among_neg_inf_gives_nan(dtype, n):
    """A row of -inf with one NaN (a register's length and more, and less): NaN, as torch, not the
    zeros of a fully masked row (the register path missed the NaN)."""
    for at in (0, n - 1):
        x = np.full((2, n), -np.inf, dtype)
        x[0, at] = np.nan
        ours = F.softmax(x)
        assert np.all(np.isnan(ours[0])), ours[0]
        assert np.array_equal(ours[1], np.zeros(n, dtype))
        assert np.all(np.isnan(F.softmax(np.ascontiguousarray(x.T), 0)[:, 0]))


# ----------------------------------------------------------------------------------- dtype rules
def test_float64_stays_float64(rng):
    x = randn(rng, (3, 9), np.float64)
    w = randn(rng, (4, 9), np.float64)
    assert F.linear(x, w).dtype == np.float64
    assert F.softmax(x).dtype == np.float64
    assert F.gelu(x).dtype == np.float64
    assert F.relu(x).dtype == np.float64
    assert F.layer_norm(x, np.ones(9), np.zeros(9)).dtype == np.float64


def test_float32_stays_float32(rng):
    x = randn(rng, (3, 9), np.float32)
    w = randn(rng, (4, 9), np.float32)
    assert F.linear(x, w).dtype == np.float32
    assert F.softmax(x).dtype == np.float32
    assert F.gelu(x).dtype == np.float32
    assert F.relu(x).dtype == np.float32
    assert F.layer_norm(x, np.ones(9, np.float32), np.zeros(9, np.float32)).dtype == np.float32


def test_ints_and_lists_become_float32():
    x = [[1, -2, 3], [0, 5, -1]]
    w = [[1, 0, 2], [0, 1, 0]]
    ours = F.linear(x, w)
    assert ours.dtype == np.float32
    ref = TF.linear(torch.tensor(x, dtype=torch.float32), torch.tensor(w, dtype=torch.float32))
    assert_close(ours, ref, np.float32)

    xi = np.array(x, dtype=np.int64)
    for fn, tfn in [(F.relu, TF.relu), (F.gelu, TF.gelu),
                    (F.softmax, lambda t: torch.softmax(t, -1))]:
        for inp in (x, xi):
            out = fn(inp)
            assert out.dtype == np.float32, fn
            assert_close(out, tfn(torch.tensor(x, dtype=torch.float32)), np.float32)

    ln = F.layer_norm(xi, [1, 1, 1], [0, 0, 0])
    assert ln.dtype == np.float32
    assert_close(ln, TF.layer_norm(torch.tensor(x, dtype=torch.float32), (3,)), np.float32)


def _layouts(a: np.ndarray):
    """Same values, other memory layouts: Fortran order and a strided (non-contiguous) view."""
    f = np.asfortranarray(a)
    big = np.zeros(tuple(2 * s for s in a.shape), a.dtype)
    big[tuple(slice(None, None, 2) for _ in a.shape)] = a
    strided = big[tuple(slice(None, None, 2) for _ in a.shape)]
    assert not strided.flags.c_contiguous
    rev = np.ascontiguousarray(a[..., ::-1])[..., ::-1]  # negative last stride
    return {"fortran": f, "strided": strided, "neg_stride": rev}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("layout", ["fortran", "strided", "neg_stride", "transposed"])
def test_noncontiguous_inputs(rng, layout, dtype):
    x = randn(rng, (7, 9), dtype)
    w = randn(rng, (5, 9), dtype)
    b = randn(rng, (5,), dtype)
    g = randn(rng, (9,), dtype)
    if layout == "transposed":
        xl = np.ascontiguousarray(x.T).T
        wl = np.ascontiguousarray(w.T).T
        gl, bl = g, b
    else:
        xl, wl = _layouts(x)[layout], _layouts(w)[layout]
        gl, bl = _layouts(g)[layout], _layouts(b)[layout]
    np.testing.assert_array_equal(xl, x)
    assert_close(F.linear(xl, wl, bl), TF.linear(to_torch(x), to_torch(w), to_torch(b)), dtype)
    assert_close(F.softmax(xl), torch.softmax(to_torch(x), -1), dtype)
    assert_close(F.softmax(xl, dim=0), torch.softmax(to_torch(x), 0), dtype)
    assert_close(F.gelu(xl), TF.gelu(to_torch(x)), dtype)
    assert_close(F.relu(xl), TF.relu(to_torch(x)), dtype)
    c = randn(rng, (9,), dtype)
    cl = c if layout == "transposed" else _layouts(c)[layout]
    assert_close(F.layer_norm(xl, gl, cl, eps=1e-5),
                 TF.layer_norm(to_torch(x), (9,), to_torch(g), to_torch(c), 1e-5), dtype)


def test_inputs_not_modified(rng):
    x = randn(rng, (4, 9))
    w = randn(rng, (3, 9))
    x0, w0 = x.copy(), w.copy()
    F.linear(x, w)
    F.softmax(x)
    F.gelu(x)
    F.relu(x)
    F.layer_norm(x, np.ones(9, np.float32), np.zeros(9, np.float32))
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(w, w0)


# ------------------------------------------------------------------------------------- threads
@pytest.mark.parametrize("op", ["linear", "linear_bias", "softmax", "layer_norm", "gelu", "relu"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_identical_with_1_and_2_threads(rng, op, dtype):
    """Results must be bitwise identical with 1 and 2 threads (BERT-sized shapes)."""
    x = randn(rng, (256, 384), dtype)
    w = randn(rng, (1536, 384), dtype, scale=0.05)
    b = randn(rng, (1536,), dtype)
    g, c = randn(rng, (384,), dtype), randn(rng, (384,), dtype)
    fn = {
        "linear": lambda: F.linear(x, w),
        "linear_bias": lambda: F.linear(x, w, b),
        "softmax": lambda: F.softmax(x),
        "layer_norm": lambda: F.layer_norm(x, g, c),
        "gelu": lambda: F.gelu(x),
        "relu": lambda: F.relu(x),
    }[op]
    old = tc.get_num_threads()
    try:
        tc.set_num_threads(1)
        a = fn()
        tc.set_num_threads(2)
        b2 = fn()
    finally:
        tc.set_num_threads(old)
    assert np.array_equal(a, b2), f"{op}: max |1 thread - 2 threads| = {np.abs(a - b2).max():.3e}"


# ------------------------------------------------------------------------------ dropout, glu edges
NONFINITE = np.array([np.nan, 1.5, np.inf, -np.inf, -2.0, 0.0, np.nan, 3.0] * 4)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_dropout_p1_keeps_nan_as_torch(dtype):
    """p=1 drops everything: torch's x · 0 is NaN for NaN and ±inf inputs, not 0."""
    x = NONFINITE.astype(dtype)
    ref = TF.dropout(to_torch(x), p=1.0, training=True)
    assert torch.isnan(ref[0]) and torch.isnan(ref[2]) and ref[1] == 0  # torch 2.x's behaviour
    ours = F.dropout(x, 1.0, seed=5)
    assert ours.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(ours, ref.numpy())  # NaN where torch has NaN, 0 elsewhere
    assert np.isnan(F.dropout(dtype(np.nan), 1.0, seed=0))  # 0-d too
    assert F.dropout(dtype(2.0), 1.0, seed=0) == 0


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("p", [0.25, 0.5, 0.9])
def test_dropout_dropped_nonfinite_is_nan_as_torch(p, dtype):
    """A dropped NaN / ±inf is x · 0 = NaN (torch multiplies by the scaled mask); a kept one stays
    what torch gives (NaN, ±inf); finite inputs are unchanged by the fix. torch's mask is its own,
    so its formula is applied to our mask (which depends only on the seed and the index)."""
    x = np.tile(NONFINITE, 8).astype(dtype)
    seed = 11
    keep = F.dropout(np.full(x.shape, 7.0, dtype), p, seed) != 0
    assert keep.any() and (~keep).any()
    ours = F.dropout(x, p, seed)
    ref = to_torch(x) * to_torch(keep.astype(dtype)) * (1.0 / (1.0 - p))  # torch's native_dropout
    assert_close(ours, ref, dtype, what=f"dropout p={p}")
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref.numpy()))
    finite = np.where(np.isfinite(x), x, dtype(1.0))
    np.testing.assert_array_equal(F.dropout(finite, p, seed)[~keep], 0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_dropout_needs_no_seed_where_it_draws_no_mask_and_names_torchs_training_slot(rng, dtype):
    """torch's F.dropout(x, p, training) calls: training=False (and p=0) need no seed, as torch's
    take none, and give torch's values; a training call with p > 0 still needs one. A bool in the
    seed slot (torch's third positional argument is training) is refused, saying so."""
    x = randn(rng, (3, 5), dtype)
    t = to_torch(x)
    ours = F.dropout(x, p=0.1, training=False)  # was: missing 1 required positional argument: 'seed'
    assert ours.dtype == np.dtype(dtype) and not np.shares_memory(ours, x)
    np.testing.assert_array_equal(ours, TF.dropout(t, p=0.1, training=False).numpy())
    np.testing.assert_array_equal(F.dropout(x, 0.5, training=False), TF.dropout(t, 0.5, False).numpy())
    no_seed = F.dropout(x, 0.0)  # p=0 keeps every element whatever the seed
    np.testing.assert_array_equal(no_seed, TF.dropout(t, 0.0).numpy())
    np.testing.assert_array_equal(no_seed, F.dropout(x, 0.0, 7))
    np.testing.assert_array_equal(F.dropout(x, 0.5, seed=3), F.dropout(x, 0.5, 3, True))  # a seed: as before
    slot = r"^seed: expected an int or None, got bool {} \(torch's third positional argument is training; " \
           r"this function's is seed: pass training= by keyword\)$"
    for flag in (False, True, np.False_):
        with pytest.raises(TypeError, match=slot.format(bool(flag))):
            F.dropout(x, 0.1, flag)
    with pytest.raises(ValueError, match=r"^seed: a training call with p > 0 needs a seed .* got None \(p=0\.1\)"):
        F.dropout(x, 0.1)
    with pytest.raises(ValueError, match=r"^seed: a training call with p > 0 needs a seed"):
        F.dropout(x, p=1.0, seed=None, training=True)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_dropout_takes_torchs_p_default_and_inplace(rng, dtype):
    """torch's F.dropout(input, p=0.5, training=True, inplace=False): p defaults to torch's 0.5 (a
    call without p failed with Python's "missing 1 required positional argument"), and inplace is
    taken (it was an unexpected keyword). inplace=False: a new array. inplace=True: the result is
    written into x, which is returned, as torch returns its input: x unchanged with training=False,
    torch's values with p=0, the out-of-place result (NaN and inf included) with a mask."""
    import inspect

    assert inspect.signature(F.dropout).parameters["p"].default == inspect.signature(TF.dropout).parameters["p"].default
    x = randn(rng, (3, 5), dtype)
    x[0, :3] = [np.nan, np.inf, -np.inf]
    t = to_torch(x)
    np.testing.assert_array_equal(F.dropout(x, training=False), TF.dropout(t, training=False).numpy())
    np.testing.assert_array_equal(F.dropout(x, seed=4), F.dropout(x, 0.5, 4))
    ours = F.dropout(x, p=0.5, training=False, inplace=False)
    assert not np.shares_memory(ours, x)
    np.testing.assert_array_equal(ours, TF.dropout(t, p=0.5, training=False, inplace=False).numpy())

    given, t_given = x.copy(), to_torch(x.copy())
    assert TF.dropout(t_given, p=0.5, training=False, inplace=True) is t_given
    assert F.dropout(given, p=0.5, training=False, inplace=True) is given
    np.testing.assert_array_equal(given, t_given.numpy())
    assert TF.dropout(t_given, p=0.0, inplace=True) is t_given
    assert F.dropout(given, p=0.0, inplace=True) is given
    np.testing.assert_array_equal(given, t_given.numpy())
    for p, seed in ((0.5, 4), (1.0, 9)):
        expected = F.dropout(x, p, seed)
        given = x.copy()
        assert F.dropout(given, p, seed, inplace=True) is given
        np.testing.assert_array_equal(given, expected)
    scalar = np.array(dtype(2.0))
    assert F.dropout(scalar, 1.0, 0, inplace=True) is scalar and scalar == 0

    head = r"^inplace: True writes the result into x, which must be a writeable, C-contiguous numpy array of " \
           r"the result's dtype \(float32, or float64 for float64 x\): "
    result = np.dtype(dtype).name
    read_only = x.copy()
    read_only.flags.writeable = False
    wide = np.zeros((3, 10), dtype)
    for bad, why in ((x.tolist(), "x is a list, not a numpy array"),
                     (to_torch(x.copy()), "x is a torch.Tensor, not a numpy array"),
                     (x.astype(np.float16), "x is float16, the result float32"),
                     (x.astype(x.dtype.newbyteorder()), rf"x is {x.dtype.newbyteorder().str}, the result {result}"),
                     (np.asfortranarray(x), "x is not C-contiguous"), (wide[:, ::2], "x is not C-contiguous"),
                     (read_only, "x is read-only")):
        values = (lambda a: a.numpy()) if isinstance(bad, torch.Tensor) else np.asarray
        before = values(bad).copy()
        with pytest.raises(ValueError, match=head + why + r"; pass inplace=False for a new array$"):
            F.dropout(bad, 0.5, 4, inplace=True)
        np.testing.assert_array_equal(values(bad), before)  # nothing written
    with pytest.raises(ValueError, match=head + r"x is int32, the result float32"):
        F.dropout(np.ones(3, np.int32), 0.5, training=False, inplace=True)
    with pytest.raises(TypeError, match=r"^x: expected a real numeric array, got dtype bool"):
        F.dropout(np.ones(3, bool), 0.5, 4, inplace=True)
    with pytest.raises(TypeError, match=r"^inplace: expected a bool, got int 1"):
        F.dropout(x, 0.5, 4, inplace=1)
    with pytest.raises(TypeError, match=r"positional"):  # keyword only: the fourth slot is training
        F.dropout(x, 0.5, 4, True, False)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_glu_one_dim_matches_torch(rng, dtype):
    g, u = randn(rng, (7,), dtype), randn(rng, (7,), dtype)
    assert_close(F.glu(g, u), TF.silu(to_torch(g)) * to_torch(u), dtype, what="swiglu 1-D")
    assert_close(F.glu(g[:1], u[:1], "gelu"), TF.gelu(to_torch(g[:1])) * to_torch(u[:1]), dtype, what="geglu (1,)")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_glu_refuses_torchs_glu_call_and_its_hint_computes_torchs_glu(rng, dtype):
    """torch's ``F.glu(x, dim)`` (``a * sigmoid(b)`` of x's two halves) is another function than
    this glu (``act(gate) * up``): ``glu(x)`` was Python's "missing argument" and ``glu(x, -1)`` a
    ValueError about up's rank. Both are a TypeError naming up that says so, and the numpy
    expression the message gives equals torch's F.glu."""
    x = randn(rng, (4, 6), dtype)
    for args, got, dim in (((x,), "None", -1), ((x, -1), r"int -1 \(torch's dim\)", -1),
                           ((x, np.int64(0)), r"int64 0 \(torch's dim\)", 0)):
        with pytest.raises(TypeError, match=rf"^up: expected an array of gate's shape, got {got}: this glu is the "
                                            rf"gated feed-forward act\(gate\) \* up, not torch's F.glu") as err:
            F.glu(*args)
        # the hint's expression, evaluated as the message writes it, is torch's GLU
        hint = f"a, b = np.split(x, 2, axis={dim}); a / (1 + np.exp(-b))"
        assert str(err.value).endswith(f"torch's F.glu(x, {dim}) in numpy: {hint}")
        scope = {"np": np, "x": x}
        exec(hint.replace("; ", "\nout = "), scope)
        assert_close(scope["out"], TF.glu(to_torch(x), dim), dtype, what=f"the hint's GLU, dim {dim}")
    for kw in ({"dim": -1}, {"dim": 0}):  # torch's keyword form too
        with pytest.raises(TypeError, match=r"^dim: torch's argument of F.glu\(input, dim\)"):
            F.glu(x, **kw)
    np.testing.assert_array_equal(F.glu(x, x), F.glu(x, x, "silu"))  # the arrays' call is unchanged


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_elementwise_ops_take_0d_as_torch(dtype):
    """0-d inputs of the element-wise ops give 0-d results, as torch's."""
    x = dtype(-0.7)
    t = torch.tensor(x)
    for ours, ref in [(F.gelu(x), TF.gelu(t)), (F.gelu(x, "tanh"), TF.gelu(t, approximate="tanh")),
                      (F.silu(x), TF.silu(t)), (F.relu(x), TF.relu(t)),
                      (F.dropout(x, 0.0, 1), TF.dropout(t, 0.0)), (F.dropout(x, 0.5, 1, training=False), t)]:
        assert ours.shape == ()
        assert_close(ours, ref, dtype)


def test_linear_bias_mismatch_names_the_weight_too(rng):
    """A bias that does not fit the weight's out_features: the message says which out_features, so
    a user who passed the wrong weight sees it (it read as if the bias alone were wrong)."""
    x, w, b = randn(rng, (2, 4), np.float32), randn(rng, (3, 4), np.float32), randn(rng, (2,), np.float32)
    with pytest.raises(ValueError, match=r"^bias: expected shape \(3,\) to match weight's out_features 3, got \(2,\)"):
        tc.functional.linear(x, w, b)


# ----------------------------------------------------------------------- cross_entropy targets
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("tdtype", [np.int64, np.uint64, np.uint32, np.uint8], ids=lambda t: t.__name__)
def test_cross_entropy_unsigned_target_with_ignore_index_beyond_classes(rng, tdtype, reduction, label_smoothing):
    """An ignore_index >= V (the classes) in an unsigned target is ignored, as in an int64 one: a
    uint64 target was refused ("got 7") where int64 and uint32 gave torch's loss."""
    logits = randn(rng, (4, 5), np.float32)
    t = np.array([0, 7, 2, 3])
    ref = TF.cross_entropy(to_torch(logits), torch.from_numpy(t), ignore_index=7, reduction=reduction,
                           label_smoothing=label_smoothing)
    ours = F.cross_entropy(logits, t.astype(tdtype), ignore_index=7, reduction=reduction,
                           label_smoothing=label_smoothing)
    assert_close(ours, ref, np.float32, what=f"cross_entropy {tdtype.__name__} target")
    if reduction == "none":
        assert ours[1] == 0


def test_cross_entropy_uint64_target_out_of_range_is_refused(rng):
    """A uint64 value beyond int64's range is refused (not wrapped to a negative index, which could
    then equal ignore_index); other out-of-range values get the general message with the index."""
    logits = randn(rng, (3, 5), np.float32)
    big = np.array([0, 2**64 - 1, 1], np.uint64)  # as int64 it would be -1
    with pytest.raises(ValueError, match=r"^target: expected class indices in \[0, 5\) or ignore_index \(-1\), "
                                         r"got 18446744073709551615 at index \(1,\)"):
        F.cross_entropy(logits, big, ignore_index=-1)
    with pytest.raises(ValueError, match=r"^target: expected class indices in \[0, 5\) or ignore_index \(7\), "
                                         r"got 6 at index \(2,\)"):
        F.cross_entropy(logits, np.array([0, 7, 6], np.uint64), ignore_index=7)


# ------------------------------------------------ scalar arguments are checked before any copy
def _peak_bytes(fn):
    """``fn()``'s error and the peak bytes traced while it ran (numpy's arrays included)."""
    import tracemalloc

    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        with pytest.raises((TypeError, ValueError)) as err:
            fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return err, peak


_X16 = np.ones((2048, 2048), np.float16)  # 8 MiB; its float32 copy is 16 MiB
_Q16 = _X16.reshape(1, 1, 2048, 2048)
_KV16 = _Q16[..., :8, :]
def _backward():
    from transformer_core import backward

    return backward


def _sdpa_backward(**kwargs):
    from transformer_core import backward as B

    lse = np.zeros((1, 1, 2048), np.float32)
    return B.scaled_dot_product_attention_backward(_Q16, _KV16, _KV16, _Q16, _Q16, lse, **kwargs)


_BAD_SCALARS = {
    "softmax dim=True": (lambda: F.softmax(_X16, dim=True), TypeError, r"^dim: expected an int, got bool"),
    "softmax dim=2": (lambda: F.softmax(_X16, dim=2), ValueError, r"^dim: expected an int in \[-2, 1\], got 2"),
    "layer_norm eps=-1": (lambda: F.layer_norm(_X16, eps=-1.0), ValueError, r"^eps: expected a finite number >= 0"),
    "layer_norm eps=inf": (lambda: F.layer_norm(_X16, eps=float("inf")), ValueError,
                           r"^eps: expected a finite number >= 0"),
    "rms_norm eps=inf": (lambda: F.rms_norm(_X16, eps=float("inf")), ValueError, r"^eps: expected a finite number >= 0"),
    "layer_norm eps='a'": (lambda: F.layer_norm(_X16, eps="a"), TypeError, r"^eps: expected a number, got str"),
    "rms_norm eps='a'": (lambda: F.rms_norm(_X16, eps="a"), TypeError, r"^eps: expected a number, got str"),
    "rms_norm eps=nan": (lambda: F.rms_norm(_X16, eps=float("nan")), ValueError, r"^eps: expected a finite"),
    "dropout p=2": (lambda: F.dropout(_X16, 2.0, 0), ValueError, r"^p: expected a finite number in \[0.0, 1.0\]"),
    "dropout seed=-1": (lambda: F.dropout(_X16, 0.5, -1), ValueError, r"^seed: expected an int in \[0, "),
    "dropout training=1": (lambda: F.dropout(_X16, 0.5, 0, training=1), TypeError,
                           r"^training: expected a bool, got int"),
    "dropout inplace=1": (lambda: F.dropout(_X16, 0.5, 0, inplace=1), TypeError, r"^inplace: expected a bool, got int"),
    "dropout inplace float16": (lambda: F.dropout(_X16, 0.5, 0, inplace=True), ValueError,
                                r"^inplace: .*: x is float16, the result float32;"),
    "sdpa is_causal=1": (lambda: F.scaled_dot_product_attention(_Q16, _KV16, _KV16, is_causal=1), TypeError,
                         r"^is_causal: expected a bool, got int"),
    "sdpa path='x'": (lambda: F.scaled_dot_product_attention(_Q16, _KV16, _KV16, path="x"), ValueError, r"^path: "),
    "sdpa scale=nan": (lambda: F.scaled_dot_product_attention(_Q16, _KV16, _KV16, scale=float("nan")), ValueError,
                       r"^scale: expected a finite number, got nan"),
    "sdpa scale='a'": (lambda: F.scaled_dot_product_attention(_Q16, _KV16, _KV16, scale="a"), TypeError,
                       r"^scale: expected a number, got str"),
    "sdpa return_weights=0": (lambda: F.scaled_dot_product_attention(_Q16, _KV16, _KV16, return_weights=0),
                              TypeError, r"^return_weights: expected a bool"),
    "sdpa return_lse=None": (lambda: F.scaled_dot_product_attention(_Q16, _KV16, _KV16, return_lse=None),
                             TypeError, r"^return_lse: expected a bool"),
    "sdpa enable_gqa='y'": (lambda: F.scaled_dot_product_attention(_Q16, _KV16, _KV16, enable_gqa="y"),
                            TypeError, r"^enable_gqa: expected a bool"),
    "sdpa causal_alignment='x'": (lambda: F.scaled_dot_product_attention(_Q16, _KV16, _KV16, causal_alignment="x"),
                                  ValueError, r"^causal_alignment: expected one of 'top_left', 'bottom_right'"),
    "sdpa dropout_p=1.5": (lambda: F.scaled_dot_product_attention(_Q16, _KV16, _KV16, dropout_p=1.5), ValueError,
                           r"^dropout_p: expected a finite number in \[0.0, 1.0\]"),
    "sdpa dropout_p=True": (lambda: F.scaled_dot_product_attention(_Q16, _KV16, _KV16, dropout_p=True), TypeError,
                            r"^dropout_p: expected a number"),
    "sdpa seed=-1": (lambda: F.scaled_dot_product_attention(_Q16, _KV16, _KV16, dropout_p=0.1, seed=-1), ValueError,
                     r"^seed: "),
    "sdpa seed='a'": (lambda: F.scaled_dot_product_attention(_Q16, _KV16, _KV16, dropout_p=0.1, seed="a"),
                      TypeError, r"^seed: expected an int or None"),
    "varlen is_causal=1": (lambda: F.varlen_attention(_X16.reshape(2048, 1, 2048), _X16[:, None, :],
                                                      _X16[:, None, :], [0, 2048], is_causal=1),
                           TypeError, r"^is_causal: expected a bool"),
    "varlen path='x'": (lambda: F.varlen_attention(_X16.reshape(2048, 1, 2048), _X16[:, None, :],
                                                   _X16[:, None, :], [0, 2048], path="x"), ValueError, r"^path: "),
    "gelu approximate='x'": (lambda: F.gelu(_X16, approximate="x"), ValueError, r"^approximate: expected one of"),
    "sdpa backward scale='a'": (lambda: _sdpa_backward(scale="a"), TypeError, r"^scale: expected a number, got str"),
    "sdpa backward is_causal=1": (lambda: _sdpa_backward(is_causal=1), TypeError, r"^is_causal: expected a bool"),
    "sdpa backward dropout_p=-1": (lambda: _sdpa_backward(dropout_p=-1.0), ValueError, r"^dropout_p: expected a"),
    "sdpa backward seed=None": (lambda: _sdpa_backward(dropout_p=0.1), ValueError, r"^seed: the backward of a dropout"),
    "sdpa backward seed=1.5": (lambda: _sdpa_backward(dropout_p=0.1, seed=1.5), TypeError,
                               r"^seed: expected an int or None"),
    "layer_norm_backward eps=-1": (lambda: _backward().layer_norm_backward(_X16, None, _X16, eps=-1.0), ValueError,
                                   r"^eps: expected a finite number >= 0"),
    "rms_norm_backward eps='a'": (lambda: _backward().rms_norm_backward(_X16, None, _X16, eps="a"), TypeError,
                                  r"^eps: expected a number, got str"),
    "softmax_backward dim=True": (lambda: _backward().softmax_backward(_X16, _X16, dim=True), TypeError,
                                  r"^dim: expected an int, got bool"),
    "dropout_backward p=2": (lambda: _backward().dropout_backward(_X16, 2.0, 0), ValueError,
                             r"^p: expected a finite number in \[0.0, 1.0\]"),
    "dropout_backward seed=None": (lambda: _backward().dropout_backward(_X16, 0.5), ValueError, r"^seed: "),
    "embedding_backward padding_idx=9": (lambda: _backward().embedding_backward(np.zeros(2048, np.int64), _X16, 4,
                                                                                padding_idx=9),
                                         ValueError, r"^padding_idx: expected an int in \[-4, 3\], got 9"),
}


@pytest.mark.parametrize("case", list(_BAD_SCALARS))
def test_bad_scalar_argument_is_refused_before_the_inputs_are_copied(case):
    """A bad scalar or str argument is refused before the array inputs are converted: a float16
    (2048, 2048) input's float32 copy (16 MiB) was made first, only to be thrown away. The error
    names the argument, as before."""
    fn, kind, message = _BAD_SCALARS[case]
    err, peak = _peak_bytes(fn)
    assert err.type is kind, err.value
    assert err.match(message)
    assert peak < 2**20, f"{case}: {peak / 2**20:.1f} MiB traced before the error"


def test_documented_type_errors():
    """The TypeErrors the docstrings list (gelu, relu, silu, dropout) are raised, naming the argument."""
    x = np.ones(3, np.float32)
    for fn in (F.gelu, F.relu, F.silu):
        for bad, what in ((np.ones(2, bool), "dtype bool"), (np.ones(2, complex), "dtype complex128"),
                          (None, "None")):
            with pytest.raises(TypeError, match=rf"^x: expected .*{what}"):
                fn(bad)
    with pytest.raises(TypeError, match=r"^approximate: expected a str"):
        F.gelu(x, None)
    with pytest.raises(TypeError, match=r"^training: expected a bool, got int"):
        F.dropout(x, 0.5, 0, training=1)
    with pytest.raises(TypeError, match=r"^p: expected a number"):
        F.dropout(x, "0.5", 0)
    # None is a valid seed: every other type's message says so (it said "expected an int")
    for bad, what in ((1.0, "float 1.0"), ("a", "str 'a'")):
        with pytest.raises(TypeError, match=rf"^seed: expected an int or None, got {what}$"):
            F.dropout(x, 0.5, bad)
        with pytest.raises(TypeError, match=rf"^seed: expected an int or None, got {what}$"):
            F.scaled_dot_product_attention(x.reshape(1, 3, 1), x.reshape(1, 3, 1), x.reshape(1, 3, 1), seed=bad)


# ------------------------------------------------ shapes and dtypes are checked before any copy
_BIG_SHAPE = (4000, 4096)  # float16: 31.25 MiB; its float32 copy is 62.5 MiB


@pytest.fixture(scope="module")
def x16():
    return np.ones(_BIG_SHAPE, np.float16)


# (call on the float16 x, error type, message): each call has one bad argument besides x, which the
# op refused only after x's full float32 copy (62.5 MiB; 125-190 MiB for attention's q, k, v)
_BAD_SHAPES = {
    "linear weight": (lambda x: F.linear(x, np.ones((3, 7), np.float32)), ValueError,
                      r"^weight: expected shape \(out_features, 4096\) to match x's last dim, got \(3, 7\)"),
    "linear bias": (lambda x: F.linear(x, np.ones((3, 4096), np.float16), np.ones(2)), ValueError,
                    r"^bias: expected shape \(3,\) to match weight's out_features 3, got \(2,\)"),
    "layer_norm weight": (lambda x: F.layer_norm(x, np.ones(7, np.float32)), ValueError,
                          r"^weight: expected shape \(4096,\) to match x's last dim, got \(7,\)"),
    "layer_norm bias": (lambda x: F.layer_norm(x, None, np.ones((2, 4096), np.float32)), ValueError,
                        r"^bias: expected a 1-D array, got 2-D with shape \(2, 4096\)"),
    "rms_norm weight": (lambda x: F.rms_norm(x, np.ones(7, np.float32)), ValueError,
                        r"^weight: expected shape \(4096,\) to match x's last dim, got \(7,\)"),
    "glu shapes": (lambda x: F.glu(x, np.ones((3, 3), np.float16)), ValueError,
                   r"^up: expected the shape of gate \(4000, 4096\), got \(3, 3\)"),
    "glu torch's dim": (lambda x: F.glu(x, -1), TypeError, r"^up: expected an array of gate's shape, got int -1"),
    "glu torch's one argument": (lambda x: F.glu(x), TypeError, r"^up: expected an array of gate's shape, got None"),
    "cross_entropy float target": (lambda x: F.cross_entropy(x, np.ones(4000)), TypeError,
                                   r"^target: expected integer class indices, got dtype float64"),
    "cross_entropy target shape": (lambda x: F.cross_entropy(x, np.ones(3, int)), ValueError,
                                   r"^target: expected shape \(4000,\) \(logits' shape without the class dim\)"),
    "cross_entropy target value": (lambda x: F.cross_entropy(x, np.full(4000, 4096)), ValueError,
                                   r"^target: expected class indices in \[0, 4096\) or ignore_index \(-100\), "
                                   r"got 4096 at index \(0,\)"),
    "sdpa key": (lambda x: F.scaled_dot_product_attention(x, np.ones((5, 3), np.float16), x), ValueError,
                 r"^key: expected last dim 4096 \(query's embedding size\), got shape \(5, 3\)"),
    "sdpa value": (lambda x: F.scaled_dot_product_attention(x, x, x[:7]), ValueError,
                   r"^value: expected length 4000 \(key's length\) in dim -2, got shape \(7, 4096\)"),
    "sdpa attn_mask": (lambda x: F.scaled_dot_product_attention(x, x, x, np.ones((3, 3), bool)), ValueError,
                       r"^attn_mask: shape \(3, 3\) does not broadcast to the expected \(4000, 4000\)"),
    "sdpa key_mask": (lambda x: F.scaled_dot_product_attention(x, x, x, key_mask=np.ones(3, bool)), ValueError,
                      r"^key_mask: expected shape \(4000,\)"),
    "varlen cu_seqlens float": (lambda x: F.varlen_attention(*(x.reshape(4000, 4, 1024),) * 3, np.array([0., 4000.])),
                                TypeError, r"^cu_seqlens: expected integers, got dtype float64"),
    "varlen cu_seqlens end": (lambda x: F.varlen_attention(*(x.reshape(4000, 4, 1024),) * 3, [0, 3999]), ValueError,
                              r"^cu_seqlens: expected 0 first and 4000 \(the tokens\) last, got 0 and 3999"),
    "varlen key": (lambda x: F.varlen_attention(x.reshape(4000, 4, 1024), x.reshape(4000, 8, 512),
                                                x.reshape(4000, 4, 1024), [0, 4000]), ValueError,
                   r"^key: expected last dim 1024 \(query's embedding size\), got shape \(4000, 8, 512\)"),
    "linear_backward grad_output": (
        lambda x: _backward().linear_backward(x, np.ones((3, 4096), np.float32), x[:, :5]), ValueError,
        r"^grad_output: expected shape \(4000, 3\) \(the op's output for x, weight\), got \(4000, 5\)"),
    "layer_norm_backward grad_output": (
        lambda x: _backward().layer_norm_backward(x, None, x[:, :7]), ValueError,
        r"^grad_output: expected shape \(4000, 4096\) \(the op's output for x\), got \(4000, 7\)"),
    "rms_norm_backward weight": (
        lambda x: _backward().rms_norm_backward(x, np.ones(7), x), ValueError,
        r"^weight: expected shape \(4096,\) to match x's last dim, got \(7,\)"),
    "gelu_backward grad_output": (
        lambda x: _backward().gelu_backward(x, x[:3]), ValueError,
        r"^grad_output: expected shape \(4000, 4096\) \(the op's output for x\), got \(3, 4096\)"),
    "glu_backward grad_output": (
        lambda x: _backward().glu_backward(x, x, x[:3]), ValueError,
        r"^grad_output: expected shape \(4000, 4096\) \(the op's output for gate, up\), got \(3, 4096\)"),
    "softmax_backward grad_output": (
        lambda x: _backward().softmax_backward(x, x[:3]), ValueError,
        r"^grad_output: expected shape \(4000, 4096\) \(the op's output for output\), got \(3, 4096\)"),
    "embedding_backward grad_output": (
        lambda x: _backward().embedding_backward(np.zeros(3999, np.int64), x, 5), ValueError,
        r"^grad_output: expected shape \(3999,\) \+ \(embedding_dim,\) to match ids, got \(4000, 4096\)"),
    "rotary_backward odd head_dim": (
        lambda x: _backward().rotary_backward(x[:, :4095], np.ones(4095), np.ones(4095)),
        ValueError, r"^grad_output: expected an even head_dim \(last dim\), got shape \(4000, 4095\)"),
    "cross_entropy_backward grad_output": (
        lambda x: _backward().cross_entropy_backward(x, np.zeros(4000, np.int64), np.ones(3, np.float32),
                                                            reduction="none"), ValueError,
        r"^grad_output: expected shape \(4000,\) \(the op's output for logits, target\), got \(3,\)"),
    "sdpa_backward lse": (
        lambda x: _backward().scaled_dot_product_attention_backward(x, x, x, x, x, np.zeros(3, np.float32)),
        ValueError, r"^lse: expected shape \(4000,\) \(the op's output for query\), got \(3,\)"),
}


@pytest.mark.parametrize("case", list(_BAD_SHAPES))
def test_bad_shape_or_dtype_is_refused_before_the_inputs_are_copied(case, x16):
    """A bad shape, dtype or value of another argument is refused on the arrays as given, before the
    float16 x's float32 copy (62.5 MiB; the attention inputs' 125-190 MiB) is made only to be thrown
    away: the peak traced while the call runs stays under 1 MiB. The messages are those the checks
    gave after the copy."""
    fn, kind, message = _BAD_SHAPES[case]
    err, peak = _peak_bytes(lambda: fn(x16))
    assert err.type is kind, err.value
    assert err.match(message), err.value
    assert peak < 2**20, f"{case}: {peak / 2**20:.1f} MiB traced before the error"


def test_extreme_values_give_torchs_results_without_numpy_warnings():
    """An fp32 cross-entropy beyond float32's range (inf, as torch) and the cosine of a row holding
    inf (NaN, as torch) printed numpy RuntimeWarnings from inside the package. (Clipping an inf
    gradient: tests/test_optim.py, whose optimizers the sanitizer's reduced core lacks.)"""
    import warnings

    logits = np.array([[3e38, -3e38]], np.float32)  # the loss of class 1: 6e38
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = tc.functional.cross_entropy(logits, np.array([1]))
        assert loss == np.inf == torch.nn.functional.cross_entropy(torch.from_numpy(logits), torch.tensor([1])).item()
        sim = tc.sentence_encoder.cosine_similarity(np.array([[np.inf, 1.0]]), np.array([[1.0, 0.0]]))
        assert np.isnan(sim).all()


# ------------------------------------------------------- torch's normalized_shape given to the norms
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_norms_refuse_torchs_normalized_shape_and_match_torch_without_it(rng, dtype):
    """torch's ``F.layer_norm(x, (E,), w, b)`` / ``F.rms_norm(x, (E,), w)`` made here read the shape
    as the weight and w as bias (or eps): the error blamed ``eps`` ("expected a number, got ndarray")
    or weight's shape. A tuple/list of ints that cannot be a weight (its length is not E, or an
    array follows where eps goes) or a torch.Size is now a TypeError naming weight and the
    signature; the call without the shape gives torch's values (computed here)."""
    x, w, b = randn(rng, (3, 4), dtype), randn(rng, (4,), dtype), randn(rng, (4,), dtype)
    x1, w1, b1 = randn(rng, (3, 1), dtype), randn(rng, (1,), dtype), randn(rng, (1,), dtype)
    ln = r"^weight: expected an array of shape \({e},\) \(x's last dim\) or None, got {kind} \({e},\), which " \
         r"looks like torch's normalized_shape: layer_norm\(x, weight, bias, eps\) has no normalized_shape " \
         r"argument \(it normalises over the last dim\): torch's F.layer_norm\(x, \({e},\), weight, bias, eps\) " \
         r"is layer_norm\(x, weight, bias, eps\) here$"
    rms = r"^weight: expected an array of shape \({e},\) .*normalized_shape: rms_norm\(x, weight, eps\) has no " \
          r"normalized_shape argument .*F.rms_norm\(x, \({e},\), weight, eps\) is rms_norm\(x, weight, eps\) here$"
    cases = [
        (lambda: F.layer_norm(x, (4,), w, b), ln.format(e=4, kind="tuple")),
        (lambda: F.layer_norm(x, x.shape[-1:]), ln.format(e=4, kind="tuple")),
        (lambda: F.layer_norm(x, [4], w), ln.format(e=4, kind="list")),
        (lambda: F.layer_norm(to_torch(x), torch.Size([4]), to_torch(w), to_torch(b)),
         ln.format(e=4, kind="torch.Size")),
        (lambda: F.layer_norm(x1, (1,), w1, b1), ln.format(e=1, kind="tuple")),  # length E, then arrays
        (lambda: F.layer_norm(x1, (1,), w1), ln.format(e=1, kind="tuple")),  # was 3·1 + w1 where torch gives w1·0
        (lambda: F.rms_norm(x, (4,), w), rms.format(e=4)),
        (lambda: F.rms_norm(x, torch.Size([4])), rms.format(e=4)),
        (lambda: F.rms_norm(x1, (1,), w1), rms.format(e=1)),
    ]
    for call, match in cases:
        with pytest.raises(TypeError, match=match):
            call()
    t = to_torch(x)
    assert_close(F.layer_norm(x, w, b), TF.layer_norm(t, (4,), to_torch(w), to_torch(b)), dtype)
    assert_close(F.rms_norm(x, w, 1e-6), TF.rms_norm(t, (4,), to_torch(w), 1e-6), dtype)
    # a length-E list of ints followed by a number is a weight, as before
    ints = np.array([1, -2, 3, 4], dtype)
    assert_close(F.layer_norm(x, [1, -2, 3, 4]), TF.layer_norm(t, (4,), to_torch(ints)), dtype)
    assert_close(F.rms_norm(x, (1, -2, 3, 4), 1e-6), TF.rms_norm(t, (4,), to_torch(ints), 1e-6), dtype)
    assert_close(F.layer_norm(x1, [2], b1), TF.layer_norm(to_torch(x1), (1,), to_torch(np.array([2], dtype)),
                                                          to_torch(b1)), dtype)
    # ints that cannot be x's trailing dims (nor a weight of its length) keep the shape error, as
    # floats do: the exception does not depend on int vs float
    for weight in ([1, 2, 3], [1.0, 2.0, 3.0], (7,)):
        with pytest.raises(ValueError, match=r"^weight: expected shape \(4,\) to match x's last dim, got \("):
            F.layer_norm(x, weight)
