"""Whole mixed steps on static buffers (`hyla.engine.mixed_graphs`), run eagerly on the CPU
(`capture=False`: the padded step a CUDA graph replays): the engine's tokens and logprobs equal
those of the plain forward (the oracle: the same engine without them), and the padding reads and
writes only the reserved slot 0 and block 0. The captured form is checked on a GPU by
tests/gpu/test_mixed_graphs_gpu.py."""

from __future__ import annotations

import pytest
import torch

from hyla.engine.mixed_graphs import MixedGraphs, mixed_graph_buckets
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


def _with_static_steps(engine, buckets=(8, 16)) -> list[int]:
    runner = engine.runner
    runner.mixed = MixedGraphs(
        runner.model, runner.caches, runner.block_size, buckets, 512, capture=False
    )
    calls: list[int] = []
    run = runner.mixed.run
    runner.mixed.run = lambda step, tokens=None: (
        calls.append(len(step.input_ids)) or run(step, tokens)
    )
    return calls


def test_buckets_only_for_capturable_models(checkpoints):
    kimi, _ = checkpoints("kimi_linear")
    buckets = mixed_graph_buckets(kimi.config, 4096)
    assert buckets[0] == 16 and buckets[-1] == 2048 and list(buckets) == sorted(buckets)
    assert mixed_graph_buckets(kimi.config, 300)[-1] == 256
    qwen, _ = checkpoints("qwen3_next")  # GDN: no fixed-grid chunk plan in fla yet
    assert mixed_graph_buckets(qwen.config, 4096) == ()


@pytest.mark.parametrize("caching", [False, True], ids=["no-prefix-cache", "prefix-cache"])
def test_static_mixed_steps_equal_the_plain_forward(checkpoints, caching):
    model, path = checkpoints("kimi_linear")
    vocab = model.config.vocab_size
    opts = dict(max_num_batched_tokens=16, enable_prefix_caching=caching)
    plain, num_mixed = run_staggered(make_engine(model, path, **opts), vocab)
    engine = make_engine(model, path, **opts)
    calls = _with_static_steps(engine)
    graphed, _ = run_staggered(engine, vocab)
    assert num_mixed >= 2 and len(calls) >= 2
    assert any(n not in (8, 16) for n in calls)  # padded rows
    for rid, want in plain.items():
        assert_same_completion(graphed[rid], want, atol=I3_LOGPROB_ATOL)
    assert_i4(engine)


def test_padding_touches_only_reserved_storage(checkpoints):
    """Slot 0 and block 0 poisoned with NaN: outputs stay finite and equal the plain engine's;
    every other state row and block not owned by a running request is unchanged."""
    model, path = checkpoints("kimi_linear")
    vocab = model.config.vocab_size
    opts = dict(max_num_batched_tokens=16, enable_prefix_caching=False)
    plain, _ = run_staggered(make_engine(model, path, **opts), vocab)
    engine = make_engine(model, path, **opts)
    calls = _with_static_steps(engine)
    caches = engine.runner.caches
    for layer in caches:
        for t in layer.values():
            if t.is_floating_point():
                t.view(t.shape[0], -1)[0] = float("nan")  # state slot 0 / block 0
                t.view(t.shape[0], -1)[-1] = 7.0  # a row no request of this test reaches
    graphed, _ = run_staggered(engine, vocab)
    assert calls
    for rid, want in plain.items():
        assert_same_completion(graphed[rid], want, atol=I3_LOGPROB_ATOL)
    for layer in caches:
        for t in layer.values():
            if t.is_floating_point():
                assert torch.all(t.view(t.shape[0], -1)[-1] == 7.0)
    assert_i4(engine)
