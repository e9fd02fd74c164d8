"""ChatSession and continue_text on the real SmolLM2-135M-Instruct: streamed text, the KV cache
kept across turns (a later turn runs only its new tokens and answers exactly as a fresh run over the
whole conversation), and greedy continuation of raw text."""
from __future__ import annotations

import re

import numpy as np
import pytest
import transformer_core as tc
from conftest import sentencepiece_tokenizer
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
    room = model.context_length - n + 1  # the most that fit: the last new token is never fed back
    with pytest.raises(ValueError, match=rf"^max_new_tokens: prompt length {n} \+ {room + 1} exceeds the context "
                                         rf"\(max_position_embeddings = {model.context_length}\)$"):
        continue_text(model, tok, "Once upon a time", max_new_tokens=room + 1)
    with pytest.raises(ValueError, match="max_new_tokens: prompt length 1 \\+ 100000 exceeds"):
        continue_text(model, tok, "hi", max_new_tokens=100_000)


@pytest.mark.parametrize("kwargs, match", [
    ({"top_k": -1}, "top_k"),
    ({"top_k": -1, "temperature": 0.7}, "top_k"),
    ({"top_p": 1.5, "temperature": 0.7}, "top_p"),
    ({"top_p": -0.1, "temperature": 0.7}, "top_p"),
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


# ------------------------------------------------------------------------------------------------
# The context limit, against Hugging Face's generate: a tiny random Llama with SmolLM2's tokenizer
# and a context just a few tokens longer than the first prompt
# ------------------------------------------------------------------------------------------------
MESSAGE = "Hi there"
EXTRA = 3  # the context is the first prompt's length + EXTRA


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    """(HF model, our model, tokenizer, the first prompt's ids)."""
    transformers = pytest.importorskip("transformers")
    import torch

    tok = tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct")
    prompt = tok.apply_chat_template([{"role": "user", "content": MESSAGE}], add_generation_prompt=True,
                                     tokenize=True)
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1,
                                   max_position_embeddings=len(prompt) + EXTRA, initializer_range=0.2,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=True)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("tiny_chat_llama")
    hf.save_pretrained(path, safe_serialization=True)
    return hf, tc.LlamaForCausalLM.from_pretrained(path), tok, list(prompt)


def _hf_greedy(hf, ids, max_new_tokens, eos):
    import torch

    with torch.no_grad():
        x = torch.tensor([ids])
        return hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                           eos_token_id=eos, pad_token_id=0).numpy()[0, len(ids):]


def test_chat_reply_fills_the_context_as_hf_generate(tiny_chat):
    """A prompt of P tokens leaves room for context - P + 1 reply tokens (the last is never fed back):
    the reply equals HF's generate with that many new tokens, and the cache ends full."""
    hf, m, tok, prompt = tiny_chat
    context = m.context_length
    assert context == len(prompt) + EXTRA
    ref = _hf_greedy(hf, prompt, context - len(prompt) + 1, tok.eos_token_id)
    assert len(ref) == EXTRA + 1 and tok.eos_token_id not in ref  # the limit, not an end token, stops HF
    session = ChatSession(m, tok, max_new_tokens=50)
    reply = session.send(MESSAGE)
    assert reply == tok.decode(list(ref), skip_special_tokens=True)
    assert session.stats.decode_tokens + 1 == len(ref)
    assert session.cache.length == context  # the prompt and every reply token but the last
    # the next turn's prompt is longer than the context, and the earlier turns alone leave no room for
    # any message: refused, naming the message, with the one advice that helps
    with pytest.raises(ValueError, match=r"^message: the conversation \(\d+ tokens\) no longer fits the model's "
                                         rf"context \({context} tokens\); start a new session$"):
        session.send("And again?")
    with pytest.raises(ValueError, match=r"; start a new session$"):
        session.send("a")
    assert len(session.messages) == 2


def test_a_later_message_that_fits_alone_but_not_after_the_history_is_to_be_shortened(tiny_chat):
    """When the earlier turns leave room for a shorter message, the refusal says by how many tokens to
    shorten it (or to start a new session), and a message that much shorter is answered."""
    _, _, tok, prompt = tiny_chat
    context = 2 * len(prompt) + 16  # room for the first turn and part of a second
    m = tc.LlamaForCausalLM(tc.LlamaConfig(vocab_size=49152, hidden_size=16, intermediate_size=32,
                                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                           max_position_embeddings=context))
    session = ChatSession(m, tok, max_new_tokens=1)
    session.send(MESSAGE)

    def prompt_length(text):
        return len(tok.apply_chat_template(session.messages + [{"role": "user", "content": text}],
                                           add_generation_prompt=True, tokenize=True))

    words = next(k for k in range(1, context) if prompt_length("hello " * k) > context)
    alone = len(tok.apply_chat_template([{"role": "user", "content": "hello " * words}], add_generation_prompt=True,
                                        tokenize=True))
    assert alone <= context  # the message alone fits: shortening it helps
    over = prompt_length("hello " * words) - context
    with pytest.raises(ValueError, match=rf"no longer fits the model's context \({context} tokens\); shorten the "
                                         rf"message \(by {over} tokens or more\) or start a new session$"):
        session.send("hello " * words)
    assert isinstance(session.send("hello " * (words - over)), str) and len(session.messages) == 4


