"""The gpu tier's own machinery, on a Hopper GPU: the speed check measures the copy bandwidth at
that moment and judges a kernel against a fraction of it (never a fixed number)."""

from __future__ import annotations

import pytest

from quack_edu.grading import GPU, Exercise, run_exercise
from quack_edu.grading.checks import gpu_speed
from quack_edu.grading.exercises.lesson01 import RSTD_HOLE
from quack_edu.grading.notebook import answer_from_source, exercise_source, read, solutions_dir

pytestmark = pytest.mark.gpu


def _rstd_solution():
    from quack_edu.grading import get

    ex = get("01.rstd")
    nb = read(solutions_dir() / f"{ex.lesson}.ipynb")
    return answer_from_source(exercise_source(nb, ex), ex.answer)


def _speed_exercise(fraction):
    ex = Exercise("99.speed", "99_speed", "rstd", "naive kernel speed", {GPU: 1})
    ex.add(gpu_speed(RSTD_HOLE, fraction=fraction, M=8192, N=4096, needs=()))
    return ex


def test_copy_bandwidth_is_plausible():
    from quack_edu.tools.bench import copy_bandwidth

    assert 1000 < copy_bandwidth() < 6000  # an H200 copies at about 4300 GB/s


def test_speed_check_fails_a_slow_kernel_against_the_copy_bandwidth_now():
    res = run_exercise(_speed_exercise(0.5), _rstd_solution(), gpu=True)
    assert res.status == "fail", res.table()
    assert "of the copy bandwidth measured now" in res.checks[0].message
    assert "GB/s" in res.checks[0].seen


def test_speed_check_passes_below_the_fraction():
    res = run_exercise(_speed_exercise(1e-4), _rstd_solution(), gpu=True)
    assert res.status == "pass", res.table()
    assert "of copy" in res.checks[0].message
