"""Property targets of the functions: transformer_core.functional (and the positional functions it
re-exports), masks, backward, quantization and multihead_forms."""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
import transformer_core as tc
from hypothesis import strategies as st

from .harness import Arg, NoReference, Target, assert_close
from .refs import (
    DTYPES,
    as_dtype,
    attention,
    common_dtype,
    dims,
    layer_norm,
    layer_norm_t,
    lib_dtype,
    read,
    read_attn_mask,
    read_bool,
    read_choice,
    read_float,
    read_ids,
    read_int,
    read_keep,
    rng_array,
    softmax_rows,
    t,
    to_np,
)

F = tc.functional
B = tc.backward
TARGETS: list[Target] = []


def target(**kw):
    TARGETS.append(Target(**kw))


def x_dtype(name="x"):
    return lambda kw: lib_dtype(kw[name])


def data_dtype(*names):
    """The op computes in float64 if any of its float data arguments ``names`` is float64."""
    return lambda kw: common_dtype(*(kw.get(n) for n in names))


# ------------------------------------------------------------------------------------------------
# functional
# ------------------------------------------------------------------------------------------------
def _draw_linear(draw):
    dt = draw(DTYPES)
    lead = dims(draw, draw(st.integers(1, 3)), 1, 4)
    i, o = dims(draw, 2, 1, 9)
    return {"x": rng_array(draw, lead + (i,), dt), "weight": rng_array(draw, (o, i), dt),
            "bias": draw(st.one_of(st.none(), st.just(rng_array(draw, (o,), dt))))}


def _ref_linear(kw):
    x, w = read(kw["x"], "x"), read(kw["weight"], "weight")
    b = None if kw["bias"] is None else read(kw["bias"], "bias")
    if x.ndim < 1 or w.ndim != 2 or (b is not None and b.ndim != 1):
        raise NoReference("ranks")
    return torch.nn.functional.linear(t(x), t(w), None if b is None else t(b)).numpy()


target(name="functional.linear", draw=_draw_linear, call=lambda kw: F.linear(kw["x"], kw["weight"], kw["bias"]),
       reference=_ref_linear, out_dtype=data_dtype("x", "weight", "bias"),
       args={"x": Arg("array"), "weight": Arg("array"), "bias": Arg("array", optional=True)})


def _draw_x(draw, min_ndim=1, max_ndim=4):
    dt = draw(DTYPES)
    return rng_array(draw, dims(draw, draw(st.integers(min_ndim, max_ndim)), 1, 6), dt)


def _ref_softmax(kw):
    x = read(kw["x"])
    if x.ndim < 1:
        raise NoReference("rank 0")
    axis = read_int(kw["axis"], "axis", -x.ndim, x.ndim - 1)
    return softmax_rows(x, axis)


target(name="functional.softmax",
       draw=lambda d: (lambda x: {"x": x, "axis": d(st.integers(-x.ndim, x.ndim - 1))})(_draw_x(d)),
       call=lambda kw: F.softmax(kw["x"], dim=kw["axis"]), reference=_ref_softmax, out_dtype=x_dtype(),
       # x of another rank can put the drawn axis out of range: refused by naming axis (its range by x's rank);
       # the parameter is torch's dim (axis= its deprecated name): errors name dim
       args={"x": Arg("array", aliases=("axis", "dim")), "axis": Arg("int", low=-1, high=0, aliases=("dim",))})


def _draw_norm(draw, bias=True):
    dt = draw(DTYPES)
    lead = dims(draw, draw(st.integers(0, 3)), 1, 4)
    e = draw(st.integers(1, 9))
    kw = {"x": rng_array(draw, lead + (e,), dt),
          "weight": draw(st.one_of(st.none(), st.just(rng_array(draw, (e,), dt)))),
          "eps": draw(st.sampled_from([0.0, 1e-12, 1e-5, 0.1]))}
    if bias:
        kw["bias"] = draw(st.one_of(st.none(), st.just(rng_array(draw, (e,), dt))))
    return kw


def _ref_norm(kw, kind):
    x = read(kw["x"])
    if x.ndim < 1:
        raise NoReference("rank 0")
    e = x.shape[-1]
    w = None if kw["weight"] is None else read(kw["weight"], "weight")
    b = None if kw.get("bias") is None else read(kw["bias"], "bias")
    for p in (w, b):
        if p is not None and p.shape != (e,):
            raise NoReference("param shape")
    eps = None if kind == "rms_norm" and kw["eps"] is None else read_float(kw["eps"], "eps", 0.0)
    if kind == "layer_norm":
        return layer_norm(x, w, b, eps)  # torch's, safe from overflow (a 1e300 entry) as the library
    return torch.nn.functional.rms_norm(t(x), (e,), None if w is None else t(w), eps).numpy()


def _norm_args(bias=True):
    # rms_norm's eps may be None (torch's default: finfo(dtype).eps), layer_norm's may not
    a = {"x": Arg("array"), "weight": Arg("array", optional=True), "eps": Arg("float", low=0.0, optional=not bias)}
    if bias:
        a["bias"] = Arg("array", optional=True)
    return a


# eps = 0 on a constant row divides 0 by 0 (NaN in torch and here alike); rows of one value are avoided
target(name="functional.layer_norm", draw=_draw_norm,
       call=lambda kw: F.layer_norm(kw["x"], kw["weight"], kw["bias"], eps=kw["eps"]),
       reference=lambda kw: _ref_norm(kw, "layer_norm"), out_dtype=data_dtype("x", "weight", "bias"), args=_norm_args(),
       atol=1e-4,
       rtol=1e-4)
target(name="functional.rms_norm", draw=lambda d: _draw_norm(d, bias=False),
       call=lambda kw: F.rms_norm(kw["x"], kw["weight"], eps=kw["eps"]),
       reference=lambda kw: _ref_norm(kw, "rms_norm"), out_dtype=data_dtype("x", "weight"), args=_norm_args(False),
       atol=1e-4,
       rtol=1e-4)


def _ref_act(kw, fn):
    x = read(kw["x"])
    return fn(t(x)).numpy()


target(name="functional.gelu",
       draw=lambda d: {"x": _draw_x(d, 0), "approximate": d(st.sampled_from(["none", "tanh"]))},
       call=lambda kw: F.gelu(kw["x"], approximate=kw["approximate"]),
       reference=lambda kw: _ref_act(kw, lambda x: torch.nn.functional.gelu(
           x, approximate=read_choice(kw["approximate"], "approximate", ("none", "tanh")))),
       out_dtype=x_dtype(), args={"x": Arg("array"), "approximate": Arg("choice", choices=("none", "tanh"))})
target(name="functional.relu+silu", draw=lambda d: {"x": _draw_x(d, 0), "fn": d(st.sampled_from(["relu", "silu"]))},
       call=lambda kw: getattr(F, kw["fn"])(kw["x"]),
       reference=lambda kw: _ref_act(kw, getattr(torch.nn.functional, kw["fn"])), out_dtype=x_dtype(),
       args={"x": Arg("array")})


def _draw_glu(draw):
    dt = draw(DTYPES)
    shape = dims(draw, draw(st.integers(1, 3)), 1, 5)
    return {"gate": rng_array(draw, shape, dt), "up": rng_array(draw, shape, dt),
            "activation": draw(st.sampled_from(["silu", "gelu", "gelu_tanh", "relu"]))}


_ACTS = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu, "relu": torch.nn.functional.relu,
         "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"), "tanh": torch.tanh,
         "gelu_new": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
         "gelu_pytorch_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
         "swish": torch.nn.functional.silu}


def _ref_glu(kw):
    g, u = read(kw["gate"], "gate"), read(kw["up"], "up")
    if g.shape != u.shape:
        raise NoReference("shapes")
    act = kw["activation"]
    if not isinstance(act, str) or act not in _ACTS:
        raise NoReference("activation")
    return (_ACTS[act](t(g)) * t(u)).numpy()


target(name="functional.glu", draw=_draw_glu, call=lambda kw: F.glu(kw["gate"], kw["up"], kw["activation"]),
       reference=_ref_glu, out_dtype=data_dtype("gate", "up"),
       args={"gate": Arg("array"), "up": Arg("array"), "activation": Arg("choice", choices=("silu", "gelu"))})


def _ref_dropout(kw):
    x = read(kw["x"])
    p = read_float(kw["p"], "p", 0.0, 1.0) if "p" in kw else 0.5  # torch's default
    training = read_bool(kw["training"], "training")
    read_bool(kw["inplace"], "inplace")  # drawn False only: True writes into x (the unit tests check it)
    if kw["seed"] is not None:
        read_int(kw["seed"], "seed", 0, 2**64 - 1)
    elif training and p > 0:  # no seed: only where no mask is drawn (training=False, or p=0)
        raise NoReference("seed: None in a training call with p > 0")
    return x, p, training


def _draw_dropout(d):
    """dropout's arguments: p drawn or left out (torch's default), seed None only where no mask is drawn."""
    kw = {"x": _draw_x(d, 0), "training": d(st.booleans()), "inplace": False}
    p = d(st.sampled_from([0.0, 0.1, 0.5, 1.0, None]))
    if p is not None:  # None: p left out, torch's default 0.5
        kw["p"] = p
    seeds = st.integers(0, 2**64 - 1)
    if not kw["training"] or p == 0.0:  # seed=None is valid here: no mask is drawn
        seeds = st.none() | seeds
    kw["seed"] = d(seeds)
    return kw


