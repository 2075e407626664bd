"""Adversarial cases of async scheduling (a greedy step stays on the device while the next one
is scheduled; its tokens are placeholders on the host) against the synchronous engine, on a
tiny kimi_linear model (see test_async_output for the shared harness `compare`):

- a repeat of an earlier greedy request decodes across a checkpoint-stride boundary already
  checkpointed by the first run; the block ending there ends in a placeholder, so its key is
  unknown when the save is planned. With every free checkpoint keyed, reserving one evicts a
  cached checkpoint (another prompt's), which the synchronous engine keeps: a later request
  of that other prompt must still hit it (same `num_cached_tokens` in every mode);
- the last running request ends by a stop string seen while its next (greedy) step runs: that
  step has no row left to read, and must not stay in flight on an idle engine (holding the
  step's logits and tokens; `compare` checks `_inflight` is None at the end).

Coverage beyond test_async_output (passing): multi-turn continuations of generated text with
state checkpoints, in all three hybrid families. The checkpoints inside generated text are
planned while the block ending there still holds a placeholder and keyed at commit; the next
turn must hit them exactly as in the synchronous engine.
"""

from __future__ import annotations

import pytest

from hyla.request import SamplingParams
from tests.engine.engine_util import prompt_ids, run_all
from tests.engine.test_async_output import compare, drive, stop_requests


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def test_repeat_across_checkpointed_boundary_keeps_other_checkpoints(kimi):
    model, path = kimi
    vocab = model.config.vocab_size
    other, repeated = prompt_ids(20, 4, vocab), prompt_ids(10, 3, vocab)
    cached: list[int] = []

    def script(engine):
        final = {}
        for rid, prompt, params in (
            ("other", other, _greedy(2)),  # checkpoint at 16 of `other` (least recently used)
            ("first", repeated, _greedy(10)),  # checkpoint at 16 of its generated text
            ("again", repeated, _greedy(10)),  # decodes across that boundary once more
            ("other2", other + [7, 8], _greedy(2)),  # hits `other`'s checkpoint
        ):
            engine.add_request(rid, prompt, params)
            final.update(run_all(engine))
        cached.append(final["other2"].num_cached_tokens)
        return final, []

    compare(model, path, script, enable_prefix_caching=True, state_checkpoint_stride=16,
            num_state_checkpoints=2)  # fmt: skip
    assert cached == [16, 16, 16]


def test_stop_string_of_last_request_leaves_nothing_in_flight(kimi):
    model, path = kimi

    def script(engine):
        final, stream = drive(engine, {"stop": stop_requests(engine)["stop"]})
        assert final["stop"].outputs[0].finish_reason == "stop"
        return final, stream

    engines = compare(model, path, script)
    assert engines[2].num_inflight_steps > 0


@pytest.mark.parametrize("family", ["kimi_linear", "qwen3_next", "deepseek_v32"])
def test_multi_turn_hits_checkpoints_saved_at_placeholders(checkpoints, family):
    model, path = checkpoints(family)
    vocab = model.config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=1)
    cached: list[tuple[int, ...]] = []

    def script(engine):
        prompt = prompt_ids(9, 5, vocab)
        engine.add_request("t1", prompt, params)
        final = run_all(engine)
        second = prompt + final["t1"].outputs[0].token_ids + prompt_ids(3, 6, vocab)
        engine.add_request("t2", second, params)
        engine.add_request("t2b", second[:20], params)
        final.update(run_all(engine))
        engine.add_request("t3", second + final["t2"].outputs[0].token_ids + [9], params)
        final.update(run_all(engine))
        cached.append(tuple(final[r].num_cached_tokens for r in ("t2", "t2b", "t3")))
        return final, []

    engines = compare(model, path, script, enable_prefix_caching=True, state_checkpoint_stride=16)
    assert engines[2].num_inflight_steps > 0
    assert cached[0] == cached[1] == cached[2] and cached[0][2] >= 64
