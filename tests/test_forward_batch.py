"""`ForwardBatch.shared`: a value computed once per forward pass and shared by its layers, never
carried into the next pass (a static-shape batch is reused with new contents every step)."""

from __future__ import annotations

import torch

from hyla.forward_batch import allocate_caches, build_forward_batch
from hyla.models.loader import build_empty_model
from hyla.models.registry import config_from_hf
from tests.hf_tiny import tiny_hf_config


def test_shared_computes_once_per_key() -> None:
    batch = build_forward_batch([2, 1], [0, 3], [[0], [1]], [0, 1], 16, [])
    calls = []
    first = batch.shared("k", lambda: calls.append(1) or torch.ones(1))
    assert batch.shared("k", lambda: calls.append(1) or torch.zeros(1)) is first
    assert batch.shared("other", lambda: calls.append(1) or 2) == 2
    assert len(calls) == 2


def test_each_model_pass_starts_without_earlier_values() -> None:
    """A layer reading `batch.shared` in pass 2 recomputes (here: the model's forward clears
    `per_pass` first), so a value derived from last step's lengths is never reused."""
    config = config_from_hf(tiny_hf_config("kimi_linear").to_dict())
    model = build_empty_model(config.replace(dtype="float32"), "cpu")
    seen = []
    layer = model.layers[0]
    original = layer.forward

    def spy(delta, residual, positions, batch):
        seen.append(batch.shared("probe", lambda: object()))
        return original(delta, residual, positions, batch)

    layer.forward = spy
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    caches = allocate_caches(config, num_blocks=4, block_size=16, num_slots=2)
    batch = build_forward_batch([3], [0], [[0]], [0], 16, caches)
    ids = torch.tensor([1, 2, 3])
    model(ids, batch.positions, batch)
    model(ids, batch.positions, batch)
    assert len(seen) == 2 and seen[0] is not seen[1]
