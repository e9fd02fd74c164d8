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
    quantization int8 and GGUF (Q8_0, Q4_0, Q4_1) linear products on quantized weights;
                 quantize(model, "int8") (also exported here)
"""

from . import backward, functional, lr_scheduler, masks, multihead_forms, nn, optim, positional, quantization
from ._runtime import core as _core
from .bert import BertConfig, BertEmbeddings, BertModel, BertOutput
from .decoder import CausalLMOutput
from .gpt2 import GPT2Config, GPT2LMHeadModel, GPT2Model
from .kv_cache import KVCache
from .llama import LlamaConfig, LlamaForCausalLM, LlamaModel
from .positional import Embeddings, PositionalEncoding
from .quantization import quantize
from .sentence_encoder import SentenceEncoder, cosine_similarity, mean_pool
from .tokenizer import Tokenizer

__version__ = _core.__version__

__all__ = [
    "__version__",
    "functional",
    "backward",
    "optim",
    "lr_scheduler",
    "nn",
    "masks",
    "positional",
    "quantization",
    "quantize",
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
    "LlamaConfig",
    "LlamaModel",
    "LlamaForCausalLM",
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
