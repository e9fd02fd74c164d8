"""transformer_core.functional.scaled_dot_product_attention vs torch.

Outputs are compared with torch.nn.functional.scaled_dot_product_attention, attention weights with
softmax(Q K^T * scale + mask) computed in torch.  Query rows that can see no key are excluded from
the torch comparison (torch gives NaN there) and must be exact zeros in ours (output and weights).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
import transformer_core as tc
from conftest import DTYPE_IDS, FLOAT_DTYPES, assert_close, atol, randn, rtol, to_torch

F = tc.functional

# (lead dims, L, S, E, Ev)
SHAPES = [
    ((2,), 7, 9, 8, 5),       # 3-D, L != S, Ev != E
    ((1,), 1, 1, 4, 4),       # seq 1
    ((7,), 7, 7, 9, 9),       # batch == seq length
    ((3,), 1, 17, 16, 3),     # single query
    ((2,), 65, 17, 8, 8),     # L > S
    ((2, 3), 7, 9, 8, 6),     # 4-D
    ((1, 1), 1, 1, 1, 1),     # 4-D, all ones
    ((3, 2), 9, 9, 17, 7),    # 4-D, odd E
    ((), 5, 9, 4, 4),         # 2-D (no leading dims)
]
SHAPE_IDS = ["x".join(map(str, lead)) + f"-L{L}S{S}E{E}Ev{Ev}" for lead, L, S, E, Ev in SHAPES]


def make_qkv(rng, lead, L, S, E, Ev, dtype):
    q = randn(rng, lead + (L, E), dtype)
    k = randn(rng, lead + (S, E), dtype)
    v = randn(rng, lead + (S, Ev), dtype)
    return q, k, v


def torch_reference(q, k, v, *, bool_mask=None, float_mask=None, is_causal=False, scale=None):
    """Returns (out, weights, valid_rows) computed in torch in the input dtype.

    bool_mask: True = may attend (broadcastable to (..., L, S)); float_mask: added to the scores.
    valid_rows: (..., L) bool, False where a query row can see no key.
    """
    qt, kt, vt = to_torch(q), to_torch(k), to_torch(v)
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    sc = 1.0 / math.sqrt(E) if scale is None else scale
    scores = (qt @ kt.transpose(-2, -1)) * sc
    if float_mask is not None:
        scores = scores + to_torch(float_mask)
    allowed = torch.ones(L, S, dtype=torch.bool)
    if is_causal:
        allowed = torch.ones(L, S, dtype=torch.bool).tril()
    if bool_mask is not None:
        allowed = allowed & to_torch(bool_mask)
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    valid = torch.isfinite(scores).any(-1)

    # The output itself from torch's SDPA (one combined mask).
    if float_mask is None and not is_causal and bool_mask is None:
        out = TF.scaled_dot_product_attention(qt, kt, vt, scale=scale)
    elif float_mask is None and bool_mask is None and is_causal:
        out = TF.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale)
    elif float_mask is None:
        out = TF.scaled_dot_product_attention(qt, kt, vt, attn_mask=allowed, scale=scale)
    else:
        fm = to_torch(float_mask).masked_fill(~allowed, float("-inf"))
        out = TF.scaled_dot_product_attention(qt, kt, vt, attn_mask=fm, scale=scale)
    out_manual = weights @ vt
    # both references must agree on the valid rows
    vnp = valid.numpy()
    np.testing.assert_allclose(out.numpy()[vnp], out_manual.numpy()[vnp], atol=1e-4)
    return out.numpy(), weights.numpy(), vnp


def sdpa_w(*args, **kwargs):
    """Calls ours twice: without weights (the fused path) and with weights; both outputs must
    agree to the dtype's tolerance (exact zeros in the same places).  Returns (output, weights)."""
    out = F.scaled_dot_product_attention(*args, **kwargs)
    out_w, w = F.scaled_dot_product_attention(*args, return_weights=True, **kwargs)
    assert isinstance(out, np.ndarray) and out.dtype == out_w.dtype and out.shape == out_w.shape
    np.testing.assert_allclose(out, out_w, atol=atol(out.dtype), rtol=rtol(out.dtype),
                               equal_nan=True, err_msg="output with / without return_weights")
    assert np.array_equal(np.all(out == 0, axis=-1), np.all(out_w == 0, axis=-1))
    return out, w


def check_against_reference(ours_out, ours_w, ref_out, ref_w, valid, dtype):
    assert ours_out.dtype == np.dtype(dtype)
    assert ours_out.shape == ref_out.shape, (ours_out.shape, ref_out.shape)
    valid_b = np.broadcast_to(valid, ref_out.shape[:-1])
    assert_close(ours_out[valid_b], ref_out[valid_b], dtype, what="sdpa output (valid rows)")
    assert np.array_equal(ours_out[~valid_b], np.zeros_like(ours_out[~valid_b])), \
        "fully masked query rows must give exact zeros"
    if ours_w is not None:
        assert ours_w.dtype == np.dtype(dtype)
        assert ours_w.shape == ref_w.shape, (ours_w.shape, ref_w.shape)
        assert_close(ours_w[valid_b], ref_w[valid_b], dtype, what="sdpa weights (valid rows)")
        assert np.array_equal(ours_w[~valid_b], np.zeros_like(ours_w[~valid_b]))
        np.testing.assert_allclose(ours_w[valid_b].sum(-1), 1.0, atol=1e-5)


# ------------------------------------------------------------------------------- plain attention
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("lead,L,S,E,Ev", SHAPES, ids=SHAPE_IDS)
def test_sdpa_unmasked(rng, lead, L, S, E, Ev, scale, dtype):
    q, k, v = make_qkv(rng, lead, L, S, E, Ev, dtype)
    ref_out, ref_w, valid = torch_reference(q, k, v, scale=scale)
    assert valid.all()
    out = F.scaled_dot_product_attention(q, k, v, scale=scale)
    assert isinstance(out, np.ndarray)
    out2, w = F.scaled_dot_product_attention(q, k, v, scale=scale, return_weights=True)
    check_against_reference(out, None, ref_out, ref_w, valid, dtype)
    check_against_reference(out2, w, ref_out, ref_w, valid, dtype)
    # the fused path (no weights) and the weights path may round differently: dtype tolerance
    assert_close(out, out2, dtype, what="with / without return_weights")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,L,S,E,Ev", SHAPES, ids=SHAPE_IDS)
