"""transformer_core.generation's logits processing vs Hugging Face's logits processors.

``next_tokens`` is given a stand-in generator that records the distribution it samples from; the
tokens it keeps (probability > 0) and their probabilities are compared with transformers'
``TopKLogitsWarper`` / ``TopPLogitsWarper`` / ``RepetitionPenaltyLogitsProcessor`` applied to the
same float64 scores, tied scores included: which of two equal tokens survives a cut is part of the
contract (ours: HF's top-p with a stable sort; HF calls ``torch.sort`` without ``stable=True``, which
promises no order among ties but gives the stable one on these small CPU tensors).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformer_core.generation import GenerationConfig, next_tokens

transformers = pytest.importorskip("transformers")
from transformers.generation.logits_process import (  # noqa: E402
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


class _Recorder:
    """Stands in for ``np.random.Generator``: keeps each row's sampling distribution."""

    def __init__(self):
        self.probs = []

    def choice(self, n, p):
        self.probs.append(np.array(p, copy=True))
        return 0


def _ours(scores, **options) -> np.ndarray:
    options.setdefault("top_k", None)  # as _hf: no top-k filter unless given
    rec = _Recorder()
    cfg = GenerationConfig(1, do_sample=True, **options)
    next_tokens(np.array(scores, np.float64), np.zeros((len(scores), 1), np.int64), cfg, rec)
    return np.stack(rec.probs)


def _hf(scores, top_k=None, top_p=None) -> np.ndarray:
    s = torch.tensor(np.asarray(scores, np.float64))
    if top_k is not None:
        s = TopKLogitsWarper(top_k)(None, s)
    if top_p is not None:
        s = TopPLogitsWarper(top_p)(None, s)
    return torch.softmax(s, -1).numpy()


def _check(scores, **options):
    ours, ref = _ours(scores, **options), _hf(scores, **options)
    np.testing.assert_array_equal(ours > 0, ref > 0, err_msg=f"kept tokens differ for {options}")
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-15)


def test_sampling_defaults_to_hf_top_k_of_50_and_0_keeps_every_token():
    """generate(do_sample=True) samples among the 50 highest scores, as Hugging Face's generate
    (GenerationConfig's default top_k); top_k=0 turns the filter off there, and here (None too)."""
    from transformers import GenerationConfig as HFGenerationConfig

    hf_default = HFGenerationConfig._get_default_generation_params()["top_k"]
    assert hf_default == 50 and GenerationConfig(1, do_sample=True).top_k == hf_default
    scores = np.random.default_rng(0).standard_normal((3, 200))
    rec = _Recorder()
    next_tokens(scores, np.zeros((3, 1), np.int64), GenerationConfig(1, do_sample=True), rec)
    default = np.stack(rec.probs)
    np.testing.assert_array_equal((default > 0).sum(axis=-1), [50, 50, 50])
    np.testing.assert_allclose(default, _hf(scores, top_k=50), rtol=1e-12, atol=1e-15)
    for off in (0, None):
        np.testing.assert_allclose(_ours(scores, top_k=off), _hf(scores), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("scores, top_p, kept", [
    (np.log([[0.4, 0.3, 0.3]]), 0.5, [[True, False, True]]),
    ([[0.0, -0.0]], 0.5, [[False, True]]),
    ([[1.0, 1.0, 1.0, 1.0]], 0.3, [[False, False, True, True]]),
    ([[2.0, 0.5, 2.0, 0.5, 2.0]], 0.5, [[False, False, True, False, True]]),
], ids=["0.4-0.3-0.3", "signed-zeros", "four-equal", "two-levels"])
def test_top_p_ties_broken_as_hf(scores, top_p, kept):
    """Of tokens tied at the cut, the later ones are kept: HF's TopPLogitsWarper with a stable sort
    drops from the bottom of the ascending order (of tied scores, the lower id first); ours kept
    the earlier ones."""
    probs = _ours(scores, top_p=top_p)
    np.testing.assert_array_equal(probs > 0, kept)
    _check(scores, top_p=top_p)


def test_top_p_random_ties_match_hf():
    rng = np.random.default_rng(0)
    for trial in range(300):
        V = int(rng.integers(2, 12))
        levels = rng.normal(size=int(rng.integers(1, 4)))
        scores = rng.choice(levels, size=(3, V))  # few distinct values: many ties
        top_p = float(rng.uniform(0.05, 0.99))
        _check(scores, top_p=top_p)
        _check(scores, top_k=int(rng.integers(1, V + 1)), top_p=top_p)


def test_top_k_ties_match_hf():
    """Every token tied with the k-th highest is kept, as HF's TopKLogitsWarper keeps it."""
    np.testing.assert_array_equal(_ours([[1.0, 2.0, 2.0, 0.0]], top_k=1) > 0, [[False, True, True, False]])
    rng = np.random.default_rng(1)
    for trial in range(200):
        V = int(rng.integers(1, 10))
        scores = rng.choice(rng.normal(size=3), size=(2, V))
        _check(scores, top_k=int(rng.integers(1, V + 3)))


@pytest.mark.parametrize("penalty", [0.7, 1.5])
def test_repetition_penalty_prompt_ignore_length_matches_hf(penalty):
    """``prompt_ignore_length`` (each row's left padding) is not penalized, as HF's
    RepetitionPenaltyLogitsProcessor(prompt_ignore_length=...) that generate builds from the mask;
    the greedy token and the sampling distribution both follow the penalized scores."""
    rng = np.random.default_rng(2)
    for trial in range(100):
        N, V, T = 3, int(rng.integers(2, 9)), int(rng.integers(1, 8))
        scores = rng.normal(size=(N, V)) * 3
        seqs = rng.integers(0, V, size=(N, T))
        lead = rng.integers(0, T + 1, size=N)
        ref = RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=torch.from_numpy(lead))(
            torch.from_numpy(seqs), torch.from_numpy(scores.copy())).numpy()
        greedy = next_tokens(scores.copy(), seqs, GenerationConfig(1, repetition_penalty=penalty),
                             np.random.default_rng(), lead)
        np.testing.assert_array_equal(greedy, ref.argmax(-1))
        rec = _Recorder()
        next_tokens(scores.copy(), seqs, GenerationConfig(1, do_sample=True, repetition_penalty=penalty), rec, lead)
        np.testing.assert_allclose(np.stack(rec.probs), torch.softmax(torch.from_numpy(ref), -1).numpy(),
                                   rtol=1e-12, atol=1e-15)


