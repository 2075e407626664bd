"""FP8 (e4m3fn) quantization, the definitions. Scales are float32 dequantization multipliers
(`value ~= fp8 * scale`, as DeepSeek-V3's `weight_scale_inv`), amax / 448 per weight block,
activation row group or cache vector; an all-zero one gets scale 1."""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def _scale_of(amax: torch.Tensor) -> torch.Tensor:
    amax = amax.float()
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def _to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    # +-inf saturates to +-448 like every finite overflow; NaN stays NaN.
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def _blocks(x: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    n, k = x.shape
    padded = F.pad(x.float(), (0, -k % bk, 0, -n % bn))
    return padded.view(padded.shape[0] // bn, bn, padded.shape[1] // bk, bk)


def quantize_weight_blockwise(
    weight: torch.Tensor, block_size: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K], block_size (bn, bk) -> (q [N, K] fp8, scale [ceil(N/bn), ceil(K/bk)])."""
    bn, bk = block_size
    n, k = weight.shape
    blocks = _blocks(weight, bn, bk)
    scale = _scale_of(blocks.abs().amax(dim=(1, 3)))
    q = _to_fp8(blocks, scale[:, None, :, None]).view(blocks.shape[0] * bn, -1)
    return q[:n, :k].contiguous(), scale


def dequantize_weight_blockwise(
    q: torch.Tensor, scale: torch.Tensor, block_size: tuple[int, int]
) -> torch.Tensor:
    """`q * scale` per block: q [N, K] fp8, scale [ceil(N/bn), ceil(K/bk)] -> [N, K] float32."""
    bn, bk = block_size
    n, k = q.shape
    expected = (-(-n // bn), -(-k // bk))
    if tuple(scale.shape) != expected:
        raise ValueError(f"weight scale {tuple(scale.shape)} != {expected} for a [{n}, {k}] "
                         f"weight in blocks of {tuple(block_size)}")  # fmt: skip
    full = scale.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return q.float() * full


def dequantize_stacked(
    q: torch.Tensor, scale: torch.Tensor, block_size: tuple[int, int], num_parts: int = 1
) -> torch.Tensor:
    """q [P*N, K]: `num_parts` stacked matrices, each with its own block grid (gate | up)."""
    if num_parts == 1:
        return dequantize_weight_blockwise(q, scale, block_size)
    parts = zip(q.chunk(num_parts), scale.chunk(num_parts), strict=True)
    return torch.cat([dequantize_weight_blockwise(w, s, block_size) for w, s in parts])


def quantize_activation(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (q [..., K] fp8, scale [..., ceil(K/group_size)])."""
    k = x.shape[-1]
    groups = F.pad(x.float(), (0, -k % group_size)).unflatten(-1, (-1, group_size))
    scale = _scale_of(groups.abs().amax(dim=-1))
    q = _to_fp8(groups, scale[..., None]).flatten(-2)[..., :k]
    return q, scale


def dequantize_activation(q: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
    k = q.shape[-1]
    return q.float() * scale.repeat_interleave(group_size, -1)[..., :k]


def fake_quantize_activation(x: torch.Tensor, group_size: int) -> torch.Tensor:
    return dequantize_activation(*quantize_activation(x, group_size), group_size)


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    block_size: tuple[int, int],
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """W8A8 as vLLM's block fp8 linear: x [..., K] quantized per row and bk columns, weight
    [N, K] fp8, weight_scale [ceil(N/bn), ceil(K/bk)] -> [..., N], summed in fp32."""
    xq = fake_quantize_activation(x, block_size[1])
    w = dequantize_weight_blockwise(weight, weight_scale, block_size)
    out = F.linear(xq, w, None if bias is None else bias.float())
    return out.to(x.dtype)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache entries: x [..., D] -> (q [..., D] fp8, scale [...])."""
    scale = _scale_of(x.abs().amax(dim=-1))
    return _to_fp8(x, scale[..., None]), scale


def dequantize_per_token(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale[..., None]


def fp8_moe_experts(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down_proj: torch.Tensor,
    down_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    block_size: tuple[int, int],
) -> torch.Tensor:
    """SwiGLU experts, products as `fp8_linear`, rounded as the bf16 experts: hidden_states [T, D],
    gate_up_proj [E, 2I, D] fp8 (gate | up, own block grids), down_proj [E, D, I], scales per
    block, topk_weights / topk_ids [T, k] -> [T, D]."""
    out = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    xq = fake_quantize_activation(hidden_states, block_size[1])
    for e in topk_ids.unique().tolist():
        rows, slots = (topk_ids == e).nonzero(as_tuple=True)
        w_gu = dequantize_stacked(gate_up_proj[e], gate_up_scale[e], block_size, 2)
        gate, up = F.linear(xq[rows], w_gu).to(hidden_states.dtype).chunk(2, dim=-1)
        act = (F.silu(gate.float()) * up.float()).to(hidden_states.dtype)
        w_d = dequantize_weight_blockwise(down_proj[e], down_scale[e], block_size)
        y = F.linear(fake_quantize_activation(act, block_size[1]), w_d)
        out.index_add_(0, rows, y.to(hidden_states.dtype).float() * topk_weights[rows, slots, None])
    return out.to(hidden_states.dtype)


def fp8_shared_expert(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down_proj: torch.Tensor,
    down_scale: torch.Tensor,
    block_size: tuple[int, int],
) -> torch.Tensor:
    """One expert of `fp8_moe_experts`, for every token: gate_up_proj [2I, D], down_proj [D, I]."""
    dtype = hidden_states.dtype
    xq = fake_quantize_activation(hidden_states, block_size[1])
    w_gu = dequantize_stacked(gate_up_proj, gate_up_scale, block_size, 2)
    gate, up = F.linear(xq, w_gu).to(dtype).chunk(2, dim=-1)
    act = (F.silu(gate.float()) * up.float()).to(dtype)
    w_d = dequantize_weight_blockwise(down_proj, down_scale, block_size)
    return F.linear(fake_quantize_activation(act, block_size[1]), w_d).to(dtype)
