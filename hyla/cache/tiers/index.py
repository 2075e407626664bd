"""The tiers' bookkeeping: device evictions spill down; a device prefix miss walks the tiers for
the deepest pair (blocks h0..h_{J-1}, checkpoint C[h_{J-1}]), filed now and copied in by
`transfer` before the next forward. Keys: namespace | b"b" or b"c" | 16-byte block hash."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hyla.cache.block_pool import BlockPool
from hyla.cache.prefix import PrefixCache, PrefixHit
from hyla.cache.tiers.store import Tier
from hyla.request import Request

DEVICE = -1  # a checkpoint found on the device (tiers are numbered from 0)
MAX_MISSES = 4096  # requests whose last lookup found nothing remembered (oldest dropped)


@dataclass
class Transfers:
    """Copies for `transfer`: spills first (device block or checkpoint id, key), then loads (id,
    entry, whether it is a sealed-frame payload)."""

    spill_blocks: list[tuple[int, bytes]] = field(default_factory=list)
    spill_checkpoints: list[tuple[int, bytes]] = field(default_factory=list)
    load_blocks: list[tuple[int, Any, bool]] = field(default_factory=list)
    load_checkpoints: list[tuple[int, Any, bool]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (
            self.spill_blocks or self.spill_checkpoints or self.load_blocks
            or self.load_checkpoints
        )  # fmt: skip


@dataclass
class LoadStats:
    """Counters since start; a failed load found a deeper pair it could not read or place."""

    num_loads: int = 0
    num_loaded_tokens: int = 0
    num_loaded_blocks: int = 0
    num_failed_loads: int = 0
    num_spilled_blocks: int = 0
    num_spilled_checkpoints: int = 0


class TieredPrefix:
    """Spills and loads between `prefix`'s device pools and `tiers` (fastest first)."""

    def __init__(self, prefix: PrefixCache, tiers: Sequence[Tier], namespace: bytes) -> None:
        self.prefix = prefix
        self.block_pool: BlockPool = prefix.block_pool
        self.tiers = list(tiers)
        self.namespace = namespace
        self.stats = LoadStats()
        self.io: Callable[[Transfers], None] | None = None  # the device side (`transfer`)
        self.entry_nbytes: dict[bytes, int] = {}  # b"b"/b"c" -> payload size (when known)
        self._todo = Transfers()
        self._missed: dict[str, tuple[int, int]] = {}  # request id -> (start, prefix hash)
        self.block_pool.on_spill = self._spill_block
        prefix.checkpoints.on_spill = self._spill_checkpoint

    def block_key(self, block_hash: int) -> bytes:
        return self.namespace + b"b" + block_hash.to_bytes(16, "little")

    def checkpoint_key(self, block_hash: int) -> bytes:
        return self.namespace + b"c" + block_hash.to_bytes(16, "little")

    def _spill_block(self, block_id: int, block_hash: int) -> None:
        self._todo.spill_blocks.append((block_id, self.block_key(block_hash)))
        self.stats.num_spilled_blocks += 1
        c = self.prefix.checkpoints.lookup(block_hash)
        if c is not None:  # dropped with its block: it goes down with it
            self._spill_checkpoint(c, block_hash)

    def _spill_checkpoint(self, checkpoint_id: int, block_hash: int) -> None:
        self._todo.spill_checkpoints.append((checkpoint_id, self.checkpoint_key(block_hash)))
        self.stats.num_spilled_checkpoints += 1

    def publish(self, block_ids: Sequence[int], hashes: Sequence[int], checkpoints: Sequence[
            tuple[int, int]]) -> None:  # fmt: skip
        """Write these device blocks and checkpoints down now (a pinned document)."""
        for b, h in zip(block_ids, hashes, strict=True):
            self._todo.spill_blocks.append((b, self.block_key(h)))
        for c, h in checkpoints:
            self._todo.spill_checkpoints.append((c, self.checkpoint_key(h)))
        self.transfer()

    def transfer(self) -> None:
        """Run the copies queued since the last call (before the next forward reads or writes
        any device row: spills first, a row spilled may be reloaded with another entry)."""
        todo, self._todo = self._todo, Transfers()
        if not todo.is_empty and self.io is not None:
            self.io(todo)

    def _locate(self, keys: Sequence[bytes]) -> dict[bytes, int]:
        where: dict[bytes, int] = {}
        left = list(keys)
        for t, tier in enumerate(self.tiers):
            if not left:
                break
            found = tier.contains_many(left)
            where.update((k, t) for k, ok in zip(left, found, strict=True) if ok)
            left = [k for k, ok in zip(left, found, strict=True) if not ok]
        return where

    def _fetch(self, keys: Sequence[bytes], where: dict[bytes, int]) -> list[tuple | None]:
        """(entry, whether it is a frame payload) per key, None where it could not be read."""
        out: list[tuple | None] = [None] * len(keys)
        for t, tier in enumerate(self.tiers):
            idx = [i for i, k in enumerate(keys) if where.get(k) == t]
            if idx:
                for i, entry in zip(idx, tier.get_many([keys[i] for i in idx]), strict=True):
                    if entry is not None and tier.holds_bytes and not self._fits(keys[i], entry):
                        tier.stats.num_corrupt += 1
                        entry = None
                    out[i] = None if entry is None else (entry, tier.holds_bytes)
        return out

    def _fits(self, key: bytes, payload: Any) -> bool:
        size = self.entry_nbytes.get(key[len(self.namespace) : len(self.namespace) + 1])
        return size is None or len(payload) == size

    def _candidates(self, hashes: list[int], start: int, reach: int) -> list[tuple[int, int]]:
        """(J, where its checkpoint is: DEVICE or a tier) for start < J <= reach, deepest first."""
        if not self.prefix.stride:  # blocks alone: any boundary (a shallower one if one fails)
            return [(j, DEVICE) for j in range(reach, start, -1)]
        keys = [self.checkpoint_key(h) for h in hashes[start:reach]]
        on_device = [self.prefix.checkpoints.lookup(h) is not None for h in hashes[start:reach]]
        where = self._locate([k for k, d in zip(keys, on_device, strict=True) if not d])
        out = []
        for j in range(reach, start, -1):
            if on_device[j - 1 - start]:
                out.append((j, DEVICE))
            elif keys[j - 1 - start] in where:
                out.append((j, where[keys[j - 1 - start]]))
        return out

    def load_deeper(self, req: Request, hit: PrefixHit) -> bool:
        """Load `req`'s deepest pair beyond the device `hit` from the tiers; True: match again."""
        block_size = self.prefix.block_size
        hashes = self.prefix.hashes(req)
        limit = min(len(hashes), (req.num_tokens - 1) // block_size)
        start = hit.num_tokens // block_size
        if limit <= start or not self.tiers:
            return False
        if self._missed.get(req.request_id) == (start, hashes[limit - 1]):
            return False  # a waiting request is matched every step: the tiers are asked once
        on_device = [self.block_pool.lookup(h) is not None for h in hashes[:limit]]
        keys = [self.block_key(h) for h in hashes[:limit]]
        where = self._locate([keys[j] for j in range(start, limit) if not on_device[j]])
        reach = start
        while reach < limit and (on_device[reach] or keys[reach] in where):
            reach += 1
        candidates = self._candidates(hashes, start, reach)
        if not candidates:
            if len(self._missed) >= MAX_MISSES:
                del self._missed[next(iter(self._missed))]
            self._missed[req.request_id] = (start, hashes[limit - 1])
            return False
        missing = [j for j in range(candidates[0][0]) if not on_device[j]]
        entries = dict(zip(missing, self._fetch([keys[j] for j in missing], where), strict=True))
        intact = next((j for j in missing if entries[j] is None), candidates[0][0])
        for end, source in candidates:
            if end > intact:
                continue
            if self._load(hashes, end, source, [j for j in missing if j < end], entries):
                self.stats.num_loads += 1
                self.stats.num_loaded_tokens += (end - start) * block_size
                return True
        self.stats.num_failed_loads += 1
        return False

    def _load(
        self, hashes: list[int], end: int, source: int, missing: list[int], entries: dict
    ) -> bool:
        pool, ckpts = self.block_pool, self.prefix.checkpoints
        key = hashes[end - 1]
        ckpt_entry = None
        if self.prefix.stride and source != DEVICE:
            found = self._fetch([self.checkpoint_key(key)], {self.checkpoint_key(key): source})
            if found[0] is None:
                return False
            ckpt_entry = found[0][0]
        skip = set(missing)
        held = [pool.lookup(h) for j, h in enumerate(hashes[:end]) if j not in skip]
        pool.acquire_cached(held)  # kept from eviction while rows are found for the rest
        device_c = ckpts.lookup(key) if self.prefix.stride and source == DEVICE else None
        if device_c is not None:
            ckpts.acquire(device_c)
        c = ckpts.allocate() if ckpt_entry is not None else None
        ok = (ckpt_entry is None or c is not None) and len(missing) <= pool.num_free_blocks
        ids = pool.allocate(len(missing)) if ok else []
        for j, b in zip(missing, ids, strict=True):
            pool.cache_block(b, hashes[j])
            self._todo.load_blocks.append((b, *entries[j]))
        if c is not None:
            if ok:
                ckpts.register(c, key)
                holds = self.tiers[source].holds_bytes
                self._todo.load_checkpoints.append((c, ckpt_entry, holds))
            ckpts.release(c)
        if device_c is not None:
            ckpts.release(device_c)
        pool.free(held + ids)
        self.stats.num_loaded_blocks += len(ids)
        return ok
