"""The house's import structure: every room of ``forge_core`` imports only the rooms
below it, and no module of ``forge_core`` or ``forge_plugins`` takes part in an import
cycle, counting the imports made inside functions (which a cycle can hide behind)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The rooms of forge_core from the ground floor up; a room may import those before it.
FLOORS = [
    {"api", "parallel_dims", "deprecation"},
    {"errors", "hookspecs", "config", "rules", "core_rules", "specs", "run_context"},
    {"plugins"},
    {"registry", "reference"},
    {"resolve", "plan", "component_checks"},
    {"judge"},
    {"distributed"},
    {"components"},
    {"data"},
    {"train"},
    {"generate"},
    {"cli"},
    {"docgen", "testing"},
]
FLOOR = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: str) -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / package).rglob("*.py"))}


ALL = {**modules("forge_core"), **modules("forge_plugins")}


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports, anywhere in it (``from a import b`` counts
    as ``a.b`` when that is a module, else ``a``)."""
    found = set()
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != here:
                found.add(name)
    return found


GRAPH = {name: imports(path, ALL) for name, path in ALL.items()}


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "forge_core" and len(parts) > 1 else None


def test_every_room_of_the_kernel_has_a_floor():
    rooms = {room(m) for m in ALL if room(m)} - {"__main__"}
    assert rooms - set(FLOOR) == set(), "a new room of forge_core: give it a floor in FLOORS"
    assert set(FLOOR) - rooms == set(), "a room in FLOORS that no longer exists"


def test_no_room_imports_a_room_above_it():
    upward = [
        f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets
        if room(m) and room(t) and room(m) != room(t) and FLOOR[room(t)] > FLOOR[room(m)]
    ]
    assert upward == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

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
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_even_through_imports_inside_functions():
    # A package's __init__ that hands on its modules' names is not a cycle with them.
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in GRAPH.items()}
    assert _cycles(graph) == []


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_the_cycle_finder_finds_cycles(graph, expected):
    assert _cycles(graph) == expected
