"""Reading a causal LM's checkpoint into (config, weights) — a Hugging Face directory
(``config.json`` + safetensors) or a GGUF file — without torch."""

from __future__ import annotations

import numpy as np

from ._validation import resolve_dtype
from .hub import load_safetensors, read_config, resolve_model_path

__all__ = ["load_llama_checkpoint"]


def load_llama_checkpoint(name_or_path, dtype=np.float32):
    """``(LlamaConfig, state dict, source)`` of a Llama checkpoint: a Hugging Face directory, a
    ``.gguf`` file, or the name of an embedded model (``"SmolLM2-135M-Instruct"``).

    The state dict holds numpy arrays of ``dtype`` under Hugging Face's ``LlamaForCausalLM`` names
    (GGUF blocks dequantized, q/k rows back in Hugging Face's order); ``source`` is a
    :class:`~transformer_core.gguf_file.GGUFCheckpoint` or the directory's path.

    Raises:
        FileNotFoundError: nothing at ``name_or_path``.
        ValueError: an unsupported or malformed checkpoint, naming the file.
    """
    from .llama import LlamaConfig

    dtype = resolve_dtype(dtype)
    location = resolve_model_path(name_or_path)
    if location.is_file():
        from .gguf_file import read_gguf

        checkpoint = read_gguf(location)
        return LlamaConfig.from_dict(checkpoint.config), checkpoint.state_dict(dtype), checkpoint
    config = LlamaConfig.from_dict(read_config(location))
    return config, load_safetensors(location, dtype), location
