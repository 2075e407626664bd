"""The fp8 kernels (`hyla.ops.fp8.kernels`: block-scaled GEMM and GEMV; `moe_kernels`: the
routed experts) against `hyla.ops.fp8.reference` on CPU copies of the same inputs: K and N not
multiples of the block, zero blocks, extreme scales, saturated (+-448) values, no NaN; the
layers' fp8 cache read by the sparse / dense MLA kernel; replay from a CUDA graph equal to the
eager call. The `check_*` helpers take a device: test_fp8_interpret.py runs them on CPU tensors
under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.fp8 import reference
from hyla.ops.fp8.reference import quantize_weight_blockwise

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# fp32 sums in another order (K products per output); bf16: the output's rounding (2^-8)
BOUNDS = {torch.float32: 1e-5, torch.bfloat16: 8e-3}
# bf16 experts: gate and up are rounded to bf16 before silu(gate) * up, so one ulp of another
# fp32 summation order (2^-8) moves the intermediate, which is then re-quantized to e4m3 (codes
# 2^-4 apart relative): measured up to 2.5e-2 of the output's max (interpreter, 20 tokens); the
# fp32 runs of the same kernels match the reference to 1e-6
MOE_BF16_BOUND = 4e-2


def linear_variants(small: bool) -> dict:
    """The tile variants `bench/gpu_fp8_sweep.py` chooses from, by id: more columns per program,
    a K loop (depth < K, pipelined or prefetched), multi-row GEMV programs, split-K (more
    splits than k-steps too), small-M GEMM tiles, x quantized before the GEMM. `small`: depths
    for the interpreter's tiny K (block (16, 32)); else for bk = 128."""
    from hyla.ops.fp8.tiles import GemmConfig, GemvConfig

    d = 32 if small else 128
    return {
        "default": None,
        "gemv-cols8-loop": GemvConfig(cols=8, depth=2 * d, stages=2),
        "gemv-cols16-prefetch": GemvConfig(cols=16, depth=d, prefetch=True),
        "gemv-cols32-split2": GemvConfig(cols=32, depth=d, split_k=2, warps=8, stages=3),
        "gemv-rows4-prefetch": GemvConfig(rows=4, depth=2 * d, prefetch=True),
        "gemv-rows16-split3": GemvConfig(cols=2, rows=16, depth=d, split_k=3),
        "gemv-split-past-steps": GemvConfig(depth=d, split_k=64),
        "gemm-16x16": GemmConfig(block_m=16, block_n=16, stages=2),
        "gemm-16x64-split3": GemmConfig(block_m=16, block_n=64, split_k=3),
        "gemm-32x32-unfused-split2": GemmConfig(block_m=32, block_n=32, split_k=2, fused=False),
        "gemm-64x128-w8": GemmConfig(block_m=64, block_n=128, warps=8, stages=4),
    }


def moe_variants() -> dict:
    """MoE tile variants by id (both forms take every field set; the unused ones are ignored)."""
    from hyla.ops.fp8.tiles import MoeTiles

    return {
        "default": None,
        "wide": MoeTiles(
            gate_rows=8,
            depth=32,
            gate_warps=4,
            down_cols=8,
            down_depth=32,
            down_warps=8,
            block_m=32,
            block_n=16,
            grouped_warps=8,
            grouped_stages=2,
        ),  # fmt: skip
        "narrow": MoeTiles(gate_rows=2, down_cols=2, block_m=16, block_n=32, grouped_stages=4),
        "unfused": MoeTiles(block_m=32, grouped_fused=False),
    }


def _weight(n: int, k: int, block, gen, extreme: bool = False):
    w = torch.randn(n, k, generator=gen)
    if extreme:
        w[: block[0], : block[1]] = 0.0  # a zero block: scale 1, zeros
        if n > block[0]:
            w[block[0] :, : block[1]] *= 1e-20  # a tiny scale
        if k > block[1]:
            w[: block[0], block[1] :] *= 1e20  # a huge one
    return quantize_weight_blockwise(w, block)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    assert not torch.isnan(got).any()
    return float((got.double().cpu() - want.double()).abs().max() / want.abs().max())


