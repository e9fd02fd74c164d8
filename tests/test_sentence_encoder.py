"""tc.Tokenizer and tc.SentenceEncoder vs the tokenizers package and transformers' BertModel with
sentence-transformers pooling (mean over the attention mask, then L2 normalisation)."""
from __future__ import annotations

import numpy as np
import pytest
import transformer_core as tc
from conftest import MODEL_NAME, SENTENCES, hf_encode, hf_mean_pool


@pytest.fixture(scope="module")
def tc_tokenizer():
    return tc.Tokenizer.from_pretrained(MODEL_NAME)


@pytest.fixture(scope="module")
def encoder():
    return tc.SentenceEncoder.from_pretrained(MODEL_NAME)


@pytest.fixture(scope="module")
def reference_embeddings(hf_bert, hf_tokenizer):
    """(N, 384) float64 normalised and unnormalised reference embeddings of SENTENCES."""
    ids, am, tt = hf_encode(hf_tokenizer, SENTENCES)
    return (hf_mean_pool(hf_bert, ids, am, tt, normalize=True),
            hf_mean_pool(hf_bert, ids, am, tt, normalize=False))


# ---------------------------------------------------------------------------------------- tokenizer
def test_tokenizer_known_ids(tc_tokenizer):
    enc = tc_tokenizer.encode_batch(["time flies like an arrow"])
    ids = np.asarray(enc["input_ids"])
    am = np.asarray(enc["attention_mask"])
    assert ids.dtype == np.int64 and am.dtype == np.int64
    n = int(am[0].sum())
    assert ids[0, :n].tolist() == [101, 2051, 10029, 2066, 2019, 8612, 102]
    assert np.all(am[0, :n] == 1)


def test_tokenizer_matches_tokenizers_package(tc_tokenizer, hf_tokenizer):
    enc = tc_tokenizer.encode_batch(SENTENCES)
    ids, am, tt = (np.asarray(enc[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    ref_ids, ref_am, ref_tt = hf_encode(hf_tokenizer, SENTENCES)
    for a in (ids, am, tt):
        assert a.dtype == np.int64
        assert a.ndim == 2 and a.shape[0] == len(SENTENCES)
        assert a.shape == ids.shape
    assert ids.shape[1] >= ref_ids.shape[1]
    np.testing.assert_array_equal(am.sum(1), ref_am.sum(1))
    for i in range(len(SENTENCES)):
        n = int(ref_am[i].sum())
        np.testing.assert_array_equal(ids[i, :n], ref_ids[i, :n])
        assert np.all(am[i, :n] == 1) and np.all(am[i, n:] == 0)
        assert np.all(ids[i, n:] == 0)  # [PAD] = 0
    assert np.all(tt == 0)


def test_tokenizer_pads_to_common_length(tc_tokenizer):
    enc = tc_tokenizer.encode_batch(["Hi.", "A much longer sentence than the first one, by far."])
    am = np.asarray(enc["attention_mask"])
    assert am.shape[0] == 2
    assert am[0].sum() < am[1].sum()


@pytest.mark.parametrize("batch_size", [1, 3, 32, 1000])
def test_encode_batches_equal_encode_batch_per_batch(tc_tokenizer, batch_size, monkeypatch):
    """encode_batches tokenizes many batches per call of the tokenizers package (here 10 texts a
    call, so that calls end inside and at the edge of a batch) and pads each batch itself: every
    batch's arrays must be encode_batch's for the same texts, with the package's truncation (a text
    past max_length) and its padding (each batch to its own longest, not the call's)."""
    monkeypatch.setattr(type(tc_tokenizer), "TEXTS_PER_CALL", 10)
    texts = SENTENCES * 3 + ["word " * 700, "", "Hi."]  # 700 words: truncated to max_length (256)
    batches = list(tc_tokenizer.encode_batches(texts, batch_size))
    assert len(batches) == -(-len(texts) // batch_size)
    for b, got in enumerate(batches):
        want = tc_tokenizer.encode_batch(texts[b * batch_size:(b + 1) * batch_size])
        assert got.keys() == want.keys()
        for key in want:
            assert got[key].dtype == np.int64
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"batch {b}, {key}")
    assert max(g["input_ids"].shape[1] for g in batches) == tc_tokenizer.max_length


def test_encode_batches_bad_input(tc_tokenizer):
    with pytest.raises(TypeError, match="texts"):
        tc_tokenizer.encode_batches("one text", 2)
    with pytest.raises(TypeError, match="texts"):
        tc_tokenizer.encode_batches(["a", 3], 2)
    with pytest.raises(TypeError, match="batch_size"):
        tc_tokenizer.encode_batches(["a"], 2.0)
    with pytest.raises(ValueError, match="batch_size"):
        tc_tokenizer.encode_batches(["a"], 0)
    assert list(tc_tokenizer.encode_batches([], 4)) == []


# ---------------------------------------------------------------------------------- sentence encoder
def test_encode_matches_hf_mean_pooling(encoder, reference_embeddings):
    ref, _ = reference_embeddings
    emb = encoder.encode(SENTENCES)
    assert isinstance(emb, np.ndarray)
    assert emb.dtype == np.float32 and emb.shape == (len(SENTENCES), 384)
    cos = (emb.astype(np.float64) * ref).sum(1) / np.linalg.norm(emb, axis=1)
    assert cos.min() >= 0.99999, f"min cosine {cos.min():.8f} (per sentence {np.round(cos, 7)})"
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(emb, ref, atol=1e-4)


@pytest.mark.parametrize("batch_size", [1, 7, 32])
def test_encode_batch_size_preserves_order(encoder, reference_embeddings, batch_size):
    ref, _ = reference_embeddings
    emb = encoder.encode(SENTENCES, batch_size=batch_size)
    assert emb.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(emb, ref, atol=1e-4)
    cos = (emb.astype(np.float64) * ref).sum(1)
    assert cos.min() >= 0.99999


def test_encode_names_batch_size_for_a_batch_too_large(encoder, reference_embeddings, monkeypatch):
    """A batch whose padding or forward needs more than this machine's memory named input_ids or
    texts[a:b], which encode does not take: it names batch_size now, asks for a smaller one, and
    keeps the check's own words. A batch of one text keeps the forward's error (batch_size is not
    at fault), and a batch_size that fits gives the reference embeddings. (The machine's memory is
    patched: the report's case was 100001 texts of up to 256 tokens, 39.7 GB.)"""
    import transformer_core.bert as tcb
    import transformer_core.tokenizer as tct

    n = len(SENTENCES)
    width = encoder.tokenizer.encode_batch(SENTENCES)["input_ids"].shape[1]
    assert n >= 3
    # the forward needs 384 · 4 bytes a position and the inputs' copies (17 bytes): 2 rows fit, n do not
    monkeypatch.setattr(tcb, "physical_memory_bytes", lambda: 3200 * width)
    with pytest.raises(ValueError, match=rf"^batch_size: a batch of {n} texts padded to {width} tokens is too large "
                                         rf"for this machine's memory; use a smaller batch_size \(the default is "
                                         rf"32\)\. What was checked: input_ids: shape \({n}, {width}\) needs \d+ bytes"):
        encoder.encode(SENTENCES, batch_size=2**40)
    ref, _ = reference_embeddings
    np.testing.assert_allclose(encoder.encode(SENTENCES, batch_size=2), ref, atol=1e-4)
    monkeypatch.setattr(tcb, "physical_memory_bytes", lambda: 100)
    with pytest.raises(ValueError, match=r"^input_ids: shape \(1, \d+\) needs \d+ bytes"):
        encoder.encode(SENTENCES, batch_size=1)
    monkeypatch.undo()
    # the tokenizer's padding (three int64 arrays) checked first: no width yet
    monkeypatch.setattr(tct, "physical_memory_bytes", lambda: 100)
    with pytest.raises(ValueError, match=rf"^batch_size: a batch of {n} texts is too large for this machine's "
                                         rf"memory; use a smaller batch_size \(the default is 32\)\. What was "
                                         rf"checked: texts\[0:{n}\]: padding {n} texts"):
        encoder.encode(SENTENCES, batch_size=n)


def test_encode_is_mean_pool_of_the_model_bitwise(encoder):
    """encode's pooling (a plain sum over L: the model leaves zeros at padding positions) gives
    mean_pool's bits on a padded batch, and those zeros are really there."""
    batch = SENTENCES[:5]  # of different lengths: padded
    enc = encoder.tokenizer.encode_batch(batch)
    assert (enc["attention_mask"] == 0).any()
    hidden = encoder.model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).last_hidden_state
    assert np.all(hidden[enc["attention_mask"] == 0] == 0)
    emb = encoder.encode(batch, batch_size=len(batch), normalize=False)
    # encode sorts by length (characters, longest first) before batching; one batch holds them all
    order = np.argsort([-len(t) for t in batch], kind="stable")
    sorted_enc = encoder.tokenizer.encode_batch([batch[i] for i in order])
    sorted_hidden = encoder.model(sorted_enc["input_ids"], sorted_enc["attention_mask"],
                                  sorted_enc["token_type_ids"]).last_hidden_state
    expected = np.empty_like(emb)
    expected[order] = tc.mean_pool(sorted_hidden, sorted_enc["attention_mask"])
    np.testing.assert_array_equal(emb, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_mean_pool_non_finite_values_match_sentence_transformers_without_numpy_warnings(dtype):
    """An inf in a padded position (``inf · 0``) leaked numpy's "invalid value encountered in
    multiply" RuntimeWarning, and a sum past the dtype's max its "overflow" one. The values are
    sentence-transformers' formula in torch (``(h * m).sum(1) / m.sum(1).clamp(min=1e-9)``): NaN,
    inf or finite where it gives them, and no warning (warnings are errors here)."""
    import warnings

    import torch

    big = np.finfo(dtype).max
    h = np.array([[[1.0, 2.0], [np.inf, -np.inf], [0.5, 1.0]],   # inf and -inf padded: NaN
                  [[np.nan, 1.0], [2.0, 3.0], [1.0, 1.0]],       # NaN padded: NaN
                  [[big, 1.0], [big, 2.0], [1.0, 0.0]],          # a sum past the max: inf
                  [[np.inf, 4.0], [1.0, 2.0], [3.0, 5.0]],       # inf among the real tokens: inf
                  [[np.inf, 1.0], [1.0, 1.0], [1.0, 1.0]]], dtype)  # no real token: inf · 0
    mask = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0], [1, 1, 1], [0, 0, 0]])
    ht = torch.from_numpy(h)
    mt = torch.from_numpy(mask).unsqueeze(-1).to(ht.dtype)
    ref = ((ht * mt).sum(1) / mt.sum(1).clamp(min=1e-9)).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = tc.mean_pool(h, mask)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, ref)  # NaN where the reference has NaN, inf where it has inf
    assert np.isnan(out[0]).all() and np.isnan(out[1, 0]) and np.isinf(out[2, 0]) and np.isnan(out[4, 0])


@pytest.mark.filterwarnings("ignore:attention_probs_dropout_prob")
def test_encode_computes_as_eval_in_training_mode(encoder):
    """A model in training mode (fine-tuning; all-MiniLM-L6-v2's hidden_dropout_prob is 0.1) is run
    without dropout by encode, as sentence-transformers' encode (it calls eval()): the same bits as
    in eval mode (they were 0.05 off, other on every call). The mode stays, and a training forward
    awaiting its backward keeps its state: the backward gives the gradients it gives without the
    encode in between."""
    model = tc.BertModel.from_pretrained(MODEL_NAME)  # its own model: the fixture's stays in eval mode
    assert model.config.hidden_dropout_prob > 0
    enc = tc.SentenceEncoder(model, encoder.tokenizer)
    batch = SENTENCES[:6]
    ref = enc.encode(batch)
    np.testing.assert_array_equal(ref, encoder.encode(batch))
    batch_ids = encoder.tokenizer.encode_batch(SENTENCES[6:9])
    args = (batch_ids["input_ids"], batch_ids["attention_mask"], batch_ids["token_type_ids"])
    grads = []
    for between in (False, True):
        model.train()
        model.zero_grad()
        tc.manual_seed(3)
        hidden = model(*args).last_hidden_state
        if between:
            np.testing.assert_array_equal(enc.encode(batch), ref)
            np.testing.assert_array_equal(enc.encode(batch, batch_size=2), encoder.encode(batch, batch_size=2))
            assert model.training
        model.backward(np.cos(hidden))
        grads.append({k: np.array(v) for k, v in model.gradients().items()})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for k in grads[0]:
        np.testing.assert_array_equal(grads[0][k], grads[1][k])


def _encode_batch_by_batch(encoder, sentences, batch_size):
    """encode's sort and batches, each batch through the model and mean_pool alone (no scope)."""
    order = np.argsort([-len(t) for t in sentences], kind="stable")
    out = np.empty((len(sentences), 384), np.float32)
    for start in range(0, len(sentences), batch_size):
        rows = order[start:start + batch_size]
        enc = encoder.tokenizer.encode_batch([sentences[i] for i in rows])
        hidden = encoder.model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).last_hidden_state
        out[rows] = tc.mean_pool(hidden, enc["attention_mask"])
    return out


def test_encode_packs_each_weight_once_with_the_same_bits(encoder):
    """encode runs its batches in one packed-weight scope (kernels/packed_weights.hpp): the first
    batch packs each weight, the others reuse its panels. Batches of more than 32 tokens (the
    packed GEMM, not the few-row path) get the bits of the model run batch by batch, and a weight
    written between two encodes (same buffer, same address) is packed again."""
    sentences = [f"{SENTENCES[i % len(SENTENCES)]} This is sentence number {i} of the test." for i in range(24)]
    enc = encoder.tokenizer.encode_batch(sentences[:8])
    assert enc["attention_mask"].sum() > 32  # every batch of 8 takes the packed path
    emb = encoder.encode(sentences, batch_size=8, normalize=False)
    np.testing.assert_array_equal(emb, _encode_batch_by_batch(encoder, sentences, 8))
    state = encoder.model.state_dict()
    name = "encoder.layer.0.intermediate.dense.weight"
    try:
        encoder.model.load_state_dict({**state, name: state[name] * np.float32(1.5)})
        emb2 = encoder.encode(sentences, batch_size=8, normalize=False)
        np.testing.assert_array_equal(emb2, _encode_batch_by_batch(encoder, sentences, 8))
        assert np.abs(emb2 - emb).max() > 1e-3  # the new weight was used
    finally:
        encoder.model.load_state_dict(state)
    np.testing.assert_array_equal(encoder.encode(sentences, batch_size=8, normalize=False), emb)


