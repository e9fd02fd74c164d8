"""transformer_core.chat_template vs transformers' apply_chat_template / render_jinja_template."""
from __future__ import annotations

import numpy as np
import pytest
import transformer_core as tc
from transformer_core.chat_template import ChatTemplateError, render_chat_template, validate_messages

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Hello!"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Write a haiku about numpy."}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"},
     {"role": "assistant", "content": "6"}, {"role": "user", "content": "Thanks"}],
    [{"role": "user", "content": "Unicode: café 日本語 🎉\nmulti\nline\n\n  indented"}],
    [{"role": "user", "content": ""}],
]

# Exercises what transformers' environment adds: tojson (non-ASCII kept, options), raise_exception,
# strftime_now, loop controls, namespace, the generation tag, special-token and extra variables.
FEATURES = """{{ bos_token }}
{%- set ns = namespace(system=none) %}
{%- for message in messages %}
  {%- if message['role'] not in ['system', 'user', 'assistant'] %}
    {{- raise_exception('unknown role: ' + message['role']) }}
  {%- endif %}
  {%- if message['role'] == 'system' %}{% set ns.system = message['content'] %}{% continue %}{% endif %}
  {%- if loop.index > 6 %}{% break %}{% endif %}
[{{ message['role'] | upper }}] {{ message | tojson }} {{ message['content'] | tojson(indent=2) }}
  {%- if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}{{ eos_token }}{% endgeneration %}{% endif %}
{% endfor %}
{%- if ns.system %}system={{ ns.system }}{% endif %}
{%- if tools %} tools={{ tools | tojson(sort_keys=true) }}{% endif %}
 year={{ strftime_now('%Y') }}
{%- if add_generation_prompt %}<assistant>{% endif %}"""


@pytest.fixture(scope="module")
def ours(smollm2_checkpoint):
    return tc.Tokenizer.from_gguf(smollm2_checkpoint)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_prompts_equal_transformers(ours, hf_smollm2_tokenizer, add_generation_prompt):
    for messages in CONVERSATIONS:
        ref = hf_smollm2_tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                       tokenize=False)
        text = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
        assert text == ref, messages
        assert text == render_chat_template(ours.chat_template, messages, add_generation_prompt=add_generation_prompt)
        ids = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
        assert ids == hf_smollm2_tokenizer.encode(ref, add_special_tokens=False)


def test_smollm2_prompt_text(ours):
    text = ours.apply_chat_template(CONVERSATIONS[0], add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                    "<|im_start|>assistant\n")


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_template_features_equal_transformers(add_generation_prompt):
    from transformers.utils.chat_template_utils import render_jinja_template

    tools = [{"name": "get_weather", "parameters": {"city": "string", "unit": "°C"}}]
    for messages in CONVERSATIONS:
        variables = {"bos_token": "<s>", "eos_token": "</s>", "tools": tools if len(messages) > 2 else None}
        (ref,), _ = render_jinja_template(conversations=[messages], chat_template=FEATURES,
                                          add_generation_prompt=add_generation_prompt, **variables)
        ours = render_chat_template(FEATURES, messages, add_generation_prompt=add_generation_prompt, **variables)
        assert ours == ref, messages
    assert "日本語" in render_chat_template(FEATURES, CONVERSATIONS[4])  # tojson keeps non-ASCII


