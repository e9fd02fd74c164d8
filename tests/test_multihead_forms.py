"""The tutorials' multi-head attention forms, written here in torch from the tutorials' listings, equal
our fused nn.MultiheadAttention loaded through transformer_core.multihead_forms:

* the encoder tutorial: per-head AttentionHead modules, concatenated, then output_linear;
* the split-heads forms (W_q/W_k/W_v/W_o and q_linear/k_linear/v_linear/out_linear): one Linear
  per projection, split into heads with .view;
* the einsum tutorial: einsum SelfAttention with Linear(head_dim, head_dim) layers shared across heads, both
  as written (the Linears are never applied) and as intended (applied to each head's slice).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformer_core.nn as tcnn
from conftest import DTYPE_IDS, FLOAT_DTYPES, TORCH_DTYPE, assert_close, module_state_to_numpy, randn, to_torch
from torch import nn
from transformer_core import multihead_forms as MF

# --------------------------------------------------------------------------------------------------
# The encoder tutorial's per-head attention (copied from the listing; runs as is)
# --------------------------------------------------------------------------------------------------


def tutorial_scaled_dot_product_attention(query, key, value, query_mask=None, key_mask=None, mask=None):
    dim_k = query.size(-1)
    scores = torch.bmm(query, key.transpose(1, 2)) / math.sqrt(dim_k)
    if query_mask is not None and key_mask is not None:
        mask = torch.bmm(query_mask.unsqueeze(-1), key_mask.unsqueeze(1))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -float("inf"))
    weights = F.softmax(scores, dim=-1)
    return torch.bmm(weights, value)


class TutorialAttentionHead(nn.Module):
    def __init__(self, embed_dim, head_dim):
        super().__init__()
        self.q = nn.Linear(embed_dim, head_dim)
        self.k = nn.Linear(embed_dim, head_dim)
        self.v = nn.Linear(embed_dim, head_dim)

    def forward(self, query, key, value, query_mask=None, key_mask=None, mask=None):
        return tutorial_scaled_dot_product_attention(
            self.q(query), self.k(key), self.v(value), query_mask, key_mask, mask)


class PerHeadMultiHeadAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        embed_dim = config.hidden_size
        num_heads = config.num_attention_heads
        head_dim = embed_dim // num_heads
        self.heads = nn.ModuleList([TutorialAttentionHead(embed_dim, head_dim) for _ in range(num_heads)])
        self.output_linear = nn.Linear(embed_dim, embed_dim)

    def forward(self, query, key, value, query_mask=None, key_mask=None, mask=None):
        x = torch.cat([head(query, key, value, query_mask, key_mask, mask) for head in self.heads], dim=-1)
        return self.output_linear(x)


# --------------------------------------------------------------------------------------------------
# The split-heads forms (one Linear per projection, heads by .view)
# --------------------------------------------------------------------------------------------------


class SplitHeadsSelfAttention(nn.Module):
    def __init__(self, embed_size, heads):
        super().__init__()
        self.embed_size = embed_size
        self.heads = heads
        self.head_dim = embed_size // heads
        assert self.head_dim * heads == embed_size
        self.W_q = nn.Linear(embed_size, embed_size)
        self.W_k = nn.Linear(embed_size, embed_size)
        self.W_v = nn.Linear(embed_size, embed_size)
        self.W_o = nn.Linear(embed_size, embed_size)

    def forward(self, x, mask=None):
        batch_size, seq_len, _ = x.shape
        Q = self.W_q(x)
        K = self.W_k(x)
        V = self.W_v(x)
        Q = Q.view(batch_size, seq_len, self.heads, self.head_dim).transpose(1, 2)
        K = K.view(batch_size, seq_len, self.heads, self.head_dim).transpose(1, 2)
        V = V.view(batch_size, seq_len, self.heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        attention = F.softmax(scores, dim=-1)
        out = torch.matmul(attention, V)
        out = out.transpose(1, 2).contiguous().view(batch_size, seq_len, self.embed_size)
        return self.W_o(out)


class QLinearMultiHeadAttention(nn.Module):
    """The training tutorial's listing (flattened onto one line there), re-indented. Its scale is a float32
    tensor ``sqrt(head_dim)``: exact for the head sizes used here (perfect squares)."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.q_linear = nn.Linear(embed_dim, embed_dim)
        self.k_linear = nn.Linear(embed_dim, embed_dim)
        self.v_linear = nn.Linear(embed_dim, embed_dim)
        self.out_linear = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        batch_size = x.size(0)
        Q = self.q_linear(x).view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)
        K = self.k_linear(x).view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)
        V = self.v_linear(x).view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(Q, K.transpose(-2, -1)) / torch.sqrt(torch.tensor(self.head_dim, dtype=torch.float32))
        attn_weights = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn_weights, V)
        out = out.transpose(1, 2).contiguous().view(batch_size, -1, self.embed_dim)
        return self.out_linear(out)


