#!/usr/bin/env python3
"""The backward's persistent grid on the GPU: for the clustered shapes, GB/s with the grid the
CUDA driver says fits in one wave (``R``: ``FinalBwdRMSNorm.resident``) against the estimate
used without it (side A: three times SMs / cluster_n), and 2R, R - 1 and 4R, the heuristic's config
each time, values checked first (``bench.bench_one``), median of 3 rounds taking turns.

    source .gpu/env.sh; python3 scripts/bwd_grid.py [--json F]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = ((32768, 32768), (32768, 65536), (16384, 131072), (8192, 262144))


def fixed_grid(base, P: int):
    """``base`` (a backward kernel class) whose grid, and so dw's partial rows, is always P."""

    class Fixed(base):
        def grid_x(self, M, sm_count=None, resident=None):
            return P

    Fixed.__name__ = f"{base.__name__}Grid{P}"
    return Fixed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    import json

    import torch

    from quack_edu.stages import final_bwd as fb
    from quack_edu.tools import bench

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    copy = bench.copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s", flush=True)
    dtype, rows = torch.bfloat16, []
    for M, N in SHAPES:
        for wdt in (torch.bfloat16, torch.float32):
            k = fb.FinalBwdRMSNorm(dtype, N, None, wdt)
            cfg, cn = k.config, k.tiling.cluster_n
            if cn == 1:
                continue
            R = k.resident(0)
            grids = {"A": k.grid_x(M), "R": R, "2R": 2 * R, "R-1": R - 1, "4R": 4 * R}
            got = {name: [] for name in grids}
            # one kernel class a grid: the library's kernel with grid_x fixed at P
            classes = {name: fixed_grid(fb.FinalBwdRMSNorm, P) for name, P in grids.items()}
            for _ in range(3):
                for name in grids:

                    def fn(x, w, dout, rstd, cls=classes[name], cfg=cfg):
                        dx = torch.empty_like(x)
                        dw_p, _ = cls.launch(x, w, dout, None, rstd, dx, None, False, config=cfg)
                        return dx, fb.sum_partials(dw_p, w.dtype)

                    r = bench.bench_one(fn, M, N, dtype, False, wdt, pass_="bwd", budget_s=0.3)
                    got[name].append(r["gbps"])
            print(f"{M}x{N} w={bench.dtype_name(wdt)} clusters of {cn}: R = {R}; {cfg}")
            sides = {}
            for name, P in grids.items():
                g = statistics.median(got[name])
                est = statistics.median(got["A"])
                print(
                    f"   grid {name:8s} = {P:4d}: {g:6.0f} GB/s {100 * g / copy:5.1f}%"
                    f"  x{g / est:.3f}"
                )
                sides["A" if name == "A" else f"grid={name} ({P})"] = {
                    "config": str(cfg),
                    "gbps": g,
                    "runs": got[name],
                }
            rows.append(
                {"pass": "bwd", "M": M, "N": N, "weight_dtype": bench.dtype_name(wdt),
                 "graph": False, "residual": False, "copy_gbps": copy, "sides": sides}
            )  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
