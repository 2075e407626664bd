"""Write a validate run as `report.md`, `report.html` and `summary.json` in one directory."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from hyla.validate.result import CheckResult


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def summary(meta: dict[str, Any], results: list[CheckResult]) -> dict[str, Any]:
    return {
        **meta,
        "passed": all(r.passed for r in results),
        "checks": {
            r.name: {"status": r.status, "bound": r.bound, "reason": r.reason,
                     "metrics": r.metrics, "failures": r.failures, "notes": r.notes,
                     "plots": r.plots}
            for r in results
        },
    }  # fmt: skip


def _cell(value: Any) -> str:
    return _fmt(value).replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(map(_cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def markdown(meta: dict[str, Any], results: list[CheckResult]) -> str:
    verdict = "PASS" if all(r.passed for r in results) else "FAIL"
    lines = [f"# hyla validate: {meta['model']}", "",
             f"**{verdict}** · device {meta['device']} · dtype {meta['dtype']} · "
             f"{'quick' if meta['quick'] else 'full'} · commit {meta.get('commit', '?')}", "",
             "| check | status | bound |", "|---|---|---|"]  # fmt: skip
    lines += [f"| {r.title} | {r.status} | {_cell(r.bound or r.reason)} |" for r in results]
    for r in results:
        lines += ["", f"## {r.title}: {r.status}", ""]
        if r.reason:
            lines += [r.reason, ""]
        lines += [f"- FAIL: {f}" for f in r.failures]
        lines += [f"- note: {n}" for n in r.notes]
        if r.metrics:
            lines += [f"- {k}: {_fmt(v)}" for k, v in r.metrics.items()]
        for title, header, rows in r.tables:
            lines += ["", f"**{title}**", "", *_md_table(header, rows)]
        lines += [f"\n![{p}]({p})" for p in r.plots]
    return "\n".join(lines) + "\n"


def _html_table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def html_page(meta: dict[str, Any], results: list[CheckResult]) -> str:
    verdict = "PASS" if all(r.passed for r in results) else "FAIL"
    parts = [f"<h1>hyla validate: {html.escape(str(meta['model']))}</h1>",
             f"<p><b>{verdict}</b> &middot; device {meta['device']} &middot; dtype "
             f"{meta['dtype']}</p>",
             _html_table(["check", "status", "bound"],
                         [[r.title, r.status, r.bound or r.reason] for r in results])]  # fmt: skip
    for r in results:
        parts.append(f"<h2>{html.escape(r.title)}: {r.status}</h2>")
        if r.reason:
            parts.append(f"<p>{html.escape(r.reason)}</p>")
        parts += [f"<p style='color:#b00'>FAIL: {html.escape(f)}</p>" for f in r.failures]
        parts += [f"<p>note: {html.escape(n)}</p>" for n in r.notes]
        if r.metrics:
            parts.append(_html_table(["metric", "value"], [[k, v] for k, v in r.metrics.items()]))
        for title, header, rows in r.tables:
            parts += [f"<h3>{html.escape(title)}</h3>", _html_table(header, rows)]
        parts += [f"<img src='{html.escape(p)}' style='max-width:720px'>" for p in r.plots]
    style = (
        "body{font-family:sans-serif}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head>"
        f"<body>{''.join(parts)}</body></html>\n"
    )


def write_report(directory: Path, meta: dict[str, Any], results: list[CheckResult]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.md").write_text(markdown(meta, results))
    (directory / "report.html").write_text(html_page(meta, results))
    (directory / "summary.json").write_text(json.dumps(summary(meta, results), indent=1) + "\n")
