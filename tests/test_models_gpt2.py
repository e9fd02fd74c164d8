"""tc.GPT2LMHeadModel / tc.GPT2Model vs Hugging Face transformers' GPT-2.

Tiny random GPT-2 checkpoints are built in the test with transformers (``initializer_range=0.2`` so
the logits are far from uniform), saved with ``save_pretrained(safe_serialization=True)`` and loaded
with ``tc.GPT2LMHeadModel.from_pretrained``. ``eos_token_id``/``bos_token_id`` are None so neither
side stops generating early.

Padding note (checked against transformers 5.x): with a left-padded batch and an ``attention_mask``,
a plain forward, HF's GPT2 and ours alike, does NOT derive position ids from the mask (positions are
``past .. past + L - 1`` for every row); ``generate`` passes those counted over the real tokens
(``cumsum(mask) - 1``: ``decoder.positions_from_mask``, as HF's ``generate``). Padded-batch logits are
compared with HF's forward given the same ``position_ids``, and with each prompt run alone, unpadded.
"""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import assert_close, assert_generate_pads_with_config_pad_token_id
from transformer_core.decoder import positions_from_mask

transformers = pytest.importorskip("transformers")

LOGITS_ATOL = 1e-4
VOCAB = 101

CFGS = {
    "h4": dict(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4),
    "h1_inner": dict(vocab_size=VOCAB, n_positions=64, n_embd=24, n_layer=3, n_head=1, n_inner=40),
}


def _build(tmp_path_factory, name):
    cfg = transformers.GPT2Config(**CFGS[name], initializer_range=0.2, eos_token_id=None, bos_token_id=None)
    torch.manual_seed({"h4": 7, "h1_inner": 11}[name])
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    path = tmp_path_factory.mktemp(f"gpt2_{name}")
    hf.save_pretrained(path, safe_serialization=True)
    return hf, path


@pytest.fixture(scope="module", params=list(CFGS))
def gpt2(request, tmp_path_factory):
    """(hf model, checkpoint dir, our model) for each config."""
    hf, path = _build(tmp_path_factory, request.param)
    return hf, path, tc.GPT2LMHeadModel.from_pretrained(path)


@pytest.fixture(scope="module")
def gpt2_h4(tmp_path_factory):
    hf, path = _build(tmp_path_factory, "h4")
    return hf, path, tc.GPT2LMHeadModel.from_pretrained(path)


def _ids(seed, shape):
    return np.random.default_rng(seed).integers(0, VOCAB, size=shape).astype(np.int64)


def _hf(hf, ids, **kw):
    with torch.no_grad():
        return hf(torch.from_numpy(ids), **kw)


# ------------------------------------------------------------------------------------- forward
@pytest.mark.parametrize("N,L", [(1, 1), (2, 7), (3, 13), (5, 5), (1, 64)], ids=["N1L1", "N2L7", "N3L13", "N5L5", "N1L64"])
def test_logits_match_hf(gpt2, N, L):
    hf, _, m = gpt2
    ids = _ids(N * 100 + L, (N, L))
    out = m(ids)
    ref = _hf(hf, ids).logits.numpy()
    assert out.logits.shape == (N, L, VOCAB) and out.logits.dtype == np.float32
    assert_close(out.logits, ref, atol_=LOGITS_ATOL, what="gpt2 logits")
    assert out.past_key_values.length == L  # use_cache=None: the config's (True), as Hugging Face's
    assert out.last_hidden_state.shape == (N, L, hf.config.n_embd)
    assert np.abs(ref).max() > 0.5  # the comparison is not trivially small numbers
    # logits_to_keep
    last = m(ids, logits_to_keep=1).logits
    assert last.shape == (N, 1, VOCAB)
    assert_close(last[:, 0], ref[:, -1], atol_=LOGITS_ATOL)


def test_gpt2_model_hidden_states_match_hf(gpt2):
    hf_lm, path, _ = gpt2
    hf = transformers.GPT2Model.from_pretrained(path).eval()
    ours = tc.GPT2Model.from_pretrained(path)
    ids = _ids(3, (3, 11))
    hidden, cache = ours(ids)
    assert cache.length == 11  # use_cache=None: the config's (True), as Hugging Face's
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)).last_hidden_state.numpy()
    assert_close(hidden, ref, np.float32, what="GPT2Model hidden states")
    # the base model's names are HF GPT2Model's (no transformer. prefix, no lm_head)
    assert set(ours.state_dict()) == {k for k in hf.state_dict() if not k.endswith((".attn.bias", ".attn.masked_bias"))}


def test_fp64_path(gpt2):
    hf, path, _ = gpt2
    m = tc.GPT2LMHeadModel.from_pretrained(path, dtype=np.float64)
    hf64 = transformers.GPT2LMHeadModel.from_pretrained(path).double().eval()
    ids = _ids(5, (2, 9))
    out = m(ids)
    assert out.logits.dtype == np.float64
    with torch.no_grad():
        ref = hf64(torch.from_numpy(ids)).logits.numpy()
    assert_close(out.logits, ref, np.float64, atol_=1e-10, rtol_=1e-12, what="fp64 logits")
    # fp64 cache decoding
    cache = m.new_cache(2)
    assert cache.dtype == np.float64
    step = m(ids[:, :4], past_key_values=cache, use_cache=True)
    step = m(ids[:, 4:], past_key_values=step.past_key_values, use_cache=True)
    assert_close(step.logits, ref[:, 4:], np.float64, atol_=1e-10, rtol_=1e-12)


# ------------------------------------------------------------------------------------ generation
@pytest.mark.parametrize("N,L", [(1, 1), (1, 5), (3, 4)], ids=["N1L1", "N1L5", "N3L4"])
def test_greedy_generate_matches_hf(gpt2, N, L):
    hf, _, m = gpt2
    ids = _ids(17 + N + L, (N, L))
    ours = m.generate(ids, max_new_tokens=12)
    with torch.no_grad():
        ref = hf.generate(torch.from_numpy(ids), max_new_tokens=12, do_sample=False, pad_token_id=0).numpy()
    assert ours.dtype == np.int64 and ours.shape == (N, L + 12)
    np.testing.assert_array_equal(ours, ref)
    np.testing.assert_array_equal(ours[:, :L], ids)


