"""What crosses between front end and replicas: errors rebuilt with their fields, stats summed."""

from __future__ import annotations

import pickle

import pytest

from hyla.engine.async_stream import EngineDeadError
from hyla.engine.stats import EngineStats
from hyla.replicas.client import sum_stats
from hyla.replicas.wire import from_wire, to_wire
from hyla.request import InvalidRequestError, QueueFullError

ERRORS = [InvalidRequestError("max_tokens", "over the window"), QueueFullError(7, retry_after=3),
          EngineDeadError("step failed")]  # fmt: skip


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_errors_cross_pickled_with_their_class_and_fields(error):
    back = from_wire(pickle.loads(pickle.dumps(to_wire(error))))
    assert type(back) is type(error) and str(back) == str(error)
    assert vars(back) == vars(error)


def test_stats_of_replicas_are_summed_and_the_hit_rate_recomputed():
    a = EngineStats(1, 2, 10, 4, 3, 1, prefix_cache_queried_tokens=100,
                    prefix_cache_hit_tokens=90, prefix_cache_hit_rate=0.9,
                    step_stats={"steps": {"eager": 3}})  # fmt: skip
    b = EngineStats(0, 1, 10, 10, 3, 3, prefix_cache_queried_tokens=300,
                    prefix_cache_hit_tokens=10, prefix_cache_hit_rate=1 / 30,
                    step_stats={"steps": {"eager": 1, "graph": 2}})  # fmt: skip
    s = sum_stats([a, b])
    assert (s.num_running, s.num_waiting, s.num_total_blocks, s.num_free_blocks) == (1, 3, 20, 14)
    assert s.prefix_cache_hit_rate == pytest.approx(100 / 400)
    assert s.step_stats == {"steps": {"eager": 4, "graph": 2}}
    assert sum_stats([]) is None
