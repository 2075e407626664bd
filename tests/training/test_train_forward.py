"""The training forward (hyla/training/forward.py) equals hyla's inference path on the same
weights: the batched chunked KDA against the token-by-token recurrence, and the whole model
against `SequenceRunner` (paged caches, state slots, the DSA indexer's top-k), in fp32."""

from __future__ import annotations

import pytest
import torch

from hyla.models.runner import SequenceRunner
from hyla.ops.kda import recurrent_kda
from hyla.training.forward import chunked_kda_batched, train_forward
from hyla.training.recipe import build_model, default_model_config


def test_chunked_kda_batched_matches_recurrence():
    torch.manual_seed(0)
    N, L, H, K, V = 2, 48, 2, 8, 8
    q = torch.randn(N, L, H, K)
    k = torch.nn.functional.normalize(torch.randn(N, L, H, K), dim=-1)
    v = torch.randn(N, L, H, V)
    g = -torch.rand(N, L, H, K) * 3
    beta = torch.rand(N, L, H)
    out = chunked_kda_batched(q, k, v, g, beta, chunk_size=16)
    cu = torch.tensor([0, L, 2 * L], dtype=torch.int32)
    flat = [t.reshape(N * L, *t.shape[2:]) for t in (q, k, v, g, beta)]
    ref, _ = recurrent_kda(*flat, cu, scale=1.0)
    torch.testing.assert_close(out.reshape(N * L, H, V), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length", [32, 96], ids=["dense_under_topk", "sparse_over_topk"])
def test_train_forward_matches_inference(length: int):
    config = default_model_config(vocab_size=512, eos_id=0).replace(dtype="float32")
    model = build_model(config, seed=0).eval()
    torch.manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (2, length))
    with torch.no_grad():
        hidden, aux = train_forward(model, ids, sparse=True)
        logits = model.compute_logits(hidden)
    runner = SequenceRunner(model, 2, length)
    ref = runner.step({0: ids[0].tolist(), 1: ids[1].tolist()}, all_logits=True)
    torch.testing.assert_close(logits[0], ref[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1], ref[1], atol=1e-4, rtol=1e-4)
    assert len(aux.indexer_kl) == 2 and len(aux.moe_balance) == 7
