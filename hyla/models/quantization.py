"""FP8 weights at load: a candidate module is fp8 when the checkpoint stores it so (or always
with `--quantization fp8`). Candidates: `Linear`s and block-scaled experts whose weight only
their forward reads: not `lm_head`, `kv_b_proj` (MLA absorbs it), DeepSeek-V4's grouped
`o_a_proj`, `weights_proj`, nor `modules_to_not_convert` (substrings, as transformers matches)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hyla.config import ConfigError, ModelConfig, QuantizationConfig
from hyla.layers.fp8_experts import Fp8Experts
from hyla.layers.linear import Fp8Linear, Linear
from hyla.layers.moe import Experts
from hyla.layers.parallel import ExpertParallelExperts, Fp8ExpertParallelExperts
from hyla.models.registry import placement_for
from hyla.ops.fp8 import FP8, dequantize_stacked, quantize_weight_blockwise

SCALE_SUFFIXES = ("_scale_inv", "_scale")  # DeepSeek/Qwen block scales; per-tensor/channel
SKIPPED_SUFFIXES = (".input_scale",)  # static activation scales: hyla computes them per token
NOT_FP8 = ("lm_head", "kv_b_proj", "weights_proj", "o_a_proj")
QUANTIZABLE = (Linear, Experts, ExpertParallelExperts)


def quantization_from_hf(raw: dict[str, Any]) -> QuantizationConfig | None:
    """QuantizationConfig of `quantization_config` (fp8 only; None without one); a static
    `activation_scheme` is served with dynamic scales. ConfigError names the field."""
    quant = raw.get("quantization_config")
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise ConfigError("quantization_config: expected an object")
    method = quant.get("quant_method")
    if method != "fp8":
        raise ConfigError(f"quantization_config.quant_method: {method!r} is not supported "
                          "(supported: fp8)")  # fmt: skip
    fmt = quant.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ConfigError(f"quantization_config.fmt: {fmt!r} is not supported (e4m3)")
    skip = quant.get("modules_to_not_convert") or quant.get("ignored_layers") or ()
    block = quant.get("weight_block_size")
    try:
        return QuantizationConfig(
            weight_block_size=None if block is None else tuple(block),
            modules_to_not_convert=tuple(skip),
        )
    except (ConfigError, TypeError) as e:
        raise ConfigError(f"quantization_config: {e}") from e


def _excluded(config: ModelConfig, name: str) -> bool:
    quant = config.quantization
    if any(name.endswith(s) for s in NOT_FP8):
        return True
    for skip in quant.modules_to_not_convert:
        if skip in name:
            return True
        hf = [p.target for p in placement_for(config, f"{skip}.weight")]
        if any(t.startswith(f"{name}.") or t == name for t in hf):
            return True
    return False


def fp8_candidates(model: nn.Module) -> dict[str, nn.Module]:
    """Modules (by qualified name) whose weights may be stored in fp8."""
    config = model.config
    if config.quantization is None:
        return {}
    kinds = QUANTIZABLE if config.quantization.weight_block_size else (Linear,)
    if config.swiglu_limit is not None:  # no fp8 form of the clamped experts: dequantized
        kinds = tuple(k for k in kinds if k is not Experts) or (Linear,)
    return {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, kinds) and not _excluded(config, name)
    }


def defers(module: nn.Module, name: str) -> bool:
    """The loader leaves parameter `name` of `module` on meta until it knows the storage dtype."""
    return isinstance(module, QUANTIZABLE) and name in ("weight", "gate_up_proj", "down_proj")


def _fp8_module(module: nn.Module, block: tuple[int, int] | None, device) -> nn.Module:
    if isinstance(module, Linear):
        return Fp8Linear(module.in_features, module.out_features, module.bias is not None,
                         block, module.bias.dtype if module.bias is not None else None,
                         device)  # fmt: skip
    E, two_i, D = module.gate_up_proj.shape  # experts are candidates with block scales only
    if isinstance(module, ExpertParallelExperts):  # a TP rank's E / N whole experts
        return Fp8ExpertParallelExperts(D, two_i // 2, E, module.first, block, device)
    return Fp8Experts(E, D, two_i // 2, block, device)


@torch.no_grad()
def convert_modules(
    model: nn.Module, names: set[str], dtype: torch.dtype, device: torch.device | str
) -> None:
    """Replace modules `names` by empty fp8 forms; other deferred parameters get `dtype` storage."""
    block = model.config.quantization.weight_block_size if model.config.quantization else None
    for name in sorted(names):
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, child, _fp8_module(getattr(owner, child), block, device))
    if torch.device(device).type == "meta":
        return
    for module in model.modules():
        for pname, param in list(module._parameters.items()):
            if param is not None and param.is_meta and defers(module, pname):
                new = torch.empty(param.shape, dtype=dtype, device=device)
                module._parameters[pname] = nn.Parameter(new, requires_grad=False)


def choose_fp8(model: nn.Module, stored_fp8: set[str], quantize_floats: bool) -> set[str]:
    """Candidates stored in fp8 (`stored_fp8`: hyla names), or all with `quantize_floats`."""
    chosen = set()
    for name, module in fp8_candidates(model).items():
        leaf = "weight" if isinstance(module, Linear) else "gate_up_proj"
        if quantize_floats or f"{name}.{leaf}" in stored_fp8:
            chosen.add(name)
    return chosen


def scale_block(module: nn.Module, target_leaf: str) -> tuple[tuple[int, int], int]:
    """(block, num_parts) of an fp8 weight `target_leaf` of `module`."""
    if isinstance(module, Fp8Linear):
        return module.block_size, 1
    return module.block_size, module.num_parts[target_leaf]


def fill_fp8(
    dst: torch.Tensor,
    dst_scale: torch.Tensor,
    src: torch.Tensor,
    src_scale: torch.Tensor | None,
    block: tuple[int, int],
    num_parts: int,
    src_block: tuple[int, int] | None,
) -> None:
    """Fill an fp8 dst [..., R, C] and its block scales: fp8 of the same layout is copied, a
    per-tensor scale broadcast; anything else is dequantized and re-quantized block-wise."""
    if src.dim() > 2:
        for i in range(src.shape[0]):
            s = None if src_scale is None or src_scale.numel() == 1 else src_scale[i]
            fill_fp8(dst[i], dst_scale[i], src[i], s if s is not None else src_scale, block,
                     num_parts, src_block)  # fmt: skip
        return
    if src.dtype == FP8 and src_scale is not None:
        if tuple(src_scale.shape) == tuple(dst_scale.shape) or src_scale.numel() == 1:
            dst.copy_(src)
            dst_scale.copy_(src_scale.float().reshape(-1)[0] if src_scale.numel() == 1
                            else src_scale.float())  # fmt: skip
            return
        src = dequantize_stored(src, src_scale, src_block, num_parts)
    for q_dst, s_dst, w in zip(dst.chunk(num_parts), dst_scale.chunk(num_parts),
                               src.chunk(num_parts), strict=True):  # fmt: skip
        q, s = quantize_weight_blockwise(w, block)
        q_dst.copy_(q)
        s_dst.copy_(s)


def dequantize_stored(
    q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None, num_parts: int = 1
) -> torch.Tensor:
    """A stored fp8 matrix [R, C] as float32: scale per tensor, per row ([R] or [R, 1]) or per
    `block` (without one, inferred from the shapes: exact for multiples of it)."""
    scale = scale.float()
    if scale.numel() == 1:
        return q.float() * scale.reshape(())
    if scale.dim() == 1 or (scale.shape[-1] == 1 and scale.shape[0] == q.shape[0]):
        return q.float() * scale.reshape(-1, 1)
    if block is None:
        block = (-(-q.shape[0] // scale.shape[0]), -(-q.shape[1] // scale.shape[1]))
    return dequantize_stacked(q, scale, block, num_parts)
