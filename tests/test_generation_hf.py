"""Decoding and the decoder's forward against Hugging Face's on the same arguments: small random
GPT-2 and Llama models saved by transformers and loaded from the checkpoint.

``forward(ids, attention_mask=...)`` gives Hugging Face's forward logits (positions ``past ..
past + L - 1`` whatever the mask), ``generate`` its ``generate``'s tokens (positions counted over
the real tokens), explicit ``eos_token_id=None`` / ``pad_token_id=None`` mean what they mean there,
the sampling options take Hugging Face's ranges, ``KVCache.crop`` takes transformers 5's negative
argument, and the fields of a ``generation_config.json`` that are not applied are named in a
warning.
"""
from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import assert_close
from transformer_core.decoder import positions_from_mask
from transformer_core.generation import GenerationConfig, next_tokens

transformers = pytest.importorskip("transformers")
from transformers.generation.logits_process import (  # noqa: E402
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)


def _save(family: str, path) -> None:
    """A small random model of ``family`` saved by transformers in ``path`` (end id 1, no pad id)."""
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=0,
                                      eos_token_id=1, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
                                      initializer_range=0.3, attn_implementation="eager")
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                       bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
                                       initializer_range=0.3, attn_implementation="eager")
        model = transformers.LlamaForCausalLM(cfg)
    model.eval().save_pretrained(path, safe_serialization=True)


def _load(path):
    """(Hugging Face's model, ours) from a directory."""
    hf_class = transformers.GPT2LMHeadModel if "gpt2" in path.name else transformers.LlamaForCausalLM
    ours_class = tc.GPT2LMHeadModel if "gpt2" in path.name else tc.LlamaForCausalLM
    return hf_class.from_pretrained(path).eval(), ours_class.from_pretrained(path)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """family -> the directory of its saved model (tests copy it to change generation_config.json)."""
    out = {}
    for family in ("gpt2", "llama"):
        out[family] = tmp_path_factory.mktemp(family) / family
        _save(family, out[family])
    return out


@pytest.fixture(scope="module")
def models(dirs):
    """family -> (Hugging Face's model, ours)."""
    return {family: _load(path) for family, path in dirs.items()}


def _copy_with(dirs, family, tmp_path, generation: dict):
    """(hf, ours) from a copy of the family's directory whose generation_config.json is ``generation``."""
    path = tmp_path / family
    shutil.copytree(dirs[family], path)
    (path / "generation_config.json").write_text(json.dumps(generation))
    return _load(path)


