"""Answers a grammar forced into tool calls (`tool_choice` required or a named function)."""

from __future__ import annotations

import json

from hyla.server.tool_parsers.base import ParsedCall, ParsedText, ToolParser


class NamedCallParser(ToolParser):
    """The whole answer is the named function's arguments object; it streams as written."""

    def __init__(self, name: str) -> None:
        super().__init__(None)
        self.name = name

    def parse(self, text: str, final: bool) -> ParsedText:
        # stripping keeps partial parses prefixes: a trailing space it drops comes back once
        # more text follows it
        return ParsedText(calls=[ParsedCall(self.name, text.strip())])


class RequiredCallsParser(ToolParser):
    """The answer is a JSON array `[{"name": ..., "parameters": {...}}, ...]`; the calls are
    reported once it is complete."""

    def parse(self, text: str, final: bool) -> ParsedText:
        if not final:
            return ParsedText()
        try:
            items = json.loads(text)
        except ValueError:
            return ParsedText(content=text)
        calls = [ParsedCall(item["name"], json.dumps(item.get("parameters", {}),
                                                     ensure_ascii=False))
                 for item in items if isinstance(item, dict) and isinstance(item.get("name"), str)]
        return ParsedText(calls=calls) if calls else ParsedText(content=text)


def required_calls_schema(tools: list[dict], parallel: bool) -> dict:
    """The JSON schema of `RequiredCallsParser`'s array: one item per call, of any tool."""
    items = [{
        "type": "object",
        "properties": {"name": {"const": t["function"]["name"]},
                       "parameters": t["function"].get("parameters") or {"type": "object"}},
        "required": ["name", "parameters"],
        "additionalProperties": False,
    } for t in tools]
    schema: dict = {"type": "array", "items": {"anyOf": items}, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema
