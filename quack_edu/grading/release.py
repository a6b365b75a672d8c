"""``quack-edu student --release OUT``: a student's copy of the course, without the answer key.

The copy has the lessons (student notebooks), the library, the tools and the grader that a
learner's ``check()`` runs. It leaves out what an instructor keeps (``answer_key``):

- ``solutions/`` and ``tests/`` (which read the solutions), and the maintainers' scripts;
- in each exercise module, its ``# BEGIN KEY`` blocks (reference answers, the formulas of known
  wrong variants, mutants), replaced by stubs, and its ``# BEGIN HIDDEN`` blocks (hidden checks);
- in their place, ``quack_edu/grading/public_key.json``: each public value check's cases, with
  the expected values and the variants' values, recorded with one seed.

A lesson module without KEY blocks is refused (``--partial`` leaves it, and so its exercises'
self-checks, out of the copy). The class is graded from the instructor's copy.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import secrets
import shutil
import subprocess
from pathlib import Path

from . import answer_key
from .hints import Variant
from .registry import Mutant

BEGIN_KEY, END_KEY = "# BEGIN KEY", "# END KEY"
BEGIN_HIDDEN, END_HIDDEN = "# BEGIN HIDDEN", "# END HIDDEN"
#: folders of the repository a student's copy leaves out
LEFT_OUT = ("solutions/", "tests/", "scripts/", ".ci/", ".github/", "benchmarks/raw/")
EXERCISES = "quack_edu/grading/exercises/"
#: files whose instructors' parts (between these markers, by file) the copy leaves out: the
#: Makefile's targets that need tests/ or solutions/, the README's grading of a class
INSTRUCTORS = {
    "Makefile": ("# BEGIN INSTRUCTORS", "# END INSTRUCTORS"),
    "README.md": ("<!-- BEGIN INSTRUCTORS -->", "<!-- END INSTRUCTORS -->"),
}
#: text that must not be left in a student's exercise module
#: (a hidden kernel check outside a HIDDEN block stays: its cases come from the grading seed,
#: which only the instructor has)
TELLTALES = (
    re.compile(r"\bmutants\(|\bMutant\("),
    re.compile(r"^def \w+_ref\(", re.M),
)


class ReleaseError(ValueError):
    pass


def _blocks(lines: list[str], begin: str, end: str, where: str) -> list[tuple[int, int]]:
    """(first, last) line indices of each ``begin``/``end`` block, markers included."""
    out, start = [], None
    for i, line in enumerate(lines):
        s = line.strip()
        if s == begin:
            if start is not None:
                raise ReleaseError(f"{where}:{i + 1}: {begin} inside another")
            start = i
        elif s == end:
            if start is None:
                raise ReleaseError(f"{where}:{i + 1}: {end} without {begin}")
            out.append((start, i))
            start = None
    if start is not None:
        raise ReleaseError(f"{where}:{start + 1}: {begin} never ends")
    return out


def _bound_names(source: str) -> list[str]:
    """The module-level names a block of statements binds, in order."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def _stub(name: str, obj) -> str:
    """The line that stands in for ``name`` in a student's copy."""
    if isinstance(obj, list | tuple) and obj and all(isinstance(o, Variant) for o in obj):
        rows = ", ".join(f"({v.name!r}, {v.hint!r})" for v in obj)
        return f"{name} = answer_key.removed_variants([{rows}])"
    if isinstance(obj, list | tuple) and all(isinstance(o, Mutant) for o in obj):
        return f"{name} = ()  # mutants: in the instructor's copy"
    return f"{name} = answer_key.removed({name!r})"


def student_module(path: Path, module_name: str) -> str:
    """The text of an exercise module as a student's copy has it."""
    lines = Path(path).read_text().splitlines(keepends=True)
    keys = _blocks(lines, BEGIN_KEY, END_KEY, str(path))
    hidden = _blocks(lines, BEGIN_HIDDEN, END_HIDDEN, str(path))
    live = importlib.import_module(module_name)
    replace: dict[int, tuple[int, list[str]]] = {}
    for a, b in keys:
        body = "".join(lines[a + 1 : b])
        stubs = [_stub(n, getattr(live, n)) + "\n" for n in _bound_names(body)]
        replace[a] = (b, ["# (answer key: in the instructor's copy)\n", *stubs])
    for a, b in hidden:
        replace[a] = (b, ["# (hidden checks: in the instructor's copy)\n"])
    out, i = [], 0
    while i < len(lines):
        if i in replace:
            end, new = replace[i]
            out += new
            i = end + 1
        else:
            out.append(lines[i])
            i += 1
    text = _short_docstring("".join(out))
    if keys and "from .. import answer_key" not in text:
        text = _add_import(text, "from .. import answer_key\n")
    _no_telltales(text, path)
    return text


def _no_telltales(text: str, where) -> None:
    for pattern in TELLTALES:
        m = pattern.search(text)
        if m:
            line = text[: m.start()].count("\n") + 1
            raise ReleaseError(
                f"{where}:{line}: {m.group(0)!r} would be in the student's copy (put it in a "
                f"{BEGIN_KEY} or {BEGIN_HIDDEN} block)"
            )


