"""Grouped-query / multi-query attention (GQA / MQA) vs torch.

* ``tc.functional.scaled_dot_product_attention(..., enable_gqa=True)`` against
  ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)`` (bool / float masks,
  top-left and bottom-right causal alignment, fully masked rows).
* The tiled "flash" kernel against the unfused "reference" oracle over tile-edge sizes.
* ``tc.nn.MultiheadAttention(E, H, num_key_value_heads=Hkv)`` against a torch reference written here:
  projections with ``F.linear`` using our ``in_proj_weight`` rows ``[q (E); k (Hkv·D); v (Hkv·D)]``,
  then ``F.scaled_dot_product_attention(enable_gqa=True)``, then ``out_proj``.
"""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
import transformer_core as tc
from conftest import DTYPE_IDS, FLOAT_DTYPES, TORCH_DTYPE, assert_close, randn, states_equal, to_numpy, to_torch

try:  # torch >= 2.3
    from torch.nn.attention.bias import causal_lower_right
except ImportError:  # pragma: no cover
    causal_lower_right = None

F = tc.functional


def _causal(L, S, alignment):
    """Bool mask, True = may attend: key s visible to query l iff s <= l (+ S - L bottom-right)."""
    off = 0 if alignment == "top_left" else S - L
    return np.arange(S)[None, :] <= np.arange(L)[:, None] + off


def _torch_sdpa(q, k, v, mask=None, is_causal=False, alignment="top_left"):
    """torch's SDPA with enable_gqa; ``mask`` is a numpy bool (True = attend) or float mask."""
    tq, tk, tv = to_torch(q), to_torch(k), to_torch(v)
    am = None if mask is None else to_torch(mask)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if is_causal and alignment == "bottom_right" and am is None and causal_lower_right is not None:
            return to_numpy(TF.scaled_dot_product_attention(
                tq, tk, tv, attn_mask=causal_lower_right(q.shape[-2], k.shape[-2]), enable_gqa=True))
        if is_causal and alignment == "bottom_right":
            c = to_torch(_causal(q.shape[-2], k.shape[-2], "bottom_right"))
            if am is None:
                am = c
            elif am.dtype == torch.bool:
                am = am & c
            else:
                am = am.masked_fill(~c, float("-inf"))
            is_causal = False
        if is_causal and am is not None:  # torch refuses attn_mask together with is_causal
            c = to_torch(_causal(q.shape[-2], k.shape[-2], "top_left"))
            am = am & c if am.dtype == torch.bool else am.masked_fill(~c, float("-inf"))
            is_causal = False
        return to_numpy(TF.scaled_dot_product_attention(tq, tk, tv, attn_mask=am, is_causal=is_causal,
                                                         enable_gqa=True))


def _visible(mask, L, S, lead, is_causal, alignment):
    """(lead..., L) bool: query rows that see at least one key (the others must be exactly 0)."""
    vis = np.ones(lead + (L, S), bool)
    if mask is not None and mask.dtype == np.bool_:
        vis = vis & mask
    elif mask is not None:
        vis = vis & np.isfinite(mask)
    if is_causal:
        vis = vis & _causal(L, S, alignment)
    return vis.any(-1)


HEADS = [(1, 1), (2, 1), (4, 2), (6, 3), (8, 1), (8, 2), (8, 4), (8, 8)]
LS = [(1, 1), (7, 7), (5, 13), (13, 5)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("L,S", LS, ids=[f"L{q}S{s}" for q, s in LS])
@pytest.mark.parametrize("H,Hkv", HEADS, ids=[f"H{h}kv{k}" for h, k in HEADS])
def test_sdpa_gqa_matches_torch(rng, H, Hkv, L, S, causal, dtype):
    N, E, Ev = 2, 8, 5
    q = randn(rng, (N, H, L, E), dtype)
    k = randn(rng, (N, Hkv, S, E), dtype)
    v = randn(rng, (N, Hkv, S, Ev), dtype)
    is_causal = causal != "none"
    align = "top_left" if causal == "none" else causal
    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=is_causal,
                                         causal_alignment=align)
    ref = _torch_sdpa(q, k, v, is_causal=is_causal, alignment=align)
    assert out.shape == (N, H, L, Ev) and out.dtype == np.dtype(dtype)
    vis = np.broadcast_to(_visible(None, L, S, (N, H), is_causal, align), (N, H, L))
    assert_close(out[vis], ref[vis], dtype, what=f"gqa {causal}")
    assert np.all(out[~vis] == 0), "fully masked rows must be exactly 0"
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", ["bool_LS", "bool_4d", "float_LS", "float_4d", "bool_fully_masked",
                                  "float_fully_masked", "bool+causal", "float+causal_br"])
