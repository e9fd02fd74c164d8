"""Attention masks, one convention: a boolean mask is **True where attention is allowed**.

This is the convention of the whole library (``functional.scaled_dot_product_attention``'s
``attn_mask``, the key masks ``key_mask``/``src_key_mask`` of the layers), of torch's
``F.scaled_dot_product_attention`` and of the encoder tutorial (``masked_fill(mask == 0, -inf)``).
The ``transformer_core.nn`` layers' ``attn_mask``/``src_mask``/``tgt_mask``/``memory_mask`` keep
torch's names and so take float masks only (:func:`to_additive` makes one): torch's layers read a
bool mask there as True = blocked. Elsewhere the meanings differ, hence the converters:

* torch ``nn.MultiheadAttention`` / ``nn.Transformer*`` bool masks: True = blocked (padding in
  ``key_padding_mask``) -> :func:`from_torch_mha` (``~mask``);
* additive float masks: 0 = allowed, -inf (or any value <= -9000) = blocked -> :func:`from_additive`;
* Hugging Face ``attention_mask``: 1 = real token, 0 = padding -> :func:`from_hf`;

and :func:`to_additive` goes back to a 0 / -inf float mask.

Every function returns new numpy arrays and validates its input (``TypeError`` / ``ValueError``
naming the argument).
"""

from __future__ import annotations

import numpy as np

from ._validation import (
    _unbroadcast,
    as_ids,
    check_allocatable,
    check_choice,
    check_float,
    check_int,
    check_positive_int,
    resolve_dtype,
    to_numpy,
)

__all__ = [
    "causal_mask",
    "padding_mask",
    "padding_mask_from_ids",
    "from_torch_mha",
    "from_additive",
    "from_hf",
    "to_additive",
]

#: Default cut of :func:`from_additive`: entries <= this value are "blocked". -9000 catches
#: -inf (the overview and encoder tutorials), -1e20 (the einsum tutorial), -1e9 (common
#: elsewhere), ``torch.finfo(dtype).min`` (Hugging Face) and the
#: ``(1 - mask) * -10000.0`` of the original BERT in every float dtype: float16 holds -10000
#: exactly, bfloat16 rounds it to -9984 (its spacing there is 64), which a cut of -1e4 would
#: have let through. Ordinary additive biases stay above it, so they stay allowed: ALiBi's
#: ``-m·|i - j|`` has slopes m < 1 (2^(-8/H) and, for H not a power of 2, up to 2^(-4/H'),
#: H' the largest power of 2 below H; BLOOM's 112 heads: 0.958), so above -9000 for keys less than
#: 9000 positions away; T5's learned relative-position biases are small (tens).
ADDITIVE_BLOCKED_AT = -9000.0


_to_numpy = to_numpy

#: The causal alignments by name: this library's, and torch's names of the same two
#: (``torch.nn.attention.bias.CausalVariant.UPPER_LEFT`` / ``LOWER_RIGHT``, ``causal_upper_left`` /
#: ``causal_lower_right``) as aliases.
_CAUSAL_ALIGNMENTS = {"top_left": "top_left", "bottom_right": "bottom_right",
                      "upper_left": "top_left", "lower_right": "bottom_right"}


def _causal_alignment(value, name: str) -> str:
    """``value`` as one of this library's alignments, ``"top_left"`` or ``"bottom_right"``; torch's
    ``"upper_left"`` / ``"lower_right"`` are taken as these. TypeError for a non-str (an int
    ``CausalVariant`` member too), ValueError for another name; both name ``name``."""
    if not isinstance(value, str):
        check_choice(value, name, ("top_left", "bottom_right"))  # its TypeError
    if value in _CAUSAL_ALIGNMENTS:
        return _CAUSAL_ALIGNMENTS[value]
    raise ValueError(f"{name}: expected one of 'top_left', 'bottom_right' (or torch's names of the same, "
                     f"'upper_left', 'lower_right'), got {value!r}")


