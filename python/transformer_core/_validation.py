"""Argument checking and array conversion at the Python boundary: the one place that owns what a
user can get wrong about arguments as Python objects.

What lives here (and where the rest lives):

* **types and dtypes**: every array-like is converted here, once. An op computes in ``float64``
  if ANY of its float data arguments (inputs, weights, biases, query/key/value, gate/up, output
  gradients) is ``float64`` in any byte order or a wider float (``np.longdouble``: computed in
  float64, the widest the core has), else in ``float32`` (:func:`common_dtype`): a float64
  argument is never narrowed to another argument's float32, whichever comes first. Masks, rotary
  tables and other non-data arguments follow that dtype. float16, float32 and integers alone
  compute in ``float32``; a nested list of Python floats counts as float64 (numpy reads it so).
  Narrowing a float64 value to float32 refuses finite values beyond float32's range (which would
  become inf) with a ``ValueError`` naming the argument; an inf or NaN given stays one. A float
  attention mask's such values are clamped to float32's largest instead (:func:`as_attention_mask`).
  ``bool``, complex, object, string, datetime and void data are refused with a ``TypeError`` (a
  bool array is a mask, not numbers). ndarray subclasses (``np.matrix``, ``np.memmap``) are read
  as plain ndarrays; a ``np.ma.MaskedArray`` is refused (its mask would be ignored).
  Non-contiguous, Fortran-order and big-endian inputs are copied to C-contiguous native arrays
  (a copy larger than this machine's memory, e.g. of an ``np.broadcast_to`` view, is a ValueError).
  Python lists must be rectangular (ragged nesting is a ``ValueError``). torch tensors are read
  without importing torch (bfloat16 is widened to float32 first: only the values a tensor holds,
  an expanded view staying a broadcast view).
* **ranks and shapes**: expected rank, agreement with other arguments and with the layer.
* **scalar ranges**: sizes (ints, not bools, within ``[minimum, 2**63)``), epsilons (finite,
  >= 0), probabilities, ``top_p`` in [0, 1], ...
* **Python-side allocations**: anything numpy allocates (``masks.causal_mask``, pooling, padding)
  is checked against this machine's memory first (:func:`check_allocatable`), as the C++ code that
  allocates checks its own sizes (``ops::WeightsCheck``, the bindings' ``new_array``,
  ``KVCache::reserve``).
* **enumerated names** (activations, attention paths, rotary layouts, reductions) have one table,
  in C++: :func:`choice_of_core` passes the string to it and renames the error; no second list here.

Every error is a ``TypeError`` (wrong kind of object) or ``ValueError`` (right kind, wrong value)
whose message starts with the argument's name and says what was expected and what was given,
raised before anything is allocated.
"""

from __future__ import annotations

import math
import numbers
import sys

import numpy as np

from . import _runtime  # the compiled core's tables of names (read as _runtime.core at each call)

FLOAT_DTYPES = (np.float32, np.float64)

#: The largest size a size argument may have: the C++ core counts in signed 64-bit integers.
MAX_SIZE = 2**63 - 1

#: Copies of at most this many elements (64 MiB of float64) are not checked against memory: every
#: machine holds them, and the check (a few microseconds) would slow the small calls of decoding.
_UNCHECKED_COPY_SIZE = 2**23


# ------------------------------------------------------------------------------------------------
# Arrays
# ------------------------------------------------------------------------------------------------
def _is_torch_tensor(x) -> bool:
    return hasattr(x, "detach") and hasattr(x, "cpu") and hasattr(x, "numpy") and hasattr(x, "dtype")


def _describe(x) -> str:
    return "None" if x is None else type(x).__name__


def to_numpy(x, name: str) -> np.ndarray:
    """``x`` (a numpy array, a torch tensor, a nested list of numbers, a scalar) as a plain numpy
    array, without copying what need not be copied and without checking its dtype.

    An ndarray subclass is viewed as a plain ndarray, its values and shape (an ``np.matrix`` would
    stay 2-D when reshaped, and multiply as matrices). A torch bfloat16 tensor is widened to
    float32 (numpy has no bfloat16); an expanded one (stride 0) has only the values it holds
    widened, and is returned as a broadcast view of them, as a tensor on another device is moved.

    Raises:
        TypeError: ``x`` is None, a str/bytes/dict/set, a ``np.ma.MaskedArray`` (its mask would be
            ignored), or converts to an object array (a list of objects that are not numbers).
        ValueError: a ragged nested list; a bfloat16 tensor whose float32 copy would exceed this
            machine's memory.
    """
    if type(x) is np.ndarray:  # the common case first: a plain ndarray is returned as is (below too)
        return x
    if x is None:
        raise TypeError(f"{name}: expected an array, got None")
    if isinstance(x, (str, bytes, dict, set, frozenset)):
        raise TypeError(f"{name}: expected an array, got {type(x).__name__}")
    if _is_torch_tensor(x):
        if x.is_meta:  # accelerate's init_empty_weights: a shape, no data
            raise TypeError(f"{name}: expected a tensor with data, got a meta tensor of shape {tuple(x.shape)} "
                            "(load the weights before passing them)")
        try:
            t = x.detach()
            widen = str(t.dtype) == "torch.bfloat16"  # numpy has no bfloat16: widened exactly to float32
            stride = t.stride()
            if 0 in stride and (widen or getattr(t.device, "type", "cpu") != "cpu"):
                # an expanded view: only the values it holds are moved and widened, then broadcast
                # again (torch's .float() or .cpu() of the view would first make its full copy)
                held = t[tuple(slice(0, 1) if st == 0 else slice(None) for st in stride)]
                return np.broadcast_to(_tensor_numpy(held, widen, name), tuple(t.shape))
            return _tensor_numpy(t, widen, name)
        except (TypeError, RuntimeError, NotImplementedError) as e:
            raise TypeError(f"{name}: expected a tensor numpy can read, got {x.dtype} on {x.device} ({e})") from None
    if isinstance(x, np.ndarray):
        if type(x) is np.ndarray:
            return x
        if isinstance(x, np.ma.MaskedArray):
            raise TypeError(f"{name}: expected an array, got a numpy masked array (its mask would be ignored): "
                            f"pass .filled(value) to say what the masked entries are")
        return x.view(np.ndarray)  # np.matrix (always 2-D, reshape keeps it so), np.memmap, ...: its values
    try:
        arr = np.asarray(x)
    except (ValueError, TypeError) as e:  # ragged lists (numpy >= 1.24 refuses them), odd objects
        if isinstance(x, (list, tuple)):
            raise ValueError(f"{name}: expected a rectangular array (nested lists of equal lengths), "
                             f"got a ragged {type(x).__name__}") from None
        raise TypeError(f"{name}: expected an array, got {type(x).__name__} ({e})") from None
    if arr.dtype.kind == "O":
        raise TypeError(f"{name}: expected a numeric array, got {type(x).__name__} of objects (dtype object)")
    return arr


