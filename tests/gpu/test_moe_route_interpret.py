"""The Triton routing kernels (`hyla.ops.moe.route_kernels`) on CPU tensors under
TRITON_INTERPRET=1: the checks of `test_moe_gpu.py` without a GPU, and the `Router` layer sent
through them by patching `hyla.ops.moe.use_triton`. Skipped as `test_moe_interpret.py` is (no
triton, CUDA present, or triton imported earlier without the flag: run this file on its own)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_moe_gpu import check_route_sigmoid, check_route_softmax

pytestmark = interpreter.marks("test_moe_gpu.py")

SHAPES = [  # E, k, n_group, topk_group
    (8, 2, 1, 1),
    (32, 4, 1, 1),
    (256, 8, 1, 1),
    (32, 4, 4, 2),
    (256, 8, 8, 4),  # DeepSeek-V3-like groups
    (8, 2, 8, 3),  # groups of one expert (group score = its one score)
    (24, 3, 3, 1),  # group size 8 of 24 experts; E not a power of two
]


@pytest.mark.parametrize("T", [1, 5, 64])
@pytest.mark.parametrize("kind", ["randn", "ties", "neginf"])
@pytest.mark.parametrize("shape", SHAPES)
def test_route_sigmoid(T: int, kind: str, shape: tuple) -> None:
    E, k, n_group, topk_group = shape
    for has_bias, norm, scale in [(True, True, 2.5), (False, True, 1.0), (True, False, 1.0)]:
        check_route_sigmoid(T, E, k, n_group, topk_group, kind, has_bias, norm, scale, "cpu")


@pytest.mark.parametrize("T", [1, 5, 64])
@pytest.mark.parametrize("kind", ["randn", "ties", "neginf"])
@pytest.mark.parametrize("E, k", [(8, 2), (32, 4), (256, 8), (24, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_route_softmax(T: int, kind: str, E: int, k: int, dtype: torch.dtype) -> None:
    check_route_softmax(T, E, k, kind, True, dtype, "cpu")
    check_route_softmax(T, E, k, kind, False, dtype, "cpu")


def test_all_tied_row_takes_lowest_ids() -> None:
    from hyla.ops.moe import route_kernels

    logits = torch.zeros(3, 16)
    _, ids = route_kernels.route_sigmoid(logits, None, 4, 4, 2)
    assert ids.tolist() == [[0, 1, 2, 3]] * 3
    _, ids = route_kernels.route_softmax(logits.bfloat16(), 5)
    assert ids.tolist() == [[0, 1, 2, 3, 4]] * 3


def test_empty_batch_and_bad_groups() -> None:
    from hyla.ops.moe import route_kernels

    w, ids = route_kernels.route_sigmoid(torch.zeros(0, 8), None, 2)
    assert w.shape == ids.shape == (0, 2)
    with pytest.raises(ValueError):
        route_kernels.route_sigmoid(torch.zeros(1, 8), None, 2, n_group=3)


@pytest.mark.parametrize("scoring", ["sigmoid", "softmax"])
def test_router_layer_through_kernels(scoring: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import hyla.ops.moe
    from hyla.config import MoEConfig
    from hyla.layers.moe import Router

    moe = MoEConfig(
        num_experts=32, num_experts_per_tok=4, moe_intermediate_size=8, scoring=scoring,
        n_group=4 if scoring == "sigmoid" else 1, topk_group=2 if scoring == "sigmoid" else 1,
        routed_scaling_factor=2.5, has_correction_bias=scoring == "sigmoid",
    )  # fmt: skip
    router = Router(16, moe)
    torch.nn.init.normal_(router.weight)
    if moe.has_correction_bias:
        router.e_score_correction_bias.uniform_(0, 0.1)
    x = torch.randn(5, 16)
    want = router(x)
    monkeypatch.setattr(hyla.ops.moe, "use_triton", lambda t: True)
    got = router(x)
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0.0)
