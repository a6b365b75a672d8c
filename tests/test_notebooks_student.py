"""The single source: notebooks/ is generated from solutions/ and must be up to date; solution
notebooks are well-formed (nbgrader metadata, one answer and one check cell per exercise, no
outputs)."""

from __future__ import annotations

import pytest

from quack_edu.grading import all_exercises, lessons
from quack_edu.grading.cli import student_main
from quack_edu.grading.notebook import (
    BEGIN_HIDDEN,
    BEGIN_SOLUTION,
    comparable,
    generate_students,
    notebooks_dir,
    out_of_date,
    read,
    solutions_dir,
    validate_solution,
)

SOLUTIONS = sorted(solutions_dir().glob("*.ipynb"))


def test_every_lesson_with_exercises_has_a_solution_notebook():
    assert {p.stem for p in SOLUTIONS} >= set(lessons())


def test_student_notebooks_are_up_to_date():
    stale = out_of_date()
    assert not stale, "\n".join(stale) + "\nrun `quack-edu student` and commit notebooks/"


def test_regenerating_gives_the_committed_notebooks(tmp_path):
    written = generate_students(out_dir=tmp_path)
    assert {p.name for p in written} == {p.name for p in SOLUTIONS}
    for p in written:
        assert comparable(read(p)) == comparable(read(notebooks_dir() / p.name))


def test_student_check_command(tmp_path, capsys):
    assert student_main(["--check"]) == 0
    assert student_main(["--out", str(tmp_path), "--check"]) == 1  # nothing generated there
    assert "missing" in capsys.readouterr().out
    assert student_main(["--out", str(tmp_path)]) == 0
    assert student_main(["--out", str(tmp_path), "--check"]) == 0


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_solution_notebook_is_well_formed(path):
    nb = read(path)
    assert nb.metadata["quack_edu"]["lesson"] == path.stem
    assert validate_solution(nb, path.stem) == []
    first = next(c for c in nb.cells if c.cell_type == "code").source
    assert first.lstrip().startswith("import quack_edu"), "quack_edu must be imported first"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_student_notebook_hides_solutions(path):
    nb = read(notebooks_dir() / path.name)
    text = "\n".join(c.source for c in nb.cells)
    assert BEGIN_SOLUTION not in text and BEGIN_HIDDEN not in text
    assert "hidden=True" not in text
    for ex in all_exercises(path.stem):
        cell = next(
            c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == ex.cell_id
        )
        assert "raise NotImplementedError()" in cell.source
    assert all(not c.get("outputs") for c in nb.cells)
