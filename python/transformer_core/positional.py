"""Positional information: sinusoidal encodings, learned position embeddings and rotary embeddings.

Sinusoidal encoding (Vaswani et al. 2017, §3.5; every tutorial)::

    PE(pos, 2i)   = sin(pos / base^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / base^(2i / d_model))          base = 10000

Learned position embeddings (BERT; the encoder tutorial's ``Embeddings``)::

    Embeddings(ids) = LayerNorm(token_embeddings[ids] + position_embeddings[0 .. L-1])

Rotary position embedding, RoPE (Su et al. 2021, RoFormer; the RoPE section of the tutorials)::

    θ_i = base^(-2i / head_dim),  i = 0 .. head_dim/2 - 1
    RoPE(x, m) = x · cos(m θ) + rotate_half(x) · sin(m θ)      (half-split layout, HF Llama)

so that ``<RoPE(q, m), RoPE(k, n)>`` depends on the positions only through ``m - n``.

The tables are computed by the C++ core in double precision and rounded once to the output
dtype; the rotation runs in C++ over rows in parallel.
"""

from __future__ import annotations

import math

import numpy as np

from ._runtime import core, variant
from ._validation import (
    as_float,
    as_ids,
    check_eps,
    check_float,
    check_int,
    check_positive_int,
    check_tables_allocatable,
    compute_dtype,
    ids_shape,
    physical_memory_bytes,
    resolve_dtype,
    rotary_layout,
    to_numpy,
    unconverted,
)
from .module import Module

__all__ = [
    "sinusoidal_positional_encoding",
    "PositionalEncoding",
    "Embeddings",
    "RotaryEmbedding",
    "rotary_cos_sin",
    "rotate_half",
    "apply_rotary",
    "apply_rotary_pos_emb",
]


def _check_base(base) -> float:
    return check_float(base, "base", minimum=0.0, min_open=True)


# --------------------------------------------------------------------------------------------------
# Sinusoidal positional encoding
# --------------------------------------------------------------------------------------------------


def sinusoidal_positional_encoding(max_len: int, d_model: int, base: float = 10000.0,
                                   dtype=np.float32) -> np.ndarray:
    """The sinusoidal position table of "Attention Is All You Need" (Vaswani et al. 2017, §3.5;
    the tutorials' ``PositionalEncoding``, the encoder–decoder and training tutorials, the einsum tutorial's MATLAB loop)::

        PE(pos, 2i)   = sin(pos / base^(2i / d_model))
        PE(pos, 2i+1) = cos(pos / base^(2i / d_model))

    Even columns are sines, odd columns cosines; column pair ``(2i, 2i+1)`` shares the frequency
    ``base^(-2i/d_model)``. **Odd d_model**: the formula is applied as written, so the last column
    (index ``d_model - 1 = 2i`` with ``i = (d_model - 1) / 2``) is ``sin(pos / base^((d_model-1)/d_model))``
    and has no cosine partner. (The tutorials' torch code fails for odd sizes: its ``pe[:, 1::2]``
    has one column fewer than ``div_term``.)

    Computed in C++ in double precision, then rounded once to ``dtype``.

    Precision, a deliberate difference from the tutorials' torch code: the angles ``pos ·
    base^(-2i/d_model)`` and their sin/cos are computed in float64 and rounded once, so a float32
    table is within 3e-8 of the exact values (half a float32 ulp of 1). The tutorials' table
    (``div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))``,
    ``torch.sin(position * div_term)``) computes the frequencies and the angles in float32, whose
    rounding error grows with the position (~``pos · 6e-8`` radians), so it differs from this one
    by an amount that grows with the position: for ``d_model=512``, ~7e-6 over positions 0..100,
    ~6e-5 over 0..1000 and up to 3.9e-4 over 0..5000 (its default ``max_len``). This table is the
    more accurate one; a model that adds it and the same model in torch differ by that much in
    their embedded inputs. (:class:`~transformer_core.seq2seq.Seq2SeqTransformer` keeps a loaded
    tutorial's own table, to give the tutorial's outputs.)

    Args:
        max_len: number of positions (rows), >= 1; positions are ``0 .. max_len - 1``.
        d_model: model width (columns), >= 1.
        base: the wavelength base (10000 in the paper), a finite number > 0.
        dtype: ``np.float32`` (default) or ``np.float64``.

    Returns:
        ``(max_len, d_model)`` array of ``dtype``, values in [-1, 1].

    Raises:
        TypeError: non-int sizes, non-real ``base``, or a dtype other than float32/float64.
        ValueError: ``max_len`` or ``d_model`` < 1; ``base`` <= 0 or not finite; a table larger
            than this machine's memory, or whose size overflows 64 bits (naming ``(max_len,
            d_model)``), before anything is allocated.
    """
    max_len = check_positive_int(max_len, "max_len")
    d_model = check_positive_int(d_model, "d_model")
    base = _check_base(base)
    dtype = resolve_dtype(dtype)
    return variant("sinusoidal_positional_encoding", dtype)(max_len, d_model, base)


