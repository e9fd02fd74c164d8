"""Chat prompts: a model's Jinja2 chat template rendered the way Hugging Face transformers renders it
(``apply_chat_template``), so a conversation becomes the exact text the model was tuned on.

    render_chat_template(template, [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    # '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, ...<|im_end|>\\n'
    # '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'

The environment matches transformers': a sandboxed Jinja2 environment whose objects cannot be
modified (templates come with downloaded models and are untrusted code), ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension (``{% break %}``), a ``tojson`` filter that keeps
non-ASCII characters, the ``raise_exception(message)`` and ``strftime_now(format)`` functions, and
a ``{% generation %}`` block tag that renders its body. Variables: ``messages``,
``add_generation_prompt``, and whatever else the caller passes (``bos_token``, ``eos_token``,
``tools``, ...). As transformers' ``apply_chat_template``, a message's keys whose value is None are
left out (``"tool_calls": None`` is no tool calls), and its content may be a str, a list of content
parts (``[{"type": "text", "text": "..."}]``) or other JSON data, for the template to read.

**What a template can reach.** Only plain data: the messages and every variable are rebuilt from
JSON types (dict, list, tuple, str, int, float, bool, None) before rendering, as transformers'
``render_jinja_template`` rebuilds them, so a template never holds the caller's own objects (it
cannot change them) nor an object with methods that act outside the sandbox (a ``pathlib.Path``'s
``write_text``, a numpy array's ``tofile``): such a value becomes a placeholder naming its type
(``"<PosixPath>"``, ``"<ndarray>"``). The ``dict`` global only builds dicts (``dict(a=1)``,
``dict.fromkeys``), not Python's ``dict`` type, whose unbound ``dict.update`` / ``dict.clear`` would
change a dict in place; ``namespace`` refuses attribute names starting with ``_``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache

from ._validation import check_bool, described

__all__ = ["render_chat_template", "validate_messages", "ChatTemplateError"]

#: How deeply the data given to a template (messages, tools, variables) may nest.
MAX_DATA_DEPTH = 100


class ChatTemplateError(ValueError):
    """A chat template that does not parse, or that refused the conversation (its
    ``raise_exception``)."""


def validate_messages(messages) -> list[dict]:
    """Checks a conversation and returns it as transformers' ``apply_chat_template`` hands it to the
    template: each message without its keys whose value is None (the OpenAI SDK's messages carry
    ``"content": None`` and ``"tool_calls": None``; templates test whether a key is defined, and
    would render a literal ``None`` or fail on it).

    A message is a dict with a non-empty str ``"role"`` and a ``"content"``: a str, a list of
    content parts (``[{"type": "text", "text": "..."}, ...]``, as Qwen3, Llama 4 and Mistral
    templates read them) or any other JSON data, which the template reads as it is. ``"content"``
    may be None (then dropped), and absent from a message that calls tools (a non-empty list of
    ``"tool_calls"``, an assistant's tool-use turn); other keys are passed to the template as they are.

    Returns:
        A new list of new dicts (the caller's are not changed), None-valued keys left out.

    Raises:
        TypeError: ``messages`` not a list (or tuple), a message not a dict, or a role that is not a
            str (naming the message's index).
        ValueError: no messages (as transformers), a message without ``"role"``, one without a
            ``"content"`` key (unless it calls tools; a misspelt key, e.g. ``"text"``, would render
            an empty turn), or an empty role.
    """
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"messages: expected a list of {{'role': str, 'content': ...}} dicts, "
                        f"got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages: expected at least one message, got an empty list")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise TypeError(f"messages[{i}]: expected a dict with 'role' and 'content', got {type(message).__name__}")
        if "role" not in message:
            raise ValueError(f"messages[{i}]: missing the 'role' field (keys: {sorted(map(str, message))})")
        if not isinstance(message["role"], str):
            raise TypeError(f"messages[{i}]['role']: expected a str, got {type(message['role']).__name__}")
        if not message["role"]:
            raise ValueError(f"messages[{i}]['role']: expected a non-empty str")
        if "content" not in message and not _calls_tools(message):
            raise ValueError(f"messages[{i}]: missing the 'content' field (keys: {sorted(map(str, message))}); "
                             "only a message with 'tool_calls' may have none")
        out.append({key: value for key, value in message.items() if value is not None})
    return out


def _calls_tools(message: dict) -> bool:
    """Whether ``message`` carries tool calls (a non-empty list or tuple under ``"tool_calls"``)."""
    calls = message.get("tool_calls")
    return isinstance(calls, (list, tuple)) and len(calls) > 0


#: The names a message's reasoning is passed under (transformers' ``_REASONING_FIELDS``): the first
#: is the one chat templates read; gpt-oss templates read ``thinking``.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _alias_reasoning(messages: list) -> list:
    """transformers' ``_alias_reasoning_fields``: a message with reasoning (the first non-None of
    ``REASONING_FIELDS``) gets it as ``reasoning_content`` (set) and ``thinking`` (unless the message
    has that key, even as None), in a new dict (the first key ``thinking`` when added, as there)."""
    out = []
    for message in messages:
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


#: The mark ``continue_final_message`` appends to the text it leaves open (transformers' own).
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def render_chat_template(template: str, messages, /, add_generation_prompt: bool = False, *,
                         continue_final_message: bool | str = False, **variables) -> str:
    """Renders ``template`` for a conversation, as transformers' ``render_jinja_template``.

    Args:
        template: the Jinja2 source (``tokenizer.chat_template`` in GGUF metadata, ``chat_template``
            in ``tokenizer_config.json``).
        messages: a list of ``{"role": str, "content": ...}`` dicts (see :func:`validate_messages`):
            content a str, a list of parts ``[{"type": "text", "text": "..."}, ...]`` or other JSON
            data; keys whose value is None are left out, as transformers' ``apply_chat_template``
            drops them; an assistant's tool-call turn ``{"role": "assistant", "tool_calls": [...]}``
            may have no content. A message's reasoning under ``reasoning_content``, ``thinking`` or
            ``reasoning`` (the first that is not None) is given to the template under both
            ``reasoning_content`` and ``thinking`` (an existing ``thinking`` kept), as transformers
            aliases it; the caller's dicts are not changed.
        add_generation_prompt: end with the header of the assistant's turn, for generation.
        continue_final_message: end the prompt with the last message's text left open (no
            end-of-turn tokens after it), for the model to continue it. True continues its
            ``"content"`` (a str, or the last ``{"text": ...}`` part of a list of parts); a str
            names the field to continue instead (``"reasoning_content"``: the message's reasoning,
            under every name it is aliased to). As transformers, the text is marked, the prompt
            rendered and cut at the mark (a template that strips the text's trailing spaces loses
            them). Not with ``add_generation_prompt``.
        **variables: more template variables: ``bos_token``, ``eos_token``, ``tools``, ...
            ``tools`` and ``documents`` are None unless given, as transformers' ``apply_chat_template``
            passes them (a template testing ``tools is not none`` must see None, not undefined).
            ``tools``: any iterable of dicts (the tools' JSON schemas: a list, a tuple,
            ``registry.values()``, a generator), given to the template as a list, as transformers
            gives it (see :func:`_checked_tools`). ``documents``: any iterable of dicts (see
            :func:`_checked_documents`).

    The template sees copies of ``messages`` and ``variables`` made of plain JSON data (see the
    module's docstring: any other object becomes ``"<TypeName>"``, as in transformers); the
    caller's objects are never handed to it.

    Returns:
        The prompt text.

    Raises:
        TypeError: ``template`` not a str; a variable named ``messages`` (the conversation is
            that); ``add_generation_prompt`` not a bool;
            ``continue_final_message`` not a bool or str, or the text it continues not a str; a bad
            message (see :func:`validate_messages`); ``tools`` or ``documents`` not an iterable of
            dicts (naming the item, e.g. ``tools[1]``); a callable among the data (a tool given as a
            function, which transformers would turn into its JSON schema: give the schema).
        ValueError: a bad message; messages or a variable that contain themselves or nest deeper
            than ``MAX_DATA_DEPTH`` (naming the path, e.g. ``tools[0]['parameters']``);
            ``continue_final_message`` with ``add_generation_prompt``, or an empty field name, or a
            last message without that field (or without a text part), or a template that does not
            name the field or does not write the text.
            ChatTemplateError (a ValueError): the template does not parse,
            calls ``raise_exception``, or fails while rendering (the sandbox refusing an unsafe
            operation, or an error of the template's own expressions, included).
    """
    if not isinstance(template, str):
        raise TypeError(f"template: expected a str, got {type(template).__name__}")
    if "messages" in variables:  # the template's messages are the conversation
        raise TypeError("messages: given twice (the conversation, and as a template variable)")
    add_generation_prompt = check_bool(add_generation_prompt, "add_generation_prompt")
    field = _continued_field(continue_final_message)
    if field is not None and add_generation_prompt:
        raise ValueError("continue_final_message: expected add_generation_prompt=False with it (one continues the "
                         "last message, the other starts a new assistant turn), got both True")
    messages = _alias_reasoning(_plain_data(validate_messages(messages), "messages"))
    if variables.get("tools") is not None:
        variables["tools"] = _checked_tools(variables["tools"])
    if variables.get("documents") is not None:
        variables["documents"] = _checked_documents(variables["documents"])
    variables = {name: _plain_data(value, name) for name, value in variables.items()}
    compiled = _compile(template)
    import jinja2

    if field is not None:
        continued = _mark_continued_text(messages, field, template)
    variables = {"tools": None, "documents": None, **variables}
    try:
        text = compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    except ChatTemplateError:
        raise
    except (jinja2.TemplateError, Exception) as e:  # the sandbox's refusals, and Python's errors in the
        # template's own expressions (1 // 0, "a" + 1, range(10**6), a macro calling itself)
        raise ChatTemplateError(f"chat template: {type(e).__name__}: {e}") from None
    return text if field is None else _cut_at_mark(text, continued)


def _items(value, name: str, expected: str) -> list:
    """The items of the iterable ``value`` (the ``tools`` or ``documents`` argument), as a new list.

    Raises:
        TypeError: naming ``name``: not iterable, or a str, bytes or mapping (which transformers
            would iterate character by character, or key by key: a single tool's dict given without
            its list, say).
    """
    if isinstance(value, (str, bytes, bytearray, Mapping)):
        hint = " (a single one? put it in a list)" if isinstance(value, Mapping) else ""
        raise TypeError(f"{name}: expected {expected}, got {type(value).__name__}{hint}")
    try:
        iterator = iter(value)
    except TypeError:
        raise TypeError(f"{name}: expected {expected}, got {type(value).__name__}") from None
    return list(iterator)


def _checked_tools(tools) -> list:
    """``tools`` as transformers' ``render_jinja_template`` gives them to the template: the items of
    any iterable (a list, a tuple, ``dict.values()``, ``map``, a generator) in a new list, so that
    ``{{ tools }}`` prints a list and ``tools + [...]`` works whatever the caller passed.

    Each tool must be a dict (its JSON schema, e.g. ``{"type": "function", "function": {"name":
    ..., "parameters": {...}}}``), as transformers requires. transformers also accepts a Python
    function (or method) with type hints and a docstring, which it turns into its schema with
    ``transformers.utils.get_json_schema``; this package does not derive schemas and refuses it.

    Raises:
        TypeError: ``tools`` not iterable, or a str, bytes or mapping; an item that is not a dict
            (naming it, ``tools[i]``: transformers' ValueError "Tools should either be a JSON
            schema, or a callable function ...") or that is a callable.
    """
    tools = _items(tools, "tools", "a list of tools' JSON schemas (dicts)")
    for i, tool in enumerate(tools):
        if isinstance(tool, dict):
            continue
        if callable(tool):
            raise TypeError(f"tools[{i}]: expected JSON data (a tool's JSON schema as a dict), got a callable "
                            f"{type(tool).__name__}; this package does not derive schemas from functions "
                            "(transformers.utils.get_json_schema(fn) gives the dict transformers would use)")
        raise TypeError(f"tools[{i}]: expected a dict (a tool's JSON schema, {{'type': 'function', 'function': "
                        f"{{'name': ..., 'parameters': ...}}}}), got {type(tool).__name__}")
    return tools


def _checked_documents(documents) -> list | tuple:
    """``documents`` checked as transformers' ``render_jinja_template`` checks them: each a dict
    (``{"title": ..., "text": ...}``). A list or tuple is kept as it is (as there); any other
    iterable (``dict.values()``, a generator) becomes a list of its items, where transformers would
    render the placeholder ``"<dict_values>"`` (it consumes a generator checking it).

    Raises:
        TypeError: ``documents`` not iterable, or a str, bytes or mapping; an item that is not a
            dict (naming it, ``documents[i]``; transformers' TypeError "Documents should be a list
            of dicts ...").
    """
    items = _items(documents, "documents", "a list of documents (dicts with 'title' and 'text')")
    for i, document in enumerate(items):
        if not isinstance(document, dict):
            raise TypeError(f"documents[{i}]: expected a dict with 'title' and 'text', got {type(document).__name__}")
    return tuple(items) if isinstance(documents, tuple) else items


def _continued_field(continue_final_message) -> str | None:
    """The message field ``continue_final_message`` continues: None (off), ``"content"`` (True), or
    the field it names.

    Raises:
        TypeError: not a bool or str.
        ValueError: an empty str.
    """
    if isinstance(continue_final_message, str):
        if not continue_final_message:
            raise ValueError("continue_final_message: expected a bool or the name of a message field, got ''")
        return continue_final_message
    if not isinstance(continue_final_message, bool):
        raise TypeError(f"continue_final_message: expected a bool or the name of a message field (a str), got "
                        f"{described(continue_final_message)}")
    return "content" if continue_final_message else None


def _mark_continued_text(messages: list, field: str, template: str) -> str:
    """Appends ``CONTINUE_TAG`` to the text of the last message's ``field`` (in place: ``messages``
    is the renderer's own copy) and returns that text, as transformers' ``render_jinja_template``:
    a str field is marked (a reasoning field under each of its aliases holding the same value), a
    list of content parts has its last part with a ``"text"`` marked.

    Raises:
        ValueError: the message has no ``field`` (or None); the template's source does not name
            ``field`` (nor an alias); a list without a text part.
        TypeError: the field (or the part's ``"text"``) is not a str.
    """
    where = f"messages[{len(messages) - 1}][{field!r}]"
    message = messages[-1]
    final = message.get(field)
    if final is None:
        raise ValueError(f"continue_final_message: the last message has no {field!r} to continue "
                         f"(keys: {sorted(map(str, message))})")
    fields = [field]
    if field in REASONING_FIELDS:  # the reasoning is aliased: mark each copy, accept whichever the template reads
        fields = [name for name in REASONING_FIELDS if message.get(name) == final]
    if not any(name in template for name in fields):
        raise ValueError(f"continue_final_message: the chat template does not use the messages' {field!r}")
    if isinstance(final, (list, tuple)):  # content parts: continue the last one with a text
        for i in reversed(range(len(final))):
            part = final[i]
            if isinstance(part, dict) and "text" in part:
                if not isinstance(part["text"], str):
                    raise TypeError(f"continue_final_message: {where}[{i}]['text']: expected a str, got "
                                    f"{type(part['text']).__name__}")
                text = part["text"]
                part["text"] = text + CONTINUE_TAG
                return text
        raise ValueError(f"continue_final_message: {where}: no part with a 'text' to continue (expected a "
                         "{'type': 'text', 'text': ...} part)")
    if not isinstance(final, str):
        raise TypeError(f"continue_final_message: {where}: expected a str or a list of content parts, got "
                        f"{type(final).__name__}")
    for name in fields:
        message[name] = final + CONTINUE_TAG
    return final


def _cut_at_mark(text: str, continued: str) -> str:
    """The rendered ``text`` cut where ``CONTINUE_TAG`` marks the end of the ``continued`` text, as
    transformers cuts it: right at the mark when the template kept it whole, else (the template
    trimmed the text's trailing spaces) at the mark with the spaces before it removed.

    Raises:
        ValueError: the continued text or the mark is not in ``text`` (the template changes or
            drops the text).
    """
    mark = CONTINUE_TAG.strip()
    if continued.strip() not in text or mark not in text:
        raise ValueError("continue_final_message: the last message's text does not appear in the rendered prompt "
                         "(the chat template changes or drops it), so it cannot be left open")
    end = text.rindex(mark)
    return text[:end] if text.startswith(CONTINUE_TAG, end) else text[:end].rstrip()


def _plain_data(value, path: str, depth: int = 0, active: frozenset = frozenset()):
    """``value`` rebuilt from plain JSON types, what a template may see (as transformers'
    ``_plain_template_data``): exact str/int/float/bool/None as they are, their subclasses (enums,
    numpy scalars) as the base type, mappings as new dicts, lists as new lists, tuples as new tuples,
    dataclasses and pydantic models as dicts of their fields, anything else as ``"<TypeName>"``
    except a callable (refused).

    Raises:
        TypeError: a callable (a function given as a tool), naming ``path``.
        ValueError: a container that contains itself, or nesting deeper than ``MAX_DATA_DEPTH``
            (naming ``path``, the value's place in the argument).
    """
    import numpy as np

    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, np.generic):  # np.bool_(False) must stay falsy, not become "<bool_>"
        return _plain_data(value.item(), path, depth, active)
    container = isinstance(value, (Mapping, list, tuple)) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)) or callable(getattr(value, "model_dump", None))
    if not container:
        if callable(value):  # transformers turns a tool function into its JSON schema: do not render a stand-in
            raise TypeError(f"{path}: expected JSON data (a tool's JSON schema as a dict), got a callable "
                            f"{type(value).__name__}; this package does not derive schemas from functions "
                            "(transformers.utils.get_json_schema(fn) gives the dict transformers would use)")
        return f"<{type(value).__name__}>"
    if id(value) in active:
        raise ValueError(f"{path}: a value that contains itself (a template can only be given tree-shaped data)")
    if depth >= MAX_DATA_DEPTH:
        raise ValueError(f"{path}: nested deeper than {MAX_DATA_DEPTH} levels")
    active = active | {id(value)}
    if isinstance(value, Mapping):
        return {_plain_data(k, f"{path} key {k!r}", depth + 1, active):
                _plain_data(v, f"{path}[{k!r}]", depth + 1, active) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_data(v, f"{path}[{i}]", depth + 1, active) for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return tuple(_plain_data(v, f"{path}[{i}]", depth + 1, active) for i, v in enumerate(value))
    if dataclasses.is_dataclass(value):
        return {f.name: _plain_data(getattr(value, f.name), f"{path}.{f.name}", depth + 1, active)
                for f in dataclasses.fields(value)}
    return _plain_data(value.model_dump(), path, depth + 1, active)  # a pydantic model


class _TemplateDict:
    """The template's ``dict``: builds dicts (``dict(a=1)``, ``dict(pairs)``, ``dict.fromkeys(keys)``)
    and nothing else, unlike Python's ``dict`` type, whose unbound methods (``dict.update(d, x)``,
    ``dict.clear(d)``) the sandbox lets a template call on any dict."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        """``dict.fromkeys``: a new dict."""
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message):
    raise ChatTemplateError(f"chat template: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja2's own tojson escapes HTML characters ('<' -> \u003c); chat templates want plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=16)
def _compile(template: str):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` (marks the assistant's tokens for training
        masks in transformers): rendered as its body."""

        tags = {"generation"}

        def parse(self, parser):
            """``{% generation %} ... {% endgeneration %}`` -> its body (jinja2's extension hook)."""
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    class TemplateNamespace(jinja2.utils.Namespace):
        """``namespace(...)``, refusing attribute names that start with ``_`` (as transformers'), so
        that a template cannot store into the names of Python's internals."""

        def __init__(*args, **kwargs):  # Jinja's signature trick: ``namespace(self=...)`` still works
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_', got {name!r}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template does not parse: {type(e).__name__}: {e}") from None
