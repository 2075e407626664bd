"""`select.segmented_topk_columns` (two torch.topk stages over equal segments of each row) against
`topk_columns_reference` (one torch.topk): identical columns, tie-breaks and -1 rules included,
on keys built as the indexer kernel writes them. Pure PyTorch: runs on the CPU as on a GPU."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.dsa_indexer import select as topk
from tests.ops.dsa_keys import random_scores, sort_keys


def check(scores: torch.Tensor, row_pos: list[int], k: int, max_segments: int = 64) -> None:
    pos = torch.tensor(row_pos, dtype=torch.int64)
    keys = sort_keys(scores, pos)
    got = topk.segmented_topk_columns(keys, pos, k, max_segments)
    want = topk.topk_columns_reference(keys, pos, k)
    assert got.dtype == torch.int32 and got.shape == (len(row_pos), k)
    assert torch.equal(got, want)


@pytest.mark.parametrize("kind", ["normal", "ties", "constant", "extremes"])
@pytest.mark.parametrize(("num_cols", "k"), [(4096, 64), (4096, 100), (3000, 64), (640, 1)])
def test_segmented_equals_one_topk(kind: str, num_cols: int, k: int) -> None:
    gen = torch.Generator().manual_seed(num_cols + k)
    scores = random_scores(4, num_cols, kind, gen)
    check(scores, [num_cols - 1, 0, k - 2, num_cols // 3], k)


def test_short_rows_and_k_over_length_fall_back() -> None:
    gen = torch.Generator().manual_seed(1)
    check(random_scores(2, 50, "ties", gen), [49, 10], 64)  # L < k: padding with -1
    check(random_scores(2, 128, "normal", gen), [127, 3], 100)  # one segment only
    assert topk.num_segments(128, 100) == 1


def test_num_segments() -> None:
    assert topk.num_segments(1 << 20, 2048) == 64
    assert topk.num_segments(1 << 20, 2048, max_segments=8) == 8
    assert topk.num_segments(3000, 64) == 8  # 3000 = 8 * 375; 16 does not divide it
    assert topk.num_segments(4096, 1024) == 4
    assert topk.num_segments(4095, 1) == 1  # odd: no even split


def test_keys_to_topk_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")  # kernels.py imports triton at module level
    from hyla.ops.dsa_indexer import kernels

    calls = []
    segmented = topk.segmented_topk_columns
    monkeypatch.setattr(kernels, "segmented_topk_columns",
                        lambda *a: calls.append(1) or segmented(*a))  # fmt: skip
    pos = torch.tensor([2047, 5], dtype=torch.int64)
    keys = sort_keys(random_scores(2, 2048, "normal", torch.Generator().manual_seed(2)), pos)
    want = topk.topk_columns_reference(keys, pos, 32)
    assert torch.equal(kernels.keys_to_topk(keys, pos, 32), want) and not calls  # off by default
    monkeypatch.setattr(kernels, "SEGMENTED_MIN_COLS", 1024)
    assert torch.equal(kernels.keys_to_topk(keys, pos, 32), want) and calls == [1]
