"""FP8 checkpoints of the families that ship fp8 releases (Qwen3.5-35B-A3B-FP8, GLM-5-FP8,
DeepSeek-V4, whose clamped SwiGLU experts hyla dequantizes at load: no fp8 clamped form yet):
e4m3 `weight` + `weight_scale_inv` per block, loaded into fp8 modules, against transformers.

The checkpoints are the tiny random models of tests.qwen35_moe_tiny and tests.glm_moe_dsa_tiny,
their 2-D text projection weights quantized by tests/models/test_fp8_checkpoint.py's own block
quantizer (the vision tower stays float, as in the releases); the oracle is that file's: the
transformers model of the dequantized checkpoint with each quantized projection's inputs rounded
through e4m3 per token and bk columns. Tolerance as there: 1e-4, and ten times closer than the
float model.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from hyla.layers.fp8_experts import Fp8Experts
from hyla.layers.linear import Fp8Linear
from tests.deepseek_v4_tiny import save_tiny_deepseek_v4
from tests.glm_moe_dsa_tiny import save_tiny_glm_moe_dsa
from tests.models.test_fp8_checkpoint import (
    BLOCK,
    _hyla_logits,
    _quantized,
    _w8a8_oracle,
    block_dequantize,
    block_quantize,
)
from tests.qwen35_moe_tiny import save_tiny_qwen35_moe


def _hf_class(family: str):
    import transformers

    name = {"qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
            "glm_moe_dsa": "GlmMoeDsaForCausalLM",
            "deepseek_v4": "DeepseekV4ForCausalLM"}[family]  # fmt: skip
    return getattr(transformers, name)


SAVERS = {"qwen3_5_moe": save_tiny_qwen35_moe, "glm_moe_dsa": save_tiny_glm_moe_dsa,
          "deepseek_v4": save_tiny_deepseek_v4}  # fmt: skip


def _write(path, config: dict, tensors: dict, quantized: bool) -> None:
    path.mkdir()
    if quantized:
        config = config | {"quantization_config": {
            "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
            "weight_block_size": list(BLOCK), "modules_to_not_convert": ["lm_head", "visual"]}}
    (path / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, path / "model.safetensors")


@pytest.fixture(scope="module", params=sorted(SAVERS))
def dirs(request, tmp_path_factory):
    family = request.param
    base = tmp_path_factory.mktemp(f"fp8_{family}")
    float_dir = base / "float"
    SAVERS[family](float_dir, seed=5)
    state = load_file(float_dir / "model.safetensors")
    fp8_state, deq_state = {}, {}
    for name, t in state.items():
        if _quantized(name, t) and "visual" not in name:
            q, s = block_quantize(t, *BLOCK)
            fp8_state[name], fp8_state[name + "_scale_inv"] = q, s
            deq_state[name] = block_dequantize(q, s, *BLOCK)
        else:
            fp8_state[name] = deq_state[name] = t
    config = json.loads((float_dir / "config.json").read_text())
    _write(base / "fp8", config, fp8_state, True)
    _write(base / "deq", config, deq_state, False)
    shutil.copy(float_dir / "generation_config.json", base / "deq")
    return family, float_dir, base / "fp8", base / "deq"


def test_fp8_checkpoint_matches_transformers_w8a8(dirs) -> None:
    family, float_dir, fp8_dir, deq_dir = dirs
    ids = torch.randint(3, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    got, model = _hyla_logits(fp8_dir, ids)
    assert any(isinstance(m, Fp8Linear) for m in model.modules())
    moe = [layer.mlp for layer in model.layers if hasattr(layer.mlp, "experts")]
    clamped = model.config.swiglu_limit is not None  # DeepSeek-V4: experts dequantized at load
    assert moe and all(isinstance(m.experts, Fp8Experts) != clamped for m in moe)
    with torch.no_grad():
        oracle = _w8a8_oracle(deq_dir, model_cls=_hf_class(family), fp8_experts=not clamped)
        want = oracle(torch.tensor([ids])).logits[0].float()
    unquantized, _ = _hyla_logits(float_dir, ids)
    err = (got - want).abs().max().item()
    print(f"{family} fp8: max abs logit error {err:.3e}")
    assert err <= 1e-4, err
    assert err * 10 <= (unquantized - want).abs().max().item()
