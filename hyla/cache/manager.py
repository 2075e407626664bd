"""Per-request cache bookkeeping: one block table + one state slot per running request.

All attention-like layers (mla, gqa, dsa) share the request's block table: block j holds
tokens [j*B, (j+1)*B) of the sequence in every such layer's paged tensors. All linear layers
(kda, gdn) share the request's state slot: row `slot` of every layer's recurrent and conv state.

    tokens   0 ........ B-1 | B ....... 2B-1 | 2B .. n-1
    table    [   b7         ,    b2          ,   b9      ]      slot = s3

Allocation is all-or-nothing: `allocate` either grants what was asked or changes nothing.
"""

from __future__ import annotations

from hyla.cache.block_pool import BlockPool, SlotPool


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    return (num_tokens + block_size - 1) // block_size


class CacheManager:
    """Grants blocks and state slots to requests by id.

    Args:
        num_blocks: size of the block pool (block 0 reserved).
        num_slots: size of the state-slot pool (slot 0 reserved).
        block_size: tokens per block B.
    """

    def __init__(self, num_blocks: int, num_slots: int, block_size: int) -> None:
        self.block_size = block_size
        self.block_pool = BlockPool(num_blocks)
        self.slot_pool = SlotPool(num_slots)
        self.block_tables: dict[str, list[int]] = {}
        self.state_slots: dict[str, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def num_free_slots(self) -> int:
        return self.slot_pool.num_free_slots

    def num_blocks_needed(self, request_id: str, num_tokens: int) -> int:
        """New blocks `request_id` needs so its table covers `num_tokens` tokens."""
        have = len(self.block_tables.get(request_id, ()))
        return max(0, num_blocks_for(num_tokens, self.block_size) - have)

    def can_allocate(self, request_id: str, num_tokens: int) -> bool:
        if request_id not in self.state_slots and self.num_free_slots == 0:
            return False
        return self.num_blocks_needed(request_id, num_tokens) <= self.num_free_blocks

    def allocate(self, request_id: str, num_tokens: int) -> bool:
        """Grow `request_id`'s table to cover `num_tokens` tokens and give it a state slot if it
        has none. Returns False (and changes nothing) when the pools cannot cover it."""
        if not self.can_allocate(request_id, num_tokens):
            return False
        if request_id not in self.state_slots:
            self.state_slots[request_id] = self.slot_pool.allocate()
        need = self.num_blocks_needed(request_id, num_tokens)
        table = self.block_tables.setdefault(request_id, [])
        table.extend(self.block_pool.allocate(need))
        return True

    def free(self, request_id: str) -> None:
        """Release `request_id`'s blocks and state slot (no-op for an unknown id)."""
        table = self.block_tables.pop(request_id, None)
        if table:
            self.block_pool.free(table)
        slot = self.state_slots.pop(request_id, None)
        if slot is not None:
            self.slot_pool.free(slot)

    def block_table(self, request_id: str) -> list[int]:
        return self.block_tables[request_id]

    def state_slot(self, request_id: str) -> int:
        return self.state_slots[request_id]

    def has(self, request_id: str) -> bool:
        return request_id in self.state_slots
