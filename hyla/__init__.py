"""hyla: inference and serving for hybrid linear/sparse-attention language models."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # Lazy: `import hyla` must not pull in torch for bookkeeping-only users.
    if name == "LLM":
        from hyla.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from hyla.request import SamplingParams

        return SamplingParams
    raise AttributeError(name)
