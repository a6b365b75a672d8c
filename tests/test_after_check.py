"""The library's version of an answer waits for the learner's own (issue 50: a cold learner ran
the cell under an exercise's check before writing the exercise, and the library's answer was on
the page).

The gate: ``check`` remembers in the notebook's process the exercises whose answer passed
(``selfcheck.passed``); ``show_kernel``, ``show_excerpt`` and ``show_source`` with
``after=exercise_id``, or the calls under ``if revealed(exercise_id):``, print the library's text
only then, and one line until then; nothing while ``quack-edu grade`` runs the notebook.

The scan: below an exercise's check cell, whatever a cell prints of the library (resolved as
``test_no_answer_above`` resolves it) without waiting for that exercise shares at most a few
lines with its answer (one in five, as the page above may) and names none of the helpers it
replaces (``test_answers_hidden``'s tables). A gate names an exercise of its lesson whose check
is above it: one below, or of another lesson, would never open.
"""

from __future__ import annotations

import copy
import functools
import inspect

import nbformat
import pytest
from test_answers_hidden import reveals
from test_no_answer_above import Text, _answer_lines, _solution, few, prints, shown_lines

from quack_edu.grading import all_exercises
from quack_edu.grading.notebook import find_cell
from quack_edu.lessons import selfcheck, show
from quack_edu.lessons.show import render_text, revealed, show_excerpt, show_kernel, show_source
from quack_edu.primitives import reduce as reduce_utils

EXERCISES = all_exercises()
LESSONS = sorted({ex.lesson for ex in EXERCISES})


# ---- the gate ---------------------------------------------------------------------------------
@pytest.fixture
def session(monkeypatch):
    """A notebook session outside the grader, no check passed yet; ``judge(id, status)`` runs
    ``check`` against a grader that answers ``status``."""
    monkeypatch.delenv(selfcheck.ENV_GRADING, raising=False)
    monkeypatch.setattr(selfcheck, "_passed", set())

    def judge(exercise_id: str, status: str):
        def reply(req):
            rec = {"id": req["exercise"], "status": status, "score": 0, "max_score": 2}
            return {"ok": True, "result": rec, "table": "", "summary": ""}

        def answer():
            pass

        monkeypatch.setattr(selfcheck, "_ask", reply)
        return selfcheck.check(exercise_id, answer, quiet=True)

    return judge


def _line(*ids: str) -> str:
    checks = " and ".join(f'`check("{i}", ...)`' for i in ids)
    verb = "passes" if len(ids) == 1 else "pass"
    return f"the library's version is shown here once your {checks} {verb}\n"


def test_until_the_check_passes_one_line_and_nothing_of_the_source(session, capsys):
    source = render_text("warp", "naive")
    for status in (None, "fail", "error"):
        if status:
            assert not session("02.warp_kernel", status).passed
        show_kernel("warp", prev="naive", after="02.warp_kernel")
        out = capsys.readouterr().out
        assert out == _line("02.warp_kernel")
        assert "def kernel" not in out and "local_tile" not in out
    assert source.count("\n") > 20  # what it held back
    show_source(reduce_utils.warp_reduce, after="02.warp_reduce")
    show_excerpt("warp", "tXrX = ", "rstd = ", after="02.warp_kernel")
    out = capsys.readouterr().out
    assert out == _line("02.warp_reduce") + _line("02.warp_kernel")
    assert not revealed("02.warp_reduce")


def test_once_the_check_passed_the_source(session, capsys):
    assert session("02.warp_kernel", "pass").passed
    assert selfcheck.passed("02.warp_kernel") and not selfcheck.passed("02.warp_reduce")
    show_kernel("warp", prev="naive", after="02.warp_kernel")
    assert capsys.readouterr().out == render_text("warp", "naive")
    show_source(reduce_utils.warp_reduce, after="02.warp_reduce")  # another exercise's
    assert capsys.readouterr().out == _line("02.warp_reduce")
    session("02.warp_reduce", "pass")
    show_source(reduce_utils.warp_reduce, after="02.warp_reduce")
    assert capsys.readouterr().out == inspect.getsource(reduce_utils.warp_reduce) + "\n"


def test_a_gate_on_two_exercises_names_those_still_to_pass(session, capsys):
    both = ("06.persistent_kernel", "06.row_loop")
    assert not revealed(both)
    assert capsys.readouterr().out == _line(*both)
    session("06.row_loop", "pass")
    assert not revealed(both)
    assert capsys.readouterr().out == _line("06.persistent_kernel")
    session("06.persistent_kernel", "pass")
    assert revealed(both) and capsys.readouterr().out == ""
    assert revealed(None)  # no gate: always shown


def test_while_grading_nothing_is_shown(session, capsys, monkeypatch):
    session("02.warp_kernel", "pass")
    monkeypatch.setenv(selfcheck.ENV_GRADING, "1")
    assert selfcheck.check("02.warp_kernel", quiet=True) is None  # the grader judges the cell
    assert not selfcheck.passed("02.warp_kernel")
    show_kernel("warp", prev="naive", after="02.warp_kernel")
    show_source(reduce_utils.warp_reduce, after="02.warp_kernel")
    assert capsys.readouterr().out == ""
    assert show.gate_message("02.warp_kernel") + "\n" == _line("02.warp_kernel")


