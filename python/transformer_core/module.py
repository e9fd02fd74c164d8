"""``Module``: the Python face of a C++ layer or model that owns its weights.

A module's weights live in C++ (``self._impl``) under the names torch and Hugging Face give them in
a ``state_dict``. ``load_state_dict`` checks every name and shape first and only then copies, so a
refused load leaves the module unchanged.

A model whose checkpoint names or layouts differ from the C++ registry maps them with three hooks:
``_public_name`` (C++ name -> checkpoint name), ``_transposed`` (checkpoint names stored as the
transpose of the C++ weight, e.g. GPT-2's Conv1D ``(in, out)`` weights over ``nn.Linear``'s
``(out, in)``) and ``_row_permutation`` (checkpoint names whose rows the C++ weight holds in another
order, e.g. the q/k rows of a Llama model of ``rope_layout="interleaved"``). ``state_dict``,
``load_state_dict``, ``gradients`` and the optimizer moments of ``training.save_checkpoint`` all
speak the checkpoint's layout.

The modules under a module are its built-in children (a stack's layers and norm) and, as torch
registers them, the modules the caller assigns to its attributes (``model.head = nn.Linear(8, 3)``):
``state_dict``, ``named_parameters``, ``train()``/``eval()``, ``zero_grad`` and the copies reach them
(``Module._registered_children``). torch's ``named_modules``, ``modules``, ``named_children``,
``children`` and ``apply`` walk that tree, which is coarser than torch's: a layer is one C++ object,
with no modules under it (its weights keep torch's names, ``self_attn.out_proj.weight``), and a
stack's layers are its children ``layers.0``, ``layers.1``, ... (no ``ModuleList``). Modules have no
buffers (``buffers()`` is empty) and every weight trains (``requires_grad_(False)`` is refused);
``parameters()`` and ``named_parameters()`` return lists, not torch's iterators.

Training follows torch's habits where it can, with an explicit backward since there is no autograd
(llm.c's layout: one forward and one backward per layer, both in C++):

* ``model.train()`` / ``model.eval()``: in training mode a forward keeps what its backward needs
  (in C++); ``eval()`` frees it and forwards keep nothing. **A module starts in eval mode**
  (``training`` is False), unlike torch's, which start in training mode: a layer built with
  ``dropout=0.1`` applies no dropout and keeps nothing for a backward until ``train()`` is called
  (and a torch training loop ported here needs its ``model.train()``, which torch lets one forget).
* ``layer.backward(grad_output)`` returns the gradient of the input(s) and ADDS every parameter's
  gradient into its buffer, which lives in C++ beside the parameter; gradients accumulate over
  backward calls until ``zero_grad()``. Each training forward has one backward (a second one, or
  one without a training forward, raises :class:`NoTrainingStateError`), with the weights it ran
  with: once an optimizer ``step()``, ``load_state_dict`` or in-place quantizing wrote any weight of
  the module, its backward raises :class:`WeightsChangedError` and the forward must run again
  (stricter than torch's "modified by an inplace operation", which concerns only the tensors the
  backward reads: see that class); ``zero_grad()`` in between is fine (it writes gradients only).
  A composite module's backward (a stack, ``Transformer``) checks every module under it before
  any of them adds a gradient: a refused backward adds none. A module at two places in it
  (``enc.layers[1] = enc.layers[0]``) is refused there: its forward kept the last place's state only.
  Values assigned into ``p.data`` through the numpy views are not detected (numpy keeps no version).
* ``named_parameters()`` / ``parameters()``: :class:`~transformer_core.parameter.Parameter` objects
  whose ``data`` and ``grad`` are zero-copy numpy views of the C++ buffers, named as ``state_dict()``
  (``grad`` is None until a backward wrote it since the last ``zero_grad()``; a module at two places
  once, under its first names, as torch's), for the optimizers of
  :mod:`transformer_core.optim`. Being views, they have the C++ layout; where it is not the
  checkpoint's the parameter says so (``transposed``, ``row_permutation``) and maps an array of its
  layout to the checkpoint's and back (``to_checkpoint_layout`` / ``from_checkpoint_layout``).
  ``gradients()`` copies the written ones in the checkpoint's layout.
* Dropout (training forwards only) draws its masks from seeds: :func:`manual_seed` seeds the
  package's generator, as ``torch.manual_seed`` does. A module's constructor draws its initial
  weights' seed from it (so the same seed and the same constructions give the same weights, and
  each layer of ``nn.Transformer`` its own; a ``TransformerEncoder`` holds equal copies of its
  layer, as torch's), and ``generate`` and ``stream`` draw their sampling seed from it
  when called with ``seed=None``, once it was seeded (before that, from fresh entropy:
  :func:`sampling_seed`).

Quantized weights (:func:`transformer_core.quantize`, GGUF blocks from
``LlamaForCausalLM.from_pretrained``): ``state_dict`` returns them dequantized to float32 (the values
the kernels multiply by), :meth:`Module.weight_formats` says how each is stored, and
``load_state_dict`` refuses a module that holds any (load into a float model, then quantize it).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import os
import pickle
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import NamedTuple

import numpy as np

from ._runtime import dtype_suffix
from ._validation import _is_torch_tensor, as_weight, check_bool, resolve_dtype, to_numpy
from .hub import LazyTensor, StoredTensor
from .parameter import Parameter, freezing_refused

__all__ = [
    "Module",
    "FixedSetting",
    "fixed_setting_refusal",
    "NoTrainingStateError",
    "WeightsChangedError",
    "NonFiniteLossError",
    "manual_seed",
    "get_rng_state",
    "set_rng_state",
    "next_seed",
    "sampling_seed",
    "skip_weight_init",
    "check_dropout",
    "renamed_keyword",
    "weights_written",
    "storage_changed",
    "TIED_HEAD_COPY",
    "deferred_interrupts",
]

_SEEDS = np.random.default_rng(0)
#: Whether the program seeded the generator (:func:`manual_seed`, :func:`set_rng_state`): until it
#: does, sampling without a seed draws fresh entropy (:func:`sampling_seed`), as torch's default
#: generator starts from a random seed in every process.
_SEEDED = False


def manual_seed(seed: int) -> None:
    """Seeds the generator that a module's constructor draws its initial weights' seed from, that
    the training forwards draw their dropout seeds from, and that ``generate`` and ``stream`` draw
    their sampling seed from when called with ``seed=None`` (torch's ``manual_seed``, which seeds
    all three): the same seed and the same calls give the same initial weights, dropout masks and
    sampled tokens, on any machine and thread count (the masks are Philox4x32-10 of the seed and
    the element's index, see ``functional.dropout``; the weights and the tokens numpy's
    generators': none is torch's). Until it is called (or :func:`set_rng_state`), the generator
    starts from seed 0 in every process, so initial weights and dropout masks repeat from run to
    run, while sampling draws fresh entropy (:func:`sampling_seed`), as torch's default generator
    starts from a random seed.

    ``seed`` in torch's range, ``[-2**63, 2**64 - 1]``; a negative one is mapped as torch maps it,
    to ``seed + 2**64`` (what ``torch.initial_seed()`` then returns).

    Raises:
        TypeError: ``seed`` not an int. ValueError: ``seed`` outside ``[-2**63, 2**64 - 1]``.
    """
    global _SEEDS, _SEEDED
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
    seed = int(seed)
    if not -2**63 <= seed <= 2**64 - 1:
        raise ValueError(f"seed: expected an int in [-2**63, 2**64 - 1] (torch's range), got {seed}")
    if seed < 0:
        seed += 2**64
    _SEEDS = np.random.default_rng(seed)
    _SEEDED = True


def get_rng_state() -> dict:
    """The state of the generator of :func:`manual_seed` (torch's ``get_rng_state``): a dict of
    plain ints and strs (JSON-ready), which :func:`set_rng_state` restores; ``save_checkpoint``
    stores it, so a resumed run draws the dropout seeds the uninterrupted one would."""
    return dict(_SEEDS.bit_generator.state)


def set_rng_state(state: dict) -> None:
    """Restores a state of :func:`get_rng_state`.

    Raises:
        TypeError: ``state`` not a dict. ValueError: not a state of this generator (PCG64).
    """
    global _SEEDS, _SEEDED
    _SEEDS = np.random.Generator(_pcg64_of(state, "state"))
    _SEEDED = True


def _pcg64_of(state, name: str) -> np.random.PCG64:
    """A PCG64 bit generator in ``state`` (a dict of :func:`get_rng_state`), checked: its numbers
    are ints in range (numpy would truncate a float, and raise OverflowError for a negative).

    Raises:
        TypeError: ``state`` not a dict. ValueError: not a PCG64 state (naming ``name``).
    """
    if not isinstance(state, dict):
        raise TypeError(f"{name}: expected a dict from get_rng_state(), got {type(state).__name__}")
    inner = state.get("state")
    numbers = [*(inner.values() if isinstance(inner, dict) else [None]), state.get("has_uint32"), state.get("uinteger")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**128 for v in numbers):
        raise ValueError(f"{name}: expected a state from get_rng_state() (PCG64: 'state' and 'inc' ints in "
                         f"[0, 2**128), 'has_uint32' and 'uinteger' ints), got {state!r}")
    generator = np.random.PCG64()
    try:
        generator.state = state
    except (TypeError, ValueError, KeyError, OverflowError) as e:
        raise ValueError(f"{name}: expected a state from get_rng_state() (PCG64), got one that numpy refuses "
                         f"({type(e).__name__}: {e})") from None
    return generator


def next_seed() -> int:
    """The next seed of the package's generator (see :func:`manual_seed`): a new module's initial
    weights' seed, a training forward's dropout seed, or the sampling seed of ``generate`` /
    ``stream`` called with ``seed=None``; an int in ``[0, 2**63 - 1)``."""
    return int(_SEEDS.integers(0, 2**63 - 1))


def sampling_seed() -> int:
    """The sampling seed of ``generate`` / ``stream`` called with ``seed=None``: :func:`next_seed`
    once the program has seeded the generator (:func:`manual_seed` or :func:`set_rng_state`), so
    that the same seed gives the same tokens, as after ``torch.manual_seed``; before that, fresh OS
    entropy on every call (the generator is not advanced), as torch's default generator starts from
    a random seed in each process: two runs of a program sample different tokens."""
    if _SEEDED:
        return next_seed()
    return int(np.random.SeedSequence().entropy % (2**63 - 1))


def renamed_keyword(old: str, new: str, whose: str = "Hugging Face's"):
    """A decorator for a function (or constructor) whose keyword argument ``new`` was called ``old``:
    ``old=`` is still taken, for one release, as ``new=``, with a ``DeprecationWarning`` naming the
    new name and ``whose`` name it is ("Hugging Face's", "torch's"). A module built with ``old=``
    keeps ``new=`` in the arguments its copies are built from (``_init_args``), so a copy warns no
    second time.

    Raises (the decorated call):
        TypeError: both ``old=`` and ``new=`` given.
    """
    def decorate(function):
        """``function`` wrapped: its ``old=`` keyword taken as ``new=`` (see renamed_keyword)."""
        @functools.wraps(function)
        def renaming(*args, **kwargs):
            """``function(*args, **kwargs)`` with ``old=`` renamed ``new=``, warning once per call;
            TypeError when both are given."""
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{old}: the former name of {new}; got both, pass {new}= only")
                warnings.warn(f"{old}= is deprecated, use {new}= ({whose} name); {old}= will be removed in "
                              f"the next release", DeprecationWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
                if args and isinstance(args[0], Module):  # a constructor: the copies' arguments, renamed
                    args[0]._init_args = _snapshot_args(args[1:], kwargs)
            return function(*args, **kwargs)
        return renaming
    return decorate


def check_dropout(p, name: str = "dropout") -> float:
    """A dropout probability in [0, 1); TypeError for a non-number, ValueError otherwise."""
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a probability (float), got {type(p).__name__}")
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name}: expected a probability in [0, 1), got {p}")
    return p


class NoTrainingStateError(RuntimeError):
    """``backward`` without a training forward to differentiate: the module is in eval mode, no
    forward (or loss) ran in training mode since the last backward, or it was already consumed."""


class WeightsChangedError(NoTrainingStateError):
    """``backward`` after the weights its training forward ran with were written (an optimizer
    ``step()``, ``load_state_dict``, quantizing in place): the forward's activations belong to the
    old weights, so the gradient would mix two models. The training state is dropped (of the whole
    module the backward was called on: a composite module's backward adds no gradient then): run the
    forward (or loss) again, then backward.

    Stricter than torch's "modified by an inplace operation": torch refuses only when a tensor that
    the backward reads was modified, while here a write to ANY weight of a C++ module since the
    forward counts, even one its backward does not read (an optimizer step over the biases only,
    say, between a ``Linear``'s forward and backward: torch's backward runs, this one raises). The
    library records one write version per C++ module (a layer, a whole model), not per tensor.

    Writes the library cannot see are not detected: values assigned into a parameter's ``data``
    (``p.data[...] = x``, ``np.copyto``, ``+=``) through the numpy views (numpy keeps no version
    count); don't write weights between a training forward and its backward."""


class NonFiniteLossError(ValueError):
    """A loss came out NaN or ±inf. Nothing was kept for a backward and no gradient was touched.

    Attributes:
        loss: the non-finite value.
    """

    def __init__(self, message: str, loss: float):
        super().__init__(message)
        self.loss = loss


# ---- weight versions: a backward refuses weights written since its training forward ------------------
#: How many times the library wrote weights (optimizer steps, load_state_dict, in-place quantizing).
_WRITES = [0]
#: impl (a C++ module) -> the value of ``_WRITES`` at the last write of its weights (absent: never).
_LAST_WRITE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def weights_written(impls) -> None:
    """Records that the library wrote the weights of the C++ modules ``impls`` (an optimizer step,
    ``load_state_dict``, quantizing in place): a training forward of any of them that has not had
    its backward yet can no longer have it (:class:`WeightsChangedError`), whichever of its weights
    were written (the version is per C++ module, not per weight). Gradient writes (``zero_grad``,
    ``grad = ...``) do not count: they change no weight."""
    _WRITES[0] += 1
    for impl in impls:
        _LAST_WRITE[impl] = _WRITES[0]


class _Kept(NamedTuple):
    """What a training forward kept for its backward (``Module._saved``) and ``_WRITES`` then."""
    value: object
    writes: int


def _to_checkpoint(value: np.ndarray, transposed: bool, row_permutation) -> np.ndarray:
    """``value`` (the C++ layout of a weight) in the checkpoint's layout: transposed, then its rows
    taken in the checkpoint's order (``checkpoint_rows = rows[row_permutation]``); a new
    C-contiguous array (or ``value`` itself when both are identities)."""
    if transposed:
        value = np.ascontiguousarray(value.T)
    if row_permutation is not None:
        value = np.ascontiguousarray(value[row_permutation])
    return value


def _written_in_checkpoint_layout(value: np.ndarray, transposed: bool, row_permutation):
    """``value`` (the C++ layout of a weight, or of a moment of it) in the checkpoint's layout as
    :func:`~transformer_core.hub.save_safetensors` takes it, copying nothing yet: ``value`` itself,
    its transposed view (not C-contiguous: the writer copies it when its turn comes), or, for rows
    taken in another order (no view gives them), a :class:`~transformer_core.hub.LazyTensor` that
    makes :func:`_to_checkpoint`'s copy then."""
    if row_permutation is None:
        return value.T if transposed else value
    shape = value.shape[::-1] if transposed else value.shape
    return LazyTensor(shape, value.dtype, functools.partial(_to_checkpoint, value, transposed, row_permutation))


def _from_checkpoint(value: np.ndarray, transposed: bool, row_permutation) -> np.ndarray:
    """The inverse of :func:`_to_checkpoint`: ``value`` (the checkpoint's layout) in the C++ layout."""
    if row_permutation is not None:
        value = np.ascontiguousarray(value[np.argsort(row_permutation)])
    if transposed:
        value = np.ascontiguousarray(value.T)
    return value


class _LaidOutParameter(Parameter):
    """A :class:`Parameter` whose ``data`` (and ``grad``) may have another layout than the
    checkpoint's: ``transposed`` and ``row_permutation`` say which (see :class:`_BoundParameter`,
    the model's parameters, which are views of C++ buffers). A deep copy or a pickle of a model's
    parameter whose layout is not the checkpoint's is one of these, holding copies of its values in
    the same layout (:meth:`_BoundParameter._detached`), so that it still says its layout and
    ``load_state_dict`` maps it to the checkpoint's: restoring such a snapshot changes nothing.

    Args:
        data, name, grad: as :class:`Parameter`'s.
        transposed: the checkpoint stores the weight as the transpose of ``data``.
        row_permutation: None, or the int64 index ``p`` with ``checkpoint_rows = data[p]`` (after
            any transpose).

    Raises:
        TypeError, ValueError: as :class:`Parameter`.
    """

    __slots__ = ("transposed", "row_permutation")

    def __init__(self, data, name: str | None = None, grad=None, transposed: bool = False, row_permutation=None):
        self.transposed = transposed
        self.row_permutation = row_permutation
        super().__init__(data, name, grad)

    def __reduce_ex__(self, protocol):
        """Copies and pickles: a :class:`_LaidOutParameter` of ``data``, ``name``, ``grad`` and the
        layout (over the same arrays for ``copy.copy``, copies of them for ``copy.deepcopy`` and pickle)."""
        return _LaidOutParameter, (self._data, self.name, self._grad, self.transposed, self.row_permutation)

    @property
    def checkpoint_layout(self) -> bool:
        """Whether ``data`` and ``grad`` already have the checkpoint's layout (no transpose, no row
        permutation)."""
        return not self.transposed and self.row_permutation is None

    def to_checkpoint_layout(self, value) -> np.ndarray:
        """``value`` (an array of ``data``'s shape, in its layout: ``data``, ``grad``, a moment) in
        the checkpoint's layout, as ``state_dict()[name]`` has it: a C-contiguous copy (``value``
        itself when the layouts are the same).

        Raises:
            ValueError: ``value`` not of ``data``'s shape.
        """
        value = np.asarray(value)
        if value.shape != self.data.shape:
            raise ValueError(f"value: expected the shape of {self.name!r}, {self.data.shape}, got {value.shape}")
        return _to_checkpoint(value, self.transposed, self.row_permutation)

    def from_checkpoint_layout(self, value) -> np.ndarray:
        """The inverse of :meth:`to_checkpoint_layout`: ``value`` (the checkpoint's layout and shape)
        in ``data``'s layout, a C-contiguous copy (``value`` itself when the layouts are the same).

        Raises:
            ValueError: ``value`` not of the checkpoint's shape.
        """
        value = np.asarray(value)
        shape = self.data.shape[::-1] if self.transposed else self.data.shape
        if value.shape != shape:
            raise ValueError(f"value: expected the checkpoint shape of {self.name!r}, {shape}, got {value.shape}")
        return _from_checkpoint(value, self.transposed, self.row_permutation)


class _BoundParameter(_LaidOutParameter):
    """A :class:`Parameter` whose ``data`` and ``grad`` are zero-copy views of a C++ module's
    buffers: ``grad`` is None until a backward wrote the gradient (since the last ``zero_grad``).

    Being views, ``data`` and ``grad`` have the C++ layout (the optimizers update them in place),
    which two attributes relate to the checkpoint's (``state_dict``, ``gradients``):

    * ``transposed``: the checkpoint stores this weight as the transpose of ``data`` (GPT-2's Conv1D
      weights): ``data`` and ``grad`` have the C++ ``(out, in)`` layout;
    * ``row_permutation``: None, or an int64 index ``p`` of ``data.shape[0]`` rows with
      ``checkpoint_rows = data[p]`` (the q/k projections of a Llama model of
      ``rope_layout="interleaved"``, which holds each head's rows interleaved).

    :meth:`to_checkpoint_layout` / :meth:`from_checkpoint_layout` apply them (to ``data``, ``grad``,
    an optimizer moment).

    Equality is the weight's: two of these are equal (``==``, and hash alike) when they view the same
    weight of the same C++ module, whatever their ``name``. A module's parameters and its child's are
    different objects, since the name is the level's (``n.fc1.parameters()[0].name`` is ``"weight"``,
    ``n.parameters()[0].name`` is ``"fc1.weight"``: the optimizers key their state by it), but they
    compare equal, so torch's idioms by membership work across levels::

        frozen = set(n.fc1.parameters())
        trained = [p for p in n.parameters() if p not in frozen]   # fc2's only
    """

    __slots__ = ("_impl", "_core_name")

    def __eq__(self, other) -> bool:
        """Whether ``other`` views the same weight (the same C++ module and weight there); any
        other object is compared as Python compares objects by default (by identity)."""
        if isinstance(other, _BoundParameter):
            return self._impl is other._impl and self._core_name == other._core_name
        return NotImplemented

    def __hash__(self) -> int:
        """The weight's: equal parameters (:meth:`__eq__`) hash alike (the C++ module, held by the
        parameter, keeps its id while the parameter lives)."""
        return hash((id(self._impl), self._core_name))

    def __init__(self, impl, core_name: str, name: str, transposed: bool, row_permutation=None):
        self._impl = impl
        self._core_name = core_name
        try:
            view = impl.parameter_view(core_name)
        except ValueError as e:  # held quantized: named by its place in the model, not in its C++ module
            message = str(e)
            raise ValueError(f"{name}: {message.removeprefix(core_name + ': ')}") from None
        super().__init__(view, name, None, transposed, row_permutation)

    def __copy__(self) -> "_BoundParameter":
        """A shallow copy, as torch's ``copy.copy(param)``: a Parameter over the same C++ buffers (a
        write through either reaches the model)."""
        return _BoundParameter(self._impl, self._core_name, self.name, self.transposed, self.row_permutation)

    def __deepcopy__(self, memo: dict) -> Parameter:
        """As torch's ``copy.deepcopy(param)``. Copied in the same call as its model, after it
        (``copy.deepcopy((model, model.named_parameters()))``): the copy model's parameter, a
        Parameter over the copy's C++ buffers (the memo maps this one's C++ module to the copy's,
        see :func:`_copy_into`). Otherwise an independent Parameter (:meth:`_detached`): a copy of
        ``data`` (in its layout, the C++ one) and the name; writes to it do not reach the model.
        Unlike torch's, which drops ``.grad``, a copy of ``grad`` too (None when it reads None), as
        this library's module copies keep their gradients."""
        copied_impl = memo.get(id(self._impl))
        if copied_impl is not None:
            return _BoundParameter(copied_impl, self._core_name, self.name, self.transposed, self.row_permutation)
        return self._detached()

    def _detached(self) -> Parameter:
        """A Parameter holding copies of ``data`` and ``grad`` (None when it reads None), in this
        one's layout: a plain :class:`Parameter` where that is the checkpoint's, else a
        :class:`_LaidOutParameter` that keeps ``transposed`` and ``row_permutation`` (so that
        ``load_state_dict`` of a snapshot maps its values back to the checkpoint's layout)."""
        grad = self.grad
        data = np.array(self.data, copy=True)
        grad = None if grad is None else np.array(grad, copy=True)
        if self.checkpoint_layout:
            return Parameter(data, self.name, grad)
        permutation = None if self.row_permutation is None else np.array(self.row_permutation, copy=True)
        return _LaidOutParameter(data, self.name, grad, self.transposed, permutation)

    def __reduce_ex__(self, protocol):
        """Pickling: the Parameter of :meth:`_detached` (copies of ``data`` and ``grad``, the layout
        kept where it is not the checkpoint's; the C++ buffers themselves cannot be pickled)."""
        return self._detached().__reduce_ex__(protocol)

    @property
    def grad(self):
        """A zero-copy view of the C++ gradient buffer (the parameter's shape and dtype), or None when no
        backward wrote it since the last ``zero_grad()`` (or since ``grad = None`` cleared it)."""
        if not _grad_readable(self._impl, self._core_name):
            return None
        return self._impl.gradient_view(self._core_name)

    @grad.setter
    def grad(self, value) -> None:
        """Copies ``value`` (a numpy array of the parameter's shape and dtype, any strides or byte
        order) into the C++ gradient buffer and marks it written; ``None`` clears it (as torch's
        ``p.grad = None``): the buffer is zeroed in place and marked unwritten, so ``grad`` reads
        None and the next backward writes a fresh gradient instead of adding to the old one. (An
        array read from ``grad`` before is a view of that buffer: it reads zeros afterwards.)

        A weight stored as rows of a larger matrix (Llama's q/k/v and gate/up) behaves as a parameter
        of its own, as torch's separate ones: setting or clearing its ``grad`` changes only its rows,
        and leaves what its siblings' ``grad`` read as it was (see :func:`_clear_grad_rows`).

        Raises:
            TypeError / ValueError: ``value`` of another type, dtype or shape (nothing changes).
        """
        if value is None:
            self._clear_grad()
            return
        if not isinstance(value, np.ndarray):
            raise TypeError(f"grad: expected a numpy array or None, got {type(value).__name__}")
        if value.dtype.kind != "f" or value.dtype.newbyteorder("=") != self.data.dtype:
            raise TypeError(f"grad: expected dtype {self.data.dtype} (the parameter's), got {value.dtype}")
        if value.shape != self.data.shape:
            raise ValueError(f"grad: expected shape {self.data.shape} (the parameter's), got {value.shape}")
        self._impl.gradient_view(self._core_name)[...] = value  # copied: any strides, byte order, read-only
        _mark_grad_rows_written(self._impl, self._core_name)

    def _clear_grad(self) -> None:
        """Zeroes this parameter's gradient and marks it unwritten (``grad`` reads None until the next
        backward, which then writes a fresh gradient); a sibling slice of the same packed buffer keeps
        its gradient (see :func:`_clear_grad_rows`)."""
        _clear_grad_rows(self._impl, self._core_name)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch: ``set_to_none=True`` clears the gradient (``grad`` reads None until the next
        backward, as ``p.grad = None``); ``set_to_none=False`` fills a written gradient with zeros in
        place and keeps it (``grad`` reads a zero array, which an optimizer step still uses: momentum
        and weight decay move the weights), and leaves an unwritten one None. Either way only this
        parameter's rows of a packed buffer change.

        Raises:
            TypeError: ``set_to_none`` not a bool.
        """
        if check_bool(set_to_none, "set_to_none"):
            self._clear_grad()
        elif _grad_readable(self._impl, self._core_name):
            self._impl.gradient_view(self._core_name).fill(0)


# ---- gradients of the slices of a packed buffer -----------------------------------------------------
# The C++ core keeps one gradient buffer and one ``written`` flag per stored matrix: the row slices of
# a packed weight (Llama's q/k/v and gate/up, GatedFeedForward's gate/up) share them. torch has one
# parameter per slice, each with its own ``grad``; so that clearing (or setting) one slice leaves its
# siblings as they were, the slices' own state lives here while they differ:
#
# * while every slice holds a gradient, or none does, the core flag says it for all (no record);
# * otherwise the core flag is unwritten and ``_PARTIAL[impl][group]`` records the slices that hold a
#   gradient (their rows keep it); the others' rows are zero. A backward adds into the whole buffer
#   and sets the core flag: from then on every slice holds a gradient, the cleared ones exactly the
#   new one (they were zero), the others theirs plus the new one, as torch's would; the record is
#   dropped the next time it is looked at.
#
# A flag that is unwritten over a buffer that is not all zeros is safe: the backwards add into the
# gradient buffers of the slices (only the LM head's, never a slice, copies into an unwritten one).

#: impl -> {core_name: _GradGroup or None (a buffer of one parameter, or of aliases of it)}.
_GROUPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: impl -> {_GradGroup.key: set of the ranges (units) that hold a gradient}; only while the core flag
#: of that buffer is unwritten.
_PARTIAL: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _GradGroup(NamedTuple):
    key: frozenset        # the core names sharing the buffer
    unit: dict            # core name -> its range (start address, bytes): aliases share one
    units: frozenset      # every range


def _grad_group(impl, core_name: str):
    """The slices sharing the gradient buffer of ``core_name`` (a :class:`_GradGroup`), or None when
    that buffer holds one parameter only (possibly under several names). Found once per name by
    flipping its core flag and seeing which flags follow (the flag is the buffer's), then restored."""
    cache = _GROUPS.setdefault(impl, {})
    if core_name in cache:
        return cache[core_name]
    names = [n for n, _ in impl.parameter_shapes()]
    before = {n: impl.gradient_written(n) for n in names}
    impl.set_gradient_written(core_name, not before[core_name])
    try:
        members = [n for n in names if impl.gradient_written(n) != before[n]]
    finally:
        impl.set_gradient_written(core_name, before[core_name])
    unit = {}
    for n in members:
        view = impl.gradient_view(n)
        unit[n] = (view.__array_interface__["data"][0], view.nbytes)
    ranges = sorted(set(unit.values()))
    disjoint = all(a[0] + a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))
    group = _GradGroup(frozenset(members), unit, frozenset(ranges)) if len(ranges) > 1 and disjoint else None
    for n in members:
        cache[n] = group
    return group


def _kept_units(impl, group: _GradGroup, name: str) -> set:
    """The ranges of ``group`` that hold a gradient now (every one once a backward set the core flag:
    the record of the group is then dropped)."""
    records = _PARTIAL.get(impl)
    if impl.gradient_written(name):
        if records:
            records.pop(group.key, None)
        return set(group.units)
    return set(records.get(group.key, ())) if records else set()


def _grad_readable(impl, core_name: str) -> bool:
    """Whether the gradient of ``core_name`` holds a gradient (its ``grad`` is not None)."""
    records = _PARTIAL.get(impl)
    if not records:  # no packed buffer of this module is partly cleared: the core flag says it
        return impl.gradient_written(core_name)
    group = _grad_group(impl, core_name)
    if group is None:
        return impl.gradient_written(core_name)
    return group.unit[core_name] in _kept_units(impl, group, core_name)


def _set_record(impl, group: _GradGroup, core_name: str, kept: set) -> None:
    """Stores which ranges of ``group`` hold a gradient: the core flag written when all do (no
    record), unwritten with a record otherwise (an empty one: none, the buffer all zeros)."""
    records = _PARTIAL.setdefault(impl, {})
    if kept == group.units or not kept:
        records.pop(group.key, None)
        impl.set_gradient_written(core_name, bool(kept))
    else:
        records[group.key] = frozenset(kept)
        impl.set_gradient_written(core_name, False)


def _clear_grad_rows(impl, core_name: str) -> None:
    """Clears the gradient of ``core_name`` as torch's ``p.grad = None``: its rows are zeroed and its
    ``grad`` reads None until the next backward; the other slices of a packed buffer keep theirs."""
    group = _grad_group(impl, core_name) if impl.gradient_written(core_name) or _PARTIAL.get(impl) else None
    if group is None:
        if impl.gradient_written(core_name):
            impl.clear_gradient(core_name)
        return
    kept = _kept_units(impl, group, core_name)
    if group.unit[core_name] not in kept:
        return  # already cleared: its rows are zero
    impl.gradient_view(core_name).fill(0)
    kept.discard(group.unit[core_name])
    if not kept:
        impl.clear_gradient(core_name)
        _PARTIAL.get(impl, {}).pop(group.key, None)
        return
    _set_record(impl, group, core_name, kept)


def _mark_grad_rows_written(impl, core_name: str) -> None:
    """Marks the gradient of ``core_name`` written (its rows were just set); the other slices of a
    packed buffer read as they did (an unwritten one stays None, its rows zero)."""
    group = _grad_group(impl, core_name)
    if group is None:
        impl.set_gradient_written(core_name, True)
        return
    kept = _kept_units(impl, group, core_name)
    kept.add(group.unit[core_name])
    _set_record(impl, group, core_name, kept)


class _IncompatibleKeys(NamedTuple):
    """What :meth:`Module.load_state_dict` returns (torch's ``_IncompatibleKeys``): the module's
    weights the state dict did not hold, and the state dict's names the module has no weight for."""

    missing_keys: list
    unexpected_keys: list

    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return f"_IncompatibleKeys(missing_keys={self.missing_keys}, unexpected_keys={self.unexpected_keys})"


def _unconverted(value, name: str) -> tuple:
    """``(value, shape)`` of a state-dict value as given, its kind checked and nothing copied: a
    torch tensor as it is (its dtype and shape read from it: a bfloat16 one is not widened, one on
    another device not moved), anything else as :func:`to_numpy` views it (an array as it is, a
    nested list converted once, here). :func:`as_weight` converts the value later, if its shape fits.
    A Parameter that says its layout is not the checkpoint's (a model's, from ``named_parameters()``,
    or a deep copy of one: ``transposed``, ``row_permutation``) as it is, with the checkpoint's shape:
    :func:`_checkpoint_value` maps it later.

    Raises:
        TypeError: not floating-point data (as :func:`as_weight`, naming ``name``), or not an array.
        ValueError: a ragged nested list.
    """
    if isinstance(value, _LaidOutParameter) and not value.checkpoint_layout:
        return value, value.shape[::-1] if value.transposed else value.shape
    if isinstance(value, StoredTensor):  # a float tensor of a file, read only when converted
        return value, value.shape
    if _is_torch_tensor(value):
        if not value.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got {value.dtype}")
        return value, tuple(value.shape)
    arr = to_numpy(value, name)
    if arr.dtype.kind != "f":
        raise TypeError(f"{name}: expected a floating-point array, got dtype {arr.dtype}")
    return arr, arr.shape


def _checkpoint_value(value):
    """A value :func:`_unconverted` passed, in the checkpoint's layout: a Parameter of another layout
    (see there) mapped to it (a copy), a :class:`~transformer_core.hub.StoredTensor` read, anything
    else as it is."""
    if isinstance(value, _LaidOutParameter):
        return value.to_checkpoint_layout(value.data)
    if isinstance(value, StoredTensor):
        return value.read()
    return value


def _converted(slot, name: str, value, dtype) -> np.ndarray:
    """A value :func:`_unconverted` passed for the weight ``name`` at ``slot``, as the C-contiguous
    array of ``dtype`` in the C++ layout that ``set_parameter`` takes (as_weight checks its memory)."""
    arr = as_weight(_checkpoint_value(value), f"state_dict[{name!r}]", dtype)
    return _from_checkpoint(arr, slot.transposed, slot.row_permutation)


class _Slot(NamedTuple):
    impl: object          # the C++ module holding the weight
    core_name: str        # its name there
    shape: tuple          # the checkpoint's shape (transposed for a transposed slot)
    transposed: bool
    row_permutation: np.ndarray | None = None  # checkpoint rows = C++ rows[row_permutation] (after any transpose)


#: Bumped whenever weights change storage in place (quantized): Module.named_parameters then checks
#: its cached Parameters (_still_viewing) and builds them again only if one of its own weights
#: changed, rather than hand out views of a float buffer the model no longer uses.
_storage_epoch = [0]


def _lost_view(p, storage: dict) -> str | None:
    """Why the cached :class:`_BoundParameter` ``p`` no longer views its weight's float buffer: the
    weight's storage format (``"int8"``, a GGUF type name) when it is held quantized, ``"new buffer"``
    when it was given another float buffer; None while it still views it. ``storage``: its C++
    module's ``parameter_storage()``, as a dict (read once per module by the callers)."""
    fmt = storage[p._core_name]
    if fmt not in ("float32", "float64"):
        return fmt
    current = p._impl.parameter_view(p._core_name)
    return None if current.__array_interface__["data"][0] == p.data.__array_interface__["data"][0] else "new buffer"


def _storage_tables(parameters):
    """``(p, storage)`` for each of ``parameters`` (:class:`_BoundParameter` objects), ``storage``
    its C++ module's ``parameter_storage()`` as a dict, read once per module."""
    tables = {}
    for p in parameters:
        key = id(p._impl)
        if key not in tables:
            tables[key] = dict(p._impl.parameter_storage())
        yield p, tables[key]


def _still_viewing(parameters) -> bool:
    """Whether every one of ``parameters`` (cached :class:`_BoundParameter` objects) still views its
    weight's float buffer (none was quantized or given a new buffer since it was made)."""
    return all(_lost_view(p, storage) is None for p, storage in _storage_tables(parameters))


def storage_changed(module) -> None:
    """Called after weights of ``module`` were replaced in place by a quantized format (not after a
    quantized copy is made: nothing that existed changed). Its cached Parameters (and those of every
    module under it) are dropped, so that their float32 buffers go once the caller's last view does."""
    _storage_epoch[0] += 1
    impls = []
    for _, m in _module_tree(module, duplicates=False):
        m.__dict__.pop("_parameters_cache", None)
        if m._impl is not None:
            impls.append(m._impl)
    weights_written(impls)  # rounded to the quantized values: a pending backward's weights are gone


_SKIP_INIT = threading.local()

#: Per thread: ``modules``, the ids of the modules whose weights' names are being read
#: (:meth:`Module._own_weight_names`), so that a name hook reading a missing attribute does not
#: recurse through :meth:`Module.__getattr__`; ``printing``, those whose repr is being written.
_NAMING = threading.local()


@contextlib.contextmanager
def skip_weight_init():
    """Modules built inside this context (on this thread) get no initial weights: no random draw
    (:meth:`Module._init_weights`), and the C++ core leaves their weight matrices uninitialised
    rather than zero-filled, so a matrix that is replaced before it is written (by quantized blocks)
    never takes memory. For loaders that then load or replace EVERY weight."""
    from ._runtime import core

    old = getattr(_SKIP_INIT, "on", False)
    _SKIP_INIT.on = True
    core.defer_weight_init(True)
    try:
        yield
    finally:
        _SKIP_INIT.on = old
        core.defer_weight_init(old)


@contextlib.contextmanager
def deferred_interrupts():
    """Runs the body with a Ctrl-C deferred to its end: state changes that must happen together
    (weights and an optimizer's moments and step count, every weight of a ``load_state_dict``, a
    file's rename and its record for the rollback) are all made, then the interrupt is raised (the
    SIGINT handler that was in place is called: KeyboardInterrupt by default). Python raises a
    KeyboardInterrupt at the first bytecode after a C call returns, so one arriving during the C++
    update landed between the update and its bookkeeping. On another thread than the main one
    (which no SIGINT handler runs on), or with SIGINT ignored, the body runs as it is."""
    import signal

    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if not callable(previous):
        yield
        return
    received = []

    def hold(signum, frame):
        """The SIGINT handler meanwhile: records the signal for the end of the body."""
        received.append((signum, frame))

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            previous(*received[0])


def _init_generator(seed: int | None = None) -> np.random.Generator | None:
    """The generator of a new module's initial weights: seeded by ``seed``, else by the package
    generator's next seed (:func:`next_seed`: :func:`manual_seed` chooses the weights, as
    ``torch.manual_seed``); None inside :func:`skip_weight_init` (nothing drawn)."""
    if getattr(_SKIP_INIT, "on", False):
        return None
    return np.random.default_rng(next_seed() if seed is None else seed)


#: Argument types a snapshot keeps as they are (immutable): most layers are built from these alone.
_IMMUTABLE_ARGS = frozenset({int, float, bool, str, bytes, complex, type, type(None)})


def _is_array(value) -> bool:
    """Whether a constructor argument is an array (numpy arrays, tensors, buffers: a loader's
    weights), which a snapshot keeps by reference: a copy takes its weights from the module's own,
    never from the argument, and a deep copy would duplicate them."""
    return (isinstance(value, (np.ndarray, memoryview)) or hasattr(value, "__dlpack__")
            or hasattr(value, "__array_interface__"))


def _is_module(value) -> bool:
    return isinstance(value, Module)


def _immutable_args(args: tuple, kwargs: dict) -> bool:
    """Whether a constructor's arguments are all immutable (:data:`_IMMUTABLE_ARGS`): nothing to copy."""
    return (all(type(a) in _IMMUTABLE_ARGS for a in args)
            and all(type(v) in _IMMUTABLE_ARGS for v in kwargs.values()))


def _found_in(value, wanted) -> list:
    """The objects in ``value``, itself included, also inside lists, tuples, sets and dicts (each
    object once), for which ``wanted(object)`` holds; those are not looked into."""
    found, stack, seen = [], [value], set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if wanted(v):
            found.append(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
    return found


def _deep_copied(value, memo: dict | None = None):
    """A deep copy of ``value`` (in ``memo``, a ``copy.deepcopy`` call's, where given), or ``value``
    itself where it cannot be deep-copied (a memory-mapped checkpoint, a lock): shared."""
    try:
        return copy.deepcopy(value, memo)
    except (TypeError, pickle.PicklingError, copy.Error):
        return value


class _Recipe:
    """A module given to a constructor (the layer a stack copies its layers from, the stack's norm) as
    the constructor's snapshot keeps it (:func:`_snapshot_args`): what it takes to build it again,
    not the module. That is its class, the arguments it was built with (its own snapshot) and the
    attributes it had then (those a copy takes, :func:`_carried_attributes`, modules left out: the
    constructors read plain values, ``layer.dropout``, ``layer.norm_first``). So a copy or a pickle
    of the module built from it holds no second set of weights (the template's), and what the
    caller does to the given module afterwards (``layer.dropout = 0.5``, quantizing it) changes
    no copy.

    Equal recipes (:meth:`__eq__`) build modules that compute alike; a recipe is never changed once
    made (copies share it)."""

    def __init__(self, module: "Module"):
        self.cls = type(module)
        self.init_args = module._init_args
        self.attributes = {key: _deep_copied(value) for key, value in _carried_attributes(module).items()
                           if not _found_in(value, _is_module)}

    def build(self) -> "Module":
        """A module built again from the recipe (random init skipped: its weights are the caller's to
        give), with the recipe's attributes.

        Raises:
            TypeError: as :func:`_build`.
        """
        module = _build(self.cls, self.init_args)
        _set_attributes(module, {key: _deep_copied(value) for key, value in self.attributes.items()})
        return module

    def __eq__(self, other) -> bool:
        return (type(other) is _Recipe and self.cls is other.cls and _same_value(self.init_args, other.init_args)
                and _same_value(self.attributes, other.attributes))

    __hash__ = None

    def __deepcopy__(self, memo: dict) -> "_Recipe":
        return self  # never changed once made

    def __repr__(self) -> str:
        return f"_Recipe({self.cls.__name__}, init_args={self.init_args!r})"


def _same_value(a, b) -> bool:
    """Whether two values of snapshots (the arguments a module was built with, a recipe's attributes)
    are equal: of the same type and ``==``, containers item by item, arrays element by element (of
    the same dtype and shape); False where ``==`` cannot say (it raises or gives no truth value: an
    array in a config). Two modules are never equal (a snapshot holds :class:`_Recipe` objects)."""
    if a is b:
        return True
    if type(a) is not type(b) or isinstance(a, Module):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    try:
        return bool(a == b)
    except Exception:  # no truth value (a tensor, an array inside a dataclass) or no comparison at all
        return False


def _snapshot_args(args: tuple, kwargs: dict) -> tuple:
    """``(args, kwargs)`` of a constructor as a module keeps them to be built again: deep copies, so
    that a config the caller changes after the module was built (``cfg.rms_norm_eps = 0.5``) does not
    change what a copy is built from (torch's deepcopy copies a module as it is). In the arguments
    (also inside lists, tuples and dicts), arrays are kept by reference (:func:`_is_array`) and
    modules as a :class:`_Recipe`; arguments that cannot be deep-copied are kept as they are (the
    copy then raises, naming them, as it would have)."""
    if _immutable_args(args, kwargs):
        return args, kwargs  # nothing mutable: no copy (the common case, every layer of a stack)
    memo = {id(v): _Recipe(v) if _is_module(v) else v
            for v in _found_in((args, kwargs), lambda v: _is_module(v) or _is_array(v))}
    try:
        return copy.deepcopy((args, kwargs), memo)
    except (TypeError, AttributeError, ValueError, RecursionError, copy.Error, pickle.PicklingError):
        return args, kwargs


def _constructor_args(snapshot: tuple) -> tuple:
    """The arguments to build a module again from its snapshot (``_init_args``): a deep copy (the
    constructor may keep what it is given, the snapshot must stay as it is), the arrays shared, and
    each :class:`_Recipe` built into a module of its own.

    Raises:
        TypeError (and whatever ``copy.deepcopy`` raises): an argument cannot be deep-copied, or a
            recipe cannot be built.
    """
    args, kwargs = snapshot
    if _immutable_args(args, kwargs):
        return snapshot
    memo = {id(v): v.build() if isinstance(v, _Recipe) else v
            for v in _found_in(snapshot, lambda v: isinstance(v, _Recipe) or _is_array(v))}
    return copy.deepcopy(snapshot, memo)


def _build(cls, snapshot: tuple) -> "Module":
    """A module of class ``cls`` built again from ``snapshot`` (the ``_init_args`` of the module
    copied, see :func:`_constructor_args`), random init skipped (its weights are the caller's to
    give).

    Raises:
        TypeError: the arguments cannot be deep-copied, or ``cls`` cannot be built from them.
    """
    how = "copy it through state_dict: build a new one and load_state_dict(module.state_dict())"
    try:
        args, kwargs = _constructor_args(snapshot)
    except (TypeError, AttributeError, ValueError, RecursionError, copy.Error, pickle.PicklingError) as e:
        raise TypeError(f"{cls.__name__}: cannot be copied, its constructor's arguments cannot ({e}); {how}") from None
    try:
        with skip_weight_init():
            return cls(*args, **kwargs)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{cls.__name__}: cannot be copied, building it again from the arguments it was built with "
                        f"failed ({type(e).__name__}: {e}); {how}") from None


#: Held by every call of this package's modules that keeps or consumes a training state (a forward
#: in training mode, ``loss``, ``backward``): such calls run one at a time in the process, each
#: whole. The C++ training state of a module is one per module and its calls release the GIL, so
#: two threads training one model at once read each other's half-written state (wrong losses and
#: gradients, a crash where their shapes differ). Inference (eval mode) takes no lock and runs in
#: parallel. Reentrant: a model's training forward runs its children's. A forked child starts with
#: a new one (the thread holding it in the parent does not exist there).
_TRAINING_CALLS = threading.RLock()


def _new_training_lock() -> None:
    """A forked child's :data:`_TRAINING_CALLS`: free, whatever the parent's threads held."""
    global _TRAINING_CALLS
    _TRAINING_CALLS = threading.RLock()


os.register_at_fork(after_in_child=_new_training_lock)


def _one_training_call_at_a_time(method: Callable, always: bool) -> Callable:
    """``method`` (a package class's ``forward``, ``loss`` or ``backward``) run under
    :data:`_TRAINING_CALLS`: always (``loss``, ``backward``), or in training mode only (``forward``)."""

    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        """``method(self, *args, **kwargs)``, under the lock where it keeps or reads a training state."""
        if not (always or self.training):
            return method(self, *args, **kwargs)
        with _TRAINING_CALLS:
            return method(self, *args, **kwargs)

    locked._one_at_a_time = True
    return locked


class FixedSetting:
    """A layer's setting that its C++ layer was built with (``Linear.in_features``, ``LayerNorm.eps``,
    ``TransformerEncoderLayer.norm_first``, ...), as a read-only attribute of torch's name.

    torch's layers read some of these in their forward (``eps``, ``norm_first``, ``activation``), so
    that assigning one changes what the layer computes, and keep others as labels (``in_features``);
    here the C++ layer was built from them once, and a forward checking its input against a changed
    size, a copy or a stack built from a changed value would disagree with the layer (or read past
    its weights). So the value is set once, by
    the constructor (:meth:`set`, kept in the instance's ``__dict__`` under the same name: copies
    and pickles carry it as any attribute), and assigning or deleting it raises AttributeError
    saying to build a new layer.

    Args:
        default: what the attribute reads while the constructor has not set it; absent: an
            AttributeError then.
        argument: how a new layer gets another value, for the message: absent, the constructor's
            argument of the same name (``"in_features=..."``); else that text
            (``"normalized_shape=..."``, ``"embed_dim and num_heads set it"``).

    Raises (assigning, deleting):
        AttributeError: always (``"<name> is fixed when the layer is built; build a new layer"``).
    """

    _NO_DEFAULT = object()

    def __init__(self, default=_NO_DEFAULT, argument: str | None = None):
        self.default = default
        self.argument = argument
        self.name = None

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, module, owner=None):
        if module is None:
            return self
        try:
            return module.__dict__[self.name]
        except KeyError:
            if self.default is FixedSetting._NO_DEFAULT:
                raise AttributeError(f"{type(module).__name__!r} object has no attribute {self.name!r}") from None
            return self.default

    def __set__(self, module, value) -> None:
        raise fixed_setting_refusal(module, self.name)

    def __delete__(self, module) -> None:
        raise fixed_setting_refusal(module, self.name)

    @staticmethod
    def set(module, **values) -> None:
        """Sets the fixed settings ``values`` (``{name: value}``) of ``module``, being built."""
        module.__dict__.update(values)


def fixed_setting_refusal(module, name: str) -> AttributeError:
    """The AttributeError of assigning (or deleting) ``name``, a setting ``module``'s C++ layer was
    built with (:class:`FixedSetting`)."""
    cls = type(module).__name__
    setting = getattr(type(module), name, None)
    argument = getattr(setting, "argument", None) or f"{name}=..."
    how = f"{cls}(..., {argument})" if argument.endswith("=...") else f"{cls}(...): {argument}"
    return AttributeError(f"{cls}.{name}: {name} is fixed when the layer is built (its C++ layer was built with "
                          f"{name}={getattr(module, name, None)!r}); build a new layer: {how}, "
                          "and load this one's weights into it with load_state_dict(m.state_dict()) where they fit")


class Module:
    """Base class of every layer and model: weights by name, ``state_dict``/``load_state_dict``.

    A module starts in eval mode (``training = False``), unlike torch's (which start in training
    mode): call :meth:`train` before a training forward (see the module doc).

    Subclasses set ``self._impl`` (the C++ object) and ``self.dtype`` (``np.float32`` or
    ``np.float64``) and implement ``forward``; calling the module calls ``forward``. The arguments a
    module was built with are kept (``_init_args``: a snapshot taken when it is built, see
    :func:`_snapshot_args`), so that ``copy.deepcopy``, pickling and :func:`transformer_core.quantize`
    build copies of it that compute as it does, whatever the caller does to its config since.

    The modules under a module are its built-in children (:meth:`_children`: a stack's layers and
    norm, a ``Transformer``'s encoder and decoder) and, as torch registers them, the modules the
    caller assigns to its attributes (``model.head = nn.Linear(8, 3)``): see
    :meth:`_registered_children`.

    Weights as attributes. A module's own weights whose names have no dot read as attributes, as
    torch's: ``lin.weight``, ``lin.bias``, ``mha.in_proj_weight`` are the
    :class:`~transformer_core.parameter.Parameter` objects of ``named_parameters()`` (write the
    values in place: ``lin.weight.data[...] = x``). A weight's name cannot be assigned
    (``lin.weight = Parameter(...)``, ``lin.weight = array``, ``lin.bias = None`` raise
    ValueError): the forward runs the C++ module's own weights, which no other object replaces;
    copy values in (``p.data[...] = x``) or ``load_state_dict`` them. A layer is one C++ object with
    no modules inside: ``layer.linear1`` does not exist (its weights are ``linear1.weight``,
    ``linear1.bias`` in ``named_parameters()`` and ``state_dict()``).

    Parameters as attributes. torch registers a ``Parameter`` assigned to a module's attribute
    (``self.cls_token = nn.Parameter(...)``) as a weight of the module. Here a module's weights are
    those of its C++ layers, so such a Parameter would be in none of ``named_parameters``,
    ``state_dict``, ``load_state_dict``, ``zero_grad``, the optimizers or the copies' weights: the
    assignment raises TypeError instead. Hold such a weight in a layer attached to the module
    (``self.cls_token = nn.Embedding(1, d)``: its ``weight`` is registered everywhere, as
    ``cls_token.weight``; read ``self.cls_token.weight.data``, and give its gradient to
    ``self.cls_token.weight.grad`` in your backward), or keep a plain numpy array (``self.scale =
    np.ones(d)``: copied with the module, in no ``state_dict``) and hand the optimizer a Parameter
    over it yourself.

    ``repr(module)`` is torch-like: the class, the arguments it was built with (by name), and the
    modules under it, indented (see :meth:`extra_repr`).
    """

    _impl = None
    dtype: type = np.float32
    training: bool = False

    def __init_subclass__(cls, **kwargs):
        """This package's module classes: their own ``forward`` (in training mode), ``loss`` and
        ``backward`` run one at a time in the process (:data:`_TRAINING_CALLS`), so training
        from several threads is serialized by call, never interleaved inside one. A caller's
        subclass is left as written: the training states are its package children's, whose calls
        are serialized (and its methods may be anything, run children in threads, be pickled by
        value)."""
        super().__init_subclass__(**kwargs)
        if not cls.__module__.startswith("transformer_core."):
            return
        for name, always in (("forward", False), ("loss", True), ("backward", True)):
            method = cls.__dict__.get(name)
            if inspect.isfunction(method) and not getattr(method, "_one_at_a_time", False):
                setattr(cls, name, _one_training_call_at_a_time(method, always))

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        self._init_args = _snapshot_args(args, kwargs)
        return self

    def __setattr__(self, name: str, value) -> None:
        """Sets an attribute. A module assigned where no module was becomes the last of the modules
        attached (torch's registration order, see :meth:`_registered_children`); one replacing
        another keeps its place, and so does one assigned where a module was set to None since
        (torch keeps such a name in its ``_modules`` with the value None): after ``m.a =
        Linear(...); m.b = Linear(...); m.a = None; m.a = Linear(...)`` the names are ``a.*``
        before ``b.*``, as torch's. The names whose module was set to None are remembered in the
        attribute ``_emptied_children`` (a frozenset, absent while there is none); deleting the
        attribute (``del m.a``) or setting it to anything but None or a module forgets the place.

        Raises:
            ValueError: ``name`` is one of this module's own C++ weights (``lin.weight = ...``,
                ``lin.bias = None``) or a name they live under (``llama.lm_head = nn.Linear(...)``
                where ``lm_head.weight`` is the model's own; ``layer.linear1 = None``): the forward
                runs the C++ module, which would never use the new value, while torch's
                ``state_dict``, ``load_state_dict`` and optimizers would. The message says how to
                set a weight's values (``p.data[...] = x``, ``load_state_dict``). Also a value other
                than None at the name of a weight the module was built without (``bias`` of
                ``nn.Linear(2, 2, bias=False)``, ``weight`` of ``nn.LayerNorm(8,
                elementwise_affine=False)``: it reads None, as torch's), which torch would register
                and use: build the module with it. Nothing is set.
            AttributeError: ``name`` is a setting the C++ layer was built with (``in_features``,
                ``eps``, ``norm_first``, ...: see :class:`FixedSetting`), or ``dtype`` of one of
                this package's modules (or a subclass of one) once its constructor has set it: its
                C++ weights are of that dtype (a subclass may set ``dtype`` before it calls the
                constructor). Nothing is set.
            TypeError: ``value`` is a :class:`~transformer_core.parameter.Parameter` (torch's
                ``self.cls_token = nn.Parameter(...)``): it would be registered nowhere (see the
                class doc). Nothing is set.
        """
        if name == "dtype" and self._dtype_is_fixed():
            raise fixed_setting_refusal(self, name)
        taken = [] if name.startswith("_") else self._weights_under(name, complete=False)
        if taken:
            raise ValueError(self._weight_name_refusal(name, value, taken))
        if value is not None and name in type(self)._optional_weights:
            raise ValueError(self._left_out_weight_refusal(name, value))
        if isinstance(value, Parameter):
            raise TypeError(
                f"{type(self).__name__}.{name}: cannot assign a Parameter to a module's attribute: this library's "
                "weights live in its C++ layers, so it would be in none of named_parameters(), state_dict(), "
                "zero_grad(), the optimizers or the copies (torch registers it). Hold the weight in a layer attached "
                f"to the module instead (e.g. self.{name} = nn.Embedding(1, d): its weight is registered as "
                f"'{name}.weight'; use self.{name}.weight.data, set self.{name}.weight.grad in your backward), or "
                "keep a plain numpy array attribute and give the optimizer a Parameter over it yourself")
        if isinstance(value, Module):
            if not isinstance(self.__dict__.get(name), Module) and name not in self._emptied():
                self.__dict__.pop(name, None)  # a new child: its entry goes last
        if value is None and (isinstance(self.__dict__.get(name), Module) or name in self._emptied()):
            self._set_emptied(self._emptied() | {name})  # the place stays for the next module assigned
        else:
            self._set_emptied(self._emptied() - {name})
        object.__setattr__(self, name, value)

    def _weight_name_refusal(self, name: str, value, taken: list) -> str:
        """The message of :meth:`__setattr__` refusing ``value`` at ``name``, where the module's own
        weights ``taken`` live."""
        what = ("None" if value is None else f"a {type(value).__name__}" if isinstance(value, (Module, Parameter))
                else f"a value of type {type(value).__name__}")
        cls = type(self).__name__
        listed = ", ".join(taken[:3]) + (", ..." if len(taken) > 3 else "")
        kind = "module" if isinstance(value, Module) else "value"
        if taken == [name]:
            how = (f"set the weight's values in place instead: m.{name}.data[...] = x (the Parameter of "
                   f"dict(m.named_parameters())[{name!r}]), or load them with m.load_state_dict(...)")
            if value is None:
                how = "a weight cannot be removed (build the module without it, e.g. bias=False); " + how
        else:
            how = ("load new values into them instead (load_state_dict, or p.data[...] = x over "
                   "named_parameters()), or use another attribute name")
        return (f"{cls}.{name}: cannot assign {what} here: this module's own weights already use the name {name!r} "
                f"({listed}) and its forward would not use the new {kind} (it runs its C++ weights); {how}")

    def _left_out_weight_refusal(self, name: str, value) -> str:
        """The message of :meth:`__setattr__` refusing ``value`` at ``name``, a weight this module
        was built without (one of ``_optional_weights``, which reads None)."""
        what = (f"a {type(value).__name__}" if isinstance(value, (Module, Parameter))
                else f"a value of type {type(value).__name__}")
        cls = type(self).__name__
        head = (f"{cls}.{name}: cannot assign {what} here: this module was built without a {name!r} weight "
                f"({name} reads None) and its forward would not use the new value (it runs its C++ weights); ")
        argument = type(self)._optional_weight_arguments.get(name, "")
        if argument is None:
            return head + f"{cls} cannot have one (not implemented)"
        how = f"{cls}(..., {argument})" if argument else f"{cls} with the constructor argument that gives it"
        return head + (f"build a new {how}, then set its values in place (m.{name}.data[...] = x) or load them "
                       "with m.load_state_dict(...)")

    def _weights_under(self, name: str, complete: bool = True) -> list[str]:
        """The names of this module's own weights that are ``name`` or lie under it (``name.*``),
        in registration order. ``complete=False`` (for :meth:`__setattr__`): none while the
        module is being built and its weights' names cannot be read yet (a name hook reading an
        attribute the constructor sets later)."""
        try:
            names = self._own_weight_names()
        except AttributeError:
            if complete:
                raise
            return []
        return [key for key in names if key == name or key.startswith(name + ".")]

    def _own_weight_names(self) -> list[str]:
        """The names of this module's own C++ weights (the checkpoint's: :meth:`_public_name`), in
        registration order; the cheap part of :meth:`_own_slots` (no shapes, no layouts).

        Raises:
            AttributeError: the name hook reads an attribute that is not set (a module being built);
                also when called again while it runs for this module on this thread, so that a hook
                reading a missing attribute (:meth:`__getattr__`) does not recurse.
        """
        impl = self.__dict__.get("_impl")
        if impl is None:
            return []
        cached = self.__dict__.get("_weight_names")
        if cached is not None and cached[0] == id(impl):
            return list(cached[1])
        busy = _NAMING.__dict__.setdefault("modules", set())
        if id(self) in busy:
            raise AttributeError(f"{type(self).__name__}: its weights' names are being read")
        busy.add(id(self))
        try:
            names = [public for core_name, _ in impl.parameter_shapes()
                     if (public := self._public_name(core_name)) is not None]
        finally:
            busy.discard(id(self))
        if _names_fixed(type(self)):  # the same names for as long as this C++ module lives
            self.__dict__["_weight_names"] = (id(impl), tuple(names))
        return names

    def __getattr__(self, name: str):
        """An attribute not found otherwise (Python calls this only then): one of this module's own
        weights, when ``name`` is its name and has no dot (``lin.weight``, ``lin.bias``,
        ``mha.in_proj_weight``), as torch's: its :class:`~transformer_core.parameter.Parameter`, the
        object ``named_parameters()`` gives (``lin.weight is dict(lin.named_parameters())["weight"]``;
        a zero-copy view of the C++ weight: ``lin.weight.data[...] = x`` writes it).

        Raises:
            AttributeError: no such attribute; where ``name`` is a name weights of this module live
                under (``layer.linear1``: a layer is one C++ object with no modules in it), the
                message names them; the weight is held quantized (no Parameter views it: see
                :meth:`named_parameters`), so that ``hasattr`` gives False.

        A weight the module was built without (``nn.Linear(2, 2, bias=False).bias``) reads None, as
        torch's (the class's ``_optional_weights``).
        """
        cls = type(self)
        if any(name in vars(k) for k in cls.__mro__):  # a property (or descriptor) that raised: Python
            # dropped its error before calling here; run it again for that error, not a generic one (a
            # getter with side effects runs twice, the price of a message that says what is missing)
            return object.__getattribute__(self, name)
        if not name.startswith("_") and id(self) not in _NAMING.__dict__.get("modules", ()):
            under = self._weights_under(name)
            if under == [name]:
                try:  # this weight's Parameter only: another one held quantized does not matter here
                    found = next((p for key, p, _ in self._parameter_places(only={name}) if key == name), None)
                except ValueError as e:  # this one is held quantized: hasattr() gives False
                    raise AttributeError(f"{cls.__name__}.{name}: {e} (state_dict() gives its values)") from None
                if found is not None:
                    return found
            if not under and name in cls._optional_weights:
                return None  # built without it (bias=False, ...): torch's None
            if under:
                listed = ", ".join(map(repr, under[:3])) + (", ..." if len(under) > 3 else "")
                raise AttributeError(
                    f"{cls.__name__!r} object has no attribute {name!r}: it is one C++ module with no module "
                    f"{name!r} in it; the weights named {name}.* ({listed}) are in named_parameters() and "
                    f"state_dict() (e.g. dict(m.named_parameters())[{under[0]!r}])")
        raise AttributeError(f"{cls.__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        """Deletes an attribute; a module's place among the children is gone with it (as torch's
        ``del m.a``: a module assigned to ``a`` again comes last).

        Raises:
            AttributeError: ``name`` is ``dtype`` of one of this package's modules (see
                :meth:`__setattr__`), or an attribute the module does not have.
        """
        if name == "dtype" and self._dtype_is_fixed():
            raise fixed_setting_refusal(self, name)
        object.__delattr__(self, name)
        self._set_emptied(self._emptied() - {name})

    def _dtype_is_fixed(self) -> bool:
        """Whether ``dtype`` was set by one of this package's constructors (:meth:`_fix_dtype`), whose
        C++ weights are built of it (a caller's own ``Module`` subclass keeps its ``dtype`` its own)."""
        return self.__dict__.get("_dtype_fixed", False)

    def _fix_dtype(self, dtype) -> None:
        """Sets ``dtype`` (a numpy float type) as this module's C++ weights are built: read-only from then on."""
        self.dtype = dtype
        self._dtype_fixed = True

    def _emptied(self) -> frozenset:
        """The attribute names whose module was set to None (:meth:`__setattr__`), which keep their place."""
        return self.__dict__.get("_emptied_children", frozenset())

    def _set_emptied(self, names: frozenset) -> None:
        if names:
            self.__dict__["_emptied_children"] = names
        else:
            self.__dict__.pop("_emptied_children", None)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        """torch's hook: what :meth:`__repr__` writes between the parentheses after the class name.
        Here the arguments the module was built with (``_init_args``), by their parameters' names,
        less those equal to the parameter's default, each value short (a number, a string; an array
        as its shape and dtype; a module, a config or another object as its class,
        ``LayerNorm(...)``): ``in_features=4, out_features=8``. A subclass may return its own text."""
        args, kwargs = self.__dict__.get("_init_args", ((), {}))
        try:
            bound = inspect.signature(type(self)).bind(*args, **kwargs)
        except (TypeError, ValueError):  # no signature to read, or the arguments no longer bind
            return ", ".join([_short_repr(a) for a in args] + [f"{k}={_short_repr(v)}" for k, v in kwargs.items()])
        parts = []
        for name, value in bound.arguments.items():
            kind = bound.signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                parts.extend(_short_repr(v) for v in value)
            elif kind is inspect.Parameter.VAR_KEYWORD:
                parts.extend(f"{k}={_short_repr(v)}" for k, v in value.items())
            elif not _same_value(value, bound.signature.parameters[name].default):
                parts.append(f"{name}={_short_repr(value)}")
        return ", ".join(parts)

    def __repr__(self) -> str:
        """torch's layout: the class name, :meth:`extra_repr` in parentheses, then the modules
        under it at every place they are held (a shared one twice), one per line, indented; a run of children at consecutive
        places that print alike is one line, as torch's (``(layers.0-2): 3 x
        TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16)``); a module met again
        under itself (``head.backbone = model``) prints as ``Class(...)`` there::

            Net(
              (fc1): Linear(in_features=4, out_features=8)
              (fc2): Linear(in_features=8, out_features=2)
            )
        """
        printing = _NAMING.__dict__.setdefault("printing", set())
        if id(self) in printing:  # met again under itself (head.backbone = model): not printed again
            return f"{type(self).__name__}(...)"
        printing.add(id(self))
        try:
            extra = self.extra_repr()
            lines = extra.split("\n") if extra else []
            lines += [f"({name}): {text}" for name, text in _grouped_children(self)]
        finally:
            printing.discard(id(self))
        if not lines:
            return f"{type(self).__name__}()"
        if len(lines) == 1 and extra:
            return f"{type(self).__name__}({extra})"
        body = "\n".join("  " + line.replace("\n", "\n  ") for line in lines)
        return f"{type(self).__name__}(\n{body}\n)"

    def forward(self, *args, **kwargs):  # pragma: no cover - every subclass defines it
        """Runs the module; see the subclass."""
        raise NotImplementedError

    # ---- hooks ---------------------------------------------------------------------------------
    def _children(self) -> list[tuple[str, "Module"]]:
        """Composite modules: ``[(prefix, child)]``; a leaf module has none."""
        return []

    def _public_name(self, core_name: str) -> str | None:
        """The checkpoint's name of the C++ weight ``core_name`` (default: the same); None hides a
        weight this module does not use (e.g. the LM head under a base model's hidden states)."""
        return core_name

    #: Whether :meth:`_public_name` depends on the core name alone (not on an attribute that could
    #: change): the names are then read once per C++ module (:meth:`_own_weight_names`), as attribute
    #: assignment and lookup ask for them. Read from the class that defines the ``_public_name`` in
    #: use (:func:`_names_fixed`): a subclass overriding the hook without saying so is read each time.
    _public_name_of_core_name_only = True

    #: Weights a class's constructor can leave out (``bias=False``, ``elementwise_affine=False``):
    #: reading one that was left out gives None, as torch's registered-as-None parameters do.
    _optional_weights: frozenset = frozenset()
    # optional weight -> the constructor argument that gives it (for the message), None: none does
    _optional_weight_arguments: dict = {}

    def _transposed(self, name: str) -> bool:
        """Whether the checkpoint stores weight ``name`` as the transpose of the C++ one."""
        return False

    def _row_permutation(self, name: str) -> np.ndarray | None:
        """For a weight ``name`` (checkpoint name) whose rows the C++ module holds in another order
        than the checkpoint: the int64 index ``p`` with ``checkpoint_rows = cpp_rows[p]`` (default:
        None, the same order)."""
        return None

    def _rename_state_dict(self, state: dict) -> dict:
        """Maps alternative names of a checkpoint onto ours before loading (default: none)."""
        return state

    def _unknown_key_hint(self, name: str) -> str | None:
        """Why the checkpoint name ``name``, which this module has no weight for, does not fit (added to
        ``load_state_dict``'s strict refusal), or None (default: no more to say than "unknown")."""
        return None

    # ---- the registry --------------------------------------------------------------------------
    def _registered_children(self) -> list[tuple[str, "Module"]]:
        """``[(name, child)]``: the built-in children (:meth:`_children`), then each module held by an
        attribute of this one that is not one of them, under the attribute's name, in the order they
        were assigned. As torch registers a module assigned to an attribute: ``model.head =
        nn.Linear(8, 3)`` is in ``state_dict``, ``named_parameters``, ``train()``/``eval()``,
        ``zero_grad`` and the copies; deleting the attribute, or setting it to anything but a
        module, removes it. An attribute referring to a built-in child (``enc.first =
        enc.layers[0]``) adds no second child. A module met again under itself (``head.backbone =
        model`` where ``model.head = head``) is not followed (:func:`_module_tree`). A built-in child
        set to None (``transformer.encoder = None``) is left out, as torch leaves out a None module."""
        children = [(name, child) for name, child in self._children() if child is not None]
        built_in = {id(child) for _, child in children}
        return children + [(name, value) for name, value in vars(self).items()
                           if isinstance(value, Module) and id(value) not in built_in]

    def _own_slots(self) -> dict[str, _Slot]:
        """``{name: _Slot}`` of this module's own C++ weights (``self._impl``'s, not those of the
        modules under it), in registration order."""
        slots = {}
        if self._impl is not None:
            for core_name, shape in self._impl.parameter_shapes():
                name = self._public_name(core_name)
                if name is None:
                    continue
                transposed = self._transposed(name)
                shape = tuple(shape)
                slots[name] = _Slot(self._impl, core_name, shape[::-1] if transposed else shape, transposed,
                                    self._row_permutation(name))
        return slots

    def _slots(self) -> dict[str, _Slot]:
        """``{name: _Slot}`` over this module and every module under it (:func:`_module_tree`), in
        registration order. A module at two places is there under both names, as in torch's
        ``state_dict``.

        Raises:
            ValueError: two different weights would take one name (``__setattr__`` refuses the
                assignments that lead there; this is the guard that no name ever hides a weight).
        """
        slots = {}
        for path, module in _module_tree(self):
            for name, slot in module._own_slots().items():
                key = f"{path}.{name}" if path else name
                earlier = slots.setdefault(key, slot)
                if earlier is not slot and (earlier.impl is not slot.impl or earlier.core_name != slot.core_name):
                    raise ValueError(f"{type(self).__name__}: two different weights are named {key!r} (a module "
                                     "was attached under a name its parent's own weights use); rename the attribute")
        return slots

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """``{name: shape}`` of every weight, in registration order (the checkpoint's names)."""
        return {name: slot.shape for name, slot in self._slots().items()}

    def weight_formats(self) -> dict[str, str]:
        """``{name: storage}`` of every weight: ``"float32"``/``"float64"``, ``"int8"`` (per output
        channel), or a GGUF block type (``"Q8_0"``, ``"Q4_0"``, ``"Q4_1"``; ``"Q8_0+Q4_1"`` when the
        rows of one packed matrix are stored in several), in registration order, the checkpoint's
        names."""
        out = {}
        storage_of = {}
        for name, slot in self._slots().items():
            key = id(slot.impl)
            if key not in storage_of:
                storage_of[key] = dict(slot.impl.parameter_storage())
            out[name] = storage_of[key][slot.core_name]
        return out

    def state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False) -> dict:
        """A copy of every weight as a numpy array of ``self.dtype``, keyed by the checkpoint's names
        (torch's / Hugging Face's), in the checkpoint's layout, in registration order; a module at
        two places is there under both names. Quantized weights are returned dequantized (float32:
        the values the quantized kernels multiply by).

        Torch's keyword arguments:

        * ``destination``: a mutable mapping to add the entries to (and return), else a new dict;
        * ``prefix``: put before every name as it is (torch's: ``prefix="encoder."`` gives
          ``"encoder.weight"``, the caller writes the dot);
        * ``keep_vars=True``: the :class:`~transformer_core.parameter.Parameter` objects of
          :meth:`named_parameters` (zero-copy views of the C++ buffers: writes into their ``data``
          change the module) instead of copies, as torch's gives its Parameters rather than detached
          tensors. Only where every weight has the checkpoint's layout (the views have the C++
          one: a GPT-2 Conv1D weight is stored transposed, a Llama model of
          ``rope_layout="interleaved"`` holds its q/k rows in another order), else refused.

        Raises:
            TypeError: ``destination`` neither None nor a mutable mapping, ``prefix`` not a str,
                ``keep_vars`` not a bool.
            ValueError: ``keep_vars=True`` and some weight is not held in the checkpoint's layout
                (named), or is held quantized (:meth:`named_parameters`); ``destination`` is left
                unchanged.
        """
        if destination is not None and not isinstance(destination, MutableMapping):
            raise TypeError(f"destination: expected None or a mutable mapping (a dict), got {type(destination).__name__}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix: expected a str, got {type(prefix).__name__}")
        keep_vars = check_bool(keep_vars, "keep_vars")
        slots = self._slots()
        if keep_vars:
            relaid = [name for name, slot in slots.items() if slot.transposed or slot.row_permutation is not None]
            if relaid:
                raise ValueError(f"keep_vars=True: {len(relaid)} weights are held in another layout than the "
                                 f"checkpoint's (e.g. {relaid[0]!r}), so their Parameters are not its values; use "
                                 "state_dict() for the checkpoint's values, or named_parameters() (each Parameter "
                                 "says its layout: transposed, row_permutation)")
            values = dict(self.named_parameters(remove_duplicate=False))
        else:
            values = {name: _to_checkpoint(slot.impl.get_parameter(slot.core_name), slot.transposed,
                                           slot.row_permutation) for name, slot in slots.items()}
        out = {} if destination is None else destination
        for name, value in values.items():
            out[prefix + name] = value
        return out

    def _checkpoint_tensors(self) -> dict:
        """:meth:`state_dict`'s names and values, for :func:`~transformer_core.hub.save_safetensors`
        to write one at a time instead of copies of every weight at once: a float weight is a
        zero-copy view of its C++ buffer (:func:`_written_in_checkpoint_layout`), a weight held quantized a
        :class:`~transformer_core.hub.LazyTensor` that dequantizes it (float32) when it is written.
        The views see the weights as they are when they are written: write them before anything
        changes the weights. A subclass whose :meth:`state_dict` adds entries of its own (a
        Seq2SeqTransformer's loaded position table) gets its ``state_dict()``, copies and all."""
        if type(self).state_dict is not Module.state_dict:
            return self.state_dict()
        formats = self.weight_formats()
        out = {}
        for name, slot in self._slots().items():
            if formats[name] in ("float32", "float64"):
                view = slot.impl.parameter_view(slot.core_name)
                out[name] = _written_in_checkpoint_layout(view, slot.transposed, slot.row_permutation)
            else:
                def dequantized(slot=slot):
                    """The weight of ``slot``, held quantized, dequantized to float32 in the checkpoint's
                    layout (``slot.shape``): a new array, made when the writer reaches it."""
                    return _to_checkpoint(slot.impl.get_parameter(slot.core_name), slot.transposed, slot.row_permutation)
                out[name] = LazyTensor(slot.shape, np.dtype(np.float32), dequantized)
        return out

    def load_state_dict(self, state_dict: Mapping, strict: bool = True, assign: bool = False) -> "_IncompatibleKeys":
        """Copies weights from ``state_dict`` (name -> array-like: numpy arrays, torch tensors, or
        anything ``np.asarray`` takes) of any floating-point dtype (float16, bfloat16, float32,
        float64), converted to ``self.dtype``.

        As torch's: ``strict=True`` (the default) requires the keys to be exactly this module's;
        ``strict=False`` loads the weights present and ignores the others, a missing weight keeping
        its value. Either way it returns ``_IncompatibleKeys(missing_keys, unexpected_keys)`` (lists
        of the names, after a subclass's renaming of the checkpoint's alternative names), and a
        present weight of another shape or of no floating-point data is refused before anything
        changes (torch too refuses a mis-shaped one under ``strict=False``). A key that is not a str
        names no weight: it is an unexpected key (refused under ``strict=True``, returned in
        ``unexpected_keys`` under ``strict=False``) and never reaches a model's renaming of the
        checkpoint's names (torch's raises an AttributeError from its string handling instead).

        The Parameters of ``named_parameters()`` load as torch's (``dst.load_state_dict(dict(
        src.named_parameters()))`` makes ``dst`` compute as ``src``), also where their ``data`` has
        another layout than the checkpoint's (a GPT-2 Conv1D weight, transposed; the q/k rows of a
        Llama model of ``rope_layout="interleaved"``): each says its layout (``transposed``,
        ``row_permutation``), and so do their deep copies and pickles, which are mapped to the
        checkpoint's layout (``to_checkpoint_layout``) before loading; restoring such a snapshot
        changes nothing.

        Every value's kind (floating-point) and shape are checked as given, before any is converted:
        a mis-shaped value is never copied (a broadcast ``np.broadcast_to(x, (10**6, 10**6))`` is
        refused as mis-shaped, not by the memory its float32 copy would take), and the values of the
        right shape are converted only once every check passed.

        Unlike torch's ``load_state_dict`` (whose ``copy_`` converts any dtype), a value that is not
        floating-point is refused: an integer or bool tensor under a weight's name means a wrong or
        corrupt checkpoint, not numbers to convert (``.astype(np.float32)`` it if you mean them).

        ``assign``: torch's ``assign=True`` makes the module hold the given tensors themselves
        instead of copying their values into its own. The weights here live in buffers the C++
        module owns, which cannot take over the caller's memory: only ``assign=False`` (copy, the
        default) is supported, ``assign=True`` is refused.

        Raises:
            TypeError: ``state_dict`` is not a mapping, ``strict`` or ``assign`` not a bool, or a
                value is not a floating-point array
                (integer, bool, complex, object and string data are refused, naming the key); the
                module is left unchanged.
            ValueError: listing every mis-shaped name, and (``strict=True``) every missing or unknown
                one; ``assign=True``; a value of the right shape whose conversion fails (a float64
                value beyond float32's range for a float32 module, one whose copy exceeds this
                machine's memory); the module is left unchanged. Also when the module holds
                quantized weights (``weight_formats``): load the state into a float model and
                quantize that.

        A training forward still awaiting its backward can no longer have it once weights were loaded
        (its backward raises :class:`WeightsChangedError`).
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict: expected a mapping of name -> array, got {type(state_dict).__name__}")
        strict = check_bool(strict, "strict")
        if check_bool(assign, "assign"):
            raise ValueError(f"{type(self).__name__}.load_state_dict: assign=True (torch's: the module takes the given "
                             "tensors themselves) is not supported, the weights live in buffers the C++ module owns; "
                             "call it with assign=False (the default): the values are copied")
        slots, given, missing, unknown = self._checked_state_dict(state_dict, strict)
        arrays = {}
        for name, value in given.items():  # every check passed: now the copies (as_weight checks their memory)
            arrays[name] = _converted(slots[name], name, value, self.dtype)
        written = {}
        with deferred_interrupts():  # every weight, or (before the first) none: never half of them
            for name, arr in arrays.items():
                slot = slots[name]
                written[id(slot.impl)] = slot.impl
                slot.impl.set_parameter(slot.core_name, arr)
            weights_written(written.values())  # a pending backward would mix the old activations with these
        return _IncompatibleKeys(missing, unknown)

    def _load_into_new_module(self, state_dict: Mapping) -> None:
        """``load_state_dict(state_dict)`` for a module that no caller holds yet (a ``from_pretrained``'s,
        built for these weights: :func:`~transformer_core.hub.load_weights_into`): the same checks,
        before any weight changes, then each weight converted and set, its copies dropped before the
        next value is read (a :class:`~transformer_core.hub.StoredTensor` is read then), so that the
        peak is the module and one weight, not the module and a copy of every weight. A conversion
        that fails midway (a float64 value beyond float32's range) leaves the module partly loaded,
        which is why only a caller that then drops the module uses this.

        Raises:
            as :meth:`load_state_dict` (``strict=True``).
        """
        slots, given, _, _ = self._checked_state_dict(state_dict, strict=True)
        written = {}
        for name, value in given.items():
            slot = slots[name]
            slot.impl.set_parameter(slot.core_name, _converted(slot, name, value, self.dtype))
            written[id(slot.impl)] = slot.impl
        weights_written(written.values())

    def _checked_state_dict(self, state_dict: Mapping, strict: bool) -> tuple[dict, dict, list, list]:
        """``(slots, given, missing, unknown)`` of :meth:`load_state_dict`'s checks, which raise
        (ValueError, TypeError, as there) before any value is converted: ``slots`` (:meth:`_slots`),
        ``given`` ({name: value as given} of the weights to load), the missing and unknown keys."""
        quantized = _quantized_weights(self)
        if quantized:
            raise ValueError(f"{type(self).__name__}.load_state_dict refused (module unchanged): "
                             f"{_held_quantized(quantized)}; load the state into a float model and quantize it "
                             "(transformer_core.quantize)")
        # a key that is not a str names no weight: an unexpected key, kept from the renaming hooks
        # (string operations on names)
        others = [k for k in state_dict if not isinstance(k, str)]
        state = self._rename_state_dict({k: v for k, v in state_dict.items() if isinstance(k, str)})
        slots = self._slots()
        given, problems, misshaped = {}, [], []
        missing = [k for k in slots if k not in state]
        unknown = [k for k in state if k not in slots] + others
        if missing and strict:
            problems.append(f"missing keys: {missing}")
        if unknown and strict:
            hints = [f"{k}: {hint}" for k in unknown if (hint := self._unknown_key_hint(k)) is not None]
            problems.append(f"unknown keys: {unknown}" + (f" ({'; '.join(hints)})" if hints else ""))
        for name, slot in slots.items():
            if name not in state:
                continue
            value, shape = _unconverted(state[name], f"state_dict[{name!r}]")
            if shape != slot.shape:
                misshaped.append(f"{name}: expected {slot.shape}, got {shape}")
                continue
            given[name] = value
        if misshaped:
            problems.append(f"mis-shaped: {misshaped}")
        if problems:
            raise ValueError(f"{type(self).__name__}.load_state_dict refused (module unchanged): " + "; ".join(problems))
        return slots, given, missing, unknown

    # ---- copies (copy.copy, copy.deepcopy, pickle) -----------------------------------------------
    def __copy__(self) -> "Module":
        """A shallow copy, as torch's: a new Python object over the SAME weights (and gradients) and
        the same child modules (shared objects, as torch's shallow copy shares its submodules).

        What a training forward of this module kept for its backward is not the copy's: the copy has
        no backward pending (its ``backward`` raises :class:`NoTrainingStateError`; the original's
        still runs, once). The children being shared, what each of them kept is the same object's
        state: a child's own ``backward`` (``copy.layers[0].backward``) runs the original's forward's,
        once either way, and a training forward through the copy replaces it (as calling the shared
        children again would)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__.pop("_saved", None)  # the forward was the original's: one backward, through it
        return new

    def __deepcopy__(self, memo: dict) -> "Module":
        """An independent copy (torch's ``copy.deepcopy(module)``) that computes as this one does: a
        module of the same class built again from the arguments this one was built with
        (``_init_args``, a snapshot taken then: a config the caller changed since does not change
        the copy; no random init), given this module's weights, gradients (those that hold one) and
        attributes (its training mode, a loader's ``source``, a config replaced, a dropout
        probability changed since); then the same, recursively, for every module under it
        (:meth:`_registered_children`). A child that the rebuilt module built at the same place
        from equal arguments (same class, :func:`_same_value`) is given the original's weights,
        unless it is already the copy of another place (a constructor's ``self.b = self.a`` that
        the user untied since); any other (replaced since: ``enc.layers[1] = TransformerEncoderLayer(..., norm_first=True)``,
        ``enc.norm = LayerNorm(8, eps=0.5)``; attached by the caller: ``bert.classifier =
        nn.Linear(...)``) is copied from its own arguments in its place. What a training forward
        kept for its backward is not copied: the copy has no backward pending. An attribute that
        cannot be deep-copied (a memory-mapped checkpoint) is shared.

        Gradients: unlike torch's, whose ``Parameter.__deepcopy__`` drops ``.grad`` (a deep-copied
        or unpickled torch module has every ``grad`` None), the copy keeps a copy of each gradient
        a backward wrote (``copy.gradients() == module.gradients()``; the others read None), as this
        library's Parameters do (:class:`~transformer_core.parameter.Parameter`, whose deep copies
        and pickles keep ``grad``): a copy taken between a backward and the optimizer step (gradient
        accumulation, a snapshot) can step as the original would. Call ``copy.zero_grad()`` for
        torch's state. The same holds for pickles (:meth:`__reduce_ex__`).

        Identity within one ``copy.deepcopy`` call (its memo), as torch's: a module at two places
        (``enc.layers[1] = enc.layers[0]``) is copied once, and a reference to a module under this
        one, or to this one, at any depth of the attributes (``enc.groups = {"a": [enc.layers[1]]}``,
        ``enc.meta = {"owner": enc}``, ``head.backbone = enc``), is one to the copy's
        (``copy.groups["a"][0] is copy.layers[1]``), as is one made elsewhere in the same call
        (``a, b = copy.deepcopy((enc, enc.layers[0]))``: ``a.layers[0] is b``, in either order).
        Pickles keep the same identities (:meth:`__reduce_ex__`).

        Raises:
            TypeError: a weight is held quantized (copy the float model and quantize the copy), or
                a module cannot be built again from its arguments: copy it through ``state_dict``
                (build a new one, ``load_state_dict``).
        """
        _check_not_quantized(self)
        return _rebuilt_copy(self, memo)

    def __reduce_ex__(self, protocol):
        """Pickling (``pickle.dumps(module)``): the class, the arguments it was built with, its own
        weights and gradients (unpickling builds the module again from them, as :meth:`__deepcopy__`;
        the gradients a backward wrote are kept, unlike torch's pickles, which drop ``.grad``: see
        :meth:`__deepcopy__`), then, as its state, the modules under it and its attributes. Each
        module under it pickles its own part the same way, as the module at its place (``layers.0``,
        ``head``): unpickled,
        it is the module the rebuilt parent built there when that one was built from equal
        arguments (given the weights), else a module built from its own (a child replaced or
        attached since). So the modules' weights are pickled once each, and none of the layer a
        stack was built from (:class:`_Recipe`); arrays among the constructor's arguments are
        pickled as they are (``BertEmbeddings(config, weights=sd)`` holds ``sd`` too: a second
        copy of those weights).

        The module being in the pickle's memo before its state, an attribute referring back to it
        (``head.backbone = enc``, ``enc.meta = {"owner": enc}``) unpickles as the module rebuilt, as
        torch's; so does one referring to a module under it, at any depth (``enc.groups = {"a":
        [enc.layers[1]]}``: the rebuilt ``layers[1]``, see :class:`_ChildMark`).

        Raises:
            TypeError: as :meth:`__deepcopy__`; also an attribute or argument that cannot be pickled
                (named): save ``state_dict()`` (``save_pretrained``, ``safetensors``) instead.
        """
        place = _pickled_children().get(id(self))
        if place is None:  # not a part of a module being pickled: the whole of it is checked once here
            _check_not_quantized(self)
        payload = {"format": _PICKLE_FORMAT, "init_args": self._init_args, **_own_state(self)}
        attributes = _carried_attributes(self)
        top, path = _pickle_path(self)  # named from the module the pickle started at: "layers.1.bad"
        parts = {f"the constructor's arguments{f' of {path}' if path else ''}": payload["init_args"]}
        parts.update((f"attribute {path + '.' if path else ''}{key}", value) for key, value in attributes.items())
        for what, value in parts.items():
            try:
                _PartPickler(_Discard(), protocol).dump(value)
            except (TypeError, AttributeError, RecursionError, pickle.PicklingError) as e:
                raise TypeError(f"{type(top).__name__}: cannot be pickled, {what} cannot ({e}); save its "
                                "state_dict() instead and load it into a new one") from None
        scope = _PickleScope()
        marked = [item for name, child in self._registered_children()
                  for item in (_ChildMark(scope, _Place(self, name, child)), child)]
        state = (marked + [_ChildMark(scope)], attributes)
        if place is not None:
            return _adopt_child, (place.parent, place.name, type(self), payload), state, None, None, _restore_state
        return _restore_module, (type(self), payload), state, None, None, _restore_state

    # ---- training --------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        """Training mode (``mode=True``): forwards keep what their backward needs, and dropout
        applies. Returns ``self``. A module starts in eval mode (``training`` False), unlike torch's
        (which start in training mode): a training loop calls ``train()`` first.

        Raises:
            TypeError: ``mode`` not a bool.
            ValueError: ``mode`` is True and some weight is held quantized (:meth:`weight_formats`):
                only float weights train (train the float model, then quantize it).
        """
        mode = check_bool(mode, "mode")
        if mode:
            quantized = _quantized_weights(self)
            if quantized:
                raise ValueError(f"train: {_held_quantized(quantized)}; only float weights train: train the float "
                                 "model, then quantize it")
        self._set_training(mode)
        return self

    def _set_training(self, mode: bool) -> None:
        """The mode of this module and of every module under it, attached ones included, as torch's
        (train() checked the weights once, for all of them)."""
        for _, module in _module_tree(self, duplicates=False):
            module.training = mode
            if not mode:
                module._release()

    def eval(self) -> "Module":
        """Eval mode (``train(False)``): frees what training forwards kept; forwards keep nothing."""
        return self.train(False)

    def _release(self) -> None:
        self._saved = None
        if self._impl is not None:
            self._impl.release_activations()

    def _drop_training_state(self) -> None:
        """Drops what the training forwards of this module and of its built-in children (at any
        depth: the modules its forward runs) kept, so that a backward raises
        :class:`NoTrainingStateError` (after a forward refused or failed half-way, whose children
        kept their part: a backward would mix two forwards)."""
        for _, module in _module_tree(self, attached=False, duplicates=False):
            module._release()

    def _impls(self) -> list:
        """The C++ modules of this module and of every module under it (each once)."""
        out, seen = [], set()
        for slot in self._slots().values():
            if id(slot.impl) not in seen:
                seen.add(id(slot.impl))
                out.append(slot.impl)
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Resets every gradient, as torch's ``Module.zero_grad``. The buffers stay (in place: the views
        handed out stay valid) and are zeroed either way; what differs is what ``Parameter.grad``
        reads afterwards:

        * ``set_to_none=True`` (torch's default): every gradient is marked unwritten, ``grad`` reads
          None until the next backward, and an optimizer step skips the parameter;
        * ``set_to_none=False``: a gradient a backward wrote stays written, as a zero array (an
          optimizer step still applies momentum / weight decay to it, as torch's); one that was not
          written stays None.

        Raises:
            TypeError: ``set_to_none`` not a bool (nothing changes).
        """
        if check_bool(set_to_none, "set_to_none"):
            for impl in self._impls():
                impl.zero_grad()
                _PARTIAL.pop(impl, None)
            return
        for impl in self._impls():
            for core_name, _ in impl.parameter_shapes():
                if _grad_readable(impl, core_name):
                    impl.gradient_view(core_name).fill(0)

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> list[tuple[str, Parameter]]:
        """``[(name, Parameter)]`` of every weight, named as :meth:`state_dict`, in registration order;
        a module at two places (``enc.layers[1] = enc.layers[0]``) gives its weights once, under
        their first names (torch's ``remove_duplicate``: an optimizer steps them once), while
        ``state_dict`` has both names. The same Parameter objects on every call while a weight stays
        at its name (a child replaced since, ``enc.norm = LayerNorm(8)``, gives its own). A
        child's own call gives other objects (named at its level: ``"weight"``, not
        ``"fc1.weight"``) that compare equal to these and hash alike (the same weight), so
        membership works across levels as torch's: ``frozen = set(n.fc1.parameters())``, then
        ``[p for p in n.parameters() if p not in frozen]``. A weight whose name has no dot is also
        the module's attribute (``lin.weight``: the object given here). Their
        ``data``/``grad`` are zero-copy views of the C++ buffers, so they have the C++ layout: where
        that is not the checkpoint's, the parameter's ``transposed`` / ``row_permutation`` say how,
        and ``p.to_checkpoint_layout(p.grad)`` gives the checkpoint's (as :meth:`gradients` and
        :meth:`state_dict` do). Hand them to an optimizer::

            opt = tc.optim.AdamW(model.named_parameters(), lr=3e-4)

        Torch's keyword arguments:

        * ``prefix``: put before every name with a dot (``prefix="model"``: ``"model.weight"``), as
          torch's; the Parameters (and their ``name``) are the same objects as without it;
        * ``recurse=False``: only this module's own weights, those of its C++ object. Torch's gives
          the parameters registered on the module itself, not those of its submodules; a layer here
          is one C++ object, so its own weights are all those torch keeps in its submodules too
          (``TransformerEncoderLayer``: every weight, torch's none; ``MultiheadAttention``: also
          ``out_proj.*``, torch's ``in_proj_*`` only). A ``Linear`` or ``LayerNorm`` gives what
          torch's does; a stack (``TransformerEncoder``) none, as torch's;
        * ``remove_duplicate=False``: a weight at several names (a module at two places) is listed
          under each, with the same Parameter (as torch's).

        Unlike torch's, which returns an iterator, this returns a list (as :meth:`parameters`).

        Once a weight is quantized in place (``quantize(..., inplace=True)``, ``set_gguf_weights``),
        the Parameters handed out before read its last float values (the buffer stays while they
        live) and no longer change the model, and new calls raise.

        Raises:
            TypeError: ``prefix`` not a str, ``recurse`` or ``remove_duplicate`` not a bool.
            ValueError: a weight is held quantized (it has no float buffer to view).
        """
        if not isinstance(prefix, str):
            raise TypeError(f"prefix: expected a str, got {type(prefix).__name__}")
        recurse = check_bool(recurse, "recurse")
        remove_duplicate = check_bool(remove_duplicate, "remove_duplicate")
        own = None if recurse else self._own_slots()
        parameters = []
        for name, p, first in self._parameter_places(own):
            if remove_duplicate and not first:
                continue
            parameters.append((f"{prefix}.{name}" if prefix else name, p))
        return parameters

    def _parameter_places(self, only=None) -> list[tuple[str, Parameter, bool]]:
        """``[(name, Parameter, first)]`` of every name of :meth:`state_dict` (or of those in
        ``only``: no Parameter is made for the others, so a quantized weight elsewhere does not
        raise), in its order: a weight at several names has one Parameter, made for its first name
        (``first`` True there only). The Parameters are cached, so that every call gives the same
        objects."""
        # The cache: {(name, id(C++ module), its name there): Parameter} (each Parameter holds its C++
        # module: no other can take its id while it is cached), of the storage epoch it was made in.
        epoch, cache = self.__dict__.get("_parameters_cache", (None, {}))
        if epoch != _storage_epoch[0] and not _still_viewing(cache.values()):
            cache = {}  # a weight of this module changed storage: all built again (a quantized one raises)
        places, current, listed = [], {}, {}
        for name, slot in self._slots().items():
            weight = (id(slot.impl), slot.core_name)
            if only is not None and name not in only:  # left out: its cached Parameter kept for later calls
                key = (name, *weight)
                if key in cache:
                    current[key] = cache[key]
                continue
            if weight in listed:
                places.append((name, listed[weight], False))  # the same module at a second place
                continue
            key = (name, *weight)
            p = cache.get(key)
            if p is None:
                p = _BoundParameter(slot.impl, slot.core_name, name, slot.transposed, slot.row_permutation)
            current[key] = listed[weight] = p
            places.append((name, p, True))
        self.__dict__["_parameters_cache"] = (_storage_epoch[0], current)
        return places

    def parameters(self, recurse: bool = True) -> list[Parameter]:
        """The :class:`Parameter` objects of :meth:`named_parameters` (``recurse`` as there), in order.

        A list, not torch's iterator: the library and its users index, slice, concatenate and count
        it (``a.parameters() + b.parameters()`` for one optimizer, ``len(model.parameters())``), which
        an iterator would break. It iterates as torch's does (``for p in model.parameters()``); the
        first parameter is ``next(iter(model.parameters()))`` (or ``model.parameters()[0]``), where
        torch code writes ``next(model.parameters())``.

        Raises:
            TypeError: ``recurse`` not a bool. ValueError: as :meth:`named_parameters`.
        """
        return [p for _, p in self.named_parameters(recurse=recurse)]

    # ---- the module tree, as torch's (named_modules, children, apply, ...) --------------------------
    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, "Module"]]:
        """An iterator of ``(name, module)``: this module (``prefix``, ``""`` by default), then every
        module under it, depth first in registration order, as torch's ``named_modules``: a module
        at two places once, at its first (``remove_duplicate=False``: at each); ``memo``, a set of
        modules not to list (and to which those listed are added), as torch's.

        The tree is this library's Python modules, which is coarser than torch's: a layer
        (``Linear``, ``LayerNorm``, ``MultiheadAttention``, ``TransformerEncoderLayer``,
        ``TransformerDecoderLayer``) and a model (``GPT2LMHeadModel``, ``LlamaForCausalLM``,
        ``BertModel``: one C++ object each) is one module with no modules under it, its weights named
        as torch's / Hugging Face's (``self_attn.out_proj.weight`` is a weight of the layer, not of a
        module ``self_attn.out_proj``; ``h.0.attn.c_attn.weight`` one of the GPT-2 model, which has no
        module ``h.0``); and a stack's layers are
        its children ``layers.0``, ``layers.1``, ... with no ``ModuleList`` above them (no module
        ``layers``). So the names listed are the names torch's ``named_modules`` gives for the same
        architecture, in the same order, less the ``ModuleList`` containers and the modules inside a
        layer: for ``TransformerEncoder(layer, 3, norm=LayerNorm(d))`` ``""``, ``"layers.0"``,
        ``"layers.1"``, ``"layers.2"``, ``"norm"``; for ``Transformer`` ``""``, ``"encoder"``,
        ``"encoder.layers.0"``, ..., ``"encoder.norm"``, ``"decoder"``, ..., ``"decoder.norm"``.
        Modules the caller attached (``model.head = nn.Linear(8, 3)``) follow the built-in ones, as
        they follow in torch's. A module met again under itself (``head.backbone = model``) is not
        followed (torch's is not either with ``remove_duplicate=True``; with False, and in its
        ``apply`` and ``state_dict``, it recurses without end).

        Raises:
            TypeError: ``memo`` neither None nor a set, ``prefix`` not a str, ``remove_duplicate`` not
                a bool (when called, not when iterated).
        """
        if memo is not None and not isinstance(memo, set):
            raise TypeError(f"memo: expected None or a set of modules, got {type(memo).__name__}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix: expected a str, got {type(prefix).__name__}")
        remove_duplicate = check_bool(remove_duplicate, "remove_duplicate")
        return _named_modules(self, set() if memo is None else memo, prefix, remove_duplicate, frozenset())

    def modules(self) -> Iterator["Module"]:
        """An iterator of this module and every module under it (:meth:`named_modules`'s modules)."""
        for _, module in self.named_modules():
            yield module

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        """An iterator of ``(name, child)`` of the modules directly under this one (a module held at
        two names once, at its first), as torch's ``named_children``: the built-in children, then
        those the caller attached (:meth:`_registered_children`). A stack's children are its layers,
        ``("layers.0", layer)``, ..., and its norm: torch's are the ``ModuleList`` ``"layers"`` and
        the norm (see :meth:`named_modules`); a layer has none (torch's ``TransformerEncoderLayer``
        has ``self_attn``, ``linear1``, ...)."""
        seen = set()
        for name, child in self._registered_children():
            if id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self) -> Iterator["Module"]:
        """An iterator of the modules of :meth:`named_children`."""
        for _, child in self.named_children():
            yield child

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, np.ndarray]]:
        """An empty iterator, always: this library's modules have no buffers. What torch's (or Hugging
        Face's) models keep as buffers, not in their ``state_dict`` (BERT's ``position_ids``,
        Llama's rotary ``inv_freq``, ...), is computed inside the C++ modules; the weights are
        parameters (:meth:`named_parameters`). Takes torch's arguments, for code that passes them.

        Raises:
            TypeError: ``prefix`` not a str, ``recurse`` or ``remove_duplicate`` not a bool.
        """
        if not isinstance(prefix, str):
            raise TypeError(f"prefix: expected a str, got {type(prefix).__name__}")
        check_bool(recurse, "recurse")
        check_bool(remove_duplicate, "remove_duplicate")
        return iter(())

    def buffers(self, recurse: bool = True) -> Iterator[np.ndarray]:
        """An empty iterator, always (no buffers: see :meth:`named_buffers`).

        Raises:
            TypeError: ``recurse`` not a bool.
        """
        return iter(b for _, b in self.named_buffers(recurse=recurse))

    def apply(self, fn: Callable[["Module"], object]) -> "Module":
        """Calls ``fn(module)`` on every module under this one, then on this one (children first, in
        the order of :meth:`named_children`, recursively), as torch's ``apply``; returns ``self``. The
        modules are those of :meth:`named_modules` (a layer has no modules under it: ``fn`` sees the
        layer, not a ``Linear`` inside it). A module at two places gets ``fn`` at each, as torch's;
        one met again under itself is not followed.

        Raises:
            TypeError: ``fn`` not callable (nothing is called); whatever ``fn`` raises.
        """
        if not callable(fn):
            raise TypeError(f"fn: expected a callable taking a module, got {type(fn).__name__}")
        _apply(self, fn, frozenset())
        return self

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        """Torch's ``requires_grad_``: ``True`` (every weight takes part in training) is what every
        module already does, and returns ``self``. ``False`` (freeze the weights) is refused: a
        backward here runs in C++ and adds the gradient of every weight of the module (there is no
        autograd, and :class:`~transformer_core.parameter.Parameter`'s ``requires_grad`` is always
        True: setting it False is refused as here). To freeze weights, hand the optimizer (and
        ``clip_grad_norm_``) only the others::

            trained = [(n, p) for n, p in model.named_parameters() if not n.startswith("embeddings.")]
            opt = tc.optim.AdamW(trained, lr=3e-4)

        Their gradients are still computed, never applied.

        Raises:
            TypeError: ``requires_grad`` not a bool. ValueError: ``requires_grad`` is False.
        """
        if not check_bool(requires_grad, "requires_grad"):
            raise freezing_refused(f"{type(self).__name__}.requires_grad_(False): freezing weights")
        return self

    def gradients(self) -> dict[str, np.ndarray]:
        """A copy of every gradient a backward wrote since the last ``zero_grad()``, keyed by the
        checkpoint's names and in the checkpoint's layout (as :meth:`state_dict`: transposed, rows
        permuted), each a new array of the weight's checkpoint shape and ``self.dtype``."""
        out = {}
        for name, slot in self._slots().items():
            if not _grad_readable(slot.impl, slot.core_name):
                continue
            g = slot.impl.gradient_view(slot.core_name)
            if not slot.transposed and slot.row_permutation is None:
                g = g.copy()
            out[name] = _to_checkpoint(g, slot.transposed, slot.row_permutation)
        return out

    def _dropout_seed(self, p: float, seed=None) -> int:
        """The seed of a training forward's dropout: ``seed``, else the package generator's next."""
        if seed is not None:
            from ._validation import check_int

            return check_int(seed, "seed", 0)
        return next_seed() if p > 0 else 0

    @property
    def _saved(self):
        """What the last training forward keeps on the Python side for its backward (its inputs), or
        None. Set by the forward, which also records the weights' version then; reading it
        checks that version: once an optimizer step (or ``load_state_dict``) wrote this module's
        weights, the state is dropped and :class:`WeightsChangedError` raised (the forward's
        activations belong to the old weights)."""
        kept = self.__dict__.get("_saved")
        if kept is None:
            return None
        self._check_weights_unchanged(kept.writes)
        return kept.value

    @_saved.setter
    def _saved(self, value) -> None:
        self.__dict__["_saved"] = None if value is None else _Kept(value, _WRITES[0])

    def _record_weights(self) -> None:
        """For a model whose training state lives in C++ only (``CausalLM.loss``): records the
        weights' version (``_saved`` is then True), which :meth:`_check_recorded_weights` checks."""
        self._saved = True

    def _check_recorded_weights(self) -> None:
        """The backward of a model of :meth:`_record_weights`: raises :class:`WeightsChangedError`
        (the state dropped) when its weights were written since, then forgets the record.

        Raises:
            NoTrainingStateError: nothing recorded (no loss since the last backward, or a shallow copy's
                backward: its C++ training state is the original's, see :meth:`__copy__`).
        """
        kept = self.__dict__.get("_saved")
        if kept is None:
            raise NoTrainingStateError(f"{type(self).__name__}.backward: no training loss to differentiate (each "
                                       "loss has one backward, through the model it ran on)")
        self._check_weights_unchanged(kept.writes)
        self._saved = None

    def _weights_written_since(self, writes: int) -> bool:
        """Whether the library wrote a weight of this module or of one of its built-in children (at any
        depth: the modules its forward runs) since ``_WRITES`` was ``writes``. Negligible unless
        some weight, of any module, was written since: then one look per C++ module under this one."""
        if _WRITES[0] == writes:
            return False
        return any(m._impl is not None and _LAST_WRITE.get(m._impl, 0) > writes
                   for _, m in _module_tree(self, attached=False, duplicates=False))

    def _weights_changed(self) -> WeightsChangedError:
        """Drops the training state of this module and every module under it; the error to raise."""
        self._drop_training_state()
        return WeightsChangedError(
            f"{type(self).__name__}.backward: the weights changed since the training forward (an optimizer "
            "step(), load_state_dict() or quantize wrote some weight of the module between them): its activations "
            "belong to the old weights; run the forward (or loss) again, then backward (the training state was "
            "dropped, no gradient was added)")

    def _check_weights_unchanged(self, writes: int) -> None:
        """Raises :class:`WeightsChangedError` (after dropping the training state of this module and
        every module under it) when the library wrote a weight of this module since ``_WRITES`` was
        ``writes``."""
        if self._weights_written_since(writes):
            raise self._weights_changed()

    def _check_backward_ready(self) -> None:
        """For a composite module's backward, which runs its children's backwards one after another
        (each adding its gradients): checks, before the first one adds anything, that this module and
        each of its built-in children (at any depth) hold what one training forward kept, with no
        weight written since, and that no module sits at two places (``enc.layers[1] =
        enc.layers[0]``: its forward ran at each and kept the last one only, a backward through both
        is not supported). Otherwise nothing runs: no gradient is added, so running the forward
        again, then the backward, adds the gradient once.

        Raises:
            NoTrainingStateError: this module holds no training state (nothing is dropped: a shallow
                copy's children are the original's, whose backward may still run); a module under it
                holds none (a child's own backward ran since), or sits at two places (the state of
                all of them is dropped).
            WeightsChangedError: a weight under this module was written since the forward (the state
                of all of them is dropped).
        """
        mode = "training" if self.training else "eval (call .train(), then run the loss (or forward) again)"
        message = (f"{type(self).__name__}.backward: no training forward to differentiate (mode: {mode}; each "
                   "training forward has one backward)")
        if self.__dict__.get("_saved") is None:
            raise NoTrainingStateError(message)
        modules = _module_tree(self, attached=False)
        places: dict = {}
        for path, m in modules:
            places.setdefault(id(m), []).append(path)
        shared = next((paths for paths in places.values() if len(paths) > 1), None)
        if shared is not None:
            self._drop_training_state()
            raise NoTrainingStateError(
                f"{type(self).__name__}.backward: the same module is at {' and '.join(map(repr, shared))}; its "
                "training forward ran at each place and kept only the last, so a backward through both is not "
                "supported: give each place a module of its own (copy.deepcopy) to train it; the training state "
                "was dropped, no gradient was added")
        missing = []
        for path, m in modules:
            kept = m.__dict__.get("_saved")
            if kept is None:
                missing.append(path)
            elif m._weights_written_since(kept.writes):
                raise self._weights_changed()
        if not missing:
            return
        self._drop_training_state()
        raise NoTrainingStateError(f"{message}: {missing} held no training state of this forward (a backward of "
                                   "theirs ran since); the training state was dropped, no gradient was added")

    def _peek_saved(self):
        """What the last training forward kept, not yet consumed: a backward checks its arguments
        against it, then consumes it (:meth:`_take_saved`), so a refused call can be retried.

        Raises:
            NoTrainingStateError: nothing kept. WeightsChangedError: the weights were written since
                the forward (an optimizer step, ``load_state_dict``): the state is dropped.
        """
        saved = self._saved
        if saved is None:
            mode = "training" if self.training else "eval (call .train(), then run the loss (or forward) again)"
            raise NoTrainingStateError(f"{type(self).__name__}.backward: no training forward to differentiate "
                                       f"(mode: {mode}; each training forward has one backward)")
        return saved

    def _take_saved(self):
        """What the last training forward kept (consumed: one backward per forward)."""
        saved = self._peek_saved()
        self._saved = None
        return saved

    # ---- construction helpers ------------------------------------------------------------------
    def _init_dtype(self, dtype) -> str:
        """Sets the module's ``dtype`` (checked; fixed, :meth:`_fix_dtype`) and returns the C++
        classes' suffix for it (``"F32"`` / ``"F64"``)."""
        self._fix_dtype(resolve_dtype(dtype))
        return dtype_suffix(self.dtype)

    def _init_weights(self, seed: int | None = None) -> None:
        """Fills a freshly built module's weight matrices as torch's default init would in spirit:
        uniform(±1/sqrt(fan_in)), deterministic for a given seed (the values do not depend on the
        dtype beyond its rounding). ``seed`` None (every constructor's call): the package
        generator's next seed (:func:`next_seed`), so that :func:`manual_seed` before building
        chooses the initial weights, as ``torch.manual_seed`` does, and two modules built one
        after the other (the layers of ``nn.Transformer``) start different. 1-D parameters keep
        what the C++ constructor gave them: ones for every norm weight, zeros for biases (the C++
        layer knows which is which; a name does not: a standalone ``RMSNorm``'s weight is just
        ``"weight"``). Skipped inside
        :func:`skip_weight_init` (the weights stay as the C++ core left them).

        The padding row of a token embedding (:meth:`_padding_rows`: a model's ``pad_token_id``)
        is then set to zeros, as torch's ``nn.Embedding(padding_idx=)`` and Hugging Face's
        ``_init_weights`` leave it.

        The values are drawn in float64 chunks of at most ``_INIT_CHUNK`` elements and written
        into the C++ buffers in place: a size that passed the C++ allocation check (its own bytes
        per element) never needs a float64 copy of a whole matrix on top of it."""
        rng = _init_generator(seed)
        if rng is None:
            return
        padding = self._padding_rows()
        for slot in self._slots().values():
            if len(slot.shape) < 2:
                continue
            fan_in = slot.shape[0] if slot.transposed else slot.shape[-1]
            bound = 1.0 / np.sqrt(fan_in)
            view = _checkpoint_view(slot)
            _fill_in_chunks(view, lambda size: rng.uniform(-bound, bound, size=size), slot.row_permutation)
            row = padding.get(slot.core_name) if slot.impl is self._impl else None
            if row is not None:
                view[row if slot.row_permutation is None else int(slot.row_permutation[row])] = 0.0

    def _padding_rows(self) -> dict[str, int]:
        """``{C++ name of a token embedding of this module's own: row}``: the rows that
        :meth:`_init_weights` sets to zeros (torch's ``padding_idx``, an index in ``[0, rows)``).
        Empty here; a model with a ``pad_token_id`` names its embedding's row."""
        return {}


