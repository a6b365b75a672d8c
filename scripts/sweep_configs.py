#!/usr/bin/env python3
"""Every config the autotuner may try, timed on this GPU: which one wins, and by how much over
the heuristic's pick (issue 47: the H100's table). Forward (``final``) or backward
(``final_bwd``), plain call, a weight, no bias.

    source .gpu/env.sh; python3 scripts/sweep_configs.py --pass fwd --shapes 32768x256,32768x1024 \\
        [--weight-dtype bf16,fp32] [--graph] [--top 4] [--reps 3] [--jobs 14] [--json F]

1. Compile: ``--jobs`` processes compile the candidates (``final.configs`` /
   ``final_bwd.configs``: the heuristic's pick first) into a kernel cache of this run, so the
   timing process loads each in a moment.
2. Screen: every candidate timed once (``bench.bench_one``: values checked against the fp32
   reference first, inputs rotated past the L2).
3. Settle: the heuristic's pick and the ``--top`` fastest others timed ``--reps`` rounds, taking
   turns; a config's figure is its median.

Uses ``ab_config``'s launchers (``run_with``), the bench's byte counts and the D2D copy of the
same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def candidates(pass_: str, N: int, dtype, weight_dtype) -> list:
    from ab_config import _stage

    return _stage(pass_).configs(N, dtype, weight_dtype)


def _compile_one(job) -> str | None:
    """In a worker: run config ``i`` once at a few rows (compiles it into the shared cache)."""
    pass_, N, dtype_name, wname, i = job
    import torch
    from ab_config import run_with

    from quack_edu.runtime import torch_dtype
    from quack_edu.tools.timing import call_args

    dtype, wdt = torch_dtype(dtype_name), torch_dtype(wname)
    cfg = candidates(pass_, N, dtype, wdt)[i]
    try:
        run_with(cfg, pass_)(*call_args(8, N, dtype, wdt, pass_, False))
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - reported, the sweep goes on
        return f"{type(e).__name__}: {e}"
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"), default="fwd")
    p.add_argument("--shapes", default="32768x256,32768x1024")
    p.add_argument("--weight-dtype", default="bf16,fp32")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--graph", action="store_true", help="time through CUDA graphs")
    p.add_argument("--top", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--jobs", type=int, default=min(14, os.cpu_count() or 1))
    p.add_argument("--budget", type=float, default=0.3, help="seconds a timing may take")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    os.environ.setdefault("QUACK_EDU_KERNEL_CACHE", tempfile.mkdtemp(prefix="sweep-kernels-"))

    import torch
    from ab_config import run_with

    from quack_edu.runtime import torch_dtype
    from quack_edu.tools import bench
    from quack_edu.tools.runinfo import version
    from quack_edu.tools.timing import bench_one

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = torch_dtype(a.dtype)
    copy = bench.copy_bandwidth()
    name = torch.cuda.get_device_name()
    print(f"{name}: copy {copy:.0f} GB/s; pass {a.pass_}, graph={a.graph}", flush=True)
    shapes = bench.parse_shapes(a.shapes)
    wnames = a.weight_dtype.split(",")
    jobs = [
        (a.pass_, N, a.dtype, w, i)
        for _, N in shapes
        for w in wnames
        for i in range(len(candidates(a.pass_, N, dtype, torch_dtype(w))))
    ]
    ctx = multiprocessing.get_context("spawn")  # CUDA in each worker
    with ProcessPoolExecutor(a.jobs, mp_context=ctx) as pool:
        failed = dict(zip(jobs, pool.map(_compile_one, jobs), strict=True))
    print(f"compiled {len(jobs)} configs, {sum(v is not None for v in failed.values())} failed",
          flush=True)  # fmt: skip

    def gbps(cfg, M, N, wdt) -> float:
        fn = run_with(cfg, a.pass_)
        r = bench_one(fn, M, N, dtype, a.graph, wdt, pass_=a.pass_, budget_s=a.budget)
        return r["gbps"]

    rows = []
    for M, N in shapes:
        for w in wnames:
            wdt = torch_dtype(w)
            cfgs = candidates(a.pass_, N, dtype, wdt)
            ok = [i for i in range(len(cfgs)) if failed[(a.pass_, N, a.dtype, w, i)] is None]
            screen = {}
            for i in ok:
                try:
                    screen[i] = gbps(cfgs[i], M, N, wdt)
                except Exception as e:  # noqa: BLE001 - a wrong or failing config never wins
                    print(f"   config {i} failed: {type(e).__name__}: {e}", flush=True)
            others = sorted((i for i in screen if i != 0), key=screen.get, reverse=True)
            settle = [0, *others[: a.top]] if 0 in screen else others[: a.top + 1]
            runs = {i: [] for i in settle}
            for _ in range(a.reps):
                for i in settle:
                    runs[i].append(gbps(cfgs[i], M, N, wdt))
            med = {i: statistics.median(v) for i, v in runs.items()}
            best = max(med, key=med.get)
            row = {"pass": a.pass_, "M": M, "N": N, "dtype": a.dtype, "weight_dtype": w,
                   "graph": a.graph, "copy_gbps": copy, "candidates": len(cfgs),
                   "screen": {str(cfgs[i]): g for i, g in screen.items()},
                   "settled": [{"config": str(cfgs[i]), "heuristic": i == 0, "gbps": med[i],
                                "runs": runs[i]} for i in settle],
                   "best": str(cfgs[best]),
                   "best_over_heuristic": med[best] / med.get(0, med[best])}  # fmt: skip
            rows.append(row)
            print(f"{M}x{N} w={w}: {len(cfgs)} candidates; heuristic {cfgs[0]}", flush=True)
            for i in sorted(med, key=med.get, reverse=True):
                tag = "  <- heuristic" if i == 0 else ""
                print(f"   {med[i]:6.0f} GB/s {100 * med[i] / copy:5.1f}%  {cfgs[i]}{tag}")
    if a.json:
        record = {
            "gpu": name,
            "date": datetime.date.today().isoformat(),
            "torch": torch.__version__,
            "dsl": version("nvidia-cutlass-dsl"),
            "command": "python3 scripts/sweep_configs.py "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "rows": rows,
        }
        Path(a.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
