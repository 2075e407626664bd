"""Every test under tests/gpu carries the `gpu` marker (`pytest -m "not gpu"` leaves them out);
each module skips itself where CUDA, fla or triton is missing."""

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.gpu)