@pytest.mark.parametrize("H,Hkv", [(4, 1), (6, 2), (8, 4)], ids=["mqa4", "gqa6_2", "gqa8_4"])
def test_sdpa_gqa_masks(rng, H, Hkv, kind, dtype):
    N, L, S, E = 3, 7, 11, 8
    q = randn(rng, (N, H, L, E), dtype)
    k = randn(rng, (N, Hkv, S, E), dtype)
    v = randn(rng, (N, Hkv, S, E), dtype)
    shape = (L, S) if ("LS" in kind or "causal" in kind) else (N, H, L, S)
    if kind.startswith("bool"):
        mask = rng.random(shape) < 0.5
        if "fully" in kind:
            mask[..., 2, :] = False  # a fully masked row
    else:
        mask = randn(rng, shape, dtype)
        if "fully" in kind:
            mask[..., 3, :] = -np.inf
    is_causal = "causal" in kind
    align = "bottom_right" if kind.endswith("_br") else "top_left"
    out = F.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True, is_causal=is_causal,
                                         causal_alignment=align)
    ref = _torch_sdpa(q, k, v, mask, is_causal=is_causal, alignment=align)
    vis = np.broadcast_to(_visible(mask, L, S, (N, H), is_causal, align), (N, H, L))
    assert out.shape == (N, H, L, E)
    assert_close(out[vis], ref[vis], dtype, what=f"gqa mask {kind}")
    assert np.all(out[~vis] == 0), "fully masked rows must be exactly 0"
    if "fully" in kind:
        assert (~vis).any()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_sdpa_gqa_weights(rng, dtype):
    N, H, Hkv, L, S, E = 2, 6, 2, 5, 9, 4
    q, k, v = (randn(rng, (N, h, n, E), dtype) for h, n in [(H, L), (Hkv, S), (Hkv, S)])
    out, w = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, return_weights=True)
    kr = np.repeat(k, H // Hkv, axis=1)
    vr = np.repeat(v, H // Hkv, axis=1)
    with torch.no_grad():
        ref_w = torch.softmax(to_torch(q) @ to_torch(kr).transpose(-1, -2) / np.sqrt(E), dim=-1)
        ref_o = ref_w @ to_torch(vr)
    assert w.shape == (N, H, L, S)
    assert_close(w, ref_w, dtype, what="gqa weights")
    assert_close(out, ref_o, dtype, what="gqa output with weights")
    # GQA equals ordinary attention with the kv heads repeated (repeat_interleave order).
    assert_close(F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                 F.scaled_dot_product_attention(q, kr, vr), dtype, what="gqa == repeated kv")


HEADS_3D = [(4, 2), (6, 3), (4, 1), (6, 2), (3, 3)]
MASKS_3D = ["none", "causal", "causal_br", "bool_LS", "bool_3d", "float_3d", "bool_3d+causal"]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", MASKS_3D)
@pytest.mark.parametrize("H,Hkv", HEADS_3D, ids=[f"H{h}kv{k}" for h, k in HEADS_3D])
def test_sdpa_gqa_3d_matches_torch(rng, H, Hkv, kind, dtype):
    """3-D inputs with enable_gqa: dim -3 is the head dim (torch's rule, ``(H, L, E)`` against
    ``(Hkv, S, E)``), not a batch dim of one head each (which failed in numpy's reshape)."""
    L, S, E, Ev = 5, 7, 8, 6
    q = randn(rng, (H, L, E), dtype)
    k = randn(rng, (Hkv, S, E), dtype)
    v = randn(rng, (Hkv, S, Ev), dtype)
    mask = None
    if kind.startswith("bool"):
        mask = rng.random((L, S) if kind == "bool_LS" else (H, L, S)) < 0.6
        mask[..., 1, :] = False  # a fully masked row
    elif kind.startswith("float"):
        mask = randn(rng, (H, L, S), dtype)
    is_causal = "causal" in kind
    align = "bottom_right" if kind.endswith("_br") else "top_left"
    out = F.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True, is_causal=is_causal,
                                         causal_alignment=align)
    ref = _torch_sdpa(q, k, v, mask, is_causal=is_causal, alignment=align)
    assert out.shape == (H, L, Ev) and out.dtype == np.dtype(dtype)
    vis = np.broadcast_to(_visible(mask, L, S, (H,), is_causal, align), (H, L))
    assert_close(out[vis], ref[vis], dtype, what=f"3-D gqa {kind}")
    assert np.all(out[~vis] == 0), "fully masked rows must be exactly 0"
    # the same as the 4-D call with a batch of one
    assert_close(out, F.scaled_dot_product_attention(q[None], k[None], v[None], None if mask is None else mask[None],
                                                     enable_gqa=True, is_causal=is_causal,
                                                     causal_alignment=align)[0], dtype, what="3-D == 4-D N=1")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("H,Hkv", [(4, 2), (6, 1)], ids=["gqa4_2", "mqa6"])
def test_sdpa_gqa_3d_weights_and_backward_match_torch(rng, H, Hkv, dtype):
    L, S, E = 4, 6, 8
    q, k, v = randn(rng, (H, L, E), dtype), randn(rng, (Hkv, S, E), dtype), randn(rng, (Hkv, S, E), dtype)
    out, w, lse = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True, return_weights=True,
                                                 return_lse=True)
    tq, tk, tv = (to_torch(a).requires_grad_() for a in (q, k, v))
    ref = TF.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)
    g = randn(rng, (H, L, E), dtype)
    ref.backward(to_torch(g))
    kr = np.repeat(k, H // Hkv, axis=0)  # torch's repeat_interleave of the kv heads
    with torch.no_grad():
        scores = to_torch(q) @ to_torch(kr).transpose(-1, -2) / np.sqrt(E)
        ref_w = torch.softmax(scores.masked_fill(~to_torch(_causal(L, S, "top_left")), float("-inf")), dim=-1)
    assert_close(out, ref, dtype, what="3-D gqa output")
    assert_close(w, ref_w, dtype, what="3-D gqa weights")
    dq, dk, dv = tc.backward.scaled_dot_product_attention_backward(q, k, v, out, g, lse, enable_gqa=True,
                                                                   is_causal=True)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert_close(dq, tq.grad, dtype, what="grad_query")
    assert_close(dk, tk.grad, dtype, what="grad_key")
    assert_close(dv, tv.grad, dtype, what="grad_value")


def test_sdpa_gqa_3d_bad_input(rng):
    q = randn(rng, (6, 5, 8))
    with pytest.raises(ValueError, match="key"):  # 6 query heads, 4 kv heads
        F.scaled_dot_product_attention(q, randn(rng, (4, 7, 8)), randn(rng, (4, 7, 8)), enable_gqa=True)
    with pytest.raises(ValueError, match="key, value"):  # value's heads differ from key's
        F.scaled_dot_product_attention(q, randn(rng, (2, 7, 8)), randn(rng, (3, 7, 8)), enable_gqa=True)
    with pytest.raises(ValueError, match="key, value"):  # without enable_gqa dim -3 must agree
        F.scaled_dot_product_attention(q, randn(rng, (2, 7, 8)), randn(rng, (2, 7, 8)))
    with pytest.raises(ValueError, match="attn_mask"):  # a mask of the kv heads' count
        F.scaled_dot_product_attention(q, randn(rng, (2, 7, 8)), randn(rng, (2, 7, 8)), np.ones((2, 5, 7), bool),
                                       enable_gqa=True)


SIZES = [1, 7, 63, 64, 65, 129]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("S", SIZES, ids=[f"S{s}" for s in SIZES])
@pytest.mark.parametrize("L", SIZES, ids=[f"L{q}" for q in SIZES])
def test_flash_equals_reference_tile_edges(rng, L, S, dtype):
    N, H, Hkv, E = 1, 4, 2, 16
    q = randn(rng, (N, H, L, E), dtype)
    k = randn(rng, (N, Hkv, S, E), dtype)
    v = randn(rng, (N, Hkv, S, E), dtype)
    km = rng.random((N, 1, 1, S)) < 0.8
    km[..., 0] = True
    for kw in [dict(), dict(is_causal=True, causal_alignment="bottom_right"),
               dict(attn_mask=km, is_causal=True)]:
        fl = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, path="flash", **kw)
        ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, path="reference", **kw)
        assert fl.dtype == ref.dtype == np.dtype(dtype)
        assert_close(fl, ref, dtype, what=f"flash vs reference L={L} S={S} {kw.keys()}")
    # and the plain case against torch
    assert_close(F.scaled_dot_product_attention(q, k, v, enable_gqa=True, path="flash"),
                 _torch_sdpa(q, k, v), dtype, what="flash vs torch")