def test_kv_cache_decoding_equals_recomputation(gpt2):
    hf, _, m = gpt2
    N, P, steps = 2, 5, 14
    full_ids = _ids(99, (N, P + steps))
    cache = m.new_cache(N)
    assert cache.length == 0 and len(cache) == hf.config.n_layer
    cap = cache.capacity
    out = m(full_ids[:, :P], past_key_values=cache, use_cache=True)
    assert out.past_key_values is cache
    assert cache.length == P and cache.capacity >= P
    cap = cache.capacity
    for t in range(P, P + steps):
        out = m(full_ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        assert cache.length == t + 1
        if t + 1 > cap:  # grew: doubles (at least to what is needed)
            assert cache.capacity == max(2 * cap, t + 1), (cap, cache.capacity)
        else:
            assert cache.capacity == cap
        cap = cache.capacity
        full = m(full_ids[:, :t + 1]).logits[:, -1]
        assert_close(out.logits[:, 0], full, np.float32, what=f"cache step {t}")
    assert cache.capacity >= cache.length
    # and against HF's logits for the whole sequence
    ref = _hf(hf, full_ids).logits.numpy()
    assert_close(out.logits[:, 0], ref[:, -1], atol_=LOGITS_ATOL)


def test_cache_capacity_doubles_from_one(gpt2_h4):
    _, _, m = gpt2_h4
    cache = m.new_cache(1)
    ids = _ids(1, (1, 20))
    caps = []
    for t in range(20):
        m(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        caps.append(cache.capacity)
    assert caps[0] >= 1
    for a, b in zip(caps, caps[1:]):
        assert b == a or b == 2 * a
    assert caps[-1] >= 20 and caps[-1] < 40
    cache2 = m.new_cache(1, capacity=32)
    for t in range(20):
        m(ids[:, t:t + 1], past_key_values=cache2, use_cache=True)
    assert cache2.capacity == 32 and cache2.length == 20


def _hf_layer_kv(past, i):
    if hasattr(past, "layers"):  # transformers 5.x DynamicCache
        return past.layers[i].keys, past.layers[i].values
    return past[i]  # pragma: no cover - legacy tuple


def test_cache_to_legacy_matches_hf(gpt2):
    hf, _, m = gpt2
    ids = _ids(4, (2, 9))
    out = m(ids, use_cache=True)
    legacy = out.past_key_values.to_legacy()
    ref = _hf(hf, ids, use_cache=True).past_key_values
    H, D = hf.config.n_head, hf.config.n_embd // hf.config.n_head
    assert len(legacy) == hf.config.n_layer
    for i, (k, v) in enumerate(legacy):
        hk, hv = _hf_layer_kv(ref, i)
        assert k.shape == v.shape == (2, H, 9, D)
        assert_close(k, hk, np.float32, what=f"layer {i} keys")
        assert_close(v, hv, np.float32, what=f"layer {i} values")
        k2, v2 = out.past_key_values[i]
        np.testing.assert_array_equal(k2, k)
        np.testing.assert_array_equal(v2, v)


def test_hf_legacy_tuples_as_past(gpt2):
    hf, _, m = gpt2
    ids = _ids(8, (2, 10))
    hf_past = _hf(hf, ids[:, :6], use_cache=True).past_key_values
    legacy = tuple((k.numpy(), v.numpy()) for k, v in (_hf_layer_kv(hf_past, i) for i in range(hf.config.n_layer)))
    out = m(ids[:, 6:], past_key_values=legacy, use_cache=True)
    ref = _hf(hf, ids).logits.numpy()[:, 6:]
    assert_close(out.logits, ref, atol_=LOGITS_ATOL, what="legacy past")
    assert out.past_key_values.length == 10
    # torch tensors directly
    legacy_t = tuple(_hf_layer_kv(hf_past, i) for i in range(hf.config.n_layer))
    out2 = m(ids[:, 6:], past_key_values=legacy_t)
    assert_close(out2.logits, ref, atol_=LOGITS_ATOL, what="legacy past (torch tensors)")
    # the legacy tuple is not modified
    assert legacy[0][0].shape[2] == 6


def test_left_padded_batch_matches_hf(gpt2):
    """Left padding with position_ids counted over the real tokens (positions_from_mask: cumsum(mask)
    - 1, as HF's generate passes them): each padded row equals its prompt run alone and HF given the
    same position_ids."""
    hf, _, m = gpt2
    N, L = 3, 8
    ids = _ids(21, (N, L))
    am = np.ones((N, L), np.int64)
    am[1, :3] = 0
    am[2, :7] = 0
    ids[am == 0] = 0
    positions = positions_from_mask(am, 0)
    out = m(ids, attention_mask=am, position_ids=positions)
    ref = _hf(hf, ids, attention_mask=torch.from_numpy(am), position_ids=torch.from_numpy(positions)).logits.numpy()
    real = am.astype(bool)
    assert np.all(np.isfinite(out.logits))
    assert_close(out.logits[real], ref[real], atol_=LOGITS_ATOL, what="left-padded logits (real rows)")
    for n in range(N):  # each row alone, unpadded
        alone = m(ids[n:n + 1, real[n]]).logits[0]
        assert_close(out.logits[n, real[n]], alone, np.float32, what=f"row {n} padded vs alone")
    # an all-ones mask equals no mask
    assert_close(m(ids, attention_mask=np.ones((N, L), np.int64)).logits, m(ids).logits, np.float32)
    # incremental with the mask: past + new
    cache = m.new_cache(N)
    m(ids[:, :5], attention_mask=am[:, :5], position_ids=positions_from_mask(am[:, :5], 0),
      past_key_values=cache, use_cache=True)
    step = m(ids[:, 5:], attention_mask=am, position_ids=positions_from_mask(am, 5), past_key_values=cache,
             use_cache=True)
    assert_close(step.logits[real[:, 5:]], ref[:, 5:][real[:, 5:]], atol_=LOGITS_ATOL, what="padded + cache")


def test_shared_position_ids_broadcast_over_the_batch_as_hf(gpt2):
    """position_ids of shape (1, L) (or (L,)) are shared by every batch item, as HF's (its default
    is arange(L)[None]): forward and loss equal those with the (N, L) broadcast, and HF's forward
    given the (1, L) ids. They were refused ("expected shape (N, L)")."""
    hf, _, m = gpt2
    N, L = 3, 6
    ids = _ids(41, (N, L))
    am = np.ones((N, L), np.int64)
    am[1, :2] = 0
    shared = np.array([[3, 4, 5, 6, 7, 8]])
    full = np.broadcast_to(shared, (N, L)).copy()
    ref = _hf(hf, ids, attention_mask=torch.from_numpy(am), position_ids=torch.from_numpy(shared)).logits.numpy()
    real = am.astype(bool)
    expected = m(ids, attention_mask=am, position_ids=full).logits
    for given in (shared, shared[0], torch.from_numpy(shared), shared.astype(np.int32)):
        out = m(ids, attention_mask=am, position_ids=given).logits
        np.testing.assert_array_equal(out, expected)
        assert_close(out[real], ref[real], atol_=LOGITS_ATOL, what=f"shared position_ids {type(given).__name__}")
    labels = np.where(real, ids, -100)
    assert m.loss(ids, labels, attention_mask=am, position_ids=shared) == \
        m.loss(ids, labels, attention_mask=am, position_ids=full)
    # with a cache: the new tokens' positions, shared
    cache = m.new_cache(N)
    m(ids[:, :4], position_ids=shared[:, :4], past_key_values=cache, use_cache=True)
    step = m(ids[:, 4:], position_ids=shared[0, 4:], past_key_values=cache, use_cache=True).logits
    assert_close(step, m(ids, position_ids=full).logits[:, 4:], np.float32, what="shared position_ids + cache")
    # a shape that is neither (N, L) nor one row is refused, naming position_ids and the shape given
    with pytest.raises(ValueError, match=r"^position_ids: expected shape \(3, 6\) \(input_ids'\), got \(2, 6\)$"):
        m(ids, position_ids=full[:2])
    with pytest.raises(ValueError, match=r"^position_ids: expected shape \(3, 6\) \(input_ids'\), got \(1, 5\)$"):
        m(ids, position_ids=shared[:, :5])
    with pytest.raises(ValueError, match=r"^position_ids: expected positions in \[0, 64\), got \[3, 64\]$"):
        m(ids, position_ids=shared + np.array([[0, 0, 0, 0, 0, 56]]))


def test_left_padded_generate_equals_each_prompt_alone(gpt2):
    hf, _, m = gpt2
    prompts = [_ids(31, (1, 7))[0], _ids(32, (1, 3))[0], _ids(33, (1, 5))[0]]
    L = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), L), np.int64)
    am = np.zeros((len(prompts), L), np.int64)
    for n, p in enumerate(prompts):
        ids[n, L - len(p):] = p
        am[n, L - len(p):] = 1
    batched = m.generate(ids, max_new_tokens=10, attention_mask=am)
    for n, p in enumerate(prompts):
        alone = m.generate(p[None], max_new_tokens=10)
        np.testing.assert_array_equal(batched[n, L:], alone[0, len(p):])
    with torch.no_grad():
        ref = hf.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(am), max_new_tokens=10,
                          do_sample=False, pad_token_id=0).numpy()
    np.testing.assert_array_equal(batched, ref)


def test_sampling_reproducible(gpt2_h4):
    _, _, m = gpt2_h4
    ids = _ids(2, (2, 4))
    a = m.generate(ids, max_new_tokens=12, do_sample=True, seed=123, temperature=1.5)
    b = m.generate(ids, max_new_tokens=12, do_sample=True, seed=123, temperature=1.5)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (2, 16) and a.min() >= 0 and a.max() < VOCAB
    np.testing.assert_array_equal(a[:, :4], ids)
    seeds = [m.generate(ids, max_new_tokens=12, do_sample=True, seed=s, temperature=2.0) for s in range(4)]
    assert any(not np.array_equal(seeds[0], s) for s in seeds[1:]), "different seeds should differ"
    greedy = m.generate(ids, max_new_tokens=12)
    np.testing.assert_array_equal(m.generate(ids, max_new_tokens=12, do_sample=True, top_k=1, seed=5), greedy)
    np.testing.assert_array_equal(m.generate(ids, max_new_tokens=12, do_sample=True, top_p=1e-9, seed=5), greedy)
    c = m.generate(ids, max_new_tokens=12, do_sample=True, seed=9, top_k=5, top_p=0.9)
    np.testing.assert_array_equal(c, m.generate(ids, max_new_tokens=12, do_sample=True, seed=9, top_k=5, top_p=0.9))


def test_generate_eos_stops(gpt2_h4):
    _, _, m = gpt2_h4
    ids = _ids(2, (1, 4))
    greedy = m.generate(ids, max_new_tokens=12)
    eos = int(greedy[0, 6])  # the third generated token
    out = m.generate(ids, max_new_tokens=12, eos_token_id=eos)
    first = 4 + int(np.argmax(greedy[0, 4:] == eos))
    np.testing.assert_array_equal(out[0], greedy[0, :first + 1])


def _with_token_ids(src, dst, **ids):
    """A copy of the checkpoint directory ``src`` at ``dst`` with ``ids`` (e.g. ``eos_token_id``,
    ``pad_token_id``) set in its ``config.json`` and ``generation_config.json``."""
    shutil.copytree(src, dst)
    for name in ("config.json", "generation_config.json"):
        path = dst / name
        if path.is_file():
            path.write_text(json.dumps({**json.loads(path.read_text()), **ids}))
    return dst


def test_generate_pads_finished_rows_with_config_pad_token_id(gpt2_h4, tmp_path):
    """A config with eos_token_id and pad_token_id: a finished row is filled with pad_token_id, as HF's
    generate does (not with the end id)."""
    _, path, m = gpt2_h4
    assert_generate_pads_with_config_pad_token_id(
        m, _ids(2, (2, 4)), lambda **ids: _with_token_ids(path, tmp_path / "gpt2_eos_pad", **ids),
        tc.GPT2LMHeadModel, transformers.GPT2LMHeadModel)


