"""Engine greedy output == transformers `generate` greedy output, per family.

Oracle: the `transformers` model of the family (fp32, eager), `generate(do_sample=False)` with
EOS disabled, one prompt at a time. hyla runs all prompts together through its own loader,
scheduler (chunked prefill under a small token budget), paged cache and state slots.
"""

from __future__ import annotations

import pytest
import torch

from hyla.request import SamplingParams
from tests.engine.engine_util import (
    load,
    make_engine,
    one_torch_thread,
    prompt_ids,
    run_all,
    save_checkpoint,
)
from tests.hf_tiny import FAMILIES

PROMPT_LENS = (1, 7, 33, 70)
NUM_NEW = 10


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_greedy_matches_transformers_generate(family, tmp_path):
    hf = save_checkpoint(family, tmp_path)
    hf.generation_config.eos_token_id = None
    engine = make_engine(load(tmp_path), tmp_path, max_num_batched_tokens=24, block_size=8)
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True)
    prompts = {f"p{n}": prompt_ids(n, seed=n) for n in PROMPT_LENS}
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, params)
    outs = run_all(engine)
    for rid, ids in prompts.items():
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([ids]), max_new_tokens=NUM_NEW, do_sample=False, pad_token_id=0
            )
        assert outs[rid].outputs[0].token_ids == ref[0, len(ids) :].tolist(), rid
        assert outs[rid].outputs[0].finish_reason == "length"
