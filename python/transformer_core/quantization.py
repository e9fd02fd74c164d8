"""Quantized linear layers, computed by the C++ core: weights kept in memory as int8 or as GGUF's
block formats and used as they are, never expanded to a float32 matrix.

Two families of formats (the byte layouts: ``cpp/include/transformer_core/kernels/quant/formats.hpp``):

* **int8**, symmetric per output channel, as PyTorch's ``quantize_dynamic`` with per-channel weights
  and ONNX Runtime's dynamic quantization: ``qweight`` ``(out, in)`` int8 in [-127, 127] and
  ``scales`` ``(out,)`` float32 with ``W ≈ scales[:, None] * qweight``. At run time each row of ``x``
  is quantized by the same rule, the product is accumulated exactly in int32, and
  ``y = acc * (sx[i] * scales[j]) + bias[j]``. Optionally the activations take a second int8 pass,
  their rounding residual (``residual_activations``: :func:`linear_int8`).
* **GGUF** ``Q8_0``, ``Q4_0``, ``Q4_1`` (the GGUF file format's block types, ggml's
  ``ggml-common.h``): each row of ``in_features`` values is ``in_features / 32`` blocks, each with an
  fp16 scale ``d`` (and for Q4_1 an fp16 offset ``m``):  Q8_0 ``w = d * q`` (q int8);
  Q4_0 ``w = d * (q - 8)`` (q a 4-bit nibble); Q4_1 ``w = d * q + m``. Nibble order: byte ``i`` of a
  block's 16 holds element ``i`` in its low nibble and element ``i + 16`` in its high one.
  The bytes are read in place (pass a memory-mapped view of a GGUF file's tensor).

The quantization rule (one rule for int8 weights, int8 activation rows and Q8 activation blocks)::

    amax  = max |v|                      scale = amax / 127              (float32)
    q     = rint(clip(v * (127 / amax), -127, 127))   rint rounds half to even (np.rint)
    amax < 2**-100  ->  q = 0, scale = 0;   a NaN or inf in v  ->  q = 0, scale = NaN

The kernels exist per instruction set — ``scalar`` (any CPU), ``avx2``, ``avx512vnni``, ``amx``
(AMX tiles for the int8 product and the fp32 linear layer: Intel Sapphire Rapids and later, on
Linux) — and the best one the CPU has is chosen at run time. Every instruction set gives the same
bits in the quantized kernels; :func:`set_isa` (or the environment variable ``TC_ISA``, read once)
picks one, for tests and benchmarks. (The fp32 linear layer on ``amx`` is the one exception: see
:func:`set_isa`.)

Arguments: ``x``, ``weight``, ``scales`` and ``bias`` may be any array-like (numpy arrays, torch
tensors, nested lists); ``qweight`` must be an int8 numpy array (what :func:`quantize_int8` returns);
``blocks`` raw bytes (a uint8 numpy array or an object with the buffer protocol). Every function
checks its arguments (``TypeError``/``ValueError`` naming the argument, before any output is
allocated) and returns new numpy arrays (float32; int8 for quantized values). The GIL is released
while the core computes.

Models (:func:`quantize`, :func:`set_quantize_activations`, :func:`set_residual_activations`,
:func:`weight_bytes`): a layer's weight
may itself be held in these formats — every ``Linear`` (attention projections, feed-forward, LM
heads, poolers) computes through the products above, embedding tables in GGUF blocks decode only the
rows they look up. Attention, norms, softmax and the activation functions (GELU, SiLU) stay float32.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from ._runtime import core as _core
from ._validation import (
    as_float,
    check_allocatable,
    check_bool,
    check_positive_int,
    described,
    unconverted,
)
from .gguf_file import _check_block_scales

__all__ = [
    "GGML_TYPES",
    "INT8_MAX_IN_FEATURES",
    "quantize_int8",
    "linear_int8",
    "linear_gguf",
    "linear_gguf_parts",
    "dequantize_gguf",
    "quantize_q8_blocks",
    "isa",
    "set_isa",
    "supported_isas",
    "quantize",
    "set_gguf_weights",
    "set_quantize_activations",
    "weight_bytes",
    "set_residual_activations",
    "QUANTIZED_FORMATS",
]

#: The formats :func:`quantize` converts a model's linear layers to.
QUANTIZED_FORMATS = ("int8",)

#: GGUF block types: name -> (values per block, bytes per block), as ggml's ``GGML_QUANT_SIZES``.
GGML_TYPES = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20)}

#: The int8 product accumulates in int32, exact while in_features * 128 * 127 < 2**31.
INT8_MAX_IN_FEATURES = 131072


def isa() -> str:
    """The instruction set the kernels use now: ``"scalar"``, ``"avx2"``, ``"avx512vnni"`` or ``"amx"``.

    It chooses the quantized kernels and the fp32 GEMM kernels (see :func:`set_isa`).

    Raises:
        ValueError: the environment variable ``TC_ISA`` names an unknown ISA or one this CPU lacks
            (and :func:`set_isa` has not been called since).
    """
    return _core.isa()


def set_isa(name: str) -> None:
    """Chooses the kernels' instruction set (the quantized kernels give the same results on all;
    speed differs).

    It chooses the quantized kernels and the fp32 matrix-product kernels of the linear layers and
    attention (``kernels/sgemm.hpp``): ``"avx512vnni"`` and ``"amx"`` run the AVX-512 ones, ``"avx2"`` and
    ``"scalar"`` the AVX2 ones (the same bits), and a CPU without AVX2 uses BLAS for fp32.
    On ``"amx"`` the fp32 linear layer's product (more than 32 rows), and the float32-activation
    GGUF product of more than 8 rows (:func:`linear_gguf`), run on AMX tiles instead: each
    value split into three bfloat16 parts and six bf16 products summed in fp32 (``tdpbf16ps``;
    "bf16x6", Henry et al., ARITH 2019). Its error is fp32's (the dropped terms are below 2^-23 of
    each product); its bits differ from the FMA kernels' and do not depend on the thread count.
    Products below 2^-126 are flushed to zero there (an absolute error of about 6 · k · 2^-126).
    The choice is the process's: a call running in another thread takes the new kernels from its
    next product on (weights packed for the old ones are packed again for the new).

    Args:
        name: ``"scalar"`` (portable C++, the reference), ``"avx2"`` (AVX2 + FMA + F16C) or
            ``"avx512vnni"`` (AVX-512 F/BW/VL/DQ + VNNI) or ``"amx"`` (``"avx512vnni"`` with the
            int8 product (``tdpbssd``) and the fp32 linear layer (``tdpbf16ps``) on AMX tiles:
            AVX512-BF16 + AMX-TILE/INT8/BF16, the tile state granted by Linux).

    Raises:
        TypeError: ``name`` not a str. ValueError: unknown, or not supported by this CPU
            (see :func:`supported_isas`).
    """
    if not isinstance(name, str):
        raise TypeError(f"name: expected a str, got {type(name).__name__}")
    _core.set_isa(name)


def supported_isas() -> list:
    """The instruction sets this CPU (and build) can run, slowest first, e.g.
    ``["scalar", "avx2", "avx512vnni", "amx"]``."""
    return list(_core.supported_isas())


# ------------------------------------------------------------------------------------------------
# Validation helpers
# ------------------------------------------------------------------------------------------------

def _ggml_type(ggml_type, arg: str = "ggml_type") -> str:
    """``"Q8_0"``/``"Q4_0"``/``"Q4_1"`` from a name or an enum member with that ``.name``
    (``gguf.GGMLQuantizationType.Q4_0``). Errors name ``arg`` (``"parts[1]: ggml_type"`` for one
    part of several)."""
    name = ggml_type if isinstance(ggml_type, str) else getattr(ggml_type, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"{arg}: expected a str such as 'Q4_0', got {type(ggml_type).__name__}")
    if name not in GGML_TYPES:
        raise ValueError(f"{arg}: expected one of {sorted(GGML_TYPES)}, got {name!r}")
    return name


def _block_bytes(blocks, expected: int, what: str, arg: str = "blocks") -> np.ndarray:
    """``blocks`` as a 1-D uint8 array over the same memory: :func:`_checked_blocks`, then
    :func:`_flat_bytes` (a copy only when a numpy array is not C-contiguous)."""
    return _flat_bytes(_checked_blocks(blocks, expected, what, arg), arg)


def _checked_blocks(blocks, expected: int, what: str, arg: str = "blocks") -> np.ndarray:
    """``blocks`` checked and viewed, never copied: a numpy uint8 array of any shape (returned as
    is, C-contiguous or not: :func:`_flat_bytes` makes its copy once the other arguments are
    checked), or any object with the buffer protocol (bytes, bytearray, memoryview, mmap), which
    must be C-contiguous (ValueError otherwise: its bytes are not the tensor's), as a 1-D uint8
    view. ``expected`` bytes (ValueError otherwise). Errors name ``arg`` (``"parts[1]: blocks"``
    for one part of several) and say ``what`` the bytes hold."""
    if isinstance(blocks, np.ndarray):
        if blocks.dtype != np.uint8:
            raise TypeError(f"{arg}: expected raw bytes (a uint8 array or a bytes-like object), "
                            f"got an array of dtype {blocks.dtype}")
        arr = blocks
    else:
        try:
            view = memoryview(blocks)
        except TypeError:
            raise TypeError(f"{arg}: expected raw bytes (a uint8 array or a bytes-like object), "
                            f"got {type(blocks).__name__}") from None
        if not view.c_contiguous:
            raise ValueError(f"{arg}: expected contiguous bytes, got a non-contiguous {type(blocks).__name__} "
                             f"(shape {view.shape}, strides {view.strides}); pass bytes(blocks) or a contiguous copy")
        arr = np.frombuffer(view, dtype=np.uint8)
    if arr.size != expected:
        raise ValueError(f"{arg}: expected {expected} bytes ({what}), got {arr.size}")
    return arr


def _flat_bytes(arr: np.ndarray, arg: str = "blocks") -> np.ndarray:
    """``arr`` (from :func:`_checked_blocks`) as a 1-D C-contiguous uint8 array: itself, or (a
    strided or broadcast view) its copy, checked against this machine's memory first (ValueError
    naming ``arg``)."""
    if not arr.flags.c_contiguous:
        check_allocatable(arr.shape, 1, f"{arg}: its contiguous copy")
    return np.ascontiguousarray(arr).reshape(-1)


def _check_block_dims(ggml_type: str, rows: int, cols: int, rows_name: str, cols_name: str) -> int:
    """The byte count of ``rows`` rows of ``cols`` values of ``ggml_type``; ValueError if ``cols``
    is not a whole number of blocks."""
    block, size = GGML_TYPES[ggml_type]
    if cols % block:
        raise ValueError(f"{cols_name}: expected a multiple of {block} (the block size of {ggml_type}), got {cols}")
    return rows * (cols // block) * size


def _bias_shape(bias, out_features: int):
    """``bias`` unconverted (:func:`~transformer_core._validation.unconverted`), None when not given,
    after the checks of its dtype (TypeError), rank and shape ``(out_features,)`` (ValueError) that
    need no copy: :func:`_bias` converts it once the other arguments are checked."""
    if bias is None:
        return None
    b = unconverted(bias, "bias", ndim=1)
    if b.shape != (out_features,):
        raise ValueError(f"bias: expected shape ({out_features},), got {b.shape}")
    return b


def _bias(b):
    """A bias checked by :func:`_bias_shape` as a C-contiguous float32 array (None stays None)."""
    return None if b is None else as_float(b, "bias", np.float32, ndim=1)


def _check_output(rows: int, out_features: int, names: str) -> None:
    """ValueError naming ``names`` when the ``(rows, out_features)`` float32 output could not fit in
    this machine's memory: checked before the C++ core allocates it (a MemoryError otherwise)."""
    check_allocatable((rows, out_features), 4, f"{names}: the output ({rows} rows x {out_features} out_features, "
                                                f"float32)")


