"""Every CuTe DSL name a stage's kernel module uses is introduced in a lesson at or before the
stage's lesson: it appears in the markdown or the code of that lesson's notebook, or of an
earlier one (lesson 01b, the DSL, counts as lesson 01).

The names: attribute chains on ``cute`` / ``cutlass`` and the modules imported from them
(``cute.arch.thread_idx``, ``cutlass.const_expr``, ``cpasync.CopyG2SOp``), names imported from
them (``Float32``, ``SmemAllocator``), and the DSL methods of tensors, tiled copies and TensorSSA
values (``.load``, ``.partition_S``, ...), in the stage's module and in the functions of
``quack_edu/primitives`` that it calls. A dotted name counts as introduced when its last two
parts appear (``arch.thread_idx``), a plain name or method when it appears as a word.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ROOT / "quack_edu" / "stages"
PRIMITIVES = ROOT / "quack_edu" / "primitives"

#: the lesson that teaches each stage
STAGE_LESSON = {
    "naive": 1,
    "warp": 2,
    "block": 3,
    "cluster": 4,
    "cpasync": 5,
    "final": 6,
    "final_bwd": 7,
}

#: methods and attributes of DSL objects (tensors, layouts, tiled copies, TensorSSA values,
#: kernels) that a kernel calls on a value rather than on a module
DSL_METHODS = {
    "load",
    "store",
    "reduce",
    "fill",
    "to",
    "partition_S",
    "partition_D",
    "get_slice",
    "retile",
    "launch",
    "element_type",
    "iterator",
    "layout",
    "tiler_mn",
    "layout_src_tv_tiled",
}


def _dsl_roots(tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """(alias -> module path for modules of cutlass, names imported from cutlass modules)."""
    roots, names = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "cutlass":
                    roots[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "cutlass":
            for a in node.names:
                mod_like = a.name in ("cpasync", "llvm", "cute", "nvgpu", "arch")
                if mod_like:
                    roots[a.asname or a.name] = f"{node.module}.{a.name}"
                else:
                    names.add(a.asname or a.name)
    return roots, names


def _chain(node: ast.Attribute) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _names_in(tree: ast.AST, roots, imported) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain and chain[0] in roots:
                if not isinstance(getattr(node, "_parent", None), ast.Attribute):
                    out.add(".".join(chain))
                continue
            if node.attr in DSL_METHODS:
                out.add("." + node.attr)
        elif isinstance(node, ast.Name) and node.id in imported:
            out.add(node.id)
    return out


def _with_parents(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child._parent = node
    return tree


@functools.cache
def _module(path: Path):
    tree = _with_parents(ast.parse(path.read_text()))
    return tree, *_dsl_roots(tree)


def _helper_names(module: str, fn: str, seen: set) -> set[str]:
    """DSL names in ``primitives/<module>.py``'s function ``fn`` and the functions it calls."""
    if (module, fn) in seen:
        return set()
    seen.add((module, fn))
    tree, roots, imported = _module(PRIMITIVES / f"{module}.py")
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    if fn not in defs:
        return set()
    out = _names_in(defs[fn], roots, imported)
    for node in ast.walk(defs[fn]):
        if isinstance(node, ast.Name) and node.id in defs and node.id != fn:
            out |= _helper_names(module, node.id, seen)
    return out


@functools.cache
def stage_names(stage: str) -> frozenset[str]:
    """Every DSL name of the stage's module and of the primitives helpers it calls."""
    tree, roots, imported = _module(STAGES / f"{stage}.py")
    out = _names_in(tree, roots, imported)
    aliases = {}  # local alias -> primitives module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and "primitives" in node.module:
            for a in node.names:
                if node.module.endswith("primitives"):
                    aliases[a.asname or a.name] = a.name
                else:  # from ..primitives.tiling import RowTiling
                    out |= _helper_names(node.module.split(".")[-1], a.name, set())
    seen: set = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in aliases:
                out |= _helper_names(aliases[node.value.id], node.attr, seen)
    return frozenset(out)


def _key(name: str) -> str:
    """What must appear in a lesson: a dotted name's last two parts, else the name itself."""
    parts = name.lstrip(".").split(".")
    if name.startswith("."):
        return "." + parts[-1]
    return ".".join(parts[-2:])


@functools.cache
def lesson_texts() -> dict[int, str]:
    """Lesson number -> the text (markdown and code) of its notebooks (01 and 01b both 1)."""
    out: dict[int, str] = {}
    for p in sorted((ROOT / "solutions").glob("*.ipynb")):
        nb = json.loads(p.read_text())
        text = "\n".join("".join(c["source"]) for c in nb["cells"])
        n = int(p.name[:2])
        out[n] = out.get(n, "") + "\n" + text
    return out


def introduced_in(name: str) -> int | None:
    """The first lesson whose text holds ``name`` (None: no lesson)."""
    key = _key(name)
    rx = re.compile(("" if key.startswith(".") else r"(?<!\w)") + re.escape(key) + r"(?!\w)")
    for n, text in sorted(lesson_texts().items()):
        if rx.search(text):
            return n
    return None


#: (stage, name) pairs whose name no lesson at or before the stage's introduces yet. strict
#: xfail: once a lesson introduces it, the pair passes and must be removed from here.
NOT_YET: set = set()

CASES = [(s, n) for s in STAGE_LESSON for n in sorted(stage_names(s))]


@pytest.mark.parametrize(
    "stage,name",
    [
        pytest.param(
            s,
            n,
            id=f"{s}-{n}",
            marks=[pytest.mark.xfail(strict=True, reason="not introduced yet")]
            if (s, n) in NOT_YET
            else [],
        )
        for s, n in CASES
    ],
)
def test_dsl_name_is_introduced_by_the_stages_lesson(stage, name):
    first = introduced_in(name)
    assert first is not None, f"{name} ({stage}) appears in no lesson"
    assert first <= STAGE_LESSON[stage], (
        f"{name} ({stage}, lesson {STAGE_LESSON[stage]:02d}) first appears in lesson {first:02d}"
    )


def test_not_yet_names_only_real_pairs():
    assert NOT_YET <= set(CASES), NOT_YET - set(CASES)


def test_the_extraction_sees_the_kernels_names():
    naive = stage_names("naive")
    assert {
        "cute.arch.thread_idx",
        "cute.arch.block_idx",
        "cutlass.range",
        "cute.math.rsqrt",
    } <= naive
    assert {"cute.kernel", "cute.jit", ".launch", "Float32"} <= naive
    warp = stage_names("warp")
    assert {"cute.local_tile", "cute.make_identity_tensor", "cutlass.const_expr"} <= warp
    assert {".partition_S", ".load", ".reduce", ".store", "cute.make_rmem_tensor_like"} <= warp
    # through the primitives helpers the stage calls
    assert {"cute.make_tiled_copy_tv", "cute.arch.shuffle_sync_bfly", "cute.elem_less"} <= warp
    assert "cute.arch.mbarrier_wait" not in warp  # the cluster helpers are not the warp's
    assert any(n.startswith("cute.arch.mbarrier") for n in stage_names("cluster"))


def test_a_name_no_lesson_mentions_is_not_introduced():
    assert introduced_in("cute.arch.not_a_dsl_function") is None
    assert introduced_in(".partition_S") == 1  # lesson 01b
    assert introduced_in("cute.local_tile") == 1
    assert _key("cute.nvgpu.cpasync.CopyG2SOp") == "cpasync.CopyG2SOp"
