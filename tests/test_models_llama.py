"""tc.LlamaForCausalLM / tc.LlamaModel vs Hugging Face transformers' Llama, on tiny random configs.

Random checkpoints are built in the test with transformers (``initializer_range=0.2`` so logits are
far from uniform), saved with ``save_pretrained`` and loaded with ``from_pretrained``: grouped-query
ratios 1 (plain multi-head), 3 and MQA, tied and untied heads, a bias variant, head_dim != E / H.

float64: Hugging Face's Llama computes RMSNorm, the RoPE angles and the eager softmax in float32
even for a float64 model. The fp64 reference here is the same architecture computed in float64:
those three are patched (``_true_fp64``) and attention runs through torch's SDPA in float64.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import textwrap

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import assert_close, assert_generate_pads_with_config_pad_token_id

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama  # noqa: E402

VOCAB = 97

CFGS = {
    # name: (config kwargs, seed)
    "gqa3_untied": (dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
                         num_key_value_heads=2, tie_word_embeddings=False), 1),
    "mha_tied": (dict(hidden_size=32, intermediate_size=56, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=4, tie_word_embeddings=True), 2),
    "mqa_tied": (dict(hidden_size=40, intermediate_size=64, num_hidden_layers=2, num_attention_heads=5,
                      num_key_value_heads=1, tie_word_embeddings=True), 3),
    "bias_headdim": (dict(hidden_size=36, intermediate_size=50, num_hidden_layers=2, num_attention_heads=3,
                          num_key_value_heads=3, head_dim=16, attention_bias=True, mlp_bias=True,
                          tie_word_embeddings=False, rope_theta=500.0), 4),
}


def _build(tmp_path_factory, name):
    kwargs, seed = CFGS[name]
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, max_position_embeddings=64, rms_norm_eps=1e-5,
                                   initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                   attn_implementation="sdpa", **kwargs)
    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1, so a mix-up of norm weights shows
        for n, p in hf.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))
    path = tmp_path_factory.mktemp(f"llama_{name}")
    hf.save_pretrained(path, safe_serialization=True)
    return hf, path


@pytest.fixture(scope="module", params=list(CFGS))
def llama(request, tmp_path_factory):
    """(hf model, checkpoint dir, our model) for each config."""
    hf, path = _build(tmp_path_factory, request.param)
    return hf, path, tc.LlamaForCausalLM.from_pretrained(path)


@pytest.fixture(scope="module")
def llama_gqa(tmp_path_factory):
    hf, path = _build(tmp_path_factory, "gqa3_untied")
    return hf, path, tc.LlamaForCausalLM.from_pretrained(path)


def _ids(seed, shape):
    return np.random.default_rng(seed).integers(0, VOCAB, size=shape).astype(np.int64)


def _hf(hf, ids, **kw):
    with torch.no_grad():
        return hf(torch.from_numpy(ids), **kw)


@contextlib.contextmanager
def _true_fp64():
    """HF's Llama with RMSNorm and the RoPE angles computed in the input's dtype (float64)."""
    def rms_forward(self, h):
        variance = h.pow(2).mean(-1, keepdim=True)
        return self.weight * (h * torch.rsqrt(variance + self.variance_epsilon))

    def rope_forward(self, x, position_ids):
        base = self.config.rope_parameters["rope_theta"]
        dim = self.inv_freq.shape[0] * 2
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        freqs = position_ids[..., None].double() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    saved = modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaRotaryEmbedding.forward
    modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaRotaryEmbedding.forward = rms_forward, rope_forward
    try:
        yield
    finally:
        modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaRotaryEmbedding.forward = saved


# ------------------------------------------------------------------------------------- forward
def _rounding_sensitivity(hf64, ids, exact, runs=6):
    """How far each fp64 logit moves when every attention output is perturbed by about one fp32
    rounding (relative noise of 2^-24, normal): each logit's own condition. A token whose residual
    stream nearly cancels amplifies such a rounding 10-50×, in any fp32 engine."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    g = torch.Generator().manual_seed(0)

    def jittered(*args, **kw):
        out = sdpa(*args, **kw)
        return out * (1 + 2.0 ** -24 * torch.randn(out.shape, generator=g, dtype=out.dtype))

    torch.nn.functional.scaled_dot_product_attention = jittered
    try:
        with _true_fp64():
            moved = [np.abs(_hf(hf64, ids).logits.numpy() - exact) for _ in range(runs)]
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa
    return np.max(moved, axis=0)


@pytest.mark.parametrize("N,L", [(1, 1), (2, 7), (3, 13), (5, 5), (1, 64)], ids=["N1L1", "N2L7", "N3L13", "N5L5", "N1L64"])
def test_logits_match_hf(llama, N, L):
    """fp32 logits within 1e-5 of transformers', beyond transformers' own rounding error and each
    logit's sensitivity to rounding.

    transformers' fp32 logits are up to 1.4e-5 away from the exact (fp64) ones here, more than the
    tolerance: ours can be nearer the exact answer and still differ from them by more than 1e-5 (the
    AMX product does: 6e-6 from exact, 1.4e-5 from transformers). So each element may differ by 1e-5
    plus transformers' own distance from the fp64 logits of the same checkpoint. And a few logits
    are ill-conditioned: in mha_tied, N3L13, logit [2, 10, 59] moves by 3e-6 when the attention
    outputs are jittered by half an fp32 ulp, and our attention and torch's each round a few ulps
    from exact (3-5e-7 on values of order 1, both): there ours was 1.5e-5 from exact and
    transformers' 2e-6, by chance (over 40 other inputs, the largest distance from exact: ours 9.8e-6,
    transformers' 1.1e-5). So each element also gets 4 × its measured sensitivity
    (_rounding_sensitivity over 6 runs: at most 2.2e-6 in these cases, median 2e-7)."""
    hf, path, m = llama
    ids = _ids(N * 100 + L, (N, L))
    out = m(ids)
    ref = _hf(hf, ids).logits.numpy()
    hf64 = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float64, attn_implementation="sdpa").eval()
    with _true_fp64():
        exact = _hf(hf64, ids).logits.numpy()
    assert out.logits.shape == (N, L, VOCAB) and out.logits.dtype == np.float32
    assert np.abs(ref).max() > 0.5  # not trivially small numbers
    assert np.abs(ref - exact).max() < 3e-5  # transformers' own error stays small: the slack below is too
    sensitivity = _rounding_sensitivity(hf64, ids, exact)
    assert sensitivity.max() < 1e-5  # the slack it adds stays small
    tol = 1e-5 + 1e-6 * np.abs(ref) + np.abs(ref - exact) + 4 * sensitivity + 1e-12
    np.testing.assert_array_less(np.abs(out.logits - ref), tol)
    keep = m(ids, logits_to_keep=1).logits[:, 0]
    np.testing.assert_array_less(np.abs(keep - ref[:, -1]), tol[:, -1], err_msg="logits_to_keep=1")


def test_fp64_matches_hf_in_fp64(llama):
    hf, path, _ = llama
    m = tc.LlamaForCausalLM.from_pretrained(path, dtype=np.float64)
    hf64 = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float64, attn_implementation="sdpa").eval()
    ids = _ids(5, (3, 11))
    with _true_fp64():
        ref = _hf(hf64, ids).logits.numpy()
        am = np.ones((3, 11), np.int64)
        am[1, :4] = 0
        am[2, 8:] = 0  # left and right padding
        pos = np.maximum(np.cumsum(am, axis=1) - 1, 0)
        ref_pad = _hf(hf64, ids, attention_mask=torch.from_numpy(am), position_ids=torch.from_numpy(pos)).logits.numpy()
    out = m(ids)
    assert out.logits.dtype == np.float64
    assert_close(out.logits, ref, np.float64, what="fp64 logits")
    real = am.astype(bool)
    assert_close(m(ids, attention_mask=am).logits[real], ref_pad[real], np.float64, what="fp64 padded logits")
    cache = m.new_cache(3)
    m(ids[:, :6], past_key_values=cache, use_cache=True)
    step = m(ids[:, 6:], past_key_values=cache, use_cache=True)
    assert_close(step.logits, ref[:, 6:], np.float64, what="fp64 cached decoding")


