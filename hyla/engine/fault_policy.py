"""A failed step ends only its own requests: the culprit when it is known, the rest on probation."""

from __future__ import annotations

import logging
from collections.abc import Callable

from hyla.engine.request_table import RequestTable
from hyla.request import RequestStatus
from hyla.scheduler import Scheduler, SchedulerOutput

logger = logging.getLogger("hyla.engine")


class FaultPolicy:
    """Requests outside a failed step keep running. The culprit, when known (alone in the step),
    ends with an error; the step's other requests are held out of the scheduler (their cache
    released: the failed forward may have half-updated their state, so they recompute) and come
    back one at a time, each alone in its steps (a neighbour would make the blame a guess) until
    it gets through a sampled step."""

    def __init__(self, scheduler: Scheduler, requests: RequestTable) -> None:
        self.scheduler, self.requests = scheduler, requests
        self.suspects: dict[str, None] = {}  # held out, in the order they come back
        self.probe: str | None = None  # the suspect back in the scheduler

    def step_failed(
        self, out: SchedulerOutput, error: Exception, finish: Callable[..., None]
    ) -> None:
        """Call inside the `except` of the failure (the log takes its traceback)."""
        ids = list(out.num_scheduled_tokens)
        logger.exception("engine step failed (%d requests)", len(ids))
        message = f"engine step failed: {type(error).__name__}: {error}"
        culprit = ids[0] if len(ids) == 1 else None
        for rid in ids:
            if rid == culprit:
                finish(rid, RequestStatus.FINISHED_ERROR, message)
            else:
                self.hold(rid)

    def hold(self, rid: str) -> None:
        req = self.requests.seqs[rid].request
        self.scheduler.finish(rid, RequestStatus.FINISHED_ABORTED)  # releases its cache
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        self.suspects[rid] = None
        self.forget_probe(rid)

    def release_suspect(self) -> None:
        """Put the next held request back into the scheduler, on probation."""
        if self.probe is not None or not self.suspects:
            return
        rid = next(iter(self.suspects))
        del self.suspects[rid]
        self.scheduler.add_request(self.requests.seqs[rid].request)
        self.probe = rid

    def schedule(self) -> SchedulerOutput:
        """The next step; the probe runs alone unless it cannot (no cache for it while the others
        hold theirs, or it waits for another's prefix)."""
        out = self.scheduler.schedule(only=self.probe)
        if out.is_empty and self.probe is not None:
            out = self.scheduler.schedule()
        return out

    def forget_probe(self, rid: str) -> None:
        """`rid` got through a sampled step, ended or was held again: no longer on probation."""
        if self.probe == rid:
            self.probe = None

    def forget(self, rid: str) -> None:
        self.suspects.pop(rid, None)
        self.forget_probe(rid)