# -------------------------------------------------------------------------------------- checkpoints
def test_untied_lm_head_refused(tmp_path):
    """GPT-2's LM head is wte: a checkpoint with tie_word_embeddings=False (an lm_head.weight of its
    own) is refused by GPT2LMHeadModel, naming the field, rather than loaded with its head dropped;
    a tied one loads and matches HF. GPT2Model, which has no head, loads the untied folder as
    transformers' GPT2Model does (see test_gpt2_model_loads_an_untied_checkpoint_as_hf)."""
    models = {}
    for tied in (False, True):
        cfg = transformers.GPT2Config(**CFGS["h4"], initializer_range=0.2, eos_token_id=None, bos_token_id=None,
                                      tie_word_embeddings=tied)
        torch.manual_seed(5)
        models[tied] = transformers.GPT2LMHeadModel(cfg).eval()
        models[tied].save_pretrained(tmp_path / f"tied_{tied}")
    with pytest.raises(ValueError, match=r"config\.json: tie_word_embeddings=False is not supported by GPT2LMHeadModel"):
        tc.GPT2LMHeadModel.from_pretrained(tmp_path / "tied_False")
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        tc.GPT2LMHeadModel(tc.GPT2Config.from_dict({"tie_word_embeddings": False}))
    m = tc.GPT2LMHeadModel.from_pretrained(tmp_path / "tied_True")
    ids = _ids(8, (2, 9))
    assert_close(m(ids).logits, _hf(models[True], ids).logits.numpy(), atol_=1e-5, what="tied gpt2 logits")
    # as a state dict: the tied head (a copy of wte) loads, an untied one is refused and nothing changes
    before = m(ids).logits
    with pytest.raises(ValueError, match="lm_head.weight"):
        m.load_state_dict({k: v.numpy() for k, v in models[False].state_dict().items()})
    np.testing.assert_array_equal(m(ids).logits, before)
    m.load_state_dict({k: v.numpy() for k, v in models[True].state_dict().items()})
    np.testing.assert_array_equal(m(ids).logits, before)


def test_gpt2_lm_head_model_refuses_an_untied_config_built_by_hand():
    """A config of tie_word_embeddings=False in extra built GPT2LMHeadModel with its head tied to
    wte, and save_pretrained wrote tie_word_embeddings=false without an lm_head.weight (transformers
    then drew a random head). It is refused, before the model is built; a bool is required."""
    small = dict(vocab_size=VOCAB, n_positions=8, n_embd=16, n_layer=1, n_head=2)
    with pytest.raises(ValueError, match="tie_word_embeddings=False is not supported by GPT2LMHeadModel"):
        tc.GPT2LMHeadModel(tc.GPT2Config(**small, extra={"tie_word_embeddings": False}))
    with pytest.raises(TypeError, match=r"^tie_word_embeddings: expected a bool, got str 'no'"):
        tc.GPT2Config.from_dict({**small, "tie_word_embeddings": "no"})
    assert tc.GPT2Model(tc.GPT2Config(**small, extra={"tie_word_embeddings": False})).config.n_embd == 16
    assert tc.GPT2LMHeadModel(tc.GPT2Config(**small, extra={"tie_word_embeddings": True})).config.n_embd == 16


@pytest.mark.parametrize("value, error, got", [(False, ValueError, "bool False"), (None, TypeError, "NoneType None"),
                                               (1, TypeError, "int 1"), ("yes", TypeError, "str 'yes'"),
                                               (0.0, TypeError, "float 0.0")])
def test_refused_scale_attn_weights_names_the_value_given(value, error, got):
    """Every refused scale_attn_weights was reported as "scale_attn_weights=False", None, 1 and "yes"
    included. The message names the value given and what is accepted; a value that is not a bool is
    a TypeError (as tie_word_embeddings). True (also numpy's) is read."""
    small = dict(vocab_size=VOCAB, n_positions=8, n_embd=16, n_layer=1, n_head=2)
    with pytest.raises(error, match=r"^config\.json: scale_attn_weights: expected true \(only scaled attention is "
                                    rf"supported\), got {re.escape(got)}$"):
        tc.GPT2LMHeadModel({**small, "scale_attn_weights": value})
    for ok in (True, np.True_):
        assert tc.GPT2Config.from_dict({**small, "scale_attn_weights": ok}).extra["scale_attn_weights"] == ok


@pytest.mark.parametrize("key, what", [("scale_attn_by_inverse_layer_idx", "scaling by the layer index"),
                                       ("add_cross_attention", "cross-attention")])
@pytest.mark.parametrize("value, error, got", [(True, ValueError, "bool True"), (np.True_, ValueError, "bool True"),
                                               (None, TypeError, "NoneType None"), (1, TypeError, "int 1"),
                                               (0, TypeError, "int 0"), ("no", TypeError, "str 'no'")])
def test_refused_unsupported_gpt2_flags_name_the_value_given(key, what, value, error, got):
    """scale_attn_by_inverse_layer_idx and add_cross_attention were reported as "=True" for any
    truthy value (1, "no"), and None or 0 was read as false. As transformers' GPT2Config, a value
    that is not a bool is refused (a TypeError naming it); True is not supported (a ValueError).
    False (also numpy's) is read, and kept."""
    small = dict(vocab_size=VOCAB, n_positions=8, n_embd=16, n_layer=1, n_head=2)
    if not isinstance(value, (bool, np.bool_)):  # transformers refuses it too (huggingface_hub's StrictDataclassError)
        with pytest.raises(Exception, match=f"TypeError: Field '{key}' expected bool"):
            transformers.GPT2Config(**{key: value})
    with pytest.raises(error, match=rf"^config\.json: {key}: expected false \({what} is not supported\), "
                                    rf"got {re.escape(got)}$"):
        tc.GPT2LMHeadModel({**small, key: value})
    for ok in (False, np.False_):
        config = tc.GPT2Config.from_dict({**small, key: ok})
        assert config.extra[key] is ok and config.to_dict()[key] is False


@pytest.mark.parametrize("value", [None, 1, "yes"])
def test_refused_reorder_and_upcast_attn_names_the_value_given(value):
    """reorder_and_upcast_attn took any value (None, 1, "yes"), which save_pretrained wrote back and
    transformers' GPT2Config then refuses. It is a bool (numpy's too), else a TypeError naming it."""
    small = dict(vocab_size=VOCAB, n_positions=8, n_embd=16, n_layer=1, n_head=2)
    with pytest.raises(Exception, match="TypeError: Field 'reorder_and_upcast_attn' expected bool"):
        transformers.GPT2Config(reorder_and_upcast_attn=value)
    got = {None: "NoneType None", 1: "int 1", "yes": "str 'yes'"}[value]
    with pytest.raises(TypeError, match=rf"^config\.json: reorder_and_upcast_attn: expected a bool, got "
                                        rf"{re.escape(got)}$"):
        tc.GPT2Config.from_dict({**small, "reorder_and_upcast_attn": value})
    for ok in (True, False, np.True_):
        assert tc.GPT2Config.from_dict({**small, "reorder_and_upcast_attn": ok}).to_dict()["reorder_and_upcast_attn"] == ok


def _hf_gpt2_model_hidden(path, ids):
    hf = transformers.GPT2Model.from_pretrained(path).eval()
    with torch.no_grad():
        return hf(torch.from_numpy(ids)).last_hidden_state.numpy()


def test_gpt2_model_loads_an_untied_checkpoint_as_hf(tmp_path):
    """GPT2Model.from_pretrained refused every tie_word_embeddings=False folder (a restriction of
    the LM head, which GPT2Model does not have). It loads it, ignoring lm_head.weight, as
    transformers' GPT2Model and our LlamaModel do, and gives transformers' hidden states; so does
    load_state_dict of the untied state dict into a GPT2Model of that config."""
    cfg = transformers.GPT2Config(**CFGS["h4"], initializer_range=0.2, eos_token_id=None, bos_token_id=None,
                                  tie_word_embeddings=False)
    torch.manual_seed(6)
    hf_lm = transformers.GPT2LMHeadModel(cfg).eval()
    hf_lm.save_pretrained(tmp_path / "untied")
    ids = _ids(9, (2, 11))
    ours = tc.GPT2Model.from_pretrained(tmp_path / "untied")
    hidden, _ = ours(ids)
    assert_close(hidden, _hf_gpt2_model_hidden(tmp_path / "untied", ids), np.float32, atol_=1e-5,
                 what="untied GPT2Model hidden states")
    assert ours.config.extra["tie_word_embeddings"] is False
    again = tc.GPT2Model(ours.config)
    again.load_state_dict({k: v.numpy() for k, v in hf_lm.state_dict().items()})
    np.testing.assert_array_equal(again(ids)[0], hidden)


