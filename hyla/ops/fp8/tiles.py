"""fp8 kernel tiles (tuning only) and their picks: the device's `tuned_*.json` beside this file
(bench/gpu_fp8_sweep.py --write-table), else the defaults."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

ROW_BUCKETS = (1, 4, 16, 64)  # rows the sweep measures; a call takes the next bucket up
GEMV_ROWS = 4
FUSED_ROWS = 64  # rows up to which the GEMM quantizes x in registers


def _pow2(name: str, value: int, lo: int, hi: int) -> None:
    if not (lo <= value <= hi and value & (value - 1) == 0):
        raise ValueError(f"{name}={value}: a power of two in {lo} .. {hi}")


def _at_least(name: str, value: int, lo: int) -> None:
    if value < lo:
        raise ValueError(f"{name}={value}: must be >= {lo}")


@dataclass(frozen=True)
class GemvConfig:
    """`kernels.fp8_gemv` tiles (`depth`: K per load; `prefetch`: the next tile into registers)."""

    cols: int = 4
    depth: int = 2048
    rows: int = 1
    split_k: int = 1
    warps: int = 4
    stages: int = 1
    prefetch: bool = False

    def __post_init__(self) -> None:
        _pow2("cols", self.cols, 1, 256)
        _pow2("depth", self.depth, 16, 8192)
        _pow2("rows", self.rows, 1, 64)
        _pow2("warps", self.warps, 1, 16)
        _at_least("split_k", self.split_k, 1)
        _at_least("stages", self.stages, 1)


@dataclass(frozen=True)
class GemmConfig:
    """`kernels.fp8_gemm` tiles; `fused`: x quantized in registers by every N-block program."""

    block_m: int = 64
    block_n: int = 128
    split_k: int = 1
    warps: int = 4
    stages: int = 3
    fused: bool = True

    def __post_init__(self) -> None:
        _pow2("block_m", self.block_m, 16, 256)
        _pow2("block_n", self.block_n, 16, 256)
        _pow2("warps", self.warps, 1, 16)
        _at_least("split_k", self.split_k, 1)
        _at_least("stages", self.stages, 1)


@dataclass(frozen=True)
class MoeTiles:
    """`moe_kernels.fp8_moe_experts` tiles: gate_*/down_* GEMV form, block_*/grouped_* grouped."""

    gate_rows: int = 4
    depth: int = 2048
    gate_warps: int = 8
    down_cols: int = 4
    down_depth: int = 512
    down_warps: int = 4
    block_m: int = 16
    block_n: int = 64
    grouped_warps: int = 4
    grouped_stages: int = 3
    grouped_fused: bool = True

    def __post_init__(self) -> None:
        for name in ("gate_rows", "down_cols"):
            _pow2(name, getattr(self, name), 1, 256)
        for name in ("depth", "down_depth"):
            _pow2(name, getattr(self, name), 16, 8192)
        for name in ("block_m", "block_n"):
            _pow2(name, getattr(self, name), 16, 256)
        for name in ("gate_warps", "down_warps", "grouped_warps"):
            _pow2(name, getattr(self, name), 1, 16)
        _at_least("grouped_stages", self.grouped_stages, 1)


def row_bucket(rows: int) -> int | None:
    return next((b for b in ROW_BUCKETS if rows <= b), None)


def linear_key(rows: int, out_features: int, in_features: int) -> str:
    return f"{row_bucket(rows)}x{out_features}x{in_features}"


def moe_key(tokens: int, num_experts: int, top_k: int, inter: int, dim: int) -> str:
    return f"{row_bucket(tokens)}x{num_experts}x{top_k}x{inter}x{dim}"


def config_to_json(config: GemvConfig | GemmConfig | MoeTiles) -> dict[str, Any]:
    kind = {GemvConfig: "gemv", GemmConfig: "gemm", MoeTiles: "moe"}[type(config)]
    return {"kernel": kind, **asdict(config)}


def config_from_json(entry: dict[str, Any]) -> GemvConfig | GemmConfig | MoeTiles:
    cls = {"gemv": GemvConfig, "gemm": GemmConfig, "moe": MoeTiles}.get(entry.get("kernel"))
    if cls is None:
        raise ValueError(f"tuned table entry {entry}: kernel must be gemv, gemm or moe")
    names = {f.name for f in fields(cls)}
    unknown = set(entry) - names - {"kernel"}
    if unknown:
        raise ValueError(f"tuned table entry {entry}: unknown fields {sorted(unknown)}")
    return cls(**{k: v for k, v in entry.items() if k in names})


def table_json(
    device: str, linear: dict[str, GemvConfig | GemmConfig], moe: dict[str, MoeTiles],
    source: str,
) -> dict[str, Any]:  # fmt: skip
    return {
        "device": device,
        "source": source,
        "linear": {key: config_to_json(c) for key, c in sorted(linear.items())},
        "moe": {key: config_to_json(c) for key, c in sorted(moe.items())},
    }


PARTS = {"linear": (GemvConfig, GemmConfig), "moe": (MoeTiles,)}


def load_tables(folder: Path) -> MappingProxyType:
    """{device: {"linear": {key: config}, "moe": {...}}}; a device's files merge in name order."""
    tables: dict[str, dict[str, dict]] = {}
    for path in sorted(folder.glob("tuned_*.json")):
        raw = json.loads(path.read_text())
        parts = tables.setdefault(raw["device"], {part: {} for part in PARTS})
        for part, kinds in PARTS.items():
            parts[part].update(_part(path, raw, part, kinds))
    return MappingProxyType(
        {device: MappingProxyType({part: MappingProxyType(c) for part, c in parts.items()})
         for device, parts in tables.items()}
    )  # fmt: skip


def _part(path: Path, raw: dict, part: str, kinds: tuple[type, ...]) -> dict:
    configs = {key: config_from_json(e) for key, e in raw.get(part, {}).items()}
    wrong = [key for key, c in configs.items() if not isinstance(c, kinds)]
    if wrong:
        raise ValueError(
            f"{path.name}: {part} entries {wrong} are not {[k.__name__ for k in kinds]}"
        )
    return configs


TABLES = load_tables(Path(__file__).parent)


def default_linear(rows: int, out_features: int, in_features: int) -> GemvConfig | GemmConfig:
    """Pre-sweep picks: narrower tiles where wide ones leave some of the H200's 132 SMs idle."""
    if rows <= GEMV_ROWS:
        return GemvConfig(cols=4 if out_features >= 512 else 2)
    block_m = min(64, max(16, 1 << (rows - 1).bit_length()))
    m_blocks = -(-rows // block_m)
    block_n = next((b for b in (128, 64) if m_blocks * -(-out_features // b) >= 132), 32)
    return GemmConfig(block_m=block_m, block_n=block_n, fused=rows <= FUSED_ROWS)


def pick_linear(
    rows: int, out_features: int, in_features: int, device_name: str | None = None,
    tables: MappingProxyType = TABLES,
) -> GemvConfig | GemmConfig:  # fmt: skip
    table = tables.get(device_name, {}).get("linear", {})
    found = table.get(linear_key(rows, out_features, in_features))
    return found or default_linear(rows, out_features, in_features)


def pick_moe(
    tokens: int, num_experts: int, top_k: int, inter: int, dim: int,
    device_name: str | None = None, tables: MappingProxyType = TABLES,
) -> MoeTiles:  # fmt: skip
    table = tables.get(device_name, {}).get("moe", {})
    return table.get(moe_key(tokens, num_experts, top_k, inter, dim)) or MoeTiles()
