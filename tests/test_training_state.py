"""What a call leaves behind: a refused or failed call changes no training state and draws no
dropout seed, a training forward keeps its own copy of what the caller may still change, a
module's Parameters stay the same objects, and the gradient setter copies any array it can.

Each test computes the uninterrupted run (or the exact value) as its reference."""

from __future__ import annotations

import copy
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformer_core as tc


# ------------------------------------------------------------------------ Seq2SeqTransformer
def _seq2seq(dropout=0.0):
    tc.manual_seed(0)
    m = tc.Seq2SeqTransformer(10, 12, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                              dim_feedforward=16, dropout=dropout, max_len=10)
    m.train()
    return m


SRC, TGT, LAB = np.array([[1, 2, 3]]), np.array([[1, 2]]), np.array([[2, 3]])


def test_seq2seq_forward_after_loss_drops_the_loss():
    """A training forward between loss and backward used to pair the loss's dlogits with the new
    forward's activations (gradients off by 1.4, other embedding rows)."""
    m = _seq2seq()
    m.loss(SRC, TGT, LAB)
    m(np.array([[4, 5, 6]]), np.array([[7, 8]]))
    with pytest.raises(tc.NoTrainingStateError):
        m.backward()


@pytest.mark.parametrize("refused", ["label_smoothing", "tgt id", "tgt length"])
def test_seq2seq_refused_call_changes_nothing(refused):
    """A refused call (checked only after the forward ran, or after src's embedding drew its
    dropout seed) used to leave the children's state and the generator changed: the pending
    backward mixed two forwards, and the next loss under the same seed differed."""
    def refused_call(m):
        with pytest.raises(ValueError, match={"label_smoothing": "label_smoothing", "tgt id": "tgt: expected ids",
                                              "tgt length": "tgt: length"}[refused]):
            if refused == "label_smoothing":
                m.loss(np.array([[4, 5, 6]]), np.array([[7, 8]]), LAB, label_smoothing=2.0)
            elif refused == "tgt id":
                m(np.array([[4, 5, 6]]), np.array([[7, 99]]))
            else:
                m(np.array([[4, 5, 6]]), np.ones((1, 11), np.int64))

    _assert_refused_between_loss_and_backward_changes_nothing(refused_call)


def _assert_refused_between_loss_and_backward_changes_nothing(refused_calls) -> None:
    """A loss, ``refused_calls(model)`` (each call in it refused), then backward and the next loss:
    the gradients and the next loss of a run without the refused calls, bit for bit (no pending
    state dropped, no dropout seed drawn)."""
    clean = _seq2seq(dropout=0.3)
    clean.loss(SRC, TGT, LAB)
    clean.backward()
    clean_next = clean.loss(SRC, TGT, LAB)

    m = _seq2seq(dropout=0.3)
    m.loss(SRC, TGT, LAB)
    refused_calls(m)
    m.backward()
    for name, g in clean.gradients().items():
        np.testing.assert_array_equal(m.gradients()[name], g, err_msg=name)
    assert m.loss(SRC, TGT, LAB) == clean_next  # the same dropout draws: no seed was taken


def _translation_tutorial(E: int, maxlen: int, src_vocab: int = 13, tgt_vocab: int = 11) -> torch.nn.Module:
    """PyTorch's "Language Translation with nn.Transformer" tutorial's ``Seq2SeqTransformer`` as it
    builds it (batch-first, dropout 0, 1 + 1 layers of 2 heads, feed-forward 16): its embeddings
    wrapped in ``TokenEmbedding``, its sinusoidal table computed in float32 as the buffer
    ``positional_encoding.pos_embedding (maxlen, 1, E)``."""
    import math

    class TokenEmbedding(torch.nn.Module):
        def __init__(self, vocab, emb):
            super().__init__()
            self.embedding = torch.nn.Embedding(vocab, emb)

        def forward(self, tokens):
            return self.embedding(tokens) * math.sqrt(E)

    class PositionalEncoding(torch.nn.Module):
        def __init__(self, emb, n):
            super().__init__()
            den = torch.exp(-torch.arange(0, emb, 2) * math.log(10000) / emb)
            pos = torch.arange(0, n).reshape(n, 1)
            pe = torch.zeros((n, emb))
            pe[:, 0::2] = torch.sin(pos * den)
            pe[:, 1::2] = torch.cos(pos * den)
            self.register_buffer("pos_embedding", pe.unsqueeze(-2))

        def forward(self, x):  # batch-first here
            return x + self.pos_embedding[: x.size(1), 0]

    class Tutorial(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = torch.nn.Transformer(E, 2, 1, 1, 16, 0.0, batch_first=True)
            self.generator = torch.nn.Linear(E, tgt_vocab)
            self.src_tok_emb, self.tgt_tok_emb = TokenEmbedding(src_vocab, E), TokenEmbedding(tgt_vocab, E)
            self.positional_encoding = PositionalEncoding(E, maxlen)

        def forward(self, src, tgt):
            mask = self.transformer.generate_square_subsequent_mask(tgt.size(1), dtype=self.generator.weight.dtype)
            x = self.positional_encoding(self.src_tok_emb(src))
            y = self.positional_encoding(self.tgt_tok_emb(tgt))
            return self.generator(self.transformer(x, y, tgt_mask=mask))

    return Tutorial()


def test_seq2seq_loads_the_translation_tutorials_own_names():
    """The tutorial wraps its embeddings in TokenEmbedding (``src_tok_emb.embedding.weight``) and
    keeps its sinusoidal table as the buffer ``positional_encoding.pos_embedding``: its state_dict
    was refused. Built as the tutorial builds it (its table formula, in float32), it loads and gives
    the tutorial's logits."""
    E, maxlen = 8, 64
    torch.manual_seed(0)
    ref = _translation_tutorial(E, maxlen).eval()
    ours = tc.Seq2SeqTransformer(13, 11, d_model=E, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                 dim_feedforward=16, max_len=maxlen)
    state = {k: v.numpy() for k, v in ref.state_dict().items()}
    ours.load_state_dict(state)
    src, tgt = np.array([[1, 2, 3, 4], [5, 6, 7, 8]]), np.array([[1, 2, 3], [4, 5, 6]])
    with torch.no_grad():
        want = ref(torch.from_numpy(src), torch.from_numpy(tgt)).numpy()
    np.testing.assert_allclose(ours(src, tgt), want, atol=1e-5, rtol=1e-5)
    # torch's keyword arguments, the table included (they were refused: TypeError)
    prefixed = ours.state_dict(prefix="model.")
    assert list(prefixed) == ["model." + k for k in ours.state_dict()]
    assert "model.positional_encoding.pos_embedding" in prefixed
    with pytest.raises(ValueError, match="assign"):
        ours.load_state_dict(state, strict=True, assign=True)
    state["positional_encoding.pos_embedding"] = state["positional_encoding.pos_embedding"] + 0.01
    with pytest.raises(ValueError, match=r"pos_embedding'\]: not the sinusoidal table this model adds"):
        ours.load_state_dict(state)


def test_seq2seq_loads_a_bfloat16_tutorials_table():
    """Module.load_state_dict takes bfloat16 tensors, but the tutorial's table cast to bfloat16
    (rounded by up to 2^-9) failed the 1e-3 check: refused as "not the sinusoidal table". Now
    loaded: the bfloat16 values, as the tutorial in bfloat16 holds them."""
    E, maxlen = 8, 64
    torch.manual_seed(0)
    ref = _translation_tutorial(E, maxlen).to(torch.bfloat16).eval()
    ours = tc.Seq2SeqTransformer(13, 11, d_model=E, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                 dim_feedforward=16, max_len=maxlen)
    ours.load_state_dict(ref.state_dict())
    table = ref.state_dict()["positional_encoding.pos_embedding"].float().numpy()[:, 0]
    assert np.array_equal(ours.state_dict()["positional_encoding.pos_embedding"][:, 0], table)
    bad = {k: v.clone() for k, v in ref.state_dict().items()}
    bad["positional_encoding.pos_embedding"] += 0.01
    with pytest.raises(ValueError, match=r"pos_embedding'\]: not the sinusoidal table this model adds"):
        ours.load_state_dict(bad)


def test_seq2seq_position_table_refusals_name_what_was_given():
    """A wrong-width ``(maxlen, 1, E)`` table was reported squeezed ("got (5000, 8)"), and an int
    table, documented as a TypeError, was loaded (a 0/1 row passed as the sinusoidal one)."""
    ours = tc.Seq2SeqTransformer(11, 13, d_model=16, nhead=4, num_encoder_layers=1, num_decoder_layers=1,
                                 dim_feedforward=24)
    state = ours.state_dict()
    name = "positional_encoding.pos_embedding"
    assert name not in state and not ours.pe_loaded  # a model not loaded from the tutorial has none
    with pytest.raises(ValueError, match=r"expected shape \(maxlen, 1, 16\) .*got \(5000, 1, 8\)$"):
        ours.load_state_dict({**state, name: np.zeros((5000, 1, 8), np.float32)})
    row = np.zeros((1, 1, 16), np.int64)
    row[0, 0, 1::2] = 1  # position 0 of the sinusoidal table, as ints
    for table in (row, torch.from_numpy(row).int(), row.astype(bool)):
        with pytest.raises(TypeError, match=r"pos_embedding'\]: expected a floating-point table, got dtype"):
            ours.load_state_dict({**state, name: table})
    assert not ours.pe_loaded
    ours.load_state_dict({**state, name: row.astype(np.float32)})  # the same row as floats: loaded
    assert ours.pe_loaded


@pytest.mark.parametrize("dtype,L,atol", [(np.float64, 500, 1e-10), (np.float32, 2000, 4e-6)], ids=["f64", "f32"])
def test_seq2seq_keeps_the_translation_tutorials_position_table(dtype, L, atol):
    """The tutorial's float32 ``pos_embedding`` was checked, then dropped for the model's exact
    table: the logits of its loaded weights differed from the tutorial's (f64: by 2e-6 at length
    500; f32: by 1.2e-5 at length 2000). Now the loaded rows are kept (cast): the tutorial's logits,
    to the dtype's tolerance; its rows go with ``state_dict()`` (a saved model loads them back, and
    the tutorial loads ours), and a strict load without them sets the exact table back."""
    E = 8
    torch.manual_seed(0)
    ref = _translation_tutorial(E, L).eval().to(torch.float64 if dtype == np.float64 else torch.float32)
    ours = tc.Seq2SeqTransformer(13, 11, d_model=E, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                 dim_feedforward=16, max_len=L, dtype=dtype)
    fresh = copy.deepcopy(ours)
    state = {k: v.numpy() for k, v in ref.state_dict().items()}
    ours.load_state_dict(state)
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(0, 13, (1, L)), rng.integers(0, 11, (1, L))
    with torch.no_grad():
        want = ref(torch.from_numpy(src), torch.from_numpy(tgt)).numpy()
    got = ours(src, tgt)
    np.testing.assert_allclose(got, want, atol=atol, rtol=0)
    table = ref.positional_encoding.pos_embedding.numpy()[:, 0]
    np.testing.assert_array_equal(ours.pe, table.astype(dtype))
    # the table goes with the state_dict: a model loaded from it is the same, and the tutorial loads it
    saved = ours.state_dict()
    assert saved["positional_encoding.pos_embedding"].shape == (L, 1, E)
    again = copy.deepcopy(fresh)
    again.load_state_dict(saved)
    np.testing.assert_array_equal(again(src, tgt), got)
    back = _translation_tutorial(E, L).to(ref.generator.weight.dtype)
    wrapped = {"src_tok_emb.weight": "src_tok_emb.embedding.weight", "tgt_tok_emb.weight": "tgt_tok_emb.embedding.weight"}
    back.load_state_dict({wrapped.get(k, k): torch.from_numpy(v) for k, v in saved.items()})
    with torch.no_grad():
        np.testing.assert_array_equal(back.eval()(torch.from_numpy(src), torch.from_numpy(tgt)).numpy(), want)
    # a refused load keeps the table it had; a strict load without one: the exact table, as a model
    # built anew (strict=False: the table it holds)
    refused = copy.deepcopy(fresh)
    with pytest.raises(ValueError, match="mis-shaped"):
        refused.load_state_dict(dict(saved, **{"generator.bias": np.zeros(3)}))
    assert not np.array_equal(fresh.pe, ours.pe)
    np.testing.assert_array_equal(refused.pe, fresh.pe)
    plain = {k: v for k, v in saved.items() if k != "positional_encoding.pos_embedding"}
    again.load_state_dict(plain, strict=False)
    np.testing.assert_array_equal(again.pe, ours.pe)
    again.load_state_dict(plain)
    np.testing.assert_array_equal(again.pe, fresh.pe)
    assert "positional_encoding.pos_embedding" not in again.state_dict()


@pytest.mark.parametrize("ignore_index", [2**70, np.uint64(2**64 - 1), -2**63 - 1], ids=["2**70", "uint64", "-2**63-1"])
def test_seq2seq_loss_refuses_an_ignore_index_past_int64_before_the_forward(ignore_index):
    """Only the type of ``ignore_index`` was checked before the forward: one past the int64 range
    ran it, then the cross-entropy refused it, dropping the pending loss (backward raised) and
    drawing dropout seeds (the next loss differed)."""
    def refused_calls(m):
        with pytest.raises(ValueError, match=r"^ignore_index: expected an int in \[-9223372036854775808, "
                                             rf"2\*\*63 - 1\], got {int(ignore_index)}$"):
            m.loss(SRC, TGT, LAB, ignore_index=ignore_index)
        with pytest.raises(TypeError, match=r"^ignore_index: expected an int, got float"):
            m.loss(SRC, TGT, LAB, ignore_index=-100.0)

    _assert_refused_between_loss_and_backward_changes_nothing(refused_calls)


@pytest.mark.parametrize("bad,error,match", [
    ({"nhead": 3}, ValueError, r"^d_model: expected a multiple of nhead \(3\), got 8"),
    ({"activation": "bogus"}, ValueError, r"^activation: "),
    ({"dim_feedforward": 0}, ValueError, r"^dim_feedforward: "),
    ({"layer_norm_eps": -1.0}, ValueError, r"^layer_norm_eps: "),
    ({"norm_first": "yes"}, TypeError, r"^norm_first: "),
    ({"bias": 2}, TypeError, r"^bias: "),
    ({"num_encoder_layers": 0}, ValueError, r"^num_encoder_layers: expected an int in \[1, 2\*\*63 - 1\], got 0"),
    ({"num_decoder_layers": 1.5}, TypeError, r"^num_decoder_layers: expected an int, got float 1.5"),
], ids=["nhead", "activation", "dim_feedforward", "layer_norm_eps", "norm_first", "bias", "num_encoder_layers",
        "num_decoder_layers"])
def test_seq2seq_checks_the_transformers_arguments_before_building_the_embeddings(monkeypatch, bad, error, match):
    """The embedding tables were built and randomly filled before the Transformer's arguments were
    checked (with large vocabularies, hundreds of MB for a typo in nhead); a bad layer count was
    named ``num_layers``. Now no embedding is built before the refusal, and the weights of a model
    are those of a standalone Transformer and Embeddings built in its order from the same seed."""
    import transformer_core.seq2seq as seq2seq_module

    built = []

    class RecordingEmbedding(tc.nn.Embedding):
        def __init__(self, *args, **kwargs):
            built.append(args[:2])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(seq2seq_module, "Embedding", RecordingEmbedding)
    args = dict(src_vocab_size=10, tgt_vocab_size=12, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                dim_feedforward=16, max_len=10)
    with pytest.raises(error, match=match):
        tc.Seq2SeqTransformer(**dict(args, **bad))
    assert built == []
    tc.manual_seed(5)
    model = tc.Seq2SeqTransformer(**args)
    assert built == [(10, 8), (12, 8)]
    state = model.state_dict()
    tc.manual_seed(5)
    transformer, src, tgt = tc.nn.Transformer(8, 2, 1, 1, 16), tc.nn.Embedding(10, 8), tc.nn.Embedding(12, 8)
    np.testing.assert_array_equal(state["src_tok_emb.weight"], src.state_dict()["weight"])
    np.testing.assert_array_equal(state["tgt_tok_emb.weight"], tgt.state_dict()["weight"])
    for name, value in transformer.state_dict().items():
        np.testing.assert_array_equal(state["transformer." + name], value, err_msg=name)


def test_backward_after_eval_says_to_run_the_loss_again():
    """eval() drops what the training loss kept, so "call .train() first" could not help: following
    it, backward raised again. The message says to run the loss (or forward) again, and doing so
    gives the uninterrupted run's gradients."""
    clean = _seq2seq()
    clean.loss(SRC, TGT, LAB)
    clean.backward()
    m = _seq2seq()
    m.loss(SRC, TGT, LAB)
    m.eval()
    with pytest.raises(tc.NoTrainingStateError, match=r"\(mode: eval; call \.train\(\), then run the loss again\)"):
        m.backward()
    m.train()
    m.loss(SRC, TGT, LAB)
    m.backward()
    for name, g in clean.gradients().items():
        np.testing.assert_array_equal(m.gradients()[name], g, err_msg=name)
    # the generic text: a module's own backward (Linear) and a composite's (a stack)
    x = np.ones((1, 3, 8), np.float32)
    for module, inp, grad in [(tc.nn.Linear(3, 2), np.ones((1, 3), np.float32), np.ones((1, 2), np.float32)),
                              (tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(8, 2, 16), 2), x, x)]:
        module.train()
        module(inp)
        module.eval()
        with pytest.raises(tc.NoTrainingStateError,
                           match=r"\(mode: eval \(call \.train\(\), then run the loss \(or forward\) again\); "):
            module.backward(grad)
        module.train()
        module(inp)
        assert module.backward(grad).shape == inp.shape


