"""Tokenization with the ``tokenizers`` package (Hugging Face's Rust tokenizers): WordPiece for BERT
and byte-level BPE for GPT-2 / Llama from a model's ``tokenizer.json`` (the encoder tutorial's first
step: "time flies like an arrow" -> [101, 2051, 10029, 2066, 2019, 8612, 102]), and
byte-level BPE rebuilt from a GGUF file's ``tokenizer.ggml.*`` metadata (SmolLM2).

Two modes: an encoder (BERT) tokenizer truncates to ``max_length`` and pads batches, as before; a
causal-LM tokenizer (``max_length=None``: GGUF files, directories whose ``config.json`` names a
``*ForCausalLM`` / ``*LMHeadModel``, tokenizer folders that show a causal LM's tokenizer or give no
length: see :meth:`Tokenizer.from_pretrained`) never truncates, pads only inside
:meth:`Tokenizer.encode_batch`, knows its BOS/EOS tokens and chat template, and streams text with
:class:`TextStream`.
"""

from __future__ import annotations

import json
import os
import threading
import unicodedata
from pathlib import Path

import numpy as np

from ._validation import check_bool, check_choice, check_int, check_optional_int, physical_memory_bytes, to_numpy
from .hub import read_json_file, resolve_model_path

__all__ = ["Tokenizer", "TextStream", "GGUF_PRE_TOKENIZERS"]

# llama.cpp's token types (tokenizer.ggml.token_type): 1 normal, 2 unknown, 3 control, 4 user-defined,
# 5 unused, 6 byte.
_CONTROL, _USER_DEFINED = 3, 4

#: ``tokenizer.ggml.pre`` values :meth:`Tokenizer.from_gguf` rebuilds, and how (see
#: ``_gguf_pre_tokenizer``): "gpt2" is GPT-2's split; "smollm" / "starcoder" first isolate every
#: digit (llama.cpp's ``\p{N}`` step, the ``Digits(individual_digits=True)`` of SmolLM2's own
#: ``tokenizer.json``), then GPT-2's split. "default" (also a file without ``tokenizer.ggml.pre``)
#: is rebuilt as GPT-2's split, as transformers' GGUF converter does; that is not llama.cpp's
#: "default", whose regexes also split runs of punctuation off first and cut runs of digits into
#: groups of three.
GGUF_PRE_TOKENIZERS = ("default", "gpt2", "smollm", "starcoder")

#: transformers' apply_chat_template options that Tokenizer.apply_chat_template does not implement:
#: refused, not passed to the template as variables.
_HF_CHAT_OPTIONS = ("padding", "truncation", "max_length", "return_tensors",
                    "return_assistant_tokens_mask", "tokenizer_kwargs", "sanitize_control_tokens")

#: transformers' named special tokens, in the order of its ``SPECIAL_TOKENS_ATTRIBUTES`` (the order of
#: ``all_special_tokens`` / ``all_special_ids``, before the extra special tokens).
_NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

_CAUSAL_MODEL_TYPES = {"gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gpt_neox", "olmo"}

#: ``tokenizer_config.json``'s ``tokenizer_class`` of those models' tokenizers (with or without
#: transformers' ``Fast`` suffix): a tokenizer folder without ``config.json`` that names one is a
#: causal LM's.
_CAUSAL_TOKENIZER_CLASSES = {"GPT2Tokenizer", "LlamaTokenizer", "CodeLlamaTokenizer", "Qwen2Tokenizer",
                             "GemmaTokenizer", "GPTNeoXTokenizer"}

#: transformers' ``clean_up_tokenization`` (``tokenization_utils_base.py``), in its order: what
#: :meth:`Tokenizer.decode` replaces with ``clean_up_tokenization_spaces``.
_CLEAN_UP_TOKENIZATION = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))

#: ``tokenizer_config.json``'s flags of transformers' BERT tokenizers and the ``BertNormalizer``
#: argument each sets (see :func:`_apply_bert_normalizer_flags`).
_BERT_NORMALIZER_FLAGS = (("do_lower_case", "lowercase"), ("strip_accents", "strip_accents"),
                          ("tokenize_chinese_chars", "handle_chinese_chars"))
#: transformers' defaults of those keys (``BertTokenizer``'s arguments; ``clean_text``, always true
#: for BERT's, is read by ``FunnelTokenizer`` only), taken when ``tokenizer_config.json`` lacks one
#: and transformers builds the normalizer from them: for the tokenizer classes below
#: (:func:`_declared_class`), whose own ``__init__`` builds a new ``BertNormalizer`` whatever
#: ``tokenizer.json``'s normalizer is. Another class (``PreTrainedTokenizerFast``,
#: ``TokenizersBackend``, ``ConvBertTokenizer``, which has no ``__init__`` of its own) keeps
#: ``tokenizer.json``'s normalizer.
_BERT_NORMALIZER_DEFAULTS = {"do_lower_case": True, "strip_accents": None, "tokenize_chinese_chars": True,
                             "clean_text": True}
_BERT_NORMALIZER_CLASSES = frozenset({
    "BertTokenizer", "DistilBertTokenizer", "ElectraTokenizer", "MPNetTokenizer", "MobileBertTokenizer",
    "SqueezeBertTokenizer", "LayoutLMTokenizer", "LxmertTokenizer", "FunnelTokenizer"})

#: BERT's default special tokens (``BertTokenizer.__init__``), also those of the classes transformers 5
#: makes BERT's (``ElectraTokenizer``, ``MobileBertTokenizer``, ... are ``BertTokenizer``).
_BERT_SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                        "mask_token": "[MASK]"}
#: transformers 5's tokenizer classes whose own defaults fill what tokenizer_config.json leaves out
#: (the special tokens of their ``__init__``; a causal LM's also its ``padding_side``), and the class
#: a folder without ``tokenizer_class`` gets from ``config.json``'s ``model_type``
#: (``TOKENIZER_MAPPING_NAMES``). A folder of another class (``PreTrainedTokenizerFast``,
#: ``TokenizersBackend``) has no such defaults.
_CLASS_SPECIAL_TOKENS = {
    **dict.fromkeys(("BertTokenizer", "DistilBertTokenizer", "ElectraTokenizer", "MobileBertTokenizer",
                     "SqueezeBertTokenizer", "LayoutLMTokenizer", "LxmertTokenizer", "ConvBertTokenizer"),
                    _BERT_SPECIAL_TOKENS),
    "MPNetTokenizer": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "[UNK]", "sep_token": "</s>",
                       "pad_token": "<pad>", "cls_token": "<s>", "mask_token": "<mask>"},
    "FunnelTokenizer": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "<sep>",
                        "pad_token": "<pad>", "cls_token": "<cls>", "mask_token": "<mask>"},
    "GPT2Tokenizer": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"},
    "Qwen2Tokenizer": {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"},
    "LlamaTokenizer": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "CodeLlamaTokenizer": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "GemmaTokenizer": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
                       "mask_token": "<mask>"},
    # RoBERTa's and the classes whose __init__ takes RoBERTa's tokens
    **dict.fromkeys(("RobertaTokenizer", "MarkupLMTokenizer", "BlenderbotTokenizer", "LayoutLMv3Tokenizer",
                     "LukeTokenizer"),
                    {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>",
                     "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>"}),
    "DebertaTokenizer": {"bos_token": "[CLS]", "eos_token": "[SEP]", "sep_token": "[SEP]", "cls_token": "[CLS]",
                         "unk_token": "[UNK]", "pad_token": "[PAD]", "mask_token": "[MASK]"},
    "GPTNeoXTokenizer": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
                         "pad_token": "<|padding|>"},
    **dict.fromkeys(("CodeGenTokenizer", "WhisperTokenizer"),
                    {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}),
    "Qwen3_5Tokenizer": {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"},
    "CohereTokenizer": {"bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>", "unk_token": "<UNK>",
                        "pad_token": "<PAD>", "cls_token": "<CLS>", "sep_token": "<SEP>", "mask_token": "<MASK_TOKEN>"},
}
_LEFT_PADDING_CLASSES = frozenset({"LlamaTokenizer", "CodeLlamaTokenizer", "GemmaTokenizer", "CohereTokenizer"})
#: transformers 5's classes that build their ``ByteLevel`` pre-tokenizer from ``add_prefix_space``
#: (each ``__init__``'s ``pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)``), with the
#: class's default when tokenizer_config.json leaves the key out (see ``_apply_add_prefix_space``).
_PREFIX_SPACE_CLASSES = {
    **dict.fromkeys(("GPT2Tokenizer", "Qwen2Tokenizer", "Qwen3_5Tokenizer", "CodeGenTokenizer", "CohereTokenizer",
                     "DebertaTokenizer", "GPTNeoXTokenizer", "LukeTokenizer", "MarkupLMTokenizer", "RobertaTokenizer",
                     "WhisperTokenizer"), False),
    "BlenderbotTokenizer": True, "LayoutLMv3Tokenizer": True,
}
#: The tokenizer class transformers 5 gives a folder without ``tokenizer_class`` by its
#: ``config.json``'s ``model_type``: transformers 5.23's ``TOKENIZER_MAPPING_NAMES``, restricted to
#: the classes above and to the model types it has a config class for (those it has none for, such
#: as ``code_llama`` or ``nezha``, load as the generic class: the file's pipeline); a test compares.
_CLASS_OF_MODEL_TYPE = {
    **dict.fromkeys(("align", "bark", "bert", "blip", "bros", "chinese_clip", "convbert", "distilbert", "electra",
                     "ernie", "flava", "git", "grounding-dino", "layoutlm", "megatron-bert", "mm-grounding-dino",
                     "nomic_bert", "squeezebert", "tvp", "vilt", "visual_bert"), "BertTokenizer"),
    "blenderbot": "BlenderbotTokenizer", "deberta": "DebertaTokenizer",
    "funnel": "FunnelTokenizer", "layoutlmv3": "LayoutLMv3Tokenizer", "luke": "LukeTokenizer",
    "lxmert": "LxmertTokenizer", "markuplm": "MarkupLMTokenizer", "mobilebert": "MobileBertTokenizer",
    "mpnet": "MPNetTokenizer", "whisper": "WhisperTokenizer",
    **dict.fromkeys(("aya_vision", "cohere", "cohere2"), "CohereTokenizer"),
    **dict.fromkeys(("blip-2", "codegen", "dbrx", "emu3", "gpt2", "gpt_neo", "gptj", "hyperclovax_vision_v2",
                     "instructblip", "instructblipvideo", "jais2", "opt", "phi", "starcoder2"), "GPT2Tokenizer"),
    **dict.fromkeys(("falcon_mamba", "gpt_neox", "mamba", "mamba2", "mpt", "olmo", "olmoe", "rwkv", "xlstm"),
                    "GPTNeoXTokenizer"),
    **dict.fromkeys(("diffusion_gemma", "gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma3n_text",
                     "recurrent_gemma", "shieldgemma2", "t5gemma", "zaya"), "GemmaTokenizer"),
    **dict.fromkeys(("idefics", "idefics2"), "LlamaTokenizer"),
    **dict.fromkeys(("audioflamingo3", "colqwen2", "cosmos3_omni", "dots3_note", "fun_asr_nano", "hunyuan_vl",
                     "internvl", "lighton_ocr", "moss_transcribe_diarize", "ovis2", "qianfan_ocr", "qwen2",
                     "qwen2_5_omni", "qwen2_5_vl", "qwen2_audio", "qwen2_moe", "qwen2_vl", "qwen3", "qwen3_asr",
                     "qwen3_moe", "qwen3_next", "qwen3_omni_moe", "qwen3_vl", "qwen3_vl_moe", "vibevoice"),
                    "Qwen2Tokenizer"),
    **dict.fromkeys(("qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text", "qwen4_exp"), "Qwen3_5Tokenizer"),
    **dict.fromkeys(("bart", "bridgetower", "clap", "data2vec-text", "ibert", "lilt", "longformer", "mra",
                     "roberta", "roberta-prelayernorm"), "RobertaTokenizer"),
}
#: ``config.json`` model types that transformers 5 registers to a generic class (``TokenizersBackend``,
#: ``MistralCommonBackend``; ``TOKENIZER_MAPPING_NAMES`` with ``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS``
#: added): its ``AutoTokenizer`` loads such a folder as ``TokenizersBackend`` whatever
#: ``tokenizer_class`` it names (Mistral-7B's and Phi-3's name ``LlamaTokenizer``), keeping
#: ``tokenizer.json``'s pipeline (see :func:`_declared_class`).
_GENERIC_CLASS_MODEL_TYPES = frozenset({
    "EvollaModel", "arctic", "aria", "beam", "bigbird_pegasus", "camembertv2-base", "canary", "chatlm", "cohere_asr",
    "ernie4_5", "ernie4_5_moe", "flex_olmo", "fuyu", "glm", "glm4", "glm4_moe", "glm4_moe_lite", "glm4v", "glm4v_moe",
    "glm_image", "glmasr", "got_ocr2", "gpt_bigcode", "gradium_phonon_tts", "granite", "granitemoe",
    "granitemoehybrid", "granitemoeshared", "h2ovl_chat", "hyperclovax", "hyperclovax_vlm", "internlm2", "internlm3",
    "iquestcoder", "jamba", "kimi_k25", "kimi_linear", "kosmos-2", "llava", "llava_next", "mimo_v2_flash",
    "minicpm3", "minicpm_ocr", "minicpmv", "minicpmv4_6", "minicpmv4_7", "minimax_m2", "ministral", "ministral3",
    "mistral", "mistral3", "mistral_large4", "mixtral", "modernbert", "modernbert-decoder", "molmo", "molmo2",
    "nemo_speechlm", "nemotron", "nvfp4", "nystromformer", "olmo2", "olmo3", "olmo_hybrid", "opencua", "openvla",
    "paddleocr_vl", "pegasus_x", "persimmon", "phi3", "phi3_v", "phimoe", "pix2struct", "pixtral", "pocket_tts",
    "smolvlm", "stablelm", "step3_vl", "umt5", "vipllava", "voxtral", "voxtral_realtime", "xlm-roberta-xl"})
#: The model types of ``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`` registered to a specific class:
#: transformers 5 takes that class over the folder's ``tokenizer_class``.
_REGISTERED_CLASS_WINS = {
    "hyperclovax_vision_v2": "GPT2Tokenizer", "qwen2": "Qwen2Tokenizer", "siglip2": "Siglip2Tokenizer",
    **dict.fromkeys(("qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen4_exp"), "Qwen3_5Tokenizer"),
}

#: transformers' ``model_max_length`` for "no limit" (``VERY_LARGE_INTEGER``, int(1e30)) and anything
#: this large: not a length to truncate to.
_NO_LENGTH = 1_000_000


def check_unicode(text: str, name: str, index: int | None = None) -> None:
    """Raises ValueError, naming ``name`` (and ``index``, the text's place in a list) and the
    position, when ``text`` holds a lone surrogate: Python's stand-in for bytes that were not valid
    UTF-8 (a command-line argument, a file read with ``surrogateescape``), which the tokenizers
    package would otherwise reject with a message naming none of them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        where = f"position {e.start}" + ("" if index is None else f" of the text at index {index}")
        raise ValueError(f"{name}: expected valid Unicode text, got a lone surrogate {text[e.start]!r} at {where} "
                         f"(bytes that are not valid UTF-8, e.g. in a command-line argument)") from None


def _check_room_for_special_tokens(backend, max_length: int, name: str = "max_length") -> None:
    """ValueError naming ``name`` (the caller's name of ``max_length``) when it is below the number
    of special tokens ``backend`` adds to every text: the post-processor's tokens are never
    truncated away, so a shorter ``max_length`` would not truncate at all."""
    special = backend.num_special_tokens_to_add(False)
    if max_length < special:
        raise ValueError(f"{name}: expected at least {special} (the special tokens the tokenizer adds "
                         f"to every text), got {max_length}")


def _check_special_token(backend, token, name: str) -> None:
    """TypeError naming ``name`` when ``token`` is not a str or None; ValueError when ``backend``'s
    vocabulary lacks it."""
    if token is not None and not isinstance(token, str):
        raise TypeError(f"{name}: expected a str or None, got {type(token).__name__}")
    if token is not None and backend.token_to_id(token) is None:
        raise ValueError(f"{name}: {token!r} is not in the vocabulary")


def _checked_extra_special_tokens(backend, tokens) -> list[str]:
    """``tokens`` (the ``extra_special_tokens``) as a new list, checked: a list or tuple of str in
    ``backend``'s vocabulary, or None (no tokens). A str alone is refused (its characters are not
    tokens)."""
    if tokens is None:
        return []
    if not isinstance(tokens, (list, tuple)):
        raise TypeError(f"extra_special_tokens: expected a list of str or None, got {type(tokens).__name__}")
    for i, token in enumerate(tokens):
        if not isinstance(token, str):
            raise TypeError(f"extra_special_tokens[{i}]: expected a str, got {type(token).__name__}")
    for i, token in enumerate(tokens):
        _check_special_token(backend, token, f"extra_special_tokens[{i}]")
    return list(tokens)


def _special_token_property(name: str, what: str) -> property:
    """The :class:`Tokenizer` property ``name`` (a named special token but ``pad_token``): read from
    its ``_special`` dict, assigned through ``_set_special_token``."""

    def get(self) -> str | None:
        """The token named ``name`` (a str), or None when the tokenizer has none."""
        return self._special[name]

    def set_(self, value: str | None) -> None:
        """Names ``value`` (a token of the vocabulary, or None) as ``name``, checked by
        ``_set_special_token``: TypeError for a non-str, ValueError for a token not in the vocabulary."""
        self._set_special_token(name, value)

    doc = f"""{what}, or None.

    Assignable, checked as the constructor checks it: a token of the vocabulary, or None. As
    transformers' assignment, it only names the token (listed in :attr:`all_special_tokens`): the
    backend is not changed, so a token that was not special stays an ordinary one (split as any
    text, kept by ``decode(skip_special_tokens=True)``). The constructor, as transformers', also
    registers the tokens it names (see the class docstring).

    Raises:
        TypeError: not a str or None. ValueError: not in the vocabulary.
    """
    return property(get, set_, doc=doc)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies (Radford et al.
    2019, ``encoder.py``): printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100..."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


#: The backend a constructor of this module hands to Tokenizer(...) (one it just built, which nothing
#: else holds): used as is, not copied (a copy of SmolLM2's costs 0.1 s), its special tokens
#: registered as its loader decided (from_pretrained's fallback pad token, id 0's, is not made special).
_HANDED_OVER = threading.local()


class _BackendWatch:
    """What may have changed a Tokenizer's backend, for the copies of it without padding or
    truncation (see ``Tokenizer._derived_backend``): ``handed_out`` once the backend has been given
    to anyone (the ``backend`` property; from then on it may change at any time). This module
    changes no backend in place: each setter swaps in a new backend with a new watch
    (``Tokenizer._swap_backend``), so a copy kept with this watch object is current while the
    backend was not handed out. Shared by shallow copies of the Tokenizer while they share the
    backend."""

    def __init__(self):
        self.handed_out = False


def _copy_backend(backend):
    """A copy of a ``tokenizers.Tokenizer``; the backend itself when it cannot be serialized (a
    pre-tokenizer or decoder written in Python): then its truncation and padding are shared."""
    try:
        copy = type(backend).from_str(backend.to_str())
    except Exception:  # noqa: BLE001 - the Rust library's "cannot be serialized"
        return backend
    # a runtime setting that the JSON does not hold (transformers' split_special_tokens=True sets it)
    copy.encode_special_tokens = backend.encode_special_tokens
    return copy


def _backend_from_parts(backend):
    """A ``tokenizers.Tokenizer`` made of ``backend``'s own model, normalizer, pre-tokenizer,
    post-processor and decoder objects (shared, not copied: 0.1 ms for SmolLM2's against 100 ms for
    a copy of its JSON, and it works for parts written in Python, which cannot be serialized), its
    added tokens with their ids and its ``encode_special_tokens``; without truncation or padding.
    Where the added tokens do not get their ids back (not seen: ``backend``'s own were given in the
    same order), a copy of the JSON (:func:`_copy_backend`).

    Raises:
        ValueError: neither can be made (added tokens whose ids cannot be given back, in a backend
            with parts written in Python).
    """
    from tokenizers import Tokenizer as HFTokenizer

    added = backend.get_added_tokens_decoder()
    copy = HFTokenizer(backend.model)
    copy.normalizer, copy.pre_tokenizer = backend.normalizer, backend.pre_tokenizer
    copy.post_processor, copy.decoder = backend.post_processor, backend.decoder
    copy.add_tokens([added[i] for i in sorted(added)])  # in id order: each gets its id back
    if copy.get_added_tokens_decoder() != added:
        copy = _copy_backend(backend)
        if copy is backend:
            raise ValueError("backend: its added tokens cannot be given their ids in a copy, and it cannot be "
                             "serialized (a part written in Python); expected one of the two")
        copy.no_truncation()
        copy.no_padding()
    copy.encode_special_tokens = backend.encode_special_tokens
    return copy


def _has_lowercase(normalizer) -> bool:
    """Whether ``normalizer`` is a ``Lowercase`` or a ``Sequence`` holding one: sentence-transformers
    6's test (``_has_lowercase``) of whether ``do_lower_case`` needs one prepended (a
    ``BertNormalizer`` that lowercases does not count)."""
    from tokenizers import normalizers

    if isinstance(normalizer, normalizers.Lowercase):
        return True
    return isinstance(normalizer, normalizers.Sequence) and any(isinstance(n, normalizers.Lowercase)
                                                                for n in normalizer)


class _LowercaseMark:
    """``Lowercase()`` written in Python (``NormalizedString.lowercase()``, what ``Lowercase()``
    runs), which :attr:`Tokenizer.do_lower_case` prepends to a normalizer with a part written in
    Python: such a normalizer has no JSON to compare, and this object tells whether a normalizer
    holds it (:meth:`is_in`)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._asking = None  # the thread that is asking is_in, or None
        self._seen = False

    def normalize(self, normalized) -> None:
        """The tokenizers package's hook for a custom normalizer: lowercases ``normalized`` (a
        ``NormalizedString``, in place, as ``Lowercase()``), noting the call when :meth:`is_in` asks."""
        if self._asking == threading.get_ident():
            self._seen = True
        normalized.lowercase()

    def is_in(self, normalizer) -> bool:
        """Whether ``normalizer`` runs this object (it normalizes ``"A"`` once to tell)."""
        with self._lock:
            self._asking, self._seen = threading.get_ident(), False
            try:
                normalizer.normalize_str("A")
            except Exception:  # noqa: BLE001 - a part written in Python that fails: not the one set
                return False
            finally:
                self._asking = None
            return self._seen


