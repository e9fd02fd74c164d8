"""tc.Tokenizer.from_pretrained on tokenizer folders, against transformers' AutoTokenizer on the same
folder: which kind a folder without config.json gives (what ``tokenizer.save_pretrained`` writes),
an encoder's pad token from tokenizer_config.json, vocabularies whose ids have gaps, and chat
template files that are not UTF-8.
"""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import transformer_core as tc
from conftest import MODEL_DIR

LONG = "hello world, " * 300  # 900 tokens for BERT and SmolLM2: past every length below
TEXTS = ["Hi", "hello world, how are you?", LONG[:200], ""]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def _hf(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


# ------------------------------------------------------------------------------------ folders without config.json
@pytest.fixture(scope="module")
def saved_smollm2(hf_smollm2_tokenizer, tmp_path_factory):
    """SmolLM2's tokenizer as transformers' save_pretrained writes it: no config.json."""
    path = tmp_path_factory.mktemp("smollm2_saved")
    hf_smollm2_tokenizer.save_pretrained(str(path))
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= {p.name for p in path.iterdir()}
    assert not (path / "config.json").exists()
    return path


def test_saved_causal_tokenizer_is_causal_as_transformers_reads_it(saved_smollm2):
    """A causal LM's tokenizer saved by transformers (no config.json) became an encoder tokenizer:
    prompts cut to 512 ids, the chat template dropped, padding with id 0, left padding refused.
    Now it is the causal-LM tokenizer transformers loads from that folder."""
    hf, ours = _hf(saved_smollm2), tc.Tokenizer.from_pretrained(saved_smollm2)
    assert ours.max_length is None
    ids = ours.encode(LONG)
    assert ids == hf(LONG)["input_ids"] == hf(LONG, truncation=True)["input_ids"] and len(ids) > 512
    assert (ours.pad_token, ours.pad_token_id) == (hf.pad_token, hf.pad_token_id) == ("<|im_end|>", 2)
    assert (ours.bos_token_id, ours.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)
    assert ours.all_special_tokens == hf.all_special_tokens and ours.all_special_ids == hf.all_special_ids
    assert ours.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False) == hf.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False)
    for side in ("left", "right"):
        got = ours.encode_batch(TEXTS, padding_side=side)
        want = hf(TEXTS, padding=True, padding_side=side, return_tensors="np")
        for key in ("input_ids", "attention_mask"):
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{side} {key}")


def _minilm_config(**changes) -> dict:
    config = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())
    config.update(changes)
    return {k: v for k, v in config.items() if v is not None}