def test_gpt2_model_loads_a_sequence_classification_folder_as_hf(tmp_path):
    """GPT2Model.from_pretrained refused a GPT2ForSequenceClassification folder (unknown key
    score.weight), which transformers' GPT2Model and our LlamaModel load without the head; the LM
    still reports it."""
    cfg = transformers.GPT2Config(**CFGS["h4"], initializer_range=0.2, eos_token_id=None, bos_token_id=None,
                                  pad_token_id=0, num_labels=3)
    torch.manual_seed(7)
    transformers.GPT2ForSequenceClassification(cfg).save_pretrained(tmp_path / "seqcls")
    ids = _ids(10, (3, 7))
    hidden, _ = tc.GPT2Model.from_pretrained(tmp_path / "seqcls")(ids)
    assert_close(hidden, _hf_gpt2_model_hidden(tmp_path / "seqcls", ids), np.float32, atol_=1e-5,
                 what="GPT2Model of a sequence-classification folder")
    with pytest.raises(ValueError, match=r"unknown keys: \['score\.weight'\]"):
        tc.GPT2LMHeadModel.from_pretrained(tmp_path / "seqcls")


@pytest.mark.parametrize("cls", ["GPT2Model", "GPT2LMHeadModel"])
def test_from_pretrained_dtype_none_is_float32(gpt2_h4, cls):
    """dtype=None (transformers' and LlamaForCausalLM.from_pretrained's default) was a TypeError
    here: it loads float32, the same model as dtype=np.float32, with transformers' outputs."""
    hf_lm, path, _ = gpt2_h4
    ours = getattr(tc, cls).from_pretrained(path, dtype=None)
    assert ours.dtype == np.float32
    ids = _ids(12, (2, 6))
    if cls == "GPT2Model":
        out, ref = ours(ids)[0], _hf_gpt2_model_hidden(path, ids)
    else:
        out, ref = ours(ids).logits, _hf(hf_lm, ids).logits.numpy()
    assert_close(out, ref, np.float32, atol_=LOGITS_ATOL, what=f"{cls} dtype=None")
    default = getattr(tc, cls).from_pretrained(path, dtype=np.float32)
    for k, v in default.state_dict().items():
        np.testing.assert_array_equal(ours.state_dict()[k], v, err_msg=k)


def test_save_pretrained_writes_numpy_scalars_and_names_values_json_cannot_write(gpt2_h4, tmp_path):
    """A config.extra or generation_config value json cannot write gave json's bare TypeError
    ("Object of type float32 is not JSON serializable"), naming neither the field nor the argument.
    Numpy scalars are written as Python numbers (as the config's own fields), which transformers
    reads back; anything else is a TypeError naming the value, before anything is written."""
    _, path, m = gpt2_h4
    m = tc.GPT2LMHeadModel.from_pretrained(path)
    m.config.extra["summary_first_dropout"] = np.float32(0.25)
    m.config.extra["my_list"] = (np.int64(1), [np.bool_(True)])
    m.generation_config = {"eos_token_id": np.int64(3), "max_length": np.int32(20)}
    m.save_pretrained(tmp_path / "saved")
    hf_cfg = transformers.GPT2Config.from_pretrained(tmp_path / "saved")
    assert hf_cfg.summary_first_dropout == 0.25 and hf_cfg.my_list == [1, [True]]
    gen = transformers.GenerationConfig.from_pretrained(tmp_path / "saved")
    assert gen.eos_token_id == 3 and gen.max_length == 20
    files = sorted(p.name for p in (tmp_path / "saved").iterdir())
    m.config.extra["bad"] = {"inner": np.zeros(2)}
    with pytest.raises(TypeError, match=re.escape("config.extra['bad']['inner']: expected a JSON value (str, int, "
                                                  "float, bool, None, list, dict), got numpy.ndarray")):
        m.save_pretrained(tmp_path / "saved")
    with pytest.raises(TypeError, match=re.escape("config.extra['bad']")):
        m.save_pretrained(tmp_path / "new")
    del m.config.extra["bad"]
    m.generation_config = {"eos_token_id": {3, 4}}
    with pytest.raises(TypeError, match=re.escape("generation_config['eos_token_id']: expected a JSON value (str, "
                                                  "int, float, bool, None, list, dict), got set")):
        m.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == files  # nothing written
    assert transformers.GenerationConfig.from_pretrained(tmp_path / "saved").eos_token_id == 3


# --------------------------------------------------------------------------------------- bad input
def test_bad_input(gpt2_h4):
    hf, path, m = gpt2_h4
    with pytest.raises(ValueError, match="input_ids"):
        m(np.array([[1, VOCAB]]))
    with pytest.raises(ValueError, match="input_ids"):
        m(np.array([[-1, 2]]))
    with pytest.raises(TypeError, match="input_ids"):
        m(np.array([[1.5, 2.0]]))
    with pytest.raises(ValueError, match="n_positions"):
        m(_ids(0, (1, 65)))  # longer than n_positions
    cache = m.new_cache(1)
    m(_ids(0, (1, 60)), past_key_values=cache, use_cache=True)
    length_before = cache.length
    with pytest.raises(ValueError, match="n_positions"):
        m(_ids(1, (1, 5)), past_key_values=cache, use_cache=True)  # 60 + 5 > 64
    assert cache.length == length_before
    with pytest.raises(ValueError, match="attention_mask"):
        m(_ids(0, (2, 5)), attention_mask=np.ones((2, 4), np.int64))
    with pytest.raises(ValueError, match="attention_mask"):
        m(_ids(0, (2, 5)), attention_mask=np.ones((3, 5), np.int64))
    with pytest.raises(ValueError, match="past_key_values"):
        m(_ids(0, (2, 5)), past_key_values=m.new_cache(3))
    with pytest.raises(ValueError, match="past_key_values"):
        m(_ids(0, (1, 2)), past_key_values=((np.zeros((1, 3, 2, 8)), np.zeros((1, 3, 2, 8))),) * 2)
    with pytest.raises(TypeError, match="past_key_values.*float32.*float64"):
        m(_ids(0, (1, 2)), past_key_values=tc.KVCache(2, 1, 4, 8, dtype=np.float64), use_cache=True)
    with pytest.raises(ValueError, match="max_new_tokens"):
        m.generate(_ids(0, (1, 60)), max_new_tokens=6)  # 60 + 6 - 1 > 64
    with pytest.raises(ValueError, match="max_new_tokens"):
        m.generate(_ids(0, (1, 3)), max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        m.generate(_ids(0, (1, 3)), max_new_tokens=2, do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="top_k"):
        m.generate(_ids(0, (1, 3)), max_new_tokens=2, do_sample=True, top_k=-1)
    with pytest.raises(ValueError, match="top_p"):
        m.generate(_ids(0, (1, 3)), max_new_tokens=2, do_sample=True, top_p=1.5)


def test_from_pretrained_draws_no_random_weights(gpt2_h4, monkeypatch):
    """Every weight comes from the checkpoint, so from_pretrained skips the random init; the logits
    are those of a model initialised at random and then loaded, bit for bit."""
    _, path, _ = gpt2_h4

    def no_draw(*args, **kwargs):
        raise AssertionError("from_pretrained drew random weights")

    with monkeypatch.context() as m:
        m.setattr(np.random, "default_rng", no_draw)
        loaded = tc.GPT2LMHeadModel.from_pretrained(path)
    initialised = tc.GPT2LMHeadModel(loaded.config)
    initialised.load_state_dict(loaded.state_dict())
    ids = _ids(3, (2, 9))
    np.testing.assert_array_equal(loaded(ids).logits, initialised(ids).logits)


def test_checkpoint_missing_tensor(gpt2_h4, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, path, _ = gpt2_h4
    tensors = load_file(str(path / "model.safetensors"))
    name = next(k for k in tensors if k.endswith("h.1.mlp.c_fc.weight"))
    del tensors[name]
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(path / "config.json", bad / "config.json")
    with pytest.raises(ValueError, match="h.1.mlp.c_fc.weight"):
        tc.GPT2LMHeadModel.from_pretrained(bad)
    # a mis-shaped tensor is named too
    tensors = load_file(str(path / "model.safetensors"))
    name = next(k for k in tensors if k.endswith("h.0.ln_1.weight"))
    tensors[name] = np.ones(3, np.float32)
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="h.0.ln_1.weight"):
        tc.GPT2LMHeadModel.from_pretrained(bad)
    # unsupported config
    cfg = json.loads((path / "config.json").read_text())
    cfg["activation_function"] = "quick_gelu"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="activation_function"):
        tc.GPT2LMHeadModel.from_pretrained(bad)
    with pytest.raises(FileNotFoundError):
        tc.GPT2LMHeadModel.from_pretrained(tmp_path / "nowhere")


def test_load_state_dict_failure_leaves_state(gpt2_h4):
    hf, path, _ = gpt2_h4
    m = tc.GPT2LMHeadModel.from_pretrained(path)
    before = {k: np.array(v, copy=True) for k, v in m.state_dict().items()}
    sd = {k: v.detach().numpy().copy() for k, v in hf.state_dict().items()}
    sd["transformer.wte.weight"] = np.zeros((VOCAB + 1, 32), np.float32)
    with pytest.raises(ValueError, match="wte.weight"):
        m.load_state_dict(sd)
    after = m.state_dict()
    assert set(after) == set(before)
    assert all(np.array_equal(after[k], before[k]) for k in before)