def _tensor_numpy(t, widen: bool, name: str) -> np.ndarray:
    """A torch tensor's values as a numpy array (moved to the CPU; widened to float32 if
    ``widen``, bfloat16's case: that copy is checked against this machine's memory first, naming
    ``name``, as a view whose elements overlap has more elements than values)."""
    t = t.cpu()
    if widen:
        if t.numel() > _UNCHECKED_COPY_SIZE:
            check_allocatable(tuple(t.shape), 4, name)
        t = t.float()
    return t.numpy()


def compute_dtype(x, name: str) -> type:
    """The float dtype an op computes in for input ``x``: float64 for float64 (either byte order)
    and wider floats (``np.longdouble``), else float32. For several data arguments:
    :func:`common_dtype`.

    Raises:
        TypeError: ``x`` is not real numeric data (bool, complex, object, str, datetime, void).
    """
    arr = to_numpy(x, name)
    kind = arr.dtype.kind
    if kind == "b":
        raise TypeError(f"{name}: expected a real numeric array, got dtype bool (a mask is not numbers: "
                        f"convert it with .astype(np.float32) if you mean 0/1 values)")
    if kind not in "iuf":
        raise TypeError(f"{name}: expected a real numeric array, got dtype {arr.dtype}")
    return np.float64 if kind == "f" and arr.dtype.itemsize >= 8 else np.float32


def common_dtype(*named) -> tuple:
    """The float dtype an op with several float data arguments (inputs, weights, biases,
    query/key/value, gate/up, output gradients) computes in: float64 if ANY of them is float64 or
    a wider float (:func:`compute_dtype`), else float32, whichever argument comes first: as torch's
    type promotion, a float64 argument is never narrowed to another's float32. The op's other
    arguments (masks, rotary tables) follow the result. Nothing is copied or allocated (but a
    Python list's conversion): the ops' shape and size checks run on the converted arguments.

    Args:
        named: ``(value, name)`` pairs; a None value (an optional argument not given) is skipped.

    Returns:
        ``(dtype, arrays)``: ``arrays`` the values as :func:`to_numpy` gives them (None stays
        None), in order, to pass on to :func:`as_float` without reading them a second time.

    Raises:
        TypeError: a value that is not real numeric data (see :func:`compute_dtype`), None
            excepted. ValueError: a ragged list.
    """
    arrays = [None if value is None else to_numpy(value, name) for value, name in named]
    dtype = np.float32
    for arr, (_, name) in zip(arrays, named):
        if arr is not None and compute_dtype(arr, name) is np.float64:
            dtype = np.float64
    return dtype, arrays


def as_float(x, name: str, dtype=None, *, min_ndim: int = 0, ndim: int | None = None,
             allow_empty: bool = False) -> np.ndarray:
    """``x`` as a C-contiguous, native-byte-order float array of ``dtype`` (default:
    :func:`compute_dtype`: float64 and wider floats compute in float64, any other real dtype in
    float32).

    Raises:
        TypeError: not real numeric data (see :func:`compute_dtype`), None.
        ValueError: a ragged list, the wrong rank (``ndim``, ``min_ndim``), an empty array unless
            ``allow_empty``; a finite value beyond ``dtype``'s range (float64 narrowed to float32).
    """
    arr = to_numpy(x, name)
    own = compute_dtype(arr, name)
    dtype = own if dtype is None else dtype
    check_rank(arr, name, ndim=ndim, min_ndim=min_ndim, allow_empty=allow_empty)
    return _contiguous(arr, dtype, name)


def unconverted(x, name: str, min_ndim: int = 0, ndim: int | None = None) -> np.ndarray:
    """``x`` as :func:`to_numpy` gives it (a numpy array is itself: no copy, no dtype converted),
    with the checks :func:`as_float` makes before its copy: a real numeric dtype (``TypeError``),
    ``ndim`` dims (or at least ``min_ndim``) and not empty (``ValueError``, :func:`check_rank`).
    The caller checks the shape of this array (and the size of what it makes from it), then
    converts it: a
    wrong-shaped input, or a broadcast view whose copy would not fit, is refused before any
    allocation."""
    arr = to_numpy(x, name)
    compute_dtype(arr, name)
    check_rank(arr, name, ndim=ndim, min_ndim=min_ndim)
    return arr


