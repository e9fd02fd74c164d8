"""tc.Tokenizer's argument checks and loading options that are not GGUF-specific, against the
``tokenizers`` package (the reference backend) and sentence-transformers' behaviour: max_length
against the special tokens, pad_token=None, 2-D ids in decode, TextStream's tokenizer, non-str
items of a batch, a file path that is not a GGUF, and sentence_bert_config.json's do_lower_case.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import MODEL_NAME, hf_encode, hf_mean_pool, sentencepiece_tokenizer
from transformer_core.tokenizer import TextStream


def _backend(model_dir):
    """A fresh ``tokenizers.Tokenizer`` of all-MiniLM-L6-v2 (truncation to 128 from its file; its
    padding to 128 off)."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    backend.no_padding()
    return backend


def _uncopyable(model_dir):
    """A backend with a pre-tokenizer written in Python: it cannot be serialized, so tc.Tokenizer uses
    it as is (its truncation and padding are the caller's)."""
    from tokenizers import pre_tokenizers

    class Split:  # on spaces (BERT's own pre-tokenizer also splits off punctuation)
        def pre_tokenize(self, pretok):
            pretok.split(lambda i, s: s.split(" ", "removed"))

    backend = _backend(model_dir)
    backend.pre_tokenizer = pre_tokenizers.PreTokenizer.custom(Split())
    return backend


# ------------------------------------------------------------------------------------ max_length
def test_max_length_below_the_special_tokens_is_refused(model_dir):
    """max_length=1 for BERT (2 special tokens, [CLS] and [SEP]) was accepted and then did not
    truncate at all: 600 words gave 602 tokens. It is refused at construction; 2 and 3 truncate as
    the tokenizers package does."""
    assert _backend(model_dir).num_special_tokens_to_add(False) == 2
    for bad in (1,):
        with pytest.raises(ValueError, match=r"max_length: expected at least 2 .*got 1"):
            tc.Tokenizer.from_pretrained(MODEL_NAME, max_length=bad)
        with pytest.raises(ValueError, match="max_length"):
            tc.Tokenizer(_backend(model_dir), bad)
    text = "word " * 600
    for n in (2, 3):
        ref = _backend(model_dir)
        ref.enable_truncation(max_length=n)
        ids = tc.Tokenizer.from_pretrained(MODEL_NAME, max_length=n).encode(text)
        assert ids == ref.encode(text).ids and len(ids) == n
    assert tc.Tokenizer.from_pretrained(MODEL_NAME, max_length=2).encode(text) == [101, 102]


def test_max_length_1_without_special_tokens(model_dir):
    """A backend that adds no special token truncates to a single token."""
    backend = _backend(model_dir)
    backend.post_processor = None
    assert backend.num_special_tokens_to_add(False) == 0
    tok = tc.Tokenizer(backend, 1)
    assert tok.encode("hello world") == [7592]


def test_refused_arguments_leave_an_uncopyable_backend_unchanged(model_dir):
    """Every argument is checked before the backend's truncation or padding is set: a backend used
    as is (one that cannot be copied) keeps its own after a refused call."""
    for kwargs, err in (({"max_length": 1}, ValueError), ({"do_lower_case": "yes"}, TypeError),
                        ({"eos_token": "<nope>"}, ValueError), ({"pad_token": 3}, TypeError)):
        backend = _uncopyable(model_dir)
        with pytest.raises(Exception, match="serializ"):
            backend.to_str()  # tc.Tokenizer cannot copy it
        before = (backend.truncation, backend.padding)
        with pytest.raises(err):
            tc.Tokenizer(backend, **{"max_length": 16, **kwargs})
        assert (backend.truncation, backend.padding) == before, kwargs



@pytest.mark.parametrize("make", [_backend, _uncopyable])
def test_max_length_assigned_later_truncates_as_the_tokenizers_package(model_dir, make):
    """max_length was a plain attribute: the backend's truncation was set once in __init__, so
    ``tok.max_length = 512`` (or 5) changed nothing (256 tokens still). Every encoding method now
    truncates to the assigned length, encode_batches' unpadded copy (made on first use) included."""
    tok = tc.Tokenizer(make(model_dir), 256)
    texts = [" ".join(f"word{i}" for i in range(600)), "short one", "time flies like an arrow"]
    assert list(tok.encode_batches(texts, 2))[0]["input_ids"].shape[1] == 256  # the unpadded copy exists
    for n in (512, 5, 300):
        tok.max_length = n
        assert tok.max_length == n
        ref = _backend(model_dir)
        ref.enable_truncation(max_length=n)
        assert tok.encode(texts[0]) == ref.encode(texts[0]).ids and len(tok.encode(texts[0])) == n
        assert tok.tokenize(texts[0], add_special_tokens=True) == ref.encode(texts[0]).tokens
        want = hf_encode(ref, texts)
        got = tok.encode_batch(texts)
        batches = list(tok.encode_batches(texts, 3))
        assert len(batches) == 1
        for key, w in zip(("input_ids", "attention_mask", "token_type_ids"), want):
            np.testing.assert_array_equal(got[key], w, err_msg=f"encode_batch {key}, max_length={n}")
            np.testing.assert_array_equal(batches[0][key], w, err_msg=f"encode_batches {key}, max_length={n}")


def test_max_length_assignment_is_checked(model_dir):
    """An assigned max_length is checked as the constructor's: not an int -> TypeError, below the
    special tokens -> ValueError; whether the tokenizer truncates at all is fixed at construction
    (None on an encoder tokenizer, an int on a causal-LM one: ValueError). A refused value changes
    nothing, the backend's truncation included."""
    tok = tc.Tokenizer(_backend(model_dir), 64)
    text = "word " * 100
    for bad, err, match in (("512", TypeError, r"^max_length: expected an int, got str '512'$"),
                            (64.0, TypeError, r"^max_length: expected an int, got float"),
                            (True, TypeError, r"^max_length: expected an int, got bool"),
                            (0, ValueError, r"^max_length: expected an int in \[1, .*\], got 0$"),
                            (1, ValueError, r"^max_length: expected at least 2 \(the special tokens"),
                            (None, ValueError, r"^max_length: this is an encoder tokenizer, which truncates")):
        with pytest.raises(err, match=match):
            tok.max_length = bad
        assert tok.max_length == 64 and len(tok.encode(text)) == 64, bad
    causal = tc.Tokenizer(sentencepiece_tokenizer(), max_length=None)
    with pytest.raises(ValueError, match=r"^max_length: this is a causal-LM tokenizer, which does not truncate"):
        causal.max_length = 8
    causal.max_length = None  # what it is: allowed
    assert causal.max_length is None and causal.backend.truncation is None


# ------------------------------------------------------------------------------------ pad_token=None
@pytest.mark.parametrize("make", [_backend, _uncopyable])
def test_pad_token_none_pads_with_id_0(model_dir, make):
    """pad_token=None (the signature and docstring allow it) raised the tokenizers package's bare
    TypeError, after the backend's truncation was changed; it pads with id 0."""
    tok = tc.Tokenizer(make(model_dir), 16, pad_token=None)
    assert tok.pad_token is None and tok.pad_token_id == 0
    texts = ["hi", "hello there my friend", "word " * 40]
    ref = _backend(model_dir)
    ref.enable_truncation(max_length=16)
    want_ids, want_mask, want_types = hf_encode(ref, texts)  # padded with 0 to the longest
    got = tok.encode_batch(texts)
    np.testing.assert_array_equal(got["input_ids"], want_ids)
    np.testing.assert_array_equal(got["attention_mask"], want_mask)
    np.testing.assert_array_equal(got["token_type_ids"], want_types)
    assert got["input_ids"].shape == (3, 16) and (got["input_ids"][0, 3:] == 0).all()


# ------------------------------------------------------------------------------------ decode
def test_decode_refuses_a_batch_of_ids(model_dir):
    """A 2-D array / tensor was flattened: the rows ran together into one text. Refused, naming
    ids and the shape; each row decodes as the tokenizers package decodes it."""
    tok = tc.Tokenizer.from_pretrained(MODEL_NAME)
    ref = _backend(model_dir)
    batch = tok.encode_batch(["hello", "world"])["input_ids"]
    assert batch.shape == (2, 3)
    for ids in (batch, torch.from_numpy(batch), batch[None], torch.tensor([[7592], [2088]])):
        with pytest.raises(ValueError, match=r"ids: expected a 1-D array .*got shape \("):
            tok.decode(ids)
    with pytest.raises(TypeError, match="ids"):
        tok.decode([[7592], [2088]])  # a nested list: refused as before
    for row in batch:
        for skip in (True, False):
            assert tok.decode(row, skip_special_tokens=skip) == ref.decode(row.tolist(), skip_special_tokens=skip)
    assert tok.decode(torch.tensor([7592, 2088])) == "hello world"
    assert tok.decode(np.array(7592)) == tok.decode(7592) == "hello"  # one id, 0-D


# ------------------------------------------------------------------------------------ TextStream
@pytest.mark.parametrize("bad", [None, "x", 3])
def test_text_stream_needs_a_tokenizer(model_dir, bad):
    """TextStream(None) / TextStream("x") were accepted and failed at the first push with an
    AttributeError."""
    with pytest.raises(TypeError, match=r"tokenizer: expected a transformer_core.Tokenizer, got "):
        TextStream(bad)
    with pytest.raises(TypeError, match="tokenizer"):
        TextStream(_backend(model_dir))  # the tokenizers package's own object is not one either
    stream = TextStream(tc.Tokenizer.from_pretrained(MODEL_NAME))
    assert stream.push(7592) + stream.finish() == "hello"


# ------------------------------------------------------------------------------------ batches
@pytest.mark.parametrize("method", ["encode_batch", "encode_batches"])
def test_a_non_str_item_is_named_by_index_and_type(method):
    """The message said "expected a list of str, got list" for a list with one bad item."""
    tok = tc.Tokenizer.from_pretrained(MODEL_NAME)

    def call(texts):
        return tok.encode_batch(texts) if method == "encode_batch" else tok.encode_batches(texts, 2)

    for texts, got in ((["a", 3, None], "int at index 1"), (("a", "b", b"c"), "bytes at index 2"),
                       ([None], "NoneType at index 0")):
        with pytest.raises(TypeError, match=f"texts: expected a list of str, got {got}"):
            call(texts)
    with pytest.raises(TypeError, match="texts: expected a list of str, got str"):
        call("a")


def _backend_changes():
    """Changes made through a backend after a Tokenizer was built on it, each applied to the
    Tokenizer's backend and to a reference backend alike."""
    from tokenizers import normalizers

    def truncate_left(b):
        b.enable_truncation(max_length=6, direction="left")

    def cased(b):
        b.normalizer = normalizers.BertNormalizer(lowercase=False)

    def set_unk(b):
        b.model.unk_token = "[MASK]"  # changed in place: an object the copy shares

    def split_special(b):
        b.encode_special_tokens = True

    return [("add_tokens", lambda b: b.add_tokens(["zorblaxian"])), ("truncation", truncate_left),
            ("normalizer", cased), ("model in place", set_unk), ("special token", lambda b: b.add_special_tokens(["qq"])),
            ("encode_special_tokens", split_special), ("no post-processor", lambda b: setattr(b, "post_processor", None)),
            ("no truncation", lambda b: b.no_truncation())]


