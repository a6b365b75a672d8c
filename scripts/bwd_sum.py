#!/usr/bin/env python3
"""The backward's second reduction on the GPU: microseconds per call, through CUDA graphs, of
the kernel alone (``launch_bwd``), the kernel then ``torch.sum`` over the partial rows (and the
cast to a bf16 weight's dtype), the kernel then ``final_bwd.sum_partials``, and the sum alone
both ways, at M = 32768 and short rows, bf16 x, both weight dtypes; values checked first.

    source .gpu/env.sh; python3 scripts/bwd_sum.py [--json F]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NS = (256, 512, 1024, 2048, 4096)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    import torch

    from quack_edu.stages import final_bwd as fb
    from quack_edu.tools import bench
    from quack_edu.tools.runinfo import version

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    M, dtype, rows = 32768, torch.bfloat16, []
    for N in NS:
        for wdt in (torch.bfloat16, torch.float32):
            nbytes = bench.rmsnorm_bwd_bytes(M, N, dtype, wdt)
            sets = []
            for _ in range(bench.rotation_count(nbytes)):
                x = torch.randn(M, N, device="cuda", dtype=dtype)
                w = torch.randn(N, device="cuda", dtype=wdt)
                dout = torch.randn_like(x)
                rstd = torch.rsqrt(x.float().square().mean(-1) + bench.EPS)
                sets.append((x, w, dout, rstd, torch.empty_like(x)))

            def kernel(x, w, dout, rstd, dx):
                return fb.launch_bwd(x, w, dout, None, rstd, dx, None, False)[0]

            def torch_sum(x, w, dout, rstd, dx):
                dw = kernel(x, w, dout, rstd, dx).sum(dim=0)
                return dw if w.dtype == torch.float32 else dw.to(w.dtype)

            def partial_sum(x, w, dout, rstd, dx):
                return fb.sum_partials(kernel(x, w, dout, rstd, dx), w.dtype)

            part = kernel(*sets[0])
            a_, b_ = torch_sum(*sets[0]), partial_sum(*sets[0])
            torch.testing.assert_close(b_.float(), a_.float(), rtol=1e-2, atol=1e-2)
            row = {"M": M, "N": N, "weight_dtype": bench.dtype_name(wdt), "P": part.shape[0]}
            row["us"] = {
                "kernel": bench.time_graph(kernel, sets),
                "kernel + torch.sum": bench.time_graph(torch_sum, sets),
                "kernel + sum_partials": bench.time_graph(partial_sum, sets),
                "torch.sum alone": bench.time_graph(lambda *_, part=part: part.sum(dim=0), sets),
                "sum_partials alone": bench.time_graph(
                    lambda *_, part=part: fb.sum_partials(part, torch.float32), sets
                ),
            }
            row["bytes"] = nbytes
            rows.append(row)
            us = row["us"]
            print(
                f"{M}x{N} w={row['weight_dtype']} P={row['P']}: "
                + ", ".join(f"{k} {v:.2f} us" for k, v in us.items()),
                flush=True,
            )
    if a.json:
        record = {
            "gpu": torch.cuda.get_device_name(),
            "date": datetime.date.today().isoformat(),
            "torch": torch.__version__,
            "dsl": version("nvidia-cutlass-dsl"),
            "command": "python3 scripts/bwd_sum.py "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "what": "microseconds per call through CUDA graphs (bench.time_graph), bf16 x",
            "rows": rows,
        }
        Path(a.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
