"""KDA and Gated DeltaNet layers against the transformers modules with the same weights.

Oracles: `KimiLinearDeltaAttention` / `Qwen3NextGatedDeltaNet` full forwards (prefill), the same
modules stepped token by token through a `DynamicCache` (decode outputs and recurrent states),
and hyla's own one-shot prefill (split invariance). Caches are poisoned with NaN so a read of a
fresh sequence's slot shows up.
"""

from __future__ import annotations

import functools
import inspect
import random

import pytest
import torch
from transformers import DynamicCache, KimiLinearConfig, Qwen3NextConfig
from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

from hyla.config import LinearAttentionConfig, ModelConfig
from hyla.forward_batch import allocate_caches, build_forward_batch
from hyla.layers.linear_attention import GatedDeltaNet, KimiDeltaAttention

D, EPS, ATOL, BLOCK = 64, 1e-5, 1e-5, 4096
KINDS = ("kda", "gdn")
# kda: H = HV = 2, K = V = 16 (Kimi has no GVA); gdn: 2 key heads, 4 value heads, K 16, V 8
DIMS = {"kda": (2, 2, 16, 16), "gdn": (2, 4, 16, 8)}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny tensors, thousands of steps: intra-op threads only add synchronisation (and spin
    # when the machine is busy), so this module runs single-threaded.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def hyla_config(kind: str) -> ModelConfig:
    return ModelConfig(
        vocab_size=32,
        hidden_size=D,
        intermediate_size=64,
        layer_pattern=(kind,),
        ffn_pattern=("dense",),
        rms_norm_eps=EPS,
        linear=LinearAttentionConfig(*DIMS[kind]),
    )


def hf_module(kind: str):
    H, HV, K, V = DIMS[kind]
    common = dict(
        vocab_size=32,
        hidden_size=D,
        num_hidden_layers=1,
        rms_norm_eps=EPS,
        layer_types=["linear_attention"],
    )
    if kind == "kda":
        cfg = KimiLinearConfig(
            **common,
            mlp_layer_types=["dense"],
            linear_num_heads=H,
            linear_head_dim=K,
            linear_conv_kernel_dim=4,
        )
        return cfg, KimiLinearDeltaAttention(cfg, 0)
    cfg = Qwen3NextConfig(
        **common,
        linear_num_key_heads=H,
        linear_num_value_heads=HV,
        linear_key_head_dim=K,
        linear_value_head_dim=V,
        linear_conv_kernel_dim=4,
    )
    return cfg, Qwen3NextGatedDeltaNet(cfg, 0)


def randomize(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("A_log"):  # A in [1, 16] as fla initialises it
                p.copy_(torch.rand(p.shape, generator=gen).mul(15).add(1).log())
            elif name.endswith("dt_bias"):  # softplus(dt_bias) in [1e-3, 1e-1]
                dt = torch.rand(p.shape, generator=gen).mul(4.6).sub(6.9).exp()
                p.copy_(dt + torch.log(-torch.expm1(-dt)))
            elif "f_b_proj" in name or "in_proj_ba" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2 * p.shape[-1] ** -0.5)
            elif "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                scale = p.shape[-1] ** -0.5 if p.dim() > 1 else 0.5
                p.copy_(torch.randn(p.shape, generator=gen) * scale)


def kimi_checkpoint_names(state: dict[str, torch.Tensor], key_dim: int) -> dict:
    """transformers' in-memory kimi names -> the checkpoint names hyla uses (the inverse of
    transformers' `conversion_mapping["kimi_linear"]` for the linear-attention layer)."""
    out = {k.removeprefix("forget_gate."): v for k, v in state.items() if k != "conv1d.weight"}
    conv = state["conv1d.weight"]
    out["q_conv1d.weight"] = conv[:key_dim]
    out["k_conv1d.weight"] = conv[key_dim : 2 * key_dim]
    out["v_conv1d.weight"] = conv[2 * key_dim :]
    return out


@functools.cache
def make_pair(kind: str, seed: int = 0):
    """(hyla config, HF config, HF module, hyla layer) with identical random weights."""
    hf_cfg, hf = hf_module(kind)
    randomize(hf, seed)
    config = hyla_config(kind)
    state = hf.state_dict()
    if kind == "kda":
        state = kimi_checkpoint_names(state, DIMS[kind][0] * DIMS[kind][2])
        ours = KimiDeltaAttention(config, 0)
    else:
        ours = GatedDeltaNet(config, 0)
    ours.load_state_dict(state)  # strict: every name and shape must match
    return config, hf_cfg, hf.eval(), ours.eval()


class LayerRunner:
    """Feeds chunks of N sequences to one hyla layer through real ForwardBatches, with
    NaN-poisoned caches and shuffled state slots."""

    def __init__(self, config: ModelConfig, layer: torch.nn.Module, num_seqs: int) -> None:
        self.layer = layer
        self.caches = allocate_caches(config, 1, BLOCK, num_seqs + 1)
        for t in self.caches[0].values():
            t.fill_(float("nan"))
        self.slots = list(range(1, num_seqs + 1))
        random.Random(num_seqs).shuffle(self.slots)
        self.lens = [0] * num_seqs

    @torch.no_grad()
    def step(self, chunks: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        ids = list(chunks)
        batch = build_forward_batch(
            query_lens=[chunks[i].shape[0] for i in ids],
            context_lens=[self.lens[i] for i in ids],
            block_tables=[[0] for _ in ids],
            state_indices=[self.slots[i] for i in ids],
            block_size=BLOCK,
            caches=self.caches,
        )
        out = self.layer(torch.cat([chunks[i] for i in ids]), batch.positions, batch)
        for i in ids:
            self.lens[i] += chunks[i].shape[0]
        return dict(zip(ids, out.split([chunks[i].shape[0] for i in ids]), strict=True))

    def state(self, i: int, name: str = "recurrent_state") -> torch.Tensor:
        return self.caches[0][name][self.slots[i]]


def inputs(T: int, seed: int) -> torch.Tensor:
    return torch.randn(T, D, generator=torch.Generator().manual_seed(seed))


def hf_cache(hf, cache) -> dict:
    """The cache keyword of the transformers layer: `cache` (`cache_params` before 5.24, removed
    in 5.40)."""
    name = "cache" if "cache" in inspect.signature(hf.forward).parameters else "cache_params"
    return {name: cache}


@torch.no_grad()
def hf_token_by_token(hf, hf_cfg, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Outputs [T, D] and the recurrent state after each token, decoding through a cache."""
    cache = DynamicCache(config=hf_cfg)
    outs, states = [], []
    for t in range(x.shape[0]):
        outs.append(hf(x[None, t : t + 1], **hf_cache(hf, cache))[0, 0])
        states.append(cache.get_recurrent_state(0)[0].clone())
    return torch.stack(outs), states


def test_parameter_names_and_shapes() -> None:
    kda = {k: tuple(v.shape) for k, v in make_pair("kda")[3].state_dict().items()}
    assert kda == {
        "q_proj.weight": (32, D),
        "k_proj.weight": (32, D),
        "v_proj.weight": (32, D),
        "q_conv1d.weight": (32, 1, 4),
        "k_conv1d.weight": (32, 1, 4),
        "v_conv1d.weight": (32, 1, 4),
        "f_a_proj.weight": (16, D),
        "f_b_proj.weight": (32, 16),
        "dt_bias": (32,),
        "A_log": (1, 1, 2, 1),
        "b_proj.weight": (2, D),
        "g_a_proj.weight": (16, D),
        "g_b_proj.weight": (32, 16),
        "o_norm.weight": (16,),
        "o_proj.weight": (D, 32),
    }
    gdn_ours = {k: tuple(v.shape) for k, v in make_pair("gdn")[3].state_dict().items()}
    gdn_hf = {k: tuple(v.shape) for k, v in make_pair("gdn")[2].state_dict().items()}
    assert gdn_ours == gdn_hf


@pytest.mark.parametrize("kind", KINDS)
def test_packed_prefill_matches_transformers(kind: str) -> None:
    config, hf_cfg, hf, ours = make_pair(kind)
    lens = [1, 5, 64, 65, 150]
    xs = {i: inputs(n, seed=i) for i, n in enumerate(lens)}
    runner = LayerRunner(config, ours, len(lens))
    out = runner.step(xs)
    for i, x in xs.items():
        cache = DynamicCache(config=hf_cfg)
        with torch.no_grad():
            hf_chunked = hf(x[None], **hf_cache(hf, cache))[0]
        torch.testing.assert_close(out[i], hf_chunked, atol=ATOL, rtol=0)
        torch.testing.assert_close(
            runner.state(i), cache.get_recurrent_state(0)[0], atol=ATOL, rtol=0
        )


@pytest.mark.parametrize("kind", KINDS)
def test_c02_prefill_then_one_decode_equals_full_forward(kind: str) -> None:
    """For every T in 1..130: prefill(x[:T-1]) + decode(x[T-1]) == full forward over x[:T] at
    the last position == transformers decoding token by token; the slot state equals the
    token-by-token oracle's state after T tokens."""
    config, hf_cfg, hf, ours = make_pair(kind)
    x = inputs(130, seed=7)
    hf_outs, hf_states = hf_token_by_token(hf, hf_cfg, x)
    for T in range(1, 131):
        runner = LayerRunner(config, ours, 2)
        if T > 1:
            runner.step({0: x[: T - 1]})
        decoded = runner.step({0: x[T - 1 : T]})[0][-1]
        full = runner.step({1: x[:T]})[1][-1]
        msg = f"T={T}"
        torch.testing.assert_close(decoded, full, atol=ATOL, rtol=0, msg=msg)
        torch.testing.assert_close(decoded, hf_outs[T - 1], atol=ATOL, rtol=0, msg=msg)
        for seq in (0, 1):
            torch.testing.assert_close(
                runner.state(seq), hf_states[T - 1], atol=ATOL, rtol=0, msg=msg
            )


@functools.cache
def one_shot(kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    config, _, _, ours = make_pair(kind)
    runner = LayerRunner(config, ours, 1)
    out = runner.step({0: inputs(1000, seed=11)})[0]
    return out, runner.state(0).clone(), runner.state(0, "conv_state").clone()


@pytest.mark.parametrize("chunk", [1, 2, 3, 16, 63, 64, 65, 999, 1000, 1001])
@pytest.mark.parametrize("kind", KINDS)
def test_c01_chunked_prefill_split_invariance(kind: str, chunk: int) -> None:
    """A 1000-token prefill at once == the same prefill in chunks of `chunk` tokens: outputs,
    final recurrent state and conv state (chunks of 1-3 tokens are shorter than W - 1 = 3)."""
    config, _, _, ours = make_pair(kind)
    x = inputs(1000, seed=11)
    runner = LayerRunner(config, ours, 1)
    outs = [runner.step({0: x[s : s + chunk]})[0] for s in range(0, 1000, chunk)]
    full_out, full_state, full_conv = one_shot(kind)
    torch.testing.assert_close(torch.cat(outs), full_out, atol=ATOL, rtol=0)
    torch.testing.assert_close(runner.state(0), full_state, atol=ATOL, rtol=0)
    torch.testing.assert_close(runner.state(0, "conv_state"), full_conv, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_c04_mixed_step_matches_solo_runs(kind: str) -> None:
    """Decodes, continued prefills and fresh sequences (one of them a single token from a
    poisoned slot) packed in one step give each sequence's solo result."""
    config, _, _, ours = make_pair(kind)
    first = {0: inputs(10, 0), 1: inputs(70, 1)}
    second = {0: inputs(1, 2), 1: inputs(5, 3), 2: inputs(33, 4), 3: inputs(1, 5)}
    mixed = LayerRunner(config, ours, 4)
    mixed.step(first)
    out = mixed.step(second)
    for i, x in second.items():
        solo = LayerRunner(config, ours, 4)
        if i in first:
            solo.step({i: first[i]})
        torch.testing.assert_close(out[i], solo.step({i: x})[i], atol=ATOL, rtol=0)
        torch.testing.assert_close(mixed.state(i), solo.state(i), atol=ATOL, rtol=0)
        assert torch.isfinite(out[i]).all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "slots", [[1, 2, 3], [3, 1, 2], [1, 3, 5]], ids=["in-order", "permuted", "scattered"]
)
def test_decode_step_is_the_same_whatever_the_slot_layout(
    kind: str, slots: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pure decode step updates contiguous slots in place (permuting the batch into slot order
    when needed) and gathers/scatters scattered ones: the outputs and states are bit for bit
    those of the slots in batch order."""
    import hyla.layers.state_slots as la

    in_place = []
    original = la._decode_in_place
    monkeypatch.setattr(la, "_decode_in_place", lambda *a: in_place.append(a[-1]) or original(*a))
    config, _, _, ours = make_pair(kind)
    prompts = {i: inputs(5 + 7 * i, seed=20 + i) for i in range(3)}
    step = {i: inputs(1, seed=30 + i) for i in range(3)}
    results = []
    for layout in ([1, 2, 3], slots):
        runner = LayerRunner(config, ours, 5)
        runner.slots = layout + [s for s in range(1, 6) if s not in layout]
        runner.step(prompts)
        out = runner.step(step)
        results.append((out, [runner.state(i).clone() for i in range(3)]))
    (out_a, states_a), (out_b, states_b) = results
    assert len(in_place) == (1 if slots == [1, 3, 5] else 2)  # scattered slots: gathered
    assert in_place[0] is None and (slots != [3, 1, 2] or in_place[1].tolist() == [1, 2, 0])
    for i in range(3):
        assert torch.equal(out_a[i], out_b[i]) and torch.equal(states_a[i], states_b[i])
