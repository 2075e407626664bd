"""Formats whose parameters are tagged one by one; the arguments JSON is built member by member
(`{"k": v` once a parameter closes, `}` when the call does), typed by the tool's schema.

    GLM-4.5 / 4.7:   <tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n
                     </tool_call> (4.7 writes no newlines)
    Qwen3-Coder,     <tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n</function>
    Qwen3.5:         \\n</tool_call>
    DeepSeek-V3.2:   <｜DSML｜function_calls>\\n<｜DSML｜invoke name="NAME">\\n<｜DSML｜parameter
                     name="K" string="true">V</｜DSML｜parameter>\\n</｜DSML｜invoke>\\n
                     </｜DSML｜function_calls>
"""

from __future__ import annotations

import re
from typing import Any

from hyla.server.tool_parsers.base import ParsedCall, ToolParser, json_member, typed_value


def _arguments(members: list[str], closed: bool) -> str:
    text = "".join(members)
    if not closed:
        return text
    return text + "}" if members else "{}"


class Glm45Parser(ToolParser):
    starts = ("<tool_call>",)
    end = "</tool_call>"
    pair = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)

    def parse_region(self, text: str, final: bool) -> tuple[list[ParsedCall], int | None, str]:
        end = text.find(self.end)
        body = text if end < 0 else text[:end]
        stops = [i for i in (body.find("\n"), body.find("<arg_key>")) if i >= 0]
        if not stops and end < 0 and not final:
            return [], None, ""  # the name may go on
        name_end = min(stops) if stops else len(body)
        name = body[:name_end].strip()
        if not name:
            return [], None if end < 0 else end + len(self.end), ""
        props = self.types.get(name, {})
        members = []
        for m in self.pair.finditer(body, name_end):
            key = m.group(1).strip()
            members.append(json_member(key, typed_value(m.group(2), props.get(key)),
                                       not members))
        closed = end >= 0 or final
        call = ParsedCall(name, _arguments(members, closed))
        return [call], None if end < 0 else end + len(self.end), ""


class Qwen3CoderParser(ToolParser):
    starts = ("<tool_call>",)
    end = "</tool_call>"
    function = re.compile(r"\s*<function=([^>\n]*)>")
    parameter = re.compile(r"\s*<parameter=([^>\n]*)>(.*?)</parameter>", re.DOTALL)

    def parse_region(self, text: str, final: bool) -> tuple[list[ParsedCall], int | None, str]:
        end = text.find(self.end)
        body = text if end < 0 else text[:end]
        region_end = None if end < 0 else end + len(self.end)
        head = self.function.match(body)
        if head is None:
            fallback = (self.starts[0] + body + (self.end if end >= 0 else "")) \
                if (end >= 0 or final) else ""
            return [], region_end, fallback
        name = head.group(1).strip()
        props = self.types.get(name, {})
        members = []
        for m in self.parameter.finditer(body, head.end()):
            key = m.group(1).strip()
            raw = m.group(2).removeprefix("\n").removesuffix("\n")
            members.append(json_member(key, typed_value(raw, props.get(key)), not members))
        closed = end >= 0 or final or "</function>" in body
        return [ParsedCall(name, _arguments(members, closed))], region_end, ""


class DeepSeekV32Parser(ToolParser):
    starts = ("<｜DSML｜function_calls>",)
    end = "</｜DSML｜function_calls>"
    invoke = re.compile(r'\s*<｜DSML｜invoke\s+name="([^"]*)"\s*>')
    invoke_end = "</｜DSML｜invoke>"
    parameter = re.compile(
        r'\s*<｜DSML｜parameter\s+name="([^"]*)"\s+string="(true|false)"\s*>(.*?)'
        r"</｜DSML｜parameter>", re.DOTALL)

    def parse_region(self, text: str, final: bool) -> tuple[list[ParsedCall], int | None, str]:
        end = text.find(self.end)
        body = text if end < 0 else text[:end]
        calls: list[ParsedCall] = []
        pos = 0
        while (head := self.invoke.match(body, pos)) is not None:
            close = body.find(self.invoke_end, head.end())
            inner = body[head.end():] if close < 0 else body[head.end():close]
            calls.append(self._call(head.group(1), inner, close >= 0 or end >= 0 or final))
            if close < 0:
                break
            pos = close + len(self.invoke_end)
        return calls, None if end < 0 else end + len(self.end), ""

    def _call(self, name: str, inner: str, closed: bool) -> ParsedCall:
        props = self.types.get(name, {})
        members = []
        for m in self.parameter.finditer(inner):
            key, is_string, raw = m.group(1), m.group(2) == "true", m.group(3)
            value: Any = raw if is_string else typed_value(raw, props.get(key))
            members.append(json_member(key, value, not members))
        return ParsedCall(name, _arguments(members, closed))
