"""The sync-free MoE experts (`hyla.ops.moe.kernels`) on CUDA against the per-expert reference on
CPU copies: Triton GEMV (T k <= E), dense (T E <= `DENSE_MAX_ROWS`) and grouped forms; and the
Triton GEMV kernels against their PyTorch definition (`kernels._gathered` + `_weighted_sum`) on
the same device (`check_gemv` takes a device: test_moe_interpret.py runs it on CPU tensors under
TRITON_INTERPRET=1). The routing kernels (`route_kernels.py`) against `reference.route_*` on the
same device: `check_route_sigmoid` / `check_route_softmax` (test_moe_route_interpret.py runs them
interpreted), here on CUDA and in a captured CUDA graph."""

import pytest
import torch

from hyla.ops.moe import moe_experts, reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def check_gemv(T: int, dtype: torch.dtype, device, dims=(32, 4, 256, 96), blocks=None) -> float:
    """`gemv.moe_gemv` (tiles `blocks`, default `pick_blocks`) vs `kernels._gathered` +
    `kernels._weighted_sum` on the same device and dtype; returns max |diff| / max |want|."""
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
    got = moe_gemv(*args, blocks=blocks).float().cpu()
    y = kernels._gathered(args[0], args[1], args[2], args[4])
    want = kernels._weighted_sum(y, args[3], args[4], dtype).float().cpu()
    return float((got - want).abs().max() / want.abs().max())


def check_gemv_shared(T: int, dtype: torch.dtype, device, dims=(16, 3, 200, 72)) -> float:
    """`gemv.moe_gemv(..., shared=)` vs the routed PyTorch form plus the shared expert run as
    separate ops (F.linear, silu_and_mul's reference) on the same device: max rel. diff."""
    import torch.nn.functional as F

    from hyla.ops.activation import reference as act
    from hyla.ops.moe import kernels
    from hyla.ops.moe.gemv import moe_gemv

    num_experts, topk, dim, inter = dims
    # drawn on the device: the DeepSeek-sized case is 30 GB of fp32 randn, minutes on the host
    gen, on = torch.Generator(device=device).manual_seed(T + 11), dict(device=device)
    x = torch.randn(T, dim, generator=gen, **on).to(dtype)
    gate_up = (torch.randn(num_experts, 2 * inter, dim, generator=gen, **on) / dim**0.5).to(dtype)
    down = (torch.randn(num_experts, dim, inter, generator=gen, **on) / inter**0.5).to(dtype)
    s_gate_up = (torch.randn(2 * inter, dim, generator=gen, **on) / dim**0.5).to(dtype)
    s_down = (torch.randn(dim, inter, generator=gen, **on) / inter**0.5).to(dtype)
    ids = torch.stack(
        [torch.randperm(num_experts, generator=gen, **on)[:topk] for _ in range(T)]
    )
    w = torch.rand(T, topk, generator=gen, **on)
    a = [x, gate_up, down, w, ids, s_gate_up, s_down]
    got = moe_gemv(*a[:5], shared=(a[5], a[6])).float().cpu()
    routed = kernels._weighted_sum(kernels._gathered(a[0], a[1], a[2], a[4]), a[3], a[4], dtype)
    want = (routed + F.linear(act.silu_and_mul(F.linear(a[0], a[5])), a[6])).float().cpu()
    return float((got - want).abs().max() / want.abs().max())


def check_combine(T: int, E: int, k: int, D: int, dtype: torch.dtype, device) -> float:
    """`gemv.combine` vs `kernels._select` + `kernels._weighted_sum` on the same device: max
    |diff| / max |want| (0 on a GPU: the same fp32 products, each rounded to dtype, summed in the
    same order with each add rounded; the interpreter rounds fp32 -> bf16 toward zero)."""
    from hyla.ops.moe import kernels
    from hyla.ops.moe.gemv import combine

    gen = torch.Generator().manual_seed(T * 7 + E)
    y = torch.randn(E, T, D, generator=gen).to(dtype).to(device)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)]).to(device)
    w = torch.rand(T, k, generator=gen).to(device)
    want = kernels._weighted_sum(kernels._select(y, ids), w, ids, dtype)
    got = combine(y, w, ids, dtype)
    assert got.dtype == dtype and got.shape == want.shape
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def route_logits(T: int, E: int, kind: str, device, seed: int = 0) -> torch.Tensor:
    """[T, E] float32 router logits: "randn"; "ties" (4 values: exact ties everywhere, also at
    the k-th place); "neginf" (randn with -inf and -1e30 entries)."""
    gen = torch.Generator().manual_seed(seed + 31 * T + E)
    x = torch.randn(T, E, generator=gen)
    if kind == "ties":
        x = torch.tensor([-1.0, 0.0, 0.5, 2.0])[torch.randint(0, 4, (T, E), generator=gen)]
    elif kind == "neginf":
        r = torch.rand(T, E, generator=gen)
        x = x.masked_fill(r < 0.3, float("-inf")).masked_fill(r > 0.8, -1e30)
    return x.to(device)


def check_route_sigmoid(
    T, E, k, n_group, topk_group, kind, has_bias, norm, scale, device
) -> None:  # fmt: skip
    """`route_kernels.route_sigmoid` vs `reference.route_sigmoid` on `device`: ids equal, weights
    within 1e-6 relative."""
    from hyla.ops.moe import route_kernels

    logits = route_logits(T, E, kind, device)
    bias = None
    if has_bias:  # a few values, so biased scores tie too
        gen = torch.Generator().manual_seed(E)
        bias = (torch.randint(0, 3, (E,), generator=gen) * 0.125).to(device)
    args = (logits, bias, k, n_group, topk_group, norm, scale)
    w_want, ids_want = reference.route_sigmoid(*args)
    w_got, ids_got = route_kernels.route_sigmoid(*args)
    assert ids_got.dtype == torch.int64 and w_got.dtype == torch.float32
    assert torch.equal(ids_got, ids_want)
    torch.testing.assert_close(w_got, w_want, rtol=1e-6, atol=0.0)