def _hf_generate(hf, ids, new, **kw) -> np.ndarray:
    kw = {k: torch.from_numpy(np.asarray(v)) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    kw.setdefault("do_sample", False)
    with torch.no_grad():
        return hf.generate(torch.from_numpy(ids), max_new_tokens=new, **kw).numpy()


def _warned(call) -> tuple[object, list]:
    """``call()``'s result and the UserWarnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return result, [w for w in caught if issubclass(w.category, UserWarning)]


def _padded(rng, vocab, lengths, width, pad=3):
    """Prompts of ``lengths`` left-padded with ``pad`` to ``width``: ``(ids, mask)`` int64."""
    ids = np.full((len(lengths), width), pad, np.int64)
    mask = np.zeros((len(lengths), width), np.int64)
    for r, n in enumerate(lengths):
        ids[r, width - n:] = rng.integers(4, vocab, size=n)
        mask[r, width - n:] = 1
    return ids, mask


# --------------------------------------------------------------------- forward: Hugging Face's positions
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_forward_with_a_padded_mask_gives_hf_forward_logits(models, family):
    """forward(ids, attention_mask=mask) without position_ids counted the positions over the mask's
    real tokens (cumsum(mask) - 1): at the real tokens of a padded row, logits O(1) away from
    Hugging Face's forward for the same arguments, which takes past .. past + L - 1 whatever the
    mask. Now the same positions as Hugging Face's, with and without a cache, and the same loss;
    positions_from_mask passed as position_ids gives Hugging Face's with its generate's positions."""
    hf, ours = models[family]
    V = hf.config.vocab_size
    rng = np.random.default_rng(0)
    ids = rng.integers(0, V, size=(4, 9)).astype(np.int64)
    mask = np.ones((4, 9), np.int64)
    mask[0, :3] = 0  # left padding
    mask[1, :1] = mask[1, 5] = 0  # left padding and a gap
    mask[2, 7:] = 0  # right padding
    real = mask == 1
    # the labels predicted from a real position (a leading pad attends to nothing: zeros here, an
    # average of the masked values there, whatever the positions)
    labels = np.where(real & np.roll(real, 1, axis=1), ids, -100)
    labels[:, 0] = -100
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
        ref_loss = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                      labels=torch.from_numpy(labels)).loss.item()
        counted = positions_from_mask(mask, 0)
        ref_counted = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                         position_ids=torch.from_numpy(counted)).logits.numpy()
    got = ours(ids, attention_mask=mask).logits
    assert_close(got[real], ref[real], np.float32, what=f"{family}: forward with a padded mask")
    assert abs(ours.loss(ids, labels, attention_mask=mask) - ref_loss) < 1e-5
    # the same with a cache: a prefix of 4, then the rest (the mask spans past + new)
    cache = ours.new_cache(4)
    ours(ids[:, :4], attention_mask=mask[:, :4], past_key_values=cache)
    rest = ours(ids[:, 4:], attention_mask=mask, past_key_values=cache).logits
    assert_close(rest[real[:, 4:]], ref[:, 4:][real[:, 4:]], np.float32, what=f"{family}: with a cache")
    # positions counted over the real tokens, passed explicitly: Hugging Face's with the same ids
    got_counted = ours(ids, attention_mask=mask, position_ids=counted).logits
    assert_close(got_counted[real], ref_counted[real], np.float32, what=f"{family}: positions_from_mask")
    assert np.abs(got_counted[real] - got[real]).max() > 1e-2  # the positions matter: the test can tell


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_batched_left_padded_generate_equals_hf(models, family):
    """generate counts the positions over the real tokens itself (position_ids, as Hugging Face's
    generate): a left-padded batch gives Hugging Face's tokens and each prompt's tokens alone; so
    does a cache filled beforehand with those positions."""
    hf, ours = models[family]
    rng = np.random.default_rng(1)
    ids, mask = _padded(rng, hf.config.vocab_size, [5, 2, 7, 3], 7)
    ref = _hf_generate(hf, ids, 8, attention_mask=mask, pad_token_id=3, eos_token_id=None)
    got = ours.generate(ids, 8, attention_mask=mask, pad_token_id=3, eos_token_id=None)
    np.testing.assert_array_equal(got, ref)
    for r, n in enumerate([5, 2, 7, 3]):
        np.testing.assert_array_equal(got[r, 7:], ours.generate(ids[r:r + 1, 7 - n:], 8, eos_token_id=None)[0, n:])
    streamed = np.stack(list(ours.stream(ids, 8, attention_mask=mask, pad_token_id=3, eos_token_id=None)), 1)
    np.testing.assert_array_equal(streamed, ref[:, 7:])
    # the inferred mask (pad id 3 in the prompt, not an end id)
    np.testing.assert_array_equal(ours.generate(ids, 8, pad_token_id=3, eos_token_id=None), ref)
    # a cache holding a prefix: filled with the positions generate would give it
    cache = ours.new_cache(4)
    ours(ids[:, :4], attention_mask=mask[:, :4], position_ids=positions_from_mask(mask[:, :4], 0),
         past_key_values=cache)
    np.testing.assert_array_equal(ours.generate(ids, 8, attention_mask=mask, pad_token_id=3, eos_token_id=None,
                                                past_key_values=cache), ref)


# ------------------------------------------------------------- generation_config.json fields not applied
def test_generation_config_fields_not_applied_are_named_in_a_warning(dirs, tmp_path):
    """A generation_config.json's no_repeat_ngram_size and min_new_tokens (and the other fields that
    change Hugging Face's tokens) were silently ignored: other tokens than transformers' generate
    without a word. They are still not applied, but a UserWarning pointing at the caller's line
    names each (generate and stream); fields at their neutral values warn about nothing, the
    sampling warpers' only when sampling."""
    hf, ours = _copy_with(dirs, "gpt2", tmp_path / "a", {"no_repeat_ngram_size": 1, "min_new_tokens": 5,
                                                          "eos_token_id": 1, "pad_token_id": 3})
    x = np.array([[5, 7, 9]])
    got, caught = _warned(lambda: ours.generate(x, 8))
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith("generation_config.json: no_repeat_ngram_size=1, min_new_tokens=5 are not applied"), \
        message
    assert caught[0].filename == __file__
    # the tokens: transformers' without those two fields, not transformers' with them
    np.testing.assert_array_equal(got, _hf_generate(hf, x, 8, no_repeat_ngram_size=0, min_new_tokens=0))
    assert not np.array_equal(got, _hf_generate(hf, x, 8))  # transformers applies them
    _, caught = _warned(lambda: list(ours.stream(x, 8)))
    assert len(caught) == 1 and "no_repeat_ngram_size=1" in str(caught[0].message)
    assert caught[0].filename == __file__
    # with warnings as errors, the call is refused before the caller's cache grows
    cache = ours.new_cache(1, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="^generation_config.json: no_repeat_ngram_size=1"):
            ours.generate(x, 8, past_key_values=cache)
    assert (cache.length, cache.capacity) == (0, 1)

    neutral = {"no_repeat_ngram_size": 0, "num_beams": 1, "min_length": 0, "typical_p": 1.0, "epsilon_cutoff": 0.0,
               "guidance_scale": 1.0, "renormalize_logits": True, "suppress_tokens": [], "min_p": None,
               "length_penalty": 2.0, "max_length": 5, "do_sample": True, "top_k": 0}
    _, ours = _copy_with(dirs, "gpt2", tmp_path / "b", neutral)
    assert _warned(lambda: ours.generate(x, 4, seed=0))[1] == []
    _, ours = _copy_with(dirs, "gpt2", tmp_path / "c", {"min_p": 0.1, "num_beams": 2, "bad_words_ids": [[5]]})
    _, caught = _warned(lambda: ours.generate(x, 4))  # greedy: min_p, a sampling warper, would not act
    assert [str(w.message).split(" are not")[0] for w in caught] == [
        "generation_config.json: num_beams=2, bad_words_ids=[[5]]"]
    _, caught = _warned(lambda: ours.generate(x, 4, do_sample=True, seed=0))
    assert [str(w.message).split(" are not")[0] for w in caught] == [
        "generation_config.json: min_p=0.1, num_beams=2, bad_words_ids=[[5]]"]


# ------------------------------------------------------------------------------- explicit None ids
def test_explicit_none_end_and_pad_ids_mean_what_they_mean_in_hf(dirs, tmp_path):
    """eos_token_id=None / pad_token_id=None passed meant "the model's"; Hugging Face's generate
    takes them as values: no end id, and a pad id that falls to the first end id (its
    _prepare_special_tokens). Not passed, they are still the model's."""
    hf, ours = _copy_with(dirs, "gpt2", tmp_path, {"eos_token_id": 1, "pad_token_id": 0})
    x = np.array([[5, 7, 9], [11, 13, 15]])
    free = ours.generate(x, 8, eos_token_id=None)
    stop = int(free[0, 4])  # row 0's 2nd new token: an end id that finishes row 0 early
    assert stop not in free[1, 3:].tolist()
    mask = np.ones_like(x)
    cases = [dict(eos_token_id=None), dict(eos_token_id=None, pad_token_id=None), dict(eos_token_id=stop),
             dict(eos_token_id=stop, pad_token_id=None), dict(eos_token_id=[stop, 96], pad_token_id=None), {}]
    for kw in cases:
        ref = _hf_generate(hf, x, 8, attention_mask=mask, **kw)
        np.testing.assert_array_equal(ours.generate(x, 8, **kw), ref, err_msg=str(kw))
    assert ours.generate(x, 8, eos_token_id=None).shape == (2, 11)  # the model's end id 1 does not stop it
    assert (ours.generate(x, 8, eos_token_id=stop, pad_token_id=None)[0, 5:] == stop).all()  # padded with it
    # the inferred mask: pad id 0 in the prompt masks it; pad_token_id=None then leaves the first end id,
    # which infers nothing (as transformers)
    y = np.array([[0, 0, 5, 7, 9], [11, 13, 15, 17, 19]])
    for kw in ({}, {"pad_token_id": None}, {"eos_token_id": None}, {"eos_token_id": None, "pad_token_id": None}):
        np.testing.assert_array_equal(ours.generate(y, 6, **kw), _hf_generate(hf, y, 6, **kw), err_msg=str(kw))
    assert not np.array_equal(ours.generate(y, 6, pad_token_id=None), ours.generate(y, 6))


# ------------------------------------------------------------------------------- option ranges
class _Recorder:
    """Stands in for ``np.random.Generator``: keeps each row's sampling distribution."""

    def __init__(self):
        self.probs = []

    def choice(self, n, p):
        self.probs.append(np.array(p, copy=True))
        return int(np.argmax(p))


def _sampled(scores, sequences=None, **options) -> np.ndarray:
    options.setdefault("top_k", None)
    rec = _Recorder()
    seqs = np.zeros((len(scores), 1), np.int64) if sequences is None else sequences
    next_tokens(np.array(scores, np.float64), seqs, GenerationConfig(1, do_sample=True, **options), rec)
    return np.stack(rec.probs)


def test_any_positive_temperature_top_p_0_and_any_positive_penalty_as_hf():
    """temperature and repetition_penalty below 1e-6 and top_p=0 were refused ("smaller ones
    overflow logits / temperature": untrue, the row maximum is subtracted first). Hugging Face's
    warpers take any temperature > 0, top_p in [0, 1] and any penalty > 0: the same distributions
    now, a subnormal temperature included; a penalty that would overflow a score saturates (finite
    probabilities, that token first)."""
    rng = np.random.default_rng(3)
    scores = rng.normal(size=(4, 30)) * 5
    scores[1, [3, 8]] = scores[1].max() + 1.0  # two tied maxima
    scores[2, 5] = -np.inf  # a masked token
    s = torch.from_numpy(scores)
    for t in (1e-300, 1e-7, 0.3, 1e6):
        ref = torch.softmax(TemperatureLogitsWarper(t)(None, s.clone()), -1).numpy()
        np.testing.assert_allclose(_sampled(scores, temperature=t), ref, rtol=1e-12, atol=1e-15, err_msg=str(t))
    # the smallest subnormal: Hugging Face's max / t is inf there (NaN probabilities); ours is the limit
    np.testing.assert_array_equal(_sampled(scores, temperature=5e-324), _sampled(scores, temperature=1e-300))
    untied = scores.copy()
    untied[1, 8] -= 0.5  # of tied top tokens, top_p=0 keeps one: which one is unspecified in HF (torch.sort)
    ref = torch.softmax(TopPLogitsWarper(0.0)(None, torch.from_numpy(untied)), -1).numpy()
    got = _sampled(untied, top_p=0.0)
    np.testing.assert_array_equal((got > 0).sum(axis=1), [1, 1, 1, 1])
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-15)
    seqs = rng.integers(0, 30, size=(4, 12))
    for penalty in (1e-300, 1e-7, 0.5, 3.0, 1e300):
        ref_scores = RepetitionPenaltyLogitsProcessor(penalty)(torch.from_numpy(seqs), s.clone())
        np.testing.assert_allclose(_sampled(scores, seqs, repetition_penalty=penalty),
                                   torch.softmax(ref_scores, -1).numpy(), rtol=1e-12, atol=1e-15, err_msg=str(penalty))
        greedy = next_tokens(scores.copy(), seqs, GenerationConfig(1, repetition_penalty=penalty),
                             np.random.default_rng(0))
        np.testing.assert_array_equal(greedy, ref_scores.argmax(-1).numpy())
    # a float32 logit of 3e38, repeated, with a penalty of 1e-300: saturates, where HF's score is inf
    big = np.zeros((1, 4))
    big[0, 2] = 3e38
    probs = _sampled(big, np.array([[2]]), repetition_penalty=1e-300)
    np.testing.assert_array_equal(probs, [[0.0, 0.0, 1.0, 0.0]])


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_tiny_temperature_and_top_p_0_generate_as_hf(models, family):
    """Sampling with temperature 1e-7 or top_p=0 keeps the top token only: Hugging Face's generate
    gives the greedy tokens there, and so does ours (they were refused); so does a temperature of
    1e-300 (Hugging Face's float32 logits divided by it are inf)."""
    hf, ours = models[family]
    x = np.array([[5, 7, 9, 11]])
    greedy = ours.generate(x, 6, eos_token_id=None)
    for kw in (dict(temperature=1e-7), dict(top_p=0.0)):
        ref = _hf_generate(hf, x, 6, do_sample=True, eos_token_id=None, pad_token_id=3, **kw)
        np.testing.assert_array_equal(ref, greedy, err_msg=str(kw))
        np.testing.assert_array_equal(ours.generate(x, 6, do_sample=True, seed=0, eos_token_id=None, **kw), ref,
                                      err_msg=str(kw))
    np.testing.assert_array_equal(ours.generate(x, 6, do_sample=True, temperature=1e-300, top_k=None, seed=0,
                                                eos_token_id=None), greedy)


