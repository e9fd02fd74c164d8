"""tc.BertModel vs transformers.BertModel (eager attention, eval, no_grad)."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import SENTENCES, TORCH_DTYPE, hf_encode
from safetensors.numpy import load_file, save_file

BERT_ATOL = 1e-4


def hf_forward(model, ids, am=None, tt=None):
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids),
                    attention_mask=None if am is None else torch.from_numpy(am),
                    token_type_ids=None if tt is None else torch.from_numpy(tt))
    pooled = None if getattr(out, "pooler_output", None) is None else out.pooler_output.numpy()
    return out.last_hidden_state.numpy(), pooled


def check_outputs(ours, ref_h, ref_p, am, atol=BERT_ATOL):
    h = np.asarray(ours.last_hidden_state)
    assert h.dtype == np.float32
    assert h.shape == ref_h.shape, (h.shape, ref_h.shape)
    real = am.astype(bool)
    err = np.abs(h[real] - ref_h[real]).max()
    assert err <= atol, f"last_hidden_state max abs diff on real tokens {err:.3e} > {atol}"
    if ref_p is None:
        assert ours.pooler_output is None
    else:
        p = np.asarray(ours.pooler_output)
        assert p.dtype == np.float32 and p.shape == ref_p.shape
        perr = np.abs(p - ref_p).max()
        assert perr <= atol, f"pooler_output max abs diff {perr:.3e} > {atol}"
    return err


# ------------------------------------------------------------------------ default embedded model
def test_default_model_attributes(tc_bert):
    assert hasattr(tc, "BertEmbeddings")
    assert callable(tc.BertEmbeddings)


def test_from_pretrained_default_is_the_embedded_model(tc_bert, hf_bert, hf_tokenizer):
    """The docstring called all-MiniLM-L6-v2 "the default", but name_or_path was required
    (TypeError). BertModel.from_pretrained() now loads it, the default SentenceEncoder has too."""
    import inspect

    default = inspect.signature(tc.BertModel.from_pretrained).parameters["name_or_path"].default
    assert default == tc.hub.DEFAULT_MODEL == "all-MiniLM-L6-v2"
    assert default == inspect.signature(tc.SentenceEncoder.from_pretrained).parameters["name_or_path"].default
    model = tc.BertModel.from_pretrained()
    assert model.name_or_path == "all-MiniLM-L6-v2"
    ours, theirs = model.state_dict(), tc_bert.state_dict()
    assert ours.keys() == theirs.keys()
    for k in ours:
        np.testing.assert_array_equal(np.asarray(ours[k]), np.asarray(theirs[k]), err_msg=k)
    ids, am, tt = hf_encode(hf_tokenizer, SENTENCES[:4])
    check_outputs(model(ids, am, tt), *hf_forward(hf_bert, ids, am, tt), am)


@pytest.mark.parametrize("batch_start", [0, 8, 16])
def test_minilm_matches_hf_padded_batches(tc_bert, hf_bert, hf_tokenizer, batch_start):
    batch = SENTENCES[batch_start:batch_start + 8]
    ids, am, tt = hf_encode(hf_tokenizer, batch)
    assert (am == 0).any()  # mixed lengths -> padding present
    ref_h, ref_p = hf_forward(hf_bert, ids, am, tt)
    out = tc_bert(ids, attention_mask=am, token_type_ids=tt)
    check_outputs(out, ref_h, ref_p, am)


def test_minilm_all_sentences_one_batch(tc_bert, hf_bert, hf_tokenizer):
    assert len(SENTENCES) >= 20
    ids, am, tt = hf_encode(hf_tokenizer, SENTENCES)
    ref_h, ref_p = hf_forward(hf_bert, ids, am, tt)
    check_outputs(tc_bert(ids, attention_mask=am, token_type_ids=tt), ref_h, ref_p, am)


def test_minilm_load_by_path_equals_by_name(tc_bert, model_dir, hf_tokenizer):
    by_path = tc.BertModel.from_pretrained(str(model_dir))
    ids, am, tt = hf_encode(hf_tokenizer, SENTENCES[:4])
    a = by_path(ids, attention_mask=am, token_type_ids=tt)
    b = tc_bert(ids, attention_mask=am, token_type_ids=tt)
    np.testing.assert_array_equal(a.last_hidden_state, b.last_hidden_state)
    np.testing.assert_array_equal(a.pooler_output, b.pooler_output)


@pytest.mark.parametrize("idx", [0, 7, 13])
def test_minilm_defaults_for_masks(tc_bert, hf_bert, hf_tokenizer, idx):
    """attention_mask=None -> all ones, token_type_ids=None -> zeros (single unpadded sentence)."""
    ids, am, tt = hf_encode(hf_tokenizer, [SENTENCES[idx]])
    ref_h, ref_p = hf_forward(hf_bert, ids)
    check_outputs(tc_bert(ids), ref_h, ref_p, am)


def test_minilm_sentence_pairs_token_types(tc_bert, hf_bert, hf_tokenizer):
    ids, am, tt = hf_encode(hf_tokenizer, SENTENCES[:6], SENTENCES[6:12])
    assert tt.any()
    ref_h, ref_p = hf_forward(hf_bert, ids, am, tt)
    check_outputs(tc_bert(ids, attention_mask=am, token_type_ids=tt), ref_h, ref_p, am)


def test_minilm_forward_without_the_pooler(tc_bert, hf_tokenizer):
    """SentenceEncoder.encode asks the forward for no pooler output (pooler=False): the pooler's
    product is skipped, pooler_output is None, and the hidden states of right-padded rows are the
    same bits as with it (a row whose position 0 is padding runs packed instead: other rounding)."""
    ids, am, tt = hf_encode(hf_tokenizer, SENTENCES[:5])
    full = tc_bert._forward_eval(ids, am, tt)
    bare = tc_bert._forward_eval(ids, am, tt, pooler=False)
    assert full.pooler_output is not None and bare.pooler_output is None
    np.testing.assert_array_equal(bare.last_hidden_state, full.last_hidden_state)


def test_minilm_batch_equals_single(tc_bert, hf_tokenizer):
    """Padding must not change the real tokens' states (vs each sentence alone)."""
    ids, am, tt = hf_encode(hf_tokenizer, SENTENCES[:5])
    batch = tc_bert(ids, attention_mask=am, token_type_ids=tt).last_hidden_state
    for i in range(5):
        n = int(am[i].sum())
        single = tc_bert(ids[i:i + 1, :n]).last_hidden_state
        np.testing.assert_allclose(batch[i, :n], single[0], atol=BERT_ATOL)


