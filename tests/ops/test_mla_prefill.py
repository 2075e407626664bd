"""`mla_prefill` off CUDA is its definition `mla_expanded`; its workspace plan; and the DSA
routing's premise: for sequences no longer than k, the sparse reference over the "every visible
token" selection (`dense_topk_indices`) is the expanded dense causal MLA."""

from __future__ import annotations

import torch

from hyla.ops.dsa_indexer.rows import dense_topk_indices
from hyla.ops.mla import mla_expanded, mla_prefill
from hyla.ops.mla.prefill import plan_groups
from hyla.ops.sparse_attention import reference as sparse_ref
from tests.ops.test_mla import _batch

SEQ_LENS, QUERY_LENS = [9, 14, 5, 1], [3, 14, 2, 1]


def test_off_cuda_it_is_the_reference() -> None:
    cache, tables, _, cu, q_nope, q_rope, kv_b = _batch(8, SEQ_LENS, QUERY_LENS)
    args = (q_nope, q_rope, cache, tables, cu, SEQ_LENS, kv_b, 0.3)
    got = mla_prefill(*args, query_lens=QUERY_LENS, workspace_bytes=1)
    assert torch.equal(got, mla_expanded(*args))


def test_plan_groups() -> None:
    # pages of 4, 1 byte per token: [9 -> 12, 14 -> 16, 5 -> 8, 1 -> 4] under caps 12, 16, 100
    assert plan_groups(SEQ_LENS, 4, 1, 12) == [(0, 1, True), (1, 2, False), (2, 4, True)]
    assert plan_groups(SEQ_LENS, 4, 1, 16) == [(0, 1, True), (1, 2, True), (2, 4, True)]
    assert plan_groups(SEQ_LENS, 4, 1, 100) == [(0, 4, True)]
    assert plan_groups([], 4, 1, 100) == []


def test_dense_selection_under_k_is_expanded_mla() -> None:
    topk = max(SEQ_LENS)
    cache, tables, _, cu, q_nope, q_rope, kv_b = _batch(8, SEQ_LENS, QUERY_LENS)
    indices = dense_topk_indices(cu, SEQ_LENS, topk, sum(QUERY_LENS))
    sparse = sparse_ref.sparse_mla(q_nope, q_rope, cache, tables, cu, indices, kv_b, 0.3)
    dense = mla_prefill(q_nope, q_rope, cache, tables, cu, SEQ_LENS, kv_b, 0.3)
    torch.testing.assert_close(dense, sparse, rtol=1e-5, atol=1e-6)