# ------------------------------------------------------------------------------- KVCache.crop
def test_kv_cache_crop_takes_transformers_negative_argument(models):
    """crop(-n) was refused ("expected an int in [0, 2**63 - 1]"); transformers 5's crop(-n) and 4.x's
    crop(max_length=-n) remove the last n positions: so does ours now, the same keys as transformers'
    DynamicCache left. crop(n >= 0) still keeps n (4.x's max_length), so crop(0) empties it, where
    transformers 5's crop(0) is a no-op; more positions than the cache holds are refused."""
    hf, ours = models["llama"]
    ids = np.arange(4, 14)[None]
    cache = ours.new_cache(1)
    ours(ids, past_key_values=cache)
    hc = transformers.DynamicCache(config=hf.config)
    with torch.no_grad():
        hf(torch.from_numpy(ids), past_key_values=hc, use_cache=True)
    capacity = cache.capacity
    cache.crop(-2)
    hc.crop(-2)
    assert cache.length == hc.get_seq_length() == 8 and cache.capacity == capacity
    for layer, (k, v) in enumerate(cache.to_legacy()):
        assert_close(k, hc.layers[layer].keys.numpy(), np.float32, what=f"layer {layer} keys")
        assert_close(v, hc.layers[layer].values.numpy(), np.float32, what=f"layer {layer} values")
    out = ours(ids[:, 8:], past_key_values=cache).logits  # continues as if never cut
    assert_close(out, ours(ids).logits[:, 8:], np.float32, what="after crop(-2)")
    cache.crop(-10)
    assert cache.length == 0
    ours(ids, past_key_values=cache)
    cache.crop(7)
    assert cache.length == 7
    with pytest.raises(ValueError, match=r"^length: expected an int in \[-7, 7\] \(>= 0: the positions kept; < 0: "
                                         r"minus the positions removed; the cache holds 7\), got -8$"):
        cache.crop(-8)
    with pytest.raises(ValueError, match=r"^length: expected an int in \[-7, 7\] .* got 8$"):
        cache.crop(8)
    with pytest.raises(TypeError, match="^length: expected an int"):
        cache.crop(-1.0)
    assert cache.length == 7
    cache.crop(0)
    assert cache.length == 0  # here: keeps 0 positions; transformers 5's crop(0) removes none