def test_encode_unnormalized(encoder, reference_embeddings):
    ref_norm, ref_raw = reference_embeddings
    emb = encoder.encode(SENTENCES, normalize=False)
    assert emb.dtype == np.float32 and emb.shape == (len(SENTENCES), 384)
    norms = np.linalg.norm(emb, axis=1)
    assert not np.allclose(norms, 1.0, atol=1e-3)  # really unnormalised
    np.testing.assert_allclose(emb, ref_raw, atol=1e-4)
    np.testing.assert_allclose(emb / norms[:, None], ref_norm, atol=1e-4)


def test_encode_progress_none_and_single(encoder, reference_embeddings):
    ref, _ = reference_embeddings
    emb = encoder.encode(SENTENCES[:3], batch_size=2, normalize=True, progress=None)
    np.testing.assert_allclose(emb, ref[:3], atol=1e-4)
    one = encoder.encode([SENTENCES[5]])
    assert one.shape == (1, 384)
    np.testing.assert_allclose(one[0], ref[5], atol=1e-4)


def test_encode_semantics_sanity(encoder):
    """Paraphrases are closer than unrelated sentences (values, not just shapes)."""
    e = encoder.encode(["A man is playing a guitar.", "Someone plays the guitar.",
                        "The stock market crashed today."])
    sim = e @ e.T
    assert sim[0, 1] > sim[0, 2] + 0.2
    np.testing.assert_allclose(np.diag(sim), 1.0, atol=1e-5)


def test_text_that_is_not_valid_unicode_names_the_argument(tc_tokenizer, encoder, hf_tokenizer):
    # "caf\udce9": the Latin-1 byte of "café" in a str decoded with surrogateescape (a shell argument)
    bad = "caf\udce9"
    where = "got a lone surrogate '\\\\udce9' at position 3"
    with pytest.raises(ValueError, match=f"^text: expected valid Unicode text, {where} "):
        tc_tokenizer.encode(bad)
    with pytest.raises(ValueError, match=f"^text: .*{where}"):
        tc_tokenizer.tokenize(bad)
    with pytest.raises(ValueError, match=f"^texts: .*{where} of the text at index 1 "):
        tc_tokenizer.encode_batch(["fine", bad])
    with pytest.raises(ValueError, match=f"^texts: .*{where} of the text at index 2 "):
        tc_tokenizer.encode_batches(["a", "b", bad], 2)  # when called, not when the bad batch comes
    # the index is the caller's, not the one in the length-sorted order encode batches in
    with pytest.raises(ValueError, match=f"^sentences: .*{where} of the text at index 1 "):
        encoder.encode(["A much longer sentence than the next one.", bad])
    for good in ("café", "cafe\u0301", "caf\U0001d41e"):  # valid text is untouched: the reference's ids
        assert tc_tokenizer.encode(good) == hf_tokenizer.encode(good).ids


