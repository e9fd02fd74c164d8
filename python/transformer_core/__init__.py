"""transformer_core: a numpy-first Transformer engine.

The core is C++ (OpenMP-parallel, xtensor containers; fp32 matrix products in its own AVX-512 / AVX2 /
AMX kernels chosen at run time, BLAS for fp64 and CPUs without AVX2) behind pybind11; this package
is its Python face: numpy arrays in, numpy arrays out.

Layers of the package, from the bottom:
    functional   linear, softmax, layer_norm, gelu, relu, scaled_dot_product_attention
    positional   sinusoidal / learned positional encodings, RoPE
    masks        causal and padding masks, converters from other conventions
    module       Module (a C++ layer that owns its weights: state_dict, load_state_dict); manual_seed,
                 get/set_rng_state; NoTrainingStateError, WeightsChangedError, NonFiniteLossError
    nn           MultiheadAttention (GQA/MQA), FeedForward, LayerNorm, Transformer{Encoder,Decoder}[Layer],
                 Transformer (torch.nn's names)
    multihead_forms  weight conversions between the tutorials' multi-head forms and ours
    hub          finding a model on disk (a directory, a .gguf file, an embedded model's package);
                 config.json and safetensors weights
    gguf_file    reading a GGUF checkpoint (llama.cpp's single-file format) into numpy
    tokenizer    Tokenizer (Hugging Face tokenizers: WordPiece, byte-level BPE; tokenizer.json or GGUF)
    bert         BertEmbeddings, BertModel (Hugging Face checkpoints, no torch)
    kv_cache     KVCache, the keys and values a decoder keeps between steps
    generation   generate for every causal LM (greedy, sampling, repetition penalty): GenerationMixin
    decoder      the decoder stack every causal LM shares: DecoderModel, CausalLM, CausalLMOutput
    gpt2         GPT2Model, GPT2LMHeadModel
    llama        LlamaModel, LlamaForCausalLM (SmolLM2; Hugging Face directory or GGUF file)
    checkpoints  a causal LM's checkpoint read (directory or GGUF), save_pretrained's files written atomically
    sentence_encoder  SentenceEncoder (all-MiniLM-L6-v2 embeddings)
    quantization int8 and GGUF (Q8_0, Q4_0, Q4_1) linear products on quantized weights;
                 quantize(model, "int8") (also exported here)
    seq2seq      Seq2SeqTransformer (embeddings + nn.Transformer + output layer, trainable)
    training     save_checkpoint / load_checkpoint, manual_seed, get/set_rng_state; with backward, optim, lr_scheduler:
                 training (model.train(), loss, backward, AdamW, schedules, clipping)
    chat_template  a model's Jinja2 chat template rendered as Hugging Face transformers renders it
    chat         ChatSession: a conversation with a causal LM, its KV cache kept between turns
    corpus       embedding a corpus file in resumable chunks (.npy or Parquet), and searching the result
    distributed  corpus's embedding job on a Dask cluster (transformer_core[distributed])
    __main__     the command line: python -m transformer_core embed / search / chat / generate
"""


def _module_run_by(argv: list) -> str | None:
    """The module that the interpreter's command line ``argv`` (``sys.orig_argv``) runs with ``-m``,
    or None (a script, ``-c``, standard input): its options are read as Python reads them, up to
    the first word that is not one (``-um NAME``, ``-Bm NAME``, ``-mNAME``, ``-W arg -m NAME``), so
    a program's own arguments never count."""
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--check-hash-based-pycs":  # the one long option that takes a value
            i += 2
            continue
        if not word.startswith("-") or word in ("-", "--") or word.startswith("--"):
            return None
        for j, flag in enumerate(word[1:], start=1):
            rest = word[j + 1:]
            if flag == "c":
                return None
            if flag == "m":
                return rest or (argv[i + 1] if i + 1 < len(argv) else None)
            if flag in "WX":  # its value is the rest of the word, or the next word
                i += 0 if rest else 1
                break
        i += 1
    return None


def _interrupted_while_starting(signum, frame) -> None:
    """The SIGINT handler of a command-line run until ``__main__.main`` takes over: the CLI's one
    line on stderr and exit code 2 at once, as for any interrupt (``__main__``'s "Errors"), nothing
    having been done. Raising KeyboardInterrupt instead gave a traceback wherever it landed: in the
    package's imports, in a compiled module's initialisation (which turns it into an ImportError,
    or loses it), or while Python compiles ``__main__.py``."""
    import os

    try:
        os.write(2, b"transformer_core: interrupted while starting; nothing was done\n")
    except OSError:  # standard error closed or full: the exit code still says it
        pass
    os._exit(2)