def test_seq2seq_sizes_past_memory_name_its_own_arguments():
    with pytest.raises(ValueError, match=r"^src_vocab_size, d_model: the source embedding table"):
        tc.Seq2SeqTransformer(2**40, 100, d_model=8, nhead=2)
    with pytest.raises(ValueError, match=r"^max_len, d_model: the sinusoidal position table"):
        tc.Seq2SeqTransformer(10, 10, d_model=8, nhead=2, max_len=2**40)


# ------------------------------------------------------------------------ nn.Transformer
@pytest.mark.parametrize("bad", [{"memory_key_mask": np.ones((2, 4), bool)}, {"tgt_mask": np.zeros((3, 3))},
                                 {"tgt_key_mask": np.ones((2, 5), bool)}, {"memory_is_causal": 1}])
def test_transformer_refuses_decoder_arguments_before_the_encoder_runs(bad):
    """The decoder's masks were checked only after the encoder had run: a refused call overwrote
    the encoder's training state (encoder gradients off by 0.65) and drew its dropout seeds."""
    rng = np.random.default_rng(0)
    src, src2 = (rng.standard_normal((2, 5, 8)).astype(np.float32) for _ in range(2))
    tgt = rng.standard_normal((2, 4, 8)).astype(np.float32)
    g = rng.standard_normal((2, 4, 8)).astype(np.float32)
    results = []
    for refuse in (False, True):
        tc.manual_seed(1)
        t = tc.nn.Transformer(8, 2, 1, 1, 16, dropout=0.2)
        t.train()
        t(src, tgt, tgt_is_causal=True)
        if refuse:
            with pytest.raises((ValueError, TypeError)):
                t(src2, tgt, **bad)
        grad_src, grad_tgt = t.backward(g)
        results.append((grad_src, grad_tgt, t.gradients(), t(src, tgt)))
    (gs0, gt0, w0, next0), (gs1, gt1, w1, next1) = results
    np.testing.assert_array_equal(gs1, gs0)
    np.testing.assert_array_equal(gt1, gt0)
    for name in w0:
        np.testing.assert_array_equal(w1[name], w0[name], err_msg=name)
    np.testing.assert_array_equal(next1, next0)  # no dropout seed drawn by the refused call


# ------------------------------------------------------------------------ inputs kept for backward
def _layers():
    return {
        "Linear": (lambda: tc.nn.Linear(6, 4), torch.nn.Linear(6, 4), (3, 5, 6)),
        "LayerNorm": (lambda: tc.nn.LayerNorm(6), torch.nn.LayerNorm(6), (3, 5, 6)),
        "MultiheadAttention": (lambda: tc.nn.MultiheadAttention(6, 2),
                               torch.nn.MultiheadAttention(6, 2, batch_first=True), (3, 5, 6)),
    }


@pytest.mark.parametrize("kind", ["torch", "memoryview"])
@pytest.mark.parametrize("name", ["Linear", "LayerNorm", "MultiheadAttention"])
def test_training_forward_keeps_a_copy_of_torch_and_buffer_inputs(name, kind):
    """A torch tensor (or a memoryview) given to a training forward was kept by pointer: changing
    it in place before backward changed the weight gradients (off by 34 for Linear)."""
    make, ref, shape = _layers()[name]
    torch.manual_seed(0)
    x0 = torch.randn(shape)
    g = torch.randn(shape[:-1] + ((4,) if name == "Linear" else (6,)))
    ours = make()
    ours.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    ours.train()
    x = x0.clone()
    arg = x if kind == "torch" else memoryview(x.numpy())
    ours(arg)
    x.add_(torch.randn(shape))  # the caller changes its input before the backward
    ours.backward(g.numpy())
    xr = x0.clone()
    out = ref(xr) if name != "MultiheadAttention" else ref(xr, xr, xr, need_weights=False)[0]
    out.backward(g)
    for pname, p in ref.named_parameters():
        np.testing.assert_allclose(ours.gradients()[pname], p.grad.numpy(), atol=1e-4, rtol=1e-5, err_msg=pname)


# ------------------------------------------------------------------------ MultiheadAttention arguments
def test_mha_position_ids_without_rotary_is_refused():
    mha = tc.nn.MultiheadAttention(8, 2)
    x = np.zeros((1, 3, 8), np.float32)
    with pytest.raises(ValueError, match="position_ids: given without rotary"):
        mha(x, position_ids=[[0, 1, 2]])


def test_mha_rotary_positions_past_the_table_name_the_cache():
    mha = tc.nn.MultiheadAttention(8, 2)
    rope = tc.positional.RotaryEmbedding(4, max_position_embeddings=6)
    cache = tc.KVCache(1, 1, 2, 4)
    x = np.random.default_rng(0).standard_normal((1, 4, 8)).astype(np.float32)
    mha(x, past_key_values=cache, rotary=rope)
    with pytest.raises(ValueError, match=r"past_key_values: its positions reach 7, outside the rotary table \[0, 6\)"):
        mha(x, past_key_values=cache, rotary=rope)
    assert cache.length == 4
    with pytest.raises(ValueError, match=r"query: its positions reach 6"):
        mha(np.zeros((1, 7, 8), np.float32), rotary=rope)


def test_mha_separate_projection_weights_must_be_float():
    """q/k/v_proj_weight (torch's unpacked layout) of bool or integer dtype were concatenated into
    a float in_proj_weight (k rows became 0/1) instead of being refused, as in_proj_weight is."""
    mha = tc.nn.MultiheadAttention(4, 2)
    before = mha.state_dict()
    state = {k: v for k, v in before.items() if k != "in_proj_weight"}
    state.update(q_proj_weight=np.ones((4, 4), np.float32), k_proj_weight=np.ones((4, 4), bool),
                 v_proj_weight=np.ones((4, 4), np.int64))
    with pytest.raises(TypeError, match=r"k_proj_weight.*floating-point"):
        mha.load_state_dict(state)
    for k, v in before.items():
        np.testing.assert_array_equal(mha.state_dict()[k], v)


# ------------------------------------------------------------------------ Parameters and gradients
def test_parameters_stay_the_same_objects_when_another_model_is_quantized():
    a = tc.nn.Linear(3, 2)
    opt = tc.optim.AdamW(a.named_parameters(), lr=1e-3)
    before = a.parameters()
    b = tc.nn.Linear(3, 2)
    tc.quantize(b, "int8", inplace=True)
    assert all(p is q for p, q in zip(a.parameters(), before))
    assert opt.name_of(a.parameters()[0]) == "weight"


def test_parameters_of_a_parent_follow_a_child_quantized_in_place():
    model = tc.Seq2SeqTransformer(10, 12, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                  dim_feedforward=16, max_len=10)
    model.named_parameters()
    tc.quantize(model.generator, "int8", inplace=True)
    with pytest.raises(ValueError, match="quantized"):
        model.named_parameters()