# ------------------------------------------------------------------------------- padding side
@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """(hf model, our model): a tiny random Llama saved by transformers and loaded from the checkpoint."""
    import transformer_core as tc

    cfg = transformers.LlamaConfig(vocab_size=97, max_position_embeddings=64, rms_norm_eps=1e-5,
                                   initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                   hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
                                   num_key_value_heads=2, attn_implementation="eager")
    torch.manual_seed(1)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("tiny_llama")
    hf.save_pretrained(path, safe_serialization=True)
    return hf, tc.LlamaForCausalLM.from_pretrained(path)


def _hf_generate(hf, ids, am, new):
    with torch.no_grad():
        return hf.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(am), max_new_tokens=new,
                           do_sample=False, pad_token_id=0).numpy()


def test_right_padded_prompt_refused_naming_the_row(tiny_llama):
    """A right-padded row (0 at the last position after real tokens) was generated from its pad
    position: other tokens than the prompt alone gives (Hugging Face only warns). It is refused,
    naming attention_mask and the row, by generate and stream (ChatSession's path), before any
    cache grows; left padding, a gap inside a row and an all-pad row are still accepted and match
    transformers' generate."""
    hf, m = tiny_llama
    ids = np.random.default_rng(0).integers(0, 97, size=(2, 7)).astype(np.int64)
    am = np.ones((2, 7), np.int64)
    am[1, 5:] = 0
    msg = r"^attention_mask: expected left padding .* got row 1 right-padded \(its last real token at position 4"
    with pytest.raises(ValueError, match=msg):
        m.generate(ids, 6, attention_mask=am)
    with pytest.raises(ValueError, match=msg):
        m.stream(ids, 6, attention_mask=am.astype(np.float32))
    cache = m(ids[:, :3], use_cache=True).past_key_values
    capacity = cache.capacity
    with pytest.raises(ValueError, match=msg):
        m.generate(ids, 6, attention_mask=am, past_key_values=cache)
    assert (cache.length, cache.capacity) == (3, capacity)
    with pytest.raises(ValueError, match=r"^attention_mask: .* got row 0 right-padded"):
        m.generate(ids[0], 2, attention_mask=[1, 1, 1, 1, 1, 1, 0])  # one unbatched row
    # the same row left-padded: the tokens of the prompt alone, as transformers
    left = np.concatenate([ids[1:, 5:], ids[1:, :5]], axis=1)
    left_am = np.array([[0, 0, 1, 1, 1, 1, 1]])
    alone = m.generate(ids[1:, :5], 6)[0, 5:]
    np.testing.assert_array_equal(m.generate(left, 6, attention_mask=left_am)[0, 7:], alone)
    np.testing.assert_array_equal(_hf_generate(hf, left, left_am, 6)[0, 7:], alone)
    # a gap inside a row (its last position real) and a row without a real token are not right padding
    gap = np.ones((3, 7), np.int64)
    gap[0, :2] = gap[0, 4] = 0
    gap[2] = 0
    x = np.concatenate([ids, ids[:1]])
    ours = m.generate(x, 5, attention_mask=gap)
    np.testing.assert_array_equal(ours[:2], _hf_generate(hf, x[:2], gap[:2], 5))