def check_route_softmax(T, E, k, kind, norm, dtype, device) -> None:
    """`route_kernels.route_softmax` vs `reference.route_softmax` on `device`: ids equal, weights
    within 1e-6 relative (fp32) or one unit of the last place (bf16: each rounds an fp32 value
    that may differ in its last bits)."""
    from hyla.ops.moe import route_kernels

    logits = route_logits(T, E, kind, device).to(dtype)
    w_want, ids_want = reference.route_softmax(logits, k, norm)
    w_got, ids_got = route_kernels.route_softmax(logits, k, norm)
    assert ids_got.dtype == torch.int64 and w_got.dtype == dtype
    assert torch.equal(ids_got, ids_want)
    rtol = 1e-6 if dtype == torch.float32 else 2.0**-7
    torch.testing.assert_close(w_got, w_want, rtol=rtol, atol=0.0)


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


@pytest.mark.parametrize("blocks", [(2, 64, 4, 4, 32, 4), (16, 2048, 8, 32, 512, 8)])
def test_gemv_any_tiles(blocks) -> None:
    """Tiles that split I and D unevenly and tiles larger than them: the same results."""
    from hyla.ops.moe.gemv import GemvBlocks

    b = GemvBlocks(*blocks)
    assert check_gemv(3, torch.float32, "cuda", dims=(16, 3, 200, 72), blocks=b) <= 1e-5
    assert check_gemv(2, torch.bfloat16, "cuda", dims=(16, 8, 200, 72), blocks=b) <= 3e-2


@pytest.mark.parametrize("T", [1, 2, 5])
def test_gemv_with_a_shared_expert(T: int) -> None:
    assert check_gemv_shared(T, torch.float32, "cuda") <= 1e-5
    assert check_gemv_shared(T, torch.bfloat16, "cuda") <= 3e-2
    assert check_gemv_shared(T, torch.bfloat16, "cuda", dims=(256, 8, 7168, 2048)) <= 3e-2


def test_shared_weights_that_do_not_fit_are_refused() -> None:
    from hyla.ops.moe.gemv import moe_gemv, shared_fits

    gate_up, down = torch.randn(4, 16, 8, device="cuda"), torch.randn(4, 8, 8, device="cuda")
    x, ids = torch.randn(1, 8, device="cuda"), torch.tensor([[0, 1]], device="cuda")
    w = torch.rand(1, 2, device="cuda")
    cuda = dict(device="cuda")  # built there: .cuda() of a strided view makes it contiguous
    bad = [
        (torch.randn(12, 8, **cuda), torch.randn(8, 6, **cuda)),  # narrower than the routed ones
        (torch.randn(16, 8, **cuda).half(), torch.randn(8, 8, **cuda).half()),  # another dtype
        (torch.randn(16, 16, **cuda)[:, :8], torch.randn(8, 8, **cuda)),  # rows spaced differently
    ]
    for sg, sd in bad:
        assert not shared_fits(gate_up, down, sg, sd)
        with pytest.raises(ValueError, match="shared"):
            moe_gemv(x, gate_up, down, w, ids, shared=(sg, sd))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_combine_equals_its_pytorch_definition(dtype: torch.dtype) -> None:
    for T, E, k, D in [(1, 8, 2, 40), (16, 32, 4, 600), (5, 256, 8, 1030)]:
        assert check_combine(T, E, k, D, dtype, "cuda") == 0.0  # exact (a zero's sign aside)


@pytest.mark.parametrize("T", [1, 5, 64, 300])
@pytest.mark.parametrize("kind", ["randn", "ties", "neginf"])
@pytest.mark.parametrize(
    "E, k, n_group, topk_group", [(8, 2, 1, 1), (32, 4, 4, 2), (256, 8, 1, 1), (256, 8, 8, 4)]
)
def test_route_kernels_match_reference(T, kind, E, k, n_group, topk_group) -> None:
    check_route_sigmoid(T, E, k, n_group, topk_group, kind, True, True, 2.5, "cuda")
    check_route_sigmoid(T, E, k, n_group, topk_group, kind, False, False, 1.0, "cuda")
    for dtype in (torch.float32, torch.bfloat16):
        check_route_softmax(T, E, k, kind, True, dtype, "cuda")


def test_route_kernels_in_cuda_graph() -> None:
    """Captured once, replayed on new logits: the same results as eager calls."""
    from hyla.ops.moe import route_sigmoid, route_softmax

    bias = torch.rand(256, device="cuda") * 0.1
    static = route_logits(4, 256, "randn", "cuda", seed=1)
    route = lambda x: (route_sigmoid(x, bias, 8, 8, 4, True, 2.5), route_softmax(x, 8))  # noqa: E731
    route(static)  # warm up (compile) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = route(static)
    for seed in (2, 3):
        static.copy_(route_logits(4, 256, "ties" if seed == 3 else "randn", "cuda", seed=seed))
        graph.replay()
        want = route(static.clone())
        for got_t, want_t in zip((*out[0], *out[1]), (*want[0], *want[1]), strict=True):
            assert torch.equal(got_t, want_t)