@pytest.mark.parametrize("form", ["read-only", "big-endian", "strided"])
def test_grad_setter_copies_any_float_array_of_the_right_dtype(form):
    lin = tc.nn.Linear(3, 2)
    p = lin.named_parameters()[0][1]
    g = np.arange(6, dtype=np.float32).reshape(2, 3)
    value = {"read-only": g.copy(), "big-endian": g.astype(">f4"), "strided": np.repeat(g, 2, axis=1)[:, ::2]}[form]
    if form == "read-only":
        value.flags.writeable = False
    p.grad = value
    np.testing.assert_array_equal(p.grad, g)
    with pytest.raises(TypeError, match=r"grad: expected dtype float32 \(the parameter's\), got float64"):
        p.grad = g.astype(np.float64)
    with pytest.raises(TypeError, match="grad: expected a numpy array or None, got list"):
        p.grad = g.tolist()
    np.testing.assert_array_equal(p.grad, g)  # unchanged by the refusals


def test_meta_tensors_are_named_type_errors():
    with pytest.raises(TypeError, match=r"expected a tensor with data, got a meta tensor of shape \(2, 3\)"):
        tc.nn.Linear(3, 2)(torch.empty((2, 3), device="meta"))
    lin = tc.nn.Linear(3, 2)
    with pytest.raises(TypeError, match="meta tensor"):
        lin.load_state_dict({"weight": torch.empty((2, 3), device="meta"), "bias": torch.zeros(2)})


# ------------------------------------------------------------------------ KV cache and quantized copies
def test_kv_cache_reserve_between_the_layers_of_a_step_keeps_the_step():
    """Growing the cache copied only [:length] of each layer; in the middle of a step layer 0 had
    already written the step's positions past the length, which read back as zeros (an incremental
    decode off by 0.05)."""
    rng = np.random.default_rng(0)
    layers = [tc.nn.MultiheadAttention(8, 2) for _ in range(2)]
    x = rng.standard_normal((1, 6, 8)).astype(np.float32)
    full = x
    for a in layers:  # the whole sequence at once, causal: the reference
        full = a(full, is_causal=True)[0]
    cache = tc.KVCache(2, 1, 2, 4, capacity=1)
    steps = []
    for t in range(6):
        h = layers[0](x[:, t:t + 1], past_key_values=cache, layer=0)[0]
        cache.reserve(cache.capacity + 3)  # grows the storage between layer 0 and layer 1
        steps.append(layers[1](h, past_key_values=cache, layer=1)[0])
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5, rtol=1e-5)


def test_kv_cache_from_legacy_checks_memory_before_copying():
    z = np.broadcast_to(np.float32(0), (1000, 2, 10**6, 4))  # 32 GB as float32 copies, no memory of its own
    with pytest.raises(ValueError, match=r"past_key_values \(its copy and the cache\).*more than this machine's memory"):
        tc.KVCache.from_legacy([(z, z)], 2, 4)


def test_a_quantized_copy_is_in_eval_mode():
    """The copy took the float model's ``training`` flag: an int8 copy in training mode ran dropout
    at inference (two calls differed) and refused backward only after a forward."""
    m = tc.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.5).train()
    q = tc.quantize(m)
    assert m.training and not q.training
    x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)
    np.testing.assert_array_equal(q(x), q(x))
    np.testing.assert_array_equal(q(x), tc.quantize(m.eval())(x))


def test_split_heads_state_with_a_0d_first_weight_is_a_named_value_error():
    from transformer_core import multihead_forms as MF

    E = 4
    state = {f"{n}.{t}": (np.ones((E, E)) if t == "weight" else np.ones(E))
             for n in ("W_q", "W_k", "W_v", "W_o") for t in ("weight", "bias")}
    with pytest.raises(ValueError, match=r"state\['W_q.weight'\]: expected shape \(E, E\) with embed_dim E >= 1, got \(\)"):
        MF.from_split_heads({**state, "W_q.weight": np.float64(1.0)})


@pytest.mark.parametrize("call", ["tc.masks.causal_mask(10**8, 1)", "tc.masks.padding_mask([1], 10**8)"])
def test_masks_allocate_only_the_mask(call):
    """The helpers built int64 index arrays 8-16 times the mask's size after checking only the
    mask's: under a 1 GB address space, a 100 MB mask raised MemoryError."""
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            "import numpy as np, transformer_core as tc\n"
            f"m = {call}\n"
            "print(m.shape, int(m.sum()))\n")
    r = _run(code, env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[0] in ("(100000000, 1) 100000000", "(1, 100000000) 1")


def test_masks_match_their_definition():
    for L, S in [(1, 1), (3, 5), (5, 3), (4, 4)]:
        for alignment, d in (("top_left", 0), ("bottom_right", S - L)):
            want = np.arange(S)[None, :] <= np.arange(L)[:, None] + d
            np.testing.assert_array_equal(tc.masks.causal_mask(L, S, alignment=alignment), want)
    lengths = np.array([0, 3, 1, 5])
    np.testing.assert_array_equal(tc.masks.padding_mask(lengths, 6), np.arange(6)[None, :] < lengths[:, None])


# ------------------------------------------------------------------------ bindings and runtime
def _run(code: str, env=None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("call", [
    "tc._core.linear_f32(np.ones((1, 1), np.float32), np.zeros((4096, 1), np.float32), b, '')",
    "tc._core.linear_int8(x=np.ones((1, 4), np.float32), qweight=np.zeros((4096, 4), np.int8), "
    "scales=np.ones(4096, np.float32), bias=b, residual_activations=False)",
], ids=["linear_f32", "linear_int8"])
def test_core_refuses_a_bias_it_would_have_to_convert(call):
    """The bindings read an optional array (bias, norm weight, ids) through a converted temporary
    that was freed before the kernel ran: a strided bias segfaulted _core.linear_f32 and gave
    linear_int8 garbage (off by 2.7e7)."""
    r = _run("import numpy as np, transformer_core as tc\n"
             "b = np.arange(2 * 4096, dtype=np.float32)[::2]\n"
             "try:\n"
             f"    {call}\n"
             "except ValueError as e:\n"
             "    print('refused:', e)\n")
    assert r.returncode == 0, r.stderr
    assert "refused: an optional array" in r.stdout and "float32, not C-contiguous" in r.stdout


def test_omp_num_threads_above_the_limit_starts_at_the_limit():
    r = _run("import transformer_core as tc\n"
             "n = tc.get_num_threads(); tc.set_num_threads(n); print(n)\n", env={"OMP_NUM_THREADS": "2000"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "1024"


# ------------------------------------------------------------------------ slices of a packed gradient
def _compare_grads(ours: dict, theirs: dict, atol=1e-10):
    """``ours``: {name: Parameter}; ``theirs``: {name: torch parameter}: the same None-ness and values."""
    for name, p in ours.items():
        ref = theirs[name].grad
        if ref is None:
            assert p.grad is None, name
        else:
            assert p.grad is not None, name
            np.testing.assert_allclose(p.to_checkpoint_layout(p.grad), ref.numpy(), rtol=1e-9, atol=atol,
                                       err_msg=name)


def test_clearing_one_slice_of_a_packed_gradient_leaves_its_siblings():
    """gate/up of a GatedFeedForward are one C++ buffer with one written flag: ``gate.grad = None``
    (or an optimizer's zero_grad over up alone) used to clear the other too (up read None, a step
    skipped it, and its gradient was lost). Against torch's separate parameters: each slice clears
    alone, a cleared one gets exactly the next backward's gradient, the others accumulate."""
    rng = np.random.default_rng(0)
    ff = tc.nn.GatedFeedForward(4, 6, dtype=np.float64).train()
    ref = {n: torch.nn.Parameter(torch.from_numpy(v.copy())) for n, v in ff.state_dict().items()}

    def torch_forward(x):
        x = torch.from_numpy(x)
        h = torch.nn.functional.silu(x @ ref["gate_proj.weight"].T) * (x @ ref["up_proj.weight"].T)
        return h @ ref["down_proj.weight"].T

    P = dict(ff.named_parameters())
    g_out = rng.standard_normal((3, 4))

    def both_backward():
        x = rng.standard_normal((3, 4))
        ff(x)
        ff.backward(g_out)
        torch_forward(x).backward(torch.from_numpy(g_out))

    both_backward()
    P["gate_proj.weight"].grad = None
    ref["gate_proj.weight"].grad = None
    _compare_grads(P, ref)
    assert P["up_proj.weight"].grad is not None
    tc.optim.SGD([("up_proj.weight", P["up_proj.weight"])], lr=0.1).zero_grad()  # an optimizer over a subset
    ref["up_proj.weight"].grad = None
    _compare_grads(P, ref)
    assert P["down_proj.weight"].grad is not None
    both_backward()  # gate, up: this backward's gradient alone; down: both
    _compare_grads(P, ref)
    P["up_proj.weight"].zero_grad(set_to_none=False)  # zeroes up alone
    ref["up_proj.weight"].grad.zero_()
    _compare_grads(P, ref)
    P["gate_proj.weight"].grad = None
    ref["gate_proj.weight"].grad = None
    before = {n: p.data.copy() for n, p in P.items()}
    tc.optim.SGD(ff.named_parameters(), lr=0.1, momentum=0.9, weight_decay=0.1).step()
    torch.optim.SGD(ref.values(), lr=0.1, momentum=0.9, weight_decay=0.1).step()
    for name, p in P.items():
        np.testing.assert_allclose(p.data, ref[name].detach().numpy(), rtol=1e-12, atol=1e-14, err_msg=name)
    np.testing.assert_array_equal(P["gate_proj.weight"].data, before["gate_proj.weight"])  # skipped: None
    assert set(ff.gradients()) == {"up_proj.weight", "down_proj.weight"}
    P["gate_proj.weight"].grad = np.ones((6, 4))  # set alone: the others keep theirs
    _compare_grads({k: v for k, v in P.items() if k != "gate_proj.weight"}, ref)
    np.testing.assert_array_equal(P["gate_proj.weight"].grad, np.ones((6, 4)))
    ff.zero_grad()
    assert all(p.grad is None for p in P.values()) and ff.gradients() == {}


def test_clearing_q_proj_of_a_llama_model_leaves_k_and_v():
    """Llama's q/k/v (and gate/up) share one gradient buffer per layer: ``q_proj.weight.grad = None``
    used to clear k_proj and v_proj too. Against transformers' model: clear q_proj of layer 0, run
    another backward, every gradient matches (q: the second backward's, the rest: both)."""
    import transformers
    from test_models_llama import _true_fp64

    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                   attn_implementation="sdpa")  # eager's softmax rounds to float32
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).double()
    ours = tc.LlamaForCausalLM(tc.LlamaConfig.from_dict(cfg.to_dict()), dtype=np.float64)
    ours.load_state_dict({k: v.detach().numpy() for k, v in hf.state_dict().items()})
    ours.train()
    P = dict(ours.named_parameters())
    hp = dict(hf.named_parameters())
    rng = np.random.default_rng(1)

    def both_backward():
        ids = rng.integers(0, 32, (2, 7))
        ours.loss(ids, ids)
        ours.backward()
        with _true_fp64():  # transformers' RMSNorm, rotary angles and loss otherwise round to float32
            logits = hf(torch.from_numpy(ids)).logits[:, :-1]
            torch.nn.functional.cross_entropy(logits.reshape(-1, 32), torch.from_numpy(ids[:, 1:]).reshape(-1)).backward()

    both_backward()
    q = "model.layers.0.self_attn.q_proj.weight"
    P[q].grad = None
    hp[q].grad = None
    _compare_grads(P, hp)
    assert P["model.layers.0.self_attn.k_proj.weight"].grad is not None
    P["model.layers.1.mlp.up_proj.weight"].zero_grad()
    hp["model.layers.1.mlp.up_proj.weight"].grad = None
    both_backward()
    _compare_grads(P, hp)
    got = ours.gradients()
    for name, p in hp.items():
        np.testing.assert_allclose(got[name], p.grad.numpy(), rtol=1e-9, atol=1e-10, err_msg=name)


# ------------------------------------------------------------ weights written between forward and backward
def _torch_layer(ours):
    ref = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).double()
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    return ref


def test_forward_backward_step_cycle_gives_torchs_gradients_and_zero_grad_between_is_allowed():
    """The normal order, forward -> backward -> step, twice, gives torch's gradients and weights;
    zero_grad between a forward and its backward is allowed (torch allows it: it writes no weight)."""
    rng = np.random.default_rng(0)
    tc.manual_seed(0)
    ours = tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=np.float64).train()
    ref = _torch_layer(ours)
    opt = tc.optim.SGD(ours.named_parameters(), lr=0.5, momentum=0.9)
    opt_t = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9)
    for _ in range(2):
        x, g = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 3, 8))
        xt = torch.from_numpy(x).requires_grad_()
        out_t = ref(xt)
        ours(x)
        ours.zero_grad()
        opt.zero_grad(set_to_none=False)
        opt_t.zero_grad()
        gx = ours.backward(g)
        out_t.backward(torch.from_numpy(g))
        np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-9, atol=1e-11)
        _compare_grads(dict(ours.named_parameters()), dict(ref.named_parameters()))
        opt.step()
        opt_t.step()
    for name, p in ref.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[name], p.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)


