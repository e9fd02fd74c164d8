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
from conftest import refusal_peak
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
    cache grows; left padding and a gap inside a row are still accepted and match transformers'
    generate (a row without a real token is refused too: test_generation_hf.py)."""
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
    # a gap inside a row (its last position real) is not right padding
    gap = np.ones((2, 7), np.int64)
    gap[0, :2] = gap[0, 4] = 0
    np.testing.assert_array_equal(m.generate(ids, 5, attention_mask=gap), _hf_generate(hf, ids, gap, 5))


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


# ------------------------------------------------------------- decoding options of generation_config.json
@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A directory holding a tiny random Llama's config.json and weights, as transformers saves
    them; each test copies it and writes its own generation_config.json (:func:`_with_generation`)."""
    cfg = transformers.LlamaConfig(vocab_size=97, max_position_embeddings=64, rms_norm_eps=1e-5,
                                   initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                   hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
                                   num_key_value_heads=2, attn_implementation="eager")
    torch.manual_seed(2)
    path = tmp_path_factory.mktemp("llama_dir")
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(path, safe_serialization=True)
    return path


def _with_generation(llama_dir, path, generation: dict):
    """(hf model, our model) loaded from a copy of ``llama_dir`` whose generation_config.json is
    ``generation``."""
    import json
    import shutil

    import transformer_core as tc

    shutil.copytree(llama_dir, path)
    (path / "generation_config.json").write_text(json.dumps(generation))
    return transformers.LlamaForCausalLM.from_pretrained(path).eval(), tc.LlamaForCausalLM.from_pretrained(path)


def _spy_configs(monkeypatch) -> list:
    """The GenerationConfig of each step that ``next_tokens`` is given from now on (recorded, then
    the step runs as usual)."""
    from transformer_core import generation

    seen, original = [], generation.next_tokens

    def spy(scores, sequences, cfg, rng, lead=None):
        seen.append(cfg)
        return original(scores, sequences, cfg, rng, lead)

    monkeypatch.setattr(generation, "next_tokens", spy)
    return seen


def test_generation_config_repetition_penalty_is_the_default_as_transformers(llama_dir, tmp_path):
    """generation_config.json's repetition_penalty was ignored (only its end and pad ids were read):
    greedy decoding gave transformers' tokens without the penalty. It is now the default, token for
    token as transformers' generate; the caller's argument still wins (1.0 or None: no penalty)."""
    hf, ours = _with_generation(llama_dir, tmp_path / "m",
                                {"repetition_penalty": 2.0, "eos_token_id": [5, 9], "pad_token_id": 0})
    x = np.random.default_rng(4).integers(1, 97, size=(2, 6))
    with torch.no_grad():
        ref = hf.generate(torch.from_numpy(x), do_sample=False, max_new_tokens=15).numpy()
        plain = hf.generate(torch.from_numpy(x), do_sample=False, max_new_tokens=15, repetition_penalty=1.0).numpy()
    assert ref.shape != plain.shape or not np.array_equal(ref, plain)  # the penalty changes the tokens
    np.testing.assert_array_equal(ours.generate(x, 15), ref)
    np.testing.assert_array_equal(np.concatenate([x, np.stack(list(ours.stream(x, 15)), 1)], 1), ref)
    np.testing.assert_array_equal(ours.generate(x, 15, repetition_penalty=1.0), plain)
    np.testing.assert_array_equal(ours.generate(x, 15, repetition_penalty=None), plain)


