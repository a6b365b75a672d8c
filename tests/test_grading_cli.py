"""`quack-edu grade` end to end: solutions score full points (of the tiers this machine runs),
student notebooks score 0, broken notebooks (an infinite loop, exceptions, a shortcut, a kernel
that dies, a syntax error) are reported exercise by exercise without crashing the grader, and
the JSON carries score/max_score at every level plus each failure's message."""

from __future__ import annotations

import json

import pytest

from quack_edu.grading import COMPILE, GPU, all_exercises, get, lessons
from quack_edu.grading.cli import grade_main
from quack_edu.grading.notebook import (
    find_cell,
    notebooks_dir,
    read,
    solutions_dir,
    write,
)

LESSONS = lessons()  # every lesson with exercises


def _points(lesson, mode="compile-only"):
    """Points of the tiers that run in ``mode`` (gpu points count only on a Hopper GPU)."""
    tiers = (COMPILE, GPU) if mode == "gpu" else (COMPILE,)
    return sum(ex.points.get(t, 0) for ex in all_exercises(lesson) for t in tiers)


def _grade(paths, tmp_path, *extra):
    out = tmp_path / "grade.json"
    rc = grade_main([*map(str, paths), "--json", str(out), *extra])
    return rc, json.loads(out.read_text())


def test_every_solution_notebook_is_graded():
    # grading a solution is also its top-to-bottom run (below): none may escape it
    assert sorted(p.stem for p in solutions_dir().glob("*.ipynb")) == sorted(LESSONS)


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_grade_solutions_full_points(lesson, tmp_path, capsys):
    # Also the solution notebook's run top to bottom, as Jupyter runs it (where there is none,
    # the H200, in the grader's child Python): every cell ran cleanly ("problems" is empty),
    # on the CPU compile-only with recorded H200 results where a cell needs a GPU, and no cell
    # printed FAIL.
    ran = tmp_path / "ran"
    rc, data = _grade([solutions_dir() / f"{lesson}.ipynb"], tmp_path, "--executed", str(ran))
    table = capsys.readouterr().out
    assert rc == 0, table
    printed = "\n".join(
        o.get("text", "")
        for c in read(ran / f"{lesson}.ipynb").cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.get("output_type") == "stream"
    )
    assert printed and "FAIL" not in printed, printed
    assert data["passed"] and data["hidden_checks"]
    mode = data["mode"]
    assert data["score"] == data["max_score"] == _points(lesson, mode)
    for nb in data["notebooks"]:
        assert nb["score"] == nb["max_score"] == _points(nb["lesson"], mode)
        assert nb["problems"] == [], nb["problems"]  # every cell ran cleanly
        # and nothing a lesson's own cell does is flagged (08's bench ran torch.compile on a
        # GPU, whose C compiler the sandbox refused: the solution was flagged, 2026-12-06)
        assert nb["flags"] == [], nb["flags"]
        for ex in nb["exercises"]:
            assert ex["status"] == "pass" and ex["score"] == ex["max_score"]
            assert not ex["failures"]
            skipped = 0 if mode == "gpu" else get(ex["id"]).points.get(GPU, 0)
            assert ex["skipped_points"] == skipped


def _student_lessons():
    """Every lesson on a Hopper GPU (the H200 check grades each student copy through the GPU
    path); on the CPU three light ones end to end: every exercise's blank is judged 0 on its
    own below, without running its notebook (a student copy takes 6-16 s of CI's 2 cores)."""
    from quack_edu._env import MODE

    if MODE.gpu:
        return LESSONS
    return [le for le in LESSONS if le.startswith(("00_", "01b_", "08_"))]


@pytest.mark.slow
@pytest.mark.parametrize("lesson", _student_lessons())
def test_grade_student_notebooks_zero(lesson, tmp_path, capsys):
    rc, data = _grade([notebooks_dir() / f"{lesson}.ipynb"], tmp_path)
    table = capsys.readouterr().out
    assert rc == 1
    assert data["score"] == 0 and not data["passed"]
    assert data["max_score"] == _points(lesson, data["mode"])
    for nb in data["notebooks"]:
        assert nb["score"] == 0
        for ex in nb["exercises"]:
            assert ex["status"] == "not attempted" and ex["score"] == 0
            assert any("not attempted" in f for f in ex["failures"])
    assert "not attempted" in table and "FAIL" in table


def test_every_blank_is_judged_not_attempted():
    # each exercise's cell as the student copy has it, judged as `quack-edu grade` judges it
    # (in a worker, hidden checks on): not attempted, 0 points, on both tiers this machine runs
    from quack_edu.grading.judge import judge_exercise

    for lesson in LESSONS:
        student = read(notebooks_dir() / f"{lesson}.ipynb")
        for ex in all_exercises(lesson):
            res = judge_exercise(ex, find_cell(student, ex.cell_id).source, seed=3, timeout=60)
            assert res.status == "not attempted" and res.score == 0, res.table()
            assert any("not attempted" in f for f in res.failures), res.table()


