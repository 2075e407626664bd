"""KDA ops: chunked == token-by-token recurrence, varlen packing, carried state, and parity with
transformers' kimi_linear torch functions (an independent oracle), for both implementations:
`reference` (the definition: a Python loop per sequence and token, chunk algebra in float64) and
`cpu` (the public fast path, vectorized over sequences, fp32). The fast path is always checked
against the reference's token-by-token recurrence; tests/ops/test_kda_cpu.py covers what only
the fast path has."""

from __future__ import annotations

import pytest
import torch
from transformers.models.kimi_linear import modeling_kimi_linear as hf_kimi

from hyla.ops.kda import cpu, reference

ATOL = 1e-5
IMPLS = {"reference": reference, "cpu": cpu}


def make_inputs(T: int, H: int = 2, HV: int = 4, K: int = 16, V: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, K, generator=gen)
    k = torch.randn(T, H, K, generator=gen)
    v = torch.randn(T, HV, V, generator=gen)
    # realistic KDA gates: -exp(A) * softplus(x), A in [0, log 16]
    A = torch.rand(HV, 1, generator=gen) * 2.7
    g = -A.exp() * torch.nn.functional.softplus(torch.randn(T, HV, K, generator=gen) - 3)
    beta = torch.rand(T, HV, generator=gen)
    return q, k, v, g, beta


def cu(*lens: int) -> torch.Tensor:
    return torch.tensor([0, *lens], dtype=torch.int32).cumsum(0).to(torch.int32)