#: Attributes of a module that a copy does not take from it: the rebuilt module has its own. The C++
#: module, the arguments it was built from, a training forward's state (pointers into the original's
#: C++ activations) and the cached Parameters (numpy views of the ORIGINAL's C++ buffers: copied, they
#: would write into the original). C++ objects held in other attributes (a rotary table) are rebuilt
#: with it, not copied (:func:`_holds_core_objects`). Everything else a module carries, set by its
#: constructor or later (its config, a dropout probability, a loader's ``source``, a Seq2Seq's ``pe``
#: table, a stack's ``layers``, a head attached by the caller), is copied over the rebuilt module's
#: (:func:`_carried_attributes`): a reference to a module under the one copied, or to that one, at any
#: depth, as one to the copy's own (deepcopy's memo, pickle's memo: :class:`_ChildMark`), any other
#: module a copy of its own.
_NOT_COPIED = frozenset({"_impl", "_init_args", "_saved", "_parameters_cache", "_weight_names"})


def _holds_core_objects(value) -> bool:
    """Whether ``value`` is (or is a list, tuple or dict of) C++ objects: rebuilt, not copied."""
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else (value,)
    return any(type(v).__module__.startswith("transformer_core._core") for v in items)


def _carried_attributes(module) -> dict:
    """``{attribute: value}`` of ``module`` that a copy takes from it (the original values; not those
    of :data:`_NOT_COPIED`, nor C++ objects)."""
    return {key: value for key, value in vars(module).items()
            if key not in _NOT_COPIED and not _holds_core_objects(value)}