def _check_refusal(model, run, backward):
    """``run(m)`` / ``backward(m)``: the training forward and backward of module ``m``. Between
    them an SGD step over ``model``'s parameters, then ``load_state_dict``: each refused."""
    from transformer_core.module import WeightsChangedError

    model.train()
    opt = tc.optim.SGD(model.named_parameters(), lr=0.1)
    run(model)
    backward(model)  # gradients for the step
    for write in ("step", "load_state_dict"):
        run(model)
        if write == "step":
            opt.step()
        else:
            model.load_state_dict({k: v * 0.9 for k, v in model.state_dict().items()})
        model.zero_grad()
        with pytest.raises(WeightsChangedError, match="weights changed since the training forward"):
            backward(model)
        assert isinstance(WeightsChangedError("x"), tc.NoTrainingStateError)
        assert model.gradients() == {}  # refused before any gradient was added
        with pytest.raises(tc.NoTrainingStateError) as second:  # the state was dropped
            backward(model)
        assert type(second.value) is tc.NoTrainingStateError
        # run again: the gradients of the new weights (a copy made at them, forward and backward)
        fresh = copy.deepcopy(model)
        fresh.zero_grad()
        for m in (model, fresh):
            tc.manual_seed(1)
            run(m)
            backward(m)
        expected = fresh.gradients()
        assert expected and model.gradients().keys() == expected.keys()
        for name, g in expected.items():
            np.testing.assert_array_equal(model.gradients()[name], g, err_msg=name)


def _gpt2():
    return tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=1, n_head=2),
                              dtype=np.float64)


def _llama():
    return tc.LlamaForCausalLM(tc.LlamaConfig(vocab_size=20, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                                              num_attention_heads=2, num_key_value_heads=1,
                                              max_position_embeddings=8), dtype=np.float64)


def _bert():
    return tc.BertModel(tc.BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=12, max_position_embeddings=8, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0), dtype=np.float64)


_X = np.random.default_rng(5).standard_normal((2, 3, 8))
_IDS = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
_CASES = {
    "encoder_layer": (lambda: tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=np.float64),
                      lambda m: m(_X), lambda m: m.backward(np.ones_like(_X))),
    "mha": (lambda: tc.nn.MultiheadAttention(8, 2, dtype=np.float64),
            lambda m: m(_X, _X * 0.5, _X), lambda m: m.backward(np.ones_like(_X))),
    "encoder_stack": (lambda: tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=np.float64), 2,
                                                       tc.nn.LayerNorm(8, dtype=np.float64)),
                      lambda m: m(_X), lambda m: m.backward(np.ones_like(_X))),
    "gpt2": (_gpt2, lambda m: m.loss(_IDS, _IDS), lambda m: m.backward()),
    "llama": (_llama, lambda m: m.loss(_IDS, _IDS), lambda m: m.backward()),
    "seq2seq": (lambda: tc.Seq2SeqTransformer(10, 12, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                              dim_feedforward=16, max_len=10, dtype=np.float64),
                lambda m: m.loss(SRC, TGT, LAB), lambda m: m.backward()),
    "bert": (_bert, lambda m: m(_IDS), lambda m: m.backward(np.ones((2, 4, 8)), np.ones((2, 8)))),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_weights_written_between_forward_and_backward_are_refused(case):
    """An optimizer step (or load_state_dict) between a training forward and its backward used to be
    accepted: the backward mixed the forward's activations (old weights) with the new weights (an
    encoder layer's in_proj_weight gradient off by 72.8 from the old weights' and 71.7 from the new
    ones'). torch raises ("modified by an inplace operation"); so do we, and drop the state."""
    build, run, backward = _CASES[case]
    _check_refusal(build(), run, backward)


def test_a_step_over_another_model_or_gradient_writes_do_not_refuse():
    """Only the weights the forward ran with count: a step over another model's parameters, clipping,
    zero_grad and the grad setter (gradients only) leave the backward as torch leaves it."""
    rng = np.random.default_rng(1)
    a = tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=np.float64).train()
    b = tc.nn.Linear(8, 8, dtype=np.float64).train()
    ref = _torch_layer(a)
    x, g = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 3, 8))
    b(x)
    b.backward(g)
    opt_b = tc.optim.AdamW(b.named_parameters(), lr=0.1)
    a(x)
    opt_b.step()
    tc.optim.clip_grad_norm_(b.parameters(), 0.1)
    p = dict(a.named_parameters())["linear1.weight"]
    p.grad = np.ones_like(p.data)
    a.zero_grad()
    a.backward(g)
    ref(torch.from_numpy(x)).backward(torch.from_numpy(g))
    _compare_grads(dict(a.named_parameters()), dict(ref.named_parameters()))


# ------------------------------------------------------------ composite backwards: all or nothing
def _stack_case(kind):
    """(model, run, backward, write part of it) for a stack or nn.Transformer of float64."""
    rng = np.random.default_rng(3)
    x, mem, g = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 3, 8))
    norm = tc.nn.LayerNorm(8, dtype=np.float64)
    if kind == "encoder":
        m = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=np.float64), 2, norm)
        return m, (lambda m: m(x)), (lambda m: m.backward(g)), m.layers[0]
    if kind == "decoder":
        m = tc.nn.TransformerDecoder(tc.nn.TransformerDecoderLayer(8, 2, 16, dtype=np.float64), 2, norm)
        return m, (lambda m: m(x, mem)), (lambda m: m.backward(g)), m.layers[0]
    m = tc.nn.Transformer(8, 2, 1, 1, 16, dtype=np.float64)
    return m, (lambda m: m(mem, x)), (lambda m: m.backward(g)), m.encoder


@pytest.mark.parametrize("kind", ["encoder", "decoder", "transformer"])
def test_a_refused_composite_backward_adds_no_gradient(kind):
    """A stack's backward ran its children's backwards one by one: with only layer 0's (or the
    encoder's) weights written since the forward it added the norm's and the later layers' gradients
    (20 of nn.Transformer's decoder) before layer 0 raised WeightsChangedError, and the forward and
    backward run again, as the error says, gave those gradients twice. Now every module is checked
    first: nothing added, and the rerun gives the gradients of one backward (a fresh copy's)."""
    from transformer_core.module import WeightsChangedError

    model, run, backward, part = _stack_case(kind)
    model.train()
    run(model)
    part.load_state_dict({k: v * 0.9 for k, v in part.state_dict().items()}, strict=False)
    with pytest.raises(WeightsChangedError, match=rf"^{type(model).__name__}\.backward: the weights changed"):
        backward(model)
    assert model.gradients() == {}
    with pytest.raises(tc.NoTrainingStateError):  # the whole tree's state was dropped
        backward(model)
    assert model.gradients() == {}
    fresh = copy.deepcopy(model)
    for m in (model, fresh):
        run(m)
        backward(m)
    expected = fresh.gradients()
    assert expected.keys() == dict(model.named_parameters()).keys()
    for name, g in expected.items():
        np.testing.assert_array_equal(model.gradients()[name], g, err_msg=name)
    # a child's own backward ran in between: the stack's backward adds nothing either
    model.zero_grad()
    run(model)
    (model.layers[-1] if kind != "transformer" else model.decoder).backward(np.ones((2, 3, 8)))
    before = model.gradients()
    with pytest.raises(tc.NoTrainingStateError, match="held no training state of this forward"):
        backward(model)
    assert model.gradients().keys() == before.keys()
    for name, g in before.items():
        np.testing.assert_array_equal(model.gradients()[name], g, err_msg=name)


def _copy_cases():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 8))
    return {
        "linear": (lambda: tc.nn.Linear(8, 8, dtype=np.float64), lambda m: m(x), lambda m: m.backward(np.ones_like(x))),
        "mha": (lambda: tc.nn.MultiheadAttention(8, 2, dtype=np.float64), lambda m: m(x),
                lambda m: m.backward(np.ones_like(x))),
        "encoder_layer": _CASES["encoder_layer"],
        "encoder_stack": _CASES["encoder_stack"],
        "transformer": (lambda: tc.nn.Transformer(8, 2, 1, 1, 16, dtype=np.float64), lambda m: m(x, x[:, :2]),
                        lambda m: m.backward(np.ones((2, 2, 8)))),
        "gpt2": _CASES["gpt2"],
        "seq2seq": _CASES["seq2seq"],
        "bert": _CASES["bert"],
    }


@pytest.mark.parametrize("case", list(_copy_cases()))
def test_a_shallow_copy_has_no_backward_pending(case):
    """copy.copy(module) shared the forward's training state: the copy's backward after the
    original's added a Linear's gradients a second time (or raised a plain C++ RuntimeError, MHA and
    the encoder layer). The copy (same weights, same children, as torch's) has no backward pending:
    NoTrainingStateError, before or after the original's, which runs once and gives one backward's
    gradients (a deep copy's)."""
    build, run, backward = _copy_cases()[case]
    model = build().train()
    fresh = copy.deepcopy(model)
    for m in (model, fresh):
        tc.manual_seed(2)
        run(m)
    shallow = copy.copy(model)
    assert shallow._impl is model._impl and shallow._slots().keys() == model._slots().keys()
    with pytest.raises(tc.NoTrainingStateError) as before:
        backward(shallow)
    assert type(before.value) is tc.NoTrainingStateError
    assert model.gradients() == {}
    backward(model)
    backward(fresh)
    with pytest.raises(tc.NoTrainingStateError):
        backward(shallow)
    expected = fresh.gradients()
    assert expected and model.gradients().keys() == expected.keys()
    for name, g in expected.items():
        np.testing.assert_array_equal(model.gradients()[name], g, err_msg=name)


def test_weights_changed_is_documented_stricter_than_torch():
    """torch's backward runs after an SGD step over a Linear's bias only (its weight, which the
    backward reads, was not modified); ours raises, since any weight written counts (one version per
    C++ module): the docstrings said "as torch's", now they say how it is stricter."""
    from transformer_core import module
    from transformer_core.module import WeightsChangedError

    x = np.random.default_rng(0).standard_normal((2, 4))
    ref = torch.nn.Linear(4, 3).double()
    out = ref(torch.from_numpy(x))
    with torch.no_grad():
        ref.bias.add_(1.0)  # a bias-only write, as a step over the biases only
    out.sum().backward()  # torch runs: the bias is not read by the backward
    assert ref.weight.grad is not None
    ours = tc.nn.Linear(4, 3, dtype=np.float64).train()
    ours.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    ours(x)
    ours.load_state_dict({"bias": ref.bias.detach().numpy() + 1.0}, strict=False)
    with pytest.raises(WeightsChangedError):
        ours.backward(np.ones((2, 3)))
    doc = " ".join(WeightsChangedError.__doc__.split())
    assert "Stricter than torch's" in doc and "ANY weight" in doc and "one write version per C++ module" in doc
    assert '(as torch\'s "modified by an inplace operation")' not in " ".join(module.__doc__.split())


def test_seq2seq_backward_after_a_childs_own_backward_adds_nothing():
    """A child's own backward between loss and backward: the generator's gradients were added, then
    the transformer refused. Now refused before anything is added; the loss again, then backward,
    gives a fresh copy's gradients."""
    model = tc.Seq2SeqTransformer(11, 13, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                  dim_feedforward=16, dtype=np.float64).train()
    rng = np.random.default_rng(0)
    src, tgt, labels = rng.integers(0, 11, (2, 5)), rng.integers(0, 13, (2, 4)), rng.integers(0, 13, (2, 4))
    fresh = copy.deepcopy(model)
    fresh.loss(src, tgt, labels)
    fresh.backward()
    model.loss(src, tgt, labels)
    model.generator.backward(np.ones((2, 4, 13)))  # the child's own backward consumes its state
    model.zero_grad()
    with pytest.raises(tc.NoTrainingStateError, match=r"held no training state of this forward"):
        model.backward()
    assert model.gradients() == {}
    model.loss(src, tgt, labels)
    model.backward()
    got, ref = model.gradients(), fresh.gradients()
    assert got.keys() == ref.keys()
    for name in ref:
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)


