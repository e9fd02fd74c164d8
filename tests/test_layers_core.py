"""The basic layers vs torch: nn.Linear, nn.Embedding, nn.RMSNorm (and Hugging Face's LlamaRMSNorm),
the gated feed-forward (Hugging Face's LlamaMLP: SwiGLU; GeGLU), functional rms_norm / silu, and
MultiheadAttention with a KV cache and RoPE inside the call (against torch's SDPA with GQA on
rotated q, k).

Sizes cross the linear kernel's paths: rows 1..32 take the small-row kernel (kSmallRows = 32, in
blocks of 4 rows), more take GEMM tiles; output features cross the 64-wide small-row chunks and the
tiles.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformer_core as tc
from conftest import (
    DTYPE_IDS,
    FLOAT_DTYPES,
    TORCH_DTYPE,
    assert_close,
    module_state_to_numpy,
    randn,
    to_torch,
    torch_modules_as_ours,
)
from transformers.models.llama.configuration_llama import LlamaConfig as HFLlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, apply_rotary_pos_emb


def _load(ours, theirs):
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})


# ---------------------------------------------------------------------------------------- Linear
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows,fin,fout", [(1, 7, 5), (7, 33, 65), (8, 64, 64), (9, 17, 513), (31, 33, 70),
                                           (30, 16, 65), (32, 16, 65), (33, 17, 129), (65, 31, 129), (130, 96, 1030)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(rng, dtype, rows, fin, fout, bias):
    ref = torch.nn.Linear(fin, fout, bias=bias).to(TORCH_DTYPE[np.dtype(dtype)])
    ours = tc.nn.Linear(fin, fout, bias=bias, dtype=dtype)
    _load(ours, ref)
    x = randn(rng, (rows, fin), dtype)
    with torch.no_grad():
        assert_close(ours(x), ref(to_torch(x)), dtype, what="linear")
    x3 = randn(rng, (2, 3, fin), dtype)  # leading dims
    with torch.no_grad():
        assert_close(ours(x3), ref(to_torch(x3)), dtype, what="linear 3-D")


def test_linear_bad_input():
    lin = tc.nn.Linear(4, 3)
    with pytest.raises(ValueError, match="in_features"):
        lin(np.ones((2, 5)))
    with pytest.raises(ValueError, match="in_features"):
        tc.nn.Linear(0, 3)
    with pytest.raises(TypeError, match="out_features"):
        tc.nn.Linear(3, 2.5)


# ------------------------------------------------------------------------------------- Embedding
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(1,), (5,), (3, 7), (2, 3, 4)])
def test_embedding_matches_torch(rng, dtype, shape):
    ref = torch.nn.Embedding(23, 9).to(TORCH_DTYPE[np.dtype(dtype)])
    ours = tc.nn.Embedding(23, 9, dtype=dtype)
    _load(ours, ref)
    ids = rng.integers(0, 23, size=shape)
    with torch.no_grad():
        expected = ref(torch.from_numpy(ids)).numpy()
    np.testing.assert_array_equal(ours(ids), expected)


def test_embedding_bad_input():
    emb = tc.nn.Embedding(10, 4)
    with pytest.raises(ValueError, match="input_ids: id 10 at flat index 2"):
        emb([1, 2, 10])
    with pytest.raises(ValueError, match="input_ids: id -1"):
        emb([[-1]])
    with pytest.raises(TypeError, match="input_ids"):
        emb([0.5])


def test_embedding_names_torchs_positional_padding_idx():
    """torch's third positional argument is padding_idx (``nn.Embedding(10, 4, 0)``), this layer's
    dtype: the error blamed the dtype only ("dtype: expected float32 or float64, got 0")."""
    hint = "(torch's third positional argument is padding_idx, this layer's is dtype: pass padding_idx= by keyword)"
    for third in (0, 3, np.int64(2), True, "not a dtype"):  # None: float32, torch's default dtype
        with pytest.raises(TypeError, match=re.escape(f"dtype: expected float32 or float64, got {third!r} {hint}")):
            tc.nn.Embedding(10, 4, third)
    for dtype in (np.int64, "float16"):  # a dtype, of the wrong kind: the dtype's message alone
        with pytest.raises(TypeError, match=r"^dtype: expected float32 or float64, got (int64|float16)$"):
            tc.nn.Embedding(10, 4, dtype)
    ref = torch.nn.Embedding(10, 4, 0)  # what torch's call means, by keyword here
    ours = tc.nn.Embedding(10, 4, padding_idx=0)
    assert ours.padding_idx == ref.padding_idx == 0
    np.testing.assert_array_equal(ours.state_dict()["weight"][0], ref.weight.detach().numpy()[0])  # zeros


# --------------------------------------------------------------------------------------- RMSNorm
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (4, 64), (2, 5, 576), (9, 1001)])
def test_rms_norm_matches_torch(rng, dtype, shape):
    E = shape[-1]
    ref = torch.nn.RMSNorm(E, eps=1e-5).to(TORCH_DTYPE[np.dtype(dtype)])
    with torch.no_grad():
        ref.weight.copy_(torch.randn(E, dtype=ref.weight.dtype) * 0.3 + 1)
    ours = tc.nn.RMSNorm(E, eps=1e-5, dtype=dtype)
    _load(ours, ref)
    x = randn(rng, shape, dtype, scale=3.0)
    with torch.no_grad():
        assert_close(ours(x), ref(to_torch(x)), dtype, what="RMSNorm")
    assert_close(tc.functional.rms_norm(x, ours.state_dict()["weight"], eps=1e-5), ours(x), dtype)
    # torch's default eps is the dtype's machine epsilon
    assert tc.nn.RMSNorm(E, dtype=dtype).eps == np.finfo(dtype).eps


def test_rms_norm_matches_hf_llama_rmsnorm(rng):
    ref = LlamaRMSNorm(576, eps=1e-5)
    with torch.no_grad():
        ref.weight.copy_(torch.rand(576) + 0.5)
    ours = tc.nn.RMSNorm(576, eps=1e-5)
    _load(ours, ref)
    x = randn(rng, (3, 17, 576), np.float32, scale=5.0)
    with torch.no_grad():
        assert_close(ours(x), ref(to_torch(x)), np.float32, what="LlamaRMSNorm")


def test_rms_norm_bad_input():
    with pytest.raises(ValueError, match="eps"):
        tc.nn.RMSNorm(4, eps=-1.0)
    with pytest.raises(ValueError, match="eps"):
        tc.functional.rms_norm(np.ones((2, 4)), eps=float("nan"))
    with pytest.raises(ValueError, match="weight"):
        tc.functional.rms_norm(np.ones((2, 4)), weight=np.ones(3))
    with pytest.raises(ValueError, match="last dim"):
        tc.nn.RMSNorm(4)(np.ones((2, 5)))


# ----------------------------------------------------------------- norms without elementwise_affine
def _norm_pairs(E, dtype):
    """(ours, torch's) built with the same positional arguments, torch's signatures: LayerNorm
    (normalized_shape, eps, elementwise_affine, bias), RMSNorm (normalized_shape, eps,
    elementwise_affine)."""
    tdt = TORCH_DTYPE[np.dtype(dtype)]
    return [(tc.nn.LayerNorm(E, 1e-5, False, dtype=dtype), torch.nn.LayerNorm(E, 1e-5, False, dtype=tdt)),
            (tc.nn.LayerNorm(E, 1e-3, False, True, dtype=dtype), torch.nn.LayerNorm(E, 1e-3, False, True, dtype=tdt)),
            (tc.nn.LayerNorm(E, 1e-5, True, False, dtype=dtype), torch.nn.LayerNorm(E, 1e-5, True, False, dtype=tdt)),
            (tc.nn.RMSNorm(E, 1e-6, False, dtype=dtype), torch.nn.RMSNorm(E, 1e-6, False, dtype=tdt)),
            (tc.nn.RMSNorm(E, None, False, dtype=dtype), torch.nn.RMSNorm(E, None, False, dtype=tdt))]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("E", [1, 7, 64])
def test_norms_take_torchs_elementwise_affine(rng, dtype, E):
    """torch's third positional argument of LayerNorm and RMSNorm is elementwise_affine (LayerNorm's
    bias comes after it): LayerNorm(E, 1e-5, False) was LayerNorm(E, 1e-5, bias=False) here, with a
    weight torch's has not. Without it: no parameters at all (torch's state_dict, loadable both
    ways), the forward and the backward's grad_x are torch's, and no gradient is exposed."""
    x, g = randn(rng, (3, 5, E), dtype, scale=2.0) + 1.0, randn(rng, (3, 5, E), dtype)
    for ours, ref in _norm_pairs(E, dtype):
        what = repr(ref)
        ref_state = module_state_to_numpy(ref)
        assert list(ours.state_dict()) == list(ref_state), what
        assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()], what
        ours.load_state_dict(ref_state)  # torch's state_dict loads (an empty one where it has no parameters)
        xt = to_torch(x).requires_grad_(True)
        ref_out = ref(xt)
        (ref_out * to_torch(g)).sum().backward()
        assert_close(ours(x), ref_out.detach(), dtype, what=f"{what} forward")
        ours.train()
        ours(x)
        assert_close(ours.backward(g), xt.grad, dtype, what=f"{what} grad_x")
        grads = ours.gradients()
        assert list(grads) == [n for n, _ in ref.named_parameters()], what
        for n, p in ref.named_parameters():
            assert_close(grads[n], p.grad, dtype, atol_=1e-4 if dtype == np.float32 else 1e-10, what=f"{what} {n}")
        ours.eval()
    without = tc.nn.LayerNorm(E, elementwise_affine=False, dtype=dtype)
    with pytest.raises(ValueError, match="weight"):  # a key it has no parameter for, as torch's strict load
        without.load_state_dict({"weight": np.ones(E, dtype)})
    with pytest.raises(TypeError, match="elementwise_affine"):
        tc.nn.RMSNorm(E, 1e-6, np.float64)  # the old third positional argument (dtype) is refused by name


# ------------------------------------------------------------------------- fresh layers' weights
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("E", [1, 7, 64])
def test_fresh_norm_layers_match_torch(rng, dtype, E):
    """Fresh layers, nothing loaded: torch's norms start at weight ones, bias zeros (a fresh
    RMSNorm's weight was zeros: its output was 0)."""
    tdt = TORCH_DTYPE[np.dtype(dtype)]
    x = randn(rng, (3, 5, E), dtype, scale=2.0)
    pairs = [(tc.nn.RMSNorm(E, dtype=dtype), torch.nn.RMSNorm(E, dtype=tdt)),
             (tc.nn.RMSNorm((E,), eps=1e-6, dtype=dtype), torch.nn.RMSNorm((E,), eps=1e-6, dtype=tdt)),
             (tc.nn.LayerNorm(E, dtype=dtype), torch.nn.LayerNorm(E, dtype=tdt)),
             (tc.nn.LayerNorm(E, bias=False, dtype=dtype), torch.nn.LayerNorm(E, bias=False, dtype=tdt))]
    for ours, ref in pairs:
        for name, value in ref.state_dict().items():
            np.testing.assert_array_equal(ours.state_dict()[name], value.numpy(), err_msg=f"{type(ours).__name__}.{name}")
        with torch.no_grad():
            assert_close(ours(x), ref(to_torch(x)), dtype, what=f"fresh {type(ours).__name__}")
        assert ours.normalized_shape == tuple(ref.normalized_shape) == (E,), type(ours).__name__  # torch's attribute


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_fresh_embedding_init_is_standard_normal(dtype):
    """torch's N(0, 1), drawn from the package generator's next seed (manual_seed chooses it; the
    same values as one draw of the whole table), the padding row zeros."""
    tc.manual_seed(11)
    expected = np.random.default_rng(tc.module.next_seed()).standard_normal((37, 5))
    tc.manual_seed(11)
    np.testing.assert_array_equal(tc.nn.Embedding(37, 5, dtype).state_dict()["weight"], expected.astype(dtype))
    expected[-2] = 0
    tc.manual_seed(11)
    np.testing.assert_array_equal(tc.nn.Embedding(37, 5, dtype, padding_idx=-2).state_dict()["weight"],
                                  expected.astype(dtype))


