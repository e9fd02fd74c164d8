"""The classes of bad input found by a hostile review, each with its examples (the property suite,
test_properties.py, covers the classes at large):

1. huge sizes neither hang nor overflow;  2. sizes no machine can hold are a named ValueError, not
MemoryError or the OOM killer;  3. wrong-typed config fields are named;  4. no silent wrong answer;
5. errors name the argument;  6. real checkpoints load in every float dtype (bf16, fp16);
7. CLI errors are one line, exit code 2;
9. the thread count is process-wide;  10. float64 LayerNorm on rows far from zero.
(8, GPT-2 with left padding, is tested in test_models_gpt2.py; the split-KV determinism of 9 in
test_ops_flash_attention.py.)

Calls that used to hang or exhaust memory run in a subprocess with a timeout, so a regression fails
one test instead of the run.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import MODEL_DIR, SENTENCES, refusal_peak

ROOT = Path(__file__).resolve().parent.parent
#: The directory holding the transformer_core this process imported (the installed package in CI, the
#: source tree in a development build): the subprocesses import the same one.
PACKAGE_ROOT = str(Path(tc.__file__).parent.parent)
F = tc.functional


def run_isolated(code: str, timeout: float = 120) -> str:
    """Runs ``code`` in a fresh interpreter (a hang or a crash fails this test only); returns the
    ``Type: message`` of the exception it raises (the code must raise)."""
    wrapped = ("import numpy as np, transformer_core as tc\nF = tc.functional\ntry:\n"
               + "".join(f"    {line}\n" for line in code.strip().splitlines())
               + "except Exception as e:\n    print(type(e).__name__ + ': ' + str(e))\nelse:\n    print('NO ERROR')\n")
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, env.get("PYTHONPATH")]))
    p = subprocess.run([sys.executable, "-c", wrapped], capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, f"exit code {p.returncode}: {p.stderr[-2000:]}"
    return p.stdout.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------------------
# 1 and 2: huge sizes: a named ValueError, fast, before anything is allocated
# ------------------------------------------------------------------------------------------------
HUGE = [
    ("tc.KVCache(1, 2**31, 2**31, 2**31)", "num_layers, batch, num_key_value_heads, head_dim, capacity"),
    ("tc.KVCache(2**40, 1, 1, 1)", "num_layers"),
    ("tc.KVCache(1, 1, 1, 1).reserve(2**62)", "total"),
    ("tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(8, 2, 16), 2**31)", "num_layers"),
    ("tc.nn.TransformerDecoder(tc.nn.TransformerDecoderLayer(8, 2, 16), 2**40)", "num_layers"),
    ("tc.nn.MultiheadAttention(2**31, 1)", "embed_dim"),
    ("tc.nn.MultiheadAttention(8, 2, kdim=2**62)", "kdim"),
    ("tc.nn.FeedForward(8, 2**62)", "dim_feedforward"),
    ("tc.nn.GatedFeedForward(2**40, 8)", "d_model"),
    ("tc.nn.TransformerEncoderLayer(2**40, 1, 8)", "d_model"),
    ("tc.nn.Linear(2**40, 2**40)", "in_features"),
    ("tc.nn.Embedding(2**62, 2**62)", "num_embeddings"),
    ("tc.nn.LayerNorm(2**62)", "normalized_shape"),
    ("tc.nn.Linear(2**63, 1)", "in_features"),  # not an int64 at all
    ("F.rotary_cos_sin(2**40, 2)", "seq_len"),
    ("F.sinusoidal_positional_encoding(2**40, 8)", "max_len"),
    ("tc.masks.causal_mask(2**31)", "L"),
    ("tc.masks.causal_mask(4, 2**62)", "S"),
    ("tc.masks.padding_mask([1, 2**40])", "lengths"),
    ("tc.backward.embedding_backward([0], np.ones((1, 4)), 2**62)", "num_embeddings"),
    ("tc.BertModel(tc.BertConfig(num_hidden_layers=2**40, hidden_size=8, num_attention_heads=2, vocab_size=4, "
     "intermediate_size=8, max_position_embeddings=8))", "num_hidden_layers"),
    ("tc.BertModel(tc.BertConfig(vocab_size=2**40))", "vocab_size"),
    ("tc.GPT2Model({'n_layer': 2**40, 'n_embd': 8, 'n_head': 2, 'vocab_size': 4, 'n_positions': 8})", "n_layer"),
    ("tc.GPT2Model({'n_embd': 2**62, 'n_head': 1, 'n_layer': 1})", "n_embd"),
    ("tc.LlamaModel({'num_attention_heads': 2**40, 'hidden_size': 8, 'num_hidden_layers': 1})",
     "num_attention_heads"),
    ("tc.set_num_threads(2**31)", "n"),
]


@pytest.mark.parametrize("code, name", HUGE, ids=[c for c, _ in HUGE])
def test_huge_sizes_are_named_value_errors(code, name):
    out = run_isolated(code, timeout=120)
    assert out.startswith("ValueError: ") or out.startswith("TypeError: "), out
    assert name in out, out


INIT_UNDER_RLIMIT = [
    ("tc.nn.Linear(4096, 4096)", 4096 * 4096 * 4),
    ("tc.nn.Linear(4096, 4096, dtype=np.float64)", 4096 * 4096 * 8),
    ("tc.nn.Embedding(4096, 4096)", 4096 * 4096 * 4),
    ("tc.nn.Embedding(4096, 4096, np.float64, padding_idx=5)", 4096 * 4096 * 8),
    ("tc.nn.FeedForward(2048, 4096)", 2 * 2048 * 4096 * 4),
]


@pytest.mark.parametrize("code, weight_bytes", INIT_UNDER_RLIMIT, ids=[c for c, _ in INIT_UNDER_RLIMIT])
def test_initial_weights_need_no_float64_copy(code, weight_bytes):
    """A layer whose weights fit (the C++ allocation check passed) must not then exhaust memory
    drawing its initial values: they were drawn as one float64 array per matrix plus a converted
    copy (~16 bytes per float32 element). Under an address-space limit of the weights' own bytes
    plus half as much again, the layer builds (and is initialised) or raises ValueError, never
    MemoryError."""
    limit_code = (
        "import resource\n"
        "size = [int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmSize')][0]\n"
        f"resource.setrlimit(resource.RLIMIT_AS, (size + {weight_bytes * 3 // 2 + 2**24}, resource.RLIM_INFINITY))\n"
        f"m = {code}\n"
        "p = m.named_parameters()[0][1].data\n"  # a zero-copy view: no copy under the limit
        "assert min(np.count_nonzero(p[0]), np.count_nonzero(p[-1])) > p.shape[1] // 2, 'not initialised'\n"
        "raise ValueError('built')\n")
    out = run_isolated(limit_code, timeout=120)
    assert out.startswith("ValueError: "), out


def test_outputs_larger_than_memory(rng):
    """Small inputs whose product no machine holds: the output's allocation is checked."""
    x = np.ones((2**20, 1), np.float32)
    with pytest.raises(ValueError, match="out_features|output"):
        F.linear(x, np.ones((2**20, 1), np.float32))  # (2**20, 2**20) floats
    q = np.ones((1, 2**20, 1), np.float32)
    with pytest.raises(ValueError, match="return_weights"):
        F.scaled_dot_product_attention(q, q, q, return_weights=True)  # (1, 1, 2**20, 2**20) weights
    ff = tc.nn.FeedForward(1, 2**19)
    with pytest.raises(ValueError, match=r"\bx\b"):
        ff(np.ones((2**22, 1), np.float32))  # hidden (2**22, 2**19) floats
    # Two boolean masks combined: (1, 2, 2**20, 2**20). (A key_mask shared by the heads is read in
    # place, never combined: a per-head one is.)
    q4 = np.ones((1, 2, 2**20, 1), np.float32)
    with pytest.raises(ValueError, match="combination"):
        F.scaled_dot_product_attention(q4, q4, q4, query_mask=np.ones((1, 1, 2**20), bool),
                                       key_mask=np.ones((1, 2, 2**20), bool))


def _under_memory_limit(code: str) -> str:
    """``code`` run isolated under an address-space limit of 1 GiB more than the interpreter holds:
    an unchecked copy fails there with MemoryError instead of exhausting the machine."""
    return run_isolated("import resource\n"
                        "size = [int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmSize')][0]\n"
                        "resource.setrlimit(resource.RLIMIT_AS, (size + 2**30, resource.RLIM_INFINITY))\n" + code,
                        timeout=120)


@pytest.mark.parametrize("code", [
    "tc.nn.LayerNorm(tc._validation.physical_memory_bytes() // 6)",
    "tc.nn.LayerNorm(tc._validation.physical_memory_bytes() // 12, dtype=np.float64)",
])
def test_layer_norm_checks_weight_and_bias_together(code):
    """Each of LayerNorm's tables (weight, bias: 2/3 of this machine's memory each) fits, the two do
    not: the C++ layer checked one table at a time, filled the weight, then failed on the bias
    (std::bad_alloc, naming nothing, or the OOM killer). Now both are checked together first,
    naming normalized_shape (under an address-space limit of 1 GiB more than the interpreter
    holds, so that old code fails with MemoryError rather than exhausting the machine)."""
    out = _under_memory_limit(code)
    assert out.startswith("ValueError: normalized_shape"), out
    assert "memory" in out, out


#: Broadcast views (stride 0: a few bytes) of shapes whose C-contiguous copy no machine holds (64 TiB
#: and more): the conversion to the ops' contiguous arrays is checked, naming the argument.
BROADCAST_INPUTS = [
    ("F.gelu(big)", "x"),
    ("F.relu(big)", "x"),
    ("F.softmax(big)", "x"),
    ("F.rms_norm(big)", "x"),
    ("F.layer_norm(np.broadcast_to(np.float64(1), (2**22, 2**22)))", "x"),
    ("F.linear(big, np.ones((4, 2**22), np.float32))", "x"),
    ("F.linear(np.ones((2, 2**22), np.float32), big)", "weight"),
    ("F.glu(big, big)", "gate"),
    ("F.relu(np.broadcast_to(np.int8(3), (2, 4)))", None),  # one that fits: converted as before
    ("F.dropout(big, 0.5, 0)", "x"),
    ("F.cross_entropy(big, np.zeros(2**22, np.int64))", "logits"),
    ("F.scaled_dot_product_attention(np.broadcast_to(np.float32(1), (1, 1, 2**42, 8)), small, small)", "query"),
    ("F.scaled_dot_product_attention(small, np.broadcast_to(np.float32(1), (1, 1, 2**42, 8)), small)", "key"),
    ("F.scaled_dot_product_attention(small, small, np.broadcast_to(np.int16(1), (1, 1, 4, 2**42)))", "value"),
    # Embedding flattened its ids before converting them: reshape(-1) copies all of a broadcast view
    # whose strides do not merge (a MemoryError), and returns a view of one that holds one value
    ("tc.nn.Embedding(4, 2)(np.broadcast_to(np.arange(2**20) % 4, (2**20, 2**20)).T)", "input_ids"),
    ("tc.nn.Embedding(4, 2)(np.broadcast_to(np.arange(2**10, dtype=np.int32)[:, None] % 4, (2**10, 2**30)))",
     "input_ids"),
    ("tc.nn.Embedding(4, 2)(np.broadcast_to(np.int64(1), (2**20, 2**20)))", "input_ids"),
    ("tc.Embeddings(4, 2, 2**21)(np.broadcast_to(np.int64(1), (2**21, 2**21)))", "input_ids"),
    # float ids: their whole-number check (isfinite, mod) made arrays of the view's whole size first
    ("tc.nn.Embedding(4, 2)(np.broadcast_to(np.float64(1), (2**20, 2**20)))", "input_ids"),
    ("tc.nn.Embedding(4, 2)(np.broadcast_to(np.arange(2**20) % 4.0, (2**20, 2**20)).T)", "input_ids"),
    ("tc.masks.padding_mask_from_ids(np.broadcast_to(np.float32(0), (2**20, 2**20)), 0)", "input_ids"),
    ("tc.masks.padding_mask_from_ids(np.broadcast_to(np.arange(2**20, dtype=np.uint64)[:, None], (2**20, 2**20)), 0)",
     "input_ids"),
]


@pytest.mark.parametrize("code, name", BROADCAST_INPUTS, ids=[c for c, _ in BROADCAST_INPUTS])
def test_broadcast_inputs_larger_than_memory_are_named(code, name):
    """A stride-0 view is made C-contiguous by the ops' argument conversion: checked against memory
    first (it was a numpy MemoryError, or below the machine's size a silent copy of all of it)."""
    setup = ("big = np.broadcast_to(np.float32(1), (2**22, 2**22))\n"
             "small = np.ones((1, 1, 4, 8), np.float32)\n")
    out = _under_memory_limit(setup + f"y = {code}\n"
                              + ("raise ValueError(f'ok {y.shape} {y.dtype} {y.sum()}')" if name is None else ""))
    if name is None:  # a broadcast view that fits is converted as before
        assert out == "ValueError: ok (2, 4) float32 24.0", out
        return
    assert out.startswith(f"ValueError: {name}: an array of shape "), out
    assert "more than this machine's memory" in out, out


def test_attention_weights_too_large_are_refused_before_the_copies():
    """``return_weights=True`` whose (..., L, S) weights no machine holds (16 TiB here) is refused
    from the shapes: the check was in C++ only, after query, key and value were made contiguous
    (3 x 64 MiB of copies of these broadcast views, 1.8 GB and 5 s for longer ones)."""
    q = np.broadcast_to(np.float32(1), (1, 1, 2**21, 8))
    peak = refusal_peak(lambda: F.scaled_dot_product_attention(q, q, q, return_weights=True), ValueError,
                        r"^return_weights: the weights \(\.\.\., L, S\): an array of shape \(1, 1, 2097152, 2097152\)")
    assert peak < 2**20, peak


@pytest.mark.parametrize("model", ["tc.BertModel(tc.BertConfig(vocab_size=8, hidden_size=8, num_hidden_layers=1, "
                                   "num_attention_heads=2, intermediate_size=8, max_position_embeddings=8))",
                                   "tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=8, n_positions=8, n_embd=8, n_layer=1, "
                                   "n_head=2))"])
def test_model_attention_mask_shape_is_checked_before_it_is_copied(model):
    """A broadcast attention_mask of the wrong shape is refused by its shape, not copied whole first
    (a numpy MemoryError: the models made the mask C-contiguous before comparing shapes)."""
    out = _under_memory_limit(f"m = {model}\n"
                              "m(np.ones((2, 3), np.int64), attention_mask=np.broadcast_to("
                              "(np.arange(2**20) % 2).astype(bool), (2**20, 2**20)).T)\n")
    assert out.startswith("ValueError: attention_mask: expected shape (2, 3)"), out