def test_checkpoint_directory_with_a_tilde_is_in_the_home_directory(tmp_path, monkeypatch):
    """save_checkpoint("~/run") / load_checkpoint("~/run") use $HOME/run, as save_pretrained does
    (they wrote ./~/run); the loaded model and optimizer go on as the saved ones."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    rng = np.random.default_rng(0)
    model = tc.nn.Linear(3, 2)
    opt = tc.optim.AdamW(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = rng.standard_normal(p.data.shape).astype(np.float32)
    opt.step()
    tc.training.save_checkpoint("~/run", model, opt)
    assert sorted(p.name for p in (home / "run").iterdir()) == ["model.safetensors", "optimizer.safetensors"]
    assert list(cwd.iterdir()) == []
    other = tc.nn.Linear(3, 2)
    other_opt = tc.optim.AdamW(other.parameters(), lr=0.1)
    tc.training.load_checkpoint("~/run", other, other_opt)
    assert all(np.array_equal(v, model.state_dict()[k]) for k, v in other.state_dict().items())
    got, want = other_opt.state_dict(), opt.state_dict()
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)


# ------------------------------------------------------------------------ checkpoints of several schedulers
_W = np.random.default_rng(7).standard_normal((2, 3))
_B = np.random.default_rng(8).standard_normal(2)
_GRADS = [(np.random.default_rng(100 + t).standard_normal((2, 3)), np.random.default_rng(200 + t).standard_normal(2))
          for t in range(12)]


def _schedules(lib, opt, form):
    """The schedulers of ``form`` on ``opt`` (lib: transformer_core's lr_scheduler or torch's), as
    save_checkpoint takes them: "list" / "tuple" of a LinearLR warmup and a CosineAnnealingLR
    chained (each stepped), or one SequentialLR of them."""
    if form == "sequential":
        return lib.SequentialLR(opt, [lib.LinearLR(opt, 0.1, 1.0, 4), lib.CosineAnnealingLR(opt, 8, 1e-3)], [4])
    chain = [lib.LinearLR(opt, 0.1, 1.0, 4), lib.CosineAnnealingLR(opt, 12, 1e-3)]
    return tuple(chain) if form == "tuple" else chain


def _ours(form):
    model = tc.nn.Linear(3, 2)
    model.load_state_dict({"weight": _W, "bias": _B})
    opt = tc.optim.AdamW(model.named_parameters(), lr=0.1)
    return model, opt, _schedules(tc.lr_scheduler, opt, form)


def _steps(params, opt, scheduler, start, stop, to_grad=np.asarray):
    """Steps ``start`` to ``stop`` of the fixed gradients; each step's learning rate."""
    lrs = []
    for t in range(start, stop):
        for p, g in zip(params, _GRADS[t]):
            p.grad = to_grad(g.astype(np.float32))
        opt.step()
        for s in scheduler if isinstance(scheduler, (list, tuple)) else [scheduler]:
            s.step()
        lrs.append(opt.param_groups[0]["lr"])
    return lrs


def _training_states(model, opt, scheduler):
    scheds = scheduler if isinstance(scheduler, (list, tuple)) else [scheduler]
    return ([model.state_dict(), opt.state_dict()] + [s.state_dict() for s in scheds]
            + [{k: np.asarray(v) for g in opt.param_groups for k, v in g.items() if k != "params"}])


def _assert_same_states(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert sorted(g) == sorted(e)
        for k in e:
            np.testing.assert_array_equal(g[k], e[k], err_msg=k)


@pytest.mark.parametrize("stop", [3, 4, 6])
@pytest.mark.parametrize("form", ["list", "tuple", "sequential"])
def test_checkpoint_of_several_schedulers_resumes_like_torch(tmp_path, form, stop):
    """A LinearLR warmup and a CosineAnnealingLR chained on one optimizer (a list or tuple of
    both), or run one after the other by a SequentialLR: saved by save_checkpoint after ``stop``
    steps, loaded into a fresh set, the run goes on with torch's learning rates, exactly (those of
    torch's uninterrupted run), and with the uninterrupted run's weights, bitwise. (A list was
    refused; saving only the cosine made the unsaved warmup start again: lr above the base lr.)"""
    weight = torch.nn.Parameter(torch.tensor(_W, dtype=torch.float32))
    bias = torch.nn.Parameter(torch.tensor(_B, dtype=torch.float32))
    torch_opt = torch.optim.AdamW([weight, bias], lr=0.1, foreach=False)
    reference = _steps([weight, bias], torch_opt, _schedules(torch.optim.lr_scheduler, torch_opt, form), 0, 12,
                       to_grad=torch.tensor)
    model, opt, scheduler = _ours(form)
    uninterrupted = _steps(model.parameters(), opt, scheduler, 0, 12)
    assert uninterrupted == reference
    final = model.state_dict()
    model, opt, scheduler = _ours(form)
    got = _steps(model.parameters(), opt, scheduler, 0, stop)
    tc.training.save_checkpoint(tmp_path, model, opt, scheduler)
    model, opt, scheduler = _ours(form)
    tc.training.load_checkpoint(tmp_path, model, opt, scheduler)
    got += _steps(model.parameters(), opt, scheduler, stop, 12)
    assert got == reference
    assert max(got) <= 0.1
    for k, v in final.items():
        np.testing.assert_array_equal(model.state_dict()[k], v, err_msg=k)


def test_checkpoint_number_of_schedulers_must_match(tmp_path):
    """load_checkpoint takes the schedulers the save was given: another number of them is a
    ValueError naming ``scheduler``, before anything changes; one scheduler and a list of one are
    interchangeable."""
    model, opt, chain = _ours("list")
    _steps(model.parameters(), opt, chain, 0, 3)
    tc.training.save_checkpoint(tmp_path / "two", model, opt, chain)
    tc.training.save_checkpoint(tmp_path / "one", model, opt, chain[1])
    tc.training.save_checkpoint(tmp_path / "list_of_one", model, opt, [chain[1]])
    target = _ours("list")
    _steps(target[0].parameters(), target[1], target[2], 0, 5)
    before = _training_states(*target)
    for directory, given, match in [
        ("two", target[2][1], r"^scheduler: the checkpoint holds the states of 2 scheduler\(s\), got 1"),
        ("two", [target[2][1]], r"^scheduler: the checkpoint holds the states of 2 scheduler\(s\), got 1"),
        ("one", target[2], r"^scheduler: the checkpoint holds the states of 1 scheduler\(s\), got 2"),
    ]:
        with pytest.raises(ValueError, match=match):
            tc.training.load_checkpoint(tmp_path / directory, target[0], target[1], given)
        _assert_same_states(_training_states(*target), before)
    for directory, given in [("one", [target[2][1]]), ("list_of_one", target[2][1])]:
        tc.training.load_checkpoint(tmp_path / directory, target[0], target[1], given)
        _assert_same_states(_training_states(target[0], target[1], given), _training_states(model, opt, chain[1]))


def _rewrite_file(path, edit_arrays=None, edit_metadata=None):
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(path), framework="numpy") as f:
        metadata = dict(f.metadata())
        arrays = {k: f.get_tensor(k) for k in f.keys()}
    (edit_arrays or (lambda a: None))(arrays)
    (edit_metadata or (lambda m: None))(metadata)
    save_file(arrays, str(path), metadata=metadata)


@pytest.mark.parametrize("form,file,edit_arrays,edit_metadata,error,match", [
    ("list", "scheduler", lambda a: a.pop("1.T_max"), None, ValueError,
     r"/scheduler\.safetensors: scheduler\[1\]: load_state_dict: missing keys \['T_max'\]"),
    ("list", "scheduler", lambda a: a.update({"1.T_max": np.array(0.0)}), None, ValueError,
     r"/scheduler\.safetensors: scheduler\[1\]: .*T_max"),
    ("list", "scheduler", None, lambda m: m.update(num_schedulers="two"), ValueError,
     r"scheduler\.safetensors: metadata num_schedulers: expected a positive int, got 'two'"),
    ("list", "scheduler", lambda a: a.update({"2.T_max": np.array(3.0)}), None, ValueError,
     r"scheduler\.safetensors: key '2\.T_max': expected"),
    ("list", "model", lambda a: a.update(weight=a["weight"][:1]), None, ValueError,
     r"/model\.safetensors: the checkpoint's weights do not match the model \(Linear; .*mis-shaped: "
     r"\['weight: expected \(2, 3\), got \(1, 3\)'\]"),
    ("sequential", "scheduler", lambda a: a.pop("schedulers.1.T_max"), None, ValueError,
     r"/scheduler\.safetensors: load_state_dict: schedulers\.1: missing keys \['T_max'\]"),
    ("sequential", "model", lambda a: a.update(weight=a["weight"][:1]), None, ValueError,
     r"/model\.safetensors: .*mis-shaped: \['weight: expected \(2, 3\), got \(1, 3\)'\]"),
], ids=["second_key_missing", "second_bad_setting", "bad_count", "key_of_no_scheduler", "list_model_misshaped",
        "sequential_inner_key_missing", "sequential_model_misshaped"])
def test_checkpoint_of_several_schedulers_refused_changes_nothing(tmp_path, form, file, edit_arrays, edit_metadata,
                                                                   error, match):
    """A checkpoint of several schedulers (a list, or a SequentialLR) refused for any file: the
    model, the optimizer (its groups' lr and initial_lr) and every scheduler, the first of a list
    and the inner ones of a SequentialLR included, are left as they were."""
    model, opt, scheduler = _ours(form)
    _steps(model.parameters(), opt, scheduler, 0, 3)
    tc.training.save_checkpoint(tmp_path, model, opt, scheduler)
    _rewrite_file(tmp_path / f"{file}.safetensors", edit_arrays, edit_metadata)
    target = _ours(form)
    _steps(target[0].parameters(), target[1], target[2], 0, 6)
    before = _training_states(*target)
    with pytest.raises(error, match=match):
        tc.training.load_checkpoint(tmp_path, *target)
    _assert_same_states(_training_states(*target), before)


def test_checkpoint_scheduler_lists_are_checked_before_anything_is_written_or_changed(tmp_path):
    """A list or tuple of schedulers: an entry that is no scheduler is a TypeError naming
    ``scheduler[i]``, an empty one, a scheduler listed twice or of another optimizer a ValueError;
    nothing is written or loaded."""
    model, opt, chain = _ours("list")
    other = tc.optim.AdamW(model.named_parameters(), lr=0.1)
    bad = [
        ([], ValueError, r"^scheduler: expected at least one scheduler, got an empty list"),
        ((), ValueError, r"^scheduler: expected at least one scheduler, got an empty tuple"),
        ([chain[0], "cosine"], TypeError, r"^scheduler\[1\]: expected a transformer_core\.lr_scheduler LRScheduler, "
                                          r"got str"),
        ([chain[0], chain[0]], ValueError, r"^scheduler\[1\]: expected each scheduler once"),
        ([tc.lr_scheduler.LinearLR(other), chain[0]], ValueError, r"^scheduler\[0\]: expected a scheduler of "
                                                                  r"`optimizer`"),
        ({"a": chain[0]}, TypeError, r"^scheduler: expected a transformer_core\.lr_scheduler LRScheduler or None, "
                                     r"got dict; or a list or tuple"),
    ]
    for scheduler, error, match in bad:
        with pytest.raises(error, match=match):
            tc.training.save_checkpoint(tmp_path / "none", model, opt, scheduler)
        assert not (tmp_path / "none").exists()
    tc.training.save_checkpoint(tmp_path / "full", model, opt, chain)
    _steps(model.parameters(), opt, chain, 0, 2)
    before = _training_states(model, opt, chain)
    for scheduler, error, match in bad:
        with pytest.raises(error, match=match):
            tc.training.load_checkpoint(tmp_path / "full", model, opt, scheduler)
        _assert_same_states(_training_states(model, opt, chain), before)


