"""The per-step plan of a call split at interior boundaries (`boundaries.plan_rounds`), shared
by every linear layer of a step, and the one-gather conv states at the boundaries:

- a plan's rounds follow the module docstring's picture (hand-derived rounds, slices for one
  contiguous run, boundary rows sequence-major);
- passing the plan instead of the lists changes nothing: o, final state and every boundary
  state equal the unplanned call bit for bit, and the boundary states equal the token-by-token
  recurrence over exactly that prefix (the oracle of test_state_boundaries.py);
- `conv_states_gather` equals `conv_states_at` (the reference) bit for bit, also for
  boundaries inside the carried window (b < W - 1).
"""

from __future__ import annotations

import pytest
import torch

from hyla.ops.kda import cpu as kda_cpu
from hyla.ops.kda import reference as kda_ref
from hyla.ops.kda.boundaries import (
    SHORT_ROUND_TOKENS,
    BoundaryPlan,
    plan_rounds,
    split_at_boundaries,
)
from hyla.ops.short_conv import conv_boundary_rows, conv_states_at, conv_states_gather
from tests.ops.test_kda import cu, make_inputs, random_state


def test_rounds_follow_the_picture() -> None:
    # sequence 0 |--seg 0--b|----seg 1----b|--seg 2--|, sequence 1 |---seg 0---b|--seg 1--|
    plan = plan_rounds([0, 30, 50], [[10, 25], [12]], "cpu")
    assert isinstance(plan, BoundaryPlan) and list(plan) == [(10, 25), (12,)]
    assert len(plan.rounds) == 3 and plan.num_boundaries == 3
    r0, r1, r2 = plan.rounds
    assert r0.seqs is None and r0.rows.tolist() == [*range(0, 10), *range(30, 42)]
    assert r0.cu_seqlens.tolist() == [0, 10, 22] and r0.cu_seqlens_cpu.tolist() == [0, 10, 22]
    assert r0.done_src.tolist() == [0, 1] and r0.done_dst.tolist() == [0, 2]
    assert r1.seqs is None and r1.rows.tolist() == [*range(10, 25), *range(42, 50)]
    assert r1.done_src.tolist() == [0] and r1.done_dst.tolist() == [1]
    assert r2.seqs.tolist() == [0] and r2.rows == slice(25, 30) and r2.done_src is None


def test_one_sequence_runs_as_slices() -> None:
    plan = plan_rounds(torch.tensor([0, 256]), [[240]], "cpu")
    assert [r.rows for r in plan.rounds] == [slice(0, 240), slice(240, 256)]
    assert all(r.seqs is None for r in plan.rounds)


@pytest.mark.parametrize(
    "marks", [[[0]], [[9]], [[5, 3]], [[4, 4]]], ids=["zero", "end", "order", "dup"]
)
def test_bad_plan_names_the_field(marks) -> None:
    with pytest.raises(ValueError, match="state_boundaries"):
        plan_rounds([0, 9], marks, "cpu")


CASES = {
    "one": ([256], [[64, 240]]),
    "edges": ([130, 5, 70], [[1, 64, 129], [], [69]]),
    "unaligned": ([200, 97], [[17, 100, 163], [32, 96]]),
}


@pytest.mark.parametrize("case", CASES)
def test_plan_equals_lists_and_recurrence(case: str) -> None:
    lens, marks = CASES[case]
    q, k, v, g, beta = make_inputs(sum(lens))
    s0 = random_state(len(lens))
    M = sum(len(m) for m in marks)
    outs = []
    for boundaries in (marks, plan_rounds(cu(*lens), marks, "cpu")):
        out = torch.full((M, *s0.shape[1:]), float("nan"))
        o, final = kda_cpu.chunk_kda(
            q, k, v, g, beta, cu(*lens), s0, use_qk_l2norm=True,
            state_boundaries=boundaries, boundary_states=out,
        )  # fmt: skip
        outs.append((o, final, out))
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)
    starts, row = cu(*lens).tolist(), 0
    for i, bs in enumerate(marks):
        for b in bs:
            rows = slice(starts[i], starts[i] + b)
            pre = (q[rows], k[rows], v[rows], g[rows], beta[rows])
            _, want = kda_ref.recurrent_kda(*pre, cu(b), s0[i : i + 1], use_qk_l2norm=True)
            torch.testing.assert_close(outs[1][2][row], want[0], atol=1e-5, rtol=0)
            row += 1


def test_plan_of_another_length_is_refused() -> None:
    q, k, v, g, beta = make_inputs(100)
    plan = plan_rounds([0, 90], [[64]], "cpu")
    with pytest.raises(ValueError, match="state_boundaries"):
        kda_cpu.chunk_kda(q, k, v, g, beta, cu(100), state_boundaries=plan,
                          boundary_states=torch.empty(1, 4, 16, 8))  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_gather_equals_reference(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    lens, marks, C, W = [9, 2, 70], [[1, 2, 3, 8], [1], [3, 64]], 6, 4
    x = torch.randn(sum(lens), C, generator=gen).to(dtype)
    state = torch.randn(len(lens), C, W - 1, generator=gen)
    host = cu(*lens).tolist()
    rows = torch.tensor(conv_boundary_rows(host, marks, W))
    got = conv_states_gather(x, state, rows, W)
    assert torch.equal(got, conv_states_at(x, host, state, marks, W))
    assert conv_states_gather(x, state, rows[:0], W).shape == (0, C, W - 1)


def test_short_rounds_run_the_recurrent_op() -> None:
    """A round of segments of at most SHORT_ROUND_TOKENS goes to `recurrent_fn` (the others to
    the chunk op); the boundary states still equal the recurrence over the prefix."""
    lens, marks = [256, 40], [[64, 240], [30]]
    q, k, v, g, beta = make_inputs(sum(lens))
    s0 = random_state(2)
    calls = []

    def spy(fn, name):
        return lambda *a, **kw: calls.append((name, a[5].tolist())) or fn(*a, **kw)

    out = torch.empty(3, *s0.shape[1:])
    split_at_boundaries(
        spy(kda_cpu.chunk_kda, "chunk"), q, k, v, g, beta, cu(*lens), s0, None, True,
        state_boundaries=plan_rounds(cu(*lens), marks, "cpu"), boundary_states=out,
        recurrent_fn=spy(kda_cpu.recurrent_kda, "recurrent"),
    )  # fmt: skip
    assert SHORT_ROUND_TOKENS == 16
    assert calls == [("chunk", [0, 64, 94]), ("chunk", [0, 176, 186]), ("recurrent", [0, 16])]
    starts = cu(*lens).tolist()
    for row, (i, b) in enumerate([(0, 64), (0, 240), (1, 30)]):
        rows = slice(starts[i], starts[i] + b)
        pre = (q[rows], k[rows], v[rows], g[rows], beta[rows])
        _, want = kda_ref.recurrent_kda(*pre, cu(b), s0[i : i + 1], use_qk_l2norm=True)
        torch.testing.assert_close(out[row], want[0], atol=1e-5, rtol=0)
