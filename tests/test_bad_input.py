"""Bad input raises ValueError / TypeError naming the offending argument -- never a crash."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import MODEL_NAME, randn, traced_refusal
from safetensors.numpy import load_file, save_file

F = tc.functional
ERR = (ValueError, TypeError)


def _qkv(rng, N=2, L=7, S=9, E=8, Ev=5):
    return randn(rng, (N, L, E)), randn(rng, (N, S, E)), randn(rng, (N, S, Ev))


# ------------------------------------------------------------------------------------- functional
@pytest.mark.parametrize("case,match", [
    ("x_scalar", r"\bx\b"),
    ("weight_1d", "weight"),
    ("weight_in_mismatch", "weight"),
    ("bias_shape", "bias"),
    ("x_empty", r"\bx\b|weight"),
    ("x_complex", r"\bx\b"),
    ("x_string", r"\bx\b"),
])
def test_linear_bad_input(rng, case, match):
    x, w, b = randn(rng, (3, 9)), randn(rng, (4, 9)), randn(rng, (4,))
    args = {
        "x_scalar": (np.float32(1.0), w, b),
        "weight_1d": (x, randn(rng, (9,)), b),
        "weight_in_mismatch": (x, randn(rng, (4, 8)), b),
        "bias_shape": (x, w, randn(rng, (5,))),
        "x_empty": (np.zeros((3, 0), np.float32), np.zeros((4, 0), np.float32), b),
        "x_complex": (x.astype(np.complex64), w, b),
        "x_string": (np.array([["a", "b"]]), w, b),
    }[case]
    with pytest.raises(ERR, match=match):
        F.linear(*args)


def test_softmax_bad_dim(rng):
    with pytest.raises(ValueError, match=r"^dim: expected an int in \[-2, 1\], got 2$"):
        F.softmax(randn(rng, (3, 4)), dim=2)
    with pytest.raises(ERR, match=r"\bx\b"):
        F.softmax(np.zeros((3, 0), np.float32))


def test_layer_norm_bad_params(rng):
    x = randn(rng, (3, 9))
    with pytest.raises(ERR, match="weight"):
        F.layer_norm(x, randn(rng, (8,)), randn(rng, (9,)))
    with pytest.raises(ERR, match="bias"):
        F.layer_norm(x, randn(rng, (9,)), randn(rng, (9, 1)))


def test_gelu_bad_approximate(rng):
    with pytest.raises(ValueError, match="approximate"):
        F.gelu(randn(rng, (3,)), approximate="fast")


# 0-d (and empty) arrays into every functional op that hands arrays to C++: the ops whose C++ side
# works on rows of the last dim need >= 1 dim and say so; none may crash. Run in a subprocess, so
# that a segfault (F.glu(1.0, 2.0) was one) fails these tests instead of ending the run.
SCALAR_CASES = [
    ("F.glu(1.0, 2.0)", "gate"),
    ("F.glu(np.float64(1.0), np.ones(3))", "gate"),
    ("F.glu(np.ones(3), 2.0)", "up"),
    ("F.glu(np.ones(0), np.ones(0))", "gate"),
    ("tc.backward.glu_backward(1.0, 2.0, 1.0)", "gate"),
    ("F.softmax(1.0)", "x"),
    ("F.layer_norm(1.0)", "x"),
    ("F.rms_norm(1.0)", "x"),
    ("F.linear(1.0, np.ones((1, 1)))", "x"),
    ("F.cross_entropy(1.0, 0)", "logits"),
    ("F.rotate_half(1.0)", "x"),
    ("F.apply_rotary(1.0, 1.0, 1.0)", "x"),
    ("F.apply_rotary_pos_emb(1.0, 1.0, 1.0, 1.0)", "q"),
    ("F.scaled_dot_product_attention(1.0, 1.0, 1.0)", "query"),
    ("F.scaled_dot_product_attention(1.0, 1.0, 1.0, enable_gqa=True)", "query"),
    ("F.varlen_attention(1.0, 1.0, 1.0, [0, 1])", "query"),
    ("F.gelu(np.ones(0))", "x"),
    ("F.dropout(np.ones((2, 0)), 0.5, 1)", "x"),
]


def _run_cases(calls: list[str]) -> list[str]:
    """``Type: message`` (or ``NO ERROR``) of each call, run one after another in a fresh
    interpreter; asserts the interpreter did not crash."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import numpy as np, transformer_core as tc\nF = tc.functional\n"
            "for call in %r:\n"
            "    try:\n        eval(call)\n    except Exception as e:\n"
            "        print(type(e).__name__ + ': ' + str(e).replace(chr(10), ' '), flush=True)\n"
            "    else:\n        print('NO ERROR', flush=True)\n") % (calls,)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(tc.__file__).parent.parent), env.get("PYTHONPATH")]))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    done = p.stdout.splitlines()
    assert p.returncode == 0, f"crashed (exit code {p.returncode}) at {calls[len(done)]!r}: {p.stderr[-1000:]}"
    return done


def test_scalar_and_empty_inputs_are_named_errors():
    results = _run_cases([call for call, _ in SCALAR_CASES])
    for (call, name), out in zip(SCALAR_CASES, results):
        assert out.startswith("ValueError: "), f"{call}: {out}"
        assert out.split(": ", 1)[1].startswith(name + ":"), f"{call}: expected the error to name {name!r}: {out}"


def test_glu_needs_one_dim():
    """The C++ op read shape(-1) of a 0-d gate: a segfault (so the calls run in a subprocess)."""
    assert _run_cases(["F.glu(np.float32(1.0), np.float32(2.0))", "F.glu(np.ones(2), np.float32(2.0))",
                       "tc.backward.glu_backward(1.0, 2.0, 1.0)"]) == [
        "ValueError: gate: expected at least 1 dims, got 0-D with shape ()",
        "ValueError: up: expected at least 1 dims, got 0-D with shape ()",
        "ValueError: gate: expected at least 1 dims, got 0-D with shape ()"]
    np.testing.assert_allclose(F.glu([1.0], [2.0], "relu"), [2.0])  # (1,) is fine


# ---------------------------------------------------------------------------------- attention op
SDPA_CASES = [
    # name, match
    ("query_1d", "query"),
    ("key_1d", "key"),
    ("rank_mismatch", "key|value"),
    ("key_embed_mismatch", "key"),
    ("value_seq_mismatch", "value"),
    ("key_batch_mismatch", "key"),
    ("value_batch_mismatch", "value"),
    ("empty_L", "query"),
    ("empty_E", "query"),
    ("empty_S", "key"),
    ("attn_mask_shape", "attn_mask"),
    ("attn_mask_complex", "attn_mask"),
    ("attn_mask_string", "attn_mask"),
    ("key_mask_shape", "key_mask"),
    ("key_mask_string", "key_mask"),
    ("key_mask_complex", "key_mask"),
    ("query_mask_shape", "query_mask"),
    ("query_complex", "query"),
]