def check_rank(arr: np.ndarray, name: str, *, ndim: int | None = None, min_ndim: int = 0,
               allow_empty: bool = False) -> None:
    """:func:`as_float`'s checks of an array's rank and size, in its words, before any copy.

    Raises:
        ValueError: ``arr`` not ``ndim``-D (when given) or of fewer than ``min_ndim`` dims; empty
            unless ``allow_empty``.
    """
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got {arr.ndim}-D with shape {arr.shape}")
    if arr.ndim < min_ndim:
        raise ValueError(f"{name}: expected at least {min_ndim} dims, got {arr.ndim}-D with shape {arr.shape}")
    if not allow_empty and arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty array, got shape {arr.shape}")


def _contiguous(arr: np.ndarray, dtype, name: str) -> np.ndarray:
    """``arr`` as a C-contiguous, native-byte-order array of ``dtype``, its shape kept (a 0-d array
    stays 0-d: ``np.ascontiguousarray`` alone would make it 1-d).

    A copy is checked against this machine's memory first (:func:`check_allocatable`, ValueError
    naming ``name``): a broadcast view (``np.broadcast_to``, stride 0) holds a few bytes for a shape
    whose copy no machine can hold, and a narrow dtype widens (int8 to float32: 4 times the bytes).
    An array that needs no copy is returned as is, unchecked.

    A float narrowed (float64 or longdouble to float32, longdouble to float64) must stay finite: a
    finite value beyond ``dtype``'s range, which the cast would make inf, is a ValueError naming
    ``name`` (an inf or NaN given stays one). One pass: the sum of the copy, finite unless some
    value is not (or the sum overflows); the values are looked at one by one only then."""
    if arr.dtype == dtype and arr.flags.c_contiguous:  # nothing to convert (as np.ascontiguousarray returns it)
        return arr
    if arr.size > _UNCHECKED_COPY_SIZE and not (arr.flags.c_contiguous and arr.dtype == dtype):
        check_allocatable(arr.shape, np.dtype(dtype).itemsize, name)
    target = np.dtype(dtype)
    if arr.dtype.kind != "f" or target.kind != "f" or arr.dtype.itemsize <= target.itemsize:
        return np.ascontiguousarray(arr, dtype=dtype).reshape(arr.shape)
    with np.errstate(over="ignore", invalid="ignore"):  # reported below, not as a RuntimeWarning
        out = np.ascontiguousarray(arr, dtype=dtype).reshape(arr.shape)
        look = not np.isfinite(out.sum())
    if look:
        overflowed = np.isinf(out) & np.isfinite(arr)
        if overflowed.any():
            where = tuple(int(i) for i in np.argwhere(overflowed)[0])
            # the cast rounds to nearest: from the largest float plus half its spacing up, inf
            largest = np.finfo(target).max
            limit = float(largest) + (float(largest) - float(np.nextafter(largest, target.type(0)))) / 2
            raise ValueError(f"{name}: expected values within {target.name}'s range (|v| < {limit!r}), got "
                             f"{arr[where]} at index {where} (which overflows {target.name})")
    return out


def _unbroadcast(arr: np.ndarray) -> np.ndarray:
    """The part of ``arr`` that holds its values: each dim of stride 0 (a broadcast dim) cut to size
    1, a view (``np.broadcast_to(_unbroadcast(a), a.shape)`` has ``a``'s values). ``arr`` itself when
    it has no such dim."""
    if 0 not in arr.strides:
        return arr
    return arr[tuple(slice(0, 1) if st == 0 else slice(None) for st in arr.strides)]


def as_weight(value, name: str, dtype) -> np.ndarray:
    """A checkpoint value (numpy array, torch tensor of any float dtype, bfloat16 included, or a nested
    list) as a C-contiguous array of ``dtype``.

    Raises:
        TypeError: the value is not a floating-point array (integer, bool, complex, object or string
            data is refused: a weight of another kind means a wrong checkpoint).
        ValueError: a ragged list.
    """
    if _is_torch_tensor(value) and not value.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {value.dtype}")
    arr = to_numpy(value, name)
    if arr.dtype.kind != "f":
        raise TypeError(f"{name}: expected a floating-point array, got dtype {arr.dtype}")
    return _contiguous(arr, dtype, name)


def as_bool(x, name: str, *, allow_float: bool = False) -> np.ndarray:
    """A keep-mask (True / 1 = a real token, may attend) as a numpy bool array: bool, or integers
    (Hugging Face ``attention_mask`` style) whose every value is 0 or 1.

    Float masks are refused unless ``allow_float``: a float ``key_mask`` looks like torch's additive
    ``key_padding_mask`` (0 = keep), whose all-zeros "mask nothing" would read here as "mask
    everything". The models' ``attention_mask`` passes ``allow_float=True``: Hugging Face's
    ``attention_mask`` is 1/0 = keep/pad in float too (``mask.float()``), the same meaning.

    A bool mask is returned as is. A numeric one has only the values it holds read and converted: a
    broadcast view (``np.broadcast_to``, stride 0) gives a broadcast bool view of the same shape (its
    ``(L, S)`` view of one row is ``S`` values, not ``L · S``); the bool array made is checked
    against this machine's memory first.

    Raises:
        TypeError: another dtype (float where not allowed), None. ValueError: values other than 0
            and 1, a ragged list, a bool copy larger than this machine's memory (naming ``name``).
    """
    arr = to_numpy(x, name)
    if arr.dtype == np.bool_:
        return arr
    if arr.dtype.kind == "f" and not allow_float:
        if name.endswith("key_mask"):  # key_mask, src_key_mask, ...: torch's (src_)key_padding_mask
            why = ("a float key mask looks like torch's additive key_padding_mask (0 = keep); pass a bool mask "
                   "(torch's bool key_padding_mask: ~mask)")
        else:
            why = f"a float {name} could be additive (0 = keep) or 1/0 (1 = keep); pass a bool mask"
        raise TypeError(f"{name}: expected bool or integer 0/1 (True/1 = a real token), got {arr.dtype} — {why}")
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name}: expected a bool or 0/1 mask, got dtype {arr.dtype}")
    own = _unbroadcast(arr)
    if own.size > _UNCHECKED_COPY_SIZE:  # e.g. a view whose rows overlap (sliding_window_view)
        check_allocatable(own.shape, 1, name)
    ones = own == 1
    if not np.all(ones | (own == 0)):
        bad = np.unique(own[~(ones | (own == 0))])[:3]
        raise ValueError(f"{name}: expected a bool or 0/1 mask, got values such as {bad.tolist()}")
    return ones if own is arr else np.broadcast_to(ones, arr.shape)


