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

Which states are saved (the keep policy; LRU under the checkpoint budget either way):

    "all"      every stride boundary a chunk crosses (default: a shared prefix then hits at
               floor(S / s) * s whatever the chunking and arrival order)
    "deepest"  the deepest stride boundary of each chunk, plus the boundaries a waiting
               request asks a running one for (fewer checkpoints written, fewer hits)
    "repeat"   every boundary at a chunk's end, and one inside a chunk only for a prefix seen
               before (a bounded set of recently passed prefix hashes): a first-seen prompt
               writes no interior state, so its prefill stays one plain pass (a whole-step CUDA
               graph on the GPU); the second request with the prefix checkpoints it, the third
               hits

plus, for every request, the state where the last full block before its prompt's last token
ends (the same prompt again reuses all of it but that token), and a tail: the state where its
last full block ends (B, not s, granularity; one per request, each newer one replacing the
last), so the next turn of a chat (previous prompt + reply + new message) reuses all of it but
at most one block. A tail is keyed when its step commits, as every save, so what is findable
never depends on when a request's end is noticed (the synchronous and asynchronous engines hit
alike).

A save ending a step's chunk is copied from the request's slot after the forward
(`state_saves`); one inside the chunk is written by the linear layers during it
(`state_boundaries`, the chunked ops' interior states); the scheduler never cuts a chunk for a
checkpoint. A save is filed here only once the step's tokens are committed. Evicting a block
drops the checkpoint keyed by its hash, so a checkpoint never outlives the blocks it belongs to;
evicting a checkpoint alone keeps the blocks, which still serve shorter hits; blocks past the
deepest checkpoint of a released request's chain (no state to resume from there) are evicted
first. Plain Python, no torch.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from hyla.cache.block_pool import BlockPool, CheckpointPool
from hyla.multimodal.spans import block_extra_keys
from hyla.request import Request

ROOT_HASH = 0
CheckpointPolicy = Literal["all", "deepest", "repeat"]
CHECKPOINT_POLICIES = ("all", "deepest", "repeat")
SEEN_PREFIXES = 1 << 16  # prefix hashes the "repeat" policy remembers (LRU)


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


def request_block_hashes(hashes: list[int], req: Request, block_size: int) -> list[int]:
    """`extend_block_hashes` over `req`'s known tokens, each block keyed also by the images
    whose placeholders it covers (`req.mm_spans`)."""
    return extend_block_hashes(
        hashes, req.all_token_ids, block_size, block_extra_keys(req.mm_spans, block_size),
        req.num_known_tokens,
    )  # fmt: skip


@dataclass
class PrefixHit:
    """The reusable prefix of a request: `num_tokens` tokens in `block_ids`, with the state
    after them in `checkpoint_id` (None for a miss or a model without linear layers).
    `num_block_tokens` counts the tokens whose blocks were found, checkpoint or not."""

    num_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    checkpoint_id: int | None = None
    num_block_tokens: int = 0


@dataclass(frozen=True)
class PlannedSave:
    """Write the state of `request_id` after `end` tokens into `checkpoint`; a tail is the
    request's own (filed when it ends), the others are filed when the step commits."""

    request_id: str
    end: int
    checkpoint: int
    is_tail: bool = False


@dataclass
class PrefixStats:
    """Counters since start. `num_block_only_tokens`: prompt tokens whose attention blocks were
    cached up to a checkpoint boundary but lacked the state checkpoint there (a miss that
    would be silent in an engine that restored the blocks anyway). Queries that cannot hit by
    their length: `num_below_block_queries` (no full block before the last token: nothing to
    reuse, ever) and `num_below_stride_queries` (no stride boundary before it: only a finished
    request's tail checkpoint can serve them). `num_checkpoint_saves`: states written."""

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
    """Finds and files reusable prefixes of requests (by request id).

    Args:
        block_pool: the block pool; its `cached` map is the block index.
        block_size: B.
        checkpoint_stride: s, a multiple of B; 0 when the model has no linear layers.
        num_checkpoints: size of the checkpoint pool.
        policy: which stride boundaries are saved ("all" or "deepest", module docstring).
    """

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
        self._pending: dict[str, list[PlannedSave]] = {}  # planned, not yet committed
        self._step_saves: list[PlannedSave] = []  # planned since the last `take_saves`
        self._tails: dict[str, PlannedSave] = {}  # committed tail of each request
        self._wanted: dict[str, set[int]] = {}  # boundaries waiting requests ask a request for
        self._restoring: list[int] = []
        self._in_flight: dict[int, str] = {}  # hash of a block being computed -> request id
        self._in_flight_of: dict[str, list[int]] = {}
        self._seen: OrderedDict[int, None] = OrderedDict()  # "repeat": prefixes passed before

    def _on_block_evicted(self, block_hash: int) -> None:
        self.checkpoints.drop(block_hash)

    def hashes(self, req: Request) -> list[int]:
        """Chained hashes of the full blocks of `req`'s known tokens (cached per request; a
        block holding a placeholder token is hashed once its value is written)."""
        return request_block_hashes(
            self._hashes.setdefault(req.request_id, []), req, self.block_size
        )

    def seed_hashes(self, request_id: str, token_ids: Sequence[int], hashes: Sequence[int]) -> bool:
        """Take `hashes`, the chained hashes of the full blocks of a text prompt `token_ids`
        computed off the engine thread (`extend_block_hashes`, e.g. by the server's tokenizer
        pool), as `request_id`'s, so that admitting it hashes nothing. Spot-checked: the first,
        middle and last block are hashed again from their parents; a mismatch or a wrong count
        leaves them out (the request hashes its blocks itself). Returns whether they were taken.
        """
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
        """Leading blocks (from `start`, all before it known to match) cached, or with
        `in_flight` also being computed by a running request."""
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
        """(L, owner): a running request `owner` is computing `req`'s prefix up to a boundary
        L > hit.num_tokens right now, so `req` may wait for it instead of computing it twice."""
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

    def plan_saves(self, req: Request, start: int, end: int) -> None:
        """Reserve checkpoints for the states `req`'s chunk [start, end) passes that the policy
        keeps and nobody checkpointed yet, and for its tail (the last block boundary in it)."""
        if not self.stride or not self.checkpoints.num_checkpoints:
            return
        kept = self._kept_ends(req, start, end)
        for p in kept:
            if not self._has_checkpoint(req, p) and not self._reserve(req, p, is_tail=False):
                return
        # A tail is reserved without looking for a checkpoint there (its key may hold a
        # placeholder token now; the synchronous engine must plan the same): a redundant one is
        # found out and freed when its step commits.
        tail = end // self.block_size * self.block_size
        if self.policy == "repeat" and tail < end:
            return  # a tail inside the chunk: the next one at a chunk's end replaces it
        if tail > start and tail not in kept:
            self._reserve(req, tail, is_tail=True)

    def want_save(self, req: Request, end: int, chunk_end: int | None) -> None:
        """A waiting request will resume from `req`'s state after `end` tokens: keep it, also
        when this step's chunk of `req` (ending at `chunk_end`, None if not scheduled) passes
        it and the policy did not plan it."""
        self._wanted.setdefault(req.request_id, set()).add(end)
        if chunk_end is None or not req.num_computed_tokens < end <= chunk_end:
            return
        planned = any(p.end == end for p in self._pending.get(req.request_id, []))
        if not planned and not self._has_checkpoint(req, end):
            self._reserve(req, end, is_tail=False)

    def _kept_ends(self, req: Request, start: int, end: int) -> list[int]:
        """The lengths in (start, end] the policy checkpoints: stride multiples, and the last
        block boundary before the prompt's last token."""
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
        """Whether a prefix of `req` of `end` tokens was passed before (and remember it)."""
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
        """A checkpoint is filed for `req`'s first `end` tokens. False when a block ending there
        holds a placeholder token (no hash yet): the save is reserved anyway, and `commit`
        frees it when the key turns out to be checkpointed already."""
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
        """One of `requests`' next decode ends a stride at its placeholder token and reserving
        the checkpoint there would evict a cached one: `plan_saves` cannot tell yet whether the
        key is already checkpointed (the synchronous engine evicts nothing then), so the caller
        should write the value first. O(1) unless every free checkpoint is keyed."""
        if not self.stride or not self.checkpoints.allocate_evicts:
            return False
        return any(
            req.num_placeholders > 0 and req.num_tokens % self.stride == 0 for req in requests
        )

    def take_saves(self) -> list[PlannedSave]:
        """The saves planned since the last call (this step's), in planning order."""
        saves, self._step_saves = self._step_saves, []
        return saves

    def commit(self, req: Request, block_table: list[int]) -> None:
        """After a step: file `req`'s newly computed full blocks, then its saves the step
        reached (checkpoints keyed by the block ending there; a tail replaces the previous)."""
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
        """Key a committed save under the block ending at its end (when that block is cached and
        the key has no checkpoint yet). A request keeps one tail: a newer tail, or a checkpoint
        at least as deep, unkeys and frees the previous one."""
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
        """`request_id` ended: its tail stays cached (keyed, LRU) for the next turn."""
        tail = self._tails.pop(request_id, None)
        if tail is not None:
            self.checkpoints.release(tail.checkpoint)

    def _evict_first_past_checkpoints(self, request_id: str) -> None:
        """Blocks of `request_id`'s chain past its deepest checkpoint cannot start a hit (no
        state there): their free-queue entries go first in line for eviction."""
        hashes = self._hashes.get(request_id, [])
        j = len(hashes)
        while j > 0 and self.checkpoints.lookup(hashes[j - 1]) is None:
            j -= 1
        stale = [self.block_pool.lookup(h) for h in hashes[j:]]
        self.block_pool.evict_first([b for b in stale if b is not None])

    def release(self, request_id: str, keep_hashes: bool = False) -> None:
        """`request_id` gave its cache back (its blocks are freed): drop its pending saves and
        in-flight blocks, let its tail checkpoint go to the LRU."""
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
