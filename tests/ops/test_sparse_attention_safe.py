"""The sparse attention op masks what it must not read (`sparse_mla(..., seq_lens=...)`):
duplicate entries count once, entries in a row's future, past the sequence or below -1 are
dropped, and a row left with nothing gets zeros.

Oracle: expanded dense MLA over the valid set only, an explicit [Tq, L] mask built from the
indices by plain Python (`tests.ops.test_dsa._dense_masked`). Caches are NaN-poisoned past each
sequence, so an out-of-range read shows up.
"""

from __future__ import annotations

import pytest
import torch

from hyla.ops.sparse_attention import sparse_mla, valid_topk_indices
from tests.ops.test_dsa import DN, DR, DV, H, R, _cu, _dense_masked, _latents, _store


def _oracle_mask(row_topk: list[int], position: int, length: int) -> torch.Tensor:
    allowed = torch.zeros(length, dtype=torch.bool)
    for s in row_topk:
        if 0 <= s <= position:
            allowed[s] = True
    return allowed


def _check(seq_lens: list[int], query_lens: list[int], topk: torch.Tensor, seed: int = 0):
    torch.manual_seed(seed)
    latents = _latents(seq_lens)
    cache, bt = _store(seq_lens, latents, seed)
    cu = _cu(query_lens)
    num_rows = sum(query_lens)
    q_nope, q_rope = torch.randn(num_rows, H, DN), torch.randn(num_rows, H, DR)
    kv_b = torch.randn(H * (DN + DV), R) / R**0.5
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    out = sparse_mla(q_nope, q_rope, cache, bt, cu, topk, kv_b, 0.3, seq_lens=lens)
    start = 0
    for i, (n, q) in enumerate(zip(seq_lens, query_lens, strict=True)):
        for j in range(q):
            t, pos = start + j, n - q + j
            allowed = _oracle_mask(topk[t].tolist(), pos, n)
            if not allowed.any():
                assert torch.equal(out[t], torch.zeros_like(out[t])), t
                continue
            want = _dense_masked(
                q_nope[t : t + 1], q_rope[t : t + 1], latents[i], kv_b, allowed[None], 0.3
            )
            torch.testing.assert_close(out[t : t + 1], want, rtol=1e-5, atol=1e-5)
        start += q
    return out


def test_all_selected_is_dense_causal():
    seq_lens, query_lens = [9, 5], [9, 2]
    topk = torch.arange(12).repeat(11, 1)  # every position, future and past the end included
    _check(seq_lens, query_lens, topk)


def test_none_selected_gives_zeros():
    _check([6], [3], torch.full((3, 5), -1))


def test_duplicates_count_once():
    topk = torch.tensor([[3, 3, 3, 1], [3, 1, 1, 3], [0, 0, 0, 0]])
    _check([8], [3], topk)  # rows at positions 5, 6, 7


def test_future_and_out_of_range_entries_are_dropped():
    topk = torch.tensor([[4, 7, 1, 10**6], [-5, 2, 8, 9], [6, 1, -1, 100]])
    _check([8, 7], [2, 1], topk)  # rows at 6, 7 of seq 0 and 6 of seq 1


@pytest.mark.parametrize("length", [1, 2, 3])
def test_very_short_sequences(length: int):
    topk = torch.tensor([[0, 1, 2, 0, -1]]).repeat(length, 1)
    _check([length], [length], topk)


@pytest.mark.parametrize("seed", range(4))
def test_random_selections_with_every_defect(seed: int):
    gen = torch.Generator().manual_seed(seed)
    seq_lens, query_lens = [13, 1, 30, 4], [13, 1, 2, 4]
    topk = torch.randint(-3, 35, (sum(query_lens), 10), generator=gen)
    _check(seq_lens, query_lens, topk, seed)


def test_valid_topk_indices_keeps_the_set():
    cu, lens = _cu([3]), torch.tensor([5])  # rows at positions 2, 3, 4
    topk = torch.tensor([[2, 2, 9, -4], [0, 3, 3, 4], [4, 4, 4, 4]])
    got = valid_topk_indices(topk, cu, lens)
    assert [sorted(s for s in row if s >= 0) for row in got.tolist()] == [[2], [0, 3], [4]]
