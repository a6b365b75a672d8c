"""scripts/lesson_words.py: every lesson within the markdown limits (2,500 words a lesson, 300 a
cell), and the counter itself on small notebooks."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("lesson_words", ROOT / "scripts" / "lesson_words.py")
LW = importlib.util.module_from_spec(_spec)
sys.modules["lesson_words"] = LW  # dataclasses look their module up by name
_spec.loader.exec_module(LW)

#: Lessons still over a limit (run the script for which). strict xfail: a lesson brought within
#: the limits fails here until its name is removed from this set.
NOT_YET: set = set()

LESSONS = LW.lessons(ROOT)


def test_every_lesson_is_counted_and_the_set_names_real_lessons():
    names = {p.stem for p in LESSONS}
    assert len(LESSONS) >= 9
    assert NOT_YET <= names, NOT_YET - names


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(
            p,
            id=p.stem,
            marks=[pytest.mark.xfail(strict=True, reason="over the limits")]
            if p.stem in NOT_YET
            else [],
        )
        for p in LESSONS
    ],
)
def test_lesson_within_word_limits(path):
    assert LW.count(path).violations() == []


def _notebook(tmp_path, *markdown):
    cells = [{"cell_type": "markdown", "metadata": {}, "source": m} for m in markdown]
    cells.append({"cell_type": "code", "metadata": {}, "source": "x = 1 " * 500, "outputs": []})
    p = tmp_path / "99_demo.ipynb"
    p.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return p


def test_words_leave_out_fenced_code_and_code_cells(tmp_path):
    assert LW.words("one two\n```python\na b c d\n```\nthree") == 3
    lw = LW.count(_notebook(tmp_path, "a b c", ["d e\n", "f"]))
    assert lw.cells == ((0, 3), (1, 3)) and lw.total == 6


def test_limits_are_enforced(tmp_path, capsys):
    ok = _notebook(tmp_path, "word " * 300, "word " * 10)
    assert LW.main([str(ok)]) == 0
    long_cell = _notebook(tmp_path, "word " * 301)
    assert LW.main([str(long_cell)]) == 1
    assert "cell 0: 301 words" in capsys.readouterr().out
    long_lesson = _notebook(tmp_path, *["word " * 250] * 11)  # 2,750 words, no cell over
    assert LW.count(long_lesson).violations() == ["99_demo: 2750 words of markdown (limit 2500)"]
    assert LW.main([str(long_lesson), "--lesson-max", "3000"]) == 0
