"""Positional encodings against the tutorials' torch code, computed here.

* sinusoidal table (the tutorials' ``PositionalEncoding``, the encoder–decoder and training tutorials, the einsum tutorial's MATLAB loop),
* the encoder tutorial's ``Embeddings`` (token + learned positions + LayerNorm),
* RoPE (the tutorials' ``rotate_half`` / ``apply_rotary_pos_emb``; Hugging Face Llama's table; the
  interleaved GPT-J / Meta layout via ``torch.view_as_complex``), incl. the relative-position
  property ``<RoPE(q, m), RoPE(k, n)> = f(m - n)``.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import DTYPE_IDS, FLOAT_DTYPES, TORCH_DTYPE, assert_close, module_state_to_numpy, randn, to_torch
from torch import nn
from transformer_core import positional as P

# --------------------------------------------------------------------------------------------------
# The tutorials' torch code (dtype made a parameter so the reference can run in float64)
# --------------------------------------------------------------------------------------------------


class SeedPositionalEncoding(nn.Module):
    """The tutorials' PositionalEncoding, computed in ``dtype``."""

    def __init__(self, embed_size, max_len=5000, dtype=torch.float64):
        super().__init__()
        pe = torch.zeros(max_len, embed_size, dtype=dtype)
        position = torch.arange(0, max_len).unsqueeze(1).to(dtype)
        div_term = torch.exp(torch.arange(0, embed_size, 2).to(dtype) * (-math.log(10000.0) / embed_size))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return x + self.pe[:, :x.size(1)]


