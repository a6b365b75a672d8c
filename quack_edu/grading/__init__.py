"""Exercises, checks and the grader.

In a lesson notebook::

    from quack_edu.grading import check
    check("01.rstd", rstd)            # prints a short pass/fail table, returns the result

From the command line (``quack-edu grade``, or ``python -m quack_edu.grading.cli grade``)::

    quack-edu grade notebooks/01_naive.ipynb --json grade.json

``check(..., hidden=True)`` (in the hidden-tests part of a check cell) also runs the hidden
checks and raises ``AssertionError`` when the exercise is not passed, as nbgrader's autograder
expects of a test cell. While ``quack-edu grade`` runs a notebook, every ``check`` runs the
hidden checks with the grading seed and reports its result to the grader; ``finish_exercise``
grades what no check cell graded.

See ``registry`` for how exercises are declared, ``checks`` for the check helpers, ``hints`` for
failure signatures, ``notebook`` for the single-source lessons and notebook grading.
"""

from __future__ import annotations

import json
import os

from .checks import MISSING, run_exercise
from .registry import (
    COMPILE,
    GPU,
    TIERS,
    Check,
    CheckFailed,
    Exercise,
    Mutant,
    all_exercises,
    get,
    lessons,
    register,
)
from .report import ExerciseResult, NotebookResult, RunResult

ENV_GRADING = "QUACK_EDU_GRADING"
ENV_LOG = "QUACK_EDU_GRADE_LOG"
ENV_SEED = "QUACK_EDU_GRADE_SEED"
ENV_HIDDEN = "QUACK_EDU_GRADE_HIDDEN"

# exercise id -> (id of the answer object graded, result), in this process (the notebook kernel)
_graded: dict[str, tuple[int, ExerciseResult]] = {}


def grading() -> bool:
    """True inside a notebook that ``quack-edu grade`` is running."""
    return os.environ.get(ENV_GRADING) == "1"


def _grading_hidden() -> bool:
    return os.environ.get(ENV_HIDDEN, "1") != "0"


def _grading_seed() -> int | None:
    s = os.environ.get(ENV_SEED)
    return int(s) if s else None


def _record(res: ExerciseResult, answer) -> None:
    _graded[res.id] = (id(answer), res)
    path = os.environ.get(ENV_LOG)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"exercise": res.id, "result": res.to_record()}) + "\n")


def check(
    exercise_id: str,
    answer=MISSING,
    *,
    hidden: bool = False,
    quiet: bool = False,
    seed: int | None = None,
) -> ExerciseResult:
    """Check an answer: print a pass/fail table (what was expected, what was seen, a hint).

    ``hidden=True`` adds the hidden checks (more shapes, a fresh seed) and raises AssertionError
    unless every check that can run here passes.
    """
    ex = get(exercise_id)
    if grading():
        prev = _graded.get(ex.id)
        if prev is not None and prev[0] == id(answer):
            res = prev[1]
            if not quiet:
                print(f"{ex.id}: graded above ({res.summary().split(': ', 1)[1]})")
            return res
        res = run_exercise(ex, answer, hidden=_grading_hidden(), seed=_grading_seed())
        _record(res, answer)
        if not quiet:
            print(res.table())
        return res
    res = run_exercise(ex, answer, hidden=hidden, seed=seed)
    if not quiet:
        print(res.table())
    if hidden and res.status not in ("pass", "skip"):
        raise AssertionError(f"{res.summary()}: {'; '.join(res.failures)[:2000]}")
    return res


def finish_exercise(namespace: dict, exercise_id: str) -> ExerciseResult:
    """Grade ``exercise_id`` on the answer in ``namespace`` unless a check already graded that
    very object (the grader runs this after the notebook, once per exercise)."""
    ex = get(exercise_id)
    answer = namespace.get(ex.answer, MISSING)
    prev = _graded.get(ex.id)
    if prev is not None and prev[0] == id(answer):
        return prev[1]
    res = run_exercise(ex, answer, hidden=_grading_hidden(), seed=_grading_seed())
    _record(res, answer)
    print(res.table())
    return res


__all__ = [
    "COMPILE",
    "GPU",
    "TIERS",
    "Check",
    "CheckFailed",
    "Exercise",
    "ExerciseResult",
    "MISSING",
    "Mutant",
    "NotebookResult",
    "RunResult",
    "all_exercises",
    "check",
    "finish_exercise",
    "get",
    "grading",
    "lessons",
    "register",
    "run_exercise",
]