@pytest.mark.parametrize("make", [_backend, _uncopyable])
def test_encode_batches_sees_later_changes_of_the_backend(model_dir, make):
    """encode_batches (and so SentenceEncoder.encode) tokenized with a copy of the backend made on
    its first use: a token added through tokenizer.backend afterwards reached encode and
    encode_batch, not encode_batches ("zorblaxian" -> 30522 against 5 word pieces), nor did a
    truncation set there (10 ids against 4). Every change through the backend now reaches all
    three, as it reaches a reference backend changed the same way; the backend keeps padding."""
    tok = tc.Tokenizer(make(model_dir), 64)
    ref = make(model_dir)
    ref.enable_truncation(max_length=64)
    texts = ["my zorblaxian widget qq", "Hello WORLD, zorblaxian [SEP] qq!", "word " * 80]
    list(tok.encode_batches(texts, 2))  # the copy, if any, is made now
    for name, change in _backend_changes():
        change(tok.backend)
        change(ref)
        want = hf_encode(ref, texts)
        assert [tok.encode(t) for t in texts] == [e.ids for e in ref.encode_batch(texts)], name
        (batch,) = tok.encode_batches(texts, 3)
        for got in (tok.encode_batch(texts), batch):
            for key, w in zip(("input_ids", "attention_mask", "token_type_ids"), want):
                np.testing.assert_array_equal(got[key], w, err_msg=f"after {name}: {key}")
        assert tok.backend.padding is not None, name
    assert tok.token_to_id("zorblaxian") == 30522 and 30522 in tok.encode(texts[0])  # the first change holds


def test_encode_batches_copy_follows_setters_and_shallow_copies(model_dir):
    """encode_batches' unpadded copy is brought up to date only when the backend may have changed
    (_BackendWatch): after the truncation_side and max_length setters, and after a change made
    through the backend property. Each batch equals a reference backend changed the same way; a
    pickled round trip keeps it. (copy.copy now gives the copy its own backend: a change through
    the copy's backend does not reach this one.)"""
    import copy
    import pickle

    tok = tc.Tokenizer(_backend(model_dir), 8)
    texts = ["one two three four five six seven eight nine ten qq", "a short qq one"]
    list(tok.encode_batches(texts, 2))  # the copy is made now

    def check(ref, what):
        (batch,) = tok.encode_batches(texts, 2)
        for key, w in zip(("input_ids", "attention_mask", "token_type_ids"), hf_encode(ref, texts)):
            np.testing.assert_array_equal(batch[key], w, err_msg=f"after {what}: {key}")

    ref = _backend(model_dir)
    tok.truncation_side = "left"
    ref.enable_truncation(max_length=8, direction="left")
    check(ref, "truncation_side = left")
    tok.max_length = 6
    ref.enable_truncation(max_length=6, direction="left")
    check(ref, "max_length = 6")
    shallow = copy.copy(tok)
    tok.backend.add_special_tokens(["qq"])
    ref.add_special_tokens(["qq"])
    check(ref, "a special token added through the backend")
    assert tok.token_to_id("qq") is not None and shallow.token_to_id("qq") is None
    tok = pickle.loads(pickle.dumps(tok))
    check(ref, "a pickle round trip")


def test_encode_batches_keeps_the_settings_it_started_with(model_dir):
    """encode_batches took the backend again for each TEXTS_PER_CALL texts, and the pad id for each
    batch: a max_length, truncation_side or pad_token set while its batches were taken (another
    thread's, or SentenceEncoder's max_seq_length) truncated the texts after the first 1024 the
    new way, and padded the later batches with the new id. Every batch of a call now equals the
    tokenizers package's under the settings the call started with; the next call has the new ones."""
    rng = np.random.default_rng(0)
    words = "the quick brown fox jumps over lazy dog threads race tensor".split()
    texts = [" ".join(rng.choice(words, int(rng.integers(1, 30)))) for _ in range(tc.Tokenizer.TEXTS_PER_CALL + 100)]
    tok = tc.Tokenizer(_backend(model_dir), 16)
    ref = _backend(model_dir)
    ref.enable_truncation(max_length=16)
    batches = tok.encode_batches(texts, 32)
    got = [next(batches)]
    tok.max_length, tok.truncation_side, tok.pad_token = 6, "left", "[MASK]"  # after the first batch
    got += list(batches)
    assert len(got) == len(range(0, len(texts), 32))
    for i, batch in enumerate(got):
        want = hf_encode(ref, texts[32 * i:32 * i + 32])  # padded with [PAD], id 0
        for key, w in zip(("input_ids", "attention_mask", "token_type_ids"), want):
            np.testing.assert_array_equal(batch[key], w, err_msg=f"batch {i}: {key}")
    ref.enable_truncation(max_length=6, direction="left")
    (batch,) = tok.encode_batches(texts[-40:], 40)
    ids, am, tt = hf_encode(ref, texts[-40:])
    np.testing.assert_array_equal(batch["input_ids"], np.where(am == 1, ids, 103))  # [MASK]
    np.testing.assert_array_equal(batch["attention_mask"], am)


def _check_one_batch_truncated_to(tok, texts, length):
    """encode_batches' one batch of ``texts`` equals encode_batch's, both ``length`` tokens wide."""
    (batch,) = tok.encode_batches(texts, len(texts))
    want = tok.encode_batch(texts)
    assert want["input_ids"].shape == (len(texts), length)
    for key in want:
        np.testing.assert_array_equal(batch[key], want[key], err_msg=key)


def test_encode_batches_copy_of_each_shallow_copy_follows_a_setter(model_dir):
    """Two shallow copies made before either tokenized: each has its own backend and unpadded copy,
    so a setter on one changes its own batches (brought up to date) and not the other's."""
    import copy

    a = tc.Tokenizer(_backend(model_dir), 8)
    b = copy.copy(a)
    texts = ["one two three four five six seven eight nine ten", "a short one"]
    list(a.encode_batches(texts, 2))
    list(b.encode_batches(texts, 2))
    a.max_length = 6
    list(b.encode_batches(texts, 2))  # b's copy brought up to date first
    _check_one_batch_truncated_to(a, texts, 6)
    _check_one_batch_truncated_to(b, texts, 8)
    b.max_length = 7
    _check_one_batch_truncated_to(b, texts, 7)
    _check_one_batch_truncated_to(a, texts, 6)


def test_encode_batches_copy_after_a_change_during_its_update(model_dir):
    """A setter that runs while encode_batches brings its copy up to date (another thread, here
    the trace hook just before the update is recorded) is not lost: the next call updates again
    (a flag cleared after the update lost it, and the copy kept the old truncation for good)."""

    tok = tc.Tokenizer(_backend(model_dir), 8)
    texts = ["one two three four five six seven eight nine ten", "a short one"]
    list(tok.encode_batches(texts, 2))
    tok.max_length = 7  # the next call updates the copy

    def between():  # between the update's reads and its record of them
        tok.max_length = 6

    _while_a_kept_copy_is_recorded(between, lambda: list(tok.encode_batches(texts, 2)))
    _check_one_batch_truncated_to(tok, texts, 6)


def _while_a_kept_copy_is_recorded(action, call):
    """Runs ``call()`` with ``action()`` run once inside it, just before ``_derived_backend`` records
    the copy it made (the line ``setattr(self, slot, (...``): another thread's setter at the worst
    moment, made deterministic by a trace hook."""
    import linecache
    import sys

    code = tc.tokenizer.Tokenizer._derived_backend.__code__
    fired = []

    def local(frame, event, arg):
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        if event == "line" and not fired and "setattr(self, slot, (" in line:
            fired.append(True)
            action()
        return local

    sys.settrace(lambda frame, event, arg: local if frame.f_code is code else None)
    try:
        call()
    finally:
        sys.settrace(None)
    assert fired, "the hook never ran: _derived_backend's recording line changed"


def test_pickle_and_deepcopy_keep_encode_special_tokens(model_dir):
    """The tokenizers package pickles a backend as its JSON, which leaves out
    encode_special_tokens: a pickled or deep-copied Tokenizer encoded "[MASK]" as the special token
    again (one id) where the original split it as text. Both backends' flags travel now."""
    import copy
    import pickle

    tok = tc.Tokenizer(_backend(model_dir), 64)
    list(tok.encode_batches(["x"], 1))  # the unpadded copy exists
    tok.backend.encode_special_tokens = True
    want = tok.encode("a [MASK] b")
    assert len(want) > 5  # "[MASK]" split as text
    for other in (pickle.loads(pickle.dumps(tok)), copy.deepcopy(tok)):
        assert other.encode("a [MASK] b") == want
        (batch,) = other.encode_batches(["a [MASK] b"], 1)
        assert batch["input_ids"][0].tolist() == want


def test_encode_batches_of_a_causal_tokenizer_sees_added_tokens():
    """A causal-LM tokenizer's backend does not pad: encode_batches tokenizes with it directly, so
    tokens added later are used, as by encode and the reference backend."""
    tok = tc.Tokenizer(sentencepiece_tokenizer(), None)
    ref = sentencepiece_tokenizer()
    texts = ["Hello world zz", "the zz of foo"]
    list(tok.encode_batches(texts, 2))
    for backend in (tok.backend, ref):
        backend.add_tokens(["zz"])
    want = [e.ids for e in ref.encode_batch(texts)]
    (batch,) = tok.encode_batches(texts, 2)
    assert [row[mask == 1].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])] == want
    assert [tok.encode(t) for t in texts] == want and want[0][-1] == ref.token_to_id("zz")


def test_a_deep_copy_tokenizes_with_its_own_backend():
    """copy.deepcopy of a Tokenizer whose encode_batches ran (quantize copies an encoder's
    tokenizer): a token added to the copy's backend reaches the copy's encode_batches only."""
    import copy

    tok = tc.Tokenizer.from_pretrained(MODEL_NAME)
    text = ["my zorblaxian widget"]
    before = next(tok.encode_batches(text, 1))["input_ids"].tolist()
    twin = copy.deepcopy(tok)
    twin.backend.add_tokens(["zorblaxian"])
    assert next(twin.encode_batches(text, 1))["input_ids"].tolist() == [twin.encode(text[0])]
    assert twin.encode(text[0])[2] == 30522
    assert next(tok.encode_batches(text, 1))["input_ids"].tolist() == before == [tok.encode(text[0])]
    assert 30522 not in before[0]


# ------------------------------------------------------------------------------------ file paths
def test_a_file_that_is_not_gguf(model_dir):
    """A path to tokenizer.json was read as a GGUF: with max_length it was said to hold a causal-LM
    tokenizer. The GGUF magic is checked first, and the message says what a file path must be."""
    path = model_dir / "tokenizer.json"
    for kwargs in ({}, {"max_length": 128}):
        with pytest.raises(ValueError, match=r"not a GGUF file .*a file path must be a GGUF checkpoint "
                                             r"\(for a tokenizer.json, pass the directory") as info:
            tc.Tokenizer.from_pretrained(path, **kwargs)
        assert "causal" not in str(info.value) and str(path) in str(info.value)
    tok = tc.Tokenizer.from_pretrained(path.parent, max_length=128)  # its directory loads
    assert tok.encode("hello world") == [101, 7592, 2088, 102]


