"""The settings of a model folder's ``tokenizer_config.json`` (and ``tokenizer.json``) that
transformers applies and tc.Tokenizer.from_pretrained used to ignore, each against transformers'
AutoTokenizer built from the same folder: ``truncation_side``, ``clean_up_tokenization_spaces``,
BERT's normalizer flags (``do_lower_case``, ``strip_accents``, ``tokenize_chinese_chars``) and
``padding_side``.

The folders are all-MiniLM-L6-v2's embedded files (linked) with an edited tokenizer_config.json
or tokenizer.json.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import transformer_core as tc
from conftest import MODEL_DIR, hf_mean_pool

LONG = "start of the text " + "alpha " * 300 + "the end of the text is here"  # 308 words
TEXTS = ["Hi", "hello world, how are you?", LONG]
_DROP = object()  # a tokenizer_config.json key to leave out


def _hf(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def _folder(tmp_path, tokenizer_json=None, **config):
    """A copy of all-MiniLM-L6-v2's folder (its files linked) whose tokenizer_config.json has the
    ``config`` changes (``_DROP``: key removed) and whose tokenizer.json has the top-level
    ``tokenizer_json`` changes."""
    path = tmp_path / "minilm"
    path.mkdir()
    for item in MODEL_DIR.iterdir():
        if item.name not in ("tokenizer_config.json", "tokenizer.json"):
            (path / item.name).symlink_to(item)
    settings = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())
    settings.update(config)
    settings = {k: v for k, v in settings.items() if v is not _DROP}
    (path / "tokenizer_config.json").write_text(json.dumps(settings))
    spec = json.loads((MODEL_DIR / "tokenizer.json").read_text())
    spec.update(tokenizer_json or {})
    (path / "tokenizer.json").write_text(json.dumps(spec))
    return path


def _json_truncation(direction):
    return {"truncation": {"direction": direction, "max_length": 128, "strategy": "LongestFirst", "stride": 0}}


def _assert_batches_equal(ours, hf, texts, max_length):
    """encode, encode_batch and encode_batches (one batch) against transformers' padded batch."""
    want = hf(texts, truncation=True, max_length=max_length, padding=True, return_tensors="np")
    assert [ours.encode(t) for t in texts] == hf(texts, truncation=True, max_length=max_length)["input_ids"]
    (batch,) = ours.encode_batches(texts, len(texts))
    for got in (ours.encode_batch(texts), batch):
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


# ------------------------------------------------------------------------------------ truncation_side
TRUNCATION_CASES = {  # (tokenizer_config.json's truncation_side, tokenizer.json's direction, the side applied)
    "neither": (_DROP, None, "right"),
    "tokenizer_config left": ("left", None, "left"),
    "tokenizer.json Left": (_DROP, "Left", "left"),
    "tokenizer_config right over tokenizer.json Left": ("right", "Left", "right"),
}


@pytest.mark.parametrize("case", list(TRUNCATION_CASES))
def test_truncation_side_as_transformers_reads_it(tmp_path, case):
    """Every enable_truncation call reset the direction to right: a folder that truncates on the
    left (tokenizer_config.json's truncation_side, else tokenizer.json's truncation direction) was
    cut on the right (a 300-word text kept "alpha alpha alpha [SEP]", not "text is here [SEP]"). The
    side is now read as transformers reads it, kept when max_length is assigned, and assignable."""
    side, direction, want = TRUNCATION_CASES[case]
    path = _folder(tmp_path, _json_truncation(direction) if direction else None, truncation_side=side)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert hf.truncation_side == ours.truncation_side == want
    assert ours.max_length == 256  # sentence_bert_config.json's max_seq_length
    tail = ["text", "is", "here", "[SEP]"] if want == "left" else ["alpha", "alpha", "alpha", "[SEP]"]
    assert ours.tokenize(LONG, add_special_tokens=True)[-4:] == tail
    _assert_batches_equal(ours, hf, TEXTS, 256)
    ours.max_length = 16  # the side stays
    _assert_batches_equal(ours, hf, TEXTS, 16)
    other = "right" if want == "left" else "left"
    ours.truncation_side = hf.truncation_side = other
    _assert_batches_equal(ours, hf, TEXTS, 16)


