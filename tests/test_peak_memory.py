"""Peak memory of the calls that move whole models: saving, loading, quantizing, and tokenizing a huge
text under truncation. Each test measures the call's peak with ``tracemalloc``, which counts numpy's
data allocations (those of the arrays the C++ bindings return too), against the bytes the call is
about, with a bound far from both the old and the new peak (see each test) so that it is not flaky.
The values the calls produce are compared with the whole-copy way of producing them.
"""
from __future__ import annotations

import os
import tracemalloc

import numpy as np
import pytest
import safetensors.numpy
import transformer_core as tc
from transformer_core.training import save_checkpoint


def _peak(call) -> tuple[object, int]:
    """``(call(), the peak of traced allocations during it, in bytes)``."""
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _weight_bytes(model) -> int:
    return sum(np.dtype(np.float32 if f not in ("float32", "float64") else f).itemsize * int(np.prod(shape))
               for f, shape in zip(model.weight_formats().values(), model.parameter_shapes().values()))


def _gpt2(vocab_size: int = 1000):
    """A GPT-2 LM (its Conv1D weights are held transposed: the checkpoint's layout is a copy)."""
    return tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=vocab_size, n_positions=64, n_embd=64, n_layer=2, n_head=4))


def _llama_interleaved():
    """A Llama LM holding its q/k rows in another order than the checkpoint's (``row_permutation``)."""
    return tc.LlamaForCausalLM(tc.LlamaConfig(vocab_size=500, hidden_size=64, intermediate_size=128,
                                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                              tie_word_embeddings=False), rope_layout="interleaved")


def _whole_copy_state(model) -> dict:
    """The weights as save_pretrained writes them (names, layout), made the whole-copy way."""
    prefix = "transformer." if isinstance(model, tc.GPT2LMHeadModel) else ""
    return {prefix + name: value for name, value in model.state_dict().items()}


@pytest.mark.parametrize("make", [_gpt2, _llama_interleaved, lambda: tc.quantize(_gpt2())],
                         ids=["gpt2_transposed", "llama_row_permutation", "gpt2_int8"])
def test_save_pretrained_writes_the_whole_copy_bytes_one_tensor_at_a_time(tmp_path, make):
    # Before: state_dict() copied every weight, then safetensors wrote them: peak >= 1.1x the
    # weights. Now views are written, each non-contiguous (transposed, permuted, dequantized) tensor
    # copied in its turn: the peak is about the largest such tensor (here < 0.25x).
    model = make()
    _, peak = _peak(lambda: model.save_pretrained(tmp_path / "m"))
    assert peak < 0.5 * _weight_bytes(model), (peak, _weight_bytes(model))
    expected = safetensors.numpy.save(_whole_copy_state(model), metadata={"format": "pt"})
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == expected


def test_save_checkpoint_streams_the_weights_and_moments(tmp_path):
    # Before: the optimizer's and the model's states were copied whole first: peak 4.4x the weights
    # (the checkpoint is 3x them). Now about one tensor: 0.25x.
    model = _gpt2()
    opt = tc.optim.AdamW(model.named_parameters(), lr=1e-3)
    model.train()
    ids = np.arange(16)[None]
    model.loss(ids, ids)
    model.backward()
    opt.step()
    weights, moments = _whole_copy_state(model), opt.state_dict()
    _, peak = _peak(lambda: save_checkpoint(tmp_path / "ck", model, opt))
    assert peak < 0.5 * _weight_bytes(model), (peak, _weight_bytes(model))

    written = safetensors.numpy.load_file(str(tmp_path / "ck" / "model.safetensors"))
    assert written.keys() == weights.keys()
    for name, value in weights.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)
    written = safetensors.numpy.load_file(str(tmp_path / "ck" / "optimizer.safetensors"))
    params = dict(model.named_parameters())
    assert written.keys() == moments.keys()
    for key, value in moments.items():
        name = key.partition(".")[2].rpartition(".")[0]
        if key.startswith("state.") and value.ndim and not params[name].checkpoint_layout:
            value = params[name].to_checkpoint_layout(value)  # the checkpoint holds the checkpoint's layout
        np.testing.assert_array_equal(written[key], value, err_msg=key)


def _hf_checkpoints():
    """Small random transformers models (the classes the loaders read), each ``(ours, make)``."""
    import transformers

    return {
        "gpt2": (tc.GPT2LMHeadModel, lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=4))),
        "llama": (tc.LlamaForCausalLM, lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, tie_word_embeddings=False))),
        "bert": (tc.BertModel, lambda: transformers.BertModel(transformers.BertConfig(
            vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4))),
    }


