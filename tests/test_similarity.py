"""Answers that are somebody else's text (``grading.similarity``): the library's finished
version pasted into an answer cell scores 0 and is flagged, renamed or not; honest solutions
are far from it; identical answers in a class are flagged in the gradebook."""

from __future__ import annotations

import inspect
import re
import textwrap

import pytest

from quack_edu.grading import all_exercises, get
from quack_edu.grading.nbfiles import find_cell, notebooks_dir, read, solutions_dir
from quack_edu.grading.similarity import (
    COPIED,
    HONEST_MAX,
    copied_from_library,
    cover,
    same_answers,
    telling,
)

FINISHED = [e for e in all_exercises() if e.finished]


def _cell(folder, ex) -> str:
    return find_cell(read(folder / f"{ex.lesson}.ipynb"), ex.cell_id).source


def _library_text(dotted: str, answer: str) -> str:
    """The finished function's text as a learner would paste it: dedented, named as the
    exercise's answer."""
    from quack_edu.grading.worker import resolve

    src = textwrap.dedent(inspect.getsource(inspect.unwrap(resolve(dotted))))
    return re.sub(r"def \w+\(", f"def {answer}(", src, count=1)


def _renamed(source: str) -> str:
    """Every local-looking name renamed (a learner hiding a paste)."""
    names = set(re.findall(r"\b([a-z_][a-z0-9_]{2,})\s*=", source))
    for n in sorted(names):
        source = re.sub(rf"\b{n}\b", n + "_mine", source)
    return source


def _dotted(source: str) -> str:
    """Every local-looking name given a middle dot (U+00B7), still valid Python (red team 5:
    ``tokenize`` split such names, and a paste so renamed covered 0.10 of the library)."""
    names = set(re.findall(r"\b([a-z_][a-z0-9_]{2,})\s*=", source))
    for n in sorted(names):
        source = re.sub(rf"\b{n}\b", n + "\u00b7", source)
    compile(source, "<dotted>", "exec")
    return source


@pytest.mark.parametrize("ex", FINISHED, ids=lambda e: e.id)
def test_honest_solutions_and_blanks_are_not_copies(ex):
    # the margin the threshold stands on: where a solution differs from the library at all, it
    # covers at most about half of it (below HONEST_MAX < COPIED)
    for folder in (solutions_dir(), notebooks_dir()):
        source = _cell(folder, ex)
        assert copied_from_library(ex, source) is None, (ex.id, folder)
        for dotted in telling(ex.id):
            assert cover(source, dotted, ex.lesson) < HONEST_MAX < COPIED, (ex.id, dotted)


def test_most_finished_functions_tell_a_copy():
    # the exercises whose finished functions tell nothing (the solution is written as the
    # library writes it, or the function is too short: no copy is looked for there) stay few,
    # and are named here
    alike = sorted(e.id for e in FINISHED if not telling(e.id))
    assert alike == ["05.pipeline", "05.wait_groups", "06.fake_impl", "07.dw_partial"], alike


@pytest.mark.parametrize("ex", [e for e in FINISHED if telling(e.id)], ids=lambda e: e.id)
def test_the_library_pasted_is_a_copy_renamed_or_not(ex):
    for dotted in telling(ex.id):
        pasted = _library_text(dotted, ex.answer)
        for text in (pasted, _renamed(pasted), _dotted(pasted)):
            why = copied_from_library(ex, text)  # (names the first finished function it copies)
            assert why is not None and "copies the library's finished" in why, (ex.id, dotted)


def test_a_pasted_answer_is_judged_flagged_with_no_points():
    from quack_edu.grading.judge import judge_exercise

    ex = get("02.warp_reduce")
    pasted = _library_text("quack_edu.primitives.reduce.warp_reduce", ex.answer)
    res = judge_exercise(ex, "import cutlass\nimport cutlass.cute as cute\n" + pasted, seed=1)
    assert res.score == 0 and res.flagged, res.table()
    assert "copies the library's finished" in res.forced_message


def test_identical_long_answers_in_a_class_are_named():
    kernel = _cell(solutions_dir(), get("02.warp_kernel"))
    blank = _cell(notebooks_dir(), get("02.warp_kernel"))
    short = "def f(M, N):\n    return 2 * M * N\n"
    answers = {"ana": kernel, "ben": kernel + "\n# mine\n", "cy": _renamed(kernel),
               "dee": blank, "eve": blank, "fay": short, "gus": short}  # fmt: skip
    same = same_answers(answers, blank)
    # comments and layout do not make an answer one's own; renaming does; the page's own cell
    # and a short answer never count
    assert same == {"ana": ["ben"], "ben": ["ana"]}, same