def as_attention_mask(x, name: str, dtype) -> np.ndarray:
    """An attention mask: bool (True = may attend) as is, or float (added to the scores) as
    ``dtype``. Integer masks are refused: 0/1 could mean either convention.

    A float mask narrowed (float64 to float32, longdouble to float64) has its finite values beyond
    ``dtype``'s range clamped to ``[finfo(dtype).min, finfo(dtype).max]`` (``-1e300`` becomes
    float32's ``-3.4028235e38``); ``±inf`` and NaN stay as given. A data argument's such value is refused
    instead (:func:`as_float`); a mask's is a legitimate "never attend" value, and clamping keeps
    its meaning the same in either dtype: beside finite scores it still gives a weight of 0, and a
    row masked by it everywhere averages the values, as in float64 and torch (an inf would have
    made it a fully masked row: zeros).

    A conversion (another float dtype, a record array's unaligned field) copies only the values the
    mask holds: a broadcast view (``np.broadcast_to``, stride 0) stays one, its broadcast dims
    converted once (a float64 ``(L, S)`` view of one value is 4 or 8 bytes, not ``L · S``); what is
    copied is checked against this machine's memory first.

    Raises:
        TypeError: a dtype that is neither bool nor float, None.
        ValueError: the values to convert need more than this machine's memory (naming ``name``).
    """
    arr = to_numpy(x, name)
    if arr.dtype.kind == "f":
        if arr.dtype != dtype:
            arr = _converted(arr, dtype, name)
    elif arr.dtype != np.bool_:
        raise TypeError(f"{name}: expected bool (True = may attend) or float (added to the scores), got dtype "
                        f"{arr.dtype}")
    if not arr.flags.aligned or any(s % arr.itemsize for s in arr.strides):
        arr = _converted(arr, arr.dtype, name)  # a record array's field: the kernels step in whole elements
    return arr


def _converted(arr: np.ndarray, dtype, name: str) -> np.ndarray:
    """``arr`` as a new C-order array of ``dtype`` (a broadcast view: its values converted, broadcast
    again), the copy checked against this machine's memory (ValueError naming ``name``). A float
    narrowed to a smaller float has its finite values beyond ``dtype``'s range clamped into it
    (:func:`_clamp_overflowed`)."""
    own = _unbroadcast(arr)
    target = np.dtype(dtype)
    narrowing = own.dtype.kind == "f" and own.dtype.itemsize > target.itemsize
    if own.size > _UNCHECKED_COPY_SIZE:  # narrowing: and the clamp's bool array, one byte a value
        check_allocatable(own.shape, target.itemsize + narrowing, name)
    with np.errstate(over="ignore"):  # values beyond dtype's range become ±inf here, clamped below
        converted = own.astype(target, order="C")
    if narrowing:
        _clamp_overflowed(converted, own)
    return converted if own is arr else np.broadcast_to(converted, arr.shape)


def _clamp_overflowed(narrowed: np.ndarray, source: np.ndarray) -> None:
    """Sets, in place, each value of ``narrowed`` (``source`` cast to a smaller float dtype) that
    the cast made ±inf from a finite value of ``source`` to ``narrowed``'s largest finite value of
    that sign: ``-1e300`` becomes float32's ``-3.4028235e38``; ``±inf`` and NaN given stay.

    One pass when every value is finite after the cast (their sum is finite); the values are looked
    at one by one only otherwise."""
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(narrowed.sum()):
            return
    overflowed = np.isinf(narrowed)
    overflowed &= np.isfinite(source)
    big = np.finfo(narrowed.dtype).max
    np.clip(narrowed, -big, big, out=narrowed, where=overflowed)


def _ids_view(x, name: str, ndim: int, shape: tuple | None, shape_of: str,
              what: str = "token ids") -> tuple[np.ndarray, tuple]:
    """``(x as an array view of ndim dims, the shape as passed)`` after the dtype, rank, shape and
    emptiness checks of :func:`as_ids`, with no copy of the values (a 1-D input gains its batch dim)."""
    arr = to_numpy(x, name)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name}: expected integer {what}, got dtype {arr.dtype}")
    given = arr.shape
    if arr.ndim == ndim - 1:
        arr = arr[None]
    if arr.ndim != ndim:
        dims = "(batch, seq_len)" if ndim == 2 else f"of {ndim} dims"
        raise ValueError(f"{name}: expected a {ndim}-D array {dims}, got shape {given}")
    if shape is not None and arr.shape != tuple(shape):
        source = f" ({shape_of})" if shape_of else ""
        raise ValueError(f"{name}: expected shape {tuple(shape)}{source}, got {given}")
    if arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty array, got shape {arr.shape}")
    return arr, given


