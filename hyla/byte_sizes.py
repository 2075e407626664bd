"""Byte counts as people write them: 8589934592, 8GiB, 8G (binary, as `free -h`), 8GB (decimal)."""

from __future__ import annotations

import re

UNITS = {"": 1, "B": 1, "K": 2**10, "KIB": 2**10, "M": 2**20, "MIB": 2**20, "G": 2**30,
         "GIB": 2**30, "T": 2**40, "TIB": 2**40, "KB": 10**3, "MB": 10**6, "GB": 10**9,
         "TB": 10**12}  # fmt: skip
_PATTERN = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")


def parse_bytes(value: int | str, name: str) -> int:
    """`value` in bytes. Raises ValueError naming `name` and the accepted forms."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a byte count, got {value!r}")
    if isinstance(value, int):
        return value
    match = _PATTERN.fullmatch(str(value))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in UNITS:
        raise ValueError(f"{name}: expected bytes (e.g. 8589934592) or a size such as 8GiB, "
                         f"8G, 512MiB, 8GB; got {value!r}")  # fmt: skip
    return int(float(match.group(1)) * UNITS[unit])
