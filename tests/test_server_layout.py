"""
The layout rules of lockservice/server: its modules import one another
one way (no cycle, counting imports made only for type checking and
imports inside functions), no module is over 600 lines and no class
over 400.
"""

from __future__ import annotations

import ast
import os
from typing import Dict, List, Set

import lockservice.server

PACKAGE = "lockservice.server"
FOLDER = os.path.dirname(lockservice.server.__file__)
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400


def _modules() -> Dict[str, ast.Module]:
    found = {}
    for name in sorted(os.listdir(FOLDER)):
        if name.endswith(".py"):
            with open(os.path.join(FOLDER, name)) as f:
                found[name[:-3]] = ast.parse(f.read())
    return found


def _imports(tree: ast.Module, modules: Set[str]) -> Set[str]:
    """
    The modules of the package that C{tree} imports, anywhere in it.
    """
    out: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:
                out |= {alias.name for alias in node.names if alias.name in modules}
            elif node.module.startswith(PACKAGE + "."):
                out.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            out |= {alias.name.split(".")[2] for alias in node.names
                    if alias.name.startswith(PACKAGE + ".")}
    return out - {"__init__"}


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
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
        for w in graph.get(v, ()):
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


def test_the_server_modules_import_one_another_one_way() -> None:
    modules = _modules()
    graph = {name: _imports(tree, set(modules)) - {name} for name, tree in modules.items()}
    assert _cycles(graph) == []


def test_a_cycle_is_found() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_server_module_or_class_is_too_long() -> None:
    long = []
    for name, tree in _modules().items():
        lines = max((getattr(node, "end_lineno", 0) or 0) for node in ast.walk(tree))
        if lines > MAX_MODULE_LINES:
            long.append(f"{name}.py: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    long.append(f"{name}.{node.name}: {size} lines")
    assert long == []