def torch_sinusoidal_any(max_len, d_model, base=10000.0):
    """The tutorials' formula for any d_model (odd too): the cos columns use the first d_model // 2
    frequencies, float64."""
    position = torch.arange(max_len, dtype=torch.float64)[:, None]
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(base) / d_model))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term[: d_model // 2])
    return pe


def matlab_positional_encoding(seq_len, d_model):
    """The einsum tutorial's MATLAB loop, transcribed (1-based columns -> 0-based)."""
    PE = np.zeros((seq_len, d_model))
    pos = np.arange(seq_len)
    for i in range(1, d_model // 2 + 1):
        denom = 10000 ** (2 * (i - 1) / d_model)
        PE[:, 2 * i - 2] = np.sin(pos / denom)
        PE[:, 2 * i - 1] = np.cos(pos / denom)
    return PE


class TutorialEmbeddings(nn.Module):
    """The encoder tutorial's Embeddings (token + position embeddings, LayerNorm eps 1e-12, dropout)."""

    def __init__(self, config):
        super().__init__()
        self.token_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=1e-12)
        self.dropout = nn.Dropout()

    def forward(self, input_ids):
        seq_length = input_ids.size(1)
        position_ids = torch.arange(seq_length, dtype=torch.long).unsqueeze(0)
        token_embeddings = self.token_embeddings(input_ids)
        position_embeddings = self.position_embeddings(position_ids)
        embeddings = token_embeddings + position_embeddings
        embeddings = self.layer_norm(embeddings)
        embeddings = self.dropout(embeddings)
        return embeddings


def seed_rotate_half(x):
    """The overview tutorial's code."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([-x2, x1], dim=-1)


def seed_apply_rotary_pos_emb(q, k, cos, sin):
    """The overview tutorial's code."""
    q_embed = (q * cos) + (seed_rotate_half(q) * sin)
    k_embed = (k * cos) + (seed_rotate_half(k) * sin)
    return q_embed, k_embed


def torch_rope_table(positions, head_dim, base=10000.0):
    """Hugging Face Llama's cos/sin, in float64: positions (..., L) -> (..., L, head_dim) each."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = positions.to(torch.float64)[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def torch_rope_interleaved(x, positions, base=10000.0):
    """GPT-J / Meta Llama: pairs (x_2i, x_2i+1) as complex numbers times e^{i m θ_i}."""
    D = x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = positions.to(torch.float64)[:, None] * inv_freq  # (L, D/2)
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)  # complex128
    xc = torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], D // 2, 2).contiguous())
    return torch.view_as_real(xc * freqs_cis).flatten(-2)


def torch_rope_pairs(x, cos_half, sin_half):
    """Interleaved layout written out pair by pair."""
    out = x.clone()
    for i in range(x.shape[-1] // 2):
        a, b = x[..., 2 * i], x[..., 2 * i + 1]
        out[..., 2 * i] = a * cos_half[..., i] - b * sin_half[..., i]
        out[..., 2 * i + 1] = b * cos_half[..., i] + a * sin_half[..., i]
    return out


# --------------------------------------------------------------------------------------------------
# Sinusoidal table
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("max_len", [1, 7, 64, 65])
@pytest.mark.parametrize("d_model", [2, 8, 64, 512])
def test_sinusoidal_matches_tutorial_positional_encoding(max_len, d_model, dtype):
    ref = SeedPositionalEncoding(d_model, max_len).pe[0]
    pe = P.sinusoidal_positional_encoding(max_len, d_model, dtype=dtype)
    assert_close(pe, ref, dtype, what="PE")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("d_model", [1, 3, 7, 65])
def test_sinusoidal_odd_d_model_last_column_is_sin(d_model, dtype):
    pe = P.sinusoidal_positional_encoding(33, d_model, dtype=dtype)
    assert_close(pe, torch_sinusoidal_any(33, d_model), dtype, what="PE odd")
    pos = np.arange(33)
    last = np.sin(pos / 10000.0 ** ((d_model - 1) / d_model))
    assert_close(pe[:, -1], last, dtype, what="last column")


def test_sinusoidal_matches_matlab_loop():
    assert_close(P.sinusoidal_positional_encoding(100, 512, dtype=np.float64), matlab_positional_encoding(100, 512), np.float64)


@pytest.mark.parametrize("base", [100.0, 10000.0, 1e6])
def test_sinusoidal_base_and_long_table(base):
    pe = P.sinusoidal_positional_encoding(5000, 96, base=base, dtype=np.float64)  # parallel path
    assert_close(pe, torch_sinusoidal_any(5000, 96, base), np.float64)
    pe32 = P.sinusoidal_positional_encoding(5000, 96, base=base, dtype=np.float32)
    assert_close(pe32, torch_sinusoidal_any(5000, 96, base), np.float32)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(2, 7, 16), (1, 1, 16), (3, 50, 16), (7, 16)])
def test_positional_encoding_layer_matches_seed(shape, dtype, rng):
    x = randn(rng, shape, dtype)
    layer = P.PositionalEncoding(16, 50, dtype)
    ref_mod = SeedPositionalEncoding(16, 50, dtype=TORCH_DTYPE[np.dtype(dtype)])
    xt = to_torch(x if x.ndim == 3 else x[None])
    ref = ref_mod(xt).numpy()
    out = layer(x)
    assert_close(out, ref if x.ndim == 3 else ref[0], dtype)
    assert layer.pe.shape == (50, 16) and layer.pe.dtype == np.dtype(dtype)
    assert_close(layer.pe, ref_mod.pe[0], dtype)


def test_positional_encoding_offset(rng):
    x = randn(rng, (2, 3, 10), np.float64)
    layer = P.PositionalEncoding(10, max_len=20, dtype=np.float64)
    assert_close(layer(x, offset=5), x + layer.pe[5:8], np.float64)
    with pytest.raises(ValueError, match="max_len"):
        layer(x, offset=18)


def test_positional_encoding_too_long_and_bad_input(rng):
    layer = P.PositionalEncoding(8, max_len=5)
    with pytest.raises(ValueError, match="x: sequence length 6"):
        layer(np.zeros((1, 6, 8)))
    with pytest.raises(ValueError, match="x: expected last dim 8"):
        layer(np.zeros((1, 3, 7)))
    with pytest.raises(ValueError, match="x: expected"):
        layer(np.zeros((2, 1, 3, 8)))
    with pytest.raises(TypeError, match="x:"):
        layer(np.array([["a"]]))
    with pytest.raises(ValueError, match="offset"):
        layer(np.zeros((1, 3, 8)), offset=-1)
    with pytest.raises(ValueError, match="d_model"):
        P.PositionalEncoding(0)


@pytest.mark.parametrize("case", ["too_long", "offset_past_max_len", "wrong_width", "wrong_rank", "offset_type"])
def test_positional_encoding_refusal_copies_nothing(rng, case):
    """A refused call is refused before ``x`` is copied: ``x`` was converted to the layer's dtype
    (a float64 ``x`` of a float32 layer: half its bytes) before its length and ``offset`` were
    checked. Now the checks read the given array's shape; numpy allocates (nearly) nothing."""
    import tracemalloc

    layer = P.PositionalEncoding(64, max_len=1000)  # float32
    x, offset, exc, match = {
        "too_long": (np.zeros((16, 1001, 64)), 0, ValueError, r"x: sequence length 1001 \(\+ offset 0\) exceeds max_len 1000"),
        "offset_past_max_len": (np.zeros((16, 600, 64)), 500, ValueError, r"x: sequence length 600 \(\+ offset 500\)"),
        "wrong_width": (np.zeros((16, 1000, 65)), 0, ValueError, r"x: expected last dim 64 \(d_model\)"),
        "wrong_rank": (np.zeros((4, 8, 500, 64)), 0, ValueError, r"x: expected \(N, L, E\) or \(L, E\), got 4-D"),
        "offset_type": (np.zeros((16, 600, 64)), 1.5, TypeError, r"offset"),
    }[case]
    assert x.nbytes >= 4 * 2**20  # a float32 copy would be >= 2 MiB
    tracemalloc.start()
    try:
        with pytest.raises(exc, match=match):
            layer(x, offset=offset)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, f"{case}: {peak} bytes allocated before the refusal (x is {x.nbytes})"
    ok = randn(rng, (2, 600, 64), np.float64)  # the same layer accepts a fitting call, values as before
    np.testing.assert_array_equal(layer(ok, offset=400), ok.astype(np.float32) + layer.pe[400:1000])


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(max_len=0, d_model=4), ValueError, "max_len"),
    (dict(max_len=4, d_model=0), ValueError, "d_model"),
    (dict(max_len=4.5, d_model=4), TypeError, "max_len"),
    (dict(max_len=4, d_model=4, base=0.0), ValueError, "base"),
    (dict(max_len=4, d_model=4, base=float("inf")), ValueError, "base"),
    (dict(max_len=4, d_model=4, base="x"), TypeError, "base"),
    (dict(max_len=4, d_model=4, dtype=np.int32), TypeError, "dtype"),
])
def test_sinusoidal_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        P.sinusoidal_positional_encoding(**kwargs)


