"""Exercises, checks and the grader.

A lesson notebook uses ``quack_edu.lessons.check``, which imports nothing of this package and
has the answer judged by a grader process of its own (``_checkserver``, with ``judge``).
``check`` here runs the checks in the caller's process, for instructors and tests::

    from quack_edu.grading import check
    check("01.rstd", rstd)            # prints a short pass/fail table, returns the result

From the command line (``quack-edu grade``, or ``python -m quack_edu.grading.cli grade``)::

    quack-edu grade notebooks/01_naive.ipynb --json grade.json

``check(..., hidden=True)`` (in the hidden-tests part of a check cell) also runs the hidden
checks and raises ``AssertionError`` when the exercise is not passed, as nbgrader's autograder
expects of a test cell. While ``quack-edu grade`` runs a notebook, ``check`` does nothing: the
grader judges each answer cell in a process of its own (``judge``), never in the notebook's.

See ``registry`` for how exercises are declared, ``checks`` for the check helpers, ``hints`` for
failure signatures, ``notebook`` for the single-source lessons and notebook grading.
"""

from __future__ import annotations

import os

from .registry import (
    COMPILE,
    GPU,
    MISSING,
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
from .runner import ENV_GRADING, run_exercise


def grading() -> bool:
    """True inside a notebook that ``quack-edu grade`` is running."""
    return os.environ.get(ENV_GRADING) == "1"


def check(
    exercise_id: str,
    answer=MISSING,
    *,
    hidden: bool = False,
    quiet: bool = False,
    seed: int | None = None,
) -> ExerciseResult | None:
    """Check an answer: print a pass/fail table (what was expected, what was seen, a hint).

    ``hidden=True`` adds the hidden checks (more shapes, a fresh seed) and raises AssertionError
    unless every check that can run here passes.

    This runs the checks in the caller's process (instructors, tests); a lesson's learner
    uses ``quack_edu.lessons.check``, judged outside the notebook. While ``quack-edu grade``
    runs the notebook it does nothing: the grader judges the answer cell in a process of its
    own (``judge``), and nothing done here changes the grade.
    """
    if grading():  # the exercises are out of this process's reach while it is graded
        if not quiet:
            print(f"{exercise_id}: judged by the grader, outside this notebook")
        return None
    ex = get(exercise_id)
    res = run_exercise(ex, answer, hidden=hidden, seed=seed)
    if not quiet:
        print(res.table())
    if hidden and res.status not in ("pass", "skip"):
        raise AssertionError(f"{res.summary()}: {'; '.join(res.failures)[:2000]}")
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
    "get",
    "grading",
    "lessons",
    "register",
    "run_exercise",
]