def _short_docstring(text: str) -> str:
    """The module's docstring cut to its first line: the rest describes the checks for the
    maintainers, in words that can give an answer away (``rstd = rsqrt(...)``)."""
    tree = ast.parse(text)
    doc = ast.get_docstring(tree, clean=False)
    if not doc or "\n" not in doc.strip():
        return text
    node = tree.body[0]
    lines = text.splitlines(keepends=True)
    first = doc.strip().splitlines()[0].replace('"', "'")
    short = f'"""{first}\n\n(How the checks work: see the instructor\'s copy.)\n"""\n'
    return "".join(lines[: node.lineno - 1]) + short + "".join(lines[node.end_lineno :])


def _add_import(text: str, line: str) -> str:
    """``line`` after the module's ``from __future__`` import (or at its top)."""
    anchor = "from __future__ import annotations\n"
    if anchor in text:
        return text.replace(anchor, anchor + "\n" + line, 1)
    return line + text


def students_part(text: str, begin: str, end: str, where: str) -> str:
    """``text`` without its lines from each ``begin`` marker line to its ``end`` line."""
    lines = text.splitlines(keepends=True)
    cut = _blocks([ln.rstrip("\n") for ln in lines], begin, end, where)
    keep = [ln for i, ln in enumerate(lines) if not any(a <= i <= b for a, b in cut)]
    return "".join(keep)


def exercise_modules() -> dict[str, Path]:
    """The lesson modules of the exercises, by name (``lesson04_cluster_kernel``: a path)."""
    from .nbfiles import repo_root

    return {p.stem: p for p in sorted((repo_root() / EXERCISES).glob("lesson*.py"))}


def _tracked(root: Path) -> list[str]:
    """The repository's files (git's list where there is one: no caches, venvs, outputs)."""
    if (root / ".git").exists():
        out = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True)
        if out.returncode == 0:
            return [p for p in out.stdout.splitlines() if (root / p).is_file()]
    skip = ("__pycache__", ".venv", ".gpu", ".git", ".ipynb_checkpoints")
    return [
        str(p.relative_to(root))
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(s in p.parts for s in skip)
    ]


def _lesson_of(module: str) -> str:
    """``lesson04_cluster_kernel`` -> ``04``: the lesson number a module's exercises are of."""
    return re.match(r"lesson(\d+b?)", module).group(1)


def record_public(lessons: set[str], seed: int) -> dict:
    """Each public value check of the exercises of ``lessons`` (numbers: ``00``, ``01b``),
    on its cases with ``seed``, recorded: run on the solution's answer, judged as a learner's
    ``check()`` would be."""
    from .judge import judge_exercise
    from .nbfiles import exercise_source, read, solutions_dir
    from .registry import all_exercises

    with answer_key.recording() as rec:
        for ex in all_exercises():
            if ex.lesson.split("_")[0] not in lessons:
                continue
            source = exercise_source(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex)
            judge_exercise(ex, source, hidden=False, seed=seed, gpu=False)
        return dict(rec)


def write_release(out: Path, *, partial: bool = False) -> dict:
    """Write a student's copy into ``out`` (which must not exist); say what it holds."""
    from .nbfiles import repo_root

    root, out = repo_root(), Path(out)
    if out.exists():
        raise ReleaseError(f"{out} exists: give a new folder")
    modules = exercise_modules()
    unkeyed = {_lesson_of(n) for n, p in modules.items() if BEGIN_KEY not in p.read_text()}
    if unkeyed and not partial:
        raise ReleaseError(
            f"lessons whose exercise modules have no {BEGIN_KEY} block: "
            f"{', '.join(sorted(unkeyed))}; --partial leaves their self-checks out of the copy"
        )
    kept = {n: p for n, p in modules.items() if _lesson_of(n) not in unkeyed}
    shared = {p.stem: p for p in (root / EXERCISES).glob("*.py") if p.stem not in modules}
    texts = {
        f"{EXERCISES}{p.name}": student_module(p, f"quack_edu.grading.exercises.{n}")
        for n, p in {**kept, **shared}.items()
        if n != "__init__"
    }
    lessons = {_lesson_of(n) for n in kept}
    seed = secrets.randbits(31)
    recorded = record_public(lessons, seed)
    for rel in _tracked(root):
        if rel.startswith(LEFT_OUT) or rel.startswith(EXERCISES + "lesson") and rel not in texts:
            continue
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if rel in texts:
            dest.write_text(texts[rel])
        elif rel in INSTRUCTORS:
            dest.write_text(students_part((root / rel).read_text(), *INSTRUCTORS[rel], rel))
        else:
            shutil.copy2(root / rel, dest)
    for rel in [r for r in _tracked(root) if r.startswith(EXERCISES)]:
        text = (out / rel).read_text() if (out / rel).exists() else ""
        _no_telltales(text, rel)
    from .registry import all_exercises
    from .similarity import released_lists

    # (the copy checks decide by the solutions: what they found goes with the copy)
    copies = {
        e.id: released_lists(e.id) for e in all_exercises() if e.lesson.split("_")[0] in lessons
    }
    key = {"format": answer_key.FORMAT, "seed": seed, **recorded, "copy_checks": copies}
    key_path = out / "quack_edu" / "grading" / answer_key.PUBLIC_KEY.name
    key_path.write_text(json.dumps(key, indent=1, sort_keys=True) + "\n")
    return {"lessons": sorted(lessons), "left_out": sorted(unkeyed), "seed": seed}
