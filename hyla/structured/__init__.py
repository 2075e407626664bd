"""Structured output: grammars (JSON schema, any JSON, regex, choice) that constrain sampling.

`StructuredOutputsParams` (plain Python) rides on `SamplingParams.structured_outputs`; the engine
compiles it with xgrammar (`backend.GrammarBackend`), keeps one matcher per sequence, fills one
token bitmask for the constrained rows of a step and the sampler applies it on the device
(`bitmask.apply_token_bitmask`). See docs/architecture.md, "Structured output".
"""

from hyla.structured.params import StructuredOutputsError, StructuredOutputsParams

__all__ = ["StructuredOutputsError", "StructuredOutputsParams"]