def test_tools_and_documents_are_none_unless_given():
    """As transformers' render: a template testing ``tools is not none`` sees None (it saw an
    undefined variable, which is "not none": the tools' section came out for a chat without tools)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    template = "{% if tools is not none %}TOOLS{% endif %}|{% if documents is defined %}DOCS{% endif %}"
    messages = [{"role": "user", "content": "hi"}]
    (ref,), _ = render_jinja_template(conversations=[messages], chat_template=template)
    assert render_chat_template(template, messages) == ref == "|DOCS"
    assert render_chat_template(template, messages, tools=[{"name": "f"}]) == "TOOLS|DOCS"
    for bad in ("yes", None, 1):
        with pytest.raises(TypeError, match="add_generation_prompt"):
            render_chat_template(template, messages, add_generation_prompt=bad)


def test_raise_exception():
    with pytest.raises(ChatTemplateError, match="unknown role: robot"):
        render_chat_template(FEATURES, [{"role": "robot", "content": "beep"}])
    assert issubclass(ChatTemplateError, ValueError)


@pytest.mark.parametrize("template", [
    "{{ messages.__class__.__mro__ }}",
    "{{ messages.append({'role': 'x', 'content': 'y'}) }}",
    "{{ ''.__class__.__subclasses__() }}",
])
def test_sandbox(template):
    with pytest.raises(ChatTemplateError, match="Security|unsafe"):
        render_chat_template(template, [{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("template, error", [
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
    ("{{ 'a' + 1 }}", "TypeError"),
    ("{% for i in range(10 ** 7) %}{% endfor %}", "OverflowError"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
])
def test_python_errors_inside_the_template_are_template_errors(template, error):
    """An error of the template's own expressions (or the sandbox's range limit) is a
    ChatTemplateError naming it, not a bare Python exception (the CLI printed a traceback)."""
    with pytest.raises(ChatTemplateError, match=f"^chat template: {error}"):
        render_chat_template(template, [{"role": "user", "content": "hi"}])


def test_syntax_error():
    with pytest.raises(ChatTemplateError, match="does not parse"):
        render_chat_template("{% for m in messages %}", [{"role": "user", "content": "hi"}])
    with pytest.raises(TypeError, match="template"):
        render_chat_template(None, [{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("messages,error,pattern", [
    ("hello", TypeError, "messages: expected a list"),
    ([], ValueError, "messages: expected at least one message"),
    ([{"role": "user", "content": "a"}, "b"], TypeError, r"messages\[1\]: expected a dict"),
    ([{"content": "a"}], ValueError, r"messages\[0\]: missing the 'role' field"),
    ([{"role": "user"}], ValueError, r"messages\[0\]: missing the 'content' field"),
    ([{"role": "user", "content": "a"}, {"role": "user", "text": "b"}], ValueError,
     r"messages\[1\]: missing the 'content' field \(keys: \['role', 'text'\]\)"),
    ([{"role": None, "content": "a"}], TypeError, r"messages\[0\]\['role'\]: expected a str"),
    ([{"role": "", "content": "a"}], ValueError, r"messages\[0\]\['role'\]: expected a non-empty str"),
])
def test_bad_messages(ours, messages, error, pattern):
    with pytest.raises(error, match=pattern):
        validate_messages(messages)
    with pytest.raises(error, match=pattern):
        ours.apply_chat_template(messages, tokenize=False)


def test_messages_not_modified():
    messages = [{"role": "user", "content": "hi", "name": "bob"}]
    copy = validate_messages(messages)
    assert copy == messages and copy[0] is not messages[0]
    assert render_chat_template("{{ messages[0]['name'] }}", messages) == "bob"


def test_no_template():
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel

    tok = tc.Tokenizer(HFTokenizer(WordLevel({"a": 0}, unk_token="a")), max_length=None, pad_token=None)
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


# ------------------------------------------------------------------------------------------------
# What a template can reach: plain copies of the caller's data, never the caller's objects
# ------------------------------------------------------------------------------------------------
def test_template_cannot_call_methods_of_the_callers_objects(tmp_path):
    """A rich object in a message or a variable (a Path, a numpy array) reached the template with its
    methods: an untrusted template wrote files with ``write_text`` / ``tofile``. Now it sees what
    transformers shows it, a placeholder naming the type, and writes nothing."""
    import pathlib

    import numpy as np
    from transformers.utils.chat_template_utils import render_jinja_template

    target = tmp_path / "owned.txt"
    messages = [{"role": "user", "content": "look", "image": pathlib.Path(target)}]
    with pytest.raises(ChatTemplateError, match="write_text"):
        render_chat_template("{% for m in messages %}{{ m.image.write_text('owned') }}{% endfor %}", messages)
    with pytest.raises(ChatTemplateError, match="tofile"):
        render_chat_template("{{ extra.tofile(path) }}", messages, extra=np.arange(3), path=str(target))
    assert not target.exists()
    assert messages[0]["image"] == pathlib.Path(target)
    # what the template sees equals transformers': placeholders, numpy scalars as Python's
    template = ("{{ messages[0].image }}|{{ extra }}|{% if flag %}T{% else %}F{% endif %}|{{ n + 1 }}|"
                "{{ pair | tojson }}")
    variables = dict(extra=np.arange(3), flag=np.bool_(False), n=np.int64(41), pair=(1, "a"))
    (ref,), _ = render_jinja_template(conversations=[messages], chat_template=template, **variables)
    assert render_chat_template(template, messages, **variables) == ref == f"<{type(target).__name__}>|<ndarray>|F|42|[1, \"a\"]"


def test_template_cannot_modify_the_callers_data():
    """``dict`` was Python's dict type: ``dict.clear(tools[0])`` / ``dict.update(...)`` emptied the
    caller's tools and changed a message's nested field, past the immutable sandbox."""
    import copy

    from transformers.utils.chat_template_utils import render_jinja_template

    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    messages = [{"role": "user", "content": "hi", "meta": {"id": 7}}]
    before = copy.deepcopy((tools, messages))
    for template in ("{{ dict.clear(tools[0]) }}", "{{ dict.update(messages[0].meta, {'role': 'system'}) }}",
                     "{{ dict.pop(messages[0], 'content') }}"):
        with pytest.raises(ChatTemplateError, match="UndefinedError"):
            render_chat_template(template, messages, tools=tools)
        with pytest.raises(Exception):  # transformers refuses them too
            render_jinja_template(conversations=[messages], tools=tools, chat_template=template)
        assert (tools, messages) == before
    # what a template may do with dict and namespace still works, as in transformers
    template = ("{% set ns = namespace(n=0) %}{% for t in tools %}{% set ns.n = ns.n + 1 %}{% endfor %}"
                "{{ ns.n }} {{ dict(a=1, b=[2]) | tojson }} {{ dict.fromkeys(['x', 'y'], 0) | tojson }}")
    (ref,), _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template)
    assert render_chat_template(template, messages, tools=tools) == ref == '1 {"a": 1, "b": [2]} {"x": 0, "y": 0}'
    with pytest.raises(ChatTemplateError, match="Security"):
        render_chat_template("{% set ns = namespace(_hidden=1) %}", messages)
    with pytest.raises(ChatTemplateError, match="Security"):
        render_chat_template("{% set ns = namespace() %}{% set ns._hidden = 1 %}", messages)


def test_data_that_contains_itself_is_refused_naming_its_path():
    tools = [{"name": "f", "parameters": {}}]
    tools[0]["parameters"]["self"] = tools[0]
    with pytest.raises(ValueError, match=r"^tools\[0\]\['parameters'\]\['self'\]: a value that contains itself"):
        render_chat_template("x", [{"role": "user", "content": "hi"}], tools=tools)
    deep = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(ValueError, match=r"^extra(\[0\]){100}: nested deeper than 100 levels"):
        render_chat_template("x", [{"role": "user", "content": "hi"}], extra=deep)


def test_a_tool_given_as_a_function_is_refused_naming_it():
    """transformers turns a tool function into its JSON schema; the plain-data conversion made it the
    string "<function>", a silently wrong prompt. It is refused, naming its place; the schema dict
    renders as transformers renders it."""
    from transformers.utils import get_json_schema
    from transformers.utils.chat_template_utils import render_jinja_template

    def get_weather(city: str) -> str:
        """Gets the weather.

        Args:
            city: the city
        """
        return city

    template = "{% if tools %}TOOLS:{{ tools | tojson }}{% endif %}{{ messages[0].content }}"
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(TypeError, match=r"^tools\[1\]: expected JSON data .* got a callable function"):
        render_chat_template(template, messages, tools=[{"type": "function"}, get_weather])
    schema = get_json_schema(get_weather)
    (ref,), _ = render_jinja_template(conversations=[messages], chat_template=template, tools=[get_weather])
    assert render_chat_template(template, messages, tools=[schema]) == ref
    assert '"name": "get_weather"' in ref


#: Templates reading ``tools`` -> the start of what transformers renders with the two tools below.
TOOL_TEMPLATES = {
    "{{ tools }}": "[{'type': 'function', 'function': {'name': 'get_weather', 'parameters': {}}}, {",
    "{% set all = tools + [{'name': 'builtin'}] %}{{ all | length }}|{{ all | tojson }}": '3|[{"type": "function"',
    "{% if tools is not none %}<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}": '<tools>{"type": "function", "function"',
}
_REGISTRY = {"get_weather": {"type": "function", "function": {"name": "get_weather", "parameters": {}}},
             "get_time": {"type": "function", "function": {"name": "get_time", "parameters": {"tz": "str"}}}}
#: Each makes a fresh iterable of the same two tools (a generator or map is used up by one render).
TOOL_FORMS = {
    "list": lambda: list(_REGISTRY.values()),
    "tuple": lambda: tuple(_REGISTRY.values()),
    "dict.values()": lambda: _REGISTRY.values(),
    "map": lambda: map(dict, _REGISTRY.values()),
    "generator": lambda: (tool for tool in _REGISTRY.values()),
    "iterator": lambda: iter(list(_REGISTRY.values())),
}


@pytest.mark.parametrize("form", TOOL_FORMS)
@pytest.mark.parametrize("template", TOOL_TEMPLATES, ids=["print", "concat", "loop"])
def test_tools_given_as_any_iterable_render_as_transformers(form, template):
    """transformers iterates ``tools`` into a list; a tuple stayed a tuple (``{{ tools }}`` printed
    ``(...,)``, ``tools + [...]`` failed) and dict.values(), map or a generator became the string
    "<dict_values>", whose characters a template looped over."""
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [{"role": "user", "content": "Hi"}]
    (ref,), _ = render_jinja_template(conversations=[messages], chat_template=template, tools=TOOL_FORMS[form]())
    assert render_chat_template(template, messages, tools=TOOL_FORMS[form]()) == ref
    assert ref.startswith(TOOL_TEMPLATES[template]) and "get_time" in ref, ref


def test_tools_through_apply_chat_template(ours, hf_smollm2_tokenizer):
    """The same through the tokenizer's apply_chat_template, tools given as dict.values()."""
    template = list(TOOL_TEMPLATES)[2]
    messages = [{"role": "user", "content": "Hi"}]
    want = hf_smollm2_tokenizer.apply_chat_template(messages, chat_template=template, tools=_REGISTRY.values(),
                                                    tokenize=False)
    assert ours.apply_chat_template(messages, chat_template=template, tools=_REGISTRY.values(), tokenize=False) == want
    assert '"name": "get_time"' in want and want.endswith("</tools>user: Hi")


