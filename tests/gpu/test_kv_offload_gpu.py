"""KV offload on CUDA (issue 37): the host and disk tiers' copies (`TierIO`: its own stream,
pinned host buffers) bring blocks and state rows back bit for bit, and an engine serving a
prefix from the host tier after eviction answers as a cold engine does (within the GPU
prefix-reuse tolerance: tests/gpu/test_prefix_reuse_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from hyla.cache.tiers import DiskTier, HostTier, Transfers
from hyla.engine.kv_offload import TierIO
from hyla.ops.kda.kernels import fla_available
from hyla.request import SamplingParams
from tests.engine.engine_util import assert_close_completion, make_engine, prompt_ids, run_all

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=5)


@pytest.mark.parametrize("kind", ["host", "disk"])
def test_round_trip_is_bit_exact(kind, tmp_path):
    dev = torch.device("cuda")
    tokens = [torch.randn(9, 16, 64, device=dev, dtype=torch.bfloat16) for _ in range(3)]
    tokens.append(torch.randn(9, 16, 8, device=dev).to(torch.float8_e4m3fn))
    states = [torch.randn(6, 4, 8, 8, device=dev) for _ in range(2)]
    tier = HostTier(1 << 30) if kind == "host" else DiskTier(tmp_path, 1 << 30)
    io = TierIO(tokens, states, 2, [tier])
    keys = [bytes([k]) * 4 for k in range(5)]
    io(Transfers(spill_blocks=[(1, keys[0]), (2, keys[1]), (3, keys[2])],
                 spill_checkpoints=[(0, keys[3]), (1, keys[4])]))  # fmt: skip
    io(Transfers())  # the byte tiers are written from the last call's copies
    want = [t[1:4].clone() for t in tokens], [s[2:4].clone() for s in states]
    for t in tokens + states:
        t.view(torch.uint8).zero_()
    b = tier.holds_bytes
    io(Transfers(
        load_blocks=[(r, tier.get(k), b) for r, k in zip((4, 5, 6), keys[:3], strict=True)],
        load_checkpoints=[(c, tier.get(k), b) for c, k in zip((2, 3), keys[3:], strict=True)],
    ))  # fmt: skip
    torch.cuda.synchronize()
    for t, w in zip(tokens, want[0], strict=True):
        assert torch.equal(t[4:7].view(torch.uint8), w.view(torch.uint8))
    for s, w in zip(states, want[1], strict=True):
        assert torch.equal(s[4:6], w)


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
