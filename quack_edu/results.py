"""Recorded GPU results, so that lessons read on a machine without a Hopper GPU still show the
measured numbers (from an H200) instead of failing.

The lead records them on the H200 with ``quack_edu.bench`` into ``benchmarks/results/NAME.json``::

    {"gpu": "NVIDIA H200", "date": "2026-11-29", "copy_gbps": 4270.0,
     "rows": [{"stage": "naive", "M": 4096, "N": 4096, "dtype": "bf16",
               "us": 812.0, "gbps": 82.6, "pct_copy": 1.9}, ...]}

``load(name)`` returns that dict, or None when nothing is recorded yet; ``show`` prints a table
or says clearly that there is no recorded result. ``QUACK_EDU_RESULTS`` points elsewhere.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def results_dir() -> Path:
    env = os.environ.get("QUACK_EDU_RESULTS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def load(name: str) -> dict | None:
    path = results_dir() / f"{name}.json"
    if not path.exists():
        return None
    with open(path) as f:
        return json.load(f)


def rows(name: str, **where) -> list[dict]:
    """Rows of a recorded result matching every ``field=value`` given (empty when absent)."""
    data = load(name)
    if not data:
        return []
    return [r for r in data.get("rows", []) if all(r.get(k) == v for k, v in where.items())]


def missing_message(name: str) -> str:
    return (
        f"no recorded result yet: {results_dir() / (name + '.json')} does not exist. It is "
        "recorded on an H200 with quack_edu.bench; on a Hopper GPU this cell measures instead."
    )


def show(name: str, columns=("stage", "M", "N", "dtype", "us", "gbps", "pct_copy"), **where):
    """Print a recorded result as a table (or why there is none). Returns the rows shown."""
    data = load(name)
    if data is None:
        print(missing_message(name))
        return []
    sel = rows(name, **where)
    print(
        f"recorded on {data.get('gpu', '?')} on {data.get('date', '?')}; "
        f"copy bandwidth then: {data.get('copy_gbps', float('nan')):.0f} GB/s"
    )
    if not sel:
        print(f"  (no rows with {where})")
        return []
    widths = {c: max(len(str(c)), *(len(_fmt(r.get(c))) for r in sel)) for c in columns}
    print("  " + "  ".join(f"{c:>{widths[c]}}" for c in columns))
    for r in sel:
        print("  " + "  ".join(f"{_fmt(r.get(c)):>{widths[c]}}" for c in columns))
    return sel


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return "-" if v is None else str(v)
