"""`quack-edu grade FOLDER`: a small class of lesson-00 submissions (a solution, a blank, a
mutant handed in late, a notebook of cheats, a student who handed nothing in) graded with
``-j 2`` to a CSV gradebook and one feedback file each; a re-run grades nothing new. The one
class run is checked in several ways by one test, and its cheat notebook is the cheat
suite's notebook-level half (tests/test_cheats.py): the kernel cheats in cells of their own,
and the seven-line patch in an answer cell (flagged)."""

from __future__ import annotations

import csv
import json
import os
import time
from datetime import datetime, timedelta

import pytest
from test_cheats import LESSON, SANDBOX_EVIDENCE, SANDBOX_FLAGS, cheat_notebook, solution

from quack_edu.grading import get
from quack_edu.grading.cli import grade_main
from quack_edu.grading.notebook import find_cell, notebooks_dir, read, solutions_dir, write

pytestmark = pytest.mark.slow


def test_a_class_graded_to_a_gradebook(tmp_path, capsys):
    # one test, not several sharing a module fixture: pytest-xdist would grade the class once
    # in every worker that took one of them
    graded = _grade_class(tmp_path)
    _gradebook_rows(graded)
    _kernel_cheats_ran_and_scored_nothing(graded)
    _one_feedback_file_per_student_with_hints_and_no_hidden_source(graded)
    _a_rerun_grades_nothing_new_unless_forced(graded, capsys)


def _grade_class(root):
    subs = root / "submissions"
    write(read(solutions_dir() / f"{LESSON}.ipynb"), subs / "ana" / f"{LESSON}.ipynb")
    write(read(notebooks_dir() / f"{LESSON}.ipynb"), subs / "ben.ipynb")
    mutant = read(solutions_dir() / f"{LESSON}.ipynb")
    ex = get("00.bytes_moved")
    cell = find_cell(mutant, ex.cell_id)
    cell.source = ex.mutants[0].apply(solution(ex.id))
    late = subs / f"cat_{LESSON}.ipynb"
    write(mutant, late)
    write(cheat_notebook(), subs / "dan" / "my_work.ipynb")
    deadline = datetime.now() - timedelta(hours=1)
    stamp = time.time() - 3 * 3600
    for p in subs.rglob("*.ipynb"):
        os.utime(p, (stamp, stamp))  # on time, but cat's, written after the deadline
    roster = root / "roster.txt"
    roster.write_text("ana\nben\ncat\ndan\nfay\n")
    out = root / "grades"
    args = [str(subs), "--lesson", LESSON, "--out", str(out), "-j", "2", "--timeout", "60"]
    args += ["--roster", str(roster), "--deadline", deadline.isoformat(timespec="minutes")]
    os.utime(late, None)
    assert grade_main(args) == 0
    rows = {r["student"]: r for r in csv.DictReader(open(out / "gradebook.csv"))}
    return dict(out=out, subs=subs, rows=rows, args=args)


def _gradebook_rows(graded):
    rows = graded["rows"]
    assert sorted(rows) == ["ana", "ben", "cat", "dan", "fay"]
    ids = ["00.bytes_moved", "00.roofline_time_us", "00.eager_rmsnorm", "00.eager_bytes"]
    got = {s: [r[f"{i} compile"] for i in ids] for s, r in rows.items()}
    assert got["ana"] == ["1", "1", "1", "1"]
    assert got["ben"] == ["0", "0", "0", "0"]
    assert got["cat"] == ["0", "1", "1", "1"]  # the mutant: bytes_moved only
    assert got["dan"] == ["0", "0", "0", "0"]  # every cheat
    scores = [rows[s]["score"] for s in ("ana", "ben", "cat", "dan", "fay")]
    assert scores == ["4", "0", "3", "0", "0"]
    assert rows["ana"]["max_score"] == "4" and rows["ana"]["status"] == "graded"
    assert rows["fay"]["status"] == "missing"
    assert rows["cat"]["late"] == "yes" and rows["ana"]["late"] == "no"
    assert rows["dan"]["flagged"] == "yes" and "00.bytes_moved: flagged" in rows["dan"]["flags"]
    for what in SANDBOX_FLAGS:  # each cell that reached past its process, refused and named
        assert what in rows["dan"]["flags"], (what, rows["dan"]["flags"])
    record = (graded["out"] / "results" / "dan" / f"{LESSON}.json").read_text()
    for what in SANDBOX_EVIDENCE:  # ... and in the instructor's record, whole
        assert what in record, what
    # ana's, cat's and dan's notebooks are one solution (cat's with a mutant, dan's with cheats
    # in other cells): their long answer is the same, which the gradebook names (no points
    # taken); nothing else of ana's or cat's is flagged
    same = "00.eager_bytes: the same answer as "
    assert rows["ana"]["flags"] == same + "cat, dan", rows["ana"]["flags"]
    assert rows["cat"]["flags"] == same + "ana, dan", rows["cat"]["flags"]
    assert same + "ana, cat" in rows["dan"]["flags"]
    assert rows["ben"]["flagged"] == "no"