def test_left_truncation_embeddings_match_transformers(tmp_path, hf_bert):
    """SentenceEncoder on a left-truncating folder gave the right-truncated text's embedding (max
    error 0.060, cosine 0.948 against transformers with sentence-transformers' mean + L2). It now
    embeds what transformers keeps, also for a text long enough for its prefix shortcut."""
    path = _folder(tmp_path, truncation_side="left")
    hf = _hf(path)
    texts = ["a short one", LONG, "begin " + "word " * 5000 + "finally the real ending"]
    enc = tc.SentenceEncoder.from_pretrained(path)
    batch = hf(texts, truncation=True, max_length=256, padding=True, return_tensors="np")
    want = hf_mean_pool(hf_bert, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    np.testing.assert_allclose(enc.encode(texts), want, atol=2e-6)


def test_truncation_side_of_a_backend_and_its_checks(model_dir):
    """Tokenizer(backend) takes the backend's own truncation direction unless told; bad sides are
    refused, in the constructor and on assignment, changing nothing."""
    from tokenizers import Tokenizer as HFTokenizer

    backend = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
    backend.enable_truncation(max_length=128, direction="left")
    ref = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
    ref.no_padding()  # the file pads to 128
    ref.enable_truncation(max_length=8, direction="left")
    tok = tc.Tokenizer(backend, 8)
    assert tok.truncation_side == "left" and tok.encode(LONG) == ref.encode(LONG).ids
    ref.enable_truncation(max_length=8, direction="right")
    assert tc.Tokenizer(backend, 8, truncation_side="right").encode(LONG) == ref.encode(LONG).ids
    ref.enable_truncation(max_length=8, direction="left")
    for bad, err in (("middle", ValueError), ("Left", ValueError), (None, TypeError), (1, TypeError)):
        with pytest.raises(err, match="^truncation_side: expected"):
            tok.truncation_side = bad
        if bad is not None:
            with pytest.raises(err, match="^truncation_side: expected"):
                tc.Tokenizer(backend, 8, truncation_side=bad)
    assert tok.truncation_side == "left" and tok.encode(LONG) == ref.encode(LONG).ids


# ------------------------------------------------------------------------------------ clean_up_tokenization_spaces
SPACED = ["Hello , world . It ' s fine !", "x n't", "I 'm here ; you 're there , we 've won", "a - b ?",
          "\"quoted\" (paren) e.g. U.S.A.", "co-op's"]


@pytest.mark.parametrize("clean_up", [True, False, _DROP])
def test_clean_up_tokenization_spaces_in_decode(tmp_path, clean_up):
    """clean_up_tokenization_spaces: true was ignored by decode ("hello, world. it ' s fine!" where
    transformers gives "hello, world. it's fine!"). decode now cleans up as transformers does, and
    its argument of that name overrides the folder's setting."""
    path = _folder(tmp_path, clean_up_tokenization_spaces=clean_up)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert ours.clean_up_tokenization_spaces is hf.clean_up_tokenization_spaces is (clean_up is True)
    for text in SPACED:
        ids = hf(text)["input_ids"]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text
            for flag in (True, False):
                assert ours.decode(ids, skip, flag) == hf.decode(ids, skip_special_tokens=skip,
                                                                 clean_up_tokenization_spaces=flag)
    ids = hf(SPACED[0])["input_ids"]
    want = "hello, world. it's fine!" if clean_up is True else "hello, world. it ' s fine!"
    assert ours.decode(ids, skip_special_tokens=True) == want
    ours.clean_up_tokenization_spaces = clean_up is not True
    assert ours.decode(ids, skip_special_tokens=True) != want
    with pytest.raises(TypeError, match="^clean_up_tokenization_spaces: expected a bool"):
        ours.clean_up_tokenization_spaces = "yes"
    with pytest.raises(TypeError, match="^clean_up_tokenization_spaces: expected a bool"):
        ours.decode(ids, clean_up_tokenization_spaces=1)


@pytest.fixture(scope="module")
def smollm2_folder(hf_smollm2_tokenizer, tmp_path_factory):
    """SmolLM2's tokenizer (byte-level BPE, a causal LM's) as save_pretrained writes it."""
    path = tmp_path_factory.mktemp("smollm2_saved")
    hf_smollm2_tokenizer.save_pretrained(str(path))
    return path


def _edited_config(path, **changes):
    settings = json.loads((path / "tokenizer_config.json").read_text())
    settings.update(changes)
    (path / "tokenizer_config.json").write_text(json.dumps(settings))
    return path


@pytest.mark.parametrize("anyway", [False, True])
def test_clean_up_is_skipped_for_bpe_as_transformers_does(smollm2_folder, tmp_path, anyway):
    """transformers skips the clean-up for a BPE model (it would remove real spaces before
    punctuation) unless told to corrupt the output anyway; so does from_pretrained."""
    import shutil

    path = tmp_path / "smollm2"
    shutil.copytree(smollm2_folder, path)
    _edited_config(path, clean_up_tokenization_spaces=True,
                   clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output=anyway)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert ours.clean_up_tokenization_spaces is anyway
    text = "Hello , world . It ' s fine !"
    ids = hf(text)["input_ids"]
    assert ours.decode(ids) == hf.decode(ids) == ("Hello, world. It's fine!" if anyway else text)
    # asked for in the call or set later, a BPE's clean-up still needs the override, as in transformers
    # (it removed the text's own spaces: "Hello, world!" for "Hello , world !")
    for spaced in (text, "a ' b ' c", "  spaced   out . "):
        ids = hf(spaced)["input_ids"]
        for flag in (True, False):
            assert ours.decode(ids, clean_up_tokenization_spaces=flag) == hf.decode(
                ids, clean_up_tokenization_spaces=flag), (spaced, flag)
    ours.clean_up_tokenization_spaces = True
    ids = hf(text)["input_ids"]
    assert ours.decode(ids) == hf.decode(ids, clean_up_tokenization_spaces=True)
    assert (ours.decode(ids) == text) is not anyway


def test_clean_up_keys_null_read_as_false(tmp_path):
    """A tokenizer_config.json with ``"clean_up_tokenization_spaces": null`` (and the BPE override
    null) loaded before these keys were read, and loads in transformers (null: no clean-up); it was
    refused ("expected a bool, got NoneType")."""
    path = _folder(tmp_path, clean_up_tokenization_spaces=None,
                   clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output=None)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert ours.clean_up_tokenization_spaces is False
    ids = hf(SPACED[0])["input_ids"]
    assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True) == \
        "hello, world. it ' s fine!"