def test_minilm_identical_with_1_and_2_threads(tc_bert, hf_tokenizer):
    ids, am, tt = hf_encode(hf_tokenizer, SENTENCES[:8])
    old = tc.get_num_threads()
    try:
        tc.set_num_threads(1)
        a = tc_bert(ids, attention_mask=am, token_type_ids=tt)
        tc.set_num_threads(2)
        b = tc_bert(ids, attention_mask=am, token_type_ids=tt)
    finally:
        tc.set_num_threads(old)
    np.testing.assert_array_equal(a.last_hidden_state, b.last_hidden_state)
    np.testing.assert_array_equal(a.pooler_output, b.pooler_output)


# -------------------------------------------------------------------------- small random config
SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=64)


def _save_hf(model, path):
    model.save_pretrained(str(path), safe_serialization=True)
    assert (path / "model.safetensors").is_file() and (path / "config.json").is_file()
    return path


@pytest.fixture(scope="module")
def small_hf(tmp_path_factory):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(**SMALL)
    m = BertModel(cfg).eval()
    with torch.no_grad():  # make biases / LayerNorm params non-trivial
        for name, p in m.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    path = _save_hf(m, tmp_path_factory.mktemp("small_bert"))
    ref = BertModel.from_pretrained(str(path), attn_implementation="eager").eval()
    return path, ref


@pytest.fixture(scope="module")
def small_inputs():
    rng = np.random.default_rng(7)
    N, L = 5, 17
    ids = rng.integers(0, 99, size=(N, L)).astype(np.int64)
    lengths = np.array([17, 1, 9, 5, 16])
    am = (np.arange(L) < lengths[:, None]).astype(np.int64)
    tt = rng.integers(0, 2, size=(N, L)).astype(np.int64)
    return ids, am, tt


def test_small_random_bert(small_hf, small_inputs):
    path, ref = small_hf
    ids, am, tt = small_inputs
    ours = tc.BertModel.from_pretrained(str(path))
    ref_h, ref_p = hf_forward(ref, ids, am, tt)
    assert ref_p is not None
    check_outputs(ours(ids, attention_mask=am, token_type_ids=tt), ref_h, ref_p, am, atol=1e-5)
    # defaults
    ref_h, ref_p = hf_forward(ref, ids)
    check_outputs(ours(ids), ref_h, ref_p, np.ones_like(am), atol=1e-5)


def test_roberta_checkpoint_refused(small_hf, small_inputs, tmp_path):
    """RoBERTa has BERT's weight names but other positions (offset by pad_token_id + 1): its
    directory is refused, naming model_type, not loaded with the wrong positions; a BERT directory
    (model_type "bert") loads and matches HF."""
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(0)
    roberta = RobertaModel(RobertaConfig(**SMALL, type_vocab_size=1, pad_token_id=1)).eval()
    _save_hf(roberta, tmp_path / "roberta")
    with pytest.raises(ValueError, match="model_type 'roberta'"):
        tc.BertModel.from_pretrained(tmp_path / "roberta")
    with pytest.raises(ValueError, match="model_type 'roberta'"):
        tc.SentenceEncoder.from_pretrained(tmp_path / "roberta")
    with pytest.raises(ValueError, match="model_type"):
        tc.BertConfig.from_dict({"model_type": "xlm-roberta"})
    path, ref = small_hf
    assert json.loads((path / "config.json").read_text())["model_type"] == "bert"
    ids, am, tt = small_inputs
    ref_h, ref_p = hf_forward(ref, ids, am, tt)
    check_outputs(tc.BertModel.from_pretrained(path)(ids, attention_mask=am, token_type_ids=tt), ref_h, ref_p, am,
                  atol=1e-5)
    assert tc.BertConfig.from_dict({k: v for k, v in SMALL.items()}).hidden_size == 32  # no model_type: BERT


