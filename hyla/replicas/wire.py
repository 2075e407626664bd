"""What crosses between the front end and a replica actor. Errors travel as (class, message,
attributes): exceptions whose `__init__` takes more than a message do not survive pickling."""

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
    """`events`: (kind, request_id, payload), kind "out" (RequestOutput), "error" (WireError) or
    "done" (no final output); `load_tokens`: as of the first `admit_seq` admissions."""

    events: list[tuple[str, str, Any]]
    load_tokens: int
    admit_seq: int
    stats: Any
    cache_delta: CacheDelta | None = None
