"""Functional ops, computed by the C++ core: linear, softmax, layer_norm, gelu, relu and
scaled dot-product attention.

Every op takes array-likes, checks their dtypes, ranks and shapes as given (reading them costs
nothing), then converts them once (float16, integer, non-contiguous inputs are copied): a bad
argument is refused before any copy is made. It returns new numpy arrays. The GIL is released while
the C++ core computes.

Dtypes, one rule for every op (``_validation.common_dtype``): an op computes in float64 if ANY of
its float data arguments (inputs, weights, biases, query/key/value, gate/up) is float64 or a wider
float (``np.longdouble``), else in float32 (float16, float32, integers); its result has that dtype.
A float64 argument is never narrowed to another argument's float32, whichever comes first; masks
and rotary tables follow the op's dtype. A finite float64 value beyond float32's range that would
be narrowed (e.g. by a float32 layer) is a ValueError, never a silent inf; but a float mask's is
clamped to float32's range (``-1e300`` becomes ``-3.4028235e38``, ``±inf`` and NaN stay as given),
so that a mask means the same in either dtype: a row masked everywhere by ``-1e300`` averages the
values in float32 as in float64 (and torch), where an inf would have made it a fully masked row.

Masks, one convention in the whole library (the encoder tutorial's ``mask == 0 -> -inf``, torch's
``F.scaled_dot_product_attention``): a boolean mask is True where attention is allowed; a float
mask is added to the scores. A query row with nothing to attend gives zeros, never NaN.
"""

from __future__ import annotations

import math

import numpy as np

from ._runtime import variant
from ._validation import (
    _UNCHECKED_COPY_SIZE,
    _contiguous,
    as_attention_mask,
    as_bool,
    as_float,
    attention_path,
    broadcast_mask,
    check_allocatable,
    check_bool,
    check_choice,
    check_eps,
    check_float,
    check_int,
    check_rank,
    common_dtype,
    compute_dtype,
    to_numpy,
    type_path,
    unconverted,
)
from ._validation import activation as activation_of
from ._validation import reduction as reduction_of
from .masks import _causal_alignment
from .module import renamed_keyword

__all__ = [
    "linear",
    "softmax",
    "layer_norm",
    "rms_norm",
    "gelu",
    "relu",
    "silu",
    "glu",
    "dropout",
    "cross_entropy",
    "scaled_dot_product_attention",
    "varlen_attention",
    "sinusoidal_positional_encoding",
    "rotary_cos_sin",
    "rotate_half",
    "apply_rotary",
    "apply_rotary_pos_emb",
]


def _as_given(arr, name: str, dtype, *, ndim: int | None = None, min_ndim: int = 0,
              allow_empty: bool = False) -> np.ndarray:
    """``arr`` as :func:`common_dtype` or :func:`to_numpy` returned it (not converted: no copy yet),
    with the checks :func:`as_float` makes before its copy to ``dtype``, in its words and order:
    rank, emptiness, and the copy's size against this machine's memory. The ops check every shape
    on these arrays and convert them (:func:`_as_dtype`) only when every check has passed, so that a
    bad call is refused before a full-size float copy is made.

    Raises:
        TypeError: None (an array argument not given). ValueError: the wrong rank (``ndim``,
            ``min_ndim``), an empty array unless ``allow_empty``, a copy larger than this
            machine's memory.
    """
    arr = to_numpy(arr, name)  # an ndarray is returned as is; None is a TypeError naming ``name``
    check_rank(arr, name, ndim=ndim, min_ndim=min_ndim, allow_empty=allow_empty)
    if arr.size > _UNCHECKED_COPY_SIZE and not (arr.flags.c_contiguous and arr.dtype == dtype):
        check_allocatable(arr.shape, np.dtype(dtype).itemsize, name)
    return arr


def _as_dtype(arr: np.ndarray | None, name: str, dtype) -> np.ndarray | None:
    """An array :func:`_as_given` checked, converted: C-contiguous, native byte order, of ``dtype``
    (the conversion of :func:`as_float`, without its checks a second time); None stays None. A
    finite value that narrowing to ``dtype`` would make inf (a longdouble's) is refused here, a
    ValueError naming ``name``: only converting finds it."""
    return None if arr is None else _contiguous(arr, dtype, name)


def _vector_given(value, name: str, n: int, dtype) -> np.ndarray | None:
    """An optional per-feature parameter (a norm's weight or bias) as given, checked to be ``(n,)``
    (its rank and shape, before any copy); None stays None."""
    if value is None:
        return None
    arr = _as_given(value, name, dtype, ndim=1)
    if arr.shape != (n,):
        raise ValueError(f"{name}: expected shape ({n},) to match x's last dim, got {arr.shape}")
    return arr


def _refuse_normalized_shape(op: str, x, weight, after: tuple) -> None:
    """A TypeError for torch's call ``F.layer_norm(x, normalized_shape, weight, bias, eps)`` or
    ``F.rms_norm(x, normalized_shape, weight, eps)`` made here, where the second argument is the
    weight: without it, the error would blame ``eps`` (given torch's bias, or rms_norm's weight),
    weight's shape, or (E = 1) nothing at all.

    ``after`` holds the arguments that follow ``weight`` here (layer_norm's bias and eps, rms_norm's
    eps). ``weight`` reads as a normalized_shape when it is a ``torch.Size``; or ints that are x's
    trailing dims (what torch's normalized_shape must be) and either not a weight's length (E) or,
    as a tuple, followed by an array (torch's weight one slot later: ``layer_norm(x, (1,), w)``
    with E = 1); or ints followed by an array where ``eps`` goes. Anything else is left to the
    op's own checks: a list of ints of length E is a weight (``layer_norm(x, [2], b)``), and ints
    that cannot be x's trailing dims keep the shape error."""
    if not isinstance(weight, (tuple, list)):  # torch.Size is a tuple
        return
    is_size = type_path(weight) == "torch.Size"
    ints = len(weight) > 0 and all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in weight)
    if not (is_size or ints):
        return
    shape = to_numpy(x, "x").shape  # no copy of an array or tensor
    if not shape:  # a 0-d x: refused as such by the op's own checks
        return
    e, n = shape[-1], len(weight)
    trailing = ints and n <= len(shape) and tuple(int(d) for d in weight) == shape[len(shape) - n:]
    array_after = any(np.ndim(a) > 0 for a in after)
    torch_call = (is_size or (trailing and (n != e or (isinstance(weight, tuple) and array_after)))
                  or (ints and np.ndim(after[-1]) > 0))
    if not torch_call:
        return
    ours = "weight, bias, eps" if op == "layer_norm" else "weight, eps"
    raise TypeError(f"weight: expected an array of shape ({e},) (x's last dim) or None, got "
                    f"{type_path(weight)} {tuple(int(d) for d in weight)}, which looks like torch's "
                    f"normalized_shape: {op}(x, {ours}) has no normalized_shape argument (it normalises "
                    f"over the last dim): torch's F.{op}(x, ({e},), {ours}) is {op}(x, {ours}) here")


