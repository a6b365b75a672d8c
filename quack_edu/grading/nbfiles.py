"""Notebook files: the single-source lessons and their student copies, cells, exercise sources.

Single source
    ``solutions/NN_<topic>.ipynb`` are the complete lessons. Exercise code sits between
    nbgrader's markers (``### BEGIN SOLUTION`` / ``### END SOLUTION``), hidden checks between
    ``### BEGIN HIDDEN TESTS`` / ``### END HIDDEN TESTS``. ``to_student`` makes the learner's copy
    exactly as ``nbgrader generate_assignment`` would (solutions -> ``# YOUR CODE HERE`` +
    ``raise NotImplementedError()``, hidden tests removed, outputs cleared) and keeps the cell
    metadata (``nbgrader``: grade_id, points, schema_version 3), so an instructor who uses
    nbgrader can take the notebooks as they are.

Running and grading a notebook: ``notebook``.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import os
import re
import sys
import tempfile
from pathlib import Path

try:
    import nbformat
except ImportError:  # a machine without Jupyter packages (the H200 device machine)
    from . import nblite as nbformat

from .registry import MISSING, Exercise, all_exercises

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
BEGIN_HIDDEN = "### BEGIN HIDDEN TESTS"
END_HIDDEN = "### END HIDDEN TESTS"
CODE_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
TEXT_STUB = "YOUR ANSWER HERE"
NBGRADER_SCHEMA = 3

#: imports every lesson notebook makes in its first code cell; an exercise cell may rely on
#: these and on nothing else from earlier cells (the tests load exercise cells on their own).
#: quack_edu comes first: it pins the DSL's target to sm_90a before cutlass is imported.
PRELUDE = (
    "import quack_edu\n"
    "import torch\n"
    "import cutlass\n"
    "import cutlass.cute as cute\n"
    "from cutlass import Float32, Int32\n"
)

#: cell metadata that changes with every run and never belongs in the repository
VOLATILE_CELL_METADATA = ("execution", "collapsed", "scrolled", "jupyter", "ExecuteTime")


# ---- paths ------------------------------------------------------------------------------------
def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def solutions_dir() -> Path:
    return repo_root() / "solutions"


def notebooks_dir() -> Path:
    return repo_root() / "notebooks"


def lesson_of(nb, path: Path | None = None) -> str:
    meta = nb.metadata.get("quack_edu", {})
    if meta.get("lesson"):
        return meta["lesson"]
    if path is not None:
        return Path(path).stem
    raise ValueError("cannot tell the lesson: no metadata.quack_edu.lesson and no path")


# ---- nbgrader metadata ------------------------------------------------------------------------
def nbgrader_meta(grade_id: str, *, solution=False, grade=False, locked=False, points=None) -> dict:
    meta = dict(
        schema_version=NBGRADER_SCHEMA,
        grade=grade,
        locked=locked,
        solution=solution,
        grade_id=grade_id,
    )
    if grade:
        meta["points"] = points if points is not None else 0
    return meta


def exercise_cells(ex: Exercise, solution_source: str, check_source: str | None = None):
    """The two cells of an exercise in a solution notebook: the answer cell (nbgrader solution
    cell) and the check cell (nbgrader autograder-tests cell, read-only, carrying the points)."""
    if check_source is None:
        check_source = (
            f'check("{ex.id}", {ex.answer})\n{BEGIN_HIDDEN}\n'
            f'check("{ex.id}", {ex.answer}, hidden=True)\n{END_HIDDEN}'
        )
    answer = nbformat.v4.new_code_cell(solution_source)
    answer.metadata["nbgrader"] = nbgrader_meta(ex.cell_id, solution=True)
    answer.metadata["tags"] = ["exercise"]
    test = nbformat.v4.new_code_cell(check_source)
    test.metadata["nbgrader"] = nbgrader_meta(
        ex.test_cell_id, grade=True, locked=True, points=ex.max_points
    )
    test.metadata["tags"] = ["check"]
    return answer, test


def _nbg(cell) -> dict:
    return cell.metadata.get("nbgrader", {}) or {}


def grade_id(cell) -> str | None:
    return _nbg(cell).get("grade_id")


def is_solution_cell(cell) -> bool:
    return bool(_nbg(cell).get("solution"))


def is_test_cell(cell) -> bool:
    m = _nbg(cell)
    return bool((m.get("grade") or m.get("locked")) and not m.get("solution"))


def find_cell(nb, gid: str):
    return next((c for c in nb.cells if grade_id(c) == gid), None)


# ---- solution -> student ----------------------------------------------------------------------
def replace_regions(source: str, begin: str, end: str, stub: list[str] | None) -> tuple[str, bool]:
    out, inside, found = [], False, False
    for line in source.split("\n"):
        s = line.strip()
        if s == begin:
            if inside:
                raise ValueError(f"nested {begin!r}")
            inside = found = True
            if stub is not None:
                indent = line[: line.find(begin)]
                out += [indent + st for st in stub]
        elif s == end:
            if not inside:
                raise ValueError(f"{end!r} without {begin!r}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{begin!r} without {end!r}")
    return "\n".join(out), found


def clean_cell(cell) -> None:
    """Clear outputs and volatile metadata in place."""
    if cell.cell_type == "code":
        cell.outputs = []
        cell.execution_count = None
    for key in VOLATILE_CELL_METADATA:
        cell.metadata.pop(key, None)


def to_student(nb, source_path: str | None = None):
    """The learner's copy of a solution notebook (a new notebook; the input is not changed)."""
    nb = copy.deepcopy(nb)
    for i, cell in enumerate(nb.cells):
        where = f"cell {i} ({grade_id(cell) or cell.cell_type})"
        stub = (CODE_STUB if cell.cell_type == "code" else TEXT_STUB).split("\n")
        try:
            src, replaced = replace_regions(cell.source, BEGIN_SOLUTION, END_SOLUTION, stub)
            src, hidden = replace_regions(src, BEGIN_HIDDEN, END_HIDDEN, None)
        except ValueError as e:
            raise ValueError(f"{source_path or 'notebook'}, {where}: {e}") from None
        if replaced and not is_solution_cell(cell):
            raise ValueError(f"{where}: a solution region in a cell not marked nbgrader.solution")
        if hidden and not _nbg(cell).get("grade"):
            raise ValueError(f"{where}: hidden tests in a cell not marked nbgrader.grade")
        if is_solution_cell(cell) and not replaced:
            src = "\n".join(stub)  # nbgrader: a solution cell without markers is all solution
        cell.source = src.rstrip("\n") if hidden else src
        clean_cell(cell)
    meta = nb.metadata.setdefault("quack_edu", {})
    meta["student"] = True
    if source_path:
        meta["generated_from"] = str(source_path)
    return nb


