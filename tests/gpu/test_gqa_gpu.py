"""The paged prefill GQA kernel (`hyla.ops.gqa.kernels.paged_gqa`: varlen causal queries over paged
K/V through block tables, GQA head groups) against the dense masked reference
(`reference.paged_gqa`) on the same device. `check_paged_gqa` takes a device:
test_gqa_interpret.py runs it on CPU tensors under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.gqa import reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def check_paged_gqa(
    q_lens: list[int],
    contexts: list[int],
    heads: tuple[int, int],
    dims: tuple[int, int],
    dtype: torch.dtype,
    device,
    page: int = 4,
    seed: int = 0,
    lens_as_tensor: bool = False,
) -> float:
    """max |kernel - reference| / max |reference|. The cache's slots that no sequence owns hold
    NaN (must never be read); block tables are shuffled pages."""  # fmt: skip
    from hyla.ops.gqa.kernels import paged_gqa

    gen = torch.Generator().manual_seed(seed)
    H, HKV = heads
    DK, DV = dims
    seq_lens = [c + n for c, n in zip(contexts, q_lens, strict=True)]
    pages = [-(-n // page) for n in seq_lens]
    num_pages = sum(pages) + 2
    order = torch.randperm(num_pages, generator=gen).tolist()
    width = max(pages + [1])
    tables = torch.zeros(len(q_lens), width, dtype=torch.int32)
    k_cache = torch.full((num_pages, page, HKV, DK), float("nan"))
    v_cache = torch.full((num_pages, page, HKV, DV), float("nan"))
    used = 0
    for i, (n, p) in enumerate(zip(seq_lens, pages, strict=True)):
        ids = order[used : used + p]
        used += p
        tables[i, :p] = torch.tensor(ids, dtype=torch.int32)
        for j in range(n):
            k_cache[ids[j // page], j % page] = torch.randn(HKV, DK, generator=gen)
            v_cache[ids[j // page], j % page] = torch.randn(HKV, DV, generator=gen)
    q = torch.randn(sum(q_lens), H, DK, generator=gen)
    cu = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    args = [t.to(device) for t in (q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), tables, cu)]
    scale = DK**-0.5
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device) if lens_as_tensor else seq_lens
    got = paged_gqa(*args, lens, scale).float().cpu()
    want = reference.paged_gqa(*args, seq_lens, scale).float().cpu()
    assert got.shape == want.shape and not got.isnan().any()
    return float((got - want).abs().max() / want.abs().max())


CASES = [  # (query lengths, context before them): prefill chunks, decodes, an empty sequence
    ([70, 1, 1, 5], [0, 9, 30, 3]),
    ([1, 0, 130], [3, 2, 20]),
]


@pytest.mark.parametrize("q_lens,contexts", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_gqa(q_lens, contexts, dtype) -> None:
    bound = 1e-4 if dtype == torch.float32 else 3e-2
    assert check_paged_gqa(q_lens, contexts, (4, 2), (64, 64), dtype, "cuda") <= bound


def test_paged_gqa_qwen3_next_shape() -> None:
    """head_dim 256, 16 query heads over 2 kv heads, 16-token pages, lengths as a tensor."""
    err = check_paged_gqa([300, 1, 40], [0, 500, 100], (16, 2), (256, 256), torch.bfloat16,
                          "cuda", page=16, lens_as_tensor=True)  # fmt: skip
    assert err <= 3e-2


def test_dispatch_takes_the_kernel_on_cuda() -> None:
    from hyla.ops import gqa

    assert gqa.paged_gqa.__module__ == "hyla.ops.gqa"
    assert check_paged_gqa([9, 1], [0, 4], (2, 1), (32, 32), torch.float32, "cuda") <= 1e-4
