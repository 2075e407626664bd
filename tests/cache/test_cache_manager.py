from __future__ import annotations

from hyla.cache.manager import CacheManager, num_blocks_for


def test_num_blocks_for():
    assert [num_blocks_for(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_table_grows_with_tokens_and_slot_is_granted_once():
    cm = CacheManager(num_blocks=9, num_slots=3, block_size=4)
    assert cm.allocate("a", 5)
    assert len(cm.block_table("a")) == 2
    slot = cm.state_slot("a")
    assert cm.allocate("a", 8)  # still 2 blocks
    assert len(cm.block_table("a")) == 2 and cm.state_slot("a") == slot
    assert cm.allocate("a", 9)
    assert len(cm.block_table("a")) == 3
    assert cm.num_free_blocks == 5 and cm.num_free_slots == 1


def test_allocation_is_all_or_nothing():
    cm = CacheManager(num_blocks=4, num_slots=2, block_size=2)
    assert cm.allocate("a", 4)
    assert not cm.allocate("b", 1)  # no slot left
    assert not cm.has("b") and cm.num_free_blocks == 1
    assert not cm.allocate("a", 7)  # needs 2 more blocks, 1 free
    assert len(cm.block_table("a")) == 2 and cm.num_free_blocks == 1


def test_free_returns_everything_and_unknown_is_noop():
    cm = CacheManager(num_blocks=6, num_slots=3, block_size=2)
    cm.allocate("a", 3)
    cm.allocate("b", 4)
    cm.free("a")
    cm.free("a")
    cm.free("zzz")
    cm.free("b")
    assert cm.num_free_blocks == 5 and cm.num_free_slots == 2


def test_trim_frees_the_blocks_past_the_tokens():  # rejected drafts' entries (hyla.spec)
    cm = CacheManager(num_blocks=9, num_slots=3, block_size=4)
    assert cm.allocate("a", 13)  # 4 blocks
    head = cm.block_table("a")[:2]
    cm.trim("a", 6)
    assert cm.block_table("a") == head and cm.num_free_blocks == 6
    cm.trim("a", 8)  # already covered: nothing to free
    assert cm.block_table("a") == head and cm.num_free_blocks == 6
    assert cm.allocate("a", 9) and len(cm.block_table("a")) == 3
