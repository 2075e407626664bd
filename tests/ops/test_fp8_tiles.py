"""The fp8 kernels' tile picks (`hyla.ops.fp8.tiles`): configs validate their fields, a tuned
table written the way `bench/gpu_fp8_sweep.py` writes it is read back per device, row bucket
and shape, and anything the table does not hold gets the defaults. Pure Python (no triton)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyla.ops.fp8 import tiles
from hyla.ops.fp8.tiles import GemmConfig, GemvConfig, MoeTiles

GPU = "NVIDIA H200"


def _tables(tmp_path, linear: dict, moe: dict | None = None, device: str = GPU):
    table = tiles.table_json(device, linear, moe or {}, source="test")
    (tmp_path / "tuned_test.json").write_text(json.dumps(table))
    return tiles.load_tables(tmp_path)


def test_table_round_trip_by_device_bucket_and_shape(tmp_path) -> None:
    gemv = GemvConfig(cols=16, depth=512, split_k=2, warps=8, stages=3)
    gemm = GemmConfig(block_m=16, block_n=64, split_k=4, fused=False)
    moe = MoeTiles(gate_rows=8, block_m=32, grouped_stages=4)
    tables = _tables(
        tmp_path,
        {tiles.linear_key(1, 2048, 6144): gemv, tiles.linear_key(16, 2048, 6144): gemm},
        {tiles.moe_key(16, 32, 4, 512, 2048): moe},
    )
    assert tiles.pick_linear(1, 2048, 6144, GPU, tables) == gemv
    for rows in (5, 9, 16):  # the 16-row bucket
        assert tiles.pick_linear(rows, 2048, 6144, GPU, tables) == gemm
    assert tiles.pick_moe(12, 32, 4, 512, 2048, GPU, tables) == moe


def test_tables_of_one_device_merge(tmp_path) -> None:
    # tuned_h200.json (1.5B shapes) + tuned_h200_big.json (30B shapes): both read, a key in
    # both takes the later file's entry (name order)
    small, big, both = (tiles.linear_key(1, n, 2048) for n in (2048, 4096, 6144))
    first = {small: GemvConfig(cols=8), both: GemvConfig(cols=16)}
    second = {big: GemmConfig(split_k=2), both: GemvConfig(cols=32)}
    for name, linear in (("tuned_h200.json", first), ("tuned_h200_big.json", second)):
        table = tiles.table_json(GPU, linear, {}, source="test")
        (tmp_path / name).write_text(json.dumps(table))
    got = tiles.load_tables(tmp_path)[GPU]["linear"]
    assert dict(got) == {small: first[small], big: second[big], both: second[both]}


@pytest.mark.parametrize(
    "rows, n, k, device",
    [(2, 2048, 6144, GPU), (65, 2048, 6144, GPU), (1, 2048, 2048, GPU), (1, 2048, 6144, "cpu")],
    ids=["bucket-4-absent", "past-the-buckets", "other-shape", "other-device"],
)
def test_what_the_table_lacks_gets_the_defaults(tmp_path, rows, n, k, device) -> None:
    tables = _tables(tmp_path, {tiles.linear_key(1, 2048, 6144): GemvConfig(cols=32)})
    assert tiles.pick_linear(rows, n, k, device, tables) == tiles.default_linear(rows, n, k)
    assert tiles.pick_moe(rows, 32, 4, 512, 2048, device, tables) == MoeTiles()


def test_defaults_are_the_picks_before_the_sweep() -> None:
    # the GEMV up to 4 rows (2 columns per program below 512 outputs); GEMM tiles beyond,
    # BLOCK_N narrowed until >= 132 programs; x quantized in the kernel up to 64 rows
    assert tiles.default_linear(1, 6416, 2048) == GemvConfig(cols=4, depth=2048)
    assert tiles.default_linear(4, 272, 2048) == GemvConfig(cols=2)
    assert tiles.default_linear(16, 2048, 6144) == GemmConfig(block_m=16, block_n=32)
    assert tiles.default_linear(64, 32000, 2048) == GemmConfig(block_m=64, block_n=128)
    assert tiles.default_linear(300, 2048, 2048) == GemmConfig(64, 64, fused=False)


def test_row_buckets() -> None:
    assert [tiles.row_bucket(r) for r in (1, 2, 4, 5, 16, 17, 64, 65)] == [
        1, 4, 4, 16, 16, 64, 64, None,
    ]  # fmt: skip


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: GemvConfig(cols=3), "cols"),
        (lambda: GemvConfig(depth=8), "depth"),
        (lambda: GemvConfig(split_k=0), "split_k"),
        (lambda: GemmConfig(block_m=8), "block_m"),
        (lambda: GemmConfig(stages=0), "stages"),
        (lambda: MoeTiles(grouped_warps=3), "grouped_warps"),
    ],
)
def test_configs_name_the_bad_field(make, field) -> None:
    with pytest.raises(ValueError, match=field):
        make()


def test_bad_table_entries_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown fields"):
        tiles.config_from_json({"kernel": "gemv", "colz": 4})
    with pytest.raises(ValueError, match="kernel must be"):
        tiles.config_from_json({"cols": 4})
    with pytest.raises(ValueError, match="linear entries"):
        _tables(tmp_path, {tiles.linear_key(1, 8, 8): MoeTiles()})


def test_checked_in_tables_load() -> None:
    # tuned_*.json beside the kernels (written by the sweep on the GPU): every entry is a valid
    # config of its part, and every file's device is in TABLES
    files = sorted(Path(tiles.__file__).parent.glob("tuned_*.json"))
    if not files:
        pytest.skip("no tuned table checked in yet")
    for path in files:
        parts = tiles.TABLES[json.loads(path.read_text())["device"]]
        assert all(isinstance(c, GemvConfig | GemmConfig) for c in parts["linear"].values())
        assert all(isinstance(c, MoeTiles) for c in parts["moe"].values())
