"""Shared fixtures of the engine tests: tiny checkpoints of each family, saved and loaded once
per test module (module scope: a module's engines share the model, never its caches)."""

from __future__ import annotations

import pytest

from tests.engine.engine_util import load, save_checkpoint


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """`checkpoints(family)` -> (model, checkpoint path); the path holds the tokenizer too."""
    cache = {}

    def get(family: str):
        if family not in cache:
            path = tmp_path_factory.mktemp(family)
            save_checkpoint(family, path)
            cache[family] = (load(path), path)
        return cache[family]

    return get


@pytest.fixture(scope="module")
def kimi(checkpoints):
    """(model, checkpoint path) of the tiny Kimi-Linear."""
    return checkpoints("kimi_linear")
