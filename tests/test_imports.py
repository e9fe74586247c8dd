"""No import cycles among the modules of ``ablate/`` and ``analysis/``, direct or round several modules.

Every import statement counts, at module level or deferred inside a function (a deferred import only hides a
cycle until the function runs: ``pipeline`` and ``run`` used to import each other that way, and so did
``config -> models.precision -> config`` through ``refs``), except those under ``if TYPE_CHECKING:``, which
never run. Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``, so those are edges too, except
a module's own ancestor packages (a package's ``__init__`` that imports its submodules, as ``ablate.refs``
does to register every regime, is the usual pattern, not a cycle).

The layers between packages (which package may import which) are import-linter's contracts
(``[tool.importlinter]`` in pyproject.toml, ``lint-imports`` in .ci/run); this test is kept for what those do not
see: a cycle between modules of one package.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("ablate", "analysis")


def project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages (notebooks excluded)."""
    found = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if "notebooks" in parts:
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def executed_imports(body: list[ast.stmt]):
    """The import statements of a module body that can run: everywhere (functions and classes included)
    but under ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from executed_imports(node.orelse)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from executed_imports([child])
                elif isinstance(child, ast.excepthandler):
                    yield from executed_imports(child.body)


def _with_parents(name: str, modules: dict[str, Path]) -> set[str]:
    """``name`` and the packages above it, as far as they are project modules."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & set(modules)


def imported_modules(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that importing ``module`` imports directly (its own ancestors excluded)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in executed_imports(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out |= _with_parents(alias.name, modules)
            continue
        base = node.module or ""
        if node.level:  # relative import
            anchor = module.split(".") if is_pkg else module.split(".")[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, *([base] if base else [])])
        out |= _with_parents(base, modules)
        for alias in node.names:  # `from pkg import submodule`
            if f"{base}.{alias.name}" in modules:
                out.add(f"{base}.{alias.name}")
    ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    return out - ancestors - {module}


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {m: imported_modules(m, p, modules) for m, p in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan; the graph is small, recursion depth is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_checker_finds_a_cycle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_the_checker_skips_only_type_checking_imports():
    body = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import x\n"
        "if TYPE_CHECKING:\n    import y\nelse:\n    import u\n"
        "try:\n    import z\nexcept ImportError:\n    import w\n"
        "def f():\n    if True:\n        import v\n"
        "class C:\n    def g(self):\n        import t\n"
    ).body
    names = {a.name for n in executed_imports(body) for a in n.names}
    assert names == {"TYPE_CHECKING", "x", "u", "z", "w", "v", "t"}


def test_no_import_cycles():
    graph = import_graph()
    assert "ablate.pipeline" in graph and "analysis.report" in graph
    cycles = find_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)