def _folder(tmp_path, tokenizer_json, tokenizer_config, files=None):
    """A tokenizer folder: ``tokenizer_json`` copied, ``tokenizer_config.json`` written, then
    ``files`` ({relative path: text})."""
    path = tmp_path / "tok"
    path.mkdir()
    shutil.copy(tokenizer_json, path / "tokenizer.json")
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    for name, text in (files or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


# (tokenizer_config.json, other files, the max_length expected: None for a causal-LM tokenizer)
BERT_FOLDERS = {
    # a length known: tokenizer_config.json's model_max_length, or sentence-transformers' max_seq_length
    "model_max_length": (_minilm_config(), {}, 512),
    "model_max_length 100": (_minilm_config(model_max_length=100), {}, 100),
    "sentence_bert_config": (_minilm_config(), {"sentence_bert_config.json": '{"max_seq_length": 16}'}, 16),
    "silent config.json": (_minilm_config(), {"config.json": "{}"}, 512),
    # no length known: nothing is cut
    "no model_max_length": (_minilm_config(model_max_length=None), {}, None),
    "transformers' no-limit 1e30": (_minilm_config(model_max_length=int(1e30)), {}, None),
    "empty tokenizer_config": ({}, {}, None),
    # a causal LM's tokenizer shown, whatever the length
    "padding_side left": (_minilm_config(padding_side="left"), {}, None),
    "add_bos_token": (_minilm_config(add_bos_token=True), {}, None),
    "chat_template in the config": (_minilm_config(chat_template="{{ messages[0]['content'] }}"), {}, None),
    "chat_template.jinja": (_minilm_config(), {"chat_template.jinja": "{{ messages[0]['content'] }}"}, None),
    "additional_chat_templates": (_minilm_config(), {"additional_chat_templates/rag.jinja": "{{ documents }}"}, None),
}


@pytest.mark.parametrize("name", list(BERT_FOLDERS))
def test_kind_of_a_folder_without_config_json(tmp_path, name):
    """A tokenizer folder without config.json is an encoder tokenizer (it truncates) only when a
    length is known and nothing shows a causal LM's tokenizer. Without a length, transformers'
    tokenizer does not cut even with truncation=True, and neither does ours."""
    config, files, max_length = BERT_FOLDERS[name]
    path = _folder(tmp_path, MODEL_DIR / "tokenizer.json", config, files)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert ours.max_length == max_length
    want = hf(LONG, truncation=True, max_length=max_length)["input_ids"] if max_length else hf(LONG)["input_ids"]
    assert ours.encode(LONG) == want and len(want) == (max_length or 902)
    assert ours.encode(TEXTS[1]) == hf(TEXTS[1])["input_ids"]
    if max_length is None:  # a causal-LM tokenizer: pads either side as transformers does
        got = ours.encode_batch(TEXTS, padding_side="left")
        want = hf(TEXTS, padding=True, padding_side="left", return_tensors="np")
        np.testing.assert_array_equal(got["input_ids"], want["input_ids"])
        np.testing.assert_array_equal(got["attention_mask"], want["attention_mask"])


@pytest.mark.parametrize("tokenizer_class", ["GPT2TokenizerFast", "LlamaTokenizer", "Qwen2TokenizerFast"])
def test_a_causal_tokenizer_class_makes_a_causal_tokenizer(tmp_path, saved_smollm2, tokenizer_class):
    """A causal LM's tokenizer_class is a causal tokenizer even with a real model_max_length, which
    a causal-LM tokenizer does not cut to (transformers cuts only when asked: truncation=True)."""
    config = {"tokenizer_class": tokenizer_class, "model_max_length": 64, "eos_token": "<|endoftext|>"}
    ours = tc.Tokenizer.from_pretrained(_folder(tmp_path, saved_smollm2 / "tokenizer.json", config))
    assert ours.max_length is None and len(ours.encode(LONG)) > 64
    assert (ours.pad_token, ours.pad_token_id) == ("<|endoftext|>", 0)  # the EOS token pads


def test_max_length_argument_for_a_folder_without_config_json(tmp_path):
    """The caller's max_length is a known length: a folder that shows no causal LM's tokenizer
    becomes an encoder tokenizer of that length; one that shows a causal LM's refuses it."""
    path = _folder(tmp_path, MODEL_DIR / "tokenizer.json", _minilm_config(model_max_length=None))
    ours = tc.Tokenizer.from_pretrained(path, max_length=32)
    assert ours.max_length == 32 and ours.encode(LONG) == _hf(path)(LONG, truncation=True, max_length=32)["input_ids"]
    (path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    with pytest.raises(ValueError, match="max_length: .* has a causal-LM tokenizer, which does not truncate"):
        tc.Tokenizer.from_pretrained(path, max_length=32)


# ------------------------------------------------------------------------------------ an encoder's pad token
@pytest.fixture
def padtok(tmp_path):
    """A WordLevel encoder vocabulary whose padding token is "<pad>" (id 1; id 0 is "<s>"), named
    by tokenizer_config.json, with a BERT config.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "hello": 4, "world": 5}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>"])
    backend.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 512,
        "tokenizer_class": "PreTrainedTokenizerFast"}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"],
                                                      "max_position_embeddings": 512}))
    return tmp_path


def test_encoder_pads_with_the_pad_token_of_tokenizer_config(padtok):
    """An encoder tokenizer padded with "[PAD]", else id 0's token ("<s>": the BOS id padded the
    batch) and left tokenizer_config.json's pad_token out of all_special_tokens. Now it pads as
    transformers does."""
    hf, ours = _hf(padtok), tc.Tokenizer.from_pretrained(padtok)
    assert ours.max_length == 512
    assert (ours.pad_token, ours.pad_token_id) == (hf.pad_token, hf.pad_token_id) == ("<pad>", 1)
    texts = ["hello", "hello world world", "world"]
    got = ours.encode_batch(texts)
    want = hf(texts, padding=True, return_tensors="np")
    for key in ("input_ids", "attention_mask"):  # this tokenizer gives transformers no token_type_ids
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    assert got["input_ids"][0].tolist() == [0, 4, 2, 1, 1]
    assert ours.all_special_tokens == hf.all_special_tokens and ours.all_special_ids == hf.all_special_ids
    assert "<pad>" in ours.all_special_tokens


def test_encoder_pad_token_outside_the_vocabulary_falls_back(padtok):
    """A pad_token the vocabulary lacks is not used: "[PAD]" if present, else id 0's token, as before."""
    config = json.loads((padtok / "tokenizer_config.json").read_text())
    (padtok / "tokenizer_config.json").write_text(json.dumps({**config, "pad_token": "[NOPE]"}))
    ours = tc.Tokenizer.from_pretrained(padtok)
    assert (ours.pad_token, ours.pad_token_id) == ("<s>", 0)


# ------------------------------------------------------------------------------------ ids with gaps
@pytest.fixture
def hole(tmp_path):
    """A byte-level BPE vocabulary whose ids skip 6: {..., "Ġ": 5, "ab": 7}; a Llama config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4, "Ġ": 5, "ab": 7}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<unk>", "<s>", "</s>"])
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "bos_token": "<s>"}))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return tmp_path


def test_ids_past_a_gap_in_the_vocabulary_decode_as_transformers(hole):
    """decode refused id 7, which encode("ab") had just returned: ids were bounded by vocab_size (7
    tokens), not by the highest id + 1 (8); id_to_token(7) was None. Now they decode as
    transformers decodes them; only the id no token has (6) and ids past 7 are refused."""
    hf, ours = _hf(hole), tc.Tokenizer.from_pretrained(hole)
    assert ours.encode("ab") == hf.encode("ab") == [7]
    assert ours.vocab_size == hf.vocab_size == len(ours) == len(hf) == 7
    for ids in ([7], [3, 5, 7], [1, 7, 7, 2]):
        assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True), ids
        assert ours.decode(ids) == ours.decode(ids, skip_special_tokens=False) == hf.decode(ids), ids
    assert ours.decode(np.array([5, 7])) == hf.decode([5, 7]) == " ab"
    assert ours.id_to_token(7) == hf.convert_ids_to_tokens(7) == "ab"
    assert ours.id_to_token(6) is None and ours.id_to_token(8) is None
    stream = ours.text_stream()
    assert stream.push(5) + stream.push(7) + stream.finish() == " ab"
    with pytest.raises(ValueError, match=r"^ids: token id 6 has no token \(the vocabulary's ids \[0, 8\) skip it\)$"):
        ours.decode([7, 6])
    with pytest.raises(ValueError, match=r"^ids: token id 8 is outside the vocabulary \[0, 8\)$"):
        ours.decode([8])
    # pad_token_id is bounded as decode's ids are: 7 pads (as transformers), 6 and 8 are refused
    ours.pad_token_id = hf.pad_token_id = 7
    assert ours.pad_token == hf.pad_token == "ab"
    np.testing.assert_array_equal(ours.encode_batch(["a", "ab ab"])["input_ids"],
                                  hf(["a", "ab ab"], padding=True, return_tensors="np")["input_ids"])
    with pytest.raises(ValueError, match=r"^pad_token_id: token id 6 has no token \(the vocabulary's ids \[0, 8\) skip"):
        ours.pad_token_id = 6
    with pytest.raises(ValueError, match=r"^pad_token_id: token id 8 is outside the vocabulary \[0, 8\)$"):
        ours.pad_token_id = 8


# ------------------------------------------------------------------------------------ chat template files
@pytest.mark.parametrize("name", ["chat_template.jinja", "additional_chat_templates/tool_use.jinja"])
def test_chat_template_file_not_utf8_is_named(saved_smollm2, tmp_path, name):
    """A chat template file that is not UTF-8 raised a bare UnicodeDecodeError naming no file."""
    path = tmp_path / "tok"
    shutil.copytree(saved_smollm2, path)
    (path / name).parent.mkdir(exist_ok=True)
    (path / name).write_bytes(b"{{ messages }}\xff\xfe")
    with pytest.raises(ValueError) as info:
        tc.Tokenizer.from_pretrained(path)
    assert type(info.value) is ValueError
    assert str(info.value) == (f"{path / name}: a chat template must be UTF-8 text; byte 0xff at offset 14 is not "
                               f"valid UTF-8")


# ------------------------------------------------------------------------------------ a tokenizer class's defaults
def _variant(saved, tmp_path, config: dict, model_type: str | None = None, edit=None):
    """A copy of the saved SmolLM2 tokenizer folder with ``config`` as tokenizer_config.json (and a
    config.json of ``model_type``; ``edit`` changes tokenizer.json's spec in place)."""
    path = tmp_path / "variant"
    path.mkdir(parents=True)
    spec = json.loads((saved / "tokenizer.json").read_text())
    if edit is not None:
        edit(spec)
    (path / "tokenizer.json").write_text(json.dumps(spec))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    if model_type is not None:
        (path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return path


def test_class_defaults_fill_what_tokenizer_config_leaves_out(saved_smollm2, tmp_path):
    """transformers' tokenizer classes take the tokens their folder leaves out from their own
    defaults: GPT-2's own folder ({"model_max_length": 1024}) has <|endoftext|> as its bos, eos and
    unk there, and ours had no eos at all."""
    path = _variant(saved_smollm2, tmp_path, {"model_max_length": 1024}, model_type="gpt2")
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    for name in ("bos_token", "eos_token", "unk_token"):  # (a causal LM without pad_token pads with eos here)
        assert getattr(ours, name) == getattr(hf, name), name
    assert ours.eos_token == "<|endoftext|>" and ours.eos_token_id == hf.eos_token_id == 0


def _llama2_style_folder(path, config: dict):
    """A tiny Llama-2-style tokenizer folder (BPE with byte fallback, "▁" for spaces, <s> first)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    vocab = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "H", "i", "▁H", "▁Hi"]
    backend = Tokenizer(models.BPE(vocab={v: i for i, v in enumerate(vocab)}, merges=[("▁", "H"), ("▁H", "i")],
                                   unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in ("<unk>", "<s>", "</s>")])
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    path.mkdir(parents=True)
    backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_llama_tokenizers_pad_on_the_left(saved_smollm2, tmp_path):
    """transformers' Llama (and Gemma) tokenizers pad on the left unless tokenizer_config.json says
    otherwise; ours padded on the right. GPT-2's class pads on the right."""
    tokens = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>"}
    path = _llama2_style_folder(tmp_path / "llama", {"tokenizer_class": "LlamaTokenizerFast", **tokens})
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert ours.padding_side == hf.padding_side == "left"
    batch = ours.encode_batch(["Hi Hi", "Hi"])
    want = hf(["Hi Hi", "Hi"], padding=True, return_tensors="np")
    np.testing.assert_array_equal(batch["attention_mask"], want["attention_mask"])
    assert batch["attention_mask"][1, 0] == 0  # the shorter row's padding comes first
    path = _llama2_style_folder(tmp_path / "given", {"tokenizer_class": "LlamaTokenizerFast", "padding_side": "right",
                                                     **tokens})
    assert tc.Tokenizer.from_pretrained(path).padding_side == _hf(path).padding_side == "right"
    path = _variant(saved_smollm2, tmp_path / "gpt2", {"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|im_end|>"})
    assert tc.Tokenizer.from_pretrained(path).padding_side == _hf(path).padding_side == "right"
    # Llama-3's and DeepSeek-Coder's folders name LlamaTokenizerFast over a byte-level tokenizer.json:
    # transformers loads them as a generic tokenizer (right padding, no Llama defaults)
    path = _variant(saved_smollm2, tmp_path / "llama3", {"tokenizer_class": "LlamaTokenizerFast",
                                                         "eos_token": "<|im_end|>", "pad_token": "<|im_end|>"})
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert ours.padding_side == hf.padding_side == "right" and ours.bos_token == hf.bos_token
    want = hf(["Hi there", "Hi"], padding=True, return_tensors="np")
    np.testing.assert_array_equal(ours.encode_batch(["Hi there", "Hi"])["input_ids"], want["input_ids"])


def test_add_prefix_space_and_unregistered_special_tokens_as_transformers(saved_smollm2, tmp_path):
    """tokenizer_config.json's add_prefix_space was not applied ("Hello world" without the space
    its GPT-2 and Qwen2 tokenizers put first), and a named special token that tokenizer.json lists
    only as a vocabulary entry stayed ordinary ("Hi<|im_end|>" spelled out, kept by
    skip_special_tokens); transformers registers it as a special token."""
    config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": True, "eos_token": "<|im_end|>"}
    path = _variant(saved_smollm2, tmp_path / "space", config)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    for text in ("Hello world", " Hello", "a\nb"):
        assert ours.encode(text) == hf(text)["input_ids"], text
    assert ours.encode("Hello world") != tc.Tokenizer.from_pretrained(saved_smollm2).encode("Hello world")

    def unregister(spec):
        spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "<|im_end|>"]

    path = _variant(saved_smollm2, tmp_path / "unregistered", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                               "eos_token": "<|im_end|>"}, edit=unregister)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    ids = hf("Hi<|im_end|>")["input_ids"]
    assert ours.encode("Hi<|im_end|>") == ids and ids[-1] == ours.eos_token_id
    assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True) == "Hi"
    # given as an AddedToken dict, its lstrip and rstrip too
    eos = {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": True, "rstrip": True, "normalized": False,
           "special": True}
    path = _variant(saved_smollm2, tmp_path / "stripped", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                           "eos_token": eos}, edit=unregister)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    ids = hf("Hi <|im_end|> there")["input_ids"]
    assert ours.encode("Hi <|im_end|> there") == ids and ours.eos_token_id in ids


