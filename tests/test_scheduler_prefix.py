"""Scheduler + prefix cache bookkeeping (no torch): checkpoints inside chunks, tails, hits,
waiting for an in-flight prefix, and a hypothesis fuzz with shared prefixes and multi-turn
prompts, played against exact stand-ins of the cache tensors (tests.test_scheduler.FakeTensors).
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hyla.cache.manager import CacheManager, num_blocks_for
from hyla.config import SchedulerConfig
from hyla.request import Request, RequestStatus, SamplingParams
from hyla.scheduler import Scheduler
from tests.test_scheduler import EOS, FakeTensors, advance, next_token, simulate

VOCAB = 50


def make(block_size=4, num_blocks=64, num_slots=8, stride=8, num_checkpoints=8, **sched):
    cache = CacheManager(
        num_blocks,
        num_slots,
        block_size,
        enable_prefix_caching=True,
        checkpoint_stride=stride,
        num_checkpoints=num_checkpoints,
    )
    return Scheduler(SchedulerConfig(**sched), cache)


def req(rid: str, prompt: list[int], max_tokens: int = 2, **kw) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw))


def step(s: Scheduler, sim: FakeTensors | None = None):
    out = s.schedule()
    if sim is not None:
        sim.run(s, out)
    sampled = {
        rid: next_token(s.requests[rid].all_token_ids, VOCAB)
        for rid, n in out.num_scheduled_tokens.items()
        if s.requests[rid].num_computed_tokens + n == s.requests[rid].num_tokens
    }
    advance(s, out, sampled)
    return out


def run(s: Scheduler, sim: FakeTensors | None = None) -> list:
    outs = []
    while s.has_unfinished():
        outs.append(step(s, sim))
    return outs


PROMPT = list(range(1, 31))  # 30 tokens; B = 4, stride 8


def test_one_chunk_saves_every_stride_boundary_and_its_tail_inside_it():
    s = make(max_num_batched_tokens=64)
    sim = FakeTensors(s.cache)
    s.add_request(req("a", PROMPT, max_tokens=4))
    out = step(s, sim)
    assert out.num_scheduled_tokens == {"a": 30}  # never cut for a checkpoint
    inside = out.state_boundaries["a"]
    assert [end for end, _ in inside] == [8, 16, 24, 28]  # strides, the prompt's last block
    for end, row in inside:
        assert row >= s.cache.slot_pool.num_slots and sim.rows[row] == tuple(PROMPT[:end])
    assert not out.state_saves  # 30 is no block boundary: nothing to copy after the forward
    assert len(s.cache.prefix.checkpoints.cached) == 4
    step(s, sim)
    out = step(s, sim)  # decode 31 -> 32: a stride boundary at the chunk's end
    (save,) = out.state_saves
    assert save[0] == s.cache.state_slot("a") and sim.rows[save[1]] == tuple(
        s.requests["a"].all_token_ids[:32]
    )
    assert len(s.cache.prefix.checkpoints.cached) == 5


def test_deepest_policy_saves_one_stride_per_chunk_and_the_wanted_ones():
    s = make(max_num_batched_tokens=64)
    s.cache.prefix.policy = "deepest"
    sim = FakeTensors(s.cache)
    s.add_request(req("a", PROMPT + [60]))
    s.add_request(req("b", PROMPT[:17] + [61, 62]))  # shares 17 tokens: wants boundary 16
    out = step(s, sim)
    assert [end for end, _ in out.state_boundaries["a"]] == [16, 24, 28]
    step(s, sim)
    assert s.requests["b"].num_cached_tokens == 16
    run(s, sim)


def test_hit_needs_blocks_and_checkpoint_at_the_same_length():
    s = make(max_num_batched_tokens=8)  # a's chunks end at 8, 16, 24: three checkpoints
    sim = FakeTensors(s.cache)
    s.add_request(req("a", PROMPT))
    run(s, sim)
    b = req("b", PROMPT[:26] + [40, 41, 42])
    s.add_request(b)
    out = step(s, sim)  # blocks cover 24 tokens (6 full blocks), checkpoint at 24: hit 24
    assert b.num_cached_tokens == 24 and out.num_scheduled_tokens == {"b": 5}
    assert out.state_restores and out.state_restores[0][1] == s.cache.state_slot("b")
    # drop the checkpoint at 24: blocks alone do not make a hit; the 16-token one still does
    prefix = s.cache.prefix
    key = prefix.hashes(b)[5]
    prefix.checkpoints.drop(key)
    c = req("c", PROMPT[:26] + [43])
    s.add_request(c)
    run(s, sim)
    assert c.num_cached_tokens == 16
    assert prefix.stats.num_block_only_tokens == 8  # blocks reached 24, checkpoint only 16


def test_a_full_prompt_hit_still_computes_one_token():
    s = make(max_num_batched_tokens=64)
    s.add_request(req("a", PROMPT[:24]))
    run(s)
    s.add_request(req("b", PROMPT[:24]))
    out = step(s)
    # the last full block before the prompt's last token: 20 of 24
    assert s.requests["b"].num_cached_tokens == 20 and out.num_scheduled_tokens == {"b": 4}


def test_saves_are_filed_only_once_their_step_committed():
    s = make(max_num_batched_tokens=64)
    s.add_request(req("a", PROMPT))
    out = s.schedule()
    assert [end for end, _ in out.state_boundaries["a"]] == [8, 16, 24, 28]
    s.finish("a", RequestStatus.FINISHED_ABORTED)  # aborted before its step committed
    ckpt = s.cache.prefix.checkpoints
    assert not ckpt.cached and ckpt.num_free == ckpt.num_checkpoints


def test_waiting_request_waits_for_the_prefix_being_computed():
    s = make(max_num_batched_tokens=12)
    sim = FakeTensors(s.cache)
    s.add_request(req("a", PROMPT + [60]))
    s.add_request(req("b", PROMPT + [61]))
    first = step(s, sim)
    assert list(first.num_scheduled_tokens) == ["a"]  # b waits although budget is left
    outs = run(s, sim)
    assert s.requests.get("b") is None
    stats = s.cache.prefix.stats
    assert stats.num_hit_tokens == 24  # b reused a's 24 tokens instead of computing them
    assert all(o.total_num_tokens <= 12 for o in outs)


def test_waiting_request_resumes_from_the_owner_state_inside_its_chunk():
    s = make(max_num_batched_tokens=64, stride=8)
    sim = FakeTensors(s.cache)
    s.add_request(req("a", PROMPT + [60]))
    s.add_request(req("b", PROMPT[:17] + [61, 62]))  # shares 17 tokens: boundary 16
    out = step(s, sim)
    assert out.num_scheduled_tokens == {"a": 31}  # not cut: the state at 16 is written inside
    step(s, sim)
    assert s.requests["b"].num_cached_tokens == 16
    run(s, sim)


def test_requests_sharing_a_prefix_are_admitted_together():
    s = make(max_num_batched_tokens=64, max_num_seqs=4)
    sim = FakeTensors(s.cache)
    for i in range(4):
        s.add_request(req(f"r{i}", PROMPT + [60 + i]))
    assert list(step(s, sim).num_scheduled_tokens) == ["r0"]
    second = step(s, sim)
    assert set(second.num_scheduled_tokens) == {"r0", "r1", "r2", "r3"}
    assert [s.requests[f"r{i}"].num_cached_tokens for i in range(1, 4)] == [28, 28, 28]
    run(s, sim)


def test_conservation_after_hits_and_aborts():
    s = make(max_num_batched_tokens=16, num_blocks=24, num_checkpoints=3)
    sim = FakeTensors(s.cache)
    for i in range(6):
        s.add_request(req(f"r{i}", PROMPT[: 10 + 3 * i] + [i], max_tokens=5))
    step(s, sim)
    s.finish("r5", RequestStatus.FINISHED_ABORTED)
    run(s, sim)
    cm = s.cache
    assert cm.num_free_blocks == 23 and cm.num_free_slots == 7
    assert cm.prefix.checkpoints.num_free == 3
    assert not cm.prefix._in_flight and not cm.prefix._pending


def test_stateless_model_hits_at_any_block_boundary():
    s = make(stride=0, num_checkpoints=0, max_num_batched_tokens=64)
    s.add_request(req("a", PROMPT))
    run(s)
    s.add_request(req("b", PROMPT[:23] + [1]))
    out = step(s)
    assert s.requests["b"].num_cached_tokens == 20 and not out.state_restores


# -- fuzz ------------------------------------------------------------------------------------

prefix_request_st = st.tuples(
    st.integers(0, 12),  # arrival step
    st.integers(0, 3),  # shared document 0..2, or 3: a later turn of an earlier request
    st.integers(0, 40),  # shared length
    st.integers(1, 8),  # own suffix length
    st.integers(1, 10),  # max_tokens
    st.one_of(st.none(), st.integers(0, 40)),  # abort step
)


def full_sequence(prompt: list[int], max_tokens: int) -> list[int]:
    """Prompt + the tokens the fuzz's deterministic "model" generates (EOS stops)."""
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens, VOCAB))
        if tokens[-1] == EOS:
            break
    return tokens


