"""The Python face of the decoder stack every causal language model here shares (C++
``models/decoder.hpp``: token embedding, pre-norm blocks of attention and MLP, final norm, LM head).

An architecture (``gpt2.py``, ``llama.py``) is a config class, the name of its C++ model, and the
names of its weights; :class:`DecoderModel` (hidden states) and :class:`CausalLM` (logits and
``generate``) do the rest.

Positions: with an ``attention_mask`` that has padding, token positions are counted over the real
tokens (``cumsum(mask) - 1``, as Hugging Face's ``generate`` does), so a left-padded prompt gives
the same logits as the prompt alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validation import as_bool, as_ids
from .generation import GenerationMixin
from .kv_cache import KVCache
from .module import Module

__all__ = ["DecoderModel", "CausalLM", "CausalLMOutput", "positions_from_mask"]


@dataclass
class CausalLMOutput:
    """What a causal LM's forward returns.

    Attributes:
        logits: ``(N, L, vocab_size)`` float (``(N, k, vocab_size)`` with ``logits_to_keep=k``).
        past_key_values: the :class:`KVCache` (with ``use_cache``), else None.
        last_hidden_state: ``(N, L, hidden_size)`` after the final norm.
    """

    logits: np.ndarray
    past_key_values: KVCache | None
    last_hidden_state: np.ndarray


def positions_from_mask(attention_mask: np.ndarray, past: int) -> np.ndarray:
    """Positions of the new tokens counted over real tokens only: ``cumsum(mask) - 1`` over the
    whole ``(N, past + L)`` mask, its last L columns, padding positions clamped to 0.

    Args:
        attention_mask: ``(N, past + L)`` bool, True = a real token.
        past: positions already in the cache.

    Returns:
        ``(N, L)`` int64, C-contiguous.
    """
    counts = np.cumsum(attention_mask, axis=1, dtype=np.int64) - 1
    return np.ascontiguousarray(np.maximum(counts[:, past:], 0))


class DecoderModel(Module):
    """A decoder-only transformer returning hidden states (Hugging Face's ``XModel``). Subclasses
    set ``config_class``, ``_core_class`` (the C++ model's name) and ``_context_field`` (the config
    field that names the context length) and map weight names."""

    config_class: type = None
    _core_class: str = ""
    _context_field: str = "max_position_embeddings"

    def __init__(self, config, dtype=np.float32):
        sfx = self._init_dtype(dtype)
        self.config = config if isinstance(config, self.config_class) else self.config_class.from_dict(config)
        from ._runtime import core

        self._impl = getattr(core, self._core_class + sfx)(self._core_config())
        self._init_weights()

    def _core_config(self):
        """The C++ config the model is built from (an architecture may add fields of its own)."""
        return self.config._to_core()

    @property
    def context_length(self) -> int:
        """The most positions one sequence may have (past + new)."""
        return int(getattr(self.config, self._context_field))

    @property
    def head_dim(self) -> int:
        """D, the width of one attention head."""
        return self._impl.head_dim

    def new_cache(self, batch: int, capacity: int = 0) -> KVCache:
        """An empty :class:`KVCache` for this model and ``batch`` sequences, ``capacity`` positions
        reserved (it grows as needed)."""
        return KVCache(self.config.num_layers, batch, self.config.num_kv_heads, self.head_dim, capacity, self.dtype)

    def _prepare(self, input_ids, attention_mask, position_ids, past_key_values):
        """Checked ``(ids (N, L), mask (N, past + L) or None, positions (N, L) or None, cache)``."""
        ids = as_ids(input_ids, "input_ids")
        N, L = ids.shape
        cache = past_key_values
        if cache is None:
            cache = self.new_cache(N, L)
        elif not isinstance(cache, KVCache):
            cache = KVCache.from_legacy(cache, self.config.num_kv_heads, self.head_dim, self.dtype)
        if cache.batch != N or len(cache) != self.config.num_layers:
            raise ValueError(f"past_key_values: a cache of batch {cache.batch} and {len(cache)} layers does not fit "
                             f"input_ids' batch {N} and this model's {self.config.num_layers} layers")
        past = cache.length
        if past + L > self.context_length:
            raise ValueError(f"input_ids: past length {past} + new length {L} exceeds the context "
                             f"({self._context_field} = {self.context_length})")
        mask = positions = None
        if attention_mask is not None:
            mask = np.ascontiguousarray(as_bool(attention_mask, "attention_mask"))
            if mask.ndim == 1:
                mask = mask[None]
            if mask.shape != (N, past + L):
                raise ValueError(f"attention_mask: expected shape {(N, past + L)} (batch, past + new length), "
                                 f"got {mask.shape}")
            if mask.all():
                mask = None
            else:
                positions = positions_from_mask(mask, past)
        if position_ids is not None:
            positions = as_ids(position_ids, "position_ids")
            if positions.shape != (N, L):
                raise ValueError(f"position_ids: expected shape {(N, L)} (input_ids'), got {positions.shape}")
            if positions.min() < 0 or positions.max() >= self.context_length:
                raise ValueError(f"position_ids: expected positions in [0, {self.context_length}), got "
                                 f"[{positions.min()}, {positions.max()}]")
        return ids, mask, positions, cache

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache: bool = False):
        """Runs the decoder.

        Args:
            input_ids: ``(N, L)`` (or ``(L,)``) token ids in ``[0, vocab_size)``; past + L must fit
                the context.
            attention_mask: ``(N, past + L)``, 1/True = a real token (left padding for batched
                prompts); None = all real.
            position_ids: ``(N, L)`` positions of the new tokens; default: derived from the mask,
                else ``past .. past + L - 1``.
            past_key_values: a :class:`KVCache` (updated in place) or Hugging Face's legacy tuple of
                per-layer ``(keys, values)``.
            use_cache: return the cache.

        Returns:
            ``(hidden (N, L, hidden_size), cache or None)`` in ``self.dtype``.

        Raises:
            ValueError: ids out of range, too long a sequence, masks, positions or caches that do
                not fit. TypeError: non-integer ids.
        """
        ids, mask, positions, cache = self._prepare(input_ids, attention_mask, position_ids, past_key_values)
        hidden = self._impl.forward(ids, mask, positions, cache._impl)
        return hidden, (cache if use_cache else None)


class CausalLM(DecoderModel, GenerationMixin):
    """A decoder with its language-model head: next-token logits, KV-cache decoding and
    :meth:`generate` (Hugging Face's ``XForCausalLM``)."""

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache: bool = False, logits_to_keep: int = 0) -> CausalLMOutput:
        """Next-token logits.

        Args:
            input_ids, attention_mask, position_ids, past_key_values, use_cache: as
                :meth:`DecoderModel.forward`.
            logits_to_keep: 0 = logits for every position; k > 0 = only the last k (a decoding
                step needs 1).

        Returns:
            :class:`CausalLMOutput`, logits ``(N, L or k, vocab_size)``.

        Raises:
            ValueError / TypeError: as :meth:`DecoderModel.forward`; ``logits_to_keep`` not an int
            in ``[0, L]``.
        """
        from ._validation import check_int

        keep = check_int(logits_to_keep, "logits_to_keep", 0)
        hidden, cache = DecoderModel.forward(self, input_ids, attention_mask, position_ids, past_key_values,
                                             use_cache=True)
        N, L, E = hidden.shape
        if keep > L:
            raise ValueError(f"logits_to_keep: expected an int in [0, {L}] (the input length), got {keep}")
        kept = hidden if keep == 0 else hidden[:, L - keep:]
        logits = self._impl.logits(np.ascontiguousarray(kept).reshape(-1, E)).reshape(N, kept.shape[1], -1)
        return CausalLMOutput(logits=logits, past_key_values=cache if use_cache else None, last_hidden_state=hidden)