@pytest.mark.parametrize("case,match", SDPA_CASES, ids=[c for c, _ in SDPA_CASES])
def test_sdpa_bad_input(rng, case, match):
    q, k, v = _qkv(rng)
    kw = {}
    if case == "query_1d":
        q = randn(rng, (8,))
    elif case == "key_1d":
        k = randn(rng, (8,))
    elif case == "rank_mismatch":
        k, v = k[None], v[None]
    elif case == "key_embed_mismatch":
        k = randn(rng, (2, 9, 7))
    elif case == "value_seq_mismatch":
        v = randn(rng, (2, 8, 5))
    elif case == "key_batch_mismatch":
        k = randn(rng, (3, 9, 8))
    elif case == "value_batch_mismatch":
        v = randn(rng, (3, 9, 5))
    elif case == "empty_L":
        q = np.zeros((2, 0, 8), np.float32)
    elif case == "empty_E":
        q, k = np.zeros((2, 7, 0), np.float32), np.zeros((2, 9, 0), np.float32)
    elif case == "empty_S":
        k, v = np.zeros((2, 0, 8), np.float32), np.zeros((2, 0, 5), np.float32)
    elif case == "attn_mask_shape":
        kw["attn_mask"] = np.ones((7, 8), bool)
    elif case == "attn_mask_complex":
        kw["attn_mask"] = np.ones((7, 9), np.complex64)
    elif case == "attn_mask_string":
        kw["attn_mask"] = np.full((7, 9), "x")
    elif case == "key_mask_shape":
        kw["key_mask"] = np.ones((2, 8), bool)
    elif case == "key_mask_string":
        kw["key_mask"] = np.full((2, 9), "yes")
    elif case == "key_mask_complex":
        kw["key_mask"] = np.ones((2, 9), np.complex128)
    elif case == "query_mask_shape":
        kw["query_mask"] = np.ones((2, 9), bool)
    elif case == "query_complex":
        q = q.astype(np.complex64)
    with pytest.raises(ERR, match=match):
        F.scaled_dot_product_attention(q, k, v, **kw)


# --------------------------------------------------------------------------------------- layers
@pytest.mark.parametrize("E,H", [(10, 3), (7, 2), (9, 4)])
def test_mha_embed_dim_not_divisible(E, H):
    with pytest.raises(ValueError, match="num_heads|embed_dim"):
        tc.nn.MultiheadAttention(E, H)


@pytest.mark.parametrize("E,H", [(0, 1), (8, 0), (-4, 2)])
def test_mha_nonpositive_sizes(E, H):
    with pytest.raises(ERR, match="num_heads|embed_dim"):
        tc.nn.MultiheadAttention(E, H)


MHA_CASES = [
    ("query_1d", "query"),
    ("query_embed", "query"),
    ("key_embed", "key"),
    ("key_batch", "key"),
    ("value_seq", "value"),
    ("empty_L", "query"),
    ("key_mask_shape", "key_mask"),
    ("key_mask_string", "key_mask"),
    ("attn_mask_shape", "attn_mask"),
    ("attn_mask_heads", "attn_mask"),
    ("attn_mask_complex", "attn_mask"),
]


@pytest.mark.parametrize("case,match", MHA_CASES, ids=[c for c, _ in MHA_CASES])
def test_mha_bad_input(rng, case, match):
    N, L, S, E, H = 2, 7, 9, 8, 2
    mha = tc.nn.MultiheadAttention(E, H)
    q, kv = randn(rng, (N, L, E)), randn(rng, (N, S, E))
    args, kw = [q, kv, kv], {}
    if case == "query_1d":
        args = [randn(rng, (E,))]
    elif case == "query_embed":
        args = [randn(rng, (N, L, E + 1))]
    elif case == "key_embed":
        args = [q, randn(rng, (N, S, E + 1)), randn(rng, (N, S, E))]
    elif case == "key_batch":
        args = [q, randn(rng, (N + 1, S, E)), randn(rng, (N + 1, S, E))]
    elif case == "value_seq":
        args = [q, kv, randn(rng, (N, S + 1, E))]
    elif case == "empty_L":
        args = [np.zeros((N, 0, E), np.float32), kv, kv]
    elif case == "key_mask_shape":
        kw["key_mask"] = np.ones((N, S + 1), bool)
    elif case == "key_mask_string":
        kw["key_mask"] = np.full((N, S), "a")
    elif case == "attn_mask_shape":
        kw["attn_mask"] = np.ones((L + 1, S), bool)
    elif case == "attn_mask_heads":
        kw["attn_mask"] = np.ones((N * H + 1, L, S), bool)
    elif case == "attn_mask_complex":
        kw["attn_mask"] = np.ones((L, S), np.complex64)
    with pytest.raises(ERR, match=match):
        mha(*args, **kw)


def test_encoder_layer_bad_construction():
    with pytest.raises(ValueError, match="nhead|d_model|num_heads|embed_dim"):
        tc.nn.TransformerEncoderLayer(10, 3)
    with pytest.raises(ValueError, match="activation"):
        tc.nn.TransformerEncoderLayer(8, 2, activation="sigmoid")
    with pytest.raises(ValueError, match="activation"):
        tc.nn.FeedForward(8, 16, activation="sigmoid")


@pytest.mark.parametrize("case,match", [("src_embed", r"\bsrc\b"), ("src_1d", r"\bsrc\b"),
                                        ("key_mask_shape", "src_key_mask"),
                                        ("src_mask_shape", "src_mask")])
def test_encoder_layer_bad_input(rng, case, match):
    layer = tc.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16)
    x = randn(rng, (2, 7, 8))
    kw = {}
    if case == "src_embed":
        x = randn(rng, (2, 7, 9))
    elif case == "src_1d":
        x = randn(rng, (8,))
    elif case == "key_mask_shape":
        kw["src_key_mask"] = np.ones((2, 6), bool)
    elif case == "src_mask_shape":
        kw["src_mask"] = np.ones((7, 6), bool)
    with pytest.raises(ERR, match=match):
        layer(x, **kw)


