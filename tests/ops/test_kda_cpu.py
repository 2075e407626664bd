"""What only the vectorized KDA path (`hyla.ops.kda.cpu`, the public ops) has: any chunk size
against the definition, the pairwise fallback for strong decays next to factored chunks, the
step-major chunk layout, in-place states, and bitwise batch invariance. Oracle: the token-by-token
recurrence of `hyla.ops.kda.reference` (fp32), within 1e-5."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.gdn import cpu as gdn_cpu
from hyla.ops.gdn import reference as gdn_reference
from hyla.ops.kda import chunk_algebra, cpu, reference
from tests.ops.test_kda import ATOL, cu, make_inputs, random_state


def _definition(q, k, v, g, beta, cu_seqlens, s0):
    return reference.recurrent_kda(q, k, v, g, beta, cu_seqlens, s0, use_qk_l2norm=True)


@pytest.mark.parametrize("chunk_size", [1, 3, 16, 32, 64])
def test_any_chunk_size_matches_definition(chunk_size: int) -> None:
    lens = [1, 15, 16, 17, 100]
    q, k, v, g, beta = make_inputs(sum(lens))
    s0 = random_state(len(lens))
    o_ref, s_ref = _definition(q, k, v, g, beta, cu(*lens), s0)
    o, s = cpu.chunk_kda(q, k, v, g, beta, cu(*lens), s0, use_qk_l2norm=True, chunk_size=chunk_size)
    torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(s, s_ref, atol=ATOL, rtol=0)


def test_strong_and_weak_chunks_in_one_call() -> None:
    """Some chunk-heads decay past the factoring limit (pairwise path), the rest are factored;
    both kinds sit in one call and match the definition."""
    T = 96
    q, k, v, g, beta = make_inputs(T)
    g = g.clone()
    g[16:32, 1] *= 400  # head 1 of the second chunk decays by far more than e^-60
    G = g.view(6, 16, 4, 16).cumsum(1)[:, -1]  # [chunk, head, K] cumulative decay per chunk
    assert (G.amin(-1) < -chunk_algebra._FACTOR_SPAN).sum() == 1
    o_ref, s_ref = _definition(q, k, v, g, beta, cu(T), None)
    o, s = cpu.chunk_kda(q, k, v, g, beta, cu(T), use_qk_l2norm=True)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(s, s_ref, atol=ATOL, rtol=0)


def test_factored_pair_products_equal_pairwise() -> None:
    Z, c, K = 6, 16, 8
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(Z, c, K, generator=gen), torch.randn(Z, c, K, generator=gen)
    G = (-torch.rand(Z, c, K, generator=gen)).cumsum(1)
    A, B = chunk_algebra._pair_products(q, k, G, k * G.exp(), q * G.exp())
    A2, B2 = chunk_algebra._pair_products_pairwise(q, k, G)
    torch.testing.assert_close(A, A2.tril(-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(B, B2.tril(), atol=1e-5, rtol=1e-5)


def test_chunk_layout_is_step_major() -> None:
    """seq lens 5, 2, 9 with c = 4: counts 2, 1, 3 -> ranked [2, 0, 1]; step j's chunks are a
    contiguous range and pad/unpad round-trip every token."""
    layout = chunk_algebra.ChunkLayout([0, 5, 7, 16], 4, torch.device("cpu"))
    assert layout.order.tolist() == [2, 0, 1]
    assert list(layout.steps()) == [(slice(0, 3), 3), (slice(3, 5), 2), (slice(5, 6), 1)]
    # token (seq, pos) -> chunk offsets[pos // 4] + rank(seq)
    want = [(1 if p < 4 else 4) for p in range(5)] + [2, 2] + [0] * 4 + [3] * 4 + [5]
    assert layout.chunk_ids.tolist() == want
    x = torch.arange(16.0).view(16, 1, 1)
    padded = layout.pad(x)
    assert padded.shape == (6, 1, 4, 1) and padded[2, 0, 2:].eq(0).all()  # seq 1 pads 2 rows
    assert torch.equal(layout.unpad(padded), x)


@pytest.mark.parametrize("op", [cpu.recurrent_kda, cpu.chunk_kda], ids=["recurrent", "chunk"])
def test_batch_neighbours_do_not_change_a_bit(op) -> None:
    lens = [5, 64, 1, 0, 130, 3, 17]
    q, k, v, g, beta = make_inputs(sum(lens))
    s0 = random_state(len(lens))
    o, s = op(q, k, v, g, beta, cu(*lens), s0, use_qk_l2norm=True)
    start = 0
    for i, n in enumerate(lens):
        r = slice(start, start + n)
        o_i, s_i = op(q[r], k[r], v[r], g[r], beta[r], cu(n), s0[i : i + 1], use_qk_l2norm=True)
        assert torch.equal(o[r], o_i) and torch.equal(s[i : i + 1], s_i)
        start += n


@pytest.mark.parametrize("op", [cpu.recurrent_kda, cpu.chunk_kda], ids=["recurrent", "chunk"])
def test_inplace_state(op) -> None:
    lens = [1, 1, 1] if op is cpu.recurrent_kda else [20, 3, 40]
    q, k, v, g, beta = make_inputs(sum(lens))
    s0 = random_state(len(lens))
    kept = s0.clone()
    o, s = op(q, k, v, g, beta, cu(*lens), s0, use_qk_l2norm=True)
    assert torch.equal(s0, kept)  # by default the input state is left alone
    o2, s2 = op(q, k, v, g, beta, cu(*lens), s0, use_qk_l2norm=True, inplace_state=True)
    assert s2 is s0 and torch.equal(s2, s) and torch.equal(o2, o)


def test_empty_step() -> None:
    q, k, v, g, beta = make_inputs(0)
    s0 = random_state(2)
    for op in (cpu.recurrent_kda, cpu.chunk_kda):
        o, s = op(q, k, v, g, beta, cu(0, 0), s0, use_qk_l2norm=True)
        assert o.shape == (0, 4, 8) and torch.equal(s, s0)
    with pytest.raises(ValueError, match="chunk_size"):
        cpu.chunk_kda(q, k, v, g, beta, cu(0), chunk_size=0)


@pytest.mark.parametrize("fn", ["recurrent_gated_delta_rule", "chunk_gated_delta_rule"])
def test_gdn_fast_path_matches_definition(fn: str) -> None:
    lens = [7, 1, 65, 0, 40]
    T = sum(lens)
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(T, 2, 16, generator=gen), torch.randn(T, 2, 16, generator=gen)
    v = torch.randn(T, 4, 8, generator=gen)
    g = -torch.nn.functional.softplus(torch.randn(T, 4, generator=gen) - 2)
    beta = torch.rand(T, 4, generator=gen)
    s0 = random_state(len(lens))
    args = (q, k, v, g, beta, cu(*lens), s0)
    o_ref, s_ref = gdn_reference.recurrent_gated_delta_rule(*args, use_qk_l2norm=True)
    o, s = getattr(gdn_cpu, fn)(*args, use_qk_l2norm=True)
    torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(s, s_ref, atol=ATOL, rtol=0)
