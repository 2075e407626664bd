"""DSA on the GPU: Triton lightning-indexer top-k and sparse MLA (`kernels.py` of
`hyla.ops.dsa_indexer` / `hyla.ops.sparse_attention`) against the references run on CPU copies.

Caches are paged under shuffled block tables; slots no sequence owns are poisoned with NaN, the
spare block that padded block-table entries point at with 1e30: neither may leak into a result.

Bounds:
- indexer: the exact reference indices on every row whose top-(k+1) visible scores have no
  near-tie (adjacent gap in (0, 2e-5 * max|score|)); on other rows the i-th pick's score equals
  the reference's i-th within that tolerance. Exact score ties break to the lower index in both.
- sparse MLA: max|got - want| / max|want| <= 1e-4 for fp32 inputs, <= 2e-2 for bf16.

The `check_*` helpers take a device, so `test_dsa_interpret.py` runs them on CPU tensors under
TRITON_INTERPRET=1.
"""

from __future__ import annotations

import pytest
import torch

from hyla.ops.dsa_indexer import reference as indexer_ref
from hyla.ops.dsa_indexer.rows import dense_topk_indices
from hyla.ops.paged import write_paged
from hyla.ops.sparse_attention import reference as sparse_ref
from tests.ops.dsa_keys import sort_keys

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

NEAR_TIE = 2e-5


