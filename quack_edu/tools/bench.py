"""Benchmarks: GB/s from an explicit byte count, side by side with peers and the copy ceiling.

Method (the same for every kernel in a run):
* bytes = read x + write y + read weight = (2*M*N) * sizeof(x) + N * sizeof(w); with a residual
  (``--residual``, the pre-norm add) also read residual + write residual_out: (4*M*N) * sizeof(x).
* Inputs rotate over enough independent buffers that one round moves > 3x the L2 cache (60 MB on
  an H200), so a timed call never finds its input in L2.
* The first call of a kernel on a shape (its compile, or an autotuner's search) is made and
  checked against the fp32 reference before anything is timed; its wall time is recorded.
* Plain timing: CUDA events around batches of back-to-back calls (``PLAIN_BATCH_S`` each; a
  call longer than that is a batch of its own), after warm-up; the median batch over its
  calls is reported. A model launches its layers back to back, so this is the kernel's time,
  or the host's launch overhead per call where that is longer (small shapes). Until
  2026-12-01 the events went around each call (see ``time_calls``).
* Graph timing (``graph=True``): the calls over all buffers are captured in one CUDA graph; a
  replay is timed with events and divided by the number of calls. This removes launch overhead.
* The ceiling is a device-to-device copy measured in the same run (bytes read + written).
* ``--overhead``: host cost of tiny calls (wall clock over many calls, in rounds) and the
  first-call (compile) time of the library on row lengths the sweep does not use, in this
  process and in fresh ones (``first_call_fresh``).

Kernels: the stages (``cpasync``, ``cluster@hold``, ``block#1``: see ``split_name``), the library
(``lib`` = ``quack_edu.rmsnorm.rmsnorm_fwd``, ``lib-tuned`` = ``rmsnorm_fwd_tuned``) and the peers
(``quack`` = QuACK's ``rmsnorm_fwd``, ``quack-autograd``, ``torch-compile``, ``liger``,
``torch-eager`` = ``F.rms_norm``, ``torch-ops``). A run ends with a verdict: our kernel
(``--ours``) against QuACK, the best peer and the copy (``verdict``).

``--pass both`` times the whole ladder in one record: the forward (its stages naive ... final,
the library, the peers), then the backward (final_bwd, the library, the peers), against one copy
measured first; its plots add the ladder at one shape (``plot_ladder``) and the speed-up over
PyTorch (``plot_speedup``).

Usage: ``quack-edu bench --stages lib,lib-tuned --peers quack,liger --weight-dtype
bf16,fp32 --graph --graph-max-n 2048 --json F``; ``--summarize F [G ...]`` prints the tables and
the verdict of recorded runs (no GPU needed).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
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

from ..stages import BACKWARD_STAGES, STAGE_ORDER
from .runinfo import CLOCK_FIELDS, gpu_clocks, no_gc  # noqa: F401  (bench.gpu_clocks ...)
from .runinfo import finish as _finish
from .runinfo import pyplot as _pyplot
from .runinfo import version as _version
from .runinfo import why as _why

DEFAULT_SHAPES = [
    (32768, 256),
    (32768, 512),
    (32768, 1024),
    (32768, 2048),
    (32768, 4096),
    (32768, 8192),
    (32768, 16384),
    (32768, 32768),
    (32768, 65536),
    (16384, 131072),
    (8192, 262144),
]
#: the pre-norm residual benchmark's shapes (``--residual`` without ``--shapes``)
RESIDUAL_SHAPES = [(32768, 4096), (32768, 16384), (32768, 65536)]
EPS = 1e-6
#: plain timing: a batch of back-to-back calls between two CUDA events spans about this long
#: (``time_calls``); the event's own host cost (~6 us on the H200's host) is then < 1% of it
PLAIN_BATCH_S = 1e-3

#: the library's entries, by kernel name (``quack_edu.rmsnorm``, QuACK's signature)
LIBRARY = {"lib": "rmsnorm_fwd", "lib-tuned": "rmsnorm_fwd_tuned"}
LIBRARY_BWD = {"lib": "rmsnorm_bwd", "lib-tuned": "rmsnorm_bwd_tuned"}
#: the backward issue's acceptance criteria (``verdict``'s thresholds for ``--pass bwd``): no
#: shape below 0.98x the best peer, geomean >= 1.10x QuACK, >= 85% of copy at 4K-32K and
#: >= 75% at 64K-262K; no fp32-vs-bf16-weight criterion
BWD_THRESHOLDS = {
    "peer_margin": 0.02,
    "geomean_min": 1.10,
    "fp32_margin": None,
    "copy_bands": ((4096, 32768, 85.0), (65536, 262144, 75.0)),
    "residual_ns": (),
}
#: the kernels whose host cost ``--overhead`` measures (and ``--ours``). Not ``lib-tuned``
#: unless it is ours: its tuning key has no M, and a tiny M must not choose its config.
HOST_TIMED = ("lib", "quack", "torch-eager")
#: every peer this harness knows, in the order "all" lists them
PEERS = ("quack", "quack-autograd", "torch-compile", "liger", "torch-eager", "torch-ops")
PEER_PACKAGES = {
    "quack": "quack-kernels",
    "quack-autograd": "quack-kernels",
    "liger": "liger-kernel",
}


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
    ``budget_s`` (5 to 5000). Events around every call time one call on its own: when the
    host's launch overhead is longer than the kernel, the host's time from the first event to
    the launch plus the kernel, which moved by a third between rounds on the H200
    (fwd_final.json until 2026-12-01, N = 256). A batch times what a model's layers see, calls
    launched back to back: the kernel, or the host's time per call where that is longer."""
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


def time_graph(fn: Callable, arg_sets: list, replays: int = 20) -> float:
    """Median microseconds per call from replays of one CUDA graph over all input sets,
    captured on ``fn.stream`` when the function has one (an autograd peer: see
    ``_autograd_bwd``), else on a new side stream."""
    stream = getattr(fn, "stream", None) or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for args in arg_sets:  # warm-up (compiles, allocator) outside the capture
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for args in arg_sets:
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
        times.append(s.elapsed_time(e) * 1e3 / len(arg_sets))
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


# --- the kernels a run can time -------------------------------------------------------------


def split_name(name: str) -> tuple[str, str, str]:
    """``stage[@variant][#k]`` -> (stage, variant, k), the last two possibly empty."""
    head, _, index = name.partition("#")
    stage, _, variant = head.partition("@")
    return stage, variant, index


def kernel_kind(name: str) -> str:
    """'library' (``lib``, ``lib-tuned``), 'peer' (``PEERS``) or 'stage' (anything else)."""
    if name in LIBRARY:
        return "library"
    if name in PEERS:
        return "peer"
    return "stage"


def resolve_config(name: str, N: int, dtype, weight_dtype=None):
    """The config a stage kernel ``name`` runs with at N: its heuristic's, or with ``name#k`` the
    k-th entry of the stage's ``configs(N, dtype)`` (the alternatives the heuristic chooses
    between), so that they can be timed side by side. A stage whose heuristic knows the
    weight's dtype (final: an fp32 weight has plans of its own) is given ``weight_dtype``."""
    import inspect

    from ..stages import get_stage

    stage, _, index = split_name(name)
    mod = get_stage(stage)
    by_weight = "weight_dtype" in inspect.signature(mod.configs).parameters
    extra = {"weight_dtype": weight_dtype} if by_weight and weight_dtype is not None else {}
    if not index:
        return mod.default_config(N, dtype, **extra)
    options = mod.configs(N, dtype, **extra)
    if int(index) >= len(options):
        raise ValueError(f"{stage} has {len(options)} configs at N={N}: {options}")
    return options[int(index)]


def _variant(mod, stage: str, variant: str):
    """The kernel class a stage lists under ``variant`` in its ``VARIANTS`` (None: none
    asked for)."""
    if not variant:
        return None
    variants = getattr(mod, "VARIANTS", {})
    if variant not in variants:
        raise ValueError(f"{stage} has no variant {variant!r}; it has: {sorted(variants)}")
    return variants[variant]


def stage_fn(name: str, config=None):
    """A stage's forward with ``config``, or with the config ``resolve_config`` names.
    ``stage@variant`` runs the kernel class the stage lists under that name in ``VARIANTS``
    (the same tiling with another plan, e.g. ``cluster@hold``)."""
    from ..runtime import run_forward
    from ..stages import get_stage

    stage, variant, _ = split_name(name)
    mod = get_stage(stage)
    kernel = _variant(mod, stage, variant) or mod.KERNEL
    forced = functools.cache(lambda N, dtype, wdt: resolve_config(name, N, dtype, wdt))

    def fwd(x, w, eps=1e-6):
        wdt = None if w is None else w.dtype
        return run_forward(kernel, x, w, eps, config or forced(x.shape[1], x.dtype, wdt))

    return fwd


