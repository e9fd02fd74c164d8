"""The real SmolLM2-135M-Instruct (Llama architecture, 30 layers, GQA 9/3, RoPE base 1e5, tied
embeddings) loaded from its GGUF file (Q4_1 blocks, Q8_0 token embedding) as a user gets it —
``from_pretrained`` keeps the blocks in memory and decodes them to their float32 values inside the
products (tests/test_ops_quantized.py: bit for bit gguf's dequantized values, float32 arithmetic) —
against transformers' LlamaForCausalLM loaded from the same file (``gguf_file=``, float32 tensors).

The weights are identical (tests/test_gguf_file.py checks every tensor bit for bit), so the logits
differ only by the order of float32 operations over 30 layers: ≤ 1e-3 is asked; the argmax must be
the same at every position, and greedy decoding the same tokens.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import transformer_core as tc

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a transformer neural network is in one sentence.",
    "def fibonacci(n):",
    "List three prime numbers greater than 100.",
    "Translate 'good morning' into Spanish.",
    "What is 17 times 23?",
    "Who wrote the novel 'Pride and Prejudice'?",
    "Give me a short tip for learning to play the guitar.",
    "Why is the sky blue?",
    "东京是哪个国家的首都？",
]


@pytest.fixture(scope="module")
def ours():
    return tc.LlamaForCausalLM.from_pretrained("SmolLM2-135M-Instruct")


@pytest.fixture(scope="module")
def tokenizer():
    return tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct")


def _chat_ids(tokenizer, prompt) -> np.ndarray:
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         tokenize=False)
    return np.array([tokenizer.encode(text)], dtype=np.int64)


def test_config_is_smollm2(ours):
    c = ours.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim or 64,
            c.intermediate_size, c.vocab_size, c.rope_theta, c.tie_word_embeddings) == \
        (30, 576, 9, 3, 64, 1536, 49152, 100000.0, True)


@pytest.mark.parametrize("prompt", PROMPTS[:10])
def test_logits_match_transformers(ours, tokenizer, hf_smollm2, prompt):
    ids = _chat_ids(tokenizer, prompt)
    logits = ours(ids).logits[0]
    with torch.no_grad():
        ref = hf_smollm2(torch.from_numpy(ids)).logits[0].numpy()
    assert np.abs(ref).max() > 5.0
    diff = np.abs(logits - ref).max()
    assert diff <= 1e-3, f"max |logits - transformers| = {diff:.3g}"
    np.testing.assert_array_equal(logits.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_64_tokens_match_transformers(ours, tokenizer, hf_smollm2, prompt):
    ids = _chat_ids(tokenizer, prompt)
    # all 64, past <|im_end|>; the mask given to both: the prompt holds <|im_end|> (id 2 = the pad id,
    # here not an end id), which either would otherwise infer to be padding and hide
    out = ours.generate(ids, max_new_tokens=64, eos_token_id=[], attention_mask=np.ones_like(ids))
    with torch.no_grad():
        ref = hf_smollm2.generate(torch.from_numpy(ids), attention_mask=torch.ones_like(torch.from_numpy(ids)),
                                  max_new_tokens=64, do_sample=False, eos_token_id=None, pad_token_id=2).numpy()
    np.testing.assert_array_equal(out, ref)


def test_capital_of_france_is_paris(ours, tokenizer):
    ids = _chat_ids(tokenizer, PROMPTS[0])
    out = ours.generate(ids, max_new_tokens=32, eos_token_id=tokenizer.eos_token_id)
    answer = tokenizer.decode(out[0, ids.shape[1]:])
    assert "Paris" in answer, answer
    assert out[0, -1] == tokenizer.eos_token_id  # stopped at <|im_end|>


def test_cache_decoding_equals_recomputation(ours, tokenizer):
    ids = _chat_ids(tokenizer, PROMPTS[3])
    out = ours.generate(ids, max_new_tokens=12)
    full = ours(out).logits[0]
    cache = ours.new_cache(1)
    step = ours(out[:, :ids.shape[1]], past_key_values=cache, use_cache=True)
    for t in range(ids.shape[1], out.shape[1]):
        np.testing.assert_allclose(step.logits[0, -1], full[t - 1], atol=2e-4, rtol=0)
        step = ours(out[:, t:t + 1], past_key_values=cache, use_cache=True)


def test_prompt_longer_than_the_context(ours):
    with pytest.raises(ValueError, match="max_position_embeddings"):
        ours.generate(np.zeros((1, 8190), np.int64), max_new_tokens=5)
