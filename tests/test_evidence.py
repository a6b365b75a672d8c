"""``quack_edu.lessons.evidence`` is what a lesson's cell after a check needs to show the
learner's own kernel: importing it imports no exercise module (a graded notebook may not), the
exercises grade with the same helpers, no notebook imports the exercises, and no line of a
solution is written in it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from quack_edu.grading import all_exercises
from quack_edu.grading.notebook import find_cell, notebooks_dir, read, solutions_dir
from quack_edu.lessons import evidence

EXERCISES = "quack_edu.grading.exercises"
#: solution lines and mutant edits shorter than this are the DSL's own words (``@cute.kernel``)
MIN_TEXT = 16
#: (exercise module, or the probes module that compiles for it, its names that are evidence's
#: objects)
SHARED = {
    "quack_edu.grading.probes.lesson01b_02": ("scale_ptx",),  # 01.scale_kernel's probe
    "lesson06": ("scratch_op",),
}


def test_importing_evidence_imports_no_exercise(subprocess_env):
    code = (
        "import json, sys\n"
        "import quack_edu.lessons.evidence\n"
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


@pytest.mark.parametrize("module", sorted(SHARED))
def test_the_exercises_grade_with_evidence_helpers(module):
    mod = __import__(module if "." in module else f"{EXERCISES}.{module}", fromlist=["_"])
    for name in SHARED[module]:
        assert getattr(mod, name) is getattr(evidence, name), f"{module}.{name}"


@pytest.mark.parametrize("folder", [solutions_dir, notebooks_dir], ids=["solutions", "notebooks"])
def test_no_notebook_imports_the_exercises(folder):
    for path in sorted(folder().glob("*.ipynb")):
        for i, cell in enumerate(read(path).cells):
            assert EXERCISES not in cell.source, f"{path.name} cell {i}"


def test_no_solution_text_in_evidence():
    src = Path(evidence.__file__).read_text()
    for ex in all_exercises():
        cell = find_cell(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex.cell_id).source
        for line in cell.splitlines():
            line = line.strip()
            if len(line) >= MIN_TEXT and not line.startswith("#"):
                assert line not in src, (ex.id, line)
        for m in ex.mutants:
            for old, _ in m.replace:
                if len(old.strip()) >= MIN_TEXT:
                    assert old.strip() not in src, (ex.id, m.name, old)
