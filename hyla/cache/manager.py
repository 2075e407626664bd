"""Per-request cache bookkeeping, all-or-nothing: one block table (attention-like layers) and one
state slot (linear layers) per request. State rows: 0 pad | slots | num_slots + checkpoint id."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from hyla.cache.block_pool import BlockPool, SlotPool
from hyla.cache.documents import DocumentPins
from hyla.cache.prefix import CheckpointPolicy, PrefixCache, PrefixHit, request_block_hashes
from hyla.cache.tiers.index import TieredPrefix
from hyla.request import Request


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    return (num_tokens + block_size - 1) // block_size


@dataclass
class StateCopies:
    """One step's state-row work: `restores` (src, dst) before the forward, `saves` (src, dst)
    after it, `boundaries`: request id -> [(tokens computed at that point, checkpoint row)]."""

    restores: list[tuple[int, int]] = field(default_factory=list)
    saves: list[tuple[int, int]] = field(default_factory=list)
    boundaries: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


class CacheManager:
    """Grants blocks and state slots by request id; `checkpoint_stride`: 0 without linear layers."""

    def __init__(
        self,
        num_blocks: int,
        num_slots: int,
        block_size: int,
        enable_prefix_caching: bool = False,
        checkpoint_stride: int = 0,
        num_checkpoints: int = 0,
        checkpoint_policy: CheckpointPolicy = "all",
    ) -> None:
        self.block_size = block_size
        self.block_pool = BlockPool(num_blocks)
        self.slot_pool = SlotPool(num_slots)
        self.block_tables: dict[str, list[int]] = {}
        self.state_slots: dict[str, int] = {}
        self.prefix: PrefixCache | None = None
        if enable_prefix_caching:
            self.prefix = PrefixCache(
                self.block_pool, block_size, checkpoint_stride, num_checkpoints, checkpoint_policy
            )
        self._restores: list[tuple[int, int]] = []
        self.tiers: TieredPrefix | None = None
        self.documents = DocumentPins(self.prefix) if self.prefix is not None else None

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def num_free_slots(self) -> int:
        return self.slot_pool.num_free_slots

    def checkpoint_row(self, checkpoint_id: int) -> int:
        return self.slot_pool.num_slots + checkpoint_id

    def num_blocks_needed(self, request_id: str, num_tokens: int) -> int:
        have = len(self.block_tables.get(request_id, ()))
        return max(0, num_blocks_for(num_tokens, self.block_size) - have)

    def can_allocate(self, request_id: str, num_tokens: int, hit: PrefixHit | None = None) -> bool:
        if request_id not in self.state_slots and self.num_free_slots == 0:
            return False
        need = self.num_blocks_needed(request_id, num_tokens)
        if hit is not None and hit.block_ids:
            blocks = self.block_pool.blocks
            need -= len(hit.block_ids)  # unreferenced cached blocks leave the free queue
            need = max(0, need) + sum(1 for b in hit.block_ids if blocks[b].ref_count == 0)
        return need <= self.num_free_blocks

    def allocate(self, request_id: str, num_tokens: int, hit: PrefixHit | None = None) -> bool:
        """Cover `num_tokens` (a new request with `hit` starts with its blocks); False: no room."""
        table = self.block_tables.get(request_id)
        if table is not None and len(table) * self.block_size >= num_tokens:
            return True  # a running request's table already covers it (most decode steps)
        if not self.can_allocate(request_id, num_tokens, hit):
            return False
        if request_id not in self.state_slots:
            self.state_slots[request_id] = self.slot_pool.allocate()
        if hit is not None and hit.block_ids and request_id not in self.block_tables:
            self.block_pool.acquire_cached(hit.block_ids)
            self.block_tables[request_id] = list(hit.block_ids)
        need = self.num_blocks_needed(request_id, num_tokens)
        table = self.block_tables.setdefault(request_id, [])
        table.extend(self.block_pool.allocate(need))
        return True

    def free(self, request_id: str, keep_hashes: bool = False) -> None:
        """Release `request_id`'s blocks and slot; `keep_hashes` for a preempted request."""
        table = self.block_tables.pop(request_id, None)
        if table:
            self.block_pool.free(table)
        slot = self.state_slots.pop(request_id, None)
        if slot is not None:
            self.slot_pool.free(slot)
        if self.prefix is not None:
            self.prefix.release(request_id, keep_hashes)

    def trim(self, request_id: str, num_tokens: int) -> None:
        """Free `request_id`'s blocks past `num_tokens` (rejected drafts; never prefix-cached)."""
        table = self.block_tables[request_id]
        keep = num_blocks_for(num_tokens, self.block_size)
        if len(table) > keep:
            self.block_pool.free(table[keep:])
            del table[keep:]

    def uncache(self, req: Request, first_block: int = 0) -> None:
        """Make `req`'s blocks from `first_block` on (and their checkpoints) unfindable: a step
        produced non-finite values. Found by token hashes, as its cache may be released already."""
        if self.prefix is None:
            return
        hashes = request_block_hashes([], req, self.block_size)
        blocks = (self.block_pool.lookup(h) for h in hashes[first_block:])
        self.block_pool.uncache([b for b in blocks if b is not None])

    def block_table(self, request_id: str) -> list[int]:
        return self.block_tables[request_id]

    def state_slot(self, request_id: str) -> int:
        return self.state_slots[request_id]

    def has(self, request_id: str) -> bool:
        return request_id in self.state_slots

    def seed_hashes(self, request_id: str, token_ids: Sequence[int], hashes: Sequence[int]) -> bool:
        return self.prefix is not None and self.prefix.seed_hashes(request_id, token_ids, hashes)

    def match(self, req: Request) -> PrefixHit:
        """`req`'s reusable cached prefix; a deeper one in the tiers is loaded first."""
        if self.prefix is None:
            return PrefixHit()
        hit = self.prefix.match(req)
        if self.tiers is not None and self.tiers.load_deeper(req, hit):
            hit = self.prefix.match(req)
        return hit

    def in_flight_boundary(self, req: Request, hit: PrefixHit) -> tuple[int, str] | None:
        return self.prefix.in_flight_boundary(req, hit) if self.prefix is not None else None

    def start(self, req: Request, hit: PrefixHit) -> None:
        if self.prefix is None:
            return
        self.prefix.record(req, hit)
        self.prefix.begin(req, hit)
        if hit.checkpoint_id is not None:
            row = self.checkpoint_row(hit.checkpoint_id)
            self._restores.append((row, self.state_slots[req.request_id]))

    def plan_saves(self, req: Request, start: int, end: int) -> None:
        if self.prefix is not None:
            self.prefix.plan_saves(req, start, end)

    def want_save(self, req: Request, end: int, chunk_end: int | None) -> None:
        if self.prefix is not None:
            self.prefix.want_save(req, end, chunk_end)

    def save_evicts_blindly(self, requests: Iterable[Request]) -> bool:
        return self.prefix is not None and self.prefix.save_evicts_blindly(requests)

    def take_state_copies(self, chunk_ends: dict[str, int]) -> StateCopies:
        copies = StateCopies(restores=self._restores)
        self._restores = []
        if self.prefix is None:
            return copies
        for save in self.prefix.take_saves():
            rid, row = save.request_id, self.checkpoint_row(save.checkpoint)
            end = chunk_ends[rid]
            if save.end == end:
                copies.saves.append((self.state_slots[rid], row))
            else:  # save.end < end: inside the chunk
                copies.boundaries.setdefault(rid, []).append((save.end, row))
        for marks in copies.boundaries.values():
            marks.sort()
        return copies

    def commit(self, req: Request) -> None:
        if self.prefix is not None and req.request_id in self.block_tables:
            self.prefix.commit(req, self.block_tables[req.request_id])

    def end_step(self) -> None:
        if self.prefix is not None:
            self.prefix.end_step()
