"""``quack_edu.grading.holes`` is all the judge's worker needs to build a learner's kernel, and
holds nothing secret: importing it imports no exercise module (reference answers, hidden
checks, mutants), every hole an exercise grades with is one of its objects, and no line of a
solution is written in it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from quack_edu.grading import all_exercises, holes
from quack_edu.grading.checks import KernelHole
from quack_edu.grading.notebook import find_cell, read, solutions_dir

EXERCISES = "quack_edu.grading.exercises"
#: solution lines and mutant edits shorter than this are the DSL's own words (``@cute.kernel``)
MIN_TEXT = 16


def _holes() -> dict[str, KernelHole]:
    return {k: v for k, v in vars(holes).items() if isinstance(v, KernelHole)}


def test_importing_holes_imports_no_exercise(subprocess_env):
    code = (
        "import json, sys\n"
        "import quack_edu.grading.holes\n"
        "from quack_edu.grading import registry\n"
        "print(json.dumps({'modules': sorted(m for m in sys.modules if m.startswith("
        f"{EXERCISES!r})), 'registered': sorted(registry._REGISTRY)}}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"modules": [], "registered": []}, got


def test_every_hole_of_an_exercise_is_one_of_holes():
    assert all_exercises()  # every lesson module imported
    mine = {id(v): k for k, v in _holes().items()}
    used = set()
    for name in sorted(m for m in sys.modules if m.startswith(EXERCISES + ".")):
        for k, v in vars(sys.modules[name]).items():
            if isinstance(v, KernelHole):
                assert id(v) in mine, f"{name}.{k} is a hole of its own, not one of holes'"
                used.add(id(v))
    assert set(mine) == used, [mine[i] for i in set(mine) - used]
    # a search of sys.modules in import order (the judge's hole_ref) finds each in holes first
    for hole in _holes().values():
        first = next(
            n
            for n, m in list(sys.modules.items())
            if n.startswith("quack_edu.grading")
            and m is not None
            and any(v is hole for v in vars(m).values())
        )
        assert first == holes.__name__, (hole, first)


def test_no_solution_text_in_holes():
    src = Path(holes.__file__).read_text()
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
