"""`hyla.ops.moe.grouped.align` in one Triton program instead of ~25 small PyTorch kernels.
The program reads back scratch it wrote across threads, so `tl.debug_barrier` orders the steps."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_PAIRS = 2048  # one program (one warp) sorts all pairs; more use the PyTorch form
MAX_EXPERTS = 1024
MIN_WIDTH = 32  # every block at least one warp wide: no element held by two threads


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _align_kernel(
    ids_ptr, pairs_ptr, block_expert_ptr, scratch_ptr,
    P, E, NUM_BLOCKS,
    BLOCK_M: tl.constexpr, P2: tl.constexpr, E2: tl.constexpr, NB2: tl.constexpr,
):  # fmt: skip
    offs_p = tl.arange(0, P2)
    valid = offs_p < P
    ids = tl.load(ids_ptr + offs_p, mask=valid, other=0).to(tl.int32)
    offs_e = tl.arange(0, E2)
    counts = tl.histogram(tl.where(valid, ids, 0), E2)
    counts = tl.where(offs_e == 0, counts - (P2 - P), counts)  # the padding counted as id 0
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    block_start = tl.cumsum(blocks, 0) - blocks
    pair_start = tl.cumsum(counts, 0) - counts
    tl.store(scratch_ptr + offs_e, block_start)
    tl.store(scratch_ptr + E2 + offs_e, pair_start)
    offs_b = tl.arange(0, NB2)
    tl.store(block_expert_ptr + offs_b, tl.full([NB2], -1, tl.int64), mask=offs_b < NUM_BLOCKS)
    for i0 in range(0, NUM_BLOCKS * BLOCK_M, P2):
        fill = i0 + offs_p
        tl.store(pairs_ptr + fill, tl.full([P2], 0, tl.int64) + P, mask=fill < NUM_BLOCKS * BLOCK_M)
    tl.debug_barrier()
    has_pairs = (counts > 0) & (offs_e < E)
    tl.store(block_expert_ptr + block_start, offs_e.to(tl.int64), mask=has_pairs)
    keys = tl.sort(tl.where(valid, ids, E2) * P2 + offs_p)  # invalid entries sort last
    e_sorted, p_sorted = keys // P2, keys % P2
    first_block = tl.load(scratch_ptr + e_sorted, mask=valid, other=0)
    first_pair = tl.load(scratch_ptr + E2 + e_sorted, mask=valid, other=0)
    dest = first_block * BLOCK_M + (offs_p - first_pair)
    tl.store(pairs_ptr + dest, p_sorted.to(tl.int64), mask=valid)
    tl.debug_barrier()
    marks = tl.load(block_expert_ptr + offs_b, mask=offs_b < NUM_BLOCKS, other=-1)
    filled = tl.associative_scan(marks, 0, _max)
    total = tl.sum(blocks, 0)
    tl.store(block_expert_ptr + offs_b, tl.where(offs_b < total, filled, -1),
             mask=offs_b < NUM_BLOCKS)  # fmt: skip


def fits(num_pairs: int, num_experts: int) -> bool:
    return 0 < num_pairs <= MAX_PAIRS and num_experts <= MAX_EXPERTS


def align(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`hyla.ops.moe.grouped.align` (same outputs); needs `fits(P, E)`."""
    flat = topk_ids.reshape(-1)
    P, device = flat.numel(), flat.device
    num_blocks = triton.cdiv(P, block_m) + num_experts
    pairs = torch.empty(num_blocks * block_m, dtype=torch.long, device=device)
    block_expert = torch.empty(num_blocks, dtype=torch.long, device=device)
    e2 = max(MIN_WIDTH, triton.next_power_of_2(num_experts))
    scratch = torch.empty(2 * e2, dtype=torch.int32, device=device)
    _align_kernel[(1,)](
        flat, pairs, block_expert, scratch, P, num_experts, num_blocks,
        BLOCK_M=block_m, P2=max(MIN_WIDTH, triton.next_power_of_2(P)), E2=e2,
        NB2=max(MIN_WIDTH, triton.next_power_of_2(num_blocks)), num_warps=1,
    )  # fmt: skip
    return pairs, block_expert