def linear(x, weight, bias=None) -> np.ndarray:
    """Affine map ``y = x Wᵀ + b``, as ``torch.nn.functional.linear``.

    fp32 with more than 32 rows runs our GEMM kernels (AVX-512 or AVX2, chosen at run time; the
    weight packed into column panels once per call, GotoBLAS's design); fp64, a CPU without AVX2,
    runs BLAS; up to 32 rows stream the weight once (decoding, one short sentence). Our GEMM sums
    ``in_features`` in blocks of 512 and adds the blocks' sums in order, which keeps the rounding
    error of long sums near torch's (kernels/linear.hpp). Bitwise the same for any thread count.

    Args:
        x: ``(..., in_features)`` float array.
        weight: ``(out_features, in_features)``, torch's ``nn.Linear`` layout.
        bias: ``(out_features,)`` or None.

    Returns:
        ``(..., out_features)``, float64 if any of ``x``, ``weight``, ``bias`` is float64 (or
        wider), else float32 (the module doc's rule).

    Raises:
        ValueError: ``x`` empty or of rank 0; ``weight`` not 2-D or its in_features differ from
            ``x``'s last dim; ``bias`` of the wrong shape; an output ``(..., out_features)`` larger
            than this machine's memory (naming ``x, weight``, checked before either is copied).
        TypeError: a non-numeric array.
    """
    dtype, (x, weight, bias) = common_dtype((x, "x"), (weight, "weight"), (bias, "bias"))
    x = _as_given(x, "x", dtype, min_ndim=1)  # every shape is checked before any copy
    weight = _as_given(weight, "weight", dtype, ndim=2)
    if weight.shape[1] != x.shape[-1]:
        raise ValueError(
            f"weight: expected shape (out_features, {x.shape[-1]}) to match x's last dim, got {weight.shape}")
    if bias is not None:
        bias = _as_given(bias, "bias", dtype, ndim=1)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias: expected shape ({weight.shape[0]},) to match weight's out_features "
                             f"{weight.shape[0]}, got {bias.shape}")
    out_shape = x.shape[:-1] + (weight.shape[0],)
    if math.prod(out_shape) > _UNCHECKED_COPY_SIZE:  # the output, before x and weight are copied
        check_allocatable(out_shape, np.dtype(dtype).itemsize, "x, weight: the output (..., out_features)")
    bias = _as_dtype(bias, "bias", dtype)
    x, weight = _as_dtype(x, "x", dtype), _as_dtype(weight, "weight", dtype)
    y = variant("linear", dtype)(x.reshape(-1, x.shape[-1]), weight, bias, "")
    return y.reshape(x.shape[:-1] + (weight.shape[0],))


@renamed_keyword("axis", "dim", "torch's")
def softmax(x, dim: int = -1) -> np.ndarray:
    """``exp(x - max) / Σ exp(x - max)`` along ``dim`` (max-subtracted, so it never overflows), as
    ``torch.softmax(x, dim)``.

    Args:
        x: float array of any shape (non-empty).
        dim: the axis to normalise over (torch's name). ``axis=``, its former (numpy's) name, is
            still taken for one release, with a ``DeprecationWarning``.

    Returns:
        The shape of ``x``, float64 if ``x`` is float64 (or wider) else float32; each slice along
        ``dim`` sums to 1. A slice that is all
        ``-inf`` (fully masked) gives zeros, where torch gives NaN; NaN in a slice gives NaN.

    Any ``dim`` is computed in the layout of ``x``, with no copy of ``x`` that moves it last.

    Raises:
        ValueError: empty or 0-d ``x``, ``dim`` out of range; a float copy of ``x`` (another
            dtype, not C-contiguous) larger than this machine's memory (naming ``x``, checked
            before the copy).
        TypeError: ``dim`` not an int, non-numeric ``x``, both ``dim=`` and ``axis=`` given.
    """
    # dim is checked before x's float copy (a float16 or integer x is widened): its type first, its
    # range on the rank of x as given (a 0-d x is refused by check_rank)
    dim = check_int(dim, "dim", None, None)
    given = to_numpy(x, "x")
    if given.ndim >= 1:
        dim = check_int(dim, "dim", -given.ndim, given.ndim - 1)
    dtype = compute_dtype(given, "x")
    check_rank(given, "x", min_ndim=1)
    x = _contiguous(given, dtype, "x")  # as_float's conversion (none for a contiguous x of dtype)
    dim %= x.ndim
    n, inner = x.shape[dim], math.prod(x.shape[dim + 1:])  # x as (outer, n, inner): softmax over n
    return variant("softmax", dtype)(x.reshape(-1, n, inner)).reshape(x.shape)


def layer_norm(x, weight=None, bias=None, eps: float = 1e-5) -> np.ndarray:
    """Layer normalisation over the last dim (Ba et al. 2016), as ``torch.nn.functional.layer_norm``
    with ``normalized_shape = (E,)``::

        y = (x - mean) / sqrt(var + eps) * weight + bias      (var: biased, two-pass)

    Args:
        x: ``(..., E)`` float array.
        weight, bias: ``(E,)`` or None (no affine).
        eps: added to the variance, a finite number >= 0 (0 allowed).

    Returns:
        ``(..., E)``, float64 if any of ``x``, ``weight``, ``bias`` is float64 (or wider), else
        float32. A constant row with ``eps = 0`` gives NaN (0 / 0), as torch's.

    Differences from torch: the signature has no ``normalized_shape``: torch's
    ``F.layer_norm(x, (E,), weight, bias, eps)`` is ``layer_norm(x, weight, bias, eps)`` here (the
    second argument is the weight ``(E,)``; only the last dim is normalised). A row whose squares
    overflow the dtype (float32 ``[1e30, 1e30, -1e30, 0]``, ``[3e38] * 4``) is normalised (finite;
    0 for a constant row) where torch gives NaN (or, for some row lengths, zeros), and so are rows
    whose squares underflow with ``eps = 0`` (float32 ``1e-30``, subnormals; torch: ±inf). Every
    layer and model with a LayerNorm (the Transformer layers, BERT, GPT-2) does the same.

    Raises:
        ValueError: empty or 0-d ``x``; weight/bias not of shape ``(E,)``; ``eps`` negative,
            infinite or NaN.
        TypeError: non-numeric arrays, ``eps`` not a number; a ``weight`` that is torch's
            ``normalized_shape`` (a ``torch.Size``; ints that are x's trailing dims, of another
            length than E or, as a tuple, followed by an array; ints followed by an array where
            ``eps`` goes: torch's call order).
    """
    _refuse_normalized_shape("layer_norm", x, weight, (bias, eps))  # torch's call order, before eps blames eps
    eps = check_eps(eps, "eps")  # the scalar first, then every shape, then the copies
    dtype, (x, weight, bias) = common_dtype((x, "x"), (weight, "weight"), (bias, "bias"))
    x = _as_given(x, "x", dtype, min_ndim=1)
    e = x.shape[-1]
    weight, bias = _vector_given(weight, "weight", e, dtype), _vector_given(bias, "bias", e, dtype)
    params = [_as_dtype(weight, "weight", dtype), _as_dtype(bias, "bias", dtype)]
    x = _as_dtype(x, "x", dtype)
    y = variant("norm", dtype)(x.reshape(-1, e), "layer_norm", params[0], params[1], eps)
    return y.reshape(x.shape)


def rms_norm(x, weight=None, eps: float | None = None) -> np.ndarray:
    """Root-mean-square normalisation over the last dim (Zhang & Sennrich 2019), as
    ``torch.nn.functional.rms_norm`` with ``normalized_shape = (E,)`` and Hugging Face's
    ``LlamaRMSNorm`` (computed in float32 for float32 input)::

        y = x / sqrt(mean(x²) + eps) * weight          (mean(x²) accumulated in double)

    Args:
        x: ``(..., E)`` float array.
        weight: ``(E,)`` or None (no scale).
        eps: added to the mean square, a finite number >= 0. None (the default, torch's):
            ``np.finfo(dtype).eps`` of the dtype the op computes in (float32: 1.19e-7, float64:
            2.2e-16; a float16 input computes in float32, as torch's default for float16 is
            float32's eps). Hugging Face's ``LlamaRMSNorm`` defaults to 1e-6 and Llama configs
            set ``rms_norm_eps`` (1e-5 or 1e-6): pass it.

    Returns:
        ``(..., E)``, float64 if ``x`` or ``weight`` is float64 (or wider), else float32.

    Differences from torch: the signature has no ``normalized_shape``: torch's
    ``F.rms_norm(x, (E,), weight, eps)`` is ``rms_norm(x, weight, eps)`` here (the second argument
    is the weight ``(E,)``; only the last dim is normalised). A row whose squares overflow the
    dtype (float32 ``[1e30, 1e30, -1e30, 0]``, ``[3e38] * 4``) is normalised (``[1.15, 1.15,
    -1.15, 0]``; 1 for a constant row) where torch gives 0, and so are rows whose squares
    underflow with ``eps = 0`` (float32 ``1e-30``, subnormals). Every layer and model with an
    RMSNorm (Llama) does the same.

    Raises:
        ValueError: empty or 0-d ``x``; weight not of shape ``(E,)``; ``eps`` negative, infinite
            or NaN.
        TypeError: non-numeric arrays, ``eps`` not a number (nor None); a ``weight`` that is
            torch's ``normalized_shape`` (a ``torch.Size``; ints that are x's trailing dims, of
            another length than E; ints followed by an array where ``eps`` goes: torch's call
            order).
    """
    _refuse_normalized_shape("rms_norm", x, weight, (eps,))  # torch's call order, before eps blames eps
    eps = None if eps is None else check_eps(eps, "eps")  # the scalar first, then every shape, then the copies
    dtype, (x, weight) = common_dtype((x, "x"), (weight, "weight"))
    x = _as_given(x, "x", dtype, min_ndim=1)
    e = x.shape[-1]
    weight = _as_dtype(_vector_given(weight, "weight", e, dtype), "weight", dtype)
    x = _as_dtype(x, "x", dtype)
    eps = float(np.finfo(dtype).eps) if eps is None else eps
    y = variant("norm", dtype)(x.reshape(-1, e), "rms_norm", weight, None, eps)
    return y.reshape(x.shape)