# --------------------------------------------------------------------------------------------------
# The encoder tutorial's Embeddings
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(2, 7), (1, 1), (3, 16), (5,)])
def test_embeddings_match_tutorial_embeddings(shape, dtype, rng):
    config = SimpleNamespace(vocab_size=37, hidden_size=24, max_position_embeddings=16)
    ref = TutorialEmbeddings(config).to(TORCH_DTYPE[np.dtype(dtype)]).eval()
    with torch.no_grad():  # non-trivial LayerNorm affine
        ref.layer_norm.weight.normal_()
        ref.layer_norm.bias.normal_()
    ours = P.Embeddings(37, 24, 16, dtype=dtype)
    ours.load_state_dict(module_state_to_numpy(ref))
    ids = rng.integers(0, 37, size=shape)
    with torch.no_grad():
        expected = ref(torch.from_numpy(np.atleast_2d(ids)))
    out = ours(ids)
    assert_close(out, expected, dtype)
    assert set(ours.state_dict()) == set(ref.state_dict())


def test_embeddings_bad_input():
    emb = P.Embeddings(10, 8, 4)
    with pytest.raises(ValueError, match="input_ids: id 10 at flat index 1 is outside \\[0, 10\\)"):
        emb([[1, 10]])
    with pytest.raises(ValueError, match="input_ids: id -1 at flat index 0 is outside"):
        emb([[-1, 2]])
    with pytest.raises(ValueError, match="input_ids: sequence length 5 exceeds max_position_embeddings 4"):
        emb([[1, 2, 3, 4, 5]])
    with pytest.raises(TypeError, match="input_ids"):
        emb([[0.5, 1.0]])
    with pytest.raises(ValueError, match="token_embeddings.weight"):
        emb.load_state_dict({**emb.state_dict(), "token_embeddings.weight": np.zeros((9, 8))})
    with pytest.raises(ValueError, match="layer_norm_eps"):
        P.Embeddings(10, 8, 4, layer_norm_eps=-1.0)
    with pytest.raises(ValueError, match="vocab_size"):
        P.Embeddings(0, 8, 4)


# --------------------------------------------------------------------------------------------------
# RoPE tables
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("seq_len", [1, 7, 64, 65])
@pytest.mark.parametrize("head_dim", [2, 8, 64, 126])
@pytest.mark.parametrize("offset", [0, 13])
def test_rotary_cos_sin_matches_hf_llama_formula(seq_len, head_dim, offset, dtype):
    cos, sin = P.rotary_cos_sin(seq_len, head_dim, offset=offset, dtype=dtype)
    rc, rs = torch_rope_table(torch.arange(offset, offset + seq_len), head_dim)
    assert_close(cos, rc, dtype, what="cos")
    assert_close(sin, rs, dtype, what="sin")
    half = head_dim // 2
    assert np.array_equal(cos[:, :half], cos[:, half:]) and np.array_equal(sin[:, :half], sin[:, half:])


@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_rotary_cos_sin_base_and_offset_slices_full_table(base):
    full_c, full_s = P.rotary_cos_sin(300, 64, base=base, dtype=np.float64)
    rc, rs = torch_rope_table(torch.arange(300), 64, base)
    assert_close(full_c, rc, np.float64)
    assert_close(full_s, rs, np.float64)
    c, s = P.rotary_cos_sin(5, 64, base=base, offset=295, dtype=np.float64)
    assert np.array_equal(c, full_c[295:]) and np.array_equal(s, full_s[295:])


def test_rotary_cos_sin_hf_transformers():
    """Against transformers' own LlamaRotaryEmbedding (float32 angles there: 1e-5 on short seqs)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=64, rope_theta=10000.0)
    rope = LlamaRotaryEmbedding(cfg)
    x = torch.zeros(1, 20, 64)
    hc, hs = rope(x, torch.arange(20)[None])
    cos, sin = P.rotary_cos_sin(20, 16)
    assert_close(cos, hc[0], np.float32)
    assert_close(sin, hs[0], np.float32)


def test_rotary_cos_sin_long_positions_more_accurate_than_hf():
    """The documented, deliberate difference: our tables are computed in float64 and rounded once
    (float32 within half an ulp, 2**-25, of the float64 values), HF's from float32 angles, whose
    error grows with the position: for head_dim 128 up to ~6e-5 over positions 0..1024 and ~5e-4
    over 0..8192 (the numbers rotary_cos_sin's docstring gives)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    n, D = 8193, 128
    cfg = LlamaConfig(hidden_size=4 * D, num_attention_heads=4, max_position_embeddings=n, rope_theta=10000.0)
    hc, hs = (t[0].numpy() for t in LlamaRotaryEmbedding(cfg)(torch.zeros(1, n, D), torch.arange(n)[None]))
    cos, sin = P.rotary_cos_sin(n, D)
    exact_cos, exact_sin = (t.numpy() for t in torch_rope_table(torch.arange(n), D))  # HF's formula, float64
    assert_close(P.rotary_cos_sin(n, D, dtype=np.float64)[0], exact_cos, np.float64)
    ours = max(np.abs(cos - exact_cos).max(), np.abs(sin - exact_sin).max())
    assert ours <= 2.0**-25 * (1 + 1e-9)
    hf = np.maximum(np.abs(hc - exact_cos).max(1), np.abs(hs - exact_sin).max(1))  # per position
    assert 2e-5 < hf[:1025].max() < 1e-4
    assert 2e-4 < hf.max() < 1e-3
    assert np.abs(cos - hc).max() > 100 * ours  # the two tables differ, by HF's error


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(seq_len=4, head_dim=7), ValueError, "head_dim: expected an even"),
    (dict(seq_len=4, head_dim=0), ValueError, "head_dim"),
    (dict(seq_len=0, head_dim=8), ValueError, "seq_len"),
    (dict(seq_len=4, head_dim=8, offset=-1), ValueError, "offset"),
    (dict(seq_len=4, head_dim=8, offset=1.0), TypeError, "offset"),
    # from 2**53 float64 gives two positions one angle (rows 2**53 and 2**53 + 1 were equal)
    (dict(seq_len=2, head_dim=8, offset=2**53 - 1), ValueError, r"offset: expected offset \+ seq_len <= 2\*\*53"),
    (dict(seq_len=4, head_dim=8, base=-2.0), ValueError, "base"),
    (dict(seq_len=4, head_dim=8, dtype="int64"), TypeError, "dtype"),
])
def test_rotary_cos_sin_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        P.rotary_cos_sin(**kwargs)