def _set_attributes(module, attributes: dict, *, exactly: bool = False) -> None:
    """Sets ``attributes`` (``{attribute: value}``, the values already the copy's) on ``module`` (a
    copy), over what its constructor set; except a numpy array of the rebuilt module that views C++
    memory (none of the library's constructors keeps one; the rebuilt module's own view must stay, a
    copy of the original's would be detached from its weights).

    ``exactly`` (``attributes`` are all those the original carries, :func:`_carried_attributes`: a
    deep copy, a pickle): the copy's attributes become the original's, in the original's order,
    and no others. The order is that of the modules attached (``named_children``, so
    ``state_dict``'s names: after ``del m.fc1; m.fc1 = Linear(...)`` ``fc1`` comes after ``fc2``,
    as in the original), and an attribute the constructor set that the original no longer has
    (``del m.fc1``) is not in the copy either. What a copy does not take from the original (the
    C++ module and the other :data:`_NOT_COPIED` entries, C++ objects) stays the rebuilt one's."""
    own = vars(module)
    if not exactly:
        for key, value in attributes.items():
            if not _views_core_memory(own.get(key)):
                own[key] = value
        return
    rebuilt = {key: value for key, value in own.items() if key in _NOT_COPIED or _holds_core_objects(value)}
    for key, value in attributes.items():
        rebuilt[key] = own[key] if _views_core_memory(own.get(key)) else value
    own.clear()
    own.update(rebuilt)