def test_embedding_broadcast_ids_give_the_contiguous_ids_values():
    """Broadcast ids (stride 0, any rank, 0-d included) embed as their contiguous copy, in the
    training forward and its backward too."""
    emb = tc.nn.Embedding(7, 3, np.float64)
    (_, weight), = emb.named_parameters()
    table = weight.data.copy()
    for ids in (np.broadcast_to(np.array([[4], [0], [6]]), (3, 5)), np.broadcast_to(np.int32(2), (2, 1, 4)),
                np.broadcast_to(np.arange(7)[:, None, None], (7, 2, 3)).transpose(2, 0, 1), np.int64(5)):
        np.testing.assert_array_equal(emb(ids), table[np.array(ids)])
        assert emb(ids).shape == np.shape(ids) + (3,)
    emb.train()
    ids = np.broadcast_to(np.array([1, 1, 3]), (4, 3))
    emb.zero_grad()
    emb(ids)
    emb.backward(np.ones((4, 3, 3)))
    np.testing.assert_array_equal(weight.grad[:4], [[0] * 3, [8] * 3, [0] * 3, [4] * 3])


def test_key_mask_shape_is_checked_before_its_values():
    """An integer key mask's 0/1 check (``arr == 1``) made bool arrays of its whole size before its
    shape was checked: a broadcast ``(2**20, 2**20)`` one was a numpy MemoryError. Its shape is
    checked first now (ValueError naming it); one of the right shape, broadcast, is read as its copy."""
    out = _under_memory_limit("mha = tc.nn.MultiheadAttention(4, 1)\n"
                              "mha(np.ones((1, 2, 4), np.float32), key_mask=np.broadcast_to(np.int64(1), (2**20, 2**20)))\n")
    assert out == "ValueError: key_mask: expected shape (1, 2) (batch, key length), got (1048576, 1048576)", out
    enc = tc.nn.TransformerEncoderLayer(4, 1, 8)
    src = np.random.default_rng(0).standard_normal((3, 5, 4)).astype(np.float32)
    keep = np.broadcast_to(np.array([1, 1, 0, 1, 0]), (3, 5))
    np.testing.assert_array_equal(enc(src, src_key_mask=keep), enc(src, src_key_mask=np.ascontiguousarray(keep)))
    np.testing.assert_array_equal(enc(src, src_key_mask=keep), enc(src, src_key_mask=keep.astype(bool)))


def test_broadcast_integer_masks_are_read_as_their_values():
    """Integer (and, for attention_mask, float) 0/1 masks that are broadcast views: their 0/1 check
    (``arr == 1``) made bool arrays of the view's whole size before any shape check, a numpy
    MemoryError for a ``(2**20, 2**20)`` one. Only the values they hold are read now: a view too large
    reaches the shape check (a ValueError naming it); one that fits gives its contiguous copy's
    results, and a value other than 0/1 in it is still refused."""
    code = ("small = np.ones((1, 1, 4, 8), np.float32)\n"
            "wide = np.broadcast_to(np.arange(2**20) % 2, (2**20, 2**20)).T\n"
            "fwide = np.broadcast_to(np.arange(2**20, dtype=np.float32) % 2, (2**20, 2**20)).T\n"
            "{call}\n")
    for call, message in [
        ("F.scaled_dot_product_attention(small, small, small, key_mask=wide)",
         "key_mask: expected shape (4,) or (1, 4) or (1, 1, 4) (each leading dim may be 1) (key length 4), "
         "got (1048576, 1048576)"),
        ("F.scaled_dot_product_attention(small, small, small, query_mask=wide)",
         "query_mask: expected shape (4,) or (1, 4) or (1, 1, 4) (each leading dim may be 1) (query length 4), "
         "got (1048576, 1048576)"),
        ("tc.sentence_encoder.mean_pool(np.ones((1, 2, 4), np.float32), fwide)",
         "attention_mask: expected shape (1, 2) (last_hidden_state's N, L), got (1048576, 1048576)"),
        ("tc.sentence_encoder.mean_pool(np.ones((1, 2, 4), np.float32), np.broadcast_to(np.float64(1), (2**20, 2**20)))",
         "attention_mask: expected shape (1, 2) (last_hidden_state's N, L), got (1048576, 1048576)"),
    ]:
        out = _under_memory_limit(code.format(call=call))
        assert out == f"ValueError: {message}", (call, out)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, n, 4)) for n in (5, 6, 6))
    for km in (np.broadcast_to(np.array([1, 0, 1, 1, 0, 1]), (2, 6)), np.broadcast_to(np.int8(1), (2, 3, 6)),
               np.broadcast_to(np.array([[1], [0], [1]], np.uint8), (2, 3, 6)).copy()[:, :, ::1]):
        np.testing.assert_array_equal(F.scaled_dot_product_attention(q, k, v, key_mask=km),
                                      F.scaled_dot_product_attention(q, k, v, key_mask=np.ascontiguousarray(km).astype(bool)))
    h = rng.standard_normal((3, 5, 4))
    keep = np.broadcast_to(np.array([1.0, 1.0, 0.0, 1.0, 0.0]), (3, 5))
    np.testing.assert_array_equal(tc.sentence_encoder.mean_pool(h, keep), h[:, [0, 1, 3]].mean(axis=1))
    for bad in (np.broadcast_to(np.array([1, 2, 0, 1, 0, 1]), (2, 6)), np.broadcast_to(np.int64(-1), (2, 6))):
        with pytest.raises(ValueError, match=r"key_mask: expected a bool or 0/1 mask, got values such as \[(2|-1)\]"):
            F.scaled_dot_product_attention(q, k, v, key_mask=bad)


def test_broadcast_float_ids_are_checked_on_their_values():
    """Float ids that are broadcast views embed as their contiguous copy; a NaN, an infinity, a
    fraction or a value beyond int64 in them is refused as in a contiguous array."""
    emb = tc.nn.Embedding(7, 3, np.float64)
    (_, weight), = emb.named_parameters()
    for ids in (np.broadcast_to(np.array([[4.0], [0.0], [6.0]]), (3, 5)),
                np.broadcast_to(np.arange(7, dtype=np.float32)[:, None], (7, 4)).T, np.float16(5)):
        np.testing.assert_array_equal(emb(ids), weight.data[np.array(ids).astype(np.int64)])
    for value, exc, match in [(np.nan, TypeError, "input_ids: expected integer token ids, got dtype float64"),
                              (np.inf, TypeError, "input_ids: expected integer token ids, got dtype float64"),
                              (-np.inf, TypeError, "input_ids: expected integer token ids, got dtype float64"),
                              (2.5, TypeError, "input_ids: expected integer token ids, got dtype float64"),
                              (2.0**63, ValueError, "input_ids: expected token ids within int64, got 9.22"),
                              (-2.0**64, ValueError, "input_ids: expected token ids within int64, got -1.8")]:
        held = np.array([[1.0], [value], [3.0]])
        for ids in (held, np.broadcast_to(held, (3, 2**12))):
            with pytest.raises(exc, match=match):
                emb(ids)
    with pytest.raises(TypeError, match="input_ids: expected integer token ids"):  # a fraction beside a huge id
        emb(np.broadcast_to(np.array([0.5, 2.0**70]), (4, 2)))
    big = np.broadcast_to(np.array([2**63, 1], np.uint64), (3, 2))
    with pytest.raises(ValueError, match="input_ids: expected token ids within int64, got 9223372036854775808"):
        emb(big)


def test_rotary_tables_broadcast_over_heads_are_not_copied_to_the_input_size():
    """Hugging Face's ``(N, L, D)`` rotary tables for x ``(N, H, L, D)`` (and tables given as
    ``np.broadcast_to`` views of x's shape) were broadcast to x's size and copied, cos and sin each:
    under a limit that holds x, its rotation and 1/4 GiB more (not the tables' two copies), a numpy
    MemoryError. Their rows are gathered a block of x's rows at a time now: values as HF's formula."""
    code = ("tc.set_num_threads(1)\n"
            "N, H, L, D = 5, 32, 8192, 64\n"  # x: 320 MiB of float32
            "rng = np.random.default_rng(0)\n"
            "small = rng.standard_normal((L, D)).astype(np.float32)\n"
            "x = np.broadcast_to(small, (N, H, L, D))\n"
            "cos, sin = (rng.standard_normal((N, L, D)).astype(np.float32) for _ in range(2))\n"
            "{call}\n"
            "rot = np.concatenate([-small[:, D // 2:], small[:, :D // 2]], axis=-1)\n"
            "err = max(float(np.abs(y[n, h] - (small * cos[n] + rot * sin[n])).max()) for n, h in ((0, 0), (4, 31), (2, 7)))\n"
            "raise ValueError(f'ok {{y.shape}} {{y.dtype}} {{err < 1e-6}}')\n")
    for call in ("y = tc.positional.apply_rotary(x, cos, sin)",
                 "y = tc.positional.apply_rotary(x, np.broadcast_to(cos[:, None], (N, H, L, D)), np.broadcast_to(sin[:, None], "
                 "(N, H, L, D)))"):
        out = _under_memory_limit(code.format(call=call))
        assert out == "ValueError: ok (5, 32, 8192, 64) float32 True", (call, out)


#: (table shape held, shape given (a broadcast view of it), x's shape): tables shared by every leading
#: index of x, and tables differing along a leading dim of x and broadcast along another
BROADCAST_TABLES = [
    ((1, 5, 8), (4, 5, 8), (4, 3, 5, 8)),  # (N, L, D) given, HF's convention: unsqueezed at dim 1
    ((1, 1, 5, 8), (2, 3, 5, 8), (2, 3, 5, 8)),
    ((2, 1, 5, 8), (2, 3, 5, 8), (2, 3, 5, 8)),
    ((2, 1, 1, 4), (2, 3, 5, 4), (2, 3, 5, 8)),  # D/2 wide, broadcast along L
    ((1, 8), (5, 8), (2, 3, 5, 8)),
    ((3, 1, 8), (3, 5, 8), (3, 2, 5, 8)),
]