# ------------------------------------------------------------------------ forged and mismatched checkpoint files
@pytest.mark.parametrize("forged", ["3", "10000000", "9" * 5000], ids=["3", "1e7", "5000_digits"])
def test_checkpoint_forged_number_of_schedulers_is_refused_before_anything_is_built(tmp_path, forged):
    """A scheduler file whose num_schedulers says another number than the schedulers given is refused,
    naming ``scheduler`` and the file, before anything is built from that number: it built a list of
    that many dicts first (10**7: 700 MB; a larger one used up the memory), and a number of over
    4300 digits gave int()'s bare ValueError. Nothing changes."""
    import re
    import tracemalloc

    model, opt, chain = _ours("list")
    _steps(model.parameters(), opt, chain, 0, 3)
    tc.training.save_checkpoint(tmp_path, model, opt, chain)
    _rewrite_file(tmp_path / "scheduler.safetensors", edit_metadata=lambda m: m.update(num_schedulers=forged))
    target = _ours("list")
    _steps(target[0].parameters(), target[1], target[2], 0, 5)
    before = _training_states(*target)
    shown = forged if len(forged) <= 40 else f"{forged[:40]}... (5000 digits)"
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=rf"^scheduler: the checkpoint holds the states of {re.escape(shown)} "
                                             r"scheduler\(s\), got 2; expected the schedulers it was saved with "
                                             rf"\({re.escape(str(tmp_path / 'scheduler.safetensors'))}\)"):
            tc.training.load_checkpoint(tmp_path, *target)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"peak {peak} bytes"
    _assert_same_states(_training_states(*target), before)


def _small_llama(hidden):
    return tc.LlamaForCausalLM(tc.LlamaConfig(vocab_size=50, hidden_size=hidden, intermediate_size=24,
                                              num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=16))


def _stepped_adamw(model):
    """An AdamW over the model after one step of gradients 0.5 (moments of every parameter's shape)."""
    opt = tc.optim.AdamW(model.named_parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = np.full(p.shape, 0.5, dtype=p.dtype)
    opt.step()
    model.zero_grad()
    return opt


@pytest.mark.parametrize("kind", ["gpt2", "wider_llama", "linear_without_bias"])
def test_checkpoint_of_another_model_is_named_by_the_model_file_first(tmp_path, kind):
    """A checkpoint of another architecture or size, loaded with an optimizer: the model file's names
    and shapes are checked first, so the error names model.safetensors and lists what differs
    (it was the optimizer's "unknown parameter names" / "exp_avg: expected shape", naming neither
    the file nor the model); nothing changes."""
    import re

    if kind == "linear_without_bias":
        source, target = tc.nn.Linear(3, 2), tc.nn.Linear(3, 2, bias=False)
        what = r"\(Linear; .*\): unknown keys: \['bias'\]; nothing was loaded$"
    else:
        source = _small_llama(16)
        if kind == "gpt2":
            target = tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=4))
            # (Llama's untied lm_head.weight is taken for GPT-2's tied head, wte, as load_state_dict does)
            what = (r"\(GPT2LMHeadModel; .*\): missing keys: \['wpe\.weight', 'h\.0\.ln_1\.weight', .*"
                    r"; unknown keys: \['model\.embed_tokens\.weight', ")
        else:
            target = _small_llama(32)
            what = (r"\(LlamaForCausalLM; .*\): mis-shaped: \['model\.embed_tokens\.weight: expected \(50, 32\), "
                    r"got \(50, 16\)'")
    tc.training.save_checkpoint(tmp_path, source, _stepped_adamw(source))
    opt = _stepped_adamw(target)
    before = [target.state_dict(), opt.state_dict()]
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'model.safetensors'))}: the checkpoint's "
                                         rf"weights do not match the model {what}"):
        tc.training.load_checkpoint(tmp_path, target, opt)
    _assert_same_states([target.state_dict(), opt.state_dict()], before)


def _step_as_bool(arrays):
    arrays["state.weight.step"] = np.array(True)


@pytest.mark.parametrize("edit,error,message", [
    (lambda a: a.pop("state.weight.step"), ValueError, r"load_state_dict: state of 'weight': missing \['step'\]"),
    (_step_as_bool, TypeError, r"load_state_dict: state\.weight\.step: expected"),
], ids=["key_missing", "bool_step"])
def test_checkpoint_optimizer_errors_name_the_optimizer_file(tmp_path, edit, error, message):
    """The optimizer's refusal of its file is prefixed with that file, and keeps its kind (a
    TypeError for a value of no number); nothing changes."""
    import re

    model, opt, chain = _ours("list")
    _steps(model.parameters(), opt, chain, 0, 3)
    tc.training.save_checkpoint(tmp_path, model, opt)
    _rewrite_file(tmp_path / "optimizer.safetensors", edit)
    target = _ours("list")
    _steps(target[0].parameters(), target[1], target[2], 0, 5)
    before = _training_states(*target)
    with pytest.raises(error, match=rf"^{re.escape(str(tmp_path / 'optimizer.safetensors'))}: {message}"):
        tc.training.load_checkpoint(tmp_path, target[0], target[1])
    _assert_same_states(_training_states(*target), before)


@pytest.mark.parametrize("directory", ["", "  ", "run\0x"])
def test_save_checkpoint_refuses_an_empty_or_nul_directory(tmp_path, monkeypatch, directory):
    """``save_checkpoint("")`` wrote the checkpoint into the current directory (transformers'
    ``save_pretrained("")`` raises, as ours now does): a ValueError naming ``directory``; nothing
    written."""
    monkeypatch.chdir(tmp_path)
    model = tc.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"^directory: expected a folder path, got .*nothing written"):
        tc.training.save_checkpoint(directory, model, tc.optim.AdamW(model.named_parameters()))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["a_file", "under_a_file"])
def test_save_checkpoint_into_a_file_names_directory(tmp_path, where):
    """A ``directory`` that is a file, or lies under one: a NotADirectoryError naming ``directory``
    and the file in the way (it was mkdir's bare FileExistsError / NotADirectoryError); nothing is
    written and the file is left as it was."""
    import errno
    import re

    blocker = tmp_path / "afile"
    blocker.write_bytes(b"not a folder")
    directory = blocker if where == "a_file" else blocker / "run" / "1"
    got = "a file" if where == "a_file" else rf"a path under {re.escape(str(blocker))}, which is a file"
    model = tc.nn.Linear(3, 2)
    with pytest.raises(NotADirectoryError, match=rf"directory: expected a folder \(or a path where one can be "
                                                 rf"made\), got {got} \(nothing written\)") as info:
        tc.training.save_checkpoint(directory, model, tc.optim.AdamW(model.named_parameters()))
    assert info.value.errno == errno.ENOTDIR and info.value.filename == str(directory)
    assert [p.name for p in tmp_path.iterdir()] == ["afile"] and blocker.read_bytes() == b"not a folder"
    assert "NotADirectoryError (an OSError): ``directory`` is a file" in tc.training.save_checkpoint.__doc__


# ------------------------------------------------------------------------ a Parameter is array-like
def test_a_parameter_is_array_like_as_torchs():
    """numpy and this library's ops take a Parameter for its data, as torch's ops take an
    nn.Parameter: np.asarray(p) is ``p.data`` itself (it was a 0-d object array, and np.sum(p)
    returned the Parameter), linear and its backward give torch's values; a dtype or copy=True
    gives a copy, copy=False with another dtype is numpy's ValueError."""
    from transformer_core import backward as B
    from transformer_core.parameter import Parameter

    rng = np.random.default_rng(11)
    w, b = rng.standard_normal((2, 3)), rng.standard_normal(2)
    x, gy = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    p, pb = Parameter(w.copy(), "weight"), Parameter(b.copy(), "bias")
    tw, tb = torch.nn.Parameter(torch.from_numpy(w.copy())), torch.nn.Parameter(torch.from_numpy(b.copy()))
    tx = torch.from_numpy(x.copy()).requires_grad_(True)

    assert np.asarray(p) is p.data and np.asarray(p, dtype=np.float64) is p.data
    total = np.sum(p)
    assert type(total) is np.float64
    np.testing.assert_allclose(total, torch.sum(tw).item(), rtol=1e-15)
    y = torch.nn.functional.linear(tx, tw, tb)
    np.testing.assert_allclose(tc.functional.linear(x, p, pb), y.detach().numpy(), rtol=0, atol=1e-12)
    y.backward(torch.from_numpy(gy))
    gx, gw, gb = B.linear_backward(x, p, gy)
    for ours, theirs in [(gx, tx.grad), (gw, tw.grad), (gb, tb.grad)]:
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=0, atol=1e-12)

    copied = np.array(p, copy=True)
    assert not np.shares_memory(copied, p.data) and np.array_equal(copied, w)
    single = np.asarray(p, dtype=np.float32)
    assert single.dtype == np.float32 and np.array_equal(single, w.astype(np.float32))
    with pytest.raises(ValueError, match=r"copy=False, but dtype float32 needs a copy of the float64 data"):
        np.asarray(p, dtype=np.float32, copy=False)
    np.asarray(p)[0, 0] = 7.0  # no copy: a write reaches the parameter
    assert p.data[0, 0] == 7.0

    lin = tc.nn.Linear(3, 2)  # a model's Parameter: its data is a view of the C++ buffer
    weight = dict(lin.named_parameters())["weight"]
    np.asarray(weight)[1, 2] = 5.0
    assert lin.state_dict()["weight"][1, 2] == 5.0


def test_parameter_documents_its_type_errors():
    from transformer_core.parameter import Parameter

    with pytest.raises(TypeError, match=r"^name: expected a str or None, got int"):
        Parameter(np.zeros(2), name=3)
    assert "``name``\n            neither a str nor None" in Parameter.__doc__


# ------------------------------------------------------------------------ an optimizer of parameters outside the model
def _step_with(opt, seed, steps=2):
    """``steps`` AdamW steps of the gradients drawn from ``seed`` (the same for a twin optimizer)."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        for _, p in opt.named_parameters():
            p.grad = rng.standard_normal(p.shape).astype(p.dtype)
        opt.step()
        opt.zero_grad()


def _foreign_message(names, model, action):
    import re

    return (rf"^optimizer: it steps parameters {re.escape(str(names))} that are not `model`'s \({model}\): the "
            r"checkpoint holds the model's weights only, .* attach their module to the model \(e\.g\. "
            rf"`model\.head = head`\) and build the optimizer from model\.named_parameters\(\) .*; {action}$")


def test_checkpoint_refuses_an_optimizer_of_parameters_outside_the_model(tmp_path):
    """A BertModel and a separate tc.nn.Linear head trained by one AdamW: the save wrote the head's
    moments and step count but not its weights, and the load took them, pairing a new head with
    trained moments. Both refuse now, naming the head's parameters as the optimizer names them and
    the way out; nothing is written, read or changed."""
    bert, head = _bert(), tc.nn.Linear(8, 3, dtype=np.float64)
    opt = tc.optim.AdamW(bert.named_parameters() + [(f"head.{n}", p) for n, p in head.named_parameters()], lr=1e-2)
    _step_with(opt, 1)
    with pytest.raises(ValueError, match=_foreign_message(["head.weight", "head.bias"], "BertModel",
                                                          "nothing was written")):
        tc.training.save_checkpoint(tmp_path / "run", bert, opt)
    assert not (tmp_path / "run").exists()
    # a checkpoint of the model alone, loaded with an optimizer that also steps a head: refused before
    # the files are read (a missing scheduler file would be named otherwise); nothing changes
    alone = tc.optim.AdamW(bert.named_parameters(), lr=1e-2)
    _step_with(alone, 2)
    tc.training.save_checkpoint(tmp_path / "run", bert, alone)
    before = [bert.state_dict(), opt.state_dict(), head.state_dict()]
    with pytest.raises(ValueError, match=_foreign_message(["head.weight", "head.bias"], "BertModel",
                                                          "nothing was loaded")):
        tc.training.load_checkpoint(tmp_path / "run", bert, opt)
    _assert_same_states([bert.state_dict(), opt.state_dict(), head.state_dict()], before)


def test_checkpoint_compares_the_optimizers_parameters_by_identity_not_by_name(tmp_path):
    """The parameters are compared as weights, not names: another Linear's "weight" and "bias" (the
    model's names) are refused, and so are the old parameters of a module replaced in the model
    since the optimizer was built (still named "norm.weight"). A submodule's Parameters, other
    objects over the model's own weights, are the model's: saved and restored."""
    model, other = tc.nn.Linear(3, 2), tc.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=_foreign_message(["weight", "bias"], "Linear", "nothing was written")):
        tc.training.save_checkpoint(tmp_path / "a", model, tc.optim.AdamW(other.named_parameters()))
    enc = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(4, 2, 8), 2, norm=tc.nn.LayerNorm(4))
    opt = tc.optim.AdamW(enc.named_parameters())
    enc.norm = tc.nn.LayerNorm(4)
    with pytest.raises(ValueError, match=_foreign_message(["norm.weight", "norm.bias"], "TransformerEncoder",
                                                          "nothing was written")):
        tc.training.save_checkpoint(tmp_path / "b", enc, opt)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    sub = tc.optim.AdamW(enc.layers[1].named_parameters(), lr=1e-2)
    _step_with(sub, 3)
    tc.training.save_checkpoint(tmp_path / "c", enc, sub)
    twin = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(4, 2, 8), 2, norm=tc.nn.LayerNorm(4))
    twin_opt = tc.optim.AdamW(twin.layers[1].named_parameters(), lr=1e-2)
    tc.training.load_checkpoint(tmp_path / "c", twin, twin_opt)
    _assert_same_states([twin.state_dict(), twin_opt.state_dict()], [enc.state_dict(), sub.state_dict()])


def test_checkpoint_of_a_head_attached_to_the_model_resumes_bitwise(tmp_path):
    """The way out the refusal gives: the head attached (``bert.head = head``) and the optimizer
    built from the model's parameters; the resumed run is the uninterrupted one, head included."""
    def build():
        bert = _bert()
        bert.head = tc.nn.Linear(8, 3, dtype=np.float64)
        return bert, tc.optim.AdamW(bert.named_parameters(), lr=1e-2)

    bert, opt = build()
    _step_with(opt, 4)
    tc.training.save_checkpoint(tmp_path, bert, opt)
    again, again_opt = build()
    fresh = again.head.state_dict()["weight"]
    tc.training.load_checkpoint(tmp_path, again, again_opt)
    np.testing.assert_array_equal(again.head.state_dict()["weight"], bert.head.state_dict()["weight"])
    assert not np.array_equal(again.head.state_dict()["weight"], fresh)
    assert again_opt.state["head.weight"]["step"] == 2
    _step_with(opt, 5)
    _step_with(again_opt, 5)
    _assert_same_states([again.state_dict(), again_opt.state_dict()], [bert.state_dict(), opt.state_dict()])


