"""Layers that mirror ``torch.nn``, batch-first, computed by the C++ core.

Each layer owns its weights in C++ and runs in one C++ call; weights load from torch's own
``state_dict`` names.

Dtypes. A layer computes in its own ``dtype`` (float32 by default, or float64; ``dtype=None`` is
float32, torch's default dtype, as in torch): its inputs and the weights it loads are converted to
it (torch's layers refuse another dtype instead). Narrowing a float64 value to a float32 layer
refuses a finite value beyond float32's range (it would become inf) with a ``ValueError`` naming
the argument or weight (``x: expected values within float32's range``); an inf or NaN given stays
one (see :mod:`transformer_core._validation`).

Layout: batch-first, ``(N, L, E)``, as torch's layers with ``batch_first=True``. The attention,
encoder and decoder layers and :class:`Transformer` take torch's ``batch_first=True`` (keyword) and
say so; ``batch_first=False`` (torch's default, ``(L, N, E)``) is a ``ValueError``: pass
``x.transpose(1, 0, 2)`` and transpose the output back.

Training (see :mod:`transformer_core.module`): a layer starts in eval mode (``training`` False),
unlike torch's, which start in training mode. After ``layer.train()`` a forward keeps what its
backward needs, and ``layer.backward(grad_output)`` returns the gradient of the input(s) and adds
every parameter's gradient (``named_parameters()``, ``gradients()``); the math is each layer's C++
backward (FlashAttention-2's for attention). The inputs of a training forward are copied when the
caller could still change them. Dropout (``dropout=`` of the layers: torch's dropout1/2/3, the
feed-forward's and the attention probabilities') applies in training forwards only, with seeded
masks (:func:`transformer_core.manual_seed`).

Masks. The padding masks ``key_mask``/``src_key_mask``/``tgt_key_mask``/``memory_key_mask`` are
bool, True = a real (non-padding) token: the library's one convention (True = may attend), which is
why they do not carry torch's name ``key_padding_mask`` (True = padding). The attention masks keep
torch's names (``attn_mask``, ``src_mask``, ``tgt_mask``, ``memory_mask``, the stacks' ``mask``) and
take what means the same in torch and here: a float mask, added to the scores (0 = allowed, -inf =
blocked; torch's ``nn.Transformer.generate_square_subsequent_mask`` and
:meth:`Transformer.generate_square_subsequent_mask` work as is). A bool mask there raises
``TypeError``: torch's layers read a bool ``attn_mask`` as True = blocked, this library as True = may
attend, so the same array would mean opposite things. ``is_causal=True`` and the key masks cover
causal and padding masks; any other bool mask goes through :func:`transformer_core.masks.to_additive`
(from ours, True = may attend) or ``to_additive(from_torch_mha(m))`` (from torch's, True = blocked).
The functional :func:`transformer_core.functional.scaled_dot_product_attention` takes bool masks,
True = may attend, as torch's ``F.scaled_dot_product_attention`` does.

Unbatched inputs, as torch's: the attention, encoder and decoder layers, their stacks and
:class:`Transformer` also take one sequence without its batch dim (``(L, E)`` for ``(N, L, E)``), with
key masks ``(L,)`` and 3-D attention masks ``(H, L, S)``; their outputs, and the gradients of a training
forward's backward, are then without it too.
"""

from __future__ import annotations

import math
import sys
import threading
import warnings

import numpy as np

from ._runtime import core as _core
from ._runtime import variant
from ._validation import (
    _unbroadcast,
    activation,
    as_attention_mask,
    as_bool,
    as_float,
    as_ids,
    as_weight,
    attention_path,
    broadcast_mask,
    check_allocatable,
    check_bool,
    check_eps,
    check_int,
    check_positive_int,
    check_tables_allocatable,
    physical_memory_bytes,
    resolve_dtype,
    to_numpy,
    torch_module_hint,
    type_path,
    unconverted,
)
from .kv_cache import holding_cache
from .module import (
    FixedSetting,
    Module,
    _checkpoint_value,
    _fill_in_chunks,
    _init_generator,
    _unconverted,
    check_dropout,
    fixed_setting_refusal,
    renamed_keyword,
    skip_weight_init,
)

__all__ = [
    "MultiheadAttention",
    "Linear",
    "Embedding",
    "FeedForward",
    "GatedFeedForward",
    "LayerNorm",
    "RMSNorm",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
    "Transformer",
]

def _kept(arr: np.ndarray, original) -> np.ndarray:
    """``arr`` (a converted input) as an array a training forward may keep until its backward: a copy
    when it is the caller's own array or a view of memory the caller may hold (a numpy view, a
    torch tensor's or a memoryview's buffer), which the caller could change in the meantime."""
    if arr is original or not arr.flags.owndata:
        return arr.copy()
    return arr


def _grad_output(grad_output, name: str, shape: tuple, dtype) -> np.ndarray:
    """``grad_output`` as a C-contiguous array of ``dtype`` and the forward output's ``shape``: the
    shape checked on the array as given, before its copy (a wrong-shaped broadcast view of any size
    is refused at no cost)."""
    g = unconverted(grad_output, name)
    if g.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)} (the forward's output), got {g.shape}")
    return as_float(g, name, dtype)


#: int64's largest value (``np.iinfo`` builds its object at each call: 0.7 µs of a one-id forward).
_INT64_MAX = int(np.iinfo(np.int64).max)


def _check_output_fits(count: int, itemsize: int, what: str) -> None:
    """ValueError when an output of ``count`` values of ``itemsize`` bytes exceeds this machine's
    memory, in the words of the C++ layers' own check (``ops::require_allocatable``): made on the
    input as given, before it is converted, so that a broadcast view (``np.broadcast_to``, stride 0)
    of a huge shape is refused before its copy is made. Below 1 GiB, no machine's check (a call
    into the core, 1.6 µs) is needed: a layer's forward on a few tokens stays as fast as it was."""
    if count * itemsize < 1 << 30:
        return
    limit = physical_memory_bytes()
    if count > limit // itemsize:
        raise ValueError(f"{what}: {count} values of {itemsize} bytes exceed this machine's memory ({limit} bytes)")


def _refuse_padding_mask(value, name: str, replacement: str) -> None:
    """torch's padding masks (``key_padding_mask``, ``src_key_padding_mask``, ...: True = padding,
    ignored) are keyword parameters of the layers only to be refused by name: the library's key masks
    (``replacement``) mean the opposite, True = a real token. None (no mask, in both) passes."""
    if value is not None:
        raise TypeError(f"{name}: not supported (torch's True = padding, ignored); pass {replacement}=~{name} "
                        f"(True = a real token)")


# torch's callables that torch's own layers recognise for its fast path, and this package's, by the
# name of our table that computes the same function (F.gelu and nn.GELU() are erf's GELU).
_CALLABLE_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "silu", "tanh": "tanh"}
_MODULE_ACTIVATIONS = {"ReLU": "relu", "SiLU": "silu", "Tanh": "tanh"}


def _callable_activation_name(value) -> str | None:
    """The table's name for one of torch's activation callables (``F.relu``, ``F.gelu``, ``F.silu``,
    ``torch.tanh``, ``nn.ReLU()``, ``nn.GELU(approximate=...)``, ``nn.SiLU()``, ``nn.Tanh()``) or
    this package's ``functional.relu``/``gelu``/``silu``; None for any other object."""
    from . import functional

    for name, table_name in _CALLABLE_ACTIVATIONS.items():
        if getattr(functional, name, None) is value:
            return table_name
    torch = sys.modules.get("torch")
    if torch is None:  # a torch object cannot exist without torch imported
        return None
    for name, table_name in _CALLABLE_ACTIVATIONS.items():
        if value is getattr(torch.nn.functional, name, None) or (name == "tanh" and value is torch.tanh):
            return table_name
    if isinstance(value, torch.nn.GELU):
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(getattr(value, "approximate", None))
    for cls, table_name in _MODULE_ACTIVATIONS.items():
        if isinstance(value, getattr(torch.nn, cls)):
            return table_name
    return None


def _activation_named_in_snapshot(module) -> None:
    """A torch callable given as ``activation`` kept by its name in the arguments the module's copies,
    pickles and repr are built from (``_init_args``): rebuilding it then needs no torch, and the
    repr shows ``activation='gelu'``. (A snapshot holds deep copies: the callable is found by
    what it is, not by identity.)"""
    args, kwargs = module._init_args

    def named(value):
        """``value``, or the table's name of the function it computes when it is one of torch's
        activation callables (:func:`_callable_activation_name`)."""
        if callable(value) and not isinstance(value, (str, type, Module)):
            return _callable_activation_name(value) or value
        return value

    object.__setattr__(module, "_init_args", (tuple(named(v) for v in args), {k: named(v) for k, v in kwargs.items()}))


def _check_activation(value) -> str:
    """An activation name of the library's one table (``_core.activation_names()``), or one of the
    callables :func:`_callable_activation_name` knows (returned as its name). Any other callable
    raises ``TypeError``: the feed-forward runs in C++ and cannot call Python per element."""
    if callable(value) and not isinstance(value, str):
        name = _callable_activation_name(value)
        if name is None:
            raise TypeError(f"activation: expected a name of {list(_core.activation_names())} or one of torch's "
                            f"F.relu/F.gelu/F.silu/torch.tanh, nn.ReLU()/nn.GELU()/nn.SiLU()/nn.Tanh(); other "
                            f"callables cannot run in the C++ layer, got {type_path(value)} {value!r}")
        return name
    activation(value, "activation")
    return value


def _float_mask(mask, name: str):
    """``mask`` as a numpy array (None stays None) of a float dtype: what the nn layers take under
    torch's mask names. ``TypeError`` for a bool one (see the module doc: torch reads it as True =
    blocked, the library as True = may attend) and for any other non-float dtype."""
    if mask is None:
        return None
    mask = to_numpy(mask, name)
    if mask.dtype == np.bool_:
        raise TypeError(
            f"{name}: expected a float mask (added to the scores: 0 = allowed, -inf = blocked), got a bool mask. "
            f"torch's nn layers read a bool {name} as True = blocked and this library reads bool masks as "
            f"True = may attend, so a bool {name} is refused here. Use is_causal / the key masks (True = a real "
            f"token), or pass masks.to_additive(mask) for a mask in this library's convention "
            f"(masks.to_additive(masks.from_torch_mha(mask)) for torch's)")
    if mask.dtype.kind != "f":
        raise TypeError(f"{name}: expected a float mask (added to the scores; -inf where attention is not allowed), "
                        f"got dtype {mask.dtype}")
    return mask


def _unbatched_key_mask(key_mask, name: str, n: int, dim: str, what: str):
    """The key mask of an unbatched call as the ``(1, n)`` of the batched one (None stays None);
    ``ValueError`` naming ``name`` and the shape given (not the one made of it) unless ``(n,)``.
    ``dim`` names n (``"L"``); ``what`` describes the unbatched input (``"src (3, 8) (L, E)"``)."""
    if key_mask is None:
        return None
    km = to_numpy(key_mask, name)
    if km.shape != (n,):
        raise ValueError(f"{name}: expected shape ({n},) ({dim},) for an unbatched {what}, got {km.shape}")
    return km[None]


def _is_unbatched(x: np.ndarray, name: str, dims: str) -> bool:
    """Whether ``x`` (converted with ``min_ndim=2``) is an unbatched ``(dims)`` rather than a
    batched ``(N, dims)``; ``ValueError`` for more than 3 dims."""
    if x.ndim > 3:
        raise ValueError(f"{name}: expected (N, {dims}) or ({dims}), got shape {x.shape}")
    return x.ndim == 2


def _feedforward_fits(rows: int, width: int, dtype) -> bool:
    """Whether a feed-forward's hidden activations, ``(rows, width)`` values of ``dtype``, fit in
    this machine's memory, by the C++ feed-forward's own rule.

    ``FeedForward::forward`` (cpp/src/layers/feed_forward.cpp) calls ``require_allocatable(rows ·
    dim_feedforward, sizeof(T))``, which refuses when ``values > limit / itemsize`` (integer
    division); for whole numbers that is ``values · itemsize > limit``, the product computed here
    (Python's ints are exact; a product that would overflow C++'s 64 bits is refused there too, as
    it exceeds any ``limit``). The same rule, so a call refused here is one the C++ check refuses.
    Integer products only: no array work."""
    return rows * width * np.dtype(dtype).itemsize <= physical_memory_bytes()


def _check_feedforward_activations(rows: int, width: int, dtype, name: str, shape: tuple,
                                   fields: str = "dim_feedforward", note: str = "") -> None:
    """Raises ValueError naming ``name`` (the caller's argument, of ``shape``) when a feed-forward
    over ``rows`` rows would need more memory for its hidden activations, ``(rows, width)`` values
    of ``dtype``, than this machine has (:func:`_feedforward_fits`).

    The layers and models call it at entry, before any work: the C++ feed-forward checks the same
    product, but only when it runs, after the embeddings and the attention's O(L²) work, and names
    its own argument (``x``). ``fields``: the arguments that set ``width``; ``note``: said after the
    shape (``" with attention_mask"``).
    """
    if not _feedforward_fits(rows, width, dtype):
        dt = np.dtype(dtype)
        raise ValueError(f"{name}: shape {tuple(shape)}{note} needs feed-forward activations of {rows} rows × {width} "
                         f"({fields}) "
                         f"{dt.name} values, {rows * width * dt.itemsize} bytes, more than this machine's memory "
                         f"({physical_memory_bytes()} bytes): use a smaller batch or shorter sequences")


def _layer_masks(attn_mask, key_mask, N: int, H: int, L: int, S: int, dtype, *, mask_name="attn_mask",
                 key_mask_name="key_mask", keep: bool = False):
    """(None, float_mask (N, H, L, S) | None, key_mask (N, S) | None): the C++ layers' three mask
    arguments (their bool slot is the library's own, e.g. ``memory_is_causal``).

    ``attn_mask`` may be ``(L, S)``, ``(N·H, L, S)`` (torch's shapes) or 4-D broadcastable to
    ``(N, H, L, S)`` (e.g. ``(1, 1, L, S)``, ``(N, 1, L, S)``); no other shape (a 1-D or 3-D mask
    is not broadcast). Float, added; any other dtype raises ``TypeError`` (:func:`_float_mask`).
    ``keep``: for a training forward, whose backward reads the masks again: copies of the caller's
    arrays (or of views of them), made before broadcasting.

    Both masks' shapes are checked as given, before either is converted (a copy).
    """
    m = None if attn_mask is None else _float_mask(attn_mask, mask_name)
    if m is not None:
        _check_attn_mask_shape(m, N, H, L, S, mask_name)
    km = None if key_mask is None else to_numpy(key_mask, key_mask_name)
    if km is not None and km.shape != (N, S):  # before as_bool, whose 0/1 check of integers makes arrays of km's size
        raise ValueError(f"{key_mask_name}: expected shape ({N}, {S}) (batch, key length), got {km.shape}")
    float_mask = None
    if m is not None:
        m = as_attention_mask(m, mask_name, dtype)
        if keep and (m is attn_mask or not m.flags.owndata):
            m = _own_copy(m)  # the caller's array, or a view of it: the backward reads the forward's mask
        if m.ndim == 2:
            m = m[None, None]
        elif m.ndim == 3:
            m = m.reshape(N, H, L, S)
        float_mask = broadcast_mask(m, (N, H, L, S), mask_name)
    if km is not None:
        km = as_bool(km, key_mask_name)
        if keep and (km is key_mask or not km.flags.owndata):
            km = _own_copy(km)
    return None, float_mask, km