def check_linear(m, n, k, dtype, device, block=(128, 128), extreme=False, config=None) -> float:
    """`kernels.fp8_linear` vs `reference.fp8_linear` (relative max error); `config` (a
    `tiles.GemvConfig` or `GemmConfig`) overrides the kernels' pick."""
    from hyla.ops.fp8 import kernels

    gen = torch.Generator().manual_seed(m * 7 + n * 3 + k)
    q, s = _weight(n, k, block, gen, extreme)
    x = torch.randn(m, k, generator=gen).to(dtype)
    if extreme:
        x[0, :] *= 1e4  # per-token scales far apart
    want = reference.fp8_linear(x, q, s, block)
    assert kernels.supports(x.to(device), q.to(device), s.to(device), block)
    got = kernels.fp8_linear(x.to(device), q.to(device), s.to(device), block, config)
    assert got.shape == want.shape and got.dtype == dtype
    if extreme:  # rows differ by 1e4 and blocks by 1e40: compare row by row
        return max(rel_err(got[i], want[i]) for i in range(m) if want[i].abs().max() > 0)
    return rel_err(got, want)


def check_quantize_rows(device) -> None:
    """The one-launch activation quantizer is bit-identical to the reference's torch code:
    magnitudes over 12 decades, a zero group, ragged last group."""
    from hyla.ops.fp8 import kernels

    gen = torch.Generator().manual_seed(11)
    for m, k, g in ((7, 300, 128), (3, 64, 32), (2, 1000, 128)):
        x = torch.randn(m, k, generator=gen) * torch.logspace(-6, 6, k)
        x[0, :g] = 0.0
        q, s = kernels.quantize_rows(x.to(device), g)
        q_ref, s_ref = reference.quantize_activation(x, g)
        assert torch.equal(s.cpu(), s_ref)
        assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))


def check_saturation(device) -> None:
    """Block maxima quantize to +-448 (the e4m3 limit, never past it: no NaN codes); huge but
    finite weights and activations give finite outputs equal to the reference's."""
    from hyla.ops.fp8 import kernels

    w = torch.full((32, 64), 1e30)
    w[::2] *= -1
    q, s = quantize_weight_blockwise(w, (128, 128))
    assert q.float().abs().max() == 448.0 and torch.isfinite(s).all()
    x = torch.full((5, 64), 1e5)
    got = kernels.fp8_linear(x.to(device), q.to(device), s.to(device), (128, 128))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.cpu(), reference.fp8_linear(x, q, s, (128, 128)))


def check_moe(num_tokens, dtype, device, grouped: bool, block=(16, 32), topk=2, tiles=None):
    """`moe_kernels.fp8_moe_experts` vs the reference through the GEMV form or (`grouped`)
    the grouped GEMMs (`tiles`: a `tiles.MoeTiles` over the pick); I = 40 is not a multiple
    of bn, D = 80 not one of bk. Returns the relative max error."""
    from hyla.ops.fp8 import moe_kernels

    gen = torch.Generator().manual_seed(num_tokens)
    E, I, D = 6, 40, 80
    gate, up = _weight(I, D, block, gen), _weight(I, D, block, gen)
    gu_q = torch.stack([torch.cat([gate[0], up[0]])] * E).clone()
    gu_s = torch.stack([torch.cat([gate[1], up[1]]) * (e + 1) for e in range(E)])
    downs = [_weight(D, I, block, gen) for _ in range(E)]
    dn_q, dn_s = torch.stack([d[0] for d in downs]), torch.stack([d[1] for d in downs])
    dn_q[1, :, : block[1]] = 0  # a zero block
    x = torch.randn(num_tokens, D, generator=gen).to(dtype)
    ids = torch.stack([torch.randperm(E, generator=gen)[:topk] for _ in range(num_tokens)])
    wts = torch.rand(num_tokens, topk, generator=gen)
    args = (x, gu_q, gu_s, dn_q, dn_s, wts, ids, block)
    want = reference.fp8_moe_experts(*args)
    dev = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    assert moe_kernels.supports(*dev)
    got = moe_kernels.fp8_moe_experts(*dev, grouped=grouped, tiles=tiles)
    assert got.dtype == dtype and got.shape == want.shape
    return rel_err(got, want)


