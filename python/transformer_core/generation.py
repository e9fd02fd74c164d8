"""Autoregressive generation, one module for every causal LM (as Hugging Face's ``GenerationMixin``):
the prompt once through the model, then one token per step with the KV cache.

Each step turns the last position's logits into the next token (Hugging Face's order of logits
processors):

    repetition_penalty   score / p for tokens already in the sequence (score · p if negative);
                         a row's left padding (the positions before its first 1 in
                         ``attention_mask``) is not counted, as Hugging Face's ``generate``
    greedy               argmax, or, with do_sample:
    temperature          scores / T
    top_k                keep the k highest (default 50, Hugging Face's ``GenerationConfig``; 0 or
                         None: no top-k filter)
    top_p                keep the smallest set of highest-probability tokens whose mass reaches p
                         (of tokens tied at the cut, the later ids are kept: Hugging Face's
                         ``TopPLogitsWarper`` with a stable sort; its own ``torch.sort`` is not
                         stable, so its order among ties is unspecified)
    sample               from softmax(scores), numpy's generator seeded with ``seed`` (default:
                         :func:`transformer_core.module.sampling_seed`: from
                         :func:`transformer_core.manual_seed`'s generator once it was seeded,
                         else fresh entropy, as torch's)

A decoding option the caller does not pass (``do_sample``, ``temperature``, ``top_k``, ``top_p``,
``repetition_penalty``, ``eos_token_id``, ``pad_token_id``) is the model's ``generation_config``
value (a directory's ``generation_config.json``, as Hugging Face's ``generate`` reads it), else the
default above. The file's other fields that change Hugging Face's tokens (``no_repeat_ngram_size``,
``min_new_tokens``, ``num_beams`` > 1, ...: :data:`UNAPPLIED_GENERATION_FIELDS`) are not applied
here: a ``UserWarning`` names them.

Positions: a left-padded prompt's tokens are given the positions counted over its real tokens
(``cumsum(attention_mask) - 1``, passed to ``forward`` as ``position_ids``, as Hugging Face's
``prepare_inputs_for_generation``), so each row gets the tokens of the row alone.

A sequence that emits an end token (``eos_token_id``, one id or several) is finished; it is padded
with ``pad_token_id`` (default: the generation config's or the config's, else the first end id,
as Hugging Face) while the others go on, and generation stops when all are finished or after
``max_new_tokens``. Without an ``attention_mask``, a prompt that holds ``pad_token_id`` (one that
is not an end id) has its pads masked, as Hugging Face infers the mask.
:meth:`GenerationMixin.stream` yields each step's tokens as they are produced.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Iterator

import numpy as np

from ._validation import (
    _cut,
    _is_torch_tensor,
    as_bool,
    as_ids,
    check_bool,
    check_float,
    check_int,
    check_token_ids,
    described,
    ids_shape,
    is_int,
    physical_memory_bytes,
    to_numpy,
    user_stacklevel,
)
from .kv_cache import KVCache
from .module import sampling_seed

__all__ = ["GenerationMixin", "GenerationConfig", "MODEL_DEFAULT"]

#: Float64 arrays of the logits' size ``(N, vocab_size)`` alive at once while a step chooses its
#: tokens: the float64 copy of the logits that :func:`next_tokens` is given, and, when sampling,
#: its temporaries (the shifted and scaled scores, top-k's partition and filter, top-p's sort
#: order, sorted probabilities and cumulative mass, the softmax's exponentials: 6.25 more at the
#: peak, measured with top-k and top-p), rounded up.
GREEDY_SCORE_ARRAYS = 1
SAMPLING_SCORE_ARRAYS = 8


class _ModelDefault:
    """The default of ``generate``'s and ``stream``'s decoding options and end and pad ids: the
    value of the model's ``generation_config`` (a directory's ``generation_config.json``), else the
    built-in default (:data:`DECODING_DEFAULTS`; the ids: the config's)."""

    def __repr__(self) -> str:
        """``MODEL_DEFAULT``, as signatures and errors show it."""
        return "MODEL_DEFAULT"

    def __reduce__(self) -> str:
        """Pickled as the module's name for it: unpickled, it is ``MODEL_DEFAULT`` itself (``is``
        tells "not passed")."""
        return "MODEL_DEFAULT"

    def __copy__(self) -> "_ModelDefault":
        """Itself: one object."""
        return self

    def __deepcopy__(self, memo) -> "_ModelDefault":
        """Itself: one object."""
        return self


#: "Not passed": a decoding option (or an end or pad id) left to the model's ``generation_config``;
#: None passed is a value (no end id, no penalty, ...), as in Hugging Face's ``generate``.
MODEL_DEFAULT = _ModelDefault()

#: The decoding options ``generate`` takes from the model's ``generation_config`` when the caller
#: passes none (Hugging Face's ``generate`` takes every field of it so; those it has and this one
#: does not apply: :data:`UNAPPLIED_GENERATION_FIELDS`), and the values used when the
#: generation config has none either (absent or null): Hugging Face's defaults (its ``top_p`` 1.0
#: and ``repetition_penalty`` 1.0 are None here: no filter, no penalty).
DECODING_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": None, "repetition_penalty": None}


def _given(value) -> bool:
    """A field that acts whenever it is set (an id, a number), a list or dict when not empty."""
    return len(value) > 0 if isinstance(value, (list, tuple, dict, str)) else True


#: The fields of a ``generation_config.json`` that change the tokens of Hugging Face's ``generate``
#: (transformers 5's ``GenerationConfig``: its logits processors and warpers, stopping criteria and
#: decoding methods) and that this ``generate`` does not apply: field -> (whether a value, not null,
#: acts, as Hugging Face's ``_get_logits_processor`` tests it; whether only when sampling, as its
#: warpers). ``generate`` and ``stream`` warn about those the model's file holds. Not listed: those
#: applied here (``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, the
#: end and pad ids), ``max_length`` and ``max_new_tokens`` (the caller's ``max_new_tokens`` wins
#: over them, as there), beam-search-only fields (``length_penalty``, ``early_stopping``: with
#: ``num_beams`` 1 they change nothing), ``renormalize_logits`` (a log-softmax after the other
#: processors: neither the argmax nor the sampled distribution changes), and fields that do not
#: choose tokens (caching, outputs, assistant models).
UNAPPLIED_GENERATION_FIELDS = {
    "min_length": (lambda v: v > 0, False), "min_new_tokens": (lambda v: v > 0, False),
    "no_repeat_ngram_size": (lambda v: v > 0, False), "encoder_no_repeat_ngram_size": (lambda v: v > 0, False),
    "encoder_repetition_penalty": (lambda v: v != 1, False), "bad_words_ids": (_given, False),
    "sequence_bias": (_given, False), "forced_bos_token_id": (_given, False), "forced_eos_token_id": (_given, False),
    "remove_invalid_values": (lambda v: v is True, False), "exponential_decay_length_penalty": (_given, False),
    "suppress_tokens": (_given, False), "begin_suppress_tokens": (_given, False),
    "guidance_scale": (lambda v: v != 1, False), "watermarking_config": (_given, False),
    "token_healing": (lambda v: v is True, False), "stop_strings": (_given, False), "max_time": (_given, False),
    "num_return_sequences": (lambda v: v > 1, False), "num_beams": (lambda v: v > 1, False),
    "num_beam_groups": (lambda v: v > 1, False), "diversity_penalty": (lambda v: v != 0, False),
    "penalty_alpha": (lambda v: v > 0, False), "dola_layers": (_given, False), "constraints": (_given, False),
    "force_words_ids": (_given, False),
    # Hugging Face's sampling warpers: applied only when sampling
    "min_p": (_given, True), "top_h": (_given, True), "typical_p": (lambda v: v < 1, True),
    "epsilon_cutoff": (lambda v: 0 < v < 1, True), "eta_cutoff": (lambda v: 0 < v < 1, True),
}


def unapplied_generation_fields(generation_config, sampling: bool) -> list[str]:
    """The fields of ``generation_config`` (a ``generation_config.json`` as a dict, or None) that
    would change Hugging Face's tokens and that this ``generate`` does not apply
    (:data:`UNAPPLIED_GENERATION_FIELDS`; those of its sampling warpers only when ``sampling``), as
    ``field=value`` in the file's order. A value of a type the test does not take (a str where a
    number is expected) counts as active: it is not applied either."""
    found = []
    for key, value in (generation_config or {}).items():
        if key not in UNAPPLIED_GENERATION_FIELDS or value is None:
            continue
        active, sampling_only = UNAPPLIED_GENERATION_FIELDS[key]
        if sampling_only and not sampling:
            continue
        try:
            on = bool(active(value))
        except (TypeError, ValueError):
            on = True
        if on:
            found.append(f"{key}={_cut(repr(value), 60)}")
    return found


def cache_too_large(error: ValueError, what: str, one_fits: bool) -> ValueError:
    """The error for a KV cache that ``input_ids`` (``what``: its batch, and the lengths that size
    the cache) needs and this machine cannot hold: KVCache's own ``error`` names its arguments
    (num_layers, batch, ...), which the caller never passed. The advice: fewer sequences at a time
    when the cache of one sequence of that length fits (``one_fits``), else a shorter sequence."""
    advice = "pass fewer sequences at a time" if one_fits else "pass a shorter sequence"
    return ValueError(f"input_ids: {what} needs a KV cache too large for this machine ({error}); {advice}")


def cache_bytes_per_position(num_layers: int, num_key_value_heads: int, head_dim: int, dtype) -> int:
    """Bytes a KV cache holds for one position of one sequence: keys and values of every layer
    (a model of no layers still holds one, as the C++ cache)."""
    return 2 * max(num_layers, 1) * num_key_value_heads * head_dim * np.dtype(dtype).itemsize


# ------------------------------------------------------------------------------------------------
# The checks of each option (``name``: the argument, or the generation config's field)
# ------------------------------------------------------------------------------------------------
def _check_logits(logits: np.ndarray, step: int, do_sample: bool) -> None:
    """ValueError when a row of a step's next-token ``logits (N, V)`` leaves no token to choose: a
    NaN in it, or -inf everywhere, or (sampling, whose softmax it makes undefined) a +inf. Greedy
    decoding took the argmax of such a row silently (the first NaN, or token 0), as transformers'
    does; sampling failed in numpy's words. A -inf (a masked token) is fine, and so is a +inf when
    greedy: its argmax is that token, as transformers'."""
    with np.errstate(invalid="ignore"):
        bad = np.isnan(logits).any(axis=1) | np.isneginf(logits).all(axis=1)
        if do_sample:
            bad |= np.isposinf(logits).any(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)
        held = "NaN or +inf" if do_sample else "NaN"
        raise ValueError(f"generate: step {step}: the next-token logits of row(s) {rows[:5].tolist()}"
                         f"{' ...' if rows.size > 5 else ''} hold {held}, or are -inf everywhere: no token can "
                         "be chosen (the model's weights or its inputs hold non-finite values)")


def check_temperature(value, name: str = "temperature") -> float:
    """``value`` as a sampling temperature: any finite number > 0, as Hugging Face's
    ``TemperatureLogitsWarper`` (:func:`next_tokens` subtracts each row's maximum before it
    divides, so no temperature overflows: a tiny one leaves the top token alone, the others at
    probability 0). TypeError: not a number; ValueError: NaN, infinite, or <= 0."""
    number = check_float(value, name)
    if number <= 0:
        raise ValueError(f"{name}: expected a finite number > 0 (a temperature divides the logits; the limit "
                         f"temperature -> 0 is greedy decoding: do_sample=False), got {number!r}")
    return number


def check_top_k(value, name: str = "top_k") -> int | None:
    """``value`` as a top-k filter: None (0 and None: no filter) or an int >= 1.
    TypeError: neither None nor an int; ValueError: negative."""
    return None if value is None else check_int(value, name, 0) or None


def check_top_p(value, name: str = "top_p") -> float | None:
    """``value`` as a top-p filter: None or a number in [0, 1], as Hugging Face's
    ``TopPLogitsWarper`` (0 keeps the top token only; 1 or None: no filter). TypeError: not a
    number; ValueError: NaN or outside [0, 1] (a probability mass)."""
    return None if value is None else check_float(value, name, minimum=0.0, maximum=1.0)


def check_repetition_penalty(value, name: str = "repetition_penalty") -> float | None:
    """``value`` as a repetition penalty: None or any finite number > 0, as Hugging Face's
    ``RepetitionPenaltyLogitsProcessor`` (1 or None: none; a score that ``score / penalty`` or
    ``score * penalty`` would overflow saturates at the largest float64: :func:`next_tokens`).
    TypeError: not a number; ValueError: NaN, infinite, or <= 0."""
    if value is None:
        return None
    number = check_float(value, name)
    if number <= 0:
        raise ValueError(f"{name}: expected a finite number > 0 (it divides positive scores and multiplies "
                         f"negative ones; 1 = no penalty), got {number!r}")
    return number


def check_seed(value, name: str = "seed") -> int | None:
    """``value`` as a seed: None or an int >= 0."""
    return None if value is None else check_int(value, name, 0)


def _check_unused_sampling_types(temperature, top_k, top_p, seed, names: dict) -> None:
    """The types of sampling options that greedy decoding does not use: their values are not
    checked (Hugging Face only warns that they are ignored), their types are (a str temperature is
    a mistake either way). ``names``: each option's name for the message.

    Raises:
        TypeError: ``temperature`` or ``top_p`` neither None nor a number, ``top_k`` or ``seed``
        neither None nor an int.
    """
    for value, key, number in ((temperature, "temperature", True), (top_p, "top_p", True),
                               (top_k, "top_k", False), (seed, "seed", False)):
        if value is None:
            continue
        if number and (isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real)):
            raise TypeError(f"{names[key]}: expected a number, got {described(value)}")
        if not number and not is_int(value):
            raise TypeError(f"{names[key]}: expected an int or None, got {described(value)}")