def _call_dropout(kw):
    """F.dropout as torch's calls write it: p positional (or left out), the rest by keyword."""
    p = (kw["p"],) if "p" in kw else ()  # positional, as torch's calls pass it; left out: the default
    return F.dropout(kw["x"], *p, seed=kw["seed"], training=kw["training"], inplace=kw["inplace"])


def _cmp_dropout(result, expected, kw):
    x, p, training = expected
    r = np.asarray(result)
    dtype = lib_dtype(kw["x"])
    if r.dtype != dtype or r.shape != x.shape:
        return f"dtype/shape {r.dtype} {r.shape}, expected {np.dtype(dtype)} {x.shape}"
    with np.errstate(invalid="ignore"):
        dropped = x * 0.0  # torch's: 0, NaN for a non-finite x
    if not training or p == 0.0:
        ok = np.allclose(r, x, equal_nan=True)
    elif p == 1.0:
        ok = np.array_equal(r, dropped, equal_nan=True)
    else:  # every element dropped (x · 0) or scaled by 1 / (1 - p)
        scaled = x / (1 - p)
        ok = np.all(np.isclose(r, dropped, rtol=0, atol=0, equal_nan=True)
                    | np.isclose(r, scaled, rtol=1e-5, atol=1e-6, equal_nan=True))
    return None if ok else "values are neither x · 0 nor x / (1 - p)"


target(name="functional.dropout", draw=_draw_dropout, call=_call_dropout, reference=_ref_dropout,
       compare=_cmp_dropout,
       # seed=None is drawn where it is valid (training=False or p=0); not a layout of a drawn seed
       args={"x": Arg("array"), "p": Arg("float", low=0.0, high=1.0),
             "seed": Arg("int", low=0, high=2**64 - 1), "training": Arg("bool"), "inplace": Arg("bool")})


def _draw_ce(draw):
    dt = draw(DTYPES)
    lead = dims(draw, draw(st.integers(1, 2)), 1, 4)
    V = draw(st.integers(1, 7))
    tgt = np.asarray(draw(st.lists(st.integers(0, V - 1), min_size=int(np.prod(lead)),
                                   max_size=int(np.prod(lead))))).reshape(lead)
    return {"logits": rng_array(draw, lead + (V,), dt), "target": tgt.astype(np.int64),
            "ignore_index": draw(st.sampled_from([-100, 0])),
            "label_smoothing": draw(st.sampled_from([0.0, 0.1, 1.0])),
            "reduction": draw(st.sampled_from(["mean", "sum", "none"]))}


def _ref_ce(kw):
    x = read(kw["logits"], "logits")
    if x.ndim < 1:
        raise NoReference("rank")
    tg = read_ids(kw["target"], "target")
    if tg.shape != x.shape[:-1]:
        raise NoReference("shape")
    ii = read_int(kw["ignore_index"], "ignore_index")
    ls = read_float(kw["label_smoothing"], "label_smoothing", 0.0, 1.0)
    red = read_choice(kw["reduction"], "reduction", ("mean", "sum", "none"))
    V = x.shape[-1]
    if np.any((tg != ii) & ((tg < 0) | (tg >= V))):
        raise NoReference("target out of range")
    xs, ts = t(x.reshape(-1, V)), torch.from_numpy(tg.reshape(-1))
    if np.all(tg == ii):
        loss = torch.zeros(ts.shape, dtype=torch.float64)
        return loss.reshape(tg.shape).numpy() if red == "none" else np.float64(0.0)
    loss = torch.nn.functional.cross_entropy(xs, ts, ignore_index=ii, label_smoothing=ls, reduction=red)
    return loss.reshape(tg.shape).numpy() if red == "none" else loss.numpy()


def _ce_dtype(kw):
    return lib_dtype(kw["logits"])


target(name="functional.cross_entropy", draw=_draw_ce,
       call=lambda kw: F.cross_entropy(kw["logits"], kw["target"], ignore_index=kw["ignore_index"],
                                       label_smoothing=kw["label_smoothing"], reduction=kw["reduction"]),
       reference=_ref_ce, out_dtype=_ce_dtype, atol=1e-4, rtol=1e-4,
       args={"logits": Arg("array"), "target": Arg("ids", high=1, floats_as_ids=False), "ignore_index": Arg("int", low=-2**63, high=2**63 - 1),
             "label_smoothing": Arg("float", low=0.0, high=1.0),
             "reduction": Arg("choice", choices=("mean", "sum", "none"))})


def _draw_sdpa(draw):
    dt = draw(DTYPES)
    N, H = dims(draw, 2, 1, 3)
    L, S = dims(draw, 2, 1, 9)
    E, Ev = dims(draw, 2, 1, 8)
    rank = draw(st.sampled_from([3, 4]))
    lead = (N, H) if rank == 4 else (N,)
    kw = {"query": rng_array(draw, lead + (L, E), dt), "key": rng_array(draw, lead + (S, E), dt),
          "value": rng_array(draw, lead + (S, Ev), dt), "attn_mask": None, "key_mask": None, "query_mask": None,
          "is_causal": draw(st.booleans()), "scale": draw(st.sampled_from([None, 0.0, 0.5, -1.0])),
          "return_weights": draw(st.booleans()), "return_lse": draw(st.booleans()),
          "causal_alignment": draw(st.sampled_from(["top_left", "bottom_right"])),
          "path": draw(st.sampled_from(["auto", "flash", "reference"])), "enable_gqa": False}
    mask_kind = draw(st.sampled_from(["none", "bool", "float", "key", "query"]))
    if mask_kind == "bool":
        kw["attn_mask"] = rng_array(draw, (L, S)) > -0.5
    elif mask_kind == "float":
        kw["attn_mask"] = rng_array(draw, (L, S)).astype(dt)
    elif mask_kind == "key":
        kw["key_mask"] = rng_array(draw, (N, 1, S)[:rank - 1] if rank == 4 else (N, S)) > -0.5
    elif mask_kind == "query":
        kw["query_mask"] = rng_array(draw, (N, 1, L)[:rank - 1] if rank == 4 else (N, L)) > -0.5
    return kw


def _sdpa_bw_dtype(kw):
    """The attention backward computes in float64 if any of its float data arguments is."""
    return common_dtype(*(kw[n] for n in ("query", "key", "value", "out", "grad_out", "lse")))


def _ref_sdpa(kw):
    dtype = common_dtype(kw["query"], kw["key"], kw["value"])
    q, k, v = read(kw["query"], "query"), read(kw["key"], "key"), read(kw["value"], "value")
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim or k.shape[-1] != q.shape[-1] or \
            v.shape[-2] != k.shape[-2] or k.shape[:-2] != q.shape[:-2] or v.shape[:-2] != q.shape[:-2]:
        raise NoReference("shapes")
    if dtype == np.float32:  # the library computes in float32: round the inputs as it reads them
        q, k, v = (a.astype(np.float32).astype(np.float64) for a in (q, k, v))
    read_bool(kw["enable_gqa"], "enable_gqa")
    L, S = q.shape[-2], k.shape[-2]
    bool_mask = float_mask = None
    if kw["attn_mask"] is not None:
        m = read_attn_mask(kw["attn_mask"])
        try:
            np.broadcast_to(m, q.shape[:-2] + (L, S))
        except ValueError:
            raise NoReference("attn_mask shape") from None
        if m.dtype == np.bool_:
            bool_mask = m
        else:
            float_mask = m.astype(dtype).astype(np.float64)
    parts = []
    for name, where in (("query_mask", (slice(None), None)), ("key_mask", (None, slice(None)))):
        if kw[name] is not None:
            m = read_keep(kw[name], name)
            n = L if name == "query_mask" else S
            if m.ndim < 1 or m.shape[-1] != n:
                raise NoReference(name)
            m = m[(..., *where)]
            try:
                np.broadcast_to(m, q.shape[:-2] + (L, S))
            except ValueError:
                raise NoReference(name) from None
            parts.append(m)
    if parts:
        bm = np.broadcast_to(parts[0], q.shape[:-2] + (L, S))
        for p in parts[1:]:
            bm = bm & p
        bool_mask = bm if bool_mask is None else (bool_mask & bm)
    is_causal = read_bool(kw["is_causal"], "is_causal")
    align = read_choice(kw["causal_alignment"], "causal_alignment", ("top_left", "bottom_right"))
    read_choice(kw["path"], "path", ("auto", "flash", "reference"))
    scale = None if kw["scale"] is None else read_float(kw["scale"], "scale")
    rw, rl = read_bool(kw["return_weights"], "return_weights"), read_bool(kw["return_lse"], "return_lse")
    return attention(q, k, v, bool_mask, float_mask, is_causal, 0 if align == "top_left" else S - L, scale, rw, rl)


target(name="functional.scaled_dot_product_attention", draw=_draw_sdpa,
       call=lambda kw: F.scaled_dot_product_attention(
           kw["query"], kw["key"], kw["value"], kw["attn_mask"], query_mask=kw["query_mask"],
           key_mask=kw["key_mask"], is_causal=kw["is_causal"], scale=kw["scale"],
           return_weights=kw["return_weights"], causal_alignment=kw["causal_alignment"],
           enable_gqa=kw["enable_gqa"], path=kw["path"], return_lse=kw["return_lse"]),
       reference=_ref_sdpa, out_dtype=data_dtype("query", "key", "value"), atol=1e-4, rtol=1e-4, weight=2.0,
       args={"query": Arg("array"), "key": Arg("array"), "value": Arg("array"),
             "attn_mask": Arg("attn_mask", optional=True), "key_mask": Arg("keep_mask", optional=True),
             "query_mask": Arg("keep_mask", optional=True), "is_causal": Arg("bool"), "return_weights": Arg("bool"),
             "return_lse": Arg("bool"), "enable_gqa": Arg("bool"),
             "scale": Arg("float", optional=True),
             "causal_alignment": Arg("choice", choices=("top_left", "bottom_right")),
             "path": Arg("choice", choices=("auto", "flash", "reference"))})


