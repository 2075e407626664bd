"""Paged cache write/gather vs a per-token Python oracle of the block-table arithmetic."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.paged import (
    gather_paged,
    gather_paged_padded,
    gather_paged_tokens,
    token_slots,
    write_paged,
)


def _oracle_slot(table: list[int], j: int, block_size: int) -> int:
    return table[j // block_size] * block_size + j % block_size


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_write_then_gather_roundtrip(block_size: int) -> None:
    torch.manual_seed(0)
    num_blocks = 64 // block_size + 8
    cache = torch.full((num_blocks, block_size, 3, 2), float("nan"))
    tables = {0: list(range(num_blocks - 1, num_blocks - 1 - 20 // block_size - 1, -1))}
    tables[1] = [b for b in range(1, num_blocks) if b not in tables[0]][: 13 // block_size + 1]
    lengths = {0: 20, 1: 13}
    values = {i: torch.randn(n, 3, 2) for i, n in lengths.items()}
    # written in two steps (prefix, then the rest) as a prefill + continuation would
    for lo, hi in ((0, 7), (7, None)):
        for i, n in lengths.items():
            js = list(range(n))[lo:hi]
            slots = torch.tensor([_oracle_slot(tables[i], j, block_size) for j in js])
            write_paged(cache, slots, values[i][lo:hi])
    for i, n in lengths.items():
        table = torch.tensor(tables[i] + [0] * 3, dtype=torch.int32)
        got = gather_paged(cache, table, n)
        assert torch.equal(got, values[i])
        assert torch.equal(gather_paged(cache, table, 5), values[i][:5])
        pick = torch.tensor([n - 1, 0, n // 2])
        assert torch.equal(gather_paged_tokens(cache, table, pick), values[i][pick])
        want = [_oracle_slot(tables[i], j, block_size) for j in pick.tolist()]
        assert token_slots(table, pick, block_size).tolist() == want
    written = sum(lengths.values()) * 6
    assert int((~cache.isnan()).sum()) == written


def test_write_casts_to_cache_dtype() -> None:
    cache = torch.zeros(2, 4, 3, dtype=torch.bfloat16)
    write_paged(cache, torch.tensor([5]), torch.full((1, 3), 1.5))
    assert cache.dtype == torch.bfloat16 and cache[1, 1].tolist() == [1.5, 1.5, 1.5]


def test_fp8_cache_roundtrip() -> None:
    cache = torch.full((3, 4, 5), float("nan")).to(torch.float8_e4m3fn)
    values = torch.randn(2, 5)
    write_paged(cache, torch.tensor([5, 6]), values)
    table = torch.tensor([2, 1], dtype=torch.int32)
    want = values.to(torch.float8_e4m3fn)
    got = gather_paged(cache, table, 7)[5:]
    assert got.dtype == torch.float8_e4m3fn and torch.equal(got.float(), want.float())
    got = gather_paged_tokens(cache, table, torch.tensor([6]))
    assert torch.equal(got.float(), want[1:].float())


def test_errors() -> None:
    cache = torch.zeros(2, 4, 3)
    with pytest.raises(ValueError, match="do not fit"):
        write_paged(cache, torch.tensor([0, 1]), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="cannot hold"):
        gather_paged(cache, torch.tensor([1], dtype=torch.int32), 5)


def test_gather_padded_equals_gather_per_sequence() -> None:
    torch.manual_seed(1)
    cache = torch.randn(12, 4, 3)
    tables = torch.tensor([[5, 2, 9], [7, 0, 0], [1, 11, 3]], dtype=torch.int32)
    lens = [10, 3, 12]
    rows, valid = gather_paged_padded(cache, tables, lens)
    assert rows.shape == (3, 12, 3) and valid.tolist() == [[j < n for j in range(12)] for n in lens]
    for i, n in enumerate(lens):
        assert torch.equal(rows[i, :n], gather_paged(cache, tables[i], n))
    with pytest.raises(ValueError, match="blocks"):
        gather_paged_padded(cache, tables, [13, 1, 1])
