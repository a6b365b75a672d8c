"""Room to change the code: no module in quack_edu/ over MAX_LINES lines, no function with more
than MAX_PARAMS parameters. The modules and functions over those today (issue 34 splits them)
are listed with their size now: they may shrink, not grow, and nothing joins them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES, MAX_PARAMS = 1000, 10

#: module -> its lines today (the cap until it is split)
LONG_MODULES = {}
#: function -> its parameters today (self and cls not counted)
MANY_PARAMS = {
    # the backward's JIT entry: the kernel's ten arguments (nine tensors and the grid) and the
    # stream; they are what the compiled function is called with, one per tensor
    "quack_edu/stages/final_bwd.py:FinalBwdRMSNorm.__call__": 11,
}


def _modules():
    return sorted((ROOT / "quack_edu").rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


def parameter_counts(path: Path) -> dict[str, int]:
    """'path:Qual.name' -> parameters of every function and method in a module."""
    out = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                a = child.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
                n = len(params) + (a.vararg is not None) + (a.kwarg is not None)
                if params and params[0].arg in ("self", "cls"):
                    n -= 1
                out[f"{_rel(path)}:{prefix}{child.name}"] = n
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(path.read_text()), "")
    return out


def test_no_module_is_longer_than_its_cap():
    lines = {_rel(p): len(p.read_text().splitlines()) for p in _modules()}
    assert set(LONG_MODULES) <= set(lines), set(LONG_MODULES) - set(lines)
    over = {m: n for m, n in lines.items() if n > LONG_MODULES.get(m, MAX_LINES)}
    assert not over, f"modules over their cap (split them rather than raise it): {over}"


def test_no_function_takes_more_parameters_than_its_cap():
    counts = {k: v for p in _modules() for k, v in parameter_counts(p).items()}
    assert set(MANY_PARAMS) <= set(counts), set(MANY_PARAMS) - set(counts)
    over = {f: n for f, n in counts.items() if n > MANY_PARAMS.get(f, MAX_PARAMS)}
    assert not over, f"functions over their cap (an options object, not more arguments): {over}"


def test_the_counter_counts(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "def f(a, b=1, *args, c, **kw):\n    def g(x):\n        pass\n"
        "class K:\n    def m(self, a, b):\n        pass\n    @classmethod\n"
        "    def c(cls):\n        pass\n"
    )
    got = {k.split(":")[1]: v for k, v in parameter_counts(src).items()}
    assert got == {"f": 5, "f.g": 1, "K.m": 2, "K.c": 0}
