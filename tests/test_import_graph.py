"""quack_edu's modules import one another without a circle: every import counts, at the top
of a module or inside a function (a deferred import that closes a circle is still one)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "quack_edu"


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _targets(mods: dict, here: str, node) -> set[str]:
    """The package modules an import statement in module ``here`` names."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in mods}
    package = here if mods[here].name == "__init__.py" else here.rpartition(".")[0]
    for _ in range(max(node.level - 1, 0)):
        package = package.rpartition(".")[0]
    base = node.module if not node.level else ".".join(filter(None, [package, node.module]))
    out = set()
    for a in node.names:  # `from pkg import mod` names a module; `from mod import f`, mod
        sub = f"{base}.{a.name}"
        out.add(sub if sub in mods else base)
    return out & set(mods)


def import_graph(mods: dict) -> dict[str, set[str]]:
    graph = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                deps |= _targets(mods, name, node)
        graph[name] = deps - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                on.discard(w)
                comp.append(w)
            on.discard(v)
            if comp:
                out.append(sorted([v, *comp]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_quack_edu_has_no_import_circle():
    mods = modules()
    assert {"quack_edu.runtime", "quack_edu.config", "quack_edu.grading.checks"} <= set(mods)
    graph = import_graph(mods)
    # the reading of imports sees the edges that exist (deferred ones too)
    assert "quack_edu.dtypes" in graph["quack_edu.config"]
    assert "quack_edu.grading.nbfiles" in graph["quack_edu.grading.runner"]  # (in a function)
    assert circles(graph) == []


def test_the_circle_finder_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"} - {"e"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"x": {"y"}, "y": set()}) == []


def test_the_reader_sees_deferred_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    graph = import_graph(modules(pkg))
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert circles(graph) == [["pkg.a", "pkg.sub.b"]]
