"""FP8 checkpoints (DeepSeek/Qwen layout: e4m3 `weight` + `weight_scale_inv` per block, a
`quantization_config` in config.json) load into fp8 modules and match transformers.

The checkpoints are the tiny random models of `tests/hf_tiny.py`, their 2-D projection weights
quantized by this file's own block quantizer (written out plainly, not hyla's). The oracle is
the transformers model of the same checkpoint with the dequantized weights, whose inputs to
each quantized projection are rounded per token and group of bk columns through e4m3 by this
file's own code (forward pre-hooks, and a plain per-expert loop for the fused experts): hyla
computes W8A8 as vLLM's block fp8 linear does. Tolerance: logits within 1e-4 absolute (measured
~2e-6: fp32 sums in another order; one activation moved across an e4m3 rounding boundary would
show as ~1e-3), and at least ten times closer than the float model (measured 0.03-0.13), so the
oracle discriminates.
"""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from hyla.layers.fp8_experts import Fp8Experts
from hyla.layers.linear import Fp8Linear
from hyla.models.loader import load_model
from hyla.models.runner import SequenceRunner
from tests.hf_tiny import FAMILIES, save_tiny_hf_model

BLOCK = (16, 24)  # ragged: 64 columns are 2 full blocks of 24 and one of 16
E4M3_MAX = 448.0
KEEP_FLOAT = ("embed_tokens", "lm_head", "norm", "mlp.gate.", "shared_expert_gate", "weights_proj")


