"""Argument checking and array conversion at the Python boundary.

Every public function converts its array-likes here, once: the dtype is chosen explicitly (float64
stays float64, everything else numeric becomes float32), the result is C-contiguous (non-contiguous
and Fortran-order inputs are copied), and bad input raises a ``TypeError`` or ``ValueError`` that
names the argument and says what was expected and what was given.
"""

from __future__ import annotations

import numpy as np

FLOAT_DTYPES = (np.float32, np.float64)


def compute_dtype(x, name: str) -> type:
    """The float dtype an op computes in for input ``x``: float64 for float64, else float32."""
    arr = x if isinstance(x, np.ndarray) else np.asarray(x)
    kind = arr.dtype.kind
    if kind not in "biuf":
        raise TypeError(f"{name}: expected a real numeric array, got dtype {arr.dtype}")
    return np.float64 if arr.dtype == np.float64 else np.float32


def as_float(x, name: str, dtype=None, *, min_ndim: int = 0, ndim: int | None = None,
             allow_empty: bool = False) -> np.ndarray:
    """``x`` as a C-contiguous float array of ``dtype`` (default: :func:`compute_dtype`)."""
    if x is None:
        raise TypeError(f"{name}: expected an array, got None")
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name}: expected a real numeric array, got dtype {arr.dtype}")
    if dtype is None:
        dtype = compute_dtype(arr, name)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got {arr.ndim}-D with shape {arr.shape}")
    if arr.ndim < min_ndim:
        raise ValueError(f"{name}: expected at least {min_ndim} dims, got {arr.ndim}-D with shape {arr.shape}")
    if not allow_empty and arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty array, got shape {arr.shape}")
    return np.ascontiguousarray(arr, dtype=dtype)


def as_weight(value, name: str, dtype) -> np.ndarray:
    """A checkpoint value (numpy array, torch tensor of any float dtype, bfloat16 included, or a nested
    list) as a C-contiguous array of ``dtype``.

    Raises:
        TypeError: the value is not a floating-point array (integer, bool, complex, object or string
            data is refused: a weight of another kind means a wrong checkpoint).
    """
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, without importing torch
        value = value.detach().cpu()
        if not value.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got {value.dtype}")
        value = (value.double() if np.dtype(dtype) == np.float64 else value.float()).numpy()
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as e:
        raise TypeError(f"{name}: expected a floating-point array, got {type(value).__name__} ({e})") from None
    if arr.dtype.kind != "f":
        raise TypeError(f"{name}: expected a floating-point array, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=dtype)


def as_vector(value, name: str, n: int, dtype) -> np.ndarray | None:
    """An optional per-feature parameter (a norm's weight or bias) as a C-contiguous ``(n,)`` array
    of ``dtype``; None stays None. ValueError naming ``name`` for another shape."""
    if value is None:
        return None
    arr = as_float(value, name, dtype, ndim=1)
    if arr.shape != (n,):
        raise ValueError(f"{name}: expected shape ({n},) to match x's last dim, got {arr.shape}")
    return arr


def as_bool(x, name: str) -> np.ndarray:
    """A 0/1 or boolean mask (1/True = keep) as a numpy bool array."""
    arr = np.asarray(x)
    if arr.dtype == np.bool_:
        return arr
    if arr.dtype.kind in "iuf":
        return arr != 0
    raise TypeError(f"{name}: expected a bool or 0/1 integer mask, got dtype {arr.dtype}")


def as_ids(x, name: str, *, ndim: int = 2) -> np.ndarray:
    """Token ids as a C-contiguous int64 array of ``ndim`` dims (a 1-D input gains a batch dim)."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and arr.size and np.all(np.mod(arr, 1) == 0):
            arr = arr.astype(np.int64)
        elif arr.size == 0:
            arr = arr.astype(np.int64)
        else:
            raise TypeError(f"{name}: expected integer token ids, got dtype {arr.dtype}")
    if arr.ndim == ndim - 1:
        arr = arr[None]
    if arr.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array (batch, seq_len), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty array, got shape {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def check_int(value, name: str, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``; TypeError for a non-int (bools included), ValueError below."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name}: expected {what}, got {value}")
    return int(value)


def check_positive_int(value, name: str) -> int:
    """``value`` as an int >= 1 (see :func:`check_int`)."""
    return check_int(value, name, 1)


def check_config_ints(config, required: tuple, optional: tuple = ()) -> None:
    """Each named field of ``config`` is an int (``optional`` ones may be None); TypeError naming the
    field otherwise. The values' ranges are checked where the model is built."""
    for name in required + optional:
        value = getattr(config, name)
        if value is None and name in optional:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")


def activation(value, name: str):
    """The C++ ``Activation`` that ``value`` names in the library's one table of activations
    (``_core.activation_names()``); TypeError for a non-str, ValueError naming ``name`` and listing
    the accepted names otherwise."""
    from ._runtime import core

    if not isinstance(value, str):
        raise TypeError(f"{name}: expected an activation name (str), got {type(value).__name__}")
    try:
        return core.parse_activation(value)
    except ValueError as e:
        raise ValueError(f"{name}: {str(e).removeprefix('activation: ')}") from None


def check_eps(value, name: str) -> float:
    """A norm's epsilon as a float >= 0 (finite); TypeError for a non-number, ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    value = float(value)
    if not (np.isfinite(value) and value >= 0):
        raise ValueError(f"{name}: expected a finite number >= 0, got {value}")
    return value


def broadcast_mask(mask: np.ndarray, shape: tuple, name: str) -> np.ndarray:
    """``mask`` broadcast to ``shape`` as a zero-copy view, or a ValueError naming the shapes."""
    try:
        return np.broadcast_to(mask, shape)
    except ValueError:
        raise ValueError(f"{name}: shape {mask.shape} does not broadcast to the expected {shape}") from None


def resolve_dtype(dtype) -> type:
    """``np.float32`` or ``np.float64`` from a dtype-like; TypeError otherwise."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype: expected float32 or float64, got {dtype!r}") from None
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"dtype: expected float32 or float64, got {dt}")
    return dt.type
