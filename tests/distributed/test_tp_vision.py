"""Image requests under tensor (and expert) parallelism on the CPU (gloo), both multimodal
families: the vision tower runs on rank 0 and its rows reach every rank in the step plan.

Oracle: the same checkpoint (`tests.mm_tiny`: tiny glm5_next and qwen3_5 with their image
processors) served by the plain engine (TP=1) in the same test: two image requests at once
(one with two images, prefilled in chunks through the images, and one with another image)
and a repeat of the first (a
prefix hit through its image). Greedy tokens identical, sampled logprobs within 1e-5 (fp32).
"""

from __future__ import annotations

import pytest

from hyla.engine.llm_engine import LLMEngine
from hyla.request import SamplingParams
from tests.engine.engine_util import run_all
from tests.mm_tiny import IMAGE_IDS, random_images, save_mm_checkpoint

PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
OPTIONS = dict(device="cpu", dtype="float32", max_model_len=512, block_size=8,
               max_num_batched_tokens=64, max_num_encoder_input_tokens=256)  # fmt: skip


def _prompt(family: str, num_images: int) -> list[int]:
    image, start, end = IMAGE_IDS[family]
    return [5, 6] + [start, image, end, 11] * num_images + [7, 9, 10]


def _run(path, family: str, **overrides):
    eng = LLMEngine.from_path(str(path), **{**OPTIONS, **overrides})
    try:
        one, two = random_images([(20, 28)], seed=1), random_images([(12, 16), (16, 24)], seed=2)
        eng.add_request("a", _prompt(family, 1), PARAMS, multi_modal_data={"image": one})
        eng.add_request("b", _prompt(family, 2), PARAMS, multi_modal_data={"image": two})
        other = random_images([(20, 28)], seed=3)  # "a"'s prompt with another image
        eng.add_request("d", _prompt(family, 1), PARAMS, multi_modal_data={"image": other})
        assert eng.multimodal is not None
        first = run_all(eng)
        eng.add_request("c", _prompt(family, 1), PARAMS, multi_modal_data={"image": one})
        outs = {**first, **run_all(eng)}
        hits = eng.get_stats().prefix_cache_hit_tokens
    finally:
        eng.shutdown()
    return {r: o.outputs[0] for r, o in outs.items()}, hits


@pytest.mark.parametrize("family", ["glm5_next", "qwen3_5"])
def test_image_requests_under_tp2_match_tp1(family, tmp_path):
    path = tmp_path / family
    save_mm_checkpoint(family, path)
    want, want_hits = _run(path, family)
    got, hits = _run(path, family, tensor_parallel_size=2, enable_expert_parallel=False)
    assert want_hits > 0 and hits == want_hits
    assert want["a"].logprobs != want["d"].logprobs  # the image reaches the logits
    for rid in "abcd":
        assert got[rid].token_ids == want[rid].token_ids, rid
        for a, b in zip(want[rid].logprobs, got[rid].logprobs, strict=True):
            assert a.keys() == b.keys()
            assert all(abs(_v(a[t]) - _v(b[t])) <= 1e-5 for t in a)


def _v(entry) -> float:
    return entry if isinstance(entry, float) else entry.logprob