def ids_shape(x, name: str, *, ndim: int = 2, what: str = "token ids", shape: tuple | None = None,
              shape_of: str = "") -> tuple:
    """The shape :func:`as_ids` would return for ``x`` (``(N, L)``: a 1-D input counts as a batch
    of one), after its dtype, rank and emptiness checks and before any copy: a caller checks a
    length against its context, or its activations against memory, on this before :func:`as_ids`
    copies the ids to int64 (a broadcast view of 10**9 int32 ids: 8 GB).

    Args:
        shape, shape_of: as :func:`as_ids`'s (the shape expected, checked here too).

    Raises:
        TypeError / ValueError: as :func:`as_ids` for the dtype, the rank, the shape and an empty
            array.
    """
    return _ids_view(x, name, ndim, shape, shape_of, what)[0].shape


def as_ids(x, name: str, *, ndim: int = 2, shape: tuple | None = None, shape_of: str = "",
           what: str = "token ids") -> np.ndarray:
    """Token ids as a C-contiguous int64 array of ``ndim`` dims (an array of one dim fewer gains a
    batch dim). Float arrays of whole numbers are accepted; the range check against a table is the
    C++ op's (it names ``name`` too).

    The dtype and the shape are checked first, then the int64 copy (if one is needed) against this
    machine's memory, then the values: a broadcast view (``np.broadcast_to``, stride 0) of a shape
    no machine can hold is a ValueError, never a numpy MemoryError, and only the values a broadcast
    view holds are read. A caller with checks on the shape alone makes them first, on
    :func:`ids_shape`.

    Args:
        shape: the shape expected (with its batch dim), checked before any copy; None: any.
        shape_of: where that shape comes from, for the message (``"input_ids'"``).
        what: what the integers are, for the messages (``"positions"``).

    Raises:
        TypeError: not integers (bool, non-integral floats, complex, object, str), None.
        ValueError: the wrong rank or shape (the message gives the shape as passed: ``(3,)``, not
            the ``(1, 3)`` it became), an empty array, ids outside int64, an int64 copy larger
            than this machine's memory.
    """
    arr, given = _ids_view(x, name, ndim, shape, shape_of, what)
    kind = arr.dtype.kind
    if arr.size > _UNCHECKED_COPY_SIZE and not (arr.flags.c_contiguous and arr.dtype == np.int64):
        check_allocatable(arr.shape, 8, name)
    own = _unbroadcast(arr)  # the values arr holds: reductions and comparisons over them only
    if kind == "f":
        # min and max make no temporary arrays, and propagate NaN; widened, as 2**63 is no float16
        wide = np.result_type(own.dtype, np.float64)
        low, high = own.min().astype(wide), own.max().astype(wide)
        if not (np.isfinite(low) and np.isfinite(high)):
            raise TypeError(f"{name}: expected integer {what}, got dtype {arr.dtype} with non-finite values")
        if max(-low, high) >= 2.0**63:
            if np.any(np.mod(own, 1) != 0):  # a fraction elsewhere: not ids at all, the first error
                raise TypeError(f"{name}: expected integer {what}, got dtype {arr.dtype} with non-integral values")
            raise ValueError(f"{name}: expected {what} within int64, got {own[np.abs(own) >= 2.0**63].flat[0]}")
        ids = own.astype(np.int64)  # truncates: equal to own exactly where own is a whole number
        if not np.all(ids == own):
            raise TypeError(f"{name}: expected integer {what}, got dtype {arr.dtype} with non-integral values")
        arr = ids if own is arr else np.broadcast_to(ids, arr.shape)
    elif kind == "u" and arr.dtype.itemsize == 8 and own.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name}: expected {what} within int64, got {int(own.max())}")
    return _contiguous(arr, np.int64, name)


