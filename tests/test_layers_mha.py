"""tc.nn.MultiheadAttention vs torch.nn.MultiheadAttention(batch_first=True).

Conventions that differ from torch (and are translated in the tests):
  * key_mask (N, S): True = real key   -> torch key_padding_mask = ~key_mask
  * attn_mask: float only (added, as torch's); a bool one is refused, because torch reads it as
    True = blocked and the library's bool masks are True = may attend. A bool pattern in our
    convention reaches the layer as tc.masks.to_additive(m) and torch as ~m.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import (
    DTYPE_IDS,
    FLOAT_DTYPES,
    TORCH_DTYPE,
    assert_close,
    module_state_to_numpy,
    randn,
    states_equal,
    to_torch,
)

EH = [(8, 2), (9, 3), (16, 1), (12, 4)]
EH_IDS = [f"E{e}H{h}" for e, h in EH]


def make_torch_mha(E, H, dtype, bias=True):
    m = torch.nn.MultiheadAttention(E, H, bias=bias, batch_first=True)
    m = m.to(TORCH_DTYPE[np.dtype(dtype)]).eval()
    with torch.no_grad():  # torch initialises the biases to zero: randomise everything
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    return m


def make_pair(E, H, dtype, bias=True):
    ref = make_torch_mha(E, H, dtype, bias)
    ours = tc.nn.MultiheadAttention(E, H, bias=bias, dtype=dtype)
    ours.load_state_dict(module_state_to_numpy(ref))
    return ours, ref


def torch_mha(ref, q, k=None, v=None, *, key_mask=None, attn_mask=None, need_weights=False,
              average=True):
    qt = to_torch(q)
    kt = qt if k is None else to_torch(k)
    vt = kt if v is None else to_torch(v)
    kpm = None if key_mask is None else ~to_torch(np.asarray(key_mask, bool))
    am = None
    if attn_mask is not None:
        am = ~to_torch(attn_mask) if attn_mask.dtype == bool else to_torch(attn_mask)
    if kpm is not None and am is not None and am.is_floating_point():
        # same mask type for both (torch deprecates mixing): padding as -inf added to the scores
        kpm = torch.zeros(kpm.shape, dtype=am.dtype).masked_fill(kpm, float("-inf"))
    with torch.no_grad():
        out, w = ref(qt, kt, vt, key_padding_mask=kpm, attn_mask=am, need_weights=need_weights,
                     average_attn_weights=average)
    return out.numpy(), (None if w is None else w.numpy())


def _padding(rng, N, S, min_real=1):
    lengths = rng.integers(min_real, S + 1, size=N)
    return np.arange(S) < lengths[:, None]


# --------------------------------------------------------------------------------- self attention
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("N,L", [(1, 1), (2, 7), (7, 7), (3, 17), (1, 65)])
@pytest.mark.parametrize("E,H", EH, ids=EH_IDS)
def test_mha_self_attention(rng, E, H, N, L, bias, dtype):
    ours, ref = make_pair(E, H, dtype, bias)
    x = randn(rng, (N, L, E), dtype)
    out, w = ours(x, need_weights=False)
    assert w is None
    ref_out, _ = torch_mha(ref, x)
    assert_close(out, ref_out, dtype, what="mha self-attention")
    # explicit key=value=query gives the same
    out2, _ = ours(x, x, x, need_weights=False)
    np.testing.assert_allclose(out2, out, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("unbatched", [False, True], ids=["batched", "unbatched"])
def test_mha_default_returns_torchs_weights(rng, unbatched, dtype):
    """Ported code ``out, w = mha(q, k, v)``: torch's defaults are need_weights=True,
    average_attn_weights=True, so w is the head-averaged weights, here as in torch (they were None
    here: need_weights defaulted to False)."""
    ours, ref = make_pair(8, 2, dtype)
    shape = (5, 8) if unbatched else (2, 5, 8)
    q, kv = randn(rng, shape, dtype), randn(rng, shape[:-2] + (7, 8), dtype)
    out, w = ours(q, kv, kv)
    qt, kvt = to_torch(q), to_torch(kv)
    with torch.no_grad():
        ref_out, ref_w = ref(qt, kvt, kvt)  # torch's defaults
    assert w is not None and w.shape == tuple(ref_w.shape) == shape[:-2] + (5, 7)
    assert_close(out, ref_out.numpy(), dtype, what="default output")
    assert_close(w, ref_w.numpy(), dtype, what="default weights")


def test_mha_torch_key_padding_mask_is_refused_naming_key_mask(rng):
    """torch's key_padding_mask (True = padding) was a bare "unexpected keyword argument": now a
    TypeError naming the replacement, key_mask=~key_padding_mask, which gives torch's output."""
    ours, ref = make_pair(8, 2, np.float32)
    q, kv = randn(rng, (2, 3, 8)), randn(rng, (2, 5, 8))
    kpm = np.zeros((2, 5), bool)
    kpm[0, 3:] = True
    with pytest.raises(TypeError, match=re.escape("key_padding_mask: not supported (torch's True = padding, "
                                                  "ignored); pass key_mask=~key_padding_mask (True = a real token)")):
        ours(q, kv, kv, key_padding_mask=kpm)
    out, w = ours(q, kv, kv, key_mask=~kpm)
    with torch.no_grad():
        ref_out, ref_w = ref(to_torch(q), to_torch(kv), to_torch(kv), key_padding_mask=to_torch(kpm))
    assert_close(out, ref_out, np.float32, what="key_mask=~key_padding_mask")
    assert_close(w, ref_w, np.float32, what="its weights")
    np.testing.assert_array_equal(ours(q, kv, kv, key_padding_mask=None)[0], ours(q, kv, kv)[0])  # None: no mask


def test_mha_torch_constructor_arguments(rng):
    """torch's dropout / batch_first / add_bias_kv / add_zero_attn were bare "unexpected keyword"
    TypeErrors: taken at the values this layer implements (then the layer is torch's), refused by
    name otherwise; a float third positional argument (torch's dropout, this layer's bias) says so."""
    ref = make_torch_mha(8, 2, np.float32)
    ours = tc.nn.MultiheadAttention(8, 2, dropout=0.0, batch_first=True, add_bias_kv=False, add_zero_attn=False)
    ours.load_state_dict(module_state_to_numpy(ref))
    x = randn(rng, (2, 3, 8))
    ref_out, ref_w = torch_mha(ref, x, need_weights=True)
    out, w = ours(x)
    assert_close(out, ref_out, np.float32, what="torch's arguments at their defaults")
    assert_close(w, ref_w, np.float32, what="weights")
    # dropout applies in training forwards only (tests/test_attention_dropout.py): in eval, torch's
    ours_dropout = tc.nn.MultiheadAttention(8, 2, dropout=0.1)
    ours_dropout.load_state_dict(module_state_to_numpy(ref))
    assert ours_dropout.dropout == 0.1
    assert_close(ours_dropout(x)[0], ref_out, np.float32, what="dropout=0.1 in eval")
    for kw, match in [({"batch_first": False}, "batch_first: expected True, got False"),
                      ({"add_bias_kv": True}, "add_bias_kv: expected False, got True: not implemented"),
                      ({"add_zero_attn": True}, "add_zero_attn: expected False, got True: not implemented")]:
        with pytest.raises(ValueError, match=re.escape(match)):
            tc.nn.MultiheadAttention(8, 2, **kw)
    with pytest.raises(TypeError, match="batch_first: expected a bool"):
        tc.nn.MultiheadAttention(8, 2, batch_first=1)
    with pytest.raises(TypeError, match=re.escape("bias: expected a bool, got float 0.1 (torch's third positional "
                                                  "argument is dropout")):
        tc.nn.MultiheadAttention(8, 2, 0.1)


