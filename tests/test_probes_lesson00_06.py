"""00.eager_rmsnorm and 06.row_loop are judged in the grader from their probes' data
(``grading.probes.lesson00_06``): no check of theirs runs in the learner's process, the probes
module imports no exercise and holds no solution text, a wrong answer's verdict and hint are the
grader's, and data that is not what the probes send fails a check rather than the grader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from quack_edu.grading import COMPILE, get
from quack_edu.grading.judge import judge_exercise
from quack_edu.grading.notebook import find_cell, read, solutions_dir
from quack_edu.grading.registry import CheckFailed

PROBES = "quack_edu.grading.probes.lesson00_06"
EXERCISES = ("00.eager_rmsnorm", "06.row_loop")
#: (exercise, a wrong answer cell's edit of the solution (old, new), a word of its hint): each
#: fails the check that used to run in the learner's process
CASES = [
    ("00.eager_rmsnorm", ("    xf = x.float()\n", "    return x\n"), "elementwise ops and a mean"),
    ("06.row_loop", ("wait_peers(parity, (it // 2) % 2)", "wait_peers(parity, 0)"),
     "wrong mbarrier phase"),
    ("06.row_loop", ("if tidx == 0 and", "if cutlass.Int32 is int and tidx == 0 and"),
     "not armed again"),
]  # fmt: skip


def _source(ex):
    return find_cell(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex.cell_id).source


def test_the_probes_import_no_exercise(subprocess_env):
    code = (
        f"import json, sys\nimport {PROBES}\n"
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.startswith('quack_edu.grading.exercises'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_no_solution_text_in_the_probes():
    import importlib

    src = Path(importlib.import_module(PROBES).__file__).read_text()
    for ex in map(get, EXERCISES):
        for line in _source(ex).splitlines():
            line = line.strip()
            if len(line) >= 16 and not line.startswith("#"):
                assert line not in src, (ex.id, line)
        for m in ex.mutants:
            for old, _ in m.replace:
                assert old.strip() not in src, (ex.id, m.name, old)


@pytest.mark.parametrize("ex_id", EXERCISES)
def test_judged_in_the_grader(ex_id):
    ex = get(ex_id)
    good = judge_exercise(ex, _source(ex), hidden=True, seed=3, timeout=120, gpu=False)
    assert good.status == "pass", good.table()
    assert good.tiers()[COMPILE]["score"] == ex.points[COMPILE], good.table()


@pytest.mark.parametrize("ex_id,edit,hint", CASES, ids=[c[2] for c in CASES])
def test_a_wrong_answer_is_judged_from_its_data(ex_id, edit, hint):
    ex = get(ex_id)
    src = _source(ex)
    assert src.count(edit[0]) == 1
    res = judge_exercise(ex, src.replace(*edit), hidden=True, seed=3, timeout=120, gpu=False)
    assert res.tiers()[COMPILE]["score"] == 0, res.table()
    assert hint in " ".join(f"{c.message} {c.hint}" for c in res.checks if c.status == "fail")


def test_the_replay_comes_back_as_data():
    # what the grader gets of the replayed loop: plain data (through the judge's codec), the
    # values the helpers returned rebuilt as one object each, followed by identity
    from quack_edu.grading.exercises.lesson06_row_loop import _events, judge_loop
    from quack_edu.grading.nbfiles import answer_from_source
    from quack_edu.grading.probes.lesson00_06 import loop_events
    from quack_edu.grading.wire import decode, encode

    ex = get("06.row_loop")
    answer = answer_from_source(_source(ex), ex.answer)
    data = decode(json.loads(json.dumps(encode(loop_events(answer, 3, (0, 1))))))
    ev0, ev1 = _events(data, 2)
    judge_loop(ev0, 3, 0, 10, None)
    firsts = {e[1]: e[4] for e in ev0 if e[0] == "first"}
    sent = [e[1] for e in ev0 if e[0] == "send"]
    assert all(a is firsts[i] for i, a in enumerate(sent)) and len(sent) == 3
    assert repr(sent[0]) == "sum_sq of iteration 0"
    assert [e for e in ev1 if e[0] == "rearm"] == []  # thread 1 arms nothing


@pytest.mark.parametrize(
    "data",
    [None, [[], "x"], [[["issue", 11]], [["jump", 1]]], [[["send", [1, 2], 0]], []]],
    ids=["none", "a string", "an unknown helper", "a list for an argument"],
)
def test_forged_replay_data_fails_the_check(data):
    from quack_edu.grading.exercises.lesson06_row_loop import NO_EVENTS, _events

    with pytest.raises(CheckFailed) as e:
        _events(data, 2)
    assert NO_EVENTS in str(e.value)
