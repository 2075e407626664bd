"""Projection weights stacked as row blocks of one tensor (`hyla.ops.linear.stacked`): detected
only when they really are back to back, the same values, and `stacked_linear` over the block
equals one matmul per projection; a model keeps its outputs and state dict."""

from __future__ import annotations

import torch
from torch import nn

from hyla.layers.linear import stacked_linear
from hyla.ops.linear import Prepacked, adjacent_rows, stack_rows


def _linears(widths, dim=8, seed=0):
    torch.manual_seed(seed)
    return [nn.Linear(dim, w, bias=False) for w in widths]


def test_adjacent_rows_only_for_back_to_back_blocks():
    mods = _linears([3, 5, 2])
    weights = [m.weight for m in mods]
    assert adjacent_rows(weights) is None  # three separate tensors
    before = [w.detach().clone() for w in weights]
    stack_rows(mods)
    block = adjacent_rows([m.weight for m in mods])
    assert block is not None and block.shape == (10, 8)
    assert torch.equal(block, torch.cat(before))
    assert all(torch.equal(m.weight, b) for m, b in zip(mods, before, strict=True))
    assert adjacent_rows([mods[1].weight, mods[0].weight]) is None  # wrong order
    assert adjacent_rows([mods[0].weight, mods[2].weight]) is None  # a gap
    assert adjacent_rows([mods[0].weight, mods[1].weight]).shape == (8, 8)  # a prefix is fine


def test_stacked_linear_over_the_block_equals_one_matmul_each():
    mods = _linears([6, 4, 4], seed=1)
    x = torch.randn(100, 8)  # > 64 rows: the plain (not prepacked) path
    want = torch.cat([m(x) for m in mods], dim=-1)
    stack_rows(mods)
    got = stacked_linear(x, mods, Prepacked())
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_model_outputs_and_state_dict_survive_stacking(tmp_path):
    from hyla.forward_batch import allocate_caches, build_forward_batch
    from tests.engine.engine_util import load, save_checkpoint

    save_checkpoint("kimi_linear", tmp_path)
    model = load(tmp_path)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(3, 200, (80,))

    def forward():
        caches = allocate_caches(model.config, 8, 16, 2)
        batch = build_forward_batch([80], [0], [[1, 2, 3, 4, 5]], [1], 16, caches)
        with torch.inference_mode():
            return model(ids, batch.positions, batch)

    want = forward()
    model.stack_projections()
    kda = next(m for m in model.modules() if hasattr(m, "stacked_projections"))
    assert adjacent_rows([m.weight for m in kda.stacked_projections()]) is not None
    convs = [m.weight.squeeze(1) for m in kda.stacked_convolutions()]
    assert adjacent_rows(convs) is not None and torch.equal(kda._conv_weight(), torch.cat(convs))
    after = model.state_dict()
    assert after.keys() == state.keys()
    assert all(torch.equal(after[k], state[k]) for k in state)
    torch.testing.assert_close(forward(), want, rtol=1e-5, atol=1e-5)
    model.stack_projections()  # idempotent: already stacked groups are left as they are


def _fp8_linears(widths, dim=40, block=(16, 16), seed=0):
    from hyla.layers.linear import Fp8Linear
    from hyla.ops.fp8 import quantize_weight_blockwise

    torch.manual_seed(seed)
    mods = []
    for w in widths:
        m = Fp8Linear(dim, w, block_size=block)
        q, s = quantize_weight_blockwise(torch.randn(w, dim), block)
        m.weight.data, m.weight_scale_inv.data = q, s
        mods.append(m)
    return mods


def test_fp8_projections_stack_with_their_scales():
    # KDA's input projections in miniature: parts of 32, 32, 16 rows (whole 16-row blocks) and
    # a last part of 3 rows; the stacked call is one fp8_linear and equals one call per module
    mods = _fp8_linears([32, 32, 16, 3])
    x = torch.randn(5, 40)
    want = torch.cat([m(x) for m in mods], dim=-1)
    stack_rows(mods)
    assert adjacent_rows([m.weight for m in mods]) is not None
    assert adjacent_rows([m.weight_scale_inv for m in mods]) is not None
    torch.testing.assert_close(stacked_linear(x, mods, Prepacked()), want, rtol=1e-6, atol=1e-6)


def test_fp8_projections_whose_blocks_straddle_stay_apart():
    mods = _fp8_linears([20, 32])  # 20 rows: the second part's blocks would straddle
    x = torch.randn(2, 40)
    want = torch.cat([m(x) for m in mods], dim=-1)
    stack_rows(mods)
    assert adjacent_rows([m.weight for m in mods]) is None
    torch.testing.assert_close(stacked_linear(x, mods, Prepacked()), want, rtol=0, atol=0)
