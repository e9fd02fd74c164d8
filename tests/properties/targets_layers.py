"""Property targets of the layers: every class of transformer_core.nn (constructor, load_state_dict
and forward), the positional classes, KVCache and the thread count. Each call builds the layer,
loads a drawn state dict and runs forward; the reference is numpy / torch in float64 on the same
weights (masks in the library's convention: True = may attend; a row that sees nothing gives zeros)."""

from __future__ import annotations

import math

import numpy as np
import torch
import transformer_core as tc
from hypothesis import strategies as st

from .harness import Arg, NoReference, Target
from .refs import (
    DTYPES,
    as_dtype,
    attention,
    dims,
    layer_norm,
    read,
    read_attn_mask,
    read_bool,
    read_choice,
    read_float,
    read_ids,
    read_int,
    read_keep,
    rng_array,
    t,
)

nn = tc.nn
TARGETS: list[Target] = []
ACTS = {"relu": lambda x: np.maximum(x, 0), "gelu": lambda x: torch.nn.functional.gelu(t(x)).numpy(),
        "silu": lambda x: x / (1 + np.exp(-x)), "gelu_tanh": lambda x: torch.nn.functional.gelu(
            t(x), approximate="tanh").numpy(), "tanh": np.tanh}


def target(**kw):
    TARGETS.append(Target(**kw))


def layer_dtype(kw):
    try:
        return np.float64 if as_dtype(kw["dtype"]).itemsize == 8 else np.float32
    except TypeError:
        return None


def read_dtype(v):
    try:
        dt = as_dtype(v)
    except TypeError:
        raise NoReference("dtype") from None
    if dt.kind != "f" or dt.itemsize not in (4, 8):
        raise NoReference("dtype")
    return np.float64 if dt.itemsize == 8 else np.float32


def as_layer(x, dtype):
    """An input as the layer reads it: cast to the layer's dtype (float64 for the reference)."""
    return x.astype(dtype).astype(np.float64)


def state_of(kw):
    return {k: read(v, k) for k, v in kw["state"].items()}


LN = layer_norm  # float64 and overflow-safe, as the library (refs.layer_norm_t)


# ------------------------------------------------------------------------------------------------
# Linear, Embedding, LayerNorm, RMSNorm, FeedForward, GatedFeedForward
# ------------------------------------------------------------------------------------------------
def _draw_linear(draw):
    dt = draw(DTYPES)
    i, o = dims(draw, 2, 1, 8)
    bias = draw(st.booleans())
    state = {"weight": rng_array(draw, (o, i))}
    if bias:
        state["bias"] = rng_array(draw, (o,))
    return {"in_features": i, "out_features": o, "bias": bias, "dtype": dt, "state": state,
            "x": rng_array(draw, dims(draw, draw(st.integers(0, 2)), 1, 4) + (i,), dt)}


def _call_linear(kw):
    m = nn.Linear(kw["in_features"], kw["out_features"], kw["bias"], dtype=kw["dtype"])
    m.load_state_dict(kw["state"])
    return m(kw["x"])


def _ref_linear(kw):
    dt = read_dtype(kw["dtype"])
    i, o = read_int(kw["in_features"], "in_features", 1, 64), read_int(kw["out_features"], "out_features", 1, 64)
    bias = read_bool(kw["bias"], "bias")
    s = state_of(kw)
    if set(s) != ({"weight", "bias"} if bias else {"weight"}) or s["weight"].shape != (o, i) or \
            (bias and s["bias"].shape != (o,)):
        raise NoReference("state")
    x = as_layer(read(kw["x"]), dt)
    if x.ndim < 1 or x.shape[-1] != i:
        raise NoReference("x")
    w = as_layer(s["weight"], dt)
    return x @ w.T + (as_layer(s["bias"], dt) if bias else 0)


_STATE_BAD = [("None", None), ("list", [1]), ("int_weight", {"weight": np.ones((2, 2), np.int8)}),
              ("bool_weight", {"weight": np.ones((2, 2), bool)}), ("str", "weights"),
              ("ragged", {"weight": [[1.0], [1.0, 2.0]]})]


def _state_arg():
    try:
        bf16 = ("torch_bf16", None)
        bad = list(_STATE_BAD)
        bad.append(bf16)
    except Exception:  # pragma: no cover
        bad = list(_STATE_BAD)
    return Arg("custom", bad=[b for b in bad if b[1] is not None or b[0] == "None"],
               aliases=("state_dict", "weight", "state_dict['weight']"))


target(name="nn.Linear", draw=_draw_linear, call=_call_linear, reference=_ref_linear, out_dtype=layer_dtype,
       args={"in_features": Arg("size"), "out_features": Arg("size"), "bias": Arg("bool"), "dtype": Arg("dtype"),
             "x": Arg("array"), "state": _state_arg()})


def _draw_state_dtypes(draw):
    """A Linear whose checkpoint comes in torch bfloat16 / float16 or numpy float16: converted."""
    kw = _draw_linear(draw)
    kind = draw(st.sampled_from(["torch_bf16", "torch_f16", "np_f16", "torch_f64"]))
    conv = {"torch_bf16": lambda a: torch.from_numpy(a).to(torch.bfloat16),
            "torch_f16": lambda a: torch.from_numpy(a).to(torch.float16),
            "np_f16": lambda a: a.astype(np.float16), "torch_f64": lambda a: torch.from_numpy(a.astype(np.float64))}
    kw["state"] = {k: conv[kind](v) for k, v in kw["state"].items()}
    return kw


target(name="nn.Module.load_state_dict[bf16,fp16]", draw=_draw_state_dtypes, call=_call_linear,
       reference=_ref_linear, out_dtype=layer_dtype, weight=0.5,
       args={"x": Arg("array"), "state": _state_arg()})


def _draw_embedding(draw):
    V, H = draw(st.integers(1, 9)), draw(st.integers(1, 5))
    shape = dims(draw, draw(st.integers(1, 2)), 1, 4)
    ids = np.asarray(draw(st.lists(st.integers(0, V - 1), min_size=int(np.prod(shape)),
                                   max_size=int(np.prod(shape))))).reshape(shape)
    return {"num_embeddings": V, "embedding_dim": H, "dtype": draw(DTYPES), "state": {"weight": rng_array(draw, (V, H))},
            "input_ids": ids}


def _call_embedding(kw):
    m = nn.Embedding(kw["num_embeddings"], kw["embedding_dim"], dtype=kw["dtype"])
    m.load_state_dict(kw["state"])
    return m(kw["input_ids"])