# ------------------------------------------------------------------------------ activations
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_silu_matches_torch(rng, dtype):
    x = randn(rng, (7, 333), dtype, scale=6.0)
    x[0, :4] = [0.0, -0.0, 90.0, -90.0]
    assert_close(tc.functional.silu(x), F.silu(to_torch(x)), dtype, what="silu")


# ------------------------------------------------------------------------------- gated FFN
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows,E,Fh", [(1, 8, 12), (7, 48, 80), (9, 64, 130), (70, 576, 1536)])
def test_gated_feed_forward_matches_llama_mlp(rng, dtype, rows, E, Fh):
    cfg = HFLlamaConfig(hidden_size=E, intermediate_size=Fh, num_attention_heads=1, num_key_value_heads=1,
                        hidden_act="silu", mlp_bias=False)
    ref = LlamaMLP(cfg).to(TORCH_DTYPE[np.dtype(dtype)])
    ours = tc.nn.GatedFeedForward(E, Fh, dtype=dtype)
    _load(ours, ref)
    x = randn(rng, (rows, E), dtype)
    with torch.no_grad():
        assert_close(ours(x), ref(to_torch(x)), dtype, what="SwiGLU")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_geglu_with_bias_matches_torch(rng, dtype):
    E, Fh = 24, 40
    t = TORCH_DTYPE[np.dtype(dtype)]
    gate, up, down = (torch.nn.Linear(E, Fh).to(t), torch.nn.Linear(E, Fh).to(t), torch.nn.Linear(Fh, E).to(t))
    ours = tc.nn.GatedFeedForward(E, Fh, activation="gelu", bias=True, dtype=dtype)
    ours.load_state_dict({f"{n}.{p}": getattr(m, p).detach().numpy() for n, m in
                          (("gate_proj", gate), ("up_proj", up), ("down_proj", down)) for p in ("weight", "bias")})
    x = randn(rng, (11, E), dtype)
    with torch.no_grad():
        xt = to_torch(x)
        ref = down(F.gelu(gate(xt)) * up(xt))
    assert_close(ours(x), ref, dtype, what="GeGLU")
    assert list(ours.parameter_shapes()) == ["gate_proj.weight", "gate_proj.bias", "up_proj.weight", "up_proj.bias",
                                             "down_proj.weight", "down_proj.bias"]