# ------------------------------------------------------------------------------------------ BERT
@pytest.fixture(scope="module")
def small_ckpt(tmp_path_factory):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=37, max_position_embeddings=64)
    path = tmp_path_factory.mktemp("bad_input_bert")
    BertModel(cfg).save_pretrained(str(path), safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def small_bert(small_ckpt):
    return tc.BertModel.from_pretrained(str(small_ckpt))


@pytest.mark.parametrize("bad_id", [-1, 99, 1000, -100])
def test_bert_token_ids_out_of_vocab(small_bert, bad_id):
    ids = np.array([[1, 2, 3, bad_id, 5]], np.int64)
    with pytest.raises(ValueError, match="input_ids"):
        small_bert(ids)


def test_bert_token_ids_out_of_vocab_minilm(tc_bert):
    with pytest.raises(ValueError, match="input_ids"):
        tc_bert(np.array([[101, 30522, 102]], np.int64))
    with pytest.raises(ValueError, match="input_ids"):
        tc_bert(np.array([[101, -5, 102]], np.int64))


@pytest.mark.parametrize("L", [65, 100])
def test_bert_sequence_too_long(small_bert, L):
    ids = np.ones((2, L), np.int64)
    with pytest.raises(ValueError, match="max_position_embeddings|input_ids"):
        small_bert(ids)
    small_bert(np.ones((2, 64), np.int64))  # exactly max_position_embeddings is fine


def test_bert_sequence_too_long_minilm(tc_bert):
    with pytest.raises(ValueError, match="max_position_embeddings|input_ids"):
        tc_bert(np.ones((1, 513), np.int64))


@pytest.mark.parametrize("case,match", [
    ("token_type_oob", "token_type_ids"),
    ("token_type_shape", "token_type_ids"),
    ("attention_mask_shape", "attention_mask"),
    ("ids_float", "input_ids"),
    ("ids_string", "input_ids"),
    ("ids_empty", "input_ids"),
    ("ids_3d", "input_ids"),
])
def test_bert_bad_inputs(small_bert, case, match):
    ids = np.ones((2, 5), np.int64)
    kw = {}
    if case == "token_type_oob":
        kw["token_type_ids"] = np.full((2, 5), 2, np.int64)
    elif case == "token_type_shape":
        kw["token_type_ids"] = np.zeros((2, 4), np.int64)
    elif case == "attention_mask_shape":
        kw["attention_mask"] = np.ones((2, 6), np.int64)
    elif case == "ids_float":
        ids = np.full((2, 5), 1.5)
    elif case == "ids_string":
        ids = np.full((2, 5), "a")
    elif case == "ids_empty":
        ids = np.zeros((2, 0), np.int64)
    elif case == "ids_3d":
        ids = np.ones((2, 5, 1), np.int64)
    with pytest.raises(ERR, match=match):
        small_bert(ids, **kw)


def _rewrite(src, dst, fn):
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    save_file(fn(load_file(str(src / "model.safetensors"))), str(dst / "model.safetensors"))
    return dst


def test_bert_checkpoint_missing_tensor(small_ckpt, tmp_path):
    name = "encoder.layer.0.attention.self.value.bias"
    d = _rewrite(small_ckpt, tmp_path / "m", lambda t: {k: v for k, v in t.items() if k != name})
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        tc.BertModel.from_pretrained(str(d))


def test_bert_checkpoint_misshaped_tensor(small_ckpt, tmp_path):
    name = "encoder.layer.1.attention.output.dense.weight"
    d = _rewrite(small_ckpt, tmp_path / "m", lambda t: {**t, name: np.zeros((32, 31), np.float32)})
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        tc.BertModel.from_pretrained(str(d))


def test_bert_no_config(small_ckpt, tmp_path):
    shutil.copy(small_ckpt / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises((ValueError, FileNotFoundError), match="config.json"):
        tc.BertModel.from_pretrained(str(tmp_path))


def test_bert_empty_dir_and_unknown_name(tmp_path):
    with pytest.raises((ValueError, FileNotFoundError), match="config.json"):
        tc.BertModel.from_pretrained(str(tmp_path))
    with pytest.raises((ValueError, FileNotFoundError)):
        tc.BertModel.from_pretrained(str(tmp_path / "does-not-exist"))
    with pytest.raises((ValueError, FileNotFoundError)):
        tc.BertModel.from_pretrained("no-such-model-name-xyz")


def test_bert_no_weights_file(small_ckpt, tmp_path):
    shutil.copy(small_ckpt / "config.json", tmp_path / "config.json")
    with pytest.raises((ValueError, FileNotFoundError), match="safetensors"):
        tc.BertModel.from_pretrained(str(tmp_path))


def test_sentence_encoder_default_name_is_loadable():
    """Sanity: the name used throughout the bad-input tests resolves."""
    enc = tc.SentenceEncoder.from_pretrained(MODEL_NAME)
    e = enc.encode(["ok"])
    assert e.shape == (1, 384) and np.isfinite(e).all()


def test_as_bool_float_masks():
    """Float 0/1 is refused for key/query masks (torch's additive key_padding_mask looks the same) and
    kept for Hugging Face's ``attention_mask`` (1.0/0.0 = keep/pad there too, e.g. ``mask.float()``)."""
    from transformer_core._validation import as_bool

    with pytest.raises(TypeError, match="key_mask: expected bool or integer 0/1.*float32"):
        as_bool(np.zeros(3, np.float32), "key_mask")
    np.testing.assert_array_equal(as_bool(np.array([1.0, 0.0]), "attention_mask", allow_float=True), [True, False])
    with pytest.raises(TypeError, match="attention_mask: expected bool"):
        as_bool(np.array([1.0, 0.0]), "attention_mask")  # float only where the caller allows it
    np.testing.assert_array_equal(as_bool([1, 0], "key_mask"), [True, False])
    with pytest.raises(ValueError, match="attention_mask"):
        as_bool(np.array([0.5]), "attention_mask", allow_float=True)


# ------------------------------------------------- nn layers: a wrong shape is refused before any copy
_WIDE = 2**17  # rows of 9 float64 values: 9 MiB, whose float32 copy would be 4.5 MiB


def _refusal_peak(fn):
    """``fn()``'s error (a ValueError or TypeError) and the peak bytes traced while it ran."""
    return traced_refusal(fn, ERR)


def _wrong_shape_cases():
    q = np.zeros((1, 3, 8), np.float32)
    wide = np.zeros((1, _WIDE, 9))  # float64, last dim 9 where the layers take 8
    big_mask = np.zeros((1024, 1024))  # float64, (L, S) = (3, 3) expected
    mask_3d, mask_4d = np.zeros((3, 512, 512)), np.zeros((1, 4, 512, 512))  # not (N·H, L, S), not (N, H, L, S)
    q_long = np.zeros((1, 1024, 8), np.float32)  # big_mask is its (L, S)
    return {
        "mha_attn_mask": (lambda: tc.nn.MultiheadAttention(8, 2), lambda m: m(q, attn_mask=big_mask), "attn_mask"),
        "mha_attn_mask_3d": (lambda: tc.nn.MultiheadAttention(8, 2),
                             lambda m: m(q, attn_mask=mask_3d), "attn_mask"),
        "mha_attn_mask_4d": (lambda: tc.nn.MultiheadAttention(8, 2),
                             lambda m: m(q, attn_mask=mask_4d), "attn_mask"),
        "mha_key_mask_then_attn_mask": (  # the key mask's shape, before the right-shaped attn_mask is converted
            lambda: tc.nn.MultiheadAttention(8, 2),
            lambda m: m(q_long, attn_mask=big_mask, key_mask=np.ones((1, 5), bool)), "key_mask"),
        "mha_query": (lambda: tc.nn.MultiheadAttention(8, 2), lambda m: m(wide), "query"),
        "mha_key": (lambda: tc.nn.MultiheadAttention(8, 2), lambda m: m(q, wide, wide), "key"),
        "mha_value_length": (lambda: tc.nn.MultiheadAttention(8, 2, vdim=9),
                             lambda m: m(q, q, wide), "value"),
        "linear": (lambda: tc.nn.Linear(8, 4), lambda m: m(wide), r"\bx\b"),
        "feed_forward": (lambda: tc.nn.FeedForward(8, 16), lambda m: m(wide), r"\bx\b"),
        "gated_feed_forward": (lambda: tc.nn.GatedFeedForward(8, 16), lambda m: m(wide), r"\bx\b"),
        "layer_norm": (lambda: tc.nn.LayerNorm(8), lambda m: m(wide), r"\bx\b"),
        "rms_norm": (lambda: tc.nn.RMSNorm(8), lambda m: m(wide), r"\bx\b"),
        "encoder_layer_src": (lambda: tc.nn.TransformerEncoderLayer(8, 2, 16), lambda m: m(wide), r"\bsrc\b"),
        "encoder_layer_src_mask": (lambda: tc.nn.TransformerEncoderLayer(8, 2, 16),
                                   lambda m: m(q, src_mask=big_mask), "src_mask"),
        "decoder_layer_memory": (lambda: tc.nn.TransformerDecoderLayer(8, 2, 16), lambda m: m(q, wide), "memory"),
        "decoder_layer_tgt": (lambda: tc.nn.TransformerDecoderLayer(8, 2, 16), lambda m: m(wide, q), r"\btgt\b"),
        "decoder_layer_memory_mask": (lambda: tc.nn.TransformerDecoderLayer(8, 2, 16),
                                      lambda m: m(q, q, memory_mask=big_mask), "memory_mask"),
        "transformer_tgt": (lambda: tc.nn.Transformer(8, 2, 1, 1, 16), lambda m: m(q, wide), r"\btgt\b"),
        "transformer_src_mask": (lambda: tc.nn.Transformer(8, 2, 1, 1, 16),
                                 lambda m: m(q, q, src_mask=big_mask), "src_mask"),
    }


@pytest.mark.parametrize("case", list(_wrong_shape_cases()))
def test_nn_wrong_shapes_are_refused_before_any_copy(case):
    """A wrong-shaped float64 input or mask of a float32 layer was converted (a copy of its size)
    before its shape was checked: MultiheadAttention(8, 2)(q, attn_mask=np.zeros((1024, 1024)))
    peaked at 4 MiB (34 MiB for a 3000 x 3000 mask) before its ValueError. Now the shape is checked
    on the array as given."""
    build, call, match = _wrong_shape_cases()[case]
    module = build()
    err, peak = _refusal_peak(lambda: call(module))
    assert err.type is ValueError and err.match(match)
    assert peak < 2**16, f"{case}: the refusal allocated {peak} bytes"


# ------------------------------------------------------- legacy caches, schedules, generation, RoPE
def test_kv_cache_from_legacy_checks_every_pair_before_copying():
    """from_legacy copied each layer (to the cache's dtype) before checking its shape against layer
    0's: a float64 broadcast view of 2**25 positions in layer 1 allocated 2 GiB (a MemoryError at
    2**28) before its ValueError. Every pair's shape and dtype are now checked on the arrays as
    given, before any layer is copied."""
    small = np.ones((1, 2, 3, 4), np.float32)
    big = np.broadcast_to(np.float64(1), (1, 2, 2**21, 4))  # its float32 copy: 64 MiB
    err, peak = _refusal_peak(lambda: tc.KVCache.from_legacy([(small, small), (big, big)], 2, 4))
    assert err.type is ValueError
    assert err.match(r"^past_key_values\[1\]: shape \(1, 2, 2097152, 4\) differs from layer 0's \(1, 2, 3, 4\)$")
    assert peak < 2**16, f"the refusal allocated {peak} bytes"
    # a bad dtype in a later layer: refused before layer 0 (a 64 MiB copy) is made
    complex_pair = (np.broadcast_to(np.complex64(1), big.shape), small)
    err, peak = _refusal_peak(lambda: tc.KVCache.from_legacy([(big, big), complex_pair], 2, 4))
    assert err.type is TypeError and err.match(r"^past_key_values\[1\]\[0\]: expected a real numeric array, got dtype "
                                               r"complex64$")
    assert peak < 2**16, f"the refusal allocated {peak} bytes"
    err, peak = _refusal_peak(lambda: tc.KVCache.from_legacy([(big, big), (small[0], small[0])], 2, 4))
    assert err.type is ValueError and err.match(r"^past_key_values\[1\]\[0\]: expected a 4-D array, got 3-D with "
                                                r"shape \(2, 3, 4\)$")
    assert peak < 2**16, f"the refusal allocated {peak} bytes"
    # torch's bool and complex tensors too (they were converted, after layer 0's copy)
    for bad, name in ((torch.zeros(1, 2, 3, 4, dtype=torch.bool), "bool"),
                      (torch.zeros(1, 2, 3, 4, dtype=torch.complex64), "complex64")):
        err, peak = _refusal_peak(lambda: tc.KVCache.from_legacy([(big, big), (bad, small)], 2, 4))
        assert err.type is TypeError and err.match(rf"^past_key_values\[1\]\[0\]: expected a real numeric array, got "
                                                   rf"dtype {name}")
        assert peak < 2**16, f"the refusal of a torch {name} tensor allocated {peak} bytes"
    # good pairs still load: the values as given, an empty S = 0 cache too
    k, v = np.arange(24.0).reshape(1, 2, 3, 4), -np.arange(24.0).reshape(1, 2, 3, 4)
    (k2, v2), (k3, v3) = tc.KVCache.from_legacy([(k, v), (v, k)], 2, 4, np.float64).to_legacy()
    np.testing.assert_array_equal(np.stack([k2, v2, k3, v3]), np.stack([k, v, v, k]))
    empty = np.zeros((1, 2, 0, 4), np.float32)
    assert tc.KVCache.from_legacy([(empty, empty)], 2, 4).length == 0


def test_lambda_lr_factor_too_large_for_a_float_is_a_value_error():
    """LambdaLR(opt, lambda e: 10**400) raised a bare OverflowError (base_lr * factor: Python cannot
    make a float of the int). It is a ValueError naming lr_lambda, the epoch and the group, as a
    NaN or negative factor's, and nothing changes (at construction and at a step)."""
    from fractions import Fraction

    from transformer_core import lr_scheduler, optim
    from transformer_core.parameter import Parameter

    opt = optim.SGD([Parameter(np.ones(2))], lr=0.1)
    head = r"^lr_lambda \(epoch 0\): param_groups\[0\]: lr = initial_lr \(0\.1\) \* lr_lambda\(0\): expected a finite "
    with pytest.raises(ValueError, match=head + r"number >= 0\.0, got a factor int of 1329 bits, too large for a float "
                                                r"\(the optimizers take a finite learning rate >= 0\); nothing was "
                                                r"changed$"):
        lr_scheduler.LambdaLR(opt, lambda e: 10**400)
    with pytest.raises(ValueError, match=head + r"number >= 0\.0, got a factor Fraction, too large for a float"):
        lr_scheduler.LambdaLR(opt, lambda e: Fraction(10**400))
    with pytest.raises(ValueError, match=head + r"number >= 0\.0, got a factor int of 16610 bits"):  # 5000 digits:
        lr_scheduler.LambdaLR(opt, lambda e: 10**5000)  # more than Python writes out (its 4300-digit limit)
    assert opt.param_groups[0]["lr"] == 0.1 and "initial_lr" not in opt.param_groups[0]
    s = lr_scheduler.LambdaLR(opt, lambda e: 0.5 if e < 2 else 10**400)
    s.step()
    with pytest.raises(ValueError, match=r"^lr_lambda \(epoch 2\): param_groups\[0\]: .* int of 1329 bits"):
        s.step()
    assert (s.last_epoch, s.get_last_lr(), opt.param_groups[0]["lr"]) == (1, [0.05], 0.05)


def _llama_of_long_context():
    """A 1-layer Llama whose KV cache takes 64 bytes a position (2 key/value heads of width 4,
    float32, keys and values), of a context longer than any machine's memory can cache."""
    from transformer_core.llama import LlamaConfig

    return tc.LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                           num_attention_heads=2, max_position_embeddings=2**50, eos_token_id=None,
                                           bos_token_id=None))


