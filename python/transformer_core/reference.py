"""A small numpy reference of the Transformer, readable in one sitting (in the spirit of nanoGPT's
model.py): the oracle the tests use beside PyTorch. Slow and simple on purpose; no C++ here.

Shapes: batch-first ``(N, L, E)``; heads ``(N, H, L, D)``. Masks: the library's convention (bool True
= may attend, float added; key masks True = real token). Weight names: torch's / Hugging Face's.
Source: Vaswani et al. 2017 (eq. 1, eq. 2, §3.2.2), the five tutorials.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["softmax", "layer_norm", "gelu", "linear", "scaled_dot_product_attention", "multi_head_attention",
           "encoder_layer", "bert"]


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``exp(x - max) / Σ exp(x - max)`` along ``axis`` (torch's ``softmax``); an all ``-inf``
    slice gives zeros (a fully masked row), where torch gives NaN.

    Args: ``x`` a float array of any shape; ``axis`` the axis normalised over.
    Returns: ``x``'s shape and float dtype (float32 stays float32).
    Raises: no checks of its own (an oracle): numpy's ``AxisError`` (a ValueError) for an ``axis``
    outside ``x``'s dimensions, its ValueError for an empty ``axis``.
    """
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s != 0)


def layer_norm(x: np.ndarray, weight=None, bias=None, eps: float = 1e-5) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps) · weight + bias`` over the last dim (Ba et al. 2016), the
    variance biased, as torch's ``F.layer_norm(x, (E,), weight, bias, eps)`` (this signature has no
    ``normalized_shape``).

    Args: ``x`` a float array ``(..., E)``; ``weight``, ``bias`` ``(E,)`` or None (no affine);
    ``eps`` a number added to the variance.
    Returns: ``(..., E)``, of numpy's promotion of the dtypes (float32 inputs give float32).
    Raises: no checks of its own (an oracle): numpy's ValueError for a ``weight`` or ``bias`` that
    does not broadcast against ``x``.
    """
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    return y * (1 if weight is None else weight) + (0 if bias is None else bias)


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """GELU (Hendrycks & Gimpel 2016): ``0.5 x (1 + erf(x / √2))`` (``approximate="none"``), or its
    tanh form ``0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`` (``"tanh"``: GPT-2's), as torch's
    ``gelu(x, approximate=...)``.

    Args: ``x`` an array-like of real numbers, any shape; ``approximate`` ``"none"`` or ``"tanh"``.
    Returns: ``x``'s shape; a float ``x`` keeps its dtype (float32 stays float32), an integer one
    (or a list of ints) is computed in float64, numpy's own promotion (``np.tanh`` of ints), in
    both forms.
    Raises: ValueError: another ``approximate`` (torch refuses it too). TypeError: ``x`` not real
    numbers (bool, complex, object).
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
    x = np.asarray(x)
    if x.dtype.kind in "iu":
        x = x.astype(np.float64)  # erf must not be rounded back to an integer
    elif x.dtype.kind != "f":
        raise TypeError(f"x: expected real numbers (float or integer), got dtype {x.dtype}")
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    erf = np.vectorize(math.erf, otypes=[x.dtype])  # math.erf in double, rounded to x's float dtype
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def linear(x: np.ndarray, weight: np.ndarray, bias=None) -> np.ndarray:
    """``x Wᵀ + b`` (torch's ``F.linear``).

    Args: ``x`` ``(..., in)``; ``weight`` ``(out, in)`` (torch's layout); ``bias`` ``(out,)`` or None.
    Returns: ``(..., out)``, of numpy's promotion of the dtypes (float32 inputs give float32).
    Raises: no checks of its own (an oracle): numpy's ValueError for an ``in`` that differs between
    ``x`` and ``weight``, or a ``bias`` that does not broadcast against ``(..., out)``.
    """
    y = x @ weight.T
    return y if bias is None else y + bias


def scaled_dot_product_attention(q, k, v, attn_mask=None, key_mask=None, is_causal=False, scale=None):
    """``softmax(q kᵀ · scale + mask) v`` (Vaswani et al. 2017, eq. 1).

    Args:
        q: ``(..., L, D)``; k: ``(..., S, D)``; v: ``(..., S, Dv)``: float arrays whose leading dims
            broadcast (numpy's ``@``).
        attn_mask: bool (True = may attend) or float (added to the scores), broadcastable to
            ``(..., L, S)``; or None. Integer masks are refused: 0/1 could mean either.
        key_mask: True / nonzero = a real key token (the opposite of torch's ``key_padding_mask``),
            bool or integer: ``(S,)``, shared by every row, or ``(N, S)``, one row per entry of
            the first dim of q (of rank >= 3: ``(N, L, D)`` or ``(N, H, L, D)``), broadcast over
            the dims between; or None.
        is_causal: key ``s`` visible to query ``l`` only if ``s <= l`` (top-left aligned, torch's),
            combined with the masks by logical AND.
        scale: multiplies the scores; None: ``1 / sqrt(D)``.

    Returns:
        ``(out (..., L, Dv), weights (..., L, S))``, of numpy's promotion of the dtypes. A query
        row with every key masked gives zeros (torch: NaN).

    Raises:
        TypeError: an ``attn_mask`` neither bool nor float; a ``key_mask`` neither bool nor
            integer. ValueError: a ``key_mask`` of another shape than above; numpy's, for arrays
            whose shapes do not match.
    """
    L, S = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale                       # (..., L, S)
    if attn_mask is not None:
        attn_mask = np.asarray(attn_mask)
        if attn_mask.dtype.kind not in "bf":
            raise TypeError(f"attn_mask: expected bool (True = may attend) or float (added to the scores), "
                            f"got dtype {attn_mask.dtype}")
        scores = np.where(attn_mask, scores, -np.inf) if attn_mask.dtype == bool else scores + attn_mask
    if key_mask is not None:
        km = np.asarray(key_mask)                                       # a list works too
        if km.dtype.kind not in "biu":
            raise TypeError(f"key_mask: expected bool or integer (True / nonzero = a real token), got dtype {km.dtype}")
        batched = km.ndim == 2 and scores.ndim >= 3 and km.shape[0] in (1, scores.shape[0])
        if km.shape[-1:] != (S,) or not (km.ndim == 1 or batched):
            expected = f"({S},)" + (f" or ({scores.shape[0]}, {S})" if scores.ndim >= 3 else "")
            raise ValueError(f"key_mask: expected shape {expected} (key length {S}), got {km.shape}")
        if km.ndim == 2:                                                # (N, S) -> (N, 1, 1, S)
            km = km.reshape(km.shape[0], *([1] * (scores.ndim - 2)), S)
        scores = np.where(km != 0, scores, -np.inf)
    if is_causal:
        scores = np.where(np.tril(np.ones((L, S), dtype=bool)), scores, -np.inf)
    weights = softmax(scores, axis=-1)
    return weights @ v, weights


def multi_head_attention(x, state: dict, num_heads: int, *, prefix: str = "", attn_mask=None, key_mask=None,
                         is_causal=False):
    """Self-attention with torch's ``nn.MultiheadAttention`` weights (``in_proj_weight`` packed
    [q; k; v], ``out_proj.*``), batch-first, eval.

    Args:
        x: ``(N, L, E)`` float array.
        state: numpy arrays by torch's names under ``prefix``: ``in_proj_weight (3E, E)``,
            ``in_proj_bias (3E,)`` (optional), ``out_proj.weight (E, E)``, ``out_proj.bias (E,)``
            (optional).
        num_heads: H, a divisor of E (head size ``D = E // H``).
        attn_mask, key_mask, is_causal: as :func:`scaled_dot_product_attention`'s (``attn_mask``
            bool True = may attend or float added, ``(L, L)`` or broadcastable to ``(N, H, L, L)``;
            ``key_mask`` ``(N, L)`` or ``(L,)``, True = a real token).

    Returns:
        ``(N, L, E)``, of numpy's promotion of the dtypes.

    Raises:
        KeyError: a weight missing from ``state``. ValueError: numpy's, for an E that ``num_heads``
        does not divide or weights of the wrong shape; the mask errors of
        :func:`scaled_dot_product_attention`.
    """
    N, L, E = x.shape
    D = E // num_heads
    w, b = state[prefix + "in_proj_weight"], state.get(prefix + "in_proj_bias")
    qkv = linear(x, w, b)                                               # (N, L, 3E)
    q, k, v = np.split(qkv, 3, axis=-1)                                 # 3 × (N, L, E)
    heads = lambda t: t.reshape(N, L, num_heads, D).transpose(0, 2, 1, 3)  # noqa: E731  (N, H, L, D)
    out, _ = scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask, key_mask, is_causal)
    out = out.transpose(0, 2, 1, 3).reshape(N, L, E)                    # concat heads
    return linear(out, state[prefix + "out_proj.weight"], state.get(prefix + "out_proj.bias"))