def random_state(N: int, HV: int = 4, K: int = 16, V: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randn(N, HV, K, V, generator=torch.Generator().manual_seed(seed)) * 0.3


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T", [1, 2, 63, 64, 65, 200])
@pytest.mark.parametrize("chunk_size", [16, 64])
def test_chunk_matches_recurrent(impl: str, T: int, chunk_size: int) -> None:
    q, k, v, g, beta = make_inputs(T)
    s0 = random_state(1)
    o_ref, s_ref = reference.recurrent_kda(q, k, v, g, beta, cu(T), s0, use_qk_l2norm=True)
    chunk_kda = IMPLS[impl].chunk_kda
    o, s = chunk_kda(q, k, v, g, beta, cu(T), s0, use_qk_l2norm=True, chunk_size=chunk_size)
    torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(s, s_ref, atol=ATOL, rtol=0)
    assert s.dtype == torch.float32 and o.abs().max() > 1e-2


@pytest.mark.parametrize("T", [1, 2, 65, 200])
def test_fast_recurrent_matches_definition(T: int) -> None:
    q, k, v, g, beta = make_inputs(T)
    s0 = random_state(1)
    o_ref, s_ref = reference.recurrent_kda(q, k, v, g, beta, cu(T), s0, use_qk_l2norm=True)
    o, s = cpu.recurrent_kda(q, k, v, g, beta, cu(T), s0, use_qk_l2norm=True)
    torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(s, s_ref, atol=ATOL, rtol=0)


OPS = {
    f"{i}-{m}": getattr(impl, f"{m}_kda")
    for i, impl in IMPLS.items()
    for m in ("recurrent", "chunk")
}


@pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())
def test_varlen_packed_equals_each_alone(op) -> None:
    lens = [5, 64, 1, 0, 130, 3]
    q, k, v, g, beta = make_inputs(sum(lens))
    s0 = random_state(len(lens))
    o, s = op(q, k, v, g, beta, cu(*lens), s0, use_qk_l2norm=True)
    start = 0
    for i, n in enumerate(lens):
        rows = slice(start, start + n)
        o_i, s_i = op(
            q[rows], k[rows], v[rows], g[rows], beta[rows], cu(n), s0[i : i + 1], use_qk_l2norm=True
        )
        torch.testing.assert_close(o[rows], o_i, atol=ATOL, rtol=0)
        torch.testing.assert_close(s[i : i + 1], s_i, atol=ATOL, rtol=0)
        start += n
    torch.testing.assert_close(s[3], s0[3])  # empty sequence keeps its state


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("split", [1, 3, 64, 65, 199])
def test_initial_state_carries_across_calls(impl: str, split: int) -> None:
    chunk_kda, recurrent_kda = IMPLS[impl].chunk_kda, IMPLS[impl].recurrent_kda
    T = 200
    q, k, v, g, beta = make_inputs(T)
    o_full, s_full = chunk_kda(q, k, v, g, beta, cu(T), use_qk_l2norm=True)
    a, b = slice(0, split), slice(split, T)
    o_a, s_a = chunk_kda(q[a], k[a], v[a], g[a], beta[a], cu(split), use_qk_l2norm=True)
    o_b, s_b = recurrent_kda(
        q[b], k[b], v[b], g[b], beta[b], cu(T - split), s_a, use_qk_l2norm=True
    )
    torch.testing.assert_close(torch.cat([o_a, o_b]), o_full, atol=ATOL, rtol=0)
    torch.testing.assert_close(s_b, s_full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_strong_decay_stays_finite(impl: str) -> None:
    T = 150
    q, k, v, g, beta = make_inputs(T)
    g = g * 200  # cumulative log-decays reach -1e4 inside a chunk
    o_ref, s_ref = reference.recurrent_kda(q, k, v, g, beta, cu(T), use_qk_l2norm=True)
    o, s = IMPLS[impl].chunk_kda(q, k, v, g, beta, cu(T), use_qk_l2norm=True)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_scale_and_no_l2norm(impl: str) -> None:
    chunk_kda, recurrent_kda = IMPLS[impl].chunk_kda, IMPLS[impl].recurrent_kda
    T = 70
    q, k, v, g, beta = make_inputs(T)
    k = torch.nn.functional.normalize(k, dim=-1)  # delta rule is stable for |k| <= 1
    o_ref, s_ref = recurrent_kda(q, k, v, g, beta, cu(T), scale=0.5)
    o, s = chunk_kda(q, k, v, g, beta, cu(T), scale=0.5)
    torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)
    o_half, _ = recurrent_kda(q * 0.5, k, v, g, beta, cu(T), scale=1.0)
    torch.testing.assert_close(o_half, o_ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_output_dtype_follows_v(impl: str) -> None:
    q, k, v, g, beta = make_inputs(20)
    o, s = IMPLS[impl].chunk_kda(
        q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta, cu(20), use_qk_l2norm=True
    )
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T", [1, 65, 130])
def test_matches_transformers_kimi_functions(impl: str, T: int) -> None:
    chunk_kda, recurrent_kda = IMPLS[impl].chunk_kda, IMPLS[impl].recurrent_kda
    H = HV = 2
    q, k, v, g, beta = make_inputs(T, H=H, HV=HV, K=16, V=16)
    s0 = random_state(1, HV=HV, K=16, V=16)
    o, s = recurrent_kda(q, k, v, g, beta, cu(T), s0, use_qk_l2norm=True)
    o_c, s_c = chunk_kda(q, k, v, g, beta, cu(T), s0, use_qk_l2norm=True)
    args = (q[None], k[None], v[None], g[None], beta[None])
    hf_o, hf_s = hf_kimi.recurrent_kimi_delta_attention(
        *args, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    hf_oc, hf_sc = hf_kimi.chunk_kimi_delta_attention(
        *args, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    for ours, theirs in ((o[None], hf_o), (o_c[None], hf_oc), (s, hf_s), (s_c, hf_sc)):
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_shapes_raise(impl: str) -> None:
    chunk_kda, recurrent_kda = IMPLS[impl].chunk_kda, IMPLS[impl].recurrent_kda
    q, k, v, g, beta = make_inputs(10)
    with pytest.raises(ValueError, match="g:"):
        recurrent_kda(q, k, v, g[:, :, :4], beta, cu(10))
    with pytest.raises(ValueError, match="cu_seqlens"):
        chunk_kda(q, k, v, g, beta, cu(9))
    with pytest.raises(ValueError, match="initial_state"):
        chunk_kda(q, k, v, g, beta, cu(10), random_state(2))