# ------------------------------------------------------------- pooling from a sentence-transformers folder
def _st_folder(tmp_path, model_dir, name, pooling=None, normalize=True, extra_modules=()):
    """A copy of the all-MiniLM-L6-v2 folder (big files linked) with its modules.json and
    1_Pooling/config.json rewritten: ``pooling`` the pooling_mode_* keys set true."""
    import json
    import os

    d = tmp_path / name
    d.mkdir()
    for f in model_dir.iterdir():
        if f.is_file() and f.name != "modules.json":
            os.symlink(f, d / f.name)
    (d / "1_Pooling").mkdir()
    modes = {k: False for k in ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                                "pooling_mode_mean_sqrt_len_tokens")}
    modes.update({k: True for k in (pooling or ())})
    (d / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 384, **modes}))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    modules += [{"idx": 2, "name": "2", "path": p, "type": f"sentence_transformers.models.{t}"}
                for t, p in extra_modules]
    if normalize:
        modules.append({"idx": len(modules), "name": "n", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (d / "modules.json").write_text(json.dumps(modules))
    return d


def _hf_pool(hf_bert, hf_tokenizer, sentences, pooling, normalize):
    """transformers' BertModel + sentence-transformers' pooling, computed in torch (float64)."""
    import torch

    ids, am, tt = hf_encode(hf_tokenizer, sentences)
    with torch.no_grad():
        h = hf_bert(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(am),
                    token_type_ids=torch.from_numpy(tt)).last_hidden_state.double()
    m = torch.from_numpy(am)[..., None].double()
    if pooling == "cls":
        e = h[:, 0]
    elif pooling == "max":
        e = torch.where(m > 0, h, torch.full_like(h, -1e9)).max(dim=1).values
    else:
        e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
    if normalize:
        e = torch.nn.functional.normalize(e, p=2, dim=1)
    return e.numpy()


@pytest.mark.parametrize("pooling, normalize", [("cls", False), ("cls", True), ("max", False), ("mean", False),
                                                ("mean", True)])
def test_pooling_read_from_the_folder_matches_transformers(tmp_path, model_dir, hf_bert, hf_tokenizer,
                                                           pooling, normalize):
    mode = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
            "mean": "pooling_mode_mean_tokens"}[pooling]
    d = _st_folder(tmp_path, model_dir, "m", [mode], normalize)
    enc = tc.SentenceEncoder.from_pretrained(d)
    assert (enc.pooling, enc.normalize) == (pooling, normalize)
    sentences = SENTENCES[:7] + ["ok"]
    ours = enc.encode(sentences, batch_size=3)
    ref = _hf_pool(hf_bert, hf_tokenizer, sentences, pooling, normalize)
    np.testing.assert_allclose(ours, ref, atol=1e-4 if not normalize else 1e-5)
    # normalize= still overrides the folder's default
    forced = enc.encode(sentences, batch_size=3, normalize=not normalize)
    np.testing.assert_allclose(forced, _hf_pool(hf_bert, hf_tokenizer, sentences, pooling, not normalize),
                               atol=1e-4 if normalize else 1e-5)


def test_default_model_keeps_mean_and_normalize(encoder):
    assert (encoder.pooling, encoder.normalize) == ("mean", True)


@pytest.mark.parametrize("pooling, extra, match", [
    (["pooling_mode_mean_sqrt_len_tokens"], (), r"1_Pooling/config.json: pooling_mode_mean_sqrt_len_tokens is True"),
    (["pooling_mode_weightedmean_tokens"], (), r"pooling_mode_weightedmean_tokens is True"),
    (["pooling_mode_cls_token", "pooling_mode_mean_tokens"], (), r"config.json: expected a pooling_mode, or exactly "
                                                                 r"one of"),
    ([], (), r"config.json: expected a pooling_mode, or exactly one of .* got none"),
    (["pooling_mode_mean_tokens"], (("Dense", "2_Dense"),), r"modules.json: module 2 has type "
                                                            r"'sentence_transformers.models.Dense'"),
])
def test_unsupported_pooling_or_module_is_refused(tmp_path, model_dir, pooling, extra, match):
    from transformer_core.sentence_encoder import read_pooling

    d = _st_folder(tmp_path, model_dir, "m", pooling, True, extra)
    with pytest.raises(ValueError, match=match):
        read_pooling(d)
    with pytest.raises(ValueError, match=match):
        tc.SentenceEncoder.from_pretrained(d)


@pytest.mark.parametrize("flag, value", [("pooling_mode_cls_token", "false"), ("pooling_mode_mean_tokens", "true"),
                                         ("pooling_mode_max_tokens", None), ("pooling_mode_cls_token", 2)])
def test_a_pooling_flag_that_is_not_a_bool_is_refused(tmp_path, model_dir, flag, value):
    """A flag of "false" is true to Python: read by truth it pooled CLS where mean was meant."""
    import json

    from transformer_core.sentence_encoder import read_pooling

    d = _st_folder(tmp_path, model_dir, "m", ["pooling_mode_mean_tokens"] if flag != "pooling_mode_mean_tokens" else [])
    config = json.loads((d / "1_Pooling" / "config.json").read_text())
    config[flag] = value
    (d / "1_Pooling" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"1_Pooling/config.json: {flag}: expected true or false, got "):
        read_pooling(d)
    config[flag] = 1 if flag == "pooling_mode_mean_tokens" else 0  # JSON's 1 and 0 read as sentence-transformers does
    (d / "1_Pooling" / "config.json").write_text(json.dumps(config))
    assert read_pooling(d)["pooling"] == "mean"


def test_a_tokenizer_of_another_vocabulary_is_named(model_dir):
    """A tokenizer whose ids the model has no row for: the error names the tokenizer and the text,
    not the forward's input_ids (which the caller never passed); the texts before it are fine."""
    small = tc.BertModel(tc.BertConfig(vocab_size=2000, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                       intermediate_size=64, max_position_embeddings=64))
    tok = tc.Tokenizer.from_pretrained(model_dir)
    tok.max_length = 64
    enc = tc.SentenceEncoder(small, tok)
    ids = tok.encode("hello world")
    assert max(ids) >= 2000
    assert enc.encode(["[UNK]"]).shape == (1, 32)  # ids 101, 100, 102: all inside
    with pytest.raises(ValueError, match=r"tokenizer: sentences\[1\] gives token id \d+, but the model's embedding "
                                         r"has 2000 rows"):
        enc.encode(["[UNK]", "hello world"], batch_size=1)


def _old_layout_folder(tmp_path, model_dir, transformer_path="0_Transformer"):
    """all-MiniLM-L6-v2 in the older sentence-transformers layout: the model and tokenizer files in
    0_Transformer/ (linked), modules.json at the top naming it, 1_Pooling/ beside it."""
    import json
    import os
    import shutil

    d = tmp_path / "st_old"
    (d / "0_Transformer").mkdir(parents=True)
    for f in model_dir.iterdir():
        if f.is_file() and f.name not in ("modules.json", "config_sentence_transformers.json", "README.md"):
            os.symlink(f, d / "0_Transformer" / f.name)
    shutil.copytree(model_dir / "1_Pooling", d / "1_Pooling")
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": transformer_path, "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    return d


def test_the_older_layout_loads_the_model_from_its_transformer_folder(tmp_path, model_dir, encoder, hf_bert,
                                                                      hf_tokenizer):
    """modules.json's Transformer path "0_Transformer" (the older layout) was ignored: the model was
    looked for at the top ("config.json: not found"). Now it is read from that folder: the same
    embeddings, max_seq_length and fingerprint as the folder it was made from."""
    from transformer_core import corpus
    from transformer_core.sentence_encoder import transformer_folder

    d = _old_layout_folder(tmp_path, model_dir)
    assert not (d / "config.json").exists()
    assert transformer_folder(d) == d / "0_Transformer" and transformer_folder(model_dir) == model_dir
    for bad in (5, None, b"x"):
        with pytest.raises(TypeError, match=r"^model_dir: expected a str or os.PathLike, got "):
            transformer_folder(bad)
    with pytest.raises(NotADirectoryError, match=r"^model_dir: expected a model folder, got '.*missing'"):
        transformer_folder(tmp_path / "missing")
    enc = tc.SentenceEncoder.from_pretrained(d)
    assert (enc.pooling, enc.normalize, enc.max_seq_length) == ("mean", True, 256)
    sentences = SENTENCES[:6] + ["ok"]
    ours = enc.encode(sentences, batch_size=4)
    np.testing.assert_array_equal(ours, encoder.encode(sentences, batch_size=4))
    np.testing.assert_allclose(ours, _hf_pool(hf_bert, hf_tokenizer, sentences, "mean", True), atol=1e-5)
    assert corpus.model_identity(d)["fingerprint"] == corpus.model_identity(model_dir)["fingerprint"]


@pytest.mark.parametrize("path, error, match", [
    ("../elsewhere", ValueError, r"modules.json: module 0 \(Transformer\): path '../elsewhere' is outside the "
                                 r"model folder"),
    ("/tmp", ValueError, r"modules.json: module 0 \(Transformer\): path '/tmp' is outside the model folder"),
    ("0_Transformer/../..", ValueError, r"path '0_Transformer/../..' is outside the model folder"),
    ("1_Missing", FileNotFoundError, r"1_Missing: not found \(the Transformer module's folder, path '1_Missing' "
                                     r"in .*modules.json\)"),
    (3, ValueError, r"modules.json: module 0 \(Transformer\): expected a str 'path', got 3"),
])
def test_a_transformer_path_outside_the_folder_or_missing_is_refused(tmp_path, model_dir, path, error, match):
    d = _old_layout_folder(tmp_path, model_dir, path)
    with pytest.raises(error, match=match):
        tc.SentenceEncoder.from_pretrained(d)


def test_bad_modules_json_is_refused(tmp_path, model_dir):
    from transformer_core.sentence_encoder import read_pooling

    d = _st_folder(tmp_path, model_dir, "m", ["pooling_mode_mean_tokens"])
    (d / "modules.json").write_text("{not json")
    with pytest.raises(ValueError, match="modules.json: not valid JSON"):
        read_pooling(d)
    (d / "modules.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match="modules.json: expected a JSON list"):
        read_pooling(d)
    assert read_pooling(model_dir) == {"pooling": "mean", "normalize": True}


def test_pooling_enters_the_fingerprint(tmp_path, model_dir):
    from transformer_core import corpus

    base = corpus.model_identity(model_dir)["fingerprint"]
    assert corpus.model_identity(_st_folder(tmp_path, model_dir, "mean", ["pooling_mode_mean_tokens"])
                                 )["fingerprint"] == base
    cls = corpus.model_identity(_st_folder(tmp_path, model_dir, "cls", ["pooling_mode_cls_token"]))["fingerprint"]
    raw = corpus.model_identity(_st_folder(tmp_path, model_dir, "raw", ["pooling_mode_mean_tokens"], False)
                                )["fingerprint"]
    assert len({base, cls, raw}) == 3



# ---------------------------------------------------------- prompts (config_sentence_transformers.json)
def _prompt_folder(tmp_path, model_dir, name, st_config, pooling="pooling_mode_mean_tokens", include_prompt=None):
    """_st_folder with its own config_sentence_transformers.json (``st_config``: a dict, or raw
    text) and, when ``include_prompt`` is given, that key in 1_Pooling/config.json. The linked
    file is unlinked first: writing through the link would rewrite the installed model's file."""
    import json

    d = _st_folder(tmp_path, model_dir, name, [pooling])
    st = d / "config_sentence_transformers.json"
    if st.is_symlink():
        st.unlink()
    st.write_text(st_config if isinstance(st_config, str) else json.dumps(st_config))
    if include_prompt is not None:
        pc = d / "1_Pooling" / "config.json"
        pc.write_text(json.dumps({**json.loads(pc.read_text()), "include_prompt": include_prompt}))
    return d


def _hf_prompted(hf_bert, hf_tokenizer, texts, prompt, pooling="mean", skip=0):
    """transformers' BertModel on ``prompt + text``, pooled as sentence-transformers 6's Pooling
    (the first ``skip`` positions out of the pooling mask: include_prompt=False; "cls" takes the
    first position left in that mask, 0 when none is left), L2-normalised."""
    import torch

    ids, am, tt = hf_encode(hf_tokenizer, [prompt + t for t in texts])
    with torch.no_grad():
        h = hf_bert(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(am),
                    token_type_ids=torch.from_numpy(tt)).last_hidden_state.double().numpy()
    m = am.astype(np.float64)
    m[:, :skip] = 0
    if pooling == "max":
        e = np.where(m[..., None] > 0, h, -1e9).max(axis=1)
    elif pooling == "cls":
        e = h[np.arange(len(texts)), (m > 0).argmax(axis=1)]
    else:
        e = (h * m[..., None]).sum(1) / np.clip(m.sum(1), 1e-9, None)[:, None]
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def test_quantized_copy_keeps_the_prompts(tmp_path, model_dir):
    """quantize(encoder) (a copy) keeps the folder's prompts and include_prompt: its embeddings
    stay those of ``prompt + text`` (int8's accuracy), not of the bare text."""
    d = _prompt_folder(tmp_path, model_dir, "q", {"prompts": {"query": "query: "}, "default_prompt_name": "query"},
                       include_prompt=False)
    enc = tc.SentenceEncoder.from_pretrained(d)
    q = tc.quantize(enc)
    assert (q.prompts, q.default_prompt_name, q.include_prompt) == ({"query": "query: "}, "query", False)
    texts = ["What is the capital of France?", "ok"]
    cos = np.sum(q.encode(texts) * enc.encode(texts), axis=1)
    bare = np.sum(q.encode(texts) * enc.encode(texts, prompt=""), axis=1)
    assert cos.min() > 0.99 and bare.max() < cos.min() - 0.01, (cos, bare)


def test_default_prompt_of_the_folder_is_put_before_every_text(tmp_path, model_dir, hf_bert, hf_tokenizer):
    """A folder whose config_sentence_transformers.json names a default prompt embeds
    ``prompt + text``, as SentenceTransformer.encode; prompt_name= and prompt= pick another."""
    from transformer_core.sentence_encoder import read_prompts

    d = _prompt_folder(tmp_path, model_dir, "m", {"prompts": {"query": "query: ", "document": "", "p": "passage: "},
                                                   "default_prompt_name": "query", "__version__": {}})
    assert read_prompts(d) == {"prompts": {"query": "query: ", "document": "", "p": "passage: "},
                               "default_prompt_name": "query", "include_prompt": True}
    enc = tc.SentenceEncoder.from_pretrained(d)
    texts = ["What is the capital of France?", "ok", SENTENCES[3]]
    np.testing.assert_allclose(enc.encode(texts, batch_size=2), _hf_prompted(hf_bert, hf_tokenizer, texts, "query: "),
                               atol=1e-5)
    np.testing.assert_allclose(enc.encode("ok"), _hf_prompted(hf_bert, hf_tokenizer, ["ok"], "query: ")[0], atol=1e-5)
    plain = _hf_prompted(hf_bert, hf_tokenizer, texts, "")
    np.testing.assert_allclose(enc.encode(texts, prompt_name="document"), plain, atol=1e-5)  # "" adds nothing
    np.testing.assert_allclose(enc.encode(texts, prompt=""), plain, atol=1e-5)
    np.testing.assert_allclose(enc.encode(texts, prompt_name="p"),
                               _hf_prompted(hf_bert, hf_tokenizer, texts, "passage: "), atol=1e-5)
    np.testing.assert_allclose(enc.encode(texts, prompt="title: "),
                               _hf_prompted(hf_bert, hf_tokenizer, texts, "title: "), atol=1e-5)
    with pytest.raises(ValueError, match=r"^prompt_name: expected one of the encoder's prompts "
                                         r"\['query', 'document', 'p'\], got 'nope'$"):
        enc.encode(texts, prompt_name="nope")
    with pytest.raises(ValueError, match=r"^prompt_name, prompt: expected at most one"):
        enc.encode(texts, prompt_name="p", prompt="x: ")
    with pytest.raises(TypeError, match=r"^prompt: expected None or a str, got int$"):
        enc.encode(texts, prompt=3)
    # a folder without prompts (the embedded model's file holds only __version__) adds nothing
    assert read_prompts(model_dir) == {"prompts": {}, "default_prompt_name": None, "include_prompt": True}
    d2 = _prompt_folder(tmp_path, model_dir, "none", {"prompts": {"query": "query: "}})
    np.testing.assert_allclose(tc.SentenceEncoder.from_pretrained(d2).encode(texts), plain, atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_prompt_left_out_of_the_pooling_when_include_prompt_is_false(tmp_path, model_dir, hf_bert, hf_tokenizer,
                                                                      pooling):
    """include_prompt false in the Pooling config: the prompt is attended to but its positions
    ([CLS] and the prompt's tokens: sentence-transformers' prompt_length) are not pooled."""
    mode = {"mean": "pooling_mode_mean_tokens", "max": "pooling_mode_max_tokens"}[pooling]
    d = _prompt_folder(tmp_path, model_dir, "m", {"prompts": {"q": "Represent this question: "},
                                                   "default_prompt_name": "q"}, mode, include_prompt=False)
    enc = tc.SentenceEncoder.from_pretrained(d)
    assert enc.include_prompt is False
    texts = ["What is the capital of France?", "ok", SENTENCES[5]]
    skip = len(hf_tokenizer.encode("Represent this question: ").ids) - 1
    assert skip > 1
    ref = _hf_prompted(hf_bert, hf_tokenizer, texts, "Represent this question: ", pooling, skip)
    np.testing.assert_allclose(enc.encode(texts, batch_size=2), ref, atol=1e-5)
    assert not np.allclose(ref, _hf_prompted(hf_bert, hf_tokenizer, texts, "Represent this question: ", pooling),
                           atol=1e-3)


@pytest.mark.parametrize("text, match", [
    ("{not json", r"config_sentence_transformers.json: not valid JSON"),
    ("[1]", r"config_sentence_transformers.json: expected a JSON object, got list"),
    ('{"prompts": ["query: "]}', r"config_sentence_transformers.json: prompts: expected an object"),
    ('{"prompts": {"q": 1}}', r"config_sentence_transformers.json: prompts: expected an object"),
    ('{"prompts": {"q": "q: "}, "default_prompt_name": "query"}',
     r"config_sentence_transformers.json: default_prompt_name: expected null or one of the prompts' names "
     r"\['q'\], got 'query'"),
])
def test_malformed_prompts_file_is_refused_naming_it(tmp_path, model_dir, text, match):
    from transformer_core.sentence_encoder import read_prompts

    d = _prompt_folder(tmp_path, model_dir, "m", text)
    with pytest.raises(ValueError, match=match):
        read_prompts(d)
    with pytest.raises(ValueError, match=match):
        tc.SentenceEncoder.from_pretrained(d)


def test_include_prompt_that_is_not_a_bool_is_refused(tmp_path, model_dir):
    d = _prompt_folder(tmp_path, model_dir, "m", {}, include_prompt="no")
    with pytest.raises(ValueError, match=r"1_Pooling/config.json: include_prompt: expected true or false, got 'no'"):
        tc.SentenceEncoder.from_pretrained(d)


def test_encode_takes_a_0d_string_array_as_one_text(encoder, hf_bert, hf_tokenizer):
    """np.array("text") (0-d) is one text, as a str (one (H,) row); a 0-d array of something else
    is refused."""
    got = encoder.encode(np.array("a sentence"))
    assert got.shape == (384,)
    np.testing.assert_array_equal(got, encoder.encode("a sentence"))
    np.testing.assert_allclose(got, _hf_prompted(hf_bert, hf_tokenizer, ["a sentence"], "")[0], atol=1e-5)
    np.testing.assert_array_equal(encoder.encode(np.array("a sentence", dtype=object)), got)
    with pytest.raises(TypeError, match=r"^sentences: expected a str or an iterable of str, got a 0-d numpy array "
                                        r"of int64$"):
        encoder.encode(np.array(5, dtype=np.int64))


# ------------------------------------------------------------------------- the tokenizer's backend
def test_tokenizers_on_one_backend_keep_their_own_truncation(tc_tokenizer):
    """Two Tokenizers built on one tokenizers.Tokenizer: each keeps its max_length (the second one's
    truncation reached the first), and the caller's object is not changed."""
    from tokenizers import Tokenizer as HFTokenizer

    backend = HFTokenizer.from_str(tc_tokenizer.backend.to_str())
    backend.no_truncation()
    backend.no_padding()
    long = "The quick brown fox jumps over the lazy dog. " * 40  # ~400 tokens
    t256 = tc.Tokenizer(backend, max_length=256)
    t8 = tc.Tokenizer(backend, max_length=8)
    causal = tc.Tokenizer(backend, max_length=None)
    assert t256.encode_batch([long])["input_ids"].shape[1] == 256
    assert t8.encode_batch([long])["input_ids"].shape[1] == 8
    assert len(causal.encode(long)) > 256
    assert backend.truncation is None and backend.padding is None
    with pytest.raises(TypeError, match="^tokenizer: expected a tokenizers.Tokenizer, got str"):
        tc.Tokenizer("bert-base-uncased")


def test_tokenizer_backends_wrapped_uncopyable_or_subclassed(tc_tokenizer, monkeypatch):
    """A tokenizers.implementations wrapper is unwrapped; a backend with a Python pre-tokenizer
    (which cannot be copied) is used as is and still encodes in batches; a subclass's __init__ runs
    under from_pretrained; bad arguments are refused before the backend is copied."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import pre_tokenizers
    from tokenizers.implementations import BertWordPieceTokenizer

    vocab = tc_tokenizer.backend.get_vocab()
    wrapped = BertWordPieceTokenizer(vocab)
    ours = tc.Tokenizer(wrapped, max_length=16)
    assert ours.encode("hello world") == tc_tokenizer.encode("hello world")

    class Split:  # a pre-tokenizer written in Python: the backend cannot be serialized
        def pre_tokenize(self, pretok):
            pretok.split(lambda i, s: s.split(" ", "removed"))

    custom = HFTokenizer.from_str(tc_tokenizer.backend.to_str())
    custom.pre_tokenizer = pre_tokenizers.PreTokenizer.custom(Split())
    t = tc.Tokenizer(custom, max_length=16)
    batches = list(t.encode_batches(["hello world", "a b c d e f"], batch_size=2))
    assert batches[0]["input_ids"].shape == (2, 8) and batches[0]["attention_mask"].sum() == 4 + 8
    assert custom.padding is not None  # its padding came back after the unpadded call

    class MyTokenizer(tc.Tokenizer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.mine = True

    assert MyTokenizer.from_pretrained("all-MiniLM-L6-v2").mine
    monkeypatch.setattr(tc.tokenizer, "_copy_backend", lambda b: pytest.fail("copied before the checks"))
    with pytest.raises(ValueError, match="^max_length"):
        tc.Tokenizer(tc_tokenizer.backend, max_length=0)
    with pytest.raises(TypeError, match="^pad_token: expected a str or None, got int"):
        tc.Tokenizer(tc_tokenizer.backend, pad_token=5)


def test_token_lookups_check_their_argument(tc_tokenizer):
    assert tc_tokenizer.id_to_token(101) == "[CLS]" and tc_tokenizer.token_to_id("[CLS]") == 101
    assert tc_tokenizer.id_to_token(10**12) is None and tc_tokenizer.token_to_id("no such token") is None
    with pytest.raises(ValueError, match="^token_id: expected an int >= 0, got -1"):
        tc_tokenizer.id_to_token(-1)
    with pytest.raises(TypeError, match="^token_id: expected an int"):
        tc_tokenizer.id_to_token("5")
    with pytest.raises(TypeError, match="^token: expected a str, got int"):
        tc_tokenizer.token_to_id(5)
    with pytest.raises(TypeError, match="^skip_special_tokens: expected a bool, got str"):
        tc_tokenizer.text_stream(skip_special_tokens="no")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cosine_similarity_of_rows_whose_norm_overflows(dtype):
    """A finite row whose squared norm overflows (float32 entries near 1e19, float64 near 1e155):
    its cosines are those of the row scaled down (they were 0: the row divided by an inf norm);
    zero rows still give 0, tiny rows are divided by 1e-12 as before."""
    big = dtype(2.0**64) if dtype == np.float32 else dtype(1e200)
    a = np.array([[0, 0, 0, 1, 0], [0, 0, 0, 0, 0], [1e-20, 0, 0, 0, 0]], dtype) * np.array([[big], [1], [1]], dtype)
    b = np.array([[0.5, -1, 2, -3, 0.25]], dtype)
    got = tc.cosine_similarity(a, b)
    ref = -3 / np.linalg.norm(b.astype(np.float64))
    np.testing.assert_allclose(got[0, 0], ref, rtol=1e-6)
    assert got[1, 0] == 0
    np.testing.assert_allclose(got[2, 0], 1e-20 / 1e-12 * 0.5 / np.linalg.norm(b.astype(np.float64)), rtol=1e-5)
    np.testing.assert_allclose(tc.cosine_similarity(a[:1])[0, 0], 1, rtol=1e-6)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning for the rows it now handles
        tc.cosine_similarity(np.array([[1e30, 1e30], [1, 0]], np.float32))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"quantize": "int4"}, ValueError, r"^quantize: expected one of 'int8', got 'int4'$"),
    ({"quantize": 8}, TypeError, r"^quantize: expected a str, one of 'int8'; got int"),
    ({"quantize": "int8", "dtype": np.float64},
     ValueError, r"^quantize, dtype: quantize='int8' computes in float32, expected dtype=np.float32, got float64$"),
    ({"dtype": np.int32}, TypeError, r"^dtype: expected float32 or float64, got int32$"),
])
def test_from_pretrained_checks_quantize_and_dtype_before_loading(tiny_model_dir, monkeypatch, kwargs, error, match):
    """quantize and its dtype are refused naming them, before any weight is read (the loader is
    never called); a good setting then loads once and gives quantize() of the float32 encoder."""
    import transformer_core.sentence_encoder as se

    calls = []
    real = se.BertModel.from_pretrained

    def spy(*args, **kw):
        calls.append(args)
        return real(*args, **kw)

    monkeypatch.setattr(se.BertModel, "from_pretrained", spy)
    with pytest.raises(error, match=match):
        tc.SentenceEncoder.from_pretrained(str(tiny_model_dir), **kwargs)
    assert calls == []
    int8 = tc.SentenceEncoder.from_pretrained(str(tiny_model_dir), quantize="int8")
    assert len(calls) == 1
    ref = tc.quantize(real(str(tiny_model_dir)), "int8", inplace=True)
    texts = SENTENCES[:5]
    # tiny_model_dir has no modules.json: mean pooling, not normalised (sentence-transformers' default)
    expected = tc.SentenceEncoder(ref, int8.tokenizer, normalize=False).encode(texts)
    np.testing.assert_array_equal(int8.encode(texts), expected)


def test_pooling_and_prompts_of_an_unknown_users_folder_are_file_not_found():
    """``read_pooling`` / ``read_prompts`` of ``~nosuchuser/m`` raised pathlib's RuntimeError; now
    FileNotFoundError naming ``model_dir``, as from_pretrained's lookups."""
    from transformer_core.sentence_encoder import read_pooling, read_prompts

    for read in (read_pooling, read_prompts):
        with pytest.raises(FileNotFoundError, match=r"^model_dir: cannot expand the home directory of '~no_such"):
            read("~no_such_user_tc_39/m")


def test_pooling_and_prompts_refuse_what_is_not_a_model_folder(tmp_path, model_dir):
    """``read_pooling`` / ``read_prompts`` of a missing folder or of a file gave the defaults (mean
    pooling, no prompts) as if it were a plain BERT folder, and of 5 or None a TypeError naming
    nothing; now they refuse them as :func:`transformer_folder` does, naming ``model_dir``."""
    from transformer_core.sentence_encoder import read_pooling, read_prompts, transformer_folder

    afile = tmp_path / "config.json"
    afile.write_text("{}")
    for read in (read_pooling, read_prompts, transformer_folder):
        with pytest.raises(NotADirectoryError, match=r"^model_dir: expected a model folder, got "
                                                     r"'.*missing' \(no such folder\)$"):
            read(tmp_path / "missing")
        with pytest.raises(NotADirectoryError, match=r"^model_dir: expected a model folder, got "
                                                     r"'.*config\.json' \(not a folder\)$"):
            read(str(afile))
        for bad, kind in ((5, "int"), (None, "NoneType"), (b"x", "bytes")):
            with pytest.raises(TypeError, match=rf"^model_dir: expected a str or os.PathLike, got {kind}$"):
                read(bad)
    # a real folder still reads (all-MiniLM-L6-v2: mean pooling + Normalize, no prompts)
    assert read_pooling(model_dir) == {"pooling": "mean", "normalize": True}
    assert read_prompts(model_dir) == {"prompts": {}, "default_prompt_name": None, "include_prompt": True}


# ----------------------------------------------------------- settings assigned after construction
def _fresh_encoder(encoder):
    """An encoder of its own (its own Tokenizer; the model shared, never changed) for tests that
    assign its settings: the module's ``encoder`` fixture stays as loaded."""
    return tc.SentenceEncoder(encoder.model, tc.Tokenizer.from_pretrained(MODEL_NAME))


def _hf_mean_truncated(hf_bert, model_dir, texts, max_length, normalize=True):
    """transformers' BertModel + sentence-transformers' mean pooling, the texts truncated to
    ``max_length`` tokens by the tokenizers package (sentence-transformers' max_seq_length)."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    backend.no_padding()
    backend.enable_truncation(max_length=max_length)
    ids, am, tt = hf_encode(backend, texts)
    assert ids.shape[1] == max_length  # the long text really is cut there
    return hf_mean_pool(hf_bert, ids, am, tt, normalize=normalize)


def test_max_seq_length_assigned_later_truncates_as_sentence_transformers(encoder, hf_bert, model_dir):
    """sentence-transformers' ``model.max_seq_length = 512`` truncates later encodes at 512. Here
    the tokenizer's max_length was a plain attribute read once: assigning it (there was no
    max_seq_length) left the truncation at 256 (a difference of 0.074 from the 512-token result)."""
    enc = _fresh_encoder(encoder)
    texts = [" ".join(f"word{i}" for i in range(600)), "short one", SENTENCES[4]]
    assert enc.max_seq_length == 256  # sentence_bert_config.json's
    np.testing.assert_allclose(enc.encode(texts), _hf_mean_truncated(hf_bert, model_dir, texts, 256), atol=1e-5)
    enc.max_seq_length = 512
    assert enc.max_seq_length == 512 and enc.tokenizer.max_length == 512
    ref512 = _hf_mean_truncated(hf_bert, model_dir, texts, 512)
    assert np.abs(ref512[0] - _hf_mean_truncated(hf_bert, model_dir, texts, 256)[0]).max() > 0.01
    np.testing.assert_allclose(enc.encode(texts, batch_size=2), ref512, atol=1e-5)
    enc.tokenizer.max_length = 64  # the tokenizer's own property: the same setting
    assert enc.max_seq_length == 64
    np.testing.assert_allclose(enc.encode(texts), _hf_mean_truncated(hf_bert, model_dir, texts, 64), atol=1e-5)


def test_max_seq_length_is_checked_against_the_model(encoder):
    """max_seq_length above the model's 512 positions is refused naming it, and leaves the setting
    as it was; a tokenizer whose max_length was raised past them directly (the tokenizer does not
    know the model) is refused by encode, before any forward pass."""
    enc = _fresh_encoder(encoder)
    with pytest.raises(ValueError, match=r"^max_seq_length: expected at most 512 \(the model's "
                                         r"max_position_embeddings\), got 513$"):
        enc.max_seq_length = 513
    with pytest.raises(TypeError, match=r"^max_seq_length: expected an int, got float 512.0$"):
        enc.max_seq_length = 512.0
    with pytest.raises(TypeError, match=r"^max_seq_length: expected an int, got NoneType"):
        enc.max_seq_length = None
    with pytest.raises(ValueError, match=r"^max_seq_length: expected at least 2 \(the special tokens the tokenizer "
                                         r"adds to every text\), got 1$"):  # [CLS] and [SEP]
        enc.max_seq_length = 1
    assert enc.max_seq_length == 256
    enc.tokenizer.max_length = 600
    with pytest.raises(ValueError, match=r"^tokenizer: expected an encoder tokenizer truncating to at most 512 "
                                         r"tokens .*got max_length=600$"):
        enc.encode(["hello"])


def test_pooling_and_normalize_assigned_later_are_checked(encoder, hf_bert, hf_tokenizer, reference_embeddings):
    """``enc.pooling = "CLS"`` silently gave mean pooling and ``enc.normalize = "no"`` still
    normalised: both are checked as the constructor checks them; valid assignments take effect."""
    enc = _fresh_encoder(encoder)
    with pytest.raises(ValueError, match=r"^pooling: expected one of 'mean', 'cls', 'max', got 'CLS'$"):
        enc.pooling = "CLS"
    with pytest.raises(TypeError, match=r"^pooling: expected a str"):
        enc.pooling = None
    with pytest.raises(TypeError, match=r"^normalize: expected a bool, got str 'no'$"):
        enc.normalize = "no"
    with pytest.raises(TypeError, match=r"^normalize: expected a bool, got int 0$"):
        enc.normalize = 0
    with pytest.raises(ValueError, match=r"^pooling: expected one of 'mean', 'cls', 'max', got 'CLS'$"):
        tc.SentenceEncoder(encoder.model, enc.tokenizer, pooling="CLS")
    assert (enc.pooling, enc.normalize) == ("mean", True)
    texts = SENTENCES[:6]
    enc.normalize = False
    np.testing.assert_allclose(enc.encode(texts), reference_embeddings[1][:6], atol=1e-4)
    enc.pooling = "cls"
    np.testing.assert_allclose(enc.encode(texts), _hf_pool(hf_bert, hf_tokenizer, texts, "cls", False), atol=1e-5)
    enc.pooling, enc.normalize = "max", True
    np.testing.assert_allclose(enc.encode(texts), _hf_pool(hf_bert, hf_tokenizer, texts, "max", True), atol=1e-5)


def test_prompt_settings_and_tokenizer_assigned_later_are_checked(tmp_path, model_dir, hf_bert, hf_tokenizer,
                                                                  encoder):
    """``enc.include_prompt = "no"`` was read as true, ``enc.default_prompt_name = "query"`` (no
    such prompt) raised KeyError at the next encode, ``enc.prompts = {"q": 5}`` a TypeError about
    ``+`` there and ``enc.tokenizer = "x"`` an AttributeError: each is refused when assigned,
    naming the attribute, and leaves the setting as it was; valid assignments take effect."""
    d = _prompt_folder(tmp_path, model_dir, "p", {"prompts": {"query": "query: ", "doc": ""},
                                                   "default_prompt_name": "query"})
    enc = tc.SentenceEncoder.from_pretrained(d)
    texts = ["What is the capital of France?", SENTENCES[4]]
    prompted = _hf_prompted(hf_bert, hf_tokenizer, texts, "query: ")
    prompt_left_out = _hf_prompted(hf_bert, hf_tokenizer, texts, "query: ", skip=len(hf_tokenizer.encode("query: ").ids) - 1)
    assert np.abs(prompted - prompt_left_out).max() > 0.01
    np.testing.assert_allclose(enc.encode(texts), prompted, atol=1e-5)

    for value, shown in (("no", "str 'no'"), (0, "int 0"), (None, "NoneType")):
        with pytest.raises(TypeError, match=rf"^include_prompt: expected a bool, got {shown}"):
            enc.include_prompt = value
    assert enc.include_prompt is True
    enc.include_prompt = False
    np.testing.assert_allclose(enc.encode(texts), prompt_left_out, atol=1e-5)
    enc.include_prompt = True

    with pytest.raises(ValueError, match=r"^default_prompt_name: expected None or one of the prompts' names "
                                         r"\['query', 'doc'\], got 'passage'$"):
        enc.default_prompt_name = "passage"
    with pytest.raises(TypeError, match=r"^default_prompt_name: expected None or a str, got int$"):
        enc.default_prompt_name = 1
    assert enc.default_prompt_name == "query"
    enc.default_prompt_name = "doc"  # the empty prompt: the text alone, [CLS] pooled (include_prompt true)
    np.testing.assert_allclose(enc.encode(texts), _hf_prompted(hf_bert, hf_tokenizer, texts, ""), atol=1e-5)
    enc.default_prompt_name = "query"

    with pytest.raises(TypeError, match=r"^prompts: expected None or a dict of prompt name \(str\) -> prompt "
                                         r"\(str\), got \{'query': 5\}$"):
        enc.prompts = {"query": 5}
    with pytest.raises(TypeError, match=r"^prompts: expected None or a dict .*got \['query: '\]$"):
        enc.prompts = ["query: "]
    with pytest.raises(ValueError, match=r"^prompts\['query'\]: .*lone surrogate"):
        enc.prompts = {"query": "q\udce9: "}
    with pytest.raises(ValueError, match=r"^prompts: expected prompts that include the default_prompt_name "
                                         r"'query', got the names \['passage'\]; assign default_prompt_name = "
                                         r"None first$"):
        enc.prompts = {"passage": "passage: "}
    with pytest.raises(TypeError, match="does not support item assignment"):
        enc.prompts["query"] = 5  # a read-only view: only a checked assignment changes the prompts
    assert enc.prompts == {"query": "query: ", "doc": ""} and enc.default_prompt_name == "query"
    enc.prompts = {**enc.prompts, "query": "search_query: "}
    np.testing.assert_allclose(enc.encode(texts), _hf_prompted(hf_bert, hf_tokenizer, texts, "search_query: "),
                               atol=1e-5)
    enc.default_prompt_name = None
    enc.prompts = None
    assert enc.prompts == {}
    np.testing.assert_allclose(enc.encode(texts), _hf_prompted(hf_bert, hf_tokenizer, texts, ""), atol=1e-5)

    before = enc.tokenizer
    with pytest.raises(TypeError, match=r"^tokenizer: expected a transformer_core.Tokenizer, got str$"):
        enc.tokenizer = "x"
    with pytest.raises(ValueError, match=r"^tokenizer: expected an encoder tokenizer truncating to at most 512 "
                                         r"tokens .*got max_length=None$"):
        enc.tokenizer = tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct")  # a causal-LM tokenizer
    with pytest.raises(TypeError, match=r"^model: expected a transformer_core.BertModel, got str$"):
        enc.model = "x"
    assert enc.tokenizer is before
    short = tc.Tokenizer.from_pretrained(MODEL_NAME, max_length=8)
    enc.tokenizer = short
    assert enc.tokenizer is short and enc.max_seq_length == 8
    enc.model = encoder.model
    assert enc.model is encoder.model


_POOLING_FLAGS = {"mean": "pooling_mode_mean_tokens", "max": "pooling_mode_max_tokens", "cls": "pooling_mode_cls_token"}


@pytest.mark.parametrize("pooling", ["mean", "max", "cls"])
def test_an_empty_prompt_is_no_prompt(tmp_path, model_dir, hf_bert, hf_tokenizer, pooling):
    """sentence-transformers 6 (``if prompt:``) gives an empty prompt no prompt_length: with
    include_prompt false every real token is pooled, [CLS] included, as with no prompt at all. Here
    an empty prompt (given, named or the default) left [CLS] out of the mean and max pooling, as
    sentence-transformers 2.x-4.x did (``prompt is not None``): 0.25 off unnormalised."""
    assert len(hf_tokenizer.encode("").ids) - 1 == 1
    texts = ["What is the capital of France?", "ok", "", SENTENCES[5]]
    plain = _hf_prompted(hf_bert, hf_tokenizer, texts, "", pooling, skip=0)
    if pooling != "cls":  # the old result was really another one
        assert np.abs(plain - _hf_prompted(hf_bert, hf_tokenizer, texts, "", pooling, skip=1)).max() > 0.01
    d = _prompt_folder(tmp_path, model_dir, "e", {"prompts": {"empty": "", "q": "query: "},
                                                   "default_prompt_name": "empty"}, _POOLING_FLAGS[pooling],
                       include_prompt=False)
    enc = tc.SentenceEncoder.from_pretrained(d)
    assert (enc.pooling, enc.include_prompt) == (pooling, False)
    np.testing.assert_allclose(enc.encode(texts, batch_size=3), plain, atol=1e-5)  # the default ""
    np.testing.assert_allclose(enc.encode(texts, prompt=""), plain, atol=1e-5)
    np.testing.assert_allclose(enc.encode(texts, prompt_name="empty"), plain, atol=1e-5)
    enc.default_prompt_name = None  # no prompt at all: the same
    np.testing.assert_allclose(enc.encode(texts), plain, atol=1e-5)
    # a real prompt is still left out of the pooling
    skip = len(hf_tokenizer.encode("query: ").ids) - 1
    np.testing.assert_allclose(enc.encode(texts, prompt_name="q"),
                               _hf_prompted(hf_bert, hf_tokenizer, texts, "query: ", pooling, skip), atol=1e-5)


@pytest.mark.parametrize("pooling", ["pooling_mode_max_tokens", "pooling_mode_mean_tokens"])
def test_a_row_the_prompt_fills_pools_to_zeros(tmp_path, model_dir, hf_bert, hf_tokenizer, pooling):
    """With include_prompt false, a prompt whose last piece merges with the text ("hel" + "lo" ->
    [CLS] hello [SEP], prompt_length 3) leaves nothing to pool. Max pooling gave -1e9 in every
    feature (normalized: the constant vector -1/sqrt(H), cosine 1 with any other such row;
    sentence-transformers gives -inf, then NaN): zeros now, as mean pooling gives. The other rows
    are transformers' model max- or mean-pooled."""
    d = _prompt_folder(tmp_path, model_dir, "f", {"prompts": {}, "default_prompt_name": None}, pooling,
                       include_prompt=False)
    enc = tc.SentenceEncoder.from_pretrained(d)
    skip = len(hf_tokenizer.encode("hel").ids) - 1
    assert skip == 3 == len(hf_tokenizer.encode("hello").ids)  # the prompt's positions fill the row
    texts = ["lo", "lo and behold, a longer text"]
    for normalize in (True, False):
        got = enc.encode(texts, prompt="hel", normalize_embeddings=normalize)
        np.testing.assert_array_equal(got[0], np.zeros(enc.dim, np.float32))
        assert np.isfinite(got).all()
    mode = "max" if "max" in pooling else "mean"
    np.testing.assert_allclose(enc.encode(texts, prompt="hel")[1],
                               _hf_prompted(hf_bert, hf_tokenizer, texts, "hel", mode, skip)[1], atol=1e-5)


def test_cls_pooling_without_the_prompt_takes_the_first_token_after_it(tmp_path, model_dir, hf_bert, hf_tokenizer):
    """sentence-transformers 6's Pooling takes, for "cls" with include_prompt false, the first
    position of the mask the prompt was removed from: the first text token (position
    prompt_length; [SEP] for an empty text, and when truncation leaves only the prompt). Here it
    took [CLS] (cosine 0.31 to sentence-transformers' vector). With include_prompt true, or no
    prompt, it is [CLS]."""
    from tokenizers import Tokenizer as HFTokenizer

    prompt = "Represent this question: "
    d = _prompt_folder(tmp_path, model_dir, "c", {"prompts": {"q": prompt}, "default_prompt_name": "q"},
                       "pooling_mode_cls_token", include_prompt=False)
    enc = tc.SentenceEncoder.from_pretrained(d)
    texts = ["What is the capital of France?", "ok", "", SENTENCES[5]]
    skip = len(hf_tokenizer.encode(prompt).ids) - 1
    assert skip > 1
    ref = _hf_prompted(hf_bert, hf_tokenizer, texts, prompt, "cls", skip)
    cls_vector = _hf_prompted(hf_bert, hf_tokenizer, texts, prompt, "cls", 0)
    assert np.abs(ref - cls_vector).max() > 0.1
    np.testing.assert_allclose(enc.encode(texts, batch_size=3), ref, atol=1e-5)
    np.testing.assert_allclose(enc.encode("ok"), ref[1], atol=1e-5)
    enc.include_prompt = True
    np.testing.assert_allclose(enc.encode(texts, batch_size=3), cls_vector, atol=1e-5)
    np.testing.assert_allclose(enc.encode(texts, prompt="", batch_size=3),
                               _hf_prompted(hf_bert, hf_tokenizer, texts, "", "cls", 0), atol=1e-5)
    # truncated to 6 tokens, a longer prompt fills the row up to [SEP]: its prompt_length is that of
    # the truncated prompt (5, as sentence-transformers measures it), and position 5 is [SEP]
    enc.include_prompt = False
    enc.max_seq_length = 6
    long_prompt = "Represent this question for retrieval: "
    short = HFTokenizer.from_str(hf_tokenizer.to_str())
    short.enable_truncation(max_length=6)
    skip6 = len(short.encode(long_prompt).ids) - 1
    assert skip6 == 5 < len(hf_tokenizer.encode(long_prompt).ids) - 1
    assert all(short.encode(long_prompt + t).ids == short.encode(long_prompt).ids for t in texts)
    np.testing.assert_allclose(enc.encode(texts, prompt=long_prompt),
                               _hf_prompted(hf_bert, short, texts, long_prompt, "cls", skip6), atol=1e-5)


def _write_pooling_config(d, config):
    """Replaces ``d``'s 1_Pooling/config.json (a file of its own in _st_folder's copies)."""
    import json

    (d / "1_Pooling" / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("config, pooling", [
    ({"embedding_dimension": 384, "pooling_mode": "max", "include_prompt": True}, "max"),  # 6.x's own format
    ({"embedding_dimension": 384, "pooling_mode": ["cls"]}, "cls"),
    ({"word_embedding_dimension": 384, "pooling_mode": "mean"}, "mean"),
    # pooling_mode first: sentence-transformers 6 drops the legacy flags when it is there
    ({"word_embedding_dimension": 384, "pooling_mode": "max", "pooling_mode_mean_tokens": True}, "max"),
    ({"pooling_mode": "cls", "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
      "pooling_mode_max_tokens": True}, "cls"),
])
def test_pooling_mode_key_is_read_first(tmp_path, model_dir, hf_bert, hf_tokenizer, config, pooling):
    """The pooling config's ``pooling_mode`` (what sentence-transformers 6 writes and reads) was
    ignored: with legacy flags beside it they decided (mean where 6.x pools max: 0.21 off), without
    them the folder was refused as having no mode."""
    from transformer_core.sentence_encoder import read_pooling

    d = _st_folder(tmp_path, model_dir, "m", ["pooling_mode_mean_tokens"], normalize=False)
    _write_pooling_config(d, config)
    assert read_pooling(d) == {"pooling": pooling, "normalize": False}
    enc = tc.SentenceEncoder.from_pretrained(d)
    assert enc.pooling == pooling
    sentences = SENTENCES[:5] + ["ok"]
    np.testing.assert_allclose(enc.encode(sentences, batch_size=4),
                               _hf_pool(hf_bert, hf_tokenizer, sentences, pooling, False), atol=1e-4)


@pytest.mark.parametrize("mode", ["lasttoken", "mean_sqrt_len_tokens", "MEAN", ["cls", "mean"], [], None, 3,
                                  {"mean": True}])
def test_pooling_mode_not_computed_is_refused_naming_the_key(tmp_path, model_dir, mode):
    """Another mode, several at once, or a value of another type: refused naming the file and
    ``pooling_mode`` (legacy flags beside it do not rescue it)."""
    from transformer_core.sentence_encoder import read_pooling

    d = _st_folder(tmp_path, model_dir, "m", ["pooling_mode_mean_tokens"])
    _write_pooling_config(d, {"embedding_dimension": 384, "pooling_mode": mode, "pooling_mode_mean_tokens": True})
    match = r"1_Pooling/config.json: pooling_mode: expected 'mean', 'cls' or 'max' \(or a list of one of them\)"
    with pytest.raises(ValueError, match=match):
        read_pooling(d)
    with pytest.raises(ValueError, match=match):
        tc.SentenceEncoder.from_pretrained(d)


_ST6_TYPES = {"Transformer": "sentence_transformers.base.modules.transformer.Transformer",
              "Pooling": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
              "Normalize": "sentence_transformers.base.modules.normalize.Normalize"}


def _st6_folder(tmp_path, model_dir, name, pooling_mode="mean", normalize=True, types=None):
    """all-MiniLM-L6-v2 laid out as sentence-transformers 6.2's ``save`` writes it (weights and
    vocabulary linked): modules.json with 6.x's class paths (``types`` overrides them), the pooling
    config in the new format, 2_Normalize/config.json, sentence_bert_config.json without
    max_seq_length (which moves to tokenizer_config.json's model_max_length, here 128), and the
    empty query/document prompts 6.x gives every model."""
    import json
    import os

    types = {**_ST6_TYPES, **(types or {})}
    d = tmp_path / name
    d.mkdir()
    for f in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "special_tokens_map.json"):
        os.symlink(model_dir / f, d / f)
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**tok_config, "model_max_length": 128}))
    (d / "sentence_bert_config.json").write_text(json.dumps({
        "transformer_task": "feature-extraction",
        "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
        "module_output_name": "token_embeddings"}))
    (d / "config_sentence_transformers.json").write_text(json.dumps({
        "__version__": {"sentence_transformers": "6.2.0"}, "default_prompt_name": None,
        "model_type": "SentenceTransformer", "prompts": {"document": "", "query": ""}, "similarity_fn_name": "cosine"}))
    (d / "1_Pooling").mkdir()
    _write_pooling_config(d, {"embedding_dimension": 384, "pooling_mode": pooling_mode, "include_prompt": True})
    modules = [{"idx": 0, "name": "0", "path": "", "type": types["Transformer"]},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": types["Pooling"]}]
    if normalize:
        (d / "2_Normalize").mkdir()
        (d / "2_Normalize" / "config.json").write_text(json.dumps({"module_input_name": "sentence_embedding",
                                                                    "module_output_name": "sentence_embedding"}))
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": types["Normalize"]})
    (d / "modules.json").write_text(json.dumps(modules, indent=2))
    return d


@pytest.mark.parametrize("pooling, normalize", [("mean", True), ("cls", False), ("max", True)])
def test_a_folder_saved_by_sentence_transformers_6_loads(tmp_path, model_dir, hf_bert, pooling, normalize):
    """sentence-transformers 6 writes its modules' new class paths into modules.json
    (``sentence_transformers.base.modules.transformer.Transformer``, ...): such a folder was
    refused. It loads now, with its pooling, Normalize module, max_seq_length (tokenizer_config's
    model_max_length) and empty prompts, and embeds as transformers' BertModel pooled so."""
    import torch
    from tokenizers import Tokenizer as HFTokenizer
    from transformer_core.sentence_encoder import read_pooling

    d = _st6_folder(tmp_path, model_dir, "st6", pooling, normalize)
    assert read_pooling(d) == {"pooling": pooling, "normalize": normalize}
    enc = tc.SentenceEncoder.from_pretrained(d)
    assert (enc.pooling, enc.normalize, enc.max_seq_length) == (pooling, normalize, 128)
    assert enc.prompts == {"document": "", "query": ""} and enc.default_prompt_name is None
    texts = SENTENCES[:4] + [" ".join(f"word{i}" for i in range(300))]  # the last one truncated at 128
    ref_tok = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
    ref_tok.no_padding()
    ref_tok.enable_truncation(max_length=128)
    ids, am, tt = hf_encode(ref_tok, texts)
    assert ids.shape[1] == 128
    with torch.no_grad():
        h = hf_bert(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(am),
                    token_type_ids=torch.from_numpy(tt)).last_hidden_state.double().numpy()
    m = am[..., None] > 0
    ref = {"mean": lambda: (h * m).sum(1) / m.sum(1), "cls": lambda: h[:, 0],
           "max": lambda: np.where(m, h, -1e9).max(1)}[pooling]()
    if normalize:
        ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    np.testing.assert_allclose(enc.encode(texts, batch_size=2), ref, atol=1e-4)
    np.testing.assert_allclose(enc.encode(texts, prompt_name="query"), ref, atol=1e-4)  # the empty prompt


@pytest.mark.parametrize("types", [
    {"Pooling": "sentence_transformers.sentence_transformer.modules.Pooling"},  # the package's own export
    {"Transformer": "sentence_transformers.models.Transformer"},  # the two spellings mixed
    {"Normalize": "sentence_transformers.models.Normalize", "Pooling": "sentence_transformers.models.Pooling"},
])
def test_module_class_paths_of_either_version_are_accepted(tmp_path, model_dir, encoder, types):
    d = _st6_folder(tmp_path, model_dir, "st6", types=types)
    enc = tc.SentenceEncoder.from_pretrained(d)
    assert (enc.pooling, enc.normalize) == ("mean", True)
    np.testing.assert_allclose(enc.encode(SENTENCES[:4]), encoder.encode(SENTENCES[:4]), atol=1e-6)


@pytest.mark.parametrize("kind, types", [
    ("Pooling", {"Pooling": "sentence_transformers.base.modules.dense.Dense"}),
    ("Pooling", {"Pooling": "sentence_transformers.Pooling"}),
    ("Pooling", {"Pooling": "my_models.modules.pooling.Pooling"}),
    ("Pooling", {"Pooling": "sentence_transformers.models.pooling.Pooling"}),
    ("Pooling", {"Pooling": "sentence_transformers.modules.Pooling"}),
    ("Transformer", {"Transformer": "sentence_transformers.base.modules.transformer.Transformers"}),
    ("Normalize", {"Normalize": "sentence_transformers.sentence_transformer.modules.layer_norm.LayerNorm"}),
])
def test_other_module_class_paths_are_still_refused(tmp_path, model_dir, kind, types):
    from transformer_core.sentence_encoder import read_pooling

    d = _st6_folder(tmp_path, model_dir, "st6", types=types)
    i = {"Transformer": 0, "Pooling": 1, "Normalize": 2}[kind]
    match = rf"modules.json: module {i} has type '{types[kind]}'; SentenceEncoder supports only"
    with pytest.raises(ValueError, match=match):
        read_pooling(d)
    with pytest.raises(ValueError, match=match):
        tc.SentenceEncoder.from_pretrained(d)


def test_a_folder_without_modules_json_is_mean_pooled_and_not_normalised(tmp_path, model_dir, hf_bert,
                                                                        hf_tokenizer, reference_embeddings):
    """sentence-transformers loads a plain Hugging Face folder (no modules.json) as Transformer +
    mean Pooling, with no Normalize module: embeddings of norm ~5.7 for all-MiniLM-L6-v2's weights.
    Here they were L2-normalised (1.09 off)."""
    import os

    from transformer_core.sentence_encoder import read_pooling

    d = tmp_path / "plain"
    d.mkdir()
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
              "special_tokens_map.json"):
        os.symlink(model_dir / f, d / f)
    assert read_pooling(d) == {"pooling": "mean", "normalize": False}
    enc = tc.SentenceEncoder.from_pretrained(d)
    assert (enc.pooling, enc.normalize) == ("mean", False)
    ref_norm, ref_raw = reference_embeddings
    got = enc.encode(SENTENCES, batch_size=8)
    assert np.linalg.norm(got, axis=1).min() > 2
    np.testing.assert_allclose(got, ref_raw, atol=1e-4)
    np.testing.assert_allclose(enc.encode(SENTENCES, normalize=True), ref_norm, atol=1e-5)
    np.testing.assert_allclose(enc.encode(SENTENCES, normalize_embeddings=True), ref_norm, atol=1e-5)