def test_float64_checkpoint_loads_without_rounding(tmp_path):
    """A float64 checkpoint read with dtype=np.float64 keeps every bit of its weights: they were
    read as float32 first (rounded to 24 bits), so logits drifted ~1e-8 from HF's float64 model."""
    cfg = transformers.GPT2Config(**CFGS["h4"], initializer_range=0.2, eos_token_id=None, bos_token_id=None)
    torch.manual_seed(21)
    hf64 = transformers.GPT2LMHeadModel(cfg).double().eval()
    with torch.no_grad():  # values no float32 holds exactly
        for p in hf64.parameters():
            p.add_(1e-9 * torch.randn_like(p))
    hf64.save_pretrained(tmp_path / "hf64", safe_serialization=True)
    ref_sd = {k: v.numpy() for k, v in hf64.state_dict().items()}
    ids = _ids(12, (2, 9))
    ref = _hf(hf64, ids).logits.numpy()
    m = tc.GPT2LMHeadModel.from_pretrained(tmp_path / "hf64", dtype=np.float64)
    sd = m.state_dict()
    assert any(not np.array_equal(v, v.astype(np.float32)) for v in sd.values())
    for k, v in sd.items():
        assert v.dtype == np.float64 and np.array_equal(v, ref_sd["transformer." + k]), k
    assert_close(m(ids).logits, ref, np.float64, atol_=1e-10, rtol_=1e-12, what="fp64 checkpoint logits")
    # our own float64 save_pretrained round-trips bit for bit
    m.save_pretrained(tmp_path / "ours64")
    back = tc.GPT2LMHeadModel.from_pretrained(tmp_path / "ours64", dtype=np.float64)
    back_sd = back.state_dict()
    assert set(back_sd) == set(sd) and all(np.array_equal(back_sd[k], sd[k]) for k in sd)
    assert_close(back(ids).logits, ref, np.float64, atol_=1e-10, rtol_=1e-12, what="fp64 round-trip logits")
    base = tc.GPT2Model.from_pretrained(tmp_path / "ours64", dtype=np.float64)
    assert all(np.array_equal(v, sd[k]) for k, v in base.state_dict().items())


def test_bfloat16_state_dict_with_lm_head_loads(gpt2_h4):
    """torch's GPT2LMHeadModel in bfloat16: its state dict (lm_head.weight included, tied to wte)
    loads as documented, giving exactly the model loaded from the same weights widened to float32."""
    hf, _, _ = gpt2_h4
    hf16 = transformers.GPT2LMHeadModel(hf.config).eval()
    hf16.load_state_dict(hf.state_dict())
    hf16 = hf16.to(torch.bfloat16)
    sd16 = hf16.state_dict()
    assert sd16["lm_head.weight"].dtype == torch.bfloat16
    m16 = tc.GPT2LMHeadModel(tc.GPT2Config(**CFGS["h4"], eos_token_id=None))
    m16.load_state_dict(sd16)
    m32 = tc.GPT2LMHeadModel(tc.GPT2Config(**CFGS["h4"], eos_token_id=None))
    m32.load_state_dict({k: v.float() for k, v in sd16.items()})
    ids = _ids(13, (2, 9))
    np.testing.assert_array_equal(m16(ids).logits, m32(ids).logits)
    assert_close(m16(ids).logits, _hf(hf16.float(), ids).logits.numpy(), np.float32, atol_=LOGITS_ATOL,
                 what="bf16 weights logits")
    # an untied bfloat16 head is still refused, naming it
    bad = dict(sd16)
    bad["lm_head.weight"] = sd16["lm_head.weight"] + 1
    with pytest.raises(ValueError, match="lm_head.weight"):
        m16.load_state_dict(bad)
    bad["lm_head.weight"] = torch.zeros(sd16["lm_head.weight"].shape, dtype=torch.int64)
    with pytest.raises(TypeError, match="lm_head.weight"):
        m16.load_state_dict(bad)
    np.testing.assert_array_equal(m16(ids).logits, m32(ids).logits)


def test_too_large_logits_to_keep_leaves_the_cache_unchanged(gpt2_h4):
    """logits_to_keep > the input length is refused before the cache is extended (it was checked after
    the decoder ran, leaving the refused tokens in the cache)."""
    _, _, m = gpt2_h4
    ids = _ids(14, (2, 6))
    cache = m.new_cache(2)
    m(ids[:, :3], past_key_values=cache, use_cache=True)
    before = [tuple(np.array(a, copy=True) for a in kv) for kv in cache.to_legacy()]
    with pytest.raises(ValueError, match=r"^logits_to_keep: expected an int in \[0, 2\]"):
        m(ids[:, 3:5], past_key_values=cache, use_cache=True, logits_to_keep=3)
    assert cache.length == 3
    after = cache.to_legacy()
    assert all(np.array_equal(a, b) for kv0, kv1 in zip(before, after) for a, b in zip(kv0, kv1))
    # the cache goes on as if the refused call never happened
    step = m(ids[:, 3:], past_key_values=cache, use_cache=True, logits_to_keep=3)
    assert_close(step.logits, m(ids).logits[:, 3:], np.float32, what="after a refused call")


# ------------------------------------------------------------------ generate: caches, ids, context
def _hf_generate(hf, ids, max_new_tokens, **kw):
    """HF's greedy generate; the all-ones attention_mask keeps HF from masking prompt ids equal to
    pad_token_id."""
    with torch.no_grad():
        return hf.generate(torch.from_numpy(ids), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                           max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=kw.pop("pad_token_id", 0),
                           **kw).numpy()