def build_prompts(specs) -> list[list[int]]:
    docs = [[(d * 17 + j * 7) % (VOCAB - 1) + 1 for j in range(40)] for d in range(3)]
    prompts: list[list[int]] = []
    for i, (_, doc, shared, own, _, _) in enumerate(specs):
        suffix = [(i * 13 + j) % (VOCAB - 1) + 1 for j in range(own)]
        if doc == 3 and prompts:  # multi-turn: an earlier conversation plus a new message
            k = shared % len(prompts)
            prompts.append(full_sequence(prompts[k], specs[k][4]) + suffix)
        else:
            prompts.append(docs[doc % 3][:shared] + suffix)
    return prompts


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(prefix_request_st, min_size=1, max_size=12),
    block_size=st.sampled_from([1, 2, 4]),
    stride_blocks=st.sampled_from([0, 1, 2, 3]),
    num_checkpoints=st.sampled_from([0, 1, 3, 16]),
    budget=st.integers(1, 48),
    max_num_seqs=st.integers(1, 6),
    extra_blocks=st.sampled_from([0, 2, 8, 40]),
    num_slots=st.integers(2, 8),
)
def test_fuzz_prefix_caching(
    specs, block_size, stride_blocks, num_checkpoints, budget, max_num_seqs, extra_blocks, num_slots
):
    prompts = build_prompts(specs)
    reqs = [(a, len(p), mt, ab, 0) for (a, _, _, _, mt, ab), p in zip(specs, prompts, strict=True)]
    max_len = max(len(p) + mt for p, (_, _, _, _, mt, _) in zip(prompts, specs, strict=True))
    num_blocks = num_blocks_for(max_len, block_size) + extra_blocks + 1
    config = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs)
    prefix = dict(
        enable_prefix_caching=True,
        checkpoint_stride=stride_blocks * block_size,
        num_checkpoints=num_checkpoints if stride_blocks else 0,
    )
    s, objs, aborted = simulate(
        config, reqs, block_size, num_blocks, num_slots, prompts=prompts, vocab=VOCAB, **prefix
    )
    stats = s.cache.prefix.stats
    event(f"hit: {stats.num_hit_tokens > 0}")
    event(f"preempted: {s.num_preemptions > 0}")
    assert not s.has_unfinished(), "some request never finished"
    cm = s.cache
    assert cm.num_free_blocks == num_blocks - 1 and cm.num_free_slots == num_slots - 1
    assert all(b.ref_count == 0 for b in cm.block_pool.blocks)
    assert cm.prefix.checkpoints.num_free == cm.prefix.checkpoints.num_checkpoints
    assert not cm.prefix._in_flight and not cm.prefix._pending and not cm.prefix._tails
    roomy = SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=64)
    no_abort = [(a, p, m, None, pr) for a, p, m, _, pr in reqs]
    _, ref, _ = simulate(
        roomy, no_abort, block_size, 64 * num_blocks, 65, check=False, prompts=prompts, vocab=VOCAB
    )
    for rid, r in objs.items():
        if rid not in aborted:
            assert r.output_token_ids == ref[rid].output_token_ids
            assert r.status == ref[rid].status
