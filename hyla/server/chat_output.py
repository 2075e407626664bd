"""A chat answer's text -> the OpenAI message: `content`, `reasoning_content`, `tool_calls`.

`ChatOutput.for_request` picks the parsers once per request: the tool-call parser when the
request has tools (`--tool-call-parser`, or the forced-call parsers of tool_choice required /
named), the reasoning parser when the server has one (`--reasoning-parser`). Without either,
the text is the content, as it always was. Each choice gets one `MessageStream`: streamed
answers send its deltas, whole answers its final parse (the same one).
"""

from __future__ import annotations

from typing import Any

from hyla.server.chat_tools import ToolPlan, tool_plan
from hyla.server.protocol import (
    ChatResponseMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
)
from hyla.server.reasoning import ReasoningParser, prompt_opens_reasoning
from hyla.server.tool_parsers import make_tool_parser, resolve_tool_parser
from hyla.server.tool_parsers.forced import NamedCallParser, RequiredCallsParser
from hyla.server.tool_parsers.stream import MessageDelta, MessageParser, MessageStream

# Prompt tokens decoded to see whether the template opened a <think> span.
_PROMPT_TAIL_TOKENS = 16


def _tool_parser(plan: ToolPlan, config: Any, tokenizer: Any, model_type: str | None) -> Any:
    if not plan.parses_calls:
        return None
    if plan.choice == "named":
        return NamedCallParser(plan.name or "")
    if plan.choice == "required":
        return RequiredCallsParser(plan.tools)
    name = resolve_tool_parser(getattr(config, "tool_call_parser", "auto"),
                               getattr(tokenizer, "chat_template", None), model_type)
    return make_tool_parser(name, plan.tools)


class ChatOutput:
    """The parsers of one chat request and a `MessageStream` per choice."""

    def __init__(self, parser: MessageParser | None, plan: ToolPlan) -> None:
        self.parser = parser
        self.plan = plan
        self.streams: dict[int, MessageStream] = {}

    @classmethod
    def for_request(cls, req: Any, engine: Any, prompt_ids: Any) -> ChatOutput:
        plan = tool_plan(req)
        inner = getattr(engine, "engine", None)
        config = getattr(inner, "config", None)
        tokenizer = engine.tokenizer
        model_type = getattr(getattr(inner, "model_config", None), "architecture", None)
        tools = _tool_parser(plan, config, tokenizer, model_type)
        reasoning = None
        if getattr(config, "reasoning_parser", None) and plan.choice not in ("named", "required"):
            reasoning = ReasoningParser()
        if tools is None and reasoning is None:
            return cls(None, plan)
        opened = False
        if reasoning is not None and tokenizer is not None:
            ids = getattr(prompt_ids, "prompt_token_ids", prompt_ids)
            tail = tokenizer.decode(list(ids)[-_PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
            opened = prompt_opens_reasoning(tail)
        return cls(MessageParser(tools, reasoning, opened), plan)

    def _stream(self, index: int) -> MessageStream:
        if index not in self.streams:
            self.streams[index] = MessageStream(self.parser)  # type: ignore[arg-type]
        return self.streams[index]

    def _finish_reason(self, stream: MessageStream | None, reason: str | None) -> str | None:
        """"tool_calls" for an answer that made calls (OpenAI: "stop" for a named choice)."""
        if reason == "stop" and stream is not None and stream.ids and self.plan.choice != "named":
            return "tool_calls"
        return reason

    def message(self, completion: Any) -> tuple[ChatResponseMessage, str | None]:
        """The whole message of a finished choice and its finish_reason."""
        if self.parser is None:
            return ChatResponseMessage(content=completion.text), completion.finish_reason
        stream = self._stream(completion.index)
        stream.feed(completion.text, final=True)
        sent = stream.message()
        calls = [ToolCall(id=i, function=FunctionCall(name=c.name, arguments=c.arguments))
                 for c, i in zip(sent.calls.calls, stream.ids, strict=True)]
        message = ChatResponseMessage(content=sent.content or None,
                                      reasoning_content=sent.reasoning or None,
                                      tool_calls=calls or None)
        return message, self._finish_reason(stream, completion.finish_reason)

    def delta(self, completion: Any) -> tuple[DeltaMessage | None, str | None]:
        """A streamed choice's new delta (None: nothing new to send) and finish_reason."""
        if self.parser is None:
            return DeltaMessage(content=completion.text or None), completion.finish_reason
        stream = self._stream(completion.index)
        d = stream.feed(completion.text, final=completion.finish_reason is not None)
        reason = self._finish_reason(stream, completion.finish_reason)
        return (None if d.is_empty else _delta_message(d)), reason


def _delta_message(d: MessageDelta) -> DeltaMessage:
    calls = [
        DeltaToolCall(index=c.index, id=c.id, type="function" if c.id else None,
                      function=DeltaFunctionCall(name=c.name, arguments=c.arguments))
        for c in d.calls
    ]
    return DeltaMessage(content=d.content or None, reasoning_content=d.reasoning or None,
                        tool_calls=calls or None)
