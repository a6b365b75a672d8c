"""Red team 9 (2026-12-08, had read the grader): what a learner's text could do to the grader's
own process, and the routes past the sandbox's record and tripwires, each now scoring 0 or
flagged (issue 49). Their notebooks: /work/rt9/attacks (README.md there).

A. an answer cell ``_x = 1+1+...+1`` (20000 terms): a RecursionError in the screen's and the
   similarity's ``ast.parse`` ended the grader, and a class's run before its gradebook (a6); a
   forged PTX of ``'\\n/*x' * 100000`` kept the grader in ptxsim's comment regex > 300 s (a5);
B. the record of what was compiled at run time, switched off from learner code (a string
   evaluated by ``typing.ForwardRef._evaluate``, which the screen never sees): the finished
   kernel exec'd from text scored full unflagged (a1, a2, a4);
C. library functions that hand learner code a frame or a frame's locals (numpy's
   ``get_frame``, IPython's ``get_local_scope``, torch's ``set_eval_frame``), and text compiled
   under an installed file's name that was one line of it;
D. the worker's ``keep`` (its torch tripwire's holder) reached through those locals, the
   tripwire destroyed and torch's RMSNorm called (a7).

Each test failed before its fix.
"""

from __future__ import annotations

import re
import time

import pytest

from quack_edu.grading import get
from quack_edu.grading.answer_screen import screen
from quack_edu.grading.judge import judge_exercise

DEEP = "_x = " + "1+" * 20000 + "1\n"


# ---- A: the grader's own process ----------------------------------------------------------------
def test_a_deeply_nested_answer_is_flagged_not_a_crash():
    ex = get("00.bytes_moved")
    assert screen(DEEP, ex) == ["could not be read (too deeply nested)"]
    res = judge_exercise(ex, DEEP + "def bytes_moved(M, N, dtype):\n    return 0\n", seed=1)
    assert res.score == 0 and res.flagged, res.table()
    assert "could not be read" in res.forced_message


def test_the_similarity_reads_a_deeply_nested_answer():
    from quack_edu.grading.similarity import compiler_view, same_answers, tokens

    assert compiler_view(DEEP) == DEEP  # as it is, unparsed
    assert len(tokens(DEEP)) > 40000
    assert same_answers({"a": DEEP, "b": DEEP}, None) == {"a": ["b"], "b": ["a"]}


@pytest.mark.slow
def test_a_class_with_a_deeply_nested_answer_writes_its_gradebook(tmp_path):
    import csv

    from quack_edu.grading.cli import grade_main
    from quack_edu.grading.notebook import find_cell, notebooks_dir, read, write

    ex = get("00.bytes_moved")
    for student in ("ana", "ben"):
        nb = read(notebooks_dir() / f"{ex.lesson}.ipynb")
        find_cell(nb, ex.cell_id).source = DEEP
        write(nb, tmp_path / "subs" / f"{student}.ipynb")
    out = tmp_path / "grades"
    args = [str(tmp_path / "subs"), "--lesson", ex.lesson, "--out", str(out), "--timeout", "60"]
    assert grade_main([*args, "--only", ex.id]) == 0
    rows = {r["student"]: r for r in csv.DictReader(open(out / "gradebook.csv"))}
    assert set(rows) == {"ana", "ben"}
    assert rows["ana"]["flagged"] == "yes"


PTX = """.version 8.0
.target sm_90a
.address_size 64
// a comment /* not a block */
.visible .entry k(.param .u64 p) /* block
over two lines */ {
    .reg .b32 %r<2>;
    mov.u32 %r1, 1; // a line comment
    ret;
}
"""


def test_ptx_comments_are_blanked_in_linear_time():
    from quack_edu.ptxsim.parser import blank_comments, parse

    old = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)  # (the regex it replaces: its results kept)
    for text in (PTX, "a/*b", "a/*b*/c//d\ne/*", "//x/*y\n*/z", "/*/ */", "/**/x//\n"):
        assert blank_comments(text) == old.sub(lambda m: re.sub(r"[^\n]", " ", m[0]), text)
    kernel = parse(PTX)
    assert kernel.name == "k" and [p.name for p in kernel.params] == ["p"]
    t0 = time.perf_counter()
    attack = PTX + "\n/*x" * 100_000  # (a5: > 300 s in the regex)
    assert parse(attack).name == "k"
    assert parse(PTX.replace("{", "") + ".entry k(" * 100_000 + "\n.entry j()\n{\n}\n").name == "k"
    assert time.perf_counter() - t0 < 5


def test_a_probe_reply_with_text_past_the_cap_is_garbled():
    from quack_edu.grading.judge import TEXT_MAX, JudgeAbort, within_text_cap

    ok = {"ptx": "x" * 1000, "registers": 3}
    assert within_text_cap(ok) is ok
    with pytest.raises(JudgeAbort) as e:
        within_text_cap({"v": [{"ptx": "x" * (TEXT_MAX + 1)}]})
    assert e.value.kind == "garbled" and e.value.message.startswith("flagged")


def test_the_graders_own_work_is_bounded_in_cpu_time():
    from quack_edu.grading.deadline import TooSlow, cpu_bound

    t0 = time.perf_counter()
    with pytest.raises(TooSlow, match="spinning"):
        with cpu_bound(0.3, "spinning"):
            while True:
                pass
    assert time.perf_counter() - t0 < 5
    with cpu_bound(5, "sleeping"):  # waiting (for a worker) costs no CPU time
        time.sleep(0.5)
