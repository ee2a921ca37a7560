"""The modules of ``forge_core`` and ``forge_plugins`` import one another without a
cycle, counting the imports inside functions too: an import deferred into a function
keeps ``forge-run check`` light, it must not hide two modules that need each other."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def import_graph(package: str, root: Path = REPO) -> dict[str, set[str]]:
    """``module -> the modules of the package it imports`` (anywhere in its source)."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        graph[name] = {m for m in found if m in files and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                found.append(path[path.index(dep):] + [node, dep] if dep in path else [node, dep])
            elif dep not in state:
                visit(dep, path + [node])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_no_import_cycle_in_the_kernel_or_the_built_in_plugins():
    graph = {**import_graph("forge_core"), **import_graph("forge_plugins")}
    assert len(graph) > 100 and graph["forge_plugins.attention.flex"]  # the walk saw the packages
    assert cycles(graph) == []


def test_the_cycle_check_sees_a_cycle_hidden_in_a_function(tmp_path):
    """The shape the FlexAttention modules had: each imports the other inside a function."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/__init__.py").write_text("")
    (tmp_path / "pkg/kernel.py").write_text("def attend():\n    from pkg.backward import grad\n")
    (tmp_path / "pkg/backward.py").write_text("def grad():\n    from pkg import kernel\n")
    (tmp_path / "pkg/user.py").write_text("import pkg.kernel\n")
    graph = import_graph("pkg", tmp_path)
    assert graph["pkg.user"] == {"pkg.kernel"}
    assert cycles(graph) == [["pkg.backward", "pkg.kernel", "pkg.backward"]]
    (tmp_path / "pkg/backward.py").write_text("def grad():\n    pass\n")
    assert cycles(import_graph("pkg", tmp_path)) == []
