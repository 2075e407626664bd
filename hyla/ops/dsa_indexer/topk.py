"""Top-k of the indexer's int64 sort keys by a Triton radix select (fixed grids, no host reads):
pass p histograms digit p of the keys matching the row's prefix, and the row's last program
extends the prefix by the k-th largest key's bin; keys >= prefix are then gathered and sorted."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyla.ops.dsa_indexer.select import INVISIBLE

_MIN_VISIBLE = -(1 << 62)
_KEY_BITS = 63  # a visible key minus _MIN_VISIBLE

RADIX_BITS = 8  # 256 bins: tl.histogram's cost grows with the bin count
BLOCK_L = 4096
NUM_WARPS = 8
SORT_WARPS = 8


def radix_topk_columns(keys: torch.Tensor, row_pos: torch.Tensor, topk: int) -> torch.Tensor:
    """keys: [R, L] int64 (unit stride along L), row_pos: [R]. Raises ValueError for bad shapes,
    topk < 1, or more than 65535 rows (the grid limit)."""
    _check(keys, row_pos, topk)
    num_rows, num_cols = keys.shape
    out = torch.empty(num_rows, topk, dtype=torch.int32, device=keys.device)
    if num_rows == 0 or num_cols == 0:
        return out.fill_(-1)
    keys = keys if keys.stride(1) == 1 else keys.contiguous()
    passes = digit_shifts()
    state, hist, arrived, num_selected = _scratch(len(passes), num_rows, keys.device)
    capacity = triton.next_power_of_2(topk)
    selected = torch.empty(num_rows, capacity, dtype=torch.int64, device=keys.device)
    grid = (triton.cdiv(num_cols, BLOCK_L), num_rows)
    for p, (shift, prev_shift) in enumerate(passes):
        _radix_pass_kernel[grid](
            keys, hist[p], arrived[p], state, num_cols, keys.stride(0), topk, p, shift,
            prev_shift, int(p == len(passes) - 1), NUM_BINS=1 << RADIX_BITS, BLOCK=BLOCK_L,
            MIN_VISIBLE=_MIN_VISIBLE, num_warps=NUM_WARPS,
        )  # fmt: skip
    _gather_kernel[grid](
        keys, state, num_selected, selected, num_cols, keys.stride(0), CAPACITY=capacity,
        BLOCK=BLOCK_L, MIN_VISIBLE=_MIN_VISIBLE, num_warps=NUM_WARPS,
    )  # fmt: skip
    _sort_columns_kernel[(num_rows,)](
        selected, num_selected, row_pos.contiguous(), out, num_cols, topk, CAPACITY=capacity,
        INVISIBLE=INVISIBLE, num_warps=SORT_WARPS,
    )  # fmt: skip
    return out


def digit_shifts(radix_bits: int | None = None) -> list[tuple[int, int]]:
    """(shift of digit p, shift of digit p - 1) per pass; the last digit may overlap the one
    before it (its shared bits are fixed by the prefix). Digit -1 is the sign: shift 63."""
    bits = RADIX_BITS if radix_bits is None else radix_bits
    shifts = [*range(_KEY_BITS - bits, 0, -bits), 0]
    return list(zip(shifts, [_KEY_BITS, *shifts[:-1]], strict=True))


def _check(keys: torch.Tensor, row_pos: torch.Tensor, topk: int) -> None:
    if keys.dtype != torch.int64 or keys.dim() != 2:
        raise ValueError(f"radix_topk_columns: keys must be [R, L] int64, got {keys.dtype} "
                         f"{tuple(keys.shape)}")  # fmt: skip
    if row_pos.shape != (keys.shape[0],):
        raise ValueError(f"radix_topk_columns: row_pos {tuple(row_pos.shape)} for "
                         f"{keys.shape[0]} rows")  # fmt: skip
    if topk < 1:
        raise ValueError(f"radix_topk_columns: topk must be >= 1, got {topk}")
    if keys.shape[0] > 65535:
        raise ValueError(f"radix_topk_columns: at most 65535 rows, got {keys.shape[0]}")


def _scratch(num_passes: int, num_rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """One zeroed buffer: [R, 3] state, then per-pass histograms, arrivals and counts."""
    num_bins = 1 << RADIX_BITS
    num_counters = num_passes * num_rows * (num_bins + 1) + num_rows
    buf = torch.zeros(3 * num_rows + (num_counters + 1) // 2, dtype=torch.int64, device=device)
    state = buf[: 3 * num_rows].view(num_rows, 3)
    counters = buf[3 * num_rows :].view(torch.int32)
    hist_size = num_passes * num_rows * num_bins
    hist = counters[:hist_size].view(num_passes, num_rows, num_bins)
    arrived = counters[hist_size : hist_size + num_passes * num_rows].view(num_passes, num_rows)
    return state, hist, arrived, counters[hist_size + num_passes * num_rows :][:num_rows]


@triton.jit
def _radix_pass_kernel(
    keys_ptr,
    hist_ptr,
    arrived_ptr,
    state_ptr,
    num_cols,
    stride_row,
    topk,
    pass_idx,
    shift,
    prev_shift,
    is_last,
    NUM_BINS: tl.constexpr,
    BLOCK: tl.constexpr,
    MIN_VISIBLE: tl.constexpr,
):
    pid = tl.program_id(0)
    row = tl.program_id(1)
    state = state_ptr + row * 3  # prefix, still needed, done
    if tl.load(state + 2) == 0:
        cols = pid * BLOCK + tl.arange(0, BLOCK)
        key_row = keys_ptr + row.to(tl.int64) * stride_row
        key = tl.load(key_row + cols, mask=cols < num_cols, other=MIN_VISIBLE - 1)
        v = key - MIN_VISIBLE  # visible: [0, 2^63); invisible or padding: -1
        prefix = tl.load(state)
        is_candidate = (v >> prev_shift) == (prefix >> prev_shift)
        digit = ((v >> shift) & (NUM_BINS - 1)).to(tl.int32)
        hist_row = hist_ptr + row * NUM_BINS
        if tl.max(is_candidate.to(tl.int32), 0) > 0:  # after 2 passes most blocks have none
            counts = tl.histogram(digit, NUM_BINS, mask=is_candidate)
            bins = tl.arange(0, NUM_BINS)
            tl.atomic_add(hist_row + bins, counts, mask=counts > 0)
        # every thread's histogram atomics happen before the arrival that may trigger the scan
        tl.debug_barrier()
        if tl.atomic_add(arrived_ptr + row, 1) == tl.num_programs(0) - 1:
            _pick_bin(hist_row, state, topk, pass_idx, shift, is_last, NUM_BINS)


@triton.jit
def _pick_bin(hist_row, state, topk, pass_idx, shift, is_last, NUM_BINS: tl.constexpr):
    """The row's last program: the bin of the k-th largest candidate becomes part of the prefix."""
    bins = tl.arange(0, NUM_BINS)
    counts = tl.atomic_add(hist_row + bins, tl.zeros([NUM_BINS], tl.int32))  # coherent read
    total = tl.sum(counts, 0)
    needed = tl.minimum(total, topk)  # pass 0: every visible key is a candidate
    if pass_idx > 0:
        needed = tl.load(state + 1).to(tl.int32)
    at_or_above = total - tl.cumsum(counts, 0) + counts  # candidates in bins >= b
    pick = tl.sum((at_or_above >= needed).to(tl.int32), 0) - 1
    in_bin = tl.sum(tl.where(bins == pick, counts, 0), 0)
    needed -= tl.sum(tl.where(bins == pick, at_or_above, 0), 0) - in_bin
    tl.store(state, tl.load(state) | (pick.to(tl.int64) << shift))
    tl.store(state + 1, needed.to(tl.int64))
    tl.store(state + 2, ((in_bin == needed) | (is_last != 0)).to(tl.int64))


