"""Image requests on CUDA (tiny glm5_next and qwen3_5 checkpoints of tests.mm_tiny, fp32): the
engine's CUDA defaults (captured decode steps: Qwen3.5's shifted M-RoPE positions go through
the graphs' host positions; async output and scheduling) give the tokens of the same engine run
eagerly and synchronously, and the encoder cache is empty afterwards."""

from __future__ import annotations

import pytest

from hyla.engine.llm_engine import LLMEngine
from hyla.request import SamplingParams
from tests.engine.engine_util import run_all
from tests.mm_tiny import FAMILIES, IMAGE_IDS, cuda_marks, random_images, save_mm_checkpoint

pytestmark = cuda_marks()


@pytest.mark.parametrize("family", FAMILIES)
def test_image_requests_on_cuda_defaults_match_eager_synchronous(family, tmp_path):
    save_mm_checkpoint(family, tmp_path)
    image, start, end = IMAGE_IDS[family]
    jobs = {
        "one": ([5, 6, start, image, end, 7], random_images([(20, 28)], seed=1)),
        "two": ([8, start, image, end, 9, start, image, end], random_images([(8, 8), (33, 16)])),
        "text": ([5, 6, 7, 8, 9], []),
    }
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = []
    for opts in ({}, {"enforce_eager": True}):
        engine = LLMEngine.from_path(
            str(tmp_path), device="cuda", dtype="float32", max_model_len=512,
            max_num_batched_tokens=32, **opts,
        )  # fmt: skip
        for rid, (ids, images) in jobs.items():
            engine.add_request(rid, ids, params, multi_modal_data={"image": images})
        outs.append({r: o.outputs[0].token_ids for r, o in run_all(engine).items()})
        assert engine.get_stats().encoder_cache_entries == 0
    assert outs[0] == outs[1]
