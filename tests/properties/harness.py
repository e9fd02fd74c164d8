"""The property harness: every public function and class is called as a hostile user would call it,
and each call must end in one of two ways (the README's contract):

* a ``TypeError`` / ``ValueError`` whose message names the argument that was changed, or
* a result equal to the reference (torch / numpy, computed here from the same input values).

A *target* (``targets.py``) draws a valid call (hypothesis), says what kind each argument is, and
computes the reference of a call. The harness then runs one of three kinds of case per example:

``valid``   the call as drawn: it must succeed and match the reference;
``layout``  one array argument in another layout that keeps its values (Fortran order, a
            non-contiguous view, the other byte order, a Python list, a torch tensor, float16 or
            integer copies, numpy scalar ints...): it must succeed and match the reference computed
            from the values as given (float64 stays float64, whatever the byte order);
``bad``     one argument replaced by a hostile value (None, strings, complex / bool / object /
            datetime arrays, ragged lists, wrong ranks and shapes, empty arrays, NaN / inf, zero,
            negative and huge sizes, floats for ints, ids out of the vocabulary, ...): it must raise a
            named TypeError / ValueError, or, if it returns, match the reference of that very input
            (a NaN in the input is allowed to give NaN where torch gives NaN).

Anything else is a failure, recorded with its class: ``rejected_valid``, ``unnamed_error``,
``wrong_exception`` (RuntimeError, AttributeError, OverflowError, MemoryError, IndexError, ...),
``wrong_value`` (a result unlike the reference, or of the wrong dtype), ``accepted_bad`` (a result
for an input the reference cannot take). A crash or a hang is caught by the process that runs the
target (``run.py``, ``tests/test_properties.py``).
"""

from __future__ import annotations

import math
import re
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

ERRORS = (TypeError, ValueError)


class NoReference(Exception):
    """The reference cannot compute this input (so the library must refuse it)."""


# ------------------------------------------------------------------------------------------------
# Argument kinds
# ------------------------------------------------------------------------------------------------
@dataclass
class Arg:
    """How an argument may be mutated.

    kind: ``array`` (float data), ``ids`` (integer token ids, ``high`` = the vocabulary), ``size``
    (an int >= ``low``), ``int`` (an int in [low, high]), ``float`` (a real in [low, high],
    ``open_low`` excluding low), ``bool``, ``choice`` (one of ``choices``), ``keep_mask`` (bool or
    0/1), ``attn_mask`` (bool or float, added), ``dtype``, ``mapping`` (a dict), ``str``, ``custom``.
    ``optional``: None is a valid value (the reference takes it). ``bad``: extra hostile values
    (label, value); ``good``: extra valid values (label, value).
    """

    kind: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    choices: tuple = ()
    optional: bool = False
    bad: list = field(default_factory=list)
    good: list = field(default_factory=list)
    layouts: bool = True  # array layouts keep values (False for buffers updated in place)
    floats_as_ids: bool = True  # ids: whole-number floats are accepted ids
    whole_floats: bool = False  # size / int: whole-number floats (2.0, np.float64(2.0)) are valid values
    aliases: tuple = ()   # other names an error may give for this argument (e.g. "weight" for a
                          # checkpoint entry, "d_model" for the layer size of a stack)
    none_is_layout: bool = True  # optional: None keeps the result (False when None means "another
                                 # argument's value", e.g. MHA's key=None = the query, valid only with value=None)


HUGE_SIZES = [2**40, 2**47, 2**62, 2**63 - 1]      # products far beyond any machine's memory
UNREPRESENTABLE = [2**63, 2**64, 2**100, -2**63 - 1]  # not an int64 at all


def _is_arraylike(v) -> bool:
    return isinstance(v, np.ndarray) or hasattr(v, "detach")


def layout_variants(value: np.ndarray) -> list[tuple[str, Any]]:
    """Valid re-layouts of an array that keep its values (the library must read them the same)."""
    out = []
    a = np.asarray(value)
    if a.ndim >= 2:
        out.append(("fortran", np.asfortranarray(a)))
    big = np.empty(a.shape[:-1] + (2 * a.shape[-1],) if a.ndim else (2,), a.dtype)
    if a.ndim:
        big[..., ::2] = a
        out.append(("noncontiguous", big[..., ::2]))
    out.append(("byteswapped", a.astype(a.dtype.newbyteorder())))
    out.append(("list", a.tolist()))
    try:
        import torch

        # (np.ascontiguousarray makes a 0-d array 1-d: keep the shape)
        out.append(("torch", torch.from_numpy(np.ascontiguousarray(a).reshape(a.shape))))
    except ImportError:  # pragma: no cover
        pass
    if a.dtype.kind == "f":
        out.append(("float16", a.astype(np.float16)))
        out.append(("int32", np.rint(np.clip(a, -1e6, 1e6)).astype(np.int32)))
    return out