# ------------------------------------------------------------------------------------ named tokens, classes, Llama-2
def _bpe_folder(path, config: dict, added=(), config_json=None, prefix_space_in_json=False, specials=("<unk>",)):
    """A tiny byte-level BPE folder: tokenizer.json with ``specials`` first (special tokens of the
    trainer), ``added`` as ordinary added tokens, RoBERTa's post-processor (<s> ... </s>) when
    ``specials`` hold them; tokenizer_config.json ``config``, config.json ``config_json`` if given."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space_in_json)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(["Hello world, this is a test.", "the quick brown fox"] * 20, trainers.BpeTrainer(
        vocab_size=400, special_tokens=list(specials), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if "<s>" in specials and "</s>" in specials:
        backend.post_processor = processors.RobertaProcessing(("</s>", specials.index("</s>")),
                                                              ("<s>", specials.index("<s>")))
    if added:
        backend.add_tokens(list(added))
    path.mkdir(parents=True)
    backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    if config_json is not None:
        (path / "config.json").write_text(json.dumps(config_json))
    return path


def test_named_tokens_listed_as_plain_added_tokens_become_special(tmp_path):
    """A bos/eos that tokenizer.json holds as a non-special added token stayed non-special:
    decode(skip_special_tokens=True) kept "<s>" and "</s>"; transformers marks them special."""
    path = _bpe_folder(tmp_path / "f", {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                                        "eos_token": "</s>"}, added=["<s>", "</s>"])
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    ids = hf.encode("<s>Hi</s>")
    assert ours.encode("<s>Hi</s>") == ids
    assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True) == "Hi"
    assert ours.all_special_tokens == hf.all_special_tokens


@pytest.mark.parametrize("tokenizer_class", [None, "BertTokenizer", "ElectraTokenizerFast", "DistilBertTokenizer"])
def test_bert_classes_take_their_default_special_tokens(tmp_path, tokenizer_class):
    """A bert-base-uncased-style folder (no token keys) had no cls/sep/mask token; transformers'
    BERT classes take [CLS], [SEP], [MASK], [PAD], [UNK] by default."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer()
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    backend.train_from_iterator(["hello world"] * 10, trainers.WordPieceTrainer(
        vocab_size=100, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    backend.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    path = tmp_path / "bert"
    path.mkdir()
    backend.save(str(path / "tokenizer.json"))
    config = {"do_lower_case": True, "model_max_length": 512}
    if tokenizer_class is not None:
        config["tokenizer_class"] = tokenizer_class
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]}))
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    for name in ("cls_token", "sep_token", "mask_token", "pad_token", "unk_token", "all_special_tokens",
                 "all_special_ids"):
        assert getattr(ours, name) == getattr(hf, name), name
    assert ours.cls_token == "[CLS]" and ours.encode("[MASK] hello") == hf.encode("[MASK] hello")


