"""The clamped-SwiGLU experts (GLM-5.3-Flash's `swiglu_limit`) through `hyla.ops.moe`'s forms
with `limit`: the Triton GEMV (with and without the shared expert in it), the grouped GEMM, and
the PyTorch gathered / dense forms, against the per-expert definition
`hyla.ops.moe_clamped.reference.moe_experts_clamped` on CPU fp32 copies. A small limit (0.5)
makes the clamp bite on most gate and up values. The checks take a device:
test_moe_clamped_interpret.py runs them on CPU tensors under TRITON_INTERPRET=1.

Bounds: max |diff| / max |want| <= 1e-5 in fp32 (sums in another order), 2e-2 in bf16 (the forms
round each op to bf16, the definition here is fp32)."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.moe_clamped.reference import moe_experts_clamped

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

LIMIT = 0.5
FORMS = ("gemv", "gemv_shared", "grouped", "gathered", "dense")


def _inputs(T: int, dims, seed: int):
    num_experts, topk, dim, inter = dims
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, dim, generator=gen)
    gate_up = torch.randn(num_experts, 2 * inter, dim, generator=gen) / dim**0.5
    down = torch.randn(num_experts, dim, inter, generator=gen) / inter**0.5
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:topk] for _ in range(T)])
    w = torch.rand(T, topk, generator=gen)
    shared = (torch.randn(2 * inter, dim, generator=gen) / dim**0.5,
              torch.randn(dim, inter, generator=gen) / inter**0.5)  # fmt: skip
    return (x, gate_up, down, w, ids), shared


def _want(args, shared, with_shared: bool) -> torch.Tensor:
    from hyla.ops.activation.reference import silu_and_mul_clamped

    out = moe_experts_clamped(*args, LIMIT)
    if with_shared:
        act = silu_and_mul_clamped(args[0] @ shared[0].t(), LIMIT)
        out = out + act @ shared[1].t()
    return out


def check_clamped(form: str, T: int, dtype: torch.dtype, device) -> None:
    from hyla.ops.moe import gemv, grouped, kernels, moe_experts_and_shared

    dims = (16, 3, 64, 48) if form != "gathered" else (40, 2, 64, 48)
    args, shared = _inputs(T, dims, seed=T + len(form))
    dev = [a.to(dtype).to(device) if a.is_floating_point() else a.to(device) for a in args]
    dev[3] = args[3].to(device)  # routing weights stay fp32, as the router returns them
    dev_shared = [s.to(dtype).to(device) for s in shared]
    if form == "gemv":
        got = gemv.moe_gemv(*dev, limit=LIMIT)
    elif form == "gemv_shared":
        stacked = torch.cat([dev[1], dev_shared[0][None]])  # the shared rows with the same stride
        got = gemv.moe_gemv(*dev[:1], stacked[:-1], *dev[2:], shared=(stacked[-1], dev_shared[1]),
                            limit=LIMIT)  # fmt: skip
    elif form == "grouped":
        got = grouped.moe_experts(*dev, limit=LIMIT)
    elif form == "gathered":
        got = kernels.moe_experts(*dev, limit=LIMIT)
        assert 3 * dev[4].numel() <= dims[0]
    else:  # T k > E: the dense form (T E <= DENSE_MAX_ROWS)
        got = kernels.moe_experts(*dev, limit=LIMIT)
    want = _want(args, shared, form == "gemv_shared")
    if form == "gemv_shared" and device == "cuda":  # the public op picks the fused form
        fused = moe_experts_and_shared(*dev, *dev_shared, limit=LIMIT)
        assert torch.allclose(fused.float().cpu(), want, atol=0.05 * want.abs().max().item())
    err = float((got.float().cpu() - want).abs().max() / want.abs().max())
    assert err <= (1e-5 if dtype == torch.float32 else 2e-2), err


DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


@DTYPES
@pytest.mark.parametrize("form", FORMS)
def test_clamped_forms(form: str, dtype: torch.dtype) -> None:
    T = {"gemv": 4, "gemv_shared": 5, "grouped": 21, "gathered": 3, "dense": 9}[form]
    check_clamped(form, T, dtype, "cuda")