def stage_bwd_fn(name: str) -> Callable:
    """A backward stage (``BACKWARD_STAGES``: final_bwd) as ``fn(x, w, dout, rstd) -> (dx,
    dw)``: its launch with its heuristic's config, or ``#k`` the k-th of its ``configs`` for
    the weight's dtype (``@variant``: a kernel class of its ``VARIANTS``), then dw's partial
    sums added. The library's ``rmsnorm_bwd`` runs the same kernel behind its checks."""
    from ..stages import get_stage

    stage, variant, index = split_name(name)
    mod = get_stage(stage)
    kernel = _variant(mod, stage, variant)

    @functools.cache
    def pick(N, dtype, wdt):  # None: launch_bwd's own, the heuristic's for the call's features
        return resolve_config(name, N, dtype, wdt) if index else None

    def bwd(x, w, dout, rstd):
        dx = torch.empty_like(x)
        config = pick(x.shape[1], x.dtype, w.dtype)
        dw_p, _ = mod.launch_bwd(x, w, dout, None, rstd, dx, None, False, config=config,
                                 kernel_cls=kernel)  # fmt: skip
        return dx, mod.sum_partials(dw_p, w.dtype)

    return bwd


def library_fn(name: str, residual: bool = False, pass_: str = "fwd") -> Callable:
    """The library's forward (``lib``: heuristic config; ``lib-tuned``: autotuned on the first
    call of a key) as ``fn(x, w) -> out``, or with ``residual`` ``fn(x, w, r) -> (out,
    residual_out)``; its backward (``pass_="bwd"``) as ``fn(x, w, dout, rstd) -> (dx, dw)``,
    with ``residual`` (a prenorm backward) ``fn(x, w, dout, rstd, dresidual_out)``, dx then
    holding dresidual_out added. Raises ImportError/AttributeError while the library lacks it."""
    import importlib

    mod = importlib.import_module("quack_edu.rmsnorm")
    if pass_ == "bwd":
        b = getattr(mod, LIBRARY_BWD[name])
        if residual:
            return lambda x, w, dout, rstd, dres: b(x, w, dout, rstd, dres, has_residual=True)[:2]
        return lambda x, w, dout, rstd: b(x, w, dout, rstd)[:2]
    f = getattr(mod, LIBRARY[name])
    if residual:
        return lambda x, w, r: tuple(f(x, w, residual=r, eps=EPS)[:2])
    return lambda x, w: f(x, w, eps=EPS)[0]


def _composed(x, w):  # RMSNorm as a model writes it in PyTorch ops: one kernel per op
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def _composed_residual(x, w, r):  # the pre-norm block: h = x + r; (norm(h) * w, h)
    h = x.float() + r.float()
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * w.float()
    return out.to(x.dtype), h.to(x.dtype)


def _torch_compile(fn):
    # One specialisation per shape, as a model with fixed shapes gets; raise dynamo's limit on
    # recompiles so that a sweep of shapes (and weight dtypes) never falls back to eager.
    import torch._dynamo

    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    return torch.compile(fn, dynamic=False)


def _autograd_bwd(forward: Callable) -> Callable:
    """A peer's backward as autograd runs it: ``fn(x, w, dout, rstd) -> (dx, dw)``. The forward
    runs once per input set, on its first call (outside the timing: ``bench_one`` makes that
    first call before it times); every call then replays the recorded backward
    (``retain_graph``). ``fn.clear()`` drops the recorded graphs.

    Through CUDA graphs too: autograd runs a backward op on the stream its forward op ran on,
    so a capture must happen on the stream the forward was recorded on. ``fn.stream`` (None:
    the current stream) is where forwards are recorded; ``bench_one`` sets a side stream of
    its own before a graph-timed case, and ``time_graph`` captures on ``fn.stream``."""
    recorded: dict = {}

    def fn(x, w, dout, rstd):
        key = (x.data_ptr(), w.data_ptr())
        hit = recorded.get(key)
        if hit is None:
            xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
            if fn.stream is None:
                with torch.enable_grad():
                    hit = recorded[key] = (forward(xg, wg), xg, wg)
            else:
                fn.stream.wait_stream(torch.cuda.current_stream())
                with torch.enable_grad(), torch.cuda.stream(fn.stream):
                    hit = recorded[key] = (forward(xg, wg), xg, wg)
                torch.cuda.current_stream().wait_stream(fn.stream)
        out, xg, wg = hit
        return torch.autograd.grad(out, (xg, wg), dout, retain_graph=True)

    fn.clear = recorded.clear
    fn.stream = None
    return fn


def peer_fns(
    residual: bool = False, names=PEERS, pass_: str = "fwd"
) -> tuple[dict[str, Callable], dict[str, str]]:
    """The peers among ``names`` that are importable here, as ``fn(x, w) -> out`` (with
    ``residual``: ``fn(x, w, r) -> (out, residual_out)``; backward: ``fn(x, w, dout, rstd) ->
    (dx, dw)``), and why each other one is not."""
    import torch.nn.functional as F

    fns: dict[str, Callable] = {}
    missing: dict[str, str] = {}

    def add(name, make):
        if name not in names:
            return
        try:
            fns[name] = make()
        except Exception as e:  # not installed here, or this mode has no such kernel
            missing[name] = _why(e, 200)

    if pass_ == "bwd":

        def quack_bwd():
            from quack.rmsnorm import rmsnorm_bwd

            if residual:
                return lambda x, w, dout, rstd, dres: rmsnorm_bwd(
                    x, w, dout, rstd, dres, has_residual=True
                )[:2]
            return lambda x, w, dout, rstd: rmsnorm_bwd(x, w, dout, rstd)[:2]

        def autograd_of(make_forward):
            def make():
                if residual:
                    raise NotImplementedError("its prenorm backward is not timed by this harness")
                return _autograd_bwd(make_forward())

            return make

        def compiled():
            import torch._functorch.config as functorch_config

            # a compiled backward replayed with retain_graph must not donate its buffers
            functorch_config.donated_buffer = False
            return _torch_compile(_composed)

        def not_timed():
            raise NotImplementedError("its backward is not timed by this harness")

        add("quack", quack_bwd)
        add("quack-autograd", not_timed)
        add("torch-compile", autograd_of(compiled))
        add("liger", not_timed)
        add("torch-eager", autograd_of(lambda: lambda x, w: F.rms_norm(x, x.shape[-1:], w, EPS)))
        add("torch-ops", autograd_of(lambda: _composed))
        for name in names:
            if name not in PEERS:
                missing[name] = f"unknown peer; known: {', '.join(PEERS)}"
        return fns, missing

    def quack():
        from quack.rmsnorm import rmsnorm_fwd  # the forward entry the issue compares with

        if residual:
            return lambda x, w, r: tuple(rmsnorm_fwd(x, w, residual=r, eps=EPS)[:2])
        return lambda x, w: rmsnorm_fwd(x, w, eps=EPS)[0]

    def quack_autograd():
        if residual:
            raise NotImplementedError("timed without a residual only")
        from quack.rmsnorm import rmsnorm

        return lambda x, w: rmsnorm(x, w, eps=EPS)

    def liger():
        if residual:
            from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward

            return lambda x, w, r: tuple(fused_add_rms_norm_forward(x, r, w, EPS, 0.0, "llama")[:2])
        from liger_kernel.ops.rms_norm import rms_norm_forward

        return lambda x, w: rms_norm_forward(x, w, EPS, 0.0, "llama", None)[0]

    def eager():  # torch >= 2.4 has a fused CUDA kernel behind F.rms_norm
        if residual:

            def fn(x, w, r):
                h = x + r
                return F.rms_norm(h, (h.shape[-1],), w, EPS), h

            return fn
        return lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS)

    add("quack", quack)
    add("quack-autograd", quack_autograd)
    add("torch-compile", lambda: _torch_compile(_composed_residual if residual else _composed))
    add("liger", liger)
    add("torch-eager", eager)
    # the same maths in separate ops launches one kernel per op
    add("torch-ops", lambda: _composed_residual if residual else _composed)
    for name in names:
        if name not in PEERS:
            missing[name] = f"unknown peer; known: {', '.join(PEERS)}"
    return fns, missing