class GenerationConfig:
    """Checked generation options (see :meth:`GenerationMixin.generate` for their meaning). Every
    option is checked, sampling ones included when ``do_sample`` is False (``generate`` itself
    checks only their types then: greedy decoding ignores them).

    ``seed`` None: ``np.random.default_rng(None)``, fresh OS entropy, when :func:`next_tokens` is
    driven directly; :meth:`GenerationMixin.generate` first replaces it with
    :func:`transformer_core.module.sampling_seed`'s.

    Raises:
        TypeError / ValueError: naming the option (``max_new_tokens`` < 1, ``temperature`` not a
        finite number > 0, ``top_k`` < 0, ``top_p`` outside [0, 1], ``repetition_penalty`` not a
        finite number > 0, ids that are not ints >= 0). Ids are checked against a
        vocabulary by :meth:`GenerationMixin.generate`, which knows it.
    """

    def __init__(self, max_new_tokens: int, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = 50, top_p: float | None = None, repetition_penalty: float | None = None,
                 seed: int | None = None, eos_token_id=None, pad_token_id: int | None = None):
        self.max_new_tokens = check_int(max_new_tokens, "max_new_tokens", 1)
        self.do_sample = check_bool(do_sample, "do_sample")
        self.temperature = check_temperature(temperature)
        # Hugging Face's default 50; 0 turns the filter off there, None does here too
        self.top_k = check_top_k(top_k)
        self.top_p = check_top_p(top_p)
        self.repetition_penalty = check_repetition_penalty(repetition_penalty)
        self.seed = check_seed(seed)
        # an array or a tensor of ids (Hugging Face's generate takes a tensor) as its plain ints
        if isinstance(eos_token_id, np.ndarray) or _is_torch_tensor(eos_token_id):
            eos_token_id = to_numpy(eos_token_id, "eos_token_id").tolist()
        eos = check_token_ids(eos_token_id, "eos_token_id")
        if eos is None:
            self.eos_ids = np.zeros(0, np.int64)
        else:
            self.eos_ids = np.array(list(eos) if isinstance(eos, (list, tuple)) else [eos], np.int64)
        self.pad_token_id = None if pad_token_id is None else check_int(pad_token_id, "pad_token_id", 0)