def _elementwise(x, activation: str) -> np.ndarray:
    """``activation`` (a name of the core's table) of each element of ``x``, with :func:`as_float`'s
    checks and conversion. An F-contiguous ``x`` of its compute dtype (a transposed float32 or
    float64 array) is computed as its transpose ``x.T``, C-contiguous, and the result transposed
    back: no transposing copy is made, and the result keeps x's memory order (F-contiguous), as
    torch's keeps its input's layout. Each element's value is the same either way."""
    arr = unconverted(x, "x")  # as_float's checks: a real numeric dtype, not empty
    dtype = compute_dtype(arr, "x")
    if arr.dtype == dtype and arr.flags.f_contiguous and not arr.flags.c_contiguous:
        return variant("activation", dtype)(arr.T, activation).T
    return variant("activation", dtype)(_contiguous(arr, dtype, "x"), activation)


def gelu(x, approximate: str = "none") -> np.ndarray:
    """GELU (Hendrycks & Gimpel 2016), as ``torch.nn.functional.gelu``.

    ``approximate="none"``: ``0.5 x (1 + erf(x / √2))`` (BERT); ``"tanh"``:
    ``0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`` (GPT-2). The shape of ``x``; float64 if ``x`` is
    float64 (or wider), else float32. C-contiguous, but for an F-contiguous float32/float64 ``x``
    (a transposed array), whose memory order the result keeps (as torch's), without a copy of ``x``.

    Raises:
        ValueError: ``approximate`` not "none" or "tanh"; empty ``x``.
        TypeError: ``approximate`` not a str; ``x`` not real numeric data (bool, complex, None, ...).
    """
    approximate = check_choice(approximate, "approximate", ("none", "tanh"))
    return _elementwise(x, "gelu" if approximate == "none" else "gelu_tanh")


def silu(x) -> np.ndarray:
    """SiLU / swish (Elfwing et al. 2018), as ``torch.nn.functional.silu``: ``x · σ(x) = x / (1 + e^-x)``,
    the gate of Llama's SwiGLU feed-forward. The shape of ``x``; float64 if ``x`` is float64 (or
    wider), else float32; F-contiguous for an F-contiguous float32/float64 ``x`` (as :func:`gelu`).

    Raises:
        ValueError: empty ``x``. TypeError: ``x`` not real numeric data (bool, complex, None, ...).
    """
    return _elementwise(x, "silu")


def relu(x) -> np.ndarray:
    """ReLU (Nair & Hinton 2010), as ``torch.nn.functional.relu``: ``max(x, 0)`` element-wise (NaN
    stays NaN), the feed-forward's activation in the Transformer (Vaswani et al. 2017, eq. 2). The
    shape of ``x``; float64 if ``x`` is float64 (or wider), else float32; F-contiguous for an
    F-contiguous float32/float64 ``x`` (as :func:`gelu`).

    Raises:
        ValueError: empty ``x``. TypeError: ``x`` not real numeric data (bool, complex, None, ...).
    """
    return _elementwise(x, "relu")


def _token_mask(m: np.ndarray, name: str, lead: tuple, length: int, what: str) -> np.ndarray:
    """A ``query_mask``/``key_mask`` as given (:func:`to_numpy`'s array, not converted: only its
    shape is read) viewed with ``lead + (length,)``'s rank.

    The rule: ``(length,)`` is shared by every row; ``lead + (length,)`` (each dim the query's or 1)
    is taken as is; with two or more leading dims (q ``(N, H, L, E)``), a 2-D ``(N, length)`` is per
    batch entry (N = query's first dim, or 1) and broadcast over the head axes, as torch's
    ``key_padding_mask`` and :func:`transformer_core.reference.scaled_dot_product_attention` read it.
    Any other rank is ambiguous (which leading dims?) and refused (ValueError naming ``name``).
    """
    shapes = f"({length},)" + (f" or ({lead[0]}, {length})" if lead else "") + (
        f" or {lead + (length,)} (each leading dim may be 1)" if len(lead) > 1 else "")
    if m.ndim < 1 or m.shape[-1] != length:
        raise ValueError(f"{name}: expected shape {shapes} ({what} {length}), got {m.shape}")
    if m.ndim == 1 or m.ndim == len(lead) + 1:
        return m
    if m.ndim == 2 and len(lead) > 1:
        if m.shape[0] not in (1, lead[0]):
            raise ValueError(f"{name}: a 2-D mask is (batch, {what}): expected first dim {lead[0]} "
                             f"(query's first dim) or 1, got shape {m.shape}")
        return m.reshape((m.shape[0],) + (1,) * (len(lead) - 1) + (length,))  # (N, 1, ..., length): a view
    raise ValueError(f"{name}: expected shape {shapes}, got {m.shape} (for query leading dims {lead})")


def _dtype_checked(convert, arr: np.ndarray, name: str, *args) -> np.ndarray:
    """``arr`` after ``convert``'s (:func:`as_bool`, :func:`as_attention_mask`) dtype checks, its
    TypeError naming ``name``: they run on an empty view of ``arr``, so nothing is read or copied."""
    convert(arr[None][:0], name, *args)
    return arr


