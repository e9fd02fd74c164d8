"""Forward ops that training needs and inference did not: RMSNorm, SiLU, gated units (SwiGLU,
GeGLU), dropout driven by a seed, and cross-entropy with ``ignore_index`` and label smoothing.

Conventions as in :mod:`transformer_core.functional`: array-likes are converted once (float64 stays
float64, any other real dtype becomes float32, non-contiguous inputs are copied), arguments are
checked before anything is computed (``TypeError`` / ``ValueError`` naming the argument, expected vs
got), and results are new numpy arrays computed by the C++ core with the GIL released. Their
backward passes are in :mod:`transformer_core.backward`.
"""

from __future__ import annotations

import numbers

import numpy as np

from ._runtime import variant
from ._validation import as_float

__all__ = ["rms_norm", "silu", "glu", "dropout", "cross_entropy"]

#: The activations of :func:`glu` (and of ``backward.glu_backward``).
GLU_ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu")


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps: expected a float, got {type(eps).__name__}")
    if not eps >= 0:
        raise ValueError(f"eps: expected a value >= 0, got {eps}")
    return float(eps)


def _check_weight(weight, name: str, n: int, dtype):
    if weight is None:
        return None
    w = as_float(weight, name, dtype, ndim=1)
    if w.shape != (n,):
        raise ValueError(f"{name}: expected shape ({n},) to match x's last dim, got {w.shape}")
    return w


def rms_norm(x, weight=None, eps: float = 1e-6) -> np.ndarray:
    """Root-mean-square layer normalisation over the last dim (Zhang & Sennrich 2019; Llama's
    ``LlamaRMSNorm``, torch's ``F.rms_norm`` with ``normalized_shape = (E,)``)::

        y = x / sqrt(mean(x²) + eps) · weight

    The mean of squares is accumulated in double.

    Args:
        x: ``(..., E)`` float array.
        weight: ``(E,)`` or None (no scale).
        eps: added to the mean of squares, >= 0 (Llama: 1e-6 or 1e-5; torch's default is the
            dtype's machine epsilon, so pass it explicitly when comparing).

    Returns:
        ``(..., E)``, dtype of ``x`` (float32 unless float64).

    Raises:
        ValueError: empty ``x`` or rank 0; ``weight`` not of shape ``(E,)``; ``eps`` < 0.
        TypeError: non-numeric arrays, ``eps`` not a real number.
    """
    x = as_float(x, "x", min_ndim=1)
    e = x.shape[-1]
    w = _check_weight(weight, "weight", e, x.dtype.type)
    eps = _check_eps(eps)
    return variant("rms_norm", x.dtype.type)(x.reshape(-1, e), w, eps).reshape(x.shape)


def silu(x) -> np.ndarray:
    """SiLU / swish (Elfwing et al. 2018), as ``torch.nn.functional.silu``: ``x · σ(x) = x / (1 + e⁻ˣ)``.

    Returns:
        Same shape and dtype as ``x`` (float32 unless float64).

    Raises:
        ValueError: empty ``x``. TypeError: non-numeric ``x``.
    """
    x = as_float(x, "x")
    return variant("activation_forward", x.dtype.type)(x, "silu")


def _check_activation(activation) -> str:
    if activation not in GLU_ACTIVATIONS:
        raise ValueError(f"activation: expected one of {GLU_ACTIVATIONS}, got {activation!r}")
    return activation


def _gate_up(gate, up):
    g = as_float(gate, "gate")
    u = as_float(up, "up", g.dtype.type)
    if u.shape != g.shape:
        raise ValueError(f"up: expected the shape of gate {g.shape}, got {u.shape}")
    return g, u


def glu(gate, up, activation: str = "silu") -> np.ndarray:
    """Gated linear unit of the feed-forward layer (Shazeer 2020, "GLU Variants Improve Transformer";
    Llama's MLP is ``down_proj(silu(gate_proj(x)) · up_proj(x))``)::

        h = act(gate) · up        act: "silu" (SwiGLU), "gelu" / "gelu_tanh" (GeGLU), "relu" (ReGLU)

    Args:
        gate, up: float arrays of the same shape, e.g. ``(N, L, dim_feedforward)``.
        activation: one of ``"silu"``, ``"gelu"``, ``"gelu_tanh"``, ``"relu"``.

    Returns:
        The shape of ``gate``, its dtype (float32 unless float64).

    Raises:
        ValueError: shapes differ, empty arrays, unknown ``activation``. TypeError: non-numeric arrays.
    """
    activation = _check_activation(activation)
    g, u = _gate_up(gate, up)
    return variant("glu", g.dtype.type)(g, u, activation)


