"""Clamped-SwiGLU experts: the grouped reference against transformers' `Glm5NextTextExperts`
(same fused weights, a limit that bites), and the sync-free dense form against the grouped one."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.moe_clamped.reference import moe_experts_clamped, moe_experts_clamped_dense


def _case(seed: int, tokens: int = 9, experts: int = 6, k: int = 2):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, 16, generator=gen)
    gate_up, down = torch.randn(experts, 2 * 8, 16, generator=gen), torch.randn(experts, 16, 8)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    return x, gate_up, down, torch.rand(tokens, k, generator=gen), ids


@pytest.mark.parametrize("seed", range(3))
def test_grouped_matches_transformers_experts(seed: int):
    from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextExperts

    x, gate_up, down, w, ids = _case(seed)
    cfg = Glm5NextTextConfig(hidden_size=16, moe_intermediate_size=8, n_routed_experts=6,
                             swiglu_limit=1.5, num_hidden_layers=1)  # fmt: skip
    ref = Glm5NextTextExperts(cfg)
    with torch.no_grad():
        ref.gate_up_proj.copy_(gate_up)
        ref.down_proj.copy_(down)
        want = ref(x, ids, w)
    got = moe_experts_clamped(x, gate_up, down, w, ids, 1.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    unclamped = moe_experts_clamped(x, gate_up, down, w, ids, 1e9)
    assert (unclamped - want).abs().max() > 1e-2  # the clamp bites in this case


@pytest.mark.parametrize("seed", range(3))
def test_dense_form_matches_grouped(seed: int):
    args = _case(seed, tokens=5)
    torch.testing.assert_close(
        moe_experts_clamped_dense(*args, 1.5), moe_experts_clamped(*args, 1.5), rtol=1e-5,
        atol=1e-5,
    )  # fmt: skip
