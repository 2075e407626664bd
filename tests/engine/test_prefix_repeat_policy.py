"""`prefix_checkpoint_policy="repeat"`: a first-seen prompt writes no state inside its chunk (its
prefill stays one plain pass, a whole-step CUDA graph on the GPU); the second request with the
prefix checkpoints it inside its chunk; the third hits it, with the output of a cold run (the
oracle: the same request in an engine without prefix caching)."""

from __future__ import annotations

import pytest

from hyla.request import SamplingParams
from tests.engine.engine_util import make_engine, prompt_ids
from tests.engine.test_prefix_cache import (
    STATEFUL,
    _one_thread,  # noqa: F401 (autouse fixture)
    assert_conserved,
    assert_same_completion,
    cold,
    models,  # noqa: F401 (fixture)
    run_poisoned,
)

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=5)


@pytest.mark.parametrize("family", sorted(STATEFUL))
def test_interior_checkpoints_only_for_a_repeated_prefix(models, family):  # noqa: F811
    model = models[family]
    engine = make_engine(model, state_checkpoint_stride=32, max_num_batched_tokens=256,
                         prefix_checkpoint_policy="repeat")  # fmt: skip
    interior: list[bool] = []
    execute = engine.runner.execute
    engine.runner.execute = lambda out, *a, **kw: (
        interior.append(bool(out.state_boundaries)) or (execute(out, *a, **kw))
    )
    base = prompt_ids(70, seed=3)
    turns = [base + prompt_ids(20, seed=10 + k) for k in range(3)]
    written = []
    outs = {}
    for k, prompt in enumerate(turns):
        interior.clear()
        outs.update(run_poisoned(engine, {f"r{k}": prompt}, PARAMS))
        written.append(any(interior))
    assert written == [False, True, False]  # only the first repeat writes inside its chunk
    assert outs["r0"].num_cached_tokens == outs["r1"].num_cached_tokens == 0
    assert outs["r2"].num_cached_tokens == 64  # floor(70 / 32) * 32
    assert_same_completion(outs["r2"], cold(model, turns[2], PARAMS))
    assert_conserved(engine)


def test_auto_is_repeat_on_cuda_and_all_elsewhere():
    import torch

    from hyla.config import CacheConfig
    from hyla.engine.loading import checkpoint_policy

    auto = CacheConfig()
    assert auto.prefix_checkpoint_policy == "auto"
    assert checkpoint_policy(auto, torch.device("cpu")) == "all"
    assert checkpoint_policy(auto, torch.device("cuda", 0)) == "repeat"
    assert (
        checkpoint_policy(CacheConfig(prefix_checkpoint_policy="deepest"), torch.device("cuda"))
        == "deepest"
    )