def _check_p(p) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"p: expected a float in [0, 1], got {type(p).__name__}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p: expected a probability in [0, 1], got {p}")
    return float(p)


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed: expected an int in [0, 2**64), got {seed}")
    return int(seed)


def dropout(x, p: float, seed: int, training: bool = True) -> np.ndarray:
    """Inverted dropout (Srivastava et al. 2014), as ``torch.nn.functional.dropout``, with the mask
    drawn from a counter-based generator (Philox4x32-10, Salmon et al. 2011) keyed by ``seed``::

        keep_i = u_i >= p,   u_i = Philox(seed, i) / 2³²,    y_i = keep_i ? x_i / (1 - p) : 0

    The mask depends only on ``(seed, flat index i)``: not on the thread count, and
    ``backward.dropout_backward`` regenerates it from the same seed instead of storing it. It is not
    torch's mask (torch draws from its own generator); its statistics are the same. Use a different
    seed for every call (e.g. one per layer and step).

    Args:
        x: float array of any shape.
        p: the probability of dropping an element, in [0, 1] (1: zeros, as torch).
        seed: an int in [0, 2**64).
        training: False returns a copy of ``x`` (no dropout), as ``F.dropout(training=False)``.

    Returns:
        Same shape and dtype as ``x`` (float32 unless float64).

    Raises:
        ValueError: ``p`` outside [0, 1], ``seed`` out of range, empty ``x``.
        TypeError: non-numeric ``x``, ``p`` not a real number, ``seed`` not an int.
    """
    x = as_float(x, "x")
    p = _check_p(p)
    seed = _check_seed(seed)
    if not training:
        return x.copy()
    return variant("dropout", x.dtype.type)(x, p, seed)


def _check_reduction(reduction) -> str:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction: expected 'mean', 'sum' or 'none', got {reduction!r}")
    return reduction


def _cross_entropy_args(logits, target, ignore_index, label_smoothing, reduction):
    """Checks and converts the arguments of the cross-entropy functions: returns
    ``(logits2d [rows, V], target1d [rows] int64, lead shape, ignore_index, label_smoothing, reduction)``."""
    reduction = _check_reduction(reduction)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
        raise TypeError(f"ignore_index: expected an int, got {type(ignore_index).__name__}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, numbers.Real):
        raise TypeError(f"label_smoothing: expected a float in [0, 1], got {type(label_smoothing).__name__}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing: expected a value in [0, 1], got {label_smoothing}")
    x = as_float(logits, "logits", min_ndim=1)
    t = np.asarray(target)
    if t.dtype.kind not in "iu":
        raise TypeError(f"target: expected integer class indices, got dtype {t.dtype}")
    lead, V = x.shape[:-1], x.shape[-1]
    if t.shape != lead:
        raise ValueError(f"target: expected shape {lead} (logits' shape without the class dim), got {t.shape}")
    t = np.ascontiguousarray(t, dtype=np.int64)
    bad = (t != ignore_index) & ((t < 0) | (t >= V))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"target: expected class indices in [0, {V}) or ignore_index ({ignore_index}), "
                         f"got {int(t[where])} at index {where}")
    return x.reshape(-1, V), t.reshape(-1), lead, int(ignore_index), float(label_smoothing), reduction


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
    is 0 (torch returns NaN, 0/0), so a batch of padding cannot poison a running loss. A NaN (or
    inf) logit gives a NaN loss, returned as is: check it (``np.isfinite``) before stepping.

    Args:
        logits: ``(..., V)`` float array (not empty).
        target: ``(...)`` integer array, values in ``[0, V)`` or ``ignore_index``.
        ignore_index: target value whose rows count neither in the loss nor in the mean.
        label_smoothing: ε in [0, 1].
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Returns:
        ``"mean"``/``"sum"``: a numpy scalar of the logits' dtype (float32 unless float64);
        ``"none"``: an array of ``target``'s shape. Sums are accumulated in double.

    Raises:
        ValueError: target of the wrong shape or with an index out of range, ``label_smoothing``
            outside [0, 1], unknown ``reduction``, empty ``logits``.
        TypeError: non-integer ``target``, non-numeric ``logits``, non-int ``ignore_index``.
    """
    x, t, lead, ignore_index, label_smoothing, reduction = _cross_entropy_args(
        logits, target, ignore_index, label_smoothing, reduction)
    loss, _, _ = variant("cross_entropy", x.dtype.type)(x, t, ignore_index, label_smoothing, reduction, 1.0, None,
                                                         False)
    if reduction == "none":
        return loss.reshape(lead)
    return x.dtype.type(loss)