def test_base_model_hidden_states_and_names(llama):
    hf_lm, path, ours_lm = llama
    hf = transformers.LlamaModel.from_pretrained(path, attn_implementation="sdpa").eval()
    ours = tc.LlamaModel.from_pretrained(path)
    ids = _ids(3, (2, 10))
    hidden, cache = ours(ids)
    assert cache.length == 10  # use_cache=None: the config's (True), as Hugging Face's
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)).last_hidden_state.numpy()
    assert_close(hidden, ref, np.float32, what="LlamaModel hidden states")
    # the names in Hugging Face's order (a layer's q, k, v, o with their biases, mlp, then the norms;
    # the norms came first), so are the parameters
    assert list(ours.state_dict()) == list(hf.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in hf.named_parameters()]
    assert list(ours_lm.state_dict()) == [n for n in hf_lm.state_dict()
                                          if not (n == "lm_head.weight" and hf_lm.config.tie_word_embeddings)]
    for name, value in ours_lm.state_dict().items():  # every weight equals the checkpoint's
        np.testing.assert_array_equal(value, hf_lm.state_dict()[name].numpy(), err_msg=name)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_matches_unpadded(llama, side):
    hf, _, m = llama
    lengths = [9, 4, 6]
    L = max(lengths)
    ids = _ids(41, (3, L))
    am = np.zeros((3, L), np.int64)
    for n, k in enumerate(lengths):
        if side == "left":
            am[n, L - k:] = 1
        else:
            am[n, :k] = 1
    out = m(ids, attention_mask=am)
    real = am.astype(bool)
    assert np.all(np.isfinite(out.logits))
    for n in range(3):
        alone = m(ids[n:n + 1, real[n]]).logits[0]
        assert_close(out.logits[n, real[n]], alone, np.float32, what=f"{side}-padded row {n}")
    pos = np.maximum(np.cumsum(am, axis=1) - 1, 0)
    ref = _hf(hf, ids, attention_mask=torch.from_numpy(am), position_ids=torch.from_numpy(pos)).logits.numpy()
    assert_close(out.logits[real], ref[real], np.float32, what=f"{side}-padded vs HF")


# ------------------------------------------------------------------------------------ decoding
def test_cache_decoding_equals_recomputation(llama):
    hf, _, m = llama
    N, P, steps = 2, 5, 12
    ids = _ids(99, (N, P + steps))
    cache = m.new_cache(N)
    assert cache.length == 0 and len(cache) == hf.config.num_hidden_layers
    assert cache.num_key_value_heads == hf.config.num_key_value_heads
    out = m(ids[:, :P], past_key_values=cache, use_cache=True)
    assert out.past_key_values is cache and cache.length == P
    cap = cache.capacity
    for t in range(P, P + steps):
        out = m(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        assert cache.length == t + 1
        assert cache.capacity == (cap if t + 1 <= cap else max(2 * cap, t + 1))
        cap = cache.capacity
        full = m(ids[:, :t + 1]).logits[:, -1]
        assert_close(out.logits[:, 0], full, np.float32, what=f"cache step {t}")
    assert_close(out.logits[:, 0], _hf(hf, ids).logits.numpy()[:, -1], np.float32, what="last step vs HF")


def test_cache_crop_and_regrow(llama_gqa):
    _, _, m = llama_gqa
    ids = _ids(7, (1, 20))
    cache = m.new_cache(1)
    m(ids[:, :15], past_key_values=cache, use_cache=True)
    cache.crop(8)
    assert cache.length == 8
    out = m(ids[:, 8:12], past_key_values=cache, use_cache=True)
    assert cache.length == 12
    assert_close(out.logits, m(ids[:, :12]).logits[:, 8:], np.float32, what="after crop")
    with pytest.raises(ValueError, match="length"):
        cache.crop(13)
    with pytest.raises(TypeError, match="length"):
        cache.crop(1.5)


def test_cache_keys_match_hf(llama_gqa):
    hf, _, m = llama_gqa
    ids = _ids(4, (2, 9))
    legacy = m(ids, use_cache=True).past_key_values.to_legacy()
    ref = _hf(hf, ids, use_cache=True).past_key_values
    for i, (k, v) in enumerate(legacy):
        assert k.shape == (2, hf.config.num_key_value_heads, 9, hf.config.head_dim)
        assert_close(k, ref.layers[i].keys.numpy(), np.float32, what=f"layer {i} keys (after RoPE)")
        assert_close(v, ref.layers[i].values.numpy(), np.float32, what=f"layer {i} values")


@pytest.mark.parametrize("N,L", [(1, 1), (1, 6), (3, 4)], ids=["N1L1", "N1L6", "N3L4"])
def test_greedy_generate_matches_hf(llama, N, L):
    hf, _, m = llama
    ids = _ids(17 + N + L, (N, L))
    ours = m.generate(ids, max_new_tokens=16)
    with torch.no_grad():
        ref = hf.generate(torch.from_numpy(ids), max_new_tokens=16, do_sample=False, pad_token_id=0).numpy()
    np.testing.assert_array_equal(ours, ref)


def test_generate_left_padded_batch_equals_each_prompt(llama_gqa):
    _, _, m = llama_gqa
    prompts = [_ids(51, (1, 8))[0], _ids(52, (1, 3))[0], _ids(53, (1, 5))[0]]
    L = max(len(p) for p in prompts)
    ids = np.zeros((3, L), np.int64)
    am = np.zeros((3, L), np.int64)
    for n, p in enumerate(prompts):
        ids[n, L - len(p):], am[n, L - len(p):] = p, 1
    batched = m.generate(ids, max_new_tokens=10, attention_mask=am)
    for n, p in enumerate(prompts):
        np.testing.assert_array_equal(batched[n, L:], m.generate(p[None], max_new_tokens=10)[0, len(p):])


def _left_padded_with_repeats(m, prompts, penalty, new):
    """``prompts`` left-padded into one batch whose pad ids are each row's own tokens generated
    alone (so a penalty on the padding changes the result), the mask, and those generations."""
    alone = [m.generate(p[None], max_new_tokens=new, repetition_penalty=penalty)[0, len(p):] for p in prompts]
    L = max(len(p) for p in prompts) + 3
    ids = np.zeros((len(prompts), L), np.int64)
    am = np.zeros((len(prompts), L), np.int64)
    for n, p in enumerate(prompts):
        ids[n, :L - len(p)] = np.resize(alone[n], L - len(p))
        ids[n, L - len(p):], am[n, L - len(p):] = p, 1
    return ids, am, alone


@pytest.mark.parametrize("penalty", [0.8, 1.3, 1e3])
def test_repetition_penalty_skips_left_padding_as_hf(llama_gqa, penalty):
    """The repetition penalty counted the ids of the left padding: a padded row's tokens differed
    from HF's generate with the same mask (which ignores each row's leading masked positions) and
    from the prompt generated alone."""
    hf, _, m = llama_gqa
    prompts = [_ids(61, (1, 9))[0], _ids(62, (1, 2))[0], _ids(63, (1, 6))[0], _ids(64, (1, 1))[0]]
    ids, am, alone = _left_padded_with_repeats(m, prompts, penalty, 10)
    ours = m.generate(ids, max_new_tokens=10, attention_mask=am, repetition_penalty=penalty, pad_token_id=0)
    with torch.no_grad():
        ref = hf.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(am), max_new_tokens=10,
                          do_sample=False, repetition_penalty=penalty, pad_token_id=0).numpy()
    np.testing.assert_array_equal(ours, ref)
    for n in range(len(prompts)):
        np.testing.assert_array_equal(ours[n, ids.shape[1]:], alone[n], err_msg=f"row {n}")


def test_repetition_penalty_counts_a_gap_in_the_mask_as_hf(llama_gqa):
    """Only the positions before a row's first real token are skipped (HF's generate:
    ``(attention_mask != 0).argmax(1)``); a masked position after it still counts."""
    hf, _, m = llama_gqa
    ids = _ids(66, (2, 8))
    am = np.ones((2, 8), np.int64)
    am[0, :2] = am[0, 4] = am[1, 5] = 0
    ids[0, 4] = ids[0, 1] = m.generate(ids[:1], max_new_tokens=1, attention_mask=am[:1])[0, -1]
    ids[1, 5] = m.generate(ids[1:], max_new_tokens=1, attention_mask=am[1:])[0, -1]
    ours = m.generate(ids, max_new_tokens=6, attention_mask=am, repetition_penalty=1e3)
    with torch.no_grad():
        ref = hf.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(am), max_new_tokens=6,
                          do_sample=False, repetition_penalty=1e3, pad_token_id=0).numpy()
    np.testing.assert_array_equal(ours, ref)