@pytest.mark.parametrize("tokenizer_class,config", [
    ("GPT2Tokenizer", {}), ("Qwen2Tokenizer", {}), ("CodeGenTokenizer", {"add_prefix_space": False}),
    ("RobertaTokenizer", {}), ("CodeGenTokenizer", {"add_prefix_space": True})])
def test_add_prefix_space_class_default_and_other_classes(tmp_path, tokenizer_class, config):
    """tokenizer.json says ByteLevel(add_prefix_space=true): transformers' GPT-2/Qwen2 classes rebuild it
    from tokenizer_config.json's add_prefix_space, default false, and CodeGen's and RoBERTa's too; ours
    kept the prefix space ([221, 289, 288] for "Hello world")."""
    path = _bpe_folder(tmp_path / "f", {"tokenizer_class": tokenizer_class, "eos_token": "<unk>", **config},
                       prefix_space_in_json=True)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    for text in ("Hello world", " Hello", "the quick\nbrown fox"):  # (RoBERTa's class adds its own <s> ... </s>)
        ids = hf.encode(text, add_special_tokens=False)
        assert ours.encode(text, add_special_tokens=False) == ids, text
        assert ours.decode(ids) == hf.decode(ids), text


LLAMA_TEXTS = [" Hello", "Hi</s> there", "Hi </s>there", "Hello  world ", "", " ", "héllo ✓ 日本", "the<s>quick",
               "\nHi\tthere  "]


