"""06.fake_impl is judged in the grader from their probes' data
(``grading.probes.lesson06``): no check of theirs runs in the learner's process, the probes
module imports no exercise and holds no solution text, and a wrong answer's verdict and hint
are the grader's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from quack_edu.grading import COMPILE, get
from quack_edu.grading.judge import judge_exercise
from quack_edu.grading.notebook import find_cell, read, solutions_dir

PROBES = "quack_edu.grading.probes.lesson06"
EXERCISES = ("06.fake_impl",)
#: (exercise, a compile-tier mutant)
CASES = [("06.fake_impl", "residual_out is x itself")]
#: the solution's first line, which wrong fakes below replace
FIRST = "outs = [x.new_empty(x.shape, dtype=out_dtype)]"
#: fakes whose outputs' data the grader reads: (what replaces FIRST, a word of the failure, a
#: word of its hint)
FAKES = [
    ("return x", "returned a FakeTensor, not a list of tensors", "returns a list"),
    ("return [x.new_empty(x.shape, dtype=out_dtype), 1.0]", "output 1 is a float",
     "returns a list"),
    ("outs = [torch.empty(x.shape, dtype=out_dtype)]", "out is on cpu", "x.new_empty keeps it"),
    ("outs = [torch.empty_like(x, dtype=out_dtype)]", "out has strides", "dense (contiguous)"),
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


@pytest.mark.parametrize("ex_id,mutant", CASES)
def test_judged_in_the_grader(ex_id, mutant):
    ex = get(ex_id)
    src = _source(ex)
    good = judge_exercise(ex, src, hidden=True, seed=3, timeout=120, gpu=False)
    assert good.status == "pass", good.table()
    assert good.tiers()[COMPILE]["score"] == ex.points[COMPILE], good.table()
    m = next(m for m in ex.mutants if m.name == mutant)
    bad = judge_exercise(ex, m.apply(src), hidden=True, seed=3, timeout=120, gpu=False)
    assert bad.tiers()[COMPILE]["score"] == 0, bad.table()
    assert m.hint in " ".join(bad.failures), bad.table()


@pytest.mark.parametrize("body,failure,hint", FAKES, ids=[f[1] for f in FAKES])
def test_a_wrong_fake_is_judged_from_its_outputs_data(body, failure, hint):
    ex = get("06.fake_impl")
    src = _source(ex)
    assert src.count(FIRST) == 1
    wrong = src.replace(FIRST, body)
    res = judge_exercise(ex, wrong, hidden=False, seed=3, timeout=120, gpu=False)
    assert res.tiers()[COMPILE]["score"] == 0, res.table()
    text = " ".join(f"{c.message} {c.hint}" for c in res.checks if c.status == "fail")
    assert failure in text and hint in text, res.table()
