"""``quack-edu student --release``: a student's copy holds no answer key and still self-checks."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from quack_edu.grading import release
from quack_edu.grading.nbfiles import exercise_source, read, solutions_dir
from quack_edu.grading.registry import all_exercises
from quack_edu.stages.warp import WarpRMSNorm

ROOT = Path(__file__).resolve().parents[1]

LESSON = "00_setup_and_roofline"
LESSONS = (LESSON, "09_in_a_model")  # host exercises: quick to judge


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "course"
    info = release.write_release(out, partial=True)
    return out, info


def _solutions() -> dict[str, str]:
    nbs = {lesson: read(solutions_dir() / f"{lesson}.ipynb") for lesson in LESSONS}
    return {
        ex.id: exercise_source(nbs[ex.lesson], ex) for ex in all_exercises() if ex.lesson in nbs
    }


def test_a_release_of_unkeyed_lessons_is_refused(tmp_path, monkeypatch):
    # (the check comes before anything is recorded or written)
    monkeypatch.setattr(release, "record_public", lambda *a: pytest.fail("recorded"))
    unkeyed = [
        p for p in release.exercise_modules().values() if release.BEGIN_KEY not in p.read_text()
    ]
    if not unkeyed:
        pytest.skip("every lesson has its answer key block")
    with pytest.raises(release.ReleaseError, match="no # BEGIN KEY block"):
        release.write_release(tmp_path / "course")
    assert not (tmp_path / "course").exists()


def test_the_students_copy_holds_no_answer(copy):
    out, info = copy
    assert "00" in info["lessons"]
    makefile = (out / "Makefile").read_text()  # no target that needs tests/ or solutions/
    assert "-m pytest" not in makefile and "INSTRUCTORS" not in makefile and "grade:" in makefile
    assert "INSTRUCTORS" not in (out / "README.md").read_text()
    for gone in ("solutions", "tests", "scripts"):
        assert not (out / gone).exists(), gone
    assert (out / "notebooks" / f"{LESSON}.ipynb").exists()
    exercises = out / "quack_edu" / "grading" / "exercises"
    texts = {p.name: p.read_text() for p in exercises.glob("*.py")}
    assert "lesson00.py" in texts and "whole_kernel.py" in texts
    for lesson in info["left_out"]:  # a lesson not keyed yet: its modules are not in the copy
        assert not any(n.startswith(f"lesson{lesson}") for n in texts), (lesson, sorted(texts))
    for name, text in texts.items():
        assert "mutants(" not in text and "def bytes_moved_ref" not in text, name
        assert "# BEGIN KEY" not in text and "# BEGIN HIDDEN" not in text, name
    # no line of a solution (beyond the def line and trivial ones) is in the package
    package = "\n".join(p.read_text() for p in (out / "quack_edu").rglob("*.py"))
    for ex_id, source in _solutions().items():
        for line in source.splitlines():
            s = line.strip()
            if len(s) > 24 and not s.startswith(("def ", "#", '"""', "import", "from")):
                assert s not in package, (ex_id, s)
    key = json.loads((out / "quack_edu" / "grading" / "public_key.json").read_text())
    assert key["seed"] == info["seed"] and "00.bytes_moved" in key["checks"]
    # a reference the PTX probes call directly answers its recorded calls (05.wait_groups)
    assert key["calls"]["wait_groups_ref"]["[1, 4]"] == 2


CHECK = textwrap.dedent(
    """
    import json, sys
    from quack_edu.grading import answer_key
    from quack_edu.grading.judge import judge_exercise
    from quack_edu.grading.registry import get
    answers = json.loads(sys.argv[1])
    out = {"released": answer_key.released()}
    for name, (ex_id, source) in answers.items():
        r = judge_exercise(get(ex_id), source, hidden=False)
        out[name] = {
            "score": r.score, "max": r.max_score,
            "hints": " | ".join((c.hint or "") + (c.message or "") for c in r.checks),
            "skipped": [c.name for c in r.checks if c.status == "skip"],
            "flagged": r.flagged,
            "forced": r.forced_message or "",
        }
    print(json.dumps(out))
    """
)


def _release_path(out) -> str:
    """The student's copy first, then what this process's PYTHONPATH holds besides the checkout
    (the device machine puts the CuTe DSL there)."""
    keep = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    keep = [p for p in keep if Path(p).resolve() != ROOT.resolve()]
    return os.pathsep.join([str(out), *keep])


def test_the_students_copy_checks_answers_from_its_recorded_cases(copy, subprocess_env):
    out, _ = copy
    sol = _solutions()
    no_weight = sol["00.bytes_moved"].replace(" + N * size", "")
    assert no_weight != sol["00.bytes_moved"]
    answers = {f"solution {k}": (k, v) for k, v in sol.items()}
    answers["no weight"] = ("00.bytes_moved", no_weight)
    # a cold learner's paste of the finished warp kernel scored 2/2 in the student's copy (the
    # copy checks decided by the solutions, which it has not): its release says what they found
    pasted = "import cutlass\nimport cutlass.cute as cute\nfrom cutlass import Float32\n" + (
        "from quack_edu.primitives import copy as copy_utils\n\n"
        + textwrap.dedent(inspect.getsource(WarpRMSNorm.kernel.__wrapped__))
        + "\nwarp_kernel = kernel\n"
    )
    answers["pasted warp kernel"] = ("02.warp_kernel", pasted)
    done = subprocess.run(
        [sys.executable, "-c", CHECK, json.dumps(answers)],
        cwd=out, env={**subprocess_env, "PYTHONPATH": _release_path(out)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["released"] is True
    for k in sol:
        r = got[f"solution {k}"]
        assert r["score"] == r["max"] > 0 and not r["skipped"], (k, r)
    assert got["pasted warp kernel"]["score"] == 0 and got["pasted warp kernel"]["flagged"]
    assert "copies the library's finished" in got["pasted warp kernel"]["forced"]
    assert got["no weight"]["score"] == 0
    assert "weight vector is read too" in got["no weight"]["hints"], got["no weight"]


def test_a_key_left_outside_its_block_stops_the_release():
    with pytest.raises(release.ReleaseError, match="BEGIN KEY"):
        release._no_telltales("X_MUTANTS = mutants(COMPILE,\n)\n", "lesson99.py")
    with pytest.raises(release.ReleaseError):
        release._no_telltales("def answer_ref(M):\n    return M\n", "lesson99.py")