def array_bad_values(a: np.ndarray) -> list[tuple[str, Any]]:
    """Hostile replacements of a float array argument."""
    a = np.asarray(a)
    shape = a.shape
    out = [
        ("None", None),
        ("str", "x"),
        ("dict", {"a": 1}),
        ("complex", a.astype(np.complex64)),
        ("bool", a > 0),
        ("object", np.array([object()] * max(a.size, 1), dtype=object)),
        ("strings", np.full(shape, "x")),
        ("datetime", np.zeros(shape, "datetime64[s]")),
        ("ragged", [[1.0, 2.0], [3.0]]),
        ("rank+1", a[None]),
        ("nan", _with(a, np.nan)),
        ("inf", _with(a, np.inf)),
        ("-inf", _with(a, -np.inf)),
        ("huge", _with(a, 1e300)),
    ]
    if a.ndim >= 1:
        out.append(("rank-1", a.reshape(-1)[:1].reshape(()) if a.ndim == 1 else a[0]))
        out.append(("empty", np.zeros(shape[:-1] + (0,), a.dtype)))
        out.append(("last+1", np.concatenate([a, a[..., :1]], axis=-1)))
    if a.ndim >= 2:
        out.append(("first+1", np.concatenate([a, a[:1]], axis=0)))
        out.append(("empty0", np.zeros((0,) + shape[1:], a.dtype)))
    return out


