"""Reasoning output: the `<think>...</think>` span of a chat answer becomes `reasoning_content`.

Every supported family writes `<think>` / `</think>` (DeepSeek-R1/V3.x, Qwen3, GLM-4.5+,
Kimi-K2); what differs is whether the chat template already opened the span at the end of the
prompt (then the answer starts inside it). `MessageParser` asks the prompt, not the family.
A tool call's start marker also ends the reasoning: a model that calls a tool before closing
its thought still makes the call (it is parsed, not swallowed into the reasoning).
"""

from __future__ import annotations

from dataclasses import dataclass

from hyla.server.tool_parsers.base import certain, find_first

THINK_START, THINK_END = "<think>", "</think>"


def prompt_opens_reasoning(prompt_text: str) -> bool:
    """Whether the rendered prompt ends inside a `<think>` span (the template opened it)."""
    tail = prompt_text.rstrip()
    return tail.endswith(THINK_START) or (
        tail.rfind(THINK_START) > tail.rfind(THINK_END) and THINK_START in tail
    )


@dataclass(frozen=True)
class ReasoningParser:
    """Splits text into (reasoning, the rest); `stops` are tool-call start markers."""

    start: str = THINK_START
    end: str = THINK_END

    def split(self, text: str, final: bool, opened: bool,
              stops: tuple[str, ...] = ()) -> tuple[str | None, str]:
        """(reasoning or None when the text has none, the text after it). With `final=False`
        only what later text cannot change; `opened`: the prompt opened the span."""
        if not opened:
            stripped = text.lstrip()
            if stripped.startswith(self.start):
                text = stripped[len(self.start):]
            elif not final and self.start.startswith(stripped):
                return "", ""  # may still become the start marker
            else:
                return None, text
        markers = (self.end, *stops)
        hit = find_first(text, markers)
        if hit is None:
            return certain(text, markers, final), ""
        i, marker = hit
        if marker == self.end:
            return text[:i], text[i + len(marker):].lstrip()
        return text[:i], text[i:]
