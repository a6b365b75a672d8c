#!/usr/bin/env python3
"""Where a training call's host time goes: cProfile of an eager training step of one norm
(``QuackRMSNorm`` or ``nn.RMSNorm``; bf16 autocast, an fp32 weight, a tiny x so the GPU waits
on the host), then the kernels one step launches (torch.profiler) (issue 47).
The time a call takes against nn.RMSNorm's is scripts/bench_qk_rows.py's (host_rows).

    source .gpu/env.sh; python3 scripts/host_profile.py [--norm quack_edu|torch]
        [--dout sum|dense] [--strided] [--x-dtype float32|bfloat16] [--calls 3000] [--top 30]

``--dout sum``: ``y.sum().backward()``, whose gradient reaches the norm expanded from a scalar
(stride 0: the library makes it dense first, one copy kernel); ``--dout dense``:
``y.backward(g)`` with a dense g made once, the gradient a model hands a norm.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quack_edu.rmsnorm import QuackRMSNorm  # noqa: E402
from quack_edu.tools.host_cost import add_then, make_step  # noqa: E402,F401  (the scripts' steps)


def kernels_per_step(step, steps=20) -> list[tuple[str, float]]:
    """(kernel name, launches a step) of ``steps`` steps under torch.profiler (CUDA
    activity: every launch, TVM-FFI's included)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    n = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            n[e.name] += 1
    return [(name[:90], c / steps) for name, c in n.most_common()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--norm", default="quack_edu", choices=("quack_edu", "torch"))
    ap.add_argument("--dout", default="sum", choices=("sum", "dense"))
    ap.add_argument("--strided", action="store_true", help="x: the unbind view of a fused qkv")
    ap.add_argument("--residual", action="store_true", help="the pre-norm call norm(x, r)")
    ap.add_argument("--x-dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args(argv)
    D = 128
    norm = QuackRMSNorm(D) if a.norm == "quack_edu" else torch.nn.RMSNorm(D, eps=1e-6)
    norm = norm.cuda()
    call = add_then(norm) if a.residual and a.norm == "torch" else norm
    step = make_step(call, a.dout, a.strided, dtype=getattr(torch, a.x_dtype), residual=a.residual)
    for _ in range(100):  # warm: plans made, kernels loaded
        step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.calls):
        step()
    torch.cuda.synchronize()
    prof.disable()
    print(f"== {type(norm).__name__}, x {a.x_dtype}, dout {a.dout}"
          f"{', unbind view' if a.strided else ''}{', norm(x, r)' if a.residual else ''}, "
          f"{a.calls} steps, {torch.cuda.get_device_name()}")  # fmt: skip
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(a.top)
    print(s.getvalue())
    try:
        launches = kernels_per_step(step)
    except Exception as e:  # noqa: BLE001  (the profile above is the point)
        print(f"kernels per step: torch.profiler failed: {e}")
    else:
        print(f"kernels per step: {sum(c for _, c in launches):g}")
        for name, c in launches:
            print(f"  {c:4g}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
