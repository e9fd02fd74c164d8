"""transformer_core.gguf_file vs transformers' GGUF loader (LlamaForCausalLM.from_pretrained(gguf_file=...)).

The real checkpoint is SmolLM2-135M-Instruct.Q4_1.gguf (Q4_1 projections, a Q8_0 embedding, F32
norms); tiny Llamas written with the gguf package's GGUFWriter cover every supported type, an
untied output matrix, biases, and the bad files.
"""
from __future__ import annotations

import mmap
import re
import struct

import gguf
import numpy as np
import pytest
import torch
from gguf_fakes import converter_permute, random_llama_state, tiny_vocab, write_llama_gguf
from transformer_core.gguf_file import GGUFCheckpoint, read_gguf, rope_row_permutation

SUPPORTED = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0"]


# ------------------------------------------------------------------------------------ the real file
def test_state_dict_equals_transformers(smollm2_checkpoint, hf_smollm2):
    ours = smollm2_checkpoint.state_dict()
    ref = {k: v.detach().numpy() for k, v in hf_smollm2.state_dict().items()}
    # transformers ties lm_head to the embedding; the file has no output matrix, so neither do we
    assert set(ref) - set(ours) == {"lm_head.weight"} and set(ours) <= set(ref)
    assert len(ours) == 2 + 30 * 9
    for name, value in ours.items():
        assert value.dtype == np.float32 and value.shape == tuple(ref[name].shape), name
        assert value.flags.c_contiguous and value.flags.writeable, name
        np.testing.assert_array_equal(value, ref[name], err_msg=name)  # bitwise: same dequantization
    np.testing.assert_array_equal(ref["lm_head.weight"], ours["model.embed_tokens.weight"])


def test_config_equals_transformers(smollm2_checkpoint, hf_smollm2):
    ours, ref = smollm2_checkpoint.config, hf_smollm2.config
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                "bos_token_id", "eos_token_id", "pad_token_id", "hidden_act", "attention_bias", "mlp_bias",
                "model_type"):
        assert ours[key] == getattr(ref, key), key
    assert ours["rope_theta"] == ref.rope_parameters["rope_theta"] == 100000.0
    assert (ours["num_hidden_layers"], ours["hidden_size"], ours["num_attention_heads"], ours["num_key_value_heads"],
            ours["head_dim"], ours["intermediate_size"], ours["vocab_size"], ours["max_position_embeddings"]) == (
        30, 576, 9, 3, 64, 1536, 49152, 8192)
    assert ours["rms_norm_eps"] == float(np.float32(1e-5))  # stored as float32
    assert smollm2_checkpoint.architecture == "llama"


def test_metadata_and_template(smollm2_checkpoint, hf_smollm2_tokenizer):
    meta = smollm2_checkpoint.tokenizer_metadata
    assert meta["model"] == "gpt2" and meta["pre"] == "smollm"
    assert len(meta["tokens"]) == len(meta["token_type"]) == 49152 and len(meta["merges"]) == 48900
    assert smollm2_checkpoint.chat_template == hf_smollm2_tokenizer.chat_template
    assert smollm2_checkpoint.metadata["general.architecture"] == "llama"


def test_float64_is_exact_widening(smollm2_checkpoint):
    for name in ("model.layers.3.self_attn.k_proj.weight", "model.norm.weight", "model.layers.0.mlp.down_proj.weight"):
        w32 = smollm2_checkpoint.tensor(name)
        w64 = smollm2_checkpoint.tensor(name, dtype=np.float64)
        assert w64.dtype == np.float64
        np.testing.assert_array_equal(w64, w32.astype(np.float64))


def _q4_1_rows(raw: np.ndarray) -> np.ndarray:
    """ggml's dequantize_row_q4_1, written out: 20-byte blocks of (fp16 d, fp16 m, 16 bytes of codes);
    byte j holds weight j (low nibble) and weight j + 16 (high nibble); w = d * q + m."""
    blocks = raw.reshape(raw.shape[0], -1, 20)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
    qs = blocks[..., 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float32)
    return (d * q + m).reshape(raw.shape[0], -1)


def _q8_0_rows(raw: np.ndarray) -> np.ndarray:
    """ggml's dequantize_row_q8_0: 34-byte blocks of (fp16 d, 32 int8 codes); w = d * q."""
    blocks = raw.reshape(raw.shape[0], -1, 34)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
    q = blocks[..., 2:].copy().view(np.int8).astype(np.float32)
    return (d * q).reshape(raw.shape[0], -1)


