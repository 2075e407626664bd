"""Cache pool sizing from a memory budget (pure arithmetic against hyla.cache.spec)."""

from __future__ import annotations

import logging

import pytest

from hyla.cache.spec import bytes_per_state_slot, bytes_per_token
from hyla.config import CacheConfig, ConfigError
from hyla.engine.memory import memory_budget, plan_cache
from hyla.models.registry import config_from_hf
from tests.hf_tiny import tiny_hf_config


@pytest.fixture(scope="module")
def config():
    return config_from_hf(tiny_hf_config("kimi_linear").to_dict())


def test_budget_buys_slots_first_then_blocks(config, caplog):
    per_tok, per_slot = bytes_per_token(config), bytes_per_state_slot(config)
    assert per_tok > 0 and per_slot > 0
    budget = 9 * per_slot + 100 * 16 * per_tok + 5
    with caplog.at_level(logging.INFO, logger="hyla.engine"):
        cache = CacheConfig(block_size=16, enable_prefix_caching=False)
        plan = plan_cache(config, cache, 256, 8, budget)
    assert plan.num_slots == 9 and plan.num_blocks == 100 and plan.num_checkpoints == 0
    assert plan.num_usable_blocks == 99 and plan.num_usable_slots == 8
    assert plan.total_bytes <= budget
    assert "99 blocks x 16 tokens = 1584 tokens" in caplog.text and "8 state slots" in caplog.text


def test_state_checkpoints_share_the_budget(config, caplog):
    per_tok, per_slot = bytes_per_token(config), bytes_per_state_slot(config)
    budget = 9 * per_slot + 10_000 * 16 * per_tok
    quarter = (budget - 9 * per_slot) // 4
    for stride in (64, 1024):
        cache = CacheConfig(block_size=16, state_checkpoint_stride=stride, num_state_slots=8)
        with caplog.at_level(logging.INFO, logger="hyla.engine"):
            plan = plan_cache(config, cache, 2048, 256, budget)
        per_stride = -(-(plan.num_usable_blocks * 16) // stride) + 2 * 8
        # one checkpoint per stride of blocks + 2 per slot (tails), at most a quarter of the rest
        assert 0 <= min(per_stride, quarter // per_slot) - plan.num_checkpoints <= 1
        assert plan.total_bytes <= budget < plan.total_bytes + 16 * per_tok + 2 * per_slot
        assert f"{plan.num_checkpoints} state checkpoints" in caplog.text
        # a checkpoint costs more than 64 tokens of this model's blocks: the quarter cap binds
        assert (plan.num_checkpoints < per_stride - 1) == (stride == 64)
    fixed = plan_cache(config, CacheConfig(block_size=16, num_state_checkpoints=3), 256, 8, budget)
    assert fixed.num_checkpoints == 3 and fixed.total_bytes <= budget
    explicit = plan_cache(config, CacheConfig(block_size=16, num_blocks=32), 64, 8, 0)
    assert explicit.num_checkpoints == 2 + 2 * 8  # 32 blocks x 16 tokens / stride 256 + tails


def test_blocks_capped_at_what_max_num_seqs_can_use(config):
    plan = plan_cache(config, CacheConfig(block_size=16), 100, 4, 1 << 40)
    assert plan.num_blocks == 4 * 7 + 1


def test_explicit_counts_override_the_budget(config):
    cache = CacheConfig(block_size=8, num_blocks=50, num_state_slots=3)
    plan = plan_cache(config, cache, 64, 16, 0)
    assert (plan.num_blocks, plan.num_slots) == (51, 4)


def test_too_small_budget_names_the_field_and_numbers(config):
    per_slot = bytes_per_state_slot(config)
    with pytest.raises(ConfigError, match="kv_cache_memory") as e:
        plan_cache(config, CacheConfig(), 4096, 8, 9 * per_slot + 1)
    assert "256 blocks" in str(e.value)
    with pytest.raises(ConfigError, match="state slots"):
        plan_cache(config, CacheConfig(), 64, 8, per_slot)


def test_memory_budget_sources():
    assert memory_budget(CacheConfig(kv_cache_memory=12345), "cpu") == 12345
    cpu = memory_budget(CacheConfig(memory_fraction=0.5, cpu_cache_memory_default=1 << 20), "cpu")
    assert 0 < cpu <= 1 << 20
