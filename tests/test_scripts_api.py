"""The GPU scripts (scripts/*.py) run only on a GPU, so a renamed or removed library name would
break them unseen: every ``quack_edu`` name a script reads must exist, and no launch may pass
the keywords the launchers no longer take (``kernel_cls=``, ``grid=``: a kernel class and its
``grid_x`` say both)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py"))
GONE = {"kernel_cls", "grid"}


def _exists(module: str, name: str) -> bool:
    """Is ``module.name`` a submodule or an attribute of ``module``?"""
    try:
        importlib.import_module(f"{module}.{name}")
        return True
    except ModuleNotFoundError:
        return hasattr(importlib.import_module(module), name)


def problems(source: str) -> list[str]:
    """The library names ``source`` uses that do not exist, and its launches with keywords
    that are gone, as "line N: what" (sorted)."""
    tree, found, modules = ast.parse(source), [], {}
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    for node in imports:  # name in the script -> the quack_edu module it stands for
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name: a.name for a in node.names if "quack_edu" in a.name}
        elif (node.module or "").startswith("quack_edu"):
            for a in node.names:
                if not _exists(node.module, a.name):
                    found.append(f"line {node.lineno}: {node.module}.{a.name}")
                elif _is_module(f"{node.module}.{a.name}"):
                    modules[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            mod = modules.get(node.value.id)
            if mod and not hasattr(importlib.import_module(mod), node.attr):
                found.append(f"line {node.lineno}: {mod}.{node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr.startswith("launch"):
                gone = GONE & {k.arg for k in node.keywords}
                found += [f"line {node.lineno}: {node.func.attr}({k}=...)" for k in sorted(gone)]
    return sorted(found)


def _is_module(name: str) -> bool:
    try:
        importlib.import_module(name)
        return True
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_library_name_a_script_uses_exists(script):
    assert problems(script.read_text()) == []


def test_the_check_sees_a_removed_name_and_a_removed_keyword():
    src = (
        "from quack_edu.stages import final_bwd as fb\n"
        "from quack_edu.tools import bench\n"
        "fb.launch_bwd(1, config=None, grid=3)\n"
        "bench.no_such_function()\n"
        "from quack_edu.runtime import no_such_name\n"
    )
    assert problems(src) == [
        "line 3: launch_bwd(grid=...)",
        "line 4: quack_edu.tools.bench.no_such_function",
        "line 5: quack_edu.runtime.no_such_name",
    ]