# ---- the scan of the lessons ------------------------------------------------------------------
def ungated(ex, nb=None) -> list[str]:
    """What the cells below ``ex``'s check cell print of its answer without waiting for it."""
    nb = nb if nb is not None else _solution(ex.lesson)
    check_cell = find_cell(nb, ex.test_cell_id)
    assert check_cell is not None, f"{ex.id}: no check cell"
    out, texts, below, env = [], [], False, {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        found = prints(cell.source, env)  # every cell: env gathers the imports
        if cell is check_cell:
            below = True
        elif below:
            for p in found:
                if ex.id in p.after:
                    continue
                why = reveals(ex.id, ex.answer, p.call)
                if why:
                    out.append(f"cell {i}: {why} (`{p.call}`)")
                texts.append(Text(f"cell {i} (`{p.call}`)", p.text, "code"))
    lines = _answer_lines(ex)
    shown = shown_lines(lines, texts)
    if len(shown) > few(len(lines)):
        out += [f"{w} shows `{' '.join(lines[k].text.split())}`" for k, w in shown.items()]
    return out


@pytest.mark.parametrize("ex", EXERCISES, ids=[ex.id for ex in EXERCISES])
def test_the_library_version_of_an_answer_waits_for_its_check(ex):
    found = ungated(ex)
    assert not found, (
        f"{ex.id} ({ex.lesson}): below its check, library text holding its answer is printed "
        f'without `after="{ex.id}"` (show_kernel, show_excerpt, show_source) or '
        f'`if revealed("{ex.id}"):`:\n  ' + "\n  ".join(found)
    )


@functools.cache
def _check_cells(lesson: str) -> dict[str, int]:
    """{exercise id: index of its check cell} of the lesson's solution notebook."""
    nb = _solution(lesson)
    out = {}
    for ex in EXERCISES:
        if ex.lesson == lesson:
            cell = find_cell(nb, ex.test_cell_id)
            out[ex.id] = next(i for i, c in enumerate(nb.cells) if c is cell)
    return out


def gates_of(lesson: str) -> int:
    """How many gated prints the lesson has; fails on a gate that cannot open (an exercise of
    another lesson, or one whose check is below it) or that the scan cannot read."""
    nb, checks, env, gates = _solution(lesson), _check_cells(lesson), {}, 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for p in prints(cell.source, env):
            for ex_id in p.after:
                gates += 1
                assert ex_id in checks, f"{lesson} cell {i}: `{p.call}` waits for {ex_id}, not here"
                assert checks[ex_id] < i, f"{lesson} cell {i}: {ex_id}'s check is below `{p.call}`"
            assert p.text.strip(), f"{lesson} cell {i}: `{p.call}` prints nothing"
        if "revealed(" in cell.source or "after=" in cell.source:
            assert any(p.after for p in prints(cell.source, dict(env))), (
                f"{lesson} cell {i}: a gate the scan cannot read (after= and revealed() take a "
                "literal id or tuple of ids)"
            )
    return gates


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_gate_opens_on_a_check_above_it(lesson):
    gates_of(lesson)


def test_the_lessons_gate_the_library_versions():
    assert sum(gates_of(lesson) for lesson in LESSONS) >= 15


def _with_cell(ex, source: str):
    """``ex``'s lesson with a code cell of ``source`` right below its check cell."""
    nb = copy.deepcopy(_solution(ex.lesson))
    at = _check_cells(ex.lesson)[ex.id] + 1
    nb.cells.insert(at, nbformat.v4.new_code_cell(source))
    return nb


#: (exercise, a cell below its check as issue 50 found it, the same cell gated)
WAS = [
    (
        "01.rstd",
        "print(inspect.getsource(naive.NaiveRMSNorm.rstd))",
        'show_source(naive.NaiveRMSNorm.rstd, after="01.rstd")',
    ),
    (
        "02.warp_reduce",
        "print(inspect.getsource(reduce_utils.warp_reduce))",
        'show_source(reduce_utils.warp_reduce, after="02.warp_reduce")',
    ),
    (
        "02.tv_layout",
        "print(inspect.getsource(copy_utils.row_tiled_copy))",
        'show_source(copy_utils.row_tiled_copy, after="02.tv_layout")',
    ),
    (
        "02.warp_kernel",
        'show_kernel("warp", prev="naive")',
        'show_kernel("warp", prev="naive", after="02.warp_kernel")',
    ),
    ("03.block_kernel", 'show_kernel("block")', 'show_kernel("block", after="03.block_kernel")'),
    (
        "05.pipeline",
        'show_kernel("cpasync", fn="load_and_sum_sq")',
        'show_kernel("cpasync", fn="load_and_sum_sq", after="05.pipeline")',
    ),
    (  # found by its lines alone: no helper of 06.row_loop is named
        "06.row_loop",
        'show_kernel("final", prev="cpasync")',
        'show_kernel("final", prev="cpasync", after=("06.persistent_kernel", "06.row_loop"))',
    ),
    (
        "07.dw_partial",
        'show_kernel("final_bwd", fn="combine_partial")',
        'show_kernel("final_bwd", fn="combine_partial", after="07.dw_partial")',
    ),
]


@pytest.mark.parametrize("ex_id, was, gated", WAS, ids=[w[0] for w in WAS])
def test_the_scan_sees_what_the_lessons_printed(ex_id, was, gated):
    ex = next(e for e in EXERCISES if e.id == ex_id)
    assert ungated(ex, _with_cell(ex, "import inspect\n" + was))
    assert not ungated(ex, _with_cell(ex, gated))
    assert not ungated(ex, _with_cell(ex, f'if revealed("{ex_id}"):\n    {was}'))
    other = next(e.id for e in EXERCISES if e.lesson == ex.lesson and e.id != ex_id)
    assert ungated(ex, _with_cell(ex, gated.replace(f'"{ex_id}"', f'"{other}"')))
