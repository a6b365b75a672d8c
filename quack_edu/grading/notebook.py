"""Running and grading a notebook (the notebook files themselves: ``nbfiles``).

Grading (nbgrader's model, without nbgrader)
    ``grade_notebook`` runs a learner's notebook headless in a fresh kernel, cell by cell, with
    a per-cell timeout (``executor``: a Jupyter kernel, or a child Python without Jupyter).
    Check cells are overwritten by the solution's version (without its hidden checks), as
    nbgrader does with its read-only test cells. A cell that raises does not stop the run; a
    cell that runs past the timeout is interrupted (and the kernel restarted and the cells
    before it replayed if the interrupt does not take). That run reports cell errors, hangs
    and crashes, mapped to exercises by grade_id; it decides nothing else (its ``check`` calls
    do nothing, it gets no seed and no hidden checks). Each exercise is then judged from its
    answer cell's source by ``judge``, in processes the notebook never ran in.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import tempfile
import time
from pathlib import Path

from . import answer_key
from .deadline import RunBounds
from .executor import (  # noqa: F401  (re-exported: notebook.CellEvent)
    CellEvent,
    ChildEngine,
    Executor,
    child_env,
)
from .nbfiles import (  # noqa: F401  (re-exported: notebook.read ...)
    BEGIN_HIDDEN,
    BEGIN_SOLUTION,
    CODE_STUB,
    END_HIDDEN,
    END_SOLUTION,
    NBGRADER_SCHEMA,
    PRELUDE,
    TEXT_STUB,
    VOLATILE_CELL_METADATA,
    answer_from_source,
    clean_cell,
    comparable,
    exercise_cells,
    exercise_source,
    find_cell,
    generate_students,
    grade_id,
    is_solution_cell,
    is_test_cell,
    lesson_of,
    nbformat,
    nbgrader_meta,
    notebooks_dir,
    out_of_date,
    read,
    replace_regions,
    repo_root,
    solutions_dir,
    student_for,
    to_student,
    validate_solution,
    write,
)
from .registry import Exercise, all_exercises
from .report import FAIL, NOT_ATTEMPTED, ExerciseResult, NotebookResult, RunResult
from .submission import REFUSED, Refused, read_notebook


# ---- grading ----------------------------------------------------------------------------------
def _kernel_env() -> dict:
    """The notebook kernel's environment: the grading marker, and nothing the grade depends on
    (no seed, no results file, no path to the solutions)."""
    from .runner import ENV_GRADING

    env = child_env(
        {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("QUACK_EDU_GRAD") and k not in ("PWD", "OLDPWD")
        }
    )
    env[ENV_GRADING] = "1"
    env.setdefault("MPLBACKEND", "Agg")
    env.pop("JPY_PARENT_PID", None)
    return env


def _prepare(nb, lesson: str, solutions: Path | None) -> tuple[object, list[str]]:
    """Overwrite check cells from the solution (without its hidden tests); re-add missing ones."""
    notes = []
    nb = copy.deepcopy(nb)
    sol_path = (solutions / f"{lesson}.ipynb") if solutions else None
    if not sol_path or not sol_path.exists():
        notes.append(
            f"no solution notebook {sol_path}: check cells run as the learner left them "
            "(the hidden checks still run: they live in the registry)"
        )
        return nb, notes
    sol = read(sol_path)
    for cell in sol.cells:
        if not is_test_cell(cell):
            continue
        mine = find_cell(nb, grade_id(cell))
        if mine is None:
            nb.cells.append(copy.deepcopy(cell))
            notes.append(f"check cell '{grade_id(cell)}' was missing and was put back at the end")
        else:
            mine.source = cell.source
            mine.cell_type = "code"
    for cell in nb.cells:
        if is_test_cell(cell):  # the hidden checks never enter the learner's kernel
            cell.source = replace_regions(cell.source, BEGIN_HIDDEN, END_HIDDEN, None)[0]
        clean_cell(cell)
    return nb, notes


def lesson_by_cells(nb) -> str | None:
    """The lesson whose exercise cells the notebook holds (most of them), from its cells'
    grade_ids rather than from what its metadata says."""
    counts: dict[str, int] = {}
    for ex in all_exercises():
        if find_cell(nb, ex.cell_id) is not None:
            counts[ex.lesson] = counts.get(ex.lesson, 0) + 1
    return max(sorted(counts), key=counts.get) if counts else None


def _which_lesson(nb, path: Path, expected: str | None) -> tuple[str, list[str]]:
    """The lesson to grade and the flags raised on the way (metadata that claims another
    lesson than the cells, a submission of another lesson than the one expected)."""
    flags = []
    claimed = nb.metadata.get("quack_edu", {}).get("lesson")
    cells = lesson_by_cells(nb)
    if claimed and cells and claimed != cells:
        flags.append(
            f"the notebook's metadata says lesson {claimed!r} but its exercise cells are "
            f"lesson {cells!r}'s"
        )
    lesson = expected or cells or lesson_of(nb, path)
    if expected and cells and cells != expected:
        flags.append(f"the exercise cells are lesson {cells!r}'s, not {expected!r}'s")
    return lesson, flags


def grade_notebook(
    path,
    *,
    solutions: Path | str | None = None,
    timeout: float = 120,
    seed: int | None = None,
    hidden: bool = True,
    executed_dir: Path | str | None = None,
    lesson: str | None = None,
    only: str | None = None,
    run_notebook: bool = True,
    bounds: RunBounds | None = None,
) -> NotebookResult:
    """Execute a notebook headless and grade every exercise of its lesson (or ``lesson``).

    The notebook runs in a fresh kernel for its cell errors, hangs and crashes; each exercise
    is judged by ``judge.judge_exercise`` on its answer cell's source, outside that kernel.
    ``only``: one exercise id, judged without running the notebook (fast feedback).
    ``bounds``: what the run may reach and cost (``deadline.RunBounds``): past its limits the
    cells left are not run, their exercises score 0 and the notebook is flagged; a link, a
    linked folder below its ``root`` or a solution notebook is refused, 0 and flagged.
    """
    from .. import MODE
    from .answer_screen import screen
    from .judge import instructor_paths, judge_exercise

    t0 = time.time()
    path = Path(path)
    bounds = bounds or RunBounds()
    # a --solutions folder outside the repository and the executed notebooks: secrets too
    private = (*bounds.secrets, *instructor_paths(solutions, executed_dir))
    bounds = dataclasses.replace(bounds, secrets=tuple(dict.fromkeys(private)))
    seed = answer_key.seed_for(seed)
    solutions = Path(solutions) if solutions else solutions_dir()
    mode = "gpu" if MODE.gpu else "compile-only"
    try:
        nb = read_notebook(path, bounds.root, solutions)
    except Refused as e:
        return refused(path, lesson, mode, str(e), only)
    except Exception as e:
        res = NotebookResult(str(path), lesson or path.stem, mode=mode)
        res.problems.append(f"cannot read the notebook: {type(e).__name__}: {e}")
        return res
    lesson, flags = _which_lesson(nb, path, lesson)
    ids = [grade_id(c) for c in nb.cells if grade_id(c)]
    twice = sorted({g for g in ids if ids.count(g) > 1})
    if twice:  # (a cell copied in Jupyter keeps its id: red team 10's answer went ungraded)
        flags.append(f"cells share an id ({', '.join(twice)}): the first of each was graded")
    position = {grade_id(c): i for i, c in enumerate(nb.cells) if grade_id(c)}
    exercises = sorted(all_exercises(lesson), key=lambda e: position.get(e.cell_id, 10**9))
    if only:
        exercises = [e for e in exercises if e.id == only]
        run_notebook = False
    res = NotebookResult(str(path), lesson, mode=mode)
    res.flags += flags
    if not exercises:
        res.problems.append(
            f"no exercise {only!r} in lesson {lesson!r}"
            if only
            else f"no exercises are registered for lesson {lesson!r}"
        )
    sources = {
        ex.id: (find_cell(nb, ex.cell_id).source if find_cell(nb, ex.cell_id) else None)
        for ex in exercises
    }
    events: dict[str, list[CellEvent]] = {ex.id: [] for ex in exercises}
    if run_notebook:
        _run_cells(
            nb, path, lesson, solutions, exercises, events, res, timeout, executed_dir, bounds
        )
    for ex in exercises:
        hard = any(e.kind in HARD for e in events[ex.id])
        errored = any(e.kind == "error" and e.grade_id == ex.cell_id for e in events[ex.id])
        judged = None
        # (an answer cell that errored is judged only where the screen flags it: the flag stands)
        if not hard and (
            not errored or (sources[ex.id] is not None and screen(sources[ex.id], ex))
        ):
            judged = judge_exercise(
                ex,
                sources[ex.id],
                hidden=hidden,
                seed=seed,
                gpu=MODE.gpu,
                timeout=timeout,
                secrets=bounds.secrets,
            )
        res.exercises.append(_final_result(ex, judged, events[ex.id], timeout, mode))
    res.seconds = time.time() - t0
    return res


#: the events after which an exercise is not judged: it scores 0 with the event's reason
HARD = ("timeout", "died", "stopped")


def refused(path: Path, lesson: str | None, mode: str, why: str, only=None) -> NotebookResult:
    """A submission the grader did not read (``submission.Refused``): its lesson's exercises
    (``lesson``, else the one its file name names; ``only``: that one) score 0, and it is
    flagged with ``why``."""
    from .registry import lessons

    lesson = lesson or next((le for le in lessons() if le in path.name), path.stem)
    res = NotebookResult(str(path), lesson, mode=mode)
    res.flags.append(f"{REFUSED}: {why}")
    for ex in all_exercises(lesson) if lesson in lessons() else []:
        if only and ex.id != only:
            continue
        r = ExerciseResult(ex.id, ex.title, ex.lesson, dict(ex.points), mode=mode)
        r.forced_status, r.forced_message = FAIL, f"not graded: {why}"
        res.exercises.append(r)
    return res


def _run_cells(
    nb,
    path,
    lesson,
    solutions,
    exercises,
    events,
    res,
    timeout,
    executed_dir,
    bounds: RunBounds,
):
    """Run the notebook's cells in a locked-down child Python (``ChildEngine`` with
    ``sandbox.lock_down``: a scratch folder of its own, no processes, no files outside it, none
    of ``judge.secret_paths(bounds.secrets)``), killed with its process group at the end; its
    cell errors, timeouts and crashes go to ``events`` (by exercise) or ``res.problems``; a run
    stopped by the bounds' limits flags the notebook."""
    nb, notes = _prepare(nb, lesson, solutions)
    res.problems += notes
    by_cell = {}
    for ex in exercises:
        by_cell[ex.cell_id] = ex.id
        by_cell[ex.test_cell_id] = ex.id

    def exercise_of(cell) -> str | None:
        return by_cell.get(grade_id(cell) or "")

    from .judge import secret_paths
    from .report import shown_text
    from .sandbox import SCRATCH_ENV
    from .sandbox_rules import incident_kind

    with tempfile.TemporaryDirectory(prefix="quack_edu_grade_") as tmp:
        scratch = str(Path(tmp) / "scratch")  # the cells' own folder (sandbox.lock_down)
        env = _kernel_env()
        for var, sub in SCRATCH_ENV.items():  # caches and dumps inside it, from the start
            env[var] = f"{scratch}/tmp/{sub}"
        log = Path(tmp) / "cells.log"
        policy = {"scratch": scratch, "secrets": secret_paths(bounds.secrets)}
        try:
            with ChildEngine(env, tmp, timeout, log, sandbox=policy) as engine:
                run = Executor(
                    nb, engine, exercise_of, max_restarts=bounds.max_restarts,
                    budget_s=bounds.budget_s,
                )  # fmt: skip
                for ran in run.run():
                    ev = ran.event
                    if ev is None:
                        continue
                    ex_id = by_cell.get(ev.grade_id or "")
                    if ex_id:
                        events[ex_id].append(ev)
                    elif ev.kind != "stopped":  # (said once, in the flag below)
                        res.problems.append(ev.describe(timeout))
                # (the cells' process's own text: fixed words for the student, whole in the
                # instructor's record)
                kinds = dict.fromkeys(incident_kind(w) for w in engine.incidents)
                res.flags += [f"a cell, flagged by the grader's sandbox ({k})" for k in kinds]
                res.evidence += [shown_text(w, 4000) for w in engine.incidents[:20]]
                if run.stopped:
                    res.flags.append(
                        f"the grader stopped running the notebook at cell {run.stopped_at}: "
                        f"{run.stopped}; the exercises with a cell not run score 0"
                    )
        except Exception as e:  # the cell worker could not start
            res.problems.append(f"the grader could not run the notebook: {type(e).__name__}: {e}")
        if executed_dir:
            write(nb, Path(executed_dir) / path.name)


