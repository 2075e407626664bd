"""Checkpoint loader: HF layouts (transformers 5 fused experts, original per-expert releases),
sharded and single-file safetensors, hyla's own layout, FP8 blocks, and every error path."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hyla.models.hybrid import HybridModel
from hyla.models.loader import CheckpointError, dequantize_fp8, load_config, load_model
from tests.hf_tiny import FAMILIES, save_tiny_hf_model


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory) -> dict[str, tuple[Path, dict[str, torch.Tensor]]]:
    """family -> (save_pretrained dir, the HF model's in-memory state dict).

    transformers 5 keeps experts fused in memory (`experts.gate_up_proj [E, 2I, D]`; Kimi also
    `forget_gate.*` and one `conv1d`) but save_pretrained writes the released per-expert layout.
    """
    out = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(f"hf_{family}")
        model = save_tiny_hf_model(family, path, seed=3)
        out[family] = (path, {k: v.detach().clone() for k, v in model.state_dict().items()})
    return out


def _write(state: dict[str, torch.Tensor], path: Path, config_from: Path, shards: int) -> Path:
    """Write `state` as `shards` safetensors files (+ index when > 1) next to a copied config."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(config_from / "config.json", path / "config.json")
    names = sorted(state)
    if shards == 1:
        save_file({n: state[n].contiguous() for n in names}, path / "model.safetensors")
        return path
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({n: state[n].contiguous() for n in part}, path / file)
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return path


def _original_layout(family: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers-5 names -> the released checkpoints' names, written out by hand: per-expert
    weights; for Kimi also `block_sparse_moe.`, w1/w3/w2, separate q/k/v convs, flat forget gate."""
    out = {}
    for name, t in state.items():
        m = re.match(r"(.*\.mlp)\.experts\.(gate_up_proj|down_proj)$", name)
        if m:
            prefix = m.group(1)
            if family == "kimi_linear":
                prefix = prefix.replace(".mlp", ".block_sparse_moe")
            names = (
                ("w1", "w3", "w2")
                if family == "kimi_linear"
                else ("gate_proj", "up_proj", "down_proj")
            )
            for e in range(t.shape[0]):
                base = f"{prefix}.experts.{e}"
                if m.group(2) == "gate_up_proj":
                    gate, up = t[e].chunk(2, dim=0)
                    out[f"{base}.{names[0]}.weight"], out[f"{base}.{names[1]}.weight"] = gate, up
                else:
                    out[f"{base}.{names[2]}.weight"] = t[e]
            continue
        if family == "kimi_linear":
            if re.search(r"\.mlp\.(gate|shared_experts)\.", name):
                name = name.replace(".mlp.", ".block_sparse_moe.")
            name = name.replace(".self_attn.forget_gate.", ".self_attn.")
            if name.endswith("self_attn.conv1d.weight"):
                for part, chunk in zip("qkv", t.chunk(3, dim=0), strict=True):
                    out[name.replace("conv1d", f"{part}_conv1d")] = chunk
                continue
        out[name] = t
    return out


def _kimi_mlp(name: str) -> str:
    return name.replace(".block_sparse_moe.", ".mlp.")


def _state(model: HybridModel) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_checkpoint_maps_every_tensor(hf_dirs, tmp_path, family: str) -> None:
    path, hf = hf_dirs[family]
    model = load_model(_write(hf, tmp_path / "fused", path, 1), dtype="float32", progress=False)
    hyla = _state(model)
    assert sum(v.numel() for v in hyla.values()) == sum(v.numel() for v in hf.values())
    assert torch.isclose(
        sum(v.double().sum() for v in hyla.values()), sum(v.double().sum() for v in hf.values())
    )
    # spot checks written out by hand
    torch.testing.assert_close(hyla["embed_tokens.weight"], hf["model.embed_tokens.weight"])
    torch.testing.assert_close(hyla["lm_head.weight"], hf["lm_head.weight"])
    moe = "layers.1.mlp."
    torch.testing.assert_close(
        hyla[moe + "experts.gate_up_proj"], hf["model." + moe + "experts.gate_up_proj"]
    )
    torch.testing.assert_close(hyla[moe + "gate.weight"], hf["model." + moe + "gate.weight"])
    if family == "qwen3_next":
        torch.testing.assert_close(
            hyla[moe + "shared_experts.up_proj.weight"],
            hf["model." + moe + "shared_expert.up_proj.weight"],
        )
        torch.testing.assert_close(
            hyla["layers.0.mixer.A_log"], hf["model.layers.0.linear_attn.A_log"]
        )
    else:
        bias = hf["model." + moe + "gate.e_score_correction_bias"]
        assert bias.abs().sum() > 0
        torch.testing.assert_close(hyla[moe + "gate.e_score_correction_bias"], bias)
    if family == "kimi_linear":
        conv = hf["model.layers.0.self_attn.conv1d.weight"]
        q, k, v = conv.chunk(3)
        torch.testing.assert_close(hyla["layers.0.mixer.k_conv1d.weight"], k)
        torch.testing.assert_close(
            hyla["layers.0.mixer.dt_bias"], hf["model.layers.0.self_attn.forget_gate.dt_bias"]
        )


@pytest.mark.parametrize("family", FAMILIES)
def test_save_pretrained_and_sharded_per_expert_layouts_load_identically(
    hf_dirs, tmp_path, family
) -> None:
    path, hf = hf_dirs[family]
    fused = _state(load_model(_write(hf, tmp_path / "fused", path, 1), "float32", progress=False))
    original_state = _original_layout(family, hf)
    # same names as save_pretrained writes (which also puts Kimi's dense layer 0 under
    # `block_sparse_moe.`, unlike the release; the loader accepts both)
    saved = set(load_file(path / "model.safetensors"))
    assert {_kimi_mlp(n) for n in original_state} == {_kimi_mlp(n) for n in saved}
    original = _write(original_state, tmp_path / "orig", path, shards=3)
    assert (original / "model.safetensors.index.json").is_file()
    for checkpoint in (path, original):
        loaded = _state(load_model(checkpoint, dtype="float32", progress=False))
        assert loaded.keys() == fused.keys()
        for name in fused:
            torch.testing.assert_close(loaded[name], fused[name], rtol=0, atol=0, msg=name)


def test_bfloat16_keeps_router_bias_in_float32(hf_dirs) -> None:
    path, hf = hf_dirs["deepseek_v32"]
    model = load_model(path, dtype="bfloat16", progress=False)
    assert model.config.dtype == "bfloat16"
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    bias = model.layers[1].mlp.gate.e_score_correction_bias
    assert bias.dtype == torch.float32
    torch.testing.assert_close(bias, hf["model.layers.1.mlp.gate.e_score_correction_bias"])
    torch.testing.assert_close(
        model.embed_tokens.weight, hf["model.embed_tokens.weight"].bfloat16()
    )


def test_known_extra_tensors_are_skipped(hf_dirs, tmp_path) -> None:
    path, hf = hf_dirs["deepseek_v32"]
    extra = dict(hf)
    extra["model.layers.4.self_attn.q_a_proj.weight"] = torch.zeros(3, 3)  # MTP layer 4 of 4
    extra["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(4)
    load_model(_write(extra, tmp_path / "ds", path, 1), dtype="float32", progress=False)
    path, hf = hf_dirs["qwen3_next"]
    extra = {**hf, "mtp.fc.weight": torch.zeros(2, 2)}
    load_model(_write(extra, tmp_path / "qn", path, 2), dtype="float32", progress=False)


def test_missing_tensor_is_named(hf_dirs, tmp_path) -> None:
    path, hf = hf_dirs["qwen3_next"]
    state = {k: v for k, v in hf.items() if k != "model.layers.2.input_layernorm.weight"}
    with pytest.raises(CheckpointError, match=r"missing.*\n.*layers\.2\.input_layernorm\.weight"):
        load_model(_write(state, tmp_path / "x", path, 1), progress=False)


def test_missing_expert_slice_is_named(hf_dirs, tmp_path) -> None:
    path, hf = hf_dirs["kimi_linear"]
    state = _original_layout("kimi_linear", hf)
    del state["model.layers.2.block_sparse_moe.experts.5.w3.weight"]
    with pytest.raises(
        CheckpointError, match=r"layers\.2\.mlp\.experts\.gate_up_proj \(expert 5 part 2 of 2\)"
    ):
        load_model(_write(state, tmp_path / "x", path, 2), progress=False)


def test_unexpected_tensor_is_named(hf_dirs, tmp_path) -> None:
    path, hf = hf_dirs["kimi_linear"]
    state = {**hf, "model.layers.0.self_attn.mystery.weight": torch.zeros(2)}
    with pytest.raises(CheckpointError, match=r"unexpected.*\n.*self_attn\.mystery\.weight"):
        load_model(_write(state, tmp_path / "x", path, 1), progress=False)


def test_shape_mismatch_names_tensor_and_both_shapes(hf_dirs, tmp_path) -> None:
    path, hf = hf_dirs["deepseek_v32"]
    state = {**hf, "model.norm.weight": torch.ones(65)}
    match = r"model\.norm\.weight: checkpoint \[65\] vs model \[64\]"
    with pytest.raises(CheckpointError, match=match):
        load_model(_write(state, tmp_path / "x", path, 1), progress=False)


def test_kimi_fused_conv_with_wrong_rows_is_a_shape_error(hf_dirs, tmp_path) -> None:
    path, hf = hf_dirs["kimi_linear"]
    conv = "model.layers.0.self_attn.conv1d.weight"
    state = {**hf, conv: hf[conv][:-1]}
    with pytest.raises(CheckpointError, match=r"conv1d\.weight: checkpoint .* vs model .*q_conv1d"):
        load_model(_write(state, tmp_path / "x", path, 1), progress=False)


def test_no_safetensors_is_an_error(hf_dirs, tmp_path) -> None:
    shutil.copy(hf_dirs["qwen3_next"][0] / "config.json", tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        load_model(tmp_path, progress=False)


def test_hyla_native_round_trip_with_tied_embeddings(hf_dirs, tmp_path) -> None:
    config = load_config(hf_dirs["qwen3_next"][0]).replace(tie_word_embeddings=True)
    torch.manual_seed(0)
    model = HybridModel(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "model.safetensors")
    loaded = load_model(tmp_path, progress=False)
    assert loaded.config == config
    assert loaded.lm_head.weight is loaded.embed_tokens.weight
    for name, tensor in loaded.state_dict().items():
        torch.testing.assert_close(tensor, model.state_dict()[name], rtol=0, atol=0)


def test_dequantize_fp8_blocks() -> None:
    torch.manual_seed(0)
    w = torch.randn(5, 7).to(torch.float8_e4m3fn)
    scale = torch.rand(3, 4) + 0.5  # blocks of 2 x 2, ragged at the edges
    out = dequantize_fp8(w, scale)
    for r in range(5):
        for c in range(7):
            assert out[r, c] == w[r, c].float() * scale[r // 2, c // 2]


def test_fp8_checkpoint_is_dequantized(hf_dirs, tmp_path) -> None:
    path, hf = hf_dirs["deepseek_v32"]
    name = "model.layers.0.self_attn.kv_b_proj.weight"  # [H*(Dn+Dv), kv_lora_rank] = [128, 32]
    scale = torch.rand(8, 2) + 0.5  # 16 x 16 blocks
    q = (hf[name] / scale.repeat_interleave(16, 0).repeat_interleave(16, 1)).to(torch.float8_e4m3fn)
    state = {**hf, name: q, name + "_scale_inv": scale}
    model = load_model(_write(state, tmp_path / "fp8", path, 2), dtype="float32", progress=False)
    got = model.layers[0].mixer.kv_b_proj.weight
    torch.testing.assert_close(got, dequantize_fp8(q, scale), rtol=0, atol=0)
    torch.testing.assert_close(got, hf[name], rtol=0.07, atol=2e-3)


def test_load_config_adds_generation_config_eos(hf_dirs, tmp_path) -> None:
    path = hf_dirs["kimi_linear"][0]
    shutil.copy(path / "config.json", tmp_path / "config.json")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert load_config(tmp_path).eos_token_ids == (2, 7)
    assert load_config(tmp_path / "config.json").architecture == "kimi_linear"


def test_allocation_honours_keep_fp32_and_skips_init() -> None:
    from torch import nn

    from hyla.models.loader import _allocate_only

    class Holder(nn.Module):
        keep_fp32 = ("a_log",)

        def __init__(self) -> None:
            super().__init__()
            self.a_log = nn.Parameter(torch.ones(3))
            self.proj = nn.Linear(4, 5)
            self.register_buffer("table", torch.arange(3.0))

    with _allocate_only(torch.bfloat16):
        m = Holder()
    assert m.a_log.dtype == torch.float32
    assert m.proj.weight.dtype == torch.bfloat16 and m.proj.bias.dtype == torch.bfloat16
    assert m.table.tolist() == [0.0, 1.0, 2.0]  # buffers keep dtype and values
    w = torch.zeros(3, 3)
    nn.init.normal_(w)
    assert w.abs().sum() > 0  # init functions are restored afterwards
