"""The grader's own files (``integrity``): hashed when ``quack-edu grade`` starts and checked
before it writes a result and, for a class, before each next submission. A file changed, added
or removed in between makes the grade refuse: exit 2, the file named, nothing further written.

CPU only and fast: nothing is executed or compiled. A small tree stands in for the package and
the solutions, and the grading function is replaced by one that edits that tree, as a learner's
cell might, and returns an empty result."""

from __future__ import annotations

import csv
import json
import pickle
from pathlib import Path

import pytest

from quack_edu.grading import class_grade, integrity, judge, notebook
from quack_edu.grading.cli import grade_main
from quack_edu.grading.integrity import GraderTampered, check, snapshot, verify
from quack_edu.grading.report import NotebookResult, RunResult

LESSON = "00_setup_and_roofline"
EMPTY_NOTEBOOK = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def tree(tmp_path):
    """A grader in small: a package with an exercise, a solution notebook, and what is not
    hashed (bytecode, a checkpoint, a data file)."""
    root = tmp_path / "grader"
    for rel, text in {
        "pkg/checks.py": "def check(x):\n    return x == 1\n",
        "pkg/exercises/lesson01.py": "POINTS = 1\n",
        "solutions/01_naive.ipynb": json.dumps(EMPTY_NOTEBOOK),
        "pkg/__pycache__/checks.cpython-311.pyc": "bytecode",
        "solutions/.ipynb_checkpoints/01_naive-checkpoint.ipynb": "{}",
        "pkg/notes.txt": "not code",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _roots(tree):
    return tree / "pkg", tree / "solutions"


# ---- snapshot / verify -------------------------------------------------------------------------
def test_snapshot_hashes_the_code_and_the_solution_notebooks(tree):
    grader = snapshot(*_roots(tree))
    assert sorted(grader.hashes) == [
        str(tree / "pkg/checks.py"),
        str(tree / "pkg/exercises/lesson01.py"),
        str(tree / "solutions/01_naive.ipynb"),
    ]
    assert grader.summary() == "verified (3 files, sha256)"
    # the bytes decide, not the time stamps; and what is not hashed may change
    (tree / "pkg/checks.py").write_text((tree / "pkg/checks.py").read_text())
    (tree / "pkg/__pycache__/checks.cpython-311.pyc").write_text("recompiled")
    assert verify(grader) == []
    check(grader)


def test_verify_names_a_changed_an_added_and_a_removed_file(tree):
    grader = snapshot(*_roots(tree))
    (tree / "pkg/checks.py").write_text("def check(x):\n    return True\n")
    (tree / "pkg/exercises/lesson01.py").unlink()
    (tree / "pkg/exercises/lesson02.py").write_text("POINTS = 100\n")
    assert verify(grader) == [
        f"changed {tree / 'pkg/checks.py'}",
        f"removed {tree / 'pkg/exercises/lesson01.py'}",
        f"added {tree / 'pkg/exercises/lesson02.py'}",
    ]
    with pytest.raises(GraderTampered) as e:
        check(grader)
    assert f"changed {tree / 'pkg/checks.py'}" in str(e.value)
    assert "refusing to grade" in str(e.value)


def test_a_solution_notebook_is_a_grader_file(tree):
    grader = snapshot(*_roots(tree))
    (tree / "solutions/01_naive.ipynb").write_text(json.dumps({**EMPTY_NOTEBOOK, "cells": [1]}))
    (tree / "solutions/02_warp_reduction.ipynb").write_text("{}")
    assert verify(grader) == [
        f"changed {tree / 'solutions/01_naive.ipynb'}",
        f"added {tree / 'solutions/02_warp_reduction.ipynb'}",
    ]


def test_the_refusal_crosses_a_process_pool():
    # ``-j N`` grades in pool processes: the exception comes back pickled, files and all
    back = pickle.loads(pickle.dumps(GraderTampered(["changed /a.py"])))
    assert isinstance(back, GraderTampered) and back.changes == ["changed /a.py"]
    assert "changed /a.py" in str(back)


def test_the_real_manifest_covers_grading_exercises_library_and_solutions():
    from quack_edu.grading.nbfiles import repo_root

    root = repo_root()
    files = {
        Path(f).relative_to(root).as_posix() for f in snapshot(*integrity.grader_roots()).hashes
    }
    for f in [
        "quack_edu/grading/checks.py",
        "quack_edu/grading/integrity.py",
        "quack_edu/grading/exercises/lesson01.py",
        "quack_edu/reference.py",
        "quack_edu/stages/naive.py",
        "solutions/01_naive.ipynb",
    ]:
        assert f in files, f
    assert all(f.endswith((".py", ".ipynb")) and "__pycache__" not in f for f in files)


# ---- the grade refuses -------------------------------------------------------------------------
@pytest.fixture
def grader_tree(tree, monkeypatch):
    """``quack-edu grade`` with the tree as its files, and no judge server (nothing judges)."""
    monkeypatch.setattr(integrity, "grader_roots", lambda solutions=None: list(_roots(tree)))
    monkeypatch.setattr(judge.Server, "start", lambda: None)
    return tree


def _tamper(tree):
    (tree / "pkg/checks.py").write_text("def check(x):\n    return True  # a learner's cell\n")
    return f"changed {tree / 'pkg/checks.py'}"


def _notebook(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(EMPTY_NOTEBOOK))
    return path


def _fake_run(tamper_with=None):
    def grade_paths(paths, **kwargs):
        if tamper_with is not None:
            _tamper(tamper_with)
        return RunResult([NotebookResult(str(paths[0]), LESSON)], "compile-only", "test", True, 1)

    return grade_paths


def test_grade_records_the_check_in_its_json(grader_tree, tmp_path, monkeypatch):
    monkeypatch.setattr(notebook, "grade_paths", _fake_run())
    out = tmp_path / "grade.json"
    assert grade_main([str(_notebook(tmp_path / "ana.ipynb")), "--json", str(out)]) == 1
    assert json.loads(out.read_text())["grader_files"] == "verified (3 files, sha256)"


def test_grade_refuses_when_a_grader_file_changed_while_grading(
    grader_tree, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(notebook, "grade_paths", _fake_run(tamper_with=grader_tree))
    out = tmp_path / "grade.json"
    assert grade_main([str(_notebook(tmp_path / "ana.ipynb")), "--json", str(out)]) == 2
    printed = capsys.readouterr()
    assert f"changed {grader_tree / 'pkg/checks.py'}" in printed.err
    assert "refusing to grade" in printed.err
    assert "score" not in printed.out  # no grade printed either
    assert not out.exists()


def _class(tmp_path, *students):
    subs = tmp_path / "submissions"
    for s in students:
        _notebook(subs / f"{s}.ipynb")
    out = tmp_path / "grades"
    return [str(subs), "--lesson", LESSON, "--out", str(out)], out


def _fake_notebook(calls, tamper_with=None):
    def grade_notebook(path, **kwargs):
        calls.append(path.stem)
        if tamper_with is not None:
            _tamper(tamper_with)
        return NotebookResult(str(path), kwargs["lesson"])

    return grade_notebook


def test_class_records_the_check_in_each_result(grader_tree, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(notebook, "grade_notebook", _fake_notebook(calls))
    args, out = _class(tmp_path, "ana", "ben")
    assert grade_main(args) == 0
    assert calls == ["ana", "ben"]
    for s in ("ana", "ben"):
        rec = json.loads((out / "results" / s / f"{LESSON}.json").read_text())
        assert rec["grader_files"] == "verified (3 files, sha256)"
    assert [r["student"] for r in csv.DictReader(open(out / "gradebook.csv"))] == ["ana", "ben"]


def test_class_refuses_to_write_a_result_after_a_grader_file_changed(
    grader_tree, tmp_path, monkeypatch, capsys
):
    calls = []
    monkeypatch.setattr(notebook, "grade_notebook", _fake_notebook(calls, grader_tree))
    args, out = _class(tmp_path, "ana", "ben")
    assert grade_main(args) == 2
    assert calls == ["ana"]
    assert f"changed {grader_tree / 'pkg/checks.py'}" in capsys.readouterr().err
    for written in ("results", "feedback", "gradebook.csv"):
        assert not (out / written).exists(), written


def test_class_grades_no_next_submission_after_a_grader_file_changed(
    grader_tree, tmp_path, monkeypatch, capsys
):
    # the change lands after ana's result was checked (as her feedback is written): ana's
    # files are written, ben is never graded, and there is no gradebook
    calls = []
    monkeypatch.setattr(notebook, "grade_notebook", _fake_notebook(calls))
    feedback_text = class_grade.feedback_text

    def tampering_feedback(*a):
        _tamper(grader_tree)
        return feedback_text(*a)

    monkeypatch.setattr(class_grade, "feedback_text", tampering_feedback)
    args, out = _class(tmp_path, "ana", "ben")
    assert grade_main(args) == 2
    assert calls == ["ana"]
    assert f"changed {grader_tree / 'pkg/checks.py'}" in capsys.readouterr().err
    assert (out / "feedback" / "ana" / f"{LESSON}.txt").exists()
    assert not (out / "results" / "ben").exists() and not (out / "feedback" / "ben").exists()
    assert not (out / "gradebook.csv").exists()