@pytest.mark.parametrize("make, says", [
    (lambda: ["x"], r"^tools\[0\]: expected a dict \(a tool's JSON schema, .*\), got str$"),
    (lambda: [_REGISTRY["get_time"], 3], r"^tools\[1\]: expected a dict .*got int$"),
    (lambda: (t for t in [_REGISTRY["get_time"], None]), r"^tools\[1\]: expected a dict .*got NoneType$"),
    (lambda: [("type", "function")], r"^tools\[0\]: expected a dict .*got tuple$"),
    (lambda: "get_weather", r"^tools: expected a list of tools' JSON schemas \(dicts\), got str$"),
    (lambda: b"tool", r"^tools: expected a list of tools' JSON schemas \(dicts\), got bytes$"),
    (lambda: _REGISTRY["get_time"], r"^tools: expected a list .*, got dict \(a single one\? put it in a list\)$"),
    (lambda: 3, r"^tools: expected a list of tools' JSON schemas \(dicts\), got int$"),
], ids=["str-item", "int-item", "none-item-in-generator", "pair", "str", "bytes", "one-dict", "int"])
def test_tools_that_are_not_dicts_are_refused_as_transformers(make, says):
    """transformers refuses a tool that is not a dict (ValueError "Tools should either be a JSON
    schema, or a callable ..."; a str, a dict or a number as ``tools``: its items are not dicts, or it
    is not iterable). They rendered here: ``tools=["x"]`` as ``['x']``. Now a TypeError naming the
    item, expected vs got."""
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises((ValueError, TypeError)):
        render_jinja_template(conversations=[messages], chat_template="{{ tools }}", tools=make())
    with pytest.raises(TypeError, match=says):
        render_chat_template("{{ tools }}", messages, tools=make())