@pytest.mark.parametrize("field", ["is_decoder", "add_cross_attention"])
def test_decoder_bert_refused(small_inputs, tmp_path, field):
    """is_decoder makes HF's BERT causal (add_cross_attention adds cross-attention layers and sets
    it): refused, naming the field, rather than run as a bidirectional encoder."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    hf = BertModel(BertConfig(**SMALL, is_decoder=True, add_cross_attention=field == "add_cross_attention")).eval()
    _save_hf(hf, tmp_path / "bert_decoder")
    with pytest.raises(ValueError, match="is_decoder|add_cross_attention"):
        tc.BertModel.from_pretrained(tmp_path / "bert_decoder")
    with pytest.raises(ValueError, match=field):
        tc.BertConfig.from_dict({field: True})
    assert tc.BertConfig.from_dict({field: False}).hidden_size == 768
    assert tc.BertConfig.from_dict({field: np.False_}).hidden_size == 768


@pytest.mark.parametrize("value", [None, 0, 1, "no"])
@pytest.mark.parametrize("field", ["is_decoder", "add_cross_attention"])
def test_decoder_flags_that_are_not_bools_are_refused_naming_the_value(field, value):
    """transformers' BertConfig refuses these values (a TypeError of its strict dataclass); the
    message said "=1 is not supported" for 1, and None passed as "no"."""
    from transformers import BertConfig

    with pytest.raises(Exception, match=f"Field '{field}' expected"):
        BertConfig(**{field: value})
    with pytest.raises(TypeError, match=rf"^config\.json: {field}: expected false \(only a bidirectional encoder "
                                        rf"without cross-attention is supported\), got {re.escape(tc._validation.described(value))}$"):
        tc.BertConfig.from_dict({field: value})


def test_from_pretrained_draws_no_random_weights(small_hf, small_inputs, monkeypatch):
    """from_pretrained loads every weight (a missing one raises), so it builds the model without the
    random init (MiniLM: 0.7 -> 0.14 s): the same outputs, bit for bit, as a model initialised at
    random and then loaded."""
    path, _ = small_hf
    ids, am, tt = small_inputs

    def no_draw(*args, **kwargs):
        raise AssertionError("from_pretrained drew random weights")

    with monkeypatch.context() as m:
        m.setattr(np.random, "default_rng", no_draw)
        loaded = tc.BertModel.from_pretrained(str(path))
    initialised = tc.BertModel(loaded.config)
    initialised.load_state_dict(loaded.state_dict())
    a = loaded(ids, attention_mask=am, token_type_ids=tt)
    b = initialised(ids, attention_mask=am, token_type_ids=tt)
    np.testing.assert_array_equal(a.last_hidden_state, b.last_hidden_state)
    np.testing.assert_array_equal(a.pooler_output, b.pooler_output)



def test_float64_checkpoint_loads_without_rounding(small_inputs, tmp_path):
    """A float64 checkpoint read with dtype=np.float64 keeps every bit of its weights (they were read
    as float32 first), by BertModel and by SentenceEncoder, and matches HF's float64 model."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    torch.manual_seed(3)
    hf64 = BertModel(BertConfig(**SMALL, attn_implementation="eager")).double().eval()
    with torch.no_grad():  # values no float32 holds exactly
        for p in hf64.parameters():
            p.add_(1e-9 * torch.randn_like(p))
    _save_hf(hf64, tmp_path)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(SMALL["vocab_size"] - 5)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt")).save_pretrained(str(tmp_path))
    ref_sd = {k: v.numpy() for k, v in hf64.state_dict().items()}
    ids, am, tt = small_inputs
    ref_h, ref_p = hf_forward(hf64, ids, am, tt)
    encoder = tc.SentenceEncoder.from_pretrained(str(tmp_path), dtype=np.float64)
    for model in (tc.BertModel.from_pretrained(str(tmp_path), dtype=np.float64), encoder.model):
        sd = model.state_dict()
        assert any(not np.array_equal(v, v.astype(np.float32)) for v in sd.values())
        for k, v in sd.items():
            assert v.dtype == np.float64 and np.array_equal(v, ref_sd[k]), k
        out = model(ids, attention_mask=am, token_type_ids=tt)
        real = am.astype(bool)
        assert out.last_hidden_state.dtype == np.float64
        np.testing.assert_allclose(out.last_hidden_state[real], ref_h[real], rtol=0, atol=1e-10)
        np.testing.assert_allclose(out.pooler_output, ref_p, rtol=0, atol=1e-10)