# --------------------------------------------------------------------------------------------------
# The einsum tutorial (einsum; shared per-head Linears)
# --------------------------------------------------------------------------------------------------


class EinsumSelfAttention(nn.Module):
    """As written in the listing (the three Linear(head_dim, head_dim) are defined, never used),
    with its second einsum fixed (see forward)."""

    def __init__(self, embed_size, heads):
        super().__init__()
        self.embed_size = embed_size
        self.heads = heads
        self.head_dim = embed_size // heads
        assert self.head_dim * heads == embed_size, "Embedding size must be divisible by heads"
        self.values = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.keys = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.queries = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.fc_out = nn.Linear(heads * self.head_dim, embed_size)

    def project(self, values, keys, queries):
        return values, keys, queries  # the listing: no projection

    def forward(self, values, keys, query, mask=None):
        N = query.shape[0]
        value_len, key_len, query_len = values.shape[1], keys.shape[1], query.shape[1]
        values = values.reshape(N, value_len, self.heads, self.head_dim)
        keys = keys.reshape(N, key_len, self.heads, self.head_dim)
        queries = query.reshape(N, query_len, self.heads, self.head_dim)
        values, keys, queries = self.project(values, keys, queries)
        energy = torch.einsum("nqhd,nkhd->nhqk", [queries, keys])
        energy = energy / math.sqrt(self.head_dim)
        if mask is not None:
            energy = energy.masked_fill(mask == 0, float("-1e20"))
        attention = torch.softmax(energy, dim=3)
        # The listing writes "nhqk,nvhd->nqhd": with k and v as separate indices the einsum sums
        # the weights (to 1) and the values independently, i.e. returns Σ_v values for every query
        # (see test_literal_einsum_ignores_attention). Fixed: the key index is the value's.
        out = torch.einsum("nhqk,nkhd->nqhd", [attention, values])
        out = out.reshape(N, query_len, self.heads * self.head_dim)
        return self.fc_out(out)


class EinsumSelfAttentionIntended(EinsumSelfAttention):
    """As intended: the shared Linears applied to each head's slice (after the head split)."""

    def project(self, values, keys, queries):
        return self.values(values), self.keys(keys), self.queries(queries)


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------

# (embed_dim, num_heads): head_dim 4, 9, 1, 16 (odd sizes; perfect squares for the training tutorial's scale)
CONFIGS = [(12, 3), (36, 4), (8, 8), (16, 1)]
CONFIG_IDS = ["E12H3", "E36H4", "E8H8", "E16H1"]
# (N, L, S): cross-attention with L != S, a single token, L > S
SEQS = [(2, 5, 7), (1, 1, 1), (3, 9, 4)]
SEQ_IDS = ["N2L5S7", "N1L1S1", "N3L9S4"]


def _torch_module(cls, dtype, *args, **kwargs):
    torch.manual_seed(7)
    m = cls(*args, **kwargs).to(TORCH_DTYPE[np.dtype(dtype)]).eval()
    with torch.no_grad():  # non-trivial biases everywhere
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.uniform_(-0.5, 0.5)
    return m


def _ours(state, E, H, dtype):
    mha = tcnn.MultiheadAttention(E, H, dtype=dtype)
    mha.load_state_dict(state)
    return mha


def _lengths_mask(rng, N, S):
    """(N, S) bool, True = real key, each row with >= 1 real key."""
    lengths = rng.integers(1, S + 1, size=N)
    lengths[0] = max(1, S - 2)
    return np.arange(S)[None, :] < lengths[:, None]