class PositionalEncoding:
    """Adds the sinusoidal table to its input (the tutorials' ``PositionalEncoding``; Vaswani et al.
    2017, §3.5)::

        y = x + PE[offset : offset + L]

    The tutorial's dropout is omitted (the identity at inference). The table is
    :func:`sinusoidal_positional_encoding`'s, computed in float64 and rounded once: the tutorial's
    float32 torch table differs from it by up to 3.9e-4 over 5,000 positions (``d_model=512``; ours
    is within 3e-8 of the exact values: see that function's precision note).

    Args:
        d_model: E, the model width (odd allowed: see :func:`sinusoidal_positional_encoding`).
        max_len: rows of the table (positions it can encode), default 5000.
        dtype: ``np.float32`` (default) or ``np.float64``; inputs are cast to it.
        base: wavelength base (keyword only), default 10000.

    Attributes:
        pe: the table, ``(max_len, d_model)`` of ``dtype`` (e.g. to plot, as the tutorials do).

    Raises:
        TypeError / ValueError: as :func:`sinusoidal_positional_encoding`.
    """

    def __init__(self, d_model: int, max_len: int = 5000, dtype=np.float32, *, base: float = 10000.0):
        self.dtype = resolve_dtype(dtype)
        self.d_model = check_positive_int(d_model, "d_model")
        self.max_len = check_positive_int(max_len, "max_len")
        self.base = _check_base(base)
        self.pe = sinusoidal_positional_encoding(self.max_len, self.d_model, self.base, self.dtype)

    def __call__(self, x, offset: int = 0) -> np.ndarray:
        return self.forward(x, offset)

    def forward(self, x, offset: int = 0) -> np.ndarray:
        """``x + PE[offset : offset + L]``.

        Args:
            x: ``(N, L, E)`` or ``(L, E)`` with ``E = d_model``.
            offset: position of the first row of ``x`` (>= 0; e.g. the cache length when decoding).

        Returns:
            Same shape as ``x``, dtype ``self.dtype``.

        Raises:
            ValueError: ``x`` not 2-D/3-D or empty, last dim != d_model, or
                ``offset + L > max_len``. TypeError: non-numeric ``x`` or non-int ``offset``.

        Everything is checked on ``x`` as given (its dtype and shape) before its copy in ``dtype``
        is made: a refused call allocates nothing.
        """
        offset = check_int(offset, "offset", 0)
        raw = to_numpy(x, "x")  # no copy of an array or tensor: the checks read its dtype and shape
        compute_dtype(raw, "x")  # TypeError for data that is not real numbers
        if raw.ndim not in (2, 3):
            raise ValueError(f"x: expected (N, L, E) or (L, E), got {raw.ndim}-D with shape {raw.shape}")
        if raw.shape[-1] != self.d_model:
            raise ValueError(f"x: expected last dim {self.d_model} (d_model), got shape {raw.shape}")
        L = raw.shape[-2]
        if offset + L > self.max_len:
            raise ValueError(f"x: sequence length {L} (+ offset {offset}) exceeds max_len {self.max_len}")
        x = as_float(raw, "x", self.dtype)  # the empty check, then the copy (if one is needed)
        return x + self.pe[offset:offset + L]

    def __repr__(self) -> str:
        return f"PositionalEncoding(d_model={self.d_model}, max_len={self.max_len}, base={self.base})"


# --------------------------------------------------------------------------------------------------
# Learned position embeddings (the encoder tutorial's Embeddings)
# --------------------------------------------------------------------------------------------------


def _check_embedding_tables(vocab_size: int, hidden_size: int, max_position_embeddings: int, type_vocab_size: int,
                            dtype) -> None:
    """The tables of the C++ ``Embeddings`` layer (word, position, token type, LayerNorm) checked
    against this machine's memory before it allocates them, naming the arguments (or config fields)
    and the table: ValueError (the C++ check would name its inner ``Embedding``'s
    ``(num_embeddings, embedding_dim)``)."""
    tables = [("vocab_size, hidden_size", "the word embedding table", vocab_size, hidden_size),
              ("max_position_embeddings, hidden_size", "the position embedding table", max_position_embeddings,
               hidden_size)]
    if type_vocab_size:
        tables.append(("type_vocab_size, hidden_size", "the token type embedding table", type_vocab_size, hidden_size))
    tables.append(("hidden_size", "the LayerNorm weight and bias", 2, hidden_size))
    check_tables_allocatable(tables, dtype)


