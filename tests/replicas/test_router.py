"""The router's rules, without Ray: hashes from hyla.cache.prefix, loads and reports by hand.

Oracle for the predicted hit: a real `PrefixCache` of the same block size and stride, whose
`match` says what a replica holding those blocks and checkpoints would reuse.
"""

from __future__ import annotations

import pytest

from hyla.cache.block_pool import BlockPool
from hyla.cache.prefix import PrefixCache, extend_block_hashes
from hyla.replicas.router import CacheDelta, NoReplicaError, Router, RouterConfig
from hyla.request import Request, SamplingParams

B, STRIDE = 4, 8


def _hashes(ids: list[int]) -> list[int]:
    return extend_block_hashes([], ids, B)


def _router(n: int = 2, stride: int = STRIDE, **config) -> Router:
    return Router(n, B, stride, RouterConfig(**config))


def _cached(router: Router, replica: int, blocks: list[int], checkpoints: list[int]) -> None:
    router.report(replica, 0, 0, CacheDelta(1, None, frozenset(blocks), frozenset(),
                                            frozenset(checkpoints)))  # fmt: skip


PREFIX = list(range(100, 116))  # 16 tokens: 4 blocks, stride boundaries after 8 and 16


def test_prefix_rule_picks_the_replica_holding_blocks_and_checkpoint():
    r = _router()
    h = _hashes(PREFIX)
    _cached(r, 1, h, [h[1], h[3]])
    route = r.route("a", _hashes([*PREFIX, 7, 8, 9, 10]), 20)
    assert (route.replica, route.reason, route.predicted_hit_tokens) == (1, "prefix", 16)


def test_blocks_without_a_checkpoint_are_no_hit_for_a_model_with_linear_layers():
    r = _router()
    h = _hashes(PREFIX)
    _cached(r, 1, h, [])  # blocks only: the state at no boundary
    route = r.route("a", _hashes([*PREFIX, 7]), 17)
    assert (route.reason, route.predicted_hit_tokens) == ("least_loaded", 0)
    r.finish("a")  # (while open, its own checkpoints count on its replica)
    _cached(r, 0, h, [h[1]])  # a checkpoint after 8 tokens only
    assert r.predicted_hit(0, _hashes([*PREFIX, 7]), 17) == 8


def test_without_linear_layers_any_cached_block_boundary_hits():
    r = _router(stride=0)
    h = _hashes(PREFIX)
    _cached(r, 1, h[:3], [])
    assert r.route("a", _hashes([*PREFIX, 7]), 17).predicted_hit_tokens == 12


@pytest.mark.parametrize("num_blocks,checkpoint_at", [(4, 2), (4, 4), (3, 2), (2, 1)])
def test_predicted_hit_equals_what_the_replica_cache_matches(num_blocks, checkpoint_at):
    ids = [*PREFIX, 1, 2, 3]
    h = _hashes(ids)
    pool = BlockPool(16)
    cache = PrefixCache(pool, B, STRIDE, num_checkpoints=4)
    for j, block in enumerate(pool.allocate(num_blocks)):
        pool.cache_block(block, h[j])
    c = cache.checkpoints.allocate()
    cache.checkpoints.register(c, h[checkpoint_at - 1])
    expected = cache.match(Request("q", ids, SamplingParams())).num_tokens
    r = _router()
    _cached(r, 0, list(pool.cached), list(cache.checkpoints.cached))
    assert r.predicted_hit(0, h, len(ids)) == expected


def test_one_token_is_left_to_compute():
    r = _router()
    h = _hashes(PREFIX)
    _cached(r, 0, h, [h[1], h[3]])
    assert r.predicted_hit(0, h, 16) == 8  # the whole prompt cached: its last token is not


def test_least_loaded_by_reported_tokens():
    r = _router()
    r.report(0, 500, 0)
    r.report(1, 100, 0)
    assert r.route("a", [], 10) .replica == 1  # fmt: skip


def test_routed_requests_count_as_load_until_a_report_counts_them():
    r = _router(policy="least_loaded")
    assert r.route("a", [], 300).replica == 0
    assert r.load(0) == 300
    assert r.route("b", [], 10).replica == 1
    r.admitted("a", 1)
    r.report(0, 0, 0)  # a report from before its admission: still counted
    assert r.load(0) == 300
    r.report(0, 290, 1)  # the replica counts it now (prompt + output so far)
    assert r.load(0) == 290
    r.finish("a")
    r.report(0, 0, 1)
    assert r.load(0) == 0


