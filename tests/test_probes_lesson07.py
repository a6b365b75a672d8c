"""``quack_edu.grading.probes.lesson07`` is what the judge's worker runs for 07.red_add and
07.dw_partial: importing it imports no exercise module, no line of a solution is written in it,
and judged, neither exercise runs a check in the learner's process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from quack_edu.grading import get
from quack_edu.grading.judge import judge_exercise
from quack_edu.grading.notebook import find_cell, notebooks_dir, read, solutions_dir
from quack_edu.grading.probes import lesson07 as probes

EXERCISES = "quack_edu.grading.exercises"
IDS = ("07.red_add", "07.dw_partial")
#: solution lines and mutant edits shorter than this are the DSL's own words (``@cute.jit``)
MIN_TEXT = 16


def _source(ex, folder) -> str:
    return find_cell(read(folder() / f"{ex.lesson}.ipynb"), ex.cell_id).source


def test_importing_the_probes_imports_no_exercise(subprocess_env):
    code = (
        "import json, sys\n"
        "import quack_edu.grading.probes.lesson07\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith("
        f"{EXERCISES!r}))))\n"
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
    src = Path(probes.__file__).read_text()
    for ex in map(get, IDS):
        for line in _source(ex, solutions_dir).splitlines():
            line = line.strip()
            if len(line) >= MIN_TEXT and not line.startswith("#"):
                assert line not in src, (ex.id, line)
        for m in ex.mutants:
            for old, new in m.replace:
                for text in (old, new):
                    if len(text.strip()) >= MIN_TEXT:
                        assert text.strip() not in src, (ex.id, m.name, text)


@pytest.mark.slow
@pytest.mark.parametrize("ex_id", IDS)
def test_judged_without_a_check_in_the_learners_process(ex_id):
    ex = get(ex_id)
    good = judge_exercise(ex, _source(ex, solutions_dir), hidden=True, seed=3)
    assert good.status == "pass", good.table()
    blank = judge_exercise(ex, _source(ex, notebooks_dir), hidden=True, seed=3)
    assert blank.status == "not attempted", blank.table()
    m = ex.mutants[0]
    bad = judge_exercise(ex, m.apply(_source(ex, solutions_dir)), hidden=True, seed=3)
    assert bad.status == "fail", bad.table()
    assert m.hint in " ".join(f"{c.hint} {c.message}" for c in bad.checks), bad.table()