def _broken(tmp_path, lesson, answers: dict[str, str]):
    nb = read(notebooks_dir() / f"{lesson}.ipynb")
    for ex_id, source in answers.items():
        find_cell(nb, get(ex_id).cell_id).source = source
    path = tmp_path / f"{lesson}.ipynb"
    write(nb, path)
    return path


def _solution_cell(lesson, ex_id):
    return find_cell(read(solutions_dir() / f"{lesson}.ipynb"), get(ex_id).cell_id).source


@pytest.fixture
def engine(without_jupyter):
    """Grade as the grader always does (its child Python, locked down), here as on the H200
    machine, without Jupyter packages."""
    return "child"


def _grade_broken(tmp_path, lesson, answers, timeout="6"):
    path = _broken(tmp_path, lesson, answers)
    out = tmp_path / "grade.json"
    rc = grade_main([str(path), "--json", str(out), "--timeout", timeout, "--no-hidden"])
    data = json.loads(out.read_text())
    assert rc == 1 and not data["passed"]
    nb = data["notebooks"][0]
    assert {"score", "max_score", "skipped_points", "exercises", "path"} <= set(nb)
    assert nb["boundary"]["learner_processes"].startswith("sandbox: ")  # which was in force
    for e in nb["exercises"]:
        assert {"score", "max_score", "status", "failures", "checks", "tiers"} <= set(e)
    return data, {e["id"]: e for e in nb["exercises"]}


@pytest.mark.slow
def test_grade_survives_an_infinite_loop_an_exception_and_a_shortcut(tmp_path, capfd, engine):
    le = "00_setup_and_roofline"
    data, ex = _grade_broken(
        tmp_path,
        le,
        {
            "00.bytes_moved": _solution_cell(le, "00.bytes_moved"),
            "00.roofline_time_us": (
                "def roofline_time_us(nbytes, flops, gbps, tflops):\n"
                "    while True:\n        pass\n"
            ),
            "00.eager_rmsnorm": (
                "def eager_rmsnorm(x, w, eps=1e-6):\n"
                "    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)\n"
            ),
            "00.eager_bytes": "def eager_bytes(M, N, dtype):\n    return M / 0\n\nx = (1 +\n",
        },
    )
    assert ex["00.bytes_moved"]["status"] == "pass" and ex["00.bytes_moved"]["score"] == 1
    loop = ex["00.roofline_time_us"]
    assert loop["status"] == "fail" and "timeout" in loop["failures"][0], loop
    short = ex["00.eager_rmsnorm"]
    assert short["status"] == "fail"
    assert "instead of computing RMSNorm" in " ".join(short["failures"]), short
    syntax = ex["00.eager_bytes"]
    assert syntax["status"] == "fail" and "SyntaxError" in syntax["failures"][0], syntax
    assert data["score"] == 1 and data["max_score"] == 4
    out, err = capfd.readouterr()  # the kernel's own output too (file descriptors)
    assert "timeout" in out
    assert "without encryption" not in out + err  # the kernel talks over IPC, not TCP


@pytest.mark.slow
def test_grade_survives_a_stuck_kernel_and_a_dead_one(tmp_path, engine):
    # a hang that ignores the interrupt and the alarm (as a GPU kernel waiting on a barrier
    # that never completes would) and a process that dies: both replace the kernel (Jupyter's,
    # or the grader's child Python without Jupyter), replay the cells before, and grading
    # goes on. Both happen as the answer cells run in the notebook's kernel (an answer that
    # hangs or dies when the grader calls it is the judge's case: tests/test_cheats.py). The
    # hang sleeps rather than spins: the same hang to the grader, without taking
    # a core from the other test worker for the ~20 s until it is killed.
    le = "01_naive"
    data, ex = _grade_broken(
        tmp_path,
        le,
        {
            "01.sum_squares": (
                "import signal\nimport time\n\n"
                "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                "while True:\n    time.sleep(1)\n"
            ),
            "01.rstd": "import os\n\nos._exit(3)\n",
            "01.sectors_per_request": _solution_cell(le, "01.sectors_per_request"),
        },
    )
    stuck = ex["01.sum_squares"]
    assert stuck["status"] == "fail" and "timeout" in stuck["failures"][0], stuck
    died = ex["01.rstd"]
    assert died["status"] == "fail" and "crashed" in died["failures"][0], died
    assert ex["01.sectors_per_request"]["status"] == "pass", ex["01.sectors_per_request"]
    assert data["score"] == 1