def _attention_masks(attn_mask, query_mask, key_mask, lead: tuple, L: int, S: int, dtype, heads: int):
    """Combines the masks of an attention call into ``(bool_mask, float_mask, key_slot)``: the first
    two broadcast to ``lead + (L, S)`` (zero-copy views where only one boolean mask is given), the
    third an ``(n, S)`` key-padding mask (``n = prod(lead) // heads``) or None.

    Every mask's dtype and shape is checked on the array as given, and the combination of several
    boolean masks against this machine's memory, before any mask is converted: a bad mask is
    refused before a copy of another (or of itself) is made. The conversions follow, the token
    masks (their 0/1 values read) before the ``attn_mask`` (up to ``lead + (L, S)`` values).

    A ``key_mask`` that is the same for every head of a batch entry goes to the kernels' own
    key-mask slot (``(n, S)``: n · S bytes), so that combining it with an ``attn_mask`` or a
    ``query_mask`` never materializes an ``(..., L, S)`` array for it. A per-head ``key_mask``
    joins the boolean masks."""
    full = lead + (L, S)
    am = qm = km = None
    if attn_mask is not None:
        am = _dtype_checked(as_attention_mask, to_numpy(attn_mask, "attn_mask"), "attn_mask", dtype)
        broadcast_mask(am, full, "attn_mask")
    if query_mask is not None:
        qm = _dtype_checked(as_bool, to_numpy(query_mask, "query_mask"), "query_mask")
        qm = _token_mask(qm, "query_mask", lead, L, "query length")
        broadcast_mask(qm[..., :, None], full, "query_mask")
    per_head = False
    if key_mask is not None:
        km = _dtype_checked(as_bool, to_numpy(key_mask, "key_mask"), "key_mask")
        km = _token_mask(km, "key_mask", lead, S, "key length")
        broadcast_mask(km, lead + (S,), "key_mask")
        per_head = not (heads == 1 or km.ndim == 1 or km.shape[-2] == 1)  # else one per batch entry: the slot
    combined = (am is not None and am.dtype == np.bool_) + (qm is not None) + per_head
    if combined > 1:  # several boolean masks are combined into one (..., L, S) array
        check_allocatable(full, 1, "attn_mask, query_mask, key_mask: their combination")
    # the conversions, every check passed
    if qm is not None:
        qm = as_bool(qm, "query_mask")
    if km is not None:
        km = as_bool(km, "key_mask")
    if am is not None:
        am = as_attention_mask(am, "attn_mask", dtype)
    bool_parts, float_mask, key_slot = [], None, None
    if am is not None:
        if am.dtype == np.bool_:
            bool_parts.append(broadcast_mask(am, full, "attn_mask"))
        else:
            float_mask = broadcast_mask(am, full, "attn_mask")
    if qm is not None:
        bool_parts.append(broadcast_mask(qm[..., :, None], full, "query_mask"))
    if km is not None:
        kb = broadcast_mask(km, lead + (S,), "key_mask")
        if per_head:
            bool_parts.append(broadcast_mask(km[..., None, :], full, "key_mask"))
        else:
            key_slot = (kb if heads == 1 else kb[..., 0, :]).reshape(-1, S)
    bool_mask = None
    if len(bool_parts) == 1:
        bool_mask = bool_parts[0]
    elif bool_parts:
        bool_mask = np.logical_and(bool_parts[0], bool_parts[1])  # one (..., L, S) array, and in place
        for part in bool_parts[2:]:
            np.logical_and(bool_mask, part, out=bool_mask)
    return bool_mask, float_mask, key_slot


def _attention_inputs(query, key, value, enable_gqa, causal_alignment, extra=()):
    """The checked arrays and sizes of an attention call (the forward and the backward share them):
    ``(q, k, v, dtype, lead, L, S, E, heads, n, kv_heads, offset)``; q/k/v as given, NOT converted
    (every shape is checked on them: the caller checks its masks, then converts them with
    :func:`_attention_arrays`); ``dtype`` float64 if any of them is float64, or any of ``extra``'s
    ``(value, name)`` pairs (the backward's ``out``, ``grad_out``, ``lse``); ``lead`` = query's
    dims before ``(L, E)``. The flags are checked first."""
    enable_gqa = check_bool(enable_gqa, "enable_gqa")
    causal_alignment = _causal_alignment(causal_alignment, "causal_alignment")  # torch's names taken too
    dtype, arrays = common_dtype((query, "query"), (key, "key"), (value, "value"), *extra)
    query, key, value = arrays[:3]
    q = _as_given(query, "query", dtype, min_ndim=2)
    k = _as_given(key, "key", dtype, min_ndim=2)
    v = _as_given(value, "value", dtype, min_ndim=2)
    if k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"key, value: expected the rank of query ({q.ndim}-D), got key {k.ndim}-D, value {v.ndim}-D")
    L, E = q.shape[-2:]
    S = k.shape[-2]
    if k.shape[-1] != E:
        raise ValueError(f"key: expected last dim {E} (query's embedding size), got shape {k.shape}")
    if v.shape[-2] != S:
        raise ValueError(f"value: expected length {S} (key's length) in dim -2, got shape {v.shape}")
    lead = q.shape[:-2]
    if enable_gqa and q.ndim >= 3:
        hq, hk = q.shape[-3], k.shape[-3]
        if k.shape[:-3] != lead[:-1] or v.shape[:-2] != k.shape[:-2]:
            raise ValueError(f"key, value: leading dims {k.shape[:-2]}, {v.shape[:-2]} do not match "
                             f"query's {lead} (heads may differ with enable_gqa)")
        if hk < 1 or hq % hk != 0:
            raise ValueError(f"key: with enable_gqa, query heads ({hq}) must be a multiple of key/value heads ({hk})")
    elif k.shape[:-2] != lead or v.shape[:-2] != lead:
        raise ValueError(f"key, value: expected leading dims {lead} (query's), got {k.shape[:-2]} and {v.shape[:-2]}")
    # [N, H, L, E]: everything before the head dim is one batch dim. Without GQA, 3-D inputs are
    # (batch, L, E) of one head; with it, dim -3 is the head dim whatever the rank (torch's rule), so
    # that key's fewer heads are shared by groups of query's heads.
    has_heads = q.ndim >= 4 or (enable_gqa and q.ndim == 3)
    heads = lead[-1] if has_heads else 1
    n = math.prod(lead) // heads
    kv_heads = k.shape[-3] if has_heads else 1
    offset = 0 if causal_alignment == "top_left" else S - L
    return q, k, v, dtype, lead, L, S, E, heads, n, kv_heads, offset


def _attention_arrays(q, k, v, dtype) -> tuple:
    """``q, k, v`` (:func:`_attention_inputs`'s, checked) converted: C-contiguous of ``dtype``."""
    return _as_dtype(q, "query", dtype), _as_dtype(k, "key", dtype), _as_dtype(v, "value", dtype)


def _attention_dropout(dropout_p, seed) -> tuple[float, int]:
    """``(dropout_p, seed)`` of an attention call checked: ``dropout_p`` a number in [0, 1] (a
    TypeError for a non-number, a bool too), ``seed`` an int in [0, 2**64) or None, which draws the
    next seed of the package's generator when ``dropout_p > 0`` (0 otherwise: no mask is drawn)."""
    p = check_float(dropout_p, "dropout_p", minimum=0.0, maximum=1.0)
    if seed is not None:
        return p, _check_seed(seed)
    if p == 0.0:
        return p, 0
    from .module import next_seed

    return p, next_seed()


def _check_scale(scale, E: int, dtype) -> float:
    """``scale`` (a real number, finite in ``dtype``: 1e39 is infinite in float32) or ``1 / sqrt(E)``
    for None."""
    if scale is None:
        return 1.0 / math.sqrt(E)
    scale = check_float(scale, "scale")
    largest = float(np.finfo(dtype).max)
    if abs(scale) > largest:
        raise ValueError(f"scale: expected a value finite in {np.dtype(dtype).name} (|scale| <= {largest:g}), "
                         f"got {scale:g}")
    return scale


def _given_scale(scale) -> float | None:
    """``scale`` checked (a finite real number) before the arrays are read, None kept (``E`` is not
    known yet): :func:`_check_scale` gives the default then."""
    return None if scale is None else check_float(scale, "scale")


