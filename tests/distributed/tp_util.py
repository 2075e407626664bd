"""Shared by the tensor-parallel tests: one scripted scenario run on an engine, step by step.

The scenario mixes what TP must not change: a long prompt prefilled in chunks while another
request decodes (mixed batches), a request aborted mid-stream, and a later request whose
prompt extends a finished one (a prefix-cache hit). Every step's sampled-row logits are
recorded (the gathered vocab-parallel logits under TP), so two engines compare step by step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hyla.engine.llm_engine import LLMEngine
from hyla.request import SamplingParams
from tests.engine.engine_util import prompt_ids

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
LOGPROBS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=3,
                          prompt_logprobs=3)  # fmt: skip
OPTIONS = dict(
    max_model_len=256, block_size=16, max_num_seqs=8, max_num_batched_tokens=32,
    dtype="float32", device="cpu", state_checkpoint_stride=16,
)  # fmt: skip


@dataclass
class Run:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    logits: list[torch.Tensor] = field(default_factory=list)  # sampled rows, step by step
    prefix_hit_tokens: int = 0
    aborted: list[str] = field(default_factory=list)
    logprobs: dict[str, list] = field(default_factory=dict)  # prompt + sampled top logprobs


def engine(path, **overrides) -> LLMEngine:
    return LLMEngine.from_path(str(path), **{**OPTIONS, **overrides})


def run_scenario(engine: LLMEngine) -> Run:
    """The scripted scenario; asserts I4 (every block, slot and checkpoint free) at the end."""
    run = Run()
    execute = engine.runner.execute

    def recording(*args, **kwargs):
        result = execute(*args, **kwargs)
        if result.logits is not None:
            run.logits.append(result.logits.clone())
        return result

    engine.runner.execute = recording
    long_prompt = prompt_ids(70, seed=1)
    engine.add_request("a", long_prompt, GREEDY)  # 70 tokens: 3 chunks of <= 32
    engine.add_request("b", prompt_ids(9, seed=2), GREEDY)
    engine.add_request("f", prompt_ids(12, seed=6), LOGPROBS)  # every prompt row's logits
    for i in range(40):
        if i == 3:
            engine.add_request("c", prompt_ids(40, seed=3), GREEDY)  # prefill beside decodes
            engine.add_request("d", prompt_ids(20, seed=4), GREEDY)
        if i == 8:
            engine.abort_request("d")
        _collect(engine.step(), run)
    _drain(engine, run)
    engine.add_request("e", long_prompt[:64] + prompt_ids(6, seed=5), GREEDY)
    _drain(engine, run)
    run.prefix_hit_tokens = engine.get_stats().prefix_cache_hit_tokens
    engine.runner.execute = execute
    _assert_i4(engine)
    return run


def _collect(outputs, run: Run) -> None:
    for out in outputs:
        if out.finished:
            run.tokens[out.request_id] = list(out.outputs[0].token_ids)
            if out.prompt_logprobs is not None:
                run.logprobs[out.request_id] = [out.prompt_logprobs, out.outputs[0].logprobs]
            if out.outputs[0].finish_reason == "abort":
                run.aborted.append(out.request_id)


def _drain(engine: LLMEngine, run: Run) -> None:
    for _ in range(200):
        if not engine.has_unfinished_requests():
            return
        _collect(engine.step(), run)
    raise AssertionError("the scenario did not finish")


def _assert_i4(engine: LLMEngine) -> None:
    stats = engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert stats.num_free_slots == stats.num_total_slots
    assert not engine.cache.block_tables and not engine.cache.state_slots
    prefix = engine.cache.prefix
    assert prefix is None or not any(prefix.checkpoints.ref_counts)


def min_ints_rank(rank: int, world: int, init_method: str, values: list[int], queue) -> None:
    """A process of `test_ranks_agree_on_the_smallest_pools`: rank `rank` offers `values`."""
    from hyla.distributed.groups import destroy_tp_group, init_tp_group

    tp = init_tp_group(rank, world, init_method, "cpu", 30.0)
    queue.put((rank, tp.min_ints(values)))
    destroy_tp_group(tp)