# ------------------------------------------------------------------------ generation_config.json
def test_generation_config_end_ids_stop_as_transformers(tiny_llama, tmp_path):
    """A directory's generation_config.json may list end ids that config.json does not (Llama-3-
    Instruct: config.json 128001, generation_config.json [128001, 128009]); transformers' generate
    stops at them, and so do ours and chat's end ids. A generation config without end ids (or with
    null) has none: no fallback to config.json's, as transformers. save_pretrained writes the file
    back whole, removes an earlier save's when the model has none, and a malformed one is refused
    naming it."""
    import json

    import transformer_core as tc
    from transformer_core.chat import _end_ids

    hf, ours = tiny_llama
    assert ours.generation_config is not None  # transformers saved one (its ids all null here)
    x = np.array([[5, 17, 42, 8, 61, 3]])
    mask = torch.ones(1, 6, dtype=torch.long)
    free = ours.generate(x, 10)[0, 6:]
    stop = int(free[3])  # the 4th new token: an end id in the generation config only

    def hf_generate(path):
        model = transformers.LlamaForCausalLM.from_pretrained(path).eval()
        with torch.no_grad():
            return model.generate(torch.from_numpy(x), attention_mask=mask, max_new_tokens=10, do_sample=False,
                                  pad_token_id=0).numpy()

    hf.config.eos_token_id = 96
    hf.generation_config.eos_token_id = [96, stop]
    hf.generation_config.pad_token_id = 0
    hf.generation_config.max_new_tokens = 50  # a field our generate does not read: written back as it was
    hf.save_pretrained(tmp_path / "gc", safe_serialization=True)
    assert json.loads((tmp_path / "gc" / "config.json").read_text())["eos_token_id"] == 96
    ref = hf_generate(tmp_path / "gc")
    model = tc.LlamaForCausalLM.from_pretrained(tmp_path / "gc")
    assert model.generation_config["eos_token_id"] == [96, stop] and model.generation_config["pad_token_id"] == 0
    got = model.generate(x, 10)
    assert ref.shape[1] < 6 + 10 and np.array_equal(got[:, :ref.shape[1]], ref)  # stopped where transformers did
    assert (got[0, ref.shape[1]:] == 0).all()  # then the generation config's pad id
    tokenizer = type("Tok", (), {"eos_token_id": None})()
    assert _end_ids(model, tokenizer) == [96, stop]

    model.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "generation_config.json").read_text()) == model.generation_config
    assert json.loads((tmp_path / "again" / "generation_config.json").read_text())["max_new_tokens"] == 50
    assert tc.LlamaForCausalLM.from_pretrained(tmp_path / "again").generation_config == model.generation_config

    # end ids in config.json only, the generation config without them: neither stops
    cfg = json.loads((tmp_path / "gc" / "config.json").read_text())
    cfg["eos_token_id"] = stop
    (tmp_path / "gc" / "config.json").write_text(json.dumps(cfg))
    for gen in ({"pad_token_id": 0}, {"eos_token_id": None, "pad_token_id": -1}):
        (tmp_path / "gc" / "generation_config.json").write_text(json.dumps(gen))
        ref = hf_generate(tmp_path / "gc")
        assert ref.shape[1] == 6 + 10
        assert np.array_equal(tc.LlamaForCausalLM.from_pretrained(tmp_path / "gc").generate(x, 10), ref)
    (tmp_path / "gc" / "generation_config.json").unlink()  # no file: config.json's end id stops it
    assert tc.LlamaForCausalLM.from_pretrained(tmp_path / "gc").generate(x, 10).shape[1] == 6 + 4

    # a model without a generation config saved over a directory with one: the old file goes
    plain = tc.LlamaForCausalLM(model.config)
    assert plain.generation_config is None
    plain.save_pretrained(tmp_path / "again")
    assert not (tmp_path / "again" / "generation_config.json").exists()
    assert tc.LlamaForCausalLM.from_pretrained(tmp_path / "again").generation_config is None

    for bad in ({"eos_token_id": "x"}, {"pad_token_id": [1]}, {"eos_token_id": [1, True]}, {"bos_token_id": 2.0}, [1]):
        (tmp_path / "gc" / "generation_config.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="generation_config.json"):
            tc.LlamaForCausalLM.from_pretrained(tmp_path / "gc")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_activations_too_large_are_refused_naming_input_ids_before_the_cache_grows(family):
    """A batch whose feed-forward activations exceed this machine's memory is a ValueError naming
    input_ids and the config field that sets the width, raised before the caller's cache is grown
    (forward and generate), not the core's message about an internal ``x`` mid-forward."""
    import transformer_core as tc
    from transformer_core._validation import physical_memory_bytes
    from transformer_core.gpt2 import GPT2Config
    from transformer_core.llama import LlamaConfig

    if family == "llama":
        model = tc.LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=2**20,
                                                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=1,
                                                max_position_embeddings=64))
        width, field = 3 * 2**20, "3 · intermediate_size"
    else:
        model = tc.GPT2LMHeadModel(GPT2Config(vocab_size=32, n_embd=8, n_layer=1, n_head=2, n_positions=64,
                                              n_inner=2**20))
        width, field = 2**20, "n_inner"
    N = physical_memory_bytes() // (width * 4) + 1  # one row more than fits, at one position each
    cache = model.new_cache(N, 1)  # empty, capacity 1: a call that ran would grow it
    before = (cache.length, cache.capacity)
    ids = np.zeros((N, 2), np.int64)
    for call in (lambda: model(ids, past_key_values=cache), lambda: model.generate(ids, 2, past_key_values=cache)):
        with pytest.raises(ValueError, match=rf"^input_ids: a batch of {N} sequences .* \({2 * N}, {field} = {width}\)"):
            call()
        assert (cache.length, cache.capacity) == before


