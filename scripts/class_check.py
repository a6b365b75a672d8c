#!/usr/bin/env python3
"""Grade a made-up class and check its gradebook: the boundary under load (issue 49).

    python3 scripts/class_check.py [--lesson 00_setup_and_roofline] [--students 30]
        [--jobs 1,2] [--out out/class_check] [--timeout 120]

Makes a class of ``--students`` submissions of one lesson, in four kinds taking turns:
solutions (full marks), blanks (0), mutants (one exercise's mutant: that exercise's tiers lose
their points) and cheats (every answer cell reaches past its process: the exercises' module,
the solutions, a process left running, the grader's files; 0 and flagged). Grades it once per
``--jobs`` value (``quack-edu grade FOLDER -j J --force``), checks every row of each gradebook
against what its kind must score, and writes ``class_check.json`` (seconds per run, the
machine, mismatches) under ``--out``. Exit 1 on a mismatch. On a GPU the gpu tier counts too:
a mutant's tiers are the tiers its table names.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: an answer cell of a cheat: it reaches past the learner's process in four ways, then
#: defines nothing (so a reach that went through would be the only way to points)
CHEAT = (
    "import importlib, os, subprocess, sys\n"
    "for reach in (\n"
    "    lambda: importlib.import_module('quack_edu.grading.exercises.lesson00'),\n"
    "    lambda: open(os.path.dirname(sys.modules['quack_edu'].__file__)\n"
    "                 + '/../solutions/00_setup_and_roofline.ipynb').read(),\n"
    "    lambda: subprocess.Popen(['sleep', '60'], start_new_session=True),\n"
    "    lambda: open(os.path.dirname(sys.modules['quack_edu'].__file__)\n"
    "                 + '/grading/judge.py', 'a').write('\\n'),\n"
    "):\n"
    "    try:\n"
    "        reach()\n"
    "    except Exception:\n"
    "        pass\n"
)


def make_class(folder: Path, lesson: str, n: int) -> dict[str, dict]:
    """Write the submissions; returns {student: {"kind", "expected": {exercise id: points}}}
    (None: not checked)."""
    from quack_edu._env import MODE
    from quack_edu.grading import GPU, all_exercises
    from quack_edu.grading.notebook import find_cell, notebooks_dir, read, solutions_dir, write
    from quack_edu.grading.similarity import fingerprint

    exercises = all_exercises(lesson)
    tiers = ("compile", "gpu") if MODE.gpu else ("compile",)
    full = {e.id: sum(p for t, p in e.points.items() if t in tiers) for e in exercises}
    mutable = [(e, m) for e in exercises for m in e.mutants]
    out = {}
    for k in range(n):
        student = f"s{k:02d}"
        kind = ("solution", "blank", "mutant", "cheat")[k % 4]
        if kind == "blank":
            nb, expected = read(notebooks_dir() / f"{lesson}.ipynb"), dict.fromkeys(full, 0)
        else:
            nb, expected = read(solutions_dir() / f"{lesson}.ipynb"), dict(full)
        if kind == "mutant":
            ex, m = mutable[(k // 4) % len(mutable)]
            cell = find_cell(nb, ex.cell_id)
            cell.source = m.apply(cell.source)
            lost = sum(p for t, p in ex.points.items() if t in tiers and t in m.tiers)
            expected[ex.id] = full[ex.id] - lost
            if GPU in tiers and GPU not in m.tiers and ex.points.get(GPU):
                expected[ex.id] = None  # its values may still be right: not checked
            kind = f"mutant {ex.id}: {m.name}"
        if kind == "cheat":
            for e in exercises:
                find_cell(nb, e.cell_id).source = CHEAT
            expected = dict.fromkeys(full, 0)
        write(nb, folder / student / f"{lesson}.ipynb")
        # a long answer handed in by several students is named in the gradebook
        same = (
            kind == "solution"
            and n > 4
            and any(fingerprint(find_cell(nb, e.cell_id).source) for e in exercises)
        )
        out[student] = {"kind": kind, "expected": expected, "same": same}
    return out


def grade(folder: Path, out: Path, lesson: str, jobs: int, timeout: float) -> float:
    from quack_edu.grading.cli import main as grade_main

    args = ["grade", str(folder), "--lesson", lesson, "--out", str(out), "-j", str(jobs)]
    t0 = time.time()
    rc = grade_main([*args, "--force", "--timeout", str(timeout)])
    if rc:
        raise SystemExit(f"quack-edu grade -j {jobs} exited {rc}")
    return time.time() - t0


def mismatches(book: Path, students: dict) -> list[str]:
    rows = {r["student"]: r for r in csv.DictReader(open(book))}
    bad = []
    for s, want in students.items():
        row = rows.get(s)
        if row is None:
            bad.append(f"{s}: no row")
            continue
        for ex_id, pts in want["expected"].items():
            if pts is None:
                continue
            got = sum(int(v or 0) for k, v in row.items() if k.startswith(f"{ex_id} "))
            if got != pts:
                bad.append(f"{s} ({want['kind']}): {ex_id} {got} points, expected {pts}")
        if want["kind"] == "cheat" and row["flagged"] != "yes":
            bad.append(f"{s} (cheat): not flagged")
        # the class hands in copies of one solution: their long answers are named as the same
        # answer as others' (no points taken); no other flag
        other = [f for f in row["flags"].split(" | ") if f and "the same answer as" not in f]
        if want["kind"] != "cheat" and other:
            bad.append(f"{s} ({want['kind']}): flagged: {' | '.join(other)[:300]}")
        if want["same"] and "the same answer as" not in row["flags"]:
            bad.append(f"{s} (solution): its copies of the solution are not named")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lesson", default="00_setup_and_roofline")
    ap.add_argument("--students", type=int, default=30)
    ap.add_argument("--jobs", default="1,2", help="comma-separated -j values, graded in turn")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "class_check")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    from quack_edu._env import MODE

    args.out.mkdir(parents=True, exist_ok=True)
    folder = args.out / "submissions"
    students = make_class(folder, args.lesson, args.students)
    record = {
        "lesson": args.lesson,
        "students": args.students,
        "mode": "gpu" if MODE.gpu else "compile-only",
        "device": MODE.reason,
        "machine": f"{platform.node()} ({platform.processor() or platform.machine()})",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "runs": [],
    }
    failed = False
    for j in [int(x) for x in args.jobs.split(",")]:
        grades = args.out / f"grades_j{j}"
        seconds = grade(folder, grades, args.lesson, j, args.timeout)
        bad = mismatches(grades / "gradebook.csv", students)
        failed |= bool(bad)
        record["runs"].append({"jobs": j, "seconds": round(seconds, 1), "mismatches": bad})
        print(f"-j {j}: {seconds:.0f} s, {len(bad)} mismatches" + "".join(f"\n  {b}" for b in bad))
        # after every run: a device call cut off mid-class keeps the runs it finished
        (args.out / "class_check.json").write_text(json.dumps(record, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