def encoder_layer(x, state: dict, num_heads: int, *, activation="relu", norm_first=False, eps=1e-5,
                  key_mask=None, prefix: str = ""):
    """``torch.nn.TransformerEncoderLayer`` (eval), batch-first, from its state dict::

        post-LN: x = norm1(x + self_attn(x));  x = norm2(x + linear2(act(linear1(x))))
        pre-LN (norm_first): x = x + self_attn(norm1(x));  x = x + linear2(act(linear1(norm2(x))))

    Args:
        x: ``(N, L, E)`` float array.
        state: numpy arrays by torch's names under ``prefix``: ``self_attn.*`` (see
            :func:`multi_head_attention`), ``linear1.weight (F, E)``, ``linear2.weight (E, F)``,
            ``norm1.weight``/``norm2.weight (E,)``, their biases (optional).
        num_heads: H, a divisor of E.
        activation: ``"relu"`` or ``"gelu"`` (exact erf form), torch's two names.
        norm_first: pre-LN when True, torch's flag.
        eps: the LayerNorms' epsilon.
        key_mask: ``(N, L)`` or ``(L,)``, True / nonzero = a real token (torch's
            ``src_key_padding_mask`` is its negation), or None.

    Returns:
        ``(N, L, E)``, of numpy's promotion of the dtypes. Padded rows are computed like the
        others; their values mean nothing (compare the real rows).

    Raises:
        ValueError: ``activation`` not "relu" or "gelu" (torch's two); the errors of
            :func:`multi_head_attention`. KeyError: a weight missing from ``state``.
    """
    if activation not in ("relu", "gelu"):
        raise ValueError(f"activation: expected 'relu' or 'gelu', got {activation!r}")
    act = (lambda t: np.maximum(t, 0)) if activation == "relu" else gelu
    p = prefix

    def _sa(t):
        return multi_head_attention(t, state, num_heads, prefix=p + "self_attn.", key_mask=key_mask)

    def _ff(t):
        return linear(act(linear(t, state[p + "linear1.weight"], state.get(p + "linear1.bias"))),
                      state[p + "linear2.weight"], state.get(p + "linear2.bias"))

    def _norm(i, t):
        return layer_norm(t, state[f"{p}norm{i}.weight"], state.get(f"{p}norm{i}.bias"), eps)

    if norm_first:
        x = x + _sa(_norm(1, x))
        return x + _ff(_norm(2, x))
    x = _norm(1, x + _sa(x))
    return _norm(2, x + _ff(x))


