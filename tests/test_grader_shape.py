"""The grader stays readable (issue 49): no module of ``quack_edu/grading`` (its exercises and
probes included) over MAX_LINES lines, and none imports a private name of another module: a
name used across modules is public. Every import counts, multi-line and deferred ones too:
``from .x import _y``, ``from . import _x`` and ``import quack_edu.a._b`` are each reported.
The two scripts the grader runs by path (``_cellworker.py``, ``_judgeserver.py``) keep their
names; no module imports them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRADING = ROOT / "quack_edu" / "grading"
MAX_LINES = 800
#: run as scripts by path, never imported
SCRIPTS = {"quack_edu.grading._cellworker", "quack_edu.grading._judgeserver"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_name(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def _from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module a ``from ... import`` in ``package`` reads."""
    if not node.level:
        return node.module or ""
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return ".".join(filter(None, [package, node.module]))


def private_imports(package: Path, root: Path, top: str = "quack_edu") -> list[str]:
    """``"path:line: what"`` for each import, in a module under ``package``, of a private name
    or a private module of ``top`` (the package ``root`` holds)."""
    out = []
    for path in sorted(package.rglob("*.py")):
        here = _module_name(path, root)
        pkg = here if path.name == "__init__.py" else here.rpartition(".")[0]
        where = f"{path.relative_to(root).as_posix()}:"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for a in node.names:
                    parts = a.name.split(".")
                    if parts[0] == top and any(map(_private, parts)) and a.name not in SCRIPTS:
                        out.append(f"{where}{node.lineno}: import {a.name}")
            elif isinstance(node, ast.ImportFrom):
                full = _from_module(node, pkg)
                if full.split(".")[0] != top:
                    continue
                said = f"from {'.' * node.level}{node.module or ''} import"
                for a in node.names:
                    if f"{full}.{a.name}" in SCRIPTS:
                        continue
                    if any(map(_private, full.split("."))) or _private(a.name):
                        out.append(f"{where}{node.lineno}: {said} {a.name}")
    return out


def test_no_grader_module_is_longer_than_the_cap():
    lines = {
        p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
        for p in GRADING.rglob("*.py")
    }
    assert "quack_edu/grading/exercises/lesson02.py" in lines  # exercises are counted
    over = {m: n for m, n in lines.items() if n > MAX_LINES}
    assert not over, f"grader modules over {MAX_LINES} lines (split them): {over}"


def test_no_grader_module_imports_a_private_name():
    found = private_imports(GRADING, ROOT)
    assert not found, "private names imported across modules (make them public):\n" + "\n".join(
        found
    )


def test_the_reader_finds_private_imports(tmp_path):
    pkg = tmp_path / "quack_edu" / "grading"
    (pkg / "sub").mkdir(parents=True)
    for init in (tmp_path / "quack_edu", pkg, pkg / "sub"):
        (init / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from __future__ import annotations\n"
        "from .b import (\n    public,\n    _hidden,\n)\n"  # a multi-line import
        "from . import _helpers\n"
        "from .._env import MODE\n"
        "import quack_edu.grading._judgeserver\n"  # a script: allowed
        "from . import _cellworker\n"
        "def f():\n    from .sub.c import _deferred\n"
        "import os._private_elsewhere\n"  # not quack_edu: not ours to judge
    )
    (pkg / "sub" / "c.py").write_text("from ..b import _x\nfrom ...grading import b\n")
    assert private_imports(pkg, tmp_path) == [
        "quack_edu/grading/a.py:2: from .b import _hidden",
        "quack_edu/grading/a.py:6: from . import _helpers",
        "quack_edu/grading/a.py:7: from .._env import MODE",
        "quack_edu/grading/a.py:11: from .sub.c import _deferred",
        "quack_edu/grading/sub/c.py:1: from ..b import _x",
    ]