# ------------------------------------------------------------------------------- rows without a token
def test_mask_row_without_a_real_token_is_refused_naming_the_row(models):
    """A row of 0s in attention_mask (or, inferred, of pad ids only) was generated from a pad
    attending to nothing: an arbitrary token, different between transformers' GPT-2 and Llama.
    Refused now by generate and stream, naming the mask and the row, before the cache grows."""
    _, ours = models["gpt2"]
    x = np.array([[5, 7, 9], [4, 6, 8]])
    cache = ours.new_cache(2, 1)
    for call in (ours.generate, ours.stream):
        with pytest.raises(ValueError, match=r"^attention_mask: expected at least one real token in each row, "
                                             r"got row 1 of 0s only"):
            call(x, 3, attention_mask=np.array([[0, 1, 1], [0, 0, 0]]), past_key_values=cache)
        with pytest.raises(ValueError, match=r"^attention_mask: .* got row 0 of 0s only"):
            call(x[0], 3, attention_mask=np.zeros(3))
        with pytest.raises(ValueError, match=r"^input_ids: without attention_mask, the mask is input_ids != "
                                             r"pad_token_id \(3\).* got row 0 of pad ids \(3\) only"):
            call(np.array([[3, 3, 3], [4, 6, 8]]), 3, pad_token_id=3)
    assert (cache.length, cache.capacity) == (0, 1)