def _as_4d(mask: np.ndarray | None, shape4: tuple, name: str = "attn_mask") -> np.ndarray | None:
    """A mask broadcast to ``lead + (L, S)`` as the kernels' ``shape4 = (n, heads, L, S)``: the dims
    before ``(heads, L, S)`` merge into ``n``.

    A view where their strides merge (a contiguous mask; dims broadcast together; the usual
    ``(N, 1, L, S)`` or ``(1, 1, L, S)`` masks). Otherwise (a ``(A, 1, 1, L, S)`` mask of a query
    ``(A, B, 1, L, E)``: A's stride and B's 0 make no one stride for ``n = A·B``) the mask is copied
    over those dims only, its broadcast dims among ``(heads, L, S)`` kept broadcast: ``n`` times the
    values the mask holds per batch entry, checked against this machine's memory first.

    Raises:
        ValueError: that copy needs more than this machine's memory (naming ``name``).
    """
    if mask is None or mask.ndim <= 4:  # one batch dim or none: a view
        return None if mask is None else mask.reshape(shape4)
    full, strides = mask.shape, mask.strides
    k = mask.ndim - 3 if full[-3] == shape4[1] else mask.ndim - 2  # the batch dims
    inner = None  # the innermost batch dim of size > 1 seen so far
    for i in range(k):
        if full[i] == 1:
            continue
        if inner is not None and strides[inner] != full[i] * strides[i]:
            break
        inner = i
    else:
        return mask.reshape(shape4)  # the batch dims merge: a view
    own = mask[(Ellipsis,) + tuple(slice(0, 1) if st == 0 else slice(None) for st in strides[k:])]
    own_shape = (shape4[0],) + (1,) * (mask.ndim - k == 2) + own.shape[k:]
    check_allocatable(own_shape, mask.itemsize, f"{name}: its copy over query's batch dims {full[:k]} (their "
                                                 f"strides do not merge into one)")
    return np.broadcast_to(np.ascontiguousarray(own).reshape(own_shape), shape4)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, enable_gqa: bool = False, *, query_mask=None,
                                 key_mask=None, return_weights: bool = False, causal_alignment: str = "top_left",
                                 path: str = "auto", return_lse: bool = False, seed: int | None = None):
    """Scaled dot-product attention (Vaswani et al. 2017, eq. 1; the encoder tutorial's "Scaled Dot-product
    Attention")::

        Attention(Q, K, V) = softmax(Q Kᵀ · scale + mask) V,      scale = 1 / sqrt(E) by default

    The first eight arguments are torch's ``F.scaled_dot_product_attention``'s, in its order
    (positional or keyword); the rest are keyword-only.

    Args:
        query: ``(..., L, E)``.
        key: ``(..., S, E)``; exactly the leading dims of ``query``: they are not broadcast (a
            ``(1, H, S, E)`` key with a ``(N, H, L, E)`` query is a ValueError, where torch's CPU
            path broadcasts it; pass ``np.broadcast_to(key, (N, H, S, E))``, which is copied to
            ``N`` entries). With ``enable_gqa`` the head dim, third from the end, may be a divisor
            of query's: grouped-query attention, as torch's ``enable_gqa``; 3-D inputs are then
            ``(heads, L, E)``, query head ``h`` attending with key/value head ``h // (Hq / Hkv)``.
        value: ``(..., S, Ev)``, the leading dims of ``key``.
        attn_mask: bool (True = may attend) or float (added to the scores), broadcastable to
            ``(..., L, S)``. Integer masks are refused: say which you mean. A float mask is
            converted to the computing dtype; narrowed from float64 to float32, its finite values
            beyond float32's range are clamped to it (``-1e300`` becomes ``-3.4028235e38``; ``±inf``
            and NaN stay): the mask means the same in float32 as in float64.
        dropout_p: dropout on the attention probabilities (Srivastava et al. 2014), in [0, 1], as
            torch's: each probability is dropped with probability ``dropout_p`` and the others
            are scaled by ``1 / (1 - dropout_p)`` before they multiply ``value``. The mask is
            this library's, not torch's (torch draws from its own generator): probability
            ``(..., l, s)`` is kept where :func:`dropout` of ones of shape ``(..., L, S)`` with
            the same ``p`` and ``seed`` keeps that element (Philox4x32-10 on the flat index), on
            every path and thread count, so ``backward.scaled_dot_product_attention_backward``
            regenerates it from the seed. The log-sum-exp is the undropped softmax's; the
            weights returned are the dropped ones (those the output was made with). Applied
            whenever ``dropout_p > 0``, as torch's (which has no training flag): pass 0 for
            inference.
        query_mask: ``(L,)``, ``(N, L)`` or query's leading dims + ``(L,)``; bool or integer
            1/True = a real query token (the encoder tutorial). A masked query row attends to
            nothing and gives zeros. A 2-D mask with 4-D query ``(N, H, L, E)`` is per batch entry
            ``(N, L)``, broadcast over the heads; other ranks below query's are refused as ambiguous.
        key_mask: ``(S,)``, ``(N, S)`` or query's leading dims + ``(S,)`` (each dim matching or 1),
            read as ``query_mask``; bool or integer 1/True = a real key token (a padding mask).
            Note the opposite meaning of torch's ``key_padding_mask`` (pass ``~key_padding_mask``);
            float key/query masks are refused (TypeError): they look like torch's additive masks.
            One that is the same for every head is read in place, also next to an ``attn_mask``
            (no ``(..., L, S)`` array is made for it).
        is_causal: key ``s`` is visible to query ``l`` only if ``s <= l`` (``causal_alignment=
            "top_left"``, torch's) or ``s <= l + S - L`` (``"bottom_right"``, for a KV cache).
            torch's names of the two, ``"upper_left"`` and ``"lower_right"``
            (``torch.nn.attention.bias.CausalVariant``, ``causal_upper_left`` /
            ``causal_lower_right``), are taken as ``causal_alignment`` too.
            Combined with ``attn_mask`` (and the token masks) by logical AND: a key is visible only
            where causality and every mask allow it, a float mask being added on the keys causality
            leaves. torch's documentation says it raises for ``attn_mask`` with ``is_causal``.
            Its CPU implementation (2.13) combines them as here (logical AND) only where it picks
            its CPU flash kernel: 4-D inputs with ``Ev == E``; otherwise (3-D or 5-D inputs,
            ``Ev != E``, or the math backend forced with ``sdpa_kernel``) it raises
            "Explicit attn_mask should not be set when is_causal=True".
        scale: multiplies the scores; default ``1 / sqrt(E)``.
        enable_gqa: key/value may have fewer heads (dim -3) than query: see ``key``.
        return_weights: also return the attention probabilities.
        path: ``"auto"`` (tiled flash kernel; the reference when weights are asked for),
            ``"flash"`` or ``"reference"`` (the unfused oracle).
        return_lse: also return the log-sum-exp of each query row's scores,
            ``lse_i = log Σ_s exp(x_is)`` with ``x = Q Kᵀ · scale + mask`` over the keys row i may
            see: what the backward pass of FlashAttention-2 (Dao 2023, alg. 2) recomputes the
            weights from, ``weights = exp(x - lse)``.
        seed: the dropout mask's seed, an int in ``[0, 2**64)``; None (the default) takes the
            next seed of the package's generator (:func:`transformer_core.manual_seed`) when
            ``dropout_p > 0``, as torch's call draws from its generator. Not read when
            ``dropout_p`` is 0.

    Returns:
        ``(..., L, Ev)``, float64 if any of ``query``, ``key``, ``value`` is float64 (or wider),
        else float32 (a float ``attn_mask`` is converted to it); with
        ``return_weights`` and/or ``return_lse``, a tuple ``(output[, weights][, lse])`` in that
        order, weights ``(..., L, S)``, lse ``(..., L)``. A query row whose keys are all masked
        gives zeros in output and weights and ``-inf`` in lse; NaN in the inputs still gives NaN
        in the rows that read it (also with ``scale=0``: 0 · NaN is NaN, as in torch's math path).
        A NaN in a key or value that a mask or causality hides from a row may or may not reach
        that row, by path (the flash path skips whole hidden blocks; torch's gives NaN).

        The result is the same bit for bit for any thread count (``set_num_threads``): the
        kernels cut the work by the shapes alone.

    Raises:
        ValueError: rank < 2, empty arrays, mismatched leading dims / lengths / feature sizes,
            masks that do not broadcast (or 0/1 masks with other values), bad ``causal_alignment``
            or ``path``, a NaN ``scale`` or one infinite in the dtype (above its ``finfo.max``),
            ``dropout_p`` outside [0, 1], ``seed`` outside ``[0, 2**64)``; an input or mask whose
            needed copy (a broadcast view made contiguous, a mask over batch dims whose strides do
            not merge) exceeds this machine's memory, or the weights of ``return_weights`` would
            (checked before any copy).
        TypeError: non-numeric (or bool) arrays, a mask of a dtype that is neither bool nor float,
            flags that are not bools, ``scale`` or ``dropout_p`` not a number, ``seed`` not an int.
    """
    # the scalar and str arguments first, before any copy of the arrays (the seed drawn last of them)
    path = attention_path(path)
    scale = _given_scale(scale)
    is_causal = check_bool(is_causal, "is_causal")
    return_weights = check_bool(return_weights, "return_weights")
    return_lse = check_bool(return_lse, "return_lse")
    dropout_p = check_float(dropout_p, "dropout_p", minimum=0.0, maximum=1.0)
    seed = None if seed is None else _check_seed(seed)
    q, k, v, dtype, lead, L, S, E, heads, n, kv_heads, offset = _attention_inputs(
        query, key, value, enable_gqa, causal_alignment)
    scale = _check_scale(scale, E, dtype)
    # the masks are checked (and converted: they hold at most (..., L, S) values) before q, k, v are
    # copied: a mask of the wrong shape is refused before the inputs' float copies are made
    bool_mask, float_mask, key_slot = _attention_masks(attn_mask, query_mask, key_mask, lead, L, S, dtype, heads)
    if return_weights:  # the weights (..., L, S) are made in C++ after the copies: checked before them
        check_allocatable(lead + (L, S), np.dtype(dtype).itemsize, "return_weights: the weights (..., L, S)")
    q, k, v = _attention_arrays(q, k, v, dtype)
    q4 = q.reshape(n, heads, L, E)
    k4 = k.reshape(n, kv_heads, S, E)
    v4 = v.reshape(n, kv_heads, S, v.shape[-1])
    shape4 = (n, heads, L, S)
    bool_name = "attn_mask" if q.ndim <= 4 else ", ".join(  # up to 4-D the masks are views (_as_4d)
        name for name, given in (("attn_mask", attn_mask is not None and float_mask is None),
                                 ("query_mask", query_mask is not None),
                                 ("key_mask", key_mask is not None and key_slot is None)) if given)
    dropout_p, seed = _attention_dropout(dropout_p, seed)  # every argument checked: now a seed may be drawn
    result = variant("scaled_dot_product_attention", dtype)(
        q4, k4, v4, _as_4d(bool_mask, shape4, bool_name), _as_4d(float_mask, shape4), key_slot, is_causal, offset,
        scale, return_weights, path, return_lse=return_lse, dropout_p=dropout_p, seed=seed)
    if not (return_weights or return_lse):
        return result.reshape(lead + (L, v.shape[-1]))
    out = (result[0].reshape(lead + (L, v.shape[-1])),)
    if return_weights:
        out += (result[1].reshape(lead + (L, S)),)
    if return_lse:
        out += (result[-1].reshape(lead + (L,)),)
    return out


