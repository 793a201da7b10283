"""
The layout rules of lockservice/: its modules import one another one way
(no cycle anywhere, counting imports made only for type checking and
imports inside functions), no module is over 600 lines and no class over
400.  (The layers themselves, which imports which, are setup.cfg's
import-linter contracts.)
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

import lockservice

ROOT = Path(lockservice.__file__).resolve().parent
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400


def _modules() -> Dict[str, Path]:
    """
    Every module of the package, by dotted name (a package by its name).
    """
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _resolve(name: str, modules: Dict[str, Path]) -> Optional[str]:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def importGraph() -> Dict[str, Set[str]]:
    """
    Which modules of the package each one imports, anywhere in it.
    """
    modules = _modules()
    graph: Dict[str, Set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                # "from package import module" imports the module.
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                            for a in node.names}
        graph[name] = {r for t in targets if t.startswith("lockservice")
                       for r in [_resolve(t, modules)] if r is not None and r != name}
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """
    The strongly connected components of more than one module (Tarjan).
    """
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_anywhere_in_lockservice() -> None:
    assert cycles(importGraph()) == []


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_an_import_only_for_type_checking_counts() -> None:
    graph = importGraph()
    # lockservice.cluster.deciding names the cluster's collaborators for the
    # type checker only: those imports are in the graph.
    assert "lockservice.cluster.following" in graph["lockservice.cluster.deciding"]


def test_no_module_or_class_is_too_long() -> None:
    long = []
    for name, path in _modules().items():
        text = path.read_text()
        lines = text.count("\n")
        if lines > MAX_MODULE_LINES:
            long.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    long.append(f"{name}.{node.name}: {size} lines")
    assert long == []
