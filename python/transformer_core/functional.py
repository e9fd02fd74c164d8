"""Functional ops, computed by the C++ core: linear, softmax, layer_norm, gelu, relu and
scaled dot-product attention.

Every op takes array-likes, converts them once (float64 stays float64; any other real dtype
becomes float32; non-contiguous inputs are copied), checks their shapes, and returns new numpy
arrays. The GIL is released while the C++ core computes.

Masks, one convention in the whole library (seed 001's ``mask == 0 -> -inf``, torch's
``F.scaled_dot_product_attention``): a boolean mask is True where attention is allowed; a float
mask is added to the scores. A query row with nothing to attend gives zeros, never NaN.
"""

from __future__ import annotations

import math

import numpy as np

from ._runtime import variant
from ._validation import as_bool, as_float, broadcast_mask, compute_dtype

__all__ = [
    "linear",
    "softmax",
    "layer_norm",
    "gelu",
    "relu",
    "scaled_dot_product_attention",
    "sinusoidal_positional_encoding",
    "rotary_cos_sin",
    "rotate_half",
    "apply_rotary",
    "apply_rotary_pos_emb",
]



def linear(x, weight, bias=None) -> np.ndarray:
    """Affine map ``y = x Wᵀ + b``, as ``torch.nn.functional.linear``. One BLAS GEMM.

    Args:
        x: ``(..., in_features)`` float array.
        weight: ``(out_features, in_features)``, torch's ``nn.Linear`` layout.
        bias: ``(out_features,)`` or None.

    Returns:
        ``(..., out_features)``, dtype of ``x`` (float32 unless ``x`` is float64).

    Raises:
        ValueError: ``x`` empty or of rank 0; ``weight`` not 2-D or its in_features differ from
            ``x``'s last dim; ``bias`` of the wrong shape.
        TypeError: a non-numeric array.
    """
    x = as_float(x, "x", min_ndim=1)
    dtype = x.dtype.type
    weight = as_float(weight, "weight", dtype, ndim=2)
    if weight.shape[1] != x.shape[-1]:
        raise ValueError(
            f"weight: expected shape (out_features, {x.shape[-1]}) to match x's last dim, got {weight.shape}")
    if bias is not None:
        bias = as_float(bias, "bias", dtype, ndim=1)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias: expected shape ({weight.shape[0]},), got {bias.shape}")
    y = variant("linear", dtype)(x.reshape(-1, x.shape[-1]), weight, bias)
    return y.reshape(x.shape[:-1] + (weight.shape[0],))


def softmax(x, axis: int = -1) -> np.ndarray:
    """``exp(x - max) / Σ exp(x - max)`` along ``axis`` (max-subtracted, so it never overflows).

    Args:
        x: float array of any shape (non-empty).
        axis: the axis to normalise over.

    Returns:
        Same shape and dtype as ``x``; each slice along ``axis`` sums to 1. A slice that is all
        ``-inf`` (fully masked) gives zeros, where torch gives NaN; NaN in a slice gives NaN.

    Raises:
        ValueError: empty ``x`` or ``axis`` out of range.
    """
    x = as_float(x, "x", min_ndim=1)
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis: expected an int in [{-x.ndim}, {x.ndim}), got {axis}")
    moved = np.ascontiguousarray(np.moveaxis(x, axis, -1))
    y = variant("softmax", x.dtype.type)(moved.reshape(-1, moved.shape[-1]))
    return np.moveaxis(y.reshape(moved.shape), -1, axis)


def layer_norm(x, weight=None, bias=None, eps: float = 1e-5) -> np.ndarray:
    """Layer normalisation over the last dim (Ba et al. 2016), as ``torch.nn.functional.layer_norm``
    with ``normalized_shape = (E,)``::

        y = (x - mean) / sqrt(var + eps) * weight + bias      (var: biased, two-pass)

    Args:
        x: ``(..., E)`` float array.
        weight, bias: ``(E,)`` or None (no affine).
        eps: added to the variance, > 0 not required but must be >= 0.

    Returns:
        ``(..., E)``, dtype of ``x``.

    Raises:
        ValueError: empty ``x``; weight/bias not of shape ``(E,)``; ``eps`` negative.
    """
    x = as_float(x, "x", min_ndim=1)
    dtype = x.dtype.type
    e = x.shape[-1]
    params = []
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            p = as_float(p, name, dtype, ndim=1)
            if p.shape != (e,):
                raise ValueError(f"{name}: expected shape ({e},) to match x's last dim, got {p.shape}")
        params.append(p)
    if not eps >= 0:
        raise ValueError(f"eps: expected a value >= 0, got {eps}")
    y = variant("layer_norm", dtype)(x.reshape(-1, e), params[0], params[1], float(eps))
    return y.reshape(x.shape)


