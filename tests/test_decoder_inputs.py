"""The decoder models' bad inputs (transformer_core.decoder): ``positions_from_mask`` checks its
arguments, a refused call leaves the caller's KV cache as it was (capacity included), and a 1-D
``position_ids`` / ``attention_mask`` / ``labels`` that does not fit is reported in the shape the
caller passed. Accepted calls are compared with Hugging Face's Llama."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import assert_close, refusal_peak
from transformer_core.decoder import positions_from_mask

transformers = pytest.importorskip("transformers")

VOCAB = 31
HUGE_CONTEXT = 2**40  # rotary tables of every position could never be built


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(Hugging Face's LlamaForCausalLM, ours from its checkpoint): a context of 2**40 positions.
    HF computes RoPE per call, ours builds tables as the positions come."""
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1,
                                   max_position_embeddings=HUGE_CONTEXT, initializer_range=0.3,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                   attn_implementation="eager")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("llama_huge_context")
    hf.save_pretrained(path, safe_serialization=True)
    return hf, tc.LlamaForCausalLM.from_pretrained(path)


def _ids(seed, shape):
    return np.random.default_rng(seed).integers(0, VOCAB, size=shape).astype(np.int64)


def _hf_logits(hf, ids, **kw) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.from_numpy(ids), **{k: torch.from_numpy(v) for k, v in kw.items()}).logits.numpy()


# ------------------------------------------------------------------------------ positions_from_mask
MASK = np.array([[1, 1, 1, 0, 0, 1], [0, 0, 1, 1, 1, 1], [1, 0, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0]])


@pytest.mark.parametrize("form", ["bool", "int64", "float32", "fortran", "broadcast"])
@pytest.mark.parametrize("past", range(MASK.shape[1] + 1))
def test_positions_from_mask_are_torchs_cumsum(form, past):
    """``clamp(cumsum(mask) - 1, 0)[:, past:]`` computed by torch, for each way a mask may come;
    at real tokens they are Hugging Face generate's ``position_ids`` (it sets padding to 1)."""
    mask = {"bool": MASK.astype(bool), "int64": MASK, "float32": MASK.astype(np.float32),
            "fortran": np.asfortranarray(MASK.astype(bool)),
            "broadcast": np.broadcast_to(MASK[2].astype(np.int32), (3, MASK.shape[1]))}[form]
    got = positions_from_mask(mask, past)
    m = torch.from_numpy(np.array(mask, np.int64))
    ref = torch.clamp(m.cumsum(-1) - 1, min=0)[:, past:]
    assert got.dtype == np.int64 and got.flags.c_contiguous and got.shape == tuple(ref.shape)
    np.testing.assert_array_equal(got, ref.numpy())
    hf = (m.cumsum(-1) - 1).masked_fill(m == 0, 0)[:, past:]  # transformers 5's generate (4.x: 1 at the pads)
    real = m[:, past:].numpy() == 1
    np.testing.assert_array_equal(got[real], hf.numpy()[real])


@pytest.mark.parametrize("mask, past, error, pattern", [
    (np.ones((2, 3), bool), 5, ValueError,
     r"^past: expected an int in \[0, 3\] \(attention_mask's width, past \+ new length\), got 5$"),
    (np.ones((2, 3), bool), -1, ValueError, r"^past: expected an int >= 0, got -1$"),
    (np.ones((2, 3), bool), 1.0, TypeError, r"^past: expected an int, got float 1.0$"),
    (np.ones((2, 3), bool), True, TypeError, r"^past: expected an int, got bool True$"),
    (np.array([[0, 2, 2]]), 0, ValueError, r"^attention_mask: expected a bool or 0/1 mask, got values such as \[2\]$"),
    (np.array([[0.5, 1.0]]), 0, ValueError, r"^attention_mask: expected a bool or 0/1 mask, got values such as \[0.5\]"),
    (None, 0, TypeError, r"^attention_mask: expected an array, got None$"),
    (np.ones(3, bool), 0, ValueError,
     r"^attention_mask: expected a 2-D array \(batch, past \+ new length\), got shape \(3,\)$"),
    (np.ones((2, 3, 1), bool), 0, ValueError,
     r"^attention_mask: expected a 2-D array \(batch, past \+ new length\), got shape \(2, 3, 1\)$"),
    (np.array([["a", "b"]]), 0, TypeError, r"^attention_mask: expected a bool or 0/1 mask, got dtype <U1$"),
])
def test_positions_from_mask_refuses_bad_input(mask, past, error, pattern):
    """It checked nothing: a past beyond the mask gave an empty result, a negative one the last
    column only, a mask value of 2 counted twice, a 1-D mask or None a numpy AxisError."""
    with pytest.raises(error, match=pattern):
        positions_from_mask(mask, past)