def _kernel_cheats_ran_and_scored_nothing(graded):
    import json

    rec = json.loads((graded["out"] / "results" / "dan" / f"{LESSON}.json").read_text())
    nb = rec["result"]
    problems = " ".join(nb["problems"])
    # every cheat cell ran cleanly and took effect in the kernel (the audit cell did not raise)
    assert "leaked" not in problems and "did not take effect" not in problems, problems
    ex = {e["id"]: e for e in nb["exercises"]}
    assert "crashed" in ex["00.eager_bytes"]["failures"][0]  # check redefined to exit
    assert nb["score"] == 0


def _one_feedback_file_per_student_with_hints_and_no_hidden_source(graded):
    fb = graded["out"] / "feedback"
    files = sorted(p.relative_to(fb).as_posix() for p in fb.rglob("*.txt"))
    assert files == [f"{s}/{LESSON}.txt" for s in ("ana", "ben", "cat", "dan")]
    cat = (fb / "cat" / f"{LESSON}.txt").read_text()
    ex = get("00.bytes_moved")
    assert ex.mutants[0].hint in " ".join(cat.split())  # the hint, whole
    assert "submitted late" in cat
    # a hidden check's failure names no input (the class keeps one seed: a resubmission could
    # special-case them); the visible checks' do
    from quack_edu.grading.report import HIDDEN_CASE_FAILED

    assert " ".join(HIDDEN_CASE_FAILED.split()) in " ".join(cat.split()), cat
    for p in fb.rglob("*.txt"):
        text = p.read_text()
        assert "BEGIN HIDDEN" not in text and "check(" not in text


def _a_rerun_grades_nothing_new_unless_forced(graded, capsys):
    capsys.readouterr()
    assert grade_main(graded["args"]) == 0
    out = capsys.readouterr().out
    assert "0 graded, 4 already graded" in out, out
    # a result rewritten behind the grader's back (its digest kept) bears no valid signature:
    # the next run grades that submission again, and the gradebook says what the grader saw
    import json

    ben = graded["out"] / "results" / "ben" / f"{LESSON}.json"
    rec = json.loads(ben.read_text())
    for e in rec["result"]["exercises"]:
        e["forced_status"], e["forced_message"] = "pass", None
    ben.write_text(json.dumps(rec))
    assert grade_main(graded["args"]) == 0
    assert "1 graded, 3 already graded" in capsys.readouterr().out
    rows = {r["student"]: r for r in csv.DictReader(open(graded["out"] / "gradebook.csv"))}
    assert rows["ben"]["score"] == "0"
    # --force grades again (one exercise, judged without running the notebooks: fast)
    args = [*graded["args"], "--force", "--only", "00.bytes_moved", "-j", "1"]
    assert grade_main(args) == 0
    assert "4 graded" in capsys.readouterr().out


#: a cell that rewrites its own submission with native code (no audit event): red team 4's
#: swap, here one byte of a text cell, so that the notebook stays readable
REWRITE_SELF = (
    "import torch\n"
    "p = {path!r}\n"
    "t = torch.from_file(p, shared=True, size=torch.os.stat(p).st_size, dtype=torch.uint8)\n"
    "i = bytes(t[:4000].tolist()).find(b'roofline')\n"
    "t[i] = ord('R')\n"
)


