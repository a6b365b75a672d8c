#!/usr/bin/env python3
"""The host path of an eager training call, measured on a CPU without a GPU (issue 47).

    PYTHONPATH=. python scripts/host_cost_cpu.py [--calls 5000] [--rounds 5] [--top 25]
        [--x-dtype float32|bfloat16] [--strided] [--residual] [--dout sum|dense|both]
        [--no-profile]

One eager training call of ``QuackRMSNorm`` as ``scripts/bench_qk_rows.py`` (host_rows) times it
on the GPU, the step of ``scripts/host_profile.py`` (``make_step``): a tiny x (1, 4, 8, 128)
that requires grad, bf16 autocast, an fp32 weight, forward then ``y.sum().backward()``
(``--dout sum``) or ``y.backward(g)`` with a dense g made once (``--dout dense``). Here the
tensors are on the CPU and the compiled kernels are never launched: ``stubbed()`` replaces what
only a GPU can do (compiling is skipped, each kernel's TVM-FFI callable is a Python no-op that
counts its calls, the device check and the SM count answer as an H100's would), so the
library's own per-call Python (keys, plans, checks, allocation, autograd bookkeeping) runs as
it does on the GPU. The stubs live here, not in the library, and are undone on exit.

Reported: microseconds per training call (median of ``--rounds`` rounds of ``--calls`` calls),
Python function calls and C calls per training call (``sys.setprofile``), torch ops per call
(the aten ops the step calls itself, forward and backward, torch.profiler), kernel launches per
call, and a cProfile top list. The same step with ``torch.nn.RMSNorm`` on the CPU is timed for
scale only: **CPU torch's cost is not its CUDA cost.** On the CPU, ``F.rms_norm`` computes the
norm (a few microseconds of arithmetic on 4 K elements) and allocates from the CPU allocator;
on the GPU it launches kernels instead. What this script measures well is the library's Python
over a call; a launch's own cost (the TVM-FFI call, ~2-4 us a kernel on an H100's host) is
excluded and must be measured on the GPU: ``scripts/bench_qk_rows.py`` (host_rows) and
``scripts/host_profile.py``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("QUACK_EDU_KERNEL_CACHE", "0")  # nothing is compiled: nothing to cache
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

#: kernel launches the counting stub saw
LAUNCHES = [0]


def _counting_launch(*args):
    LAUNCHES[0] += 1


def ffi_nop():
    """A TVM-FFI function that does nothing (``testing.nop``): called with the kernel's
    arguments it converts them as a compiled kernel's call does (tensors through DLPack),
    then returns; the compiled kernel's own checks and ``cuLaunchKernel`` are what is missing.
    A Python no-op where TVM-FFI has no such function."""
    try:
        import tvm_ffi

        return tvm_ffi.get_global_func("testing.nop")
    except Exception:  # noqa: BLE001
        return lambda *args: None


@contextlib.contextmanager
def stubbed(launch=None):
    """The library on CPU tensors: nothing compiled, ``launch`` (default ``ffi_nop()``) in
    place of every compiled kernel's call, an H100's answers to device queries (132 SMs).
    Every plan made inside holds the stub; the library's caches are emptied on exit."""
    from quack_edu import runtime
    from quack_edu.host import backward, forward
    from quack_edu.stages import final, final_bwd

    launch = ffi_nop() if launch is None else launch

    def compile_kernel(kernel, options=""):
        return kernel.wrap_compiled(launch)  # runtime.direct_call hands a plain callable back

    saved = [
        (runtime, "compile_kernel", compile_kernel),
        (runtime, "check_device", lambda x, *others, without_gpu: None),
        (final_bwd, "sm_count", lambda index: 132),
        (final_bwd, "resident_clusters", lambda index, n, threads, ctas: 132 * ctas // n),
    ]
    saved = [(mod, name, getattr(mod, name), new) for mod, name, new in saved]
    caches = [forward._FWD_PLANS, backward._BWD_PLANS, final._BY_CALL, final._COMPILED,
              final_bwd._COMPILED, final_bwd._SUMS]  # fmt: skip
    for c in caches:
        c.clear()
    for mod, name, _, new in saved:
        setattr(mod, name, new)
    try:
        yield
    finally:
        for mod, name, old, _ in saved:
            setattr(mod, name, old)
        for c in caches:
            c.clear()


def time_us(step, calls, rounds):
    per = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            step()
        per.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(per), per


def count_calls(step, calls=200):
    """(Python calls, C calls) per step: ``sys.setprofile`` events."""
    n = {"call": 0, "c_call": 0}

    def prof(frame, event, arg):
        if event in n:
            n[event] += 1

    sys.setprofile(prof)
    try:
        for _ in range(calls):
            step()
    finally:
        sys.setprofile(None)
    return n["call"] / calls, n["c_call"] / calls


def profile_top(step, calls, top):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        step()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def torch_ops(step, calls=20) -> list[tuple[str, float]]:
    """(aten op, calls a step) of the ops ``step`` calls itself (an op's own inner ops not
    counted), forward and autograd's backward, under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            step()
    n = collections.Counter()
    for e in prof.events():
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if e.name.startswith("aten::") and parent is None:
            n[e.name] += 1
    return [(name, c / calls) for name, c in n.most_common()]


def report(a, dout):
    """Time, count and profile the floor, QuackRMSNorm and nn.RMSNorm steps with ``dout``'s
    gradient (host_profile.make_step's steps, on the CPU)."""
    from host_profile import add_then, make_step

    from quack_edu.rmsnorm import QuackRMSNorm

    D, xd, res = 128, getattr(torch, a.x_dtype), a.residual

    def floor(x):
        return x.view_as(x)

    def steps_of(ours):
        theirs = torch.nn.RMSNorm(D, eps=1e-6)
        return {
            ("floor: no norm (x + r, y = view)" if res else "floor: no norm (y = x.view_as(x))"):
            make_step(add_then(floor) if res else floor, dout, a.strided, "cpu", "cpu", xd, res),
            "QuackRMSNorm (launches stubbed)": make_step(
                ours, dout, a.strided, "cpu", "cpu", xd, res
            ),
            "nn.RMSNorm (CPU torch: scale only)": make_step(
                add_then(theirs) if res else theirs, dout, a.strided, "cpu", "cpu", xd, res
            ),
        }  # fmt: skip

    ours_name = "QuackRMSNorm (launches stubbed)"
    with stubbed(_counting_launch):  # kernel launches per call, counted
        step = steps_of(QuackRMSNorm(D))[ours_name]
        for _ in range(3):
            step()
        LAUNCHES[0] = 0
        step()
        launches = LAUNCHES[0]
    with stubbed():
        steps = steps_of(QuackRMSNorm(D))
        floor_name = next(iter(steps))
        for _ in range(200):  # plans made, caches warm
            for step in steps.values():
                step()
        rows = {}
        for _ in range(2):  # alternate, twice: the second pass is reported
            for name, step in steps.items():
                rows[name] = time_us(step, a.calls, a.rounds)
        calls = {name: count_calls(step) for name, step in steps.items()}
        ops = {name: torch_ops(step) for name, step in steps.items()}
        how = "y.sum().backward()" if dout == "sum" else "y.backward(g), g dense"
        if res:
            how = "both outputs given gradients, " + ("ones" if dout == "sum" else "dense")
        print(f"eager training call: x (1, 4, 8, 128) {a.x_dtype}"
              f"{' (unbind view)' if a.strided else ''}"
              f"{', norm(x, r) with an fp32 r' if res else ''}, fp32 weight, bf16 autocast, {how}, "
              f"torch {torch.__version__}, 1 thread")  # fmt: skip
        floor = rows[floor_name][0]
        for name, (med, per) in rows.items():
            py, c = calls[name]
            spread = f"{min(per):.1f}-{max(per):.1f}"
            over = f"{med - floor:+6.1f}" if name != floor_name else "      "
            n_ops = sum(k for _, k in ops[name])
            print(f"  {name:38s} {med:6.1f} us/call {over} over the floor ({spread})"
                  f"  Python calls {py:5.1f}  C calls {c:5.1f}"
                  f"  torch ops {n_ops:4.1f}")  # fmt: skip
        print(f"  kernel launches per QuackRMSNorm call (a TVM-FFI no-op each here): {launches}")
        for name in (floor_name, ours_name):
            print(
                f"  torch ops a step, {name.split(' (')[0]}: "
                + ", ".join(f"{op.removeprefix('aten::')} {k:g}" for op, k in ops[name])
            )
        if not a.no_profile:
            print(profile_top(steps[ours_name], a.calls, a.top))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--x-dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--strided", action="store_true", help="x: the unbind view of a fused qkv")
    ap.add_argument("--residual", action="store_true", help="the pre-norm call norm(x, r)")
    ap.add_argument("--dout", default="both", choices=("sum", "dense", "both"))
    ap.add_argument("--no-profile", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    for dout in ("sum", "dense") if a.dout == "both" else (a.dout,):
        report(a, dout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