@pytest.mark.parametrize("m", [1, 3, 4, 5, 64, 130])
@pytest.mark.parametrize("n, k", [(136, 200), (256, 384), (7, 129), (4096, 7168)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_linear_matches_reference(m, n, k, dtype) -> None:
    if n * k > 1e6 and m > 5 and dtype == torch.float32:
        pytest.skip("one large shape per dtype is enough")
    # GEMM rows (m > 4) on Hopper: fp8 tensor cores accumulate a 128-wide block with ~2^-14
    # relative precision (DeepSeek-V3 report, 3.3.2), then the kernel adds blocks in fp32
    bound = BOUNDS[dtype] if m <= 4 or dtype == torch.bfloat16 else 1e-3
    assert check_linear(m, n, k, dtype, "cuda") <= bound


@pytest.mark.parametrize("variant", list(linear_variants(small=False)))
@pytest.mark.parametrize("m", [1, 4, 16, 64])
def test_fp8_linear_tile_variants(variant, m) -> None:
    # N = 1000, K = 1000: neither a multiple of 128, bf16; fp32 with zero blocks and extreme
    # scales (fp8 tensor-core sums as above)
    config = linear_variants(small=False)[variant]
    assert (
        check_linear(m, 1000, 1000, torch.bfloat16, "cuda", config=config) <= BOUNDS[torch.bfloat16]
    )
    assert check_linear(m, 300, 260, torch.float32, "cuda", extreme=True, config=config) <= 1e-3


@pytest.mark.parametrize("variant", list(moe_variants()))
@pytest.mark.parametrize("num_tokens, grouped", [(2, False), (20, True)])
def test_fp8_moe_tile_variants(variant, num_tokens, grouped) -> None:
    tiles = moe_variants()[variant]
    bound = 1e-2 if grouped else 2e-5
    assert check_moe(num_tokens, torch.float32, "cuda", grouped, tiles=tiles) <= bound


def test_fp8_split_k_in_cuda_graph_equal_eager() -> None:
    """Split-K partials are summed in a fixed order: replay equals the eager call bit for bit."""
    from hyla.ops.fp8 import kernels
    from hyla.ops.fp8.tiles import GemmConfig, GemvConfig

    gen = torch.Generator().manual_seed(1)
    q, s = (t.cuda() for t in _weight(1000, 3000, (128, 128), gen))
    for m, config in ((1, GemvConfig(depth=256, split_k=4, prefetch=True)),
                      (16, GemmConfig(16, 64, 5))):  # fmt: skip
        x = torch.randn(m, 3000, device="cuda", dtype=torch.bfloat16)
        kernels.fp8_linear(x, q, s, (128, 128), config)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = kernels.fp8_linear(x, q, s, (128, 128), config)
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert torch.equal(out, kernels.fp8_linear(x, q, s, (128, 128), config))


@pytest.mark.parametrize("m", [1, 40])
def test_fp8_linear_zero_blocks_and_extreme_scales(m) -> None:
    assert check_linear(m, 300, 260, torch.float32, "cuda", extreme=True) <= (
        1e-5 if m <= 4 else 1e-3
    )


def test_fp8_linear_saturation_is_finite() -> None:
    check_saturation("cuda")


def test_quantize_rows_is_the_reference() -> None:
    check_quantize_rows("cuda")


@pytest.mark.parametrize("num_tokens, grouped", [(1, False), (7, False), (300, True), (7, True)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_moe_matches_reference(num_tokens, grouped, dtype) -> None:
    # the grouped GEMMs sum on Hopper's fp8 tensor cores (~2^-14 within a block): an
    # intermediate activation can then round to the neighbouring e4m3 value (2^-3 apart),
    # measured 4.3e-3 in fp32 on the H200
    bound = MOE_BF16_BOUND if dtype == torch.bfloat16 else (1e-2 if grouped else 2e-5)
    assert check_moe(num_tokens, dtype, "cuda", grouped) <= bound


def check_moe_shared(num_tokens, dtype, device, block=(16, 32)) -> float:
    """Routed experts + a shared expert in the GEMV form's two launches vs the reference's
    routed experts plus `reference.fp8_shared_expert`, added in the hidden dtype."""
    from hyla.ops.fp8 import moe_kernels

    gen = torch.Generator().manual_seed(num_tokens + 100)
    E, I, D, k = 6, 32, 80, 2  # I a multiple of bn (the shared gate/up stack)
    gus = [_weight(I, D, block, gen) + _weight(I, D, block, gen) for _ in range(E + 1)]
    gu_q = torch.stack([torch.cat([g[0], g[2]]) for g in gus])
    gu_s = torch.stack([torch.cat([g[1], g[3]]) for g in gus])
    downs = [_weight(D, I, block, gen) for _ in range(E + 1)]
    dn_q, dn_s = torch.stack([d[0] for d in downs]), torch.stack([d[1] for d in downs])
    x = torch.randn(num_tokens, D, generator=gen).to(dtype)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(num_tokens)])
    wts = torch.rand(num_tokens, k, generator=gen)
    routed = (x, gu_q[:E], gu_s[:E], dn_q[:E], dn_s[:E], wts, ids, block)
    shared = (gu_q[E], gu_s[E], dn_q[E], dn_s[E])
    want = reference.fp8_moe_experts(*routed) + reference.fp8_shared_expert(x, *shared, block)
    dev = [a.to(device) if isinstance(a, torch.Tensor) else a for a in routed]
    dev_shared = tuple(a.to(device) for a in shared)
    assert moe_kernels.shared_fits(*dev[1:5], dev_shared)
    got = moe_kernels.fp8_moe_experts_and_shared(*dev, dev_shared)
    assert got.dtype == dtype and got.shape == want.shape
    return rel_err(got, want)


@pytest.mark.parametrize("num_tokens", [1, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_moe_with_shared_expert(num_tokens, dtype) -> None:
    bound = MOE_BF16_BOUND if dtype == torch.bfloat16 else 2e-5
    assert check_moe_shared(num_tokens, dtype, "cuda") <= bound


ALIGN_CASES = [(1, 4, 32, 16), (16, 4, 32, 16), (64, 4, 32, 16), (20, 2, 6, 16), (7, 3, 5, 4),
               (300, 6, 64, 64)]  # fmt: skip


def check_align(num_tokens, topk, experts, block_m, device) -> None:
    """The one-launch align equals `hyla.ops.moe.grouped.align` (the PyTorch definition):
    sorted pairs with their padding, and each block's expert (-1 past the last)."""
    from hyla.ops.fp8 import align_kernel
    from hyla.ops.moe.grouped import align

    gen = torch.Generator().manual_seed(num_tokens * 31 + experts)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:topk] for _ in range(num_tokens)])
    want = align(ids, experts, block_m)
    assert align_kernel.fits(ids.numel(), experts)
    got = align_kernel.align(ids.to(device), experts, block_m)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.cpu(), w)