@pytest.mark.parametrize("N,L", [(1, 1), (7, 7), (2, 64), (3, 9)])
def test_small_random_bert_shapes(small_hf, N, L):
    path, ref = small_hf
    rng = np.random.default_rng(N * 100 + L)
    ids = rng.integers(0, 99, size=(N, L)).astype(np.int64)
    tt = rng.integers(0, 2, size=(N, L)).astype(np.int64)
    am = np.ones((N, L), np.int64)
    am[0, L // 2 + 1:] = 0
    ours = tc.BertModel.from_pretrained(str(path))
    ref_h, ref_p = hf_forward(ref, ids, am, tt)
    check_outputs(ours(ids, attention_mask=am, token_type_ids=tt), ref_h, ref_p, am, atol=1e-5)


def test_small_random_bert_lengths_at_the_attention_tiles(tmp_path):
    """Padded batches run attention on each sequence's real tokens only (packed end to end): lengths
    at the kernel's edges (1 to 3 rows, Br = 128, Bc = 256), a row of padding only, left padding and
    a mask with holes all match transformers on the real tokens, and the pooler on every row (row 3's
    position 0 is padding: the pooler reads its state as transformers computes it)."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(1)
    m = BertModel(BertConfig(**{**SMALL, "max_position_embeddings": 320})).eval()
    path = _save_hf(m, tmp_path / "bert320")
    ref = BertModel.from_pretrained(str(path), attn_implementation="eager").eval()
    rng = np.random.default_rng(3)
    N, L = 8, 300
    ids = rng.integers(0, 99, size=(N, L)).astype(np.int64)
    am = (np.arange(L)[None, :] < np.array([300, 1, 129, 0, 257, 3, 128, 256])[:, None]).astype(np.int64)
    am[3] = (np.arange(L) >= L - 40)                 # left padding: the last 40 tokens are real
    am[6, 5:60] = 0                                  # holes in the middle of a sequence
    out = tc.BertModel.from_pretrained(str(path))(ids, attention_mask=am)
    ref_h, ref_p = hf_forward(ref, ids, am)
    assert am[3, 0] == 0
    h = np.asarray(out.last_hidden_state)
    real = am.astype(bool)
    assert np.abs(h[real] - ref_h[real]).max() <= 1e-5
    np.testing.assert_array_equal(h[~real], 0.0)
    np.testing.assert_allclose(np.asarray(out.pooler_output), ref_p, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_pooler_reads_position_0_where_it_is_padding(tmp_path, dtype):
    """The pooler reads position 0's hidden state as transformers computes it even where that
    position is padding (left padding, a mask with a hole at 0): the query's attention over its
    sequence's real tokens (such a row was pooled from zeros: tanh(bias), 0.83 off). Real tokens
    still match and padding rows stay zeros; each row's outputs do not depend on its batch-mates. A
    row of padding only gives zeros and tanh(pooler bias) (transformers' eager and SDPA attentions
    disagree there)."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(5)
    hf = BertModel(BertConfig(**SMALL, attn_implementation="eager")).to(TORCH_DTYPE[np.dtype(dtype)]).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p))
    _save_hf(hf, tmp_path)
    ours = tc.BertModel.from_pretrained(str(tmp_path), dtype=dtype)
    rng = np.random.default_rng(11)
    N, L = 7, 9
    ids = rng.integers(0, 99, (N, L))
    tt = rng.integers(0, 2, (N, L))
    am = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1],    # left padding
                   [1, 1, 1, 1, 1, 1, 1, 1, 1],    # none
                   [0, 1, 0, 1, 1, 0, 1, 0, 0],    # holes, position 0 among them
                   [1, 0, 1, 1, 0, 0, 0, 0, 0],    # a hole, position 0 real
                   [0, 0, 0, 0, 0, 0, 0, 0, 1],    # one real token, the last
                   [0, 0, 0, 0, 0, 0, 0, 0, 0],    # padding only
                   [1, 1, 1, 1, 0, 0, 0, 0, 0]])   # right padding
    ref_h, ref_p = hf_forward(hf, ids, am, tt)
    tol = 1e-5 if dtype == np.float32 else 1e-10
    out = ours(ids, attention_mask=am, token_type_ids=tt)
    h, pooled = out.last_hidden_state, out.pooler_output
    assert h.dtype == pooled.dtype == dtype
    real, some = am.astype(bool), am.astype(bool).any(axis=1)
    assert np.abs(h[real] - ref_h[real]).max() <= tol
    np.testing.assert_array_equal(h[~real], 0.0)
    np.testing.assert_allclose(pooled[some], ref_p[some], rtol=0, atol=tol)
    bias = ours.state_dict()["pooler.dense.bias"]
    np.testing.assert_allclose(pooled[~some], np.tanh(bias)[None], rtol=0, atol=tol)
    for n in range(N):  # each row alone: the same outputs
        alone = ours(ids[n:n + 1], attention_mask=am[n:n + 1], token_type_ids=tt[n:n + 1])
        np.testing.assert_allclose(alone.last_hidden_state[0], h[n], rtol=0, atol=tol)
        np.testing.assert_allclose(alone.pooler_output[0], pooled[n], rtol=0, atol=tol)


def test_small_bert_input_id_dtypes(small_hf, small_inputs):
    """int32 ids and python lists give the same result as int64."""
    path, _ = small_hf
    ids, am, tt = small_inputs
    ours = tc.BertModel.from_pretrained(str(path))
    a = ours(ids, attention_mask=am, token_type_ids=tt).last_hidden_state
    b = ours(ids.astype(np.int32), attention_mask=am.astype(np.int32),
             token_type_ids=tt.astype(np.int32)).last_hidden_state
    c = ours(ids.tolist(), attention_mask=am.tolist(), token_type_ids=tt.tolist()).last_hidden_state
    d = ours(ids, attention_mask=am.astype(bool), token_type_ids=tt).last_hidden_state
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(a, d)


def test_small_bert_without_pooler(tmp_path, small_inputs):
    from transformers import BertConfig, BertModel

    torch.manual_seed(1)
    m = BertModel(BertConfig(**SMALL), add_pooling_layer=False).eval()
    _save_hf(m, tmp_path)
    assert not any(k.startswith("pooler") for k in load_file(str(tmp_path / "model.safetensors")))
    ids, am, tt = small_inputs
    ref_h, _ = hf_forward(m, ids, am, tt)
    out = tc.BertModel.from_pretrained(str(tmp_path))(ids, attention_mask=am, token_type_ids=tt)
    check_outputs(out, ref_h, None, am, atol=1e-5)


