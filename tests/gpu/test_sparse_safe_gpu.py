"""The safe sparse MLA (`sparse_mla(..., seq_lens=...)`) through the Triton path against the
reference on fp32 CPU copies: selections with duplicates, future and out-of-range entries and
empty rows (as GLM-5.3-Flash's pooled indexer builds them), with and without rope channels
(GLM's DSA layers are NoPE: Dr = 0). Bounds: relative error <= 1e-5 in fp32, 2e-2 in bf16;
empty rows exactly 0. `test_sparse_safe_interpret.py` runs the same checks under the Triton
interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.sparse_attention import kernel_sparse_mla
from hyla.ops.sparse_attention import reference as sparse_ref
from tests.gpu.test_dsa_gpu import cu_seqlens, paged_cache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

NOPE = (4, 16, 0, 16, 32)  # (H, Dn, Dr, Dv, R): GLM's tiny model
ROPE = (4, 16, 8, 16, 32)
SEQ_LENS, QUERY_LENS = [1, 5, 40, 70, 33], [1, 5, 6, 1, 2]


def defective_selection(seq_lens, query_lens, width, gen) -> torch.Tensor:
    """Per row: random entries in [-3, L + 3] (duplicates, future, past the end, < -1), and
    every fifth row empty."""
    rows = []
    for n, q in zip(seq_lens, query_lens, strict=True):
        for _ in range(q):
            row = torch.randint(-3, n + 4, (width,), generator=gen)
            rows.append(row if len(rows) % 5 else torch.full((width,), -1))
    return torch.stack(rows).int()


def check_safe_sparse_mla(dims, dtype, device, seed: int = 0) -> float:
    num_heads, dn, dr, dv, rank = dims
    gen = torch.Generator().manual_seed(seed)
    cache, tables, _ = paged_cache(SEQ_LENS, rank + dr, dtype, 16, device, gen)
    num_rows = sum(QUERY_LENS)
    selection = defective_selection(SEQ_LENS, QUERY_LENS, 24, gen)
    q_nope = torch.randn(num_rows, num_heads, dn, generator=gen).to(dtype)
    q_rope = torch.randn(num_rows, num_heads, dr, generator=gen).to(dtype)
    kv_b = (torch.randn(num_heads * (dn + dv), rank, generator=gen) / rank**0.5).to(dtype)
    cu, scale = cu_seqlens(QUERY_LENS, device), (dn + dr) ** -0.5
    lens = torch.tensor(SEQ_LENS, dtype=torch.int32)
    got = kernel_sparse_mla(
        q_nope.to(device), q_rope.to(device), cache, tables, cu, selection.to(device),
        kv_b.to(device), scale, lens.to(device),
    ).cpu().float()  # fmt: skip
    want = sparse_ref.sparse_mla(
        q_nope.float(), q_rope.float(), cache.cpu().float(), tables.cpu(), cu.cpu(), selection,
        kv_b.float(), scale, lens,
    )  # fmt: skip
    assert not got.isnan().any()
    empty = want.flatten(1).abs().amax(1) == 0
    assert empty.any() and torch.equal(got[empty], torch.zeros_like(got[empty]))
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("dims", [NOPE, ROPE], ids=["nope", "rope"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_safe_sparse_mla(dims, dtype):
    bound = 1e-5 if dtype == torch.float32 else 2e-2
    assert check_safe_sparse_mla(dims, dtype, "cuda") <= bound
