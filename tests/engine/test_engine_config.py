"""EngineConfig: flat options routed to the engine, cache and scheduler configs."""

from __future__ import annotations

import pytest

from hyla.config import CacheConfig, ConfigError, EngineConfig, SchedulerConfig


def test_from_kwargs_routes_by_field_name():
    c = EngineConfig.from_kwargs(
        block_size=8, kv_cache_memory=1 << 20, max_num_seqs=3, policy="priority", seed=5,
        max_model_len=77, request_timeout=2.5,
    )  # fmt: skip
    assert c.cache.block_size == 8 and c.cache.kv_cache_memory == 1 << 20
    assert c.scheduler.max_num_seqs == 3 and c.scheduler.policy == "priority"
    assert (c.seed, c.max_model_len, c.request_timeout) == (5, 77, 2.5)


def test_from_kwargs_accepts_whole_subconfigs_and_merges():
    c = EngineConfig.from_kwargs(cache=CacheConfig(block_size=32), num_blocks=10)
    assert c.cache.block_size == 32 and c.cache.num_blocks == 10
    s = EngineConfig.from_kwargs(scheduler=SchedulerConfig(max_num_seqs=2))
    assert s.scheduler.max_num_seqs == 2


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"bogus": 1}, "bogus"),
        ({"dtype": "int8"}, "dtype"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_queue_len": -1}, "max_queue_len"),
        ({"request_timeout": 0}, "request_timeout"),
        ({"num_blocks": 0}, "num_blocks"),
        ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
        ({"policy": "lifo"}, "policy"),
    ],
)
def test_invalid_options_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=field):
        EngineConfig.from_kwargs(**kw)


@pytest.mark.parametrize(
    "value,want",
    [
        (3, 3),
        ("3", 3),
        ({"image": 2}, 2),
        ('{"image": 2, "video": 0}', 2),
        ({"video": 0}, 4),
        ("{}", 4),
    ],
)
def test_limit_mm_per_prompt_takes_vllms_forms(value, want):
    """vLLM takes `--limit-mm-per-prompt '{"image": 2}'` (and a dict in `LLM(...)`); a count
    works too. The CLI hands the string over as it is (the option is typed str). A modality
    the mapping leaves out keeps its default (vLLM's `MultiModalConfig.get_limit_per_prompt`):
    '{"video": 0}', vLLM's way to turn video off, leaves images at the default 4, not 0."""
    from hyla.cli_options import config_options

    assert EngineConfig.from_kwargs(limit_mm_per_prompt=value).limit_mm_per_prompt == want
    spec = next(s for s in config_options(EngineConfig) if s.name == "limit_mm_per_prompt")
    assert spec.type is str and spec.default == 4


@pytest.mark.parametrize(
    "value,says",
    [({"video": 1}, "only images"), ('{"audio": 2}', "only images"), ("two", "JSON object"),
     (-1, ">= 0"), ({"image": -2}, ">= 0"), ({"image": "2"}, "integer"), (True, "integer")],
)
def test_limit_mm_per_prompt_refuses_what_it_cannot_honour(value, says):
    with pytest.raises(ConfigError, match=f"limit_mm_per_prompt.*{says}"):
        EngineConfig.from_kwargs(limit_mm_per_prompt=value)
