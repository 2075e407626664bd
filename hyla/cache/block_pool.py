"""Pools of cache blocks (attention/DSA layers) and state slots (linear layers), as plain ints.

Block 0 and state slot 0 are reserved: block tables are padded with block 0 and padding rows may
point at slot 0, so neither is ever handed to a request (tests poison them to catch stray reads).

Each block carries a reference count and room for a content hash: prefix caching will share
full blocks between requests (ref_count > 1) and keep freed hashed blocks findable until they
are evicted from the free queue (least recently freed first).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

NULL_BLOCK_ID = 0
NULL_SLOT_ID = 0


class CacheError(RuntimeError):
    """Bookkeeping was violated: a double free, or a free of something never allocated."""


@dataclass
class Block:
    """Metadata of one paged-cache block of `block_size` tokens."""

    block_id: int
    ref_count: int = 0
    block_hash: int | None = None


class BlockPool:
    """`num_blocks` blocks, ids 1..num_blocks-1 allocatable (block 0 is the null block).

    Raises:
        ValueError: num_blocks < 2.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks: need >= 2 (one is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(1, num_blocks))

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        """Take `count` free blocks (ref_count 1 each) or raise CacheError when too few."""
        if count > len(self._free):
            raise CacheError(f"allocate: {count} blocks wanted, {len(self._free)} free")
        ids = [self._free.popleft() for _ in range(count)]
        for i in ids:
            block = self.blocks[i]
            block.ref_count = 1
            block.block_hash = None
        return ids

    def share(self, block_ids: list[int]) -> None:
        """Add one reference to each (already allocated) block."""
        for i in block_ids:
            block = self.blocks[i]
            if block.ref_count <= 0:
                raise CacheError(f"share: block {i} is not allocated")
            block.ref_count += 1

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference per block; blocks reaching 0 go to the back of the free queue.

        Freed in reverse so that a request's tail blocks are reused before its head blocks
        (the head is the likelier prefix-cache hit).
        """
        for i in reversed(block_ids):
            block = self.blocks[i]
            if i == NULL_BLOCK_ID or block.ref_count <= 0:
                raise CacheError(f"free: block {i} is not allocated")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free.append(i)

    def free_block_ids(self) -> list[int]:
        return list(self._free)


class SlotPool:
    """`num_slots` state slots, ids 1..num_slots-1 allocatable (slot 0 is the padding slot)."""

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