def test_mha_int_in_torchs_dropout_slot_says_so(rng):
    """torch's third positional argument is dropout (read from its signature), this layer's bias: an
    int there (``nn.MultiheadAttention(8, 2, 0)``, torch's dropout=0) was a bare "bias: expected a
    bool, got int 0"; it gets the float's hint. A bool is still bias, and the hint's call is torch's
    layer."""
    import inspect

    assert list(inspect.signature(torch.nn.MultiheadAttention).parameters).index("dropout") == 2
    for value, got in ((0, "int 0"), (1, "int 1"), (np.int64(0), "int64 0"), (np.float64(0.5), "float64 0.5")):
        expected = (f"bias: expected a bool, got {got} (torch's third positional argument is dropout, this layer's "
                    f"is bias: pass dropout= by keyword)")
        with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
            tc.nn.MultiheadAttention(8, 2, value)
    assert tc.nn.MultiheadAttention(8, 2, False).bias is False
    ref = torch.nn.MultiheadAttention(8, 2, 0, batch_first=True).eval()  # torch's positional int dropout
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    ours = tc.nn.MultiheadAttention(8, 2, dropout=0)  # the hint's call
    ours.load_state_dict(module_state_to_numpy(ref))
    x = randn(rng, (2, 3, 8))
    assert_close(ours(x)[0], torch_mha(ref, x)[0], np.float32, what="dropout=0 by keyword vs torch's (8, 2, 0)")


