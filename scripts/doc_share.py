"""Share of hyla/'s lines that are docstrings or comments (issue 29's goal: <= 10%).

    python3 scripts/doc_share.py [PATH ...]    # default: hyla; --by-file lists the files
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def counts(src: str) -> tuple[int, int, int]:
    """(lines, docstring lines, comment lines) of one file."""
    doc = 0
    for node in ast.walk(ast.parse(src)):
        body = getattr(node, "body", None) if isinstance(node, DOCUMENTED) else None
        first = body[0] if body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            if isinstance(first.value.value, str):
                doc += first.end_lineno - first.lineno + 1
    tokens = tokenize.generate_tokens(io.StringIO(src).readline)
    comments = sum(1 for t in tokens if t.type == tokenize.COMMENT)
    return len(src.splitlines()), doc, comments


def main(argv: list[str]) -> None:
    by_file = "--by-file" in argv
    roots = [Path(a) for a in argv if not a.startswith("--")] or [Path("hyla")]
    files = sorted(f for r in roots for f in ([r] if r.is_file() else r.rglob("*.py")))
    total = [0, 0, 0]
    for f in files:
        row = counts(f.read_text())
        total = [a + b for a, b in zip(total, row, strict=True)]
        if by_file:
            print(f"{(row[1] + row[2]) / max(row[0], 1):6.1%} {row[0]:6d} {f}")
    lines, doc, com = total
    print(f"{lines} lines, {doc} docstring + {com} comment = {(doc + com) / lines:.1%}")


if __name__ == "__main__":
    main(sys.argv[1:])
