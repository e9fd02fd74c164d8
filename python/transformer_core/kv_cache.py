"""The KV cache of a decoder, shared by every causal LM. It follows Hugging Face transformers'
``DynamicCache`` (its per-layer ``(keys, values)`` legacy format, ``crop``); the tutorials mention the
KV cache only for its memory, in the overview tutorial's GQA/MQA section."""

from __future__ import annotations

import functools
import os
import threading
import warnings

import numpy as np

from ._runtime import variant
from ._validation import (
    _is_torch_tensor,
    as_float,
    check_allocatable,
    check_int,
    compute_dtype,
    resolve_dtype,
    to_numpy,
)
from .module import renamed_keyword

__all__ = ["KVCache"]

# A cache held by a call (KVCache._hold), as another call meets it; the C++ cache says the same
# during its own part of the call (layers/kv_cache.hpp).
_IN_USE_BY = "in use by another call (a cache holds one sequence of calls at a time; give each thread its own)"
# Guards every cache's holder (check and set as one step). A fork while another thread holds it
# leaves it held in the child, where no thread would release it: the child makes a new one.
_HOLDERS = threading.Lock()


def _new_holders_lock() -> None:
    global _HOLDERS
    _HOLDERS = threading.Lock()


os.register_at_fork(after_in_child=_new_holders_lock)


