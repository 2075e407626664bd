"""A training forward for HybridModel over `[N, L]` windows: the inference modules and weights, no
caches, autograd; KDA, MoE, conv and DSA re-expressed for batches. The DSA indexer gets no
gradient through top-k: it learns KL(p_t || softmax(I_t)), p_t the detached attention."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from hyla.layers.linear_attention import KimiDeltaAttention
from hyla.layers.moe import MoE
from hyla.layers.sparse_attention import DSAttention
from hyla.models.hybrid import HybridModel


@dataclass
class AuxLosses:
    indexer_kl: list[torch.Tensor] = field(default_factory=list)
    moe_balance: list[torch.Tensor] = field(default_factory=list)


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def chunked_kda_batched(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = 16,
) -> torch.Tensor:
    """KDA from a zero state (fp32, differentiable), equal to `recurrent_kda` per sequence. q, k:
    [N, L, H, K] (L2-normalised; q scaled); v: [N, L, H, V]; g: [N, L, H, K] log decays; beta:
    [N, L, H]. Returns [N, L, H, V] float32. Raises ValueError when L % chunk_size != 0."""
    if L_rem := q.shape[1] % chunk_size:
        raise ValueError(f"chunked_kda_batched: L={q.shape[1]} leaves {L_rem} past chunk_size")
    # states must not pass through bf16, even under an outer autocast
    with torch.autocast(device_type=q.device.type, enabled=False):
        return _chunked_kda(q, k, v, g, beta, chunk_size)


def _chunked_kda(q, k, v, g, beta, chunk_size: int) -> torch.Tensor:
    N, L, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    nc = L // C

    def chunks(x: torch.Tensor) -> torch.Tensor:  # [N, L, H, *] -> [N, H, nc, C, *]
        return x.float().transpose(1, 2).reshape(N, H, nc, C, *x.shape[3:])

    q, k, v, g = chunks(q), chunks(k), chunks(v), chunks(g)
    beta = beta.float().transpose(1, 2).reshape(N, H, nc, C)
    G = g.cumsum(dim=3)  # [N, H, nc, C, K]
    upper = torch.ones(C, C, dtype=torch.bool, device=q.device).triu(1)
    diff = G.unsqueeze(4) - G.unsqueeze(3)  # [N, H, nc, C(i), C(j), K]
    pair_decay = diff.masked_fill(upper[..., None], float("-inf")).exp()
    A = torch.einsum("...id,...jd,...ijd->...ij", k, k, pair_decay).tril(-1)
    B = torch.einsum("...id,...jd,...ijd->...ij", q, k, pair_decay)
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    M = eye + beta.unsqueeze(-1) * A
    bk = beta.unsqueeze(-1) * (k * G.exp())  # [N, H, nc, C, K]
    bv = beta.unsqueeze(-1) * v
    W = torch.linalg.solve_triangular(M, bk, upper=False)  # u = U - W s0
    U = torch.linalg.solve_triangular(M, bv, upper=False)
    last = G[:, :, :, -1:, :]  # [N, H, nc, 1, K]
    k_to_end = (k * (last - G).exp()).transpose(-1, -2)  # [N, H, nc, K, C]
    # s' = diag(exp(G_last)) s + k_to_end (U - W s) = T s + X: one matmul-add per chunk
    T = torch.diag_embed(last.squeeze(3).exp()) - k_to_end @ W  # [N, H, nc, K, K]
    X = k_to_end @ U  # [N, H, nc, K, V]
    s = q.new_zeros(N, H, K, V)
    states = []
    for c in range(nc):
        states.append(s)
        s = torch.baddbmm(
            X[:, :, c].reshape(N * H, K, V), T[:, :, c].reshape(N * H, K, K), s.view(N * H, K, V)
        ).view(N, H, K, V)
    S = torch.stack(states, dim=2)  # [N, H, nc, K, V] state before each chunk
    o = (q * G.exp()) @ S + B @ (U - W @ S)  # [N, H, nc, C, V]
    return o.reshape(N, H, L, V).transpose(1, 2)


def kda_forward(layer: KimiDeltaAttention, x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """`KimiDeltaAttention.forward` for fresh sequences: x [N, L, D] -> [N, L, D]."""
    N, L, D = x.shape
    H, HV = layer.num_k_heads, layer.num_v_heads
    K, V = layer.head_k_dim, layer.head_v_dim
    mixed = torch.cat([layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)], dim=-1)
    weight = torch.cat([layer.q_conv1d.weight, layer.k_conv1d.weight, layer.v_conv1d.weight])
    width = weight.shape[-1]
    conv = F.conv1d(
        F.pad(mixed.transpose(1, 2).float(), (width - 1, 0)), weight.float(), groups=weight.shape[0]
    )
    mixed = F.silu(conv).transpose(1, 2)  # [N, L, C]
    q, k, v = mixed.split([H * K, H * K, HV * V], dim=-1)
    q = _l2norm(q.reshape(N, L, H, K)) * K**-0.5
    k = _l2norm(k.reshape(N, L, H, K))
    if HV != H:
        q, k = (t.repeat_interleave(HV // H, dim=2) for t in (q, k))
    g = layer.forget_gate(x.reshape(N * L, D)).view(N, L, HV, K)
    beta = torch.sigmoid(layer.b_proj(x).float())
    o = chunked_kda_batched(q, k, v.reshape(N, L, HV, V), g, beta, chunk_size)
    gate = layer.g_b_proj(layer.g_a_proj(x)).view(N, L, HV, V)
    return layer.o_proj(layer.o_norm(o, gate).reshape(N, L, HV * V).to(x.dtype))


def indexer_scores_batched(
    layer: DSAttention, x: torch.Tensor, q_resid: torch.Tensor
) -> torch.Tensor:
    """Lightning-indexer scores [N, L, L] float32 (unmasked); x: [N, L, D], q_resid: [N, L, Rq]."""
    N, L, D = x.shape
    idx = layer.indexer
    q, w, k = idx(x.reshape(N * L, D), q_resid.reshape(N * L, -1), None)
    q = q.view(N, L, idx.n_heads, idx.head_dim).float()
    k = k.view(N, L, idx.head_dim).float()
    per_head = torch.relu(torch.einsum("nthd,nsd->nths", q, k) * idx.softmax_scale)
    w = w.view(N, L, idx.n_heads).float() * idx.n_heads**-0.5
    return torch.einsum("nth,nths->nts", w, per_head)


def dsa_forward(layer: DSAttention, x: torch.Tensor, sparse: bool, aux: AuxLosses) -> torch.Tensor:
    """`DSAttention.forward` over x [N, L, D]: top-k if `sparse`, else dense; indexer KL to
    `aux`."""
    N, L, D = x.shape
    H, Dn, Dv = layer.num_heads, layer.qk_nope_head_dim, layer.v_head_dim
    positions = torch.arange(L, device=x.device).repeat(N)
    proj = layer.project(x.reshape(N * L, D), positions)
    rank = layer.kv_lora_rank
    c_kv, k_rope = proj.latent[:, :rank], proj.latent[:, rank:]
    kv = layer.kv_b_proj(c_kv).view(N, L, H, Dn + Dv)
    k = torch.cat([kv[..., :Dn], k_rope.view(N, L, 1, -1).expand(-1, -1, H, -1)], dim=-1)
    q = torch.cat([proj.q_nope, proj.q_rope], dim=-1).view(N, L, H, -1)
    scores = torch.einsum("nthd,nshd->nhts", q.float(), k.float()) * layer.scale
    causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    index = indexer_scores_batched(layer, x.detach(), proj.q_resid.detach())
    index = index.masked_fill(~causal, float("-inf"))
    with torch.no_grad():
        target = torch.softmax(scores, dim=-1).sum(1) / H  # [N, L, L]
    log_index = torch.log_softmax(index, dim=-1)
    kl = target * (torch.log(target.clamp_min(1e-20)) - log_index.clamp_min(-1e4))
    aux.indexer_kl.append(kl.masked_fill(~causal, 0.0).sum(-1).mean())
    if sparse and L > layer.index_topk:
        # stable: ties go to the lower index, as `select_topk` at inference
        order = torch.sort(index.detach(), dim=-1, descending=True, stable=True).indices
        top = order[..., : layer.index_topk]  # [N, L, k]
        selected = torch.zeros(N, L, L, dtype=torch.bool, device=x.device)
        selected.scatter_(2, top, True)
        scores = scores.masked_fill(~(selected & causal)[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    v = kv[..., Dn:].float()
    out = torch.einsum("nhts,nshd->nthd", probs, v).to(x.dtype)
    return layer.o_proj(out.reshape(N, L, H * Dv))


def moe_forward(mlp: MoE, x: torch.Tensor, aux: AuxLosses) -> torch.Tensor:
    """`MoE.forward` over x [N, L, D]; appends the Switch balance loss E * sum f_e P_e to `aux`."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    weights, ids = mlp.gate(flat)
    E = mlp.gate.weight.shape[0]
    # Every expert on every token: `moe_experts`'s sum without its data-dependent loops and syncs.
    dense_w = torch.zeros(flat.shape[0], E, dtype=weights.dtype, device=flat.device)
    dense_w = dense_w.scatter(1, ids, weights)  # [T, E]
    gate_up = torch.einsum("td,efd->etf", flat, mlp.experts.gate_up_proj)  # [E, T, 2I]
    gate, up = gate_up.chunk(2, dim=-1)
    y = torch.einsum("eti,edi->etd", F.silu(gate) * up, mlp.experts.down_proj)  # [E, T, D]
    out = torch.einsum("etd,te->td", y, dense_w.to(y.dtype)).to(flat.dtype)
    if mlp.shared_experts is not None:
        shared = mlp.shared_experts(flat)
        if mlp.shared_expert_gate is not None:
            shared = torch.sigmoid(mlp.shared_expert_gate(flat)) * shared
        out = out + shared
    probs = torch.softmax(F.linear(flat, mlp.gate.weight).float(), dim=-1)
    counts = torch.zeros(E, device=x.device).index_add_(
        0, ids.reshape(-1), torch.ones(ids.numel(), device=x.device)
    )
    aux.moe_balance.append(E * (counts / ids.numel() * probs.mean(0)).sum())
    return out.reshape(shape)


def train_forward(
    model: HybridModel, input_ids: torch.Tensor, sparse: bool = True, chunk_size: int = 16
) -> tuple[torch.Tensor, AuxLosses]:
    """The model over `input_ids` [N, L]. Returns (final-norm hidden [N, L, D], aux losses)."""
    aux = AuxLosses()
    h = model.embed_tokens(input_ids)
    for layer in model.layers:
        x = layer.input_layernorm(h)
        if isinstance(layer.mixer, KimiDeltaAttention):
            h = h + kda_forward(layer.mixer, x, chunk_size)
        elif isinstance(layer.mixer, DSAttention):
            h = h + dsa_forward(layer.mixer, x, sparse, aux)
        else:
            raise ValueError(f"train_forward: mixer {type(layer.mixer).__name__} not supported")
        x = layer.post_attention_layernorm(h)
        h = h + (moe_forward(layer.mlp, x, aux) if isinstance(layer.mlp, MoE) else layer.mlp(x))
    return model.norm(h), aux