def _ref_embedding(kw):
    dt = read_dtype(kw["dtype"])
    V, H = read_int(kw["num_embeddings"], "num_embeddings", 1, 64), read_int(kw["embedding_dim"], "embedding_dim", 1, 64)
    s = state_of(kw)
    if set(s) != {"weight"} or s["weight"].shape != (V, H):
        raise NoReference("state")
    ids = read_ids(kw["input_ids"], "input_ids", V)
    return as_layer(s["weight"], dt)[ids]


target(name="nn.Embedding", draw=_draw_embedding, call=_call_embedding, reference=_ref_embedding,
       out_dtype=layer_dtype,
       args={"num_embeddings": Arg("size"), "embedding_dim": Arg("size"), "dtype": Arg("dtype"),
             "input_ids": Arg("ids", high=1), "state": _state_arg()})


def _draw_norm(draw, kind):
    E = draw(st.integers(1, 8))
    dt = draw(DTYPES)
    kw = {"kind": kind, "normalized_shape": draw(st.sampled_from([E, (E,), [E]])), "dtype": dt,
          "eps": draw(st.sampled_from([1e-5, 1e-6, 0.1])), "x": rng_array(draw, dims(draw, draw(st.integers(0, 2)), 1, 4)
                                                                          + (E,), dt)}
    state = {"weight": rng_array(draw, (E,))}
    if kind == "LayerNorm":
        kw["bias"] = draw(st.booleans())
        if kw["bias"]:
            state["bias"] = rng_array(draw, (E,))
    kw["state"] = state
    return kw


def _call_norm(kw):
    if kw["kind"] == "LayerNorm":
        m = nn.LayerNorm(kw["normalized_shape"], kw["eps"], bias=kw["bias"], dtype=kw["dtype"])
    else:
        m = nn.RMSNorm(kw["normalized_shape"], kw["eps"], dtype=kw["dtype"])
    m.load_state_dict(kw["state"])
    return m(kw["x"])


def _ref_norm(kw):
    dt = read_dtype(kw["dtype"])
    ns = kw["normalized_shape"]
    if isinstance(ns, (tuple, list)):
        if len(ns) != 1:
            raise NoReference("normalized_shape")
        ns = ns[0]
    E = read_int(ns, "normalized_shape", 1, 64)
    if kw["eps"] is None and kw["kind"] == "RMSNorm":  # torch's RMSNorm: None = the dtype's machine epsilon
        eps = float(np.finfo(dt).eps)
    else:
        eps = read_float(kw["eps"], "eps", 0.0)
    s = state_of(kw)
    x = as_layer(read(kw["x"]), dt)
    if x.ndim < 1 or x.shape[-1] != E or any(v.shape != (E,) for v in s.values()):
        raise NoReference("shapes")
    w = as_layer(s["weight"], dt)
    if kw["kind"] == "LayerNorm":
        bias = read_bool(kw["bias"], "bias")
        if set(s) != ({"weight", "bias"} if bias else {"weight"}):
            raise NoReference("state")
        return LN(x, w, as_layer(s["bias"], dt) if bias else None, eps)
    if set(s) != {"weight"}:
        raise NoReference("state")
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


# normalized_shape=[1] (a generic bad int) is a valid shape: with the drawn (E,) checkpoint it is a
# shape mismatch, which load_state_dict reports by the checkpoint entry (as softmax's x -> axis)
_NORM_ARGS = {"normalized_shape": Arg("size", bad=[("tuple2", (2, 3)), ("empty_tuple", ())],
                                      aliases=("weight", "bias")),
              "dtype": Arg("dtype"), "eps": Arg("float", low=0.0), "x": Arg("array"), "state": _state_arg()}
target(name="nn.LayerNorm", draw=lambda d: _draw_norm(d, "LayerNorm"), call=_call_norm, reference=_ref_norm,
       out_dtype=layer_dtype, atol=1e-4, rtol=1e-4, args={**_NORM_ARGS, "bias": Arg("bool")})
target(name="nn.RMSNorm", draw=lambda d: _draw_norm(d, "RMSNorm"), call=_call_norm, reference=_ref_norm,
       out_dtype=layer_dtype, atol=1e-4, rtol=1e-4, args={**_NORM_ARGS, "eps": Arg("float", low=0.0, optional=True)})


def _draw_ff(draw, gated):
    E, Fd = draw(st.integers(1, 6)), draw(st.integers(1, 8))
    dt = draw(DTYPES)
    bias = draw(st.booleans())
    act = draw(st.sampled_from(["relu", "gelu", "silu", "gelu_tanh"]))
    if gated:
        state = {"gate_proj.weight": rng_array(draw, (Fd, E)), "up_proj.weight": rng_array(draw, (Fd, E)),
                 "down_proj.weight": rng_array(draw, (E, Fd))}
        if bias:
            state.update({"gate_proj.bias": rng_array(draw, (Fd,)), "up_proj.bias": rng_array(draw, (Fd,)),
                          "down_proj.bias": rng_array(draw, (E,))})
    else:
        state = {"linear1.weight": rng_array(draw, (Fd, E)), "linear2.weight": rng_array(draw, (E, Fd))}
        if bias:
            state.update({"linear1.bias": rng_array(draw, (Fd,)), "linear2.bias": rng_array(draw, (E,))})
    return {"gated": gated, "d_model": E, "dim_feedforward": Fd, "activation": act, "bias": bias, "dtype": dt,
            "state": state, "x": rng_array(draw, dims(draw, draw(st.integers(0, 2)), 1, 4) + (E,), dt)}


def _call_ff(kw):
    cls = nn.GatedFeedForward if kw["gated"] else nn.FeedForward
    m = cls(kw["d_model"], kw["dim_feedforward"], kw["activation"], kw["bias"], dtype=kw["dtype"])
    m.load_state_dict(kw["state"])
    return m(kw["x"])


def _ref_ff(kw):
    dt = read_dtype(kw["dtype"])
    E, Fd = read_int(kw["d_model"], "d_model", 1, 64), read_int(kw["dim_feedforward"], "dim_feedforward", 1, 64)
    act = kw["activation"]
    if not isinstance(act, str) or act not in ACTS:
        raise NoReference("activation")
    bias = read_bool(kw["bias"], "bias")
    s = {k: as_layer(v, dt) for k, v in state_of(kw).items()}
    x = as_layer(read(kw["x"]), dt)
    if x.ndim < 1 or x.shape[-1] != E:
        raise NoReference("x")
    names = ("gate_proj", "up_proj", "down_proj") if kw["gated"] else ("linear1", "linear2")
    shapes = {"gate_proj": (Fd, E), "up_proj": (Fd, E), "down_proj": (E, Fd), "linear1": (Fd, E), "linear2": (E, Fd)}
    want = {f"{n}.weight" for n in names} | ({f"{n}.bias" for n in names} if bias else set())
    if set(s) != want or any(s[f"{n}.weight"].shape != shapes[n] for n in names) or \
            (bias and any(s[f"{n}.bias"].shape != (shapes[n][0],) for n in names)):
        raise NoReference("state")
    lin = lambda n, a: a @ s[f"{n}.weight"].T + (s[f"{n}.bias"] if bias else 0)  # noqa: E731
    if kw["gated"]:
        return lin("down_proj", ACTS[act](lin("gate_proj", x)) * lin("up_proj", x))
    return lin("linear2", ACTS[act](lin("linear1", x)))