@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert"])
def test_from_pretrained_reads_one_tensor_at_a_time(tmp_path, kind):
    # Before: every tensor read (safetensors' copy, then a second copy) into a dict that lived until
    # the model was loaded: the traced peak was 2x the weights. Now each is read into the built
    # model and dropped: about the largest tensor (< 0.3x here).
    import torch

    ours, make = _hf_checkpoints()[kind]
    torch.manual_seed(0)
    reference = make()
    reference.save_pretrained(tmp_path)
    model, peak = _peak(lambda: ours.from_pretrained(tmp_path))
    assert peak < 0.5 * _weight_bytes(model), (peak, _weight_bytes(model))
    expected = {k: v.numpy() for k, v in reference.state_dict().items()}
    for name, value in model.state_dict().items():
        key = name if name in expected else next(k for k in expected if k.endswith("." + name))
        np.testing.assert_array_equal(value, expected[key], err_msg=name)


def test_from_pretrained_refuses_a_misshaped_checkpoint_before_reading_a_tensor(tmp_path):
    # The names, shapes and dtypes come from the header: a bad checkpoint is refused, naming the
    # file, with no tensor read (before: every tensor was read first).
    weights = safetensors.numpy.load_file(str(_saved_gpt2(tmp_path) / "model.safetensors"))
    weights["transformer.h.0.mlp.c_fc.bias"] = np.zeros(7, np.float32)
    safetensors.numpy.save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    del weights
    tracemalloc.start()
    with pytest.raises(ValueError, match=r"model\.safetensors.*h\.0\.mlp\.c_fc\.bias"):
        tc.GPT2LMHeadModel.from_pretrained(tmp_path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 0.1 * (tmp_path / "model.safetensors").stat().st_size


def _saved_gpt2(folder):
    _gpt2().save_pretrained(folder)
    return folder


@pytest.mark.parametrize("make, keep", [(_gpt2, None), (_llama_interleaved, ["model.layers.0.mlp.down_proj.weight"])],
                         ids=["gpt2", "llama_keep_float"])
def test_quantize_copy_converts_layer_by_layer(make, keep):
    # Before: a float copy of every weight (numpy copies of them all, then the copy's own buffers),
    # then the conversion: a traced peak of 1x the float weights. Now each linear layer is converted
    # as soon as its weight is copied in: about one weight (< 0.25x here). The int8 values are the
    # same as those of converting a whole float copy in place.
    import copy

    model = make().eval()
    quantized, peak = _peak(lambda: tc.quantize(model, keep_float=keep))
    assert peak < 0.5 * _weight_bytes(model), (peak, _weight_bytes(model))
    reference = tc.quantize(copy.deepcopy(model), inplace=True, keep_float=keep)
    assert quantized.weight_formats() == reference.weight_formats()
    expected = reference.state_dict()  # int8 weights dequantized: the int8 values times their scales
    for name, value in quantized.state_dict().items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)
    ids = np.arange(12)[None]
    np.testing.assert_array_equal(quantized(ids).logits, reference(ids).logits)  # the tied head's int8 copy too


_HUGE_TEXT_PEAK = """
import ctypes, gc, random, sys
import transformer_core as tc

def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key))

tok = tc.Tokenizer.from_pretrained("all-MiniLM-L6-v2")  # an encoder tokenizer: max_length 256
random.seed(0)
text = " ".join(random.choice(["alpha", "beta", "river", "stone", "fox"]) for _ in range(200_000))
call = {"encode": lambda: tok.encode(text), "encode_batch": lambda: tok.encode_batch([text, "a short one"]),
        "tokenize": lambda: tok.tokenize(text)}[sys.argv[1]]
call()  # the first call's one-time allocations (the backend's caches, the checks' copies) are not the text's
gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)
before = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
call()
print(status("VmHWM") - before, len(text))
"""


@pytest.mark.parametrize("method", ["encode", "encode_batch", "tokenize"])
def test_truncating_tokenizer_tokenizes_a_huge_text_from_its_prefix(method):
    # The tokenizers package (Rust: tracemalloc does not see it) tokenized the whole text before
    # cutting it to 256 tokens: about 130 bytes per character (+140 MB here for 1.2 MB of text). Now
    # the prefix cut at a space that gives the same tokens (_same_tokens_prefix): a few MB. Measured
    # as the process's high-water mark (VmHWM, reset first) in a child process.
    import subprocess
    import sys

    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the high-water mark")
    run = subprocess.run([sys.executable, "-c", _HUGE_TEXT_PEAK, method], capture_output=True, text=True,
                         timeout=120, check=True)
    peak, chars = map(int, run.stdout.split())
    assert peak < 16 * chars, (peak, chars)  # before: > 100 bytes a character


