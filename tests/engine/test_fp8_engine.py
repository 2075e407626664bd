"""fp8 through the engine: `LLM(kv_cache_dtype="fp8", quantization="fp8")` on the embedded
model, prefix-cache hits over an fp8 cache (values and scales reused: equal to a cold run), all
blocks free afterwards, cache capacity at a fixed budget, and bad option values named."""

from __future__ import annotations

import pytest

from hyla import LLM, SamplingParams
from hyla.cache.spec import bytes_per_token
from hyla.config import ConfigError
from hyla.engine.loading import DEFAULT_MODEL_DIR
from hyla.models.loader import load_config
from tests.engine.engine_util import assert_all_free
from tests.models.test_inspect import DEEPSEEK_V32

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n    " * 6
SMALL = {"kv_cache_memory": 16 * 1024**2, "max_num_seqs": 4, "max_model_len": 2048}


def _text(llm: LLM, prompt: str) -> str:
    return llm.generate([prompt], GREEDY)[0].outputs[0].text


def test_fp8_cache_prefix_hit_equals_cold_run_and_frees_all() -> None:
    llm = LLM(kv_cache_dtype="fp8", quantization="fp8", state_checkpoint_stride=32, **SMALL)
    config = llm.engine.model_config
    assert config.kv_cache_dtype == "fp8" and config.quantization is not None
    first = _text(llm, PROMPT + "x = 1")
    hit = _text(llm, PROMPT + "y = 2")  # shares PROMPT's blocks and a state checkpoint
    assert llm.engine.get_stats().prefix_cache_hit_tokens > 0
    cold = LLM(kv_cache_dtype="fp8", quantization="fp8", enable_prefix_caching=False, **SMALL)
    assert hit == _text(cold, PROMPT + "y = 2")
    assert first == _text(cold, PROMPT + "x = 1")
    assert_all_free(llm.engine)


def test_fp8_cache_capacity_doubles_at_a_fixed_budget() -> None:
    blocks = {}
    for dtype in ("bfloat16", "fp8"):
        llm = LLM(kv_cache_dtype=dtype, kv_cache_memory=64 * 1024**2, max_num_seqs=8)
        blocks[dtype] = llm.engine.cache_plan.num_blocks
    assert blocks["fp8"] >= 1.9 * blocks["bfloat16"]
    # DeepSeek-V3.2's 61 DSA layers: latent 576 + index key 128 per token and layer
    ds = load_config_dict(DEEPSEEK_V32)
    bf16, fp8 = (bytes_per_token(ds.replace(kv_cache_dtype=d)) for d in ("bfloat16", "fp8"))
    assert bf16 == 61 * (576 + 128) * 2 and fp8 == 61 * (576 + 128 + 2 * 4)
    assert bf16 / fp8 >= 1.97


def load_config_dict(raw: dict):
    import json
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(raw))
        return load_config(d)


@pytest.mark.parametrize(
    ("option", "value"),
    [("kv_cache_dtype", "fp4"), ("quantization", "int4"), ("mamba_ssm_cache_dtype", "fp8")],
)
def test_bad_values_are_named(option: str, value: str) -> None:
    with pytest.raises(ConfigError, match=option):
        LLM(str(DEFAULT_MODEL_DIR), **SMALL, **{option: value})


def test_bf16_recurrent_state_option() -> None:
    llm = LLM(mamba_ssm_cache_dtype="bfloat16", **SMALL)
    assert llm.engine.model_config.mamba_ssm_cache_dtype == "bfloat16"
    assert len(_text(llm, "def f(x):")) > 0
