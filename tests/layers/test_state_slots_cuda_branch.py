"""`delta_rule_step`'s CUDA decode branch (`pool.is_cuda`: the recurrent op addresses the slot
pool through `state_indices`), run on the CPU: the pool is a tensor subclass that reports
`is_cuda`, while q stays a CPU tensor, so the op dispatches as on a GPU without fla (gather
the slots, run `cpu.py`, scatter the final states back). Outputs and pool == the CPU branch,
bit for bit."""

from __future__ import annotations

import pytest
import torch

from hyla.forward_batch import ForwardBatch
from hyla.layers import state_slots
from hyla.ops.gdn import chunk_gated_delta_rule, recurrent_gated_delta_rule
from hyla.ops.kda import chunk_kda, recurrent_kda


class _ReportsCuda(torch.Tensor):
    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


OPS = {
    "kda": (chunk_kda, recurrent_kda, 3),
    "gdn": (chunk_gated_delta_rule, recurrent_gated_delta_rule, 2),
}


@pytest.mark.parametrize("kind", list(OPS))
@pytest.mark.parametrize("slots", [[1, 2, 3], [3, 1, 2], [5, 0, 3]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_decode_branch_matches_cpu_branch(
    kind: str, slots: list[int], dtype: torch.dtype
) -> None:
    chunk_fn, recurrent_fn, g_dims = OPS[kind]
    N, H, HV, K, V, S = len(slots), 2, 4, 8, 8, 6
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(N, H, K, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(N, HV, V, generator=gen).to(dtype)
    g = -torch.rand((N, HV, K) if g_dims == 3 else (N, HV), generator=gen)
    beta = torch.rand(N, HV, generator=gen).to(dtype)
    pool = torch.randn(S, HV, K, V, generator=gen)

    def batch() -> ForwardBatch:
        return ForwardBatch(
            positions=torch.full((N,), 4),
            cu_seqlens=torch.arange(N + 1, dtype=torch.int32),
            query_lens=[1] * N,
            context_lens=[4] * N,
            block_tables=torch.zeros(N, 1, dtype=torch.int32),
            slot_mapping=torch.arange(N),
            state_indices=torch.tensor(slots),
            state_indices_host=list(slots),
            block_size=16,
        )

    want_pool = pool.clone()
    want = state_slots.delta_rule_step(
        chunk_fn, recurrent_fn, q, k, v, g, beta, {"recurrent_state": want_pool}, batch()
    )
    cuda_pool = pool.clone().as_subclass(_ReportsCuda)
    assert cuda_pool.is_cuda and not q.is_cuda
    got = state_slots.delta_rule_step(
        chunk_fn, recurrent_fn, q, k, v, g, beta, {"recurrent_state": cuda_pool}, batch()
    )
    assert torch.equal(got.as_subclass(torch.Tensor), want)
    assert torch.equal(cuda_pool.as_subclass(torch.Tensor), want_pool)
    untouched = [s for s in range(S) if s not in slots]
    assert torch.equal(want_pool[untouched], pool[untouched])
    assert not torch.equal(want_pool[slots], pool[slots])
