"""`mla_paged` (lengths on the device, a host bound): every packed row, decode or prefill, equals
the per-head SDPA oracle over its causal context, and equals `mla_absorbed_batched` (host
lengths); a larger bound, NaN-poisoned invisible slots and an int64 length tensor change nothing.
"""

from __future__ import annotations

import pytest
import torch

from hyla.ops.mla import mla_absorbed_batched, mla_paged
from tests.ops.test_mla import BLOCK, DN, DV, H, R, _oracle, _paged_latents

DR = 8


def _case(seq_lens: list[int], query_lens: list[int], bound: int, seed: int = 0):
    torch.manual_seed(seed)
    cache, tables, dense = _paged_latents(seq_lens, R + DR, seed)
    width = -(-bound // BLOCK)
    tables = torch.nn.functional.pad(tables, (0, width - tables.shape[1]))  # block 0: NaN
    T = sum(query_lens)
    q_nope, q_rope = torch.randn(T, H, DN), torch.randn(T, H, DR)
    kv_b = torch.randn(H * (DN + DV), R) * 0.2
    cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    return cache, tables, dense, q_nope, q_rope, kv_b, cu


@pytest.mark.parametrize("bound_extra", [0, 37])
def test_rows_match_the_oracle_and_the_batched_absorbed_form(bound_extra):
    seq_lens, query_lens = [9, 1, 14, 5], [1, 1, 6, 5]  # decode, decode, prefill chunk, prompt
    bound = max(seq_lens) + bound_extra
    cache, tables, dense, q_nope, q_rope, kv_b, cu = _case(seq_lens, query_lens, bound)
    scale = (DN + DR) ** -0.5
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    out = mla_paged(q_nope, q_rope, cache, tables, cu, lens, bound, kv_b, scale)
    assert torch.isfinite(out).all()
    start = 0
    for q, lat in zip(query_lens, dense, strict=True):
        rows = slice(start, start + q)
        want = _oracle(q_nope[rows], q_rope[rows], lat, kv_b, scale)
        torch.testing.assert_close(out[rows], want, rtol=1e-4, atol=1e-5)
        start += q
    batched = mla_absorbed_batched(q_nope, q_rope, cache, tables, cu, seq_lens, kv_b, scale)
    torch.testing.assert_close(out, batched, rtol=1e-5, atol=1e-6)
    out64 = mla_paged(q_nope, q_rope, cache, tables, cu, lens.long(), bound, kv_b, scale)
    torch.testing.assert_close(out64, out, rtol=0, atol=0)


def test_one_token_sequences_see_only_their_first_slot():
    seq_lens, query_lens = [1, 1], [1, 1]
    cache, tables, dense, q_nope, q_rope, kv_b, cu = _case(seq_lens, query_lens, 64)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    out = mla_paged(q_nope, q_rope, cache, tables, cu, lens, 64, kv_b, 0.3)
    w_uv = kv_b.view(H, DN + DV, R)[:, DN:]  # one visible token: softmax weight 1
    want = torch.stack([torch.einsum("r,hvr->hv", lat[0, :R], w_uv) for lat in dense])
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