def test_sampled_repetition_penalty_skips_left_padding(llama_gqa):
    """Sampling with a penalty: one left-padded row draws the same tokens as its prompt alone
    (one row: the same generator draws)."""
    _, _, m = llama_gqa
    prompt = _ids(65, (1, 4))[0]
    opts = dict(max_new_tokens=10, repetition_penalty=5.0, do_sample=True, temperature=0.5, top_k=5, seed=7)
    ids, am, _ = _left_padded_with_repeats(m, [prompt], 5.0, 10)
    ids[0, :3] = m.generate(prompt[None], **opts)[0, 4:7]  # the pads: the sampled tokens themselves
    alone = m.generate(prompt[None], **opts)
    np.testing.assert_array_equal(m.generate(ids, attention_mask=am, **opts)[0, ids.shape[1]:], alone[0, 4:])


def test_generate_options(llama_gqa):
    hf, _, m = llama_gqa
    ids = _ids(2, (2, 4))
    # repetition penalty: as HF's RepetitionPenaltyLogitsProcessor (greedy)
    ours = m.generate(ids, max_new_tokens=12, repetition_penalty=1.7)
    with torch.no_grad():
        ref = hf.generate(torch.from_numpy(ids), max_new_tokens=12, do_sample=False, repetition_penalty=1.7,
                          pad_token_id=0).numpy()
    np.testing.assert_array_equal(ours, ref)
    # stop ids (several), padding of finished rows, streaming
    greedy = m.generate(ids, max_new_tokens=12)
    stop = [int(greedy[0, 6]), int(greedy[1, 9])]
    streamed = []
    out = m.generate(ids, max_new_tokens=12, eos_token_id=stop, pad_token_id=0, streamer=streamed.append)
    for n in range(2):
        new = greedy[n, 4:]
        end = int(np.argmax(np.isin(new, stop)))
        np.testing.assert_array_equal(out[n, 4:4 + end + 1], new[:end + 1])
        assert np.all(out[n, 4 + end + 1:] == 0)
    np.testing.assert_array_equal(np.stack(streamed, axis=1), out[:, 4:])
    assert list(m.stream(ids[:1], 3))[0].shape == (1,)
    # a 0-d array is one id, as an int (it raised a bare "iteration over a 0-d array")
    np.testing.assert_array_equal(m.generate(ids, max_new_tokens=12, eos_token_id=np.array(stop[0]), pad_token_id=0),
                                  m.generate(ids, max_new_tokens=12, eos_token_id=stop[0], pad_token_id=0))
    # sampling: reproducible with a seed, top_k=1 is greedy
    a = m.generate(ids, max_new_tokens=8, do_sample=True, seed=3, temperature=1.3, top_p=0.9)
    np.testing.assert_array_equal(a, m.generate(ids, max_new_tokens=8, do_sample=True, seed=3, temperature=1.3,
                                                top_p=0.9))
    np.testing.assert_array_equal(m.generate(ids, max_new_tokens=8, do_sample=True, top_k=1, seed=1),
                                  greedy[:, :12])


def _with_config(src, dst, **fields):
    """A copy of the checkpoint directory ``src`` at ``dst`` with ``fields`` set in its
    ``config.json`` and ``generation_config.json`` (when their keys end in ``_token_id``)."""
    shutil.copytree(src, dst)
    for name in ("config.json", "generation_config.json"):
        path = dst / name
        if path.is_file():
            update = fields if name == "config.json" else {k: v for k, v in fields.items() if k.endswith("_token_id")}
            path.write_text(json.dumps({**json.loads(path.read_text()), **update}))
    return dst


def test_generate_pads_finished_rows_with_config_pad_token_id(llama_gqa, tmp_path):
    """A config with eos_token_id and pad_token_id: a finished row is filled with pad_token_id, as HF's
    generate does (not with the end id); an explicit pad_token_id still wins."""
    _, path, m = llama_gqa
    path, ids, end = assert_generate_pads_with_config_pad_token_id(
        m, _ids(2, (2, 4)), lambda **ids: _with_config(path, tmp_path / "llama_eos_pad", **ids),
        tc.LlamaForCausalLM, transformers.LlamaForCausalLM)
    explicit = tc.LlamaForCausalLM.from_pretrained(path).generate(ids, max_new_tokens=12, pad_token_id=0)
    assert np.all(explicit[0, end + 1:] == 0)