def resolve_kernels(
    names, residual: bool = False, pass_: str = "fwd"
) -> tuple[dict[str, Callable], dict[str, str]]:
    """{name: fn} for every kernel name that can run here (stages, library, peers), and
    {name: why not} for the others, so that a run records what it skipped and why."""
    fns: dict[str, Callable] = {}
    skipped: dict[str, str] = {}
    peers = [n for n in names if kernel_kind(n) == "peer"]
    got, missing = peer_fns(residual, peers, pass_) if peers else ({}, {})
    for name in names:
        kind = kernel_kind(name)
        try:
            if kind == "peer":
                if name in missing:
                    skipped[name] = missing[name]
                else:
                    fns[name] = got[name]
            elif kind == "library":
                fns[name] = library_fn(name, residual, pass_)
            elif residual:
                raise NotImplementedError("stage kernels take no residual")
            elif (split_name(name)[0] in BACKWARD_STAGES) != (pass_ == "bwd"):
                raise NotImplementedError(
                    "a forward stage: the backward is timed through final_bwd and the library"
                    if pass_ == "bwd"
                    else "a backward stage: time it with --pass bwd"
                )
            elif pass_ == "bwd":
                fns[name] = stage_bwd_fn(name)
            else:
                fns[name] = stage_fn(name)
        except Exception as e:
            skipped[name] = _why(e, 200)
    return fns, skipped


# --- one measurement ------------------------------------------------------------------------


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _check_outputs(got, args, dtype, residual: bool) -> None:
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


def _check_grads(got, args, dtype) -> None:
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
    check=True,
    residual=False,
    budget_s=0.5,
    pass_="fwd",
    batch_s=None,
) -> dict:
    """Time ``fn(x, w)`` (with ``residual``: ``fn(x, w, r) -> (out, residual_out)``; backward:
    ``fn(x, w, dout, rstd) -> (dx, dw)``, with ``residual`` ``fn(x, w, dout, rstd,
    dresidual_out)``) at M x N. The first call (a compile, an autotune, a peer's recorded
    forward) runs, and is checked, before any timing. Plain timing times batches of
    ``batch_s`` (default ``PLAIN_BATCH_S``; 0: events around each call)."""
    wdt = weight_dtype or dtype
    bwd = pass_ == "bwd"
    nbytes = (
        rmsnorm_bwd_bytes(M, N, dtype, wdt, residual)
        if bwd
        else rmsnorm_bytes(M, N, dtype, wdt, residual)
    )
    k = rotation_count(nbytes)

    def inputs():
        x = torch.randn(M, N, device="cuda", dtype=dtype)
        w = torch.randn(N, device="cuda", dtype=wdt)
        if bwd:
            rstd = torch.rsqrt(x.float().square().mean(-1) + EPS)
            dout = torch.randn(M, N, device="cuda", dtype=dtype)
            if residual:  # dresidual_out, in x's dtype
                return (x, w, dout, rstd, torch.randn(M, N, device="cuda", dtype=dtype))
            return (x, w, dout, rstd)
        return (x, w, torch.randn(M, N, device="cuda", dtype=dtype)) if residual else (x, w)

    sets = [inputs() for _ in range(k)]
    if hasattr(fn, "stream"):  # an autograd peer: its forwards recorded where a capture can be
        fn.stream = torch.cuda.Stream() if graph else None
    with torch.no_grad():
        _sync()
        t = time.perf_counter()
        got = fn(*sets[0])
        _sync()
        first_s = time.perf_counter() - t
        out = got[0] if residual or bwd else got
        out_dtype = out.dtype
        if check and bwd:
            _check_grads(got, sets[0], dtype)
        elif check:  # never time a kernel whose answer is wrong
            _check_outputs(got, sets[0], dtype, residual)
        del got, out
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
        "dtype": _short(dtype),
        "weight_dtype": _short(wdt),
        "residual": residual,
        "pass": pass_,
        "us": us,
        "gbps": gbps(nbytes, us),
        "bytes": nbytes,
        "graph": graph,
        "first_call_s": first_s,
    }
    if out_dtype != dtype:  # a peer that promotes writes more bytes than counted
        row["out_dtype"] = _short(out_dtype)
    return row