_FF_ARGS = {"d_model": Arg("size"), "dim_feedforward": Arg("size"), "activation": Arg("choice", choices=("relu",)),
            "bias": Arg("bool"), "dtype": Arg("dtype"), "x": Arg("array"), "state": _state_arg()}
target(name="nn.FeedForward", draw=lambda d: _draw_ff(d, False), call=_call_ff, reference=_ref_ff,
       out_dtype=layer_dtype, atol=1e-4, rtol=1e-4, args=_FF_ARGS)
target(name="nn.GatedFeedForward", draw=lambda d: _draw_ff(d, True), call=_call_ff, reference=_ref_ff,
       out_dtype=layer_dtype, atol=1e-4, rtol=1e-4, args=_FF_ARGS)


# ------------------------------------------------------------------------------------------------
# MultiheadAttention (GQA, kdim/vdim, masks, weights)
# ------------------------------------------------------------------------------------------------
def _mha_state(draw, E, H, Hkv, kdim, vdim, bias):
    D = E // H
    Ekv = Hkv * D
    if kdim == E and vdim == E:
        state = {"in_proj_weight": rng_array(draw, (E + 2 * Ekv, E))}
    else:
        state = {"q_proj_weight": rng_array(draw, (E, E)), "k_proj_weight": rng_array(draw, (Ekv, kdim)),
                 "v_proj_weight": rng_array(draw, (Ekv, vdim))}
    state["out_proj.weight"] = rng_array(draw, (E, E))
    if bias:
        state["in_proj_bias"] = rng_array(draw, (E + 2 * Ekv,))
        state["out_proj.bias"] = rng_array(draw, (E,))
    return state


def _draw_mha(draw):
    H = draw(st.integers(1, 3))
    Hkv = draw(st.sampled_from([h for h in range(1, H + 1) if H % h == 0]))
    E = H * draw(st.integers(1, 3))
    self_attn = draw(st.booleans())
    kdim = vdim = E
    if not self_attn and draw(st.booleans()):
        kdim, vdim = dims(draw, 2, 1, 5)
    bias = draw(st.booleans())
    dt = draw(DTYPES)
    N, L = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    S = L if self_attn else draw(st.integers(1, 5))
    kw = {"embed_dim": E, "num_heads": H, "bias": bias, "num_key_value_heads": Hkv, "kdim": None if kdim == E else kdim,
          "vdim": None if vdim == E else vdim, "dtype": dt, "state": _mha_state(draw, E, H, Hkv, kdim, vdim, bias),
          "query": rng_array(draw, (N, L, E), dt), "key": None, "value": None, "attn_mask": None, "key_mask": None,
          "is_causal": draw(st.booleans()), "need_weights": draw(st.booleans()),
          "average_attn_weights": draw(st.booleans()), "path": draw(st.sampled_from(["auto", "flash", "reference"]))}
    if not self_attn:
        kw["key"] = rng_array(draw, (N, S, kdim), dt)
        kw["value"] = rng_array(draw, (N, S, vdim), dt)
    # attn_mask keeps torch's name and so takes float masks only: bool patterns go in as 0 / -inf
    # (masks.to_additive); a raw bool one is a bad value (TORCH_NAMED_MASK below)
    m = draw(st.sampled_from(["none", "additive2", "float2", "additive3", "key"]))
    if m == "additive2":
        kw["attn_mask"] = _additive(rng_array(draw, (L, S)) > -0.3, dt)
    elif m == "float2":
        kw["attn_mask"] = rng_array(draw, (L, S)).astype(dt)
    elif m == "additive3":
        kw["attn_mask"] = _additive(rng_array(draw, (N * H, L, S)) > -0.3, dt)
    elif m == "key":
        kw["key_mask"] = rng_array(draw, (N, S)) > -0.3
    return kw


#: torch's nn-layer mask names take float masks only; any bool mask (whatever its shape) is refused.
TORCH_NAMED_MASK = [("bool_mask", np.ones((1, 1), bool)), ("bool_mask_LS", np.ones((3, 3), bool))]


def _additive(allowed, dt):
    """A bool pattern (True = may attend) as the float mask the layers take: 0 / -inf."""
    return np.where(allowed, 0.0, -np.inf).astype(dt)


def _call_mha(kw):
    m = nn.MultiheadAttention(kw["embed_dim"], kw["num_heads"], kw["bias"],
                              num_key_value_heads=kw["num_key_value_heads"], kdim=kw["kdim"], vdim=kw["vdim"],
                              dtype=kw["dtype"])
    m.load_state_dict(kw["state"])
    return m(kw["query"], kw["key"], kw["value"], attn_mask=kw["attn_mask"], key_mask=kw["key_mask"],
             is_causal=kw["is_causal"], need_weights=kw["need_weights"],
             average_attn_weights=kw["average_attn_weights"], path=kw["path"])


def mha_reference(q_in, k_in, v_in, s, E, H, Hkv, bool_mask=None, float_mask=None, key_mask=None, is_causal=False,
                  prefix=""):
    """(output (N, L, E), weights (N, H, L, S)) of torch's MHA in the library's mask convention."""
    D = E // H
    Ekv = Hkv * D
    g = lambda n: s.get(prefix + n)  # noqa: E731
    if g("in_proj_weight") is not None:
        wq, wk, wv = np.split(g("in_proj_weight"), [E, E + Ekv])
    else:
        wq, wk, wv = g("q_proj_weight"), g("k_proj_weight"), g("v_proj_weight")
    b = g("in_proj_bias")
    bq, bk, bv = (np.split(b, [E, E + Ekv]) if b is not None else (0, 0, 0))
    N, L, _ = q_in.shape
    S = k_in.shape[1]
    q = (q_in @ wq.T + bq).reshape(N, L, H, D).transpose(0, 2, 1, 3)
    k = (k_in @ wk.T + bk).reshape(N, S, Hkv, D).transpose(0, 2, 1, 3)
    v = (v_in @ wv.T + bv).reshape(N, S, Hkv, D).transpose(0, 2, 1, 3)
    k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)
    bm = bool_mask
    if key_mask is not None:
        km = key_mask[:, None, None, :]
        bm = km if bm is None else (bm & km)
    out, w = attention(q, k, v, bm, float_mask, is_causal, 0, None, weights=True)
    out = out.transpose(0, 2, 1, 3).reshape(N, L, E)
    ob = g("out_proj.bias")
    return out @ g("out_proj.weight").T + (0 if ob is None else ob), w