def _catch_interrupts_while_starting() -> None:
    """In a command-line run (``python -m transformer_core ...``, also as
    ``-m transformer_core.__main__``, or ``transformer-core``), installs
    :func:`_interrupted_while_starting` as the SIGINT handler, unless the process has a handler of
    its own (``SIG_IGN`` under ``nohup``, say). A program that imports the package keeps Python's
    own (its KeyboardInterrupt), and so does a process that multiprocessing started for the CLI (a
    Dask worker of ``embed --workers``: "spawn" gives it the CLI's ``sys.argv``, and no ``main``
    would ever take the handler back)."""
    import os
    import signal
    import sys

    started_by = sys.modules.get("multiprocessing")  # imported already in such a child: no import here
    if started_by is not None and started_by.parent_process() is not None:
        return
    as_module = _module_run_by(list(getattr(sys, "orig_argv", ()))) in ("transformer_core", "transformer_core.__main__")
    as_script = bool(sys.argv) and os.path.basename(sys.argv[0]) == "transformer-core"
    global _CLI_RUN
    if (as_module or as_script) and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        try:
            signal.signal(signal.SIGINT, _interrupted_while_starting)
            _CLI_RUN = True
        except ValueError:  # not the main thread: no handler can be set there
            pass


#: Whether this process is a command-line run whose SIGINT handling the package took over.
_CLI_RUN = False


def _cli_finished() -> None:
    """``__main__.main`` has returned in a command-line run: the work is done and reported, so a
    Ctrl-C while the interpreter exits is ignored (a KeyboardInterrupt there ended the process by
    SIGINT, a shell's 130, after a command that had succeeded)."""
    import signal

    if _CLI_RUN:
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:  # main called from another thread
            pass


def _cli_started() -> None:
    """``__main__.main`` has taken over: Python's own SIGINT handler again (a KeyboardInterrupt,
    which ``main`` reports in its one line after the command's own cleanup)."""
    import signal

    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        except ValueError:  # main called from another thread: the handler stays (it exits as main would)
            pass


_catch_interrupts_while_starting()  # before the imports below, the slow part of starting

from . import (  # noqa: E402
    backward,
    functional,
    lr_scheduler,
    masks,
    multihead_forms,
    nn,
    optim,
    positional,
    quantization,
    training,
)
from ._runtime import core as _core  # noqa: E402
from ._validation import check_int  # noqa: E402
from .bert import BertConfig, BertEmbeddings, BertModel, BertOutput  # noqa: E402
from .decoder import CausalLMOutput  # noqa: E402
from .gpt2 import GPT2Config, GPT2LMHeadModel, GPT2Model  # noqa: E402
from .kv_cache import KVCache  # noqa: E402
from .llama import LlamaConfig, LlamaForCausalLM, LlamaModel  # noqa: E402
from .module import (  # noqa: E402
    NonFiniteLossError,
    NoTrainingStateError,
    WeightsChangedError,
    get_rng_state,
    manual_seed,
    set_rng_state,
)
from .positional import Embeddings, PositionalEncoding  # noqa: E402
from .quantization import quantize  # noqa: E402
from .sentence_encoder import SentenceEncoder, cosine_similarity, mean_pool  # noqa: E402
from .seq2seq import Seq2SeqTransformer  # noqa: E402
from .tokenizer import Tokenizer  # noqa: E402

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
    "training",
    "manual_seed",
    "get_rng_state",
    "set_rng_state",
    "NoTrainingStateError",
    "WeightsChangedError",
    "NonFiniteLossError",
    "Seq2SeqTransformer",
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
    "blas_info",
]


def get_num_threads() -> int:
    """Threads the C++ core uses in the calling thread: the process-wide count that
    :func:`set_num_threads` sets (default: ``OMP_NUM_THREADS``, else the core count; 1 in a forked
    process, see :func:`set_num_threads`), lowered by an OpenMP limit set in this thread
    (threadpoolctl's ``threadpool_limits``)."""
    return _core.get_num_threads()


def blas_info() -> str:
    """The BLAS behind the matrix products, e.g. ``"mkl: Intel(R) oneAPI Math Kernel Library Version
    2026.2 ... (sequential, CNR AUTO,STRICT)"`` or ``"openblas: OpenBLAS 0.3.21 ... (core SkylakeX)"``.

    Chosen once at import (``TC_BLAS``: ``auto`` = ``openblas``, the default, or ``mkl``: Intel MKL
    from pip's ``mkl`` package, opt-in because a torch imported afterwards would share its
    single-threaded layer). See ``_runtime._choose_blas`` and bench/README.md, "Which BLAS".
    """
    return _core.blas_info()


def set_num_threads(n: int) -> None:
    """Sets the threads the C++ core uses, for the whole process: every Python thread, including
    ones started later, sees ``n`` (OpenMP's own count is per OS thread; the library keeps its own).
    Results are bitwise the same for any count (the work is cut by the shapes alone).

    A forked process (``multiprocessing``'s default start method on Linux, ``os.fork``) starts on
    one thread: OpenMP (libgomp) cannot start again in the child the threads its parent ran (ours,
    or another library's in the same libgomp, torch's), and the child's first parallel region
    would wait for them forever. This function raises the count again only in a child of a
    process that ran none of the core's threads (at the user's risk if another library ran its
    own). Start processes with the ``"spawn"`` or ``"forkserver"`` method for more threads.

    Args:
        n: an int in ``[1, 1024]`` (``_core.max_num_threads``; more threads than that only
            oversubscribe any machine this runs on).

    Raises:
        TypeError: ``n`` not an int. ValueError: ``n`` outside ``[1, 1024]``, or above 1 in a
            process forked after the core ran threads in its parent.
    """
    _core.set_num_threads(check_int(n, "n", 1, _core.max_num_threads))