def test_generate_accepts_legacy_tuple_cache(gpt2):
    """``generate``/``stream`` take what ``forward`` takes: a KVCache or HF's legacy tuple (converted
    as forward converts it, the tuple left unchanged); anything else is a TypeError naming it."""
    hf, _, m = gpt2
    ids = _ids(31, (2, 7))
    ref = _hf_generate(hf, ids, 9)
    legacy = m(ids[:, :4], use_cache=True).past_key_values.to_legacy()
    ours = m.generate(ids, 9, past_key_values=legacy)
    np.testing.assert_array_equal(ours, ref)
    assert all(k.shape[2] == 4 and v.shape[2] == 4 for k, v in legacy)  # not modified
    steps = list(m.stream(ids, 9, past_key_values=list(legacy)))  # a list of pairs too
    np.testing.assert_array_equal(np.stack(steps, axis=1), ref[:, 7:])
    # HF's own legacy tuple (torch tensors) of the prefix
    hf_past = _hf(hf, ids[:, :5], use_cache=True).past_key_values
    hf_legacy = tuple(_hf_layer_kv(hf_past, i) for i in range(hf.config.n_layer))
    np.testing.assert_array_equal(m.generate(ids, 9, past_key_values=hf_legacy), ref)
    for bad in ({"a": 1}, "cache", 3, np.zeros((2, 2))):
        with pytest.raises(TypeError, match="^past_key_values: expected None, a KVCache or .*legacy tuple"):
            m.generate(ids, 2, past_key_values=bad)
        with pytest.raises(TypeError, match="^past_key_values"):
            m.stream(ids, 2, past_key_values=bad)  # refused when called, before the first step
    with pytest.raises(ValueError, match="^past_key_values: the cache holds 7 positions"):
        m.generate(ids, 2, past_key_values=m(ids, use_cache=True).past_key_values.to_legacy())
    with pytest.raises(TypeError, match="^past_key_values: expected a cache of this model's dtype float32"):
        m.generate(ids, 2, past_key_values=tc.KVCache(len(legacy), 2, hf.config.n_head,
                                                      hf.config.n_embd // hf.config.n_head, dtype=np.float64))


def test_generate_checks_pad_and_eos_ids_against_the_vocabulary(gpt2_h4):
    """pad_token_id / eos_token_id outside [0, vocab_size) are refused before the first token
    (the old code streamed the bad pad id, then failed naming input_ids); the last ids of the
    vocabulary work as in HF."""
    hf, _, m = gpt2_h4
    ids = _ids(2, (2, 4))
    greedy = m.generate(ids, max_new_tokens=8)
    eos = int(greedy[0, 6])
    seen = []
    for kw, match in (({"pad_token_id": VOCAB}, rf"^pad_token_id: expected an id in \[0, {VOCAB}\)"),
                      ({"pad_token_id": VOCAB + 5, "eos_token_id": eos}, "^pad_token_id: .* got 106"),
                      ({"eos_token_id": VOCAB}, rf"^eos_token_id: expected an id in \[0, {VOCAB}\)"),
                      ({"eos_token_id": [eos, VOCAB + 1]}, r"^eos_token_id\[1\]: .* got 102"),
                      ({"pad_token_id": -1}, "^pad_token_id"),
                      ({"eos_token_id": -1}, "^eos_token_id")):
        with pytest.raises(ValueError, match=match):
            m.generate(ids, 8, streamer=seen.append, **kw)
        with pytest.raises(ValueError, match=match):
            m.stream(ids, 8, **kw)
    assert seen == []  # nothing was generated
    ours = m.generate(ids, 8, eos_token_id=eos, pad_token_id=VOCAB - 1)
    ref = _hf_generate(hf, ids, 8, eos_token_id=eos, pad_token_id=VOCAB - 1)
    np.testing.assert_array_equal(ours, ref)
    assert (ours[0, 7:] == VOCAB - 1).all()  # the finished row is padded with the last id


@pytest.mark.parametrize("L, new", [(64, 1), (63, 2), (60, 5), (1, 64)])
def test_generate_at_exactly_the_context_limit(gpt2_h4, L, new):
    """The last new token is never fed back: L + new - 1 positions must fit n_positions (64), as in
    HF's generate, which returns 65 ids for a 64-token prompt and one new token."""
    hf, _, m = gpt2_h4
    ids = _ids(L + new, (2, L))
    ref = _hf_generate(hf, ids, new)
    assert ref.shape == (2, L + new)
    np.testing.assert_array_equal(m.generate(ids, new), ref)
    with pytest.raises(ValueError, match=f"^max_new_tokens: prompt length {L} \\+ {new + 1} exceeds the context "
                                         rf"\(n_positions = 64\); at most {new} new tokens fit"):
        m.generate(ids, new + 1)


def test_generate_prompt_longer_than_the_context_names_input_ids(gpt2_h4):
    _, _, m = gpt2_h4
    with pytest.raises(ValueError, match=r"^input_ids: prompt length 65 exceeds the context \(n_positions = 64\)"):
        m.generate(_ids(0, (1, 65)), 1)
    with pytest.raises(ValueError, match="^input_ids: prompt length 65"):
        m.stream(_ids(0, (1, 65)), 1)


def test_generate_tiny_temperature_samples_the_argmax(gpt2_h4):
    """Any finite temperature > 0 is accepted, as HF's TemperatureLogitsWarper: a subnormal one
    (1e-310, 5e-324, which made logits / temperature inf and the probabilities NaN, and were refused
    below a floor of 1e-6) samples the argmax, HF's greedy tokens (HF's own sampling at 1e-7 too);
    only a temperature <= 0 is refused, naming it."""
    hf, _, m = gpt2_h4
    ids = _ids(3, (2, 5))
    greedy = _hf_generate(hf, ids, 6)
    for t in (1e-310, 5e-324, 1e-7, 1e-6):
        ours = m.generate(ids, 6, do_sample=True, temperature=t, seed=0)
        np.testing.assert_array_equal(ours, greedy, err_msg=f"temperature={t}")
    torch.manual_seed(0)
    with torch.no_grad():
        hf_sampled = hf.generate(torch.from_numpy(ids), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                                 max_new_tokens=6, do_sample=True, temperature=1e-7, top_k=0, pad_token_id=0)
    np.testing.assert_array_equal(hf_sampled.numpy(), greedy)
    for t in (0.0, -0.0, -5e-324, -1.0):
        with pytest.raises(ValueError, match=rf"^temperature: expected a finite number > 0 .*, got {re.escape(repr(t))}$"):
            m.generate(ids, 4, do_sample=True, temperature=t)
    # float64 logits so large that scores / T would overflow: still a distribution (the argmax)
    from transformer_core.generation import GenerationConfig, next_tokens

    scores = np.array([[1e300, 0.0, -1e300], [-1e300, 2e300, 1e300]])
    for t in (1e-6, 5e-324):
        cfg = GenerationConfig(1, do_sample=True, temperature=t)
        np.testing.assert_array_equal(next_tokens(scores.copy(), np.zeros((2, 1), np.int64), cfg,
                                                  np.random.default_rng(0)), [0, 1])


# ---------------------------------------------- Seq2SeqTransformer: errors name the argument (src/tgt)
def test_seq2seq_out_of_range_ids_name_src_or_tgt():
    """torch's Seq2SeqTransformer (nn.Embedding) refuses an id out of its table; ours does too, and
    the message names the argument that holds it (it said input_ids)."""
    m = tc.Seq2SeqTransformer(11, 13, d_model=16, nhead=4, num_encoder_layers=1, num_decoder_layers=1,
                              dim_feedforward=24, max_len=20).eval()
    src_emb, tgt_emb = torch.nn.Embedding(11, 16), torch.nn.Embedding(13, 16)
    src, tgt = np.array([[1, 2, 3]]), np.array([[1, 2]])
    for ids, emb in ((np.array([[1, 11]]), src_emb), (np.array([[13, 0]]), tgt_emb)):
        with pytest.raises(IndexError):
            emb(torch.from_numpy(ids))
    cases = [(lambda: m(np.array([[1, 11]]), tgt), r"^src: expected ids in \[0, 11\) \(src_vocab_size\), got 11 "
                                                   r"at \(0, 1\)"),
             (lambda: m(src, np.array([[13, 0]])), r"^tgt: expected ids in \[0, 13\) \(tgt_vocab_size\), got 13 "
                                                   r"at \(0, 0\)"),
             (lambda: m(np.array([[-1]]), tgt[:, :1]), "^src: .* got -1"),
             (lambda: m.encode(np.array([[11]])), "^src: "),
             (lambda: m.greedy_decode(np.array([[11]]), 3, 1), "^src: "),
             (lambda: m.decode(np.array([[13]]), m.encode(src)), "^tgt: "),
             (lambda: m.loss(src, np.array([[1, 99]]), np.array([[1, 2]])), "^tgt: "),
             (lambda: m.decode(tgt, m.encode(src), np.ones((1, 2), bool)), r"^src_key_mask: expected shape \(1, 3\)")]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()


# ------------------------------------------------------- tied head, config fields, too large a batch
def test_tied_head_without_wte_loads_into_wte_as_hf(gpt2_h4):
    """An ``lm_head.weight`` given without ``wte.weight`` (strict=False) is the tied embedding, as in
    torch's GPT2LMHeadModel (one parameter under two names): it loads into wte (it was dropped,
    reported nowhere). Given beside wte it must still equal it; unknown keys keep the names given."""
    hf, path, _ = gpt2_h4
    new_head = torch.from_numpy(np.random.default_rng(3).standard_normal((VOCAB, 32)).astype(np.float32))
    sd = {k: v.clone() for k, v in hf.state_dict().items() if k != "transformer.wte.weight"}
    sd["lm_head.weight"] = new_head
    hf2 = transformers.GPT2LMHeadModel(hf.config).eval()
    hf2.load_state_dict(hf.state_dict())
    r_hf = hf2.load_state_dict(sd, strict=False)
    assert r_hf.unexpected_keys == [] and torch.equal(hf2.transformer.wte.weight, new_head)
    ids = _ids(40, (2, 9))
    for strict in (False, True):  # the weight is given (under its tied name): nothing is missing
        m = tc.GPT2LMHeadModel.from_pretrained(path)
        r = m.load_state_dict({k: v.numpy() for k, v in sd.items()}, strict=strict)
        assert r.missing_keys == [] and r.unexpected_keys == []
        np.testing.assert_array_equal(m.state_dict()["wte.weight"], new_head.numpy())
        assert_close(m(ids).logits, _hf(hf2, ids).logits.numpy(), atol_=LOGITS_ATOL, what="head-loaded logits")
    # the base model too (HF's GPT2Model has no head: ours accepts the tied one)
    base = tc.GPT2Model.from_pretrained(path)
    base.load_state_dict({"lm_head.weight": new_head}, strict=False)
    np.testing.assert_array_equal(base.state_dict()["wte.weight"], new_head.numpy())
    # a head of another shape is named, before anything changes
    m = tc.GPT2LMHeadModel.from_pretrained(path)
    before = m.state_dict()["wte.weight"]
    with pytest.raises(ValueError, match=r"^lm_head.weight: expected shape \(101, 32\)"):
        m.load_state_dict({"lm_head.weight": np.zeros((VOCAB, 31), np.float32)}, strict=False)
    np.testing.assert_array_equal(m.state_dict()["wte.weight"], before)
    # unknown keys are reported as given, as torch reports them ('transformer.extra' was 'extra')
    extras = {"transformer.extra": torch.zeros(1), "score.weight": torch.zeros(2, 32)}
    r_hf = hf2.load_state_dict({**hf.state_dict(), **extras}, strict=False)
    r = m.load_state_dict({k: v.numpy() for k, v in {**hf.state_dict(), **extras}.items()}, strict=False)
    assert r.unexpected_keys == ["transformer.extra", "score.weight"]  # in the order given
    assert sorted(r_hf.unexpected_keys) == sorted(r.unexpected_keys)  # torch: in its modules' order
    with pytest.raises(ValueError, match=r"unknown keys: \['transformer.extra', 'score.weight'\]"):
        m.load_state_dict({k: v.numpy() for k, v in {**hf.state_dict(), **extras}.items()})


@pytest.mark.parametrize("field", ["resid_pdrop", "embd_pdrop", "attn_pdrop"])
def test_config_check_refuses_bad_dropout(field):
    """check() checks every field: the dropout probabilities too (a bad one was accepted by check(),
    from_dict and the constructor, and refused only at the first training loss)."""
    small = dict(vocab_size=11, n_positions=8, n_embd=8, n_layer=1, n_head=2)
    for bad, error in ((2.0, ValueError), (1.0, ValueError), (-0.5, ValueError), ("abc", TypeError),
                       (True, TypeError), (None, TypeError)):
        cfg = tc.GPT2Config(**small, **{field: bad})
        with pytest.raises(error, match=f"^{field}: expected a probability"):
            cfg.check()
        with pytest.raises(error, match=f"^{field}: "):
            tc.GPT2Config.from_dict({**small, field: bad})
        with pytest.raises(error, match=f"^{field}: "):
            tc.GPT2LMHeadModel(cfg)
    assert tc.GPT2Config(**small, **{field: 0.1}).check() is not None  # HF's default is accepted


def test_save_pretrained_keeps_bos_token_id_and_other_keys(tmp_path):
    """save_pretrained's config.json is the one read: bos_token_id (it was dropped, so transformers
    reloaded its default 50256) and the keys GPT2Config has no field for (kept in ``extra``)."""
    hf_cfg = transformers.GPT2Config(**CFGS["h4"], bos_token_id=3, eos_token_id=4, summary_type="mean",
                                     my_key={"a": [1, 2]})
    torch.manual_seed(2)
    transformers.GPT2LMHeadModel(hf_cfg).save_pretrained(tmp_path / "hf")
    m = tc.GPT2LMHeadModel.from_pretrained(tmp_path / "hf")
    assert m.config.bos_token_id == 3 and m.config.extra["my_key"] == {"a": [1, 2]}
    m.save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["bos_token_id"] == 3 and saved["eos_token_id"] == 4 and "transformers_version" not in saved
    ref = transformers.GPT2Config.from_pretrained(tmp_path / "hf").to_dict()
    back = transformers.GPT2Config.from_pretrained(tmp_path / "ours").to_dict()
    assert back["bos_token_id"] == 3
    differ = {k for k in set(ref) | set(back) if ref.get(k) != back.get(k)}
    assert differ <= {"n_ctx", "dtype", "torch_dtype"}, differ  # n_ctx: GPT-2's alias, written as n_positions
    # to_dict / from_dict: the same config; to_dict's copies are not the config's
    cfg = tc.GPT2Config.from_dict(saved)
    assert cfg == m.config and cfg.to_dict() == saved
    cfg.to_dict()["my_key"]["a"].append(3)
    assert cfg.extra["my_key"] == {"a": [1, 2]}
    assert tc.GPT2Config().to_dict()["bos_token_id"] == transformers.GPT2Config().bos_token_id == 50256
    # a negative id is none, as transformers reads it (configs with "pad_token_id": -1 exist)
    cfg = tc.GPT2Config(bos_token_id=-2, pad_token_id=-1, eos_token_id=[4, -1]).check()
    assert (cfg.bos_token_id, cfg.pad_token_id, cfg.eos_token_id) == (None, None, [4])
    with pytest.raises(TypeError, match=r"^eos_token_id\[1\]"):
        tc.GPT2Config(eos_token_id=[4, 1.5]).check()


def test_a_batch_too_large_for_the_kv_cache_names_input_ids():
    """A batch whose KV cache exceeds this machine's memory: the ValueError names input_ids, its
    batch size (and for generate max_new_tokens), raised before the cache is allocated (it named
    KVCache's own arguments: num_layers, batch, num_key_value_heads, head_dim, capacity)."""
    from transformer_core._validation import physical_memory_bytes

    cfg = tc.GPT2Config(vocab_size=11, n_positions=1024, n_embd=64, n_layer=16, n_head=1)
    m = tc.GPT2LMHeadModel(cfg)
    per_position = 2 * cfg.n_layer * cfg.n_embd * 4  # keys and values, float32
    N = 2 * physical_memory_bytes() // per_position  # one position each: twice this machine's memory
    ids = np.broadcast_to(np.array([[1]]), (N, 1))  # the int64 copy is 1/1024 of that
    with pytest.raises(ValueError, match=rf"^input_ids: a batch of {N} sequences of length 1 needs a KV cache too "
                                         r"large for this machine \(.*memory.*\); pass fewer sequences"):
        m(ids)
    with pytest.raises(ValueError, match=rf"^input_ids: a batch of {N} sequences"):
        tc.GPT2Model(cfg)(ids)
    N = 2 * physical_memory_bytes() // (per_position * 1000)
    ids = np.broadcast_to(np.array([[1]]), (N, 1))
    with pytest.raises(ValueError, match=rf"^input_ids: a batch of {N} sequences of prompt length 1 and "
                                         r"max_new_tokens = 1000 \(1000 positions each\) needs a KV cache too large"):
        m.generate(ids, 1000)
    with pytest.raises(ValueError, match=rf"^input_ids: a batch of {N} sequences .* max_new_tokens = 1000"):
        next(m.stream(ids, 1000))
    # a caller's cache that would have to grow past the memory: the same, the cache left as it was
    small = tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=11, n_positions=2**20, n_embd=1, n_layer=1, n_head=1))
    N = 4 * physical_memory_bytes() // (8 * 2**20)  # 8 bytes a position: 2**20 positions twice the memory
    cache = small.new_cache(N)
    with pytest.raises(ValueError, match=rf"^input_ids: a batch of {N} sequences .* max_new_tokens = {2**20} "):
        small.generate(np.broadcast_to(np.array([[1]]), (N, 1)), 2**20, past_key_values=cache)
    assert cache.capacity == 1 and cache.length == 0
    # a forward with a caller's cache too small for the step: it named KVCache's `total`
    N = 2 * physical_memory_bytes() // (per_position * 1000)
    cache = m.new_cache(N)
    with pytest.raises(ValueError, match=rf"^input_ids: a batch of {N} sequences of length 1000 after 0 cached "
                                         r"positions needs a KV cache too large"):
        m(np.broadcast_to(np.array([[1]]), (N, 1000)), past_key_values=cache)
    assert cache.capacity == 1 and cache.length == 0
    # one sequence too long for the cache: a shorter one, not "fewer sequences", is the advice, for
    # a batch of one as of two (and fewer sequences where one fits)
    L = 2 * physical_memory_bytes() // (2 * 1024 * 4)  # keys and values of 1024 layers, 8 KiB a position
    deep = tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=11, n_positions=L, n_embd=1, n_layer=1024, n_head=1))
    for N in (1, 2):
        with pytest.raises(ValueError, match=rf"^input_ids: a batch of {N} sequences of length {L} needs a KV cache "
                                             r"too large for this machine \(.*\); pass a shorter sequence$"):
            deep(np.broadcast_to(np.array([[0]]), (N, L)))
    with pytest.raises(ValueError, match=rf"^input_ids: a batch of 4 sequences of length {L // 3} needs a KV cache "
                                         r"too large for this machine \(.*\); pass fewer sequences at a time$"):
        deep(np.broadcast_to(np.array([[0]]), (4, L // 3)))


def test_positions_from_mask_padding():
    """positions_from_mask: leading padding takes position 0, trailing padding the last real
    token's position (what its docstring now says; it said every padding position was 0)."""
    from transformer_core.decoder import positions_from_mask

    mask = np.array([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 0, 1, 0, 1]], bool)
    np.testing.assert_array_equal(positions_from_mask(mask, 0), [[0, 1, 2, 2, 2], [0, 0, 0, 1, 2], [0, 0, 1, 1, 2]])
    np.testing.assert_array_equal(positions_from_mask(mask, 3), [[2, 2], [1, 2], [1, 2]])
    doc = " ".join(positions_from_mask.__doc__.split())
    assert "trailing padding repeats the last real position" in doc


@pytest.mark.parametrize("field, value, error", [("n_embd", "32", "n_embd"), ("resid_pdrop", 2.0, "resid_pdrop"),
                                                 ("n_head", 5, "n_embd: expected a multiple of n_head")])
def test_bad_config_field_names_the_file(gpt2_h4, tmp_path, field, value, error):
    """A config.json field of the wrong type or out of range: a ValueError naming the file (it named
    only the field, so the CLI's one line did not say which file is wrong), raised before loading."""
    import shutil

    _, path, _ = gpt2_h4
    d = tmp_path / "gpt2"
    shutil.copytree(path, d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(ValueError, match=f"^{re.escape(str(d / 'config.json'))}: {error}"):
        tc.GPT2LMHeadModel.from_pretrained(d)


def test_config_of_another_model_type_is_refused(gpt2_h4, tmp_path):
    """model_type is checked, as Llama's and BERT's configs check theirs: a Llama config.json was
    read as GPT-2's defaults (n_layer 12), silently. Accepted: "gpt2", the only model_type of
    Hugging Face's GPT2Config, and a config without one, read as transformers reads it."""
    _, path, _ = gpt2_h4
    assert transformers.GPT2Config.model_type == "gpt2"
    for model_type in ["llama", "bert", None, "GPT2"]:
        with pytest.raises(ValueError, match=rf"^config\.json: model_type {re.escape(repr(model_type))} is not "
                                             r"supported here \(expected 'gpt2'\)$"):
            tc.GPT2Config.from_dict({"model_type": model_type, "hidden_size": 16, "num_hidden_layers": 1})
    fields = ["vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function",
              "layer_norm_epsilon", "eos_token_id", "bos_token_id"]
    for given in [CFGS["h1_inner"], {**CFGS["h1_inner"], "model_type": "gpt2"}]:
        ours, theirs = tc.GPT2Config.from_dict(given), transformers.GPT2Config(**given)
        assert [getattr(ours, f) for f in fields] == [getattr(theirs, f) for f in fields]
    d = tmp_path / "llama_typed"
    shutil.copytree(path, d)
    config = json.loads((d / "config.json").read_text())
    assert config["model_type"] == "gpt2"  # what transformers writes
    (d / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(d / 'config.json'))}: model_type 'llama' is not "
                                         r"supported here \(expected 'gpt2'\)"):
        tc.GPT2LMHeadModel.from_pretrained(d)


@pytest.mark.parametrize("where", ["a_file", "under_a_file"])
def test_save_pretrained_into_a_file_names_directory(gpt2_h4, tmp_path, where):
    """save_pretrained to a path that is a file, or lies under one: a NotADirectoryError naming
    ``directory`` (it was mkdir's bare FileExistsError / NotADirectoryError); nothing is written."""
    import errno

    _, _, ours = gpt2_h4
    blocker = tmp_path / "afile"
    blocker.write_bytes(b"x")
    directory = blocker if where == "a_file" else blocker / "model"
    got = "a file" if where == "a_file" else rf"a path under {re.escape(str(blocker))}, which is a file"
    with pytest.raises(NotADirectoryError, match=rf"directory: expected a folder \(or a path where one can be "
                                                 rf"made\), got {got} \(nothing written\)") as info:
        ours.save_pretrained(directory)
    assert info.value.errno == errno.ENOTDIR and info.value.filename == str(directory)
    assert [p.name for p in tmp_path.iterdir()] == ["afile"] and blocker.read_bytes() == b"x"
    ours.save_pretrained(tmp_path / "ok")  # a folder: saved, and it loads back the same
    back = tc.GPT2LMHeadModel.from_pretrained(tmp_path / "ok")
    for k, v in ours.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[k], v, err_msg=k)


