"""hyla's own checkpoint layout: config.json from `ModelConfig.to_dict` + model.safetensors with
hyla's state-dict names, for the seed pattern `["kda", "kda", "dsa", "kda"] * 2` with a dense
first FFN and sigmoid grouped-routing MoE after it.

Oracles: the in-memory model that wrote the checkpoint (bit-identical tensors and logits), a
one-shot prefill (chunked prefill, I1) and each sequence run alone (batch transparency, I3).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hyla.config import (
    ConfigError,
    DSAConfig,
    LinearAttentionConfig,
    MLAConfig,
    ModelConfig,
    MoEConfig,
    RopeConfig,
)
from hyla.layers.sparse_attention import DSAttention
from hyla.models.hybrid import HybridModel
from hyla.models.loader import CheckpointError, load_config, load_model
from hyla.models.runner import SequenceRunner

ATOL = 1e-5
INDEX_TOPK = 8


def native_config() -> ModelConfig:
    return ModelConfig(
        vocab_size=96,
        hidden_size=48,
        intermediate_size=64,
        layer_pattern=("kda", "kda", "dsa", "kda") * 2,
        ffn_pattern=("dense",) + ("moe",) * 7,
        rms_norm_eps=1e-6,
        max_context_len=512,
        eos_token_ids=(2,),
        rope=RopeConfig(theta=10000.0, rotary_dim=8, style="interleave"),
        linear=LinearAttentionConfig(num_k_heads=2, num_v_heads=2, head_k_dim=16, head_v_dim=16),
        mla=MLAConfig(
            num_heads=2,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            v_head_dim=8,
            q_lora_rank=24,
        ),  # fmt: skip
        dsa=DSAConfig(index_n_heads=8, index_head_dim=16, index_topk=INDEX_TOPK),
        moe=MoEConfig(
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            num_shared_experts=1,
            scoring="sigmoid",
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            has_correction_bias=True,
        ),  # fmt: skip
    )


def _randomize(model: HybridModel, seed: int) -> None:
    """Random values everywhere (norm weights near 1), including the router's float32 bias.

    Weights have std 0.05 (logits up to ~1.4). Measured: at std 0.1 (logits up to ~2.6) feeding
    150 tokens one by one differs from the one-shot prefill by up to 2.1e-5, fp32 rounding of
    the recurrent KDA path (~1e-6 per layer with identical inputs) amplified through 8 layers;
    at std 0.05 it is 4e-6, inside the 1e-5 bound of the reference cases."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32)
            if "norm" in name and name.endswith("weight"):
                tensor.copy_(1.0 + 0.1 * noise)
            elif "correction_bias" in name:
                tensor.copy_(0.05 * noise)
            else:
                tensor.copy_(0.05 * noise)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[HybridModel, Path]:
    config = native_config()
    model = HybridModel(config).eval()
    _randomize(model, seed=0)
    path = tmp_path_factory.mktemp("native")
    (path / "config.json").write_text(json.dumps(config.to_dict(), indent=1))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, path / "model.safetensors")
    return model, path


@pytest.fixture(scope="module")
def loaded(saved) -> HybridModel:
    return load_model(saved[1], progress=False)


