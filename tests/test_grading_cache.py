"""A check cell runs ``check`` and then ``check(..., hidden=True)`` on the same answer: the
kernels compiled for that answer object are shared between the two runs, never between two
answers (a redefined function is a new object and is compiled again)."""

from __future__ import annotations

from quack_edu.grading import get
from quack_edu.grading.context import _SHARED, Context
from quack_edu.grading.exercises.lesson01 import RSTD_HOLE
from quack_edu.grading.notebook import answer_from_source

SRC = "@cute.jit\ndef rstd(sum_sq, eps, N):\n    return cute.math.rsqrt(sum_sq / N + eps)\n"


def test_compiled_reports_are_shared_by_runs_of_the_same_answer_only():
    ex = get("01.rstd")
    a = answer_from_source(SRC, "rstd")
    b = answer_from_source(SRC, "rstd")
    first = Context(ex, a, hidden=False, seed=1).report(RSTD_HOLE, 1000, "bf16")
    again = Context(ex, a, hidden=True, seed=2).report(RSTD_HOLE, 1000, "bf16")
    assert again is first  # same answer object: compiled once
    other = Context(ex, b, hidden=False, seed=1).report(RSTD_HOLE, 1000, "bf16")
    assert other is not first  # another answer: compiled anew
    # the dtype may be named or a torch dtype: one kernel either way
    import torch

    assert Context(ex, a, hidden=False, seed=3).report(RSTD_HOLE, 1000, torch.bfloat16) is first
    assert any(entry[0] is a for entry in _SHARED.values())  # the entry keeps `a` alive
