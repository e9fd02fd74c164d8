"""Dropout on the attention probabilities (Srivastava et al. 2014; torch's ``dropout_p`` of
``F.scaled_dot_product_attention`` and ``dropout`` of ``nn.MultiheadAttention``), forward and backward.

torch draws its masks from its own generator, so the references here take our mask, which the
documentation defines: keep element ``(n, h, l, s)`` where ``functional.dropout`` of ones with the
same ``p`` and seed keeps the element at that flat index of ``(N, H, L, S)``. Given that mask, every
value and gradient is compared against torch's math: ``softmax(scores) * keep / (1 - p) @ v``.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import ATOL, DTYPE_IDS, FLOAT_DTYPES, RTOL, randn, to_torch
from test_training_layers import assert_grad, leaf, torch_attention_ref
from transformer_core import backward as B
from transformer_core import functional as F
from transformer_core.module import next_seed


def keep_scale(shape, p: float, seed: int, dtype) -> np.ndarray:
    """The documented mask as the factor the probabilities are multiplied by: 1 / (1 - p) where kept, 0
    where dropped (functional.dropout of ones)."""
    return F.dropout(np.ones(shape, dtype), p, seed)


def torch_sdpa(q, k, v, *, allowed=None, float_mask=None, causal=False, scale=None, factor=None):
    """softmax(q kᵀ · scale + mask) (· factor) v in torch ops, GQA by repeating heads, a row that sees
    no key giving zeros (our convention)."""
    H, Hkv = q.shape[-3], k.shape[-3]
    k, v = k.repeat_interleave(H // Hkv, -3), v.repeat_interleave(H // Hkv, -3)
    L, S = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if float_mask is not None:
        s = s + float_mask
    ok = torch.ones(s.shape, dtype=torch.bool)
    if causal:
        ok = ok & torch.ones(L, S, dtype=torch.bool).tril()
    if allowed is not None:
        ok = ok & allowed
    s = s.masked_fill(~ok, float("-inf"))
    valid = ~torch.isneginf(s.detach()).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(~valid, 0.0), -1) * valid
    if factor is not None:
        p = p * factor
    return p @ v


# (N, H, Hkv, L, S, E, Ev): odd sizes, seq 1, L != S, batch == seq, and the kernel's tile edges (query
# blocks of 128 rows, key blocks of 256; several query blocks share packed keys; one query row with few
# heads splits the keys into chunks, GQA decoding folds heads into rows, which dropout must not).
SHAPES = {
    "odd": (2, 3, 3, 5, 7, 9, 6),
    "seq1": (1, 2, 2, 1, 1, 4, 4),
    "batch_eq_seq": (3, 2, 1, 3, 3, 8, 8),
    "tile_edges": (1, 2, 2, 129, 257, 16, 16),
    "query_blocks_shared": (1, 1, 1, 300, 300, 32, 32),
    "one_row_split_keys_gqa": (1, 4, 2, 1, 1100, 8, 8),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
@pytest.mark.parametrize("path", ["flash", "reference"])
@pytest.mark.parametrize("mask", [None, "bool", "causal", "float"])
def test_sdpa_dropout_matches_torch_given_the_mask(rng, dtype, shape, path, mask):
    """Output, lse and the three input gradients of a dropout call against torch's math given our
    mask, on every path and the kernel's tile edges, with each kind of mask."""
    N, H, Hkv, L, S, E, Ev = SHAPES[shape]
    p, seed = 0.3, 12345
    q, k, v = randn(rng, (N, H, L, E), dtype), randn(rng, (N, Hkv, S, E), dtype), randn(rng, (N, Hkv, S, Ev), dtype)
    kw, ref_kw = {}, {}
    if mask == "bool":
        allowed = rng.random((N, 1, L, S)) < 0.7
        allowed[0, 0, L // 2] = False  # a row that sees nothing: zeros
        kw["attn_mask"], ref_kw["allowed"] = allowed, to_torch(allowed)
    elif mask == "float":
        fm = randn(rng, (L, S), dtype)
        kw["attn_mask"], ref_kw["float_mask"] = fm, to_torch(fm)
    elif mask == "causal":
        kw["is_causal"], ref_kw["causal"] = True, True
    factor = keep_scale((N, H, L, S), p, seed, dtype)
    assert 0 < (factor == 0).mean() < 1 or factor.size < 20
    out, lse = F.scaled_dot_product_attention(q, k, v, dropout_p=p, seed=seed, enable_gqa=Hkv != H, path=path,
                                              return_lse=True, **kw)
    qt, kt, vt = leaf(q), leaf(k), leaf(v)
    want = torch_sdpa(qt, kt, vt, factor=to_torch(factor), **ref_kw)
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=RTOL[np.dtype(dtype)], atol=ATOL[np.dtype(dtype)])
    # the lse is the undropped softmax's (what the backward recomputes the probabilities from; without
    # dropout, one query row of GQA runs its heads as rows of one block: the same value, other roundings)
    _, lse0 = F.scaled_dot_product_attention(q, k, v, enable_gqa=Hkv != H, path=path, return_lse=True, **kw)
    np.testing.assert_allclose(lse, lse0, rtol=RTOL[np.dtype(dtype)], atol=ATOL[np.dtype(dtype)])
    # the backward regenerates the mask from the same seed
    g = randn(rng, out.shape, dtype)
    dq, dk, dv = B.scaled_dot_product_attention_backward(q, k, v, out, g, lse, dropout_p=p, seed=seed,
                                                         enable_gqa=Hkv != H, **kw)
    (want * to_torch(g)).sum().backward()
    for name, ours, ref in (("grad_query", dq, qt.grad), ("grad_key", dk, kt.grad), ("grad_value", dv, vt.grad)):
        ref = ref.numpy()  # fp32 1e-5, fp64 1e-10, relative to the gradient's size where it passes 1
        tol = ATOL[np.dtype(dtype)] * max(1.0, float(np.abs(ref).max()))
        np.testing.assert_allclose(ours, ref, rtol=0, atol=tol, err_msg=name)