def _trained_llama2_folder(path, config: dict):
    """A Llama-2-style folder whose tokenizer.json keeps the legacy Prepend/Replace normalizer."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers

    backend = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>", "<bos>", "<eos>", "<pad>", "<mask>"] + [f"<0x{b:02X}>" for b in range(256)]
    backend.train_from_iterator(["Hello world, this is a test.", "the quick brown fox", "Hi there"] * 20,
                                trainers.BpeTrainer(vocab_size=500, special_tokens=specials))
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", 1)])
    path.mkdir(parents=True)
    backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    return path


@pytest.mark.parametrize("tokenizer_class", ["LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer",
                                             "GemmaTokenizer"])
@pytest.mark.parametrize("legacy", [None, True, False])
@pytest.mark.parametrize("add_prefix_space", [None, True, False])
def test_sentencepiece_classes_rebuild_their_pipeline_as_transformers(tmp_path, tokenizer_class, legacy,
                                                                       add_prefix_space):
    """transformers 5's Llama/CodeLlama/Gemma classes drop tokenizer.json's legacy normalizer and
    rebuild a Metaspace pipeline from legacy and add_prefix_space; we kept the file's, so a leading
    space and the text after a special token ("...</s> there") gave other ids."""
    config = {"tokenizer_class": tokenizer_class, "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    for key, value in (("legacy", legacy), ("add_prefix_space", add_prefix_space)):
        if value is not None:
            config[key] = value
    path = _trained_llama2_folder(tmp_path / "f", config)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    for text in LLAMA_TEXTS:
        ids = hf.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == hf.decode(ids), text
        assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True), text


def test_sentencepiece_class_over_another_model_is_refused(tmp_path):
    """A Llama class over a Unigram tokenizer.json: transformers would rebuild it as a BPE, which is
    not reproduced; refused, naming the file, rather than giving other ids."""
    from tokenizers import Tokenizer, models

    path = tmp_path / "uni"
    path.mkdir()
    Tokenizer(models.Unigram([("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0), ("▁a", -1.0)], 0)).save(
        str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    with pytest.raises(ValueError) as info:
        tc.Tokenizer.from_pretrained(path)
    assert str(info.value).startswith(f"{path / 'tokenizer.json'}: a Unigram model under the folder's tokenizer "
                                      f"class 'LlamaTokenizer'")
    # the class named by config.json only (no tokenizer_config.json): the message names the file that is there
    (path / "tokenizer_config.json").unlink()
    (path / "config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path / 'tokenizer.json'))}: a Unigram model .*"
                                         r"config.json's tokenizer_class or model_type"):
        tc.Tokenizer.from_pretrained(path)


# ------------------------------------------------------------------------------------ AutoTokenizer's class choice
@pytest.mark.parametrize("model_type", ["mistral", "mixtral", "phi3"])
@pytest.mark.parametrize("legacy", [None, True, False])
def test_generic_model_types_keep_the_files_pipeline_as_autotokenizer(tmp_path, model_type, legacy):
    """Mistral-7B's, Mixtral's and Phi-3's folders name LlamaTokenizer, but their model types are
    registered to transformers 5's generic TokenizersBackend, which AutoTokenizer loads whatever
    tokenizer_class says: tokenizer.json's Prepend/Replace pipeline is kept. Ours rebuilt Llama's
    Metaspace pipeline, so " Hello" lost its leading "▁" ([1, 310, 298] for [1, 281, 310, 298])."""
    config = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    if legacy is not None:
        config["legacy"] = legacy
    path = _trained_llama2_folder(tmp_path / "f", config)
    (path / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": ["MistralForCausalLM"]}))
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert type(hf).__name__ == "TokenizersBackend"
    for text in LLAMA_TEXTS:
        ids = hf.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == hf.decode(ids), text
        assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True), text
    assert ours.padding_side == hf.padding_side == "right"


def test_a_registered_class_that_wins_over_tokenizer_class_as_autotokenizer(tmp_path):
    """For a model type whose folders name the wrong class (qwen2, MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS),
    AutoTokenizer takes the registered Qwen2Tokenizer over the folder's GPT2Tokenizer: no bos token;
    ours took GPT-2's default bos "<|endoftext|>"."""
    path = _bpe_folder(tmp_path / "f", {"tokenizer_class": "GPT2Tokenizer"}, added=["<|endoftext|>"],
                       config_json={"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert type(hf).__name__ == "Qwen2Tokenizer"
    for name in ("bos_token", "eos_token", "unk_token", "pad_token", "all_special_tokens"):
        assert getattr(ours, name) == getattr(hf, name), name
    assert ours.bos_token is None and ours.eos_token == "<|endoftext|>"


def _roberta_folder(path, config: dict, config_json: dict | None, specials):
    """A tiny byte-level BPE folder with RoBERTa's post-processor (<s> ... </s>) and ``specials`` first."""
    return _bpe_folder(path, config, config_json=config_json, specials=list(specials))


@pytest.mark.parametrize("config,config_json", [
    ({"model_max_length": 512}, {"model_type": "roberta", "architectures": ["RobertaForMaskedLM"]}),
    ({"tokenizer_class": "RobertaTokenizer", "model_max_length": 512}, None)])
def test_roberta_class_takes_its_default_special_tokens(tmp_path, config, config_json):
    """A roberta-base-style folder (tokenizer_config.json {"model_max_length": 512}) had no cls/sep/mask
    token and padded with <s> (id 0); transformers' RobertaTokenizer pads with <pad> (id 1)."""
    path = _roberta_folder(tmp_path / "f", config, config_json, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    for name in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
                 "all_special_tokens", "all_special_ids"):
        assert getattr(ours, name) == getattr(hf, name), name
    texts = ["Hi", "Hello world the quick", "<mask> fox"]
    want = hf(texts, padding=True, truncation=True, return_tensors="np")
    got = ours(texts)
    np.testing.assert_array_equal(got["input_ids"], want["input_ids"])
    np.testing.assert_array_equal(got["attention_mask"], want["attention_mask"])
    assert got["input_ids"][0, -1] == ours.pad_token_id == 1


@pytest.mark.parametrize("tokenizer_class,model_type", [
    (None, "gpt_neox"), ("GPTNeoXTokenizerFast", None), ("CodeGenTokenizer", None), (None, "codegen"),
    ("DebertaTokenizer", None), ("WhisperTokenizer", None)])
def test_byte_level_classes_take_their_default_special_tokens(tmp_path, tokenizer_class, model_type):
    """GPT-NeoX's, CodeGen's, DeBERTa's, ... folders without token keys had no bos/eos/unk (GPT-NeoX
    no pad); transformers' classes take <|endoftext|> (GPT-NeoX's pad <|padding|>; DeBERTa's [CLS], ...)."""
    specials = ["<|endoftext|>", "<|padding|>", "[CLS]", "[SEP]", "[UNK]", "[PAD]", "[MASK]"]
    config = {} if tokenizer_class is None else {"tokenizer_class": tokenizer_class}
    config_json = None if model_type is None else {"model_type": model_type, "architectures": ["XForCausalLM"]}
    path = _roberta_folder(tmp_path / "f", config, config_json, specials)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    for name in ("bos_token", "eos_token", "unk_token", "sep_token", "cls_token", "mask_token",
                 "all_special_tokens", "all_special_ids"):
        assert getattr(ours, name) == getattr(hf, name), name
    if hf.pad_token is not None:  # (a causal LM without one pads with its eos token here)
        assert ours.pad_token == hf.pad_token
    for text in ("Hello world<|endoftext|>", "the quick [MASK] fox"):  # (DeBERTa's and Whisper's classes
        ids = hf.encode(text, add_special_tokens=False)  # also rebuild their post-processor: not done here)
        assert ours.encode(text, add_special_tokens=False) == ids, text
        assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True), text


def test_class_default_tokens_are_those_of_the_transformers_classes():
    """The table of class defaults against the *_token defaults of each transformers class's __init__
    (the first class of its MRO that names them), so that it cannot drift."""
    import inspect

    import transformers
    from transformer_core.tokenizer import _CLASS_SPECIAL_TOKENS

    named = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
    for name, tokens in _CLASS_SPECIAL_TOKENS.items():
        for klass in getattr(transformers, name).__mro__:
            params = inspect.signature(klass.__init__).parameters
            if any(p in params for p in named):
                break
        want = {p: params[p].default for p in named if p in params and params[p].default is not None}
        assert tokens == want, name


@pytest.mark.parametrize("model_type", ["bart", "longformer", "data2vec-text", "ibert"])
def test_model_types_of_roberta_class_take_its_defaults_as_autotokenizer(tmp_path, model_type):
    """A bart-base-style folder (no tokenizer_config.json, config.json's model_type "bart"): transformers
    maps the model type to RobertaTokenizer, which pads with <pad> (id 1) and has a mask token; ours
    mapped only "roberta", so it padded with <s> (id 0) and had no cls/sep/mask token."""
    path = _roberta_folder(tmp_path / "f", {}, {"model_type": model_type},
                           ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    (path / "tokenizer_config.json").unlink()
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert type(hf).__name__ == "RobertaTokenizer"
    for name in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
                 "pad_token_id", "all_special_tokens", "all_special_ids"):
        assert getattr(ours, name) == getattr(hf, name), name
    texts = ["Hi", "Hello world the quick", "<mask> fox"]
    want = hf(texts, padding=True, return_tensors="np")
    got = ours(texts)
    np.testing.assert_array_equal(got["input_ids"], want["input_ids"])
    np.testing.assert_array_equal(got["attention_mask"], want["attention_mask"])
    assert got["input_ids"][0, -1] == 1


@pytest.mark.parametrize("model_type", ["opt", "phi", "gptj", "mpt", "mamba", "qwen2_moe", "deberta"])
def test_byte_level_model_types_take_their_class_defaults_as_autotokenizer(tmp_path, model_type):
    """Model types that transformers maps to GPT-2's, GPT-NeoX's, Qwen2's or DeBERTa's class had no
    class here, so no bos/eos/unk (GPT-NeoX's pad <|padding|>, DeBERTa's [CLS], ...)."""
    specials = ["<|endoftext|>", "<|padding|>", "[CLS]", "[SEP]", "[UNK]", "[PAD]", "[MASK]"]
    path = _roberta_folder(tmp_path / "f", {}, {"model_type": model_type, "architectures": ["XForCausalLM"]},
                           specials)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    for name in ("bos_token", "eos_token", "unk_token", "sep_token", "cls_token", "mask_token",
                 "all_special_tokens", "all_special_ids"):
        assert getattr(ours, name) == getattr(hf, name), name
    if hf.pad_token is not None:
        assert ours.pad_token == hf.pad_token
    for text in ("Hello world<|endoftext|>", "the quick [MASK] fox"):
        ids = hf.encode(text, add_special_tokens=False)
        assert ours.encode(text, add_special_tokens=False) == ids, text
        assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True), text


