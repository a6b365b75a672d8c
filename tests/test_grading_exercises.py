"""Every registered exercise, from its own solution notebook: the solution passes, the blank
student version is "not attempted", every mutant fails with its hint.

Nothing here names an exercise: a lesson that registers an exercise (and its mutants) is tested
by these functions as it is. The compile tier runs everywhere (CI); the ``gpu`` variants run on
a Hopper GPU (the lead's H200 check).
"""

from __future__ import annotations

import functools

import pytest

from quack_edu.grading import COMPILE, GPU, MISSING, all_exercises, run_exercise
from quack_edu.grading.notebook import (
    answer_from_source,
    exercise_source,
    read,
    solutions_dir,
    to_student,
)

EXERCISES = all_exercises()
MUTANTS = [(ex, m) for ex in EXERCISES for m in ex.mutants]


def _id(x):
    return x.id if hasattr(x, "id") else None


@functools.cache
def _solution_nb(lesson):
    return read(solutions_dir() / f"{lesson}.ipynb")


def _solution_source(ex):
    return exercise_source(_solution_nb(ex.lesson), ex)


def _answer(ex, source):
    return answer_from_source(source, ex.answer)


def _hint_of_failures(res, tiers):
    return [
        f"{c.hint or ''} | {c.message or ''}"
        for c in res.checks
        if c.status == "fail" and c.tier in tiers
    ]


def test_every_exercise_is_complete():
    assert EXERCISES, "no exercises registered"
    for ex in EXERCISES:
        assert any(c.tier == COMPILE for c in ex.checks), f"{ex.id}: no compile-tier check"
        assert any(c.hidden for c in ex.checks), f"{ex.id}: no hidden check"
        assert len(ex.mutants) >= 2, f"{ex.id}: fewer than two mutants"
        assert (solutions_dir() / f"{ex.lesson}.ipynb").exists(), f"{ex.id}: no solution notebook"


@pytest.mark.parametrize("ex", EXERCISES, ids=_id)
def test_solution_passes_compile_tier(ex):
    # the visible checks, in this process: what a learner's check cell runs. The hidden ones
    # run judged, as graded, on every solution notebook in tests/test_grading_cli.py (and
    # in-process on a GPU below): compiling them twice on CI's 2 cores bought nothing
    res = run_exercise(ex, _answer(ex, _solution_source(ex)), seed=7, gpu=False)
    assert res.status == "pass", res.table()
    assert res.score == res.max_score == ex.points.get(COMPILE, 0)
    assert all(c.status == "skip" for c in res.checks if c.tier == GPU)


@pytest.mark.parametrize("ex", EXERCISES, ids=_id)
def test_blank_student_version_is_not_attempted(ex):
    student = to_student(_solution_nb(ex.lesson))
    res = run_exercise(ex, _answer(ex, exercise_source(student, ex)), hidden=True, gpu=False)
    assert res.status == "not attempted", res.table()
    assert res.score == 0
    assert any("not attempted" in f for f in res.failures)


@pytest.mark.parametrize("ex", EXERCISES, ids=_id)
def test_missing_answer_is_not_attempted(ex):
    res = run_exercise(ex, MISSING, gpu=False)
    assert res.status == "not attempted" and res.score == 0
    assert ex.answer in res.failures[0]


@pytest.mark.parametrize("ex,mutant", MUTANTS, ids=lambda x: getattr(x, "id", None) or x.name)
def test_mutant_fails_compile_tier_with_its_hint(ex, mutant):
    if COMPILE not in mutant.tiers:
        pytest.skip(f"{mutant.name!r} is only visible in values (gpu tier)")

    def found(r):  # the failure this mutant is about: the checks after it need not run
        return r.status == "fail" and r.tier == COMPILE and mutant.hint in f"{r.hint} {r.message}"

    answer = _answer(ex, mutant.apply(_solution_source(ex)))
    res = run_exercise(ex, answer, seed=3, gpu=False, stop_after=found)
    assert res.status != "pass" and res.tiers()[COMPILE]["score"] == 0, res.table()
    hints = _hint_of_failures(res, (COMPILE,))
    assert any(mutant.hint in h for h in hints), f"{mutant.hint!r} not in {hints}\n{res.table()}"


# ---- gpu tier (Hopper) ------------------------------------------------------------------------
GPU_EXERCISES = [ex for ex in EXERCISES if ex.points.get(GPU)]
GPU_MUTANTS = [(ex, m) for ex, m in MUTANTS if ex.points.get(GPU)]


@pytest.mark.gpu
@pytest.mark.parametrize("ex", GPU_EXERCISES, ids=_id)
def test_solution_passes_gpu_tier(ex):
    res = run_exercise(ex, _answer(ex, _solution_source(ex)), hidden=True, seed=11, gpu=True)
    assert res.status == "pass", res.table()
    assert res.score == res.max_score == ex.max_points


@pytest.mark.gpu
@pytest.mark.parametrize("ex", GPU_EXERCISES, ids=_id)
def test_blank_student_version_is_not_attempted_gpu(ex):
    student = to_student(_solution_nb(ex.lesson))
    res = run_exercise(ex, _answer(ex, exercise_source(student, ex)), gpu=True)
    assert res.status == "not attempted" and res.score == 0, res.table()


@pytest.mark.gpu
@pytest.mark.parametrize("ex,mutant", GPU_MUTANTS, ids=lambda x: getattr(x, "id", None) or x.name)
def test_mutant_fails_gpu_tier_with_its_hint(ex, mutant):
    res = run_exercise(ex, _answer(ex, mutant.apply(_solution_source(ex))), seed=5, gpu=True)
    assert res.status != "pass", res.table()
    if GPU in mutant.tiers:  # else only the compile tier can see it (values may be right)
        assert res.tiers()[GPU]["score"] == 0, res.table()
        hints = _hint_of_failures(res, (GPU,))
        assert any(mutant.hint in h for h in hints), f"{mutant.hint!r} not in {hints}"