# ------------------------------------------------------------------------------- manual_seed
def test_manual_seed_seeds_sampling_without_a_seed(models):
    """seed=None drew fresh OS entropy: tc.manual_seed (torch's manual_seed) did not make sampling
    repeat. It now draws the seed from manual_seed's generator: the same seed, the same tokens
    (generate and stream); the generator advances with each sampling call, get_rng_state /
    set_rng_state restore it, and greedy calls or an explicit seed draw nothing from it."""
    _, ours = models["gpt2"]
    x = np.array([[5, 7], [9, 11]])

    def sample():
        return ours.generate(x, 8, do_sample=True, top_k=None, eos_token_id=None)

    tc.manual_seed(0)
    first, second = sample(), sample()
    assert not np.array_equal(first, second)  # the generator advanced
    tc.manual_seed(0)
    np.testing.assert_array_equal(sample(), first)
    state = tc.get_rng_state()
    np.testing.assert_array_equal(sample(), second)
    tc.set_rng_state(state)
    np.testing.assert_array_equal(sample(), second)
    tc.manual_seed(0)
    ours.generate(x, 8, eos_token_id=None)  # greedy
    ours.generate(x, 8, do_sample=True, seed=5, eos_token_id=None)
    streamed = np.stack(list(ours.stream(x, 8, do_sample=True, top_k=None, eos_token_id=None)), 1)
    np.testing.assert_array_equal(streamed, first[:, 2:])
    tc.manual_seed(1)
    assert not np.array_equal(sample(), first)