def _short_repr(value) -> str:
    """A constructor argument in :meth:`Module.extra_repr`, short: numbers, strings, None and small
    lists of them as ``repr``; a dtype or numpy type by its name; an array as ``array(shape,
    dtype)``; a module (or the :class:`_Recipe` a snapshot keeps of one) as ``Class(...)``; any
    other object as its ``repr`` when that is short, else ``Class(...)``."""
    if isinstance(value, _Recipe):
        return f"{value.cls.__name__}(...)"
    if isinstance(value, Module):
        return f"{type(value).__name__}(...)"
    if isinstance(value, np.generic):
        value = value.item()  # a numpy scalar: as the Python number
    if isinstance(value, (bool, int, float, str, type(None))):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return np.dtype(value).name
    if isinstance(value, type):
        return value.__name__
    if _is_array(value) and isinstance(getattr(value, "shape", None), tuple):
        return f"array({tuple(value.shape)}, {getattr(value, 'dtype', '?')})"
    if isinstance(value, (list, tuple)) and len(value) <= 8:
        items = ", ".join(_short_repr(v) for v in value)
        text = f"[{items}]" if isinstance(value, list) else f"({items}{',' if len(value) == 1 else ''})"
        if len(text) <= 60:
            return text
    try:
        text = repr(value)
    except Exception:  # a repr that fails: the class is enough
        text = ""
    return text if text and len(text) <= 60 and "\n" not in text else f"{type(value).__name__}(...)"