def test_sdpa_dropout_paths_agree_and_the_mask_keeps_one_minus_p(rng):
    """flash and reference drop the same probabilities; about 1 - p of them are kept; another seed
    drops others; p = 0 is the plain call bit for bit."""
    q, k, v = (randn(rng, (2, 4, 64, 16), np.float64) for _ in range(3))
    a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.25, seed=7, path="flash")
    b = F.scaled_dot_product_attention(q, k, v, dropout_p=0.25, seed=7, path="reference")
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    # the weights returned are the dropped ones (torch's MultiheadAttention returns those in training)
    _, w = F.scaled_dot_product_attention(q, k, v, dropout_p=0.25, seed=7, return_weights=True)
    _, w0 = F.scaled_dot_product_attention(q, k, v, return_weights=True)
    factor = keep_scale(w.shape, 0.25, 7, np.float64)
    np.testing.assert_allclose(w, w0 * factor, rtol=1e-15, atol=0)
    kept = (factor != 0).mean()
    assert abs(kept - 0.75) < 0.01, kept  # 32768 draws: 4 sigma is 0.0096
    assert not np.array_equal(a, F.scaled_dot_product_attention(q, k, v, dropout_p=0.25, seed=8))
    np.testing.assert_array_equal(F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, seed=8),
                                  F.scaled_dot_product_attention(q, k, v))


def test_sdpa_dropout_seed_none_draws_from_the_package_generator(rng):
    """seed=None (torch's call, which has no seed) takes the next seed of manual_seed's generator: the
    same after the same manual_seed, another on the next call."""
    q, k, v = (randn(rng, (1, 2, 9, 8), np.float32) for _ in range(3))
    tc.manual_seed(3)
    a = F.scaled_dot_product_attention(q, k, v, None, 0.5)
    b = F.scaled_dot_product_attention(q, k, v, None, 0.5)
    tc.manual_seed(3)
    seed = next_seed()
    np.testing.assert_array_equal(a, F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=seed))
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("dropout_p, exc, match", [
    (1.5, ValueError, r"dropout_p: expected a finite number in \[0\.0, 1\.0\]"),
    (-0.5, ValueError, r"dropout_p: expected a finite number in \[0\.0, 1\.0\]"),
    (float("nan"), ValueError, r"dropout_p: expected a finite number"),
    ("0", TypeError, r"dropout_p: expected a number"),
    (True, TypeError, r"dropout_p: expected a number"),  # is_causal given in dropout_p's place
])
def test_sdpa_dropout_p_is_checked(rng, dropout_p, exc, match):
    """dropout_p is a probability in [0, 1], as torch's (a bool in its slot too: torch's is_causal)."""
    q = randn(rng, (1, 2, 3, 4), np.float32)
    with pytest.raises(exc, match=match):
        F.scaled_dot_product_attention(q, q, q, dropout_p=dropout_p)