@pytest.mark.parametrize("scaled", ["rope_scaling", "rope_parameters"])
def test_rope_scaling_refused_in_either_key(llama_gqa, tmp_path, scaled):
    """Hugging Face applies a RoPE scaling in rope_scaling even beside a default rope_parameters (and
    one in rope_parameters when rope_scaling is absent): each key is checked, so a scaling in either
    is refused, not ignored."""
    _, path, _ = llama_gqa
    linear = {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    default = {"rope_type": "default", "rope_theta": 10000.0}
    other = "rope_parameters" if scaled == "rope_scaling" else "rope_scaling"
    with pytest.raises(ValueError, match=f"{scaled}.*rope_type 'linear'"):
        tc.LlamaConfig.from_dict({scaled: linear, other: default})
    with pytest.raises(ValueError, match=f"{scaled}.*rope_type 'linear'"):
        tc.LlamaConfig.from_dict({scaled: {"type": "linear", "factor": 4.0}, other: None})
    # both default: rope_theta as HF reads it (a non-empty rope_scaling in place of rope_parameters)
    for d in ({scaled: default, other: None},
              {"rope_scaling": {"rope_type": "default"}, "rope_theta": 300.0,
               "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
              {"rope_scaling": {"rope_type": "default", "rope_theta": 700.0},
               "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
              {"rope_scaling": {}, "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}}):
        hf_theta = transformers.LlamaConfig.from_dict(json.loads(json.dumps(d))).rope_parameters["rope_theta"]
        assert tc.LlamaConfig.from_dict(d).rope_theta == hf_theta
    # a checkpoint whose config.json has both (HF applies a linear rope_scaling): refused
    path = _with_config(path, tmp_path / "llama_rope", **{scaled: linear, other: default})
    if scaled == "rope_scaling":
        assert transformers.LlamaConfig.from_pretrained(path).rope_parameters["rope_type"] == "linear"
    with pytest.raises(ValueError, match=f"{scaled}.*rope_type 'linear'"):
        tc.LlamaForCausalLM.from_pretrained(path)


def test_cache_of_another_dtype_refused(llama_gqa):
    """A float64 KVCache given to a float32 model: TypeError naming past_key_values and both dtypes
    (not pybind's "incompatible function arguments"), the cache untouched."""
    _, _, m = llama_gqa
    ids = _ids(0, (1, 3))
    cache = tc.KVCache(m.config.num_layers, 1, m.config.num_kv_heads, m.head_dim, dtype=np.float64)
    with pytest.raises(TypeError, match="past_key_values.*float32.*got float64"):
        m(ids, past_key_values=cache, use_cache=True)
    with pytest.raises(TypeError, match="past_key_values.*float32.*got float64"):
        m.generate(ids, max_new_tokens=2, past_key_values=cache)
    assert cache.length == 0


# --------------------------------------------------------------------------------------- bad input
def test_bad_input(llama_gqa, tmp_path):
    _, path, m = llama_gqa
    with pytest.raises(ValueError, match="input_ids"):
        m(np.array([[1, VOCAB]]))
    with pytest.raises(ValueError, match="input_ids.*max_position_embeddings"):
        m(_ids(0, (1, 65)))
    with pytest.raises(ValueError, match="max_new_tokens"):
        m.generate(_ids(0, (1, 60)), max_new_tokens=6)  # 60 + 6 - 1 > 64
    with pytest.raises(ValueError, match="position_ids"):
        m(_ids(0, (1, 3)), position_ids=np.array([[0, 1, 64]]))
    with pytest.raises(ValueError, match="attention_mask"):
        m(_ids(0, (2, 5)), attention_mask=np.ones((2, 4), np.int64))
    with pytest.raises(ValueError, match="past_key_values"):
        m(_ids(0, (2, 5)), past_key_values=m.new_cache(3))
    with pytest.raises(ValueError, match="logits_to_keep"):
        m(_ids(0, (1, 3)), logits_to_keep=4)
    with pytest.raises(ValueError, match="logits_to_keep"):
        m(_ids(0, (1, 3)), logits_to_keep=-1)
    with pytest.raises(TypeError, match="top_k"):
        m.generate(_ids(0, (1, 3)), max_new_tokens=2, do_sample=True, top_k=2.7)
    with pytest.raises(ValueError, match="repetition_penalty"):
        m.generate(_ids(0, (1, 3)), max_new_tokens=2, repetition_penalty=0.0)
    # configs
    with pytest.raises(ValueError, match="rope_type"):
        tc.LlamaConfig.from_dict({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(ValueError, match="num_attention_heads|num_kv_heads|num_key_value_heads"):
        tc.LlamaForCausalLM(tc.LlamaConfig(vocab_size=10, hidden_size=12, intermediate_size=8, num_hidden_layers=1,
                                           num_attention_heads=4, num_key_value_heads=3))
    with pytest.raises(TypeError, match="hidden_size"):
        tc.LlamaForCausalLM(tc.LlamaConfig(hidden_size="8"))
    with pytest.raises(ValueError, match="rms_norm_eps"):
        tc.LlamaForCausalLM(tc.LlamaConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                           num_attention_heads=2, rms_norm_eps=-1.0))


@pytest.mark.parametrize("ignore_index", [2**63, -2**63 - 1, np.uint64(2**63)], ids=["2**63", "-2**63-1", "u64"])
def test_loss_ignore_index_outside_int64_refused(llama_gqa, ignore_index):
    """An ignore_index outside int64 (the targets' dtype) raised a bare OverflowError; now a
    ValueError naming it, as functional.cross_entropy's. The int64 extremes still work (as torch's
    loss with no label ignored)."""
    hf, _, m = llama_gqa
    ids = _ids(70, (2, 6))
    with pytest.raises(ValueError, match="ignore_index"):
        m.loss(ids, ids, ignore_index=ignore_index)
    with pytest.raises(TypeError, match="ignore_index"):
        m.loss(ids, ids, ignore_index=True)
    ref = float(_hf(hf, ids, labels=torch.from_numpy(ids)).loss)
    for edge in (2**63 - 1, -2**63, np.int64(-2**63)):
        assert_close(m.loss(ids, ids, ignore_index=edge), ref, atol_=1e-5, rtol_=1e-5,
                     what=f"loss, ignore_index={edge}")
    labels = ids.copy()
    labels[:, :3] = 2**63 - 1  # ignored: as HF's loss with those labels at -100
    ref = float(_hf(hf, ids, labels=torch.from_numpy(np.where(labels == 2**63 - 1, -100, labels))).loss)
    assert_close(m.loss(ids, labels, ignore_index=2**63 - 1), ref, atol_=1e-5, rtol_=1e-5,
                 what="loss, ignored labels")


# ------------------------------------------------------- generate at the context limit, legacy caches
def _hf_greedy(hf, ids, max_new_tokens):
    with torch.no_grad():
        return hf.generate(torch.from_numpy(ids), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                           max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0).numpy()



# Run in a fresh interpreter: the growth of its resident memory's high-water mark (VmHWM, kB) over
# a generate and over a prompt's step into a reserved cache, and what they computed.
_RESIDENT_GROWTH = textwrap.dedent("""
    import ctypes, gc, json, sys
    import numpy as np, transformer_core as tc

    def status_kb(key):
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key))

    def reset_high_water():
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:  # 5: VmHWM starts again from VmRSS
            f.write("5")
        return status_kb("VmRSS")

    path, out_file, new, eos = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ids = np.array(json.loads(sys.argv[5]))
    m = tc.LlamaForCausalLM.from_pretrained(path)
    m.generate(ids, 2)  # one-time buffers (rotary tables, workspaces) before the measures
    before = reset_high_water()
    tokens = m.generate(ids, new, eos_token_id=eos)
    generate_kb = status_kb("VmHWM") - before
    before = reset_high_water()
    cache = m.new_cache(1, new)
    m(ids, past_key_values=cache)
    step_kb = status_kb("VmHWM") - before
    np.savez(out_file, tokens=tokens, **{f"k{i}": k for i, (k, _) in enumerate(cache.to_legacy())},
             **{f"v{i}": v for i, (_, v) in enumerate(cache.to_legacy())})
    print(json.dumps({"generate_kb": generate_kb, "step_kb": step_kb, "capacity": cache.capacity}))
""")


def test_reserved_kv_cache_is_resident_only_where_written(tmp_path):
    """generate reserves the KV cache for prompt + max_new_tokens - 1 positions, and the cache
    zero-filled all of it: stopped by its end token after a few, a generate with max_new_tokens = 60000
    held 60 MB (HF's DynamicCache holds what was made). The reservation is address space now, resident
    only as written: measured in a fresh process (VmHWM), generate and a prompt's step into a cache of
    60000 positions grow by far less than the 60 MB, and give HF's tokens and keys and values (bitwise
    those of a cache of the prompt's size)."""
    import subprocess
    import sys
    from pathlib import Path

    cfg = transformers.LlamaConfig(vocab_size=VOCAB, max_position_embeddings=1 << 16, rms_norm_eps=1e-5,
                                   initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                   hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=4, attn_implementation="sdpa")
    torch.manual_seed(5)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path / "model", safe_serialization=True)
    m = tc.LlamaForCausalLM.from_pretrained(tmp_path / "model")
    ids, new = _ids(3, (1, 5)), 60_000
    per_position = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * m.head_dim * 4  # keys and values, fp32
    made = m.generate(ids, 8)[0, 5:]
    eos = int(made[-1])  # the end token: the generation stops where it first makes it
    stop = list(made).index(eos) + 1
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(tc.__file__).parent.parent), env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, "-c", _RESIDENT_GROWTH, str(tmp_path / "model"), str(tmp_path / "out.npz"),
                          str(new), str(eos), json.dumps(ids.tolist())],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    grown = json.loads(run.stdout)
    reserved_kb = new * per_position // 1024
    assert grown["capacity"] == new and reserved_kb > 50_000
    # written: a page per (layer, keys or values, head) at least, 64 kB here; the bound leaves the
    # rest of the process room and still fails when the reservation is resident
    assert grown["generate_kb"] < reserved_kb / 4, grown
    assert grown["step_kb"] < reserved_kb / 4, grown
    got = np.load(tmp_path / "out.npz")
    np.testing.assert_array_equal(got["tokens"], _hf_greedy(hf, ids, 8)[:, :5 + stop])
    assert got["tokens"].shape == (1, 5 + stop)
    small = m(ids, use_cache=True).past_key_values.to_legacy()
    ref = _hf(hf, ids, use_cache=True).past_key_values
    for i, (k, v) in enumerate(small):
        np.testing.assert_array_equal(got[f"k{i}"], k)
        np.testing.assert_array_equal(got[f"v{i}"], v)
        assert_close(k, ref.layers[i].keys.numpy(), np.float32, what=f"layer {i} keys")
        assert_close(v, ref.layers[i].values.numpy(), np.float32, what=f"layer {i} values")


@pytest.mark.parametrize("L, new", [(64, 1), (61, 4)])
def test_generate_at_exactly_the_context_limit_matches_hf(llama, L, new):
    """L + new - 1 == max_position_embeddings (64): the last new token is not fed back, so it fits,
    as in HF's generate (the old check L + new > 64 refused it)."""
    hf, _, m = llama
    ids = _ids(L, (2, L))
    ref = _hf_greedy(hf, ids, new)
    assert ref.shape == (2, L + new)
    np.testing.assert_array_equal(m.generate(ids, new), ref)
    np.testing.assert_array_equal(np.stack(list(m.stream(ids, new)), axis=1), ref[:, L:])
    with pytest.raises(ValueError, match=f"^max_new_tokens: prompt length {L} \\+ {new + 1} exceeds"):
        m.generate(ids, new + 1)
    with pytest.raises(ValueError, match=r"^input_ids: prompt length 65 exceeds the context "
                                         r"\(max_position_embeddings = 64\)"):
        m.generate(_ids(0, (1, 65)), 1)


def test_generate_with_legacy_tuple_cache_matches_hf(llama):
    """A legacy tuple of (N, H_kv, S, D) pairs (GQA / MQA too) as generate's past_key_values, as forward
    takes it; HF's own tuple of the prefix works as well."""
    hf, _, m = llama
    ids = _ids(5, (2, 9))
    ref = _hf_greedy(hf, ids, 7)
    legacy = m(ids[:, :5], use_cache=True).past_key_values.to_legacy()
    np.testing.assert_array_equal(m.generate(ids, 7, past_key_values=legacy), ref)
    hf_past = _hf(hf, ids[:, :3], use_cache=True).past_key_values
    hf_legacy = tuple((layer.keys, layer.values) for layer in hf_past.layers)
    np.testing.assert_array_equal(m.generate(ids, 7, past_key_values=hf_legacy), ref)
    with pytest.raises(TypeError, match="^past_key_values: expected None, a KVCache or"):
        m.generate(ids, 7, past_key_values=hf_past)  # HF's DynamicCache object itself is not ours


def test_rope_of_hf_rotary_embedding_per_row_positions(llama_gqa):
    """apply_rotary_pos_emb on this model's own LlamaRotaryEmbedding output (N, L, D) for left-padded
    position ids: HF's apply_rotary_pos_emb, with N == H_kv (2) and N != H (6)."""
    from transformer_core import positional as P

    hf, _, m = llama_gqa
    N, L, D = 2, 6, m.head_dim
    position_ids = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
    rng = np.random.default_rng(0)
    q = rng.standard_normal((N, hf.config.num_attention_heads, L, D)).astype(np.float32)
    k = rng.standard_normal((N, hf.config.num_key_value_heads, L, D)).astype(np.float32)
    with torch.no_grad():
        cos, sin = hf.model.rotary_emb(torch.from_numpy(q), position_ids)
        rq, rk = modeling_llama.apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(k), cos, sin)
    q_rot, k_rot = P.apply_rotary_pos_emb(q, k, cos.numpy(), sin.numpy())
    assert_close(q_rot, rq, np.float32)
    assert_close(k_rot, rk, np.float32)


def test_interleaved_model_converts_legacy_caches_to_and_from_hf_order(llama_gqa):
    """A model of rope_layout="interleaved" (how a GGUF file loads) holds each head's key dims in
    llama.cpp's order: Hugging Face's legacy tuple is reordered on the way in (the cached prefix was
    scored against mis-ordered keys) and ``to_legacy`` gives HF's order back; a KVCache of the other
    layout is refused rather than misread."""
    hf, _, m = llama_gqa
    inter = tc.LlamaForCausalLM(m.config, rope_layout="interleaved")
    inter.load_state_dict(m.state_dict())
    ids = _ids(5, (2, 9))
    ref = _hf_greedy(hf, ids, 5)
    hf_past = _hf(hf, ids[:, :4], use_cache=True).past_key_values
    hf_legacy = tuple((layer.keys, layer.values) for layer in hf_past.layers)
    np.testing.assert_array_equal(inter.generate(ids, 5, past_key_values=hf_legacy), ref)
    assert_close(inter(ids[:, 4:], past_key_values=hf_legacy).logits, _hf(hf, ids).logits.numpy()[:, 4:],
                 np.float32, what="logits after HF's legacy cache")
    cache = inter(ids[:, :4], use_cache=True).past_key_values
    assert cache.key_order is not None and m.new_cache(1).key_order is None
    for i, (k, v) in enumerate(cache.to_legacy()):
        assert_close(k, hf_past.layers[i].keys.numpy(), np.float32, what=f"layer {i} keys in HF's order")
        assert_close(v, hf_past.layers[i].values.numpy(), np.float32, what=f"layer {i} values")
    np.testing.assert_array_equal(m.generate(ids, 5, past_key_values=cache.to_legacy()), ref)
    for a, b in ((inter, m), (m, inter)):
        other = b(ids[:, :4], use_cache=True).past_key_values
        with pytest.raises(ValueError, match="^past_key_values: this model's keys hold each head's dims in .* "
                                             r"use model.new_cache\(...\)"):
            a(ids[:, 4:], past_key_values=other)
        assert other.length == 4
    wrong = tc.KVCache(m.config.num_layers, 2, m.config.num_kv_heads, m.head_dim + 2)
    with pytest.raises(ValueError, match="^past_key_values: a cache of 2 key/value heads of width 10 does not fit"):
        m.generate(ids, 2, past_key_values=wrong)
    with pytest.raises(ValueError, match=r"^key_order: expected a permutation of range\(8\)"):
        tc.KVCache(1, 1, 1, 8, key_order=[0, 1, 2])
    with pytest.raises(TypeError, match="^key_order: expected integers"):
        tc.KVCache(1, 1, 1, 2, key_order=[0.0, 1.0])


def test_stream_checks_ids_before_reserving_the_cache(llama_gqa):
    """An id outside the vocabulary is refused when stream/generate is called, naming its index in
    input_ids, before a cache is made or a caller's cache grows."""
    _, _, m = llama_gqa
    ids = _ids(1, (1, 5))
    ids[0, 2] = VOCAB + 3
    with pytest.raises(ValueError, match=rf"^input_ids: id {VOCAB + 3} at flat index 2 is outside the vocabulary"):
        m.stream(ids, 40)
    cache = m(ids[:, :2] % VOCAB, use_cache=True).past_key_values
    capacity = cache.capacity
    with pytest.raises(ValueError, match="^input_ids: id"):
        m.generate(ids, 40, past_key_values=cache)
    assert cache.capacity == capacity and cache.length == 2
    with pytest.raises(ValueError, match="^input_ids: id -1 at flat index 0"):
        m.generate(np.array([[-1, 3]]), 2)


def test_forward_checks_before_growing_or_making_a_cache(llama_gqa, monkeypatch):
    """forward grew the caller's cache (reserve) before the C++ step refused an id outside the
    vocabulary, and without a cache made one of the batch's size before checking the mask and the
    positions. Every check now runs first: a refused call leaves the cache's length and capacity
    as they were, and makes none; an accepted one still matches Hugging Face."""
    hf, _, m = llama_gqa
    ids = _ids(3, (2, 8))
    cache = m.new_cache(2)
    m(ids[:, :6], past_key_values=cache, use_cache=True)
    before = (cache.length, cache.capacity)
    assert before == (6, 6)
    for kwargs, pattern in [
        (dict(input_ids=np.array([[1, 2], [3, 500]])), r"^input_ids: id 500 at flat index 3 is outside \[0, 97\)"),
        (dict(input_ids=np.array([[1, -2], [3, 4]])), r"^input_ids: id -2 at flat index 1 is outside \[0, 97\)"),
        (dict(input_ids=ids[:, 6:], attention_mask=np.ones((2, 7))), r"^attention_mask: expected shape \(2, 8\)"),
        (dict(input_ids=ids[:, 6:], position_ids=np.full((2, 2), 64)), r"^position_ids: expected positions in"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            m(past_key_values=cache, use_cache=True, **kwargs)
        assert (cache.length, cache.capacity) == before, kwargs
    made = []
    new_cache = m.new_cache
    monkeypatch.setattr(m, "new_cache", lambda *a: made.append(a) or new_cache(*a))
    for kwargs in (dict(input_ids=np.array([[1, 97]])), dict(input_ids=ids, attention_mask=np.ones((2, 7))),
                   dict(input_ids=ids, position_ids=np.full((2, 8), -1))):
        with pytest.raises(ValueError):
            m(**kwargs)
    assert made == []
    out = m(ids[:, 6:], past_key_values=cache, use_cache=True).logits
    assert (cache.length, cache.capacity) == (8, 12)
    assert_close(out, _hf(hf, ids).logits.numpy()[:, 6:], np.float32, what="logits after the refused calls")


def test_legacy_cache_of_a_bad_pair_names_its_length(llama_gqa):
    """A layer given as a 3-tuple was reported as "got tuple": the length is named."""
    _, _, m = llama_gqa
    legacy = m(_ids(4, (1, 3)), use_cache=True).past_key_values.to_legacy()
    k, v = legacy[0]
    with pytest.raises(ValueError, match=r"^past_key_values\[0\]: expected a \(keys, values\) pair, got a tuple of 3$"):
        m(_ids(5, (1, 2)), past_key_values=((k, v, v),) + legacy[1:])
    with pytest.raises(ValueError, match=r"^past_key_values\[1\]: expected a \(keys, values\) pair, got a list of 1$"):
        m(_ids(5, (1, 2)), past_key_values=(legacy[0], [k]))
    with pytest.raises(ValueError, match=r"^past_key_values\[0\]: expected a \(keys, values\) pair, got ndarray$"):
        tc.KVCache.from_legacy((k,), 2, m.head_dim)


# ------------------------------------------------------------------- load_state_dict: names, tied head
@pytest.mark.parametrize("cls", ["LlamaForCausalLM", "LlamaModel"])
def test_unknown_keys_reported_under_the_names_given(llama_gqa, cls):
    """load_state_dict reports the keys it has no weight for under the names the caller passed, as
    torch's does (it reported 'model.score.weight' and 'model.extra' for 'score.weight' and 'extra',
    names not in the dict given), with strict=False and in strict=True's error."""
    hf_lm, path, _ = llama_gqa
    hf = hf_lm if cls == "LlamaForCausalLM" else hf_lm.model
    m = getattr(tc, cls).from_pretrained(path)
    extras = {"score.weight": torch.zeros(2, 48), "extra": torch.zeros(1), "model.extra2": torch.zeros(1)}
    given = {**hf.state_dict(), **extras}
    ref = type(hf)(hf.config).load_state_dict(given, strict=False)
    r = m.load_state_dict({k: v.numpy() for k, v in given.items()}, strict=False)
    assert r.missing_keys == []
    assert r.unexpected_keys == list(extras) and set(r.unexpected_keys) == set(ref.unexpected_keys)
    assert all(k in given for k in r.unexpected_keys)
    with pytest.raises(ValueError, match=r"unknown keys: \['score.weight', 'extra', 'model.extra2'\]"):
        m.load_state_dict({k: v.numpy() for k, v in given.items()})
    # the alternative names still load (no model. prefix for the LM; model. prefix for the base model)
    alt = {(k.removeprefix("model.") if cls == "LlamaForCausalLM" else "model." + k): v.numpy()
           for k, v in hf.state_dict().items()}
    assert m.load_state_dict(alt).missing_keys == []
    # an alternative name given beside the exact one is not loaded over it: it is reported as given
    exact = {k: v.numpy() for k, v in hf.state_dict().items()}
    name = "model.norm.weight" if cls == "LlamaForCausalLM" else "norm.weight"
    other = "norm.weight" if cls == "LlamaForCausalLM" else "model.norm.weight"
    r = m.load_state_dict({**exact, other: np.zeros_like(exact[name])}, strict=False)
    assert r.unexpected_keys == [other]
    np.testing.assert_array_equal(m.state_dict()[name], exact[name])


def test_tied_head_as_hf_or_refused_as_gpt2(tmp_path_factory):
    """tie_word_embeddings=True: lm_head.weight IS model.embed_tokens.weight. Given without it
    (strict=False), it loads into it, as HF's LlamaForCausalLM (whose lm_head and embed_tokens are
    one parameter) does; it was dropped, reported nowhere. Given beside it and different, it is
    refused naming lm_head.weight, as GPT-2's (HF silently keeps whichever it copies last; it was
    dropped under strict=True)."""
    hf, path = _build(tmp_path_factory, "mha_tied")
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    head = torch.from_numpy(0.2 * np.random.default_rng(5).standard_normal((VOCAB, 32)).astype(np.float32))
    hf2 = transformers.LlamaForCausalLM(hf.config).eval()
    hf2.load_state_dict(hf.state_dict())
    ref = hf2.load_state_dict({"lm_head.weight": head}, strict=False)
    assert ref.unexpected_keys == [] and torch.equal(hf2.model.embed_tokens.weight, head)
    m = tc.LlamaForCausalLM.from_pretrained(path)
    r = m.load_state_dict({"lm_head.weight": head.numpy()}, strict=False)
    assert r.unexpected_keys == [] and "model.embed_tokens.weight" not in r.missing_keys
    np.testing.assert_array_equal(m.state_dict()["model.embed_tokens.weight"], head.numpy())
    ids = _ids(6, (2, 9))
    assert_close(m(ids).logits, _hf(hf2, ids).logits.numpy(), np.float32, what="tied head loaded logits")
    # a full state dict whose head differs from its embedding: refused, the model unchanged
    before = m(ids).logits
    bad = {k: v.numpy() for k, v in hf.state_dict().items()}
    assert "lm_head.weight" in bad
    bad["lm_head.weight"] = bad["lm_head.weight"] + 1
    for strict in (True, False):
        with pytest.raises(ValueError, match=r"^lm_head.weight: differs from model.embed_tokens.weight .*"
                                             r"tie_word_embeddings"):
            m.load_state_dict(bad, strict=strict)
    np.testing.assert_array_equal(m(ids).logits, before)
    # HF's own state dict (head == embedding) loads as before
    assert m.load_state_dict({k: v.numpy() for k, v in hf.state_dict().items()}).missing_keys == []
    assert_close(m(ids).logits, _hf(hf, ids).logits.numpy(), np.float32, what="tied logits")
    with pytest.raises(ValueError, match=r"^lm_head.weight: expected shape \(97, 32\)"):
        m.load_state_dict({"lm_head.weight": np.zeros((VOCAB, 3), np.float32)}, strict=False)
    with pytest.raises(TypeError, match="lm_head.weight"):
        m.load_state_dict({"lm_head.weight": np.zeros((VOCAB, 32), np.int64)}, strict=False)
    # untied: lm_head.weight is a weight of its own, loaded as given
    hf_u, path_u = _build(tmp_path_factory, "gqa3_untied")
    mu = tc.LlamaForCausalLM.from_pretrained(path_u)
    head_u = np.random.default_rng(6).standard_normal((VOCAB, 48)).astype(np.float32)
    embed = mu.state_dict()["model.embed_tokens.weight"]
    assert mu.load_state_dict({"lm_head.weight": head_u}, strict=False).unexpected_keys == []
    np.testing.assert_array_equal(mu.state_dict()["lm_head.weight"], head_u)
    np.testing.assert_array_equal(mu.state_dict()["model.embed_tokens.weight"], embed)


def test_config_check_refuses_bad_attention_dropout():
    """check() checks every field, attention_dropout too (it was refused only at the first training
    loss)."""
    for bad, error in ((1.5, ValueError), (-0.1, ValueError), ("0.1", TypeError)):
        cfg = tc.LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                             num_attention_heads=2, max_position_embeddings=8, attention_dropout=bad)
        with pytest.raises(error, match="^attention_dropout: expected a probability"):
            cfg.check()
        with pytest.raises(error, match="^attention_dropout: "):
            tc.LlamaForCausalLM(cfg)


def test_sizes_the_model_refuses_name_config_json(tmp_path):
    """A config.json whose heads do not divide hidden_size (each field valid alone): the ValueError
    names the file, before any weight is loaded (it named only the field)."""
    cfg = tc.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16)
    tc.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "num_attention_heads": 3,
                                                             "num_key_value_heads": 3}))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'm' / 'config.json'))}: hidden_size: expected "
                                         r"a multiple of num_attention_heads \(3\), got 16$"):
        tc.LlamaForCausalLM.from_pretrained(tmp_path / "m")