ONE_ROW_HEADS = [(4, 1), (6, 2), (9, 3)]
ONE_ROW_S = [1, 5, 300, 1100]   # 1100: split into key chunks (flash_plan)
ONE_ROW_MASKS = ["none", "bool_4d", "float_4d", "key_padding", "top_left", "bottom_right",
                 "bool_4d+top_left", "head_fully_masked"]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", ONE_ROW_MASKS)
@pytest.mark.parametrize("S", ONE_ROW_S, ids=[f"S{s}" for s in ONE_ROW_S])
@pytest.mark.parametrize("H,Hkv", ONE_ROW_HEADS, ids=[f"H{h}kv{k}" for h, k in ONE_ROW_HEADS])
def test_sdpa_gqa_one_query_row(rng, H, Hkv, S, kind, dtype):
    """Decoding (one query row): the query heads of a key/value head are computed as the rows of
    one block (flash_attention.hpp, fold_grouped_heads), masks per head (different for each head
    of a group) included; against torch, the reference path and torch's log-sum-exp."""
    N, E = 2, 16
    q = randn(rng, (N, H, 1, E), dtype)
    k = randn(rng, (N, Hkv, S, E), dtype)
    v = randn(rng, (N, Hkv, S, E), dtype)
    mask = None
    if kind.startswith("bool_4d") or kind == "head_fully_masked":
        mask = rng.random((N, H, 1, S)) < 0.6
        mask[..., 0] = True
        if kind == "head_fully_masked":
            mask[1, H - 1] = False                      # one head of the last group sees nothing
    elif kind == "float_4d":
        mask = randn(rng, (N, H, 1, S), dtype)
    elif kind == "key_padding":
        mask = rng.random((N, 1, 1, S)) < 0.7
        mask[..., -1] = True
    is_causal = kind.endswith(("top_left", "bottom_right"))
    align = "bottom_right" if kind == "bottom_right" else "top_left"
    kw = dict(enable_gqa=True, is_causal=is_causal, causal_alignment=align)
    out, lse = F.scaled_dot_product_attention(q, k, v, mask, return_lse=True, **kw)
    ref = _torch_sdpa(q, k, v, mask, is_causal=is_causal, alignment=align)
    vis = np.broadcast_to(_visible(mask, 1, S, (N, H), is_causal, align), (N, H, 1))
    assert out.shape == (N, H, 1, E) and lse.shape == (N, H, 1)
    assert_close(out[vis], ref[vis], dtype, what=f"one row {kind}")
    assert np.all(out[~vis] == 0), "fully masked rows must be exactly 0"
    assert (~vis).any() == (kind == "head_fully_masked")
    # the log-sum-exp of the visible scores, from torch
    with torch.no_grad():
        scores = to_torch(q) @ to_torch(np.repeat(k, H // Hkv, axis=1)).transpose(-1, -2) / np.sqrt(E)
        allowed = torch.ones(N, H, 1, S, dtype=torch.bool)
        if mask is not None and mask.dtype == np.bool_:
            allowed = allowed & to_torch(mask)
        elif mask is not None:
            scores = scores + to_torch(mask)
        if is_causal:
            allowed = allowed & to_torch(_causal(1, S, align))
        ref_lse = torch.logsumexp(scores.masked_fill(~allowed, float("-inf")), dim=-1).numpy()
    assert_close(lse[vis], ref_lse[vis], dtype, what=f"one row lse {kind}")
    assert np.all(lse[~vis] == -np.inf)
    # the flash kernel (folded) against the unfused reference path
    assert_close(F.scaled_dot_product_attention(q, k, v, mask, path="flash", **kw),
                 F.scaled_dot_product_attention(q, k, v, mask, path="reference", **kw), dtype,
                 what=f"one row flash vs reference {kind}")


def test_sdpa_gqa_bad_input(rng):
    q = randn(rng, (2, 6, 5, 8))
    k = randn(rng, (2, 4, 5, 8))
    with pytest.raises(ValueError, match="key"):
        F.scaled_dot_product_attention(q, k, k, enable_gqa=True)  # 6 % 4 != 0
    k2 = randn(rng, (2, 2, 5, 8))
    with pytest.raises(ValueError, match="key"):
        F.scaled_dot_product_attention(q, k2, k2)  # head counts differ without enable_gqa
    with pytest.raises(ValueError, match="key"):
        F.scaled_dot_product_attention(q, randn(rng, (3, 2, 5, 8)), randn(rng, (3, 2, 5, 8)),
                                       enable_gqa=True)  # batch differs
    with pytest.raises(ValueError, match="causal_alignment"):
        F.scaled_dot_product_attention(q, k2, k2, enable_gqa=True, causal_alignment="middle")
    with pytest.raises(ValueError, match="path"):
        F.scaled_dot_product_attention(q, k2, k2, enable_gqa=True, path="fast")
    with pytest.raises(TypeError, match="attn_mask"):
        F.scaled_dot_product_attention(q, k2, k2, np.ones((5, 5), np.int64), enable_gqa=True)


# ----------------------------------------------------------------------- MultiheadAttention GQA
def _randomise(mha, rng, dtype):
    sd = {k: randn(rng, v.shape, dtype, scale=0.3) for k, v in mha.state_dict().items()}
    mha.load_state_dict(sd)
    return sd


def _torch_gqa_mha(sd, query, key, value, H, Hkv, attn_mask=None, key_mask=None, is_causal=False):
    """Reference GQA MHA from our state_dict. Returns (output, per-head weights)."""
    E = query.shape[-1]
    D = E // H
    W = to_torch(sd["in_proj_weight"])
    b = to_torch(sd["in_proj_bias"]) if "in_proj_bias" in sd else None
    ekv = Hkv * D
    Wq, Wk, Wv = W[:E], W[E:E + ekv], W[E + ekv:]
    bq = bk = bv = None
    if b is not None:
        bq, bk, bv = b[:E], b[E:E + ekv], b[E + ekv:]
    with torch.no_grad():
        q = TF.linear(to_torch(query), Wq, bq)
        k = TF.linear(to_torch(key), Wk, bk)
        v = TF.linear(to_torch(value), Wv, bv)
        N, L, S = q.shape[0], q.shape[1], k.shape[1]
        q = q.view(N, L, H, D).transpose(1, 2)
        k = k.view(N, S, Hkv, D).transpose(1, 2)
        v = v.view(N, S, Hkv, D).transpose(1, 2)
        allow = torch.ones(N, 1, L, S, dtype=torch.bool)
        if attn_mask is not None:
            allow = allow & to_torch(attn_mask)
        if key_mask is not None:
            allow = allow & to_torch(key_mask)[:, None, None, :]
        if is_causal:
            allow = allow & torch.ones(L, S, dtype=torch.bool).tril()
        o = TF.scaled_dot_product_attention(q, k, v, attn_mask=allow, enable_gqa=True)
        o = o.transpose(1, 2).reshape(N, L, E)
        out = TF.linear(o, to_torch(sd["out_proj.weight"]),
                        to_torch(sd["out_proj.bias"]) if "out_proj.bias" in sd else None)
        kr = k.repeat_interleave(H // Hkv, dim=1)
        scores = (q @ kr.transpose(-1, -2)) / np.sqrt(D)
        w = torch.softmax(scores.masked_fill(~allow, float("-inf")), dim=-1)
        w = torch.nan_to_num(w, nan=0.0)
    return to_numpy(out), to_numpy(w), to_numpy(allow.expand(N, H, L, S).any(-1))


MHA_CONFIGS = [(8, 1, 1), (8, 2, 1), (12, 4, 2), (16, 4, 1), (16, 8, 2), (24, 6, 3), (16, 8, 8)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("N,L,S", [(1, 1, 1), (3, 7, 7), (2, 5, 9), (4, 4, 4)],
                         ids=["N1L1S1", "N3L7S7", "N2L5S9", "N4L4S4"])
@pytest.mark.parametrize("E,H,Hkv", MHA_CONFIGS, ids=[f"E{e}H{h}kv{k}" for e, h, k in MHA_CONFIGS])
def test_mha_gqa_matches_torch(rng, E, H, Hkv, N, L, S, bias, dtype):
    mha = tc.nn.MultiheadAttention(E, H, bias=bias, num_key_value_heads=Hkv, dtype=dtype)
    D = E // H
    shapes = mha.state_dict()
    assert shapes["in_proj_weight"].shape == (E + 2 * Hkv * D, E)
    assert ("in_proj_bias" in shapes) == bias
    if bias:
        assert shapes["in_proj_bias"].shape == (E + 2 * Hkv * D,)
    sd = _randomise(mha, rng, dtype)
    x = randn(rng, (N, L, E), dtype)
    mem = randn(rng, (N, S, E), dtype)
    if L == S:  # self-attention
        out, w = mha(x, need_weights=True, average_attn_weights=False)
        ref, ref_w, _ = _torch_gqa_mha(sd, x, x, x, H, Hkv)
    else:  # cross-attention, L != S
        out, w = mha(x, mem, mem, need_weights=True, average_attn_weights=False)
        ref, ref_w, _ = _torch_gqa_mha(sd, x, mem, mem, H, Hkv)
    assert out.shape == (N, L, E) and w.shape == (N, H, L, S)
    assert_close(out, ref, dtype, what="gqa mha output")
    assert_close(w, ref_w, dtype, what="gqa mha weights")
    out2, w_avg = mha(x, mem, mem, need_weights=True) if L != S else mha(x, need_weights=True)
    assert w_avg.shape == (N, L, S)
    assert_close(w_avg, ref_w.mean(1), dtype, what="averaged weights")
    assert_close(out2, ref, dtype)
    out3, none = mha(x, mem, mem, need_weights=False) if L != S else mha(x, need_weights=False)
    assert none is None
    assert_close(out3, ref, dtype, what="no weights path")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", ["bool", "key_mask", "causal", "bool+key_mask", "fully_masked"])
@pytest.mark.parametrize("E,H,Hkv", [(16, 4, 1), (24, 6, 2)], ids=["mqa", "gqa"])
def test_mha_gqa_masks(rng, E, H, Hkv, kind, dtype):
    N, L = 3, 9
    mha = tc.nn.MultiheadAttention(E, H, num_key_value_heads=Hkv, dtype=dtype)
    sd = _randomise(mha, rng, dtype)
    x = randn(rng, (N, L, E), dtype)
    am = km = None
    if "bool" in kind or kind == "fully_masked":
        am = rng.random((L, L)) < 0.6
        am[:, 0] = True
        if kind == "fully_masked":
            am[4] = False
    if "key_mask" in kind:
        km = np.arange(L)[None, :] < np.array([[L], [3], [1]])
    causal = kind == "causal"
    # the layer's attn_mask is float (torch's name): the bool pattern (True = may attend) as 0 / -inf
    out, w = mha(x, attn_mask=None if am is None else tc.masks.to_additive(am, dtype), key_mask=km,
                 is_causal=causal, need_weights=True, average_attn_weights=False)
    ref, ref_w, vis = _torch_gqa_mha(sd, x, x, x, H, Hkv, am, km, causal)
    rows = vis.all(1)  # (N, L) rows that see something (same for every head here)
    assert_close(out[rows], ref[rows], dtype, what=f"mha gqa {kind}")
    assert_close(w, ref_w, dtype, what=f"mha gqa weights {kind}")
    assert np.all(np.isfinite(out))
    if kind == "fully_masked":
        assert not rows[:, 4].any()
        # zeros before the output projection: the row is out_proj.bias
        np.testing.assert_array_equal(out[:, 4], np.broadcast_to(sd["out_proj.bias"], (N, E)))
        assert np.all(w[:, :, 4] == 0)


@pytest.mark.parametrize("path", ["flash", "reference"])
def test_mha_gqa_paths_agree(rng, path):
    mha = tc.nn.MultiheadAttention(32, 8, num_key_value_heads=2)
    sd = _randomise(mha, rng, np.float32)
    x = randn(rng, (2, 65, 32))
    out, _ = mha(x, is_causal=True, path=path)
    ref, _, _ = _torch_gqa_mha(sd, x, x, x, 8, 2, is_causal=True)
    assert_close(out, ref, np.float32, what=f"mha gqa path={path}")


def test_mha_gqa_bad_input(rng):
    with pytest.raises(ValueError, match="num_key_value_heads"):
        tc.nn.MultiheadAttention(12, 4, num_key_value_heads=3)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        tc.nn.MultiheadAttention(12, 4, num_key_value_heads=0)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        tc.nn.MultiheadAttention(12, 4, num_key_value_heads=8)
    mha = tc.nn.MultiheadAttention(12, 4, num_key_value_heads=2)
    _randomise(mha, rng, np.float32)
    before = {k: np.array(v, copy=True) for k, v in mha.state_dict().items()}
    bad = {k: np.array(v) for k, v in before.items()}
    bad["in_proj_weight"] = np.zeros((36, 12), np.float32)  # the MHA (H_kv = H) shape
    with pytest.raises(ValueError, match="in_proj_weight"):
        mha.load_state_dict(bad)
    bad = {k: np.array(v) for k, v in before.items()}
    del bad["out_proj.bias"]
    with pytest.raises(ValueError, match="out_proj.bias"):
        mha.load_state_dict(bad)
    assert states_equal(mha.state_dict(), before)
    x = randn(rng, (2, 5, 12))
    with pytest.raises(ValueError, match="query"):
        mha(randn(rng, (2, 5, 8)))
    with pytest.raises(ValueError, match="key_mask"):
        mha(x, key_mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match="attn_mask"):
        mha(x, attn_mask=np.zeros((5, 4), np.float32))
    with pytest.raises(TypeError, match="attn_mask: expected a float mask"):
        mha(x, attn_mask=np.ones((5, 5), bool))
    with pytest.raises(TypeError, match="attn_mask"):
        mha(x, attn_mask=np.ones((5, 5), np.int32))


def test_mha_gqa_dtype_cast(rng):
    """fp64 module takes fp32 input (cast) and matches an fp64 torch reference."""
    mha = tc.nn.MultiheadAttention(16, 4, num_key_value_heads=2, dtype=np.float64)
    sd = _randomise(mha, rng, np.float64)
    x = randn(rng, (2, 6, 16), np.float32)
    out, _ = mha(x)
    assert out.dtype == np.float64
    ref, _, _ = _torch_gqa_mha(sd, x.astype(np.float64), x.astype(np.float64), x.astype(np.float64), 4, 2)
    assert_close(out, ref, np.float64)
    assert TORCH_DTYPE[np.dtype(np.float64)] == torch.float64


def test_num_kv_heads_is_a_deprecated_alias_of_num_key_value_heads(rng):
    """Hugging Face's ``num_key_value_heads`` is the project's name; MultiheadAttention and KVCache
    took ``num_kv_heads``. The old keyword (and attribute) still works for one release, with a
    DeprecationWarning naming the new one, and builds the same layer / cache."""
    new = "num_key_value_heads= .Hugging Face's name.; num_kv_heads= will be removed in the next release"
    with pytest.warns(DeprecationWarning, match=r"^num_kv_heads= is deprecated, use " + new):
        old = tc.nn.MultiheadAttention(12, 4, num_kv_heads=2)
    mha = tc.nn.MultiheadAttention(12, 4, num_key_value_heads=2)
    assert old.num_key_value_heads == mha.num_key_value_heads == 2
    assert old.parameter_shapes() == mha.parameter_shapes() == {
        "in_proj_weight": (12 + 2 * 2 * 3, 12), "in_proj_bias": (24,), "out_proj.weight": (12, 12),
        "out_proj.bias": (12,)}
    sd = _randomise(mha, rng, np.float32)
    old.load_state_dict(sd)
    x = randn(rng, (2, 5, 12))
    np.testing.assert_array_equal(old(x)[0], mha(x)[0])
    with pytest.warns(DeprecationWarning, match="MultiheadAttention.num_kv_heads is deprecated, use "
                                                "num_key_value_heads"):
        assert old.num_kv_heads == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the copies are built with the new name: no second warning
        assert copy.deepcopy(old).num_key_value_heads == 2
        assert tc.nn.MultiheadAttention(12, 4).num_key_value_heads == 4  # None = num_heads
    with pytest.raises(TypeError, match="num_kv_heads: the former name of num_key_value_heads; got both"):
        tc.nn.MultiheadAttention(12, 4, num_kv_heads=2, num_key_value_heads=2)
    with pytest.warns(DeprecationWarning, match=r"^num_kv_heads= is deprecated, use num_key_value_heads="):
        with pytest.raises(ValueError, match="^num_key_value_heads: expected a divisor of num_heads"):
            tc.nn.MultiheadAttention(12, 4, num_kv_heads=3)  # errors name the new name

    with pytest.warns(DeprecationWarning, match=r"^num_kv_heads= is deprecated, use num_key_value_heads="):
        cache = tc.KVCache(2, 1, num_kv_heads=3, head_dim=4)
    assert cache.num_key_value_heads == 3
    assert tc.KVCache(2, 1, num_key_value_heads=3, head_dim=4).num_key_value_heads == 3
    assert repr(cache).startswith("KVCache(num_layers=2, batch=1, num_key_value_heads=3, head_dim=4,")
    with pytest.warns(DeprecationWarning, match="KVCache.num_kv_heads is deprecated, use num_key_value_heads"):
        assert cache.num_kv_heads == 3
    past = [(randn(rng, (1, 3, 2, 4)), randn(rng, (1, 3, 2, 4)))]
    with pytest.warns(DeprecationWarning, match=r"^num_kv_heads= is deprecated, use num_key_value_heads="):
        legacy = tc.KVCache.from_legacy(past, num_kv_heads=3, head_dim=4)
    np.testing.assert_array_equal(legacy[0][0], past[0][0])
    with pytest.raises(ValueError, match=r"^num_key_value_heads: expected an int in \[1, "):
        tc.KVCache(1, 1, 0, 4)
