"""How the benchmark times a call: GB/s from an explicit byte count, CUDA-event medians.

The method (the same for every kernel in a run):

* bytes = read x + write y + read weight = (2*M*N) * sizeof(x) + N * sizeof(w); with a residual
  (the pre-norm add) also read residual + write residual_out: (4*M*N) * sizeof(x). The backward
  counts QuACK's bytes (``rmsnorm_bwd_bytes``).
* Inputs rotate over enough independent buffers that one round moves > 3x the L2 cache (60 MB on
  an H200), so a timed call never finds its input in L2 (``rotation_count``).
* The first call of a kernel on a shape (its compile, or an autotuner's search) is made and
  checked against the fp32 reference before anything is timed; its wall time is recorded.
* Plain timing: CUDA events around batches of back-to-back calls (``PLAIN_BATCH_S`` each; a
  call longer than that is a batch of its own), after warm-up; the median batch over its calls
  is reported. A model launches its layers back to back, so this is the kernel's time, or the
  host's launch overhead per call where that is longer (small shapes). Why batches and not one
  call: docs/bench_notes.md.
* Graph timing: the calls over all buffers are captured in one CUDA graph; a replay is timed
  with events and divided by the number of calls. This removes launch overhead.
* The ceiling is a device-to-device copy measured in the same run (bytes read + written).
* Host costs (``--overhead``): wall clock over many tiny calls, in rounds
  (``measure_overhead``), and the first-call (compile) time on row lengths the sweep does not
  use, in this process and in fresh ones (``measure_compile``).

Any callable can be timed: the kernels a run names are made in ``kernels``.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch

from .records import dtype_name, first_call_words
from .runinfo import no_gc, why

#: the eps of every call the benchmark makes and checks
EPS = 1e-6
#: plain timing: a batch of back-to-back calls between two CUDA events spans about this long
#: (``time_calls``); the event's own host cost is then < 1% of it (docs/bench_notes.md)
PLAIN_BATCH_S = 1e-3


def rmsnorm_bytes(M: int, N: int, dtype, weight_dtype=None, residual: bool = False) -> int:
    """The fewest bytes an RMSNorm forward must move: read x once, write y once, read w; with a
    residual also read it and write residual_out (both in x's dtype)."""
    esize = torch.empty((), dtype=dtype).element_size()
    wsize = torch.empty((), dtype=weight_dtype or dtype).element_size()
    return (4 if residual else 2) * M * N * esize + N * wsize


def rmsnorm_bwd_bytes(M: int, N: int, dtype, weight_dtype=None, residual: bool = False) -> int:
    """QuACK's count for a backward: read x and dout, write dx (x's dtype), read the weight and
    rstd (fp32); with ``residual`` (a prenorm backward) read dresidual_out (x's dtype) too.
    The fp32 partial sums of dw (P x N, P ~ the SMs) are not counted."""
    esize = torch.empty((), dtype=dtype).element_size()
    wsize = torch.empty((), dtype=weight_dtype or dtype).element_size()
    return (3 + int(residual)) * M * N * esize + N * wsize + 4 * M


def _l2_bytes() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 60 << 20) or (60 << 20))


