"""Lesson 07's probes: the backward kernel with the learner's pieces, compiled, launched or timed
where the answer lives; what comes back is its PTX, its outputs, its time (``Context.probe``).

07.red_add     ``red_compiled``: the report of the atomic backward with the cell's ``red_add``
               (``holes.RED_ADD_HOLE``); ``red_launched``: its dw row on the grader's inputs,
               from several launches
07.dw_partial  ``dw_compiled``, ``dw_launched``, ``dw_time_us``: the backward with the cell's
               ``accumulate_dw`` and ``combine_partial`` (``holes.dw_partial_class``)

No reference, no tolerance, no verdict: the checks (``grading.exercises.lesson07*``) compare.
"""

from __future__ import annotations

from ..context import plain_call, shared
from ..holes import RED_ADD_HOLE, accumulate_dw_of, dw_partial_class
from . import REPORT_FIELDS

#: the stage names a dw_partial and a red_add report carry
DW_STAGE = "final_bwd+07.dw_partial"
RED_STAGE = "final_bwd (atomic)+07.red_add"


def _fields(rep) -> dict:
    return {k: getattr(rep, k) for k in REPORT_FIELDS}


# ---- 07.red_add -------------------------------------------------------------------------------
def _red_class(answer):
    """The atomic backward class with ``answer`` as its ``red_add`` (one per answer object)."""
    return shared(answer, ("07.red_add class",), lambda: RED_ADD_HOLE.build(answer))


def red_compiled(answer, N: int, x_dtype, w_dtype, dout_dtype) -> dict:
    """The report of the atomic backward with ``answer`` as its ``red_add`` at ``N`` for x,
    weight and dout of these dtypes: its PTX, registers and spills."""
    from ...runtime import torch_dtype
    from ...stages.final_bwd import BwdFeatures
    from ...tools.inspect import kernel_report

    def make():
        f = BwdFeatures(dout_dtype=torch_dtype(dout_dtype))
        kernel = _red_class(answer)(torch_dtype(x_dtype), N, None, torch_dtype(w_dtype), features=f)
        return kernel_report(kernel, stage=RED_STAGE)

    key = ("07.red_add report", N, str(x_dtype), str(w_dtype), str(dout_dtype))
    return _fields(shared(answer, key, make))


def red_launched(answer, x, w, dout, rstd, runs: int = 3) -> list:
    """dw of ``runs`` launches of the atomic backward with ``answer`` as its ``red_add`` on
    these rows (weight_offset 0): each the one fp32 row the CTAs add into, zeroed before its
    launch (``FinalBwdRMSNorm.launch`` of a variant with ``partial_rows``), (1, N)."""
    import torch

    cls = _red_class(answer)
    dx = torch.empty_like(x)
    out = []
    for _ in range(runs):
        dw_row, _ = cls.launch(x, w, dout, None, rstd, dx, None, False)
        torch.cuda.synchronize()
        out.append(dw_row)
    return out


# ---- 07.dw_partial ----------------------------------------------------------------------------
def _dw_class(answer):
    """The backward class with the cell's ``accumulate_dw`` and ``answer`` (``combine_partial``),
    one per answer object; None where the cell defines no ``accumulate_dw``."""
    acc_fn = accumulate_dw_of(answer)
    if acc_fn is None:
        return None
    return shared(answer, ("07.dw_partial class",), lambda: dw_partial_class(acc_fn, answer))


def dw_compiled(answer, N: int, x_dtype, w_dtype, dout_dtype) -> dict:
    """The report of the backward with the learner's two functions at ``N`` for x, weight and
    dout of these dtypes, and ``"accumulate_dw": True``; without an ``accumulate_dw`` in the
    cell, ``{"accumulate_dw": False, "plain_call": ...}``: what calling ``answer`` with 8 Nones
    says (``checks.plain_call``)."""
    from ...runtime import torch_dtype
    from ...stages.final_bwd import BwdFeatures
    from ...tools.inspect import kernel_report

    cls = _dw_class(answer)
    if cls is None:
        return {"accumulate_dw": False, "plain_call": plain_call(answer, 8)}
    key = (str(x_dtype), str(w_dtype), str(dout_dtype))

    def make():
        f = BwdFeatures(dout_dtype=torch_dtype(dout_dtype))
        kernel = cls(torch_dtype(x_dtype), N, None, torch_dtype(w_dtype), features=f)
        return kernel_report(kernel, stage=DW_STAGE)

    rep = shared(answer, ("07.dw_partial report", N, *key), make)
    return {"accumulate_dw": True, **_fields(rep)}


def dw_launched(answer, x, w, dout, rstd, runs: int = 2) -> list:
    """The dw partial buffer of ``runs`` launches of the backward with the learner's two
    functions on these rows (weight_offset 0): each (P + 1, N) fp32, filled with NaN before the
    launch, which writes its first P rows (P: the kernel's grid); the last row is written by
    nothing but a store past the end."""
    import torch

    from ...stages import final_bwd

    cls = _dw_class(answer)
    if cls is None:
        raise RuntimeError("no accumulate_dw in the exercise's cell")
    M, N = x.shape
    dx = torch.empty_like(x)
    bufs = []
    for _ in range(runs):
        kernel, run = final_bwd.kernel_for(x, w, dout, None, dx, None, False, 0.0, None, cls)
        P = kernel.grid_on(M, x.get_device())
        buf = torch.full((P + 1, N), float("nan"), device=x.device)
        run(x, w, dout, None, rstd, dx, None, buf[:P], None, P)
        torch.cuda.synchronize()
        bufs.append(buf)
    return bufs


def dw_time_us(answer, M: int, N: int, seed: int = 1) -> float:
    """Microseconds of the backward with the learner's two functions on M x N bf16 rows with a
    bf16 weight (``tools.bench.cuda_time_us``), compiled first. The rows are made here from
    ``seed``: their values do not change the time, and sending them costs more. The compiled
    kernel is timed, as ``Context.launcher``'s are: not the class's host path, which a check
    context's shortcut guard (a profiler) would slow."""
    import torch

    from ...stages import final_bwd
    from ...tools.bench import cuda_time_us

    cls = _dw_class(answer)
    if cls is None:
        raise RuntimeError("no accumulate_dw in the exercise's cell")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, N, generator=gen).to("cuda", torch.bfloat16)
    dout = torch.randn(M, N, generator=gen).to("cuda", torch.bfloat16)
    w = (1.0 + 0.5 * torch.randn(N, generator=gen)).to("cuda", torch.bfloat16)
    rstd = torch.rsqrt(x.float().square().mean(dim=-1) + 1e-6)
    dx = torch.empty_like(x)
    kernel, run = final_bwd.kernel_for(x, w, dout, None, dx, None, False, 0.0, None, cls)
    P = kernel.grid_on(M, x.get_device())
    dw_p = torch.empty((P, N), dtype=torch.float32, device=x.device)
    return float(cuda_time_us(lambda: run(x, w, dout, None, rstd, dx, None, dw_p, None, P)))
