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
"""

from __future__ import annotations

import pytest

from hyla.request import SamplingParams
from tests.engine.engine_util import load, prompt_ids, run_all, save_checkpoint
from tests.engine.test_async_output import compare, drive, stop_requests


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    path = tmp_path_factory.mktemp("kimi_linear")
    save_checkpoint("kimi_linear", path)
    return load(path), path


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
