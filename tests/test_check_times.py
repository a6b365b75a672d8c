"""The record of how long a learner's check cell takes on a 2-core machine
(benchmarks/results/check_times_cpu.json, written by scripts/check_times.py): every exercise is
in it, timed with the visible checks it has now, each answered within the limit (10 s). A new
exercise, or a check added, removed or renamed, makes this test fail until the script measures
it again; nothing is timed here."""

import json
from pathlib import Path

from quack_edu.grading import COMPILE, all_exercises

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "results" / "check_times_cpu.json"
AGAIN = "measure it again: python scripts/check_times.py --json " + str(RECORD.relative_to(ROOT))


def test_every_exercise_was_timed_with_the_checks_it_has_now():
    rows = {r["id"]: r for r in json.loads(RECORD.read_text())["rows"]}
    exercises = {ex.id: ex for ex in all_exercises()}
    assert set(rows) == set(exercises), AGAIN
    for ex_id, ex in exercises.items():
        # a check cell runs the visible checks; on a CPU, those of the compile tier
        visible = [c.name for c in ex.checks if c.tier == COMPILE and not c.hidden]
        assert rows[ex_id]["checks"] == visible, f"{ex_id}: its checks changed; {AGAIN}"


def test_the_record_is_within_the_limit_on_two_cores():
    # what scripts/check_times.py exits 1 for, and the lessons' limit it was run with
    rec = json.loads(RECORD.read_text())
    assert rec["limit_s"] == 10.0 and "2 cores" in rec["machine"]
    for r in rec["rows"]:
        assert r["status"] == "pass" and r["score"] == r["max"], r["id"]
        assert r["seconds"] <= rec["limit_s"], (r["id"], r["seconds"])