def block_quantize(w: torch.Tensor, bn: int, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One float32 scale per bn x bk block (amax / 448; 1 for an all-zero block), block by
    block in Python loops: the independent twin of hyla's quantizer."""
    rows, cols = w.shape
    scale = torch.ones(math.ceil(rows / bn), math.ceil(cols / bk))
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            blk = w[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk].float()
            amax = blk.abs().max().item()
            s = amax / E4M3_MAX if amax > 0 else 1.0
            scale[i, j] = s
            q[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk] = (blk / s).to(torch.float8_e4m3fn)
    return q, scale


def block_dequantize(q: torch.Tensor, scale: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    out = q.float()
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            out[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk] *= scale[i, j]
    return out


def fake_quant_rows(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [..., K] rounded through e4m3 with one scale per row and `group` columns."""
    out = torch.empty_like(x, dtype=torch.float32)
    for j in range(0, x.shape[-1], group):
        g = x[..., j : j + group].float()
        amax = g.abs().amax(-1, keepdim=True)
        s = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        out[..., j : j + group] = (g / s).to(torch.float8_e4m3fn).float() * s
    return out.to(x.dtype)


def _quantized(name: str, t: torch.Tensor) -> bool:
    return t.dim() == 2 and name.endswith(".weight") and not any(k in name for k in KEEP_FLOAT)


@pytest.fixture(scope="module")
def fp8_dirs(tmp_path_factory) -> dict[str, tuple[Path, Path, Path]]:
    """family -> (float checkpoint, fp8 checkpoint, dequantized float checkpoint)."""
    out = {}
    for family in FAMILIES:
        base = tmp_path_factory.mktemp(f"fp8_{family}")
        float_dir, fp8_dir, deq_dir = base / "float", base / "fp8", base / "dequantized"
        save_tiny_hf_model(family, float_dir, seed=5)
        state = load_file(float_dir / "model.safetensors")
        fp8_state, deq_state = {}, {}
        for name, t in state.items():
            if _quantized(name, t):
                q, s = block_quantize(t, *BLOCK)
                fp8_state[name], fp8_state[name + "_scale_inv"] = q, s
                deq_state[name] = block_dequantize(q, s, *BLOCK)
            else:
                fp8_state[name] = deq_state[name] = t
        config = json.loads((float_dir / "config.json").read_text())
        for path, tensors, quant in ((fp8_dir, fp8_state, True), (deq_dir, deq_state, False)):
            path.mkdir()
            cfg = dict(config)
            if quant:
                cfg["quantization_config"] = {
                    "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                    "weight_block_size": list(BLOCK), "modules_to_not_convert": ["lm_head"],
                }  # fmt: skip
            (path / "config.json").write_text(json.dumps(cfg))
            save_file({k: v.contiguous() for k, v in tensors.items()}, path / "model.safetensors")
        out[family] = (float_dir, fp8_dir, deq_dir)
    return out


def _experts_forward(self, hidden_states, top_k_index, top_k_weights):
    out = torch.zeros_like(hidden_states)
    for e in range(self.gate_up_proj.shape[0]):
        tok, pos = torch.where(top_k_index == e)
        if tok.numel() == 0:
            continue
        x = fake_quant_rows(hidden_states[tok], BLOCK[1])
        gate_up = F.linear(x, self.gate_up_proj[e])
        if hasattr(self, "_apply_gate"):  # DeepSeek-V4's clamped SwiGLU
            h = fake_quant_rows(self._apply_gate(gate_up), BLOCK[1])
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            h = fake_quant_rows(F.silu(gate) * up, BLOCK[1])
        y = F.linear(h, self.down_proj[e]) * top_k_weights[tok, pos, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out


def _w8a8_oracle(deq_dir: Path, per_channel: bool = False, model_cls=None,
                 fp8_experts: bool = True):
    """The transformers model (`model_cls`, else AutoModelForCausalLM) of the dequantized
    checkpoint with e4m3 activation rounding at the inputs of every quantized projection (per
    token and bk columns; per token with per-channel weights, whose experts hyla dequantizes
    at load; or without `fp8_experts`, whose experts hyla keeps dequantized)."""
    from transformers import AutoModelForCausalLM

    cls = model_cls or AutoModelForCausalLM
    model = cls.from_pretrained(deq_dir, attn_implementation="eager").float()
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and _quantized(name + ".weight", mod.weight):
            if name.endswith(("kv_b_proj", "o_a_proj")):  # hyla keeps them dequantized (MLA
                # absorbs kv_b into queries; V4's grouped o_a is read as blocks)
                continue
            group = mod.in_features if per_channel else BLOCK[1]
            mod.register_forward_pre_hook(lambda m, args, g=group: (fake_quant_rows(args[0], g),))
        if name.endswith("mlp.experts") and not per_channel and fp8_experts:
            mod.forward = types.MethodType(_experts_forward, mod)
    return model.eval()


def _hyla_logits(path: Path, ids: list[int], **kwargs) -> torch.Tensor:
    model = load_model(path, dtype="float32", progress=False, **kwargs)
    runner = SequenceRunner(model, 1, len(ids) + 8)
    return runner.step({0: ids}, all_logits=True)[0], model


@pytest.mark.parametrize("family", FAMILIES)
def test_fp8_checkpoint_matches_transformers_w8a8(fp8_dirs, family: str) -> None:
    float_dir, fp8_dir, deq_dir = fp8_dirs[family]
    ids = torch.randint(3, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    got, model = _hyla_logits(fp8_dir, ids)
    assert any(isinstance(m, Fp8Linear) for m in model.modules())
    moe = [layer.mlp for layer in model.layers if hasattr(layer.mlp, "experts")]
    assert moe and all(isinstance(m.experts, Fp8Experts) for m in moe)
    assert model.lm_head.weight.dtype == torch.float32
    with torch.no_grad():
        want = _w8a8_oracle(deq_dir)(torch.tensor([ids])).logits[0].float()
    unquantized, _ = _hyla_logits(float_dir, ids)
    err = (got - want).abs().max().item()
    assert err <= 1e-4, err
    assert err * 10 <= (unquantized - want).abs().max().item()


@pytest.mark.parametrize("family", FAMILIES)
def test_fp8_weights_stay_as_stored(fp8_dirs, family: str) -> None:
    _, fp8_dir, _ = fp8_dirs[family]
    model = load_model(fp8_dir, dtype="bfloat16", progress=False)
    stored = load_file(fp8_dir / "model.safetensors")
    name = next(n for n in stored if n.endswith("o_proj.weight") or n.endswith("out_proj.weight"))
    layer = int(name.split(".")[2])
    mixer = model.layers[layer].mixer
    proj = mixer.o_proj if hasattr(mixer, "o_proj") else mixer.out_proj
    assert proj.weight.dtype == torch.float8_e4m3fn
    assert torch.equal(proj.weight.view(torch.uint8), stored[name].view(torch.uint8))
    assert torch.equal(proj.weight_scale_inv, stored[name + "_scale_inv"])
    fp8_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bf16 = load_model(fp8_dirs[family][0], dtype="bfloat16", progress=False)
    assert fp8_bytes < sum(p.numel() * p.element_size() for p in bf16.parameters())


def test_per_tensor_and_per_channel_scales(tmp_path) -> None:
    """A checkpoint without `weight_block_size` (vLLM's fp8 format): `weight_scale` per tensor
    ([]) on some projections, per output channel ([N, 1]) on the others; static `input_scale`
    tensors are skipped (activations are scaled per token at run time)."""
    family = "qwen3_next"
    float_dir, fp8_dir, deq_dir = tmp_path / "float", tmp_path / "fp8", tmp_path / "deq"
    save_tiny_hf_model(family, float_dir, seed=6)
    state = load_file(float_dir / "model.safetensors")
    fp8_state, deq_state = {}, {}
    for i, (name, t) in enumerate(sorted(state.items())):
        if not _quantized(name, t):
            fp8_state[name] = deq_state[name] = t
            continue
        rows = t.abs().amax(1, keepdim=True) if i % 2 else t.abs().amax().reshape(())
        scale = torch.where(rows > 0, rows / E4M3_MAX, torch.ones_like(rows))
        q = (t / scale).to(torch.float8_e4m3fn)
        fp8_state[name], fp8_state[name[: -len("weight")] + "weight_scale"] = q, scale
        fp8_state[name[: -len("weight")] + "input_scale"] = torch.tensor(1.0)
        deq_state[name] = q.float() * scale
    config = json.loads((float_dir / "config.json").read_text())
    quant = {"quant_method": "fp8", "activation_scheme": "static"}
    for path, tensors, cfg in ((fp8_dir, fp8_state, {**config, "quantization_config": quant}),
                               (deq_dir, deq_state, config)):  # fmt: skip
        path.mkdir()
        (path / "config.json").write_text(json.dumps(cfg))
        save_file({k: v.contiguous() for k, v in tensors.items()}, path / "model.safetensors")
    ids = torch.randint(3, 256, (24,), generator=torch.Generator().manual_seed(2)).tolist()
    got, model = _hyla_logits(fp8_dir, ids)
    linears = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert linears and all(m.block_size == (1, m.in_features) for m in linears)
    with torch.no_grad():
        want = _w8a8_oracle(deq_dir, per_channel=True)(torch.tensor([ids])).logits[0].float()
    unquantized, _ = _hyla_logits(float_dir, ids)
    err = (got - want).abs().max().item()
    assert err <= 1e-4, err
    assert err * 10 <= (unquantized - want).abs().max().item()