def _input(x, in_features: int | None, in_name: str) -> np.ndarray:
    """``x`` unconverted (:func:`~transformer_core._validation.unconverted`: real numeric data, at
    least 1-D, not empty), its last dim ``in_features`` (ValueError). The caller checks the output's
    size on this array's shape, then converts it (:func:`_rows`): a broadcast view
    (``np.broadcast_to``) of a huge shape is refused before its copy is made."""
    arr = unconverted(x, "x", min_ndim=1)
    if in_features is not None and arr.shape[-1] != in_features:
        raise ValueError(f"x: expected last dim {in_features} ({in_name}), got shape {arr.shape}")
    return arr


def _row_count(arr: np.ndarray) -> int:
    """The rows of ``(..., in)``: the product of the leading dims (1 for a 1-D array)."""
    return math.prod(arr.shape[:-1])


def _rows(arr: np.ndarray):
    """``arr`` (..., in), checked by :func:`_input`, as a C-contiguous float32 (rows, in) array (a
    copy checked against memory; a float64 value beyond float32's range is a ValueError) and the
    leading shape."""
    x = as_float(arr, "x", np.float32, min_ndim=1)
    return x.reshape(-1, x.shape[-1]), x.shape[:-1]


# ------------------------------------------------------------------------------------------------
# int8, per output channel
# ------------------------------------------------------------------------------------------------

def quantize_int8(weight) -> tuple:
    """Symmetric per-output-channel int8 quantization of a weight matrix (the rule in the module doc).

    ``scales[j] = max|weight[j]| / 127`` and ``qweight[j] = rint(clip(weight[j] * (127 / max|weight[j]|),
    -127, 127))`` — rows of x are quantized by the very same rule inside :func:`linear_int8`. As
    PyTorch's per-channel ``quantize_dynamic`` and ONNX Runtime's dynamic quantization, except for
    the range: [-127, 127] with ``max / 127`` (torch: [-128, 127] with ``max / 127.5``), which keeps
    the integer products symmetric and the SIMD kernels exact.

    Args:
        weight: ``(out_features, in_features)`` real array (torch's ``nn.Linear`` layout), finite and
            within float32's range (computed in float32).

    Returns:
        ``(qweight, scales)``: ``(out_features, in_features)`` int8 and ``(out_features,)`` float32.

    Raises:
        TypeError: not a real numeric array. ValueError: not 2-D, empty, holding NaN or inf, or (a
            float64 array) a value beyond float32's range (``|v| ≥ 3.4028235677973366e38``, which float32
            would make inf).
    """
    w = as_float(weight, "weight", None, ndim=2)        # float64 stays float64 until checked
    if not np.isfinite(w).all():
        bad = w[~np.isfinite(w)].flat[0]
        raise ValueError(f"weight: expected finite values, got {bad}")
    # float32: a float64 value that would round to inf (|v| >= 3.4028235677973366e38) is as_float's ValueError,
    # worded as linear_int8's for x
    return _core.quantize_int8(weight=as_float(w, "weight", np.float32, ndim=2))