def test_generate_names_max_new_tokens_when_one_sequence_cannot_cache_them():
    """generate(ids, 2**38) of one sequence said "input_ids: a batch of 1 sequences ... needs a KV
    cache too large ...; pass fewer sequences at a time": the length was the cause. It names
    max_new_tokens and how many fit; a batch whose one sequence fits still names input_ids."""
    from transformer_core._validation import physical_memory_bytes

    m = _llama_of_long_context()
    limit = physical_memory_bytes()
    fit = limit // 64 - 3 + 1  # new tokens of a 3-token prompt that fit one sequence's cache
    M = limit // 64 + 10
    says = (rf"^max_new_tokens: prompt length 3 \+ max_new_tokens {M} \({M + 2} positions\) needs a KV cache of "
            rf"{64 * (M + 2)} bytes for one sequence, 64 bytes a position \(keys and values of 1 layer\), more than "
            rf"this machine's memory \({limit} bytes\); at most {fit} new tokens fit")
    ids = np.array([[1, 2, 3]])
    with pytest.raises(ValueError, match=says + "$"):
        m.generate(ids, M)
    with pytest.raises(ValueError, match=says + "$"):
        next(m.stream(ids, M))
    cache = m.new_cache(1)
    with pytest.raises(ValueError, match=says + "$"):
        m.generate(ids, M, past_key_values=cache)
    assert (cache.capacity, cache.length) == (1, 0)
    # four sequences that one alone would not fit: max_new_tokens still, with what fits the batch
    with pytest.raises(ValueError, match=says + rf" \(one sequence; {limit // 256 - 2} for a batch of 4\)$"):
        m.generate(np.broadcast_to(ids, (4, 3)), M)
    # a batch whose one sequence fits: the batch is the cause
    M = 2**16
    N = limit // (64 * (M + 2)) + 1
    with pytest.raises(ValueError, match=rf"^input_ids: a batch of {N} sequences of prompt length 3 and "
                                         rf"max_new_tokens = {M} .* needs a KV cache too large .*; pass fewer "
                                         r"sequences at a time$"):
        m.generate(np.broadcast_to(ids, (N, 3)), M)
    # a prompt whose cache alone does not fit one sequence's (no model that small has such a
    # context: the error itself)
    L = limit // 64 + 1
    err = m._cache_too_large(ValueError("KVCache's"), cache, 1, L, 1, "a batch of 1", given=False)
    assert str(err) == (f"input_ids: a prompt of length {L} needs a KV cache of {64 * L} bytes for one sequence, 64 "
                        f"bytes a position (keys and values of 1 layer), more than this machine's memory ({limit} "
                        "bytes); use a shorter prompt")
    # positions that fit, in a caller's cache whose growth (to twice its capacity) does not: the
    # cache is named, not the length (a cache of over half the memory cannot be made here: the error)
    err = m._cache_too_large(ValueError("KVCache's"), cache, 1, 3, 5, "a batch of 1", given=True)
    assert str(err).startswith("past_key_values: a batch of 1 needs 448 bytes of KV cache, which fit this machine's "
                               "memory") and str(err).endswith("pass past_key_values=None for a cache of the size needed")
    # a model of no layers: its cache still holds one layer (C++), so the sizes are those of one
    from transformer_core.llama import LlamaConfig

    m0 = tc.LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=0,
                                         num_attention_heads=2, max_position_embeddings=2**50, eos_token_id=None,
                                         bos_token_id=None))
    M = limit // 64 + 10
    with pytest.raises(ValueError, match=rf"^max_new_tokens: .* 64 bytes a position \(keys and values of 1 layer\), "
                                         rf".* at most {fit} new tokens fit$"):  # was a ZeroDivisionError
        m0.generate(ids, M)
    # a call that fits runs: the greedy tokens of the small model, the same with a cache given
    out = m.generate(ids, 4)
    np.testing.assert_array_equal(m.generate(ids, 4, past_key_values=m.new_cache(1)), out)
    assert out.shape == (1, 7) and (out[:, :3] == ids).all()