@pytest.mark.parametrize("change, problem", [
    (lambda t: t.pop("transformer.h.1.mlp.c_fc.weight"), r"missing keys: \['h\.1\.mlp\.c_fc\.weight'\]"),
    (lambda t: t.update({"transformer.h.0.extra.weight": np.zeros(3, np.float32)}),
     r"unknown keys: \['transformer\.h\.0\.extra\.weight'\]"),
    (lambda t: t.update({"transformer.h.0.ln_1.weight": np.ones(3, np.float32)}),
     r"mis-shaped: \['h\.0\.ln_1\.weight: expected \(32,\), got \(3,\)'\]"),
], ids=["missing", "unknown", "mis-shaped"])
def test_weights_that_do_not_fit_name_model_safetensors(gpt2_h4, tmp_path, change, problem):
    """A missing, unknown or mis-shaped tensor was "GPT2LMHeadModel.load_state_dict refused (module
    unchanged): ...": no file named, and a module promised that the caller never gets. Now the
    error names model.safetensors, with load_state_dict's error as its cause."""
    from safetensors.numpy import load_file, save_file

    _, path, _ = gpt2_h4
    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    shutil.copy(path / "config.json", tmp_path / "config.json")
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError) as info:
        tc.GPT2LMHeadModel.from_pretrained(tmp_path)
    prefix = f"{tmp_path / 'model.safetensors'}: the weights do not fit the GPT2LMHeadModel that config.json describes: "
    assert re.fullmatch(re.escape(prefix) + problem, str(info.value)), str(info.value)
    assert isinstance(info.value.__cause__, ValueError) and "load_state_dict refused" in str(info.value.__cause__)