# ------------------------------------------------------------------------------------ do_lower_case
@pytest.fixture
def cased_dir(tmp_path, tiny_model_dir):
    """The tiny BERT with a case-sensitive copy of all-MiniLM-L6-v2's tokenizer.json (its
    normalizer's lowercase off, a tokenizer_config.json that says so) and a
    sentence_bert_config.json with do_lower_case true."""
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model_dir / name, tmp_path / name)
    spec = json.loads((tiny_model_dir / "tokenizer.json").read_text())
    spec["normalizer"]["lowercase"] = False
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    # without it transformers' BERT tokenizer (and so ours) lowercases whatever tokenizer.json says
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": True}))
    return tmp_path


TEXTS_CASED = ["Hello World", "hello world", "HELLO WORLD", "The Eiffel Tower is in PARIS.", "Straße ÖL İstanbul",
               "MiXeD CaSe " * 30, "ΟΔΟΣ [MASK] Hi"]  # (str.lower() would give "[mask]", not the special token)


def _reference_ids(cased_dir, texts, max_length=64):
    """sentence-transformers 6 with do_lower_case: the (case-sensitive) Hugging Face tokenizer with
    ``Lowercase()`` prepended to its normalizer (its ``Sequence([Lowercase(), ...])``, not
    ``str.lower()``: special tokens typed in a text are matched before it), truncating to
    max_seq_length. Returns that tokenizer and the ids of ``texts``."""
    from tokenizers import Tokenizer, normalizers

    ref = Tokenizer.from_file(str(cased_dir / "tokenizer.json"))
    ref.normalizer = normalizers.Sequence([normalizers.Lowercase(), ref.normalizer])
    ref.no_padding()
    ref.enable_truncation(max_length=max_length)
    return ref, [ref.encode(t).ids for t in texts]


def test_do_lower_case_from_sentence_bert_config(cased_dir):
    """sentence_bert_config.json's "do_lower_case": true was ignored: with a case-sensitive
    tokenizer.json "Hello World" and "hello world" gave different ids."""
    from tokenizers import Tokenizer

    ref, want = _reference_ids(cased_dir, TEXTS_CASED)
    cased = Tokenizer.from_file(str(cased_dir / "tokenizer.json"))
    assert cased.encode("Hello World").ids != cased.encode("hello world").ids  # the tokenizer is case-sensitive
    tok = tc.Tokenizer.from_pretrained(cased_dir)
    assert tok.do_lower_case is True and tok.max_length == 64
    assert tok.encode("Hello World") == tok.encode("hello world") == want[0]
    for text, ids in zip(TEXTS_CASED, want):
        assert tok.encode(text) == ids, text
        assert tok.tokenize(text, add_special_tokens=True) == ref.encode(text).tokens, text
    want_ids, want_mask, _ = hf_encode(ref, TEXTS_CASED)
    batch = tok.encode_batch(TEXTS_CASED)
    np.testing.assert_array_equal(batch["input_ids"], want_ids)
    np.testing.assert_array_equal(batch["attention_mask"], want_mask)
    for b, got in enumerate(tok.encode_batches(TEXTS_CASED, 4)):
        ids, mask, _ = hf_encode(ref, TEXTS_CASED[4 * b:4 * b + 4])
        np.testing.assert_array_equal(got["input_ids"], ids)
        np.testing.assert_array_equal(got["attention_mask"], mask)


def test_do_lower_case_false_or_absent_keeps_case(cased_dir):
    ref, _ = _reference_ids(cased_dir, [])
    ref.normalizer = ref.normalizer[1]  # the file's own normalizer, without _reference_ids' Lowercase()
    for config in ({"max_seq_length": 64}, {"max_seq_length": 64, "do_lower_case": False}):
        (cased_dir / "sentence_bert_config.json").write_text(json.dumps(config))
        tok = tc.Tokenizer.from_pretrained(cased_dir)
        assert tok.do_lower_case is False
        assert tok.encode("Hello World") == ref.encode("Hello World").ids != ref.encode("hello world").ids
    for bad in ("true", 1, None):
        (cased_dir / "sentence_bert_config.json").write_text(json.dumps({"do_lower_case": bad}))
        with pytest.raises(ValueError, match=r"sentence_bert_config.json: do_lower_case: expected a bool") as info:
            tc.Tokenizer.from_pretrained(cased_dir)
        assert str(cased_dir) in str(info.value)


def test_sentence_encoder_lowercases_with_do_lower_case(cased_dir):
    """SentenceEncoder.from_pretrained on such a folder embeds "Hello World" as sentence-transformers
    does: transformers' BertModel on the lowercased text's ids, mean-pooled and normalised."""
    from transformers import BertModel

    ref, _ = _reference_ids(cased_dir, [])
    texts = ["Hello World", "hello world", "The Eiffel Tower is in PARIS."]
    ids, mask, types = hf_encode(ref, texts)
    hf = BertModel.from_pretrained(str(cased_dir), attn_implementation="eager").eval()
    want = hf_mean_pool(hf, ids, mask, types)
    got = tc.SentenceEncoder.from_pretrained(cased_dir, dtype=np.float64).encode(texts, normalize=True)
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(got[0], got[1], atol=1e-12)


def test_text_stream_after_a_context_reads_the_ids_where_they_stand():
    """``text_stream(context=prompt ids)``: the pieces are decode(prompt + ids) past decode(prompt),
    so a decoder that strips a text's leading space (Llama 2's) keeps the space before the first new
    word, which the stream of the new ids alone drops."""
    backend = sentencepiece_tokenizer()
    tok = tc.Tokenizer(backend, 64)
    prompt, new = backend.encode("Hello").ids, backend.encode("world foo bar").ids
    full, base = backend.decode(prompt + new), backend.decode(prompt)
    stream = tok.text_stream(context=prompt)
    assert "".join(stream.push(i) for i in new) + stream.finish() == full[len(base):] == " world foo bar"
    alone = tok.text_stream()
    assert "".join(alone.push(i) for i in new) + alone.finish() == "world foo bar"  # the space lost
    with pytest.raises(ValueError, match="^context: "):
        tok.text_stream(context=[10**6])
    with pytest.raises(TypeError, match="^context: "):
        tok.text_stream(context=5)


