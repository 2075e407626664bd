"""FP8 (float8_e4m3fn) quantization, the definitions: block-scaled weights, per-token-group
activations, per-token cache entries, and the fp8 linear / MoE expert products built on them.

Every scale here is a dequantization multiplier (`value ~= fp8 * scale`), the meaning of the
`weight_scale_inv` tensors of DeepSeek-V3 / Qwen3 fp8 releases. Scales are float32.

    weight W [N, K], block (bn, bk):
        scale[i, j] = amax |W[i*bn:(i+1)*bn, j*bk:(j+1)*bk]| / 448      ([ceil(N/bn), ceil(K/bk)])
        q = round_e4m3(clamp(W / scale, -448, 448))                       (edge blocks are partial)
    activation x [M, K], group g (= bk): one scale per row and g columns   ([M, ceil(K/g)])
    cache entry e [..., D]: one scale per vector of the last dim            ([...])

A block, group or entry that is all zero gets scale 1 (q = 0): never a division by zero.
`fp8_linear` is W8A8 as vLLM's block fp8 linear (DeepSeek-V3's recipe): x is quantized per
token and group of bk columns, and out = dequant(x_q) @ dequant(W_q)^T summed in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def _scale_of(amax: torch.Tensor) -> torch.Tensor:
    amax = amax.float()
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def _to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    # NaN stays NaN (e4m3fn has one); +-inf saturates to +-448 like every finite overflow.
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def _blocks(x: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    """[N, K] zero-padded to multiples of the block, as [N/bn, bn, K/bk, bk]."""
    n, k = x.shape
    padded = F.pad(x.float(), (0, -k % bk, 0, -n % bn))
    return padded.view(padded.shape[0] // bn, bn, padded.shape[1] // bk, bk)


def quantize_weight_blockwise(
    weight: torch.Tensor, block_size: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-scaled e4m3 weight.

    Args:
        weight: [N, K] float; block_size: (bn, bk), e.g. (128, 128).
    Returns: (q [N, K] float8_e4m3fn, scale [ceil(N/bn), ceil(K/bk)] float32).
    """
    bn, bk = block_size
    n, k = weight.shape
    blocks = _blocks(weight, bn, bk)
    scale = _scale_of(blocks.abs().amax(dim=(1, 3)))  # [N/bn, K/bk]
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
    """Dequantize a weight made of `num_parts` matrices stacked along dim 0, each with its own
    block grid (an expert's gate rows then up rows): q [P*N, K], scale [P*ceil(N/bn), ...]."""
    if num_parts == 1:
        return dequantize_weight_blockwise(q, scale, block_size)
    parts = zip(q.chunk(num_parts), scale.chunk(num_parts), strict=True)
    return torch.cat([dequantize_weight_blockwise(w, s, block_size) for w, s in parts])


def quantize_activation(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token-group e4m3 activation: x [..., K] -> (q [..., K] fp8,
    scale [..., ceil(K/g)] float32), one scale per row and `group_size` columns."""
    k = x.shape[-1]
    groups = F.pad(x.float(), (0, -k % group_size)).unflatten(-1, (-1, group_size))
    scale = _scale_of(groups.abs().amax(dim=-1))
    q = _to_fp8(groups, scale[..., None]).flatten(-2)[..., :k]
    return q, scale


def dequantize_activation(q: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
    """`quantize_activation`'s inverse: [..., K] float32."""
    k = q.shape[-1]
    return q.float() * scale.repeat_interleave(group_size, -1)[..., :k]


def fake_quantize_activation(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """x rounded through per-token-group e4m3 and back (float32)."""
    return dequantize_activation(*quantize_activation(x, group_size), group_size)


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    block_size: tuple[int, int],
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """W8A8 block-scaled linear: x quantized per token and bk columns, out summed in float32.

    Args:
        x: [..., K] float; weight: [N, K] float8_e4m3fn; weight_scale: [ceil(N/bn), ceil(K/bk)]
        float32; block_size: (bn, bk); bias: [N] or None.
    Returns: [..., N] in x's dtype.
    """
    xq = fake_quantize_activation(x, block_size[1])
    w = dequantize_weight_blockwise(weight, weight_scale, block_size)
    out = F.linear(xq, w, None if bias is None else bias.float())
    return out.to(x.dtype)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache entries in e4m3: x [..., D] -> (q [..., D] fp8, scale [...] float32), one scale
    per vector of the last dim (an MLA latent, an indexer key, a head of K or V)."""
    scale = _scale_of(x.abs().amax(dim=-1))
    return _to_fp8(x, scale[..., None]), scale


def dequantize_per_token(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`quantize_per_token`'s inverse: [..., D] float32."""
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
    """SwiGLU experts with block-scaled fp8 weights, each expert's products as `fp8_linear`.

    Args:
        hidden_states: [T, D]; gate_up_proj: [E, 2I, D] fp8 (gate rows then up rows, each with
        its own block grid); gate_up_scale: [E, 2*ceil(I/bn), ceil(D/bk)]; down_proj: [E, D, I]
        fp8; down_scale: [E, ceil(D/bn), ceil(I/bk)]; topk_weights: [T, k]; topk_ids: [T, k];
        block_size: (bn, bk).
    Returns: [T, D] in hidden_states' dtype: sum_j w[t, j] * down_e(silu(gate_e(x)) * up_e(x)),
        with the intermediate rounded to the hidden dtype as the bf16 experts do.
    """
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
    """One SwiGLU expert with fp8 weights, as a routed expert of `fp8_moe_experts` computes it
    (gate and up products rounded to the hidden dtype, silu * up in fp32 rounded, down rounded):
    hidden_states [T, D]; gate_up_proj [2I, D] (gate rows then up rows, each with its own
    block grid); down_proj [D, I] -> [T, D]."""
    dtype = hidden_states.dtype
    xq = fake_quantize_activation(hidden_states, block_size[1])
    w_gu = dequantize_stacked(gate_up_proj, gate_up_scale, block_size, 2)
    gate, up = F.linear(xq, w_gu).to(dtype).chunk(2, dim=-1)
    act = (F.silu(gate.float()) * up.float()).to(dtype)
    w_d = dequantize_weight_blockwise(down_proj, down_scale, block_size)
    return F.linear(fake_quantize_activation(act, block_size[1]), w_d).to(dtype)