# ------------------------------------------------------------------- checkpoint name variants
def _rewrite_checkpoint(src, dst, fn):
    """Copy config.json and write model.safetensors with keys/tensors transformed by fn(dict)."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = load_file(str(src / "model.safetensors"))
    save_file(fn(dict(tensors)), str(dst / "model.safetensors"))
    return dst


def _prefixed(t):
    return {"bert." + k: v for k, v in t.items()}


def _gamma_beta(t):
    out = {}
    for k, v in t.items():
        if "LayerNorm" in k:
            k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                         "LayerNorm.beta")
        out[k] = v
    return out


@pytest.mark.parametrize("variant", ["bert_prefix", "gamma_beta", "both", "with_position_ids"])
def test_checkpoint_name_variants_load(small_hf, small_inputs, tmp_path, variant):
    path, ref = small_hf
    fn = {
        "bert_prefix": _prefixed,
        "gamma_beta": _gamma_beta,
        "both": lambda t: _prefixed(_gamma_beta(t)),
        "with_position_ids": lambda t: {**t, "embeddings.position_ids":
                                        np.arange(64, dtype=np.int64)[None]},
    }[variant]
    d = _rewrite_checkpoint(path, tmp_path / variant, fn)
    keys = load_file(str(d / "model.safetensors")).keys()
    if variant in ("bert_prefix", "both"):
        assert all(k.startswith("bert.") for k in keys)
    if variant in ("gamma_beta", "both"):
        assert any(k.endswith("LayerNorm.gamma") for k in keys)
    ids, am, tt = small_inputs
    ref_h, ref_p = hf_forward(ref, ids, am, tt)
    out = tc.BertModel.from_pretrained(str(d))(ids, attention_mask=am, token_type_ids=tt)
    check_outputs(out, ref_h, ref_p, am, atol=1e-5)


def test_pooler_weights_decide_over_config_add_pooling_layer(small_hf, small_inputs, tmp_path):
    """config.json's "add_pooling_layer": false does not keep transformers from loading a pooler
    (it is a constructor argument there): the weights decide. Such a checkpoint with pooler weights
    loads with its pooler (it was refused: "unknown keys: pooler.dense.*"); without them there is
    none, whatever the key says."""
    from transformers import BertModel

    path, ref = small_hf
    d = _rewrite_checkpoint(path, tmp_path / "with_pooler", lambda t: t)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "add_pooling_layer": False}))
    assert BertModel.from_pretrained(str(d)).pooler is not None
    ours = tc.BertModel.from_pretrained(str(d))
    assert ours.config.add_pooling_layer is True
    ids, am, tt = small_inputs
    ref_h, ref_p = hf_forward(ref, ids, am, tt)
    check_outputs(ours(ids, attention_mask=am, token_type_ids=tt), ref_h, ref_p, am, atol=1e-5)
    d = _rewrite_checkpoint(path, tmp_path / "without_pooler",
                            lambda t: {k: v for k, v in t.items() if not k.startswith("pooler.")})
    (d / "config.json").write_text(json.dumps({**config, "add_pooling_layer": True}))
    ours = tc.BertModel.from_pretrained(str(d))
    assert ours.config.add_pooling_layer is False
    check_outputs(ours(ids, attention_mask=am, token_type_ids=tt), ref_h, None, am, atol=1e-5)


@pytest.mark.parametrize("name", ["encoder.layer.1.attention.self.key.weight",
                                  "embeddings.word_embeddings.weight",
                                  "encoder.layer.0.output.LayerNorm.bias"])
def test_checkpoint_missing_tensor_raises(small_hf, tmp_path, name):
    path, _ = small_hf

    def drop(t):
        del t[name]
        return t

    d = _rewrite_checkpoint(path, tmp_path / "missing", drop)
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        tc.BertModel.from_pretrained(str(d))


@pytest.mark.parametrize("name,shape", [("encoder.layer.0.intermediate.dense.weight", (36, 32)),
                                        ("embeddings.position_embeddings.weight", (64, 31)),
                                        ("pooler.dense.bias", (33,))])
def test_checkpoint_misshaped_tensor_raises(small_hf, tmp_path, name, shape):
    path, _ = small_hf

    def reshape(t):
        t[name] = np.zeros(shape, np.float32)
        return t

    d = _rewrite_checkpoint(path, tmp_path / "misshaped", reshape)
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        tc.BertModel.from_pretrained(str(d))


def test_checkpoint_without_config_raises(small_hf, tmp_path):
    path, _ = small_hf
    shutil.copy(path / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises((ValueError, FileNotFoundError), match="config.json"):
        tc.BertModel.from_pretrained(str(tmp_path))


@pytest.mark.parametrize("eps", [1e-3, 1e-12])
def test_config_layer_norm_eps_is_respected(small_inputs, tmp_path, eps):
    """layer_norm_eps from config.json is used (small hidden size makes eps matter)."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(3)
    m = BertModel(BertConfig(**SMALL, layer_norm_eps=eps)).eval()
    with torch.no_grad():  # shrink the embeddings so that the variance is comparable to eps
        m.embeddings.word_embeddings.weight.mul_(0.05)
        m.embeddings.position_embeddings.weight.mul_(0.05)
        m.embeddings.token_type_embeddings.weight.mul_(0.05)
    _save_hf(m, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["layer_norm_eps"] == eps
    ids, am, tt = small_inputs
    ref_h, ref_p = hf_forward(m, ids, am, tt)
    out = tc.BertModel.from_pretrained(str(tmp_path))(ids, attention_mask=am, token_type_ids=tt)
    check_outputs(out, ref_h, ref_p, am, atol=1e-5)


def test_padding_positions_are_zero_and_real_tokens_unaffected(tc_bert, hf_tokenizer):
    """With padding, the layers run on the real tokens only (packed rows); padding rows are zeros."""
    ids, am, tt = hf_encode(hf_tokenizer, SENTENCES[:6])
    assert (am == 0).any()
    out = tc_bert(ids, attention_mask=am, token_type_ids=tt).last_hidden_state
    np.testing.assert_array_equal(out[am == 0], 0.0)
    full = tc_bert(ids, attention_mask=np.ones_like(am), token_type_ids=tt).last_hidden_state
    assert np.abs(full[am == 0]).max() > 0  # without a mask every position is computed


# ------------------------------------------------------------------ keys, heads and config fields
@pytest.mark.parametrize("extra", [
    {"bert.pooler.dense.weight": "pooler.dense.weight"},                        # the same weight twice
    {"embeddings.LayerNorm.gamma": "embeddings.LayerNorm.weight"},               # old and new names
])
def test_two_keys_for_one_weight_are_refused(small_hf, tmp_path, extra):
    """A state dict naming one weight twice (prefixed and not, gamma and weight) is refused naming
    both keys, as torch refuses an unexpected key (the later value was loaded silently)."""
    path, _ = small_hf
    state = load_file(str(path / "model.safetensors"))
    (alias, original), = extra.items()
    state[alias] = state[original] + 1
    model = tc.BertModel(json.loads((path / "config.json").read_text()))
    before = model.state_dict()
    with pytest.raises(ValueError, match=rf"state_dict: keys '{original}' and '{alias}' both name the weight"):
        model.load_state_dict(state)
    assert all(np.array_equal(v, before[k]) for k, v in model.state_dict().items())


def test_only_the_embeddings_buffers_are_dropped(small_hf):
    """position_ids / token_type_ids are dropped as buffers of the embeddings only; a key of that
    name elsewhere is an unknown key (it was dropped anywhere)."""
    path, _ = small_hf
    state = load_file(str(path / "model.safetensors"))
    model = tc.BertModel(json.loads((path / "config.json").read_text()))
    model.load_state_dict({**state, "bert.embeddings.position_ids": np.arange(64)[None],
                           "embeddings.token_type_ids": np.zeros((1, 64), np.int64)})
    with pytest.raises(ValueError, match="unknown.*encoder.layer.0.attention.self.query.token_type_ids"):
        model.load_state_dict({**state, "encoder.layer.0.attention.self.query.token_type_ids": np.zeros(3)})


@pytest.mark.parametrize("head", ["BertForSequenceClassification", "BertForQuestionAnswering",
                                  "BertForTokenClassification", "BertForMaskedLM"])
def test_bert_for_heads_load_as_the_base_model(small_hf, small_inputs, tmp_path, head):
    """A BertFor* checkpoint: the base model loads and its head (classifier.*, qa_outputs.*,
    cls.*) is ignored, as transformers' BertModel.from_pretrained does."""
    import transformers

    path, _ = small_hf
    full = getattr(transformers, head).from_pretrained(str(path)).eval()
    d = _save_hf(full, tmp_path / head)
    keys = load_file(str(d / "model.safetensors")).keys()
    assert any(not k.startswith("bert.") for k in keys)
    ref = transformers.BertModel.from_pretrained(str(d), attn_implementation="eager",
                                                 add_pooling_layer="bert.pooler.dense.weight" in keys).eval()
    ids, am, tt = small_inputs
    ref_h, ref_p = hf_forward(ref, ids, am, tt)
    check_outputs(tc.BertModel.from_pretrained(str(d))(ids, attention_mask=am, token_type_ids=tt), ref_h, ref_p,
                  am, atol=1e-5)


@pytest.mark.parametrize("value, error, match", [
    (2.5, TypeError, "pad_token_id: expected an int, got float"),
    (True, TypeError, "pad_token_id: expected an int, got bool"),
    ("x", TypeError, "pad_token_id: expected an int, got str"),
    (-5, ValueError, r"pad_token_id: expected an int in \[0, 98\], got -5"),
    (10**6, ValueError, r"pad_token_id: expected an int in \[0, 98\], got 1000000"),
])
def test_pad_token_id_is_checked(value, error, match):
    with pytest.raises(error, match=match):
        tc.BertModel(tc.BertConfig(**SMALL, pad_token_id=value))
    assert tc.BertModel(tc.BertConfig(**SMALL, pad_token_id=None)).config.pad_token_id is None


@pytest.mark.parametrize("field", ["hidden_dropout_prob", "attention_probs_dropout_prob"])
@pytest.mark.parametrize("value, error", [("x", TypeError), (None, TypeError), (2.0, ValueError),
                                          (1.0, ValueError), (-0.1, ValueError), (float("nan"), ValueError)])
def test_dropout_fields_are_checked(field, value, error):
    """check() and from_dict check the dropout probabilities as every other field (they were
    accepted, and only a training forward refused them), before a model is built."""
    match = rf"^{field}: expected a probability"
    with pytest.raises(error, match=match):
        tc.BertConfig(**SMALL, **{field: value}).check()
    with pytest.raises(error, match=match):
        tc.BertConfig.from_dict({**SMALL, field: value})
    with pytest.raises(error, match=match):
        tc.BertModel(tc.BertConfig(**SMALL, **{field: value}))
    with pytest.raises(error, match=match):
        tc.BertEmbeddings(tc.BertConfig(**SMALL, **{field: value}))
    for ok in (0, 0.0, 0.1, np.float32(0.5)):
        assert getattr(tc.BertConfig.from_dict({**SMALL, field: ok}), field) == ok


def test_train_mode_must_be_a_bool(small_hf):
    model = tc.BertModel(tc.BertConfig(**SMALL))
    for mode in ("False", None, 1):
        with pytest.raises(TypeError, match="^mode: expected a bool"):
            model.train(mode)
    assert not model.training
    assert model.train(True).training and not model.train(False).training


@pytest.mark.parametrize("bad", [-1, 99, 2**62])
def test_ids_out_of_range_at_padded_positions_are_refused(small_hf, small_inputs, bad):
    """An id outside [0, vocab_size) is refused wherever it stands, padding included (as Hugging
    Face's lookup), and the message gives its flat index in input_ids."""
    path, _ = small_hf
    model = tc.BertModel.from_pretrained(str(path))
    ids, am, tt = (a.copy() for a in small_inputs)
    assert am[1, 3] == 0  # a padded position (flat index 1 * 17 + 3 = 20)
    ids[1, 3] = bad
    with pytest.raises(ValueError, match=rf"^input_ids: id {bad} at flat index 20 is outside \[0, 99\)"):
        model(ids, attention_mask=am, token_type_ids=tt)
    ids[1, 3] = 0
    tt[1, 3] = 7
    with pytest.raises(ValueError, match=r"^token_type_ids: id 7 at flat index 20"):
        model(ids, attention_mask=am, token_type_ids=tt)


@pytest.mark.parametrize("change, problem", [
    (lambda t: t.pop("encoder.layer.1.output.dense.weight"), "missing keys: ['encoder.layer.1.output.dense.weight']"),
    (lambda t: t.update({"encoder.layer.0.extra.weight": np.zeros(3, np.float32)}),
     "unknown keys: ['encoder.layer.0.extra.weight']"),
    (lambda t: t.update({"encoder.layer.1.intermediate.dense.weight": np.zeros((5, 32), np.float32)}),
     "mis-shaped: ['encoder.layer.1.intermediate.dense.weight: expected (37, 32), got (5, 32)']"),], ids=["missing", "unknown", "mis-shaped"])
def test_weights_that_do_not_fit_name_model_safetensors(small_hf, tmp_path, change, problem):
    """A missing, unknown or mis-shaped tensor was "BertModel.load_state_dict refused (module
    unchanged): ...": no file named, and a module promised that the caller never gets. Now the
    error names model.safetensors, with load_state_dict's error as its cause."""
    path, _ = small_hf
    _rewrite_checkpoint(path, tmp_path / "bad", lambda t: (change(t), t)[1])
    with pytest.raises(ValueError) as info:
        tc.BertModel.from_pretrained(tmp_path / "bad")
    assert str(info.value) == (f"{tmp_path / 'bad' / 'model.safetensors'}: the weights do not fit the BertModel that "
                               f"config.json describes: {problem}")
    assert isinstance(info.value.__cause__, ValueError) and "load_state_dict refused" in str(info.value.__cause__)


# ------------------------------------------------------------------------------ save_pretrained
@pytest.mark.parametrize("pooler", [True, False], ids=["pooler", "no_pooler"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_save_pretrained_round_trips_and_loads_in_transformers(small_inputs, tmp_path, dtype, pooler):
    """BertModel.save_pretrained (there was none, and BertConfig had no to_dict, though BERT
    trains here): config.json + model.safetensors that our from_pretrained reads back bit for bit,
    in the model's dtype, and that transformers' BertModel.from_pretrained loads, giving our
    outputs; a model without a pooler too (transformers told by add_pooling_layer=False, which a
    config.json key of that name would have overridden)."""
    from transformers import BertModel

    rng = np.random.default_rng(11)
    config = tc.BertConfig(**SMALL, add_pooling_layer=pooler, layer_norm_eps=1e-6, hidden_dropout_prob=0.05)
    ours = tc.BertModel(config, dtype=dtype)
    ours.load_state_dict({k: rng.normal(0, 0.2, v.shape) + (k.endswith("LayerNorm.weight"))
                          for k, v in ours.state_dict().items()})
    ours.save_pretrained(tmp_path / "saved")
    written = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert written["model_type"] == "bert" and written["architectures"] == ["BertModel"]
    assert "add_pooling_layer" not in written and written["layer_norm_eps"] == 1e-6
    assert tc.BertConfig.from_dict(written) == tc.BertConfig(**SMALL, layer_norm_eps=1e-6, hidden_dropout_prob=0.05)
    tensors = load_file(str(tmp_path / "saved" / "model.safetensors"))
    assert list(tensors) == sorted(ours.state_dict()) and {v.dtype for v in tensors.values()} == {np.dtype(dtype)}
    back = tc.BertModel.from_pretrained(tmp_path / "saved", dtype=dtype)
    assert back.config == config and list(back.state_dict()) == list(ours.state_dict())
    for k, v in ours.state_dict().items():
        assert back.state_dict()[k].dtype == dtype and back.state_dict()[k].tobytes() == v.tobytes(), k
    hf = BertModel.from_pretrained(str(tmp_path / "saved"), add_pooling_layer=pooler, attn_implementation="eager",
                                   dtype=TORCH_DTYPE[np.dtype(dtype)]).eval()
    assert (hf.pooler is not None) == pooler and list(hf.state_dict()) == list(ours.state_dict())
    ids, am, tt = small_inputs
    ref_h, ref_p = hf_forward(hf, ids, am, tt)
    out = ours(ids, attention_mask=am, token_type_ids=tt)
    real = am.astype(bool)
    atol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out.last_hidden_state[real], ref_h[real], rtol=0, atol=atol)
    assert (out.pooler_output is None) == (not pooler)
    if pooler:
        np.testing.assert_allclose(out.pooler_output, ref_p, rtol=0, atol=atol)


def test_save_pretrained_writes_transformers_names_and_plain_numbers(small_inputs, tmp_path):
    """A config of ours that transformers' config.json does not take as is: "gelu_tanh" (transformers'
    ACT2FN has no such name: KeyError on loading the folder) is written as "gelu_pytorch_tanh", the
    same function, and a numpy int field (json could not write it: TypeError) as a plain int."""
    from transformers import BertModel

    config = tc.BertConfig(**{**SMALL, "hidden_size": np.int64(32)}, hidden_act="gelu_tanh")
    ours = tc.BertModel(config)
    ours.save_pretrained(tmp_path / "saved")
    written = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert written["hidden_act"] == "gelu_pytorch_tanh" and written["hidden_size"] == 32
    hf = BertModel.from_pretrained(str(tmp_path / "saved"), attn_implementation="eager").eval()
    ids, am, tt = small_inputs
    ref_h, _ = hf_forward(hf, ids, am, tt)
    real = am.astype(bool)
    out = ours(ids, attention_mask=am, token_type_ids=tt)
    np.testing.assert_allclose(out.last_hidden_state[real], ref_h[real], rtol=0, atol=1e-5)


def test_unknown_keys_reported_under_the_names_given():
    """An unknown key of load_state_dict is reported as given, as torch reports it: "bert.foo" was
    reported as "foo" and an unknown "...LayerNorm.gamma" as "...LayerNorm.weight" (the names a
    known weight may come under are still read as that weight)."""
    model = tc.BertModel(tc.BertConfig(**SMALL))
    before = model.state_dict()
    state = {"bert." + k: v + 1 for k, v in before.items()}
    unknown = {"bert.foo": np.zeros(2), "encoder.layer.7.output.LayerNorm.gamma": np.ones(32),
               "cls.predictions.bias": np.zeros(99), "bert.embeddings.extra.beta": np.zeros(32)}
    result = model.load_state_dict({**state, **unknown}, strict=False)
    assert result.missing_keys == [] and result.unexpected_keys == list(unknown)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k] + 1, err_msg=k)
    with pytest.raises(ValueError, match=re.escape(f"unknown keys: {list(unknown)}")):
        model.load_state_dict({**state, **unknown})
    embeddings = tc.BertEmbeddings.from_model(model)
    result = embeddings.load_state_dict({"bert.embeddings.foo": np.zeros(2), "embeddings.LayerNorm.gamma": np.ones(32)},
                                        strict=False)
    assert result.unexpected_keys == ["bert.embeddings.foo"] and "LayerNorm.weight" not in result.missing_keys