def rotation_count(bytes_per_call: int, budget: int = 6 << 30) -> int:
    """How many input sets make one round of calls move > 3x L2, within a memory budget."""
    need = math.ceil(3 * _l2_bytes() / max(1, bytes_per_call)) + 1
    return max(2, min(need, max(1, budget // max(1, bytes_per_call)), 64))


def _seconds_per_call(fn, arg_sets) -> float:
    """A first estimate of one call's time (3 calls between two events), to size the timing."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for args in arg_sets[:3]:
        fn(*args)
    e.record()
    e.synchronize()
    return max(s.elapsed_time(e) / 1e3 / min(3, len(arg_sets)), 1e-7)


def time_calls(
    fn: Callable,
    arg_sets: list,
    warmup: int = 10,
    reps: int | None = None,
    budget_s: float = 0.5,
    batch_s: float = 0.0,
) -> float:
    """Median microseconds of one call, rotating inputs, after ``warmup`` calls.

    CUDA events go around each call, or with ``batch_s`` around batches of back-to-back calls
    that span about ``batch_s`` each (a call longer than that is a batch of its own), the
    median batch divided by its calls. ``reps`` event pairs, or as many as fit in
    ``budget_s`` (5 to 5000). Events around every call time one call on its own, host time
    to the launch included where the launch is longer than the kernel; a batch times what a
    model's layers see, calls launched back to back (docs/bench_notes.md)."""
    per_call = _seconds_per_call(fn, arg_sets)
    batch = max(1, int(batch_s / per_call)) if batch_s > 0 else 1
    reps = reps or int(max(5, min(5000, budget_s / (per_call * batch))))
    for i in range(warmup):
        fn(*arg_sets[i % len(arg_sets)])
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    n = len(arg_sets)
    with no_gc():
        for i in range(reps):
            starts[i].record()
            for j in range(i * batch, (i + 1) * batch):
                fn(*arg_sets[j % n])
            ends[i].record()
        torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))
    return ms * 1e3 / batch


#: the fewest calls a timed CUDA graph holds: a graph of one or two calls (an x past the L2 is
#: rotated over one or two sets) timed the graph's own launch with them (on an H100 at
#: 32768 x 2048 the library's graph rows read 106 us a call against 91 us plain)
GRAPH_MIN_CALLS = 16


def time_graph(fn: Callable, arg_sets: list, replays: int = 20) -> float:
    """Median microseconds per call from replays of one CUDA graph that calls ``fn`` over all
    input sets, in turn, at least ``GRAPH_MIN_CALLS`` times (as a model's graph holds many
    kernels, so that its launch is not timed as the calls'); captured on ``fn.stream`` when the
    function has one (an autograd peer: see ``kernels.autograd_bwd``), else on a new side
    stream."""
    stream = getattr(fn, "stream", None) or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for args in arg_sets:  # warm-up (compiles, allocator) outside the capture
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    calls = [arg_sets[i % len(arg_sets)] for i in range(max(GRAPH_MIN_CALLS, len(arg_sets)))]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for args in calls:
            fn(*args)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / len(calls))
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 1 << 30, reps: int = 30) -> float:
    """Device-to-device copy GB/s (bytes read + bytes written), the ceiling that counts."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    us = time_calls(lambda: dst.copy_(src), [()], warmup=5, reps=reps)
    return gbps(2 * nbytes, us)


def cuda_time_us(fn: Callable, *, warmup: int = 3, reps: int = 20) -> float:
    """Median microseconds of ``fn()``, with CUDA events around each call: the lessons' and
    the grader's timer for one callable on one input (``time_calls`` rotates input sets)."""
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_time_us needs a CUDA GPU")
    return time_calls(fn, [()], warmup=warmup, reps=reps)


def gbps(nbytes: int, us: float) -> float:
    """GB/s (10^9 bytes a second) of ``nbytes`` moved in ``us`` microseconds."""
    return nbytes / (us * 1e-6) / 1e9


def per_call_us(fn: Callable, args: tuple, calls: int = 2000, sync=None, warmup: int = 20):
    """Wall-clock microseconds per call over ``calls`` back-to-back calls on one input set,
    synchronizing once at the end: the host's cost per call when the kernel is tiny."""
    sync = sync or torch.cuda.synchronize
    for _ in range(warmup):
        fn(*args)
    sync()
    with no_gc():
        t = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        sync()
        return (time.perf_counter() - t) / calls * 1e6


# --- one measurement ------------------------------------------------------------------------