@pytest.mark.parametrize("generation, kwargs", [
    ({"do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9, "repetition_penalty": 1.3}, {}),
    ({"do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9}, {"top_k": None, "temperature": 1.0}),
    ({"do_sample": True, "temperature": 0.7, "top_k": 0}, {"top_p": 0.5, "repetition_penalty": 1.1}),
    ({"do_sample": True, "temperature": 0.7, "top_p": 0.9}, {"do_sample": False}),
    ({"temperature": 0.6, "top_p": 0.8, "top_k": 20}, {}),  # greedy: the sampling fields unused
    ({"temperature": 0.6, "top_k": 20}, {"do_sample": True}),
    ({"do_sample": True, "top_k": None, "top_p": None, "temperature": None}, {}),  # null: the defaults
], ids=["file", "file+args", "top_k-0", "args-greedy", "greedy-file", "args-sample", "nulls"])
def test_generation_config_decoding_options_resolved_as_transformers(llama_dir, tmp_path, monkeypatch, generation,
                                                                      kwargs):
    """do_sample, temperature, top_k, top_p and repetition_penalty not passed are the generation
    config's (then the defaults), the ones passed win: the same options as transformers' generate
    resolves (its _prepare_generation_config), and no warning about the file's sampling fields
    when greedy (transformers warns only about the caller's)."""
    hf, ours = _with_generation(llama_dir, tmp_path / "m", generation)
    ref = hf._prepare_generation_config(None, **kwargs)[0]
    seen = _spy_configs(monkeypatch)
    _, caught = _warned(lambda: ours.generate(np.array([[5, 17, 42]]), 2, **kwargs))
    assert caught == []
    cfg = seen[0]
    assert cfg.do_sample == ref.do_sample
    assert (cfg.repetition_penalty or 1.0) == ref.repetition_penalty
    if ref.do_sample:
        assert cfg.temperature == ref.temperature
        assert cfg.top_k == (ref.top_k or None)
        assert (cfg.top_p or 1.0) == ref.top_p


def test_generation_config_decoding_options_are_checked_naming_the_file(tiny_llama, monkeypatch):
    """The generation config's options are checked as the arguments are, the error naming the file
    and field; a sampling field that greedy decoding does not use is checked for its type only; an
    argument passed in its place is what is checked."""
    _, model = tiny_llama
    x = np.array([[5, 17, 42]])
    greedy = model.generate(x, 4)
    cases = [({"do_sample": "yes"}, TypeError, "do_sample: expected a bool"),
             ({"do_sample": True, "temperature": 0.0}, ValueError, r"temperature: expected a finite number > 0 "),
             ({"do_sample": True, "top_k": -1}, ValueError, "top_k: expected an int in"),
             ({"do_sample": True, "top_p": 1.5}, ValueError, r"top_p: expected a finite number in \[0.0, 1.0\]"),
             ({"repetition_penalty": 0}, ValueError, r"repetition_penalty: expected a finite number > 0 "),
             ({"temperature": "hot"}, TypeError, "temperature: expected a number")]
    for generation, error, message in cases:
        monkeypatch.setattr(model, "generation_config", generation)
        with pytest.raises(error, match=f"^generation_config.json: {message}"):
            model.generate(x, 4)
    monkeypatch.setattr(model, "generation_config", {"do_sample": True, "temperature": 0.0, "top_k": -1})
    np.testing.assert_array_equal(model.generate(x, 4, do_sample=False), greedy)  # unused when greedy
    assert model.generate(x, 4, temperature=0.5, top_k=3, seed=0).shape == (1, 7)  # the arguments' values
    monkeypatch.setattr(model, "generation_config", {"temperature": 0.0, "top_p": 0.0})
    out, caught = _warned(lambda: model.generate(x, 4))  # greedy (the file's do_sample: none)
    np.testing.assert_array_equal(out, greedy)
    assert caught == []


# ------------------------------------------------------------------------- the inferred attention mask
def test_mask_inferred_from_the_pad_id_as_transformers(llama_dir, tmp_path):
    """Without attention_mask, transformers' generate masks a prompt's pad ids (input_ids !=
    pad_token_id) when the prompt holds the pad id and it is no end id; ours attended to the pads.
    Now the same mask, whether the pad id comes from generation_config.json or the argument; none
    when the pad id is an end id or absent from the prompt (as transformers). A row that ends with
    the pad id is right padding: refused naming input_ids."""
    hf, ours = _with_generation(llama_dir, tmp_path / "m", {"pad_token_id": 0})
    x = np.random.default_rng(5).integers(1, 97, size=(2, 6))
    x[1, :3] = 0  # row 1 left-padded with the pad id
    keep = (x != 0).astype(np.int64)
    with torch.no_grad():
        ref = hf.generate(torch.from_numpy(x), do_sample=False, max_new_tokens=8).numpy()
        unmasked = hf.generate(torch.from_numpy(x), attention_mask=torch.ones(2, 6, dtype=torch.long),
                               do_sample=False, max_new_tokens=8).numpy()
        as_eos = hf.generate(torch.from_numpy(x), do_sample=False, max_new_tokens=8, eos_token_id=0).numpy()
    assert not np.array_equal(ref, unmasked)  # the mask changes row 1's tokens
    np.testing.assert_array_equal(ref, _hf_generate(hf, x, keep, 8))
    np.testing.assert_array_equal(ours.generate(x, 8), ref)
    np.testing.assert_array_equal(ours.generate(x, 8, repetition_penalty=1.5),
                                  hf.generate(torch.from_numpy(x), do_sample=False, max_new_tokens=8,
                                              repetition_penalty=1.5).numpy())
    np.testing.assert_array_equal(ours.generate(x, 8, attention_mask=np.ones((2, 6))), unmasked)
    np.testing.assert_array_equal(ours.generate(x, 8, eos_token_id=0), as_eos)  # pad = an end id: no mask
    # the pad id passed as an argument (the generation config without one)
    hf2, ours2 = _with_generation(llama_dir, tmp_path / "m2", {})
    with torch.no_grad():
        ref2 = hf2.generate(torch.from_numpy(x), do_sample=False, max_new_tokens=8, pad_token_id=0).numpy()
    np.testing.assert_array_equal(ref2, ref)
    np.testing.assert_array_equal(ours2.generate(x, 8, pad_token_id=0), ref2)
    np.testing.assert_array_equal(ours2.generate(x, 8), unmasked)  # no pad id: nothing inferred
    with pytest.raises(ValueError, match=r"^input_ids: without attention_mask, the mask is input_ids != "
                                         r"pad_token_id \(0\).* got row 0 right-padded"):
        ours.generate(np.array([[5, 6, 0]]), 2)


# ------------------------------------------------------------------------------- memory of the logits
@pytest.mark.parametrize("do_sample", [False, True])
def test_logits_too_large_are_refused_naming_input_ids_before_the_cache_grows(do_sample):
    """The (N, vocab_size) logits and the float64 arrays of their size that choose each step's tokens
    (one greedy, eight when sampling) were never checked against memory: a raw MemoryError mid-
    generation. A batch whose logits exceed this machine's memory is now a ValueError naming
    input_ids, raised by stream and generate before the caller's cache grows (a broadcast view of
    one id: nothing big is allocated)."""
    import transformer_core as tc
    from transformer_core._validation import physical_memory_bytes
    from transformer_core.llama import LlamaConfig

    V = 2**16
    model = tc.LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                            num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64))
    arrays = 8 if do_sample else 1
    N = physical_memory_bytes() // (V * (4 + 8 * arrays)) + 1  # one row more than fits
    ids = np.broadcast_to(np.int64(1), (N, 1))
    cache = model.new_cache(N, 1)
    before = (cache.length, cache.capacity)
    message = (rf"^input_ids: a batch of {N} sequences .* needs logits of \({N}, vocab_size = {V}\) float32 values "
               rf"and {arrays} float64 array\(s\)")
    for call in (model.stream, model.generate):
        with pytest.raises(ValueError, match=message):
            call(ids, 2, do_sample=do_sample, past_key_values=cache)
        assert (cache.length, cache.capacity) == before


# ------------------------------------------------------------------ the prompt's length before its copy
def test_prompt_longer_than_the_context_refused_before_it_is_copied(tiny_llama):
    """The prompt was converted to int64 (a copy of a broadcast or int32 view) before its length was
    checked against the context: 80 MB for 10**7 ids here, 8 GB for 10**9. It is refused from its
    shape, nothing copied."""
    import tracemalloc

    _, model = tiny_llama
    n = 10**7
    for ids in (np.broadcast_to(np.int32(1), (1, n)), np.broadcast_to(np.int64(1), (n,))):
        for call in (model.generate, model.stream):
            tracemalloc.start()
            try:
                with pytest.raises(ValueError, match=rf"^input_ids: prompt length {n} exceeds the context "
                                                     r"\(max_position_embeddings = 64\)$"):
                    call(ids, 2)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak < 2**20, peak


def test_forward_and_loss_refuse_from_the_shape_before_the_ids_copy(tiny_llama):
    """forward and loss copied the ids to int64 before their context and memory checks, which need
    only the shape: a broadcast view of 10**7 int32 ids cost 80 MB, and 10**8 rows of 3 cost loss
    25 s and 6.8 GB before a refusal in the C++ cache's words. Refused now from the shape alone."""
    _, model = tiny_llama
    long, tall = np.broadcast_to(np.int32(1), (1, 10**7)), np.broadcast_to(np.int32(1), (10**9, 3))
    context = r"exceeds the context \(max_position_embeddings = 64\)"
    for call, pattern in ((lambda: model(long), rf"^input_ids: past length 0 \+ new length {10**7} {context}$"),
                          (lambda: model.loss(long, long), rf"^input_ids: length {10**7} {context}$"),
                          (lambda: model(tall), r"^input_ids: a batch of 1000000000 sequences of length 3 needs "
                                                "feed-forward activations"),
                          (lambda: model.loss(tall, tall),
                           r"^input_ids: a training batch of 1000000000 sequences of length 3 needs feed-forward")):
        assert refusal_peak(call, ValueError, pattern) < 2**20


def test_position_ids_errors_say_positions(tiny_llama):
    _, model = tiny_llama
    with pytest.raises(TypeError, match="^position_ids: expected integer positions, got dtype float64 with "
                                        "non-integral values$"):
        model(np.zeros((2, 5), np.int64), position_ids=np.zeros((2, 5)) + 0.5)


def test_eos_token_id_as_a_tensor_as_hf_takes_it(tiny_llama):
    """Hugging Face's generate takes eos_token_id as a tensor; ours refused one ("expected an int,
    got Tensor"). The tokens equal those of the same ids as a list, and of HF's generate."""
    hf, model = tiny_llama
    ids = np.array([[5, 17, 3]])
    as_list = model.generate(ids, 6, eos_token_id=[11, 40])
    for eos in (torch.tensor([11, 40]), np.array([11, 40])):
        np.testing.assert_array_equal(model.generate(ids, 6, eos_token_id=eos), as_list)
    one = model.generate(ids, 6)[0, 3]  # the first new token, as a 0-d tensor: generation stops after it
    np.testing.assert_array_equal(model.generate(ids, 6, eos_token_id=torch.tensor(int(one)))[0], [5, 17, 3, one])
    with torch.no_grad():
        expected = hf.generate(torch.from_numpy(ids), max_new_tokens=6, do_sample=False,
                               eos_token_id=torch.tensor([11, 40]), pad_token_id=0).numpy()
    np.testing.assert_array_equal(as_list[:, :expected.shape[1]], expected)


# ------------------------------------------------------------------- greedy ignores sampling values
@pytest.mark.parametrize("options", [{"temperature": 0.0}, {"top_p": 0.0}, {"top_k": -1}, {"seed": -1},
                                     {"temperature": float("nan"), "top_p": 2.0}],
                         ids=["temperature-0", "top_p-0", "top_k-neg", "seed-neg", "nan-top_p-2"])
def test_greedy_ignores_out_of_range_sampling_options_with_a_warning(tiny_llama, options):
    """Greedy decoding refused values of options it does not use (temperature=0.0: ValueError);
    transformers decodes greedily and warns that the flags are ignored, and so does ours now (the
    tokens are the greedy ones). Their types are still checked; when sampling, their values too
    (top_p=0.0 is a value transformers takes: it keeps the top token)."""
    import re

    _, model = tiny_llama
    x = np.random.default_rng(6).integers(0, 97, size=(2, 5))
    greedy = model.generate(x, 4)
    with torch.no_grad():
        ref = {k: v for k, v in options.items() if k != "seed"}
        hf_tokens = tiny_llama[0].generate(torch.from_numpy(x), do_sample=False, max_new_tokens=4,
                                           pad_token_id=0, attention_mask=torch.ones(2, 5, dtype=torch.long),
                                           eos_token_id=None, **ref).numpy()
    np.testing.assert_array_equal(hf_tokens, greedy)
    for call in (lambda: model.generate(x, 4, **options),
                 lambda: np.concatenate([x, np.stack(list(model.stream(x, 4, **options)), 1)], 1)):
        out, caught = _warned(call)
        np.testing.assert_array_equal(out, greedy)
        assert len(caught) == 1
        names = sorted(re.findall(r"(\w+)=", str(caught[0].message).split(" options ")[1].split(";")[0]))
        assert names == sorted(options)
        assert names == sorted(set(_hf_ignored_flags(**ref)) | ({"seed"} & set(options)))


def test_sampling_options_checked_for_their_type_when_greedy_and_their_value_when_sampling(tiny_llama):
    _, model = tiny_llama
    x = np.array([[5, 17, 42]])
    for options, name, expected in (({"temperature": "hot"}, "temperature", "a number"),
                                    ({"top_p": "x"}, "top_p", "a number"), ({"top_k": 2.5}, "top_k", "an int"),
                                    ({"seed": 1.5}, "seed", "an int")):
        with pytest.raises(TypeError, match=f"^{name}: expected {expected}"):
            model.generate(x, 2, **options)
    for value in (0.0, -1.0, -1e-300):
        with pytest.raises(ValueError, match=r"^temperature: expected a finite number > 0 \(a temperature divides "):
            model.generate(x, 2, do_sample=True, temperature=value)
        with pytest.raises(ValueError, match=r"^temperature: expected a finite number > 0"):
            GenerationConfig(1, temperature=value)
        with pytest.raises(ValueError, match=r"^repetition_penalty: expected a finite number > 0 \(it divides "):
            model.generate(x, 2, repetition_penalty=value)
    for options, name in (({"top_p": -0.1}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k"),
                          ({"seed": -1}, "seed")):
        with pytest.raises(ValueError, match=f"^{name}: expected"):
            model.generate(x, 2, do_sample=True, **options)
        with pytest.raises(ValueError, match=f"^{name}: expected"):
            GenerationConfig(1, **options)  # the class checks every option (chat relies on it)


# ------------------------------------------------------------------------ the warning before the cache grows
def test_ignored_options_warning_comes_before_the_cache_grows(tiny_llama):
    """The warning about ignored sampling options was issued after the caller's cache had grown:
    with warnings as errors, the refused call left the cache changed."""
    import warnings

    _, model = tiny_llama
    x = np.random.default_rng(7).integers(0, 97, size=(2, 8))
    cache = model(x[:, :3], use_cache=True).past_key_values
    before = (cache.length, cache.capacity)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for call in (model.generate, model.stream):
            with pytest.raises(UserWarning, match="ignores the sampling options temperature=0.5"):
                call(x, 3, temperature=0.5, past_key_values=cache)
            assert (cache.length, cache.capacity) == before
    np.testing.assert_array_equal(model.generate(x, 3, past_key_values=cache), model.generate(x, 3))


def test_mask_shape_error_gives_the_shape_passed(tiny_llama):
    """A 1-D attention_mask for a batch of 2 was reported as ``got (1, 5)``, a shape the caller never
    passed."""
    _, model = tiny_llama
    x = np.ones((2, 5), np.int64)
    with pytest.raises(ValueError, match=r"^attention_mask: expected shape \(2, 5\) \(input_ids'\), got \(5,\)$"):
        model.generate(x, 2, attention_mask=np.ones(5))
    with pytest.raises(ValueError, match=r"got \(2, 4\)$"):
        model.generate(x, 2, attention_mask=np.ones((2, 4)))


def test_model_default_survives_copy_and_pickle():
    """generate's decoding defaults are the MODEL_DEFAULT marker ("not passed"): a copied or
    unpickled marker was another object, which the option checks then refused as a value
    ("do_sample: expected a bool, got _ModelDefault")."""
    import copy
    import inspect
    import pickle

    from transformer_core.generation import MODEL_DEFAULT, GenerationMixin

    assert copy.copy(MODEL_DEFAULT) is MODEL_DEFAULT and copy.deepcopy(MODEL_DEFAULT) is MODEL_DEFAULT
    assert pickle.loads(pickle.dumps(MODEL_DEFAULT)) is MODEL_DEFAULT
    defaults = {k: p.default for k, p in inspect.signature(GenerationMixin.generate).parameters.items()
                if p.default is MODEL_DEFAULT}
    assert set(defaults) == {"do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "eos_token_id",
                             "pad_token_id"}
    assert pickle.loads(pickle.dumps(defaults)) == defaults and all(v is MODEL_DEFAULT for v in copy.deepcopy(defaults).values())


def test_non_finite_logits_are_refused_not_decoded():
    """A model whose weights hold NaN gave logits of NaN: greedy decoding took their argmax, token 0,
    silently (as transformers'), and sampling failed in numpy's words ("Probabilities contain
    NaN"). Such a step is refused, naming the step and the rows; a single -inf (a masked token)
    is fine."""
    import transformer_core as tc
    from transformer_core.generation import _check_logits

    cfg = tc.GPT2Config(vocab_size=50, n_positions=32, n_embd=16, n_layer=1, n_head=2, eos_token_id=None,
                        bos_token_id=None)
    model = tc.GPT2LMHeadModel(cfg)
    rng = np.random.default_rng(0)
    state = {k: rng.standard_normal(v.shape).astype(np.float32) * 0.2 for k, v in model.state_dict().items()}
    state["h.0.mlp.c_proj.bias"][...] = np.nan
    model.load_state_dict(state)
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    message = r"^generate: step 0: the next-token logits of row\(s\) \[0, 1\] hold NaN( or \+inf)?, or are -inf "
    for options in ({}, {"do_sample": True, "seed": 0}, {"do_sample": True, "top_k": 0, "seed": 0}):
        with pytest.raises(ValueError, match=message):
            model.generate(ids, 4, **options)
        with pytest.raises(ValueError, match=message):
            list(model.stream(ids, 4, **options))
    # a caller's cache is put back as it came, so that a retry with it works
    cache = model(ids[:, :2], use_cache=True).past_key_values
    with pytest.raises(ValueError, match=message):
        model.generate(ids, 4, past_key_values=cache)
    assert cache.length == 2
    logits = np.zeros((3, 5), np.float32)
    logits[0, 1] = -np.inf  # a masked token
    logits[2, 3] = np.inf  # greedy takes it (its argmax, as transformers'); sampling cannot
    _check_logits(logits, 2, do_sample=False)
    with pytest.raises(ValueError, match=r"step 2: the next-token logits of row\(s\) \[2\] hold NaN or \+inf"):
        _check_logits(logits, 2, do_sample=True)
    logits[1] = -np.inf
    with pytest.raises(ValueError, match=r"step 2: the next-token logits of row\(s\) \[1\] hold NaN, or are -inf"):
        _check_logits(logits, 2, do_sample=False)