def _grouped_children(module) -> list[tuple[str, str]]:
    """``[(name, repr)]`` of the children of ``module`` at every place, for its repr
    (:meth:`Module._registered_children`: a layer at two places is listed twice, as torch's repr
    lists it); a run of two or more at consecutive places ``prefix.i`` that print alike is one
    entry, ``("prefix.i-j", "n x repr")``, as torch prints a ``ModuleList`` of equal layers."""
    out: list[tuple[str, str]] = []
    run: list = []  # [prefix, first index, last index, repr] of the run being grouped

    def close() -> None:
        """Ends the run being grouped: one entry for it (``prefix.i`` alone, or ``prefix.i-j``)."""
        if run:
            prefix, first, last, text = run
            out.append((f"{prefix}.{first}", text) if first == last else
                       (f"{prefix}.{first}-{last}", f"{last - first + 1} x {text}"))
            run.clear()

    for name, child in module._registered_children():  # every place: a layer shared by two is listed twice
        text = repr(child)
        prefix, _, index = name.rpartition(".")
        if prefix and index.isdigit():
            if run and run[0] == prefix and run[2] + 1 == int(index) and run[3] == text:
                run[2] = int(index)
                continue
            close()
            run.extend([prefix, int(index), int(index), text])
            continue
        close()
        out.append((name, text))
    close()
    return out


