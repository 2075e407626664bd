"""Prefix-cache bookkeeping: chained block hashes, the LRU block and checkpoint pools, and
consistent eviction of a block with the checkpoint keyed by it (no torch)."""

from __future__ import annotations

import pytest

from hyla.cache.block_pool import BlockPool, CacheError, CheckpointPool
from hyla.cache.manager import CacheManager
from hyla.cache.prefix import extend_block_hashes, hash_block
from hyla.request import Request, SamplingParams


def test_hash_chain_names_the_whole_prefix():
    a = extend_block_hashes([], list(range(10)), 4)
    assert len(a) == 2  # the partial third block is not hashed
    assert a == extend_block_hashes([], list(range(10)), 4)
    b = extend_block_hashes([], [0, 1, 2, 3, 4, 99, 6, 7, 8, 9, 10, 11], 4)
    assert b[0] == a[0] and b[1] != a[1]
    c = extend_block_hashes([], [9, 9, 9, 9, 4, 5, 6, 7], 4)
    assert c[1] != a[1]  # same tokens in block 1, different parent
    assert hash_block(0, [1, 2], extra_keys=("img0",)) != hash_block(0, [1, 2])
    grown = extend_block_hashes(list(a), list(range(13)), 4)
    assert grown[:2] == a and len(grown) == 3


def test_block_pool_keeps_freed_hashed_blocks_until_reused():
    pool = BlockPool(5)
    evicted = []
    pool.on_evict = evicted.append
    ids = pool.allocate(4)
    assert pool.cache_block(ids[0], 100) and pool.cache_block(ids[1], 101)
    assert not pool.cache_block(ids[2], 100)  # hash already held by another block
    pool.free(ids)
    assert pool.num_free_blocks == 4 and pool.lookup(100) == ids[0]
    first = pool.allocate(2)  # unhashed blocks go first
    assert set(first) == {ids[2], ids[3]} and not evicted
    pool.acquire_cached([ids[0]])  # a hit takes a cached block off the free queue
    assert pool.blocks[ids[0]].ref_count == 1 and pool.num_free_blocks == 1
    assert pool.allocate(1) == [ids[1]] and evicted == [101] and pool.lookup(101) is None
    with pytest.raises(CacheError):
        pool.acquire_cached([ids[1]])  # no longer cached


def test_checkpoint_pool_lru_never_evicts_referenced_checkpoints():
    pool = CheckpointPool(2)
    a, b = pool.allocate(), pool.allocate()
    assert pool.allocate() is None  # both pending
    assert pool.register(a, 7) and not pool.register(b, 7)
    pool.release(a)
    pool.release(b)  # unkeyed: handed out first
    assert pool.allocate() == b
    pool.acquire(a)  # restoring: not evictable
    assert pool.allocate() is None
    pool.release(a)
    assert pool.allocate() == a and pool.lookup(7) is None and pool.num_evictions == 1


def test_evicting_a_block_drops_the_checkpoint_keyed_by_it():
    cm = CacheManager(5, 3, 2, enable_prefix_caching=True, checkpoint_stride=2, num_checkpoints=4)
    req = Request("a", [1, 2, 3, 4, 5], SamplingParams())
    hit = cm.match(req)
    assert hit.num_tokens == 0 and cm.allocate("a", 4, hit)
    cm.start(req, hit)
    cm.plan_saves(req, 0, 4)
    req.num_computed_tokens = 4
    cm.commit(req)
    keys = cm.prefix.hashes(req)
    assert set(cm.prefix.checkpoints.cached) == {keys[0], keys[1]}
    cm.free("a")
    again = Request("b", [1, 2, 3, 4, 9], SamplingParams())
    assert cm.match(again).num_tokens == 4
    cm.allocate("x", 8)  # needs all 4 blocks: evicts a's, and their checkpoint with them
    assert not cm.block_pool.cached and not cm.prefix.checkpoints.cached
    assert cm.match(again).num_tokens == 0


def test_blocks_past_the_deepest_checkpoint_are_evicted_first():
    cm = CacheManager(9, 3, 2, enable_prefix_caching=True, checkpoint_stride=4, num_checkpoints=4)
    req = Request("a", list(range(1, 10)), SamplingParams())
    hit = cm.match(req)
    assert cm.allocate("a", 8, hit)
    cm.start(req, hit)
    cm.plan_saves(req, 0, 8)
    req.num_computed_tokens = 8
    cm.commit(req)
    table = list(cm.block_table("a"))
    keys = cm.prefix.hashes(req)
    assert set(cm.prefix.checkpoints.cached) == {keys[1], keys[3]}  # states after 4 and 8
    cm.prefix.checkpoints.drop(keys[3])  # (LRU-evicted) no state after 8 any more
    cm.free("a")
    free = cm.block_pool.free_block_ids()
    assert free[:2] == table[2:4]  # tokens 4..8 cannot start a hit: first to go
    assert set(free[2:]) >= set(table[:2]) and cm.match(req).num_tokens == 4
