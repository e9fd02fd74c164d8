"""Tokenization with the ``tokenizers`` package (Hugging Face's Rust tokenizers), from a model's
``tokenizer.json``: WordPiece for BERT, byte-level BPE for GPT-2 (the encoder tutorial's first step:
"time flies like an arrow" -> [101, 2051, 10029, 2066, 2019, 8612, 102]).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .hub import resolve_model_dir

__all__ = ["Tokenizer"]


class Tokenizer:
    """A ``tokenizers.Tokenizer`` with padding and truncation set up for a model.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        max_length: sequences are truncated to this many tokens (special tokens included).
        pad_token: the padding token (its id pads ``input_ids``).
    """

    def __init__(self, tokenizer, max_length: int = 512, pad_token: str = "[PAD]"):
        self._tok = tokenizer
        self.max_length = int(max_length)
        pad_id = tokenizer.token_to_id(pad_token)
        self.pad_token_id = 0 if pad_id is None else pad_id
        self._tok.enable_truncation(max_length=self.max_length)
        self._tok.enable_padding(pad_id=self.pad_token_id, pad_token=pad_token)

    @classmethod
    def from_pretrained(cls, name_or_path, max_length: int | None = None) -> "Tokenizer":
        """Reads ``tokenizer.json`` from a model directory or embedded model name.

        ``max_length`` defaults to ``sentence_bert_config.json``'s ``max_seq_length`` if present,
        else ``tokenizer_config.json``'s ``model_max_length``, else ``config.json``'s
        ``max_position_embeddings``, else 512.

        Raises:
            FileNotFoundError: no such model or no ``tokenizer.json``.
        """
        from tokenizers import Tokenizer as HFTokenizer

        model_dir = resolve_model_dir(name_or_path)
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer.json: not found in model directory {model_dir}")
        if max_length is None:
            max_length = _default_max_length(Path(model_dir))
        tok = HFTokenizer.from_file(str(path))
        pad = "[PAD]" if tok.token_to_id("[PAD]") is not None else (tok.id_to_token(0) or "[PAD]")
        return cls(tok, max_length=max_length, pad_token=pad)

    def encode(self, text: str) -> list[int]:
        """Token ids of one text, special tokens included (``[CLS] ... [SEP]`` for BERT)."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        return self._tok.encode(text).ids

    def tokenize(self, text: str) -> list[str]:
        """The tokens (strings) of one text, special tokens included."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        return self._tok.encode(text).tokens

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Text from token ids."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def encode_batch(self, texts) -> dict[str, np.ndarray]:
        """Tokenizes a batch, padded to its longest member (and truncated to ``max_length``).

        Args:
            texts: a list of str.

        Returns:
            ``{"input_ids", "attention_mask", "token_type_ids"}``, each an ``(N, L)`` int64 array;
            ``attention_mask`` is 1 for real tokens, 0 for padding.

        Raises:
            TypeError: ``texts`` not a list of str. ValueError: an empty list.
        """
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts: expected a list of str")
        texts = list(texts)
        if not texts:
            raise ValueError("texts: expected at least one text, got an empty list")
        encs = self._tok.encode_batch(texts)
        return {
            "input_ids": np.array([e.ids for e in encs], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encs], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encs], dtype=np.int64),
        }

    __call__ = encode_batch

    @property
    def vocab_size(self) -> int:
        """Number of tokens in the vocabulary (added tokens included)."""
        return self._tok.get_vocab_size(with_added_tokens=True)


def _default_max_length(model_dir: Path) -> int:
    for fname, key in (("sentence_bert_config.json", "max_seq_length"),
                       ("tokenizer_config.json", "model_max_length"),
                       ("config.json", "max_position_embeddings"),
                       ("config.json", "n_positions")):
        p = model_dir / fname
        if p.is_file():
            try:
                value = json.loads(p.read_text()).get(key)
            except json.JSONDecodeError:
                continue
            if isinstance(value, int) and 0 < value <= 1_000_000:
                return value
    return 512