def _draw_varlen(draw):
    dt = draw(DTYPES)
    lengths = draw(st.lists(st.integers(0, 6), min_size=1, max_size=4))
    if sum(lengths) == 0:
        lengths[0] = 1
    Hkv = draw(st.sampled_from([1, 2]))
    H = Hkv * draw(st.sampled_from([1, 2]))
    E, Ev = dims(draw, 2, 1, 8)
    T = sum(lengths)
    return {"query": rng_array(draw, (T, H, E), dt), "key": rng_array(draw, (T, Hkv, E), dt),
            "value": rng_array(draw, (T, Hkv, Ev), dt), "cu_seqlens": np.cumsum([0] + lengths).astype(np.int64),
            "is_causal": draw(st.booleans()), "scale": draw(st.sampled_from([None, 0.0, 0.5, -1.0])),
            "path": draw(st.sampled_from(["auto", "flash", "reference"]))}


def _ref_varlen(kw):
    dtype = common_dtype(kw["query"], kw["key"], kw["value"])
    q, k, v = read(kw["query"], "query"), read(kw["key"], "key"), read(kw["value"], "value")
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0] or \
            k.shape[2] != q.shape[2] or v.shape[1] != k.shape[1] or q.shape[1] % k.shape[1] != 0:
        raise NoReference("shapes")
    if dtype == np.float32:  # the library computes in float32: round the inputs as it reads them
        q, k, v = (a.astype(np.float32).astype(np.float64) for a in (q, k, v))
    cu = to_np(kw["cu_seqlens"])
    if isinstance(cu, (str, bytes)) or np.asarray(cu).dtype.kind not in "iu":
        raise NoReference("cu_seqlens: not integers")
    cu = read_ids(cu, "cu_seqlens")
    T = q.shape[0]
    if cu.ndim != 1 or cu.size < 2 or cu[0] != 0 or cu[-1] != T or np.any(cu[1:] < cu[:-1]):
        raise NoReference("cu_seqlens")
    is_causal = read_bool(kw["is_causal"], "is_causal")
    read_choice(kw["path"], "path", ("auto", "flash", "reference"))
    scale = None if kw["scale"] is None else read_float(kw["scale"], "scale")
    g = q.shape[1] // k.shape[1]
    out = np.zeros((T, q.shape[1], v.shape[2]))
    for a, b in zip(cu[:-1], cu[1:]):
        if a < b:
            seq = attention(q[a:b].transpose(1, 0, 2), np.repeat(k[a:b].transpose(1, 0, 2), g, 0),
                            np.repeat(v[a:b].transpose(1, 0, 2), g, 0), is_causal=is_causal, scale=scale)
            out[a:b] = seq.transpose(1, 0, 2)
    return out


target(name="functional.varlen_attention", draw=_draw_varlen,
       call=lambda kw: F.varlen_attention(kw["query"], kw["key"], kw["value"], kw["cu_seqlens"],
                                          is_causal=kw["is_causal"], scale=kw["scale"], path=kw["path"]),
       reference=_ref_varlen, out_dtype=data_dtype("query", "key", "value"), atol=1e-4, rtol=1e-4,
       args={"query": Arg("array"), "key": Arg("array"), "value": Arg("array"),
             "cu_seqlens": Arg("ids", high=10**6, floats_as_ids=False), "is_causal": Arg("bool"),
             "scale": Arg("float", optional=True), "path": Arg("choice", choices=("auto", "flash", "reference"))})


# ------------------------------------------------------------------------------------------------
# positional functions
# ------------------------------------------------------------------------------------------------
def _ref_sinusoidal(kw):
    n = read_int(kw["max_len"], "max_len", 1)
    d = read_int(kw["d_model"], "d_model", 1)
    base = read_float(kw["base"], "base", 0.0, open_low=True)
    pos = np.arange(n)[:, None]
    i = np.arange(d)[None, :]
    angle = pos / base ** ((i - i % 2) / d)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle))


def _dtype_of(kw):
    try:
        return as_dtype(kw["dtype"]).type if as_dtype(kw["dtype"]).itemsize == 4 else np.float64
    except TypeError:
        return None


target(name="positional.sinusoidal_positional_encoding",
       draw=lambda d: {"max_len": d(st.integers(1, 20)), "d_model": d(st.integers(1, 9)),
                       "base": d(st.sampled_from([10000.0, 10, 1.5])), "dtype": d(DTYPES)},
       call=lambda kw: F.sinusoidal_positional_encoding(kw["max_len"], kw["d_model"], kw["base"], kw["dtype"]),
       reference=_ref_sinusoidal, out_dtype=_dtype_of, atol=1e-5,
       args={"max_len": Arg("size"), "d_model": Arg("size"), "base": Arg("float", low=0.0, open_low=True),
             "dtype": Arg("dtype")})


def _ref_cos_sin(kw):
    n = read_int(kw["seq_len"], "seq_len", 1)
    d = read_int(kw["head_dim"], "head_dim", 2)
    if d % 2:
        raise NoReference("odd head_dim")
    base = read_float(kw["base"], "base", 0.0, open_low=True)
    off = read_int(kw["offset"], "offset", 0, 2**62)
    inv = 1.0 / base ** (np.arange(0, d, 2) / d)
    f = np.outer(np.arange(off, off + n), inv)
    emb = np.concatenate([f, f], axis=-1)
    return np.cos(emb), np.sin(emb)


target(name="positional.rotary_cos_sin",
       draw=lambda d: {"seq_len": d(st.integers(1, 12)), "head_dim": 2 * d(st.integers(1, 5)),
                       "base": d(st.sampled_from([10000.0, 100.0])), "offset": d(st.integers(0, 50)),
                       "dtype": d(DTYPES)},
       call=lambda kw: F.rotary_cos_sin(kw["seq_len"], kw["head_dim"], kw["base"], kw["offset"], kw["dtype"]),
       reference=_ref_cos_sin, out_dtype=_dtype_of, atol=1e-5,
       args={"seq_len": Arg("size"), "head_dim": Arg("size", bad=[("odd", 3)]),
             "base": Arg("float", low=0.0, open_low=True), "offset": Arg("int", low=0, high=None),
             "dtype": Arg("dtype")})


def _draw_rotary(draw):
    dt = draw(DTYPES)
    lead = dims(draw, draw(st.integers(0, 2)), 1, 3)
    L, half = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    D = 2 * half
    width = draw(st.sampled_from([D, half]))
    ang = rng_array(draw, (L, width), np.float64)
    return {"x": rng_array(draw, lead + (L, D), dt), "cos": np.cos(ang).astype(dt), "sin": np.sin(ang).astype(dt),
            "layout": draw(st.sampled_from(["half", "interleaved"]))}


def _rotary_inputs(kw, name="x", dtype=None):
    """x, cos, sin (float64, rounded to float32 where the library computes in float32: ``dtype``, by
    default x's own), layout, W: the forward's inputs as the reference reads them (NoReference where
    it cannot)."""
    x = read(kw[name], name)
    c, s = read(kw["cos"], "cos"), read(kw["sin"], "sin")
    layout = read_choice(kw["layout"], "layout", ("half", "interleaved"))
    if x.ndim < 2 or x.shape[-1] % 2 or c.shape != s.shape or c.ndim < 2:
        raise NoReference("shapes")
    D = x.shape[-1]
    if (lib_dtype(kw[name]) if dtype is None else dtype) == np.float32:
        x, c, s = (a.astype(np.float32).astype(np.float64) for a in (x, c, s))
    W = c.shape[-1]
    if W not in (D, D // 2):
        raise NoReference("width")
    try:
        if np.broadcast_shapes(c.shape[:-1], x.shape[:-1]) != x.shape[:-1]:
            raise NoReference("broadcast")
    except ValueError:
        raise NoReference("broadcast") from None
    return x, c, s, layout, W


def _ref_rotary(kw, name="x", dtype=None):
    x, c, s, layout, W = _rotary_inputs(kw, name, dtype)
    D = x.shape[-1]
    h = D // 2
    if layout == "half":
        if W == h:
            c, s = np.concatenate([c, c], -1), np.concatenate([s, s], -1)
        rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
        return x * c + rot * s
    ci, si = c[..., :h], s[..., :h]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    y = np.empty(np.broadcast_shapes(x.shape, ci.shape[:-1] + (D,)))
    y[..., 0::2] = x0 * ci - x1 * si
    y[..., 1::2] = x1 * ci + x0 * si
    return y


_ROT_ARGS = {"cos": Arg("array"), "sin": Arg("array"), "layout": Arg("choice", choices=("half", "interleaved"))}
target(name="positional.apply_rotary", draw=_draw_rotary,
       call=lambda kw: F.apply_rotary(kw["x"], kw["cos"], kw["sin"], kw["layout"]), reference=_ref_rotary,
       out_dtype=x_dtype(), atol=1e-5, args={"x": Arg("array"), **_ROT_ARGS})


def _draw_rope_qk(draw):
    kw = _draw_rotary(draw)
    kw["q"] = kw.pop("x")
    kw["k"] = rng_array(draw, kw["q"].shape, kw["q"].dtype)
    return kw


target(name="positional.apply_rotary_pos_emb", draw=_draw_rope_qk,
       call=lambda kw: F.apply_rotary_pos_emb(kw["q"], kw["k"], kw["cos"], kw["sin"], layout=kw["layout"]),
       # q and k are each rotated in their own dtype (positional.apply_rotary_pos_emb)
       reference=lambda kw: (_ref_rotary(kw, "q"), _ref_rotary(kw, "k")),
       out_dtype=lambda kw: (lib_dtype(kw["q"]), lib_dtype(kw["k"])), atol=1e-5,
       args={"q": Arg("array"), "k": Arg("array"), **_ROT_ARGS})
target(name="positional.rotate_half", draw=lambda d: {"x": rng_array(d, dims(d, d(st.integers(1, 3)), 1, 3)[:-1] +
                                                                     (2 * d(st.integers(1, 4)),), d(DTYPES))},
       call=lambda kw: F.rotate_half(kw["x"]),
       reference=lambda kw: (lambda x: np.concatenate([-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]], -1)
                             if x.ndim >= 1 and x.shape[-1] % 2 == 0 else (_ for _ in ()).throw(NoReference("odd")))(
           read(kw["x"])), out_dtype=x_dtype(), args={"x": Arg("array")})


