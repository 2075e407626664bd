"""Gated DeltaNet ops: chunked == recurrence, varlen packing, carried state, GVA, and parity with
transformers' qwen3_next torch functions (an independent oracle), for both implementations (the
`reference` definition and the public vectorized `cpu` path; every test runs on each)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_next import modeling_qwen3_next as hf_qwen

from hyla.ops.gdn import cpu, reference

ATOL = 1e-5


@pytest.fixture(params=["reference", "cpu"])
def impl(request):
    """The implementation under test: `impl.chunk_gated_delta_rule` etc."""
    return {"reference": reference, "cpu": cpu}[request.param]


def make_inputs(T: int, H: int = 2, HV: int = 4, K: int = 16, V: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, K, generator=gen)
    k = torch.randn(T, H, K, generator=gen)
    v = torch.randn(T, HV, V, generator=gen)
    A = torch.rand(HV, generator=gen) * 2.7
    g = -A.exp() * torch.nn.functional.softplus(torch.randn(T, HV, generator=gen) - 2)
    beta = torch.rand(T, HV, generator=gen)
    return q, k, v, g, beta


def cu(*lens: int) -> torch.Tensor:
    return torch.tensor([0, *lens]).cumsum(0).to(torch.int32)


def random_state(N: int, HV: int = 4, K: int = 16, V: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randn(N, HV, K, V, generator=torch.Generator().manual_seed(seed)) * 0.3


@pytest.mark.parametrize("T", [1, 2, 63, 64, 65, 200])
def test_chunk_matches_recurrent(impl, T: int) -> None:
    q, k, v, g, beta = make_inputs(T)
    s0 = random_state(1)
    o_ref, s_ref = impl.recurrent_gated_delta_rule(q, k, v, g, beta, cu(T), s0, use_qk_l2norm=True)
    o, s = impl.chunk_gated_delta_rule(q, k, v, g, beta, cu(T), s0, use_qk_l2norm=True)
    torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(s, s_ref, atol=ATOL, rtol=0)
    assert o.abs().max() > 1e-2


@pytest.mark.parametrize("op", ["recurrent_gated_delta_rule", "chunk_gated_delta_rule"])
def test_varlen_packed_equals_each_alone(impl, op) -> None:
    op = getattr(impl, op)
    lens = [7, 1, 65, 0, 128]
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


@pytest.mark.parametrize("split", [1, 64, 100])
def test_initial_state_carries_across_calls(impl, split: int) -> None:
    T = 160
    q, k, v, g, beta = make_inputs(T)
    o_full, s_full = impl.recurrent_gated_delta_rule(q, k, v, g, beta, cu(T), use_qk_l2norm=True)
    a, b = slice(0, split), slice(split, T)
    o_a, s_a = impl.chunk_gated_delta_rule(
        q[a], k[a], v[a], g[a], beta[a], cu(split), use_qk_l2norm=True
    )
    o_b, s_b = impl.chunk_gated_delta_rule(
        q[b], k[b], v[b], g[b], beta[b], cu(T - split), s_a, use_qk_l2norm=True
    )
    torch.testing.assert_close(torch.cat([o_a, o_b]), o_full, atol=ATOL, rtol=0)
    torch.testing.assert_close(s_b, s_full, atol=ATOL, rtol=0)


def test_gva_equals_repeated_key_heads(impl) -> None:
    T = 40
    q, k, v, g, beta = make_inputs(T, H=2, HV=4)
    o, s = impl.chunk_gated_delta_rule(q, k, v, g, beta, cu(T), use_qk_l2norm=True)
    q4, k4 = q.repeat_interleave(2, dim=1), k.repeat_interleave(2, dim=1)
    o4, s4 = impl.recurrent_gated_delta_rule(q4, k4, v, g, beta, cu(T), use_qk_l2norm=True)
    torch.testing.assert_close(o, o4, atol=ATOL, rtol=0)
    torch.testing.assert_close(s, s4, atol=ATOL, rtol=0)


@pytest.mark.parametrize("T", [1, 64, 150])
def test_matches_transformers_qwen3_next_functions(impl, T: int) -> None:
    q, k, v, g, beta = make_inputs(T)  # GVA: 2 key heads, 4 value heads
    s0 = random_state(1)
    o, s = impl.recurrent_gated_delta_rule(q, k, v, g, beta, cu(T), s0, use_qk_l2norm=True)
    o_c, s_c = impl.chunk_gated_delta_rule(q, k, v, g, beta, cu(T), s0, use_qk_l2norm=True)
    args = (q[None], k[None], v[None], g[None], beta[None])
    kw = dict(initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    hf_o, hf_s = hf_qwen.torch_recurrent_gated_delta_rule(*args, **kw)
    hf_oc, hf_sc = hf_qwen.torch_chunk_gated_delta_rule(*args, **kw)
    for ours, theirs in ((o[None], hf_o), (o_c[None], hf_oc), (s, hf_s), (s_c, hf_sc)):
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def test_bad_gate_shape_raises(impl) -> None:
    q, k, v, g, beta = make_inputs(10)
    with pytest.raises(ValueError, match="g:"):
        impl.chunk_gated_delta_rule(q, k, v, g[..., None].expand(10, 4, 16), beta, cu(10))