def _module_tree(module, *, attached: bool = True, duplicates: bool = True) -> list:
    """``[(path, module)]``: ``module`` (path ``""``) and every module under it, depth first in
    registration order (:meth:`Module._registered_children`; with ``attached=False`` the built-in
    children only, :meth:`Module._children`: the modules a composite's forward runs). A module met
    again under itself (``head.backbone = model`` where ``model.head = head``) is not followed, so
    no path is endless. A module at two places is listed at both (as torch's ``state_dict`` names
    it), or, with ``duplicates=False``, at its first only (torch's ``named_modules``)."""
    out, seen = [], set()

    def visit(path: str, m, above: frozenset) -> None:
        """Lists ``m`` at ``path``, then its children; ``above``: the ids of the modules on the path."""
        out.append((path, m))
        seen.add(id(m))
        for name, child in (m._registered_children() if attached else m._children()):
            if id(child) in above or (not duplicates and id(child) in seen):
                continue
            visit(f"{path}.{name}" if path else name, child, above | {id(child)})

    visit("", module, frozenset({id(module)}))
    return out


def _named_modules(module, memo: set, prefix: str, remove_duplicate: bool, above: frozenset):
    """:meth:`Module.named_modules` from ``module`` at ``prefix``; ``above``: the ids of the modules
    on the path to it (not followed again)."""
    if module in memo:
        return
    if remove_duplicate:
        memo.add(module)
    yield prefix, module
    above = above | {id(module)}
    for name, child in module._registered_children():
        if id(child) not in above:
            yield from _named_modules(child, memo, f"{prefix}.{name}" if prefix else name, remove_duplicate, above)


