"""Chatting with a causal LM (SmolLM2-135M-Instruct by default): the conversation rendered with the
model's chat template, each reply streamed as it is generated, and the KV cache
(:class:`transformer_core.KVCache`, after Hugging Face transformers' ``DynamicCache``) kept between
turns so a turn runs only its new tokens.

    session = ChatSession.from_pretrained("SmolLM2-135M-Instruct", system="You are terse.")
    reply = session.send("What is the capital of France?", on_text=print)
    session.stats   # prefill and decode tokens and seconds of the last turn
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._validation import check_int, described
from .decoder import CausalLM
from .generation import (
    DECODING_DEFAULTS,
    MODEL_DEFAULT,
    GenerationConfig,
    check_repetition_penalty,
    check_top_k,
    check_top_p,
    decoding_options,
    generation_ids,
)
from .tokenizer import Tokenizer, _common_prefix, check_unicode

__all__ = ["ChatSession", "TurnStats", "continue_text", "run_chat", "run_generate"]

DEFAULT_CHAT_MODEL = "SmolLM2-135M-Instruct"
NO_TEMPLATE = "this model's tokenizer has no chat template"
#: The CLI's --max-new-tokens when not given (``generate``: fewer when the context ends first).
DEFAULT_MAX_NEW_TOKENS = 256


@dataclass
class TurnStats:
    """Timings of one generation: the prompt (prefill) and the new tokens (decode).

    Attributes:
        prefill_tokens: tokens run through the model before the first new token (only those not
            already in the KV cache).
        prefill_seconds: wall time until the first new token.
        decode_tokens: new tokens after the first (each one decoding step).
        decode_seconds: wall time of those steps.
    """

    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        """Prompt tokens per second (0 when nothing was timed)."""
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Decoded tokens per second (0 when nothing was timed)."""
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def __str__(self) -> str:
        return (f"prefill: {self.prefill_tokens} tokens, {self.prefill_tokens_per_second:.1f} tokens/s; "
                f"decode: {self.decode_tokens} tokens, {self.decode_tokens_per_second:.1f} tokens/s")


def _end_ids(model, tokenizer) -> list[int]:
    """The ids that end a reply, as Hugging Face's ``generate`` (and ``model.generate``) stops: the
    model's ``eos_token_id`` (one id or a list, e.g. Llama-3-Instruct's ``[128001, 128008,
    128009]``; its ``generation_config.json``'s where it has one, even when that names none, else
    its ``config.json``'s), those inside the model's vocabulary. The tokenizer's EOS is not added
    to them; only when neither file names an end id is it the end token: a fallback of this
    package (Hugging Face's ``generate`` would run to ``max_new_tokens``)."""
    vocab = model.config.vocab_size
    config_eos, _ = generation_ids(model)
    own = getattr(model, "generation_config", None)
    named = config_eos or (own is not None and getattr(model.config, "eos_token_id", None) not in (None, []))
    candidates = config_eos if named else [tokenizer.eos_token_id]
    ids: list[int] = []
    for e in candidates:
        if isinstance(e, (int, np.integer)) and not isinstance(e, bool) and 0 <= e < vocab and int(e) not in ids:
            ids.append(int(e))
    return ids


def _known_ids(tokenizer, ids) -> list[int]:
    """``ids`` without those that have no token: a model's embedding is often padded past the
    tokenizer's vocabulary (``vocab_size`` rounded up to a multiple of 64, say), and a vocabulary's
    ids may skip some; such an id adds no text (as Hugging Face's tokenizers decode it: ""). The
    test is the token, not ``vocab_size``: with gaps, real ids reach past it."""
    return [i for i in ids if tokenizer.id_to_token(i) is not None]


def _text_after(tokenizer, context: list[int], ids: list[int]) -> str:
    """The text ``ids`` add after ``context``: ``decode(context + ids)`` past ``decode(context)``
    (ids past the tokenizer's vocabulary left out)."""
    base = tokenizer.decode(context, skip_special_tokens=True)
    full = tokenizer.decode(context + _known_ids(tokenizer, ids), skip_special_tokens=True)
    return full[_common_prefix(base, full):]


