"""The grouped-GEMM MoE experts (`hyla.ops.moe.grouped`: device-side align, one Triton launch per
projection, ordered combine) against the per-expert reference (`reference.moe_experts`) on the
same device and dtype; `check_align` checks the sorted layout against a host-built one.
test_moe_grouped_interpret.py runs the same checks on CPU tensors under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.moe import reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def moe_inputs(T: int, dims: tuple[int, int, int, int], dtype: torch.dtype, device, seed=0):
    """x [T, D], gate_up [E, 2I, D], down [E, D, I], weights [T, k] fp32, ids [T, k] distinct."""
    num_experts, topk, dim, inter = dims
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, dim, generator=gen).to(dtype)
    gate_up = (torch.randn(num_experts, 2 * inter, dim, generator=gen) / dim**0.5).to(dtype)
    down = (torch.randn(num_experts, dim, inter, generator=gen) / inter**0.5).to(dtype)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:topk] for _ in range(T)])
    w = torch.rand(T, topk, generator=gen)
    return [t.to(device) for t in (x, gate_up, down, w, ids)]


def check_grouped(T: int, dtype: torch.dtype, device, dims=(16, 4, 96, 80), seed=0) -> float:
    """max |grouped - reference| / max |reference| on the same device."""
    from hyla.ops.moe.grouped import moe_experts

    args = moe_inputs(T, dims, dtype, device, seed)
    got = moe_experts(*args).float().cpu()
    want = reference.moe_experts(*args).float().cpu()
    assert got.shape == want.shape
    return float((got - want).abs().max() / want.abs().max())


def check_align(T: int, num_experts: int, topk: int, device, block_m: int = 4) -> None:
    """Every pair appears once, in its expert's run of blocks, runs in expert order, each
    expert's pairs in flat order; padding entries are P; blocks past the end are -1."""
    from hyla.ops.moe.grouped import align

    gen = torch.Generator().manual_seed(T)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:topk] for _ in range(T)])
    pairs, block_expert = align(ids.to(device), num_experts, block_m)
    pairs, block_expert, flat = pairs.cpu(), block_expert.cpu(), ids.reshape(-1)
    P = flat.numel()
    assert block_expert.numel() == -(-P // block_m) + num_experts
    want_pairs, want_experts = [], []
    for e in range(num_experts):
        mine = [p for p in range(P) if int(flat[p]) == e]
        blocks = -(-len(mine) // block_m)
        want_pairs += mine + [P] * (blocks * block_m - len(mine))
        want_experts += [e] * blocks
    n = len(want_experts)
    assert block_expert[:n].tolist() == want_experts
    assert (block_expert[n:] == -1).all()
    assert pairs[: n * block_m].tolist() == want_pairs


@pytest.mark.parametrize("T", [1, 37, 300])
def test_grouped_bf16(T: int) -> None:
    assert check_grouped(T, torch.bfloat16, "cuda", dims=(32, 4, 256, 192)) <= 2e-2


def test_grouped_fp32_uneven_tiles() -> None:
    assert check_grouped(70, torch.float32, "cuda", dims=(16, 3, 200, 72)) <= 1e-5


def test_align_layout() -> None:
    check_align(50, 8, 3, "cuda")
    check_align(3, 16, 2, "cuda", block_m=64)


def test_grouped_in_a_cuda_graph() -> None:
    """Captured once, replayed with new routing: equals an eager call (no host sync inside)."""
    from hyla.ops.moe.grouped import moe_experts

    x, gate_up, down, w, ids = moe_inputs(64, (32, 4, 128, 64), torch.bfloat16, "cuda")
    moe_experts(x, gate_up, down, w, ids)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_experts(x, gate_up, down, w, ids)
    x2, _, _, w2, ids2 = moe_inputs(64, (32, 4, 128, 64), torch.bfloat16, "cuda", seed=5)
    x.copy_(x2), w.copy_(w2), ids.copy_(ids2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, moe_experts(x, gate_up, down, w, ids))


def test_dispatch_takes_grouped_for_large_steps() -> None:
    """`hyla.ops.moe.moe_experts` on CUDA beyond the dense limit runs the grouped form."""
    from hyla.ops.moe import moe_experts

    args = moe_inputs(600, (32, 4, 128, 64), torch.bfloat16, "cuda")
    got = moe_experts(*args).float().cpu()
    want = reference.moe_experts(*args).float().cpu()
    assert float((got - want).abs().max() / want.abs().max()) <= 2e-2