class Embeddings(Module):
    """Token + learned position embeddings, then LayerNorm (the encoder tutorial's ``Embeddings``; BERT
    without token types)::

        y = LayerNorm(token_embeddings[input_ids] + position_embeddings[0 .. L-1])

    The tutorial's dropout is the identity at inference and is omitted. Computed by the same C++
    ``Embeddings`` layer as :class:`transformer_core.BertModel`'s input embeddings.

    Args:
        vocab_size: rows of the token table.
        hidden_size: H, the embedding width.
        max_position_embeddings: rows of the position table (the longest input).
        layer_norm_eps: LayerNorm epsilon, 1e-12 as in the tutorial (and BERT).
        dtype: ``np.float32`` (default) or ``np.float64``.

    Weights (the tutorial's names): ``token_embeddings.weight (vocab_size, H)``,
    ``position_embeddings.weight (max_position_embeddings, H)``, ``layer_norm.weight (H)``,
    ``layer_norm.bias (H)``; a torch state_dict of the tutorial's module loads as is.

    Raises:
        TypeError / ValueError: non-int or non-positive sizes, negative ``layer_norm_eps``; tables
            larger than this machine's memory (naming the sizes and the table), before any is allocated.
    """

    _CORE_NAMES = {"word_embeddings.weight": "token_embeddings.weight",
                   "LayerNorm.weight": "layer_norm.weight", "LayerNorm.bias": "layer_norm.bias"}

    def __init__(self, vocab_size: int, hidden_size: int, max_position_embeddings: int,
                 layer_norm_eps: float = 1e-12, dtype=np.float32):
        sfx = self._init_dtype(dtype)
        self.vocab_size = check_positive_int(vocab_size, "vocab_size")
        self.hidden_size = check_positive_int(hidden_size, "hidden_size")
        self.max_position_embeddings = check_positive_int(max_position_embeddings, "max_position_embeddings")
        self.layer_norm_eps = check_eps(layer_norm_eps, "layer_norm_eps")
        _check_embedding_tables(self.vocab_size, self.hidden_size, self.max_position_embeddings, 0, self.dtype)
        config = core.EmbeddingsConfig()
        config.vocab_size, config.hidden_size = self.vocab_size, self.hidden_size
        config.max_position_embeddings, config.type_vocab_size = self.max_position_embeddings, 0
        config.layer_norm, config.layer_norm_eps = True, self.layer_norm_eps
        self._impl = getattr(core, "Embeddings" + sfx)(config)
        self._init_weights()

    _public_name_of_core_name_only = True  # a class table: the core name alone

    def _public_name(self, core_name: str) -> str:
        return self._CORE_NAMES.get(core_name, core_name)

    def forward(self, input_ids) -> np.ndarray:
        """Embeds token ids.

        Args:
            input_ids: ``(N, L)`` integer ids in ``[0, vocab_size)`` (a 1-D ``(L,)`` gains N = 1).

        Returns:
            ``(N, L, hidden_size)`` of ``self.dtype``.

        Raises:
            TypeError: non-integer ids. ValueError: wrong rank, empty, ids out of range, or
            ``L > max_position_embeddings``.
        """
        N, L = ids_shape(input_ids, "input_ids")
        if L > self.max_position_embeddings:  # before the ids' int64 copy
            raise ValueError(f"input_ids: sequence length {L} exceeds max_position_embeddings "
                             f"{self.max_position_embeddings}")
        ids = as_ids(input_ids, "input_ids")
        positions = np.ascontiguousarray(np.broadcast_to(np.arange(L, dtype=np.int64), (N, L)).ravel())
        if self.training:  # the C++ layer keeps pointers to the ids until backward
            flat = ids.ravel().copy()
            self._saved = (flat, positions, (N, L))
            return self._impl.forward_train(flat, positions, None, 0.0, 0).reshape(N, L, self.hidden_size)
        return self._impl.forward(ids.ravel(), positions, None).reshape(N, L, self.hidden_size)

    def backward(self, grad_output) -> None:
        """Adds the gradients of the last training forward's tables and LayerNorm, given
        ``grad_output (N, L, hidden_size)``. Returns None (ids have no gradient).

        Raises:
            NoTrainingStateError: no training forward since the last backward.
            ValueError: ``grad_output`` not of the output's shape.
        """
        _ids, _positions, (N, L) = self._peek_saved()
        g = unconverted(grad_output, "grad_output")  # its shape checked before its copy
        if g.shape != (N, L, self.hidden_size):
            raise ValueError(f"grad_output: expected shape {(N, L, self.hidden_size)} (the forward's output), "
                             f"got {g.shape}")
        g = as_float(g, "grad_output", self.dtype)
        self._take_saved()  # checked: now consumed
        self._impl.backward(g.reshape(N * L, self.hidden_size))

    def __repr__(self) -> str:
        return (f"Embeddings(vocab_size={self.vocab_size}, hidden_size={self.hidden_size}, "
                f"max_position_embeddings={self.max_position_embeddings}, layer_norm_eps={self.layer_norm_eps})")


# --------------------------------------------------------------------------------------------------
# Rotary position embedding (RoPE)
# --------------------------------------------------------------------------------------------------