# ------------------------------------------------------------------------------------------------
# masks
# ------------------------------------------------------------------------------------------------
def _ref_causal(kw):
    L = read_int(kw["L"], "L", 1)
    S = L if kw["S"] is None else read_int(kw["S"], "S", 1)
    align = read_choice(kw["alignment"], "alignment", ("top_left", "bottom_right"))
    return np.arange(S)[None, :] <= np.arange(L)[:, None] + (0 if align == "top_left" else S - L)


target(name="masks.causal_mask",
       draw=lambda d: {"L": d(st.integers(1, 9)), "S": d(st.one_of(st.none(), st.integers(1, 9))),
                       "alignment": d(st.sampled_from(["top_left", "bottom_right"]))},
       call=lambda kw: tc.masks.causal_mask(kw["L"], kw["S"], kw["alignment"]), reference=_ref_causal,
       args={"L": Arg("size"), "S": Arg("size", optional=True),
             "alignment": Arg("choice", choices=("top_left", "bottom_right"))})


def _ref_padding(kw):
    lengths = read_ids(kw["lengths"], "lengths")
    if lengths.ndim != 1 or lengths.min() < 0:
        raise NoReference("lengths")
    m = max(int(lengths.max()), 1) if kw["max_len"] is None else read_int(kw["max_len"], "max_len", 1)
    if lengths.max() > m:
        raise NoReference("max_len")
    return np.arange(m)[None, :] < lengths[:, None]


target(name="masks.padding_mask",
       draw=lambda d: {"lengths": np.array(d(st.lists(st.integers(0, 8), min_size=1, max_size=5))),
                       "max_len": d(st.one_of(st.none(), st.integers(8, 12)))},
       call=lambda kw: tc.masks.padding_mask(kw["lengths"], kw["max_len"]), reference=_ref_padding,
       # a length beyond the given max_len is refused by naming max_len ("expected >= the longest length")
       args={"lengths": Arg("ids", high=9, floats_as_ids=False, bad=[("huge_len", np.array([2**40]))],
                            aliases=("max_len",)),
             "max_len": Arg("size", optional=True)})


def _ref_pad_ids(kw):
    ids = read_ids(kw["input_ids"])
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2:
        raise NoReference("rank")
    return ids != read_int(kw["pad_token_id"], "pad_token_id")


target(name="masks.padding_mask_from_ids",
       draw=lambda d: {"input_ids": np.array(d(st.lists(st.integers(0, 5), min_size=1, max_size=12))).reshape(1, -1),
                       "pad_token_id": d(st.integers(0, 5))},
       call=lambda kw: tc.masks.padding_mask_from_ids(kw["input_ids"], kw["pad_token_id"]), reference=_ref_pad_ids,
       args={"input_ids": Arg("ids", high=6), "pad_token_id": Arg("int", low=None, high=None)})


def _draw_mask_conv(draw):
    fn = draw(st.sampled_from(["from_torch_mha", "from_additive", "from_hf", "to_additive"]))
    shape = dims(draw, draw(st.integers(1, 3)), 1, 5)
    b = rng_array(draw, shape) > 0
    if fn == "from_torch_mha":
        m = draw(st.sampled_from([b, np.where(b, 0.0, -np.inf).astype(np.float32)]))
    elif fn == "from_additive":
        # -9984.0: BERT's -10000.0 as bfloat16 rounds it
        m = np.where(b, 0.0, draw(st.sampled_from([-np.inf, -1e9, -10000.0, -9984.0]))).astype(draw(DTYPES))
    elif fn == "from_hf":
        m = draw(st.sampled_from([b, b.astype(np.int64), b.astype(np.float32)]))
    else:
        m = b
    return {"fn": fn, "mask": m, "dtype": draw(DTYPES)}


def _ref_mask_conv(kw):
    fn, m = kw["fn"], kw["mask"]
    if m is None or isinstance(m, (str, bytes, dict)):
        raise NoReference("mask")
    try:
        a = np.asarray(to_np(m))
    except (ValueError, TypeError):
        raise NoReference("mask") from None
    if fn == "from_torch_mha":
        if a.dtype == np.bool_:
            return ~a
        if a.dtype.kind != "f":
            raise NoReference("dtype")
        return a
    if fn == "from_additive":
        if a.dtype.kind != "f" or np.isnan(a).any() or np.isposinf(a).any():
            raise NoReference("dtype")
        return a > -9000.0  # the documented default cut (masks.ADDITIVE_BLOCKED_AT)
    if fn == "from_hf":
        return read_keep(a)
    if a.dtype != np.bool_:
        raise NoReference("dtype")
    dt = _dtype_of(kw)
    if dt is None:
        raise NoReference("dtype")
    return np.where(a, 0.0, -np.inf).astype(dt)


def _call_mask_conv(kw):
    f = getattr(tc.masks, kw["fn"])
    return f(kw["mask"], kw["dtype"]) if kw["fn"] == "to_additive" else f(kw["mask"])


def _cmp_mask_conv(result, expected, kw):
    from .harness import assert_close

    r = np.asarray(result)
    if kw["fn"] == "from_torch_mha" and np.asarray(expected).dtype.kind == "f":
        return None if np.array_equal(r, expected, equal_nan=True) and r.dtype == np.asarray(to_np(kw["mask"])).dtype \
            else "float mask not returned as is"
    return assert_close(result, expected)


target(name="masks.converters", draw=_draw_mask_conv, call=_call_mask_conv, reference=_ref_mask_conv,
       compare=_cmp_mask_conv,
       args={"mask": Arg("array", layouts=False), "dtype": Arg("dtype")})


# ------------------------------------------------------------------------------------------------
# backward (each against torch.autograd)
# ------------------------------------------------------------------------------------------------
def _grad(fn, inputs, grad_out):
    ts = [t(a).requires_grad_(True) for a in inputs]
    y = fn(*ts)
    y.backward(t(grad_out))
    return [x.grad.numpy() for x in ts]


def _draw_lin_bw(draw):
    kw = _draw_linear(draw)
    kw["bias"] = draw(st.booleans())
    o = kw["weight"].shape[0]
    kw["grad_output"] = rng_array(draw, kw["x"].shape[:-1] + (o,), kw["x"].dtype)
    kw["need_grad_input"] = draw(st.booleans())
    return kw


def _ref_lin_bw(kw):
    x, w, g = read(kw["x"], "x"), read(kw["weight"], "weight"), read(kw["grad_output"], "grad_output")
    bias, need = read_bool(kw["bias"], "bias"), read_bool(kw["need_grad_input"], "need_grad_input")
    if x.ndim < 1 or w.ndim != 2 or w.shape[1] != x.shape[-1] or g.shape != x.shape[:-1] + (w.shape[0],):
        raise NoReference("shapes")
    gx, gw = _grad(lambda a, b: torch.nn.functional.linear(a, b), [x, w], g)
    gb = g.reshape(-1, w.shape[0]).sum(0) if bias else None
    return (gx if need else None, gw, gb)


target(name="backward.linear_backward", draw=_draw_lin_bw,
       call=lambda kw: B.linear_backward(kw["x"], kw["weight"], kw["grad_output"], kw["bias"],
                                         need_grad_input=kw["need_grad_input"]),
       reference=_ref_lin_bw, out_dtype=lambda kw: (data_dtype("x", "weight", "grad_output")(kw),) * 3, atol=1e-4,
       rtol=1e-4,
       args={"x": Arg("array"), "weight": Arg("array"), "grad_output": Arg("array"), "bias": Arg("bool"),
             "need_grad_input": Arg("bool")})


def _draw_norm_bw(draw, kind):
    kw = _draw_norm(draw, bias=False)
    kw["eps"] = draw(st.sampled_from([1e-5, 0.1]))
    kw["grad_output"] = rng_array(draw, kw["x"].shape, kw["x"].dtype)
    if kind == "layer_norm":
        kw["bias"] = draw(st.booleans())
    return kw


