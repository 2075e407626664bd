"""Linear projections on oneDNN-packed weights (`hyla.ops.linear.cpu`) against `F.linear`, the
definition: equal to fp32 rounding where the fast path applies, identical (the fallback) where
it does not, and the packed copies follow every change of the weights."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

from hyla.layers.linear import Linear, stacked_linear
from hyla.ops.linear import Prepacked, prepacked_linear, prepacked_stacked_linear
from hyla.ops.linear import cpu as linear_cpu

TOL = dict(rtol=1e-5, atol=1e-5)


def _weights(out_features: int = 48, in_features: int = 32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=gen) / in_features**0.5
    return w, torch.randn(out_features, generator=gen)


@pytest.mark.parametrize("rows", [1, 3, 16, 33, 64, 65, 300])
def test_matches_f_linear(rows: int) -> None:
    w, b = _weights()
    x = torch.randn(rows, 32)
    cache = Prepacked()
    with torch.inference_mode():
        got = prepacked_linear(x, w, cache, b)
        got_3d = prepacked_linear(x.view(1, rows, 32), w, cache, b)
    torch.testing.assert_close(got, F.linear(x, w, b), **TOL)
    assert torch.equal(got_3d[0], got)
    if rows > 64:  # prefill-sized inputs keep F.linear
        assert torch.equal(got, F.linear(x, w, b))


def test_fallbacks_are_exactly_f_linear() -> None:
    w, b = _weights()
    x = torch.randn(4, 32)
    cache = Prepacked()
    with torch.enable_grad():  # autograd on: the plain op, so gradients flow
        assert torch.equal(prepacked_linear(x, w, cache, b), F.linear(x, w, b))
    with torch.no_grad():
        xb, wb = x.bfloat16(), w.bfloat16()
        assert torch.equal(prepacked_linear(xb, wb, cache), F.linear(xb, wb))
    assert cache._key is None  # nothing was packed


def test_packed_copy_follows_the_weight() -> None:
    w, _ = _weights()
    x = torch.randn(2, 32)
    cache = Prepacked()
    with torch.no_grad():
        first = prepacked_linear(x, w, cache)
        w.mul_(2)  # in place: the version bump rebuilds the copy
        torch.testing.assert_close(prepacked_linear(x, w, cache), 2 * first, **TOL)
        other, _ = _weights(seed=1)  # another tensor
        torch.testing.assert_close(prepacked_linear(x, other, cache), F.linear(x, other), **TOL)


def test_stacked_equals_concatenated_projections() -> None:
    ws = [_weights(n, seed=n)[0] for n in (16, 8, 3)]
    x = torch.randn(5, 32)
    want = torch.cat([F.linear(x, w) for w in ws], dim=-1)
    with torch.no_grad():
        torch.testing.assert_close(prepacked_stacked_linear(x, ws, Prepacked()), want, **TOL)
    assert torch.equal(prepacked_stacked_linear(x, ws, Prepacked()), want)  # grad on: fallback
    mods = [Linear(32, n, bias=False) for n in (16, 8)]
    with torch.no_grad():
        got = stacked_linear(x, mods, Prepacked())
        torch.testing.assert_close(got, torch.cat([m(x) for m in mods], -1), **TOL)
    with pytest.raises(ValueError, match="bias"):
        stacked_linear(x, [Linear(32, 4)], Prepacked())


def test_each_expert_packed_on_its_own() -> None:
    fused = torch.randn(3, 16, 32)
    x = torch.randn(2, 32)
    cache = Prepacked()
    with torch.no_grad():
        packs = cache.get_each(fused)
        for e in range(3):
            got = linear_cpu.packed_matmul(x, packs[e])
            torch.testing.assert_close(got, F.linear(x, fused[e]), **TOL)
    assert cache.get_each(fused) is packs  # cached while the weight is unchanged


def test_module_copies_drop_the_packed_weights() -> None:
    layer = Linear(32, 16)
    x = torch.randn(3, 32)
    with torch.no_grad():
        out = layer(x)
    assert layer.packed._key is not None
    for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert clone.packed._key is None
        with torch.no_grad():
            torch.testing.assert_close(clone(x), out, **TOL)
    assert [n for n, _ in layer.named_parameters()] == ["weight", "bias"]


def test_one_row_cuda_inputs_go_to_the_gemv(monkeypatch) -> None:
    """`linear` sends one-row inputs without bias or autograd to the Triton GEMV when triton
    runs on them (faked here: CI has no triton), everything else to F.linear."""
    import sys
    import types

    import hyla.ops.linear
    from hyla.ops.linear import dispatch

    calls = []
    fake = types.ModuleType("hyla.ops.linear.gemv")
    fake.supports = lambda x, w: x.shape[-1] == w.shape[1]
    fake.gemv = lambda x, w: calls.append(tuple(x.shape)) or torch.nn.functional.linear(x, w)
    monkeypatch.setitem(sys.modules, "hyla.ops.linear.gemv", fake)
    monkeypatch.setattr(hyla.ops.linear, "gemv", fake, raising=False)  # imported earlier
    monkeypatch.setattr(dispatch, "use_triton", lambda x: True)
    w = torch.randn(6, 4)
    want = torch.nn.functional.linear
    for x, bias, routed in [
        (torch.randn(1, 4), None, True),
        (torch.randn(1, 1, 4), None, True),
        (torch.randn(2, 4), None, False),  # two rows: cuBLAS (the GEMV is unmeasured there)
        (torch.randn(1, 4), torch.randn(6), False),  # a bias
        (torch.randn(1, 4, requires_grad=True), None, False),  # autograd
    ]:
        calls.clear()
        torch.testing.assert_close(dispatch.linear(x, w, bias), want(x, w, bias))
        assert bool(calls) == routed, (tuple(x.shape), bias is not None, x.requires_grad)


def test_router_logits_skip_the_cast_at_one_row(monkeypatch) -> None:
    """`linear_fp32` (sigmoid routers' float32 logits) hands a one-row bf16 x to the GEMV as it
    is (the kernel sums in fp32), other inputs to F.linear(x.float(), w)."""
    import sys
    import types

    import hyla.ops.linear
    from hyla.ops.linear import dispatch

    calls = []
    fake = types.ModuleType("hyla.ops.linear.gemv")
    fake.supports = lambda x, w: x.shape[-1] == w.shape[1]
    fake.gemv = lambda x, w: calls.append(x.dtype) or torch.nn.functional.linear(x.float(), w)
    monkeypatch.setitem(sys.modules, "hyla.ops.linear.gemv", fake)
    monkeypatch.setattr(hyla.ops.linear, "gemv", fake, raising=False)  # imported earlier
    monkeypatch.setattr(dispatch, "use_triton", lambda x: True)
    w = torch.randn(6, 4)
    for x, routed in [(torch.randn(1, 4).bfloat16(), True), (torch.randn(3, 4).bfloat16(), False)]:
        calls.clear()
        got = dispatch.linear_fp32(x, w)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, torch.nn.functional.linear(x.float(), w))
        assert calls == ([torch.bfloat16] if routed else [])