def test_a_first_message_longer_than_the_context_is_to_be_shortened(tiny_chat):
    """A first message over the context was told "the conversation (N tokens) no longer fits the
    model's context ...; start a new session", which cannot help: on the first turn the message
    itself (with the template and any system message) is too long. On a later turn too (it was
    told to start a new session, where it fails again): a message too long alone is to be
    shortened."""
    _, m, tok, _ = tiny_chat
    context = m.context_length
    long = "hello " * context
    for system, counted in ((None, "the chat template"), ("Be terse.", "the chat template and the system message")):
        session = ChatSession(m, tok, system=system, max_new_tokens=2)
        before = list(session.messages)
        n = len(tok.apply_chat_template(before + [{"role": "user", "content": long}], add_generation_prompt=True,
                                        tokenize=True))
        assert n > context
        with pytest.raises(ValueError) as info:
            session.send(long)
        assert str(info.value) == (f"message: {n} tokens (with {counted}) exceed the model's context ({context} "
                                   f"tokens); shorten it")
        assert session.messages == before and session.cache.length == 0  # nothing ran
        with pytest.raises(ValueError, match="; shorten it$"):  # still the first turn
            session.send(long)
    for system, counted in ((None, "the chat template"), ("Be terse.", "the chat template and the system message")):
        session = ChatSession(m, tok, system=system, max_new_tokens=1)
        session.send(MESSAGE)
        alone = session.messages[:1 if system else 0] + [{"role": "user", "content": long}]
        n = len(tok.apply_chat_template(alone, add_generation_prompt=True, tokenize=True))
        assert n > context
        before = list(session.messages)
        with pytest.raises(ValueError) as info:
            session.send(long)
        assert str(info.value) == (f"message: {n} tokens (with {counted}) exceed the model's context ({context} "
                                   f"tokens); shorten it")
        assert session.messages == before


def test_continue_text_at_exactly_the_context_limit(tiny_chat):
    hf, m, tok, _ = tiny_chat
    context = m.context_length
    text = "Once upon a time"
    ids = tok.encode(text, add_special_tokens=True)
    fit = context - len(ids) + 1
    ref = _hf_greedy(hf, ids, fit, tok.eos_token_id)
    out, stats = continue_text(m, tok, text, max_new_tokens=fit)
    assert out == tok.decode(list(ref), skip_special_tokens=True)
    assert stats.decode_tokens + 1 == len(ref)
    with pytest.raises(ValueError, match=rf"^max_new_tokens: prompt length {len(ids)} \+ {fit + 1} exceeds the "
                                         rf"context \(max_position_embeddings = {context}\)$"):
        continue_text(m, tok, text, max_new_tokens=fit + 1)
    long_text = "word " * context
    n = len(tok.encode(long_text, add_special_tokens=True))
    assert n > context
    with pytest.raises(ValueError, match=rf"^text: {n} tokens exceed the context \(max_position_embeddings = "
                                         rf"{context}\)$"):
        continue_text(m, tok, long_text, max_new_tokens=1)


