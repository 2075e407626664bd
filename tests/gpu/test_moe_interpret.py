"""The Triton MoE GEMV kernels on CPU tensors under TRITON_INTERPRET=1 (tiny shapes): the checks of
`test_moe_gpu.py` without a GPU. Skipped as `test_dsa_interpret.py` is (no triton, CUDA present,
or triton imported earlier without the flag: run this file on its own)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_moe_gpu import check_combine, check_gemv, check_gemv_shared

pytestmark = interpreter.marks("test_moe_gpu.py")


@pytest.mark.parametrize("T", [1, 3])
def test_gemv(T: int) -> None:
    assert check_gemv(T, torch.float32, "cpu", dims=(8, 3, 40, 24)) <= 1e-5
    assert check_gemv(T, torch.bfloat16, "cpu", dims=(8, 2, 40, 24)) <= 3e-2


def test_gemv_uneven_tiles() -> None:
    from hyla.ops.moe.gemv import GemvBlocks

    b = GemvBlocks(2, 16, 4, 4, 16, 4)  # splits I = 24 and D = 40 unevenly
    assert check_gemv(2, torch.float32, "cpu", dims=(8, 3, 40, 24), blocks=b) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_combine(dtype: torch.dtype) -> None:
    # fp32: bitwise; bf16: the interpreter truncates each rounding (GPU: bitwise, see there)
    bound = 0.0 if dtype == torch.float32 else 2.0**-6
    assert check_combine(3, 8, 3, 40, dtype, "cpu") <= bound
    assert check_combine(2, 16, 4, 600, dtype, "cpu") <= bound  # two column blocks


@pytest.mark.parametrize("T", [1, 3])
def test_gemv_with_a_shared_expert(T: int) -> None:
    assert check_gemv_shared(T, torch.float32, "cpu", dims=(8, 3, 40, 24)) <= 1e-5


def test_moe_layer_fuses_its_shared_expert(monkeypatch) -> None:
    """The MoE layer's decode path with the shared expert inside the GEMV kernels (use_triton
    sent to the interpreter) equals the layer run op by op (fp32)."""
    from hyla.layers.moe import MoE
    from hyla.models.registry import config_from_hf
    from hyla.ops import moe as moe_ops
    from tests.hf_tiny import tiny_hf_config

    config = config_from_hf(tiny_hf_config("kimi_linear").to_dict()).replace(dtype="float32")
    layer = MoE(config, 1)
    gen = torch.Generator().manual_seed(0)
    for p in layer.parameters():
        p.data = torch.randn(p.shape, generator=gen) * 0.05
    mlp = layer.shared_experts
    stacked = torch.cat([mlp.gate_proj.weight.data, mlp.up_proj.weight.data])
    mlp.gate_proj.weight.data, mlp.up_proj.weight.data = stacked.split(
        [mlp.gate_proj.weight.shape[0], mlp.up_proj.weight.shape[0]]
    )
    x = torch.randn(1, config.hidden_size, generator=gen)
    with torch.no_grad():
        want = layer(x)
        calls = []
        real = moe_ops.moe_experts_and_shared
        monkeypatch.setattr(moe_ops, "use_triton", lambda t: True)
        monkeypatch.setattr("hyla.layers.moe.use_triton", lambda t: True)
        monkeypatch.setattr(
            "hyla.layers.moe.moe_experts_and_shared",
            lambda *a: calls.append(1) or real(*a),
        )
        got = layer(x)
    assert calls, "the fused path did not run"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("family", "overrides", "fuses"),
    [
        ("kimi_linear", {"num_experts_per_tok": 3}, True),  # k not a power of two
        ("deepseek_v32", {}, True),
        ("kimi_linear", {"n_shared_experts": 2}, False),  # shared width 2I
        ("qwen3_next", {"shared_expert_intermediate_size": 32}, False),  # gated: never fused
    ],
)
def test_model_moe_layers_fuse_only_what_they_should(monkeypatch, family, overrides, fuses):
    """Whole tiny models: weights stacked by `stack_projections`, then reloaded in place
    (load_state_dict); every MoE layer at each T with T k <= E (and one T past it) equals the
    layer run op by op (fp32), fused exactly where the shared expert is ungated and as wide as a
    routed expert, and never with autograd on."""
    from hyla.engine.llm import randomize_weights
    from hyla.layers.moe import MoE
    from hyla.models.hybrid import HybridModel
    from hyla.models.registry import config_from_hf
    from hyla.ops import moe as moe_ops
    from tests.hf_tiny import tiny_hf_config

    config = config_from_hf(tiny_hf_config(family, **overrides).to_dict()).replace(dtype="float32")
    model = randomize_weights(HybridModel(config), seed=1).eval()
    model.stack_projections()
    model.load_state_dict({k: v * 1.5 for k, v in model.state_dict().items()})
    moe = config.moe
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    calls = []
    real = moe_ops.moe_experts_and_shared
    monkeypatch.setattr(
        "hyla.layers.moe.moe_experts_and_shared", lambda *a: calls.append(1) or real(*a)
    )
    gen = torch.Generator().manual_seed(0)
    for T in range(1, moe.num_experts // moe.num_experts_per_tok + 2):
        x = torch.randn(T, config.hidden_size, generator=gen)
        for layer in layers[:2]:
            with torch.no_grad(), monkeypatch.context() as m:
                want = layer(x)
                m.setattr(moe_ops, "use_triton", lambda t: True)
                m.setattr("hyla.layers.moe.use_triton", lambda t: True)
                calls.clear()
                got = layer(x)
                fused = bool(calls)
                with torch.enable_grad():
                    calls.clear()
                    layer(x)
                    assert not calls, "fused with autograd on"
            assert fused == (fuses and T * moe.num_experts_per_tok <= moe.num_experts), T
            torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)
