"""What a student reads of a hidden check (red team 6, attack 17): that it failed and its hint,
never its cases. A class is graded with one seed, kept in ``run.json`` for every regrade, so a
hidden case shown in the feedback (its inputs, what was expected, what the answer returned)
goes into a lookup table at the next resubmission. The instructor's record
(``results/<student>/<lesson>.json``) keeps them."""

from __future__ import annotations

import json

import pytest

from quack_edu.grading import get
from quack_edu.grading.cli import grade_main
from quack_edu.grading.notebook import find_cell, notebooks_dir, read, write
from quack_edu.grading.report import (
    HIDDEN_CASE_FAILED,
    CheckResult,
    ExerciseResult,
    NotebookResult,
    RunResult,
)

LESSON = "00_setup_and_roofline"
#: an answer whose returned value names its inputs (the report's channel, attack 3)
TELLS = "def bytes_moved(M, N, dtype):\n    return f'LEAK {M} {N} {dtype}'\n"


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_a_hidden_checks_cases_are_in_no_report_a_student_reads():
    from quack_edu.grading.class_grade import feedback_text, notebook_record

    hidden = CheckResult(
        "random shapes (grading seed)",
        "compile",
        "fail",
        message="bytes_moved(63472, 39050, float16) is wrong",
        expected="9914404500",
        seen="'LEAK 63472 39050'",
        hint="count both the read and the write",
        hidden=True,
    )
    visible = CheckResult(
        "fixed shapes", "compile", "fail", message="bytes_moved(7, 3, float32) is wrong"
    )
    passed = CheckResult("compiles at a random N", "compile", "pass", "bf16 N=4567", hidden=True)
    ex = ExerciseResult("00.x", "t", LESSON, {"compile": 1}, checks=[visible, hidden, passed])
    nb = NotebookResult("nb.ipynb", LESSON, exercises=[ex])
    run = RunResult([nb], "compile-only", "no GPU", hidden=True, seed=2054469928)
    secret = ("63472", "39050", "9914404500", "LEAK", "4567", "2054469928")
    for text in (
        feedback_text("dan", nb, False),
        nb.table(width=100),
        run.table(width=100),
        run.dumps(),
        ex.table(width=100, hidden_inputs=False),
    ):
        flat = _flat(text)
        assert not [s for s in secret if s in flat], text
        assert "bytes_moved(7, 3, float32)" in flat  # a visible check's case is shown
        assert "count both the read and the write" in flat  # the hint is
        assert _flat(HIDDEN_CASE_FAILED) in flat
    record = json.dumps(notebook_record(nb))  # the instructor's
    assert all(s in record for s in secret[:-1]), record


@pytest.mark.slow
def test_a_class_and_a_single_grade_show_no_hidden_case(tmp_path, capsys):
    # the repro's answer, judged on its own (--only: the notebook is not run), in a class and
    # alone: the instructor's record names the hidden cases, nothing the student reads does
    ex = get("00.bytes_moved")
    nb = read(notebooks_dir() / f"{LESSON}.ipynb")
    find_cell(nb, ex.cell_id).source = TELLS
    subs, out = tmp_path / "subs", tmp_path / "grades"
    write(nb, subs / "dan" / f"{LESSON}.ipynb")
    args = [str(subs), "--lesson", LESSON, "--out", str(out), "--only", ex.id, "--seed", "7"]
    assert grade_main(args) == 0
    rec = json.loads((out / "results" / "dan" / f"{LESSON}.json").read_text())
    (judged,) = rec["result"]["exercises"]
    hidden = [c for c in judged["checks"] if c["hidden"] and c["status"] == "fail"]
    assert hidden and all("LEAK" in c["seen"] for c in hidden), judged["checks"]
    told = {c["seen"].strip("'\"") for c in hidden} | {c["message"] for c in hidden}
    told |= {c["expected"] for c in hidden}
    visible = [c for c in judged["checks"] if not c["hidden"] and c["status"] == "fail"]
    feedback = (out / "feedback" / "dan" / f"{LESSON}.txt").read_text()
    assert visible[0]["message"] in _flat(feedback)
    capsys.readouterr()
    path = subs / "dan" / f"{LESSON}.ipynb"
    single = tmp_path / "one.json"
    assert grade_main([str(path), "--only", ex.id, "--seed", "7", "--json", str(single)]) == 1
    printed = capsys.readouterr().out
    for text in (feedback, printed, single.read_text()):
        flat = _flat(text)
        assert _flat(HIDDEN_CASE_FAILED) in flat
        assert not [t for t in told if _flat(t) in flat], (told, text)
