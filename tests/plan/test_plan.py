"""`hyla plan` against hand-computed bytes for three full-size models (configs written out by
hand in full_configs.py; expected numbers by arithmetic here, not from hyla's code)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hyla.cli import app
from hyla.models.registry import config_from_hf
from hyla.plan.costs import cache_bytes_per_token, param_split, state_bytes_per_seq
from hyla.plan.estimate import Workload, estimate, tpot_terms
from hyla.plan.gpus import GiB, gpu_spec
from hyla.plan.planner import plan
from tests.plan.full_configs import (
    DEEPSEEK_V32,
    KIMI_LINEAR_48B,
    QWEN3_NEXT_80B,
    deepseek_v32_fp8_bytes,
    deepseek_v32_params,
    kimi_params,
    qwen3_next_params,
)

FULL = {
    "kimi_linear_48b": (KIMI_LINEAR_48B, kimi_params),
    "deepseek_v32": (DEEPSEEK_V32, deepseek_v32_params),
    "qwen3_next_80b": (QWEN3_NEXT_80B, qwen3_next_params),
}

# (family, tp) -> (cache bytes per token, linear-state bytes per sequence), bf16 cache
HAND_CACHE = {
    # 7 MLA layers x (kv_lora 512 + rope 64) x 2 B; 20 KDA layers x (32 heads x 128 x 128 x 4 B
    # fp32 state + q,k,v conv channels 3 x 4096 x (kernel 4 - 1) x 2 B)
    ("kimi_linear_48b", 1): (7 * 576 * 2, 20 * (32 * 128 * 128 * 4 + 12288 * 3 * 2)),
    ("kimi_linear_48b", 8): (7 * 576 * 2, 20 * (4 * 128 * 128 * 4 + 1536 * 3 * 2)),
    # 61 DSA layers x (latent 576 + index key 128) x 2 B; no linear layers
    ("deepseek_v32", 1): (61 * 704 * 2, 0),
    ("deepseek_v32", 8): (61 * 704 * 2, 0),
    # 12 GQA layers x k,v x 2 kv heads x 256 x 2 B (1 kv head per rank at tp 8);
    # 36 GDN layers x (32 v heads x 128 x 128 x 4 B + conv (2x16x128 + 32x128) x 3 x 2 B)
    ("qwen3_next_80b", 1): (12 * 2 * 2 * 256 * 2, 36 * (32 * 128 * 128 * 4 + 8192 * 3 * 2)),
    ("qwen3_next_80b", 8): (12 * 2 * 1 * 256 * 2, 36 * (4 * 128 * 128 * 4 + 1024 * 3 * 2)),
}


def _config(name: str, **changes):
    return config_from_hf(FULL[name][0]).replace(**changes)


@pytest.mark.parametrize("name", list(FULL))
def test_parameter_split_matches_hand_count(name):
    split = param_split(_config(name))
    expected = FULL[name][1]()
    assert (split.embedding, split.experts, split.dense) == (
        expected["embedding"],
        expected["experts"],
        expected["dense"],
    )


def test_published_totals():
    """The hand counts themselves land on the published sizes (48B, 671B w/o MTP, 80B)."""
    totals = {n: sum(f[1]().values()) / 1e9 for n, f in FULL.items()}
    assert 48 < totals["kimi_linear_48b"] < 50
    assert 671 < totals["deepseek_v32"] < 672
    assert 79 < totals["qwen3_next_80b"] < 81


@pytest.mark.parametrize("name,tp", list(HAND_CACHE), ids=[f"{n}-tp{t}" for n, t in HAND_CACHE])
def test_cache_and_state_bytes_per_gpu(name, tp):
    config = _config(name, kv_cache_dtype="bfloat16")
    assert (cache_bytes_per_token(config, tp), state_bytes_per_seq(config, tp)) == HAND_CACHE[
        (name, tp)
    ]


def test_deepseek_fp8_on_8xh200_weights_and_concurrency(tmp_path):
    """DeepSeek-V3.2 as released (config.json's quantization_config: fp8 e4m3 128x128 blocks)
    is planned with fp8 weights without --dtype, TP8 x EP8 on 8 H200 at 128K with an fp8
    cache: the weights per GPU fit, with room for 8 sequences."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEEPSEEK_V32))
    work = Workload(num_gpus=8, context=131072, concurrency=64, weight_dtype="bfloat16")
    report = plan(path, gpu_spec("H200"), work, kv_cache_dtype="fp8")
    hand = deepseek_v32_fp8_bytes()
    split = report.split
    assert report.work.weight_dtype == "fp8"
    assert split.embedding_bytes == hand["embedding"]
    assert split.experts_bytes == hand["experts"]
    assert split.dense_bytes == hand["split"] + hand["replicated"]
    assert split.replicated_bytes == hand["replicated"]
    e = estimate(report.config, split, gpu_spec("H200"), report.work, tp=8, ep=8)
    weights = hand["replicated"] + (hand["embedding"] + hand["split"] + hand["experts"]) / 8
    assert e.weight_bytes == pytest.approx(weights, abs=8)
    assert 84e9 < weights < 88e9  # ~86 GB a GPU: fp8 projections, bf16 embedding and head
    free = int(140.4 * GiB * 0.9) - 2 * GiB - e.weight_bytes
    # fp8 latent (576) + index key (128) per token, each with its float32 scale
    assert e.cache_bytes_per_token == 61 * (704 + 2 * 4)
    per_seq = 61 * (704 + 2 * 4) * 131072
    assert e.free_bytes == free
    assert e.max_seqs == free // per_seq == 8  # dp = 1
    assert e.fits and e.binding.startswith("cache memory")
    # the engine shards fp8 checkpoints (128x128 blocks split whole at TP8): the plan ranks
    # TP8 layouts and its best one fits
    best = report.layouts[0]
    assert best.tp == 8 and best.fits and not report.refused


def test_qwen3_next_decode_memory_term_by_hand():
    """One H200, batch 1 at 4096 tokens: bytes of one decode step / 4.8 TB/s."""
    config = _config("qwen3_next_80b")
    p = qwen3_next_params()
    work = Workload(num_gpus=1, context=4096, concurrency=1, weight_dtype="bfloat16")
    terms = tpot_terms(config, param_split(config), gpu_spec("H200"), work, tp=1, ep=1, batch=1)
    head = 151936 * 2048  # lm_head (the embedding table is only gathered)
    experts = 48 * 10 * 3 * 2048 * 512  # 10 routed experts per layer for one token
    weights = (p["dense"] + head + experts) * 2
    cache = 12 * 4096 * 2 * 2 * 256 * 2
    state = 2 * 36 * (32 * 128 * 128 * 4 + 8192 * 3 * 2)  # read + written
    assert terms["memory"] == pytest.approx((weights + cache + state) / 4.8e12, rel=1e-9)
    assert terms["comm"] == 0.0


def test_layouts_ranked_and_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_NEXT_80B))
    work = Workload(num_gpus=8, context=262144, concurrency=64, weight_dtype="bfloat16")
    report = plan(path, gpu_spec("H200"), work)
    names = [(e.tp, e.ep) for e in report.layouts]
    # tp 1; tp 2, 4, 8 each without and with expert parallelism (EP runs inside the TP group)
    assert sorted(names) == [(1, 1), (2, 1), (2, 2), (4, 1), (4, 4), (8, 1), (8, 8)]
    assert not report.refused
    fitting = [e for e in report.layouts if e.fits and e.max_seqs >= 64]
    assert fitting and report.layouts[: len(fitting)] == tuple(fitting)
    speeds = [e.output_tokens_per_s for e in fitting]
    assert speeds == sorted(speeds, reverse=True)
    tp1 = next(e for e in report.layouts if (e.tp, e.ep) == (1, 1))
    # 159 GB of bf16 weights do not fit one 140 GiB H200
    assert not tp1.fits and tp1.binding.startswith("memory: weights")
    assert report.layouts[-1].fits is False