def _apply(module, fn, above: frozenset) -> None:
    """:meth:`Module.apply` from ``module``; ``above``: the ids of the modules on the path to it."""
    above = above | {id(module)}
    for _, child in module.named_children():
        if id(child) not in above:
            _apply(child, fn, above)
    fn(module)


def _quantized_weights(module) -> dict[str, str]:
    """``{name: storage}`` of the weights of ``module`` held quantized (:meth:`Module.weight_formats`
    not float), and of the int8 copy a tied LM head multiplies by (``quantize`` of a causal LM whose
    head is its token embedding: the table stays float32 for the lookups; the copy is named
    ``"<table>:tied_lm_head"``, as the core's ``parameter_storage`` names it). A weight written
    later would not reach the copy, so the copy counts as quantized for the guards."""
    out, storage_of = {}, {}
    for name, slot in module._slots().items():
        if id(slot.impl) not in storage_of:
            storage_of[id(slot.impl)] = dict(slot.impl.parameter_storage())
        storage = storage_of[id(slot.impl)]
        if not storage[slot.core_name].startswith("float"):
            out[name] = storage[slot.core_name]
        tied_copy = storage.get(slot.core_name + TIED_HEAD_COPY)
        if tied_copy is not None:
            out[name + TIED_HEAD_COPY] = tied_copy
    return out