# --------------------------------------------------------------------------------------------------
# RoPE rotation
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(4, 8), (7, 2), (1, 6), (2, 3, 7, 8), (3, 5, 64), (1, 1, 1, 126)])
def test_rotate_half_matches_seed(shape, dtype, rng):
    x = randn(rng, shape, dtype)
    assert_close(P.rotate_half(x), seed_rotate_half(to_torch(x)), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("q_shape, k_shape", [
    ((2, 3, 7, 8), (2, 3, 7, 8)),   # (N, H, L, D), odd L
    ((7, 16), (7, 16)),             # (L, D)
    ((1, 1, 1, 2), (1, 1, 1, 2)),   # one token, one pair
    ((3, 5, 64), (3, 5, 64)),       # (N, L, D)
    ((2, 4, 9, 32), (2, 2, 9, 32)),  # fewer key heads (GQA)
    ((4, 8, 257, 64), (4, 8, 257, 64)),  # large: the parallel path
])
@pytest.mark.parametrize("offset", [0, 5])
def test_apply_rotary_half_matches_seed(q_shape, k_shape, offset, dtype, rng):
    L, D = q_shape[-2:]
    q, k = randn(rng, q_shape, dtype), randn(rng, k_shape, dtype)
    q0, k0 = q.copy(), k.copy()
    cos, sin = P.rotary_cos_sin(L, D, offset=offset, dtype=dtype)
    q_rot, k_rot = P.apply_rotary_pos_emb(q, k, cos, sin)
    rq, rk = seed_apply_rotary_pos_emb(to_torch(q), to_torch(k), to_torch(cos), to_torch(sin))
    assert_close(q_rot, rq, dtype, what="q")
    assert_close(k_rot, rk, dtype, what="k")
    assert np.array_equal(q, q0) and np.array_equal(k, k0)  # inputs untouched
    # and against the float64 table computed by torch (HF Llama's formula)
    tc, ts = torch_rope_table(torch.arange(offset, offset + L), D)
    rq64, _ = seed_apply_rotary_pos_emb(to_torch(q).double(), to_torch(k).double(), tc, ts)
    assert_close(q_rot, rq64, dtype, what="q vs f64 table", rtol_=1e-5 if dtype == np.float32 else None)


@pytest.mark.parametrize("q_dtype, k_dtype", [(np.float32, np.float64), (np.float64, np.float32)])
def test_apply_rotary_pos_emb_rotates_q_and_k_each_in_its_dtype(q_dtype, k_dtype, rng):
    """A float64 k beside a float32 q (or the reverse) keeps float64 and its 1e-10 against torch
    (q * cos + rotate_half(q) * sin with float32 tables): it was narrowed to q's dtype (8.7e-8 off)."""
    q, k = randn(rng, (1, 2, 5, 8), q_dtype), randn(rng, (1, 2, 5, 8), k_dtype)
    cos, sin = P.rotary_cos_sin(5, 8)
    q_rot, k_rot = P.apply_rotary_pos_emb(q, k, cos, sin)
    rq, rk = seed_apply_rotary_pos_emb(to_torch(q), to_torch(k), to_torch(cos), to_torch(sin))
    assert (q_rot.dtype, k_rot.dtype) == (np.dtype(q_dtype), np.dtype(k_dtype))
    assert_close(q_rot, rq, q_dtype, what="q")
    assert_close(k_rot, rk, k_dtype, what="k")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_apply_rotary_hf_position_ids_broadcast(dtype, rng):
    """HF passes cos/sin as (N, L, D) per batch (position_ids), unsqueezed to (N, 1, L, D)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply

    N, H, L, D = 3, 4, 6, 16
    positions = torch.from_numpy(rng.integers(0, 100, size=(N, L)))
    tc, ts = torch_rope_table(positions, D)
    tdt = TORCH_DTYPE[np.dtype(dtype)]
    tc, ts = tc.to(tdt), ts.to(tdt)
    q, k = randn(rng, (N, H, L, D), dtype), randn(rng, (N, 2, L, D), dtype)
    q_rot, k_rot = P.apply_rotary_pos_emb(q, k, tc[:, None].numpy(), ts[:, None].numpy())
    rq, rk = hf_apply(to_torch(q), to_torch(k), tc, ts, unsqueeze_dim=1)
    assert_close(q_rot, rq, dtype)
    assert_close(k_rot, rk, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(2, 3, 7, 8), (7, 16), (1, 1, 1, 2), (3, 5, 64), (4, 8, 257, 64)])
@pytest.mark.parametrize("offset", [0, 11])
def test_apply_rotary_interleaved_matches_view_as_complex(shape, offset, dtype, rng):
    L, D = shape[-2:]
    x = randn(rng, shape, dtype)
    cos, sin = P.rotary_cos_sin(L, D, offset=offset, dtype=dtype)
    out = P.apply_rotary(x, cos, sin, layout="interleaved")
    ref = torch_rope_interleaved(to_torch(x), torch.arange(offset, offset + L))
    assert_close(out, ref, dtype, rtol_=1e-5 if dtype == np.float32 else None)
    # explicit pairs with our (rounded) tables: same arithmetic as the kernel
    half = D // 2
    pairs = torch_rope_pairs(to_torch(x), to_torch(cos[:, :half]), to_torch(sin[:, :half]))
    assert_close(out, pairs, dtype)
    # the (L, D/2) tables give the same
    out_half_tables = P.apply_rotary(x, cos[:, :half], sin[:, :half], layout="interleaved")
    assert np.array_equal(out, out_half_tables)
    q_rot, k_rot = P.apply_rotary_pos_emb(x, x, cos, sin, layout="interleaved")
    assert np.array_equal(q_rot, out) and np.array_equal(k_rot, out)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_apply_rotary_half_accepts_frequency_tables(dtype, rng):
    x = randn(rng, (2, 5, 12), dtype)
    cos, sin = P.rotary_cos_sin(5, 12, dtype=dtype)
    assert np.array_equal(P.apply_rotary(x, cos, sin), P.apply_rotary(x, cos[:, :6], sin[:, :6]))


def test_apply_rotary_non_contiguous_input(rng):
    x = randn(rng, (2, 16, 5), np.float64).transpose(0, 2, 1)  # (2, 5, 16), not contiguous
    cos, sin = P.rotary_cos_sin(5, 16, dtype=np.float64)
    ref = seed_rotate_half(to_torch(x)) * to_torch(sin) + to_torch(x) * to_torch(cos)
    assert_close(P.apply_rotary(x, cos, sin), ref, np.float64)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_relative_position_property(layout, rng):
    """<RoPE(q, m), RoPE(k, n)> depends only on m - n (Su et al. 2021, §3.4.2)."""
    D, L = 16, 41
    q, k = rng.standard_normal(D), rng.standard_normal(D)
    cos, sin = P.rotary_cos_sin(L, D, dtype=np.float64)
    qs = P.apply_rotary(np.tile(q, (L, 1)), cos, sin, layout)  # row m = RoPE(q, m)
    ks = P.apply_rotary(np.tile(k, (L, 1)), cos, sin, layout)
    G = qs @ ks.T  # G[m, n] = <RoPE(q, m), RoPE(k, n)>
    for delta in range(-(L - 1), L):
        diag = np.diagonal(G, offset=-delta)  # entries with m - n = delta
        np.testing.assert_allclose(diag, diag[0], atol=1e-10, rtol=0)
    assert not np.allclose(np.diagonal(G, 0)[0], np.diagonal(G, 1)[0])  # and it does depend on it
    np.testing.assert_allclose(np.diagonal(G)[0], q @ k, atol=1e-10)  # m = n: the plain dot product


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_incremental_decoding_matches_full(layout, rng):
    """A KV cache: rotating only the new tokens with offset = cache length equals the full pass."""
    N, H, L, D, new = 2, 3, 9, 8, 2
    x = randn(rng, (N, H, L, D), np.float64)
    cos, sin = P.rotary_cos_sin(L, D, dtype=np.float64)
    full = P.apply_rotary(x, cos, sin, layout)
    c2, s2 = P.rotary_cos_sin(new, D, offset=L - new, dtype=np.float64)
    assert_close(P.apply_rotary(x[:, :, -new:], c2, s2, layout), full[:, :, -new:], np.float64)


def test_apply_rotary_bad_input(rng):
    cos, sin = P.rotary_cos_sin(5, 8)
    x = randn(rng, (2, 5, 8), np.float32)
    with pytest.raises(ValueError, match="layout"):
        P.apply_rotary(x, cos, sin, layout="neox")
    with pytest.raises(ValueError, match="x: expected an even head_dim"):
        P.apply_rotary(randn(rng, (5, 7), np.float32), cos, sin)
    with pytest.raises(ValueError, match="x: expected at least 2 dims"):
        P.apply_rotary(randn(rng, (8,), np.float32), cos, sin)
    with pytest.raises(ValueError, match="cos: expected last dim 8"):
        P.apply_rotary(x, cos[:, :3], sin[:, :3])
    with pytest.raises(ValueError, match="cos: shape \\(4, 8\\) does not broadcast"):
        P.apply_rotary(x, cos[:4], sin[:4])
    with pytest.raises(ValueError, match="sin: expected the shape of cos"):
        P.apply_rotary(x, cos, sin[:, :4])
    with pytest.raises(TypeError, match="x:"):
        P.apply_rotary(np.array([["a", "b"]]), cos, sin)
    with pytest.raises(ValueError, match="k: expected an even head_dim"):
        P.apply_rotary_pos_emb(x, randn(rng, (2, 5, 7), np.float32), cos, sin)
    with pytest.raises(ValueError, match="cos: shape"):
        P.apply_rotary_pos_emb(x, randn(rng, (2, 6, 8), np.float32), cos, sin)
    with pytest.raises(ValueError, match="x: expected an even"):
        P.rotate_half(randn(rng, (3, 5), np.float32))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_and_tables_identical_with_1_and_4_threads(layout, rng):
    import transformer_core as tc

    x = randn(rng, (4, 8, 257, 64), np.float32)
    before = tc.get_num_threads()
    results = []
    try:
        for n in (1, 4):
            tc.set_num_threads(n)
            cos, sin = P.rotary_cos_sin(257, 64, offset=3)
            results.append((P.apply_rotary(x, cos, sin, layout), P.sinusoidal_positional_encoding(3000, 64)))
    finally:
        tc.set_num_threads(before)
    assert np.array_equal(results[0][0], results[1][0]) and np.array_equal(results[0][1], results[1][1])


# --------------------------------------------------------------------------------------------------
# apply_rotary_pos_emb with Hugging Face's (N, L, D) tables: the head axis inserted at unsqueeze_dim
# --------------------------------------------------------------------------------------------------


def _hf_llama_tables(N, L, D, dtype, rng, base=10000.0):
    """cos/sin (N, L, D) from HF's own LlamaRotaryEmbedding for per-row position_ids (N, L)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = transformers.LlamaConfig(hidden_size=D * 2, num_attention_heads=2, max_position_embeddings=512,
                                   rope_theta=base)
    positions = torch.from_numpy(np.stack([np.sort(rng.choice(500, L, replace=False)) for _ in range(N)]))
    x = torch.zeros(N, L, D, dtype=TORCH_DTYPE[np.dtype(dtype)])
    cos, sin = LlamaRotaryEmbedding(cfg)(x, positions)
    assert cos.shape == (N, L, D) and cos.dtype == x.dtype
    return cos, sin


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("N, H, H_kv", [(4, 4, 2), (4, 4, 4), (3, 4, 2), (1, 6, 2), (5, 2, 1)],
                         ids=["N=H", "N=H=Hkv", "N!=H", "N1", "N>H"])