# ------------------------------------------------- attention with a KV cache and RoPE inside
def _torch_rope_gqa_attention(x, w_qkv, w_o, H, Hkv, D, cos, sin, past_k=None, past_v=None):
    """Reference: q, k, v projections, HF's apply_rotary_pos_emb, bottom-right causal SDPA over
    past + new with GQA, output projection. Returns (out, k_all, v_all)."""
    N, L, E = x.shape
    qkv = x @ w_qkv.T
    q = qkv[..., :H * D].reshape(N, L, H, D).transpose(1, 2)
    k = qkv[..., H * D:(H + Hkv) * D].reshape(N, L, Hkv, D).transpose(1, 2)
    v = qkv[..., (H + Hkv) * D:].reshape(N, L, Hkv, D).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if past_k is not None:
        k, v = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
    S = k.shape[2]
    mask = torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2).reshape(N, L, H * D) @ w_o.T, k, v


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("H,Hkv", [(4, 4), (6, 2), (3, 1)], ids=["mha", "gqa3", "mqa"])
def test_mha_with_cache_and_rope_matches_torch(rng, dtype, H, Hkv):
    D, N, P, T = 8, 2, 5, 4
    E = H * D
    t = TORCH_DTYPE[np.dtype(dtype)]
    mha = tc.nn.MultiheadAttention(E, H, bias=False, num_key_value_heads=Hkv, dtype=dtype)
    state = mha.state_dict()
    w_qkv, w_o = to_torch(state["in_proj_weight"]), to_torch(state["out_proj.weight"])
    rope = tc.positional.RotaryEmbedding(D, 64, base=500.0, dtype=dtype)
    cos_all, sin_all = (to_torch(a)[None] for a in tc.positional.rotary_cos_sin(64, D, base=500.0, dtype=dtype))
    x = randn(rng, (N, P + T, E), dtype)
    cache = tc.KVCache(1, N, Hkv, D, dtype=dtype)
    # the prompt, then T single-token steps
    out0, _ = mha(x[:, :P], is_causal=True, past_key_values=cache, rotary=rope)
    assert cache.length == P
    ref0, k, v = _torch_rope_gqa_attention(to_torch(x[:, :P]), w_qkv, w_o, H, Hkv, D, cos_all[:, :P], sin_all[:, :P])
    assert_close(out0, ref0, dtype, what="prompt")
    for step in range(T):
        p = P + step
        out, _ = mha(x[:, p:p + 1], is_causal=True, past_key_values=cache, rotary=rope)
        ref, k, v = _torch_rope_gqa_attention(to_torch(x[:, p:p + 1]), w_qkv, w_o, H, Hkv, D,
                                              cos_all[:, p:p + 1], sin_all[:, p:p + 1], k, v)
        assert_close(out, ref, dtype, what=f"step {step}")
    keys, values = cache[0]
    assert_close(keys, k.to(t), dtype, what="cached keys (rotated)")
    assert_close(values, v.to(t), dtype, what="cached values")
    np.testing.assert_array_equal(cache[-1][0], keys)  # negative indices as a list's
    for bad in (1, -2):  # out of range on either side: IndexError both (-2 was a ValueError)
        with pytest.raises(IndexError, match=r"^layer: expected an index in \[-1, 1\)"):
            cache[bad]
    with pytest.raises(TypeError, match="layer"):
        cache[0.0]
    # explicit position_ids give the same as the default past + l
    cache2 = tc.KVCache(1, N, Hkv, D, dtype=dtype)
    out2, _ = mha(x[:, :P], is_causal=True, past_key_values=cache2, rotary=rope,
                  position_ids=np.broadcast_to(np.arange(P), (N, P)))
    assert_close(out2, out0, dtype, atol_=0.0, what="explicit positions")
    # Hugging Face's shared positions, (1, P) or (P,), broadcast over the batch: the same values
    for shared in (np.arange(P)[None], np.arange(P)):
        cache3 = tc.KVCache(1, N, Hkv, D, dtype=dtype)
        out3, _ = mha(x[:, :P], is_causal=True, past_key_values=cache3, rotary=rope, position_ids=shared)
        assert_close(out3, out0, dtype, atol_=0.0, what=f"shared positions {shared.shape}")