@pytest.mark.parametrize("option", ["temperature", "repetition_penalty"])
def test_sampling_values_at_most_zero_refused_tiny_ones_accepted(tiny_chat, option):
    """Any finite temperature or repetition penalty > 0 is accepted, as Hugging Face's (a subnormal
    one overflowed score / value into NaN probabilities, and values below 1e-6 were refused): a tiny
    temperature samples the greedy tokens, a tiny penalty gives HF's greedy tokens with that penalty.
    Values <= 0 are refused, naming the option, by the session, continue_text and generate (the
    session's temperature 0 is greedy decoding, a negative one refused)."""
    import torch

    hf, m, tok, _ = tiny_chat
    ids = np.array([[5, 6, 7, 5]])
    for value in (0.0, -5e-324, -1.0):
        if option == "temperature":
            if value != 0.0:  # 0 is the chat's greedy decoding
                chat_match = rf"^temperature: expected a value >= 0 \(0 = greedy\), got {re.escape(str(value))}$"
                with pytest.raises(ValueError, match=chat_match):
                    ChatSession(m, tok, temperature=value)
                with pytest.raises(ValueError, match=chat_match):
                    continue_text(m, tok, "hi", max_new_tokens=2, temperature=value)
        else:
            for call in (lambda: ChatSession(m, tok, repetition_penalty=value),
                         lambda: continue_text(m, tok, "hi", max_new_tokens=2, repetition_penalty=value)):
                with pytest.raises(ValueError, match=rf"^repetition_penalty: expected a finite number > 0 .*, got "
                                                     rf"{re.escape(repr(value))}$"):
                    call()
        with pytest.raises(ValueError, match=rf"^{option}: expected a finite number > 0 .*, got {re.escape(repr(value))}$"):
            m.generate(ids, 2, do_sample=True, **{option: value})
    with pytest.raises(TypeError, match=f"^{option}: expected a number, got str"):
        ChatSession(m, tok, **{option: "0.5"})
    greedy_text = continue_text(m, tok, "Once upon a time", max_new_tokens=4)[0]
    for value in (1e-310, 5e-324, 1e-7):
        if option == "temperature":
            assert continue_text(m, tok, "Once upon a time", max_new_tokens=4, temperature=value, seed=0)[0] == greedy_text
            np.testing.assert_array_equal(m.generate(ids, 4, do_sample=True, temperature=value, seed=0),
                                          m.generate(ids, 4))
        else:
            ours = m.generate(ids, 4, repetition_penalty=value)
            with torch.no_grad():
                ref = hf.generate(torch.from_numpy(ids), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                                  max_new_tokens=4, do_sample=False, repetition_penalty=value, pad_token_id=0)
            np.testing.assert_array_equal(ours, ref.numpy(), err_msg=f"repetition_penalty={value}")
            ChatSession(m, tok, repetition_penalty=value)  # accepted


def test_a_failed_turn_leaves_no_stale_cache(tiny_chat):
    """A turn that fails while streaming (on_text raising) leaves the cache holding its tokens; after
    the history is edited, the next turn must not take them for the old conversation's: its reply
    equals a fresh session's."""
    _, m, tok, _ = tiny_chat
    session = ChatSession(m, tok, max_new_tokens=2)
    first = session.send(MESSAGE)

    def fail(_text):
        raise KeyboardInterrupt

    session.messages = []  # start over, keeping the session (and its cache)
    with pytest.raises(KeyboardInterrupt):
        session.send("Zebra", on_text=fail)
    assert session.messages == []
    again = session.send(MESSAGE)
    assert again == first == ChatSession(m, tok, max_new_tokens=2).send(MESSAGE)
    fresh = ChatSession(m, tok, max_new_tokens=2)
    fresh.send(MESSAGE)
    assert session.cache.length == fresh.cache.length
    for (k, v), (fk, fv) in zip(session.cache.to_legacy(), fresh.cache.to_legacy()):
        np.testing.assert_allclose(k, fk, rtol=0, atol=1e-6)
        np.testing.assert_allclose(v, fv, rtol=0, atol=1e-6)


def test_on_text_is_checked_before_the_prompt_runs(tiny_chat):
    _, m, tok, _ = tiny_chat
    session = ChatSession(m, tok, max_new_tokens=2)
    with pytest.raises(TypeError, match="^on_text: expected a callable taking a str, or None, got str"):
        session.send(MESSAGE, on_text="print")
    assert session.cache.length == 0 and session.messages == []
    with pytest.raises(TypeError, match="^on_text: expected a callable"):
        continue_text(m, tok, "hi", max_new_tokens=2, on_text=42)


# ------------------------------------------------------------------------------------------------
# End tokens of the model's config, a vocabulary padded past the tokenizer's, SentencePiece text
# ------------------------------------------------------------------------------------------------
def _tiny_llama(transformers, path, vocab_size=49152, context=128, eos=None, seed=0, tie=True):
    import torch

    cfg = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=context,
                                   initializer_range=0.2, bos_token_id=None, eos_token_id=eos, pad_token_id=None,
                                   tie_word_embeddings=tie)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_replies_stop_at_the_config_end_ids_as_hf_generate(tmp_path):
    """A config's ``eos_token_id`` list (Llama-3-Instruct's [128001, 128008, 128009]) ends a reply
    as in Hugging Face's generate: the session and continue_text stopped only at the tokenizer's
    EOS and ran to max_new_tokens."""
    transformers = pytest.importorskip("transformers")
    import torch

    tok = tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct")
    prompt = tok.apply_chat_template([{"role": "user", "content": MESSAGE}], add_generation_prompt=True,
                                     tokenize=True)
    text = "Once upon a time"
    ids = tok.encode(text, add_special_tokens=True)
    hf = _tiny_llama(transformers, tmp_path)
    with torch.no_grad():
        firsts = [int(hf(torch.tensor([p])).logits[0, -1].argmax()) for p in (prompt, ids)]
    assert tok.eos_token_id not in firsts
    hf.config.eos_token_id = hf.generation_config.eos_token_id = [2, *firsts]  # the tokenizer's EOS is 2
    hf.save_pretrained(tmp_path, safe_serialization=True)
    m = tc.LlamaForCausalLM.from_pretrained(tmp_path)
    for p, first in zip((prompt, ids), firsts):
        with torch.no_grad():  # HF's generate with the config's end ids
            ref = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=8, do_sample=False, pad_token_id=0).numpy()[0, len(p):]
        assert ref.tolist() == [first]
    session = ChatSession(m, tok, max_new_tokens=8)
    reply = session.send(MESSAGE)
    assert reply == tok.decode([firsts[0]]) and session.stats.decode_tokens == 0
    out, stats = continue_text(m, tok, text, max_new_tokens=8)
    assert out == tok.decode([firsts[1]]) and stats.decode_tokens == 0


