"""The fused gate kernels (`hyla.ops.gates.kernels`) against their PyTorch definition
(`hyla.ops.gates.reference`) on the same device, extreme values included, and inside a CUDA
graph. The checks take a device: test_gates_interpret.py runs them on CPU tensors under
TRITON_INTERPRET=1.

Bounds: g to 1e-6 relative plus 2 ulps of 1.0 times exp(A_log) absolute (log(1 + exp(raw))
for raw << 0 keeps only the rounding of 1 + exp(raw), which a 1-ulp difference in exp can flip);
beta to 1e-6 relative in fp32 and to 1 ulp (2^-7 relative) in bf16, plus the smallest
normal fp32 absolute (subnormal results may flush to zero)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

EXTREMES = [25.0, 20.5, 20.0, 19.5, 0.0, -10.0, -20.0, -30.0, -88.0, -100.0]


def assert_gates_close(got, want, A_log: torch.Tensor) -> None:
    (g, beta), (g_want, beta_want) = got, want
    assert g.dtype == torch.float32 and g.shape == g_want.shape and g.is_contiguous()
    assert beta.dtype == beta_want.dtype and beta.shape == beta_want.shape
    scale = A_log.float().exp().reshape(1, -1, *([1] * (g.dim() - 2)))  # [1, HV(, 1)]
    bound = 1e-6 * g_want.abs() + 2 * 2**-23 * scale
    assert bool(((g - g_want).abs() <= bound).all()), (g - g_want).abs().max()
    rtol = 2**-7 if beta.dtype == torch.bfloat16 else 1e-6
    tiny = torch.finfo(torch.float32).tiny  # subnormal sigmoids (b < -87) may flush to 0
    torch.testing.assert_close(beta.float(), beta_want.float(), rtol=rtol, atol=tiny)


def _extreme_fill(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    picks = torch.tensor(EXTREMES)[torch.randint(len(EXTREMES), x.shape, generator=gen)]
    return torch.where(torch.rand(x.shape, generator=gen) < 0.5, picks, x)


def kda_inputs(T: int, HV: int, K: int, dtype, device, extreme: bool, seed: int = 0):
    """f_b_out [T, HV*K], dt_bias [HV*K], A_log [1, 1, HV, 1], b [T, HV] as a bf16 / fp32
    model holds them; extreme: raw beyond the softplus threshold and far below 0, A in
    [e^-6, e^6]."""
    gen = torch.Generator().manual_seed(seed)
    f = torch.randn(T, HV * K, generator=gen) * 3
    b = torch.randn(T, HV, generator=gen) * 4
    a_log = torch.rand(1, 1, HV, 1, generator=gen).mul(15).add(1).log()
    if extreme:
        f, b = _extreme_fill(f, gen), _extreme_fill(b, gen)
        a_log = torch.rand(1, 1, HV, 1, generator=gen).mul(12).sub(6)
    dt_bias = torch.randn(HV * K, generator=gen) - 3
    return [t.to(dtype).to(device) for t in (f, dt_bias, a_log, b)]


def check_kda(T: int, HV: int, K: int, dtype, device, extreme: bool = False) -> None:
    from hyla.ops.gates import kernels, reference

    f, dt_bias, a_log, b = kda_inputs(T, HV, K, dtype, device, extreme, seed=T * HV + K)
    want = reference.kda_gates(f, dt_bias, a_log, b)
    assert_gates_close(kernels.kda_gates(f, dt_bias, a_log, b), want, a_log.reshape(-1))
    # b as the layer has it: a column slice of the stacked projection output
    wide = torch.cat([torch.randn_like(f), b], dim=-1)[:, f.shape[1] :]
    assert_gates_close(kernels.kda_gates(f, dt_bias, a_log, wide), want, a_log.reshape(-1))


def check_kda_bounded(T: int, HV: int, K: int, dtype, device, extreme: bool = False) -> None:
    """The bounded decay (GLM-5.3-Flash, lower bound -5): g = lb * sigmoid(exp(A_log) raw)."""
    from hyla.ops.gates import kernels, reference

    f, dt_bias, a_log, b = kda_inputs(T, HV, K, dtype, device, extreme, seed=T * HV + K + 1)
    a_log = a_log.reshape(-1)  # stored as [HV]
    g = reference.kda_log_decay_bounded(f, dt_bias, a_log, -5.0)
    got = kernels.kda_gates(f, dt_bias, a_log, b, -5.0)
    # the bound of assert_gates_close with exp(A_log) -> 1: |dg| <= |lb| sigmoid' |y| |dy / y|
    # <= 5 * 0.23 * 2^-23 for an ulp of y = exp(A_log) raw
    assert_gates_close(got, (g, b.sigmoid()), torch.zeros_like(a_log))


def gdn_inputs(T: int, HV: int, dtype, device, extreme: bool, seed: int = 0):
    """a, b [T, HV] (strided, as `_split_projections` may leave them), A_log, dt_bias [HV]."""
    gen = torch.Generator().manual_seed(seed)
    ab = torch.randn(T, 2 * HV, generator=gen) * 4
    a_log = torch.rand(HV, generator=gen).mul(16).add(0.01).log()
    if extreme:
        ab = _extreme_fill(ab, gen)
        a_log = torch.rand(HV, generator=gen).mul(12).sub(6)
    dt_bias = torch.randn(HV, generator=gen)
    ab, a_log, dt_bias = (t.to(dtype).to(device) for t in (ab, a_log, dt_bias))
    return ab[:, 0::2], ab[:, 1::2], a_log, dt_bias


def check_gdn(T: int, HV: int, dtype, device, extreme: bool = False) -> None:
    from hyla.ops.gates import kernels, reference

    a, b, a_log, dt_bias = gdn_inputs(T, HV, dtype, device, extreme, seed=T * HV)
    want = reference.gdn_gates(a, b, a_log, dt_bias)
    assert_gates_close(kernels.gdn_gates(a, b, a_log, dt_bias), want, a_log)
    got = kernels.gdn_gates(a.contiguous(), b.contiguous(), a_log, dt_bias)
    assert_gates_close(got, want, a_log)


SHAPES = [(T, HV, K) for T in (1, 7, 64) for HV in (2, 32) for K in (16, 128)]
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


@DTYPES
@pytest.mark.parametrize("extreme", [False, True], ids=["normal", "extreme"])
@pytest.mark.parametrize(("T", "HV", "K"), SHAPES)
def test_kda_gates(T: int, HV: int, K: int, dtype: torch.dtype, extreme: bool) -> None:
    check_kda(T, HV, K, dtype, "cuda", extreme)


@DTYPES
@pytest.mark.parametrize("extreme", [False, True], ids=["normal", "extreme"])
@pytest.mark.parametrize(("T", "HV", "K"), SHAPES)
def test_kda_gates_bounded(T: int, HV: int, K: int, dtype: torch.dtype, extreme: bool) -> None:
    check_kda_bounded(T, HV, K, dtype, "cuda", extreme)


@DTYPES
@pytest.mark.parametrize("extreme", [False, True], ids=["normal", "extreme"])
@pytest.mark.parametrize(("T", "HV"), [(1, 2), (7, 32), (64, 32), (1000, 48)])
def test_gdn_gates(T: int, HV: int, dtype: torch.dtype, extreme: bool) -> None:
    check_gdn(T, HV, dtype, "cuda", extreme)


def test_gates_replay_in_a_cuda_graph() -> None:
    from hyla.ops.gates import kernels, reference

    kda_args = kda_inputs(4, 32, 128, torch.bfloat16, "cuda", extreme=True)
    gdn_args = gdn_inputs(4, 32, torch.bfloat16, "cuda", extreme=True)
    kernels.kda_gates(*kda_args), kernels.gdn_gates(*gdn_args)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kda_out, gdn_out = kernels.kda_gates(*kda_args), kernels.gdn_gates(*gdn_args)
    for t in (*kda_args, *gdn_args):
        t.mul_(0.5)
    graph.replay()
    assert_gates_close(kda_out, reference.kda_gates(*kda_args), kda_args[2].reshape(-1))
    assert_gates_close(gdn_out, reference.gdn_gates(*gdn_args), gdn_args[2])
