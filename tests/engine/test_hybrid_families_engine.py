"""GLM-5.3-Flash (`glm5_next`), Qwen3.5 (`qwen3_5`), Qwen3.5-MoE (`qwen3_5_moe`), GLM-5
(`glm_moe_dsa`) and DeepSeek-V4 (`deepseek_v4`) through hyla's engine: greedy output ==
transformers `generate`,
and a batch == solo runs (I3).

Oracles: transformers' model (fp32, eager, `generate(do_sample=False)`, EOS off, one prompt at a
time) and a solo run of the same request in an idle engine. hyla runs the prompts together
through its loader, scheduler (chunked prefill under a small token budget), paged cache and
state slots; every block and slot is free afterwards (I4).
"""

from __future__ import annotations

import pytest
import torch

from hyla.request import SamplingParams
from tests.deepseek_v4_tiny import save_tiny_deepseek_v4
from tests.engine.engine_util import (
    assert_all_free,
    assert_same_completion,
    load,
    make_engine,
    one_torch_thread,
    prompt_ids,
    run_all,
    solo,
)
from tests.engine.tiny_tokenizer import build_tokenizer
from tests.glm_moe_dsa_tiny import save_tiny_glm_moe_dsa
from tests.glm_tiny import save_tiny_glm
from tests.qwen35_moe_tiny import save_tiny_qwen35_moe
from tests.qwen35_tiny import save_tiny_qwen35

PROMPT_LENS = (1, 6, 23, 41)
NUM_NEW = 32


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


SAVERS = {"glm5_next": save_tiny_glm, "qwen3_5": save_tiny_qwen35,
          "qwen3_5_moe": save_tiny_qwen35_moe, "glm_moe_dsa": save_tiny_glm_moe_dsa,
          "deepseek_v4": save_tiny_deepseek_v4}  # fmt: skip
# every layer attention-like (deepseek_v4's windows are pooled from per-token entries): a hit
# needs blocks only
STATELESS = {"glm_moe_dsa", "deepseek_v4"}


@pytest.fixture(scope="module", params=sorted(SAVERS))
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"{request.param}_engine")
    hf = SAVERS[request.param](path, seed=0)
    build_tokenizer().save_pretrained(path)
    return hf, path, request.param


def test_engine_greedy_matches_transformers_generate(checkpoint):
    hf, path, _ = checkpoint
    engine = make_engine(load(path), path, max_num_batched_tokens=16, block_size=8)
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True)
    prompts = {f"p{n}": prompt_ids(n, seed=n) for n in PROMPT_LENS}
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, params)
    outs = run_all(engine)
    for rid, ids in prompts.items():
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([ids]), max_new_tokens=NUM_NEW, do_sample=False, pad_token_id=0,
                eos_token_id=None,
            )  # fmt: skip
        assert outs[rid].outputs[0].token_ids == ref[0, len(ids) :].tolist(), rid
    assert_all_free(engine)


def test_batch_equals_solo_runs(checkpoint):
    _, path, _ = checkpoint
    engine = make_engine(load(path), path, max_num_batched_tokens=24, block_size=8)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3)
    prompts = {f"p{n}": prompt_ids(n, seed=100 + n) for n in (2, 9, 30)}
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, params)
    batched = run_all(engine)
    for rid, ids in prompts.items():
        assert_same_completion(batched[rid], solo(engine, ids, params))
    assert_all_free(engine)


def test_prefix_hit_equals_cold_run(checkpoint):
    """I2: a prompt sharing a cached prefix (blocks of 6, linear-state checkpoints every 18
    tokens; glm5_next's pools of 4 straddle blocks; glm_moe_dsa, stateless, hits every block)
    gives the cold run's tokens and logprobs."""
    _, path, family = checkpoint
    unit = 6 if family in STATELESS else 18
    model = load(path)
    engine = make_engine(model, path, block_size=6, state_checkpoint_stride=18,
                         max_num_batched_tokens=12)  # fmt: skip
    base = prompt_ids(60, seed=9)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3)
    run_all_one(engine, "base", base, params)
    for n in (17, 19, 37, 55):
        ids = base[:n] + prompt_ids(5, seed=900 + n)
        out = run_all_one(engine, f"s{n}", ids, params)
        assert out.num_cached_tokens == n // unit * unit, n
        cold = make_engine(model, path, block_size=6, state_checkpoint_stride=18,
                           enable_prefix_caching=False)  # fmt: skip
        assert_same_completion(out, run_all_one(cold, "cold", ids, params))
    assert_all_free(engine)


def run_all_one(engine, rid, ids, params):
    engine.add_request(rid, ids, params)
    return run_all(engine)[rid]


def test_static_decode_steps_match_plain_steps(checkpoint):
    """Decode in static shapes (a captured CUDA graph's inputs, run eagerly here: padded batch
    bucket, context bucket 256 above the true lengths, lengths only on the device) gives the
    plain steps' tokens and logprobs."""
    from hyla.engine.cuda_graphs import DecodeGraphs

    _, path, _ = checkpoint
    model = load(path)
    prompts = [prompt_ids(n, seed=n) for n in (5, 23, 40)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)
    outputs = []
    for static in (False, True):
        engine = make_engine(model)
        if static:
            runner = engine.runner
            runner.graphs = DecodeGraphs(
                model, runner.caches, runner.block_size, (1, 2, 4), capture=False
            )
        for i, p in enumerate(prompts):
            engine.add_request(str(i), p, params)
        outputs.append(run_all(engine))
        if static:
            assert {size for size, _ in runner.graphs.steps} >= {4}  # 3 rows padded to 4
    for rid in outputs[0]:
        assert_same_completion(outputs[0][rid], outputs[1][rid], atol=1e-4)