def _short(dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(
        dtype, str(dtype)
    )


def parse_weight_dtypes(text: str | None) -> list:
    """``bf16,fp32`` -> [torch.bfloat16, torch.float32]; ``same`` -> None (x's dtype)."""
    from ..runtime import torch_dtype

    out = []
    for part in (text or "same").split(","):
        part = part.strip()
        if part:
            out.append(None if part == "same" else torch_dtype(part))
    return list(dict.fromkeys(out)) or [None]


def call_args(M: int, N: int, dtype, weight_dtype=None, pass_: str = "fwd") -> tuple:
    """One input set of a kernel's call: (x, w), or for the backward (x, w, dout, rstd)."""
    x = torch.randn(M, N, device="cuda", dtype=dtype)
    w = torch.randn(N, device="cuda", dtype=weight_dtype or dtype)
    if pass_ != "bwd":
        return x, w
    rstd = torch.rsqrt(x.float().square().mean(-1) + EPS)
    return x, w, torch.randn(M, N, device="cuda", dtype=dtype), rstd


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
                mine[name] = {"kernel": name, "M": M, "N": N, "dtype": _short(dtype)}
                mine[name].update(weight_dtype=_short(wdt), calls=calls, us_rounds=[])
            for _ in range(rounds):
                for name, fn in fns.items():
                    row = mine[name]
                    if "error" in row:
                        continue
                    try:
                        with torch.no_grad():
                            row["us_rounds"].append(per_call_us(fn, args, max(1, calls // rounds)))
                    except Exception as e:
                        row["error"] = _why(e, 300)
            for name, row in mine.items():
                if "error" not in row:
                    row["us_per_call"] = statistics.median(row["us_rounds"])
                rows.append(row)
                what = f"{row['us_per_call']:7.1f} us/call" if "error" not in row else row["error"]
                log(f"overhead {name:<14} {M:>3}x{N} w {row['weight_dtype']}  {what}")
    return rows


def first_call_child(spec: str) -> int:
    """In a fresh process (``first_call_fresh``): import kernel ``spec["kernel"]`` and CuTe DSL,
    then time its first call at (M, N); print the seconds as JSON."""
    a = json.loads(spec)
    t = time.perf_counter()
    fns, skipped = resolve_kernels([a["kernel"]], pass_=a["pass"])
    import cutlass.cute  # noqa: F401  (QuACK imports it with its module; the library on first use)

    import_s = time.perf_counter() - t
    if skipped:
        raise RuntimeError(f"{a['kernel']}: {skipped[a['kernel']]}")
    dtype, wdt = (getattr(torch, a[k]) for k in ("dtype", "weight_dtype"))
    args = call_args(a["M"], a["N"], dtype, wdt, a["pass"])
    _sync()
    t = time.perf_counter()
    with torch.no_grad():
        fns[a["kernel"]](*args)
    _sync()
    print(json.dumps({"first_call_s": time.perf_counter() - t, "import_s": import_s}))
    return 0


def first_call_fresh(name, N, dtype, weight_dtype, M=1024, pass_="fwd", repeats=3):
    """The first call of kernel ``name`` at (M, N) in ``repeats`` fresh Python processes, each
    with empty CuTe DSL and QuACK kernel caches on disk: what a user's process pays on a key it
    meets first (QuACK keeps compiled kernels on disk, so a second process would load, not
    compile, them). The imports (torch, the kernel's library, CuTe DSL) come before the clock
    and are reported apart (``import_s``): QuACK imports CuTe DSL with its module, the library
    on first use."""
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
            row = {"kernel": name, "M": M, "N": N, "dtype": _short(dtype)}
            row["weight_dtype"] = _short(wdt)
            try:
                with torch.no_grad():
                    for key in ("compile_s", "second_call_s"):
                        _sync()
                        t = time.perf_counter()
                        fn(*args)
                        _sync()
                        row[key] = time.perf_counter() - t
                if i == 0 and fresh:
                    row.update(first_call_fresh(name, N, dtype, wdt, M, pass_, fresh))
            except Exception as e:
                row["error"] = _why(e, 300)
            rows.append(row)
            log(f"compile  {name:<14} {M}x{N}  {_first_call_words(row)}")
    return rows


#: rounds of a launch-bound shape per round asked for (``run``): the same calls in all, in
#: shorter turns, so that a slow moment of the host lands on every kernel's median alike
LAUNCH_BOUND_ROUNDS = 2


def run(
    stages,
    shapes,
    dtype=torch.bfloat16,
    peers=False,
    graph=False,
    graph_max_n=None,
    max_n=None,
    log=print,
    on_row=None,
    weight_dtypes=None,
    residual=False,
    overhead=False,
    ours="lib",
    budget_s=0.5,
    compile_ns=(3000, 5000),
    meta=None,
    pass_="fwd",
    rounds=1,
    copy_gbps=None,
    progress=False,
) -> dict:
    """Time every kernel at every shape and weight dtype. ``stages``: kernel names (stages,
    ``lib``, ``lib-tuned``, also peers); ``peers``: True/"all" or a comma list. ``graph``: also
    through CUDA graphs (for N up to ``graph_max_n``: the launch-bound shapes). ``max_n``:
    {kernel: largest N worth timing}. ``weight_dtypes``: a list (None = x's dtype).
    ``residual``: the pre-norm benchmark (x + residual, both outputs; the backward: a
    dresidual_out added to dx, read as well; QuACK's the only peer). ``overhead``: also the
    host cost per tiny call and the first-call time of ``ours`` (before the sweep).
    ``on_row(result)`` is called after every shape (to save partial results); ``meta``: fields
    for the record (the command line). ``pass_``: "fwd", or "bwd" (the backward: the library's
    ``rmsnorm_bwd``, QuACK's, autograd of torch.compile / F.rms_norm / PyTorch ops).
    ``rounds``: at each shape, every kernel with every weight dtype is timed once a round, in
    turn, and a row is the median of its rounds (``merge_rounds``): a launch-bound row measures
    the host as much as the kernel, and the host's speed moves, so kernels (and a kernel with
    an fp32 weight against its bf16 one) are compared over the same stretch of time. It damps,
    not removes, that noise: on the H200's host the plain rows at 32768 x 256 moved 20-60%
    between rounds of one process, for every kernel. The GPU's speed moves too: at 32768 x 2048
    through graphs the library's, QuACK's and F.rms_norm's rounds fell at two levels about 8%
    apart, slow together in the same rounds, and the level changed within a round too
    (fwd_final.json of 2026-12-01: the bf16 weight's median at the fast level, the fp32
    weight's between, 0.966x). So a kernel's two weight dtypes are timed next to each other
    (bf16 then fp32 weight, plain then graph): the pair the fp32-against-bf16 criterion
    compares. The shapes also timed through graphs (``graph_max_n``) get
    ``LAUNCH_BOUND_ROUNDS`` times the rounds, each with that fraction of ``budget_s``.
    ``copy_gbps``: the copy ceiling measured earlier in this process (``run_both``), else
    measured first; ``progress``: a progress bar of the timings on stderr. The GPU's clocks
    are recorded before and after (``gpu_clocks``)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if pass_ not in ("fwd", "bwd"):
        raise ValueError(f"pass_ must be 'fwd' or 'bwd', got {pass_!r}")
    t_run = time.perf_counter()
    max_n = max_n or {}
    weight_dtypes = list(weight_dtypes or [None])
    clocks = {"start": gpu_clocks()}
    copy = copy_bandwidth() if copy_gbps is None else copy_gbps
    log(f"D2D copy: {copy:.0f} GB/s" + ("" if copy_gbps is None else " (measured before)"))
    rows = []
    result = {
        "gpu": torch.cuda.get_device_name(0),
        "date": _dt.date.today().isoformat(),
        "torch": torch.__version__,
        "dsl": _version("nvidia-cutlass-dsl"),
        "clocks": clocks,
        "copy_gbps": copy,
        "dtype": _short(dtype),
        "weight_dtypes": [_short(w or dtype) for w in weight_dtypes],
        "residual": residual,
        "pass": pass_,
        "rounds": rounds,
        "rounds_launch_bound": LAUNCH_BOUND_ROUNDS * rounds if graph and graph_max_n else rounds,
        "plain_batch_s": PLAIN_BATCH_S,
        **(meta or {}),
        "rows": rows,
    }
    names = list(stages)
    if peers:
        wanted = list(PEERS) if peers in (True, "all") else peers.split(",")
        names += [p for p in wanted if p not in names]
    fns, skipped = resolve_kernels(names, residual, pass_)
    if peers in (True, "all"):  # "all" = the peers that are installed: no noise about the rest
        skipped = {k: v for k, v in skipped.items() if kernel_kind(k) != "peer"}
    for name, why in skipped.items():
        log(f"skipped {name}: {why}")
    result["skipped"] = skipped
    result["peers"] = {k: _version(PEER_PACKAGES[k]) for k in fns if k in PEER_PACKAGES}

    if overhead:
        # before the sweep: the first call at compile_ns is then the library's first call
        host, _ = resolve_kernels(list(dict.fromkeys([ours, *HOST_TIMED])), pass_=pass_)
        t = time.perf_counter()
        first = {k: v for k, v in host.items() if k in (ours, "lib", "quack")}
        result["compile"] = measure_compile(
            first, compile_ns, dtype, weight_dtypes[0], log=log, pass_=pass_
        )
        result["overhead"] = measure_overhead(host, weight_dtypes, dtype, log=log, pass_=pass_)
        log(f"host costs measured in {time.perf_counter() - t:.0f} s")
        if on_row:
            on_row(result)

    def plan(N):  # (rounds, budget a round, graph modes) of a shape
        small = graph_max_n is None or N <= graph_max_n  # also timed through graphs
        if graph and graph_max_n is not None and small:
            return LAUNCH_BOUND_ROUNDS * rounds, budget_s / LAUNCH_BOUND_ROUNDS, [False, True]
        return rounds, budget_s, [False, True] if graph and small else [False]

    def timed(N):  # the kernels timed at N
        return {name: fn for name, fn in fns.items() if N <= max_n.get(name, N)}

    total = sum(
        plan(N)[0] * len(plan(N)[2]) * len(timed(N)) * len(weight_dtypes) for _, N in shapes
    )
    from ..autotune import Progress

    bar = Progress(total, f"bench {pass_}", progress, unit="timings")
    for M, N in shapes:
        # (weight dtype, kernel, graph) -> its row of every round; a kernel's weight dtypes
        # take turns next to each other, so that "fp32 weight against bf16" compares the same
        # few seconds of the GPU
        tries: dict = {}
        # a launch-bound shape (timed through graphs too): its plain rows time the host, so
        # more rounds of fewer calls each (the inputs there are small: a round is cheap)
        n_rounds, budget, modes = plan(N)
        for _ in range(n_rounds):
            for name, fn in timed(N).items():
                for g in modes:
                    for wdt in weight_dtypes:
                        tries.setdefault((wdt, name, g), []).append(
                            _try_one(fn, M, N, dtype, g, wdt, residual, budget, pass_)
                        )
                        bar.update()
                torch.cuda.empty_cache()
        by_weight = sorted(tries.items(), key=lambda kv: weight_dtypes.index(kv[0][0]))
        for (wdt, name, _g), rounds_rows in by_weight:  # rows as before: a weight dtype's together
            row = merge_rounds(rounds_rows)
            row["kernel"] = name
            row["config"] = _config_of(name, N, dtype, wdt)
            if "gbps" in row:
                row["pct_copy"] = 100 * row["gbps"] / copy
            rows.append(row)
            log(_fmt_row(row))
        if on_row:
            on_row(result)
    bar.close()
    clocks["end"] = gpu_clocks()
    result["elapsed_s"] = time.perf_counter() - t_run
    result["verdict"] = verdict(rows, ours=ours, **thresholds_for(pass_))
    log(f"run took {result['elapsed_s']:.0f} s")
    return result


def split_stages(kernels) -> dict[str, list[str]]:
    """The kernels of ``--pass both`` by pass: the forward gets the forward stages, the
    library and the peers; the backward the backward stages (``BACKWARD_STAGES``), the library
    and the peers. Each pass times ``lib``, named or not: the ladder ends with it."""
    fwd = [k for k in kernels if split_name(k)[0] not in BACKWARD_STAGES]
    bwd = [k for k in kernels if kernel_kind(k) != "stage" or split_name(k)[0] in BACKWARD_STAGES]
    return {p: ks + ["lib"] * ("lib" not in ks) for p, ks in (("fwd", fwd), ("bwd", bwd))}


def run_both(stages, shapes, log=print, on_row=None, meta=None, **kw) -> dict:
    """The forward and the backward in one record (``--pass both``): ``{"pass": "both",
    "gpu", "date", ..., "copy_gbps", "fwd": <run's result>, "bwd": <run's result>}``, the copy
    measured once, first, for both. ``stages``: kernels of either pass (``split_stages``);
    ``kw``: ``run``'s options. ``on_row(record)`` after every shape of either pass."""
    kernels = split_stages(stages)
    copy = copy_bandwidth()
    record: dict = {"pass": "both", **(meta or {})}

    def saving(pass_):
        def on(result):
            record[pass_] = result
            if on_row:
                on_row(record)

        return on

    for pass_ in ("fwd", "bwd"):
        log(f"--- {'forward' if pass_ == 'fwd' else 'backward'}: {', '.join(kernels[pass_])}")
        record[pass_] = run(kernels[pass_], shapes, log=log, on_row=saving(pass_), meta=meta,
                            pass_=pass_, copy_gbps=copy, **kw)  # fmt: skip
    fwd, bwd = record["fwd"], record["bwd"]
    for key in ("gpu", "date", "torch", "dsl", "copy_gbps", "dtype", "weight_dtypes", "rounds"):
        record[key] = fwd[key]
    record["peers"] = {**fwd["peers"], **bwd["peers"]}
    record["clocks"] = {"start": fwd["clocks"]["start"], "end": bwd["clocks"]["end"]}
    record["elapsed_s"] = fwd["elapsed_s"] + bwd["elapsed_s"]
    # the keys first, the passes last (the file reads top down)
    return {k: record[k] for k in sorted(record, key=lambda k: k in ("fwd", "bwd"))}


def passes(result: dict) -> list[dict]:
    """A record's single-pass results: itself, or a ``--pass both`` record's two."""
    return (
        [result[p] for p in ("fwd", "bwd") if p in result]
        if result.get("pass") == "both"
        else [result]
    )


def _try_one(fn, M, N, dtype, graph, wdt, residual, budget_s, pass_) -> dict:
    """``bench_one``, or the row of a kernel that doesn't support the case: why."""
    try:
        return bench_one(
            fn, M, N, dtype, graph, wdt, residual=residual, budget_s=budget_s, pass_=pass_
        )
    except Exception as e:
        return {
            "M": M,
            "N": N,
            "dtype": _short(dtype),
            "weight_dtype": _short(wdt or dtype),
            "residual": residual,
            "pass": pass_,
            "error": _why(e, 300),
            "graph": graph,
        }


def merge_rounds(tries: list[dict]) -> dict:
    """One row from a kernel's rows of every round at one shape: the median time and the GB/s
    of it, each round's time kept (``us_rounds``), the first round's first call (the compile).
    A round that failed makes the row its error."""
    for t in tries:
        if "error" in t:
            return dict(t)
    row = dict(tries[0])
    if len(tries) > 1:
        row["us_rounds"] = [t["us"] for t in tries]
        row["us"] = statistics.median(row["us_rounds"])
        row["gbps"] = gbps(row["bytes"], row["us"])
    return row


def thresholds_for(pass_: str) -> dict:
    """``verdict``'s thresholds for a pass: the forward issue's (its defaults) or the
    backward's (``BWD_THRESHOLDS``)."""
    return dict(BWD_THRESHOLDS) if pass_ == "bwd" else {}


def _config_of(name: str, N: int, dtype, weight_dtype=None) -> str | None:
    """The config a stage kernel runs at N, for the record (None for peers and the library)."""
    if kernel_kind(name) != "stage" or split_name(name)[0] not in STAGE_ORDER:
        return None
    try:
        return repr(resolve_config(name, N, dtype, weight_dtype))
    except Exception:
        return None


def _wdt(r) -> str:
    return r.get("weight_dtype") or r["dtype"]


def _fmt_row(r) -> str:
    mode = "graph" if r["graph"] else "plain"
    res = " +res" if r.get("residual") else ""
    head = f"{r['kernel']:<16} {r['M']:>6}x{r['N']:<7} {r['dtype']} w {_wdt(r)}{res} {mode}"
    if "error" in r:
        return f"{head}  error: {r['error'][:80]}"
    first = f"  (first call {r['first_call_s']:.2f} s)" if r.get("first_call_s", 0) > 1 else ""
    return (
        f"{head} {r['us']:9.1f} us {r['gbps']:7.0f} GB/s {r.get('pct_copy', 0):5.1f}% of copy"
        + first
    )


def table(result: dict) -> str:
    """A compact table: one line per shape (and weight dtype), one column per kernel (GB/s)."""
    rows = [r for r in result["rows"] if "gbps" in r]
    kernels = list(dict.fromkeys(r["kernel"] for r in result["rows"]))

    def key(r):
        return (r["M"], r["N"], _wdt(r), bool(r.get("residual")), r["graph"])

    cases = list(dict.fromkeys(key(r) for r in result["rows"]))
    width = max([13, *(len(k) + 1 for k in kernels)])
    head = f"{'M x N':>14} {'w':4} {'mode':9} " + " ".join(f"{k:>{width}}" for k in kernels)
    out = [
        f"{result['gpu']}  {result['date']}  copy {result['copy_gbps']:.0f} GB/s  (GB/s below;"
        " w: weight dtype; +res: with a residual)",
        head,
    ]
    for case in cases:
        M, N, w, res, g = case
        cells = []
        for k in kernels:
            hit = [r for r in rows if key(r) == case and r["kernel"] == k]
            cells.append(f"{hit[0]['gbps']:{width}.0f}" if hit else f"{'-':>{width}}")
        mode = ("graph" if g else "plain") + ("+res" if res else "")
        out.append(f"{M:>6}x{N:<7} {w:4} {mode:9} " + " ".join(cells))
    return "\n".join(out)


def _first_call_words(r: dict) -> str:
    if "error" in r:
        return r["error"][:80]
    words = f"first call {r['compile_s']:.2f} s, second {1e3 * r['second_call_s']:.2f} ms"
    if "fresh_s" in r:
        each = "/".join(f"{v:.2f}" for v in r["fresh_s"])
        words += f"; in fresh processes {each} s (median {r['fresh_median_s']:.2f})"
    return words


def host_table(result: dict) -> str:
    """The host costs of a run (``--overhead``): µs per tiny call, first-call seconds."""
    out = []
    for r in result.get("compile", []):
        what = _first_call_words(r)
        out.append(f"compile  {r['kernel']:<14} {r['M']}x{r['N']} w {r['weight_dtype']}: {what}")
    for r in result.get("overhead", []):
        what = f"{r['us_per_call']:.1f} us/call" if "error" not in r else r["error"][:80]
        out.append(
            f"overhead {r['kernel']:<14} {r['M']}x{r['N']} w {r['weight_dtype']}: {what}"
            + (
                f" (median of {len(r['us_rounds'])} rounds, {r['calls']} calls in all)"
                if r.get("us_rounds")
                else f" ({r['calls']} calls, one sync)"
            )
        )
    return "\n".join(out)


# --- the verdict: the acceptance criteria -------------------------------------------

#: (smallest N, largest N, % of the copy) that our kernel must reach, plain timing
COPY_BANDS = ((4096, 65536, 95.0), (131072, 262144, 93.0))


def _geomean(xs) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def _criterion(name: str, bad: list, n: int, extra: str = "") -> dict:
    """A criterion's line: N/A when nothing could be judged, FAIL with what failed."""
    if n == 0:
        return {"name": name, "status": "N/A", "detail": extra or "no rows to judge"}
    detail = f"{n - len(bad)}/{n} ok" + (f"; {extra}" if extra else "")
    if bad:
        detail += "; failing: " + ", ".join(bad)
    return {"name": name, "status": "FAIL" if bad else "PASS", "detail": detail}


def _shape(e) -> str:
    return f"{e['M']}x{e['N']}{' graph' if e['graph'] else ''}"


def verdict(
    rows,
    ours: str = "lib",
    quack: str = "quack",
    peers=PEERS,
    peer_margin: float = 0.015,
    geomean_min: float = 1.05,
    fp32_margin: float = 0.02,
    copy_bands=COPY_BANDS,
    residual_ns=(4096, 16384, 65536),
    residual_min: float = 1.0,
) -> dict:
    """Judge ``ours`` on the rows of one or several runs (GB/s ratios per case):

    * per weight dtype and shape (plain and graph rows separately): ours / QuACK, ours / the best
      peer (``peers`` present in the rows), % of copy;
    * geomean of ours / QuACK over the plain shapes (and over plain + graph rows, reported);
    * ours with fp32 weights / ours with bf16 weights, per shape where both ran.

    Criteria (the thresholds are the parameters): every shape >= best peer * (1 - peer_margin);
    geomean vs QuACK >= geomean_min per weight dtype; fp32 / bf16 weights >= 1 - fp32_margin
    (one-sided: faster is fine); % of copy >= the band's minimum, plain rows, per weight dtype;
    with a residual at ``residual_ns``, ours / QuACK >= residual_min (``fp32_margin`` None or
    ``residual_ns`` empty: that criterion is not judged). An error row of ours fails the shape;
    a criterion with no rows to judge is N/A."""
    last = {}  # the latest row per case and kernel (runs merged in order)
    for r in rows:
        last[(bool(r.get("residual")), _wdt(r), r["M"], r["N"], bool(r["graph"]), r["kernel"])] = r

    def row_gbps(r):
        return r.get("gbps") if r is not None else None

    def entries(residual: bool, wdt: str) -> list[dict]:
        out = []
        for (res, w, M, N, g, k), r in last.items():
            if (res, w, k) != (residual, wdt, ours):
                continue
            e = {"M": M, "N": N, "graph": g, "gbps": row_gbps(r), "pct_copy": r.get("pct_copy")}
            if "error" in r:
                e["error"] = r["error"][:120]
            q = row_gbps(last.get((res, w, M, N, g, quack)))
            e["quack_gbps"] = q
            e["vs_quack"] = e["gbps"] / q if q and e["gbps"] else None
            best = max(
                (
                    (row_gbps(last.get((res, w, M, N, g, p))) or 0, p)
                    for p in peers
                    if p != ours and row_gbps(last.get((res, w, M, N, g, p)))
                ),
                default=(None, None),
            )
            e["best_peer"], e["best_peer_gbps"] = best[1], best[0]
            e["vs_best_peer"] = e["gbps"] / best[0] if best[0] and e["gbps"] else None
            out.append(e)
        return sorted(out, key=lambda e: (e["graph"], e["N"], e["M"]))

    wdts = list(dict.fromkeys(w for (res, w, *_, k) in last if not res and k == ours))
    by_wdt, checks = {}, []
    for w in wdts:
        es = entries(False, w)
        plain = [e for e in es if not e["graph"]]
        g_plain = _geomean(e["vs_quack"] for e in plain)
        g_all = _geomean(e["vs_quack"] for e in es)
        by_wdt[w] = {"shapes": es, "geomean_vs_quack": g_plain, "geomean_vs_quack_all": g_all}

        judged = [e for e in es if e["best_peer"]]
        bad = [
            f"{_shape(e)} {e['vs_best_peer']:.3f}x {e['best_peer']}"
            if e["vs_best_peer"]
            else f"{_shape(e)} error"
            for e in judged
            if not e["vs_best_peer"] or e["vs_best_peer"] < 1 - peer_margin
        ]
        checks.append(
            _criterion(
                f"[w {w}] every shape >= best peer - {100 * peer_margin:g}%", bad, len(judged)
            )
        )

        judged = [e for e in plain if e["quack_gbps"]]
        errors = [f"{_shape(e)} error" for e in judged if not e["vs_quack"]]
        ok = g_plain is not None and g_plain >= geomean_min and not errors
        name = f"[w {w}] geomean vs QuACK >= {geomean_min:g}x (plain)"
        if not judged:
            checks.append(_criterion(name, [], 0))
        else:
            extra = f"{g_plain:.3f}x over {len(judged) - len(errors)} shapes" if g_plain else ""
            if g_all:
                extra += f" ({g_all:.3f}x with graph rows)"
            checks.append(
                {
                    "name": name,
                    "status": "PASS" if ok else "FAIL",
                    "detail": extra + ("; " + ", ".join(errors) if errors else ""),
                }
            )

        bad, n = [], 0
        for e in plain:
            band = [p for lo, hi, p in copy_bands if lo <= e["N"] <= hi]
            if not band:
                continue
            n += 1
            if not e["pct_copy"] or e["pct_copy"] < band[0]:
                got = f"{e['pct_copy']:.1f}%" if e["pct_copy"] else "error"
                bad.append(f"{_shape(e)} {got} < {band[0]:g}%")
        bands = ", ".join(f"{p:g}% at N {lo}-{hi}" for lo, hi, p in copy_bands)
        checks.append(_criterion(f"[w {w}] % of copy ({bands})", bad, n))

    ratios = []
    if "bf16" in by_wdt and "fp32" in by_wdt:
        b16 = {(e["M"], e["N"], e["graph"]): e for e in by_wdt["bf16"]["shapes"]}
        for e in by_wdt["fp32"]["shapes"]:
            other = b16.get((e["M"], e["N"], e["graph"]))
            if other is None:
                continue
            ratio = e["gbps"] / other["gbps"] if e["gbps"] and other["gbps"] else None
            ratios.append({"M": e["M"], "N": e["N"], "graph": e["graph"], "ratio": ratio})
            e["fp32_vs_bf16"] = ratio
    if fp32_margin is not None:  # None: reported, not judged
        bad = [
            f"{_shape(e)} {e['ratio']:.3f}" if e["ratio"] else f"{_shape(e)} error"
            for e in ratios
            if not e["ratio"] or e["ratio"] < 1 - fp32_margin
        ]
        name = f"fp32 weights within {100 * fp32_margin:g}% of bf16 weights"
        checks.append(_criterion(name, bad, len(ratios)))

    res_entries = {}
    for w in dict.fromkeys(w for (res, w, *_, k) in last if res and k == ours):
        res_entries[w] = entries(True, w)
    judged = [
        e
        for es in res_entries.values()
        for e in es
        if not e["graph"] and e["N"] in residual_ns and e["quack_gbps"]
    ]
    bad = [
        f"{_shape(e)} {e['vs_quack']:.3f}x" if e["vs_quack"] else f"{_shape(e)} error"
        for e in judged
        if not e["vs_quack"] or e["vs_quack"] < residual_min
    ]
    ns = ",".join(f"{n // 1024}K" for n in residual_ns)
    if residual_ns:  # (): no residual criterion
        name = f"residual >= {residual_min:g}x QuACK at N={ns}"
        checks.append(_criterion(name, bad, len(judged)))

    statuses = {c["status"] for c in checks}
    overall = "FAIL" if "FAIL" in statuses else "INCOMPLETE" if "N/A" in statuses else "PASS"
    return {
        "ours": ours,
        "quack": quack,
        "thresholds": {
            "peer_margin": peer_margin,
            "geomean_min": geomean_min,
            "fp32_margin": fp32_margin,
            "copy_bands": [list(b) for b in copy_bands],
            "residual_ns": list(residual_ns),
            "residual_min": residual_min,
        },
        "by_weight_dtype": by_wdt,
        "fp32_vs_bf16": ratios,
        "residual": res_entries,
        "checks": checks,
        "overall": overall,
    }


def format_verdict(v: dict) -> str:
    """The verdict as text: a line per shape, then PASS/FAIL/N/A per criterion."""
    ours = v["ours"]

    def ratio(x):
        return f"{x:6.3f}" if x else f"{'-':>6}"

    def lines(es):
        out = [
            f"  {'M x N':^14} {'mode':5} {ours + ' GB/s':>10} {'%copy':>6} {'/quack':>6}"
            f" {'/best peer':>10} {'(who)':<14} {'fp32/bf16 w':>11}"
        ]
        for e in es:
            got = f"{e['gbps']:10.0f}" if e["gbps"] else f"{'error':>10}"
            pct = f"{e['pct_copy']:6.1f}" if e.get("pct_copy") else f"{'-':>6}"
            out.append(
                f"  {e['M']:>6}x{e['N']:<7} {'graph' if e['graph'] else 'plain':5} {got} {pct}"
                f" {ratio(e['vs_quack'])} {ratio(e['vs_best_peer']):>10}"
                f" {e['best_peer'] or '-':<14} {ratio(e.get('fp32_vs_bf16')):>11}"
            )
        return out

    out = [f"Verdict for {ours} (GB/s ratios; the latest row of each case)"]
    for w, d in v["by_weight_dtype"].items():
        out.append(f"weights {w}:")
        out += lines(d["shapes"])
        gp, ga = d["geomean_vs_quack"], d["geomean_vs_quack_all"]
        out.append(
            f"  geomean vs QuACK: {ratio(gp).strip()} plain, {ratio(ga).strip()} with graph rows"
        )
    for w, es in v["residual"].items():
        out.append(f"with a residual, weights {w}:")
        out += lines(es)
    for c in v["checks"]:
        out.append(f"{c['status']:<4}  {c['name']}: {c['detail']}")
    out.append(f"overall: {v['overall']}")
    return "\n".join(out)


# --- plots and the command line -------------------------------------------------------------


def _colors(plt, kernels) -> dict:
    """A colour per kernel, kept in every panel: matplotlib's ten, or twenty (paired shades)
    for a longer ladder."""
    if len(kernels) <= 10:
        return {k: f"C{i}" for i, k in enumerate(kernels)}
    cmap = plt.get_cmap("tab20")
    return {k: cmap(i % 20) for i, k in enumerate(kernels)}


def pass_name(part: dict) -> str:
    return "backward" if part.get("pass") == "bwd" else "forward"


def plot(result: dict, path: str | None = None):
    """GB/s against N, one panel per weight dtype (and residual mode), copy ceiling dotted,
    graph rows dashed; a kernel keeps its colour in every panel. A record of both passes: the
    forward's panels above the backward's. Saved to ``path``, else the figure is returned."""
    plt = _pyplot()
    parts = passes(result)
    grid = [
        list(dict.fromkeys((_wdt(r), bool(r.get("residual"))) for r in p["rows"])) for p in parts
    ]
    ncols = max(len(g) for g in grid)
    fig, axes = plt.subplots(
        len(parts), ncols, figsize=(9 * ncols, 5 * len(parts)), squeeze=False, sharey=True
    )
    kernels = list(dict.fromkeys(r["kernel"] for p in parts for r in p["rows"]))
    colors = _colors(plt, kernels)
    for ax_row, part, panels in zip(axes, parts, grid, strict=True):
        for ax in ax_row[len(panels) :]:
            ax.set_visible(False)
        for ax, (w, res) in zip(ax_row, panels, strict=False):
            mine = [r for r in part["rows"] if (_wdt(r), bool(r.get("residual"))) == (w, res)]
            for g in sorted({r["graph"] for r in mine}):
                for k in kernels:
                    pts = sorted(
                        (r["N"], r["gbps"])
                        for r in mine
                        if r["kernel"] == k and r["graph"] == g and "gbps" in r
                    )
                    if pts:
                        ax.plot(
                            *zip(*pts, strict=True),
                            marker="o" if not g else "s",
                            color=colors[k],
                            ls="-" if not g else "--",
                            label=f"{k}{' (graph)' if g else ''}",
                        )
            copy = part["copy_gbps"]
            ax.axhline(copy, color="k", ls=":", label=f"D2D copy {copy:.0f} GB/s")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("N (row length)")
            ax.set_ylabel("GB/s")
            what = f"x {mine[0]['dtype']}, weights {w}" + (", with residual" if res else "")
            title = f"RMSNorm {pass_name(part)}, {what} - {part['gpu']}, {part['date']}"
            ax.set_title(title, fontsize=10)
            ax.legend(fontsize=8, ncol=2)
            ax.grid(alpha=0.3)
    return _finish(plt, fig, path)


def ladder_shape(result: dict) -> tuple[int, int]:
    """The shape ``plot_ladder`` shows: 32768 x 16384 when the run has it (QuACK's post's
    running example of a long row), else the largest N at which most kernels ran."""
    rows = [r for p in passes(result) for r in p["rows"] if "gbps" in r and not r["graph"]]
    shapes = {(r["M"], r["N"]) for r in rows}
    if (32768, 16384) in shapes:
        return 32768, 16384
    count = {s: len({r["kernel"] for r in rows if (r["M"], r["N"]) == s}) for s in shapes}
    return max(shapes, key=lambda s: (count[s], s[1]))


def ladder_order(kernels) -> list[str]:
    """Stages in lesson order, then the library, then the peers."""
    rank = {k: i for i, k in enumerate(STAGE_ORDER + BACKWARD_STAGES + tuple(LIBRARY))}
    return sorted(kernels, key=lambda k: (rank.get(split_name(k)[0], len(rank)), k))


def plot_ladder(result: dict, path: str | None = None, shape=None):
    """The ladder at one shape (``ladder_shape``): each kernel's plain GB/s as % of the run's
    copy, a bar per weight dtype, one panel per pass; stages in lesson order, then the
    library, then the peers. Saved to ``path``, else the figure is returned."""
    plt = _pyplot()
    M, N = shape or ladder_shape(result)
    parts = passes(result)
    fig, axes = plt.subplots(1, len(parts), figsize=(8 * len(parts), 5.5), squeeze=False)
    for ax, part in zip(axes[0], parts, strict=True):
        mine = [
            r
            for r in part["rows"]
            if (r["M"], r["N"]) == (M, N) and not r["graph"] and not r.get("residual")
        ]
        kernels = ladder_order(dict.fromkeys(r["kernel"] for r in mine))
        wdts = list(dict.fromkeys(_wdt(r) for r in mine))
        width = 0.8 / max(1, len(wdts))
        for j, w in enumerate(wdts):
            pct = []
            for k in kernels:
                hit = [r for r in mine if r["kernel"] == k and _wdt(r) == w and "gbps" in r]
                pct.append(100 * hit[0]["gbps"] / part["copy_gbps"] if hit else 0.0)
            xs = [i + (j - (len(wdts) - 1) / 2) * width for i in range(len(kernels))]
            bars = ax.bar(xs, pct, width, label=f"weights {w}", color=f"C{j}")
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.axhline(100, color="k", ls=":", label=f"D2D copy {part['copy_gbps']:.0f} GB/s")
        ax.set_xticks(range(len(kernels)), kernels, rotation=30, ha="right")
        ax.set_ylim(0, 118)  # room above the bars for the legend
        ax.set_ylabel("% of the copy's GB/s")
        ax.set_title(
            f"RMSNorm {pass_name(part)}, {M} x {N}, x {part['dtype']} - {part['gpu']}, "
            f"{part['date']}",
            fontsize=10,
        )
        ax.legend(fontsize=8, loc="upper center", ncol=3)
        ax.grid(alpha=0.3, axis="y")
    return _finish(plt, fig, path)


#: the baseline of ``plot_speedup``: RMSNorm as model code writes it in PyTorch ops, else
#: PyTorch's fused ``F.rms_norm``
SPEEDUP_BASES = ("torch-ops", "torch-eager")


def speedups(part: dict, base: str | None = None) -> tuple[str, list[dict]]:
    """(the base, [{kernel, N, weight_dtype, speedup}]) of one pass's plain rows: each
    kernel's time against the base's at the same shape and weight dtype."""
    rows = [r for r in part["rows"] if "us" in r and not r["graph"] and not r.get("residual")]
    have = {r["kernel"] for r in rows}
    base = base or next((b for b in SPEEDUP_BASES if b in have), None)
    if base is None:
        return "", []
    ref = {(r["N"], _wdt(r)): r["us"] for r in rows if r["kernel"] == base}
    out = [
        {"kernel": r["kernel"], "N": r["N"], "weight_dtype": _wdt(r),
         "speedup": ref[(r["N"], _wdt(r))] / r["us"]}
        for r in rows
        if r["kernel"] != base and (r["N"], _wdt(r)) in ref
    ]  # fmt: skip
    return base, out


def plot_speedup(result: dict, path: str | None = None):
    """Speed-up over PyTorch (``SPEEDUP_BASES``) against N, as QuACK's README reports it: a
    line per kernel, a row of panels per pass, a panel per weight dtype. Saved to ``path``,
    else the figure is returned."""
    plt = _pyplot()
    parts = passes(result)
    grid = [[(p, w) for w in dict.fromkeys(_wdt(r) for r in p["rows"])] for p in parts]
    ncols = max(len(g) for g in grid)
    fig, axes = plt.subplots(len(parts), ncols, figsize=(8 * ncols, 5 * len(parts)), squeeze=False)
    kernels = ladder_order(dict.fromkeys(r["kernel"] for p in parts for r in p["rows"]))
    colors = _colors(plt, kernels)
    for ax_row, panels in zip(axes, grid, strict=True):
        for ax in ax_row[len(panels) :]:
            ax.set_visible(False)
        for ax, (part, w) in zip(ax_row, panels, strict=False):
            _speedup_panel(ax, part, w, kernels, colors)
    return _finish(plt, fig, path)


def _speedup_panel(ax, part: dict, w: str, kernels, colors) -> None:
    """One panel of ``plot_speedup``: one pass, one weight dtype."""
    from matplotlib.ticker import FuncFormatter

    base, ups = speedups(part)
    for k in kernels:
        pts = sorted(
            (u["N"], u["speedup"]) for u in ups if u["kernel"] == k and u["weight_dtype"] == w
        )
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", color=colors[k], label=k)
    ax.axhline(1, color="k", ls=":", label=base or "no PyTorch row")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_xlabel("N (row length)")
    ax.set_ylabel(f"speed-up over {base}")
    ax.set_title(f"RMSNorm {pass_name(part)}, weights {w} - {part['gpu']}", fontsize=10)
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3, which="both")


def plot_all(result: dict, path: str) -> list[str]:
    """``plot`` into ``path``; a record of both passes also gets its ladder and its speed-ups
    (``<stem>_ladder.png``, ``<stem>_speedup.png``); a model benchmark's record its own plot.
    Returns the paths written."""
    if result.get("kind") == "model_bench":
        from .model_bench import plot as plot_model

        plot_model(result, path)
        return [path]
    plot(result, path)
    if result.get("pass") != "both":
        return [path]
    stem, ext = os.path.splitext(path)
    more = [f"{stem}_ladder{ext}", f"{stem}_speedup{ext}"]
    plot_ladder(result, more[0])
    plot_speedup(result, more[1])
    return [path, *more]


def parse_shapes(text: str):
    return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s]


def summarize(paths, ours: str = "lib", png: str | None = None, **thresholds) -> str:
    """The tables of recorded runs and a verdict per pass over all their rows (later files
    win); a record of both passes counts as its two. ``png``: the plots of the rows
    (``plot_all``: with both passes, the ladder and the speed-ups too)."""
    records = [json.loads(open(p).read()) for p in paths]
    out, by_pass = [], {}
    for p, res in zip(paths, records, strict=True):
        for part in passes(res):
            pass_ = part.get("pass", "fwd")
            out += [f"== {p}" + (f" ({pass_name(part)})" if res.get("pass") == "both" else ""),
                    table(part)]  # fmt: skip
            if part.get("compile") or part.get("overhead"):
                out.append(host_table(part))
            by_pass.setdefault(pass_, []).append(part)
    merged = {}
    for pass_, parts in by_pass.items():
        rows = [r for part in parts for r in part["rows"]]
        if len(by_pass) > 1:
            out.append(f"== verdict of the {pass_name(parts[0])}")
        out.append(
            format_verdict(verdict(rows, ours=ours, **{**thresholds_for(pass_), **thresholds}))
        )
        merged[pass_] = {**parts[0], "rows": rows}
    if png:
        both = len(merged) > 1
        plot_all(
            {**merged["fwd"], "pass": "both", **merged} if both else next(iter(merged.values())),
            png,
        )
    return "\n".join(out)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--model" in argv:  # the model benchmark has its own flags
        from .model_bench import main as model_main

        return model_main([v for v in argv if v != "--model"])
    p = argparse.ArgumentParser(prog="quack-edu bench", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model",
        action="store_true",
        help="the model benchmark instead: a decoder with each RMSNorm, eager and compiled "
        "(quack-edu bench --model -h; quack_edu.tools.model_bench)",
    )
    p.add_argument(
        "--stages",
        default="all",
        help="comma-separated kernels; 'all' among them is every stage of the pass (naive ... "
        "final forward, final_bwd backward); stage@variant (a stage's VARIANTS, e.g. "
        "cluster@hold) and stage#k (the k-th of its configs(N)) are kernels too, and so are lib "
        "(quack_edu.rmsnorm's rmsnorm_fwd / rmsnorm_bwd) and lib-tuned (their autotuned forms)",
    )
    p.add_argument("--shapes", default=None, help="e.g. 32768x4096,8192x262144 (default: sweep)")
    p.add_argument(
        "--pass",
        dest="pass_",
        choices=("fwd", "bwd", "both"),
        default="fwd",
        help="the forward, the backward (dx and dw from x, dout, rstd: the library's "
        "rmsnorm_bwd against QuACK's and autograd's), or both in one record (the copy measured "
        "once, lib timed in each; --png also writes the ladder and the speed-ups over PyTorch)",
    )
    p.add_argument("--dtype", default="bf16")
    p.add_argument(
        "--weight-dtype",
        default="same",
        help="the weight's dtype, or a list of them timed in one run: bf16,fp32 (same: x's)",
    )
    p.add_argument(
        "--peers",
        nargs="?",
        const="all",
        default=None,
        help="also time peers: all (those installed) or a list of " + ",".join(PEERS),
    )
    p.add_argument(
        "--residual",
        action="store_true",
        help="the pre-norm benchmark: (x + residual) normalised, residual_out written too "
        "(default shapes 32768x{4096,16384,65536})",
    )
    p.add_argument("--graph", action="store_true", help="also time through CUDA graphs")
    p.add_argument("--graph-max-n", type=int, default=None, help="graph timing only up to this N")
    p.add_argument(
        "--max-n", default="naive=16384", help="kernel=N,...: skip a kernel above that N"
    )
    p.add_argument(
        "--overhead",
        action="store_true",
        help="also the host cost per tiny call (M=1,8 N=1024, 2000 calls) and the first-call "
        "(compile) time of the library at --compile-n (of the pass timed: --pass bwd, the "
        "backward's)",
    )
    p.add_argument("--compile-n", default="3000,5000", help="row lengths of the first-call timing")
    p.add_argument("--ours", default="lib", help="the kernel the verdict judges")
    p.add_argument(
        "--rep-budget", type=float, default=0.5, help="seconds of timed calls per row (at most)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time every kernel of a shape this many times, in turn, and keep each one's median: "
        "launch-bound rows measure the host too, whose speed moves, so kernels are then "
        "compared at the same moments (the recorded sweeps use 3)",
    )
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None)
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar on stderr (default: when stderr is a terminal)",
    )
    p.add_argument(
        "--summarize",
        nargs="+",
        default=None,
        metavar="JSON",
        help="print the tables and one verdict of recorded runs (no GPU); --png plots them",
    )
    p.add_argument("--first-call-child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.first_call_child:
        return first_call_child(a.first_call_child)
    if a.summarize:
        print(summarize(a.summarize, ours=a.ours, png=a.png))
        return 0
    if not torch.cuda.is_available():
        from ..lessons.results import results_dir

        ladder = results_dir() / "ladder.json"
        print(
            "bench needs a CUDA GPU, and PyTorch sees none here. The results recorded on an "
            f"H200 are in {results_dir()}/ (the whole ladder: {ladder.name}); print one with\n"
            f"    quack-edu bench --summarize {ladder}",
            file=sys.stderr,
        )
        return 2
    from ..runtime import torch_dtype

    every = {"fwd": STAGE_ORDER, "bwd": BACKWARD_STAGES, "both": STAGE_ORDER + BACKWARD_STAGES}
    stages = [s for name in a.stages.split(",") if name
              for s in (every[a.pass_] if name == "all" else [name])]  # fmt: skip
    default = RESIDUAL_SHAPES if a.residual else DEFAULT_SHAPES
    shapes = parse_shapes(a.shapes) if a.shapes else default
    max_n = {k: int(v) for k, v in (kv.split("=") for kv in a.max_n.split(",") if kv)}

    def save(result):  # after every row, so that a run cut short still leaves its numbers
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)

    runner = run_both if a.pass_ == "both" else functools.partial(run, pass_=a.pass_)
    result = runner(
        stages,
        shapes,
        dtype=torch_dtype(a.dtype),
        peers=a.peers,
        graph=a.graph,
        graph_max_n=a.graph_max_n,
        max_n=max_n,
        on_row=save,
        weight_dtypes=parse_weight_dtypes(a.weight_dtype),
        residual=a.residual,
        overhead=a.overhead,
        ours=a.ours,
        budget_s=a.rep_budget,
        compile_ns=[int(n) for n in a.compile_n.split(",") if n],
        meta={"command": " ".join(["quack-edu bench", *(argv or sys.argv[1:])])},
        rounds=a.rounds,
        progress=sys.stderr.isatty() if a.progress is None else a.progress,
    )
    save(result)
    if a.png:
        for path in plot_all(result, a.png):
            print(f"wrote {path}")
    for part in passes(result):
        if result.get("pass") == "both":
            print(f"\n=== {pass_name(part)}")
        print(table(part))
        if a.overhead:
            print(host_table(part))
        print(format_verdict(part["verdict"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