@pytest.mark.parametrize("E,H", [(64, 2), (40, 2), (48, 3)], ids=["D32", "D20", "D16"])
def test_mha_long_self_attention_every_isa(rng, E, H):
    """More than 128 tokens: the flash kernel's blocks share each key block, and P·V reads the
    values in place from the fused projection (row stride 3E, multiply_rows), their last panel
    masked where head_dim is not a multiple of the panel (32 on AVX-512, 16 on AVX2). Every ISA of
    the CPU gives the same bits, and they match torch."""
    from transformer_core import quantization
    ours, ref = make_pair(E, H, np.float32)
    x = randn(rng, (2, 200, E), np.float32)
    old = quantization.isa()
    outs = {}
    try:
        for isa in quantization.supported_isas():
            quantization.set_isa(isa)
            outs[isa] = ours(x)[0]
    finally:
        quantization.set_isa(old)
    expected = torch_mha(ref.double(), x.astype(np.float64))[0]  # the reference in fp64
    scale = max(1.0, float(np.abs(expected).max()))  # 1e-5 of the output's scale (|out| up to ~40 here)
    first = next(iter(outs.values()))
    for isa, out in outs.items():
        if isa != "amx":  # the linear layers on AMX tiles round otherwise (test_gemm)
            np.testing.assert_array_equal(out, first, err_msg=isa)
        assert_close(out, expected, np.float32, atol_=1e-5 * scale, what=f"mha self-attention, 200 tokens, {isa}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("N,L,S", [(2, 7, 9), (3, 1, 17), (7, 7, 7), (1, 9, 1), (2, 65, 17)])
@pytest.mark.parametrize("E,H", [(9, 3), (16, 4)], ids=["E9H3", "E16H4"])
def test_mha_cross_attention(rng, E, H, N, L, S, dtype):
    ours, ref = make_pair(E, H, dtype)
    q = randn(rng, (N, L, E), dtype)
    k = randn(rng, (N, S, E), dtype)
    v = randn(rng, (N, S, E), dtype)
    out, w = ours(q, k, v, need_weights=True)
    ref_out, ref_w = torch_mha(ref, q, k, v, need_weights=True)
    assert_close(out, ref_out, dtype, what="mha cross-attention")
    assert_close(w, ref_w, dtype, what="mha weights")
    assert w.shape == (N, L, S)


# --------------------------------------------------------------------------------------- weights
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("average", [True, False], ids=["avg", "per_head"])
@pytest.mark.parametrize("N,L,S", [(2, 7, 9), (7, 7, 7), (1, 1, 1)])
def test_mha_need_weights(rng, N, L, S, average, dtype):
    E, H = 12, 3
    ours, ref = make_pair(E, H, dtype)
    q = randn(rng, (N, L, E), dtype)
    kv = randn(rng, (N, S, E), dtype)
    km = _padding(rng, N, S)
    out, w = ours(q, kv, kv, key_mask=km, need_weights=True, average_attn_weights=average)
    ref_out, ref_w = torch_mha(ref, q, kv, kv, key_mask=km, need_weights=True, average=average)
    assert_close(out, ref_out, dtype)
    assert w.shape == ((N, L, S) if average else (N, H, L, S))
    assert_close(w, ref_w, dtype, what="mha weights")
    # weights of padded keys are exactly zero
    pad = ~km[:, None, :] if average else ~km[:, None, None, :]
    assert np.all(np.broadcast_to(pad, w.shape) <= (w == 0))



@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("N,L,S", [(2, 7, 9), (3, 512, 512), (1, 700, 1500)], ids=["one_round", "rounds", "long"])
def test_mha_averaged_weights_are_made_and_checked_at_their_own_size(rng, monkeypatch, N, L, S, dtype):
    """average_attn_weights (torch's default) made every head's weights (N, H, L, S) and returned
    their mean (N, L, S), H times the memory of what it returns, and checked the (N, H, L, S) size:
    averaged weights that fit were refused where every head's would not. The heads are now added into
    the (N, L, S) weights one by one, in rounds of heads (a round may end inside a batch item), and
    that size is checked: on a machine too small for every head's weights the averaged call runs and
    matches torch, with the bits of the per-head weights' mean; the per-head call is still refused."""
    from transformer_core import _validation

    E, H = 12, 3
    ours, ref = make_pair(E, H, dtype)
    q, kv = randn(rng, (N, L, E), dtype), randn(rng, (N, S, E), dtype)
    km = _padding(rng, N, S)
    per_head = N * H * L * S * np.dtype(dtype).itemsize
    monkeypatch.setattr(_validation, "physical_memory_bytes", lambda: per_head - 1)
    out, w = ours(q, kv, kv, key_mask=km)
    with pytest.raises(ValueError, match=rf"^need_weights: an array of shape \({N}, {H}, {L}, {S}\) needs {per_head} "
                                         rf"bytes, more than this machine's memory \({per_head - 1} bytes\)$"):
        ours(q, kv, kv, key_mask=km, average_attn_weights=False)
    monkeypatch.undo()
    ref_out, ref_w = torch_mha(ref, q, kv, kv, key_mask=km, need_weights=True)
    assert w.shape == (N, L, S)
    assert_close(out, ref_out, dtype, what="output with averaged weights")
    assert_close(w, ref_w, dtype, what="averaged weights")
    out_heads, w_heads = ours(q, kv, kv, key_mask=km, average_attn_weights=False)
    np.testing.assert_array_equal(w, w_heads.mean(axis=1))
    np.testing.assert_array_equal(out, out_heads)


# ----------------------------------------------------------------------------------------- masks
MASK_KINDS = ["key_mask", "additive_LS", "additive_NHLS", "float_LS", "float_NHLS", "additive_LS+key_mask",
              "float_LS+key_mask", "causal", "causal+key_mask"]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("N,L,S", [(2, 7, 9), (7, 7, 7), (3, 9, 5), (1, 1, 1)])
@pytest.mark.parametrize("kind", MASK_KINDS)
def test_mha_masks(rng, kind, N, L, S, dtype):
    E, H = 9, 3
    ours, ref = make_pair(E, H, dtype)
    q = randn(rng, (N, L, E), dtype)
    kv = randn(rng, (N, S, E), dtype)
    km = _padding(rng, N, S) if "key_mask" in kind else None
    if km is not None and kind.startswith("causal"):
        km[:, 0] = True  # row 0 of a causal mask sees only key 0
    ours_kw, ref_am = {}, None
    if kind.startswith("additive"):  # a bool pattern (True = may attend) as 0 / -inf; torch gets its bool
        shape = (L, S) if "_LS" in kind else (N * H, L, S)
        am = rng.random(shape) < 0.7
        am[..., 0] = True  # keep every row attendable (fully-masked rows tested separately)
        ours_kw["attn_mask"], ref_am = tc.masks.to_additive(am, dtype), am
    elif kind.startswith("float"):
        shape = (L, S) if "_LS" in kind else (N * H, L, S)
        am = randn(rng, shape, dtype)
        ours_kw["attn_mask"], ref_am = am, am
    elif kind.startswith("causal"):
        ours_kw["is_causal"] = True
        ref_am = np.tril(np.ones((L, S), bool))
    if km is not None:
        ours_kw["key_mask"] = km
    out, w = ours(q, kv, kv, need_weights=True, average_attn_weights=False, **ours_kw)
    ref_out, ref_w = torch_mha(ref, q, kv, kv, key_mask=km, attn_mask=ref_am, need_weights=True,
                               average=False)
    assert_close(out, ref_out, dtype, what=f"mha {kind}")
    assert_close(w, ref_w, dtype, what=f"mha weights {kind}")


@pytest.mark.parametrize("shape", [(7, 9), (6, 7, 9), (2, 3, 7, 9)])
def test_mha_bool_attn_mask_refused(rng, shape):
    """torch's nn.MultiheadAttention reads a bool attn_mask as True = blocked, the library's bool
    masks are True = may attend: under torch's name a bool mask is refused, never read either way."""
    ours, ref = make_pair(9, 3, np.float32)
    q, kv = randn(rng, (2, 7, 9)), randn(rng, (2, 9, 9))
    am = rng.random(shape) < 0.6
    am[..., 0] = True
    with pytest.raises(TypeError, match=r"attn_mask: expected a float mask .*got a bool mask.*to_additive"):
        ours(q, kv, kv, attn_mask=am)
    with pytest.raises(TypeError, match="attn_mask"):
        ours(q, kv, kv, attn_mask=torch.from_numpy(am))
    with pytest.raises(TypeError, match="attn_mask"):
        ours.train()(q, kv, kv, attn_mask=am)
    ours.eval()
    # the converted mask is accepted and means what the bool pattern means in our convention
    out, _ = ours(q, kv, kv, attn_mask=tc.masks.to_additive(am))
    ref_out, _ = torch_mha(ref, q, kv, kv, attn_mask=am.reshape(-1, 7, 9) if am.ndim == 4 else am)
    assert_close(out, ref_out, np.float32, what="attn_mask=to_additive(bool pattern)")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_mha_fully_masked_batch_element(rng, dtype):
    """A batch element with no real key: torch gives NaN there; ours gives finite values and the
    other batch elements match torch.  Zero attention output -> out_proj(0) = out_proj.bias."""
    E, H, N, L, S = 8, 2, 3, 7, 9
    ours, ref = make_pair(E, H, dtype)
    q = randn(rng, (N, L, E), dtype)
    kv = randn(rng, (N, S, E), dtype)
    km = _padding(rng, N, S)
    km[1] = False
    out, w = ours(q, kv, kv, key_mask=km, need_weights=True)
    ref_out, ref_w = torch_mha(ref, q, kv, kv, key_mask=km, need_weights=True)
    keep = [0, 2]
    assert_close(out[keep], ref_out[keep], dtype)
    assert_close(w[keep], ref_w[keep], dtype)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(w))
    assert np.array_equal(w[1], np.zeros((L, S), dtype))
    bias = ours.state_dict()["out_proj.bias"]
    assert_close(out[1], np.broadcast_to(bias, (L, E)), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_mha_noncontiguous_inputs(rng, dtype):
    ours, ref = make_pair(9, 3, dtype)
    x = randn(rng, (2, 7, 9), dtype)
    ref_out, _ = torch_mha(ref, x)
    for xl in (np.asfortranarray(x), np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)):
        out, _ = ours(xl)
        assert_close(out, ref_out, dtype)


def test_mha_float64_stays_float64(rng):
    ours, ref = make_pair(8, 2, np.float64)
    out, w = ours(randn(rng, (2, 3, 8), np.float64), need_weights=True)
    assert out.dtype == np.float64 and w.dtype == np.float64
    assert all(v.dtype == np.float64 for v in ours.state_dict().values())


# ------------------------------------------------------------------------------------ state dict
EXPECTED_KEYS = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_mha_state_dict_names_and_roundtrip(rng, bias):
    ours, ref = make_pair(9, 3, np.float32, bias)
    ref_sd = module_state_to_numpy(ref)
    sd = ours.state_dict()
    assert set(sd) == set(ref_sd)
    if bias:
        assert set(sd) == EXPECTED_KEYS
    for k in ref_sd:
        np.testing.assert_array_equal(np.asarray(sd[k]), ref_sd[k])
        assert np.asarray(sd[k]).dtype == np.float32
    # round-trip into a fresh module gives the same outputs
    fresh = tc.nn.MultiheadAttention(9, 3, bias=bias)
    fresh.load_state_dict({k: np.array(v) for k, v in sd.items()})
    assert states_equal(fresh.state_dict(), sd)
    x = randn(rng, (2, 7, 9))
    np.testing.assert_array_equal(fresh(x)[0], ours(x)[0])


def _snapshot(mod):
    return {k: np.array(v, copy=True) for k, v in mod.state_dict().items()}