def _is_normalizer(current, installed) -> bool:
    """Whether ``current`` (a backend's normalizer now) is the one that ``do_lower_case`` set:
    ``installed``, a normalizer with the same settings (their JSON), or, for a normalizer with a
    part written in Python (it has no JSON), the :class:`_LowercaseMark` that it must run. False
    when either is None."""
    if current is None or installed is None:
        return False
    if isinstance(installed, _LowercaseMark):
        return installed.is_in(current)
    try:
        return current.__getstate__() == installed.__getstate__()
    except Exception:  # noqa: BLE001 - "cannot be serialized": a part written in Python, which installed has not
        return False


def _lowercasing(normalizer, lowercase=None):
    """``normalizer`` with ``Lowercase()`` (or ``lowercase``) prepended, as sentence-transformers 6
    builds it for ``do_lower_case``: ``Sequence([Lowercase(), *normalizer])`` (the parts of a
    ``Sequence``, or the normalizer itself, or nothing for None)."""
    from tokenizers import normalizers

    parts = [lowercase or normalizers.Lowercase()]
    if isinstance(normalizer, normalizers.Sequence):
        parts += list(normalizer)
    elif normalizer is not None:
        parts.append(normalizer)
    return normalizers.Sequence(parts)


def _normalizer_copy(normalizer):
    """A copy of a ``tokenizers`` normalizer made from its JSON (None for None); the normalizer itself
    when it has a part written in Python, which cannot be serialized (such parts are shared, see
    :func:`_backend_from_parts`)."""
    import pickle

    if not _serializable(normalizer) or normalizer is None:
        return normalizer
    return pickle.loads(pickle.dumps(normalizer))


def _serializable(normalizer) -> bool:
    """Whether a ``tokenizers`` normalizer (or None) has a JSON: none with a part written in Python."""
    try:
        return normalizer is None or bool(normalizer.__getstate__())
    except Exception:  # noqa: BLE001 - the Rust library's "cannot be serialized"
        return False


