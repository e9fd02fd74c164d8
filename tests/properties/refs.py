"""Helpers of the property targets: drawing arrays, reading arguments as the reference does, and
small numpy / torch references. The reference reads a float argument as the library documents it
(real numeric data, float64 computation); anything else (None, bool, complex, strings, objects) is a
``NoReference``: the library must refuse it."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from .harness import NoReference

torch.set_num_threads(1)

DTYPES = st.sampled_from([np.float32, np.float64])


def array(draw, shape, dtype=np.float32, low=-3.0, high=3.0):
    """A float array of ``shape`` (hypothesis.extra.numpy), values in [low, high]."""
    width = 32 if np.dtype(dtype) == np.float32 else 64
    return draw(hnp.arrays(dtype, shape, elements=st.floats(low, high, allow_nan=False, width=width)))


def rng_array(draw, shape, dtype=np.float32, scale=1.0):
    """A float array of ``shape`` from a drawn seed (cheap for bigger arrays)."""
    seed = draw(st.integers(0, 2**32 - 1))
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def dims(draw, n, low=1, high=5):
    return tuple(draw(st.integers(low, high)) for _ in range(n))


def to_np(v):
    if hasattr(v, "detach"):
        t = v.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.numpy()
    return v


def read(v, name="x", allow_empty=False) -> np.ndarray:
    """A float argument as the reference reads it: float64 values of real numeric data."""
    if v is None or isinstance(v, (str, bytes, dict)):
        raise NoReference(f"{name} is {type(v).__name__}")
    v = to_np(v)
    try:
        a = np.asarray(v)
    except (ValueError, TypeError) as e:
        raise NoReference(f"{name}: {e}") from None
    if a.dtype.kind not in "iuf":
        raise NoReference(f"{name}: dtype {a.dtype}")
    if a.size == 0 and not allow_empty:
        raise NoReference(f"{name} is empty")
    return a.astype(np.float64)


def read_ids(v, name="input_ids", high=None) -> np.ndarray:
    if v is None or isinstance(v, (str, bytes, dict)):
        raise NoReference(f"{name} is {type(v).__name__}")
    v = to_np(v)
    try:
        a = np.asarray(v)
    except (ValueError, TypeError) as e:
        raise NoReference(str(e)) from None
    if a.dtype.kind == "f":
        if not (a.size and np.all(np.isfinite(a)) and np.all(np.mod(a, 1) == 0)):
            raise NoReference(f"{name}: non-integral floats")
    elif a.dtype.kind not in "iu":
        raise NoReference(f"{name}: dtype {a.dtype}")
    if a.size == 0:
        raise NoReference(f"{name} is empty")
    if high is not None and (a.min() < 0 or a.max() >= high):
        raise NoReference(f"{name} out of range")
    return a.astype(np.int64)


def read_keep(v, name="mask") -> np.ndarray:
    """A bool / 0-1 keep mask as the reference reads it."""
    if v is None or isinstance(v, (str, bytes)):
        raise NoReference(f"{name} is {type(v).__name__}")
    try:
        a = np.asarray(to_np(v))
    except (ValueError, TypeError) as e:
        raise NoReference(str(e)) from None
    if a.dtype == np.bool_:
        return a
    if a.dtype.kind not in "iuf" or not np.all((a == 0) | (a == 1)):
        raise NoReference(f"{name}: not 0/1")
    return a == 1


def read_attn_mask(v, name="attn_mask") -> np.ndarray:
    """bool (True = may attend) or float (added) mask; ints refused."""
    if isinstance(v, (str, bytes)):
        raise NoReference(name)
    try:
        a = np.asarray(to_np(v))
    except (ValueError, TypeError) as e:
        raise NoReference(str(e)) from None
    if a.dtype == np.bool_:
        return a
    if a.dtype.kind != "f":
        raise NoReference(f"{name}: dtype {a.dtype}")
    return a.astype(np.float64)


def read_int(v, name, low=None, high=None) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise NoReference(f"{name}: {type(v).__name__}")
    v = int(v)
    low = -2**63 if low is None else low
    high = 2**63 - 1 if high is None else high
    if not low <= v <= high:
        raise NoReference(f"{name}: {v} out of range")
    return v


def read_float(v, name, low=None, high=None, open_low=False) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise NoReference(f"{name}: {type(v).__name__}")
    v = float(v)
    if not math.isfinite(v) or (low is not None and (v <= low if open_low else v < low)) or \
            (high is not None and v > high):
        raise NoReference(f"{name}: {v} out of range")
    return v


def read_bool(v, name) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise NoReference(f"{name}: {type(v).__name__}")
    return bool(v)


def read_choice(v, name, choices) -> str:
    if not isinstance(v, str) or v not in choices:
        raise NoReference(f"{name}: {v!r}")
    return v


def as_dtype(v) -> np.dtype:
    """``np.dtype(v)`` of a ``dtype`` argument, None being float32: torch's default dtype, as the
    library reads ``dtype=None`` (numpy's ``np.dtype(None)`` is float64)."""
    return np.dtype(np.float32) if v is None else np.dtype(v)


def lib_dtype(v):
    """The dtype the library computes in for an input: float64 for float64 data (any byte order,
    Python floats included) and wider floats (longdouble), else float32."""
    v = to_np(v)
    try:
        a = np.asarray(v)
    except (ValueError, TypeError):
        return np.float32
    return np.float64 if a.dtype.kind == "f" and a.dtype.itemsize >= 8 else np.float32


def common_dtype(*values):
    """The dtype an op with several float data arguments computes in: float64 if any of them is
    (:func:`lib_dtype`; None, an argument not given, skipped), else float32."""
    return np.float64 if any(v is not None and lib_dtype(v) == np.float64 for v in values) else np.float32


def t(a) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64).reshape(np.shape(a)))