# ------------------------------------------------------------------------------------ TextStream: held text
def _byte_fallback_backend():
    """A tiny Llama-2-style ``tokenizers.Tokenizer``: BPE with ``byte_fallback`` (the 256 ``<0xNN>``
    tokens at ids 3-258), a few "▁word" merges, and Llama 2's decoder (Replace, ByteFallback, Fuse,
    Strip of the leading space); ``<unk>``/``<s>``/``</s>`` at ids 0-2."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    merges = [("▁", "H"), ("▁H", "i"), ("▁", "w"), ("▁w", "o"), ("l", "l"), ("▁", "é")]
    for piece in ["▁", "H", "i", "w", "o", "l", "e", "a", "é", "€"] + ["".join(m) for m in merges]:
        vocab.setdefault(piece, len(vocab))
    backend = HFTokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    backend.add_special_tokens(["<unk>", "<s>", "</s>"])
    return backend


def _byte_level_backend():
    """A tiny GPT-2-style ``tokenizers.Tokenizer``: byte-level BPE (the 256 byte symbols, a few
    merges), ``<|endoftext|>`` special at id 256."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|endoftext|>"] = len(vocab)
    merges = [("Ġ", "w"), ("Ġw", "o"), ("H", "i")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    backend = HFTokenizer(models.BPE(vocab, merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<|endoftext|>"])
    return backend


def _streamed(tok, context, ids, skip=True):
    """(the pieces of a stream over ``ids`` after ``context``, its finish)."""
    stream = tok.text_stream(context=context, skip_special_tokens=skip)
    return [stream.push(i) for i in ids], stream.finish()


def _text_after(backend, context, ids, skip=True):
    """The reference: ``decode(context + ids)`` past its longest common prefix with
    ``decode(context)`` (the tokenizers package's decode of the whole sequence)."""
    base, full = backend.decode(context, skip_special_tokens=skip), backend.decode(context + ids, skip_special_tokens=skip)
    k = 0
    while k < min(len(base), len(full)) and base[k] == full[k]:
        k += 1
    return full[k:]


def test_text_stream_holds_a_run_of_byte_tokens_that_a_later_byte_rewrites():
    """Ids giving the valid byte ``f``, then a lone continuation byte 0xBA, then a word: the
    tokenizers package decodes the byte run as a whole, invalid, so as two U+FFFD (the ``f`` too).
    ``DecodeStream`` had returned ``f`` and then raised a bare ``Exception: Invalid prefix`` at the
    word; the stream now holds an open run of byte tokens and returns the decode's text."""
    backend = _byte_fallback_backend()
    tok = tc.Tokenizer(backend, 64)
    ids = [backend.token_to_id(t) for t in ("<0x66>", "<0xBA>", "▁H")]
    assert backend.decode(ids[:1]) == "f" and backend.decode(ids) == "\ufffd\ufffd H"
    assert _streamed(tok, [], ids) == (["", "", "\ufffd\ufffd H"], "")
    # an invalid run that generation stops in: the text comes with finish, as decode reads it (it
    # had streamed "=\x16\x17" for the run's valid head, then one U+FFFD per byte of the rest)
    run = [backend.token_to_id(f"<0x{b:02X}>") for b in (0x3D, 0x16, 0x17, 0x83, 0x3F, 0x83)]
    assert backend.decode(run) == "\ufffd" * 6
    assert _streamed(tok, [], run) == ([""] * 6, "\ufffd" * 6)
    # a valid run: an emoji of four byte tokens comes whole when a word closes the run
    emoji = backend.encode("😀 Hi", add_special_tokens=False).ids
    assert [backend.id_to_token(i) for i in emoji] == ["▁", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>", "▁Hi"]
    assert _streamed(tok, [], emoji) == (["", "", "", "", "", "😀 Hi"], "")
    assert _streamed(tok, [], emoji[:-1]) == ([""] * 5, "😀")
    # a special token skipped inside a run neither closes it nor lets the valid head out
    eos = backend.token_to_id("</s>")
    assert _streamed(tok, [], [ids[0], eos, ids[1], ids[2]]) == (["", "", "", "\ufffd\ufffd H"], "")
    assert _streamed(tok, [], [ids[0], eos], skip=False) == (["", "f</s>"], "")


@pytest.mark.parametrize("which", ["byte_level", "byte_fallback"])
def test_text_stream_after_a_context_that_ends_inside_a_character(which):
    """A context whose text ends inside a character ("Hi 中 wo" cut after the first or second of
    中's three bytes): the first piece repeated the context's text ("Hi 中" for "中"). Only what the
    new ids add comes now, for a byte-level vocabulary and a byte-fallback one (whose byte run is
    held until the word after it closes it)."""
    backend = _byte_level_backend() if which == "byte_level" else _byte_fallback_backend()
    tok = tc.Tokenizer(backend, 64)
    ids = backend.encode("Hi 中 wo", add_special_tokens=False).ids
    cuts = [k for k in range(1, len(ids)) if backend.decode(ids[:k]).endswith("\ufffd")]
    assert len(cuts) == 2 and backend.decode(ids[:cuts[0]]) == "Hi \ufffd"
    for cut in cuts:
        pieces, tail = _streamed(tok, ids[:cut], ids[cut:])
        assert "".join(pieces) + tail == "中 wo" == _text_after(backend, ids[:cut], ids[cut:])
        assert pieces[-1] == (" wo" if which == "byte_level" else "中 wo") and tail == ""
        # the cut bytes followed by a word: they stay the context's U+FFFD, the word alone is new
        word = ids[-1:]  # " wo": one token
        assert "".join(_streamed(tok, ids[:cut], word)[0]) == " wo" == _text_after(backend, ids[:cut], word)
        # a long context (cut to a window in front of the new ids): the same
        long = backend.encode("Hi wo " * 40, add_special_tokens=False).ids + ids[:cut]
        assert len(long) > 2 * TextStream._CONTEXT_IDS  # long enough to be cut
        pieces, tail = _streamed(tok, long, ids[cut:])
        assert "".join(pieces) + tail == "中 wo" == _text_after(backend, long, ids[cut:])


def test_text_stream_keeps_a_long_contexts_open_run_of_byte_tokens():
    """A long context is cut to a window in front of the new ids, never inside the run of byte
    tokens it ends with: a lone 0xBA at the head of the run makes the whole run U+FFFD (one per
    byte), 中 after 中 or ASCII bytes included, once an id past the run closes it; with a skipped
    special token inside the run, and with a byte-level tokenizer whose character is split by
    special tokens. Nor where the window would have no text (a Strip decoder would eat the space
    of the next word)."""
    backend = _byte_fallback_backend()
    tok = tc.Tokenizer(backend, 64)
    words = backend.encode("Hi wo " * 8, add_special_tokens=False).ids
    zhong = backend.encode("中" * 8, add_special_tokens=False).ids[1:]  # 24 byte tokens
    bad, eos, word = backend.token_to_id("<0xBA>"), backend.token_to_id("</s>"), backend.token_to_id("▁wo")
    ascii_ = [backend.token_to_id("<0x78>")] * 24  # "x" each, valid alone
    for run in (zhong, zhong[:5] + [eos] + zhong[5:], ascii_):
        context, new = words + [bad] + run[:-1], run[-1:] + [word]
        want = _text_after(backend, context, new)
        assert want == "\ufffd" + " wo"  # the run's last byte, and the word
        pieces, tail = _streamed(tok, context, new)
        assert pieces == ["", want] and tail == ""
    backend = _byte_level_backend()
    tok = tc.Tokenizer(backend, 64)
    words = backend.encode("Hi wo " * 8, add_special_tokens=False).ids
    zhong, eos = backend.encode("中", add_special_tokens=False).ids, backend.token_to_id("<|endoftext|>")
    context, new = words + zhong[:1] + [eos] * 40 + zhong[1:2], zhong[2:] + [eos]
    assert _text_after(backend, context, new) == "中" == "".join(_streamed(tok, context, new)[0])
    for backend, word in ((_byte_fallback_backend(), "▁wo"), (sentencepiece_tokenizer(), "▁world")):
        tok = tc.Tokenizer(backend, 64)
        context = backend.encode(word.replace("▁", " ") * 8, add_special_tokens=False).ids
        context += [backend.token_to_id("</s>")] * 40
        new = [backend.token_to_id(word)]
        assert _text_after(backend, context, new) == word.replace("▁", " ") == "".join(_streamed(tok, context, new)[0])


def _stream_cases(backends):
    """A hypothesis strategy of (backend name, context ids, new ids, skip_special_tokens)."""
    from hypothesis import strategies as st

    letters = st.sampled_from(list("Hi wo le") + ["é", "€", "😀", "中", "  ", "\n"])
    texts = st.lists(letters, min_size=1, max_size=40).map("".join)

    @st.composite
    def case(draw):
        name = draw(st.sampled_from(sorted(backends)))
        backend = backends[name]
        if draw(st.booleans()):  # any ids: invalid byte runs, special tokens anywhere
            ids = draw(st.lists(st.integers(0, backend.get_vocab_size() - 1), min_size=1, max_size=80))
        else:
            ids = backend.encode(draw(texts), add_special_tokens=draw(st.booleans())).ids
        cut = draw(st.integers(0, len(ids)))
        return name, ids[:cut], ids[cut:], draw(st.booleans())

    return case()


def test_text_stream_is_the_decode_of_the_whole_sequence():
    """Property: for a byte-level, a byte-fallback and a SentencePiece (Strip) tokenizer, any ids
    after any context (long ones included), special tokens skipped or not: the pieces and finish
    join to the decode of ``context + ids`` past the context's text, each prefix of the pieces is a
    prefix of the text decoded so far (nothing returned is rewritten later), and nothing raises."""
    from hypothesis import HealthCheck, given, settings

    backends = {"byte_level": _byte_level_backend(), "byte_fallback": _byte_fallback_backend(),
                "sentencepiece": sentencepiece_tokenizer()}
    toks = {name: tc.Tokenizer(b, 64) for name, b in backends.items()}

    @settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(_stream_cases(backends))
    def check(case):
        name, context, ids, skip = case
        backend = backends[name]
        stream = toks[name].text_stream(context=context, skip_special_tokens=skip)
        sofar = ""
        for k, i in enumerate(ids, 1):
            sofar += stream.push(i)
            assert _text_after(backend, context, ids[:k], skip).startswith(sofar)
        want = _text_after(backend, context, ids, skip)
        assert sofar + stream.finish() == want
        base, full = backend.decode(context, skip_special_tokens=skip), backend.decode(context + ids, skip_special_tokens=skip)
        if full.startswith(base):
            assert want == full[len(base):]
        if ids:  # finish reset the stream: no context now
            assert stream.push(ids[0]) + stream.finish() == backend.decode(ids[:1], skip_special_tokens=skip)

    check()


# ------------------------------------------------------------------ what the backend is given
def test_split_special_tokens_of_a_transformers_tokenizer_is_kept(model_dir):
    """transformers' split_special_tokens=True sets the backend's encode_special_tokens, a runtime
    flag that the JSON copy dropped: "[MASK]" became the special id 103 where transformers splits
    it into "[", "mask", "]". The copy keeps the flag: the ids are transformers'."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(model_dir), split_special_tokens=True)
    tok = tc.Tokenizer(hf.backend_tokenizer, 256)
    assert tok.encode("x [MASK] y") == hf("x [MASK] y")["input_ids"] == [101, 1060, 1031, 7308, 1033, 1061, 102]
    np.testing.assert_array_equal(tok.encode_batch(["x [MASK] y", "z"])["input_ids"][0],
                                  hf(["x [MASK] y", "z"], padding=True)["input_ids"][0])
    plain = tc.Tokenizer(AutoTokenizer.from_pretrained(str(model_dir)).backend_tokenizer, 256)
    assert plain.encode("x [MASK] y") == [101, 1060, 103, 1061, 102]


def test_encoder_tokenizer_names_its_unknown_and_padding_tokens(model_dir):
    """from_pretrained gave an encoder tokenizer no unknown token (unk_token None, transformers'
    is "[UNK]", id 100); a pad_token outside the vocabulary stayed pad_token while id 0 padded."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(model_dir))
    tok = tc.Tokenizer.from_pretrained(model_dir)
    assert (tok.unk_token, tok.unk_token_id) == (hf.unk_token, hf.unk_token_id) == ("[UNK]", 100)
    odd = tc.Tokenizer(_backend(model_dir), 16, pad_token="<pad>")
    assert (odd.pad_token, odd.pad_token_id) == ("[PAD]", 0) and odd.token_to_id(odd.pad_token) == 0


def test_encoder_special_tokens_equal_transformers(model_dir):
    """all-MiniLM-L6-v2: transformers' all_special_ids lists [UNK], [SEP], [PAD], [CLS], [MASK] in
    that order (its named tokens' order), not the added tokens by id."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(model_dir))
    tok = tc.Tokenizer.from_pretrained(model_dir)
    assert tok.all_special_tokens == hf.all_special_tokens == ["[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]"]
    assert tok.all_special_ids == hf.all_special_ids == [100, 102, 0, 101, 103]
    assert (tok.sep_token, tok.cls_token, tok.mask_token) == ("[SEP]", "[CLS]", "[MASK]")
    assert tok.special_tokens == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # the backend's, by id


def test_named_special_tokens_of_the_constructor(model_dir):
    tok = tc.Tokenizer(_backend(model_dir), 16, cls_token="[CLS]", sep_token="[SEP]",
                       extra_special_tokens=["[MASK]", "[CLS]", "hello"])
    assert tok.all_special_tokens == ["[SEP]", "[PAD]", "[CLS]", "[MASK]", "hello"]
    assert tok.all_special_ids == [102, 0, 101, 103, 7592]
    assert tc.Tokenizer(_backend(model_dir), 16, pad_token=None).all_special_ids == []
    with pytest.raises(TypeError, match="^mask_token: expected a str or None, got int$"):
        tc.Tokenizer(_backend(model_dir), 16, mask_token=103)
    with pytest.raises(ValueError, match="^sep_token: '<sep>' is not in the vocabulary$"):
        tc.Tokenizer(_backend(model_dir), 16, sep_token="<sep>")
    with pytest.raises(TypeError, match="^extra_special_tokens: expected a list of str or None, got str$"):
        tc.Tokenizer(_backend(model_dir), 16, extra_special_tokens="[MASK]")
    with pytest.raises(TypeError, match=r"^extra_special_tokens\[1\]: expected a str, got int$"):
        tc.Tokenizer(_backend(model_dir), 16, extra_special_tokens=["[MASK]", 3])
    with pytest.raises(ValueError, match=r"^extra_special_tokens\[0\]: '<x>' is not in the vocabulary$"):
        tc.Tokenizer(_backend(model_dir), 16, extra_special_tokens=["<x>"])


def test_text_stream_push_names_token_id(model_dir):
    stream = tc.Tokenizer.from_pretrained(model_dir).text_stream()
    with pytest.raises(TypeError, match="^token_id: expected int token ids, got str"):
        stream.push("a")
    with pytest.raises(ValueError, match=r"^token_id: token id -1 is outside the vocabulary \[0, 30522\)"):
        stream.push(-1)


# ------------------------------------------------------------------------------------ sizes no machine can hold
_TEXTS = ["hi", "hello there my friend", "word " * 40]


@pytest.mark.parametrize("padding", [{"direction": "left"}, {"pad_to_multiple_of": 8}, {"length": 24},
                                     {"pad_id": 100, "pad_type_id": 1}, {"length": 20, "pad_to_multiple_of": 8}])
def test_encode_batch_pads_as_the_backend_is_set_to_pad(model_dir, padding):
    """An encoder tokenizer's batch is padded here now, from the unpadded encodings (the package's
    own padding aborted the process when it ran out of memory): as the tokenizers package pads
    with the same settings on the backend (side, pad id and type id, fixed length, multiple)."""
    tok = tc.Tokenizer(_backend(model_dir), 16)
    ref = _backend(model_dir)
    ref.enable_truncation(max_length=16)
    settings = {**tok.backend.padding, **padding}
    tok.backend.enable_padding(**settings)
    ref.enable_padding(**settings)
    want = ref.encode_batch(_TEXTS)
    got = tok.encode_batch(_TEXTS)
    for key, attr in (("input_ids", "ids"), ("attention_mask", "attention_mask"), ("token_type_ids", "type_ids")):
        np.testing.assert_array_equal(got[key], np.array([getattr(e, attr) for e in want], dtype=np.int64),
                                      err_msg=key)
        assert got[key].dtype == np.int64
    assert tok.backend.padding == settings  # left as it was set


def test_encode_batch_pads_no_row_past_the_longest_beyond_a_fixed_length(model_dir):
    """Rows longer than the backend's fixed padding length (here all 16 tokens, length 10, multiple
    3): the package rounds the fixed length (to 12) and leaves longer rows as they are, so the batch
    stays 16 wide; our padding rounded the longest row instead (18 columns of which 2 padding)."""
    tok = tc.Tokenizer(_backend(model_dir), 16)
    ref = _backend(model_dir)
    ref.enable_truncation(max_length=16)
    settings = {**tok.backend.padding, "length": 10, "pad_to_multiple_of": 3}
    tok.backend.enable_padding(**settings)
    ref.enable_padding(**settings)
    texts = ["word " * 40, "other " * 40]
    got = tok.encode_batch(texts)
    np.testing.assert_array_equal(got["input_ids"], np.array([e.ids for e in ref.encode_batch(texts)]))
    assert got["input_ids"].shape == (2, 16) and got["attention_mask"].all()


_THREADED_UNCOPYABLE = """
import sys, threading
import transformer_core as tc
from tokenizers import Tokenizer, pre_tokenizers

class Split:
    def pre_tokenize(self, pretok):
        pretok.split(lambda i, s: s.split(" ", "removed"))

backend = Tokenizer.from_file(sys.argv[1])
backend.no_padding()
tok = tc.Tokenizer(backend, 256)
tok.backend.pre_tokenizer = pre_tokenizers.PreTokenizer.custom(Split())
tok.backend.enable_padding(**{**tok.backend.padding, "length": 64})
texts = ["a b c d"] * 50 + ["hello " * 30]
shapes, errors = [], []

def run():
    for _ in range(15):
        try:
            shapes.append(tok.encode_batch(texts)["input_ids"].shape)
        except Exception as e:
            errors.append(repr(e))

threads = [threading.Thread(target=run) for _ in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(sorted(set(shapes)), len(shapes), errors, tok.backend.padding["length"])
"""


def test_encode_batch_of_an_uncopyable_backend_from_threads(model_dir):
    """A backend with a part written in Python cannot be copied unpadded; encode_batch switched its
    padding off around each call, so another thread's call read no padding (rows of 32, not the
    fixed 64: 25 of 60 calls) or deadlocked (a custom pre-tokenizer needs the GIL that the thread
    switching padding back on held). It pads itself there again, from any number of threads. In a
    child process: a deadlock holds the GIL, so only a timeout from outside can end it."""
    import subprocess
    import sys

    try:
        run = subprocess.run([sys.executable, "-c", _THREADED_UNCOPYABLE, str(model_dir / "tokenizer.json")],
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("encode_batch from three threads deadlocked")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[(51, 64)] 45 [] 64"


def test_a_batch_too_large_to_pad_is_refused_before_padding(model_dir):
    """A batch whose padded arrays no machine could hold was padded by the tokenizers package (an
    encoder tokenizer's: Rust aborted the whole process, "memory allocation ... failed", or
    panicked) or by numpy (a causal-LM tokenizer's: MemoryError for 29.8 GiB). Refused now with
    ValueError naming texts, the shape and the bytes, before anything is padded: here by a fixed
    padding length set on the backend, 2 texts to 2**62 tokens, which allocates nothing."""
    from transformer_core._validation import physical_memory_bytes

    tok = tc.Tokenizer(_backend(model_dir), 16)
    length = 2**62
    need = 3 * 2 * length * 8  # input_ids, attention_mask and token_type_ids, int64
    assert need > physical_memory_bytes()
    tok.backend.enable_padding(**{**tok.backend.padding, "length": length})
    texts = ["hello there", "my friend"]
    with pytest.raises(ValueError, match=rf"^texts: padding 2 texts to {length} tokens \(the longest has 4\) needs "
                                         rf"three int64 arrays of shape \(2, {length}\), {need} bytes, more than "):
        tok.encode_batch(texts)
    with pytest.raises(ValueError, match=rf"^texts: padding 2 texts to {length} tokens"):
        tok(texts)
    tok.backend.enable_padding(**{**tok.backend.padding, "length": None})  # the tokenizer still works
    np.testing.assert_array_equal(tok.encode_batch(texts)["input_ids"], [[101, 7592, 2045, 102], [101, 2026, 2767, 102]])


def test_the_padding_check_names_the_batch_of_encode_batches(model_dir, monkeypatch):
    """The same check names the batch's texts in encode_batches, and guards a causal-LM
    tokenizer's encode_batch (padded here, never by the package): a machine of 300 bytes, so
    that a short batch exceeds it."""
    from transformer_core import tokenizer as tokenizer_module

    monkeypatch.setattr(tokenizer_module, "physical_memory_bytes", lambda: 300)
    tok = tc.Tokenizer(_backend(model_dir), 16)
    batches = tok.encode_batches(["a", "hi there", "word " * 40], 2)
    assert next(batches)["input_ids"].shape == (2, 4)  # 3 × 2 × 4 × 8 = 192 bytes: fits
    with pytest.raises(ValueError, match=r"^texts\[2:3\]: padding 1 texts to 16 tokens needs three int64 arrays of "
                                         r"shape \(1, 16\), 384 bytes, more than this machine's memory \(300 bytes\)"):
        next(batches)
    causal = tc.Tokenizer(_backend(model_dir), None)
    n = len(causal.encode("word " * 40))
    with pytest.raises(ValueError, match=rf"^texts: padding 2 texts to {n} tokens needs three int64 arrays of shape "
                                         rf"\(2, {n}\), {3 * 2 * n * 8} bytes, more than this machine's memory"):
        causal.encode_batch(["a", "word " * 40])


def test_decode_of_more_ids_than_memory_can_list(model_dir):
    """decode and text_stream(context=...) of a broadcast array of 2**45 ids (one value held) or of
    a range as long raised a bare MemoryError from listing them. Refused now with ValueError naming
    ids, expected at most memory / 112 ids (what a decode's copy and lists take an id, measured), before any
    list is made. A count under memory / 16 but over memory / 105 passed an earlier check and then ran the
    process out of memory."""
    from transformer_core._validation import physical_memory_bytes

    tok = tc.Tokenizer.from_pretrained(MODEL_NAME)
    n = 2**45
    limit = physical_memory_bytes()
    assert n * 16 > limit
    want = rf"ids: expected at most {limit // 112} token ids \(their lists take 112 bytes an id; this machine has " \
           rf"{limit} bytes\), got {n}$"
    for ids in (np.broadcast_to(np.int64(7592), (n,)), torch.tensor([7592]).expand(n), range(n)):
        with pytest.raises(ValueError, match="^" + want):
            tok.decode(ids)
        with pytest.raises(ValueError, match="^context: " + want):
            tok.text_stream(context=ids)
    assert tok.decode(np.broadcast_to(np.int64(7592), (2,))) == "hello hello"  # a small one decodes
    assert tok.decode(range(7592, 7594)) == tok.decode([7592, 7593])
    assert tok.decode(range(0)) == tok.decode([]) == ""  # an empty range was a TypeError (a float64 array)
    with pytest.raises(ValueError, match=rf"^context: ids: expected at most {limit // 112} token ids .* got {2**70}$"):
        tok.text_stream(context=range(2**70))  # len() of it raised OverflowError
    n = limit // 16 - 1  # passed the old check; its lists would take about 105 bytes an id
    with pytest.raises(ValueError, match=rf"^ids: expected at most {limit // 112} token ids .* got {n}$"):
        tok.decode(np.broadcast_to(np.int64(7592), (n,)))


# ------------------------------------------------------------------ transformers' defaults and assignments
def _hf_minilm(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


_PAD_TEXTS = ["a", "a b", "time flies like an arrow", "word " * 300]


def _assert_pads_as(ours, hf, texts=_PAD_TEXTS):
    """encode_batch, __call__ and encode_batches (one batch) equal transformers' padded batch."""
    want = hf(texts, padding=True, truncation=True, max_length=ours.max_length, return_tensors="np")
    (batch,) = ours.encode_batches(texts, len(texts))
    for got in (ours.encode_batch(texts), ours(texts), batch):
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
            assert got[key].dtype == np.int64


def test_pad_token_assignment_pads_every_batch_as_transformers(model_dir):
    """pad_token / pad_token_id were plain attributes: ``pad_token = "[MASK]"`` left pad_token_id 0
    and the padding 0 (transformers: 103, padding 103), and ``pad_token_id = 103`` changed
    encode_batches' padding but not encode_batch's. Each now sets the other and every padding path
    (the backend's padding too), as transformers' assignments do."""
    import copy
    import pickle

    ours, hf = tc.Tokenizer.from_pretrained(MODEL_NAME), _hf_minilm(model_dir)
    _assert_pads_as(ours, hf)
    ours.pad_token = hf.pad_token = "[MASK]"
    assert (ours.pad_token, ours.pad_token_id) == (hf.pad_token, hf.pad_token_id) == ("[MASK]", 103)
    assert ours.backend.padding["pad_id"] == 103 and ours.backend.padding["pad_token"] == "[MASK]"
    _assert_pads_as(ours, hf)
    ours.pad_token_id = hf.pad_token_id = 100
    assert (ours.pad_token, ours.pad_token_id) == (hf.pad_token, hf.pad_token_id) == ("[UNK]", 100)
    _assert_pads_as(ours, hf)
    assert "[UNK]" in ours.all_special_tokens
    # a pad id set on the backend itself is the one every path pads with, and the one named
    ours.backend.enable_padding(**{**ours.backend.padding, "pad_id": 103, "pad_token": "[MASK]"})
    hf.pad_token = "[MASK]"
    assert (ours.pad_token, ours.pad_token_id) == ("[MASK]", 103)
    _assert_pads_as(ours, hf)
    # the backend's other padding settings are kept by an assignment
    ours.backend.enable_padding(**{**ours.backend.padding, "pad_to_multiple_of": 8})
    ours.pad_token = "[PAD]"
    assert ours.backend.padding["pad_to_multiple_of"] == 8 and ours.backend.padding["pad_id"] == 0
    # None: as the constructor's None (an encoder pads with id 0)
    ours.pad_token = None
    assert (ours.pad_token, ours.pad_token_id) == (None, 0)
    # pickled and copied with them
    ours.pad_token = "[MASK]"
    for clone in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours)), copy.copy(ours)):
        assert clone.pad_token_id == 103 and clone.encode_batch(["a", "a b"])["input_ids"][0, -1] == 103


def test_pad_token_assignment_is_checked(model_dir):
    """Checked as the constructor checks the named tokens (a pad_token not in the vocabulary is
    refused here, where the constructor falls back to id 0's token); a refused one changes nothing."""
    tok = tc.Tokenizer(_backend(model_dir), 16)
    for name, bad, err, match in (
            ("pad_token", "<pad>", ValueError, "^pad_token: '<pad>' is not in the vocabulary$"),
            ("pad_token", 103, TypeError, "^pad_token: expected a str or None, got int$"),
            ("pad_token_id", 30522, ValueError, r"^pad_token_id: token id 30522 is outside the vocabulary \[0, 30522\)$"),
            ("pad_token_id", -1, ValueError, "^pad_token_id: expected an int >= 0, got -1$"),
            ("pad_token_id", True, TypeError, "^pad_token_id: expected an int, got bool"),
            ("pad_token_id", "[PAD]", TypeError, "^pad_token_id: expected an int, got str"),
            ("pad_token_id", None, TypeError, "^pad_token_id: expected an int, got None")):
        with pytest.raises(err, match=match):
            setattr(tok, name, bad)
        assert (tok.pad_token, tok.pad_token_id, tok.backend.padding["pad_id"]) == ("[PAD]", 0, 0)


def _wordpiece_backend():
    """A small BERT-style backend whose vocabulary lists [CLS], [SEP], ... as plain entries (no
    added tokens), as the report's reproducer builds it."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "hello": 3, "[PAD]": 4, "[MASK]": 5, "world": 6}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer()
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                           special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    backend.decoder = decoders.WordPiece()
    return backend


_SPECIAL_TEXTS = ["[CLS]hello", "hello [SEP] world", "[cls] HELLO", "[MASK][PAD]world", "world", "HELLO world"]
_SPECIAL_IDS = [[1, 3, 2], [1, 3, 5, 6, 4, 2], [3, 6], [0, 1, 2, 3, 4, 5, 6]]


def test_constructor_registers_its_special_tokens_as_transformers(model_dir):
    """Tokenizer(backend, cls_token=...) only named its special tokens: "[CLS]" in a text became
    [UNK] [UNK] [UNK] and decode(skip_special_tokens=True) kept "[CLS] hello [SEP]", where
    transformers' PreTrainedTokenizerFast(tokenizer_object=..., cls_token=...) matches it whole and
    drops it. They are registered now, as there; the caller's backend is left as it was."""
    from transformers import PreTrainedTokenizerFast

    kw = dict(cls_token="[CLS]", sep_token="[SEP]", unk_token="[UNK]", pad_token="[PAD]", mask_token="[MASK]")
    for extra in (None, ["world"]):
        given = _wordpiece_backend()
        ours = tc.Tokenizer(given, max_length=16, extra_special_tokens=extra, **kw)
        hf = PreTrainedTokenizerFast(tokenizer_object=_wordpiece_backend(), extra_special_tokens=extra, **kw)
        assert given.get_added_tokens_decoder() == {}  # not the caller's object: a copy was changed
        assert ours.all_special_tokens == hf.all_special_tokens and ours.all_special_ids == hf.all_special_ids
        assert {i: str(t) for i, t in ours.backend.get_added_tokens_decoder().items()} == \
            {i: str(t) for i, t in hf.backend_tokenizer.get_added_tokens_decoder().items()}
        for text in _SPECIAL_TEXTS:
            assert ours.encode(text) == hf.encode(text), (extra, text)
            assert ours.tokenize(text) == hf.tokenize(text), (extra, text)
        for ids in _SPECIAL_IDS:
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), ids
    assert tc.Tokenizer(_wordpiece_backend(), 16, cls_token="[CLS]").encode("[CLS]hello") == [1, 1, 3, 2]