def test_sampling_before_any_manual_seed_draws_fresh_entropy(models, monkeypatch):
    """The package's generator starts at a fixed seed (the training forwards' dropout), so drawing
    the sampling seed from it before any manual_seed gave every process the same "random" reply.
    Until the program seeds it, seed=None draws fresh entropy, as torch's default generator, and
    leaves the generator where it was; a call refused for its cache draws no seed at all."""
    from transformer_core import module

    _, ours = models["gpt2"]
    x = np.array([[5, 7]])
    monkeypatch.setattr(module, "_SEEDED", False)
    state = tc.get_rng_state()
    replies = {tuple(ours.generate(x, 12, do_sample=True, top_k=None, eos_token_id=None)[0]) for _ in range(4)}
    assert len(replies) > 1  # four draws of 12 tokens from a random model: equal only by a 1e-20 chance
    assert tc.get_rng_state() == state
    tc.manual_seed(3)
    state = tc.get_rng_state()
    with pytest.raises(ValueError, match="max_new_tokens"):
        ours.generate(x, 2**40, do_sample=True)
    assert tc.get_rng_state() == state


# ------------------------------------------------------------------------------- streamers, None options
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_hf_streamers_are_driven_as_hf_generate_drives_them(models, family):
    """``streamer=`` took only a callable: a transformers streamer (``put``/``end``, e.g.
    ``TextStreamer``) was a TypeError. It gets Hugging Face's calls now: the prompt, each step's
    tokens, then ``end()``; a plain callable still gets each step's tokens."""
    from transformers.generation.streamers import BaseStreamer

    class Recorder(BaseStreamer):
        def __init__(self):
            self.calls = []

        def put(self, value):
            self.calls.append(np.asarray(value).tolist())

        def end(self):
            self.calls.append("end")

    hf, ours = models[family]
    x = np.array([[5, 7, 9, 11], [13, 15, 17, 19]])
    theirs, mine = Recorder(), Recorder()
    ref = _hf_generate(hf, x, 5, eos_token_id=None, streamer=theirs)
    np.testing.assert_array_equal(ours.generate(x, 5, eos_token_id=None, streamer=mine), ref)
    assert mine.calls == theirs.calls and len(mine.calls) == 7 and mine.calls[-1] == "end"
    steps = []
    ours.generate(x, 5, eos_token_id=None, streamer=steps.append)
    assert [s.tolist() for s in steps] == theirs.calls[1:-1]
    with pytest.raises(TypeError, match=r"^streamer: expected an object with put\(\) and end\(\)"):
        ours.generate(x, 5, streamer=object())


