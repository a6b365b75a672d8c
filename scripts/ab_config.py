#!/usr/bin/env python3
"""A/B of the library's kernel config on the GPU, forward (``final``) or backward
(``final_bwd``): the heuristic's pick (A) against the same config with some fields changed (one
or more variants), timed in turn in one process, values checked first.

    source .gpu/env.sh; python3 scripts/ab_config.py --pass bwd --variant refill_early=True \\
        --variant cluster_n=8,weight_in_smem=True,refill_early=True \\
        [--shapes 16384x131072,8192x262144] [--weight-dtype bf16,fp32] [--reps 3] [--graph]
        [--residual] [--budget S] [--json F]
    source .gpu/env.sh; python3 scripts/ab_config.py --pass fwd --variant hint_copies=False

A variant sets fields of the config, or on/off attributes of the kernel class (``hint_copies``:
a subclass with its own compile key runs that side).

Each side runs through its kernel class's launcher (``cls.launch``: the library's class or a
variant's subclass) with an explicit config (its own compile key, so nothing cached by the
library's plain path can stand in for it); the backward sums dw's partials as the library does
(``final_bwd.sum_partials``). GB/s use the bench's byte counts (``rmsnorm_bytes``,
``rmsnorm_bwd_bytes``) and the D2D copy of the same run; a side's figure is the median over
``--reps`` rounds, the sides taking turns in each. ``--graph`` times through CUDA graphs
(short rows, where launches would hide the kernel). A variant that does not fit at a shape
is reported as such and skipped there.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = "32768x65536,16384x131072,8192x262144"


def _stage(pass_: str):
    from quack_edu.stages import final, final_bwd

    return final_bwd if pass_ == "bwd" else final


def _switches(pass_: str) -> set[str]:
    """The kernel class's on/off attributes (``hint_copies``): a variant may set them too."""
    kernel = _stage(pass_).KERNEL
    return {n for n in dir(kernel) if not n.startswith("_") and type(getattr(kernel, n)) is bool}


def parse_variant(text: str, pass_: str = "bwd") -> dict:
    """``"refill_early=True,cluster_n=8"`` -> {"refill_early": True, "cluster_n": 8}: each name
    a field of the pass's config (``BwdConfig``, ``FinalConfig``) or an on/off attribute of its
    kernel class (``hint_copies``), each value a Python literal."""
    import ast

    fields = {f.name for f in dataclasses.fields(_stage(pass_).CONFIG)} | _switches(pass_)
    out = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep or name not in fields:
            raise SystemExit(
                f"--variant {text!r}: expected FIELD=VALUE[,...], FIELD one of {sorted(fields)}"
            )
        try:
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise SystemExit(f"--variant {text!r}: {value!r} is not a Python literal") from None
    return out


def sides(
    N: int, dtype, weight_dtype, variants: dict, pass_: str = "bwd", residual: bool = False
) -> dict:
    """{"A": the heuristic's config, name: that config with the variant's changes, or the
    reason it cannot be built} for a plain call (a weight; no bias), or with ``residual`` the
    forward with a residual in x's dtype, the backward with a dresidual_out in x's dtype."""
    mod = _stage(pass_)
    features = None
    if residual and pass_ == "fwd":
        features = mod.Features(residual_dtype=dtype)
    elif residual:
        features = mod.BwdFeatures(dres_out_dtype=dtype)
    base = mod.default_config(N, dtype, weight_dtype, features)
    out = {"A": base}
    fields = {f.name for f in dataclasses.fields(mod.CONFIG)}
    for name, changes in variants.items():
        try:
            cfg = dataclasses.replace(base, **{k: v for k, v in changes.items() if k in fields})
            mod.KERNEL(dtype, N, cfg, weight_dtype, features)  # fits (shared memory, tiling)
            out[name] = cfg
        except ValueError as e:
            out[name] = f"does not fit: {e}"
    return out


def kernel_class(changes: dict, pass_: str = "bwd"):
    """The pass's kernel class with a variant's on/off attributes set (a subclass: its own
    compile key), or None when the variant sets none."""
    switches = {k: v for k, v in changes.items() if k in _switches(pass_)}
    if not switches:
        return None
    kernel = _stage(pass_).KERNEL
    return type(f"{kernel.__name__}_" + "_".join(switches), (kernel,), dict(switches))


