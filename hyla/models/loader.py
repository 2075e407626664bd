"""Load a checkpoint directory into a HybridModel: names and shapes are checked from the headers
first, then tensors copied one at a time (peak memory: the model plus one tensor)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from hyla.config import ConfigError, ModelConfig, QuantizationConfig
from hyla.models.checkpoint import (
    CheckpointError,
    Entry,
    dequantize_fp8,
    plan_checkpoint,
    targets_of,
)
from hyla.models.hybrid import HybridModel
from hyla.models.quantization import (
    choose_fp8,
    convert_modules,
    defers,
    dequantize_stored,
    fill_fp8,
    quantization_from_hf,
    scale_block,
)
from hyla.models.registry import config_from_hf
from hyla.models.weights import Placement
from hyla.ops.fp8 import FP8

__all__ = [
    "CheckpointError",
    "build_empty_model",
    "checkpoint_files",
    "dequantize_fp8",
    "load_config",
    "load_model",
    "load_weights",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_INIT_FNS = (
    "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
    "sparse_",
)  # fmt: skip


def config_path(path: str | Path) -> Path:
    path = Path(path)
    return path / "config.json" if path.is_dir() else path


def load_config(path: str | Path) -> ModelConfig:
    """ModelConfig of a checkpoint directory or config.json, plus the eos ids of a sibling
    generation_config.json (chat models stop on more). Raises ConfigError, FileNotFoundError."""
    file = config_path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no config.json at {file}")
    raw = _read_json(file)
    config = config_from_hf(raw)
    if config.quantization is None and isinstance(raw, dict):
        config = config.replace(quantization=quantization_from_hf(raw))
    gen_file = file.parent / "generation_config.json"
    if config.architecture != "hyla" and gen_file.is_file():
        extra = _read_json(gen_file).get("eos_token_id")
        extra = extra if isinstance(extra, list) else [extra]
        ids = list(config.eos_token_ids)
        ids += [i for i in extra if isinstance(i, int) and i not in ids]
        config = config.replace(eos_token_ids=tuple(ids))
    return config


def _read_json(file: Path) -> dict:
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"config: {file} is not valid JSON ({e})") from e


def checkpoint_files(path: str | Path) -> list[Path]:
    """The shards named by `model.safetensors.index.json`, else `model.safetensors`, else every
    `*.safetensors`. Raises CheckpointError when there is none (or a listed shard is absent)."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / s for s in shards]
        absent = [str(f) for f in files if not f.is_file()]
        if absent:
            raise CheckpointError(f"shards listed in {index.name} are absent: {absent}")
        return files
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {path}")
    return files


@contextmanager
def _allocate_only(dtype: torch.dtype, defer_fp8: bool = False) -> Iterator[None]:
    """While building: floating parameters empty in `dtype` (float32 for `keep_fp32` names; fp8
    stays), no init; buffers keep dtype and values. `defer_fp8`: fp8 candidates stay on meta."""

    def cast(module: nn.Module, name: str, param: nn.Parameter | None) -> nn.Parameter | None:
        if param is None or getattr(param, "_hyla_allocated", False):
            return None  # re-registration of an allocated parameter (tied weights)
        keep = param.is_floating_point() and name in getattr(module, "keep_fp32", ())
        target = torch.float32 if keep else dtype if param.is_floating_point() else param.dtype
        target = FP8 if param.dtype == FP8 else target
        device = "meta" if defer_fp8 and defers(module, name) else None
        new = torch.empty_like(param, dtype=target, device=device)
        new = nn.Parameter(new, requires_grad=False)
        new._hyla_allocated = True
        return new

    saved = {name: getattr(nn.init, name) for name in _INIT_FNS}
    handle = nn.modules.module.register_module_parameter_registration_hook(cast)
    try:
        for name in _INIT_FNS:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        handle.remove()
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def build_empty_model(config: ModelConfig, device: str | torch.device = "cpu") -> HybridModel:
    """HybridModel with uninitialised parameters in `config.dtype` on `device` (fp8 candidates
    stay on meta until `load_weights` decides their storage)."""
    defer = config.quantization is not None
    with torch.device(device), _allocate_only(DTYPES[config.dtype], defer):
        return HybridModel(config)