def paged_cache(
    seq_lens: list[int], width: int, dtype: torch.dtype, block: int, device, gen
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Random fp32 rows [n, width] per sequence written into a poisoned [P, block, width] cache.

    Returns: (cache in `dtype`, block_tables [N, max_blocks] int32, rows per sequence (CPU fp32,
    already rounded to `dtype`)).
    """
    per_seq = [(n + block - 1) // block for n in seq_lens]
    num_blocks = sum(per_seq) + 2
    order = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()  # block 0 stays unused
    spare = order.pop()
    cache = torch.full((num_blocks, block, width), float("nan"))
    cache[spare] = 1e30
    tables, rows, start = [], [], 0
    for n, nb in zip(seq_lens, per_seq, strict=True):
        table = order[start : start + nb]
        start += nb
        x = torch.randn(n, width, generator=gen).to(dtype).float()
        slots = torch.tensor(table, dtype=torch.long).repeat_interleave(block)[:n] * block
        write_paged(cache, slots + torch.arange(n) % block, x)
        tables.append(table + [spare] * (max(per_seq) - nb))
        rows.append(x)
    return cache.to(dtype).to(device), torch.tensor(tables, dtype=torch.int32).to(device), rows


def cu_seqlens(query_lens: list[int], device) -> torch.Tensor:
    cu = torch.tensor([0, *query_lens]).cumsum(0)
    return cu.to(torch.int32).to(device)


def _near_tie_free(scores: torch.Tensor, k: int, tol: float) -> bool:
    top = scores.sort(descending=True).values[: k + 1]
    gaps = top[:-1] - top[1:]
    return not bool(((gaps > 0) & (gaps < tol)).any())


def assert_same_selection(got: torch.Tensor, want: torch.Tensor, scores: list[torch.Tensor]):
    """got/want [T, k] int32 (CPU); scores[t] = the reference's fp32 visible scores of row t."""
    assert torch.equal(got < 0, want < 0), "different -1 padding"
    k, num_exact_rows = got.shape[1], 0
    for t, row_scores in enumerate(scores):
        tol = NEAR_TIE * float(row_scores.abs().max()) + 1e-30
        if _near_tie_free(row_scores, k, tol):
            assert got[t].tolist() == want[t].tolist(), f"row {t}"
            num_exact_rows += 1
            continue
        valid = want[t] >= 0
        diff = row_scores[got[t][valid].long()] - row_scores[want[t][valid].long()]
        assert float(diff.abs().max()) <= tol, f"row {t}"
    return num_exact_rows


def check_indexer(
    seq_lens: list[int],
    query_lens: list[int],
    topk: int,
    key_dtype: torch.dtype,
    device,
    seed: int = 0,
    num_heads: int = 4,
    head_dim: int = 32,
    ties: bool = False,
) -> int:
    """Kernel top-k vs the reference on CPU copies; returns the number of exactly checked rows."""
    from hyla.ops.dsa_indexer import kernels

    gen = torch.Generator().manual_seed(seed)
    store_dtype = torch.bfloat16 if key_dtype == torch.float8_e4m3fn else key_dtype
    cache, tables, keys = paged_cache(seq_lens, head_dim, store_dtype, 16, device, gen)
    key_scale = None
    if ties:
        cache = cache.sign()
        keys = [k.sign() for k in keys]
    if key_dtype == torch.float8_e4m3fn:  # per-token scale: key ~= fp8 * scale
        amax = cache.float().abs().amax(-1).nan_to_num(1.0).clamp(1e-4, 1e30)
        key_scale = amax / 448.0
        cache = (cache.float() / key_scale[..., None]).to(key_dtype)
    num_rows = sum(query_lens)
    q = torch.randn(num_rows, num_heads, head_dim, generator=gen)
    q = (q.sign() if ties else q).to(store_dtype)
    w = torch.randn(num_rows, num_heads, generator=gen)
    cu = cu_seqlens(query_lens, device)
    args = (tables, cu, seq_lens, topk, head_dim**-0.5)
    got = kernels.lightning_indexer_topk(
        q.to(device), w.to(device), cache, *args, index_key_scale=key_scale
    )
    ref_cache = cache.cpu().float()
    if key_scale is not None:
        ref_cache = ref_cache * key_scale.cpu()[..., None]
        keys = [None] * len(seq_lens)
    cpu_args = (tables.cpu(), cu.cpu(), seq_lens, topk, head_dim**-0.5)
    want = indexer_ref.lightning_indexer_topk(q.float(), w, ref_cache, *cpu_args)
    scores, row = [], 0
    for i, (n, m) in enumerate(zip(seq_lens, query_lens, strict=True)):
        k_i = keys[i] if keys[i] is not None else _gather(ref_cache, tables[i].cpu(), n)
        s = indexer_ref.indexer_scores(q[row : row + m].float(), w[row : row + m], k_i, args[-1])
        scores += [s[j, : n - m + j + 1] for j in range(m)]
        row += m
    return assert_same_selection(got.cpu(), want, scores)


def _gather(cache: torch.Tensor, table: torch.Tensor, n: int) -> torch.Tensor:
    from hyla.ops.paged import gather_paged

    return gather_paged(cache, table, n)


def random_selection(
    seq_lens: list[int], query_lens: list[int], topk: int, gen, drop: float = 0.2
) -> torch.Tensor:
    """[T, k] int32: each row picks distinct visible positions at random ranks, -1 elsewhere
    (holes anywhere, not only at the tail); at least one pick per row."""
    rows = []
    for n, m in zip(seq_lens, query_lens, strict=True):
        for j in range(m):
            visible = n - m + j + 1
            num = max(1, int(min(visible, topk) * (1 - drop * torch.rand(1, generator=gen))))
            picks = torch.randperm(visible, generator=gen)[:num].int()
            row = torch.full((topk,), -1, dtype=torch.int32)
            row[torch.randperm(topk, generator=gen)[:num]] = picks
            rows.append(row)
    return torch.stack(rows)


def check_sparse_mla(
    seq_lens: list[int],
    query_lens: list[int],
    topk: int,
    dims: tuple[int, int, int, int, int],
    dtype: torch.dtype,
    device,
    seed: int = 0,
    selection: torch.Tensor | None = None,
) -> float:
    """Kernel sparse MLA vs the reference on fp32 CPU copies; returns the relative error.
    dims = (H, Dn, Dr, Dv, R)."""
    from hyla.ops.sparse_attention import kernels

    num_heads, dn, dr, dv, rank = dims
    gen = torch.Generator().manual_seed(seed)
    cache, tables, _ = paged_cache(seq_lens, rank + dr, dtype, 16, device, gen)
    num_rows = sum(query_lens)
    if selection is None:
        selection = random_selection(seq_lens, query_lens, topk, gen)
    q_nope = torch.randn(num_rows, num_heads, dn, generator=gen).to(dtype)
    q_rope = torch.randn(num_rows, num_heads, dr, generator=gen).to(dtype)
    kv_b = (torch.randn(num_heads * (dn + dv), rank, generator=gen) / rank**0.5).to(dtype)
    cu, scale = cu_seqlens(query_lens, device), (dn + dr) ** -0.5
    got = kernels.sparse_mla(
        q_nope.to(device), q_rope.to(device), cache, tables, cu, selection.to(device),
        kv_b.to(device), scale,
    )  # fmt: skip
    assert got.dtype == dtype and got.shape == (num_rows, num_heads, dv)
    want = sparse_ref.sparse_mla(
        q_nope.float(), q_rope.float(), cache.cpu().float(), tables.cpu(), cu.cpu(), selection,
        kv_b.float(), scale,
    )  # fmt: skip
    got = got.cpu().float()
    assert not got.isnan().any()
    return float((got - want).abs().max() / want.abs().max())


def check_mla_paged(
    seq_lens: list[int],
    query_lens: list[int],
    bound: int,
    dims: tuple[int, int, int, int, int],
    dtype: torch.dtype,
    device,
    seed: int = 0,
) -> float:
    """Kernel `mla_paged` (dense causal MLA, lengths on the device, bound >= every length) vs
    `mla_paged_reference` on fp32 CPU copies; returns the relative error. The block tables are
    padded to the bound with block 0 (NaN: no sequence's)."""
    from hyla.ops.mla import kernels
    from hyla.ops.mla.paged import mla_paged_reference

    num_heads, dn, dr, dv, rank = dims
    gen = torch.Generator().manual_seed(seed)
    cache, tables, _ = paged_cache(seq_lens, rank + dr, dtype, 16, device, gen)
    tables = torch.nn.functional.pad(tables, (0, -(-bound // 16) - tables.shape[1]))
    num_rows = sum(query_lens)
    q_nope = torch.randn(num_rows, num_heads, dn, generator=gen).to(dtype)
    q_rope = torch.randn(num_rows, num_heads, dr, generator=gen).to(dtype)
    kv_b = (torch.randn(num_heads * (dn + dv), rank, generator=gen) / rank**0.5).to(dtype)
    cu, scale = cu_seqlens(query_lens, device), (dn + dr) ** -0.5
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    got = kernels.mla_paged(
        q_nope.to(device), q_rope.to(device), cache, tables, cu, lens.to(device), bound,
        kv_b.to(device), scale,
    )  # fmt: skip
    assert got.dtype == dtype and got.shape == (num_rows, num_heads, dv)
    want = mla_paged_reference(
        q_nope.float(), q_rope.float(), cache.cpu().float(), tables.cpu(), cu.cpu(), lens, bound,
        kv_b.float(), scale,
    )  # fmt: skip
    got = got.cpu().float()
    assert not got.isnan().any()
    return float((got - want).abs().max() / want.abs().max())


MIXED = ([1, 7, 300, 2100, 5000, 4000, 2049], [1, 7, 300, 1, 64, 1, 3])


@pytest.mark.parametrize("key_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("topk", [64, 2048])
def test_indexer_varlen_matches_reference(key_dtype: torch.dtype, topk: int) -> None:
    num_exact = check_indexer(*MIXED, topk, key_dtype, "cuda")
    assert num_exact >= 0.25 * sum(MIXED[1])  # interpreter run: 75% (k 64), 46% (k 2048)


def test_indexer_exact_ties_break_to_lower_index() -> None:
    check_indexer([40, 300, 900], [40, 3, 1], 64, torch.float32, "cuda", ties=True, head_dim=8)


def test_indexer_100k_context() -> None:
    check_indexer([100_000, 3000], [4, 1], 2048, torch.bfloat16, "cuda", seed=1)


def test_indexer_fp8_keys_with_scale() -> None:
    check_indexer(*MIXED, 256, torch.float8_e4m3fn, "cuda", seed=2)


def test_indexer_row_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from hyla.ops.dsa_indexer import kernels

    monkeypatch.setattr(kernels, "MAX_KEY_ELEMENTS", 3 * 5000)  # 3 rows per chunk
    check_indexer(*MIXED, 64, torch.float32, "cuda", seed=3)


def long_rows(
    num_rows: int, seed: int, short: tuple[int, ...] = (999, 0, 2999), num_cols: int = 1 << 20
) -> tuple[torch.Tensor, ...]:
    """1M-column keys: normal scores, every third one rounded to bf16 (exact ties); rows 1, 2,
    3 end at positions `short` (by default fewer than k = 2048 visible, and column 0 alone)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.randn(num_rows, num_cols, generator=gen, device="cuda")
    scores[:, ::3] = scores[:, ::3].bfloat16().float()
    row_pos = torch.full((num_rows,), num_cols - 1, dtype=torch.int64, device="cuda")
    row_pos[1:4] = torch.tensor(short, device="cuda")[: max(num_rows - 1, 0)]
    return sort_keys(scores, row_pos), row_pos


@pytest.mark.parametrize("num_rows", [1, 16])
def test_radix_topk_1m_columns_equals_torch_topk(num_rows: int, monkeypatch) -> None:
    from hyla.ops.dsa_indexer import kernels, topk
    from hyla.ops.dsa_indexer.select import segmented_topk_columns, topk_columns_reference

    monkeypatch.setattr(kernels, "RADIX_MIN_COLS", 16384)  # off by default
    keys, row_pos = long_rows(num_rows, seed=num_rows)
    want = topk_columns_reference(keys, row_pos, 2048)
    assert torch.equal(topk.radix_topk_columns(keys, row_pos, 2048), want)
    assert torch.equal(kernels.keys_to_topk(keys, row_pos, 2048), want)  # dispatches to radix
    assert torch.equal(segmented_topk_columns(keys, row_pos, 2048), want)


@pytest.mark.parametrize("method", ["radix", "segmented"])
def test_long_row_topk_cuda_graph_replay(method: str) -> None:
    from hyla.ops.dsa_indexer.select import segmented_topk_columns, topk_columns_reference
    from hyla.ops.dsa_indexer.topk import radix_topk_columns

    fn = radix_topk_columns if method == "radix" else segmented_topk_columns
    keys, row_pos = long_rows(16, seed=0)
    assert torch.equal(fn(keys, row_pos, 2048), topk_columns_reference(keys, row_pos, 2048))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up outside the capture
        fn(keys, row_pos, 2048)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(keys, row_pos, 2048)
    for seed, short in ((1, (999, 0, 2999)), (2, (2047, 2048, 5))):
        new_keys, new_pos = long_rows(16, seed, short)
        keys.copy_(new_keys)
        row_pos.copy_(new_pos)
        graph.replay()
        assert torch.equal(out, topk_columns_reference(keys, row_pos, 2048))


TINY = (4, 8, 16, 6, 32)  # H, Dn, Dr, Dv, R
V32 = (128, 128, 64, 128, 512)  # DeepSeek-V3.2


@pytest.mark.parametrize(
    ("dims", "topk", "dtype", "bound"),
    [
        (TINY, 8, torch.float32, 1e-4),
        (TINY, 64, torch.float32, 1e-4),
        (TINY, 64, torch.bfloat16, 2e-2),
        (V32, 2048, torch.bfloat16, 2e-2),
    ],
    ids=["tiny-k8-fp32", "tiny-k64-fp32", "tiny-k64-bf16", "v32-k2048-bf16"],
)
def test_sparse_mla_varlen_matches_reference(dims, topk, dtype, bound) -> None:
    seq_lens, query_lens = [1, 9, 70, 3000, 2500], [1, 9, 5, 1, 4]
    assert check_sparse_mla(seq_lens, query_lens, topk, dims, dtype, "cuda") <= bound


def test_sparse_mla_decode_batch_splits() -> None:
    """One row per sequence: the top-k list is split across programs and merged."""
    seq_lens = [1, 5, 2048, 2049, 9000, 70]
    err = check_sparse_mla(seq_lens, [1] * 6, 2048, V32, torch.bfloat16, "cuda", seed=4)
    assert err <= 2e-2


def check_dense_selection(seq_lens: list[int], query_lens: list[int], topk: int, device) -> None:
    """L <= k: `dense_topk_indices` selects the indexer's set, and sparse MLA over either
    selection is the same dense attention."""
    from hyla.ops.dsa_indexer import kernels as indexer_kernels

    gen = torch.Generator().manual_seed(5)
    cu, num_rows = cu_seqlens(query_lens, device), sum(query_lens)
    dense = dense_topk_indices(cu, seq_lens, topk, num_rows).cpu()
    keys, tables, _ = paged_cache(seq_lens, 16, torch.float32, 16, device, gen)
    q = torch.randn(num_rows, 4, 16, generator=gen).to(device)
    w = torch.randn(num_rows, 4, generator=gen).to(device)
    chosen = indexer_kernels.lightning_indexer_topk(q, w, keys, tables, cu, seq_lens, topk, 0.25)
    chosen = chosen.cpu()
    for t in range(num_rows):
        assert set(dense[t].tolist()) == set(chosen[t].tolist())
    err_dense = check_sparse_mla(seq_lens, query_lens, topk, TINY, torch.float32, device, 6, dense)
    err_index = check_sparse_mla(seq_lens, query_lens, topk, TINY, torch.float32, device, 6, chosen)
    assert max(err_dense, err_index) <= 1e-4


def test_dense_selection_equals_indexer_selection() -> None:
    check_dense_selection([1, 7, 60, 64, 30], [1, 7, 60, 1, 2], 64, "cuda")


LAYER_TOPK = 8
LAYER_STEPS = ({0: 3, 1: 20, 2: 8}, {0: 1, 1: 1, 2: 1})  # seq 2 crosses k in the decode step


def dsa_layer(device):
    """A tiny DSAttention (4 heads, R 16, Dr 8, indexer 8 x 16, k 8) with seeded weights."""
    from hyla.config import DSAConfig, MLAConfig, ModelConfig, RopeConfig
    from hyla.layers.sparse_attention import DSAttention

    config = ModelConfig(
        vocab_size=32,
        hidden_size=64,
        intermediate_size=64,
        layer_pattern=("dsa",),
        ffn_pattern=("dense",),
        mla=MLAConfig(4, 16, 16, 8, 12, q_lora_rank=24),
        dsa=DSAConfig(8, 16, LAYER_TOPK),
        rope=RopeConfig(1e4, 8, "interleave"),
    )
    layer = DSAttention(config, 0)
    gen = torch.Generator().manual_seed(7)
    for name, p in layer.named_parameters():
        noise = torch.randn(p.shape, generator=gen)
        is_norm_weight = "norm" in name and name.endswith("weight")
        p.data.copy_(1.0 + 0.2 * noise if is_norm_weight else noise / p.shape[-1] ** 0.5)
    return config, layer.to(device)


@torch.no_grad()
def run_layer(device) -> torch.Tensor:
    """Two steps (a mixed prefill, then a decode of every sequence) over a NaN-poisoned cache;
    returns the concatenated outputs (CPU)."""
    from hyla.forward_batch import allocate_caches, build_forward_batch

    config, layer = dsa_layer(device)
    block, per_seq = 4, 8
    tables = [[1 + 3 * per_seq - 1 - (i * per_seq + j) for j in range(per_seq)] for i in range(3)]
    caches = allocate_caches(config, 3 * per_seq + 1, block, 4, device)
    for t in caches[0].values():
        t.fill_(float("nan"))
    gen, lens, outs = torch.Generator().manual_seed(8), [0, 0, 0], []
    for step in LAYER_STEPS:
        ids = list(step)
        batch = build_forward_batch(
            [step[i] for i in ids], [lens[i] for i in ids], [tables[i] for i in ids],
            [1 + i for i in ids], block, caches, device,
        )  # fmt: skip
        x = torch.randn(sum(step.values()), 64, generator=gen).to(device)
        outs.append(layer(x, batch.positions, batch).cpu())
        for i in ids:
            lens[i] += step[i]
    return torch.cat(outs)


def test_dsa_layer_cuda_matches_cpu() -> None:
    """DSAttention on CUDA (prefill sequences no longer than k through `mla_prefill`; the
    other rows in one `sparse_mla` call: short sequences via `dense_topk_indices`, long ones
    via the indexer) vs the CPU layer (MLA dense path + reference ops)."""
    got = run_layer("cuda")
    assert not got.isnan().any()
    torch.testing.assert_close(got, run_layer("cpu"), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype,bound", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_mla_paged_mixed_rows(dtype, bound) -> None:
    """Dense causal MLA over the paged cache (the CUDA path of MLA layers and of captured
    decode steps): decode rows, prefill chunks and whole prompts, a bound past the longest."""
    seq_lens, query_lens = [1, 7, 300, 2100, 4000, 2049], [1, 7, 300, 1, 64, 3]
    err = check_mla_paged(seq_lens, query_lens, 4500, V32, dtype, "cuda")
    print(f"mla_paged {dtype} mixed rows: rel err {err:.2e}")
    assert err <= bound


def test_mla_paged_long_decode_rows() -> None:
    """Decode rows up to 100K tokens (split-k over the bound), bf16 cache."""
    seq_lens = [100_000, 65_537, 17, 1]
    err = check_mla_paged(seq_lens, [1] * 4, 131_072, V32, torch.bfloat16, "cuda")
    print(f"mla_paged bf16 decode to 100K: rel err {err:.2e}")
    assert err <= 2e-2