def test_none_do_sample_and_temperature_mean_what_they_mean_in_hf(dirs, tmp_path):
    """``do_sample=None`` and ``temperature=None`` were TypeErrors; Hugging Face's generate takes
    them: None is greedy, and no temperature scaling (1), also over a generation config that
    samples. Greedy with ``temperature=None`` warns of nothing, as Hugging Face's."""
    hf, ours = _copy_with(dirs, "llama", tmp_path, {"do_sample": True, "temperature": 0.3, "top_k": 5})
    x = np.array([[5, 7, 9], [11, 13, 15]])
    greedy = _hf_generate(hf, x, 6, eos_token_id=None, do_sample=None)
    np.testing.assert_array_equal(greedy, _hf_generate(hf, x, 6, eos_token_id=None, do_sample=False))
    for kw in ({"do_sample": None}, {"do_sample": None, "temperature": None}, {"do_sample": False, "temperature": None}):
        got, warned = _warned(lambda: ours.generate(x, 6, eos_token_id=None, **kw))
        np.testing.assert_array_equal(got, greedy, err_msg=str(kw))
        assert not warned, kw
    sampled = ours.generate(x, 6, eos_token_id=None, do_sample=True, temperature=None, seed=3)
    np.testing.assert_array_equal(sampled, ours.generate(x, 6, eos_token_id=None, do_sample=True, temperature=1.0,
                                                         seed=3))
    assert not np.array_equal(sampled, ours.generate(x, 6, eos_token_id=None, do_sample=True, seed=3))  # file's 0.3