# ------------------------------------------------------------------------------- greedy ignores sampling options
def _hf_ignored_flags(**options) -> list[str]:
    """The flags transformers' ``GenerationConfig.validate`` names for greedy decoding with
    ``options`` ("The following generation flags are not valid and may be ignored: [...]")."""
    import re

    try:
        transformers.GenerationConfig(do_sample=False, **options).validate(strict=True)
    except ValueError as e:
        return sorted(re.findall(r"^- `(\w+)`", str(e), re.M))
    return []


def _warned(call) -> tuple[object, list]:
    """``call()``'s result and the UserWarnings it raised."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return result, [w for w in caught if issubclass(w.category, UserWarning)]


def test_greedy_generate_warns_about_the_sampling_options_it_ignores(tiny_llama):
    """generate/stream with do_sample=False silently ignored temperature, top_k, top_p and seed;
    transformers warns about the same flags: now a UserWarning names them (the tokens are still
    the greedy ones, the call is not refused), pointing at the caller's line."""
    import re

    _, model = tiny_llama
    x = np.random.default_rng(4).integers(0, 97, size=(2, 5))
    greedy, none = _warned(lambda: model.generate(x, 6))
    assert none == []
    for options in ({"temperature": 0.3}, {"top_p": 0.5}, {"top_k": 3}, {"top_k": 0},
                    {"temperature": 0.3, "top_p": 0.5, "top_k": 3}, {"top_k": 50}, {"top_k": None},
                    {"top_p": 1.0}, {"temperature": 1.0}, {"top_p": None}):
        expected = _hf_ignored_flags(**options)
        for how in ("generate", "stream"):
            if how == "generate":
                out, caught = _warned(lambda: model.generate(x, 6, **options))
            else:
                out, caught = _warned(lambda: np.concatenate([x, np.stack(list(model.stream(x, 6, **options)), 1)], 1))
            np.testing.assert_array_equal(out, greedy, err_msg=str(options))
            if not expected:
                assert caught == [], (options, how, [str(w.message) for w in caught])
                continue
            assert len(caught) == 1, (options, how)
            message = str(caught[0].message)
            names = sorted(re.findall(r"(\w+)=", message.split(" options ")[1].split(";")[0]))
            assert names == expected, (options, how, message)
            assert caught[0].filename == __file__, (how, caught[0].filename)  # the caller's line
    _, caught = _warned(lambda: model.generate(x, 6, temperature=0.3, top_p=0.5, top_k=3, seed=1))
    assert [str(w.message) for w in caught] == [
        "do_sample=False (greedy decoding) ignores the sampling options temperature=0.3, top_k=3, top_p=0.5, "
        "seed=1; pass do_sample=True to sample with them"]
    # sampling uses them: no warning; a refused call raises without warning
    _, caught = _warned(lambda: model.generate(x, 6, do_sample=True, temperature=0.3, top_p=0.5, top_k=3, seed=1))
    assert caught == []
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="^max_new_tokens: prompt length 5 "):
            model.generate(x, 100, temperature=0.3)
    assert caught == []