def read(path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def write(nb, path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def student_for(solution_path: Path) -> nbformat.NotebookNode:
    solution_path = Path(solution_path)
    rel = f"solutions/{solution_path.name}"
    return to_student(read(solution_path), rel)


def _solution_paths(solutions) -> list[Path]:
    return [Path(p) for p in solutions] if solutions else sorted(solutions_dir().glob("*.ipynb"))


def generate_students(solutions=None, out_dir=None) -> list[Path]:
    """Write ``notebooks/NN_*.ipynb`` from ``solutions/NN_*.ipynb``. Returns the paths written."""
    solutions = _solution_paths(solutions)
    out_dir = Path(out_dir) if out_dir else notebooks_dir()
    written = []
    for sol in solutions:
        target = out_dir / sol.name
        write(student_for(sol), target)
        written.append(target)
    return written


def comparable(nb) -> dict:
    """What must match between a generated notebook and the committed one."""
    cells = []
    for c in nb.cells:
        meta = {k: v for k, v in c.metadata.items() if k not in VOLATILE_CELL_METADATA}
        cells.append(
            dict(type=c.cell_type, source=c.source, metadata=meta, outputs=c.get("outputs", []))
        )
    nbmeta = {k: v for k, v in nb.metadata.items() if k in ("quack_edu", "kernelspec")}
    return dict(cells=cells, metadata=nbmeta)


def out_of_date(solutions=None, out_dir=None) -> list[str]:
    """Student notebooks that differ from what their solutions generate (empty: up to date)."""
    solutions = _solution_paths(solutions)
    out_dir = Path(out_dir) if out_dir else notebooks_dir()
    stale = []
    for sol in solutions:
        target = out_dir / sol.name
        if not target.exists():
            stale.append(f"{target}: missing")
            continue
        want, have = comparable(student_for(sol)), comparable(read(target))
        if want != have:
            n = next(
                (
                    i
                    for i, (a, b) in enumerate(itertools.zip_longest(want["cells"], have["cells"]))
                    if a != b
                ),
                None,
            )
            stale.append(
                f"{target}: differs from {sol}"
                + (f" at cell {n}" if n is not None else " (metadata)")
            )
    return stale


def validate_solution(nb, lesson: str) -> list[str]:
    """Problems with a solution notebook's exercise cells (empty: fine)."""
    problems = []
    ids = [grade_id(c) for c in nb.cells if grade_id(c)]
    dup = {g for g in ids if ids.count(g) > 1}
    if dup:
        problems.append(f"duplicate grade_ids {sorted(dup)}")
    for g in ids:
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", g):
            problems.append(f"grade_id {g!r} has characters nbgrader does not allow")
    exercises = all_exercises(lesson)
    known = {ex.cell_id for ex in exercises} | {ex.test_cell_id for ex in exercises}
    for g in ids:
        if g not in known:
            problems.append(f"cell {g!r} belongs to no registered exercise of {lesson}")
    for ex in exercises:
        a, t = find_cell(nb, ex.cell_id), find_cell(nb, ex.test_cell_id)
        if a is None or not is_solution_cell(a):
            problems.append(f"{ex.id}: no solution cell with grade_id {ex.cell_id!r}")
        elif BEGIN_SOLUTION not in a.source:
            problems.append(f"{ex.id}: the solution cell has no {BEGIN_SOLUTION!r} region")
        elif not re.search(
            rf"\bdef {re.escape(ex.answer)}\b|\b{re.escape(ex.answer)}\s*=", a.source
        ):
            problems.append(f"{ex.id}: the solution cell does not define {ex.answer!r}")
        if t is None or not is_test_cell(t):
            problems.append(f"{ex.id}: no check cell with grade_id {ex.test_cell_id!r}")
        else:
            m = _nbg(t)
            if m.get("points") != ex.max_points:
                problems.append(
                    f"{ex.id}: check cell has {m.get('points')} points, the "
                    f"registry says {ex.max_points}"
                )
            if f'check("{ex.id}"' not in t.source:
                problems.append(f"{ex.id}: the check cell does not call check({ex.id!r}, ...)")
        if a is not None and t is not None and nb.cells.index(a) > nb.cells.index(t):
            problems.append(f"{ex.id}: the check cell comes before the answer cell")
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code" and (c.outputs or c.execution_count):
            problems.append(f"cell {i} has outputs: solutions are committed without outputs")
            break
    return problems


# ---- an exercise cell as a module (for tests and instructors) ---------------------------------
_counter = itertools.count()


def answer_from_source(source: str, name: str, prelude: str = PRELUDE):
    """Execute an exercise cell's source as a module (so the DSL can read its source) and return
    the object called ``name`` (or ``MISSING``). Raises what the source raises at import."""
    import linecache
    import shutil

    d = Path(tempfile.mkdtemp(prefix="quack_edu_answer_"))
    modname = f"quack_edu_answer_{os.getpid()}_{next(_counter)}"
    path = d / f"{modname}.py"
    text = prelude + "\n" + source + "\n"
    path.write_text(text)
    # its text stays where inspect (and so the DSL) reads it, the line cache: the file goes
    # (mtime None: never checked against a file)
    linecache.cache[str(path)] = (len(text), None, text.splitlines(True), str(path))
    try:
        spec = importlib.util.spec_from_file_location(modname, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module
        spec.loader.exec_module(module)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return getattr(module, name, MISSING)


def exercise_source(nb, ex: Exercise) -> str:
    cell = find_cell(nb, ex.cell_id)
    if cell is None:
        raise KeyError(f"{ex.id}: no cell {ex.cell_id!r} in the notebook")
    return cell.source