def varlen_attention(query, key, value, cu_seqlens, *, is_causal: bool = False, scale: float | None = None,
                     path: str = "auto") -> np.ndarray:
    """Self-attention over sequences of different lengths packed end to end, with no padding
    (FlashAttention's variable-length form, ``flash_attn_varlen_func`` with ``cu_seqlens``; the
    padding-mask section of the encoder tutorial, without the padding)::

        out[r0:r1] = Attention(Q[r0:r1], K[r0:r1], V[r0:r1])    r0, r1 = cu_seqlens[n], cu_seqlens[n + 1]

    Each sequence's queries attend to its own keys only. The result equals
    :func:`scaled_dot_product_attention` on the padded batch with a ``key_mask``, on the real rows;
    the padding's rows are neither stored nor computed. ``BertModel`` runs its attention this way
    on every batch with padding.

    Args:
        query: ``(T, H, E)``, T tokens of all sequences, H heads.
        key: ``(T, H_kv, E)``; ``H_kv`` divides ``H`` (grouped-query attention when smaller).
        value: ``(T, H_kv, Ev)``.
        cu_seqlens: ``(N + 1,)`` integers, 0 first, non-decreasing, T last: sequence ``n`` is rows
            ``cu_seqlens[n]`` to ``cu_seqlens[n + 1] - 1`` (an empty sequence is allowed).
        is_causal: key ``s`` is visible to query ``l`` only if ``s <= l``, both counted from the
            start of their sequence.
        scale: multiplies the scores; default ``1 / sqrt(E)``.
        path: ``"auto"`` / ``"flash"`` (one parallel pass of the tiled kernel over every
            (sequence, head, query block)) or ``"reference"`` (each sequence through the unfused
            oracle).

    Returns:
        ``(T, H, Ev)``, float64 if any of ``query``, ``key``, ``value`` is float64 (or wider),
        else float32. A sequence's rows are
        the same bit for bit whatever the other sequences and the thread count.

    Raises:
        ValueError: ranks other than 3, empty arrays, mismatched token counts, heads or feature
            sizes, ``cu_seqlens`` not starting at 0, decreasing or not ending at T, a bad ``path``,
            a NaN ``scale`` or one infinite in the dtype (above its ``finfo.max``).
        TypeError: non-numeric arrays, non-integer ``cu_seqlens``, ``is_causal`` not a bool,
            ``scale`` not a number.
    """
    is_causal = check_bool(is_causal, "is_causal")  # the scalar and str arguments before any copy
    scale = _given_scale(scale)
    path = attention_path(path)
    dtype, (query, key, value) = common_dtype((query, "query"), (key, "key"), (value, "value"))
    q = _as_given(query, "query", dtype, ndim=3)  # every shape and cu_seqlens are checked before any copy
    k = _as_given(key, "key", dtype, ndim=3)
    v = _as_given(value, "value", dtype, ndim=3)
    T, H, E = q.shape
    if k.shape[0] != T or v.shape[0] != T:
        raise ValueError(f"key, value: expected {T} tokens (query's) in dim 0, got key {k.shape}, value {v.shape}")
    if k.shape[2] != E:
        raise ValueError(f"key: expected last dim {E} (query's embedding size), got shape {k.shape}")
    if v.shape[1] != k.shape[1]:
        raise ValueError(f"value: expected {k.shape[1]} heads (key's) in dim 1, got shape {v.shape}")
    if H % k.shape[1] != 0:
        raise ValueError(f"key: query heads ({H}) must be a multiple of key/value heads ({k.shape[1]})")
    cu = to_numpy(cu_seqlens, "cu_seqlens")
    if cu.dtype.kind not in "iu":
        raise TypeError(f"cu_seqlens: expected integers, got dtype {cu.dtype}")
    if cu.ndim != 1 or cu.size < 2:
        raise ValueError(f"cu_seqlens: expected a 1-D array (N + 1,) with N >= 1, got shape {cu.shape}")
    check_allocatable(cu.shape, 9, "cu_seqlens")  # its int64 copy and the comparison's bools
    if cu[0] != 0 or cu[-1] != T:
        raise ValueError(f"cu_seqlens: expected 0 first and {T} (the tokens) last, got {int(cu[0])} and {int(cu[-1])}")
    down = np.flatnonzero(cu[1:] < cu[:-1])
    if down.size:
        i = int(down[0])
        raise ValueError(f"cu_seqlens: expected non-decreasing offsets, got cu_seqlens[{i + 1}] = {int(cu[i + 1])} "
                         f"after cu_seqlens[{i}] = {int(cu[i])}")
    cu = np.ascontiguousarray(cu, dtype=np.int64)
    scale = _check_scale(scale, E, dtype)
    q, k, v = _attention_arrays(q, k, v, dtype)
    return variant("varlen_attention", dtype)(q, k, v, cu, is_causal, scale, path)


# --------------------------------------------------------------------------------------------------
# Training: the gated unit, dropout, cross-entropy (their backward: backward.py)
# --------------------------------------------------------------------------------------------------


def _gate_up(gate, up, extra=()):
    """``(dtype, gate, up)``: the arrays as given, NOT converted (their shapes checked; the caller
    converts them when its own checks have passed). At least 1-D: the C++ op splits its inputs into
    rows of the last dim, a 0-d array has none. The dtype: float64 if gate, up or one of extra's
    ``(value, name)`` pairs (the backward's grad_output) is."""
    dtype, arrays = common_dtype((gate, "gate"), (up, "up"), *extra)
    g = _as_given(arrays[0], "gate", dtype, min_ndim=1)
    u = _as_given(arrays[1], "up", dtype, min_ndim=1)
    if u.shape != g.shape:
        raise ValueError(f"up: expected the shape of gate {g.shape}, got {u.shape}")
    return dtype, g, u