def linear_int8(x, qweight, scales, bias=None, *, residual_activations: bool = False) -> np.ndarray:
    """``y = x Wᵀ + b`` with int8 weights and int8 activations, int32 accumulation.

    Each row ``x_i`` is quantized on the fly by the rule of :func:`quantize_int8` (scale ``sx_i``),
    then ``y[i, j] = float32(Σ_k xq[i, k] · qweight[j, k]) · (sx_i · scales[j]) + bias[j]``, the sum
    exact in int32 and the rest float32 in that order — the same bits on every instruction set.

    With ``residual_activations``, the activations take a second int8 pass: the rounding residual
    ``r = x_i − sx_i · xq[i]`` (computed exactly; about ``sx_i / 2`` at most: float32's roundings
    of ``sx_i`` and of ``x · (127 / amax)`` let it exceed that slightly, ``|r| ≤ (1 + 2^-14) · sx_i / 2``)
    is quantized in units of ``sr_i = sx_i / 256``, ``rq = rint(clip(r · float32(256 / sx_i), ±127))``,
    and its product is added: ``y[i, j] += float32(Σ_k rq[i, k] · qweight[j, k]) · (sr_i · scales[j])``.
    Twice the integer products; the activations' error per value drops from ``sx_i / 2`` to
    ``sx_i / 512`` (up to float32 rounding: ``(1 + 2^-14) · sx_i / 512`` at most), except where
    ``|r| > 127.5 · sr_i`` (``r`` within 0.4 % of its largest value: about 0.4 % of the values of a
    normally distributed row). There ``r / sr_i`` (up to about 128) is clamped to ±127 and the error is
    ``|r| − 127 · sr_i``: up to ``sx_i / 256`` (``(1 + 2^-7) · sx_i / 256`` at most). E.g. the row
    ``[127, 63.4999]`` (``sx = 1``): ``r = 0.4999``, ``rq = 127``, an error of ``0.0038``. That leaves
    the weights' rounding as the error that remains (on all-MiniLM-L6-v2 the nearest neighbour of
    98.6 % of 1,000 sentences, batch 32, stays the fp32 one, against 95.0 % with one pass).

    Args:
        x: ``(..., in_features)`` real array (computed in float32).
        qweight: ``(out_features, in_features)`` int8 numpy array (from :func:`quantize_int8`; any
            int8 value is handled exactly, -128 included).
        scales: ``(out_features,)`` per-channel scales.
        bias: ``(out_features,)`` or None.
        residual_activations: the two-pass activations above (default: one pass).

    Returns:
        ``(..., out_features)`` float32. A row of ``x`` holding NaN or inf gives a row of NaN.

    Raises:
        TypeError: ``qweight`` not an int8 numpy array; a non-numeric ``x``/``scales``/``bias``;
            ``residual_activations`` not a bool.
        ValueError: shapes that disagree; ``x`` empty; ``in_features`` > 131072; a ``scales``
            value that is negative, NaN or infinite; an output (or the
            contiguous copy of a broadcast or strided ``qweight``) larger than this machine's memory
            (checked on the shapes, before ``x`` is converted or copied); (a float64 ``x``,
            ``scales`` or ``bias``) a value beyond float32's range (``|v| ≥ 3.4028235677973366e38``, which
            float32 would make inf).
    """
    residual_activations = check_bool(residual_activations, "residual_activations")
    if not isinstance(qweight, np.ndarray) or qweight.dtype != np.int8:
        got = qweight.dtype if isinstance(qweight, np.ndarray) else type(qweight).__name__
        raise TypeError(f"qweight: expected an int8 numpy array, got {got}")
    if qweight.ndim != 2 or qweight.size == 0:
        raise ValueError(f"qweight: expected a non-empty 2-D array (out_features, in_features), got {qweight.shape}")
    out_features, in_features = qweight.shape
    if in_features > INT8_MAX_IN_FEATURES:
        raise ValueError(f"qweight: expected in_features <= {INT8_MAX_IN_FEATURES} (the exact range of the "
                         f"int32 accumulator), got {in_features}")
    xa = _input(x, in_features, "qweight's in_features")
    s = unconverted(scales, "scales", ndim=1)  # every shape checked before anything is converted (a copy)
    if s.shape != (out_features,):
        raise ValueError(f"scales: expected shape ({out_features},), got {s.shape}")
    b = _bias_shape(bias, out_features)
    s = as_float(s, "scales", np.float32, ndim=1)
    if not (np.isfinite(s).all() and (s >= 0).all()):  # quantize_int8's are: amax / 127 of finite rows
        bad = int(np.flatnonzero(~(np.isfinite(s) & (s >= 0)))[0])
        raise ValueError(f"scales: expected finite scales >= 0 (quantize_int8's), got {s[bad]} at index {bad}")
    b = _bias(b)
    _check_output(_row_count(xa), out_features, "x, qweight")  # before x is converted (a copy)
    x2, lead = _rows(xa)
    if not qweight.flags.c_contiguous:  # a broadcast or strided view: copied for the core
        check_allocatable(qweight.shape, 1, "qweight: its contiguous copy (a broadcast or strided view)")
    y = _core.linear_int8(x=x2, qweight=np.ascontiguousarray(qweight), scales=s, bias=b,
                          residual_activations=residual_activations)
    return y.reshape(*lead, out_features)


# ------------------------------------------------------------------------------------------------
# GGUF blocks
# ------------------------------------------------------------------------------------------------

