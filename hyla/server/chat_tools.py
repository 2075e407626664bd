"""`tools`, `tool_choice` and `response_format` of a chat request: checked (400 naming the
field), turned into the grammar that enforces them (`StructuredOutputsParams`) and into the
chat template's `tools` argument.

    response_format json_object / json_schema  -> that grammar; the answer is the JSON
    tool_choice "required"                      -> an array of {"name", "parameters"} calls
    tool_choice {"type": "function", ...}       -> that function's parameters object
    tool_choice "auto" (default with tools)     -> free text, calls parsed in the family's
                                                   format (`tool_parsers`)
    tool_choice "none"                          -> free text, no call parsed
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hyla.server.errors import APIError
from hyla.server.tool_parsers.forced import required_calls_schema
from hyla.structured import StructuredOutputsError, StructuredOutputsParams
from hyla.structured.backend import build_grammar

_TOOL_KEYS = {"type", "function"}
_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}
_SCHEMA_KEYS = {"name", "description", "schema", "strict"}


@dataclass(frozen=True)
class ToolPlan:
    """What a chat request asks of its output. `choice`: "none", "auto", "required" or
    "named" (`name` set); `tools` as the template takes them (None: no tools)."""

    choice: str = "none"
    name: str | None = None
    tools: list[dict[str, Any]] | None = None
    parallel: bool = True
    structured: StructuredOutputsParams | None = None

    @property
    def parses_calls(self) -> bool:
        return self.tools is not None and self.choice != "none"


def _bad(field: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, f"{field}: {message}", param=field, code=code)


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """The request's `tools`, each `{"type": "function", "function": {"name", ...}}`."""
    names: set[str] = set()
    for i, tool in enumerate(tools):
        field = f"tools[{i}]"
        if tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise _bad(field, "must be {'type': 'function', 'function': {...}}")
        extra = sorted(set(tool) - _TOOL_KEYS)
        if extra:
            raise _bad(f"{field}.{extra[0]}", "not supported", "unsupported_parameter")
        fn = tool["function"]
        extra = sorted(set(fn) - _FUNCTION_KEYS)
        if extra:
            raise _bad(f"{field}.function.{extra[0]}", "not supported", "unsupported_parameter")
        name = fn.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise _bad(f"{field}.function.name", "must be a name of 1 to 64 characters")
        if name in names:
            raise _bad(f"{field}.function.name", f"{name!r} is given twice")
        names.add(name)
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise _bad(f"{field}.function.parameters", "must be a JSON schema object")
    return list(tools)


def _choice(req: Any, tools: list[dict[str, Any]] | None) -> tuple[str, str | None]:
    choice = req.tool_choice
    if choice is None:
        return ("auto" if tools else "none"), None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise _bad("tool_choice", f"{choice!r:.40} is not one of none, auto, required or "
                       "{'type': 'function', 'function': {'name': ...}}")
        if choice == "required" and not tools:
            raise _bad("tool_choice", "'required' needs tools")
        return choice, None
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise _bad("tool_choice", "a named choice is {'type': 'function', 'function': "
                   "{'name': ...}}")
    known = [t["function"]["name"] for t in tools or []]
    if name not in known:
        raise _bad("tool_choice.function.name", f"{name!r:.64} is not in tools")
    return "named", name


def _response_format(fmt: dict[str, Any] | None) -> StructuredOutputsParams | None:
    if not fmt:
        return None
    kind = fmt.get("type", "text")
    extra = sorted(set(fmt) - {"type", "json_schema"})
    if extra or (kind != "json_schema" and "json_schema" in fmt):
        name = extra[0] if extra else "json_schema"
        raise _bad(f"response_format.{name}", f"not allowed with type {kind!r:.40}")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True, field="response_format")
    if kind != "json_schema":
        raise _bad("response_format.type", f"{kind!r:.40} is not one of text, json_object, "
                   "json_schema")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise _bad("response_format.json_schema", "must be an object with a schema")
    extra = sorted(set(spec) - _SCHEMA_KEYS)
    if extra:
        raise _bad(f"response_format.json_schema.{extra[0]}", "not supported",
                   "unsupported_parameter")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise _bad("response_format.json_schema.schema", "must be a JSON schema object")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _bad("response_format.json_schema.strict", "must be a boolean")
    return StructuredOutputsParams(json=schema, strict=bool(strict),
                                   field="response_format.json_schema.schema")


def _checked(params: StructuredOutputsParams | None) -> StructuredOutputsParams | None:
    if params is None:
        return None
    try:
        build_grammar(params)
    except StructuredOutputsError as e:
        raise _bad(e.field, e.message) from e
    return params


def tool_plan(req: Any) -> ToolPlan:
    """The checked plan of a chat request. Raises APIError 400 naming the field."""
    if req.functions or req.function_call not in (None, "none", "auto"):
        name = "functions" if req.functions else "function_call"
        raise _bad(name, "deprecated by OpenAI and not supported; use tools and tool_choice",
                   "unsupported_parameter")
    tools = check_tools(req.tools) if req.tools else None
    choice, name = _choice(req, tools)
    structured = _response_format(req.response_format)
    if structured is not None and choice in ("required", "named"):
        raise _bad("response_format", "cannot be combined with tool_choice "
                   f"{req.tool_choice!r:.60}: both constrain the answer")
    parallel = req.parallel_tool_calls is not False
    if choice == "named":
        k = next(k for k, t in enumerate(tools or []) if t["function"]["name"] == name)
        fn = (tools or [])[k]["function"]
        structured = StructuredOutputsParams(
            json=fn.get("parameters") or {"type": "object"}, strict=bool(fn.get("strict")),
            field=f"tools[{k}].function.parameters")
    elif choice == "required":
        structured = StructuredOutputsParams(json=required_calls_schema(tools or [], parallel),
                                             strict=False, field="tools")
    return ToolPlan(choice, name, tools, parallel, _checked(structured))


def template_tool_calls(i: int, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant turn's `tool_calls` for the chat template: arguments JSON text becomes the
    object most templates expect (`tojson` of it)."""
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"messages[{i}].tool_calls[{j}].function", "must have a name")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as e:
                raise _bad(f"messages[{i}].tool_calls[{j}].function.arguments",
                           "must be JSON text") from e
        out.append({**call, "type": call.get("type", "function"),
                    "function": {**fn, "arguments": args}})
    return out