@pytest.mark.parametrize("case", ["missing", "unknown", "misshaped", "missing+unknown"])
def test_mha_load_state_dict_errors(rng, case):
    ours, ref = make_pair(9, 3, np.float32)
    before = _snapshot(ours)
    other = module_state_to_numpy(make_torch_mha(9, 3, np.float32))
    bad = dict(other)
    names = []
    if "missing" in case:
        del bad["out_proj.bias"]
        names.append("out_proj.bias")
    if "unknown" in case:
        bad["out_proj.gamma"] = np.zeros(9, np.float32)
        names.append("out_proj.gamma")
    if case == "misshaped":
        bad["in_proj_weight"] = np.zeros((27, 8), np.float32)
        names.append("in_proj_weight")
    with pytest.raises(ValueError) as ei:
        ours.load_state_dict(bad)
    for n in names:
        assert n in str(ei.value), (n, str(ei.value))
    assert states_equal(ours.state_dict(), before), "module changed by a failed load_state_dict"
    x = randn(rng, (2, 5, 9))
    assert_close(ours(x)[0], torch_mha(ref, x)[0], np.float32)


def test_mha_separate_qkv_weights_of_the_wrong_shape_are_named():
    """A checkpoint in torch's separate q/k/v layout loads into the packed weight; a part of the
    wrong shape is named with the other mis-shaped weights' message (was numpy's concatenate error)."""
    ours = tc.nn.MultiheadAttention(6, 2, bias=False)
    before = {k: np.array(v, copy=True) for k, v in ours.state_dict().items()}
    rng = np.random.default_rng(0)
    good = {"q_proj_weight": rng.standard_normal((6, 6)), "k_proj_weight": rng.standard_normal((6, 6)),
            "v_proj_weight": rng.standard_normal((6, 6)), "out_proj.weight": rng.standard_normal((6, 6))}
    for name, shape in (("v_proj_weight", (6, 1)), ("k_proj_weight", (5, 6)), ("q_proj_weight", (6,))):
        bad = {**good, name: np.zeros(shape)}
        with pytest.raises(ValueError, match=rf"refused \(module unchanged\): mis-shaped: \['{name}: expected "
                                             rf"\(6, 6\), got {re.escape(str(shape))}'\]"):
            ours.load_state_dict(bad)
        assert states_equal(ours.state_dict(), before)
    ours.load_state_dict(good)
    w = ours.state_dict()["in_proj_weight"]
    np.testing.assert_array_equal(w, np.concatenate([good[f"{x}_proj_weight"] for x in "qkv"]).astype(np.float32))


# ------------------------------------------------------------------------- one cache, several layers
def test_layers_sharing_one_kv_cache_decode_as_without_it(rng):
    """Two MultiheadAttention layers on one KVCache of two layers (layer=0, then layer=1 at each
    step): the step's last layer advances the length, so both read the same past, and the decoded
    rows equal the uncached computation (each call advanced it: layer 1 read unwritten keys)."""
    E, H, T = 16, 4, 7
    m0, m1 = tc.nn.MultiheadAttention(E, H, dtype=np.float64), tc.nn.MultiheadAttention(E, H, dtype=np.float64)
    x = rng.standard_normal((2, T, E))
    full = m1(m0(x, is_causal=True)[0], is_causal=True)[0]
    cache = tc.KVCache(2, 2, H, E // H, dtype=np.float64)
    outs, t = [], 0
    for step in (3, 1, 2, 1):
        h = m0(x[:, t:t + step], is_causal=True, past_key_values=cache, layer=0)[0]
        assert cache.length == t  # not yet: layer 1 of the step is still to come
        outs.append(m1(h, is_causal=True, past_key_values=cache, layer=1)[0])
        t += step
        assert cache.length == t
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=0, atol=1e-12)
    # out of order, or another length within a step: refused, the cache unchanged
    with pytest.raises(ValueError, match="^layer: a cache of 2 layers is filled in layer order .*expected layer 0, got 1"):
        m1(x[:, :1], is_causal=True, past_key_values=cache, layer=1)
    m0(x[:, :1], is_causal=True, past_key_values=cache, layer=0)
    with pytest.raises(ValueError, match="^query: layer 1 of this step must append the 1 positions layer 0 appended"):
        m1(x[:, :2], is_causal=True, past_key_values=cache, layer=1)
    with pytest.raises(ValueError, match="expected layer 1, got 0"):
        m0(x[:, :1], is_causal=True, past_key_values=cache, layer=0)
    cache.crop(T)  # a step cut short starts over
    assert cache.length == T
    m0(x[:, :1], is_causal=True, past_key_values=cache, layer=0)


def test_a_refused_call_does_not_grow_the_cache(rng):
    m = tc.nn.MultiheadAttention(8, 2)
    cache = tc.KVCache(1, 1, 2, 4)
    capacity = cache.capacity
    with pytest.raises(ValueError, match="key_mask"):
        m(rng.standard_normal((1, 5000, 8)).astype(np.float32), past_key_values=cache, key_mask=np.ones((1, 3), bool))
    assert cache.capacity == capacity and cache.length == 0


def test_a_kv_cache_of_another_dtype_is_named_by_its_dtype(rng):
    """A float32 cache given to a float64 layer: the message said "got KVCache" (its class, which
    is right); it names the cache's dtype now. A cache of the layer's dtype decodes as without it."""
    m = tc.nn.MultiheadAttention(8, 2, dtype=np.float64)
    x = rng.standard_normal((1, 3, 8))
    with pytest.raises(TypeError, match=r"^past_key_values: expected a KVCache of float64, got a KVCache of float32$"):
        m(x, past_key_values=tc.KVCache(1, 1, 2, 4))
    with pytest.raises(TypeError, match=r"^past_key_values: expected a KVCache of float64, got tuple$"):
        m(x, past_key_values=())
    cache = tc.KVCache(1, 1, 2, 4, dtype=np.float64)
    steps = [m(x[:, t:t + 1], is_causal=True, past_key_values=cache)[0] for t in range(3)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), m(x, is_causal=True)[0], rtol=0, atol=1e-12)


def test_kv_cache_from_legacy_refuses_batch_0_naming_the_pair(rng):
    """Legacy (keys, values) arrays of batch 0 were refused as "batch: expected an int in [1, ...]",
    an argument the caller never gave: the pair and its shape are named now."""
    z = np.zeros((0, 2, 3, 4))
    with pytest.raises(ValueError, match=r"^past_key_values\[0\]: expected keys and values of batch N >= 1, "
                                         r"got shape \(0, 2, 3, 4\)$"):
        tc.KVCache.from_legacy(((z, z),), 2, 4)
    k, v = rng.standard_normal((2, 1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"^past_key_values\[1\]: expected keys and values of batch N >= 1"):
        tc.KVCache.from_legacy(((k, v), (z, z)), 2, 4, np.float64)
    cache = tc.KVCache.from_legacy(((k, v),), 2, 4, np.float64)
    assert (cache.batch, cache.length) == (1, 3)
    (k2, v2), = cache.to_legacy()
    np.testing.assert_array_equal(k2, k)
    np.testing.assert_array_equal(v2, v)


def test_kv_cache_from_legacy_names_what_it_takes():
    """from_legacy takes the legacy tuple/list only: it said "expected None, a KVCache or ..." (the
    models' forward's message), offering two things it refuses."""
    from transformers import DynamicCache

    hf = DynamicCache()
    hf.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), 0)
    for bad, name in ((None, "NoneType"), (tc.KVCache(1, 1, 2, 4), "KVCache"), (hf, "DynamicCache"),
                      (np.zeros((1, 2, 3, 4)), "ndarray")):
        with pytest.raises(TypeError, match=r"^past_key_values: expected Hugging Face's legacy tuple or list of "
                                            rf"\(keys, values\) pairs per layer, got {name}$"):
            tc.KVCache.from_legacy(bad, 2, 4)
    # what it takes: HF's own legacy pairs (torch tensors), as a tuple or a list
    k, v = torch.randn(1, 2, 3, 4, dtype=torch.float64), torch.randn(1, 2, 3, 4, dtype=torch.float64)
    for past in (((k, v),), [[k, v]]):
        (k2, v2), = tc.KVCache.from_legacy(past, 2, 4, np.float64).to_legacy()
        np.testing.assert_array_equal(k2, k.numpy())
        np.testing.assert_array_equal(v2, v.numpy())


