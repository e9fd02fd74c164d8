"""transformer_core: a numpy-first Transformer engine.

The core is C++ (OpenMP-parallel, xtensor containers, OpenBLAS for matrix products) behind
pybind11; this package is its Python face: numpy arrays in, numpy arrays out.

Layers of the package, from the bottom:
    functional   linear, softmax, layer_norm, gelu, relu, scaled_dot_product_attention
    positional   sinusoidal / learned positional encodings, RoPE
    masks        causal and padding masks, converters from other conventions
    nn           MultiheadAttention (GQA/MQA), FeedForward, LayerNorm, Transformer{Encoder,Decoder}[Layer],
                 Transformer (torch.nn's names)
    multihead_forms  weight conversions between the tutorials' multi-head forms and ours
    bert         BertEmbeddings, BertModel (Hugging Face checkpoints, no torch)
    gpt2         GPT2Model, GPT2LMHeadModel, KVCache (decoding with a KV cache, generate)
    sentence_encoder  SentenceEncoder (all-MiniLM-L6-v2 embeddings)
"""

import os as _os


def _choose_openblas_kernels() -> None:
    """OpenBLAS 0.3.21 (Debian 12) predates AMD's AVX-512 cores (Zen 4/5) and gives them its AVX2
    "Haswell" kernels; its SkylakeX kernels are ~1.6x faster there. For a DYNAMIC_ARCH build the
    kernel set is chosen when the library loads, from ``OPENBLAS_CORETYPE``: set it to SkylakeX when
    the CPU has the AVX-512 subsets those kernels use, unless the user already chose."""
    if "OPENBLAS_CORETYPE" in _os.environ:
        return
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= set(flags):
        _os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"


_choose_openblas_kernels()  # before _core (and with it libopenblas) is loaded

# ruff: noqa: E402 (the imports below must follow the OpenBLAS choice above)
from . import _core, functional, masks, multihead_forms, nn, positional
from .bert import BertConfig, BertEmbeddings, BertModel, BertOutput
from .gpt2 import CausalLMOutput, GPT2Config, GPT2LMHeadModel, GPT2Model, KVCache
from .positional import Embeddings, PositionalEncoding
from .sentence_encoder import SentenceEncoder, cosine_similarity, mean_pool
from .tokenizer import Tokenizer

__version__ = _core.__version__

__all__ = [
    "__version__",
    "functional",
    "nn",
    "masks",
    "positional",
    "multihead_forms",
    "PositionalEncoding",
    "Embeddings",
    "BertConfig",
    "BertEmbeddings",
    "BertModel",
    "BertOutput",
    "GPT2Config",
    "GPT2Model",
    "GPT2LMHeadModel",
    "KVCache",
    "CausalLMOutput",
    "SentenceEncoder",
    "Tokenizer",
    "cosine_similarity",
    "mean_pool",
    "get_num_threads",
    "set_num_threads",
]


def get_num_threads() -> int:
    """Threads the C++ core uses (OpenMP's; ``OMP_NUM_THREADS`` sets the default)."""
    return _core.get_num_threads()


def set_num_threads(n: int) -> None:
    """Sets the threads the C++ core (and OpenBLAS, which shares its OpenMP runtime) uses.

    Raises:
        TypeError: ``n`` not an int. ValueError: ``n`` < 1.
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n: expected an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"n: expected an int >= 1, got {n}")
    _core.set_num_threads(n)
