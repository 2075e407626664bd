"""The pooled DSA indexer (`hyla.ops.kpool_indexer`) against transformers'
`Glm5NextTextIndexer` with the same random weights: for every query row, the set of selected
token positions (pools expanded, plus the tail) is the same. hyla writes its paged caches chunk
by chunk under shuffled blocks (pools completed across chunk and block boundaries, pool keys
read back, never recomputed); transformers scores the whole sequence at once."""

from __future__ import annotations

import random

import pytest
import torch

from hyla.config import DSAConfig, MLAConfig, ModelConfig
from hyla.layers.pooled_sparse_attention import KPoolIndexer
from hyla.ops.kpool_indexer import compress_pools, kpool_indexer_topk, write_pool_keys
from hyla.ops.paged import write_paged

D, RQ, HI, DI, BLOCK = 32, 12, 16, 8, 4


def _hf_indexer(kpool: int, topk: int, tail: bool):
    from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextIndexer

    cfg = Glm5NextTextConfig(hidden_size=D, q_lora_rank=RQ, index_n_heads=HI, index_head_dim=DI,
                             index_topk=topk, index_kpool=kpool, num_hidden_layers=1,
                             index_kpool_always_select_tail=tail)  # fmt: skip
    torch.manual_seed(kpool + topk)
    ref = Glm5NextTextIndexer(cfg, 0)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape) * 0.5)
    return ref


def _hyla_indexer(ref, kpool: int, topk: int) -> KPoolIndexer:
    mla = MLAConfig(num_heads=2, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=0,
                    v_head_dim=8, q_lora_rank=RQ, use_rope=False)  # fmt: skip
    dsa = DSAConfig(index_n_heads=HI, index_head_dim=DI, index_topk=topk, index_kpool=kpool)
    cfg = ModelConfig(vocab_size=8, hidden_size=D, intermediate_size=8, layer_pattern=("dsa",),
                      ffn_pattern=("dense",), mla=mla, dsa=dsa)  # fmt: skip
    ours = KPoolIndexer(cfg)
    ours.load_state_dict(ref.state_dict())
    return ours


@pytest.mark.parametrize(
    ("kpool", "topk", "tail", "chunks"),
    [(4, 8, True, [37]), (4, 8, True, [5, 1, 1, 6, 3, 1, 20]), (3, 6, True, [2, 9, 1, 1, 19]),
     (4, 8, False, [11, 1, 25]), (1, 4, True, [3, 30]), (5, 10, True, [1] * 12 + [18])],
)  # fmt: skip
@torch.no_grad()
def test_selection_matches_transformers(kpool, topk, tail, chunks):
    length = sum(chunks)
    ref = _hf_indexer(kpool, topk, tail)
    ours = _hyla_indexer(ref, kpool, topk)
    gen = torch.Generator().manual_seed(7)
    x, q_resid = torch.randn(length, D, generator=gen), torch.randn(length, RQ, generator=gen)
    want = ref(x[None], q_resid[None], torch.ones(1, length, dtype=torch.bool), None)[0]

    num_blocks = (length + BLOCK - 1) // BLOCK
    blocks = list(range(1, num_blocks + 1))
    random.Random(0).shuffle(blocks)
    table = torch.tensor([blocks], dtype=torch.int32)
    caches = [torch.full((num_blocks + 1, BLOCK, DI), float("nan")) for _ in range(3)]
    start = 0
    for n in chunks:
        rows = slice(start, start + n)
        slots = torch.tensor([blocks[p // BLOCK] * BLOCK + p % BLOCK
                              for p in range(start, start + n)])  # fmt: skip
        cu, lens = torch.tensor([0, n], dtype=torch.int32), torch.tensor([start + n])
        q, w, k = ours(x[rows], q_resid[rows], None)
        write_paged(caches[0], slots, k)
        write_paged(caches[1], slots, ours.gate_scores(x[rows]))
        write_pool_keys(*caches, ours.index_kpool_compress_ape, table, cu, lens, slots)
        got = kpool_indexer_topk(q, w, caches[2], table, cu, lens, start + n, topk, kpool,
                                 tail, ours.softmax_scale)  # fmt: skip
        for j in range(n):
            t = start + j
            mine = sorted(s for s in got[j].tolist() if s >= 0)
            theirs = sorted(s for s in want[t].tolist() if s >= 0)
            assert mine == theirs, (t, mine, theirs)
            assert len(set(mine)) == len(mine)
        start += n


def test_compress_pools_is_a_per_channel_softmax_average():
    keys, gates, ape = torch.randn(3, 4, 5), torch.randn(3, 4, 5), torch.randn(4, 5)
    got = compress_pools(keys, gates, ape)
    for n in range(3):
        for c in range(5):
            w = torch.softmax(gates[n, :, c] + ape[:, c], dim=0)
            assert torch.allclose(got[n, c], (w * keys[n, :, c]).sum(), atol=1e-6)


def test_scoring_in_row_chunks_gives_the_same_selection(monkeypatch):
    from hyla.ops.kpool_indexer import reference

    gen = torch.Generator().manual_seed(3)
    cache = torch.randn(9, BLOCK, DI, generator=gen)
    table = torch.tensor([[3, 1, 4, 2], [5, 8, 7, 6]], dtype=torch.int32)
    cu, lens = torch.tensor([0, 7, 10], dtype=torch.int32), torch.tensor([16, 13])
    q, w = torch.randn(10, HI, DI, generator=gen), torch.randn(10, HI, generator=gen)
    args = (q, w, cache, table, cu, lens, 16, 8, 4, True, DI**-0.5)
    whole = kpool_indexer_topk(*args)
    monkeypatch.setattr(reference, "SCORE_ELEMENTS", 1)  # one row per chunk
    assert torch.equal(kpool_indexer_topk(*args), whole)


@pytest.mark.parametrize("case", ["decode", "prefill", "kpool3", "few_pools"])
@pytest.mark.parametrize("tail", [True, False], ids=["tail", "no_tail"])
def test_selection_is_valid_by_construction(case, tail):
    """What `sparse_mla(..., valid_selection=True)` relies on: every row's selection holds
    distinct positions within 0 .. the row's own, i.e. `valid_topk_indices` leaves its set
    unchanged."""
    from hyla.ops.dsa_indexer.rows import row_positions
    from hyla.ops.sparse_attention import valid_topk_indices
    from tests.gpu.test_kpool_indexer_gpu import CASES, DI, PagedSetup

    seq_lens, new_tokens, kpool, topk = CASES[case]
    s = PagedSetup(seq_lens, new_tokens, kpool, torch.float32, "cpu", seed=3)
    sel = kpool_indexer_topk(s.q, s.w, s.pool_keys, s.block_tables, s.cu_seqlens, s.lens,
                             max(seq_lens) + 3, topk, kpool, tail, DI**-0.5)  # fmt: skip
    _, row_pos = row_positions(s.cu_seqlens, s.lens, sel.shape[0])
    safe = valid_topk_indices(sel, s.cu_seqlens, s.lens)
    for row, pos, safe_row in zip(sel.tolist(), row_pos.tolist(), safe.tolist(), strict=True):
        kept = [p for p in row if p >= 0]
        assert len(kept) == len(set(kept)) and all(p <= pos for p in kept)
        assert sorted(kept) == sorted(p for p in safe_row if p >= 0)
        assert kept or not tail  # with the tail a row always sees its own token