def _ref_norm_bw(kw, kind):
    x, g = read(kw["x"], "x"), read(kw["grad_output"], "grad_output")
    if x.ndim < 1 or g.shape != x.shape:
        raise NoReference("shapes")
    e = x.shape[-1]
    w = None if kw["weight"] is None else read(kw["weight"], "weight")
    if w is not None and w.shape != (e,):
        raise NoReference("weight")
    eps = None if kind == "rms_norm" and kw["eps"] is None else read_float(kw["eps"], "eps", 0.0)
    if kind == "layer_norm":
        bias = read_bool(kw["bias"], "bias")
        # layer_norm_t: torch's, safe from overflow (a 1e300 entry), as the library's forward and backward
        if w is None:
            (gx,) = _grad(lambda a: layer_norm_t(a, eps=eps), [x], g)
            return gx, None, None
        gx, gw = _grad(lambda a, b: layer_norm_t(a, b, None, eps), [x, w], g)
        return gx, gw, (g.reshape(-1, e).sum(0) if bias else None)
    if w is None:
        (gx,) = _grad(lambda a: torch.nn.functional.rms_norm(a, (e,), eps=eps), [x], g)
        return gx, None
    return tuple(_grad(lambda a, b: torch.nn.functional.rms_norm(a, (e,), b, eps), [x, w], g))


target(name="backward.layer_norm_backward", draw=lambda d: _draw_norm_bw(d, "layer_norm"),
       call=lambda kw: B.layer_norm_backward(kw["x"], kw["weight"], kw["grad_output"], kw["eps"], kw["bias"]),
       reference=lambda kw: _ref_norm_bw(kw, "layer_norm"),
       out_dtype=lambda kw: (data_dtype("x", "weight", "grad_output")(kw),) * 3,
       atol=1e-4, rtol=1e-3,
       args={"x": Arg("array"), "weight": Arg("array", optional=True), "grad_output": Arg("array"),
             "eps": Arg("float", low=0.0), "bias": Arg("bool")})
target(name="backward.rms_norm_backward", draw=lambda d: _draw_norm_bw(d, "rms_norm"),
       call=lambda kw: B.rms_norm_backward(kw["x"], kw["weight"], kw["grad_output"], kw["eps"]),
       reference=lambda kw: _ref_norm_bw(kw, "rms_norm"),
       out_dtype=lambda kw: (data_dtype("x", "weight", "grad_output")(kw),) * 2,
       atol=1e-4, rtol=1e-3,
       args={"x": Arg("array"), "weight": Arg("array", optional=True), "grad_output": Arg("array"),
             "eps": Arg("float", low=0.0, optional=True)})


def _draw_act_bw(draw):
    x = _draw_x(draw, 0)
    return {"fn": draw(st.sampled_from(["gelu", "gelu_tanh", "silu", "relu"])), "x": x,
            "grad_output": rng_array(draw, x.shape, x.dtype)}


def _call_act_bw(kw):
    if kw["fn"] == "gelu_tanh":
        return B.gelu_backward(kw["x"], kw["grad_output"], approximate="tanh")
    return getattr(B, kw["fn"] + "_backward")(kw["x"], kw["grad_output"])


def _ref_act_bw(kw):
    x, g = read(kw["x"], "x"), read(kw["grad_output"], "grad_output")
    if g.shape != x.shape:
        raise NoReference("shape")
    (gx,) = _grad(_ACTS[kw["fn"]], [x], g)
    return gx


def _grad_unit(kw):
    """max(1, |grad_output|) where finite: the result is grad_output · f'(x), f'(x) computed in the
    library's dtype to atol; a gradient of 1e19 (an integer dtype's wrap-around) multiplies its error."""
    with np.errstate(over="ignore", invalid="ignore"):
        g = np.abs(read(kw["grad_output"], "grad_output"))
    return np.where(np.isfinite(g), np.maximum(g, 1.0), 1.0)


target(name="backward.activation_backward", draw=_draw_act_bw, call=_call_act_bw, reference=_ref_act_bw,
       out_dtype=data_dtype("x", "grad_output"), atol=1e-5, rtol=1e-4, atol_scale=_grad_unit,
       args={"x": Arg("array"), "grad_output": Arg("array")})


def _draw_glu_bw(draw):
    kw = _draw_glu(draw)
    kw["grad_output"] = rng_array(draw, kw["gate"].shape, kw["gate"].dtype)
    return kw


def _ref_glu_bw(kw):
    g, u, dh = read(kw["gate"], "gate"), read(kw["up"], "up"), read(kw["grad_output"], "grad_output")
    if g.shape != u.shape or dh.shape != g.shape or kw["activation"] not in _ACTS:
        raise NoReference("shapes")
    return tuple(_grad(lambda a, b: _ACTS[kw["activation"]](a) * b, [g, u], dh))


target(name="backward.glu_backward", draw=_draw_glu_bw,
       call=lambda kw: B.glu_backward(kw["gate"], kw["up"], kw["grad_output"], kw["activation"]),
       reference=_ref_glu_bw, out_dtype=lambda kw: (data_dtype("gate", "up", "grad_output")(kw),) * 2, atol=1e-5,
       rtol=1e-4,
       args={"gate": Arg("array"), "up": Arg("array"), "grad_output": Arg("array"),
             "activation": Arg("choice", choices=("silu",))})


def _draw_softmax_bw(draw):
    x = _draw_x(draw)
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    p = softmax_rows(x.astype(np.float64), axis).astype(x.dtype)
    return {"output": p, "grad_output": rng_array(draw, x.shape, x.dtype), "axis": axis}


def _ref_softmax_bw(kw):
    p, g = read(kw["output"], "output"), read(kw["grad_output"], "grad_output")
    if p.ndim < 1 or g.shape != p.shape:
        raise NoReference("shape")
    axis = read_int(kw["axis"], "axis", -p.ndim, p.ndim - 1)
    return p * (g - (p * g).sum(axis=axis, keepdims=True))


target(name="backward.softmax_backward", draw=_draw_softmax_bw,
       call=lambda kw: B.softmax_backward(kw["output"], kw["grad_output"], kw["axis"]), reference=_ref_softmax_bw,
       out_dtype=data_dtype("output", "grad_output"), atol=1e-5, rtol=1e-4,
       args={"output": Arg("array"), "grad_output": Arg("array"), "axis": Arg("int", low=-1, high=0)})


def _draw_emb_bw(draw):
    V = draw(st.integers(1, 8))
    shape = dims(draw, draw(st.integers(1, 2)), 1, 4)
    ids = np.asarray(draw(st.lists(st.integers(0, V - 1), min_size=int(np.prod(shape)),
                                   max_size=int(np.prod(shape))))).reshape(shape)
    H = draw(st.integers(1, 5))
    return {"ids": ids, "grad_output": rng_array(draw, shape + (H,), draw(DTYPES)), "num_embeddings": V,
            "padding_idx": draw(st.one_of(st.none(), st.integers(-V, V - 1)))}


def _ref_emb_bw(kw):
    V = read_int(kw["num_embeddings"], "num_embeddings", 1)
    raw = np.asarray(to_np(kw["ids"])) if isinstance(kw["ids"], np.ndarray) else None
    if raw is not None and raw.size == 0 and raw.dtype.kind in "iu":  # no ids: allowed, as torch
        ids = raw.astype(np.int64)
    else:
        ids = read_ids(kw["ids"], "ids", V)
    g = read(kw["grad_output"], "grad_output", allow_empty=True)  # embedding_dim 0 too, as torch
    if g.ndim < 1 or g.shape[:-1] != ids.shape:
        raise NoReference("shape")
    if np.asarray(to_np(kw["ids"])).dtype.kind == "f":
        raise NoReference("float ids")
    pad = None if kw["padding_idx"] is None else read_int(kw["padding_idx"], "padding_idx", -V, V - 1) % V
    out = np.zeros((V, g.shape[-1]))
    for i, row in zip(ids.reshape(-1), g.reshape(ids.size, g.shape[-1])):
        if i != pad:
            out[i] += row
    return out


target(name="backward.embedding_backward", draw=_draw_emb_bw,
       call=lambda kw: B.embedding_backward(kw["ids"], kw["grad_output"], kw["num_embeddings"], kw["padding_idx"]),
       reference=_ref_emb_bw, out_dtype=x_dtype("grad_output"), atol=1e-5,
       args={"ids": Arg("ids", high=1), "grad_output": Arg("array"),
             "num_embeddings": Arg("size"),
             "padding_idx": Arg("int", low=-1, high=0, optional=True)})


def _draw_rot_bw(draw):
    kw = _draw_rotary(draw)
    kw["grad_output"] = kw.pop("x")
    return kw


def _ref_rot_bw(kw):
    """torch.autograd's vector-Jacobian product of the forward (``_ref_rotary``'s formula, in torch):
    ``grad_x = g·cos + rotate_halfᵀ(g·sin)`` (half), the transposed pair rotation (interleaved), as
    the docstring writes it. A non-finite table or gradient entry only reaches the entries whose
    formula reads it (a Jacobian built from unit vectors would spread 0 · NaN to every entry)."""
    g = read(kw["grad_output"], "grad_output")
    c, s = read(kw["cos"], "cos"), read(kw["sin"], "sin")
    if g.ndim < 2 or g.shape[-1] % 2 or c.shape != s.shape:
        raise NoReference("shape")
    # the forward's checks; float32 rounding where the library computes in float32 (grad_output's dtype)
    g, c, s, layout, W = _rotary_inputs({**kw, "x": kw["grad_output"]}, "x")
    D = g.shape[-1]
    h = D // 2
    x = torch.zeros(g.shape, dtype=torch.float64, requires_grad=True)
    if layout == "half":
        if W == h:
            c, s = np.concatenate([c, c], -1), np.concatenate([s, s], -1)
        rot = torch.cat([-x[..., h:], x[..., :h]], -1)
        y = x * t(c) + rot * t(s)
    else:
        ci, si = t(c[..., :h]), t(s[..., :h])
        x0, x1 = x[..., 0::2], x[..., 1::2]
        y = torch.stack([x0 * ci - x1 * si, x1 * ci + x0 * si], -1).reshape(g.shape)
    y.backward(t(g))
    return x.grad.numpy()