def test_apply_rotary_pos_emb_hf_tables_per_row_positions(N, H, H_kv, dtype, rng):
    """HF's ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` takes the (N, L, D) tables of
    ``LlamaRotaryEmbedding`` and inserts the head axis itself. Ours did plain broadcasting, lining N
    up with the head axis: a wrong answer when N == H, an error otherwise."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply

    L, D = 7, 16
    cos, sin = _hf_llama_tables(N, L, D, dtype, rng)
    q, k = randn(rng, (N, H, L, D), dtype), randn(rng, (N, H_kv, L, D), dtype)
    rq, rk = hf_apply(to_torch(q), to_torch(k), cos, sin)  # HF's default unsqueeze_dim=1
    q_rot, k_rot = P.apply_rotary_pos_emb(q, k, cos.numpy(), sin.numpy())
    assert_close(q_rot, rq, dtype, what="q")
    assert_close(k_rot, rk, dtype, what="k")
    # the same with the keyword, positionally (HF's signature), and with (N, 1, L, D) tables as is
    for args, kw in (((cos.numpy(), sin.numpy()), {"unsqueeze_dim": 1}), ((cos.numpy(), sin.numpy(), 1), {}),
                     ((cos[:, None].numpy(), sin[:, None].numpy()), {})):
        q2, k2 = P.apply_rotary_pos_emb(q, k, *args, **kw)
        assert np.array_equal(q2, q_rot) and np.array_equal(k2, k_rot)
    # one tensor: apply_rotary follows the same convention
    assert np.array_equal(P.apply_rotary(q, cos.numpy(), sin.numpy()), q_rot)
    # and the (N, L, D/2) frequency tables
    q3, _ = P.apply_rotary_pos_emb(q, k, cos[..., :D // 2].numpy(), sin[..., :D // 2].numpy())
    assert np.array_equal(q3, q_rot)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("unsqueeze_dim", [2, -2])
def test_apply_rotary_pos_emb_hf_unsqueeze_dim_heads_last(unsqueeze_dim, dtype, rng):
    """q, k as (N, L, H, D) (the layout before the transpose): HF's unsqueeze_dim=2."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply

    N, L, H, D = 3, 5, 3, 8
    cos, sin = _hf_llama_tables(N, L, D, dtype, rng)
    q, k = randn(rng, (N, L, H, D), dtype), randn(rng, (N, L, 1, D), dtype)
    rq, rk = hf_apply(to_torch(q), to_torch(k), cos, sin, unsqueeze_dim=unsqueeze_dim)
    q_rot, k_rot = P.apply_rotary_pos_emb(q, k, cos.numpy(), sin.numpy(), unsqueeze_dim=unsqueeze_dim)
    assert_close(q_rot, rq, dtype, what="q")
    assert_close(k_rot, rk, dtype, what="k")


