"""Structured output and tool calls end to end: the embedded model behind a live server, driven
by the OpenAI client's own `response_format` and `tools` examples. The model writes Python, not
JSON: the grammar is what makes its answers valid (oracle: jsonschema on every answer)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import jsonschema
import pytest

from hyla.assets import default_model_path
from hyla.models.loader import load_model
from hyla.server.chat_output import ChatOutput
from hyla.server.protocol import ChatCompletionRequest
from tests.engine.engine_util import make_engine
from tests.server.conftest import MODEL, start_server

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12},
                           "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "integer", "minimum": -12,
                                              "maximum": 14}},
    "required": ["zone"], "additionalProperties": False}}}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 10},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server():
    model = load_model(default_model_path(), dtype="float32", progress=False)
    live = start_server(make_engine(model, default_model_path(), max_model_len=1024))
    yield live
    live.stop()


def test_json_schema_answers_are_valid(server):
    r = server.client().chat.completions.create(
        model=MODEL, messages=USER, max_tokens=64, n=4, temperature=1.0, seed=1,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_json_object_and_streamed_schema_answer(server):
    client = server.client()
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=64, temperature=0,
                                       response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    whole = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=64,
                                           temperature=0, response_format=fmt)
    chunks = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=64,
                                            temperature=0, response_format=fmt, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    jsonschema.validate(json.loads(text), PERSON)


def test_named_tool_choice_returns_a_parsed_call(server):
    r = server.client().chat.completions.create(
        model=MODEL, messages=USER, max_tokens=64, temperature=0, tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments),
                        WEATHER["function"]["parameters"])
    assert choice.finish_reason == "stop"  # as OpenAI answers a named choice


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "one-call"])
def test_required_tool_choice_calls_known_tools(server, parallel):
    r = server.client().chat.completions.create(
        model=MODEL, messages=USER, max_tokens=96, temperature=1.0, seed=3, n=3,
        tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=parallel)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls
        assert calls and (parallel or len(calls) == 1)
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_streamed_named_call_equals_the_whole_one(server):
    client = server.client()
    kw = dict(model=MODEL, messages=USER, max_tokens=64, temperature=0, tools=[WEATHER],
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    names, args, ids = [], "", set()
    for chunk in client.chat.completions.create(stream=True, **kw):
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            assert call.index == 0
            if call.function.name is not None:
                names.append(call.function.name)
                ids.add(call.id)
            args += call.function.arguments or ""
    assert names == ["get_weather"] and len(ids) == 1
    assert args == whole.function.arguments


def test_history_with_calls_and_tool_results_is_accepted(server):
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    ]
    r = server.client().chat.completions.create(model=MODEL, messages=history, max_tokens=4,
                                                temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": 3}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"tools": [WEATHER], "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": ""}}], "tool_choice": "required"},
     "tools[0].function.name"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
     "messages[0].tool_calls"),
], ids=["bad-schema", "bad-type", "two-constraints", "empty-name", "bad-choice",
        "user-tool-calls"])
def test_bad_constraints_name_the_field(server, extra, param):
    import httpx

    body = {"model": MODEL, "messages": USER, "max_tokens": 2, **extra}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


# -- auto tool choice, parsed from the model's text (no model here writes calls) --------------


@dataclass
class _Completion:
    index: int
    text: str
    finish_reason: str | None


class _Engine:
    def __init__(self, template: str, parser: str, reasoning: str | None) -> None:
        from transformers import AutoTokenizer

        from hyla.config import EngineConfig

        self.tokenizer = AutoTokenizer.from_pretrained(default_model_path())
        self.tokenizer.chat_template = template
        self.engine = type("Inner", (), {"config": EngineConfig.from_kwargs(
            tool_call_parser=parser, reasoning_parser=reasoning), "model_config": None})()


def test_auto_choice_parses_calls_and_reasoning_from_text():
    engine = _Engine("{{ tools }}{% for m in messages %}{{ m.content }}{% endfor %}<think>",
                     "auto", "qwen3")  # no format marker in the template: hermes
    req = ChatCompletionRequest(model=MODEL, messages=USER, tools=[WEATHER])
    prompt = engine.tokenizer("Paris?<think>")["input_ids"]
    text = ('weather first</think>\n\nLet me check.\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>')
    whole = ChatOutput.for_request(req, engine, prompt)
    message, reason = whole.message(_Completion(0, text, "stop"))
    assert reason == "tool_calls"
    assert message.reasoning_content == "weather first"
    assert message.content == "Let me check."
    [call] = message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    streamed = ChatOutput.for_request(req, engine, prompt)
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    deltas = [streamed.delta(_Completion(0, p, None))[0] for p in pieces]
    last, reason = streamed.delta(_Completion(0, "", "stop"))
    deltas.append(last)
    assert reason == "tool_calls"
    got = [d for d in deltas if d is not None]
    assert "".join(d.reasoning_content or "" for d in got) == "weather first"
    assert "".join(d.content or "" for d in got) == "Let me check."
    calls = [c for d in got for c in d.tool_calls or []]
    assert [c.function.name for c in calls if c.function.name] == ["get_weather"]
    assert "".join(c.function.arguments or "" for c in calls) == call.function.arguments
