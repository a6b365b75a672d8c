#!/usr/bin/env python3
"""Where a training call's host time goes: cProfile of an eager training step of one norm
(QuackRMSNorm or nn.RMSNorm, bf16 autocast, an fp32 weight, a tiny x so the GPU waits on the
host), on contiguous rows and on a fused projection's unbind view (issue 47).

    source .gpu/env.sh; python3 scripts/host_profile.py [--calls 3000] [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
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
    norms = {"QuackRMSNorm": QuackRMSNorm(D).cuda(), "nn.RMSNorm": torch.nn.RMSNorm(D, 1e-6).cuda()}
    qkv = torch.randn(1, 4, 3 * H * D, device="cuda", requires_grad=True)
    xc = torch.randn(1, 4, H, D, device="cuda", requires_grad=True)

    def step(norm, view):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            x = qkv.view(1, 4, 3, H, D).unbind(2)[0] if view else xc
            y = norm(x)
        y.sum().backward()

    for view in (False, True):
        for name, norm in norms.items():
            for _ in range(100):
                step(norm, view)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(a.calls):
                step(norm, view)
            torch.cuda.synchronize()
            us = (time.perf_counter() - t) / a.calls * 1e6
            print(f"{name:14s} {'unbind view' if view else 'contiguous':12s} {us:7.1f} us a call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.calls):
        step(norms["QuackRMSNorm"], False)
    torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(a.top)
    print(s.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