def test_class_of_model_type_is_transformers_mapping():
    """The model-type table against transformers' TOKENIZER_MAPPING_NAMES, restricted to the classes
    this module knows (their defaults, flags or rebuilt pipelines) and to the model types with a
    config class (AutoTokenizer loads the others, code_llama or nezha, as the generic class), so
    that it cannot drift."""
    import warnings

    from transformer_core import tokenizer as t

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
        from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    known = (set(t._CLASS_SPECIAL_TOKENS) | set(t._PREFIX_SPACE_CLASSES) | t._BERT_NORMALIZER_CLASSES
             | t._SENTENCEPIECE_CLASSES | t._LEFT_PADDING_CLASSES)
    want = {model_type: name.removesuffix("Fast") for model_type, name in TOKENIZER_MAPPING_NAMES.items()
            if name is not None and name.removesuffix("Fast") in known and model_type in CONFIG_MAPPING_NAMES}
    assert t._CLASS_OF_MODEL_TYPE == want
    assert not set(want) & t._GENERIC_CLASS_MODEL_TYPES


@pytest.mark.parametrize("tokenizer_config_class", [None, "PreTrainedTokenizerFast"])
def test_tokenizer_class_of_config_json_as_autotokenizer(tmp_path, tokenizer_config_class):
    """config.json's tokenizer_class (GPT-J's and older checkpoints') is AutoTokenizer's class when
    tokenizer_config.json names none: a Llama-2-style folder naming LlamaTokenizer only there kept
    tokenizer.json's Prepend/Replace pipeline (" Hello": [1, 281, 310, 298] for [1, 310, 298]). A
    class named in tokenizer_config.json still wins."""
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    if tokenizer_config_class is not None:
        config["tokenizer_class"] = tokenizer_config_class
    path = _trained_llama2_folder(tmp_path / "f", config)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "tokenizer_class": "LlamaTokenizer",
                                                  "architectures": ["LlamaForCausalLM"]}))
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert type(hf).__name__ == ("LlamaTokenizer" if tokenizer_config_class is None else "TokenizersBackend")
    for text in LLAMA_TEXTS:
        ids = hf.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == hf.decode(ids), text
    assert ours.padding_side == hf.padding_side