def linear_gguf(x, blocks, ggml_type, out_features: int, in_features: int, bias=None,
                quantize_activations: bool = False) -> np.ndarray:
    """``y = x Ŵᵀ + b`` with ``Ŵ`` a GGUF tensor's blocks (Q8_0, Q4_0, Q4_1), read in place.

    ``blocks`` is the tensor's data as stored in the GGUF file: ``out_features`` rows (ggml's
    ``ne[1]``), each ``in_features / 32`` blocks (``ne[0]`` values) — e.g. ``GGUFReader(path).tensors[i].data``
    (a memory map of the file) with ``tensor.shape == (in_features, out_features)``.

    Two ways to compute:
        * ``quantize_activations=False`` (default): ``x`` stays float32; each block of weights is
          decoded in registers to exactly :func:`dequantize_gguf`'s values and multiplied with ``x``
          in float32 (FMA). The result is the dequantize-then-float32 product up to float32 rounding
          (the 32 partial sums per output are fixed, so every instruction set gives the same bits).
          With more than 8 rows of ``x`` (a prompt), the weights are decoded a tile of 128 rows at a
          time and packed for the float32 linear layer's GEMM (the kernels of
          :func:`transformer_core.functional.linear` for many rows: AMX tiles on the ``amx`` ISA, FMA
          panels otherwise), once per call, without a float32 copy of the weights in memory. How
          that compares with ``functional.linear(x, dequantize_gguf(...), bias)``:

          - 1 to 8 rows: the register kernel above; ``functional.linear`` sums in another order
            (its small-rows kernel): equal up to float32 rounding, not bit for bit in general.
          - 9 to 32 rows: the GEMM, while ``functional.linear`` still takes its small-rows kernel
            for so few rows: equal up to float32 rounding, not bit for bit in general.
          - 33 rows or more, on a CPU with AVX2: the GEMM that ``functional.linear`` takes too,
            bit for bit. (Without AVX2 both fall back to BLAS, in tiles of their own: equal up to
            float32 rounding.)
        * ``quantize_activations=True``: each block of 32 values of ``x`` is quantized to int8
          (:func:`quantize_q8_blocks`) and each block product is an exact integer dot product, scaled
          by both blocks' scales in float32 — llama.cpp's way: faster, as accurate as 8-bit ``x``.

    Args:
        x: ``(..., in_features)`` real array (computed in float32).
        blocks: the raw bytes: a uint8 numpy array (any shape, e.g. a ``np.memmap``) or a bytes-like
            object (bytes, bytearray, memoryview, mmap); ``out_features * in_features / 32 * type_size``
            bytes (``GGML_TYPES``). Not copied when contiguous.
        ggml_type: ``"Q8_0"``, ``"Q4_0"``, ``"Q4_1"`` (or a ``gguf.GGMLQuantizationType`` member).
        out_features, in_features: the weight's shape ``(out_features, in_features)``;
            ``in_features`` a multiple of 32.
        bias: ``(out_features,)`` or None.
        quantize_activations: see above.

    Returns:
        ``(..., out_features)`` float32. NaN and inf are not refused here, in ``x`` nor in the
        blocks: they give non-finite outputs, the others unchanged.

        - A row of ``x`` holding NaN gives a row of NaN. A row holding ±inf (and no NaN) gives a
          row of ±inf or NaN values (NaN where inf meets a weight of 0, or +inf meets -inf); with
          ``quantize_activations``, a row of NaN (its block of 32 quantizes to scale NaN, the rule of
          the module doc).
        - A block of weight row ``j`` whose fp16 scale ``d`` (or Q4_1's offset ``m``) is NaN or
          ±inf gives NaN or ±inf in output ``j`` (column ``j`` of ``y``) for every row of ``x``.
          :func:`set_gguf_weights` and the GGUF loaders refuse such blocks, checked once: here, on
          every call, the check would be a pass over the blocks about as long as a one-row product.

    Raises:
        TypeError: ``blocks`` not bytes; ``ggml_type`` not a str; ``out_features``/``in_features``
            not ints; a non-numeric ``x``/``bias``; ``quantize_activations`` not a bool.
        ValueError: unknown ``ggml_type``; ``in_features`` not a multiple of 32; ``blocks`` of the
            wrong length or not contiguous (a strided memoryview); ``x`` empty or its last dim !=
            ``in_features``; ``bias`` of the wrong shape; an output larger than this machine's memory
            (checked on the shapes, before ``x`` is converted or copied); (a float64 ``x`` or
            ``bias``) a value beyond float32's range (``|v| ≥ 3.4028235677973366e38``, which float32 would
            make inf).

    Source: the GGUF specification (ggml's ``docs/gguf.md``) and ``ggml-common.h``'s block structs;
    gguf-py's ``gguf.quants`` (numpy) decodes the same bytes to the same values.
    """
    quantize_activations = check_bool(quantize_activations, "quantize_activations")
    name = _ggml_type(ggml_type)
    out_features = check_positive_int(out_features, "out_features")
    in_features = check_positive_int(in_features, "in_features")
    expected = _check_block_dims(name, out_features, in_features, "out_features", "in_features")
    data = _checked_blocks(blocks, expected, f"{out_features} x {in_features} {name}")
    xa = _input(x, in_features, "in_features")
    b = _bias_shape(bias, out_features)
    _check_output(_row_count(xa), out_features, "x, out_features")  # before anything is converted (a copy)
    data, b = _flat_bytes(data), _bias(b)
    x2, lead = _rows(xa)
    y = _core.linear_gguf(x=x2, blocks=data, ggml_type=name, out_features=out_features, in_features=in_features,
                          bias=b, quantize_activations=quantize_activations)
    return y.reshape(*lead, out_features)


def linear_gguf_parts(x, parts, in_features: int, bias=None, quantize_activations: bool = False) -> np.ndarray:
    """``y = x [W_0; W_1; ...]ᵀ + b``: :func:`linear_gguf` over a weight stored as several runs of
    rows, each its own GGUF tensor (its own bytes and block type), stacked in order — a packed
    ``[q; k; v]`` projection whose q, k and v live apart in a GGUF file. One call, one parallel
    region (and the activations quantized once); each output equals, bit for bit, what
    :func:`linear_gguf` of its run gives.

    Args:
        x: ``(..., in_features)`` real array (computed in float32).
        parts: a non-empty sequence of ``(blocks, ggml_type, rows)``: ``rows`` rows of ``in_features``
            values of ``ggml_type`` (``"Q8_0"``, ``"Q4_0"``, ``"Q4_1"``), their raw bytes as for
            :func:`linear_gguf` (not copied when contiguous).
        in_features: a multiple of 32.
        bias: ``(Σ rows,)`` or None.
        quantize_activations: as :func:`linear_gguf`.

    Returns:
        ``(..., Σ rows)`` float32; NaN or inf in ``x`` or in a part's block scales give what they give
        in :func:`linear_gguf` (not refused).

    Raises:
        TypeError: ``parts`` not a sequence of triples; bytes or types as :func:`linear_gguf`
            (naming the part: ``parts[1]: blocks``); ``quantize_activations`` not a bool.
        ValueError: as :func:`linear_gguf`, naming the part (``parts[1]: ggml_type``).
    """
    quantize_activations = check_bool(quantize_activations, "quantize_activations")
    in_features = check_positive_int(in_features, "in_features")
    if isinstance(parts, (str, bytes)) or not hasattr(parts, "__len__") or len(parts) == 0:
        raise TypeError(f"parts: expected a non-empty sequence of (blocks, ggml_type, rows), got {type(parts).__name__}")
    runs, out_features = [], 0
    for i, part in enumerate(parts):
        if not isinstance(part, (tuple, list)) or len(part) != 3:
            raise TypeError(f"parts[{i}]: expected a (blocks, ggml_type, rows) triple, got {type(part).__name__}")
        blocks, ggml_type, rows = part
        name = _ggml_type(ggml_type, f"parts[{i}]: ggml_type")
        rows = check_positive_int(rows, f"parts[{i}]: rows")
        expected = _check_block_dims(name, rows, in_features, f"parts[{i}]: rows", "in_features")
        data = _checked_blocks(blocks, expected, f"{rows} x {in_features} {name}", f"parts[{i}]: blocks")
        runs.append((data, name, rows))
        out_features += rows
    xa = _input(x, in_features, "in_features")
    b = _bias_shape(bias, out_features)
    _check_output(_row_count(xa), out_features, "x, parts")  # before anything is converted (a copy)
    runs = [(_flat_bytes(data, f"parts[{i}]: blocks"), name, rows) for i, (data, name, rows) in enumerate(runs)]
    b = _bias(b)
    x2, lead = _rows(xa)
    y = _core.linear_gguf_parts(x=x2, parts=runs, in_features=in_features, bias=b,
                                quantize_activations=quantize_activations)
    return y.reshape(*lead, out_features)


