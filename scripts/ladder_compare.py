#!/usr/bin/env python3
"""Is a new run of the library's ladder rows slower than the record? Compare two bench records.

    python3 scripts/ladder_compare.py benchmarks/results/ladder.json NEW.json [--tol 0.03]

Absolute GB/s of one kernel moves by -17% to +24% between two instances of the H200 (the same
code, session 20), so a row is compared by what its own run measured beside it: the library's
GB/s over the peer's (QuACK) and its % of the copy ceiling measured in that run. A row is
**slower** when both fell by more than ``--tol`` (a fraction), unless the time it added per
call is no more than the peer's (plus ``--tol`` of its own time): a host-bound row (small N, no
CUDA graph) on a slower host gains the same microseconds in both kernels, which lowers both
ratios without either kernel changing; such a row reads ``ok (host)``. It prints every shared
row (pass, N, weight dtype, CUDA graph or not) and exits 1 if any row is slower.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def rows(record: dict, kernel: str) -> dict:
    """(pass, N, weight dtype, graph, residual) -> row of ``kernel``."""
    out = {}
    for p in ("fwd", "bwd"):
        for r in (record.get(p) or {}).get("rows", []):
            if r.get("kernel") == kernel and "gbps" in r:
                key = (p, r["N"], r.get("weight_dtype"), bool(r.get("graph")), r.get("residual"))
                out[key] = r
    return out


def _host_bound(ours_old, ours_new, peer_old, peer_new, tol) -> bool:
    """Did the row gain no more time per call than the peer's (within ``tol`` of its own)?
    Asked of rows without a CUDA graph only."""
    four = (ours_old, ours_new, peer_old, peer_new)
    if not all(r is not None and "us" in r for r in four):
        return False
    ours_added = ours_new["us"] - ours_old["us"]
    peer_added = peer_new["us"] - peer_old["us"]
    return peer_added > 0 and ours_added <= peer_added + tol * ours_old["us"]


def compare(old: dict, new: dict, ours="lib", peer="quack", tol=0.03) -> tuple[list[str], int]:
    """The table's lines and how many rows are slower."""
    a, b = rows(old, ours), rows(new, ours)
    pa, pb = rows(old, peer), rows(new, peer)
    lines = [
        f"{'pass':<4} {'N':>7} {'w':<5} {'graph':<5} "
        f"{'vs ' + peer + ' old':>12} {'new':>6} {'% copy old':>11} {'new':>6}  verdict"
    ]
    slower = 0
    for key in sorted(set(a) & set(b), key=lambda k: (k[0], k[3], k[2] or "", k[1])):
        p, N, wd, graph, _ = key
        ra = a[key]["gbps"] / pa[key]["gbps"] if key in pa else None
        rb = b[key]["gbps"] / pb[key]["gbps"] if key in pb else None
        ca, cb = a[key].get("pct_copy"), b[key].get("pct_copy")
        fell = [
            x is not None and y is not None and y < x * (1 - tol) for x, y in ((ra, rb), (ca, cb))
        ]
        known = [x is not None and y is not None for x, y in ((ra, rb), (ca, cb))]
        bad = any(known) and all(f for f, k in zip(fell, known, strict=True) if k)
        # a graph row: one replay launches all its calls, so it does not time the host
        host = bad and not graph and _host_bound(a[key], b[key], pa.get(key), pb.get(key), tol)
        bad = bad and not host
        slower += bad

        def f(v, spec):
            return format(v, spec) if v is not None else "-"

        lines.append(
            f"{p:<4} {N:>7} {wd or '-':<5} {'yes' if graph else 'no':<5} "
            f"{f(ra, '12.3f')} {f(rb, '6.3f')} {f(ca, '11.1f')} {f(cb, '6.1f')}  "
            + ("SLOWER" if bad else "ok (host)" if host else "ok")
        )
    return lines, slower


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--ours", default="lib")
    ap.add_argument("--peer", default="quack")
    ap.add_argument("--tol", type=float, default=0.03)
    a = ap.parse_args(argv)
    old, new = (json.loads(p.read_text()) for p in (a.old, a.new))
    lines, slower = compare(old, new, a.ours, a.peer, a.tol)
    print("\n".join(lines))
    worse = f"by more than {100 * a.tol:.0f}% on both measures"
    print(f"{slower} row(s) slower than {a.old.name} {worse}")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
