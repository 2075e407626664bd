"""What one check of `hyla validate` found (plain data, written by `hyla.validate.report`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PASS, FAIL, SKIP = "pass", "fail", "skipped"


@dataclass
class CheckResult:
    """`status`: pass / fail / skipped; `bound`: what passing means; `notes`: what it left out."""

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