@pytest.mark.parametrize("num_tokens, topk, experts, block_m", ALIGN_CASES)
def test_align_kernel_is_the_pytorch_align(num_tokens, topk, experts, block_m) -> None:
    check_align(num_tokens, topk, experts, block_m, "cuda")


def test_fp8_moe_forms() -> None:
    from hyla.ops.fp8.moe_kernels import gemv_form

    assert gemv_form(1, 4, 32) and gemv_form(8, 4, 32)
    assert not gemv_form(9, 4, 32) and not gemv_form(64, 4, 32)


def test_fp8_kernels_in_cuda_graph_equal_eager() -> None:
    from hyla.ops.fp8 import kernels, moe_kernels

    gen = torch.Generator().manual_seed(0)
    q, s = _weight(512, 384, (128, 128), gen)
    q, s = q.cuda(), s.cuda()
    x = torch.randn(2, 384, device="cuda", dtype=torch.bfloat16)
    kernels.fp8_linear(x, q, s, (128, 128))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.fp8_linear(x, q, s, (128, 128))
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(out, kernels.fp8_linear(x, q, s, (128, 128)))
    # the experts' decode path (GEMV rows) captured
    E, I, D = 4, 256, 384
    gu_q, gu_s = zip(*[_weight(2 * I, D, (128, 128), gen) for _ in range(E)], strict=True)
    dn_q, dn_s = zip(*[_weight(D, I, (128, 128), gen) for _ in range(E)], strict=True)
    w = [torch.stack(t).cuda() for t in (gu_q, gu_s, dn_q, dn_s)]
    h = torch.randn(2, D, device="cuda", dtype=torch.bfloat16)
    ids = torch.tensor([[0, 3], [1, 3]], device="cuda")
    wts = torch.rand(2, 2, device="cuda")
    for grouped in (False, True):  # both forms are sync-free
        moe_kernels.fp8_moe_experts(h, *w[:2], *w[2:], wts, ids, (128, 128), grouped=grouped)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe_kernels.fp8_moe_experts(
                h, *w[:2], *w[2:], wts, ids, (128, 128), grouped=grouped
            )
        h.copy_(torch.randn_like(h))
        ids.copy_(torch.tensor([[2, 1], [0, 2]], device="cuda"))
        graph.replay()
        want = moe_kernels.fp8_moe_experts(h, *w[:2], *w[2:], wts, ids, (128, 128), grouped=grouped)
        assert torch.equal(out, want)


