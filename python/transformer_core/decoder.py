"""The Python face of the decoder stack every causal language model here shares (C++
``models/decoder.hpp``: token embedding, pre-norm blocks of attention and MLP, final norm, LM head).

An architecture (``gpt2.py``, ``llama.py``) is a config class, the name of its C++ model, and the
names of its weights; :class:`DecoderModel` (hidden states) and :class:`CausalLM` (logits and
``generate``) do the rest.

Positions: without ``position_ids``, the new tokens take positions ``past .. past + L - 1`` whatever
the ``attention_mask`` (Hugging Face's forward: ``cache_position``), so a padded batch gives Hugging
Face's logits for the same arguments. ``generate`` counts positions over the real tokens instead
(``cumsum(mask) - 1``, as Hugging Face's ``generate``), so a left-padded prompt gives the tokens of
the prompt alone; :func:`positions_from_mask` gives those positions to pass as ``position_ids``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ._validation import (
    as_bool,
    as_ids,
    check_allocatable,
    check_bool,
    check_int,
    ids_shape,
    physical_memory_bytes,
    to_numpy,
)
from .generation import GenerationMixin, cache_bytes_per_position, cache_too_large
from .kv_cache import KVCache, holder_id
from .module import Module
from .nn import _check_rotary_tables

__all__ = ["DecoderModel", "CausalLM", "CausalLMOutput", "positions_from_mask"]


def _mask_and_positions(attention_mask, position_ids, N: int, L: int, past: int, context_length: int):
    """The checked ``attention_mask (N, past + L)`` (None when all True) and positions ``(N, L)``:
    ``position_ids`` when given, else None (``past .. past + L - 1`` for every row, whatever the
    mask: Hugging Face's forward). A 1-D mask is a batch of one; ``position_ids`` of shape ``(1, L)``
    or ``(L,)`` are shared by every batch item (broadcast, as Hugging Face's). A shape that does not
    fit is reported as it was passed."""
    mask = positions = None
    if attention_mask is not None:
        given = to_numpy(attention_mask, "attention_mask")
        mask = given[None] if given.ndim == 1 else given
        if mask.shape != (N, past + L):  # before as_bool's bool copy
            raise ValueError(f"attention_mask: expected shape {(N, past + L)} (batch, past + new length), "
                             f"got {given.shape}")
        mask = as_bool(mask, "attention_mask", allow_float=True)  # a broadcast view stays one
        mask = np.ascontiguousarray(mask)  # (N, past + L): checked
        if mask.all():
            mask = None
    if position_ids is not None:
        given = to_numpy(position_ids, "position_ids")  # an array or a tensor: no copy
        if N > 1 and given.shape in ((1, L), (L,)):  # one row for the whole batch (Hugging Face's
            # arange(L)[None]): a broadcast view, which as_ids checks before it copies it
            given = np.broadcast_to(given.reshape(1, L), (N, L))
        positions = as_ids(given, "position_ids", shape=(N, L), shape_of="input_ids'", what="positions")
        if positions.min() < 0 or positions.max() >= context_length:
            raise ValueError(f"position_ids: expected positions in [0, {context_length}), got "
                             f"[{positions.min()}, {positions.max()}]")
    return mask, positions


@dataclass
class CausalLMOutput:
    """What a causal LM's forward returns.

    Attributes:
        logits: ``(N, L, vocab_size)`` float (``(N, k, vocab_size)`` with ``logits_to_keep=k``).
        past_key_values: the :class:`KVCache` when ``use_cache`` (default: the config's, True),
            else None (see :meth:`DecoderModel.forward`).
        last_hidden_state: ``(N, L, hidden_size)`` after the final norm.
    """

    logits: np.ndarray
    past_key_values: KVCache | None
    last_hidden_state: np.ndarray


def _is_legacy_cache(value) -> bool:
    """Whether ``value`` looks like Hugging Face's legacy cache: a tuple or list whose first item is
    a ``(keys, values)`` pair of 4-D arrays or tensors (a mask given as nested lists holds numbers)."""
    if not isinstance(value, (tuple, list)) or not value:
        return False
    pair = value[0]
    return (isinstance(pair, (tuple, list)) and len(pair) == 2
            and all(getattr(item, "ndim", None) == 4 for item in pair))


def _refuse_cache_as_mask(attention_mask) -> None:
    """TypeError when the ``attention_mask`` slot holds a cache: Hugging Face's GPT-2 forward takes
    ``past_key_values`` second (``model(ids, past)``); this forward takes ``attention_mask`` second
    (as Hugging Face's Llama). Checked before anything else."""
    if isinstance(attention_mask, KVCache):
        got = "a KVCache"
    elif _is_legacy_cache(attention_mask):
        got = f"Hugging Face's legacy {type(attention_mask).__name__} of (keys, values) pairs"
    else:
        return
    raise TypeError(f"attention_mask: expected an (N, past + L) mask, got {got}: the second positional argument "
                    "here is attention_mask (Hugging Face's GPT-2 takes past_key_values second); pass the cache "
                    "by keyword: model(input_ids, past_key_values=cache)")


def positions_from_mask(attention_mask, past: int) -> np.ndarray:
    """Positions of the new tokens counted over real tokens only: ``cumsum(mask) - 1`` over the
    whole ``(N, past + L)`` mask, its last L columns, clamped at 0. A padding position takes the
    position of the last real token before it (so trailing padding repeats the last real
    position), or 0 when no real token comes before it (leading padding). At the real tokens these
    are the ``position_ids`` Hugging Face's ``generate`` derives (its ``prepare_inputs_for_generation``;
    it sets padding ones to 0 in transformers 5, to 1 in 4.x: no query reads a padding position),
    and :meth:`CausalLM.generate` passes these to ``forward``. ``forward`` does not derive them
    itself (as Hugging Face's forward, it takes ``past .. past + L - 1`` without ``position_ids``):
    pass them as ``position_ids`` to get a left-padded row the logits of the row alone.

    Args:
        attention_mask: ``(N, W)`` with ``W = past + L``: bool, or integers / floats that are all
            0 or 1 (Hugging Face's style); True / 1 = a real token.
        past: positions already in the cache, an int in ``[0, W]``.

    Returns:
        ``(N, L)`` int64, C-contiguous (only this many values are made: the first ``past`` columns
        are summed, not counted one by one).

    Raises:
        TypeError: ``attention_mask`` None, or not bool / numeric (:func:`~._validation.as_bool`);
            ``past`` not an int.
        ValueError: ``attention_mask`` not 2-D, or of values other than 0 and 1; ``past`` outside
            ``[0, attention_mask.shape[1]]``; an ``(N, L)`` result larger than this machine's memory.
            Each is checked before anything is allocated.
    """
    given = to_numpy(attention_mask, "attention_mask")
    if given.ndim != 2:
        raise ValueError(f"attention_mask: expected a 2-D array (batch, past + new length), got shape {given.shape}")
    past = check_int(past, "past", 0, None)
    if past > given.shape[1]:
        raise ValueError(f"past: expected an int in [0, {given.shape[1]}] (attention_mask's width, past + new "
                         f"length), got {past}")
    mask = as_bool(given, "attention_mask", allow_float=True)
    N, width = mask.shape
    check_allocatable((N, width - past), 8, "attention_mask")
    before = np.sum(mask[:, :past], axis=1, dtype=np.int64, keepdims=True)  # real tokens already cached
    positions = np.cumsum(mask[:, past:], axis=1, dtype=np.int64)
    positions += before - 1
    return np.ascontiguousarray(np.maximum(positions, 0, out=positions))


def _float_weight(value, name: str) -> np.ndarray:
    """A checkpoint value as a numpy array of its own float dtype, to compare (a torch tensor read
    as :meth:`~transformer_core.module.Module.load_state_dict` reads it: bfloat16 widened exactly).

    Raises:
        TypeError: not floating-point data, naming ``state_dict[name]``.
    """
    arr = to_numpy(value, f"state_dict[{name!r}]")
    if arr.dtype.kind != "f":
        raise TypeError(f"state_dict[{name!r}]: expected a floating-point array, got dtype {arr.dtype}")
    return arr


def _rename_known(state: dict, names, rename) -> dict:
    """``state`` with each key that ``rename`` maps onto one of the model's weight ``names``
    renamed, unless that name is given too; every other key kept as given, so that
    ``load_state_dict`` reports an unknown key (and a duplicate alternative name) under the
    caller's own name, as torch's."""
    out = {}
    for key, value in state.items():
        ours = rename(key)
        out[ours if ours != key and ours in names and ours not in state else key] = value
    return out


def _load_tied_head(state: dict, head, embed_name: str, shape: tuple, head_name: str = "lm_head.weight",
                    untied: str = "an untied head") -> None:
    """A tied LM head ``head`` (given as ``state_dict[head_name]``) into the renamed ``state``: the
    head IS the token embedding ``embed_name`` (as torch's tied parameter), so without one beside it,
    it loads into it; with one, it must equal it (values, NaN equal to NaN).

    Raises:
        TypeError: ``head`` not floating-point data (naming ``head_name``).
        ValueError: a head of another shape than the embedding's ``shape``, or one that differs from
            the embedding given beside it (``untied`` says why that cannot be loaded).
    """
    arr = _float_weight(head, head_name)
    if arr.shape != tuple(shape):
        raise ValueError(f"{head_name}: expected shape {tuple(shape)} (the tied {embed_name}'s), got {arr.shape}")
    if embed_name not in state:
        state[embed_name] = arr
        return
    embed = _float_weight(state[embed_name], embed_name)
    if embed.shape == arr.shape and not np.array_equal(arr, embed, equal_nan=True):  # (a mis-shaped
        # embedding is load_state_dict's to refuse)
        raise ValueError(f"{head_name}: differs from {embed_name} ({untied})")


def _renamed(message: str, names: dict) -> str:
    """``message`` with the C++ decoder's field names replaced by an architecture's (``names``)."""
    if not names:
        return message
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")\b")
    return pattern.sub(lambda m: names[m.group(1)], message)


class DecoderModel(Module):
    """A decoder-only transformer returning hidden states (Hugging Face's ``XModel``). Subclasses
    set ``config_class``, ``_core_class`` (the C++ model's name) and ``_context_field`` (the config
    field that names the context length) and map weight names."""

    config_class: type = None
    _core_class: str = ""
    _context_field: str = "max_position_embeddings"
    #: How the C++ model's rotary tables hold each head (``"half"`` or ``"interleaved"``, as
    #: :class:`~transformer_core.llama.LlamaModel` sets it); None: a model of learned positions
    #: (GPT-2), without rotary tables.
    rope_layout: str | None = None
    #: Whether ``forward(..., use_cache=False)`` returns a ``past_key_values`` it was given (updated):
    #: Hugging Face's ``LlamaModel`` does; its ``GPT2Model`` returns None (GPT-2 sets False).
    _returns_given_cache: bool = True

    def __init__(self, config, dtype=np.float32):
        sfx = self._init_dtype(dtype)
        self.config = config if isinstance(config, self.config_class) else self.config_class.from_dict(config)
        from ._runtime import core

        core_config = self._core_config()  # the config's own checks, in its names (not renamed below)
        try:
            self._impl = getattr(core, self._core_class + sfx)(core_config)
        except ValueError as e:  # the C++ decoder names its generic fields: give the architecture's names
            raise ValueError(_renamed(str(e), getattr(self.config, "_CORE_NAMES", {}))) from None
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

    @property
    def _key_order(self):
        """The ``key_order`` of this model's caches (:class:`KVCache`): None, the keys in Hugging
        Face's order (a Llama of ``rope_layout="interleaved"`` overrides it)."""
        return None

    def _one_cache_fits(self, positions: int) -> bool:
        """Whether one sequence's KV cache of ``positions`` fits this machine's memory (where a
        batch's does not, fewer sequences at a time is the advice; else a shorter sequence)."""
        per_position = cache_bytes_per_position(self.config.num_layers, self.config.num_kv_heads, self.head_dim,
                                                self.dtype)
        return per_position * positions <= physical_memory_bytes()

    def new_cache(self, batch: int, capacity: int = 0) -> KVCache:
        """An empty :class:`KVCache` for this model and ``batch`` sequences, ``capacity`` positions
        reserved (it grows as needed)."""
        return KVCache(self.config.num_layers, batch, self.config.num_kv_heads, self.head_dim, capacity, self.dtype,
                       key_order=self._key_order)

    def _resolve_use_cache(self, use_cache, past_key_values) -> bool:
        """Whether ``forward`` returns the cache: ``use_cache`` (None: the config's
        ``extra['use_cache']``, True when absent: Hugging Face's default), or, for a model that
        returns a cache it was given (``_returns_given_cache``), ``past_key_values`` given.

        Raises:
            TypeError: ``use_cache`` neither None nor a bool; a config ``use_cache`` not a bool.
        """
        if use_cache is None:
            extra = getattr(self.config, "extra", None) or {}
            use_cache = check_bool(extra.get("use_cache", True), "config.extra['use_cache']")
        else:
            use_cache = check_bool(use_cache, "use_cache")
        return use_cache or (past_key_values is not None and self._returns_given_cache)

    def _model_cache(self, past_key_values, N: int) -> KVCache:
        """``past_key_values`` as a :class:`KVCache` of this model for a batch of ``N``: a KVCache as
        is, Hugging Face's legacy tuple of per-layer ``(keys, values)`` copied into a new one.

        Raises:
            TypeError: neither a KVCache nor a tuple/list; a cache of another dtype than the model's.
            ValueError: a legacy tuple of bad shapes; a cache of another batch, layer count, head
                count or width, or another order of the keys' dims (a cache of a model of the
                other ``rope_layout``).
        """
        cache = past_key_values
        order = self._key_order
        if not isinstance(cache, KVCache):
            if not isinstance(cache, (list, tuple)):  # the model's message: it takes a KVCache too
                raise TypeError(f"past_key_values: expected None, a KVCache or Hugging Face's legacy tuple of (keys, "
                                f"values) pairs per layer, got {type(cache).__name__}")
            cache = KVCache.from_legacy(cache, self.config.num_kv_heads, self.head_dim, self.dtype, key_order=order)
        if np.dtype(cache.dtype) != np.dtype(self.dtype):
            raise TypeError(f"past_key_values: expected a cache of this model's dtype {np.dtype(self.dtype).name}, "
                            f"got {np.dtype(cache.dtype).name}")
        if cache.batch != N or len(cache) != self.config.num_layers:
            raise ValueError(f"past_key_values: a cache of batch {cache.batch} and {len(cache)} layers does not fit "
                             f"input_ids' batch {N} and this model's {self.config.num_layers} layers")
        if cache.num_key_value_heads != self.config.num_kv_heads or cache.head_dim != self.head_dim:
            raise ValueError(f"past_key_values: a cache of {cache.num_key_value_heads} key/value heads of width "
                             f"{cache.head_dim} does not fit this model's {self.config.num_kv_heads} of width "
                             f"{self.head_dim}")
        if (cache.key_order is None) != (order is None) or (order is not None
                                                            and not np.array_equal(cache.key_order, order)):
            mine = "llama.cpp's (rope_layout='interleaved')" if order is not None else "Hugging Face's"
            raise ValueError(f"past_key_values: this model's keys hold each head's dims in {mine} order and the "
                             f"cache's do not (it was made by another model, or by KVCache() without key_order); "
                             f"use model.new_cache(...), or pass cache.to_legacy() to convert it")
        return cache

    def _prepare(self, input_ids, attention_mask, position_ids, past_key_values):
        """Checked ``(ids (N, L), mask (N, past + L) or None, positions (N, L) or None, cache)``.
        What needs only the shape is checked before the ids are copied to int64."""
        N, L = ids_shape(input_ids, "input_ids")
        # the caller's cache is checked, not changed; a new one is made after every check
        cache = None if past_key_values is None else self._model_cache(past_key_values, N)
        past = 0 if cache is None else cache.length
        if past + L > self.context_length:
            raise ValueError(f"input_ids: past length {past} + new length {L} exceeds the context "
                             f"({self._context_field} = {self.context_length})")
        self.check_activations(N, L, f"a batch of {N} sequences of length {L}")
        # the mask and positions (their shapes are checked before their own copies) before the ids' copy
        mask, positions = _mask_and_positions(attention_mask, position_ids, N, L, past, self.context_length)
        ids = as_ids(input_ids, "input_ids")
        vocab = self.config.vocab_size
        if ids.min() < 0 or ids.max() >= vocab:  # here, before a cache is made or grown (min/max: no
            bad = np.flatnonzero((ids < 0) | (ids >= vocab))  # temporary of ids' size when all are in range)
            raise ValueError(f"input_ids: id {ids.flat[bad[0]]} at flat index {bad[0]} is outside [0, {vocab})")
        self._check_rotary_tables(positions, position_ids is not None, past + L)
        if cache is None:
            try:
                cache = self.new_cache(N, L)
            except ValueError as e:  # KVCache names its own arguments: name the caller's
                raise cache_too_large(e, f"a batch of {N} sequences of length {L}", self._one_cache_fits(L)) from None
        elif past + L > cache.capacity:  # the caller's cache grows now, after every check, as the step would
            try:
                cache.reserve(past + L)
            except ValueError as e:
                raise cache_too_large(e, f"a batch of {N} sequences of length {L} after {past} cached "
                                      "positions", self._one_cache_fits(past + L)) from None
        return ids, mask, positions, cache

    def _check_rotary_tables(self, positions, explicit: bool, default_end: int) -> None:
        """ValueError when the rotary cos and sin tables this call's positions need (up to the
        largest position; ``positions`` None: ``default_end - 1``, the last of ``past .. past + L -
        1``) would exceed this machine's memory, naming ``position_ids`` when they were given
        (``explicit``), else ``input_ids``. The C++ model builds its tables as the positions come,
        once the cache has grown: this check comes before, so a refused call leaves the cache as it
        was.

        The C++ tables grow to twice the positions built so far when that is more than a call
        needs; the count built is not exposed, so the tables checked here are the ones the call
        needs.
        """
        if self.rope_layout is None or self.config.num_layers == 0:  # no rotary tables, or none used
            return
        needed = default_end if positions is None else int(positions.max()) + 1
        _check_rotary_tables(needed, needed - 1, self.head_dim, self.rope_layout, self.dtype, self.context_length,
                             "position_ids" if explicit else "input_ids")

    def _ffn_width(self) -> tuple[int, str]:
        """Values per row of the feed-forward's hidden activations, and the config fields that set
        them (a gated feed-forward: gate | up, then their product, 3 · intermediate_size)."""
        return 3 * int(self.config.intermediate_size), "3 · intermediate_size"

    def check_activations(self, N: int, L: int, what: str) -> None:
        """ValueError naming ``input_ids`` when a step over ``N × L`` positions would need more
        memory for its widest activations (the feed-forward's hidden ones) than this machine has:
        checked before a cache is made or grown. ``what`` describes the call."""
        width, fields = self._ffn_width()
        need = N * L * width * np.dtype(self.dtype).itemsize
        limit = physical_memory_bytes()
        if need > limit:
            raise ValueError(f"input_ids: {what} needs feed-forward activations of ({N * L}, {fields} = {width}) "
                             f"values, {need} bytes, more than this machine's memory ({limit} bytes): use a "
                             "smaller batch or shorter prompts")

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache: bool | None = None):
        """Runs the decoder.

        Args:
            input_ids: ``(N, L)`` (or ``(L,)``) token ids in ``[0, vocab_size)``; past + L must fit
                the context.
            attention_mask: ``(N, past + L)``, 1/True = a real token (left padding for batched
                prompts); None = all real. It masks keys only: positions do not follow it.
            position_ids: ``(N, L)``, or ``(1, L)`` / ``(L,)`` shared by every batch item, as
                Hugging Face's: integer positions of the new tokens in ``[0, context)``; default
                ``past .. past + L - 1`` in every row, whatever ``attention_mask`` (Hugging Face's
                forward). For a left-padded row to get the logits of the row alone, pass the
                positions counted over its real tokens: ``positions_from_mask(attention_mask,
                past)`` (what ``generate`` passes, as Hugging Face's ``generate``).
            past_key_values: a :class:`KVCache` (updated in place, whatever ``use_cache``, as
                Hugging Face's) or Hugging Face's legacy tuple of per-layer ``(keys, values)``
                (copied into a new KVCache, which is the one returned).
            use_cache: whether to return the cache, to pass as ``past_key_values`` to the next
                call. None (default) = the config's ``use_cache`` (``config.extra['use_cache']``,
                read from ``config.json``; True when absent), as Hugging Face's forward: so
                ``out = model(ids)``, then ``model(next_ids, past_key_values=out.past_key_values)``
                continues the sequence. False: None, except that a Llama given ``past_key_values``
                returns it (Hugging Face's ``LlamaModel`` does; its ``GPT2Model`` returns None).
                Without ``past_key_values``, the cache returned is a new one of this call's L
                positions (``2 · num_layers · N · L · num_kv_heads · head_dim`` values): the
                forward makes it whatever ``use_cache``, and returning it keeps it allocated as
                long as the output is held.

        Returns:
            ``(hidden (N, L, hidden_size), cache or None)`` in ``self.dtype``.

        Raises:
            TypeError: a :class:`KVCache` or Hugging Face's legacy tuple as ``attention_mask``
                (Hugging Face's GPT-2 order, ``model(ids, past)``: pass ``past_key_values=`` by
                keyword), checked first; ``use_cache`` (or the config's) neither None nor a bool;
                ids neither integers nor whole-number floats (a float array of whole numbers is
                taken); a ``past_key_values`` cache of another dtype than the model's.
            ValueError: ids out of range, too long a sequence, masks, positions or caches that do
                not fit; a batch whose KV cache or feed-forward activations would exceed this
                machine's memory (naming ``input_ids`` and its batch size, before the cache is
                allocated); positions whose rotary cos and sin tables would exceed this machine's
                memory (naming ``position_ids``, or ``input_ids`` for the positions derived from
                it). Every check runs before a cache is made or the caller's grows: a refused call
                leaves ``past_key_values``' length and capacity as they were. ValueError too
                when a call in another thread holds ``past_key_values`` (one cache, one sequence
                of calls).
        """
        _refuse_cache_as_mask(attention_mask)
        use_cache = self._resolve_use_cache(use_cache, past_key_values)
        # the caller's cache held from the checks of its length to the end of the C++ call
        given = past_key_values if isinstance(past_key_values, KVCache) else None
        me = holder_id()
        outermost = given is not None and given._holder != me
        try:
            if given is not None:
                given._hold()
            ids, mask, positions, cache = self._prepare(input_ids, attention_mask, position_ids, past_key_values)
            hidden = self._impl.forward(ids, mask, positions, cache._impl)
        finally:  # inline, no call: a KeyboardInterrupt at a call's entry would keep the hold (holder_id)
            if outermost and given._holder == me:
                given._holder = None
        return hidden, (cache if use_cache else None)


class CausalLM(DecoderModel, GenerationMixin):
    """A decoder with its language-model head: next-token logits, KV-cache decoding and
    :meth:`generate` (Hugging Face's ``XForCausalLM``), and training (llm.c's ``gpt2_forward`` with
    targets, then ``gpt2_backward``; nanoGPT's training loop)::

        model.train()
        loss = model.loss(input_ids, labels)     # a float; keeps every activation for backward
        model.backward()                         # every parameter's gradient added
        opt.step(); model.zero_grad()

    The loss is Hugging Face's ``model(input_ids, labels=labels).loss``: position t predicts
    ``labels[:, t + 1]`` (the labels are shifted inside), ``ignore_index`` (-100) positions do not
    count, the mean is over the counted positions (0.0 when none counts). The LM head and the
    cross-entropy are fused in C++ a chunk of rows at a time: the ``(N, L, vocab)`` logits never
    exist whole. In eval mode ``loss`` keeps nothing and touches no gradient (a validation loss).
    ``forward`` and ``generate`` always run the inference path and keep nothing.
    """

    #: A Hugging Face directory's ``generation_config.json`` (a dict, set by ``from_pretrained``),
    #: whose end and padding ids ``generate`` takes in place of ``config``'s; None: none.
    generation_config: dict | None = None

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache: bool | None = None, logits_to_keep: int = 0) -> CausalLMOutput:
        """Next-token logits.

        Args:
            input_ids, attention_mask, position_ids, past_key_values, use_cache: as
                :meth:`DecoderModel.forward` (``use_cache`` None = the config's, True by default, as
                Hugging Face's: the output's ``past_key_values`` holds the cache).
            logits_to_keep: 0 = logits for every position; k > 0 = only the last k (a decoding
                step needs 1).

        Returns:
            :class:`CausalLMOutput`, logits ``(N, L or k, vocab_size)``.

        Raises:
            ValueError / TypeError: as :meth:`DecoderModel.forward`; ``logits_to_keep`` not an int
            in ``[0, L]``. Every check runs before the decoder: a refused call leaves
            ``past_key_values`` as it was.
        """
        _refuse_cache_as_mask(attention_mask)
        keep = check_int(logits_to_keep, "logits_to_keep", 0)
        use_cache = self._resolve_use_cache(use_cache, past_key_values)
        L = ids_shape(input_ids, "input_ids")[1]  # the ids are copied in forward, after its checks
        if keep > L:  # before the decoder runs: a cache passed in is not extended by a refused call
            raise ValueError(f"logits_to_keep: expected an int in [0, {L}] (the input length), got {keep}")
        hidden, cache = DecoderModel.forward(self, input_ids, attention_mask, position_ids, past_key_values,
                                             use_cache=True)
        N, L, E = hidden.shape
        kept = hidden if keep == 0 else hidden[:, L - keep:]
        logits = self._impl.logits(np.ascontiguousarray(kept).reshape(-1, E)).reshape(N, kept.shape[1], -1)
        return CausalLMOutput(logits=logits, past_key_values=cache if use_cache else None, last_hidden_state=hidden)

    def _dropout_probs(self) -> tuple[float, float, float]:
        """(residual dropout, embedding dropout, attention-probability dropout) of the training
        forward (subclasses: the config's)."""
        return 0.0, 0.0, 0.0

    def _training_inputs(self, input_ids, attention_mask, position_ids):
        """loss's inputs checked: ``(ids, mask, positions)`` as :meth:`_prepare`'s. What needs only
        the shape comes before the ids' int64 copy: the context, the feed-forward's activations, and
        the keys and values every layer keeps for backward (a lower bound of what training keeps)."""
        N, L = ids_shape(input_ids, "input_ids")
        if L > self.context_length:
            raise ValueError(f"input_ids: length {L} exceeds the context ({self._context_field} = "
                             f"{self.context_length})")
        what = f"a training batch of {N} sequences of length {L}"
        self.check_activations(N, L, what)
        kept = N * L * cache_bytes_per_position(self.config.num_layers, self.config.num_kv_heads, self.head_dim,
                                                self.dtype)
        limit = physical_memory_bytes()
        if kept > limit:
            raise ValueError(f"input_ids: {what} keeps every layer's keys and values for backward, {kept} bytes, "
                             f"more than this machine's memory ({limit} bytes): use a smaller batch or shorter "
                             "sequences")
        mask, positions = _mask_and_positions(attention_mask, position_ids, N, L, 0, self.context_length)
        return as_ids(input_ids, "input_ids"), mask, positions

    def loss(self, input_ids, labels, attention_mask=None, position_ids=None, *, ignore_index: int = -100,
             seed: int | None = None) -> np.float64:
        """The mean next-token cross-entropy of ``labels`` given ``input_ids`` (see the class doc).

        Args:
            input_ids: ``(N, L)`` (or ``(L,)``) token ids in ``[0, vocab_size)``, L within the context.
            labels: ``(N, L)`` int: usually ``input_ids`` with padding set to ``ignore_index``
                (a label at a padding position counts, as in Hugging Face's loss).
            attention_mask: ``(N, L)``, 1/True = a real token (left or right padding). It masks
                keys only: positions are ``0 .. L-1`` whatever the mask, as in :meth:`forward`
                and Hugging Face's forward (so the loss is HF's for the same arguments).
            position_ids: ``(N, L)``, or ``(1, L)`` / ``(L,)`` shared by every batch item, as
                Hugging Face's: explicit positions (``positions_from_mask(attention_mask, 0)``
                counts them over the real tokens: a left-padded row then gets the loss of the row
                alone).
            ignore_index: the label value that does not count (-100, torch's and HF's); an int
                in the int64 range.
            seed: the dropout seed of this call (default: :func:`transformer_core.manual_seed`'s
                generator; unused without dropout).

        Returns:
            The loss, computed in double: a ``np.float64`` (a subclass of Python's float, with
            ``.item()`` as torch's 0-d tensor: a ported ``loss.item()`` runs). In training mode the
            call keeps what :meth:`backward` needs.

        Raises:
            NonFiniteLossError: the loss is NaN or inf; nothing is kept and no gradient was touched.
            ValueError: labels of the wrong shape or out of range, ids out of range, too long an
                input, masks or positions that do not fit, ``ignore_index`` outside the int64 range.
                TypeError: ids or labels neither integers nor whole-number floats (a float array
                of whole numbers is taken), a non-int ``ignore_index``.
        """
        from .module import NonFiniteLossError

        # an int64 (the targets' dtype), as functional.cross_entropy checks it
        ignore_index = check_int(ignore_index, "ignore_index", -2**63, 2**63 - 1)
        # the labels' dtype and shape before any copy (their values after the inputs')
        ids_shape(labels, "labels", shape=ids_shape(input_ids, "input_ids"), shape_of="input_ids'")
        ids, mask, positions = self._training_inputs(input_ids, attention_mask, position_ids)
        lab = _check_labels(labels, ids.shape, self.config.vocab_size, ignore_index)
        targets = np.full(ids.shape, ignore_index, np.int64)  # position t predicts labels[:, t + 1]
        targets[:, :-1] = lab[:, 1:]
        resid, embed, attn = self._dropout_probs() if self.training else (0.0, 0.0, 0.0)
        seed = self._dropout_seed(max(resid, embed, attn), None if seed is None else check_int(seed, "seed", 0))
        value, _count, finite = self._impl.loss(ids, targets, mask, positions, ignore_index, self.training,
                                                resid, embed, seed, attn)
        if not finite:
            raise NonFiniteLossError(f"loss: the loss is {value} (non-finite); no gradient was touched and nothing "
                                     "was kept for backward (lower the learning rate, check the inputs)", value)
        if self.training:
            self._record_weights()  # the weights this state belongs to (backward refuses others)
        return np.float64(value)  # a float with torch's 0-d tensor's .item()

    def backward(self) -> None:
        """The backward pass of the last :meth:`loss` in training mode: adds the gradient of that loss
        to every parameter's gradient (``named_parameters()``, ``gradients()``).

        Raises:
            NoTrainingStateError: no training loss since the last backward (eval mode, no loss, or a
                second backward).
            WeightsChangedError (a NoTrainingStateError): the weights were written since the loss (an
                optimizer ``step()``, ``load_state_dict``): the state is dropped, run the loss again.
                Values assigned into ``p.data`` by hand are not detected.
        """
        from .module import NoTrainingStateError

        if not self.training or not self._impl.has_training_state:
            raise NoTrainingStateError("backward: no training loss to differentiate (call model.train(), then "
                                       "model.loss(input_ids, labels); each loss has one backward)")
        self._check_recorded_weights()
        self._impl.backward()

    def save_pretrained(self, directory) -> None:
        """Writes ``config.json`` and ``model.safetensors`` (the checkpoint's names and layouts, as
        Hugging Face's ``save_pretrained``), and ``generation_config.json`` when the model holds
        one (``model.generation_config``, from ``from_pretrained``; without one, an earlier save's
        file is removed; so are an earlier sharded save's index and shard files):
        ``transformers``' ``from_pretrained`` loads the directory, and so does this class's.

        The save is all or nothing (see :func:`transformer_core.checkpoints.save_pretrained_files`):
        each file is written whole under a temporary name in ``directory``, then renamed into place,
        the weights first and ``config.json`` last, the previous files kept until every rename is
        done, so a save that fails (a full disk, a file-size limit, a failed rename, a
        KeyboardInterrupt) leaves the directory's previous files as they were. Only a power loss or
        a killed process during the renames, or a second I/O error while the previous files are
        put back (the error's notes say which), can leave new weights beside the old config (the
        old files then lie beside them as hidden ``.{name}.*.bak`` files).

        Raises:
            OSError: the directory or a file cannot be written (naming it; the cause chained).
            TypeError: ``directory`` not a str or path; a ``generation_config`` value (or, for
                GPT-2, whose ``config.json`` keeps them, a ``config.extra`` value) that JSON cannot
                write (an array, a set, an object; numpy scalars are written as Python numbers),
                naming it (``config.extra['x']``, ``generation_config['eos_token_id']``), before
                anything is written.
            ValueError: such a value that contains itself, naming it.
        """
        from .checkpoints import save_pretrained_files

        save_pretrained_files(directory, self.config.to_dict(), self._checkpoint_state(),
                              generation_config=getattr(self, "generation_config", None))

    def _checkpoint_state(self) -> dict:
        """The weights under the checkpoint's names, as views to write (:meth:`_checkpoint_tensors`)."""
        return self._checkpoint_tensors()


def _check_labels(labels, shape: tuple, vocab_size: int, ignore_index: int) -> np.ndarray:
    """``labels`` as int64 ``shape``, each in ``[0, vocab_size)`` or ``ignore_index`` (ValueError
    naming the first bad position otherwise; TypeError for non-integer labels)."""
    lab = as_ids(labels, "labels", shape=shape, shape_of="input_ids'")
    bad = (lab != ignore_index) & ((lab < 0) | (lab >= vocab_size))
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"labels: expected values in [0, {vocab_size}) or ignore_index ({ignore_index}), "
                         f"got {int(lab[pos])} at {pos}")
    return lab
