"""A prefix-cache hit's step does no more host work per layer than a cold prefill's, beyond its
rounds (issue 17 follow-up: on the H200 a 2K-token system-prompt hit was slower than computing
everything, the host paying per layer and per round for what is fixed per step).

Counted with bench/prefix_counts.py over the hit's steps (one prefill; shared prefix of 100
tokens, stride 32: 96 reused, 44 computed with a checkpoint inside the chunk) vs the same prompt
on an engine with prefix caching off (the bench's cold baseline, no checkpoints):
- the split into rounds and the conv's boundary rows are planned once per step, not per layer;
- rounds = linear layers x (boundaries in the chunk + 1), a round of at most one block run by
  the recurrent op: as many fla chunk-pipeline calls as cold;
- sync sites on the device path (outside the CPU-only op bodies) no more than cold's;
- the first token and its logprob equal the cold run's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hyla.layers import state_slots
from hyla.request import SamplingParams
from tests.engine.engine_util import make_engine, prompt_ids
from tests.engine.test_prefix_cache import (
    STATEFUL,
    _one_thread,  # noqa: F401 (autouse fixture)
    models,  # noqa: F401 (fixture)
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from prefix_counts import count_step  # noqa: E402

PARAMS = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, logprobs=1)


def _first_token(engine, rid: str, prompt: list[int]):
    """(counts over the steps of a one-token request alone in `engine`, its final output)."""
    engine.add_request(rid, prompt, PARAMS)
    final = None
    with count_step() as counts:
        while engine.has_unfinished_requests():
            final = next((o for o in engine.step() if o.finished), final)
    return counts, final


@pytest.mark.parametrize("family", STATEFUL)
def test_hit_step_plans_once_and_syncs_no_more_than_cold(models, family, monkeypatch):  # noqa: F811
    model = models[family]
    shared = prompt_ids(100, seed=5)
    a, b = shared + prompt_ids(40, seed=6), shared + prompt_ids(40, seed=7)
    cached = make_engine(model, state_checkpoint_stride=32, max_num_batched_tokens=256)
    plain = make_engine(model, enable_prefix_caching=False, max_num_batched_tokens=256)
    _first_token(cached, "a", a)
    plans = []
    real_plan = state_slots.plan_rounds
    monkeypatch.setattr(state_slots, "plan_rounds", lambda *x: plans.append(x) or real_plan(*x))
    hit, hit_out = _first_token(cached, "b", b)
    cold, cold_out = _first_token(plain, "cold", b)
    num_linear = sum(kind in ("kda", "gdn") for kind in model.config.layer_pattern)
    assert hit_out.num_cached_tokens == 96
    # the chunk [96, 140) holds one checkpoint inside it: 128, a stride multiple and the last
    # full block before the prompt's last token; the tail at 140 is saved after the forward
    assert len(plans) == 1 and [list(m) for m in plans[0][1]] == [[32]]
    assert hit.split_calls == hit.chunk_calls == num_linear and hit.rounds == 2 * num_linear
    # the round after 128 (12 tokens) runs the recurrent op, not the chunk pipeline
    assert hit.short_rounds == num_linear and hit.fla_calls == cold.fla_calls == num_linear
    assert cold.chunk_calls == num_linear and cold.split_calls == 0
    assert hit.num_device_path_syncs <= cold.num_device_path_syncs, hit.sync_sites
    assert hit_out.outputs[0].token_ids == cold_out.outputs[0].token_ids
    got, want = hit_out.outputs[0].cumulative_logprob, cold_out.outputs[0].cumulative_logprob
    assert abs(got - want) < 1e-4