def _prompts(lengths: tuple[int, ...], vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


def test_round_trip_is_bit_identical(saved, loaded) -> None:
    model, path = saved
    assert json.loads((path / "config.json").read_text())["model_type"] == "hyla"
    assert load_config(path) == model.config == loaded.config
    assert loaded.config.architecture == "hyla" and loaded.config.moe.n_group == 4
    want = model.state_dict()
    got = loaded.state_dict()
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert torch.equal(got[name], want[name]), name
    assert loaded.layers[1].mlp.gate.e_score_correction_bias.abs().sum() > 0

    prompts = _prompts((1, 5, 40), model.config.vocab_size)
    outs = []
    for m in (model, loaded):
        runner = SequenceRunner(m, len(prompts), 64)
        first = runner.step(dict(enumerate(prompts)), all_logits=True)
        second = runner.step({i: [7] for i in range(len(prompts))})
        outs.append([first[i] for i in range(3)] + [second[i] for i in range(3)])
    for a, b in zip(*outs, strict=True):
        assert torch.isfinite(a).all() and torch.equal(a, b)


def test_chunked_prefill_equals_one_shot(loaded, monkeypatch) -> None:
    sparse = []
    original = DSAttention.attend_sparse
    monkeypatch.setattr(
        DSAttention, "attend_sparse", lambda self, *a: sparse.append(1) or original(self, *a)
    )
    (prompt,) = _prompts((150,), loaded.config.vocab_size)
    ref = SequenceRunner(loaded, 1, 150).step({0: prompt}, all_logits=True)[0]
    sizes = (1, 3, 8, 9, 64, 65, 150)
    runner = SequenceRunner(loaded, len(sizes), 150, seed=3)
    done, pieces = [0] * len(sizes), [[] for _ in sizes]
    while min(done) < len(prompt):
        chunks = {i: prompt[done[i] : done[i] + s] for i, s in enumerate(sizes) if done[i] < 150}
        for i, logits in runner.step(chunks, all_logits=True).items():
            pieces[i].append(logits)
            done[i] += len(chunks[i])
    for i, size in enumerate(sizes):
        got = torch.cat(pieces[i])
        err = (got - ref).abs().max().item()
        assert err <= ATOL, f"chunk={size}: max abs logit error {err:.3e}"
        assert torch.equal(got.argmax(-1), ref.argmax(-1)), f"chunk={size}"
    assert sparse  # prompts beyond index_topk take the DSA top-k path


def test_batch_equals_solo(loaded) -> None:
    """Mixed prefill lengths in one step, then greedy decodes together, vs each alone."""
    prompts = _prompts((1, 2, 9, 33, 120), loaded.config.vocab_size)
    num_steps = 6

    def greedy(runner: SequenceRunner, ids: list[int]) -> dict[int, list[torch.Tensor]]:
        logits = runner.step({i: prompts[i] for i in ids})
        out = {i: [logits[i]] for i in ids}
        for _ in range(num_steps):
            logits = runner.step({i: [int(out[i][-1].argmax())] for i in ids})
            for i in ids:
                out[i].append(logits[i])
        return out

    together = greedy(SequenceRunner(loaded, len(prompts), 128, seed=4), list(range(5)))
    for i in range(len(prompts)):
        alone = greedy(SequenceRunner(loaded, len(prompts), 128, seed=9), [i])[i]
        for step, (a, b) in enumerate(zip(together[i], alone, strict=True)):
            err = (a - b).abs().max().item()
            assert err <= ATOL, f"seq {i} step {step}: batch vs solo error {err:.3e}"
            assert int(a.argmax()) == int(b.argmax()), f"seq {i} step {step}"


def _rewrite(saved_path: Path, tmp_path: Path, edit) -> Path:
    state = load_file(saved_path / "model.safetensors")
    edit(state)
    (tmp_path / "config.json").write_text((saved_path / "config.json").read_text())
    save_file(state, tmp_path / "model.safetensors")
    return tmp_path


def test_missing_tensor_is_named(saved, tmp_path) -> None:
    path = _rewrite(saved[1], tmp_path, lambda s: s.pop("layers.2.mixer.indexer.wk.weight"))
    with pytest.raises(CheckpointError, match=r"missing[^\n]*\n\s*layers\.2\.mixer\.indexer\.wk"):
        load_model(path, progress=False)


def test_wrong_shape_is_named(saved, tmp_path) -> None:
    name = "layers.5.mlp.experts.down_proj"  # [E, D, I] = [8, 48, 16]

    def edit(state):
        state[name] = state[name][:, :, :15].contiguous()

    path = _rewrite(saved[1], tmp_path, edit)
    match = r"layers\.5\.mlp\.experts\.down_proj: checkpoint \[8, 48, 15\] vs model \[8, 48, 16\]"
    with pytest.raises(CheckpointError, match=match):
        load_model(path, progress=False)


def test_unknown_architecture_in_native_config(saved, tmp_path) -> None:
    data = json.loads((saved[1] / "config.json").read_text())
    data["architecture"] = "llama"
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"^architecture: 'llama'"):
        load_config(tmp_path)