def test_from_pretrained_dtype_none_is_float32(small_hf, small_inputs):
    """dtype=None (transformers' and LlamaForCausalLM.from_pretrained's default) was a TypeError
    here: it loads float32, the same model as dtype=np.float32, with transformers' outputs."""
    path, ref = small_hf
    ids, am, tt = small_inputs
    ours = tc.BertModel.from_pretrained(str(path), dtype=None)
    assert ours.dtype == np.float32
    check_outputs(ours(ids, attention_mask=am, token_type_ids=tt), *hf_forward(ref, ids, am, tt), am, atol=1e-5)
    default = tc.BertModel.from_pretrained(str(path), dtype=np.float32)
    for k, v in default.state_dict().items():
        np.testing.assert_array_equal(ours.state_dict()[k], v, err_msg=k)


def test_backward_checks_the_gradient_shapes_before_converting_them(small_hf):
    """BertModel.backward and BertEmbeddings.backward converted a gradient before checking its
    shape: a wrong-shaped broadcast view was refused for its memory, never for its shape (and a
    smaller one was copied first). The shape is checked first, as every other layer's backward; the
    refused calls keep the training state, and the backward that follows gives torch's gradients."""
    from transformers import BertModel

    path, _ = small_hf
    hf = BertModel.from_pretrained(str(path), attn_implementation="eager", dtype=torch.float64).eval()  # no dropout
    ours = tc.BertModel.from_pretrained(str(path), dtype=np.float64)
    ours.config.hidden_dropout_prob = ours.config.attention_probs_dropout_prob = 0.0  # the file's are 0.1
    ours.train()
    rng = np.random.default_rng(3)
    ids = rng.integers(0, SMALL["vocab_size"], (2, 5))
    H = SMALL["hidden_size"]
    g, gp = rng.standard_normal((2, 5, H)), rng.standard_normal((2, H))
    ours(ids)
    huge = np.broadcast_to(np.float32(0), (10**6, 10**6, H))
    with pytest.raises(ValueError, match=re.escape(f"grad_last_hidden_state: expected shape {(2, 5, H)} "
                                                   f"(last_hidden_state's), got {huge.shape}")):
        ours.backward(huge)
    with pytest.raises(ValueError, match=re.escape(f"grad_pooler_output: expected shape {(2, H)} (pooler_output's), "
                                                   f"got {(10**7, 10**7)}")):
        ours.backward(g, np.broadcast_to(np.float32(0), (10**7, 10**7)))
    ours.backward(g, gp)
    out = hf(torch.from_numpy(ids))
    ((out.last_hidden_state * torch.from_numpy(g)).sum() + (out.pooler_output * torch.from_numpy(gp)).sum()).backward()
    grads = ours.gradients()
    for name, p in hf.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=0, atol=1e-10, err_msg=name)

    emb = tc.BertEmbeddings.from_model(ours).train()
    emb(ids)
    with pytest.raises(ValueError, match=re.escape(f"grad_output: expected shape {(2, 5, H)} (the forward's "
                                                   f"output), got {huge.shape}")):
        emb.backward(huge)
    emb.backward(g)
    hf.zero_grad()
    (hf.embeddings(input_ids=torch.from_numpy(ids)) * torch.from_numpy(g)).sum().backward()
    grads = emb.gradients()
    for name, p in hf.embeddings.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=0, atol=1e-10, err_msg=name)
