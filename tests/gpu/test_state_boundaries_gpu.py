"""States at interior boundaries on CUDA (fla path: `kernels.chunk_*` split into rounds of fla
calls at the boundaries, `hyla.ops.kda.boundaries`) vs the fp32 token-by-token recurrence on
the CPU run over exactly the first b tokens of each sequence. Bounds are the fp32 chunk bounds
of tests/gpu/test_linear_attention_gpu.py (TF32 matmuls in fla's chunk kernels)."""

from __future__ import annotations

import pytest
import torch

from hyla.ops import gdn, kda
from hyla.ops.gdn import reference as gdn_reference
from hyla.ops.kda import kernels
from hyla.ops.kda import reference as kda_reference
from hyla.ops.short_conv import causal_conv1d, conv_states_at

HAS_CUDA = torch.cuda.is_available()
pytestmark = [
    pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA"),
    pytest.mark.skipif(HAS_CUDA and not kernels.fla_available(), reason="needs fla-core"),
]
RMS, MAX = 3e-3, 1e-2
OPS = {
    "kda": (kda.chunk_kda, kda_reference.recurrent_kda, True),
    "gdn": (gdn.chunk_gated_delta_rule, gdn_reference.recurrent_gated_delta_rule, False),
}
# a 2,048-token chunk with every 256-multiple, one starting mid-stride, one without boundaries;
# "short": a last round of at most 16 tokens per sequence (`SHORT_ROUND_TOKENS`), which runs
# fla's fused recurrent kernel instead of the chunk pipeline (a prompt's last block)
CASES = {
    "long": ([2048, 700, 5], [[256 * j for j in range(1, 8)], [60, 316, 572], []]),
    "short": ([2048, 40], [[1792, 2032], [24]]),
}


def _cu(lens: list[int], device: str = "cpu") -> torch.Tensor:
    return torch.tensor([0, *lens]).cumsum(0).to(torch.int32).to(device)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    err = (got.float().cpu() - want).abs()
    scale = want.abs().max().clamp_min(1e-6)
    rms = (err.pow(2).mean().sqrt() / want.pow(2).mean().sqrt().clamp_min(1e-6)).item()
    assert rms < RMS and (err.max() / scale).item() < MAX, (rms, (err.max() / scale).item())


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("op", OPS)
def test_boundary_states_match_recurrence_over_prefix(op: str, case: str) -> None:
    chunk_fn, recurrent_fn, per_channel = OPS[op]
    lens, marks = CASES[case]
    gen = torch.Generator().manual_seed(0)
    T, H, HV, K, V = sum(lens), 2, 4, 64, 64
    q, k = (torch.randn(T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(T, HV, V, generator=gen)
    A = torch.rand(HV, 1, generator=gen) * 2.7
    g = -A.exp() * torch.nn.functional.softplus(torch.randn(T, HV, K, generator=gen) - 3)
    g = g if per_channel else g[..., 0]
    beta = torch.rand(T, HV, generator=gen)
    s0 = torch.randn(len(lens), HV, K, V, generator=gen) * 0.3
    M = sum(len(m) for m in marks)
    out = torch.full((M, HV, K, V), float("nan"), device="cuda")
    dev = [x.cuda() for x in (q, k, v, g, beta)]
    o, final = chunk_fn(
        *dev, _cu(lens, "cuda"), s0.cuda(), use_qk_l2norm=True, cu_seqlens_cpu=_cu(lens),
        state_boundaries=marks, boundary_states=out,
    )  # fmt: skip
    o_ref, final_ref = recurrent_fn(q, k, v, g, beta, _cu(lens), s0, use_qk_l2norm=True)
    _close(o, o_ref)
    _close(final, final_ref)
    starts, row = _cu(lens).tolist(), 0
    for i, bs in enumerate(marks):
        for b in bs:
            rows = slice(starts[i], starts[i] + b)
            pre = (q[rows], k[rows], v[rows], g[rows], beta[rows])
            _, want = recurrent_fn(*pre, _cu([b]), s0[i : i + 1], use_qk_l2norm=True)
            _close(out[row], want[0])
            row += 1


def test_conv_states_at_on_cuda() -> None:
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(300, 8, generator=gen), torch.randn(8, 4, generator=gen)
    state = torch.randn(1, 8, 3, generator=gen)
    got = conv_states_at(x.cuda(), [0, 300], state.cuda(), [[2, 256]], 4)
    for row, b in enumerate([2, 256]):
        _, want = causal_conv1d(x[:b], w, None, _cu([b]), state)
        assert torch.equal(got[row].cpu(), want[0])