def _check_attn_mask_shape(m: np.ndarray, N: int, H: int, L: int, S: int, name: str) -> None:
    """``ValueError`` naming ``name`` unless ``m`` is ``(L, S)``, ``(N·H, L, S)`` or 4-D broadcastable
    to ``(N, H, L, S)``; nothing is allocated."""
    if m.ndim == 2:
        if m.shape != (L, S):
            raise ValueError(f"{name}: expected shape ({L}, {S}) (L, S), got {m.shape}")
    elif m.ndim == 3:
        if m.shape != (N * H, L, S):
            raise ValueError(f"{name}: expected a 3-D mask of shape ({N * H}, {L}, {S}) (N·num_heads, L, S), "
                             f"got {m.shape}")
    elif m.ndim == 4:
        broadcast_mask(m, (N, H, L, S), name)  # a view: only checks that it broadcasts
    else:
        raise ValueError(f"{name}: expected shape (L, S), (N·num_heads, L, S) or (N, num_heads, L, S), "
                         f"got {m.shape}")


def _own_copy(m: np.ndarray) -> np.ndarray:
    """A copy of ``m``'s values, a broadcast view copied as its compact data and broadcast again
    (torch's ``mask.expand(N * H, L, S)`` is one: copied whole it would be N·H times larger)."""
    compact = tuple(slice(0, 1) if stride == 0 else slice(None) for stride in m.strides)
    return np.broadcast_to(m[compact].copy(), m.shape)


def _same_array_as(arr: np.ndarray, *candidates: np.ndarray) -> np.ndarray:
    """The first of ``candidates`` that is ``arr`` or holds the same data (the same shape, dtype,
    strides and data address: one array seen through two objects, as the numpy views of one torch
    tensor converted twice), else ``arr``. Nothing is copied or compared element by element."""
    for other in candidates:
        if arr is other or (arr.shape == other.shape and arr.dtype == other.dtype and arr.strides == other.strides
                            and arr.__array_interface__["data"][0] == other.__array_interface__["data"][0]):
            return other
    return arr


def _check_rotary_tables(rows: int, largest: int, head_dim: int, layout: str, dtype, max_positions: int,
                         name: str) -> None:
    """ValueError naming ``name`` when a call whose largest position is ``largest`` needs rotary cos
    and sin tables of ``rows`` positions that do not fit this machine's memory.

    The C++ ``RotaryEmbedding`` builds its tables as the positions come, and checks them the same way
    (``build``: ``2 · rows · width`` values, ``width`` = ``head_dim`` in the ``"half"`` layout,
    ``head_dim / 2`` in ``"interleaved"``), but only once the call runs, after a KV cache has grown;
    and its message names the table, not the caller's argument. Checked here first, a refused call
    leaves the cache as it was.
    """
    width = head_dim if layout == "half" else head_dim // 2
    itemsize = np.dtype(dtype).itemsize
    need = 2 * rows * width * itemsize  # Python ints: exact
    limit = physical_memory_bytes()
    if need > limit:
        raise ValueError(f"{name}: position {largest} needs rotary tables (cos and sin of {rows} positions × {width} "
                         f"{np.dtype(dtype).name}; max_position_embeddings {max_positions}) of {need} bytes, which "
                         f"exceed this machine's memory ({limit} bytes)")


def _check_rotary_growth(rotary, needed: int, name: str) -> None:
    """:func:`_check_rotary_tables` for a call of ``rotary`` (a positional.RotaryEmbedding) over
    positions below ``needed``, when its tables must grow: C++ ``tables_for`` grows them to twice the
    positions built where that fits, else to ``needed``, so ``needed`` is what must fit."""
    if needed > rotary._impl.built_positions:
        _check_rotary_tables(needed, needed - 1, rotary.head_dim, rotary.layout, rotary.dtype,
                             rotary.max_position_embeddings, name)


def _check_batch_first(batch_first) -> None:
    """torch's ``batch_first``: True is this library's one layout, ``(N, L, E)``; False (torch's
    default, ``(L, N, E)``) is refused with a ``ValueError`` saying how to pass such inputs, a
    non-bool with a ``TypeError``."""
    if not check_bool(batch_first, "batch_first"):
        raise ValueError("batch_first: expected True, got False: this library's layers take batch-first (N, L, E) "
                         "inputs only (torch's batch_first=True layout); for torch's (L, N, E) ones pass "
                         "x.transpose(1, 0, 2) and transpose the output back the same way")