def test_raw_blocks(smollm2_checkpoint, smollm2_gguf):
    ckpt = smollm2_checkpoint
    up = ckpt.tensor_info("model.layers.0.mlp.up_proj.weight")
    assert (up.ggml_type, up.ggml_type_id, up.shape, up.block_size, up.block_bytes) == ("Q4_1", 3, (1536, 576), 32, 20)
    assert up.raw.shape == (1536, 576 // 32 * 20) and up.raw.dtype == np.uint8 and up.row_bytes == 360
    assert not up.raw.flags.writeable and up.row_permutation is None
    base = up.raw
    while isinstance(base, np.ndarray) and base.base is not None:  # zero-copy: a view of the file's map
        base = base.base
    assert isinstance(base, mmap.mmap)
    on_disk = np.fromfile(smollm2_gguf, dtype=np.uint8, count=up.raw.size, offset=up.file_offset)
    np.testing.assert_array_equal(on_disk.reshape(up.raw.shape), up.raw)
    np.testing.assert_array_equal(_q4_1_rows(up.raw), ckpt.tensor(up.name))

    emb = ckpt.tensor_info("model.embed_tokens.weight")
    assert (emb.ggml_type, emb.shape, emb.raw.shape) == ("Q8_0", (49152, 576), (49152, 576 // 32 * 34))
    np.testing.assert_array_equal(_q8_0_rows(emb.raw[:100]), ckpt.tensor(emb.name)[:100])

    norm = ckpt.tensor_info("model.layers.0.input_layernorm.weight")
    assert (norm.ggml_type, norm.shape, norm.raw.shape) == ("F32", (576,), (576 * 4,))
    np.testing.assert_array_equal(norm.raw.view(np.float32), ckpt.tensor(norm.name))


@pytest.mark.parametrize("proj,heads", [("q_proj", 9), ("k_proj", 3)])
def test_query_key_rows(smollm2_checkpoint, proj, heads):
    """q/k rows come back in Hugging Face order; the raw rows stay in the file's (permuted) order."""
    info = smollm2_checkpoint.tensor_info(f"model.layers.7.self_attn.{proj}.weight")
    assert info.row_permutation.shape == (heads * 64,)
    file_order = _q4_1_rows(info.raw)
    hf = smollm2_checkpoint.tensor(info.name)
    np.testing.assert_array_equal(converter_permute(hf, heads), file_order)  # llama.cpp's own permute
    np.testing.assert_array_equal(_q4_1_rows(info.raw_hf_rows()), hf)


@pytest.mark.parametrize("heads,head_dim", [(1, 2), (3, 64), (9, 64), (4, 6)])
def test_rope_row_permutation_inverts_the_converter(heads, head_dim):
    w = np.arange(heads * head_dim * 3, dtype=np.float64).reshape(heads * head_dim, 3)
    perm = rope_row_permutation(heads, head_dim)
    np.testing.assert_array_equal(converter_permute(w, heads)[perm], w)
    assert sorted(perm.tolist()) == list(range(heads * head_dim))


def test_rope_row_permutation_rejects_odd_head_dim():
    with pytest.raises(ValueError, match="head_dim"):
        rope_row_permutation(2, 5)


def test_tensor_api_errors(smollm2_checkpoint):
    with pytest.raises(KeyError, match="blk.0.attn_q.weight"):
        smollm2_checkpoint.tensor("blk.0.attn_q.weight")  # GGUF names are not the API's
    with pytest.raises(TypeError, match="dtype"):
        smollm2_checkpoint.tensor("model.norm.weight", dtype=np.int32)
    with pytest.raises(TypeError, match="^name: expected a str, got list$"):
        smollm2_checkpoint.tensor_info(["model.norm.weight"])
    with pytest.raises(TypeError, match="^name: expected a str, got int$"):
        smollm2_checkpoint.tensor(3)
    assert "lm_head.weight" not in smollm2_checkpoint.tensor_names
    assert "Q4_1" in repr(smollm2_checkpoint)


# ------------------------------------------------------------------------------------ tiny files, every type
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf")


@pytest.mark.parametrize("ggml_type", SUPPORTED)
def test_tiny_types_equal_transformers(tiny_dir, ggml_type):
    from transformers import LlamaForCausalLM

    rng = np.random.default_rng(SUPPORTED.index(ggml_type))
    tie = ggml_type not in ("Q8_0", "F16")  # an untied output matrix for two of them
    state = random_llama_state(rng, tie=tie, heads=4, kv_heads=2 if ggml_type != "F16" else 1)
    path = tiny_dir / f"tiny-{ggml_type}.gguf"
    truth = write_llama_gguf(path, state, ggml_type=ggml_type, kv_heads=2 if ggml_type != "F16" else 1)
    ckpt = read_gguf(path)
    ours = ckpt.state_dict()
    assert set(ours) == set(truth) and ckpt.config["tie_word_embeddings"] == tie
    for name in truth:
        np.testing.assert_array_equal(ours[name], truth[name], err_msg=name)
    model = LlamaForCausalLM.from_pretrained(tiny_dir, gguf_file=path.name, dtype=torch.float32)
    ref = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    for name in ours:
        np.testing.assert_array_equal(ours[name], ref[name], err_msg=name)
    weight_type = ckpt.tensor_info("model.layers.1.mlp.down_proj.weight").ggml_type
    assert weight_type == ggml_type and ckpt.tensor_info("model.norm.weight").ggml_type == "F32"


def test_tiny_attention_bias(tiny_dir):
    state = random_llama_state(np.random.default_rng(7), attention_bias=True)
    path = tiny_dir / "bias.gguf"
    truth = write_llama_gguf(path, state)
    ckpt = read_gguf(path)
    assert ckpt.config["attention_bias"] is True and ckpt.config["mlp_bias"] is False
    ours = ckpt.state_dict()
    assert set(ours) == set(truth)
    for name in truth:  # the q/k biases are permuted with their rows
        np.testing.assert_array_equal(ours[name], truth[name], err_msg=name)
    for name in truth:  # the raw bytes in Hugging Face order: for a bias, 4 bytes a value
        info = ckpt.tensor_info(name)
        rows = info.raw_hf_rows()
        assert rows.shape == info.raw.shape and rows.dtype == np.uint8, name
        np.testing.assert_array_equal(rows.view("<f4").reshape(info.shape), truth[name], err_msg=name)
    assert ckpt.tensor_info("model.layers.0.self_attn.q_proj.bias").row_permutation.shape == (64,)


def _retyped(tmp_path, source, gguf_name: str, type_id: int, label: str):
    """A copy of the GGUF ``source`` whose tensor ``gguf_name`` is declared of ggml type ``type_id``
    (its data left as is: a type of fewer bytes than F32 reads the first part of it)."""
    data = bytearray(source.read_bytes())
    name = gguf_name.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)  # -> n_dims
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, type_id)
    path = tmp_path / f"{label}.gguf"
    path.write_bytes(bytes(data))
    return path


def _decoded_rows(info, rows: np.ndarray) -> np.ndarray:
    """Float32 values of raw F16 / BF16 bytes ``rows`` (shape ``info.shape``)."""
    if info.ggml_type == "F16":
        return rows.view("<f2").astype(np.float32).reshape(info.shape)
    return (rows.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(info.shape)


@pytest.mark.parametrize("ggml_type", ["F16", "BF16"])
def test_raw_hf_rows_of_a_two_byte_bias(tmp_path, tiny_dir, ggml_type):
    """A q/k bias stored in 2 bytes a value (patched into the table of an F32 file): raw_hf_rows()
    moves each value's 2 bytes whole, as tensor() reorders the dequantized values."""
    source = tiny_dir / "bias-src.gguf"
    write_llama_gguf(source, random_llama_state(np.random.default_rng(8), attention_bias=True))
    path = _retyped(tmp_path, source, "blk.1.attn_k.bias", gguf.GGMLQuantizationType[ggml_type].value, ggml_type)
    ckpt = read_gguf(path)
    info = ckpt.tensor_info("model.layers.1.self_attn.k_proj.bias")
    assert info.ggml_type == ggml_type and info.raw.shape == (2 * 32,) and info.row_permutation.shape == (32,)
    rows = info.raw_hf_rows()
    assert rows.shape == info.raw.shape
    np.testing.assert_array_equal(_decoded_rows(info, rows), ckpt.tensor(info.name))
    unpermuted = _decoded_rows(info, info.raw)
    assert not np.array_equal(unpermuted, ckpt.tensor(info.name), equal_nan=True)  # the order matters


def test_raw_hf_rows_of_a_block_quantized_bias_is_refused(tmp_path, tiny_dir):
    """A Q8_0 q bias: its values lie inside 32-value blocks, so its raw rows cannot be reordered;
    tensor() still gives its values in Hugging Face order."""
    source = tiny_dir / "bias-src-q.gguf"
    write_llama_gguf(source, random_llama_state(np.random.default_rng(9), attention_bias=True))
    path = _retyped(tmp_path, source, "blk.0.attn_q.bias", gguf.GGMLQuantizationType.Q8_0.value, "q8bias")
    ckpt = read_gguf(path)
    info = ckpt.tensor_info("model.layers.0.self_attn.q_proj.bias")
    assert info.ggml_type == "Q8_0" and info.raw.shape == (2 * 34,)
    with pytest.raises(ValueError, match="q_proj.bias .*1-D Q8_0 tensor .*blocks of 32.*GGUFCheckpoint.tensor"):
        info.raw_hf_rows()
    values = np.asarray(gguf.quants.dequantize(info.raw, gguf.GGMLQuantizationType.Q8_0), np.float32)
    np.testing.assert_array_equal(ckpt.tensor(info.name), values[rope_row_permutation(4, 16)])


def test_read_gguf_accepts_str_and_closes(tiny_dir):
    path = tiny_dir / "plain.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(1)))
    with read_gguf(str(path)) as ckpt:
        assert isinstance(ckpt, GGUFCheckpoint) and ckpt.config["num_hidden_layers"] == 2
        w = ckpt.tensor("model.layers.0.self_attn.q_proj.weight")
    assert w.shape == (64, 64)


def _has_internal(value) -> bool:
    """Whether ``value`` is, or holds at any depth, something other than plain Python values."""
    if isinstance(value, list):
        return any(_has_internal(v) for v in value)
    return not isinstance(value, (int, float, bool, str))


def test_nested_arrays_are_plain_lists(tmp_path):
    """An array of arrays whose inner arrays are long (ints, strings) reads as lists of lists (an
    inner array of more than 256 elements stayed an internal _LazyArray), through ``[]``, ``values()``
    and ``dict()`` alike."""
    from transformer_core.gguf_file import read_gguf_metadata

    path = tmp_path / "nested.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    ints, strings = [list(range(300)), [1, 2, 3]], [["a"] * 300, ["b"], ["c" * 5] * 257]
    deep = [[list(range(i, i + 260)), [i]] for i in range(3)]
    writer.add_array("test.nested", ints)
    writer.add_array("test.nested_str", strings)
    writer.add_array("test.deep", deep)
    writer.add_array("test.flat", list(range(1000)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    md = read_gguf_metadata(path)
    assert md["test.nested"] == ints and type(md["test.nested"][0]) is list
    assert md["test.nested_str"] == strings and type(md["test.nested_str"][0]) is list
    assert md["test.deep"] == deep and md["test.flat"] == list(range(1000))
    assert not any(_has_internal(v) for v in read_gguf_metadata(path).values())
    assert dict(read_gguf_metadata(path))["test.nested"] == ints


# ------------------------------------------------------------------------------------ bad files
def _bad(path, *patterns):
    with pytest.raises(ValueError) as info:
        read_gguf(path)
    message = str(info.value)
    assert str(path) in message, message
    for pattern in patterns:
        assert re.search(pattern, message), (pattern, message)
    return message


@pytest.fixture(scope="module")
def good_tiny(tiny_dir):
    path = tiny_dir / "good.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(3)))
    return path


def test_bad_magic(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    _bad(path, "not a GGUF file", "PK")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    _bad(empty, "not a GGUF file", "empty")


def test_missing_file_and_bad_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        read_gguf(tmp_path / "absent.gguf")
    with pytest.raises(TypeError, match="path"):
        read_gguf(3)


@pytest.mark.parametrize("mbytes", [0.0001, 1, 40])
def test_truncated_real_file(tmp_path, smollm2_gguf, mbytes):
    """The first N MB of SmolLM2: cut in the header, in the vocabulary, in the tensor data."""
    path = tmp_path / "cut.gguf"
    with open(smollm2_gguf, "rb") as f:
        path.write_bytes(f.read(int(mbytes * 2**20)))
    _bad(path, "truncated")


def test_truncated_tiny_data(tmp_path, good_tiny):
    data = good_tiny.read_bytes()
    for cut in (len(data) - 1, len(data) // 2, 30):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        _bad(path, "truncated")


def _header_offsets(data: bytes):
    """Offsets of the tensor/kv counts and of the first metadata entry's value type."""
    key_len = struct.unpack_from("<Q", data, 24)[0]
    return 8, 16, 24 + 8 + key_len


def test_corrupt_header(tmp_path, good_tiny):
    data = bytearray(good_tiny.read_bytes())
    tensors_at, kvs_at, first_type_at = _header_offsets(data)
    cases = {
        "version": (4, struct.pack("<I", 99), "unsupported GGUF version 99"),
        "big_endian": (4, struct.pack(">I", 3), "big-endian"),
        "kv_count": (kvs_at, struct.pack("<Q", 2**62), "metadata entries cannot fit"),
        "tensor_count": (tensors_at, struct.pack("<Q", 2**40), "tensors cannot fit"),
        "value_type": (first_type_at, struct.pack("<I", 77), "unknown value type 77"),
        "key_length": (24, struct.pack("<Q", 2**50), "truncated GGUF file"),
    }
    for name, (offset, patch, pattern) in cases.items():
        bad = bytearray(data)
        bad[offset:offset + len(patch)] = patch
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(bytes(bad))
        _bad(path, pattern)


def test_corrupt_tensor_table(tmp_path, good_tiny):
    """An unknown ggml type id, a misaligned offset, a zero dimension, patched into the table."""
    data = bytes(good_tiny.read_bytes())
    name = b"token_embd.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)  # -> n_dims
    n_dims = struct.unpack_from("<I", data, at)[0]
    type_at = at + 4 + 8 * n_dims
    for label, offset, patch, pattern in (
            ("type", type_at, struct.pack("<I", 250), "ggml type id 250 is unknown to the installed gguf package"),
            ("offset", type_at + 4, struct.pack("<Q", 3), "not a multiple of the alignment"),
            ("dims", at + 4, struct.pack("<Q", 0), "dimensions"),
            ("ndims", at, struct.pack("<I", 9), "9 dimensions")):
        bad = bytearray(data)
        bad[offset:offset + len(patch)] = patch
        path = tmp_path / f"table-{label}.gguf"
        path.write_bytes(bytes(bad))
        _bad(path, pattern)


def test_a_ggml_type_unknown_to_the_gguf_package(tmp_path, good_tiny):
    """A tensor of ggml type id 42 (newer than the installed gguf package): the metadata and the
    tokenizer still read; a full read says the type is unknown to the package, not a corrupt header."""
    import importlib.metadata

    import transformer_core as tc
    from transformer_core.gguf_file import read_gguf_metadata

    assert 42 not in {t.value for t in gguf.GGMLQuantizationType}
    path = _retyped(tmp_path, good_tiny, "blk.0.ffn_up.weight", 42, "newtype")
    assert dict(read_gguf_metadata(path)) == dict(read_gguf_metadata(good_tiny))
    assert tc.Tokenizer.from_gguf(path).encode("hello world") == tc.Tokenizer.from_gguf(good_tiny).encode("hello world")
    version = re.escape(importlib.metadata.version("gguf"))
    message = _bad(path, rf"tensor 'blk\.0\.ffn_up\.weight': ggml type id 42 is unknown to the installed gguf "
                         rf"package \(version {version}\)")
    assert "corrupt" not in message


def test_metadata_read_does_not_need_the_tensor_data(tmp_path, good_tiny):
    """read_gguf_metadata walks the tensor table but not the data: a file cut in its tensor data
    still gives its metadata; cut in the header or the table, it is truncated all the same."""
    from transformer_core.gguf_file import read_gguf_metadata

    data = good_tiny.read_bytes()
    cut = tmp_path / "cut-data.gguf"
    cut.write_bytes(data[:len(data) - 1])
    _bad(cut, "truncated")
    assert dict(read_gguf_metadata(cut)) == dict(read_gguf_metadata(good_tiny))
    name = b"output_norm.weight"  # a name in the tensor table, after the metadata
    in_table = data.index(struct.pack("<Q", len(name)) + name) + 8
    for end in (in_table, 30):
        path = tmp_path / f"cut{end}.gguf"
        path.write_bytes(data[:end])
        with pytest.raises(ValueError, match="truncated"):
            read_gguf_metadata(path)


def test_other_architecture(tmp_path):
    path = tmp_path / "gpt2.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0)), arch="gpt2")
    _bad(path, "architecture 'gpt2' is not supported", "llama")


@pytest.mark.parametrize("ggml_type", ["Q2_K", "IQ4_NL", "Q5_0"])
def test_unsupported_quantization(tmp_path, ggml_type):
    path = tmp_path / f"{ggml_type}.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0), hidden=256, inter=256, heads=4),
                     ggml_type=ggml_type)
    _bad(path, f"is {ggml_type}", "unsupported ggml types", "Q4_1")


def test_missing_unknown_and_misshaped_tensors(tmp_path):
    state = random_llama_state(np.random.default_rng(0))
    path = tmp_path / "missing.gguf"
    write_llama_gguf(path, state, skip=("blk.1.ffn_down.weight",))
    _bad(path, r"missing tensors \['blk.1.ffn_down.weight'\]")
    path = tmp_path / "shape.gguf"
    write_llama_gguf(path, state, tensor_override={"blk.0.attn_k.weight": np.zeros((24, 64), np.float32)})
    _bad(path, r"blk.0.attn_k.weight: expected \(32, 64\), got \(24, 64\)")
    path = tmp_path / "unknown.gguf"
    write_llama_gguf(path, state, extra={"rope_freqs.weight": np.ones(8, np.float32)})
    _bad(path, r"unknown tensors \['rope_freqs.weight'\]")
    path = tmp_path / "one_bias.gguf"
    extra = dict(state)
    extra["model.layers.0.mlp.up_proj.bias"] = np.zeros(96, np.float32)  # a bias on one projection of one layer
    write_llama_gguf(path, extra)
    _bad(path, "ffn_up.bias is present in some layers only")


@pytest.mark.parametrize("key,value,pattern", [
    ("llama.rope.scaling.type", ("yarn", gguf.GGUFValueType.STRING), "RoPE scaling 'yarn'"),
    ("llama.attention.head_count_kv", (3, gguf.GGUFValueType.UINT32), "not a multiple"),
    ("llama.embedding_length", None, "misses 'llama.embedding_length'"),
    ("llama.block_count", ("two", gguf.GGUFValueType.STRING), "expected int"),
    ("llama.rope.dimension_count", (8, gguf.GGUFValueType.UINT32), "partial rotary"),
    ("general.alignment", (24, gguf.GGUFValueType.UINT32), "power-of-two"),
])
def test_bad_metadata(tmp_path, key, value, pattern):
    path = tmp_path / "meta.gguf"
    if key == "general.alignment":  # GGUFWriter would align to it: patch the value in a good file
        write_llama_gguf(path, random_llama_state(np.random.default_rng(0)),
                         metadata={key: (32, gguf.GGUFValueType.UINT32)})
        data = bytearray(path.read_bytes())
        at = data.index(b"general.alignment") + len(b"general.alignment") + 4
        data[at:at + 4] = struct.pack("<I", value[0])
        path.write_bytes(bytes(data))
    else:
        write_llama_gguf(path, random_llama_state(np.random.default_rng(0)), metadata={key: value})
    _bad(path, pattern)


F32, U32, STR = gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.UINT32, gguf.GGUFValueType.STRING


@pytest.mark.parametrize("metadata,key", [
    ({"llama.rope.scaling.factor": (4.0, F32)}, "llama.rope.scaling.factor"),
    ({"llama.rope.scale_linear": (4.0, F32)}, "llama.rope.scale_linear"),
    ({"llama.rope.scaling.factor": (0.5, F32), "llama.rope.scale_linear": (1.0, F32)}, "llama.rope.scaling.factor"),
])
def test_rope_scaling_factor_without_type_is_refused(tmp_path, metadata, key):
    """llama.cpp reads a factor without a scaling type as linear RoPE scaling (rope.scaling.factor,
    or rope.scale_linear where that key is absent), which this library does not compute: refused,
    naming the key, not loaded unscaled."""
    path = tmp_path / "rope_factor.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0)), metadata=metadata)
    _bad(path, re.escape(repr(key)), "linear RoPE scaling")


@pytest.mark.parametrize("metadata", [
    {"llama.rope.scaling.factor": (1.0, F32)},
    {"llama.rope.scaling.factor": (0.0, F32)},
    {"llama.rope.scale_linear": (1.0, F32)},
    {"llama.rope.scaling.factor": (1.0, F32), "llama.rope.scale_linear": (4.0, F32)},  # the factor wins
    {"llama.rope.scaling.factor": (0.0, F32), "llama.rope.scale_linear": (2.0, F32)},  # even a 0 one: no scaling
    {"llama.rope.scaling.type": ("none", STR), "llama.rope.scaling.factor": (4.0, F32)},  # "none" never scales
])
def test_rope_scaling_factor_meaning_none_is_accepted(tmp_path, metadata):
    state = random_llama_state(np.random.default_rng(0))
    plain, scaled = tmp_path / "plain.gguf", tmp_path / "factor.gguf"
    write_llama_gguf(plain, state)
    write_llama_gguf(scaled, state, metadata=metadata)
    config = read_gguf(scaled).config
    assert config == read_gguf(plain).config and config["rope_scaling"] is None


@pytest.mark.parametrize("metadata", [
    {"llama.rope.scaling.attn_factor": (1.5, F32)},
    {"llama.rope.scaling.attn_factor": (0.5, F32), "llama.rope.scaling.type": ("none", STR)},
])
def test_rope_attn_factor_is_refused_not_ignored(tmp_path, metadata):
    """llama.cpp multiplies the rotated queries and keys by rope.scaling.attn_factor, whatever the
    scaling type; the file loaded as if it were absent (logits 11 away from llama.cpp's reading):
    refused, naming the key. A factor of 1 changes nothing and loads."""
    path = tmp_path / "attn_factor.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0)), metadata=metadata)
    _bad(path, re.escape("'llama.rope.scaling.attn_factor'"), "queries and keys")
    ones = tmp_path / "attn_factor_1.gguf"
    write_llama_gguf(ones, random_llama_state(np.random.default_rng(0)),
                     metadata={"llama.rope.scaling.attn_factor": (1.0, F32)})
    assert read_gguf(ones).config["rope_scaling"] is None


@pytest.mark.parametrize("key,value,expected", [
    ("llama.attention.layer_norm_rms_epsilon", (float("inf"), F32), "a finite number > 0, got inf"),
    ("llama.attention.layer_norm_rms_epsilon", (float("nan"), F32), "a finite number > 0, got nan"),
    ("llama.attention.layer_norm_rms_epsilon", (0.0, F32), "a finite number > 0, got 0.0"),
    ("llama.rope.freq_base", (float("inf"), F32), "a finite number > 0, got inf"),
    ("llama.rope.freq_base", (-1.0, F32), "a finite number > 0, got -1.0"),
    ("llama.context_length", (0, U32), "an int in [1, 2**63 - 1], got 0"),
    ("tokenizer.ggml.unknown_token_id", (1000, U32), "= 1000 is outside the vocabulary of {vocab}"),
])
def test_bad_config_values_name_file_and_key(tmp_path, key, value, expected):
    """Values LlamaConfig would refuse under its own field names are refused here first, naming
    the file and the GGUF key."""
    path = tmp_path / "values.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0)), metadata={key: value})
    message = _bad(path, re.escape(expected.format(vocab=len(tiny_vocab()[0]))))
    assert f"GGUF metadata '{key}': expected" in message or f"GGUF metadata {key} =" in message, message


U64 = gguf.GGUFValueType.UINT64
SIZE_KEYS = ["llama.context_length", "llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
             "llama.attention.head_count", "llama.attention.head_count_kv", "llama.attention.key_length",
             "llama.attention.value_length", "llama.rope.dimension_count", "llama.vocab_size"]


@pytest.mark.parametrize("key", SIZE_KEYS)
@pytest.mark.parametrize("value", [2**63, 2**64 - 1, 0])
def test_sizes_out_of_int64_range_are_refused_naming_the_key(tmp_path, key, value):
    """A uint64 size or count holds up to 2**64 - 1, no int64 size can hold 2**63 or more: such a
    value (llama.context_length = 2**63 was accepted, and the model refused it later under
    another name), or 0, is refused naming the GGUF key."""
    path = tmp_path / "size.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0)), metadata={key: (value, U64)})
    message = _bad(path, re.escape(f"GGUF metadata '{key}': expected an int in [1, 2**63 - 1], got {value}"))
    assert message.count("GGUF metadata") == 1, message


def test_largest_context_length_is_accepted(tmp_path):
    """2**63 - 1 is the bound itself: read, as the model's max_position_embeddings."""
    path = tmp_path / "ctx.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0)),
                     metadata={"llama.context_length": (2**63 - 1, U64)})
    assert read_gguf(path).config["max_position_embeddings"] == 2**63 - 1


def test_random_header_corruption_is_a_value_error(tmp_path, good_tiny):
    """Bytes flipped at random in the header, metadata and tensor table (and random cuts): every
    file either loads or raises a ValueError naming it; never another exception, never a hang."""
    from transformer_core import Tokenizer

    good = good_tiny.read_bytes()
    table_end = good.index(b"blk.1.ffn_down.weight") + 64
    rng = np.random.default_rng(11)
    path = tmp_path / "fuzz.gguf"
    outcomes = {"loaded": 0, "ValueError": 0}
    for _ in range(300):
        data = bytearray(good)
        for pos in rng.integers(0, table_end, rng.integers(1, 4)):
            data[pos] = rng.integers(0, 256)
        if rng.random() < 0.2:
            data = data[:rng.integers(0, len(data))]
        path.write_bytes(bytes(data))
        for load in (lambda p: read_gguf(p).state_dict(), Tokenizer.from_gguf):
            try:
                load(path)
                outcomes["loaded"] += 1
            except ValueError as e:
                assert str(path) in str(e)
                outcomes["ValueError"] += 1
    assert outcomes["ValueError"] > 300


# ------------------------------------------------------------------------------------ argument and metadata checks
def test_odd_key_length_is_named(tmp_path):
    """An odd llama.attention.key_length: the error names that key and its value (it named only
    rope.dimension_count, embedding_length and head_count, none of which is wrong)."""
    path = tmp_path / "keylen.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0)),
                     metadata={"llama.attention.key_length": (15, U32)})
    _bad(path, re.escape("cannot find an even head_dim >= 2 (attention.key_length 15, rope.dimension_count 16, "
                         "embedding_length 64, head_count 4)"))
    # no key_length, and embedding_length not a multiple of head_count: said absent
    path = tmp_path / "nokeylen.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0), hidden=64, heads=4),
                     metadata={"llama.attention.head_count": (5, U32), "llama.attention.head_count_kv": (5, U32)})
    _bad(path, re.escape("(attention.key_length absent, rope.dimension_count 16, embedding_length 64, head_count 5)"))


@pytest.mark.parametrize("args,error,says", [
    ((2.5, 4), TypeError, "num_heads: expected an int, got float 2.5"),
    ((2, 4.0), TypeError, "head_dim: expected an int, got float 4.0"),
    (("2", 4), TypeError, "num_heads: expected an int, got str '2'"),
    ((True, 2), TypeError, "num_heads: expected an int, got bool True"),
    ((2, None), TypeError, "head_dim: expected an int, got NoneType None"),
    ((0, 4), ValueError, "num_heads: expected an int in [1, 4294967296], got 0"),
    ((2, 0), ValueError, "head_dim: expected an int in [2, 4294967296], got 0"),
    ((2**62, 2), ValueError, "num_heads: expected an int in [1, 4294967296], got 4611686018427387904"),
    ((2**31, 4), ValueError, "num_heads, head_dim: expected at most 4294967296 rows in all"),
    ((2, 5), ValueError, "head_dim: expected an even int (RoPE rotates pairs of rows), got 5"),
])
def test_rope_row_permutation_checks_its_arguments(args, error, says):
    """Arguments are checked as the library's ints are (numpy raised its own errors, or for
    (2**62, 2) tried to build the array)."""
    with pytest.raises(error) as info:
        rope_row_permutation(*args)
    assert str(info.value).startswith(says), str(info.value)


def test_rope_row_permutation_allocates_only_what_it_checks(monkeypatch):
    """2**32 rows passed the row bound, then np.arange and its reordered copy (two int64 arrays of
    32 GiB each) raised numpy's MemoryError for rope_row_permutation(2, 2**31). Now the result is
    checked first and is the only array of that size (numpy's traced peak; the others hold
    num_heads + head_dim / 2 values, besides numpy's fixed ufunc buffers), and a machine of one byte
    less refuses it, naming the arguments."""
    import tracemalloc

    import transformer_core._validation as tcv

    for heads, head_dim in ((512, 128), (1, 2), (3, 130), (4096, 2)):
        need = heads * head_dim * 8
        tracemalloc.start()
        try:
            perm = rope_row_permutation(heads, head_dim)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        w = np.arange(heads * head_dim, dtype=np.float64)[:, None]
        np.testing.assert_array_equal(converter_permute(w, heads)[perm], w)
        assert perm.dtype == np.int64 and perm.flags.c_contiguous and perm.shape == (heads * head_dim,)
        # + numpy's ufunc buffers for a strided output (a few × 8192 values, np.getbufsize()), whatever the size
        assert peak <= need + 8 * (heads + head_dim) + 4 * 8 * np.getbufsize(), f"peak {peak}, result {need}"
        monkeypatch.setattr(tcv, "physical_memory_bytes", lambda: need - 1)
        with pytest.raises(ValueError, match=rf"^num_heads, head_dim: an array of shape \({heads * head_dim},\) "
                                             rf"needs {need} bytes"):
            rope_row_permutation(heads, head_dim)
        monkeypatch.setattr(tcv, "physical_memory_bytes", lambda: need)
        np.testing.assert_array_equal(rope_row_permutation(heads, head_dim), perm)
        monkeypatch.undo()


def test_rope_row_permutation_takes_numpy_ints():
    perm = rope_row_permutation(np.int64(3), np.int32(8))
    assert perm.dtype == np.int64 and perm.tolist() == rope_row_permutation(3, 8).tolist()
    w = np.arange(24, dtype=np.float64)[:, None]
    np.testing.assert_array_equal(converter_permute(w, 3)[perm], w)


@pytest.mark.parametrize("value,got", [
    ((3, gguf.GGUFValueType.UINT32), "got int 3"),
    ((["a", "b"], gguf.GGUFValueType.ARRAY), "got an array of 2 values"),
    ((True, gguf.GGUFValueType.BOOL), "got bool True"),
])
def test_chat_template_that_is_not_a_string_is_refused(tmp_path, value, got):
    """GGUFCheckpoint.chat_template is documented "a Jinja2 string or None": any other type is
    refused when the file is opened, naming the file and the key (it was handed on as it was)."""
    path = tmp_path / "template.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0)),
                     metadata={"tokenizer.chat_template": value})
    message = _bad(path, re.escape("GGUF metadata tokenizer.chat_template: expected a string (a Jinja2 template), "
                                   + got))
    assert message.startswith(f"{path}: "), message
    # a string, or no template at all, is kept as it is
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0)),
                     metadata={"tokenizer.chat_template": ("{{ x }}", STR)})
    assert read_gguf(path).chat_template == "{{ x }}"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0)), metadata={"tokenizer.chat_template": None})
    assert read_gguf(path).chat_template is None