def test_sdpa_is_causal_top_left(rng, lead, L, S, E, Ev, dtype):
    q, k, v = make_qkv(rng, lead, L, S, E, Ev, dtype)
    ref_out, ref_w, valid = torch_reference(q, k, v, is_causal=True)
    assert valid.all()  # top-left: row l sees keys 0..l, key 0 always visible
    out, w = sdpa_w(q, k, v, is_causal=True)
    check_against_reference(out, w, ref_out, ref_w, valid, dtype)
    # strictly upper triangle of the weights is exactly zero
    upper = ~np.tril(np.ones((L, S), bool))
    assert np.all(w[..., upper] == 0)


# ------------------------------------------------------------------------------------ attn_mask
def _bool_mask(rng, shape, p_true=0.7):
    return rng.random(shape) < p_true


# mask shapes, written relative to (lead, L, S)
MASK_SHAPES_3D = ["LS", "NLS", "1LS"]
MASK_SHAPES_4D = ["LS", "N1LS", "1HLS", "NHLS", "HLS", "11LS"]


def _mask_shape(code, lead, L, S):
    dims = {"L": L, "S": S, "1": 1}
    if len(lead) == 1:
        dims["N"] = lead[0]
    else:
        dims["N"], dims["H"] = lead
    return tuple(dims[c] for c in code)


MASK_CASES = ([((2,), 7, 9, 8, 5, m) for m in MASK_SHAPES_3D]
              + [((7,), 7, 7, 9, 9, m) for m in MASK_SHAPES_3D]
              + [((2, 3), 7, 9, 8, 6, m) for m in MASK_SHAPES_4D]
              + [((1,), 1, 1, 4, 4, "LS"), ((3,), 1, 17, 16, 3, "NLS")])