@pytest.mark.parametrize("held, given, x_shape", BROADCAST_TABLES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_broadcast_rotary_tables_give_the_contiguous_tables_values(rng, held, given, x_shape, layout):
    """Rotary tables that are broadcast views give exactly what their contiguous copies give, in
    apply_rotary, apply_rotary_pos_emb and the backward; and the values are the formula's."""
    c0, s0 = (rng.standard_normal(held) for _ in range(2))
    cos, sin = np.broadcast_to(c0, given), np.broadcast_to(s0, given)
    x = rng.standard_normal(x_shape)
    y = tc.positional.apply_rotary(x, cos, sin, layout)
    np.testing.assert_array_equal(y, tc.positional.apply_rotary(x, np.ascontiguousarray(cos), np.ascontiguousarray(sin), layout))
    # the reference: the tables broadcast to x (HF's unsqueeze(1) for a table one rank short)
    c = cos[:, None] if cos.ndim == x.ndim - 1 else cos
    s = sin[:, None] if sin.ndim == x.ndim - 1 else sin
    D = x.shape[-1]
    if layout == "half":
        c, s = (np.concatenate([t, t], -1) if t.shape[-1] == D // 2 else t for t in (c, s))
        want = x * c + np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1) * s
    else:
        c, s = c[..., :D // 2], s[..., :D // 2]
        want = np.empty_like(x)
        want[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
        want[..., 1::2] = x[..., 1::2] * c + x[..., 0::2] * s
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    q, k = tc.positional.apply_rotary_pos_emb(x, 2 * x, cos, sin, layout=layout)
    np.testing.assert_array_equal(q, y)
    np.testing.assert_array_equal(k, 2 * y)  # a power of 2 scales every product and sum exactly
    g = tc.backward.rotary_backward(y, cos, sin, layout)
    np.testing.assert_array_equal(g, tc.backward.rotary_backward(y, np.ascontiguousarray(cos),
                                                                 np.ascontiguousarray(sin), layout))


#: (x's shape, the table's) with more rows than one block (``_GATHER_ROWS``): blocks that each share
#: one table (HF's (N, L, D)), and blocks too small for that (a range of rows at a time, over dim 0,
#: then over dim 1 with dim 0 fixed)
BLOCKED_TABLES = [
    ((3, 12, 1000, 16), (3, 1000, 16)),
    ((3000, 4, 3, 8), (3000, 1, 3, 8)),
    ((3, 5000, 4, 2, 8), (3, 5000, 1, 2, 4)),
]


@pytest.mark.parametrize("x_shape, table_shape", BLOCKED_TABLES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotary_tables_rotated_in_blocks_match_the_whole_table(rng, x_shape, table_shape, layout):
    """x with more rows than one block: tables that vary along a leading dim of x and are broadcast
    along a later one give exactly what the tables broadcast to x's whole shape give (one kernel
    call), in both layouts and with the head axis elsewhere (unsqueeze_dim)."""
    assert math.prod(x_shape[:-1]) > 2 * tc.positional._GATHER_ROWS
    x = rng.standard_normal(x_shape).astype(np.float32)
    cos, sin = (rng.standard_normal(table_shape).astype(np.float32) for _ in range(2))
    c4, s4 = (t[:, None] if t.ndim == x.ndim - 1 else t for t in (cos, sin))
    full_c, full_s = (np.ascontiguousarray(np.broadcast_to(t, x.shape[:-1] + t.shape[-1:])) for t in (c4, s4))
    y = tc.positional.apply_rotary(x, cos, sin, layout)
    np.testing.assert_array_equal(y, tc.positional.apply_rotary(x, full_c, full_s, layout))
    if cos.ndim == x.ndim - 1:
        x2 = np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # (N, L, H, D): the head axis at unsqueeze_dim=2
        np.testing.assert_array_equal(tc.positional.apply_rotary(x2, cos, sin, layout, unsqueeze_dim=2),
                                      y.transpose(0, 2, 1, 3))


@pytest.mark.parametrize("x_shape, table_shape", BLOCKED_TABLES + [(x, g) for _, g, x in BROADCAST_TABLES])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rotary_backward_rotates_as_the_whole_table(rng, x_shape, table_shape, layout, dtype):
    """rotary_backward reads tables that vary along a leading dim of grad_output and are broadcast
    along another a block of rows at a time (``positional._rotate``): bit for bit what the tables
    broadcast to grad_output's whole shape give (one kernel call, as it used to compute), and the
    transpose of the rotation: ``R(-θ) g``."""
    g = rng.standard_normal(x_shape).astype(dtype)
    cos, sin = (rng.standard_normal(table_shape).astype(dtype) for _ in range(2))
    c4, s4 = (t[:, None] if t.ndim == g.ndim - 1 else t for t in (cos, sin))
    full_c, full_s = (np.ascontiguousarray(np.broadcast_to(t, g.shape[:-1] + t.shape[-1:])) for t in (c4, s4))
    got = tc.backward.rotary_backward(g, cos, sin, layout)
    np.testing.assert_array_equal(got, tc.backward.rotary_backward(g, full_c, full_s, layout))
    D = g.shape[-1]
    if layout == "half":
        c, s = (np.concatenate([t, t], -1) if t.shape[-1] == D // 2 else t for t in (full_c, full_s))
        h = D // 2
        want = np.concatenate([g[..., :h] * c[..., :h] + g[..., h:] * s[..., h:],
                               g[..., h:] * c[..., h:] - g[..., :h] * s[..., :h]], -1)
    else:
        c, s = full_c[..., :D // 2], full_s[..., :D // 2]
        want = np.empty_like(g)
        want[..., 0::2] = g[..., 0::2] * c + g[..., 1::2] * s
        want[..., 1::2] = g[..., 1::2] * c - g[..., 0::2] * s
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_rotary_backward_does_not_copy_the_tables_to_the_gradient_size(rng):
    """Hugging Face's ``(N, L, D)`` tables for a gradient ``(N, H, L, D)`` were broadcast to the
    gradient's size and copied, cos and sin each (twice the gradient's bytes, size-checked but
    avoidable); they are read a block of rows at a time now, as apply_rotary reads them."""
    import tracemalloc

    N, H, L, D = 4, 16, 512, 64  # 32768 rows: more than one block (positional._GATHER_ROWS)
    assert N * H * L > tc.positional._GATHER_ROWS
    g = rng.standard_normal((N, H, L, D)).astype(np.float32)
    cos, sin = (rng.standard_normal((N, L, D)).astype(np.float32) for _ in range(2))
    tracemalloc.start()
    try:
        got = tc.backward.rotary_backward(g, cos, sin)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * g.nbytes, f"peak {peak} bytes for a gradient of {g.nbytes}: the tables were copied to its size"
    c, s = cos[:, None], sin[:, None]
    h = D // 2  # R(-θ) g, with the sine of the other half of each pair (the halves of these tables differ)
    want = np.concatenate([g[..., :h] * c[..., :h] + g[..., h:] * s[..., h:],
                           g[..., h:] * c[..., h:] - g[..., :h] * s[..., :h]], -1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_sdpa_mask_copied_over_unmergeable_batch_dims_is_checked():
    """A 5-D call whose mask varies along query's first dim and is broadcast along its second
    (``(A, 1, 1, L, S)`` for a query ``(A, B, 1, L, E)``): the kernels' ``(A·B, 1, L, S)`` cannot be a
    view of it, and its copy was made unchecked (a numpy MemoryError). The masks here are banded
    sliding windows (``L + S`` values each, ``sliding_window_view``) whose copy exceeds this machine's
    memory: a ValueError naming attn_mask, before any allocation, for a boolean and a float mask;
    and for a float64 mask of a float32 call, whose conversion is checked."""
    code = ("from numpy.lib.stride_tricks import sliding_window_view\n"
            "mem = tc._validation.physical_memory_bytes()\n"
            "L = 1 << ((mem // 4).bit_length() + 2) // 2\n"  # 4 · L · L > 2 · mem; q, k, v: 4 · L floats each
            "q = np.ones((2, 2, 1, L, 1), np.float32)\n"
            "m = sliding_window_view(np.ones((2, 2 * L - 1), {dtype}), L, axis=-1)[:, None, None]\n"
            "assert m.shape == (2, 1, 1, L, L)\n"
            "F.scaled_dot_product_attention(q, q, q, m)\n")
    for dtype in ("np.bool_", "np.float32"):
        out = _under_memory_limit(code.format(dtype=dtype))
        assert out.startswith("ValueError: attn_mask: its copy over query's batch dims (2, 2) (their strides do "
                              "not merge into one): an array of shape (4, 1, "), (dtype, out)
        assert "more than this machine's memory" in out, out
    out = _under_memory_limit(code.format(dtype="np.float64"))
    assert out.startswith("ValueError: attn_mask: an array of shape (2, 1, 1, "), out


def _torch_sdpa(q, k, v, mask):
    return torch.nn.functional.scaled_dot_product_attention(
        torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), attn_mask=torch.from_numpy(np.ascontiguousarray(mask))).numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sdpa_masks_over_unmergeable_batch_dims_copy_only_their_values(rng, dtype):
    """Masks of a 5-D call whose batch dims do not merge into one stride are copied over the batch
    dims only: a key-padding ``(A, 1, 1, 1, S)`` mask becomes ``(A·B, 1, 1, S)`` broadcast over
    heads and queries (it was copied whole, ``(A·B, H, L, S)``). Values as torch's."""
    import tracemalloc

    A, B, H, L, S, E = 2, 4, 4, 256, 256, 4
    q, k, v = (rng.standard_normal((A, B, H, n, E)).astype(dtype) for n in (L, S, S))
    keep = rng.random((A, 1, 1, 1, S)) > 0.3
    keep[..., 0] = True  # no query row without keys (torch gives NaN there)
    tracemalloc.start()
    try:
        out = F.scaled_dot_product_attention(q, k, v, keep)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < A * B * H * L * S // 2, f"peak {peak} bytes: the mask was copied whole"
    np.testing.assert_allclose(out, _torch_sdpa(q, k, v, np.broadcast_to(keep, q.shape[:-1] + (S,))),
                               rtol=1e-5, atol=1e-6)
    # float (float64 for float32 queries too) and boolean masks of the other layouts that do not
    # merge, with query_mask and a per-head key_mask: the same bits as the masks made contiguous
    add = rng.standard_normal((A, 1, H, 1, S))
    bias = np.ascontiguousarray(np.broadcast_to(add.astype(dtype), q.shape[:-1] + (S,)))
    rows = np.ascontiguousarray(np.broadcast_to(keep, q.shape[:-1] + (S,)))
    np.testing.assert_allclose(F.scaled_dot_product_attention(q, k, v, add), _torch_sdpa(q, k, v, bias),
                               rtol=1e-5, atol=1e-6)
    qm = rng.random((A, 1, 1, L)) > 0.2
    km = rng.random((A, 1, H, S)) > 0.2
    km[..., 0] = True
    ours = F.scaled_dot_product_attention(q, k, v, add, query_mask=qm, key_mask=km)
    full_q = np.ascontiguousarray(np.broadcast_to(qm, (A, B, 1, L)))
    full_k = np.ascontiguousarray(np.broadcast_to(km, (A, B, H, S)))
    np.testing.assert_array_equal(ours, F.scaled_dot_product_attention(q, k, v, bias, query_mask=full_q,
                                                                       key_mask=full_k))
    np.testing.assert_array_equal(F.scaled_dot_product_attention(q, k, v, keep[:, :, :, :1].repeat(L, 3)),
                                  F.scaled_dot_product_attention(q, k, v, rows))


def test_sdpa_float_mask_of_another_dtype_stays_a_view(rng):
    """A float64 additive mask broadcast over the queries (``np.broadcast_to(row, (L, S))``) of a
    float32 call is converted once per value it holds, not copied to ``(L, S)`` (64 GiB for
    ``L = S = 2**17``: it was a numpy MemoryError). Values as torch's with the mask cast."""
    import tracemalloc

    L, S, E = 1024, 2048, 8
    q = rng.standard_normal((1, 2, L, E)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, S, E)).astype(np.float32) for _ in range(2))
    row = rng.standard_normal((1, S)) * 3
    row[0, 5:9] = -np.inf
    mask = np.broadcast_to(row, (L, S))
    tracemalloc.start()
    try:
        out = F.scaled_dot_product_attention(q, k, v, mask)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < L * S, f"peak {peak} bytes: the mask was converted whole"
    want = _torch_sdpa(q, k, v, np.ascontiguousarray(mask, np.float32))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    assert np.isfinite(out).all()


# ------------------------------------------------------------------------------------------------
# 3. wrong-typed config fields name the field
# ------------------------------------------------------------------------------------------------
BERT = dict(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
            max_position_embeddings=16)


@pytest.mark.parametrize("field, value, exc", [
    ("hidden_size", "8", TypeError), ("hidden_size", None, TypeError), ("hidden_size", 8.0, TypeError),
    ("hidden_size", -8, ValueError), ("num_attention_heads", 0, ValueError), ("vocab_size", True, TypeError),
    ("layer_norm_eps", "1e-12", TypeError), ("layer_norm_eps", -1.0, ValueError),
    ("layer_norm_eps", float("nan"), ValueError), ("hidden_act", "swishy", ValueError), ("hidden_act", 3, TypeError),
    ("add_pooling_layer", "yes", TypeError), ("type_vocab_size", [2], TypeError),
])
def test_bert_config_fields(field, value, exc):
    with pytest.raises(exc, match=field):
        tc.BertModel(dict(BERT, **{field: value}))


@pytest.mark.parametrize("cls, config, field", [
    (tc.GPT2Model, {"n_embd": "8"}, "n_embd"), (tc.GPT2Model, {"n_layer": None}, "n_layer"),
    (tc.GPT2Model, {"layer_norm_epsilon": -1}, "layer_norm_epsilon"),
    (tc.GPT2Model, {"eos_token_id": "x"}, "eos_token_id"),
    (tc.GPT2Model, {"n_embd": 10, "n_head": 3}, "n_embd"),
    (tc.LlamaModel, {"rope_theta": "1e4"}, "rope_theta"), (tc.LlamaModel, {"rope_theta": 0}, "rope_theta"),
    (tc.LlamaModel, {"tie_word_embeddings": "no"}, "tie_word_embeddings"),
    (tc.LlamaModel, {"num_key_value_heads": 3}, "num_key_value_heads"),
    (tc.LlamaModel, {"rms_norm_eps": float("inf")}, "rms_norm_eps"),
])
def test_decoder_config_fields(cls, config, field):
    small = ({"vocab_size": 8, "n_positions": 8, "n_embd": 8, "n_layer": 1, "n_head": 2} if cls is tc.GPT2Model else
             {"vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 2, "max_position_embeddings": 8})
    with pytest.raises((TypeError, ValueError), match=field):
        cls(dict(small, **config))


@pytest.mark.parametrize("config", [[1, 2], "config", None, 3])
def test_config_not_a_mapping(config):
    for cls in (tc.BertModel, tc.GPT2Model, tc.LlamaModel):
        with pytest.raises(TypeError, match="config"):
            cls(config)


@pytest.mark.parametrize("value, got", [
    (10**400, "got int of 1329 bits (too large for a float)"),
    (-(10**400), "got int of 1329 bits (too large for a float)"),
    (Fraction(10**400, 3), "got Fraction (too large for a float)"),
], ids=["int", "negative_int", "fraction"])
def test_check_float_of_a_number_too_large_for_a_float(value, got):
    """float(10**400) raises OverflowError: a ValueError naming the field instead, without
    printing the number (a long int's digits may not even convert to a string)."""
    from transformer_core._validation import check_eps, check_float

    with pytest.raises(ValueError) as info:
        check_float(value, "rope_theta", minimum=0.0, min_open=True)
    assert str(info.value) == f"rope_theta: expected a finite float, {got}"
    with pytest.raises(ValueError) as info:
        check_float(value, "x", finite=False)
    assert str(info.value) == f"x: expected a float, {got}"
    with pytest.raises(ValueError, match="^rms_norm_eps: expected a finite float"):
        check_eps(value, "rms_norm_eps")
    # the largest ints a float holds are still read, exactly as float() does
    big = int(np.finfo(np.float64).max)
    assert check_float(big, "x") == float(big) and check_float(-big, "x", finite=False) == -float(big)


@pytest.mark.parametrize("cls, field", [
    (tc.BertModel, "layer_norm_eps"), (tc.GPT2Model, "layer_norm_epsilon"),
    (tc.LlamaModel, "rms_norm_eps"), (tc.LlamaModel, "rope_theta"),
])
def test_config_field_too_large_for_a_float_names_the_file(tmp_path, cls, field):
    """A config.json float field holding an integer beyond float range (valid JSON): a ValueError
    naming the file and the field (was an OverflowError naming neither)."""
    from transformer_core.checkpoints import config_from_file

    small = (BERT if cls is tc.BertModel else
             {"vocab_size": 8, "n_positions": 8, "n_embd": 8, "n_layer": 1, "n_head": 2} if cls is tc.GPT2Model else
             {"vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 2, "max_position_embeddings": 8})
    config_class = type(cls(dict(small)).config)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(small, **{field: 10**400})))
    with pytest.raises(ValueError) as info:
        config_from_file(config_class, json.loads(path.read_text()), path)
    assert str(info.value) == f"{path}: {field}: expected a finite float, got int of 1329 bits (too large for a float)"


def test_config_json_list(tmp_path):
    shutil.copytree(MODEL_DIR, tmp_path / "m", dirs_exist_ok=True)
    (tmp_path / "m" / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json"):
        tc.BertModel.from_pretrained(tmp_path / "m")


# ------------------------------------------------------------------------------------------------
# 4. no silent wrong answers
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["<f8", ">f8"])
def test_float64_stays_float64_in_either_byte_order(rng, order):
    x = rng.standard_normal((3, 5)).astype(order)
    ref = torch.softmax(torch.from_numpy(x.astype(np.float64)), -1).numpy()
    for fn, expected in ((F.softmax, ref), (F.layer_norm, torch.nn.functional.layer_norm(
            torch.from_numpy(x.astype(np.float64)), (5,)).numpy())):
        y = fn(x)
        assert y.dtype == np.float64
        np.testing.assert_allclose(y, expected, atol=1e-12)
    w = rng.standard_normal((4, 5)).astype(order)
    np.testing.assert_allclose(F.linear(x, w), x.astype(np.float64) @ w.astype(np.float64).T, atol=1e-12)
    assert tc.nn.Linear(5, 4, dtype=np.dtype(order)).dtype == np.float64


@pytest.mark.parametrize("bad", [np.array([True, False]), np.ones(3, np.complex64), np.array(["1"]),
                                 np.array([None, 1.0]), np.zeros(2, "datetime64[s]")])
def test_non_real_data_is_refused(bad):
    with pytest.raises(TypeError, match=r"\bx\b"):
        F.softmax(bad)


def test_logits_to_keep_negative():
    m = tc.GPT2LMHeadModel({"vocab_size": 8, "n_positions": 8, "n_embd": 8, "n_layer": 1, "n_head": 2})
    with pytest.raises(ValueError, match="logits_to_keep"):
        m(np.array([[1, 2, 3]]), logits_to_keep=-1)
    with pytest.raises(TypeError, match="logits_to_keep"):
        m(np.array([[1, 2, 3]]), logits_to_keep=1.0)
    assert m(np.array([[1, 2, 3]]), logits_to_keep=2).logits.shape == (1, 2, 8)


@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.bool_, np.complex64])
def test_non_float_weights_are_refused(dtype):
    lin = tc.nn.Linear(2, 2)
    before = lin.state_dict()
    with pytest.raises(TypeError, match="weight"):
        lin.load_state_dict({"weight": np.ones((2, 2), dtype), "bias": np.zeros(2)})
    for k, v in lin.state_dict().items():
        np.testing.assert_array_equal(v, before[k])  # unchanged


def test_integer_weights_are_refused_as_documented():
    """torch's load_state_dict would convert an integer tensor (copy_); ours refuses it, naming the
    key, the module unchanged -- and the docstring says so (it claimed integer arrays were taken)."""
    lin = tc.nn.Linear(2, 2)
    before = lin.state_dict()
    for weight in ([[1, 2], [3, 4]], torch.ones(2, 2, dtype=torch.int32), np.ones((2, 2), np.uint8)):
        with pytest.raises(TypeError, match=r"^state_dict\['weight'\]: expected a floating-point"):
            lin.load_state_dict({"weight": weight, "bias": np.zeros(2)})
    for k, v in lin.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    doc = tc.module.Module.load_state_dict.__doc__
    assert "integer-valued" not in doc and "integer, bool, complex, object and string data are refused" in doc


def test_torch_bfloat16_weights_load_converted():
    lin = tc.nn.Linear(3, 2)
    w = torch.randn(2, 3).to(torch.bfloat16)
    lin.load_state_dict({"weight": w, "bias": torch.zeros(2, dtype=torch.float16)})
    np.testing.assert_array_equal(lin.state_dict()["weight"], w.float().numpy())


def test_scalar_options_are_typed():
    from transformer_core.generation import GenerationConfig

    with pytest.raises(TypeError, match="top_k"):
        GenerationConfig(2, top_k=2.7)
    with pytest.raises(ValueError, match="top_p"):
        GenerationConfig(2, top_p=-0.1)
    with pytest.raises(TypeError, match="length"):
        tc.KVCache(1, 1, 1, 2, 4).crop(1.5)
    with pytest.raises(TypeError, match="is_causal"):
        F.scaled_dot_product_attention(np.ones((1, 2, 2)), np.ones((1, 2, 2)), np.ones((1, 2, 2)), is_causal="yes")
    with pytest.raises(ValueError, match="key_mask"):  # 0/1 masks only: 2 is not a mask
        F.scaled_dot_product_attention(np.ones((1, 2, 2)), np.ones((1, 2, 2)), np.ones((1, 2, 2)),
                                       key_mask=np.array([[1, 2]]))
    with pytest.raises(TypeError, match="key_mask"):  # float masks look like torch's additive ones
        F.scaled_dot_product_attention(np.ones((1, 2, 2)), np.ones((1, 2, 2)), np.ones((1, 2, 2)),
                                       key_mask=np.array([[1.0, 0.5]]))


@pytest.mark.parametrize("path", ["reference", "flash"])
def test_sdpa_scale_zero_with_nan_agrees_across_paths(path):
    q = np.full((1, 2, 4), np.nan, np.float32)
    k = np.ones((1, 3, 4), np.float32)
    out = F.scaled_dot_product_attention(q, k, k, scale=0.0, path=path)
    assert np.isnan(out).all()  # 0 · NaN is NaN on every path, as torch's math path


def test_invalid_sentence_bert_config(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(MODEL_DIR, d)
    (d / "sentence_bert_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="sentence_bert_config.json"):
        tc.Tokenizer.from_pretrained(d)
    for bad in ("256", 0, -1, 1.5, None):
        (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": bad}))
        with pytest.raises(ValueError, match="max_seq_length"):
            tc.SentenceEncoder.from_pretrained(d)
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 513}))  # > max_position_embeddings
    with pytest.raises(ValueError, match="max_position_embeddings"):
        tc.SentenceEncoder.from_pretrained(d)
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    assert tc.Tokenizer.from_pretrained(d).max_length == 128


def test_tokenizer_json_broken(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(MODEL_DIR, d)
    (d / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    with pytest.raises(ValueError, match="tokenizer.json"):
        tc.Tokenizer.from_pretrained(d)


# ------------------------------------------------------------------------------------------------
# 5. errors name the argument
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, name, exc", [
    (lambda: F.softmax(np.ones((2, 3)), dim=1.5), "dim", TypeError),
    (lambda: F.softmax(np.ones((2, 3)), dim=2), "dim", ValueError),
    (lambda: F.layer_norm(np.ones((2, 3)), eps=None), "eps", TypeError),
    (lambda: F.softmax([[1, 2], [3]]), "x", ValueError),
    (lambda: F.linear(np.ones((2, 3)), [[1, 2, 3], [4, 5]]), "weight", ValueError),
    (lambda: tc.Tokenizer.from_pretrained(MODEL_DIR).decode([-1]), "ids", ValueError),
    (lambda: tc.Tokenizer.from_pretrained(MODEL_DIR).decode([2**70]), "ids", ValueError),
    (lambda: tc.Tokenizer.from_pretrained(MODEL_DIR).decode(None), "ids", TypeError),
    (lambda: tc.Tokenizer.from_pretrained(MODEL_DIR).encode_batch(None), "texts", TypeError),
    (lambda: tc.set_num_threads(2**31), "n", ValueError),
    (lambda: tc.set_num_threads(2.0), "n", TypeError),
    (lambda: tc.KVCache(1, 1, 2, 0), "head_dim", ValueError),
    (lambda: tc.mean_pool(None, None), "last_hidden_state", TypeError),
    (lambda: tc.cosine_similarity(np.ones((2, 3)), np.ones((2, 4))), "b", ValueError),
    (lambda: tc.masks.causal_mask(3, alignment=None), "alignment", TypeError),
    (lambda: tc.nn.MultiheadAttention(8, 2)(np.ones((1, 3, 8)), path="fast"), "path", ValueError),
    (lambda: F.apply_rotary(np.ones((3, 4)), np.ones((3, 4)), np.ones((3, 4)), layout="rotated"), "layout", ValueError),
    (lambda: F.cross_entropy(np.ones((2, 3)), np.array([0, 1]), reduction="avg"), "reduction", ValueError),
    (lambda: F.glu(np.ones(3), np.ones(3), activation="swiglu"), "activation", ValueError),
])
def test_errors_name_the_argument(call, name, exc):
    with pytest.raises(exc, match=rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])"):
        call()


def test_encode_none_names_sentences(tc_bert):
    encoder = tc.SentenceEncoder(tc_bert, tc.Tokenizer.from_pretrained(MODEL_DIR))
    for bad, exc in ((None, TypeError), (3, TypeError), ([1, 2], TypeError)):
        with pytest.raises(exc, match="sentences"):
            encoder.encode(bad)
    with pytest.raises(TypeError, match="batch_size"):
        encoder.encode(["a"], batch_size=2.5)


# ------------------------------------------------------------------------------------------------
# 6. bf16 / fp16 checkpoints of the real MiniLM load and embed close to fp32
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("torch_dtype, tol", [(torch.bfloat16, 1e-2), (torch.float16, 2e-3)])
def test_minilm_half_precision_checkpoints(tmp_path, torch_dtype, tol):
    from safetensors.torch import load_file, save_file

    d = tmp_path / "m"
    shutil.copytree(MODEL_DIR, d)
    state = load_file(str(MODEL_DIR / "model.safetensors"))
    save_file({k: (v.to(torch_dtype) if v.is_floating_point() else v) for k, v in state.items()},
              str(d / "model.safetensors"))
    ref = tc.SentenceEncoder.from_pretrained(MODEL_DIR).encode(SENTENCES[:8])
    half = tc.SentenceEncoder.from_pretrained(d).encode(SENTENCES[:8])
    assert half.dtype == np.float32
    err = np.abs(half - ref).max()
    assert err <= tol, err
    cos = (half * ref).sum(1)
    assert cos.min() > 0.999


# ------------------------------------------------------------------------------------------------
# 7. the CLI: an error is exit code 2 and one line naming what was wrong, never a traceback
# ------------------------------------------------------------------------------------------------
def _cli(*args, timeout=300):
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "transformer_core", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_cli_errors_are_one_line(tmp_path, tiny_model_dir):
    good = tmp_path / "good.txt"
    good.write_text("one\ntwo\n", encoding="utf-8")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\u00e9 au lait\n".encode("latin-1"))
    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_model_dir, truncated)
    weights = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    for args, fragments in [
        (["embed", "--file", latin1, "--out", tmp_path / "a.npy", "--model", tiny_model_dir], ["line 1", "UTF-8"]),
        (["embed", "--file", good, "--out", tmp_path / "b.npy", "--model", truncated], ["model.safetensors"]),
        (["embed", "one", "two", "--model", truncated], ["model.safetensors"]),
    ]:
        r = _cli(*args, "--no-progress") if "--out" in args else _cli(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, (args, r.stderr)
        assert lines[0].startswith("transformer_core embed: "), lines[0]
        for f in fragments:
            assert f in lines[0], (f, lines[0])
    # argparse's own usage errors (main's choice: the usage, then one line naming the option)
    r = _cli("embed", "one", "--batch-size", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "argument --batch-size: expected an int >= 1, got 0" in r.stderr.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------------------
# 9. the thread count is process-wide; threadpoolctl still limits it
# ------------------------------------------------------------------------------------------------
def test_set_num_threads_is_process_wide():
    from threadpoolctl import threadpool_limits

    old = tc.get_num_threads()
    seen = []
    try:
        for n in (1, 3, 7):
            tc.set_num_threads(n)
            t = threading.Thread(target=lambda: seen.append(tc.get_num_threads()))
            t.start()
            t.join()
            assert seen[-1] == n  # a Python thread started later sees the process-wide count
        tc.set_num_threads(3)
        with threadpool_limits(limits=1, user_api="openmp"):
            assert tc.get_num_threads() == 1  # an OpenMP limit in this thread lowers ours here
            t = threading.Thread(target=lambda: seen.append(tc.get_num_threads()))
            t.start()
            t.join()
            assert seen[-1] == 3  # ... and only here: OpenMP's limits are per thread
        assert tc.get_num_threads() == 3

        def limited():
            with threadpool_limits(limits=1, user_api="openmp"):
                seen.append(tc.get_num_threads())
        t = threading.Thread(target=limited)
        t.start()
        t.join()
        assert seen[-1] == 1  # threadpoolctl in another thread limits that thread
    finally:
        tc.set_num_threads(old)


# ------------------------------------------------------------------------------------------------
# 10. float64 LayerNorm on rows far from zero
# ------------------------------------------------------------------------------------------------
def _exact_layer_norm(x: np.ndarray, eps: float) -> np.ndarray:
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        fr = [Fraction(float(v)) for v in x[r]]
        mean = sum(fr) / len(fr)
        var = sum((f - mean) ** 2 for f in fr) / len(fr)
        sd = np.sqrt(float(var) + eps)  # var itself is exact; the square root rounds once
        out[r] = [float(f - mean) / sd for f in fr]
    return out


@pytest.mark.parametrize("E", [7, 64, 384, 1000])
def test_layer_norm_float64_far_from_zero(E):
    """Rows 1e8 + N(0, 0.1): the mean's float64 ulp (1.5e-8) is 1.5e-7 of σ, so subtracting a rounded
    mean loses that much (torch's float64 layer_norm is ~1e-7 from the exact values here). Ours keeps
    the mean in two parts and stays within 1e-10 of the exact result (Fractions)."""
    rng = np.random.default_rng(E)
    x = 1e8 + rng.normal(0, 0.1, (4, E))
    exact = _exact_layer_norm(x, 1e-5)
    ours = F.layer_norm(x, eps=1e-5)
    assert np.abs(ours - exact).max() <= 1e-10
    layer = tc.nn.LayerNorm(E, dtype=np.float64)
    assert np.abs(layer(x) - exact).max() <= 1e-10


@pytest.mark.parametrize("row", [[0.5, 1e300, -0.2], [1e200, -1e200, 3.0, 7.0], [-1e155, 2e155, 1.0, 0.0, 5e154]])
def test_layer_norm_float64_huge_values(row):
    """A float64 row whose squared deviations overflow (|x - mean| beyond ~1e154) is finite after
    LayerNorm: it was all zeros (Σd² = inf gave rstd = 0; torch gives NaN). The forward matches the
    exact values (Fractions); the backward equals that of the row scaled by 2**-600 (LayerNorm is
    scale-invariant: dx(x) = dx(x · s) · s, exact for a power of two)."""
    x = np.array([row])
    fr = [Fraction(v) for v in row]
    mean = sum(fr) / len(fr)
    var = sum((f - mean) ** 2 for f in fr) / len(fr) + Fraction(1e-5)  # beyond float: kept as a ratio
    exact = [math.copysign(math.sqrt(float((f - mean) ** 2 / var)), float(f - mean)) for f in fr]
    assert np.abs(F.layer_norm(x, eps=1e-5)[0] - exact).max() <= 1e-12
    w = np.linspace(0.5, 2.0, x.shape[1])
    g = np.linspace(-1.0, 1.0, x.shape[1])[None]
    s = 2.0**-600
    dx, dw, db = tc.backward.layer_norm_backward(x, w, g, eps=0.0)
    dx_s, dw_s, db_s = tc.backward.layer_norm_backward(x * s, w, g, eps=0.0)
    assert np.all(np.isfinite(dx))
    np.testing.assert_allclose(dx, dx_s * s, rtol=1e-12, atol=1e-12 * np.abs(dx).max())
    np.testing.assert_allclose(dw, dw_s, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("row", [[1e160, 1.0, 2.0, 3.0], [0.5, 1e300, -0.2], [-1e155, 2e155, 1.0, 0.0, 5e154]])
def test_rms_norm_float64_huge_values(row):
    """A float64 row whose squares overflow (|x| beyond ~1e154) is finite after RMSNorm, as after
    LayerNorm: it was all zeros (Σx² = inf gave 1 / rms = 0; torch gives zeros too). The forward
    matches the exact values (Fractions); the backward equals that of the row scaled by 2**-600
    (RMSNorm with eps = 0 is scale-invariant: dx(x) = dx(x · s) · s, exact for a power of two)."""
    x = np.array([row])
    fr = [Fraction(v) for v in row]
    big = max(abs(f) for f in fr)  # x / rms as (x / big) / sqrt(mean_sq / big²): no float underflows
    mean_sq = sum(f * f for f in fr) / len(fr) + Fraction(1e-6)
    exact = [float(f / big) / math.sqrt(float(mean_sq / big**2)) for f in fr]
    np.testing.assert_allclose(F.rms_norm(x, eps=1e-6)[0], exact, rtol=1e-12, atol=0)
    layer = tc.nn.RMSNorm(x.shape[1], eps=1e-6, dtype=np.float64)
    np.testing.assert_allclose(layer(x)[0], exact, rtol=1e-12, atol=0)
    w = np.linspace(0.5, 2.0, x.shape[1])
    g = np.linspace(-1.0, 1.0, x.shape[1])[None]
    s = 2.0**-600
    dx, dw = tc.backward.rms_norm_backward(x, w, g, eps=0.0)
    dx_s, dw_s = tc.backward.rms_norm_backward(x * s, w, g, eps=0.0)
    assert np.all(np.isfinite(dx)) and np.abs(dx).max() > 0
    np.testing.assert_allclose(dx, dx_s * s, rtol=1e-12, atol=1e-12 * np.abs(dx).max())
    np.testing.assert_allclose(dw, dw_s, rtol=1e-12, atol=1e-15)


def test_unpickled_arrays_are_accepted():
    """An unpickled array (what a Dask worker or a multiprocessing pool receives) carries its own
    float32 dtype object, equal to numpy's but not the same object: every C++ entry point must
    compare dtypes by value. Before, a float mask that went through pickle was refused with
    "float_mask: expected a 4-D array of the input dtype", and optimizer state with "expected dtype
    float32, got float32"."""
    import pickle

    def through_pickle(a):
        out = pickle.loads(pickle.dumps(a))
        if isinstance(out, np.ndarray) and out.dtype == np.float32:
            assert out.dtype is not np.dtype(np.float32)  # what the test is about
        return out

    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    fmask = np.where(rng.random((5, 5)) < 0.7, 0.0, -np.inf).astype(np.float32)
    fmask[:, 0] = 0.0
    expected = tc.functional.scaled_dot_product_attention(q, q, q, fmask)
    got = tc.functional.scaled_dot_product_attention(*(through_pickle(a) for a in (q, q, q, fmask)))
    np.testing.assert_array_equal(got, expected)

    mha = tc.nn.MultiheadAttention(8, 2)
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    np.testing.assert_array_equal(mha(through_pickle(x), attn_mask=through_pickle(fmask))[0],
                                  mha(x, attn_mask=fmask)[0])

    # training: a layer's backward and the optimizer with its state through pickle
    layer = tc.nn.TransformerEncoderLayer(8, 2, 16)
    opt = tc.optim.AdamW(layer.parameters(), lr=1e-3)
    layer.train()
    layer(through_pickle(x), src_mask=through_pickle(fmask))
    layer.backward(through_pickle(np.ones_like(x)))
    opt.step()
    opt.load_state_dict(through_pickle(opt.state_dict()))
    layer(x, src_mask=fmask)
    layer.backward(np.ones_like(x))
    opt.step()
    assert all(np.all(np.isfinite(v)) for v in layer.state_dict().values())


# ------------------------------------------------------------------------------------------------
# Embedding tables larger than memory name the user's sizes and the table (not the inner C++
# Embedding's "(num_embeddings, embedding_dim)")
# ------------------------------------------------------------------------------------------------
_MEMORY = r"more than this machine's memory \(\d+ bytes\)"
EMBEDDING_TABLES = [
    ("tc.Embeddings(2**40, 3, 4)",
     rf"vocab_size, hidden_size: the word embedding table \(1099511627776 × 3 float32\) needs 13194139533312 "
     rf"bytes, {_MEMORY}"),
    ("tc.Embeddings(3, 3, 2**62)",
     rf"max_position_embeddings, hidden_size: the position embedding table \(4611686018427387904 × 3 float32\) "
     rf"needs 55340232221128654848 bytes, {_MEMORY}"),
    ("tc.Embeddings(3, 2**40, 4, dtype=np.float64)",
     rf"vocab_size, hidden_size: the word embedding table \(3 × 1099511627776 float64\) needs 26388279066624 "
     rf"bytes, {_MEMORY}"),
    ("tc.BertEmbeddings(tc.BertConfig(vocab_size=3, hidden_size=4, max_position_embeddings=4, type_vocab_size=2**62))",
     rf"type_vocab_size, hidden_size: the token type embedding table \(4611686018427387904 × 4 float32\) needs "
     rf"73786976294838206464 bytes, {_MEMORY}"),
    ("tc.BertEmbeddings({'vocab_size': 2**40, 'hidden_size': 4, 'num_attention_heads': 1})",
     rf"vocab_size, hidden_size: the word embedding table \(1099511627776 × 4 float32\) needs 17592186044416 "
     rf"bytes, {_MEMORY}"),
    # each table fits, the two together do not (the C++ layer checks one table at a time)
    ("V = tc._validation.physical_memory_bytes() // 24\ntc.Embeddings(V, 4, V)",
     rf"vocab_size, hidden_size, max_position_embeddings: the tables together \(\d+ × 4 \+ \d+ × 4 \+ 2 × 4 "
     rf"float32\) need \d+ bytes, {_MEMORY}"),
]


# Each stack fits, the two together (or with Seq2SeqTransformer's tables) do not: each was checked on its
# own, and the model started allocating (std::bad_alloc, or the OOM killer without a limit).
_LAYER_BYTES = ("import math\n"
                "pe = 4 * sum(math.prod(s) for s in tc.nn.TransformerEncoderLayer(4, 1, 4).parameter_shapes().values())\n"
                "pd = 4 * sum(math.prod(s) for s in tc.nn.TransformerDecoderLayer(4, 1, 4).parameter_shapes().values())\n"
                "mem = tc._validation.physical_memory_bytes()\n")
EMBEDDING_TABLES += [
    (_LAYER_BYTES + "n = mem // max(pe, pd) * 3 // 4\n"  # each stack ≤ 3/4 of memory, both more than all of it
     "tc.nn.Transformer(4, 1, n, n, 4)",
     rf"num_encoder_layers, num_decoder_layers: the weights together \(\d+ × \d+ \+ \d+ × \d+ float32\) need "
     rf"\d+ bytes, {_MEMORY}"),
    (_LAYER_BYTES + "n = mem // (pe + pd) // 2\n"  # the stacks half of memory, the tables 3/5 of it
     "V = mem * 3 // 5 // 16 // 3\n"
     "tc.Seq2SeqTransformer(V, V, d_model=4, nhead=1, num_encoder_layers=n, num_decoder_layers=n, "
     "dim_feedforward=4, max_len=8)",
     rf"num_encoder_layers, num_decoder_layers, src_vocab_size, d_model, tgt_vocab_size, max_len: the weights "
     rf"together \(\d+ × \d+ \+ \d+ × \d+ \+ \d+ × 4 \+ \d+ × 4 \+ \d+ × 4 \+ 8 × 4 float32\) need \d+ bytes, "
     rf"{_MEMORY}"),
    # ids whose embeddings (three (N, L, d_model) temporaries) exceed memory: named src, not input_ids
    ("m = tc.Seq2SeqTransformer(10, 10, d_model=512, nhead=8, num_encoder_layers=1, num_decoder_layers=1, "
     "dim_feedforward=8, max_len=32)\n"
     "N = tc._validation.physical_memory_bytes() // (3 * 20 * 512 * 4) + 1\n"
     "m.encode(np.broadcast_to(np.ones((1, 20), np.int64), (N, 20)))",
     rf"src: shape \(\d+, 20\) gives embeddings of shape \(\d+, 20, 512\), whose three temporaries need \d+ "
     rf"bytes, {_MEMORY}"),
]


@pytest.mark.parametrize("code, message", EMBEDDING_TABLES, ids=[c for c, _ in EMBEDDING_TABLES])
def test_embedding_tables_larger_than_memory_name_sizes_and_table(code, message):
    """Checked in Python before the C++ layer allocates anything (under an address-space limit of
    1 GiB more than the interpreter holds, so that old code fails with MemoryError rather than
    exhausting the machine)."""
    limited = ("import resource\n"
               "size = [int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmSize')][0]\n"
               "resource.setrlimit(resource.RLIMIT_AS, (size + 2**30, resource.RLIM_INFINITY))\n" + code)
    import re

    out = run_isolated(limited, timeout=120)
    assert re.fullmatch("ValueError: " + message, out), out


# ------------------------------------------------------------------------------------------------
# from_pretrained: a config.json that the weights contradict names the file and the fields, before
# the model of that config is built
# ------------------------------------------------------------------------------------------------
def _with_config(src: Path, dst: Path, **changes) -> Path:
    """``dst``: ``src``'s weights (linked) beside its config.json with ``changes``."""
    dst.mkdir(parents=True)
    config = json.loads((src / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    for f in src.iterdir():
        if f.name != "config.json":
            (dst / f.name).symlink_to(f)
    return dst


def _refuses_before_building(monkeypatch, cls, directory: Path, message: str) -> None:
    """``cls.from_pretrained(directory)`` raises ValueError ``message`` (the whole message, after
    the path of config.json), builds no model and changes no file."""
    import re

    def built(*args, **kwargs):
        raise AssertionError("the model was built before the config was checked against the weights")

    files = {f.name: f.read_bytes() for f in directory.iterdir() if f.is_file()}
    monkeypatch.setattr(cls, "__init__", built)
    with pytest.raises(ValueError) as info:
        cls.from_pretrained(directory)
    monkeypatch.undo()
    expected = re.escape(str(directory / "config.json")) + ": " + message + r" \(the config does not describe these weights\)"
    assert re.fullmatch(expected, str(info.value)), str(info.value)
    assert {f.name: f.read_bytes() for f in directory.iterdir() if f.is_file()} == files


BERT_CONFIG_VS_WEIGHTS = [
    ({"num_hidden_layers": 0}, r"num_hidden_layers = 0, but model\.safetensors holds layers 0\.\.5"),
    ({"num_hidden_layers": 8}, r"num_hidden_layers = 8, but model\.safetensors holds layers 0\.\.5"),
    ({"max_position_embeddings": 10**6}, r"max_position_embeddings = 1000000, but "
                                         r"embeddings\.position_embeddings\.weight in model\.safetensors has 512 rows"),
    ({"max_position_embeddings": 2**40}, r"max_position_embeddings = 1099511627776, but "
                                         r"embeddings\.position_embeddings\.weight in model\.safetensors has 512 rows"),
    ({"vocab_size": 100}, r"vocab_size = 100, but embeddings\.word_embeddings\.weight in model\.safetensors has "
                          r"30522 rows"),
    ({"type_vocab_size": 3}, r"type_vocab_size = 3, but embeddings\.token_type_embeddings\.weight in "
                             r"model\.safetensors has 2 rows"),
    ({"hidden_size": 96}, r"hidden_size = 96, but embeddings\.word_embeddings\.weight in model\.safetensors has 384 "
                          r"columns \(and 3 more tensors agree\)"),
    ({"intermediate_size": 100}, r"intermediate_size = 100, but encoder\.layer\.0\.intermediate\.dense\.weight in "
                                 r"model\.safetensors has 1536 rows \(and 5 more tensors agree\)"),
    ({"num_hidden_layers": 0, "max_position_embeddings": 10**6},
     r"num_hidden_layers = 0, but model\.safetensors holds layers 0\.\.5; max_position_embeddings = 1000000, but "
     r"embeddings\.position_embeddings\.weight in model\.safetensors has 512 rows"),
]


@pytest.mark.parametrize("changes, message", BERT_CONFIG_VS_WEIGHTS, ids=[str(c) for c, _ in BERT_CONFIG_VS_WEIGHTS])
def test_bert_config_contradicting_the_weights_names_config_json(tmp_path, monkeypatch, changes, message):
    directory = _with_config(MODEL_DIR, tmp_path / "bert", **changes)
    _refuses_before_building(monkeypatch, tc.BertModel, directory, message)


def test_bert_weights_disagreeing_among_themselves_keep_load_state_dicts_error(tmp_path):
    """One layer's tensor of another shape is the file's problem, not the config's: load_state_dict's
    error, prefixed with the weights file (no module is returned, so no "module unchanged")."""
    from safetensors.numpy import load_file, save_file

    d = tmp_path / "one_layer"
    d.mkdir()
    shutil.copy(MODEL_DIR / "config.json", d / "config.json")
    tensors = load_file(str(MODEL_DIR / "model.safetensors"))
    tensors["encoder.layer.3.intermediate.dense.weight"] = np.zeros((100, 384), np.float32)
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match=r"/one_layer/model\.safetensors: the weights do not fit the BertModel that "
                                         r"config\.json describes: mis-shaped: \['encoder\.layer\.3\.intermediate\."
                                         r"dense\.weight: expected \(1536, 384\), got \(100, 384\)'\]$"):
        tc.BertModel.from_pretrained(d)


@pytest.fixture(scope="module")
def tiny_gpt2_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gpt2")
    tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=50, n_positions=16, n_embd=8, n_layer=3, n_head=2)).save_pretrained(d)
    return d


GPT2_CONFIG_VS_WEIGHTS = [
    ({"n_layer": 1}, r"n_layer = 1, but model\.safetensors holds layers 0\.\.2"),
    ({"n_positions": 10**6}, r"n_positions = 1000000, but transformer\.wpe\.weight in model\.safetensors has 16 rows"),
    ({"vocab_size": 60}, r"vocab_size = 60, but transformer\.wte\.weight in model\.safetensors has 50 rows"),
    ({"n_inner": 12}, r"n_inner = 12, but transformer\.h\.0\.mlp\.c_fc\.weight in model\.safetensors has 32 columns "
                      r"\(and 5 more tensors agree\)"),
    ({"n_embd": 4}, r"n_embd = 4, but transformer\.wte\.weight in model\.safetensors has 8 columns \(and 3 more tensors "
                    r"agree\); n_inner = None \(4 \* n_embd = 16\), but transformer\.h\.0\.mlp\.c_fc\.weight in "
                    r"model\.safetensors has 32 columns \(and 5 more tensors agree\)"),
]


@pytest.mark.parametrize("cls", ["GPT2LMHeadModel", "GPT2Model"])
@pytest.mark.parametrize("changes, message", GPT2_CONFIG_VS_WEIGHTS, ids=[str(c) for c, _ in GPT2_CONFIG_VS_WEIGHTS])
def test_gpt2_config_contradicting_the_weights_names_config_json(tiny_gpt2_dir, tmp_path, monkeypatch, cls, changes,
                                                                 message):
    directory = _with_config(tiny_gpt2_dir, tmp_path / "gpt2", **changes)
    _refuses_before_building(monkeypatch, getattr(tc, cls), directory, message)


def test_sharded_weights_are_named_as_the_index_shards(tiny_gpt2_dir, tmp_path, monkeypatch):
    d = tmp_path / "sharded"
    d.mkdir()
    config = json.loads((tiny_gpt2_dir / "config.json").read_text())
    config["n_layer"] = 0
    (d / "config.json").write_text(json.dumps(config))
    shard = "model-00001-of-00001.safetensors"
    (d / shard).symlink_to(tiny_gpt2_dir / "model.safetensors")
    from safetensors import safe_open

    with safe_open(str(tiny_gpt2_dir / "model.safetensors"), framework="numpy") as f:
        names = list(f.keys())
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: shard for n in names}}))
    _refuses_before_building(monkeypatch, tc.GPT2LMHeadModel, d,
                             r"n_layer = 0, but the shards of model\.safetensors\.index\.json hold layers 0\.\.2")


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("llama")
    config = tc.LlamaConfig(vocab_size=50, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    tc.LlamaForCausalLM(config).save_pretrained(d)
    return d


LLAMA_CONFIG_VS_WEIGHTS = [
    ({"num_hidden_layers": 5}, r"num_hidden_layers = 5, but model\.safetensors holds layers 0\.\.1"),
    ({"vocab_size": 60}, r"vocab_size = 60, but model\.embed_tokens\.weight in model\.safetensors has 50 rows "
                         r"\(and 1 more tensor agrees\)"),
    ({"intermediate_size": 16}, r"intermediate_size = 16, but model\.layers\.0\.mlp\.gate_proj\.weight in "
                                r"model\.safetensors has 12 rows \(and 3 more tensors agree\)"),
    ({"num_key_value_heads": 2}, r"num_key_value_heads = 2 with head_dim = hidden_size / num_attention_heads = 4 "
                                 r"\(k_proj's and v_proj's 8 rows\), but model\.layers\.0\.self_attn\.k_proj\.weight "
                                 r"in model\.safetensors has 4 rows \(and 3 more tensors agree\)"),
    ({"num_attention_heads": 4, "head_dim": 4},
     r"num_attention_heads = 4 with head_dim = 4 \(q_proj's 16 rows\), but model\.layers\.0\.self_attn\.q_proj\.weight "
     r"in model\.safetensors has 8 rows \(and 1 more tensor agrees\)"),
    ({"tie_word_embeddings": True}, r"tie_word_embeddings = True, but lm_head\.weight in model\.safetensors differs "
                                    r"from the token embedding \(an untied head, which a tied model cannot hold\)"),
]


@pytest.mark.parametrize("changes, message", LLAMA_CONFIG_VS_WEIGHTS, ids=[str(c) for c, _ in LLAMA_CONFIG_VS_WEIGHTS])
def test_llama_config_contradicting_the_weights_names_config_json(tiny_llama_dir, tmp_path, monkeypatch, changes,
                                                                  message):
    directory = _with_config(tiny_llama_dir, tmp_path / "llama", **changes)
    _refuses_before_building(monkeypatch, tc.LlamaForCausalLM, directory, message)


def test_llama_untied_config_without_a_head_names_tie_word_embeddings(tiny_llama_dir, tmp_path, monkeypatch):
    from safetensors.numpy import load_file, save_file

    d = tmp_path / "headless"
    d.mkdir()
    shutil.copy(tiny_llama_dir / "config.json", d / "config.json")
    tensors = load_file(str(tiny_llama_dir / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(d / "model.safetensors"))
    _refuses_before_building(monkeypatch, tc.LlamaForCausalLM, d, r"tie_word_embeddings = False \(an LM head of its "
                                                                  r"own\), but model\.safetensors holds no lm_head\.weight")
    base = tc.LlamaModel.from_pretrained(d)  # hidden states need no head: loads as before
    assert set(base.state_dict()) == {k.removeprefix("model.") for k in tensors}


def test_llama_tied_config_with_an_identical_head_loads_nan_included(tiny_llama_dir, tmp_path):
    """A tied checkpoint that also stores lm_head.weight loads when the head is the token embedding
    bit for bit, a NaN entry included (compared as bit patterns, a block of rows at a time)."""
    from safetensors.numpy import load_file, save_file

    d = tmp_path / "tied"
    d.mkdir()
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    tensors = load_file(str(tiny_llama_dir / "model.safetensors"))
    embed = tensors["model.embed_tokens.weight"].copy()
    embed[0, 0] = np.nan
    tensors["model.embed_tokens.weight"], tensors["lm_head.weight"] = embed, embed.copy()
    save_file(tensors, str(d / "model.safetensors"))
    model = tc.LlamaForCausalLM.from_pretrained(d)
    np.testing.assert_array_equal(model.state_dict()["model.embed_tokens.weight"], embed)


def test_norms_of_subnormal_float32_rows_with_eps_0():
    """A float32 row of subnormals with eps = 0: 1 / std (about 1e40) overflows float, the
    normalized values do not; they equal the row scaled up first (LayerNorm and RMSNorm are
    scale-invariant at eps = 0; it gave +-inf)."""
    x = np.array([[1.0, -2.0, 3.0, 0.5]], np.float32) * np.float32(1e-40)
    scaled = (x.astype(np.float64) * 1e40).astype(np.float32)
    np.testing.assert_allclose(F.layer_norm(x, eps=0.0), F.layer_norm(scaled, eps=0.0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(F.rms_norm(x, eps=0.0), F.rms_norm(scaled, eps=0.0), rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(F.layer_norm(x, eps=0.0))) and np.all(np.isfinite(F.rms_norm(x, eps=0.0)))


def test_save_pretrained_with_a_folder_in_a_files_place_writes_nothing(tmp_path):
    """A folder named config.json made the last rename fail after model.safetensors had moved in: a
    new weights file without its config. Now refused before anything is written; a bad directory
    type is named."""
    model = tc.LlamaForCausalLM(tc.LlamaConfig(vocab_size=20, hidden_size=8, intermediate_size=12,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                               max_position_embeddings=16))
    for blocked in ("config.json", "model.safetensors"):
        d = tmp_path / blocked.replace(".", "_")
        (d / blocked).mkdir(parents=True)
        with pytest.raises(IsADirectoryError, match=f"cannot write {blocked}: a folder of that name is in the way"):
            model.save_pretrained(d)
        assert sorted(p.name for p in d.iterdir()) == [blocked]  # nothing written, no temporary left
    for bad in (None, 3, b"/tmp/x"):
        with pytest.raises(TypeError, match=r"^directory: expected a str or path, got "):
            model.save_pretrained(bad)


def test_an_array_given_for_a_scalar_is_described_not_printed():
    """A scalar argument given an array is named by its shape and dtype: torch's positional
    ``layer_norm(x, normalized_shape, weight, bias)`` put the bias in ``eps``, whose TypeError
    printed all 768 values (a 4,000-character message); a long repr is cut."""
    import transformer_core.functional as F
    from transformer_core._validation import described
    from transformer_core.parameter import Parameter

    x = np.ones((2, 768), np.float32)
    with pytest.raises(TypeError, match=r"^eps: expected a number, got ndarray \(768,\) float32$"):
        F.layer_norm(x, np.ones(768, np.float32), np.zeros(768, np.float32), np.zeros(768, np.float32))
    with pytest.raises(TypeError, match=r"^is_causal: expected a bool, got ndarray \(4, 4\) bool$"):
        F.scaled_dot_product_attention(x[None], x[None], x[None], None, 0.0, np.ones((4, 4), bool))
    with pytest.raises(TypeError, match=r"^lr: expected a number, got str 'aaaa.*\.\.\. \(5002 characters\)$"):
        tc.optim.SGD([Parameter(np.ones(2))], lr="a" * 5000)
    assert described(0.5) == "float 0.5" and described([1, 2]) == "list [1, 2]"
    # a numpy scalar type (a class with shape and dtype descriptors) and a numpy scalar
    assert described(np.float64) == "type <class 'numpy.float64'>"
    assert described(np.float32(2)) == "float32 2.0"
    # 0-d arrays show their one value; a string or bytes one quoted, so that '8' does not read as 8
    assert described(np.array(2.5)) == "ndarray () float64 2.5"
    assert described(np.array("8")) == "ndarray () <U1 '8'" and described(np.array(b"8")) == "ndarray () |S1 b'8'"
    assert described(np.str_("8")) == "str_ '8'"
    assert described(torch.ones(2, 3)) == "Tensor (2, 3) torch.float32"


# ------------------------------------------------------------------------------------------------
# The feed-forward's hidden activations (rows × dim_feedforward) are checked at entry
# ------------------------------------------------------------------------------------------------
# L rows of width E = 2 into a feed-forward of width F (float32): 2**40 bytes of hidden activations,
# more than the machines that run these tests hold, from 2 MiB of input and 32 MiB of weights per layer.
# The C++ feed-forward checks them only when it runs, after the embeddings and the attention's O(L²)
# work (~14 s on 2 cores), and names its own ``x``: the layers and models check them first.
_FFN_L, _FFN_F = 2**17, 2**21


def _ffn_x(shape=(1, _FFN_L)):
    return np.broadcast_to(np.float32(1), (*shape, 2))  # a view: nothing of that size is allocated


def _ffn_ids(shape=(1, _FFN_L)):
    return np.broadcast_to(np.int64(1), shape)


# Training forwards keep every activation, the attention's too: the same rows as short sequences
_FFN_BATCH = (2**11, _FFN_L // 2**11)


def _ffn_bert():
    return tc.BertModel(tc.BertConfig(vocab_size=8, hidden_size=2, num_hidden_layers=1, num_attention_heads=1,
                                      intermediate_size=_FFN_F, max_position_embeddings=_FFN_L))


def _ffn_seq2seq():
    return tc.Seq2SeqTransformer(8, 8, d_model=2, nhead=1, num_encoder_layers=1, num_decoder_layers=1,
                                 dim_feedforward=_FFN_F, max_len=_FFN_L)


_SHORT = np.ones((1, 3, 2), np.float32)
FFN_ACTIVATIONS = [  # (id, build, call, the argument named, the width's field)
    ("EncoderLayer", lambda: tc.nn.TransformerEncoderLayer(2, 1, _FFN_F), lambda m: m(_ffn_x()), "src",
     "dim_feedforward"),
    ("EncoderLayer-unbatched", lambda: tc.nn.TransformerEncoderLayer(2, 1, _FFN_F, norm_first=True),
     lambda m: m(_ffn_x()[0]), "src", "dim_feedforward"),
    ("EncoderLayer-training", lambda: tc.nn.TransformerEncoderLayer(2, 1, _FFN_F).train(),
     lambda m: m(_ffn_x(_FFN_BATCH)), "src", "dim_feedforward"),
    ("DecoderLayer", lambda: tc.nn.TransformerDecoderLayer(2, 1, _FFN_F), lambda m: m(_ffn_x(), _SHORT), "tgt",
     "dim_feedforward"),
    ("Encoder", lambda: tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(2, 1, _FFN_F), 1),
     lambda m: m(_ffn_x()), "src", "dim_feedforward"),
    ("Decoder", lambda: tc.nn.TransformerDecoder(tc.nn.TransformerDecoderLayer(2, 1, _FFN_F), 1),
     lambda m: m(_ffn_x(), _SHORT), "tgt", "dim_feedforward"),
    ("Transformer-src", lambda: tc.nn.Transformer(2, 1, 1, 1, _FFN_F), lambda m: m(_ffn_x(), _SHORT), "src",
     "dim_feedforward"),
    ("Transformer-tgt", lambda: tc.nn.Transformer(2, 1, 1, 1, _FFN_F), lambda m: m(_SHORT, _ffn_x()), "tgt",
     "dim_feedforward"),
    ("BertModel", _ffn_bert, lambda m: m(_ffn_ids()), "input_ids", "intermediate_size"),
    ("BertModel-training", lambda: _ffn_bert().train(), lambda m: m(_ffn_ids(_FFN_BATCH)), "input_ids",
     "intermediate_size"),
    ("Seq2Seq-src", _ffn_seq2seq, lambda m: m(_ffn_ids(), _ffn_ids()[:, :3]), "src", "dim_feedforward"),
    ("Seq2Seq-tgt", _ffn_seq2seq, lambda m: m(_ffn_ids()[:, :3], _ffn_ids()), "tgt", "dim_feedforward"),
    ("Seq2Seq-decode", _ffn_seq2seq, lambda m: m.decode(_ffn_ids(), _SHORT), "tgt", "dim_feedforward"),
]


@pytest.mark.parametrize("build, call, name, field", [c[1:] for c in FFN_ACTIVATIONS],
                         ids=[c[0] for c in FFN_ACTIVATIONS])
def test_feedforward_activations_larger_than_memory_are_refused_at_entry(build, call, name, field):
    """A sequence whose feed-forward activations no machine holds is refused before any work (in
    well under a second, where the old code first ran the O(L²) attention for many seconds), with a
    ValueError naming the caller's argument, the rows × width and the bytes."""
    need = _FFN_L * _FFN_F * 4
    if need <= tc._validation.physical_memory_bytes():
        pytest.skip("this machine holds the activations")
    model = build()
    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        call(model)
    elapsed = time.perf_counter() - start  # a hang guard, not a timing
    assert re.fullmatch(rf"{name}: shape \([\d, ]+\) needs feed-forward activations of {_FFN_L} rows × {_FFN_F} "
                        rf"\({field}\) float32 values, {need} bytes, {_MEMORY}: use a smaller batch or shorter "
                        "sequences", str(info.value)), str(info.value)
    assert elapsed < 1.0, f"refused after {elapsed:.1f} s"
    assert not getattr(model, "_saved", None)  # a training forward kept nothing


@pytest.mark.parametrize("layers", [0, 1])
@pytest.mark.parametrize("inputs", ["ids", "ids+token_type_ids", "ids+attention_mask+token_type_ids"])
def test_bert_refuses_from_the_shape_before_copying_its_inputs(layers, inputs):
    """BertModel copied input_ids, token_type_ids and attention_mask to int64 / bool before its
    memory checks, each copy checked alone: broadcast views of (2e7, 16) ids cost 2.6-5.8 GB before
    the refusal, (1e8, 16) ones got the process killed, and a model of no layers checked nothing.
    The output (N, L, hidden_size) and the copies are counted together now, from the shapes."""
    N, L = 10**9, 16
    m = tc.BertModel(dict(vocab_size=37, hidden_size=15, num_hidden_layers=layers, num_attention_heads=3,
                          intermediate_size=64, max_position_embeddings=L))
    view = np.broadcast_to(np.int64(1), (N, L))
    kwargs = {name: view for name in inputs.split("+")[1:]}
    per_position = 15 * 4 + 8 + 8 * ("token_type_ids" in kwargs) + ("attention_mask" in kwargs)
    message = (rf"^input_ids: shape \({N}, {L}\) needs {N * L * per_position} bytes for the output \({N}, {L}, 15\) "
               rf"\(hidden_size\) and the inputs' copies, {_MEMORY}$")
    peak = refusal_peak(lambda: m(view, **kwargs), ValueError, message)
    assert peak < 2**20, peak


def _seq2seq():
    from transformer_core.seq2seq import Seq2SeqTransformer

    return Seq2SeqTransformer(20, 20, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                              dim_feedforward=16, max_len=64).eval()


_IDS_LONG = np.broadcast_to(np.int32(1), (1, 10**7))  # int32: its int64 copy would be 80 MB
_IDS_SHORT = np.ones((1, 3), np.int64)
IDS_SHAPE_FIRST = [
    ("bert-embeddings", lambda: tc.bert.BertEmbeddings(dict(vocab_size=37, hidden_size=8, max_position_embeddings=64)),
     lambda m: m(_IDS_LONG), r"^input_ids: sequence length 10000000 exceeds max_position_embeddings \(64\)$"),
    ("learned-positions", lambda: tc.positional.Embeddings(37, 8, 64),
     lambda m: m(_IDS_LONG), r"^input_ids: sequence length 10000000 exceeds max_position_embeddings 64$"),
    ("seq2seq-src", _seq2seq, lambda m: m(_IDS_LONG, _IDS_SHORT), r"^src: length 10000000 exceeds max_len \(64\)$"),
    ("seq2seq-tgt", _seq2seq, lambda m: m(_IDS_SHORT, _IDS_LONG), r"^tgt: length 10000000 exceeds max_len \(64\)$"),
    ("seq2seq-loss", _seq2seq, lambda m: m.loss(_IDS_SHORT, _IDS_LONG, _IDS_LONG), r"^tgt: length 10000000 exceeds max_len"),
    ("seq2seq-encode", _seq2seq, lambda m: m.encode(_IDS_LONG), r"^src: length 10000000 exceeds max_len \(64\)$"),
    ("seq2seq-decode", _seq2seq, lambda m: m.decode(_IDS_LONG, np.zeros((1, 3, 8), np.float32)),
     r"^tgt: length 10000000 exceeds max_len \(64\)$"),
]


@pytest.mark.parametrize("build, call, pattern", [c[1:] for c in IDS_SHAPE_FIRST], ids=[c[0] for c in IDS_SHAPE_FIRST])
def test_ids_too_long_refused_before_their_int64_copy(build, call, pattern):
    """These copied the ids to int64 (80 MB here, 8 GB for 10**9 ids) before checking the length."""
    model = build()
    peak = refusal_peak(lambda: call(model), ValueError, pattern)
    assert peak < 2**20, peak


def test_bert_feedforward_check_counts_the_rows_the_forward_runs():
    """With an attention_mask the eval forward runs the real tokens packed (and, for the pooler, a
    sequence whose position 0 is padding at full length): the check counts those rows, so a call
    the C++ forward runs is not refused for its N · L."""
    L, F = _FFN_L, _FFN_F  # N · L rows: 2**40 bytes of activations; one real token: 8 MiB
    if L * F * 4 <= tc._validation.physical_memory_bytes():
        pytest.skip("this machine holds the activations")
    m = _ffn_bert()
    ids = np.broadcast_to(np.arange(L, dtype=np.int64) % 8, (1, L))
    # one real token, at position 0: one packed row
    mask = np.zeros((1, L), bool)
    mask[0, 0] = True
    out = m(ids, attention_mask=mask)
    ref = m(ids[:, :1])  # the same token alone
    np.testing.assert_allclose(out.last_hidden_state[0, 0], ref.last_hidden_state[0, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.pooler_output, ref.pooler_output, rtol=1e-5, atol=1e-6)
    assert not out.last_hidden_state[0, 1:].any()  # padding rows are zeros
    # ... but a training forward runs all N · L rows (as short sequences here: a training forward
    # keeps the attention's activations too)
    ids_b, mask_b = ids.reshape(_FFN_BATCH), mask.reshape(_FFN_BATCH)
    with pytest.raises(ValueError, match=rf"^input_ids: shape \({_FFN_BATCH[0]}, {_FFN_BATCH[1]}\) needs "
                                         rf"feed-forward activations of {L} rows"):
        m.train()(ids_b, attention_mask=mask_b)
    m.eval()
    m(ids_b, attention_mask=mask_b)  # in eval mode the one real token runs packed
    # one real token at position 1: with the pooler the sequence runs padded (L rows), refused at
    # entry; without it (a sentence encoder's call), packed (one row)
    mask = np.zeros((1, L), bool)
    mask[0, 1] = True
    start = time.perf_counter()
    with pytest.raises(ValueError, match=rf"^input_ids: shape \(1, {L}\) with attention_mask needs feed-forward "
                                         rf"activations of {L} rows × {F} \(intermediate_size\)"):
        m(ids, attention_mask=mask)
    assert time.perf_counter() - start < 1.0
    out = m._forward_eval(ids, mask, pooler=False).last_hidden_state
    ref = m._forward_eval(ids[:, :2], mask[:, :2], pooler=False).last_hidden_state
    np.testing.assert_allclose(out[0, 1], ref[0, 1], rtol=1e-5, atol=1e-6)
    assert not out[0, 0].any() and not out[0, 2:].any()


def test_bert_feedforward_rows_of_a_mask():
    """The rows the C++ eval forward runs its feed-forward on, per mask (the widest call)."""
    from transformer_core.bert import _feedforward_rows

    mask = np.array([[1, 1, 0, 0],    # real at position 0: packed, 2 rows
                     [0, 1, 1, 1],    # padding at position 0: run padded (4 rows) with the pooler
                     [0, 0, 0, 0],    # padding only: no row
                     [1, 0, 1, 0]], bool)
    assert _feedforward_rows(mask, pool=False) == 2 + 3 + 2
    assert _feedforward_rows(mask, pool=True) == max(2 + 2, 1 * 4)
    assert _feedforward_rows(mask[[1, 1, 1]], pool=True) == 3 * 4
    assert _feedforward_rows(np.ones((3, 5), bool), pool=True) == 15
    assert _feedforward_rows(np.zeros((3, 5), bool), pool=True) == 0


def test_bert_without_layers_runs_whatever_its_intermediate_size():
    """No layer, no feed-forward: nothing to refuse (the hidden states are the embeddings')."""
    m = tc.BertModel(tc.BertConfig(vocab_size=8, hidden_size=4, num_hidden_layers=0, num_attention_heads=1,
                                   intermediate_size=2**50, max_position_embeddings=8))
    ids = np.array([[1, 2, 3, 4]])
    emb = tc.BertEmbeddings.from_model(m)(ids)
    np.testing.assert_allclose(m(ids).last_hidden_state, emb, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------------------------
# refused before the copy: quantization, forms, pooling, masks, decode
# ------------------------------------------------------------------------------------------------
def _refused_without_copy(call, exc, message: str, bound: int = 2**21) -> None:
    """``call()`` raises ``exc`` matching ``message``, having allocated less than ``bound`` bytes
    (tracemalloc's peak, numpy's arrays included; 2 MiB: ``masks._smallest_values`` reads a mask
    in blocks of 64Ki values): its arguments are broadcast views whose copies would be 128 MB or
    more, so a check made after a conversion shows here."""
    peak = refusal_peak(call, exc, message)
    assert peak < bound, f"{peak} bytes allocated before the refusal"


def _view(value, *shape):
    """A broadcast view (a few bytes) of ``shape`` holding ``value``."""
    return np.broadcast_to(value, shape)


_Q = tc.quantization
_MF = tc.multihead_forms
#: (8192, 8192) float32: a 256 MB copy
_SQUARE = (8192, 8192)

REFUSED_BEFORE_THE_COPY = [
    # quantization: the last dim of x, then scales' and bias' shapes, then x before the blocks' copy
    (lambda: _Q.quantize_q8_blocks(_view(np.float32(1), 8192, 8191)), ValueError,
     r"^x: expected a last dim that is a multiple of 32, got shape \(8192, 8191\)$"),
    (lambda: _Q.linear_int8(np.ones((2, 32)), np.ones((4, 32), np.int8), _view(np.float32(1), 2**26)), ValueError,
     r"^scales: expected shape \(4,\), got \(67108864,\)$"),
    (lambda: _Q.linear_int8(np.ones((2, 32)), np.ones((4, 32), np.int8), np.ones(4), _view(np.float32(1), 2**26)),
     ValueError, r"^bias: expected shape \(4,\), got \(67108864,\)$"),
    (lambda: _Q.linear_gguf(np.ones((2, 32)), np.zeros(4 * 34, np.uint8), "Q8_0", 4, 32,
                            bias=_view(np.float32(1), 2**26)), ValueError, r"^bias: expected shape \(4,\), got"),
    (lambda: _Q.linear_gguf(np.ones((2, 32)), _view(np.uint8(0), 4096 * 2048 * 34), "Q8_0", 4096, 65536),
     ValueError, r"^x: expected last dim 65536 \(in_features\), got shape \(2, 32\)$"),
    (lambda: _Q.linear_gguf_parts(np.ones((2, 32)), [(_view(np.uint8(0), 4096 * 2048 * 34), "Q8_0", 4096)], 65536),
     ValueError, r"^x: expected last dim 65536 \(in_features\), got shape \(2, 32\)$"),
    # multihead forms: the names and the shapes, before a copy of any value
    (lambda: _MF.from_split_heads({"junk": _view(np.float32(1), *_SQUARE)}), ValueError,
     r"^state: expected W_q/W_k/W_v/W_o or q_linear/k_linear/v_linear/out_linear keys, got \['junk'\]$"),
    (lambda: _MF.from_split_heads({f"{n}.{t}": _view(np.float32(1), 2048, 2048) for n in ("W_q", "W_k", "W_v", "W_o")
                                   for t in ("weight", "bias")}), ValueError,
     r"^state\['W_q.bias'\]: expected shape \(2048,\), got \(2048, 2048\)$"),
    (lambda: _MF.from_per_head({"heads.0.q.weight": _view(np.float32(1), *_SQUARE)}), ValueError,
     r"^state: missing keys: \['heads.0.q.bias'"),
    (lambda: _MF.to_per_head({"in_proj_weight": _view(np.float32(1), 3 * 4096, 4096),
                              "out_proj.weight": _view(np.float32(1), 4096, 4095)}, 4), ValueError,
     r"^state\['out_proj.weight'\]: expected shape \(4096, 4096\), got \(4096, 4095\)$"),
    (lambda: _MF.to_split_heads({"in_proj_weight": _view(np.float32(1), 4096, 4096),
                                 "out_proj.weight": _view(np.float32(1), 4096, 4096)}, "q_linear"), ValueError,
     r"^state\['in_proj_weight'\]: expected shape \(3E, E\)"),
    (lambda: _MF.to_einsum_shared({"in_proj_weight": _view(np.float32(1), 3 * 4096, 4096),
                                   "out_proj.weight": _view(np.float32(1), 4096, 4096)}, 3), ValueError,
     r"^num_heads: expected a divisor of embed_dim 4096, got 3$"),
    (lambda: _MF.from_einsum_shared({"fc_out.weight": _view(np.float32(1), *_SQUARE),
                                     "fc_out.bias": _view(np.float32(1), 8192)}, 4), ValueError,
     r"^state: missing keys: \['values.weight', 'keys.weight', 'queries.weight'\]$"),
    (lambda: _MF.from_einsum_as_written({"fc_out.weight": _view(np.float32(1), *_SQUARE),
                                         "fc_out.bias": _view(np.float32(1), 8191)}, 4), ValueError,
     r"^state\['fc_out.bias'\]: expected shape \(8192,\), got \(8191,\)$"),
    # pooling and similarity: the shapes before the float copies
    (lambda: tc.cosine_similarity(_view(np.float32(1), *_SQUARE), np.ones((3, 5))), ValueError,
     r"^b: expected rows of width 8192 \(a's\), got shape \(3, 5\)$"),
    (lambda: tc.cosine_similarity(np.ones((3, 5)), _view(np.float64(1), 4096, 8192)), ValueError,
     r"^b: expected rows of width 5 \(a's\), got shape \(4096, 8192\)$"),
    (lambda: tc.mean_pool(_view(np.float32(1), 2048, 2048, 16), _view(np.int64(1), 2048, 2047)), ValueError,
     r"^attention_mask: expected shape \(2048, 2048\) \(last_hidden_state's N, L\), got \(2048, 2047\)$"),
    # masks: a broadcast view's values, before its full-size result
    (lambda: tc.masks.from_hf(_view(np.int64(2), *_SQUARE)), ValueError,
     r"^mask: expected only 0 \(padding\) and 1 \(real token\), got values such as \[2\]$"),
    (lambda: tc.masks.from_hf(_view(np.array([0, 1, 7, 1], np.int8), 2**25, 4)), ValueError,
     r"^mask: expected only 0 \(padding\) and 1 \(real token\), got values such as \[7\]$"),
]


@pytest.mark.parametrize("call, exc, message", REFUSED_BEFORE_THE_COPY,
                         ids=[f"{i}-{m[:40]}" for i, (_, _, m) in enumerate(REFUSED_BEFORE_THE_COPY)])
def test_refused_before_the_copy(call, exc, message):
    """Checks that need only shapes (or the values a broadcast view holds) come before the copies
    of the conversions: each call here used to copy 128 MB to 1 GB before its refusal."""
    _refused_without_copy(call, exc, message)


@pytest.fixture(scope="module")
def _tokenizer():
    return tc.Tokenizer.from_pretrained(MODEL_DIR)


@pytest.mark.parametrize("ids, first", [
    (lambda: _view(np.int32(10**9), 4 * 10**6), 10**9),
    (lambda: np.concatenate([np.full(2 * 10**6, 1000, np.int64), [-3, 10**9]]), -3),
    (lambda: _view(np.uint64(2**64 - 1), 4 * 10**6), 2**64 - 1),
    (lambda: range(10**9, 10**9 + 4 * 10**6), 10**9),
    (lambda: range(5, 4 * 10**6), None),           # the first id past the vocabulary, in order
    (lambda: range(7, -4 * 10**6, -3), -2),
])
def test_decode_checks_the_ids_range_before_listing_them(_tokenizer, ids, first):
    """decode refuses an id outside the vocabulary before it lists the ids (about 40 bytes an id: a
    broadcast view of 4 million ids was 150 MB of Python ints first), naming the id the listing
    would reach first."""
    limit = _tokenizer._id_limit()[0]
    first = limit if first is None else first
    _refused_without_copy(lambda: _tokenizer.decode(ids()), ValueError,
                          rf"^ids: token id {first} is outside the vocabulary \[0, {limit}\)$",
                          bound=2**21 if isinstance(ids(), range) or ids().strides == (0,) else 2**25)


def test_decode_of_a_broadcast_view_and_a_range_are_their_lists(_tokenizer):
    """Valid ids decode as before: a broadcast view or a range as the list of their values."""
    assert _tokenizer.decode(_view(np.int32(2023), 3)) == _tokenizer.decode([2023, 2023, 2023])
    assert _tokenizer.decode(range(2023, 2030, 3)) == _tokenizer.decode([2023, 2026, 2029])
    assert _tokenizer.decode(range(2029, 2020, -3)) == _tokenizer.decode([2029, 2026, 2023])


def test_checked_before_the_copy_still_computes_as_before(rng):
    """The conversions moved after the checks give the values they gave: torch's for the pooling
    and the similarity, the mask's for from_hf, the inputs for the forms."""
    h = rng.standard_normal((2, 3, 4)).astype(np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    ref = (torch.from_numpy(h) * torch.from_numpy(mask)[..., None]).sum(1) / torch.from_numpy(mask).sum(1, keepdim=True)
    np.testing.assert_allclose(tc.mean_pool(h, _view(mask, 2, 3)), ref.numpy(), rtol=1e-6)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((2, 4)).astype(np.float32)
    ref = torch.nn.functional.cosine_similarity(torch.from_numpy(a)[:, None], torch.from_numpy(b).double()[None], dim=-1)
    out = tc.cosine_similarity(a, b)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-12)
    m = tc.masks.from_hf(_view(np.array([1, 0, 1], np.int64), 2, 3))
    assert m.flags.writeable and m.tolist() == [[True, False, True]] * 2
    E = 4
    state = {f"{n}.{t}": rng.standard_normal((E, E) if t == "weight" else (E,)).astype(np.float16)
             for n in ("W_q", "W_k", "W_v", "W_o") for t in ("weight", "bias")}
    out = _MF.from_split_heads(state)
    assert all(v.dtype == np.float32 for v in out.values())
    np.testing.assert_array_equal(out["in_proj_weight"], np.concatenate([state[f"{n}.weight"] for n in "W_q W_k W_v".split()]))
    back = _MF.to_split_heads(out)
    assert not np.shares_memory(back["W_o.weight"], out["out_proj.weight"])
    np.testing.assert_array_equal(back["W_o.weight"], state["W_o.weight"])
    qw, scales = _Q.quantize_int8(rng.standard_normal((4, 32)))
    x = rng.standard_normal((2, 32))
    np.testing.assert_array_equal(_Q.linear_int8(x, qw, _view(scales, 4) * 1, bias=_view(np.float64(0.5), 4)),
                                  _Q.linear_int8(x, qw, scales, bias=np.full(4, 0.5, np.float32)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpp_layers_check_the_feature_size_themselves(dtype):
    # The last line of defence behind the Python checks: a C++ layer given rows of another width
    # (a Python size attribute changed after construction once reached it) refuses them, naming
    # the argument, instead of reading past the array (a segfault for Linear(1 << 22, 1)).
    from transformer_core._runtime import core

    sfx = "_f32" if dtype == np.float32 else "_f64"
    linear = getattr(core, "Linear" + sfx)(1 << 16, 1, False)
    with pytest.raises(ValueError, match=r"x: expected 2 dimensions, the last of 65536 .*got shape \(1, 1\)"):
        linear.forward(np.ones((1, 1), dtype))
    norm = getattr(core, "LayerNorm" + sfx)(4, 1e-5, True)
    with pytest.raises(ValueError, match=r"x: .*the last of 4 .*got shape \(2, 5\)"):
        norm.forward(np.ones((2, 5), dtype))
    ffn = getattr(core, "FeedForward" + sfx)(8, 16, "relu", True)
    with pytest.raises(ValueError, match=r"x: .*the last of 8 "):
        ffn.forward(np.ones((3, 16), dtype))
    layer = getattr(core, "TransformerEncoderLayer" + sfx)(8, 2, 16, "relu", 1e-5, False, True)
    with pytest.raises(ValueError, match=r"src: expected 3 dimensions, the last of 8 .*got shape \(1, 3, 16\)"):
        layer.forward(np.ones((1, 3, 16), dtype), None, None, None, False, "auto")
    # the right width still computes (the check is not a refusal of everything)
    assert linear.forward(np.ones((2, 1 << 16), dtype)).shape == (2, 1)
    assert np.isfinite(norm.forward(np.arange(8, dtype=dtype).reshape(2, 4))).all()


# ------------------------------------------------------------------------------------------------
# functional ops: the copies an op makes after its arguments' own conversion are checked too, and
# every shape is checked before any copy
# ------------------------------------------------------------------------------------------------
def test_softmax_over_another_dim_checks_its_result_and_copy():
    """softmax over a dim other than the last runs in the layout of x (no copy with the dim moved
    last, which once went unchecked: a numpy MemoryError). What it makes is checked before it is
    made: the result of a float32 x larger than this machine's memory (a sparse file mapped
    read-only: no memory used), and the float32 copy of a float16 x of half that size. Each is a
    ValueError naming x, under an address-space limit of 1 GiB more than the interpreter holds."""
    code = ("import os, resource, tempfile\n"
            "mem = tc._validation.physical_memory_bytes()\n"
            "c = mem // 4 // 1024 + 1\n"  # (1024, c) values: 4 bytes each, more than mem
            "results = []\n"
            "for dtype in (np.float32, np.float16):\n"
            "    fd, fn = tempfile.mkstemp()\n"
            "    os.truncate(fn, 1024 * c * np.dtype(dtype).itemsize)\n"
            "    x = np.memmap(fn, dtype=dtype, mode='r', shape=(1024, c))\n"
            "    os.close(fd); os.unlink(fn)\n"
            "    size = [int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmSize')][0]\n"
            "    resource.setrlimit(resource.RLIMIT_AS, (size + 2**30, resource.RLIM_INFINITY))\n"
            "    try:\n"
            "        F.softmax(x, 0)\n"
            "        results.append('NO ERROR')\n"
            "    except Exception as e:\n"
            "        results.append(type(e).__name__ + ': ' + str(e))\n"
            "    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
            "    del x\n"
            "raise ValueError(' | '.join(results))\n")
    out = run_isolated(code)
    results = out.removeprefix("ValueError: ").split(" | ")
    assert len(results) == 2, out
    assert results[0].startswith("ValueError: x: ") and "exceed this machine's memory" in results[0], out
    assert results[1].startswith("ValueError: x: an array of shape (1024, "), out
    assert "more than this machine's memory" in results[1], out


def test_softmax_over_another_dim_matches_torch_with_one_copy(rng):
    """float16 widened in one copy, any dim, and a non-contiguous float64: the values torch's."""
    x = rng.standard_normal((5, 3, 4)).astype(np.float16)
    for dim in (0, 1, -2, 2, -1):
        want = torch.softmax(torch.from_numpy(x.astype(np.float64)), dim).numpy()
        got = F.softmax(x, dim)
        assert got.dtype == np.float32 and got.shape == x.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    x64 = rng.standard_normal((4, 6))[:, ::-1]  # non-contiguous float64
    np.testing.assert_allclose(F.softmax(x64, 0), torch.softmax(torch.from_numpy(x64.copy()), 0).numpy(),
                               rtol=1e-12, atol=1e-12)


def test_cross_entropy_checks_the_int64_copy_of_target():
    """cross_entropy (and its backward, which shares the checks) copies target to int64 and makes
    bool arrays of its size for the range check: unchecked, a numpy MemoryError. The logits here
    (float32, one class) need half this machine's memory and pass their own check; an int64 or int8
    target's copy needs all of it: a ValueError naming target, before any copy."""
    code = ("mem = tc._validation.physical_memory_bytes()\n"
            "N = mem // 8 + 1\n"
            "logits = np.broadcast_to(np.float32(0), (N, 1))\n"
            "results = []\n"
            "for call in (F.cross_entropy, tc.backward.cross_entropy_backward):\n"
            "    for dtype in (np.int64, np.int8):\n"
            "        try:\n"
            "            call(logits, np.broadcast_to(dtype(0), (N,)))\n"
            "            results.append('NO ERROR')\n"
            "        except Exception as e:\n"
            "            results.append(type(e).__name__ + ': ' + str(e))\n"
            "raise ValueError(' | '.join(results))\n")
    out = _under_memory_limit(code)
    results = out.removeprefix("ValueError: ").split(" | ")
    assert len(results) == 4, out
    for got in results:
        assert got.startswith("ValueError: target: its int64 copy and the range check's bool arrays: an array of "
                              "shape ("), out
        assert "more than this machine's memory" in got, out


def test_cross_entropy_range_check_matches_torch(rng):
    """The range check, now made in place, refuses and accepts what it did; the loss is torch's."""
    logits = rng.standard_normal((6, 4)).astype(np.float32)
    target = np.array([0, 3, -100, 2, 1, -100], np.int8)
    want = torch.nn.functional.cross_entropy(torch.from_numpy(logits.astype(np.float64)),
                                             torch.from_numpy(target.astype(np.int64)))
    np.testing.assert_allclose(F.cross_entropy(logits, target), want.item(), rtol=1e-6)
    for bad, value, where in (([0, 4, 1, 1, 1, 1], 4, 1), ([0, 1, 1, -1, 1, 1], -1, 3)):
        with pytest.raises(ValueError, match=rf"^target: expected class indices in \[0, 4\) or ignore_index "
                                             rf"\(-100\), got {value} at index \({where},\)$"):
            F.cross_entropy(logits, np.array(bad, np.int16))


def test_linear_refuses_an_output_beyond_memory_before_copying_x_and_weight():
    """linear's output size was checked only in C++, after x and weight were copied (broadcast views
    here: tens of MB before the refusal, GBs for wider ones), and its error named no argument. Now a
    ValueError naming x and weight, on the shapes as given: next to nothing allocated."""
    mem = tc._validation.physical_memory_bytes()
    n = math.isqrt(mem // 4) + 1  # (n, n) float32: more than this machine's memory
    k = 64
    x = np.broadcast_to(np.float32(1), (n, k))
    w = np.broadcast_to(np.float16(1), (n, k))
    assert n * n * 4 > mem
    peak = refusal_peak(lambda: F.linear(x, w), ValueError,
                        rf"^x, weight: the output \(\.\.\., out_features\): an array of shape \({n}, {n}\) needs "
                        rf"{n * n * 4} bytes, more than this machine's memory \({mem} bytes\)$")
    assert peak < 2**20, f"{peak} bytes allocated before the refusal"
    x64 = np.broadcast_to(np.float64(1), (2, n // 2 + 1, k))  # float64: 8 bytes a value, leading dims kept
    peak = refusal_peak(lambda: F.linear(x64, w, np.zeros(n, np.float32)), ValueError,
                        rf"^x, weight: the output \(\.\.\., out_features\): an array of shape "
                        rf"\(2, {n // 2 + 1}, {n}\) needs {2 * (n // 2 + 1) * n * 8} bytes")
    assert peak < 2**20, f"{peak} bytes allocated before the refusal"


def test_sdpa_masks_are_checked_before_any_is_converted(rng):
    """Every mask's dtype and shape is checked on the array as given, before any mask is converted:
    a float64 attn_mask (converted to float32) or an int 0/1 key_mask (read as bools) of the wrong
    shape was converted first, and a valid attn_mask was converted before a bad query_mask or
    key_mask was refused (MBs here, the mask's size in general)."""
    q = np.zeros((1, 1, 5, 8), np.float32)
    qL = np.zeros((1, 1, 1000, 8), np.float32)
    good = np.zeros((1000, 1000))  # float64: its float32 copy is 4 MB
    big, big_int, big_uint8 = np.zeros((2000, 1000)), np.ones((2000, 1000), np.int64), np.ones((2000, 1000), np.uint8)
    cases = [
        (lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=big), ValueError,
         r"^attn_mask: shape \(2000, 1000\) does not broadcast to the expected \(1, 1, 5, 5\)$"),
        (lambda: F.scaled_dot_product_attention(q, q, q, key_mask=big_int), ValueError,
         r"^key_mask: expected shape \(5,\) or \(1, 5\) or \(1, 1, 5\) \(each leading dim may be 1\) "
         r"\(key length 5\), got \(2000, 1000\)$"),
        (lambda: F.scaled_dot_product_attention(q, q, q, query_mask=big_uint8), ValueError,
         r"^query_mask: expected shape \(5,\) or \(1, 5\) or \(1, 1, 5\) \(each leading dim may be 1\) "
         r"\(query length 5\), got \(2000, 1000\)$"),
        (lambda: F.scaled_dot_product_attention(qL, qL, qL, good, query_mask=np.ones(7, bool)), ValueError,
         r"^query_mask: expected shape \(1000,\) or \(1, 1000\) or \(1, 1, 1000\) .*got \(7,\)$"),
        (lambda: F.scaled_dot_product_attention(qL, qL, qL, good, key_mask=np.ones((1, 2, 1000), bool)), ValueError,
         r"^key_mask: shape \(1, 2, 1000\) does not broadcast to the expected \(1, 1, 1000\)$"),
        (lambda: F.scaled_dot_product_attention(qL, qL, qL, good, key_mask=np.ones(1000)), TypeError,
         r"^key_mask: expected bool or integer 0/1"),
        (lambda: F.scaled_dot_product_attention(qL, qL, qL, good, key_mask=np.full(1000, 2)), ValueError,
         r"^key_mask: expected a bool or 0/1 mask, got values such as \[2\]$"),
    ]
    for call, error, match in cases:
        refusal_peak(call, error, match)  # a first call: numpy loads some modules lazily (traced too)
        peak = refusal_peak(call, error, match)
        assert peak < 2**20, f"{match}: {peak} bytes allocated before the refusal"
    # the masks checked first still mean what they did: torch's values
    L, S = 6, 7
    qs = rng.standard_normal((2, 3, L, 8))
    ks, vs = (rng.standard_normal((2, 3, S, 8)) for _ in range(2))
    add = rng.standard_normal((L, S))
    qm = np.array([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 0]], np.int32)
    km = rng.random((2, 3, S)) > 0.3
    km[..., 0] = True
    ours = F.scaled_dot_product_attention(qs, ks, vs, add, query_mask=qm, key_mask=km)
    keep = qm.astype(bool)[:, None, :, None] & km[:, :, None, :]
    bias = torch.from_numpy(np.where(keep, add, -np.inf))
    want = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (qs, ks, vs)),
                                                             attn_mask=bias).numpy()
    want[~qm.astype(bool)[:, None, :].repeat(3, 1)] = 0.0  # a masked query row: zeros (torch: NaN)
    np.testing.assert_allclose(ours, want, rtol=1e-10, atol=1e-12)