def layer_masks(kw_mask, kw_key_mask, N, H, L, S, dt, mask_name="attn_mask", key_name="key_mask"):
    """The nn layers' masks: the attention mask under torch's name is float only (a bool one is
    refused: torch reads it as True = blocked), the key mask bool/0-1 True = a real token."""
    bool_mask = float_mask = key_mask = None
    if kw_mask is not None:
        m = read_attn_mask(kw_mask, mask_name)
        if m.dtype == np.bool_:
            raise NoReference(f"{mask_name}: bool")
        if m.ndim == 2:
            if m.shape != (L, S):
                raise NoReference(mask_name)
        elif m.ndim == 3:
            if m.shape != (N * H, L, S):
                raise NoReference(mask_name)
            m = m.reshape(N, H, L, S)
        elif m.ndim != 4:
            raise NoReference(mask_name)
        try:
            np.broadcast_to(m, (N, H, L, S))
        except ValueError:
            raise NoReference(mask_name) from None
        if m.dtype == np.bool_:
            bool_mask = m
        else:
            float_mask = as_layer(m, dt)
    if kw_key_mask is not None:
        key_mask = read_keep(kw_key_mask, key_name)
        if key_mask.shape != (N, S):
            raise NoReference(key_name)
    return bool_mask, float_mask, key_mask


def _ref_mha(kw):
    dt = read_dtype(kw["dtype"])
    E, H = read_int(kw["embed_dim"], "embed_dim", 1, 64), read_int(kw["num_heads"], "num_heads", 1, 64)
    Hkv = H if kw["num_key_value_heads"] is None else read_int(kw["num_key_value_heads"], "num_key_value_heads", 1, 64)
    kdim = E if kw["kdim"] is None else read_int(kw["kdim"], "kdim", 1, 64)
    vdim = E if kw["vdim"] is None else read_int(kw["vdim"], "vdim", 1, 64)
    if E % H or H % Hkv:
        raise NoReference("heads")
    bias = read_bool(kw["bias"], "bias")
    for name in ("is_causal", "need_weights", "average_attn_weights"):
        read_bool(kw[name], name)
    read_choice(kw["path"], "path", ("auto", "flash", "reference"))
    s = {k: as_layer(v, dt) for k, v in state_of(kw).items()}
    D = E // H
    Ekv = Hkv * D
    packed = kdim == E and vdim == E
    shapes = ({"in_proj_weight": (E + 2 * Ekv, E)} if packed else
              {"q_proj_weight": (E, E), "k_proj_weight": (Ekv, kdim), "v_proj_weight": (Ekv, vdim)})
    shapes["out_proj.weight"] = (E, E)
    if bias:
        shapes.update({"in_proj_bias": (E + 2 * Ekv,), "out_proj.bias": (E,)})
    if packed and "in_proj_weight" not in s and all(f"{x}_proj_weight" in s for x in "qkv"):
        s["in_proj_weight"] = np.concatenate([s.pop(f"{x}_proj_weight") for x in "qkv"])
    if set(s) != set(shapes) or any(s[k].shape != v for k, v in shapes.items()):
        raise NoReference("state")
    q = as_layer(read(kw["query"], "query"), dt)
    k = q if kw["key"] is None else as_layer(read(kw["key"], "key"), dt)
    v = k if kw["value"] is None else as_layer(read(kw["value"], "value"), dt)
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or q.shape[2] != E or k.shape[0] != q.shape[0] or \
            v.shape[0] != q.shape[0] or k.shape[2] != kdim or v.shape[2] != vdim or v.shape[1] != k.shape[1]:
        raise NoReference("shapes")
    N, L, _ = q.shape
    S = k.shape[1]
    bm, fm, km = layer_masks(kw["attn_mask"], kw["key_mask"], N, H, L, S, dt)
    out, w = mha_reference(q, k, v, s, E, H, Hkv, bm, fm, km, kw["is_causal"])
    if not kw["need_weights"]:
        return out, None
    return out, (w.mean(axis=1) if kw["average_attn_weights"] else w)


target(name="nn.MultiheadAttention", draw=_draw_mha, call=_call_mha, reference=_ref_mha,
       out_dtype=lambda kw: (layer_dtype(kw), layer_dtype(kw)), atol=1e-4, rtol=1e-4, weight=2.0,
       args={"embed_dim": Arg("size", aliases=("num_heads",)), "num_heads": Arg("size", aliases=("embed_dim",)),
             # kdim / vdim / num_key_value_heads = None means embed_dim / num_heads: not a layout of a drawn size;
             # with the drawn checkpoint it is a shape mismatch, which load_state_dict reports by the
             # checkpoint entry
             "num_key_value_heads": Arg("size", optional=True, none_is_layout=False,
                                        aliases=("in_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias")),
             "kdim": Arg("size", optional=True, none_is_layout=False, aliases=("k_proj_weight",)),
             "vdim": Arg("size", optional=True, none_is_layout=False, aliases=("v_proj_weight",)),
             "bias": Arg("bool"), "dtype": Arg("dtype"),
             "query": Arg("array"), "key": Arg("array", optional=True, none_is_layout=False),
             "value": Arg("array", optional=True, none_is_layout=False),
             "attn_mask": Arg("attn_mask", optional=True, bad=TORCH_NAMED_MASK), "key_mask": Arg("keep_mask", optional=True),
             "is_causal": Arg("bool"), "need_weights": Arg("bool"), "average_attn_weights": Arg("bool"),
             "path": Arg("choice", choices=("auto", "flash", "reference")), "state": _state_arg()})


# ------------------------------------------------------------------------------------------------
# Transformer encoder / decoder layers and stacks
# ------------------------------------------------------------------------------------------------
def _layer_state(draw, E, Fd, bias, decoder):
    s = {}
    for a in (("self_attn", "multihead_attn") if decoder else ("self_attn",)):
        for k, v in _mha_state(draw, E, 1, 1, E, E, bias).items():
            s[f"{a}.{k}"] = v
        s[f"{a}.in_proj_weight"] = rng_array(draw, (3 * E, E))
    s["linear1.weight"], s["linear2.weight"] = rng_array(draw, (Fd, E)), rng_array(draw, (E, Fd))
    if bias:
        s["linear1.bias"], s["linear2.bias"] = rng_array(draw, (Fd,)), rng_array(draw, (E,))
    for i in range(1, 4 if decoder else 3):
        s[f"norm{i}.weight"] = 1 + 0.1 * rng_array(draw, (E,))
        if bias:
            s[f"norm{i}.bias"] = 0.1 * rng_array(draw, (E,))
    return s