def test_rotary_backward_with_hf_tables_matches_torch_autograd(rng):
    """backward.rotary_backward reads the tables as apply_rotary does (HF's (N, L, D) included)."""
    from transformer_core import backward as B
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply

    N, H, L, D = 4, 4, 6, 8
    cos, sin = _hf_llama_tables(N, L, D, np.float64, rng)
    q = randn(rng, (N, H, L, D), np.float64)
    g = randn(rng, (N, H, L, D), np.float64)
    qt = to_torch(q).requires_grad_(True)
    rq, _ = hf_apply(qt, qt[:, :1].detach(), cos, sin)
    rq.backward(to_torch(g))
    assert_close(B.rotary_backward(g, cos.numpy(), sin.numpy()), qt.grad, np.float64)


def test_apply_rotary_pos_emb_table_shapes_are_checked(rng):
    N, H, L, D = 2, 4, 5, 8
    q, k = randn(rng, (N, H, L, D), np.float32), randn(rng, (N, 2, L, D), np.float32)
    cos, sin = P.rotary_cos_sin(L, D)
    c3, s3 = np.broadcast_to(cos, (N, L, D)), np.broadcast_to(sin, (N, L, D))
    with pytest.raises(ValueError, match=r"^cos: shape \(3, 5, 8\) \(with the head axis at "
                                         r"unsqueeze_dim=1: \(3, 1, 5, 8\)\) does not broadcast to q's "
                                         r"\(2, 4, 5, 8\)"):
        P.apply_rotary_pos_emb(q, k, np.broadcast_to(cos, (3, L, D)), np.broadcast_to(sin, (3, L, D)))  # batch 3 != 2
    with pytest.raises(ValueError, match=r"^cos: shape \(2, 4, 8\) \(with the head axis .*\) does not broadcast"):
        P.apply_rotary_pos_emb(q, k, c3[:, :4], s3[:, :4])  # L 4 != 5
    with pytest.raises(ValueError, match=r"does not broadcast to x's \(2, 4, 5, 8\)"):  # the argument named
        P.apply_rotary(q, np.broadcast_to(cos, (3, L, D)), np.broadcast_to(sin, (3, L, D)))
    with pytest.raises(ValueError, match=r"^cos: expected a 2-D \(L, 8\) table, or one of rank 3 .* got shape "
                                         r"\(1, 1, 2, 5, 8\)"):
        P.apply_rotary_pos_emb(q, k, c3[None, None], s3[None, None])
    with pytest.raises(ValueError, match=r"^unsqueeze_dim: expected an int in \[-4, 3\]"):
        P.apply_rotary_pos_emb(q, k, c3, s3, unsqueeze_dim=4)
    with pytest.raises(ValueError, match=r"^unsqueeze_dim: expected an int in \[-4, 3\]"):
        P.apply_rotary(q, c3, s3, unsqueeze_dim=-5)
    with pytest.raises(TypeError, match="^unsqueeze_dim: expected an int"):
        P.apply_rotary_pos_emb(q, k, c3, s3, unsqueeze_dim=1.0)
    with pytest.raises(TypeError, match="^unsqueeze_dim: expected an int, got str 'interleaved'"):
        P.apply_rotary_pos_emb(q, k, c3, s3, "interleaved")  # layout is a keyword now (HF's 5th argument)
    with pytest.raises(ValueError, match=r"^sin: expected the shape of cos"):
        P.apply_rotary_pos_emb(q, k, c3, s3[:1])
    # (L, D) tables keep their meaning: one table for every row (unsqueeze_dim is not used)
    a, b = P.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=3)
    assert np.array_equal(a, P.apply_rotary_pos_emb(q, k, c3, s3)[0])


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotary_layer_tables_past_the_first_block_of_positions(layout, rng):
    """RotaryEmbedding builds its interleaved tables 256 positions at a time (so that they never take
    more than P · D values): attention through it at positions on both sides of the block edges equals
    the same attention written out with apply_rotary and rotary_cos_sin's full table."""
    import transformer_core as tc
    import transformer_core.functional as F

    E, H, P_max = 16, 2, 600
    D = E // H
    mha = tc.nn.MultiheadAttention(E, H, dtype=np.float64)
    rope = P.RotaryEmbedding(D, P_max, layout=layout, dtype=np.float64)
    positions = np.array([[0, 1, 255, 256, 257, 511, 512, 599]])
    x = randn(rng, (1, positions.shape[1], E), np.float64)
    out, _ = mha(x, need_weights=False, rotary=rope, position_ids=positions)

    sd = mha.state_dict()
    w, b = sd["in_proj_weight"], sd["in_proj_bias"]
    q, k, v = np.split(x[0] @ w.T + b, 3, axis=-1)
    heads = lambda t: t.reshape(-1, H, D).transpose(1, 0, 2)  # noqa: E731  (H, L, D)
    cos, sin = P.rotary_cos_sin(P_max, D, dtype=np.float64)
    cos, sin = cos[positions[0]], sin[positions[0]]
    q, k = P.apply_rotary(heads(q), cos, sin, layout), P.apply_rotary(heads(k), cos, sin, layout)
    attn = F.scaled_dot_product_attention(q, k, heads(v)).transpose(1, 0, 2).reshape(-1, E)
    ref = attn @ sd["out_proj.weight"].T + sd["out_proj.bias"]
    np.testing.assert_allclose(out[0], ref, atol=1e-10, rtol=0)


