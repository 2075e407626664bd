"""What crosses between the front end and a replica actor, besides plain values.

Exceptions whose `__init__` takes other arguments than their message (InvalidRequestError,
QueueFullError) do not survive pickling, so errors travel as (class, message, attributes) and
are rebuilt on the front end as the same class with the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hyla.replicas.router import CacheDelta

WireError = tuple[type, str, dict]


def to_wire(error: BaseException) -> WireError:
    return type(error), str(error), dict(vars(error))


def from_wire(wire: WireError) -> BaseException:
    cls, message, attributes = wire
    error = cls.__new__(cls)
    error.args = (message,)
    error.__dict__.update(attributes)
    return error


@dataclass(frozen=True)
class Report:
    """One poll's answer: stream events [(kind, request_id, payload)] with kind "out" (a
    RequestOutput), "error" (a WireError) or "done" (no payload: ended without a final
    output); the replica's load in tokens of running and waiting requests as of its first
    `admit_seq` admissions; its engine stats; a change of its prefix-cache keys."""

    events: list[tuple[str, str, Any]]
    load_tokens: int
    admit_seq: int
    stats: Any
    cache_delta: CacheDelta | None = None