# ------------------------------------------------------------------------------------ GGUF errors name the file
def test_gguf_context_length_costs_no_memory_until_used(tmp_path, monkeypatch):
    """A GGUF may claim any llama.context_length (a 155 KB file claiming 2**26 positions once took
    20 s and 4.4 GB to load: RoPE's tables were built for every position). The tables are now built
    for the first 4,096 positions and grow when a longer sequence runs, so a file claiming 2**40
    loads at once through both loaders (blocks kept, dtype=None; dequantized, np.float32), from a
    "~/" name, and gives the logits of the same file with a context of 256."""
    import gguf
    from gguf_fakes import random_llama_state, write_llama_gguf

    state = random_llama_state(np.random.default_rng(0))
    huge, small = tmp_path / "huge.gguf", tmp_path / "small.gguf"
    write_llama_gguf(huge, state, metadata={"llama.context_length": (2**40, gguf.GGUFValueType.UINT64)})
    write_llama_gguf(small, state)
    monkeypatch.setenv("HOME", str(tmp_path))
    ids = np.array([[1, 5, 9, 2]])
    for dtype in (None, np.float32):
        model = tc.LlamaForCausalLM.from_pretrained("~/huge.gguf", dtype=dtype)
        reference = tc.LlamaForCausalLM.from_pretrained("~/small.gguf", dtype=dtype)
        assert model.source.path == huge and model.config.max_position_embeddings == 2**40
        assert reference.config.max_position_embeddings == 256
        np.testing.assert_array_equal(model(ids).logits, reference(ids).logits)


