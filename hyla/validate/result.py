"""What one check of `hyla validate` found: pass/fail against its stated bound, its numbers,
its tables and plots. Plain data, written out by `hyla.validate.report`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PASS, FAIL, SKIP = "pass", "fail", "skipped"


@dataclass
class CheckResult:
    """One check: `status` is pass / fail / skipped; `bound` says in words what passing means;
    `metrics` are JSON numbers; `tables` are (title, header, rows); `plots` are PNG file names
    inside the report directory; `failures` name what broke (e.g. the first bad position);
    `notes` what the bound left out and why (e.g. positions after a reference's indexer tie)."""

    name: str
    title: str
    status: str = PASS
    bound: str = ""
    reason: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    tables: list[tuple[str, list[str], list[list[Any]]]] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fail(self, message: str) -> None:
        self.status = FAIL
        self.failures.append(message)

    @property
    def passed(self) -> bool:
        return self.status != FAIL


def skipped(name: str, title: str, reason: str) -> CheckResult:
    return CheckResult(name=name, title=title, status=SKIP, reason=reason)
