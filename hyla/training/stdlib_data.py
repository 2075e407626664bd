"""The Python standard library as a corpus, split into train and held-out by a hash of the module
name: the same split on every machine and Python version."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

HELDOUT_PERCENT = 5
MAX_FILE_BYTES = 300_000
# Top-level packages that are data rather than code.
EXCLUDED_TOP = frozenset({"site-packages", "pydoc_data", "encodings", "lib-dynload"})


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def split_of(name: str) -> str:
    """Return "heldout" for about HELDOUT_PERCENT % of names (by SHA-256), else "train"."""
    digest = hashlib.sha256(name.encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT else "train"


def _excluded(root: Path, path: Path) -> bool:
    rel = path.relative_to(root).parts
    if rel[0] in EXCLUDED_TOP or rel[0].startswith("config-") or rel[0].startswith("_sysconfig"):
        return True
    return "__pycache__" in rel or path.stat().st_size > MAX_FILE_BYTES


def iter_modules(root: Path | None = None, split: str | None = None) -> list[tuple[str, Path]]:
    """(module name, path) of every kept stdlib `*.py`, sorted; `split` keeps one side."""
    root = root or stdlib_root()
    out = []
    for path in root.rglob("*.py"):
        if _excluded(root, path):
            continue
        name = module_name(root, path)
        if split is None or split_of(name) == split:
            out.append((name, path))
    return sorted(out)


def read_source(path: Path) -> str | None:
    """The file's text, or None when it is not valid UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
