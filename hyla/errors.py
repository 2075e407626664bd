"""The typed errors of a request that cannot be served; each names the offending field."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request is malformed or cannot be served; `field` names the offending input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple:  # crosses the engine-core process boundary as it is
        return type(self), (self.field, self.message)


class SamplingParamsError(InvalidRequestError):
    """A `SamplingParams` field is out of range or of the wrong type."""


class QueueFullError(RuntimeError):
    """The waiting queue holds `max_queue_len` requests; retry after `retry_after` seconds."""

    def __init__(self, max_queue_len: int, retry_after: int = 1) -> None:
        super().__init__(f"max_queue_len: the queue is full ({max_queue_len} waiting requests)")
        self.max_queue_len = max_queue_len
        self.retry_after = retry_after

    def __reduce__(self) -> tuple:
        return type(self), (self.max_queue_len, self.retry_after)
