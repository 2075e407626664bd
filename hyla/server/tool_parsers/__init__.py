"""Tool-call parsers, one per family format, by vLLM's `--tool-call-parser` names.

`resolve_tool_parser("auto", ...)` picks the format from the chat template's own markers, then
from the checkpoint's `model_type`; `hermes` when neither says.
"""

from __future__ import annotations

from typing import Any

from hyla.config import REASONING_PARSERS, TOOL_CALL_PARSERS
from hyla.server.tool_parsers.base import ParsedCall, ParsedText, ToolParser
from hyla.server.tool_parsers.sections import DeepSeekV31Parser, HermesParser, KimiK2Parser
from hyla.server.tool_parsers.xml_formats import DeepSeekV32Parser, Glm45Parser, Qwen3CoderParser

PARSERS: dict[str, type[ToolParser]] = {
    "kimi_k2": KimiK2Parser,
    "deepseek_v31": DeepSeekV31Parser,
    "deepseek_v32": DeepSeekV32Parser,
    "glm45": Glm45Parser,
    "glm47": Glm45Parser,  # the same tags without newlines; one parser reads both
    "hermes": HermesParser,
    "qwen3_coder": Qwen3CoderParser,
}
# A marker only one format's chat template writes, in the order they are tried.
_TEMPLATE_MARKERS = (
    ("<|tool_calls_section_begin|>", "kimi_k2"),
    ("<｜DSML｜", "deepseek_v32"),
    ("<｜tool▁calls▁begin｜>", "deepseek_v31"),
    ("<arg_key>", "glm47"),
    ("<function=", "qwen3_coder"),
    ("<tool_call>", "hermes"),
)
_MODEL_TYPES = {
    "kimi_linear": "kimi_k2", "kimi_k2": "kimi_k2", "deepseek_v32": "deepseek_v32",
    "deepseek_v3": "deepseek_v31", "glm5_next": "glm47", "glm4_moe": "glm45",
    "qwen3_next": "hermes", "qwen3_5": "qwen3_coder", "qwen3": "hermes",
}


def resolve_tool_parser(name: str, chat_template: Any, model_type: str | None) -> str:
    """The parser name `name` stands for (`auto`: from the template, then the model type)."""
    if name != "auto":
        return name
    template = chat_template if isinstance(chat_template, str) else str(chat_template or "")
    for marker, parser in _TEMPLATE_MARKERS:
        if marker in template:
            return parser
    return _MODEL_TYPES.get(model_type or "", "hermes")


def make_tool_parser(name: str, tools: list[dict[str, Any]] | None) -> ToolParser:
    """A parser of a resolved name for one request's `tools`."""
    return PARSERS[name](tools)


__all__ = ["PARSERS", "REASONING_PARSERS", "TOOL_CALL_PARSERS", "ParsedCall", "ParsedText",
           "ToolParser", "make_tool_parser", "resolve_tool_parser"]