def test_sparse_and_dense_mla_kernels_read_fp8_cache() -> None:
    """The split-k latent kernel over an fp8 latent cache with per-token scales equals the same
    kernel over a float cache of the dequantized values (and the CPU reference)."""
    from hyla.ops.fp8.reference import dequantize_per_token, quantize_per_token
    from hyla.ops.mla import mla_paged
    from hyla.ops.sparse_attention import sparse_mla

    gen = torch.Generator().manual_seed(9)
    P, B, H, dn, R, dr, T = 12, 16, 16, 32, 64, 16, 3
    latent = torch.randn(P, B, R + dr, generator=gen) * 3
    q8, sc = quantize_per_token(latent)
    deq = dequantize_per_token(q8, sc)
    q_nope = torch.randn(T, H, dn, generator=gen)
    q_rope = torch.randn(T, H, dr, generator=gen)
    kv_b = torch.randn(H * (dn + 32), R, generator=gen) / 8
    tables = torch.tensor([[3, 1, 7, 9, 2], [4, 5, 6, 8, 10]], dtype=torch.int32)
    cu = torch.tensor([0, 2, 3], dtype=torch.int32)
    seq = torch.tensor([70, 33], dtype=torch.int32)
    topk = torch.randint(0, 33, (T, 16), generator=gen, dtype=torch.int32)
    c = lambda t: t.cuda()  # noqa: E731
    for dtype in (torch.float32, torch.bfloat16):
        qn, qr = c(q_nope).to(dtype), c(q_rope).to(dtype)
        w_kv, lat = c(kv_b).to(dtype), c(deq).to(dtype)
        paged = (c(tables), c(cu), c(seq), 80, w_kv, 0.1)
        want = mla_paged(qn, qr, lat, *paged)
        got = mla_paged(qn, qr, c(q8), *paged, latent_scale=c(sc))
        assert rel_err(got.float(), want.float().cpu()) <= BOUNDS[dtype] * 2
        sparse = (c(tables), c(cu), c(topk), w_kv, 0.1)
        want = sparse_mla(qn, qr, lat, *sparse)
        got = sparse_mla(qn, qr, c(q8), *sparse, latent_scale=c(sc))
        assert rel_err(got.float(), want.float().cpu()) <= BOUNDS[dtype] * 2
