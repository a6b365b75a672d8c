"""The record of how long a learner's check cell takes on a 2-core machine
(benchmarks/results/check_times_cpu.json, written by scripts/check_times.py): every exercise is
in it, and each one's visible checks answered within the limit (10 s). A new exercise, or a
check that makes an old one slower, is re-measured with the script; nothing is timed here."""

import json
from pathlib import Path

from quack_edu.grading import all_exercises

RECORD = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "check_times_cpu.json"


def test_every_exercise_has_a_check_time_within_the_limit():
    rec = json.loads(RECORD.read_text())
    assert rec["limit_s"] == 10.0 and "2 cores" in rec["machine"]
    rows = {r["id"]: r for r in rec["rows"]}
    assert set(rows) == {ex.id for ex in all_exercises()}
    for ex_id, r in rows.items():
        assert r["status"] == "pass" and r["score"] == r["max"], ex_id
        assert r["seconds"] <= rec["limit_s"], (ex_id, r["seconds"])