class Tokenizer:
    """A ``tokenizers.Tokenizer`` set up for a model.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        max_length: an encoder tokenizer truncates to this many tokens (special tokens included)
            and pads batches to their longest member; ``None`` makes a causal-LM tokenizer: no
            truncation, and padding only in :meth:`encode_batch`. An encoder tokenizer's length
            can be assigned later (the :attr:`max_length` property, checked the same way).
        pad_token: the padding token (its id pads ``input_ids``), or ``None``. Without one in the
            vocabulary (``None`` included), an encoder tokenizer pads with id 0 (a ``pad_token``
            not in the vocabulary is then replaced by id 0's token), a causal one with the EOS id,
            then 0.
        bos_token, eos_token, unk_token, sep_token, cls_token, mask_token: the special tokens'
            strings, or ``None``.
        extra_special_tokens: more special tokens (transformers' ``extra_special_tokens``, formerly
            ``additional_special_tokens``: a list of strings), or ``None``. With the named ones they
            make :attr:`all_special_tokens` / :attr:`all_special_ids`.
        chat_template: a Jinja2 chat template (see :meth:`apply_chat_template`), named templates
            (a dict ``{name: template}``, or ``tokenizer_config.json``'s list
            ``[{"name": ..., "template": ...}]``, kept as a dict, as transformers keeps them:
            ``"default"`` is used unless another is chosen, see :meth:`get_chat_template`), or ``None``.
        do_lower_case: lowercase every text as sentence-transformers 6 does for a model whose
            ``sentence_bert_config.json`` sets ``"do_lower_case": true`` (:meth:`from_pretrained`
            reads it): ``tokenizers.normalizers.Lowercase()`` is prepended to the backend's
            normalizer (``Sequence([Lowercase(), ...])``; over a normalizer with a part written in
            Python, a ``Lowercase`` written in Python, which lowercases the same), unless that
            normalizer is a ``Lowercase`` or a ``Sequence`` holding one. This is not ``str.lower()``: every ``Σ`` becomes ``σ``
            (Python gives a word-final ``ς``), and special tokens typed in a text (``"[MASK]"``) are
            matched before the normalizer runs, so they stay special. Default False.
        truncation_side: where an encoder tokenizer cuts a text too long for ``max_length``:
            ``"right"`` keeps its first tokens, ``"left"`` its last ones (transformers'
            ``truncation_side``). None (the default): the backend's own truncation direction when
            it truncates, else ``"right"``. Also the :attr:`truncation_side` property.
        padding_side: the side :meth:`encode_batch` pads on unless told otherwise: ``"right"``,
            or ``"left"`` for a causal-LM tokenizer only (an encoder tokenizer pads on the right).
            None (the default): ``"right"``, or for a causal-LM tokenizer the backend's own
            padding direction if it pads. Also the :attr:`padding_side` property.
        clean_up_tokenization_spaces: :meth:`decode` removes the spaces that WordPiece decoding
            leaves before punctuation and contractions (``"it ' s fine !"`` -> ``"it's fine!"``),
            as transformers' setting of that name does. Default False.

    Each special token given (``pad_token`` when it is in the vocabulary, the named ones,
    ``extra_special_tokens``) is registered as a special added token of the backend, as
    transformers' ``PreTrainedTokenizerFast(tokenizer_object=..., cls_token=...)`` registers it:
    a text holding it is matched whole (``"[CLS]hello"`` gives the ``[CLS]`` id, not three
    ``[UNK]``), and ``decode(skip_special_tokens=True)`` leaves it out. Its id stays the
    vocabulary's. The special tokens, ``pad_token`` / ``pad_token_id`` and ``do_lower_case`` are
    also properties, checked on assignment as here (see :attr:`pad_token`, :attr:`cls_token`);
    as transformers', an assignment only names a token, it does not register it.

    The ``tokenizers.Tokenizer`` (or the one a ``tokenizers.implementations`` wrapper holds) is
    copied, its ``encode_special_tokens`` setting with it (transformers' ``split_special_tokens``):
    the truncation, padding and special tokens set here never reach the caller's object, nor
    another :class:`Tokenizer` built on it (a backend with parts written in Python cannot be
    copied: it is used as is, and they are set on it; ``do_lower_case=True`` gives such a
    Tokenizer a backend of its own, as the setters below).

    A setter that changes the backend (:attr:`do_lower_case`, :attr:`max_length`,
    :attr:`truncation_side`, :attr:`pad_token`, :attr:`pad_token_id`) never changes the one in use:
    it builds a new backend made of the same model, normalizer, pre-tokenizer, post-processor and
    decoder objects, the added tokens, truncation and padding (a ``tokenizers.Tokenizer`` of its
    own that shares those parts), changes that one and swaps it in. A call running in another
    thread finishes on the old backend, and a setter never waits for it: changing a backend with
    a part written in Python while another thread encodes with it deadlocks (the setter holds the
    GIL and waits for the backend, which waits for the GIL to run that part). The caller's backend
    and the one another Tokenizer shares are left as they were.

    Every argument is checked before the backend is copied or changed: a refused call leaves a
    backend that cannot be copied as it was.

    Raises:
        TypeError: ``tokenizer`` not a ``tokenizers.Tokenizer``; a token not a str or None;
            ``extra_special_tokens`` not a list or tuple of str, or None; a
            ``chat_template`` not a str, None, a dict of str to str or a list of ``{"name": str,
            "template": str}``; ``do_lower_case`` or ``clean_up_tokenization_spaces`` not a bool;
            ``truncation_side`` or ``padding_side`` not a str or None.
        ValueError: ``max_length`` below 1 or below the number of special tokens the backend adds
            to a text (2 for BERT's ``[CLS] ... [SEP]``: it could not truncate to fewer), or a
            special token (``pad_token`` aside) not in the vocabulary; ``truncation_side`` or
            ``padding_side`` not ``"right"`` or ``"left"``; ``padding_side="left"`` for an
            encoder tokenizer; ``do_lower_case`` on a backend that cannot be copied whose added
            tokens cannot be given their ids in a backend of its own (not seen; the setters raise
            the same, changing nothing).
    """

    def __copy__(self) -> "Tokenizer":
        """``copy.copy``: a Tokenizer whose setters (:attr:`max_length`, :attr:`truncation_side`,
        :attr:`pad_token`, :attr:`do_lower_case`, ...) never change the original's encodings, nor
        the original's the copy's. The two share the backend until either changes it: a setter
        above gives that one a new backend made of the same parts (see the constructor), and
        :attr:`backend` handed out first gives it its own copy (its truncation, padding and
        ``encode_special_tokens`` with it; 0.1 s for SmolLM2's, so not made when nothing changes).
        A backend already handed out through :attr:`backend` (its holder may change it at any
        time) is copied at once. A backend with parts written in Python cannot be copied: it stays
        shared, as the constructor shares it, until a setter gives either one a new backend."""
        new = object.__new__(type(self))
        state = self.__getstate__()
        del state["_encode_special_tokens"]  # the shared backend's own
        new.__setstate__(state)
        watch = getattr(self, "_backend_watch", None)
        if watch is not None and not watch.handed_out:
            self._tok_shared = new._tok_shared = True  # copied by whichever changes it first: _own_backend
            return new
        backend = _copy_backend(self._tok)
        if backend is not self._tok:
            new._tok = backend
            new._backend_watch = _BackendWatch()
        return new  # else shared for good: a setter first gives either one its own (_swap_backend)

    def _own_backend(self) -> None:
        """Before the backend is changed or handed out: gives this Tokenizer its own copy of a
        backend that :meth:`__copy__` left shared (a backend that cannot be copied stays shared)."""
        if not getattr(self, "_tok_shared", False):
            return
        backend = _copy_backend(self._tok)
        if backend is not self._tok:
            self._tok = backend
            self._backend_watch = _BackendWatch()
            self._unpadded = self._plain = None
        # else shared for good: a setter first gives it its own (_swap_backend)
        self._tok_shared = False

    def __getstate__(self) -> dict:
        """The pickled state (also of copy.deepcopy; :meth:`__copy__` starts from it): the attributes without
        encode_batches' unpadded copy of the backend (made again on first use), plus the backend's
        ``encode_special_tokens``, which the tokenizers package's own pickle (the backend's JSON)
        leaves out."""
        state = self.__dict__.copy()
        state["_special"] = dict(state["_special"])  # a shallow copy names its own tokens
        state["_unpadded"] = state["_plain"] = None
        state.pop("_unpadded_version", None)  # (a state of an older version)
        state["_tok_shared"] = False  # pickled: its own backend; copy.copy: see __copy__
        state.pop("_tok_foreign", None)  # (a state of an earlier version)
        state["_encode_special_tokens"] = self._tok.encode_special_tokens
        return state

    def __setstate__(self, state: dict) -> None:
        """Restores :meth:`__getstate__`'s state (a state pickled without the flag is taken as it is;
        one pickled when the special tokens, ``pad_token_id``, ``extra_special_tokens`` and
        ``do_lower_case`` were plain attributes is read into the properties' fields; one pickled when
        ``do_lower_case`` lowercased with ``str.lower()`` gets the ``Lowercase`` normalizer)."""
        flag = state.pop("_encode_special_tokens", None)
        if "_special" not in state and "bos_token" in state:
            state["_special"] = {name: state.pop(name) for name in _NAMED_SPECIAL_TOKENS if name != "pad_token"}
            for name in ("pad_token", "pad_token_id", "extra_special_tokens", "do_lower_case"):
                state[f"_{name}"] = state.pop(name)
        lower = None
        if "_unlowered" not in state:  # pickled when do_lower_case called str.lower(): now the normalizer's
            lower, state["_do_lower_case"], state["_unlowered"] = state.get("_do_lower_case", False), False, None
        self.__dict__.update(state)
        if flag is not None:
            self._tok.encode_special_tokens = flag
        if lower:
            self._set_lower_case(True)

    @classmethod
    def _owning(cls, tokenizer, *args, **kwargs) -> "Tokenizer":
        """``cls(tokenizer, ...)`` on ``tokenizer`` itself, not a copy: for a backend this module
        just built from a file, which nothing else holds."""
        _HANDED_OVER.backend = tokenizer
        try:
            return cls(tokenizer, *args, **kwargs)
        finally:
            _HANDED_OVER.backend = None

    def __init__(self, tokenizer, max_length: int | None = 512, pad_token: str | None = "[PAD]", *,
                 bos_token: str | None = None, eos_token: str | None = None, unk_token: str | None = None,
                 sep_token: str | None = None, cls_token: str | None = None, mask_token: str | None = None,
                 extra_special_tokens: list[str] | tuple[str, ...] | None = None,
                 chat_template: str | dict | list | None = None, do_lower_case: bool = False,
                 truncation_side: str | None = None, padding_side: str | None = None,
                 clean_up_tokenization_spaces: bool = False):
        from tokenizers import Tokenizer as HFTokenizer

        if not isinstance(tokenizer, HFTokenizer):  # tokenizers.implementations' wrappers hold one
            tokenizer = getattr(tokenizer, "_tokenizer", tokenizer)
        if not isinstance(tokenizer, HFTokenizer):
            raise TypeError(f"tokenizer: expected a tokenizers.Tokenizer, got {type(tokenizer).__name__}")
        max_length = check_optional_int(max_length, "max_length", 1)
        special = {"bos_token": bos_token, "eos_token": eos_token, "unk_token": unk_token, "sep_token": sep_token,
                   "cls_token": cls_token, "mask_token": mask_token}  # each must be in the vocabulary
        if pad_token is not None and not isinstance(pad_token, str):
            raise TypeError(f"pad_token: expected a str or None, got {type(pad_token).__name__}")
        for name, token in special.items():
            _check_special_token(tokenizer, token, name)
        extra_special_tokens = _checked_extra_special_tokens(tokenizer, extra_special_tokens)
        chat_template = _check_chat_templates(chat_template, "chat_template")
        do_lower_case = check_bool(do_lower_case, "do_lower_case")
        clean_up_tokenization_spaces = check_bool(clean_up_tokenization_spaces, "clean_up_tokenization_spaces")
        if truncation_side is None:  # the backend's own (a tokenizer.json's "truncation"), as transformers reads it
            truncation_side = (tokenizer.truncation or {}).get("direction", "right")
        truncation_side = check_choice(truncation_side, "truncation_side", ("right", "left"))
        if padding_side is None:
            padding_side = (tokenizer.padding or {}).get("direction", "right") if max_length is None else "right"
        padding_side = self._checked_padding_side(padding_side, max_length)
        if max_length is not None:
            _check_room_for_special_tokens(tokenizer, max_length)
        handed_over = getattr(_HANDED_OVER, "backend", None) is tokenizer
        if not handed_over:  # checked: now the copy (the caller's own when it cannot be copied: see _swap_backend)
            copied = _copy_backend(tokenizer)
            if copied is tokenizer and do_lower_case and not _has_lowercase(tokenizer.normalizer):
                copied = _backend_from_parts(tokenizer)  # its own, made of the same parts: Lowercase() is its alone
            tokenizer = copied
        self._tok = tokenizer
        self._unpadded = None  # (watch, encode_batches' copy of it without padding): see _derived_backend
        self._plain = None  # (watch, apply_chat_template's copy without truncation or padding): the same
        self._backend_watch = _BackendWatch()  # whether those copies may be out of date
        self._tok_shared = False  # a backend that copy.copy shares until either side changes it: _own_backend
        self._id_limit_cache = None  # (vocabulary size, one past the highest id, gaps?): see _id_limit
        self._max_length = max_length
        self._special = special  # the named special tokens but pad_token: see the properties
        self._extra_special_tokens = extra_special_tokens
        self.chat_template = chat_template
        self._do_lower_case = False
        self._unlowered = None  # (the normalizer before do_lower_case prepended Lowercase,), or None
        self._lowered = None  # the Sequence that do_lower_case set (or its _LowercaseMark), or None
        self._truncation_side, self._padding_side = truncation_side, padding_side
        self._clean_up = clean_up_tokenization_spaces
        # transformers' clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output: a BPE
        # model's text is cleaned up only with it (from_pretrained reads it; decode tests it)
        self._clean_up_bpe = False
        named_pad = pad_token if pad_token is not None and tokenizer.token_to_id(pad_token) is not None else None
        if not handed_over:  # as transformers' constructor: each named token matched whole, skipped by decode
            _register_special_tokens(tokenizer, {**special, "pad_token": named_pad,
                                                 "extra_special_tokens": extra_special_tokens}, {})
        self._pad_token, self._pad_token_id = self._pad_of(pad_token, fallback=True)
        # a pad token of its own (given, in the vocabulary), not a fallback: apply_chat_template's variable
        self._pad_named = named_pad is not None
        if self.max_length is not None:  # an encoder tokenizer: as it always was
            self._tok.enable_truncation(max_length=self.max_length, direction=truncation_side)
            self._tok.enable_padding(pad_id=self._pad_token_id, pad_token=self._pad_text())
        else:
            self._tok.no_truncation()
            self._tok.no_padding()
        self._set_lower_case(do_lower_case)

    def _set_lower_case(self, value: bool) -> None:
        """Sets :attr:`do_lower_case`: True prepends ``Lowercase()`` to the backend's normalizer
        (:func:`_lowercasing`) unless it has one (:func:`_has_lowercase`); False puts back the
        normalizer that True replaced, when the backend still has the one True set
        (:func:`_is_normalizer`), as a copy of its own (:func:`_normalizer_copy`): the saved object
        is also held by copies of this Tokenizer and by the ``Sequence`` True set, and a change made
        in place through one Tokenizer's :attr:`backend` must reach no other. The new normalizer is
        set on a new backend (:meth:`_swap_backend`), never on the one in use.

        Raises:
            ValueError: as :func:`_backend_from_parts` (nothing is changed).
        """
        if value == self._do_lower_case:
            return
        if value:
            normalizer = self._tok.normalizer
            if not _has_lowercase(normalizer):
                if _serializable(normalizer):  # told apart by its JSON
                    installed = lowered = _lowercasing(normalizer)
                else:  # no JSON: told apart by a Lowercase() written in Python
                    from tokenizers import normalizers

                    lowered = _LowercaseMark()
                    installed = _lowercasing(normalizer, normalizers.Normalizer.custom(lowered))
                self._swap_backend(lambda backend: setattr(backend, "normalizer", installed))
                self._unlowered, self._lowered = (normalizer,), lowered
        elif self._unlowered is not None:
            installed = getattr(self, "_lowered", None)  # None: pickled before it was kept
            if installed is None:
                installed = _lowercasing(self._unlowered[0])
            if _is_normalizer(self._tok.normalizer, installed):
                unlowered = _normalizer_copy(self._unlowered[0])
                self._swap_backend(lambda backend: setattr(backend, "normalizer", unlowered))
            self._unlowered = self._lowered = None
        self._do_lower_case = value

    def _swap_backend(self, change) -> None:
        """Every setter's change of the backend: ``change(backend)`` is applied to a new backend of
        this Tokenizer's own, made of the same parts (:func:`_backend_from_parts`) with the same
        truncation and padding, which then replaces the old one in one assignment. The backend in
        use is never changed: another thread may be encoding with it, and with a part written in
        Python, changing it in place waits for that call while holding the GIL that the call
        waits for (a deadlock). A backend shared with the caller or another Tokenizer (one that
        cannot be copied, see the constructor and :meth:`__copy__`) is thereby left as it was. The
        new backend shares its parts with the old one: after ``copy.copy`` (``_tok_shared``),
        :attr:`backend` still hands out a copy of its own (:meth:`_own_backend`), so that a part
        changed in place through it reaches no other Tokenizer.

        Raises:
            ValueError: as :func:`_backend_from_parts` (nothing is changed).
        """
        live = self._tok
        own = _backend_from_parts(live)
        if live.truncation is not None:
            own.enable_truncation(**live.truncation)
        if live.padding is not None:
            own.enable_padding(**live.padding)
        change(own)
        self._tok = own  # another thread's call uses the old backend or this one, whole
        watch = _BackendWatch()  # after the backend: see _derived_backend
        # the old backend handed out: its holder may still change the parts the new one shares,
        # so copy.copy copies this one at once too (see __copy__)
        watch.handed_out = getattr(getattr(self, "_backend_watch", None), "handed_out", False)
        self._backend_watch = watch
        self._unpadded = self._plain = None

    def _pad_of(self, token: str | None, fallback: bool) -> tuple[str | None, int]:
        """``(pad_token, pad_token_id)`` for a ``pad_token`` of the constructor (``fallback``: one
        not in the vocabulary is replaced, see the class docstring) or of the :attr:`pad_token`
        setter (refused). None: an encoder pads with id 0 and names no token, a causal-LM tokenizer
        with its EOS token, else id 0.

        Raises:
            ValueError: (not ``fallback``) ``token`` not in the vocabulary.
        """
        token_id = None if token is None else self._tok.token_to_id(token)
        if token is not None and token_id is None:
            if not fallback:
                raise ValueError(f"pad_token: {token!r} is not in the vocabulary")
            if self._max_length is not None:  # the token that pads: id 0's
                return self._tok.id_to_token(0), 0
            token = None
        if token is None and self._max_length is None and self.eos_token is not None:
            return self.eos_token, self.eos_token_id
        return token, 0 if token_id is None else token_id

    def _pad_text(self) -> str:
        """The padding token's text for the backend's padding (the package wants a str; only
        ``Encoding.tokens`` shows it): :attr:`pad_token`, else the pad id's token."""
        if self._pad_token is not None:
            return self._pad_token
        return self._tok.id_to_token(self._pad_token_id) or "[PAD]"

    def _set_pad(self, token: str | None, token_id: int) -> None:
        """Pads with ``token_id`` (named ``token``) from now on, in every padding path: an
        encoder's backend pads with it too, its other padding settings kept (a backend whose
        padding was switched off through :attr:`backend` stays so: :meth:`encode_batch` then pads
        with :attr:`pad_token_id` itself). The backend is swapped first (:meth:`_swap_backend`): if
        that raises, nothing is changed."""
        padding = self._tok.padding if self._max_length is not None else None
        if padding is not None:
            text = token if token is not None else self._tok.id_to_token(token_id) or "[PAD]"  # as _pad_text
            padding = {**padding, "pad_id": token_id, "pad_token": text}
            self._swap_backend(lambda backend: backend.enable_padding(**padding))
        self._pad_token, self._pad_token_id = token, token_id

    # ---------------------------------------------------------------------------- special tokens
    @property
    def pad_token(self) -> str | None:
        """The padding token (its id :attr:`pad_token_id` pads every batch), or None.

        Assignable, as transformers' ``tokenizer.pad_token = ...``: a token of the vocabulary, which
        sets :attr:`pad_token_id` to its id and pads every later batch of :meth:`encode_batch`
        (``__call__``) and :meth:`encode_batches`, an encoder's backend padding included. As
        transformers' assignment, it only names the token: it is not registered as a special token
        of the backend (an ordinary token stays one: split as any text, kept by
        ``decode(skip_special_tokens=True)``). None: as the constructor's None (an encoder pads with
        id 0, a causal-LM tokenizer with its EOS token, else id 0). Unlike the constructor's
        argument, a token not in the vocabulary is refused, not replaced.

        Padding set on the backend itself (``backend.enable_padding(pad_id=...)``) is followed:
        this is then the token of the backend's pad id.

        Raises:
            TypeError: not a str or None. ValueError: not in the vocabulary; no new backend can be made (see the constructor; not seen).
        """
        return self._pad_state()[0]

    @pad_token.setter
    def pad_token(self, value: str | None) -> None:
        """Pads with ``value`` from now on (see the getter for the errors)."""
        if value is not None and not isinstance(value, str):
            raise TypeError(f"pad_token: expected a str or None, got {type(value).__name__}")
        token, token_id = self._pad_of(value, fallback=False)
        self._set_pad(token, token_id)
        self._pad_named = value is not None

    @property
    def pad_token_id(self) -> int:
        """The id that pads every batch (:meth:`encode_batch`, ``__call__``, :meth:`encode_batches`):
        :attr:`pad_token`'s id, else 0 (see the class docstring).

        Assignable, as transformers' ``tokenizer.pad_token_id = ...``: an id of the vocabulary, whose
        token becomes :attr:`pad_token` (as assigning that token: named, not registered).

        Raises:
            TypeError: not an int (a bool included). ValueError: an id outside the vocabulary or
                one that its ids skip; no new backend can be made (see the constructor; not seen).
        """
        return self._pad_state()[1]

    @pad_token_id.setter
    def pad_token_id(self, value: int) -> None:
        """Pads with the id ``value`` from now on (see the getter for the errors)."""
        value = check_int(value, "pad_token_id", 0, None)
        limit, _ = self._id_limit()
        token = self._tok.id_to_token(value) if value < limit else None
        if token is None:
            where = f"is outside the vocabulary [0, {limit})" if value >= limit else \
                f"has no token (the vocabulary's ids [0, {limit}) skip it)"
            raise ValueError(f"pad_token_id: token id {value} {where}")
        self._set_pad(token, value)
        self._pad_named = True

    def _pad_state(self) -> tuple[str | None, int]:
        """``(pad_token, pad_token_id)``: as set here, or, for an encoder whose backend was given
        another pad id through :attr:`backend`, that id and its token (every padding path pads
        with it)."""
        padding = self._tok.padding if self._max_length is not None else None
        if padding is not None and padding["pad_id"] != self._pad_token_id:
            return self._tok.id_to_token(padding["pad_id"]), padding["pad_id"]
        return self._pad_token, self._pad_token_id

    def _set_special_token(self, name: str, value: str | None) -> None:
        """Names ``value`` the ``name`` token (checked as the constructor checks it; not registered,
        as transformers' assignment)."""
        _check_special_token(self._tok, value, name)
        self._special[name] = value

    bos_token = _special_token_property("bos_token", "The beginning-of-sequence token")
    eos_token = _special_token_property("eos_token", "The end-of-sequence token (generation stops at its id)")
    unk_token = _special_token_property("unk_token", "The unknown token")
    sep_token = _special_token_property("sep_token", "The separator token")
    cls_token = _special_token_property("cls_token", "The classifier token")
    mask_token = _special_token_property("mask_token", "The mask token")

    @property
    def extra_special_tokens(self) -> list[str]:
        """More special tokens (transformers' ``extra_special_tokens``): a new list each time (as
        transformers'; assign a list to change them).

        Assignable: a list or tuple of tokens of the vocabulary (a str alone is refused, not read
        as its characters), or None (none). As :attr:`cls_token`'s, the assignment only names them
        (listed in :attr:`all_special_tokens`), as transformers' does: the backend is not changed.

        Raises:
            TypeError: not a list or tuple of str, or None. ValueError: a token not in the
                vocabulary (named by index).
        """
        return list(self._extra_special_tokens)

    @extra_special_tokens.setter
    def extra_special_tokens(self, value) -> None:
        """Names ``value`` the extra special tokens (see the getter for the errors)."""
        self._extra_special_tokens = _checked_extra_special_tokens(self._tok, value)

    @property
    def do_lower_case(self) -> bool:
        """Whether every text is lowercased as sentence-transformers 6 does with
        ``sentence_bert_config.json``'s ``do_lower_case``: by ``tokenizers.normalizers.Lowercase()``
        prepended to the backend's normalizer (see the constructor's argument; not
        ``str.lower()``). Assignable: True prepends it (unless the normalizer is a ``Lowercase``
        or a ``Sequence`` holding one), False puts back the normalizer it was prepended to (unless
        the normalizer was replaced since, through :attr:`backend`: that one is kept, a
        normalizer written in Python included). The new normalizer is set on a new backend that
        replaces the one in use (see the constructor), so the setting is this Tokenizer's alone,
        and a call running in another thread is not waited for.

        Raises:
            TypeError: not a bool (the str ``"False"`` included).
            ValueError: on a backend with a part written in Python, added tokens that cannot be
                given their ids in a new backend (not seen; nothing is changed).
        """
        return self._do_lower_case

    @do_lower_case.setter
    def do_lower_case(self, value: bool) -> None:
        """Lowercases later texts, or not (see the getter for the errors)."""
        self._set_lower_case(check_bool(value, "do_lower_case"))

    @property
    def max_length(self) -> int | None:
        """The length an encoder tokenizer truncates every text to (special tokens included); None
        for a causal-LM tokenizer, which never truncates.

        Assignable on an encoder tokenizer (sentence-transformers' ``model.max_seq_length = 512``):
        every later :meth:`encode`, :meth:`tokenize`, :meth:`encode_batch` and
        :meth:`encode_batches` call truncates to the new length (the batches of an
        :meth:`encode_batches` call made before keep the length it started with). Whether the
        tokenizer truncates at all is fixed when it is built: None cannot be assigned to an
        encoder tokenizer, nor an int to a causal-LM one.

        Raises:
            TypeError: not an int (a bool or float included) or None.
            ValueError: below 1 or below the number of special tokens the backend adds to a text
                (2 for BERT's ``[CLS] ... [SEP]``); None for an encoder tokenizer, or an int for
                a causal-LM tokenizer; no new backend can be made (see the constructor; not seen).
        """
        return self._max_length

    @max_length.setter
    def max_length(self, value: int | None) -> None:
        """Truncates every later encode to ``value`` tokens (see the getter for the errors)."""
        value = check_optional_int(value, "max_length", 1)
        if value is None and self._max_length is not None:
            raise ValueError("max_length: this is an encoder tokenizer, which truncates (fixed when it was built); "
                             "expected an int, got None")
        if value is not None and self._max_length is None:
            raise ValueError(f"max_length: this is a causal-LM tokenizer, which does not truncate (fixed when it was "
                             f"built); expected None, got {value}")
        if value is not None:
            _check_room_for_special_tokens(self._tok, value)
            side = self._truncation_side
            self._swap_backend(lambda backend: backend.enable_truncation(max_length=value, direction=side))
        self._max_length = value

    @property
    def truncation_side(self) -> str:
        """Where an encoder tokenizer cuts a text longer than :attr:`max_length`: ``"right"`` keeps
        its first tokens, ``"left"`` its last ones (transformers' ``truncation_side``; read from
        ``tokenizer_config.json`` or ``tokenizer.json`` by :meth:`from_pretrained`). Assignable;
        a causal-LM tokenizer keeps it but never truncates.

        Raises:
            TypeError: not a str. ValueError: not ``"right"`` or ``"left"``; no new backend can be made (see the constructor; not seen).
        """
        return self._truncation_side

    @truncation_side.setter
    def truncation_side(self, value: str) -> None:
        """Cuts every later encode on the ``value`` side (see the getter for the errors)."""
        value = check_choice(value, "truncation_side", ("right", "left"))
        if self._max_length is not None:
            length = self._max_length
            self._swap_backend(lambda backend: backend.enable_truncation(max_length=length, direction=value))
        self._truncation_side = value

    @property
    def padding_side(self) -> str:
        """The side :meth:`encode_batch` pads on when its ``padding_side`` is not given:
        ``"right"``, or ``"left"`` for a causal-LM tokenizer (transformers' ``padding_side``, read
        from a causal LM's ``tokenizer_config.json`` by :meth:`from_pretrained`). Assignable.

        Raises:
            TypeError: not a str. ValueError: not ``"right"`` or ``"left"``; ``"left"`` for an
                encoder tokenizer.
        """
        return self._padding_side

    @padding_side.setter
    def padding_side(self, value: str) -> None:
        """Pads later batches on the ``value`` side (see the getter for the errors)."""
        self._padding_side = self._checked_padding_side(value, self._max_length)

    @staticmethod
    def _checked_padding_side(value, max_length: int | None) -> str:
        """``value`` checked as a padding side of a tokenizer that truncates to ``max_length``
        (None: a causal-LM tokenizer): ``"right"``, or ``"left"`` for a causal-LM tokenizer only."""
        value = check_choice(value, "padding_side", ("right", "left"))
        if value == "left" and max_length is not None:
            raise ValueError("padding_side: expected 'right' for an encoder tokenizer ('left' is for a causal-LM "
                             "tokenizer), got 'left'")
        return value

    @property
    def clean_up_tokenization_spaces(self) -> bool:
        """Whether :meth:`decode` removes the spaces WordPiece decoding leaves before punctuation
        and contractions (transformers' ``clean_up_tokenization_spaces``, read from
        ``tokenizer_config.json`` by :meth:`from_pretrained`). Assignable.

        Raises:
            TypeError: not a bool.
        """
        return self._clean_up

    @clean_up_tokenization_spaces.setter
    def clean_up_tokenization_spaces(self, value: bool) -> None:
        """Sets it for later :meth:`decode` calls (see the getter for the errors)."""
        self._clean_up = check_bool(value, "clean_up_tokenization_spaces")

    def _is_bpe(self) -> bool:
        """Whether the backend's model is a BPE (byte-level or not): transformers cleans up its
        decoded text only when ``clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output``
        is set, since the spaces there are the text's own."""
        from tokenizers import models

        return isinstance(self._tok.model, models.BPE)

    # ---------------------------------------------------------------------------- construction
    @classmethod
    def from_pretrained(cls, name_or_path, max_length: int | None = None) -> "Tokenizer":
        """Reads ``tokenizer.json`` from a model directory, a ``.gguf`` file (see :meth:`from_gguf`),
        or an embedded model name (``"all-MiniLM-L6-v2"``, ``"SmolLM2-135M-Instruct"``).

        A directory gives a causal-LM tokenizer (no truncation; its special tokens and chat template
        from ``tokenizer_config.json`` or ``chat_template.jinja``, named templates from its list or
        ``additional_chat_templates/``, see :meth:`get_chat_template`) or an encoder tokenizer, which
        truncates to ``max_length``. The first of these rules that applies decides:

        1. ``config.json`` names a model: a causal LM when an ``architectures`` entry ends in
           ``ForCausalLM`` / ``LMHeadModel`` or its ``model_type`` is a decoder's (``llama``,
           ``gpt2``, ``qwen2``, ...), else an encoder.
        2. A sentence-transformers folder (``sentence_bert_config.json`` or ``modules.json``): an
           encoder.
        3. A tokenizer folder alone (what transformers' ``tokenizer.save_pretrained`` writes) that
           shows a causal LM's tokenizer: a causal LM. It shows one with a chat template
           (``chat_template.jinja``, ``additional_chat_templates/`` or ``tokenizer_config.json``'s
           ``chat_template``), or a ``tokenizer_config.json`` that says ``"padding_side": "left"``,
           ``"add_bos_token": true`` or ``"add_eos_token": true``, or names a causal LM's
           ``tokenizer_class`` (``GPT2Tokenizer``, ``LlamaTokenizer``, ``Qwen2Tokenizer``,
           ``GemmaTokenizer``, ``GPTNeoXTokenizer``, with or without ``Fast``).
        4. Otherwise an encoder when a length to truncate to is known: ``max_length``, or
           ``tokenizer_config.json``'s ``model_max_length`` (not transformers' 1e30 "no limit"), or
           ``config.json``'s ``max_position_embeddings`` / ``n_positions``; with none known, a
           causal LM: nothing is cut (transformers' tokenizer does not truncate there either).

        An encoder's ``max_length`` defaults to the ``model_max_length`` of
        ``sentence_bert_config.json``'s ``processor_kwargs`` (below), else its ``max_seq_length``
        if present, else ``tokenizer_config.json``'s ``model_max_length`` (a real length, at most
        the positions), else ``config.json``'s ``max_position_embeddings``, else 512 (BERT's). A
        ``sentence_bert_config.json`` with ``"do_lower_case": true`` gives a tokenizer that
        lowercases every text as sentence-transformers 6 does (``do_lower_case=True``: a
        ``Lowercase()`` normalizer prepended, see the constructor).

        ``sentence_bert_config.json``'s ``processor_kwargs`` (or its older name ``tokenizer_args``,
        which replaces it when both are there, as sentence-transformers 6 reads them), the
        arguments sentence-transformers passes to transformers' tokenizer, are applied as
        transformers applies them, over ``tokenizer_config.json``'s keys of the same name:
        ``model_max_length`` (the encoder's ``max_length``: it wins over ``max_seq_length``, and is
        not capped at the positions; one longer than ``config.json``'s ``max_position_embeddings``
        is refused), ``do_lower_case`` (BERT's normalizer flag, see below; not the
        ``Lowercase()`` of ``sentence_bert_config.json``'s own ``do_lower_case``) and
        ``truncation_side``. The keys that sentence-transformers overwrites with its own
        (``cache_dir``, ``revision``, ``token``, ``subfolder``, ``local_files_only``,
        ``trust_remote_code``) change nothing and are ignored; any other key is refused.

        ``sentence_bert_config.json``'s ``processing_kwargs`` (what sentence-transformers 6 passes
        when it calls the tokenizer on texts: ``{"padding": True, "truncation": "longest_first",
        **processing_kwargs["text"], **processing_kwargs["common"]}``) is applied as it applies
        it: a ``max_length`` there (``"common"``'s over ``"text"``'s) is the encoder's
        ``max_length``, over every length above; ``truncation`` (true, ``"longest_first"``,
        ``"only_first"``) and ``padding`` (true, ``"longest"``, ``"max_length"``: padding is masked
        out) change nothing else. Any other key or value is refused, and so is another group that
        is not empty (``"chat_template"``, ``"image"``, ...) and a ``query_length``,
        ``document_length`` or ``query_expansion`` that is not null (sentence-transformers'
        ``encode_query`` / ``encode_document`` apply them).

        Either kind takes its named special tokens (``bos_token``, ``eos_token``, ``unk_token``,
        ``sep_token``, ``pad_token``, ``cls_token``, ``mask_token``) and its extra special tokens
        (other ``*_token`` keys, ``extra_special_tokens``, ``additional_special_tokens``) from
        ``tokenizer_config.json`` as transformers 5 reads them, those in the vocabulary (see
        :attr:`all_special_ids`). An encoder pads with that ``pad_token``, else ``[PAD]``, else id
        0's token, and without an ``unk_token`` in ``tokenizer_config.json`` (or its class) takes
        the WordPiece/BPE model's own; a causal LM pads with its ``pad_token``, else its EOS token.
        Where ``tokenizer_config.json`` has no ``pad_token`` key and transformers loads the folder
        with a generic class (``TokenizersBackend``, ``PreTrainedTokenizerFast``, or none), the
        ``pad_token`` of ``tokenizer.json``'s ``padding`` is the pad token, as there (when in the
        vocabulary; :meth:`apply_chat_template` then passes it to the template). transformers also
        takes it for a class whose constructor names no pad token (``LlamaTokenizer`` over a
        SentencePiece-style ``tokenizer.json``, Whisper's, ...); this does not (a difference).
        A token that ``tokenizer_config.json`` leaves out takes its transformers class's default
        (``tokenizer_config.json``'s ``tokenizer_class``, else ``config.json``'s, else the class
        transformers 5.23's ``TOKENIZER_MAPPING_NAMES`` gives ``config.json``'s ``model_type``: BART's,
        Longformer's, OPT's, Phi's, ..., as transformers 5's ``AutoTokenizer`` picks it: a model type registered to its generic ``TokenizersBackend``,
        Mistral's, Mixtral's, Phi-3's, ..., gets no class, whatever ``tokenizer_class`` says, and
        keeps ``tokenizer.json``'s pipeline): GPT-2's, Qwen2's, Llama's and Gemma's (GPT-2's own
        folder names no token: its bos, eos and unk are ``<|endoftext|>``), BERT's (``[CLS]``,
        ``[SEP]``, ``[MASK]``, ``[PAD]``, ``[UNK]``, also for DistilBERT, ELECTRA, MobileBERT,
        ...), MPNet's, Funnel's, RoBERTa's (``<s>``, ``</s>``, ``<pad>``, ``<mask>``, ``<unk>``),
        GPT-NeoX's (pad ``<|padding|>``), CodeGen's, DeBERTa's, ... A named token that
        ``tokenizer.json`` lists as a non-special added token is made special, as transformers 5
        does (``decode(skip_special_tokens=True)`` leaves it out).

        Other settings of ``tokenizer_config.json`` that transformers applies:

        * ``truncation_side`` (else the ``direction`` of ``tokenizer.json``'s ``truncation``, else
          ``"right"``): an encoder keeps a long text's last tokens when it is ``"left"``;
        * ``clean_up_tokenization_spaces`` (default false): :meth:`decode` removes the spaces
          before punctuation and contractions; not for a BPE model (GPT-2's, Llama's), as
          transformers skips it there, unless
          ``clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output`` is true;
        * ``do_lower_case``, ``strip_accents`` and ``tokenize_chinese_chars``, only where
          transformers' tokenizer is a BERT one (its ``tokenizer_class``, or with none the model
          type of ``config.json``: BERT, DistilBERT, ELECTRA, MPNet, Funnel, ..., chosen as above):
          ``tokenizer.json``'s normalizer, whatever it is (a ``Sequence`` holding a ``Lowercase``,
          none at all), is replaced by a ``BertNormalizer`` built from them (its ``lowercase``,
          ``strip_accents`` and ``handle_chinese_chars``; ``clean_text`` true, or for Funnel's
          class ``tokenizer_config.json``'s ``clean_text``), as those tokenizers' ``__init__``
          builds it, and one absent takes transformers' default (true, null, true) whatever
          ``tokenizer.json`` says (a case-sensitive ``tokenizer.json`` without
          ``"do_lower_case": false`` lowercases there, and so here; a folder that
          sentence-transformers 6 saves with ``do_lower_case`` over a cased BERT writes a
          ``Lowercase()`` into ``tokenizer.json`` and ``"do_lower_case": false`` into
          ``tokenizer_config.json``: it does not lowercase there, and so not here). For any other
          class (``PreTrainedTokenizerFast``, ``TokenizersBackend``, ``ConvBertTokenizer``, a
          GPT-2 one) or none at all, the keys are ignored, as transformers ignores them:
          ``tokenizer.json``'s normalizer is kept;
        * ``split_special_tokens`` (default false): special tokens typed in a text are tokenized as
          text (the backend's ``encode_special_tokens``);
        * ``add_prefix_space``, for the classes that build their ``ByteLevel`` pre-tokenizer from
          it (GPT-2's, Qwen2's, CodeGen's, GPT-NeoX's, RoBERTa's, ...: ``_PREFIX_SPACE_CLASSES``):
          set on ``tokenizer.json``'s ``ByteLevel`` pre-tokenizer; absent, the class's default
          (false for most), whatever ``tokenizer.json`` says;
        * for Llama's, CodeLlama's and Gemma's classes over a SentencePiece-style (not byte-level)
          ``tokenizer.json``: its normalizer, pre-tokenizer and decoder are rebuilt as those
          classes rebuild them, from ``legacy`` (default false) and ``add_prefix_space`` (default
          true): ``Metaspace`` prepending ``"▁"`` to the text's start only (``legacy`` false) or also
          after each special token (true); see ``_rebuild_sentencepiece``. Tokens those
          classes add that the vocabulary lacks (CodeLlama's infill tokens) are left out;
        * ``padding_side``, for a causal LM only: the default side of :meth:`encode_batch` (when
          absent, the class's: left for Llama's and Gemma's tokenizers, as transformers'). An
          encoder always pads on the right: a ``"left"`` in an encoder's folder is not applied
          (BERT counts positions from the first token, padding included, so left padding would
          change the shorter texts' embeddings).

        Args:
            name_or_path: a model directory, a ``.gguf`` file or an embedded model's name; required
                (no default: this class serves BERT encoders and causal LMs alike; the embedding
                default, all-MiniLM-L6-v2, is :meth:`SentenceEncoder.from_pretrained`'s and
                :meth:`BertModel.from_pretrained`'s).
            max_length: an encoder tokenizer's truncation length (None: the default above; it can
                be changed later through the :attr:`max_length` property). None for a causal LM.

        Raises:
            FileNotFoundError: no such model or no ``tokenizer.json``.
            ValueError: a corrupt ``tokenizer.json`` or GGUF file (naming it); a file that is not a
                GGUF file (a file path must be a ``.gguf`` checkpoint: for a ``tokenizer.json``, pass
                its directory); ``max_length`` below 1 or below the number of special tokens added,
                or given for a causal-LM tokenizer, which never truncates (a prompt too long for the
                model is refused by the model, not cut); naming ``sentence_bert_config.json`` and
                the key: a ``do_lower_case`` that is not a bool, a ``max_seq_length`` that is not
                a positive int or is longer than the positions, a ``processor_kwargs`` /
                ``tokenizer_args`` that is not an object or holds a key not applied (above) or a
                value of the wrong type (``model_max_length`` a positive int of at most the
                positions, ``do_lower_case`` a bool, ``truncation_side`` ``"right"`` or
                ``"left"``); a ``processing_kwargs``, ``query_length``, ``document_length`` or
                ``query_expansion`` that is refused (above; a ``max_length`` there a positive int of
                at most the positions, and none for a causal LM); a ``config.json`` whose
                ``architectures`` is not a list of strings or ``model_type`` not a string; a
                ``chat_template`` in ``tokenizer_config.json`` that is not a str or a list of
                ``{"name": str, "template": str}``; a ``chat_template.jinja`` or
                ``additional_chat_templates/*.jinja`` that is not UTF-8 text (naming the file);
                naming ``tokenizer_config.json`` and the key: a ``truncation_side`` or
                ``padding_side`` not ``"right"`` or ``"left"``, a ``clean_up_tokenization_spaces``
                not a bool, a ``split_special_tokens`` not a bool or null, an ``add_prefix_space``
                (or, for Llama's classes, ``legacy``) not a bool or null; a Llama, CodeLlama or
                Gemma class over a ``tokenizer.json`` whose model is not a BPE (transformers would
                rebuild it as one); for a BERT tokenizer class (where they are applied), a
                ``do_lower_case`` or ``tokenize_chinese_chars`` (Funnel's: also ``clean_text``) not
                a bool, a ``strip_accents`` not a bool or null.
            TypeError: ``max_length`` not an int or None.
        """
        from tokenizers import Tokenizer as HFTokenizer

        max_length = check_optional_int(max_length, "max_length", 1)
        location = resolve_model_path(name_or_path)
        model_dir = Path(location)
        cfg = {}  # tokenizer_config.json's settings (a GGUF file has none)
        if location.is_file():
            _check_gguf_magic(location, name_or_path)
            causal = True
        else:
            # sentence_bert_config.json's processor_kwargs: transformers' tokenizer arguments, over the file's keys
            cfg = {**_read_json_object(model_dir / "tokenizer_config.json"), **_processor_kwargs(model_dir)}
            processing_length = _processing_max_length(model_dir)  # processing_kwargs' max_length, or None
            causal = _directory_is_causal(model_dir, cfg, max_length)
            if causal and processing_length is not None:
                raise ValueError(f"{model_dir / 'sentence_bert_config.json'}: processing_kwargs: max_length: "
                                 f"{name_or_path!r} has a causal-LM tokenizer, which does not truncate; expected "
                                 f"none, got {processing_length}")
        if causal and max_length is not None:
            raise ValueError(f"max_length: {name_or_path!r} has a causal-LM tokenizer, which does not truncate; "
                             f"expected None, got {max_length}")
        if location.is_file():
            return cls.from_gguf(location)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer.json: not found in model directory {model_dir}")
        try:
            tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # the Rust parser's errors: name the file
            raise ValueError(f"{path}: cannot read tokenizer.json ({type(e).__name__}: {e})") from None
        config_path = model_dir / "tokenizer_config.json"
        split_special = _config_bool(cfg, "split_special_tokens", config_path)
        klass = _tokenizer_class(model_dir, cfg, tok)  # transformers' class: its defaults, what it rebuilds
        class_tokens = _CLASS_SPECIAL_TOKENS.get(klass, {})
        tokens = _special_tokens_of_config(cfg, tok, class_tokens)
        if "pad_token" not in cfg and klass in _GENERIC_CLASSES and tok.padding is not None:
            # transformers' TokenizersBackend takes tokenizer.json's padding token when
            # tokenizer_config.json has no pad_token key (a class of its own passes its default)
            pad = tok.padding["pad_token"]
            tokens["pad_token"] = pad if tok.token_to_id(pad) is not None else None
        if klass in _SENTENCEPIECE_CLASSES:
            tok = _rebuild_sentencepiece(tok, klass, cfg, config_path, tokens["unk_token"])
        _register_special_tokens(tok, tokens, cfg, named_become_special=True)
        if klass in _PREFIX_SPACE_CLASSES:
            tok = _apply_add_prefix_space(tok, cfg, config_path, _PREFIX_SPACE_CLASSES[klass])
        _apply_bert_normalizer_flags(tok, cfg, config_path, klass)
        tok.encode_special_tokens = split_special  # transformers' split_special_tokens
        clean_up, clean_up_bpe = _clean_up_of_config(cfg, tok, config_path)
        settings = {"truncation_side": _config_choice(cfg, "truncation_side", config_path),
                    "clean_up_tokenization_spaces": clean_up}
        if causal:
            side = _config_choice(cfg, "padding_side", config_path)
            if side is None and klass in _LEFT_PADDING_CLASSES:  # the class's own side (Llama's, Gemma's)
                side = "left"
            t = cls._owning(tok, max_length=None, **tokens, chat_template=_chat_template_of_dir(model_dir, cfg),
                            padding_side=side, **settings)
            t._clean_up_bpe = clean_up_bpe
            return t
        if max_length is None:
            max_length = _default_max_length(model_dir, cfg)  # checked even where processing_kwargs' wins
            if processing_length is not None:
                max_length = processing_length
        if tokens["pad_token"] is None:  # none in tokenizer_config.json (or not in the vocabulary)
            tokens["pad_token"] = "[PAD]" if tok.token_to_id("[PAD]") is not None else (tok.id_to_token(0) or "[PAD]")
        # the unknown token: tokenizer_config.json's, else the WordPiece/BPE model's own, if in the vocabulary
        unk = getattr(tok.model, "unk_token", None)
        if "unk_token" not in cfg and "unk_token" not in class_tokens and isinstance(unk, str) \
                and tok.token_to_id(unk) is not None:
            tokens["unk_token"] = unk
        _config_choice(cfg, "padding_side", config_path)  # checked, not applied: an encoder pads on the right
        t = cls._owning(tok, max_length=max_length, **tokens, do_lower_case=_do_lower_case(model_dir), **settings)
        t._clean_up_bpe = clean_up_bpe
        return t

    @classmethod
    def from_gguf(cls, path_or_checkpoint, pre_tokenizer: str | None = None) -> "Tokenizer":
        """A causal-LM tokenizer rebuilt from a GGUF file's tokenizer metadata.

        Supported: ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE; SentencePiece's "llama" and
        the other models are refused). Read: ``tokenizer.ggml.tokens`` (the vocabulary; ids are
        positions), ``.merges`` (``"left right"`` pairs, best first), ``.token_type`` (3 = control
        tokens become special added tokens, 4 = user-defined ones plain added tokens), ``.pre``
        (the pre-tokenizer: see ``GGUF_PRE_TOKENIZERS``; "default", or no ``.pre`` at all, is
        rebuilt as GPT-2's split, as transformers' GGUF converter does, which is not llama.cpp's
        "default" regex: that one also splits off punctuation runs and cuts digit runs into groups
        of three), ``.bos_token_id`` / ``.eos_token_id`` / ``.unknown_token_id`` /
        ``.padding_token_id``, ``.add_bos_token`` / ``.add_eos_token`` (whether :meth:`encode` with
        ``add_special_tokens=True`` adds them; default False) and ``tokenizer.chat_template``.

        A normal token stands for bytes in the byte-level alphabet (one written in other characters
        is re-spelled from its UTF-8 bytes, as transformers does). A control or user-defined token
        stands for its raw text, as llama.cpp reads it, whatever its characters (``"<｜bos｜>"``,
        ``"café"``): it is matched whole by that text in :meth:`encode` (before the pre-tokenizer),
        :meth:`decode` gives that text (a control token is left out with ``skip_special_tokens``),
        and the BOS / EOS / unknown / padding tokens are named by it (``bos_token``, the chat
        template's ``{{ bos_token }}``).

        Args:
            path_or_checkpoint: a ``.gguf`` path or a :class:`~transformer_core.gguf_file.GGUFCheckpoint`.
            pre_tokenizer: overrides ``tokenizer.ggml.pre`` (one of ``GGUF_PRE_TOKENIZERS``). For
                SmolLM2 the file says "smollm" (digits isolated, as its own ``tokenizer.json`` and
                llama.cpp do); transformers' GGUF converter does not know that name and falls back to
                GPT-2's split, which tokenizes a digit after two or more whitespace characters
                (``"x  1"``, indented numbers in code) or a non-ASCII numeral after a space
                (``" ½"``) differently; ``pre_tokenizer="gpt2"`` reproduces transformers.

        :attr:`all_special_tokens` / :attr:`all_special_ids` are the file's BOS, EOS, unknown and
        padding tokens (those it names, each once), as transformers' GGUF loading gives them.

        Raises:
            TypeError: ``path_or_checkpoint`` not a str, ``os.PathLike`` or ``GGUFCheckpoint``;
                ``pre_tokenizer`` not a str or None.
            FileNotFoundError: no file at ``path_or_checkpoint`` (or a directory).
            ValueError: ``pre_tokenizer`` not one of ``GGUF_PRE_TOKENIZERS``. Naming the file: an
                unreadable GGUF (see ``read_gguf_metadata``; given a path, only the metadata is read
                and checked, not the tensors, whose ggml types may be any), a tokenizer model or
                pre-tokenizer that is not supported, or inconsistent or wrongly typed tokenizer
                metadata, naming the key: ``tokens`` not distinct strings (a duplicate is named
                with both ids; an empty token is named ``"[EMPTY_<id>]"``, as llama.cpp does),
                ``token_type`` not one int per token, ``add_bos_token`` / ``add_eos_token`` not a
                GGUF bool (a string ``"false"`` is refused, not read as True), a special token id
                outside the vocabulary, merges of unknown tokens, a ``chat_template`` that is not a
                string.
        """
        from .gguf_file import GGUFCheckpoint, read_gguf_metadata

        if not isinstance(path_or_checkpoint, (str, os.PathLike, GGUFCheckpoint)):
            raise TypeError(f"path_or_checkpoint: expected a str, os.PathLike or GGUFCheckpoint, got "
                            f"{type(path_or_checkpoint).__name__}")
        if pre_tokenizer is not None and not isinstance(pre_tokenizer, str):
            raise TypeError(f"pre_tokenizer: expected a str or None, got {type(pre_tokenizer).__name__}")
        if pre_tokenizer is not None and pre_tokenizer not in GGUF_PRE_TOKENIZERS:
            raise ValueError(f"pre_tokenizer: expected one of {GGUF_PRE_TOKENIZERS} or None, got {pre_tokenizer!r}")
        if isinstance(path_or_checkpoint, GGUFCheckpoint):
            path, metadata = path_or_checkpoint.path, path_or_checkpoint.metadata
        else:  # metadata only: a tokenizer does not need the tensors (nor their types) to be supported
            path = Path(path_or_checkpoint)
            if not path.is_file():
                raise FileNotFoundError(f"path_or_checkpoint: no GGUF file at {path}")
            metadata = read_gguf_metadata(path)
        prefix = "tokenizer.ggml."
        meta = {k[len(prefix):]: v for k, v in metadata.items() if k.startswith(prefix)}
        if pre_tokenizer is not None:
            meta["pre"] = pre_tokenizer
        tok, special = _tokenizer_from_gguf(path, meta)
        template = metadata.get("tokenizer.chat_template")
        if template is not None and not isinstance(template, str):
            raise ValueError(f"{path}: GGUF metadata tokenizer.chat_template: expected a string, got "
                             f"{type(template).__name__} {_clip(template)}")
        return cls._owning(tok, max_length=None, pad_token=special["pad_token"], bos_token=special["bos_token"],
                   eos_token=special["eos_token"], unk_token=special["unk_token"], chat_template=template)

    # ---------------------------------------------------------------------------- encoding
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of one text, cut to :attr:`max_length` by an encoder tokenizer (a causal-LM
        tokenizer never cuts): transformers' ``tok.encode(text, truncation=True,
        max_length=tok.max_length)``, where transformers' default does not truncate.

        Args:
            text: a str. Special tokens written in it (``"<|im_start|>"``) become their ids.
            add_special_tokens: add the model's template tokens (``[CLS] ... [SEP]`` for BERT; BOS
                for a GGUF whose ``add_bos_token`` is set; nothing for SmolLM2).

        With :attr:`do_lower_case` set, the backend's normalizer lowercases it (``Lowercase()``,
        as sentence-transformers 6; not ``str.lower()``).

        Raises:
            TypeError: ``text`` not a str. ValueError: ``text`` not valid Unicode (a lone
            surrogate; its position is named).
        """
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        check_unicode(text, "text")
        add_special_tokens = check_bool(add_special_tokens, "add_special_tokens")
        (text,) = _texts_to_tokenize(self, [text], add_special_tokens)  # a huge text: the prefix that gives its ids
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[str]:
        """The tokens (strings, in the vocabulary's spelling) of one text, cut to :attr:`max_length`
        by an encoder tokenizer (a causal-LM tokenizer never cuts): transformers'
        ``tok.tokenize(text)`` up to that length (transformers does not truncate).

        Args:
            text: a str (see :meth:`encode`).
            add_special_tokens: add the model's template tokens, as in :meth:`encode`. Default
                False, as transformers' ``tokenize``.

        Raises:
            TypeError, ValueError: as :meth:`encode`.
        """
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        check_unicode(text, "text")
        add_special_tokens = check_bool(add_special_tokens, "add_special_tokens")
        (text,) = _texts_to_tokenize(self, [text], add_special_tokens)  # as encode
        return self._tok.encode(text, add_special_tokens=add_special_tokens).tokens

    @staticmethod
    def _check_texts(texts) -> list[str]:
        """``texts`` as a list, checked: a list (or tuple) of valid-Unicode str."""
        if not isinstance(texts, (list, tuple)):
            raise TypeError(f"texts: expected a list of str, got {type(texts).__name__}")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"texts: expected a list of str, got {type(t).__name__} at index {i}")
            check_unicode(t, "texts", i)
        return list(texts)

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool | None = None) -> str:
        """Text from token ids, as transformers' ``decode``.

        Args:
            ids: a list (or 1-D array / tensor, or one int) of token ids: one text.
            skip_special_tokens: leave the backend's special tokens out of the text (its special
                added tokens: :attr:`special_tokens`, which hold the tokens the constructor or
                :meth:`from_pretrained` named; a token named only by assignment, as
                ``tok.pad_token = "hello"``, is kept, as transformers keeps it).
                Default False, as transformers: a reply's ``<|im_end|>`` stays in the text.
            clean_up_tokenization_spaces: remove the spaces before punctuation and contractions
                (``" ."`` -> ``"."``, ``" ' "`` -> ``"'"``, ``" n't"`` -> ``"n't"``, ...:
                transformers' ``clean_up_tokenization``); None (the default): the tokenizer's
                :attr:`clean_up_tokenization_spaces`. A BPE tokenizer's text (SmolLM2's, GPT-2's)
                is left as it is, as transformers does, unless its folder's
                ``tokenizer_config.json`` sets
                ``clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output``: its
                spaces are the text's own. :class:`TextStream` does not apply it (it can change
                text already streamed).

        Raises:
            TypeError: an id that is not an int, ``ids`` not a list/array of ints (a nested list
                included); ``skip_special_tokens`` not a bool, ``clean_up_tokenization_spaces``
                not a bool or None.
            ValueError: an id outside the vocabulary (below 0 or above its highest id, which is
                ``len(tokenizer) - 1`` unless its ids have gaps), or in one of its gaps (an id no token
                has); an array of more than one dimension (a batch: decode its rows one at a time);
                an array or range of more ids than this machine's memory can list (112 bytes an id),
                before any list is made.
        """
        skip_special_tokens = check_bool(skip_special_tokens, "skip_special_tokens")
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self._clean_up
        clean_up_tokenization_spaces = check_bool(clean_up_tokenization_spaces, "clean_up_tokenization_spaces")
        text = self._tok.decode(self._check_ids(ids), skip_special_tokens=skip_special_tokens)
        if clean_up_tokenization_spaces and (self._clean_up_bpe or not self._is_bpe()):
            for spaced, joined in _CLEAN_UP_TOKENIZATION:
                text = text.replace(spaced, joined)
        return text

    def encode_batch(self, texts, add_special_tokens: bool = True, padding_side: str | None = None) -> dict[str, np.ndarray]:
        """Tokenizes a batch into int64 numpy arrays, padded to its longest member with
        :attr:`pad_token_id`; an encoder tokenizer also cuts each text to :attr:`max_length`. Also
        ``tokenizer(texts)``: for an encoder, transformers' ``tok(texts, padding=True,
        truncation=True, max_length=tok.max_length, return_tensors="np")``, for a causal-LM
        tokenizer the same without truncation (same ``input_ids`` and ``attention_mask``; our
        ``token_type_ids`` are zeros where transformers' gives none). transformers' own
        ``tok(texts)`` neither pads nor truncates, and returns lists.

        Args:
            texts: a list of str.
            add_special_tokens: as in :meth:`encode`.
            padding_side: ``"right"`` or, for a causal-LM tokenizer, ``"left"`` (generation); None
                (the default): the tokenizer's :attr:`padding_side`.

        Returns:
            ``{"input_ids", "attention_mask", "token_type_ids"}``, each an ``(N, L)`` int64 array;
            ``attention_mask`` is 1 for real tokens, 0 for padding.

        With :attr:`do_lower_case` set, the backend's normalizer lowercases each text (as
        :meth:`encode`).

        An encoder tokenizer pads as its backend is set to pad (``backend.padding``: the side, the
        pad id and type id, a fixed ``length``, ``pad_to_multiple_of``), as the tokenizers package
        would; the padding is done here, from the unpadded encodings, so that a batch too large to
        pad is refused first (the package's own padding aborts the process when an allocation
        fails). The unpadded encodings come from a kept copy of the backend without padding (one with
        parts written in Python included, see ``_derived_backend``): the backend's padding is never
        switched off, so another thread's call on it is never left unpadded.

        Raises:
            TypeError: ``texts`` not a list of str (the first item that is not a str is named by
            index and type). ValueError: an empty list, a bad ``padding_side``, a text that is not
            valid Unicode (a lone surrogate; its index and position are named); padded arrays
            (three ``(N, L)`` int64 arrays) larger than this machine's memory, before any is made.
        """
        texts = self._check_texts(texts)
        if not texts:
            raise ValueError("texts: expected at least one text, got an empty list")
        add_special_tokens = check_bool(add_special_tokens, "add_special_tokens")
        padding_side = self._checked_padding_side(self._padding_side if padding_side is None else padding_side,
                                                  self.max_length)
        padding = self._tok.padding if self.max_length is not None else None  # read once
        texts = _texts_to_tokenize(self, texts, add_special_tokens)  # huge texts: the prefixes that give their ids
        if padding is None:  # a causal-LM tokenizer (or a backend whose padding was switched off)
            return self._pad(self._tok.encode_batch(texts, add_special_tokens=add_special_tokens), padding_side)
        encs = self._unpadded_backend().encode_batch(texts, add_special_tokens=add_special_tokens)
        return self._pad(encs, padding["direction"], pad_id=padding["pad_id"], pad_type_id=padding["pad_type_id"],
                         length=padding["length"], multiple=padding["pad_to_multiple_of"])

    __call__ = encode_batch

    def encode_batches(self, texts, batch_size: int, add_special_tokens: bool = True):
        """Tokenizes consecutive batches: yields, for texts ``[0:batch_size]``, ``[batch_size:2 ·
        batch_size]``, ..., the same arrays as :meth:`encode_batch` of that batch under the
        backend's default padding: right, to the batch's longest row, with :attr:`pad_token_id`
        (the pad id :meth:`encode_batch` pads with too; other padding settings changed on the
        backend, a fixed length, a multiple, the side, are followed by :meth:`encode_batch` only).

        The texts go to the tokenizers package ``TEXTS_PER_CALL`` at a time (rounded to whole
        batches), not a batch at a time: one call tokenizes them on all of the package's threads,
        and fewer calls fall between a model's forward passes, whose OpenMP threads are still
        spinning when the next batch is tokenized. ``SentenceEncoder.encode`` of 1,000 sentences
        (all-MiniLM-L6-v2, Zen 5, 2 threads) spent 51-89 ms tokenizing in 32 calls, against 25 ms
        for one call: 680 -> 692 sentences/s.

        The backend (with :attr:`max_length` and :attr:`truncation_side`) and :attr:`pad_token_id`
        are read once, when this method is called: a setter called while its batches are taken
        (between two of them, or from another thread) applies from the next call, and every batch
        of this one is tokenized and padded alike.

        Args:
            texts: a list of str.
            batch_size: texts per yielded batch (the last may hold fewer).
            add_special_tokens: as in :meth:`encode`.

        Yields:
            ``{"input_ids", "attention_mask", "token_type_ids"}``, each an ``(n, L)`` int64 array.

        Raises:
            TypeError: ``texts`` not a list of str (the first item that is not a str is named by
            index and type); ``batch_size`` not an int.
            ValueError: ``batch_size`` < 1; a text that is not valid Unicode (a lone surrogate;
            its index and position are named), before any batch is yielded; a batch whose padded
            arrays exceed this machine's memory (named ``texts[a:b]``), before it is padded.
        """
        texts = self._check_texts(texts)
        batch_size = check_int(batch_size, "batch_size", 1)
        add_special_tokens = check_bool(add_special_tokens, "add_special_tokens")
        # the backend (so max_length and truncation_side) and the pad id, read once, when the call
        # starts: a setter called while the batches are taken applies from the next call
        return self._batches(texts, batch_size, add_special_tokens, self._unpadded_backend(), self.pad_token_id)

    TEXTS_PER_CALL = 1024  # texts per call of the tokenizers package in encode_batches

    def _batches(self, texts, batch_size, add_special_tokens, backend, pad_id):
        """encode_batches' batches: ``texts`` tokenized by ``backend`` (unpadded) ``TEXTS_PER_CALL``
        at a time (rounded to whole batches), each batch padded on the right with ``pad_id``."""
        per_call = max(1, self.TEXTS_PER_CALL // batch_size) * batch_size
        for c0 in range(0, len(texts), per_call):
            encs = backend.encode_batch(texts[c0:c0 + per_call], add_special_tokens=add_special_tokens)
            for b0 in range(0, len(encs), batch_size):
                start = c0 + b0
                batch = encs[b0:b0 + batch_size]
                yield self._pad(batch, "right", where=f"texts[{start}:{start + len(batch)}]", pad_id=pad_id)

    def _unpadded_backend(self):
        """The backend that :meth:`encode_batches` tokenizes with: the backend itself when it does
        not pad (a causal LM's); else a copy of it with padding off, in the backend's current
        state (see :meth:`_derived_backend`)."""
        return self._derived_backend(truncate=True)

    def _plain_backend(self):
        """The backend that :meth:`apply_chat_template` tokenizes with: the backend itself when it
        neither truncates nor pads (a causal LM's); else a copy of it with neither, in the
        backend's current state (see :meth:`_derived_backend`)."""
        return self._derived_backend(truncate=False)

    def _derived_backend(self, truncate: bool):
        """A copy of the backend without its padding, and without its truncation unless
        ``truncate``, for :meth:`_unpadded_backend` and :meth:`_plain_backend`; the backend itself
        when it has neither to drop.

        The copy (:func:`_backend_from_parts`: the backend's own model, normalizer, pre-tokenizer,
        post-processor and decoder objects, its added tokens, ``encode_special_tokens`` and, with
        ``truncate``, its truncation; 30-50 µs) is kept with the backend's watch
        (:class:`_BackendWatch`) and made again when the backend may have changed since: after a
        setter (which swaps in a new backend with a new watch), or on every call once the backend
        was handed out through :attr:`backend` (it may have changed at any time). A copy is never
        changed once made (another thread may be encoding with it), and the backend's truncation and
        padding are never switched off for this, so another thread's call on it is never left
        untruncated or unpadded; a backend with parts written in Python gets such a copy too.
        """
        # The watch is read before the backend is: a backend swapped in meanwhile (_own_backend,
        # _swap_backend) comes with a watch of its own, set after it, so a copy of the old backend is
        # kept with the old watch object and never taken for the new backend's.
        watch = getattr(self, "_backend_watch", None)  # None: pickled before it existed
        live = self._tok
        if live.padding is None and (truncate or live.truncation is None):
            return live
        slot = "_unpadded" if truncate else "_plain"
        kept = getattr(self, slot, None)  # (the watch the copy was made under, the copy), or None
        if kept is not None and len(kept) == 2 and watch is not None and not watch.handed_out and kept[0] is watch:
            return kept[1]  # nothing can have changed the backend since it was made
        copy = _backend_from_parts(live)
        truncation = live.truncation if truncate else None
        if truncation is not None:
            copy.enable_truncation(**truncation)
        setattr(self, slot, (watch, copy))  # one assignment: another thread sees it or the old one
        return copy

    def _pad(self, encs, padding_side: str, where: str = "texts", *, pad_id: int | None = None,
             pad_type_id: int = 0, length: int | None = None, multiple: int | None = None) -> dict[str, np.ndarray]:
        """encode_batch's arrays from unpadded encodings: each row padded on ``padding_side`` to
        the longest, or to ``length`` when given, that rounded up to a multiple of ``multiple``
        (the tokenizers package's ``pad_encodings``), and to the longest row where that is longer
        (the package leaves such a row as it is, which no array can hold). Padding takes
        ``pad_id`` (None: :attr:`pad_token_id`), type id ``pad_type_id`` and attention 0.

        Raises:
            ValueError: naming ``where`` (the texts of ``encs``), when the three ``(N, L)`` int64
                arrays need more bytes than this machine's memory; checked before any is made.
        """
        longest = max(len(e.ids) for e in encs)
        target = longest if length is None else length
        if multiple and target % multiple:  # the package rounds the length it pads to, then pads no row past it
            target += multiple - target % multiple
        target = max(target, longest)
        shape = (len(encs), target)
        need = 3 * shape[0] * shape[1] * np.dtype(np.int64).itemsize
        limit = physical_memory_bytes()
        if need > limit:
            longest_note = f" (the longest has {longest})" if target != longest else ""
            raise ValueError(f"{where}: padding {shape[0]} texts to {target} tokens{longest_note} needs three int64 "
                             f"arrays of shape {shape}, {need} bytes, more than this machine's memory ({limit} bytes); "
                             f"tokenize fewer or shorter texts at a time")
        out = {"input_ids": np.full(shape, self.pad_token_id if pad_id is None else pad_id, dtype=np.int64),
               "attention_mask": np.zeros(shape, dtype=np.int64),
               "token_type_ids": np.full(shape, pad_type_id, dtype=np.int64)}
        for row, e in enumerate(encs):
            n = len(e.ids)
            cols = slice(target - n, target) if padding_side == "left" else slice(0, n)
            out["input_ids"][row, cols] = e.ids
            out["attention_mask"][row, cols] = 1
            out["token_type_ids"][row, cols] = e.type_ids
        return out

    # ---------------------------------------------------------------------------- chat and streaming
    def get_chat_template(self, chat_template: str | None = None, tools=None) -> str:
        """The template :meth:`apply_chat_template` renders, chosen as transformers'
        ``get_chat_template`` chooses it. With named templates (``self.chat_template`` a dict): a
        ``chat_template`` that names one selects it, any other str is itself the template; without
        one, the ``"tool_use"`` template when ``tools`` is given (not None) and stored, else
        ``"default"``. With a single template: ``chat_template`` if given, else the tokenizer's.

        Raises:
            TypeError: ``chat_template`` not a str or None.
            ValueError: no template at all; named templates without ``"default"`` and none chosen
                (listing the names).
        """
        if chat_template is not None and not isinstance(chat_template, str):
            raise TypeError(f"chat_template: expected a str (a template or a template's name) or None, "
                            f"got {type(chat_template).__name__}")
        stored = self.chat_template
        if isinstance(stored, dict):
            if chat_template is not None:
                return stored.get(chat_template, chat_template)
            if tools is not None and "tool_use" in stored:
                return stored["tool_use"]
            if "default" in stored:
                return stored["default"]
            raise ValueError(f"chat_template: this tokenizer has named chat templates but no 'default'; pass the name "
                             f"of one (or a template) as chat_template; names: {sorted(stored)}")
        if chat_template is not None:
            return chat_template
        if stored is None:
            raise ValueError("chat_template: this tokenizer has no chat template")
        return stored

    def apply_chat_template(self, messages, add_generation_prompt: bool = False, *, tokenize: bool,
                            continue_final_message: bool | str = False, chat_template: str | None = None,
                            return_dict: bool = False, **kwargs):
        """The prompt for a conversation, rendered with this tokenizer's chat template (see
        :func:`transformer_core.chat_template.render_chat_template`; the named special tokens that
        are set, ``bos_token``, ``eos_token``, ``unk_token``, ``sep_token``, ``pad_token``,
        ``cls_token`` and ``mask_token``, are passed to the template: ``pad_token`` only when the
        tokenizer has one of its own, from its config or assigned, not the EOS that a causal-LM
        tokenizer without one pads with, as transformers' ``special_tokens_map``), as transformers'
        ``apply_chat_template(..., tokenize=False)`` renders it.

        Args:
            messages: a list of ``{"role": str, "content": ...}``: content a str, a list of content
                parts (``[{"type": "text", "text": "..."}]``) or other JSON data, as the template
                reads it. Keys whose value is None are left out first, as transformers does (the
                OpenAI SDK's ``"content": None``, ``"tool_calls": None``).
            add_generation_prompt: end with the header of the assistant's turn.
            tokenize: required, by keyword, with no default: True returns the token ids, False the
                text. A default would give a call written for transformers (whose default returns
                ids) or for the text the other kind without a word; a call without it raises
                Python's TypeError ("missing 1 required keyword-only argument: 'tokenize'"). With
                True, the ids are a plain ``list`` of
                int, the rendered text encoded without adding special tokens (the template writes
                them), without truncation or padding (an encoder's :attr:`max_length` does not cut
                it), by the backend's normalizer (with :attr:`do_lower_case`, its ``Lowercase()``
                too): transformers' ``apply_chat_template(..., tokenize=True,
                return_dict=False)``.
                transformers 5's ``tokenize=True`` (its ``return_dict=True`` default) returns a
                ``BatchEncoding`` dict instead, whose ``"input_ids"`` is that list; no dict is
                returned here (see ``return_dict``).
            continue_final_message: end the prompt with the last message's content left open (no
                end-of-turn tokens after it), for the model to continue it: the prompt is cut where
                that content ends, as transformers cuts it (it marks the content, renders, and cuts
                at the mark; a template that strips the message's trailing spaces loses them). For
                a list of content parts, the last part with a ``"text"`` is continued; a str names
                another field to continue (``"reasoning_content"``).
            chat_template: a Jinja2 template to use instead of this tokenizer's, or the name of one
                of its named templates (see :meth:`get_chat_template`; with ``tools`` given, a
                stored ``"tool_use"`` template is chosen by default).
            return_dict: transformers' option, accepted as a bool. False (the default here) or any
                value with ``tokenize=False`` changes nothing, as in transformers (whose
                ``return_dict`` has no effect on text). True with ``tokenize=True`` is refused:
                transformers' dict has keys that depend on its tokenizer class
                (``"token_type_ids"`` for BERT's, besides ``"input_ids"`` and
                ``"attention_mask"``), which this tokenizer does not know.
            **kwargs: more template variables (``tools``, ``documents``, ...). transformers'
                tokenizing options ``padding``, ``truncation``, ``max_length``, ``return_tensors``,
                ``return_assistant_tokens_mask``, ``tokenizer_kwargs`` and
                ``sanitize_control_tokens`` are not implemented and are refused (they would otherwise
                become template variables, silently ignored).

        Raises:
            ValueError: no chat template (or named ones without a default and none chosen); a bad
                message (see ``render_chat_template``); ``continue_final_message`` with
                ``add_generation_prompt``, naming a field the last message lacks, or with a template
                that does not write the continued text; ``return_dict=True`` with ``tokenize=True``;
                with ``tokenize=True``, a rendered text that is not valid Unicode (a lone surrogate
                in a message; ``messages`` and its position in the text are named).
            TypeError: ``tokenize`` not given; ``add_generation_prompt``, ``tokenize`` or
                ``return_dict`` not a bool; ``continue_final_message`` not a bool or str;
                ``chat_template`` not a str or None; one of transformers' options above.
        """
        from .chat_template import render_chat_template

        tokenize = check_bool(tokenize, "tokenize")
        return_dict = check_bool(return_dict, "return_dict")
        if return_dict and tokenize:
            raise ValueError("return_dict: True (transformers' BatchEncoding, whose keys depend on its tokenizer "
                             "class) is not supported here; expected False: the list of token ids, its "
                             "\"input_ids\"")
        unsupported = [name for name in kwargs if name in _HF_CHAT_OPTIONS]
        if unsupported:
            raise TypeError(f"{', '.join(unsupported)}: transformers' apply_chat_template option(s) not supported here "
                            f"(this method returns the text, or with tokenize=True a list of token ids: no padding, "
                            f"truncation, tensors or dicts); expected none of {', '.join(_HF_CHAT_OPTIONS)}")
        template = self.get_chat_template(chat_template, kwargs.get("tools"))
        variables = {name: getattr(self, name) for name in _NAMED_SPECIAL_TOKENS}
        if not getattr(self, "_pad_named", True):  # the padding fallback (EOS): transformers passes no pad_token
            variables["pad_token"] = None
        variables = {k: v for k, v in variables.items() if v is not None}
        variables.update(kwargs)
        text = render_chat_template(template, messages, add_generation_prompt=add_generation_prompt,
                                    continue_final_message=continue_final_message, **variables)
        if not tokenize:
            return text
        check_unicode(text, "messages")  # as encode checks its text (the binding's TypeError names nothing)
        # transformers tokenizes it with truncation=False, padding=False: a kept copy without them
        return self._plain_backend().encode(text, add_special_tokens=False).ids

    def text_stream(self, skip_special_tokens: bool = False, context=()) -> "TextStream":
        """A :class:`TextStream` that turns generated ids into text as it becomes complete (after the
        ids of ``context``, a prompt, when given). ``skip_special_tokens`` as in :meth:`decode`
        (default False, as transformers' ``TextStreamer``, which decodes as ``decode`` does)."""
        return TextStream(self, skip_special_tokens=skip_special_tokens, context=context)

    # ---------------------------------------------------------------------------- vocabulary
    @property
    def vocab_size(self) -> int:
        """Number of tokens in the base vocabulary, added tokens left out, as transformers'
        ``vocab_size``: ``tokenizers``' ``get_vocab_size(with_added_tokens=False)``. For every id
        (an embedding's rows, an id range check) see ``len(tokenizer)``."""
        return self._tok.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        """Number of tokens, added tokens included, as transformers' ``len(tokenizer)``. The ids
        run up to ``len(tokenizer) - 1`` unless the vocabulary's ids have gaps (``{..., "Ġ": 5,
        "ab": 7}``, no 6: ``len`` 7, ids up to 7)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def _id_limit(self) -> tuple[int, bool]:
        """``(one past the highest id, whether some id below it has no token)``, computed once per
        vocabulary size (tokens added to the backend make it again)."""
        size = self._tok.get_vocab_size(with_added_tokens=True)
        cached = self._id_limit_cache
        if cached is None or cached[0] != size:
            ids = set(self._tok.get_vocab(with_added_tokens=True).values())
            limit = max(ids, default=-1) + 1
            cached = self._id_limit_cache = (size, limit, len(ids) < limit)
        return cached[1], cached[2]

    @property
    def bos_token_id(self) -> int | None:
        """Id of the beginning-of-sequence token, or None."""
        return None if self.bos_token is None else self._tok.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        """Id of the end-of-sequence token (generation stops there), or None."""
        return None if self.eos_token is None else self._tok.token_to_id(self.eos_token)

    @property
    def unk_token_id(self) -> int | None:
        """Id of the unknown token, or None."""
        return None if self.unk_token is None else self._tok.token_to_id(self.unk_token)

    @property
    def special_tokens(self) -> list[str]:
        """Every special added token of the backend (``<|im_start|>``, ``[CLS]``, ...), by id: the
        tokens ``decode(..., skip_special_tokens=True)`` drops (SmolLM2's GGUF: all 17 control
        tokens). Not transformers' :attr:`all_special_tokens`, which holds the named ones only."""
        decoder = self._tok.get_added_tokens_decoder()
        return [decoder[i].content for i in sorted(decoder) if decoder[i].special]

    @property
    def all_special_tokens(self) -> list[str]:
        """The special tokens this tokenizer names, as transformers' ``all_special_tokens`` lists
        them: ``bos_token``, ``eos_token``, ``unk_token``, ``sep_token``, ``pad_token``,
        ``cls_token``, ``mask_token`` (those that are set), then ``extra_special_tokens``, each
        once (SmolLM2's GGUF: ``["<|im_start|>", "<|im_end|>", "<|endoftext|>"]``; its pad token is
        its end token)."""
        named = [getattr(self, name) for name in _NAMED_SPECIAL_TOKENS]
        tokens = [t for t in (*named, *self.extra_special_tokens) if t is not None]
        return list(dict.fromkeys(tokens))

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of :attr:`all_special_tokens`, in its order, as transformers' ``all_special_ids``
        (SmolLM2's GGUF: ``[1, 2, 0]``). For every special added token of the backend, see
        :attr:`special_tokens`."""
        return [self._tok.token_to_id(t) for t in self.all_special_tokens]

    def token_to_id(self, token: str) -> int | None:
        """Id of a token (vocabulary spelling), or None.

        Raises:
            TypeError: ``token`` not a str.
        """
        if not isinstance(token, str):
            raise TypeError(f"token: expected a str, got {type(token).__name__}")
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The token (vocabulary spelling, ``"Ġworld"`` for byte-level BPE) of an id, or None for an
        id past the vocabulary's highest id or one that its ids skip.

        Raises:
            TypeError: ``token_id`` not an int. ValueError: a negative id.
        """
        token_id = check_int(token_id, "token_id", 0, None)
        if token_id >= self._id_limit()[0]:
            return None
        return self._tok.id_to_token(token_id)

    @property
    def backend(self):
        """The underlying ``tokenizers.Tokenizer``. Changes made to it reach every later encode
        (:meth:`encode_batches` then brings its unpadded copy up to date on each call). With
        :attr:`do_lower_case`, its normalizer is the ``Sequence`` that starts with ``Lowercase()``
        (unless it already had a ``Lowercase``, then it is unchanged: see :attr:`do_lower_case`).
        A backend that ``copy.copy`` left shared is copied first (see :meth:`__copy__`): each
        Tokenizer hands out its own. Each setter that changes the backend (:attr:`do_lower_case`,
        :attr:`max_length`, :attr:`truncation_side`, :attr:`pad_token`, :attr:`pad_token_id`)
        replaces it by a new one made of the same parts (see the constructor): the object handed
        out before is then no longer this Tokenizer's backend. A part changed in place through it
        (``bk.normalizer.lowercase = False``) still reaches this Tokenizer, as the parts are
        shared; a change of the object itself (``add_tokens``, assigning a part, its truncation or
        padding) does not. Read this property again after a setter."""
        self._own_backend()
        watch = getattr(self, "_backend_watch", None)
        if watch is not None:
            watch.handed_out = True
        return self._tok

    def _check_ids(self, ids, name: str = "ids") -> list[int]:
        if isinstance(ids, (int, np.integer)) and not isinstance(ids, bool):
            ids = [ids]
        elif isinstance(ids, (str, bytes, dict)) or ids is None or not hasattr(ids, "__iter__"):
            raise TypeError(f"{name}: expected a list of int token ids, got {type(ids).__name__}")
        elif isinstance(ids, range):  # its count checked before it is listed (numpy: a float array of range(0))
            _check_id_count(_range_length(ids), name)
            _check_range_ids(ids, self._id_limit()[0], name)  # its ends, before it is listed
            ids = list(ids)
        elif not isinstance(ids, (list, tuple)):  # numpy arrays, torch tensors
            arr = to_numpy(ids, name)
            if arr.dtype.kind not in "iu":
                raise TypeError(f"{name}: expected integer token ids, got dtype {arr.dtype}")
            if arr.ndim > 1:  # a batch would run together into one text
                raise ValueError(f"{name}: expected a 1-D array of token ids (one text), got shape "
                                 f"{tuple(arr.shape)}; decode a batch one row at a time")
            _check_id_count(arr.size, name)  # a broadcast view holds few values, its lists all of them
            _check_array_ids(arr, self._id_limit()[0], name)  # with numpy, before the list is made
            ids = arr.reshape(-1).tolist()
        out = []
        limit, gaps = self._id_limit()
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                raise TypeError(f"{name}: expected int token ids, got {type(i).__name__}")
            if not 0 <= i < limit:
                raise ValueError(f"{name}: token id {int(i)} is outside the vocabulary [0, {limit})")
            if gaps and self._tok.id_to_token(int(i)) is None:
                raise ValueError(f"{name}: token id {int(i)} has no token (the vocabulary's ids [0, {limit}) "
                                 f"skip it)")
            out.append(int(i))
        return out


class TextStream:
    """Incremental detokenization for streaming generation: push ids one at a time, get back only
    text that later ids cannot change.

    A UTF-8 character can span several tokens (byte-level BPE pieces are bytes; an emoji is several
    ``<0xNN>`` tokens of a byte-fallback vocabulary, Llama 2's), and the text of such a token alone
    is U+FFFD. Each :meth:`push` decodes a short window of recent ids (one piece of already returned
    text in front of the new ids, read where it stands, as ``tokenizers``' ``DecodeStream``) and
    returns what that adds past the text already returned, holding it back while

    - the window's text ends in U+FFFD (a character split across tokens, or an invalid byte that a
      later one may yet turn into a character), or
    - the last id (special tokens skipped, when they are) is a byte-fallback ``<0xNN>`` token: a
      run of byte tokens is decoded as a whole, and one invalid byte turns the whole run into
      U+FFFD, one per byte (ids giving ``f`` then a lone ``0xBA`` decode as two U+FFFD, the ``f``
      included), so a run's text is returned once an id past the run closes it.

    Held text comes with the id that completes it, or with :meth:`finish` (U+FFFD for an incomplete
    character) when generation stops.

        stream = tokenizer.text_stream()
        for token_id in generated:
            print(stream.push(token_id), end="")
        print(stream.finish())

    What is guaranteed: the concatenation of every ``push`` and ``finish`` is ``decode(context +
    ids)`` past its longest common prefix with ``decode(context)`` (``decode(context + ids)
    [len(decode(context)):]`` when ``decode(context)`` is a prefix of it; with no context,
    ``decode(ids)``), for every decoder whose text of earlier ids changes only as above (the
    ``tokenizers`` decoders: ByteLevel, ByteFallback with Fuse/Strip/Replace, Metaspace,
    WordPiece, ...). With ``context``, a SentencePiece decoder that strips a text's leading space
    (Llama 2's) keeps the space before the first new word, which decoding the new ids alone drops;
    a context that ends inside a character (or in an open run of byte tokens) is read with the ids
    that complete it, and only the text they add is returned. Returned text is never taken back: a
    decoder that rewrote text already returned would make the later pieces restart where the two
    texts part; ``push`` never raises for it.

    Args:
        tokenizer: a :class:`Tokenizer`.
        skip_special_tokens: leave special tokens out of the text, as :meth:`Tokenizer.decode`
            (default False, as there and as transformers' ``TextStreamer``).
        context: ids the pushed ones follow (a prompt), whose own text is not returned; default none.

    Raises:
        TypeError: ``tokenizer`` not a :class:`Tokenizer`; ``skip_special_tokens`` not a bool; a
            ``context`` id not an int. ValueError: a ``context`` id outside the vocabulary; more
            ``context`` ids than this machine's memory can list (as :meth:`Tokenizer.decode`).
    """

    #: Ids of a long context kept in front of the new ones (at least; more where the cut would
    #: fall inside a character or a run of byte tokens).
    _CONTEXT_IDS = 16

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False, context=()):
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"tokenizer: expected a transformer_core.Tokenizer, got {type(tokenizer).__name__}")
        self._tokenizer = tokenizer
        self._skip = check_bool(skip_special_tokens, "skip_special_tokens")
        try:
            count = _range_length(context) if isinstance(context, range) else len(context)  # len: at most 2**63
            context = tokenizer._check_ids(context) if count else []
        except (TypeError, ValueError) as e:
            raise type(e)(f"context: {e}") from None
        backend = tokenizer._tok  # read only: not handed out (_BackendWatch)
        self._byte_ids = _byte_fallback_ids(backend)
        # the ids decode leaves out: they neither extend nor close a run of byte tokens
        self._skipped = frozenset(i for i, t in backend.get_added_tokens_decoder().items() if t.special) \
            if self._byte_ids and self._skip else frozenset()
        self._start(context)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer._tok.decode(ids, skip_special_tokens=self._skip)

    def _start(self, context: list[int]) -> None:
        """The state after ``context``: the window ``_ids`` (the context's last ids, from a point
        where its text is settled), ``_prefix`` the text of ``_ids[:_read]`` as accounted for (the
        context's, then what was returned), ``_prev`` where the piece before the last one starts."""
        cut = self._context_cut(context)
        self._ids = context[cut:]
        self._prefix = self._decode(self._ids)
        if cut and not self._prefix:  # a window with no text: a decoder's Strip would eat the next space
            self._ids, self._prefix = list(context), self._decode(context)
        self._read = len(self._ids)
        self._prev = 0
        self._open = False  # the last id not skipped is a byte token: the run may still change
        for i in reversed(context):
            if i not in self._skipped:
                self._open = i in self._byte_ids
                break

    def _context_cut(self, context: list[int]) -> int:
        """Where a long context may be cut without changing the text after it: past an id that
        closes any run of byte tokens and whose own text ends in a whole character (0: no cut)."""
        n = len(context)
        if n <= 2 * self._CONTEXT_IDS:
            return 0
        for j in range(n - self._CONTEXT_IDS, max(n - 4 * self._CONTEXT_IDS, 0), -1):
            i = context[j - 1]
            if i in self._byte_ids:
                continue
            text = self._decode([i])
            if text and not text.endswith("\ufffd"):
                return j
        return 0

    def push(self, token_id: int) -> str:
        """Adds one generated id; returns the text it completes (``""`` while it is held back).

        Raises:
            TypeError: not an int. ValueError: outside the vocabulary.
        """
        (token_id,) = self._tokenizer._check_ids([token_id], "token_id")
        self._ids.append(token_id)
        if token_id not in self._skipped:
            self._open = token_id in self._byte_ids
        if self._open:
            return ""
        text = self._decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        piece = text[_common_prefix(self._prefix, text):]
        if not piece:
            return ""
        # Keep the last piece in front of the new ids: its ids are settled (it ended in a whole
        # character, past any run of byte tokens), and a decoder's leading-space Strip sees text.
        read, cut = len(self._ids), self._prev
        prefix = self._decode(self._ids[cut:]) if cut else ""
        if prefix:
            self._ids = self._ids[cut:]
            self._prefix, self._prev, self._read = prefix, self._read - cut, read - cut
        else:
            self._prefix, self._prev, self._read = text, self._read, read
        return piece

    def finish(self) -> str:
        """Text of the ids still held back (U+FFFD for an incomplete character); resets the stream
        (to no context)."""
        text = self._decode(self._ids) if len(self._ids) > self._read else self._prefix
        piece = text[_common_prefix(self._prefix, text):]
        self._start([])
        return piece


# ---------------------------------------------------------------------------- long texts
# The tokenizers package tokenizes a whole text before it truncates it: a text of 20 MB costs
# gigabytes (an Encoding of every token, with its offsets) for the 256 tokens kept.
# Tokenizer.encode, encode_batch, tokenize (and SentenceEncoder.encode) give such a text to the
# backend as a prefix cut at a space, when that provably yields the same tokens (see
# _same_tokens_prefix); the ids, and so the embeddings, are bitwise the same.

#: A text longer than this many characters per token kept (``max_length``) is first tried as a
#: prefix of that length; each further try is ``_PREFIX_GROWTH`` times longer.
_PREFIX_CHARS_PER_TOKEN = 16
_PREFIX_GROWTH = 8
#: Only a text of this many first windows (``_PREFIX_CHARS_PER_TOKEN * max_length`` characters) or
#: more is cut: the check tokenizes the prefix once and the call then tokenizes it again, twice a
#: window's work, which only a text of several windows costs more than (MiniLM's tokenizer, one
#: thread: a text of 4,356 characters took 1.4 ms whole and 3.1 ms cut, one of 30,000 characters
#: 10.2 ms whole and 3.0 ms cut).
_CUT_FROM_WINDOWS = 4
# Pipeline parts that act on each character (or run of combining marks) alone, never across a
# space: what a normalizer may be made of for the prefix to tokenize as the text does.
_LOCAL_NORMALIZERS = {"BertNormalizer", "Lowercase", "StripAccents", "NFD", "NFKD", "NFC", "NFKC"}
# Pre-tokenizers that split at every space (one of them must be there) and ones that only split
# further inside the pieces (never joining across a split).
_SPACE_SPLITTERS = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}
_FURTHER_SPLITTERS = {"Punctuation", "Digits"}


