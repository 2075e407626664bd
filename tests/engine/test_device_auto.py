"""`--device auto` (the default) picks the GPU when torch sees one, else the CPU."""

import torch

from hyla.config import EngineConfig
from hyla.engine.loading import resolve_device


def test_auto_is_the_default_and_follows_cuda(monkeypatch):
    config = EngineConfig()
    assert config.device == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(config).device == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device(config).device == "cuda"


def test_an_explicit_device_is_kept(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device(EngineConfig(device="cpu")).device == "cpu"
