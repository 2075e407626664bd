"""Qwen3.5-MoE's images through the engine (its vision tower is Qwen3.5's: the other image
paths are tested on qwen3_5 in test_images_engine.py). Oracle: transformers'
`Qwen3_5MoeForConditionalGeneration` greedy tokens and logprobs on the same images and prompt."""

from __future__ import annotations

import pytest

from tests.engine.engine_util import one_torch_thread
from tests.mm_tiny import random_images, save_mm_checkpoint
from tests.multimodal.test_images_engine import engine_of, hf_generate, prompt, run_one

FAMILY = "qwen3_5_moe"


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def test_image_requests_match_transformers(tmp_path):
    hf = save_mm_checkpoint(FAMILY, tmp_path)
    for sizes in ([(20, 28)], [(1, 1), (13, 40)]):
        images = random_images(sizes, seed=len(sizes))
        ids = prompt(FAMILY, len(sizes))
        out = run_one(engine_of(tmp_path), "a", ids, images)
        tokens, logprobs, num_prompt = hf_generate(FAMILY, hf, ids, images)
        assert len(out.prompt_token_ids) == num_prompt
        assert out.outputs[0].token_ids == tokens
        for top, token, want in zip(out.outputs[0].logprobs, tokens, logprobs, strict=True):
            assert abs(top[token] - want) <= 1e-4
