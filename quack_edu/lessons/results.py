"""Recorded GPU results, so that lessons read on a machine without a Hopper GPU still show the
measured numbers (from an H200) instead of failing.

They are recorded on the H200 with ``quack-edu bench`` (``scripts/gpu_check.py``) into
``benchmarks/results/NAME.json``. A record of one pass::

    {"gpu": "NVIDIA H200", "date": "2026-12-01", "copy_gbps": 4221.5, "pass": "fwd",
     "rows": [{"kernel": "naive", "M": 32768, "N": 4096, "dtype": "bf16",
               "weight_dtype": "bf16", "graph": false, "us": 2670.5, "gbps": 201.0,
               "pct_copy": 4.8}, ...]}

and one of both (``--pass both``, e.g. ``ladder.json``, the whole ladder) holds such a record
under ``fwd`` and one under ``bwd``.

``kernel`` is a stage name (naive, warp, block, cluster, cpasync, final, final_bwd), the
library (lib) or a peer: quack, liger, torch-compile, torch-eager (``F.rms_norm``, fused in
PyTorch) and torch-ops (the same maths as separate PyTorch ops: the "eager" RMSNorm of most
model code).

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
    return Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def load(name: str) -> dict | None:
    path = results_dir() / f"{name}.json"
    if not path.exists():
        return None
    with open(path) as f:
        return json.load(f)


def rows(name: str, pass_: str | None = None, **where) -> list[dict]:
    """Rows of a recorded result matching every ``field=value`` given (empty when absent). A
    record of both passes (``quack-edu bench --pass both``, e.g. ``ladder``) holds a result per
    pass, under ``fwd`` and ``bwd``: its rows are theirs, each with its ``pass`` (``pass_``
    picks one: ``rows("ladder", "fwd", kernel="warp", weight_dtype="bf16")``)."""
    data = load(name)
    if not data:
        return []
    every = data.get("rows", [])
    if data.get("pass") == "both":
        every = [{"pass": p, **r} for p in ("fwd", "bwd") for r in data.get(p, {}).get("rows", [])]
    if pass_ is not None:
        where["pass"] = pass_
    return [r for r in every if all(r.get(k) == v for k, v in where.items())]


def missing_message(name: str) -> str:
    return (
        f"no recorded result yet: {results_dir() / (name + '.json')} does not exist. It is "
        "recorded on an H200 with `quack-edu bench`; on a Hopper GPU this cell measures instead."
    )


def show(
    name: str, columns=("kernel", "M", "N", "dtype", "graph", "us", "gbps", "pct_copy"), **where
):
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