def bert(input_ids, state: dict, config: dict, attention_mask=None, token_type_ids=None):
    """Hugging Face ``BertModel`` (eval) from its state dict: the encoder tutorial's Embeddings +
    post-LN GELU encoder layers.

    Args:
        input_ids: ``(N, L)`` integer token ids in ``[0, vocab_size)``, ``L <=
            max_position_embeddings``.
        state: numpy float arrays by Hugging Face's ``BertModel`` names (``embeddings.*``,
            ``encoder.layer.{i}.*``, optionally ``pooler.dense.*``); their dtype is the result's.
        config: Hugging Face's config as a dict: ``num_hidden_layers``, ``num_attention_heads``,
            ``layer_norm_eps`` (default 1e-12).
        attention_mask: ``(N, L)``, Hugging Face's mask: 1 = a real token, 0 = padding, of any
            numeric dtype (int or float 1/0, or bool); None: every token is real.
        token_type_ids: ``(N, L)`` integers, segment ids; None: zeros.

    Returns:
        ``(last_hidden_state (N, L, H), pooler_output (N, H) or None)`` (None when ``state`` has
        no pooler). Padded rows hold values too (computed like the others); compare real rows.

    Raises:
        KeyError: a weight or config field missing. IndexError: an id beyond a table (numpy's).
        ValueError: ``input_ids`` not 2-D, or masks of the wrong shape (numpy's and
        :func:`scaled_dot_product_attention`'s).
    """
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"input_ids: expected (N, L) token ids, got shape {ids.shape}")
    key_mask = None if attention_mask is None else np.asarray(attention_mask) != 0  # HF's 1 = a real token
    N, L = ids.shape
    tt = np.zeros_like(ids) if token_type_ids is None else np.asarray(token_type_ids)
    eps = config.get("layer_norm_eps", 1e-12)
    x = (state["embeddings.word_embeddings.weight"][ids] + state["embeddings.position_embeddings.weight"][:L]
         + state["embeddings.token_type_embeddings.weight"][tt])
    x = layer_norm(x, state["embeddings.LayerNorm.weight"], state["embeddings.LayerNorm.bias"], eps)
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        s = {  # Hugging Face's names -> torch's encoder layer
            "self_attn.in_proj_weight": np.concatenate([state[p + f"attention.self.{n}.weight"]
                                                        for n in ("query", "key", "value")]),
            "self_attn.in_proj_bias": np.concatenate([state[p + f"attention.self.{n}.bias"]
                                                      for n in ("query", "key", "value")]),
            "self_attn.out_proj.weight": state[p + "attention.output.dense.weight"],
            "self_attn.out_proj.bias": state[p + "attention.output.dense.bias"],
            "norm1.weight": state[p + "attention.output.LayerNorm.weight"],
            "norm1.bias": state[p + "attention.output.LayerNorm.bias"],
            "linear1.weight": state[p + "intermediate.dense.weight"],
            "linear1.bias": state[p + "intermediate.dense.bias"],
            "linear2.weight": state[p + "output.dense.weight"],
            "linear2.bias": state[p + "output.dense.bias"],
            "norm2.weight": state[p + "output.LayerNorm.weight"],
            "norm2.bias": state[p + "output.LayerNorm.bias"],
        }
        x = encoder_layer(x, s, config["num_attention_heads"], activation="gelu", eps=eps, key_mask=key_mask)
    pooled = None
    if "pooler.dense.weight" in state:
        pooled = np.tanh(linear(x[:, 0], state["pooler.dense.weight"], state["pooler.dense.bias"]))
    return x, pooled