def test_rotary_tables_beyond_memory_are_refused_when_a_position_needs_them():
    """A context whose two RoPE tables exceed this machine's memory, though one would fit, builds at
    once (the tables start at 4,096 positions); a position that needs them all is refused with a
    ValueError naming position_ids before any allocation (the message was C++'s, naming the tables
    only), and the model still runs at the positions it has. Run under
    an address-space limit, so that a check that let the tables through fails with MemoryError
    instead of exhausting the machine."""
    import subprocess
    import sys

    code = textwrap.dedent("""
        import resource
        import numpy as np
        import transformer_core as tc
        from transformer_core import _core
        D = 16
        P = int(0.6 * _core.physical_memory_bytes() / (4 * D))  # one table: 0.6 of memory, both: 1.2
        limit = 4 << 30
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        cfg = tc.LlamaConfig(vocab_size=11, hidden_size=4 * D, intermediate_size=8, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=P)
        model = tc.LlamaForCausalLM(cfg)
        ids = np.array([[1, 2, 3]])
        before = model(ids).logits
        try:
            model(ids, position_ids=np.array([[0, 1, P - 1]]))
        except ValueError as e:
            print("refused:", e)
        assert (model(ids).logits == before).all()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    D = 16
    P = int(0.6 * tc._core.physical_memory_bytes() / (4 * D))  # the script's
    assert out.stdout.startswith(f"refused: position_ids: position {P - 1} needs rotary tables (cos and sin of {P} "
                                 f"positions × {D} float32; max_position_embeddings {P})"), out.stdout
    assert "exceed this machine's memory" in out.stdout, out.stdout


# ------------------------------------------------------- configs with -1 token ids, quantize_activations
def test_negative_token_ids_in_config_json_mean_none_as_hf(llama_gqa, tmp_path):
    """transformers 4.27/4.28's Llama conversion wrote ``"pad_token_id": -1`` (and public configs
    list ``eos_token_id: [eos, -1]``): transformers loads them, and so do we, reading an end or start id
    of -1 as "none" (a ``pad_token_id`` of -1 is kept: it is an embedding row, see the next test).
    Logits and greedy tokens are HF's; a real end id beside the -1 still stops a row where HF's does."""
    hf, path, m = llama_gqa
    x = _ids(11, (2, 6))
    mask = torch.ones(x.shape, dtype=torch.long)
    free = m.generate(x, 10)
    stop = int(free[0, 6 + 3])  # row 0's 4th new token
    assert stop not in free[0, 6:6 + 3]
    for fields in ({"pad_token_id": -1}, {"eos_token_id": [stop, -1]}, {"pad_token_id": -1, "bos_token_id": -1,
                                                                       "eos_token_id": [-1, stop]}):
        d = _with_config(path, tmp_path / f"neg{len(list(tmp_path.iterdir()))}", **fields)
        (d / "generation_config.json").unlink(missing_ok=True)  # config.json's ids are the ones read
        hf2 = transformers.LlamaForCausalLM.from_pretrained(d).eval()
        ours = tc.LlamaForCausalLM.from_pretrained(d)
        assert ours.config.pad_token_id == fields.get("pad_token_id")
        assert ours.config.eos_token_id == ([stop] if "eos_token_id" in fields else None)
        assert ours.config.bos_token_id is None
        with torch.no_grad():
            ref_logits = hf2(torch.from_numpy(x)).logits.numpy()
            ref = hf2.generate(torch.from_numpy(x), attention_mask=mask, max_new_tokens=10, do_sample=False,
                               pad_token_id=0).numpy()
        assert_close(ours(x).logits, ref_logits, atol_=1e-5, rtol_=1e-5, what=f"logits, {fields}")
        got = ours.generate(x, 10, pad_token_id=0)
        np.testing.assert_array_equal(got, ref, err_msg=str(fields))
        if "eos_token_id" in fields:  # row 0 stopped at the real end id, then the pad
            assert got[0, 6 + 3] == stop and (got[0, 6 + 4:] == 0).all()
    # the config's own reading: a negative end/start id is none, a list keeps its ids >= 0; wrong types
    # still refused
    cfg = tc.LlamaConfig.from_dict({**m.config.to_dict(), "pad_token_id": -1, "eos_token_id": [2, -1, 5],
                                    "bos_token_id": -7})
    assert (cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id) == (-1, [2, 5], None)
    assert tc.LlamaConfig.from_dict({**m.config.to_dict(), "eos_token_id": [-1]}).eos_token_id is None
    for key, value, match in (("pad_token_id", "x", r"^pad_token_id: expected an int, got str"),
                              ("pad_token_id", 1.0, r"^pad_token_id: expected an int, got float"),
                              ("eos_token_id", [2, True], r"^eos_token_id\[1\]: expected an int, got bool")):
        with pytest.raises(TypeError, match=match):
            tc.LlamaConfig.from_dict({**m.config.to_dict(), key: value})
    # ids given to generate are not configs: -1 there is still refused
    for kw, match in (({"pad_token_id": -1}, r"^pad_token_id: expected an int in \[0, "),
                      ({"eos_token_id": [stop, -1]}, r"^eos_token_id\[1\]: expected an int in \[0, ")):
        with pytest.raises(ValueError, match=match):
            m.generate(x, 3, **kw)


@pytest.mark.parametrize("pad", [-1, 5, -VOCAB])
def test_pad_token_id_is_torchs_padding_idx(pad, tmp_path):
    """HF builds ``nn.Embedding(padding_idx=pad_token_id)``: row ``pad % vocab_size`` gets no gradient
    (-1: the last row, a real token). The embedding gradient is HF's (row V-1 got one for -1: the
    config read -1 as "no padding row"); the config keeps the id given and saves it back, so
    transformers reloads the same config. An id outside [-V, V), which torch refuses, is a ValueError
    naming pad_token_id (it was dropped silently)."""
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                   num_attention_heads=4, max_position_embeddings=32, bos_token_id=None,
                                   eos_token_id=None, pad_token_id=pad, attn_implementation="eager")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg)
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    row = pad % VOCAB
    ids = np.array([[3, row, 5, 9, row, 7], [row, 1, 2, row, 4, 6]])
    hf.train()
    hf(torch.from_numpy(ids), labels=torch.from_numpy(ids)).loss.backward()
    ref = hf.model.embed_tokens.weight.grad.numpy()
    assert hf.model.embed_tokens.padding_idx == row and not ref[row].any() and ref[3].any()
    ours = tc.LlamaForCausalLM.from_pretrained(tmp_path / "hf")
    assert ours.config.pad_token_id == pad
    ours.train()
    ours.loss(ids, ids)
    ours.backward()
    assert_close(ours.gradients()["model.embed_tokens.weight"], ref, atol_=1e-5, rtol_=1e-4, what="embedding grad")
    ours.save_pretrained(tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["pad_token_id"] == pad
    assert transformers.LlamaConfig.from_pretrained(tmp_path / "ours").pad_token_id == pad
    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4)
    for bad in (VOCAB, VOCAB + 3, -VOCAB - 1):
        with pytest.raises(ValueError, match=rf"^pad_token_id: expected an int in \[-{VOCAB}, {VOCAB - 1}\], "
                                             rf"got {bad}$"):
            tc.LlamaForCausalLM({**small, "pad_token_id": bad})
    with pytest.raises(TypeError, match=r"^pad_token_id: expected an int, got list"):
        tc.LlamaConfig(**small, pad_token_id=[0]).check()


def test_quantize_activations_without_gguf_blocks_is_refused(llama_gqa):
    """quantize_activations acts on GGUF block weights only; for a directory (float weights) or a
    dtype given (every weight dequantized) True was silently ignored: now a ValueError naming it,
    before anything is read. False loads as before."""
    _, path, m = llama_gqa
    with pytest.raises(ValueError, match=r"^quantize_activations: applies to GGUF block weights only \(a \.gguf file "
                                         r"or embedded model loaded with dtype=None\); this load has float weights "
                                         r"\('.*' is a Hugging Face directory\)$"):
        tc.LlamaForCausalLM.from_pretrained(path, quantize_activations=True)
    for dtype, name in ((np.float32, "float32"), (np.float64, "float64"), ("float32", "float32")):
        with pytest.raises(ValueError, match=rf"^quantize_activations: .*\(dtype={name} dequantizes every weight\)$"):
            tc.LlamaForCausalLM.from_pretrained("SmolLM2-135M-Instruct", dtype=dtype, quantize_activations=True)
    with pytest.raises(TypeError, match=r"^dtype: expected float32 or float64"):  # a bad dtype is named first
        tc.LlamaForCausalLM.from_pretrained(path, dtype=np.float16, quantize_activations=True)
    x = _ids(0, (1, 5))
    np.testing.assert_array_equal(tc.LlamaForCausalLM.from_pretrained(path, quantize_activations=False)(x).logits,
                                  m(x).logits)


# ------------------------------------------------------------------- weights that do not fit: the file named
def _weights_refusal(cls, path) -> ValueError:
    """The ValueError of cls.from_pretrained(path), checked: load_state_dict's error is its cause,
    and it promises no "module unchanged" (the caller gets no module)."""
    with pytest.raises(ValueError) as info:
        cls.from_pretrained(path)
    error = info.value
    assert "module unchanged" not in str(error)
    assert isinstance(error.__cause__, ValueError) and "load_state_dict refused" in str(error.__cause__)
    return error


@pytest.mark.parametrize("change, problem", [
    (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), "missing keys: ['model.layers.1.mlp.up_proj.weight']"),
    (lambda t: t.update({"model.layers.0.foo.weight": np.zeros(3, np.float32)}),
     "unknown keys: ['model.layers.0.foo.weight']"),
    (lambda t: t.update({"model.layers.1.self_attn.o_proj.weight": t["model.layers.1.self_attn.o_proj.weight"][:, :-1]}),
     "mis-shaped: ['model.layers.1.self_attn.o_proj.weight: expected (48, 48), got (48, 47)']"),
], ids=["missing", "unknown", "mis-shaped"])
def test_weights_that_do_not_fit_name_model_safetensors(llama_gqa, tmp_path, change, problem):
    """A missing, unknown or mis-shaped tensor was "LlamaForCausalLM.load_state_dict refused (module
    unchanged): ...": no file named, and a module promised that the caller never gets. Now the
    error names model.safetensors, with load_state_dict's error as its cause."""
    from safetensors.numpy import load_file, save_file

    _, path, _ = llama_gqa
    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    tmp_path.joinpath("config.json").write_text((path / "config.json").read_text())
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    error = _weights_refusal(tc.LlamaForCausalLM, tmp_path)
    assert str(error) == (f"{tmp_path / 'model.safetensors'}: the weights do not fit the LlamaForCausalLM that "
                          f"config.json describes: {problem}")


