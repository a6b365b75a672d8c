"""The library's version of an answer waits for the learner's own (issue 50: a cold learner ran
the cell under an exercise's check before writing the exercise, and the library's answer was on
the page).

The gate: ``check`` remembers in the notebook's process the exercises whose answer passed
(``selfcheck.passed``); ``show_kernel``, ``show_excerpt`` and ``show_source`` with
``after=exercise_id``, or the calls under ``if revealed(exercise_id):``, print the library's text
only then, and one line until then; nothing while ``quack-edu grade`` runs the notebook.
"""

from __future__ import annotations

import inspect

import pytest

from quack_edu.lessons import selfcheck, show
from quack_edu.lessons.show import render_text, revealed, show_excerpt, show_kernel, show_source
from quack_edu.primitives import reduce as reduce_utils


# ---- the gate ---------------------------------------------------------------------------------
@pytest.fixture
def session(monkeypatch):
    """A notebook session outside the grader, no check passed yet; ``judge(id, status)`` runs
    ``check`` against a grader that answers ``status``."""
    monkeypatch.delenv(selfcheck.ENV_GRADING, raising=False)
    monkeypatch.setattr(selfcheck, "_passed", set())

    def judge(exercise_id: str, status: str):
        def reply(req):
            rec = {"id": req["exercise"], "status": status, "score": 0, "max_score": 2}
            return {"ok": True, "result": rec, "table": "", "summary": ""}

        def answer():
            pass

        monkeypatch.setattr(selfcheck, "_ask", reply)
        return selfcheck.check(exercise_id, answer, quiet=True)

    return judge


def _line(*ids: str) -> str:
    checks = " and ".join(f'`check("{i}", ...)`' for i in ids)
    verb = "passes" if len(ids) == 1 else "pass"
    return f"the library's version is shown here once your {checks} {verb}\n"


def test_until_the_check_passes_one_line_and_nothing_of_the_source(session, capsys):
    source = render_text("warp", "naive")
    for status in (None, "fail", "error"):
        if status:
            assert not session("02.warp_kernel", status).passed
        show_kernel("warp", prev="naive", after="02.warp_kernel")
        out = capsys.readouterr().out
        assert out == _line("02.warp_kernel")
        assert "def kernel" not in out and "local_tile" not in out
    assert source.count("\n") > 20  # what it held back
    show_source(reduce_utils.warp_reduce, after="02.warp_reduce")
    show_excerpt("warp", "tXrX = ", "rstd = ", after="02.warp_kernel")
    out = capsys.readouterr().out
    assert out == _line("02.warp_reduce") + _line("02.warp_kernel")
    assert not revealed("02.warp_reduce")


def test_once_the_check_passed_the_source(session, capsys):
    assert session("02.warp_kernel", "pass").passed
    assert selfcheck.passed("02.warp_kernel") and not selfcheck.passed("02.warp_reduce")
    show_kernel("warp", prev="naive", after="02.warp_kernel")
    assert capsys.readouterr().out == render_text("warp", "naive")
    show_source(reduce_utils.warp_reduce, after="02.warp_reduce")  # another exercise's
    assert capsys.readouterr().out == _line("02.warp_reduce")
    session("02.warp_reduce", "pass")
    show_source(reduce_utils.warp_reduce, after="02.warp_reduce")
    assert capsys.readouterr().out == inspect.getsource(reduce_utils.warp_reduce) + "\n"


def test_a_gate_on_two_exercises_names_those_still_to_pass(session, capsys):
    both = ("06.persistent_kernel", "06.row_loop")
    assert not revealed(both)
    assert capsys.readouterr().out == _line(*both)
    session("06.row_loop", "pass")
    assert not revealed(both)
    assert capsys.readouterr().out == _line("06.persistent_kernel")
    session("06.persistent_kernel", "pass")
    assert revealed(both) and capsys.readouterr().out == ""
    assert revealed(None)  # no gate: always shown


def test_while_grading_nothing_is_shown(session, capsys, monkeypatch):
    session("02.warp_kernel", "pass")
    monkeypatch.setenv(selfcheck.ENV_GRADING, "1")
    assert selfcheck.check("02.warp_kernel", quiet=True) is None  # the grader judges the cell
    assert not selfcheck.passed("02.warp_kernel")
    show_kernel("warp", prev="naive", after="02.warp_kernel")
    show_source(reduce_utils.warp_reduce, after="02.warp_kernel")
    assert capsys.readouterr().out == ""
    assert show.gate_message("02.warp_kernel") + "\n" == _line("02.warp_kernel")