def _draw_enc(draw, decoder=False, stack=False):
    H = draw(st.integers(1, 2))
    E = H * draw(st.integers(1, 3))
    Fd = draw(st.integers(1, 6))
    bias = draw(st.booleans())
    dt = draw(DTYPES)
    N, L = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    kw = {"decoder": decoder, "d_model": E, "nhead": H, "dim_feedforward": Fd,
          "activation": draw(st.sampled_from(["relu", "gelu"])), "layer_norm_eps": draw(st.sampled_from([1e-5, 1e-3])),
          "norm_first": draw(st.booleans()), "bias": bias, "dtype": dt, "state": _layer_state(draw, E, Fd, bias, decoder),
          "is_causal": draw(st.booleans()), "path": draw(st.sampled_from(["auto", "flash", "reference"]))}
    kw["src"] = rng_array(draw, (N, L, E), dt) if not decoder or True else None
    kw["src_mask"] = draw(st.sampled_from([None, _additive(rng_array(draw, (L, L)) > -0.5, dt),
                                           rng_array(draw, (L, L)).astype(dt)]))
    kw["src_key_mask"] = draw(st.sampled_from([None, rng_array(draw, (N, L)) > -0.5]))
    if decoder:
        S = draw(st.integers(1, 5))
        kw["memory"] = rng_array(draw, (N, S, E), dt)
        kw["memory_mask"] = draw(st.sampled_from([None, _additive(rng_array(draw, (L, S)) > -0.5, dt)]))
        kw["memory_key_mask"] = draw(st.sampled_from([None, rng_array(draw, (N, S)) > -0.5]))
        kw["memory_is_causal"] = draw(st.booleans())
    if stack:
        kw["num_layers"] = draw(st.integers(1, 2))
        kw["final_norm"] = draw(st.booleans())
    return kw


def _build_layer(kw):
    cls = nn.TransformerDecoderLayer if kw["decoder"] else nn.TransformerEncoderLayer
    layer = cls(kw["d_model"], kw["nhead"], kw["dim_feedforward"], kw["activation"], kw["layer_norm_eps"],
                kw["norm_first"], kw["bias"], dtype=kw["dtype"])
    layer.load_state_dict(kw["state"])
    return layer


def _call_enc(kw):
    layer = _build_layer(kw)
    if "num_layers" in kw:
        norm = None
        if kw["final_norm"]:
            norm = nn.LayerNorm(kw["d_model"], kw["layer_norm_eps"], bias=kw["bias"], dtype=kw["dtype"])
        layer = (nn.TransformerDecoder if kw["decoder"] else nn.TransformerEncoder)(layer, kw["num_layers"], norm)
    if kw["decoder"]:
        return layer(kw["src"], kw["memory"], tgt_mask=kw["src_mask"], memory_mask=kw["memory_mask"],
                     tgt_key_mask=kw["src_key_mask"], memory_key_mask=kw["memory_key_mask"],
                     tgt_is_causal=kw["is_causal"], memory_is_causal=kw["memory_is_causal"], path=kw["path"])
    mask_kw = "mask" if "num_layers" in kw else "src_mask"  # torch's names: the stack's is ``mask``
    return layer(kw["src"], **{mask_kw: kw["src_mask"]}, src_key_mask=kw["src_key_mask"], is_causal=kw["is_causal"],
                 path=kw["path"])


def _ref_enc(kw):
    dt = read_dtype(kw["dtype"])
    E, H = read_int(kw["d_model"], "d_model", 1, 64), read_int(kw["nhead"], "nhead", 1, 64)
    Fd = read_int(kw["dim_feedforward"], "dim_feedforward", 1, 64)
    act = kw["activation"]
    if E % H or not isinstance(act, str) or act not in ACTS:
        raise NoReference("config")
    eps = read_float(kw["layer_norm_eps"], "layer_norm_eps", 0.0)
    norm_first, bias = read_bool(kw["norm_first"], "norm_first"), read_bool(kw["bias"], "bias")
    is_causal = read_bool(kw["is_causal"], "is_causal")
    read_choice(kw["path"], "path", ("auto", "flash", "reference"))
    s = {k: as_layer(v, dt) for k, v in state_of(kw).items()}
    want = {}
    for a in (("self_attn", "multihead_attn") if kw["decoder"] else ("self_attn",)):
        want[f"{a}.in_proj_weight"], want[f"{a}.out_proj.weight"] = (3 * E, E), (E, E)
        if bias:
            want[f"{a}.in_proj_bias"], want[f"{a}.out_proj.bias"] = (3 * E,), (E,)
    want["linear1.weight"], want["linear2.weight"] = (Fd, E), (E, Fd)
    if bias:
        want["linear1.bias"], want["linear2.bias"] = (Fd,), (E,)
    for i in range(1, 4 if kw["decoder"] else 3):
        want[f"norm{i}.weight"] = (E,)
        if bias:
            want[f"norm{i}.bias"] = (E,)
    if set(s) != set(want) or any(s[k].shape != v for k, v in want.items()):
        raise NoReference("state")
    x = as_layer(read(kw["src"], "src"), dt)
    unbatched = not kw["decoder"] and x.ndim == 2
    if unbatched:
        x = x[None]
    if x.ndim != 3 or x.shape[2] != E:
        raise NoReference("src")
    N, L, _ = x.shape
    skm = kw["src_key_mask"]
    if unbatched and skm is not None:
        skm = np.asarray(skm)[None]
    bm, fm, km = layer_masks(kw["src_mask"], skm, N, H, L, L, dt, "src_mask", "src_key_mask")
    act_f = ACTS[act]
    nrm = lambda i, a: LN(a, s[f"norm{i}.weight"], s.get(f"norm{i}.bias"), eps)  # noqa: E731
    ff = lambda a: act_f(a @ s["linear1.weight"].T + s.get("linear1.bias", 0)) @ s["linear2.weight"].T + \
        s.get("linear2.bias", 0)  # noqa: E731
    sa = lambda a: mha_reference(a, a, a, s, E, H, H, bm, fm, km, is_causal, prefix="self_attn.")[0]  # noqa: E731
    if kw["decoder"]:
        mem = as_layer(read(kw["memory"], "memory"), dt)
        if mem.ndim != 3 or mem.shape[0] != N or mem.shape[2] != E:
            raise NoReference("memory")
        S = mem.shape[1]
        cbm, cfm, ckm = layer_masks(kw["memory_mask"], kw["memory_key_mask"], N, H, L, S, dt, "memory_mask",
                                    "memory_key_mask")
        if read_bool(kw["memory_is_causal"], "memory_is_causal"):
            c = np.arange(S)[None, :] <= np.arange(L)[:, None]
            cbm = c if cbm is None else (cbm & c)
        ca = lambda a: mha_reference(a, mem, mem, s, E, H, H, cbm, cfm, ckm, False,  # noqa: E731
                                     prefix="multihead_attn.")[0]
        blocks = [(1, sa), (2, ca), (3, ff)]
    else:
        blocks = [(1, sa), (2, ff)]
    layers = read_int(kw["num_layers"], "num_layers", 1, 8) if "num_layers" in kw else 1
    for _ in range(layers):
        for i, f in blocks:
            x = x + f(nrm(i, x)) if norm_first else nrm(i, x + f(x))
    if kw.get("final_norm"):
        x = LN(x, np.ones(E), np.zeros(E) if bias else None, eps)
    return x[0] if unbatched else x