def run_with(config, pass_: str = "bwd", residual: bool = False, kernel_cls=None):
    """The plain call running ``config``: ``fn(x, w) -> out`` (forward), ``fn(x, w, r) ->
    (out, residual_out)`` (forward with a residual), ``fn(x, w, dout, rstd) -> (dx, dw)``
    (backward) or ``fn(x, w, dout, rstd, dres_out)`` (backward with a residual), as the bench
    times them; ``kernel_cls`` (``kernel_class``) in place of the stage's kernel."""
    import torch

    from quack_edu.tools.bench import EPS

    mod = _stage(pass_)
    kernel_cls = kernel_cls or mod.KERNEL
    if pass_ == "fwd" and residual:

        def fwd_residual(x, w, r):
            out, res_out = torch.empty_like(x), torch.empty_like(r)
            kernel_cls.launch(x, w, None, r, out, res_out, None, EPS, config=config)
            return out, res_out

        return fwd_residual
    if pass_ == "fwd":
        # the compiled kernel looked up once per kind of input, as the library's plain path
        # does (``rmsnorm._plain``): through ``launch_fwd``'s lookup on every call, a side's
        # host cost per call was near the kernel's time at N = 512 (17 us), and plain timing
        # then measured the host
        found: dict = {}

        def fwd(x, w):
            out = torch.empty_like(x)
            if x.numel() == 0:
                return out
            key = (x.dtype, w.dtype, x.shape[1:], x.stride(), (x.data_ptr() | w.data_ptr()) & 15)
            kernel = found.get(key)
            if kernel is None:
                kernel = found[key] = mod.kernel_for(
                    x, w, None, None, out, None, None, config=config, kernel_cls=kernel_cls
                )
            kernel.call(x, w, None, None, out, None, None, EPS)
            return out

        return fwd

    def bwd(x, w, dout, rstd, dres_out=None):
        dx = torch.empty_like(x)
        dw_p, _ = kernel_cls.launch(x, w, dout, dres_out, rstd, dx, None, False, config=config)
        return dx, mod.sum_partials(dw_p, w.dtype)

    return bwd


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variant", action="append", required=True, metavar="FIELD=VALUE[,FIELD=VALUE]")
    p.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"), default="bwd")
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--weight-dtype", default="bf16,fp32")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--graph", action="store_true", help="time through CUDA graphs")
    p.add_argument(
        "--residual",
        action="store_true",
        help="with a residual in x's dtype: the forward's residual, the backward's "
        "dresidual_out (its bytes counted)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=0.5,
        help="seconds of timed calls a side a round (the records use 0.15: at long rows the "
        "H200 reaches its 700 W cap within half a second and its clocks then dip)",
    )
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    variants = {text: parse_variant(text, a.pass_) for text in a.variant}
    classes = {text: kernel_class(changes, a.pass_) for text, changes in variants.items()}

    import torch

    from quack_edu.runtime import torch_dtype
    from quack_edu.tools import bench
    from quack_edu.tools.runinfo import version

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = torch_dtype(a.dtype)
    copy = bench.copy_bandwidth()
    name = torch.cuda.get_device_name()
    print(
        f"{name}: copy {copy:.0f} GB/s; pass {a.pass_}, graph={a.graph}, residual={a.residual}",
        flush=True,
    )
    rows = []
    for M, N in bench.parse_shapes(a.shapes):
        for wname in a.weight_dtype.split(","):
            wdt = torch_dtype(wname)
            cfgs = sides(N, dtype, wdt, variants, a.pass_, a.residual)
            runnable = {k: c for k, c in cfgs.items() if not isinstance(c, str)}
            got = {k: [] for k in runnable}
            for _ in range(a.reps):
                for k, cfg in runnable.items():
                    fn = run_with(cfg, a.pass_, a.residual, classes.get(k))
                    r = bench.bench_one(
                        fn, M, N, dtype, a.graph, wdt, residual=a.residual, pass_=a.pass_,
                        budget_s=a.budget,
                    )  # fmt: skip
                    got[k].append(r["gbps"])
            med = {k: statistics.median(v) for k, v in got.items()}
            row = {"pass": a.pass_, "M": M, "N": N, "weight_dtype": wname, "graph": a.graph}
            row["residual"] = a.residual
            row["copy_gbps"] = copy
            row["sides"] = {
                k: {"config": str(c), "gbps": med.get(k), "runs": got.get(k)}
                | ({"kernel": classes[k].__name__} if classes.get(k) else {})
                for k, c in cfgs.items()
            }
            rows.append(row)
            print(f"{M}x{N} w={wname}: A = {cfgs['A']}", flush=True)
            for k, c in cfgs.items():
                if k in med:
                    ratio = med[k] / med["A"]
                    print(f"   {med[k]:6.0f} GB/s {100 * med[k] / copy:5.1f}%  x{ratio:.3f}  {k}")
                else:
                    print(f"   {c}  ({k})")
    if a.json:
        record = {
            "gpu": name,
            "date": datetime.date.today().isoformat(),
            "torch": torch.__version__,
            "dsl": version("nvidia-cutlass-dsl"),
            "command": "python3 scripts/ab_config.py "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "variants": variants,
            "rows": rows,
        }
        Path(a.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
