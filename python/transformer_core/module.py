"""``Module``: the Python face of a C++ layer or model that owns its weights.

A module's weights live in C++ (``self._impl``) under the names torch and Hugging Face give them in
a ``state_dict``. ``load_state_dict`` checks every name and shape first and only then copies, so a
refused load leaves the module unchanged.

A model whose checkpoint names or layouts differ from the C++ registry maps them with two hooks:
``_public_name`` (C++ name -> checkpoint name) and ``_transposed`` (checkpoint names stored as the
transpose of the C++ weight, e.g. GPT-2's Conv1D ``(in, out)`` weights over ``nn.Linear``'s
``(out, in)``).

Quantized weights (:func:`transformer_core.quantize`, GGUF blocks from
``LlamaForCausalLM.from_pretrained``): ``state_dict`` returns them dequantized to float32 (the values
the kernels multiply by), :meth:`Module.weight_formats` says how each is stored, and
``load_state_dict`` refuses a module that holds any (load into a float model, then quantize it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from ._runtime import dtype_suffix
from ._validation import as_weight, resolve_dtype


class _Slot(NamedTuple):
    impl: object          # the C++ module holding the weight
    core_name: str        # its name there
    shape: tuple          # the checkpoint's shape (transposed for a transposed slot)
    transposed: bool


_SKIP_INIT = threading.local()


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


class Module:
    """Base class of every layer and model: weights by name, ``state_dict``/``load_state_dict``.

    Subclasses set ``self._impl`` (the C++ object) and ``self.dtype`` (``np.float32`` or
    ``np.float64``) and implement ``forward``; calling the module calls ``forward``. The arguments a
    module was built with are kept (``_init_args``), so that :func:`transformer_core.quantize` can
    build a copy of it.
    """

    _impl = None
    dtype: type = np.float32

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        self._init_args = (args, kwargs)
        return self

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

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

    def _transposed(self, name: str) -> bool:
        """Whether the checkpoint stores weight ``name`` as the transpose of the C++ one."""
        return False

    def _rename_state_dict(self, state: dict) -> dict:
        """Maps alternative names of a checkpoint onto ours before loading (default: none)."""
        return state

    # ---- the registry --------------------------------------------------------------------------
    def _slots(self) -> dict[str, _Slot]:
        """``{name: _Slot}`` over this module and its children, in registration order."""
        slots = {}
        if self._impl is not None:
            for core_name, shape in self._impl.parameter_shapes():
                name = self._public_name(core_name)
                if name is None:
                    continue
                transposed = self._transposed(name)
                shape = tuple(shape)
                slots[name] = _Slot(self._impl, core_name, shape[::-1] if transposed else shape, transposed)
        for prefix, child in self._children():
            for name, slot in child._slots().items():
                slots[f"{prefix}.{name}"] = slot
        return slots

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """``{name: shape}`` of every weight, in registration order (the checkpoint's names)."""
        return {name: slot.shape for name, slot in self._slots().items()}

    def _impls(self) -> list:
        """The C++ objects of this module and of its children (each once)."""
        out = [] if self._impl is None else [self._impl]
        for _, child in self._children():
            out += [impl for impl in child._impls() if all(impl is not o for o in out)]
        return out

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

    def state_dict(self) -> dict[str, np.ndarray]:
        """A copy of every weight as a numpy array of ``self.dtype``, keyed by the checkpoint's names
        (torch's / Hugging Face's), in the checkpoint's layout. Quantized weights are returned
        dequantized (float32: the values the quantized kernels multiply by)."""
        out = {}
        for name, slot in self._slots().items():
            value = slot.impl.get_parameter(slot.core_name)
            out[name] = np.ascontiguousarray(value.T) if slot.transposed else value
        return out

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Copies weights from ``state_dict`` (name -> array-like: numpy arrays, torch tensors, or
        anything ``np.asarray`` takes), converted to ``self.dtype``.

        Raises:
            TypeError: ``state_dict`` is not a mapping, or a value is not a real floating-point or
                integer-valued array (bool, complex, object and string arrays are refused).
            ValueError: listing every missing, unknown or mis-shaped name; the module is left
                unchanged. Also when the module holds quantized weights (``weight_formats``): load
                the state into a float model and quantize that.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict: expected a mapping of name -> array, got {type(state_dict).__name__}")
        quantized = {n: f for n, f in self.weight_formats().items() if f not in ("float32", "float64")}
        if quantized:
            first = next(iter(quantized.items()))
            raise ValueError(f"{type(self).__name__}.load_state_dict refused (module unchanged): {len(quantized)} "
                             f"weights are held quantized ({first[0]}: {first[1]}, ...); load the state into a "
                             f"float model and quantize it (transformer_core.quantize)")
        state = self._rename_state_dict(dict(state_dict))
        slots = self._slots()
        arrays, problems, misshaped = {}, [], []
        missing = [k for k in slots if k not in state]
        unknown = [k for k in state if k not in slots]
        if missing:
            problems.append(f"missing keys: {missing}")
        if unknown:
            problems.append(f"unknown keys: {unknown}")
        for name, slot in slots.items():
            if name not in state:
                continue
            arr = as_weight(state[name], f"state_dict[{name!r}]", self.dtype)
            if arr.shape != slot.shape:
                misshaped.append(f"{name}: expected {slot.shape}, got {arr.shape}")
                continue
            arrays[name] = np.ascontiguousarray(arr.T) if slot.transposed else arr
        if misshaped:
            problems.append(f"mis-shaped: {misshaped}")
        if problems:
            raise ValueError(f"{type(self).__name__}.load_state_dict refused (module unchanged): " + "; ".join(problems))
        for name, arr in arrays.items():
            slot = slots[name]
            slot.impl.set_parameter(slot.core_name, arr)

    # ---- construction helpers ------------------------------------------------------------------
    def _init_dtype(self, dtype) -> str:
        self.dtype = resolve_dtype(dtype)
        return dtype_suffix(self.dtype)

    def _init_weights(self, seed: int | None = 0) -> None:
        """Fills the weights as torch's default init would in spirit: uniform(±1/sqrt(fan_in)) for
        matrices, ones for norm weights, zeros for biases. Deterministic for a given seed. Skipped
        inside :func:`skip_weight_init` (the weights stay zeros)."""
        if getattr(_SKIP_INIT, "on", False):
            return
        rng = np.random.default_rng(seed)
        state = {}
        for name, slot in self._slots().items():
            shape = slot.shape
            if len(shape) >= 2:
                fan_in = shape[0] if slot.transposed else shape[-1]
                state[name] = rng.uniform(-1.0 / np.sqrt(fan_in), 1.0 / np.sqrt(fan_in), size=shape)
            elif name.endswith("weight") and _is_norm_weight(name):
                state[name] = np.ones(shape)
            else:
                state[name] = np.zeros(shape)
        self.load_state_dict(state)


def _is_norm_weight(name: str) -> bool:
    parts = name.split(".")
    return "norm" in name.lower() or (len(parts) >= 2 and parts[-2].startswith("ln_"))