def test_a_burst_sharing_a_prefix_lands_on_one_replica_before_any_report():
    r = _router()
    first = r.route("a", _hashes([*PREFIX, 1]), 17)
    second = r.route("b", _hashes([*PREFIX, 2]), 17)
    assert first.reason == "least_loaded"
    assert (second.replica, second.reason) == (first.replica, "prefix")
    assert second.predicted_hit_tokens == 16
    r.finish("a"), r.finish("b")
    assert r.predicted_hit(first.replica, _hashes([*PREFIX, 3]), 17) == 0  # nothing reported


def test_load_cap_sends_a_hot_prefix_elsewhere():
    r = _router(balance_abs_tokens=100, balance_rel=1.5)
    h = _hashes(PREFIX)
    _cached(r, 0, h, [h[3]])
    r.report(0, 1000, 0)
    r.report(1, 500, 0)
    route = r.route("a", _hashes([*PREFIX, 1]), 17)
    assert (route.replica, route.reason) == (1, "capped")
    r.report(0, 550, 0)  # within the absolute gap: no imbalance
    assert r.route("b", _hashes([*PREFIX, 2]), 17).reason == "prefix"
    r2 = _router(balance_abs_tokens=100, balance_rel=3.0)
    _cached(r2, 0, h, [h[3]])
    r2.report(0, 1000, 0)
    r2.report(1, 500, 0)
    assert r2.route("c", _hashes([*PREFIX, 1]), 17).reason == "prefix"  # within the ratio


def test_the_cap_allows_as_much_more_load_as_the_hit_saves():
    r = _router(balance_abs_tokens=100, balance_rel=1.0)
    h = _hashes(PREFIX)
    _cached(r, 0, h, [h[3]])  # a 16-token hit on replica 0
    r.report(0, 116, 0)
    assert r.route("a", _hashes([*PREFIX, 1]), 17).reason == "prefix"  # 116 - 16 <= 100
    r.report(0, 117, 0)
    r.finish("a")
    assert r.route("b", _hashes([*PREFIX, 1]), 17).reason == "capped"


def test_round_robin_skips_a_dead_replica():
    r = _router(n=3, policy="round_robin")
    assert [r.route(str(i), [], 5).replica for i in range(3)] == [0, 1, 2]
    r.set_alive(1, False)
    assert {r.route(f"x{i}", [], 5).replica for i in range(4)} == {0, 2}


def test_a_dead_replica_gets_nothing_and_forgets_its_cache():
    r = _router()
    h = _hashes(PREFIX)
    _cached(r, 0, h, [h[3]])
    r.route("a", _hashes([*PREFIX, 1]), 17)
    r.set_alive(0, False)
    assert r.views[0].num_open == 0 and not r.views[0].blocks
    route = r.route("b", _hashes([*PREFIX, 1]), 17)
    assert route.replica == 1
    r.set_alive(1, False)
    with pytest.raises(NoReplicaError):
        r.route("c", [], 5)


def test_cache_deltas_apply_on_their_base_version_only():
    r = _router()
    _cached(r, 0, [1, 2], [2])
    r.report(0, 0, 0, CacheDelta(2, 1, frozenset({3}), frozenset({1}), frozenset(), frozenset()))
    assert r.views[0].blocks == {2, 3} and r.views[0].cache_version == 2
    r.report(0, 0, 0, CacheDelta(9, 5, frozenset({4})))  # a gap: forget, wait for a snapshot
    assert r.views[0].blocks == set() and r.views[0].cache_version == 0


def test_decisions_are_counted_by_replica_and_rule():
    r = _router()
    r.route("a", [], 5)
    r.route("b", [], 5)
    assert r.decisions == {(0, "least_loaded"): 1, (1, "least_loaded"): 1}


@pytest.mark.parametrize("field,value", [("policy", "random"), ("balance_abs_tokens", -1),
                                         ("balance_rel", 0.5)])  # fmt: skip
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RouterConfig(**{field: value})
