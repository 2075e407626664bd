"""MLAttention and GQAttention over the paged cache vs the transformers modules with the same
weights: Kimi-Linear NoPE MLA (KimiLinearAttention), DeepSeek MLA with interleaved YaRN rope
(DeepseekV3Attention, the MLA of DeepseekV32Attention without its indexer) and Qwen3-Next gated
GQA (Qwen3NextAttention). Caches are NaN-poisoned, blocks shuffled."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn
from transformers import DeepseekV3Config, KimiLinearConfig, Qwen3NextConfig
from transformers.masking_utils import create_causal_mask
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds
from transformers.models.kimi_linear import modeling_kimi_linear as hf_kimi
from transformers.models.qwen3_next import modeling_qwen3_next as hf_qn

from hyla.config import GQAConfig, MLAConfig, ModelConfig, RopeConfig
from hyla.layers.attention import GQAttention, MLAttention
from tests.paged_steps import PagedSteps

D = 64
BLOCK = 4
TOL = {"rtol": 1e-5, "atol": 1e-5}
YARN = {"factor": 8.0, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 16}


@dataclass
class Case:
    name: str
    hf: nn.Module
    hf_config: object
    rotary: nn.Module | None
    config: ModelConfig


def _model_config(kind: str, **kw) -> ModelConfig:
    return ModelConfig(
        vocab_size=32,
        hidden_size=D,
        intermediate_size=64,
        layer_pattern=(kind,),
        ffn_pattern=("dense",),
        **kw,
    )


def _randomize(module: nn.Module, norm_center: float) -> None:
    gen = torch.Generator().manual_seed(7)
    for name, p in module.named_parameters():
        noise = torch.randn(p.shape, generator=gen)
        if "norm" in name and "weight" in name:
            p.data.copy_(norm_center + 0.2 * noise)
        else:
            p.data.copy_(noise / p.shape[-1] ** 0.5)


def _mla_dims(**kw) -> dict:
    return dict(
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=12,
        **kw,
    )


def _kimi(q_lora_rank: int | None) -> Case:
    cfg = KimiLinearConfig(
        hidden_size=D, num_hidden_layers=1, q_lora_rank=q_lora_rank, **_mla_dims()
    )
    cfg._attn_implementation = "eager"
    mla = MLAConfig(4, 16, 16, 8, 12, q_lora_rank=q_lora_rank, use_rope=False)
    return Case(
        f"kimi-q{q_lora_rank}",
        hf_kimi.KimiLinearAttention(cfg, 0),
        cfg,
        None,
        _model_config("mla", mla=mla, rms_norm_eps=1e-5),
    )


def _deepseek(q_lora_rank: int | None, interleave: bool) -> Case:
    cfg = DeepseekV3Config(
        hidden_size=D,
        num_hidden_layers=1,
        q_lora_rank=q_lora_rank,
        rope_interleave=interleave,
        max_position_embeddings=128,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, **YARN},
        **_mla_dims(),
    )
    cfg._attn_implementation = "eager"
    style = "interleave" if interleave else "neox"
    rope = RopeConfig(1e4, 8, style, "yarn", tuple(sorted(YARN.items())))
    mla = MLAConfig(4, 16, 16, 8, 12, q_lora_rank=q_lora_rank)
    return Case(
        f"deepseek-q{q_lora_rank}-{style}",
        hf_ds.DeepseekV3Attention(cfg, 0),
        cfg,
        hf_ds.DeepseekV3RotaryEmbedding(cfg),
        _model_config("mla", mla=mla, rope=rope),
    )


def _qwen3_next() -> Case:
    cfg = Qwen3NextConfig(
        hidden_size=D,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
    )
    cfg._attn_implementation = "eager"
    gqa = GQAConfig(4, 2, 16, qk_norm=True, output_gate=True)
    config = _model_config("gqa", gqa=gqa, rope=RopeConfig(1e4, 8), norm_offset=1.0)
    return Case(
        "qwen3-next",
        hf_qn.Qwen3NextAttention(cfg, 0),
        cfg,
        hf_qn.Qwen3NextRotaryEmbedding(cfg),
        config,
    )


CASES = {
    "kimi-nope": lambda: _kimi(None),
    "kimi-nope-qlora": lambda: _kimi(24),
    "deepseek-interleave-qlora": lambda: _deepseek(24, True),
    "deepseek-interleave": lambda: _deepseek(None, True),
    "deepseek-neox-qlora": lambda: _deepseek(24, False),
    "qwen3-next-gqa": _qwen3_next,
}


def _build(case_id: str):
    case = CASES[case_id]()
    _randomize(case.hf, 1.0 if case.config.norm_offset == 0 else 0.0)
    cls = GQAttention if case.config.layer_pattern[0] == "gqa" else MLAttention
    layer = cls(case.config, 0)
    layer.load_state_dict(case.hf.state_dict(), strict=True)
    return case, layer


@torch.no_grad()
def _hf_forward(case: Case, x: torch.Tensor) -> torch.Tensor:
    """x [L, D] as one sequence from position 0 -> [L, D]."""
    pos = torch.arange(x.shape[0])[None]
    mask = create_causal_mask(case.hf_config, x[None], None, None, position_ids=pos)
    kwargs = {}
    if case.rotary is not None:
        kwargs["position_embeddings"] = case.rotary(x[None], pos)
    return case.hf(hidden_states=x[None], attention_mask=mask, **kwargs)[0][0]


def _run_chunks(layer, config, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    steps = PagedSteps(config, 1, x.shape[0], BLOCK)
    outs, start = [], 0
    for size in sizes:
        outs.append(steps.step(layer, {0: x[start : start + size]})[0])
        start += size
    return torch.cat(outs)


@pytest.mark.parametrize("case_id", list(CASES))
@pytest.mark.parametrize("length", [1, 2, 17, 40])
def test_prefill_matches_hf(case_id: str, length: int) -> None:
    case, layer = _build(case_id)
    x = torch.randn(length, D, generator=torch.Generator().manual_seed(length))
    got = _run_chunks(layer, case.config, x, [length])
    assert not got.isnan().any()
    torch.testing.assert_close(got, _hf_forward(case, x), **TOL)


@pytest.mark.parametrize("case_id", list(CASES))
def test_prefill_then_decode_and_chunks_match_hf(case_id: str) -> None:
    case, layer = _build(case_id)
    x = torch.randn(30, D, generator=torch.Generator().manual_seed(1))
    want = _hf_forward(case, x)
    for sizes in ([21] + [1] * 9, [1] * 30, [7, 10, 1, 12]):
        got = _run_chunks(layer, case.config, x, sizes)
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("case_id", list(CASES))
def test_packed_batch_equals_each_alone(case_id: str) -> None:
    case, layer = _build(case_id)
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(n, D, generator=gen) for n in (17, 21, 14, 40)]
    # seq 0 prefills at once; seq 1 is decoding; seq 2 is mid chunked prefill; seq 3 long prefill
    history = {1: [20, 1], 2: [9, 5], 0: [17], 3: [40]}
    solo = {i: _run_chunks(layer, case.config, xs[i], sizes) for i, sizes in history.items()}
    steps = PagedSteps(case.config, 4, 40, BLOCK, seed=5)
    steps.step(layer, {1: xs[1][:20], 2: xs[2][:9]})
    packed = steps.step(layer, {1: xs[1][20:], 0: xs[0], 2: xs[2][9:], 3: xs[3]})
    torch.testing.assert_close(packed[1], solo[1][20:], rtol=0, atol=1e-6)
    torch.testing.assert_close(packed[2], solo[2][9:], rtol=0, atol=1e-6)
    torch.testing.assert_close(packed[0], solo[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(packed[3], solo[3], rtol=0, atol=1e-6)


def test_parameter_names_match_hf() -> None:
    for case_id in CASES:
        case, layer = _build(case_id)
        assert set(layer.state_dict()) == set(case.hf.state_dict()), case_id


def test_decode_uses_absorbed_form(monkeypatch: pytest.MonkeyPatch) -> None:
    import hyla.layers.attention as attn

    calls: list[str] = []
    for name in ("mla_absorbed_batched", "mla_expanded"):
        fn = getattr(attn, name)
        def spy(*a, _f=fn, _n=name, **kw):
            calls.append(_n)
            return _f(*a, **kw)

        monkeypatch.setattr(attn, name, spy)
    case, layer = _build("deepseek-interleave-qlora")
    x = torch.randn(6, D)
    _run_chunks(layer, case.config, x, [5, 1])
    assert calls == ["mla_expanded", "mla_absorbed_batched"]


def test_rejects_rope_dim_mismatch() -> None:
    mla = MLAConfig(4, 16, 16, 8, 12)
    with pytest.raises(ValueError, match="rotary_dim"):
        MLAttention(_model_config("mla", mla=mla, rope=RopeConfig(rotary_dim=16)), 0)
