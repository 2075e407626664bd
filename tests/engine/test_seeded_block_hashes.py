"""Prompt block hashes computed off the engine thread (`TokenIds.block_hashes`, filled by the
server's tokenizer pool) and taken by `PrefixCache.seed_hashes` (issue 18 item 4).

Oracles: `extend_block_hashes` run here (the function the engine thread would run), and the same
requests through an engine that hashes them itself (same outputs, same prefix hits).
"""

from __future__ import annotations

import pytest

from hyla.cache.prefix import extend_block_hashes
from hyla.engine.validate import prompt_token_ids
from hyla.request import Request, SamplingParams
from tests.engine.engine_util import run_all
from tests.server.conftest import load_tokenizer, tiny_engine

PROMPT = [5 + (7 * i) % 200 for i in range(7 * 16 + 3)]  # 7 full blocks of 16 and a tail
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def _request(rid: str) -> Request:
    return Request(rid, PROMPT, GREEDY)


def test_seeds_are_spot_checked(tokenizer):
    prefix = tiny_engine(tokenizer).cache.prefix
    block = prefix.block_size
    good = extend_block_hashes([], PROMPT, block)
    assert len(good) == 7
    bad_middle = [*good[:3], good[3] ^ 1, *good[4:]]  # blocks 0, 3 and 6 are re-hashed
    assert not prefix.seed_hashes("a", PROMPT, bad_middle)
    assert not prefix.seed_hashes("a", PROMPT, good[:-1])
    assert prefix.hashes(_request("a")) == good  # hashed on its own
    unchecked = [good[0], good[1] ^ 1, *good[2:]]  # block 1 is not re-hashed: taken as given
    assert prefix.seed_hashes("b", PROMPT, unchecked)
    assert prefix.hashes(_request("b")) == unchecked  # so the seeds are what the request uses
    assert not prefix.seed_hashes("b", PROMPT, good)  # a request's hashes are seeded once


def _run(tokenizer, seeds: list[int] | None) -> tuple[list, list, int]:
    engine = tiny_engine(tokenizer)
    ids = prompt_token_ids(PROMPT, None, engine.model_config.vocab_size)
    if seeds is not None:
        ids.block_size, ids.block_hashes = engine.cache.block_size, seeds
    engine.add_request("first", ids, GREEDY)
    first = run_all(engine)["first"]
    engine.add_request("again", list(PROMPT), GREEDY)  # hits the blocks `first` filed
    again = run_all(engine)["again"]
    outputs = [(c.token_ids, c.logprobs) for out in (first, again) for c in out.outputs]
    hashes = engine.cache.prefix.hashes(_request("probe"))
    return outputs, hashes, engine.get_stats().prefix_cache_hit_tokens


def test_seeded_engine_equals_self_hashing_engine(tokenizer):
    good = extend_block_hashes([], PROMPT, 16)
    seeded = _run(tokenizer, good)
    plain = _run(tokenizer, None)
    assert seeded == plain
    assert seeded[2] > 0  # the second request did reuse the first's blocks
    # The engine files the first request's blocks under its seeds: with block 1's seed wrong
    # (not spot-checked) the second request, hashing its own, finds less.
    tampered = _run(tokenizer, [good[0], good[1] ^ 1, *good[2:]])
    assert tampered[2] < plain[2]