@triton.jit
def _gather_kernel(
    keys_ptr,
    state_ptr,
    num_selected_ptr,
    selected_ptr,
    num_cols,
    stride_row,
    CAPACITY: tl.constexpr,
    BLOCK: tl.constexpr,
    MIN_VISIBLE: tl.constexpr,
):
    pid = tl.program_id(0)
    row = tl.program_id(1)
    cols = pid * BLOCK + tl.arange(0, BLOCK)
    key_row = keys_ptr + row.to(tl.int64) * stride_row
    key = tl.load(key_row + cols, mask=cols < num_cols, other=MIN_VISIBLE - 1)
    is_selected = (key - MIN_VISIBLE) >= tl.load(state_ptr + row * 3)
    flags = is_selected.to(tl.int32)
    count = tl.sum(flags, 0)
    if count > 0:
        dest = tl.atomic_add(num_selected_ptr + row, count) + tl.cumsum(flags, 0) - 1
        out_row = selected_ptr + row.to(tl.int64) * CAPACITY
        # dest < CAPACITY always holds for unique visible keys; the mask guards bad input
        tl.store(out_row + dest, key, mask=is_selected & (dest < CAPACITY))


@triton.jit
def _sort_columns_kernel(
    selected_ptr,
    num_selected_ptr,
    row_pos_ptr,
    out_ptr,
    num_cols,
    topk,
    CAPACITY: tl.constexpr,
    INVISIBLE: tl.constexpr,
):
    row = tl.program_id(0)
    rank = tl.arange(0, CAPACITY)
    num_selected = tl.load(num_selected_ptr + row)
    sel_row = selected_ptr + row.to(tl.int64) * CAPACITY
    key = tl.load(sel_row + rank, mask=rank < num_selected, other=INVISIBLE)
    key = tl.sort(key, descending=True)
    cols = (0x7FFFFFFF - (key & 0x7FFFFFFF)).to(tl.int32)
    keep = (rank <= tl.load(row_pos_ptr + row)) & (rank < num_cols)
    out_row = out_ptr + row.to(tl.int64) * topk
    tl.store(out_row + rank, tl.where(keep, cols, -1), mask=rank < topk)
