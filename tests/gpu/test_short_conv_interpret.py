"""The short-conv decode kernel on CPU tensors under TRITON_INTERPRET=1: the checks of
`test_short_conv_gpu.py` without a GPU, argument errors, and a KDA / Gated DeltaNet layer's
decode step through the kernel (forced by the flag) against the same step without it. Skipped
as `test_dsa_interpret.py` is (no triton, CUDA present, or triton imported earlier without the
flag: run this file on its own)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_short_conv_gpu import ACTIVATIONS, check_conv_update_slots

pytestmark = interpreter.marks("test_short_conv_gpu.py")


@pytest.mark.parametrize("N", [1, 3, 17])
@pytest.mark.parametrize("C", [5, 64, 200])
@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_conv_update_slots_matches_reference(N, C, W, dtype, activation) -> None:
    check_conv_update_slots(N, C, W, dtype, N % 2 == 1, activation, "cpu")
    check_conv_update_slots(N, C, W, dtype, N % 2 == 0, activation, "cpu", index_dtype=torch.int32)


def test_fp32_without_activation_is_bit_exact() -> None:
    # same fp32 multiply-adds in the same order as cpu._tap_sum: only exp could round apart
    for has_bias in (False, True):
        assert check_conv_update_slots(17, 200, 4, torch.float32, has_bias, None, "cpu") == 0.0


def test_argument_errors() -> None:
    from hyla.ops.short_conv.kernels import conv_update_slots

    x, w, pool = torch.zeros(3, 8), torch.zeros(8, 4), torch.zeros(5, 8, 3)
    idx = torch.arange(3)
    bad = [
        (x[0], w, None, pool, idx, "silu"),
        (x, w[:, :1], None, pool, idx, "silu"),
        (x, w[:4], None, pool, idx, "silu"),
        (x, w, torch.zeros(7), pool, idx, "silu"),
        (x, w, None, pool[:, :, :2], idx, "silu"),
        (x, w, None, pool, idx[:2], "silu"),
        (x, w, None, pool, idx.float(), "silu"),
        (x, w, None, pool, idx, "gelu"),
    ]
    for args in bad:
        with pytest.raises(ValueError):
            conv_update_slots(*args)


@pytest.mark.parametrize("kind", ["kda", "gdn"])
def test_layer_decode_step_kernel_vs_torch(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefill 3 sequences into shuffled NaN-poisoned slots, then 2 decode steps: the kernel path
    (TRITON_INTERPRET=1) gives the outputs and conv / recurrent states of the torch path."""
    from hyla.layers import state_slots
    from tests.layers.test_linear_attention import LayerRunner, inputs, make_pair

    calls = []
    from hyla.ops.short_conv import kernels

    original = kernels.conv_update_slots
    monkeypatch.setattr(kernels, "conv_update_slots", lambda *a: calls.append(1) or original(*a))
    config, _, _, layer = make_pair(kind)
    results = []
    for flag in ("0", "1"):
        monkeypatch.setenv("TRITON_INTERPRET", flag)
        runner = LayerRunner(config, layer, 5)
        runner.step({i: inputs(3 + 4 * i, seed=10 + i) for i in range(3)})
        outs = [runner.step({i: inputs(1, seed=20 + 3 * s + i) for i in range(3)}) for s in (0, 1)]
        states = [runner.state(i, name).clone() for i in range(3) for name in runner.caches[0]]
        results.append((outs, states))
    assert len(calls) == 2 and state_slots.triton_runs_on(torch.zeros(1))
    (outs_a, states_a), (outs_b, states_b) = results
    for step_a, step_b in zip(outs_a, outs_b, strict=True):
        for i in range(3):
            torch.testing.assert_close(step_b[i], step_a[i], rtol=1e-5, atol=1e-6)
    for a, b in zip(states_a, states_b, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