def test_mha_cache_bad_input():
    mha = tc.nn.MultiheadAttention(16, 4, num_key_value_heads=2)
    x = np.ones((2, 3, 16), np.float32)
    with pytest.raises(ValueError, match="past_key_values"):
        mha(x, past_key_values=tc.KVCache(1, 2, 4, 4))  # wrong number of kv heads
    with pytest.raises(ValueError, match="self-attention"):
        mha(x, x[:, :2], x[:, :2], past_key_values=tc.KVCache(1, 2, 2, 4))
    # a rotary table of the wrong head_dim is a wrong value (it was a TypeError); a wrong type or dtype stays one
    with pytest.raises(ValueError, match=re.escape("rotary: expected a RotaryEmbedding of head_dim 4 (embed_dim 16 / "
                                                   "num_heads 4), got head_dim 8")):
        mha(x, rotary=tc.positional.RotaryEmbedding(8, 16))
    with pytest.raises(TypeError, match=r"^rotary: expected a RotaryEmbedding of dtype float32 .*float64"):
        mha(x, rotary=tc.positional.RotaryEmbedding(4, 16, dtype=np.float64))
    with pytest.raises(TypeError, match=r"^rotary: expected a RotaryEmbedding of dtype float32 .*got \(array"):
        mha(x, rotary=tc.positional.rotary_cos_sin(3, 4))
    with pytest.raises(ValueError, match="position_ids"):
        mha(x, rotary=tc.positional.RotaryEmbedding(4, 16), position_ids=[[0, 1, 16], [0, 1, 2]])
    with pytest.raises(TypeError, match=r"^position_ids: expected integer positions"):  # was "token ids"
        mha(x, rotary=tc.positional.RotaryEmbedding(4, 16), position_ids=[[0, 1.5, 2], [0, 1, 2]])
    with pytest.raises(ValueError, match=r"^position_ids: expected shape \(2, 3\)"):  # (1, L) is shared; (3, L) not
        mha(x, rotary=tc.positional.RotaryEmbedding(4, 16), position_ids=np.zeros((3, 3), int))