def test_one_text_gives_one_vector(encoder, reference_embeddings):
    """encode("text") returned (1, H); sentence-transformers returns the vector itself, (H,), so
    ``encode(query) @ encode(docs).T`` is (N,) in both. A list (or tuple) of one text stays (1, H)."""
    ref, _ = reference_embeddings
    one = encoder.encode(SENTENCES[3])
    assert one.shape == (384,) and one.dtype == np.float32
    np.testing.assert_allclose(one, ref[3], atol=1e-5)
    np.testing.assert_array_equal(one, encoder.encode([SENTENCES[3]])[0])
    np.testing.assert_array_equal(encoder.encode(np.str_(SENTENCES[3])), one)
    assert encoder.encode([SENTENCES[3]]).shape == encoder.encode((SENTENCES[3],)).shape == (1, 384)
    scores = encoder.encode(SENTENCES[3]) @ encoder.encode(SENTENCES[:5]).T
    assert scores.shape == (5,)
    np.testing.assert_allclose(scores, ref[:5] @ ref[3], atol=1e-5)
    assert encoder.encode("").shape == (384,)


def test_no_progress_bar_unless_asked(encoder, capsys):
    """progress / show_progress_bar None (the default) showed a bar past 4 batches, where
    sentence-transformers shows none (unless its logger is at INFO): now a bar only for True."""
    texts = SENTENCES[:6]
    capsys.readouterr()
    encoder.encode(texts, batch_size=1)  # 6 batches
    encoder.encode(texts, batch_size=1, progress=None, show_progress_bar=None)
    assert "encode" not in capsys.readouterr().err
    encoder.encode(texts, batch_size=1, progress=True)
    assert "encode" in capsys.readouterr().err
    encoder.encode(texts, batch_size=1, show_progress_bar=True)
    assert "encode" in capsys.readouterr().err