DOCUMENTS = [{"title": "Paris", "text": "The capital of France."}, {"title": "Rome", "text": "Of Italy."}]
DOCUMENT_TEMPLATE = "{{ documents }}|{{ documents | tojson }}|{% for d in documents %}[{{ d.title }}]{% endfor %}"


@pytest.mark.parametrize("form", ["list", "tuple", "dict.values()", "generator"])
def test_documents_given_as_any_iterable(form):
    """A list or tuple renders as transformers renders it (a tuple stays a tuple there). Any other
    iterable was the string "<dict_values>" (as transformers, which consumes a generator checking it,
    renders "<generator>"): it is the list of its documents, as transformers renders that list."""
    from transformers.utils.chat_template_utils import render_jinja_template

    make = {"list": lambda: list(DOCUMENTS), "tuple": lambda: tuple(DOCUMENTS),
            "dict.values()": lambda: dict(enumerate(DOCUMENTS)).values(),
            "generator": lambda: (d for d in DOCUMENTS)}[form]
    messages = [{"role": "user", "content": "Hi"}]
    as_given = make() if form in ("list", "tuple") else list(make())
    (ref,), _ = render_jinja_template(conversations=[messages], chat_template=DOCUMENT_TEMPLATE, documents=as_given)
    assert render_chat_template(DOCUMENT_TEMPLATE, messages, documents=make()) == ref
    assert ref.endswith("|[Paris][Rome]") and ref.startswith("(" if form == "tuple" else "[{")


@pytest.mark.parametrize("documents, says", [
    (["x"], r"^documents\[0\]: expected a dict with 'title' and 'text', got str$"),
    ([DOCUMENTS[0], None], r"^documents\[1\]: expected a dict with 'title' and 'text', got NoneType$"),
    ("text", r"^documents: expected a list of documents \(dicts with 'title' and 'text'\), got str$"),
    (DOCUMENTS[0], r"^documents: expected a list of documents .*, got dict \(a single one\? put it in a list\)$"),
    (1.5, r"^documents: expected a list of documents .*, got float$"),
], ids=["str-item", "none-item", "str", "one-dict", "float"])
def test_documents_that_are_not_dicts_are_refused_as_transformers(documents, says):
    """transformers refuses them (TypeError "Documents should be a list of dicts ...", or not
    iterable); they rendered here."""
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(TypeError):
        render_jinja_template(conversations=[messages], chat_template="{{ documents }}", documents=documents)
    with pytest.raises(TypeError, match=says):
        render_chat_template("{{ documents }}", messages, documents=documents)


REASONING = ("{% for m in messages %}<{{ m.role }}>"
             "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
             "{% if m.thinking %}<thinking>{{ m.thinking }}</thinking>{% endif %}{{ m.content }}|{{ m | tojson }}\n"
             "{% endfor %}")


@pytest.mark.parametrize("fields", [
    {"reasoning": "2+2"},
    {"thinking": "2+2"},
    {"reasoning_content": "2+2"},
    {"reasoning_content": None, "thinking": None, "reasoning": "r"},
    {"reasoning_content": "rc", "thinking": "t", "reasoning": "r"},
    {"thinking": "t", "reasoning": "r"},
    {"thinking": None, "reasoning": "r"},
    {"reasoning_content": None},
    {"reasoning": ""},
], ids=["reasoning", "thinking", "reasoning_content", "nones-then-reasoning", "all-three", "thinking-and-reasoning",
        "thinking-none", "only-none", "empty-str"])
def test_reasoning_fields_aliased_as_transformers(hf_smollm2_tokenizer, fields):
    """transformers gives a message's reasoning (the first non-None of reasoning_content, thinking,
    reasoning) to the template as reasoning_content and thinking; a template reading
    m.reasoning_content rendered nothing for a message carrying "reasoning". The caller's messages
    are not changed. (transformers' apply_chat_template first drops the None-valued keys, as
    render_chat_template does: its render_jinja_template alone would keep a "thinking": None.)"""
    import copy

    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "4", **fields}]
    before = copy.deepcopy(messages)
    ref = hf_smollm2_tokenizer.apply_chat_template(messages, chat_template=REASONING, tokenize=False)
    assert render_chat_template(REASONING, messages) == ref
    assert messages == before
    if fields == {"reasoning": "2+2"}:
        assert "<think>2+2</think><thinking>2+2</thinking>4" in ref


