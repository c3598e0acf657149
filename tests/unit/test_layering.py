"""The house's floors: which package of ``src/msf`` may import which (docs/architecture.md, "Layout").

The import graph is read from the source (every ``import msf.X`` / ``from msf.X import``, at module level
or inside a function), so a lazy import that dodges a cycle counts as an import too.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "msf"
# a package may import those on floors below it (entry points at the top); the same floor: only as listed
FLOORS = [
    {"sf2", "export"},
    {"train", "enjoy", "plot", "sampler"},
    {"runner"},
    {"sampling", "learning"},
    {"distributed", "model"},
    {"envs"},
    {"persistence", "cfg"},
    {"runtime"},
]
SAME_FLOOR_ALLOWED = {("learning", "sampling"), ("distributed", "model")}


def _package_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports() -> dict[tuple[str, str], list[str]]:
    """``{(importer package, imported package): [where, ...]}`` over all modules of ``src/msf``."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in SRC.rglob("*.py"):
        me = _package_of(path)
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] == "msf" and len(parts) > 1 and parts[1] != me:
                    edges.setdefault((me, parts[1]), []).append(f"{path.relative_to(SRC)}:{node.lineno}")
    return edges


def _floor(pkg: str) -> int:
    return next(i for i, f in enumerate(FLOORS) if pkg in f)


def test_every_package_is_on_a_floor():
    on_floors = set().union(*FLOORS)
    packages = {_package_of(p) for p in SRC.rglob("*.py")} - {"__init__"}
    assert packages <= on_floors, packages - on_floors


def test_imports_run_downwards_only():
    wrong = []
    for (a, b), where in sorted(_imports().items()):
        if _floor(a) > _floor(b) or (_floor(a) == _floor(b) and (a, b) not in SAME_FLOOR_ALLOWED):
            wrong.append(f"{a} imports {b} at {', '.join(where)}")
    assert not wrong, "\n".join(wrong)


def test_no_package_imports_one_that_imports_it_back():
    edges = {k for k in _imports()}
    reach = {a: {b for x, b in edges if x == a} for a, _ in edges}
    changed = True
    while changed:  # transitive closure
        changed = False
        for bs in reach.values():
            more = set().union(*(reach.get(b, set()) for b in bs)) - bs
            if more:
                bs |= more
                changed = True
    cycles = sorted(a for a, bs in reach.items() if a in bs)
    assert not cycles, cycles