# ------------------------------------------------- self-attention given as query, key, value
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_mha_self_attention_given_as_the_same_data_three_times(rng, dtype):
    """``mha(x, x, x)`` is self-attention, which rotary and a KV cache need, when key and value are
    the query's data: a torch tensor passed three times (each converted to its own numpy view) was
    refused ("needs self-attention"), though the same numpy array passed three times was taken. A
    copy of the query is cross-attention (over equal values) and stays refused."""
    mha = tc.nn.MultiheadAttention(16, 4, num_key_value_heads=2, dtype=dtype)
    rope = tc.positional.RotaryEmbedding(4, 16, dtype=dtype)
    x = randn(rng, (2, 5, 16), dtype)
    want, want_w = mha(x, is_causal=True, rotary=rope)
    xt = torch.from_numpy(x)
    for q, k, v in ((xt, xt, xt), (xt, None, xt), (x, x[:], x.view()), (xt, x, xt.numpy())):
        out, w = mha(q, k, v, is_causal=True, rotary=rope)
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(w, want_w)
    out, _ = mha(xt[0], xt[0], xt[0], is_causal=True, rotary=rope)  # unbatched
    np.testing.assert_array_equal(out, want[0])
    cache = tc.KVCache(1, 2, 2, 4, dtype=dtype)
    out, _ = mha(xt[:, :3], xt[:, :3], xt[:, :3], is_causal=True, rotary=rope, past_key_values=cache)
    assert_close(out, want[:, :3], dtype)
    out, _ = mha(xt[:, 3:], xt[:, 3:], xt[:, 3:], is_causal=True, rotary=rope, past_key_values=cache)
    assert cache.length == 5
    assert_close(out, want[:, 3:], dtype, what="the cached steps, tensors given three times")
    # the same memory seen otherwise is not the query: a copy, a reversed view, a slice
    for other in (x.copy(), x[:, ::-1], x[:, :4]):
        with pytest.raises(ValueError, match=r"^key, value: a KV cache or a rotary embedding needs self-attention"):
            mha(x, other, other, rotary=rope)
    # a training forward of the tensors given three times: the same gradients as the self-attention's
    g = randn(rng, (2, 5, 16), dtype)
    mha.train()
    mha(x, is_causal=True, rotary=rope)
    dq = mha.backward(g)
    weight_grads = mha.gradients()
    mha.zero_grad()
    mha(xt, xt, xt, is_causal=True, rotary=rope)
    grads = mha.backward(g)  # one array given three times: all of its gradient in grad_query
    np.testing.assert_array_equal(grads[0], dq)
    assert not grads[1].any() and not grads[2].any()
    for name, value in mha.gradients().items():
        np.testing.assert_array_equal(value, weight_grads[name], err_msg=name)