TOOL_USE = """{%- if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<assistant>{% if m.content %}{{ m.content }}{% endif %}
{%- for c in m.tool_calls %}<call>{{ c.function | tojson }}</call>{% endfor %}[{{ m.content }}]
{% elif m.role == 'tool' %}<response>{{ m.content }}</response>
{% else %}<{{ m.role }}>{{ m.content }}
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<assistant>{% endif %}"""


@pytest.mark.parametrize("content", ["missing", None, "Let me check."])
def test_tool_call_turn_without_content_renders_as_transformers(ours, hf_smollm2_tokenizer, content):
    """An assistant's tool-call turn with no content (or None) was refused by validate_messages;
    transformers renders it. A message without tool calls still needs a "content" key (None allowed)."""
    call = {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"type": "function", "function": {"name": "get_time", "arguments": {"zone": "CET"}}}]}
    if content != "missing":
        call["content"] = content
    messages = [{"role": "user", "content": "Weather in Paris?"}, call,
                {"role": "tool", "content": "22C"}, {"role": "tool", "content": "14:00"}]
    tools = [{"type": "function", "function": {"name": "get_weather"}},
             {"type": "function", "function": {"name": "get_time"}}]
    for add in (True, False):  # apply_chat_template: it drops a "content": None, render_jinja_template alone does not
        ref = hf_smollm2_tokenizer.apply_chat_template(messages, chat_template=TOOL_USE, tools=tools,
                                                       add_generation_prompt=add, tokenize=False)
        assert render_chat_template(TOOL_USE, messages, add_generation_prompt=add, tools=tools) == ref
        assert ours.apply_chat_template(messages, add_generation_prompt=add, chat_template=TOOL_USE,
                                        tools=tools, tokenize=False) == ref
    assert validate_messages(messages)[1] == {k: v for k, v in call.items() if v is not None}
    if content != "Let me check.":
        assert '<call>{"name": "get_weather", "arguments": {"city": "Paris"}}</call>' in ref
        for bad in ({"role": "assistant"}, {"role": "assistant", "tool_calls": []},
                    {"role": "assistant", "tool_calls": None}):
            with pytest.raises(ValueError, match=r"^messages\[1\]: missing the 'content' field"):
                validate_messages([messages[0], bad])
        # content None is dropped as transformers drops it (it was a TypeError): the turn renders without it
        turn = {"role": "assistant", "content": None, "tool_calls": []}
        assert validate_messages([messages[0], turn])[1] == {"role": "assistant", "tool_calls": []}


# ------------------------------------------------------------------------------------ named chat templates
NAMED = {"default": "D:{% for m in messages %}{{ m.content }};{% endfor %}{{ eos_token }}",
         "tool_use": "T:{{ tools | length if tools is not none else '-' }}:{% for m in messages %}{{ m.content }};{% endfor %}",
         "rag": "R:{{ documents | tojson }}:{{ messages[0].content }}"}


def _named_template_dirs(tmp_path, templates):
    """Two saves of one tiny causal-LM tokenizer with named ``templates``, as transformers writes
    them: ``chat_template.jinja`` + ``additional_chat_templates/*.jinja``, and the list
    ``[{"name", "template"}]`` in ``tokenizer_config.json``."""
    import json

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    backend = HFTokenizer(WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2, "hi": 3}, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                 chat_template=templates)
    dirs = {"files": tmp_path / "files", "config": tmp_path / "config"}
    hf.save_pretrained(dirs["files"])
    hf.save_pretrained(dirs["config"], save_jinja_files=False)
    for d in dirs.values():
        (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return dirs


@pytest.mark.parametrize("saved_as", ["files", "config"])
def test_named_chat_templates_equal_transformers(tmp_path, saved_as):
    """tokenizer_config.json's list of named templates: only "default" was read (the "tool_use"
    template never used, a name given as chat_template rendered as a literal template). They are
    kept and chosen as transformers' get_chat_template chooses: a stored name selects its template,
    any other str is a template; tools pick "tool_use"; else "default"."""
    from transformers import AutoTokenizer

    model_dir = _named_template_dirs(tmp_path, NAMED)[saved_as]
    if saved_as == "config":
        assert not (model_dir / "chat_template.jinja").exists()
    ref, ours = AutoTokenizer.from_pretrained(model_dir), tc.Tokenizer.from_pretrained(model_dir)
    assert ours.chat_template == ref.chat_template == NAMED
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    tools = [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "g"}}]
    seen = set()
    for chosen in (None, "default", "tool_use", "rag", "{{ 'literal' }}", "tool_use "):
        for extra in ({}, {"tools": tools}, {"documents": [{"title": "t", "text": "x"}]}):
            want = ref.apply_chat_template(messages, chat_template=chosen, tokenize=False, **extra)
            got = ours.apply_chat_template(messages, chat_template=chosen, **extra, tokenize=False)
            assert got == want, (chosen, extra)
            assert ours.get_chat_template(chosen, extra.get("tools")) == ref.get_chat_template(chosen, extra.get("tools"))
            seen.add(want)
    assert {"D:hi;yo;</s>", "T:2:hi;yo;", "T:-:hi;yo;", 'R:[{"title": "t", "text": "x"}]:hi', "literal", "tool_use "} <= seen
    assert ours.apply_chat_template(messages, tools=tools, chat_template="default", tokenize=False) == "D:hi;yo;</s>"