def _copy_entry(
    entry: Entry, open_file, targets: dict[str, torch.Tensor], model: HybridModel
) -> None:
    tensor = open_file(entry.file).get_tensor(entry.name)
    scale = None
    if entry.scale is not None:
        scale = open_file(entry.scale[1]).get_tensor(entry.scale[0])
    quant = model.config.quantization
    src_block = quant.weight_block_size if quant is not None else None
    if scale is not None and len(entry.placements) > 1:  # a stored tensor split across targets
        tensor, scale = dequantize_stored(tensor, scale, src_block), None
    offset = 0
    for p in entry.placements:
        dst = p.view(targets[p.target])
        src = tensor if len(entry.placements) == 1 else tensor[offset : offset + dst.shape[0]]
        offset += dst.shape[0]
        if dst.dtype == FP8:
            owner, _, leaf = p.target.rpartition(".")
            block, parts = scale_block(model.get_submodule(owner), leaf)
            scale_name = p.target + "_scale_inv"
            dst_scale = Placement(scale_name, p.expert, p.part, p.num_parts).view(
                targets[scale_name])  # fmt: skip
            fill_fp8(dst, dst_scale, src, scale, block, parts // p.num_parts, src_block)
        elif scale is not None:
            dst.copy_(dequantize_stored(src, scale, src_block))
        else:
            dst.copy_(src)


@torch.no_grad()
def load_weights(
    model: HybridModel, path: str | Path, progress: bool = True, quantize_floats: bool = False
) -> None:
    """Copy a checkpoint's tensors into `model`; with `config.quantization`, fp8-stored modules
    (all candidates with `quantize_floats`) become fp8 first. Raises CheckpointError."""
    files = checkpoint_files(path)
    targets, aliases = targets_of(model)
    entries = plan_checkpoint(model.config, targets, aliases, files)
    if model.config.quantization is not None:
        stored_fp8 = {p.target for e in entries if e.scale is not None for p in e.placements}
        chosen = choose_fp8(model, stored_fp8, quantize_floats)
        device = model.embed_tokens.weight.device
        convert_modules(model, chosen, DTYPES[model.config.dtype], device)
        targets, aliases = targets_of(model)
    handles: dict[Path, object] = {}

    def open_file(file: Path):
        if file not in handles:
            handles[file] = safe_open(str(file), framework="pt")
        return handles[file]

    by_file: dict[Path, list[Entry]] = {}
    for entry in entries:
        by_file.setdefault(entry.file, []).append(entry)
    bar = tqdm(total=len(entries), desc="Loading weights", unit="tensor", disable=not progress)
    try:
        for file in files:  # shard by shard: a shard's handle is dropped once it is read
            for entry in by_file.get(file, []):
                _copy_entry(entry, open_file, targets, model)
                bar.update(1)
            handles.clear()
    finally:
        bar.close()
        handles.clear()


def load_model(
    path: str | Path,
    dtype: str | None = None,
    device: str | torch.device = "cpu",
    progress: bool = True,
    *,
    quantization: str | None = None,
    kv_cache_dtype: str | None = None,
    mamba_ssm_cache_dtype: str | None = None,
) -> HybridModel:
    """Build a checkpoint's HybridModel and load it (eval); `dtype` None keeps the checkpoint's,
    `quantization` "fp8" quantizes float weights. Raises ConfigError, CheckpointError."""
    config = load_config(path)
    if dtype is not None:
        if dtype not in DTYPES:
            raise ConfigError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
        config = config.replace(dtype=dtype)
    quantize_floats = quantization is not None and config.quantization is None
    if quantization is not None and quantization != "fp8":
        raise ConfigError(f"quantization: expected 'fp8' or None, got {quantization!r}")
    if quantize_floats:
        config = config.replace(quantization=QuantizationConfig())
    caches = {"kv_cache_dtype": kv_cache_dtype, "mamba_ssm_cache_dtype": mamba_ssm_cache_dtype}
    config = config.replace(**{k: v for k, v in caches.items() if v is not None})
    model = build_empty_model(config, device)
    load_weights(model, Path(path), progress, quantize_floats)
    return model.eval()
