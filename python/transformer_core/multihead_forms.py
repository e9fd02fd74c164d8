"""The multi-head attention forms of the tutorials, as weight conversions to and from our fused
:class:`transformer_core.nn.MultiheadAttention`.

All forms compute the same function (Vaswani et al. 2017, §3.2.2)::

    MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W_O + b_O
    head_h = softmax((Q W_Qh + b_Qh)(K W_Kh + b_Kh)ᵀ / sqrt(head_dim)) (V W_Vh + b_Vh)

and differ only in how they store ``W_Q, W_K, W_V`` (each ``(E, E)`` as torch stores a Linear:
``(out, in)``). Ours is torch's ``nn.MultiheadAttention`` state_dict::

    in_proj_weight (3E, E)   rows [W_Q; W_K; W_V]; rows h·d .. (h+1)·d - 1 of each block = head h
    in_proj_bias   (3E,)     [b_Q; b_K; b_V]
    out_proj.weight (E, E), out_proj.bias (E,)

The forms (``E = embed_dim``, ``H = num_heads``, ``d = E / H``):

1. **Per-head modules** (the encoder tutorial's ``MultiHeadAttention`` of ``AttentionHead`` s): head h owns
   ``q``, ``k``, ``v`` = ``nn.Linear(E, d)``; the outputs are concatenated in head order and fed
   to ``output_linear`` = ``nn.Linear(E, E)``. Stacking the heads' ``(d, E)`` weights in head order
   gives each ``(E, E)`` block: :func:`from_per_head`, :func:`to_per_head`.
2. **Split heads of one projection** (the overview tutorial's ``SelfAttention``: ``W_q, W_k, W_v, W_o``; the training tutorial's
   ``MultiHeadAttention``: ``q_linear, k_linear, v_linear, out_linear``): one ``nn.Linear(E, E)``
   each, then ``.view(N, L, H, d)``; the blocks are the Linears' weights as they are:
   :func:`from_split_heads`, :func:`to_split_heads`.
3. **einsum with shared per-head Linears** (the einsum tutorial's ``SelfAttention``): ``queries``, ``keys``,
   ``values`` = ``nn.Linear(d, d, bias=False)``, **shared by all heads** and meant to act on each
   head's slice ``x[..., h·d:(h+1)·d]``; ``fc_out`` = ``nn.Linear(E, E)``.

   * *As intended* (the shared Linear applied to every head's slice): each projection is the
     block-diagonal ``(E, E)`` matrix ``diag(W, W, ..., W) = kron(I_H, W)``, no bias:
     :func:`from_einsum_shared`, :func:`to_einsum_shared`.
   * *As written*: the tutorial's ``forward`` reshapes its inputs into heads but never calls
     ``self.values / self.keys / self.queries``, so Q, K, V are the inputs themselves: identity
     projections, only ``fc_out`` applied: :func:`from_einsum_as_written`.

   Two more things to know when comparing with the listing: (a) its second einsum,
   ``einsum("nhqk,nvhd->nqhd", [attention, values])``, gives the key and value positions separate
   indices, so it sums the weights (to 1) and the values independently and returns
   ``Σ_v values`` for every query, ignoring the attention; the conversions here are for the
   corrected ``"nhqk,nkhd->nqhd"`` (the attention-weighted sum). (b) Its argument order is
   ``forward(values, keys, query, mask)``, and it masks with ``-1e20`` instead of ``-inf`` (the
   same softmax unless a whole row is masked).

Every function takes a mapping of name -> array-like (numpy arrays, or torch tensors from
``module.state_dict()``), checks every name and shape, and returns a new dict of numpy arrays
(float64 stays float64, other dtypes become float32). Missing / unexpected names, inconsistent
shapes or an empty state (``embed_dim`` 0: ``nn.MultiheadAttention`` needs ``E >= 1``) raise
``ValueError`` naming them; a non-mapping ``state`` raises ``TypeError``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from ._validation import as_float, check_choice, check_positive_int, compute_dtype, to_numpy

__all__ = [
    "from_per_head",
    "to_per_head",
    "from_split_heads",
    "to_split_heads",
    "from_einsum_shared",
    "to_einsum_shared",
    "from_einsum_as_written",
]

_MHA_KEYS = ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")
_SPLIT_NAMES = {
    "W_q": ("W_q", "W_k", "W_v", "W_o"),
    "q_linear": ("q_linear", "k_linear", "v_linear", "out_linear"),
}


def _arrays(state, name: str = "state") -> dict[str, np.ndarray]:
    """name -> numpy array as given (torch tensors read as numpy arrays), nothing copied or
    converted: the dtypes are checked here (TypeError for bool, complex, ...), the names and shapes
    by the caller on these arrays, and only then are they converted (:func:`_floats`), so a wrong
    name or shape costs no copy of a large value."""
    if not isinstance(state, Mapping):
        raise TypeError(f"{name}: expected a mapping of name -> array, got {type(state).__name__}")
    out = {}
    for k, v in state.items():
        out[k] = to_numpy(v, f"{name}[{k!r}]")
        compute_dtype(out[k], f"{name}[{k!r}]")
    return out


def _floats(s: dict, name: str = "state") -> dict[str, np.ndarray]:
    """The checked arrays of :func:`_arrays` as C-contiguous float arrays: float64 (either byte
    order) stays float64, other dtypes become float32; an array already so is not copied (each
    function's result is made of new arrays: a value is copied once). None stays None."""
    return {k: None if v is None else as_float(v, f"{name}[{k!r}]", allow_empty=True) for k, v in s.items()}


def _check_keys(s: dict, expected, name: str = "state") -> None:
    expected = list(expected)
    missing = [k for k in expected if k not in s]
    unknown = [k for k in s if k not in expected]
    if missing or unknown:
        parts = ([f"missing keys: {missing}"] if missing else []) + ([f"unknown keys: {unknown}"] if unknown else [])
        raise ValueError(f"{name}: " + "; ".join(parts))


def _check_shape(a: np.ndarray, shape: tuple, key: str, name: str = "state") -> None:
    if a.shape != shape:
        raise ValueError(f"{name}[{key!r}]: expected shape {shape}, got {a.shape}")


def _mha(state, num_heads: int | None = None) -> tuple[dict, int]:
    """Our MHA state checked: (arrays, E). in_proj_bias may be absent (bias=False): zeros."""
    s = _arrays(state)
    if "in_proj_bias" not in s and "out_proj.bias" not in s:
        s = {**s, "in_proj_bias": None, "out_proj.bias": None}
    _check_keys(s, _MHA_KEYS)
    w = s["in_proj_weight"]
    if w.ndim != 2 or w.shape[0] != 3 * w.shape[1] or w.shape[1] == 0:
        raise ValueError(f"state['in_proj_weight']: expected shape (3E, E) with embed_dim E >= 1, got {w.shape}")
    E = w.shape[1]
    if num_heads is not None and E % num_heads != 0:
        raise ValueError(f"num_heads: expected a divisor of embed_dim {E}, got {num_heads}")
    no_bias = s["in_proj_bias"] is None
    if not no_bias:
        _check_shape(s["in_proj_bias"], (3 * E,), "in_proj_bias")
    _check_shape(s["out_proj.weight"], (E, E), "out_proj.weight")
    if not no_bias:
        _check_shape(s["out_proj.bias"], (E,), "out_proj.bias")
    s = _floats(s)
    if no_bias:
        s["in_proj_bias"] = np.zeros(3 * E, s["in_proj_weight"].dtype)
        s["out_proj.bias"] = np.zeros(E, s["in_proj_weight"].dtype)
    return s, E


def _pack(wq, wk, wv, bq, bk, bv, wo, bo) -> dict[str, np.ndarray]:
    return {
        "in_proj_weight": np.concatenate([wq, wk, wv], axis=0),
        "in_proj_bias": np.concatenate([bq, bk, bv], axis=0),
        "out_proj.weight": np.array(wo),
        "out_proj.bias": np.array(bo),
    }


# --------------------------------------------------------------------------------------------------
# 1. Per-head modules (the encoder tutorial)
# --------------------------------------------------------------------------------------------------


def from_per_head(state) -> dict[str, np.ndarray]:
    """The encoder tutorial's per-head ``MultiHeadAttention`` state_dict -> our MHA state_dict.

    Source names (H heads, ``d = E / H``): ``heads.{h}.q.weight (d, E)``, ``heads.{h}.q.bias (d)``
    and likewise ``k``, ``v``; ``output_linear.weight (E, E)``, ``output_linear.bias (E)``.
    ``W_Q = concat_h(heads.{h}.q.weight)`` along rows (head order = concatenation order of the
    tutorial's ``torch.cat([...], dim=-1)``), likewise K, V and the biases.

    Args:
        state: mapping with exactly those names; H is read from the ``heads.{h}`` indices, which
            must be ``0 .. H-1``.

    Returns:
        ``{"in_proj_weight" (3E, E), "in_proj_bias" (3E), "out_proj.weight" (E, E),
        "out_proj.bias" (E)}``, for ``nn.MultiheadAttention(E, H)``.

    Raises:
        TypeError: ``state`` not a mapping or non-numeric values.
        ValueError: missing / unknown names, head indices with gaps, inconsistent shapes,
            or ``H · d != E``.
    """
    s = _arrays(state)
    idx = sorted({int(m.group(1)) for k in s if (m := re.match(r"heads\.(\d+)\.", k))})
    if not idx or idx != list(range(len(idx))):
        raise ValueError(f"state: expected heads.0 .. heads.(H-1) keys, got head indices {idx}")
    H = len(idx)
    expected = [f"heads.{h}.{p}.{t}" for h in range(H) for p in "qkv" for t in ("weight", "bias")]
    expected += ["output_linear.weight", "output_linear.bias"]
    _check_keys(s, expected)
    wo = s["output_linear.weight"]
    if wo.ndim != 2 or wo.shape[0] != wo.shape[1] or wo.shape[0] == 0:
        raise ValueError(f"state['output_linear.weight']: expected shape (E, E) with embed_dim E >= 1, got {wo.shape}")
    E = wo.shape[0]
    if E % H != 0:
        raise ValueError(f"state: embed_dim {E} (output_linear) is not a multiple of the {H} heads")
    d = E // H
    for h in range(H):
        for p in "qkv":
            _check_shape(s[f"heads.{h}.{p}.weight"], (d, E), f"heads.{h}.{p}.weight")
            _check_shape(s[f"heads.{h}.{p}.bias"], (d,), f"heads.{h}.{p}.bias")
    _check_shape(s["output_linear.bias"], (E,), "output_linear.bias")
    s = _floats(s)
    cat = lambda p, t: np.concatenate([s[f"heads.{h}.{p}.{t}"] for h in range(H)], axis=0)  # noqa: E731
    return _pack(cat("q", "weight"), cat("k", "weight"), cat("v", "weight"), cat("q", "bias"), cat("k", "bias"),
                 cat("v", "bias"), s["output_linear.weight"], s["output_linear.bias"])


def to_per_head(state, num_heads: int) -> dict[str, np.ndarray]:
    """Our MHA state_dict -> The encoder tutorial's per-head names (the reverse of :func:`from_per_head`).

    Args:
        state: ``in_proj_weight (3E, E)``, ``in_proj_bias (3E)``, ``out_proj.weight (E, E)``,
            ``out_proj.bias (E)`` (a bias-free state gives zero biases: the tutorial's Linears
            always have one).
        num_heads: H (not recoverable from the shapes); must divide E.

    Returns:
        ``heads.{h}.{q,k,v}.{weight (d, E), bias (d)}`` for h < H and
        ``output_linear.{weight, bias}``.

    Raises:
        TypeError: non-mapping ``state``, non-int ``num_heads``. ValueError: wrong names or
            shapes, ``num_heads`` < 1 or not dividing E.
    """
    num_heads = check_positive_int(num_heads, "num_heads")
    s, E = _mha(state, num_heads)
    d = E // num_heads
    w, b = s["in_proj_weight"], s["in_proj_bias"]
    out = {}
    for h in range(num_heads):
        for j, p in enumerate("qkv"):
            rows = slice(j * E + h * d, j * E + (h + 1) * d)
            out[f"heads.{h}.{p}.weight"] = w[rows].copy()
            out[f"heads.{h}.{p}.bias"] = b[rows].copy()
    out["output_linear.weight"] = s["out_proj.weight"].copy()
    out["output_linear.bias"] = s["out_proj.bias"].copy()
    return out


# --------------------------------------------------------------------------------------------------
# 2. Split heads of one projection
# --------------------------------------------------------------------------------------------------


def from_split_heads(state) -> dict[str, np.ndarray]:
    """The tutorials' split-heads ``SelfAttention`` (``W_q, W_k, W_v, W_o``) or ``MultiHeadAttention``
    (``q_linear, k_linear, v_linear, out_linear``) state_dict -> our MHA state_dict.

    Each is an ``nn.Linear(E, E)`` (``.weight (E, E)``, ``.bias (E)``) whose output is viewed as
    ``(N, L, H, d)``; our ``in_proj_weight`` is ``[W_q.weight; W_k.weight; W_v.weight]``.
    The naming is detected from the keys. The split into heads is a view of the same rows, so H
    is not needed here: ``nn.MultiheadAttention(E, H)`` with the tutorial's H computes the same.

    Args:
        state: mapping with exactly the eight names of one naming: ``W_q.weight (E, E)``,
            ``W_q.bias (E)``, likewise ``W_k``, ``W_v``, ``W_o``; or ``q_linear``, ``k_linear``,
            ``v_linear``, ``out_linear`` with the same shapes. Arrays or torch tensors.

    Returns:
        ``{"in_proj_weight" (3E, E), "in_proj_bias" (3E), "out_proj.weight" (E, E),
        "out_proj.bias" (E)}``, new numpy arrays (float64 stays float64, other dtypes float32).

    Raises:
        TypeError: non-mapping ``state``, non-numeric values. ValueError: neither naming matches
            exactly (missing / unknown names), or shapes are not ``(E, E)`` / ``(E,)`` with
            ``E >= 1``.
    """
    s = _arrays(state)
    for naming, names in _SPLIT_NAMES.items():
        if f"{names[0]}.weight" in s:
            break
    else:
        raise ValueError(f"state: expected W_q/W_k/W_v/W_o or "
                         f"q_linear/k_linear/v_linear/out_linear keys, got {sorted(s)}")
    _check_keys(s, [f"{n}.{t}" for n in names for t in ("weight", "bias")])
    first = s[f"{names[0]}.weight"]
    if first.ndim != 2 or first.shape[0] != first.shape[1] or first.shape[0] == 0:
        raise ValueError(f"state['{names[0]}.weight']: expected shape (E, E) with embed_dim E >= 1, got {first.shape}")
    E = first.shape[0]
    for n in names:
        _check_shape(s[f"{n}.weight"], (E, E), f"{n}.weight")
        _check_shape(s[f"{n}.bias"], (E,), f"{n}.bias")
    s = _floats(s)
    q, k, v, o = names
    return _pack(s[f"{q}.weight"], s[f"{k}.weight"], s[f"{v}.weight"], s[f"{q}.bias"], s[f"{k}.bias"],
                 s[f"{v}.bias"], s[f"{o}.weight"], s[f"{o}.bias"])


def to_split_heads(state, naming: str = "W_q") -> dict[str, np.ndarray]:
    """Our MHA state_dict -> the tutorials' split-heads names (``naming="W_q"``: ``W_q, W_k, W_v, W_o``)
    or (``"q_linear"``: ``q_linear, k_linear, v_linear, out_linear``) names; the reverse of
    :func:`from_split_heads`. A bias-free state gives zero biases.

    Args:
        state: ``in_proj_weight (3E, E)``, ``in_proj_bias (3E)``, ``out_proj.weight (E, E)``,
            ``out_proj.bias (E)`` (both biases absent: a bias-free MHA, zero biases given; the
            tutorials' Linears always have one).
        naming: ``"W_q"`` (default) or ``"q_linear"``.

    Returns:
        ``{"W_q.weight" (E, E), "W_q.bias" (E), ..., "W_o.weight" (E, E), "W_o.bias" (E)}`` (or
        the ``q_linear`` .. ``out_linear`` names): eight new numpy arrays, Q/K/V being the three
        ``E``-row blocks of ``in_proj_weight`` / ``in_proj_bias`` in order, the output Linear
        ``out_proj``; float64 stays float64, other dtypes float32.

    Raises:
        TypeError: non-mapping ``state``, non-numeric values, ``naming`` not a str.
        ValueError: unknown ``naming``, wrong names or shapes.
    """
    naming = check_choice(naming, "naming", tuple(_SPLIT_NAMES))
    s, E = _mha(state)
    q, k, v, o = _SPLIT_NAMES[naming]
    w, b = s["in_proj_weight"], s["in_proj_bias"]
    out = {}
    for j, n in enumerate((q, k, v)):
        out[f"{n}.weight"] = w[j * E:(j + 1) * E].copy()
        out[f"{n}.bias"] = b[j * E:(j + 1) * E].copy()
    out[f"{o}.weight"] = s["out_proj.weight"].copy()
    out[f"{o}.bias"] = s["out_proj.bias"].copy()
    return out


# --------------------------------------------------------------------------------------------------
# 3. einsum with shared per-head Linears (the einsum tutorial)
# --------------------------------------------------------------------------------------------------


def _einsum_fc_out(s: dict, num_heads: int) -> int:
    wo = s["fc_out.weight"]
    if wo.ndim != 2 or wo.shape[0] != wo.shape[1] or wo.shape[0] == 0:
        raise ValueError(f"state['fc_out.weight']: expected shape (E, E) with embed_dim E >= 1, got {wo.shape}")
    E = wo.shape[0]
    if E % num_heads != 0:
        raise ValueError(f"num_heads: expected a divisor of embed_dim {E} (fc_out), got {num_heads}")
    _check_shape(s["fc_out.bias"], (E,), "fc_out.bias")
    return E


def from_einsum_shared(state, num_heads: int) -> dict[str, np.ndarray]:
    """The einsum tutorial's einsum ``SelfAttention``, **as intended** (the shared per-head Linears applied
    to every head's slice) -> our MHA state_dict::

        W_Q = kron(I_H, queries.weight) = diag(queries.weight, ..., queries.weight)   (E, E)

    likewise ``W_K`` (``keys``), ``W_V`` (``values``); zero in-projection biases (the tutorial's
    Linears have ``bias=False``); ``out_proj = fc_out``.

    Args:
        state: ``queries.weight (d, d)``, ``keys.weight (d, d)``, ``values.weight (d, d)``,
            ``fc_out.weight (E, E)``, ``fc_out.bias (E)``.
        num_heads: H, with ``H · d = E``.

    Returns:
        ``{"in_proj_weight" (3E, E), "in_proj_bias" (3E), "out_proj.weight" (E, E),
        "out_proj.bias" (E)}``, for ``nn.MultiheadAttention(E, H)``: new numpy arrays, the
        in-projection block-diagonal as above and its bias zeros; each float64 where any of the
        weights it is made from is float64, else float32.

    Raises:
        TypeError: non-mapping ``state``, non-int ``num_heads``. ValueError: wrong names or
            shapes, ``H · d != E``.
    """
    num_heads = check_positive_int(num_heads, "num_heads")
    s = _arrays(state)
    _check_keys(s, ["values.weight", "keys.weight", "queries.weight", "fc_out.weight", "fc_out.bias"])
    E = _einsum_fc_out(s, num_heads)
    d = E // num_heads
    for n in ("queries", "keys", "values"):
        _check_shape(s[f"{n}.weight"], (d, d), f"{n}.weight")
    s = _floats(s)
    # the identity in the projections' dtype: each result's dtype is that of the weights it is made from
    eye = np.eye(num_heads, dtype=np.result_type(*(s[f"{n}.weight"] for n in ("queries", "keys", "values"))))
    blocks = [np.kron(eye, s[f"{n}.weight"]) for n in ("queries", "keys", "values")]
    zeros = np.zeros(E, blocks[0].dtype)
    return _pack(*blocks, zeros, zeros, zeros, s["fc_out.weight"], s["fc_out.bias"])


def from_einsum_as_written(state, num_heads: int) -> dict[str, np.ndarray]:
    """The einsum tutorial's einsum ``SelfAttention`` **as written** -> our MHA state_dict.

    The listing's ``forward`` never applies ``self.values/keys/queries``, so its Q, K, V are the
    (head-split) inputs: ``in_proj_weight = [I_E; I_E; I_E]``, zero ``in_proj_bias``,
    ``out_proj = fc_out``. The three unused ``(d, d)`` weights are accepted (a full state_dict of
    the tutorial's module loads) and ignored.

    Args:
        state: ``fc_out.weight (E, E)``, ``fc_out.bias (E)``, and optionally the unused
            ``queries.weight``, ``keys.weight``, ``values.weight``.
        num_heads: H, dividing E (only checked: identity projections do not depend on it).

    Returns:
        ``{"in_proj_weight" (3E, E), "in_proj_bias" (3E), "out_proj.weight" (E, E),
        "out_proj.bias" (E)}``, for ``nn.MultiheadAttention(E, H)``: new numpy arrays, the
        in-projection ``[I_E; I_E; I_E]`` and its bias zeros in ``fc_out.weight``'s dtype (the
        listing's own projections are unused), the out-projection in its weights' (float64 stays
        float64, other dtypes float32).

    Raises:
        TypeError / ValueError: as :func:`from_einsum_shared`.
    """
    num_heads = check_positive_int(num_heads, "num_heads")
    s = _arrays(state)
    unused = [k for k in ("values.weight", "keys.weight", "queries.weight") if k in s]
    _check_keys(s, ["fc_out.weight", "fc_out.bias", *unused])
    E = _einsum_fc_out(s, num_heads)
    s = _floats(s)
    eye = np.eye(E, dtype=s["fc_out.weight"].dtype)
    zeros = np.zeros(E, eye.dtype)
    return _pack(eye, eye, eye, zeros, zeros, zeros, s["fc_out.weight"], s["fc_out.bias"])


def to_einsum_shared(state, num_heads: int) -> dict[str, np.ndarray]:
    """Our MHA state_dict -> the einsum tutorial's names (the reverse of :func:`from_einsum_shared`).

    Only an MHA whose projections have the tutorial's structure converts: each of ``W_Q, W_K, W_V``
    block-diagonal with ``H`` equal ``(d, d)`` blocks, and zero in-projection biases (checked
    exactly).

    Args:
        state: ``in_proj_weight (3E, E)``, ``in_proj_bias (3E)`` (all zeros), ``out_proj.weight
            (E, E)``, ``out_proj.bias (E)`` (both biases absent: a bias-free MHA, zero biases).
        num_heads: H, dividing E; ``d = E / H``.

    Returns:
        ``{"queries.weight" (d, d), "keys.weight" (d, d), "values.weight" (d, d),
        "fc_out.weight" (E, E), "fc_out.bias" (E)}``: new numpy arrays, each ``(d, d)`` weight the
        first diagonal block of its projection; float64 stays float64, other dtypes float32.

    Raises:
        TypeError: non-mapping ``state``, non-int ``num_heads``. ValueError: wrong names or
            shapes, or projections that are not of that form (the message says which).
    """
    num_heads = check_positive_int(num_heads, "num_heads")
    s, E = _mha(state, num_heads)
    d = E // num_heads
    w, b = s["in_proj_weight"], s["in_proj_bias"]
    if np.any(b != 0):
        raise ValueError("state['in_proj_bias']: expected zeros (the einsum tutorial's Linears have no bias), got nonzero")
    out = {}
    for j, n in enumerate(("queries", "keys", "values")):
        block = w[j * E:(j + 1) * E]
        first = block[:d, :d]
        # the block-diagonal matrix of num_heads copies of the first block (NaN compared equal to NaN:
        # np.kron(eye, first) would put 0 · NaN = NaN off the diagonal)
        expected = np.zeros_like(block)
        for h in range(num_heads):
            expected[h * d:(h + 1) * d, h * d:(h + 1) * d] = first
        if not np.array_equal(block, expected, equal_nan=True):
            raise ValueError(f"state['in_proj_weight']: the {'qkv'[j]} projection is not block-diagonal with "
                             f"{num_heads} equal ({d}, {d}) blocks, so it has no einsum-tutorial form")
        out[f"{n}.weight"] = first.copy()
    out["fc_out.weight"] = s["out_proj.weight"].copy()
    out["fc_out.bias"] = s["out_proj.bias"].copy()
    return out