def _softmax(scores: np.ndarray) -> np.ndarray:
    """Row softmax in float64; -inf entries get probability 0."""
    m = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - m)
    return e / e.sum(axis=-1, keepdims=True)


def next_tokens(scores: np.ndarray, sequences: np.ndarray, cfg: GenerationConfig,
                rng: np.random.Generator, prompt_ignore_length: np.ndarray | None = None) -> np.ndarray:
    """The next token of each row from the last position's logits.

    Args:
        scores: ``(N, V)`` logits (float64, a copy: modified).
        sequences: ``(N, T)`` the ids so far (prompt and generated), for the repetition penalty.
        cfg: the options.
        rng: numpy generator for sampling.
        prompt_ignore_length: ``(N,)`` int, or None (0 for every row): the leading positions of
            each row of ``sequences`` that the repetition penalty does not count (the left
            padding; Hugging Face's ``RepetitionPenaltyLogitsProcessor(prompt_ignore_length=...)``).

    A finite score that the repetition penalty would overflow (only for extreme values: a score of
    3e38, float32's largest, with a penalty below 1.9e-270) saturates at the largest float64,
    where Hugging Face's float32 scores become inf.

    Returns:
        ``(N,)`` int64 token ids.
    """
    if cfg.repetition_penalty is not None and cfg.repetition_penalty != 1.0:
        counted, rows = sequences, np.arange(scores.shape[0])[:, None]
        if prompt_ignore_length is not None:
            # an ignored position repeats its row's last id (counted anyway), so it penalizes nothing
            # more; a row whose every position is ignored is left out
            ignore = np.asarray(prompt_ignore_length)
            kept = ignore < sequences.shape[1]
            ignored = np.arange(sequences.shape[1])[None, :] < ignore[kept, None]
            counted, rows = np.where(ignored, sequences[kept, -1:], sequences[kept]), rows[kept]
        # a repeated id is gathered from the unpenalized scores each time: penalized once
        hit = scores[rows, counted]
        with np.errstate(over="ignore"):
            penalized = np.where(hit < 0, hit * cfg.repetition_penalty, hit / cfg.repetition_penalty)
        # a finite score the penalty overflows (3e38 / 1e-300) saturates at the largest float64, so that
        # no row holds +inf (NaN probabilities) or turns -inf everywhere; in range, Hugging Face's values
        overflow = np.isinf(penalized) & np.isfinite(hit)
        penalized[overflow] = np.copysign(np.finfo(np.float64).max, penalized[overflow])
        scores[rows, counted] = penalized
    if not cfg.do_sample:
        return scores.argmax(axis=-1).astype(np.int64)
    # softmax(s / T) = softmax((s - max s) / T): the shift first keeps every entry <= 0, so no
    # division can overflow to +inf (an entry far below the max may become -inf: probability 0)
    with np.errstate(over="ignore"):  # float64 logits near -1e308: -inf after the shift, probability 0
        scores = (scores - scores.max(axis=-1, keepdims=True)) / cfg.temperature
    if cfg.top_k is not None:
        k = min(cfg.top_k, scores.shape[-1])
        kth = np.partition(scores, -k, axis=-1)[:, -k][:, None]
        scores = np.where(scores < kth, -np.inf, scores)
    if cfg.top_p is not None and cfg.top_p < 1.0:
        # Hugging Face's TopPLogitsWarper with a stable sort: an ascending sort (stable here: of
        # tied scores, the lower id first; HF's torch.sort is not stable, so its order among ties is
        # unspecified), then drop from the bottom every token whose cumulative mass is <= 1 - top_p;
        # the highest-ranked token is always kept. Of tokens tied at the cut, the higher ids survive.
        order = np.argsort(scores, axis=-1, kind="stable")
        sorted_probs = _softmax(np.take_along_axis(scores, order, axis=-1))
        drop_sorted = np.cumsum(sorted_probs, axis=-1) <= 1.0 - cfg.top_p
        drop_sorted[:, -1] = False
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        scores = np.where(drop, -np.inf, scores)
    probs = _softmax(scores)
    return np.array([rng.choice(probs.shape[-1], p=p / p.sum()) for p in probs], dtype=np.int64)