def test_ids_past_the_tokenizers_vocabulary_add_no_text(tmp_path):
    """A model whose embedding is padded past the tokenizer's vocabulary (49216 > 49152 ids): an id
    of the padding made the reply raise ValueError (outside the vocabulary); HF decodes it as ""."""
    transformers = pytest.importorskip("transformers")
    import torch

    tok = tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct")
    messages = [{"role": "user", "content": MESSAGE}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    hf = _tiny_llama(transformers, tmp_path, vocab_size=49216, tie=False)
    with torch.no_grad():  # the padding id 49200 wins the first step
        h = hf.model(torch.tensor([prompt])).last_hidden_state[0, -1]
        hf.lm_head.weight[49200] = h / h.norm() ** 2 * 100
        ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=3, do_sample=False, pad_token_id=0).numpy()[0, len(prompt):].tolist()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    assert ref[0] == 49200 and ref[0] >= tok.vocab_size
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok.backend)
    expected = hf_tok.decode(ref, skip_special_tokens=True)
    m = tc.LlamaForCausalLM.from_pretrained(tmp_path)
    pieces = []
    session = ChatSession(m, tok, max_new_tokens=3)
    assert session.send(MESSAGE, on_text=pieces.append) == expected == "".join(pieces)
    assert session._cached_ids[len(prompt)] == 49200  # generated and cached as any other id
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    out, _ = continue_text(m, tok, rendered, max_new_tokens=3, on_text=pieces.append)
    assert out == expected


def _sentencepiece_llama(transformers, path):
    """A tiny Llama with a Llama-2-style tokenizer.json (Metaspace; the decoder strips the leading
    space): (HF model, HF tokenizer)."""
    backend = sentencepiece_tokenizer()
    hf = _tiny_llama(transformers, path, vocab_size=backend.get_vocab_size(), context=64, eos=2, seed=1)
    hf.save_pretrained(path, safe_serialization=True)
    backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}')
    return hf, transformers.PreTrainedTokenizerFast(tokenizer_object=backend)


def test_continue_text_keeps_the_space_of_a_sentencepiece_decoder(tmp_path):
    """The continuation was decoded alone: a Metaspace/Strip decoder dropped the space before its
    first word ("Hello" + "Hello Hello" for HF's "Hello Hello Hello"). Now text + continuation
    (streamed or returned) is HF's decode of the whole sequence."""
    transformers = pytest.importorskip("transformers")
    import torch

    hf, hf_tok = _sentencepiece_llama(transformers, tmp_path)
    m, tok = tc.LlamaForCausalLM.from_pretrained(tmp_path), tc.Tokenizer.from_pretrained(tmp_path)
    for text in ("Hello", "the world"):
        ids = tok.encode(text, add_special_tokens=True)
        assert ids == hf_tok.encode(text)
        with torch.no_grad():
            full = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                               max_new_tokens=6, do_sample=False, pad_token_id=0)[0].tolist()
        expected = hf_tok.decode(full, skip_special_tokens=True)
        pieces = []
        out, _ = continue_text(m, tok, text, max_new_tokens=6, on_text=pieces.append)
        assert text + out == text + "".join(pieces) == expected
        assert out.startswith(" ")


def test_a_template_that_renders_an_empty_prompt_is_named(tiny_chat):
    _, m, smol_tok, _ = tiny_chat
    tok = tc.Tokenizer(smol_tok.backend, max_length=None, pad_token=None, eos_token="<|im_end|>",
                       chat_template="{% if false %}never{% endif %}")
    session = ChatSession(m, tok, max_new_tokens=2)
    with pytest.raises(ValueError, match="^tokenizer: the chat template rendered an empty prompt"):
        session.send(MESSAGE)
    assert session.messages == [] and session.cache.length == 0


