"""Tool-call and reasoning parsers against the calls a message was rendered from (the oracle:
random calls, rendered in each family's format by this file), streamed over random delta splits
and parsed whole: both must give back exactly the calls, the content and the reasoning."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyla.server.reasoning import ReasoningParser, prompt_opens_reasoning
from hyla.server.tool_parsers import PARSERS, make_tool_parser, resolve_tool_parser
from hyla.server.tool_parsers.forced import NamedCallParser, RequiredCallsParser
from hyla.server.tool_parsers.stream import MessageParser, MessageStream

# No "/" (so no closing tag), no "<think>"; "<", "|" and "_" make marker look-alikes.
TEXT = st.text(alphabet="ab xyz<>|_{}\"'\n:.,0-9é", min_size=0, max_size=24)
NAMES = st.text(alphabet="abcdefgh_", min_size=1, max_size=10)
VALUES = st.one_of(
    st.text(alphabet="ab c<>{}\"'\n:é", min_size=0, max_size=12).filter(
        lambda s: s == s.strip("\n") and s.strip() == s),
    st.integers(-1000, 1000), st.booleans(),
    st.lists(st.text(alphabet="abc", max_size=4), max_size=3),
)
ARGS = st.dictionaries(st.text(alphabet="klmnop", min_size=1, max_size=6), VALUES, max_size=3)
CALLS = st.lists(st.tuples(NAMES, ARGS), min_size=0, max_size=3)


def _xml_value(v) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def _render(fmt: str, calls: list) -> str:
    if not calls:
        return ""
    if fmt == "kimi_k2":
        body = "".join(f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>"
                       f"{json.dumps(a)}<|tool_call_end|>" for i, (n, a) in enumerate(calls))
        return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"
    if fmt == "deepseek_v31":
        body = "".join(f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{json.dumps(a, ensure_ascii=False)}"
                       "<｜tool▁call▁end｜>" for n, a in calls)
        return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"
    if fmt == "deepseek_v32":
        body = "".join(
            f'<｜DSML｜invoke name="{n}">\n' + "".join(
                f'<｜DSML｜parameter name="{k}" string="{str(isinstance(v, str)).lower()}"'
                f">{_xml_value(v)}</｜DSML｜parameter>\n" for k, v in a.items())
            + "</｜DSML｜invoke>\n" for n, a in calls)
        return f"<｜DSML｜function_calls>\n{body}</｜DSML｜function_calls>"
    if fmt in ("glm45", "glm47"):
        nl = "\n" if fmt == "glm45" else ""
        return nl.join(
            f"<tool_call>{n}{nl}" + "".join(
                f"<arg_key>{k}</arg_key>{nl}<arg_value>{_xml_value(v)}</arg_value>{nl}"
                for k, v in a.items()) + "</tool_call>" for n, a in calls)
    if fmt == "hermes":
        return "\n".join("<tool_call>\n" + json.dumps({"name": n, "arguments": a},
                                                      ensure_ascii=False) + "\n</tool_call>"
                         for n, a in calls)
    assert fmt == "qwen3_coder"
    return "\n".join(
        f"<tool_call>\n<function={n}>\n" + "".join(
            f"<parameter={k}>\n{_xml_value(v)}\n</parameter>\n" for k, v in a.items())
        + "</function>\n</tool_call>" for n, a in calls)


def _tools(calls: list) -> list[dict]:
    kinds = {str: "string", int: "integer", bool: "boolean", list: "array"}
    out = {}
    for n, a in calls:  # one schema per name: a later call's types win
        props = out.setdefault(n, {})
        props.update({k: {"type": kinds[type(v)]} for k, v in a.items()})
    return [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": p}}} for n, p in out.items()]


def _consistent(calls: list) -> bool:
    """Same-named calls use the same type per key (the schema can only say one)."""
    seen: dict = {}
    for n, a in calls:
        for k, v in a.items():
            if seen.setdefault((n, k), type(v)) is not type(v):
                return False
    return True


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:], strict=False)]


def _streamed(parser: MessageParser, pieces: list[str]) -> tuple[dict, MessageStream]:
    stream = MessageStream(parser)
    got = {"reasoning": "", "content": "", "calls": []}
    for k, piece in enumerate(pieces + [""]):
        delta = stream.feed(piece, final=k == len(pieces))
        got["reasoning"] += delta.reasoning
        got["content"] += delta.content
        for c in delta.calls:
            if c.index == len(got["calls"]):
                assert c.name is not None and c.id is not None
                got["calls"].append({"name": c.name, "arguments": "", "id": c.id})
            else:
                assert c.name is None  # a name goes out whole, once
            got["calls"][c.index]["arguments"] += c.arguments
    return got, stream


def _whole(parser: MessageParser, text: str) -> dict:
    stream = MessageStream(parser)
    stream.feed(text, final=True)
    m = stream.message()
    calls = [{"name": c.name, "arguments": c.arguments, "id": i}
             for c, i in zip(m.calls.calls, stream.ids, strict=True)]
    return {"reasoning": m.reasoning or "", "content": m.content, "calls": calls}


def _without_ids(msg: dict) -> dict:
    return {**msg, "calls": [{k: v for k, v in c.items() if k != "id"} for c in msg["calls"]]}


SPLITS_PER_MESSAGE = 5  # x 250 messages: >= 1,000 random splits per parser


@pytest.mark.parametrize("fmt", sorted(PARSERS))
@settings(max_examples=250, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_streamed_equals_whole_equals_rendered(fmt, data):
    calls = data.draw(CALLS.filter(_consistent), label="calls")
    content = data.draw(TEXT, label="content").strip()
    thinking = data.draw(st.sampled_from(["none", "closed", "opened", "call_inside"]))
    reasoning = data.draw(TEXT, label="reasoning")
    rendered = _render(fmt, calls)
    sep = "\n\n" if content and calls else ""
    answer = content + sep + rendered
    assert not any(s in content or s in reasoning for s in PARSERS[fmt].starts)
    want_content = content
    if thinking == "none":
        text, want_reasoning = answer, ""
    elif thinking == "closed":
        text, want_reasoning = f"<think>{reasoning}</think>\n\n{answer}", reasoning
    elif thinking == "opened":
        text, want_reasoning = f"{reasoning}</think>\n{answer}", reasoning
    elif calls:  # the model calls a tool before it closes its thought
        text, want_reasoning, want_content = f"<think>{reasoning}{rendered}", reasoning, ""
    else:
        text, want_reasoning = f"<think>{reasoning}</think>{answer}", reasoning
    parser = MessageParser(make_tool_parser(fmt, _tools(calls)), ReasoningParser(),
                           opened=thinking == "opened")
    whole = _whole(parser, text)
    for _ in range(SPLITS_PER_MESSAGE):
        cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=40), label="cuts")
        streamed, stream = _streamed(parser, _split(text, cuts))
        assert stream.num_violations == 0
        _check_streamed(fmt, calls, streamed, whole)
    want_calls = [{"name": n, "arguments": json.dumps(a, ensure_ascii=fmt == "kimi_k2")}
                  for n, a in calls]
    assert _without_ids(whole) == {"reasoning": want_reasoning, "content": want_content,
                                   "calls": want_calls}


def _check_streamed(fmt: str, calls: list, streamed: dict, whole: dict) -> None:
    if fmt == "kimi_k2":  # the model's own ids, in both
        assert [c["id"] for c in streamed["calls"]] == [f"functions.{n}:{i}"
                                                        for i, (n, _) in enumerate(calls)]
        assert [c["id"] for c in whole["calls"]] == [c["id"] for c in streamed["calls"]]
    assert _without_ids(streamed) == _without_ids(whole)


@settings(max_examples=1000, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_plain_text_and_reasoning_without_tools(data):
    text = data.draw(TEXT, label="text")
    opened = data.draw(st.booleans())
    parser = MessageParser(None, ReasoningParser(), opened=opened)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=20), label="cuts")
    streamed, stream = _streamed(parser, _split(text, cuts))
    assert stream.num_violations == 0
    assert streamed == _whole(parser, text)
    if opened:  # no </think> in the text: all of it is reasoning
        assert streamed == {"reasoning": text, "content": "", "calls": []}
    elif not text.lstrip().startswith("<think>"):
        assert streamed == {"reasoning": "", "content": text, "calls": []}


@settings(max_examples=1000, deadline=None, derandomize=True, database=None)
@given(args=ARGS, cuts=st.lists(st.integers(0, 200), max_size=20))
def test_forced_named_call_streams_its_arguments(args, cuts):
    text = json.dumps(args)
    parser = MessageParser(NamedCallParser("f"), None)
    streamed, stream = _streamed(parser, _split(text, cuts))
    assert streamed["calls"] == [{"name": "f", "arguments": text, "id": stream.ids[0]}]
    assert _without_ids(streamed) == _without_ids(_whole(parser, text))


def test_required_calls_array():
    text = json.dumps([{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}])
    whole = _whole(MessageParser(RequiredCallsParser(None), None), text)
    assert _without_ids(whole)["calls"] == [{"name": "a", "arguments": '{"x": 1}'},
                                            {"name": "b", "arguments": "{}"}]


def test_unclosed_and_invalid_blocks_stay_content():
    parser = MessageParser(make_tool_parser("hermes", None), None)
    whole = _whole(parser, "hi\n<tool_call>\n{not json}\n</tool_call>")
    assert whole == {"reasoning": "", "content": "hi<tool_call>\n{not json}\n</tool_call>",
                     "calls": []}


@pytest.mark.parametrize(("template", "model_type", "want"), [
    ("...<|tool_calls_section_begin|>...", "kimi_linear", "kimi_k2"),
    ("...<｜DSML｜function_calls>...", None, "deepseek_v32"),
    ("<｜tool▁calls▁begin｜>", None, "deepseek_v31"),
    ("<tool_call>{{ name }}<arg_key>", None, "glm47"),
    ("<tool_call>\n<function=", None, "qwen3_coder"),
    ("<tool_call>\n{{ tool_call | tojson }}", None, "hermes"),
    ("plain", "kimi_linear", "kimi_k2"),
    ("plain", "glm5_next", "glm47"),
    (None, "hyla", "hermes"),
], ids=["kimi", "dsml", "ds31", "glm", "qwen3-coder", "hermes", "type-kimi", "type-glm", "default"])
def test_auto_picks_the_format(template, model_type, want):
    assert resolve_tool_parser("auto", template, model_type) == want


def test_prompt_opens_reasoning():
    assert prompt_opens_reasoning("<｜Assistant｜><think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("# hello\n")
