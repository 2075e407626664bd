"""Pinned documents: named prefixes whose device blocks and state checkpoint hold a reference of
their own, so eviction never takes them; also written to the tiers when there are any."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hyla.cache.prefix import PrefixCache, extend_block_hashes

MAX_NAME_LEN = 128


class DocumentError(ValueError):
    """A document request that cannot be served; `field` names what was wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Document:
    """`num_tokens` of `num_prompt_tokens` pinned: whole blocks, ending at a checkpoint if any."""

    name: str
    num_prompt_tokens: int
    num_tokens: int
    block_ids: tuple[int, ...]
    checkpoint_id: int | None


class DocumentPins:
    def __init__(self, prefix: PrefixCache) -> None:
        self.prefix = prefix
        self.documents: dict[str, Document] = {}

    @property
    def num_pinned_blocks(self) -> int:
        return sum(len(d.block_ids) for d in self.documents.values())

    @property
    def num_pinned_tokens(self) -> int:
        return sum(d.num_tokens for d in self.documents.values())

    def pin(
        self,
        name: str,
        token_ids: Sequence[int],
        tiers=None,  # noqa: ANN001
        max_pinned_blocks: int | None = None,
    ) -> Document:
        """Hold the deepest cached pair of `token_ids` under `name` (replacing a pin of that name);
        `tiers` (a `TieredPrefix`), when given, gets a copy. Raises DocumentError."""
        if not name or len(name) > MAX_NAME_LEN:
            raise DocumentError("name", f"must be 1..{MAX_NAME_LEN} characters")
        prefix, pool = self.prefix, self.prefix.block_pool
        hashes = extend_block_hashes([], token_ids, prefix.block_size)
        m = 0
        while m < len(hashes) and pool.lookup(hashes[m]) is not None:
            m += 1
        end, c = m, None
        if prefix.stride:
            end = next((j for j in range(m, 0, -1) if prefix.checkpoints.lookup(hashes[j - 1])
                        is not None), 0)  # fmt: skip
            c = prefix.checkpoints.lookup(hashes[end - 1]) if end else None
        if not end:
            raise DocumentError("prompt", "no block of it is cached with its state (too short?)")
        block_ids = tuple(pool.lookup(h) for h in hashes[:end])
        old = len(self.documents[name].block_ids) if name in self.documents else 0
        total = self.num_pinned_blocks - old + end
        if max_pinned_blocks is not None and total > max_pinned_blocks:
            raise DocumentError(
                "prompt", f"pins would hold {total} blocks, the limit is {max_pinned_blocks} "
                "(the rest must hold one full-length sequence)",
            )  # fmt: skip
        pool.acquire_cached(list(block_ids))
        if c is not None:
            prefix.checkpoints.acquire(c)
        self.unpin(name)
        doc = Document(name, len(token_ids), end * prefix.block_size, block_ids, c)
        self.documents[name] = doc
        if tiers is not None:
            tiers.publish(block_ids, hashes[:end], [] if c is None else [(c, hashes[end - 1])])
        return doc

    def unpin(self, name: str) -> bool:
        doc = self.documents.pop(name, None)
        if doc is None:
            return False
        self.prefix.block_pool.free(list(doc.block_ids))
        if doc.checkpoint_id is not None:
            self.prefix.checkpoints.release(doc.checkpoint_id)
        return True
