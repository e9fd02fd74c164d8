"""Checkpoints of training: a model, its optimizer and its learning-rate schedule as safetensors
files (no pickle), under the model's ``state_dict`` names, so that a model trained here loads in
torch (``safetensors.torch.load_file`` + ``load_state_dict``, or ``from_pretrained`` of a directory
written by ``save_pretrained``) and back.

    directory/model.safetensors       the model's state_dict (checkpoint names and layouts)
    directory/optimizer.safetensors   optimizer.state_dict() (see transformer_core.optim)
    directory/scheduler.safetensors   scheduler.state_dict() (see transformer_core.lr_scheduler)

Optimizer moments of weights that the checkpoint stores transposed (GPT-2's Conv1D weights) are
written in the checkpoint's layout too, as torch's optimizer would hold them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .module import Module, NonFiniteLossError, NoTrainingStateError, manual_seed

__all__ = ["save_checkpoint", "load_checkpoint", "manual_seed", "NoTrainingStateError", "NonFiniteLossError"]


def _transposed_names(model: Module) -> set[str]:
    return {name for name, p in model.named_parameters() if getattr(p, "transposed", False)}


def _optimizer_layout(state: dict, transposed: set[str]) -> dict:
    """Transposes the 2-D per-parameter arrays of the names in ``transposed`` (an involution)."""
    out = {}
    for key, value in state.items():
        head, _, rest = key.partition(".")
        name = rest.rpartition(".")[0]
        if head == "state" and name in transposed and np.ndim(value) == 2:
            value = np.ascontiguousarray(np.asarray(value).T)
        out[key] = value
    return out


def save_checkpoint(directory, model: Module, optimizer=None, scheduler=None) -> None:
    """Writes the model (and the optimizer's and scheduler's states) under ``directory``.

    Raises:
        TypeError: ``model`` not a :class:`~transformer_core.module.Module`.
        OSError: the directory cannot be written.
    """
    from safetensors.numpy import save_file

    if not isinstance(model, Module):
        raise TypeError(f"model: expected a transformer_core Module, got {type(model).__name__}")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    save_file(model.state_dict(), str(path / "model.safetensors"), metadata={"format": "np"})
    if optimizer is not None:
        state = _optimizer_layout(optimizer.state_dict(), _transposed_names(model))
        save_file({k: np.asarray(v, order="C") for k, v in state.items()}, str(path / "optimizer.safetensors"))
    if scheduler is not None:
        save_file({k: np.asarray(v, order="C") for k, v in scheduler.state_dict().items()},
                  str(path / "scheduler.safetensors"))


def load_checkpoint(directory, model: Module, optimizer=None, scheduler=None) -> None:
    """Reads what :func:`save_checkpoint` wrote into ``model`` (and ``optimizer``, ``scheduler``,
    which must hold the same parameters by name: see ``Optimizer.load_state_dict``).

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: names or shapes that do not match (listed, nothing changed).
    """
    from safetensors.numpy import load_file

    path = Path(directory)
    for name, wanted in (("model", True), ("optimizer", optimizer is not None), ("scheduler", scheduler is not None)):
        if wanted and not (path / f"{name}.safetensors").is_file():
            raise FileNotFoundError(f"directory: no {name}.safetensors in {path}")
    model.load_state_dict(load_file(str(path / "model.safetensors")))
    if optimizer is not None:
        state = load_file(str(path / "optimizer.safetensors"))
        optimizer.load_state_dict(_optimizer_layout(state, _transposed_names(model)))
    if scheduler is not None:
        scheduler.load_state_dict(load_file(str(path / "scheduler.safetensors")))