def test_rotary_layer_grows_its_tables_to_the_positions_used(rng):
    """RotaryEmbedding builds the tables of the first 4,096 positions, then grows them (doubling, or
    to the position asked for) when a call reaches further: a max_position_embeddings of 2**40 costs
    nothing until used. Attention at positions past each growth equals the same attention written
    out with rotary_cos_sin's full table, and a position at or past max_position_embeddings, or one
    whose tables cannot fit this machine's memory, is refused with a ValueError."""
    import transformer_core as tc
    import transformer_core.functional as F

    E, H = 8, 2
    D = E // H
    mha = tc.nn.MultiheadAttention(E, H, dtype=np.float64)
    rope = P.RotaryEmbedding(D, 2**40, dtype=np.float64)
    assert rope._impl.built_positions == 4096
    sd = mha.state_dict()
    for positions, built in (([0, 4095, 17], 4096), ([4096, 1, 5000], 8192), ([3, 20000, 8192], 20001)):
        positions = np.array([positions])
        x = randn(rng, (1, 3, E), np.float64)
        out, _ = mha(x, need_weights=False, rotary=rope, position_ids=positions)
        assert rope._impl.built_positions == built
        q, k, v = np.split(x[0] @ sd["in_proj_weight"].T + sd["in_proj_bias"], 3, axis=-1)
        heads = lambda t: t.reshape(-1, H, D).transpose(1, 0, 2)  # noqa: E731  (H, L, D)
        cos, sin = P.rotary_cos_sin(int(positions.max()) + 1, D, dtype=np.float64)
        cos, sin = cos[positions[0]], sin[positions[0]]
        q, k = P.apply_rotary(heads(q), cos, sin), P.apply_rotary(heads(k), cos, sin)
        attn = F.scaled_dot_product_attention(q, k, heads(v)).transpose(1, 0, 2).reshape(-1, E)
        np.testing.assert_allclose(out[0], attn @ sd["out_proj.weight"].T + sd["out_proj.bias"], atol=1e-10, rtol=0)
    x = randn(rng, (1, 2, E), np.float64)
    with pytest.raises(ValueError, match=r"rotary tables .*exceed this machine's memory"):
        mha(x, need_weights=False, rotary=rope, position_ids=[[0, 2**39]])
    small = P.RotaryEmbedding(D, 16, dtype=np.float64)
    with pytest.raises(ValueError, match=r"position 16 .* outside the rotary table \[0, 16\)"):
        mha(x, need_weights=False, rotary=small, position_ids=[[0, 16]])
    assert rope._impl.built_positions == 20001 and small._impl.built_positions == 16