def _row_scale(x: torch.Tensor) -> torch.Tensor:
    """A power of two c per row (last axis) with max|x| / c in [1, 2): dividing by it is exact; 1 for a
    row of zeros or one holding inf / NaN (which then gives NaN, as in torch)."""
    with torch.no_grad():
        m = x.abs().amax(-1, keepdim=True)
        ok = torch.isfinite(m) & (m > 0)
        _, ex = torch.frexp(torch.where(ok, m, 1.0))
        return torch.where(ok, torch.ldexp(torch.ones_like(m), ex - 1), 1.0)


def layer_norm_t(x: torch.Tensor, w=None, b=None, eps=1e-5) -> torch.Tensor:
    """torch.nn.functional.layer_norm over the last axis (differentiable), safe from overflow: the
    library normalises float64 rows exactly whatever their magnitude (e.g. a 1e300 entry, where
    Σ(x - mean)² overflows and torch gives the bias), so the reference computes on x / c (c a power
    of two per row) with eps / c²: the same value, exactly, where torch's does not overflow."""
    c = _row_scale(x)
    xs = x / c
    d = xs - xs.mean(-1, keepdim=True)
    # eps / c²: as eps / c / c (c² may be 0 or inf) of tensors (a Python number / a subnormal c is
    # computed as number · (1 / c): 0 · inf = NaN for eps = 0); for eps > 0 never 0 (underflow at a
    # huge c): a constant row (d = 0, var = 0) gives 0 as torch's, not 0 / 0 (eps = 0: NaN, as torch)
    e = torch.full_like(c, eps) / c / c
    if eps > 0:
        e = e.clamp(min=float(np.finfo(np.float64).tiny))
    y = d / torch.sqrt((d * d).mean(-1, keepdim=True) + e)
    if w is not None:
        y = y * w
    return y if b is None else y + b


def layer_norm(x, w=None, b=None, eps=1e-5) -> np.ndarray:
    """``layer_norm_t`` on float64 numpy arrays (w, b: None or arrays of the last axis)."""
    with torch.no_grad():
        return layer_norm_t(t(x), None if w is None else t(w), None if b is None else t(b), eps).numpy()


def softmax_rows(x: np.ndarray, axis=-1) -> np.ndarray:
    """The library's softmax: torch's, except that a slice of only -inf gives zeros (not NaN)."""
    y = torch.softmax(t(x), dim=axis).numpy()
    all_neg_inf = np.all(x == -np.inf, axis=axis, keepdims=True)
    return np.where(all_neg_inf, 0.0, y)


def attention(q, k, v, bool_mask=None, float_mask=None, is_causal=False, offset=0, scale=None, weights=False,
              lse=False):
    """Attention in float64 numpy with the library's conventions: a row that sees no key gives zeros
    (and lse -inf). q: (..., L, E), k: (..., S, E), v: (..., S, Ev); masks broadcast to (..., L, S)."""
    L, E = q.shape[-2:]
    S = k.shape[-2]
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    s = np.einsum("...le,...se->...ls", q, k) * scale
    allowed = np.ones(s.shape, bool)
    if bool_mask is not None:
        allowed &= np.broadcast_to(bool_mask, s.shape)
    if is_causal:
        allowed &= (np.arange(S)[None, :] <= np.arange(L)[:, None] + offset)
    if float_mask is not None:
        s = s + np.broadcast_to(float_mask, s.shape)
    s = np.where(allowed, s, -np.inf)
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(s, axis=-1, keepdims=True)
        dead = ~np.isfinite(m) & ~np.isnan(m) & (m == -np.inf)
        m = np.where(dead, 0.0, m)
        e = np.exp(s - m)
        den = e.sum(-1, keepdims=True)
        p = np.where(dead, 0.0, e / np.where(dead, 1.0, den))
        # a row with nothing to attend is zeros, also where a blocked key's value is inf/NaN (0 · NaN)
        out = np.where(dead, 0.0, np.einsum("...ls,...sd->...ld", p, v))
        lse_v = np.where(dead[..., 0], -np.inf, (m + np.log(den))[..., 0])
    res = (out,)
    if weights:
        res += (p,)
    if lse:
        res += (lse_v,)
    return res[0] if len(res) == 1 else res
