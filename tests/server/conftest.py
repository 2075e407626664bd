"""Live-server fixtures: a tiny random-weight model behind a real uvicorn server on 127.0.0.1.

`make_server(**engine_options)` builds an LLMEngine over a 4-layer GDN/GQA model (the default
model's tokenizer, random weights, fixed seed), wraps it in an AsyncEngine and runs
`uvicorn.Server` in a thread on a free port. Servers stop at the end of the test module.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from hyla.config import GQAConfig, LinearAttentionConfig, ModelConfig, RopeConfig

TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "hyla" / "assets" / "default_model"
MAX_CONTEXT = 256
MODEL = "tiny"


def tiny_model_config(vocab_size: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
        layer_pattern=("gdn", "gdn", "gqa", "gdn"), ffn_pattern=("dense",) * 4,
        max_context_len=MAX_CONTEXT, eos_token_ids=(0,),
        linear=LinearAttentionConfig(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16),
        gqa=GQAConfig(num_heads=4, num_kv_heads=2, head_dim=16), rope=RopeConfig(rotary_dim=16),
    )


def load_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))


def tiny_engine(tokenizer: Any, **options: Any) -> Any:
    """A real LLMEngine over random weights (seed 0); `options` are EngineConfig fields."""
    from hyla.config import EngineConfig
    from hyla.engine.llm_engine import LLMEngine
    from hyla.models.hybrid import HybridModel

    torch.manual_seed(0)
    model = HybridModel(tiny_model_config(len(tokenizer)))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    options.setdefault("kv_cache_memory", 32 << 20)
    engine = LLMEngine(model, tokenizer, EngineConfig.from_kwargs(**options))
    engine.model_name = MODEL
    return engine


@dataclass
class LiveServer:
    url: str
    server: Any
    thread: threading.Thread
    async_engine: Any

    @property
    def engine(self) -> Any:
        return self.async_engine.engine

    def client(self, api_key: str = "none", **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0,
                             timeout=kw.pop("timeout", 30.0), **kw)

    def async_client(self, api_key: str = "none") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0,
                                  timeout=30.0)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def wait_idle(self, timeout: float = 10.0) -> Any:
        """Wait until the engine holds no request; return its stats."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.async_engine.num_in_flight() == 0 and not self.engine.has_unfinished_requests():
                return self.engine.get_stats()  # read after the check: not a running snapshot
            time.sleep(0.01)
        raise AssertionError(f"engine not idle after {timeout}s: {self.engine.get_stats()}")


def start_server(engine: Any, async_options: dict | None = None,
                 server_options: dict | None = None, **app_options: Any) -> LiveServer:
    from hyla.engine.async_engine import AsyncEngine
    from hyla.server.api import build_app
    from hyla.server.launch import bind_socket, make_server

    async_engine = AsyncEngine(engine, **(async_options or {}))
    app = build_app(async_engine, MODEL, **app_options)
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = make_server(app, async_engine, log_level="warning", drain_timeout=10,
                         **(server_options or {}))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    return LiveServer(f"http://127.0.0.1:{port}", server, thread, async_engine)


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return load_tokenizer()


@pytest.fixture(scope="module")
def make_server(tokenizer):
    """Factory: `make_server(engine_options=..., async_options=..., server_options=...,
    **app_options)` (server_options: `launch.make_server`'s, e.g. header_timeout)."""
    servers: list[LiveServer] = []

    def make(engine_options: dict | None = None, async_options: dict | None = None,
             server_options: dict | None = None, **app_options: Any) -> LiveServer:
        engine = tiny_engine(tokenizer, **(engine_options or {}))
        server = start_server(engine, async_options, server_options, **app_options)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def server(make_server) -> LiveServer:
    """A default server (no API key, no timeout) shared by a test module."""
    return make_server()
