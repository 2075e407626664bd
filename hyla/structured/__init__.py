"""Structured output: grammars (JSON schema, regex, choice) by xgrammar, applied as bitmasks."""

from hyla.structured.params import StructuredOutputsError, StructuredOutputsParams

__all__ = ["StructuredOutputsError", "StructuredOutputsParams"]