# --------------------------------------------------------------------------------------------------
# per-head modules
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("seq", SEQS, ids=SEQ_IDS)
@pytest.mark.parametrize("E, H", CONFIGS, ids=CONFIG_IDS)
def test_per_head_attention_heads(E, H, seq, dtype, rng):
    N, L, S = seq
    ref = _torch_module(PerHeadMultiHeadAttention, dtype, SimpleNamespace(hidden_size=E, num_attention_heads=H))
    ours = _ours(MF.from_per_head(module_state_to_numpy(ref)), E, H, dtype)
    q, k, v = randn(rng, (N, L, E), dtype), randn(rng, (N, S, E), dtype), randn(rng, (N, S, E), dtype)
    with torch.no_grad():
        expected = ref(to_torch(q), to_torch(k), to_torch(v))
    out, weights = ours(q, k, v, need_weights=False)
    assert weights is None
    assert_close(out, expected, dtype)
    # with a padding mask (the tutorial's `mask`, (N, L, S), 0 = blocked)
    key_real = _lengths_mask(rng, N, S)
    mask = torch.from_numpy(np.broadcast_to(key_real[:, None, :], (N, L, S)).astype(np.int64))
    with torch.no_grad():
        expected = ref(to_torch(q), to_torch(k), to_torch(v), mask=mask)
    assert_close(ours(q, k, v, key_mask=key_real)[0], expected, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("E, H", CONFIGS, ids=CONFIG_IDS)
def test_to_per_head_loads_into_attention_heads(E, H, dtype, rng):
    tmha = _torch_module(nn.MultiheadAttention, dtype, E, H, batch_first=True)
    state = module_state_to_numpy(tmha)
    per_head = MF.to_per_head(state, H)
    ref = PerHeadMultiHeadAttention(SimpleNamespace(hidden_size=E, num_attention_heads=H))
    ref = ref.to(TORCH_DTYPE[np.dtype(dtype)]).eval()
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in per_head.items()})  # strict: names match
    x = randn(rng, (2, 7, E), dtype)
    with torch.no_grad():
        expected = ref(to_torch(x), to_torch(x), to_torch(x))
        torch_out, _ = tmha(to_torch(x), to_torch(x), to_torch(x), need_weights=False)
    assert_close(expected.numpy(), torch_out, dtype)  # torch's MHA == the per-head form under the conversion
    assert_close(_ours(state, E, H, dtype)(x)[0], expected, dtype)
    back = MF.from_per_head(per_head)
    assert set(back) == set(state) and all(np.array_equal(back[k], state[k]) for k in state)


# --------------------------------------------------------------------------------------------------
# split heads (W_q and q_linear names): split heads
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("N, L", [(2, 5), (1, 1), (3, 8)])
@pytest.mark.parametrize("E, H", CONFIGS, ids=CONFIG_IDS)
def test_split_heads_w_q_names(E, H, N, L, dtype, rng):
    ref = _torch_module(SplitHeadsSelfAttention, dtype, E, H)
    ours = _ours(MF.from_split_heads(module_state_to_numpy(ref)), E, H, dtype)
    x = randn(rng, (N, L, E), dtype)
    key_real = _lengths_mask(rng, N, L)
    with torch.no_grad():
        expected = ref(to_torch(x))
        expected_masked = ref(to_torch(x), mask=torch.from_numpy(key_real[:, None, None, :]))
    assert_close(ours(x)[0], expected, dtype)
    assert_close(ours(x, key_mask=key_real)[0], expected_masked, dtype)
    back = MF.to_split_heads(MF.from_split_heads(module_state_to_numpy(ref)), naming="W_q")
    assert all(np.array_equal(back[k], v) for k, v in module_state_to_numpy(ref).items())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("N, L", [(2, 5), (1, 1), (3, 8)])
@pytest.mark.parametrize("E, H", CONFIGS, ids=CONFIG_IDS)
def test_split_heads_q_linear_names(E, H, N, L, dtype, rng):
    ref = _torch_module(QLinearMultiHeadAttention, dtype, E, H)
    ours = _ours(MF.from_split_heads(module_state_to_numpy(ref)), E, H, dtype)
    x = randn(rng, (N, L, E), dtype)
    with torch.no_grad():
        expected = ref(to_torch(x))
    assert_close(ours(x)[0], expected, dtype)
    # and our state -> the q_linear names -> the tutorial's module
    tmha = _torch_module(nn.MultiheadAttention, dtype, E, H, batch_first=True)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in
                         MF.to_split_heads(module_state_to_numpy(tmha), naming="q_linear").items()})
    with torch.no_grad():
        expected = ref(to_torch(x))
    assert_close(_ours(module_state_to_numpy(tmha), E, H, dtype)(x)[0], expected, dtype)