def test_options_after_sentences_are_keyword_only(encoder):
    """sentence-transformers' second positional parameter is prompt_name, this method's was
    batch_size: ``encode(texts, 4)`` and ``encode(texts, "query")`` meant different things in the two.
    Both are Python's TypeError now; by keyword they work."""
    with pytest.raises(TypeError, match=r"takes 2 positional arguments but 3 were given"):
        encoder.encode(["a", "b"], 4)
    with pytest.raises(TypeError, match=r"takes 2 positional arguments but 3 were given"):
        encoder.encode(["a", "b"], "query")
    with pytest.raises(TypeError, match=r"takes 2 positional arguments but 5 were given"):
        encoder.encode(["a", "b"], 4, True, False)
    np.testing.assert_array_equal(encoder.encode(["a", "b"], batch_size=1), encoder.encode(sentences=["a", "b"]))


def test_sentence_transformers_argument_names(encoder, reference_embeddings, capsys):
    """encode takes sentence-transformers' normalize_embeddings and show_progress_bar too. With
    sentence-transformers' meaning: normalize_embeddings=False does not undo a folder's Normalize
    module (all-MiniLM-L6-v2 stays normalised), True normalises. Both names of one option may be
    given only when they agree."""
    ref_norm, ref_raw = reference_embeddings
    texts = SENTENCES[:6]
    raw = _fresh_encoder(encoder)
    raw.normalize = False
    np.testing.assert_allclose(encoder.encode(texts, normalize_embeddings=False), ref_norm[:6], atol=1e-4)
    np.testing.assert_allclose(encoder.encode(texts, normalize_embeddings=True), ref_norm[:6], atol=1e-4)
    np.testing.assert_allclose(raw.encode(texts, normalize_embeddings=False), ref_raw[:6], atol=1e-4)
    np.testing.assert_allclose(raw.encode(texts, normalize_embeddings=True), ref_norm[:6], atol=1e-4)
    np.testing.assert_allclose(raw.encode(texts, normalize=True, normalize_embeddings=True), ref_norm[:6], atol=1e-4)
    np.testing.assert_allclose(encoder.encode(texts, normalize=True, normalize_embeddings=False), ref_norm[:6],
                               atol=1e-4)
    with pytest.raises(TypeError, match=r"^normalize, normalize_embeddings: .*got normalize=False and "
                                        r"normalize_embeddings=True"):
        encoder.encode(texts, normalize=False, normalize_embeddings=True)
    with pytest.raises(TypeError, match=r"^normalize, normalize_embeddings: .*got normalize=True and "
                                        r"normalize_embeddings=False \(which means normalize=False"):
        raw.encode(texts, normalize=True, normalize_embeddings=False)
    with pytest.raises(TypeError, match=r"^normalize_embeddings: expected a bool, got str 'yes'$"):
        encoder.encode(texts, normalize_embeddings="yes")
    capsys.readouterr()
    encoder.encode(texts, batch_size=1, show_progress_bar=False)
    assert "encode" not in capsys.readouterr().err
    encoder.encode(texts, batch_size=32, show_progress_bar=True)  # 1 batch: a bar when asked
    assert "encode" in capsys.readouterr().err
    encoder.encode(texts, batch_size=32, progress=True, show_progress_bar=True)
    assert "encode" in capsys.readouterr().err
    with pytest.raises(TypeError, match=r"^progress, show_progress_bar: .*got progress=True and "
                                        r"show_progress_bar=False$"):
        encoder.encode(texts, progress=True, show_progress_bar=False)
    with pytest.raises(TypeError, match=r"^show_progress_bar: expected a bool, got int 1$"):
        encoder.encode(texts, show_progress_bar=1)


