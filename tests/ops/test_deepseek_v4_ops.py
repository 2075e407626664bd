"""DeepSeek-V4's new ops (hyla/ops: kv_compress, sink_attention, rotary.pairs, linear.grouped,
moe's sqrt-softplus and hash routing, norm.rms_norm_unweighted, hyper_connection's head) against
the transformers modules of `modeling_deepseek_v4.py` with the same random weights (fp32).
Tolerance 1e-5 (fp32, sums in another order); expert and entry choices compared as sets."""

from __future__ import annotations

import pytest
import torch

from hyla.config import RopeConfig
from hyla.ops.hyper_connection import hc_collapse, hc_head_weights
from hyla.ops.kv_compress import compress_kv, compressed_indexer_topk
from hyla.ops.linear.grouped import grouped_linear
from hyla.ops.moe import route_hash, route_sqrt_softplus
from hyla.ops.norm import rms_norm, rms_norm_unweighted
from hyla.ops.rotary import apply_rope_pairs_tail, rope_cos_sin, rope_inv_freq
from tests.deepseek_v4_tiny import randomize, tiny_config

v4 = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
ATOL = 1e-5
T = 37  # 9 CSA windows of 4 (one token left over), 4 HCA windows of 8


@pytest.fixture(scope="module")
def config():
    return tiny_config()


def _hidden(seed: int = 0, width: int = 64) -> torch.Tensor:
    return torch.randn(1, T, width, generator=torch.Generator().manual_seed(seed))


def _cos_sin(config, kind: str, positions: torch.Tensor):
    """hyla's cos/sin for the rope of `kind` ("main" / "compress")."""
    params = config.rope_parameters[kind]
    rope = RopeConfig(theta=params["rope_theta"], rotary_dim=config.qk_rope_head_dim,
                      style="interleave")  # fmt: skip
    return rope_cos_sin(positions, *rope_inv_freq(rope))


def test_rope_pairs_tail_matches_transformers(config):
    x = torch.randn(1, 4, T, 32, generator=torch.Generator().manual_seed(1))  # [B, H, S, D]
    positions = torch.arange(T)[None]
    cos, sin = v4.DeepseekV4RotaryEmbedding(config)(x, positions, layer_type="compress")
    want = v4.apply_rotary_pos_emb(x, cos, sin)[0].transpose(0, 1)
    hcos, hsin = _cos_sin(config, "compress", torch.arange(T))
    torch.testing.assert_close(hcos, cos[0], atol=1e-6, rtol=0)
    got = apply_rope_pairs_tail(x[0].transpose(0, 1), hcos, hsin)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    back = apply_rope_pairs_tail(got, hcos, -hsin)  # the output's inverse rotation
    torch.testing.assert_close(back, x[0].transpose(0, 1), atol=ATOL, rtol=0)


def test_sqrt_softplus_and_hash_routing_match_transformers(config):
    torch.manual_seed(2)
    for cls in (v4.DeepseekV4TopKRouter, v4.DeepseekV4HashRouter):
        router = cls(config)
        randomize(router, 3)
        hidden = _hidden(4)
        ids = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(5))
        if cls is v4.DeepseekV4HashRouter:
            logits, want_w, want_i = router(hidden, ids)
            got_w, got_i = route_hash(logits, ids[0], router.tid2eid, config.routed_scaling_factor)
        else:
            logits, want_w, want_i = router(hidden)
            got_w, got_i = route_sqrt_softplus(logits, router.e_score_correction_bias,
                                               config.num_experts_per_tok,
                                               config.routed_scaling_factor)  # fmt: skip
        order_want, order_got = want_i.argsort(-1), got_i.argsort(-1)
        assert torch.equal(want_i.gather(1, order_want), got_i.gather(1, order_got)), cls
        torch.testing.assert_close(got_w.gather(1, order_got), want_w.gather(1, order_want),
                                   atol=ATOL, rtol=0)  # fmt: skip


def test_grouped_linear_unweighted_norm_and_hyper_head_match_transformers(config):
    torch.manual_seed(6)
    grouped = v4.DeepseekV4GroupedLinear(64, 32, 2)
    x = torch.randn(T, 2, 64)
    torch.testing.assert_close(grouped_linear(x, grouped.weight), grouped(x), atol=ATOL, rtol=0)
    norm = v4.DeepseekV4UnweightedRMSNorm(eps=1e-6)
    q = torch.randn(T, 4, 32) * 3
    torch.testing.assert_close(rms_norm_unweighted(q, 1e-6), norm(q), atol=ATOL, rtol=0)
    head = v4.DeepseekV4HyperHead(config)
    randomize(head, 7)
    streams = torch.randn(1, T, 3, 64)
    pre = hc_head_weights(streams[0], head.hc_fn, head.hc_base, head.hc_scale, config.hc_eps,
                          config.rms_norm_eps)  # fmt: skip
    torch.testing.assert_close(hc_collapse(streams[0], pre), head(streams)[0], atol=ATOL, rtol=0)


def _entries(module, hidden, config, ratio, overlap, head_dim):
    """hyla's compressed entries (compress_kv, the module's kv_norm, rope at w * m)."""
    x = hidden[0]
    pooled = compress_kv(module.kv_proj(x), module.gate_proj(x), module.position_bias, ratio,
                         overlap)  # fmt: skip
    normed = rms_norm(pooled, module.kv_norm.weight, config.rms_norm_eps)
    cos, sin = _cos_sin(config, "compress", torch.arange(pooled.shape[0]) * ratio)
    return apply_rope_pairs_tail(normed, cos, sin)


@pytest.mark.parametrize("kind", ["heavily_compressed_attention", "compressed_sparse_attention"])
def test_compressor_entries_and_selection_match_transformers(config, kind):
    torch.manual_seed(8)
    csa = kind == "compressed_sparse_attention"
    module = (v4.DeepseekV4CSACompressor if csa else v4.DeepseekV4HCACompressor)(config)
    randomize(module, 9)
    hidden, q_resid = _hidden(10), _hidden(11, config.q_lora_rank)
    positions = torch.arange(T)[None]
    with torch.no_grad():
        want_kv, want_bias = module(hidden, q_resid, positions, None, 0)
        ratio = config.compress_rates[kind]
        got = _entries(module, hidden, config, ratio, csa, config.head_dim)
        torch.testing.assert_close(got, want_kv[0, 0], atol=ATOL, rtol=0)
        if not csa:
            return
        idx = module.indexer
        keys = _entries(idx, hidden, config, ratio, True, config.index_head_dim)
        cos, sin = _cos_sin(config, "compress", torch.arange(T))
        q = idx.q_b_proj(q_resid[0]).view(T, config.index_n_heads, config.index_head_dim)
        q = apply_rope_pairs_tail(q, cos, sin)
        weights = idx.scorer.weights_proj(hidden[0]) * config.index_n_heads**-0.5
        topk = compressed_indexer_topk(q, weights, keys, torch.arange(T), ratio,
                                       config.index_topk, idx.scorer.softmax_scale)  # fmt: skip
    want_sets = [set(torch.nonzero(row == 0).flatten().tolist()) for row in want_bias[0, 0]]
    got_sets = [set(row[row >= 0].tolist()) for row in topk]
    assert got_sets == want_sets
    assert max(len(s) for s in got_sets) == config.index_topk  # the top-k bites
