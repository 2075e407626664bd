"""Bad input on a live server: OpenAI error JSON, the right status, the field and the limit named.

Also a schema-driven fuzz: request bodies generated from the pydantic models' JSON schemas (with
wrong types and out-of-range values mixed in) must never produce a 5xx, and must leave every
cache block and state slot free.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyla.request import MAX_N
from hyla.server.protocol import ChatCompletionRequest, CompletionRequest
from tests.server.conftest import MAX_CONTEXT, MODEL

USER = [{"role": "user", "content": "Hi"}]


def _error(excinfo) -> dict:
    body = excinfo.value.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def _completion_error(server, status: int, **kw) -> dict:
    kw.setdefault("max_tokens", 2)
    with pytest.raises(openai.APIStatusError) as e:
        server.client().completions.create(model=kw.pop("model", MODEL), **kw)
    assert e.value.status_code == status
    return _error(e)


def _chat_error(server, status: int, **kw) -> dict:
    kw.setdefault("max_tokens", 2)
    with pytest.raises(openai.APIStatusError) as e:
        server.client().chat.completions.create(model=MODEL, **kw)
    assert e.value.status_code == status
    return _error(e)


def test_prompt_longer_than_context_names_both_numbers(server):
    err = _completion_error(server, 400, prompt=[5] * (MAX_CONTEXT + 44))
    assert err["param"] == "prompt"
    assert str(MAX_CONTEXT + 44) in err["message"] and str(MAX_CONTEXT) in err["message"]


def test_chat_longer_than_context_names_messages(server):
    long = [{"role": "user", "content": "word " * (4 * MAX_CONTEXT)}]
    err = _chat_error(server, 400, messages=long)
    assert err["param"] == "messages"  # the field the client sent, not the rendered prompt
    assert err["message"].startswith("messages (as rendered to the prompt): prompt has ")
    assert str(MAX_CONTEXT) in err["message"]


@pytest.mark.parametrize("value", ["Infinity", "NaN"])
def test_non_finite_number_says_finite(server, value):
    body = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 0.5})
    body = body.replace("0.5", value)  # JSON has no literal for these: Python's json reads them
    r = httpx.post(f"{server.url}/v1/completions", content=body,
                   headers={"Content-Type": "application/json"})  # fmt: skip
    err = r.json()["error"]
    assert r.status_code == 422 and err["param"] == "temperature"
    assert "finite" in err["message"], err["message"]


def test_prompt_plus_max_tokens_over_context(server):
    err = _completion_error(server, 400, prompt=[5] * 200, max_tokens=100)
    assert err["param"] == "max_tokens"
    assert "200" in err["message"] and str(MAX_CONTEXT) in err["message"]


@pytest.mark.parametrize("max_tokens", [0, -3], ids=["zero", "negative"])
def test_max_tokens_not_positive(server, max_tokens):
    err = _completion_error(server, 400, prompt="Hi", max_tokens=max_tokens)
    assert err["param"] == "max_tokens" and ">= 1" in err["message"]


def test_max_tokens_over_limit(server):
    err = _completion_error(server, 400, prompt="Hi", max_tokens=10**6)
    assert err["param"] == "max_tokens" and str(MAX_CONTEXT) in err["message"]
    err = _chat_error(server, 400, messages=USER, max_tokens=None, max_completion_tokens=10**6)
    assert err["param"] == "max_completion_tokens" and str(MAX_CONTEXT) in err["message"]


def test_chat_prompt_plus_max_completion_tokens_names_that_field(server):
    err = _chat_error(server, 400, messages=USER, max_tokens=None,
                      max_completion_tokens=MAX_CONTEXT - 2)
    assert err["param"] == "max_completion_tokens" and "max_tokens" not in err["message"]
    assert err["message"].startswith("max_completion_tokens: ")


def test_chat_rendering_to_an_empty_prompt_names_messages(server):
    err = _chat_error(server, 400, messages=[{"role": "assistant", "content": ""}],
                      extra_body={"add_generation_prompt": False,
                                  "chat_template_kwargs": {"continue_final_message": True}})
    assert err["param"] == "messages" and err["code"] == "invalid_value"
    assert err["message"] == "messages (as rendered to the prompt): must not be empty"


def test_undecodable_body_is_400_invalid_value(server):
    r = httpx.post(f"{server.url}/v1/completions", content=b'{"prompt": "\xff\xfe"}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_value"


def test_negative_temperature(server):
    err = _completion_error(server, 400, prompt="Hi", temperature=-0.5)
    assert err["param"] == "temperature" and ">= 0" in err["message"]


@pytest.mark.parametrize("top_p", [0.0, 1.5, -1.0], ids=["zero", "above-one", "negative"])
def test_top_p_outside_unit_interval(server, top_p):
    err = _chat_error(server, 400, messages=USER, top_p=top_p)
    assert err["param"] == "top_p" and "(0, 1]" in err["message"]


def test_n_too_large(server):
    err = _completion_error(server, 400, prompt="Hi", n=MAX_N + 1)
    assert err["param"] == "n" and str(MAX_N) in err["message"]


def test_empty_messages(server):
    err = _chat_error(server, 400, messages=[])
    assert err["param"] == "messages" and "at least one" in err["message"]


def test_unknown_role(server):
    err = _chat_error(server, 400, messages=[{"role": "wizard", "content": "Hi"}])
    assert err["param"] == "messages[0].role" and "wizard" in err["message"]
    assert err["code"] == "invalid_value"  # as every 400 without a code of its own


@pytest.mark.parametrize("token", [-1, 10**6], ids=["negative", "beyond-vocab"])
def test_invalid_token_ids(server, token):
    err = _completion_error(server, 400, prompt=[1, 2, token])
    assert err["param"] == "prompt" and str(token) in err["message"]
    assert str(len(server.engine.tokenizer)) in err["message"]


def test_unknown_model_is_404(server):
    err = _completion_error(server, 404, model="gpt-5", prompt="Hi")
    assert err["param"] == "model" and "gpt-5" in err["message"] and MODEL in err["message"]


def test_api_key(make_server):
    server = make_server(api_key="s3cret")
    with pytest.raises(openai.AuthenticationError) as e:
        server.client(api_key="wrong").models.list()
    assert "incorrect API key" in _error(e)["message"]
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hi"})
    assert r.status_code == 401 and "missing API key" in r.json()["error"]["message"]
    assert server.client(api_key="s3cret").completions.create(
        model=MODEL, prompt="Hi", max_tokens=1).choices
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_body_too_large_is_413(make_server):
    server = make_server(max_request_bytes=4096)
    err = _completion_error(server, 413, prompt="x" * 10_000)
    assert "4096" in err["message"]
    r = httpx.post(f"{server.url}/v1/completions", content=b"{" + b" " * 5000 + b"}",
                   headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_malformed_json_is_422(server):
    r = httpx.post(f"{server.url}/v1/completions", content=b'{"prompt": "Hi",',
                   headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert "malformed JSON" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": MODEL}, "prompt"),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": "many"}, "max_tokens"),
        ("/v1/completions", {"prompt": "Hi", "temperature": "hot"}, "temperature"),
        ("/v1/completions", {"prompt": "Hi", "temperature": "0.5"}, "temperature"),
        ("/v1/completions", {"prompt": "Hi", "top_p": True}, "top_p"),
        ("/v1/chat/completions", {"messages": [{"content": "Hi"}]}, "messages[0].role"),
        ("/v1/chat/completions", {"messages": "Hi"}, "messages"),
        ("/v1/completions", {"prompt": "Hi", "stop": ["a", 3]}, "stop[1]"),
        ("/v1/completions", {"prompt": [[1, 2], [3, "a"]]}, "prompt[1][1]"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [5]}]},
         "messages[0].content[0]"),
    ],
    ids=["missing-prompt", "max-tokens-type", "temperature-type", "numeric-string", "bool-number",
         "missing-role", "messages-type",
         "stop-item", "token-id-item", "content-part"],
)
def test_schema_violation_is_422_naming_the_field(server, path, body, param):
    r = httpx.post(server.url + path, json=body)
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(param)
    assert "more field" not in err["message"]  # one field is wrong: its union members are not more


def test_lone_surrogate_text_is_400(server):
    r = httpx.post(f"{server.url}/v1/chat/completions", content=b'{"messages": [{"role": "user",'
                   b' "content": "a\\ud800"}]}', headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages[0].content"


def test_unknown_route_is_openai_404(server):
    r = httpx.get(f"{server.url}/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


# -- schema-driven fuzz ------------------------------------------------------------------------

_JSON_LEAF = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(
    allow_nan=False) | st.text(max_size=8)
_ANY_JSON = st.recursive(_JSON_LEAF, lambda c: st.lists(c, max_size=3)
                         | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=6)
# Values that keep generation short and hit the interesting edges.
_OVERRIDES = {
    "model": st.sampled_from([MODEL, MODEL, MODEL, "other", None]),
    "max_tokens": st.sampled_from([None, -1, 0, 1, 2, 3, 10**9]),
    "max_completion_tokens": st.sampled_from([None, 0, 2, 10**9]),
    "n": st.integers(-1, MAX_N + 2),
    "role": st.sampled_from(["user", "system", "assistant", "developer", "tool", "wizard", ""]),
    "min_tokens": st.integers(-1, 3),
}


def _from_schema(schema: dict, defs: dict, name: str = "") -> st.SearchStrategy:
    if name in _OVERRIDES:
        return _OVERRIDES[name]
    if "$ref" in schema:
        return _from_schema(defs[schema["$ref"].split("/")[-1]], defs, name)
    if "anyOf" in schema:
        return st.one_of([_from_schema(s, defs, name) for s in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "object" and "properties" in schema:
        props = {k: _from_schema(v, defs, k) for k, v in schema["properties"].items()}
        required = {k: props[k] for k in schema.get("required", [])}
        optional = {k: v for k, v in props.items() if k not in required}
        return st.fixed_dictionaries(required, optional=optional)
    simple = {
        "string": st.text(max_size=12) | st.text(st.characters(categories=["Cs"]), max_size=2),
        "integer": st.integers(-3, 40) | st.integers(-(2**65), 2**65),
        "number": st.floats(-3, 3, allow_nan=False) | st.integers(-3, 3),
        "boolean": st.booleans(),
        "null": st.none(),
        "object": st.dictionaries(st.text(max_size=6), _JSON_LEAF, max_size=2),
    }
    if kind == "array":
        return st.lists(_from_schema(schema.get("items", {}), defs, name), max_size=4)
    return simple.get(kind, _ANY_JSON)


def _body_strategy(model_cls, base: dict) -> st.SearchStrategy:
    schema = model_cls.model_json_schema()
    shaped = _from_schema(schema, schema.get("$defs", {}))
    keys = sorted(schema["properties"])
    # A valid `base` plus up to 3 schema-shaped fields (reaches the engine), whole schema-shaped
    # bodies, bodies with one field replaced by arbitrary JSON, and arbitrary JSON.
    near_valid = st.tuples(shaped, st.sets(st.sampled_from(keys), max_size=3)).map(
        lambda t: {**base, **{k: v for k, v in t[0].items() if k in t[1]}})
    mutated = st.tuples(shaped, st.sampled_from(keys), _ANY_JSON).map(
        lambda t: {**t[0], t[1]: t[2]})
    return st.one_of(near_valid, near_valid, shaped, mutated, _ANY_JSON)


_COMPLETION_BASE = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
_CHAT_BASE = {"model": MODEL, "messages": USER, "max_tokens": 2}


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_body_strategy(CompletionRequest, _COMPLETION_BASE))
def test_fuzz_completions_never_5xx(server, body):
    _post_and_check(server, "/v1/completions", body)


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_body_strategy(ChatCompletionRequest, _CHAT_BASE))
def test_fuzz_chat_never_5xx(server, body):
    _post_and_check(server, "/v1/chat/completions", body)


def _post_and_check(server, path: str, body) -> None:
    content = json.dumps(body).encode()
    with httpx.stream("POST", server.url + path, content=content, timeout=60,
                      headers={"content-type": "application/json"}) as r:
        data = r.read()
    assert r.status_code < 500, (body, data)
    if r.status_code != 200:
        err = json.loads(data)["error"]
        assert err["message"] and err["type"]
    server.wait_idle(timeout=10)
    stats = server.engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert stats.num_free_slots == stats.num_total_slots


def test_huge_integer_temperature_is_served(server):
    """Found by the fuzz above: temperature 2**64 (a JSON integer) ended the engine step with an
    OverflowError (500); it is a finite float temperature."""
    body = {**_CHAT_BASE, "add_generation_prompt": False, "temperature": 2**64}
    _post_and_check(server, "/v1/chat/completions", body)
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