def _byte_run_llama(transformers, backend, chain):
    """(a tiny HF Llama, ours with its weights) whose greedy step from ``chain[j]`` is
    ``chain[j + 1]``: token ``chain[j]``'s embedding is 10 along dimension j and the head's row of
    ``chain[j + 1]`` is 10 there; the attention and MLP outputs are zero, so the last hidden state
    is the last token's embedding."""
    import torch

    cfg = dict(vocab_size=backend.get_vocab_size(), hidden_size=16, intermediate_size=8, num_hidden_layers=1,
               num_attention_heads=2, max_position_embeddings=32, tie_word_embeddings=False)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg, bos_token_id=1, eos_token_id=2)).double().eval()
    state = {k: v.detach().numpy().copy() for k, v in hf.state_dict().items()}
    for k in state:
        if k.endswith(("o_proj.weight", "down_proj.weight", "embed_tokens.weight", "lm_head.weight")):
            state[k][...] = 0
    for j, t in enumerate(chain[:-1]):
        state["model.embed_tokens.weight"][t, j] = 10.0
        state["lm_head.weight"][chain[j + 1], j] = 10.0
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    m = tc.LlamaForCausalLM(tc.LlamaConfig(**cfg), dtype=np.float64)
    m.load_state_dict(state)
    return hf, m


