"""The tiers' bookkeeping without a model: which (blocks, checkpoint) pair a lookup loads, the
disk tier's budget and checksums, and what a pinned document holds."""

from __future__ import annotations

import pytest

from hyla.cache.block_pool import BlockPool
from hyla.cache.documents import DocumentError, DocumentPins
from hyla.cache.prefix import PrefixCache, extend_block_hashes
from hyla.cache.tiers import DiskTier, HostTier, TieredPrefix, Transfers
from hyla.request import Request, SamplingParams

B = 4


def setup(num_blocks=64, stride=8, checkpoints=8):
    prefix = PrefixCache(BlockPool(num_blocks), B, stride, checkpoints)
    host = HostTier(1 << 20)
    tiered = TieredPrefix(prefix, [host], b"ns")
    done: list[Transfers] = []
    tiered.io = done.append
    return prefix, host, tiered, done


def request(ids):
    return Request("r", list(ids), SamplingParams(max_tokens=1))


def put_blocks(tiered, host, hashes, blocks, checkpoints):
    for j in blocks:
        host.put(tiered.block_key(hashes[j]), ("block", j), 1)
    for j in checkpoints:  # the state after (j + 1) * B tokens
        host.put(tiered.checkpoint_key(hashes[j]), ("state", j), 1)


@pytest.mark.parametrize(
    "blocks, checkpoints, want",
    [
        (range(12), [3, 7, 11], 12),  # everything: the deepest pair
        ([*range(6), *range(7, 12)], [3, 11], 4),  # a hole at block 6: the state at 12 is unusable
        (range(12), [5], 6),  # a tail checkpoint off the stride is a boundary too
        (range(12), [], 0),  # blocks without any state: a miss
        ([*range(1, 12)], [11], 0),  # the first block is missing: nothing
    ],
    ids=["all", "hole", "tail", "no-state", "no-head"],
)
def test_lookup_loads_only_a_matching_pair(blocks, checkpoints, want):
    prefix, host, tiered, done = setup()
    ids = list(range(100, 100 + 12 * B + 3))
    hashes = extend_block_hashes([], ids, B)
    put_blocks(tiered, host, hashes, blocks, checkpoints)
    req = request(ids)
    hit = prefix.match(req)
    assert tiered.load_deeper(req, hit) == (want > 0)
    hit = prefix.match(req)
    assert hit.num_tokens == want * B
    tiered.transfer()
    if want:
        (todo,) = done
        assert sorted(e[1] for _, e, _ in todo.load_blocks) == list(range(want))
        assert [e for _, e, _ in todo.load_checkpoints] == [("state", want - 1)]
        # the loaded rows are filed under the hashes their entries were stored under
        for b, (_, j), _ in todo.load_blocks:
            assert prefix.block_pool.lookup(hashes[j]) == b
        assert prefix.checkpoints.lookup(hashes[want - 1]) == todo.load_checkpoints[0][0]


def test_eviction_writes_blocks_and_their_checkpoint_down():
    prefix, host, tiered, done = setup(num_blocks=5, checkpoints=2)
    pool = prefix.block_pool
    ids = pool.allocate(2)
    hashes = extend_block_hashes([], list(range(2 * B)), B)
    for b, h in zip(ids, hashes, strict=True):
        pool.cache_block(b, h)
    c = prefix.checkpoints.allocate()
    prefix.checkpoints.register(c, hashes[1])
    prefix.checkpoints.release(c)
    pool.free(ids)
    pool.allocate(4)  # takes every block: both cached ones are evicted
    todo = tiered._todo
    assert sorted(todo.spill_blocks) == sorted(
        (b, tiered.block_key(h)) for b, h in zip(ids, hashes, strict=True)
    )
    assert todo.spill_checkpoints == [(c, tiered.checkpoint_key(hashes[1]))]
    assert prefix.checkpoints.lookup(hashes[1]) is None


def test_uncache_does_not_spill():
    prefix, _, tiered, _ = setup(num_blocks=4)
    pool = prefix.block_pool
    (b,) = pool.allocate(1)
    pool.cache_block(b, 7)
    pool.uncache([b])
    assert not tiered._todo.spill_blocks


def test_disk_tier_budget_and_checksum(tmp_path):
    disk = DiskTier(tmp_path, capacity_bytes=3 * (20 + 100))
    for k in range(4):
        disk.put(bytes([k]) * 4, bytes([k]) * 100, 100)
    assert disk.contains_many([bytes([k]) * 4 for k in range(4)]) == [False, True, True, True]
    assert bytes(disk.get(b"\x01" * 4)) == b"\x01" * 100
    path = disk._path(b"\x02" * 4)
    frame = bytearray(path.read_bytes())
    frame[30] ^= 1
    path.write_bytes(bytes(frame))
    assert disk.get(b"\x02" * 4) is None and disk.stats.num_corrupt == 1
    assert not path.exists()
    again = DiskTier(tmp_path, capacity_bytes=1 << 20)  # a restart finds what is there
    assert again.contains_many([b"\x01" * 4, b"\x03" * 4]) == [True, True]


def test_document_pins_hold_blocks_and_state():
    prefix, _, _, _ = setup(num_blocks=16)
    pool = prefix.block_pool
    ids = list(range(3 * B + 1))
    hashes = extend_block_hashes([], ids, B)
    blocks = pool.allocate(3)
    for b, h in zip(blocks, hashes, strict=True):
        pool.cache_block(b, h)
    c = prefix.checkpoints.allocate()
    prefix.checkpoints.register(c, hashes[1])  # the state after 8 tokens
    prefix.checkpoints.release(c)
    pool.free(blocks)
    docs = DocumentPins(prefix)
    with pytest.raises(DocumentError, match="limit is 1"):
        docs.pin("big", ids, max_pinned_blocks=1)
    doc = docs.pin("d", ids)
    assert doc.num_tokens == 2 * B and doc.block_ids == tuple(blocks[:2])
    assert all(pool.blocks[b].ref_count == 1 for b in blocks[:2])
    assert prefix.checkpoints.ref_counts[c] == 1
    with pytest.raises(DocumentError, match="name"):
        docs.pin("", ids)
    with pytest.raises(DocumentError, match="prompt"):
        docs.pin("other", [1, 2, 3])
    assert docs.unpin("d") and not docs.unpin("d")
    assert all(pool.blocks[b].ref_count == 0 for b in blocks) and not any(
        prefix.checkpoints.ref_counts
    )


def test_without_linear_layers_a_failed_block_shortens_the_hit():
    prefix, host, tiered, done = setup(stride=0, checkpoints=0)
    ids = list(range(100, 100 + 6 * B + 1))
    hashes = extend_block_hashes([], ids, B)
    put_blocks(tiered, host, hashes, range(6), [])
    unreadable = tiered.block_key(hashes[3])
    read = host.get
    host.get = lambda key: None if key == unreadable else read(key)  # listed, fails to read
    req = request(ids)
    assert tiered.load_deeper(req, prefix.match(req))
    assert prefix.match(req).num_tokens == 3 * B