def _with(a: np.ndarray, v: float) -> np.ndarray:
    b = np.array(a, dtype=a.dtype if a.dtype.kind == "f" else np.float64, copy=True)
    if b.size:
        with np.errstate(over="ignore"):
            b.flat[b.size // 2] = v
    return b


def int_bad_values(low, high) -> list[tuple[str, Any]]:
    out = [("float", 1.5), ("whole_float", 2.0), ("str", "2"), ("None", None), ("True", True),
           ("complex", 1 + 0j), ("list", [1]), ("npfloat", np.float64(1.0))]
    if low is not None:
        out.append(("below", int(low) - 1))
        out.append(("far_below", int(low) - 2**40))
    if high is not None:
        out.append(("above", int(high) + 1))
    out += [(f"unrepresentable_{v}", v) for v in UNREPRESENTABLE]
    return out


def size_bad_values(low=1) -> list[tuple[str, Any]]:
    return [("zero", 0), ("negative", -1), ("int_min", -2**31)] * (low >= 1) + \
        [("negative", -1), ("far_negative", -2**62)] * (low < 1) + \
        [(f"huge_{v}", v) for v in HUGE_SIZES] + int_bad_values(None, None)


def float_bad_values(low, high, open_low) -> list[tuple[str, Any]]:
    out = [("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf), ("str", "0.5"), ("None", None),
           ("True", True), ("complex", 0.5j), ("list", [0.5]), ("array", np.array([0.5, 0.5]))]
    if low is not None:
        out.append(("at_low" if open_low else "below", low if open_low else low - 1.0))
        out.append(("far_below", low - 1e9))
    if high is not None:
        out.append(("above", high + 1.0))
    return out


BOOL_BAD = [("str", "yes"), ("empty_str", ""), ("one", 1), ("zero", 0), ("None", None), ("float", 1.0),
            ("list", [True]), ("array", np.array([True, False]))]


def choice_bad_values(choices) -> list[tuple[str, Any]]:
    first = choices[0]
    return [("unknown", "bogus"), ("empty", ""), ("None", None), ("int", 1), ("bytes", first.encode()),
            ("upper", first.upper() if first.upper() != first else first + "_"), ("list", [first])]


DTYPE_BAD = [("int32", np.int32), ("float16", np.float16), ("complex", np.complex64), ("str", "bogus"),
             ("bool", bool), ("object", object)]
# None: float32, torch's default dtype (refs.as_dtype)
DTYPE_GOOD = [("str64", "float64"), ("big_endian", np.dtype(">f8")), ("np32", np.dtype(np.float32)), ("None", None)]


def ids_bad_values(a: np.ndarray, high: int) -> list[tuple[str, Any]]:
    a = np.asarray(a)
    out = [("None", None), ("str", "x"), ("bool", a > 0), ("float", a.astype(np.float64) + 0.5),
           ("complex", a.astype(np.complex64)), ("strings", np.full(a.shape, "x")),
           ("ragged", [[1, 2], [3]]), ("negative", _set(a, -1)), ("vocab", _set(a, high)),
           ("huge", _set(a, 2**62)), ("uint64_huge", np.full(a.shape, 2**63 + 5, np.uint64)),
           ("nan", np.full(a.shape, np.nan)), ("empty", np.zeros(a.shape[:-1] + (0,), np.int64)),
           ("rank+1", a[None, None] if a.ndim else a[None])]
    return out


def _set(a, v):
    b = np.array(a, dtype=np.int64, copy=True)
    if b.size:
        b.flat[b.size // 2] = v
    return b


def ids_good_values(a: np.ndarray, floats=True) -> list[tuple[str, Any]]:
    a = np.asarray(a)
    out = [("int32", a.astype(np.int32)), ("list", a.tolist()),
           ("noncontiguous", np.repeat(a, 2, axis=-1)[..., ::2])]
    if floats:
        out.append(("whole_floats", a.astype(np.float64)))
    if a.ndim >= 2:
        out.append(("fortran", np.asfortranarray(a)))
    if a.size and a.max() < 255 and a.min() >= 0:
        out.append(("uint8", a.astype(np.uint8)))
    return out


def keep_mask_bad_values(m: np.ndarray) -> list[tuple[str, Any]]:
    m = np.asarray(m)
    # "float": 0/1 floats look like torch's additive key_padding_mask (0 = keep): the functional ops and
    # layers refuse them, the models' Hugging Face attention_mask takes them (the reference decides)
    return [("str", "x"), ("float", m.astype(np.float32)), ("two", m.astype(np.int64) * 2 + 1),
            ("half", m.astype(np.float64) * 0.5 + 0.25),
            ("nan", np.full(m.shape, np.nan)), ("strings", np.full(m.shape, "x")),
            ("complex", m.astype(np.complex64)), ("rank+1", m[None]), ("last+1", np.concatenate([m, m[..., :1]], -1)),
            ("ragged", [[1, 0], [1]])]


def keep_mask_good_values(m: np.ndarray) -> list[tuple[str, Any]]:
    m = np.asarray(m)
    return [("int", m.astype(np.int64)), ("list", m.tolist()), ("uint8", m.astype(np.uint8))]


def attn_mask_bad_values(m: np.ndarray) -> list[tuple[str, Any]]:
    m = np.asarray(m)
    return [("int", m.astype(np.int64)), ("str", "x"), ("strings", np.full(m.shape, "x")),
            ("complex", m.astype(np.complex64)), ("last+1", np.concatenate([m, m[..., :1]], -1)),
            ("rank+3", m[None, None, None]), ("ragged", [[True, False], [True]]), ("object", np.array([None, None]))]


def attn_mask_good_values(m: np.ndarray) -> list[tuple[str, Any]]:
    m = np.asarray(m)
    if m.dtype == np.bool_:
        return [("additive", np.where(m, 0.0, -np.inf).astype(np.float32)), ("list", m.tolist()),
                ("noncontiguous", np.repeat(m, 2, axis=-1)[..., ::2])]
    return [("float64", m.astype(np.float64)), ("byteswapped", m.astype(m.dtype.newbyteorder()))]


# ------------------------------------------------------------------------------------------------
# Cases
# ------------------------------------------------------------------------------------------------
@dataclass
class Target:
    """One public function or class: see the module doc."""

    name: str
    draw: Callable            # draw(data) -> kwargs dict (a valid call)
    call: Callable            # call(kwargs) -> result
    reference: Callable       # reference(kwargs) -> expected (raise NoReference if it cannot)
    args: dict                # name -> Arg
    compare: Callable | None = None  # compare(result, expected, kwargs) -> None or a mismatch message
                                     # (kwargs["_loose"]: assert_close's ``loose`` for this case)
    out_dtype: Callable | None = None  # out_dtype(kwargs) -> the dtype the result must have
    weight: float = 1.0       # examples relative to the others
    bad_only: tuple = ()      # args whose valid variants are not meaningful
    atol: float | None = None  # tolerances (default: by the result's dtype, see assert_close)
    rtol: float | None = None
    atol_scale: Callable | None = None  # atol_scale(kwargs) -> per-element unit of atol, broadcast to the
                                        # result (e.g. max(1, |grad_output|) for a result grad_output · f'(x):
                                        # f' to atol, whatever the size of the gradient multiplying it)


@dataclass
class Failure:
    kind: str
    target: str
    case: str
    message: str


def mentions(message: str, name: str) -> bool:
    """Whether ``message`` names the argument ``name`` (as a word; ``a.b`` and ``x[0]`` forms too)."""
    pattern = r"(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9_])"
    return re.search(pattern, message) is not None


#: Mutations that put non-finite values (or values beyond float32) into an input: the result must
#: then have non-finite values exactly where the reference has them, NaN and infinities alike (the
#: order of operations decides which one an inf - inf or 0 · inf becomes).
NONFINITE_LABELS = {"nan", "inf", "-inf", "huge"}


def assert_close(result, expected, *, dtype=None, atol=None, rtol=None, loose=False, atol_scale=None) -> str | None:
    """None if ``result`` matches ``expected`` (recursively for tuples / lists / dicts), else why not.
    ``dtype``: the dtype the result must have (float arrays); tolerances by that dtype. ``loose``:
    NaN and infinities count as one "non-finite" value. ``atol_scale``: an array (broadcast to an
    array result) multiplying ``atol`` element by element; for a sequence result, a tuple of them
    (one per element, None for none)."""
    if isinstance(expected, (tuple, list)):
        if not isinstance(result, (tuple, list)) or len(result) != len(expected):
            return f"expected a sequence of {len(expected)}, got {type(result).__name__}"
        for i, (r, e) in enumerate(zip(result, expected)):
            d = dtype[i] if isinstance(dtype, (tuple, list)) else dtype
            sc = atol_scale[i] if isinstance(atol_scale, tuple) else None
            why = assert_close(r, e, dtype=d, atol=atol, rtol=rtol, loose=loose, atol_scale=sc)
            if why:
                return f"[{i}]: {why}"
        return None
    if isinstance(expected, dict):
        if not isinstance(result, dict) or set(result) != set(expected):
            return f"expected keys {sorted(expected)}, got {type(result).__name__}"
        for k in expected:
            why = assert_close(result[k], expected[k], dtype=dtype, atol=atol, rtol=rtol, loose=loose)
            if why:
                return f"[{k!r}]: {why}"
        return None
    if expected is None:
        return None if result is None else f"expected None, got {type(result).__name__}"
    if isinstance(expected, (str, bytes)):
        return None if result == expected else f"expected {expected!r}, got {result!r}"
    r = np.asarray(result)
    e = np.asarray(expected)
    if dtype is not None and e.dtype.kind == "f" and r.dtype != np.dtype(dtype):
        return f"expected dtype {np.dtype(dtype)}, got {r.dtype}"
    if r.shape != e.shape:
        return f"expected shape {e.shape}, got {r.shape}"
    if e.dtype.kind in "biuU" or r.dtype.kind in "bU":
        return None if np.array_equal(r, e) else "values differ (exact)"
    f64 = r.dtype == np.float64
    at = atol if atol is not None else (1e-9 if f64 else 3e-5)
    rt = rtol if rtol is not None else (1e-9 if f64 else 3e-5)
    rr, ee = r.astype(np.float64), e.astype(np.float64)
    if loose:
        same = np.isfinite(rr) == np.isfinite(ee)
        if not same.all():
            return f"non-finite where the reference is finite (or not where it is not): {int((~same).sum())} entries"
        rr, ee = np.where(np.isfinite(rr), rr, 0.0), np.where(np.isfinite(ee), ee, 0.0)
    same_nan = np.isnan(rr) == np.isnan(ee)
    if not same_nan.all():
        return f"NaN where the reference has none (or not where it has): {int((~same_nan).sum())} entries"
    finite = np.isfinite(ee) & np.isfinite(rr)
    inf_ok = np.all((rr == ee) | finite | np.isnan(ee))
    if not inf_ok:
        return "infinities differ"
    diff = np.abs(rr[finite] - ee[finite])
    if atol_scale is not None:
        at = at * np.broadcast_to(np.asarray(atol_scale, np.float64), ee.shape)[finite]
    if diff.size and not np.all(diff <= at + rt * np.abs(ee[finite])):
        return f"max abs diff {diff.max():.3g} (atol {at if np.ndim(at) == 0 else 'scaled'}, rtol {rt})"
    return None


def _short(v, n=160) -> str:
    if isinstance(v, np.ndarray):
        s = f"ndarray(shape={v.shape}, dtype={v.dtype})"
    elif hasattr(v, "detach"):
        s = f"tensor(shape={tuple(v.shape)}, dtype={v.dtype})"
    else:
        s = repr(v)
    return s if len(s) <= n else s[:n] + "..."


def describe(kwargs: dict) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in kwargs.items() if not k.startswith("_"))


def variants_of(name: str, spec: Arg, value) -> tuple[list, list]:
    """(valid variants, bad values) of argument ``name`` whose drawn value is ``value``."""
    good, bad = list(spec.good), list(spec.bad)
    k = spec.kind
    if k == "array":
        if value is not None:
            if spec.layouts:
                good += layout_variants(value)
            bad += array_bad_values(value)
        else:
            bad += [("str", "x"), ("complex", np.ones(3, np.complex64))]
    elif k == "ids":
        if value is not None:
            good += ids_good_values(value, spec.floats_as_ids)
            bad += ids_bad_values(value, int(spec.high))
            if not spec.floats_as_ids:
                bad.append(("whole_floats", np.asarray(value).astype(np.float64)))
    elif k == "size":
        good += [("np_int64", np.int64(value)), ("np_int32", np.int32(value))] if isinstance(value, int) else []
        bad += size_bad_values(spec.low if spec.low is not None else 1)
    elif k == "int":
        if isinstance(value, int):  # the numpy scalar int that holds it (a seed may be >= 2**63)
            good += [("np_int64", np.int64(value))] if -2**63 <= value < 2**63 else \
                [("np_uint64", np.uint64(value))] if 0 <= value < 2**64 else []
        bad += int_bad_values(spec.low, spec.high)
    elif k == "float":
        if isinstance(value, (int, float)) and value is not None:
            good += [("np_float32", np.float32(value)), ("np_float64", np.float64(value))]
        bad += float_bad_values(spec.low, spec.high, spec.open_low)
    elif k == "bool":
        if isinstance(value, bool):
            good += [("np_bool", np.bool_(value))]
        bad += BOOL_BAD
    elif k == "choice":
        bad += choice_bad_values(spec.choices)
    elif k == "keep_mask":
        if value is not None:
            good += keep_mask_good_values(value)
            bad += keep_mask_bad_values(value)
    elif k == "attn_mask":
        if value is not None:
            good += attn_mask_good_values(value)
            bad += attn_mask_bad_values(value)
    elif k == "dtype":
        good += DTYPE_GOOD
        bad += DTYPE_BAD
    elif k == "mapping":
        bad += [("None", None), ("list", [1, 2]), ("str", "config"), ("int", 3)]
    elif k == "str":
        bad += [("None", None), ("int", 3), ("bytes", b"x"), ("list", ["a"])]
    if spec.whole_floats and k in ("size", "int"):  # 2.0 and np.float64(2.0) are the int 2 here
        bad = [(label, v) for label, v in bad if label not in ("whole_float", "npfloat")]
        if isinstance(value, int):
            good += [("whole_float", float(value)), ("np_float64", np.float64(value))]
    if spec.optional and value is not None and spec.none_is_layout:
        good.append(("None", None))
    return good, bad


def run_case(target: Target, kwargs: dict, mode: str, arg: str | None, label: str, value) -> Failure | None:
    """Runs one case; returns a Failure or None."""
    call_kwargs = dict(kwargs)
    if arg is not None and mode != "file":
        call_kwargs[arg] = value
    case = f"{mode}:{arg}={label}" if arg else "valid"
    where = describe(call_kwargs)
    try:
        result = target.call(call_kwargs)
    except (*ERRORS, FileNotFoundError) as e:
        msg = str(e)
        if isinstance(e, FileNotFoundError) and mode != "file":  # only a missing file may say so
            return Failure("wrong_exception", target.name, case, f"{type(e).__name__}: {msg} [{where}]")
        if mode in ("bad", "file"):
            names = _aliases(target, arg) + (tuple(kwargs.get("_aliases", ())) if mode == "file" else ())
            if mentions(msg, arg) or any(mentions(msg, n) for n in names):
                return None
            return Failure("unnamed_error", target.name, case, f"{type(e).__name__}: {msg} [{where}]")
        return Failure("rejected_valid", target.name, case, f"{type(e).__name__}: {msg} [{where}]")
    except Exception as e:  # noqa: BLE001 - the point: any other exception is a failure
        tb = traceback.format_exc(limit=3).strip().splitlines()[-1]
        return Failure("wrong_exception", target.name, case, f"{type(e).__name__}: {e} ({tb}) [{where}]")
    try:
        expected = target.reference(call_kwargs)
    except NoReference as e:
        return Failure("accepted_bad", target.name, case, f"returned a result for an input the reference refuses "
                                                          f"({e}) [{where}]")
    except Exception as e:  # noqa: BLE001
        if mode in ("bad", "file"):
            return Failure("accepted_bad", target.name, case, f"returned a result; the reference fails "
                                                              f"({type(e).__name__}: {e}) [{where}]")
        raise
    loose = label in NONFINITE_LABELS or label.startswith("dtype_")
    if target.compare is not None:
        why = target.compare(result, expected, {**call_kwargs, "_loose": loose})
    else:
        dtype = target.out_dtype(call_kwargs) if target.out_dtype is not None else None
        scale = target.atol_scale(call_kwargs) if target.atol_scale is not None else None
        why = assert_close(result, expected, dtype=dtype, atol=target.atol, rtol=target.rtol, loose=loose,
                           atol_scale=scale)
    if why:
        return Failure("wrong_value", target.name, case, f"{why} [{where}]")
    return None


def _aliases(target: Target, arg: str) -> tuple:
    spec = target.args.get(arg)
    return tuple(spec.aliases) if spec is not None else ()


def case_strategy(target: Target):
    """A hypothesis strategy of ``(kwargs, mode, arg, label, value)``."""

    @st.composite
    def strategy(draw):
        kwargs = target.draw(draw)
        if "_bad_arg" in kwargs:  # a broken file: the error must name it, or one of the names in
            # kwargs["_aliases"] (e.g. the broken field of a config file); or the result match the reference
            return kwargs, "file", kwargs["_bad_arg"], str(kwargs.get("kind", kwargs.get("how", ""))), None
        mode = draw(st.sampled_from(["valid", "layout", "bad", "bad", "bad"]))
        if mode == "valid" or not target.args:
            return kwargs, "valid", None, "", None
        names = sorted(target.args)
        for _ in range(len(names) + 1):
            arg = draw(st.sampled_from(names))
            if arg in target.bad_only:
                mode = "bad"
            good, bad = variants_of(arg, target.args[arg], kwargs.get(arg))
            pool = good if mode == "layout" else bad
            if mode == "layout" and not pool:
                continue
            if not pool:
                continue
            spec = target.args[arg]
            if mode == "bad" and spec.kind == "array" and kwargs.get(arg) is not None and draw(st.integers(0, 4)) == 0:
                # any numpy scalar dtype (hypothesis.extra.numpy): real ones must be read as float32
                # (float64 as float64), the others refused
                dt = draw(hnp.scalar_dtypes())
                src = np.asarray(kwargs[arg])
                if dt.kind == "u" and src.dtype.kind == "f":
                    # a negative float cast to an unsigned int is platform-defined (x86 wraps it to
                    # 2**32 - 1..., aarch64 saturates to 0): through int64 it wraps everywhere, so that
                    # a seed gives the same case on every machine and keeps its huge values (stress)
                    src = src.astype(np.int64)
                try:
                    value = src.astype(dt)
                except (TypeError, ValueError):
                    value = None
                if value is not None:
                    return kwargs, mode, arg, f"dtype_{dt.str}", value
            label, value = draw(st.sampled_from(pool))
            return kwargs, mode, arg, label, value
        return kwargs, "valid", None, "", None

    return strategy()


def run_target(target: Target, examples: int, seed: int) -> tuple[int, list[Failure]]:
    """Runs ``examples`` hypothesis examples of ``target`` with a fixed seed; never raises for a
    failing case (every failure is recorded): ``(cases run, failures)``."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    failures: list[Failure] = []
    count = [0]

    @hseed(seed)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate], report_multiple_bugs=False)
    @given(case_strategy(target))
    def check(case):
        kwargs, mode, arg, label, value = case
        count[0] += 1
        try:
            failure = run_case(target, kwargs, mode, arg, label, value)
        except Exception as e:  # noqa: BLE001 - the reference failed on a valid case: a harness bug
            failure = Failure("harness_error", target.name, f"{mode}:{arg}={label}",
                              f"{type(e).__name__}: {e} [{describe(kwargs)}]")
        if failure is not None:
            failures.append(failure)

    check()
    return count[0], failures