def _stream(model, tokenizer, ids: np.ndarray, cache, on_text, stats: TurnStats, context=(), **options) -> list[int]:
    """Runs ``model.stream`` over ``ids (1, L)`` with ``cache``, pushing text to ``on_text`` (the
    text the new ids add after ``context``: :meth:`Tokenizer.text_stream` primed with it; ids past
    the tokenizer's vocabulary, or that it skips, add none: see :func:`_known_ids`); returns the
    generated ids (an end token included) and fills ``stats``."""
    text = tokenizer.text_stream(skip_special_tokens=True, context=context) if on_text is not None else None
    generated: list[int] = []
    stats.prefill_tokens = ids.shape[1] - cache.length
    start = time.perf_counter()
    last = start
    for step, token in enumerate(model.stream(ids, past_key_values=cache, **options)):
        now = time.perf_counter()
        if step == 0:
            stats.prefill_seconds = now - start
        else:
            stats.decode_seconds += now - last
            stats.decode_tokens += 1
        last = now
        token_id = int(token[0])
        generated.append(token_id)
        if on_text is not None and tokenizer.id_to_token(token_id) is not None:
            piece = text.push(token_id)
            if piece:
                on_text(piece)
    if on_text is not None:
        tail = text.finish()
        if tail:
            on_text(tail)
    return generated


def _type_name(value) -> str:
    """``value``'s type for an error message: ``str``, or ``GPT2TokenizerFast (transformers)`` for
    a type of another package."""
    kind = type(value)
    package = kind.__module__.split(".")[0]
    return kind.__qualname__ if package == "builtins" else f"{kind.__qualname__} ({package})"


def _check_model_and_tokenizer(model, tokenizer) -> None:
    """``model`` is a causal LM of this package and ``tokenizer`` its :class:`Tokenizer`, checked
    before anything uses them (None, a string or a ``transformers`` object otherwise failed later
    with an AttributeError, or a ValueError about ``'input_ids'``).

    Raises:
        TypeError: naming ``model`` or ``tokenizer``, expected vs got.
    """
    if not isinstance(model, CausalLM):
        hint = " (a name or path: load it with LlamaForCausalLM.from_pretrained)" if isinstance(model, str) else ""
        raise TypeError(f"model: expected a transformer_core causal LM (LlamaForCausalLM, GPT2LMHeadModel, ...: "
                        f"a transformer_core.decoder.CausalLM), got {_type_name(model)}{hint}")
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer: expected a transformer_core Tokenizer (Tokenizer.from_pretrained), got "
                        f"{_type_name(tokenizer)}")


def _options(max_new_tokens, temperature, top_p, top_k, seed, repetition_penalty) -> dict:
    """``stream``'s keyword arguments for these options. Every option is checked here, as
    ``generate`` would check it, so that a bad one is reported when a session is made or before a
    model is loaded, not at the first reply; top_p, top_k and seed are checked even when greedy
    (temperature 0), where they are not used (nor passed on: ``stream`` would warn about them at
    every reply). ``top_p``, ``top_k`` and ``repetition_penalty`` left to :data:`MODEL_DEFAULT` are
    passed on so: ``stream`` takes the model's generation config's (see :func:`_check_model_options`)."""
    if isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature: expected a number, got {described(temperature)}")
    temperature = float(temperature)
    if not temperature >= 0:
        raise ValueError(f"temperature: expected a value >= 0 (0 = greedy), got {temperature}")
    sample = temperature > 0

    def given(value, key):
        """``value`` as checked here: the built-in default of ``key`` (``DECODING_DEFAULTS``, a
        float or int, or None) for :data:`MODEL_DEFAULT`, whose model value is checked later by
        :func:`_check_model_options`; else ``value`` itself. Raises nothing."""
        return DECODING_DEFAULTS[key] if value is MODEL_DEFAULT else value

    GenerationConfig(max_new_tokens, do_sample=sample, temperature=temperature if sample else 1.0,
                     top_k=given(top_k, "top_k"), top_p=given(top_p, "top_p"),
                     repetition_penalty=given(repetition_penalty, "repetition_penalty"), seed=seed)
    return dict(max_new_tokens=max_new_tokens, do_sample=sample, temperature=temperature if sample else 1.0,
                top_p=top_p if sample else None, top_k=top_k if sample else None, seed=seed if sample else None,
                repetition_penalty=repetition_penalty)


def _check_model_options(model, options: dict) -> None:
    """The values of ``model``'s generation config (a directory's ``generation_config.json``) that
    ``options`` (from :func:`_options`) leave to it, checked as ``stream`` checks them: a bad one
    is reported when a session is made, not at its first reply.

    Raises:
        TypeError, ValueError: naming the file and field (``generation_config.json: top_k: ...``).
    """
    values, names = decoding_options(model, options["do_sample"], options["temperature"], options["top_k"],
                                     options["top_p"], options["repetition_penalty"])
    check_repetition_penalty(values["repetition_penalty"], names["repetition_penalty"])
    if options["do_sample"]:
        check_top_k(values["top_k"], names["top_k"])
        check_top_p(values["top_p"], names["top_p"])