def _component(part) -> dict | None:
    """A ``tokenizers`` normalizer's or pre-tokenizer's settings (its JSON), or None when it cannot
    be serialized (one written in Python)."""
    try:
        return json.loads(part.__getstate__())
    except Exception:  # noqa: BLE001 - a custom component: whatever it raises, it is not one we know
        return None


def _splits_at_spaces(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` tokenizes what comes before a space independently of what follows it,
    so that ``text[:c + 1]`` (``text[c] == " "``) gives the tokens of ``text`` that come from
    ``text[:c]``, in order, and only those:

    * the normalizer (if any) is made of :data:`_LOCAL_NORMALIZERS` (BERT's: cleaning, CJK
      characters spaced out, accents stripped through NFD, lowercase): each maps a character, or a
      character and the combining marks after it, and a space is left as it is and never combines
      with a neighbour (U+0020 is in no canonical composition, and the normal forms reorder only
      combining marks, which never move across it);
    * the pre-tokenizer splits at every space (BERT's, ``Whitespace``, ``WhitespaceSplit``, alone
      or in a sequence with ``Punctuation`` and ``Digits``, which only split further): no word
      spans the cut, so BERT's rule for words longer than ``max_input_chars_per_word`` (one
      ``[UNK]``) sees the same words;
    * the model tokenizes each word alone, deterministically (``WordPiece``, ``WordLevel``; not a
      BPE with dropout);
    * no added token holds whitespace (even after NFKC), so none matches across the cut;
    * truncation keeps the first tokens (``direction`` right).

    ``do_lower_case`` is such a part: the ``Lowercase()`` it prepends to the normalizer (as
    sentence-transformers 6 does) maps each character alone (every ``Σ`` to ``σ``, unlike
    ``str.lower()``'s word-final ``ς``).
    """
    from tokenizers import models

    backend = tokenizer._tok  # read only: not handed out (tokenizer._BackendWatch)
    truncation = backend.truncation
    if not truncation or str(truncation.get("direction", "right")).lower() != "right":
        return False
    if not isinstance(backend.model, (models.WordPiece, models.WordLevel)):
        return False
    if backend.normalizer is not None:
        norm = _component(backend.normalizer)
        if norm is None:
            return False
        parts = norm.get("normalizers", []) if norm.get("type") == "Sequence" else [norm]
        if not all(part.get("type") in _LOCAL_NORMALIZERS for part in parts):
            return False
    if backend.pre_tokenizer is None:
        return False
    pre = _component(backend.pre_tokenizer)
    if pre is None:
        return False
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = {part.get("type") for part in parts}
    if not (kinds & _SPACE_SPLITTERS and kinds <= _SPACE_SPLITTERS | _FURTHER_SPLITTERS):
        return False
    for token in backend.get_added_tokens_decoder().values():
        if any(ch.isspace() for ch in token.content + unicodedata.normalize("NFKC", token.content)):
            return False
    return True


def _same_tokens_prefix(tokenizer: Tokenizer, text: str, add_special_tokens: bool = True) -> str:
    """``text``, or a prefix of it that ``tokenizer`` turns into the same ids, type ids and mask
    (its ``max_length`` tokens, special tokens included, or none without ``add_special_tokens``),
    for a text much longer than could matter.

    The prefix is ``text[:c + 1]`` for a space ``text[c]``, the last one within the first
    ``_PREFIX_CHARS_PER_TOKEN * max_length`` characters (then 8 times that, and so on). With a
    tokenizer that splits there (:func:`_splits_at_spaces`), its tokens are the text's first
    tokens, those of the words before the cut. It is used only when they are more than the
    tokenizer keeps (it reports tokens cut off: ``overflowing``): the kept ones are then the
    text's. Otherwise (a text with no space early enough, words that are mostly whitespace, an
    unknown pipeline) the whole text is tokenized, as before.
    """
    backend = tokenizer._tok  # read only
    window = _PREFIX_CHARS_PER_TOKEN * tokenizer.max_length
    while window < len(text):
        cut = text.rfind(" ", 0, window)
        if cut > 0:
            prefix = text[:cut + 1]
            # (do_lower_case's Lowercase() is the backend's normalizer's)
            enc = backend.encode(prefix, add_special_tokens=add_special_tokens)
            if enc.overflowing:
                return prefix
        window *= _PREFIX_GROWTH
    return text


def _texts_to_tokenize(tokenizer: Tokenizer, texts: list[str], add_special_tokens: bool = True) -> list[str]:
    """``texts`` as ``tokenizer`` gives them to its backend (:meth:`Tokenizer.encode`,
    :meth:`~Tokenizer.encode_batch`, :meth:`~Tokenizer.tokenize`; :meth:`SentenceEncoder.encode`
    before its batches): a text longer than ``_CUT_FROM_WINDOWS * _PREFIX_CHARS_PER_TOKEN``
    characters per token kept is replaced by :func:`_same_tokens_prefix`'s prefix when the tokenizer allows it
    (:func:`_splits_at_spaces`). The tokens are the same; only the memory and time of tokenizing
    what truncation drops are saved. ``texts`` itself when no text is cut."""
    if tokenizer.max_length is None:
        return texts
    longest = _CUT_FROM_WINDOWS * _PREFIX_CHARS_PER_TOKEN * tokenizer.max_length
    if all(len(t) <= longest for t in texts) or not _splits_at_spaces(tokenizer):
        return texts
    return [t if len(t) <= longest else _same_tokens_prefix(tokenizer, t, add_special_tokens) for t in texts]


#: Bytes an id takes through :meth:`Tokenizer.decode` of an array: its int64 copy (8), the lists
#: :meth:`Tokenizer._check_ids` makes (an 8-byte pointer each, and a 32-byte int object for ids
#: above 256) and the backend's own; measured as the peak's growth, 105 bytes an id.
_BYTES_PER_LISTED_ID = 112


def _check_id_count(count: int, name: str) -> None:
    """Raises ValueError naming ``name`` when ``count`` ids could not be listed in this machine's
    memory (``_BYTES_PER_LISTED_ID`` bytes an id): a broadcast array of 2**33 ids is refused
    here, not by a bare MemoryError from ``tolist()``."""
    limit = physical_memory_bytes()
    if count * _BYTES_PER_LISTED_ID > limit:
        raise ValueError(f"{name}: expected at most {limit // _BYTES_PER_LISTED_ID} token ids (their lists take "
                         f"{_BYTES_PER_LISTED_ID} bytes an id; this machine has {limit} bytes), got {count}")


def _check_array_ids(arr: np.ndarray, limit: int, name: str) -> None:
    """ValueError naming ``name`` for the first id of ``arr`` (integers, 0-D or 1-D) outside the
    vocabulary ``[0, limit)``, the error :meth:`Tokenizer._check_ids`'s loop gives, found with numpy
    before ``arr`` is listed (a list takes ``_BYTES_PER_LISTED_ID`` bytes an id): a broadcast view
    (stride 0) has only the one value it holds looked at."""
    held = arr[:1] if arr.ndim == 1 and arr.strides[0] == 0 else arr
    if held.size == 0 or (held.min() >= 0 and held.max() < limit):  # two reductions, no temporary array
        return
    flat = held.reshape(-1)
    first = flat[np.flatnonzero((flat < 0) | (flat >= limit))[0]]
    raise ValueError(f"{name}: token id {int(first)} is outside the vocabulary [0, {limit})")


def _check_range_ids(r: range, limit: int, name: str) -> None:
    """:func:`_check_array_ids` for a ``range``, from its ends and step: the first id outside
    ``[0, limit)`` in its order (the error its listing would reach), found without listing it."""
    if _range_length(r) == 0:
        return
    if not 0 <= r.start < limit:
        first = r.start
    elif r.step > 0 and r[-1] >= limit:
        first = r[-(-(limit - r.start) // r.step)]  # the first index i with start + i·step >= limit
    elif r.step < 0 and r[-1] < 0:
        first = r[r.start // -r.step + 1]           # the first index i with start + i·step < 0
    else:
        return
    raise ValueError(f"{name}: token id {first} is outside the vocabulary [0, {limit})")


def _range_length(r: range) -> int:
    """``len(r)``, also for a range longer than ``sys.maxsize`` (where ``len`` raises OverflowError)."""
    sign = 1 if r.step > 0 else -1
    return max(0, (r.stop - r.start + r.step - sign) // r.step)


def _byte_fallback_ids(backend) -> frozenset[int]:
    """The ids of the ``<0xNN>`` tokens of a byte-fallback vocabulary whose decoder turns them into
    bytes (SentencePiece's, Llama 2's ``ByteFallback``); none for any other tokenizer."""
    probe = backend.token_to_id("<0x41>")
    if probe is None or backend.decode([probe], skip_special_tokens=False) != "A":
        return frozenset()
    ids = (backend.token_to_id(f"<0x{b:02X}>") for b in range(256))
    return frozenset(i for i in ids if i is not None)


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    return len(os.path.commonprefix([a, b]))


# ------------------------------------------------------------------------------------------------
# Hugging Face directories
# ------------------------------------------------------------------------------------------------
def _read_json_object(path: Path) -> dict:
    """The JSON object in ``path`` ({} when there is no such file); ValueError naming the file when
    it is not valid UTF-8 JSON (or nested too deeply to parse) or not an object."""
    if not path.is_file():
        return {}
    value = read_json_file(path)
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got a JSON {type(value).__name__}")
    return value


def _token_content(value) -> str | None:
    """A special token in tokenizer_config.json: a str or an AddedToken dict ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _special_tokens_of_config(cfg: dict, backend, defaults: dict | None = None) -> dict:
    """The special tokens of ``tokenizer_config.json`` (the object ``cfg``) that are in ``backend``'s
    vocabulary, as :class:`Tokenizer`'s keyword arguments, read as transformers 5 reads them:

    * each of ``_NAMED_SPECIAL_TOKENS`` (None when not in the vocabulary; a key absent takes the
      tokenizer class's default from ``defaults``, ``_CLASS_SPECIAL_TOKENS``: GPT-2's folder names
      none and has ``<|endoftext|>`` as its bos, eos and unk there; a key set to null stays None);
    * ``extra_special_tokens``: first the model-specific named tokens (any other ``*_token`` key,
      such as a multimodal model's ``image_token``, then the values of an ``extra_special_tokens``
      dict), then the list ``extra_special_tokens``, or, without one, transformers 4's
      ``additional_special_tokens``.

    A token is a str or an AddedToken dict ``{"content": ...}``; a value of another kind counts as
    absent. Tokens outside the vocabulary are left out (transformers would add them to it).
    """
    def known(token: str | None) -> str | None:
        """``token`` if ``backend``'s vocabulary holds it, else None."""
        return token if token is not None and backend.token_to_id(token) is not None else None

    defaults = defaults or {}
    tokens = {name: known(_token_content(cfg[name] if name in cfg else defaults.get(name)))
              for name in _NAMED_SPECIAL_TOKENS}
    extra = [value for key, value in cfg.items() if key.endswith("_token") and key not in _NAMED_SPECIAL_TOKENS]
    listed = cfg.get("extra_special_tokens")
    if isinstance(listed, dict):  # transformers 5's model-specific named tokens
        extra += list(listed.values())
    if not isinstance(listed, list):
        listed = cfg.get("additional_special_tokens")
    if isinstance(listed, list):
        extra += listed
    extra = [known(_token_content(t)) for t in extra]
    tokens["extra_special_tokens"] = [t for t in extra if t is not None]
    return tokens


def _chat_template_of_dir(model_dir: Path, tokenizer_config: dict) -> str | dict | None:
    """A model directory's chat template(s), read as transformers reads them: the files
    ``chat_template.jinja`` (the ``"default"``) and ``additional_chat_templates/<name>.jinja`` first,
    else ``tokenizer_config.json``'s ``chat_template`` (a str, or named templates
    ``[{"name": ..., "template": ...}, ...]``). Named templates come back as a dict ``{name: template}``
    (a lone ``chat_template.jinja`` as its str).

    Raises:
        ValueError: a ``chat_template`` in ``tokenizer_config.json`` that is not a str or such a list
            (naming the file and the entry); a ``.jinja`` file that is not UTF-8 text (naming it).
    """
    templates = {}
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        templates["default"] = _read_template(jinja)
    extra = model_dir / "additional_chat_templates"
    if extra.is_dir():
        for path in sorted(extra.glob("*.jinja")):
            templates[path.name.removesuffix(".jinja")] = _read_template(path)
    if templates:
        return templates["default"] if list(templates) == ["default"] else templates
    try:
        return _check_chat_templates(tokenizer_config.get("chat_template"), "chat_template")
    except TypeError as e:
        raise ValueError(f"{model_dir / 'tokenizer_config.json'}: {e}") from None


def _check_chat_templates(value, name: str) -> str | dict | None:
    """``value`` as a chat template: a str, None, or named templates as a new dict ``{name:
    template}`` (from a dict, or from a list of ``{"name": str, "template": str}``, as
    ``tokenizer_config.json`` stores them; a later entry of a name wins, as in transformers).

    Raises:
        TypeError: anything else, naming ``name`` (and the entry).
    """
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        pairs = []
        for i, entry in enumerate(value):
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("template"), str)):
                raise TypeError(f"{name}[{i}]: expected a named template {{'name': str, 'template': str}}, got "
                                f"{type(entry).__name__} {_clip(entry)}")
            pairs.append((entry["name"], entry["template"]))
        return dict(pairs)
    if isinstance(value, dict):
        for key, template in value.items():
            if not isinstance(key, str) or not isinstance(template, str):
                raise TypeError(f"{name}: expected named templates as a dict of str to str, got the entry "
                                f"{_clip(key)}: {type(template).__name__}")
        return dict(value)
    raise TypeError(f"{name}: expected a str (a Jinja2 template), named templates (a dict or a list of "
                    f"{{'name', 'template'}} dicts) or None, got {type(value).__name__}")


def _read_template(path: Path) -> str:
    """The text of a chat template file; ValueError naming the file when it is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: a chat template must be UTF-8 text; byte {e.object[e.start]:#04x} at offset "
                         f"{e.start} is not valid UTF-8") from None


def _config_says_causal(model_dir: Path) -> bool | None:
    """What ``config.json`` says of the model: True for a causal LM (an ``architectures`` entry
    ending in ``ForCausalLM`` / ``LMHeadModel``, or a ``model_type`` of ``_CAUSAL_MODEL_TYPES``),
    False for another model (other architectures, or another ``model_type``), None when it names
    none (no file; ``architectures`` and ``model_type`` absent, null or empty).

    Raises:
        ValueError: naming ``config.json``: ``architectures`` not a list of strings (a single string
            included: transformers expects a list), or ``model_type`` not a string.
    """
    path = model_dir / "config.json"
    config = _read_json_object(path)
    architectures = config.get("architectures")
    if architectures is None:
        architectures = []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ValueError(f"{path}: architectures: expected a list of class names (strings), got "
                         f"{type(architectures).__name__} {_clip(architectures)}")
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        return True
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ValueError(f"{path}: model_type: expected a string, got {type(model_type).__name__} {_clip(model_type)}")
    if model_type in _CAUSAL_MODEL_TYPES:
        return True
    return False if architectures or model_type else None


def _shows_causal_tokenizer(model_dir: Path, tokenizer_config: dict) -> bool:
    """Whether a tokenizer folder shows a causal LM's tokenizer: a chat template (a
    ``chat_template.jinja``, an ``additional_chat_templates/*.jinja`` or ``tokenizer_config.json``'s
    ``chat_template``), or a ``tokenizer_config.json`` (the object ``tokenizer_config``) with
    ``"padding_side": "left"``, ``"add_bos_token": true`` or ``"add_eos_token": true``, or a
    ``tokenizer_class`` of ``_CAUSAL_TOKENIZER_CLASSES`` (with or without ``Fast``)."""
    if (model_dir / "chat_template.jinja").is_file() or tokenizer_config.get("chat_template") is not None:
        return True
    if any((model_dir / "additional_chat_templates").glob("*.jinja")):
        return True
    if tokenizer_config.get("padding_side") == "left":
        return True
    if tokenizer_config.get("add_bos_token") is True or tokenizer_config.get("add_eos_token") is True:
        return True
    tokenizer_class = tokenizer_config.get("tokenizer_class")
    return isinstance(tokenizer_class, str) and tokenizer_class.removesuffix("Fast") in _CAUSAL_TOKENIZER_CLASSES


def _directory_is_causal(model_dir: Path, tokenizer_config: dict, max_length: int | None) -> bool:
    """Whether a model directory's tokenizer is a causal LM's, by the first rule of
    :meth:`Tokenizer.from_pretrained` that applies: what ``config.json`` says; a sentence-transformers
    folder is an encoder's; a tokenizer folder that shows a causal LM's tokenizer is one; else an
    encoder's when a length to truncate to is known (``max_length``, the caller's), a causal LM's
    (which cuts nothing) when none is.

    Raises:
        ValueError: as :func:`_config_says_causal`; a ``config.json`` that is not a JSON object.
    """
    said = _config_says_causal(model_dir)
    if said is not None:
        return said
    if (model_dir / "sentence_bert_config.json").is_file() or (model_dir / "modules.json").is_file():
        return False
    if _shows_causal_tokenizer(model_dir, tokenizer_config):
        return True
    return max_length is None and _known_max_length(model_dir, tokenizer_config) is None


def _check_gguf_magic(path: Path, name_or_path, argument: str = "name_or_path") -> None:
    """ValueError naming ``argument`` (the caller's name for ``name_or_path``: the CLI's ``model``)
    when the file ``path`` does not start with GGUF's magic: the only file
    :meth:`Tokenizer.from_pretrained` (and ``LlamaForCausalLM.from_pretrained``) reads is a GGUF
    checkpoint."""
    from .gguf_file import _GGUF_MAGIC

    try:
        with open(path, "rb") as f:
            head = f.read(len(_GGUF_MAGIC))
    except OSError as e:
        raise ValueError(f"{argument}: cannot read {path} ({type(e).__name__}: {e})") from None
    if head != _GGUF_MAGIC:
        hint = " (for a tokenizer.json, pass the directory that holds it)" if path.suffix == ".json" else ""
        raise ValueError(f"{argument}: expected a model directory, a GGUF file or an embedded model name; the file "
                         f"{str(name_or_path)!r} is not a GGUF file (it starts with {head!r}, not {_GGUF_MAGIC!r}): "
                         f"a file path must be a GGUF checkpoint{hint}")


#: Keys of sentence_bert_config.json's ``processor_kwargs`` / ``model_kwargs`` / ``config_kwargs``
#: (and their older names) that sentence-transformers 6 overwrites with its own arguments before
#: using them (``_build_init_kwargs``' hub kwargs; ``load_config`` drops ``trust_remote_code``):
#: whatever the file says there changes nothing.
_ST_OVERWRITTEN_KWARGS = frozenset({"subfolder", "token", "cache_dir", "revision", "local_files_only",
                                    "trust_remote_code"})
#: The keys of ``processor_kwargs`` that :meth:`Tokenizer.from_pretrained` applies.
_APPLIED_PROCESSOR_KWARGS = ("model_max_length", "do_lower_case", "truncation_side")


def _sentence_bert_kwargs(model_dir: Path, new_name: str, old_name: str) -> tuple[Path, str, dict]:
    """``(path, key, kwargs)``: sentence_bert_config.json's ``new_name`` object (``processor_kwargs``,
    ``model_kwargs``, ``config_kwargs``) or, when the file has it, its older name ``old_name``
    (``tokenizer_args``, ``model_args``, ``config_args``), which replaces it as sentence-transformers
    6 reads the file; ``{}`` when neither is there; the keys of ``_ST_OVERWRITTEN_KWARGS`` left out.

    Raises:
        ValueError: naming the file and the key: a value that is not a JSON object.
    """
    path = model_dir / "sentence_bert_config.json"
    sbert = _read_json_object(path)
    key = old_name if old_name in sbert else new_name
    kwargs = sbert.get(key, {})
    if not isinstance(kwargs, dict):
        raise ValueError(f"{path}: {key}: expected a JSON object, got {type(kwargs).__name__} {_clip(kwargs)}")
    return path, key, {k: v for k, v in kwargs.items() if k not in _ST_OVERWRITTEN_KWARGS}


def _processor_kwargs(model_dir: Path) -> dict:
    """sentence_bert_config.json's ``processor_kwargs`` (or ``tokenizer_args``), which
    sentence-transformers 6 passes to transformers' tokenizer, where they win over
    ``tokenizer_config.json``'s keys: those of ``_APPLIED_PROCESSOR_KWARGS``, checked (the keys it
    overwrites itself are left out, see :func:`_sentence_bert_kwargs`).

    Raises:
        ValueError: naming the file and the key: not a JSON object; another key; a
            ``model_max_length`` that is not a positive int, a ``do_lower_case`` that is not a
            bool, a ``truncation_side`` that is not ``"right"`` or ``"left"``.
    """
    path, key, kwargs = _sentence_bert_kwargs(model_dir, "processor_kwargs", "tokenizer_args")
    for name, value in kwargs.items():
        if name not in _APPLIED_PROCESSOR_KWARGS:
            raise ValueError(f"{path}: {key}: {name}: not supported (sentence-transformers passes it to "
                             f"transformers' tokenizer; only {', '.join(_APPLIED_PROCESSOR_KWARGS)} are applied here)")
        if name == "model_max_length" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{path}: {key}: model_max_length: expected a positive int, got {_clip(value)}")
        if name == "do_lower_case" and not isinstance(value, bool):
            raise ValueError(f"{path}: {key}: do_lower_case: expected a bool, got {type(value).__name__} "
                             f"{_clip(value)}")
        if name == "truncation_side" and value not in ("right", "left"):
            raise ValueError(f"{path}: {key}: truncation_side: expected 'right' or 'left', got {_clip(value)}")
    return kwargs


def _check_model_kwargs(model_dir: Path) -> None:
    """Refuses sentence_bert_config.json's ``model_kwargs`` / ``config_kwargs`` (or ``model_args`` /
    ``config_args``): sentence-transformers 6 passes them to transformers' model and config
    (``torch_dtype``, ``attn_implementation``, config overrides, ...), which are not applied here. An
    empty object, or one of only the keys it overwrites itself (``_ST_OVERWRITTEN_KWARGS``), is
    accepted.

    Raises:
        ValueError: naming the file and the key: not a JSON object, or holding another key.
    """
    for new_name, old_name in (("model_kwargs", "model_args"), ("config_kwargs", "config_args")):
        path, key, kwargs = _sentence_bert_kwargs(model_dir, new_name, old_name)
        if kwargs:
            raise ValueError(f"{path}: {key}: {next(iter(kwargs))}: not supported (sentence-transformers passes "
                             f"{key} to transformers' model or config; they are not applied here)")


#: What ``processing_kwargs``' ``"text"`` / ``"common"`` may set (sentence-transformers 6 passes them
#: to the tokenizer's call for text inputs), and the values applied: ``max_length`` (checked apart),
#: a ``truncation`` that truncates a single text, a ``padding`` that pads (padding is masked out:
#: where it goes changes no embedding).
_APPLIED_PROCESSING_KWARGS = {"truncation": (True, "longest_first", "only_first"),
                              "padding": (True, "longest", "max_length")}


def _processing_max_length(model_dir: Path) -> int | None:
    """The length that sentence_bert_config.json's ``processing_kwargs`` truncates texts to, or
    None: sentence-transformers 6 calls the tokenizer with ``{"padding": True, "truncation":
    "longest_first", **processing_kwargs["text"], **processing_kwargs["common"]}`` (``common``
    wins), so their ``max_length`` wins over the tokenizer's ``model_max_length``. The file's
    ``query_length``, ``document_length`` and ``query_expansion`` (used by its ``encode_query`` /
    ``encode_document``) must be absent or null.

    Raises:
        ValueError: naming the file and the key: ``processing_kwargs`` not a JSON object or null;
            a ``"text"`` / ``"common"`` that is not an object, or that holds a key other than
            ``max_length`` (a positive int of at most ``config.json``'s
            ``max_position_embeddings``), ``truncation`` (true, ``"longest_first"`` or
            ``"only_first"``) and ``padding`` (true, ``"longest"`` or ``"max_length"``); any other
            key that is not empty (``"chat_template"``, ``"image"``, ...); a ``query_length``,
            ``document_length`` or ``query_expansion`` that is not null.
    """
    path = model_dir / "sentence_bert_config.json"
    sbert = _read_json_object(path)
    for key in ("query_length", "document_length", "query_expansion"):
        if sbert.get(key) is not None:
            raise ValueError(f"{path}: {key}: not supported (sentence-transformers applies it in encode_query / "
                             f"encode_document, not here); expected null or absent, got {_clip(sbert[key])}")
    kwargs = sbert.get("processing_kwargs")
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict):
        raise ValueError(f"{path}: processing_kwargs: expected a JSON object, got {type(kwargs).__name__} "
                         f"{_clip(kwargs)}")
    config = _read_json_object(model_dir / "config.json")
    positions = config.get("max_position_embeddings", config.get("n_positions"))
    positions = positions if isinstance(positions, int) and not isinstance(positions, bool) and positions > 0 else None
    length = None
    for group in ("text", "common"):  # in this order: common's win
        values = kwargs.get(group)
        if values is None:
            continue
        where = f"{path}: processing_kwargs: {group}"
        if not isinstance(values, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(values).__name__} {_clip(values)}")
        for name, value in values.items():
            if name == "max_length":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{where}: max_length: expected a positive int, got {_clip(value)}")
                if positions is not None and value > positions:
                    raise ValueError(f"{where}: max_length: expected at most {positions} (config.json's "
                                     f"max_position_embeddings), got {value}")
                length = value
            elif name in _APPLIED_PROCESSING_KWARGS:
                allowed = _APPLIED_PROCESSING_KWARGS[name]
                if not any(value is a if isinstance(a, bool) else (isinstance(value, str) and value == a)
                           for a in allowed):
                    raise ValueError(f"{where}: {name}: not supported: expected one of "
                                     f"{', '.join(map(repr, allowed))} (the values that change no embedding here), "
                                     f"got {_clip(value)}")
            else:
                raise ValueError(f"{where}: {name}: not supported (sentence-transformers passes it to the "
                                 f"tokenizer; only max_length, truncation and padding are applied here)")
    for group, values in kwargs.items():
        if group not in ("text", "common") and values not in (None, {}):
            raise ValueError(f"{path}: processing_kwargs: {group}: not supported (only \"text\" and \"common\" "
                             f"are applied here, to text inputs); expected an empty object, got {_clip(values)}")
    return length


def _check_sentence_bert_config(model_dir: Path) -> None:
    """Checks what :meth:`Tokenizer.from_pretrained` reads from a model directory's
    ``sentence_bert_config.json`` (and :func:`_check_model_kwargs`' keys), before any model weight
    is read: ``model_kwargs`` / ``config_kwargs``, ``do_lower_case``, ``processor_kwargs``,
    ``processing_kwargs`` and the truncation length.

    Raises:
        ValueError: as :func:`_check_model_kwargs`, :func:`_do_lower_case`,
            :func:`_processor_kwargs`, :func:`_processing_max_length` and :func:`_known_max_length`.
    """
    _check_model_kwargs(model_dir)
    _do_lower_case(model_dir)
    cfg = {**_read_json_object(model_dir / "tokenizer_config.json"), **_processor_kwargs(model_dir)}
    _processing_max_length(model_dir)
    _known_max_length(model_dir, cfg)


def _do_lower_case(model_dir: Path) -> bool:
    """``sentence_bert_config.json``'s ``do_lower_case`` (False when absent): sentence-transformers
    lowercases every text before tokenizing it when it is true.

    Raises:
        ValueError: naming the file: a value that is not a JSON bool.
    """
    path = model_dir / "sentence_bert_config.json"
    value = _read_json_object(path).get("do_lower_case", False)
    if not isinstance(value, bool):
        raise ValueError(f"{path}: do_lower_case: expected a bool, got {type(value).__name__} {_clip(value)}")
    return value


def _config_choice(tokenizer_config: dict, key: str, path: Path) -> str | None:
    """``tokenizer_config.json``'s ``truncation_side`` / ``padding_side`` (the ``key``): ``"right"``,
    ``"left"``, or None when absent or null.

    Raises:
        ValueError: naming the file (``path``) and the key: any other value.
    """
    value = tokenizer_config.get(key)
    if value is not None and value not in ("right", "left"):
        raise ValueError(f"{path}: {key}: expected 'right' or 'left', got {type(value).__name__} {_clip(value)}")
    return value


_BPE_CLEAN_UP_ANYWAY = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"


def _clean_up_of_config(tokenizer_config: dict, backend, path: Path) -> tuple[bool, bool]:
    """Whether :meth:`Tokenizer.decode` cleans up spaces, as transformers decides: when
    ``tokenizer_config.json``'s ``clean_up_tokenization_spaces`` is true, unless ``backend``'s
    model is a BPE (where the clean-up would remove real spaces) and
    ``clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output`` is not true.

    Returns ``(clean_up, bpe_anyway)``: that decision and the second key's value (which
    :meth:`Tokenizer.decode` tests again when a BPE's clean-up is asked for in the call). A key
    absent or null (JSON's null, which transformers reads as false) is false.

    Raises:
        ValueError: naming the file (``path``) and the key: a value that is not a JSON bool or null.
    """
    from tokenizers import models

    flags = {}
    for key in ("clean_up_tokenization_spaces", _BPE_CLEAN_UP_ANYWAY):
        value = tokenizer_config.get(key)
        value = False if value is None else value
        if not isinstance(value, bool):
            raise ValueError(f"{path}: {key}: expected a bool, got {type(value).__name__} {_clip(value)}")
        flags[key] = value
    if isinstance(backend.model, models.BPE) and not flags[_BPE_CLEAN_UP_ANYWAY]:
        return False, False
    return flags["clean_up_tokenization_spaces"], flags[_BPE_CLEAN_UP_ANYWAY]


def _declared_class(model_dir: Path, tokenizer_config: dict) -> str | None:
    """transformers' tokenizer class for this folder without its ``Fast`` suffix, decided as
    transformers 5's ``AutoTokenizer.from_pretrained`` decides it (``tokenization_auto.py``): None
    (a generic ``TokenizersBackend``, which keeps ``tokenizer.json``'s pipeline) when
    ``config.json``'s ``model_type`` is registered to a generic class
    (``_GENERIC_CLASS_MODEL_TYPES``: Mistral's, Mixtral's, Phi-3's, ... whatever
    ``tokenizer_class`` says); else the class registered to the model type when transformers
    takes it over the folder's (``_REGISTERED_CLASS_WINS``: Qwen2's, ...); else the
    ``tokenizer_class`` of ``tokenizer_config.json``, or with none there (absent or null) that of
    ``config.json`` (GPT-J's and other older checkpoints name it there), as AutoTokenizer takes
    ``tokenizer_config_class or config.tokenizer_class``; else the one ``_CLASS_OF_MODEL_TYPE``
    gives the model type. None when none of these says (or ``tokenizer_class`` is not a str).

    Raises:
        ValueError: a ``config.json`` that is not a JSON object.
    """
    config = _read_json_object(model_dir / "config.json")
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        model_type = None
    elif model_type in _GENERIC_CLASS_MODEL_TYPES:
        return None
    name = tokenizer_config.get("tokenizer_class")
    if name is None:
        name = config.get("tokenizer_class")
    if isinstance(name, str):
        return _REGISTERED_CLASS_WINS.get(model_type, name.removesuffix("Fast"))
    if name is not None:
        return None
    return _CLASS_OF_MODEL_TYPE.get(model_type)


def _register_special_tokens(backend, tokens: dict, tokenizer_config: dict, named_become_special: bool = False) -> None:
    """Makes each special token of ``tokens`` (:func:`_special_tokens_of_config`'s, all in the
    vocabulary) a special added token of ``backend`` where ``tokenizer.json`` lists it as an
    ordinary vocabulary entry, as transformers registers every named special token: it is then
    matched whole in a text (``"Hi</s>"`` ends with the eos id, not the letters of ``</s>``) and
    left out by ``decode(skip_special_tokens=True)``. Its id stays the vocabulary's. A token that
    ``tokenizer_config.json`` gives as an AddedToken dict keeps its ``lstrip``, ``rstrip`` and
    ``single_word`` (``normalized`` false unless it says true).

    With ``named_become_special`` (a folder read by ``from_pretrained``), a named token (``bos_token``,
    ``eos_token``, ...) that ``backend`` already holds as a non-special added token is made special,
    its other flags kept, as transformers 5's ``from_pretrained`` marks it; the constructor, as
    ``PreTrainedTokenizerFast(tokenizer_object=...)``, leaves such a token as it is."""
    from tokenizers import AddedToken

    flags = {}  # content -> the AddedToken fields tokenizer_config.json gives it
    for value in tokenizer_config.values():
        for item in (value if isinstance(value, list) else [value]):
            if isinstance(item, dict) and isinstance(item.get("content"), str):
                flags.setdefault(item["content"], {k: item[k] for k in ("lstrip", "rstrip", "single_word", "normalized")
                                                   if isinstance(item.get(k), bool)})
    added = {t.content for t in backend.get_added_tokens_decoder().values()}
    named = [tokens[name] for name in _NAMED_SPECIAL_TOKENS if tokens.get(name) is not None]
    missing = [t for t in dict.fromkeys(named + list(tokens.get("extra_special_tokens", ()))) if t not in added]
    if missing:
        backend.add_special_tokens([AddedToken(t, **{"normalized": False, **flags.get(t, {}), "special": True})
                                    for t in missing])
    if named_become_special:
        plain = {t.content: t for t in backend.get_added_tokens_decoder().values() if not t.special}
        again = [plain[t] for t in dict.fromkeys(named) if t in plain]
        if again:
            backend.add_special_tokens([AddedToken(t.content, single_word=t.single_word, lstrip=t.lstrip,
                                                   rstrip=t.rstrip, normalized=t.normalized, special=True)
                                        for t in again])


def _config_bool(tokenizer_config: dict, key: str, path: Path) -> bool:
    """``tokenizer_config.json``'s bool ``key`` (absent or null: False).

    Raises:
        ValueError: naming the file (``path``) and the key: a value that is not a JSON bool or null.
    """
    value = tokenizer_config.get(key)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{path}: {key}: expected a bool, got {type(value).__name__} {_clip(value)}")
    return bool(value)


def _apply_add_prefix_space(backend, tokenizer_config: dict, path: Path, default: bool):
    """``backend`` with ``tokenizer_config.json``'s ``add_prefix_space`` set on its byte-level
    pre-tokenizer(s), as transformers' classes of ``_PREFIX_SPACE_CLASSES`` (GPT-2's, Qwen2's,
    CodeGen's, RoBERTa's, ...) build theirs from it (``" Hello"``'s ids for ``"Hello"`` when true);
    absent or null, the class's ``default`` (false but for Blenderbot's and LayoutLMv3's), whatever
    ``tokenizer.json`` says. ``backend`` itself when it has no ``ByteLevel`` pre-tokenizer.

    Raises:
        ValueError: naming the file (``path``): ``add_prefix_space`` not a bool or null.
    """
    import json

    from tokenizers import Tokenizer as HFTokenizer

    value = tokenizer_config.get("add_prefix_space")
    value = default if value is None else value
    if not isinstance(value, bool):
        raise ValueError(f"{path}: add_prefix_space: expected a bool, got {type(value).__name__} {_clip(value)}")
    spec = json.loads(backend.to_str())

    def set_flag(node) -> None:
        """Sets the flag on every ByteLevel pre-tokenizer under ``node`` (a Sequence's too)."""
        if isinstance(node, dict):
            if node.get("type") == "ByteLevel":
                node["add_prefix_space"] = value
            for child in node.get("pretokenizers", ()):
                set_flag(child)

    if not _has_byte_level(backend):
        return backend
    set_flag(spec.get("pre_tokenizer"))
    return HFTokenizer.from_str(json.dumps(spec))


def _rebuild_sentencepiece(backend, klass: str, tokenizer_config: dict, path: Path, unk_token: str | None):
    """``backend`` (a SentencePiece-style ``tokenizer.json``) rebuilt as transformers 5's ``klass``
    (``LlamaTokenizer``, ``CodeLlamaTokenizer``, ``GemmaTokenizer``) rebuilds it from its vocabulary
    and merges, whatever ``tokenizer.json``'s normalizer, pre-tokenizer and decoder were:

    * the model: the same vocabulary and merges as a BPE with ``byte_fallback`` and ``fuse_unk``, no
      dropout; its unknown token none for Llama's, ``unk_token`` for the others;
    * Llama's: no normalizer; ``Metaspace("▁", split=False)`` prepending ``"▁"`` to the whole text
      (``prepend_scheme="always"``) when ``add_prefix_space`` (default true) and ``legacy`` (default
      false) are true, to the first piece only (``"first"``: not after a special token) when
      ``legacy`` is false, never when ``add_prefix_space`` is false; decoder ``"▁"`` -> ``" "``, byte
      fallback, fuse, and with ``add_prefix_space`` one leading space stripped;
    * CodeLlama's: as Llama's with ``"first"`` (``"never"`` when ``add_prefix_space`` is false), its
      decoder always stripping one leading space;
    * Gemma's: normalizer ``" "`` -> ``"▁"``, pre-tokenizer split after each ``" "``, decoder ``"▁"`` ->
      ``" "``, byte fallback, fuse.

    Its added tokens, truncation, padding and post-processor are kept.

    Raises:
        ValueError: a model that is not a BPE (naming ``tokenizer.json`` beside ``path``:
            transformers would rebuild it as one, which is not reproduced here), or
            ``add_prefix_space`` / ``legacy`` not a bool or null (naming ``path``).
    """
    import json

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, normalizers, pre_tokenizers

    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise ValueError(f"{path.with_name('tokenizer.json')}: a {model.get('type')} model under the folder's "
                         f"tokenizer class {klass!r} (named by tokenizer_config.json, or config.json's "
                         f"tokenizer_class or model_type): transformers 5 rebuilds this class as a byte-fallback BPE "
                         f"from it, which is not reproduced here; expected a BPE model")
    flags = {}
    for key in ("add_prefix_space", "legacy"):
        value = tokenizer_config.get(key)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{path}: {key}: expected a bool or null, got {type(value).__name__} {_clip(value)}")
        flags[key] = value
    prefix = True if flags["add_prefix_space"] is None else flags["add_prefix_space"]
    model.update(dropout=None, continuing_subword_prefix=None, end_of_word_suffix=None, fuse_unk=True,
                 byte_fallback=True, ignore_merges=False, unk_token=None if klass == "LlamaTokenizer" else unk_token)
    tok = HFTokenizer.from_str(json.dumps(spec))
    to_text = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if klass == "GemmaTokenizer":
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
        tok.decoder = decoders.Sequence(to_text)
        return tok
    if klass == "CodeLlamaTokenizer":
        scheme, strip = ("first" if prefix else "never"), True
    else:
        scheme, strip = ("never" if not prefix else "always" if flags["legacy"] else "first"), prefix
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    tok.decoder = decoders.Sequence(to_text + ([decoders.Strip(" ", 1, 0)] if strip else []))
    return tok


def _tokenizer_class(model_dir: Path, tokenizer_config: dict, backend) -> str | None:
    """The class transformers loads a causal LM's folder with (:func:`_declared_class`), but None
    for a SentencePiece-style class (Llama's, CodeLlama's, Gemma's) over a byte-level
    ``tokenizer.json`` (``backend``; Llama-3's and DeepSeek-Coder's folders name
    ``LlamaTokenizerFast``): transformers loads such a folder as a generic ``TokenizersBackend``,
    without that class's defaults.

    Raises:
        ValueError: as :func:`_declared_class`.
    """
    name = _declared_class(model_dir, tokenizer_config)
    if name in _SENTENCEPIECE_CLASSES and _has_byte_level(backend):
        return None
    return name


#: transformers' generic classes (their names less ``Fast``; None: no class, see :func:`_tokenizer_class`),
#: which take a pad token that ``tokenizer_config.json`` does not name from ``tokenizer.json``'s ``padding``.
_GENERIC_CLASSES = frozenset({None, "TokenizersBackend", "PreTrainedTokenizer"})

#: Classes whose pipeline is SentencePiece's (Metaspace, byte fallback): transformers does not take
#: them for a byte-level tokenizer.json.
_SENTENCEPIECE_CLASSES = frozenset({"LlamaTokenizer", "CodeLlamaTokenizer", "GemmaTokenizer"})


def _has_byte_level(backend) -> bool:
    """Whether ``backend``'s pre-tokenizer is a ``ByteLevel`` one (or a Sequence holding one)."""
    import json

    def byte_level(node) -> bool:
        """Whether ``node`` (a pre-tokenizer's JSON) is or holds a ByteLevel."""
        return isinstance(node, dict) and (node.get("type") == "ByteLevel"
                                           or any(byte_level(child) for child in node.get("pretokenizers", ())))

    return byte_level(json.loads(backend.to_str()).get("pre_tokenizer"))


def _apply_bert_normalizer_flags(backend, tokenizer_config: dict, path: Path, klass: str | None) -> None:
    """Gives ``backend`` the normalizer that transformers' BERT tokenizers build (``klass``, the
    folder's class, among ``_BERT_NORMALIZER_CLASSES``): a new ``BertNormalizer`` made from
    ``tokenizer_config.json``'s ``do_lower_case``, ``strip_accents`` and ``tokenize_chinese_chars``,
    with ``clean_text`` true (``FunnelTokenizer``: its ``clean_text``), a key absent taking
    transformers' default (``_BERT_NORMALIZER_DEFAULTS``), whatever ``tokenizer.json``'s normalizer
    is: their ``__init__`` (transformers 5's ``BertTokenizer.__init__``,
    ``models/bert/tokenization_bert.py``) drops it. ``ConvBertTokenizer`` keeps ``tokenizer.json``'s
    normalizer in transformers 5 but still takes the flags as arguments: they are checked, not
    applied. Nothing (the keys not even read) for another class (``PreTrainedTokenizerFast``,
    ``TokenizersBackend``, no class at all): transformers' tokenizers there keep
    ``tokenizer.json``'s normalizer.

    Raises:
        ValueError: naming the file (``path``) and the key: ``do_lower_case``,
            ``tokenize_chinese_chars`` or (Funnel's) ``clean_text`` not a bool, ``strip_accents``
            not a bool or null.
    """
    from tokenizers import normalizers

    if klass not in _BERT_NORMALIZER_CLASSES and klass != "ConvBertTokenizer":
        return
    settings = {"clean_text": True}
    flags = _BERT_NORMALIZER_FLAGS + ((("clean_text", "clean_text"),) if klass == "FunnelTokenizer" else ())
    for key, argument in flags:
        value = tokenizer_config.get(key, _BERT_NORMALIZER_DEFAULTS[key])
        if not (isinstance(value, bool) or (value is None and key == "strip_accents")):
            expected = "a bool or null" if key == "strip_accents" else "a bool"
            raise ValueError(f"{path}: {key}: expected {expected}, got {type(value).__name__} {_clip(value)}")
        settings[argument] = value
    if klass in _BERT_NORMALIZER_CLASSES:
        backend.normalizer = normalizers.BertNormalizer(**settings)


def _default_max_length(model_dir: Path, tokenizer_config: dict) -> int:
    """The encoder tokenizer's truncation length: :func:`_known_max_length`, else 512 (BERT's).

    Raises:
        ValueError: as :func:`_known_max_length`.
    """
    length = _known_max_length(model_dir, tokenizer_config)
    return 512 if length is None else length


def _known_max_length(model_dir: Path, tokenizer_config: dict) -> int | None:
    """The length a model directory gives to truncate to: the first of ``sentence_bert_config.json``'s
    ``processor_kwargs``' (or ``tokenizer_args``') ``model_max_length`` (which wins over
    ``max_seq_length`` in sentence-transformers 6, not capped at the positions), its
    ``max_seq_length``, ``tokenizer_config.json``'s ``model_max_length`` (the object
    ``tokenizer_config``; unless it is transformers' "no limit" placeholder, a huge number; at most
    the positions), ``config.json``'s ``max_position_embeddings`` / ``n_positions``; None when
    none gives one.

    Raises:
        ValueError: naming the file: a JSON file that is not valid, a ``max_seq_length`` or
            ``processor_kwargs`` ``model_max_length`` that is not a positive int, or one longer than
            the model's positions (``max_position_embeddings``); as :func:`_processor_kwargs`.
    """
    sbert = _read_json_object(model_dir / "sentence_bert_config.json")
    config = _read_json_object(model_dir / "config.json")
    positions = config.get("max_position_embeddings", config.get("n_positions"))
    positions = positions if isinstance(positions, int) and not isinstance(positions, bool) and positions > 0 else None
    path, key, _ = _sentence_bert_kwargs(model_dir, "processor_kwargs", "tokenizer_args")
    value = _processor_kwargs(model_dir).get("model_max_length")
    if value is not None:  # sentence-transformers 6 then ignores max_seq_length
        if positions is not None and value > positions:
            raise ValueError(f"{path}: {key}: model_max_length: expected at most {positions} (config.json's "
                             f"max_position_embeddings), got {value}")
        return value
    if "max_seq_length" in sbert:
        value = sbert["max_seq_length"]
        path = model_dir / "sentence_bert_config.json"
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{path}: max_seq_length: expected a positive int, got {value!r}")
        if positions is not None and value > positions:
            raise ValueError(f"{path}: max_seq_length: expected at most {positions} (config.json's "
                             f"max_position_embeddings), got {value}")
        return value
    value = tokenizer_config.get("model_max_length")
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _NO_LENGTH:
        return value if positions is None else min(value, positions)
    return positions


# ------------------------------------------------------------------------------------------------
# GGUF tokenizer metadata -> tokenizers.Tokenizer
# ------------------------------------------------------------------------------------------------
def _gguf_pre_tokenizer(name: str):
    """The pre-tokenizer for ``tokenizer.ggml.pre``, from the ``tokenizers`` package's components.

    GPT-2's split (``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``)
    is ``ByteLevel(use_regex=True)``'s own: it serves "gpt2" and "default" (the name llama.cpp
    gives a file without ``tokenizer.ggml.pre``), as transformers' GGUF converter rebuilds both.
    llama.cpp's own "default" differs: its regexes first split off runs of punctuation
    (``[\\p{P}\\$\\+<=>\\^~\\|]+``), then apply GPT-2's split, then ``\\p{N}+`` and
    ``[0-9][0-9][0-9]`` (digits in groups of three), so a "default" file may tokenize numbers and
    punctuation differently from llama.cpp. llama.cpp's "smollm" (also "starcoder", "refact",
    "codeshell") runs ``\\p{N}`` first, isolating each digit, then GPT-2's split on the rest:
    ``Sequence([Digits(individual_digits=True), ByteLevel(...)])``, exactly the pre-tokenizer of
    SmolLM2's own ``tokenizer.json``.
    """
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if name in ("default", "gpt2"):
        return byte_level
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])


def _clip(value, limit: int = 60) -> str:
    """``repr(value)``, cut to about ``limit`` characters for an error message."""
    r = repr(value)
    return r if len(r) <= limit else r[:limit] + "..."


def _whole_text_pattern(text: str) -> str:
    """An Oniguruma pattern (the ``tokenizers`` package's ``Regex``) matching exactly the whole of
    ``text``: ``\\A``, every character as ``\\x{hex}`` (nothing in it is read as syntax), ``\\z``."""
    return "\\A" + "".join(f"\\x{{{ord(c):X}}}" for c in text) + "\\z"


def _tokenizer_from_gguf(path, meta: dict):
    """``(tokenizers.Tokenizer, {bos_token, eos_token, unk_token, pad_token})`` from the
    ``tokenizer.ggml.*`` metadata (keys without the prefix)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, processors

    model = meta.get("model")
    if model is None:
        raise ValueError(f"{path}: the GGUF file has no tokenizer (tokenizer.ggml.model missing): a tokenizer needs "
                         f"its tokenizer.ggml.* metadata (supported: model 'gpt2', byte-level BPE)")
    if model != "gpt2":
        raise ValueError(f"{path}: GGUF tokenizer model {model!r} (tokenizer.ggml.model) is not supported "
                         f"(supported: 'gpt2', byte-level BPE)")
    pre = meta.get("pre", "default")  # no name: "default", GPT-2's split (see _gguf_pre_tokenizer)
    if pre not in GGUF_PRE_TOKENIZERS:
        raise ValueError(f"{path}: GGUF pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported "
                         f"(supported: {', '.join(GGUF_PRE_TOKENIZERS)})")
    tokens, merges = meta.get("tokens"), meta.get("merges")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"{path}: GGUF metadata tokenizer.ggml.tokens: expected a non-empty list of strings")
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise ValueError(f"{path}: GGUF metadata tokenizer.ggml.merges: expected a list of strings")
    token_type = meta.get("token_type", [1] * len(tokens))
    if not isinstance(token_type, list) or len(token_type) != len(tokens):
        raise ValueError(f"{path}: GGUF metadata tokenizer.ggml.token_type: expected {len(tokens)} ints "
                         f"(one per token), got {len(token_type) if isinstance(token_type, list) else token_type!r}")
    bad = next((i for i, k in enumerate(token_type) if isinstance(k, bool) or not isinstance(k, int)), None)
    if bad is not None:  # strings would be no type at all: no control token registered
        raise ValueError(f"{path}: GGUF metadata tokenizer.ggml.token_type: expected an array of ints (llama.cpp's "
                         f"token types), got {type(token_type[bad]).__name__} {_clip(token_type[bad])} at index {bad}")
    flags = {}
    for key in ("add_bos_token", "add_eos_token"):
        flag = meta.get(key, False)
        if not isinstance(flag, bool):  # bool("false") is True: a GGUF bool or nothing (llama.cpp refuses it too)
            raise ValueError(f"{path}: GGUF metadata tokenizer.ggml.{key}: expected a bool, got "
                             f"{type(flag).__name__} {_clip(flag)}")
        flags[key] = flag

    # The vocabulary keys. A normal token stands for bytes, written in the byte-level alphabet (GPT-2's
    # bytes_to_unicode); one written in other characters (a raw space, say) is re-spelled from its
    # UTF-8 bytes, as transformers' GGUF converter does. A control or user-defined token stands for its
    # text as written: llama.cpp matches it in a prompt by that raw text and prints it as is
    # (token_to_piece), so its key is its raw text, whatever its characters ("<｜bos｜>", whose "｜"
    # is no byte-level symbol, is not re-spelled). An empty token is named "[EMPTY_{id}]", as
    # llama.cpp names it, so that two empty tokens stay two ids.
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())

    def byte_spelling(text: str) -> str:
        """``text``'s UTF-8 bytes in the byte-level alphabet ("a b" -> "aĠb")."""
        return "".join(spelling[b] for b in text.encode("utf-8"))

    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    keys = [t if kind in (_CONTROL, _USER_DEFINED) or set(t) <= alphabet else byte_spelling(t)
            for t, kind in zip(tokens, token_type)]

    def token_label(i: int) -> str:
        """Token ``i`` for an error message: its text, and its byte-level spelling where that differs."""
        respelled = f", {_clip(keys[i])} in the byte-level alphabet" if keys[i] != tokens[i] else ""
        return f"{_clip(tokens[i])}{respelled}"

    vocab = {}
    for i, key in enumerate(keys):
        first = vocab.setdefault(key, i)
        if first != i:  # one entry for two ids: one id would be lost, a special id could name the other token
            raise ValueError(f"{path}: GGUF metadata tokenizer.ggml.tokens: token {i} ({token_label(i)}) duplicates "
                             f"token {first} ({token_label(first)}); expected distinct tokens (llama.cpp "
                             f"refuses such a vocabulary too)")
    pairs = []
    for i, merge in enumerate(merges):
        parts = merge.split(" ")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"{path}: GGUF metadata tokenizer.ggml.merges[{i}] = {merge!r}: expected two "
                             f"tokens separated by one space")
        pairs.append((parts[0], parts[1]))
    try:
        bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
    except Exception as e:  # e.g. a merge of tokens not in the vocabulary
        raise ValueError(f"{path}: inconsistent GGUF tokenizer metadata ({type(e).__name__}: {e})") from None
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = _gguf_pre_tokenizer(pre)

    # Control tokens become special added tokens, user-defined ones plain added tokens: matched whole,
    # by their raw text, before the pre-tokenizer (llama.cpp's special-token partition).
    control = [AddedToken(key, special=True, normalized=False)
               for key, kind in zip(keys, token_type) if kind == _CONTROL]
    user = [AddedToken(key, special=False, normalized=False)
            for key, kind in zip(keys, token_type) if kind == _USER_DEFINED]
    if control:
        tok.add_special_tokens(control)
    if user:
        tok.add_tokens(user)

    # The ByteLevel decoder turns each character of a token into its byte, except in a token holding
    # a character outside the alphabet, which it gives as written: the raw text of "<｜bos｜>". An
    # added token written only in alphabet characters that are not plain ASCII ("café": "é" is byte
    # 0xE9) would come out as bytes ("caf\ufffd"): a Replace step first re-spells exactly that whole
    # token (\A...\z) from its UTF-8 bytes, which ByteLevel then turns back into its raw text. One
    # step per such token, each tried on every decoded token: none for SmolLM2 (its control tokens
    # are ASCII, which ByteLevel gives back as written). The steps run in a chain, so one token's
    # spelling could be another's raw text ("éé" is spelled "Ã©Ã©", itself a token's text): the
    # longer texts go first. A spelling is longer than its text (one character a UTF-8 byte), so a
    # text that is another's spelling is the longer one and is re-spelled before that spelling is
    # made.
    raw = [key for key, kind in zip(keys, token_type)
           if kind in (_CONTROL, _USER_DEFINED) and set(key) <= alphabet and byte_spelling(key) != key]
    raw_steps = [decoders.Replace(Regex(_whole_text_pattern(key)), byte_spelling(key))
                 for key in sorted(raw, key=len, reverse=True)]
    tok.decoder = decoders.Sequence([*raw_steps, decoders.ByteLevel()]) if raw_steps else decoders.ByteLevel()

    special = {}
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        token_id = meta.get(key)
        if token_id is None:
            special[name] = None
            continue
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < len(tokens):
            raise ValueError(f"{path}: GGUF metadata tokenizer.ggml.{key} = {token_id!r} is not a token id "
                             f"in [0, {len(tokens)})")
        special[name] = keys[token_id]  # the token's key: a control token's raw text

    add_bos, add_eos = flags["add_bos_token"], flags["add_eos_token"]
    for flag, name in ((add_bos, "bos_token"), (add_eos, "eos_token")):
        if flag and special[name] is None:
            raise ValueError(f"{path}: GGUF metadata asks to add the {name} but gives no {name}_id")
    if add_bos or add_eos:
        # The template names the tokens "bos" / "eos", not by their text: the package reads a
        # template piece's text up to a ":" as its name and the rest as a type id, and a raw control
        # token may hold a ":" (or a space, which a template string splits on).
        first = ["bos"] if add_bos else []
        last = ["eos"] if add_eos else []
        single = [*first, "$A", *last]
        pair = [*single, *first, "$B:1", *last]
        named = [(label, special[name]) for label, name, flag in (("bos", "bos_token", add_bos),
                                                                 ("eos", "eos_token", add_eos)) if flag]
        tok.post_processor = processors.TemplateProcessing(
            single=single, pair=pair,
            special_tokens=[{"id": label, "ids": [vocab[token]], "tokens": [token]} for label, token in named])
    return tok, special