def _names_fixed(cls) -> bool:
    """Whether the weight names of ``cls``'s modules can be read once per C++ module: the class in
    its MRO that defines the ``_public_name`` in use says so itself (``_public_name_of_core_name_only``
    in its own namespace; a hook defined without it may read state, e.g. a user's subclass)."""
    owner = next(k for k in cls.__mro__ if "_public_name" in vars(k))
    return vars(owner).get("_public_name_of_core_name_only", False) is True


def _held_quantized(quantized: dict[str, str]) -> str:
    """``quantized`` (:func:`_quantized_weights`, not empty) in words for the guards' messages: how
    many, and one of them: a weight of the state dict where there is one, else the int8 copy of a tied
    LM head, named as what it is (its entry is in no state dict)."""
    name, fmt = min(quantized.items(), key=lambda item: item[0].endswith(TIED_HEAD_COPY))
    if name.endswith(TIED_HEAD_COPY):
        first = (f"the LM head tied to {name[:-len(TIED_HEAD_COPY)]!r} multiplies by a copy of it held as {fmt}, "
                 "made by quantize()")
    else:
        first = f"{name!r}: {fmt}"
    if len(quantized) == 1:
        return f"1 weight is held quantized ({first})"
    return f"{len(quantized)} weights are held quantized (e.g. {first})"


#: The suffix of the entry that the core's ``parameter_storage()`` adds for an embedding table
#: whose tied LM head multiplies by an int8 copy of it: ``"<table>" + TIED_HEAD_COPY``.
TIED_HEAD_COPY = ":tied_lm_head"


def _check_not_quantized(module) -> None:
    """Raises TypeError when a weight of ``module`` (or of a module under it) is held quantized:
    copies and pickles are of float modules."""
    quantized = _quantized_weights(module)
    if quantized:
        raise TypeError(f"{type(module).__name__}: cannot be copied or pickled: {_held_quantized(quantized)}; copy "
                        "the float model and quantize the copy, or save its state_dict()")


def _own_state(module, gradients: bool = True, lazy: bool = False) -> dict:
    """``{"weights": {name: array}, "grads": {name: array}}`` of ``module``'s own C++ weights
    (:meth:`Module._own_slots`, not those of the modules under it), in the C++ layout, fresh copies
    (a quantized weight dequantized to float32); the gradients only those that hold one, none when
    not ``gradients``. ``lazy``: each weight a :class:`~transformer_core.hub.LazyTensor` that makes
    its copy when :func:`_load_own_state` sets it (a copy then holds one weight's copy at a time)."""
    weights, grads = {}, {}
    for name, slot in module._own_slots().items():
        if lazy:
            shape = slot.shape[::-1] if slot.transposed else slot.shape
            weights[name] = LazyTensor(shape, np.dtype(module.dtype),
                                       functools.partial(slot.impl.get_parameter, slot.core_name))
        else:
            weights[name] = np.array(slot.impl.get_parameter(slot.core_name), copy=True)
        if gradients and _grad_readable(slot.impl, slot.core_name):
            grads[name] = np.array(slot.impl.gradient_view(slot.core_name), copy=True)
    return {"weights": weights, "grads": grads}


def _load_own_state(module, state: dict, on_weight=None) -> None:
    """Gives ``module`` (built again) the weights and gradients of an :func:`_own_state`, one weight
    at a time (a lazy one made then), calling ``on_weight(slot)`` after each weight is set (where
    given: :func:`transformer_core.quantize` converts each linear layer of its copy as soon as its
    weight is there).

    Raises:
        TypeError: ``module`` has other weights (names or shapes): the one copied was changed after
            it was built in a way its arguments do not say.
    """
    slots, weights = module._own_slots(), state["weights"]
    if list(slots) != list(weights) or any(np.shape(weights[n]) != tuple(slots[n].impl.parameter_view(
            slots[n].core_name).shape) for n in slots):
        raise TypeError(f"{type(module).__name__}: cannot be copied, a module built again from the arguments it was "
                        "built with does not have its weights (it was changed after it was built); copy it through "
                        "state_dict: build a new one and load_state_dict(module.state_dict())")
    for name, value in weights.items():
        slot = slots[name]
        slot.impl.set_parameter(slot.core_name, value.make() if isinstance(value, LazyTensor) else value)
        if on_weight is not None:
            on_weight(slot)
    for name, value in state["grads"].items():
        slot = slots[name]
        slot.impl.gradient_view(slot.core_name)[...] = value
        _mark_grad_rows_written(slot.impl, slot.core_name)


def _built_alike(module, cls, init_args: tuple) -> bool:
    """Whether ``module`` is of class ``cls`` and was built from arguments equal to ``init_args`` (a
    snapshot, :func:`_same_value`): then it computes as a module so built, given its weights."""
    return type(module) is cls and _same_value(module._init_args, init_args)


# How a copy is made (deepcopy, quantize; pickles the same way, see Module.__reduce_ex__): the module
# is built again from the arguments it was built with, which builds its built-in children too (a
# stack's layers). Then, for each module under the original, the copy either REUSES the module the
# rebuilt parent made at the same place (when that one was built alike and is not already the copy
# of another original: a constructor may tie two places, ``self.b = self.a``, that the user untied
# since) or BUILDS a copy of its own. Each copy is put in the deepcopy memo under the original's id,
# so that the last step, deep-copying the original's attributes (``layers``, ``head``, any list or
# dict holding modules), puts every copy at its place: the memo answers each module with its copy.


def _rebuilt_copy(module, memo: dict | None = None, *, gradients: bool = True,
                  used: set | None = None, on_weight=None) -> "Module":
    """A copy of ``module`` built again from its arguments, as :meth:`Module.__deepcopy__` describes
    (weights, gradients unless not ``gradients``, the modules under it, attributes), in ``memo`` (a
    ``copy.deepcopy`` call's, where given). ``used``: the ids of the modules already made copies in
    this copy (:func:`_copy_into`). Weights held quantized are copied dequantized (float32), as
    :func:`transformer_core.quantize` copies a model (``copy.deepcopy`` refuses them before).
    ``on_weight``: where given, ``on_weight(original's C++ module, slot)`` after each weight of the
    copy is set (copied one at a time: :func:`_load_own_state`).

    Raises:
        TypeError: a module cannot be built again from its arguments, or has other weights then.
    """
    new = _build(type(module), module._init_args)
    _copy_into(module, new, {} if memo is None else memo, gradients, set() if used is None else used, on_weight)
    return new


def _copy_into(original, new, memo: dict, gradients: bool, used: set, on_weight=None) -> None:
    """Makes ``new`` (built from ``original``'s arguments, or by its own parent at ``original``'s
    place from equal ones) a copy of ``original``: its own weights and gradients; each module under
    it in its place, the one ``new`` built there when built alike (:func:`_built_alike`) and not yet
    the copy of another module (``used``: the ids of the modules made copies so far), else a copy
    built from its own arguments (a child replaced or attached since, or untied); then its
    attributes, deep copies in ``memo``, where each module copied in this call is its copy.

    ``memo`` is keyed by ids: every original put there is reachable from the module being copied,
    which ``copy.deepcopy`` keeps alive for the whole call, so no id is reused meanwhile. The C++
    module of ``original`` maps to ``new``'s too, for the Parameters copied in the same call
    (:meth:`_BoundParameter.__deepcopy__`)."""
    memo[id(original)] = new
    used.add(id(new))
    if original._impl is not None:
        memo[id(original._impl)] = new._impl
    if on_weight is None:
        _load_own_state(new, _own_state(original, gradients))
    else:
        _load_own_state(new, _own_state(original, gradients, lazy=True), functools.partial(on_weight, original._impl))
    built = dict(new._registered_children())
    for name, child in original._registered_children():
        if id(child) in memo:
            continue  # copied already: at another place, above this one, or earlier in the same call
        candidate = built.get(name)
        if (candidate is not None and id(candidate) not in used
                and _built_alike(candidate, type(child), child._init_args)):
            _copy_into(child, candidate, memo, gradients, used, on_weight)
        else:  # put at its place by the attributes' copy
            _rebuilt_copy(child, memo, gradients=gradients, used=used, on_weight=on_weight)
    _set_attributes(new, {key: _deep_copied(value, memo) for key, value in _carried_attributes(original).items()},
                    exactly=True)


def _restore_module(cls, payload: dict):
    """Unpickling: a module of class ``cls`` built again from the arguments of ``payload``
    (:meth:`Module.__reduce_ex__`), given its own weights and gradients; the modules under it and
    its attributes come in its state (:func:`_restore_state`).

    Raises:
        TypeError: ``cls`` cannot be built from the arguments, or the module built has other weights.
    """
    new = _build(cls, payload["init_args"])
    _load_pickled_state(new, payload)
    return new


#: The layout of a module's pickle (:meth:`Module.__reduce_ex__`); pickles of the versions before
#: had none, and their composite modules held every weight in the top module's payload.
_PICKLE_FORMAT = 2


def _load_pickled_state(module, payload: dict) -> None:
    """:func:`_load_own_state` for an unpickled module: a payload of another layout (a pickle of
    another version of the library) is named as such rather than as a module changed.

    Raises:
        TypeError: the payload does not fit ``module`` (see :func:`_load_own_state`).
    """
    try:
        _load_own_state(module, payload)
    except TypeError:
        if payload.get("format") == _PICKLE_FORMAT:
            raise
        raise TypeError(f"{type(module).__name__}: cannot be unpickled, the pickle comes from another version of "
                        "transformer_core (its weights are laid out otherwise); load it with that version and "
                        "save its state_dict() instead (save_pretrained, safetensors), then load_state_dict() "
                        "it into a new module") from None


#: Modules built again while unpickling that were given the part of a pickled module
#: (:func:`_adopt_child`): none is given a second one (a constructor that tied two places,
#: ``self.b = self.a``, builds one module for both; the user may have untied them since).
_ADOPTED: "weakref.WeakSet" = weakref.WeakSet()


def _adopt_child(parent, name: str, cls, payload: dict):
    """Unpickling a module pickled as the part of ``parent`` (already rebuilt) at its place ``name``:
    the module ``parent`` built there, given its weights and gradients, when built alike
    (:func:`_built_alike`) and not given another part already, else one built from its own arguments
    (a child replaced or attached since, or untied), as :meth:`Module.__deepcopy__` does."""
    built = dict(parent._registered_children()).get(name)
    if built is not None and built not in _ADOPTED and _built_alike(built, cls, payload["init_args"]):
        _load_pickled_state(built, payload)
        _ADOPTED.add(built)
        return built
    return _restore_module(cls, payload)


def _restore_state(module, state: tuple) -> None:
    """Unpickling: gives ``module`` the attributes of the state :meth:`Module.__reduce_ex__` wrote
    (``([marks and modules under it], attributes)`` once read: the modules are in place by then)."""
    _set_attributes(module, state[-1], exactly=True)


class _Place(NamedTuple):
    """Where a module being pickled sits: ``parent._registered_children()`` holds it as ``name``."""
    parent: object
    name: str
    child: object


# Why a registry: a module under the one pickled must be pickled AS ITSELF (so that pickle's memo
# maps every other reference to it, ``enc.groups = [enc.layers[1]]``, to the one unpickled), yet
# unpickle as the part of its rebuilt parent (_adopt_child). Its own __reduce_ex__ can only tell it
# is such a part by looking it up here: the parent's pickle state registers each child just before
# the child is pickled (_ChildMark) and drops the registrations at its end. A pickle that fails
# half-way never reaches that end: its scope (_PickleScope) then drops them when the pickler lets go
# of the state, so nothing outlives the failed pickle (no model kept alive, no later pickle of a
# module pickled as a stale part).


def _pickled_children() -> dict:
    """This thread's ``{id(module): _Place}`` of the modules that pickle as the part of a module
    being pickled (:class:`_ChildMark`)."""
    registry = getattr(_PICKLE_SCOPE, "children", None)
    if registry is None:
        registry = _PICKLE_SCOPE.children = {}
    return registry


_PICKLE_SCOPE = threading.local()


def _pickle_path(module) -> tuple:
    """``(top, path)``: the module a pickle started from and the path of ``module`` under it
    (``"layers.1"``; ``""`` for ``module`` itself), from the registered places."""
    registry, names, seen = _pickled_children(), [], {id(module)}
    place = registry.get(id(module))
    while place is not None:
        names.append(place.name)
        module = place.parent
        if id(module) in seen:
            break
        seen.add(id(module))
        place = registry.get(id(module))
    return module, ".".join(reversed(names))


def _unregister(registry: dict, places: dict) -> None:
    """Drops from ``registry`` (a thread's :func:`_pickled_children`) the ``places`` a scope
    registered (those still its own), and forgets them."""
    for key, place in places.items():
        if registry.get(key) is place:
            del registry[key]
    places.clear()


class _PickleScope:
    """The registrations made while one module's pickle state is pickled (:class:`_ChildMark`).
    Dropped by the state's last mark, or, when the pickle fails before reaching it, as soon as the
    pickler drops the state, which holds the only references to this scope (a finalizer)."""

    def __init__(self):
        self.registry = _pickled_children()
        self.places: dict = {}
        weakref.finalize(self, _unregister, self.registry, self.places)

    def register(self, place: "_Place") -> None:
        """Registers ``place.child`` as the part of ``place.parent``, unless it is registered already
        (it is in the pickle's memo then: pickled at another place, not here)."""
        key = id(place.child)
        if key not in self.registry:
            self.registry[key] = self.places[key] = place

    def close(self) -> None:
        """Removes what this scope registered from the thread's registry (the pickle is done)."""
        _unregister(self.registry, self.places)


class _ChildMark:
    """A mark in a module's pickle state before each module under it (:meth:`Module.__reduce_ex__`).
    Pickled, it registers that child with its place (:meth:`_PickleScope.register`), so that the
    child pickles as the part of the module at that place (:func:`_adopt_child`: the module is in
    the pickle's memo by then) rather than as a module of its own; pickle's memo then gives every
    reference to it in the attributes, at any depth, the rebuilt one. The last mark, of no child,
    closes the scope. Each unpickles as None."""

    def __init__(self, scope: _PickleScope, place: _Place | None = None):
        self.scope, self.place = scope, place

    def __reduce_ex__(self, protocol):
        if self.place is None:
            self.scope.close()
        else:
            self.scope.register(self.place)
        return _nothing, ()


def _nothing() -> None:
    """What a :class:`_ChildMark` unpickles as."""
    return None


class _Discard:
    """A file that keeps nothing: what :meth:`Module.__reduce_ex__` pickles each part into, to see
    that it can be pickled."""

    @staticmethod
    def write(data) -> int:
        """Drops ``data`` (bytes from the pickler) and returns its length, as a file's ``write``."""
        return len(data)


class _PartPickler(pickle.Pickler):
    """Pickles a part of a module's pickle to see that it can be: the modules in it are not followed
    (each checks its own parts when it is pickled), so one referring back to the module being
    pickled (``head.backbone = enc``) does not re-enter it."""

    def persistent_id(self, obj):
        """``"module"`` for a :class:`Module` (pickled as a reference, not followed), None for any
        other object (pickled as usual): pickle's hook for objects stored outside the pickle."""
        return "module" if isinstance(obj, Module) else None


def _views_core_memory(value) -> bool:
    """Whether ``value`` is a numpy array over memory numpy does not own (a C++ buffer's view)."""
    if not isinstance(value, np.ndarray):
        return False
    while isinstance(value, np.ndarray) and not value.flags.owndata:
        value = value.base
    return not isinstance(value, np.ndarray)


#: Elements drawn at once by the weight init (8 MiB of float64).
_INIT_CHUNK = 1 << 20


def _checkpoint_view(slot: _Slot) -> np.ndarray:
    """A writeable zero-copy view of the C++ weight of ``slot`` in the checkpoint's layout (the
    C++ buffer's transpose for a transposed slot), as 2-D ``(rows, last dim)``; the rows stay in the
    C++ order (``slot.row_permutation`` maps them, see :func:`_fill_in_chunks`)."""
    view = slot.impl.parameter_view(slot.core_name)
    if slot.transposed:
        return view.T  # transposed slots are matrices (GPT-2's Conv1D)
    return view.reshape(-1, view.shape[-1])  # C-contiguous: a view, never a copy


def _fill_in_chunks(target: np.ndarray, draw, row_permutation=None) -> None:
    """Writes ``draw(shape)`` (float64 random values) into the 2-D ``target`` in row-major order,
    at most ``_INIT_CHUNK`` elements per draw: the same values as one ``draw(target.shape)`` (a
    generator's stream does not depend on how it is cut), without its whole float64 copy.
    ``row_permutation`` (int64 ``(rows,)``): the values are drawn in the checkpoint's row order,
    checkpoint row ``r`` being ``target[row_permutation[r]]`` (so a weight's initial values do not
    depend on the order the C++ module holds its rows in)."""
    rows, cols = target.shape
    if cols <= _INIT_CHUNK:
        step = _INIT_CHUNK // cols
        for r in range(0, rows, step):
            if row_permutation is None:
                block = target[r:r + step]
                block[...] = draw(block.shape)
            else:
                index = row_permutation[r:r + step]
                target[index] = draw((len(index), cols))
        return
    for r in range(rows):  # rows longer than a chunk: cut each row
        row = r if row_permutation is None else int(row_permutation[r])
        for c in range(0, cols, _INIT_CHUNK):
            part = target[row, c:c + _INIT_CHUNK]
            part[...] = draw(part.shape)