def _check_system(system) -> None:
    """``system`` is None or a str of valid Unicode."""
    if system is not None and not isinstance(system, str):
        raise TypeError(f"system: expected a str, got {type(system).__name__}")
    if system is not None:
        check_unicode(system, "system")


def _check_chat_template_value(chat_template) -> None:
    """``chat_template`` is None or a non-blank str (a template or a template's name), checked
    before any tokenizer is read."""
    if chat_template is not None and not isinstance(chat_template, str):
        raise TypeError(f"chat_template: expected a str (a template, or the name of one of the tokenizer's named "
                        f"templates) or None, got {type(chat_template).__name__}")
    if chat_template is not None and not chat_template.strip():
        raise ValueError(f"chat_template: expected a template or a template's name, got "
                         f"{'an empty string' if not chat_template else 'only whitespace'}")


def _check_chat_template(tokenizer, chat_template) -> None:
    """``tokenizer`` has a template for ``chat_template`` to choose (see
    :meth:`Tokenizer.get_chat_template`): a tokenizer without one, or with named templates but no
    ``"default"`` and none chosen, is refused when the session is made, not at every ``send``."""
    _check_chat_template_value(chat_template)
    if chat_template is None and tokenizer.chat_template is None:
        raise ValueError(f"tokenizer: {NO_TEMPLATE} (use continue_text, or pass a template as chat_template)")
    tokenizer.get_chat_template(chat_template)  # named templates, no "default", none chosen: ValueError