@pytest.mark.slow
def test_grade_stops_a_notebook_that_crashes_past_its_limit(tmp_path, engine):
    # (red team 6, attack 18) each crash costs a fresh process and a replay of the cells
    # before: past --max-restarts the cells left are not run, their exercises score 0 with the
    # reason, and the notebook is flagged; an exercise whose cells ran is judged as ever
    from quack_edu.grading.nbfiles import nbformat

    le = "00_setup_and_roofline"
    nb = read(solutions_dir() / f"{le}.ipynb")
    after = next(i for i, c in enumerate(nb.cells) if c.source == find_cell(
        nb, get("00.bytes_moved").test_cell_id).source)  # fmt: skip
    for _ in range(4):
        nb.cells.insert(after + 1, nbformat.v4.new_code_cell("import os\nos._exit(3)"))
    path, out = tmp_path / f"{le}.ipynb", tmp_path / "grade.json"
    write(nb, path)
    args = [str(path), "--json", str(out), "--no-hidden", "--timeout", "30", "--max-restarts", "2"]
    assert grade_main(args) == 1
    (got,) = json.loads(out.read_text())["notebooks"]
    ex = {e["id"]: e for e in got["exercises"]}
    assert ex["00.bytes_moved"]["score"] == 1 and got["score"] == 1, ex
    for ex_id in ("00.roofline_time_us", "00.eager_rmsnorm", "00.eager_bytes"):
        why = ex[ex_id]["failures"][0]
        assert "was not run: its cells crashed or hung" in why and "at most 2 times" in why, why
    assert "the grader stopped running the notebook" in " ".join(got["flags"]), got["flags"]


@pytest.mark.slow
def test_grade_replaces_a_process_whose_gpu_faulted(tmp_path, engine):
    # After an illegal memory access every CUDA call of that process fails: the grader
    # replaces the kernel (or child) and replays the cells before, so the exercises after the
    # fault are graded on a working process. Simulated here: the cell leaves torch broken the
    # way a faulted CUDA context leaves it, and raises torch's error.
    le = "00_setup_and_roofline"
    fault = "RuntimeError('CUDA error: an illegal memory access was encountered')"
    data, ex = _grade_broken(
        tmp_path,
        le,
        {
            "00.bytes_moved": (
                _solution_cell(le, "00.bytes_moved") + "\n\nimport torch\n\n"
                f"def _faulted(*args, **kwargs):\n    raise {fault}\n\n\n"
                "torch.randn = torch.empty = torch.zeros = torch.ones = _faulted\n"
                f"raise {fault}\n"
            ),
            # the exercises after it, answered right: they need torch to be checked
            **{i: _solution_cell(le, i) for i in ("00.roofline_time_us", "00.eager_rmsnorm")},
            "00.eager_bytes": _solution_cell(le, "00.eager_bytes"),
        },
        # the checks after the fault run in a new process, which imports torch's profiler and
        # dynamo cold: on the H200, among other tests, that took more than 6 s (2026-12-01)
        timeout="60",
    )
    assert ex["00.bytes_moved"]["status"] == "fail", ex["00.bytes_moved"]
    for i in ("00.roofline_time_us", "00.eager_rmsnorm", "00.eager_bytes"):
        assert ex[i]["status"] == "pass", ex[i]


@pytest.mark.slow
def test_grade_reports_a_deleted_exercise_cell(tmp_path):
    # the learner deleted an exercise's cell: that exercise is not attempted, with the cell
    # named; its check cell comes back from the solution; the others are graded as usual
    le = "00_setup_and_roofline"
    nb = read(solutions_dir() / f"{le}.ipynb")
    nb.cells.remove(find_cell(nb, get("00.bytes_moved").cell_id))
    path = tmp_path / f"{le}.ipynb"
    write(nb, path)
    rc, data = _grade([path], tmp_path, "--timeout", "60")
    ex = {e["id"]: e for e in data["notebooks"][0]["exercises"]}
    gone = ex["00.bytes_moved"]
    assert rc == 1 and gone["status"] == "not attempted" and gone["score"] == 0
    assert "00_bytes_moved" in gone["failures"][0], gone
    others = [e for i, e in ex.items() if i != "00.bytes_moved"]
    assert others and all(e["status"] == "pass" for e in others), others


def test_grade_usage_errors(tmp_path, capsys):
    assert grade_main([str(tmp_path / "nope.ipynb")]) == 2
    assert "no such notebook" in capsys.readouterr().err


#: the child-process engine on two light lessons here (a kernel compiled in 01b's); on the H200
#: (no Jupyter) every lesson's grading tests above run through it (scripts/gpu_check.py)
CHILD_ENGINE_LESSONS = [le for le in LESSONS if le.startswith(("00_", "01b_"))]


@pytest.mark.slow
@pytest.mark.parametrize("lesson", CHILD_ENGINE_LESSONS)
def test_grade_without_jupyter(lesson, tmp_path, capsys, without_jupyter):
    # the solution and the student notebook in one run: the totals add up over notebooks. The
    # solution's every cell runs cleanly in the child Python (the H200's path; for lesson 04,
    # @cute.jit defined in a cell): no cell problem, no exercise failure or note
    paths = [solutions_dir() / f"{lesson}.ipynb", notebooks_dir() / f"{lesson}.ipynb"]
    rc, data = _grade(paths, tmp_path)
    points = _points(lesson, data["mode"])
    solution, student = data["notebooks"]
    table = capsys.readouterr().out
    assert solution["score"] == solution["max_score"] == points, table
    assert solution["problems"] == [], solution["problems"]
    assert not [f for ex in solution["exercises"] for f in ex["failures"]], table
    assert "summary" in table  # several notebooks: a summary table
    assert student["score"] == 0 and student["max_score"] == points
    assert rc == 1 and data["score"] == points and data["max_score"] == 2 * points
