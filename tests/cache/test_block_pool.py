from __future__ import annotations

import pytest

from hyla.cache.block_pool import NULL_BLOCK_ID, NULL_SLOT_ID, BlockPool, CacheError, SlotPool


def test_block_pool_never_hands_out_the_null_block_and_recycles():
    pool = BlockPool(5)
    ids = pool.allocate(4)
    assert sorted(ids) == [1, 2, 3, 4] and NULL_BLOCK_ID not in ids
    assert pool.num_free_blocks == 0
    with pytest.raises(CacheError):
        pool.allocate(1)
    pool.free(ids[:2])
    assert pool.num_free_blocks == 2
    again = pool.allocate(2)
    assert set(again) == set(ids[:2])


def test_block_pool_all_or_nothing_and_ref_counts():
    pool = BlockPool(4)
    with pytest.raises(CacheError):
        pool.allocate(4)
    assert pool.num_free_blocks == 3
    (b,) = pool.allocate(1)
    pool.share([b])
    assert pool.blocks[b].ref_count == 2
    pool.free([b])
    assert pool.num_free_blocks == 2  # still referenced once
    pool.free([b])
    assert pool.num_free_blocks == 3
    with pytest.raises(CacheError):
        pool.free([b])  # double free
    with pytest.raises(CacheError):
        pool.free([NULL_BLOCK_ID])


def test_block_pool_metadata_has_room_for_a_hash():
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    pool.blocks[b].block_hash = 1234
    pool.free([b])
    assert pool.blocks[b].block_hash == 1234  # findable while free, until reused
    assert pool.allocate(1) == [b]
    assert pool.blocks[b].block_hash is None


def test_block_pool_frees_tail_first():
    pool = BlockPool(4)
    ids = pool.allocate(3)
    pool.free(ids)
    assert pool.free_block_ids() == list(reversed(ids))


def test_slot_pool():
    pool = SlotPool(3)
    a, b = pool.allocate(), pool.allocate()
    assert {a, b} == {1, 2} and NULL_SLOT_ID not in (a, b)
    with pytest.raises(CacheError):
        pool.allocate()
    pool.free(a)
    with pytest.raises(CacheError):
        pool.free(a)
    assert pool.allocate() == a


def test_pool_sizes_validated():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(1)
    with pytest.raises(ValueError, match="num_slots"):
        SlotPool(1)