MASK_IDS = ["x".join(map(str, c[0])) + f"-L{c[1]}S{c[2]}-{c[5]}" for c in MASK_CASES]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,L,S,E,Ev,mshape", MASK_CASES, ids=MASK_IDS)
def test_sdpa_bool_attn_mask(rng, lead, L, S, E, Ev, mshape, dtype):
    q, k, v = make_qkv(rng, lead, L, S, E, Ev, dtype)
    mask = _bool_mask(rng, _mask_shape(mshape, lead, L, S))
    mask[..., 0] = True  # at least one visible key per row (fully masked rows tested separately)
    ref_out, ref_w, valid = torch_reference(q, k, v, bool_mask=mask)
    out, w = sdpa_w(q, k, v, mask)
    check_against_reference(out, w, ref_out, ref_w, valid, dtype)
    assert np.all(np.broadcast_to(~mask, w.shape) <= (w == 0))  # blocked keys get weight 0


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,L,S,E,Ev,mshape", MASK_CASES, ids=MASK_IDS)
def test_sdpa_float_attn_mask(rng, lead, L, S, E, Ev, mshape, dtype):
    q, k, v = make_qkv(rng, lead, L, S, E, Ev, dtype)
    fmask = randn(rng, _mask_shape(mshape, lead, L, S), dtype, scale=2.0)
    ref_out, ref_w, valid = torch_reference(q, k, v, float_mask=fmask)
    out, w = sdpa_w(q, k, v, attn_mask=fmask)
    check_against_reference(out, w, ref_out, ref_w, valid, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_sdpa_float_mask_with_neg_inf_rows(rng, dtype):
    q, k, v = make_qkv(rng, (2,), 7, 9, 8, 5, dtype)
    fmask = randn(rng, (2, 7, 9), dtype)
    fmask[:, :, 3] = -np.inf
    fmask[0, 2, :] = -np.inf  # a fully masked row
    fmask[1, 6, :] = -np.inf
    ref_out, ref_w, valid = torch_reference(q, k, v, float_mask=fmask)
    assert not valid[0, 2] and not valid[1, 6] and valid.sum() == 12
    out, w = sdpa_w(q, k, v, attn_mask=fmask)
    check_against_reference(out, w, ref_out, ref_w, valid, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_sdpa_bool_mask_fully_masked_rows_are_zero(rng, dtype):
    q, k, v = make_qkv(rng, (2, 3), 7, 9, 8, 6, dtype)
    mask = _bool_mask(rng, (2, 3, 7, 9))
    mask[..., 0] = True
    mask[0, 1, 4, :] = False
    mask[1, :, 0, :] = False
    ref_out, ref_w, valid = torch_reference(q, k, v, bool_mask=mask)
    assert (~valid).sum() == 4
    out, w = sdpa_w(q, k, v, attn_mask=mask)
    check_against_reference(out, w, ref_out, ref_w, valid, dtype)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(w))


# --------------------------------------------------------------------- query_mask / key_mask
PAD_CASES = [
    # lead, L, S, E, Ev, query_mask shape, key_mask shape
    ((2,), 7, 9, 8, 5, (2, 7), (2, 9)),
    ((2,), 7, 9, 8, 5, None, (2, 9)),
    ((2,), 7, 9, 8, 5, (2, 7), None),
    ((2,), 7, 9, 8, 5, None, (9,)),
    ((7,), 7, 7, 9, 9, (7, 7), (7, 7)),
    ((1,), 1, 1, 4, 4, (1, 1), (1, 1)),
    ((3,), 17, 65, 8, 8, (3, 17), (3, 65)),
    ((2, 3), 7, 9, 8, 6, (2, 1, 7), (2, 1, 9)),
    ((2, 3), 7, 9, 8, 6, None, (2, 1, 9)),
    ((2, 3), 7, 9, 8, 6, (2, 3, 7), (2, 3, 9)),
    ((2, 3), 7, 9, 8, 6, None, (9,)),
]
PAD_IDS = [f"{'x'.join(map(str, c[0]))}-L{c[1]}S{c[2]}-q{c[5]}-k{c[6]}" for c in PAD_CASES]


def _padding_mask(rng, shape, min_real=1):
    """1/0 padding mask: real tokens first, then padding (like a padded batch)."""
    n = shape[-1]
    lengths = rng.integers(min_real, n + 1, size=shape[:-1])
    return (np.arange(n) < lengths[..., None])


@pytest.mark.parametrize("as_int", [False, True], ids=["bool", "int"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,L,S,E,Ev,qshape,kshape", PAD_CASES, ids=PAD_IDS)
def test_sdpa_query_and_key_masks(rng, lead, L, S, E, Ev, qshape, kshape, dtype, as_int):
    q, k, v = make_qkv(rng, lead, L, S, E, Ev, dtype)
    qm = None if qshape is None else _padding_mask(rng, qshape)
    km = None if kshape is None else _padding_mask(rng, kshape)
    if qm is not None and qm.size > 1:
        qm.reshape(-1, qm.shape[-1])[0, -1] = False  # make sure some query padding exists
    ones_q = np.ones(L, bool)
    ones_k = np.ones(S, bool)
    full = (qm if qm is not None else ones_q)[..., :, None] & (km if km is not None else ones_k)[..., None, :]
    ref_out, ref_w, valid = torch_reference(q, k, v, bool_mask=full)
    kwargs = {}
    if qm is not None:
        kwargs["query_mask"] = qm.astype(np.int64) if as_int else qm
    if km is not None:
        kwargs["key_mask"] = km.astype(np.int64) if as_int else km
    out, w = sdpa_w(q, k, v, **kwargs)
    check_against_reference(out, w, ref_out, ref_w, valid, dtype)
    if qm is not None and qm.size > 1:
        assert not valid.all()  # padded query rows exist and are zeros


def _torch_masked_attention(q, k, v, gout, allowed):
    """softmax(Q Kᵀ / √E, masked) V in torch and the gradients of <out, gout>; a row that sees no key
    gives zeros and no gradient (our convention; torch's softmax would give NaN)."""
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    s = (qt @ kt.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    ok = torch.from_numpy(np.ascontiguousarray(allowed))
    s = s.masked_fill(~ok, float("-inf"))
    valid = ok.any(dim=-1)
    p = torch.softmax(s.masked_fill(~valid[..., None], 0.0), dim=-1) * valid[..., None]
    out = p @ vt
    out.backward(torch.from_numpy(gout))
    return out.detach().numpy(), qt.grad.numpy(), kt.grad.numpy(), vt.grad.numpy()


@pytest.mark.parametrize("N,H", [(3, 3), (2, 3)], ids=["N==H", "N!=H"])
@pytest.mark.parametrize("which", ["key_mask", "query_mask"])
def test_sdpa_2d_token_mask_with_heads_is_per_batch(rng, N, H, which):
    """A 2-D (N, S) key_mask / (N, L) query_mask with q (N, H, L, E) is per batch entry, broadcast over
    the heads (torch's key_padding_mask, and reference.scaled_dot_product_attention): it used to be
    lined up with the head axis (silently wrong when N == H), forward and backward."""
    from transformer_core import backward as B
    from transformer_core import reference

    L, S, E = 5, 6, 4
    q, k, v = make_qkv(rng, (N, H), L, S, E, E, np.float64)
    gout = randn(rng, (N, H, L, E), np.float64)
    m = _padding_mask(rng, (N, S if which == "key_mask" else L))
    m[0, -2:] = False
    m[-1, :] = True  # entries differ, so a per-head reading would differ too
    m4 = m[:, None, None, :] if which == "key_mask" else m[:, None, :, None]  # (N, 1, 1, S) / (N, 1, L, 1)
    out, gq, gk, gv = _torch_masked_attention(q, k, v, gout, np.broadcast_to(m4, (N, H, L, S)))
    ours, lse = F.scaled_dot_product_attention(q, k, v, **{which: m}, return_lse=True)
    assert_close(ours, out, np.float64, what=f"{which} (N, ·) forward")
    for path in ("flash", "reference"):
        assert_close(F.scaled_dot_product_attention(q, k, v, **{which: m}, path=path), out, np.float64,
                     what=f"{which} path={path}")
    # the same as the explicit (N, 1, ·) mask, which lines up with q's leading dims
    np.testing.assert_array_equal(ours, F.scaled_dot_product_attention(q, k, v, **{which: m[:, None]}))
    grads = B.scaled_dot_product_attention_backward(q, k, v, ours, gout, lse, **{which: m})
    for got, want, name in zip(grads, (gq, gk, gv), ("grad_query", "grad_key", "grad_value")):
        assert_close(got, want, np.float64, what=f"{which} (N, ·) {name}")
    if which == "key_mask":  # the numpy oracle reads (N, S) the same way, also from a list
        ref_out, _ = reference.scaled_dot_product_attention(q, k, v, key_mask=m.tolist())
        assert_close(ours, ref_out, np.float64, what="vs reference")


def test_sdpa_token_mask_ambiguous_or_wrong_shapes_refused(rng):
    q, k, v = make_qkv(rng, (2, 3, 4), 5, 6, 4, 4, np.float32)  # 5-D: leading dims (2, 3, 4)
    with pytest.raises(ValueError, match=r"key_mask: expected shape \(6,\) or \(2, 6\) or \(2, 3, 4, 6\)"):
        F.scaled_dot_product_attention(q, k, v, key_mask=np.ones((3, 4, 6), bool))  # (G, H, S) or (N, G, S)?
    q, k, v = make_qkv(rng, (2, 3), 5, 6, 4, 4, np.float32)
    with pytest.raises(ValueError, match=r"key_mask: a 2-D mask is \(batch, key length\).*first dim 2"):
        F.scaled_dot_product_attention(q, k, v, key_mask=np.ones((3, 6), bool))  # (H, S) is not read as heads
    with pytest.raises(ValueError, match=r"query_mask: .*first dim 2"):
        F.scaled_dot_product_attention(q, k, v, query_mask=np.ones((3, 5), bool))
    with pytest.raises(ValueError, match="key_mask"):
        F.scaled_dot_product_attention(q, k, v, key_mask=np.ones((2, 5), bool))  # wrong S
    with pytest.raises(TypeError, match="key_mask: expected bool or integer 0/1.*float32.*key_padding_mask"):
        F.scaled_dot_product_attention(q, k, v, key_mask=np.zeros((2, 6), np.float32))
    with pytest.raises(TypeError, match="query_mask: .*float64"):
        F.scaled_dot_product_attention(q, k, v, query_mask=np.ones((2, 5)))
    # (1, S) and (S,) broadcast over everything, as before
    full = F.scaled_dot_product_attention(q, k, v)
    np.testing.assert_array_equal(F.scaled_dot_product_attention(q, k, v, key_mask=np.ones((1, 6), np.int64)), full)
    np.testing.assert_array_equal(F.scaled_dot_product_attention(q, k, v, key_mask=np.ones(6, bool)), full)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_sdpa_fully_padded_batch_element(rng, dtype):
    q, k, v = make_qkv(rng, (3,), 7, 9, 8, 5, dtype)
    km = _padding_mask(rng, (3, 9))
    km[1] = False  # batch element 1 has no real key at all
    ref_out, ref_w, valid = torch_reference(q, k, v, bool_mask=km[:, None, :])
    out, w = sdpa_w(q, k, v, key_mask=km)
    check_against_reference(out, w, ref_out, ref_w, valid, dtype)
    assert np.array_equal(out[1], np.zeros((7, 5), dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,L,S", [((2,), 7, 9), ((2, 3), 9, 7), ((7,), 7, 7), ((1,), 1, 1)])
def test_sdpa_masks_combine(rng, lead, L, S, dtype):
    """attn_mask (bool and float) AND key_mask AND query_mask: a key is visible only if all allow."""
    q, k, v = make_qkv(rng, lead, L, S, 8, 8, dtype)
    N = lead[0]
    klead = (N, 1, S) if len(lead) == 2 else (N, S)
    qlead = (N, 1, L) if len(lead) == 2 else (N, L)
    km = _padding_mask(rng, klead)
    qm = _padding_mask(rng, qlead)
    bm = _bool_mask(rng, (L, S))
    full = bm & km[..., None, :] & qm[..., :, None]
    ref_out, ref_w, valid = torch_reference(q, k, v, bool_mask=full)
    out, w = sdpa_w(q, k, v, bm, query_mask=qm, key_mask=km)
    check_against_reference(out, w, ref_out, ref_w, valid, dtype)

    fm = randn(rng, (L, S), dtype)
    full2 = km[..., None, :] & qm[..., :, None]
    ref_out, ref_w, valid = torch_reference(q, k, v, bool_mask=full2, float_mask=fm)
    out, w = sdpa_w(q, k, v, fm, query_mask=qm, key_mask=km)
    check_against_reference(out, w, ref_out, ref_w, valid, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kshape", ["(S,)", "(N, S)", "(N, 1, S)", "(N, H, S)"])
@pytest.mark.parametrize("lead,L,S", [((2, 3), 7, 9), ((3, 3), 9, 7), ((1, 2), 1, 65), ((2, 1), 70, 70)])
def test_sdpa_key_mask_with_other_masks_on_the_flash_path(rng, lead, L, S, kshape, dtype):
    """A key_mask joins a boolean attn_mask and a query_mask on the flash path (no weights asked):
    one per batch entry goes to the kernels' key-mask slot, a per-head one is combined; forward and
    backward match torch either way."""
    from transformer_core import backward as B

    N, H = lead
    q, k, v = make_qkv(rng, lead, L, S, 8, 5, dtype)
    shape = {"(S,)": (S,), "(N, S)": (N, S), "(N, 1, S)": (N, 1, S), "(N, H, S)": (N, H, S)}[kshape]
    km = _padding_mask(rng, shape)
    km4 = km.reshape((N, 1, 1, S)) if kshape == "(N, S)" else km[..., None, :]
    qm = _padding_mask(rng, (N, 1, L))
    bm = _bool_mask(rng, (L, S))
    allowed = np.array(np.broadcast_to(bm & km4 & qm[..., :, None], lead + (L, S)))
    gout = randn(rng, lead + (L, 5), dtype)
    out, gq, gk, gv = _torch_masked_attention(q, k, v, gout, allowed)
    ours, lse = F.scaled_dot_product_attention(q, k, v, bm, query_mask=qm, key_mask=km, return_lse=True)
    assert_close(ours, out, dtype, what=f"key_mask {kshape} with attn_mask and query_mask")
    grads = B.scaled_dot_product_attention_backward(q, k, v, ours, gout, lse, bm, query_mask=qm, key_mask=km)
    for got, want, name in zip(grads, (gq, gk, gv), ("grad_query", "grad_key", "grad_value")):
        assert_close(got, want, dtype, what=f"key_mask {kshape}: {name}")
    # the same bits as the key mask folded into attn_mask by hand
    np.testing.assert_array_equal(
        ours, F.scaled_dot_product_attention(q, k, v, np.ascontiguousarray(np.broadcast_to(bm & km4, lead + (L, S))),
                                             query_mask=qm))


def test_sdpa_key_mask_with_attn_mask_allocates_no_score_sized_mask(rng):
    """A padding key_mask (N, S) with a boolean attn_mask (L, S) used to be combined into one
    (N, H, L, S) array (8 MiB here): it now rides in the kernels' key-mask slot."""
    import tracemalloc

    N, H, L, S = 2, 16, 512, 512
    q, k, v = make_qkv(rng, (N, H), L, S, 8, 8, np.float32)
    km = _padding_mask(rng, (N, S))
    bm = np.tril(np.ones((L, S), bool))
    tracemalloc.start()
    try:
        F.scaled_dot_product_attention(q, k, v, bm, key_mask=km)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < N * H * L * S // 4, f"peak {peak} bytes: a (N, H, L, S) mask was made"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,L,S", [((2,), 7, 9), ((3,), 9, 7), ((7,), 7, 7), ((2, 3), 7, 9)])
def test_sdpa_causal_with_key_mask(rng, lead, L, S, dtype):
    q, k, v = make_qkv(rng, lead, L, S, 8, 5, dtype)
    km = np.ones(lead[:1] + (1,) * (len(lead) - 1) + (S,), bool)
    km[0, ..., 0] = False  # batch 0: key 0 padded -> causal row 0 sees nothing
    km[-1, ..., S - 2:] = False
    ref_out, ref_w, valid = torch_reference(q, k, v, bool_mask=km[..., None, :], is_causal=True)
    out, w = sdpa_w(q, k, v, key_mask=km, is_causal=True)
    check_against_reference(out, w, ref_out, ref_w, valid, dtype)
    assert not valid[0, ..., 0].any()


# ------------------------------------------------------------------------------ misc properties
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_sdpa_nan_input_gives_nan(rng, dtype):
    q, k, v = make_qkv(rng, (3,), 7, 9, 8, 5, dtype)
    qn = q.copy()
    qn[0, 2, 1] = np.nan
    out = F.scaled_dot_product_attention(qn, k, v)
    assert np.all(np.isnan(out[0, 2]))
    assert np.all(np.isfinite(np.delete(out[0], 2, axis=0))) and np.all(np.isfinite(out[1:]))

    kn = k.copy()
    kn[1, 4, 0] = np.nan
    out = F.scaled_dot_product_attention(q, kn, v)
    assert np.all(np.isnan(out[1]))
    assert np.all(np.isfinite(out[[0, 2]]))

    vn = v.copy()
    vn[2, 0, 3] = np.nan
    out = F.scaled_dot_product_attention(q, k, vn)
    assert np.all(np.isnan(out[2, :, 3]))
    assert np.all(np.isfinite(np.delete(out[2], 3, axis=-1)))
    assert np.all(np.isfinite(out[:2]))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("layout", ["fortran", "strided", "transposed_view"])
def test_sdpa_noncontiguous_inputs(rng, layout, dtype):
    q, k, v = make_qkv(rng, (2, 3), 7, 9, 8, 6, dtype)
    mask = _bool_mask(rng, (2, 1, 7, 9))
    mask[..., 0] = True

    def re(a):
        if layout == "fortran":
            return np.asfortranarray(a)
        if layout == "strided":
            big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
            big[..., ::2] = a
            return big[..., ::2]
        # (N, L, H, E) buffer viewed as (N, H, L, E), as a layer's projection would be
        return np.ascontiguousarray(np.swapaxes(a, 1, 2)).swapaxes(1, 2)

    ql, kl, vl, ml = re(q), re(k), re(v), re(mask)
    assert not ql.flags.c_contiguous
    ref_out, ref_w, valid = torch_reference(q, k, v, bool_mask=mask)
    out, w = sdpa_w(ql, kl, vl, ml)
    check_against_reference(out, w, ref_out, ref_w, valid, dtype)
    out_c = F.scaled_dot_product_attention(q, k, v, mask)
    np.testing.assert_allclose(out, out_c, atol=0 if dtype == np.float64 else 1e-6, rtol=1e-6)


def test_sdpa_int_and_list_inputs_become_float32(rng):
    q = rng.integers(-3, 4, size=(2, 5, 4))
    k = rng.integers(-3, 4, size=(2, 6, 4))
    v = rng.integers(-3, 4, size=(2, 6, 3))
    ref_out, ref_w, valid = torch_reference(q.astype(np.float32), k.astype(np.float32),
                                            v.astype(np.float32))
    out = F.scaled_dot_product_attention(q, k, v)
    check_against_reference(out, None, ref_out, ref_w, valid, np.float32)
    out_l = F.scaled_dot_product_attention(q.tolist(), k.tolist(), v.tolist())
    check_against_reference(out_l, None, ref_out, ref_w, valid, np.float32)


def test_sdpa_inputs_not_modified(rng):
    q, k, v = make_qkv(rng, (2,), 7, 9, 8, 5, np.float32)
    m = _bool_mask(rng, (7, 9))
    copies = [a.copy() for a in (q, k, v, m)]
    F.scaled_dot_product_attention(q, k, v, m, return_weights=True)
    for a, c in zip((q, k, v, m), copies):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_sdpa_identical_with_1_and_2_threads(rng, dtype):
    q, k, v = make_qkv(rng, (4, 3), 33, 65, 16, 16, dtype)
    km = _padding_mask(rng, (4, 1, 65))
    old = tc.get_num_threads()
    try:
        tc.set_num_threads(1)
        assert tc.get_num_threads() == 1
        o1, w1 = F.scaled_dot_product_attention(q, k, v, key_mask=km, return_weights=True)
        f1 = F.scaled_dot_product_attention(q, k, v, key_mask=km, is_causal=True)
        tc.set_num_threads(2)
        assert tc.get_num_threads() == 2
        o2, w2 = F.scaled_dot_product_attention(q, k, v, key_mask=km, return_weights=True)
        f2 = F.scaled_dot_product_attention(q, k, v, key_mask=km, is_causal=True)
    finally:
        tc.set_num_threads(old)
    assert tc.get_num_threads() == old
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(w1, w2)
    np.testing.assert_array_equal(f1, f2)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_sdpa_large_scores_stable(rng, dtype):
    """Scores of magnitude ~1e2-1e3 must not overflow (max-subtraction in the softmax)."""
    q, k, v = make_qkv(rng, (2,), 7, 9, 8, 5, dtype)
    q = (q * 10).astype(dtype)
    k = (k * 10).astype(dtype)
    ref_out, ref_w, valid = torch_reference(q, k, v)
    out, w = sdpa_w(q, k, v)
    assert np.all(np.isfinite(out))
    # weights are nearly one-hot; compare with a slightly looser absolute tolerance for fp32
    tol = 1e-4 if dtype == np.float32 else 1e-9
    assert_close(out, ref_out, dtype, atol_=tol)
    assert_close(w, ref_w, dtype, atol_=tol)


@pytest.mark.filterwarnings("ignore:Lower right causal bias")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("L, S", [(3, 7), (5, 5), (1, 9), (7, 3)])
def test_sdpa_causal_alignment_takes_torchs_names(rng, L, S, dtype):
    """``causal_alignment`` takes torch's names of the two alignments (``CausalVariant``):
    ``"upper_left"`` / ``"lower_right"`` give torch's SDPA with ``causal_upper_left`` /
    ``causal_lower_right`` (and its gradients, in the backward), the same bits as ``"top_left"`` /
    ``"bottom_right"``. They were a ValueError."""
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    q, k, v = make_qkv(rng, (2, 3), L, S, 8, 5, dtype)
    g = randn(rng, (2, 3, L, 5), dtype)
    for name, bias, ours in (("upper_left", causal_upper_left, "top_left"),
                             ("lower_right", causal_lower_right, "bottom_right")):
        out, lse = F.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment=name, return_lse=True)
        np.testing.assert_array_equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                          causal_alignment=ours))
        grads = tc.backward.scaled_dot_product_attention_backward(q, k, v, out, g, lse, is_causal=True,
                                                                  causal_alignment=name)
        mask = bias(L, S)._materialize()
        valid = mask.any(-1).numpy()  # rows that see a key (torch gives NaN in the others; ours zeros)
        qt, kt, vt = (to_torch(a).requires_grad_() for a in (q, k, v))
        ref = TF.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
        (ref[..., valid, :] * to_torch(g)[..., valid, :]).sum().backward()
        assert_close(out[..., valid, :], ref.detach().numpy()[..., valid, :], dtype, what=f"{name} output")
        assert np.all(out[..., ~valid, :] == 0)
        for ours_grad, t, what in zip(grads, (qt, kt, vt), ("query", "key", "value")):
            assert_close(ours_grad[..., valid, :] if what == "query" else ours_grad,
                         t.grad.numpy()[..., valid, :] if what == "query" else t.grad.numpy(), dtype,
                         what=f"{name} grad_{what}")


# ------------------------------------------------------------------------------ log-sum-exp
def torch_lse(q, k, *, bool_mask=None, float_mask=None, is_causal=False, alignment="top_left",
              scale=None):
    """torch.logsumexp over the keys of the masked scaled scores, in float64: (..., L)."""
    qt, kt = to_torch(q).double(), to_torch(k).double()
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    scores = (qt @ kt.transpose(-2, -1)) * (1.0 / math.sqrt(E) if scale is None else scale)
    if float_mask is not None:
        scores = scores + to_torch(float_mask).double()
    allowed = torch.ones(L, S, dtype=torch.bool)
    if is_causal:
        allowed = allowed.tril(0 if alignment == "top_left" else S - L)
    if bool_mask is not None:
        allowed = allowed & to_torch(bool_mask)
    return torch.logsumexp(scores.masked_fill(~allowed, float("-inf")), dim=-1).numpy()


LSE_CASES = [  # (lead, L, S, E, Ev, mask kind)
    ((2,), 7, 9, 8, 5, "none"),
    ((3,), 1, 17, 16, 3, "bool"),
    ((2, 3), 9, 7, 8, 6, "causal_top_left"),
    ((2, 3), 7, 9, 8, 6, "causal_bottom_right"),
    ((2, 3), 7, 9, 8, 6, "float"),
    ((1, 2), 300, 130, 16, 16, "bool"),
    ((1, 2), 1, 1500, 64, 64, "causal_bottom_right"),
]


@pytest.mark.parametrize("path", ["auto", "flash", "reference"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,L,S,E,Ev,kind", LSE_CASES,
                         ids=["x".join(map(str, c[0])) + f"-L{c[1]}S{c[2]}-{c[5]}" for c in LSE_CASES])
def test_sdpa_return_lse(rng, lead, L, S, E, Ev, kind, dtype, path):
    """lse = log Σ_s exp(scale · q·k_s + mask) over the visible keys, against torch.logsumexp;
    -inf for a row that sees no key. With return_weights too: (output, weights, lse)."""
    q, k, v = make_qkv(rng, lead, L, S, E, Ev, dtype)
    kw, ref_kw = {}, {}
    if kind == "bool":
        mask = _bool_mask(rng, (L, S))
        mask[L // 2] = False  # a row that sees no key
        kw["attn_mask"] = ref_kw["bool_mask"] = mask
    elif kind == "float":
        fmask = randn(rng, (L, S), dtype, scale=2.0)
        fmask[1] = -np.inf
        kw["attn_mask"] = ref_kw["float_mask"] = fmask
    elif kind.startswith("causal"):
        alignment = kind[len("causal_"):]
        kw.update(is_causal=True, causal_alignment=alignment)
        ref_kw.update(is_causal=True, alignment=alignment)
    out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True, path=path, **kw)
    ref = torch_lse(q, k, **ref_kw)
    assert lse.dtype == np.dtype(dtype) and lse.shape == lead + (L,)
    finite = np.isfinite(ref)
    assert np.array_equal(np.isfinite(lse), finite) and np.all(lse[~finite] == -np.inf)
    assert_close(lse[finite], ref[finite], dtype, what="lse vs torch.logsumexp")
    assert np.array_equal(out, F.scaled_dot_product_attention(q, k, v, path=path, **kw))
    # the weights follow from the lse: weights = exp(x - lse)
    out_w, w, lse_w = F.scaled_dot_product_attention(q, k, v, return_weights=True, return_lse=True,
                                                     path=path, **kw)
    assert w.shape == lead + (L, S) and lse_w.shape == lead + (L,)
    assert_close(lse_w[finite], ref[finite], dtype, what="lse (with weights) vs torch.logsumexp")
    assert np.all(lse_w[~finite] == -np.inf)
    assert_close(out_w, out, dtype, what="output with weights and lse")


# ------------------------------------------------------------------------------- NaN parity
NAN_SHAPES = [((2, 3), 5, 9, 8, "serial"), ((2, 3), 200, 300, 16, "tiles"), ((2, 3), 1, 4100, 64, "split")]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("path", ["flash", "reference"])
@pytest.mark.parametrize("lead,L,S,E,what", NAN_SHAPES, ids=[c[-1] for c in NAN_SHAPES])
def test_sdpa_scale_zero_keeps_nan(rng, lead, L, S, E, what, path, dtype):
    """scale = 0 with a NaN in the query or an inf in the key: torch's math path multiplies (q · 0 is
    NaN, inf · 0 is NaN) and gives NaN rows; BLAS with alpha = 0 would skip the product and give
    finite rows. Both our paths must give torch's NaN rows, and its values elsewhere (the mean of v)."""
    q, k, v = make_qkv(rng, lead, L, S, E, E, dtype)
    q[0, 1, L - 1, 2] = np.nan  # one query row
    k[1, 2, S // 2, 0] = np.inf  # every row of head (1, 2)
    ref, _ = torch.ops.aten._scaled_dot_product_attention_math(to_torch(q), to_torch(k), to_torch(v),
                                                                scale=0.0)
    ref = ref.numpy()
    out, lse = F.scaled_dot_product_attention(q, k, v, scale=0.0, path=path, return_lse=True)
    nan_rows = np.isnan(ref).all(-1)
    assert nan_rows[0, 1, L - 1] and nan_rows[1, 2].all() and nan_rows.sum() == 1 + L
    assert np.array_equal(np.isnan(out).all(-1), nan_rows) and not np.isnan(out[~nan_rows]).any()
    assert np.array_equal(np.isnan(lse), nan_rows)
    assert_close(out[~nan_rows], ref[~nan_rows], dtype, what="scale = 0, finite rows")
    assert_close(lse[~nan_rows], np.full((~nan_rows).sum(), np.log(S)), dtype, what="lse = log S")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("path", ["flash", "reference", "varlen"])
def test_sdpa_scale_near_the_dtypes_largest(rng, path, dtype):
    """A scale above max / log2(e) (0.8 of the dtype's largest value) with queries and keys so small
    that the scaled scores are of order 1: the flash tile folded the scale into the exponent's factor
    scale · log2(e), which overflowed to inf and gave NaN rows. It must give torch's math path's
    values, as the reference path always did."""
    L, S, E = 5, 7, 4
    big = float(np.finfo(dtype).max) * 0.8
    tiny = 1e-20 if dtype == np.float32 else 1e-155
    q = (rng.standard_normal((2, L, E)) * tiny).astype(dtype)
    k = (rng.standard_normal((2, S, E)) * tiny).astype(dtype)
    v = rng.standard_normal((2, S, E)).astype(dtype)
    ref, _ = torch.ops.aten._scaled_dot_product_attention_math(to_torch(q), to_torch(k), to_torch(v), scale=big)
    ref = ref.numpy()
    if path == "varlen":  # the two batch rows as two sequences of one packed batch (L = S)
        qv, kv, vv = (a[:, :L].reshape(2 * L, 1, E) for a in (q, k, v))
        cu = np.array([0, L, 2 * L])
        out = F.varlen_attention(qv, kv, vv, cu, scale=big).reshape(2, L, E)
        ref = torch.ops.aten._scaled_dot_product_attention_math(
            *(to_torch(a[:, :L]) for a in (q, k, v)), scale=big)[0].numpy()
    else:
        out = F.scaled_dot_product_attention(q, k, v, scale=big, path=path)
    assert np.isfinite(out).all()
    assert_close(out, ref, dtype, what=f"scale {big:g}")


@pytest.mark.parametrize("fn", ["sdpa", "varlen", "backward"])
def test_sdpa_scale_beyond_the_dtypes_range_is_refused(rng, fn):
    """scale = 1e39 is finite as a Python float and infinite in float32: a ValueError naming scale
    (it became inf in the kernel and gave NaN rows), while float64 inputs take it."""

    def call(q, scale):
        if fn == "sdpa":
            return F.scaled_dot_product_attention(q, q, q, scale=scale)
        if fn == "varlen":
            x = q.reshape(3, 1, 4)
            return F.varlen_attention(x, x, x, np.array([0, 3]), scale=scale)
        out, lse = F.scaled_dot_product_attention(q, q, q, scale=1e-30, return_lse=True)
        return tc.backward.scaled_dot_product_attention_backward(q, q, q, out, q, lse, scale=scale)[0]

    q = rng.standard_normal((1, 3, 4)).astype(np.float32)
    with pytest.raises(ValueError, match=r"scale: expected a value finite in float32 .*, got 1e\+39"):
        call(q, 1e39)
    q64 = q.astype(np.float64) * 1e-20  # scaled scores of order 0.1: finite everywhere
    assert np.isfinite(call(q64, 1e39)).all()


def test_reference_path_weights_are_float32_accurate_at_long_s(rng):
    """The reference path (also the one that returns weights) sums each softmax row in double: at
    S = 4,097 its float32 output and weights are within 1e-5 of a float64 oracle (a float sum
    drifted by 2e-5)."""
    L, S, E = 3, 4097, 16
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 2, L, E), (1, 2, S, E), (1, 2, S, E)))
    mask = rng.standard_normal((L, S)).astype(np.float32)
    out, w = tc.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, path="reference", return_weights=True)
    q64, k64, v64 = (torch.from_numpy(a.astype(np.float64)) for a in (q, k, v))
    scores = q64 @ k64.transpose(-1, -2) / math.sqrt(E) + torch.from_numpy(mask.astype(np.float64))
    ref_w = torch.softmax(scores, dim=-1)
    np.testing.assert_allclose(w, ref_w.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(out, (ref_w @ v64).numpy(), rtol=0, atol=1e-5)


def test_reference_path_scores_are_checked_against_memory_first():
    """The reference path holds an (L, S) score matrix per thread: a size no machine holds is a
    ValueError naming it before anything is allocated (it was a bare MemoryError from inside the
    parallel region, or the OOM killer)."""
    q = np.zeros((1, 1, 1 << 20, 1), np.float32)
    with pytest.raises(ValueError, match=r"query, key: the reference path's \(L, S\) scores"):
        tc.functional.scaled_dot_product_attention(q, q, q, path="reference")


def test_thread_count_changed_by_another_thread_mid_call(rng):
    """set_num_threads from one Python thread while another runs attention (the GIL is released):
    each call sized its per-thread scratch by one reading of the count and handed out thread ids by
    a second; a count raised in between indexed past the scratch (heap corruption, a crash within
    seconds). Every path, forward and backward, now gives the same bits as with a fixed count."""
    import threading
    import time

    q = randn(rng, (1, 4, 300, 32), np.float32)
    k = randn(rng, (1, 4, 300, 32), np.float32)
    v = randn(rng, (1, 4, 300, 32), np.float32)

    def calls():  # flash forward, reference forward, backward (grad_q, grad_k, grad_v)
        o, lse = F.scaled_dot_product_attention(q, k, v, is_causal=True, path="flash", return_lse=True)
        reference = F.scaled_dot_product_attention(q, k, v, is_causal=True, path="reference")
        grads = tc.backward.scaled_dot_product_attention_backward(q, k, v, o, o, lse, is_causal=True)
        return [o, lse, reference, *grads]

    old = tc.get_num_threads()
    expected = calls()
    results, stop = [], threading.Event()

    def worker():
        while not stop.is_set():
            results.append(calls())

    t = threading.Thread(target=worker)
    try:
        t.start()
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            tc.set_num_threads(1)
            tc.set_num_threads(8)
    finally:
        stop.set()
        t.join()
        tc.set_num_threads(old)
    assert results
    for got in results:
        assert all(np.array_equal(a, b) for a, b in zip(got, expected))


# --------------------------------------------------------------------------------------------------
# A float64 mask of a float32 call; torch's call style (dropout_p); attn_mask with is_causal
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["flash", "reference"])
def test_float64_mask_beyond_float32_range_means_the_same_in_float32(rng, path):
    """A float64 mask of float32 q/k/v is narrowed to float32. Its finite values beyond float32's
    range became -inf there, so a row masked everywhere by -1e300 gave zeros in float32 but the
    average of the values in float64 and in torch. They are clamped to float32's range now: the
    float32 result is torch's float64 one (rounded), whatever the mask's dtype."""
    lead, L, S, E, Ev = (2, 3), 4, 6, 8, 5
    q, k, v = make_qkv(rng, lead, L, S, E, Ev, np.float64)
    mask = np.zeros((L, S))
    mask[0, :] = -1e300           # a whole row: every score the same, the values averaged
    mask[1, 2] = -1e39            # beyond float32's range: a weight of 0, as -inf
    mask[2, 3] = 1e39             # beyond float32's range the other way: all the weight on key 3
    mask[3, 1] = -np.inf          # an inf given stays one
    want = TF.scaled_dot_product_attention(to_torch(q), to_torch(k), to_torch(v), attn_mask=to_torch(mask)).numpy()
    np.testing.assert_allclose(want[..., 0, :], np.broadcast_to(v.mean(-2), want[..., 0, :].shape), atol=1e-12)
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    out = F.scaled_dot_product_attention(q32, k32, v32, mask, path=path)
    assert out.dtype == np.float32
    assert_close(out, want, np.float32)
    assert_close(F.scaled_dot_product_attention(q, k, v, mask, path=path), want, np.float64)
    _, weights = F.scaled_dot_product_attention(q32, k32, v32, mask, return_weights=True)
    np.testing.assert_allclose(weights[..., 0, :], 1.0 / S, rtol=1e-6)
    assert np.all(weights[..., 1, 2] == 0) and np.all(weights[..., 3, 1] == 0)
    np.testing.assert_allclose(weights[..., 2, 3], 1.0, rtol=1e-6)


def test_float64_mask_narrowing_clamps_only_overflowed_finite_values():
    """The helper's conversion: finite values beyond float32's range clamp to ±finfo(float32).max,
    ±inf and NaN stay, values within the range are rounded as numpy rounds them; a broadcast view
    stays one."""
    from transformer_core._validation import as_attention_mask

    big = np.finfo(np.float32).max
    m = np.array([-1e300, 1e300, -1e39, 3.5e38, -np.inf, np.inf, np.nan, -1e30, 0.5, -0.0])
    got = as_attention_mask(m, "attn_mask", np.float32)
    assert got.dtype == np.float32
    want = np.array([-big, big, -big, big, -np.inf, np.inf, np.nan, -1e30, 0.5, -0.0], np.float32)
    np.testing.assert_array_equal(got, want)
    view = np.broadcast_to(np.array([[-1e300, 0.0]]), (1000, 2))
    got = as_attention_mask(view, "attn_mask", np.float32)
    assert got.shape == (1000, 2) and got.strides[0] == 0 and got[0, 0] == -big
    same = np.array([-1e300, 0.0])
    assert as_attention_mask(same, "attn_mask", np.float64) is same  # no conversion, values as given


def test_sdpa_accepts_torch_call_style(rng):
    """torch's signature ``(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
    scale=None, enable_gqa=False)``, by keyword and by position: ``dropout_p`` was refused as an
    unknown keyword. Values as torch's."""
    q, k, v = make_qkv(rng, (2, 4), 5, 7, 8, 6, np.float64)
    kv = (k[:, :2], v[:, :2])  # 2 key/value heads for 4 query heads
    mask = rng.standard_normal((5, 7))
    qt, kt, vt, mt = (to_torch(a) for a in (q, *kv, mask))
    want = TF.scaled_dot_product_attention(qt, kt, vt, attn_mask=mt, dropout_p=0.0, is_causal=False, scale=0.3,
                                           enable_gqa=True).numpy()
    got = F.scaled_dot_product_attention(q, *kv, attn_mask=mask, dropout_p=0.0, is_causal=False, scale=0.3,
                                         enable_gqa=True)
    assert_close(got, want, np.float64)
    assert_close(F.scaled_dot_product_attention(q, *kv, mask, 0.0, False, 0.3, True), want, np.float64)
    want = TF.scaled_dot_product_attention(to_torch(q), to_torch(k), to_torch(v), None, 0.0, True).numpy()
    assert_close(F.scaled_dot_product_attention(q, k, v, None, 0.0, True), want, np.float64)


@pytest.mark.parametrize("dropout_p, exc, match", [
    (1.5, ValueError, r"dropout_p: expected a finite number in \[0\.0, 1\.0\], got 1\.5"),
    (-0.5, ValueError, r"dropout_p: expected a finite number in \[0\.0, 1\.0\]"),
    (float("nan"), ValueError, r"dropout_p: expected a finite number"),
    ("0", TypeError, r"dropout_p: expected a number"),
    (None, TypeError, r"dropout_p: expected a number"),
    (True, TypeError, r"dropout_p: expected a number"),  # is_causal given in dropout_p's place
])
def test_sdpa_dropout_p_outside_zero_one_is_refused(rng, dropout_p, exc, match):
    """dropout_p is torch's probability in [0, 1] (tests/test_attention_dropout.py: its values)."""
    q, k, v = make_qkv(rng, (2,), 3, 4, 8, 8, np.float32)
    with pytest.raises(exc, match=match):
        F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)


@pytest.mark.parametrize("path", ["flash", "reference"])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_attn_mask_and_is_causal_combine_by_logical_and(rng, path, kind):
    """``attn_mask`` with ``is_causal``: a key is visible where both allow it (a float mask added on
    the keys causality leaves), as documented; the same as torch given the combined mask."""
    q, k, v = make_qkv(rng, (2, 3), 6, 6, 8, 4, np.float64)
    causal = np.tril(np.ones((6, 6), bool))
    if kind == "bool":
        mask = rng.random((6, 6)) > 0.3
        mask[:, 0] = True  # every row sees key 0 (causality lets it)
        combined = to_torch(mask & causal)
    else:
        mask = rng.standard_normal((6, 6))
        mask[2, 1] = -np.inf
        combined = to_torch(np.where(causal, mask, -np.inf))
    want = TF.scaled_dot_product_attention(to_torch(q), to_torch(k), to_torch(v), attn_mask=combined).numpy()
    got = F.scaled_dot_product_attention(q, k, v, mask, is_causal=True, path=path)
    assert_close(got, want, np.float64)
    alone = F.scaled_dot_product_attention(q, k, v, mask, path=path)
    assert np.abs(alone - want).max() > 1e-3  # the causal part matters: the test can tell


def test_key_leading_dims_are_not_broadcast(rng):
    """A ``(1, H, S, E)`` key/value with a ``(N, H, L, E)`` query is refused (torch's CPU path
    broadcasts it), as documented; ``np.broadcast_to`` gives torch's result."""
    q = randn(rng, (3, 2, 4, 8), np.float64)
    k, v = randn(rng, (1, 2, 5, 8), np.float64), randn(rng, (1, 2, 5, 8), np.float64)
    with pytest.raises(ValueError, match=r"key, value: expected leading dims \(3, 2\)"):
        F.scaled_dot_product_attention(q, k, v)
    want = TF.scaled_dot_product_attention(to_torch(q), to_torch(k), to_torch(v)).numpy()
    got = F.scaled_dot_product_attention(q, np.broadcast_to(k, (3, 2, 5, 8)), np.broadcast_to(v, (3, 2, 5, 8)))
    assert_close(got, want, np.float64)
