"""Tile configs of the fp8 kernels (`kernels.py`, `moe_kernels.py`): one frozen dataclass per
kernel and one pick function per kernel. Tiles are tuning only: every config computes the same
quantization (x per row and bk columns, as `reference.quantize_activation`) and differs from
another by the order of its fp32 sums at most.

A pick reads the measured table of its device first: `tuned_*.json` beside this file, each
{"device": torch.cuda.get_device_name(), "linear": {key: config}, "moe": {key: config}}, written
by `bench/gpu_fp8_sweep.py --write-table` and keyed by (row bucket, shape); a shape or device
the tables do not hold gets the defaults (the picks before the sweep). Loaded once at import
into read-only mappings; several files of one device merge (e.g. tuned_h200.json for the 1.5B
model's shapes, tuned_h200_big.json for the 30B model's)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

ROW_BUCKETS = (1, 4, 16, 64)  # rows the sweep measures; a call takes the next bucket up
GEMV_ROWS = 4  # rows up to which the default pick is the GEMV
FUSED_ROWS = 64  # rows up to which the GEMM quantizes x in registers


def _pow2(name: str, value: int, lo: int, hi: int) -> None:
    if not (lo <= value <= hi and value & (value - 1) == 0):
        raise ValueError(f"{name}={value}: a power of two in {lo} .. {hi}")


def _at_least(name: str, value: int, lo: int) -> None:
    if value < lo:
        raise ValueError(f"{name}={value}: must be >= {lo}")


@dataclass(frozen=True)
class GemvConfig:
    """`kernels.fp8_gemv`: program (columns, rows, split) owns `cols` output columns (narrowed
    to a power of two dividing bn) of `rows` rows of x (the weight tile is read once for them),
    loads `depth` columns of K at a time (clamped to K) in a loop over 1 / `split_k` of K
    (split_k > 1: fp32 partials summed in a fixed order by a second launch). The loop's weight
    loads overlap its sums by `stages` (Triton's software pipelining: cp.async into shared
    memory) or `prefetch` (the next tile loaded into registers first)."""

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
    """`kernels.fp8_gemm`: block_m x block_n output tiles, BLOCK_K = bk (one scale per k-step),
    K split over `split_k` programs (fp32 partials summed by a second launch), `warps`,
    `stages` (software pipelining of the k loop); `fused`: x quantized in the kernel's
    registers (one launch, but every N-block program quantizes its rows again), else once by
    `kernels.quantize_rows` (a launch before)."""

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
    """`moe_kernels.fp8_moe_experts`. GEMV form: `gate_rows` rows of I per gate/up program with
    `depth` columns of D per load and `gate_warps`; `down_cols` columns of D per down program
    with `down_depth` of I per load and `down_warps`. Grouped form: `block_m` pairs per block
    (64 past 1024 pairs), `block_n` output rows per program, `grouped_warps`, `grouped_stages`;
    `grouped_fused`: activations quantized in the GEMMs' registers (each N-block program again),
    else once per row by `kernels.quantize_rows` (a launch before each GEMM). Register counts
    for sm_90: `python3 -m tests.gpu.test_fp8_compile_sm90`."""

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
    """The smallest ROW_BUCKETS entry >= rows (None beyond the last: defaults)."""
    return next((b for b in ROW_BUCKETS if rows <= b), None)


def linear_key(rows: int, out_features: int, in_features: int) -> str:
    return f"{row_bucket(rows)}x{out_features}x{in_features}"


def moe_key(tokens: int, num_experts: int, top_k: int, inter: int, dim: int) -> str:
    return f"{row_bucket(tokens)}x{num_experts}x{top_k}x{inter}x{dim}"


def config_to_json(config: GemvConfig | GemmConfig | MoeTiles) -> dict[str, Any]:
    kind = {GemvConfig: "gemv", GemmConfig: "gemm", MoeTiles: "moe"}[type(config)]
    return {"kernel": kind, **asdict(config)}


def config_from_json(entry: dict[str, Any]) -> GemvConfig | GemmConfig | MoeTiles:
    """A table entry {"kernel": "gemv" | "gemm" | "moe", field: value, ...} -> its config."""
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
    """A tuned table as `load_tables` reads it (keys: `linear_key`, `moe_key`)."""
    return {
        "device": device,
        "source": source,
        "linear": {key: config_to_json(c) for key, c in sorted(linear.items())},
        "moe": {key: config_to_json(c) for key, c in sorted(moe.items())},
    }


PARTS = {"linear": (GemvConfig, GemmConfig), "moe": (MoeTiles,)}  # a table's parts: their kinds


def load_tables(folder: Path) -> MappingProxyType:
    """{device name: {"linear": {key: config}, "moe": {key: config}}} from folder/tuned_*.json
    (read-only mappings); files of one device merge, in name order (a later key wins)."""
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
    """The picks before the sweep. GEMV up to GEMV_ROWS rows: 4 columns per program (2 below
    512 outputs, so that small projections still spread over the SMs), all of K <= 2048 per
    load. GEMM: BLOCK_M the rows rounded up to a power of two (16 .. 64), BLOCK_N the widest of
    128 / 64 that still gives >= 132 programs (one per H200 SM), else 32; x quantized in the
    kernel up to FUSED_ROWS rows."""
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
    """The kernel and tiles of an [rows, in_features] x [out_features, in_features]^T product:
    the device's table entry for (row bucket, N, K), else `default_linear`."""
    table = tables.get(device_name, {}).get("linear", {})
    found = table.get(linear_key(rows, out_features, in_features))
    return found or default_linear(rows, out_features, in_features)


def pick_moe(
    tokens: int, num_experts: int, top_k: int, inter: int, dim: int,
    device_name: str | None = None, tables: MappingProxyType = TABLES,
) -> MoeTiles:  # fmt: skip
    """The experts' tiles for `tokens` tokens over E experts (top k, I, D): the device's table
    entry, else MoeTiles()."""
    table = tables.get(device_name, {}).get("moe", {})
    return table.get(moe_key(tokens, num_experts, top_k, inter, dim)) or MoeTiles()
