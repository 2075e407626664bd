"""MLA over the paged latent cache: expanded form vs dense SDPA on explicitly expanded K/V,
absorbed (decode) form == expanded form, and the batched absorbed form (all sequences padded into
two matmuls, the decode fast path) == the absorbed reference. Caches are NaN outside the written
entries (block 0, the padding block of the tables, included)."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from hyla.ops.mla import mla_absorbed, mla_absorbed_batched, mla_expanded, split_kv_b

BLOCK = 4
H, DN, DV, R = 4, 16, 12, 24


def _paged_latents(seq_lens: list[int], width: int, seed: int = 0):
    rng = random.Random(seed)
    per_seq = [(n + BLOCK - 1) // BLOCK for n in seq_lens]
    blocks = list(range(1, sum(per_seq) + 1))
    rng.shuffle(blocks)
    cache = torch.full((len(blocks) + 1, BLOCK, width), float("nan"))
    tables, dense, start = [], [], 0
    for n, nb in zip(seq_lens, per_seq, strict=True):
        table = blocks[start : start + nb]
        start += nb
        lat = torch.randn(n, width)
        for j in range(n):
            cache[table[j // BLOCK], j % BLOCK] = lat[j]
        tables.append(table + [0] * (max(per_seq) - nb))
        dense.append(lat)
    return cache, torch.tensor(tables, dtype=torch.int32), dense


def _oracle(q_nope, q_rope, latents, kv_b_weight, scale):
    """Per-head explicit expansion k_h = [c W_UK_h^T | k_rope], v_h = c W_UV_h^T, then SDPA."""
    tq, n = q_nope.shape[0], latents.shape[0]
    c, k_rope = latents[:, :R], latents[:, R:]
    w = kv_b_weight.view(H, DN + DV, R)
    outs = []
    for h in range(H):
        k = torch.cat([c @ w[h, :DN].T, k_rope], dim=-1)
        v = c @ w[h, DN:].T
        q = torch.cat([q_nope[:, h], q_rope[:, h]], dim=-1)
        mask = torch.ones(tq, n, dtype=torch.bool).tril(n - tq)
        outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale))
    return torch.stack(outs, dim=1)


def _batch(dr: int, seq_lens: list[int], query_lens: list[int]):
    torch.manual_seed(0)
    cache, bt, dense = _paged_latents(seq_lens, R + dr)
    cu = torch.tensor([0] + torch.tensor(query_lens).cumsum(0).tolist(), dtype=torch.int32)
    t = int(cu[-1])
    q_nope, q_rope = torch.randn(t, H, DN), torch.randn(t, H, dr)
    kv_b = torch.randn(H * (DN + DV), R) / R**0.5
    return cache, bt, dense, cu, q_nope, q_rope, kv_b


@pytest.mark.parametrize("dr", [0, 8], ids=["no-rope-dims", "rope-dims"])
def test_expanded_and_absorbed_match_dense_oracle(dr: int) -> None:
    seq_lens, query_lens = [1, 2, 17, 40, 23, 9], [1, 2, 17, 40, 1, 4]
    cache, bt, dense, cu, q_nope, q_rope, kv_b = _batch(dr, seq_lens, query_lens)
    scale = (DN + dr) ** -0.5
    args = (q_nope, q_rope, cache, bt, cu, seq_lens, kv_b, scale)
    expanded, absorbed = mla_expanded(*args), mla_absorbed(*args)
    assert expanded.shape == (int(cu[-1]), H, DV) and not expanded.isnan().any()
    torch.testing.assert_close(absorbed, expanded, rtol=1e-5, atol=1e-5)
    for i in range(len(seq_lens)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        want = _oracle(q_nope[rows], q_rope[rows], dense[i], kv_b, scale)
        torch.testing.assert_close(expanded[rows], want, rtol=1e-5, atol=1e-5)


def test_absorbed_decode_equals_expanded_over_many_steps() -> None:
    """Decode of 8 sequences at once (one query each), lengths 1..64."""
    seq_lens = [1, 3, 8, 9, 16, 33, 50, 64]
    cache, bt, _, cu, q_nope, q_rope, kv_b = _batch(8, seq_lens, [1] * len(seq_lens))
    args = (q_nope, q_rope, cache, bt, cu, seq_lens, kv_b, 24**-0.5)
    torch.testing.assert_close(mla_absorbed(*args), mla_expanded(*args), rtol=1e-5, atol=1e-5)


def test_batch_transparency() -> None:
    seq_lens, query_lens = [17, 23, 9], [17, 1, 4]
    cache, bt, _, cu, q_nope, q_rope, kv_b = _batch(8, seq_lens, query_lens)
    for op in (mla_expanded, mla_absorbed):
        full = op(q_nope, q_rope, cache, bt, cu, seq_lens, kv_b, 0.2)
        for i in range(3):
            rows = slice(int(cu[i]), int(cu[i + 1]))
            cu1 = torch.tensor([0, query_lens[i]], dtype=torch.int32)
            alone = op(
                q_nope[rows], q_rope[rows], cache, bt[i : i + 1], cu1, [seq_lens[i]], kv_b, 0.2
            )
            assert torch.equal(alone, full[rows])


def test_split_kv_b_layout() -> None:
    w = torch.arange(H * (DN + DV) * R, dtype=torch.float32).view(H * (DN + DV), R)
    w_uk, w_uv = split_kv_b(w, H, DN)
    assert w_uk.shape == (H, DN, R) and w_uv.shape == (H, DV, R)
    assert torch.equal(w_uk[1, 0], w[DN + DV]) and torch.equal(w_uv[2, 0], w[2 * (DN + DV) + DN])


@pytest.mark.parametrize(
    "seq_lens,query_lens",
    [([1, 3, 8, 9, 16, 33, 50, 64], [1] * 8), ([1, 2, 17, 40, 23, 9], [1, 2, 17, 40, 1, 4])],
    ids=["decode", "mixed"],
)
@pytest.mark.parametrize("dr", [0, 8], ids=["no-rope-dims", "rope-dims"])
def test_batched_absorbed_matches_reference(dr: int, seq_lens, query_lens) -> None:
    cache, bt, _, cu, q_nope, q_rope, kv_b = _batch(dr, seq_lens, query_lens)
    args = (q_nope, q_rope, cache, bt, cu, seq_lens, kv_b, (DN + dr) ** -0.5)
    got = mla_absorbed_batched(*args)
    assert got.shape == (int(cu[-1]), H, DV) and not got.isnan().any()
    torch.testing.assert_close(got, mla_absorbed(*args), rtol=1e-5, atol=1e-5)


def test_batched_absorbed_batch_transparency() -> None:
    """A sequence's rows alone vs padded among longer and shorter neighbours: equal to fp32
    rounding (the padded length changes the softmax's summation, not the masked values)."""
    seq_lens, query_lens = [17, 23, 9, 40], [1, 1, 1, 1]
    cache, bt, _, cu, q_nope, q_rope, kv_b = _batch(8, seq_lens, query_lens)
    full = mla_absorbed_batched(q_nope, q_rope, cache, bt, cu, seq_lens, kv_b, 0.2)
    for i in range(len(seq_lens)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        cu1 = torch.tensor([0, query_lens[i]], dtype=torch.int32)
        alone = mla_absorbed_batched(
            q_nope[rows], q_rope[rows], cache, bt[i : i + 1], cu1, [seq_lens[i]], kv_b, 0.2
        )
        torch.testing.assert_close(alone, full[rows], rtol=1e-6, atol=1e-6)


def test_absorbed_batched_with_host_query_lens_reads_no_device_metadata(monkeypatch) -> None:
    """With `query_lens` given, the batched absorbed form builds its layout from host ints (no
    `.max()` / `nonzero` read-back of device tensors, a sync on a GPU) and gives the same result."""
    from hyla.ops.mla import cpu

    gen = torch.Generator().manual_seed(11)
    H, Dn, Dr, R, Dv, B = 2, 8, 4, 16, 8, 4
    seq_lens, query_lens = [5, 9, 1, 13], [1, 1, 1, 1]
    N = len(seq_lens)
    cache = torch.randn(16, B, R + Dr, generator=gen)
    tables = torch.randperm(16, generator=gen)[: N * 4].view(N, 4).int()
    cu = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)
    q_nope, q_rope = torch.randn(N, H, Dn, generator=gen), torch.randn(N, H, Dr, generator=gen)
    kv_b = torch.randn(H * (Dn + Dv), R, generator=gen)
    args = (q_nope, q_rope, cache, tables, cu, seq_lens, kv_b, 0.3)
    want = cpu.mla_absorbed_batched(*args)
    monkeypatch.setattr(torch.Tensor, "__int__", lambda self: pytest.fail("read-back"))
    monkeypatch.setattr(torch.Tensor, "nonzero", lambda self, **k: pytest.fail("read-back"))
    got = cpu.mla_absorbed_batched(*args, query_lens=query_lens)
    monkeypatch.undo()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
