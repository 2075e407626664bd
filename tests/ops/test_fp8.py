"""FP8 quantization definitions (`hyla.ops.fp8.reference`) against plain per-block / per-row
loops written here, block-scale edge cases, and the fp8 cache read paths of every attention op
against the same op over a float cache holding the dequantized values."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hyla.ops.fp8 import (
    FP8,
    dequantize_per_token,
    dequantize_weight_blockwise,
    fp8_linear,
    fp8_moe_experts,
    quantize_activation,
    quantize_per_token,
    quantize_weight_blockwise,
)
from hyla.ops.gqa import paged_gqa, paged_gqa_bounded
from hyla.ops.mla import mla_absorbed, mla_absorbed_batched, mla_expanded, mla_paged
from hyla.ops.paged import write_paged_entries
from hyla.ops.sparse_attention import sparse_mla

MAX = 448.0


def _loop_quantize(w: torch.Tensor, bn: int, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = w.shape
    scale = torch.ones(math.ceil(rows / bn), math.ceil(cols / bk))
    q = torch.empty(rows, cols, dtype=FP8)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            blk = w[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk].float()
            amax = blk.abs().max().item()
            scale[i, j] = amax / MAX if amax > 0 else 1.0
            q[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk] = (
                (blk / scale[i, j]).clamp(-MAX, MAX).to(FP8)
            )
    return q, scale


SHAPES = [
    ((300, 200), (128, 128)),
    ((7, 5), (2, 3)),
    ((128, 256), (128, 128)),
    ((1, 129), (1, 128)),
]


@pytest.mark.parametrize("shape,block", SHAPES)
def test_block_quantize_matches_loops(shape, block) -> None:
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 3
    q, s = quantize_weight_blockwise(w, block)
    q_ref, s_ref = _loop_quantize(w, *block)
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    back = dequantize_weight_blockwise(q, s, block)
    torch.testing.assert_close(back, w, rtol=2**-3, atol=1e-6)


def test_block_edge_cases_zero_extreme_and_saturation() -> None:
    w = torch.zeros(256, 300)  # 3 column blocks, the last one ragged (44 columns)
    w[128:, :128] = torch.randn(128, 128) * 1e-30  # a scale near float32's normal limit
    w[:128, 128:256] = torch.randn(128, 128) * 1e30
    w[:128, 256:] = torch.randn(128, 44)  # block (1, 1) stays all zero
    q, s = quantize_weight_blockwise(w, (128, 128))
    assert s[1, 1] == 1.0 and not q[128:, 128:256].float().any()  # zero block: scale 1, zeros
    assert torch.equal(s, _loop_quantize(w, 128, 128)[1])
    back = dequantize_weight_blockwise(q, s, (128, 128))
    assert torch.isfinite(back).all()
    # e4m3: 3 mantissa bits (relative step 2^-3, rounding 2^-4); subnormal step 2^-9 * scale
    step = s.repeat_interleave(128, 0)[:256].repeat_interleave(128, 1)[:, :300] * 2**-10
    assert ((back - w).abs() <= w.abs() * 2**-4 + step).all()
    big = torch.tensor([[1e6, -1e6, 1.0, 3e38]])  # values past e4m3's range saturate at 448
    qx, sx = quantize_activation(big, 4)
    assert torch.isfinite(sx).all() and qx.float().abs().max() == MAX
    qv, sv = quantize_per_token(torch.tensor([[1e6, -1e6, 1.0]]))
    assert not torch.isnan(dequantize_per_token(qv, sv)).any()
    assert qv.float().abs().max() == MAX


@pytest.mark.parametrize("k,n", [(200, 136), (64, 32), (129, 1)])
def test_fp8_linear_is_dequantized_w8a8(k: int, n: int) -> None:
    gen = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(5, k, generator=gen), torch.randn(n, k, generator=gen), torch.randn(n)
    q, s = _loop_quantize(w, 128, 128)
    w_deq = q.float() * s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    x_deq = torch.cat([_loop_quantize(x[:, j : j + 128], 1, 128)[0].float()
                       * _loop_quantize(x[:, j : j + 128], 1, 128)[1]
                       for j in range(0, k, 128)], dim=1)  # fmt: skip
    want = x_deq @ w_deq.T + b
    torch.testing.assert_close(fp8_linear(x, q, s, (128, 128), b), want, rtol=1e-5, atol=1e-5)
    assert fp8_linear(x.bfloat16(), q, s, (128, 128)).dtype == torch.bfloat16


def test_fp8_moe_experts_is_per_expert_fp8_linear() -> None:
    gen = torch.Generator().manual_seed(2)
    E, I, D, T, k, block = 4, 40, 48, 6, 2, (16, 32)
    gu = torch.randn(E, 2 * I, D, generator=gen)
    dn = torch.randn(E, D, I, generator=gen)
    parts = [[_loop_quantize(m, *block) for m in gu[e].chunk(2)] for e in range(E)]
    gu_q = torch.stack([torch.cat([p[0][0], p[1][0]]) for p in parts])
    gu_s = torch.stack([torch.cat([p[0][1], p[1][1]]) for p in parts])
    d = [_loop_quantize(dn[e], *block) for e in range(E)]
    dn_q, dn_s = torch.stack([q for q, _ in d]), torch.stack([s for _, s in d])
    x = torch.randn(T, D, generator=gen)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)])
    wts = torch.rand(T, k, generator=gen)
    got = fp8_moe_experts(x, gu_q, gu_s, dn_q, dn_s, wts, ids, block)
    want = torch.zeros(T, D)
    for t in range(T):
        for j in range(k):
            e = int(ids[t, j])
            gate = fp8_linear(x[t : t + 1], parts[e][0][0], parts[e][0][1], block)
            up = fp8_linear(x[t : t + 1], parts[e][1][0], parts[e][1][1], block)
            want[t] += wts[t, j] * fp8_linear(F.silu(gate) * up, d[e][0], d[e][1], block)[0]
    # outputs ~10: fp32 sums in another order (gate and up as one product there)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def _paged_pair(shape: tuple[int, ...], lens: list[int], block: int = 4):
    """A float cache and an fp8 cache (+ scales) holding the same entries (the float one the
    dequantized values), written through `write_paged_entries` at shuffled blocks."""
    gen = torch.Generator().manual_seed(3)
    per = [math.ceil(n / block) for n in lens]
    ids = (torch.randperm(sum(per) + 2, generator=gen)[: sum(per)] + 1).tolist()
    tables, start = [], 0
    for p in per:
        tables.append(ids[start : start + p] + [0] * (max(per) - p))
        start += p
    num_blocks = sum(per) + 3
    fp8 = {"x": torch.full((num_blocks, block, *shape), float("nan")).to(FP8),
           "x_scale": torch.full((num_blocks, block, *shape[:-1]), float("nan"))}  # fmt: skip
    flt = {"x": torch.full((num_blocks, block, *shape), float("nan"))}
    for i, n in enumerate(lens):
        values = torch.randn(n, *shape, generator=gen) * (i + 1)
        slots = torch.tensor([tables[i][j // block] * block + j % block for j in range(n)])
        write_paged_entries(fp8, "x", slots, values)
        q, s = quantize_per_token(values)  # checked against a loop in test_per_token_scales
        write_paged_entries(flt, "x", slots, dequantize_per_token(q, s))
    return flt, fp8, torch.tensor(tables, dtype=torch.int32)


def test_per_token_scales_match_loop() -> None:
    x = torch.randn(5, 3, 8)
    q, s = quantize_per_token(x)
    for t in range(5):
        for h in range(3):
            amax = x[t, h].abs().max().item()
            assert s[t, h] == amax / MAX
            want = (x[t, h] / s[t, h]).clamp(-MAX, MAX).to(FP8)
            assert torch.equal(q[t, h].view(torch.uint8), want.view(torch.uint8))


def test_mla_ops_read_fp8_latents() -> None:
    lens, H, dn, R, dr = [9, 14], 2, 8, 16, 4
    flt, fp8, tables = _paged_pair((R + dr,), lens)
    gen = torch.Generator().manual_seed(4)
    q_new = [3, 1]
    T = sum(q_new)
    q_nope, q_rope = torch.randn(T, H, dn, generator=gen), torch.randn(T, H, dr, generator=gen)
    kv_b = torch.randn(H * (dn + 8), R, generator=gen)
    cu = torch.tensor([0, 3, 4], dtype=torch.int32)
    args = (q_nope, q_rope)
    rest = (tables, cu, lens, kv_b, 0.3)
    for op in (mla_expanded, mla_absorbed, mla_absorbed_batched):
        want = op(*args, flt["x"], *rest)
        got = op(*args, fp8["x"], *rest, latent_scale=fp8["x_scale"])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    seq = torch.tensor(lens, dtype=torch.int32)
    want = mla_paged(*args, flt["x"], tables, cu, seq, 16, kv_b, 0.3)
    got = mla_paged(*args, fp8["x"], tables, cu, seq, 16, kv_b, 0.3, latent_scale=fp8["x_scale"])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    topk = torch.tensor([[0, 5, -1], [2, 3, 8], [8, 1, 0], [13, 0, -1]], dtype=torch.int32)
    want = sparse_mla(*args, flt["x"], tables, cu, topk, kv_b, 0.3)
    got = sparse_mla(*args, fp8["x"], tables, cu, topk, kv_b, 0.3, latent_scale=fp8["x_scale"])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_gqa_ops_read_fp8_kv() -> None:
    lens, H, HKV, K = [7, 12], 4, 2, 8
    k_flt, k_fp8, tables = _paged_pair((HKV, K), lens)
    gen = torch.Generator().manual_seed(5)
    T = 5
    q = torch.randn(T, H, K, generator=gen)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    scales = {"k_scale": k_fp8["x_scale"], "v_scale": k_fp8["x_scale"]}
    want = paged_gqa(q, k_flt["x"], k_flt["x"], tables, cu, lens, 0.5)
    got = paged_gqa(q, k_fp8["x"], k_fp8["x"], tables, cu, lens, 0.5, **scales)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    seq = torch.tensor(lens)
    want = paged_gqa_bounded(q, k_flt["x"], k_flt["x"], tables, cu, seq, 12, 0.5)
    got = paged_gqa_bounded(q, k_fp8["x"], k_fp8["x"], tables, cu, seq, 12, 0.5, **scales)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
