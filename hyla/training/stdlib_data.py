"""The Python standard library as a corpus, split by module name into train and held-out.

The split is a pure function of the dotted module name (`split_of`), so it is the same on every
machine and every Python version: a module held out here is held out everywhere, and the
tokenizer and the model never see held-out modules.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

HELDOUT_PERCENT = 5
MAX_FILE_BYTES = 300_000
# Top-level packages that are data rather than code (codec tables, help text, build data).
EXCLUDED_TOP = frozenset({"site-packages", "pydoc_data", "encodings", "lib-dynload"})


def stdlib_root() -> Path:
    """The running interpreter's standard-library directory (`sysconfig` "stdlib")."""
    return Path(sysconfig.get_paths()["stdlib"])


def module_name(root: Path, path: Path) -> str:
    """Dotted module name of `path` under `root` (`json/decoder.py` -> `json.decoder`)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def split_of(name: str) -> str:
    """Return "heldout" for about HELDOUT_PERCENT % of module names (by SHA-256), else "train"."""
    digest = hashlib.sha256(name.encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT else "train"


def _excluded(root: Path, path: Path) -> bool:
    rel = path.relative_to(root).parts
    if rel[0] in EXCLUDED_TOP or rel[0].startswith("config-") or rel[0].startswith("_sysconfig"):
        return True
    return "__pycache__" in rel or path.stat().st_size > MAX_FILE_BYTES


def iter_modules(root: Path | None = None, split: str | None = None) -> list[tuple[str, Path]]:
    """(module name, path) of every stdlib `*.py` file kept, sorted by name.

    Args:
        root: the stdlib directory (default: `stdlib_root()`).
        split: "train" or "heldout" to keep one side only; None keeps both.
    """
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
    """The file's text, or None when it is not valid UTF-8 (a few test files are not)."""
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