_ENC_ARGS = {"d_model": Arg("size", aliases=("nhead",)), "nhead": Arg("size", aliases=("d_model",)),
             "dim_feedforward": Arg("size"), "activation": Arg("choice", choices=("relu", "gelu")),
             "layer_norm_eps": Arg("float", low=0.0), "norm_first": Arg("bool"), "bias": Arg("bool"),
             # src of another batch (or unbatched) no longer fits the drawn key mask: refused by naming the
             # mask (as torch names key_padding_mask); the decoder's: tgt_key_mask, or memory (its batch)
             "dtype": Arg("dtype"), "src": Arg("array", aliases=("src_key_mask",)), "src_mask": Arg("attn_mask", optional=True, aliases=("mask",), bad=TORCH_NAMED_MASK),
             "src_key_mask": Arg("keep_mask", optional=True), "is_causal": Arg("bool"),
             "path": Arg("choice", choices=("auto", "flash", "reference")), "state": _state_arg()}
_DEC_ARGS = {**_ENC_ARGS, "memory": Arg("array"), "memory_mask": Arg("attn_mask", optional=True, bad=TORCH_NAMED_MASK),
             "memory_key_mask": Arg("keep_mask", optional=True), "memory_is_causal": Arg("bool")}
_ALIAS = {"src": ("tgt", "tgt_key_mask", "memory"), "src_mask": ("tgt_mask", "mask"), "src_key_mask": ("tgt_key_mask",),
          "is_causal": ("tgt_is_causal",)}
for k, names in _ALIAS.items():
    _DEC_ARGS[k] = Arg(_DEC_ARGS[k].kind, optional=_DEC_ARGS[k].optional, choices=_DEC_ARGS[k].choices,
                       aliases=names, bad=_DEC_ARGS[k].bad)

target(name="nn.TransformerEncoderLayer", draw=_draw_enc, call=_call_enc, reference=_ref_enc,
       out_dtype=layer_dtype, atol=2e-4, rtol=2e-4, weight=1.5, args=_ENC_ARGS)
target(name="nn.TransformerDecoderLayer", draw=lambda d: _draw_enc(d, decoder=True), call=_call_enc,
       reference=_ref_enc, out_dtype=layer_dtype, atol=2e-4, rtol=2e-4, weight=1.5, args=_DEC_ARGS)
target(name="nn.TransformerEncoder+Decoder", draw=lambda d: _draw_enc(d, decoder=d(st.booleans()), stack=True),
       call=_call_enc, reference=_ref_enc, out_dtype=layer_dtype, atol=3e-4, rtol=3e-4,
       args={"num_layers": Arg("size"), "src": Arg("array", aliases=("tgt", "src_key_mask", "tgt_key_mask", "memory"))})


def _draw_transformer(draw):
    H = draw(st.integers(1, 2))
    return {"d_model": H * draw(st.integers(1, 3)), "nhead": H, "num_encoder_layers": draw(st.integers(1, 2)),
            "num_decoder_layers": draw(st.integers(1, 2)), "dim_feedforward": draw(st.integers(1, 5)),
            "activation": draw(st.sampled_from(["relu", "gelu"])), "layer_norm_eps": 1e-5,
            "norm_first": draw(st.booleans()), "bias": draw(st.booleans()), "dtype": draw(DTYPES)}


def _call_transformer(kw):
    m = nn.Transformer(kw["d_model"], kw["nhead"], kw["num_encoder_layers"], kw["num_decoder_layers"],
                       kw["dim_feedforward"], kw["activation"], kw["layer_norm_eps"], kw["norm_first"], kw["bias"],
                       dtype=kw["dtype"])
    return {k: tuple(v) for k, v in m.parameter_shapes().items()}


def _ref_transformer(kw):
    """torch.nn.Transformer's parameter names and shapes for the same arguments."""
    args = {}
    for name in ("d_model", "nhead", "num_encoder_layers", "num_decoder_layers", "dim_feedforward"):
        args[name] = read_int(kw[name], name, 1, 64)
    if args["d_model"] % args["nhead"] or kw["activation"] not in ("relu", "gelu"):
        raise NoReference("config")
    read_float(kw["layer_norm_eps"], "layer_norm_eps", 0.0)
    read_dtype(kw["dtype"])
    m = torch.nn.Transformer(**args, activation=kw["activation"], norm_first=read_bool(kw["norm_first"], "norm_first"),
                             bias=read_bool(kw["bias"], "bias"), batch_first=True)
    return {k: tuple(v.shape) for k, v in m.state_dict().items()}


def _cmp_shapes(result, expected, kw):
    return None if result == expected else f"parameters differ: {set(result) ^ set(expected)}"


target(name="nn.Transformer", draw=_draw_transformer, call=_call_transformer, reference=_ref_transformer,
       compare=_cmp_shapes, weight=0.5,
       args={"d_model": Arg("size", aliases=("nhead",)), "nhead": Arg("size", aliases=("d_model",)),
             "num_encoder_layers": Arg("size", aliases=("num_layers",)),
             "num_decoder_layers": Arg("size", aliases=("num_layers",)), "dim_feedforward": Arg("size"),
             "activation": Arg("choice", choices=("relu", "gelu")), "layer_norm_eps": Arg("float", low=0.0),
             "norm_first": Arg("bool"), "bias": Arg("bool"), "dtype": Arg("dtype")})


