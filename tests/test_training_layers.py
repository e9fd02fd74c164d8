"""Training of every nn layer: the backward passes against torch.autograd with copied weights.

For each layer: ours in training mode (``train()``, forward, ``backward(G)``) against torch's
autograd of ``sum(forward(x) · G)`` for a random G, on the same weights: the input's gradient and
every parameter's (by state_dict name) to fp64 <= 1e-10 and fp32 <= 1e-4 relative (to the largest
magnitude of the reference). Shapes are odd, L != S, with masks, causal, GQA/MQA, fully masked
rows, kdim != E, RoPE. Also: the training forward returns the eval forward's output bit for bit,
gradients accumulate until zero_grad, and backward without a training forward is an error.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import DTYPE_IDS, FLOAT_DTYPES, TORCH_DTYPE, module_state_to_numpy, randn, randomise_, to_torch

TOL = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 1e-4}


def assert_grad(ours, ref, dtype, what: str) -> None:
    """|ours - ref| <= tol · max(1, max|ref|) for fp64 (an absolute 1e-10 on O(1) values), and
    <= 1e-4 · max|ref| for fp32 (relative to the reference's largest magnitude)."""
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    assert ours is not None, f"{what}: no gradient"
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"
    assert np.all(np.isfinite(ours)), f"{what}: non-finite values"
    scale = float(np.abs(ref).max(initial=0.0))
    scale = max(1.0, scale) if np.dtype(dtype) == np.float64 else max(scale, 1e-30)
    err = float(np.abs(ours.astype(np.float64) - ref.astype(np.float64)).max(initial=0.0))
    assert err <= TOL[np.dtype(dtype)] * scale, f"{what}: max error {err:.3g} (scale {scale:.3g})"


def leaf(x: np.ndarray) -> torch.Tensor:
    return to_torch(x).requires_grad_(True)


def copy_into(ours: tc.nn.Module, ref: torch.nn.Module) -> None:
    ours.load_state_dict(module_state_to_numpy(ref))


def check_params(ours: tc.nn.Module, ref: torch.nn.Module, dtype, rename=None) -> None:
    grads = ours.gradients()
    for name, p in ref.named_parameters():
        key = rename(name) if rename else name
        assert_grad(grads.get(key), p.grad, dtype, key)


def torch_module(module: torch.nn.Module, dtype) -> torch.nn.Module:
    return randomise_(module.to(TORCH_DTYPE[np.dtype(dtype)]))


# --------------------------------------------------------------------------------------------------
# Linear, Embedding, norms, feed-forwards
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,out,bias", [((3, 5), 7, True), ((2, 3, 4), 1, True), ((7, 9), 65, False)])
def test_linear(rng, dtype, shape, out, bias):
    ref = torch_module(torch.nn.Linear(shape[-1], out, bias=bias), dtype)
    ours = tc.nn.Linear(shape[-1], out, bias=bias, dtype=dtype)
    copy_into(ours, ref)
    x, g = randn(rng, shape, dtype), randn(rng, shape[:-1] + (out,), dtype)
    xt = leaf(x)
    (ref(xt) * to_torch(g)).sum().backward()
    ours.train()
    y = ours(x)
    np.testing.assert_array_equal(y, ours.eval()(x))  # the training forward is the eval forward
    ours.train()
    ours(x)
    assert_grad(ours.backward(g), xt.grad, dtype, "grad_x")
    check_params(ours, ref, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_embedding(rng, dtype):
    ref = torch_module(torch.nn.Embedding(11, 5), dtype)
    ours = tc.nn.Embedding(11, 5, dtype=dtype).train()
    copy_into(ours, ref)
    ids = rng.integers(0, 11, (3, 7))
    ids[0, :3] = 4  # a repeated id: its gradient rows add
    g = randn(rng, (3, 7, 5), dtype)
    (ref(torch.from_numpy(ids)) * to_torch(g)).sum().backward()
    ours(ids)
    assert ours.backward(g) is None
    check_params(ours, ref, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", ["layer_norm", "layer_norm_no_bias", "rms_norm"])
@pytest.mark.parametrize("shape", [(3, 7), (2, 5, 65)])
def test_norms(rng, dtype, kind, shape):
    E = shape[-1]
    if kind == "rms_norm":
        ref, ours = torch.nn.RMSNorm(E, eps=1e-6), tc.nn.RMSNorm(E, eps=1e-6, dtype=dtype)
    else:
        bias = kind == "layer_norm"
        ref, ours = torch.nn.LayerNorm(E, bias=bias), tc.nn.LayerNorm(E, bias=bias, dtype=dtype)
    ref = torch_module(ref, dtype)
    copy_into(ours, ref)
    x, g = randn(rng, shape, dtype, 2.0), randn(rng, shape, dtype)
    xt = leaf(x)
    (ref(xt) * to_torch(g)).sum().backward()
    ours.train()
    np.testing.assert_array_equal(ours(x), ours.eval()(x))
    ours.train()
    ours(x)
    assert_grad(ours.backward(g), xt.grad, dtype, "grad_x")
    check_params(ours, ref, dtype)


class TorchFeedForward(torch.nn.Module):
    def __init__(self, E, F, act):
        super().__init__()
        self.linear1, self.linear2 = torch.nn.Linear(E, F), torch.nn.Linear(F, E)
        self.act = {"relu": torch.relu, "gelu": torch.nn.functional.gelu}[act]

    def forward(self, x):
        return self.linear2(self.act(self.linear1(x)))


class TorchGated(torch.nn.Module):
    """Hugging Face's LlamaMLP: down_proj(act(gate_proj(x)) · up_proj(x))."""

    def __init__(self, E, F, act, bias):
        super().__init__()
        self.gate_proj = torch.nn.Linear(E, F, bias=bias)
        self.up_proj = torch.nn.Linear(E, F, bias=bias)
        self.down_proj = torch.nn.Linear(F, E, bias=bias)
        self.act = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}[act]

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", ["relu", "gelu", "swiglu", "geglu_bias"])
def test_feed_forwards(rng, dtype, kind):
    E, F = 6, 11
    if kind in ("relu", "gelu"):
        ref, ours = TorchFeedForward(E, F, kind), tc.nn.FeedForward(E, F, kind, dtype=dtype)
    else:
        act, bias = ("silu", False) if kind == "swiglu" else ("gelu", True)
        ref, ours = TorchGated(E, F, act, bias), tc.nn.GatedFeedForward(E, F, act, bias=bias, dtype=dtype)
    ref = torch_module(ref, dtype)
    copy_into(ours, ref)
    x, g = randn(rng, (2, 5, E), dtype), randn(rng, (2, 5, E), dtype)
    xt = leaf(x)
    (ref(xt) * to_torch(g)).sum().backward()
    ours.train()
    np.testing.assert_array_equal(ours(x), ours.eval()(x))
    ours.train()
    ours(x)
    assert_grad(ours.backward(g), xt.grad, dtype, "grad_x")
    check_params(ours, ref, dtype)


# --------------------------------------------------------------------------------------------------
# Multi-head attention
# --------------------------------------------------------------------------------------------------

def torch_attention_ref(params: dict, q_in, k_in, v_in, H, Hkv, *, bool_mask=None, float_mask=None,
                        key_mask=None, causal=False, rotary=None, packed=True, dropout=None):
    """Multi-head attention in torch ops (GQA by repeating heads; our conventions for masks; a row that
    sees no key gives zeros), as a function of the parameter tensors. ``dropout``: an (N, H, L, S)
    tensor the probabilities are multiplied by (a dropout's keep / (1 - p))."""
    N, L, E = q_in.shape
    S = k_in.shape[1]
    D = E // H
    if packed:
        W = params["in_proj_weight"]
        Wq, Wk, Wv = W[:E], W[E:E + Hkv * D], W[E + Hkv * D:]
    else:
        Wq, Wk, Wv = params["q_proj_weight"], params["k_proj_weight"], params["v_proj_weight"]
    b = params.get("in_proj_bias")
    q = q_in @ Wq.T + (b[:E] if b is not None else 0)
    k = k_in @ Wk.T + (b[E:E + Hkv * D] if b is not None else 0)
    v = v_in @ Wv.T + (b[E + Hkv * D:] if b is not None else 0)
    q = q.reshape(N, L, H, D).transpose(1, 2)
    k = k.reshape(N, S, Hkv, D).transpose(1, 2)
    v = v.reshape(N, S, Hkv, D).transpose(1, 2)
    if rotary is not None:
        cos, sin = rotary  # (L, D) half-split tables

        def rot(t):
            t1, t2 = t[..., :D // 2], t[..., D // 2:]
            return t * cos + torch.cat([-t2, t1], dim=-1) * sin
        q, k = rot(q), rot(k)
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    s = q @ k.transpose(-2, -1) / math.sqrt(D)
    if float_mask is not None:
        s = s + float_mask
    allowed = torch.ones(N, H, L, S, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(L, S, dtype=torch.bool).tril()
    if bool_mask is not None:
        allowed = allowed & bool_mask
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    s = s.masked_fill(~allowed, float("-inf"))
    valid = ~torch.isneginf(s.detach()).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(~valid, 0.0), -1) * valid
    if dropout is not None:
        p = p * dropout
    ctx = (p @ v).transpose(1, 2).reshape(N, L, H * D)
    out = ctx @ params["out_proj.weight"].T
    if "out_proj.bias" in params:
        out = out + params["out_proj.bias"]
    return out


def run_mha(rng, dtype, *, E=12, H=4, Hkv=None, N=2, L=5, S=None, bias=True, kdim=None, vdim=None,
            mask=None, causal=False, rope=False, reference="manual"):
    Hkv = Hkv or H
    self_attention = S is None and kdim is None and vdim is None
    S = L if S is None else S
    ours = tc.nn.MultiheadAttention(E, H, bias=bias, num_key_value_heads=Hkv, kdim=kdim, vdim=vdim, dtype=dtype)
    state = {k: randn(rng, v.shape, dtype, 0.4) for k, v in ours.state_dict().items()}
    ours.load_state_dict(state)
    q = randn(rng, (N, L, E), dtype)
    k = None if self_attention else randn(rng, (N, S, kdim or E), dtype)
    v = None if self_attention else randn(rng, (N, S, vdim or E), dtype)
    g = randn(rng, (N, L, E), dtype)
    bool_mask = float_mask = key_mask = None
    if mask == "bool":
        bool_mask = rng.random((L, S)) < 0.7
        bool_mask[L // 2] = False  # a query row that sees nothing
    elif mask == "float":
        float_mask = randn(rng, (L, S), dtype)
        float_mask[0] = -np.inf     # a query row that sees nothing
    elif mask == "key_mask":
        key_mask = np.ones((N, S), bool)
        key_mask[0, S // 2:] = False
        key_mask[-1] = False        # a fully padded sequence: every row sees nothing
    rotary = tc.positional.RotaryEmbedding(E // H, 32, dtype=dtype) if rope else None
    # the layer's attn_mask is float (torch's name): a bool pattern (True = may attend) goes in as 0 / -inf
    kw = dict(attn_mask=tc.masks.to_additive(bool_mask, dtype) if bool_mask is not None else float_mask,
              key_mask=key_mask, is_causal=causal, rotary=rotary, need_weights=False)
    ours.train()
    out = ours(q, k, v, **kw)[0]
    if not rope:  # the eval forward: the same output bit for bit
        ours.eval()
        np.testing.assert_array_equal(out, ours(q, k, v, **kw)[0])
        ours.train()
        ours(q, k, v, **kw)
    grads = ours.backward(g)

    params = {name: leaf(x) for name, x in state.items()}
    qt = leaf(q)
    kt = qt if self_attention else leaf(k)
    vt = qt if self_attention else leaf(v)
    tables = None
    if rope:
        cos, sin = tc.positional.rotary_cos_sin(L, E // H, dtype=dtype)
        tables = (to_torch(cos), to_torch(sin))
    if reference == "torch":  # torch.nn.MultiheadAttention itself (no fully masked rows here)
        ref = torch.nn.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, batch_first=True)
        ref = ref.to(TORCH_DTYPE[np.dtype(dtype)])
        ref.load_state_dict({k_: to_torch(x) for k_, x in state.items()})
        am = None if bool_mask is None else ~to_torch(bool_mask)
        out_t = ref(qt, kt, vt, attn_mask=am, is_causal=False, need_weights=False)[0]
        params = dict(ref.named_parameters())
    else:
        out_t = torch_attention_ref(params, qt, kt, vt, H, Hkv,
                                    bool_mask=None if bool_mask is None else to_torch(bool_mask),
                                    float_mask=None if float_mask is None else to_torch(float_mask),
                                    key_mask=None if key_mask is None else to_torch(key_mask), causal=causal,
                                    rotary=tables, packed=ours._impl.packed)
    np.testing.assert_allclose(out, out_t.detach().numpy(), rtol=1e-4 if dtype == np.float32 else 1e-10,
                               atol=1e-5 if dtype == np.float32 else 1e-10)
    (out_t * to_torch(g)).sum().backward()
    if self_attention:
        assert_grad(grads, qt.grad, dtype, "grad_query")
    else:
        gq, gk, gv = grads
        assert_grad(gq, qt.grad, dtype, "grad_query")
        assert_grad(gk, kt.grad, dtype, "grad_key")
        assert_grad(gv, vt.grad, dtype, "grad_value")
    ours_grads = ours.gradients()
    for name, p in params.items():
        assert_grad(ours_grads.get(name), p.grad, dtype, name)


MHA_CASES = {
    "self": dict(),
    "self_odd": dict(E=9, H=3, L=7),
    "cross_L_ne_S": dict(L=4, S=9),
    "no_bias": dict(bias=False, L=3, S=6),
    "kdim_vdim": dict(kdim=5, vdim=7, L=4, S=6),
    "kdim_no_bias": dict(kdim=5, vdim=7, S=3, bias=False),
    "gqa": dict(H=4, Hkv=2, L=6),
    "mqa_cross": dict(H=4, Hkv=1, L=3, S=8),
    "causal": dict(causal=True, L=7),
    "causal_gqa": dict(H=6, Hkv=3, E=12, causal=True, L=9),
    "additive_from_bool_fully_masked_row": dict(mask="bool", L=5, S=8),
    "float_mask_fully_masked_row": dict(mask="float", L=6),
    "key_mask_padded_sequence": dict(mask="key_mask", N=3, L=4, S=7),
    "rope": dict(rope=True, E=16, L=6),
    "rope_gqa_causal": dict(rope=True, H=4, Hkv=2, causal=True, L=7, E=16),
    "tile_edge_65": dict(E=8, H=2, L=65, S=66, N=1),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", list(MHA_CASES), ids=list(MHA_CASES))
def test_multihead_attention(rng, dtype, case):
    run_mha(rng, dtype, **MHA_CASES[case])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", [dict(), dict(L=4, S=9, mask="bool_visible"), dict(kdim=5, vdim=3, S=6)],
                         ids=["self", "cross_bool_mask", "kdim_vdim"])
def test_multihead_attention_vs_torch_module(rng, dtype, case):
    """Against torch.nn.MultiheadAttention itself (its gradients by name)."""
    case = dict(case)
    if case.pop("mask", None):
        L, S = case["L"], case["S"]
        np.random.seed(0)
        # every row sees a key: torch's module gives NaN rows otherwise
        m = np.ones((L, S), bool)
        m[:, 1::2] = False
        case["mask"] = None
        ours_mask = m
    else:
        ours_mask = None
    if ours_mask is None:
        run_mha(rng, dtype, reference="torch", **case)
        return
    E, H = 12, 4
    ours = tc.nn.MultiheadAttention(E, H, dtype=dtype)
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True).to(TORCH_DTYPE[np.dtype(dtype)])
    randomise_(ref)
    copy_into(ours, ref)
    q, k = randn(rng, (2, case["L"], E), dtype), randn(rng, (2, case["S"], E), dtype)
    g = randn(rng, (2, case["L"], E), dtype)
    qt, kt = leaf(q), leaf(k)
    (ref(qt, kt, kt, attn_mask=~to_torch(ours_mask), need_weights=False)[0] * to_torch(g)).sum().backward()
    ours.train()
    ours(q, k, k, attn_mask=tc.masks.to_additive(ours_mask, dtype))
    gq, gk, gv = ours.backward(g)
    assert_grad(gq, qt.grad, dtype, "grad_query")
    assert_grad(gk + gv, kt.grad, dtype, "grad_key + grad_value (one array)")
    check_params(ours, ref, dtype)


# --------------------------------------------------------------------------------------------------
# Encoder and decoder layers, stacks, nn.Transformer
# --------------------------------------------------------------------------------------------------

def layer_masks(rng, N, L, S):
    src_key = np.ones((N, S), bool)
    src_key[0, S - 2:] = False
    return src_key


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
@pytest.mark.parametrize("activation,causal", [("relu", False), ("gelu", True)])
def test_encoder_layer(rng, dtype, norm_first, activation, causal):
    E, H, F, N, L = 12, 3, 20, 2, 7
    ref = torch_module(torch.nn.TransformerEncoderLayer(E, H, F, dropout=0.0, activation=activation,
                                                        batch_first=True, norm_first=norm_first), dtype)
    ours = tc.nn.TransformerEncoderLayer(E, H, F, activation, norm_first=norm_first, dtype=dtype)
    copy_into(ours, ref)
    x, g = randn(rng, (N, L, E), dtype), randn(rng, (N, L, E), dtype)
    key_mask = layer_masks(rng, N, L, L)
    xt = leaf(x)
    ref.train()
    cm = torch.nn.Transformer.generate_square_subsequent_mask(L, dtype=TORCH_DTYPE[np.dtype(dtype)]) if causal else None
    kpm = torch.zeros(N, L, dtype=TORCH_DTYPE[np.dtype(dtype)]).masked_fill(~to_torch(key_mask), float("-inf"))
    (ref(xt, src_mask=cm, src_key_padding_mask=kpm, is_causal=causal) * to_torch(g)).sum().backward()
    ours.train()
    out = ours(x, src_key_mask=key_mask, is_causal=causal)
    np.testing.assert_array_equal(out, ours.eval()(x, src_key_mask=key_mask, is_causal=causal))
    ours.train()
    ours(x, src_key_mask=key_mask, is_causal=causal)
    assert_grad(ours.backward(g), xt.grad, dtype, "grad_src")
    check_params(ours, ref, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_decoder_layer(rng, dtype, norm_first):
    E, H, F, N, T, S = 12, 4, 16, 2, 5, 8
    ref = torch_module(torch.nn.TransformerDecoderLayer(E, H, F, dropout=0.0, batch_first=True,
                                                        norm_first=norm_first), dtype)
    ours = tc.nn.TransformerDecoderLayer(E, H, F, norm_first=norm_first, dtype=dtype)
    copy_into(ours, ref)
    x, mem, g = randn(rng, (N, T, E), dtype), randn(rng, (N, S, E), dtype), randn(rng, (N, T, E), dtype)
    mem_key = layer_masks(rng, N, T, S)
    xt, mt = leaf(x), leaf(mem)
    ref.train()
    cm = torch.nn.Transformer.generate_square_subsequent_mask(T, dtype=TORCH_DTYPE[np.dtype(dtype)])
    kpm = torch.zeros(N, S, dtype=TORCH_DTYPE[np.dtype(dtype)]).masked_fill(~to_torch(mem_key), float("-inf"))
    (ref(xt, mt, tgt_mask=cm, memory_key_padding_mask=kpm, tgt_is_causal=True) * to_torch(g)).sum().backward()
    ours.train()
    out = ours(x, mem, memory_key_mask=mem_key, tgt_is_causal=True)
    np.testing.assert_array_equal(out, ours.eval()(x, mem, memory_key_mask=mem_key, tgt_is_causal=True))
    ours.train()
    ours(x, mem, memory_key_mask=mem_key, tgt_is_causal=True)
    gx, gm = ours.backward(g)
    assert_grad(gx, xt.grad, dtype, "grad_tgt")
    assert_grad(gm, mt.grad, dtype, "grad_memory")
    check_params(ours, ref, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_transformer_and_stacks(rng, dtype, norm_first):
    """nn.Transformer (encoder stack + decoder stack, each with its final norm) against torch's."""
    E, H, F, N, S, T = 8, 2, 12, 2, 6, 5
    ref = torch_module(torch.nn.Transformer(E, H, 2, 2, F, dropout=0.0, batch_first=True, norm_first=norm_first),
                       dtype)
    ours = tc.nn.Transformer(E, H, 2, 2, F, norm_first=norm_first, dtype=dtype)
    copy_into(ours, ref)
    src, tgt, g = randn(rng, (N, S, E), dtype), randn(rng, (N, T, E), dtype), randn(rng, (N, T, E), dtype)
    src_key = layer_masks(rng, N, S, S)
    st, tt = leaf(src), leaf(tgt)
    ref.train()
    td = TORCH_DTYPE[np.dtype(dtype)]
    kpm = torch.zeros(N, S, dtype=td).masked_fill(~to_torch(src_key), float("-inf"))
    cm = torch.nn.Transformer.generate_square_subsequent_mask(T, dtype=td)
    out_t = ref(st, tt, tgt_mask=cm, src_key_padding_mask=kpm, memory_key_padding_mask=kpm, tgt_is_causal=True)
    (out_t * to_torch(g)).sum().backward()
    ours.train()
    kw = dict(src_key_mask=src_key, memory_key_mask=src_key, tgt_is_causal=True)
    out = ours(src, tgt, **kw)
    np.testing.assert_allclose(out, out_t.detach().numpy(), atol=1e-4 if dtype == np.float32 else 1e-10)
    gs, gt = ours.backward(g)
    assert_grad(gs, st.grad, dtype, "grad_src")
    assert_grad(gt, tt.grad, dtype, "grad_tgt")
    check_params(ours, ref, dtype)


# --------------------------------------------------------------------------------------------------
# Accumulation, zero_grad, parameters, errors, dropout
# --------------------------------------------------------------------------------------------------

def test_gradients_accumulate_until_zero_grad(rng):
    layer = tc.nn.TransformerEncoderLayer(8, 2, 12, dtype=np.float64).train()
    x1, x2, g = randn(rng, (2, 3, 8), np.float64), randn(rng, (1, 5, 8), np.float64), randn(rng, (2, 3, 8), np.float64)
    layer(x1)
    layer.backward(g)
    first = layer.gradients()
    layer(x2)
    layer.backward(g[:1, :1].repeat(5, 1))
    second_alone = tc.nn.TransformerEncoderLayer(8, 2, 12, dtype=np.float64)
    second_alone.load_state_dict(layer.state_dict())
    second_alone.train()
    second_alone(x2)
    second_alone.backward(g[:1, :1].repeat(5, 1))
    both = layer.gradients()
    for name, gr in second_alone.gradients().items():
        np.testing.assert_allclose(both[name], first[name] + gr, rtol=1e-12, atol=1e-14, err_msg=name)
    params = dict(layer.named_parameters())
    assert all(p.grad is not None for p in params.values())
    layer.zero_grad()
    assert layer.gradients() == {}
    assert all(p.grad is None for p in params.values())
    # the parameters are zero-copy views: the optimizers update the C++ weights in place
    p = params["linear1.weight"]
    p.data[0, 0] = 123.0
    assert layer.state_dict()["linear1.weight"][0, 0] == 123.0


def linear_pair(rng):
    """A float64 Linear(3, 2) in training mode and torch's with the same weights."""
    ref = torch_module(torch.nn.Linear(3, 2), np.float64)
    ours = tc.nn.Linear(3, 2, dtype=np.float64)
    copy_into(ours, ref)
    return ours.train(), ref


def backward_both(rng, ours, ref) -> None:
    x, g = randn(rng, (4, 3), np.float64), randn(rng, (4, 2), np.float64)
    ours(x)
    ours.backward(g)
    (ref(leaf(x)) * to_torch(g)).sum().backward()


def test_setting_grad_to_none_clears_it_like_torch(rng):
    """``p.grad = None`` (torch's idiom for zero_grad) drops the gradient: grad reads None and the
    next backward writes a fresh gradient, not one added to the old (torch: the same)."""
    ours, ref = linear_pair(rng)
    backward_both(rng, ours, ref)
    for p in ours.parameters():
        p.grad = None
    for q in ref.parameters():
        q.grad = None
    assert all(p.grad is None for p in ours.parameters()) and ours.gradients() == {}
    backward_both(rng, ours, ref)
    grads = ours.gradients()
    assert sorted(grads) == ["bias", "weight"]
    for name, q in ref.named_parameters():
        np.testing.assert_allclose(grads[name], q.grad.numpy(), rtol=1e-12, atol=1e-14, err_msg=name)
        np.testing.assert_allclose(dict(ours.named_parameters())[name].grad, q.grad.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("via", ["optimizer", "module"])
@pytest.mark.parametrize("kind,config", [("AdamW", dict(lr=0.1, weight_decay=0.1)),
                                         ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.1))], ids=["AdamW", "SGD"])
def test_zero_grad_then_step_without_backward_matches_torch(rng, kind, config, via, set_to_none):
    """step, zero_grad(set_to_none), step without a backward: set_to_none=True leaves p.grad None
    and the second step changes nothing; set_to_none=False leaves zero arrays, which momentum /
    Adam's moments and the weight decay still move (torch: the same, value for value)."""
    ours, ref = linear_pair(rng)
    backward_both(rng, ours, ref)
    opt = getattr(tc.optim, kind)(ours.named_parameters(), **config)
    topt = getattr(torch.optim, kind)(ref.parameters(), foreach=False, **config)
    opt.step()
    topt.step()
    after_first = ours.state_dict()
    (opt if via == "optimizer" else ours).zero_grad(set_to_none=set_to_none)
    (topt if via == "optimizer" else ref).zero_grad(set_to_none=set_to_none)
    params = dict(ours.named_parameters())
    for name, q in ref.named_parameters():
        if set_to_none:
            assert params[name].grad is None and q.grad is None, name
        else:
            np.testing.assert_array_equal(params[name].grad, q.grad.numpy())
            assert not params[name].grad.any()
    opt.step()
    topt.step()
    state = ours.state_dict()
    for name, q in ref.named_parameters():
        np.testing.assert_allclose(state[name], q.detach().numpy(), rtol=1e-12, atol=1e-14, err_msg=name)
        assert np.array_equal(state[name], after_first[name]) == set_to_none, name
    assert sorted(ours.gradients()) == ([] if set_to_none else ["bias", "weight"])


def test_zero_grad_set_to_none_must_be_a_bool(rng):
    ours, _ = linear_pair(rng)
    backward_both(rng, ours, torch_module(torch.nn.Linear(3, 2), np.float64))
    before = ours.gradients()
    opt = tc.optim.SGD(ours.named_parameters(), lr=0.1)
    for zero_grad in (ours.zero_grad, opt.zero_grad, ours.parameters()[0].zero_grad):
        with pytest.raises(TypeError, match="set_to_none: expected a bool, got str 'no'"):
            zero_grad(set_to_none="no")
    after = ours.gradients()
    assert all(np.array_equal(before[k], after[k]) for k in before) and sorted(after) == sorted(before)


def test_parameters_are_views_named_as_state_dict():
    m = tc.nn.MultiheadAttention(8, 2, num_key_value_heads=1, dtype=np.float32)
    names = [n for n, _ in m.named_parameters()]
    assert names == list(m.state_dict())
    assert m.parameters()[0] is m.named_parameters()[0][1]  # the same objects every call
    for name, p in m.named_parameters():
        np.testing.assert_array_equal(p.data, m.state_dict()[name])


@pytest.mark.parametrize("make,call", [
    (lambda: tc.nn.Linear(3, 2), lambda m: m(np.ones((1, 3)))),
    (lambda: tc.nn.LayerNorm(3), lambda m: m(np.ones((1, 3)))),
    (lambda: tc.nn.FeedForward(3, 5), lambda m: m(np.ones((1, 3)))),
    (lambda: tc.nn.MultiheadAttention(4, 2), lambda m: m(np.ones((1, 2, 4)))),
    (lambda: tc.nn.TransformerEncoderLayer(4, 2, 8), lambda m: m(np.ones((1, 2, 4)))),
])
def test_backward_without_training_forward(make, call):
    m = make()
    with pytest.raises(tc.NoTrainingStateError, match="eval"):
        m.backward(np.ones((1, 2)))
    call(m)  # an eval forward keeps nothing
    with pytest.raises(tc.NoTrainingStateError):
        m.backward(np.ones((1, 2)))
    m.train()
    out = call(m)
    out = out[0] if isinstance(out, tuple) else out
    m.backward(np.ones_like(out))
    with pytest.raises(tc.NoTrainingStateError, match="one backward"):
        m.backward(np.ones_like(out))  # consumed


@pytest.mark.parametrize("make, x", [
    (lambda: tc.nn.Linear(3, 2), np.ones((4, 3))),
    (lambda: tc.nn.LayerNorm(3), np.ones((4, 3))),
    (lambda: tc.nn.RMSNorm(3), np.ones((4, 3))),
    (lambda: tc.nn.FeedForward(3, 5), np.ones((4, 3))),
    (lambda: tc.nn.Embedding(9, 3), np.array([[1, 2]])),
    (lambda: tc.nn.MultiheadAttention(4, 2), np.ones((1, 2, 4))),
    (lambda: tc.nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0), np.ones((1, 2, 4))),
    (lambda: tc.BertEmbeddings(tc.BertConfig(vocab_size=9, hidden_size=4, num_hidden_layers=0, num_attention_heads=1,
                                             intermediate_size=4, max_position_embeddings=8, hidden_dropout_prob=0.0)),
     np.array([[1, 2]])),
])
def test_backward_grad_output_of_the_wrong_shape(make, x):
    """Refused naming its expected shape, and the forward's state is kept: the corrected call
    then runs (the refused one consumed the state: NoTrainingStateError)."""
    m = make().train()
    out = m(x)
    out = out[0] if isinstance(out, tuple) else out
    with pytest.raises(ValueError, match=r"grad_output: expected shape"):
        m.backward(np.ones(out.shape + (1,)))
    m.backward(np.ones_like(out))


def test_training_forward_keeps_a_copy_of_the_input(rng):
    m = tc.nn.Linear(3, 2, dtype=np.float64).train()
    x = randn(rng, (4, 3), np.float64)
    m(x)
    x_before = x.copy()
    x[:] = 0.0  # the caller changes its array after the forward
    m.backward(np.ones((4, 2)))
    np.testing.assert_allclose(m.gradients()["weight"], np.ones((2, 4)) @ x_before)


def test_training_refuses_cache_and_weights_are_torchs(rng):
    """A training forward takes no KV cache. Its weights (need_weights, True by default as torch's)
    are torch's training forward's, and computing them changes neither the output nor the backward."""
    m = tc.nn.MultiheadAttention(4, 2).train()
    with pytest.raises(ValueError, match="past_key_values"):
        m(np.ones((1, 2, 4)), past_key_values=tc.KVCache(1, 1, 2, 2))
    m = tc.nn.MultiheadAttention(8, 2, dtype=np.float64)
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=True).double().train()
    m.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    q, kv, g = randn(rng, (2, 3, 8), np.float64), randn(rng, (2, 5, 8), np.float64), randn(rng, (2, 3, 8), np.float64)
    ref_out, ref_w = ref(to_torch(q), to_torch(kv), to_torch(kv))  # torch's defaults, in training mode
    m.train()
    out_plain, none = m(q, kv, kv, need_weights=False)
    grads_plain = m.backward(g)
    assert none is None
    out, w = m(q, kv, kv)
    np.testing.assert_array_equal(out, out_plain)
    np.testing.assert_allclose(out, ref_out.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w, ref_w.detach().numpy(), rtol=1e-12, atol=1e-12)
    for a, b in zip(m.backward(g), grads_plain):
        np.testing.assert_array_equal(a, b)


def test_dropout_seeded_and_its_backward_is_the_forwards_derivative(rng):
    """With dropout the layer is a fixed function of its input for a fixed seed: the same seed gives
    the same output, and the backward matches central finite differences (fp64)."""
    layer = tc.nn.TransformerEncoderLayer(6, 2, 10, dtype=np.float64, dropout=0.3, norm_first=True).train()
    x, g = randn(rng, (2, 4, 6), np.float64), randn(rng, (2, 4, 6), np.float64)
    tc.manual_seed(7)
    y1 = layer(x)
    layer.backward(g)
    tc.manual_seed(7)
    y2 = layer(x)
    np.testing.assert_array_equal(y1, y2)
    dx = layer.backward(g)
    assert not np.array_equal(y1, layer.eval()(x)), "dropout changed nothing"
    layer.train()
    eps = 1e-6
    for idx in [(0, 0, 0), (1, 3, 5), (0, 2, 3)]:
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        tc.manual_seed(7)
        fp = float((layer(xp) * g).sum())
        layer.backward(g)
        tc.manual_seed(7)
        fm = float((layer(xm) * g).sum())
        layer.backward(g)
        assert abs((fp - fm) / (2 * eps) - dx[idx]) < 1e-6, idx


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_bert_embeddings(rng, dtype):
    """tc.BertEmbeddings vs transformers' BertEmbeddings (word + position + token type, LayerNorm; the
    padding token's word row gets no gradient, as nn.Embedding(padding_idx=pad_token_id))."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.bert.modeling_bert import BertEmbeddings

    cfg = transformers.BertConfig(vocab_size=23, hidden_size=8, max_position_embeddings=12, type_vocab_size=2,
                                  hidden_dropout_prob=0.0, pad_token_id=0)
    ref = torch_module(BertEmbeddings(cfg), dtype)
    ours = tc.BertEmbeddings(tc.BertConfig.from_dict(cfg.to_dict()), dtype=dtype)
    ours.load_state_dict({k: v for k, v in module_state_to_numpy(ref).items() if not k.endswith("_ids")})
    ids = rng.integers(0, 23, (3, 7))
    ids[:, -2:] = 0  # padding tokens
    tt = rng.integers(0, 2, (3, 7))
    g = randn(rng, (3, 7, 8), dtype)
    (ref(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(tt)) * to_torch(g)).sum().backward()
    ours.train()
    out = ours(ids, tt)
    np.testing.assert_array_equal(out, ours.eval()(ids, tt))
    ours.train()
    ours(ids, tt)
    assert ours.backward(g) is None
    check_params(ours, ref, dtype)
    assert np.all(ours.gradients()["word_embeddings.weight"][0] == 0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_tutorial_embeddings(rng, dtype):
    """The encoder tutorial's Embeddings (token + learned position, LayerNorm) against the same in torch."""
    ours = tc.positional.Embeddings(17, 6, 10, dtype=dtype)
    state = {k: randn(rng, v.shape, dtype) for k, v in ours.state_dict().items()}
    ours.load_state_dict(state)
    ids = rng.integers(0, 17, (2, 9))
    g = randn(rng, (2, 9, 6), dtype)
    params = {k: leaf(v) for k, v in state.items()}
    x = params["token_embeddings.weight"][torch.from_numpy(ids)] + params["position_embeddings.weight"][:9]
    y = torch.nn.functional.layer_norm(x, (6,), params["layer_norm.weight"], params["layer_norm.bias"], eps=1e-12)
    (y * to_torch(g)).sum().backward()
    ours.train()
    ours(ids)
    ours.backward(g)
    grads = ours.gradients()
    for name, p in params.items():
        assert_grad(grads[name], p.grad, dtype, name)


def test_modules_start_in_eval_mode_and_the_docs_say_so(rng):
    """Unlike torch's modules (training mode when built), ours start in eval mode: a layer built with
    dropout applies none until ``train()``. The module doc, ``Module``, ``train()`` and the layers
    whose torch twins differ most (dropout, training forwards) say so."""
    x = randn(rng, (2, 3, 8))
    ours = tc.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.5)
    ref = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.5, batch_first=True)
    assert ref.training and not ours.training
    np.testing.assert_array_equal(ours(x), ours(x))  # no dropout: the same output twice
    with pytest.raises(tc.NoTrainingStateError):
        ours.backward(np.ones_like(x))  # an eval forward keeps nothing
    assert ours.train().training and not np.array_equal(ours(x), ours(x))  # dropout, two masks
    for module in (tc.nn.MultiheadAttention(8, 2), tc.nn.TransformerDecoderLayer(8, 2, 16),
                   tc.nn.Transformer(8, 2, 1, 1, 16), tc.nn.Linear(2, 3),
                   tc.Seq2SeqTransformer(5, 5, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                         dim_feedforward=16, max_len=4)):
        assert module.training is False, type(module).__name__
    docs = {"transformer_core.module": tc.module.__doc__, "Module": tc.module.Module.__doc__,
            "Module.train": tc.module.Module.train.__doc__, "transformer_core.nn": tc.nn.__doc__}
    docs.update({cls.__name__: cls.__doc__ for cls in (tc.nn.MultiheadAttention, tc.nn.TransformerEncoderLayer,
                                                       tc.nn.TransformerDecoderLayer, tc.nn.Transformer,
                                                       tc.Seq2SeqTransformer)})
    for name, doc in docs.items():
        text = " ".join(doc.split()).lower()
        assert "starts in eval mode" in text or "start in eval mode" in text, name
        assert "unlike torch" in text, name
