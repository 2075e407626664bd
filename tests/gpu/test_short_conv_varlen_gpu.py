"""The varlen short-conv kernel (`hyla.ops.short_conv.varlen_kernels.conv_varlen_slots`: packed
prefill chunks and decodes, conv states read from and written back to pool slots) against
`cpu.causal_conv1d` on CPU copies plus the pool's index_select / index_copy_.
`check_conv_varlen` takes a device: test_short_conv_varlen_interpret.py runs it on CPU tensors
under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.short_conv.cpu import causal_conv1d

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def check_conv_varlen(
    lens: list[int],
    fresh: list[bool],
    C: int,
    W: int,
    dtype: torch.dtype,
    device,
    activation: str | None = "silu",
    has_bias: bool = True,
    seed: int = 0,
) -> tuple[float, float]:
    """(max |y - want|, max |pool - want pool|) over the step; the slots of fresh sequences hold
    NaN (must not be read), unused slots must stay untouched (compared too)."""
    gen = torch.Generator().manual_seed(seed)
    N, S = len(lens), len(lens) + 3
    slots = torch.randperm(S, generator=gen)[:N]
    pool = torch.randn(S, C, W - 1, generator=gen).to(dtype)
    for i, is_fresh in enumerate(fresh):
        if is_fresh:
            pool[slots[i]] = float("nan")
    T = sum(lens)
    x = torch.randn(T, C + 2, generator=gen).to(dtype)[:, 1 : C + 1]  # a strided view
    weight = torch.randn(C, W, generator=gen) / W**0.5
    bias = torch.randn(C, generator=gen) if has_bias else None
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    state = pool[slots].clone()
    state[torch.tensor(fresh, dtype=torch.bool)] = 0
    want_y, new_state = causal_conv1d(x, weight, bias, cu, state, activation)
    want_pool = pool.clone().index_copy_(0, slots, new_state)

    from hyla.ops.short_conv.varlen_kernels import conv_varlen_slots

    dev_pool = pool.to(device)
    has_state = torch.tensor([not f for f in fresh], device=device)
    y = conv_varlen_slots(
        x.to(device), weight.to(device), None if bias is None else bias.to(device),
        cu.to(device), dev_pool, slots.to(device), has_state, activation,
    )  # fmt: skip
    y_err = float((y.float().cpu() - want_y.float()).abs().max()) if T else 0.0
    got_pool = dev_pool.float().cpu()
    both_nan = got_pool.isnan() & want_pool.float().isnan()
    pool_err = float((got_pool - want_pool.float()).abs().masked_fill(both_nan, 0).max())
    return y_err, pool_err


CASES = [
    ([5, 1, 1, 9], [True, False, False, False]),  # prefill chunks mixed with decodes
    ([1, 2, 0, 7], [False, False, False, True]),  # chunks shorter than W - 1, an empty one
    ([40], [True]),
]


@pytest.mark.parametrize("lens,fresh", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_varlen(lens, fresh, dtype) -> None:
    bound = 1e-5 if dtype == torch.float32 else 2e-2
    y_err, pool_err = check_conv_varlen(lens, fresh, 300, 4, dtype, "cuda")
    assert y_err <= bound and pool_err == 0.0


def test_conv_varlen_no_bias_sigmoid_width_3() -> None:
    y_err, pool_err = check_conv_varlen([3, 1, 6], [False, True, False], 130, 3, torch.float32,
                                        "cuda", activation="sigmoid", has_bias=False)  # fmt: skip
    assert y_err <= 1e-5 and pool_err == 0.0


def check_step_with_boundaries(device, monkeypatch) -> tuple[float, float]:
    """`state_slots.short_conv_step` of a step with checkpoints inside its chunks on the Triton
    varlen path vs the same step on the PyTorch path (`varlen_conv_runs` forced either way):
    (max |y - want|, max |pool - want pool|); the checkpoint rows equal `conv_states_at`."""
    from hyla.forward_batch import build_forward_batch, index_tensor
    from hyla.layers import state_slots
    from hyla.ops.short_conv import conv_states_at

    gen = torch.Generator().manual_seed(1)
    lens, ctx, C, W = [40, 1, 9], [16, 5, 0], 140, 4
    marks, rows = [[2, 17, 39], [], [8]], [7, 8, 9, 10]
    pool = torch.randn(12, C, W - 1, generator=gen)
    x = torch.randn(sum(lens), C, generator=gen)
    weight = torch.randn(C, W, generator=gen) / W**0.5
    results = []
    for triton_path in (False, True):
        cache = {"conv_state": pool.clone().to(device)}
        tables = [[1 + 4 * i + j for j in range(4)] for i in range(3)]
        batch = build_forward_batch(lens, ctx, tables, [3, 1, 5], 16, [cache], device)
        batch.state_boundaries = marks
        batch.boundary_rows = index_tensor(rows, device)
        monkeypatch.setattr(state_slots, "varlen_conv_runs", lambda p, b, t=triton_path: t)
        y = state_slots.short_conv_step(x.to(device), weight.to(device), cache, batch)
        results.append((y.float().cpu(), cache["conv_state"].float().cpu()))
    (want_y, want_pool), (y, got_pool) = results
    old = pool[[3, 1, 5]].clone()
    old[2] = 0  # no context: never read
    inside = conv_states_at(x, [0, 40, 41, 50], old, marks, W)
    assert torch.equal(want_pool[rows], inside) and torch.equal(got_pool[rows], inside)
    return float((y - want_y).abs().max()), float((got_pool - want_pool).abs().max())


def test_step_with_boundaries(monkeypatch) -> None:
    y_err, pool_err = check_step_with_boundaries("cuda", monkeypatch)
    assert y_err <= 1e-5 and pool_err == 0.0
