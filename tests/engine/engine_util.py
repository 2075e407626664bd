"""Shared helpers of the engine tests: tiny checkpoints on disk, engines over them, and runs.

Models are the tiny random `transformers` models of `tests.hf_tiny`, saved with a locally
trained tokenizer and loaded through `hyla.models.loader.load_model` (the production path).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from hyla.config import EngineConfig
from hyla.engine.llm_engine import LLMEngine
from hyla.engine.loading import load_tokenizer
from hyla.request import RequestOutput, SamplingParams
from tests.engine.tiny_tokenizer import build_tokenizer
from tests.hf_tiny import save_tiny_hf_model

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=5)
# I3 on the CPU: the projections are bit for bit, but torch's vectorised sigmoid/silu/softplus
# round a tensor's tail differently from its body, and MLA's absorbed decode pads to the batch's
# longest context, so a row may round by its neighbours: run modes and batch compositions
# compare each logprob within this (why: tests/engine/test_batch_transparency_threads.py).
I3_LOGPROB_ATOL = 1e-5


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Tiny ops on 2 busy cores: torch's intra-op thread pool costs ~1000x on some of them
    (`index_add_` on a [1, 64] tensor: 8 us with 1 thread, 9 ms with 2 under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def save_checkpoint(family: str, path: Path, seed: int = 0):
    """Save a tiny HF model of `family` plus a tokenizer into `path`; returns the HF model."""
    hf = save_tiny_hf_model(family, path, seed=seed)
    build_tokenizer().save_pretrained(path)
    return hf


def load(path: Path):
    from hyla.models.loader import load_model

    return load_model(str(path), dtype="float32")


def make_engine(model, path: Path | None = None, **overrides) -> LLMEngine:
    opts = dict(max_model_len=512, block_size=16, max_num_seqs=32, max_num_batched_tokens=128)
    opts.update(overrides)
    tokenizer = load_tokenizer(path) if path is not None else None
    return LLMEngine(model, tokenizer, EngineConfig.from_kwargs(**opts))


def prompt_ids(n: int, seed: int, vocab: int = 256) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def run_all(engine: LLMEngine) -> dict[str, RequestOutput]:
    """Step until idle; the final output per request id."""
    final: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return final


STAGGERED = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)


def run_staggered(engine, vocab: int) -> tuple[dict, int]:
    """Requests arriving while others decode, prefills chunked by a 16-token budget: most
    steps mix decodes with a prefill chunk. Returns the final outputs and the mixed steps."""
    prompts = {f"r{k}": prompt_ids(9 + 7 * k, k, vocab) for k in range(4)}
    final, num_mixed, arrivals = {}, 0, list(prompts)
    execute = engine.runner.execute

    def counting(out, requests, *args, **kw):
        nonlocal num_mixed
        lens = list(out.num_scheduled_tokens.values())
        num_mixed += 1 in lens and any(n > 1 for n in lens)
        return execute(out, requests, *args, **kw)

    engine.runner.execute = counting
    while arrivals or engine.has_unfinished_requests():
        if arrivals:
            rid = arrivals.pop(0)
            engine.add_request(rid, prompts[rid], STAGGERED)
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return final, num_mixed


def solo(engine: LLMEngine, prompt: list[int], params: SamplingParams = GREEDY) -> RequestOutput:
    """Run one request alone in `engine` (which must be idle)."""
    assert not engine.has_unfinished_requests()
    engine.add_request("solo", prompt, params)
    return run_all(engine)["solo"]


def assert_all_free(engine: LLMEngine) -> None:
    stats = engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert stats.num_free_slots == stats.num_total_slots
    assert stats.num_running == stats.num_waiting == 0
    assert not engine.cache.block_tables and not engine.cache.state_slots


def assert_i4(engine: LLMEngine) -> None:
    """Every block, slot and state checkpoint back: no reference held by anyone."""
    assert_all_free(engine)
    prefix = engine.cache.prefix
    if prefix is not None:
        assert not any(prefix.checkpoints.ref_counts)
        assert not prefix._pending and not prefix._tails


def assert_same_completion(a: RequestOutput, b: RequestOutput, atol: float = 1e-5) -> None:
    """Identical token ids; per-token top logprobs equal within `atol` (fp32 logits)."""
    for x, y in zip(a.outputs, b.outputs, strict=True):
        assert x.token_ids == y.token_ids
        if x.logprobs is not None:
            for lx, ly in zip(x.logprobs, y.logprobs, strict=True):
                assert lx.keys() == ly.keys()
                for t in lx:
                    assert abs(lx[t] - ly[t]) <= atol, (t, lx[t], ly[t])


def assert_close_completion(got: RequestOutput, want: RequestOutput, atol: float) -> None:
    """`assert_same_completion` for kernels that round differently (TF32 on a GPU): per step,
    the logprobs of the top candidates both runs list agree within `atol`, and a candidate only
    one run lists sits within `atol` of the other's last one (a swap at the top-k's tail);
    token ids agree up to the first step where `want`'s top two are within `atol` (a near tie
    that rounding may break either way, after which the sequences may part)."""
    for x, y in zip(got.outputs, want.outputs, strict=True):
        assert x.logprobs is not None and y.logprobs is not None, "needs logprobs"
        assert len(x.token_ids) == len(y.token_ids)
        for step, (lx, ly) in enumerate(zip(x.logprobs, y.logprobs, strict=True)):
            for t in lx.keys() & ly.keys():
                assert abs(lx[t] - ly[t]) <= atol, (step, t, lx[t], ly[t])
            for mine, other in ((lx, ly), (ly, lx)):
                for t in mine.keys() - other.keys():
                    assert abs(mine[t] - min(other.values())) <= atol, (step, t, mine[t])
            assert x.token_ids[step] == y.token_ids[step], step
            top = sorted(ly.values(), reverse=True)
            if len(top) > 1 and top[0] - top[1] <= atol:
                break  # a near tie: the runs may part after this step
