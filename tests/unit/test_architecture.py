"""The shape of the package (docs/design.md, the table of packages): no import cycle anywhere
in gwtf/, counting imports inside functions and under TYPE_CHECKING; no class over 600 lines; no
folder of more than 15 modules, and every package's __init__ saying what it is for;
the pure layers (flow, job, recovery) free of I/O and of torch; the simulator apart from the
node.

The import graph is read from the source with `ast`, not from `sys.modules`, so that a lazy
import or one hidden behind TYPE_CHECKING counts like any other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "gwtf"
GENERATED = PACKAGE / "v1"
"""protoc's output: its classes are as long as the services they describe."""


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    return {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every gwtf module `name` imports, wherever in the file the import stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            # `from gwtf.node.worker import worker` imports the submodule worker, not only the
            # package.
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m in known and m != name}


def _graph() -> nx.DiGraph:
    sources = _sources()
    known = set(sources)
    graph = nx.DiGraph()
    graph.add_nodes_from(known)
    for name, path in sources.items():
        for target in _imports(name, path, known):
            graph.add_edge(name, target)
    return graph


def test_no_import_cycle_anywhere_in_the_package() -> None:
    graph = _graph()
    # A package's __init__ importing its own submodules is how a package exports: an edge from
    # a submodule back to its own package's __init__ would be a cycle, and counts as one.
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def test_the_import_graph_is_read_from_lazy_and_type_checking_imports_too(tmp_path: Path) -> None:
    """The reader must see the imports that hide: one inside a function, one under
    TYPE_CHECKING, one relative. Otherwise the test above could not fail on them."""
    pkg = tmp_path / "gwtf"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from gwtf.b import B\n"
        "def f():\n    import gwtf.c\n"
        "from . import d\n"
    )
    known = {"gwtf", "gwtf.a", "gwtf.b", "gwtf.c", "gwtf.d"}
    found = _imports("gwtf.a", pkg / "a.py", known)
    assert found == {"gwtf", "gwtf.b", "gwtf.c", "gwtf.d"}


def test_no_class_over_600_lines() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if GENERATED in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 600:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.name} ({lines})")
    assert not long, f"classes over 600 lines: {long}"


def test_no_folder_holds_more_than_15_modules() -> None:
    """A folder of more modules hides its structure: it splits into packages that name its
    parts (STYLE.md, the shape of the tree)."""
    crowded = []
    for folder in sorted({p.parent for p in PACKAGE.rglob("*.py")}):
        if folder == GENERATED:
            continue
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        if len(modules) > 15:
            crowded.append(f"{folder.relative_to(PACKAGE.parent)} ({len(modules)})")
    assert not crowded, f"folders of more than 15 modules: {crowded}"


def test_every_package_says_what_it_is_for() -> None:
    """Each package's __init__ opens with a paragraph: a newcomer reads the architecture there."""
    bare = [
        str(init.relative_to(PACKAGE.parent)) for init in sorted(PACKAGE.rglob("__init__.py"))
        if GENERATED not in (init, *init.parents) and init.parent != GENERATED
        and len(ast.get_docstring(ast.parse(init.read_text())) or "") < 80
    ]
    assert not bare, f"packages with no paragraph on what they are for: {bare}"


@pytest.mark.parametrize("layer", ["gwtf.flow", "gwtf.job", "gwtf.recovery"])
def test_the_pure_layers_do_no_io_and_hold_no_tensors(layer: str) -> None:
    """flow/, job/ and recovery/ are sans-I/O (typed events in, actions out, clock injected):
    the node and the simulator both drive them, so they may not reach for asyncio, grpc or
    torch, nor for the node."""
    forbidden = ("asyncio", "grpc", "torch", "gwtf.node", "gwtf.sim", "uvloop")
    bad = []
    for name, path in _sources().items():
        if name != layer and not name.startswith(layer + "."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            bad += [f"{name} imports {n}" for n in names
                    if any(n == f or n.startswith(f + ".") for f in forbidden)]
    assert not bad, bad


def test_the_simulator_does_not_import_the_node() -> None:
    graph = _graph()
    sim = [m for m in graph if m == "gwtf.sim" or m.startswith("gwtf.sim.")]
    bad = [(m, t) for m in sim for t in graph.successors(m) if t.startswith("gwtf.node")]
    assert not bad, f"the simulator reaches into the node: {bad}"
