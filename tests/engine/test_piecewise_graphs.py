"""Piecewise graphs of mixed steps (`hyla.engine.piecewise_graphs`), run eagerly on the CPU
(`capture=False`: the same padded pieces a CUDA graph replays): the engine's tokens and
logprobs equal those of the plain forward (the oracle: the same engine without pieces), over
mixed prefill+decode steps of each family. The captured form is checked on a GPU by
tests/gpu/test_piecewise_graphs_gpu.py."""

from __future__ import annotations

import pytest

from hyla.engine.piecewise_graphs import PiecewiseGraphs, token_buckets
from tests.engine.engine_util import (
    I3_LOGPROB_ATOL,
    assert_i4,
    assert_same_completion,
    make_engine,
    one_torch_thread,
    run_staggered,
)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def test_token_buckets():
    assert token_buckets(128) == (16, 32, 64, 128)
    assert token_buckets(100) == (16, 32, 64, 100)
    assert token_buckets(8) == (8,)


@pytest.mark.parametrize("family", ["kimi_linear", "qwen3_next", "deepseek_v32"])
def test_padded_pieces_equal_the_plain_forward(checkpoints, family):
    model, path = checkpoints(family)
    vocab = model.config.vocab_size
    plain, num_mixed = run_staggered(make_engine(model, path, max_num_batched_tokens=16), vocab)
    engine = make_engine(model, path, max_num_batched_tokens=16)
    pieces = PiecewiseGraphs(model, token_buckets(16), capture=False)
    engine.runner.piecewise = pieces
    calls = []
    run = pieces.run
    pieces.run = lambda ids, batch: calls.append(ids.shape[0]) or run(ids, batch)
    graphed, _ = run_staggered(engine, vocab)
    assert num_mixed >= 2 and len(calls) >= num_mixed
    assert any(n < 16 for n in calls)  # padded rows
    for rid, want in plain.items():
        assert_same_completion(graphed[rid], want, atol=I3_LOGPROB_ATOL)
    assert_i4(engine)