def _is_torch_dropout(value) -> bool:
    """Whether ``value`` reads as a dropout probability given positionally in torch's order: a
    number (an int such as 0 too), not a bool."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _check_torch_mha_args(bias, batch_first, add_bias_kv, add_zero_attn) -> None:
    """torch's MultiheadAttention arguments that this layer takes only at what it does, each refused
    otherwise by name; and a number ``bias`` (a float, or an int such as 0): torch's third
    positional argument is ``dropout``."""
    if _is_torch_dropout(bias):
        raise TypeError(f"bias: expected a bool, got {type(bias).__name__} {bias} (torch's third positional argument "
                        f"is dropout, this layer's is bias: pass dropout= by keyword)")
    _check_batch_first(batch_first)
    for name, value in (("add_bias_kv", add_bias_kv), ("add_zero_attn", add_zero_attn)):
        if check_bool(value, name):
            raise ValueError(f"{name}: expected False, got True: not implemented")


class MultiheadAttention(Module):
    """Multi-head attention (Vaswani et al. 2017, §3.2.2; the tutorials' MultiHeadAttention), batch-first,
    mirroring ``torch.nn.MultiheadAttention(batch_first=True)``::

        MultiHead(Q, K, V) = Concat(head_1..head_H) W_O,  head_i = Attention(Q W_Qi, K W_Ki, V W_Vi)

    Args:
        embed_dim: E, the model width; must be divisible by ``num_heads``.
        num_heads: H; ``head_dim = E // H``.
        bias: projection biases (``in_proj_bias``, ``out_proj.bias``).
        num_key_value_heads: (keyword) key/value heads for grouped-query attention (the GQA/MQA
            section of the tutorials; Hugging Face's name); 1 = MQA, None = ``num_heads`` (ordinary
            multi-head attention). ``num_kv_heads=``, its former name, is still taken for one release,
            with a ``DeprecationWarning``.
        kdim, vdim: feature sizes of key and value (default E).
        dtype: ``np.float32`` (default) or ``np.float64``; inputs are cast to it.
        dropout: (keyword) torch's: the probability of dropping an attention probability in a
            training forward (Srivastava et al. 2014; the weights are then scaled by
            ``1 / (1 - dropout)``), in [0, 1). Its mask is drawn from the package's generator
            (:func:`transformer_core.manual_seed`) by the rule of
            :func:`functional.scaled_dot_product_attention`'s ``dropout_p``, not from torch's.
            May be changed between calls.
        batch_first, add_bias_kv, add_zero_attn: (keyword) torch's, taken only at what this
            layer does: ``batch_first=True``, ``add_bias_kv=False``, ``add_zero_attn=False``;
            another value is a ``ValueError`` naming it (``batch_first=False``: pass
            ``x.transpose(1, 0, 2)``). (torch's third positional argument is ``dropout``, this
            layer's ``bias``: a number there, a float or an int such as 0, is a ``TypeError``
            saying so.)

    Starts in eval mode (``training`` False), unlike torch's modules, which start in training mode:
    call ``train()`` before a training forward.

    Weights (torch's names): ``in_proj_weight (E + 2·E_kv, E)`` when kdim = vdim = E, else
    ``q_proj_weight (E, E)``, ``k_proj_weight (E_kv, kdim)``, ``v_proj_weight (E_kv, vdim)``;
    ``in_proj_bias (E + 2·E_kv)``, ``out_proj.weight (E, E)``, ``out_proj.bias (E)``, where
    ``E_kv = num_key_value_heads · head_dim``. A checkpoint in the separate layout
    (``q/k/v_proj_weight``) loads into the packed weight when kdim = vdim = E. When kdim or vdim
    differs from E only the separate layout fits (torch's has no ``in_proj_weight`` then): a
    packed ``in_proj_weight`` is an unknown key, as torch's ``load_state_dict`` has it (refused
    under ``strict=True`` with a ``ValueError`` saying why; under ``strict=False`` ignored and
    returned in ``unexpected_keys``); a non-float one is still a ``TypeError`` naming it.
    ``out_proj`` is not a submodule attribute here (one C++ object): its weights are
    ``out_proj.weight`` and ``out_proj.bias`` in ``state_dict()`` and ``named_parameters()``.

    ``embed_dim``, ``num_heads``, ``num_key_value_heads``, ``kdim``, ``vdim``, ``head_dim`` and
    ``bias`` are read-only attributes (what the C++ layer was built with): assigning one raises
    AttributeError (build a new layer).

    Raises:
        ValueError: E not divisible by H, H not divisible by num_key_value_heads, non-positive sizes;
            ``dropout`` outside [0, 1); a torch argument this layer does not implement (see above).
        TypeError: non-int sizes; non-bool ``bias``, ``batch_first``, ``add_bias_kv`` or
            ``add_zero_attn`` (a number ``bias``, a float or an int such as 0: the message says torch's
            third positional argument is ``dropout``); a non-number ``dropout``; a ``dtype`` other
            than float32/float64.
    """

    # None as torch's where a layer is built without them: in_proj_bias (bias=False), in_proj_weight
    # (kdim/vdim: q/k/v_proj_weight instead) or q/k/v_proj_weight (one in_proj_weight), and always
    # bias_k and bias_v (add_bias_kv, not supported)
    _optional_weights = frozenset({"in_proj_bias", "in_proj_weight", "q_proj_weight", "k_proj_weight",
                                   "v_proj_weight", "bias_k", "bias_v"})
    _optional_weight_arguments = {"in_proj_bias": "bias=True", "in_proj_weight": "kdim=None, vdim=None",
                                  **{f"{w}_proj_weight": "kdim=..., vdim=... other than embed_dim" for w in "qkv"},
                                  "bias_k": None, "bias_v": None}

    # the sizes the C++ layer was built with, read-only (a forward checks its inputs against them)
    embed_dim = FixedSetting()
    num_heads = FixedSetting()
    num_key_value_heads = FixedSetting()
    kdim = FixedSetting()
    vdim = FixedSetting()
    head_dim = FixedSetting(argument="embed_dim and num_heads set it")
    bias = FixedSetting()

    @renamed_keyword("num_kv_heads", "num_key_value_heads")
    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True, *, num_key_value_heads: int | None = None,
                 kdim: int | None = None, vdim: int | None = None, dtype=np.float32, dropout: float = 0.0,
                 batch_first: bool = True, add_bias_kv: bool = False, add_zero_attn: bool = False):
        sfx = self._init_dtype(dtype)
        _check_torch_mha_args(bias, batch_first, add_bias_kv, add_zero_attn)
        self.dropout = check_dropout(dropout)
        embed_dim = check_positive_int(embed_dim, "embed_dim")
        num_heads = check_positive_int(num_heads, "num_heads")
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim: expected a multiple of num_heads ({num_heads}), got {embed_dim}")
        num_key_value_heads = (num_heads if num_key_value_heads is None
                               else check_positive_int(num_key_value_heads, "num_key_value_heads"))
        if num_heads % num_key_value_heads != 0:
            raise ValueError(f"num_key_value_heads: expected a divisor of num_heads ({num_heads}), got "
                             f"{num_key_value_heads}")
        FixedSetting.set(self, embed_dim=embed_dim, num_heads=num_heads, num_key_value_heads=num_key_value_heads,
                         kdim=embed_dim if kdim is None else check_positive_int(kdim, "kdim"),
                         vdim=embed_dim if vdim is None else check_positive_int(vdim, "vdim"),
                         head_dim=embed_dim // num_heads, bias=check_bool(bias, "bias"))
        self._impl = getattr(_core, "MultiheadAttention" + sfx)(
            self.embed_dim, self.num_heads, self.bias, self.kdim, self.vdim, self.num_key_value_heads, 0)
        self._init_weights()

    @property
    def num_kv_heads(self) -> int:
        """Deprecated: ``num_key_value_heads`` (a ``DeprecationWarning``; removed in the next release)."""
        warnings.warn("MultiheadAttention.num_kv_heads is deprecated, use num_key_value_heads (Hugging Face's name)",
                      DeprecationWarning, stacklevel=2)
        return self.num_key_value_heads

    def _rename_state_dict(self, state: dict) -> dict:
        # Accept both of torch's layouts: packed in_proj_weight or separate q/k/v_proj_weight.
        packed = self._impl.packed
        if packed and "in_proj_weight" not in state and all(f"{x}_proj_weight" in state for x in "qkv"):
            e, ekv = self.embed_dim, self.num_key_value_heads * self.head_dim
            expected = {"q": (e, e), "k": (ekv, e), "v": (ekv, e)}
            # kind and shape as given, before any copy (as load_state_dict checks its own weights)
            given = {x: _unconverted(state[f"{x}_proj_weight"], f"state_dict['{x}_proj_weight']") for x in "qkv"}
            wrong = [f"{x}_proj_weight: expected {expected[x]}, got {given[x][1]}" for x in "qkv"
                     if given[x][1] != expected[x]]
            if wrong:  # the message load_state_dict gives for its own mis-shaped weights
                raise ValueError(f"{type(self).__name__}.load_state_dict refused (module unchanged): "
                                 f"mis-shaped: {wrong}")
            parts = [as_weight(_checkpoint_value(given[x][0]), f"state_dict['{x}_proj_weight']", self.dtype)
                     for x in "qkv"]
            for x in "qkv":
                del state[f"{x}_proj_weight"]
            state["in_proj_weight"] = np.concatenate(parts, axis=0)
        elif not packed and "in_proj_weight" in state:
            # An (E + 2·E_kv, E) in_proj_weight can never be split into k/v weights of (E_kv, kdim)
            # and (E_kv, vdim) when kdim or vdim differs from E: an unknown key, as in torch (its
            # module has no in_proj_weight then), which strict=True refuses (_unknown_key_hint says
            # why) and strict=False returns in unexpected_keys. Its value's kind is still checked as
            # any weight's (a TypeError naming the key for a non-float one), without a copy.
            _unconverted(state["in_proj_weight"], "state_dict['in_proj_weight']")
        return state

    def _unknown_key_hint(self, name: str) -> str | None:
        if name != "in_proj_weight" or self._impl.packed:
            return None
        e, ekv = self.embed_dim, self.num_key_value_heads * self.head_dim
        return (f"a packed q/k/v projection does not fit this module (kdim={self.kdim}, vdim={self.vdim}, "
                f"embed_dim={e}); expected the separate weights q_proj_weight {(e, e)}, k_proj_weight "
                f"{(ekv, self.kdim)} and v_proj_weight {(ekv, self.vdim)}, as torch's MultiheadAttention has when "
                f"kdim or vdim differs from embed_dim")

    @holding_cache
    def forward(self, query, key=None, value=None, *, attn_mask=None, key_mask=None, is_causal: bool = False,
                need_weights: bool = True, average_attn_weights: bool = True, path: str = "auto",
                past_key_values=None, layer: int = 0, rotary=None, position_ids=None, key_padding_mask=None):
        """Attention of ``query`` over ``key``/``value`` (self-attention when both are None).

        Self-attention, which a KV cache and ``rotary`` need, is ``key`` and ``value`` each None or
        the query itself: the same object, or the same data seen through another object (the same
        shape, dtype, strides and memory address, as a torch tensor passed three times, ``mha(x, x,
        x)``, gives: each is converted to its own numpy view). A copy of the query is not the query
        (it is cross-attention over equal values, refused with a KV cache or ``rotary``).

        Unbatched, as torch's: ``query (L, E)``, ``key (S, kdim)``, ``value (S, vdim)`` (all 2-D),
        ``key_mask (S,)``, ``attn_mask (L, S)`` or ``(H, L, S)``, ``position_ids (L,)``; the output
        is ``(L, E)`` and the weights ``(L, S)`` or ``(H, L, S)``.

        Args:
            query: ``(N, L, E)`` (or ``(L, E)``, unbatched).
            key: ``(N, S, kdim)``; default ``query``.
            value: ``(N, S, vdim)``; default ``key``.
            attn_mask: ``(L, S)``, ``(N·H, L, S)``, or 4-D broadcastable to ``(N, H, L, S)`` (e.g.
                ``(1, 1, L, S)``, ``(N, 1, L, S)``; other shapes, such as ``(1, S)`` or ``(1, L, S)``,
                are refused); float, added to the scores (0 = allowed, -inf = blocked), as torch's.
                A bool mask raises ``TypeError`` (see the module doc; ``masks.to_additive`` converts
                one), as does any other non-float dtype.
            key_mask: ``(N, S)`` bool/0-1, True = a real key (``~key_padding_mask`` in torch).
            is_causal: apply the causal mask (key s visible to query l iff s <= l), together with
                ``attn_mask`` and ``key_mask``: a key must be allowed by every mask given. (torch
                reads ``is_causal`` as a hint that ``attn_mask`` is causal and needs the mask with
                it; where the mask is causal the two agree.)
            need_weights: also return the attention weights (default True, as torch's); False skips
                computing them (``(N, H, L, S)`` values), the faster call when only the output is
                used (``out, _ = mha(x, need_weights=False)``).
            average_attn_weights: average the weights over heads ``(N, L, S)``; else
                ``(N, H, L, S)``. The average is accumulated head by head, so the per-head weights
                (``H`` times as large) are never all held, except in a training call with
                ``dropout``, which drops them per head first.
            path: attention kernel, ``"auto"``, ``"flash"`` or ``"reference"``.
            past_key_values: a :class:`transformer_core.KVCache` (self-attention only): the new keys
                and values are appended to its layer ``layer`` and attention runs over past + new
                (``is_causal`` is then bottom-right aligned). Masks then cover ``S = past + L`` keys.
                A cache of n layers is shared by n layers called in order at each step (layer 0,
                then 1, ..., each with the same L); the call on layer n - 1 grows its length by L.
            layer: the cache's layer this call reads and writes (the next of the step: else a
                ``ValueError``).
            rotary: a :class:`transformer_core.positional.RotaryEmbedding` of ``head_dim`` and
                ``dtype`` (self-attention only): q and k are rotated by each token's position inside
                the call (the RoPE section of the tutorials).
            position_ids: ``(N, L)`` positions for ``rotary``, or ``(1, L)`` / ``(L,)`` shared by every
                batch item (broadcast, as Hugging Face's); default ``past .. past + L - 1``.
            key_padding_mask: torch's name, refused (``TypeError``): its True = padding is
                ``key_mask``'s False; pass ``key_mask=~key_padding_mask``.

        Returns:
            ``(output (N, L, E), weights or None)`` in ``self.dtype`` (unbatched: ``(L, E)``);
            weights None when ``need_weights=False``. Fully masked query rows give zeros before the
            output projection (so the output row is ``out_proj.bias``) and weights of zeros.

        In training mode (``train()``) the call keeps what :meth:`backward` needs (the projected q,
        k, v, the context and each row's log-sum-exp); it takes no ``past_key_values`` then, and
        drops attention probabilities with probability ``self.dropout`` (a seed from the package's
        generator per call). Its weights (``need_weights``) are then the dropped ones, scaled by
        ``1 / (1 - dropout)``, as torch's in training: those the output was computed with.

        Every shape is checked before anything is converted or copied.

        Raises:
            ValueError: wrong ranks, mismatched batch/length/feature sizes, empty arrays, masks
                of the wrong shape; a KV cache in training mode; a KV cache or ``rotary`` with a
                key or value that is not the query; a ``rotary`` of another ``head_dim``;
                ``position_ids`` without ``rotary``, positions outside its table, or positions
                whose rotary tables would exceed this machine's memory (naming ``position_ids``, or
                ``query`` / ``past_key_values`` for the default positions). Every check runs before
                the cache grows: a refused call leaves ``past_key_values``' length and capacity as
                they were. A ``past_key_values`` a call in another thread holds (one cache, one
                sequence of calls).
            TypeError: non-numeric input, a mask of the wrong dtype, a bool ``attn_mask``,
                ``key_padding_mask``; ``rotary`` not a RotaryEmbedding, or of another dtype;
                ``past_key_values`` not a KVCache, or of another dtype.
        """
        _refuse_padding_mask(key_padding_mask, "key_padding_mask", "key_mask")
        q = unconverted(query, "query", 2)  # converted once every shape is checked
        unbatched = _is_unbatched(q, "query", "L, E")
        is_causal = check_bool(is_causal, "is_causal")
        need_weights = check_bool(need_weights, "need_weights")
        average_attn_weights = check_bool(average_attn_weights, "average_attn_weights")
        path = attention_path(path)
        layer = check_int(layer, "layer", 0)
        # key/value that are the query's data (a torch tensor passed again is another numpy view of
        # it) become the query's array: one array, self-attention (see the docstring)
        k = q if key is None else _same_array_as(unconverted(key, "key", 2), q)
        v = k if value is None else _same_array_as(unconverted(value, "value", 2), q, k)
        for arr, name, dims in ((k, "key", "S, kdim"), (v, "value", "S, vdim")):
            if arr.ndim != q.ndim:  # torch's rule: all three batched, or all three unbatched
                raise ValueError(f"{name}: expected {'(' if unbatched else '(N, '}{dims}) as query is "
                                 f"{'unbatched' if unbatched else 'batched'} {q.shape}, got shape {arr.shape}")
        if q.shape[-1] != self.embed_dim:
            raise ValueError(f"query: expected last dim {self.embed_dim} (embed_dim), got shape {q.shape}")
        if unbatched:  # a batch of one (query, key and value that were one array stay one)
            qb = q[None]
            kb = qb if k is q else k[None]
            v = qb if v is q else (kb if v is k else v[None])
            q, k = qb, kb
        N, L, E = q.shape
        if k.shape[0] != N or v.shape[0] != N:
            raise ValueError(f"key, value: expected batch size {N} (query's), got {k.shape[0]} and {v.shape[0]}")
        if k.shape[-1] != self.kdim:
            raise ValueError(f"key: expected last dim {self.kdim} (kdim), got shape {k.shape}")
        if v.shape[-1] != self.vdim:
            raise ValueError(f"value: expected last dim {self.vdim} (vdim), got shape {v.shape}")
        S = k.shape[1]
        if v.shape[1] != S:
            raise ValueError(f"value: expected length {S} (key's length), got shape {v.shape}")
        self_attention = k is q and v is q
        cache_impl, positions, rotary_impl = None, None, None
        if self.training and past_key_values is not None:
            raise ValueError("past_key_values: the training forward takes no KV cache (call .eval() for inference)")
        if past_key_values is not None or rotary is not None:
            if not self_attention:
                raise ValueError("key, value: a KV cache or a rotary embedding needs self-attention (key and value None)")
            if not self._impl.packed:
                raise ValueError("kdim, vdim: a KV cache or a rotary embedding needs kdim = vdim = embed_dim")
        if past_key_values is not None:
            from .kv_cache import KVCache

            if not isinstance(past_key_values, KVCache) or past_key_values.dtype != self.dtype:
                got = (f"a KVCache of {np.dtype(past_key_values.dtype).name}" if isinstance(past_key_values, KVCache)
                       else type(past_key_values).__name__)
                raise TypeError(f"past_key_values: expected a KVCache of {np.dtype(self.dtype).name}, got {got}")
            c = past_key_values
            if ((c.batch, c.num_key_value_heads, c.head_dim) != (N, self.num_key_value_heads, self.head_dim)
                    or layer >= len(c)):
                raise ValueError(f"past_key_values: a cache of batch {c.batch}, {c.num_key_value_heads} heads of "
                                 f"{c.head_dim} and {len(c)} layers does not fit layer {layer} of batch {N} with "
                                 f"{self.num_key_value_heads} heads of {self.head_dim}")
            # A step fills the layers in order, each with the same L new positions; the last one
            # advances the length (every layer of a step reads the same past).
            if layer != c._next_layer:
                raise ValueError(f"layer: a cache of {len(c)} layers is filled in layer order at each step (layer 0 "
                                 f"first, then 1, ...): expected layer {c._next_layer}, got {layer}")
            if layer > 0 and L != c._step_length:
                raise ValueError(f"query: layer {layer} of this step must append the {c._step_length} positions "
                                 f"layer 0 appended, got {L}")
            cache_impl, S = c._impl, c.length + L
        if rotary is not None:
            from .positional import RotaryEmbedding

            if not isinstance(rotary, RotaryEmbedding) or rotary.dtype != self.dtype:
                raise TypeError(f"rotary: expected a RotaryEmbedding of dtype {np.dtype(self.dtype).name} (and "
                                f"head_dim {self.head_dim}), got {rotary!r}")
            if rotary.head_dim != self.head_dim:
                raise ValueError(f"rotary: expected a RotaryEmbedding of head_dim {self.head_dim} (embed_dim "
                                 f"{self.embed_dim} / num_heads {self.num_heads}), got head_dim {rotary.head_dim}")
            rotary_impl = rotary._impl
            table = rotary.max_position_embeddings
            if position_ids is not None:  # range-checked here, before a cache grows (C++ checks them later)
                given = to_numpy(position_ids, "position_ids")  # an array or a tensor: no copy
                if not unbatched and given.shape in ((1, L), (L,)):
                    # HF's shared positions, (1, L): one row for every batch item (a view, no copy yet)
                    given = np.broadcast_to(given.reshape(1, L), (N, L))
                positions = as_ids(given, "position_ids", shape=(N, L), shape_of="query's batch and length",
                                   what="positions")
                if positions.min() < 0 or positions.max() >= table:
                    bad = np.flatnonzero((positions < 0) | (positions >= table))[0]
                    raise ValueError(f"position_ids: position {positions.flat[bad]} at flat index {bad} is outside "
                                     f"the rotary table [0, {table}) (rotary's max_position_embeddings)")
                _check_rotary_growth(rotary, int(positions.max()) + 1, "position_ids")
            elif S > table:  # the default positions, past .. past + L - 1
                what = "past_key_values: its" if past_key_values is not None else "query: its"
                raise ValueError(f"{what} positions reach {S - 1}, outside the rotary table [0, "
                                 f"{table}) (rotary's max_position_embeddings)")
            else:
                _check_rotary_growth(rotary, S, "past_key_values" if past_key_values is not None else "query")
        elif position_ids is not None:
            raise ValueError("position_ids: given without rotary (the positions are read by a rotary embedding "
                             "only: pass rotary= too, or leave position_ids out)")
        if unbatched:
            key_mask = _unbatched_key_mask(key_mask, "key_mask", S, "S", f"query {q.shape[1:]} (L, E)")
        masks = _layer_masks(attn_mask, key_mask, N, self.num_heads, L, S, self.dtype, keep=self.training)
        p = check_dropout(self.dropout) if self.training else 0.0  # an attribute: may have been changed
        # Averaged weights come from C++ as they are, (N, L, S), the heads added one by one, never the
        # (N, H, L, S) of every head; a training call with dropout takes the per-head weights, to drop
        # them as its forward did, and averages those.
        average_in_core = average_attn_weights and p == 0
        if need_weights:  # the weights are made after the cache grows: checked before
            shape = (N, L, S) if average_in_core else (N, self.num_heads, L, S)
            check_allocatable(shape, np.dtype(self.dtype).itemsize, "need_weights")
        # every shape checked: now the inputs are converted (query, key and value that are one array stay one)
        qc = as_float(q, "query", self.dtype)
        kc = qc if k is q else as_float(k, "key", self.dtype)
        v = qc if v is q else (kc if v is k else as_float(v, "value", self.dtype))
        q, k = qc, kc
        weights = None
        if self.training:
            q_kept = _kept(q, query)
            k_kept = q_kept if self_attention else _kept(k, key)
            v_kept = q_kept if self_attention else (k_kept if v is k else _kept(v, value))
            kv = (None, None) if self_attention else (k_kept, v_kept)
            seed = self._dropout_seed(p)
            if need_weights:  # the training forward computes none: an inference forward's, before any state is kept
                weights = self._impl.forward(q_kept, *kv, *masks, bool(is_causal), 0, True, average_in_core, path,
                                             None, 0, rotary_impl, positions)[1]
                if p > 0:  # the forward's mask: the same (seed, flat index of (n, h, l, s))
                    weights = variant("dropout", self.dtype)(weights, p, seed)
            out = self._impl.forward_train(q_kept, *kv, *masks, bool(is_causal), path, rotary_impl, positions,
                                           dropout=p, seed=seed)
            # the C++ layer keeps pointers to these until backward
            self._saved = (q_kept, k_kept, v_kept, masks, rotary, positions, self_attention,
                           key is not None or value is not None, unbatched)
        else:
            if cache_impl is not None:  # every argument checked: now the cache may grow
                past_key_values.reserve(past_key_values.length + L)
            out = self._impl.forward(q, None if self_attention else k, None if self_attention else v, *masks,
                                     is_causal, 0, need_weights, average_in_core, path, cache_impl, layer,
                                     rotary_impl, positions)
            if cache_impl is not None:
                last = layer == len(past_key_values) - 1
                past_key_values._next_layer = 0 if last else layer + 1
                past_key_values._step_length = L
            if need_weights:
                out, weights = out
        if weights is not None and average_attn_weights and not average_in_core:
            weights = weights.mean(axis=1)
        if unbatched:
            return out[0], (None if weights is None else weights[0])
        return out, weights

    def backward(self, grad_output):
        """The gradients of the last training forward, given ``grad_output (N, L, E)``, the gradient
        of a loss with respect to its output; every parameter's gradient is added. After an
        unbatched forward every shape here is without its N: ``grad_output (L, E)`` gives
        ``grad_query (L, E)``, ``grad_key (S, kdim)``, ``grad_value (S, vdim)``.

        Returns:
            self-attention (``key``/``value`` not given): ``grad_query (N, L, E)``; otherwise
            ``(grad_query, grad_key (N, S, kdim), grad_value (N, S, vdim))`` — when one array was
            given as several of query/key/value, the gradient with respect to it is the sum of
            theirs (all of it in ``grad_query`` when key and value are the query itself).

        Raises:
            NoTrainingStateError: no training forward since the last backward.
            ValueError: ``grad_output`` not of the output's shape. TypeError: non-numeric.
        """
        q, k, v, _masks, _rotary, _positions, self_attention, explicit_kv, unbatched = self._peek_saved()
        shape = q.shape[:2] + (self.embed_dim,)
        g = _grad_output(grad_output, "grad_output", shape[1:] if unbatched else shape, self.dtype)
        self._take_saved()  # checked: now consumed
        g = g[None] if unbatched else g
        if self_attention:
            dq = self._impl.backward(g, None, None)
            if not explicit_kv:
                return dq[0] if unbatched else dq
            grads = dq, np.zeros(k.shape, self.dtype), np.zeros(v.shape, self.dtype)
        else:
            grads = tuple(self._impl.backward(g, list(k.shape), list(v.shape)))
        return tuple(d[0] for d in grads) if unbatched else grads


class Linear(Module):
    """An affine map, as ``torch.nn.Linear``: ``y = x Wᵀ + b``.

    Args:
        in_features, out_features: sizes (>= 1).
        bias: learn a bias.
        dtype: ``np.float32`` or ``np.float64``.

    Weights: ``weight (out_features, in_features)``, ``bias (out_features,)``.

    ``in_features`` and ``out_features`` are read-only attributes (the C++ layer's sizes; torch's
    can be reassigned, which changes no weight there either): assigning one raises AttributeError
    (build a new layer). So does assigning a value other than None to ``bias`` of a layer built
    with ``bias=False`` (a ValueError: build it with ``bias=True``).

    Raises:
        TypeError: non-int sizes (bools and floats included), a non-bool ``bias``, a ``dtype`` other
            than float32/float64.
        ValueError: sizes < 1; a weight larger than this machine's memory.
    """

    _optional_weights = frozenset({"bias"})  # bias=False: lin.bias is None, as torch's
    _optional_weight_arguments = {"bias": "bias=True"}
    in_features = FixedSetting()  # the C++ layer's sizes, read-only
    out_features = FixedSetting()

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype=np.float32):
        sfx = self._init_dtype(dtype)
        FixedSetting.set(self, in_features=check_positive_int(in_features, "in_features"),
                         out_features=check_positive_int(out_features, "out_features"))
        self._impl = getattr(_core, "Linear" + sfx)(self.in_features, self.out_features, check_bool(bias, "bias"))
        self._init_weights()

    def forward(self, x) -> np.ndarray:
        """``x (..., in_features) -> (..., out_features)`` in ``self.dtype``.

        Raises:
            ValueError: empty ``x`` or last dim not ``in_features``; an output larger than this
            machine's memory (checked before ``x`` is converted or copied). TypeError: non-numeric ``x``.
        """
        xa = unconverted(x, "x", 1)
        if xa.shape[-1] != self.in_features:  # before the conversion (a copy)
            raise ValueError(f"x: expected last dim {self.in_features} (in_features), got shape {xa.shape}")
        _check_output_fits(math.prod(xa.shape[:-1]) * self.out_features, np.dtype(self.dtype).itemsize,
                           "x: the output (rows, out_features)")
        xa = as_float(xa, "x", self.dtype)
        x2 = xa.reshape(-1, self.in_features)
        if self.training:
            self._saved = (_kept(x2, x), xa.shape)
        return self._impl.forward(x2).reshape(xa.shape[:-1] + (self.out_features,))

    def backward(self, grad_output) -> np.ndarray:
        """``grad_output (..., out_features)`` -> ``grad_x (..., in_features)`` of the last training
        forward (``grad_x = grad_output · W``); adds ``weight``'s (``grad_outputᵀ · x``) and ``bias``'s
        gradients.

        Raises:
            NoTrainingStateError: no training forward since the last backward.
            ValueError: ``grad_output`` not of the output's shape.
        """
        x2, shape = self._peek_saved()
        g = _grad_output(grad_output, "grad_output", shape[:-1] + (self.out_features,), self.dtype)
        self._take_saved()  # checked: now consumed
        return self._impl.backward(x2, g.reshape(-1, self.out_features)).reshape(shape)


class Embedding(Module):
    """A lookup table, as ``torch.nn.Embedding``: ``y = weight[ids]``.

    Args:
        num_embeddings: V, rows of the table (>= 1).
        embedding_dim: H, the width of a row (>= 1).
        dtype: ``np.float32`` or ``np.float64``.
        padding_idx: (keyword) as torch's: that row starts at zeros and gets no gradient; None: none.

    Weights: ``weight (num_embeddings, embedding_dim)`` (initialised N(0, 1), as torch).

    ``num_embeddings`` and ``embedding_dim`` are read-only attributes (the C++ table's sizes):
    assigning one raises AttributeError (build a new layer).

    Raises:
        TypeError: ``dtype`` an int or anything else that is not a dtype: torch's third
            positional argument is ``padding_idx`` (``nn.Embedding(10, 4, 0)``), this layer's is
            ``dtype``, so the message says to pass ``padding_idx=`` by keyword; a dtype other than
            float32/float64 (None is float32, torch's default dtype: ``nn.Embedding(10, 4, None)``
            is torch's layer too, with no ``padding_idx``); non-int sizes or ``padding_idx``.
        ValueError: sizes < 1, ``padding_idx`` outside ``[-num_embeddings, num_embeddings)``.
    """

    num_embeddings = FixedSetting()  # the C++ table's sizes, read-only
    embedding_dim = FixedSetting()

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype=np.float32, *, padding_idx: int | None = None):
        _refuse_padding_idx_as_dtype(dtype)
        sfx = self._init_dtype(dtype)
        FixedSetting.set(self, num_embeddings=check_positive_int(num_embeddings, "num_embeddings"),
                         embedding_dim=check_positive_int(embedding_dim, "embedding_dim"))
        if padding_idx is not None:
            padding_idx = check_int(padding_idx, "padding_idx", -self.num_embeddings)
            if padding_idx >= self.num_embeddings:
                raise ValueError(f"padding_idx: expected an index in [-{self.num_embeddings}, {self.num_embeddings}), "
                                 f"got {padding_idx}")
            padding_idx %= self.num_embeddings
        self.padding_idx = padding_idx
        self._impl = getattr(_core, "Embedding" + sfx)(self.num_embeddings, self.embedding_dim)
        # N(0, 1) drawn in float64 chunks straight into the C++ table: no whole float64 copy on
        # top of the table that the C++ allocation check counted; the seed from the package
        # generator (manual_seed), none drawn for a copy or a loader (skip_weight_init)
        rng = _init_generator()
        if rng is not None:
            weight = self._impl.parameter_view("weight")
            _fill_in_chunks(weight, rng.standard_normal)
            if padding_idx is not None:
                weight[padding_idx] = 0.0

    def forward(self, input_ids) -> np.ndarray:
        """``input_ids (...)`` integer ids in ``[0, num_embeddings)`` -> ``(..., embedding_dim)``; a
        float array of whole numbers is taken too (``_validation.as_ids``).

        Raises:
            TypeError: ids neither integers nor whole-number floats (bool, complex, non-integral or
            non-finite floats). ValueError: an id out of range (named with its flat index),
            empty input, or ids whose output or conversion to int64 needs more than this machine's
            memory (e.g. a broadcast view of a huge shape; checked before any copy).
        """
        ids = to_numpy(input_ids, "input_ids")
        shape = ids.shape
        if ids.dtype.kind in "iuf":  # other dtypes: as_ids's TypeError first
            # before any copy: the int64 copy of the ids (as_ids's check, in its words), then the output
            if not (ids.flags.c_contiguous and ids.dtype == np.int64):
                check_allocatable(shape, 8, "input_ids")
            _check_output_fits(ids.size * self.embedding_dim, np.dtype(self.dtype).itemsize,
                               "input_ids: the output (ids, embedding_dim)")
        if ids.dtype.kind in "iu" and ids.size:
            self._check_id_range(ids)  # before the int64 copy
        # converted (a copy checked against memory) before flattening: ``reshape(-1)`` of a broadcast
        # view (``np.broadcast_to``, stride 0) would copy all of it, unchecked
        ids = as_ids(ids, "input_ids", ndim=max(ids.ndim, 1)).reshape(-1)
        out = self._impl.forward(ids).reshape(shape + (self.embedding_dim,))
        if self.training:
            self._saved = (ids.copy(), shape)
        return out

    def _check_id_range(self, ids: np.ndarray) -> None:
        """The C++ layer's range check of integer ``ids`` (as given, not empty), in its words, made on
        the values they hold (min and max, no copy; a broadcast view's few values) before their int64
        copy. Ids beyond int64 (uint64) are left to ``as_ids``, whose error comes first."""
        own = _unbroadcast(ids)
        low, high = int(own.min()), int(own.max())
        if high > _INT64_MAX or (low >= 0 and high < self.num_embeddings):
            return
        bad = (own < 0) | (own >= self.num_embeddings)  # the first bad one (C order) of the values held:
        at = np.unravel_index(int(np.argmax(bad)), own.shape)  # the first of the whole array, each
        flat = int(np.ravel_multi_index(at, ids.shape)) if ids.ndim else 0  # broadcast dim at index 0
        raise ValueError(f"input_ids: id {int(own[at])} at flat index {flat} is outside [0, {self.num_embeddings})")

    def backward(self, grad_output) -> None:
        """Adds ``grad_output (..., embedding_dim)`` of the last training forward into the rows of
        ``weight``'s gradient that its ids picked (a scatter-add; ``padding_idx``'s row gets nothing).
        Returns None: ids have no gradient.

        Raises:
            NoTrainingStateError: no training forward since the last backward.
            ValueError: ``grad_output`` not of the output's shape.
        """
        ids, shape = self._peek_saved()
        g = _grad_output(grad_output, "grad_output", shape + (self.embedding_dim,), self.dtype)
        self._take_saved()  # checked: now consumed
        self._impl.backward(ids, g.reshape(-1, self.embedding_dim), -1 if self.padding_idx is None else self.padding_idx)
        return None


def _refuse_padding_idx_as_dtype(dtype) -> None:
    """``TypeError`` for an Embedding ``dtype`` that is an int or not a dtype at all: torch's third
    positional argument is ``padding_idx``, which such a value was most likely meant as. None passes:
    float32 (``resolve_dtype``), the same layer as torch's ``padding_idx=None``."""
    if dtype is None:
        return
    if not isinstance(dtype, (int, np.integer)):
        try:
            np.dtype(dtype)
            return  # a dtype: resolve_dtype takes it or names the dtypes it takes
        except TypeError:
            pass
    raise TypeError(f"dtype: expected float32 or float64, got {dtype!r} (torch's third positional argument is "
                    f"padding_idx, this layer's is dtype: pass padding_idx= by keyword)")


class FeedForward(Module):
    """Position-wise feed-forward network (Vaswani et al. 2017, eq. 2; the encoder tutorial's
    "The Feed-Forward Layer")::

        FFN(x) = linear2(act(linear1(x)))

    Args:
        d_model: E, input and output width.
        dim_feedforward: F, hidden width (4·E is usual).
        activation: ``"relu"`` (the paper, the encoder–decoder and einsum tutorials) or ``"gelu"`` (BERT, the encoder tutorial),
            or torch's callable of the same function (``F.relu``, ``nn.GELU()``, ...: see
            :class:`TransformerEncoderLayer`), kept as its name.
        bias: biases of both linears.
        dtype: ``np.float32`` or ``np.float64``.

    Weights: ``linear1.weight (F, E)``, ``linear1.bias (F)``, ``linear2.weight (E, F)``,
    ``linear2.bias (E)``.

    ``d_model``, ``dim_feedforward`` and ``activation`` are read-only attributes (what the C++
    layer was built with): assigning one raises AttributeError (build a new layer).

    Raises:
        TypeError: non-int sizes, an ``activation`` neither a str nor one of the callables named above, a
            non-bool ``bias``, a ``dtype`` other
            than float32/float64.
        ValueError: sizes < 1, an unknown ``activation`` (the message lists the names); weights
            larger than this machine's memory.
    """

    d_model = FixedSetting()  # what the C++ layer was built with, read-only
    dim_feedforward = FixedSetting()
    activation = FixedSetting()

    def __init__(self, d_model: int, dim_feedforward: int, activation: str = "relu", bias: bool = True,
                 dtype=np.float32):
        sfx = self._init_dtype(dtype)
        FixedSetting.set(self, d_model=check_positive_int(d_model, "d_model"),
                         dim_feedforward=check_positive_int(dim_feedforward, "dim_feedforward"),
                         activation=_check_activation(activation))
        _activation_named_in_snapshot(self)
        self._impl = getattr(_core, "FeedForward" + sfx)(self.d_model, self.dim_feedforward, self.activation,
                                                         check_bool(bias, "bias"))
        self._init_weights()

    def forward(self, x) -> np.ndarray:
        """``x (..., d_model) -> (..., d_model)`` in ``self.dtype``.

        Raises:
            ValueError: empty ``x`` or last dim not ``d_model``. TypeError: non-numeric ``x`` (strings,
                complex, objects).
        """
        return _mlp_forward(self, x)

    def backward(self, grad_output) -> np.ndarray:
        """``grad_output (..., d_model)`` -> ``grad_x (..., d_model)`` of the last training forward;
        adds every weight's gradient.

        Raises:
            NoTrainingStateError: no training forward since the last backward.
            ValueError: ``grad_output`` not of the output's shape.
        """
        return _mlp_backward(self, grad_output)


def _mlp_forward(self, x) -> np.ndarray:
    xa = unconverted(x, "x", 1)
    if xa.shape[-1] != self.d_model:  # before the conversion (a copy)
        raise ValueError(f"x: expected last dim {self.d_model} (d_model), got shape {xa.shape}")
    xa = as_float(xa, "x", self.dtype)
    x2 = xa.reshape(-1, self.d_model)
    if not self.training:
        return self._impl.forward(x2).reshape(xa.shape)
    x2 = _kept(x2, x)
    out = self._impl.forward_train(x2, 0.0, 0)  # the C++ layer keeps a pointer to x2 until backward
    self._saved = (x2, xa.shape)
    return out.reshape(xa.shape)


def _mlp_backward(self, grad_output) -> np.ndarray:
    x2, shape = self._peek_saved()
    g = _grad_output(grad_output, "grad_output", shape, self.dtype)
    self._take_saved()  # checked: now consumed
    return self._impl.backward(g.reshape(-1, self.d_model)).reshape(shape)


class GatedFeedForward(Module):
    """A gated feed-forward network (Shazeer 2020, "GLU Variants Improve Transformer"; Llama's MLP,
    Hugging Face's ``LlamaMLP``)::

        FFN(x) = down_proj(act(gate_proj(x)) · up_proj(x))       act = silu: SwiGLU; gelu: GeGLU

    gate and up are one ``(2F, E)`` product in C++.

    Args:
        d_model: E, input and output width.
        dim_feedforward: F, hidden width (Llama: about 8/3 · E).
        activation: ``"silu"`` (SwiGLU, default) or any name of the library's table (``"gelu"``:
            GeGLU), or torch's callable of the same function (``F.silu``, ``nn.SiLU()``, ...: see
            :class:`TransformerEncoderLayer`), kept as its name.
        bias: biases of the three projections (Llama: none).
        dtype: ``np.float32`` or ``np.float64``.

    Weights (Hugging Face's names): ``gate_proj.weight (F, E)``, ``up_proj.weight (F, E)``,
    ``down_proj.weight (E, F)`` (+ ``.bias`` with ``bias``).

    ``d_model``, ``dim_feedforward`` and ``activation`` are read-only attributes, as
    :class:`FeedForward`'s.

    Raises:
        TypeError: non-int sizes, an ``activation`` neither a str nor one of the callables named above, a
            non-bool ``bias``, a ``dtype`` other
            than float32/float64.
        ValueError: sizes < 1, an unknown ``activation`` (the message lists the names); weights
            larger than this machine's memory.
    """

    d_model = FixedSetting()  # what the C++ layer was built with, read-only
    dim_feedforward = FixedSetting()
    activation = FixedSetting()

    def __init__(self, d_model: int, dim_feedforward: int, activation: str = "silu", bias: bool = False,
                 dtype=np.float32):
        sfx = self._init_dtype(dtype)
        FixedSetting.set(self, d_model=check_positive_int(d_model, "d_model"),
                         dim_feedforward=check_positive_int(dim_feedforward, "dim_feedforward"),
                         activation=_check_activation(activation))
        _activation_named_in_snapshot(self)
        self._impl = getattr(_core, "GatedFeedForward" + sfx)(self.d_model, self.dim_feedforward, self.activation,
                                                               check_bool(bias, "bias"))
        self._init_weights()

    def forward(self, x) -> np.ndarray:
        """``x (..., d_model) -> (..., d_model)`` in ``self.dtype``.

        Raises:
            ValueError: empty ``x`` or last dim not ``d_model``. TypeError: non-numeric ``x``.
        """
        return _mlp_forward(self, x)

    def backward(self, grad_output) -> np.ndarray:
        """``grad_output (..., d_model)`` -> ``grad_x (..., d_model)`` of the last training forward;
        adds every weight's gradient.

        Raises:
            NoTrainingStateError: no training forward since the last backward.
            ValueError: ``grad_output`` not of the output's shape.
        """
        return _mlp_backward(self, grad_output)


class _LayerSettings(Module):
    """What the encoder and decoder layers share: the arguments their C++ layer is built from, as
    read-only attributes of torch's names (:class:`~transformer_core.module.FixedSetting`), set by
    :func:`_check_layer_args`."""

    d_model = FixedSetting()
    nhead = FixedSetting()
    dim_feedforward = FixedSetting()
    activation = FixedSetting()
    layer_norm_eps = FixedSetting()
    norm_first = FixedSetting()
    bias = FixedSetting()


class TransformerEncoderLayer(_LayerSettings):
    """One Transformer encoder layer (Vaswani et al. 2017, §3.1; the encoder and encoder–decoder tutorials), batch-first,
    mirroring ``torch.nn.TransformerEncoderLayer(batch_first=True)`` in eval mode::

        norm_first=False (post-LN):  x = norm1(x + SA(x));   x = norm2(x + FFN(x))
        norm_first=True  (pre-LN):   x = x + SA(norm1(x));   x = x + FFN(norm2(x))

    Args:
        d_model, nhead, dim_feedforward, activation, layer_norm_eps, norm_first, bias: as torch
            (defaults 2048, "relu", 1e-5, False, True); ``activation`` is torch's "relu" or "gelu"
            or any other name of the library's table (``_core.activation_names()``: "silu",
            "gelu_tanh", ...), a ValueError listing them for an unknown one; or one of torch's
            callables that compute one of them (``F.relu``, ``F.gelu``, ``F.silu``, ``torch.tanh``,
            ``nn.ReLU()``, ``nn.GELU()``, ``nn.GELU(approximate="tanh")``, ``nn.SiLU()``,
            ``nn.Tanh()``, or this package's ``functional.relu``/``gelu``/``silu``), kept as its
            name in ``self.activation``. Other callables raise TypeError: the layer runs in C++.
            (torch's own fast path, in eval under no_grad, runs ``nn.GELU(approximate="tanh")`` as
            erf's GELU; its regular path, and this layer, as the tanh form: about 1e-4 apart.)
        dtype: ``np.float32`` or ``np.float64``.
        dropout: (keyword) torch's, in training forwards only (default 0; torch's is 0.1): on the
            self-attention's probabilities (torch's ``self_attn.dropout``), on both residual branches
            (``dropout1``/``dropout2``) and between the feed-forward's two linears.
        batch_first: (keyword) torch's; True, the default here, is this layer's one layout
            ``(N, L, E)`` (torch's ``batch_first=True``). False (torch's default, ``(L, N, E)``) is a
            ``ValueError``: pass ``src.transpose(1, 0, 2)`` and transpose the output back.

    Starts in eval mode (``training`` False), unlike torch's layers, which start in training mode:
    call ``train()`` for dropout and a training forward.

    Weights (torch's names): ``self_attn.in_proj_weight``, ``self_attn.in_proj_bias``,
    ``self_attn.out_proj.weight``, ``self_attn.out_proj.bias``, ``linear1.*``, ``linear2.*``,
    ``norm1.*``, ``norm2.*``. The layer is one C++ object: torch's submodules (``self_attn``,
    ``linear1``, ``norm1``, ...) are not attributes here; their weights are reached by these names
    through ``state_dict()``, ``load_state_dict`` and ``named_parameters()``.

    The arguments the C++ layer is built from are read-only attributes of torch's names:
    ``d_model``, ``nhead``, ``dim_feedforward``, ``activation``, ``layer_norm_eps``,
    ``norm_first``, ``bias``. torch's forward reads ``norm_first`` and ``activation`` from the
    attributes; here assigning one raises AttributeError (build a new layer), so that a layer and
    the copies a stack builds from it always compute alike. ``dropout`` (read by each training
    forward) may be changed.

    Raises:
        TypeError: non-int ``d_model``/``nhead``/``dim_feedforward``; ``activation`` neither a str nor one
            of the callables above (for a
            number, a float or an int such as 0, the message says torch's fourth positional argument
            is ``dropout``);
            ``layer_norm_eps`` or ``dropout`` not a number; ``norm_first``, ``bias`` or ``batch_first``
            not a bool; a ``dtype`` other than float32/float64.
        ValueError: sizes < 1, ``d_model`` not a multiple of ``nhead``, an unknown ``activation`` (the
            message lists the names), ``layer_norm_eps`` negative or not finite, ``dropout`` outside
            [0, 1), ``batch_first=False``; weights larger than this machine's memory.
    """

    #: What a copy of the layer costs beyond its weights (the Python objects, the C++ layer and its
    #: parameter views), a lower bound: measured as the RSS growth per layer of a stack of 20000
    #: copies of a tiny layer (d_model 2 to 64), 16.2-16.7 KB. Counted by the stacks' memory check.
    _COPY_OVERHEAD_BYTES = 16 * 1024

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, activation: str = "relu",
                 layer_norm_eps: float = 1e-5, norm_first: bool = False, bias: bool = True, dtype=np.float32,
                 *, dropout: float = 0.0, batch_first: bool = True):
        _check_batch_first(batch_first)
        sfx = self._init_dtype(dtype)
        _check_layer_args(self, d_model, nhead, dim_feedforward, activation, layer_norm_eps, norm_first, bias)
        self.dropout = check_dropout(dropout)
        self._impl = getattr(_core, "TransformerEncoderLayer" + sfx)(
            self.d_model, self.nhead, self.dim_feedforward, self.activation, self.layer_norm_eps, self.norm_first,
            self.bias)
        self._init_weights()

    def forward(self, src, *, src_mask=None, src_key_mask=None, is_causal: bool = False,
                path: str = "auto", src_key_padding_mask=None) -> np.ndarray:
        """Runs the layer.

        Masks are keyword-only. ``src_mask`` is float, added, as torch's; a bool ``src_mask`` raises
        ``TypeError`` (torch reads it as True = blocked, this library as True = may attend; see the
        module doc). ``src_key_mask`` is True = a real token.

        Args:
            src: ``(N, L, E)`` (or ``(L, E)``, unbatched).
            src_mask: ``(L, L)``, ``(N·nhead, L, L)`` (``(nhead, L, L)`` unbatched), or 4-D
                broadcastable to ``(N, nhead, L, L)`` (e.g. ``(1, 1, L, L)``; no other shape is
                broadcast); float, added to the scores (0 = allowed, -inf = blocked).
            src_key_mask: ``(N, L)`` (``(L,)`` with an unbatched ``src``), True = a real token
                (``~src_key_padding_mask`` in torch).
            is_causal: apply the causal mask, together with ``src_mask`` and ``src_key_mask``
                (a key must be allowed by every mask given; torch reads the flag as a hint that
                ``src_mask`` is causal: where it is, the two agree).
            src_key_padding_mask: torch's name, refused (``TypeError``): pass
                ``src_key_mask=~src_key_padding_mask``.

        Returns:
            ``(N, L, E)`` (or ``(L, E)``) in ``self.dtype``.

        Raises:
            ValueError: wrong rank, wrong last dim, empty input, masks of the wrong shape (all
                checked before ``src`` is converted); a ``src`` of more rows (``N · L``) than the
                feed-forward's hidden activations, ``rows × dim_feedforward`` values, can hold in
                this machine's memory (before any work).
            TypeError: non-numeric input, a mask of the wrong dtype, a bool ``src_mask``,
                ``src_key_padding_mask``.
            TypeError, ValueError: in training mode, a ``dropout`` attribute assigned since that is
                not a probability in [0, 1) (checked as the constructor checks it, before any work).
        """
        _refuse_padding_mask(src_key_padding_mask, "src_key_padding_mask", "src_key_mask")
        return self._forward(src, src_mask, src_key_mask, is_causal, path, "src_mask")

    def _forward(self, src, src_mask, src_key_mask, is_causal, path, mask_name: str) -> np.ndarray:
        """:meth:`forward`, naming ``src_mask`` ``mask_name`` in its errors (the stack's ``mask``)."""
        x = unconverted(src, "src", 2)  # converted once every shape is checked
        is_causal = check_bool(is_causal, "is_causal")
        path = attention_path(path)
        p = check_dropout(self.dropout) if self.training else 0.0  # an attribute: may have been changed
        unbatched = _is_unbatched(x, "src", "L, E")
        if x.shape[-1] != self.d_model:  # the shape as given, before an unbatched src gains its batch dim
            raise ValueError(f"src: expected last dim {self.d_model} (d_model), got shape {x.shape}")
        # the feed-forward's activations, before the masks, the conversion and the attention's O(L²) work
        _check_feedforward_activations(math.prod(x.shape[:-1]), self.dim_feedforward, self.dtype, "src", x.shape)
        if unbatched:
            src_key_mask = _unbatched_key_mask(src_key_mask, "src_key_mask", x.shape[0], "L", f"src {x.shape} (L, E)")
            x = x[None]
        N, L, E = x.shape
        masks = _layer_masks(src_mask, src_key_mask, N, self.nhead, L, L, self.dtype, mask_name=mask_name,
                             key_mask_name="src_key_mask", keep=self.training)
        x = as_float(x, "src", self.dtype)
        if self.training:
            x = _kept(x, src)
            out = self._impl.forward_train(x, *masks, bool(is_causal), path, p, p, self._dropout_seed(p), p)
            self._saved = (x, masks, unbatched)  # the C++ layer keeps pointers to these until backward
        else:
            out = self._impl.forward(x, *masks, bool(is_causal), path)
        return out[0] if unbatched else out

    def backward(self, grad_output) -> np.ndarray:
        """``grad_output`` (the output's shape) -> ``grad_src`` of the last training forward; adds
        every weight's gradient.

        Raises:
            NoTrainingStateError: no training forward since the last backward.
            ValueError: ``grad_output`` not of the output's shape.
        """
        x, _masks, unbatched = self._peek_saved()
        g = _grad_output(grad_output, "grad_output", x.shape[1:] if unbatched else x.shape, self.dtype)
        self._take_saved()  # checked: now consumed
        d = self._impl.backward(g[None] if unbatched else g)
        return d[0] if unbatched else d


def _refuse_dropout_as_activation(activation, ordinal: str, what: str) -> None:
    """TypeError for a number (a float, or an int such as 0) given as ``activation``: the
    ``ordinal`` positional argument of the torch class (``"fourth"`` for the encoder and decoder
    layers, ``"sixth"`` for ``nn.Transformer``) is ``dropout``, this ``what``'s (``"layer"``,
    ``"model"``) is ``activation``."""
    if _is_torch_dropout(activation):
        raise TypeError(f"activation: expected a str, got {type(activation).__name__} {activation} (torch's {ordinal} "
                        f"positional argument is dropout, this {what}'s is activation: pass dropout= by keyword)")


def _check_layer_args(self, d_model, nhead, dim_feedforward, activation, layer_norm_eps, norm_first, bias) -> None:
    """Checks an encoder or decoder layer's arguments and sets them, as its read-only settings
    (:class:`~transformer_core.module.FixedSetting`: the C++ layer is built from them once, and a
    stack's copies from them again, so they must not change afterwards)."""
    d_model = check_positive_int(d_model, "d_model")
    nhead = check_positive_int(nhead, "nhead")
    if d_model % nhead != 0:
        raise ValueError(f"d_model: expected a multiple of nhead ({nhead}), got {d_model}")
    dim_feedforward = check_positive_int(dim_feedforward, "dim_feedforward")
    _refuse_dropout_as_activation(activation, "fourth", "layer")  # torch's (d_model, nhead, dim_feedforward, dropout)
    activation = _check_activation(activation)
    _activation_named_in_snapshot(self)
    FixedSetting.set(self, d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward, activation=activation,
                     layer_norm_eps=check_eps(layer_norm_eps, "layer_norm_eps"),
                     norm_first=check_bool(norm_first, "norm_first"), bias=check_bool(bias, "bias"))


def _layer_args(layer) -> tuple:
    return (layer.d_model, layer.nhead, layer.dim_feedforward, layer.activation, layer.layer_norm_eps,
            layer.norm_first, layer.bias, layer.dtype)


def _normalized_size(normalized_shape) -> int:
    """E from torch's ``normalized_shape`` (an int or a 1-tuple: only the last dim is normalised)."""
    if isinstance(normalized_shape, (tuple, list)):
        if len(normalized_shape) != 1:
            raise ValueError(f"normalized_shape: only the last dim is supported, got {normalized_shape}")
        normalized_shape = normalized_shape[0]
    return check_positive_int(normalized_shape, "normalized_shape")


class _Norm(Module):
    """What LayerNorm and RMSNorm share: rows of the last dim E through the C++ layer, and its backward.

    ``elementwise_affine=False`` (torch's): no parameters at all (empty ``state_dict``,
    ``named_parameters`` and ``gradients``). The C++ layer keeps its weight, ones (y · 1 = y), and
    its gradient, which its backward still writes; both are hidden here (:meth:`_public_name`),
    so no loader or optimizer reaches them.
    """

    # what the C++ layer was built with, read-only (torch's forward reads normalized_shape and eps;
    # elementwise_affine decides which weights state_dict holds)
    normalized_size = FixedSetting(argument="normalized_shape=...")
    eps = FixedSetting()
    elementwise_affine = FixedSetting(default=True)
    _optional_weights = frozenset({"weight", "bias"})  # elementwise_affine=False, bias=False: None (RMSNorm: below)
    _optional_weight_arguments = {"weight": "elementwise_affine=True", "bias": "elementwise_affine=True, bias=True"}
    _public_name_of_core_name_only = False  # the names hang on elementwise_affine

    @property
    def normalized_shape(self) -> tuple[int]:
        """torch's ``normalized_shape``: ``(E,)`` (these layers normalise over the last dim only;
        ``normalized_size`` is E). Read-only, as ``normalized_size`` (AttributeError: build a new layer)."""
        return (self.normalized_size,)

    @normalized_shape.setter
    def normalized_shape(self, value) -> None:
        """Refused: AttributeError (build a new layer: :func:`~transformer_core.module.fixed_setting_refusal`)."""
        raise fixed_setting_refusal(self, "normalized_shape")

    @normalized_shape.deleter
    def normalized_shape(self) -> None:
        """Refused, as assigning it."""
        raise fixed_setting_refusal(self, "normalized_shape")

    def _public_name(self, core_name: str) -> str | None:
        return core_name if self.elementwise_affine else None

    def forward(self, x) -> np.ndarray:
        """``x (..., E) -> (..., E)`` in ``self.dtype``.

        Raises:
            ValueError: empty ``x`` or last dim not E. TypeError: non-numeric ``x``.
        """
        xa = unconverted(x, "x", 1)
        if xa.shape[-1] != self.normalized_size:  # before the conversion (a copy)
            raise ValueError(f"x: expected last dim {self.normalized_size}, got shape {xa.shape}")
        xa = as_float(xa, "x", self.dtype)
        x2 = xa.reshape(-1, self.normalized_size)
        if self.training:
            self._saved = (_kept(x2, x), xa.shape)
        return self._impl.forward(x2).reshape(xa.shape)

    def backward(self, grad_output) -> np.ndarray:
        """``grad_output (..., E)`` -> ``grad_x (..., E)`` of the last training forward; adds the
        gradients of ``weight`` (and of LayerNorm's ``bias``).

        Raises:
            NoTrainingStateError: no training forward since the last backward.
            ValueError: ``grad_output`` not of the output's shape.
        """
        x2, shape = self._peek_saved()
        g = _grad_output(grad_output, "grad_output", shape, self.dtype)
        self._take_saved()  # checked: now consumed
        return self._impl.backward(x2, g.reshape(-1, self.normalized_size)).reshape(shape)


class LayerNorm(_Norm):
    """Layer normalisation over the last dim (Ba et al. 2016), as ``torch.nn.LayerNorm(E)``::

        y = (x - mean) / sqrt(var + eps) * weight + bias

    Args (torch's, in torch's order):
        normalized_shape: E (an int, or a 1-tuple).
        eps: added to the variance (torch's default 1e-5).
        elementwise_affine: learn ``weight`` (and ``bias``); False: no parameters, y is the
            normalised x (torch's ``bias`` is then ignored, as here).
        bias: learn a bias (``bias=False`` as torch).
        dtype: ``np.float32`` or ``np.float64``.

    Weights: ``weight (E,)`` (ones), ``bias (E,)`` (zeros); none without ``elementwise_affine``.

    One difference from torch, :func:`~transformer_core.functional.layer_norm`'s: a row whose
    squares overflow the dtype (float32 ``1e30``) is normalised where torch gives NaN, and one
    whose squares underflow with ``eps = 0`` where torch gives ±inf.

    ``normalized_shape`` (``normalized_size``), ``eps`` and ``elementwise_affine`` are read-only
    attributes (torch's forward reads the first two, and the third decides which weights
    ``state_dict`` holds; here the C++ layer was built with them): assigning one
    raises AttributeError (build a new layer). Assigning a value other than None to a weight the
    layer was built without (``weight`` with ``elementwise_affine=False``) raises ValueError.

    Raises:
        TypeError: ``normalized_shape`` (or its one element) not an int; ``eps`` not a number;
            ``elementwise_affine`` or ``bias`` not a bool; a ``dtype`` other than float32/float64.
        ValueError: E < 1, a ``normalized_shape`` tuple/list not of length 1; ``eps`` negative or not
            finite; weights larger than this machine's memory.
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 dtype=np.float32):
        sfx = self._init_dtype(dtype)
        FixedSetting.set(self, normalized_size=_normalized_size(normalized_shape), eps=check_eps(eps, "eps"),
                         elementwise_affine=check_bool(elementwise_affine, "elementwise_affine"))
        bias = check_bool(bias, "bias") and self.elementwise_affine
        self._impl = getattr(_core, "LayerNorm" + sfx)(self.normalized_size, self.eps, bias)


class RMSNorm(_Norm):
    """Root-mean-square normalisation over the last dim (Zhang & Sennrich 2019), as
    ``torch.nn.RMSNorm(E)`` and Hugging Face's ``LlamaRMSNorm``::

        y = x / sqrt(mean(x²) + eps) * weight

    Args:
        normalized_shape: E (an int, or a 1-tuple).
        eps: added to the mean square (torch's default: the dtype's machine epsilon; Llama 1e-5 or
            1e-6). None = ``np.finfo(dtype).eps``, as torch.
        elementwise_affine: learn ``weight``; False: no parameters, as torch.
        dtype: ``np.float32`` or ``np.float64``.

    Weights: ``weight (E,)`` (ones); none without ``elementwise_affine``.

    One difference from torch, :func:`~transformer_core.functional.rms_norm`'s: a row whose
    squares overflow the dtype (float32 ``1e30``) is normalised where torch gives 0, and one whose
    squares underflow with ``eps = 0`` too.

    ``normalized_shape``, ``eps`` and ``elementwise_affine`` are read-only, as :class:`LayerNorm`'s.

    Raises:
        TypeError: ``normalized_shape`` (or its one element) not an int; ``eps`` neither None nor a
            number; ``elementwise_affine`` not a bool; a ``dtype`` other than float32/float64.
        ValueError: E < 1, a ``normalized_shape`` tuple/list not of length 1; ``eps`` negative or not
            finite; weights larger than this machine's memory.
    """

    _optional_weights = frozenset({"weight"})  # torch's RMSNorm has no bias at all: an AttributeError

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True,
                 dtype=np.float32):
        sfx = self._init_dtype(dtype)
        FixedSetting.set(self, normalized_size=_normalized_size(normalized_shape),
                         eps=float(np.finfo(self.dtype).eps) if eps is None else check_eps(eps, "eps"),
                         elementwise_affine=check_bool(elementwise_affine, "elementwise_affine"))
        self._impl = getattr(_core, "RMSNorm" + sfx)(self.normalized_size, self.eps)
        self._init_weights()


class TransformerDecoderLayer(_LayerSettings):
    """One Transformer decoder layer (Vaswani et al. 2017, §3.1; the encoder–decoder tutorial's decoder steps),
    batch-first, mirroring ``torch.nn.TransformerDecoderLayer(batch_first=True)`` in eval mode::

        norm_first=False:  x = norm1(x + SA(x));  x = norm2(x + CA(x, memory));  x = norm3(x + FFN(x))
        norm_first=True:   x = x + SA(norm1(x));  x = x + CA(norm2(x), memory);  x = x + FFN(norm3(x))

    SA is masked self-attention, CA cross-attention whose keys and values are the encoder output.

    Args: as :class:`TransformerEncoderLayer` (``dropout`` also on the cross-attention's
    probabilities, torch's ``multihead_attn.dropout``, and on ``dropout3``; ``batch_first``: True,
    this layer's one layout; False is a ``ValueError``: pass ``tgt.transpose(1, 0, 2)`` and
    ``memory.transpose(1, 0, 2)``, and transpose the output back).

    Starts in eval mode (``training`` False), unlike torch's layers, which start in training mode:
    call ``train()`` for dropout and a training forward.

    Weights (torch's names): ``self_attn.*``, ``multihead_attn.*``, ``linear1.*``, ``linear2.*``,
    ``norm1.*``, ``norm2.*``, ``norm3.*``. The layer is one C++ object: torch's submodules
    (``self_attn``, ``multihead_attn``, ``linear1``, ``norm1``, ...) are not attributes here; their
    weights are reached by these names through ``state_dict()``, ``load_state_dict`` and
    ``named_parameters()``.

    The arguments the C++ layer is built from are read-only attributes, as
    :class:`TransformerEncoderLayer`'s.

    Raises:
        TypeError, ValueError: as :class:`TransformerEncoderLayer` (the same arguments, checked alike).
    """

    #: As :attr:`TransformerEncoderLayer._COPY_OVERHEAD_BYTES` (measured alike: 25.5-25.7 KB).
    _COPY_OVERHEAD_BYTES = 24 * 1024

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, activation: str = "relu",
                 layer_norm_eps: float = 1e-5, norm_first: bool = False, bias: bool = True, dtype=np.float32,
                 *, dropout: float = 0.0, batch_first: bool = True):
        _check_batch_first(batch_first)
        sfx = self._init_dtype(dtype)
        _check_layer_args(self, d_model, nhead, dim_feedforward, activation, layer_norm_eps, norm_first, bias)
        self.dropout = check_dropout(dropout)
        self._impl = getattr(_core, "TransformerDecoderLayer" + sfx)(
            self.d_model, self.nhead, self.dim_feedforward, self.activation, self.layer_norm_eps, self.norm_first,
            self.bias)
        self._init_weights()

    def forward(self, tgt, memory, *, tgt_mask=None, memory_mask=None, tgt_key_mask=None, memory_key_mask=None,
                tgt_is_causal: bool = False, memory_is_causal: bool = False, path: str = "auto",
                tgt_key_padding_mask=None, memory_key_padding_mask=None) -> np.ndarray:
        """Runs the layer.

        Masks are keyword-only. ``tgt_mask`` and ``memory_mask`` are float, added, as torch's; a bool
        one raises ``TypeError`` (torch reads it as True = blocked, this library as True = may attend;
        see the module doc). The key masks are True = a real token.

        Unbatched, as torch's: ``tgt (T, E)`` with ``memory (S, E)`` (both 2-D), key masks ``(T,)``
        and ``(S,)``, 3-D masks ``(nhead, T, ·)``; the output is ``(T, E)``.

        Args:
            tgt: ``(N, T, E)``, the decoder input.
            memory: ``(N, S, E)``, the encoder output.
            tgt_mask: self-attention mask, ``(T, T)``, ``(N·nhead, T, T)`` or 4-D broadcastable to
                ``(N, nhead, T, T)`` (e.g. ``(1, 1, T, T)``; no other shape is broadcast); float,
                added (0 = allowed, -inf = blocked).
            memory_mask: cross-attention mask, ``(T, S)``, ``(N·nhead, T, S)`` or 4-D broadcastable
                to ``(N, nhead, T, S)``; float, added.
            tgt_key_mask: ``(N, T)``, True = real token. memory_key_mask: ``(N, S)``.
            tgt_is_causal: apply the causal mask to the self-attention, together with ``tgt_mask``
                and ``tgt_key_mask`` (every mask given applies; torch reads the flag as a hint that
                ``tgt_mask`` is causal: where it is, the two agree).
            memory_is_causal: apply a (top-left) causal mask to the cross-attention.
            tgt_key_padding_mask, memory_key_padding_mask: torch's names, refused (``TypeError``):
                pass ``tgt_key_mask=~tgt_key_padding_mask``, ``memory_key_mask=~memory_key_padding_mask``.

        Returns:
            ``(N, T, E)`` (or ``(T, E)``) in ``self.dtype``.

        Raises:
            ValueError: shapes that disagree, empty input, masks of the wrong shape (all checked
                before ``tgt`` and ``memory`` are converted); a ``tgt`` of more rows (``N · T``)
                than the feed-forward's hidden activations, ``rows × dim_feedforward`` values, can
                hold in this machine's memory (before any work).
            TypeError: non-numeric input, a mask of the wrong dtype, a bool ``tgt_mask``/``memory_mask``,
                a torch ``*_key_padding_mask``.
            TypeError, ValueError: in training mode, a ``dropout`` attribute assigned since that is
                not a probability in [0, 1) (checked as the constructor checks it, before any work).
        """
        _refuse_padding_mask(tgt_key_padding_mask, "tgt_key_padding_mask", "tgt_key_mask")
        _refuse_padding_mask(memory_key_padding_mask, "memory_key_padding_mask", "memory_key_mask")
        x = unconverted(tgt, "tgt", 2)  # both converted once every shape is checked
        mem = unconverted(memory, "memory", 2)
        tgt_is_causal = check_bool(tgt_is_causal, "tgt_is_causal")
        memory_is_causal = check_bool(memory_is_causal, "memory_is_causal")
        path = attention_path(path)
        p = check_dropout(self.dropout) if self.training else 0.0  # an attribute: may have been changed
        unbatched = _is_unbatched(x, "tgt", "T, E")
        given = x.shape  # before an unbatched tgt gains its batch dim
        if x.shape[-1] != self.d_model:
            raise ValueError(f"tgt: expected last dim {self.d_model} (d_model), got shape {x.shape}")
        if unbatched:
            if mem.ndim != 2 or mem.shape[1] != self.d_model:
                raise ValueError(f"memory: expected shape (S, {self.d_model}) as tgt is unbatched {x.shape}, "
                                 f"got {mem.shape}")
            what = f"tgt {x.shape} (T, E) and memory {mem.shape} (S, E)"
            tgt_key_mask = _unbatched_key_mask(tgt_key_mask, "tgt_key_mask", x.shape[0], "T", what)
            memory_key_mask = _unbatched_key_mask(memory_key_mask, "memory_key_mask", mem.shape[0], "S", what)
            x, mem = x[None], mem[None]
        N, T, E = x.shape
        if mem.ndim != 3 or mem.shape[0] != N or mem.shape[2] != E:
            raise ValueError(f"memory: expected shape ({N}, S, {E}), got {mem.shape}")
        S = mem.shape[1]
        # the feed-forward's activations, before the masks, the conversion and the attention's O(T²) work
        _check_feedforward_activations(N * T, self.dim_feedforward, self.dtype, "tgt", given)
        self_masks = _layer_masks(tgt_mask, tgt_key_mask, N, self.nhead, T, T, self.dtype, mask_name="tgt_mask",
                                  key_mask_name="tgt_key_mask", keep=self.training)
        cross_masks = _layer_masks(memory_mask, memory_key_mask, N, self.nhead, T, S, self.dtype,
                                   mask_name="memory_mask", key_mask_name="memory_key_mask", keep=self.training)
        x, mem = as_float(x, "tgt", self.dtype), as_float(mem, "memory", self.dtype)
        if memory_is_causal:  # the C++ layer's bool slot (the user's masks are float)
            from .masks import causal_mask

            cross_masks = (np.broadcast_to(causal_mask(T, S)[None, None], (N, self.nhead, T, S)),) + cross_masks[1:]
        if not self.training:
            out = self._impl.forward(x, mem, *self_masks, bool(tgt_is_causal), *cross_masks, path)
            return out[0] if unbatched else out
        x, mem = _kept(x, tgt), _kept(mem, memory)
        out = self._impl.forward_train(x, mem, *self_masks, bool(tgt_is_causal), *cross_masks, path, p, p,
                                       self._dropout_seed(p), p)
        self._saved = (x, mem, self_masks, cross_masks, unbatched)  # kept by pointer in C++ until backward
        return out[0] if unbatched else out

    def backward(self, grad_output) -> tuple[np.ndarray, np.ndarray]:
        """``grad_output (N, T, E)`` -> ``(grad_tgt (N, T, E), grad_memory (N, S, E))`` of the last
        training forward; adds every weight's gradient. ``grad_memory`` sums the gradients of the
        cross-attention's keys and values. After an unbatched forward: ``(T, E)`` ->
        ``((T, E), (S, E))``.

        Raises:
            NoTrainingStateError: no training forward since the last backward.
            ValueError: ``grad_output`` not of the output's shape.
        """
        x, mem, _self_masks, _cross_masks, unbatched = self._peek_saved()
        g = _grad_output(grad_output, "grad_output", x.shape[1:] if unbatched else x.shape, self.dtype)
        self._take_saved()  # checked: now consumed
        grads = tuple(self._impl.backward(g[None] if unbatched else g, mem.shape[1]))
        return tuple(d[0] for d in grads) if unbatched else grads


def _check_layer_copies(stacks, weights_around: int = 0) -> None:
    """ValueError when ``stacks`` (``(name, count, layer)`` each: ``count`` copies of ``layer``, the
    argument ``name`` sets it) need more than this machine's memory: each copy's weights and its
    ``_COPY_OVERHEAD_BYTES`` (Python and C++ objects, which a weights-only check misses: a tiny layer
    costs 7 times its weights), one stack alone (naming its argument), then all of them together with
    ``weights_around`` bytes of a containing model's weights (naming every argument). Made before
    any copy is built: a count too large is refused at once, not after minutes of copying."""
    limit = physical_memory_bytes()
    total = weights_around
    for name, count, layer in stacks:
        weights = sum(math.prod(shape) for shape in layer.parameter_shapes().values()) * np.dtype(layer.dtype).itemsize
        each = weights + type(layer)._COPY_OVERHEAD_BYTES
        if count * each > limit:
            raise ValueError(f"{name}: {count} copies of the layer need about {count * each} bytes ({weights} bytes "
                             f"of weights and about {type(layer)._COPY_OVERHEAD_BYTES} bytes of Python and C++ "
                             f"objects each), more than this machine's memory ({limit} bytes)")
        total += count * each
    if total > limit:
        names = ", ".join(name for name, _, _ in stacks)
        raise ValueError(f"{names}: the layers' copies (with the weights around them) need about {total} bytes, "
                         f"more than this machine's memory ({limit} bytes)")


class _Stack(Module):
    """A stack of identical layers (copies of one, as torch deep-copies it) and an optional norm."""

    #: The class of the stack's layers (each stack sets its own): a forward checks every layer.
    _layer_class: type = Module

    def _check_layers(self, path: str = "") -> None:
        """Raises TypeError naming ``{path}layers[i]`` when a layer is not of the stack's layer class
        (one replaced since, ``enc.layers[0] = nn.Linear(8, 8)``), before any layer runs."""
        expected = self._layer_class.__name__
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, self._layer_class):
                raise TypeError(f"{path}layers[{i}]: expected a transformer_core.nn.{expected} (every layer of a "
                                f"{type(self).__name__} is one), got {type_path(layer)}; put a {expected} there, or "
                                "run the other module outside the stack")

    def __init__(self, layer, num_layers: int, norm: LayerNorm | None):
        self.num_layers = check_positive_int(num_layers, "num_layers")
        if norm is not None and not isinstance(norm, LayerNorm):
            raise TypeError(f"norm: expected a transformer_core.nn.LayerNorm or None, got {type_path(norm)}"
                            f"{torch_module_hint(norm, 'LayerNorm')}")
        if norm is not None and norm.normalized_size != layer.d_model:
            raise ValueError(f"norm: expected a LayerNorm of size {layer.d_model} (the layer's d_model), got "
                             f"{norm.normalized_size}")
        if norm is not None and norm.dtype != layer.dtype:
            raise TypeError(f"norm: expected a LayerNorm of {np.dtype(layer.dtype).name} (the layer's dtype), got "
                            f"{np.dtype(norm.dtype).name}")
        # the copies' weights, all allocated by this loop: checked first (a silly num_layers is a
        # ValueError, not hours of copying and the OOM killer)
        per_layer = sum(int(np.prod(shape)) for shape in layer.parameter_shapes().values())
        check_allocatable((self.num_layers, per_layer), np.dtype(layer.dtype).itemsize, "num_layers")
        _check_layer_copies([("num_layers", self.num_layers, layer)])  # and what each copy costs beyond them
        self._fix_dtype(layer.dtype)
        state = layer.state_dict()
        self.layers = []
        for _ in range(self.num_layers):
            with skip_weight_init():  # nothing drawn: every weight is the layer's, loaded next
                copy = type(layer)(*_layer_args(layer), dropout=layer.dropout)
            copy.load_state_dict(state)
            self.layers.append(copy)
        self.norm = norm

    def _children(self):
        children = [(f"layers.{i}", layer) for i, layer in enumerate(self.layers)]
        norm = getattr(self, "norm", None)  # deleted (del enc.norm): none, as torch's
        if norm is not None:
            children.append(("norm", norm))
        return children

    def _run(self, layer_forward, x) -> np.ndarray:
        """``layer_forward(layer, x)`` through every layer, then the norm. In training mode the layers
        and the norm keep what their backward needs and the stack marks the forward whole (its own
        ``_saved``, which a shallow copy does not share); one that fails after a layer kept its part
        drops the state of all of them (a backward then raises instead of mixing two forwards)."""
        self._check_layers()
        kept = False
        try:
            for layer in self.layers:
                x = layer_forward(layer, x)
                kept = self.training
            out = x if self.norm is None else self.norm(x)
        except BaseException:
            if kept:
                self._drop_training_state()
            raise
        if self.training:
            self._saved = True
        return out


class TransformerEncoder(_Stack):
    """A stack of ``num_layers`` copies of ``encoder_layer`` and an optional final norm, as
    ``torch.nn.TransformerEncoder`` (the encoder tutorial's ``TransformerEncoder``, without the embeddings).
    The rows of padding tokens (``src_key_mask`` False) hold what the layers compute there, as torch's
    regular path does; torch's nested-tensor fast path (eval, no grad, ``enable_nested_tensor``, its
    default) returns zeros in them instead. The rows of real tokens agree either way.

    Args:
        encoder_layer: a :class:`TransformerEncoderLayer` (copied, weights included).
        num_layers: how many copies.
        norm: a :class:`LayerNorm` applied at the end, or None.
        enable_nested_tensor, mask_check: torch's switches of its nested-tensor fast path
            (ported code passes ``enable_nested_tensor=False``, as torch's warning about pre-LN
            stacks advises), taken and kept as attributes; this stack has no such path, so
            neither changes what it computes (see above for the padding rows).

    Weights: ``layers.{i}.*`` and ``norm.*`` (torch's names).

    Raises:
        TypeError: ``encoder_layer`` not a :class:`TransformerEncoderLayer` (a torch one: the message
            says how to load its weights into ours); ``num_layers`` not an int; ``norm`` neither a
            :class:`LayerNorm` nor None, or of another dtype than the layer; ``enable_nested_tensor``
            or ``mask_check`` not a bool.
        ValueError: ``num_layers`` < 1, or more copies than this machine's memory holds (checked
            before any is made); ``norm``'s size not the layer's ``d_model``.
    """

    _layer_class = TransformerEncoderLayer

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: LayerNorm | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True):
        if not isinstance(encoder_layer, TransformerEncoderLayer):
            raise TypeError(f"encoder_layer: expected a transformer_core.nn.TransformerEncoderLayer, got "
                            f"{type_path(encoder_layer)}{torch_module_hint(encoder_layer, 'TransformerEncoderLayer')}")
        enable_nested_tensor = check_bool(enable_nested_tensor, "enable_nested_tensor")
        mask_check = check_bool(mask_check, "mask_check")
        super().__init__(encoder_layer, num_layers, norm)
        self.enable_nested_tensor, self.mask_check = enable_nested_tensor, mask_check

    def forward(self, src, *, mask=None, src_key_mask=None, is_causal: bool = False,
                path: str = "auto", src_key_padding_mask=None) -> np.ndarray:
        """``src (N, L, E) -> (N, L, E)`` (or ``(L, E) -> (L, E)``, unbatched); ``mask`` (the
        layers' ``src_mask``, named ``mask`` in errors: float, added; a bool mask raises
        ``TypeError``), ``src_key_mask`` (True = a real token) and ``is_causal`` as in
        :meth:`TransformerEncoderLayer.forward`, keyword-only, applied in every layer. torch's
        ``src_key_padding_mask`` is refused (``TypeError``: pass ``src_key_mask=~src_key_padding_mask``).

        Raises:
            ValueError: ``src`` empty or of the wrong rank or last dim; masks of the wrong shape, a key
                mask of values other than 0/1; an unknown ``path``; a finite float64 value beyond a
                float32 stack's range; feed-forward activations (``N · L`` rows × ``dim_feedforward``)
                larger than this machine's memory, naming ``src`` (all checked before any layer runs).
            TypeError: non-numeric input, a mask of the wrong dtype, a bool ``mask``, a non-bool
                ``is_causal``, ``src_key_padding_mask``; a layer replaced by another module since
                (``enc.layers[0] = Linear(...)``: naming ``layers[0]``, before any layer runs).
        """
        _refuse_padding_mask(src_key_padding_mask, "src_key_padding_mask", "src_key_mask")
        _float_mask(mask, "mask")
        return self._run(lambda layer, x: layer._forward(x, mask, src_key_mask, is_causal, path, "mask"), src)

    def backward(self, grad_output) -> np.ndarray:
        """``grad_output (N, L, E)`` -> ``grad_src (N, L, E)`` of the last training forward, through
        the norm and every layer in reverse; adds every weight's gradient (unbatched: ``(L, E)``).
        Every layer and the norm are checked before any of them adds a gradient.

        Raises:
            NoTrainingStateError: no training forward since the last backward (or a layer's or the
                norm's own backward ran since: the state is dropped).
            WeightsChangedError (a NoTrainingStateError): a weight of the stack (of any layer, or the
                norm) was written since the forward: the state is dropped, no gradient added.
            ValueError: ``grad_output`` not of the output's shape (the state is kept).
        """
        self._check_backward_ready()
        modules = ([self.norm] if self.norm is not None else []) + self.layers[::-1]
        g = modules[0].backward(grad_output)  # checks grad_output (a refused call keeps the state)
        self._saved = None  # consumed
        for module in modules[1:]:
            g = module.backward(g)
        return g


class TransformerDecoder(_Stack):
    """A stack of ``num_layers`` copies of ``decoder_layer`` and an optional final norm, as
    ``torch.nn.TransformerDecoder``.

    Args:
        decoder_layer: a :class:`TransformerDecoderLayer` (copied, weights included).
        num_layers: how many copies.
        norm: a :class:`LayerNorm` applied at the end, or None.

    Weights: ``layers.{i}.*`` and ``norm.*`` (torch's names).

    Raises:
        TypeError: ``decoder_layer`` not a :class:`TransformerDecoderLayer` (a torch one: the message
            says how to load its weights into ours); ``num_layers`` not an int; ``norm`` neither a
            :class:`LayerNorm` nor None, or of another dtype than the layer.
        ValueError: ``num_layers`` < 1, or more copies than this machine's memory holds (checked
            before any is made); ``norm``'s size not the layer's ``d_model``.
    """

    _layer_class = TransformerDecoderLayer

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm: LayerNorm | None = None):
        if not isinstance(decoder_layer, TransformerDecoderLayer):
            raise TypeError(f"decoder_layer: expected a transformer_core.nn.TransformerDecoderLayer, got "
                            f"{type_path(decoder_layer)}{torch_module_hint(decoder_layer, 'TransformerDecoderLayer')}")
        super().__init__(decoder_layer, num_layers, norm)

    def forward(self, tgt, memory, *, tgt_mask=None, memory_mask=None, tgt_key_mask=None, memory_key_mask=None,
                tgt_is_causal: bool = False, memory_is_causal: bool = False, path: str = "auto",
                tgt_key_padding_mask=None, memory_key_padding_mask=None) -> np.ndarray:
        """``tgt (N, T, E)``, ``memory (N, S, E)`` -> ``(N, T, E)`` (or, unbatched, ``tgt (T, E)``,
        ``memory (S, E)`` -> ``(T, E)``); masks as in
        :meth:`TransformerDecoderLayer.forward` (keyword-only; ``tgt_mask``/``memory_mask`` float,
        added; key masks True = a real token; torch's ``*_key_padding_mask`` refused), applied in
        every layer.

        Raises:
            ValueError: ``tgt`` or ``memory`` empty, of the wrong rank or last dim, or not agreeing
                (batch size; both batched or both unbatched); masks of the wrong shape, a key mask of
                values other than 0/1; an unknown ``path``; a finite float64 value beyond a float32
                stack's range; feed-forward activations (``N · T`` rows × ``dim_feedforward``) larger
                than this machine's memory, naming ``tgt`` (all checked before any layer runs).
            TypeError: non-numeric input, a mask of the wrong dtype, a bool ``tgt_mask``/``memory_mask``,
                a non-bool ``tgt_is_causal``/``memory_is_causal``, a torch ``*_key_padding_mask``; a
                layer replaced by another module since (naming ``layers[i]``, before any layer runs).
        """
        _refuse_padding_mask(tgt_key_padding_mask, "tgt_key_padding_mask", "tgt_key_mask")
        _refuse_padding_mask(memory_key_padding_mask, "memory_key_padding_mask", "memory_key_mask")
        return self._run(lambda layer, x: layer(
            x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask, tgt_key_mask=tgt_key_mask,
            memory_key_mask=memory_key_mask, tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal,
            path=path), tgt)

    def backward(self, grad_output) -> tuple[np.ndarray, np.ndarray]:
        """``grad_output (N, T, E)`` -> ``(grad_tgt (N, T, E), grad_memory (N, S, E))`` of the last
        training forward; ``grad_memory`` sums over the layers (each attends to the memory). After
        an unbatched forward: ``(T, E)`` -> ``((T, E), (S, E))``.

        Raises:
            NoTrainingStateError, WeightsChangedError, ValueError: as
                :meth:`TransformerEncoder.backward` (every layer and the norm checked before any of
                them adds a gradient).
        """
        self._check_backward_ready()
        g, grad_memory, consumed = grad_output, None, False
        if self.norm is not None:
            g = self.norm.backward(g)  # checks grad_output (a refused call keeps the state)
            self._saved, consumed = None, True
        for layer in reversed(self.layers):
            g, gm = layer.backward(g)
            if not consumed:
                self._saved, consumed = None, True
            grad_memory = gm if grad_memory is None else grad_memory + gm
        return g, grad_memory


# The weight tables of a model being built around a Transformer (Transformer._within), per thread.
_CONTAINING_TABLES = threading.local()


class Transformer(Module):
    """The encoder-decoder Transformer (Vaswani et al. 2017, Figure 1; the encoder–decoder tutorial), as
    ``torch.nn.Transformer(batch_first=True)`` in eval mode: an encoder stack and a decoder stack,
    each ending in a LayerNorm. The encoder's rows of padding tokens are as in
    :class:`TransformerEncoder` (torch's regular path, not its nested-tensor zeros).

    Args: ``d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
    dim_feedforward=2048, activation="relu", layer_norm_eps=1e-5, norm_first=False, bias=True``
    as torch, ``dtype``, and ``dropout`` (keyword, default 0: torch's default is 0.1; training
    forwards only, see the module doc). ``batch_first`` (keyword): True, the default here, is this
    model's one layout, ``(N, S, E)`` / ``(N, T, E)`` (torch's ``batch_first=True``); False (torch's
    default) is a ``ValueError``: pass ``src.transpose(1, 0, 2)``, ``tgt.transpose(1, 0, 2)`` and
    transpose the output back.

    Starts in eval mode (``training`` False), unlike torch's ``nn.Transformer``, which starts in
    training mode: call ``train()`` for dropout and a training forward.

    Raises: TypeError / ValueError naming ``num_encoder_layers`` or ``num_decoder_layers``: not an
    int or < 1 (before any layer is built), more layers than this machine's memory holds, one stack
    or both together (before either stack is built); ``activation`` a number (a float, or an int
    such as 0): a ``TypeError`` saying that torch's sixth positional argument is ``dropout``. The
    other arguments are the layers': they raise as in :class:`TransformerEncoderLayer`
    (``batch_first=False``: a ``ValueError``).

    Weights (torch's names): ``encoder.layers.{i}.*``, ``encoder.norm.*``,
    ``decoder.layers.{i}.*``, ``decoder.norm.*``. Each layer's matrices are drawn on their own
    (uniform(±1/sqrt(fan_in)), from seeds of :func:`~transformer_core.manual_seed`'s generator), as
    torch's ``nn.Transformer`` draws every matrix again after copying its layers (with xavier_uniform_
    there); a stack built on its own, :class:`TransformerEncoder`, holds equal copies of its layer,
    as torch's.

    ``d_model`` and ``nhead`` are read-only attributes (what the layers were built with; assigning
    one raises AttributeError: build a new model).
    """

    d_model = FixedSetting()
    nhead = FixedSetting()

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6, num_decoder_layers: int = 6,
                 dim_feedforward: int = 2048, activation: str = "relu", layer_norm_eps: float = 1e-5,
                 norm_first: bool = False, bias: bool = True, dtype=np.float32, *, dropout: float = 0.0,
                 batch_first: bool = True):
        _check_batch_first(batch_first)
        self._init_dtype(dtype)
        # the layer counts under their own names (the stacks would name both ``num_layers``), before
        # anything is built
        num_encoder_layers = check_positive_int(num_encoder_layers, "num_encoder_layers")
        num_decoder_layers = check_positive_int(num_decoder_layers, "num_decoder_layers")
        # torch's (d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward, dropout): its
        # sixth positional argument is this model's activation (the layers would say "fourth")
        _refuse_dropout_as_activation(activation, "sixth", "model")
        args = (d_model, nhead, dim_feedforward, activation, layer_norm_eps, norm_first, bias, self.dtype)
        encoder_layer = TransformerEncoderLayer(*args, dropout=dropout)  # checks the layer's arguments
        _activation_named_in_snapshot(self)
        decoder_layer = TransformerDecoderLayer(*args, dropout=dropout)
        # both stacks (and the containing model's tables) together, before either stack is built
        stacks = [(name, what, count, sum(math.prod(shape) for shape in layer.parameter_shapes().values()))
                  for name, what, count, layer in (("num_encoder_layers", "the encoder's layers", num_encoder_layers,
                                                    encoder_layer),
                                                   ("num_decoder_layers", "the decoder's layers", num_decoder_layers,
                                                    decoder_layer))]
        containing = getattr(_CONTAINING_TABLES, "tables", ())  # see _within
        check_tables_allocatable([*stacks, *containing], self.dtype, "the weights together")
        # and what each copy costs beyond its weights
        around = sum(int(rows) * int(cols) for _, _, rows, cols in containing) * np.dtype(self.dtype).itemsize
        _check_layer_copies([("num_encoder_layers", num_encoder_layers, encoder_layer),
                             ("num_decoder_layers", num_decoder_layers, decoder_layer)], around)
        FixedSetting.set(self, d_model=d_model, nhead=nhead)
        self.encoder = TransformerEncoder(encoder_layer, num_encoder_layers,
                                          LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=self.dtype))
        self.decoder = TransformerDecoder(decoder_layer, num_decoder_layers,
                                          LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=self.dtype))
        # the stacks hold copies of one layer each (torch's TransformerEncoder/Decoder); torch's
        # nn.Transformer then draws every weight matrix again (_reset_parameters): each layer its own
        for layer in (*self.encoder.layers, *self.decoder.layers):
            layer._init_weights()

    def _children(self):  # a child set to None or deleted is left out (Module._registered_children)
        return [(name, getattr(self, name, None)) for name in ("encoder", "decoder")]

    @classmethod
    def _within(cls, tables, **kwargs) -> "Transformer":
        """``cls(**kwargs)`` inside a larger model whose own weight ``tables`` (in
        ``check_tables_allocatable``'s form: Seq2SeqTransformer's embeddings) count in the memory
        check of the stacks, before either stack is built."""
        _CONTAINING_TABLES.tables = tuple(tables)
        try:
            return cls(**kwargs)
        finally:
            _CONTAINING_TABLES.tables = ()

    @staticmethod
    def generate_square_subsequent_mask(sz: int, dtype=np.float32) -> np.ndarray:
        """The causal float mask of ``sz`` positions, as torch's
        ``nn.Transformer.generate_square_subsequent_mask``: ``(sz, sz)`` of ``dtype``, 0 on and below
        the diagonal (key j visible to query i iff j <= i), -inf above; for ``tgt_mask`` (where
        ``tgt_is_causal=True`` does the same without the array).

        Raises:
            TypeError: ``sz`` not an int; ``dtype`` not float32/float64.
            ValueError: ``sz`` negative, or too large to allocate.
        """
        sz = check_int(sz, "sz", 0)
        dtype = resolve_dtype(dtype)
        check_allocatable((sz, sz), np.dtype(dtype).itemsize, "sz")  # the result is the only allocation
        mask = np.zeros((sz, sz), dtype)
        for i in range(sz - 1):  # row by row: no full-size temporary (np.triu's would be 1.25x more)
            mask[i, i + 1:] = -np.inf
        return mask

    def forward(self, src, tgt, *, src_mask=None, tgt_mask=None, memory_mask=None, src_key_mask=None,
                tgt_key_mask=None, memory_key_mask=None, src_is_causal: bool = False, tgt_is_causal: bool = False,
                memory_is_causal: bool = False, path: str = "auto", src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None) -> np.ndarray:
        """Encodes ``src (N, S, E)`` and decodes ``tgt (N, T, E)`` over it -> ``(N, T, E)``; or,
        unbatched as torch's, ``src (S, E)`` and ``tgt (T, E)`` -> ``(T, E)`` (key masks ``(S,)``,
        ``(T,)``, 3-D masks ``(nhead, ·, ·)``).

        Masks as in the layers, keyword-only: ``src_mask (S, S)``, ``tgt_mask (T, T)`` (or
        ``tgt_is_causal=True``), ``memory_mask (T, S)`` (or ``(N·nhead, ·, ·)``, or 4-D
        broadcastable to ``(N, nhead, ·, ·)``) float, added, as torch's (a bool one raises
        ``TypeError``, see the module doc); ``src_key_mask (N, S)``, ``tgt_key_mask (N, T)``,
        ``memory_key_mask (N, S)`` bool, True = a real token. torch's ``src_key_padding_mask``,
        ``tgt_key_padding_mask`` and ``memory_key_padding_mask`` (True = padding) are refused with a
        ``TypeError`` naming the replacement (``src_key_mask=~src_key_padding_mask``, ...).

        Raises:
            ValueError: batch or feature sizes that disagree, src and tgt not both batched or both
                unbatched; masks of the wrong shape (all checked before src and tgt are converted);
                a ``src`` or ``tgt`` of more rows (``N · S``, ``N · T``) than the feed-forward's
                hidden activations, ``rows × dim_feedforward`` values, can hold in this machine's
                memory (naming it, before the encoder runs).
            TypeError: non-numeric input, a mask of the wrong dtype, a bool ``src_mask``/``tgt_mask``/
                ``memory_mask``, a torch ``*_key_padding_mask``; a stack's layer replaced by another
                module since (naming ``encoder.layers[i]`` / ``decoder.layers[i]``).
        """
        for name, value in (("src_key_padding_mask", src_key_padding_mask),
                            ("tgt_key_padding_mask", tgt_key_padding_mask),
                            ("memory_key_padding_mask", memory_key_padding_mask)):
            _refuse_padding_mask(value, name, name.replace("_padding", ""))
        src_arr = unconverted(src, "src", 2)  # both converted once every shape is checked
        tgt_arr = unconverted(tgt, "tgt", 2)
        unbatched = _is_unbatched(src_arr, "src", "S, E")
        _is_unbatched(tgt_arr, "tgt", "T, E")
        if tgt_arr.ndim != src_arr.ndim:
            raise ValueError(f"tgt: expected {'(T, E)' if unbatched else '(N, T, E)'} as src is "
                             f"{'unbatched' if unbatched else 'batched'} {src_arr.shape}, got shape {tgt_arr.shape}")
        if not unbatched and src_arr.shape[0] != tgt_arr.shape[0]:
            raise ValueError(f"tgt: expected batch size {src_arr.shape[0]} (src's), got shape {tgt_arr.shape}")
        if src_arr.shape[-1] != self.d_model or tgt_arr.shape[-1] != self.d_model:
            raise ValueError(f"src, tgt: expected last dim {self.d_model} (d_model), got {src_arr.shape}, {tgt_arr.shape}")
        # Every argument, the decoder's too, before the encoder runs: a refusal then changes nothing
        # (no training state kept by the encoder alone, no dropout seed drawn).
        N = 1 if unbatched else src_arr.shape[0]
        S, T = src_arr.shape[-2], tgt_arr.shape[-2]
        self.encoder._check_layers("encoder.")  # a layer replaced by another module: refused before any runs
        self.decoder._check_layers("decoder.")
        # both stacks' feed-forward activations, before the masks and the encoder's O(S²) work
        _check_feedforward_activations(N * S, self.encoder.layers[0].dim_feedforward, self.dtype, "src",
                                       src_arr.shape)
        _check_feedforward_activations(N * T, self.decoder.layers[0].dim_feedforward, self.dtype, "tgt",
                                       tgt_arr.shape)
        check_bool(src_is_causal, "src_is_causal")
        check_bool(tgt_is_causal, "tgt_is_causal")
        check_bool(memory_is_causal, "memory_is_causal")
        key_masks = {"src_key_mask": (src_key_mask, S, "S"), "tgt_key_mask": (tgt_key_mask, T, "T"),
                     "memory_key_mask": (memory_key_mask, S, "S")}
        if unbatched:
            what = f"src {src_arr.shape} (S, E) and tgt {tgt_arr.shape} (T, E)"
            key_masks = {name: (_unbatched_key_mask(m, name, n, dim, what), n, dim)
                         for name, (m, n, dim) in key_masks.items()}
        for mask, key_name, mask_name, L, Sk in ((src_mask, "src_key_mask", "src_mask", S, S),
                                                 (tgt_mask, "tgt_key_mask", "tgt_mask", T, T),
                                                 (memory_mask, "memory_key_mask", "memory_mask", T, S)):
            _layer_masks(mask, key_masks[key_name][0], N, self.nhead, L, Sk, self.dtype, mask_name=mask_name,
                         key_mask_name=key_name)
        src_arr, tgt_arr = as_float(src_arr, "src", self.dtype), as_float(tgt_arr, "tgt", self.dtype)
        try:
            memory = self.encoder(src_arr, mask=src_mask, src_key_mask=src_key_mask, is_causal=src_is_causal,
                                  path=path)
            out = self.decoder(tgt_arr, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                               tgt_key_mask=tgt_key_mask, memory_key_mask=memory_key_mask,
                               tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal, path=path)
        except BaseException:
            if self.training:  # nothing half-kept: a backward now raises instead of mixing two forwards
                self._drop_training_state()
            raise
        if self.training:
            self._saved = True  # the mark of a whole forward (the stacks' layers keep the rest)
        return out

    def backward(self, grad_output) -> tuple[np.ndarray, np.ndarray]:
        """``grad_output (N, T, E)`` -> ``(grad_src (N, S, E), grad_tgt (N, T, E))`` of the last
        training forward: the decoder's backward, then the encoder's from the memory's gradient
        (after an unbatched forward: ``(T, E)`` -> ``((S, E), (T, E))``).

        Raises:
            NoTrainingStateError, WeightsChangedError, ValueError: as
                :meth:`TransformerEncoder.backward`; every module of the encoder and the decoder is
                checked before any of them adds a gradient.
        """
        self._check_backward_ready()
        grad_tgt, grad_memory = self.decoder.backward(grad_output)  # checks grad_output first
        self._saved = None  # consumed
        return self.encoder.backward(grad_memory), grad_tgt
