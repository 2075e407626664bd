"""MoE routing and expert ops vs the transformers routers and per-token oracles (case C08)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DeepseekV32Config, KimiLinearConfig, Qwen3NextConfig
from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32TopkRouter
from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearTopkRouter
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextTopKRouter

from hyla.ops.moe import moe_experts, route_sigmoid, route_softmax, stable_topk

E, G, TOPK_GROUP, K, D = 16, 4, 2, 4, 8
SCALE = 2.5


def _hf_router(family: str) -> torch.nn.Module:
    common = dict(
        hidden_size=D,
        num_experts_per_tok=K,
        n_group=G,
        topk_group=TOPK_GROUP,
        routed_scaling_factor=SCALE,
        norm_topk_prob=True,
    )
    if family == "kimi_linear":
        return KimiLinearTopkRouter(KimiLinearConfig(num_local_experts=E, **common))
    return DeepseekV32TopkRouter(DeepseekV32Config(n_routed_experts=E, **common))


def _route(router: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.nn.functional.linear(x.float(), router.weight.float())
    return route_sigmoid(logits, router.e_score_correction_bias, K, G, TOPK_GROUP, True, SCALE)


def _by_expert(ids: torch.Tensor, weights: torch.Tensor) -> list[dict[int, float]]:
    pairs = zip(ids.tolist(), weights.tolist(), strict=True)
    return [dict(zip(i, w, strict=True)) for i, w in pairs]


def _selected_groups(biased: list[float]) -> set[int]:
    # independent oracle: group score = sum of the two best biased scores, best two groups
    size = E // G
    scores = [sum(sorted(biased[g * size : (g + 1) * size], reverse=True)[:2]) for g in range(G)]
    return set(sorted(range(G), key=lambda g: (-scores[g], g))[:TOPK_GROUP])


def test_stable_topk_lowest_index_wins() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, float("-inf")]])
    values, ids = stable_topk(x, 4)
    assert ids.tolist() == [[1, 2, 4, 3]]
    assert values.tolist() == [[3.0, 3.0, 3.0, 2.0]]


@pytest.mark.parametrize("family", ["kimi_linear", "deepseek_v32"])
def test_c08_negative_biased_scores_stay_in_selected_groups(family: str) -> None:
    torch.manual_seed(0)
    router = _hf_router(family)
    with torch.no_grad():
        router.weight.normal_(0.0, 1.0)
        router.e_score_correction_bias.copy_(-2.0 - 0.5 * torch.rand(E))
    x = torch.randn(64, D)
    weights, ids = _route(router, x)
    _, hf_weights, hf_ids = router(x)

    scores = torch.nn.functional.linear(x, router.weight).sigmoid()
    biased = scores + router.e_score_correction_bias
    assert (biased < 0).all()
    for t in range(64):
        groups = _selected_groups(biased[t].tolist())
        assert {e // (E // G) for e in ids[t].tolist()} <= groups
    ours, theirs = _by_expert(ids, weights), _by_expert(hf_ids, hf_weights)
    for t in range(64):
        assert ours[t].keys() == theirs[t].keys()
        for e, w in ours[t].items():
            assert math.isclose(w, theirs[t][e], rel_tol=1e-6)

    # The case has teeth: filling masked experts with 0 instead of -inf picks outside experts.
    masked = biased.view(64, G, -1).masked_fill(
        ~torch.zeros(64, G, dtype=torch.bool)
        .scatter_(1, torch.tensor([sorted(_selected_groups(b.tolist())) for b in biased]), True)
        .unsqueeze(-1),
        0.0,
    )
    naive_ids = masked.view(64, E).topk(K).indices
    assert any(
        not {e // (E // G) for e in naive_ids[t].tolist()} <= _selected_groups(biased[t].tolist())
        for t in range(64)
    )


def _tie_router() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router weight [E, D], bias [E] and token x [D] whose logits are exact dyadic numbers.

    Per group of 4 experts, (logit, bias):
      g0: (-2, +1) (0, 0) (-4, 0) (-4, 0)   biased 1.119, 0.5 -> group score 1.619 (best)
      g1: (0, 0) (0, 0) (0, 0) (-4, 0)      biased 0.5 x3     -> 1.0  tied with g3
      g2: (3, -0.9) (-4, 0) (0, -0.2) (-4, 0)                  -> 0.35
      g3: (0, 0) (0, 0) (-4, 0) (-4, 0)                         -> 1.0  tied with g1
    Lowest index wins: groups {0, 1}; experts 0, then the tied 0.5s 1, 4, 5 (not 6).
    """
    logits = torch.tensor([-2, 0, -4, -4, 0, 0, 0, -4, 3, -4, 0, -4, 0, 0, -4, -4.0])
    bias = torch.tensor([1, 0, 0, 0, 0, 0, 0, 0, -0.9, 0, -0.2, 0, 0, 0, 0, 0.0])
    weight = torch.randn(E, D)
    weight[:, 0] = logits
    x = torch.zeros(D)
    x[0] = 1.0  # x @ weight.T == logits exactly
    return weight, bias, x


