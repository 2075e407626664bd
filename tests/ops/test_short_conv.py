"""Short causal conv: parity with transformers' causal_conv1d_fn/_update, varlen packing, and split
invariance when a chunk is shorter than W - 1 (carried state mixes old and new), for both
implementations (the `reference` definition and the public vectorized `cpu` path); then the fast
path against the definition on mixed packs, and its bitwise batch and path invariance."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_next import modeling_qwen3_next as hf_qwen

from hyla.ops.short_conv import cpu, reference

C = 6


@pytest.fixture(params=["reference", "cpu"])
def impl(request):
    """The implementation under test: `impl.causal_conv1d`."""
    return {"reference": reference, "cpu": cpu}[request.param]


def cu(*lens: int) -> torch.Tensor:
    return torch.tensor([0, *lens]).cumsum(0).to(torch.int32)


def make(T: int, W: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(T, C, generator=gen),
        torch.randn(C, W, generator=gen),
        torch.randn(C, generator=gen),
    )


@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("W", [2, 4])
def test_matches_transformers_prefill(impl, W: int, activation: str | None) -> None:
    x, w, b = make(37, W)
    y, state = impl.causal_conv1d(x, w, b, cu(37), None, activation)
    hf_y = hf_qwen.causal_conv1d_fn(x.T[None], w, b, activation=activation)
    torch.testing.assert_close(y, hf_y[0].T, atol=1e-6, rtol=0)
    torch.testing.assert_close(state[0], x[-(W - 1) :].T)


def test_matches_transformers_decode_updates(impl) -> None:
    W, T = 4, 9
    x, w, b = make(T, W)
    hf_state = torch.zeros(1, C, W - 1)
    state = None
    for t in range(T):
        y, state = impl.causal_conv1d(x[t : t + 1], w, b, cu(1), state, "silu")
        hf_y = hf_qwen.causal_conv1d_update(x[t : t + 1].T[None], hf_state, w, b, "silu")
        torch.testing.assert_close(y, hf_y[0].T, atol=1e-6, rtol=0)
        torch.testing.assert_close(state, hf_state)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 19, 20])
def test_split_invariance_including_chunks_shorter_than_state(impl, chunk: int) -> None:
    W, T = 4, 20
    x, w, b = make(T, W)
    y_full, s_full = impl.causal_conv1d(x, w, b, cu(T), None, "silu")
    state, ys = None, []
    for start in range(0, T, chunk):
        part = x[start : start + chunk]
        y, state = impl.causal_conv1d(part, w, b, cu(part.shape[0]), state, "silu")
        ys.append(y)
    torch.testing.assert_close(torch.cat(ys), y_full, atol=1e-6, rtol=0)
    torch.testing.assert_close(state, s_full)


def test_short_chunk_state_mixes_old_and_new(impl) -> None:
    W = 4
    x, w, b = make(1, W)
    old = torch.arange(C * 3, dtype=torch.float32).view(1, C, 3)
    _, new = impl.causal_conv1d(x, w, b, cu(1), old, None)
    torch.testing.assert_close(new[0, :, :2], old[0, :, 1:])
    torch.testing.assert_close(new[0, :, 2], x[0])


def test_varlen_packed_equals_each_alone(impl) -> None:
    W, lens = 4, [1, 7, 0, 2, 12]
    x, w, b = make(sum(lens), W)
    states = torch.randn(len(lens), C, W - 1)
    y, s = impl.causal_conv1d(x, w, b, cu(*lens), states, "silu")
    start = 0
    for i, n in enumerate(lens):
        y_i, s_i = impl.causal_conv1d(x[start : start + n], w, b, cu(n), states[i : i + 1], "silu")
        torch.testing.assert_close(y[start : start + n], y_i)
        torch.testing.assert_close(s[i : i + 1], s_i)
        start += n
    torch.testing.assert_close(s[2], states[2])  # no new tokens: state unchanged


def test_dtypes_and_errors(impl) -> None:
    x, w, b = make(5, 4)
    y, s = impl.causal_conv1d(x.bfloat16(), w, b, cu(5), None, "silu")
    assert y.dtype == torch.bfloat16 and s.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="conv_state"):
        impl.causal_conv1d(x, w, b, cu(5), torch.zeros(1, C, 4))
    with pytest.raises(ValueError, match="activation"):
        impl.causal_conv1d(x, w, b, cu(5), None, "relu")


@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize(
    "lens", [[1] * 5, [3, 0, 1, 7, 2], [40], [1, 2, 3, 1]], ids=["decode", "mixed", "one", "short"]
)
def test_fast_path_matches_definition(W: int, lens: list[int]) -> None:
    x, w, b = make(sum(lens), W)
    states = torch.randn(len(lens), C, W - 1)
    for state in (states, None):
        y_ref, s_ref = reference.causal_conv1d(x, w, b, cu(*lens), state, "silu")
        y, s = cpu.causal_conv1d(x, w, b, cu(*lens), state, "silu")
        torch.testing.assert_close(y, y_ref, atol=1e-6, rtol=1e-6)
        assert torch.equal(s, s_ref)  # states are copies of inputs: exact


def test_fast_path_decode_and_packed_agree() -> None:
    """A pure-decode step (the one-token-per-sequence path) and the same tokens inside a mixed
    pack (shifted slices + first-token fix-up) compute the same sums in the same order."""
    W, lens = 4, [1, 9, 2, 1, 30]
    x, w, b = make(sum(lens), W)
    states = torch.randn(len(lens), C, W - 1)
    y, s = cpu.causal_conv1d(x, w, b, cu(*lens), states, "silu")
    one = [i for i, n in enumerate(lens) if n == 1]
    rows = torch.tensor([sum(lens[:i]) for i in one])
    y_dec, s_dec = cpu.causal_conv1d(x[rows], w, b, cu(1, 1), states[one], "silu")
    torch.testing.assert_close(y_dec, y[rows], atol=1e-6, rtol=0)
    assert torch.equal(s_dec, s[one])


@pytest.mark.parametrize("lens", [[1, 1, 1], [3, 1, 6]])
def test_host_offsets_give_the_same_result_without_reading_the_tensor(lens, monkeypatch) -> None:
    """With `cu_seqlens_host` the conv never reads cu_seqlens back (a device sync on a GPU),
    decode and packed steps alike, and gives the same outputs and states; offsets that
    disagree in count or end are refused."""
    from hyla.ops.short_conv.cpu import causal_conv1d as fast

    gen = torch.Generator().manual_seed(7)
    T, C, W = sum(lens), 6, 4
    x, weight = torch.randn(T, C, generator=gen), torch.randn(C, W, generator=gen)
    state = torch.randn(len(lens), C, W - 1, generator=gen)
    host = [0]
    for n in lens:
        host.append(host[-1] + n)
    cu = torch.tensor(host, dtype=torch.int32)
    want = fast(x, weight, None, cu, state, "silu")
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: pytest.fail("read-back"))
    monkeypatch.setattr(torch.Tensor, "__int__", lambda self: pytest.fail("read-back"))
    monkeypatch.setattr(torch.Tensor, "__bool__", lambda self: pytest.fail("read-back"))
    got = fast(x, weight, None, cu, state, "silu", cu_seqlens_host=host)
    with pytest.raises(ValueError, match="cu_seqlens_host"):
        fast(x, weight, None, cu, state, "silu", cu_seqlens_host=host[:-1])
    with pytest.raises(ValueError, match="cu_seqlens"):
        fast(x, weight, None, cu, state, "silu", cu_seqlens_host=host[:-1] + [T + 1])
    monkeypatch.undo()
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