def test_sdpa_dropout_p_one_drops_everything(rng):
    """p = 1 (torch accepts it): every probability dropped, zeros out, as torch's dropout gives."""
    q = randn(rng, (1, 2, 3, 4), np.float32)
    out = F.scaled_dot_product_attention(q, q, q, dropout_p=1.0, seed=1)
    want = torch.nn.functional.scaled_dot_product_attention(to_torch(q), to_torch(q), to_torch(q), dropout_p=1.0)
    np.testing.assert_array_equal(out, want.numpy())


def test_sdpa_seed_is_checked(rng):
    """seed is an int in [0, 2**64) or None, named in the error."""
    q = randn(rng, (1, 2, 3, 4), np.float32)
    for bad, exc in ((-1, ValueError), (2**64, ValueError), (1.5, TypeError), ("1", TypeError)):
        with pytest.raises(exc, match="^seed: "):
            F.scaled_dot_product_attention(q, q, q, dropout_p=0.1, seed=bad)


# --------------------------------------------------------------------------------------------------
# nn.MultiheadAttention(dropout=p): the training forward and its backward
# --------------------------------------------------------------------------------------------------

MHA_CASES = {
    "self": dict(E=12, H=4, Hkv=4, N=2, L=5, S=None),
    "cross_odd_gqa": dict(E=12, H=4, Hkv=2, N=3, L=4, S=9),
    "tile_edge": dict(E=8, H=2, Hkv=2, N=1, L=129, S=None),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", list(MHA_CASES), ids=list(MHA_CASES))
def test_multihead_attention_dropout_matches_torch_given_the_mask(rng, dtype, case):
    """nn.MultiheadAttention(dropout=p) in training: output, the returned (dropped) weights, the
    input and parameter gradients against torch's math with the mask of the seed the layer drew."""
    c = MHA_CASES[case]
    E, H, Hkv, N, L = c["E"], c["H"], c["Hkv"], c["N"], c["L"]
    self_attention = c["S"] is None
    S = L if self_attention else c["S"]
    p = 0.2
    ours = tc.nn.MultiheadAttention(E, H, num_key_value_heads=Hkv, dtype=dtype, dropout=p)
    state = {k: randn(rng, v.shape, dtype, 0.4) for k, v in ours.state_dict().items()}
    ours.load_state_dict(state)
    q = randn(rng, (N, L, E), dtype)
    k = None if self_attention else randn(rng, (N, S, E), dtype)
    g = randn(rng, (N, L, E), dtype)
    ours.train()
    tc.manual_seed(21)
    out, weights = ours(q, k, k, is_causal=self_attention, average_attn_weights=False)
    grads = ours.backward(g)
    tc.manual_seed(21)
    factor = keep_scale((N, H, L, S), p, next_seed(), dtype)

    params = {name: leaf(x) for name, x in state.items()}
    qt = leaf(q)
    kt = qt if self_attention else leaf(k)
    want = torch_attention_ref(params, qt, kt, kt, H, Hkv, causal=self_attention, dropout=to_torch(factor))
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-4 if dtype == np.float32 else 1e-10,
                               atol=ATOL[np.dtype(dtype)])
    # the weights returned in training are the dropped ones (torch's), those the output was made with
    _, w_eval = ours.eval()(q, k, k, is_causal=self_attention, average_attn_weights=False)
    np.testing.assert_allclose(weights, w_eval * factor, rtol=RTOL[np.dtype(dtype)], atol=ATOL[np.dtype(dtype)])
    (want * to_torch(g)).sum().backward()
    if self_attention:
        assert_grad(grads, qt.grad, dtype, "grad_query")
    else:
        gq, gk, gv = grads
        assert_grad(gq, qt.grad, dtype, "grad_query")
        assert_grad(gk + gv, kt.grad, dtype, "grad_key + grad_value")  # key and value are one array
    for name, t in params.items():
        assert_grad(ours.gradients().get(name), t.grad, dtype, name)