# ------------------------------------------------------------- forward's use_cache: Hugging Face's default
@pytest.mark.parametrize("first", [{}, {"use_cache": True}], ids=["default", "use_cache_first"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_hf_decoding_loop_feeding_past_key_values_back_matches_hf(models, family, first):
    """forward's use_cache defaulted to False where Hugging Face's takes the config's (True): the
    usual loop (``out = model(ids)``, then ``model(next, past_key_values=out.past_key_values)``) got
    None back, and the next step ran its token alone at position 0 (logits 0.24 off Hugging Face's,
    no error). Now use_cache=None is the config's, and the loop gives Hugging Face's tokens and
    logits at every step, with the prompt's first call made with or without use_cache=True."""
    hf, ours = models[family]
    prompt = np.array([[5, 9, 13, 4], [7, 7, 2, 30]])
    with torch.no_grad():
        theirs = hf(torch.from_numpy(prompt), **first)
    mine = ours(prompt, **first)
    assert_close(mine.logits, theirs.logits, np.float32, atol_=1e-5, what=f"{family}: prompt")
    prompt_cache = mine.past_key_values
    for step in range(6):
        nxt = theirs.logits[:, -1].argmax(-1, keepdim=True)
        np.testing.assert_array_equal(mine.logits[:, -1].argmax(-1), nxt[:, 0].numpy(), err_msg=f"step {step}")
        with torch.no_grad():
            theirs = hf(nxt, past_key_values=theirs.past_key_values)
        cache = mine.past_key_values
        mine = ours(nxt.numpy(), past_key_values=cache)
        assert_close(mine.logits, theirs.logits, np.float32, atol_=1e-5, what=f"{family}: step {step}")
        assert mine.past_key_values is cache and cache.length == 5 + step  # updated in place, returned
    assert isinstance(prompt_cache, tc.KVCache) and mine.past_key_values is prompt_cache


def _with_config(dirs, family, tmp_path, **config):
    """(hf, ours) from a copy of the family's directory whose config.json has ``config`` set."""
    path = tmp_path / family
    shutil.copytree(dirs[family], path)
    written = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**written, **config}))
    return _load(path)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_use_cache_default_is_the_configs_and_false_returns_what_hf_returns(dirs, models, tmp_path, family):
    """use_cache=None (the default) is config.json's use_cache, True when absent; use_cache=False
    returns None, and with a cache given, what Hugging Face returns: Llama the cache it was given,
    GPT-2 None (both update the given cache). The base model (hidden states) takes the same rule."""
    hf, ours = models[family]
    ids = np.array([[5, 9, 13, 4]])
    t = torch.from_numpy(ids)
    assert "use_cache" not in ours.config.extra or ours.config.extra["use_cache"] is True
    with torch.no_grad():
        assert hf(t).past_key_values is not None and hf(t, use_cache=False).past_key_values is None
        hf_past = hf(t, use_cache=True).past_key_values
        hf_returned = hf(torch.tensor([[7]]), past_key_values=hf_past, use_cache=False).past_key_values
    assert hf_past.get_seq_length() == 5  # updated though use_cache=False
    assert ours(ids).past_key_values.length == 4
    assert ours(ids, use_cache=False).past_key_values is None
    cache = ours(ids).past_key_values
    returned = ours(np.array([[7]]), past_key_values=cache, use_cache=False).past_key_values
    assert cache.length == 5
    assert (returned is None) == (hf_returned is None) and (returned is None or returned is cache)
    assert (returned is None) == (family == "gpt2")  # the two rules differ in transformers 5.23
    base = (tc.GPT2Model if family == "gpt2" else tc.LlamaModel).from_pretrained(dirs[family])
    hidden, base_cache = base(ids)
    assert base_cache.length == 4
    assert base(ids, use_cache=False)[1] is None
    assert (base(np.array([[7]]), past_key_values=base_cache, use_cache=False)[1] is None) == (family == "gpt2")
    # a config.json of use_cache false: None by default, as Hugging Face's (a given cache: as above)
    hf_off, ours_off = _with_config(dirs, family, tmp_path, use_cache=False)
    with torch.no_grad():
        assert hf_off(t).past_key_values is None
    assert ours_off(ids).past_key_values is None
    assert ours_off(ids, use_cache=True).past_key_values.length == 4
    ours_off.config.extra["use_cache"] = "yes"
    with pytest.raises(TypeError, match=r"^config.extra\['use_cache'\]: expected a bool, got str"):
        ours_off(ids)
    with pytest.raises(TypeError, match="^use_cache: expected a bool"):
        ours(ids, use_cache=1)
    # a config.json's use_cache that is not a bool is refused when the config is read, as
    # transformers' strict configs refuse it (it used to load, then break every plain forward)
    config_class = {"gpt2": tc.GPT2Config, "llama": tc.LlamaConfig}[family]
    fields = ours.config.to_dict()
    for bad in (None, 0, "true"):
        with pytest.raises(TypeError, match=r"^use_cache: expected a bool"):
            config_class.from_dict({**fields, "use_cache": bad})


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_cache_passed_second_positionally_gets_a_hint(dirs, models, family):
    """``model(ids, past)`` is Hugging Face's GPT-2 order (past_key_values second); here the second
    argument is attention_mask (Llama's order), and a cache there was converted to an array and
    reported as a 6-D attention_mask of the wrong shape. Now a TypeError says to pass it by keyword,
    before any other check, for a KVCache and for a legacy tuple or list of (keys, values) pairs;
    the cache is left as it was. A mask given as nested lists is still a mask."""
    hf, ours = models[family]
    ids = np.array([[5, 9, 13, 4]])
    cache = ours(ids, use_cache=True).past_key_values
    with torch.no_grad():
        hf_legacy = tuple((layer.keys, layer.values) for layer in hf(torch.from_numpy(ids)).past_key_values.layers)
    base = (tc.GPT2Model if family == "gpt2" else tc.LlamaModel).from_pretrained(dirs[family])
    hint = (r"^attention_mask: expected an \(N, past \+ L\) mask, got {}: the second positional argument here "
            r"is attention_mask \(Hugging Face's GPT-2 takes past_key_values second\); pass the cache by keyword: "
            r"model\(input_ids, past_key_values=cache\)$")
    pairs = r" of \(keys, values\) pairs"
    for given, got in ((cache, "a KVCache"), (cache.to_legacy(), "Hugging Face's legacy tuple" + pairs),
                       (list(hf_legacy), "Hugging Face's legacy list" + pairs),
                       (hf_legacy, "Hugging Face's legacy tuple" + pairs)):
        for call in (lambda: ours(np.array([[7]]), given), lambda: base(np.array([[7]]), given),
                     lambda: ours(np.array([[7]]), given, logits_to_keep=9)):  # before logits_to_keep's check
            with pytest.raises(TypeError, match=hint.format(got)):
                call()
    assert cache.length == 4
    np.testing.assert_array_equal(ours(ids, [[1, 1, 1, 1]]).logits, ours(ids).logits)