def test_rotary_embedding_too_wide_names_head_dim():
    """RotaryEmbedding(2**40, 16) raised the C++ "rotary tables (cos and sin of 16 positions;
    max_position_embeddings 16): 35184372088832 values ...", naming no argument. The tables built
    with the layer (at most FIRST_POSITIONS positions) are checked first, naming head_dim, the
    largest that fits, and the one given."""
    from transformer_core import positional
    from transformer_core._validation import physical_memory_bytes

    limit = physical_memory_bytes()
    # 16 positions, "half": cos and sin of 16 × head_dim float32 values, 128 bytes per unit of head_dim
    largest = limit // 128 // 2 * 2
    head_dim = largest + 2
    with pytest.raises(ValueError, match=rf"^head_dim: expected an even number <= {largest}, whose rotary tables "
                                         r"\(cos and sin of the first 16 positions, half layout, float32\) fit this "
                                         rf"machine's memory \({limit} bytes\), got {head_dim} \({128 * head_dim} "
                                         r"bytes\)$"):
        positional.RotaryEmbedding(head_dim, 16)
    # a long context builds FIRST_POSITIONS positions; "interleaved" keeps head_dim / 2 values a row
    largest = limit // (4096 * 8) // 2 * 2
    with pytest.raises(ValueError, match=rf"^head_dim: expected an even number <= {largest}, .*first 4096 positions, "
                                         rf"interleaved layout, float64\) .* got {2**50}"):
        positional.RotaryEmbedding(2**50, 2**40, layout="interleaved", dtype=np.float64)
    # the constant is the C++ layer's: what a long context builds when the layer is made
    assert positional.FIRST_POSITIONS == 4096 == positional.RotaryEmbedding(8, 2**40)._impl.built_positions
    assert positional.RotaryEmbedding(8, 16)._impl.built_positions == 16