def test_tokenizer_class_of_config_json_gives_its_default_tokens(tmp_path):
    """A RoBERTa folder whose class is named only in config.json (no model_type): RobertaTokenizer's
    default tokens, as AutoTokenizer; ours padded with <s> (id 0) and had no mask token."""
    path = _roberta_folder(tmp_path / "f", {"model_max_length": 512}, {"tokenizer_class": "RobertaTokenizer"},
                           ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert type(hf).__name__ == "RobertaTokenizer"
    for name in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
                 "all_special_tokens", "all_special_ids"):
        assert getattr(ours, name) == getattr(hf, name), name
    texts = ["Hi", "Hello world the quick", "<mask> fox"]
    np.testing.assert_array_equal(ours(texts)["input_ids"], hf(texts, padding=True, return_tensors="np")["input_ids"])


@pytest.mark.parametrize("model_type", ["code_llama", "nezha"])
def test_model_types_without_a_config_class_keep_the_files_pipeline(tmp_path, model_type):
    """transformers 5.23 has no config class for code_llama or nezha (its tokenizer table still names
    one): AutoTokenizer loads such a folder as the generic class, the file's pipeline and no class
    defaults. The table gave CodeLlama's tokens and left padding, or lowercased a cased folder."""
    specials = ["<|endoftext|>", "[CLS]", "[SEP]", "[UNK]", "[PAD]", "[MASK]", "<s>", "</s>", "<unk>"]
    path = _roberta_folder(tmp_path / "f", {}, {"model_type": model_type, "architectures": ["XModel"]}, specials)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    for name in ("bos_token", "eos_token", "unk_token", "sep_token", "cls_token", "mask_token"):
        assert getattr(ours, name) == getattr(hf, name), name
    for text in ("Hello World", "the Quick [MASK] fox"):
        assert ours.encode(text) == hf.encode(text), text
    assert ours(["a", "a b c"])["attention_mask"][0].tolist()[0] == 1  # padded on the right, as the generic class