target(name="backward.rotary_backward", draw=_draw_rot_bw,
       call=lambda kw: B.rotary_backward(kw["grad_output"], kw["cos"], kw["sin"], kw["layout"]),
       reference=_ref_rot_bw, out_dtype=x_dtype("grad_output"), atol=1e-5,
       args={"grad_output": Arg("array"), **_ROT_ARGS})


def _draw_ce_bw(draw):
    kw = _draw_ce(draw)
    kw["fn"] = draw(st.sampled_from(["cross_entropy_backward", "cross_entropy_with_grad"]))
    kw["grad_output"] = 1.0 if kw["reduction"] != "none" else rng_array(draw, kw["target"].shape, np.float64)
    return kw


def _ref_ce_bw(kw):
    _ref_ce(kw)  # the forward's checks
    x, tg = read(kw["logits"], "logits"), read_ids(kw["target"], "target")
    V = x.shape[-1]
    red, ii = kw["reduction"], kw["ignore_index"]
    go = kw["grad_output"]
    if red == "none":
        go = np.full(tg.shape, go, np.float64) if isinstance(go, (int, float)) and not isinstance(go, bool) \
            else read(go, "grad_output")
        if go.shape != tg.shape:
            raise NoReference("grad_output shape")
    else:
        # the upstream gradient of the reduced loss: any real scalar, NaN / inf included (they propagate
        # as in torch's backward, as a non-finite grad_output array does for "none")
        if isinstance(go, (bool, np.bool_)) or not isinstance(go, (int, float, np.integer, np.floating)):
            raise NoReference(f"grad_output: {type(go).__name__}")
        go = float(go)
    xs = t(x.reshape(-1, V)).requires_grad_(True)
    ts = torch.from_numpy(tg.reshape(-1))
    if np.all(tg == ii):
        grad = np.zeros_like(x)
        loss = np.zeros(tg.shape) if red == "none" else np.float64(0.0)
    else:
        loss_t = torch.nn.functional.cross_entropy(xs, ts, ignore_index=ii, label_smoothing=kw["label_smoothing"],
                                                   reduction=red)
        loss_t.backward(t(go.reshape(-1)) if red == "none" else torch.tensor(go, dtype=torch.float64))
        # ignored rows: 0, as documented (torch's label smoothing gives NaN there for a non-finite logit)
        grad = np.where((tg == ii)[..., None], 0.0, xs.grad.numpy().reshape(x.shape))
        loss = loss_t.detach().numpy().reshape(tg.shape) if red == "none" else loss_t.detach().numpy()
    return grad if kw["fn"] == "cross_entropy_backward" else (loss, grad)


def _ce_bw_dtype(kw):
    """float64 if the logits are, or if grad_output is an array of rows (reduction "none") that is;
    a scalar grad_output is a scale and does not count (backward._cross_entropy_call)."""
    g = kw["grad_output"]
    rows = kw["reduction"] == "none" and not (isinstance(g, numbers.Real) and not isinstance(g, bool))
    return common_dtype(kw["logits"], g if rows else None)


def _call_ce_bw(kw):
    args = dict(ignore_index=kw["ignore_index"], label_smoothing=kw["label_smoothing"], reduction=kw["reduction"],
                grad_output=kw["grad_output"])
    return getattr(B, kw["fn"])(kw["logits"], kw["target"], **args)


target(name="backward.cross_entropy_backward", draw=_draw_ce_bw, call=_call_ce_bw, reference=_ref_ce_bw,
       out_dtype=lambda kw: _ce_bw_dtype(kw) if kw["fn"] == "cross_entropy_backward" else (_ce_bw_dtype(kw),) * 2,
       atol=1e-4, rtol=1e-4,
       args={"logits": Arg("array"), "target": Arg("ids", high=1, floats_as_ids=False),
             "grad_output": Arg("float", optional=False),
             "label_smoothing": Arg("float", low=0.0, high=1.0),
             "reduction": Arg("choice", choices=("mean", "sum", "none"))})


def _draw_sdpa_bw(draw):
    kw = _draw_sdpa(draw)
    for k in ("return_weights", "return_lse", "path"):
        kw.pop(k)
    q, k, v = kw["query"], kw["key"], kw["value"]
    out, lse = F.scaled_dot_product_attention(q, k, v, kw["attn_mask"], query_mask=kw["query_mask"],
                                              key_mask=kw["key_mask"], is_causal=kw["is_causal"], scale=kw["scale"],
                                              causal_alignment=kw["causal_alignment"], return_lse=True)
    kw["out"], kw["lse"] = out, lse
    kw["grad_out"] = rng_array(draw, out.shape, out.dtype)
    return kw


def _ref_sdpa_bw(kw):
    """FlashAttention-2's backward from the GIVEN out and lse, by the library's documented contract
    for the lse it is given (``backward.scaled_dot_product_attention_backward``, read in the
    library's dtype), with X = scale · Q Kᵀ + float mask (-inf where a bool mask / key_mask /
    query_mask / causal hides the key), row by row:

    * ``lse = -inf``: the row sees no key, P = 0;
    * ``|lse|`` ≥ 64 (float32) / 2**16 (float64), finite: the lse is NOT used; the row's max m and
      log-sum c are recomputed from X (the max over its non-NaN scores; m = -inf: P = 0), and
      P = exp((X - m) - c), i.e. the row's exact softmax;
    * otherwise P = exp(X - lse), each capped at 1 (the exponent clamped at 0: a probability; this
      only acts on an lse below the row's max, i.e. one that is not this call's log-sum-exp, e.g.
      one computed for another ``scale``). NaN / inf in the lse or X propagate as IEEE says.

    Then Δ = Σ_d grad_out · out, dS = scale · P ∘ (grad_out Vᵀ - Δ), grad_Q = dS K, grad_K = dSᵀ Q,
    grad_V = Pᵀ grad_out (dense products: 0 · inf in them is NaN, as in the library's GEMMs).

    A row that sees no key (m = -inf, "dead") gets zero grad_Q and adds nothing to grad_K / grad_V
    (documented). The library skips a tile whose rows are all dead, but in a tile shared with live
    rows a dead row's 0 · inf (an inf / NaN in value, grad_out, query or key) is NaN, as in the dense
    products: the documented guarantee is for finite inputs only. So the result is ``(clean, dense,
    units)``: ``clean`` without the dead rows, ``dense`` with them (NaN where a dead row meets a
    non-finite input), ``units`` the atol units of each gradient (``_sdpa_bw_units``);
    ``_cmp_sdpa_bw`` takes a NaN of the result where ``dense`` has one, else ``clean``'s value."""
    q, k, v = read(kw["query"], "query"), read(kw["key"], "key"), read(kw["value"], "value")
    full = {**kw, "return_weights": True, "return_lse": False, "path": "reference"}
    _ref_sdpa(full)  # the forward's checks
    out, go, lse = read(kw["out"], "out"), read(kw["grad_out"], "grad_out"), read(kw["lse"], "lse")
    for a, shape in ((out, q.shape[:-1] + (v.shape[-1],)), (go, q.shape[:-1] + (v.shape[-1],)), (lse, q.shape[:-1])):
        if a.shape != shape:
            raise NoReference("out / grad_out / lse shape")
    dtype = _sdpa_bw_dtype(kw)
    with np.errstate(over="ignore"):  # float64 values beyond float32 become inf, as the library reads them
        q, k, v, go, out, lse = (a.astype(dtype).astype(np.float64) for a in (q, k, v, go, out, lse))
    L, S = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1]) if kw["scale"] is None else float(kw["scale"])
    scale = float(dtype(scale))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        s = np.einsum("...le,...se->...ls", q, k) * scale
        allowed = np.ones(s.shape, bool)
        if kw["attn_mask"] is not None:
            m = read_attn_mask(kw["attn_mask"])
            if m.dtype == np.bool_:
                allowed &= np.broadcast_to(m, s.shape)
            else:
                s = s + np.broadcast_to(m.astype(dtype), s.shape)
        for name, where in (("query_mask", (slice(None), None)), ("key_mask", (None, slice(None)))):
            if kw.get(name) is not None:
                allowed &= np.broadcast_to(read_keep(kw[name], name)[(..., *where)], s.shape)
        if kw["is_causal"]:
            off = 0 if kw["causal_alignment"] == "top_left" else S - L
            allowed &= np.arange(S)[None, :] <= np.arange(L)[:, None] + off
        x = np.where(allowed, s, -np.inf)
        # the row statistics: P = exp((X - m) - c)
        exact = (np.abs(lse) >= (64.0 if dtype == np.float32 else 2.0**16)) & np.isfinite(lse)
        row_max = np.fmax.reduce(x, axis=-1, initial=-np.inf)  # NaN scores are not a max
        row_c = np.log(np.exp(x - np.where(np.isneginf(row_max), 0.0, row_max)[..., None]).sum(-1))
        m = np.where(exact, row_max, lse)
        c = np.where(exact & ~np.isneginf(row_max), row_c, 0.0)
        p = np.where(np.isneginf(m)[..., None], 0.0, np.exp(np.minimum((x - m[..., None]) - c[..., None], 0.0)))
        gv = np.einsum("...ls,...ld->...sd", p, go)
        dp = np.einsum("...ld,...sd->...ls", go, v)
        delta = (go * out).sum(-1, keepdims=True)
        ds = scale * (p * (dp - delta))
        gq = np.einsum("...ls,...se->...le", ds, k)
        dense = (gq, np.einsum("...ls,...le->...se", ds, q), gv)
        dead = np.isneginf(m)[..., None]  # (..., L, 1): rows that see no key
        live = lambda a: np.where(dead, 0.0, a)  # noqa: E731 - a dead row's dS / Q / grad_out: no part
        clean = (live(gq), np.einsum("...ls,...le->...se", live(ds), live(q)),
                 np.einsum("...ls,...ld->...sd", p, live(go)))
    return clean, dense, _sdpa_bw_units(q, k, v, out, go, scale, dtype)


