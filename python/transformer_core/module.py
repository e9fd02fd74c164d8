"""``Module``: the Python face of a C++ layer or model that owns its weights.

A module's weights live in C++ (``self._impl``) under the names torch and Hugging Face give them in
a ``state_dict``. ``load_state_dict`` checks every name and shape first and only then copies, so a
refused load leaves the module unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ._runtime import dtype_suffix
from ._validation import resolve_dtype


class Module:
    """Base class of every layer and model: weights by name, ``state_dict``/``load_state_dict``.

    Subclasses set ``self._impl`` (the C++ object) and ``self.dtype`` (``np.float32`` or
    ``np.float64``) and implement ``forward``; calling the module calls ``forward``.
    """

    _impl = None
    dtype: type = np.float32

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):  # pragma: no cover - every subclass defines it
        """Runs the module; see the subclass."""
        raise NotImplementedError

    def _children(self) -> list[tuple[str, "Module"]]:
        """Hook for composite modules: ``[(prefix, child)]``; a leaf module has none."""
        return []

    def _slots(self) -> dict[str, tuple[object, str, tuple[int, ...]]]:
        """``{full name: (C++ object, its own name, shape)}`` over this module and its children."""
        slots = {}
        if self._impl is not None:
            for name, shape in self._impl.parameter_shapes():
                slots[name] = (self._impl, name, tuple(shape))
        for prefix, child in self._children():
            for name, slot in child._slots().items():
                slots[f"{prefix}.{name}"] = slot
        return slots

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """``{name: shape}`` of every weight, in registration order (torch's state_dict names)."""
        return {name: slot[2] for name, slot in self._slots().items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        """A copy of every weight as a numpy array of ``self.dtype``, keyed by torch's names."""
        return {name: impl.get_parameter(own) for name, (impl, own, _) in self._slots().items()}

    def _rename_state_dict(self, state: dict) -> dict:
        """Hook: maps alternative names of a checkpoint onto ours (default: none)."""
        return state

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Copies weights from ``state_dict`` (name -> array-like, e.g. torch's ``state_dict()``
        converted with ``.numpy()``, or anything ``np.asarray`` takes).

        Raises:
            ValueError: listing every missing, unknown or mis-shaped name; the module is left
                unchanged.
            TypeError: ``state_dict`` is not a mapping, or a value is not a real numeric array.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict: expected a mapping of name -> array, got {type(state_dict).__name__}")
        state = self._rename_state_dict(dict(state_dict))
        slots = self._slots()
        expected = {name: slot[2] for name, slot in slots.items()}
        arrays, problems = {}, []
        missing = [k for k in expected if k not in state]
        unknown = [k for k in state if k not in expected]
        if missing:
            problems.append(f"missing keys: {missing}")
        if unknown:
            problems.append(f"unknown keys: {unknown}")
        misshaped = []
        for name, shape in expected.items():
            if name not in state:
                continue
            value = state[name]
            if hasattr(value, "detach"):  # a torch tensor
                value = value.detach().cpu().numpy()
            arr = np.asarray(value)
            if arr.dtype.kind not in "biuf":
                raise TypeError(f"state_dict[{name!r}]: expected a real numeric array, got dtype {arr.dtype}")
            if arr.shape != shape:
                misshaped.append(f"{name}: expected {shape}, got {arr.shape}")
                continue
            arrays[name] = np.ascontiguousarray(arr, dtype=self.dtype)
        if misshaped:
            problems.append(f"mis-shaped: {misshaped}")
        if problems:
            raise ValueError(f"{type(self).__name__}.load_state_dict refused (module unchanged): " + "; ".join(problems))
        for name, arr in arrays.items():
            impl, own, _ = slots[name]
            impl.set_parameter(own, arr)

    def _init_dtype(self, dtype) -> str:
        self.dtype = resolve_dtype(dtype)
        return dtype_suffix(self.dtype)

    def _init_weights(self, seed: int | None = 0) -> None:
        """Fills the weights as torch's default init would in spirit: uniform(±1/sqrt(fan_in)) for
        matrices, ones for LayerNorm weights, zeros for biases. Deterministic for a given seed."""
        rng = np.random.default_rng(seed)
        state = {}
        for name, shape in self.parameter_shapes().items():
            if len(shape) >= 2:
                bound = 1.0 / np.sqrt(shape[-1])
                state[name] = rng.uniform(-bound, bound, size=shape)
            elif name.endswith("weight") and ("norm" in name.lower() or name.split(".")[-2].startswith("ln_")):
                state[name] = np.ones(shape)
            else:
                state[name] = np.zeros(shape)
        self.load_state_dict(state)
