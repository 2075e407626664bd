"""Pools of cache blocks, state slots and state checkpoints, as plain ints. Block 0 and slot 0
are padding, never handed out; freed hashed blocks stay findable until `allocate` evicts them."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

NULL_BLOCK_ID = 0
NULL_SLOT_ID = 0


class CacheError(RuntimeError):
    """Bookkeeping was violated: a double free, or a free of something never allocated."""


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks: need >= 2 (one is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self.cached: dict[int, int] = {}
        self.on_evict: Callable[[int], None] | None = None
        self.on_spill: Callable[[int, int], None] | None = None  # (block id, hash): tiers
        self.num_evictions = 0

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.cached)

    def allocate(self, count: int) -> list[int]:
        """Take `count` free blocks (ref_count 1 each, hashes evicted) or raise CacheError."""
        if count > len(self._free):
            raise CacheError(f"allocate: {count} blocks wanted, {len(self._free)} free")
        ids = [self._free.popitem(last=False)[0] for _ in range(count)]
        for i in ids:
            block = self.blocks[i]
            self._evict(block, spill=True)
            block.ref_count = 1
        return ids

    def _evict(self, block: Block, spill: bool = False) -> None:
        h = block.block_hash
        if h is None:
            return
        block.block_hash = None
        if self.cached.get(h) == block.block_id:
            del self.cached[h]
            self.num_evictions += 1
            if spill and self.on_spill is not None:  # reused, not distrusted: written down
                self.on_spill(block.block_id, h)
            if self.on_evict is not None:
                self.on_evict(h)

    def share(self, block_ids: list[int]) -> None:
        for i in block_ids:
            block = self.blocks[i]
            if block.ref_count <= 0:
                raise CacheError(f"share: block {i} is not allocated")
            block.ref_count += 1

    def acquire_cached(self, block_ids: list[int]) -> None:
        """Add one reference to each cached block, taking unreferenced ones off the free queue."""
        for i in block_ids:
            block = self.blocks[i]
            if block.block_hash is None or self.cached.get(block.block_hash) != i:
                raise CacheError(f"acquire_cached: block {i} is not cached")
            if block.ref_count == 0:
                del self._free[i]
            block.ref_count += 1

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference per block, in reverse: a request's tail is reused before its head."""
        unhashed: list[int] = []
        for i in reversed(block_ids):
            block = self.blocks[i]
            if i == NULL_BLOCK_ID or block.ref_count <= 0:
                raise CacheError(f"free: block {i} is not allocated")
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.block_hash is None:
                    unhashed.append(i)
                else:
                    self._free[i] = None
        for i in reversed(unhashed):  # nothing worth keeping: handed out before cached blocks
            self._free[i] = None
            self._free.move_to_end(i, last=False)

    def evict_first(self, block_ids: list[int]) -> None:
        """Put the free ones of `block_ids` (cached, unreferenced) first in line for eviction."""
        for i in reversed(block_ids):
            if self.blocks[i].ref_count == 0 and i in self._free:
                self._free.move_to_end(i, last=False)

    def cache_block(self, block_id: int, block_hash: int) -> bool:
        """File a written block under `block_hash`; False (no change) if the hash is taken."""
        block = self.blocks[block_id]
        if block.ref_count <= 0:
            raise CacheError(f"cache_block: block {block_id} is not allocated")
        if block_hash in self.cached:
            return False
        block.block_hash = block_hash
        self.cached[block_hash] = block_id
        return True

    def uncache(self, block_ids: list[int]) -> None:
        for i in block_ids:
            self._evict(self.blocks[i])

    def lookup(self, block_hash: int) -> int | None:
        return self.cached.get(block_hash)

    def free_block_ids(self) -> list[int]:
        return list(self._free)


class SlotPool:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 2:
            raise ValueError(f"num_slots: need >= 2 (one is reserved), got {num_slots}")
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(1, num_slots))
        self._used: set[int] = set()

    @property
    def num_usable_slots(self) -> int:
        return self.num_slots - 1

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise CacheError("allocate: no free state slot")
        slot = self._free.popleft()
        self._used.add(slot)
        return slot

    def free(self, slot: int) -> None:
        if slot not in self._used:
            raise CacheError(f"free: state slot {slot} is not allocated")
        self._used.remove(slot)
        self._free.append(slot)

    def free_slot_ids(self) -> list[int]:
        return list(self._free)


class CheckpointPool:
    """`num_checkpoints` state checkpoints (ids 0..n-1): free, pending (referenced, unkeyed),
    cached (keyed) or restoring (keyed, referenced); unreferenced ones are LRU, unkeyed first."""

    def __init__(self, num_checkpoints: int) -> None:
        self.num_checkpoints = num_checkpoints
        self.ref_counts = [0] * num_checkpoints
        self.keys: list[int | None] = [None] * num_checkpoints
        self.cached: dict[int, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_checkpoints))
        self.on_spill: Callable[[int, int], None] | None = None  # (checkpoint id, key): tiers
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    def lookup(self, key: int) -> int | None:
        return self.cached.get(key)

    @property
    def allocate_evicts(self) -> bool:
        """`allocate` would evict a cached checkpoint (every unreferenced one is keyed)."""
        c = next(iter(self._free), None)
        return c is not None and self.keys[c] is not None

    def allocate(self) -> int | None:
        """A referenced, unkeyed checkpoint (evicting the least recently used), or None."""
        if not self._free:
            return None
        c = self._free.popitem(last=False)[0]
        if self.keys[c] is not None:
            if self.on_spill is not None:
                self.on_spill(c, self.keys[c])
            del self.cached[self.keys[c]]
            self.keys[c] = None
            self.num_evictions += 1
        self.ref_counts[c] = 1
        return c

    def acquire(self, c: int) -> None:
        if self.ref_counts[c] == 0:
            del self._free[c]
        self.ref_counts[c] += 1

    def release(self, c: int) -> None:
        self.ref_counts[c] -= 1
        if self.ref_counts[c] == 0:
            self._free[c] = None
            if self.keys[c] is None:
                self._free.move_to_end(c, last=False)

    def register(self, c: int, key: int) -> bool:
        if key in self.cached:
            return False
        self.keys[c] = key
        self.cached[key] = c
        return True

    def unregister(self, c: int) -> None:
        key = self.keys[c]
        if key is None:
            return
        del self.cached[key]
        self.keys[c] = None

    def drop(self, key: int) -> None:
        """Forget the checkpoint keyed `key` (its block was evicted)."""
        c = self.cached.pop(key, None)
        if c is None:
            return
        self.keys[c] = None
        self.num_evictions += 1
        if self.ref_counts[c] == 0:
            self._free.move_to_end(c, last=False)
