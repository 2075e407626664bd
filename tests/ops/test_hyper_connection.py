"""Hyper-connection mixing (`hyla.ops.hyper_connection`) against transformers'
`Glm5NextTextHyperConnection` (weights, collapse) and its decoder layer's expansion formula,
with random parameters; and Sinkhorn's doubly-stochastic result."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.hyper_connection import hc_collapse, hc_expand, hc_weights, sinkhorn


@pytest.mark.parametrize("hc_mult", [2, 4])
def test_matches_transformers_hyper_connection(hc_mult: int):
    from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextHyperConnection

    cfg = Glm5NextTextConfig(hidden_size=32, hc_mult=hc_mult, num_hidden_layers=1,
                             hc_sinkhorn_iters=7, rms_norm_eps=1e-6)  # fmt: skip
    torch.manual_seed(hc_mult)
    ref = Glm5NextTextHyperConnection(cfg)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape) * (0.3 if p.dim() == 2 else 1.0))
    streams = torch.randn(1, 5, hc_mult, 32)
    with torch.no_grad():
        post_ref, comb_ref, x_ref = ref(streams)
        out = torch.randn(1, 5, 32)
        next_ref = post_ref.unsqueeze(-1) * out.unsqueeze(-2) + comb_ref.transpose(-1, -2) @ streams
    pre, post, comb = hc_weights(streams[0], ref.fn, ref.base, ref.scale, cfg.hc_eps, 7, 1e-6)
    torch.testing.assert_close(post, post_ref[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(comb, comb_ref[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(hc_collapse(streams[0], pre), x_ref[0], rtol=1e-6, atol=1e-6)
    nxt = hc_expand(out[0], streams[0], post, comb)
    torch.testing.assert_close(nxt, next_ref[0], rtol=1e-6, atol=1e-6)


def test_sinkhorn_is_doubly_stochastic():
    comb = torch.rand(6, 4, 4) + 0.01
    out = sinkhorn(comb, 50, 1e-9)
    torch.testing.assert_close(out.sum(-1), torch.ones(6, 4), rtol=0, atol=1e-5)
    torch.testing.assert_close(out.sum(-2), torch.ones(6, 4), rtol=0, atol=1e-5)
