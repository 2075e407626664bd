"""The sync-free MoE experts (`hyla.ops.moe.kernels`) on CUDA against the per-expert reference on
CPU copies: Triton GEMV (T k <= E), dense (T E <= `DENSE_MAX_ROWS`) and grouped forms; and the
Triton GEMV kernels against their PyTorch definition (`kernels._gathered` + `_weighted_sum`) on
the same device (`check_gemv` takes a device: test_moe_interpret.py runs it on CPU tensors under
TRITON_INTERPRET=1)."""

import pytest
import torch

from hyla.ops.moe import moe_experts, reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def check_gemv(T: int, dtype: torch.dtype, device, dims=(32, 4, 256, 96)) -> float:
    """`gemv.moe_gemv` vs `kernels._gathered` + `kernels._weighted_sum` on the same device and
    dtype; returns max |diff| / max |want|."""
    from hyla.ops.moe import kernels
    from hyla.ops.moe.gemv import moe_gemv

    num_experts, topk, dim, inter = dims
    gen = torch.Generator().manual_seed(T + 7)
    x = torch.randn(T, dim, generator=gen).to(dtype)
    gate_up = (torch.randn(num_experts, 2 * inter, dim, generator=gen) / dim**0.5).to(dtype)
    down = (torch.randn(num_experts, dim, inter, generator=gen) / inter**0.5).to(dtype)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:topk] for _ in range(T)])
    w = torch.rand(T, topk, generator=gen)
    args = [t.to(device) for t in (x, gate_up, down, w, ids)]
    got = moe_gemv(*args).float().cpu()
    y = kernels._gathered(args[0], args[1], args[2], args[4])
    want = kernels._weighted_sum(y, args[3], args[4], dtype).float().cpu()
    return float((got - want).abs().max() / want.abs().max())

E, K, D, I = 32, 4, 256, 96


@pytest.mark.parametrize("T", [1, 2, 8, 64, 2000])  # E = 32, k = 4: gemv x3, dense, grouped
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_experts_cuda_matches_reference(T: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(T)
    x = torch.randn(T, D, generator=gen).to(dtype)
    gate_up = (torch.randn(E, 2 * I, D, generator=gen) / D**0.5).to(dtype)
    down = (torch.randn(E, D, I, generator=gen) / I**0.5).to(dtype)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=gen)
    want = reference.moe_experts(x.float(), gate_up.float(), down.float(), w, ids)
    got = moe_experts(*(t.cuda() for t in (x, gate_up, down, w, ids))).float().cpu()
    # fp32: TF32 may be on for cuBLAS; bf16: inputs and each term rounded to bf16
    bound = 2e-3 if dtype == torch.float32 else 3e-2
    assert (got - want).abs().max() <= bound * want.abs().max()


@pytest.mark.parametrize("T", [1, 3, 8])
def test_gemv_matches_its_pytorch_definition(T: int) -> None:
    # fp32: the same fp32 sums in another order; bf16: six roundings to bf16 on the way (g, u,
    # silu, h, y, each term and add), each may flip by one ulp (2^-8) and cancel in the sum:
    # the bound of the reference test above (3e-2 of max), measured 1.2-1.7e-2 interpreted
    assert check_gemv(T, torch.float32, "cuda") <= 1e-5
    assert check_gemv(T, torch.bfloat16, "cuda") <= 3e-2
    assert check_gemv(T, torch.bfloat16, "cuda", dims=(256, 8, 512, 128)) <= 3e-2  # V3.2 E, k