class KVCache:
    """Keys and values of past positions, per layer, for incremental decoding.

    Storage per layer (in C++): keys and values ``(N, H_kv, capacity, D)``; ``length`` positions are
    filled. Each forward step appends its L new positions; when full, the capacity doubles (at least
    to what is needed) and the contents are copied once, so decoding T tokens copies O(T) in all.
    Memory: ``2 · num_layers · N · H_kv · capacity · D`` values of ``dtype`` of address space —
    grouped-query attention (H_kv < H) shrinks it by H / H_kv — of which only the positions written
    are resident: the storage is zeros the operating system commits page by page as they are
    written, so a capacity reserved for a long generation that stops early costs address space, not
    memory. The model updates the cache in place.

    A cache holds one sequence of calls at a time: while a forward of one thread runs on it,
    another thread's forward, ``crop``, ``reserve`` or read of it is a ValueError (give each thread
    its own cache).

    Args:
        num_layers: layers of the model (>= 0).
        batch: N, sequences decoded together (>= 1).
        num_key_value_heads: H_kv, key/value heads per layer (>= 1; Hugging Face's name).
            ``num_kv_heads=``, its former name, is still taken for one release, with a
            ``DeprecationWarning``.
        head_dim: D (>= 1).
        capacity: positions to reserve up front (e.g. prompt + max_new_tokens); 0 = one.
        dtype: ``np.float32`` or ``np.float64`` (the model's).
        key_order: None when the keys hold each head's D dims in Hugging Face's order; else the
            index ``p`` (a permutation of ``range(D)``) with ``hf_keys = keys[..., p]``: a Llama of
            ``rope_layout="interleaved"`` (a GGUF model) rotates adjacent pairs, so its keys hold
            llama.cpp's order. :meth:`to_legacy` and :meth:`from_legacy` convert with it.

    Raises:
        TypeError: non-int sizes, a non-integer ``key_order``, a ``dtype`` other than float32 or
        float64 (None is float32, torch's default dtype). ValueError: sizes out of range, a
        ``key_order`` that is not a permutation of ``range(head_dim)``, or storage larger than this
        machine's memory (checked before anything is allocated).
    """

    @renamed_keyword("num_kv_heads", "num_key_value_heads")
    def __init__(self, num_layers: int, batch: int, num_key_value_heads: int, head_dim: int, capacity: int = 0,
                 dtype=np.float32, *, key_order=None):
        self.dtype = resolve_dtype(dtype)
        sizes = [check_int(num_layers, "num_layers", 0), check_int(batch, "batch", 1),
                 check_int(num_key_value_heads, "num_key_value_heads", 1), check_int(head_dim, "head_dim", 1),
                 max(check_int(capacity, "capacity", 0), 1)]
        self.key_order = _check_key_order(key_order, sizes[3])
        # keys and values of every layer, checked here to name this constructor's arguments (the C++
        # check, which follows, names its own); one layer's at least, which the C++ cache sizes even
        # with no layers
        check_allocatable([2, max(sizes[0], 1)] + sizes[1:], np.dtype(self.dtype).itemsize,
                          "num_layers, batch, num_key_value_heads, head_dim, capacity")
        self._impl = variant("KVCache", self.dtype)(*sizes)
        # nn.MultiheadAttention layers sharing this cache fill it layer by layer at each step: the
        # layer expected next, and the positions the step appends
        self._next_layer, self._step_length = 0, 0
        # (process id, thread id) of the call that holds the cache (_hold), or None
        self._holder = None

    def _hold(self) -> None:
        """Holds the cache for one call of this thread, from its checks to the end of its C++ call
        (the outermost call of the thread ends the hold, inline: see :func:`holder_id`). Meanwhile
        another thread's call on the cache, or its ``crop``, ``reserve`` or read of a layer, is a
        ValueError: it would change what this call checked (the length its masks were built for) or
        read what it writes. The C++ cache refuses the same during the C++ call itself, and refuses a length
        changed since the checks. A hold by a thread of the parent process at a fork does not count
        in the child.

        Raises:
            ValueError: another thread's call holds the cache.
        """
        me = holder_id()
        with _HOLDERS:
            if self._held_by_other(me):
                raise ValueError(f"past_key_values: this KVCache is {_IN_USE_BY}")
            self._holder = me

    def _held_by_other(self, me: tuple) -> bool:
        holder = self._holder
        return holder is not None and holder[0] == me[0] and holder != me

    def _require_idle(self) -> None:
        """ValueError while another thread's call holds the cache (see :meth:`_hold`)."""
        if self._held_by_other(holder_id()):
            raise ValueError(f"KVCache: {_IN_USE_BY}")

    @property
    def length(self) -> int:
        """Positions cached (the past length)."""
        return self._impl.length

    @property
    def capacity(self) -> int:
        """Positions the storage holds before it grows."""
        return self._impl.capacity

    @property
    def batch(self) -> int:
        """N, the sequences the cache holds."""
        return self._impl.batch

    @property
    def num_key_value_heads(self) -> int:
        """H_kv, key/value heads per layer."""
        return self._impl.num_kv_heads

    @property
    def num_kv_heads(self) -> int:
        """Deprecated: ``num_key_value_heads`` (a ``DeprecationWarning``; removed in the next release)."""
        warnings.warn("KVCache.num_kv_heads is deprecated, use num_key_value_heads (Hugging Face's name)",
                      DeprecationWarning, stacklevel=2)
        return self.num_key_value_heads

    @property
    def head_dim(self) -> int:
        """D, the width of one head."""
        return self._impl.head_dim

    def __len__(self) -> int:
        return self._impl.num_layers

    def __getitem__(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """``(keys, values)`` of one layer, copies of shape ``(N, H_kv, length, D)``, the keys in the
        model's order of each head's dims (see ``key_order``); ``layer`` may be negative, counted
        from the end, as a list's.

        Raises:
            TypeError: ``layer`` not an int. IndexError: out of ``[-len(self), len(self))``, either side.
            ValueError: a call in another thread holds the cache (it may be writing this layer).
        """
        layer = check_int(layer, "layer", None, None)
        self._require_idle()
        if not -len(self) <= layer < len(self):
            raise IndexError(f"layer: expected an index in [{-len(self)}, {len(self)}), got {layer}")
        return self._impl.get(layer % len(self))

    def to_legacy(self) -> tuple:
        """Hugging Face's legacy format: a tuple of ``(keys, values)`` per layer, each ``(N, H_kv,
        length, D)``, the keys in Hugging Face's order of each head's dims (``key_order`` applied).

        Raises:
            ValueError: a call in another thread holds the cache (it may be writing it).
        """
        layers = (self[i] for i in range(len(self)))
        if self.key_order is None:
            return tuple(layers)
        return tuple((np.ascontiguousarray(k[..., self.key_order]), v) for k, v in layers)

    def crop(self, length: int) -> None:
        """Cuts the cache back (its capacity stays).

        * ``length >= 0``: keeps the first ``length`` positions, forgetting every one from
          ``length`` on (``length <= self.length``): transformers 4.x's ``crop(max_length)``.
        * ``length < 0``: removes the last ``-length`` positions (``-length <= self.length``):
          transformers 5's ``crop(tokens_to_remove)``, and 4.x's negative ``max_length``, which
          mean the same.

        So a negative argument means here what it means in both transformers versions, and a
        positive one what it means in 4.x (transformers 5 refuses a positive one). ``crop(0)``
        differs from transformers 5's: here it keeps 0 positions, **emptying the cache**; there it
        removes 0 positions, a no-op (as ``crop(self.length)`` is here).

        Raises:
            TypeError: ``length`` not an int. ValueError: ``length`` outside ``[-self.length,
            self.length]`` (more positions to keep or to remove than the cache holds); a call in
            another thread holds the cache.
        """
        length = check_int(length, "length", None, None)
        self._require_idle()
        held = self.length
        if not -held <= length <= held:
            raise ValueError(f"length: expected an int in [{-held}, {held}] (>= 0: the positions kept; < 0: minus the "
                             f"positions removed; the cache holds {held}), got {length}")
        self._impl.crop(length if length >= 0 else held + length)
        self._next_layer = 0  # a step cut short starts over

    def reserve(self, total: int) -> None:
        """Grows the storage to hold ``total`` positions (no-op if it already does).

        Raises:
            TypeError: non-int. ValueError: more than this machine's memory; a call in another
            thread holds the cache.
        """
        total = check_int(total, "total", 0)
        self._require_idle()
        self._impl.reserve(total)

    @classmethod
    @renamed_keyword("num_kv_heads", "num_key_value_heads")
    def from_legacy(cls, past, num_key_value_heads: int, head_dim: int, dtype=np.float32, *,
                    key_order=None) -> "KVCache":
        """A cache holding per-layer ``(keys, values)`` arrays ``(N, H_kv, S, D)`` (numpy arrays or
        torch tensors, converted to ``dtype``; copied: ``past`` is not changed), the keys in Hugging
        Face's order; ``key_order``: the cache's own (see the class), the keys stored reordered.
        ``num_key_value_heads`` is H_kv (``num_kv_heads=``, its former name, still taken for one
        release, with a ``DeprecationWarning``).

        Raises:
            TypeError: ``past`` not a tuple or list (e.g. None, a KVCache, a Hugging Face
                ``DynamicCache``; the message names ``past_key_values``, Hugging Face's name for it);
                arrays that are not real numbers (bool, complex, ...); a ``dtype`` other than
                float32 or float64 (None is float32, torch's default dtype); non-int sizes, a
                non-integer ``key_order``.
            ValueError: ``num_key_value_heads`` or ``head_dim`` < 1, no pairs, arrays of inconsistent
                shapes or of batch 0, a bad ``key_order``; arrays whose copies and cache would
                exceed this machine's memory. Every pair's shape and the memory are checked before
                any layer is copied.
        """
        dtype = resolve_dtype(dtype)
        num_key_value_heads = check_int(num_key_value_heads, "num_key_value_heads", 1)
        head_dim = check_int(head_dim, "head_dim", 1)
        key_order = _check_key_order(key_order, head_dim)
        if not isinstance(past, (list, tuple)):
            raise TypeError(f"past_key_values: expected Hugging Face's legacy tuple or list of (keys, values) pairs "
                            f"per layer, got {type(past).__name__}")
        if not past:
            raise ValueError("past_key_values: expected one (keys, values) pair per layer, got none")
        # first every pair's shape and dtype, from views (a torch tensor's own shape: a bfloat16 or
        # GPU tensor is copied when converted), the copies and the cache checked against memory
        # from layer 0's; then the copies: a bad pair anywhere is refused before any is made
        held, shape = [], None
        for i, pair in enumerate(past):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                got = (f"a {type(pair).__name__} of {len(pair)}" if isinstance(pair, (list, tuple))
                       else type(pair).__name__)
                raise ValueError(f"past_key_values[{i}]: expected a (keys, values) pair, got {got}")
            k, v = _uncopied(pair[0], f"past_key_values[{i}][0]"), _uncopied(pair[1], f"past_key_values[{i}][1]")
            k_shape, v_shape = _shape_of(k, f"past_key_values[{i}][0]"), _shape_of(v, f"past_key_values[{i}][1]")
            if k_shape != v_shape or k_shape[1] != num_key_value_heads or k_shape[3] != head_dim:
                raise ValueError(f"past_key_values[{i}]: expected keys and values of shape (N, {num_key_value_heads}, "
                                 f"S, {head_dim}), got {k_shape} and {v_shape}")
            if k_shape[0] < 1:
                raise ValueError(f"past_key_values[{i}]: expected keys and values of batch N >= 1, got shape {k_shape}")
            if shape is None:  # every layer must have layer 0's shape: the copies (keys and values) and
                shape = k_shape  # the cache (keys and values) are known now, checked before the other layers
                check_allocatable((4, len(past)) + shape, np.dtype(dtype).itemsize,
                                  "past_key_values (its copy and the cache)")
            elif k_shape != shape:
                raise ValueError(f"past_key_values[{i}]: shape {k_shape} differs from layer 0's {shape}")
            held.append((k, v))
        pairs = [tuple(as_float(x, f"past_key_values[{i}][{j}]", dtype, allow_empty=True) for j, x in enumerate(kv))
                 for i, kv in enumerate(held)]  # S = 0 (nothing cached yet) is a cache too
        if key_order is not None:  # hf_keys = keys[..., p]  <=>  keys = hf_keys[..., argsort(p)]
            back = np.argsort(key_order)
            pairs = [(np.ascontiguousarray(k[..., back]), v) for k, v in pairs]
        cache = cls(len(pairs), shape[0], num_key_value_heads, head_dim, shape[2], dtype, key_order=key_order)
        cache._impl.load(pairs)
        return cache

    def __repr__(self) -> str:
        return (f"KVCache(num_layers={len(self)}, batch={self.batch}, num_key_value_heads={self.num_key_value_heads}, "
                f"head_dim={self.head_dim}, length={self.length}, capacity={self.capacity}"
                f"{'' if self.key_order is None else ', key_order=<llama.cpp>'})")


def holder_id() -> tuple[int, int]:
    """``(process id, thread id)`` of the calling thread, as :meth:`KVCache._hold` records it.

    A caller ends its outermost hold inline, without a call (a KeyboardInterrupt is raised at a
    call's entry, and one raised there would leave the cache held by this thread for good)::

        me = holder_id()
        outermost = cache._holder != me
        try:
            cache._hold()
            ...
        finally:
            if outermost and cache._holder == me:
                cache._holder = None
    """
    return os.getpid(), threading.get_ident()


def holding_cache(forward):
    """Decorates a forward whose keyword ``past_key_values`` may be a :class:`KVCache`: the call
    holds it (:meth:`KVCache._hold`) from its first check to its end."""

    @functools.wraps(forward)
    def held(self, *args, **kwargs):
        """``forward(self, *args, **kwargs)`` with its ``past_key_values`` held (replaced by
        ``forward``'s own docstring through ``functools.wraps``). Raises what ``forward`` raises,
        and ValueError when another thread's call holds the cache."""
        cache = kwargs.get("past_key_values")
        if not isinstance(cache, KVCache):
            return forward(self, *args, **kwargs)
        me = holder_id()
        outermost = cache._holder != me
        try:
            cache._hold()
            return forward(self, *args, **kwargs)
        finally:  # inline, no call: see holder_id
            if outermost and cache._holder == me:
                cache._holder = None

    return held


def _uncopied(x, name: str):
    """One legacy cache array as it can be read without a copy: a torch tensor as is (its
    conversion may copy: a bfloat16 tensor is widened, a GPU tensor moved), anything else as
    :func:`to_numpy` gives it (a numpy array as is, a view of an ndarray subclass, a list's array),
    its dtype checked (TypeError: not real numbers)."""
    if _is_torch_tensor(x):
        kind = str(x.dtype).removeprefix("torch.")
        if x.dtype.is_complex or kind == "bool":  # refused now, as compute_dtype refuses numpy's, before any copy
            raise TypeError(f"{name}: expected a real numeric array, got dtype {kind}")
        return x
    arr = to_numpy(x, name)
    compute_dtype(arr, name)
    return arr


def _shape_of(x, name: str) -> tuple:
    """The shape of a legacy cache array (see :func:`_uncopied`); ValueError naming ``name`` unless 4-D."""
    shape = tuple(int(d) for d in x.shape)
    if len(shape) != 4:
        raise ValueError(f"{name}: expected a 4-D array, got {len(shape)}-D with shape {shape}")
    return shape


def _check_key_order(key_order, head_dim: int):
    """``key_order`` as a read-only int64 array, checked to be a permutation of ``range(head_dim)``
    (None stays None)."""
    if key_order is None:
        return None
    p = np.asarray(key_order)
    if p.dtype.kind not in "iu":
        raise TypeError(f"key_order: expected integers (a permutation of range({head_dim})), got dtype {p.dtype}")
    if p.shape != (head_dim,):
        raise ValueError(f"key_order: expected a permutation of range({head_dim}), shape ({head_dim},), got an "
                         f"array of shape {p.shape}")
    # right shape: say which indices break it (head_dim values at most: small)
    counts = np.bincount(p[(p >= 0) & (p < head_dim)].astype(np.int64), minlength=head_dim)
    problems = []
    outside = p[(p < 0) | (p >= head_dim)]
    if outside.size:
        problems.append(f"{_some(np.unique(outside))} outside range({head_dim})")
    if (counts > 1).any():
        problems.append(f"{_some(np.flatnonzero(counts > 1))} repeated")
    if (counts == 0).any():
        problems.append(f"{_some(np.flatnonzero(counts == 0))} missing")
    if problems:
        raise ValueError(f"key_order: expected a permutation of range({head_dim}), got {'; '.join(problems)}")
    p = p.astype(np.int64)
    p.flags.writeable = False
    return p


def _some(values: np.ndarray, count: int = 8) -> str:
    """The first ``count`` of ``values`` as a list, "..." after them when there are more."""
    shown = ", ".join(str(int(v)) for v in values[:count])
    return f"[{shown}{', ...' if len(values) > count else ''}]"