# ------------------------------------------------------------------------------------------------
# Positional classes
# ------------------------------------------------------------------------------------------------
def _draw_pe(draw):
    d, n = draw(st.integers(1, 8)), draw(st.integers(1, 12))
    dt = draw(DTYPES)
    L = draw(st.integers(1, n))
    return {"d_model": d, "max_len": n, "dtype": dt, "base": draw(st.sampled_from([10000.0, 100.0])),
            "x": rng_array(draw, dims(draw, draw(st.integers(0, 1)), 1, 3) + (L, d), dt),
            "offset": draw(st.integers(0, n - L))}


def _call_pe(kw):
    return tc.PositionalEncoding(kw["d_model"], kw["max_len"], kw["dtype"], base=kw["base"])(kw["x"], kw["offset"])


def _ref_pe(kw):
    dt = read_dtype(kw["dtype"])
    d, n = read_int(kw["d_model"], "d_model", 1, 64), read_int(kw["max_len"], "max_len", 1, 10**6)
    base = read_float(kw["base"], "base", 0.0, open_low=True)
    off = read_int(kw["offset"], "offset", 0)
    x = as_layer(read(kw["x"]), dt)
    if x.ndim not in (2, 3) or x.shape[-1] != d or off + x.shape[-2] > n:
        raise NoReference("x")
    pos = np.arange(off, off + x.shape[-2])[:, None]
    i = np.arange(d)[None, :]
    ang = pos / base ** ((i - i % 2) / d)
    return x + np.where(i % 2 == 0, np.sin(ang), np.cos(ang)).astype(dt)


target(name="positional.PositionalEncoding", draw=_draw_pe, call=_call_pe, reference=_ref_pe, out_dtype=layer_dtype,
       atol=1e-5, args={"d_model": Arg("size"), "max_len": Arg("size"), "dtype": Arg("dtype"),
                        "base": Arg("float", low=0.0, open_low=True), "x": Arg("array"), "offset": Arg("int", low=0)})


def _draw_embeddings(draw):
    V, H, P = draw(st.integers(1, 9)), draw(st.integers(1, 5)), draw(st.integers(1, 8))
    L = draw(st.integers(1, P))
    N = draw(st.integers(1, 3))
    ids = np.asarray(draw(st.lists(st.integers(0, V - 1), min_size=N * L, max_size=N * L))).reshape(N, L)
    state = {"token_embeddings.weight": rng_array(draw, (V, H)), "position_embeddings.weight": rng_array(draw, (P, H)),
             "layer_norm.weight": 1 + 0.1 * rng_array(draw, (H,)), "layer_norm.bias": rng_array(draw, (H,))}
    return {"vocab_size": V, "hidden_size": H, "max_position_embeddings": P, "layer_norm_eps": 1e-12,
            "dtype": draw(DTYPES), "state": state, "input_ids": ids}


def _call_embeddings(kw):
    m = tc.Embeddings(kw["vocab_size"], kw["hidden_size"], kw["max_position_embeddings"], kw["layer_norm_eps"],
                      kw["dtype"])
    m.load_state_dict(kw["state"])
    return m(kw["input_ids"])


def _ref_embeddings(kw):
    dt = read_dtype(kw["dtype"])
    V = read_int(kw["vocab_size"], "vocab_size", 1, 64)
    H = read_int(kw["hidden_size"], "hidden_size", 1, 64)
    P = read_int(kw["max_position_embeddings"], "max_position_embeddings", 1, 64)
    eps = read_float(kw["layer_norm_eps"], "layer_norm_eps", 0.0)
    s = {k: as_layer(v, dt) for k, v in state_of(kw).items()}
    want = {"token_embeddings.weight": (V, H), "position_embeddings.weight": (P, H), "layer_norm.weight": (H,),
            "layer_norm.bias": (H,)}
    if set(s) != set(want) or any(s[k].shape != v for k, v in want.items()):
        raise NoReference("state")
    ids = read_ids(kw["input_ids"], "input_ids", V)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[1] > P:
        raise NoReference("input_ids")
    x = s["token_embeddings.weight"][ids] + s["position_embeddings.weight"][:ids.shape[1]]
    return LN(x, s["layer_norm.weight"], s["layer_norm.bias"], eps)


target(name="positional.Embeddings", draw=_draw_embeddings, call=_call_embeddings, reference=_ref_embeddings,
       out_dtype=layer_dtype, atol=1e-4, rtol=1e-4,
       args={"vocab_size": Arg("size"), "hidden_size": Arg("size"), "max_position_embeddings": Arg("size"),
             "layer_norm_eps": Arg("float", low=0.0), "dtype": Arg("dtype"), "input_ids": Arg("ids", high=1),
             "state": _state_arg()})


def _draw_rotary_mha(draw):
    """MultiheadAttention with a RotaryEmbedding and a KV cache: two calls (prompt, then one token)
    must equal one call over the whole sequence (RoPE and the cache inside the layer)."""
    H = draw(st.integers(1, 2))
    D = 2 * draw(st.integers(1, 2))
    E = H * D
    L = draw(st.integers(2, 5))
    dt = draw(DTYPES)
    return {"embed_dim": E, "num_heads": H, "head_dim": D, "max_position_embeddings": draw(st.integers(L, L + 3)),
            "base": draw(st.sampled_from([10000.0, 100.0])), "layout": draw(st.sampled_from(["half", "interleaved"])),
            "dtype": dt, "state": _mha_state(draw, E, H, H, E, E, True), "query": rng_array(draw, (1, L, E), dt),
            "capacity": draw(st.integers(0, 4))}


def _call_rotary_mha(kw):
    m = nn.MultiheadAttention(kw["embed_dim"], kw["num_heads"], dtype=kw["dtype"])
    m.load_state_dict(kw["state"])
    rot = tc.positional.RotaryEmbedding(kw["head_dim"], kw["max_position_embeddings"], kw["base"], kw["layout"],
                                        dtype=kw["dtype"])
    cache = tc.KVCache(1, 1, kw["num_heads"], kw["embed_dim"] // kw["num_heads"], kw["capacity"], dtype=kw["dtype"])
    q = np.asarray(kw["query"])
    a, _ = m(q[:, :-1], is_causal=True, rotary=rot, past_key_values=cache)
    b, _ = m(q[:, -1:], is_causal=True, rotary=rot, past_key_values=cache)
    return np.concatenate([a, b], axis=1)


def _ref_rotary_mha(kw):
    dt = read_dtype(kw["dtype"])
    E, H = read_int(kw["embed_dim"], "embed_dim", 1, 64), read_int(kw["num_heads"], "num_heads", 1, 64)
    D = read_int(kw["head_dim"], "head_dim", 2, 64)
    P = read_int(kw["max_position_embeddings"], "max_position_embeddings", 1, 10**6)
    base = read_float(kw["base"], "base", 0.0, open_low=True)
    layout = read_choice(kw["layout"], "layout", ("half", "interleaved"))
    read_int(kw["capacity"], "capacity", 0, 10**6)
    if E % H or D != E // H or D % 2:
        raise NoReference("head_dim")
    q_in = as_layer(read(kw["query"], "query"), dt)
    if q_in.shape[1] > P:
        raise NoReference("positions")
    s = {k: as_layer(v, dt) for k, v in state_of(kw).items()}
    N, L, _ = q_in.shape
    wq, wk, wv = np.split(s["in_proj_weight"], 3)
    bq, bk, bv = np.split(s["in_proj_bias"], 3)
    heads = lambda a: a.reshape(N, L, H, D).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = heads(q_in @ wq.T + bq), heads(q_in @ wk.T + bk), heads(q_in @ wv.T + bv)
    inv = 1.0 / base ** (np.arange(0, D, 2) / D)
    ang = np.outer(np.arange(L), inv)
    c, sn = np.cos(ang).astype(dt).astype(np.float64), np.sin(ang).astype(dt).astype(np.float64)

    def rope(a):
        if layout == "half":
            h = D // 2
            cc, ss = np.concatenate([c, c], -1), np.concatenate([sn, sn], -1)
            return a * cc + np.concatenate([-a[..., h:], a[..., :h]], -1) * ss
        y = np.empty_like(a)
        y[..., 0::2] = a[..., 0::2] * c - a[..., 1::2] * sn
        y[..., 1::2] = a[..., 1::2] * c + a[..., 0::2] * sn
        return y

    out = attention(rope(q), rope(k), v, is_causal=True)
    out = out.transpose(0, 2, 1, 3).reshape(N, L, E)
    return out @ s["out_proj.weight"].T + s["out_proj.bias"]


target(name="positional.RotaryEmbedding+KVCache", draw=_draw_rotary_mha, call=_call_rotary_mha,
       reference=_ref_rotary_mha, out_dtype=layer_dtype, atol=1e-4, rtol=1e-4,
       args={"head_dim": Arg("size", bad=[("odd", 3)], aliases=("rotary",)),
             "max_position_embeddings": Arg("size", bad=[("too_short", 1)], aliases=("input_ids", "position_ids",
                                                                                      "positions")),
             "base": Arg("float", low=0.0, open_low=True), "layout": Arg("choice", choices=("half", "interleaved")),
             "capacity": Arg("int", low=0)})


# ------------------------------------------------------------------------------------------------
# KVCache
# ------------------------------------------------------------------------------------------------
def _draw_cache(draw):
    nl, b, h, d = draw(st.integers(0, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 4))
    S = draw(st.integers(0, 4))
    return {"num_layers": nl, "batch": b, "num_key_value_heads": h, "head_dim": d, "capacity": draw(st.integers(0, 6)),
            "dtype": draw(DTYPES), "S": S, "crop": draw(st.integers(-S, S)), "reserve": draw(st.integers(0, 10)),
            "past": [(rng_array(draw, (b, h, S, d)), rng_array(draw, (b, h, S, d))) for _ in range(max(nl, 1))]}


def _call_cache(kw):
    c = tc.KVCache(kw["num_layers"], kw["batch"], kw["num_key_value_heads"], kw["head_dim"], kw["capacity"],
                   kw["dtype"])
    out = {"len": len(c), "length": c.length, "capacity_ok": c.capacity >= max(kw["capacity"], 1)}
    c2 = tc.KVCache.from_legacy(kw["past"], kw["num_key_value_heads"], kw["head_dim"], kw["dtype"])
    c2.reserve(kw["reserve"])
    c2.crop(kw["crop"])
    out["legacy"] = [c2[i] for i in range(len(c2))]
    return out


def _ref_cache(kw):
    dt = read_dtype(kw["dtype"])
    nl = read_int(kw["num_layers"], "num_layers", 0, 64)
    for name in ("batch", "num_key_value_heads", "head_dim"):
        read_int(kw[name], name, 1, 64)
    read_int(kw["capacity"], "capacity", 0, 10**6)
    read_int(kw["reserve"], "total", 0, 10**6)
    # >= 0: the positions kept; < 0: minus the positions removed (transformers 5's crop(-n))
    crop = read_int(kw["crop"], "length", -kw["S"], kw["S"])
    crop = crop if crop >= 0 else kw["S"] + crop
    past = kw["past"]
    if not isinstance(past, (list, tuple)) or not past:
        raise NoReference("past")
    legacy = []
    for k, v in past:
        k, v = as_layer(read(k, "k", allow_empty=True), dt), as_layer(read(v, "v", allow_empty=True), dt)
        if k.ndim != 4 or k.shape != v.shape or k.shape[1] != kw["num_key_value_heads"] or k.shape[3] != kw["head_dim"]:
            raise NoReference("past shapes")
        legacy.append((k[:, :, :crop], v[:, :, :crop]))
    return {"len": nl, "length": 0, "capacity_ok": True, "legacy": legacy}


target(name="KVCache", draw=_draw_cache, call=_call_cache, reference=_ref_cache,
       out_dtype=layer_dtype,
       args={"num_layers": Arg("size", low=0), "batch": Arg("size"), "num_key_value_heads": Arg("size"),
             "head_dim": Arg("size"), "capacity": Arg("int", low=0),
             "crop": Arg("int", low=-4, aliases=("length",),  # in [-S, S], S <= 4
                         bad=[("too_long", 99), ("minus_one", -1), ("too_negative", -99)]),
             "reserve": Arg("int", low=0, aliases=("total",)), "dtype": Arg("dtype"),
             "past": Arg("custom", aliases=("past_key_values",),
                         bad=[("None", None), ("empty", []), ("int", 3), ("not_pairs", [np.ones((1, 1, 1, 1))]),
                              ("rank3", [(np.ones((1, 1, 1)), np.ones((1, 1, 1)))]),
                              ("complex", [(np.ones((1, 1, 1, 1), np.complex64),) * 2])])})


# ------------------------------------------------------------------------------------------------
# The thread count
# ------------------------------------------------------------------------------------------------
def _call_threads(kw):
    old = tc.get_num_threads()
    try:
        tc.set_num_threads(kw["n"])
        return tc.get_num_threads()
    finally:
        tc.set_num_threads(old)


target(name="set_num_threads", draw=lambda d: {"n": d(st.integers(1, 8))}, call=_call_threads,
       reference=lambda kw: read_int(kw["n"], "n", 1, 1024), compare=lambda r, e, kw: None if r == e else f"{r} != {e}",
       args={"n": Arg("int", low=1, high=1024)}, weight=0.5)
_ = math  # (math is used by targets added later)