class ChatSession:
    """A conversation with a chat model.

    Each :meth:`send` appends the user's message, renders the whole conversation with the
    tokenizer's chat template (``add_generation_prompt=True``), runs only the tokens the KV cache
    does not hold yet (the cache is cut back to the longest common prefix of the cached tokens and
    the new prompt), streams the reply until an end token or ``max_new_tokens``, and appends the
    reply to the conversation. The end tokens are the model's ``eos_token_id`` (e.g. SmolLM2's
    ``<|im_end|>``), as Hugging Face's ``generate`` stops: its ``generation_config.json``'s where
    it has one, even when that names none (if ``config.json`` names one, no token then ends the
    reply: it runs to ``max_new_tokens``, as Hugging Face's), else its ``config.json``'s. The
    tokenizer's EOS is the end token only when neither ``generation_config.json`` nor
    ``config.json`` names an end id (a fallback of this package: Hugging Face's would run to
    ``max_new_tokens``).

    The decoding options not given (``top_p``, ``top_k``, ``repetition_penalty``) are the model's
    generation config's, as in ``model.generate`` and Hugging Face's ``generate``: a
    ``generation_config.json`` with ``"repetition_penalty": 1.1`` penalizes every reply.

    Ids past the tokenizer's vocabulary (a model whose embedding is padded beyond it) are generated
    and cached as any other but add no text to the reply (Hugging Face decodes them as "").

    Args:
        model: a causal LM (:class:`~transformer_core.LlamaForCausalLM`, GPT-2, ...).
        tokenizer: its :class:`~transformer_core.Tokenizer`, with a chat template.
        system: an optional system message.
        max_new_tokens: the most tokens one reply may have (>= 1).
        temperature: 0 (default) = greedy; any finite number > 0 samples from
            ``softmax(logits / temperature)``, as Hugging Face's (a tiny one samples the argmax).
        top_p, top_k: sampling filters (with ``temperature`` > 0; ``top_p`` in [0, 1], 0 keeping
            the top token only, None or 1: no top-p filter; ``top_k`` 0 or None: no top-k filter).
            Not given (:data:`~transformer_core.generation.MODEL_DEFAULT`): the model's generation
            config's, else no top-p filter and ``top_k`` 50, as Hugging Face's ``generate``.
        seed: seeds sampling (reproducible replies); None: each reply draws one as ``generate``
            does (from :func:`transformer_core.manual_seed`'s generator once it was seeded, else
            fresh entropy: replies differ from run to run). Checked, but unused, when greedy.
        repetition_penalty: any finite number > 0, as Hugging Face's; 1 or None = none. Not
            given (:data:`~transformer_core.generation.MODEL_DEFAULT`): the model's generation
            config's, else none. Greedy replies use it too.
        chat_template: the template to render with, as transformers' ``apply_chat_template``
            argument of that name: the name of one of the tokenizer's named templates, or a Jinja2
            template; None (default): the tokenizer's own (its ``"default"`` one when it has
            named templates).

    Raises:
        TypeError: ``model`` not a causal LM of this package (a :class:`~transformer_core.decoder.CausalLM`),
            ``tokenizer`` not a :class:`~transformer_core.Tokenizer` (a ``transformers`` tokenizer
            included); ``system`` or ``chat_template`` not a str or None; options of the wrong type
            (named).
        ValueError: a tokenizer without a chat template and no ``chat_template`` given; a tokenizer
            with named templates but no ``"default"`` and no ``chat_template`` given (listing the
            names); an empty ``chat_template``; bad options (named: ``max_new_tokens`` < 1,
            ``temperature`` < 0 or not finite, ``top_k`` < 0, ``top_p`` outside [0, 1],
            ``repetition_penalty`` <= 0, ...), whatever the temperature; a ``system`` message that
            is not valid Unicode. TypeError, ValueError naming ``generation_config.json`` and the
            field: a bad value of the model's generation config for an option not given.
    """

    def __init__(self, model, tokenizer, system: str | None = None, max_new_tokens: int = 256,
                 temperature: float = 0.0, top_p: float | None = MODEL_DEFAULT, top_k: int | None = MODEL_DEFAULT,
                 seed: int | None = None, repetition_penalty: float | None = MODEL_DEFAULT,
                 chat_template: str | None = None):
        _check_model_and_tokenizer(model, tokenizer)
        _check_chat_template(tokenizer, chat_template)
        _check_system(system)
        self.model, self.tokenizer, self.chat_template = model, tokenizer, chat_template
        self.options = _options(check_int(max_new_tokens, "max_new_tokens", 1), temperature, top_p, top_k, seed,
                                repetition_penalty)
        _check_model_options(model, self.options)
        self.messages: list[dict] = [] if system is None else [{"role": "system", "content": system}]
        self.cache = model.new_cache(1)
        self._cached_ids: list[int] = []  # the tokens whose keys and values the cache holds
        self.stats = TurnStats()

    @classmethod
    def from_pretrained(cls, name_or_path=DEFAULT_CHAT_MODEL, **kwargs) -> "ChatSession":
        """A session with a Llama-family chat model and its tokenizer: a GGUF file, a Hugging Face
        directory, or the embedded ``"SmolLM2-135M-Instruct"``; ``kwargs`` as :class:`ChatSession`.
        The options (and the keywords' names) are checked before the model and tokenizer load.

        Raises:
            FileNotFoundError, ValueError: as ``LlamaForCausalLM.from_pretrained``.
            TypeError, ValueError: as :class:`ChatSession`; bad options and a keyword that is not
                one of its options (TypeError) before anything is loaded.
        """
        import inspect

        from .llama import LlamaForCausalLM
        from .tokenizer import Tokenizer

        parameters = inspect.signature(cls).parameters
        options = [name for name in parameters if name not in ("model", "tokenizer")]
        for name in kwargs:
            if name not in options:
                raise TypeError(f"ChatSession.from_pretrained() got an unexpected keyword argument {name!r} "
                                f"(expected one of: {', '.join(options)})")
        given = {name: kwargs.get(name, parameters[name].default) for name in options}
        _check_system(given["system"])
        _options(check_int(given["max_new_tokens"], "max_new_tokens", 1), given["temperature"], given["top_p"],
                 given["top_k"], given["seed"], given["repetition_penalty"])
        _check_chat_template_value(given["chat_template"])
        return cls(LlamaForCausalLM.from_pretrained(name_or_path), Tokenizer.from_pretrained(name_or_path), **kwargs)

    def send(self, message: str, on_text: Callable[[str], None] | None = None) -> str:
        """The model's reply to ``message``, streamed to ``on_text`` piece by piece as it is generated.

        The reply has at most ``max_new_tokens`` tokens, fewer when the context ends first: a
        prompt of P tokens (the whole rendered conversation) leaves room for ``context - P + 1``
        (the reply's last token is not fed back through the model, as in ``generate``).

        Raises:
            TypeError: ``message`` not a str, ``on_text`` not callable. ValueError: an empty (or
            all-whitespace) message, a message that is not valid Unicode, a chat template that
            renders an empty prompt, or a prompt longer than the model's context: the message
            itself is too long (alone with the template and the system message: shorten it), or
            the conversation has outgrown the context (shorten the message, or start a new session
            when the earlier turns alone leave no room).
        """
        if not isinstance(message, str):
            raise TypeError(f"message: expected a str, got {type(message).__name__}")
        _check_message(message, "message")
        _check_on_text(on_text)
        messages = self.messages + [{"role": "user", "content": message}]
        prompt = self._render(messages)
        if not prompt:
            raise ValueError("tokenizer: the chat template rendered an empty prompt (no tokens) for this "
                             "conversation; there is nothing to answer")
        # the reply's last token is never fed back: a prompt of P tokens leaves room for
        # context - P + 1 new ones (P + new - 1 positions), as model.generate
        room = self.model.context_length - len(prompt) + 1
        if room < 1:
            context = self.model.context_length
            # the message alone (after the system message, as on a first turn): too long, it must be shortened
            alone = [m for m in self.messages if m["role"] == "system"][:1] + messages[-1:]
            n = len(prompt) if alone == messages else len(self._render(alone))
            if n > context:
                system = " and the system message" if len(alone) > 1 else ""
                raise ValueError(f"message: {n} tokens (with the chat template{system}) exceed the model's "
                                 f"context ({context} tokens); shorten it")
            # the conversation with a one-character message: if even that does not fit, no shorter message helps
            shortest = len(self._render(self.messages + [{"role": "user", "content": "."}]))
            advice = ("start a new session" if shortest > context else
                      f"shorten the message (by {len(prompt) - context} tokens or more) or start a new session")
            raise ValueError(f"message: the conversation ({len(prompt)} tokens) no longer fits the model's context "
                             f"({context} tokens); {advice}")
        # Keep the cached prefix the new prompt shares; at least the prompt's last token runs again.
        common = 0
        for a, b in zip(self._cached_ids, prompt[:-1]):
            if a != b:
                break
            common += 1
        self.cache.crop(common)
        # From here the cache holds more than _cached_ids says only while this turn runs: a turn
        # that fails (on_text raising, Ctrl-C) leaves the ids of the prefix it kept, nothing stale.
        self._cached_ids = self._cached_ids[:common]
        options = dict(self.options, max_new_tokens=min(self.options["max_new_tokens"], room))
        self.stats = TurnStats()
        generated = _stream(self.model, self.tokenizer, np.array([prompt], np.int64), self.cache, on_text,
                            self.stats, eos_token_id=_end_ids(self.model, self.tokenizer), **options)
        # The cache now holds the prompt and every generated token but the last (never fed back).
        self._cached_ids = prompt + generated[:-1]
        reply = self.tokenizer.decode(_known_ids(self.tokenizer, generated), skip_special_tokens=True)
        self.messages = messages + [{"role": "assistant", "content": reply}]
        return reply

    def _render(self, messages: list[dict]) -> list[int]:
        """The ids of ``messages`` rendered with the session's chat template, ending with the
        header of the assistant's turn."""
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  chat_template=self.chat_template)