def broadcast_mask(mask: np.ndarray, shape: tuple, name: str) -> np.ndarray:
    """``mask`` broadcast to ``shape`` as a zero-copy view, or a ValueError naming the shapes."""
    try:
        return np.broadcast_to(mask, shape)
    except ValueError:
        raise ValueError(f"{name}: shape {mask.shape} does not broadcast to the expected {shape}") from None


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` share an element: their memory bounds first (O(1)), then where those
    overlap numpy's exact test, bounded in work (arrays interleaved in one buffer without touching
    are apart; a case too hard to settle within the bound counts as an overlap)."""
    if not np.may_share_memory(a, b):
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=1 << 16))
    except getattr(np, "exceptions", np).TooHardError:  # numpy.exceptions from 1.25, numpy before
        return True


def grad_buffer(buf, name: str, shape: tuple, dtype, apart_from: tuple = ()):
    """``buf`` if it can take an in-place accumulation of a gradient of ``shape`` and ``dtype``;
    None stays None.

    ``apart_from``: ``(array or None, name)`` pairs, the arrays the op reads (its inputs) or writes
    (another buffer) while it adds into ``buf``. ``buf`` must not share memory with any of them: the
    C++ kernels read an input tile by tile, in parallel, while other tasks add into ``buf``, so an
    overlap (``linear_backward(x, W, g, grad_weight=W)``) can read half-updated values and give
    silently wrong gradients. The test: a shared element (:func:`_overlap`; arrays interleaved in
    one buffer without touching are apart).

    Raises:
        TypeError: not a numpy array, or another dtype. ValueError: another shape, not
            C-contiguous and writeable, or sharing memory with an array of ``apart_from``.
    """
    if buf is None:
        return None
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array to accumulate into, got {type(buf).__name__}")
    if buf.dtype != np.dtype(dtype):
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)} (the op's compute dtype: float64 if any float "
                        f"data argument is float64), got {buf.dtype}")
    if buf.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {buf.shape}")
    if not buf.flags.c_contiguous or not buf.flags.writeable:
        raise ValueError(f"{name}: expected a C-contiguous, writeable array (it is updated in place)")
    for other, other_name in apart_from:
        if isinstance(other, np.ndarray) and _overlap(buf, other):
            raise ValueError(f"{name}: must not share memory with {other_name} (the op reads or updates "
                             f"{other_name} in parallel tasks while it adds into {name}: the gradients could be "
                             "wrong); pass a separate array")
    return buf


# ------------------------------------------------------------------------------------------------
# Scalars
# ------------------------------------------------------------------------------------------------
#: This package's name: frames of its modules are ours, the first other one is the caller's.
_PACKAGE = __name__.partition(".")[0]


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes ``warnings.warn``, called by the function calling this one, name
    the first line outside this package: the user's call, however many of the package's frames
    (wrappers, a model's forward calling its helpers) lie between. Frames are told apart by their
    module's name (not its file: a copied or zipped install keeps it). As Python 3.12's
    ``skip_file_prefixes``, which 3.10 and 3.11 lack."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == _PACKAGE:
        frame, level = frame.f_back, level + 1
    return level


def is_int(value) -> bool:
    """Whether ``value`` is an int (Python or numpy), bools excluded."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def described(value, limit: int = 60) -> str:
    """``value`` for an error message: its type and repr (``float 0.5``, ``str 'x'``), an array by
    its shape and dtype (``ndarray (768,) float32``: its repr could be megabytes), any other repr
    cut at ``limit`` characters. A numpy scalar is its type and value (``float64 4.0``), a 0-d
    array or tensor its type, shape, dtype and value (``ndarray () float64 4.0``): one value,
    short to show."""
    kind = type(value).__name__
    shape = None if isinstance(value, type) else getattr(value, "shape", None)  # np.float64 (a class) has none
    if isinstance(shape, tuple) and hasattr(value, "dtype"):  # an array: numpy's, torch's, ...; or a numpy scalar
        if isinstance(value, np.generic):  # its type names its dtype; a string quoted, as a str's repr
            return f"{kind} {_cut(repr(value.item()) if value.dtype.kind in 'SU' else str(value), limit)}"
        head = f"{kind} {tuple(shape)} {value.dtype}"
        if tuple(shape) != ():
            return head
        quoted = isinstance(value, np.ndarray) and value.dtype.kind in "SU"  # '8', not 8
        return f"{head} {_cut(repr(value.item()) if quoted else str(value), limit)}"
    return f"{kind} {_cut(repr(value), limit)}"


def _cut(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters and how many it has."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def type_path(value) -> str:
    """``value``'s type for an error message that expects one of this library's classes: with its
    module where that is another library's (``torch.nn.modules.transformer.TransformerEncoderLayer``,
    so that a message never reads "expected a TransformerEncoderLayer, got TransformerEncoderLayer"),
    the bare name for builtins and this library's own."""
    kind = type(value)
    module = kind.__module__ or ""
    if module == "builtins" or module.split(".")[0] == "transformer_core":
        return kind.__qualname__
    return f"{module}.{kind.__qualname__}"


def torch_module_hint(value, ours: str) -> str:
    """A hint for an error message when ``value`` is torch's own counterpart of this library's
    class ``ours`` (a ``torch.nn.TransformerEncoderLayer`` where ``"TransformerEncoderLayer"`` is
    expected): how to load its weights into ours. Empty for anything else (another torch class's
    weights would not load)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.nn.Module) or type(value).__name__ != ours:
        return ""
    return (f" (a torch module: build transformer_core.nn.{ours} with the same arguments and call its "
            f"load_state_dict(module.state_dict()))")


def check_int(value, name: str, minimum: int | None = 1, maximum: int | None = MAX_SIZE) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (``None``: unbounded on that side; the default
    upper bound is the core's 64-bit size limit).

    Raises:
        TypeError: not an int (bools and floats included, even whole ones). ValueError: out of range.
    """
    if not is_int(value):
        raise TypeError(f"{name}: expected an int, got {described(value)}")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        if maximum is None:
            what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        elif minimum is None:
            what = f"an int <= {maximum}"
        else:
            what = f"an int in [{minimum}, {'2**63 - 1' if maximum == MAX_SIZE else maximum}]"
        raise ValueError(f"{name}: expected {what}, got {value}")
    return value


def check_positive_int(value, name: str) -> int:
    """``value`` as an int in ``[1, 2**63)`` (see :func:`check_int`)."""
    return check_int(value, name, 1)


def check_optional_int(value, name: str, minimum: int | None = 1, maximum: int | None = MAX_SIZE) -> int | None:
    """None, or :func:`check_int`."""
    return None if value is None else check_int(value, name, minimum, maximum)


def check_float(value, name: str, *, minimum: float | None = None, maximum: float | None = None,
                min_open: bool = False, max_open: bool = False, finite: bool = True) -> float:
    """``value`` (a real number: int or float, not bool) as a float within the bounds
    (``min_open``/``max_open``: the bound itself excluded). NaN is always refused; infinities
    unless ``finite=False``.

    Raises:
        TypeError: not a real number. ValueError: NaN, infinite, out of range; an int (or other
            real) too large for a float (``10**400``: float() would raise OverflowError).
    """
    if type(value) is not float and (isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real)):
        raise TypeError(f"{name}: expected a number, got {described(value)}")
    try:
        value = float(value)
    except OverflowError:  # not printed: a huge int's decimal form can be too long to write (or build)
        size = f" of {abs(int(value)).bit_length()} bits" if isinstance(value, numbers.Integral) else ""
        raise ValueError(f"{name}: expected a {'finite ' if finite else ''}float, got {type(value).__name__}"
                         f"{size} (too large for a float)") from None
    low_bad = minimum is not None and (value <= minimum if min_open else value < minimum)
    high_bad = maximum is not None and (value >= maximum if max_open else value > maximum)
    if math.isnan(value) or (finite and math.isinf(value)) or low_bad or high_bad:
        parts = []
        if finite:
            parts.append("finite")
        if minimum is not None and maximum is not None:
            rng = f"in {'(' if min_open else '['}{minimum}, {maximum}{')' if max_open else ']'}"
        elif minimum is not None:
            rng = f"{'>' if min_open else '>='} {minimum}"
        elif maximum is not None:
            rng = f"{'<' if max_open else '<='} {maximum}"
        else:
            rng = ""
        raise ValueError(f"{name}: expected a {' '.join(parts)} number {rng}".replace("  ", " ").rstrip()
                         + f", got {value}")
    return value


def check_eps(value, name: str) -> float:
    """A norm's epsilon as a finite float >= 0; TypeError for a non-number, ValueError otherwise."""
    return check_float(value, name, minimum=0.0)


def check_bool(value, name: str) -> bool:
    """``value`` as a bool: ``True``/``False`` (or numpy's). Anything else, 0 and 1 included, is a
    TypeError: a flag given a string or a number is a mistake, not a truth value."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {described(value)}")
    return bool(value)


def check_choice(value, name: str, choices: tuple) -> str:
    """``value`` as one of the str ``choices`` of a Python-side option (not one of the core's
    enumerations: see :func:`choice_of_core`)."""
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a str, one of {', '.join(map(repr, choices))}; got {_describe(value)}")
    if value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def choice_of_core(value, name: str, parser):
    """``parser(value)`` for one of the core's tables of names (``_core.parse_activation``,
    ``parse_attention_path``, ``parse_rotary_layout``, ``parse_reduction``): TypeError for a
    non-str, the table's ValueError renamed to ``name`` otherwise. Returns the parsed value."""
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a str, got {_describe(value)} {value!r}")
    try:
        return parser(value)
    except ValueError as e:
        message = str(e)
        head, sep, rest = message.partition(": ")
        raise ValueError(f"{name}: {rest if sep and ' ' not in head else message}") from None


def hf_config_fields(fields: dict) -> dict:
    """A config's fields as Hugging Face's ``config.json`` takes them: numpy scalars as Python
    numbers (json cannot write them), and the activation fields (``hidden_act``,
    ``activation_function``) in transformers' names: ``"gelu_tanh"``, ours, is its
    ``"gelu_pytorch_tanh"`` (the same function; its ACT2FN has no ``gelu_tanh``)."""
    out = {}
    for key, value in fields.items():
        if isinstance(value, np.generic):
            value = value.item()
        if key in ("hidden_act", "activation_function") and value == "gelu_tanh":
            value = "gelu_pytorch_tanh"
        out[key] = value
    return out


def activation(value, name: str):
    """The C++ ``Activation`` that ``value`` names in the library's one table of activations
    (``_core.activation_names()``); TypeError for a non-str, ValueError naming ``name`` and listing
    the accepted names otherwise."""
    return choice_of_core(value, name, _runtime.core.parse_activation)


def attention_path(value, name: str = "path") -> str:
    """``value`` checked against the core's table of attention paths (``"auto"``, ``"flash"``,
    ``"reference"``); returned as given (the bindings take the name)."""
    choice_of_core(value, name, _runtime.core.parse_attention_path)
    return value


def rotary_layout(value, name: str = "layout") -> str:
    """``value`` checked against the core's table of rotary layouts (``"half"``, ``"interleaved"``)."""
    choice_of_core(value, name, _runtime.core.parse_rotary_layout)
    return value


def reduction(value, name: str = "reduction") -> str:
    """``value`` checked against the core's table of loss reductions (``"mean"``, ``"sum"``, ``"none"``)."""
    choice_of_core(value, name, _runtime.core.parse_reduction)
    return value


def resolve_dtype(dtype) -> type:
    """``np.float32`` or ``np.float64`` from a dtype-like; TypeError otherwise (a big-endian
    ``'>f8'`` is float64: the layer stores native float64). None is ``np.float32``, torch's default
    dtype, as torch's ``dtype=None`` (not numpy's ``np.dtype(None)``, float64); a function whose
    None means something else, as ``LlamaForCausalLM.from_pretrained``'s, handles it before
    calling this."""
    if dtype is None:
        return np.float32
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):  # a torch tensor: ValueError "Could not convert"
        hint = " (a numpy dtype or its name: np.float32, 'float64')" if type_path(dtype).startswith("torch.") else ""
        got = described(dtype) if hasattr(dtype, "shape") else repr(dtype)  # an array: not its values
        raise TypeError(f"dtype: expected float32 or float64, got {got}{hint}") from None
    if dt.kind != "f" or dt.itemsize not in (4, 8):
        raise TypeError(f"dtype: expected float32 or float64, got {dt}")
    return np.float64 if dt.itemsize == 8 else np.float32


# ------------------------------------------------------------------------------------------------
# Sizes of Python-side allocations
# ------------------------------------------------------------------------------------------------
def physical_memory_bytes() -> int:
    """This machine's physical memory, the bound of every allocation check (the C++ core's
    ``ops::physical_memory_bytes``: one definition for Python's checks and C++'s)."""
    return int(_runtime.core.physical_memory_bytes())


def check_allocatable(shape, itemsize: int, name: str) -> None:
    """Raises ValueError naming ``name`` when an array of ``shape`` with ``itemsize``-byte values
    could not fit in this machine's memory: a size no allocation can satisfy is a ValueError, not a
    MemoryError or the OOM killer. Python's ints do not overflow: the product is exact."""
    count = math.prod(int(d) for d in shape)
    limit = physical_memory_bytes()
    if count * itemsize > limit:
        raise ValueError(f"{name}: an array of shape {tuple(int(d) for d in shape)} needs {count * itemsize} bytes, "
                         f"more than this machine's memory ({limit} bytes)")


def check_tables_allocatable(tables, dtype, together: str = "the tables together") -> None:
    """Checks a module's weight tables against this machine's memory before the C++ layer allocates
    them, naming the user's arguments (the C++ check names its own layer's: ``Embedding:
    (num_embeddings, embedding_dim)``).

    Args:
        tables: ``(names, what, rows, cols)`` per table, e.g. ``("vocab_size, hidden_size", "the word
            embedding table", V, H)``: ``names`` the arguments that size it, ``what`` the table.
        dtype: the tables' float dtype.
        together: what the sum is called in its error (``"the tables together"``).

    Raises:
        ValueError: one table needs more bytes than this machine's memory (naming its arguments and
            the table), or all of them together do (naming every argument). Python's ints do not
            overflow: the products are exact, however large the sizes.
    """
    dt = np.dtype(dtype)
    limit = physical_memory_bytes()
    total = 0
    for names, what, rows, cols in tables:
        need = int(rows) * int(cols) * dt.itemsize
        if need > limit:
            raise ValueError(f"{names}: {what} ({int(rows)} × {int(cols)} {dt.name}) needs {need} bytes, more "
                             f"than this machine's memory ({limit} bytes)")
        total += need
    if total > limit:
        names = ", ".join(dict.fromkeys(n.strip() for t in tables for n in t[0].split(",")))
        sizes = " + ".join(f"{int(r)} × {int(c)}" for _, _, r, c in tables)
        raise ValueError(f"{names}: {together} ({sizes} {dt.name}) need {total} bytes, more than this "
                         f"machine's memory ({limit} bytes)")


# ------------------------------------------------------------------------------------------------
# Mappings and configs
# ------------------------------------------------------------------------------------------------
def check_mapping(value, name: str) -> dict:
    """``value`` if it is a mapping (``dict``-like); TypeError naming ``name`` otherwise."""
    from collections.abc import Mapping

    if not isinstance(value, Mapping):
        raise TypeError(f"{name}: expected a mapping (a dict, e.g. config.json's object), got {type(value).__name__}")
    return value


def check_config_fields(config, *, ints=(), optional_ints=(), nonnegative_ints=(), eps=(), bools=(),
                        optional_bools=(), floats_positive=()) -> None:
    """Checks the named fields of a config object, naming the field in every error:

    * ``ints``: ints >= 1;  ``nonnegative_ints``: ints >= 0;  ``optional_ints``: None or >= 0
      (0 / None = the default);
    * ``eps``: finite numbers >= 0;  ``floats_positive``: finite numbers > 0;
    * ``bools`` (``optional_bools``: or None): True/False.

    Upper bounds of sizes are the C++ constructors' (checked 64-bit products against memory).
    """
    for field in ints:
        check_int(getattr(config, field), field, 1)
    for field in nonnegative_ints:
        check_int(getattr(config, field), field, 0)
    for field in optional_ints:
        check_optional_int(getattr(config, field), field, 0)
    for field in eps:
        check_eps(getattr(config, field), field)
    for field in floats_positive:
        check_float(getattr(config, field), field, minimum=0.0, min_open=True)
    for field in bools:
        check_bool(getattr(config, field), field)
    for field in optional_bools:
        if getattr(config, field) is not None:
            check_bool(getattr(config, field), field)


def check_token_ids(value, name: str):
    """A config's special token id: None, an int >= 0, or a list/tuple of such ints (``eos_token_id``
    may list several). TypeError / ValueError naming ``name`` otherwise; returns the value."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_int(v, f"{name}[{i}]", 0)
        return value
    return check_int(value, name, 0)


def config_token_ids(value, name: str):
    """A config's special token id (``bos_token_id``, ``eos_token_id``, ``pad_token_id``) with a
    negative id read as "none", as Hugging Face reads it: ``transformers`` 4.27/4.28's Llama
    conversion wrote ``"pad_token_id": -1`` (many public ``config.json`` files keep it), and an
    ``eos_token_id`` list may hold a -1 beside the real id.

    Returns:
        None for None or a negative int; an int >= 0 as an int; for a list/tuple, a list of its
        ids >= 0 (None when every id was negative; an empty list stays empty). Ids past the
        vocabulary are kept: ``generate`` and chat leave them out.

    Raises:
        TypeError: not None, an int, or a list/tuple of ints (bools and floats too), naming ``name``
        (``name[i]`` for a list's element).
    """
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        ids = [check_int(v, f"{name}[{i}]", None) for i, v in enumerate(value)]
        kept = [t for t in ids if t >= 0]
        return kept if kept or not ids else None
    value = check_int(value, name, None)
    return value if value >= 0 else None


def check_config_ints(config, required: tuple, optional: tuple = ()) -> None:
    """Each named field of ``config`` is an int >= 1 (``optional`` ones may be None or >= 0)."""
    check_config_fields(config, ints=required, optional_ints=optional)