@pytest.mark.parametrize("key_order, problem", [
    ([0, 1, 2, 2], r"\[2\] repeated; \[3\] missing"),
    ([3, 3, 0, 0], r"\[0, 3\] repeated; \[1, 2\] missing"),
    ([0, 1, 2, 4], r"\[4\] outside range\(4\); \[3\] missing"),
    ([-1, 1, 2, 3], r"\[-1\] outside range\(4\); \[0\] missing"),
    (np.array([0, 1, 2, 2], np.uint8), r"\[2\] repeated; \[3\] missing"),
    ([0, 1, 2], r"shape \(4,\), got an array of shape \(3,\)"),
    ([[0, 1], [2, 3]], r"shape \(4,\), got an array of shape \(2, 2\)"),
])
def test_kv_cache_key_order_names_its_bad_indices(key_order, problem):
    """A key_order of the right shape but not a permutation said "got an array of shape (4,)" (its
    right shape): the repeated, missing and out-of-range indices are named now; the shape only when
    it is the shape that is wrong. The same check serves from_legacy."""
    want = rf"^key_order: expected a permutation of range\(4\), {'' if 'shape' in problem else 'got '}{problem}$"
    with pytest.raises(ValueError, match=want):
        tc.KVCache(1, 1, 1, 4, key_order=key_order)
    with pytest.raises(ValueError, match=want):
        tc.KVCache.from_legacy(((np.zeros((1, 1, 2, 4)),) * 2,), 1, 4, key_order=key_order)


def test_kv_cache_key_order_lists_at_most_8_indices():
    p = np.zeros(20, np.int64)  # 0 twenty times: 1..19 missing
    with pytest.raises(ValueError, match=r"^key_order: expected a permutation of range\(20\), got \[0\] repeated; "
                                         r"\[1, 2, 3, 4, 5, 6, 7, 8, \.\.\.\] missing$"):
        tc.KVCache(1, 1, 1, 20, key_order=p)
    order = np.array([1, 0, 3, 2])  # a permutation: kept, read-only
    cache = tc.KVCache(1, 1, 1, 4, key_order=order)
    assert np.array_equal(cache.key_order, order) and not cache.key_order.flags.writeable


# ------------------------------------------------------------------------------- masks, by address
def test_a_record_array_field_as_mask_reads_its_own_values(rng):
    """A float mask whose strides are not whole elements (a field of a record array): read as the
    contiguous copy (it was read at the wrong addresses), for the layer and the functional op."""
    L, S, E = 4, 6, 8
    rec = np.zeros((L, S), dtype=[("bias", "<f4"), ("flag", "u1")])
    rec["bias"] = 3 * rng.standard_normal((L, S))
    mask = rec["bias"]
    assert mask.strides == (30, 5)
    m = tc.nn.MultiheadAttention(E, 2)
    x, mem = rng.standard_normal((1, L, E)).astype(np.float32), rng.standard_normal((1, S, E)).astype(np.float32)
    np.testing.assert_array_equal(m(x, mem, mem, attn_mask=mask)[0],
                                  m(x, mem, mem, attn_mask=np.ascontiguousarray(mask))[0])
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 1, L, E), (1, 1, S, E), (1, 1, S, E)))
    ref = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)),
                                                           attn_mask=torch.from_numpy(np.ascontiguousarray(mask)))
    np.testing.assert_allclose(tc.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask), ref.numpy(),
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize("which", ["attn_mask", "key_mask"])
def test_training_keeps_the_forwards_masks(rng, which):
    """A mask changed in place between forward and backward: the gradients are those of the
    forward that ran (the layer kept the caller's array and read it again in backward)."""
    N, L, E = 2, 5, 8
    x, g = rng.standard_normal((N, L, E)), rng.standard_normal((N, L, E))
    am = rng.standard_normal((L, L)) if which == "attn_mask" else None
    km = np.ones((N, L), bool) if which == "key_mask" else None
    ref = tc.nn.MultiheadAttention(E, 2, dtype=np.float64).train()
    m = tc.nn.MultiheadAttention(E, 2, dtype=np.float64).train()
    m.load_state_dict(ref.state_dict())
    ref(x, attn_mask=None if am is None else am.copy(), key_mask=None if km is None else km.copy())
    expected = ref.backward(g)
    m(x, attn_mask=am, key_mask=km)
    if am is not None:
        am[:] = -np.inf
        am[:, 0] = 0
    else:
        km[:, 1:] = False
    np.testing.assert_array_equal(m.backward(g), expected)
    layer = tc.nn.TransformerEncoderLayer(E, 2, dim_feedforward=16, dropout=0.0, dtype=np.float64).train()
    key = np.ones((N, L), bool)
    layer(x, src_key_mask=key)
    key[:, 2:] = False
    twin = tc.nn.TransformerEncoderLayer(E, 2, dim_feedforward=16, dropout=0.0, dtype=np.float64).train()
    twin.load_state_dict(layer.state_dict())
    twin(x, src_key_mask=np.ones((N, L), bool))
    np.testing.assert_array_equal(layer.backward(g), twin.backward(g))


def test_training_keeps_a_broadcast_mask_compact(rng):
    """torch's mask.expand(N * H, L, S) (a broadcast view) kept for backward: its compact values are
    copied, not the N·H-times larger broadcast (260 MiB for a 4 MiB mask at N = H = 8, L = S = 1024)."""
    N, H, L, E = 4, 2, 6, 8
    base = rng.standard_normal((1, L, L))
    mask = np.broadcast_to(base, (N * H, L, L))
    m = tc.nn.MultiheadAttention(E, H, dtype=np.float64).train()
    m(rng.standard_normal((N, L, E)), attn_mask=mask)
    kept = m._saved[3][1]  # (None, float_mask, key_mask)
    assert kept.shape == (N, H, L, L) and not np.shares_memory(kept, base)
    owner = kept
    while isinstance(owner.base, np.ndarray):  # the array that owns the kept values
        owner = owner.base
    assert owner.size == base.size


