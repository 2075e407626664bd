"""Launches of an fp8 decode step's pieces, counted on the CPU (Triton interpreter +
`launch_count`): each fp8 projection (or stacked group of projections) is one kernel and the fp8
experts two, as many as the bf16 path's; no PyTorch op runs beside them (the first fp8 path ran
a quantize kernel per projection, one GEMV per stacked part plus a concatenation, and 18
launches per MoE call: 4x bf16's step time on the H200, bench/results/gpu_fp8_h200.json)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.launch_count import count_launches
from tests.ops.test_linear_stacked import _fp8_linears

pytestmark = interpreter.marks("test_fp8_gpu.py")


def _triton_on_cpu(*modules: str):
    patches = [mock.patch(f"{m}.use_triton", lambda x: True) for m in modules]
    for p in patches:
        p.start()
    return patches


@pytest.fixture
def triton_paths():
    patches = _triton_on_cpu("hyla.ops.fp8", "hyla.ops.linear.dispatch")
    yield
    for p in patches:
        p.stop()


@pytest.mark.parametrize("rows", [1, 4, 16, 64])
@torch.no_grad()
def test_fp8_projection_is_one_launch(triton_paths, rows: int) -> None:
    (mod,) = _fp8_linears([48], dim=64)
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    with count_launches() as found:
        mod(x)
    assert found.total == 1 and not found.torch


@torch.no_grad()
def test_stacked_fp8_inputs_are_one_launch_as_bf16(triton_paths) -> None:
    from hyla.layers.linear import stacked_linear
    from hyla.ops.linear import Prepacked, stack_rows

    mods = _fp8_linears([32, 32, 32, 16, 16, 4], dim=64)  # KDA's q, k, v, f_a, g_a, b
    stack_rows(mods)
    x = torch.randn(1, 64, dtype=torch.bfloat16)
    with count_launches() as fp8:
        stacked_linear(x, mods, Prepacked())
    bf16 = [torch.nn.Linear(64, m.out_features, bias=False).to(torch.bfloat16) for m in mods]
    stack_rows(bf16)
    with count_launches() as base:
        stacked_linear(x, bf16, Prepacked())
    assert fp8.total == base.total == 1


@pytest.mark.parametrize("tokens, launches", [(1, 2), (2, 2)])
@torch.no_grad()
def test_fp8_experts_decode_is_two_launches(triton_paths, tokens: int, launches: int) -> None:
    from hyla.ops.fp8 import fp8_moe_experts, quantize_weight_blockwise

    E, I, D, k, block = 8, 32, 64, 4, (16, 32)
    gu = [quantize_weight_blockwise(torch.randn(2 * I, D), block) for _ in range(E)]
    dn = [quantize_weight_blockwise(torch.randn(D, I), block) for _ in range(E)]
    (gu_q, gu_s), (dn_q, dn_s) = (map(torch.stack, zip(*w, strict=True)) for w in (gu, dn))
    x = torch.randn(tokens, D, dtype=torch.bfloat16)
    ids = torch.stack([torch.randperm(E)[:k] for _ in range(tokens)])
    wts = torch.rand(tokens, k)
    with count_launches() as found:
        fp8_moe_experts(x, gu_q, gu_s, dn_q, dn_s, wts, ids, block)
    assert found.total == launches and set(found.triton) == {
        "_gate_up_gemv_kernel",
        "_down_gemv_kernel",
    }


@torch.no_grad()
def test_fp8_experts_grouped_is_five_launches(triton_paths) -> None:
    # 16 pairs over 8 experts: the grouped form; the PyTorch align alone was ~25 launches
    from hyla.ops.fp8 import fp8_moe_experts, quantize_weight_blockwise

    E, I, D, k, block, tokens = 8, 32, 64, 4, (16, 32), 4
    gu = [quantize_weight_blockwise(torch.randn(2 * I, D), block) for _ in range(E)]
    dn = [quantize_weight_blockwise(torch.randn(D, I), block) for _ in range(E)]
    (gu_q, gu_s), (dn_q, dn_s) = (map(torch.stack, zip(*w, strict=True)) for w in (gu, dn))
    x = torch.randn(tokens, D, dtype=torch.bfloat16)
    ids = torch.stack([torch.randperm(E)[:k] for _ in range(tokens)])
    wts = torch.rand(tokens, k)
    with count_launches() as found:
        fp8_moe_experts(x, gu_q, gu_s, dn_q, dn_s, wts, ids, block)
    assert set(found.triton) == {"_align_kernel", "_gate_up_grouped_kernel", "_down_grouped_kernel"}
    assert found.total == 5, found  # + the sum of each token's k rows and its cast


def _fp8_moe_layer(block=(16, 32)):
    """The tiny Kimi MoE layer with fp8 routed experts and an fp8 shared expert (gate and up
    stacked, as `stack_projections` leaves them), random weights, fp32."""
    from hyla.layers.fp8_experts import Fp8Experts
    from hyla.layers.moe import MoE
    from hyla.models.registry import config_from_hf
    from hyla.ops.fp8 import quantize_weight_blockwise
    from hyla.ops.linear import stack_rows
    from tests.hf_tiny import tiny_hf_config

    config = config_from_hf(tiny_hf_config("kimi_linear").to_dict()).replace(dtype="float32")
    layer = MoE(config, 1)
    gen = torch.Generator().manual_seed(0)
    for p in layer.parameters():
        p.data = torch.randn(p.shape, generator=gen) * 0.05
    E, two_i, D = layer.experts.gate_up_proj.shape
    experts = Fp8Experts(E, D, two_i // 2, block)
    for name, parts in (("gate_up_proj", 2), ("down_proj", 1)):
        w = getattr(layer.experts, name).data
        q, s = zip(*[_quantize_parts(w[e], block, parts) for e in range(E)], strict=True)
        getattr(experts, name).data = torch.stack(q)
        getattr(experts, f"{name}_scale_inv").data = torch.stack(s)
    layer.experts = experts
    mlp = layer.shared_experts
    for name in ("gate_proj", "up_proj", "down_proj"):
        (mod,) = _fp8_linears([getattr(mlp, name).out_features], getattr(mlp, name).in_features,
                              block)  # fmt: skip
        q, s = quantize_weight_blockwise(getattr(mlp, name).weight.data, block)
        mod.weight.data, mod.weight_scale_inv.data = q, s
        setattr(mlp, name, mod)
    stack_rows(mlp.stacked_projections())
    return layer, torch.randn(1, D, generator=gen)


def _quantize_parts(w, block, parts):
    from hyla.ops.fp8 import quantize_weight_blockwise

    q, s = zip(*[quantize_weight_blockwise(p, block) for p in w.chunk(parts)], strict=True)
    return torch.cat(q), torch.cat(s)


@torch.no_grad()
def test_fp8_moe_layer_runs_its_shared_expert_in_the_two_launches(monkeypatch) -> None:
    """Decode rows of an fp8 MoE layer: routed experts and the shared expert in two launches
    (use_triton sent to the interpreter), equal to the layer run op by op (fp32)."""
    layer, x = _fp8_moe_layer()
    want = layer(x)  # CPU: the references, op by op
    monkeypatch.setattr("hyla.ops.fp8.use_triton", lambda t: True)
    with count_launches() as found:
        got = layer.experts and layer._fp8_with_shared(x, *layer.gate(x))
    assert got is not None, "the fused fp8 path did not run"
    assert set(found.triton) == {"_gate_up_gemv_kernel", "_down_gemv_kernel"}
    assert sum(found.triton.values()) == 2
    torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-6)
