"""The fused gate kernels on CPU tensors under TRITON_INTERPRET=1: the checks of
`test_gates_gpu.py` without a GPU, and whole KDA / Gated DeltaNet layers (prefill and decode,
fp32) with the kernels forced against the same layers on the PyTorch path. Skipped as
`test_dsa_interpret.py` is (no triton, CUDA present, or triton imported earlier without the
flag: run this file on its own).

Interpreted, exp / log are numpy's (float32 exp is correctly rounded only ~60% of the time, so g
differs from torch's by an ulp or so) and log1p is Goldberg's formula (libdevice is compiled
code), and the interpreter truncates fp32 -> bf16 where the GPU rounds to nearest even (beta off
by up to 1 bf16 ulp); test_gates_gpu.py checks the compiled path on a GPU."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_gates_gpu import SHAPES, check_gdn, check_kda, check_kda_bounded

pytestmark = [
    *interpreter.marks("test_gates_gpu.py"),
    # numpy warns about the lanes of the branches that tl.where then discards
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),  # log1p, u = 1
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


@DTYPES
@pytest.mark.parametrize("extreme", [False, True], ids=["normal", "extreme"])
@pytest.mark.parametrize(("T", "HV", "K"), SHAPES)
def test_kda_gates(T: int, HV: int, K: int, dtype: torch.dtype, extreme: bool) -> None:
    check_kda(T, HV, K, dtype, "cpu", extreme)


@DTYPES
@pytest.mark.parametrize("extreme", [False, True], ids=["normal", "extreme"])
@pytest.mark.parametrize(("T", "HV", "K"), SHAPES[::3])
def test_kda_gates_bounded(T: int, HV: int, K: int, dtype: torch.dtype, extreme: bool) -> None:
    check_kda_bounded(T, HV, K, dtype, "cpu", extreme)


@DTYPES
@pytest.mark.parametrize("extreme", [False, True], ids=["normal", "extreme"])
@pytest.mark.parametrize(("T", "HV"), [(1, 2), (7, 32), (64, 32), (1000, 48)])
def test_gdn_gates(T: int, HV: int, dtype: torch.dtype, extreme: bool) -> None:
    check_gdn(T, HV, dtype, "cpu", extreme)


def _run_layer(kind: str) -> list[torch.Tensor]:
    """Two sequences through one tiny fp32 layer: a packed prefill (5 and 9 tokens), then two
    decode steps; the outputs of every step."""
    from tests.layers.test_linear_attention import LayerRunner, inputs, make_pair

    config, _, _, layer = make_pair(kind)
    runner = LayerRunner(config, layer, num_seqs=2)
    outs = list(runner.step({0: inputs(5, seed=1), 1: inputs(9, seed=2)}).values())
    for step in range(2):
        outs += runner.step({0: inputs(1, seed=10 + step), 1: inputs(1, seed=20 + step)}).values()
    return outs


@pytest.mark.parametrize("kind", ["kda", "gdn"])
def test_layer_with_kernels_matches_pytorch_path(kind: str, monkeypatch) -> None:
    import hyla.ops.gates
    from hyla.ops.gates import kernels

    calls = []
    for name in ("kda_gates", "gdn_gates"):
        fn = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, fn=fn: calls.append(fn) or fn(*a))
    want = _run_layer(kind)
    assert not calls  # CPU tensors: the reference
    monkeypatch.setattr(hyla.ops.gates, "use_triton", lambda x: True)
    got = _run_layer(kind)
    assert len(calls) == 3  # prefill + 2 decode steps
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)  # seen: 3e-7 on |out| <= 2.4


@pytest.mark.parametrize("kind", ["kda", "gdn"])
def test_layer_with_gated_norm_kernel_matches_pytorch_path(kind: str, monkeypatch) -> None:
    """The output norm (`hyla.ops.norm.gated_rms_norm`) through its Triton kernel: whole layers
    as above (Kimi-Linear: sigmoid gate, fp32 weight; Qwen3-Next: silu gate)."""
    import hyla.ops.norm
    from hyla.ops.norm import gated_kernels

    calls = []
    fn = gated_kernels.gated_rms_norm
    monkeypatch.setattr(gated_kernels, "gated_rms_norm", lambda *a: calls.append(1) or fn(*a))
    want = _run_layer(kind)
    assert not calls
    monkeypatch.setattr(hyla.ops.norm, "use_triton", lambda x: True)
    got = _run_layer(kind)
    assert len(calls) == 3  # prefill + 2 decode steps
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