def causal_mask(L: int, S: int | None = None, alignment: str = "top_left") -> np.ndarray:
    """The causal (autoregressive) mask: query ``i`` may attend to key ``j`` only if ``j`` is not
    in its future (the tutorials' ``create_causal_mask``, GPT's decoder; Vaswani et al. 2017, §3.2.3).

    ``alignment="top_left"`` (torch's ``is_causal``, ``causal_upper_left``; ``"upper_left"``, torch's
    name, is taken too)::

        mask[i, j] = j <= i                   (L = S: torch.tril(torch.ones(L, L)) == 1)

    ``alignment="bottom_right"`` (torch's ``causal_lower_right``; ``"lower_right"``, torch's name, is
    taken too; decoding with a KV cache, where the L new queries are the last L of the S keys)::

        mask[i, j] = j <= i + S - L

    With ``bottom_right`` and ``L > S``, the first ``L - S`` rows are all False (nothing to attend;
    the library's attention gives zeros there).

    Args:
        L: query length, >= 1.
        S: key length, >= 1; default ``L``.
        alignment: ``"top_left"`` or ``"bottom_right"``; or torch's names of the same two
            (``torch.nn.attention.bias.CausalVariant``), ``"upper_left"`` and ``"lower_right"``.

    Returns:
        ``(L, S)`` bool, True = may attend. For L = S = 4 (the tutorial's printout)::

            [[ True, False, False, False],
             [ True,  True, False, False],
             [ True,  True,  True, False],
             [ True,  True,  True,  True]]

    Raises:
        TypeError: non-int ``L``/``S``, non-str ``alignment``. ValueError: ``L``/``S`` < 1, an
            ``(L, S)`` mask larger than this machine's memory (counted with the two int64 index
            vectors of ``L`` and ``S`` values it is built from), or unknown ``alignment``.
    """
    L = check_positive_int(L, "L")
    S = L if S is None else check_positive_int(S, "S")
    alignment = _causal_alignment(alignment, "alignment")
    diagonal = 0 if alignment == "top_left" else S - L
    # np.tri builds the mask as greater_equal.outer(arange(L), arange(-diagonal, S - diagonal)): two
    # int64 index vectors besides it, larger than the mask itself when L or S is below 8
    check_allocatable((L * S + 8 * (L + S),), 1, f"L, S: the ({L}, {S}) mask and np.tri's int64 index vectors "
                                                 f"of L and S values")
    return np.tri(L, S, k=diagonal, dtype=bool)


def padding_mask(lengths, max_len: int | None = None) -> np.ndarray:
    """Key-padding mask from sequence lengths: ``mask[n, j] = j < lengths[n]`` (True = a real
    token; right padding, as Hugging Face tokenizers pad by default).

    Args:
        lengths: ``(N,)`` non-negative integers.
        max_len: columns of the mask, >= ``max(lengths)``; default ``max(lengths)`` (at least 1).

    Returns:
        ``(N, max_len)`` bool.

    Raises:
        TypeError: non-integer ``lengths`` or ``max_len``.
        ValueError: ``lengths`` not 1-D or empty, a negative length, a length > ``max_len``,
            ``max_len`` < 1, a mask larger than this machine's memory.
    """
    arr = _to_numpy(lengths, "lengths")
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"lengths: expected a non-empty 1-D array (N,), got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"lengths: expected integer lengths, got dtype {arr.dtype}")
    if arr.min() < 0:
        raise ValueError(f"lengths: expected lengths >= 0, got {int(arr.min())}")
    longest = int(arr.max())
    if max_len is None:
        max_len = max(longest, 1)
    else:
        max_len = check_positive_int(max_len, "max_len")
        if longest > max_len:
            raise ValueError(f"max_len: expected >= the longest length {longest}, got {max_len}")
    check_allocatable((arr.shape[0], max_len), 1, "lengths, max_len: the mask (N, max_len)")
    mask = np.zeros((arr.shape[0], max_len), bool)  # only the mask is allocated (no index array)
    for row, length in zip(mask, arr.tolist()):
        row[:length] = True
    return mask


