#!/usr/bin/env python3
"""Where a training call's host time goes: cProfile of an eager training step of one
QuackRMSNorm (bf16 autocast, an fp32 weight, a tiny x so the GPU waits on the host) (issue 47).
The time a call takes against nn.RMSNorm's is scripts/bench_qk_rows.py's (host_rows).

    source .gpu/env.sh; python3 scripts/host_profile.py [--calls 3000] [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quack_edu.rmsnorm import QuackRMSNorm  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args(argv)
    D, H = 128, 8
    norm = QuackRMSNorm(D).cuda()
    x = torch.randn(1, 4, H, D, device="cuda", requires_grad=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = norm(x)
        y.sum().backward()

    for _ in range(100):  # warm: plans made, kernels loaded
        step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.calls):
        step()
    torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(a.top)
    print(s.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