_SDPA_BW_ATOL, _SDPA_BW_RTOL = 2e-4, 1e-3


def _sdpa_bw_units(q, k, v, out, go, scale, dtype):
    """The atol units (1 + float rounding bound / atol) of (grad_Q, grad_K, grad_V), per leading
    slice. dS = scale · P ∘ (grad_out Vᵀ - Δ) is a difference of Ev-term sums that cancel (Δ is
    their P-weighted mean): its rounding, scale · |grad_out| · (|V| + |out|) · Ev · eps, is
    multiplied by |K| (grad_Q, over S keys) and |Q| (grad_K, over L rows), e.g. a key cast to uint32
    (4.3e9) turns a 1-ulp residue into hundreds. Maxima over the finite values: non-finite ones are
    the NaN / inf comparison's business."""
    def mx(a):
        return np.max(np.where(np.isfinite(a), np.abs(a), 0.0), axis=(-2, -1), keepdims=True)

    L, S, Ev = q.shape[-2], k.shape[-2], v.shape[-1]
    eps = float(np.finfo(dtype).eps)
    ds_err = abs(scale) * mx(go) * (mx(v) + mx(out)) * Ev * eps
    return (1 + S * ds_err * mx(k) / _SDPA_BW_ATOL, 1 + L * ds_err * mx(q) / _SDPA_BW_ATOL,
            1 + L * mx(go) * eps / _SDPA_BW_ATOL)


def _cmp_sdpa_bw(result, expected, kw):
    clean, dense, units = expected
    if isinstance(result, (tuple, list)) and len(result) == 3:
        merged = []
        for r, c, d in zip(result, clean, dense):
            r = np.asarray(r)
            if r.shape == c.shape and r.dtype.kind == "f":  # a dead row's NaN (a shared tile) or its absence
                c = np.where(np.isnan(d) & np.isnan(r), np.nan, c)
            merged.append(c)
        clean = tuple(merged)
    return assert_close(result, clean, dtype=(_sdpa_bw_dtype(kw),) * 3, atol=_SDPA_BW_ATOL, rtol=_SDPA_BW_RTOL,
                        loose=kw.get("_loose", False), atol_scale=units)


target(name="backward.scaled_dot_product_attention_backward", draw=_draw_sdpa_bw,
       call=lambda kw: B.scaled_dot_product_attention_backward(
           kw["query"], kw["key"], kw["value"], kw["out"], kw["grad_out"], kw["lse"], kw["attn_mask"],
           query_mask=kw["query_mask"], key_mask=kw["key_mask"], is_causal=kw["is_causal"], scale=kw["scale"],
           causal_alignment=kw["causal_alignment"], enable_gqa=kw["enable_gqa"]),
       reference=_ref_sdpa_bw, compare=_cmp_sdpa_bw, bad_only=("query", "key", "value", "out", "lse", "grad_out"),
       args={"query": Arg("array"), "key": Arg("array"), "value": Arg("array"), "out": Arg("array"),
             "grad_out": Arg("array"), "lse": Arg("array"), "attn_mask": Arg("attn_mask", optional=True),
             "key_mask": Arg("keep_mask", optional=True), "is_causal": Arg("bool"), "enable_gqa": Arg("bool"),
             # scale=None (1/sqrt(E)) is not a layout of a drawn scale here: the lse and out stay those of
             # the drawn scale, so it changes the result (the reference still checks it as a bad value)
             "scale": Arg("float", optional=True, none_is_layout=False),
             "causal_alignment": Arg("choice", choices=("top_left", "bottom_right"))})


def _draw_dropout_bw(draw):
    """dropout_backward's arguments: seed None only with p = 0, as the forward's rule."""
    p = draw(st.sampled_from([0.0, 0.3, 1.0]))
    seeds = st.integers(0, 2**64 - 1)
    if p == 0.0:  # seed=None is valid here, as in the forward: no mask
        seeds = st.none() | seeds
    return {"grad_output": _draw_x(draw, 0), "p": p, "seed": draw(seeds)}


def _ref_dropout_bw(kw):
    g = read(kw["grad_output"], "grad_output")
    p = read_float(kw["p"], "p", 0.0, 1.0)
    if kw["seed"] is None and p > 0:
        raise NoReference("seed: None with p > 0")
    seed = None if kw["seed"] is None else read_int(kw["seed"], "seed", 0, 2**64 - 1)
    # the backward is the forward's mask applied to the gradient: compare with the forward itself
    dtype = lib_dtype(kw["grad_output"])
    return F.dropout(g.astype(dtype), p, seed).astype(np.float64)


target(name="backward.dropout_backward", draw=_draw_dropout_bw,
       call=lambda kw: B.dropout_backward(kw["grad_output"], kw["p"], kw["seed"]), reference=_ref_dropout_bw,
       out_dtype=x_dtype("grad_output"),
       args={"grad_output": Arg("array"), "p": Arg("float", low=0.0, high=1.0),
             "seed": Arg("int", low=0, high=2**64 - 1)})


# ------------------------------------------------------------------------------------------------
# quantization
# ------------------------------------------------------------------------------------------------
Q = tc.quantization


def _ref_quantize(w):
    amax = np.abs(w).max(axis=1)
    scales = (amax / 127).astype(np.float32)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1).astype(np.float32), 0).astype(np.float32)
    q = np.rint(np.clip(w.astype(np.float32) * inv[:, None], -127, 127)).astype(np.int8)
    return q, scales


def _draw_int8(draw):
    o, i = dims(draw, 2, 1, 9)
    w = rng_array(draw, (o, i))
    q, s = Q.quantize_int8(w)
    lead = dims(draw, draw(st.integers(1, 2)), 1, 4)
    return {"x": rng_array(draw, lead + (i,), draw(DTYPES)), "qweight": q, "scales": s,
            "bias": draw(st.one_of(st.none(), st.just(rng_array(draw, (o,)))))}


def _ref_linear_int8(kw):
    q = kw["qweight"]
    if not isinstance(q, np.ndarray) or q.dtype != np.int8 or q.ndim != 2 or q.size == 0:
        raise NoReference("qweight")
    x = read(kw["x"], "x").astype(np.float32)
    s = read(kw["scales"], "scales").astype(np.float32)
    if x.ndim < 1 or x.shape[-1] != q.shape[1] or s.shape != (q.shape[0],):
        raise NoReference("shapes")
    b = None if kw["bias"] is None else read(kw["bias"], "bias").astype(np.float32)
    if b is not None and b.shape != (q.shape[0],):
        raise NoReference("bias")
    x2 = x.reshape(-1, x.shape[-1])
    # documented: "a row of x holding NaN or inf gives a row of NaN" (float32: 1e300 is inf there)
    finite = np.isfinite(x2).all(-1)
    xq, sx = _ref_quantize(np.where(finite[:, None], x2, 0).astype(np.float32))
    acc = (xq.astype(np.int64) @ q.astype(np.int64).T).astype(np.float32)
    y = acc * (sx[:, None] * s[None, :])
    if b is not None:
        y = y + b
    y = np.where(finite[:, None], y, np.nan)
    return y.reshape(x.shape[:-1] + (q.shape[0],))


target(name="quantization.linear_int8", draw=_draw_int8,
       call=lambda kw: Q.linear_int8(kw["x"], kw["qweight"], kw["scales"], kw["bias"]), reference=_ref_linear_int8,
       out_dtype=lambda kw: np.float32, atol=1e-5, rtol=1e-5,
       args={"x": Arg("array"), "qweight": Arg("custom", bad=[("float", np.ones((2, 2))), ("None", None),
                                                              ("1d", np.ones(3, np.int8)),
                                                              ("uint8", np.ones((2, 2), np.uint8))]),
             "scales": Arg("array"), "bias": Arg("array", optional=True)})


def _ref_quantize_int8(kw):
    w = read(kw["weight"], "weight")
    if w.ndim != 2 or not np.isfinite(w).all():
        raise NoReference("weight")
    return _ref_quantize(w.astype(np.float32))


target(name="quantization.quantize_int8", draw=lambda d: {"weight": rng_array(d, dims(d, 2, 1, 9), d(DTYPES))},
       call=lambda kw: Q.quantize_int8(kw["weight"]), reference=_ref_quantize_int8,
       out_dtype=lambda kw: (np.int8, np.float32), args={"weight": Arg("array")})


def _draw_gguf(draw):
    from gguf import GGMLQuantizationType, quants

    name = draw(st.sampled_from(["Q8_0", "Q4_0", "Q4_1"]))
    rows, cols = draw(st.integers(1, 4)), 32 * draw(st.integers(1, 3))
    w = rng_array(draw, (rows, cols))
    blocks = quants.quantize(w, getattr(GGMLQuantizationType, name))
    fn = draw(st.sampled_from(["dequantize", "linear"]))
    kw = {"fn": fn, "blocks": np.ascontiguousarray(blocks).reshape(-1), "ggml_type": name, "rows": rows, "cols": cols}
    if fn == "linear":
        kw["x"] = rng_array(draw, (draw(st.integers(1, 3)), cols), draw(DTYPES))
        kw["bias"] = draw(st.one_of(st.none(), st.just(rng_array(draw, (rows,)))))
        kw["quantize_activations"] = False
    return kw


