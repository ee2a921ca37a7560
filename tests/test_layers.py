"""The house's import structure: every room of ``forge_core`` imports only the rooms
below it, and no module of ``forge_core`` or ``forge_plugins`` takes part in an import
cycle, counting the imports made inside functions (which a cycle can hide behind)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The rooms of forge_core from the ground floor up; a room may import those before it.
FLOORS = [
    {"api", "parallel_dims", "hardware"},
    {"kinds"},
    {"errors", "hookspecs", "config", "rules", "core_rules"},
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


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(packages: tuple[str, ...], root: Path = ROOT) -> dict[str, set[str]]:
    """``module -> the modules of ``packages`` it imports``, anywhere in its source
    (``from a import b`` counts as ``a.b`` when that is a module, else ``a``)."""
    files = {module_name(p, root): p for package in packages for p in sorted((root / package).rglob("*.py"))}
    graph = {}
    for here, path in files.items():
        package = here if path.name == "__init__.py" else here.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != here:
                    found.add(name)
        graph[here] = found
    return graph


GRAPH = import_graph(("forge_core", "forge_plugins"))


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "forge_core" and len(parts) > 1 else None


def test_every_room_of_the_kernel_has_a_floor():
    rooms = {room(m) for m in GRAPH if room(m)} - {"__main__"}
    assert rooms - set(FLOOR) == set(), "a new room of forge_core: give it a floor in FLOORS"
    assert set(FLOOR) - rooms == set(), "a room in FLOORS that no longer exists"


def upward(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{m} -> {t}"
        for m, targets in sorted(graph.items())
        for t in sorted(targets)
        if room(m) and room(t) and room(m) != room(t) and FLOOR[room(t)] > FLOOR[room(m)]
    ]


def test_no_room_imports_a_room_above_it():
    assert upward(GRAPH) == []


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


def _without_faces(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # A module importing its own package (whose __init__ hands on the modules' names)
    # is not a cycle with it.
    return {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}


def test_no_import_cycle_even_through_imports_inside_functions():
    assert len(GRAPH) > 100 and GRAPH["forge_plugins.attention.flex"]  # the walk saw the packages
    assert _cycles(_without_faces(GRAPH)) == []


def test_the_cycle_check_sees_a_cycle_hidden_in_functions(tmp_path):
    """The shape the FlexAttention modules had: each imports the other inside a function."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/__init__.py").write_text("")
    (tmp_path / "pkg/kernel.py").write_text("def attend():\n    from pkg.backward import grad\n")
    (tmp_path / "pkg/backward.py").write_text("def grad():\n    from . import kernel\n")
    (tmp_path / "pkg/user.py").write_text("import pkg.kernel\n")
    graph = import_graph(("pkg",), tmp_path)
    assert graph["pkg.user"] == {"pkg.kernel"}
    assert _cycles(_without_faces(graph)) == [["pkg.backward", "pkg.kernel"]]
    (tmp_path / "pkg/backward.py").write_text("def grad():\n    pass\n")
    assert _cycles(_without_faces(import_graph(("pkg",), tmp_path))) == []


def test_an_import_up_a_floor_is_found(tmp_path):
    (tmp_path / "forge_core/train").mkdir(parents=True)
    (tmp_path / "forge_core/data").mkdir()
    for path in ("forge_core/__init__.py", "forge_core/train/__init__.py", "forge_core/data/__init__.py"):
        (tmp_path / path).write_text("")
    (tmp_path / "forge_core/data/build.py").write_text("def f():\n    from forge_core.train import loop\n")
    (tmp_path / "forge_core/train/loop.py").write_text("")
    graph = import_graph(("forge_core",), tmp_path)
    assert upward(graph) == ["forge_core.data.build -> forge_core.train.loop"]


def test_the_plan_is_typed_as_plan_wherever_it_is_passed():
    # A parameter or field named ``plan`` is the judged forge_core.api.Plan; typed ``Any``
    # it hides what the run is built from.
    untyped = []
    for package in ("forge_core", "forge_plugins"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.arg) and node.arg == "plan":
                    annotation = node.annotation
                elif isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "plan":
                    annotation = node.annotation
                else:
                    continue
                if annotation is not None and ast.unparse(annotation) == "Any":
                    untyped.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert untyped == [], f"type these as forge_core.api.Plan: {untyped}"


def test_the_registries_are_typed_as_registries_wherever_they_are_passed():
    # ``registries`` is forge_core.registry.Registries (imported under TYPE_CHECKING where
    # a runtime import would cost start-up). Only config/ keeps ``Any``: it sits two
    # floors below the registry, and even a TYPE_CHECKING import is an edge of the graph.
    untyped = []
    for path in sorted((ROOT / "forge_core").rglob("*.py")):
        if path.parent.name == "config":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.arg) and node.arg == "registries":
                annotation = node.annotation
            elif isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "registries":
                annotation = node.annotation
            else:
                continue
            if annotation is not None and ast.unparse(annotation) == "Any":
                untyped.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert untyped == [], f"type these as forge_core.registry.Registries: {untyped}"
