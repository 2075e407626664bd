"""Formats whose arguments are JSON text between markers: Kimi-K2 and DeepSeek-V3.1 (a section of
calls, each `begin NAME sep ARGS end`), and Hermes / Qwen3 (`<tool_call>{"name", "arguments"}
</tool_call>` blocks).

    Kimi-K2, Kimi-Linear:  <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
                           <|tool_call_argument_begin|>{...}<|tool_call_end|>...
                           <|tool_calls_section_end|>
    DeepSeek-V3.1:         <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}
                           <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
"""

from __future__ import annotations

import json

from hyla.server.tool_parsers.base import ParsedCall, ToolParser, certain, find_first


class SectionParser(ToolParser):
    """A section of calls `call_begin NAME name_end ARGS call_end`, closed by `section_end`;
    the arguments stream as the model writes them (stripped of surrounding whitespace)."""

    call_begin = ""
    name_end = ""
    call_end = ""
    section_end = ""

    def name_and_id(self, raw: str) -> tuple[str, str | None]:
        return raw.strip(), None

    def parse_region(self, text: str, final: bool) -> tuple[list[ParsedCall], int | None, str]:
        calls: list[ParsedCall] = []
        pos = 0
        while True:
            hit = find_first(text, (self.call_begin, self.section_end), pos)
            if hit is None:
                return calls, None, ""
            if hit[1] == self.section_end:
                return calls, hit[0] + len(hit[1]), ""
            start = hit[0] + len(hit[1])
            sep = text.find(self.name_end, start)
            if sep < 0:
                return calls, None, ""
            name, call_id = self.name_and_id(text[start:sep])
            args_start = sep + len(self.name_end)
            end = text.find(self.call_end, args_start)
            raw = text[args_start:] if end < 0 else text[args_start:end]
            if end < 0:
                raw = certain(raw, (self.call_end, self.section_end), final)
            calls.append(ParsedCall(name, raw.strip(), call_id))
            if end < 0:
                return calls, None, ""
            pos = end + len(self.call_end)


class KimiK2Parser(SectionParser):
    starts = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
    call_begin = "<|tool_call_begin|>"
    name_end = "<|tool_call_argument_begin|>"
    call_end = "<|tool_call_end|>"
    section_end = "<|tool_calls_section_end|>"

    def name_and_id(self, raw: str) -> tuple[str, str | None]:
        """`functions.NAME:IDX` -> NAME; the id is kept as the model wrote it (its chat template
        matches tool results to calls by it)."""
        call_id = raw.strip()
        name = call_id.rsplit(":", 1)[0] if ":" in call_id else call_id
        return name.removeprefix("functions."), call_id


class DeepSeekV31Parser(SectionParser):
    starts = ("<｜tool▁calls▁begin｜>",)
    call_begin = "<｜tool▁call▁begin｜>"
    name_end = "<｜tool▁sep｜>"
    call_end = "<｜tool▁call▁end｜>"
    section_end = "<｜tool▁calls▁end｜>"


class HermesParser(ToolParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`: a call is reported when its
    block closes (its arguments re-serialized: they are a value inside the block's JSON)."""

    starts = ("<tool_call>",)
    end = "</tool_call>"

    def parse_region(self, text: str, final: bool) -> tuple[list[ParsedCall], int | None, str]:
        end = text.find(self.end)
        if end < 0:
            return [], None, (self.starts[0] + text) if final else ""
        body = text[:end]
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        args = obj.get("arguments", obj.get("parameters", {})) if isinstance(obj, dict) else None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or args is None:
            return [], end + len(self.end), self.starts[0] + body + self.end
        arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        return [ParsedCall(obj["name"], arguments)], end + len(self.end), ""