def _final_result(
    ex: Exercise, judged: ExerciseResult | None, events: list[CellEvent], timeout, mode
) -> ExerciseResult:
    from . import hints

    r = judged or ExerciseResult(ex.id, ex.title, ex.lesson, dict(ex.points), mode=mode)
    r.points = dict(ex.points)  # the registry, not the notebook, decides the points
    hard = [e for e in events if e.kind in HARD]
    answer_errors = [e for e in events if e.kind == "error" and e.grade_id == ex.cell_id]
    if hard:
        e = hard[0]
        r.forced_status = FAIL
        hint = {"timeout": ex.timeout_hint or hints.TIMEOUT, "stopped": hints.STOPPED}
        hint = hint.get(e.kind, hints.DIED)
        r.forced_message = f"{e.describe(timeout)}. hint: {hint}"
    elif judged is not None and judged.flagged:
        pass  # the judge's flag stands (its answer cell's own error is a consequence)
    elif answer_errors:
        e = answer_errors[0]
        if e.ename == "NotImplementedError":
            r.forced_status = NOT_ATTEMPTED
            r.forced_message = "not attempted: the exercise cell raises NotImplementedError"
        else:
            r.forced_status = FAIL
            r.forced_message = f"the exercise cell must run cleanly: {e.describe(timeout)}"
    elif judged is None:
        r.forced_status = FAIL
        why = "; ".join(e.describe(timeout) for e in events) or "no result came back"
        r.forced_message = f"not graded: {why}"
    for e in events:
        if e.kind == "error" and e.grade_id != ex.cell_id and e.grade_id and judged is not None:
            r.notes.append(e.describe(timeout))
    return r


def grade_paths(paths, **kwargs) -> RunResult:
    from .. import MODE

    seed = kwargs.pop("seed", None)
    seed = answer_key.seed_for(seed)
    hidden = kwargs.get("hidden", True)
    results = [grade_notebook(p, seed=seed, **kwargs) for p in paths]
    return RunResult(results, "gpu" if MODE.gpu else "compile-only", MODE.reason, hidden, seed)