def test_checkpoint_moments_of_relaid_weights_are_matched_by_identity(tmp_path):
    """GPT-2's Conv1D weights are held transposed: their moments are saved in the checkpoint's
    layout, as torch's optimizer holds them. That was found by name, so an optimizer that names
    the parameters otherwise (``"gpt." + name``) saved them in the C++ layout; found by identity
    now, they are saved transposed and read back."""
    from safetensors.numpy import load_file

    def build():
        model = tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=31, n_positions=16, n_embd=8, n_layer=1, n_head=2))
        return model, tc.optim.AdamW([(f"gpt.{n}", p) for n, p in model.named_parameters()], lr=1e-2)

    model, opt = build()
    _step_with(opt, 6)
    tc.training.save_checkpoint(tmp_path, model, opt)
    saved = load_file(tmp_path / "optimizer.safetensors")
    held = opt.state["gpt.h.0.attn.c_attn.weight"]["exp_avg"]
    assert held.shape == (24, 8) and model.state_dict()["h.0.attn.c_attn.weight"].shape == (8, 24)
    np.testing.assert_array_equal(saved["state.gpt.h.0.attn.c_attn.weight.exp_avg"], held.T)
    again, again_opt = build()
    tc.training.load_checkpoint(tmp_path, again, again_opt)
    _assert_same_states([again_opt.state_dict()], [opt.state_dict()])


# ------------------------------------------------------------------------ a checkpoint written always loads
def _adam_linear(betas=(0.9, 0.999)):
    model = tc.nn.Linear(3, 2)
    model.load_state_dict({"weight": _W, "bias": _B})
    return model, tc.optim.Adam(model.named_parameters(), lr=1e-2, betas=betas)


def _adam_steps(model, opt, grads):
    params = dict(model.named_parameters())
    for g in grads:
        params["weight"].grad = np.full((2, 3), 0.5, np.float32)
        params["bias"].grad = np.asarray(g, np.float32)
        opt.step()


_OVERFLOWING = [[1e22, 0.0], [1.0, 1.0], [-2.0, 0.5], [0.25, -1.0], [3.0, 2.0]]


def test_checkpoint_of_adam_moments_overflowed_to_inf_resumes_bitwise(tmp_path):
    """A float32 gradient of 1e22 makes Adam's exp_avg_sq +inf (as torch's; the weights stay finite):
    save_checkpoint wrote that state and load_checkpoint refused it ("expected finite values"), so
    the run could not resume. It loads now, and the resumed run is the uninterrupted one, bitwise."""
    model, opt = _adam_linear()
    _adam_steps(model, opt, _OVERFLOWING)
    uninterrupted = [model.state_dict(), opt.state_dict()]
    assert np.isposinf(uninterrupted[1]["state.bias.exp_avg_sq"][0])
    assert all(np.isfinite(v).all() for v in uninterrupted[0].values())
    model, opt = _adam_linear()
    _adam_steps(model, opt, _OVERFLOWING[:2])
    tc.training.save_checkpoint(tmp_path, model, opt)
    model, opt = _adam_linear()
    tc.training.load_checkpoint(tmp_path, model, opt)
    assert np.isposinf(opt.state["bias"]["exp_avg_sq"][0])
    _adam_steps(model, opt, _OVERFLOWING[2:])
    _assert_same_states([model.state_dict(), opt.state_dict()], uninterrupted)


def _files(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _hand_lr(model, opt, scheds):
    opt.param_groups[0]["lr"] = -1.0


def _hand_nan_moment(model, opt, scheds):
    opt.state["weight"]["exp_avg"][0, 1] = np.nan


def _hand_base_lr(index):
    def edit(model, opt, scheds):
        scheds[index].base_lrs[0] = float("nan")
    return edit


def _hand_inner_base_lr(model, opt, scheds):
    scheds[0]._schedulers[1].base_lrs[0] = -0.5


@pytest.mark.parametrize("form,edit,error,match", [
    ("list", _hand_lr, ValueError, r"optimizer: its state would not load back \(load_checkpoint would refuse it: "
                                   r"param_groups\.0\.lr: expected a finite number >= 0\.0, got -1\.0\)"),
    ("list", _hand_nan_moment, ValueError, r"optimizer: its state would not load back \(load_checkpoint would refuse "
                                           r"it: state\.weight\.exp_avg: expected finite values, got 1 NaN or inf "
                                           r"\(of 6\)\)"),
    ("list", _hand_base_lr(1), ValueError, r"scheduler\[1\]: its state would not load back \(load_checkpoint would "
                                           r"refuse it: base_lrs\[0\]: expected a finite number >= 0\.0, got nan\)"),
    ("single", _hand_base_lr(0), ValueError, r"scheduler: its state would not load back \(load_checkpoint would "
                                             r"refuse it: base_lrs\[0\]: expected a finite number >= 0\.0, got nan\)"),
    ("sequential", _hand_inner_base_lr, ValueError, r"scheduler: its state would not load back \(load_checkpoint "
                                                    r"would refuse it: schedulers\.1: base_lrs\[0\]: expected a finite "
                                                    r"number >= 0\.0, got -0\.5\)"),
], ids=["lr_by_hand", "nan_moment", "list_scheduler", "one_scheduler", "sequential_inner"])
def test_save_checkpoint_refuses_a_state_load_checkpoint_would_refuse(tmp_path, form, edit, error, match):
    """A state written by hand that the loader refuses (a negative lr in a group, a NaN moment, a
    scheduler's NaN base lr) was saved, and the checkpoint could not be loaded: save_checkpoint runs
    the loader's own checks on each state first, names the component, and writes nothing (the
    previous set stays, and loads)."""
    model, opt, scheduler = _ours("list" if form == "single" else form)
    if form == "single":
        scheduler = scheduler[1]
    scheds = list(scheduler) if isinstance(scheduler, (list, tuple)) else [scheduler]
    _steps(model.parameters(), opt, scheduler, 0, 3)
    tc.training.save_checkpoint(tmp_path / "run", model, opt, scheduler)
    written = _files(tmp_path / "run")
    saved = _training_states(model, opt, scheduler)
    edit(model, opt, scheds)
    with pytest.raises(error, match="^" + match + "; nothing was written$"):
        tc.training.save_checkpoint(tmp_path / "run", model, opt, scheduler)
    with pytest.raises(error, match="^" + match):
        tc.training.save_checkpoint(tmp_path / "new", model, opt, scheduler)
    assert not (tmp_path / "new").exists() and _files(tmp_path / "run") == written
    fresh = _ours("list" if form == "single" else form)
    target = (fresh[0], fresh[1], fresh[2][1] if form == "single" else fresh[2])
    tc.training.load_checkpoint(tmp_path / "run", *target)
    _assert_same_states(_training_states(*target), saved)


def test_save_checkpoint_refuses_an_inf_second_moment_that_beta2_zero_would_turn_into_nan(tmp_path):
    """With betas[1] = 0 an exp_avg_sq of +inf becomes 0 · inf = NaN at the next step, which the
    loader refuses: so does the save, before writing anything."""
    model, opt = _adam_linear(betas=(0.9, 0.0))
    _adam_steps(model, opt, _OVERFLOWING[:1])
    with pytest.raises(ValueError, match=r"^optimizer: its state would not load back \(load_checkpoint would refuse "
                                         r"it: state\.bias\.exp_avg_sq: expected finite values, got 1 NaN or inf "
                                         r"\(of 2\) \(\+inf, a second moment's overflow, loads only where the group's "
                                         r"betas\[1\] > 0: .*\)\); nothing was written$"):
        tc.training.save_checkpoint(tmp_path / "run", model, opt)
    assert not (tmp_path / "run").exists()


def test_checkpoint_after_a_refused_lambda_step_loads(tmp_path):
    """A linear decay without max(0, ·) run past its end: the scheduler step that would write a
    negative lr is refused (it was written, saved, and the checkpoint could not be loaded); the
    run saved after it resumes with the last valid learning rate."""
    def build():
        model, opt = _adam_linear()
        return model, opt, tc.lr_scheduler.LambdaLR(opt, lambda step: 1.0 - step / 2)

    model, opt, sched = build()
    for step in range(3):
        _adam_steps(model, opt, [[1.0, -1.0]])
        if step < 2:
            sched.step()
    with pytest.raises(ValueError, match=r"^lr_lambda \(epoch 3\): param_groups\[0\]: lr = initial_lr \(0\.01\) \* "
                                         r"lr_lambda\(3\): expected a finite number >= 0\.0, got -0\.005 "):
        sched.step()
    assert opt.param_groups[0]["lr"] == 0.0 and sched.last_epoch == 2 and sched.get_last_lr() == [0.0]
    tc.training.save_checkpoint(tmp_path, model, opt, sched)
    saved = _training_states(model, opt, sched)
    target = build()
    tc.training.load_checkpoint(tmp_path, *target)
    _assert_same_states(_training_states(*target), saved)


def test_checkpoint_of_a_scheduler_at_the_int64_bound_resumes_exactly(tmp_path):
    """A scheduler whose last_epoch is int64's largest (resumed at 2**63 - 2: its initial step adds
    one) saves, and loads back exactly: the counters were read back through a float (2**63, past
    what its state_dict could save again). A state with a counter past int64 is refused by
    load_state_dict, naming it, and a save_checkpoint after it writes the scheduler's own state."""
    last = 2**63 - 1

    def build(last_epoch=-1):
        model, opt = _adam_linear()
        opt.param_groups[0]["initial_lr"] = opt.param_groups[0]["lr"]
        return model, opt, tc.lr_scheduler.CosineAnnealingLR(opt, 10, last_epoch=last_epoch)

    model, opt, sched = build(last - 1)
    assert sched.last_epoch == last
    tc.training.save_checkpoint(tmp_path / "run", model, opt, sched)
    saved = _training_states(model, opt, sched)
    target = build()
    tc.training.load_checkpoint(tmp_path / "run", *target)
    assert target[2].last_epoch == last and type(target[2].last_epoch) is int
    _assert_same_states(_training_states(*target), saved)
    with pytest.raises(ValueError, match=r"^load_state_dict: last_epoch: expected an int <= 9223372036854775807 "):
        target[2].load_state_dict({**target[2].state_dict(), "last_epoch": np.array(1e30)})
    tc.training.save_checkpoint(tmp_path / "again", *target)
    again = build()
    tc.training.load_checkpoint(tmp_path / "again", *again)
    assert again[2].last_epoch == last


# ------------------------------------------------------------------------ a failed save_checkpoint
@pytest.mark.parametrize("error", ["OSError", "KeyboardInterrupt"])
@pytest.mark.parametrize("at", [1, 2, 3])
def test_a_failed_rename_of_save_checkpoint_keeps_the_previous_checkpoint(tmp_path, monkeypatch, at, error):
    """A checkpoint (model, optimizer, scheduler) saved over an earlier one, its 1st, 2nd or 3rd
    final rename failing (an OSError, or a KeyboardInterrupt between the renames): the folder holds
    the earlier files byte for byte (no temporary, no backup), and load_checkpoint restores the
    earlier states exactly. (The renamed files stayed: a mixed set that load_checkpoint refused.)"""
    import errno
    import os

    def run(steps, seed):
        model = tc.nn.Linear(3, 2)
        model.load_state_dict({"weight": np.random.default_rng(seed).standard_normal((2, 3)), "bias": _B})
        opt = tc.optim.AdamW(model.named_parameters(), lr=0.1)
        sched = tc.lr_scheduler.CosineAnnealingLR(opt, 10)
        _steps(model.parameters(), opt, sched, 0, steps)
        return model, opt, sched

    folder = tmp_path / "run"
    earlier = run(2, 0)
    tc.training.save_checkpoint(folder, *earlier)
    saved = _training_states(*earlier)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert sorted(before) == ["model.safetensors", "optimizer.safetensors", "scheduler.safetensors"]
    real_replace, calls = os.replace, []
    raised = OSError(errno.EIO, "simulated") if error == "OSError" else KeyboardInterrupt()

    def failing_replace(src, dst, **kwargs):
        calls.append(dst)
        if len(calls) == at:
            raise raised
        return real_replace(src, dst, **kwargs)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(type(raised)):
        tc.training.save_checkpoint(folder, *run(5, 1))
    monkeypatch.undo()
    assert len(calls) == 2 * at - 1  # the failed rename, then one rename back per file replaced before it
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    target = run(0, 2)
    tc.training.load_checkpoint(folder, *target)
    _assert_same_states(_training_states(*target), saved)


# ------------------------------------------------------------------------ Parameter.data
@pytest.mark.parametrize("kind", ["model", "plain"])
def test_rebinding_parameter_data_is_refused_with_what_to_do_instead(kind):
    """``p.data = x`` (torch rebinds its tensor) raises an AttributeError saying to copy the values
    in with ``p.data[...] = x`` or to use load_state_dict (it said "property 'data' ... has no
    setter"), and changes nothing; doing what it says puts the values into the parameter (and, for a
    model's, into the model: its output is then torch's with those weights)."""
    from transformer_core.parameter import Parameter

    lin = tc.nn.Linear(3, 2)
    p = lin.named_parameters()[0][1] if kind == "model" else Parameter(np.zeros((2, 3), np.float32), "weight")
    data, values = p.data, p.data.copy()
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    with pytest.raises(AttributeError, match=r"^data: a Parameter's data cannot be rebound \(got ndarray of shape "
                                             r"\(2, 3\)\); it is the array the optimizers update in place \(of "
                                             r"'weight'\): copy the values into it with p\.data\[\.\.\.\] = x "
                                             r"\(shape \(2, 3\), dtype float32\), or load them with "
                                             r"model\.load_state_dict"):
        p.data = x
    with pytest.raises(AttributeError, match=r"got list\)"):
        p.data = x.tolist()
    assert p.data is data
    np.testing.assert_array_equal(p.data, values)
    p.data[...] = x
    np.testing.assert_array_equal(p.data, x)
    if kind == "model":
        t = torch.nn.Linear(3, 2)
        with torch.no_grad():
            t.weight.copy_(torch.from_numpy(x))
            t.bias.copy_(torch.from_numpy(lin.state_dict()["bias"]))
        np.testing.assert_array_equal(lin.state_dict()["weight"], x)
        inp = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
        with torch.no_grad():
            want = t(torch.from_numpy(inp)).numpy()
        np.testing.assert_allclose(lin(inp), want, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------- training from threads
def _tiny_gpt2():
    tc.manual_seed(0)
    return tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4))


