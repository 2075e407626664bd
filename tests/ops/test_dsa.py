"""DSA ops: lightning-indexer scores and deterministic causal top-k over the paged index-key
cache, and sparse MLA that reads only the selected latents. Oracles: per-head Python loops, a
sort keyed by (-score, index), and dense softmax attention under an explicit mask."""

from __future__ import annotations

import random

import pytest
import torch

from hyla.ops.dsa_indexer import indexer_scores, lightning_indexer_topk, select_topk
from hyla.ops.mla import mla_expanded
from hyla.ops.sparse_attention import sparse_mla

BLOCK = 4
HI, DI = 4, 8
H, DN, DR, DV, R = 2, 8, 4, 6, 12
TOPK = 8


def _store(seq_lens: list[int], rows: list[torch.Tensor], seed: int = 0):
    """Write per-sequence rows [n, W] into a NaN-poisoned paged cache under shuffled blocks."""
    rng = random.Random(seed)
    per_seq = [(n + BLOCK - 1) // BLOCK for n in seq_lens]
    blocks = list(range(1, sum(per_seq) + 1))
    rng.shuffle(blocks)
    cache = torch.full((len(blocks) + 1, BLOCK, rows[0].shape[-1]), float("nan"))
    tables, start = [], 0
    for n, nb, x in zip(seq_lens, per_seq, rows, strict=True):
        table = blocks[start : start + nb]
        start += nb
        for j in range(n):
            cache[table[j // BLOCK], j % BLOCK] = x[j]
        tables.append(table + [0] * (max(per_seq) - nb))
    return cache, torch.tensor(tables, dtype=torch.int32)


def _cu(query_lens: list[int]) -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(query_lens).cumsum(0).tolist(), dtype=torch.int32)


def _oracle_scores(q, w, keys, scale):
    out = torch.zeros(q.shape[0], keys.shape[0], dtype=torch.float64)
    for t in range(q.shape[0]):
        for s in range(keys.shape[0]):
            for h in range(q.shape[1]):
                dot = float((q[t, h].double() * keys[s].double()).sum()) * scale
                out[t, s] += float(w[t, h]) * HI**-0.5 * max(dot, 0.0)
    return out


def _oracle_topk(scores_row: list[float], position: int, k: int) -> list[int]:
    order = sorted(range(position + 1), key=lambda s: (-scores_row[s], s))
    return order[:k] + [-1] * (k - min(k, position + 1))


def test_indexer_scores_match_loop_oracle() -> None:
    torch.manual_seed(0)
    q, w, keys = torch.randn(5, HI, DI), torch.randn(5, HI), torch.randn(7, DI)
    got = indexer_scores(q, w, keys, DI**-0.5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(
        got.double(), _oracle_scores(q, w, keys, DI**-0.5), atol=1e-5, rtol=1e-5
    )


def test_select_topk_ties_lower_index_wins_and_pads() -> None:
    scores = torch.tensor(
        [
            [1.0, 3.0, 1.0, 3.0, 2.0, 3.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [5.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0],
        ]
    )
    got = select_topk(scores, torch.tensor([7, 7, 2]), 4)
    assert got.dtype == torch.int32
    assert got.tolist() == [[1, 3, 5, 4], [0, 1, 2, 3], [1, 0, -1, -1]]
    for perm in (torch.randperm(3), torch.arange(3)):  # rows are independent of their neighbours
        assert torch.equal(select_topk(scores[perm], torch.tensor([7, 7, 2])[perm], 4), got[perm])


@pytest.mark.parametrize("ties", [False, True], ids=["random", "quantized-ties"])
def test_lightning_indexer_topk_matches_oracle(ties: bool) -> None:
    torch.manual_seed(1)
    seq_lens, query_lens = [5, 9, 20, 24], [5, 9, 20, 1]
    keys = [torch.randn(n, DI) for n in seq_lens]
    if ties:  # few distinct key values -> many exactly equal scores
        keys = [k.sign() for k in keys]
    cache, bt = _store(seq_lens, keys)
    cu = _cu(query_lens)
    q, w = torch.randn(int(cu[-1]), HI, DI), torch.rand(int(cu[-1]), HI)
    if ties:
        q = q.sign()
    got = lightning_indexer_topk(q, w, cache, bt, cu, seq_lens, TOPK, DI**-0.5)
    assert got.shape == (int(cu[-1]), TOPK) and got.dtype == torch.int32
    num_tied_boundaries = 0
    for i, n in enumerate(seq_lens):
        rows = range(int(cu[i]), int(cu[i + 1]))
        scores = indexer_scores(q[list(rows)], w[list(rows)], keys[i], DI**-0.5)
        for j, t in enumerate(rows):
            pos = n - len(rows) + j
            row = scores[j].tolist()
            assert got[t].tolist() == _oracle_topk(row, pos, TOPK)
            vis = sorted(row[: pos + 1], reverse=True)
            num_tied_boundaries += int(pos + 1 > TOPK and vis[TOPK - 1] == vis[TOPK])
    if ties:
        assert num_tied_boundaries > 0  # the tie-break was exercised


def _latents(seq_lens: list[int]) -> list[torch.Tensor]:
    return [torch.randn(n, R + DR) for n in seq_lens]


def _dense_masked(q_nope, q_rope, latents, kv_b, allowed, scale):
    """Expanded MLA with an explicit [Tq, L] mask: the restricted-dense oracle."""
    c, k_rope = latents[:, :R], latents[:, R:]
    kv = (c @ kv_b.T).view(-1, H, DN + DV)
    k = torch.cat([kv[..., :DN], k_rope[:, None].expand(-1, H, -1)], dim=-1)
    q = torch.cat([q_nope, q_rope], dim=-1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), kv[..., DN:])


def test_sparse_mla_reads_only_selected_tokens() -> None:
    torch.manual_seed(2)
    seq_lens, query_lens = [20, 13], [3, 1]
    latents = _latents(seq_lens)
    cache, bt = _store(seq_lens, latents)
    cu = _cu(query_lens)
    topk = torch.tensor([[3, 17, -1, 0], [19, 5, 6, -1], [2, -1, -1, -1], [12, 0, 4, 8]])
    # poison every written latent that nobody selects: a dense read would turn NaN
    for i, rows in ((0, range(0, 3)), (1, range(3, 4))):
        chosen = {int(s) for t in rows for s in topk[t] if s >= 0}
        for j in set(range(seq_lens[i])) - chosen:
            cache[bt[i, j // BLOCK], j % BLOCK] = float("nan")
    q_nope, q_rope = torch.randn(4, H, DN), torch.randn(4, H, DR)
    kv_b = torch.randn(H * (DN + DV), R) / R**0.5
    out = sparse_mla(q_nope, q_rope, cache, bt, cu, topk, kv_b, 0.3)
    assert not out.isnan().any()
    for i, rows in ((0, range(0, 3)), (1, range(3, 4))):
        allowed = torch.zeros(len(rows), seq_lens[i], dtype=torch.bool)
        for j, t in enumerate(rows):
            allowed[j, topk[t][topk[t] >= 0].long()] = True
        r = list(rows)
        want = _dense_masked(q_nope[r], q_rope[r], latents[i], kv_b, allowed, 0.3)
        torch.testing.assert_close(out[r], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="selects no token"):
        sparse_mla(q_nope[:1], q_rope[:1], cache, bt[:1], _cu([1]), -torch.ones(1, 4), kv_b, 0.3)


@pytest.mark.parametrize("length", [1, 5, TOPK, TOPK + 1, 2 * TOPK, 3 * TOPK])
def test_c03_indexer_plus_sparse_mla_at_topk_boundary(length: int) -> None:
    """C03 at op level: L <= k is dense causal MLA; above, the selection is the fp32 oracle's
    top-k and the output is dense attention restricted to it."""
    torch.manual_seed(3)
    latents, keys = _latents([length]), [torch.randn(length, DI)]
    lat_cache, bt = _store([length], latents)
    key_cache, bt2 = _store([length], keys)
    assert torch.equal(bt, bt2)
    cu = _cu([length])
    q, w = torch.randn(length, HI, DI), torch.randn(length, HI)
    q_nope, q_rope = torch.randn(length, H, DN), torch.randn(length, H, DR)
    kv_b = torch.randn(H * (DN + DV), R) / R**0.5
    topk = lightning_indexer_topk(q, w, key_cache, bt, cu, [length], TOPK, DI**-0.5)
    out = sparse_mla(q_nope, q_rope, lat_cache, bt, cu, topk, kv_b, 0.25)
    scores = _oracle_scores(q, w, keys[0], DI**-0.5)
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for t in range(length):
        selected = {s for s in topk[t].tolist() if s >= 0}
        visible = scores[t, : t + 1].tolist()
        if t + 1 <= TOPK:
            assert selected == set(range(t + 1))
        else:  # modulo near-ties: everything clearly above the k-th score, nothing below it
            kth = sorted(visible, reverse=True)[TOPK - 1]
            assert len(selected) == TOPK
            assert {s for s, v in enumerate(visible) if v > kth + 1e-5} <= selected
            assert all(visible[s] >= kth - 1e-5 for s in selected)
        allowed[t, list(selected)] = True
    if length <= TOPK:
        assert torch.equal(allowed, torch.ones(length, length, dtype=torch.bool).tril())
        dense = mla_expanded(q_nope, q_rope, lat_cache, bt, cu, [length], kv_b, 0.25)
        torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-6)
    want = _dense_masked(q_nope, q_rope, latents[0], kv_b, allowed, 0.25)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ties", [False, True], ids=["random", "quantized-ties"])
def test_bounded_indexer_topk_equals_the_host_length_form(ties: bool) -> None:
    """Lengths as a device tensor under a larger host bound (the captured-step form): the same
    top-k as the host-length reference, NaN in every unwritten slot and table column."""
    torch.manual_seed(2)
    seq_lens, query_lens = [5, 9, 20, 24], [1, 9, 3, 1]
    keys = [torch.randn(n, DI) for n in seq_lens]
    if ties:
        keys = [k.sign() for k in keys]
    cache, bt = _store(seq_lens, keys)
    bound = 40
    bt = torch.nn.functional.pad(bt, (0, -(-bound // BLOCK) - bt.shape[1]))
    cu = _cu(query_lens)
    q, w = torch.randn(int(cu[-1]), HI, DI), torch.rand(int(cu[-1]), HI)
    want = lightning_indexer_topk(q, w, cache, bt, cu, seq_lens, TOPK, DI**-0.5)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    got = lightning_indexer_topk(q, w, cache, bt, cu, lens, TOPK, DI**-0.5, max_seq_len=bound)
    assert torch.equal(got, want)