def test_weights_that_do_not_fit_name_the_shard_index(llama_gqa, tmp_path):
    """A tensor that a sharded checkpoint's index lacks: the error names the index."""
    hf, _, _ = llama_gqa
    hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    index = tmp_path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    assert len(set(data["weight_map"].values())) > 1
    del data["weight_map"]["model.norm.weight"]
    index.write_text(json.dumps(data))
    error = _weights_refusal(tc.LlamaForCausalLM, tmp_path)
    assert str(error) == (f"{index}: the weights of its shards do not fit the LlamaForCausalLM that config.json "
                          f"describes: missing keys: ['model.norm.weight']")


def test_save_pretrained_writes_a_numpy_generation_config_and_names_what_json_cannot_write(tmp_path):
    """A generation_config holding numpy scalars gave json's bare TypeError ("Object of type int64
    is not JSON serializable"): they are written as Python numbers, which transformers reads back;
    a value json cannot write is a TypeError naming it, before anything is written."""
    m = tc.LlamaForCausalLM(tc.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                           num_attention_heads=2))
    m.generation_config = {"eos_token_id": np.int64(3), "temperature": np.float64(0.5)}
    m.save_pretrained(tmp_path / "saved")
    gen = transformers.GenerationConfig.from_pretrained(tmp_path / "saved")
    assert gen.eos_token_id == 3 and gen.temperature == 0.5
    assert tc.LlamaForCausalLM.from_pretrained(tmp_path / "saved").generation_config["eos_token_id"] == 3
    m.generation_config = {"eos_token_id": np.array([3, 4])}
    with pytest.raises(TypeError, match=re.escape("generation_config['eos_token_id']: expected a JSON value (str, int, "
                                                  "float, bool, None, list, dict), got numpy.ndarray")):
        m.save_pretrained(tmp_path / "other")
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("zero", ["head_dim", "num_key_value_heads"])
def test_a_default_of_0_is_saved_as_null_and_transformers_loads_it(tmp_path, zero):
    """``head_dim=0`` / ``num_key_value_heads=0`` are the defaults here (hidden / heads, and as many
    key/value heads as heads), as None; Hugging Face reads only null so: the folder was saved with
    0, and transformers crashed on it (ZeroDivisionError). Now 0 is written as null, and
    transformers' logits match ours."""
    cfg = tc.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=16, **{zero: 0})
    ours = tc.LlamaForCausalLM(cfg)
    ours.save_pretrained(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["head_dim"] is None and saved["num_key_value_heads"] is None
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "m").eval()
    assert hf.config.head_dim == 8 and hf.config.num_key_value_heads == 2
    ids = np.array([[1, 5, 9, 3]])
    with torch.no_grad():
        want = hf(torch.tensor(ids)).logits.numpy()
    assert_close(ours(ids).logits, want, atol_=1e-4)