def _check_on_text(on_text) -> None:
    """``on_text`` is None or a callable: checked before the prompt runs."""
    if on_text is not None and not callable(on_text):
        raise TypeError(f"on_text: expected a callable taking a str, or None, got {type(on_text).__name__}")


def _check_message(text: str, name: str) -> None:
    """A chat turn must say something (a blank one would be sent to the model as an empty user
    turn) and be valid Unicode."""
    if not text.strip():
        raise ValueError(f"{name}: expected a message, got {'an empty string' if not text else 'only whitespace'}")
    check_unicode(text, name)


def continue_text(model, tokenizer, text: str, max_new_tokens: int = 128, on_text=None, temperature: float = 0.0,
                  top_p: float | None = MODEL_DEFAULT, top_k: int | None = MODEL_DEFAULT, seed: int | None = None,
                  repetition_penalty: float | None = MODEL_DEFAULT) -> tuple[str, TurnStats]:
    """Continues raw ``text`` (no chat template): its tokens (with the BOS the tokenizer adds, if
    any), then up to ``max_new_tokens`` new ones, stopping at an end token: the model's
    ``eos_token_id``, as :class:`ChatSession`'s (its ``generation_config.json``'s where it has one,
    else its ``config.json``'s); the tokenizer's EOS only when neither ``generation_config.json``
    nor ``config.json`` names an end id. The options as
    :class:`ChatSession`'s: ``top_p``, ``top_k`` and ``repetition_penalty`` not given are the
    model's generation config's, as in Hugging Face's ``generate``.

    Returns:
        ``(the continuation, its TurnStats)``. The continuation is the text the new tokens add to
        the text's tokens, ``decode(ids + new)`` past ``decode(ids)``, as streamed to ``on_text``:
        ``text + continuation`` reads as the whole sequence's decode, the space before the first
        new word included for a SentencePiece tokenizer (Llama 2's, whose decoder strips the
        leading space of what it decodes). Ids past the tokenizer's vocabulary (a padded
        embedding's) add no text.

    Raises:
        TypeError: ``model`` not a causal LM of this package, ``tokenizer`` not a
        :class:`~transformer_core.Tokenizer` (both named, before anything else); ``text`` not a
        str, ``on_text`` not callable. ValueError: empty text or text that
        is not valid Unicode; text whose tokens alone are more than the model's context (naming ``text``), or
        ``len(tokens) + max_new_tokens - 1`` over it (naming ``max_new_tokens``; the last new
        token is never fed back) — before any memory is reserved for them; bad options (named; a
        bad value of the model's generation config for an option not given: naming the file and
        field).
    """
    _check_model_and_tokenizer(model, tokenizer)
    options = _options(check_int(max_new_tokens, "max_new_tokens", 1), temperature, top_p, top_k, seed,
                       repetition_penalty)
    _check_on_text(on_text)
    return _continue(model, tokenizer, _text_ids(model, tokenizer, text, options["max_new_tokens"]), options,
                     on_text)