class RotaryEmbedding:
    """The RoPE tables of the positions below ``max_position_embeddings`` (Su et al. 2021; the RoPE
    section of the tutorials), computed in C++ (double precision, rounded to ``dtype``: more
    accurate than Hugging Face's float32 angles, see :func:`rotary_cos_sin`), for
    :class:`transformer_core.nn.MultiheadAttention` to rotate q and k inside its call.

    The tables of the first 4,096 positions (``FIRST_POSITIONS``) are built here; a call that
    reaches a later position grows them (doubling, up to ``max_position_embeddings``), so a long
    context costs memory only once a sequence that long runs. Several threads may use one instance
    at once.

    Args:
        head_dim: D, even, >= 2.
        max_position_embeddings: the positions the tables may cover (>= 1).
        base: rotary base θ (10000 in RoFormer / Llama 1-2; SmolLM2 100000), finite > 0.
        layout: ``"half"`` (GPT-NeoX, Hugging Face Llama) or ``"interleaved"`` (GPT-J, Meta's Llama).
        dtype: ``np.float32`` or ``np.float64``.

    Raises:
        TypeError / ValueError: as :func:`rotary_cos_sin`. ValueError naming ``head_dim``: the
            tables built here (``FIRST_POSITIONS`` positions at most) beyond this machine's memory.
            A call that would grow the tables beyond it raises ValueError then.
    """

    def __init__(self, head_dim: int, max_position_embeddings: int, base: float = 10000.0, layout: str = "half",
                 dtype=np.float32):
        self.dtype = resolve_dtype(dtype)
        self.head_dim = check_positive_int(head_dim, "head_dim")
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim: expected an even number (RoPE rotates pairs), got {head_dim}")
        self.max_position_embeddings = check_positive_int(max_position_embeddings, "max_position_embeddings")
        self.base = _check_base(base)
        self.layout = rotary_layout(layout)
        _check_first_tables(self.head_dim, self.max_position_embeddings, self.layout, self.dtype)
        self._impl = variant("RotaryEmbedding", self.dtype)(self.head_dim, self.max_position_embeddings, self.base,
                                                           self.layout)

    def __repr__(self) -> str:
        return (f"RotaryEmbedding(head_dim={self.head_dim}, max_position_embeddings={self.max_position_embeddings}, "
                f"base={self.base}, layout={self.layout!r}, dtype={np.dtype(self.dtype).name})")


#: The positions whose tables a :class:`RotaryEmbedding` builds when it is made (fewer when
#: ``max_position_embeddings`` is smaller): the C++ ``RotaryEmbedding::kFirstPositions``.
FIRST_POSITIONS = 4096


def _check_first_tables(head_dim: int, max_positions: int, layout: str, dtype) -> None:
    """ValueError naming ``head_dim`` when the tables a :class:`RotaryEmbedding` builds when it is
    made (cos and sin of ``min(max_positions, FIRST_POSITIONS)`` positions × ``head_dim`` values in
    the ``"half"`` layout, ``head_dim / 2`` in ``"interleaved"``: the C++ ``build``'s arithmetic)
    exceed this machine's memory. The positions are at most 4,096, so the width is the cause: the
    C++ check, which follows, names neither argument."""
    rows = min(max_positions, FIRST_POSITIONS)
    per_dim = 2 * rows * np.dtype(dtype).itemsize // (1 if layout == "half" else 2)  # bytes per unit of head_dim
    need = per_dim * head_dim  # Python ints: exact
    limit = physical_memory_bytes()
    if need > limit:
        largest = limit // per_dim // 2 * 2  # even
        raise ValueError(f"head_dim: expected an even number <= {largest}, whose rotary tables (cos and sin of the first "
                         f"{rows} positions, {layout} layout, {np.dtype(dtype).name}) fit this machine's memory "
                         f"({limit} bytes), got {head_dim} ({need} bytes)")


