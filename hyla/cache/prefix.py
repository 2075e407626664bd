"""Prefix cache for hybrid models: chained block hashes plus linear-state checkpoints. Linear
layers resume only from the state after EXACTLY L tokens, so states are saved at stride s (a
multiple of B; 0 without linear layers) keyed by the hash of the block ending there. Policies:
"all" every stride boundary; "deepest" the deepest per chunk plus those waiting requests ask
for; "repeat" chunk ends, interior ones only for a prefix seen before. Plus, per request, the
state before its prompt's last token and a tail at its last full block."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from hyla.cache.block_pool import BlockPool, CheckpointPool
from hyla.cache.mm_spans import block_extra_keys
from hyla.request import Request

ROOT_HASH = 0
CheckpointPolicy = Literal["all", "deepest", "repeat"]
CHECKPOINT_POLICIES = ("all", "deepest", "repeat")
SEEN_PREFIXES = 1 << 16  # prefix hashes the "repeat" policy remembers (LRU)


def hash_block(parent: int, token_ids: Sequence[int], extra_keys: tuple = ()) -> int:
    """128-bit blake2b of (parent hash, token ids, extra keys): a collision serves wrong text."""
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
    """Append to `hashes` the chained hashes of `token_ids`' full blocks it lacks, up to
    `num_tokens`; `extra_keys(j)`: block j's extra keys. Returns `hashes`."""
    parent = hashes[-1] if hashes else ROOT_HASH
    end = len(token_ids) if num_tokens is None else num_tokens
    for j in range(len(hashes), end // block_size):
        extra = extra_keys(j) if extra_keys is not None else ()
        parent = hash_block(parent, token_ids[j * block_size : (j + 1) * block_size], extra)
        hashes.append(parent)
    return hashes


def request_block_hashes(hashes: list[int], req: Request, block_size: int) -> list[int]:
    """`extend_block_hashes` over `req`'s known tokens, also keyed by its images (mm_spans)."""
    return extend_block_hashes(
        hashes, req.all_token_ids, block_size, block_extra_keys(req.mm_spans, block_size),
        req.num_known_tokens,
    )  # fmt: skip


@dataclass
class PrefixHit:
    """The reusable prefix: `num_tokens` tokens in `block_ids`, the state after them in
    `checkpoint_id`; `num_block_tokens` counts tokens whose blocks were found, checkpoint or not."""

    num_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    checkpoint_id: int | None = None
    num_block_tokens: int = 0


@dataclass(frozen=True)
class PlannedSave:
    """The state of `request_id` after `end` tokens, into `checkpoint`; a tail is its own."""

    request_id: str
    end: int
    checkpoint: int
    is_tail: bool = False


@dataclass
class PrefixStats:
    """`num_block_only_tokens`: blocks cached to a stride, no checkpoint there;
    `num_below_*_queries`: too short to hit (no full block / stride before the last token)."""

    num_queries: int = 0
    num_queried_tokens: int = 0
    num_hit_tokens: int = 0
    num_block_only_tokens: int = 0
    num_below_block_queries: int = 0
    num_below_stride_queries: int = 0
    num_checkpoint_saves: int = 0

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0


class PrefixCache:
    """Finds and files reusable prefixes of requests (by request id)."""

    def __init__(
        self,
        block_pool: BlockPool,
        block_size: int,
        checkpoint_stride: int,
        num_checkpoints: int,
        policy: CheckpointPolicy = "all",
    ) -> None:
        if checkpoint_stride % block_size:
            raise ValueError(f"checkpoint_stride: {checkpoint_stride} is not a multiple of B")
        if policy not in CHECKPOINT_POLICIES:
            raise ValueError(f"policy: {policy!r} not in {CHECKPOINT_POLICIES}")
        self.block_pool = block_pool
        block_pool.on_evict = self._on_block_evicted
        self.checkpoints = CheckpointPool(num_checkpoints)
        self.block_size = block_size
        self.stride = checkpoint_stride
        self.granule = checkpoint_stride or block_size
        self.policy = policy
        self.stats = PrefixStats()
        self._hashes: dict[str, list[int]] = {}
        self._num_filed: dict[str, int] = {}
        self._pending: dict[str, list[PlannedSave]] = {}
        self._step_saves: list[PlannedSave] = []
        self._tails: dict[str, PlannedSave] = {}
        self._wanted: dict[str, set[int]] = {}  # boundaries waiting requests ask a request for
        self._restoring: list[int] = []
        self._in_flight: dict[int, str] = {}  # hash of a block being computed -> request id
        self._in_flight_of: dict[str, list[int]] = {}
        self._seen: OrderedDict[int, None] = OrderedDict()  # "repeat": prefixes passed before

    def _on_block_evicted(self, block_hash: int) -> None:
        self.checkpoints.drop(block_hash)

    def hashes(self, req: Request) -> list[int]:
        """Chained hashes of `req`'s known full blocks (a placeholder's waits for its value)."""
        return request_block_hashes(
            self._hashes.setdefault(req.request_id, []), req, self.block_size
        )

    def seed_hashes(self, request_id: str, token_ids: Sequence[int], hashes: Sequence[int]) -> bool:
        """Take `hashes` (a text prompt's block hashes, by `extend_block_hashes` off the engine
        thread) as `request_id`'s; False if the first, middle or last block does not re-hash."""
        num_blocks, size = len(token_ids) // self.block_size, self.block_size
        if len(hashes) != num_blocks or not num_blocks or request_id in self._hashes:
            return False
        for j in {0, num_blocks // 2, num_blocks - 1}:
            parent = hashes[j - 1] if j else ROOT_HASH
            if hash_block(parent, token_ids[j * size : (j + 1) * size]) != hashes[j]:
                return False
        self._hashes[request_id] = list(hashes)
        return True

    def _num_matching_blocks(
        self, hashes: list[int], limit: int, in_flight: bool, start: int = 0
    ) -> int:
        j = start
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
        for j in range(m, 0, -1):  # stride checkpoints, and tails at any block boundary
            c = self.checkpoints.lookup(hashes[j - 1])
            if c is not None:
                return PrefixHit(j * self.block_size, block_ids[:j], c, num_block_tokens)
        return PrefixHit(0, [], None, num_block_tokens)

    def in_flight_boundary(self, req: Request, hit: PrefixHit) -> tuple[int, str] | None:
        """(L, owner): running `owner` is computing `req`'s prefix up to L > hit.num_tokens."""
        if self.stride and not self.checkpoints.num_checkpoints:
            return None  # no checkpoint can ever make a hit: nothing worth waiting for
        hashes = self.hashes(req)
        limit = min(len(hashes), (req.num_tokens - 1) // self.block_size)
        known = min(hit.num_block_tokens // self.block_size, limit)  # `match` just found them
        reach = self._num_matching_blocks(hashes, limit, True, known) * self.block_size
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
        reusable = req.num_tokens - 1  # the last token is always computed
        if reusable < self.block_size:
            s.num_below_block_queries += 1
        elif reusable < self.stride:
            s.num_below_stride_queries += 1
        if self.stride:
            reachable = hit.num_block_tokens // self.stride * self.stride
            s.num_block_only_tokens += max(0, reachable - hit.num_tokens)

    def begin(self, req: Request, hit: PrefixHit) -> None:
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
        for c in self._restoring:
            self.checkpoints.release(c)
        self._restoring.clear()

    def plan_saves(self, req: Request, start: int, end: int) -> None:
        """Reserve checkpoints for the states `req`'s chunk [start, end) passes that the policy
        keeps and nobody checkpointed yet, and for its tail (the last block boundary in it)."""
        if not self.stride or not self.checkpoints.num_checkpoints:
            return
        kept = self._kept_ends(req, start, end)
        for p in kept:
            if not self._has_checkpoint(req, p) and not self._reserve(req, p, is_tail=False):
                return
        # A tail is reserved without a lookup (its key may hold a placeholder; the synchronous
        # engine must plan the same): a redundant one is freed when its step commits.
        tail = end // self.block_size * self.block_size
        if self.policy == "repeat" and tail < end:
            return  # a tail inside the chunk: the next one at a chunk's end replaces it
        if tail > start and tail not in kept:
            self._reserve(req, tail, is_tail=True)

    def want_save(self, req: Request, end: int, chunk_end: int | None) -> None:
        """A waiting request resumes from `req`'s state after `end`: keep it even if unplanned."""
        self._wanted.setdefault(req.request_id, set()).add(end)
        if chunk_end is None or not req.num_computed_tokens < end <= chunk_end:
            return
        planned = any(p.end == end for p in self._pending.get(req.request_id, []))
        if not planned and not self._has_checkpoint(req, end):
            self._reserve(req, end, is_tail=False)

    def _kept_ends(self, req: Request, start: int, end: int) -> list[int]:
        s = self.stride
        ends = list(range(start // s * s + s, end + 1, s))
        if self.policy == "deepest" and ends:
            wanted = self._wanted.get(req.request_id, set())
            ends = [p for p in ends if p in wanted or p == ends[-1]]
        last = (req.num_prompt_tokens - 1) // self.block_size * self.block_size
        if start < last <= end and last not in ends:  # the same prompt again can hit here
            ends = sorted([*ends, last])
        if self.policy == "repeat":
            ends = [p for p in ends if p == end or self._seen_before(req, p)]
        return ends

    def _seen_before(self, req: Request, end: int) -> bool:
        hashes, j = self.hashes(req), end // self.block_size
        if len(hashes) < j:
            return False
        key = hashes[j - 1]
        if key in self._seen:
            self._seen.move_to_end(key)
            return True
        self._seen[key] = None
        if len(self._seen) > SEEN_PREFIXES:
            self._seen.popitem(last=False)
        return False

    def _has_checkpoint(self, req: Request, end: int) -> bool:
        """False also when the block ending there holds a placeholder (no hash yet): the save is
        reserved anyway and `commit` frees it if redundant."""
        hashes, j = self.hashes(req), end // self.block_size
        return len(hashes) >= j and self.checkpoints.lookup(hashes[j - 1]) is not None

    def _reserve(self, req: Request, end: int, is_tail: bool) -> bool:
        c = self.checkpoints.allocate()
        if c is None:
            return False
        save = PlannedSave(req.request_id, end, c, is_tail)
        self._pending.setdefault(req.request_id, []).append(save)
        self._step_saves.append(save)
        return True

    def save_evicts_blindly(self, requests: Iterable[Request]) -> bool:
        """A next decode ends a stride at its placeholder and reserving its checkpoint evicts one:
        `plan_saves` cannot tell yet whether the key is checkpointed (the synchronous engine evicts
        nothing then), so the caller should write the value first."""
        if not self.stride or not self.checkpoints.allocate_evicts:
            return False
        return any(
            req.num_placeholders > 0 and req.num_tokens % self.stride == 0 for req in requests
        )

    def take_saves(self) -> list[PlannedSave]:
        saves, self._step_saves = self._step_saves, []
        return saves

    def commit(self, req: Request, block_table: list[int]) -> None:
        """After a step: file `req`'s newly computed full blocks, then the saves it reached."""
        rid = req.request_id
        hashes = self.hashes(req)
        done = req.num_computed_tokens // self.block_size
        for j in range(self._num_filed.get(rid, 0), done):
            self.block_pool.cache_block(block_table[j], hashes[j])
            if self._in_flight.get(hashes[j]) == rid:
                del self._in_flight[hashes[j]]
        self._num_filed[rid] = max(done, self._num_filed.get(rid, 0))
        pending = self._pending.pop(rid, [])
        later = [p for p in pending if p.end > req.num_computed_tokens]
        if later:
            self._pending[rid] = later
        for save in pending:
            if save.end <= req.num_computed_tokens:
                self.stats.num_checkpoint_saves += 1
                self._file(req, save, hashes)

    def _file(self, req: Request, save: PlannedSave, hashes: list[int]) -> None:
        """Key a committed save; a request keeps one tail (a newer or deeper save frees the old)."""
        rid = req.request_id
        key = hashes[save.end // self.block_size - 1]
        kept = self.block_pool.lookup(key) is not None and self.checkpoints.register(
            save.checkpoint, key
        )
        old = self._tails.get(rid)
        if old is not None and save.end >= old.end:
            del self._tails[rid]
            self.checkpoints.unregister(old.checkpoint)
            self.checkpoints.release(old.checkpoint)
        if save.is_tail and kept:
            self._tails[rid] = save  # held (referenced) until superseded or the request ends
        else:
            self.checkpoints.release(save.checkpoint)

    def _release_tail(self, request_id: str) -> None:
        tail = self._tails.pop(request_id, None)
        if tail is not None:
            self.checkpoints.release(tail.checkpoint)

    def _evict_first_past_checkpoints(self, request_id: str) -> None:
        hashes = self._hashes.get(request_id, [])
        j = len(hashes)
        while j > 0 and self.checkpoints.lookup(hashes[j - 1]) is None:
            j -= 1
        stale = [self.block_pool.lookup(h) for h in hashes[j:]]
        self.block_pool.evict_first([b for b in stale if b is not None])

    def release(self, request_id: str, keep_hashes: bool = False) -> None:
        """`request_id` gave its cache back; its tail checkpoint stays cached for the next turn."""
        for save in self._pending.pop(request_id, []):
            self.checkpoints.release(save.checkpoint)
        self._release_tail(request_id)
        if self.stride:
            self._evict_first_past_checkpoints(request_id)
        self._wanted.pop(request_id, None)
        self._num_filed.pop(request_id, None)
        for h in self._in_flight_of.pop(request_id, ()):
            if self._in_flight.get(h) == request_id:
                del self._in_flight[h]
        if not keep_hashes:
            self._hashes.pop(request_id, None)