def test_cli_plan_prints_layouts_and_note(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(KIMI_LINEAR_48B))
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(
        app,
        [
            "plan",
            str(path),
            "--gpu",
            "H200",
            "--num-gpus",
            "8",
            "--context",
            "1048576",
            "--concurrency",
            "64",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "TP8 DP1 EP8" in result.output and "hyla serve accepts" in result.output
    data = json.loads(out.read_text())
    assert data["params"]["total"] == sum(kimi_params().values())
    assert data["layouts"][0]["fits"]


def test_cli_plan_unknown_gpu_is_an_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(KIMI_LINEAR_48B))
    result = CliRunner().invoke(app, ["plan", str(path), "--gpu", "Z9000"])
    assert result.exit_code == 2 and "gpu: unknown 'Z9000'" in result.output


@pytest.mark.parametrize(
    "dtype,label",
    [("float32", "989 TFLOP/s (bf16 peak, used for float32 weights)"),
     ("bfloat16", "989 TFLOP/s (bf16 peak)"), ("fp8", "1979 TFLOP/s (fp8 peak)")],
)  # fmt: skip
def test_cli_plan_names_the_peak_it_times_matmuls_at(tmp_path, dtype, label):
    """H200 dense peaks from NVIDIA's data sheet: 989 TFLOP/s bf16, 1979 fp8; there is no
    float32 rate in the table, so float32 weights must not be labelled as if there were."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(KIMI_LINEAR_48B))
    result = CliRunner().invoke(app, ["plan", str(path), "--gpu", "H200", "--dtype", dtype])
    assert result.exit_code == 0, result.output
    assert label in result.output, result.output


def test_a_float_weight_dtype_is_the_caches_too(tmp_path):
    """As the engine's --dtype: a config saved in float32 planned with bfloat16 weights keeps
    its cache in bfloat16 (half the bytes a token), unless --kv-cache-dtype says otherwise."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**KIMI_LINEAR_48B, "torch_dtype": "float32"}))

    def per_token(weight_dtype, **kw):
        work = Workload(num_gpus=1, context=4096, concurrency=1, weight_dtype=weight_dtype)
        return plan(path, gpu_spec("H200"), work, **kw).layouts[0].cache_bytes_per_token

    fp32 = per_token("float32")
    assert per_token("bfloat16") * 2 == fp32
    assert per_token("bfloat16", kv_cache_dtype="float32") == fp32
    assert per_token("fp8") == fp32  # fp8 weights: the model computes in the config's dtype
