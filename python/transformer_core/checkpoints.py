"""Reading a causal LM's checkpoint into (config, weights) — a Hugging Face directory
(``config.json`` + safetensors) or a GGUF file — without torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .hub import load_safetensors, read_config, resolve_model_dir

__all__ = ["load_llama_checkpoint"]


def load_llama_checkpoint(name_or_path, dtype=np.float32):
    """``(LlamaConfig, state dict of numpy arrays (Hugging Face names), extras)`` of a Llama
    checkpoint: a Hugging Face directory, or a ``.gguf`` file.

    ``extras`` holds what else the file carries (``{"source": path, ...}``).

    Raises:
        FileNotFoundError: nothing at ``name_or_path``.
        ValueError: an unsupported or malformed checkpoint, naming the file.
    """
    from .llama import LlamaConfig

    path = Path(name_or_path) if isinstance(name_or_path, (str, Path)) else None
    if path is not None and path.suffix == ".gguf":
        raise NotImplementedError("GGUF loading arrives with the GGUF reader")
    model_dir = resolve_model_dir(name_or_path)
    config = LlamaConfig.from_dict(read_config(model_dir))
    return config, load_safetensors(model_dir), {"source": str(model_dir)}
