"""Paged causal GQA over a packed varlen batch vs torch SDPA on each sequence's dense K/V."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from hyla.ops.gqa import paged_gqa

BLOCK = 4


def _paged(seq_lens: list[int], num_kv_heads: int, dim: int, seed: int = 0):
    """Random dense K/V per sequence, stored in NaN-poisoned caches under shuffled blocks."""
    rng = random.Random(seed)
    per_seq = [(n + BLOCK - 1) // BLOCK for n in seq_lens]
    blocks = list(range(1, sum(per_seq) + 1))
    rng.shuffle(blocks)
    num_blocks = len(blocks) + 1
    k_cache = torch.full((num_blocks, BLOCK, num_kv_heads, dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    tables, ks, vs, start = [], [], [], 0
    for n, nb in zip(seq_lens, per_seq, strict=True):
        table = blocks[start : start + nb]
        start += nb
        k, v = torch.randn(n, num_kv_heads, dim), torch.randn(n, num_kv_heads, dim)
        for j in range(n):
            k_cache[table[j // BLOCK], j % BLOCK] = k[j]
            v_cache[table[j // BLOCK], j % BLOCK] = v[j]
        tables.append(table)
        ks.append(k)
        vs.append(v)
    width = max(per_seq)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    return k_cache, v_cache, bt, ks, vs


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Tq, H, D] = the last Tq tokens; k, v [L, HKV, D]."""
    tq, num_len = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    mask = torch.ones(tq, num_len, dtype=torch.bool).tril(num_len - tq)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1).repeat_interleave(group, 0),
        v.transpose(0, 1).repeat_interleave(group, 0),
        attn_mask=mask,
        scale=scale,
    )
    return out.transpose(0, 1)


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa2", "mqa"])
def test_paged_gqa_matches_sdpa_per_sequence(heads: tuple[int, int]) -> None:
    torch.manual_seed(0)
    num_heads, num_kv_heads = heads
    dim, scale = 8, 8**-0.5
    seq_lens = [17, 15, 31, 1, 40]
    query_lens = [17, 5, 1, 1, 3]  # prefill, chunked prefill, decodes, short tail
    k_cache, v_cache, bt, ks, vs = _paged(seq_lens, num_kv_heads, dim)
    cu = torch.tensor([0] + torch.tensor(query_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(cu[-1]), num_heads, dim)
    out = paged_gqa(q, k_cache, v_cache, bt, cu, seq_lens, scale)
    assert not out.isnan().any()
    for i in range(len(seq_lens)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        want = _sdpa(q[rows], ks[i], vs[i], scale)
        torch.testing.assert_close(out[rows], want, rtol=1e-5, atol=1e-6)
        cu_alone = torch.tensor([0, query_lens[i]], dtype=torch.int32)
        alone = paged_gqa(q[rows], k_cache, v_cache, bt[i : i + 1], cu_alone, [seq_lens[i]], scale)
        assert torch.equal(alone, out[rows])


def test_rejects_bad_head_ratio() -> None:
    k_cache = torch.zeros(2, BLOCK, 3, 8)
    with pytest.raises(ValueError, match="kv heads"):
        paged_gqa(
            torch.zeros(1, 4, 8),
            k_cache,
            k_cache,
            torch.zeros(1, 1, dtype=torch.int32),
            torch.tensor([0, 1], dtype=torch.int32),
            [1],
            1.0,
        )


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa2", "mqa"])
@pytest.mark.parametrize("extra", [0, 23])
def test_bounded_form_matches_sdpa(heads: tuple[int, int], extra: int) -> None:
    """`paged_gqa_bounded`: lengths as a device tensor under a host bound (>= the longest, block
    tables padded to it with the NaN block 0): the per-sequence SDPA oracle, every row."""
    from hyla.ops.gqa import paged_gqa_bounded

    torch.manual_seed(1)
    num_heads, num_kv_heads = heads
    dim, scale = 8, 8**-0.5
    seq_lens, query_lens = [17, 15, 31, 1, 40], [17, 5, 1, 1, 3]
    k_cache, v_cache, bt, ks, vs = _paged(seq_lens, num_kv_heads, dim)
    bound = max(seq_lens) + extra
    bt = F.pad(bt, (0, -(-bound // BLOCK) - bt.shape[1]))
    cu = torch.tensor([0] + torch.tensor(query_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(cu[-1]), num_heads, dim)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    out = paged_gqa_bounded(q, k_cache, v_cache, bt, cu, lens, bound, scale)
    assert not out.isnan().any()
    for i in range(len(seq_lens)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        want = _sdpa(q[rows], ks[i], vs[i], scale)
        torch.testing.assert_close(out[rows], want, rtol=1e-5, atol=1e-6)