def glu(gate, up=None, activation: str = "silu", *, dim=None) -> np.ndarray:
    """Gated linear unit of the feed-forward layer (Shazeer 2020, "GLU Variants Improve Transformer";
    Llama's MLP is ``down_proj(silu(gate_proj(x)) · up_proj(x))``)::

        h = act(gate) · up        act: "silu" (SwiGLU), "gelu" / "gelu_tanh" (GeGLU), "relu" (ReGLU)

    Differences from torch: ``torch.nn.functional.glu(input, dim=-1)`` is another function of the
    same name: it splits ``input`` in two halves ``a, b`` along ``dim`` and returns
    ``a · sigmoid(b)`` (Dauphin et al. 2017). This one takes the gate and the other branch as two
    arrays and has no sigmoid activation. A call in torch's form, ``glu(x)`` or ``glu(x, dim)``
    with an int second argument or ``dim=`` given, is a TypeError that says so. torch's GLU in numpy:
    ``a, b = np.split(x, 2, axis=dim); a / (1 + np.exp(-b))``.

    Args:
        gate, up: float arrays of the same shape, at least 1-D, e.g. ``(N, L, dim_feedforward)``.
            ``up`` is required: its default None only lets torch's one-argument call be refused
            with that hint.
        activation: a name of the library's table of activations (``"silu"``, ``"gelu"``,
            ``"gelu_tanh"``, ``"relu"``, ...).
        dim: torch's keyword, refused (any value): it exists only to say that this is not torch's
            ``F.glu(input, dim=...)``.

    Returns:
        The shape of ``gate``; float64 if ``gate`` or ``up`` is float64 (or wider), else float32.

    Raises:
        ValueError: shapes differ, empty or 0-d arrays, unknown ``activation``. TypeError: non-numeric
            arrays; ``up`` None or an int, or ``dim`` given (torch's ``F.glu(x)`` / ``F.glu(x, dim)``),
            before any copy.
    """
    if dim is not None:  # torch's keyword form, F.glu(x, dim=...)
        raise TypeError(f"dim: torch's argument of F.glu(input, dim), got {dim!r}: this glu is the gated feed-forward "
                        f"act(gate) * up, not torch's a * sigmoid(b) of input's two halves; torch's F.glu(x, dim) in "
                        f"numpy: a, b = np.split(x, 2, axis=dim); a / (1 + np.exp(-b))")
    if up is None or (isinstance(up, (int, np.integer)) and not isinstance(up, bool)):
        got = "None" if up is None else f"{type(up).__name__} {up} (torch's dim)"
        dim = -1 if up is None else int(up)
        raise TypeError(f"up: expected an array of gate's shape, got {got}: this glu is the gated feed-forward "
                        f"act(gate) * up, not torch's F.glu(input, dim), which returns a * sigmoid(b) of input's "
                        f"two halves along dim; torch's F.glu(x, {dim}) in numpy: a, b = np.split(x, 2, axis={dim}); "
                        f"a / (1 + np.exp(-b))")
    activation_of(activation, "activation")
    dtype, g, u = _gate_up(gate, up)
    return variant("glu", dtype)(_as_dtype(g, "gate", dtype), _as_dtype(u, "up", dtype), activation)


def _check_p(p) -> float:
    return check_float(p, "p", minimum=0.0, maximum=1.0)


def _check_seed(seed) -> int | None:
    """``seed`` of a dropout mask (:func:`dropout`, attention's ``seed``,
    ``backward.dropout_backward``): None, or an int in ``[0, 2**64)``. A TypeError (``"expected an
    int or None"``) for anything else, a bool or a whole float too; a ValueError for an int out of
    range."""
    from ._validation import described, is_int

    if seed is not None and not is_int(seed):
        raise TypeError(f"seed: expected an int or None, got {described(seed)}")
    return None if seed is None else check_int(seed, "seed", 0, 2**64 - 1)


def dropout(x, p: float = 0.5, seed: int | None = None, training: bool = True, *, inplace: bool = False) -> np.ndarray:
    """Inverted dropout (Srivastava et al. 2014), as ``torch.nn.functional.dropout``, with the mask
    drawn from a counter-based generator (Philox4x32-10, Salmon et al. 2011) keyed by ``seed``::

        keep_i = u_i >= p,   u_i = Philox(seed, i) / 2³²,    y_i = keep_i ? x_i / (1 - p) : x_i · 0

    A dropped element is ``x_i · 0`` as in torch (which multiplies by the scaled mask): 0, or NaN
    where ``x_i`` is NaN or ±inf, so a non-finite input is never hidden (with ``p=1`` too).

    The mask depends only on ``(seed, flat index i)``: not on the thread count, and
    ``backward.dropout_backward`` regenerates it from the same seed instead of storing it. It is not
    torch's mask (torch draws from its own generator); its statistics are the same. Use a different
    seed for every call (e.g. one per layer and step).

    Why a training call with ``p > 0`` needs a seed here: the mask is not stored, so its backward,
    ``backward.dropout_backward``, must be given the same seed to regenerate it, and a seed drawn
    here from the package's generator would not be returned to the caller.
    :func:`scaled_dot_product_attention` does draw one when its ``seed`` is None, so that torch's
    calls run as they are; its backward (``backward.scaled_dot_product_attention_backward``) cannot
    regenerate that mask then: give both calls the seed. The layers and models
    (``nn.MultiheadAttention``, the Transformer layers, BERT, the causal LMs' ``loss``) draw their
    seeds from the package's generator (:func:`transformer_core.manual_seed`) in a training forward
    when given none, and keep them for their own backward.

    torch's signature is ``F.dropout(input, p=0.5, training=True, inplace=False)``: its calls by
    keyword run as they are (with ``seed=`` where a mask is drawn). Its third positional argument is
    ``training``; this function's is ``seed``: pass ``training=`` by keyword (a bool in the ``seed``
    slot is a TypeError that says so).

    Args:
        x: float array of any shape.
        p: the probability of dropping an element, in [0, 1] (1: ``x · 0``, zeros for finite
            ``x``, as torch). Default 0.5, torch's.
        seed: an int in [0, 2**64), or None (default) where no mask is drawn: with
            ``training=False`` or ``p=0`` (the result does not depend on the seed). A training call
            with ``p > 0`` needs one (above).
        training: False returns a copy of ``x`` (no dropout), as ``F.dropout(training=False)``.
        inplace: keyword only. False (default): the result is a new array. True (torch's
            ``inplace=True``): the result is written into ``x``, which is returned (with
            ``training=False``, ``x`` unchanged); ``x`` must then be a writeable, C-contiguous numpy
            array of the result's dtype (float32, or float64).

    Returns:
        The shape of ``x``; float64 if ``x`` is float64 (or wider), else float32; ``x`` itself with
        ``inplace=True``.

    Raises:
        ValueError: ``p`` outside [0, 1] or NaN, ``seed`` out of range, ``seed`` None in a
            training call with ``p > 0``, empty ``x``; ``inplace=True`` with an ``x`` the result
            cannot be written into (not a numpy array, another dtype than the result's, not
            C-contiguous, read-only: the message says which), before anything is computed.
        TypeError: non-numeric ``x``, ``p`` not a real number, ``seed`` neither None nor an int (a
            bool: torch's ``training`` slot), ``training`` or ``inplace`` not a bool (1 and 0 too).
    """
    p = _check_p(p)  # the scalar arguments before x's (float32) copy
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError(f"seed: expected an int or None, got bool {seed} (torch's third positional argument is "
                        f"training; this function's is seed: pass training= by keyword)")
    seed = _check_seed(seed)
    training = check_bool(training, "training")
    inplace = check_bool(inplace, "inplace")
    if seed is None and training and p > 0:
        raise ValueError(f"seed: a training call with p > 0 needs a seed (an int in [0, 2**64)) to draw its "
                         f"mask, got None (p={p}); training=False or p=0 needs none. backward.dropout_backward "
                         f"regenerates the mask from the seed: pass it the same one")
    given = x
    if inplace:  # before x is converted: the result must fit in x itself
        dtype = np.dtype(compute_dtype(x, "x"))  # a TypeError for non-numeric x first
        why = None
        if not isinstance(x, np.ndarray):
            why = f"x is a {type_path(x)}, not a numpy array"
        elif x.dtype != dtype:
            why = f"x is {x.dtype}, the result {dtype.name}"
        elif not x.flags.c_contiguous:
            why = "x is not C-contiguous"
        elif not x.flags.writeable:
            why = "x is read-only"
        if why is not None:
            raise ValueError(f"inplace: True writes the result into x, which must be a writeable, C-contiguous "
                             f"numpy array of the result's dtype (float32, or float64 for float64 x): {why}; "
                             f"pass inplace=False for a new array")
    x = as_float(x, "x")  # with inplace: a view of the given array (its dtype and layout need no copy)
    if not training:
        return given if inplace else x.copy()
    if seed is None:  # p == 0: every element kept, whatever the seed
        seed = 0
    y = _dropped_times_zero(x, variant("dropout", x.dtype.type)(x, p, seed), p)
    if not inplace:
        return y
    x[...] = y
    return given