def test_special_token_assignment_is_checked_and_names_as_transformers(model_dir):
    """bos_token, ..., mask_token, extra_special_tokens and do_lower_case were plain attributes:
    ``bos_token = "not-a-token"`` was kept (its id None), ``do_lower_case = "False"`` turned
    lowercasing on, ``extra_special_tokens = "<|im_start|>"`` listed each character. They are
    checked now as the constructor checks them, and a token assigned is only named, as
    transformers' assignment names it: the same ids and text as transformers' tokenizer given the
    same assignments (tokens assigned are not registered on the backend)."""
    from transformers import PreTrainedTokenizerFast

    ours = tc.Tokenizer(_wordpiece_backend(), 16, pad_token="[PAD]")
    for name, bad, err, match in (
            ("bos_token", "not-a-token", ValueError, "^bos_token: 'not-a-token' is not in the vocabulary$"),
            ("cls_token", 5, TypeError, "^cls_token: expected a str or None, got int$"),
            ("do_lower_case", "False", TypeError, "^do_lower_case: expected a bool, got str"),
            ("extra_special_tokens", "[MASK]", TypeError,
             "^extra_special_tokens: expected a list of str or None, got str$"),
            ("extra_special_tokens", ["[MASK]", 3], TypeError, r"^extra_special_tokens\[1\]: expected a str, got int$"),
            ("extra_special_tokens", ["[MASK]", "<x>"], ValueError,
             r"^extra_special_tokens\[1\]: '<x>' is not in the vocabulary$")):
        with pytest.raises(err, match=match):
            setattr(ours, name, bad)
    assert (ours.bos_token, ours.cls_token, ours.do_lower_case, ours.extra_special_tokens) == (None, None, False, [])
    assert ours.all_special_tokens == ["[PAD]"]
    hf = PreTrainedTokenizerFast(tokenizer_object=_wordpiece_backend(), pad_token="[PAD]")
    for tok in (ours, hf):
        tok.cls_token, tok.sep_token, tok.mask_token = "[CLS]", "[SEP]", "[MASK]"
        tok.extra_special_tokens = ["world"]
        tok.unk_token = "[UNK]"
    assert ours.all_special_tokens == hf.all_special_tokens and ours.all_special_ids == hf.all_special_ids
    assert ours.extra_special_tokens == hf.extra_special_tokens == ["world"]
    ours.extra_special_tokens.append("hello")  # a new list each time, as transformers'
    assert ours.extra_special_tokens == ["world"]
    for text in _SPECIAL_TEXTS:
        assert ours.encode(text) == hf.encode(text), text
        assert ours.tokenize(text) == hf.tokenize(text), text
    for ids in _SPECIAL_IDS:
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), ids
    ours.mask_token = None
    assert ours.mask_token is None and "[MASK]" not in ours.all_special_tokens
    ours.do_lower_case = True
    assert ours.do_lower_case is True