def test_positions_from_mask_checks_its_result_against_memory():
    """A broadcast mask of a shape no machine holds: a ValueError naming it before the cumsum
    allocates (numpy would raise MemoryError)."""
    mask = np.broadcast_to(np.ones(1, bool), (2**31, 2**31))
    with pytest.raises(ValueError, match=r"^attention_mask: an array of shape \(2147483648, 2147483647\) needs "):
        positions_from_mask(mask, 1)


# --------------------------------------------------------------------------- shapes as given
def test_one_dim_inputs_of_another_batch_report_the_shape_given(llama):
    """A 1-D attention_mask or labels with a batch of 2 said "got (1, 3)", a shape the caller never
    passed; a 1-D one with a batch of 1 is still that batch's row. (A position_ids of (3,) or (1, 3)
    is shared by the batch, as Hugging Face's: test_models_gpt2.py; (3, 3) is reported as given.)"""
    hf, m = llama
    ids = _ids(1, (2, 3))
    with pytest.raises(ValueError, match=r"^position_ids: expected shape \(2, 3\) \(input_ids'\), got \(3, 3\)$"):
        m(ids, position_ids=np.zeros((3, 3), int))
    with pytest.raises(ValueError, match=r"^attention_mask: expected shape \(2, 3\) \(batch, past \+ new length\), "
                                         r"got \(3,\)$"):
        m(ids, attention_mask=np.ones(3, int))
    with pytest.raises(ValueError, match=r"^labels: expected shape \(2, 3\) \(input_ids'\), got \(3,\)$"):
        m.loss(ids, ids[0])
    np.testing.assert_array_equal(m(ids, position_ids=np.arange(3)[None]).logits, m(ids).logits)
    positions = np.array([4, 5, 9])
    out = m(ids[:1], position_ids=positions, attention_mask=np.array([0, 1, 1])).logits
    ref = _hf_logits(hf, ids[:1], position_ids=positions[None], attention_mask=np.array([[0, 1, 1]]))
    assert_close(out[:, 1:], ref[:, 1:], np.float32, what="1-D position_ids and mask, batch of 1")


# ----------------------------------------------------------- refused calls leave the cache alone
def test_positions_beyond_the_rotary_tables_memory_leave_the_cache_as_it_was(llama, monkeypatch):
    """position_ids whose rotary tables exceed this machine's memory: the model reserved the cache,
    then the C++ tables refused, so the cache had grown (capacity 1 -> 3); the message named the
    tables, not position_ids. Refused now before the cache grows or one is made; the model then
    continues as Hugging Face."""
    hf, m = llama
    ids = _ids(2, (2, 5))
    cache = m.new_cache(2, 1)
    m(ids[:, :2], past_key_values=cache)
    before = (cache.capacity, cache.length)
    assert before == (2, 2)
    far = 2**39
    bad = np.array([[2, 3, far]] * 2)
    with pytest.raises(ValueError, match=rf"^position_ids: position {far} needs rotary tables \(cos and sin of "
                                         rf"{far + 1} positions × 8 float32; max_position_embeddings {HUGE_CONTEXT}\) "
                                         rf"of {2 * (far + 1) * 8 * 4} bytes, which exceed this machine's memory"):
        m(ids[:, 2:], position_ids=bad, past_key_values=cache)
    assert (cache.capacity, cache.length) == before
    made = []
    new_cache = m.new_cache
    monkeypatch.setattr(m, "new_cache", lambda *a: made.append(a) or new_cache(*a))
    with pytest.raises(ValueError, match=rf"^position_ids: position {far} needs rotary tables"):
        m(ids[:, :3], position_ids=bad)
    assert made == []
    out = m(ids[:, 2:], past_key_values=cache, use_cache=True).logits
    assert cache.length == 5
    assert_close(out, _hf_logits(hf, ids)[:, 2:], np.float32, what="logits after the refused call")