def rotary_cos_sin(seq_len: int, head_dim: int, base: float = 10000.0, offset: int = 0,
                   dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """The cos/sin tables of RoPE (Su et al. 2021) in the half-split layout of Hugging Face's
    Llama (the RoPE section of the tutorials)::

        inv_freq = 1 / base^(arange(0, head_dim, 2) / head_dim)          (head_dim/2,)
        freqs    = positions ⊗ inv_freq,  positions = offset .. offset + seq_len - 1
        emb      = concat(freqs, freqs)                                   (seq_len, head_dim)
        cos, sin = cos(emb), sin(emb)

    ``offset`` > 0 gives the rows for incremental decoding with a KV cache (the new tokens sit at
    positions ``offset ..``).

    Precision, a deliberate difference from Hugging Face: the angles and their cos/sin are computed
    in float64 and rounded once to ``dtype`` (float32 tables within 3e-8 of the exact values for
    positions below 2**26, about 1e-7 at 2**30; the float64 angle ``position · inv_freq`` itself is
    off by up to ``position · 1.1e-16`` radians, 1.1e-4 at position 1e12).
    HF's ``LlamaRotaryEmbedding`` computes the angles ``position · inv_freq`` in float32, whose
    rounding error grows with the position (~``position · 6e-8`` radians), so its tables differ
    from these by an amount that grows with the position: for ``head_dim=128``, up to ~6e-5 over
    positions 0..1024 and ~5e-4 over positions 0..8192 (transformers 5.23). These tables are the
    more accurate ones; a model run here and in HF differs by that much in its rotary inputs.

    Args:
        seq_len: rows, >= 1.
        head_dim: D, even, >= 2.
        base: rotary base θ (10000 in RoFormer / Llama 1-2; 500000 in Llama 3), finite > 0.
        offset: the first position, >= 0, with ``offset + seq_len <= 2**53`` (float64 holds
            every whole number up to 2**53; beyond it two positions would share a row).
        dtype: ``np.float32`` (default) or ``np.float64``.

    Returns:
        ``(cos, sin)``, each ``(seq_len, head_dim)`` of ``dtype``, with
        ``cos[:, i] == cos[:, i + head_dim/2]`` (likewise sin).

    Raises:
        ValueError: ``head_dim`` odd or < 2, ``seq_len`` < 1, ``offset`` < 0 or ``offset +
            seq_len`` > 2**53, bad ``base``; tables
            larger than this machine's memory, or whose size overflows 64 bits (naming
            ``(seq_len, head_dim)``), before anything is allocated.
        TypeError: non-int sizes, non-real base, dtype not float32/float64.
    """
    seq_len = check_positive_int(seq_len, "seq_len")
    head_dim = check_positive_int(head_dim, "head_dim")
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim: expected an even number (RoPE rotates pairs), got {head_dim}")
    offset = check_int(offset, "offset", 0)
    if offset + seq_len > 2 ** 53:
        raise ValueError(f"offset: expected offset + seq_len <= 2**53 (the positions float64 tells apart), got "
                         f"offset {offset} with seq_len {seq_len}")
    base = _check_base(base)
    dtype = resolve_dtype(dtype)
    return variant("rotary_cos_sin", dtype)(seq_len, head_dim, base, offset)


def rotate_half(x) -> np.ndarray:
    """``concat(-x2, x1)`` of the two halves ``x1 = x[..., :D/2]``, ``x2 = x[..., D/2:]``
    (the tutorials' ``rotate_half``; HF Llama): multiplying a pair ``(x1_i, x2_i)`` by ``i`` in the
    complex plane.

    Args:
        x: ``(..., D)`` float array, D even.

    Returns:
        ``(..., D)``, dtype of ``x`` (float32 unless float64).

    Raises:
        ValueError: empty ``x``, rank 0, or odd D. TypeError: non-numeric ``x``.
    """
    x = unconverted(x, "x", min_ndim=1)  # D checked before x's copy
    D = x.shape[-1]
    if D % 2 != 0:
        raise ValueError(f"x: expected an even last dim, got shape {x.shape}")
    x = as_float(x, "x")
    return np.concatenate([-x[..., D // 2:], x[..., :D // 2]], axis=-1)


def _table_shape(shape: tuple, name: str, x_shape: tuple, D: int, unsqueeze_dim: int = 1,
                 x_name: str = "x") -> tuple:
    """The shape of the table ``name`` (cos or sin, of ``shape``) as it broadcasts over ``x`` of
    ``x_shape`` (D its even last dim), after the checks of its shape against x's: shapes only, made
    before anything is converted.

    The table's rank picks its meaning (:func:`apply_rotary`): 2-D ``(L, W)`` is shared by every
    leading index; rank ``x.ndim - 1`` (>= 3) lacks the head axis, which is inserted at
    ``unsqueeze_dim`` as Hugging Face's ``cos.unsqueeze(unsqueeze_dim)`` (the shape returned has
    it); rank ``x.ndim`` broadcasts as is.

    Raises:
        ValueError: a last dim ``W`` other than ``D`` or ``D/2``; any other rank (naming ``name``,
            and ``x_name``, the rotated input's); ``unsqueeze_dim`` out of range; leading dims that
            do not broadcast to x's.
    """
    W = shape[-1]
    if W not in (D, D // 2):
        raise ValueError(f"{name}: expected last dim {D} (head_dim) or {D // 2} (head_dim/2), got shape {shape}")
    ndim, x_ndim = len(shape), len(x_shape)
    given = f"shape {shape}"
    if ndim != 2 and ndim == x_ndim - 1:
        # HF's table without the head axis, e.g. (N, L, D) from LlamaRotaryEmbedding for x (N, H, L, D)
        if not -(ndim + 1) <= unsqueeze_dim <= ndim:
            raise ValueError(f"unsqueeze_dim: expected an int in [{-(ndim + 1)}, {ndim}] (where the head axis "
                             f"goes in {name} of shape {shape}), got {unsqueeze_dim}")
        at = unsqueeze_dim % (ndim + 1)
        shape = shape[:at] + (1,) + shape[at:]
        given += f" (with the head axis at unsqueeze_dim={unsqueeze_dim}: {shape})"
    elif ndim not in (2, x_ndim):
        raise ValueError(f"{name}: expected a 2-D (L, {W}) table, or one of rank {x_ndim - 1} (no head axis, "
                         f"Hugging Face's) or {x_ndim} ({x_name}'s rank {x_ndim}, shape {x_shape}), "
                         f"got shape {shape}")
    lead, x_lead = shape[:-1], x_shape[:-1]
    # np.broadcast_shapes(lead, x_lead) == x_lead, without its arrays: each dim x's or 1
    ok = len(lead) <= len(x_lead) and all(n in (1, m) for n, m in zip(lead[::-1], x_lead[::-1]))
    if not ok:
        raise ValueError(f"{name}: {given} does not broadcast to {x_name}'s {x_lead + (W,)} (..., L, {W})")
    return shape


def _rotary_values(t, name: str, x_shape: tuple, D: int, layout: str, dtype, unsqueeze_dim: int = 1,
                   x_name: str = "x") -> np.ndarray:
    """cos or sin (already converted by :func:`_rotary_tables`; a broadcast view stays one) as the
    values the kernel reads for ``x`` of ``x_shape``: a C-contiguous array of ``x``'s rank whose dims
    are ``x``'s or 1 (broadcast), last dim ``W = D`` (half) or ``D/2`` (interleaved). Only the values
    the table holds are copied, never its broadcast over ``x`` (see :func:`_rotate`). Its shape is
    checked as :func:`_table_shape` checks it (its ValueErrors)."""
    t = t.reshape(_table_shape(t.shape, name, x_shape, D, unsqueeze_dim, x_name))  # a view: 1-dims inserted
    x_ndim = len(x_shape)
    W = t.shape[-1]
    # the values t holds: each broadcast leading dim (size 1 or stride 0) of x's rank cut to size 1
    t = t.reshape((1,) * (x_ndim - t.ndim) + t.shape)
    t = t[tuple(slice(0, 1) if n == 1 or st == 0 else slice(None) for n, st in zip(t.shape[:-1], t.strides[:-1]))]
    if layout == "half" and W == D // 2:
        return np.concatenate([t, t], axis=-1)  # one value per frequency -> the half-split row
    if layout == "interleaved" and W == D:
        t = t[..., :D // 2]  # the half-split row's first half
    return np.ascontiguousarray(t)


#: For a table that is not one block shared by every leading index of x (:func:`_rotate`): an x of
#: at most this many rows gets the table broadcast to it (one call); a larger one is rotated in blocks
#: that each share one table when they have at least ``_SHARED_BLOCK_ROWS`` rows (no copy), else a
#: range of about this many rows at a time with the table broadcast to it.
_GATHER_ROWS = 2**14
_SHARED_BLOCK_ROWS = 2**10


def _shared_from(t: np.ndarray, x_lead: tuple) -> int:
    """The number p of x's leading dims to fix so that ``t`` (from :func:`_rotary_values`), for each
    fixed index, is one table shared by that block of x's rows: row ``r`` of the block reads row
    ``r % T`` of ``t[index]`` (its dims are 1 up to a point, x's from there on). 0: t is one table for
    all of x (e.g. a 2-D ``(L, W)``); 1 for HF's ``(N, 1, L, W)`` and x ``(N, H, L, D)``."""
    lead = t.shape[:-1]
    j = len(lead)
    while j > 0 and lead[j - 1] == x_lead[j - 1]:
        j -= 1
    return max((k + 1 for k in range(j) if lead[k] != 1), default=0)


def apply_rotary(x, cos, sin, layout: str = "half", unsqueeze_dim: int = 1) -> np.ndarray:
    """Rotates one tensor by RoPE (Su et al. 2021; the tutorials' ``apply_rotary_pos_emb``, one input).

    ``layout="half"`` (GPT-NeoX, Hugging Face Llama, the seed), pairs ``(x_i, x_{i+D/2})``::

        y = x · cos + rotate_half(x) · sin

    computed exactly as written, with every column of ``cos``/``sin`` (for the tables of
    :func:`rotary_cos_sin` the two halves are equal).

    ``layout="interleaved"`` (GPT-J, Meta's Llama ``view_as_complex``), pairs ``(x_2i, x_2i+1)``::

        y_2i   = x_2i · c_i - x_2i+1 · s_i
        y_2i+1 = x_2i+1 · c_i + x_2i · s_i          c_i = cos[..., i], s_i = sin[..., i], i < D/2

    i.e. it takes **the same half-split tables** and reads only their first half
    ``cos[..., :D/2]`` (one value per frequency; the second half is ignored).

    In both layouts ``cos``/``sin`` may also be given with last dim ``D/2`` (one value per
    frequency: ``cos(freqs)``), which is used for both halves in the half layout.

    **Table shapes**, by rank (W = D or D/2):

    * 2-D ``(L, W)`` (e.g. :func:`rotary_cos_sin`): one table for every leading index of ``x``.
    * rank ``x.ndim - 1`` (3-D or more): Hugging Face's convention, the tables of
      ``LlamaRotaryEmbedding`` (``(N, L, D)``, one row per batch entry's ``position_ids``) lack
      the head axis, which is inserted at ``unsqueeze_dim`` as HF's
      ``apply_rotary_pos_emb(..., unsqueeze_dim)`` does: ``(N, L, D)`` becomes ``(N, 1, L, D)``
      for ``x (N, H, L, D)`` (``unsqueeze_dim=1``), ``(N, L, 1, D)`` for ``x (N, L, H, D)``
      (``unsqueeze_dim=2``).
    * rank ``x.ndim``: broadcast to ``x`` as is (e.g. ``(N, 1, L, D)`` or ``(1, 1, L, D)``).

    Args:
        x: ``(..., L, D)``, D even (e.g. ``(N, H, L, D)`` or ``(L, D)``).
        cos, sin: tables as above, broadcastable to ``x``'s shape; the same shape for both.
        layout: ``"half"`` or ``"interleaved"``.
        unsqueeze_dim: where the head axis goes in a table of rank ``x.ndim - 1`` (default 1, as
            HF); an int in ``[-(r + 1), r]`` for tables of rank ``r``; unused for other ranks.

    Returns:
        The rotated copy of ``x``, same shape, dtype of ``x`` (float32 unless float64); the
        tables are cast to it. Computed in C++ in parallel over rows.

    Raises:
        ValueError: ``x`` of rank < 2, empty, or with odd D; tables of another width, of another
            rank than above, or not broadcastable; ``sin`` shaped unlike ``cos``; unknown
            ``layout``; ``unsqueeze_dim`` out of range.
        TypeError: non-numeric arrays; non-int ``unsqueeze_dim``.
    """
    return _apply_rotary(x, cos, sin, layout, "x", None, unsqueeze_dim)


def _rotary_tables(cos, sin, dtype) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin converted to ``dtype`` (at least 2-D, the same shape). A broadcast table (a view
    with stride-0 leading dims: ``np.broadcast_to``, torch's ``expand``) has only the values it holds
    converted, and is returned as a broadcast view of them with the shape given: copied whole it could
    be any size, whatever x's."""
    c = _as_table(cos, "cos", dtype)
    s = _as_table(sin, "sin", dtype)
    if s.shape != c.shape:
        raise ValueError(f"sin: expected the shape of cos {c.shape}, got {s.shape}")
    return c, s


def _as_table(value, name: str, dtype) -> np.ndarray:
    """One rotary table as :func:`_rotary_tables` describes (``as_float``'s errors, naming ``name``)."""
    arr = to_numpy(value, name)
    if arr.ndim < 2 or 0 not in arr.strides[:-1]:
        return as_float(arr, name, dtype, min_ndim=2)
    held = as_float(arr[tuple(slice(0, 1) if st == 0 else slice(None) for st in arr.strides[:-1])], name, dtype,
                    min_ndim=2)
    return np.broadcast_to(held, arr.shape)


def _check_rotary(x: np.ndarray, cos, sin, unsqueeze_dim: int, name: str,
                  first: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The checks of a rotation of ``x`` (as given, rank >= 2 checked; named ``name``) by cos and sin
    that need only shapes, made before anything is copied: x's even D, D against the input rotated
    with it by the same tables (``first``: its ``(shape, name)``, q's for k), each table's dtype and
    rank (``as_float``'s errors), sin's shape against cos's, and cos's against x's
    (:func:`_table_shape`). Returns ``(cos, sin)`` as :func:`to_numpy` gives them (nothing
    converted), for :func:`_rotate`."""
    D = x.shape[-1]
    if D % 2 != 0:
        raise ValueError(f"{name}: expected an even head_dim (last dim), got shape {x.shape}")
    if first is not None and first[0][-1] != D:  # else the tables' check would blame cos
        raise ValueError(f"{name}: expected head_dim {first[0][-1]} ({first[1]}'s last dim), got shape {x.shape} "
                         f"({first[1]}: {first[0]})")
    c, s = unconverted(cos, "cos", min_ndim=2), unconverted(sin, "sin", min_ndim=2)
    if s.shape != c.shape:
        raise ValueError(f"sin: expected the shape of cos {c.shape}, got {s.shape}")
    _table_shape(c.shape, "cos", x.shape, D, unsqueeze_dim, name)
    return c, s


def _apply_rotary(x, cos, sin, layout: str, name: str, dtype, unsqueeze_dim: int = 1) -> np.ndarray:
    """One input ``x`` (the argument ``name``) rotated: :func:`_apply_rotary_each` of it alone."""
    return _apply_rotary_each(((x, name, dtype),), cos, sin, layout, unsqueeze_dim)[0]


def _apply_rotary_each(inputs, cos, sin, layout: str, unsqueeze_dim: int) -> list[np.ndarray]:
    """Each ``(x, name, dtype)`` of ``inputs`` rotated by cos and sin (``dtype`` None: x's own,
    :func:`compute_dtype`). Every input is checked against the first one's head_dim (q's and k's
    must agree: one table rotates both) and the tables (:func:`_check_rotary`) before any is
    converted or rotated: a bad k is refused before q's rotated copy is made."""
    layout = rotary_layout(layout)
    unsqueeze_dim = check_int(unsqueeze_dim, "unsqueeze_dim", None, None)
    checked = []
    for x, name, dtype in inputs:
        x = unconverted(x, name, min_ndim=2)
        first = (checked[0][0].shape, checked[0][1]) if checked else None  # k is checked against q
        cos, sin = _check_rotary(x, cos, sin, unsqueeze_dim, name, first)
        checked.append((x, name, dtype))
    rotated = []
    for x, name, dtype in checked:
        x = as_float(x, name, dtype)
        rotated.append(_rotate(variant("apply_rotary", x.dtype.type), x, cos, sin, layout, unsqueeze_dim, name))
    return rotated


def _rotate(rotate, x: np.ndarray, cos, sin, layout: str, unsqueeze_dim: int, name: str) -> np.ndarray:
    """``rotate(x, c, s, layout)`` (a kernel taking 2-D tables whose row ``r % table_rows`` goes with
    row r of x: ``apply_rotary``'s, ``rotary_backward``'s) for ``x`` (converted, D even) and the
    tables as :func:`apply_rotary` takes them, checked (naming ``cos``, ``sin``, ``unsqueeze_dim``
    and ``name``, x's). No table is broadcast to all of a large x: one shared by every leading index
    of x is passed as is, any other a block of x's rows at a time (see ``_GATHER_ROWS``)."""
    D = x.shape[-1]
    dtype = x.dtype.type
    cos, sin = _rotary_tables(cos, sin, dtype)
    if (cos.ndim == 2 and cos.shape[-1] == (D if layout == "half" else D // 2)
            and cos.flags.c_contiguous and sin.flags.c_contiguous):
        return rotate(x, cos, sin, layout)  # an (L, W) table the kernel reads as is: _rotary_values's own
    c = _rotary_values(cos, "cos", x.shape, D, layout, dtype, unsqueeze_dim, name)
    s = _rotary_values(sin, "sin", x.shape, D, layout, dtype, unsqueeze_dim, name)
    x_lead = x.shape[:-1]
    W = c.shape[-1]
    fixed = max(_shared_from(c, x_lead), _shared_from(s, x_lead))
    if fixed == 0:
        return rotate(x, c.reshape(-1, W), s.reshape(-1, W), layout)
    # a table that differs along a leading dim of x and is broadcast along a later one (HF's (N, L, D)
    # for x (N, H, L, D)): never broadcast to all of x
    c_all, s_all = (np.broadcast_to(t, x_lead + (W,)) for t in (c, s))
    inner = [math.prod(x_lead[k:]) for k in range(len(x_lead) + 1)]  # x's rows below dim k
    if inner[0] <= _GATHER_ROWS:  # a small x: its tables broadcast to it, one call
        return rotate(x, np.ascontiguousarray(c_all).reshape(-1, W), np.ascontiguousarray(s_all).reshape(-1, W),
                      layout)
    out = np.empty_like(x)
    if inner[fixed] >= _SHARED_BLOCK_ROWS:  # blocks (x's first `fixed` dims fixed) each sharing one table
        for index in np.ndindex(*x_lead[:fixed]):
            at = tuple(i if n != 1 else 0 for i, n in zip(index, c.shape))
            at_s = tuple(i if n != 1 else 0 for i, n in zip(index, s.shape))
            out[index] = rotate(x[index], c[at].reshape(-1, W), s[at_s].reshape(-1, W), layout)
        return out
    # small blocks: the tables broadcast to a range of x's rows at a time (at most 2 · _GATHER_ROWS),
    # a range along dim `axis` of x's leading dims, the dims before it fixed
    axis = next(k for k in range(len(x_lead)) if inner[k + 1] <= _GATHER_ROWS)
    step = max(1, _GATHER_ROWS // inner[axis + 1])
    for outer in np.ndindex(*x_lead[:axis]):
        for start in range(0, x_lead[axis], step):
            block = outer + (slice(start, start + step),)
            out[block] = rotate(x[block], np.ascontiguousarray(c_all[block]).reshape(-1, W),
                                np.ascontiguousarray(s_all[block]).reshape(-1, W), layout)
    return out


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim: int = 1, layout: str = "half") -> tuple[np.ndarray, np.ndarray]:
    """RoPE on queries and keys (the tutorials' ``apply_rotary_pos_emb``; Su et al. 2021), with
    Hugging Face Llama's signature and table convention::

        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)   (HF's (N, L, D) tables)
        q_embed = q · cos + rotate_half(q) · sin,   k_embed = k · cos + rotate_half(k) · sin

    See :func:`apply_rotary` for the two layouts and the table shapes: HF's ``(N, L, D)`` tables
    (``LlamaRotaryEmbedding``'s output, per-row ``position_ids``) get the head axis at
    ``unsqueeze_dim``, as in HF; 2-D ``(L, D)`` tables (:func:`rotary_cos_sin`) are shared by
    every row; tables of the inputs' rank (``(N, 1, L, D)``) broadcast as is. ``q`` and ``k`` may
    have different head counts (GQA) as long as the tables broadcast to both. Each of ``q`` and
    ``k`` is rotated in its own dtype (float32 unless float64; the tables follow it), as torch's
    ``q * cos + ...`` and ``k * cos + ...`` with float32 tables: a float64 ``k`` is not narrowed to a
    float32 ``q``'s dtype.

    Args:
        q: ``(..., L, D)``, e.g. ``(N, H, L, D)``.  k: ``(..., L, D)``, e.g. ``(N, H_kv, L, D)``.
        cos, sin: ``(L, W)``, ``(N, L, W)`` (HF) or ``(N, 1, L, W)`` with ``W = D`` or ``D/2``,
            e.g. from :func:`rotary_cos_sin`; the same shape for both.
        unsqueeze_dim: where HF's tables get the head axis (default 1, as HF: ``q (N, H, L, D)``;
            2 for ``q (N, L, H, D)``).
        layout: ``"half"`` (default) or ``"interleaved"`` (keyword; not in HF's signature).

    Returns:
        ``(q_rot, k_rot)``, shapes and dtypes of ``q`` and ``k`` (float32 unless float64).

    Raises:
        ValueError: ``k``'s head_dim (last dim) not ``q``'s; and as :func:`apply_rotary` (the
            message names ``q``, ``k``, ``cos``, ``sin`` or ``unsqueeze_dim``).
        TypeError: as :func:`apply_rotary`.
    """
    q_dtype, k_dtype = compute_dtype(q, "q"), compute_dtype(k, "k")
    # both (and the tables against both) checked before either is converted or rotated
    q_rot, k_rot = _apply_rotary_each(((q, "q", q_dtype), (k, "k", k_dtype)), cos, sin, layout, unsqueeze_dim)
    return q_rot, k_rot
