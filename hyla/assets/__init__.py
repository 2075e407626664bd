"""Files shipped inside the package: the embedded default model (`default_model/`)."""

from __future__ import annotations

from pathlib import Path


def default_model_path() -> Path:
    """Directory of the embedded default model (hyla layout; see docs/model_card.md)."""
    return Path(__file__).resolve().parent / "default_model"
