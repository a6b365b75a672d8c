"""How long a learner waits for a check cell: ``check(ID, answer)`` (the visible checks, as the
student notebook's check cell calls it) on each exercise's solution, each in a fresh process that
has already imported what the lesson's earlier cells import (quack_edu, torch, the DSL), so the
time is the check's own: its kernels compiled for the first time, the PTX read, the checks run.

    python scripts/check_times.py                 # every exercise, one at a time
    python scripts/check_times.py 05.pipeline 06.row_loop --json times.json

Run it on an idle machine: the number is a wall-clock time (CI's machine: 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
import torch, cutlass, cutlass.cute  # noqa: F401  (the lesson's first cells import these)
import quack_edu
from quack_edu.grading import check, get
from quack_edu.grading.notebook import answer_from_source, exercise_source, read, solutions_dir

ex = get(sys.argv[1])
nb = read(solutions_dir() / f"{ex.lesson}.ipynb")
answer = answer_from_source(exercise_source(nb, ex), ex.answer)
t = time.perf_counter()
res = check(ex.id, answer, quiet=True)
s = time.perf_counter() - t
ran = [c.name for c in res.checks if c.status != "skip"]  # the checks timed (a test reads them)
print("@@" + json.dumps({"id": ex.id, "seconds": s, "status": res.status,
                          "score": res.score, "max": res.max_score, "checks": ran}))
"""


def main(argv=None) -> int:
    from quack_edu.grading import all_exercises

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ids", nargs="*", help="exercise ids (default: every exercise)")
    ap.add_argument("--json", help="write the times here")
    ap.add_argument("--limit", type=float, default=10.0, help="seconds a check cell may take")
    a = ap.parse_args(argv)
    ids = a.ids or [ex.id for ex in all_exercises()]
    rows = []
    for ex_id in ids:
        env = {**os.environ, "QUACK_EDU_KERNEL_CACHE": "0"}  # a first compile, as a learner's
        out = subprocess.run(
            [sys.executable, "-c", CHILD, ex_id], capture_output=True, text=True, env=env,
            check=False,
        )  # fmt: skip
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("@@")), None)
        if line is None:
            print(f"{ex_id:24} failed:\n{out.stderr[-2000:]}", file=sys.stderr)
            rows.append({"id": ex_id, "seconds": None, "status": "error"})
            continue
        r = json.loads(line[2:])
        rows.append(r)
        flag = "" if r["seconds"] <= a.limit else f"  over {a.limit:g} s"
        print(f"{ex_id:24} {r['seconds']:6.1f} s  {r['status']} {r['score']}/{r['max']}{flag}")
    record = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {_cores()} cores, Python {platform.python_version()}",
        "limit_s": a.limit,
        "rows": rows,
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(record, f, indent=1)
    slow = [r for r in rows if r["seconds"] is None or r["seconds"] > a.limit]
    return 1 if slow else 0


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


if __name__ == "__main__":
    raise SystemExit(main())