@pytest.mark.parametrize("name, value", [
    ("pad_token", "hello"), ("pad_token_id", 7592), ("bos_token", "hello"), ("eos_token", "hello"),
    ("unk_token", "hello"), ("sep_token", "hello"), ("cls_token", "hello"), ("mask_token", "hello"),
    ("extra_special_tokens", ["hello"])])
def test_special_token_assignment_only_names_an_ordinary_token(model_dir, name, value):
    """Assigning an ordinary vocabulary token ("hello", id 7592) registered it as a special added
    token of the backend: "hellohello world" was split ['hello', 'hello', 'world'] (transformers:
    ['hello', '##hell', '##o', 'world']) and decode(skip_special_tokens=True) dropped it.
    transformers' assignment only names the token: the text's tokens, ids and decoding stay as they
    were, all_special_tokens / all_special_ids list it, and a pad token pads."""
    ours, hf = tc.Tokenizer.from_pretrained(MODEL_NAME), _hf_minilm(model_dir)
    backend_special = ours.special_tokens
    setattr(ours, name, value)
    setattr(hf, name, value)
    assert getattr(ours, name) == getattr(hf, name) == value
    assert ours.special_tokens == backend_special  # the backend is unchanged
    for text in ("hellohello world", "hello", "say hello, world"):
        assert ours.tokenize(text) == hf.tokenize(text), text
        assert ours.encode(text) == hf.encode(text), text
    assert ours.tokenize("hellohello world") == ["hello", "##hell", "##o", "world"]
    for ids in ([101, 7592, 2088, 102], [7592, 7592, 18223, 2080], [7592, 0, 103]):
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), (ids, skip)
    assert ours.decode([101, 7592, 2088, 102], skip_special_tokens=True) == "hello world"
    assert ours.all_special_tokens == hf.all_special_tokens and ours.all_special_ids == hf.all_special_ids
    assert "hello" in ours.all_special_tokens
    _assert_pads_as(ours, hf, ["hello", "a b c", ""])


def test_assigning_a_plain_added_token_keeps_it_plain(model_dir, tmp_path):
    """A token that is already a plain (not special) added token stays plain when assigned, as in
    transformers: decode(skip_special_tokens=True) keeps it."""
    hf = _hf_minilm(model_dir)
    hf.add_tokens(["newword"])
    hf.save_pretrained(str(tmp_path))
    ours, hf = tc.Tokenizer.from_pretrained(tmp_path), _hf_minilm(tmp_path)
    ours.pad_token = hf.pad_token = "newword"
    assert ours.pad_token_id == hf.pad_token_id == 30522
    ids = [101, 30522, 7592, 102]
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert ours.decode(ids, skip_special_tokens=True) == "newword hello"
    assert "newword" not in ours.special_tokens
    assert ours.encode("a newword") == hf.encode("a newword")
    assert ours.all_special_tokens == hf.all_special_tokens and ours.all_special_ids == hf.all_special_ids


def test_defaults_of_decode_tokenize_and_call_are_transformers(model_dir):
    """decode's skip_special_tokens defaulted to True and tokenize's add_special_tokens to True,
    where transformers' defaults are False: decode([101, ..., 102]) gave "hello world" (transformers
    "[CLS] hello world [SEP]"), tokenize("hello world") ['[CLS]', 'hello', 'world', '[SEP]']. Now
    as transformers. encode, tokenize and __call__ still cut to max_length (documented): __call__
    is transformers' call with padding=True, truncation=True, max_length and return_tensors="np"."""
    ours, hf = tc.Tokenizer.from_pretrained(MODEL_NAME), _hf_minilm(model_dir)
    ids = [101, 7592, 2088, 102]
    assert ours.decode(ids) == hf.decode(ids) == "[CLS] hello world [SEP]"
    for text in ("hello world", "[CLS] time flies [MASK]", "Héllo, WORLD!"):
        assert ours.tokenize(text) == hf.tokenize(text), text
        assert ours.decode(ours.encode(text)) == hf.decode(hf.encode(text)), text
    stream = ours.text_stream()
    assert "".join(stream.push(i) for i in ids) + stream.finish() == hf.decode(ids)
    long = "word " * 600
    assert len(ours.encode(long)) == len(hf.encode(long, truncation=True, max_length=ours.max_length)) == 256
    assert ours.tokenize(long) == hf.tokenize(long)[:256]
    _assert_pads_as(ours, hf, ["hello", long, ""])


def test_text_stream_default_is_transformers_text_streamer(model_dir):
    """TextStream / text_stream left special tokens out by default; transformers' TextStreamer
    decodes as decode does, with skip_special_tokens False unless told."""
    from transformers import TextStreamer

    class Collect(TextStreamer):
        def on_finalized_text(self, text, stream_end=False):
            self.pieces.append(text)

    ours, hf = tc.Tokenizer.from_pretrained(MODEL_NAME), _hf_minilm(model_dir)
    ids = hf("time flies like an arrow")["input_ids"] + hf("[MASK] again")["input_ids"]
    for kwargs in ({}, {"skip_special_tokens": True}, {"skip_special_tokens": False}):
        streamer = Collect(hf, **kwargs)
        streamer.pieces = []
        streamer.put(torch.tensor(ids))
        streamer.end()
        for stream in (ours.text_stream(**kwargs), TextStream(ours, **kwargs)):
            assert "".join(stream.push(i) for i in ids) + stream.finish() == "".join(streamer.pieces).strip(), kwargs