def test_llama_config_extra_keeps_the_other_keys_as_gpt2s(tmp_path):
    """``LlamaConfig.extra`` was never filled nor written (a value set there was dropped on save):
    it now keeps the keys of config.json that are not fields, as ``GPT2Config.extra``, and
    ``save_pretrained`` writes them back; not kept: what describes the file read (dtype,
    transformers_version) and what ``rope_theta`` stands for (rope_scaling, rope_parameters).
    transformers reads the saved folder with the kept keys and gives our logits."""
    hf_cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, max_position_embeddings=16, initializer_range=0.3,
                                      use_cache=False)
    torch.manual_seed(5)
    transformers.LlamaForCausalLM(hf_cfg).save_pretrained(tmp_path / "hf", safe_serialization=True)
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**written, "my_key": [1, {"a": 2}]}))
    ours = tc.LlamaForCausalLM.from_pretrained(tmp_path / "hf")
    assert ours.config.extra["my_key"] == [1, {"a": 2}] and ours.config.extra["initializer_range"] == 0.3
    assert not {"dtype", "torch_dtype", "transformers_version", "rope_parameters", "rope_scaling", "model_type",
                "architectures"} & set(ours.config.extra)
    ours.config.extra["use_cache"] = True  # set by hand: written too
    ours.save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["my_key"] == [1, {"a": 2}] and saved["initializer_range"] == 0.3 and saved["use_cache"] is True
    assert "transformers_version" not in saved and "dtype" not in saved
    assert tc.LlamaConfig.from_dict(saved).to_dict() == saved  # reloads as it was
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ours").eval()
    assert hf.config.initializer_range == 0.3 and hf.config.my_key == [1, {"a": 2}]
    assert hf.config.rope_parameters["rope_theta"] == ours.config.rope_theta
    ids = np.array([[1, 5, 9, 3]])
    with torch.no_grad():
        want = hf(torch.tensor(ids)).logits.numpy()
    assert_close(ours(ids).logits, want, atol_=1e-4)
    with pytest.raises(TypeError, match=re.escape("config.extra['bad']")):
        tc.LlamaConfig(extra={"bad": np.zeros(2)}).to_dict()