@pytest.mark.parametrize("how", ["default", "mask"])
def test_default_positions_beyond_the_rotary_tables_memory_name_input_ids(llama, monkeypatch, how):
    """The positions the model derives (past .. past + L - 1, whatever the mask: Hugging Face's
    forward) are checked the same way, naming input_ids: on a machine of 900 bytes
    (monkeypatched), tables of 8 positions (2 · 8 · 8 float32 values, 512 bytes) fit and tables of
    16 (1,024 bytes) do not."""
    hf, m = llama
    from transformer_core import nn

    ids = _ids(3, (1, 16))
    cache = m.new_cache(1)
    m(ids[:, :8], past_key_values=cache)
    before = (cache.capacity, cache.length)
    monkeypatch.setattr(nn, "physical_memory_bytes", lambda: 900)
    kw = {} if how == "default" else dict(attention_mask=np.r_[np.ones(15, int), 0][None])
    last = 15  # with a mask too: positions do not follow it
    with pytest.raises(ValueError, match=rf"^input_ids: position {last} needs rotary tables \(cos and sin of "
                                         rf"{last + 1} positions × 8 float32; max_position_embeddings "
                                         rf"{HUGE_CONTEXT}\) of {2 * (last + 1) * 8 * 4} bytes, which exceed this "
                                         r"machine's memory \(900 bytes\)$"):
        m(ids[:, 8:], past_key_values=cache, **kw)
    assert (cache.capacity, cache.length) == before
    monkeypatch.undo()
    out = m(ids[:, 8:], past_key_values=cache, **kw).logits
    hf_kw = {} if how == "default" else {"attention_mask": np.r_[np.ones(15, int), 0][None]}
    assert_close(out, _hf_logits(hf, ids, **hf_kw)[:, 8:], np.float32, what="logits after the refused call")


# ------------------------------------------------------------- the other inputs' shapes before the ids' copy
def test_other_inputs_shapes_refused_before_the_ids_copy(llama):
    """A wrong-shaped attention_mask, position_ids, labels or token_type_ids was refused only after
    input_ids (a broadcast view of 2e7 x 4 int32 ids: 610 MB, 1.6 s) had been copied to int64."""
    from transformer_core.seq2seq import Seq2SeqTransformer

    _, model = llama
    ids = np.broadcast_to(np.int32(1), (2 * 10**6, 4))  # int64 copy: 64 MB
    bad = np.ones((3, 3))
    bert = tc.BertModel(dict(vocab_size=37, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=16, max_position_embeddings=16))
    s2s = Seq2SeqTransformer(20, 20, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                             dim_feedforward=16, max_len=64)
    cases = [
        (lambda: model(ids, attention_mask=bad), r"^attention_mask: expected shape \(2000000, 4\)"),
        (lambda: model(ids, position_ids=bad), r"^position_ids: expected shape \(2000000, 4\)"),
        (lambda: model.loss(ids, bad), r"^labels: expected shape \(2000000, 4\) \(input_ids'\), got \(3, 3\)$"),
        (lambda: model.generate(ids[:, :1], 1, attention_mask=bad),
         r"^attention_mask: expected shape \(2000000, 1\) \(input_ids'\), got \(3, 3\)$"),
        (lambda: bert(ids, attention_mask=bad), r"^attention_mask: expected shape \(2000000, 4\) \(input_ids'\)"),
        (lambda: bert(ids, token_type_ids=bad), r"^token_type_ids: expected shape \(2000000, 4\) \(input_ids'\)"),
        (lambda: tc.bert.BertEmbeddings(bert.config)(ids, token_type_ids=bad),
         r"^token_type_ids: expected shape \(2000000, 4\) \(input_ids'\)"),
        (lambda: s2s(ids, np.ones((1, 3), np.int64)), r"^tgt: expected batch size 2000000 \(src's\), got shape \(1, 3\)$"),
    ]
    for call, pattern in cases:
        assert refusal_peak(call, ValueError, pattern) < 2**20, pattern