def test_a_streamed_run_of_byte_tokens_that_a_later_byte_rewrites():
    """A byte-fallback (Llama 2) model that generates the valid byte "f", a lone continuation byte
    0xBA and a word: decode reads the byte run as two U+FFFD. With on_text, continue_text (and the
    CLI's generate and chat) raised tokenizers' bare ``Exception: Invalid prefix`` at the word; now
    the streamed pieces join to the returned text, the decode of the whole sequence past the prompt."""
    transformers = pytest.importorskip("transformers")
    import torch
    from test_tokenizer_inputs import _byte_fallback_backend

    backend = _byte_fallback_backend()
    tok = tc.Tokenizer(backend, 64, eos_token="</s>",
                       chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    prompt = tok.encode("a", add_special_tokens=True)
    new = [backend.token_to_id(t) for t in ("<0x66>", "<0xBA>", "▁H", "</s>")]
    hf, m = _byte_run_llama(transformers, backend, [prompt[-1]] + new)
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=6, do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
    assert ref == new  # HF's greedy run: the byte run, the word, the end token
    expected = backend.decode(prompt + new)[len(backend.decode(prompt)):]
    assert expected == "\ufffd\ufffd H"
    pieces = []
    out, _ = continue_text(m, tok, "a", max_new_tokens=6, on_text=pieces.append)
    assert out == "".join(pieces) == expected == continue_text(m, tok, "a", max_new_tokens=6)[0]
    pieces = []
    session = ChatSession(m, tok, max_new_tokens=6)  # its prompt is the message: "a"
    assert session.send("a", on_text=pieces.append) == "".join(pieces) == backend.decode(new) == expected


# ------------------------------------------------------------------------------------------------
# model and tokenizer checked first; a greedy session's seed is not passed on
# ------------------------------------------------------------------------------------------------
def test_model_and_tokenizer_of_another_kind_are_named(smol, tmp_path):
    """ChatSession and continue_text used ``model`` and ``tokenizer`` unchecked: None gave an
    AttributeError, a transformers tokenizer (AutoTokenizer) "ValueError: invalid literal for int()
    ... 'input_ids'". Now a TypeError naming the argument, expected vs got, before anything runs."""
    import json
    import re

    transformers = pytest.importorskip("transformers")
    model, tok = smol
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert hf_tok("hi")["input_ids"] == tok.encode("hi")  # a working tokenizer, only not ours
    hf_name = f"{type(hf_tok).__qualname__} (transformers)"
    model_expected = ("model: expected a transformer_core causal LM (LlamaForCausalLM, GPT2LMHeadModel, ...: a "
                      "transformer_core.decoder.CausalLM), got ")
    tok_expected = "tokenizer: expected a transformer_core Tokenizer (Tokenizer.from_pretrained), got "
    cases = [((None, tok), model_expected + "NoneType"),
             (("SmolLM2-135M-Instruct", tok),
              model_expected + "str (a name or path: load it with LlamaForCausalLM.from_pretrained)"),
             ((model, None), tok_expected + "NoneType"),
             ((model, "SmolLM2-135M-Instruct"), tok_expected + "str"),
             ((model, hf_tok), tok_expected + hf_name),
             ((None, hf_tok), model_expected + "NoneType")]  # model first
    for args, message in cases:
        for call in (lambda: ChatSession(*args), lambda: ChatSession(*args, max_new_tokens=0),
                     lambda: continue_text(*args, "The sky is"), lambda: continue_text(*args, 3, temperature=-1)):
            with pytest.raises(TypeError, match="^" + re.escape(message) + "$"):
                call()


def test_greedy_session_with_a_seed_warns_about_nothing(smol):
    """A greedy session (temperature 0) checks its seed but does not pass it on: generate would warn
    at every reply that do_sample=False ignores it."""
    import warnings

    model, tok = smol
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reply = ChatSession(model, tok, max_new_tokens=6, seed=3).send("Hi")
        text, _ = continue_text(model, tok, "The sky is", max_new_tokens=6, seed=3)
    assert reply == ChatSession(model, tok, max_new_tokens=6).send("Hi")
    assert text == continue_text(model, tok, "The sky is", max_new_tokens=6)[0]


def _gap_tokenizer():
    """Words with ids 0, 1, 3, 4 (2 skipped): vocab_size 4, yet id 4 is a real token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({"a": 0, "b": 1, "c": 3, "[UNK]": 4}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return tc.Tokenizer(backend, max_length=None, pad_token=None)


def test_reply_text_keeps_every_id_that_has_a_token():
    """Reply ids were kept for text only below vocab_size: with a vocabulary whose ids skip some, a
    real token at or past vocab_size was dropped from the reply, streamed and returned, and an id
    in the gap crashed the stream ("token id 2 has no token") where transformers decodes it as ""."""
    from transformer_core import chat

    tok = _gap_tokenizer()
    assert tok.vocab_size == 4 and tok.id_to_token(4) == "[UNK]" and tok.id_to_token(2) is None
    assert chat._known_ids(tok, [0, 1, 2, 3, 4, 5, 70]) == [0, 1, 3, 4]
    assert chat._text_after(tok, [0], [2, 4, 3, 9]) == " [UNK] c"

    class Model:  # stands for model.stream: yields the chosen ids, one a step
        def stream(self, ids, past_key_values=None, **options):
            for i in (1, 2, 4, 3, 9):
                yield np.array([i])

    class Cache:
        length = 0

    pieces = []
    ids = chat._stream(Model(), tok, np.array([[0]]), Cache(), pieces.append, chat.TurnStats(), context=[0])
    assert ids == [1, 2, 4, 3, 9]
    assert "".join(pieces) == chat._text_after(tok, [0], ids) == " b [UNK] c"


# ------------------------------------------------------------------------------------------------
# Named chat templates (chat_template=), options checked before from_pretrained loads anything
# ------------------------------------------------------------------------------------------------
RAG = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
       "{% if add_generation_prompt %}[assistant] {% endif %}")


def test_named_templates_without_a_default_are_refused_when_the_session_is_made(tiny_chat):
    """A tokenizer with named chat templates but no "default" was accepted, then every send failed
    with advice to pass chat_template, which ChatSession did not take. Now it is refused when the
    session is made, and chat_template= (a name or a template, as transformers') chooses one: the
    prompt is that template's and the reply Hugging Face's greedy one for it."""
    hf, m, smol_tok, _ = tiny_chat
    tok = tc.Tokenizer(smol_tok.backend, max_length=None, pad_token=None, eos_token="<|im_end|>",
                       chat_template={"tool_use": smol_tok.chat_template, "rag": RAG})
    with pytest.raises(ValueError, match=r"^chat_template: this tokenizer has named chat templates but no 'default'; "
                                         r"pass the name of one \(or a template\) as chat_template; "
                                         r"names: \['rag', 'tool_use'\]$"):
        ChatSession(m, tok, max_new_tokens=2)
    ids = tok.apply_chat_template([{"role": "user", "content": MESSAGE}], add_generation_prompt=True, tokenize=True,
                                  chat_template=RAG)
    assert tok.decode(ids) == f"[user] {MESSAGE}\n[assistant] "
    ref = tok.decode(list(_hf_greedy(hf, ids, 3, tok.eos_token_id)), skip_special_tokens=True)
    no_template = tc.Tokenizer(smol_tok.backend, max_length=None, pad_token=None, eos_token="<|im_end|>")
    for tokenizer, choice in ((tok, "rag"), (tok, RAG), (no_template, RAG)):
        session = ChatSession(m, tokenizer, max_new_tokens=3, chat_template=choice)
        assert session.send(MESSAGE) == ref
        assert session.stats.prefill_tokens == len(ids) and session._cached_ids[:len(ids)] == ids
    with pytest.raises(TypeError, match="^chat_template: expected a str"):
        ChatSession(m, tok, chat_template=3)
    with pytest.raises(ValueError, match="^chat_template: expected a template or a template's name, got an empty"):
        ChatSession(m, tok, chat_template="")
    with pytest.raises(ValueError, match="^tokenizer: this model's tokenizer has no chat template"):
        ChatSession(m, no_template)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"max_new_tokens": 0}, ValueError, "^max_new_tokens: "),
    ({"temperature": -1}, ValueError, "^temperature: "),
    ({"top_p": 2.0, "temperature": 0.5}, ValueError, "^top_p: "),
    ({"system": 5}, TypeError, "^system: "),
    ({"system": "\udcff"}, ValueError, "^system: "),
    ({"chat_template": 3}, TypeError, "^chat_template: "),
    ({"temprature": 0.5}, TypeError, r"unexpected keyword argument 'temprature' \(expected one of: system, "),
])
def test_from_pretrained_checks_its_options_before_loading(monkeypatch, kwargs, error, match):
    """from_pretrained loaded the model and tokenizer (a float checkpoint: read and converted in
    full) before a bad option or a misspelt keyword was reported."""
    def load(*args, **kwargs):
        raise AssertionError("loaded before the options were checked")

    monkeypatch.setattr(tc.LlamaForCausalLM, "from_pretrained", load)
    monkeypatch.setattr(tc.Tokenizer, "from_pretrained", load)
    with pytest.raises(error, match=match):
        ChatSession.from_pretrained("SmolLM2-135M-Instruct", **kwargs)



# ------------------------------------------------------------------------------------------------
# The generation config's decoding options and end ids, as Hugging Face's generate
# ------------------------------------------------------------------------------------------------
PENALIZED = "underweight memories supervision classmates avian mileage"


def _generation_config_llama(transformers, path, generation_config: dict, eos=2):
    """(HF model read back from ``path``, our model, SmolLM2's tokenizer): a tiny random Llama saved
    with ``generation_config.json`` = ``generation_config``."""
    import json

    hf = _tiny_llama(transformers, path, eos=eos, seed=0, tie=False)
    hf.save_pretrained(path, safe_serialization=True)
    (path / "generation_config.json").write_text(json.dumps(generation_config))
    hf = transformers.LlamaForCausalLM.from_pretrained(path).eval()
    return hf, tc.LlamaForCausalLM.from_pretrained(path), tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct")


def test_replies_use_the_generation_configs_repetition_penalty_as_hf_generate(tmp_path):
    """generation_config.json's repetition_penalty was dropped by ChatSession and continue_text
    (their default None meant "no penalty"), while Hugging Face's generate and model.generate apply
    it. Now an option not given is the generation config's; None given still means none."""
    transformers = pytest.importorskip("transformers")
    import torch

    hf, m, tok = _generation_config_llama(transformers, tmp_path, {"eos_token_id": 2, "repetition_penalty": 1.5})
    prompt = tok.apply_chat_template([{"role": "user", "content": PENALIZED}], add_generation_prompt=True,
                                     tokenize=True)
    text = "Once upon a time " + PENALIZED
    ids = tok.encode(text, add_special_tokens=True)
    for p in (prompt, ids):
        with torch.no_grad():  # HF's generate reads the penalty from the file
            ref = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=8, do_sample=False, pad_token_id=0).numpy()[0, len(p):]
            plain = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                max_new_tokens=8, do_sample=False, pad_token_id=0,
                                repetition_penalty=1.0).numpy()[0, len(p):]
        assert ref.tolist() != plain.tolist()  # the penalty changes this model's tokens
        np.testing.assert_array_equal(m.generate(np.array([p]), max_new_tokens=8)[0, len(p):], ref)
        expected = tok.decode(ref.tolist(), skip_special_tokens=True)
        unpenalized = tok.decode(plain.tolist(), skip_special_tokens=True)
        if p is prompt:
            assert ChatSession(m, tok, max_new_tokens=8).send(PENALIZED) == expected
            assert ChatSession(m, tok, max_new_tokens=8, repetition_penalty=None).send(PENALIZED) == unpenalized
        else:
            assert text + continue_text(m, tok, text, max_new_tokens=8)[0] == tok.decode(ids + ref.tolist(),
                                                                                      skip_special_tokens=True)
            assert continue_text(m, tok, text, max_new_tokens=8, repetition_penalty=1.0)[0] == \
                tok.decode(ids + plain.tolist(), skip_special_tokens=True)[len(tok.decode(ids, skip_special_tokens=True)):]


def test_sampled_replies_use_the_generation_configs_top_k_and_top_p(tmp_path):
    """Sampling used top_k 50 and no top-p whatever generation_config.json said; now the file's
    top_k, top_p and repetition_penalty, as model.generate (the same seed, the same tokens)."""
    transformers = pytest.importorskip("transformers")
    _, m, tok = _generation_config_llama(transformers, tmp_path,
                                         {"eos_token_id": 2, "top_k": 4, "top_p": 0.7, "repetition_penalty": 1.3})
    prompt = tok.apply_chat_template([{"role": "user", "content": PENALIZED}], add_generation_prompt=True,
                                     tokenize=True)
    ids = np.array([prompt])

    def sampled(**options):
        out = m.generate(ids, max_new_tokens=10, do_sample=True, temperature=1.5, seed=3, **options)
        return tok.decode(out[0, len(prompt):].tolist(), skip_special_tokens=True)

    expected = sampled()
    assert expected != sampled(top_k=50, top_p=None, repetition_penalty=None)  # the file's options matter
    assert ChatSession(m, tok, max_new_tokens=10, temperature=1.5, seed=3).send(PENALIZED) == expected
    # an option given wins over the file's
    assert ChatSession(m, tok, max_new_tokens=10, temperature=1.5, seed=3, top_k=50, top_p=None,
                       repetition_penalty=None).send(PENALIZED) == sampled(top_k=50, top_p=None,
                                                                           repetition_penalty=None)


def test_a_bad_generation_config_value_is_named_when_the_session_is_made(tmp_path):
    """A bad value of generation_config.json for an option left to it is refused when the session is
    made (naming the file and field), not at the first reply."""
    transformers = pytest.importorskip("transformers")
    _, m, tok = _generation_config_llama(transformers, tmp_path, {"eos_token_id": 2, "repetition_penalty": -1.0,
                                                                  "top_k": -3})
    with pytest.raises(ValueError, match=r"^generation_config.json: repetition_penalty: expected a finite number > 0"):
        ChatSession(m, tok)
    with pytest.raises(ValueError, match=r"^generation_config.json: top_k: "):
        ChatSession(m, tok, temperature=1.0, repetition_penalty=1.2)
    with pytest.raises(ValueError, match=r"^generation_config.json: repetition_penalty: "):
        continue_text(m, tok, "hi", max_new_tokens=2)
    ChatSession(m, tok, repetition_penalty=None)  # given: the file's value is not used


def test_replies_stop_only_at_the_generation_configs_end_ids_as_hf_generate(tmp_path):
    """The tokenizer's EOS ended a reply even where generation_config.json's eos_token_id leaves it
    out; Hugging Face's generate (and model.generate) go on. The tokenizer's EOS is the end token
    only when neither the generation config nor config.json names one (this package's fallback)."""
    transformers = pytest.importorskip("transformers")
    import json

    import torch

    tok = tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct")
    prompt = tok.apply_chat_template([{"role": "user", "content": MESSAGE}], add_generation_prompt=True,
                                     tokenize=True)
    hf = _tiny_llama(transformers, tmp_path, eos=2, tie=False)
    with torch.no_grad():  # greedy emits the tokenizer's EOS (<|im_end|> = 2) first
        h = hf.model(torch.tensor([prompt])).last_hidden_state[0, -1]
        hf.lm_head.weight[2] = h / h.norm() * 50
    hf.save_pretrained(tmp_path, safe_serialization=True)
    assert tok.eos_token_id == 2
    for generation_config, eos_name in (({"eos_token_id": [5]}, "[5]"), ({}, "none in the generation config"),
                                        (None, "config.json's 2"), ("no end id", "none anywhere")):
        path = tmp_path / "generation_config.json"
        path.unlink(missing_ok=True)
        if generation_config == "no end id":
            config = json.loads((tmp_path / "config.json").read_text())
            (tmp_path / "config.json").write_text(json.dumps({**config, "eos_token_id": None}))
        elif generation_config is not None:
            path.write_text(json.dumps(generation_config))
        ref_model = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
        with torch.no_grad():
            ref = ref_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                     max_new_tokens=5, do_sample=False, pad_token_id=0).numpy()[0, len(prompt):]
        m = tc.LlamaForCausalLM.from_pretrained(tmp_path)
        session = ChatSession(m, tok, max_new_tokens=5)
        reply = session.send(MESSAGE)
        generated = session.stats.decode_tokens + 1
        if generation_config == "no end id":  # HF runs on; this package stops at the tokenizer's EOS
            assert ref.tolist()[0] == 2 and len(ref) == 5 and generated == 1 and reply == "", eos_name
            continue
        np.testing.assert_array_equal(m.generate(np.array([prompt]), max_new_tokens=5)[0, len(prompt):], ref)
        assert generated == len(ref), eos_name
        assert reply == tok.decode(ref.tolist(), skip_special_tokens=True), eos_name
        assert session._cached_ids[len(prompt):] == ref.tolist()[:-1], eos_name
        out, stats = continue_text(m, tok, tok.decode(prompt), max_new_tokens=5)
        assert stats.decode_tokens + 1 == len(ref), eos_name
