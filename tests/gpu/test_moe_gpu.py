"""The sync-free MoE experts (`hyla.ops.moe.kernels`) on CUDA against the per-expert reference on
CPU copies: gathered (3 T k <= E), dense (T E <= `DENSE_MAX_ROWS`) and grouped forms."""

import pytest
import torch

from hyla.ops.moe import moe_experts, reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

E, K, D, I = 32, 4, 256, 96


@pytest.mark.parametrize("T", [1, 2, 64, 2000])  # E = 32, k = 4: gathered x2, dense, grouped
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
