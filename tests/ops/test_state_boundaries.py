"""States at interior boundaries of a chunked prefill (prefix-cache checkpoints, C06 extended
to every boundary inside one chunk): the state `chunk_*` writes for boundary b of a sequence
equals the token-by-token recurrence (`reference.recurrent_*`, the definition) run over exactly
that sequence's first b tokens, for the reference and the fast CPU path, KDA and GDN; the
output and final state are unchanged by asking for boundaries. The short conv's state at b
equals `causal_conv1d` run over the first b tokens."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.gdn import cpu as gdn_cpu
from hyla.ops.gdn import reference as gdn_ref
from hyla.ops.kda import cpu as kda_cpu
from hyla.ops.kda import reference as kda_ref
from hyla.ops.short_conv import causal_conv1d, conv_states_at
from tests.ops.test_kda import cu, make_inputs, random_state

ATOL = 1e-5
OPS = {  # (chunk op, recurrence oracle, g per key channel)
    "kda-reference": (kda_ref.chunk_kda, kda_ref.recurrent_kda, True),
    "kda-cpu": (kda_cpu.chunk_kda, kda_ref.recurrent_kda, True),
    "gdn-reference": (gdn_ref.chunk_gated_delta_rule, gdn_ref.recurrent_gated_delta_rule, False),
    "gdn-cpu": (gdn_cpu.chunk_gated_delta_rule, gdn_ref.recurrent_gated_delta_rule, False),
}
# (sequence lengths, boundaries per sequence): every 64-multiple inside one long chunk, a
# boundary one token in / one token before the end, sequences without any, unaligned ones
CASES = {
    "every-64": ([300], [[64, 128, 192, 256]]),
    "edges": ([130, 5, 70], [[1, 64, 129], [], [69]]),
    "unaligned": ([200, 97], [[17, 100, 163], [32, 96]]),
}


def _inputs(lens: list[int], per_channel: bool):
    q, k, v, g, beta = make_inputs(sum(lens))
    return q, k, v, (g if per_channel else g[..., 0]), beta


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("op", OPS)
def test_boundary_states_equal_recurrence_over_prefix(op: str, case: str) -> None:
    chunk_fn, recurrent_fn, per_channel = OPS[op]
    lens, marks = CASES[case]
    q, k, v, g, beta = _inputs(lens, per_channel)
    s0 = random_state(len(lens))
    M = sum(len(m) for m in marks)
    out = torch.full((M, *s0.shape[1:]), float("nan"))
    o, final = chunk_fn(
        q, k, v, g, beta, cu(*lens), s0, use_qk_l2norm=True, chunk_size=64,
        state_boundaries=marks, boundary_states=out,
    )  # fmt: skip
    o_ref, final_ref = recurrent_fn(q, k, v, g, beta, cu(*lens), s0, use_qk_l2norm=True)
    torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(final, final_ref, atol=ATOL, rtol=0)
    starts, row = cu(*lens).tolist(), 0
    for i, bs in enumerate(marks):
        for b in bs:
            rows = slice(starts[i], starts[i] + b)
            pre = (q[rows], k[rows], v[rows], g[rows], beta[rows])
            _, want = recurrent_fn(*pre, cu(b), s0[i : i + 1], use_qk_l2norm=True)
            torch.testing.assert_close(out[row], want[0], atol=ATOL, rtol=0)
            row += 1
    assert row == M


def test_boundaries_leave_the_initial_state_alone_unless_in_place() -> None:
    q, k, v, g, beta = make_inputs(100)
    s0 = random_state(1)
    keep = s0.clone()
    out = torch.empty(1, *s0.shape[1:])
    _, final = kda_cpu.chunk_kda(
        q, k, v, g, beta, cu(100), s0, state_boundaries=[[64]], boundary_states=out
    )
    assert torch.equal(s0, keep)
    _, final2 = kda_cpu.chunk_kda(
        q, k, v, g, beta, cu(100), s0, state_boundaries=[[64]], boundary_states=out,
        inplace_state=True,
    )  # fmt: skip
    assert final2 is s0 and torch.allclose(final2, final)


@pytest.mark.parametrize(
    "marks", [[[0]], [[100]], [[64, 32]], [[64, 64]]], ids=["zero", "end", "order", "dup"]
)
def test_bad_boundaries_name_the_field(marks: list[list[int]]) -> None:
    q, k, v, g, beta = make_inputs(100)
    out = torch.empty(len(marks[0]), 4, 16, 8)
    for fn in (kda_ref.chunk_kda, kda_cpu.chunk_kda):
        with pytest.raises(ValueError, match="state_boundaries"):
            fn(q, k, v, g, beta, cu(100), state_boundaries=marks, boundary_states=out)


def test_wrong_buffer_names_the_field() -> None:
    q, k, v, g, beta = make_inputs(100)
    with pytest.raises(ValueError, match="boundary_states"):
        kda_cpu.chunk_kda(
            q, k, v, g, beta, cu(100), state_boundaries=[[64]],
            boundary_states=torch.empty(2, 4, 16, 8),
        )  # fmt: skip


@pytest.mark.parametrize("with_state", [False, True], ids=["fresh", "carried"])
def test_conv_states_at_equal_conv_over_prefix(with_state: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    lens, marks, C, W = [9, 2, 70], [[1, 2, 3, 8], [1], [3, 64]], 6, 4
    x = torch.randn(sum(lens), C, generator=gen)
    weight = torch.randn(C, W, generator=gen)
    state = torch.randn(len(lens), C, W - 1, generator=gen) if with_state else None
    got = conv_states_at(x, cu(*lens).tolist(), state, marks, W)
    starts, row = cu(*lens).tolist(), 0
    for i, bs in enumerate(marks):
        for b in bs:
            s_i = None if state is None else state[i : i + 1]
            _, want = causal_conv1d(x[starts[i] : starts[i] + b], weight, None, cu(b), s_i)
            torch.testing.assert_close(got[row], want[0], atol=0, rtol=0)
            row += 1
    assert got.shape[0] == row
