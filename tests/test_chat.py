"""ChatSession and continue_text on the real SmolLM2-135M-Instruct: streamed text, the KV cache
kept across turns (a later turn runs only its new tokens and answers exactly as a fresh run over the
whole conversation), and greedy continuation of raw text."""
from __future__ import annotations

import numpy as np
import pytest
import transformer_core as tc
from transformer_core.chat import ChatSession, continue_text


@pytest.fixture(scope="module")
def smol():
    return tc.LlamaForCausalLM.from_pretrained("SmolLM2-135M-Instruct"), tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct")


def test_two_turns_reuse_the_cache(smol):
    model, tok = smol
    session = ChatSession(model, tok, max_new_tokens=40)
    pieces = []
    reply = session.send("What is the capital of France?", on_text=pieces.append)
    assert "Paris" in reply
    assert "".join(pieces) == reply
    first_prompt = session.stats.prefill_tokens
    assert first_prompt > 20 and session.stats.decode_tokens > 0
    reply2 = session.send("And of Italy?")
    # the second turn runs only what the cache lacks: the new message and the end of the last reply
    full = tok.apply_chat_template(session.messages[:-1], add_generation_prompt=True, tokenize=True)
    assert session.stats.prefill_tokens < len(full) - first_prompt
    # ... and answers exactly as a fresh session given the whole conversation
    fresh = model.generate(np.array([full]), max_new_tokens=40, eos_token_id=[tok.eos_token_id])
    assert reply2 == tok.decode(fresh[0, len(full):], skip_special_tokens=True)
    assert [m["role"] for m in session.messages] == ["user", "assistant", "user", "assistant"]


def test_system_message_and_sampling_are_reproducible(smol):
    model, tok = smol
    a = ChatSession(model, tok, system="Answer in one word.", max_new_tokens=8, temperature=0.8, seed=7)
    b = ChatSession(model, tok, system="Answer in one word.", max_new_tokens=8, temperature=0.8, seed=7)
    assert a.send("Name a colour.") == b.send("Name a colour.")
    assert a.messages[0] == {"role": "system", "content": "Answer in one word."}


def test_continue_text_equals_generate(smol):
    model, tok = smol
    text, stats = continue_text(model, tok, "Once upon a time", max_new_tokens=20)
    ids = tok.encode("Once upon a time", add_special_tokens=True)
    ref = model.generate(np.array([ids]), max_new_tokens=20, eos_token_id=[tok.eos_token_id])
    assert text == tok.decode(ref[0, len(ids):], skip_special_tokens=True)
    assert stats.prefill_tokens == len(ids) and stats.decode_tokens == ref.shape[1] - len(ids) - 1
    assert "tokens/s" in str(stats)


def test_bad_input(smol):
    model, tok = smol
    with pytest.raises(ValueError, match="temperature"):
        ChatSession(model, tok, temperature=-1.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        ChatSession(model, tok, max_new_tokens=0)
    session = ChatSession(model, tok)
    with pytest.raises(TypeError, match="message"):
        session.send(None)
    with pytest.raises(ValueError, match="text"):
        continue_text(model, tok, "")


def test_continue_text_checks_the_context_before_making_the_cache(smol, monkeypatch):
    model, tok = smol

    def new_cache(self, batch, capacity=0):
        raise AssertionError(f"new_cache({batch}, {capacity}) called before the context was checked")

    monkeypatch.setattr(type(model), "new_cache", new_cache)
    n = len(tok.encode("Once upon a time"))
    room = model.context_length - n
    with pytest.raises(ValueError, match=rf"^max_new_tokens: prompt length {n} \+ {room + 1} exceeds the context "
                                         rf"\(max_position_embeddings = {model.context_length}\)$"):
        continue_text(model, tok, "Once upon a time", max_new_tokens=room + 1)
    with pytest.raises(ValueError, match="max_new_tokens: prompt length 1 \\+ 100000 exceeds"):
        continue_text(model, tok, "hi", max_new_tokens=100_000)


@pytest.mark.parametrize("kwargs, match", [
    ({"top_k": 0}, "top_k"),
    ({"top_k": 0, "temperature": 0.7}, "top_k"),
    ({"top_p": 1.5, "temperature": 0.7}, "top_p"),
    ({"top_p": 0.0, "temperature": 0.7}, "top_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"seed": -1, "temperature": 0.7}, "seed"),
])
def test_sampling_options_are_checked_when_the_session_is_made(smol, kwargs, match):
    model, tok = smol
    with pytest.raises(ValueError, match=f"^{match}: "):
        ChatSession(model, tok, **kwargs)
    with pytest.raises(ValueError, match=f"^{match}: "):
        continue_text(model, tok, "hi", max_new_tokens=4, **kwargs)


def test_empty_or_invalid_messages_are_refused_before_anything_runs(smol):
    model, tok = smol
    session = ChatSession(model, tok, max_new_tokens=4)
    for message, match in (("", "message: expected a message, got an empty string"),
                           (" \n", "message: expected a message, got only whitespace"),
                           ("caf\udce9", "message: expected valid Unicode text, got a lone surrogate '\\\\udce9' "
                                         "at position 3")):
        with pytest.raises(ValueError, match=f"^{match}"):
            session.send(message)
    assert session.messages == [] and session.cache.length == 0  # nothing was sent
    with pytest.raises(ValueError, match="^system: .* at position 0"):
        ChatSession(model, tok, system="\udcff")
    with pytest.raises(ValueError, match="^text: expected valid Unicode text, .* at position 3"):
        continue_text(model, tok, "caf\udce9", max_new_tokens=4)
