"""The radix top-k kernels (`hyla.ops.dsa_indexer.topk`) on CPU tensors under TRITON_INTERPRET=1,
against `topk_columns_reference` (torch.topk, what `kernels.keys_to_topk` computed before):
equal results, tie-breaks and -1 rules included. Small shapes with a small BLOCK_L, so a row
spans several programs.

Skipped without triton (CI), with CUDA (tests/gpu/test_dsa_gpu.py runs the compiled kernels),
and when triton was imported before this module without the flag; run this file on its own:

    python3 -m pytest -q tests/ops/test_dsa_radix_topk.py -p no:cacheprovider
"""

from __future__ import annotations

import pytest
import torch

from hyla.ops.dsa_indexer.select import topk_columns_reference
from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.ops.dsa_keys import random_scores, sort_keys

pytestmark = interpreter.marks("test_dsa_gpu.py")


def check(scores: torch.Tensor, row_pos: list[int], topk: int) -> torch.Tensor:
    from hyla.ops.dsa_indexer import topk as radix

    pos = torch.tensor(row_pos, dtype=torch.int64)
    keys = sort_keys(scores, pos)
    got = radix.radix_topk_columns(keys, pos, topk)
    want = topk_columns_reference(keys, pos, topk)
    assert got.dtype == torch.int32 and got.shape == (len(row_pos), topk)
    assert torch.equal(got, want)
    return got


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    from hyla.ops.dsa_indexer import topk as radix

    monkeypatch.setattr(radix, "BLOCK_L", 512)


@pytest.mark.parametrize("kind", ["normal", "ties", "constant", "extremes"])
def test_matches_torch_topk(kind: str) -> None:
    gen = torch.Generator().manual_seed(1)
    num_cols = 2000  # not a multiple of BLOCK_L: the last program is partial
    scores = random_scores(4, num_cols, kind, gen)
    got = check(scores, [1999, 1500, 700, 1234], 128)
    assert (got >= 0).all()


def test_fewer_visible_than_topk_and_row_pos_zero() -> None:
    gen = torch.Generator().manual_seed(2)
    scores = random_scores(5, 1500, "ties", gen)
    got = check(scores, [0, 1, 63, 200, 1499], 200)
    assert (got[0, 1:] == -1).all() and got[0, 0] == 0
    assert (got[2, 64:] == -1).all() and (got[2, :64] >= 0).all()


@pytest.mark.parametrize("num_cols,topk", [(100, 256), (256, 256), (300, 256), (1000, 1)], ids=str)
def test_topk_near_or_above_row_length(num_cols: int, topk: int) -> None:
    gen = torch.Generator().manual_seed(3)
    scores = random_scores(3, num_cols, "ties", gen)
    check(scores, [num_cols - 1, num_cols // 2, 0], topk)


def test_one_long_row_and_a_topk_not_a_power_of_two() -> None:
    gen = torch.Generator().manual_seed(4)
    scores = random_scores(1, 4100, "normal", gen)
    check(scores, [4099], 100)


def test_wider_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    from hyla.ops.dsa_indexer import topk as radix

    monkeypatch.setattr(radix, "RADIX_BITS", 11)  # 6 passes, the last one overlapping
    gen = torch.Generator().manual_seed(5)
    check(random_scores(2, 1000, "ties", gen), [999, 300], 64)


def test_digit_shifts_cover_all_63_bits() -> None:
    from hyla.ops.dsa_indexer.topk import digit_shifts

    for bits in (4, 8, 9, 11, 16):
        shifts = digit_shifts(bits)
        assert shifts[0] == (63 - bits, 63) and shifts[-1][0] == 0
        assert all(prev - s <= bits for s, prev in shifts)


def test_bad_arguments() -> None:
    from hyla.ops.dsa_indexer.topk import radix_topk_columns

    keys, pos = torch.zeros(2, 10, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="int64"):
        radix_topk_columns(keys.int(), pos, 4)
    with pytest.raises(ValueError, match="row_pos"):
        radix_topk_columns(keys, pos[:1], 4)
    with pytest.raises(ValueError, match="topk"):
        radix_topk_columns(keys, pos, 0)


def test_keys_to_topk_and_indexer_use_radix_above_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hyla.ops.dsa_indexer import kernels, topk
    from tests.gpu.test_dsa_gpu import check_indexer

    calls = []
    radix = topk.radix_topk_columns
    monkeypatch.setattr(kernels, "RADIX_MIN_COLS", 40)
    monkeypatch.setattr(kernels, "radix_topk_columns", lambda *a: calls.append(1) or radix(*a))
    check_indexer([1, 5, 40, 70, 33], [1, 5, 6, 1, 2], 16, torch.float32, "cpu", ties=True)
    assert calls  # max(seq_lens) = 70 >= 40: the radix path ran


def test_captured_steps_use_radix(monkeypatch: pytest.MonkeyPatch) -> None:
    """`static_shapes` (a captured decode step) takes the radix select whatever the length,
    with the torch.topk result; an eager call of the same rows does not."""
    from hyla.ops.dsa_indexer import kernels, topk

    calls = []
    radix = topk.radix_topk_columns
    monkeypatch.setattr(kernels, "radix_topk_columns", lambda *a: calls.append(1) or radix(*a))
    scores = random_scores(3, 300, "ties", torch.Generator().manual_seed(7))
    pos = torch.tensor([299, 40, 7], dtype=torch.int64)
    keys = sort_keys(scores, pos)
    want = topk_columns_reference(keys, pos, 16)
    assert torch.equal(kernels.keys_to_topk(keys, pos, 16), want) and not calls
    assert torch.equal(kernels.keys_to_topk(keys, pos, 16, static_shapes=True), want)
    assert calls
