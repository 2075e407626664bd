"""KV offload on CUDA (issue 37): the host and disk tiers' copies (`TierIO`: its own stream,
pinned host buffers) bring blocks and state rows back bit for bit, and an engine serving a
prefix from the host tier after eviction answers as a cold engine does (within the GPU
prefix-reuse tolerance: tests/gpu/test_prefix_reuse_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.kda.kernels import fla_available
from hyla.request import SamplingParams
from tests.engine.engine_util import assert_close_completion, make_engine, prompt_ids, run_all
from tests.engine.test_kv_offload_io import round_trip

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=5)


@pytest.mark.parametrize("kind", ["host", "disk"])
def test_round_trip_is_bit_exact(kind, tmp_path):
    round_trip(torch.device("cuda"), kind, tmp_path)


@pytest.mark.skipif(torch.cuda.is_available() and not fla_available(), reason="needs fla-core")
@pytest.mark.parametrize("family", ["kimi_linear", "deepseek_v32"])
def test_host_tier_hit_after_eviction_matches_cold(family, tmp_path):
    from tests.engine.engine_util import load, save_checkpoint

    save_checkpoint(family, tmp_path)
    model = load(tmp_path).cuda()
    opts = dict(device="cuda", num_blocks=40, state_checkpoint_stride=32,
                prefix_checkpoint_policy="all", max_num_batched_tokens=512)  # fmt: skip
    doc = prompt_ids(200, seed=37)
    query = doc + prompt_ids(20, seed=38)
    engine = make_engine(model, kv_offload_host_gib=0.05, **opts)
    for rid, ids in [("doc", doc)] + [(f"f{k}", prompt_ids(300, seed=900 + k)) for k in range(3)]:
        engine.add_request(rid, ids, PARAMS)
        run_all(engine)
    engine.add_request("query", query, PARAMS)
    out = run_all(engine)["query"]
    assert out.num_cached_tokens >= 192 and engine.cache.tiers.stats.num_loads == 1
    cold = make_engine(model, enable_prefix_caching=False, **opts)
    cold.add_request("cold", query, PARAMS)
    assert_close_completion(out, run_all(cold)["cold"], atol=2e-3)
