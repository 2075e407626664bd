"""The OpenAI-compatible HTTP server: `build_app(async_engine, served_model_name)`.

Import `hyla.server.api` for the app factory; this package import stays light.
"""

from __future__ import annotations

__all__ = ["build_app"]


def __getattr__(name: str):
    if name == "build_app":
        from hyla.server.api import build_app

        return build_app
    raise AttributeError(name)
