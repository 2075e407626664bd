"""Prefix cache for hybrid models: hashed attention/DSA blocks plus linear-state checkpoints.

A full block's hash chains its tokens onto its parent's hash, so hash j names the whole prefix
of (j+1)*B tokens. Linear layers (KDA, GDN) carry a fixed-size state instead of per-token
entries; a prefix of L tokens is reusable only with the state after EXACTLY L tokens, so the
state is checkpointed at multiples of the stride s (a multiple of B), keyed by the hash of the
block that ends there:

    tokens      0 ...... B | ...... | ...... s | ....... | ...... 2s | .. n-1
    blocks      h0         | h1 ... | h_{s/B-1} | ...     | h_{2s/B-1} |
    checkpoints                       C[h_{s/B-1}]          C[h_{2s/B-1}]   (state after s, 2s)

A hit at L needs blocks h0..h_{L/B-1} in the block pool AND a checkpoint keyed h_{L/B-1}; the
longest such L below the request's length is reused (blocks shared by ref count, checkpoint
copied into the request's own state slot) and the rest is computed. A model without linear
layers needs no checkpoints (stride 0): any block boundary is a hit.

Checkpoints are written by the model runner from the request's slot right after a forward whose
chunk ended at k*s (the scheduler cuts chunks there), and filed here only once that step's
tokens are committed. Evicting a block drops the checkpoint keyed by its hash, so a checkpoint
never outlives the blocks it belongs to; evicting a checkpoint alone keeps the blocks, which
still serve shorter hits. Plain Python, no torch.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from hyla.cache.block_pool import BlockPool, CheckpointPool
from hyla.request import Request

ROOT_HASH = 0


def hash_block(parent: int, token_ids: Sequence[int], extra_keys: tuple = ()) -> int:
    """128-bit content hash of one block: (parent hash, token ids, extra keys such as image
    hashes of the block). A cryptographic digest: a collision would silently serve wrong text."""
    digest = hashlib.blake2b(parent.to_bytes(16, "little"), digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    if extra_keys:
        digest.update(repr(extra_keys).encode())
    return int.from_bytes(digest.digest(), "little")


def extend_block_hashes(
    hashes: list[int],
    token_ids: Sequence[int],
    block_size: int,
    extra_keys: Callable[[int], tuple] | None = None,
    num_tokens: int | None = None,
) -> list[int]:
    """Append to `hashes` the chained hashes of the full blocks of `token_ids` it lacks.

    `extra_keys(j)`, when given, returns the extra keys of block j; `num_tokens` (default all)
    limits the blocks to the first tokens (the others' values are not known yet). Returns
    `hashes`.
    """
    parent = hashes[-1] if hashes else ROOT_HASH
    end = len(token_ids) if num_tokens is None else num_tokens
    for j in range(len(hashes), end // block_size):
        extra = extra_keys(j) if extra_keys is not None else ()
        parent = hash_block(parent, token_ids[j * block_size : (j + 1) * block_size], extra)
        hashes.append(parent)
    return hashes


@dataclass
class PrefixHit:
    """The reusable prefix of a request: `num_tokens` tokens in `block_ids`, with the state
    after them in `checkpoint_id` (None for a miss or a model without linear layers).
    `num_block_tokens` counts the tokens whose blocks were found, checkpoint or not."""

    num_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    checkpoint_id: int | None = None
    num_block_tokens: int = 0


@dataclass
class PrefixStats:
    """Counters since start. `num_block_only_tokens`: prompt tokens whose attention blocks were
    cached up to a checkpoint boundary but lacked the state checkpoint there (a miss that
    would be silent in an engine that restored the blocks anyway)."""

    num_queries: int = 0
    num_queried_tokens: int = 0
    num_hit_tokens: int = 0
    num_block_only_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0


class PrefixCache:
    """Finds and files reusable prefixes of requests (by request id).

    Args:
        block_pool: the block pool; its `cached` map is the block index.
        block_size: B.
        checkpoint_stride: s, a multiple of B; 0 when the model has no linear layers.
        num_checkpoints: size of the checkpoint pool.
    """

    def __init__(
        self, block_pool: BlockPool, block_size: int, checkpoint_stride: int, num_checkpoints: int
    ) -> None:
        if checkpoint_stride % block_size:
            raise ValueError(f"checkpoint_stride: {checkpoint_stride} is not a multiple of B")
        self.block_pool = block_pool
        block_pool.on_evict = self._on_block_evicted
        self.checkpoints = CheckpointPool(num_checkpoints)
        self.block_size = block_size
        self.stride = checkpoint_stride
        self.granule = checkpoint_stride or block_size
        self.stats = PrefixStats()
        self._hashes: dict[str, list[int]] = {}
        self._num_filed: dict[str, int] = {}
        self._pending: dict[str, tuple[int, int]] = {}  # id -> (length, checkpoint) to file
        self._restoring: list[int] = []
        self._in_flight: dict[int, str] = {}  # hash of a block being computed -> request id
        self._in_flight_of: dict[str, list[int]] = {}

    def _on_block_evicted(self, block_hash: int) -> None:
        self.checkpoints.drop(block_hash)

    def hashes(self, req: Request) -> list[int]:
        """Chained hashes of the full blocks of `req`'s known tokens (cached per request; a
        block holding a placeholder token is hashed once its value is written)."""
        hashes = self._hashes.setdefault(req.request_id, [])
        return extend_block_hashes(
            hashes, req.all_token_ids, self.block_size, num_tokens=req.num_known_tokens
        )

    def _num_matching_blocks(self, hashes: list[int], limit: int, in_flight: bool) -> int:
        j = 0
        while j < limit and (
            self.block_pool.lookup(hashes[j]) is not None
            or (in_flight and hashes[j] in self._in_flight)
        ):
            j += 1
        return j

    def match(self, req: Request) -> PrefixHit:
        """The longest reusable prefix of `req`, leaving >= 1 token to compute (no side effects)."""
        hashes = self.hashes(req)
        limit = min(len(hashes), (req.num_tokens - 1) // self.block_size)
        m = self._num_matching_blocks(hashes, limit, in_flight=False)
        block_ids = [self.block_pool.cached[h] for h in hashes[:m]]
        num_block_tokens = m * self.block_size
        if not self.stride:
            return PrefixHit(num_block_tokens, block_ids, None, num_block_tokens)
        per = self.stride // self.block_size
        for k in range(m // per, 0, -1):
            c = self.checkpoints.lookup(hashes[k * per - 1])
            if c is not None:
                return PrefixHit(k * self.stride, block_ids[: k * per], c, num_block_tokens)
        return PrefixHit(0, [], None, num_block_tokens)

    def in_flight_boundary(self, req: Request, hit: PrefixHit) -> tuple[int, str] | None:
        """(L, owner): a running request `owner` is computing `req`'s prefix up to a boundary
        L > hit.num_tokens right now, so `req` may wait for it instead of computing it twice."""
        if self.stride and not self.checkpoints.num_checkpoints:
            return None  # no checkpoint can ever make a hit: nothing worth waiting for
        hashes = self.hashes(req)
        limit = min(len(hashes), (req.num_tokens - 1) // self.block_size)
        reach = self._num_matching_blocks(hashes, limit, in_flight=True) * self.block_size
        g = self.granule
        for end in range(reach // g * g, hit.num_tokens, -g):
            owner = self._in_flight.get(hashes[end // self.block_size - 1])
            if owner is not None and owner != req.request_id:
                return end, owner
        return None

    def record(self, req: Request, hit: PrefixHit) -> None:
        s = self.stats
        s.num_queries += 1
        s.num_queried_tokens += req.num_tokens
        s.num_hit_tokens += hit.num_tokens
        if self.stride:
            reachable = hit.num_block_tokens // self.stride * self.stride
            s.num_block_only_tokens += max(0, reachable - hit.num_tokens)

    def begin(self, req: Request, hit: PrefixHit) -> None:
        """`req` was admitted with `hit`: hold its checkpoint for the restore copy and announce
        the blocks it will compute."""
        if hit.checkpoint_id is not None:
            self.checkpoints.acquire(hit.checkpoint_id)
            self._restoring.append(hit.checkpoint_id)
        rid = req.request_id
        self._num_filed[rid] = len(hit.block_ids)
        owned = self._in_flight_of.setdefault(rid, [])
        for h in self.hashes(req)[len(hit.block_ids) :]:
            if self.block_pool.lookup(h) is None and self._in_flight.setdefault(h, rid) == rid:
                owned.append(h)

    def end_step(self) -> None:
        """The step's restore copies are done: release the checkpoints they read."""
        for c in self._restoring:
            self.checkpoints.release(c)
        self._restoring.clear()

    def plan_save(self, req: Request, end: int) -> int | None:
        """Reserve a checkpoint for the state after `end` tokens when `end` is a stride boundary
        not yet checkpointed. Returns the checkpoint id (written after this step) or None."""
        if not self.stride or end <= 0 or end % self.stride:
            return None
        hashes = self.hashes(req)
        # A block ending in a placeholder token has no hash yet: reserve anyway, `commit` keys
        # the checkpoint once the value is known (or frees it when the key already has one).
        if len(hashes) >= end // self.block_size:
            if self.checkpoints.lookup(hashes[end // self.block_size - 1]) is not None:
                return None
        c = self.checkpoints.allocate()
        if c is not None:
            self._pending[req.request_id] = (end, c)
        return c

    def save_evicts_blindly(self, requests: Iterable[Request]) -> bool:
        """One of `requests`' next decode ends a stride at its placeholder token and reserving
        the checkpoint there would evict a cached one: `plan_save` cannot tell yet whether the
        key is already checkpointed (the synchronous engine evicts nothing then), so the caller
        should write the value first. O(1) unless every free checkpoint is keyed."""
        if not self.stride or not self.checkpoints.allocate_evicts:
            return False
        return any(
            req.num_placeholders > 0 and req.num_tokens % self.stride == 0 for req in requests
        )

    def cancel_save(self, request_id: str) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            self.checkpoints.release(pending[1])

    def pending_saves(self) -> dict[str, int]:
        """Request id -> checkpoint id to write from its slot after this step's forward."""
        return {rid: c for rid, (_, c) in self._pending.items()}

    def commit(self, req: Request, block_table: list[int]) -> None:
        """After a step: file `req`'s newly computed full blocks, then its checkpoint (only if
        the step ended exactly at the checkpoint's length)."""
        rid = req.request_id
        hashes = self.hashes(req)
        done = req.num_computed_tokens // self.block_size
        for j in range(self._num_filed.get(rid, 0), done):
            self.block_pool.cache_block(block_table[j], hashes[j])
            if self._in_flight.get(hashes[j]) == rid:
                del self._in_flight[hashes[j]]
        self._num_filed[rid] = max(done, self._num_filed.get(rid, 0))
        pending = self._pending.pop(rid, None)
        if pending is None:
            return
        end, c = pending
        if end == req.num_computed_tokens:
            key = hashes[end // self.block_size - 1]
            if self.block_pool.lookup(key) is not None:
                self.checkpoints.register(c, key)
        self.checkpoints.release(c)

    def release(self, request_id: str, keep_hashes: bool = False) -> None:
        """`request_id` gave its cache back: drop its pending save and in-flight blocks."""
        self.cancel_save(request_id)
        self._num_filed.pop(request_id, None)
        for h in self._in_flight_of.pop(request_id, ()):
            if self._in_flight.get(h) == request_id:
                del self._in_flight[h]
        if not keep_hashes:
            self._hashes.pop(request_id, None)