def _ref_gguf(kw):
    from gguf import GGMLQuantizationType, quants

    name = read_choice(kw["ggml_type"], "ggml_type", ("Q8_0", "Q4_0", "Q4_1"))
    rows, cols = read_int(kw["rows"], "rows", 1), read_int(kw["cols"], "cols", 1)
    if cols % 32:
        raise NoReference("cols")
    b = kw["blocks"]
    if not isinstance(b, (np.ndarray, bytes, bytearray)) or (isinstance(b, np.ndarray) and b.dtype != np.uint8):
        raise NoReference("blocks")
    raw = np.frombuffer(bytes(b) if not isinstance(b, np.ndarray) else b.tobytes(), np.uint8)
    size = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}[name]
    if raw.size != rows * cols // 32 * size:
        raise NoReference("byte count")
    w = quants.dequantize(raw.reshape(rows, -1), getattr(GGMLQuantizationType, name)).astype(np.float32)
    if kw["fn"] == "dequantize":
        return w
    x = read(kw["x"], "x").astype(np.float32).astype(np.float64)
    if x.ndim < 1 or x.shape[-1] != cols:
        raise NoReference("x")
    y = x @ w.astype(np.float64).T
    if kw["bias"] is not None:
        bb = read(kw["bias"], "bias")
        if bb.shape != (rows,):
            raise NoReference("bias")
        y = y + bb.astype(np.float32)
    return y


def _call_gguf(kw):
    if kw["fn"] == "dequantize":
        return Q.dequantize_gguf(kw["blocks"], kw["ggml_type"], kw["rows"], kw["cols"])
    return Q.linear_gguf(kw["x"], kw["blocks"], kw["ggml_type"], kw["rows"], kw["cols"], kw["bias"],
                         quantize_activations=kw["quantize_activations"])


target(name="quantization.gguf_blocks", draw=_draw_gguf, call=_call_gguf, reference=_ref_gguf,
       out_dtype=lambda kw: np.float32, atol=1e-4, rtol=1e-4,
       args={"blocks": Arg("custom", bad=[("float", np.ones(34)), ("None", None), ("short", np.zeros(3, np.uint8)),
                                          ("str", "blocks")]),
             "ggml_type": Arg("choice", choices=("Q8_0", "Q4_0", "Q4_1")), "rows": Arg("size", aliases=("out_features", "blocks")),
             "cols": Arg("size", bad=[("not32", 31)], aliases=("in_features", "blocks")), "x": Arg("array", optional=False),
             "bias": Arg("array", optional=True), "quantize_activations": Arg("bool")})


def _ref_q8(kw):
    x = read(kw["x"], "x").astype(np.float32)
    if x.ndim < 1 or x.shape[-1] % 32:
        raise NoReference("cols")
    blocks = x.reshape(x.shape[:-1] + (-1, 32))
    amax = np.abs(blocks).max(-1)
    d = (amax / 127).astype(np.float32)
    inv = np.where(d > 0, 1 / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.rint(blocks * inv[..., None]).astype(np.int8).reshape(x.shape)
    return q, d


def _cmp_q8(result, expected, kw):
    q, d = result
    eq, ed = expected
    if q.dtype != np.int8 or d.dtype != np.float32 or q.shape != eq.shape or d.shape != ed.shape:
        return f"dtypes/shapes {q.dtype} {q.shape} {d.dtype} {d.shape}"
    x = read(kw["x"], "x").astype(np.float32)
    finite = np.isfinite(x.reshape(x.shape[:-1] + (-1, 32))).all(-1)
    if not np.allclose(d[finite], ed[finite], rtol=1e-6):
        return "scales differ"
    if not finite.all():
        return None  # blocks holding NaN / inf: their values are not specified
    rec = q.reshape(x.shape[:-1] + (-1, 32)) * d[..., None]
    err = np.abs(rec.reshape(x.shape) - x)
    return None if np.all(err <= np.repeat(d, 32, -1) * 0.5 + 1e-6) else "blocks do not reconstruct x"


target(name="quantization.quantize_q8_blocks",
       draw=lambda d: {"x": rng_array(d, dims(d, d(st.integers(0, 2)), 1, 3) + (32 * d(st.integers(1, 2)),),
                                      d(DTYPES))},
       call=lambda kw: Q.quantize_q8_blocks(kw["x"]), reference=_ref_q8, compare=_cmp_q8, args={"x": Arg("array")})


# ------------------------------------------------------------------------------------------------
# multihead_forms: weight conversions; round trips must give the weights back
# ------------------------------------------------------------------------------------------------
MF = tc.multihead_forms


def _draw_forms(draw):
    H = draw(st.integers(1, 3))
    d = draw(st.integers(1, 3))
    E = H * d
    dt = draw(DTYPES)
    fn = draw(st.sampled_from(["per_head", "split_heads", "einsum_shared"]))
    if fn == "einsum_shared":  # the einsum tutorial's module: one (d, d) block per projection
        state = {"queries.weight": rng_array(draw, (d, d), dt), "keys.weight": rng_array(draw, (d, d), dt),
                 "values.weight": rng_array(draw, (d, d), dt), "fc_out.weight": rng_array(draw, (E, E), dt),
                 "fc_out.bias": rng_array(draw, (E,), dt)}
    else:
        state = {"in_proj_weight": rng_array(draw, (3 * E, E), dt), "in_proj_bias": rng_array(draw, (3 * E,), dt),
                 "out_proj.weight": rng_array(draw, (E, E), dt), "out_proj.bias": rng_array(draw, (E,), dt)}
    kw = {"fn": fn, "state": state, "num_heads": H}
    if fn == "split_heads":
        kw["naming"] = draw(st.sampled_from(["W_q", "q_linear"]))
    return kw


def _call_forms(kw):
    fn, s, H = kw["fn"], kw["state"], kw["num_heads"]
    if fn == "per_head":  # ours -> per head -> ours
        return MF.from_per_head(MF.to_per_head(s, H))
    if fn == "split_heads":
        return MF.from_split_heads(MF.to_split_heads(s, kw["naming"]))
    return MF.to_einsum_shared(MF.from_einsum_shared(s, H), H)  # einsum -> ours -> einsum


_OURS = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}
_EINSUM = {"queries.weight", "keys.weight", "values.weight", "fc_out.weight", "fc_out.bias"}


def _ref_forms(kw):
    s = kw["state"]
    if not isinstance(s, dict):
        raise NoReference("state")
    if kw["fn"] == "split_heads":
        read_choice(kw["naming"], "naming", ("W_q", "q_linear"))
        H = 1  # the split-heads form does not depend on the heads
    else:
        H = read_int(kw["num_heads"], "num_heads", 1)
    out = {k: read(v, k) for k, v in s.items()}
    if kw["fn"] == "einsum_shared":
        if set(out) != _EINSUM:
            raise NoReference("keys")
        E = out["fc_out.weight"].shape[0] if out["fc_out.weight"].ndim == 2 else -1
        d = E // H if E > 0 and E % H == 0 else -1
        if out["fc_out.weight"].shape != (E, E) or out["fc_out.bias"].shape != (E,) or \
                any(out[f"{n}.weight"].shape != (d, d) for n in ("queries", "keys", "values")):
            raise NoReference("shapes")
        return out
    E = out["out_proj.weight"].shape[0] if out.get("out_proj.weight", np.zeros(0)).ndim == 2 else 0
    if set(out) != _OURS or out["in_proj_weight"].shape != (3 * E, E) or out["in_proj_bias"].shape != (3 * E,) or \
            out["out_proj.weight"].shape != (E, E) or out["out_proj.bias"].shape != (E,) or E % H:
        raise NoReference("state")
    return out


def _forms_dtype(kw):
    first = next(iter(kw["state"].values())) if isinstance(kw["state"], dict) and kw["state"] else None
    return lib_dtype(first)


_BAD_STATES = [("None", None), ("list", [1]), ("missing", {"in_proj_weight": np.ones((3, 1))}),
               ("complex", {k: np.ones((3, 1) if k == "in_proj_weight" else (3,) if k == "in_proj_bias" else
                                       (1, 1) if k == "out_proj.weight" else (1,), np.complex64) for k in _OURS}),
               ("bool", {k: np.ones((3, 1) if k == "in_proj_weight" else (3,) if k == "in_proj_bias" else
                                    (1, 1) if k == "out_proj.weight" else (1,), bool) for k in _OURS}),
               ("shape", {"in_proj_weight": np.ones((4, 1)), "in_proj_bias": np.ones(3),
                          "out_proj.weight": np.ones((1, 1)), "out_proj.bias": np.ones(1)}),
               ("ragged", {"in_proj_weight": [[1.0], [2.0, 3.0]], "in_proj_bias": np.ones(3),
                           "out_proj.weight": np.ones((1, 1)), "out_proj.bias": np.ones(1)})]
target(name="multihead_forms", draw=_draw_forms, call=_call_forms, reference=_ref_forms,
       out_dtype=_forms_dtype,
       args={"state": Arg("custom", bad=_BAD_STATES), "num_heads": Arg("size", bad=[("not_divisor", 7)]),
             "naming": Arg("choice", choices=("W_q", "q_linear"))})
