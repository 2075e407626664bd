"""Reasoning, content and tool calls of a chat answer, streamed as deltas or parsed whole.

`MessageStream.feed(delta, final)` re-parses the text so far and sends what is new in each
field: since each partial parse is a prefix of the next (`base` module docstring), the deltas
concatenate to the final parse, which is exactly what the non-streaming answer reports (it runs
the same stream once, with `final=True`). A tool name goes out whole, in its call's first delta.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

from hyla.server.reasoning import ReasoningParser
from hyla.server.tool_parsers.base import ParsedText, ToolParser

logger = logging.getLogger("hyla.server")


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ParsedMessage:
    reasoning: str | None = None
    content: str = ""
    calls: ParsedText = field(default_factory=ParsedText)


@dataclass
class CallDelta:
    index: int
    id: str | None = None  # with `name`, in a call's first delta only
    name: str | None = None
    arguments: str = ""


@dataclass
class MessageDelta:
    reasoning: str = ""
    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (self.reasoning or self.content or self.calls)


class MessageParser:
    """Splits an answer into reasoning, content and tool calls.

    Args:
        tools: the tool-call parser (None: no tools, all text is content).
        reasoning: the reasoning parser (None: no reasoning split).
        opened: the prompt ends inside a reasoning span (`reasoning.prompt_opens_reasoning`).
    """

    def __init__(self, tools: ToolParser | None, reasoning: ReasoningParser | None,
                 opened: bool = False) -> None:
        self.tools, self.reasoning, self.opened = tools, reasoning, opened

    def parse(self, text: str, final: bool) -> ParsedMessage:
        reasoning, rest = None, text
        if self.reasoning is not None:
            stops = self.tools.starts if self.tools is not None else ()
            reasoning, rest = self.reasoning.split(text, final, self.opened, stops)
        if self.tools is None:
            return ParsedMessage(reasoning, rest)
        parsed = self.tools.parse(rest, final)
        return ParsedMessage(reasoning, parsed.content, parsed)


class MessageStream:
    """One choice's answer, fed its text deltas in order."""

    def __init__(self, parser: MessageParser) -> None:
        self.parser = parser
        self.text = ""
        self.sent = ParsedMessage(reasoning="")
        self.ids: list[str] = []
        self.num_violations = 0  # a partial parse that was not a prefix (a parser bug)

    def feed(self, delta: str, final: bool = False) -> MessageDelta:
        self.text += delta
        now = self.parser.parse(self.text, final)
        out = MessageDelta(reasoning=self._new("reasoning", now.reasoning or ""),
                           content=self._new("content", now.content))
        for i, call in enumerate(now.calls.calls):
            if i >= len(self.sent.calls.calls):
                self.ids.append(call.id or call_id())
                self.sent.calls.calls.append(type(call)(call.name, "", call.id))
                out.calls.append(CallDelta(i, self.ids[i], call.name, call.arguments))
                self.sent.calls.calls[i].arguments = call.arguments
                continue
            old = self.sent.calls.calls[i].arguments
            if call.arguments.startswith(old) and call.arguments != old:
                out.calls.append(CallDelta(i, arguments=call.arguments[len(old):]))
                self.sent.calls.calls[i].arguments = call.arguments
            elif not call.arguments.startswith(old):
                self._violation(f"calls[{i}].arguments")
        return out

    def _new(self, name: str, value: str) -> str:
        old = getattr(self.sent, name) or ""
        if not value.startswith(old):
            self._violation(name)
            return ""
        setattr(self.sent, name, value)
        return value[len(old):]

    def _violation(self, name: str) -> None:
        self.num_violations += 1
        logger.warning("tool/reasoning parser: %s of a partial parse is not a prefix", name)

    def message(self) -> ParsedMessage:
        """Everything sent so far (after a final feed: the whole parsed answer)."""
        return self.sent
