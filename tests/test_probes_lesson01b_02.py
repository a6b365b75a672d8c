"""01.scale_kernel and 02.tv_layout are judged in the grader from their probes' data
(``grading.probes.lesson01b_02``): no check of theirs runs in the learner's process, the probes
module imports no exercise, and a wrong answer's verdict and hint are the grader's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from quack_edu.grading import COMPILE, get
from quack_edu.grading.judge import judge_exercise
from quack_edu.grading.notebook import find_cell, read, solutions_dir

PROBES = "quack_edu.grading.probes.lesson01b_02"
#: (exercise, a compile-tier mutant whose reason comes back from the learner's process: an
#: answer that is no kernel (what calling it raised), a layout of size 0 (the DSL's error))
CASES = [("01.scale_kernel", "not a kernel"), ("02.tv_layout", "no elements")]


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


@pytest.mark.slow
@pytest.mark.parametrize("ex_id,mutant", CASES)
def test_judged_in_the_grader(ex_id, mutant):
    ex = get(ex_id)
    src = find_cell(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex.cell_id).source
    good = judge_exercise(ex, src, hidden=True, seed=3, timeout=120, gpu=False)
    assert good.status == "pass", good.table()
    assert good.tiers()[COMPILE]["score"] == ex.points[COMPILE], good.table()
    m = next(m for m in ex.mutants if m.name == mutant)
    bad = judge_exercise(ex, m.apply(src), hidden=True, seed=3, timeout=120, gpu=False)
    assert bad.tiers()[COMPILE]["score"] == 0, bad.table()
    assert m.hint in " ".join(bad.failures), bad.table()