def padding_mask_from_ids(input_ids, pad_token_id: int) -> np.ndarray:
    """Key-padding mask from token ids: ``input_ids != pad_token_id`` (True = a real token).

    Args:
        input_ids: ``(N, L)`` integer ids, or floats that are whole numbers (a 1-D ``(L,)`` gains
            N = 1).
        pad_token_id: the padding id (BERT: 0).

    Returns:
        ``(N, L)`` bool.

    Raises:
        TypeError: ids neither integers nor whole-number floats (bool, complex, non-integral or
            non-finite floats; a float array of whole numbers is taken); a non-int
            ``pad_token_id``. ValueError: wrong rank or empty ids, ids outside int64,
            ``pad_token_id`` outside int64.
    """
    pad_token_id = check_int(pad_token_id, "pad_token_id", -2**63, 2**63 - 1)
    ids = as_ids(input_ids, "input_ids")
    return ids != pad_token_id


def from_torch_mha(mask) -> np.ndarray:
    """A torch ``nn.MultiheadAttention`` / ``nn.Transformer*`` mask in our convention.

    * bool (``attn_mask`` or ``key_padding_mask``; True = **not** allowed / padding) ->
      ``~mask`` (True = may attend / real token).
    * float (additive, added to the scores; the same meaning in torch and here) -> the same values
      (a numpy copy): float16, float32 and float64 keep their dtype; bfloat16, which numpy lacks,
      becomes float32 (exactly: every bfloat16 value is a float32 value).

    Args:
        mask: torch tensor or array-like, any shape (``(L, S)``, ``(N·H, L, S)``, ``(N, S)``).

    Returns:
        bool array (from a bool mask) or float array (from a float mask; bfloat16 -> float32), same
        shape.

    Raises:
        TypeError: None, or a dtype other than bool/float (torch deprecated byte masks: say which
            meaning you want by converting to bool first).
        ValueError: a result larger than this machine's memory (e.g. a broadcast view of a huge
            shape), checked before it is allocated.
    """
    m = _to_numpy(mask, "mask")
    if m.dtype == np.bool_ or m.dtype.kind == "f":
        check_allocatable(m.shape, m.dtype.itemsize, "mask (the result)")  # the only allocation
        return ~m if m.dtype == np.bool_ else m.copy()
    raise TypeError(f"mask: expected a bool (True = blocked) or float (additive) mask, got dtype {m.dtype}")


def from_additive(mask, blocked_at: float = ADDITIVE_BLOCKED_AT) -> np.ndarray:
    """An additive float mask (0 = allowed, a very negative value = blocked) as a bool mask::

        ours = mask > blocked_at          (default blocked_at = ADDITIVE_BLOCKED_AT = -9000)

    so -inf, ``torch.finfo(dtype).min``, -1e9, -1e20 and BERT's -10000.0 (also as bfloat16 rounds
    it, -9984) all mean blocked, and 0 means allowed. The conversion is lossy: a finite bias above
    ``blocked_at`` (ALiBi for keys less than 9000 positions away, T5 relative positions) becomes
    plain True; keep the float mask to keep the bias. A bias that may reach -9000 (ALiBi over
    longer contexts) needs a lower ``blocked_at``.

    Args:
        mask: float array-like or torch tensor, any shape.
        blocked_at: entries ``<= blocked_at`` are blocked; a finite number.

    Returns:
        bool array of the same shape, True = may attend.

    Raises:
        TypeError: not a float mask (a bool mask is already a mask: use it, or :func:`from_torch_mha`).
        ValueError: NaN or +inf entries, a non-finite ``blocked_at``, or a result larger than this
            machine's memory (e.g. a broadcast view of a huge shape), checked before any allocation.
    """
    m = _to_numpy(mask, "mask")
    if m.dtype.kind != "f":
        raise TypeError(f"mask: expected a float (additive) mask, got dtype {m.dtype}")
    blocked_at = check_float(blocked_at, "blocked_at")
    check_allocatable(m.shape, 1, "mask (the bool result)")  # the only full-size allocation
    # max propagates NaN: one reduction finds NaN and +inf without a full-size temporary
    if m.size and not m.max() < np.inf:
        raise ValueError("mask: expected 0 (allowed) or very negative (blocked) values, got NaN or +inf entries")
    return m > blocked_at