@pytest.mark.parametrize("k_dim", [6, 10])
def test_apply_rotary_pos_emb_k_of_another_head_dim_is_refused_naming_k(k_dim, rng):
    """k with another head_dim than q (tables of q's width) was refused blaming ``cos`` ("expected
    last dim 6 (head_dim)"), though the tables fit q: k's own head_dim is now checked against q's
    first. Equal head_dims (and q's GQA head count) still rotate as the tutorials' code."""
    q, k = randn(rng, (1, 4, 6, 8)), randn(rng, (1, 2, 6, k_dim))
    cos, sin = P.rotary_cos_sin(6, 8)
    with pytest.raises(ValueError, match=rf"^k: expected head_dim 8 \(q's last dim\), got shape \(1, 2, 6, {k_dim}\) "
                                         rf"\(q: \(1, 4, 6, 8\)\)$"):
        P.apply_rotary_pos_emb(q, k, cos, sin)
    k = randn(rng, (1, 2, 6, 8))
    q_rot, k_rot = P.apply_rotary_pos_emb(q, k, cos, sin)
    rq, rk = seed_apply_rotary_pos_emb(to_torch(q), to_torch(k), to_torch(cos), to_torch(sin))
    assert_close(q_rot, rq, np.float32, what="q")
    assert_close(k_rot, rk, np.float32, what="k")


def test_rotary_cos_sin_checks_both_tables_against_memory_together():
    """Each table was checked alone: a size whose cos fits this machine's memory but cos and sin
    together do not went on to allocate both (a MemoryError at best, the OOM killer otherwise). It is
    a ValueError naming (seq_len, head_dim) now, before anything is allocated."""
    from transformer_core._validation import physical_memory_bytes

    limit = physical_memory_bytes()
    seq_len = int(0.6 * limit / 8 / 2)  # one float64 (seq_len, 2) table: 0.6 of the memory; both 1.2
    with pytest.raises(ValueError, match=r"^\(seq_len, head_dim\): .* exceed this machine's memory"):
        P.rotary_cos_sin(seq_len, 2, dtype=np.float64)