def test_a_submission_rewritten_while_graded_is_flagged_now_and_later(tmp_path, monkeypatch):
    # without Landlock (GPU mode today) native code can write the submission; the grader sees
    # its digest change, flags the row, and a re-run (which grades the rewritten notebook)
    # keeps the flag
    from quack_edu.grading.nbfiles import nbformat

    monkeypatch.setenv("QUACK_EDU_LANDLOCK", "0")
    path = tmp_path / "subs" / "eve" / f"{LESSON}.ipynb"
    nb = read(notebooks_dir() / f"{LESSON}.ipynb")
    nb.cells.insert(2, nbformat.v4.new_code_cell(REWRITE_SELF.format(path=str(path))))
    write(nb, path)
    out = tmp_path / "grades"
    args = [str(tmp_path / "subs"), "--lesson", LESSON, "--out", str(out), "--timeout", "60"]
    for run in (1, 2):
        assert grade_main(args) == 0
        rows = {r["student"]: r for r in csv.DictReader(open(out / "gradebook.csv"))}
        assert rows["eve"]["flagged"] == "yes", (run, rows["eve"])
        assert "rewritten on disk while it was graded" in rows["eve"]["flags"], (run, rows["eve"])
    assert b"Roofline" in path.read_bytes() or b"ROOFLINE" in path.read_bytes()


def test_students_whose_results_would_collide_are_refused(tmp_path, capsys):
    # (red team 5) "ana!" and "ana" share a results folder: a blank overwrote an honest grade
    from quack_edu.grading.class_grade import ClassLayoutError, find_submissions

    blank = read(notebooks_dir() / f"{LESSON}.ipynb")
    for name in ("ana", "ana!"):
        write(blank, tmp_path / "subs" / f"{name}.ipynb")
    with pytest.raises(ClassLayoutError, match="share a folder: 'ana!' and 'ana'"):
        find_submissions(tmp_path / "subs", LESSON)
    assert (
        grade_main([str(tmp_path / "subs"), "--lesson", LESSON, "--out", str(tmp_path / "g")]) == 2
    )
    assert "share a folder" in capsys.readouterr().err


def test_a_name_with_a_space_or_no_name_takes_no_one_elses_place(tmp_path):
    # (red team 10) "ana .ipynb", a blank, was graded as ana's instead of ana.ipynb (0/4, her
    # row flagged as if she had handed in two), and a bare <lesson>.ipynb as the folder
    # student/'s: now the first stops the class, naming both, the second is a student of its own
    from quack_edu.grading.class_grade import ClassLayoutError, find_submissions

    blank = read(notebooks_dir() / f"{LESSON}.ipynb")
    write(blank, tmp_path / "a" / "ana.ipynb")
    write(blank, tmp_path / "a" / "ana .ipynb")
    with pytest.raises(ClassLayoutError, match="share a folder: 'ana ' and 'ana'"):
        find_submissions(tmp_path / "a", LESSON)
    write(blank, tmp_path / "b" / "student" / f"{LESSON}.ipynb")
    write(blank, tmp_path / "b" / f"{LESSON}.ipynb")
    subs = {s.student: s for s in find_submissions(tmp_path / "b", LESSON)}
    assert set(subs) == {"student", LESSON}
    assert subs["student"].path.parent.name == "student" and not subs["student"].also


def test_a_second_notebook_for_the_lesson_is_named_not_dropped(tmp_path):
    # (red team 5) cat.ipynb and cat_<lesson>.ipynb: one was graded, the other silently ignored
    from quack_edu.grading.class_grade import find_submissions

    blank = read(notebooks_dir() / f"{LESSON}.ipynb")
    write(blank, tmp_path / "subs" / "cat.ipynb")
    write(blank, tmp_path / "subs" / f"cat_{LESSON}.ipynb")
    (sub,) = find_submissions(tmp_path / "subs", LESSON)
    assert sub.student == "cat" and sub.path is not None and len(sub.also) == 1
    assert {sub.path.name, sub.also[0].name} == {"cat.ipynb", f"cat_{LESSON}.ipynb"}