def from_hf(mask) -> np.ndarray:
    """A Hugging Face ``attention_mask`` (1 = real token, 0 = padding; int, float or bool) as a
    bool mask: ``mask == 1``. The meaning is already ours; only the dtype changes.

    Args:
        mask: ``(N, S)`` (or any shape) of 0/1 values, array-like or torch tensor.

    Returns:
        bool array of the same shape.

    Raises:
        TypeError: a non-numeric dtype. ValueError: values other than 0 and 1 (e.g. an additive
            mask: use :func:`from_additive`), or arrays larger than this machine's memory (the
            result and one bool array of its size; e.g. a broadcast view of a huge shape), checked
            before any allocation. A broadcast view (``np.broadcast_to``, stride 0) has the values it
            holds checked first, without a copy of its full shape.
    """
    m = _to_numpy(mask, "mask")
    if m.dtype == np.bool_:
        check_allocatable(m.shape, 1, "mask (the result)")
        return m.copy()
    if m.dtype.kind not in "iuf":
        raise TypeError(f"mask: expected a 0/1 attention_mask, got dtype {m.dtype}")
    own = _unbroadcast(m)
    if own is not m:  # a broadcast view (stride 0): the values it holds checked first, no array of its full size
        check_allocatable(own.shape, 2, "mask (the check of the values it holds, 2 bool arrays)")
        _zero_one(own)
    # the result and the validity check: two bool arrays of the mask's size, no other full-size one
    check_allocatable(m.shape, 2, "mask (the result and its check, 2 bool arrays)")
    return _zero_one(m)


def _zero_one(m: np.ndarray) -> np.ndarray:
    """``m == 1`` (a bool array of ``m``'s shape), after checking that every value of ``m`` is 0 or 1
    (ValueError naming ``mask``, with the smallest values that are not); one more bool array of
    ``m``'s size meanwhile."""
    ones = np.asarray(m == 1)  # (a 0-d mask compares to a scalar)
    bad = np.asarray(m == 0)
    bad |= ones
    np.logical_not(bad, out=bad)  # True where neither 0 nor 1
    if bad.any():
        raise ValueError(f"mask: expected only 0 (padding) and 1 (real token), got values such as "
                         f"{_smallest_values(m, bad)}")
    return ones


def _smallest_values(m: np.ndarray, where: np.ndarray, count: int = 5) -> list:
    """The ``count`` smallest distinct values of ``m`` where ``where`` is True, read in bounded
    blocks (no copy of the mask's size, whatever the number of such entries)."""
    found = np.empty(0, m.dtype)
    it = np.nditer([m, where], flags=["external_loop", "buffered", "zerosize_ok"], buffersize=1 << 16)
    for values, selected in it:
        found = np.unique(np.concatenate([found, values[selected]]))[:count]
    return found.tolist()


def to_additive(mask, dtype=np.float32) -> np.ndarray:
    """A bool mask (True = may attend) as an additive float mask: 0 where True, -inf where False.

    Args:
        mask: bool array-like or torch tensor, any shape.
        dtype: ``np.float32`` (default) or ``np.float64``.

    Returns:
        float array of ``dtype``, same shape. (A fully False row softmaxes to NaN in torch; the
        library's attention gives zeros.)

    Raises:
        TypeError: a non-bool mask (0/1 integers are ambiguous between conventions: convert with
            :func:`from_hf` or ``mask.astype(bool)`` first), or a dtype other than float32/float64.
        ValueError: a result larger than this machine's memory (e.g. a broadcast view of a huge
            shape), checked before it is allocated.
    """
    m = _to_numpy(mask, "mask")
    if m.dtype != np.bool_:
        raise TypeError(f"mask: expected a bool mask (True = may attend), got dtype {m.dtype}")
    dtype = resolve_dtype(dtype)
    check_allocatable(m.shape, np.dtype(dtype).itemsize, "mask (the result)")  # np.where's output only
    return np.where(m, dtype(0), dtype(-np.inf)).astype(dtype, copy=False)