def _text_ids(model, tokenizer, text, max_new_tokens: int | None) -> list[int]:
    """The ids of the text to continue, checked to leave room for ``max_new_tokens`` in the
    context (``len(ids) + max_new_tokens - 1`` positions: the last new token is never fed back):
    the KV cache is sized for both, so a huge ``max_new_tokens`` must fail here, not after
    gigabytes have been reserved. ``max_new_tokens=None``: only the text is checked."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected a str, got {type(text).__name__}")
    if not text:
        raise ValueError("text: expected some text, got an empty string")
    ids = tokenizer.encode(text, add_special_tokens=True)
    if not ids:
        raise ValueError("text: expected some text, got none")
    field = getattr(model, "_context_field", "context_length")
    context = model.context_length
    if len(ids) > context:
        raise ValueError(f"text: {len(ids)} tokens exceed the context ({field} = {context})")
    if max_new_tokens is None:
        return ids
    total = len(ids) + max_new_tokens - 1  # the positions the model sees: the last new token is not fed back
    if total > context:
        raise ValueError(f"max_new_tokens: prompt length {len(ids)} + {max_new_tokens} exceeds the context "
                         f"({field} = {context})")
    return ids


def _continue(model, tokenizer, ids: list[int], options: dict, on_text) -> tuple[str, TurnStats]:
    """continue_text's generation, from checked ids and options (the model's generation config's
    values for those left to it checked here, before the cache is made)."""
    _check_model_options(model, options)
    stats = TurnStats()
    cache = model.new_cache(1, len(ids) + options["max_new_tokens"] - 1)
    generated = _stream(model, tokenizer, np.array([ids], np.int64), cache, on_text, stats, context=ids,
                        eos_token_id=_end_ids(model, tokenizer), **options)
    return _text_after(tokenizer, ids, generated), stats


# ------------------------------------------------------------------------------------------------
# The command line (``python -m transformer_core chat|generate``; errors are reported by __main__)
# ------------------------------------------------------------------------------------------------
def _cli_model(args) -> str:
    """``--model``: :data:`DEFAULT_CHAT_MODEL` when not given; a value given is kept as it is (an
    empty one is refused by :func:`_check_cli_model`, not taken for the default)."""
    return DEFAULT_CHAT_MODEL if args.model is None else args.model


def _check_cli_model(name: str) -> None:
    """Checks that ``--model`` names something ``LlamaForCausalLM`` and ``Tokenizer`` load, before
    either reads it, so that each error names the option (``model: ...``) and what was found, not
    only a file inside it: a GGUF file, or a directory with a ``config.json`` of ``model_type``
    ``'llama'`` and a ``tokenizer.json``.

    Raises:
        FileNotFoundError, TypeError, ValueError: as :func:`~transformer_core.hub.resolve_model_path`
            (an empty name included); a file that is not GGUF (ValueError); a directory without
            ``config.json`` or ``tokenizer.json`` (FileNotFoundError); a ``config.json`` of another
            ``model_type`` (ValueError; one that is not a JSON object: as ``read_config``). All
            start with ``model:``, but for a malformed ``config.json``, which names the file.
    """
    from .hub import read_config, resolve_model_path
    from .tokenizer import _check_gguf_magic

    location = resolve_model_path(name, argument="model")
    if location.is_file():
        _check_gguf_magic(location, name, "model")
        return
    for file in ("config.json", "tokenizer.json"):
        if not (location / file).is_file():
            raise FileNotFoundError(f"model: {name!r} is a directory without {file} ({location}), not a model "
                                    f"directory (expected a Hugging Face Llama model's config.json and "
                                    f"tokenizer.json)")
    model_type = read_config(location).get("model_type", "llama")  # LlamaConfig's default too
    if model_type != "llama":
        raise ValueError(f"model: {name!r} is a model of type {model_type!r} ({location / 'config.json'}), "
                         f"expected a Llama-family causal LM (model_type 'llama')")


def _load(args):
    """``(model, tokenizer)`` of ``--model``, checked first (:func:`_check_cli_model`)."""
    tokenizer = _load_tokenizer(args)
    return _load_model(args), tokenizer


def _load_tokenizer(args):
    """The tokenizer of ``--model``, checked first (:func:`_check_cli_model`); it is small, and
    ``chat`` checks its chat template before the model loads."""
    from .tokenizer import Tokenizer

    name = _cli_model(args)
    _check_cli_model(name)  # a wrong model is named as the option: "model: ..."
    return Tokenizer.from_pretrained(name)


def _load_model(args):
    """The model of ``--model`` (already checked), quantized as ``--quantize`` says."""
    from .llama import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(_cli_model(args))  # a GGUF file's blocks kept as stored (fast decode)
    if getattr(args, "quantize", None) is not None:
        from .quantization import quantize

        model = quantize(model, args.quantize)  # from the dequantized weights
    return model


def _check_cli_chat_template(args, tokenizer) -> None:
    """``--chat-template NAME`` names one of the tokenizer's named chat templates; without it, the
    tokenizer has a template to use (a single one, or a ``"default"`` among named ones).

    Raises:
        ValueError: no chat template (pointing to ``generate``); named templates without
        ``"default"`` and no ``--chat-template`` (listing the names); ``--chat-template`` that is
        not one of the names (listing them), or given for a tokenizer without named templates.
    """
    stored, name, model = tokenizer.chat_template, args.chat_template, _cli_model(args)
    if stored is None:
        raise ValueError(f"model: {model}: {NO_TEMPLATE}; the `generate` command continues raw text")
    names = sorted(stored) if isinstance(stored, dict) else []
    if name is None:
        if isinstance(stored, dict) and "default" not in stored:
            raise ValueError(f"model: {model}: this model's tokenizer has named chat templates but no 'default'; "
                             f"choose one with --chat-template NAME (names: {', '.join(names)})")
        return
    if not names:
        raise ValueError(f"chat_template: this model's tokenizer has a single chat template, no named ones; got "
                         f"{name!r} (leave --chat-template out)")
    if name not in stored:
        raise ValueError(f"chat_template: expected one of this model's named chat templates ({', '.join(names)}), "
                         f"got {name!r}")


def _print(text: str) -> None:
    import sys

    sys.stdout.write(text)
    sys.stdout.flush()


def _check_stdout() -> None:
    """Standard output closed when the command started (``generate ... >&-``: Python's
    ``sys.stdout`` is None): refused before the model loads, not an AttributeError at the first
    token."""
    import sys

    if sys.stdout is None:
        raise ValueError("stdout: standard output is closed; there is nowhere to write the reply")


def _stdin_turns():
    r"""The turns read from standard input, one a line, as bytes decoded here one line at a time:
    the lines before an invalid UTF-8 byte are answered, then ValueError naming the line (the
    UTF-8 byte-order mark of a first line dropped; line ends ``\n`` or ``\r\n`` removed; blank
    lines skipped)."""
    import codecs
    import sys

    stream = getattr(sys.stdin, "buffer", None)
    interactive = sys.stdin.isatty()
    lineno = 0
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        raw = stream.readline() if stream is not None else sys.stdin.readline()  # a text stream: a test's
        if not raw:
            if interactive:  # Ctrl-D: end the prompt's line, as a shell does
                print(file=sys.stderr, flush=True)
            return
        lineno += 1
        if isinstance(raw, bytes):
            if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"stdin, line {lineno}: invalid UTF-8 (byte {e.start + 1} of the line: "
                                 f"{raw[e.start:e.start + 1]!r})") from None
        else:
            line = raw
        message = line.rstrip("\r\n")  # a CRLF file's turns end in no "\r" either
        if message.strip():
            yield message


def _cli_option(value):
    """A sampling option of the command line (``--top-k``, ``--top-p``): its value when given, else
    :data:`MODEL_DEFAULT` (the model's generation config's, as :class:`ChatSession`'s default)."""
    return MODEL_DEFAULT if value is None else value


def _check_cli_sampling(args) -> None:
    """``--top-k``, ``--top-p`` and ``--seed`` act only on sampling: given with ``--temperature 0``
    (greedy, the default) they would change nothing, so the command refuses them rather than
    ignore them.

    Raises:
        ValueError: ``--top-k``, ``--top-p`` or ``--seed`` given with ``--temperature 0`` (the
        option named).
    """
    if args.temperature != 0:
        return
    for name, value in (("top_k", args.top_k), ("top_p", args.top_p), ("seed", args.seed)):
        if value is not None:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{name}: acts only when sampling; give --temperature > 0 with {flag} (temperature 0, "
                             f"the default, is greedy)")


def run_chat(args) -> int:
    """``chat``: one PROMPT, or one turn per line of standard input; replies streamed to stdout,
    the tokens/s of each turn on stderr. ``--max-new-tokens`` (default 256) is the most each reply
    may have: fewer when the conversation comes near the end of the context. ``--temperature`` > 0
    samples, among the ``--top-k`` highest (0: no top-k filter) and within ``--top-p``; not given,
    they and the repetition penalty are the model's generation config's, as :class:`ChatSession`'s
    and Hugging Face's (``top_k`` 50 when it has none). ``--chat-template NAME`` picks one of the
    tokenizer's named chat templates. Piped standard input without a turn (empty, or only blank
    lines) is an error, as an empty PROMPT is."""
    import itertools
    import sys

    # The arguments are checked before the model is loaded (seconds) and before anything is printed.
    if args.prompt is not None:
        _check_message(args.prompt, "prompt")
    if args.system is not None:
        check_unicode(args.system, "system")
    max_new_tokens = DEFAULT_MAX_NEW_TOKENS if args.max_new_tokens is None else args.max_new_tokens
    _options(max_new_tokens, args.temperature, _cli_option(args.top_p), _cli_option(args.top_k), args.seed,
             MODEL_DEFAULT)
    _check_cli_sampling(args)
    _check_stdout()
    if args.prompt is None and sys.stdin is None:
        raise ValueError("stdin: standard input is closed; give the message as PROMPT or pipe the turns in, one "
                         "a line")
    tokenizer = _load_tokenizer(args)
    _check_cli_chat_template(args, tokenizer)
    turns = iter([args.prompt]) if args.prompt is not None else _stdin_turns()
    if args.prompt is None and not sys.stdin.isatty():
        # piped turns: the first is read before the model loads, so that an input without one is
        # refused as an empty PROMPT is (a terminal's user may end at once with Ctrl-D: exit 0)
        first = next(turns, None)
        if first is None:
            raise ValueError("stdin: no message to answer (standard input is empty or has only blank lines); give "
                             "the message as PROMPT or pipe the turns in, one a line")
        turns = itertools.chain([first], turns)
    model = _load_model(args)
    session = ChatSession(model, tokenizer, system=args.system, max_new_tokens=max_new_tokens,
                          temperature=args.temperature, top_p=_cli_option(args.top_p),
                          top_k=_cli_option(args.top_k), seed=args.seed, chat_template=args.chat_template)
    for message in turns:
        session.send(message, on_text=_print)
        _print("\n")
        print(session.stats, file=sys.stderr)
    return 0


def run_generate(args) -> int:
    """``generate``: TEXT and its continuation streamed to stdout, tokens/s on stderr. Without
    ``--max-new-tokens``, up to 256 new tokens, fewer when the context ends first; a value given
    that does not fit the context after TEXT is refused. Sampling and the repetition penalty as
    ``chat``'s (the model's generation config's when not given, as :func:`continue_text`: the same
    seed gives the same text)."""
    import sys

    explicit = args.max_new_tokens is not None
    options = _options(args.max_new_tokens if explicit else DEFAULT_MAX_NEW_TOKENS, args.temperature,
                       _cli_option(args.top_p), _cli_option(args.top_k), args.seed, MODEL_DEFAULT)
    _check_cli_sampling(args)
    _check_stdout()
    model, tokenizer = _load(args)
    ids = _text_ids(model, tokenizer, args.text, options["max_new_tokens"] if explicit else None)
    if not explicit:  # as many as fit: the last new token is never fed back
        options["max_new_tokens"] = min(options["max_new_tokens"], model.context_length - len(ids) + 1)
    # The text is echoed only now that it and the options (generation_config.json's values for
    # those left to it included) are known to be good: an error leaves stdout empty.
    _check_model_options(model, options)
    _print(args.text)
    _, stats = _continue(model, tokenizer, ids, options, _print)
    _print("\n")
    print(stats, file=sys.stderr)
    return 0
