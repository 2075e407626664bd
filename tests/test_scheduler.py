"""Scheduler + cache manager: unit behaviour and a hypothesis fuzz of the bookkeeping (no torch).

The fuzz plays the engine without a model: requests arrive at random steps with random prompt
and output lengths and priorities, some are aborted at random steps, pools are small enough to
force preemption; "sampling" is a deterministic function of the sequence so far. After every
step it checks: budgets respected, no block or slot owned twice, pools conserved, scheduled
requests hold blocks for their tokens; at the end every request finished or was aborted and
every block and slot is free. A reference run with ample memory checks that preemption by
recompute does not change any request's tokens.

The prefix-caching fuzz also plays the model runner's tensors with exact stand-ins: a state row
holds the tuple of tokens it has absorbed, a block holds its tokens. Every step checks that each
scheduled request starts from the state of exactly its computed tokens (restored checkpoints
included) and that its table's blocks hold its context, i.e. cache hits are transparent.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hyla.cache.manager import CacheManager, num_blocks_for
from hyla.config import SchedulerConfig
from hyla.request import Request, RequestStatus, SamplingParams, check_token_stop
from hyla.scheduler import Scheduler, SchedulerOutput

EOS = 0


def make(block_size=4, num_blocks=64, num_slots=8, **sched) -> Scheduler:
    return Scheduler(SchedulerConfig(**sched), CacheManager(num_blocks, num_slots, block_size))


def req(rid: str, n_prompt: int, max_tokens: int = 4, priority: int = 0, **kw) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw)
    return Request(rid, list(range(1, n_prompt + 1)), params, priority=priority)


def advance(s: Scheduler, out: SchedulerOutput, sampled: dict[str, int]) -> None:
    """The engine's part of a step for these tests, in `LLMEngine`'s order: the scheduler's
    counters, then each sampled token appended and the stop it decides (EOS, stop ids,
    length: `check_token_stop`, the rule `LLMEngine._decide_stop` applies)."""
    s.update(out)
    for rid, token in sampled.items():
        r = s.requests.get(rid)
        if r is None or r.status is not RequestStatus.RUNNING:
            continue
        assert r.num_computed_tokens == r.num_tokens, f"{rid} sampled with uncomputed tokens"
        r.append_token(token)
        status = check_token_stop(r)
        if status is not None:
            s.finish(rid, status)


def run_step(s: Scheduler, token: int = 7):
    out = s.schedule()
    sampled = {
        rid: token
        for rid, n in out.num_scheduled_tokens.items()
        if s.requests[rid].num_computed_tokens + n == s.requests[rid].num_tokens
    }
    advance(s, out, sampled)
    return out


def test_chunked_prefill_then_decode_in_tokens():
    s = make(max_num_batched_tokens=4)
    s.add_request(req("a", 10, max_tokens=2))
    steps = [run_step(s).num_scheduled_tokens for _ in range(4)]
    assert steps == [{"a": 4}, {"a": 4}, {"a": 2}, {"a": 1}]
    assert not s.has_unfinished()
    assert s.cache.num_free_blocks == 63 and s.cache.num_free_slots == 7


def test_one_step_mixes_decodes_and_a_prefill_chunk():
    s = make(max_num_batched_tokens=8)
    s.add_request(req("a", 3, max_tokens=5))
    run_step(s)
    s.add_request(req("b", 20))
    out = run_step(s)
    assert out.num_scheduled_tokens == {"a": 1, "b": 7}


def test_budgets_max_num_seqs_and_tokens():
    s = make(max_num_batched_tokens=5, max_num_seqs=2)
    for i in range(4):
        s.add_request(req(f"r{i}", 2))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"r0": 2, "r1": 2}
    assert s.num_running == 2 and s.num_waiting == 2


def test_admission_needs_a_free_state_slot():
    s = make(num_slots=2)  # one usable slot
    s.add_request(req("a", 2))
    s.add_request(req("b", 2))
    assert list(s.schedule().num_scheduled_tokens) == ["a"]
    assert s.waiting[0].request_id == "b"


def test_preemption_by_recompute_when_blocks_run_out():
    # 4 usable blocks of 2 tokens; two requests each grow past 2 blocks.
    s = make(block_size=2, num_blocks=5, num_slots=3, max_num_batched_tokens=64)
    s.add_request(req("a", 4, max_tokens=4))
    s.add_request(req("b", 4, max_tokens=4))
    run_step(s)  # both prefilled: 2 blocks each, pool empty, each sampled one token
    out = s.schedule()  # both need a third block: b (latest) is preempted
    assert out.preempted_ids == ["b"] and list(out.num_scheduled_tokens) == ["a"]
    b = s.requests["b"]
    assert b.status is RequestStatus.WAITING and b.num_computed_tokens == 0
    assert b.num_tokens == 5 and not s.cache.has("b")
    advance(s, out, {"a": 9})
    while s.has_unfinished():
        run_step(s)
    assert s.cache.num_free_blocks == 4 and s.cache.num_free_slots == 2


def test_priority_policy_orders_waiting_and_picks_victims():
    s = make(max_num_seqs=1, policy="priority")
    s.add_request(req("low", 2, priority=5))
    s.add_request(req("high", 2, priority=-1))
    assert list(s.schedule().num_scheduled_tokens) == ["high"]


def test_fcfs_ignores_priority():
    s = make(max_num_seqs=1)
    s.add_request(req("first", 2, priority=5))
    s.add_request(req("second", 2, priority=-1))
    assert list(s.schedule().num_scheduled_tokens) == ["first"]


def test_abort_waiting_and_running_frees_at_once():
    s = make()
    s.add_request(req("a", 6))
    s.add_request(req("b", 6))
    s.add_request(req("c", 6))
    s.schedule()
    s.add_request(req("d", 2))
    assert s.finish("a", RequestStatus.FINISHED_ABORTED).status is RequestStatus.FINISHED_ABORTED
    assert s.finish("d", RequestStatus.FINISHED_ABORTED) is not None
    assert s.finish("a", RequestStatus.FINISHED_ABORTED) is None  # unknown now: no-op
    assert not s.cache.has("a") and s.num_running == 2 and s.num_waiting == 0


def test_abort_between_schedule_and_update_is_ignored_by_update():
    s = make()
    a = req("a", 3)
    s.add_request(a)
    out = s.schedule()
    s.finish("a", RequestStatus.FINISHED_ABORTED)
    s.update(out)
    assert a.num_computed_tokens == 0 and a.status is RequestStatus.FINISHED_ABORTED


def test_token_stops():
    s = make()
    r = Request("e", [5, 6], SamplingParams(max_tokens=10, stop_token_ids=[9]), eos_token_ids=(2,))
    s.add_request(r)
    run_step(s, token=3)
    run_step(s, token=9)
    assert r.status is RequestStatus.FINISHED_STOPPED and r.stop_reason == 9
    r2 = Request("m", [5], SamplingParams(max_tokens=10, min_tokens=2), eos_token_ids=(2,))
    s.add_request(r2)
    run_step(s, token=2)
    assert not r2.is_finished  # below min_tokens
    run_step(s, token=2)
    assert r2.status is RequestStatus.FINISHED_STOPPED and r2.stop_reason is None
    r3 = Request("l", [5, 6, 7], SamplingParams(max_tokens=None), max_model_len=5)
    s.add_request(r3)
    run_step(s)
    run_step(s)
    assert r3.status is RequestStatus.FINISHED_LENGTH and r3.num_tokens == 5


# -- fuzz ------------------------------------------------------------------------------------


def next_token(tokens: list[int], vocab: int) -> int:
    return (sum(tokens) * 31 + len(tokens) * 7) % vocab


request_st = st.tuples(
    st.integers(0, 12),  # arrival step
    st.integers(1, 24),  # prompt length
    st.integers(1, 12),  # max_tokens
    st.one_of(st.none(), st.integers(0, 40)),  # abort step
    st.integers(-2, 2),  # priority
)


def simulate(
    config, reqs, block_size, num_blocks, num_slots, check=True, vocab=50, prompts=None, **prefix
):
    s = Scheduler(config, CacheManager(num_blocks, num_slots, block_size, **prefix))
    sim = FakeTensors(s.cache) if prefix else None
    objs = {}
    for i, (_, plen, mt, _, prio) in enumerate(reqs):
        prompt = prompts[i] if prompts else [(i * 13 + j) % vocab for j in range(plen)]
        params = SamplingParams(max_tokens=mt)
        objs[f"r{i}"] = Request(f"r{i}", prompt, params, eos_token_ids=(EOS,), priority=prio)
    aborted = set()
    for step in range(2000):
        for i, (arr, _, _, ab, _) in enumerate(reqs):
            if arr == step:
                s.add_request(objs[f"r{i}"])
            if ab == step and s.finish(f"r{i}", RequestStatus.FINISHED_ABORTED):
                aborted.add(f"r{i}")
        out = s.schedule()
        if check:
            check_step(s, out, config, num_blocks, num_slots)
        if sim is not None:
            sim.run(s, out)
        sampled = {}
        for rid, n in out.num_scheduled_tokens.items():
            r = s.requests[rid]
            if r.num_computed_tokens + n == r.num_tokens:
                sampled[rid] = next_token(r.all_token_ids, vocab)
        advance(s, out, sampled)
        if step > 40 and not s.has_unfinished():
            break
    return s, objs, aborted


class FakeTensors:
    """Exact stand-ins for the cache tensors: a state row is the tuple of tokens it absorbed,
    a block maps offsets to the tokens written there."""

    def __init__(self, cache: CacheManager) -> None:
        self.cache = cache
        self.rows: dict[int, tuple[int, ...]] = {}
        self.blocks: dict[int, dict[int, int]] = {}

    def copy(self, pairs) -> None:
        values = {dst: self.rows.get(src) for src, dst in pairs}  # read all, then write
        self.rows.update(values)

    def run(self, s: Scheduler, out) -> None:
        cm, B = self.cache, self.cache.block_size
        self.copy(out.state_restores)
        for rid, n in out.num_scheduled_tokens.items():
            req = s.requests[rid]
            c, tokens, table = req.num_computed_tokens, req.all_token_ids, cm.block_table(rid)
            slot = cm.state_slot(rid)
            if c > 0 and (cm.prefix is None or cm.prefix.stride):  # (stride 0: no state)
                assert self.rows.get(slot) == tuple(tokens[:c]), f"{rid}: wrong initial state"
            for p in range(c):
                assert self.blocks[table[p // B]][p % B] == tokens[p], f"{rid}: wrong context"
            for p in range(c, c + n):
                assert cm.block_pool.blocks[table[p // B]].ref_count == 1, "write to a shared block"
                self.blocks.setdefault(table[p // B], {})[p % B] = tokens[p]
            for end, row in out.state_boundaries.get(rid, ()):  # written during the forward
                assert c < end < c + n, f"{rid}: boundary {end} outside its chunk"
                self.rows[row] = tuple(tokens[:end])
            self.rows[slot] = tuple(tokens[: c + n])
        self.copy(out.state_saves)


def check_prefix_index(cm: CacheManager) -> None:
    pool, ckpt = cm.block_pool, cm.prefix.checkpoints
    for h, b in pool.cached.items():
        assert pool.blocks[b].block_hash == h
    for h, c in ckpt.cached.items():
        assert h in pool.cached, "a checkpoint outlived its block"
        assert ckpt.keys[c] == h
    referenced = sum(1 for r in ckpt.ref_counts if r > 0)
    assert min(ckpt.ref_counts, default=0) >= 0
    assert referenced + ckpt.num_free == ckpt.num_checkpoints


def check_step(s, out, config, num_blocks, num_slots):
    cm = s.cache
    assert out.total_num_tokens <= config.max_num_batched_tokens
    assert len(out.num_scheduled_tokens) <= config.max_num_seqs
    assert len(s.running) <= config.max_num_seqs
    owned = [b for t in cm.block_tables.values() for b in t]
    if cm.prefix is None:
        assert len(owned) == len(set(owned)), "a block is in two tables"
    for b in set(owned):  # shared blocks: one reference per table, and content-addressed
        block = cm.block_pool.blocks[b]
        assert block.ref_count == owned.count(b)
        assert block.ref_count == 1 or cm.block_pool.cached.get(block.block_hash) == b
    assert 0 not in owned
    assert set(owned).isdisjoint(cm.block_pool.free_block_ids())
    assert len(set(owned)) + cm.num_free_blocks == num_blocks - 1
    if cm.prefix is not None:
        check_prefix_index(cm)
    slots = list(cm.state_slots.values())
    assert len(slots) == len(set(slots)) and 0 not in slots
    assert len(slots) + cm.num_free_slots == num_slots - 1
    assert set(cm.state_slots) == {r.request_id for r in s.running}
    for rid, n in out.num_scheduled_tokens.items():
        r = s.requests[rid]
        assert r.status is RequestStatus.RUNNING and n >= 1
        assert r.num_computed_tokens + n <= r.num_tokens
        need = num_blocks_for(r.num_computed_tokens + n, cm.block_size)
        assert len(cm.block_table(rid)) >= need


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(request_st, min_size=1, max_size=14),
    block_size=st.sampled_from([1, 2, 4, 8]),
    budget=st.integers(1, 48),
    max_num_seqs=st.integers(1, 6),
    extra_blocks=st.sampled_from([0, 0, 1, 2, 4, 12]),
    num_slots=st.integers(2, 8),
    policy=st.sampled_from(["fcfs", "priority"]),
    threshold=st.sampled_from([0, 0, 3]),
)
def test_fuzz_scheduler_and_cache(
    reqs, block_size, budget, max_num_seqs, extra_blocks, num_slots, policy, threshold
):
    max_len = max(p + m for _, p, m, _, _ in reqs)
    num_blocks = num_blocks_for(max_len, block_size) + extra_blocks + 1
    config = SchedulerConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        policy=policy,
        long_prefill_token_threshold=threshold,
    )
    s, objs, aborted = simulate(config, reqs, block_size, num_blocks, num_slots)
    event(f"preempted: {s.num_preemptions > 0}")
    assert not s.has_unfinished(), "some request never finished"
    assert s.cache.num_free_blocks == num_blocks - 1
    assert s.cache.num_free_slots == num_slots - 1
    assert not s.cache.block_tables and not s.cache.state_slots
    for rid, r in objs.items():
        assert r.is_finished
        assert (r.status is RequestStatus.FINISHED_ABORTED) == (rid in aborted)
    # Preemption by recompute never changes a request's tokens: compare with ample memory.
    roomy = SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=64, policy=policy)
    no_abort = [(a, p, m, None, pr) for a, p, m, _, pr in reqs]
    _, ref, _ = simulate(roomy, no_abort, block_size, 64 * num_blocks, 65, check=False)
    for rid, r in objs.items():
        if rid not in aborted:
            assert r.output_token_ids == ref[rid].output_token_ids
            assert r.status == ref[rid].status


def test_bookkeeping_never_imports_torch():
    import subprocess
    import sys

    code = (
        "import sys, hyla.request, hyla.cache.block_pool, hyla.cache.manager, hyla.scheduler;"
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
