"""The gap list (`hyla.models.gaps`) stays true: every row naming a hyla module names one that
exists (importable, and the attribute where one is named), every status is known, and each
family's checkpoint config picks its rows."""

from __future__ import annotations

import importlib

import pytest

from hyla.models.gaps import GAPS, gap_rows

STATUSES = {"reused", "extended", "new", "missing"}


def _exists(target: str) -> bool:
    path = target.split(" ")[0].rstrip(",")
    module, _, attr = path.partition(".")
    mod = importlib.import_module("hyla." + module.replace("/", "."))
    return not attr or hasattr(mod, attr.split("(")[0])


@pytest.mark.parametrize("family", sorted(GAPS))
def test_rows_name_existing_modules(family):
    for module, target, status in GAPS[family]:
        assert status in STATUSES, module
        assert (target == "-") == (status == "missing"), module
        if target != "-" and "/" in target.split(" ")[0]:
            assert _exists(target), (module, target)


def test_config_picks_family():
    assert gap_rows({"model_type": "glm5_next"}) == GAPS["glm5_next"]
    assert gap_rows({"model_type": "qwen3_5_text"}) == GAPS["qwen3_5"]
    assert gap_rows({"model_type": "kimi_linear"}) == ()
