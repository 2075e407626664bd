"""Pinning documents: prefill the document (a one-token request), then pin its deepest cached
pair (`hyla.cache.documents`) under the engine's lock."""

from __future__ import annotations

from typing import Any

from hyla.cache.documents import Document, DocumentError
from hyla.engine.validate import prompt_token_ids, validate_lengths
from hyla.request import SamplingParams

PREFILL = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)


def document_ids(engine: Any, prompt: str | list[int]) -> list[int]:
    """A document's token ids, checked as a prompt; raises InvalidRequestError("prompt")."""
    ids = list(prompt_token_ids(prompt, engine.tokenizer, engine.model_config.vocab_size))
    validate_lengths(len(ids), PREFILL, engine.max_model_len)
    return ids


def _pin(engine: Any, name: str, ids: list[int]) -> Document:
    if engine.cache.documents is None:
        raise DocumentError("prompt", "prefix caching is off: nothing can be pinned")
    cache = engine.cache
    per_sequence = -(-engine.max_model_len // cache.block_size)
    limit = cache.block_pool.num_usable_blocks - per_sequence
    with engine._lock:
        return cache.documents.pin(name, ids, cache.tiers, max(0, limit))


def pin_document(engine: Any, name: str, prompt: str | list[int]) -> Document:
    """Compute and pin a document on a synchronous `LLMEngine` (no other caller stepping it)."""
    ids = document_ids(engine, prompt)
    rid = f"document-{name}"
    engine.add_request(rid, ids, PREFILL)
    while engine.has_unfinished_requests():
        engine.step()
    return _pin(engine, name, ids)


async def pin_document_async(async_engine: Any, name: str, prompt: str | list[int]) -> Document:
    """`pin_document` through an `AsyncEngine`; the pin runs in its core between two steps."""
    ids = await async_engine.call(document_ids, prompt)
    async for _ in async_engine.generate(ids, PREFILL):
        pass
    return await async_engine.call(_pin, name, ids)


def unpin_document(engine: Any, name: str) -> bool:
    if engine.cache.documents is None:
        return False
    with engine._lock:
        return engine.cache.documents.unpin(name)


def list_documents(engine: Any) -> list[Document]:
    if engine.cache.documents is None:
        return []
    with engine._lock:
        return list(engine.cache.documents.documents.values())