def test_int8_accuracy_figures_in_the_docstring_are_what_is_measured(encoder):
    """from_pretrained's docstring said texts of one to three words reach a cosine of 0.977 at
    worst; "Thanks" gives 0.967. The figures it states are measured here: the minimum over the
    benchmark's sentences, and "Thanks"'s."""
    from pathlib import Path

    doc = " ".join(tc.SentenceEncoder.from_pretrained.__doc__.split())
    int8 = tc.quantize(encoder)
    bench = [s.strip() for s in (Path(__file__).parents[1] / "bench" / "sentences.txt").read_text(
        encoding="utf-8").splitlines() if s.strip()]
    cos = np.sum(encoder.encode(bench) * int8.encode(bench), axis=1)
    assert len(bench) == 66 and "over the 66 sentences of ``bench/sentences.txt``" in doc
    assert abs(float(cos.min()) - 0.994) < 0.001 and "0.994 at least" in doc, cos.min()
    thanks = float(np.sum(encoder.encode("Thanks") * int8.encode("Thanks")))
    assert abs(thanks - 0.967) < 0.002, thanks
    assert 'minimum 0.967 (``"Thanks"``' in doc and "not bounds" in doc


# ------------------------------------------------------------------- long texts: a prefix tokenized
# Fragments of texts that BERT's tokenizer treats specially: whitespace of several kinds, runs of
# punctuation (each mark its own word), CJK characters (spaced out one by one), combining accents
# (stripped after NFD; some after a space), words longer than max_input_chars_per_word = 100 (one
# [UNK]), special tokens written in the text, characters whose lowercase is longer (U+0130) or
# depends on the context (a final sigma), control and zero-width characters, spacing accents
# whose NFKC form holds a space.
_LONG_TEXT_FRAGMENTS = [
    "word", "Hello", "the", " ", "  ", "\t", "\n", "\u00a0", "\u3000", "...", "!?", "\u2014", "()", "'", "-",
    "\u6f22\u5b57", "\u65e5\u672c\u8a9e", "\ud55c\uad6d\uc5b4", "e\u0301", "\u0301", " \u0301", "caf\u00e9",
    "\u00c5ngstr\u00f6m", "\u0308", "a" * 101, "x" * 150, "supercalifragilistic" * 6, "12345", "[MASK]",
    "[SEP]", "[UNK]", "\u03a3\u0391\u03a3", "\u03a3", "\u0130", "\U0001F600", "\x00", "\x7f", "\u200b", "\u00b4",
    "\u00a8", "##", "ab", "Z",
]


def _long_text_tokenizers(model_dir):
    """tc Tokenizers whose pipelines the shortcut accepts, with small max_length (so that texts of a
    few hundred characters are "long"): all-MiniLM-L6-v2's (BERT normalizer and pre-tokenizer,
    WordPiece), with and without do_lower_case, and one whose normalizer is a sequence (NFD,
    lowercase, accents stripped) and pre-tokenizer is Whitespace then single digits."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import normalizers, pre_tokenizers

    out = []
    for max_length in (4, 8, 16):
        for lower in (False, True):
            tok = tc.Tokenizer.from_pretrained(MODEL_NAME, max_length=max_length)
            tok.do_lower_case = lower
            out.append(tok)
    backend = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
    backend.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase(), normalizers.StripAccents()])
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(True)])
    out.append(tc.Tokenizer(backend, max_length=8))
    return out


def _reference_backend(tok):
    """A copy of a tc Tokenizer's backend by the tokenizers package itself, with its truncation and
    no padding: the reference, which tokenizes every text whole."""
    from tokenizers import Tokenizer as HFTokenizer

    backend = HFTokenizer.from_str(tok.backend.to_str())
    backend.no_padding()
    backend.enable_truncation(max_length=tok.max_length)
    return backend


def _random_long_texts(seed: int, count: int):
    """``count`` random texts of 40-300 of the fragments above, each its own mix of them."""
    import random

    rng = random.Random(seed)
    for _ in range(count):
        weights = [rng.random() ** 3 for _ in _LONG_TEXT_FRAGMENTS]
        yield "".join(rng.choices(_LONG_TEXT_FRAGMENTS, weights=weights, k=rng.randint(40, 300)))


def _cut_from(tok) -> int:
    """The length past which a text is given to ``tok``'s backend as a prefix, where it can be."""
    from transformer_core.tokenizer import _CUT_FROM_WINDOWS, _PREFIX_CHARS_PER_TOKEN

    return _CUT_FROM_WINDOWS * _PREFIX_CHARS_PER_TOKEN * tok.max_length


def _check_prefix(tok, reference, text, counts):
    """The text encode gives the tokenizer (a prefix, or the text itself) yields the ids, type ids
    and mask of the whole text by the reference backend."""
    from transformer_core.tokenizer import _texts_to_tokenize

    given = _texts_to_tokenize(tok, [text])[0]
    assert text.startswith(given)
    counts["cut" if len(given) < len(text) else "whole"] += 1
    got = tok.encode_batch([given])
    enc = reference.encode(text)  # do_lower_case's Lowercase() is in the copied backend's normalizer
    ids, type_ids, mask = enc.ids, enc.type_ids, enc.attention_mask
    assert got["input_ids"][0].tolist() == ids, (text, given)
    assert got["token_type_ids"][0].tolist() == type_ids and got["attention_mask"][0].tolist() == mask


def test_a_long_text_is_tokenized_from_a_prefix_with_the_same_ids_random(model_dir):
    """encode tokenized every text whole before truncating it (a 20 MB line cost gigabytes): a long
    text is now given as a prefix cut at a space when that provably keeps every kept token. Over
    random texts of the fragments above, each tokenizer's ids for the text given are the tokenizers
    package's for the whole text; most texts are cut, some (no space early enough, mostly
    whitespace) are given whole."""
    toks = _long_text_tokenizers(model_dir)
    references = [_reference_backend(tok) for tok in toks]
    counts = {"cut": 0, "whole": 0}
    for i, text in enumerate(_random_long_texts(20240601, 4000)):
        tok = toks[i % len(toks)]
        if len(text) > _cut_from(tok):
            _check_prefix(tok, references[i % len(toks)], text, counts)
    assert counts["cut"] > 1500 and counts["whole"] > 50, counts


