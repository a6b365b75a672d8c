#!/usr/bin/env python3
"""A/B of the library backward's kernel config on the GPU: the heuristic's pick against the same
config with some fields changed, timed alternately in one process (values checked first).

    source .gpu/env.sh; python3 scripts/ab_bwd_config.py --set refill_early=True \\
        [--shapes 16384x131072,8192x262144] [--weight-dtype bf16,fp32] [--reps 3] [--graph]
        [--json F]

Each side runs through ``final_bwd.launch_bwd`` with an explicit config (its own compile key,
so nothing cached by the library's plain path can stand in for it) and sums dw's partials as
the library does. GB/s use the bench's byte count (``rmsnorm_bwd_bytes``) and the D2D copy of
the same run; a side's figure is the median over ``--reps`` alternating rounds. ``--graph``
times through CUDA graphs (short rows, where launches would hide the kernel).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = "32768x65536,16384x131072,8192x262144"


def parse_sets(items: list[str]) -> dict:
    """``["refill_early=True", "cluster_n=8"]`` -> {"refill_early": True, "cluster_n": 8}, each
    name a field of ``BwdConfig`` and each value a Python literal."""
    import ast

    from quack_edu.stages.final_bwd import BwdConfig

    fields = {f.name for f in dataclasses.fields(BwdConfig)}
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in fields:
            raise SystemExit(f"--set {item!r}: expected FIELD=VALUE, FIELD one of {sorted(fields)}")
        try:
            out[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise SystemExit(f"--set {item!r}: {text!r} is not a Python literal") from None
    return out


def configs(N: int, dtype, weight_dtype, changes: dict):
    """(the heuristic's config, that config with ``changes``) for a plain backward."""
    from quack_edu.stages import final_bwd as fb

    base = fb.bwd_config(N, dtype, weight_dtype)
    return base, dataclasses.replace(base, **changes)


def backward_with(config):
    """``fn(x, w, dout, rstd) -> (dx, dw)`` running ``config``."""
    import torch

    from quack_edu.stages import final_bwd as fb

    def fn(x, w, dout, rstd):
        dx = torch.empty_like(x)
        dw_p, _ = fb.launch_bwd(x, w, dout, None, rstd, dx, None, False, config=config)
        dw = dw_p.sum(dim=0)
        return dx, dw if w.dtype == torch.float32 else dw.to(w.dtype)

    return fn


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", required=True)
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--weight-dtype", default="bf16,fp32")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--graph", action="store_true", help="time through CUDA graphs")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    changes = parse_sets(a.set)

    import torch

    from quack_edu import bench
    from quack_edu.runtime import torch_dtype

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = torch_dtype(a.dtype)
    copy = bench.copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s; B = A with {changes}")
    rows = []
    for M, N in bench.parse_shapes(a.shapes):
        for wname in a.weight_dtype.split(","):
            wdt = torch_dtype(wname)
            sides = dict(zip("AB", configs(N, dtype, wdt, changes), strict=True))
            got = {k: [] for k in sides}
            for _ in range(a.reps):
                for k, cfg in sides.items():
                    fn = backward_with(cfg)
                    r = bench.bench_one(fn, M, N, dtype, a.graph, wdt, pass_="bwd")
                    got[k].append(r["gbps"])
            med = {k: statistics.median(v) for k, v in got.items()}
            row = {"M": M, "N": N, "weight_dtype": wname, "graph": a.graph, "copy_gbps": copy}
            row["runs"] = got
            row |= {k: {"config": str(sides[k]), "gbps": med[k]} for k in sides}
            rows.append(row)
            print(
                f"{M}x{N} w={wname}: A {med['A']:.0f} ({100 * med['A'] / copy:.1f}%)  "
                f"B {med['B']:.0f} ({100 * med['B'] / copy:.1f}%)  B/A {med['B'] / med['A']:.3f}"
                f"\n    A = {sides['A']}",
                flush=True,
            )
    if a.json:
        Path(a.json).write_text(json.dumps({"changes": changes, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
