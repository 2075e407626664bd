"""Speculative decoding on a GPU (fla chunk kernels writing the per-position states of a verify
chunk in rounds of calls split at them, CUDA-graph decode between verify steps): greedy outputs
with oracle drafts (tests/engine/test_spec_decode.py: full, partial and zero acceptance) equal
drafts off, up to a near tie (`assert_close_completion`: the chunk kernels run TF32), with a
prefix-cache hit and an abort in the mix; every block and slot free after."""

from __future__ import annotations

import pytest
import torch

import hyla.spec.decoder
from hyla.ops.kda.kernels import fla_available
from tests.engine.engine_util import assert_close_completion, make_engine
from tests.engine.test_spec_decode import SPEC, OracleDrafts, run, scenario

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(
        torch.cuda.is_available() and not fla_available(), reason="needs fla-core (and einops)"
    ),
]
FAMILIES = ["kimi_linear", "deepseek_v32", "qwen3_next"]


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


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_drafts_off_on_cuda(models, monkeypatch, family) -> None:
    model = models[family]
    arrivals, aborts = scenario(model.config.vocab_size)
    kw = dict(device="cuda", block_size=16, max_num_batched_tokens=16,
              enable_prefix_caching=True, prefix_checkpoint_policy="all")  # fmt: skip
    want = run(make_engine(model, **kw), {s: dict(r) for s, r in arrivals.items()})
    reference = {tuple(p): want[r].outputs[0].token_ids for a in arrivals.values()
                 for r, p in a.items()}  # fmt: skip
    monkeypatch.setattr(hyla.spec.decoder, "propose_ngram",
                        OracleDrafts(reference, model.config.vocab_size))  # fmt: skip
    engine = make_engine(model, speculative_config=SPEC, **kw)
    got = run(engine, arrivals, aborts)
    for rid in ("r0", "r2", "r3"):
        assert_close_completion(got[rid], want[rid], atol=2e-3)
    assert engine.get_stats().spec_decode_num_accepted_tokens > 0