# ------------------------------------------------------------------ what the streaming paths keep
def test_save_safetensors_refuses_metadata_that_is_not_text_before_writing(tmp_path):
    # safetensors' header holds str -> str metadata: anything else was a TypeError of the library's
    # writer; the streaming writer wrote an unreadable file over a good one before this check.
    from transformer_core.checkpoints import save_pretrained_files

    save_pretrained_files(tmp_path, {"a": 1}, {"w": np.zeros(2, np.float32)})
    before = (tmp_path / "model.safetensors").read_bytes()
    with pytest.raises(TypeError, match="metadata"):
        save_pretrained_files(tmp_path, {"a": 1}, {"w": np.ones(2, np.float32)}, metadata={"format": "pt", "step": 3})
    assert (tmp_path / "model.safetensors").read_bytes() == before
    np.testing.assert_array_equal(safetensors.numpy.load_file(str(tmp_path / "model.safetensors"))["w"], np.zeros(2))


def test_save_checkpoint_keeps_what_a_subclass_state_dict_adds(tmp_path):
    # Seq2SeqTransformer's state_dict adds the position table it loaded from a tutorial's weights;
    # the checkpoint writes the state_dict's entries, so a resumed model adds the same table.
    from transformer_core.positional import sinusoidal_positional_encoding
    from transformer_core.training import load_checkpoint

    def make():
        return tc.Seq2SeqTransformer(20, 20, d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                     dim_feedforward=32)

    model = make()
    state = model.state_dict()
    table = sinusoidal_positional_encoding(model.max_len, 16, dtype=np.float64).astype(np.float32)[:, None, :]
    table[5:, 0, 0] += 1e-3  # a tutorial's float32 table, off the exact one
    state["positional_encoding.pos_embedding"] = table
    model.load_state_dict(state)
    save_checkpoint(tmp_path, model)
    written = safetensors.numpy.load_file(str(tmp_path / "model.safetensors"))
    np.testing.assert_array_equal(written["positional_encoding.pos_embedding"], model.pe[:, None, :])
    resumed = make()
    load_checkpoint(tmp_path, resumed)
    assert resumed.pe_loaded
    np.testing.assert_array_equal(resumed.pe, model.pe)


def test_load_llama_checkpoint_still_gives_arrays(tmp_path):
    # from_pretrained reads a directory's tensors one at a time; the public loader gives arrays.
    from transformer_core.checkpoints import load_llama_checkpoint

    model = _llama_interleaved()
    model.save_pretrained(tmp_path)
    _, state, _ = load_llama_checkpoint(tmp_path)
    expected = model.state_dict()
    assert set(state) == set(expected)
    for name, value in state.items():
        assert isinstance(value, np.ndarray), name
        np.testing.assert_array_equal(value, expected[name], err_msg=name)


def test_a_copy_converted_as_it_is_made_keeps_the_gradients():
    # _rebuilt_copy with on_weight (quantize's copy, one weight at a time) copies the gradients as
    # the whole-copy way does.
    from transformer_core.module import _rebuilt_copy

    model = _gpt2(vocab_size=50)
    model.train()
    ids = np.arange(6)[None]
    model.loss(ids, ids)
    model.backward()
    seen = []
    whole = dict(_rebuilt_copy(model).named_parameters())
    lazy = dict(_rebuilt_copy(model, on_weight=lambda impl, slot: seen.append(slot.core_name)).named_parameters())
    assert seen and set(whole) == set(lazy)
    for name, p in whole.items():
        assert p.grad is not None, name
        np.testing.assert_array_equal(lazy[name].grad, p.grad, err_msg=name)
        np.testing.assert_array_equal(lazy[name].data, p.data, err_msg=name)


@pytest.mark.parametrize("tensors, metadata, match", [
    ([("w", np.zeros(2, np.float32))], None, "tensors: expected a mapping"),
    ({1: np.zeros(2, np.float32)}, None, "tensors: expected str names"),
    ({"w": np.array(["a"])}, None, r"tensors\['w'\]: expected a dtype"),
    ({"w": np.zeros(2, np.float32)}, [("format", "pt")], "metadata: expected None or a mapping"),
    ({"w": np.zeros(2, np.float32)}, {"format": b"pt"}, "metadata: expected str keys and str values"),
])
def test_save_safetensors_names_bad_arguments_before_opening_the_file(tmp_path, tensors, metadata, match):
    from transformer_core.hub import save_safetensors

    with pytest.raises(TypeError, match=match):
        save_safetensors(tensors, tmp_path / "x.safetensors", metadata)
    assert not (tmp_path / "x.safetensors").exists()