def test_multihead_attention_dropout_only_in_training(rng):
    """dropout applies in training forwards only: eval gives the plain output; in training the same
    seed gives the same output, and the rate may be changed between calls (0: no dropout)."""
    x = randn(rng, (2, 6, 8), np.float64)
    mha = tc.nn.MultiheadAttention(8, 2, dtype=np.float64, dropout=0.5)
    plain = mha(x, need_weights=False)[0]
    mha.dropout = 0.0
    np.testing.assert_array_equal(mha(x, need_weights=False)[0], plain)
    mha.train()
    np.testing.assert_array_equal(mha(x, need_weights=False)[0], plain)
    mha.backward(np.ones_like(plain))
    mha.dropout = 0.5
    tc.manual_seed(4)
    a = mha(x, need_weights=False)[0]
    mha.backward(np.ones_like(a))
    tc.manual_seed(4)
    np.testing.assert_array_equal(mha(x, need_weights=False)[0], a)
    assert not np.allclose(a, plain)
    for bad, exc in ((1.0, ValueError), (-0.1, ValueError), ("0.1", TypeError)):
        with pytest.raises(exc, match="^dropout: expected a probability"):
            tc.nn.MultiheadAttention(8, 2, dropout=bad)


@pytest.mark.parametrize("bad, exc", [("0.1", TypeError), (-0.2, ValueError), (1.5, ValueError),
                                      (float("nan"), ValueError), (1.0, ValueError)])
def test_a_dropout_assigned_later_is_checked_as_the_constructors(rng, bad, exc):
    """The layers' and the seq2seq model's dropout attribute, assigned after construction, is checked
    as the constructor checks it, in a training forward before any work, naming dropout (a str gave
    Python's comparison error, -0.2 the kernel's words, and the seq2seq model skipped a negative one);
    eval mode does not read it, as MultiheadAttention."""
    x = randn(rng, (2, 5, 8), np.float64)
    ids = np.array([[1, 2, 3, 4]])
    layers = [(tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=np.float64), lambda m: m(x)),
              (tc.nn.TransformerDecoderLayer(8, 2, 16, dtype=np.float64), lambda m: m(x, x)),
              (tc.Seq2SeqTransformer(13, 11, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                     dim_feedforward=16, max_len=8), lambda m: m.loss(ids, ids, ids))]
    for module, run in layers:
        module.dropout = bad
        module.eval()
        run(module)
        module.train()
        with pytest.raises(exc, match="^dropout: expected a probability"):
            run(module)
        module.dropout = 0.25
        run(module)  # and runs again once set right


# --------------------------------------------------------------------------------------------------
# Layers and models: their dropout= / config fields reach the attention; forward and backward agree
# --------------------------------------------------------------------------------------------------

def finite_difference_check(loss_and_grad, x: np.ndarray, indices, eps=1e-6, tol=1e-6) -> None:
    """loss_and_grad(x) -> (loss, grad of x) with the same seed each call: the gradient matches central
    differences at ``indices`` (a wrong mask in the backward would not)."""
    _, grad = loss_and_grad(x)
    for idx in indices:
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        fd = (loss_and_grad(xp)[0] - loss_and_grad(xm)[0]) / (2 * eps)
        assert abs(fd - grad[idx]) < tol, (idx, fd, grad[idx])


def test_decoder_layer_dropout_reaches_both_attentions_and_backward_agrees(rng):
    """TransformerDecoderLayer(dropout=p): torch drops the self- and cross-attention probabilities
    too. With only the attentions able to change the output (a layer whose residual dropouts are
    checked away by comparing against p on the probabilities alone is not possible from outside),
    the training output differs from eval, is a fixed function for a seed, and its backward matches
    central differences in fp64 for tgt and memory."""
    layer = tc.nn.TransformerDecoderLayer(6, 2, 10, dtype=np.float64, dropout=0.3).train()
    tgt, mem = randn(rng, (2, 4, 6), np.float64), randn(rng, (2, 5, 6), np.float64)
    g = randn(rng, (2, 4, 6), np.float64)

    def run(t, m):
        """(loss, (grad tgt, grad memory)) of one seeded training forward and its backward."""
        tc.manual_seed(9)
        y = layer(t, m)
        return float((y * g).sum()), layer.backward(g)

    finite_difference_check(lambda t: (run(t, mem)[0], run(t, mem)[1][0]), tgt, [(0, 0, 0), (1, 3, 5)])
    finite_difference_check(lambda m: (run(tgt, m)[0], run(tgt, m)[1][1]), mem, [(0, 4, 1), (1, 0, 2)])