# ------------------------------------------------------------------------------------ BERT's normalizer flags
NORMALIZER_TEXTS = ["Héllo WORLD 日本語", "Ünïcödé ÀÉÎÕÜ straße", "naïve café résumé", "中文字符 and 한국어 text",
                    "MiXeD CaSe İstanbul Ωmega", "ｆｕｌｌ width ﬁne", "tab\there\u200bzero width"]
NORMALIZER_FLAGS = [  # (flags, whether they tokenize some text differently from MiniLM's own normalizer)
    ({"do_lower_case": False}, True), ({"strip_accents": False}, True), ({"tokenize_chinese_chars": False}, True),
    ({"do_lower_case": False, "strip_accents": True}, True),
    ({"do_lower_case": False, "tokenize_chinese_chars": False, "strip_accents": False}, True),
    ({"strip_accents": True}, False),  # lowercasing strips accents already
    ({"do_lower_case": True, "strip_accents": None, "tokenize_chinese_chars": True}, False),  # MiniLM's own
]


@pytest.mark.parametrize(("flags", "differs"), NORMALIZER_FLAGS,
                         ids=[",".join(f"{k}={v}" for k, v in f.items()) for f, _ in NORMALIZER_FLAGS])
def test_bert_normalizer_flags_as_transformers_applies_them(tmp_path, flags, differs):
    """do_lower_case, strip_accents and tokenize_chinese_chars in tokenizer_config.json were
    ignored (with tokenize_chinese_chars false transformers gives ['日', '##本', '##語'], ours gave
    ['日', '本', '語']). They now rebuild tokenizer.json's BertNormalizer, as transformers' BERT
    tokenizer does: the same tokens, ids and decoded text."""
    path = _folder(tmp_path, **flags)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    default = tc.Tokenizer.from_pretrained(MODEL_DIR)
    changed = False
    for text in NORMALIZER_TEXTS:
        assert ours.tokenize(text, add_special_tokens=False) == hf.tokenize(text), text
        ids = hf(text)["input_ids"]
        assert ours.encode(text) == ids
        assert ours.decode(ids) == hf.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)
        changed |= ours.encode(text) != default.encode(text)
    assert changed is differs
    _assert_batches_equal(ours, hf, NORMALIZER_TEXTS, 256)


