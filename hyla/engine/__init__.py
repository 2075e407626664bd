"""The engine: model runner, sampler, detokenizer, driven by `LLMEngine`/`LLM`."""

from __future__ import annotations

__all__ = ["LLM", "LLMEngine"]


def __getattr__(name: str):
    # Lazy so that `import hyla.engine.sampler` does not load the model code.
    if name == "LLM":
        from hyla.engine.llm import LLM

        return LLM
    if name == "LLMEngine":
        from hyla.engine.llm_engine import LLMEngine

        return LLMEngine
    raise AttributeError(name)
