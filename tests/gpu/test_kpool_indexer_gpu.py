"""The pooled DSA indexer's kernels (`hyla.ops.kpool_indexer.kernels`) against its PyTorch
definition (`reference.py`) on the same device: pool keys written through shuffled block tables,
and the selection of decode rows and of prefill chunks (eager top-k and the captured steps'
radix select), caches poisoned with NaN outside the sequences. The checks take a device:
test_kpool_indexer_interpret.py runs them on CPU tensors under TRITON_INTERPRET=1.

Pool keys: fp32 to 1e-5; bf16 to 2 ulps plus 2^-5 absolute (each of the P products is rounded to
bf16, and the interpreter truncates where the GPU rounds, so a sum of terms of either sign can
differ by a few ulps of its largest term, |key| <~ 4). Selections: equal (random scores have no
near-ties at these sizes; the kernel's fp32 head sum only runs in another order)."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.kpool_indexer import reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

HI, DI, PAGE = 4, 16, 8
CASES = {  # name: (seq_lens, new tokens per sequence, kpool, topk)
    "decode": ([37, 5, 64, 16], [1, 1, 1, 1], 4, 8),
    "prefill": ([23, 9, 40], [23, 4, 17], 4, 8),
    "kpool3": ([30, 2], [1, 2], 3, 6),
    "few_pools": ([9, 6], [1, 2], 4, 64),  # more pools asked for than exist: -1 padded ranks
}


class PagedSetup:
    """Sequences in shuffled blocks: index keys and gates for their tokens (NaN elsewhere), the
    pool keys of every position written by the reference, and this step's rows."""

    def __init__(self, seq_lens, new_tokens, kpool, dtype, device, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.kpool, self.seq_lens = kpool, seq_lens
        blocks_per_seq = max(-(-n // PAGE) for n in seq_lens) + 1
        num_blocks = blocks_per_seq * len(seq_lens) + 2
        order = torch.randperm(num_blocks, generator=gen)
        self.block_tables = order[: blocks_per_seq * len(seq_lens)].view(len(seq_lens), -1)
        shape = (num_blocks, PAGE, DI)
        self.keys = torch.full(shape, float("nan"))
        self.gates = torch.full(shape, float("nan"))
        all_slots = []
        for i, n in enumerate(seq_lens):
            pos = torch.arange(n)
            slots = self.block_tables[i, pos // PAGE] * PAGE + pos % PAGE
            self.keys.view(-1, DI)[slots] = torch.randn(n, DI, generator=gen)
            self.gates.view(-1, DI)[slots] = torch.randn(n, DI, generator=gen) * 2
            all_slots.append(slots)
        self.ape = torch.randn(kpool, DI, generator=gen)
        self.q = torch.randn(sum(new_tokens), HI, DI, generator=gen)
        self.w = torch.randn(sum(new_tokens), HI, generator=gen)
        step = [s[-q:] for s, q in zip(all_slots, new_tokens, strict=True)]
        self.slot_mapping = torch.cat(step)
        self.cu_seqlens = torch.tensor([0, *torch.tensor(new_tokens).cumsum(0).tolist()])
        self.all_slots, self.all_cu = (
            torch.cat(all_slots),
            torch.tensor([0, *torch.tensor(seq_lens).cumsum(0).tolist()]),
        )
        tensors = ("keys", "gates", "ape", "q", "w")
        for name in tensors:
            setattr(self, name, getattr(self, name).to(dtype).to(device))
        for name in ("block_tables", "slot_mapping", "cu_seqlens", "all_slots", "all_cu"):
            dtype_i = torch.int64 if "slot" in name else torch.int32
            setattr(self, name, getattr(self, name).to(dtype_i).to(device))
        self.lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
        self.pool_keys = torch.full_like(self.keys, float("nan"))
        self.write(reference.write_pool_keys, self.pool_keys, every_token=True)

    def write(self, fn, out, every_token: bool) -> None:
        cu, slots = (self.all_cu, self.all_slots) if every_token else (
            self.cu_seqlens, self.slot_mapping)  # fmt: skip
        fn(self.keys, self.gates, out, self.ape, self.block_tables, cu, self.lens, slots)


def _pool_tol(dtype) -> dict:
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2**-6, atol=2**-5)


def check_write_pool_keys(case: str, dtype, device: str, every_token: bool) -> None:
    from hyla.ops.kpool_indexer import kernels

    seq_lens, new_tokens, kpool, _ = CASES[case]
    s = PagedSetup(seq_lens, new_tokens, kpool, dtype, device)
    want, got = torch.full_like(s.keys, float("nan")), torch.full_like(s.keys, float("nan"))
    s.write(reference.write_pool_keys, want, every_token)
    s.write(kernels.write_pool_keys, got, every_token)
    torch.testing.assert_close(got.float(), want.float(), equal_nan=True, **_pool_tol(dtype))


def check_topk(case: str, dtype, device: str, tail: bool, static_shapes: bool, sort: bool) -> None:
    """`sort`: rows sorted by one program each (`SORT_MAX_POOLS`), else the indexer's top-k
    (`static_shapes`: its radix select) and the expansion kernel."""
    from hyla.ops.kpool_indexer import kernels

    seq_lens, new_tokens, kpool, topk = CASES[case]
    s = PagedSetup(seq_lens, new_tokens, kpool, dtype, device, seed=1)
    args = (s.q, s.w, s.pool_keys, s.block_tables, s.cu_seqlens, s.lens, max(seq_lens) + 3,
            topk, kpool, tail, DI**-0.5)  # fmt: skip
    want = reference.kpool_indexer_topk(*args)
    saved = kernels.SORT_MAX_POOLS
    kernels.SORT_MAX_POOLS = saved if sort else 0
    try:
        got = kernels.kpool_indexer_topk(*args, static_shapes=static_shapes)
    finally:
        kernels.SORT_MAX_POOLS = saved
    assert got.dtype == torch.int32 and got.shape == want.shape
    assert torch.equal(got, want)


DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


@DTYPES
@pytest.mark.parametrize("every_token", [False, True], ids=["step", "every_token"])
@pytest.mark.parametrize("case", list(CASES))
def test_write_pool_keys(case: str, dtype: torch.dtype, every_token: bool) -> None:
    check_write_pool_keys(case, dtype, "cuda", every_token)


@DTYPES
@pytest.mark.parametrize(
    ("static_shapes", "sort"), [(False, True), (False, False), (True, False)],
    ids=["sort", "topk", "radix"],
)  # fmt: skip
@pytest.mark.parametrize("tail", [True, False], ids=["tail", "no_tail"])
@pytest.mark.parametrize("case", list(CASES))
def test_topk(case: str, dtype: torch.dtype, tail: bool, static_shapes: bool, sort: bool) -> None:
    check_topk(case, dtype, "cuda", tail, static_shapes, sort)


def test_topk_in_a_cuda_graph() -> None:
    from hyla.ops.kpool_indexer import kernels

    seq_lens, new_tokens, kpool, topk = CASES["decode"]
    s = PagedSetup(seq_lens, new_tokens, kpool, torch.bfloat16, "cuda", seed=2)
    args = (s.q, s.w, s.pool_keys, s.block_tables, s.cu_seqlens, s.lens, 128, topk, kpool,
            True, DI**-0.5)  # fmt: skip
    kernels.kpool_indexer_topk(*args, static_shapes=True)  # compile outside the capture
    assert 128 // kpool <= kernels.SORT_MAX_POOLS  # the one-kernel sort; radix: test_topk
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = kernels.kpool_indexer_topk(*args, static_shapes=True)
    s.q.copy_(torch.randn_like(s.q))
    graph.replay()
    assert torch.equal(got, reference.kpool_indexer_topk(*args))


def check_sparse_mla_valid_selection(device: str) -> None:
    """`kernel_sparse_mla(..., valid_selection=True)` on a pooled selection (one row emptied)
    equals the safe path (`valid_topk_indices` first) to fp32 summation order; the empty row is
    zero on both."""
    from hyla.ops.sparse_attention import kernel_sparse_mla

    seq_lens, new_tokens, kpool, topk = CASES["prefill"]
    s = PagedSetup(seq_lens, new_tokens, kpool, torch.float32, device, seed=4)
    sel = reference.kpool_indexer_topk(
        s.q, s.w, s.pool_keys, s.block_tables, s.cu_seqlens, s.lens, max(seq_lens), topk, kpool,
        True, DI**-0.5,
    )  # fmt: skip
    sel[0] = -1
    gen = torch.Generator().manual_seed(5)
    heads, rank, dv = 2, 16, 8
    num_rows = sel.shape[0]
    q_nope = torch.randn(num_rows, heads, rank, generator=gen).to(device)
    q_rope = torch.randn(num_rows, heads, 0, generator=gen).to(device)
    latent = torch.randn(*s.keys.shape[:2], rank, generator=gen).to(device)
    kv_b = torch.randn(heads * (rank + dv), rank, generator=gen).to(device) * 0.2
    args = (q_nope, q_rope, latent, s.block_tables, s.cu_seqlens, sel, kv_b, 0.3, s.lens)
    want = kernel_sparse_mla(*args)
    got = kernel_sparse_mla(*args, valid_selection=True)
    assert bool((got[0] == 0).all())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_sparse_mla_valid_selection() -> None:
    check_sparse_mla_valid_selection("cuda")