@pytest.mark.parametrize("tokenizer_class", ["BertTokenizer", "BertTokenizerFast", _DROP, "PreTrainedTokenizerFast"],
                         ids=["bert", "bert-fast", "none-model-type-bert", "generic-fast"])
@pytest.mark.parametrize("normalizer", [{"lowercase": False}, {"handle_chinese_chars": False},
                                        {"lowercase": False, "strip_accents": False, "handle_chinese_chars": False}],
                         ids=["cased", "no-cjk-split", "all-off"])
def test_bert_normalizer_flags_absent_as_transformers_reads_them(tmp_path, normalizer, tokenizer_class):
    """A flag absent from tokenizer_config.json kept tokenizer.json's setting; transformers' BERT
    tokenizer (the class named, or with none the one of config.json's model type) takes its
    argument's default (do_lower_case true, strip_accents null, tokenize_chinese_chars true)
    whatever tokenizer.json says: a case-sensitive tokenizer.json without "do_lower_case": false
    gave ['[UNK]', '[UNK]'] for "HELLO WORLD" here and ['hello', 'world'] there. A generic class
    keeps tokenizer.json's normalizer, there and here. The same tokens in each case now."""
    spec = json.loads((MODEL_DIR / "tokenizer.json").read_text())
    path = _folder(tmp_path, tokenizer_json={"normalizer": {**spec["normalizer"], **normalizer}},
                   tokenizer_class=tokenizer_class, do_lower_case=_DROP, strip_accents=_DROP,
                   tokenize_chinese_chars=_DROP)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    cased = "lowercase" in normalizer and tokenizer_class == "PreTrainedTokenizerFast"
    assert ours.tokenize("HELLO WORLD", add_special_tokens=False) == hf.tokenize("HELLO WORLD") == (
        ["[UNK]", "[UNK]"] if cased else ["hello", "world"])
    for text in NORMALIZER_TEXTS:
        assert ours.tokenize(text, add_special_tokens=False) == hf.tokenize(text), text
        assert ours.encode(text) == hf(text)["input_ids"]
    if tokenizer_class != "PreTrainedTokenizerFast":  # a generic one returns no token_type_ids
        _assert_batches_equal(ours, hf, NORMALIZER_TEXTS, 256)


@pytest.mark.parametrize("tokenizer_class", ["PreTrainedTokenizerFast", "TokenizersBackend", _DROP],
                         ids=["generic-fast", "tokenizers-backend", "no-class-no-config"])
@pytest.mark.parametrize("flags", [{"do_lower_case": False}, {"strip_accents": False},
                                   {"tokenize_chinese_chars": False},
                                   {"do_lower_case": "false", "strip_accents": 0, "tokenize_chinese_chars": None}],
                         ids=["cased", "accents-kept", "no-cjk-split", "not-bools"])
def test_bert_normalizer_flags_of_another_class_are_ignored_as_transformers(tmp_path, tokenizer_class, flags):
    """do_lower_case, strip_accents and tokenize_chinese_chars present in tokenizer_config.json were
    applied whatever the tokenizer class: a PreTrainedTokenizerFast (or class-less) folder with
    "do_lower_case": false gave [UNK] [UNK] for "Hello World", where transformers keeps
    tokenizer.json's lowercasing normalizer ([7592, 2088]). They are read for BERT's classes only
    now (and not checked elsewhere: transformers loads such a folder whatever their values)."""
    path = _folder(tmp_path, tokenizer_class=tokenizer_class, **flags)
    if tokenizer_class is _DROP:  # no class at all: config.json would name BERT's model type
        (path / "config.json").unlink()
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert type(hf).__name__ == "TokenizersBackend" and ours.max_length == 256
    assert ours.encode("Hello World") == hf("Hello World")["input_ids"] == [101, 7592, 2088, 102]
    for text in NORMALIZER_TEXTS:
        assert ours.tokenize(text) == hf.tokenize(text), text
        assert ours.encode(text) == hf(text)["input_ids"], text
        assert ours.encode(text) == tc.Tokenizer.from_pretrained(MODEL_DIR).encode(text), text
    want = hf(NORMALIZER_TEXTS, truncation=True, max_length=256, padding=True, return_tensors="np")
    got = ours(NORMALIZER_TEXTS)
    for key in ("input_ids", "attention_mask"):
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


