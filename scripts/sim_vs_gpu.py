#!/usr/bin/env python3
"""ptxsim against the GPU: every simulated kernel run on both, on the same inputs, one call.

    source .gpu/env.sh; python3 scripts/sim_vs_gpu.py --out $OUT/sim_vs_gpu.json [--jobs 14]

Cases (``cases()``): every stage ptxsim runs (``ptxsim.SIMULATED_STAGES``: naive ... final's
plain forward; and the backward, final_bwd's kernel then PartialSum: dx and dw), at its plans
(forced 2- and 4-CTA clusters, 1/2/4 commit groups, the final kernel's weight in registers, two
row blocks in two buffers), and every exercise whose kernel the grader simulates (a "values on
the CPU" check), built as the grader builds it: the exercise's hole (``grading.holes``) holding
the answer of its solution notebook, with the config of the exercise's gpu values check
(01.scale_kernel, no RMSNorm, in its own launch: ``run_scale``, a vector of N, y compared past N
too). Each kernel at M = 1, 3, 7 and row lengths that are ragged and not powers of two where the
stage allows (the naive stage any N; the vectorised ones a multiple of the 16-byte vector), x in
bf16, fp16 and fp32 with weights of every dtype beside them; the inputs are the grader's
(``sim_values.cpu_inputs``: rows at very different scales, a zero row, a row at eps's scale) and
y is poisoned before each launch.

Per kernel (a worker of a process pool: ``--jobs``), one compile (``runtime.compile_kernel``
with ``--keep-ptx``): the compiled function runs on the GPU, and its own PTX runs in ptxsim
(the backward: the library's launch, ``FinalBwdRMSNorm.launch`` then ``sum_partials``, against
``ptxsim.run_bwd``, which compiles the same kernels for sm_90a).
Per case the record holds the largest absolute and relative difference, whether the outputs are
equal bit for bit, the first differing element, and each side's agreement with ``rmsnorm_ref``.
A difference is within fp32 rounding (``compare``) when every element differs by at most one
step of the output dtype where the two values lie (a rounding of the fp32 result that another
order of fp32 operations, or the hardware's rsqrt.approx, can flip) plus 2**-20 of the value;
in the backward, 2**-20 of the magnitudes of the terms the element sums (``bwd_terms``: its
PTX's unrounded mul/add, which ptxas may fuse, against ptxsim's rounding of each; the first
H100 run, 2026-12-06, had 15 of 900 cases beyond the value's bound, all fp32 dx, by at most
0.004 of the terms' bound at the first such element of each).
The record (``--out``) is rewritten after every kernel, so an interrupted run leaves what it
did; each case's failure (a compile, a launch, the simulator) is recorded, not raised.

Exit status: 0 when every case ran and agrees within fp32 rounding; 1 when some case differs
beyond it; 2 when some case could not run (an error, the deadline). ``--fake-gpu`` runs the
whole script without a GPU, the "GPU" side being ptxsim again in the reversed order (a dry run
of the cases; its record says so). ~300 kernels, each compiled in ~1 s of a core, over 14
processes (a dry run, ``--fake-gpu``, on 2 busy cores: 279 forward kernels in 8 minutes).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import functools
import json
import math
import multiprocessing
import os
import platform
import sys
import tempfile
import time
import traceback
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EPS = 1e-6
MS = (1, 3, 7)
#: (x dtype, weight dtype): every dtype, and weights of another dtype beside each
DTYPES = (
    ("bf16", "bf16"),
    ("fp16", "fp16"),
    ("fp32", "fp32"),
    ("bf16", "fp32"),
    ("fp16", "bf16"),
    ("fp32", "bf16"),
)
#: a plan's other dtype pairs (its first plan has every pair)
FEW_DTYPES = (("bf16", "bf16"), ("fp32", "fp32"), ("fp16", "fp32"))
#: relative part of the fp32-rounding bound: a few fp32 ulps of the value (rsqrt.approx is
#: within 2**-22.9 of 1/sqrt, PTX ISA; the GPU and ptxsim may round the sum's adds apart)
FP32_REL = 2.0**-20

#: stage -> [(plan, row lengths)]: the first plan in every dtype pair, the others in FEW_DTYPES
STAGE_PLANS = {
    "naive": [("default", (37, 129, 301))],  # scalar accesses: any N
    "warp": [("default", (64, 136, 1000, 1544))],  # 8 lanes a row at 64; 125 vectors at 1000
    "block": [("default", (1000, 2040))],
    "cluster": [("2 CTAs", (1000, 2040)), ("4 CTAs", (2040,))],
    "cpasync": [("default", (1000, 2000)), ("4 groups", (2000,)), ("2 CTAs 2 groups", (1000,))],
    "final": [
        ("default", (1000, 1001, 3000)),  # 1001: any N (narrower vectors)
        ("2 CTAs", (2048,)),
        ("2 groups", (1000,)),
        ("weight in registers", (1000,)),
        ("2 blocks 2 buffers", (1000,)),
    ],
}
#: the backward (``ptxsim.run_bwd``: the final_bwd kernel, then PartialSum; dx and dw compared)
BACKWARD_PLANS = [("default", (1000, 1001, 2048)), ("2 CTAs", (2048,))]
#: exercise -> (its hole in ``grading.holes``, the plan of its gpu values check, row lengths)
EXERCISES = {
    "01.sum_squares": ("SUM_HOLE", "default", (37, 301)),
    "01.rstd": ("RSTD_HOLE", "default", (37, 301)),
    "02.warp_reduce": ("REDUCE_HOLE", "default", (64, 1000)),
    "02.tv_layout": ("COPY_HOLE", "default", (136, 1000)),
    "02.warp_kernel": ("WARP_KERNEL_HOLE", "02 one pass", (64, 1000, 1544)),
    "03.block_reduce": ("BLOCK_HOLE", "default", (1000, 2040)),
    "03.block_kernel": ("BLOCK_KERNEL_HOLE", "03 one pass", (1000, 3000)),
    "04.cluster_kernel": ("CLUSTER_KERNEL_HOLE", "04 exchange", (1000, 3000)),
    "05.g2s_atom": ("ATOM_HOLE", "default", (1000, 2000)),
    "05.wait_groups": ("WAIT_HOLE", "05 four stages", (1000, 2000)),
    "05.pipeline": ("PIPE_HOLE", "05 four stages", (1000, 2000)),
    "06.persistent_kernel": ("PERSISTENT_KERNEL_HOLE", "03 one pass", (1000, 3000)),
    "08.pdl_kernel": ("PDL_KERNEL_HOLE", "03 one pass", (1000, 3000)),
}

#: exercises whose kernel is not an RMSNorm, run by their own runner: 01.scale_kernel's answer in
#: the exercise's launch (``lessons.evidence.scale_launch``: x, y, a factor; one vector, its
#: own M of 1), the PTX its compile-tier check simulates against the function its gpu check runs
SCALE = {"01.scale_kernel": ((8, 1000, 4104, 5000), ("bf16", "fp16"))}
SCALE_FACTOR = 2.5

#: an exercise's plan -> the config function of its gpu values check (module, name)
EXERCISE_PLANS = {
    "02 one pass": ("lesson02", "one_pass_config"),
    "03 one pass": ("lesson03", "one_pass_config"),
    "04 exchange": ("lesson04", "exchange_config"),
    "05 four stages": ("lesson05", "four_stages"),
}


@dataclass(frozen=True)
class Spec:
    """One kernel: a stage's (``kind`` "stage", ``name`` the stage) or an exercise's solution
    in its hole (``kind`` "exercise", ``name`` its id), for rows of N, at a plan (a config)."""

    kind: str
    name: str
    plan: str
    N: int
    dtype: str
    wdtype: str

    @property
    def label(self) -> str:
        return f"{self.name} [{self.plan}] N={self.N} x {self.dtype} w {self.wdtype}"


def cases() -> list[Spec]:
    """Every kernel the comparison runs (each at M = ``MS``)."""
    out = []
    for stage, plans in STAGE_PLANS.items():
        for i, (plan, Ns) in enumerate(plans):
            for xd, wd in DTYPES if i == 0 else FEW_DTYPES:
                out += [Spec("stage", stage, plan, N, xd, wd) for N in Ns]
    for i, (plan, Ns) in enumerate(BACKWARD_PLANS):
        for xd, wd in DTYPES if i == 0 else FEW_DTYPES:
            out += [Spec("backward", "final_bwd", plan, N, xd, wd) for N in Ns]
    for ex, (_, plan, Ns) in EXERCISES.items():
        for xd, wd in DTYPES:
            out += [Spec("exercise", ex, plan, N, xd, wd) for N in Ns]
    for ex, (Ns, dts) in SCALE.items():
        out += [Spec("scale", ex, "01 launch", N, dt, "none") for dt in dts for N in Ns]
    return out


def ms_of(spec: Spec) -> tuple[int, ...]:
    """The M a spec runs at (a scale kernel's vector is one row)."""
    return (1,) if spec.kind == "scale" else MS


def shapes(specs) -> list[tuple[int, int]]:
    """The distinct (M, N) the specs run."""
    return sorted({(M, s.N) for s in specs for M in ms_of(s)})


# ---- configs and kernels (in a worker) -----------------------------------------------------------
def _config(stage: str, plan: str, N: int, dt):
    from dataclasses import replace

    from quack_edu.stages import get_stage

    if plan == "default":
        return get_stage(stage).default_config(N, dt)
    if plan in EXERCISE_PLANS:
        import importlib

        module, fn = EXERCISE_PLANS[plan]
        return getattr(importlib.import_module(f"quack_edu.grading.exercises.{module}"), fn)(N, dt)
    if plan.endswith(" CTAs") and stage == "cluster":
        from quack_edu.stages.cluster import forced_cluster

        return forced_cluster(N, dt, int(plan.split()[0]))
    if stage == "cpasync":
        from quack_edu.stages.cluster import forced_cluster
        from quack_edu.stages.cpasync import cpasync_config

        groups = {"4 groups": 4, "2 CTAs 2 groups": 2}[plan]
        base = forced_cluster(N, dt, 2, max_vecs=16) if "CTAs" in plan else cpasync_config(N, dt)
        return replace(base, stages=groups)
    if stage == "final_bwd":
        from quack_edu.stages.final_bwd import default_config

        return replace(default_config(N, dt), **({"cluster_n": 2} if plan == "2 CTAs" else {}))
    if stage == "final":
        changes = {
            "2 CTAs": dict(cluster_n=2),
            "2 groups": dict(stages=2),
            "weight in registers": dict(weight_in_smem=False),
            "2 blocks 2 buffers": dict(blocks_per_cta=2, buffers=2),
        }[plan]
        return replace(get_stage("final").default_config(N, dt), **changes)
    raise ValueError(f"no plan {plan!r} for {stage}")


@functools.cache
def _answer(ex_id: str):
    """The answer of the exercise's solution notebook, executed as the grader executes one."""
    from quack_edu.grading import get
    from quack_edu.grading.nbfiles import answer_from_source
    from quack_edu.grading.notebook import exercise_source, read, solutions_dir

    ex = get(ex_id)
    source = exercise_source(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex)
    return answer_from_source(source, ex.answer)


def kernel_of(spec: Spec):
    """The kernel object of a spec (a stage's class, or the hole's subclass with the answer)."""
    from quack_edu.grading import holes
    from quack_edu.runtime import torch_dtype
    from quack_edu.stages import get_stage

    dt, wdt = torch_dtype(spec.dtype), torch_dtype(spec.wdtype)
    if spec.kind == "backward":
        from quack_edu.stages.final_bwd import FinalBwdRMSNorm

        return FinalBwdRMSNorm(dt, spec.N, _config("final_bwd", spec.plan, spec.N, dt), wdt)
    if spec.kind == "stage":
        cfg = _config(spec.name, spec.plan, spec.N, dt)
        return get_stage(spec.name).KERNEL(dt, spec.N, cfg, wdt)
    hole = getattr(holes, EXERCISES[spec.name][0])
    cfg = _config(hole.stage, spec.plan, spec.N, dt)
    return hole.kernel(_answer(spec.name), spec.N, dt, cfg, wdt)


def compile_with_ptx(kernel):
    """(fn(x, w, out, eps), PTX text): one compile, its function and its own PTX."""
    from quack_edu.runtime import compile_kernel
    from quack_edu.tools.inspect import _read_artifact

    with tempfile.TemporaryDirectory(prefix="sim_vs_gpu_") as tmp:
        fn = compile_kernel(kernel, f"--keep-ptx --dump-dir {tmp}")
        ptx = _read_artifact(fn.__ptx__)
    return fn, ptx


def gpu_run(fn, x, w, out, eps):
    """y from the compiled function on the GPU (inputs copied there), back on the CPU."""
    import torch

    xc, wc, oc = x.cuda(), w.cuda(), out.cuda()
    fn(xc, wc, oc, float(eps))
    torch.cuda.synchronize()
    return oc.cpu()


def fake_gpu_run(ptx, kernel):
    """The "GPU" of a dry run: ptxsim again, the threads a warp at a time in reversed order."""
    from quack_edu.ptxsim.stages import run_ptx

    return lambda fn, x, w, out, eps: run_ptx(ptx, kernel, x, w, eps, out=out, order="reversed")


# ---- comparing --------------------------------------------------------------------------------
def _bits(t):
    import torch

    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def step_of(v, dtype):
    """One step of ``dtype`` (its spacing) where each |v| lies: the larger binade's, the
    subnormals' spacing below the normal range (fp32 subnormals flushed: 2**-126)."""
    import torch

    info = torch.finfo(dtype)
    _, e = torch.frexp(v.abs().double().clamp_min(info.tiny))  # v = m * 2**e, m in [0.5, 1)
    return torch.ldexp(torch.ones_like(v, dtype=torch.float64), e - 1) * info.eps


def compare(gpu, sim, ref=None, terms=None) -> dict:
    """How ptxsim's output ``sim`` differs from the GPU's ``gpu`` (same shape and dtype):
    ``status`` "bitwise", "fp32 rounding" (every element within one step of the output dtype
    plus FP32_REL of the value; for fp32 outputs the latter alone), or "differs"; the largest
    absolute and relative differences, the count of elements whose bits differ, the first
    differing element; with ``ref`` (rmsnorm_ref), whether each side is within the tolerance
    table of it. NaN against a number differs; NaN against NaN is equal. ``terms``: where an
    element is a sum whose terms cancel (the backward's), the sum of its terms' magnitudes
    (``bwd_terms``): FP32_REL is taken of that, not of the value."""
    import torch

    from quack_edu.reference import TOLERANCES

    a, b = gpu.double(), sim.double()
    both_nan = a.isnan() & b.isnan()
    d = (a - b).abs().masked_fill(both_nan, 0).nan_to_num(math.inf, math.inf, math.inf)
    mag = torch.maximum(a.abs(), b.abs()).nan_to_num(0.0, math.inf, math.inf)
    if terms is not None:
        mag = torch.maximum(mag, terms.double())
    allowed = FP32_REL * mag
    if gpu.dtype != torch.float32:
        allowed = allowed + step_of(mag, gpu.dtype)
    else:
        allowed = allowed + 2.0**-126
    differ = _bits(gpu) != _bits(sim)
    rel = d / a.abs().clamp_min(torch.finfo(torch.float32).tiny)
    rel = rel.masked_fill(d == 0, 0).nan_to_num(math.inf, math.inf, math.inf)
    beyond = d > allowed
    out = {
        "status": "bitwise"
        if not bool(differ.any())
        else ("differs" if bool(beyond.any()) else "fp32 rounding"),
        "bitwise": not bool(differ.any()),
        "max_abs": float(d.max()) if d.numel() else 0.0,
        "max_rel": float(rel.max()) if rel.numel() else 0.0,
        "n_bits_differ": int(differ.sum()),
        "n_beyond_fp32_rounding": int(beyond.sum()),
        "first_difference": None,
    }
    if bool(differ.any()):
        idx = (beyond if bool(beyond.any()) else differ).nonzero()[0].tolist()
        out["first_difference"] = {
            "index": idx,
            "gpu": float(a[tuple(idx)]),
            "sim": float(b[tuple(idx)]),
        }
    if ref is not None:
        tol = TOLERANCES[gpu.dtype]
        out["gpu_matches_ref"] = bool(torch.isclose(gpu.float(), ref.float(), **tol).all())
        out["sim_matches_ref"] = bool(torch.isclose(sim.float(), ref.float(), **tol).all())
    return out


# ---- one kernel, every M ----------------------------------------------------------------------
def run_spec(spec: Spec, fake_gpu: bool = False) -> list[dict]:
    """Every M of one spec: a record per case (``status`` "error" with the reason where a
    step failed; never raises)."""
    import torch

    from quack_edu.grading.checks import POISON
    from quack_edu.grading.sim_values import cpu_inputs
    from quack_edu.ptxsim.stages import run_ptx
    from quack_edu.reference import rmsnorm_ref
    from quack_edu.runtime import torch_dtype

    base = asdict(spec)
    if spec.kind == "backward":
        return run_backward(spec, fake_gpu)
    if spec.kind == "scale":
        return run_scale(spec, fake_gpu)
    t0 = time.perf_counter()
    try:
        kernel = kernel_of(spec)
        fn, ptx = compile_with_ptx(kernel)
        config = repr(kernel.config)
    except Exception as e:  # noqa: BLE001 (recorded: the comparison goes on)
        return [{**base, "M": M, "status": "error", "error": _why("compile", e)} for M in MS]
    run_gpu = fake_gpu_run(ptx, kernel) if fake_gpu else gpu_run
    compile_s = time.perf_counter() - t0
    dt, wdt = torch_dtype(spec.dtype), torch_dtype(spec.wdtype)
    records = []
    for M in MS:
        rec = {**base, "M": M, "config": config, "compile_s": round(compile_s, 3)}
        try:
            gen = torch.Generator().manual_seed(zlib.crc32(f"{spec.label} M={M}".encode()))
            x, w = cpu_inputs(M, spec.N, dt, wdt, gen)
            out = torch.full_like(x, POISON)
            t = time.perf_counter()
            y_gpu = run_gpu(fn, x, w, out.clone(), EPS)
            rec["gpu_s"] = round(time.perf_counter() - t, 4)
            t = time.perf_counter()
            y_sim = run_ptx(ptx, kernel, x, w, EPS, out=out.clone())
            rec["sim_s"] = round(time.perf_counter() - t, 4)  # the simulator's cost, not a timing
            rec.update(compare(y_gpu, y_sim, rmsnorm_ref(x, w, eps=EPS)))
        except Exception as e:  # noqa: BLE001
            rec.update(status="error", error=_why("run", e))
        records.append(rec)
    return records


def run_scale(spec: Spec, fake_gpu: bool = False) -> list[dict]:
    """01.scale_kernel's solution as its checks build it: the PTX of the exercise's launch
    (``scale_ptx``, what the compile tier simulates) run by ``scale_simulated`` against the
    function of the same launch (``scale_launcher``, what the gpu tier runs) on the GPU; x and
    y whole tiles long, y poisoned, so what lies past N is compared too."""
    import torch

    from quack_edu.grading.checks import POISON
    from quack_edu.grading.probes.lesson01b_02 import scale_launcher
    from quack_edu.lessons.evidence import SCALE_TILE, scale_ptx, scale_simulated
    from quack_edu.runtime import torch_dtype

    rec = {**asdict(spec), "M": 1}
    try:
        t = time.perf_counter()
        answer = _answer(spec.name)
        ptx = scale_ptx(answer, spec.N, spec.dtype)
        fn = None if fake_gpu else scale_launcher(answer, spec.N, spec.dtype)
        rec["compile_s"] = round(time.perf_counter() - t, 3)
        dt = torch_dtype(spec.dtype)
        padded = -(-spec.N // SCALE_TILE) * SCALE_TILE
        gen = torch.Generator().manual_seed(zlib.crc32(spec.label.encode()))
        x = torch.randn(padded, generator=gen).to(dt)
        y = torch.full_like(x, POISON)

        t = time.perf_counter()
        if fake_gpu:
            y_gpu = scale_simulated(ptx, x, y, SCALE_FACTOR, order="reversed")
        else:
            xc, yc = x.cuda(), y.clone().cuda()
            fn(xc[: spec.N], yc[: spec.N], SCALE_FACTOR)
            torch.cuda.synchronize()
            y_gpu = yc.cpu()
        rec["gpu_s"] = round(time.perf_counter() - t, 4)
        t = time.perf_counter()
        y_sim = scale_simulated(ptx, x, y, SCALE_FACTOR)
        rec["sim_s"] = round(time.perf_counter() - t, 4)  # the simulator's cost, not a timing
        ref = y.clone()
        ref[: spec.N] = (x[: spec.N].float() * SCALE_FACTOR).to(dt)
        rec.update(compare(y_gpu, y_sim, ref))
    except Exception as e:  # noqa: BLE001 (recorded: the comparison goes on)
        rec.update(status="error", error=_why("run", e))
    return [rec]


def bwd_terms(x, w, dout, rstd):
    """The magnitudes of the terms each backward output sums, in fp64: for dx, with g = dout*w
    and x_hat = x*rstd, dx = rstd*(g - x_hat*mean(g*x_hat)) sums rstd*|g| and
    rstd*|x_hat|*mean|g*x_hat|; dw sums |dout*x_hat| over the rows. The backward's PTX
    leaves its ``mul.f32`` / ``add.f32`` / ``sub.f32`` unrounded (no ``.rn``), which ptxas may
    fuse into one FFMA; ptxsim rounds each: a difference of an fp32 step of a term, which the
    terms' cancellation can make larger than a step of the result."""
    xd, wd, gd = x.double(), w.double(), dout.double()
    r = rstd.double().unsqueeze(-1)
    x_hat = xd * r
    g = gd * wd
    dx = r * (g.abs() + x_hat.abs() * (g * x_hat).abs().mean(-1, keepdim=True))
    return dx, (gd * x_hat).abs().sum(0)


def run_backward(spec: Spec, fake_gpu: bool = False) -> list[dict]:
    """``run_spec`` for the backward: dx and dw of the library's launch on the GPU (its
    kernel, then PartialSum) against ``ptxsim.run_bwd``'s, both from the same x, weight, dout
    and rstd; the case's status is the worse of the two comparisons."""
    import torch

    from quack_edu.grading.sim_values import cpu_inputs
    from quack_edu.ptxsim import run_bwd
    from quack_edu.reference import rmsnorm_bwd_ref
    from quack_edu.runtime import torch_dtype

    dt, wdt = torch_dtype(spec.dtype), torch_dtype(spec.wdtype)
    records = []
    for M in MS:
        rec = {**asdict(spec), "M": M}
        try:
            kernel = kernel_of(spec)
            rec["config"] = repr(kernel.config)
            gen = torch.Generator().manual_seed(zlib.crc32(f"{spec.label} M={M}".encode()))
            x, w = cpu_inputs(M, spec.N, dt, wdt, gen)
            dout = torch.randn(M, spec.N, generator=gen).to(dt)
            rstd = torch.rsqrt(x.float().pow(2).mean(-1) + EPS)
            t = time.perf_counter()
            if fake_gpu:
                got = run_bwd(x, w, dout, rstd, kernel.config, order="reversed")
            else:
                got = _bwd_on_gpu(x, w, dout, rstd, kernel.config)
            rec["gpu_s"] = round(time.perf_counter() - t, 4)
            t = time.perf_counter()
            sim = run_bwd(x, w, dout, rstd, kernel.config)
            rec["sim_s"] = round(time.perf_counter() - t, 4)  # the simulator's cost, not a timing
            ref_dx, ref_dw, _ = rmsnorm_bwd_ref(x, w, dout, rstd)
            dx_terms, dw_terms = bwd_terms(x, w, dout, rstd)
            dx = compare(got[0], sim[0], ref_dx, dx_terms)
            dw = compare(got[1], sim[1], ref_dw, dw_terms)
            worst = max((dx, dw), key=lambda c: STATUS_RANK[c["status"]])
            rec.update(worst, dx=dx, dw=dw)
        except Exception as e:  # noqa: BLE001
            rec.update(status="error", error=_why("run", e))
        records.append(rec)
    return records


#: a case's status from the worse of its comparisons
STATUS_RANK = {"bitwise": 0, "fp32 rounding": 1, "differs": 2}


def _bwd_on_gpu(x, w, dout, rstd, config):
    import torch

    from quack_edu.grading.checks import POISON
    from quack_edu.stages.final_bwd import FinalBwdRMSNorm, sum_partials

    xc, wc, dc, rc = (t.cuda() for t in (x, w, dout, rstd))
    dx = torch.full_like(xc, POISON)
    dw_partial, _ = FinalBwdRMSNorm.launch(xc, wc, dc, None, rc, dx, None, False, config=config)
    dw = sum_partials(dw_partial, w.dtype)
    torch.cuda.synchronize()
    return dx.cpu(), dw.cpu()


def _why(step: str, e: Exception) -> str:
    tb = traceback.format_exception_only(type(e), e)[-1].strip()
    return f"{step}: {tb[:600]}"


# ---- the record ---------------------------------------------------------------------------------
def summary(records: list[dict], expected: int) -> dict:
    by = {}
    for r in records:
        by[r["status"]] = by.get(r["status"], 0) + 1
    worst = max((r.get("max_rel", 0.0) for r in records if r["status"] != "error"), default=0.0)
    return {
        "cases": expected,
        "done": len(records),
        "by_status": by,
        "max_rel_within_fp32_rounding": worst if not by.get("differs") else None,
        "kernels": len({(r["name"], r["plan"], r["N"], r["dtype"], r["wdtype"]) for r in records}),
        "shapes": len({(r["M"], r["N"]) for r in records}),
    }


def exit_status(records: list[dict], expected: int) -> int:
    if any(r["status"] == "differs" for r in records):
        return 1
    if len(records) < expected or any(r["status"] == "error" for r in records):
        return 2
    return 0


def write_record(path: Path, header: dict, records: list[dict], expected: int, done: bool):
    """The JSON record, written whole under a temporary name and renamed (a reader never sees
    half of it)."""
    body = {
        **header,
        "complete": done,
        "summary": summary(records, expected),
        "cases": sorted(
            records,
            key=lambda r: (
                r["kind"],
                r["name"],
                r["plan"],
                r["N"],
                r["dtype"],
                r["wdtype"],
                r["M"],
            ),
        ),  # fmt: skip
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    os.replace(tmp, path)


def header(fake_gpu: bool, argv) -> dict:
    import cutlass
    import torch

    gpu = "none (--fake-gpu: ptxsim in the reversed order)" if fake_gpu else None
    if gpu is None:
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU seen"
    return {
        "what": "ptxsim's outputs against the GPU's, the same compiled PTX on the same inputs",
        "gpu": gpu,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "versions": {
            "torch": torch.__version__,
            "cutlass_dsl": getattr(cutlass, "__version__", "?"),
            "python": platform.python_version(),
        },
        "command": " ".join(["scripts/sim_vs_gpu.py", *argv]),
        "tolerance": (
            "'fp32 rounding': |gpu - sim| <= one step of the output dtype at the larger value "
            f"(half types) + {FP32_REL:g} x the value (+ 2**-126 for fp32 outputs); the "
            "backward's dx and dw: x the larger of the value and the sum of its terms' magnitudes"
        ),
        "M": list(MS),
        "eps": EPS,
    }


def _worker_init():
    os.environ.setdefault("PYTHONWARNINGS", "ignore")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "sim_vs_gpu.json")
    ap.add_argument("--jobs", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--deadline-s", type=float, default=225.0, help="stop waiting after this")
    ap.add_argument("--fake-gpu", action="store_true", help="no GPU: the 'GPU' is ptxsim again")
    ap.add_argument("--only", default="", help="run the specs whose label contains this")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)

    specs = [s for s in cases() if args.only in s.label]
    expected = sum(len(ms_of(s)) for s in specs)
    head = header(args.fake_gpu, argv)
    print(f"{len(specs)} kernels x M in {MS} (a vector: 1): {expected} cases, "
          f"{len(shapes(specs))} shapes; GPU: {head['gpu']}; {args.jobs} processes",
          flush=True)  # fmt: skip
    records: list[dict] = []
    t0 = time.perf_counter()
    todo = list(specs)
    restarts = 0
    while todo and restarts < 3:
        ctx = multiprocessing.get_context("spawn")  # no CUDA context forked
        pool = cf.ProcessPoolExecutor(args.jobs, mp_context=ctx, initializer=_worker_init)
        futures = {pool.submit(run_spec, s, args.fake_gpu): s for s in todo}
        left = args.deadline_s - (time.perf_counter() - t0)
        broken = False
        try:
            for fut in cf.as_completed(futures, timeout=max(1.0, left)):
                spec = futures[fut]
                try:
                    got = fut.result()
                except cf.process.BrokenProcessPool:
                    broken = True
                    continue
                except Exception as e:  # noqa: BLE001
                    got = [{**asdict(spec), "M": M, "status": "error",
                            "error": _why("worker", e)} for M in ms_of(spec)]  # fmt: skip
                todo.remove(spec)
                records += got
                bad = [r for r in got if r["status"] not in ("bitwise", "fp32 rounding")]
                print(f"[{time.perf_counter() - t0:6.1f} s] {spec.label}: "
                      + ", ".join(r["status"] for r in got)
                      + (f"  ({bad[0].get('error') or bad[0].get('first_difference')})"
                         if bad else ""), flush=True)  # fmt: skip
                write_record(args.out, head, records, expected, done=False)
        except cf.TimeoutError:
            print(f"deadline ({args.deadline_s:.0f} s): {len(todo)} kernels not run", flush=True)
            pool.shutdown(wait=False, cancel_futures=True)
            for p in list(getattr(pool, "_processes", {}).values()):
                p.kill()
            break
        pool.shutdown(wait=not broken, cancel_futures=True)
        if broken:
            restarts += 1
            print(f"a worker died: restarting the pool for {len(todo)} kernels", flush=True)
    for spec in todo:
        records += [{**asdict(spec), "M": M, "status": "error", "error":
                     "not run (deadline or dead workers)"} for M in ms_of(spec)]  # fmt: skip
    write_record(args.out, head, records, expected, done=not todo)
    s = summary(records, expected)
    print(f"{s['done']} cases in {time.perf_counter() - t0:.0f} s: {s['by_status']}; "
          f"record: {args.out}", flush=True)  # fmt: skip
    return exit_status(records, expected)


if __name__ == "__main__":
    sys.exit(main())