def generation_ids(model) -> tuple[list, object]:
    """``(eos ids, pad id)`` as Hugging Face's ``generate`` takes them: from the model's
    ``generation_config`` (a directory's ``generation_config.json``, kept by ``from_pretrained``)
    when it has one, a key it leaves out or null meaning none; from ``model.config`` when it has
    none (``generation_config`` None or absent). The end ids as a list (one id, a list of ids, or
    none: ``[]``), as given (callers keep those of the vocabulary); the pad id as given, or None."""
    own = getattr(model, "generation_config", None)
    source = (lambda key: getattr(model.config, key, None)) if own is None else own.get
    eos = source("eos_token_id")
    return ([eos] if isinstance(eos, (int, np.integer)) else list(eos or [])), source("pad_token_id")



def decoding_options(model, do_sample, temperature, top_k, top_p, repetition_penalty) -> tuple[dict, dict]:
    """The decoding options of a ``generate`` call, unchecked: each one the caller passed as given;
    each one left to :data:`MODEL_DEFAULT` the value of ``model.generation_config`` (a
    directory's ``generation_config.json``, kept by ``from_pretrained``) when it has one (a key
    left out or null: none), else :data:`DECODING_DEFAULTS`' (Hugging Face's ``generate``: the
    caller's arguments, then the model's generation config, then the library's defaults).

    Returns:
        ``(values, names)``: dicts keyed by the option (``"do_sample"``, ``"temperature"``, ...):
        its value, and the name its errors give: the argument's (``"temperature"``), or the
        generation config's field (``"generation_config.json: temperature"``).
    """
    own = getattr(model, "generation_config", None) or {}
    values, names = {}, {}
    for key, value in (("do_sample", do_sample), ("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                       ("repetition_penalty", repetition_penalty)):
        name = key
        if value is MODEL_DEFAULT:
            value = own.get(key)
            if value is None:
                value = DECODING_DEFAULTS[key]
            else:
                name = f"generation_config.json: {key}"
        values[key], names[key] = value, name
    return values, names


def _ignored_sampling_options(given: dict) -> list[str]:
    """The sampling options the caller passed (``given``: name to value) that greedy decoding
    (``do_sample`` False) ignores, as ``name=value``: those Hugging Face's ``GenerationConfig.validate``
    flags ("The following generation flags are not valid and may be ignored") — ``temperature``
    other than 1, ``top_k`` other than None and its default 50, ``top_p`` other than None and 1 —
    and ``seed`` given (a seed of ours: only sampling draws from the generator). A generation
    config's values are not the caller's: Hugging Face does not warn about them either."""
    flagged = {"temperature": lambda v: v is not None and v != 1.0, "top_k": lambda v: v is not None and v != 50,
               "top_p": lambda v: v is not None and v != 1.0, "seed": lambda v: v is not None}
    return [f"{key}={given[key]!r}" for key, flags in flagged.items() if key in given and flags(given[key])]


class GenerationMixin:
    """``generate`` and ``stream`` for a causal LM whose ``forward(ids, attention_mask=...,
    position_ids=..., past_key_values=..., use_cache=True, logits_to_keep=1)`` returns logits (its
    positions ``past .. past + L - 1`` when ``position_ids`` is None), with ``new_cache``,
    ``context_length``, ``dtype``, ``check_activations``, ``_model_cache(past_key_values, N)`` (a
    checked :class:`KVCache`, legacy tuples converted) and ``config.vocab_size`` /
    ``config.eos_token_id`` (and, if the config has one, ``config.pad_token_id``).

    **Context.** The last generated token is returned but never fed back, so a prompt of length L
    and ``max_new_tokens`` new tokens need ``L + max_new_tokens - 1`` positions: they must fit the
    context (as Hugging Face's ``generate``, which returns ``context + 1`` ids for a prompt that
    fills the context and one new token)."""

    def stream(self, input_ids, max_new_tokens: int, *, do_sample: bool = MODEL_DEFAULT,
               temperature: float = MODEL_DEFAULT, top_k: int | None = MODEL_DEFAULT,
               top_p: float | None = MODEL_DEFAULT, repetition_penalty: float | None = MODEL_DEFAULT,
               seed: int | None = None, attention_mask=None, eos_token_id=MODEL_DEFAULT,
               pad_token_id: int | None = MODEL_DEFAULT, past_key_values=None) -> Iterator[np.ndarray]:
        """Yields the next token of every sequence, ``(N,)`` int64, one step at a time (finished
        sequences yield ``pad_token_id``); the arguments (and their defaults from the model's
        ``generation_config``) as :meth:`generate`. Every argument is checked when ``stream`` is
        called, before the first step and before any memory is reserved.

        With ``past_key_values`` (a :class:`KVCache` holding a prefix of ``input_ids``, e.g. the
        earlier turns of a chat), only the uncached suffix is run; the cache is extended in place.
        Hugging Face's legacy tuple of per-layer ``(keys, values)`` is accepted too, as ``forward``
        accepts it: it is copied into a new cache (the tuple itself is not changed).

        Raises:
            As :meth:`generate` (and warns as it: sampling options given with ``do_sample=False``,
            fields of ``generation_config.json`` that are not applied).
        """
        ids, mask, cache, cfg = self._start(input_ids, max_new_tokens, do_sample, temperature, top_k, top_p,
                                            repetition_penalty, seed, attention_mask, eos_token_id, pad_token_id,
                                            past_key_values)
        return self._steps(ids, mask, cache, cfg)

    def _start(self, input_ids, max_new_tokens, do_sample, temperature, top_k, top_p, repetition_penalty, seed,
               attention_mask, eos_token_id, pad_token_id, past_key_values):
        """Every check of :meth:`stream` and :meth:`generate`, each before anything it guards is
        allocated, then the warnings (ignored sampling options, generation config fields not
        applied), then the cache (the caller's is grown only now), then the sampling seed when none
        is given (:func:`~transformer_core.module.sampling_seed`: last, so that a refused call draws
        none). ``generate`` and ``stream`` call it directly, so that the warnings point at their
        caller.

        Returns:
            ``(ids (N, L) int64, mask (N, L) bool or None, cache, cfg)``.
        """
        # the prompt's shape first: as_ids copies it to int64 (a broadcast view of 10**9 ids: 8 GB),
        # which the length and memory checks below refuse before it is made
        prompt = to_numpy(input_ids, "input_ids")
        N, L = ids_shape(prompt, "input_ids")  # the rank and the dtype, no copy
        context = self.context_length
        if L > context:
            raise ValueError(f"input_ids: prompt length {L} exceeds the context ({self._context_field} = {context})")
        cfg, ignored = self._generation_config(max_new_tokens, do_sample, temperature, top_k, top_p,
                                               repetition_penalty, seed, eos_token_id, pad_token_id)
        total = L + cfg.max_new_tokens - 1  # positions the model sees: the last new token is never fed back
        if total > context:
            raise ValueError(f"max_new_tokens: prompt length {L} + {cfg.max_new_tokens} exceeds the context "
                             f"({self._context_field} = {context}); at most {context - L + 1} new tokens fit (the "
                             f"last one is not fed back)")
        what = (f"a batch of {N} sequences of prompt length {L} and max_new_tokens = {cfg.max_new_tokens} ({total} "
                f"positions each)")
        self.check_activations(N, L, what)  # the prompt's step is the widest
        self._check_scores(N, cfg.do_sample, what)
        if attention_mask is not None:  # its shape before the ids' copy (its dtype and values: _prompt_mask)
            given = to_numpy(attention_mask, "attention_mask").shape  # an array or a tensor: no copy
            if (given if len(given) != 1 else (1, *given)) != (N, L):
                raise ValueError(f"attention_mask: expected shape {(N, L)} (input_ids'), got {given}")
        ids = as_ids(prompt, "input_ids")
        vocab = self.config.vocab_size
        if ids.min() < 0 or ids.max() >= vocab:  # here, not at the first step: before a cache is reserved or
            bad = np.flatnonzero((ids < 0) | (ids >= vocab))  # grown (min/max: no temporary of ids' size)
            raise ValueError(f"input_ids: id {ids.flat[bad[0]]} at flat index {bad[0]} is outside the vocabulary "
                             f"[0, {vocab})")
        mask = self._prompt_mask(attention_mask, ids, cfg)
        # the caller's cache checked (a legacy tuple converted), not changed yet
        cache = None if past_key_values is None else self._generation_cache(past_key_values, N, L)
        # every argument is good, nothing is changed yet; greedy decoding would ignore these
        # silently (Hugging Face warns too). Before the cache grows: a warning turned into an
        # error leaves the caller's cache as it was.
        if ignored:
            warnings.warn(f"do_sample=False (greedy decoding) ignores the sampling options {', '.join(ignored)}; "
                          f"pass do_sample=True to sample with them", UserWarning, stacklevel=3)
        unapplied = unapplied_generation_fields(getattr(self, "generation_config", None), cfg.do_sample)
        if unapplied:
            one = len(unapplied) == 1
            warnings.warn(f"generation_config.json: {', '.join(unapplied)} {'is' if one else 'are'} not applied: this "
                          f"generate implements do_sample, temperature, top_k, top_p, repetition_penalty and the end "
                          f"and pad ids only, so its tokens may differ from Hugging Face's generate, which applies "
                          f"{'it' if one else 'them'}", UserWarning, stacklevel=user_stacklevel())
        # Every position the generation may need is reserved now, not as it goes: a cache that
        # cannot hold them is refused here, before the prompt's step, and no step stops to copy
        # the cache into a larger one. The reservation is address space: only the positions
        # written become resident (KVCache), so a generation stopped early by its end token holds
        # memory for the tokens it made, not for max_new_tokens.
        if cache is None:
            try:
                cache = self.new_cache(N, total)
            except ValueError as e:  # KVCache names its own arguments: name the caller's
                raise self._cache_too_large(e, self.new_cache(1), N, L, cfg.max_new_tokens, what,
                                            given=False) from None
        else:
            try:
                cache.reserve(total)
            except ValueError as e:
                raise self._cache_too_large(e, cache, N, L, cfg.max_new_tokens, what, given=True) from None
        if cfg.do_sample and cfg.seed is None:  # as torch's generate, from the generator manual_seed seeds
            cfg.seed = sampling_seed()
        return ids, mask, cache, cfg

    @staticmethod
    def _cache_too_large(error: ValueError, sizes: KVCache, N: int, L: int, max_new_tokens: int,
                         what: str, given: bool) -> ValueError:
        """The error for a KV cache of ``N`` sequences of ``L + max_new_tokens - 1`` positions that
        this machine cannot hold (``error``: KVCache's, naming its own arguments), naming what to
        change:

        * ``max_new_tokens``, when even one sequence of that length does not fit (N = 1 included),
          with the number of new tokens that fit;
        * ``input_ids``, when even its prompt alone does not fit one sequence's cache;
        * ``past_key_values`` (``given``: the caller's cache was growing), when the positions fit
          but that cache, growing to twice its capacity, does not;
        * else ``input_ids`` and its batch (:func:`cache_too_large`): fewer sequences at a time.

        ``sizes``: a cache of the model's layers, heads and dtype (the caller's, or an empty one),
        whose bytes per position (keys and values of every layer) decide."""
        layers_held = max(len(sizes), 1)  # as the C++ cache: a model of no layers still holds one
        per_position = cache_bytes_per_position(len(sizes), sizes.num_key_value_heads, sizes.head_dim, sizes.dtype)
        total = L + max_new_tokens - 1
        limit = physical_memory_bytes()
        if given and per_position * total * N <= limit:  # the positions fit, the growth (doubling) did not
            return ValueError(f"past_key_values: {what} needs {per_position * total * N} bytes of KV cache, "
                              f"which fit this machine's memory ({limit} bytes), but the cache given grows to twice "
                              f"its capacity and that does not ({error}); pass past_key_values=None for a cache of "
                              "the size needed")
        if N > 1 and per_position * total <= limit:  # one sequence fits: the batch is the cause
            return cache_too_large(error, what, one_fits=True)
        layers = f"{layers_held} layer{'' if layers_held == 1 else 's'}"
        one = (f"for one sequence, {per_position} bytes a position (keys and values of {layers}), more than this "
               f"machine's memory ({limit} bytes)")
        fit = limit // per_position - L + 1  # new tokens whose positions fit one sequence's cache
        if fit < 1:
            return ValueError(f"input_ids: a prompt of length {L} needs a KV cache of {per_position * L} bytes {one}; "
                              "use a shorter prompt")
        at_most = f"at most {fit} new tokens fit"
        if N > 1:
            fit_batch = max(limit // (per_position * N) - L + 1, 0)
            at_most += f" (one sequence; {fit_batch} for a batch of {N})"
        return ValueError(f"max_new_tokens: prompt length {L} + max_new_tokens {max_new_tokens} ({total} positions) "
                          f"needs a KV cache of {per_position * total} bytes {one}; {at_most}")

    def _check_scores(self, N: int, sample: bool, what: str) -> None:
        """ValueError naming ``input_ids`` when choosing a step's tokens for ``N`` sequences would
        need more memory than this machine has: the model's ``(N, vocab_size)`` logits and the
        float64 arrays of their size that :func:`next_tokens` holds at once (``GREEDY_SCORE_ARRAYS``,
        or ``SAMPLING_SCORE_ARRAYS`` when ``sample``). Checked before a cache is made or grown, as
        :meth:`check_activations`; ``what`` describes the call."""
        vocab = self.config.vocab_size
        arrays = SAMPLING_SCORE_ARRAYS if sample else GREEDY_SCORE_ARRAYS
        dtype = np.dtype(self.dtype)
        need = N * vocab * (dtype.itemsize + 8 * arrays)
        limit = physical_memory_bytes()
        if need > limit:
            raise ValueError(f"input_ids: {what} needs logits of ({N}, vocab_size = {vocab}) {dtype.name} values and "
                             f"{arrays} float64 array(s) of that shape to choose each step's tokens "
                             f"({'sampling' if sample else 'greedy'}), {need} bytes, more than this machine's memory "
                             f"({limit} bytes): use a smaller batch")

    def _prompt_mask(self, attention_mask, ids: np.ndarray, cfg: GenerationConfig) -> np.ndarray | None:
        """The prompt's keep-mask, ``(N, L)`` bool (True = a real token), or None (all real).

        Without ``attention_mask``, as Hugging Face's ``_prepare_attention_mask_for_generation``:
        ``ids != pad_token_id`` when there is a pad id (``cfg.pad_token_id``: the caller's, the
        generation config's, the config's, else the first end id), it is not an end id, and the
        prompt holds it; else None.

        Raises:
            ValueError: ``attention_mask`` not of ``input_ids``' shape (the shape given named: a 1-D
            mask is one row), a row without a real token (only 0s; an inferred mask's: only pad
            ids), or a right-padded row (0 at its last position after a real token); the last two
            naming the row (an inferred mask's name ``input_ids`` and how the mask was inferred).
        """
        N, L = ids.shape
        if attention_mask is None:
            pad = cfg.pad_token_id
            if pad is None or pad in cfg.eos_ids.tolist():
                return None
            pads = ids == pad
            if not pads.any():
                return None
            mask, source = ~pads, (f"input_ids: without attention_mask, the mask is input_ids != pad_token_id "
                                   f"({pad}), as Hugging Face infers it")
            hint = "; pass attention_mask if the row's pad ids are real tokens"
        else:
            mask = as_bool(attention_mask, "attention_mask", allow_float=True)
            given = mask.shape
            mask = mask[None] if mask.ndim == 1 else mask
            if mask.shape != ids.shape:
                raise ValueError(f"attention_mask: expected shape {ids.shape} (input_ids'), got {given}")
            source, hint = "attention_mask", ""
        # a row of pads only would be continued from a pad attending to nothing (an arbitrary token:
        # Hugging Face accepts it silently, and its GPT-2's tokens differ from its Llama's)
        empty = np.flatnonzero(~mask.any(axis=1))
        if empty.size:
            r = int(empty[0])
            held = "0s" if attention_mask is not None else f"pad ids ({cfg.pad_token_id})"
            raise ValueError(f"{source}: expected at least one real token in each row, got row {r} of {held} only; "
                             f"there is no prompt to continue{hint}")
        # the first new token is predicted from the last position: it must be a real token of
        # every row that has one (a right-padded row would continue from a pad)
        right = np.flatnonzero(~mask[:, -1] & mask.any(axis=1))
        if right.size:
            r = int(right[0])
            raise ValueError(f"{source}: expected left padding (each row's pads before its tokens), got "
                             f"row {r} right-padded (its last real token at position "
                             f"{int(np.flatnonzero(mask[r])[-1])}, 0s after it to {L - 1}); the first new token "
                             f"is predicted from the last position{hint}")
        return mask

    def _generation_cache(self, past_key_values, N: int, L: int) -> KVCache:
        """``past_key_values`` as a checked :class:`KVCache` for ``input_ids (N, L)``: a KVCache as
        is, a legacy tuple/list of ``(keys, values)`` converted as ``forward`` converts it.

        Raises:
            TypeError: anything else; a cache of another dtype than the model's.
            ValueError: a legacy tuple of bad shapes; a cache of another batch or layer count; a
            cache that holds ``L`` positions or more (it must hold a prefix of ``input_ids``).
        """
        cache = self._model_cache(past_key_values, N)  # the host's (DecoderModel): converted and checked
        if cache.length >= L:
            raise ValueError(f"past_key_values: the cache holds {cache.length} positions, expected fewer than "
                             f"input_ids' {L}")
        return cache

    def _steps(self, ids: np.ndarray, mask, cache: KVCache, cfg: GenerationConfig) -> Iterator[np.ndarray]:
        """The decoding loop of :meth:`stream`, from checked arguments."""
        N = ids.shape[0]
        start = cache.length  # the caller's cache, put back as it came if a step's logits are refused
        rng = np.random.default_rng(cfg.seed)
        # the repetition penalty skips each row's left padding: the positions before its first real
        # token (Hugging Face's generate: (attention_mask != 0).argmax(1); a 0 after the first 1 is
        # counted, as there)
        lead = None if mask is None else mask.argmax(axis=1)
        # positions counted over the real tokens (forward would take past .. past + L - 1), as Hugging
        # Face's generate (cumsum(mask) - 1; at the pads, which no query reads, it puts 0), then the
        # last one + 1 at each step
        from .decoder import positions_from_mask  # decoder.py imports this module

        positions = None if mask is None else positions_from_mask(mask, cache.length)
        out = self(ids[:, cache.length:], attention_mask=mask, position_ids=positions, past_key_values=cache,
                   use_cache=True, logits_to_keep=1)
        sequences = ids
        finished = np.zeros(N, dtype=bool)
        for step in range(cfg.max_new_tokens):
            try:
                _check_logits(out.logits[:, -1], step, cfg.do_sample)
            except ValueError:
                cache.crop(start)  # the caller's cache as it came: a retry with it works
                raise
            nxt = next_tokens(out.logits[:, -1].astype(np.float64), sequences, cfg, rng, lead)
            if cfg.pad_token_id is not None:
                nxt = np.where(finished, cfg.pad_token_id, nxt)
            finished |= np.isin(nxt, cfg.eos_ids)
            yield nxt
            if finished.all() or step == cfg.max_new_tokens - 1:
                return
            sequences = np.concatenate([sequences, nxt[:, None]], axis=1)
            if mask is not None:
                mask = np.concatenate([mask, np.ones((N, 1), bool)], axis=1)
                positions = positions[:, -1:] + 1
            out = self(nxt[:, None], attention_mask=mask, position_ids=positions, past_key_values=cache,
                       use_cache=True, logits_to_keep=1)


    def generate(self, input_ids, max_new_tokens: int, do_sample: bool = MODEL_DEFAULT,
                 temperature: float = MODEL_DEFAULT, top_k: int | None = MODEL_DEFAULT,
                 top_p: float | None = MODEL_DEFAULT, seed: int | None = None, attention_mask=None,
                 eos_token_id=MODEL_DEFAULT, *, repetition_penalty: float | None = MODEL_DEFAULT,
                 pad_token_id: int | None = MODEL_DEFAULT, streamer=None,
                 past_key_values=None) -> np.ndarray:
        """Autoregressive decoding with a KV cache: the prompt once, then one token per step.

        **Defaults from the model's generation config.** ``do_sample``, ``temperature``, ``top_k``,
        ``top_p``, ``repetition_penalty``, ``eos_token_id`` and ``pad_token_id`` not passed
        (:data:`MODEL_DEFAULT`) are those of ``model.generation_config`` (a directory's
        ``generation_config.json``, read by ``from_pretrained``; Qwen's and Llama-Instruct's set
        sampling options there), as Hugging Face's ``generate`` takes them; a field it leaves out
        or null, or a model without one, gives the default named below. An argument passed wins,
        even None or a value equal to the default (``repetition_penalty=None``: no penalty,
        ``eos_token_id=None``: no end id, whatever the file says), as Hugging Face's. The file's
        values are checked as the arguments are, the errors naming the file and field
        (``generation_config.json: temperature``).

        **Fields of the generation config not applied.** The file's other fields that change
        Hugging Face's tokens are not applied here (:data:`UNAPPLIED_GENERATION_FIELDS`:
        ``min_length``, ``min_new_tokens``, ``no_repeat_ngram_size``, ``bad_words_ids``,
        ``suppress_tokens``, ``begin_suppress_tokens``, ``forced_bos_token_id``,
        ``forced_eos_token_id``, ``sequence_bias``, ``exponential_decay_length_penalty``,
        ``encoder_repetition_penalty``, ``guidance_scale``, ``num_beams`` > 1,
        ``num_return_sequences`` > 1, ``stop_strings``, ``max_time``, ...; when sampling ``min_p``,
        ``typical_p``, ``epsilon_cutoff``, ``eta_cutoff``, ``top_h``). A call whose model's file
        holds one (a value that acts: ``no_repeat_ngram_size`` > 0, ``num_beams`` > 1, ...) warns
        once, a ``UserWarning`` pointing at the caller's line that names each as
        ``generation_config.json: field=value``; the tokens are then this generate's, which may
        differ from Hugging Face's. The arguments cannot set them (a ``TypeError``, as for any
        unknown keyword).

        Args:
            input_ids: ``(N, L)`` prompt ids (left-padded, with ``attention_mask``, for a batch of
                different lengths). With greedy decoding the result then equals each prompt
                generated alone. Not with ``do_sample``: the rows draw in turn from one
                generator, so a row's samples depend on its place in the batch and the batch size
                (the same call with the same ``seed`` still repeats them).
            max_new_tokens: tokens to add (>= 1); ``L + max_new_tokens - 1`` (the positions the
                model sees: the last new token is not fed back) must fit the context.
            do_sample: sample from ``softmax(logits / temperature)`` after top-k / top-p
                filtering; else (default False; None too, as Hugging Face's) greedy (argmax).
                Greedy decoding does not use the
                sampling options: their values are not checked, only their types, and those the
                caller passes are ignored with a ``UserWarning`` naming them (``temperature`` other
                than 1, ``top_k`` other than None or 50, ``top_p`` other than None or 1, ``seed``),
                as Hugging Face warns ("The following generation flags are not valid and may be
                ignored"; it does not warn about the generation config's, nor does this).
            temperature, top_k, top_p: sampling controls (when sampling: temperature any finite
                number > 0, default 1, None: no scaling (1), as Hugging Face's (each row's maximum
                is subtracted before the division, so none overflows); top_k >= 0, default 50 as Hugging Face's
                ``generate`` (``do_sample=True`` samples among the 50 highest), 0 or None keeps
                every token; 0 <= top_p <= 1 (0 keeps the top token only, as Hugging Face's
                ``TopPLogitsWarper``), default None: no top-p filter).
            seed: an int >= 0 seeds numpy's generator for sampling (the same seed, the same
                tokens). None (the default): once the program called
                :func:`transformer_core.manual_seed` (or ``set_rng_state``), a seed is drawn from
                that generator (the one of the training forwards' dropout seeds), as torch's
                sampling draws from the generator ``torch.manual_seed`` seeds: after
                ``manual_seed(s)`` the same calls give the same tokens (not torch's tokens:
                numpy's sampler); before that, fresh entropy, different in every run, as torch's
                default generator (:func:`transformer_core.module.sampling_seed`). Greedy
                decoding draws nothing.
            attention_mask: ``(N, L)``, 1 = a real prompt token; left padding only (the first
                new token is predicted from the last position, which must be real), and at least
                one real token in every row. The real tokens take the positions counted over
                them (``cumsum(attention_mask) - 1``, passed to ``forward`` as ``position_ids``,
                as Hugging Face's ``generate``), so each row gets the tokens it gets alone.
                Default: inferred as Hugging Face's ``generate`` infers it, ``input_ids !=
                pad_token_id`` when the prompt holds ``pad_token_id`` and it is not an end id;
                else every token is real.
            eos_token_id: an id or a list of ids in ``[0, vocab_size)`` that end a sequence, or
                None (or ``[]``): none, generation runs ``max_new_tokens`` (as Hugging Face's
                ``eos_token_id=None``). Default (not passed): those of ``model.generation_config``
                (a directory's ``generation_config.json``, read by ``from_pretrained``) when the
                model has one, even where it leaves them out (then none), else the config's
                (``config.json``'s); ids outside the vocabulary dropped, as Hugging Face.
            repetition_penalty: any finite number > 0, as Hugging Face's (a score it would
                overflow saturates at the largest float64: :func:`next_tokens`); 1 or None (the
                default) = none (Keskar et al. 2019, as Hugging Face). The ids of the prompt
                and the new tokens count, but not a row's left padding: the positions before its
                first 1 in ``attention_mask`` (as Hugging Face's ``generate``; a 0 after the first
                1 counts). Greedy decoding uses it too.
            pad_token_id: an id in ``[0, vocab_size)`` that fills finished sequences. Default
                (not passed): the ``pad_token_id`` of ``generation_config.json`` when the model
                has one, else the config's (when it is an id of the vocabulary), else the first
                end id (Hugging Face's defaults). None: the first end id (none without end ids),
                as Hugging Face's ``pad_token_id=None``.
            streamer: Hugging Face's streamer protocol: an object with ``put`` and ``end``
                (transformers' ``TextStreamer``, ``TextIteratorStreamer``, any ``BaseStreamer``;
                ``TextStreamer`` takes this package's :class:`~transformer_core.tokenizer.Tokenizer`
                too) gets ``put(input_ids)`` (the ``(N, L)`` prompt), then ``put(tokens)`` with each
                step's ``(N,)`` int64 tokens as they are produced, then ``end()`` after the last,
                as Hugging Face's ``generate`` drives it (numpy arrays where it passes tensors). A
                plain callable (``list.append``) is called with each step's ``(N,)`` tokens only.
                None: no streaming.
            past_key_values: a :class:`KVCache` already holding a prefix of ``input_ids`` (extended
                in place), or Hugging Face's legacy tuple of per-layer ``(keys, values)``
                ``(N, H_kv, S, D)`` (copied into a new cache, as ``forward`` does). With a padded
                ``attention_mask``, the prefix's keys must have the positions ``generate`` gives
                it, those counted over its real tokens: fill it with ``forward(prefix,
                attention_mask=prefix_mask, position_ids=positions_from_mask(prefix_mask, 0),
                past_key_values=cache)`` (``forward``'s default positions ignore the mask).

        Returns:
            ``(N, L + new)`` int64 ids, prompt included (as Hugging Face returns them); fewer new
            tokens if every sequence finished early.

        Raises:
            All before the first token and before any memory is reserved for the generation (the
            warnings too, about ignored sampling options and generation config fields not
            applied: the caller's cache is grown after them):
            ValueError / TypeError: bad options (named, or named by the generation config's file
            and field; ``pad_token_id`` and ``eos_token_id`` ids outside ``[0, vocab_size)`` too);
            TypeError: a sampling option of the wrong type, also when greedy. ValueError naming
            ``attention_mask``: not of ``input_ids``' shape, a row without a real token (only 0s,
            naming the row: Hugging Face generates from the pads, an arbitrary token), or a
            right-padded row (0 at its last position after a real token, naming the row: Hugging
            Face only warns, and predicts from the pad); ValueError naming ``input_ids``: an id
            outside ``[0, vocab_size)``, a prompt longer than the context (from its shape, before
            it is copied), a row of the inferred mask that is all ``pad_token_id`` or ends with
            it (right padding: pass ``attention_mask``);
            naming ``max_new_tokens``: ``L + max_new_tokens - 1`` over the context, or a KV cache of
            that many positions larger than this machine's memory even for one sequence (saying
            how many new tokens fit).
            TypeError naming ``past_key_values``: neither None, a KVCache nor a legacy tuple/list,
            or a cache of another dtype than the model's; ValueError: a cache of another batch or
            layer count, or one that holds ``L`` positions or more. ValueError naming ``input_ids``
            (its batch size, prompt length and ``max_new_tokens``): the prompt step's activations,
            the logits with the float64 arrays that choose each step's tokens, or a KV cache for
            them larger than this machine's memory where one sequence's would fit (pass fewer
            sequences at a time); a prompt whose cache alone does not fit one sequence's. All
            before any is allocated.
            During decoding, ValueError: a step's logits of some row hold NaN (or, sampling, +inf),
            or are -inf everywhere (non-finite weights or inputs): no token can be chosen. Hugging
            Face's greedy decoding returns the first NaN's index there (token 0 for a row of NaN),
            silently. A ``past_key_values`` passed in is cropped back to its length before the call.
        """
        protocol = callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))
        if streamer is not None and not protocol and not callable(streamer):
            raise TypeError(f"streamer: expected an object with put() and end() (Hugging Face's streamers), a "
                            f"callable or None, got {type(streamer).__name__}")
        ids, mask, cache, cfg = self._start(input_ids, max_new_tokens, do_sample, temperature, top_k, top_p,
                                            repetition_penalty, seed, attention_mask, eos_token_id, pad_token_id,
                                            past_key_values)
        emit = streamer.put if protocol else streamer
        if protocol:
            streamer.put(ids)
        steps = [ids]
        for tokens in self._steps(ids, mask, cache, cfg):
            if emit is not None:
                emit(tokens)
            steps.append(tokens[:, None])
        if protocol:
            streamer.end()
        return np.concatenate(steps, axis=1)

    def _generation_config(self, max_new_tokens, do_sample, temperature, top_k, top_p, repetition_penalty, seed,
                           eos_token_id, pad_token_id) -> tuple[GenerationConfig, list[str]]:
        """The checked options of a call (those not passed from the model's generation config:
        :func:`decoding_options`), and the sampling options the caller passed that greedy decoding
        ignores (``name=value``, for the warning). Greedy: the sampling options' types are checked,
        not their values, and the config holds neutral ones (unused)."""
        values, names = decoding_options(self, do_sample, temperature, top_k, top_p, repetition_penalty)
        max_new_tokens = check_int(max_new_tokens, "max_new_tokens", 1)
        # None: Hugging Face's None, greedy and no temperature (its GenerationConfig.validate)
        sample = values["do_sample"] is not None and check_bool(values["do_sample"], names["do_sample"])
        penalty = check_repetition_penalty(values["repetition_penalty"], names["repetition_penalty"])
        if sample:
            temperature = values["temperature"]
            temperature = 1.0 if temperature is None else check_temperature(temperature, names["temperature"])
            sampling = dict(temperature=temperature,
                            top_k=check_top_k(values["top_k"], names["top_k"]),
                            top_p=check_top_p(values["top_p"], names["top_p"]), seed=check_seed(seed))
            ignored = []
        else:
            _check_unused_sampling_types(values["temperature"], values["top_k"], values["top_p"], seed,
                                         {**names, "seed": "seed"})
            sampling = dict(temperature=1.0, top_k=None, top_p=None, seed=None)
            passed = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}
            ignored = _ignored_sampling_options({k: v for k, v in passed.items() if v is not MODEL_DEFAULT})
        vocab = self.config.vocab_size
        eos_list, pad = generation_ids(self)
        # not passed: the model's; None passed: none (the pad id then falls to the first end id below,
        # as Hugging Face's _prepare_special_tokens)
        if eos_token_id is MODEL_DEFAULT:
            eos_token_id = [e for e in eos_list if 0 <= e < vocab]
        if pad_token_id is MODEL_DEFAULT:  # as eos: the config's, if it is an id of the vocabulary
            ok = isinstance(pad, (int, np.integer)) and not isinstance(pad, bool) and 0 <= pad < vocab
            pad_token_id = int(pad) if ok else None
        cfg = GenerationConfig(max_new_tokens, sample, repetition_penalty=penalty, eos_token_id=eos_token_id,
                               pad_token_id=pad_token_id, **sampling)
        # the ids are emitted as tokens (pad) or compared with them (eos): they must be in the vocabulary
        if cfg.pad_token_id is not None and cfg.pad_token_id >= vocab:
            raise ValueError(f"pad_token_id: expected an id in [0, {vocab}) (config.vocab_size), "
                             f"got {cfg.pad_token_id}")
        for i, e in enumerate(cfg.eos_ids):
            if e >= vocab:
                name = "eos_token_id" if isinstance(eos_token_id, (int, np.integer)) else f"eos_token_id[{i}]"
                raise ValueError(f"{name}: expected an id in [0, {vocab}) (config.vocab_size), got {int(e)}")
        if cfg.pad_token_id is None and cfg.eos_ids.size:
            cfg.pad_token_id = int(cfg.eos_ids[0])
        return cfg, ignored