def test_cohere_class_pads_on_the_left_as_transformers():
    """transformers' CohereTokenizer pads on the left (its padding_side); ours padded cohere folders
    on the right."""
    import transformers
    from transformer_core.tokenizer import _LEFT_PADDING_CLASSES

    assert transformers.CohereTokenizer.padding_side == "left"
    assert "CohereTokenizer" in _LEFT_PADDING_CLASSES
    for name in _LEFT_PADDING_CLASSES:  # every class listed pads on the left in transformers
        assert getattr(transformers, name).padding_side == "left", name


def _lowercase_then_cased_bert(tmp_path) -> str:
    """MiniLM's tokenizer.json with the normalizer sentence-transformers 6 writes for
    ``do_lower_case`` over a cased BERT: ``Sequence([Lowercase(), BertNormalizer(lowercase=False)])``."""
    tokenizer_json = json.loads((MODEL_DIR / "tokenizer.json").read_text())
    tokenizer_json["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Lowercase"}, {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                                "strip_accents": None, "lowercase": False}]}
    path = tmp_path / "lowercase_then_cased.json"
    path.write_text(json.dumps(tokenizer_json))
    return path


@pytest.mark.parametrize("tokenizer_class,clean_text", [
    ("BertTokenizer", None), ("DistilBertTokenizer", None), ("ElectraTokenizerFast", None),
    ("FunnelTokenizer", False), ("FunnelTokenizer", None), ("ConvBertTokenizer", None), ("PreTrainedTokenizerFast", None)])
def test_bert_classes_build_their_normalizer_whatever_tokenizer_json_holds(tmp_path, tokenizer_class, clean_text):
    """transformers 5's BERT tokenizer classes (BertTokenizer.__init__) build a new BertNormalizer
    from tokenizer_config.json's flags and drop tokenizer.json's normalizer whatever it is; ours
    kept a Sequence([Lowercase(), BertNormalizer(lowercase=False)]) (what sentence-transformers 6
    saves for do_lower_case over a cased BERT, with "do_lower_case": false in tokenizer_config.json)
    and lowercased: "Hello World Straße" gave [101, 7592, 2088, 2358, 27807, 102] for transformers'
    [101, 100, 100, 100, 102]. Funnel's class also reads clean_text; ConvBertTokenizer (no __init__
    of its own) and PreTrainedTokenizerFast keep tokenizer.json's normalizer. Against AutoTokenizer."""
    config = _minilm_config(do_lower_case=False, tokenizer_class=tokenizer_class)
    if clean_text is not None:
        config["clean_text"] = clean_text
    path = _folder(tmp_path, _lowercase_then_cased_bert(tmp_path), config)
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert ours.backend.normalizer.__getstate__() == hf.backend_tokenizer.normalizer.__getstate__()
    for text in ["Hello World Straße", "hello\x07world\ufffd", "ÉCOLE 東京", *TEXTS]:
        assert ours.encode(text) == hf(text)["input_ids"], text
    lowered = tokenizer_class in ("ConvBertTokenizer", "PreTrainedTokenizerFast")
    assert (ours.encode("Hello World Straße") == [101, 100, 100, 100, 102]) != lowered


@pytest.mark.parametrize("tokenizer_class,changes", [("ConvBertTokenizer", {"do_lower_case": False}),
                                                     ("FunnelTokenizer", {"clean_text": False})])
def test_convbert_keeps_and_funnel_cleans_as_transformers(tmp_path, tokenizer_class, changes):
    """Over MiniLM's own tokenizer.json (a lowercasing BertNormalizer): ConvBertTokenizer has no
    __init__ of its own, so transformers keeps that normalizer and ignores do_lower_case (ours set
    lowercase=False from it: "Hello" became [UNK]); FunnelTokenizer builds clean_text from
    tokenizer_config.json (ours kept tokenizer.json's: a control character was removed). Against
    AutoTokenizer."""
    path = _folder(tmp_path, MODEL_DIR / "tokenizer.json", _minilm_config(tokenizer_class=tokenizer_class, **changes))
    hf, ours = _hf(path), tc.Tokenizer.from_pretrained(path)
    assert ours.backend.normalizer.__getstate__() == hf.backend_tokenizer.normalizer.__getstate__()
    for text in ["Hello World", "hello\x07world\ufffd", *TEXTS]:
        assert ours.encode(text) == hf(text)["input_ids"], text


def test_convbert_flags_are_checked_though_its_normalizer_is_kept(tmp_path):
    """ConvBertTokenizer keeps tokenizer.json's normalizer, but transformers still refuses a flag of
    the wrong type (its typed BertTokenizer.__init__): a ``"do_lower_case": "false"`` folder loaded
    silently here; a ValueError naming the file and the key now."""
    import warnings

    from transformers import AutoTokenizer

    path = _folder(tmp_path, MODEL_DIR / "tokenizer.json",
                   _minilm_config(tokenizer_class="ConvBertTokenizer", do_lower_case="false"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TypeError):
            AutoTokenizer.from_pretrained(path)
    with pytest.raises(ValueError, match=r"tokenizer_config.json: do_lower_case: expected a bool, got str 'false'"):
        tc.Tokenizer.from_pretrained(path)