def test_vocab_size_leaves_added_tokens_out_as_transformers(model_dir, tmp_path):
    """vocab_size counted the added tokens (transformers' len(tokenizer)); transformers'
    vocab_size leaves them out. vocab_size is the base vocabulary now, and len() counts them."""
    hf = _hf_minilm(model_dir)
    hf.add_tokens(["newword"])
    hf.save_pretrained(str(tmp_path))
    ours, hf = tc.Tokenizer.from_pretrained(tmp_path), _hf_minilm(tmp_path)
    assert ours.vocab_size == hf.vocab_size == 30522
    assert len(ours) == len(hf) == 30523
    assert ours.encode("a newword") == hf.encode("a newword") == [101, 1037, 30522, 102]
    assert ours.decode([30522]) == hf.decode([30522]) == "newword"  # ids up to len - 1
    with pytest.raises(ValueError, match=r"^ids: token id 30523 is outside the vocabulary \[0, 30523\)$"):
        ours.decode([30523])


def test_a_state_pickled_with_plain_attributes_is_read(model_dir):
    """The special tokens, pad_token_id, extra_special_tokens and do_lower_case were plain
    attributes; a state pickled then (its keys without the leading underscore) still loads, and a
    shallow copy names its own tokens (its backend is shared)."""
    import copy
    import pickle

    tok = tc.Tokenizer(_backend(model_dir), 16, cls_token="[CLS]", sep_token="[SEP]", extra_special_tokens=["[MASK]"])
    state = tok.__getstate__()
    old = {k: v for k, v in state.items() if k not in ("_special", "_pad_token", "_pad_token_id",
                                                       "_extra_special_tokens", "_do_lower_case")}
    old.update(state["_special"], pad_token="[PAD]", pad_token_id=0, extra_special_tokens=["[MASK]"], do_lower_case=True)
    loaded = pickle.loads(pickle.dumps(tok))
    loaded.__setstate__(old)
    assert (loaded.cls_token, loaded.sep_token, loaded.pad_token_id, loaded.do_lower_case) == ("[CLS]", "[SEP]", 0, True)
    assert loaded.all_special_ids == tok.all_special_ids == [102, 0, 101, 103]
    assert loaded.encode("Hello") == tok.encode("hello")
    shallow = copy.copy(tok)
    shallow.cls_token = None
    assert tok.cls_token == "[CLS]" and shallow.cls_token is None


# ------------------------------------------------------------------------------------ chat ids, shallow copies
def test_apply_chat_template_ids_neither_truncated_nor_lowercased(model_dir):
    """apply_chat_template(tokenize=True) on an encoder tokenizer cut the ids to max_length and, with
    do_lower_case, spelled out the template's "[CLS]" as "[cls]"; transformers does neither."""
    from transformers import PreTrainedTokenizerFast

    tmpl = "{% for m in messages %}[{{ m.role }}] {{ m.content }} {% endfor %}"
    msgs = [{"role": "user", "content": "one two three four five six seven eight nine ten"}]
    ours = tc.Tokenizer(_backend(model_dir), max_length=8, cls_token="[CLS]", sep_token="[SEP]", chat_template=tmpl)
    hf = PreTrainedTokenizerFast(tokenizer_object=_backend(model_dir), pad_token="[PAD]", chat_template=tmpl)
    want = hf.apply_chat_template(msgs, tokenize=True, return_dict=False)
    assert len(want) > 8 and ours.apply_chat_template(msgs, tokenize=True) == want
    assert ours.encode("one two three") == [101, 2028, 2048, 2093, 102]  # encode still truncates to 8
    assert len(ours.encode(msgs[0]["content"])) == 8
    tmpl = "{% for m in messages %}[CLS]{{ m.content }}[SEP]{% endfor %}"
    ours = tc.Tokenizer(_backend(model_dir), cls_token="[CLS]", sep_token="[SEP]", chat_template=tmpl,
                        do_lower_case=True)
    hf = PreTrainedTokenizerFast(tokenizer_object=_backend(model_dir), pad_token="[PAD]", chat_template=tmpl)
    msgs = [{"role": "user", "content": "Hi THERE"}]
    assert ours.apply_chat_template(msgs, tokenize=True) == hf.apply_chat_template(msgs, tokenize=True,
                                                                                    return_dict=False)
    for backend in (_uncopyable(model_dir),):  # its truncation never switched off
        ours = tc.Tokenizer(backend, max_length=4, chat_template=tmpl)
        assert len(ours.apply_chat_template([{"role": "user", "content": "a b c d e"}], tokenize=True)) == 7
        assert backend.truncation["max_length"] == 4 and len(ours.encode("a b c d e")) == 4


def test_shallow_copy_setters_leave_the_original_alone(model_dir):
    """copy.copy shared the backend: the copy's max_length, truncation_side and pad_token assignments
    changed how the original truncated and padded (its own max_length still said 256)."""
    import copy
    import pickle

    t = tc.Tokenizer.from_pretrained(MODEL_NAME)
    text = "one two three four five six seven"
    before, batch_before = t.encode(text), t.encode_batch(["a", "a b c"])["input_ids"].tolist()
    c = copy.copy(t)
    c.max_length, c.truncation_side = 5, "left"
    d = copy.copy(t)
    d.pad_token = "[MASK]"
    assert t.max_length == 256 and t.truncation_side == "right" and t.pad_token == "[PAD]"
    assert t.encode(text) == before == [101, 2028, 2048, 2093, 2176, 2274, 2416, 2698, 102]
    assert t.encode_batch(["a", "a b c"])["input_ids"].tolist() == batch_before
    assert c.encode(text) == [101, 2274, 2416, 2698, 102]
    assert d.encode_batch(["a", "a b c"])["input_ids"].tolist()[0][-1] == d.pad_token_id == 103
    t.max_length = 4  # nor the original's the copy's
    assert c.max_length == 5 and len(c.encode(text)) == 5
    for other in (copy.deepcopy(c), pickle.loads(pickle.dumps(c)), copy.copy(c)):
        assert other.encode(text) == c.encode(text) and other.max_length == 5


# ------------------------------------------------------------------------------------ chat ids: checks, copies, threads
def test_apply_chat_template_tokenize_names_messages_for_a_lone_surrogate(model_dir):
    """apply_chat_template(tokenize=True) passed the rendered text to the tokenizers package unchecked:
    a message with a lone surrogate gave its TypeError ("TextInputSequence must be str"), naming nothing."""
    tmpl = "{% for m in messages %}[CLS]{{ m.content }}[SEP]{% endfor %}"
    msgs = [{"role": "user", "content": "bad \ud800 text"}]
    smol = tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct")
    for tok in (smol, tc.Tokenizer(_backend(model_dir), chat_template=tmpl),
                tc.Tokenizer(_uncopyable(model_dir), max_length=8, chat_template=tmpl)):
        assert "\ud800" in tok.apply_chat_template(msgs, tokenize=False)
        with pytest.raises(ValueError, match=r"^messages: expected valid Unicode text, got a lone surrogate "
                                             r"'\\ud800' at position \d+"):
            tok.apply_chat_template(msgs, tokenize=True)


def test_chat_ids_and_copies_make_no_copy_of_the_json_per_call(model_dir, monkeypatch):
    """apply_chat_template(tokenize=True) on an encoder copied the backend's JSON on every call (34 ms
    for MiniLM's) and copy.copy on every copy (162 ms for SmolLM2's): now a copy made of the
    backend's parts is kept, and copy.copy shares the backend until either side changes it. The ids
    are transformers', and follow later changes of the backend."""
    import copy

    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast

    tmpl = "{% for m in messages %}[CLS]{{ m.content }}[SEP]{% endfor %}"
    msgs = [{"role": "user", "content": "Hi THERE, one two three four five"}]
    ours = tc.Tokenizer(_backend(model_dir), max_length=8, chat_template=tmpl)
    copies = []
    real = tc.tokenizer._copy_backend
    monkeypatch.setattr(tc.tokenizer, "_copy_backend", lambda backend: copies.append(1) or real(backend))
    hf = PreTrainedTokenizerFast(tokenizer_object=_backend(model_dir), pad_token="[PAD]", chat_template=tmpl)
    for _ in range(3):
        assert ours.apply_chat_template(msgs, tokenize=True) == hf.apply_chat_template(msgs, tokenize=True,
                                                                                        return_dict=False)
    shallow = copy.copy(ours)
    assert copies == [] and shallow.encode("one two three") == ours.encode("one two three")
    shallow.max_length = 5  # the copy's setter: a new backend of the same parts, the original's untouched
    assert copies == [] and ours.max_length == 8 and len(ours.encode(msgs[0]["content"])) == 8
    assert len(shallow.encode(msgs[0]["content"])) == 5
    cased = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents()])
    ours.backend.normalizer = cased  # a change through backend reaches the kept copy
    ours.backend.add_tokens(["three four"])
    ref = _backend(model_dir)
    ref.normalizer = cased
    ref.add_tokens(["three four"])
    hf = PreTrainedTokenizerFast(tokenizer_object=ref, pad_token="[PAD]", chat_template=tmpl)
    want = hf.apply_chat_template(msgs, tokenize=True, return_dict=False)
    assert ours.apply_chat_template(msgs, tokenize=True) == want and len(want) > 8
    assert shallow.apply_chat_template(msgs, tokenize=True) != want  # the copy kept its own backend


def test_a_backend_handed_out_before_copy_copy_does_not_reach_the_copy(model_dir):
    """copy.copy shares the backend until a setter; a backend already handed out through ``backend``
    may be changed by its holder at any time, so the copy gets its own at once."""
    import copy

    tok = tc.Tokenizer(_backend(model_dir), max_length=64)
    held = tok.backend
    shallow = copy.copy(tok)
    held.enable_truncation(max_length=3)
    text = "one two three four five"
    assert len(tok.encode(text)) == 3 and shallow.encode(text) == [101, 2028, 2048, 2093, 2176, 2274, 102]
    other = copy.copy(shallow)  # not handed out: shared, until backend hands each its own
    assert other.backend is not shallow.backend and other.encode(text) == shallow.encode(text)


def test_no_call_switches_the_backends_truncation_or_padding_off(model_dir):
    """With a backend that cannot be copied (a pre-tokenizer written in Python), apply_chat_template
    switched its truncation and padding off around the call, and encode_batches its padding: another
    thread encoding at that moment was neither truncated nor padded. The pre-tokenizer here records
    the backend's settings while each call runs."""
    from tokenizers import pre_tokenizers

    seen = []

    class Split:
        def pre_tokenize(self, pretok):
            seen.append((backend.truncation is not None, backend.padding is not None))
            pretok.split(lambda i, s: s.split(" ", "removed"))

    backend = _backend(model_dir)
    backend.pre_tokenizer = pre_tokenizers.PreTokenizer.custom(Split())
    tmpl = "{% for m in messages %}[CLS]{{ m.content }}[SEP]{% endfor %}"
    tok = tc.Tokenizer(backend, max_length=4, chat_template=tmpl)
    assert backend.truncation is not None and backend.padding is not None
    ids = tok.apply_chat_template([{"role": "user", "content": "a b c d e"}], tokenize=True)
    assert ids == [101, 1037, 1038, 1039, 1040, 1041, 102]
    got = next(tok.encode_batches(["a b c d e", "a"], 2))
    assert got["input_ids"].tolist() == [[101, 1037, 1038, 102], [101, 1037, 102, 0]]
    assert seen and all(t and p for t, p in seen), seen


