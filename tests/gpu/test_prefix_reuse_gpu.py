"""Prefix reuse on a GPU, the engine as it runs by default on CUDA (fla chunk kernels, the
checkpoints inside a chunk from rounds of fla calls split at the boundaries, CUDA-graph decode,
async scheduling): two requests sharing S tokens reuse floor(S / 64) * 64 of them (S // 16 * 16
for deepseek_v32, which has no linear layers), and the next turn of a chat reuses all of the
previous turn but at most one block; outputs equal the same request on an engine with prefix
caching off (top-5 logprobs within 2e-3 and greedy ids identical up to a near tie:
`assert_close_completion`; the chunk kernels run TF32 and a hit chunks the prompt differently;
one of the 12 cases failed once under load with the exact comparison; its log was not kept).
Oracle of the checkpoint contents themselves: tests/gpu/test_state_boundaries_gpu.py (the fp32
recurrence on the CPU)."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.kda.kernels import fla_available
from hyla.request import SamplingParams
from tests.engine.engine_util import assert_close_completion, make_engine, prompt_ids, run_all

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(
        torch.cuda.is_available() and not fla_available(), reason="needs fla-core (and einops)"
    ),
]
FAMILIES = ["kimi_linear", "deepseek_v32", "qwen3_next"]
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=5)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from hyla.models.loader import load_model
    from tests.hf_tiny import save_tiny_hf_model

    loaded = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(family)
        save_tiny_hf_model(family, path, seed=0)
        loaded[family] = load_model(str(path), dtype="float32", device="cuda", progress=False)
    return loaded


def _cold(model, prompt: list[int]):
    engine = make_engine(model, device="cuda", enable_prefix_caching=False)
    engine.add_request("cold", prompt, PARAMS)
    return run_all(engine)["cold"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("budget", [48, 256])
def test_divergence_on_cuda(models, family, budget) -> None:
    model = models[family]
    granule = 16 if family == "deepseek_v32" else 64
    for shared in (64, 100, 130):
        base = prompt_ids(shared, seed=shared)
        a = base + prompt_ids(24, seed=1000 + shared)
        b = base + prompt_ids(7, seed=2000 + shared)
        engine = make_engine(
            model, device="cuda", state_checkpoint_stride=64, max_num_batched_tokens=budget
        )
        engine.add_request("a", a, PARAMS)
        run_all(engine)
        engine.add_request("b", b, PARAMS)
        out = run_all(engine)["b"]
        assert out.num_cached_tokens == shared // granule * granule, (shared, budget)
        assert_close_completion(out, _cold(model, b), atol=2e-3)


@pytest.mark.parametrize("family", FAMILIES)
def test_multi_turn_on_cuda(models, family) -> None:
    model = models[family]
    engine = make_engine(model, device="cuda", max_model_len=1024)
    prompt: list[int] = []
    previous = 0
    for turn, message in enumerate((20, 150, 300)):
        prompt = prompt + prompt_ids(message, seed=300 + turn)
        engine.add_request(f"t{turn}", prompt, PARAMS)
        out = run_all(engine)[f"t{turn}"]
        assert out.num_cached_tokens >= previous - 16, (turn, out.num_cached_tokens)
        assert_close_completion(out, _cold(model, prompt), atol=2e-3)
        prompt = prompt + out.outputs[0].token_ids
        previous = len(prompt) - 1