def dequantize_gguf(blocks, ggml_type, rows: int, cols: int) -> np.ndarray:
    """The float32 values of GGUF blocks, bit for bit ``gguf.quants.dequantize``'s.

    Args:
        blocks: raw bytes (see :func:`linear_gguf`) of ``rows`` rows of ``cols / 32`` blocks.
        ggml_type: ``"Q8_0"``, ``"Q4_0"``, ``"Q4_1"`` (or a ``gguf.GGMLQuantizationType`` member).
        rows, cols: the matrix's shape; ``cols`` a multiple of 32.

    Returns:
        ``(rows, cols)`` float32: Q8_0 ``d * q``; Q4_0 ``d * (q - 8)``; Q4_1 ``d * q + m``
        (two float32 roundings), with ``d``, ``m`` the block's fp16 scale and offset. A block whose
        ``d`` or ``m`` is NaN or ±inf gives 32 values that are NaN or ±inf (not refused: gguf's too).

    Raises:
        TypeError: ``blocks`` not bytes; ``ggml_type`` not a str; ``rows``/``cols`` not ints.
        ValueError: unknown ``ggml_type``; ``cols`` not a multiple of 32; the wrong byte count; an
            output larger than this machine's memory.
    """
    name = _ggml_type(ggml_type)
    rows = check_positive_int(rows, "rows")
    cols = check_positive_int(cols, "cols")
    expected = _check_block_dims(name, rows, cols, "rows", "cols")
    data = _block_bytes(blocks, expected, f"{rows} x {cols} {name}")
    check_allocatable((rows, cols), 4, "rows, cols: the float32 output")
    return _core.dequantize_gguf(blocks=data, ggml_type=name, rows=rows, cols=cols)


