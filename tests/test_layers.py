"""The code map of the README, checked: which room of `txstream` may import which, and how
large a module may grow before it is split."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "txstream"

# Room -> the rooms it may import (besides itself). A room is a subpackage or a top-level
# module of txstream; "txstream" itself is the public surface (`from txstream import ...`).
MAY_IMPORT: dict[str, set[str]] = {
    "changes": set(),
    "updates": set(),
    "viewports": set(),
    "wire": {"updates"},
    "client": {"updates", "viewports", "wire"},
    "schemas": {"changes"},
    "kafka_client": {"schemas"},
    "sources": {"changes", "schemas", "kafka_client"},
    "engine": {"changes", "schemas"},
    "sinks": {"changes", "schemas", "kafka_client", "updates", "viewports", "wire"},
    "examples": {"txstream", "changes", "schemas"},
    "service": {"changes", "schemas", "kafka_client", "sources", "engine", "sinks", "updates",
                "examples", "txstream"},
}
LARGEST_MODULE = 500  # lines


def _room(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imported_rooms(path: Path) -> set[str]:
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] != "txstream":
                continue
            if len(parts) > 1:
                rooms.add(parts[1])
            else:  # from txstream import Pipeline / from txstream import reducers
                rooms.add("txstream")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "txstream":
                    rooms.add(parts[1] if len(parts) > 1 else "txstream")
    return rooms


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"
                 or p.parent != PACKAGE)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_only_the_rooms_below_its_own(path: Path) -> None:
    room = _room(path)
    assert room in MAY_IMPORT, f"{room} is a new room: add it to the code map and MAY_IMPORT"
    wrong = _imported_rooms(path) - MAY_IMPORT[room] - {room}
    assert not wrong, (f"{path.relative_to(PACKAGE)} ({room}) imports {sorted(wrong)}; "
                       f"{room} may import only {sorted(MAY_IMPORT[room])}")


def test_no_module_outgrows_one_job() -> None:
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in MODULES}
    large = {name: lines for name, lines in sizes.items() if lines > LARGEST_MODULE}
    assert not large, f"modules over {LARGEST_MODULE} lines, to split: {large}"


def test_the_package_is_the_only_top_level_name() -> None:
    """pyproject installs `txstream` alone: no other top-level package beside it."""
    root = PACKAGE.parent
    beside = sorted(p.name for p in root.iterdir()
                    if p.is_dir() and (p / "__init__.py").exists() and p.name != "txstream")
    assert beside == [], f"top-level packages beside txstream: {beside}"
    text = (root / "pyproject.toml").read_text()
    assert 'include = ["txstream*"]' in text


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of txstream that `path` imports, wherever the import stands (a cycle through
    an import under TYPE_CHECKING or inside a function is still two modules that need each
    other); `from package import name` counts as the module `package.name` when that is one."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found.update(name if name in known else node.module for name in names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & known


def test_no_import_cycle_inside_a_room() -> None:
    """Modules that import each other, directly or around a circle, are one job in two files
    (or a third module both need is missing). Packages' `__init__` modules, which gather names
    for the public surface, are left out."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = {name for name, p in paths.items() if p.name != "__init__.py"}
    graph = {name: _imported_modules(paths[name], set(paths)) & modules for name in modules}
    cycles = []
    for start in sorted(modules):
        way = _way_back(graph, start)
        if way is not None and min(way) == start:  # each circle once, from its first module
            cycles.append(" -> ".join([*way, start]))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _way_back(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """The shortest chain of imports from `start` to a module that imports `start`."""
    came_from: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier:
        for module in frontier:
            if start in graph[module]:
                way = [module]
                while (before := came_from[way[-1]]) is not None:
                    way.append(before)
                return way[::-1]
        following = []
        for module in frontier:
            for imported in sorted(graph[module] - came_from.keys()):
                came_from[imported] = module
                following.append(imported)
        frontier = following
    return None