@pytest.mark.parametrize("family", ["kimi_linear", "deepseek_v32"])
def test_c08_exact_ties_lowest_index_stable_across_batches(family: str) -> None:
    torch.manual_seed(1)
    weight, bias, token = _tie_router()
    router = _hf_router(family)
    with torch.no_grad():
        router.weight.copy_(weight)
        router.e_score_correction_bias.copy_(bias)
    unbiased = torch.sigmoid(torch.tensor([-2.0, 0.0, 0.0, 0.0], dtype=torch.float64))
    expected_w = (unbiased / unbiased.sum() * SCALE).float()
    for batch_size in (1, 2, 3, 7, 31):
        for position in {0, batch_size // 2, batch_size - 1}:
            x = torch.randn(batch_size, D)
            x[position] = token
            for _ in range(2):
                weights, ids = _route(router, x)
                assert ids[position].tolist() == [0, 1, 4, 5]
                torch.testing.assert_close(weights[position], expected_w, rtol=1e-6, atol=0)
    # transformers' torch.topk may break the tie differently, but picks equal scores
    _, hf_w, hf_ids = router(token.unsqueeze(0))
    assert set(hf_ids[0].tolist()) <= {0, 1, 4, 5, 6, 12, 13}
    torch.testing.assert_close(hf_w[0].sort().values, expected_w.sort().values)


def test_softmax_routing_matches_transformers_and_breaks_ties_low() -> None:
    torch.manual_seed(2)
    router = Qwen3NextTopKRouter(
        Qwen3NextConfig(hidden_size=D, num_experts=E, num_experts_per_tok=K, norm_topk_prob=True)
    )
    with torch.no_grad():
        router.weight.normal_(0.0, 1.0)
    x = torch.randn(40, D)
    logits = torch.nn.functional.linear(x, router.weight)
    weights, ids = route_softmax(logits, K, True)
    _, hf_weights, hf_ids = router(x)
    assert ids.tolist() == hf_ids.tolist()
    torch.testing.assert_close(weights, hf_weights, rtol=1e-6, atol=1e-7)

    tied = torch.tensor([[0.0, 1.0, 2.0, 1.0, 2.0, 1.0, -1.0, 1.0]])
    for batch_size in (1, 5):
        w, i = route_softmax(tied.expand(batch_size, -1).contiguous(), 3, False)
        assert i.tolist() == [[2, 4, 1]] * batch_size
        assert w[0, 1] == w[0, 0]


def test_unnormalized_sigmoid_weights_are_unbiased_scores() -> None:
    logits = torch.tensor([[0.0, 1.0, -1.0, 2.0]])
    bias = torch.tensor([0.0, 0.0, 5.0, 0.0])
    w, i = route_sigmoid(logits, bias, 2, norm_topk_prob=False, routed_scaling_factor=3.0)
    assert i.tolist() == [[2, 3]]
    torch.testing.assert_close(w, 3.0 * torch.sigmoid(torch.tensor([[-1.0, 2.0]])))


def test_moe_experts_matches_per_token_sum() -> None:
    torch.manual_seed(3)
    T, I = 23, 6
    x = torch.randn(T, D)
    gate_up = torch.randn(E, 2 * I, D)
    down = torch.randn(E, D, I)
    ids = torch.stack([torch.randperm(E)[:K] for _ in range(T)])
    w = torch.rand(T, K)
    out = moe_experts(x, gate_up, down, w, ids)
    for t in range(T):
        ref = torch.zeros(D, dtype=torch.float64)
        for j in range(K):
            e = ids[t, j].item()
            g, u = (gate_up[e].double() @ x[t].double()).split(I)
            ref += w[t, j].double() * (down[e].double() @ (torch.nn.functional.silu(g) * u))
        torch.testing.assert_close(out[t].double(), ref, rtol=1e-5, atol=1e-5)


def _expert_inputs(T: int, I: int = 6, seed: int = 4):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=gen)
    gate_up = torch.randn(E, 2 * I, D, generator=gen)
    down = torch.randn(E, D, I, generator=gen)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    return x, gate_up, down, torch.rand(T, K, generator=gen), ids


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("T", [1, 5, 23, 200])
def test_fast_moe_experts_matches_definition(T: int, threads: int) -> None:
    """The grouped fast path (one sort, per-expert matmuls; on >1 thread and decode-sized groups
    the padded batched form) == the per-expert reference; the per-expert form bit for bit."""
    from hyla.ops.moe import cpu, reference

    args = _expert_inputs(T)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    counts = torch.bincount(args[4].reshape(-1), minlength=E).tolist()
    try:
        want = reference.moe_experts(*args)
        got = cpu.moe_experts(*args)
        batched = cpu._few_per_expert(counts)
    finally:
        torch.set_num_threads(before)
    assert batched == (threads > 1 and T <= 23)
    if not batched:
        assert torch.equal(got, want)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fast_moe_experts_prepacked_matches_definition() -> None:
    """With oneDNN copies of the experts (`Prepacked`), under inference: equal to fp32 rounding;
    groups above 64 rows take F.linear."""
    from hyla.ops.linear import Prepacked
    from hyla.ops.moe import cpu, reference

    for T in (3, 40):  # 40 tokens x 4 of 16 experts: some groups > 8 rows, all <= 64
        args = _expert_inputs(T, seed=T)
        packed = (Prepacked(), Prepacked())
        with torch.inference_mode():
            got = cpu.moe_experts(*args, packed=packed)
        torch.testing.assert_close(got, reference.moe_experts(*args), rtol=1e-5, atol=1e-5)
        assert len(packed[0]._packed) == E  # every expert packed once


@pytest.mark.parametrize("T", [1, 2, 5, 23, 200])  # E = 16, k = 4: gathered, dense, grouped
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sync_free_moe_experts_matches_definition(T: int, dtype: torch.dtype, monkeypatch) -> None:
    """The GPU form (`kernels.moe_experts`, run here on CPU tensors): gathered for 3 T k <= E,
    all experts densely above, the grouped path past `DENSE_MAX_ROWS` (lowered here so T = 200
    takes it) == the per-expert reference; no host sync in the first two (checked by making
    `.tolist()` and `.item()` fail while they run)."""
    from hyla.ops.moe import kernels, reference

    monkeypatch.setattr(kernels, "DENSE_MAX_ROWS", E * 100)
    x, gate_up, down, w, ids = _expert_inputs(T)
    args = (x.to(dtype), gate_up.to(dtype), down.to(dtype), w, ids)
    want = reference.moe_experts(*args)
    if T * E <= kernels.DENSE_MAX_ROWS:
        monkeypatch.setattr(torch.Tensor, "tolist", lambda self: pytest.fail("host sync"))
        monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("host sync"))
    got = kernels.moe_experts(*args)
    monkeypatch.undo()
    bound = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, rtol=bound, atol=bound * want.abs().max().item())