def test_a_numpy_scalar_is_described_by_its_value():
    """A 0-d numpy value was described as an array: nn.Linear(np.float64(4.0), 3) said "expected an
    int, got float64 () float64", without the value. A numpy scalar shows its type and value, a
    0-d array or tensor its shape and dtype and value."""
    from transformer_core._validation import described

    with pytest.raises(TypeError, match=r"^in_features: expected an int, got float64 4\.0$"):
        tc.nn.Linear(np.float64(4.0), 3)
    with pytest.raises(TypeError, match=r"^in_features: expected an int, got ndarray \(\) float64 4\.0$"):
        tc.nn.Linear(np.array(4.0), 3)
    assert [described(v) for v in (np.float32(0.5), np.int8(-3), np.bool_(True), np.str_("x"))] == [
        "float32 0.5", "int8 -3", f"{type(np.bool_(True)).__name__} True", "str_ 'x'"]
    torch = pytest.importorskip("torch")
    assert described(torch.tensor(4.0)) == "Tensor () torch.float32 tensor(4.)"
    assert described(np.ones((2, 3), np.float32)) == "ndarray (2, 3) float32"  # arrays: shape and dtype only


def _huge_output_cases():
    """Calls whose input is a broadcast view (a few bytes, a float32 or int64 copy of 128 MiB) and
    whose float32 output exceeds this machine's memory, and the ValueError each must raise."""
    Q = tc.quantization
    mem = tc._validation.physical_memory_bytes()
    rows, k = 2**20, 32
    x = np.broadcast_to(np.ones((1, k), np.float32), (rows, k))
    out = mem // (rows * 4) + 1                                # (rows, out) float32: more than mem
    blocks = np.zeros(out * 34, np.uint8)                      # out rows of one Q8_0 block
    ids = np.broadcast_to(np.array([1], np.int32), (2**24,))
    dim = (mem // (ids.size * 4) // 32 + 1) * 32               # (ids, dim) float32: more than mem
    table = np.zeros(7 * dim // 32 * 34, np.uint8)
    beyond = r"more than this machine's memory"
    exceed = r"values of 4 bytes exceed this machine's memory"

    def linear(fmt):
        lin = tc.nn.Linear(k, out, bias=False).eval()
        if fmt == "int8":
            Q.quantize(lin, inplace=True)
        elif fmt == "Q8_0":
            Q.set_gguf_weights(lin, {"weight": ("Q8_0", blocks)})
        return lin

    def embedding(fmt):
        emb = tc.nn.Embedding(7, dim).eval()
        if fmt == "Q8_0":
            Q.set_gguf_weights(emb, {"weight": ("Q8_0", table)})
        return emb

    return {
        "linear_int8": (lambda: (np.zeros((out, k), np.int8), np.ones(out, np.float32)),
                        lambda w: Q.linear_int8(x, *w),
                        rf"^x, qweight: the output \({rows} rows x {out} out_features, float32\).*{beyond}"),
        "linear_gguf": (lambda: None, lambda _: Q.linear_gguf(x, blocks, "Q8_0", out, k),
                        rf"^x, out_features: the output \({rows} rows x {out} out_features.*{beyond}"),
        "linear_gguf_parts": (lambda: None, lambda _: Q.linear_gguf_parts(x, [(blocks, "Q8_0", out)], k),
                              rf"^x, parts: the output \({rows} rows x {out} out_features.*{beyond}"),
        "nn.Linear": (lambda: linear("float32"), lambda m: m(x),
                      rf"^x: the output \(rows, out_features\): {rows * out} {exceed}"),
        "nn.Linear int8": (lambda: linear("int8"), lambda m: m(x),
                           rf"^x: the output \(rows, out_features\): {rows * out} {exceed}"),
        "nn.Linear Q8_0": (lambda: linear("Q8_0"), lambda m: m(x),
                           rf"^x: the output \(rows, out_features\): {rows * out} {exceed}"),
        "nn.Embedding": (lambda: embedding("float32"), lambda m: m(ids),
                         rf"^input_ids: the output \(ids, embedding_dim\): {ids.size * dim} {exceed}"),
        "nn.Embedding Q8_0": (lambda: embedding("Q8_0"), lambda m: m(ids),
                              rf"^input_ids: the output \(ids, embedding_dim\): {ids.size * dim} {exceed}"),
    }


@pytest.mark.parametrize("case", ["linear_int8", "linear_gguf", "linear_gguf_parts", "nn.Linear", "nn.Linear int8",
                                  "nn.Linear Q8_0", "nn.Embedding", "nn.Embedding Q8_0"])
def test_outputs_beyond_memory_are_refused_before_the_input_is_copied(case):
    """An output larger than this machine's memory is refused on the shapes as given: the quantized
    products and the Linear/Embedding layers (float32, int8, GGUF blocks) first copied a broadcast
    view of x (float32) or of the ids (to int64): 1 GiB, seconds, before the ValueError."""
    build, call, match = _huge_output_cases()[case]
    module = build()
    err, peak = _refusal_peak(lambda: call(module))
    assert err.type is ValueError and err.match(match)
    assert peak < 2**16, f"{case}: the refusal allocated {peak} bytes"


# ---------------------------------------------- refused before the copy: nn, positional, backward
# Each call below used to convert (copy) an input before a check that needs only shapes or the few
# values a broadcast view holds: the views here copy to 32-128 MiB, so the old code's peak is far
# above the bound, and the new code's refusal allocates nothing of their size.
_NO_COPY = 2**20  # bytes a refusal may allocate


def _trained(build, *inputs):
    """``build()`` in training mode after one forward of ``inputs``: ready for its backward."""
    module = build()
    module.train()
    module(*inputs)
    return module


def _backward_cases():
    x = np.arange(10, dtype=np.float32).reshape(2, 5) / 10
    x8 = np.arange(48, dtype=np.float32).reshape(2, 3, 8) / 48
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    return {  # build, forward inputs, the forward output's shape
        "Linear": (lambda: tc.nn.Linear(5, 3), (x,), (2, 3)),
        "Embedding": (lambda: tc.nn.Embedding(10, 4), (ids,), (2, 3, 4)),
        "MultiheadAttention": (lambda: tc.nn.MultiheadAttention(8, 2), (x8,), (2, 3, 8)),
        "LayerNorm": (lambda: tc.nn.LayerNorm(8), (x8,), (2, 3, 8)),
        "Embeddings": (lambda: tc.positional.Embeddings(10, 8, 6), (ids,), (2, 3, 8)),
    }


@pytest.mark.parametrize("case", ["Linear", "Embedding", "MultiheadAttention", "LayerNorm", "Embeddings"])
def test_layer_backward_checks_grad_output_shape_before_its_copy(case):
    """The layers' backward converted grad_output (a float32 copy) before comparing its shape with
    the forward output's: a broadcast view of (16384, 16384) cost 1 GiB and 2 s before the
    ValueError. The shape is now checked on the array as given; the refused call keeps the state."""
    import re

    build, inputs, shape = _backward_cases()[case]
    module = _trained(build, *inputs)
    big = np.broadcast_to(np.float32(1), (2048, 4096))  # its copy: 32 MiB
    err, peak = _refusal_peak(lambda: module.backward(big))
    assert err.type is ValueError
    assert err.match(rf"^grad_output: expected shape {re.escape(str(shape))} \(the forward's output\), "
                     r"got \(2048, 4096\)$")
    assert peak < _NO_COPY, f"{case}: the refusal allocated {peak} bytes"
    module.backward(np.ones(shape, np.float32))  # the state was kept: the right gradient is taken


def test_linear_backward_after_a_refused_grad_output_gives_torch_gradients():
    """The refused call above changes nothing: the next backward's gradients are torch's."""
    x = np.arange(10, dtype=np.float32).reshape(2, 5) / 10
    g = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    lin = _trained(lambda: tc.nn.Linear(5, 3), x)
    with pytest.raises(ValueError, match="^grad_output: expected shape"):
        lin.backward(np.broadcast_to(np.float32(1), (2048, 4096)))
    params = dict(lin.named_parameters())
    ref = torch.nn.Linear(5, 3)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(np.array(params["weight"])))
        ref.bias.copy_(torch.from_numpy(np.array(params["bias"])))
    xt = torch.from_numpy(x).requires_grad_()
    ref(xt).backward(torch.from_numpy(g))
    np.testing.assert_allclose(lin.backward(g), xt.grad.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(params["weight"].grad, ref.weight.grad.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(params["bias"].grad, ref.bias.grad.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("ids,match", [
    (np.broadcast_to(np.int32(20), (4096, 4096)), r"^input_ids: id 20 at flat index 0 is outside \[0, 10\)$"),
    (np.broadcast_to(np.array([[1], [11]], np.int32), (2, 2**22)),  # the first bad id: row 1's first
     r"^input_ids: id 11 at flat index 4194304 is outside \[0, 10\)$"),
    (np.broadcast_to(np.array([3, -4, 5], np.int16), (2**21, 3)), r"^input_ids: id -4 at flat index 1 is outside"),
], ids=["all_bad", "bad_column", "negative"])
def test_embedding_refuses_out_of_range_ids_before_their_int64_copy(ids, match):
    """Embedding's forward copied the ids to int64 (2 GiB for a broadcast view of 16384² int32 ids,
    6 s) before the C++ layer found an id out of range. Integer ids are now range-checked on the
    values they hold (min and max, no copy), in the C++ check's words and flat index."""
    emb = tc.nn.Embedding(10, 4)
    err, peak = _refusal_peak(lambda: emb(ids))
    assert err.type is ValueError and err.match(match)
    assert peak < _NO_COPY, f"the refusal allocated {peak} bytes"


def test_embedding_range_check_matches_the_core_on_small_ids():
    """The same error (message, flat index) as the C++ layer's, which took these before: ids of
    any integer dtype, rank, sign; ids past int64 keep as_ids's error; good ids give the rows."""
    emb = tc.nn.Embedding(10, 4)
    for ids, match in [(np.array([[1, -3, 2]]), r"id -3 at flat index 1 is"),
                       (np.array([[1, 2], [30, 40]], np.uint8), r"id 30 at flat index 2 is"),
                       (np.array(12), r"id 12 at flat index 0 is"),
                       (np.array([2**64 - 1], np.uint64), r"expected token ids within int64, got 18446744073709551615")]:
        with pytest.raises(ValueError, match=rf"^input_ids: {match}"):
            emb(ids)
    ids = np.broadcast_to(np.array([[9], [0]], np.int8), (2, 3))
    weight = np.array(dict(emb.named_parameters())["weight"])
    np.testing.assert_array_equal(emb(ids), weight[np.array([[9, 9, 9], [0, 0, 0]])])


def _rotary_cases():
    F = tc.functional
    B = tc.backward

    def bigf(*shape):
        return np.broadcast_to(np.float32(1), shape)

    narrow = np.ones((1024, 8), np.float32)
    wide = bigf(1024, 4096)
    x = bigf(1, 4, 1024, 4096)  # its copy: 64 MiB
    return {
        "rotate_half": (lambda: F.rotate_half(bigf(4096, 4095)), r"^x: expected an even last dim, got shape \(4096, 4095\)$"),
        "apply_rotary": (lambda: F.apply_rotary(x, narrow, narrow),
                         r"^cos: expected last dim 4096 \(head_dim\) or 2048 \(head_dim/2\), got shape \(1024, 8\)$"),
        "apply_rotary_sin": (lambda: F.apply_rotary(x, wide, narrow),
                             r"^sin: expected the shape of cos \(1024, 4096\), got \(1024, 8\)$"),
        "apply_rotary_pos_emb_k_table": (lambda: F.apply_rotary_pos_emb(x, bigf(1, 4, 1024, 4094), wide, wide),
                                         r"^k: expected head_dim 4096 \(q's last dim\), got shape \(1, 4, 1024, 4094\) "
                                         r"\(q: \(1, 4, 1024, 4096\)\)$"),
        "apply_rotary_pos_emb_k_odd": (lambda: F.apply_rotary_pos_emb(x, bigf(1, 4, 1024, 4095), wide, wide),
                                       r"^k: expected an even head_dim \(last dim\), got shape \(1, 4, 1024, 4095\)$"),
        "rotary_backward": (lambda: B.rotary_backward(x, narrow, narrow),
                            r"^cos: expected last dim 4096 \(head_dim\) or 2048 \(head_dim/2\), got shape \(1024, 8\)$"),
        "rotary_backward_rank": (lambda: B.rotary_backward(x, bigf(2, 1024, 4096), bigf(2, 1024, 4096)),
                                 r"^cos: shape \(2, 1024, 4096\) \(with the head axis at unsqueeze_dim=1: "
                                 r"\(2, 1, 1024, 4096\)\) does not broadcast to grad_output's"),
    }


@pytest.mark.parametrize("case", ["rotate_half", "apply_rotary", "apply_rotary_sin", "apply_rotary_pos_emb_k_table",
                                  "apply_rotary_pos_emb_k_odd", "rotary_backward", "rotary_backward_rank"])
def test_rotary_checks_shapes_before_copying_or_rotating(case):
    """rotate_half, apply_rotary and rotary_backward copied x (1 GiB for a broadcast view) before
    checking its even D or the tables' shapes against it; apply_rotary_pos_emb rotated all of q
    before refusing k. D, the tables and both q and k are now checked on the arrays as given."""
    call, match = _rotary_cases()[case]
    err, peak = _refusal_peak(call)
    assert err.type is ValueError and err.match(match)
    assert peak < _NO_COPY, f"{case}: the refusal allocated {peak} bytes"


def test_rotary_after_the_reordered_checks_matches_torch(rng):
    """The checks moved, the rotation did not: q and k (GQA, HF's (N, L, D) tables) as torch's."""
    q, k = randn(rng, (2, 4, 5, 8)), randn(rng, (2, 2, 5, 8))
    cos, sin = randn(rng, (2, 5, 8)), randn(rng, (2, 5, 8))
    qt, kt, ct, st = (torch.from_numpy(a) for a in (q, k, cos, sin))

    def rot(t):
        return torch.cat([-t[..., 4:], t[..., :4]], dim=-1)

    q_rot, k_rot = tc.functional.apply_rotary_pos_emb(q, k, cos, sin)
    np.testing.assert_allclose(q_rot, (qt * ct[:, None] + rot(qt) * st[:, None]).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(k_rot, (kt * ct[:, None] + rot(kt) * st[:, None]).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(tc.functional.rotate_half(q), rot(qt).numpy())


@pytest.mark.parametrize("kwargs,error,match", [
    ({"num_embeddings": 10**12}, ValueError,
     r"^num_embeddings: an array of shape \(1000000000000, 8\) needs 32000000000000 bytes"),
    ({"num_embeddings": 10, "grad_weight": np.zeros((10, 4), np.float32)}, ValueError,
     r"^grad_weight: expected shape \(10, 8\), got \(10, 4\)$"),
    ({"num_embeddings": 10, "grad_weight": np.zeros((10, 8))}, TypeError, r"^grad_weight: expected dtype float32"),
], ids=["huge_table", "grad_weight_shape", "grad_weight_dtype"])
def test_embedding_backward_checks_the_gradient_table_before_the_ids_copy(kwargs, error, match):
    """embedding_backward copied the ids to int64 (2 GiB for a broadcast view of 16384² int32 ids,
    7 s) before checking num_embeddings' table against memory and grad_weight: checks of shapes
    only, which small ids got in no time. They now come before the ids' conversion."""
    ids = np.broadcast_to(np.int32(1), (4096, 4096))  # its int64 copy: 128 MiB
    grad = np.broadcast_to(np.float32(1), (4096, 4096, 8))
    err, peak = _refusal_peak(lambda: tc.backward.embedding_backward(ids, grad, **kwargs))
    assert err.type is error and err.match(match)
    assert peak < _NO_COPY, f"the refusal allocated {peak} bytes"


def _small_machine(monkeypatch, limit: int) -> None:
    """This machine's memory seen as ``limit`` bytes by every check (nn's and _validation's)."""
    import sys

    import transformer_core._validation as validation

    nn_module = sys.modules["transformer_core.nn"]
    monkeypatch.setattr(validation, "physical_memory_bytes", lambda: limit)
    monkeypatch.setattr(nn_module, "physical_memory_bytes", lambda: limit)


def test_stack_counts_each_copys_overhead_not_only_its_weights(monkeypatch):
    """TransformerEncoder(layer, num_layers) checked only the copies' weights against memory, but a
    copy of a tiny layer costs ~16.5 KB of Python and C++ objects beyond its 2.4 KB of weights:
    2 * 10**6 copies passed the check and needed ~37 GB. The overhead now counts (a machine of
    64 MiB here: the count that passed the old check is refused before any copy is built)."""
    import math

    limit = 64 << 20
    _small_machine(monkeypatch, limit)
    layer = tc.nn.TransformerEncoderLayer(8, 2, 16)
    weights = 4 * sum(math.prod(s) for s in layer.parameter_shapes().values())
    each = weights + 16 * 1024  # the overhead counted: a lower bound of the 16.2-16.7 KB measured
    count = limit // each + 1
    assert count * weights < limit  # the weights alone fit: the old check let it pass
    err, peak = _refusal_peak(lambda: tc.nn.TransformerEncoder(layer, count))
    assert err.type is ValueError
    assert err.match(rf"^num_layers: {count} copies of the layer need about {count * each} bytes \({weights} bytes "
                     rf"of weights and about 16384 bytes of Python and C\+\+ objects each\), more than this "
                     rf"machine's memory \({limit} bytes\)$")
    assert peak < _NO_COPY
    assert len(tc.nn.TransformerEncoder(layer, 3).layers) == 3  # a count that fits is built


def test_transformer_counts_both_stacks_overhead_together(monkeypatch):
    """nn.Transformer's check of both stacks together counts each copy's overhead too: counts whose
    weights fit, each stack alone too, are refused naming both, before either stack is built."""
    import math

    limit = 64 << 20
    _small_machine(monkeypatch, limit)
    enc, dec = tc.nn.TransformerEncoderLayer(8, 2, 16), tc.nn.TransformerDecoderLayer(8, 2, 16)
    overheads = (16 * 1024, 24 * 1024)  # counted per copy: lower bounds of what was measured
    per = [4 * sum(math.prod(s) for s in m.parameter_shapes().values()) + o for m, o in zip((enc, dec), overheads)]
    count = limit // sum(per) + 1
    assert max(per) * count < limit
    err, peak = _refusal_peak(lambda: tc.nn.Transformer(8, 2, count, count, 16))
    assert err.type is ValueError
    assert err.match(rf"^num_encoder_layers, num_decoder_layers: the layers' copies \(with the weights around them\) "
                     rf"need about {count * sum(per)} bytes")
    assert peak < _NO_COPY
