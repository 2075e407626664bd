"""hyla's import graph: module circles and imports that run back up the package layering.

python3 scripts/import_graph.py    # every import counts, module-level or inside a function
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

# lowest first: a module may import its own layer and those below; a module's layer is that of
# the longest prefix listed (`hyla.x` also covers `hyla.x.y`)
LAYERS = [
    ["hyla.config", "hyla.request", "hyla.errors", "hyla.byte_sizes", "hyla.console",
     "hyla.tokens", "hyla.assets", "hyla.hf_fields", "hyla.distributed.groups",
     "hyla.structured.params"],
    ["hyla.ops"],
    ["hyla.cache", "hyla.structured"],
    ["hyla.attention_metadata", "hyla.forward_batch"],
    ["hyla.layers"],
    ["hyla.models", "hyla.multimodal", "hyla.training"],
    ["hyla.scheduler", "hyla.spec"],
    ["hyla.engine.model_runner", "hyla.engine.memory", "hyla.engine.startup",
     "hyla.engine.cuda_graphs", "hyla.engine.mixed_graphs", "hyla.engine.piecewise_graphs",
     "hyla.engine.sampler", "hyla.engine.state_copies", "hyla.engine.sampling_reference"],
    ["hyla.distributed"],
    ["hyla.engine"],
    ["hyla.server", "hyla.validate", "hyla.replicas", "hyla.plan", "hyla.bench_serve"],
    ["hyla.cli", "hyla.cli_options", "hyla.__main__", "hyla"],
]  # fmt: skip


def module_name(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, name: str) -> set[str]:
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("hyla"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if base.startswith("hyla"):
                out.add(base)
                out.update(f"{base}.{a.name}" for a in node.names)
    return out


def layer_of(module: str) -> int:
    best, layer = -1, len(LAYERS)
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, layer = len(prefix), i
    return layer


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def main() -> None:
    files = {module_name(p): p for p in sorted(Path("hyla").rglob("*.py"))}
    graph = {m: {i for i in imports(p, m) if i in files and i != m} for m, p in files.items()}
    for m in graph:  # `import hyla.a.b` also runs hyla.a's __init__: not counted as an edge
        graph[m] = {i for i in graph[m] if not m.startswith(i + ".")}
    found = circles(graph)
    for comp in found:
        print("circle:", " <-> ".join(comp))
    up = [(m, i) for m, deps in graph.items() for i in deps if layer_of(i) > layer_of(m)]
    for m, i in sorted(up):
        print(f"up: {m} -> {i}")
    print(f"{len(found)} circles, {len(up)} imports up the layering, {len(files)} modules")


if __name__ == "__main__":
    main()