def test_named_chat_templates_without_default(tmp_path):
    """Without "default" and no name chosen, a ValueError listing the names (transformers' too)."""
    from transformers import AutoTokenizer

    named = {"chat": NAMED["default"], "tool_use": NAMED["tool_use"]}
    model_dir = _named_template_dirs(tmp_path, named)["config"]
    ref, ours = AutoTokenizer.from_pretrained(model_dir), tc.Tokenizer.from_pretrained(model_dir)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match=r"no default"):
        ref.apply_chat_template(messages, tokenize=False)
    with pytest.raises(ValueError, match=r"no 'default'.*names: \['chat', 'tool_use'\]"):
        ours.apply_chat_template(messages, tokenize=False)
    for chosen, extra in (("chat", {}), (None, {"tools": [{"name": "f"}]})):
        want = ref.apply_chat_template(messages, chat_template=chosen, tokenize=False, **extra)
        assert ours.apply_chat_template(messages, chat_template=chosen, **extra, tokenize=False) == want
    assert want == "T:1:hi;"


def test_named_chat_templates_given_to_the_constructor():
    """A dict or tokenizer_config.json's list; anything else refused naming the argument."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel

    backend = HFTokenizer(WordLevel({"a": 0}, unk_token="a"))
    listed = [{"name": name, "template": template} for name, template in NAMED.items()]
    for given in (NAMED, listed):
        tok = tc.Tokenizer(backend, max_length=None, pad_token=None, chat_template=given)
        assert tok.chat_template == NAMED and tok.chat_template is not given
    for bad, says in (([{"name": "default"}], r"chat_template\[0\]: expected a named template"),
                      ({"default": 3}, "chat_template: expected named templates as a dict of str to str"),
                      (3, "chat_template: expected a str")):
        with pytest.raises(TypeError, match=says):
            tc.Tokenizer(backend, max_length=None, pad_token=None, chat_template=bad)


def test_malformed_named_templates_in_tokenizer_config(tmp_path):
    import json

    model_dir = _named_template_dirs(tmp_path, NAMED)["config"]
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": "x"}, {"template": "no name"}]
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"tokenizer_config.json: chat_template\[1\]: expected a named template"):
        tc.Tokenizer.from_pretrained(model_dir)


# ------------------------------------------------------------------------------------ None-valued keys
NONE_AWARE = ("{% for m in messages %}{{ m.role }}:{{ m.content }}"
              "{% if m.tool_calls is defined %}[{% for t in m.tool_calls %}{{ t.function.name }}{% endfor %}]{% endif %}"
              "{% if m.name is defined %}({{ m.name }}){% endif %}|{{ m | tojson }}\n{% endfor %}")


def test_none_valued_keys_dropped_as_transformers(ours, hf_smollm2_tokenizer):
    """transformers drops a message's None-valued keys before rendering (OpenAI-SDK messages carry
    "tool_calls": None, "content": None); they were passed on: a TypeError iterating None, a literal
    "None" in the prompt, or our own TypeError for content None. The caller's messages keep them."""
    import copy

    call = [{"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]
    messages = [{"role": "system", "content": "Be brief.", "name": None},
                {"role": "user", "content": "Weather?", "tool_calls": None},
                {"role": "assistant", "content": None, "tool_calls": call, "refusal": None},
                {"role": "tool", "content": "22C", "name": "get_weather"},
                {"role": "assistant", "content": None}]
    before = copy.deepcopy(messages)
    for add in (False, True):
        want = hf_smollm2_tokenizer.apply_chat_template(messages, chat_template=NONE_AWARE, tokenize=False,
                                                        add_generation_prompt=add)
        assert ours.apply_chat_template(messages, chat_template=NONE_AWARE, add_generation_prompt=add,
                                        tokenize=False) == want
        assert render_chat_template(NONE_AWARE, messages, add_generation_prompt=add) == want
    assert "None" not in want and "null" not in want and "user:Weather?|" in want and "[get_weather]" in want
    assert messages == before
    assert validate_messages(messages)[2] == {"role": "assistant", "tool_calls": call}


# ------------------------------------------------------------------------------------ content that is not a str
PARTS = """{%- for m in messages %}<|{{ m.role }}|>
{%- if m.content is string %}{{ m.content }}
{%- elif m.content is mapping %}{{ m.content | tojson }}
{%- elif m.content is iterable %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% else %}<{{ p.type }}>{% endif %}{% endfor %}
{%- elif m.content is defined %}#{{ m.content }}
{%- endif %}
{%- if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>{% endif %}
{%- if m.draft is defined %}<draft>{{ m.draft }}</draft>{% endif %}<end>
{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"""

LIST_CONTENT = [
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": [{"type": "image", "url": "cat.png"}, {"type": "text", "text": "What is it?"},
                                 {"type": "text", "text": " Réponds 😀"}]},
    {"role": "assistant", "content": 42},
    {"role": "user", "content": {"type": "text", "text": "a dict"}},
    {"role": "user", "content": ("tuple", "parts")},
]