def sync() -> None:
    """Wait for the GPU, where there is one."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def call_args(
    M: int, N: int, dtype, weight_dtype=None, pass_: str = "fwd", residual: bool = False
) -> tuple:
    """One input set of a kernel's call: (x, w), with ``residual`` (x, w, residual); for the
    backward (x, w, dout, rstd), with ``residual`` (x, w, dout, rstd, dresidual_out)."""
    x = torch.randn(M, N, device="cuda", dtype=dtype)
    w = torch.randn(N, device="cuda", dtype=weight_dtype or dtype)
    args = (x, w)
    if pass_ == "bwd":
        rstd = torch.rsqrt(x.float().square().mean(-1) + EPS)
        args = (x, w, torch.randn(M, N, device="cuda", dtype=dtype), rstd)
    if residual:  # the residual (forward) or dresidual_out (backward), in x's dtype
        args += (torch.randn(M, N, device="cuda", dtype=dtype),)
    return args


def check_outputs(got, args, dtype, residual: bool) -> None:
    """The outputs of a call on ``args`` against the fp32 reference (whose temporaries, 8 GB at
    the largest shapes, are gone when this returns)."""
    from ..reference import assert_close, rmsnorm_ref

    x, w, *r = args
    if residual:
        ref_out, ref_res = rmsnorm_ref(x, w, residual=r[0], eps=EPS)
        assert_close(got[1], ref_res, dtype, what="residual_out")
        assert_close(got[0], ref_out, dtype)
    else:
        assert_close(got, rmsnorm_ref(x, w, eps=EPS), dtype)


def check_grads(got, args, dtype) -> None:
    """(dx, dw) of a backward on (x, w, dout, rstd[, dresidual_out]) against the fp32
    reference. dw is a sum over the M rows of terms ~1 with random signs: its tolerance grows
    like sqrt(M)."""
    from ..reference import TOLERANCES, assert_close, rmsnorm_bwd_ref

    x, w, dout, rstd, *dres_out = args
    dx, dw, _ = rmsnorm_bwd_ref(x, w, dout, rstd, *dres_out)
    assert_close(got[0], dx, dtype, what="dx")
    tol = TOLERANCES[got[1].dtype]
    scale = math.sqrt(x.shape[0])
    torch.testing.assert_close(
        got[1].float(), dw, atol=tol["atol"] * scale, rtol=tol["rtol"], msg="dw"
    )


def bench_one(
    fn,
    M,
    N,
    dtype,
    graph=False,
    weight_dtype=None,
    *,
    residual=False,
    budget_s=0.5,
    pass_="fwd",
    batch_s=None,
) -> dict:
    """Time ``fn(x, w)`` (with ``residual``: ``fn(x, w, r) -> (out, residual_out)``; backward:
    ``fn(x, w, dout, rstd) -> (dx, dw)``, with ``residual`` ``fn(x, w, dout, rstd,
    dresidual_out)``) at M x N. The first call (a compile, an autotune, a peer's recorded
    forward) runs, and is checked against the fp32 reference, before any timing: a kernel
    whose answer is wrong is never timed. Plain timing times batches of ``batch_s`` (default
    ``PLAIN_BATCH_S``; 0: events around each call)."""
    wdt = weight_dtype or dtype
    bwd = pass_ == "bwd"
    count = rmsnorm_bwd_bytes if bwd else rmsnorm_bytes
    nbytes = count(M, N, dtype, wdt, residual)
    sets = [call_args(M, N, dtype, wdt, pass_, residual) for _ in range(rotation_count(nbytes))]
    if hasattr(fn, "stream"):  # an autograd peer: its forwards recorded where a capture can be
        fn.stream = torch.cuda.Stream() if graph else None
    with torch.no_grad():
        sync()
        t = time.perf_counter()
        got = fn(*sets[0])
        sync()
        first_s = time.perf_counter() - t
        out_dtype = (got[0] if residual or bwd else got).dtype
        if bwd:
            check_grads(got, sets[0], dtype)
        else:
            check_outputs(got, sets[0], dtype, residual)
        del got
        if bwd:
            for args in sets[1:]:  # a peer's forward, recorded outside the timing
                fn(*args)
        if graph:
            us = time_graph(fn, sets)
        else:
            batch = PLAIN_BATCH_S if batch_s is None else batch_s
            us = time_calls(fn, sets, budget_s=budget_s, batch_s=batch)
    if hasattr(fn, "clear"):
        fn.clear()
    if hasattr(fn, "stream"):
        fn.stream = None
    del sets
    row = {
        "M": M,
        "N": N,
        "dtype": dtype_name(dtype),
        "weight_dtype": dtype_name(wdt),
        "residual": residual,
        "pass": pass_,
        "us": us,
        "gbps": gbps(nbytes, us),
        "bytes": nbytes,
        "graph": graph,
        "first_call_s": first_s,
    }
    if out_dtype != dtype:  # a peer that promotes writes more bytes than counted
        row["out_dtype"] = dtype_name(out_dtype)
    return row


# --- host costs (--overhead) ----------------------------------------------------------------


def measure_overhead(
    fns: dict,
    weight_dtypes,
    dtype,
    Ms=(1, 8),
    N=1024,
    calls=2000,
    log=print,
    pass_="fwd",
    rounds=5,
):
    """µs per call of back-to-back tiny calls (wall clock, one synchronize at the end of each
    round), in ``rounds`` rounds of ``calls / rounds`` calls with the kernels taking turns, as
    the GB/s rounds do: a host that is slow for a moment then costs every kernel one round,
    not one kernel its whole figure. The median round is reported (``us_rounds``: each)."""
    rows = []
    for wdt in weight_dtypes:
        wdt = wdt or dtype
        for M in Ms:
            args = call_args(M, N, dtype, wdt, pass_)
            mine = {}
            for name in fns:
                mine[name] = {"kernel": name, "M": M, "N": N, "dtype": dtype_name(dtype)}
                mine[name].update(weight_dtype=dtype_name(wdt), calls=calls, us_rounds=[])
            for _ in range(rounds):
                for name, fn in fns.items():
                    row = mine[name]
                    if "error" in row:
                        continue
                    try:
                        with torch.no_grad():
                            row["us_rounds"].append(per_call_us(fn, args, max(1, calls // rounds)))
                    except Exception as e:
                        row["error"] = why(e, 300)
            for name, row in mine.items():
                if "error" not in row:
                    row["us_per_call"] = statistics.median(row["us_rounds"])
                rows.append(row)
                what = f"{row['us_per_call']:7.1f} us/call" if "error" not in row else row["error"]
                log(f"overhead {name:<14} {M:>3}x{N} w {row['weight_dtype']}  {what}")
    return rows


def first_call_fresh(name, N, dtype, weight_dtype, M=1024, pass_="fwd", repeats=3):
    """The first call of kernel ``name`` at (M, N) in ``repeats`` fresh Python processes, each
    with empty CuTe DSL and QuACK kernel caches on disk: what a user's process pays on a key it
    meets first (QuACK keeps compiled kernels on disk, so a second process would load, not
    compile, them). The imports (torch, the kernel's library, CuTe DSL) come before the clock
    and are reported apart (``import_s``): QuACK imports CuTe DSL with its module, the library
    on first use. Each process runs ``bench --first-call-child`` (``first_call_child``)."""
    spec = {"kernel": name, "M": M, "N": N, "pass": pass_}
    spec.update(dtype=str(dtype).removeprefix("torch."))
    spec.update(weight_dtype=str(weight_dtype).removeprefix("torch."))
    calls, imports = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache:
            # empty caches: CuTe DSL's compiled modules, QuACK's compiled kernels
            env = dict(os.environ)
            for var, sub in (("CUTE_DSL_CACHE_DIR", "dsl"), ("QUACK_CACHE_DIR", "quack")):
                env[var] = os.path.join(cache, sub)
                os.makedirs(env[var])
            cmd = [
                sys.executable,
                "-m",
                "quack_edu.tools.bench",
                "--first-call-child",
                json.dumps(spec),
            ]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode:
            raise RuntimeError(f"the fresh process failed: {done.stderr.strip()[-300:]}")
        got = json.loads(done.stdout.strip().splitlines()[-1])
        calls.append(round(got["first_call_s"], 3))
        imports.append(round(got["import_s"], 3))
    return {
        "fresh_s": calls,
        "fresh_median_s": statistics.median(calls),
        "fresh_import_s": imports,
    }


def first_call_child(spec: str, resolve_kernels) -> int:
    """The child of ``first_call_fresh``, in its fresh process: import kernel ``spec["kernel"]``
    and CuTe DSL, then time its first call at (M, N); print the seconds as JSON.
    ``resolve_kernels``: ``kernels.resolve_kernels`` (given by bench: kernels imports this
    module)."""
    a = json.loads(spec)
    t = time.perf_counter()
    fns, skipped = resolve_kernels([a["kernel"]], pass_=a["pass"])
    import cutlass.cute  # noqa: F401  (QuACK imports it with its module; the library on first use)

    import_s = time.perf_counter() - t
    if skipped:
        raise RuntimeError(f"{a['kernel']}: {skipped[a['kernel']]}")
    dtype, wdt = (getattr(torch, a[k]) for k in ("dtype", "weight_dtype"))
    args = call_args(a["M"], a["N"], dtype, wdt, a["pass"])
    sync()
    t = time.perf_counter()
    with torch.no_grad():
        fns[a["kernel"]](*args)
    sync()
    print(json.dumps({"first_call_s": time.perf_counter() - t, "import_s": import_s}))
    return 0


def measure_compile(
    fns: dict, Ns, dtype, weight_dtype=None, M=1024, log=print, pass_="fwd", fresh=3
):
    """Wall time of the first call on a key no other call has used (compile + launch), and of
    the second call for contrast. The first N pays the process's one-time costs too. At the
    first N, also the first call in ``fresh`` new processes (``first_call_fresh``): one wall
    time of a noisy host is one sample, their median is the figure to quote."""
    rows = []
    wdt = weight_dtype or dtype
    for i, N in enumerate(Ns):
        args = call_args(M, N, dtype, wdt, pass_)
        for name, fn in fns.items():
            row = {"kernel": name, "M": M, "N": N, "dtype": dtype_name(dtype)}
            row["weight_dtype"] = dtype_name(wdt)
            try:
                with torch.no_grad():
                    for key in ("compile_s", "second_call_s"):
                        sync()
                        t = time.perf_counter()
                        fn(*args)
                        sync()
                        row[key] = time.perf_counter() - t
                if i == 0 and fresh:
                    row.update(first_call_fresh(name, N, dtype, wdt, M, pass_, fresh))
            except Exception as e:
                row["error"] = why(e, 300)
            rows.append(row)
            log(f"compile  {name:<14} {M}x{N}  {first_call_words(row)}")
    return rows
