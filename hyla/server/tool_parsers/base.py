"""What every tool-call parser shares: the parsed shapes and the driver over call regions.

A parser reads the whole text generated so far, `parse(text, final)`. With `final=False` it
reports only what later text cannot change: a content prefix (holding back a tail that may be a
marker's start, and trailing whitespace), a call's name once complete, its arguments up to what
is certain. So each partial parse is a prefix of the next and of the final one, field by field,
and the streamed deltas (`stream.MessageStream`) concatenate to the non-streaming message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ParsedCall:
    """One call: `name` complete, `arguments` JSON text (a prefix of it while partial); `id` the
    model's own id (Kimi's `functions.NAME:IDX`), None: the server makes one."""

    name: str
    arguments: str = ""
    id: str | None = None


@dataclass
class ParsedText:
    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)


def held_tail(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


def certain(text: str, markers: tuple[str, ...], final: bool) -> str:
    """`text` less a tail that may start one of `markers` (nothing held when `final`)."""
    if final:
        return text
    return text[: len(text) - held_tail(text, markers)]


def find_first(text: str, markers: tuple[str, ...], start: int = 0) -> tuple[int, str] | None:
    """The earliest occurrence of any marker at or after `start`: (index, marker)."""
    hits = [(i, m) for m in markers if (i := text.find(m, start)) >= 0]
    return min(hits, key=lambda h: (h[0], -len(h[1]))) if hits else None


def schema_types(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """{function name: {parameter: its JSON schema}} of the request's tools."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        fn = tool.get("function") or {}
        props = (fn.get("parameters") or {}).get("properties") or {}
        if isinstance(fn.get("name"), str) and isinstance(props, dict):
            out[fn["name"]] = props
    return out


def typed_value(raw: str, schema: dict[str, Any] | None) -> Any:
    """An XML-format parameter's text as its JSON value: a string for string-typed parameters
    (or when it is not JSON), else the decoded JSON."""
    kind = (schema or {}).get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if "string" in kinds and len(kinds) == 1:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def json_member(key: str, value: Any, first: bool) -> str:
    """One `"key": value` member of an arguments object, as json.dumps writes it."""
    text = f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"
    return ("{" if first else ", ") + text


class ToolParser:
    """Content, then call regions. A subclass sets `starts` (the markers opening a region) and
    `parse_region`.

    Args:
        tools: the request's tools (parameter types for the XML formats).
    """

    starts: tuple[str, ...] = ()

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        self.types = schema_types(tools)

    def parse_region(self, text: str, final: bool) -> tuple[list[ParsedCall], int | None, str]:
        """Parse the calls of one region (`text` starts after its start marker).

        Returns: (calls, the index just past the region's end in `text` or None while it is
        open, text to show as content at the end instead: a region that holds no valid call).
        """
        raise NotImplementedError

    def parse(self, text: str, final: bool) -> ParsedText:
        """Content and calls of `text` (see the module docstring for `final`)."""
        out = ParsedText()
        after: list[str] = []  # text between and after regions: content, shown at the end
        pos, first = 0, True
        while True:
            hit = find_first(text, self.starts, pos)
            segment = text[pos:] if hit is None else text[pos : hit[0]]
            if first and hit is None:
                kept = certain(segment, self.starts, final)
                out.content = kept if final else kept.rstrip()
            elif first:
                out.content = segment.rstrip()
            else:
                after.append(segment)
            if hit is None:
                break
            first = False
            begin = hit[0] + len(hit[1])
            calls, end, fallback = self.parse_region(text[begin:], final)
            out.calls.extend(calls)
            if fallback:
                after.append(fallback)
            if end is None:
                break
            pos = begin + end
        if final:
            out.content += "".join(after).strip()
        return out