def gelu(x, approximate: str = "none") -> np.ndarray:
    """GELU (Hendrycks & Gimpel 2016), as ``torch.nn.functional.gelu``.

    ``approximate="none"``: ``0.5 x (1 + erf(x / √2))`` (BERT); ``"tanh"``:
    ``0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`` (GPT-2). Same shape and dtype as ``x``.

    Raises:
        ValueError: ``approximate`` not "none" or "tanh"; empty ``x``.
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
    x = as_float(x, "x")
    return variant("activation", x.dtype.type)(x, "gelu" if approximate == "none" else "gelu_tanh")


def relu(x) -> np.ndarray:
    """``max(x, 0)`` element-wise (NaN stays NaN). Same shape and dtype as ``x``.

    Raises:
        ValueError: empty ``x``.
    """
    x = as_float(x, "x")
    return variant("activation", x.dtype.type)(x, "relu")


def _attention_masks(attn_mask, query_mask, key_mask, lead: tuple, L: int, S: int, dtype):
    """Combines the masks of an attention call into (bool_mask, float_mask) broadcast to
    ``lead + (L, S)`` (zero-copy views where only one boolean mask is given)."""
    full = lead + (L, S)
    bool_parts, float_mask = [], None
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.dtype == np.bool_:
            bool_parts.append(broadcast_mask(m, full, "attn_mask"))
        elif m.dtype.kind == "f":
            float_mask = broadcast_mask(m.astype(dtype, copy=False), full, "attn_mask")
        else:
            raise TypeError(
                f"attn_mask: expected bool (True = may attend) or float (added to the scores), got dtype {m.dtype}")
    if query_mask is not None:
        qm = as_bool(query_mask, "query_mask")
        if qm.ndim < 1 or qm.shape[-1] != L:
            raise ValueError(f"query_mask: expected shape (..., {L}) (query length), got {qm.shape}")
        bool_parts.append(broadcast_mask(qm[..., :, None], full, "query_mask"))
    if key_mask is not None:
        km = as_bool(key_mask, "key_mask")
        if km.ndim < 1 or km.shape[-1] != S:
            raise ValueError(f"key_mask: expected shape (..., {S}) (key length), got {km.shape}")
        bool_parts.append(broadcast_mask(km[..., None, :], full, "key_mask"))
    bool_mask = None
    if len(bool_parts) == 1:
        bool_mask = bool_parts[0]
    elif bool_parts:
        bool_mask = np.logical_and.reduce(bool_parts)
    return bool_mask, float_mask


def _as_4d(mask: np.ndarray | None, shape4: tuple) -> np.ndarray | None:
    return None if mask is None else mask.reshape(shape4)


def scaled_dot_product_attention(query, key, value, attn_mask=None, *, query_mask=None, key_mask=None,
                                 is_causal: bool = False, scale: float | None = None,
                                 return_weights: bool = False, causal_alignment: str = "top_left",
                                 enable_gqa: bool = False, path: str = "auto", return_lse: bool = False):
    """Scaled dot-product attention (Vaswani et al. 2017, eq. 1; seed 001 "Scaled Dot-product
    Attention")::

        Attention(Q, K, V) = softmax(Q Kᵀ · scale + mask) V,      scale = 1 / sqrt(E) by default

    Args:
        query: ``(..., L, E)``.
        key: ``(..., S, E)``; the same leading dims as ``query`` (with ``enable_gqa``, the
            head dim, third from the end, may be a divisor of query's: grouped-query attention).
        value: ``(..., S, Ev)``.
        attn_mask: bool (True = may attend) or float (added to the scores), broadcastable to
            ``(..., L, S)``. Integer masks are refused: say which you mean.
        query_mask: ``(..., L)``, 1/True = a real query token (seed 001). A masked query row
            attends to nothing and gives zeros.
        key_mask: ``(..., S)``, 1/True = a real key token (a padding mask). Note the opposite
            meaning of torch's ``key_padding_mask``.
        is_causal: key ``s`` is visible to query ``l`` only if ``s <= l`` (``causal_alignment=
            "top_left"``, torch's) or ``s <= l + S - L`` (``"bottom_right"``, for a KV cache).
        scale: multiplies the scores; default ``1 / sqrt(E)``.
        return_weights: also return the attention probabilities.
        path: ``"auto"`` (tiled flash kernel; the reference when weights are asked for),
            ``"flash"`` or ``"reference"`` (the unfused oracle).
        return_lse: also return the log-sum-exp of each query row's scores,
            ``lse_i = log Σ_s exp(x_is)`` with ``x = Q Kᵀ · scale + mask`` over the keys row i may
            see: what the backward pass of FlashAttention-2 (Dao 2023, alg. 2) recomputes the
            weights from, ``weights = exp(x - lse)``.

    Returns:
        ``(..., L, Ev)``, dtype of ``query`` (float32 unless query is float64); with
        ``return_weights`` and/or ``return_lse``, a tuple ``(output[, weights][, lse])`` in that
        order, weights ``(..., L, S)``, lse ``(..., L)``. A query row whose keys are all masked
        gives zeros in output and weights and ``-inf`` in lse; NaN in the inputs still gives NaN
        (also with ``scale=0``: 0 · NaN is NaN, as in torch's math path).

        The result is the same bit for bit for any thread count (``set_num_threads``): the
        kernels cut the work by the shapes alone.

    Raises:
        ValueError: rank < 2, empty arrays, mismatched leading dims / lengths / feature sizes,
            masks that do not broadcast, bad ``causal_alignment`` or ``path``.
        TypeError: non-numeric arrays, or a mask of a dtype that is neither bool nor float.
    """
    dtype = compute_dtype(query, "query")
    q = as_float(query, "query", dtype, min_ndim=2)
    k = as_float(key, "key", dtype, min_ndim=2)
    v = as_float(value, "value", dtype, min_ndim=2)
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
    if causal_alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"causal_alignment: expected 'top_left' or 'bottom_right', got {causal_alignment!r}")
    if path not in ("auto", "flash", "reference"):
        raise ValueError(f"path: expected 'auto', 'flash' or 'reference', got {path!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(E)

    # [N, H, L, E]: everything before the head dim is one batch dim; 3-D inputs have one head.
    heads = lead[-1] if len(lead) >= 1 and q.ndim >= 4 else 1
    n = int(np.prod(lead)) // heads if heads else 0
    kv_heads = k.shape[-3] if q.ndim >= 4 else 1
    q4 = q.reshape(n, heads, L, E)
    k4 = k.reshape(n, kv_heads, S, E)
    v4 = v.reshape(n, kv_heads, S, v.shape[-1])
    bool_mask, float_mask = _attention_masks(attn_mask, query_mask, key_mask, lead, L, S, dtype)
    shape4 = (n, heads, L, S)
    offset = 0 if causal_alignment == "top_left" else S - L
    result = variant("scaled_dot_product_attention", dtype)(
        q4, k4, v4, _as_4d(bool_mask, shape4), _as_4d(float_mask, shape4), None, bool(is_causal), offset,
        float(scale), bool(return_weights), path, return_lse=bool(return_lse))
    if not (return_weights or return_lse):
        return result.reshape(lead + (L, v.shape[-1]))
    out = (result[0].reshape(lead + (L, v.shape[-1])),)
    if return_weights:
        out += (result[1].reshape(lead + (L, S)),)
    if return_lse:
        out += (result[-1].reshape(lead + (L,)),)
    return out


# Positional encodings live in positional.py (they import this module); re-exported here so that
# every functional op is one import away.
from .positional import (  # noqa: E402
    apply_rotary,
    apply_rotary_pos_emb,
    rotary_cos_sin,
    rotate_half,
    sinusoidal_positional_encoding,
)