def test_content_that_is_not_a_str_renders_as_transformers(ours, hf_smollm2_tokenizer):
    """A list of content parts (as Qwen3, Llama 4, SmolLM3 and Mistral templates read them), a number
    or a dict was refused (TypeError: expected a str); transformers renders any JSON data."""
    hf = hf_smollm2_tokenizer
    for add in (False, True):
        want = hf.apply_chat_template(LIST_CONTENT, chat_template=PARTS, tokenize=False, add_generation_prompt=add)
        assert ours.apply_chat_template(LIST_CONTENT, chat_template=PARTS, add_generation_prompt=add,
                                        tokenize=False) == want
        ids = hf.apply_chat_template(LIST_CONTENT, chat_template=PARTS, add_generation_prompt=add, return_dict=False)
        assert ours.apply_chat_template(LIST_CONTENT, chat_template=PARTS, add_generation_prompt=add,
                                        tokenize=True) == ids
    assert "<|user|><image>What is it? Réponds 😀<end>" in want and "<|assistant|>#42<end>" in want
    # a role is still checked
    with pytest.raises(TypeError, match=r"messages\[0\]\['role'\]: expected a str, got list"):
        ours.apply_chat_template([{"role": ["user"], "content": [{"type": "text", "text": "x"}]}], chat_template=PARTS,
                                 tokenize=False)


@pytest.mark.parametrize("final", [
    [{"type": "text", "text": "The answer is "}],
    [{"type": "text", "text": "First."}, {"type": "image"}, {"type": "text", "text": " Then"}],
    [{"type": "text", "text": "Look:"}, {"type": "image"}],
    ({"type": "text", "text": "tuple"},),
], ids=["one-part", "last-text-part", "text-before-image", "tuple"])
def test_continue_final_message_of_content_parts_equals_transformers(ours, hf_smollm2_tokenizer, final):
    """continue_final_message with list content: the last part with a "text" is continued (it was a
    ValueError: no str content); the caller's parts are not changed."""
    import copy

    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}, {"role": "assistant", "content": final}]
    before = copy.deepcopy(messages)
    want = hf_smollm2_tokenizer.apply_chat_template(messages, chat_template=PARTS, continue_final_message=True,
                                                    tokenize=False)
    assert ours.apply_chat_template(messages, chat_template=PARTS, continue_final_message=True, tokenize=False) == want
    assert render_chat_template(PARTS, messages, continue_final_message=True) == want
    assert not want.endswith("<end>\n") and messages == before
    assert want.endswith([p["text"] for p in final if "text" in p][-1])


@pytest.mark.parametrize("field, fields", [
    ("reasoning_content", {"reasoning_content": "Let me think  "}),
    ("reasoning", {"reasoning": "aliased"}),
    ("thinking", {"thinking": "as thinking"}),
    ("draft", {"draft": "a draft"}),
    ("content", {}),
])
def test_continue_final_message_names_a_field_as_transformers(ours, hf_smollm2_tokenizer, field, fields):
    """transformers' continue_final_message may name the field to continue (the reasoning, under
    each name it is aliased to): a str was refused as not a bool."""
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", **fields}]
    want = hf_smollm2_tokenizer.apply_chat_template(messages, chat_template=PARTS, continue_final_message=field,
                                                    tokenize=False)
    assert ours.apply_chat_template(messages, chat_template=PARTS, continue_final_message=field, tokenize=False) == want
    assert want.endswith((fields or {"content": "4"}).popitem()[1])


@pytest.mark.parametrize("messages, option, template, error, says", [
    ([{"role": "assistant", "content": [{"type": "image"}]}], True, PARTS, ValueError, "no part with a 'text'"),
    ([{"role": "assistant", "content": "x"}], "draft", PARTS, ValueError, "the last message has no 'draft'"),
    ([{"role": "assistant", "content": "x", "draft": "d"}], "draft", "{{ messages[0].content }}", ValueError,
     "does not use the messages' 'draft'"),
    ([{"role": "assistant", "content": 42}], True, PARTS, TypeError, "expected a str or a list of content parts"),
], ids=["no-text-part", "missing-field", "template-lacks-field", "int-content"])
def test_continue_final_message_errors_as_transformers(ours, hf_smollm2_tokenizer, messages, option, template,
                                                       error, says):
    """What transformers refuses is refused, naming continue_final_message."""
    with pytest.raises((ValueError, TypeError)):
        hf_smollm2_tokenizer.apply_chat_template(messages, chat_template=template, continue_final_message=option,
                                                 tokenize=False)
    with pytest.raises(error, match=f"^continue_final_message: .*{says}"):
        ours.apply_chat_template(messages, chat_template=template, continue_final_message=option, tokenize=False)
    for bad, err in (("", ValueError), (1, TypeError), (None, TypeError)):
        with pytest.raises(err, match="^continue_final_message: expected a bool or the name of a message field"):
            ours.apply_chat_template(messages, chat_template=template, continue_final_message=bad, tokenize=False)


def test_a_variable_named_template_reaches_the_template():
    """render_chat_template's own first parameter was named template, so apply_chat_template(...,
    template="X") failed with "got multiple values for argument 'template'"; transformers passes
    it to the template as any other variable."""
    from transformers.utils.chat_template_utils import render_jinja_template

    source = "{{ template }}|{{ messages | length }}"
    messages = [{"role": "user", "content": "hi"}]
    (ref,), _ = render_jinja_template(conversations=[messages], chat_template=source, template="X")
    assert render_chat_template(source, messages, template="X") == ref == "X|1"
    tok = tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct")
    assert tok.apply_chat_template(messages, chat_template=source, template="X", tokenize=False) == "X|1"