def test_encoder_layer_dropout_includes_the_attention_probabilities(rng):
    """TransformerEncoderLayer(dropout=p) drops the self-attention's probabilities too, as torch's
    (its self_attn has the layer's dropout). A layer built so that out = src + drop1(SA(norm1(src)))
    with uniform attention (q = k = 0) and v = norm1(src): without dropout on the probabilities every
    row's context is the same mean of v, so the nonzero values of each column of out - src (drop1 only
    zeroes or doubles them) would all be equal; dropped probabilities make them differ."""
    E, L = 4, 64
    layer = tc.nn.TransformerEncoderLayer(E, 1, 8, dtype=np.float64, dropout=0.5, norm_first=True).train()
    state = layer.state_dict()
    for name in ("linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"):  # FFN(x) = 0
        state[name] = np.zeros_like(state[name])
    state["self_attn.out_proj.weight"] = np.eye(E)
    state["self_attn.out_proj.bias"] = np.zeros(E)
    w = np.zeros_like(state["self_attn.in_proj_weight"])
    w[2 * E:] = np.eye(E)
    state["self_attn.in_proj_weight"] = w
    state["self_attn.in_proj_bias"] = np.zeros(3 * E)
    layer.load_state_dict(state)
    src = randn(rng, (1, L, E), np.float64)
    out = layer(src)
    layer.backward(np.ones_like(out))
    branch = out[0] - src[0]
    for e in range(E):
        column = branch[:, e][np.abs(branch[:, e]) > 1e-12]
        assert column.size > 8 and np.ptp(column) > 1e-6, "the attention's probabilities were not dropped"
    layer.dropout = 0.0  # the same layer without dropout: every row the same mean of v
    plain = layer(src)[0] - src[0]
    np.testing.assert_allclose(plain, np.broadcast_to(plain[0], plain.shape), atol=1e-12)


@pytest.mark.parametrize("model", ["gpt2", "llama", "bert"])
def test_model_attention_dropout_fields_apply_and_backward_agrees(rng, model):
    """GPT-2's attn_pdrop, Llama's attention_dropout and BERT's attention_probs_dropout_prob (the
    models' other dropouts at 0) change the training loss, and the loss's gradient with respect to a
    weight matches central differences in fp64: the backward regenerates the forward's masks."""
    ids = rng.integers(1, 20, (2, 7))
    if model == "bert":
        m = tc.BertModel(tc.BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=12, max_position_embeddings=8,
                                       attention_probs_dropout_prob=0.4, add_pooling_layer=False),
                         dtype=np.float64)
        g = randn(rng, (2, 7, 8), np.float64)

        def loss():
            """BERT's seeded training forward, reduced against g."""
            tc.manual_seed(5)
            return float((m(ids).last_hidden_state * g).sum())

        def backward():
            """Its backward, given g."""
            m.backward(g)
    else:
        if model == "gpt2":
            cfg = tc.GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=2, n_head=2, attn_pdrop=0.4)
            m = tc.GPT2LMHeadModel(cfg, dtype=np.float64)
        else:
            cfg = tc.LlamaConfig(vocab_size=20, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8,
                                 attention_dropout=0.4)
            m = tc.LlamaForCausalLM(cfg, dtype=np.float64)

        def loss():
            """The causal LM's seeded training loss."""
            tc.manual_seed(5)
            return float(m.loss(ids, labels=ids))

        def backward():
            """Its backward."""
            m.backward()
    m.eval()
    plain = loss()
    m.train()
    first = loss()
    assert first != plain and loss() == first
    name = next(n for n in m.state_dict() if "q_proj" in n or "c_attn.weight" in n or "query.weight" in n)
    weight = m.state_dict()[name]
    idx = (1, 2)

    def at(value):
        """The seeded loss with the checked weight element set to ``value``."""
        state = m.state_dict()
        state[name] = weight.copy()
        state[name][idx] = value
        m.load_state_dict(state)
        return loss()

    eps = 1e-6
    at(weight[idx])
    m.zero_grad()
    backward()
    grad = m.gradients()[name][idx]
    fd = (at(weight[idx] + eps) - at(weight[idx] - eps)) / (2 * eps)
    assert abs(fd - grad) < 1e-6 * max(1.0, abs(fd)), (fd, grad)