def quantize_q8_blocks(x) -> tuple:
    """Activations to Q8 blocks: each block of 32 consecutive values of each row of ``x`` quantized
    by the rule of the module doc — what :func:`linear_gguf` does to ``x`` with
    ``quantize_activations=True`` (as llama.cpp's Q8_0 activations, with a float32 scale and
    round-half-to-even).

    Args:
        x: ``(..., cols)`` real array, ``cols`` a multiple of 32.

    Returns:
        ``(q, d)``: ``(..., cols)`` int8 and ``(..., cols / 32)`` float32, ``x ≈ d[..., b] * q[..., 32b:32b+32]``.

    Raises:
        TypeError: a non-numeric ``x``. ValueError: ``x`` empty or its last dim not a multiple of 32;
            (a float64 ``x``) a value beyond float32's range (``|v| ≥ 3.4028235677973366e38``, which float32
            would make inf).
    """
    xa = _input(x, None, "")
    if xa.shape[-1] % 32:  # on the shape given, before x is converted (a copy)
        raise ValueError(f"x: expected a last dim that is a multiple of 32, got shape {xa.shape}")
    x2, lead = _rows(xa)
    cols = x2.shape[1]
    q, d = _core.quantize_q8_blocks(x=x2)
    return q.reshape(*lead, cols), d.reshape(*lead, cols // 32)


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------

def _model_classes():
    from .module import Module
    from .sentence_encoder import SentenceEncoder

    return Module, SentenceEncoder


def _name_list(names, arg: str) -> list:
    """``names`` (one str, or an iterable of str) as a list of weight names, duplicates dropped."""
    if isinstance(names, str):
        return [names]
    from collections.abc import Iterable, Mapping

    if isinstance(names, (bytes, Mapping)) or not isinstance(names, Iterable):
        raise TypeError(f"{arg}: expected a list of weight names (str, as in model.state_dict()), "
                        f"got {described(names)}")
    out = list(names)
    for i, name in enumerate(out):
        if not isinstance(name, str):
            raise TypeError(f"{arg}[{i}]: expected a weight name (a str), got {described(name)}")
    return list(dict.fromkeys(out))


def _public_names(model) -> dict:
    """``{(id(impl), core_name): name}`` over ``model``'s weights: the name ``state_dict`` gives each
    entry of each C++ registry."""
    return {(id(slot.impl), slot.core_name): name for name, slot in model._slots().items()}


def _linear_weight_groups(model) -> dict:
    """``{name: [names of its matrix, in row order]}`` of every linear layer's weight of ``model``,
    under ``state_dict``'s names: a packed matrix (``[q; k; v]``, ``[gate; up]``) is one group."""
    public, group_of = _public_names(model), {}
    for impl in model._impls():
        for core_names in impl.linear_weight_groups():
            group = [public[(id(impl), c)] for c in core_names if (id(impl), c) in public]
            group_of.update({n: group for n in group})
    return group_of


def _check_keep_float(model, keep: list) -> None:
    """ValueError unless every name of ``keep`` is a linear layer's weight, and every packed matrix
    (the rows of ``[q; k; v]``, of ``[gate; up]``: one matrix, one int8 conversion) is named whole or
    not at all. Names in the messages are ``state_dict``'s."""
    if not keep:
        return
    shapes = model.parameter_shapes()
    for name in keep:
        if name not in shapes:
            raise ValueError(f"keep_float: unknown weight {name!r} (expected names of model.state_dict())")
    group_of = _linear_weight_groups(model)  # name -> the names of the matrix it is (part of)
    for name in keep:
        if name not in group_of:
            raise ValueError(f"keep_float: {name!r} is not the weight of a linear layer (quantize converts only "
                             f"those; embeddings, norms and biases stay float32)")
        missing = [n for n in group_of[name] if n not in keep]
        if missing:
            raise ValueError(f"keep_float: {name!r} is one part of the packed matrix {group_of[name]}, stored and "
                             f"quantized as one: name all of its parts (missing {missing}) or none")


def _check_int8_in_features(model, keep: list) -> None:
    """ValueError naming the first float32 linear weight that quantize would convert (not in
    ``keep``) with more than INT8_MAX_IN_FEATURES input features: checked before any is converted."""
    formats = model.weight_formats()
    slots = model._slots()
    for name, names in _linear_weight_groups(model).items():
        if name != names[0] or any(n in keep for n in names) or formats[name] != "float32":
            continue
        slot = slots[name]  # (out, in), or (in, out) stored transposed (GPT-2's Conv1D)
        in_features = slot.shape[0] if slot.transposed else slot.shape[1]
        if in_features > INT8_MAX_IN_FEATURES:
            raise ValueError(f"model: {name!r} has in_features {in_features}, expected <= {INT8_MAX_IN_FEATURES} "
                             f"for int8 (the int32 sums stay exact); keep it float (keep_float={names!r}); nothing "
                             f"was converted")


def _check_finite_weights(model, keep: list) -> None:
    """ValueError naming the first linear weight that quantize would convert (not in ``keep``)
    holding NaN or inf (its int8 rows would be NaN: :func:`quantize_int8` refuses such a matrix):
    checked before any is converted. A float32 weight is counted in place (the core's count of
    non-finite values, over the weight's own buffer); one held as GGUF blocks, which a copy
    converts from its dequantized values, is dequantized one weight at a time to be checked
    (:func:`set_gguf_weights` refuses a NaN or inf block scale: only bytes changed since could hold
    one)."""
    formats = model.weight_formats()
    slots = model._slots()
    for names in _linear_weight_groups(model).values():
        if any(n in keep for n in names):
            continue
        for name in names:  # each row slice of a packed matrix, to name the one that holds it
            if formats[name] == "int8":
                continue
            slot = slots[name]
            if formats[name] == "float32":
                view = slot.impl.parameter_view(slot.core_name)
            else:  # GGUF blocks (a copy only: inplace refuses them before)
                view = np.ascontiguousarray(slot.impl.get_parameter(slot.core_name), dtype=np.float32)
            _check_finite_view(name, view)
    table = _tied_head_table(model)
    if table is not None and formats[table] == "float32":  # the head's int8 copy is made from it
        slot = slots[table]
        _check_finite_view(table, slot.impl.parameter_view(slot.core_name))


def _check_finite_view(name: str, view: np.ndarray) -> None:
    """ValueError naming weight ``name`` when its float32 values hold NaN or inf."""
    bad = int(_core.count_nonfinite_f32(view))
    if bad:
        first = view[~np.isfinite(view)].flat[0]
        raise ValueError(f"model: {name!r} holds {bad} NaN or inf value{'s' if bad > 1 else ''} "
                         f"(of {view.size}; first: {first}), expected finite values for int8 "
                         f"(its rows would be NaN); nothing was converted")


def _tied_head_table(model) -> str | None:
    """The name of the token embedding that :func:`quantize` gives an int8 copy for the LM head
    (a causal LM whose head is tied to it: no ``lm_head.weight`` of its own), or None."""
    from .decoder import CausalLM

    slots = model._slots()
    if not isinstance(model, CausalLM) or "lm_head.weight" in slots:
        return None
    tables = [n for n in slots if n.endswith("embed_tokens.weight") or n.endswith("wte.weight")]
    return tables[0] if tables else None


def quantize(model, format: str = "int8", *, inplace: bool = False, keep_float=None,
             residual_activations: bool = False):
    """A copy of ``model`` whose linear layers hold int8 weights (as ``torch.ao.quantization.quantize_dynamic``
    with per-channel int8 weights: a new model, unless ``inplace``).

    Every ``Linear`` inside the model — attention projections (the packed ``[q; k; v]`` one
    included), feed-forward layers, BERT's pooler, a decoder's own LM head — is quantized per output
    channel (:func:`quantize_int8`) and multiplied by :func:`linear_int8` (activations quantized per
    row on the fly, int32 accumulation). A causal LM whose head is tied to its token embedding
    (GPT-2, SmolLM2) gets an int8 copy of the table for the head (counted by :func:`weight_bytes`
    under the table's name); the lookups stay float32, as torch's ``quantize_dynamic`` leaves
    ``nn.Embedding`` alone. Embeddings, attention, norms, softmax and the activation functions
    (GELU, SiLU) stay float32. The fp32 weights of the converted layers are freed (a weight whose
    ``Parameter.data`` view is still held is freed when the last such view is). Unlike torch's
    ``quantize_dynamic`` (activations per tensor, asymmetric quint8), the activations are quantized
    per row and symmetric, and the weights use the full int8 range [-127, 127].

    After quantizing, ``state_dict()`` returns the dequantized weights (``scale · q``), so
    ``save_pretrained`` writes float32 weights (a model loaded from them is a float model: quantize
    it again); ``load_state_dict``, ``train()``, ``copy.deepcopy`` and pickling are refused (load or
    train a float model, then quantize), also when the only int8 weight is a tied head's copy. With
    ``inplace``, an optimizer's ``step()`` refuses (ValueError, nothing updated) the Parameters of
    the converted weights, which the model no longer reads, and of a table whose tied head got an
    int8 copy, which a step would not update.

    Args:
        model: a float32 transformer_core model or layer (:class:`~transformer_core.BertModel`,
            :class:`~transformer_core.GPT2LMHeadModel`, :class:`~transformer_core.LlamaForCausalLM`,
            a :mod:`transformer_core.nn` layer, ...) or a :class:`~transformer_core.SentenceEncoder`
            (its BERT model is quantized). A model holding GGUF blocks is dequantized first.
        format: ``"int8"``.
        inplace: convert ``model`` itself instead of a copy (a bool).
        keep_float: weight names (as in ``model.state_dict()``; a list, or one str) of linear layers
            left in float32 — mixed precision for the layers whose inputs quantize worst (e.g. a
            Transformer's feed-forward output projection, whose inputs carry outliers: Dettmers et
            al. 2022, "LLM.int8()"). Where several names are the row slices of one packed matrix
            (a Llama layer's ``q_proj``/``k_proj``/``v_proj``, its ``gate_proj``/``up_proj``; the
            matrix is quantized as one), name all of them. A tied LM head has no weight of its own
            to name: it is always int8. With ``inplace``, a named layer must still be float32 (a
            copy keeps a layer already int8 as its dequantized float32 weight). Default: none.
        residual_activations: multiply every int8 layer's activations in two int8 passes, value and
            rounding residual (:func:`linear_int8`; :func:`set_residual_activations` changes it
            later): twice the integer products, about 250× less activation error.

    Returns:
        The quantized model (``model`` itself with ``inplace``).

    Raises:
        TypeError: ``model`` is not a transformer_core model; ``format`` not a str; ``inplace`` or
            ``residual_activations`` not a bool; ``keep_float`` not a str or a list of str.
        ValueError: an unknown ``format``; a float64 model (the int8 kernels compute in float32:
            build the model in float32); ``inplace`` on a model in training mode or holding GGUF
            blocks; a
            ``keep_float`` name that is unknown, not a linear layer's weight, or one part of a
            packed matrix without the others (the message lists them), or (with ``inplace``) a
            layer already int8, which has no float32 weight left to keep; a linear layer to convert
            with more than ``INT8_MAX_IN_FEATURES`` inputs, or whose float32 weight holds NaN or
            inf (the message names the weight). Nothing is converted then.
    """
    Module, SentenceEncoder = _model_classes()
    if not isinstance(format, str):
        raise TypeError(f"format: expected a str such as 'int8', got {type(format).__name__}")
    if format not in QUANTIZED_FORMATS:
        raise ValueError(f"format: expected one of {list(QUANTIZED_FORMATS)}, got {format!r}")
    inplace = check_bool(inplace, "inplace")
    residual_activations = check_bool(residual_activations, "residual_activations")
    keep = [] if keep_float is None else _name_list(keep_float, "keep_float")
    if isinstance(model, SentenceEncoder):
        bert = quantize(model.model, format, inplace=inplace, keep_float=keep,
                        residual_activations=residual_activations)
        tokenizer = model.tokenizer if inplace else copy.deepcopy(model.tokenizer)  # the copy's own settings
        return model if inplace else SentenceEncoder(bert, tokenizer, pooling=model.pooling,
                                                     normalize=model.normalize, prompts=model.prompts,
                                                     default_prompt_name=model.default_prompt_name,
                                                     include_prompt=model.include_prompt)
    if not isinstance(model, Module):
        raise TypeError(f"model: expected a transformer_core model or layer (BertModel, GPT2LMHeadModel, "
                        f"LlamaForCausalLM, nn.Linear, ...) or a SentenceEncoder, got {type(model).__name__}")
    if np.dtype(model.dtype) != np.float32:
        raise ValueError(f"model: expected a float32 model (the int8 kernels compute in float32), got "
                         f"{np.dtype(model.dtype).name}; build or load it with dtype=np.float32")
    if inplace and model.training:
        raise ValueError("model: in training mode (model.train()); quantized weights do not train: call model.eval() "
                         "before quantizing it in place")
    if inplace and any(f not in ("float32", "int8") for f in model.weight_formats().values()):
        raise ValueError("model: holds GGUF blocks; quantize a copy (inplace=False), which starts from the "
                         "dequantized weights")
    _check_keep_float(model, keep)
    if inplace:
        formats = model.weight_formats()
        for name in keep:
            if formats[name] != "float32":
                raise ValueError(f"keep_float: {name!r} is already {formats[name]}: with inplace=True there is no "
                                 f"float32 weight left to keep; quantize a copy (inplace=False), which keeps it "
                                 f"as the dequantized float32 weight")
    _check_int8_in_features(model, keep)
    _check_finite_weights(model, keep)
    target = model if inplace else _quantizing_copy(model, keep)
    from .decoder import CausalLM
    from .module import storage_changed

    slots = target._slots()
    for impl in target._impls():  # (a copy's layers are converted already: the ones left, if any)
        impl.quantize_int8(keep_float=[slots[n].core_name for n in keep if slots[n].impl is impl])
        if isinstance(target, CausalLM) and hasattr(impl, "quantize_tied_lm_head_int8"):
            impl.quantize_tied_lm_head_int8()
    if inplace:
        storage_changed(target)
    if residual_activations:
        set_residual_activations(target, True)
    return target


def _quantizing_copy(model, keep: list):
    """A copy of a module as ``copy.deepcopy`` makes it (built again from the arguments it was built
    with, a snapshot: a config the caller changed since does not change the copy; a child replaced
    or a module attached since copied as it is), without the gradients, in eval mode, whose linear
    layers (but those of ``keep``, names of ``state_dict``) are converted to int8 one by one as
    their weights are copied in (each weight copied from ``model``'s, dequantized when held
    quantized): the copy never holds every float weight at once, so the peak is the result and one
    layer's float weight, not a float copy of the model besides. The int8 values are those of
    converting a whole float copy: each layer's conversion reads its own weight only."""
    from .module import _rebuilt_copy

    slots = model._slots()
    kept = {(id(slots[n].impl), slots[n].core_name) for n in keep}  # under the original's C++ modules
    waiting = {}  # id(copy's C++ module) -> [(its kept or not yet whole linear weights' names, those not set yet)]

    def on_weight(original_impl, slot) -> None:
        """Called by the copy after it set ``slot``'s weight (of its C++ module ``slot.impl``, copied
        from ``original_impl``): converts to int8 each linear weight of that module now whole (every
        row block of a packed q|k|v or gate|up matrix set) and not kept float. Raises what
        ``quantize_int8`` raises (ValueError, naming the weight)."""
        impl = slot.impl
        if id(impl) not in waiting:
            waiting[id(impl)] = [(group, set(group)) for group in impl.linear_weight_groups()]
        groups = waiting[id(impl)]
        for group, unset in groups:
            unset.discard(slot.core_name)
        whole = [group for group, unset in groups
                 if not unset and not any((id(original_impl), c) in kept for c in group)]
        if whole:  # a linear layer's weight is all there (the rows of a packed matrix, each): convert it
            waiting[id(impl)] = groups = [(g, unset) for g, unset in groups if g not in whole]
            impl.quantize_int8(keep_float=[c for group, _ in groups for c in group])

    return _rebuilt_copy(model, gradients=False, on_weight=on_weight).eval()  # a quantized copy is in eval mode


def set_gguf_weights(module, weights) -> None:
    """Replaces weights of a float32 module by GGUF blocks, used in place from then on: a
    ``Linear``'s weight (a packed matrix's slices — ``q_proj``/``k_proj``/``v_proj`` of a Llama
    layer, ``gate_proj``/``up_proj`` of a gated feed-forward — each from its own bytes, all at once),
    or an embedding table (its lookups then decode the rows they need, a tied LM head multiplies
    by the blocks). How :meth:`LlamaForCausalLM.from_pretrained` builds a model from a GGUF file; for
    modules built by hand from GGUF tensors.

    Everything is checked before anything changes: the names, that each target is a Linear or
    Embedding weight, that every part of a packed matrix is given, the byte counts, that every
    block's fp16 scale (``d``, and Q4_1's ``m``) is finite (one strided pass over the scale bytes: a
    NaN or inf one would make its block's values, and every output of its row, NaN or inf). The
    bytes are not copied: keep them unchanged (a read-only memory map is ideal); the module keeps a
    reference to them.

    Args:
        module: a float32 transformer_core module or model.
        weights: ``{name: (ggml_type, blocks)}``, names as in ``module.state_dict()``, the rows in
            the module's own order (for a Llama model of ``rope_layout="interleaved"``: the GGUF
            file's q/k order), ``blocks`` raw bytes as for :func:`linear_gguf`.

    Raises:
        TypeError: not a transformer_core module; ``weights`` not a mapping; bytes not bytes.
        ValueError: a float64 module, or one in training mode; an unknown name, a weight that is
            not a Linear/Embedding weight (or is stored transposed) or is already quantized, one
            part of a packed matrix without the others (the message names the missing ones), an
            unknown ``ggml_type``, wrong byte counts, a block with a NaN or inf scale (the message
            gives the block's index, its row in the order ``state_dict`` reads the weight in, and
            how many there are); the module is unchanged. Each
            message names the entry (``weights['weight']: ggml_type: ...``).
    """
    from collections.abc import Mapping

    Module, _ = _model_classes()
    if not isinstance(module, Module):
        raise TypeError(f"module: expected a transformer_core module, got {type(module).__name__}")
    if np.dtype(module.dtype) != np.float32:
        raise ValueError(f"module: expected a float32 module (GGUF blocks compute in float32), got "
                         f"{np.dtype(module.dtype).name}")
    if module.training:
        raise ValueError("module: in training mode (module.train()); GGUF blocks do not train: call module.eval() "
                         "first")
    if not isinstance(weights, Mapping):
        raise TypeError(f"weights: expected a mapping of name -> (ggml_type, blocks), got {type(weights).__name__}")
    slots = module._slots()
    formats = module.weight_formats()
    group_of = _linear_weight_groups(module)  # name -> the names of the packed matrix it is part of
    per_impl = {}
    for name, value in weights.items():
        if name not in slots:
            raise ValueError(f"weights: unknown name {name!r} (expected one of {list(slots)})")
        slot = slots[name]
        entry = f"weights[{name!r}]"
        if slot.transposed or len(slot.shape) != 2:
            raise ValueError(f"{entry}: expected a 2-D weight stored as (out, in), got shape {slot.shape}"
                             f"{' (transposed)' if slot.transposed else ''}")
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise TypeError(f"{entry}: expected a (ggml_type, blocks) pair, got {type(value).__name__}")
        if formats[name] != "float32":
            raise ValueError(f"{entry}: expected a float32 weight, got one already held as {formats[name]}")
        missing = [n for n in group_of.get(name, [name]) if n not in weights]
        if missing:  # the C++ check would only say which rows have no blocks
            raise ValueError(f"weights: missing {missing}: {name!r} is one part of the packed matrix "
                             f"{group_of[name]}, whose blocks replace its float32 rows all at once: give every "
                             f"part; the module is unchanged")
        ggml_type, blocks = _ggml_type(value[0], f"{entry}: ggml_type"), value[1]
        expected = _check_block_dims(ggml_type, slot.shape[0], slot.shape[1], f"{entry}: rows",
                                     f"{entry}: in_features")
        raw = _block_bytes(blocks, expected, f"{slot.shape[0]} x {slot.shape[1]} {ggml_type}", f"{entry}: blocks")
        # one strided pass; a bad block's row given in the state dict's order, as the entry is named
        _check_block_scales(raw, ggml_type, slot.shape[1], f"{entry}: blocks", slot.row_permutation)
        per_impl.setdefault(id(slot.impl), (slot.impl, [], []))
        per_impl[id(slot.impl)][1].append((slot.core_name, ggml_type, raw))
        per_impl[id(slot.impl)][2].append(name)
    for impl, tensors, names in per_impl.values():  # every core module checked before any changes
        try:
            impl.load_gguf_weights(tensors, check_only=True)
        except ValueError as e:
            raise ValueError(f"weights ({', '.join(names)}): {e}; the module is unchanged") from None
    for impl, tensors, _ in per_impl.values():
        impl.load_gguf_weights(tensors)
    from .module import storage_changed

    storage_changed(module)


def _set_activation_mode(model, on, method: str) -> int:
    """Calls the core layers' ``method(on)`` across ``model`` (checked): how many stored matrices
    it set (see :func:`set_residual_activations`)."""
    Module, SentenceEncoder = _model_classes()
    if isinstance(model, SentenceEncoder):
        model = model.model
    if not isinstance(model, Module):
        raise TypeError(f"model: expected a transformer_core model, got {type(model).__name__}")
    on = check_bool(on, "on")
    return sum(getattr(impl, method)(on) for impl in model._impls() if hasattr(impl, method))


def set_quantize_activations(model, on: bool = True) -> int:
    """Chooses how ``model``'s GGUF-block weights are multiplied: Q8 activation blocks and integer
    dots (``on``: llama.cpp's way, faster, as accurate as 8-bit activations) or float32 activations
    with the blocks decoded in registers (``on=False``, the default: the dequantize-then-float32
    product up to float32 rounding). See :func:`linear_gguf`.

    Args:
        model: a transformer_core model (or ``SentenceEncoder``).
        on: the mode.

    Returns:
        How many matrices the model stores in GGUF blocks, counted as stored, not as
        ``state_dict`` names: a packed ``[q; k; v]`` or ``[gate; up]`` matrix counts once for its
        parts, and an embedding table in blocks once (its lookups decode rows whatever the mode;
        the mode is for a tied LM head's product with it). A 2-layer untied Llama all in blocks:
        10 (per layer ``[q; k; v]``, ``o_proj``, ``[gate; up]``, ``down_proj``; ``lm_head`` and
        the table), against 16 block entries in ``weight_formats()``. 0: the call changed nothing.

    Raises:
        TypeError: not a transformer_core model; ``on`` not a bool.
    """
    return _set_activation_mode(model, on, "set_quantize_activations")


def set_residual_activations(model, on: bool = True) -> int:
    """Chooses how ``model``'s int8 weights meet their activations: in two int8 passes, the value and
    its rounding residual (``on``; see :func:`linear_int8`: twice the integer products, activation
    error ``sx / 512`` per value instead of ``sx / 2``, but up to ``sx / 256`` for the values whose
    residual is within 0.4 % of ``sx / 2``, where it is clamped), or one pass (``on=False``, the
    default, as ``torch.ao.quantization.quantize_dynamic``).

    Args:
        model: a transformer_core model (or ``SentenceEncoder``).
        on: the mode.

    Returns:
        How many int8 matrices the model stores, counted as stored, not as ``state_dict`` names: a
        packed ``[q; k; v]`` or ``[gate; up]`` matrix counts once for its parts, and a tied LM
        head's int8 copy of the table (made by :func:`quantize`; not in ``weight_formats()``,
        where the table is float32) counts as one. A 2-layer BERT with its pooler: 9 (per layer
        ``[q; k; v]``, the attention output, the intermediate and output dense; the pooler),
        against 13 int8 entries in ``weight_formats()``; a 2-layer untied Llama: 9 against 15;
        tied: 9 (the head's copy) against 14. 0: the call changed nothing.

    Raises:
        TypeError: not a transformer_core model; ``on`` not a bool.
    """
    return _set_activation_mode(model, on, "set_residual_activations")




def weight_bytes(model, names=None) -> int:
    """Bytes the weights of ``model`` occupy as stored (float32/float64: 4/8 per value; int8: one
    byte per value + 4 per output channel — ``shape[1]`` of a GPT-2 Conv1D weight ``(in, out)``,
    ``shape[0]`` of a Linear's ``(out, in)``; GGUF: the blocks), over ``names`` (default: all) — what a
    forward pass streams for them.

    A causal LM quantized by :func:`quantize` whose LM head is tied to its token embedding holds the
    table twice: float32 for the lookups and an int8 copy that the head multiplies by (``V · E``
    bytes + 4 per row). Both count under the table's name (e.g. ``"model.embed_tokens.weight"``).

    Args:
        model: a transformer_core model (or ``SentenceEncoder``).
        names: weight names as in ``model.state_dict()`` (a list, or one str), or None: all.

    Returns:
        The byte count, an int (a name given twice counts once).

    Raises:
        TypeError: not a transformer_core model; ``names`` not a str or a list of str.
        ValueError: an unknown name.
    """
    from .module import TIED_HEAD_COPY

    Module, SentenceEncoder = _model_classes()
    if isinstance(model, SentenceEncoder):
        model = model.model
    if not isinstance(model, Module):
        raise TypeError(f"model: expected a transformer_core model, got {type(model).__name__}")
    slots, formats = model._slots(), model.weight_formats()
    wanted = list(slots) if names is None else _name_list(names, "names")
    for name in wanted:
        if name not in slots:
            raise ValueError(f"names: unknown weight {name!r} (expected names of model.state_dict())")
    # the C++ layout, (out, in) for a linear weight: a transposed slot (GPT-2's Conv1D, (in, out) in
    # the checkpoint) has its scales per column of the checkpoint's shape
    stored_shape = {name: slot.shape[::-1] if slot.transposed else slot.shape for name, slot in slots.items()}
    total = 0
    for name in wanted:
        total += _stored_bytes(name, stored_shape[name], formats[name])
    # the int8 copies of tied tables, under the table's name
    public, wanted_set = _public_names(model), set(wanted)
    for impl in model._impls():
        for core_name, fmt in impl.parameter_storage():
            if not core_name.endswith(TIED_HEAD_COPY):
                continue
            table = public.get((id(impl), core_name[: -len(TIED_HEAD_COPY)]))
            if table in wanted_set:
                total += _stored_bytes(table, stored_shape[table], fmt)
    return total


def _stored_bytes(name: str, shape: tuple, fmt: str) -> int:
    """Bytes of a weight of ``shape`` (the C++ layout: rows are output channels) stored as ``fmt``."""
    count = int(np.prod(shape))
    if fmt in ("float32", "float64"):
        return count * (4 if fmt == "float32" else 8)
    if fmt == "int8":
        return count + 4 * shape[0]
    if fmt in GGML_TYPES:
        block, size = GGML_TYPES[fmt]
        return count // block * size
    raise ValueError(f"{name}: stored as {fmt!r}, whose size this function does not know")