def test_a_linked_submission_is_refused_not_read(tmp_path, capsys):
    # (red team 6, attack 16) a notebook, a student folder, a flat file or a folder inside a
    # student's that is a symbolic link to the instructor's solutions (a tar keeps one) is
    # refused: 0, flagged, named; the grader never reads what it points to
    solution_nb = solutions_dir() / f"{LESSON}.ipynb"
    subs = tmp_path / "subs"
    write(read(notebooks_dir() / f"{LESSON}.ipynb"), subs / "ana" / f"{LESSON}.ipynb")
    (subs / "ben").mkdir()
    (subs / "ben" / f"{LESSON}.ipynb").symlink_to(solution_nb)
    (subs / "cy").symlink_to(solutions_dir(), target_is_directory=True)
    (subs / f"dee_{LESSON}.ipynb").symlink_to(solution_nb)
    (subs / "eve").mkdir()
    (subs / "eve" / "work").symlink_to(solutions_dir(), target_is_directory=True)
    out = tmp_path / "grades"
    args = [str(subs), "--lesson", LESSON, "--out", str(out), "--only", "00.bytes_moved"]
    assert grade_main(args) == 0
    rows = {r["student"]: r for r in csv.DictReader(open(out / "gradebook.csv"))}
    assert sorted(rows) == ["ana", "ben", "cy", "dee", "eve"]
    named = {
        "ben": f"ben/{LESSON}.ipynb",
        "cy": "cy",
        "dee": f"dee_{LESSON}.ipynb",
        "eve": "eve/work",
    }
    for student, link in named.items():
        row = rows[student]
        assert row["score"] == "0" and row["max_score"] == "1", row
        assert row["status"] == "refused" and row["flagged"] == "yes", row
        assert f"{link} is a symbolic link (to {solutions_dir()}" in row["flags"], row["flags"]
        feedback = (out / "feedback" / student / f"{LESSON}.txt").read_text()
        assert "refused" in feedback and "symbolic link" in feedback
    assert rows["ana"]["status"] == "graded" and rows["ana"]["flagged"] == "no"
    # alone too: a link to a solution is not graded as the solution
    capsys.readouterr()
    one = tmp_path / "one.json"
    link = subs / "ben" / f"{LESSON}.ipynb"
    assert grade_main([str(link), "--only", "00.bytes_moved", "--json", str(one)]) == 1
    (nb,) = json.loads(one.read_text())["notebooks"]
    assert nb["score"] == 0 and nb["max_score"] == 1
    assert "is a symbolic link" in " ".join(nb["flags"]), nb["flags"]
    assert "symbolic link" in capsys.readouterr().out


def test_a_solution_is_read_only_by_its_own_path(tmp_path):
    # the same file by another name (a hard link, a linked folder on the way) is refused; the
    # solutions folder's own path is read (an instructor grading a solution)
    from quack_edu.grading.submission import Refused, read_bytes

    sols = tmp_path / "solutions"
    sols.mkdir()
    (sols / f"{LESSON}.ipynb").write_bytes((solutions_dir() / f"{LESSON}.ipynb").read_bytes())
    (tmp_path / "elsewhere").mkdir()
    os.link(sols / f"{LESSON}.ipynb", tmp_path / "elsewhere" / "mine.ipynb")
    (tmp_path / "via").symlink_to(sols, target_is_directory=True)
    assert read_bytes(sols / f"{LESSON}.ipynb", solutions=sols)
    for other in (tmp_path / "elsewhere" / "mine.ipynb", tmp_path / "via" / f"{LESSON}.ipynb"):
        with pytest.raises(Refused, match=f"is the solution notebook {LESSON}.ipynb itself"):
            read_bytes(other, solutions=sols)
    # in a class, no link below the submissions folder: named where it is
    with pytest.raises(Refused, match=r"^via is a symbolic link"):
        read_bytes(tmp_path / "via" / f"{LESSON}.ipynb", root=tmp_path)
    fifo = tmp_path / "pipe.ipynb"
    os.mkfifo(fifo)
    with pytest.raises(Refused, match="not a regular file"):
        read_bytes(fifo)  # (and the open does not block)


def test_gradebook_cells_are_text_to_a_spreadsheet(tmp_path):
    # (red team 6, attack 27) a student names the file: "=HYPERLINK(...)" was a formula in the
    # gradebook, and a name with a newline left a physical line that read as another row
    from quack_edu.grading.class_grade import write_gradebook

    names = ['=HYPERLINK("http://x")', "+1", "-2", "@SUM(A1)", "\tx", "\rx", "ana"]
    names.append("gus\nmallory,00_setup_and_roofline,x,graded,no,4,4")
    rows = [{"student": n, "lesson": LESSON, "score": -3, "00.x compile": "-"} for n in names]
    rows[-1]["flags"] = "=1+1 | @x"
    book = tmp_path / "gradebook.csv"
    write_gradebook(book, rows, [("00.x", "compile")])
    text = book.read_text()
    assert not any(line.startswith("mallory") for line in text.splitlines()), text
    got = list(csv.DictReader(open(book)))
    assert [r["student"] for r in got] == [
        '\'=HYPERLINK("http://x")',
        "'+1",
        "'-2",
        "'@SUM(A1)",
        "'\\tx",
        "'\\rx",
        "ana",
        "gus\\nmallory,00_setup_and_roofline,x,graded,no,4,4",
    ]
    assert got[-1]["flags"] == "'=1+1 | @x"
    assert {r["score"] for r in got} == {"-3"} and {r["00.x compile"] for r in got} == {"-"}