# --------------------------------------------------------------------------------------------------
# einsum, shared per-head Linears
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("seq", SEQS, ids=SEQ_IDS)
@pytest.mark.parametrize("E, H", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("form", ["intended", "as_written"])
def test_einsum_shared_linears(form, E, H, seq, dtype, rng):
    N, L, S = seq
    cls = EinsumSelfAttentionIntended if form == "intended" else EinsumSelfAttention
    ref = _torch_module(cls, dtype, E, H)
    convert = MF.from_einsum_shared if form == "intended" else MF.from_einsum_as_written
    ours = _ours(convert(module_state_to_numpy(ref), H), E, H, dtype)
    q, k, v = randn(rng, (N, L, E), dtype), randn(rng, (N, S, E), dtype), randn(rng, (N, S, E), dtype)
    with torch.no_grad():
        expected = ref(to_torch(v), to_torch(k), to_torch(q))  # the tutorial's order: (values, keys, query)
    assert_close(ours(q, k, v)[0], expected, dtype)
    key_real = _lengths_mask(rng, N, S)
    with torch.no_grad():
        expected = ref(to_torch(v), to_torch(k), to_torch(q), mask=torch.from_numpy(key_real[:, None, None, :]))
    assert_close(ours(q, k, v, key_mask=key_real)[0], expected, dtype)


def test_literal_einsum_ignores_attention(rng):
    """The listing's einsum("nhqk,nvhd->nqhd") is Σ_v values for any attention: why the test
    module fixes it to "nhqk,nkhd->nqhd" (the attention-weighted sum), which is what we convert to."""
    attention = torch.softmax(torch.from_numpy(randn(rng, (2, 3, 4, 5), np.float64)), dim=-1)
    values = torch.from_numpy(randn(rng, (2, 5, 3, 6), np.float64))
    literal = torch.einsum("nhqk,nvhd->nqhd", [attention, values])
    assert_close(literal.numpy(), values.sum(dim=1, keepdim=True).expand(2, 4, 3, 6), np.float64)
    fixed = torch.einsum("nhqk,nkhd->nqhd", [attention, values])
    assert_close(fixed.numpy(), torch.matmul(attention, values.transpose(1, 2)).transpose(1, 2), np.float64)


def test_einsum_forms_differ_and_block_structure(rng):
    """The two readings of the einsum tutorial are different functions; the intended one is block-diagonal."""
    E, H = 12, 3
    ref = _torch_module(EinsumSelfAttentionIntended, np.float64, E, H)
    state = module_state_to_numpy(ref)
    intended, written = MF.from_einsum_shared(state, H), MF.from_einsum_as_written(state, H)
    x = randn(rng, (2, 5, E), np.float64)
    assert not np.allclose(_ours(intended, E, H, np.float64)(x)[0], _ours(written, E, H, np.float64)(x)[0])
    wq = intended["in_proj_weight"][:E]
    for h in range(H):
        for g in range(H):
            block = wq[h * 4:(h + 1) * 4, g * 4:(g + 1) * 4]
            assert np.array_equal(block, state["queries.weight"] if h == g else np.zeros((4, 4)))
    assert np.array_equal(written["in_proj_weight"], np.concatenate([np.eye(E)] * 3))
    back = MF.to_einsum_shared(intended, H)
    assert set(back) == set(state) and all(np.array_equal(back[k], state[k]) for k in state)


def test_to_einsum_shared_refuses_general_mha():
    tmha = _torch_module(nn.MultiheadAttention, np.float32, 12, 3, batch_first=True)
    state = module_state_to_numpy(tmha)
    with pytest.raises(ValueError, match="in_proj_bias"):
        MF.to_einsum_shared(state, 3)
    state["in_proj_bias"][:] = 0
    with pytest.raises(ValueError, match="in_proj_weight.*not block-diagonal"):
        MF.to_einsum_shared(state, 3)


def test_to_einsum_shared_converts_nan_weights():
    """A NaN in the shared block is the same NaN in every head's block: the form exists, and the
    conversion gives it (np.kron put 0 · NaN = NaN off the diagonal, and the check then said "not
    block-diagonal", even with one head, where every matrix is)."""
    for H, E in ((1, 4), (3, 12)):
        d = E // H
        shared = np.arange(d * d, dtype=np.float32).reshape(d, d)
        shared[1, 2] = np.nan
        w = np.zeros((3 * E, E), np.float32)  # q, k and v: block-diagonal, H copies of shared
        for j in range(3):
            for h in range(H):
                w[j * E + h * d:j * E + (h + 1) * d, h * d:(h + 1) * d] = shared
        state = {"in_proj_weight": w, "in_proj_bias": np.zeros(3 * E, np.float32),
                 "out_proj.weight": np.eye(E, dtype=np.float32), "out_proj.bias": np.zeros(E, np.float32)}
        out = MF.to_einsum_shared(state, H)
        for n in ("queries", "keys", "values"):
            np.testing.assert_array_equal(out[f"{n}.weight"], shared)  # NaN where shared has it
        if H > 1:  # a value off the blocks is still refused
            state["in_proj_weight"][0, d] = 5.0
            with pytest.raises(ValueError, match="not block-diagonal"):
                MF.to_einsum_shared(state, H)


# --------------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------------


def _per_head_state(E=12, H=3):
    m = PerHeadMultiHeadAttention(SimpleNamespace(hidden_size=E, num_attention_heads=H))
    return module_state_to_numpy(m)


def test_bad_input():
    s = _per_head_state()
    with pytest.raises(TypeError, match="state"):
        MF.from_per_head([1, 2])
    with pytest.raises(ValueError, match="missing keys.*heads.1.k.bias"):
        MF.from_per_head({k: v for k, v in s.items() if k != "heads.1.k.bias"})
    with pytest.raises(ValueError, match="unknown keys.*extra"):
        MF.from_per_head({**s, "extra": np.zeros(1)})
    with pytest.raises(ValueError, match="head indices"):
        MF.from_per_head({k.replace("heads.2.", "heads.5."): v for k, v in s.items()})
    with pytest.raises(ValueError, match="heads.0.q.weight.*expected shape \\(4, 12\\)"):
        MF.from_per_head({**s, "heads.0.q.weight": np.zeros((4, 11))})
    with pytest.raises(TypeError, match="heads.0.q.bias"):
        MF.from_per_head({**s, "heads.0.q.bias": np.array(["x"] * 4)})
    ours = MF.from_per_head(s)
    with pytest.raises(ValueError, match="num_heads"):
        MF.to_per_head(ours, 5)
    with pytest.raises(TypeError, match="num_heads"):
        MF.to_per_head(ours, 3.0)
    with pytest.raises(ValueError, match="in_proj_weight"):
        MF.to_per_head({**ours, "in_proj_weight": np.zeros((12, 12))}, 3)
    with pytest.raises(ValueError, match="naming"):
        MF.to_split_heads(ours, naming="per_head")
    with pytest.raises(ValueError, match="W_q/W_k/W_v/W_o"):
        MF.from_split_heads(s)
    e = module_state_to_numpy(EinsumSelfAttention(12, 3))
    with pytest.raises(ValueError, match="num_heads"):
        MF.from_einsum_shared(e, 5)
    with pytest.raises(ValueError, match="queries.weight.*expected shape \\(3, 3\\)"):
        MF.from_einsum_shared(e, 4)
    with pytest.raises(ValueError, match="missing keys.*fc_out.bias"):
        MF.from_einsum_as_written({k: v for k, v in e.items() if k != "fc_out.bias"}, 3)


def test_bias_free_mha_converts_with_zero_biases():
    mha = tcnn.MultiheadAttention(8, 2, bias=False)
    per_head = MF.to_per_head(mha.state_dict(), 2)
    assert np.all(per_head["heads.1.v.bias"] == 0) and np.all(per_head["output_linear.bias"] == 0)


def test_empty_state_is_refused():
    """embed_dim 0: torch's nn.MultiheadAttention and ours refuse it, so no conversion accepts an
    empty state (each returned empty arrays, a state no layer loads): a ValueError naming the
    weight that gives E."""
    with pytest.raises(ValueError, match="embed_dim"):
        torch.nn.MultiheadAttention(0, 1)
    with pytest.raises(ValueError, match="embed_dim"):
        tcnn.MultiheadAttention(0, 1)
    z2, z1 = np.zeros((0, 0)), np.zeros(0)
    ours = {"in_proj_weight": z2, "in_proj_bias": z1, "out_proj.weight": z2, "out_proj.bias": z1}
    for state in (ours, {"in_proj_weight": z2, "out_proj.weight": z2}):  # with and without biases
        for convert in (lambda s: MF.to_per_head(s, 1), MF.to_split_heads, lambda s: MF.to_einsum_shared(s, 1)):
            with pytest.raises(ValueError, match=r"state\['in_proj_weight'\]: .*E >= 1, got \(0, 0\)"):
                convert(state)
    per_head = {f"heads.0.{p}.{t}": (z2 if t == "weight" else z1) for p in "qkv" for t in ("weight", "bias")}
    with pytest.raises(ValueError, match=r"state\['output_linear.weight'\]: .*E >= 1, got \(0, 0\)"):
        MF.from_per_head({**per_head, "output_linear.weight": z2, "output_linear.bias": z1})
    for names in (("W_q", "W_k", "W_v", "W_o"), ("q_linear", "k_linear", "v_linear", "out_linear")):
        split = {f"{n}.{t}": (z2 if t == "weight" else z1) for n in names for t in ("weight", "bias")}
        with pytest.raises(ValueError, match=rf"state\['{names[0]}.weight'\]: .*E >= 1, got \(0, 0\)"):
            MF.from_split_heads(split)
    einsum = {"fc_out.weight": z2, "fc_out.bias": z1}
    with pytest.raises(ValueError, match=r"state\['fc_out.weight'\]: .*E >= 1, got \(0, 0\)"):
        MF.from_einsum_as_written(einsum, 3)
    with pytest.raises(ValueError, match=r"state\['fc_out.weight'\]: .*E >= 1, got \(0, 0\)"):
        MF.from_einsum_shared({**einsum, "queries.weight": z2, "keys.weight": z2, "values.weight": z2}, 1)


@pytest.mark.parametrize("dtype, want", [(np.float64, np.float64), (np.float16, np.float32), (np.float32, np.float32)])
def test_split_heads_and_einsum_returns_as_documented(rng, dtype, want):
    """The Returns sections of from_split_heads, to_split_heads and to_einsum_shared: the names,
    shapes (E = 6, H = 3, d = 2) and dtypes (float64 kept, others float32) they document, the
    blocks being in_proj's rows in order; torch tensors are read as arrays; a bias-free state
    gives zero biases."""
    E, H, d = 6, 3, 2
    w = rng.standard_normal((3 * E, E)).astype(dtype)
    b = rng.standard_normal(3 * E).astype(dtype)
    wo, bo = rng.standard_normal((E, E)).astype(dtype), rng.standard_normal(E).astype(dtype)
    mha = {"in_proj_weight": w, "in_proj_bias": b, "out_proj.weight": wo, "out_proj.bias": bo}
    split = MF.to_split_heads(mha, naming="q_linear")
    assert {k: (v.shape, v.dtype) for k, v in split.items()} == {
        f"{n}.{t}": ((E, E) if t == "weight" else (E,), np.dtype(want))
        for n in ("q_linear", "k_linear", "v_linear", "out_linear") for t in ("weight", "bias")}
    np.testing.assert_array_equal(split["k_linear.weight"], w[E:2 * E].astype(want))
    np.testing.assert_array_equal(split["v_linear.bias"], b[2 * E:].astype(want))
    np.testing.assert_array_equal(split["out_linear.weight"], wo.astype(want))
    back = MF.from_split_heads({k: torch.from_numpy(v) for k, v in split.items()})
    assert {k: (v.shape, v.dtype) for k, v in back.items()} == {
        "in_proj_weight": ((3 * E, E), want), "in_proj_bias": ((3 * E,), want),
        "out_proj.weight": ((E, E), want), "out_proj.bias": ((E,), want)}
    np.testing.assert_array_equal(back["in_proj_weight"], w.astype(want))
    no_bias = MF.to_split_heads({"in_proj_weight": w, "out_proj.weight": wo})
    assert np.all(no_bias["W_q.bias"] == 0) and np.all(no_bias["W_o.bias"] == 0)
    blocks = [rng.standard_normal((d, d)).astype(dtype) for _ in range(3)]
    shared = {"in_proj_weight": np.concatenate([np.kron(np.eye(H, dtype=dtype), m) for m in blocks]),
              "in_proj_bias": np.zeros(3 * E, dtype), "out_proj.weight": wo, "out_proj.bias": bo}
    einsum = MF.to_einsum_shared(shared, H)
    assert {k: (v.shape, v.dtype) for k, v in einsum.items()} == {
        "queries.weight": ((d, d), want), "keys.weight": ((d, d), want), "values.weight": ((d, d), want),
        "fc_out.weight": ((E, E), want), "fc_out.bias": ((E,), want)}
    for name, m in zip(("queries", "keys", "values"), blocks):
        np.testing.assert_array_equal(einsum[f"{name}.weight"], m.astype(want))
    np.testing.assert_array_equal(einsum["fc_out.bias"], bo.astype(want))