BAD_CONFIG = {  # key: (value, the expected type in the message)
    "truncation_side": ("middle", "'right' or 'left'"),
    "padding_side": (1, "'right' or 'left'"),
    "clean_up_tokenization_spaces": ("true", "a bool"),
    "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output": (1, "a bool"),
    "do_lower_case": ("false", "a bool"),
    "tokenize_chinese_chars": (None, "a bool"),
    "strip_accents": (0, "a bool or null"),
}


@pytest.mark.parametrize("key", list(BAD_CONFIG))
def test_bad_settings_are_refused_naming_the_file_and_key(tmp_path, key):
    """A value transformers would misread (a string "false" is true) or refuse is refused, naming
    tokenizer_config.json and the key."""
    value, expected = BAD_CONFIG[key]
    path = _folder(tmp_path, **{key: value})
    with pytest.raises(ValueError, match=rf"tokenizer_config.json: {key}: expected {expected}, got "):
        tc.Tokenizer.from_pretrained(path)


# ------------------------------------------------------------------------------------ padding_side
def test_padding_side_of_a_causal_folder(smollm2_folder, tmp_path):
    """A causal LM's padding_side is encode_batch's default side, as transformers' default; the
    argument overrides it."""
    import shutil

    texts = ["Hi", "hello world, how are you?", ""]
    for side in ("left", "right"):
        path = tmp_path / side
        shutil.copytree(smollm2_folder, path)
        hf, ours = _hf(_edited_config(path, padding_side=side)), tc.Tokenizer.from_pretrained(path)
        assert ours.max_length is None and ours.padding_side == hf.padding_side == side
        for given in (None, "left", "right"):
            got = ours.encode_batch(texts, padding_side=given)
            want = hf(texts, padding=True, padding_side=given, return_tensors="np")
            for key in ("input_ids", "attention_mask"):
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"{side} {given} {key}")
    ours.padding_side = "left"
    assert ours.encode_batch(texts)["attention_mask"][0, 0] == 0


def test_an_encoder_pads_on_the_right(tmp_path, model_dir):
    """An encoder folder's padding_side "left" is not applied (BERT's positions start at the first
    token, padding included): each row holds transformers' ids of its text, then padding. Left is
    refused for an encoder tokenizer, in the constructor and on assignment."""
    from tokenizers import Tokenizer as HFTokenizer

    path = _folder(tmp_path, padding_side="left")
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert hf.padding_side == "left" and ours.padding_side == "right" and ours.max_length == 256
    got = ours.encode_batch(TEXTS)
    for row, text in enumerate(TEXTS):
        want = hf(text, truncation=True, max_length=256)["input_ids"]
        assert got["input_ids"][row, :len(want)].tolist() == want
        assert got["attention_mask"][row].tolist() == [1] * len(want) + [0] * (got["input_ids"].shape[1] - len(want))
    backend = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
    with pytest.raises(ValueError, match=r"^padding_side: expected 'right' for an encoder tokenizer"):
        tc.Tokenizer(backend, 16, padding_side="left")
    with pytest.raises(ValueError, match=r"^padding_side: expected 'right' for an encoder tokenizer"):
        ours.padding_side = "left"
    with pytest.raises(TypeError, match=r"^padding_side: expected a str"):
        ours.padding_side = None
    assert ours.padding_side == "right"


# ------------------------------------------------------------------------------------ split_special_tokens
@pytest.mark.parametrize("split", [True, False, None])
def test_split_special_tokens_as_transformers_reads_it(tmp_path, split):
    """tokenizer_config.json's split_special_tokens: true was ignored: "[SEP]" typed in a text stayed
    the special id; transformers spells it out as text."""
    path = _folder(tmp_path, split_special_tokens=_DROP if split is None else split)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    for text in ("Hi [SEP] there", "[CLS][MASK]"):
        assert ours.encode(text) == hf.encode(text), text
    assert (ours.encode("a[SEP]").count(102) == 1) is (split is True)  # only the template's [SEP] when split


def test_split_special_tokens_not_a_bool_is_refused(tmp_path):
    path = _folder(tmp_path, split_special_tokens="yes")
    with pytest.raises(ValueError) as info:
        tc.Tokenizer.from_pretrained(path)
    assert str(info.value) == f"{path / 'tokenizer_config.json'}: split_special_tokens: expected a bool, got str 'yes'"
