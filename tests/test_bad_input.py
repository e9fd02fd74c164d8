"""Bad input raises ValueError / TypeError naming the offending argument -- never a crash."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import transformer_core as tc
from conftest import MODEL_NAME, randn
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


def test_softmax_bad_axis(rng):
    with pytest.raises(ERR, match="axis"):
        F.softmax(randn(rng, (3, 4)), axis=2)
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
