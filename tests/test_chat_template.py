"""transformer_core.chat_template vs transformers' apply_chat_template / render_jinja_template."""
from __future__ import annotations

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
        text = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        assert text == ref, messages
        assert text == render_chat_template(ours.chat_template, messages, add_generation_prompt=add_generation_prompt)
        ids = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
        assert ids == hf_smollm2_tokenizer.encode(ref, add_special_tokens=False)


def test_smollm2_prompt_text(ours):
    text = ours.apply_chat_template(CONVERSATIONS[0], add_generation_prompt=True)
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
    ([{"role": "user", "content": "a"}, {"role": "user", "content": 3}], TypeError,
     r"messages\[1\]\['content'\]: expected a str, got int"),
    ([{"role": None, "content": "a"}], TypeError, r"messages\[0\]\['role'\]: expected a str"),
    ([{"role": "", "content": "a"}], ValueError, r"messages\[0\]\['role'\]: expected a non-empty str"),
])
def test_bad_messages(ours, messages, error, pattern):
    with pytest.raises(error, match=pattern):
        validate_messages(messages)
    with pytest.raises(error, match=pattern):
        ours.apply_chat_template(messages)


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
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


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
def test_reasoning_fields_aliased_as_transformers(fields):
    """transformers gives a message's reasoning (the first non-None of reasoning_content, thinking,
    reasoning) to the template as reasoning_content and thinking; a template reading
    m.reasoning_content rendered nothing for a message carrying "reasoning". The caller's messages
    are not changed."""
    import copy

    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "4", **fields}]
    before = copy.deepcopy(messages)
    (ref,), _ = render_jinja_template(conversations=[messages], chat_template=REASONING)
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
def test_tool_call_turn_without_content_renders_as_transformers(ours, content):
    """An assistant's tool-call turn with no content (or None) was refused by validate_messages;
    transformers renders it. A message without tool calls still needs a str content."""
    from transformers.utils.chat_template_utils import render_jinja_template

    call = {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"type": "function", "function": {"name": "get_time", "arguments": {"zone": "CET"}}}]}
    if content != "missing":
        call["content"] = content
    messages = [{"role": "user", "content": "Weather in Paris?"}, call,
                {"role": "tool", "content": "22C"}, {"role": "tool", "content": "14:00"}]
    tools = [{"type": "function", "function": {"name": "get_weather"}},
             {"type": "function", "function": {"name": "get_time"}}]
    for add in (True, False):
        (ref,), _ = render_jinja_template(conversations=[messages], chat_template=TOOL_USE, tools=tools,
                                          add_generation_prompt=add)
        assert render_chat_template(TOOL_USE, messages, add_generation_prompt=add, tools=tools) == ref
        assert ours.apply_chat_template(messages, add_generation_prompt=add, chat_template=TOOL_USE,
                                        tools=tools) == ref
    assert validate_messages(messages)[1] == call
    if content != "Let me check.":
        assert '<call>{"name": "get_weather", "arguments": {"city": "Paris"}}</call>' in ref
        for bad in ({"role": "assistant"}, {"role": "assistant", "tool_calls": []},
                    {"role": "assistant", "tool_calls": None}):
            with pytest.raises(ValueError, match=r"^messages\[1\]: missing the 'content' field"):
                validate_messages([messages[0], bad])
        with pytest.raises(TypeError, match=r"^messages\[1\]\['content'\]: expected a str, got NoneType"):
            validate_messages([messages[0], {"role": "assistant", "content": None, "tool_calls": []}])
