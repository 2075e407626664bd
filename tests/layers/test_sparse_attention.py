"""DSAttention (MLA + lightning indexer + top-k sparse MLA) over the paged cache vs the
transformers DeepseekV32Attention with the same weights, and reference case C03 (sparse attention
at and around the top-k boundary). Caches are NaN-poisoned, blocks shuffled."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn
from transformers import DeepseekV3Config, DeepseekV32Config
from transformers.masking_utils import create_causal_mask
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_v3
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf_v32

import hyla.layers.sparse_attention as sparse_mod
from hyla.attention_metadata import AttentionMetadata
from hyla.config import DSAConfig, MLAConfig, ModelConfig, RopeConfig
from hyla.forward_batch import build_forward_batch
from hyla.layers.attention import MLAttention
from hyla.layers.sparse_attention import DSAttention
from hyla.ops.paged import write_paged
from tests.paged_steps import PagedSteps

D, BLOCK, TOPK = 64, 4, 8
HI, DI = 8, 16
TOL = {"rtol": 1e-5, "atol": 1e-5}
YARN = {"factor": 8.0, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 16}
MLA_DIMS = dict(
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=24,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=12,
    hidden_size=D,
    num_hidden_layers=1,
    max_position_embeddings=128,
    rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, **YARN},
)
CONFIG = ModelConfig(
    vocab_size=32,
    hidden_size=D,
    intermediate_size=64,
    layer_pattern=("dsa",),
    ffn_pattern=("dense",),
    mla=MLAConfig(4, 16, 16, 8, 12, q_lora_rank=24),
    dsa=DSAConfig(HI, DI, TOPK),
    rope=RopeConfig(1e4, 8, "interleave", "yarn", tuple(YARN.items())),
)


def _hf_modules():
    cfg = DeepseekV32Config(index_n_heads=HI, index_head_dim=DI, index_topk=TOPK, **MLA_DIMS)
    cfg._attn_implementation = "eager"
    hf = hf_v32.DeepseekV32Attention(cfg, 0)
    gen = torch.Generator().manual_seed(7)
    for name, p in hf.named_parameters():
        noise = torch.randn(p.shape, generator=gen)
        is_norm_weight = "norm" in name and name.endswith("weight")
        p.data.copy_(1.0 + 0.2 * noise if is_norm_weight else noise / p.shape[-1] ** 0.5)
    v3_cfg = DeepseekV3Config(**MLA_DIMS)
    v3_cfg._attn_implementation = "eager"
    dense = hf_v3.DeepseekV3Attention(v3_cfg, 0)
    dense.load_state_dict({k: v for k, v in hf.state_dict().items() if "indexer" not in k})
    return cfg, hf, dense, hf_v32.DeepseekV32RotaryEmbedding(cfg)


HF_CFG, HF, HF_DENSE, HF_ROTARY = _hf_modules()


def _layers() -> tuple[DSAttention, MLAttention]:
    layer = DSAttention(CONFIG, 0)
    layer.load_state_dict(HF.state_dict(), strict=True)
    mla = MLAttention(CONFIG.replace(layer_pattern=("mla",), dsa=None), 0)
    mla.load_state_dict({k: v for k, v in HF.state_dict().items() if "indexer" not in k})
    return layer, mla


def _x(length: int, seed: int) -> torch.Tensor:
    return torch.randn(length, D, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _hf_forward(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """DeepseekV32Attention on one sequence; with `mask` [L, L] bool, the plain MLA
    (DeepseekV3Attention, same weights) under that explicit mask instead."""
    pos = torch.arange(x.shape[0])[None]
    causal = create_causal_mask(
        HF_CFG, x[None], None, None, position_ids=pos, allow_is_causal_skip=False
    )
    emb = HF_ROTARY(x[None], pos)
    if mask is None:
        return HF(x[None], emb, causal, position_ids=pos)[0][0]
    additive = torch.zeros(1, 1, *mask.shape).masked_fill(~mask, torch.finfo(x.dtype).min)
    return HF_DENSE(x[None], emb, additive)[0][0]


@torch.no_grad()
def _oracle_index_scores(x: torch.Tensor) -> torch.Tensor:
    """[L, L] float64 lightning-indexer scores from the HF weights (causal mask not applied)."""
    ix, length = HF.indexer, x.shape[0]
    cos, sin = HF_ROTARY(x[None], torch.arange(length)[None])
    q = ix.wq_b(HF.q_a_layernorm(HF.q_a_proj(x))).view(1, length, HI, DI)
    k = ix.k_norm(ix.wk(x)).view(1, length, 1, DI)
    q_rot, k_rot = hf_v32.apply_rotary_pos_emb(q[..., :8], k[..., :8], cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q[..., 8:]], -1)[0].double()  # [L, HI, DI]
    k = torch.cat([k_rot, k[..., 8:]], -1)[0, :, 0].double()  # [L, DI]
    w = ix.weights_proj(x).double() * HI**-0.5
    return torch.einsum("th,ths->ts", w, torch.relu(torch.einsum("thd,sd->ths", q, k) * DI**-0.5))


def _check_topk_set(selected: set[int], row: list[float], tol: float = 1e-4) -> bool:
    """`selected` is a valid top-k of `row` (the visible scores) modulo near-ties; returns
    whether the k-th and (k+1)-th scores are tied within `tol`."""
    if len(row) <= TOPK:
        assert selected == set(range(len(row)))
        return False
    kth = sorted(row, reverse=True)[TOPK - 1]
    assert len(selected) == TOPK
    assert {s for s, v in enumerate(row) if v > kth + tol} <= selected
    assert all(row[s] >= kth - tol for s in selected)
    return sorted(row, reverse=True)[TOPK] >= kth - tol


def _run_chunks(layer: nn.Module, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    steps, outs, start = PagedSteps(CONFIG, 1, x.shape[0], BLOCK), [], 0
    for size in sizes:
        outs.append(steps.step(layer, {0: x[start : start + size]})[0])
        start += size
    return torch.cat(outs)


@pytest.fixture
def recorded_topk(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    calls: list[torch.Tensor] = []
    real = sparse_mod.lightning_indexer_topk

    def spy(*args):
        calls.append(real(*args))
        return calls[-1]

    monkeypatch.setattr(sparse_mod, "lightning_indexer_topk", spy)
    return calls


def test_parameter_names_match_hf() -> None:
    layer, _ = _layers()
    assert set(layer.state_dict()) == set(HF.state_dict())
    assert isinstance(layer.indexer.k_norm, nn.LayerNorm)


@pytest.mark.parametrize("length", [1, 2, 5, TOPK])
def test_c03_dense_when_length_le_topk(length: int, recorded_topk: list) -> None:
    layer, mla = _layers()
    x = _x(length, length)
    got = _run_chunks(layer, x, [length])
    assert not recorded_topk  # dense path taken
    assert torch.equal(got, _run_chunks(mla, x, [length]))
    torch.testing.assert_close(got, _hf_forward(x), **TOL)
    # the sparse path over the same tokens would give the same result
    steps = PagedSteps(CONFIG, 1, length, BLOCK)
    batch = build_forward_batch([length], [0], steps.tables, [1], BLOCK, steps.caches)
    with torch.no_grad():
        proj = layer.project(x, batch.positions)
        write_paged(steps.caches[0]["latent"], batch.slot_mapping, proj.latent)
        iq, iw, ik = layer.indexer(x, proj.q_resid, proj.cos_sin)
        write_paged(steps.caches[0]["index_keys"], batch.slot_mapping, ik)
        out = torch.empty(length, 4, 12)
        layer.attend_sparse(out, proj, iq, iw, batch, [0])
        torch.testing.assert_close(layer.o_proj(out.flatten(1)), got, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("length", [TOPK + 1, TOPK + 2, 12, 2 * TOPK, 2 * TOPK + 1, 3 * TOPK])
def test_c03_selection_and_output_above_topk(length: int, recorded_topk: list) -> None:
    layer, _ = _layers()
    x = _x(length, 100 + length)
    got = _run_chunks(layer, x, [length])
    (topk,) = recorded_topk
    assert topk.shape == (length, TOPK) and topk.dtype == torch.int32
    scores = _oracle_index_scores(x)
    mask = torch.zeros(length, length, dtype=torch.bool)
    num_ties = 0
    for t in range(length):
        selected = {s for s in topk[t].tolist() if s >= 0}
        assert (topk[t] < 0).sum() == max(0, TOPK - (t + 1))
        num_ties += _check_topk_set(selected, scores[t, : t + 1].tolist())
        mask[t, list(selected)] = True
    torch.testing.assert_close(got, _hf_forward(x, mask), **TOL)
    assert num_ties == 0  # tie-free inputs: the HF module's own top-k must pick the same sets
    torch.testing.assert_close(got, _hf_forward(x), **TOL)


@pytest.mark.parametrize("length", [1, 2, 17, 40])
def test_prefill_matches_hf(length: int) -> None:
    layer, _ = _layers()
    x = _x(length, 200 + length)
    got = _run_chunks(layer, x, [length])
    assert not got.isnan().any()
    torch.testing.assert_close(got, _hf_forward(x), **TOL)


@pytest.mark.parametrize(
    "sizes",
    [[5] + [1] * 25, [21] + [1] * 9, [1] * 30, [7, 10, 1, 12]],
    ids=["dense-prefill-then-decode-across-k", "sparse-prefill-decode", "all-decode", "chunks"],
)
def test_prefill_then_decode_matches_full_forward(sizes: list[int]) -> None:
    layer, _ = _layers()
    x = _x(30, 1)
    torch.testing.assert_close(_run_chunks(layer, x, sizes), _hf_forward(x), **TOL)


def test_packed_batch_equals_each_alone() -> None:
    layer, _ = _layers()
    xs = [_x(n, 300 + n) for n in (6, 21, 14, 40, 8)]
    # 0: short prefill (dense); 1: decoding past k (sparse); 2: chunk crossing k;
    # 3: long prefill (sparse); 4: decode reaching exactly k (dense)
    history = {0: [6], 1: [20, 1], 2: [5, 9], 3: [40], 4: [7, 1]}
    solo = {i: _run_chunks(layer, xs[i], sizes) for i, sizes in history.items()}
    steps = PagedSteps(CONFIG, 5, 40, BLOCK, seed=5)
    steps.step(layer, {1: xs[1][:20], 2: xs[2][:5], 4: xs[4][:7]})
    packed = steps.step(layer, {4: xs[4][7:], 1: xs[1][20:], 0: xs[0], 3: xs[3], 2: xs[2][5:]})
    for i, sizes in history.items():
        torch.testing.assert_close(packed[i], solo[i][sum(sizes[:-1]) :], rtol=0, atol=1e-6)


def test_requires_q_lora_rank() -> None:
    # ModelConfig itself rejects a DSA layer without q_lora_rank (ConfigError is a ValueError)
    with pytest.raises(ValueError, match="q_lora_rank"):
        DSAttention(CONFIG.replace(mla=MLAConfig(4, 16, 16, 8, 12, q_lora_rank=None)), 0)


def test_gpu_path_selection_logic_on_cpu(monkeypatch) -> None:
    """The CUDA branch of `DSAttention.forward` (`attend_selected`: short sequences take the
    "every visible token" selection with no indexer, the rest the indexer's top-k, all rows in
    one `sparse_mla` call), run here through the reference ops, equals the CPU branch on the
    mixed packed batch above."""
    layer, _ = _layers()
    xs = [_x(n, 300 + n) for n in (6, 21, 14, 40, 8)]
    first = {1: xs[1][:20], 2: xs[2][:5], 4: xs[4][:7]}
    second = {4: xs[4][7:], 1: xs[1][20:], 0: xs[0], 3: xs[3], 2: xs[2][5:]}
    outputs = []
    eager = AttentionMetadata.eager
    for on_device in (False, True):  # the step's metadata picks the path (CUDA: on the device)
        monkeypatch.setattr(AttentionMetadata, "eager", lambda *a, on=on_device: replace(
            eager(*a), lengths_on_device=on))  # fmt: skip
        steps = PagedSteps(CONFIG, 5, 40, BLOCK, seed=5)
        outputs.append([steps.step(layer, first), steps.step(layer, second)])
    for cpu_step, gpu_step in zip(*outputs, strict=True):
        for i in cpu_step:
            torch.testing.assert_close(gpu_step[i], cpu_step[i], **TOL)