def test_a_long_text_is_tokenized_from_a_prefix_with_the_same_ids_hypothesis(model_dir):
    """As above, texts searched by hypothesis (fragments and arbitrary short strings)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    toks = _long_text_tokenizers(model_dir)
    references = [_reference_backend(tok) for tok in toks]
    counts = {"cut": 0, "whole": 0}
    fragment = st.sampled_from(_LONG_TEXT_FRAGMENTS) | st.text(max_size=3)

    @settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(fragment, min_size=40, max_size=200).map("".join), st.sampled_from(range(len(toks))))
    def check(text, which):
        tok = toks[which]
        if len(text) > _cut_from(tok):
            _check_prefix(tok, references[which], text, counts)

    check()
    assert counts["cut"] > 50, counts


def _check_tokenizer_calls(tok, reference, text, add_special_tokens, counts):
    """Tokenizer.encode, tokenize and encode_batch of ``text`` (which give the backend the prefix of
    _texts_to_tokenize) agree with the reference backend's tokens of the whole text."""
    from transformer_core.tokenizer import _texts_to_tokenize

    cut = len(_texts_to_tokenize(tok, [text], add_special_tokens)[0]) < len(text)
    counts["cut" if cut else "whole"] += 1
    enc = reference.encode(text, add_special_tokens=add_special_tokens)
    assert tok.encode(text, add_special_tokens=add_special_tokens) == enc.ids, text
    assert tok.tokenize(text, add_special_tokens=add_special_tokens) == enc.tokens, text
    got = tok.encode_batch([text, "a short one"], add_special_tokens=add_special_tokens)
    short = reference.encode("a short one", add_special_tokens=add_special_tokens)
    width = max(len(enc.ids), len(short.ids))  # padded on the right to the longer row
    for row, e in enumerate((enc, short)):
        pad = width - len(e.ids)
        assert got["input_ids"][row].tolist() == e.ids + [tok.pad_token_id] * pad, text
        assert got["token_type_ids"][row].tolist() == e.type_ids + [0] * pad
        assert got["attention_mask"][row].tolist() == e.attention_mask + [0] * pad


def test_tokenizer_calls_give_a_long_texts_ids_from_its_prefix(model_dir):
    """Tokenizer.encode, tokenize and encode_batch cut a long text as SentenceEncoder.encode does
    (they tokenized it whole, then truncated it): over random texts of the fragments above (texts
    without a space early enough, unicode, combining marks, special tokens written out) and
    hypothesis' texts, with and without special tokens, their ids, tokens, type ids and masks are
    the tokenizers package's for the whole text."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    toks = _long_text_tokenizers(model_dir)
    references = [_reference_backend(tok) for tok in toks]
    counts = {"cut": 0, "whole": 0}
    for i, text in enumerate(_random_long_texts(20240602, 300)):
        _check_tokenizer_calls(toks[i % len(toks)], references[i % len(toks)], text, i % 3 != 0, counts)
    assert counts["cut"] > 90 and counts["whole"] > 10, counts

    fragment = st.sampled_from(_LONG_TEXT_FRAGMENTS) | st.text(max_size=3)

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(fragment, min_size=40, max_size=200).map("".join), st.sampled_from(range(len(toks))),
           st.booleans())
    def check(text, which, add_special_tokens):
        _check_tokenizer_calls(toks[which], references[which], text, add_special_tokens, counts)

    check()


def test_long_texts_embed_bitwise_as_when_tokenized_whole(tiny_model_dir, monkeypatch):
    """The embeddings of long texts (and short ones beside them in the batches) are bitwise those
    of tokenizing every text whole."""
    import random

    from transformer_core import sentence_encoder

    rng = random.Random(7)
    texts = ["".join(rng.choices(_LONG_TEXT_FRAGMENTS, k=rng.randint(100, 400))) for _ in range(40)]
    texts += ["a short one", "word " * 30, "x" * 5000, "a" + " b" * 3000]
    enc = tc.SentenceEncoder.from_pretrained(tiny_model_dir)
    enc.max_seq_length = 16
    given = []
    real = sentence_encoder._texts_to_tokenize
    monkeypatch.setattr(sentence_encoder, "_texts_to_tokenize", lambda tok, t: given.extend(real(tok, t)) or real(tok, t))
    fast = enc.encode(texts, batch_size=8)
    cut = sum(len(g) < len(t) for g, t in zip(given, sorted(texts, key=len, reverse=True)))
    assert cut > 30, cut
    monkeypatch.setattr(sentence_encoder, "_texts_to_tokenize", lambda tok, t: t)
    whole = enc.encode(texts, batch_size=8)
    assert np.array_equal(fast, whole)


def test_a_long_text_embeds_as_sentence_transformers(encoder, hf_bert, hf_tokenizer):
    """A text of 60,000 characters (given as a prefix): the reference tokenizes it whole, truncated
    to 256 tokens (sentence-transformers' max_seq_length), and pools transformers' BertModel."""
    text = " ".join(f"Sentence {i} says \u00c9t\u00e9 caf\u00e9, \u6f22\u5b57 and more." for i in range(1500))
    assert len(text) > 60_000
    from tokenizers import Tokenizer as HFTokenizer

    ref_tok = HFTokenizer.from_str(hf_tokenizer.to_str())
    ref_tok.enable_truncation(max_length=256)
    ids, am, tt = hf_encode(ref_tok, [text])
    assert ids.shape == (1, 256)
    ref = hf_mean_pool(hf_bert, ids, am, tt)
    np.testing.assert_allclose(encoder.encode([text])[0], ref[0], atol=2e-5)


def test_tokenizers_the_prefix_would_not_be_exact_for_get_the_whole_text(model_dir):
    """Pipelines outside what the shortcut is proven for are given every text whole: a pre-tokenizer
    written in Python (cannot be inspected), Metaspace (SentencePiece: the space is part of a
    token), a normalizer that replaces spaces, truncation that keeps the end, an added token
    holding a space (it could match across the cut)."""
    from tokenizers import AddedToken, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer
    from transformer_core.tokenizer import _splits_at_spaces, _texts_to_tokenize

    class Split:
        def pre_tokenize(self, pretok):
            pretok.split(lambda i, s: s.split(" ", "removed"))

    def fresh():
        backend = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
        backend.no_padding()
        return backend

    cases = {}
    b = fresh()
    b.pre_tokenizer = pre_tokenizers.PreTokenizer.custom(Split())
    cases["custom"] = tc.Tokenizer(b, max_length=8)
    b = fresh()
    b.pre_tokenizer = pre_tokenizers.Metaspace()
    cases["metaspace"] = tc.Tokenizer(b, max_length=8)
    b = fresh()
    b.normalizer = normalizers.Sequence([normalizers.Replace(" ", "_"), normalizers.Lowercase()])
    cases["replace"] = tc.Tokenizer(b, max_length=8)
    cases["left"] = tc.Tokenizer.from_pretrained(MODEL_NAME, max_length=8)
    cases["left"].backend.enable_truncation(max_length=8, direction="left")
    b = fresh()
    b.add_tokens([AddedToken("new york", normalized=False)])
    cases["spaced added token"] = tc.Tokenizer(b, max_length=8)
    text = "new york is a city " * 50
    for name, tok in cases.items():
        assert not _splits_at_spaces(tok), name
        texts = [text]
        assert _texts_to_tokenize(tok, texts) is texts, name
    assert _splits_at_spaces(tc.Tokenizer.from_pretrained(MODEL_NAME, max_length=8))
    assert _texts_to_tokenize(tc.Tokenizer.from_pretrained(MODEL_NAME, max_length=8), [text])[0] == text[:128]


def test_a_20_mb_line_is_encoded_in_bounded_memory(tiny_model_dir):
    """One huge line cost ~140 MB of memory per MB of text (the whole text tokenized, then all but
    max_seq_length tokens dropped): a 20 MB line needed ~2.8 GB. Its prefix is tokenized now: the
    peak grows by little more than the text itself, and the embedding is that of the text's start."""
    code = (
        "import resource, sys, numpy as np\n"
        "from transformer_core import SentenceEncoder\n"
        "enc = SentenceEncoder.from_pretrained(sys.argv[1])\n"
        "enc.encode(['warm up'])\n"
        "text = 'word ' * 4_000_000\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "e = enc.encode([text])\n"
        "grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024\n"
        "same = np.array_equal(e, enc.encode([text[:5000]]))\n"
        "print(grown, same, len(text))\n"
    )
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code, str(tiny_model_dir)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    grown, same, length = proc.stdout.split()
    assert int(grown) < 100 and same == "True" and length == "20000000", proc.stdout  # MB; whole: ~2,800


def test_an_isa_switched_during_encode_keeps_the_bits(encoder):
    """encode keeps each weight's packed panels for the whole call; they were keyed by the weight
    alone, so set_isa between two batches (from another thread, say) had the AVX2 kernels read
    the AVX-512 kernels' 32-column panels as their 16-column ones: embeddings with a cosine of
    about 0 to the right ones. The panels are keyed by the kernels that packed them now."""
    from transformer_core import quantization

    isas = set(quantization.supported_isas())
    if not {"avx2", "avx512vnni"} <= isas:
        pytest.skip("needs two kernel sets whose panels differ (AVX2 and AVX-512)")
    old = quantization.isa()
    texts = [f"the quick brown fox number {i} jumps over the lazy dog" for i in range(80)]
    try:
        quantization.set_isa("avx512vnni")
        expected = encoder.encode(texts, batch_size=40)
        batches = encoder.tokenizer.encode_batches

        def switching(*args, **kwargs):  # the ISA changes after the first batch, inside encode's scope
            for i, batch in enumerate(batches(*args, **kwargs)):
                if i == 1:
                    quantization.set_isa("avx2")
                yield batch

        encoder.tokenizer.encode_batches = switching
        try:
            got = encoder.encode(texts, batch_size=40)
        finally:
            del encoder.tokenizer.encode_batches
        assert quantization.isa() == "avx2"
    finally:
        quantization.set_isa(old)
    np.testing.assert_array_equal(got, expected)  # the two kernel sets give the same bits


def _setting_after_first_batch(enc, assign):
    """Runs ``assign()`` inside the next ``enc.encode``, once its first batch is embedded (a hook in
    the tokenizer's ``encode_batches``, as another thread's setter could run then)."""
    batches = enc.tokenizer.encode_batches

    def hooked(*args, **kwargs):
        for i, batch in enumerate(batches(*args, **kwargs)):
            if i == 1:
                assign()
            yield batch

    enc.tokenizer.encode_batches = hooked


def test_settings_assigned_during_encode_apply_from_the_next_call(encoder, hf_bert, hf_tokenizer,
                                                                  reference_embeddings, model_dir):
    """encode read ``pooling`` and ``model`` once per batch, and ``normalize``, the prompts and the
    tokenizer's max_length (max_seq_length) only after iterating ``sentences``: a setter run while
    it ran (another thread's, or the iterator's own) gave one result whose later rows were pooled,
    computed or truncated the new way, or pooled the old way and normalised the new way. The call
    running keeps the settings it started with; the next call has the new ones."""
    enc = _fresh_encoder(encoder)
    texts, n = SENTENCES[:6], 6
    expected = enc.encode(texts, batch_size=2)
    np.testing.assert_allclose(expected, reference_embeddings[0][:n], atol=1e-5)

    def assign():
        enc.pooling, enc.normalize, enc.include_prompt = "cls", False, False

    _setting_after_first_batch(enc, assign)
    try:
        got = enc.encode(texts, batch_size=2)
    finally:
        del enc.tokenizer.encode_batches
    assert (enc.pooling, enc.normalize, enc.include_prompt) == ("cls", False, False)
    np.testing.assert_array_equal(got, expected)  # every row mean-pooled and normalised
    np.testing.assert_allclose(enc.encode(texts, batch_size=2), _hf_pool(hf_bert, hf_tokenizer, texts, "cls", False),
                               atol=1e-5)

    # a model assigned meanwhile: a random BERT of the same shape, whose embeddings differ
    enc = _fresh_encoder(encoder)
    other = tc.BertModel(encoder.model.config)
    _setting_after_first_batch(enc, lambda: setattr(enc, "model", other))
    try:
        got = enc.encode(texts, batch_size=2)
    finally:
        del enc.tokenizer.encode_batches
    assert enc.model is other
    np.testing.assert_array_equal(got, expected)
    later = enc.encode(texts, batch_size=2)
    np.testing.assert_array_equal(later, tc.SentenceEncoder(other, enc.tokenizer).encode(texts, batch_size=2))
    assert np.abs(later - expected).max() > 0.1

    # every setting assigned while encode iterates `sentences` (a generator here; another thread
    # could run then too), with a default prompt, so that include_prompt and the prompts matter
    enc = _fresh_encoder(encoder)
    enc.prompts, enc.default_prompt_name = {"q": "query: "}, "q"
    expected = enc.encode(texts, batch_size=2)
    np.testing.assert_allclose(expected, _hf_prompted(hf_bert, hf_tokenizer, texts, "query: "), atol=1e-5)
    short = tc.Tokenizer.from_pretrained(MODEL_NAME, max_length=8)

    def sentences():
        for i, text in enumerate(texts):
            if i == 1:
                enc.pooling, enc.normalize, enc.include_prompt = "cls", False, False
                enc.default_prompt_name, enc.prompts = None, {"q": "passage: "}
                enc.max_seq_length = 4  # the tokenizer the call holds, changed in place
                enc.tokenizer = short
            yield text

    np.testing.assert_array_equal(enc.encode(sentences(), batch_size=2), expected)
    assert (enc.pooling, enc.normalize, enc.include_prompt, enc.default_prompt_name) == ("cls", False, False, None)
    assert enc.tokenizer is short
    truncated = _backend_truncated_to(model_dir, 8)
    np.testing.assert_allclose(enc.encode(texts, batch_size=2), _hf_pool(hf_bert, truncated, texts, "cls", False),
                               atol=1e-5)
    assert np.abs(enc.encode(texts) - _hf_pool(hf_bert, hf_tokenizer, texts, "cls", False)).max() > 0.1
    enc.max_seq_length = 256
    skip = len(hf_tokenizer.encode("passage: ").ids) - 1
    np.testing.assert_allclose(enc.encode(texts, batch_size=2, prompt_name="q", normalize=True),
                               _hf_prompted(hf_bert, hf_tokenizer, texts, "passage: ", "cls", skip), atol=1e-5)


def _backend_truncated_to(model_dir, max_length):
    """all-MiniLM-L6-v2's tokenizer of the tokenizers package, truncating to ``max_length``."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    backend.no_padding()
    backend.enable_truncation(max_length=max_length)
    return backend


# ------------------------------------------- sentence_bert_config.json: do_lower_case and processor_kwargs
@pytest.fixture(scope="module")
def random_bert_dir(tmp_path_factory, model_dir):
    """A random BERT (hidden 32, 2 layers, 4 heads, 128 positions; seeded) saved by transformers,
    with all-MiniLM-L6-v2's tokenizer files: the model the sentence_bert_config.json folders below
    copy."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(7)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("random_bert")
    BertModel(cfg, add_pooling_layer=False).save_pretrained(str(path), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(model_dir / name, path / name)
    return path


def _sbert_folder(tmp_path, random_bert_dir, sbert_config):
    """The random BERT as a sentence-transformers folder (Transformer + mean Pooling) whose
    sentence_bert_config.json is ``sbert_config``."""
    import json
    import os

    d = tmp_path / "sbert"
    d.mkdir(parents=True)
    for f in random_bert_dir.iterdir():
        os.symlink(f, d / f.name)
    (d / "sentence_bert_config.json").write_text(json.dumps(sbert_config))
    (d / "1_Pooling").mkdir()
    _write_pooling_config(d, {"embedding_dimension": 32, "pooling_mode": "mean", "include_prompt": True})
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": _ST6_TYPES["Transformer"]},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": _ST6_TYPES["Pooling"]}]))
    return d


