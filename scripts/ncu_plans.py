#!/usr/bin/env python3
"""One launch of each of several forward plans, for Nsight Compute to profile side by side.

    source .gpu/env.sh; ncu --clock-control none --kernel-name regex:FinalRMSNorm \\
        --launch-skip 2 --launch-count 2 --metrics ... --csv \\
        python3 scripts/ncu_plans.py --shape 32768x65536 \\
        --plan bf16:cluster_n=4,buffers=1,blocks_per_cta=1 \\
        --plan fp32:cluster_n=8,buffers=2,blocks_per_cta=4

A plan is ``WEIGHT_DTYPE:FIELD=VALUE[,FIELD=VALUE]``: the final stage's config for that weight
dtype (``final.final_config``, bf16 x) with the fields changed (``FIELD`` as in
``scripts/ab_config.py``; none: the heuristic's). Every plan is launched once to compile and
warm up, then once more in the same order: ``--launch-skip`` is the number of plans. The
values are not checked here (``scripts/ab_config.py`` checks them before it times).
``benchmarks/results/fwd_ncu_65536.json`` came from five plans at 32768 x 65536.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_plan(text: str) -> tuple[str, dict]:
    """``"fp32:cluster_n=8,buffers=2"`` -> ("fp32", {"cluster_n": 8, "buffers": 2}); each
    FIELD one of ``FinalConfig``'s, each VALUE a Python literal."""
    import ast

    from quack_edu.config import FinalConfig

    names = {f.name for f in dataclasses.fields(FinalConfig)}
    wdt, _, fields = text.partition(":")
    out = {}
    for item in filter(None, fields.split(",")):
        name, sep, value = item.strip().partition("=")
        try:
            if wdt not in ("bf16", "fp16", "fp32") or not sep or name not in names:
                raise ValueError
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise SystemExit(
                f"--plan {text!r}: expected WEIGHT_DTYPE:FIELD=VALUE[,...], WEIGHT_DTYPE bf16, "
                f"fp16 or fp32, FIELD one of {sorted(names)}"
            ) from None
    return wdt, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="32768x65536", help="MxN, bf16 x")
    p.add_argument("--plan", action="append", required=True, metavar="WDT:FIELD=VALUE[,...]")
    a = p.parse_args(argv)
    plans = [parse_plan(t) for t in a.plan]

    import torch

    from quack_edu.runtime import torch_dtype
    from quack_edu.stages import final

    M, N = (int(v) for v in a.shape.lower().split("x"))
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    launches = []
    for wname, fields in plans:
        wdt = torch_dtype(wname)
        base = final.final_config(N, torch.bfloat16, wdt)
        config = dataclasses.replace(base, **fields)
        w = torch.randn(N, device="cuda", dtype=wdt)
        print(f"{wname}: {config}", flush=True)
        launches.append((w, config))
    for _ in range(2):  # compile and warm, then the launches to profile
        for w, config in launches:
            final.rmsnorm_fwd(x, w, config=config)
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