def test_training_calls_run_one_at_a_time_and_inference_does_not_wait():
    """A training loss, forward and backward wait for one running in another thread (the module's
    C++ training state is one; two threads interleaving in it gave wrong losses and gradients, and
    a segmentation fault where the shapes differed). An eval forward does not wait."""
    import threading

    from transformer_core.module import _TRAINING_CALLS

    model = _tiny_gpt2()
    ids = np.random.default_rng(0).integers(0, 300, (2, 9))
    expected = model.train().loss(ids, ids)
    logits = model.eval()(ids).logits
    done = {}

    def run(name, call):
        done[name] = call()

    with _TRAINING_CALLS:  # as a training call in this thread would
        model.train()
        waiting = threading.Thread(target=run, args=("loss", lambda: model.loss(ids, ids)))
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and "loss" not in done  # waits for the lock
        model.training = False  # an eval forward beside it runs
        free = threading.Thread(target=run, args=("eval", lambda: model(ids).logits))
        free.start()
        free.join(60)
        assert not free.is_alive()
        model.training = True
    waiting.join(60)
    assert done["loss"] == expected
    np.testing.assert_array_equal(done["eval"], logits)


def test_training_losses_from_two_threads_are_each_right():
    """Two threads computing training-mode losses on one model: 30 of 60 were wrong (each thread
    read the other's activations) before the calls were serialized."""
    import concurrent.futures

    model = _tiny_gpt2().train()
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 300, (4, 48)) for _ in range(2)]
    expected = [model.loss(x, x) for x in batches]

    def losses(i):
        return [model.loss(batches[i], batches[i]) for _ in range(15)]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = [f.result(timeout=300) for f in [pool.submit(losses, i) for i in range(2)]]
    for i in range(2):
        assert results[i] == [expected[i]] * 15


def test_a_callers_module_is_left_as_written_by_the_training_lock():
    """The training lock wrapped every subclass's forward, a caller's too: a staticmethod or ufunc
    forward then took `self` (TypeError), a caller's module could no longer be cloudpickled (Dask
    ships it by value: "cannot pickle '_thread.RLock'"), and one running a child's training
    forward in a worker thread waited forever on the lock its own forward held."""
    import concurrent.futures

    import cloudpickle
    from transformer_core.module import Module

    class Double(Module):
        @staticmethod
        def forward(x):
            return 2 * x

    class Tanh(Module):
        forward = np.tanh

    class Threaded(Module):
        def __init__(self):
            self.a = tc.nn.Linear(4, 3)

        def forward(self, x):
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                return pool.submit(self.a, x).result(timeout=60)

    assert Double()(1.0) == 2.0 and Tanh()(0.5) == np.tanh(0.5)
    model = Threaded().train()
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(model(x), model.a(x))
    copy_ = cloudpickle.loads(cloudpickle.dumps(model.eval()))
    np.testing.assert_array_equal(copy_(x), model(x))


def test_a_forked_child_trains_while_a_parent_thread_held_the_lock():
    """A child forked while another thread of the parent was in a training call inherited the
    held lock, and its first training forward waited forever."""
    import os
    import threading

    from transformer_core import module

    held, release = threading.Event(), threading.Event()

    def training_call():
        with module._TRAINING_CALLS:
            held.set()
            release.wait(60)

    thread = threading.Thread(target=training_call)
    thread.start()
    held.wait(60)
    try:
        pid = os.fork()
        if pid == 0:  # the child: a training forward, then out (no pytest teardown)
            import signal

            signal.alarm(20)
            out = tc.nn.Linear(4, 3).train()(np.ones((2, 4), np.float32))
            os._exit(0 if out.shape == (2, 3) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        thread.join(60)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def _tiny_gpt2_training():
    cfg = tc.GPT2Config(vocab_size=17, n_positions=16, n_embd=16, n_layer=1, n_head=2, eos_token_id=None)
    model = tc.GPT2LMHeadModel(cfg).train()
    opt = tc.optim.AdamW(model.named_parameters(), lr=1e-2)
    ids = np.arange(8)[None] % 17

    def step():
        model.loss(ids, ids)
        model.backward()
        opt.step()
        model.zero_grad()
    return cfg, model, opt, step


def test_load_checkpoint_refuses_a_model_file_replaced_while_it_was_read(tmp_path, monkeypatch):
    """A save landing between the read of the model's weights and the read of its stamp paired
    save A's weights with save B's optimizer and RNG states (all of B's stamps agree): refused,
    nothing changed; loading again gives save B whole."""
    from transformer_core import training

    cfg, model, opt, step = _tiny_gpt2_training()
    step()
    training.save_checkpoint(tmp_path, model, opt)  # save A
    step()
    step()
    real = training.load_safetensors

    def read_then_a_save_lands(path, dtype):
        state = real(path, dtype)
        training.save_checkpoint(tmp_path, model, opt)  # save B
        return state

    fresh = tc.GPT2LMHeadModel(cfg)
    fresh_opt = tc.optim.AdamW(fresh.named_parameters(), lr=1e-2)
    before = fresh.state_dict()
    monkeypatch.setattr(training, "load_safetensors", read_then_a_save_lands)
    with pytest.raises(ValueError, match=r"model\.safetensors: the file was replaced while it was read"):
        training.load_checkpoint(tmp_path, fresh, fresh_opt)
    assert all(np.array_equal(v, before[k]) for k, v in fresh.state_dict().items()) and not fresh_opt.state
    monkeypatch.setattr(training, "load_safetensors", real)
    training.load_checkpoint(tmp_path, fresh, fresh_opt)  # save B, whole
    name = "h.0.mlp.c_fc.weight"
    assert fresh_opt.state[name]["step"] == opt.state[name]["step"] == 3
    np.testing.assert_array_equal(fresh.state_dict()[name], model.state_dict()[name])


def test_checkpoints_of_a_quantized_model_are_refused_naming_model(tmp_path):
    """A quantized model's checkpoint was written (its weights dequantized) and then refused by
    load_checkpoint for that same model; with an optimizer the error named a weight's view. Both
    functions refuse it up front, naming model; nothing written or changed."""
    from transformer_core.training import load_checkpoint, save_checkpoint

    cfg, model, opt, _ = _tiny_gpt2_training()
    q = tc.quantize(model, "int8")
    for call in (lambda: save_checkpoint(tmp_path / "q", q), lambda: save_checkpoint(tmp_path / "q", q, opt),
                 lambda: load_checkpoint(tmp_path / "q", q, opt)):
        with pytest.raises(ValueError, match=r"^model: \d+ weights are held quantized .*checkpoint the float model"):
            call()
    assert not (tmp_path / "q").exists()
    save_checkpoint(tmp_path / "f", model, opt)  # the float model's checkpoint, then quantized after loading
    fresh = tc.GPT2LMHeadModel(cfg)
    load_checkpoint(tmp_path / "f", fresh)
    x = np.arange(6)[None]
    np.testing.assert_array_equal(tc.quantize(fresh, "int8")(x).logits, q(x).logits)


@pytest.mark.parametrize("seed", [-1, -2**63, 2**64 - 1])
def test_manual_seed_takes_torchs_range(seed):
    """torch.manual_seed takes [-2**63, 2**64 - 1], a negative seed mapped to seed + 2**64
    (torch.initial_seed()); ours refused negative seeds. Same range and mapping; outside it a ValueError, as torch
    refuses it."""
    torch.manual_seed(seed)
    mapped = torch.initial_seed()  # torch's mapping of a negative seed
    tc.manual_seed(seed)
    first = tc.module.next_seed()
    tc.manual_seed(mapped)
    assert tc.module.next_seed() == first
    for bad in (-2**63 - 1, 2**64):
        with pytest.raises((RuntimeError, ValueError)):
            torch.manual_seed(bad)
        with pytest.raises(ValueError, match=r"seed: expected an int in \[-2\*\*63, 2\*\*64 - 1\]"):
            tc.manual_seed(bad)
    tc.manual_seed(0)
