"""`speculative_config` in vLLM's JSON form: parsed from text, a dict or the dataclass; bad input
is a ConfigError naming the field."""

from __future__ import annotations

import pytest

from hyla.config import ConfigError, EngineConfig, SpeculativeConfig


def test_json_form_and_defaults():
    text = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}'
    spec = EngineConfig.from_kwargs(speculative_config=text).speculative_config
    assert spec == SpeculativeConfig("ngram", 4, 3, 3)  # min follows max, as vLLM
    same = EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                            "prompt_lookup_max": 3}).speculative_config  # fmt: skip
    assert same == spec
    default = SpeculativeConfig.parse({"method": "ngram"})
    assert (default.prompt_lookup_min, default.prompt_lookup_max) == (5, 5)
    assert EngineConfig().speculative_config is None


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ('{"method": "eagle"}', "speculative_config.method"),
        ('{"num_speculative_tokens": 2}', "speculative_config.method"),
        (
            '{"method": "ngram", "num_speculative_tokens": 0}',
            "speculative_config.num_speculative_tokens",
        ),
        (
            '{"method": "ngram", "num_speculative_tokens": 17}',
            "speculative_config.num_speculative_tokens",
        ),
        (
            '{"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
            "speculative_config.prompt_lookup_min",
        ),
        ('{"method": "ngram", "prompt_lookup_max": -1}', "speculative_config.prompt_lookup_max"),
        ('{"method": "ngram", "prompt_lookup_min": 0}', "speculative_config.prompt_lookup_min"),
        (
            '{"method": "ngram", "disable_by_batch_size": 0}',
            "speculative_config.disable_by_batch_size",
        ),
        ('{"method": "ngram", "draft_model": "x"}', "speculative_config.draft_model"),
        ("ngram", "speculative_config"),
        ("[3]", "speculative_config"),
    ],
    ids=[
        "method",
        "no-method",
        "k0",
        "k17",
        "min>max",
        "max<0",
        "min0",
        "batch0",
        "unknown",
        "text",
        "list",
    ],  # fmt: skip
)
def test_bad_values_name_the_field(value, field):
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        EngineConfig.from_kwargs(speculative_config=value)


def test_tensor_parallel_is_refused():
    from hyla.spec.decoder import spec_decoder

    config = EngineConfig.from_kwargs(speculative_config={"method": "ngram"})
    with pytest.raises(ConfigError, match="^speculative_config: not supported"):
        spec_decoder(config, plan=None, distributed=True)