def test_do_lower_case_off_keeps_a_normalizer_written_in_python(model_dir):
    """A normalizer written in Python, set through backend after do_lower_case, was taken for the
    one do_lower_case set ("cannot be serialized" counted as the same) and replaced on
    do_lower_case = False. It is kept; one that do_lower_case itself set over a Python normalizer
    is still taken back (ids of the tokenizers package with each normalizer)."""
    from tokenizers import normalizers

    class Keep:  # changes nothing: the uncased vocabulary then gives [UNK] for "Hello"
        def normalize(self, normalized):
            pass

    plain = _backend(model_dir)
    plain.normalizer = normalizers.Normalizer.custom(Keep())
    lowered = _backend(model_dir)
    lowered.normalizer = normalizers.Sequence([normalizers.Lowercase(), normalizers.Normalizer.custom(Keep())])
    text = "Hello World"
    assert plain.encode(text).ids != lowered.encode(text).ids
    tok = tc.Tokenizer(_backend(model_dir), max_length=16, do_lower_case=True)
    tok.backend.normalizer = normalizers.Normalizer.custom(Keep())  # replaced through backend
    assert tok.encode(text) == plain.encode(text).ids
    tok.do_lower_case = False
    assert tok.encode(text) == plain.encode(text).ids
    own = _backend(model_dir)
    own.normalizer = normalizers.Normalizer.custom(Keep())
    tok = tc.Tokenizer(own, max_length=16, do_lower_case=True)
    assert tok.encode(text) == lowered.encode(text).ids
    tok.backend  # handed out: the normalizer is compared, not assumed
    tok.do_lower_case = False
    assert tok.encode(text) == plain.encode(text).ids
    tok.do_lower_case = True
    assert tok.encode_batch([text])["input_ids"][0].tolist() == lowered.encode(text).ids


def test_do_lower_case_on_a_shared_backend_is_per_tokenizer(model_dir):
    """A backend that cannot be copied is shared by the Tokenizers built on it and their copies;
    do_lower_case on one lowercased them all and the caller's tokenizers.Tokenizer, while their
    do_lower_case read False. The one that changes it now takes a backend of its own (ids of the
    tokenizers package with and without Lowercase())."""
    import copy

    from tokenizers import normalizers

    text = "Hello World"
    ref = _uncopyable(model_dir)
    ref.normalizer = normalizers.BertNormalizer(lowercase=False)
    ref.enable_truncation(max_length=16)
    cased = ref.encode(text).ids
    ref.normalizer = normalizers.Sequence([normalizers.Lowercase(), normalizers.BertNormalizer(lowercase=False)])
    lowered = ref.encode(text).ids
    assert cased != lowered
    hf = _uncopyable(model_dir)
    hf.normalizer = normalizers.BertNormalizer(lowercase=False)
    a = tc.Tokenizer(hf, max_length=16)
    b = copy.copy(a)
    c = tc.Tokenizer(hf, max_length=16, do_lower_case=True)
    b.do_lower_case = True
    assert b.encode(text) == lowered and c.encode(text) == lowered
    assert not a.do_lower_case and a.encode(text) == cased
    assert isinstance(hf.normalizer, normalizers.BertNormalizer) and hf.encode(text).ids[:-1] == cased[:-1]
    long = "word " * 40
    assert len(b.encode(long)) == 16 and len(b.encode_batch([long, "x"])["input_ids"][1]) == 16  # truncation, padding kept
    b.do_lower_case = False
    assert b.encode(text) == cased and a.encode(text) == cased and c.encode(text) == lowered


def test_kept_copy_of_a_replaced_backend_is_not_taken_for_current(model_dir):
    """After copy.copy, the first setter gives the Tokenizer its own backend with a new watch, whose
    count started again at 0: a copy of the old backend that another thread (the trace hook, just
    before the copy is recorded) stored with the old count was taken as current once the new count
    reached it, and encode_batch / encode_batches truncated to the old max_length (9, not 6)."""
    import copy

    texts = ["one two three four five six seven eight nine ten eleven twelve", "a short one"]
    a = tc.Tokenizer(_backend(model_dir), 10)
    a.max_length = 11
    a.max_length = 9  # the watch counts 2
    b = copy.copy(a)  # shares a's backend and watch until either changes it

    def between():  # a takes its own backend and watch while the old backend's copy is made
        a.max_length = 7

    _while_a_kept_copy_is_recorded(between, lambda: next(a.encode_batches(texts, 2)))
    a.max_length = 6  # the new watch counts 2 again
    ref = _backend(model_dir)
    ref.enable_truncation(max_length=6)
    want = [e.ids for e in ref.encode_batch(texts)]
    assert [a.encode(t) for t in texts] == want
    got = a.encode_batch(texts)
    assert got["input_ids"].shape == (2, 6)
    for row, ids in enumerate(want):
        assert got["input_ids"][row, :len(ids)].tolist() == ids
    _check_one_batch_truncated_to(a, texts, 6)
    _check_one_batch_truncated_to(b, texts, 9)


def test_do_lower_case_false_gives_each_copy_its_own_normalizer():
    """do_lower_case = False put back the saved normalizer object itself, which the original's
    Sequence([Lowercase(), ...]) and every copy also held: a change made in place through one
    Tokenizer's backend (normalizer.strip_accents = True) changed the others' ids. Compared with the
    tokenizers package's own normalizers."""
    import copy

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.train_from_iterator(["Héllo Wörld hello world HELLO"] * 20, trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]))

    def ids(normalizer, text="Héllo"):
        ref = Tokenizer.from_str(backend.to_str())
        ref.normalizer = normalizer
        return ref.encode(text).ids

    lowered = ids(normalizers.Sequence([normalizers.Lowercase(),
                                        normalizers.BertNormalizer(lowercase=False, strip_accents=False)]))
    cased = ids(normalizers.BertNormalizer(lowercase=False, strip_accents=False))
    stripped = ids(normalizers.BertNormalizer(lowercase=False, strip_accents=True))
    assert len({tuple(lowered), tuple(cased), tuple(stripped)}) == 3
    a = tc.Tokenizer(backend, max_length=16, do_lower_case=True)
    c = copy.copy(a)
    c.do_lower_case = False
    c.backend.normalizer.strip_accents = True
    assert c.encode("Héllo") == stripped
    assert a.encode("Héllo") == lowered
    d = copy.copy(a)
    a.do_lower_case = d.do_lower_case = False
    a.backend.normalizer.strip_accents = True
    assert a.encode("Héllo") == stripped
    assert d.encode("Héllo") == cased


_SETTERS_WHILE_ENCODING = """
import sys, threading, time
import transformer_core as tc
from tokenizers import Tokenizer, normalizers, pre_tokenizers

class Keep:  # a normalizer written in Python that changes nothing
    def normalize(self, normalized):
        pass

class Split:  # a pre-tokenizer written in Python: on spaces
    def pre_tokenize(self, pretok):
        pretok.split(lambda i, s: s.split(" ", "removed"))

def make(lower):  # the backend; with lower, Lowercase() prepended to its normalizer (the reference)
    backend = Tokenizer.from_file(sys.argv[1])
    backend.no_padding()
    if sys.argv[2] == "normalizer":
        normalizer = normalizers.Normalizer.custom(Keep())
    else:
        normalizer = normalizers.BertNormalizer(lowercase=False)
        backend.pre_tokenizer = pre_tokenizers.PreTokenizer.custom(Split())
    backend.normalizer = normalizers.Sequence([normalizers.Lowercase(), normalizer]) if lower else normalizer
    return backend

refs = {lower: make(lower).encode("Hello World").ids for lower in (False, True)}
tok = tc.Tokenizer(make(False), 32)
stop = time.time() + 1.5
errors = []

def encode(kind):
    try:
        while time.time() < stop:
            if kind == 0:
                rows = [tok.encode("Hello World")]
            elif kind == 1:
                rows = tok.encode_batch(["Hello World"] * 16)["input_ids"].tolist()
            else:
                rows = [r for b in tok.encode_batches(["Hello World"] * 16, 4) for r in b["input_ids"].tolist()]
            if any(r not in refs.values() for r in rows):
                errors.append(rows[0])
    except Exception as e:
        errors.append(repr(e))

def toggle():
    i = 0
    while time.time() < stop:
        tok.do_lower_case = i % 2 == 0
        tok.max_length = 16 + i % 2
        tok.truncation_side = "left" if i % 2 else "right"
        tok.pad_token = "[PAD]" if i % 2 else "[UNK]"
        i += 1
    tok.do_lower_case, tok.max_length, tok.truncation_side, tok.pad_token = True, 32, "right", "[PAD]"

threads = [threading.Thread(target=encode, args=(k,)) for k in (0, 1, 2)] + [threading.Thread(target=toggle)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(refs[True] != refs[False], errors[:3], tok.encode("Hello World") == refs[True])
"""


@pytest.mark.parametrize("part", ["normalizer", "pre_tokenizer"])
def test_setters_while_another_thread_encodes_with_a_part_written_in_python(model_dir, part):
    """do_lower_case, max_length, truncation_side and pad_token changed the backend in place: with
    a normalizer or pre-tokenizer written in Python, a setter waited for the backend (holding the
    GIL) while another thread's encode held the backend and waited for the GIL (a deadlock). Each
    setter now swaps in a new backend. Threads running encode, encode_batch and encode_batches
    finish, and every row equals the ids of a tokenizer set to one of the states (lowercased or
    not). In a child process, as a deadlock holds the GIL."""
    import subprocess
    import sys

    try:
        run = subprocess.run([sys.executable, "-c", _SETTERS_WHILE_ENCODING, str(model_dir / "tokenizer.json"), part],
                             capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"setters while other threads encode with a {part} written in Python deadlocked")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True [] True"


def test_a_setter_leaves_a_shallow_copys_parts_alone(model_dir):
    """A setter gives its Tokenizer a new backend made of the same parts; after copy.copy, the
    backend that the setter's Tokenizer then hands out is still a copy of its own, so a part
    changed in place through it (normalizer.lowercase) does not reach the original. Compared with
    the tokenizers package."""
    import copy

    a = tc.Tokenizer(_backend(model_dir), 16)
    b = copy.copy(a)
    b.max_length = 12
    b.backend.normalizer.lowercase = False
    ref = _backend(model_dir)
    ref.enable_truncation(max_length=12)
    ref.normalizer.lowercase = False
    assert b.encode("Hello World") == ref.encode("Hello World").ids == [101, 100, 100, 102]
    assert a.encode("Hello World") == _backend(model_dir).encode("Hello World").ids == [101, 7592, 2088, 102]


def test_a_copy_after_a_setter_does_not_follow_a_backend_handed_out_before(model_dir):
    """After ``bk = a.backend`` and a setter on ``a`` (a new backend sharing bk's parts), ``copy.copy(a)``
    shared that backend as if never handed out: ``bk.normalizer.lowercase = False`` then changed the
    copy's ids too. The copy is its own now (as without the setter), whatever bk's holder does."""
    import copy

    a = tc.Tokenizer.from_pretrained(model_dir)
    want = a.encode("Hello World")
    bk = a.backend
    a.max_length = 10
    c = copy.copy(a)
    bk.normalizer.lowercase = False
    assert c.encode("Hello World") == want
    a = tc.Tokenizer.from_pretrained(model_dir)
    bk = a.backend
    a.pad_token = "[UNK]"
    c = copy.copy(a)
    c.max_length = 12
    before = c.encode("Hello \u2603")
    bk.model.unk_token = "[MASK]"
    assert c.encode("Hello \u2603") == before
