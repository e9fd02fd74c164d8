"""Backward passes of the functional ops: given an op's inputs and the gradient of a loss with
respect to its output, the gradients with respect to its inputs and parameters (llm.c's layout: one
explicit backward per layer). Every result equals ``torch.autograd``'s for the same forward (the
tests compare them: fp64 to 1e-10, fp32 to 1e-4 relative).

Conventions: arguments are checked first (``TypeError`` / ``ValueError`` naming the argument,
expected vs got: the scalars, then the dtypes, ranks and shapes of the arrays as given), then
array-likes are converted once (float16, integer, non-contiguous inputs are copied): a bad call is
refused before any copy is made. The C++ core computes with the GIL released.

Dtypes follow ``functional``'s rule: a backward computes in float64 if ANY of its float data
arguments (the forward's inputs, weights, outputs, and the output gradient) is float64 or a wider
float, else in float32 (float16, float32, integers), and every gradient it returns has that dtype;
a float64 argument is never narrowed to another's float32 (except ``rotary_backward``'s cos/sin
tables, which follow ``grad_output``'s dtype, as its docstring says). Parameter gradients can be accumulated
in place: pass ``grad_weight=`` / ``grad_bias=`` arrays (C-contiguous, writeable, of that compute
dtype and the parameter's shape, sharing no memory with the op's inputs or with each other: the
kernels read those while they add, so an overlap is a ValueError) and the new gradient is ADDED to
them (gradient accumulation over micro-batches, tied weights); otherwise new arrays are returned.

Determinism: the sums over rows (weight and bias gradients, the embedding scatter-add, dK and dV of
attention) are each owned by one task and summed in a fixed order: the results are bitwise the same
for any thread count.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ._runtime import variant
from ._validation import (
    MAX_SIZE,
    as_float,
    as_ids,
    check_allocatable,
    check_bool,
    check_choice,
    check_eps,
    check_float,
    check_int,
    common_dtype,
    compute_dtype,
    grad_buffer,
    rotary_layout,
    to_numpy,
)
from ._validation import activation as activation_of
from ._validation import reduction as reduction_of
from .functional import (
    _as_4d,
    _as_dtype,
    _as_given,
    _attention_arrays,
    _attention_inputs,
    _attention_masks,
    _check_p,
    _check_scale,
    _check_seed,
    _cross_entropy_args,
    _dropped_times_zero,
    _gate_up,
    _given_scale,
    _logits_rows,
    _vector_given,
)
from .module import renamed_keyword
from .positional import _check_rotary, _rotate

__all__ = [
    "linear_backward",
    "layer_norm_backward",
    "rms_norm_backward",
    "gelu_backward",
    "silu_backward",
    "relu_backward",
    "glu_backward",
    "softmax_backward",
    "embedding_backward",
    "rotary_backward",
    "dropout_backward",
    "cross_entropy_backward",
    "cross_entropy_with_grad",
    "scaled_dot_product_attention_backward",
]


_grad_buffer = grad_buffer


def _read_once(value, name: str):
    """``value`` as numpy reads it (:func:`to_numpy`; None stays None), before both the dtype rule
    (``common_dtype``) and the shape check (:func:`_grad_given`) look at it: a list is parsed, a
    torch bfloat16 tensor widened, once."""
    return None if value is None else to_numpy(value, name)


def _grad_given(grad_output: np.ndarray, name: str, shape: tuple, dtype, allow_empty: bool = False,
                of: str = "x") -> np.ndarray:
    """``grad_output`` as given (as ``common_dtype`` returns it: its dtype checked, not converted),
    checked to be of ``shape`` (the shape the op's output has for its input ``of``) before its copy
    to ``dtype``."""
    g = _as_given(grad_output, name, dtype, allow_empty=allow_empty)
    if g.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)} (the op's output for {of}), got {g.shape}")
    return g


# --------------------------------------------------------------------------------------------------
# Linear
# --------------------------------------------------------------------------------------------------

def linear_backward(x, weight, grad_output, bias: bool = True, *, grad_weight=None, grad_bias=None,
                    need_grad_input: bool = True, weight_layout: str = "out_in"):
    """Backward of ``y = x Wᵀ + b`` (``functional.linear``, torch's ``nn.Linear``)::

        grad_x = grad_y · W,    grad_W (+)= grad_yᵀ · x,    grad_b (+)= Σ_rows grad_y

    Fixed tiles of single-threaded GEMMs (our kernels for fp32, OpenBLAS for fp64), each output
    tile owned by one task; the weight gradient sums all rows of a tile in one task: bitwise the
    same for any thread count.

    Args:
        x: ``(..., in_features)``, the forward's input.
        weight: ``(out_features, in_features)`` (torch), or ``(in_features, out_features)`` with
            ``weight_layout="in_out"`` (Hugging Face's Conv1D, GPT-2: ``y = x W + b``).
        grad_output: ``(..., out_features)``, the gradient of the loss w.r.t. ``y``.
        bias: whether the layer has a bias (then ``grad_bias`` is computed).
        grad_weight, grad_bias: arrays to ADD the gradients into, in place (see the module doc);
            None: new arrays. Giving either accumulates into both (a missing one starts at zeros).
        need_grad_input: False skips ``grad_x`` (returned as None), e.g. for a first layer.
        weight_layout: ``"out_in"`` or ``"in_out"``.

    Returns:
        ``(grad_x (..., in_features) or None, grad_weight (weight's shape), grad_bias
        (out_features,) or None)``, float64 if any of ``x``, ``weight``, ``grad_output`` is float64
        (or wider), else float32.

    Raises:
        ValueError: shapes that do not match (``weight`` not 2-D, feature sizes, leading dims of
            ``grad_output`` unlike ``x``'s), accumulation buffers of the wrong shape, not
            writeable/contiguous, or sharing memory with ``x``, ``weight``, ``grad_output`` or each
            other, unknown ``weight_layout``.
        TypeError: non-numeric arrays; buffers of another dtype.
    """
    weight_layout = check_choice(weight_layout, "weight_layout", ("out_in", "in_out"))
    bias = check_bool(bias, "bias")
    need_grad_input = check_bool(need_grad_input, "need_grad_input")
    dtype, (x, weight, grad_output) = common_dtype((x, "x"), (weight, "weight"), (grad_output, "grad_output"))
    x = _as_given(x, "x", dtype, min_ndim=1, allow_empty=True)  # every shape is checked before any copy
    w = _as_given(weight, "weight", dtype, ndim=2, allow_empty=True)
    in_features = x.shape[-1]
    w_in_out = weight_layout == "in_out"
    w_in = w.shape[0] if w_in_out else w.shape[1]
    if w_in != in_features:
        expected = f"({in_features}, out_features)" if w_in_out else f"(out_features, {in_features})"
        raise ValueError(f"weight: expected shape {expected} to match x's last dim, got {w.shape}")
    out_features = w.shape[1] if w_in_out else w.shape[0]
    g = _grad_given(grad_output, "grad_output", x.shape[:-1] + (out_features,), dtype, allow_empty=True,
                    of="x, weight")
    read = ((x, "x"), (w, "weight"), (g, "grad_output"))  # what the kernels read while they add into the buffers
    gw = _grad_buffer(grad_weight, "grad_weight", w.shape, dtype, read)
    gb = _grad_buffer(grad_bias, "grad_bias", (out_features,), dtype, read + ((gw, "grad_weight"),)) if bias else None
    if grad_bias is not None and not bias:
        raise ValueError("grad_bias: given for a layer without bias (bias=False)")
    x, w, g = _as_dtype(x, "x", dtype), _as_dtype(w, "weight", dtype), _as_dtype(g, "grad_output", dtype)
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    gx, gw, gb = variant("linear_backward", dtype)(
        x.reshape(rows, in_features), w, g.reshape(rows, out_features), need_grad_input, bias, gw, gb, w_in_out)
    if gx is not None:
        gx = gx.reshape(x.shape)
    return gx, gw, gb


# --------------------------------------------------------------------------------------------------
# Normalisation
# --------------------------------------------------------------------------------------------------

def layer_norm_backward(x, weight, grad_output, eps: float = 1e-5, bias: bool = True, *, grad_weight=None,
                        grad_bias=None):
    """Backward of LayerNorm over the last dim (Ba et al. 2016; ``functional.layer_norm``)::

        x̂ = (x - mean) · rstd,   g = grad_y · weight
        grad_x = rstd · (g - mean(g) - x̂ · mean(g · x̂)),   grad_weight (+)= Σ_rows grad_y · x̂,
        grad_bias (+)= Σ_rows grad_y

    ``mean`` and ``rstd`` are recomputed from ``x`` (in double, as the forward computes them).

    Args:
        x: ``(..., E)``, the forward's input.
        weight: ``(E,)`` or None (no affine: only ``grad_x`` is computed).
        grad_output: ``(..., E)``.
        eps: the forward's eps (>= 0).
        bias: whether the LayerNorm has a bias (with ``weight``).
        grad_weight, grad_bias: arrays to add the gradients into, in place; None: new arrays.

    Returns:
        ``(grad_x (..., E), grad_weight (E,) or None, grad_bias (E,) or None)``, float64 if any of
        ``x``, ``weight``, ``grad_output`` is float64 (or wider), else float32.

    Raises:
        ValueError: shapes that do not match, ``eps`` < 0, empty ``x``, bad buffers (of another shape,
            not writeable/contiguous, sharing memory with ``x``, ``weight``, ``grad_output`` or each other).
        TypeError: non-numeric arrays, buffers of another dtype.
    """
    eps, bias = check_eps(eps, "eps"), check_bool(bias, "bias")  # the scalars, the shapes, then the copies
    dtype, (x, weight, grad_output) = common_dtype((x, "x"), (weight, "weight"), (grad_output, "grad_output"))
    x = _as_given(x, "x", dtype, min_ndim=1)
    e = x.shape[-1]
    w = _vector_given(weight, "weight", e, dtype)
    g = _grad_given(grad_output, "grad_output", x.shape, dtype)
    if w is None and (grad_weight is not None or grad_bias is not None):
        raise ValueError("grad_weight, grad_bias: given for a LayerNorm without weight (weight=None)")
    read = ((x, "x"), (w, "weight"), (g, "grad_output"))  # what the kernel reads while it adds into the buffers
    gw = _grad_buffer(grad_weight, "grad_weight", (e,), dtype, read)
    gb = _grad_buffer(grad_bias, "grad_bias", (e,), dtype, read + ((gw, "grad_weight"),)) if bias else None
    if grad_bias is not None and not bias:
        raise ValueError("grad_bias: given for a LayerNorm without bias (bias=False)")
    x, w, g = _as_dtype(x, "x", dtype), _as_dtype(w, "weight", dtype), _as_dtype(g, "grad_output", dtype)
    if w is not None and (gw is None) != (gb is None) and bias:
        # accumulate both or neither: the missing one starts at zeros
        gw = np.zeros(e, dtype) if gw is None else gw
        gb = np.zeros(e, dtype) if gb is None else gb
    gx, gw, gb = variant("layer_norm_backward", dtype)(x.reshape(-1, e), w, g.reshape(-1, e), eps, bias, gw, gb)
    return gx.reshape(x.shape), gw, gb


def rms_norm_backward(x, weight, grad_output, eps: float | None = None, *, grad_weight=None):
    """Backward of RMSNorm (``functional.rms_norm``; Zhang & Sennrich 2019)::

        r = 1 / sqrt(mean(x²) + eps),   g = grad_y · weight
        grad_x = r · (g - x · r² · mean(g · x)),   grad_weight (+)= Σ_rows grad_y · x · r

    Args:
        x: ``(..., E)``, the forward's input.
        weight: ``(E,)`` or None (no scale: only ``grad_x``).
        grad_output: ``(..., E)``.
        eps: the forward's eps (a finite number >= 0); None (the default, as
            ``functional.rms_norm``'s and torch's): ``np.finfo(dtype).eps`` of the compute dtype.
        grad_weight: array to add the weight gradient into, in place; None: a new array.

    Returns:
        ``(grad_x (..., E), grad_weight (E,) or None)``, float64 if any of ``x``, ``weight``,
        ``grad_output`` is float64 (or wider), else float32.

    Raises:
        ValueError: shapes that do not match, ``eps`` negative, infinite or NaN, empty ``x``, a bad
            buffer (of another shape, not writeable/contiguous, sharing memory with ``x``, ``weight``
            or ``grad_output``).
        TypeError: non-numeric arrays, ``eps`` not a number (nor None), a buffer of another dtype.
    """
    eps = None if eps is None else check_eps(eps, "eps")  # the scalar, the shapes, then the copies
    dtype, (x, weight, grad_output) = common_dtype((x, "x"), (weight, "weight"), (grad_output, "grad_output"))
    x = _as_given(x, "x", dtype, min_ndim=1)
    e = x.shape[-1]
    w = _vector_given(weight, "weight", e, dtype)
    g = _grad_given(grad_output, "grad_output", x.shape, dtype)
    if w is None and grad_weight is not None:
        raise ValueError("grad_weight: given for an RMSNorm without weight (weight=None)")
    gw = _grad_buffer(grad_weight, "grad_weight", (e,), dtype, ((x, "x"), (w, "weight"), (g, "grad_output")))
    x, w, g = _as_dtype(x, "x", dtype), _as_dtype(w, "weight", dtype), _as_dtype(g, "grad_output", dtype)
    eps = float(np.finfo(dtype).eps) if eps is None else eps
    gx, gw = variant("rms_norm_backward", dtype)(x.reshape(-1, e), w, g.reshape(-1, e), eps, gw)
    return gx.reshape(x.shape), gw


# --------------------------------------------------------------------------------------------------
# Activations and gated units
# --------------------------------------------------------------------------------------------------

def _activation_backward(x, grad_output, name: str) -> np.ndarray:
    dtype, (x, grad_output) = common_dtype((x, "x"), (grad_output, "grad_output"))
    x = _as_given(x, "x", dtype)
    g = _grad_given(grad_output, "grad_output", x.shape, dtype)
    return variant("activation_backward", dtype)(_as_dtype(x, "x", dtype), _as_dtype(g, "grad_output", dtype), name)


def gelu_backward(x, grad_output, approximate: str = "none") -> np.ndarray:
    """Backward of GELU (``functional.gelu``; Hendrycks & Gimpel 2016)::

        "none":  grad_x = grad_y · (Φ(x) + x φ(x)),   Φ(x) = ½ (1 + erf(x/√2)),  φ(x) = e^(-x²/2)/√(2π)
        "tanh":  grad_x = grad_y · (½ (1 + tanh u) + ½ x (1 - tanh² u) √(2/π) (1 + 3 · 0.044715 x²)),
                 u = √(2/π) (x + 0.044715 x³)

    Args:
        x: the forward's input, any shape.  grad_output: same shape.
        approximate: ``"none"`` or ``"tanh"``.

    Returns:
        ``grad_x``, the shape of ``x``; float64 if ``x`` or ``grad_output`` is float64 (or wider),
        else float32.

    Raises:
        ValueError: shapes differ, empty ``x``, unknown ``approximate``. TypeError: non-numeric arrays.
    """
    approximate = check_choice(approximate, "approximate", ("none", "tanh"))
    return _activation_backward(x, grad_output, "gelu" if approximate == "none" else "gelu_tanh")


def silu_backward(x, grad_output) -> np.ndarray:
    """Backward of SiLU (``functional.silu``): ``grad_x = grad_y · σ(x) (1 + x (1 - σ(x)))``.

    Args: ``x`` the forward's input, any shape; ``grad_output`` the same shape.
    Returns: ``grad_x``, the shape of ``x``; float64 if ``x`` or ``grad_output`` is float64 (or
    wider), else float32.
    Raises: ValueError (shapes differ, empty), TypeError (non-numeric).
    """
    return _activation_backward(x, grad_output, "silu")


def relu_backward(x, grad_output) -> np.ndarray:
    """Backward of ReLU (``functional.relu``): ``grad_x = grad_y`` where ``x > 0``, else 0 (torch's
    ``threshold_backward``: a NaN input passes the gradient through).

    Args: ``x`` the forward's input, any shape; ``grad_output`` the same shape.
    Returns: ``grad_x``, the shape of ``x``; float64 if ``x`` or ``grad_output`` is float64 (or
    wider), else float32.
    Raises: ValueError (shapes differ, empty), TypeError (non-numeric).
    """
    return _activation_backward(x, grad_output, "relu")


def glu_backward(gate, up, grad_output, activation: str = "silu"):
    """Backward of the gated unit ``h = act(gate) · up`` (``functional.glu``; SwiGLU,
    GeGLU: Shazeer 2020)::

        grad_up = grad_h · act(gate),    grad_gate = grad_h · up · act'(gate)

    Args:
        gate, up: the forward's inputs, the same shape.  grad_output: ``grad_h``, the same shape.
        activation: a name of the library's table of activations (``_core.activation_names()``),
            as :func:`~transformer_core.functional.glu`'s: ``"silu"`` (= ``"swish"``), ``"gelu"``,
            ``"gelu_tanh"`` (= ``"gelu_new"``, ``"gelu_pytorch_tanh"``), ``"relu"`` or ``"tanh"``.

    Returns:
        ``(grad_gate, grad_up)``, the shape of ``gate``; float64 if any of ``gate``, ``up``,
        ``grad_output`` is float64 (or wider), else float32.

    Raises:
        ValueError: shapes differ, empty arrays, an ``activation`` not in the table (the message
        lists the names). TypeError: non-numeric arrays, an ``activation`` that is not a str.
    """
    activation_of(activation, "activation")
    grad_output = _read_once(grad_output, "grad_output")
    dtype, g, u = _gate_up(gate, up, ((grad_output, "grad_output"),))
    dh = _grad_given(grad_output, "grad_output", g.shape, dtype, of="gate, up")
    g, u, dh = _as_dtype(g, "gate", dtype), _as_dtype(u, "up", dtype), _as_dtype(dh, "grad_output", dtype)
    return variant("glu_backward", dtype)(g, u, dh, activation)


# --------------------------------------------------------------------------------------------------
# Softmax, embedding, rotary, dropout
# --------------------------------------------------------------------------------------------------

@renamed_keyword("axis", "dim", "torch's")
def softmax_backward(output, grad_output, dim: int = -1) -> np.ndarray:
    """Backward of softmax, from its OUTPUT ``p`` (``functional.softmax``)::

        grad_x = p ∘ (grad_p - Σ_dim p ∘ grad_p)

    A fully masked slice (``p = 0``) gives zeros.

    Args:
        output: the forward's output ``p``, any shape.  grad_output: the same shape.
        dim: the axis the softmax normalised over (torch's name). ``axis=``, its former name, is still
            taken for one release, with a ``DeprecationWarning``.

    Returns:
        ``grad_x``, the shape of ``output``; float64 if ``output`` or ``grad_output`` is float64 (or
        wider), else float32.

    Raises:
        ValueError: shapes differ, empty arrays, ``dim`` out of range.
        TypeError: non-numeric arrays, ``dim`` not an int, both ``dim=`` and ``axis=`` given.
    """
    dim = check_int(dim, "dim", None, None)  # its type before any array is copied; its range below
    dtype, (output, grad_output) = common_dtype((output, "output"), (grad_output, "grad_output"))
    p = _as_given(output, "output", dtype, min_ndim=1)
    dim = check_int(dim, "dim", -p.ndim, p.ndim - 1)
    g = _grad_given(grad_output, "grad_output", p.shape, dtype, of="output")
    p, g = _as_dtype(p, "output", dtype), _as_dtype(g, "grad_output", dtype)
    pm = np.ascontiguousarray(np.moveaxis(p, dim, -1))
    gm = np.ascontiguousarray(np.moveaxis(g, dim, -1))
    n = pm.shape[-1]
    dx = variant("softmax_backward", p.dtype.type)(pm.reshape(-1, n), gm.reshape(-1, n))
    return np.moveaxis(dx.reshape(pm.shape), -1, dim)


def embedding_backward(ids, grad_output, num_embeddings: int, padding_idx: int | None = None, *,
                       grad_weight=None) -> np.ndarray:
    """Backward of an embedding lookup ``y[..., :] = weight[ids[...], :]`` (``nn.Embedding``): a
    scatter-add of the rows of ``grad_output`` into the rows of the weight gradient::

        grad_weight[v] (+)= Σ_{positions p with ids[p] = v} grad_y[p]

    Deterministic without atomics: parallel over blocks of columns, each summing the positions in
    order. Rows with ``ids == padding_idx`` add nothing (torch's ``padding_idx``).

    Args:
        ids: integer array of any shape, values in ``[0, num_embeddings)``; a float array of whole
            numbers is taken too, as by ``nn.Embedding.forward`` and the models' ``input_ids``
            (the rule of ``_validation.as_ids``).
        grad_output: ``ids.shape + (embedding_dim,)`` float array.
        num_embeddings: V, the vocabulary size (rows of the weight).
        padding_idx: None, or an index in ``[-V, V)`` (negative counts from the end, as torch).
        grad_weight: ``(V, embedding_dim)`` array to add into, in place (e.g. tied input and output
            embeddings); None: a new array.

    Returns:
        ``grad_weight``, ``(V, embedding_dim)``; float64 if ``grad_output`` is float64 (or wider),
        else float32.
        Empty inputs are allowed, as torch's: no ids (``grad_output`` of shape ``ids.shape + (E,)``
        with ``ids.size == 0``) give zeros (or ``grad_weight`` unchanged), ``embedding_dim`` 0 an
        empty ``(V, 0)`` gradient.

    Raises:
        ValueError: ids out of range, shapes that do not match, bad ``padding_idx`` or buffer (one
            sharing memory with ``ids`` or ``grad_output`` too); a
            ``num_embeddings`` too large for even an empty ``(V, 0)`` numpy array, or a new gradient
            larger than this machine's memory.
        TypeError: ids neither integers nor whole-number floats (bool, complex, non-integral or
            non-finite floats), non-numeric ``grad_output``, non-int ``num_embeddings``.
    """
    V = check_int(num_embeddings, "num_embeddings", 1)
    pad = -1 if padding_idx is None else check_int(padding_idx, "padding_idx", -V, V - 1) % V
    t = to_numpy(ids, "ids")
    if t.dtype.kind not in "iuf":  # as_ids's dtypes; a float's values are checked by as_ids below
        raise TypeError(f"ids: expected integer token ids, got dtype {t.dtype}")
    g = to_numpy(grad_output, "grad_output")
    dtype = compute_dtype(g, "grad_output")
    g = _as_given(g, "grad_output", dtype, min_ndim=1, allow_empty=True)
    if g.shape[:-1] != t.shape:
        raise ValueError(f"grad_output: expected shape {t.shape} + (embedding_dim,) to match ids, got {g.shape}")
    # the gradient's table (V, H) before the ids' int64 copy: its checks need only shapes
    H = g.shape[-1]
    if H == 0 and V > MAX_SIZE // np.dtype(dtype).itemsize:  # numpy cannot make even an empty (V, 0) array
        raise ValueError(f"num_embeddings: expected at most {MAX_SIZE // np.dtype(dtype).itemsize} rows for a "
                         f"{np.dtype(dtype).name} gradient of embedding_dim 0 (numpy's largest axis), got {V}")
    gw = _grad_buffer(grad_weight, "grad_weight", (V, H), dtype, ((t, "ids"), (g, "grad_output")))
    if gw is None:  # a new (V, H) array: checked here, naming the argument (the binding's check says "H")
        check_allocatable((V, H), np.dtype(dtype).itemsize, "num_embeddings")
    if t.size:
        # converted (a copy checked against memory) before any flattening: ``reshape(-1)`` of a
        # broadcast view (``np.broadcast_to``, stride 0) would copy all of it, unchecked
        t = as_ids(t, "ids", ndim=max(t.ndim, 1)).reshape(t.shape)
    if t.size and (t.min() < 0 or t.max() >= V):
        bad = tuple(int(i) for i in np.argwhere((t < 0) | (t >= V))[0])
        raise ValueError(f"ids: expected values in [0, {V}), got {int(t[bad])} at index {bad}")
    g = _as_dtype(g, "grad_output", dtype)
    rows = t.size  # not reshape(-1, H): -1 is ambiguous for an empty grad_output (embedding_dim 0)
    t = np.ascontiguousarray(t, dtype=np.int64).reshape(rows)
    return variant("embedding_backward", dtype)(t, g.reshape(rows, H), V, pad, gw)


def rotary_backward(grad_output, cos, sin, layout: str = "half", unsqueeze_dim: int = 1) -> np.ndarray:
    """Backward of the rotary embedding (``positional.apply_rotary``; Su et al. 2021): the rotation
    ``y = R(θ) x`` is orthogonal, so ``grad_x = R(θ)ᵀ grad_y = R(-θ) grad_y``, computed as the exact
    transpose of the forward's formula (it also holds for tables whose halves differ)::

        half:         grad_x[i] = g[i] cos[i] + g[i+D/2] sin[i+D/2],  grad_x[i+D/2] = g[i+D/2] cos[i+D/2] - g[i] sin[i]
        interleaved:  grad_x[2i] = g[2i] c_i + g[2i+1] s_i,           grad_x[2i+1] = g[2i+1] c_i - g[2i] s_i

    Args:
        grad_output: ``(..., L, D)``, D even.
        cos, sin: the forward's tables, same shapes and conventions as ``apply_rotary``.
        layout: ``"half"`` or ``"interleaved"``.
        unsqueeze_dim: the forward's: where the head axis goes in tables of rank
            ``grad_output.ndim - 1`` (1 for ``(N, H, L, D)``, 2 for ``(N, L, H, D)``).

    Returns:
        ``grad_x``, the shape of ``grad_output``; float64 if ``grad_output`` is float64 (or wider),
        else float32: the tables follow it, as ``apply_rotary``'s follow ``x``. Tables that
        differ along a leading dim of ``grad_output`` and are broadcast along another (HF's
        ``(N, L, D)``) are read a block of rows at a time, as ``apply_rotary`` reads them: never
        copied to ``grad_output``'s size.

    Raises:
        ValueError: rank < 2, odd D, tables of another width or not broadcastable, unknown layout,
            ``unsqueeze_dim`` out of range.
        TypeError: non-numeric arrays; non-int ``unsqueeze_dim``.
    """
    layout = rotary_layout(layout)
    unsqueeze_dim = check_int(unsqueeze_dim, "unsqueeze_dim", None, None)
    g = to_numpy(grad_output, "grad_output")
    dtype = compute_dtype(g, "grad_output")
    g = _as_given(g, "grad_output", dtype, min_ndim=2)
    cos, sin = _check_rotary(g, cos, sin, unsqueeze_dim, "grad_output")  # D and the tables, before g's copy
    g = _as_dtype(g, "grad_output", dtype)
    return _rotate(variant("rotary_backward", g.dtype.type), g, cos, sin, layout, unsqueeze_dim, "grad_output")


def dropout_backward(grad_output, p: float, seed: int | None = None) -> np.ndarray:
    """Backward of ``functional.dropout``: ``grad_x = keep ? grad_y / (1 - p) : grad_y · 0`` (0, or
    NaN for a non-finite ``grad_y``, as torch's product with the scaled mask), with the
    mask regenerated from ``(seed, flat index)`` (Philox4x32-10): pass the forward's ``p`` and ``seed``.
    Where the forward drew no mask its backward is the identity: with ``p=0`` ``seed`` may be None,
    as in the forward. This function has no ``training`` flag: the gradient of a forward with
    ``training=False`` (and ``p > 0``) is ``grad_output`` itself.

    Args:
        grad_output: the gradient w.r.t. the dropout's output, the forward's shape.
        p: the forward's drop probability, in [0, 1].
        seed: the forward's seed, an int in [0, 2**64); None (the default) only with ``p=0``.

    Returns:
        ``grad_x``, the shape of ``grad_output``; float64 if it is float64 (or wider), else float32.

    Raises:
        ValueError: ``p`` outside [0, 1], ``seed`` out of range, ``seed`` None with ``p > 0``,
            empty input.
        TypeError: non-numeric ``grad_output``, ``p`` not a number, ``seed`` neither None nor an int.
    """
    p, seed = _check_p(p), _check_seed(seed)  # before any array is copied
    if seed is None and p > 0:
        raise ValueError(f"seed: the backward of a dropout with p > 0 (p={p}) regenerates the forward's mask from "
                         f"its seed: pass the seed the forward was given, got None")
    if seed is None:  # p == 0: every element kept, whatever the seed
        seed = 0
    g = as_float(grad_output, "grad_output")
    return _dropped_times_zero(g, variant("dropout", g.dtype.type)(g, p, seed), p)


# --------------------------------------------------------------------------------------------------
# Cross-entropy
# --------------------------------------------------------------------------------------------------

def _grad_scale(grad_output) -> float:
    """A scalar ``grad_output`` of cross-entropy (the gradient of the reduced loss: a number, or a
    0-d array or tensor of one) as a float. NaN and ±inf are taken, as torch's backward takes
    them (they reach the gradient: a NaN row is NaN, and ±inf gives ±inf or NaN per logit as
    torch's does without label smoothing; with smoothing torch adds two infinite terms and may give
    NaN where our one term gives ±inf); a number too large for a float (``10**400``) is a ValueError,
    anything else a TypeError, both naming ``grad_output``."""
    if getattr(grad_output, "ndim", None) == 0 and hasattr(grad_output, "__array__"):
        # a 0-d array-like (a torch scalar tensor, bfloat16 or requiring grad too): one value
        grad_output = to_numpy(grad_output, "grad_output")
    if isinstance(grad_output, np.ndarray) and grad_output.ndim == 0 and grad_output.dtype.kind in "iuf":
        grad_output = grad_output.item()
    if isinstance(grad_output, (bool, np.bool_)) or not isinstance(grad_output, numbers.Real):
        raise TypeError(f"grad_output: expected a scalar (the gradient of the reduced loss), got "
                        f"{type(grad_output).__name__}")
    if grad_output != grad_output:  # NaN (check_float refuses it; an int is never NaN, nor overflows here)
        return math.nan
    return check_float(grad_output, "grad_output", finite=False)


def _cross_entropy_call(logits, target, grad_output, ignore_index, label_smoothing, reduction):
    # grad_output is a data argument (its float64 makes the call float64) when it is an array, of
    # reduction "none"; a scalar is a scale, of any reduction, checked before any array is copied
    reduction = reduction_of(reduction, "reduction")
    scalar = isinstance(grad_output, numbers.Real) and not isinstance(grad_output, bool)
    rows_given = reduction == "none" and not scalar
    grad_scale = 1.0 if rows_given else _grad_scale(grad_output)
    dtype, (logits, rows) = common_dtype((logits, "logits"), (grad_output if rows_given else None, "grad_output"))
    x, t, lead, ignore_index, label_smoothing, reduction = _cross_entropy_args(
        logits, target, ignore_index, label_smoothing, reduction, dtype)
    grad_rows = None
    if rows_given:
        rows = _grad_given(rows, "grad_output", lead, dtype, of="logits, target")
        grad_rows = _as_dtype(rows, "grad_output", dtype).reshape(-1)
    x = _logits_rows(x, dtype)
    loss, _, grad = variant("cross_entropy", dtype)(x, t, ignore_index, label_smoothing, reduction, grad_scale,
                                                     grad_rows, True)
    loss = loss.reshape(lead) if reduction == "none" else dtype(loss)
    return loss, grad.reshape(lead + (x.shape[-1],))


def cross_entropy_backward(logits, target, grad_output=1.0, ignore_index: int = -100,
                           label_smoothing: float = 0.0, reduction: str = "mean") -> np.ndarray:
    """Gradient of ``functional.cross_entropy`` w.r.t. the logits, for the upstream gradient
    ``grad_output`` of the (reduced) loss::

        grad_x[r, j] = w_r · (softmax(x_r)_j - ε / V - (1 - ε) · [j = t_r])
        w_r = grad_output / #non-ignored rows ("mean"), grad_output ("sum"), grad_output[r] ("none");
        ignored rows: 0

    When every row is ignored the gradient is zero (the loss is 0, see ``cross_entropy``).

    Args:
        logits: ``(..., V)``.  target: ``(...)`` integer class indices (or ``ignore_index``).
        grad_output: a scalar for ``"mean"``/``"sum"``; for ``"none"`` an array of ``target``'s
            shape (or a scalar for every row).
        ignore_index, label_smoothing, reduction: as the forward's.

    Returns:
        ``grad_logits``, ``(..., V)``; float64 if ``logits`` (or, for ``"none"``, an array
        ``grad_output``) is float64 (or wider), else float32. A scalar ``grad_output`` is a scale,
        of no dtype.

    Raises:
        ValueError / TypeError: as ``cross_entropy``; ``grad_output`` of the wrong shape, or a
            scalar one too large for a float (``10**400``: ValueError).
    """
    return _cross_entropy_call(logits, target, grad_output, ignore_index, label_smoothing, reduction)[1]


def cross_entropy_with_grad(logits, target, ignore_index: int = -100, label_smoothing: float = 0.0,
                            reduction: str = "mean", grad_output=1.0):
    """The loss and its gradient w.r.t. the logits in ONE pass over the logits (llm.c's fused
    softmax + cross-entropy backward): ``(cross_entropy(...), cross_entropy_backward(...))`` for the
    price of one. See those two functions for the formulas, shapes and errors.

    Returns:
        ``(loss, grad_logits)``: loss a numpy scalar of the compute dtype (``cross_entropy_backward``'s
        rule; or ``target``-shaped for
        ``"none"``; NaN if a logit is NaN: check it), grad ``(..., V)``.
    """
    return _cross_entropy_call(logits, target, grad_output, ignore_index, label_smoothing, reduction)


# --------------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------------

def scaled_dot_product_attention_backward(query, key, value, out, grad_out, lse, attn_mask=None, *,
                                          query_mask=None, key_mask=None, is_causal: bool = False,
                                          scale: float | None = None, causal_alignment: str = "top_left",
                                          enable_gqa: bool = False, dropout_p: float = 0.0, seed: int | None = None):
    """Backward of ``functional.scaled_dot_product_attention``, FlashAttention-2's algorithm 2 (Dao
    2023) on the CPU: the probabilities are recomputed tile by tile from the forward's log-sum-exp,
    never stored (O(tile) extra memory)::

        P = exp(scale · Q Kᵀ + mask - lse),   Δ_i = Σ_d grad_out_id · out_id
        grad_V = Pᵀ grad_out,   dS = P ∘ (grad_out Vᵀ - Δ),   grad_Q = scale · dS K,   grad_K = scale · dSᵀ Q

    The arguments and mask conventions mirror the forward's (bool True = may attend, float added,
    ``key_mask``/``query_mask`` True = a real token, causal alignments, GQA). A query row that sees no
    key (``lse = -inf``) gets zero gradient and adds nothing to ``grad_key``/``grad_value`` (no NaN,
    for finite inputs: an inf or NaN in ``query``/``key``/``value`` can reach other rows through the
    tile products, 0 · inf = NaN).
    A row whose ``|lse|`` is large (≥ 64 in float32, ≥ 2**16 in float64: every key under a huge
    finite float mask such as ``finfo.min`` or -1e4, or very large scores) would lose the difference
    ``X - lse`` to the rounding of ``lse``; such rows recompute their max and sum over the keys
    first, so that their probabilities sum to 1 as the forward's do (one more ``Q Kᵀ`` for them),
    and do not read the given ``lse``. Elsewhere ``P = exp(min(X - lse, 0))``: an ``lse`` below a
    row's max (not this call's log-sum-exp, e.g. one computed for another ``scale``) gives
    probabilities capped at 1, never inf.
    With GQA, ``grad_key``/``grad_value`` are summed over the query heads that share a key/value head.
    The masks get no gradient. Deterministic: bitwise the same for any thread count.

    With the forward's ``dropout_p`` and ``seed`` (its mask Z = keep / (1 - p), regenerated from the
    seed, never stored): ``grad_V = (P ∘ Z)ᵀ grad_out``, ``dS = P ∘ ((grad_out Vᵀ) ∘ Z - Δ)``, ``P``
    the undropped probabilities (which ``lse`` gives) and ``out`` the forward's dropped output.

    Args:
        query: ``(..., L, E)``.  key: ``(..., S, E)``.  value: ``(..., S, Ev)`` (as the forward's).
        out: ``(..., L, Ev)``, the forward's output.  grad_out: ``(..., L, Ev)``.
        lse: ``(..., L)``, the forward's log-sum-exp of each row of the masked, scaled scores
            (``logsumexp(scale · Q Kᵀ + mask)`` over the keys; -inf for a row that sees no key).
        attn_mask, query_mask, key_mask, is_causal, scale, causal_alignment, enable_gqa: exactly
            the forward's.
        dropout_p, seed: the forward's dropout on the probabilities and the seed of its mask (the
            forward's ``seed``: when it drew one from the package's generator, pass that seed to both
            calls instead). ``seed`` is needed when ``dropout_p > 0``.

    Returns:
        ``(grad_query (..., L, E), grad_key (..., S, E), grad_value (..., S, Ev))``, float64 if any
        of ``query``, ``key``, ``value``, ``out``, ``grad_out``, ``lse`` is float64 (or wider), else
        float32 (a float ``attn_mask`` is converted to it).

    Raises:
        ValueError: shapes that do not match the forward's rules, ``out``/``grad_out``/``lse`` of the
            wrong shape, masks that do not broadcast, bad ``causal_alignment``, a NaN ``scale`` or
            one infinite in the dtype (above its ``finfo.max``); ``dropout_p`` outside [0, 1],
            ``seed`` outside ``[0, 2**64)`` or None with ``dropout_p > 0``.
        TypeError: non-numeric arrays, masks neither bool nor float, ``scale`` or ``dropout_p`` not a
            number, ``seed`` not an int.
    """
    scale, is_causal = _given_scale(scale), check_bool(is_causal, "is_causal")  # before any array is copied
    dropout_p = check_float(dropout_p, "dropout_p", minimum=0.0, maximum=1.0)
    if seed is None and dropout_p > 0:
        raise ValueError(f"seed: the backward of a dropout (dropout_p={dropout_p}) needs the seed of the forward's "
                         f"mask, got None")
    seed = 0 if seed is None else _check_seed(seed)
    out, grad_out, lse = _read_once(out, "out"), _read_once(grad_out, "grad_out"), _read_once(lse, "lse")
    q, k, v, dtype, lead, L, S, E, heads, n, kv_heads, offset = _attention_inputs(
        query, key, value, enable_gqa, causal_alignment, ((out, "out"), (grad_out, "grad_out"), (lse, "lse")))
    scale = _check_scale(scale, E, dtype)
    Ev = v.shape[-1]
    o = _grad_given(out, "out", lead + (L, Ev), dtype, of="query, value")
    go = _grad_given(grad_out, "grad_out", lead + (L, Ev), dtype, of="query, value")
    lse_arr = _grad_given(lse, "lse", lead + (L,), dtype, of="query")
    bool_mask, float_mask, key_slot = _attention_masks(attn_mask, query_mask, key_mask, lead, L, S, dtype, heads)
    # every shape checked: the copies
    q, k, v = _attention_arrays(q, k, v, dtype)
    o, go, lse_arr = _as_dtype(o, "out", dtype), _as_dtype(go, "grad_out", dtype), _as_dtype(lse_arr, "lse", dtype)
    shape4 = (n, heads, L, S)
    dq, dk, dv = variant("scaled_dot_product_attention_backward", dtype)(
        q.reshape(n, heads, L, E), k.reshape(n, kv_heads, S, E), v.reshape(n, kv_heads, S, Ev),
        o.reshape(n, heads, L, Ev), go.reshape(n, heads, L, Ev), lse_arr.reshape(n, heads, L),
        _as_4d(bool_mask, shape4), _as_4d(float_mask, shape4), key_slot, is_causal, offset, scale, dropout_p, seed)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)
