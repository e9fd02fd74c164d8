"""tc.nn.TransformerDecoderLayer, TransformerEncoder / TransformerDecoder stacks, LayerNorm and the
encoder-decoder tc.nn.Transformer vs torch.

The torch references are torch.nn.TransformerDecoderLayer / TransformerEncoder / TransformerDecoder /
Transformer(batch_first=True, dropout=0.0).eval() under no_grad with the MHA fast path disabled
(conftest), loaded with the same (randomised) weights. The layers' tgt_mask/memory_mask/src_mask/mask
keep torch's names and take float masks (a bool one is refused: torch reads it as True = blocked, the
library's bool masks are True = may attend): a bool pattern in our convention goes to our layer as
tc.masks.to_additive(m) and to torch as ~m. Our *_key_mask True = real token (torch:
key_padding_mask = ~key_mask). torch's ``*_is_causal`` are only hints, so torch always gets the
explicit causal mask.
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
    randomise_,
    states_equal,
    to_torch,
)


def make_pair(d, h, f, activation, norm_first, dtype, bias=True, eps=1e-5):
    ref = torch.nn.TransformerDecoderLayer(d, h, dim_feedforward=f, dropout=0.0, activation=activation,
                                          layer_norm_eps=eps, batch_first=True, norm_first=norm_first,
                                          bias=bias)
    ref = randomise_(ref.to(TORCH_DTYPE[np.dtype(dtype)]).eval())
    ours = tc.nn.TransformerDecoderLayer(d, h, dim_feedforward=f, activation=activation, layer_norm_eps=eps,
                                         norm_first=norm_first, bias=bias, dtype=dtype)
    ours.load_state_dict(module_state_to_numpy(ref))
    return ours, ref


def _tmask(m):
    if m is None:
        return None
    return ~to_torch(m) if m.dtype == np.bool_ else to_torch(m)


def _kpm(km):
    return None if km is None else ~to_torch(km)


def torch_decoder(ref, tgt, mem, tgt_mask=None, memory_mask=None, tgt_key_mask=None, memory_key_mask=None):
    with torch.no_grad():
        return ref(to_torch(tgt), to_torch(mem), tgt_mask=_tmask(tgt_mask), memory_mask=_tmask(memory_mask),
                   tgt_key_padding_mask=_kpm(tgt_key_mask),
                   memory_key_padding_mask=_kpm(memory_key_mask)).numpy()


def _padding(rng, N, S):
    lengths = rng.integers(1, S + 1, size=N)
    lengths[0] = max(1, S - 2) if S > 1 else 1
    return np.arange(S) < lengths[:, None]


def _causal(T, S=None):
    S = T if S is None else S
    return np.arange(S)[None, :] <= np.arange(T)[:, None]


CONFIGS = [(9, 3, 17), (8, 1, 8), (16, 8, 24)]
CONFIG_IDS = [f"d{d}h{h}f{f}" for d, h, f in CONFIGS]
NTS = [(1, 1, 1), (2, 7, 5), (7, 7, 7), (3, 5, 11)]  # (N, T, S): batch == seq, T != S


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("N,T,S", NTS, ids=[f"N{n}T{t}S{s}" for n, t, s in NTS])
@pytest.mark.parametrize("d,h,f", CONFIGS, ids=CONFIG_IDS)
def test_decoder_layer_matches_torch(rng, d, h, f, N, T, S, activation, norm_first, dtype):
    ours, ref = make_pair(d, h, f, activation, norm_first, dtype)
    tgt = randn(rng, (N, T, d), dtype)
    mem = randn(rng, (N, S, d), dtype)
    out = ours(tgt, mem)
    assert out.dtype == np.dtype(dtype) and out.shape == (N, T, d)
    assert_close(out, torch_decoder(ref, tgt, mem), dtype, what="decoder layer")
    # causal self-attention, padded target and memory
    tkm, mkm = _padding(rng, N, T), _padding(rng, N, S)
    out = ours(tgt, mem, tgt_key_mask=tkm, memory_key_mask=mkm, tgt_is_causal=True)
    r = torch_decoder(ref, tgt, mem, tgt_mask=_causal(T), tgt_key_mask=tkm, memory_key_mask=mkm)
    assert_close(out[tkm], r[tkm], dtype, what="decoder layer causal + padding (real rows)")
    assert np.all(np.isfinite(out))


MASK_KINDS = ["tgt_additive", "tgt_float", "tgt_causal_flag", "tgt_3d", "mem_additive", "mem_float", "mem_4d",
              "mem_causal_flag", "mem_causal_flag+float", "tgt_key", "mem_key", "all", "tgt_fully_masked_row",
              "mem_fully_masked_row", "mem_key_all_padded"]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_decoder_layer_masks(rng, kind, norm_first, dtype):
    d, h, f, N, T, S = 12, 3, 29, 3, 7, 9
    ours, ref = make_pair(d, h, f, "gelu", norm_first, dtype)
    tgt = randn(rng, (N, T, d), dtype)
    mem = randn(rng, (N, S, d), dtype)
    kw, tkw = {}, {}
    if kind == "tgt_additive" or kind == "all" or kind == "tgt_fully_masked_row":
        m = rng.random((T, T)) < 0.6
        m[:, 0] = True
        if kind == "tgt_fully_masked_row":
            m[3] = False
        kw["tgt_mask"] = tkw["tgt_mask"] = m
    if kind == "tgt_float":
        kw["tgt_mask"] = tkw["tgt_mask"] = randn(rng, (T, T), dtype)
    if kind == "tgt_causal_flag":
        kw["tgt_is_causal"] = True
        tkw["tgt_mask"] = _causal(T)
    if kind == "tgt_3d":
        m = rng.random((N * h, T, T)) < 0.6
        m[..., 0] = True
        kw["tgt_mask"] = tkw["tgt_mask"] = m
    if kind in ("mem_additive", "all", "mem_fully_masked_row"):
        m = rng.random((T, S)) < 0.6
        m[:, 1] = True
        if kind == "mem_fully_masked_row":
            m[2] = False
        kw["memory_mask"] = tkw["memory_mask"] = m
    if kind == "mem_float":
        kw["memory_mask"] = tkw["memory_mask"] = randn(rng, (T, S), dtype)
    if kind == "mem_4d":
        m = rng.random((N, h, T, S)) < 0.6
        m[..., 1] = True
        kw["memory_mask"] = m
        tkw["memory_mask"] = m.reshape(N * h, T, S)  # torch takes (N·nhead, T, S)
    if kind == "mem_causal_flag":
        kw["memory_is_causal"] = True
        tkw["memory_mask"] = _causal(T, S)
    if kind == "mem_causal_flag+float":  # the flag's (bool) mask and the user's float mask together
        fm = randn(rng, (T, S), dtype)
        kw["memory_is_causal"], kw["memory_mask"] = True, fm
        tkw["memory_mask"] = np.where(_causal(T, S), fm, -np.inf).astype(dtype)
    tkm = None
    if kind in ("tgt_key", "all"):
        tkm = _padding(rng, N, T)
        kw["tgt_key_mask"] = tkw["tgt_key_mask"] = tkm
    if kind in ("mem_key", "all"):
        kw["memory_key_mask"] = tkw["memory_key_mask"] = _padding(rng, N, S)
    if kind == "mem_key_all_padded":
        mkm = np.ones((N, S), bool)
        mkm[1] = False  # every memory position of sample 1 is padding
        kw["memory_key_mask"] = tkw["memory_key_mask"] = mkm
    for name in ("tgt_mask", "memory_mask"):  # torch's names take float masks: the bool pattern as 0 / -inf
        if name in kw and kw[name].dtype == np.bool_:
            kw[name] = tc.masks.to_additive(kw[name], dtype)
    out = ours(tgt, mem, **kw)
    r = torch_decoder(ref, tgt, mem, **tkw)
    assert out.shape == (N, T, d)
    assert np.all(np.isfinite(out)), "our layer must not produce NaN"
    rows = np.ones((N, T), bool) if tkm is None else tkm.copy()
    rows &= np.isfinite(r).all(-1)  # torch may give NaN on fully masked rows
    if kind == "mem_key_all_padded":
        rows[1] = False
    if kind.endswith("fully_masked_row") or kind == "mem_key_all_padded":
        # Our fully masked attention rows contribute zeros before out_proj: check against a torch
        # run where the masked attention output is replaced by exactly that (out_proj.bias).
        r2 = _torch_decoder_zero_rows(ref, tgt, mem, kind, tkw)
        assert_close(out, r2, dtype, what=f"decoder {kind} (fully masked rows as zero attention)")
    assert rows.any()
    assert_close(out[rows], r[rows], dtype, what=f"decoder layer mask {kind}")


def _torch_decoder_zero_rows(ref, tgt, mem, kind, tkw):
    """torch's decoder layer, written out, with fully masked attention rows giving 0 (pre out_proj)."""
    import torch.nn.functional as TF

    def mha(attn, x, kv, allow):  # allow: (N or 1, 1, T, S) bool True = attend
        E = x.shape[-1]
        H = attn.num_heads
        W, b = attn.in_proj_weight, attn.in_proj_bias
        q, k, v = TF.linear(x, W[:E], b[:E]), TF.linear(kv, W[E:2 * E], b[E:2 * E]), TF.linear(kv, W[2 * E:], b[2 * E:])
        N, T = x.shape[0], x.shape[1]
        q, k, v = (t.view(N, -1, H, E // H).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / np.sqrt(E // H)
        s = s.masked_fill(~allow, float("-inf"))
        p = torch.nan_to_num(torch.softmax(s, -1), nan=0.0)
        o = (p @ v).transpose(1, 2).reshape(N, T, E)
        return attn.out_proj(o)

    with torch.no_grad():
        x, m = to_torch(tgt), to_torch(mem)
        T, S = x.shape[1], m.shape[1]
        sa = torch.ones(1, 1, T, T, dtype=torch.bool)
        if "tgt_mask" in tkw:
            sa = sa & to_torch(tkw["tgt_mask"])
        ca = torch.ones(1, 1, T, S, dtype=torch.bool)
        if "memory_mask" in tkw:
            ca = ca & to_torch(tkw["memory_mask"])
        if "memory_key_mask" in tkw:
            ca = ca & to_torch(tkw["memory_key_mask"])[:, None, None, :]
        act = TF.gelu
        ff = lambda y: ref.linear2(act(ref.linear1(y)))  # noqa: E731
        if ref.norm_first:
            x = x + mha(ref.self_attn, ref.norm1(x), ref.norm1(x), sa)
            x = x + mha(ref.multihead_attn, ref.norm2(x), m, ca)
            x = x + ff(ref.norm3(x))
        else:
            x = ref.norm1(x + mha(ref.self_attn, x, x, sa))
            x = ref.norm2(x + mha(ref.multihead_attn, x, m, ca))
            x = ref.norm3(x + ff(x))
    return x.numpy()


@pytest.mark.parametrize("eps", [1e-5, 1e-12, 1e-2])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_decoder_layer_eps_and_bias(rng, eps, bias):
    ours, ref = make_pair(9, 3, 17, "relu", True, np.float32, bias=bias, eps=eps)
    tgt, mem = randn(rng, (2, 7, 9)), randn(rng, (2, 4, 9))
    assert_close(ours(tgt, mem), torch_decoder(ref, tgt, mem), np.float32)
    assert set(ours.state_dict()) == set(module_state_to_numpy(ref))


@pytest.mark.parametrize("path", ["flash", "reference"])
def test_decoder_layer_paths(rng, path):
    ours, ref = make_pair(16, 4, 32, "relu", False, np.float32)
    tgt, mem = randn(rng, (2, 65, 16)), randn(rng, (2, 70, 16))
    out = ours(tgt, mem, tgt_is_causal=True, path=path)
    assert_close(out, torch_decoder(ref, tgt, mem, tgt_mask=_causal(65)), np.float32)


def test_decoder_layer_state_dict(rng):
    ours, ref = make_pair(9, 3, 17, "relu", False, np.float32)
    ref_sd = module_state_to_numpy(ref)
    sd = ours.state_dict()
    assert set(sd) == set(ref_sd)
    for k in ref_sd:
        np.testing.assert_array_equal(np.asarray(sd[k]), ref_sd[k])
    before = {k: np.array(v, copy=True) for k, v in sd.items()}
    bad = dict(ref_sd)
    bad["multihead_attn.in_proj_weight"] = np.zeros((27, 8), np.float32)
    with pytest.raises(ValueError, match="multihead_attn.in_proj_weight"):
        ours.load_state_dict(bad)
    bad = dict(ref_sd)
    del bad["norm3.bias"]
    with pytest.raises(ValueError, match="norm3.bias"):
        ours.load_state_dict(bad)
    bad = dict(ref_sd)
    bad["extra.weight"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="extra.weight"):
        ours.load_state_dict(bad)
    assert states_equal(ours.state_dict(), before)


def test_decoder_layer_bad_input(rng):
    layer = tc.nn.TransformerDecoderLayer(12, 3, dim_feedforward=16)
    tgt, mem = randn(rng, (2, 5, 12)), randn(rng, (2, 7, 12))
    with pytest.raises(ValueError, match="tgt"):
        layer(randn(rng, (2, 5, 8)), mem)
    with pytest.raises(ValueError, match="tgt"):
        layer(randn(rng, (5, 12)), mem)
    with pytest.raises(ValueError, match="memory"):
        layer(tgt, randn(rng, (3, 7, 12)))
    with pytest.raises(ValueError, match="memory"):
        layer(tgt, randn(rng, (2, 7, 10)))
    with pytest.raises(ValueError, match="tgt_mask"):
        layer(tgt, mem, tgt_mask=np.zeros((5, 7), np.float32))
    with pytest.raises(ValueError, match="memory_mask"):
        layer(tgt, mem, memory_mask=np.zeros((5, 5), np.float32))
    for name in ("tgt_mask", "memory_mask"):  # torch's names, torch's float meaning: bool refused
        with pytest.raises(TypeError, match=rf"^{name}: expected a float mask .*got a bool mask"):
            layer(tgt, mem, **{name: np.ones((5, 5 if name == "tgt_mask" else 7), bool)})
        with pytest.raises(TypeError, match=rf"^{name}: expected a float mask"):
            tc.nn.TransformerDecoder(layer, 2)(tgt, mem, **{name: np.ones((5, 5 if name == "tgt_mask" else 7), bool)})
    with pytest.raises(TypeError, match="memory_mask"):
        layer(tgt, mem, memory_mask=np.ones((5, 7), np.int64))
    with pytest.raises(ValueError, match="tgt_key_mask"):
        layer(tgt, mem, tgt_key_mask=np.ones((2, 7), bool))
    with pytest.raises(ValueError, match="memory_key_mask"):
        layer(tgt, mem, memory_key_mask=np.ones((2, 5), bool))
    with pytest.raises(ValueError, match="d_model"):
        tc.nn.TransformerDecoderLayer(10, 3)
    with pytest.raises(ValueError, match="activation"):
        tc.nn.TransformerDecoderLayer(12, 3, activation="sigmoid")
    with pytest.raises(ValueError, match="layer_norm_eps"):
        tc.nn.TransformerDecoderLayer(12, 3, layer_norm_eps=-1.0)
    with pytest.raises(ValueError, match="nhead"):
        tc.nn.TransformerDecoderLayer(12, 0)


# -------------------------------------------------------------------------------------- LayerNorm
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("eps", [1e-5, 1e-2])
@pytest.mark.parametrize("shape", [(1,), (7, 5), (2, 3, 9)], ids=["1", "7x5", "2x3x9"])
def test_layer_norm_matches_torch(rng, shape, eps, bias, dtype):
    E = shape[-1]
    ref = randomise_(torch.nn.LayerNorm(E, eps=eps, bias=bias).to(TORCH_DTYPE[np.dtype(dtype)]))
    ours = tc.nn.LayerNorm(E, eps, bias=bias, dtype=dtype)
    sd = module_state_to_numpy(ref)
    assert set(ours.state_dict()) == set(sd)
    ours.load_state_dict(sd)
    x = randn(rng, shape, dtype, scale=3.0) + 2.0
    with torch.no_grad():
        r = ref(to_torch(x))
    assert_close(ours(x), r, dtype, what="layer norm")


def test_layer_norm_bad_input(rng):
    with pytest.raises(ValueError, match="eps"):
        tc.nn.LayerNorm(4, eps=-1.0)
    with pytest.raises(ValueError, match="normalized_shape"):
        tc.nn.LayerNorm((4, 4))
    with pytest.raises(ValueError, match="x"):
        tc.nn.LayerNorm(4)(randn(rng, (2, 5)))


# ------------------------------------------------------------------------------- stacks
def _stack_pair(kind, d, h, f, activation, norm_first, num_layers, with_norm, dtype):
    tdt = TORCH_DTYPE[np.dtype(dtype)]
    tnorm = torch.nn.LayerNorm(d) if with_norm else None
    onorm = tc.nn.LayerNorm(d, dtype=dtype) if with_norm else None
    if kind == "encoder":
        tl = torch.nn.TransformerEncoderLayer(d, h, f, 0.0, activation, batch_first=True, norm_first=norm_first)
        ref = torch.nn.TransformerEncoder(tl, num_layers, norm=tnorm, enable_nested_tensor=False)
        ours = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(d, h, f, activation, norm_first=norm_first,
                                                                       dtype=dtype), num_layers, norm=onorm)
    else:
        tl = torch.nn.TransformerDecoderLayer(d, h, f, 0.0, activation, batch_first=True, norm_first=norm_first)
        ref = torch.nn.TransformerDecoder(tl, num_layers, norm=tnorm)
        ours = tc.nn.TransformerDecoder(tc.nn.TransformerDecoderLayer(d, h, f, activation, norm_first=norm_first,
                                                                       dtype=dtype), num_layers, norm=onorm)
    ref = randomise_(ref.to(tdt).eval())  # every layer gets different weights
    sd = module_state_to_numpy(ref)
    assert set(ours.state_dict()) == set(sd)
    ours.load_state_dict(sd)
    return ours, ref


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("with_norm", [False, True], ids=["nonorm", "norm"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_encoder_stack_matches_torch(rng, norm_first, with_norm, dtype):
    N, L, d, activation = 3, 7, 12, "gelu"
    ours, ref = _stack_pair("encoder", d, 4, 20, activation, norm_first, 3, with_norm, dtype)
    x = randn(rng, (N, L, d), dtype)
    km = _padding(rng, N, L)
    with torch.no_grad():
        r = ref(to_torch(x), mask=~to_torch(_causal(L)), src_key_padding_mask=~to_torch(km)).numpy()
    out = ours(x, src_key_mask=km, is_causal=True)
    assert_close(out[km], r[km], dtype, what="encoder stack")
    with torch.no_grad():
        r = ref(to_torch(x)).numpy()
    assert_close(ours(x), r, dtype, what="encoder stack no mask")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("with_norm", [False, True], ids=["nonorm", "norm"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_decoder_stack_matches_torch(rng, norm_first, with_norm, dtype):
    N, T, S, d, activation = 2, 5, 8, 12, "relu"
    ours, ref = _stack_pair("decoder", d, 2, 20, activation, norm_first, 3, with_norm, dtype)
    tgt, mem = randn(rng, (N, T, d), dtype), randn(rng, (N, S, d), dtype)
    tkm, mkm = _padding(rng, N, T), _padding(rng, N, S)
    with torch.no_grad():
        r = ref(to_torch(tgt), to_torch(mem), tgt_mask=~to_torch(_causal(T)), tgt_key_padding_mask=~to_torch(tkm),
                memory_key_padding_mask=~to_torch(mkm)).numpy()
    out = ours(tgt, mem, tgt_key_mask=tkm, memory_key_mask=mkm, tgt_is_causal=True)
    assert_close(out[tkm], r[tkm], dtype, what="decoder stack")


def test_stack_copies_layer_and_bad_input(rng):
    layer = tc.nn.TransformerDecoderLayer(8, 2, 16)
    stack = tc.nn.TransformerDecoder(layer, 2)
    sd = stack.state_dict()
    assert {k.split(".", 2)[2] for k in sd} == set(layer.state_dict())
    for k, v in layer.state_dict().items():  # copies of the given layer
        np.testing.assert_array_equal(sd[f"layers.0.{k}"], v)
        np.testing.assert_array_equal(sd[f"layers.1.{k}"], v)
    with pytest.raises(TypeError, match="decoder_layer"):
        tc.nn.TransformerDecoder(tc.nn.TransformerEncoderLayer(8, 2, 16), 2)
    with pytest.raises(TypeError, match="encoder_layer"):
        tc.nn.TransformerEncoder(layer, 2)
    with pytest.raises(TypeError, match=r"^norm: expected a transformer_core.nn.LayerNorm or None"):
        tc.nn.TransformerDecoder(layer, 2, norm="layernorm")
    with pytest.raises(ValueError, match="num_layers"):
        tc.nn.TransformerDecoder(layer, 0)


# -------------------------------------------------------------------------- full Transformer
TRANSFORMER_CFGS = [(16, 4, 2, 2, 32, "relu"), (12, 3, 1, 3, 20, "gelu"), (8, 1, 2, 1, 8, "gelu")]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
@pytest.mark.parametrize("d,h,ne,nd,f,activation", TRANSFORMER_CFGS,
                         ids=[f"d{c[0]}h{c[1]}e{c[2]}d{c[3]}{c[5]}" for c in TRANSFORMER_CFGS])
@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
def test_transformer_matches_torch(rng, d, h, ne, nd, f, activation, norm_first, dtype):
    ref = torch.nn.Transformer(d, h, ne, nd, f, dropout=0.0, activation=activation, batch_first=True,
                               norm_first=norm_first)
    ref = randomise_(ref.to(TORCH_DTYPE[np.dtype(dtype)]).eval())
    ours = tc.nn.Transformer(d, h, ne, nd, f, activation, 1e-5, norm_first, True, dtype)
    sd = module_state_to_numpy(ref)
    assert set(ours.state_dict()) == set(sd)
    ours.load_state_dict(sd)
    assert states_equal(ours.state_dict(), sd)
    N, S, T = 3, 9, 6
    src, tgt = randn(rng, (N, S, d), dtype), randn(rng, (N, T, d), dtype)
    # no masks
    with torch.no_grad():
        r = ref(to_torch(src), to_torch(tgt)).numpy()
    out = ours(src, tgt)
    assert out.shape == (N, T, d) and out.dtype == np.dtype(dtype)
    assert_close(out, r, dtype, what="transformer")
    # causal target + padding; padded memory hidden from the decoder (torch's nested-tensor encoder
    # may zero padded memory rows, so those must not be visible for the results to agree)
    skm, tkm = _padding(rng, N, S), _padding(rng, N, T)
    with torch.no_grad():
        r = ref(to_torch(src), to_torch(tgt), tgt_mask=~to_torch(_causal(T)), src_key_padding_mask=~to_torch(skm),
                tgt_key_padding_mask=~to_torch(tkm), memory_key_padding_mask=~to_torch(skm)).numpy()
    out = ours(src, tgt, src_key_mask=skm, tgt_key_mask=tkm, memory_key_mask=skm, tgt_is_causal=True)
    assert np.all(np.isfinite(out))
    assert_close(out[tkm], r[tkm], dtype, what="transformer causal + padding")
    # explicit masks: src_mask, tgt_mask (float), memory_mask
    sm = rng.random((S, S)) < 0.7
    sm[:, 0] = True
    tm = np.where(_causal(T), 0.0, -np.inf).astype(dtype) + randn(rng, (T, T), dtype, 0.1)
    mm = rng.random((T, S)) < 0.7
    mm[:, 0] = True
    with torch.no_grad():
        r = ref(to_torch(src), to_torch(tgt), src_mask=~to_torch(sm), tgt_mask=to_torch(tm),
                memory_mask=~to_torch(mm)).numpy()
    additive = tc.masks.to_additive
    assert_close(ours(src, tgt, src_mask=additive(sm, dtype), tgt_mask=tm, memory_mask=additive(mm, dtype)), r, dtype,
                 what="transformer explicit masks")


def test_transformer_names_torchs_sixth_positional_dropout():
    """torch's nn.Transformer takes dropout sixth (after dim_feedforward; read from its signature),
    this model activation: the hint said "fourth" (the layers' position), and an int (torch's
    dropout=0) got none. A float or an int there now says "sixth"; the layers keep "fourth"."""
    import inspect

    assert list(inspect.signature(torch.nn.Transformer).parameters).index("dropout") == 5
    for value, got in ((0.1, "float 0.1"), (0, "int 0"), (np.float32(0.5), "float32 0.5")):
        expected = (f"activation: expected a str, got {got} (torch's sixth positional argument is dropout, "
                    f"this model's is activation: pass dropout= by keyword)")
        with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
            tc.nn.Transformer(8, 2, 1, 1, 16, value)
    # torch's positional call with its activation after the dropout is refused at the dropout
    torch.nn.Transformer(8, 2, 1, 1, 16, 0.1, "gelu", batch_first=True)
    with pytest.raises(TypeError, match=re.escape("got float 0.1 (torch's sixth positional argument is dropout")):
        tc.nn.Transformer(8, 2, 1, 1, 16, 0.1, "gelu")
    assert tc.nn.Transformer(8, 2, 1, 1, 16, dropout=0).encoder.layers[0].dropout == 0  # the hint's call


def test_transformer_state_dict_and_bad_input(rng):
    ref = torch.nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True).eval()
    ours = tc.nn.Transformer(8, 2, 1, 1, 16)
    sd = module_state_to_numpy(ref)
    assert set(ours.state_dict()) == set(sd)
    ours.load_state_dict(sd)
    before = {k: np.array(v, copy=True) for k, v in ours.state_dict().items()}
    bad = dict(sd)
    del bad["decoder.norm.weight"]
    with pytest.raises(ValueError, match="decoder.norm.weight"):
        ours.load_state_dict(bad)
    bad = dict(sd)
    bad["encoder.layers.0.linear1.weight"] = np.zeros((16, 9), np.float32)
    with pytest.raises(ValueError, match="encoder.layers.0.linear1.weight"):
        ours.load_state_dict(bad)
    with pytest.raises(TypeError, match="state_dict"):
        ours.load_state_dict([1, 2])
    assert states_equal(ours.state_dict(), before)
    src, tgt = randn(rng, (2, 5, 8)), randn(rng, (2, 4, 8))
    with pytest.raises(ValueError, match="tgt"):
        ours(src, randn(rng, (3, 4, 8)))
    with pytest.raises(ValueError, match="d_model"):
        ours(src, randn(rng, (2, 4, 6)))
    with pytest.raises(ValueError, match="src_key_mask"):
        ours(src, tgt, src_key_mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match="memory_mask"):
        ours(src, tgt, memory_mask=np.zeros((4, 4), np.float32))


def test_transformer_signature_is_torchs():
    """nn.Transformer's parameters are torch's (plus dtype, and dropout and batch_first by keyword):
    the memory check's private plumbing (Seq2SeqTransformer's tables) is not a keyword of it."""
    import inspect

    ours = list(inspect.signature(tc.nn.Transformer).parameters)
    theirs = list(inspect.signature(torch.nn.Transformer).parameters)
    assert ours == ["d_model", "nhead", "num_encoder_layers", "num_decoder_layers", "dim_feedforward", "activation",
                    "layer_norm_eps", "norm_first", "bias", "dtype", "dropout", "batch_first"]
    assert set(ours) - {"dtype"} <= set(theirs)


@pytest.mark.parametrize("counts,error,match", [
    ({"num_encoder_layers": 0}, ValueError, r"^num_encoder_layers: expected an int in \[1, 2\*\*63 - 1\], got 0$"),
    ({"num_decoder_layers": -2}, ValueError, r"^num_decoder_layers: expected an int in \[1, 2\*\*63 - 1\], got -2$"),
    ({"num_encoder_layers": 1.5}, TypeError, r"^num_encoder_layers: expected an int, got float 1.5$"),
    ({"num_decoder_layers": True}, TypeError, r"^num_decoder_layers: expected an int, got bool"),
    ({"num_decoder_layers": 2**60}, ValueError, r"^num_decoder_layers: the decoder's layers \(1152921504606846976 × "),
], ids=["enc0", "dec-2", "enc1.5", "dec_bool", "dec_past_memory"])
def test_transformer_names_its_layer_counts(monkeypatch, counts, error, match):
    """Both counts were checked by the stacks, both named ``num_layers`` (a bad num_decoder_layers
    too, after the encoder stack was built). Now each is named, before either stack is built."""
    built = []
    init = tc.nn.TransformerEncoder.__init__

    def recording_init(self, layer, num_layers, norm=None):
        built.append(num_layers)
        init(self, layer, num_layers, norm)

    monkeypatch.setattr(tc.nn.TransformerEncoder, "__init__", recording_init)
    with pytest.raises(error, match=match):
        tc.nn.Transformer(8, 2, dim_feedforward=16, **counts)
    assert built == []
    model = tc.nn.Transformer(8, 2, 2, 3, 16)
    assert built == [2] and len(model.encoder.layers) == 2 and len(model.decoder.layers) == 3


# ------------------------------------------------------------------ masks are keyword-only
def test_masks_are_keyword_only(rng):
    """torch's positions after the tensors are (attn_mask, key_padding_mask) with True = blocked/padding;
    ours mean the opposite, so a call ported positionally (``layer(x, None, kpm)``) must fail loudly."""
    enc = tc.nn.TransformerEncoderLayer(8, 2, 16)
    dec = tc.nn.TransformerDecoderLayer(8, 2, 16)
    x, mem = randn(rng, (2, 5, 8)), randn(rng, (2, 4, 8))
    kpm = np.zeros((2, 5), bool)  # torch: "no padding"; ours would read "everything is padding"
    calls = {
        "TransformerEncoderLayer": lambda: enc(x, None, kpm),
        "TransformerEncoder": lambda: tc.nn.TransformerEncoder(enc, 2)(x, None, kpm),
        "TransformerDecoderLayer": lambda: dec(x, mem, None, None, kpm),
        "TransformerDecoder": lambda: tc.nn.TransformerDecoder(dec, 2)(x, mem, None, None, kpm),
        "Transformer": lambda: tc.nn.Transformer(8, 2, 1, 1, 16)(mem, x, None, None, None, np.zeros((2, 4), bool)),
        "Transformer.forward": lambda: tc.nn.Transformer(8, 2, 1, 1, 16).forward(mem, x, None),
        "TransformerEncoderLayer.is_causal": lambda: enc.forward(x, None, None, True),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match="positional argument"):
            call()
            pytest.fail(f"{name}: a positional mask was accepted")
    # the keyword forms run
    assert enc(x, src_key_mask=~kpm).shape == (2, 5, 8)
    assert dec(x, mem, tgt_key_mask=~kpm, memory_key_mask=np.ones((2, 4), bool)).shape == (2, 5, 8)
    assert tc.nn.TransformerEncoder(enc, 2)(x, mask=np.zeros((5, 5), np.float32), src_key_mask=~kpm).shape == (2, 5, 8)


def test_float_key_masks_refused(rng):
    """A float key mask looks like torch's additive key_padding_mask (all zeros = mask nothing), which
    would read here as "everything is padding": refused with a TypeError; bool and integer 0/1 work."""
    enc = tc.nn.TransformerEncoderLayer(8, 2, 16)
    dec = tc.nn.TransformerDecoderLayer(8, 2, 16)
    mha = tc.nn.MultiheadAttention(8, 2)
    x, mem = randn(rng, (2, 5, 8)), randn(rng, (2, 4, 8))
    with pytest.raises(TypeError, match=r"src_key_mask: expected bool or integer 0/1.*got float32.*key_padding_mask"):
        enc(x, src_key_mask=np.zeros((2, 5), np.float32))
    with pytest.raises(TypeError, match="memory_key_mask: .*float64"):
        dec(x, mem, memory_key_mask=np.ones((2, 4)))
    with pytest.raises(TypeError, match="tgt_key_mask: .*float"):
        dec(x, mem, tgt_key_mask=np.ones((2, 5), np.float32))
    with pytest.raises(TypeError, match="key_mask: .*float"):
        mha(x, key_mask=[[1.0] * 5] * 2)
    with pytest.raises(TypeError, match="src_key_mask: .*float"):
        tc.nn.Transformer(8, 2, 1, 1, 16)(mem, x, src_key_mask=np.ones((2, 4), np.float32))
    km = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(enc(x, src_key_mask=km), enc(x, src_key_mask=km.astype(bool)))
    np.testing.assert_array_equal(mha(x, key_mask=km)[0], mha(x, key_mask=km.astype(bool))[0])


# ------------------------------------------------------------------ Transformer's causal mask helper
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=DTYPE_IDS)
def test_generate_square_subsequent_mask_matches_torch(rng, dtype):
    """The module doc points at nn.Transformer.generate_square_subsequent_mask: tc.nn.Transformer
    has it, as torch's (0 on and below the diagonal, -inf above), and it works as tgt_mask."""
    td = TORCH_DTYPE[np.dtype(dtype)]
    for sz in (0, 1, 5, np.int64(3)):
        ours = tc.nn.Transformer.generate_square_subsequent_mask(sz, dtype)
        ref = torch.nn.Transformer.generate_square_subsequent_mask(int(sz), dtype=td).numpy()
        assert ours.dtype == np.dtype(dtype) and ours.shape == (int(sz), int(sz))
        np.testing.assert_array_equal(ours, ref)
    default = tc.nn.Transformer.generate_square_subsequent_mask(4)
    assert default.dtype == np.float32
    np.testing.assert_array_equal(default, torch.nn.Transformer.generate_square_subsequent_mask(4).numpy())
    model = tc.nn.Transformer(8, 2, 1, 1, 16, dtype=dtype)
    src, tgt = randn(rng, (2, 6, 8), dtype), randn(rng, (2, 4, 8), dtype)
    np.testing.assert_array_equal(model(src, tgt, tgt_mask=model.generate_square_subsequent_mask(4, dtype)),
                                  model(src, tgt, tgt_mask=np.where(_causal(4), 0.0, -np.inf).astype(dtype)))
    with pytest.raises(ValueError, match=r"^sz: expected an int in \[0, "):
        tc.nn.Transformer.generate_square_subsequent_mask(-1)
    for bad in (2.0, True, "5", None):
        with pytest.raises(TypeError, match="^sz: expected an int"):
            tc.nn.Transformer.generate_square_subsequent_mask(bad)
    with pytest.raises(TypeError, match="^dtype: expected float32 or float64"):
        tc.nn.Transformer.generate_square_subsequent_mask(3, np.int64)
    with pytest.raises(ValueError, match="^sz: an array of shape"):
        tc.nn.Transformer.generate_square_subsequent_mask(2**40)


# ------------------------------------------------------------------------- unbatched, as torch
def _torch_key_mask(km, dtype):
    """Our key mask (True = real token) as torch's float key_padding_mask (-inf = padding)."""
    return torch.zeros(km.shape, dtype=TORCH_DTYPE[np.dtype(dtype)]).masked_fill(~to_torch(km), float("-inf"))


def _assert_grad(ours, ref, dtype, what):
    """|ours - ref| <= atol(dtype) · max(1, max|ref|) (fp32 1e-5, fp64 1e-10 on O(1) values)."""
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    scale = max(1.0, float(np.abs(ref).max(initial=0.0)))
    assert_close(ours, ref, dtype, atol_=(1e-5 if np.dtype(dtype) == np.float32 else 1e-10) * scale, rtol_=0.0,
                 what=what)


def _unbatched_case(rng, which, norm_first, dtype):
    """(ours, ref, our inputs, torch's inputs, our masks, torch's masks, grad_output) for an
    unbatched call of the decoder layer, the decoder stack or the Transformer."""
    d, h, f, T, S = 8, 2, 12, 5, 7
    if which == "layer":
        ours, ref = make_pair(d, h, f, "relu", norm_first, dtype)
    elif which == "stack":
        ours, ref = _stack_pair("decoder", d, h, f, "relu", norm_first, 2, True, dtype)
    else:
        ref = torch.nn.Transformer(d, h, 2, 2, f, dropout=0.0, batch_first=True, norm_first=norm_first)
        ref = randomise_(ref.to(TORCH_DTYPE[np.dtype(dtype)])).eval()
        ours = tc.nn.Transformer(d, h, 2, 2, f, norm_first=norm_first, dtype=dtype)
        ours.load_state_dict(module_state_to_numpy(ref))
    tgt, mem, g = randn(rng, (T, d), dtype), randn(rng, (S, d), dtype), randn(rng, (T, d), dtype)
    tkm, mkm = np.arange(T) < T - 1, np.arange(S) < S - 2
    tm = np.where(_causal(T), 0.0, -np.inf).astype(dtype) + randn(rng, (T, T), dtype, 0.1)
    mm = randn(rng, (h, T, S), dtype, 0.5)  # (nhead, T, S): torch's 3-D mask of an unbatched call
    ours_kw = dict(tgt_mask=tm, memory_mask=mm, tgt_key_mask=tkm, memory_key_mask=mkm)
    torch_kw = dict(tgt_mask=to_torch(tm), memory_mask=to_torch(mm), tgt_key_padding_mask=_torch_key_mask(tkm, dtype),
                    memory_key_padding_mask=_torch_key_mask(mkm, dtype))
    inputs = (tgt, mem)
    if which == "transformer":
        sm = randn(rng, (S, S), dtype, 0.5)
        ours_kw.update(src_mask=sm, src_key_mask=mkm)
        torch_kw.update(src_mask=to_torch(sm), src_key_padding_mask=_torch_key_mask(mkm, dtype))
        inputs = (mem, tgt)
    return ours, ref, inputs, ours_kw, torch_kw, g


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
@pytest.mark.parametrize("which", ["layer", "stack", "transformer"])
@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
def test_unbatched_matches_torch(rng, which, norm_first, dtype):
    """tgt (T, E) and memory (S, E) (Transformer: src (S, E), tgt (T, E)), key masks (T,) / (S,),
    3-D masks (nhead, T, S): torch's result (T, E), and the batched call's row bit for bit (a 2-D
    tgt was refused)."""
    ours, ref, inputs, kw, torch_kw, _ = _unbatched_case(rng, which, norm_first, dtype)
    with torch.no_grad():
        r = ref(*map(to_torch, inputs), **torch_kw).numpy()
    out = ours(*inputs, **kw)
    assert out.shape == inputs[0 if which != "transformer" else 1].shape
    assert_close(out, r, dtype, what=f"unbatched {which}")
    batched_kw = {k: (m[None] if k.endswith("key_mask") else m) for k, m in kw.items()}
    np.testing.assert_array_equal(out, ours(*(x[None] for x in inputs), **batched_kw)[0])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
@pytest.mark.parametrize("which", ["layer", "stack", "transformer"])
@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
def test_unbatched_backward_matches_torch(rng, which, norm_first, dtype):
    """A training forward on unbatched inputs and its backward, as the encoder layer's: grad_output
    (T, E) -> the inputs' gradients in their own 2-D shapes, and every weight's gradient, as torch's
    autograd of the same unbatched call."""
    ours, ref, inputs, kw, torch_kw, g = _unbatched_case(rng, which, norm_first, dtype)
    leaves = [to_torch(x).requires_grad_(True) for x in inputs]
    ref.train()
    out_t = ref(*leaves, **torch_kw)
    (out_t * to_torch(g)).sum().backward()
    ours.train()
    assert_close(ours(*inputs, **kw), out_t.detach(), dtype, what="unbatched training output")
    with pytest.raises(ValueError, match="grad_output: expected shape"):
        ours.backward(g[None])
    grads = ours.backward(g)
    assert len(grads) == 2
    for ours_g, leaf, x in zip(grads, leaves, inputs):
        assert ours_g.shape == x.shape
        _assert_grad(ours_g, leaf.grad, dtype, "input gradient")
    mine = ours.gradients()
    for name, p in ref.named_parameters():
        _assert_grad(mine[name], p.grad, dtype, name)


def test_unbatched_errors_name_the_shapes_given(rng):
    layer = tc.nn.TransformerDecoderLayer(8, 2, 16)
    tgt, mem = randn(rng, (4, 8)), randn(rng, (6, 8))
    with pytest.raises(ValueError, match=r"^memory: expected shape \(S, 8\) as tgt is unbatched \(4, 8\), got "
                                         r"\(1, 6, 8\)$"):
        layer(tgt, mem[None])
    with pytest.raises(ValueError, match=r"^memory: expected shape \(1, S, 8\), got \(6, 8\)$"):
        layer(tgt[None], mem)
    with pytest.raises(ValueError, match=r"^tgt: expected last dim 8 \(d_model\), got shape \(4, 7\)$"):
        layer(randn(rng, (4, 7)), mem)
    with pytest.raises(ValueError, match=r"^tgt: expected \(N, T, E\) or \(T, E\), got shape \(1, 1, 4, 8\)$"):
        layer(tgt[None, None], mem)
    with pytest.raises(ValueError, match=r"^tgt_key_mask: expected shape \(4,\) \(T,\) for an unbatched tgt \(4, 8\) "
                                         r"\(T, E\) and memory \(6, 8\) \(S, E\), got \(1, 4\)$"):
        layer(tgt, mem, tgt_key_mask=np.ones((1, 4), bool))
    with pytest.raises(ValueError, match=r"^memory_key_mask: expected shape \(6,\) \(S,\)"):
        tc.nn.TransformerDecoder(layer, 2)(tgt, mem, memory_key_mask=np.ones(4, bool))
    with pytest.raises(ValueError, match=r"^memory_mask: expected a 3-D mask of shape \(2, 4, 6\)"):
        layer(tgt, mem, memory_mask=np.zeros((4, 4, 6), np.float32))
    model = tc.nn.Transformer(8, 2, 1, 1, 16)
    with pytest.raises(ValueError, match=r"^tgt: expected \(T, E\) as src is unbatched \(6, 8\), got shape "
                                         r"\(1, 4, 8\)$"):
        model(mem, tgt[None])
    with pytest.raises(ValueError, match=r"^tgt: expected \(N, T, E\) as src is batched \(1, 6, 8\), got shape "
                                         r"\(4, 8\)$"):
        model(mem[None], tgt)
    with pytest.raises(ValueError, match=r"^src_key_mask: expected shape \(6,\) \(S,\) for an unbatched src"):
        model(mem, tgt, src_key_mask=np.ones((1, 6), bool))
    with pytest.raises(ValueError, match=r"^tgt_key_mask: expected shape \(4,\) \(T,\)"):
        model(mem, tgt, tgt_key_mask=np.ones(6, bool))


# ------------------------------------------------------------------ torch's batch_first
@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
def test_decoder_layer_and_transformer_take_torchs_batch_first(rng):
    """torch's ``batch_first=True`` was an "unexpected keyword argument" of the decoder layer and of
    Transformer: it is their one layout (torch's batch_first=True output); False is a ValueError
    whose advice (transpose in and out) gives torch's batch_first=False output."""
    refusal = "batch_first: expected True, got False: this library's layers take batch-first (N, L, E) inputs only"
    ref = randomise_(torch.nn.TransformerDecoderLayer(8, 2, 16, 0.0, batch_first=True)).eval()
    ours = tc.nn.TransformerDecoderLayer(8, 2, 16, batch_first=True)
    ours.load_state_dict(module_state_to_numpy(ref))
    tgt, mem = randn(rng, (3, 4, 8)), randn(rng, (3, 6, 8))
    with torch.no_grad():
        r = ref(to_torch(tgt), to_torch(mem)).numpy()
    assert_close(ours(tgt, mem), r, np.float32, what="decoder layer, batch_first=True")
    with pytest.raises(ValueError, match="^" + re.escape(refusal)):
        tc.nn.TransformerDecoderLayer(8, 2, 16, batch_first=False)

    ref = randomise_(torch.nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True)).eval()
    ours = tc.nn.Transformer(8, 2, 1, 1, 16, batch_first=True)
    ours.load_state_dict(module_state_to_numpy(ref))
    src = randn(rng, (3, 6, 8))
    with torch.no_grad():
        r = ref(to_torch(src), to_torch(tgt)).numpy()
    assert_close(ours(src, tgt), r, np.float32, what="Transformer, batch_first=True")
    with pytest.raises(ValueError, match="^" + re.escape(refusal)) as info:
        tc.nn.Transformer(8, 2, 1, 1, 16, batch_first=False)
    assert "x.transpose(1, 0, 2)" in str(info.value)
    with pytest.raises(TypeError, match="batch_first: expected a bool"):
        tc.nn.Transformer(8, 2, 1, 1, 16, batch_first="yes")
    seq_first = randomise_(torch.nn.Transformer(8, 2, 1, 1, 16, dropout=0.0)).eval()  # torch's default layout
    ours.load_state_dict(module_state_to_numpy(seq_first))
    with torch.no_grad():
        r = seq_first(to_torch(src.transpose(1, 0, 2)), to_torch(tgt.transpose(1, 0, 2))).numpy()
    assert_close(ours(src, tgt).transpose(1, 0, 2), r, np.float32, what="the advice, transposed")


# ------------------------------------------------------------------ Seq2SeqTransformer's arguments
def test_seq2seq_arguments_after_the_vocabularies_are_keyword_only():
    """PyTorch's translation tutorial builds ``Seq2SeqTransformer(num_encoder_layers,
    num_decoder_layers, emb_size, nhead, src_vocab_size, tgt_vocab_size, dim_feedforward)``: seven
    ints that, read in this class's order, silently built another model (vocabularies 3 and 3, 50
    encoder and 40 decoder layers). Everything after the vocabularies is keyword-only now."""
    with pytest.raises(TypeError, match=r"takes 3 positional arguments but 8 were given"):
        tc.Seq2SeqTransformer(3, 3, 16, 2, 50, 40, 32)  # the tutorial's positional call
    with pytest.raises(TypeError, match="positional"):
        tc.Seq2SeqTransformer(50, 40, 16)
    m = tc.Seq2SeqTransformer(50, 40, d_model=16, nhead=2, num_encoder_layers=3, num_decoder_layers=2,
                              dim_feedforward=32, max_len=12)
    assert (m.src_vocab_size, m.tgt_vocab_size, m.d_model) == (50, 40, 16)
    assert (len(m.transformer.encoder.layers), len(m.transformer.decoder.layers)) == (3, 2)
    assert m.transformer.nhead == 2 and m.transformer.encoder.layers[0].dim_feedforward == 32
    shapes = m.parameter_shapes()
    assert shapes["src_tok_emb.weight"] == (50, 16) and shapes["generator.weight"] == (40, 16)
    assert shapes["transformer.encoder.layers.0.linear1.weight"] == (32, 16)
