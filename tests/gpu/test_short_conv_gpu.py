"""The short-conv decode kernel (`hyla.ops.short_conv.kernels.conv_update_slots`) on CUDA
against `cpu.causal_conv1d` on CPU copies plus an index_select / index_copy_ of the slot pool;
and under CUDA-graph capture and replay. `check_conv_update_slots` takes a device:
test_short_conv_interpret.py runs it on CPU tensors under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.short_conv.cpu import causal_conv1d

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

ACTIVATIONS = ["silu", "sigmoid", None]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float tensor (NaN == NaN)."""
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


def _problem(N: int, C: int, W: int, dtype: torch.dtype, has_bias: bool, seed: int):
    """x [N, C] (a strided view), weight [C, W], bias, a pool of N + 4 slots whose unused rows
    are NaN / 1e30 / -inf, and unsorted distinct slots."""
    gen = torch.Generator().manual_seed(seed)
    S = N + 4
    slots = torch.randperm(S, generator=gen)[:N]
    pool = torch.randn(S, C, W - 1, generator=gen).to(dtype)
    unused = [s for s in range(S) if s not in slots.tolist()]
    for k, s in enumerate(unused):
        pool[s] = (float("nan"), 1e30, float("-inf"))[k % 3]
    x = torch.randn(N, C + 3, generator=gen).to(dtype)[:, 1 : C + 1]  # row stride C + 3
    weight = torch.randn(C, W, generator=gen) / W**0.5
    bias = torch.randn(C, generator=gen) if has_bias else None
    return x, weight, bias, pool, slots


def _want(x, weight, bias, pool, slots, activation):
    N = x.shape[0]
    cu = torch.arange(N + 1, dtype=torch.int32)
    y, new_state = causal_conv1d(x, weight, bias, cu, pool.index_select(0, slots), activation)
    return y, pool.clone().index_copy_(0, slots, new_state)


def _assert_y_close(got: torch.Tensor, want: torch.Tensor) -> float:
    """fp32: within 1e-6 relative (the same sum order; exp, and a GPU's fused multiply-adds,
    may round differently); 16-bit outputs: within one ulp. Returns max |diff|."""
    assert got.dtype == want.dtype and got.shape == want.shape
    rel = 1e-6 if want.dtype == torch.float32 else 2.0**-7  # bf16 ulp <= 2^-7 relative
    got, want = got.float(), want.float()
    diff = (got - want).abs()
    bound = rel * want.abs() + 1e-6 * want.abs().max()
    assert (diff <= bound).all(), f"max diff {diff.max()}"
    return float(diff.max())


def check_conv_update_slots(
    N: int,
    C: int,
    W: int,
    dtype: torch.dtype,
    has_bias: bool,
    activation: str | None,
    device,
    *,
    index_dtype: torch.dtype = torch.long,
    seed: int = 0,
) -> float:
    """Kernel on `device` vs the CPU reference: y within `_assert_y_close`, every pool row bit
    for bit (unused rows untouched, used rows the reference's new state). Returns max |dy|."""
    from hyla.ops.short_conv.kernels import conv_update_slots

    x, weight, bias, pool, slots = _problem(N, C, W, dtype, has_bias, seed)
    want_y, want_pool = _want(x, weight, bias, pool, slots, activation)
    dev = [t.to(device) if t is not None else None for t in (x, weight, bias, pool)]
    got_pool = dev[3]
    got_y = conv_update_slots(
        dev[0], dev[1], dev[2], got_pool, slots.to(device, index_dtype), activation
    )
    assert torch.equal(_bits(got_pool.cpu()), _bits(want_pool))
    return _assert_y_close(got_y.cpu(), want_y)


@pytest.mark.parametrize("N", [1, 3, 17, 256])
@pytest.mark.parametrize("C", [5, 200, 4096 + 96])
@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_conv_update_slots_matches_reference(N, C, W, dtype, activation) -> None:
    check_conv_update_slots(N, C, W, dtype, N % 2 == 1, activation, "cuda")
    check_conv_update_slots(N, C, W, dtype, N % 2 == 0, activation, "cuda", index_dtype=torch.int32)


def test_mixed_dtypes_bf16_x_fp32_pool_and_weight() -> None:
    from hyla.ops.short_conv.kernels import conv_update_slots

    x, weight, bias, pool, slots = _problem(9, 300, 4, torch.float32, True, 3)
    x = x.bfloat16()
    want_y, want_pool = _want(x, weight.bfloat16(), bias, pool, slots, "silu")
    got_pool = pool.cuda()
    got_y = conv_update_slots(
        x.cuda(), weight.bfloat16().cuda(), bias.cuda(), got_pool, slots.cuda(), "silu"
    )
    assert torch.equal(_bits(got_pool.cpu()), _bits(want_pool))
    _assert_y_close(got_y.cpu(), want_y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_graph_capture_and_replay(dtype: torch.dtype) -> None:
    """Captured once; each replay reads new tokens and new slots from the static inputs."""
    from hyla.ops.short_conv.kernels import conv_update_slots

    N, C, W = 5, 700, 4
    x, weight, bias, pool, slots = _problem(N, C, W, dtype, True, 0)
    pool = torch.randn(pool.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    static = {"x": x.cuda(), "slots": slots.cuda(), "pool": pool.cuda()}
    w, b = weight.cuda(), bias.cuda()
    conv_update_slots(static["x"], w, b, static["pool"], static["slots"], "silu")  # warm up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = conv_update_slots(static["x"], w, b, static["pool"], static["slots"], "silu")
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        host_pool = static["pool"].cpu()
        x_new = torch.randn(N, C, generator=gen).to(dtype)
        slots_new = torch.randperm(pool.shape[0], generator=gen)[:N]
        static["x"].copy_(x_new)
        static["slots"].copy_(slots_new)
        graph.replay()
        want_y, want_pool = _want(x_new, weight, bias, host_pool, slots_new, "silu")
        assert torch.equal(_bits(static["pool"].cpu()), _bits(want_pool))
        _assert_y_close(static_y.cpu(), want_y)
