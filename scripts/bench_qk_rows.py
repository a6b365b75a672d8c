#!/usr/bin/env python3
"""QK-norm rows read in place, and the host's cost of a training call (issue 47).

    source .gpu/env.sh; python3 scripts/bench_qk_rows.py [--json qk_rows.json] [--host-only]

1. **GPU time.** q of a fused projection, ``qkv.view(B, S, 3, H, D).unbind(2)[0]`` (rows in
   two modes), its transposed head view, and the same rows made contiguous beforehand: the
   library's forward (``rmsnorm_fwd`` with rstd saved, what autograd's forward runs) and
   forward + backward through autograd, against ``F.rms_norm`` (``nn.RMSNorm``'s) on the same
   view and the old way (``x.contiguous()`` then the kernel). Median of CUDA-event timings,
   eight projections taken in turn (200 MB at the model's shape: past the L2).
2. **Host cost.** Wall-clock microseconds per eager training call (forward and backward of one
   norm under bf16 autocast, an fp32 weight, 2,000 calls back to back on a tiny x, so the GPU
   waits on the host): ``QuackRMSNorm`` against ``nn.RMSNorm``, on contiguous rows and on the
   unbind view, each with ``y.sum().backward()`` (a gradient expanded from a scalar: the
   library copies it dense first) and with ``y.backward(g)`` (a dense g made once: what a
   model hands a norm), reported apart. The steps are ``scripts/host_profile.py``'s
   (``make_step``). Rounds alternate; the median round is reported. ``--host-only``: this part
   alone.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quack_edu import rmsnorm as qrms  # noqa: E402
from quack_edu.rmsnorm import rmsnorm_fwd  # noqa: E402
from quack_edu.tools.host_cost import training_call_rows  # noqa: E402
from quack_edu.tools.timing import time_graph  # noqa: E402


def views(qkv, H, D):
    B, S = qkv.shape[:2]
    q = qkv.view(B, S, 3, H, D).unbind(2)[0]
    return {"unbind view": q, "transposed heads": q.transpose(1, 2)}


def time_us(fn, sets, reps=30):
    for s in sets[:2]:
        fn(*s)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        s = sets[i % len(sets)]
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(*s)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def gpu_rows(B, S, H, D, dtype):
    w = torch.randn(D, device="cuda", dtype=torch.float32, requires_grad=True)
    qkvs = [torch.randn(B, S, 3 * H * D, device="cuda", dtype=dtype) for _ in range(8)]
    rows = []
    for name in ("unbind view", "transposed heads"):
        xs = [views(t, H, D)[name] for t in qkvs]
        flat = [x.contiguous() for x in xs]
        dy = torch.randn_like(flat[0])

        def fwd(x):
            rmsnorm_fwd(x, w.detach(), store_rstd=True)

        def copy_fwd(x):
            rmsnorm_fwd(x.contiguous(), w.detach(), store_rstd=True)

        def train(x, norm=qrms, dy=dy):
            x = x.detach().requires_grad_()
            norm(x, w).backward(dy)

        def torch_train(x, dy=dy):
            x = x.detach().requires_grad_()
            torch.nn.functional.rms_norm(x, (D,), w, 1e-6).backward(dy)

        nbytes = xs[0].numel() * xs[0].element_size() * 2 + B * S * H * 4  # x, out, rstd
        row = {"rows": name, "shape": [B, S, H, D], "dtype": str(dtype).removeprefix("torch.")}
        row["fwd_us"] = {
            "in place": time_us(fwd, [(x,) for x in xs]),
            "contiguous rows": time_us(fwd, [(x,) for x in flat]),
            "copy then kernel": time_us(copy_fwd, [(x,) for x in xs]),
        }
        # the kernels alone, host out of the way: one CUDA graph over the rotated inputs (the
        # events around single calls above include each call's host path)
        row["fwd_graph_us"] = {
            "in place": time_graph(fwd, [(x,) for x in xs]),
            "contiguous rows": time_graph(fwd, [(x,) for x in flat]),
            "copy then kernel": time_graph(copy_fwd, [(x,) for x in xs]),
        }
        row["fwd_bwd_us"] = {
            "in place": time_us(train, [(x,) for x in xs]),
            "contiguous rows": time_us(train, [(x,) for x in flat]),
            "F.rms_norm on the view": time_us(torch_train, [(x,) for x in xs]),
        }
        row["fwd_gbps_in_place"] = nbytes / row["fwd_us"]["in place"] / 1e3
        row["in_place_vs_contiguous"] = {
            k: row[k]["contiguous rows"] / row[k]["in place"]
            for k in ("fwd_us", "fwd_graph_us", "fwd_bwd_us")
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def host_rows(rounds=5, calls=2000):
    """us per eager training call (``host_cost.training_call_rows``), QuackRMSNorm against
    nn.RMSNorm, on contiguous rows, the unbind view and the pre-norm call ``norm(x, r)``
    (against ``x + r`` then nn.RMSNorm), with the gradient of ``y.sum()`` (expanded from a
    scalar; ones for both outputs of the pre-norm call) and with a dense upstream gradient."""
    how = {"sum": "y.sum().backward()", "dense": "y.backward(g)"}
    out = {}
    for row in training_call_rows(rounds, calls, douts=("sum", "dense")):
        keep = {k: row[k] for k in ("QuackRMSNorm", "nn.RMSNorm", "ratio")}
        out.setdefault(row["case"], {})[how[row["dout"]]] = keep
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--host-only", action="store_true", help="the host cost rows alone")
    a = ap.parse_args(argv)
    record = {
        "what": "QK-norm rows read in place; host cost per eager training call (issue 47)",
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "gpu_time": None if a.host_only else gpu_rows(8, 512, 8, 128, torch.bfloat16),
        "host_us_per_training_call": host_rows(),
    }
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