def _dropped_times_zero(x: np.ndarray, y: np.ndarray, p: float) -> np.ndarray:
    """y (the dropout kernel's output for x) with its dropped elements as torch's x · 0.

    The kernel writes 0 for a dropped element; torch's x · 0 is NaN for a NaN or ±inf x. A kept
    non-finite x stays non-finite (never 0), so y == 0 there means dropped. The sum (no copy) is
    non-finite whenever some x_i is: the masks are built only for such rare inputs."""
    with np.errstate(all="ignore"):  # inf - inf, or an overflowing sum of finite values: both mean "look"
        look = p > 0 and not np.isfinite(x.sum())
    if look:
        dropped_nonfinite = ~np.isfinite(x)
        dropped_nonfinite &= y == 0
        y[dropped_nonfinite] = np.nan
    return y


def _cross_entropy_args(logits, target, ignore_index, label_smoothing, reduction, dtype=None):
    """Checks the arguments of the cross-entropy functions, for logits to be converted to ``dtype``
    (None: the logits' compute dtype): returns
    ``(logits, target1d [rows] int64, lead shape, ignore_index, label_smoothing, reduction)``,
    ``logits`` as given (NOT converted: the caller converts it with :func:`_logits_rows` when its
    own checks have passed), its dtype checked (real numeric data)."""
    reduction = reduction_of(reduction, "reduction")
    ignore_index = check_int(ignore_index, "ignore_index", -2**63, 2**63 - 1)
    label_smoothing = check_float(label_smoothing, "label_smoothing", minimum=0.0, maximum=1.0)
    x = to_numpy(logits, "logits")
    dtype = compute_dtype(x, "logits") if dtype is None else dtype
    x = _as_given(x, "logits", dtype, min_ndim=1)
    t = to_numpy(target, "target")
    if t.dtype.kind not in "iu":
        raise TypeError(f"target: expected integer class indices, got dtype {t.dtype}")
    lead, V = x.shape[:-1], x.shape[-1]
    if t.shape != lead:
        raise ValueError(f"target: expected shape {lead} (logits' shape without the class dim), got {t.shape}")
    if t.size > _UNCHECKED_COPY_SIZE:  # its int64 copy (none for a contiguous int64 target) and the range
        copied = not (t.flags.c_contiguous and t.dtype == np.int64)  # check's two bool arrays
        check_allocatable(t.shape, 8 * copied + 2, "target: its int64 copy and the range check's bool arrays"
                          if copied else "target: the range check's bool arrays")
    if t.dtype.kind == "u" and t.dtype.itemsize == 8 and t.size and t.max() > np.iinfo(np.int64).max:
        # a uint64 beyond int64's range would wrap to a negative index (maybe ignore_index): refused
        # here, any other value (ignore_index >= V included) is left to the check below
        where = tuple(int(i) for i in np.argwhere(t > np.iinfo(np.int64).max)[0])
        raise ValueError(f"target: expected class indices in [0, {V}) or ignore_index ({ignore_index}), "
                         f"got {int(t[where])} at index {where}")
    t = np.ascontiguousarray(t, dtype=np.int64)
    bad = t < 0  # in place: two bool arrays at most
    bad |= t >= V
    bad &= t != ignore_index
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"target: expected class indices in [0, {V}) or ignore_index ({ignore_index}), "
                         f"got {int(t[where])} at index {where}")
    return x, t.reshape(-1), lead, ignore_index, label_smoothing, reduction


def _logits_rows(logits: np.ndarray, dtype=None) -> np.ndarray:
    """The checked logits (:func:`_cross_entropy_args`'s) converted to ``dtype`` (None: their compute
    dtype), as ``(rows, V)``."""
    x = _as_dtype(logits, "logits", compute_dtype(logits, "logits") if dtype is None else dtype)
    return x.reshape(-1, x.shape[-1])


def cross_entropy(logits, target, ignore_index: int = -100, label_smoothing: float = 0.0,
                  reduction: str = "mean"):
    """Cross-entropy of class logits against class indices, as ``torch.nn.functional.cross_entropy``
    with ``weight=None``, fused with the log-softmax over the classes (one pass per row)::

        loss_r = (1 - ε) · (lse_r - x_r[t_r]) + (ε / V) · Σ_j (lse_r - x_r[j]),   lse_r = log Σ_j exp(x_r[j])

    (torch's formula for ``label_smoothing`` ε, LossNLL.cpp), reduced over the rows whose target is
    not ``ignore_index``: their mean (``"mean"``), their sum (``"sum"``) or per row (``"none"``,
    ignored rows 0).

    Differences from torch: the class dim is the LAST dim (``logits (..., V)``, targets ``(...)``,
    as a language model's ``(N, L, V)`` logits), not dim 1; and when every row is ignored the mean
    is 0 (torch returns NaN, 0/0), so a batch of padding cannot poison a running loss; and the
    label-smoothing sum is accumulated in double, so float32 logits within about a factor V of
    the float32 maximum can give a finite loss where torch's float32 overflows to inf (float64
    overflows there, here as in torch). As in torch, a NaN or +inf logit gives a NaN loss; a -inf logit gives +inf
    when it is the target's (or any class's with ``label_smoothing`` > 0) and is harmless
    otherwise (a masked vocabulary). The loss is returned as is: check it (``np.isfinite``)
    before stepping.

    Args:
        logits: ``(..., V)`` float array (not empty).
        target: ``(...)`` integer array, values in ``[0, V)`` or ``ignore_index``.
        ignore_index: target value whose rows count neither in the loss nor in the mean.
        label_smoothing: ε in [0, 1].
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Returns:
        ``"mean"``/``"sum"``: a numpy scalar of the logits' compute dtype (float64 if they are
        float64 or wider, else float32);
        ``"none"``: an array of ``target``'s shape. Sums are accumulated in double.

    Raises:
        ValueError: target of the wrong shape or with an index out of range, ``label_smoothing``
            outside [0, 1], unknown ``reduction``, empty ``logits``; ``logits``' float copy or
            ``target``'s int64 copy larger than this machine's memory (checked before the copy).
        TypeError: non-integer ``target``, non-numeric ``logits``, non-int ``ignore_index``.
    """
    x, t, lead, ignore_index, label_smoothing, reduction = _cross_entropy_args(
        logits, target, ignore_index, label_smoothing, reduction)
    x = _logits_rows(x)
    loss, _, _ = variant("cross_entropy", x.dtype.type)(x, t, ignore_index, label_smoothing, reduction, 1.0, None,
                                                         False)
    if reduction == "none":
        return loss.reshape(lead)
    with np.errstate(over="ignore"):  # a loss beyond float32's range is inf, as torch's (no warning)
        return x.dtype.type(loss)


# Positional encodings live in positional.py (they import this module); re-exported here so that
# every functional op is one import away.
from .positional import (  # noqa: E402
    apply_rotary,
    apply_rotary_pos_emb,
    rotary_cos_sin,
    rotate_half,
    sinusoidal_positional_encoding,
)