# -------------------------------------------------------------- the sinusoidal table's precision
def test_sinusoidal_table_precision_is_as_documented():
    """PositionalEncoding's table is within 3e-8 of the exact values (float64 angles, rounded once);
    the tutorials' float32 torch table is off by up to 3.9e-4 over its 5,000 positions (d_model 512):
    the numbers the docstrings give, checked here so that they cannot go stale silently."""
    d, L = 512, 5000
    angle = np.arange(L, dtype=np.float64)[:, None] / 10000.0 ** (np.arange(0, d, 2) / d)
    exact = np.empty((L, d))
    exact[:, 0::2], exact[:, 1::2] = np.sin(angle), np.cos(angle)
    ours = tc.positional.PositionalEncoding(d).pe
    assert ours.shape == (L, d) and ours.dtype == np.float32
    np.testing.assert_array_equal(ours, tc.positional.sinusoidal_positional_encoding(L, d))
    ours_err = float(np.abs(ours - exact).max())
    assert ours_err <= 3e-8, ours_err  # half a float32 ulp of 1 is 2**-25 = 2.98e-8
    # the tutorials' PositionalEncoding (and PyTorch's translation tutorial's), in float32
    position = torch.arange(0, L).unsqueeze(1).float()
    div_term = torch.exp(torch.arange(0, d, 2).float() * (-math.log(10000.0) / d))
    tutorial = torch.zeros(L, d)
    tutorial[:, 0::2] = torch.sin(position * div_term)
    tutorial[:, 1::2] = torch.cos(position * div_term)
    tutorial_err = float(np.abs(tutorial.numpy() - exact).max())
    assert 3.5e-4 < tutorial_err < 4.0e-4, tutorial_err  # "up to 3.9e-4"
    assert 3.5e-4 < float(np.abs(tutorial.numpy() - ours).max()) < 4.0e-4
    first_100 = float(np.abs(tutorial.numpy()[:100] - exact[:100]).max())
    assert first_100 < 1e-5, first_100  # "~7e-6 over positions 0..100"
    for doc in (tc.positional.sinusoidal_positional_encoding.__doc__, tc.positional.PositionalEncoding.__doc__):
        assert "3.9e-4" in doc and "3e-8" in doc