# ---------------------------------------------------------------- packed checkpoint, kdim/vdim != E
def _torch_mha_kv(E, H, kdim, vdim, dtype=np.float32):
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True, kdim=kdim, vdim=vdim)
    ref = ref.to(TORCH_DTYPE[np.dtype(dtype)]).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    return ref


@pytest.mark.parametrize("kdim,vdim", [(8, 6), (4, 8), (4, 6)])
def test_mha_packed_in_proj_weight_is_an_unknown_key_when_kdim_or_vdim_differ(rng, kdim, vdim):
    """With kdim or vdim != embed_dim the weights are torch's separate q/k/v_proj_weight (those load
    and match torch); an (E + 2·E_kv, E) in_proj_weight can never fill them. torch's module has no
    such weight then, so it is an unknown key, as in torch: strict=True refuses it (the message says
    why), strict=False returns it in unexpected_keys (it raised a ValueError either way) and loads
    the rest; a value of the wrong kind is the TypeError naming the key that every other weight gets
    (was IndexError for a 0-d or str value), the module unchanged."""
    ref = _torch_mha_kv(8, 2, kdim, vdim)
    ours = tc.nn.MultiheadAttention(8, 2, kdim=kdim, vdim=vdim)
    sd = module_state_to_numpy(ref)
    assert "in_proj_weight" not in sd
    ours.load_state_dict(sd)
    q, k, v = randn(rng, (2, 3, 8)), randn(rng, (2, 5, kdim)), randn(rng, (2, 5, vdim))
    assert_close(ours(q, k, v)[0], torch_mha(ref, q, k, v)[0], np.float32)
    before = _snapshot(ours)
    packed = tc.nn.MultiheadAttention(8, 2).state_dict()  # in_proj_weight (24, 8)
    for state in (packed, {**sd, "in_proj_weight": packed["in_proj_weight"]}):
        with pytest.raises(ValueError, match=r"^MultiheadAttention.load_state_dict refused \(module unchanged\): "
                                             r"(missing keys: .*; )?unknown keys: \['in_proj_weight'\] "
                                             r"\(in_proj_weight: a packed q/k/v projection "
                                             rf"does not fit this module \(kdim={kdim}, vdim={vdim}, embed_dim=8\); "
                                             rf"expected the separate weights q_proj_weight \(8, 8\), k_proj_weight "
                                             rf"\(8, {kdim}\) and v_proj_weight \(8, {vdim}\)"):
            ours.load_state_dict(state)
    assert states_equal(ours.state_dict(), before)
    # strict=False: torch's result, the other weights loaded
    new = {n: w * 0.5 for n, w in sd.items()}
    for state in ({**new, "in_proj_weight": packed["in_proj_weight"]},
                  {"in_proj_weight": packed["in_proj_weight"], "out_proj.bias": new["out_proj.bias"]}):
        theirs = ref.load_state_dict({n: torch.from_numpy(w) for n, w in state.items()}, strict=False)
        got = ours.load_state_dict(state, strict=False)
        assert (got.missing_keys, got.unexpected_keys) == (theirs.missing_keys, theirs.unexpected_keys)
        assert got.unexpected_keys == ["in_proj_weight"]
        assert states_equal(ours.state_dict(), {n: w.detach().numpy() for n, w in ref.state_dict().items()})
    ours.load_state_dict(sd)
    before = _snapshot(ours)
    base = {n: w for n, w in sd.items() if not n.endswith("_proj_weight")}
    for strict in (True, False):
        for value in ("abc", np.zeros((24, 8), np.int64), torch.zeros(24, 8, dtype=torch.bool), [["x"]]):
            with pytest.raises(TypeError, match=r"^state_dict\['in_proj_weight'\]: expected"):
                ours.load_state_dict({**base, "in_proj_weight": value}, strict=strict)
    for value in (np.float32(1), torch.zeros(24, 8, requires_grad=True), torch.zeros(24, 8, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match=r"refused \(module unchanged\): .*in_proj_weight"):
            ours.load_state_dict({**base, "in_proj_weight": value})
    assert states_equal(ours.state_dict(), before)


# ------------------------------------------------------------------------------ mask dtypes, shapes
def test_integer_attention_masks_are_refused_offering_float_only():
    """The nn layers' attention masks are float only (a bool one is refused: torch reads it the other
    way round), so an integer mask's TypeError offers a float mask, not "bool or float"."""
    x = np.ones((1, 3, 8), np.float32)
    enc, dec = tc.nn.TransformerEncoderLayer(8, 2, 16), tc.nn.TransformerDecoderLayer(8, 2, 16)
    im = np.zeros((3, 3), np.int64)
    calls = [
        ("attn_mask", lambda: tc.nn.MultiheadAttention(8, 2)(x, attn_mask=im)),
        ("attn_mask", lambda: tc.nn.MultiheadAttention(8, 2)(x, attn_mask=torch.zeros(3, 3, dtype=torch.int32))),
        ("src_mask", lambda: enc(x, src_mask=im)),
        ("mask", lambda: tc.nn.TransformerEncoder(enc, 2)(x, mask=im)),
        ("tgt_mask", lambda: dec(x, x, tgt_mask=im)),
        ("memory_mask", lambda: dec(x, x, memory_mask=im)),
        ("src_mask", lambda: tc.nn.Transformer(8, 2, 1, 1, 16)(x, x, src_mask=im)),
        ("memory_mask", lambda: tc.nn.Transformer(8, 2, 1, 1, 16)(x, x, memory_mask=im)),
    ]
    for name, call in calls:
        with pytest.raises(TypeError, match=rf"^{name}: expected a float mask \(added to the scores; -inf where "
                                            rf"attention is not allowed\), got dtype int(64|32)$"):
            call()


def test_attn_mask_shapes_are_those_documented(rng):
    """The docstrings say which attn_mask shapes are taken: (L, S), (N·H, L, S), or a 4-D mask
    broadcastable to (N, H, L, S). (They said "broadcastable to (N, H, L, S)", which (1, S) and
    (1, L, S) are, and those are refused.)"""
    for forward in (tc.nn.MultiheadAttention.forward, tc.nn.TransformerEncoderLayer.forward,
                    tc.nn.TransformerDecoderLayer.forward):
        doc = " ".join(forward.__doc__.split())
        assert "4-D broadcastable to" in doc and "or broadcastable to" not in doc, forward.__qualname__
    N, H, L, S, E = 2, 2, 3, 4, 8
    ours, ref = make_pair(E, H, np.float32)
    q, kv = randn(rng, (N, L, E)), randn(rng, (N, S, E))
    m = randn(rng, (L, S))
    expected = torch_mha(ref, q, kv, kv, attn_mask=m)[0]
    for shaped in (m[None, None], np.broadcast_to(m, (N, 1, L, S)), np.broadcast_to(m, (N * H, L, S))):
        assert_close(ours(q, kv, kv, attn_mask=shaped)[0], expected, np.float32)
    for shape in ((1, S), (1, L, S), (S,)):
        with pytest.raises(ValueError, match=r"^attn_mask: expected"):
            ours(q, kv, kv, attn_mask=np.zeros(shape, np.float32))


# ----------------------------------------------------------------------------- unbatched, as torch
def _assert_grad(ours, ref, dtype, what):
    """|ours - ref| <= atol(dtype) · max(1, max|ref|)."""
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    scale = max(1.0, float(np.abs(ref).max(initial=0.0)))
    assert_close(ours, ref, dtype, atol_=(1e-5 if np.dtype(dtype) == np.float32 else 1e-10) * scale, rtol_=0.0,
                 what=what)


def _unbatched_pair(case: str, dtype):
    """torch's and our MultiheadAttention with the same weights for the unbatched tests (E 8, 2
    heads, L 4; ``case`` "self", "cross" (S 6) or "kdim_vdim" (kdim 5, vdim 3)):
    ``(E, H, L, S, kdim, vdim, torch's, ours)``."""
    E, H, L = 8, 2, 4
    kdim, vdim = (5, 3) if case == "kdim_vdim" else (E, E)
    S = L if case == "self" else 6
    ref = _torch_mha_kv(E, H, kdim, vdim, dtype)
    ours = tc.nn.MultiheadAttention(E, H, kdim=kdim, vdim=vdim, dtype=dtype)
    ours.load_state_dict(module_state_to_numpy(ref))
    return E, H, L, S, kdim, vdim, ref, ours


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", ["self", "cross", "kdim_vdim"])
def test_mha_unbatched_matches_torch(rng, case, dtype):
    """query (L, E), key (S, kdim), value (S, vdim), key_mask (S,), attn_mask (L, S) or (H, L, S):
    the output (L, E) and weights (L, S) / (H, L, S) are torch's for the same unbatched call, and
    the batched call's row bit for bit (the query was refused as not 3-D)."""
    E, H, L, S, kdim, vdim, ref, ours = _unbatched_pair(case, dtype)
    q = randn(rng, (L, E), dtype)
    k = None if case == "self" else randn(rng, (S, kdim), dtype)
    v = None if case == "self" else (k if case == "cross" else randn(rng, (S, vdim), dtype))
    km = np.arange(S) < S - 2
    for attn_mask in (None, randn(rng, (L, S), dtype, 0.5), randn(rng, (H, L, S), dtype, 0.5)):
        for key_mask in (None, km):
            for average in (True, False):
                out, w = ours(q, k, v, attn_mask=attn_mask, key_mask=key_mask, need_weights=True,
                              average_attn_weights=average)
                r_out, r_w = torch_mha(ref, q, k, v, key_mask=key_mask, attn_mask=attn_mask, need_weights=True,
                                       average=average)
                assert_close(out, r_out, dtype, what="unbatched output")
                assert_close(w, r_w, dtype, what="unbatched weights")
                b_out, b_w = ours(q[None], None if k is None else k[None], None if v is None else v[None],
                                  attn_mask=attn_mask, key_mask=None if key_mask is None else key_mask[None],
                                  need_weights=True, average_attn_weights=average)
                np.testing.assert_array_equal(out, b_out[0])
                np.testing.assert_array_equal(w, b_w[0])
    out, w = ours(q, k, v, need_weights=False)
    assert w is None and out.shape == (L, E)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", ["self", "cross", "kdim_vdim"])
def test_mha_unbatched_backward_matches_torch(rng, case, dtype):
    """A training forward on unbatched inputs and its backward: grad_output (L, E) -> grad_query
    (L, E) (and grad_key (S, kdim), grad_value (S, vdim)), and every weight's gradient, as torch's
    autograd of the same unbatched call."""
    E, H, L, S, kdim, vdim, ref, ours = _unbatched_pair(case, dtype)
    q, g = randn(rng, (L, E), dtype), randn(rng, (L, E), dtype)
    k = q if case == "self" else randn(rng, (S, kdim), dtype)
    v = q if case == "self" else randn(rng, (S, vdim), dtype)
    am = randn(rng, (H, L, S), dtype, 0.5)
    km = np.arange(S) < S - 1
    qt = to_torch(q).requires_grad_(True)
    kt = qt if case == "self" else to_torch(k).requires_grad_(True)
    vt = qt if case == "self" else to_torch(v).requires_grad_(True)
    kpm = torch.zeros(S, dtype=TORCH_DTYPE[np.dtype(dtype)]).masked_fill(~to_torch(km), float("-inf"))
    out_t = ref(qt, kt, vt, attn_mask=to_torch(am), key_padding_mask=kpm, need_weights=False)[0]
    (out_t * to_torch(g)).sum().backward()
    ours.train()
    args = (q,) if case == "self" else (q, k, v)
    out = ours(*args, attn_mask=am, key_mask=km)[0]
    assert_close(out, out_t.detach(), dtype, what="unbatched training output")
    with pytest.raises(ValueError, match=rf"^grad_output: expected shape \({L}, {E}\)"):
        ours.backward(g[None])
    grads = ours.backward(g)
    if case == "self":
        _assert_grad(grads, qt.grad, dtype, "grad_query")
    else:
        for ours_g, t, what in zip(grads, (qt, kt, vt), ("grad_query", "grad_key", "grad_value")):
            _assert_grad(ours_g, t.grad, dtype, what)
    mine = ours.gradients()
    for name, p in ref.named_parameters():
        _assert_grad(mine[name], p.grad, dtype, name)


def test_mha_unbatched_errors_name_the_shapes_given(rng):
    m = tc.nn.MultiheadAttention(8, 2, kdim=5)
    q, k = randn(rng, (4, 8)), randn(rng, (6, 5))
    with pytest.raises(ValueError, match=r"^key: expected \(S, kdim\) as query is unbatched \(4, 8\), got shape "
                                         r"\(1, 6, 5\)$"):
        m(q, k[None], randn(rng, (1, 6, 8)))
    with pytest.raises(ValueError, match=r"^key: expected \(N, S, kdim\) as query is batched \(1, 4, 8\), got shape "
                                         r"\(6, 5\)$"):
        m(q[None], k, randn(rng, (6, 8)))
    with pytest.raises(ValueError, match=r"^value: expected \(S, vdim\) as query is unbatched"):
        m(q, k, randn(rng, (1, 6, 8)))
    with pytest.raises(ValueError, match=r"^key_mask: expected shape \(6,\) \(S,\) for an unbatched query \(4, 8\) "
                                         r"\(L, E\), got \(1, 6\)$"):
        m(q, k, randn(rng, (6, 8)), key_mask=np.ones((1, 6), bool))
    with pytest.raises(ValueError, match=r"^query: expected \(N, L, E\) or \(L, E\), got shape \(1, 1, 4, 8\)$"):
        m(q[None, None])
    with pytest.raises(ValueError, match=r"^query: expected last dim 8 \(embed_dim\), got shape \(4, 7\)$"):
        m(randn(rng, (4, 7)), k, randn(rng, (6, 8)))


# ----------------------------------------------- rotary position_ids: checked before the cache grows
def _torch_rope_mha(ref, x, positions, base=10000.0):
    """torch's MultiheadAttention ``ref`` (its weights) with Hugging Face's rotate-half RoPE applied
    to q and k at ``positions (N, L)``, causal, in float64: ``(output (N, L, E), weights averaged
    over heads (N, L, L))``."""
    E, H = ref.embed_dim, ref.num_heads
    D = E // H
    with torch.no_grad():
        xt = torch.from_numpy(np.asarray(x, np.float64))
        W, b = ref.in_proj_weight.double(), ref.in_proj_bias.double()
        N, L, _ = xt.shape
        q, k, v = (t.reshape(N, L, H, D).transpose(1, 2) for t in (xt @ W.T + b).split(E, dim=-1))
        inv_freq = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
        angles = torch.from_numpy(np.asarray(positions, np.float64))[..., None] * inv_freq
        emb = torch.cat((angles, angles), dim=-1)[:, None]  # (N, 1, L, D)
        cos, sin = emb.cos(), emb.sin()

        def rotate(t):
            return t * cos + torch.cat((-t[..., D // 2:], t[..., :D // 2]), dim=-1) * sin

        scores = rotate(q) @ rotate(k).transpose(-1, -2) / D**0.5
        scores = scores.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        p = scores.softmax(-1)
        out = (p @ v).transpose(1, 2).reshape(N, L, E) @ ref.out_proj.weight.double().T + ref.out_proj.bias.double()
        return out.numpy(), p.mean(1).numpy()


def test_rotary_positions_are_checked_before_the_cache_grows(rng, monkeypatch):
    """Explicit position_ids were range-checked in C++ only, after the cache was reserved: a refused
    call grew it (capacity 1 -> 1000). They are checked first now, as is the size the rotary tables
    must grow to (the positions the call needs: C++ doubles them only where that fits), and the
    weights need_weights returns: each refused call leaves capacity and length as they were, names
    its argument, and an accepted call after it matches torch."""
    from transformer_core import _validation, nn
    from transformer_core.positional import RotaryEmbedding

    m, ref = make_pair(16, 2, np.float64)
    rope = RotaryEmbedding(8, 16, dtype=np.float64)
    cache = tc.KVCache(1, 1, 2, 8, 1, np.float64)
    x = rng.standard_normal((1, 1000, 16))

    def refused(error, pattern, *args, **kwargs):
        with pytest.raises(error, match=pattern):
            m(*args, is_causal=True, past_key_values=cache, **kwargs)
        assert (cache.capacity, cache.length) == (1, 0)

    refused(ValueError, r"^position_ids: position 99 at flat index 0 is outside the rotary table \[0, 16\) "
                        r"\(rotary's max_position_embeddings\)$", x, rotary=rope, position_ids=np.full((1, 1000), 99))
    refused(ValueError, r"^position_ids: position -1 at flat index 3 is outside the rotary table \[0, 16\)",
            x[:, :4], rotary=rope, position_ids=[[0, 1, 2, -1]])
    far = 2**39
    huge = RotaryEmbedding(8, 2**40, dtype=np.float64)
    refused(ValueError, rf"^position_ids: position {far} needs rotary tables \(cos and sin of {far + 1} positions × 8 "
                        rf"float64; max_position_embeddings {2**40}\) of {2 * (far + 1) * 8 * 8} bytes, which exceed "
                        r"this machine's memory", x[:, :2], rotary=huge, position_ids=[[0, far]])
    # on a machine of 500,000 bytes the 4,097 positions the call needs do not fit (524,416 bytes)
    monkeypatch.setattr(nn, "physical_memory_bytes", lambda: 500_000)
    refused(ValueError, r"^position_ids: position 4096 needs rotary tables \(cos and sin of 4097 positions × 8 "
                        r"float64; max_position_embeddings 1099511627776\) of 524416 bytes, which exceed this "
                        r"machine's memory \(500000 bytes\)$", x[:, :2], rotary=huge, position_ids=[[0, 4096]])
    monkeypatch.setattr(_validation, "physical_memory_bytes", lambda: 300)  # the weights: (1, 2, 5, 5) float64
    refused(ValueError, r"^need_weights: an array of shape \(1, 2, 5, 5\) needs 400 bytes, more than this machine's "
                        r"memory \(300 bytes\)$", x[:, :5], rotary=rope, average_attn_weights=False)
    monkeypatch.setattr(_validation, "physical_memory_bytes", lambda: 150)  # averaged: (1, 5, 5) float64
    refused(ValueError, r"^need_weights: an array of shape \(1, 5, 5\) needs 200 bytes, more than this machine's "
                        r"memory \(150 bytes\)$", x[:, :5], rotary=rope)
    monkeypatch.undo()
    assert huge._impl.built_positions == 4096
    positions = np.array([[3, 1, 4, 1, 5]])
    out, weights = m(x[:, :5], is_causal=True, past_key_values=cache, rotary=rope, position_ids=positions)
    assert cache.length == 5
    ref_out, ref_weights = _torch_rope_mha(ref, x[:, :5], positions)
    assert_close(out, ref_out, np.float64, what="output after the refused calls")
    assert_close(weights, ref_weights, np.float64, what="weights after the refused calls")
    # where the 4,097 positions fit but the 8,192 that doubling would build do not, the call runs
    # (C++ then builds what it needs; the check no longer refuses what C++ would do)
    monkeypatch.setattr(nn, "physical_memory_bytes", lambda: 600_000)
    other = tc.KVCache(1, 1, 2, 8, 1, np.float64)
    m(x[:, :2], is_causal=True, past_key_values=other, rotary=huge, position_ids=[[0, 4096]])
    assert other.length == 2 and huge._impl.built_positions >= 4097


def test_rotary_position_ids_of_one_dim_report_the_shape_given(rng):
    """A position_ids of another shape gives the shape passed (a 1-D one for a batch of 2 said "got
    (1, 3)"; it is now shared by the batch, as Hugging Face's). For a batch of one a 1-D one is that
    row's positions. A ragged list is named, not numpy's error."""
    from transformer_core.positional import RotaryEmbedding

    m, ref = make_pair(16, 2, np.float64)
    rope = RotaryEmbedding(8, 32, dtype=np.float64)
    x = rng.standard_normal((2, 3, 16))
    with pytest.raises(ValueError, match=r"^position_ids: expected shape \(2, 3\) \(query's batch and length\), got "
                                         r"\(2, 2\)$"):
        m(x, rotary=rope, position_ids=np.zeros((2, 2), int))
    with pytest.raises((ValueError, TypeError), match=r"^position_ids: "):
        m(x, rotary=rope, position_ids=[[0, 1, 2], [0, 1]])
    shared, _ = m(x, rotary=rope, position_ids=np.array([7, 2, 20]), need_weights=False)
    each, _ = m(x, rotary=rope, position_ids=np.array([[7, 2, 20]] * 2), need_weights=False)
    np.testing.assert_array_equal(shared, each)
    positions = np.array([7, 2, 20])
    out, _ = m(x[:1], is_causal=True, rotary=rope, position_ids=positions, need_weights=False)
    assert_close(out, _torch_rope_mha(ref, x[:1], positions[None])[0], np.float64, what="1-D position_ids")