def test_config_read_through_hugging_faces_generic_names(tmp_path):
    """transformers' GPT2Config reads num_attention_heads (and hidden_size, num_hidden_layers,
    max_position_embeddings) as n_head (...): a config.json written so loaded here with the default
    12 heads, silently (the weights' shapes do not show the head count; logits 0.17 apart), and a
    save then wrote both names with two values. Read as transformers reads them; two values refused."""
    cfg = transformers.GPT2Config(**CFGS["h4"], initializer_range=0.2, eos_token_id=None, bos_token_id=None)
    torch.manual_seed(5)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    raw = json.loads((tmp_path / "config.json").read_text())
    generic = {"n_head": "num_attention_heads", "n_embd": "hidden_size", "n_layer": "num_hidden_layers",
               "n_positions": "max_position_embeddings"}
    for field, alias in generic.items():
        raw[alias] = raw.pop(field)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert transformers.GPT2Config.from_pretrained(tmp_path).n_head == 4
    ours = tc.GPT2LMHeadModel.from_pretrained(tmp_path)
    assert (ours.config.n_head, ours.config.n_embd, ours.config.n_layer, ours.config.n_positions) == (4, 32, 2, 64)
    assert not set(generic.values()) & set(ours.config.extra)
    ids = np.arange(12).reshape(2, 6) % VOCAB
    with torch.no_grad():
        expected = hf(torch.from_numpy(ids)).logits.numpy()
    assert np.abs(ours(ids).logits - expected).max() < LOGITS_ATOL
    ours.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert saved["n_head"] == 4 and not set(generic.values()) & set(saved)
    with pytest.raises(ValueError, match=r"^config.json: num_attention_heads=8 and n_head=4 disagree"):
        tc.GPT2Config.from_dict({**CFGS["h4"], "num_attention_heads": 8})
    assert tc.GPT2Config.from_dict({**CFGS["h4"], "num_attention_heads": 4}).n_head == 4
    # a bad value given under the generic name is named so; a generic name kept in extra (which a save
    # would write beside the field, and transformers read instead) is refused before anything is written
    with pytest.raises(TypeError, match=r"^num_attention_heads \(read as n_head: expected an int"):
        tc.GPT2Config.from_dict({**{k: v for k, v in CFGS["h4"].items() if k != "n_head"}, "num_attention_heads": 4.5})
    config = tc.GPT2Config(**CFGS["h4"], extra={"num_attention_heads": 8})
    with pytest.raises(ValueError, match=r"^extra: 'num_attention_heads' is transformers' name of 'n_head'"):
        config.check()
    with pytest.raises(ValueError, match=r"extra: 'num_attention_heads'"):
        tc.GPT2LMHeadModel(config).save_pretrained(tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_reorder_and_upcast_attn_loads_as_transformers_computes_it(tmp_path):
    """reorder_and_upcast_attn moves the scaling and upcasts under mixed precision: transformers'
    float32 logits with it are those without it. It was refused; it loads, the logits transformers'."""
    cfg = transformers.GPT2Config(**CFGS["h4"], initializer_range=0.2, eos_token_id=None, bos_token_id=None,
                                  reorder_and_upcast_attn=True, attn_implementation="eager")
    torch.manual_seed(6)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ours = tc.GPT2LMHeadModel.from_pretrained(tmp_path)
    ids = np.arange(12).reshape(2, 6) % VOCAB
    with torch.no_grad():
        expected = hf(torch.from_numpy(ids)).logits.numpy()
    assert np.abs(ours(ids).logits - expected).max() < LOGITS_ATOL


def test_n_inner_0_is_saved_as_null_and_transformers_loads_it(tmp_path):
    """``n_inner=0`` is the default here (4 · n_embd), as None; Hugging Face reads only null so, and
    0 as a width of 0: the config was saved with ``n_inner: 0`` and transformers refused the
    folder. Now it is written as null, and transformers' logits match ours."""
    cfg = tc.GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=1, n_head=2, n_inner=0,
                        bos_token_id=None, eos_token_id=None)
    ours = tc.GPT2LMHeadModel(cfg)
    ours.save_pretrained(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["n_inner"] is None
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "m").eval()
    assert hf.transformer.h[0].mlp.c_fc.weight.shape == (16, 64)
    ids = np.array([[1, 5, 9, 3]])
    with torch.no_grad():
        want = hf(torch.tensor(ids)).logits.numpy()
    assert_close(ours(ids).logits, want, atol_=LOGITS_ATOL)


@pytest.mark.parametrize("key, value, error", [("scale_attn_weights", False, ValueError),
                                               ("add_cross_attention", True, ValueError),
                                               ("scale_attn_by_inverse_layer_idx", 1, TypeError)])
def test_unsupported_options_in_a_config_built_here_are_refused(key, value, error):
    """A GPT2Config built (or its extra edited) here kept these options and the model computed plain
    scaled attention (logits 0.23 from transformers'); saved, this package refused the folder."""
    config = tc.GPT2Config(n_embd=32, n_head=4, n_layer=1, vocab_size=50, n_positions=16, extra={key: value})
    with pytest.raises(error, match=rf"^extra\['{key}'\]: expected (true|false) "):
        tc.GPT2LMHeadModel(config)