# ------------------------------------------------- torch's module API: names and order of the same architectures
#: The layers this library holds as one C++ object (no modules under them).
def _architectures():
    d, h, f = 8, 2, 16
    return {
        "encoder_layer": (lambda: tc.nn.TransformerEncoderLayer(d, h, f, dtype=np.float64),
                          lambda: torch.nn.TransformerEncoderLayer(d, h, f, batch_first=True)),
        "decoder_layer": (lambda: tc.nn.TransformerDecoderLayer(d, h, f, dtype=np.float64),
                          lambda: torch.nn.TransformerDecoderLayer(d, h, f, batch_first=True)),
        "encoder_3": (lambda: tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(d, h, f, dtype=np.float64), 3,
                                                       tc.nn.LayerNorm(d, dtype=np.float64)),
                      lambda: torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(d, h, f, batch_first=True), 3,
                                                          torch.nn.LayerNorm(d), enable_nested_tensor=False)),
        "mha": (lambda: tc.nn.MultiheadAttention(d, h, dtype=np.float64),
                lambda: torch.nn.MultiheadAttention(d, h, batch_first=True)),
        "transformer": (lambda: tc.nn.Transformer(d, h, 2, 2, f, dtype=np.float64),
                        lambda: torch.nn.Transformer(d, h, 2, 2, f, batch_first=True)),
        "linear": (lambda: tc.nn.Linear(d, f, dtype=np.float64), lambda: torch.nn.Linear(d, f)),
        "layer_norm": (lambda: tc.nn.LayerNorm(d, dtype=np.float64), lambda: torch.nn.LayerNorm(d)),
    }


@pytest.mark.parametrize("arch", list(_architectures()))
def test_module_api_names_and_order_match_torchs_architecture(arch):
    """The torch Module API added (named_modules, modules, named_children, apply, and the keyword
    arguments of named_parameters and state_dict) gives, for the same architecture, torch's names in
    torch's order: every parameter and state-dict name (also with a prefix), and torch's modules less
    the ModuleLists and a layer's insides (one C++ object here, as the docstring of named_modules says);
    the values are torch's once its state dict is loaded."""
    make_ours, make_torch = _architectures()[arch]
    ours, theirs = make_ours(), make_torch().double()
    _load(ours, theirs)
    names = [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_parameters()] == names and list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_parameters(prefix="net")] == [n for n, _ in theirs.named_parameters(prefix="net")]
    assert list(ours.state_dict(prefix="net.")) == list(theirs.state_dict(prefix="net."))
    assert len(ours.parameters()) == len(list(theirs.parameters()))
    kept = ours.state_dict(keep_vars=True)
    for name, p in theirs.state_dict(keep_vars=True).items():
        np.testing.assert_array_equal(kept[name].data, p.detach().numpy(), err_msg=name)
    modules = [(n, type(m).__name__) for n, m in ours.named_modules()]
    assert modules == torch_modules_as_ours(theirs)
    assert [type(m).__name__ for m in ours.modules()] == [c for _, c in modules]
    top = {n for n, _ in torch_modules_as_ours(theirs) if n and "." not in n}
    children = [n for n, _ in ours.named_children()]
    if arch == "encoder_3":  # torch's child "layers" is the ModuleList: ours are its items
        assert children == ["layers.0", "layers.1", "layers.2", "norm"] and top == {"norm"}
    else:
        assert children == [n for n, _ in theirs.named_children() if n in top]
    visited, torch_visited = [], []
    ours.apply(lambda m: visited.append(type(m).__name__))
    kept_modules = {id(m) for n, m in theirs.named_modules() if (n, type(m).__name__) in modules}
    theirs.apply(lambda m: torch_visited.append(type(m).__name__) if id(m) in kept_modules else None)
    assert visited == torch_visited and visited[-1] == modules[0][1]
    if arch in ("linear", "layer_norm"):  # a leaf: its own parameters are torch's
        assert [n for n, _ in ours.named_parameters(recurse=False)] == [n for n, _ in
                                                                         theirs.named_parameters(recurse=False)]