def test_a_variable_named_messages_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"^messages: given twice \(the conversation, and as a template variable\)$"):
        render_chat_template("{{ messages }}", [{"role": "user", "content": "hi"}], messages="x")


PAD_TEMPLATE = "{{ pad_token is defined }}|{{ pad_token or 'NOPAD' }}|{% for m in messages %}{{ m.content }}{% endfor %}"


@pytest.mark.parametrize("config", [
    {"eos_token": "<|im_end|>"},  # no pad token: the EOS pads, the template gets none
    {"eos_token": "<|im_end|>", "pad_token": "<|im_end|>"},  # a pad token of its own, the EOS
    {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
])
def test_pad_token_reaches_the_template_only_when_the_tokenizer_has_one(tmp_path, config):
    """A causal tokenizer without a pad token gave templates pad_token = its EOS (the padding
    fallback); transformers' special_tokens_map has none then. A pad token of its own (from its
    config, or assigned) is passed, as transformers."""
    import json

    transformers = pytest.importorskip("transformers")
    tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct").backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours, hf = tc.Tokenizer.from_pretrained(tmp_path), transformers.AutoTokenizer.from_pretrained(tmp_path)
    messages = [{"role": "user", "content": "x"}]

    def both():
        ref = hf.apply_chat_template(messages, chat_template=PAD_TEMPLATE, tokenize=False)
        assert ours.apply_chat_template(messages, chat_template=PAD_TEMPLATE, tokenize=False) == ref
        ids = hf.apply_chat_template(messages, chat_template=PAD_TEMPLATE, tokenize=True, return_dict=False)
        assert ours.apply_chat_template(messages, chat_template=PAD_TEMPLATE, tokenize=True) == list(ids)
        return ref

    if "pad_token" not in config:
        assert ours.pad_token == "<|im_end|>" and hf.pad_token is None  # our padding fallback
        assert both() == "False|NOPAD|x"
    else:
        assert both() == f"True|{config['pad_token']}|x"
    for token in ("<|im_end|>", "<|endoftext|>"):  # assigned: passed
        ours.pad_token = hf.pad_token = token
        assert both() == f"True|{token}|x"
    ours.pad_token_id = hf.pad_token_id = 0
    assert both() == f"True|{hf.pad_token}|x"
    ours.pad_token = hf.pad_token = None  # removed: none again
    assert both() == "False|NOPAD|x"


@pytest.mark.parametrize("tokenizer_class", [None, "TokenizersBackend", "PreTrainedTokenizerFast", "GPT2Tokenizer"])
@pytest.mark.parametrize("config_pad", ["absent", None, "<|im_start|>"])
def test_pad_token_of_tokenizer_json_padding_as_transformers(tmp_path, tokenizer_class, config_pad):
    """A pad token named only by tokenizer.json's ``padding`` was ignored: pad <|im_end|> (the EOS
    fallback) and no pad_token for templates, where transformers' generic classes take
    <|endoftext|> from there, and pass it to the template. It is read as transformers reads it: only
    without a pad_token key in tokenizer_config.json, and not by a class of its own (GPT-2's passes
    its default, none)."""
    import json

    transformers = pytest.importorskip("transformers")
    backend = tc.Tokenizer.from_pretrained("SmolLM2-135M-Instruct").backend
    backend.enable_padding(pad_id=0, pad_token="<|endoftext|>")
    backend.save(str(tmp_path / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>"}
    if tokenizer_class is not None:
        config["tokenizer_class"] = tokenizer_class
    if config_pad != "absent":
        config["pad_token"] = config_pad
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours, hf = tc.Tokenizer.from_pretrained(tmp_path), transformers.AutoTokenizer.from_pretrained(tmp_path)
    from_padding = config_pad == "absent" and tokenizer_class != "GPT2Tokenizer"
    assert hf.pad_token == ("<|endoftext|>" if from_padding else config_pad if config_pad != "absent" else None)
    if hf.pad_token is None:
        assert (ours.pad_token, ours.pad_token_id) == ("<|im_end|>", 2)  # our padding fallback, the EOS
    else:
        assert (ours.pad_token, ours.pad_token_id) == (hf.pad_token, hf.pad_token_id)
        texts = ["a", "a b c d"]
        want = hf(texts, padding=True, return_tensors="np")
        got = ours.encode_batch(texts)
        for key in ("input_ids", "attention_mask"):
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    messages = [{"role": "user", "content": "x"}]
    ref = hf.apply_chat_template(messages, chat_template=PAD_TEMPLATE, tokenize=False)
    assert ref == (f"True|{hf.pad_token}|x" if hf.pad_token is not None else "False|NOPAD|x")
    assert ours.apply_chat_template(messages, chat_template=PAD_TEMPLATE, tokenize=False) == ref
    ids = hf.apply_chat_template(messages, chat_template=PAD_TEMPLATE, tokenize=True, return_dict=False)
    assert ours.apply_chat_template(messages, chat_template=PAD_TEMPLATE, tokenize=True) == list(ids)