def _hf_embeddings(folder, ids, mask, types):
    """transformers' BertModel of ``folder`` (float64) on these ids, mean-pooled, not normalised."""
    from transformers import BertModel

    hf = BertModel.from_pretrained(str(folder), attn_implementation="eager").double().eval()
    return hf_mean_pool(hf, ids, mask, types, normalize=False)


_LOWER_CASE_TEXTS = ["\u039f\u0394\u039f\u03a3", "Hello [MASK] world", "\u03a3\u0391\u03a3 [SEP] of \u0130stanbul",
                     "The END. " * 10 + "\u039f\u0394\u039f\u03a3 " * 300]  # the last one cut from a prefix


def test_do_lower_case_lowercases_as_sentence_transformers_6(tmp_path, random_bert_dir):
    """sentence_bert_config.json's "do_lower_case": true lowercased each text with str.lower();
    sentence-transformers 6 prepends the tokenizers package's Lowercase() to the normalizer, which
    maps every capital sigma to "σ" (str.lower() gives a word-final "ς": "ΟΔΟΣ" had other ids) and
    runs after the special tokens are matched ("[MASK]" stayed [ , mask, ]). The ids and
    embeddings are now those of that rule: a tokenizers.Tokenizer whose normalizer has Lowercase()
    prepended, and transformers' model mean-pooled."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import normalizers

    d = _sbert_folder(tmp_path, random_bert_dir, {"max_seq_length": 64, "do_lower_case": True})
    ref = HFTokenizer.from_file(str(d / "tokenizer.json"))
    ref.normalizer = normalizers.Sequence([normalizers.Lowercase(), ref.normalizer])
    ref.no_padding()
    ref.enable_truncation(max_length=64)
    enc = tc.SentenceEncoder.from_pretrained(d, dtype=np.float64)
    assert enc.tokenizer.do_lower_case and enc.normalize is False
    for text in _LOWER_CASE_TEXTS:
        assert enc.tokenizer.encode(text) == ref.encode(text).ids, text
    assert enc.tokenizer.encode("Hello [MASK] world") == [101, 7592, 103, 2088, 102]
    ids, mask, types = hf_encode(ref, _LOWER_CASE_TEXTS)
    np.testing.assert_array_equal(enc.tokenizer.encode_batch(_LOWER_CASE_TEXTS)["input_ids"], ids)
    np.testing.assert_allclose(enc.encode(_LOWER_CASE_TEXTS, batch_size=3), _hf_embeddings(d, ids, mask, types),
                               atol=1e-10)


def test_do_lower_case_assigned_prepends_lowercase_and_takes_it_back(model_dir):
    """Tokenizer.do_lower_case assigned: True prepends Lowercase() to the backend's normalizer (ids
    of the tokenizers package with that normalizer), kept by copy and pickle; False puts the
    normalizer back (the ids of the tokenizer.json alone)."""
    import copy
    import pickle

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import normalizers

    plain = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
    plain.no_padding()
    lowered = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
    lowered.normalizer = normalizers.Sequence([normalizers.Lowercase(), lowered.normalizer])
    lowered.no_padding()
    text = "\u039f\u0394\u039f\u03a3 \u03a3\u0391\u03a3, [MASK] Hello"
    assert plain.encode(text.lower()).ids != lowered.encode(text).ids  # str.lower() is not the rule
    tok = tc.Tokenizer.from_pretrained(MODEL_NAME)
    tok.do_lower_case = True
    assert isinstance(tok.backend.normalizer, normalizers.Sequence)
    for t in (tok, copy.copy(tok), copy.deepcopy(tok), pickle.loads(pickle.dumps(tok))):
        assert t.do_lower_case and t.encode(text) == lowered.encode(text).ids
        assert t.encode_batch([text, "x"])["input_ids"][0].tolist() == lowered.encode(text).ids
        assert next(t.encode_batches([text], 1))["input_ids"][0].tolist() == lowered.encode(text).ids
    tok.do_lower_case = True  # once only
    assert len(list(tok.backend.normalizer)) == 2
    tok.do_lower_case = False
    assert isinstance(tok.backend.normalizer, normalizers.BertNormalizer)
    assert tok.encode(text) == plain.encode(text).ids


def test_processor_kwargs_model_max_length_wins_over_max_seq_length(tmp_path, random_bert_dir):
    """processor_kwargs (old name tokenizer_args, which replaces it when both are there) are
    sentence-transformers' arguments of transformers' tokenizer: their model_max_length wins over
    max_seq_length. It was ignored (64 tokens kept, not 16)."""
    from tokenizers import Tokenizer as HFTokenizer

    text = "word " * 100
    ref = HFTokenizer.from_file(str(random_bert_dir / "tokenizer.json"))
    ref.no_padding()
    ref.enable_truncation(max_length=16)
    ids, mask, types = hf_encode(ref, [text, "short"])
    want = _hf_embeddings(random_bert_dir, ids, mask, types)
    for i, sbert in enumerate(({"max_seq_length": 64, "processor_kwargs": {"model_max_length": 16}},
                               {"max_seq_length": 64, "tokenizer_args": {"model_max_length": 16}},
                               {"processor_kwargs": {"model_max_length": 64}, "tokenizer_args": {"model_max_length": 16},
                                "max_seq_length": 32})):
        d = _sbert_folder(tmp_path / str(i), random_bert_dir, sbert)
        enc = tc.SentenceEncoder.from_pretrained(d, dtype=np.float64)
        assert enc.max_seq_length == 16, sbert
        np.testing.assert_allclose(enc.encode([text, "short"]), want, atol=1e-10)


@pytest.mark.parametrize("kwargs", [{"do_lower_case": False}, {"truncation_side": "left", "model_max_length": 12},
                                    {"do_lower_case": False, "truncation_side": "right"}])
def test_processor_kwargs_reach_the_tokenizer_as_in_transformers(tmp_path, random_bert_dir, kwargs):
    """processor_kwargs' do_lower_case (BERT's normalizer flag: false keeps case, so the uncased
    vocabulary gives [UNK]) and truncation_side are the arguments of transformers' tokenizer: ids as
    transformers' AutoTokenizer.from_pretrained(folder, **kwargs) gives them. They were ignored."""
    from transformers import AutoTokenizer

    d = _sbert_folder(tmp_path, random_bert_dir, {"max_seq_length": 64, "tokenizer_args": kwargs})
    ref = AutoTokenizer.from_pretrained(str(d), **{"model_max_length": 64, **kwargs})
    texts = ["Hello World", "The END of the STORY is here. " * 8]
    enc = tc.SentenceEncoder.from_pretrained(d, dtype=np.float64)
    want = [ref(t, truncation=True)["input_ids"] for t in texts]
    assert [enc.tokenizer.encode(t) for t in texts] == want
    assert want[0] == ([101, 7592, 2088, 102] if kwargs.get("do_lower_case", True) else [101, 100, 100, 102])
    batch = enc.tokenizer.encode_batch(texts)
    np.testing.assert_allclose(enc.encode(texts), _hf_embeddings(d, batch["input_ids"], batch["attention_mask"],
                                                                 batch["token_type_ids"]), atol=1e-10)


@pytest.mark.parametrize("sbert, key", [
    ({"processor_kwargs": {"use_fast": False}}, "processor_kwargs: use_fast"),
    ({"tokenizer_args": {"strip_accents": True}}, "tokenizer_args: strip_accents"),
    ({"processor_kwargs": [16]}, "processor_kwargs: expected a JSON object"),
    ({"tokenizer_args": None}, "tokenizer_args: expected a JSON object"),
    ({"processor_kwargs": {"model_max_length": "16"}}, "processor_kwargs: model_max_length: expected a positive int"),
    ({"processor_kwargs": {"model_max_length": 4096}}, "processor_kwargs: model_max_length: expected at most 128"),
    ({"processor_kwargs": {"do_lower_case": "false"}}, "processor_kwargs: do_lower_case: expected a bool"),
    ({"processor_kwargs": {"truncation_side": "middle"}}, "processor_kwargs: truncation_side: expected"),
    ({"model_args": {"torch_dtype": "float16"}}, "model_args: torch_dtype"),
    ({"model_kwargs": {"attn_implementation": "sdpa"}}, "model_kwargs: attn_implementation"),
    ({"config_args": {"hidden_dropout_prob": 0.5}}, "config_args: hidden_dropout_prob"),
    ({"config_kwargs": {"num_hidden_layers": 1}}, "config_kwargs: num_hidden_layers"),
])
def test_sentence_bert_kwargs_not_applied_are_refused(tmp_path, random_bert_dir, sbert, key):
    """Any other key of processor_kwargs / tokenizer_args, and model / config kwargs (which
    sentence-transformers passes to transformers' model and config), were ignored: refused now,
    naming the file and the key. Keys that sentence-transformers overwrites with its own arguments
    (cache_dir, revision, trust_remote_code, ...) and empty objects change nothing and load."""
    import re

    d = _sbert_folder(tmp_path, random_bert_dir, {"max_seq_length": 64, **sbert})
    with pytest.raises(ValueError, match=re.escape(f"sentence_bert_config.json: {key}")) as info:
        tc.SentenceEncoder.from_pretrained(d)
    assert str(d) in str(info.value)
    ignored = {"max_seq_length": 64, "processor_kwargs": {"revision": "main", "trust_remote_code": True},
               "model_args": {"cache_dir": "/nonexistent", "trust_remote_code": True}, "config_kwargs": {}}
    ok = _sbert_folder(tmp_path / "ok", random_bert_dir, ignored)
    assert tc.SentenceEncoder.from_pretrained(ok).max_seq_length == 64


@pytest.mark.parametrize("processing, length", [
    ({"text": {"max_length": 8}}, 8),
    ({"common": {"max_length": 12, "truncation": True}, "text": {"max_length": 8, "padding": "max_length"}}, 12),
    ({"text": {"truncation": "longest_first", "padding": True}, "image": {}}, 64),
])
def test_processing_kwargs_max_length_as_sentence_transformers_calls_the_tokenizer(tmp_path, random_bert_dir,
                                                                                   processing, length):
    """sentence_bert_config.json's processing_kwargs, which sentence-transformers 6 passes when it
    calls the tokenizer on texts ({"padding": True, "truncation": "longest_first", **text,
    **common}), was ignored: 64 tokens kept, not 8. Ids and embeddings as transformers' tokenizer
    called so gives them."""
    from transformers import AutoTokenizer

    d = _sbert_folder(tmp_path, random_bert_dir, {"max_seq_length": 64, "processing_kwargs": processing})
    ref = AutoTokenizer.from_pretrained(str(d), model_max_length=64)
    call = {"padding": True, "truncation": "longest_first", **processing.get("text", {}),
            **processing.get("common", {})}
    texts = ["word " * 100, "short"]
    batch = ref(texts, return_tensors="np", **call)
    enc = tc.SentenceEncoder.from_pretrained(d, dtype=np.float64)
    assert enc.max_seq_length == length
    assert enc.tokenizer.encode(texts[0]) == ref(texts[0], **call)["input_ids"] and len(enc.tokenizer.encode(texts[0])) == length
    want = _hf_embeddings(d, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    np.testing.assert_allclose(enc.encode(texts), want, atol=1e-10)


@pytest.mark.parametrize("sbert, key", [
    ({"processing_kwargs": {"text": {"max_length": 8, "stride": 2}}}, "processing_kwargs: text: stride"),
    ({"processing_kwargs": {"common": {"truncation": False}}}, "processing_kwargs: common: truncation"),
    ({"processing_kwargs": {"text": {"max_length": 0}}}, "processing_kwargs: text: max_length: expected a positive"),
    ({"processing_kwargs": {"text": {"max_length": 4096}}}, "processing_kwargs: text: max_length: expected at most"),
    ({"processing_kwargs": {"chat_template": {"add_generation_prompt": True}}}, "processing_kwargs: chat_template"),
    ({"processing_kwargs": [8]}, "processing_kwargs: expected a JSON object"),
    ({"query_length": 8}, "query_length: not supported"),
    ({"processor_kwargs": {"use_fast": True}}, "processor_kwargs: use_fast"),
    ({"processor_kwargs": {"model_max_length": 4096}}, "processor_kwargs: model_max_length: expected at most"),
    ({"max_seq_length": 4096}, "max_seq_length: expected at most"),
    ({"do_lower_case": "yes"}, "do_lower_case: expected a bool"),
])
def test_sentence_bert_config_refused_before_the_model_is_read(tmp_path, random_bert_dir, monkeypatch, sbert, key):
    """processing_kwargs keys not applied are refused naming the file and key (they were ignored),
    and every refusal of sentence_bert_config.json's tokenizer keys comes before the model weights
    are read (they came after BertModel.from_pretrained)."""
    import re

    import transformer_core.sentence_encoder as se

    d = _sbert_folder(tmp_path, random_bert_dir, {"max_seq_length": 64, **sbert})

    def no_model(*args, **kwargs):
        raise AssertionError("the model was read before sentence_bert_config.json was checked")

    monkeypatch.setattr(se.BertModel, "from_pretrained", no_model)
    with pytest.raises(ValueError, match=re.escape("sentence_bert_config.json: ") + ".*" + re.escape(key)) as info:
        tc.SentenceEncoder.from_pretrained(d)
    assert str(d) in str(info.value)
    with pytest.raises(ValueError, match=re.escape(key)):
        tc.Tokenizer.from_pretrained(d)
