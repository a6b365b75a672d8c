"""Values on any machine: the PTX of the learner's kernel run on the CPU (``quack_edu.ptxsim``).

The compile tier reads what a kernel's PTX shows, and a wrong kernel whose instructions look
right (a row summing ``x*x + x*x``, a weight added to itself) passes every such reading.
``sim_values`` runs that PTX: the text the learner's process sent back for the compile checks
(``Context.report``), executed by ptxsim here, in the grader's process (our code on data: no
learner code runs here), on inputs made here, with the launch shape the grader's own copy of
the stage gives (grid, block and shared memory come from the stage's host code and its config,
never from the learner's code). The outputs, poisoned before the launch, are compared with
``rmsnorm_ref`` within ``TOLERANCES`` as on a GPU; a mismatch names the first wrong output and,
where a known wrong RMSNorm (``hints.Variant``) or a known signature explains the values, its
hint.

Bounds: a few rows (M = 7, 3, 1; the 7 first, for it holds a zero row and a row at eps's scale
that tell the wrong statistics apart) of row lengths the exercise compiles for its other checks
anyway, and ``STEP_BUDGET`` simulated steps per launch (about 1.5 s): a kernel that does not end
within them fails as an endless loop. An access outside the tensors fails too. Whatever else the
simulator cannot run (an instruction it does not know, a cluster, PTX it cannot read) is named
in the check's message and the check passes: the compile tier never fails a kernel for the
simulator's sake, and the gpu tier still checks the values.
"""

from __future__ import annotations

from collections.abc import Callable

from . import hints
from .checks import EPS, POISON, KernelHole, fail_on_error, rmsnorm_inputs
from .registry import COMPILE, Check, CheckFailed

#: rows per launch, in the order they run (the first holds a zero row and a row at eps's scale)
SIM_M = (7, 3, 1)
#: simulated steps a launch may take (a step: one instruction for the threads of a CTA at it,
#: about 30 us on a 2-core machine): at least 10x what the lesson kernels need at these shapes
#: (the warp kernel at N=1000, M=7: 584 steps; the naive kernel at N=37: 402)
STEP_BUDGET = 50_000

ENDLESS = (
    "the kernel did not end: a loop whose condition never turns false (a bound that is not "
    "the row length or the count, a counter never advanced), or a jump back that is always "
    "taken"
)
OUT_OF_BOUNDS = (
    "the kernel reads or writes outside x, the weight, y and its shared memory: a row past M, "
    "a column past N, or a shared-memory slot past the buffer; guard the copies with the row "
    "(< M) and the column predicate (< N), and index the buffer within its shape"
)
UNEXPLAINED = (
    "the PTX compiled from your kernel computes other values than rmsnorm_ref, and no known "
    "mistake explains them: follow one row through your kernel (the loads, the sum of squares, "
    "rstd, the multiply by the weight, the store)"
)


def cpu_inputs(M: int, N: int, xdt, wdt, gen):
    """(x, w) on the CPU: ``checks.rmsnorm_inputs`` (rows at very different scales, row 1 of
    zeros when M > 2) with, when M > 2, row 0 at scale 1 and row 2 at eps's scale (a mean
    square about eps): a wrong sum of squares moves row 2's rstd by another factor than row
    0's, a wrong scale of y does not (``hints.SCALED``)."""
    import torch

    x, w = rmsnorm_inputs(M, N, xdt, gen, device="cpu")
    if M > 2:
        x[0] = torch.randn(N, generator=gen).to(xdt)
        x[2] = (torch.randn(N, generator=gen) * EPS**0.5).to(xdt)
    return x, w.to(wdt)


def _own_report(ctx, hole: KernelHole, N: int, xd: str, wd: str, config):
    """(kernel, report) as every compile check gets them: the weight in x's dtype."""
    if xd != wd:
        raise ValueError("a hole's kernel is compiled with the weight in x's dtype")
    return ctx.kernel(hole, N, xd, config), ctx.report(hole, N, xd, config)


def sim_name(cases) -> str:
    """The check's name from its cases: "values on the CPU (the PTX simulated, M in 1/3/7,
    N=37, fp32/bf16)"."""
    Ns = "/".join(str(n) for n in sorted({c[0] for c in cases}))
    mixed = any(xd != wd for _, xd, wd, _ in cases)
    dtypes = "x and weight dtypes" if mixed else "/".join(dict.fromkeys(c[1] for c in cases))
    return f"values on the CPU (the PTX simulated, M in 1/3/7, N={Ns}, {dtypes})"


def sim_values(
    hole: KernelHole,
    cases,
    *,
    name: str | None = None,
    variants=(),
    hidden: bool = False,
    report: Callable | None = None,
    needs=("compiles",),
) -> Check:
    """Values of the learner's kernel, its PTX simulated on the CPU (compile tier), at each
    ``(N, x dtype, weight dtype, config)`` of ``cases`` (or ``cases(ctx)``; a config may be a
    callable of (N, torch dtype); None: the stage's heuristic) and M = 7, 3, 1. ``report(ctx,
    hole, N, xd, wd, config)`` gives (kernel, compile report); by default ``ctx.kernel`` and
    ``ctx.report`` (the kernels the other compile checks compiled: no compile of its own).
    ``name``: by default ``sim_name(cases)``."""
    report = report or _own_report
    name = name or sim_name(cases)

    def fn(ctx):
        from ..runtime import torch_dtype

        gen = ctx.torch_generator(salt="sim values" + ("h" if hidden else ""))
        n = 0
        for N, xd, wd, cfg in cases(ctx) if callable(cases) else cases:
            xdt, wdt = torch_dtype(xd), torch_dtype(wd)
            cfg = cfg(N, xdt) if callable(cfg) else cfg
            with fail_on_error(f"your {hole.stage} kernel does not compile (x {xd}, N={N})"):
                kernel, rep = report(ctx, hole, N, xd, wd, cfg)
            where = f"x {xd}, weight {wd}" if xd != wd else xd
            for M in SIM_M:
                x, w = cpu_inputs(M, N, xdt, wdt, gen)
                out, note = simulate(rep.ptx, kernel, x, w, f"{where}, M={M} N={N}")
                if note:
                    return note
                compare(out, x, w, f"{where}, M={M} N={N}", variants)
                n += 1
        return f"{n} shapes x dtypes match rmsnorm_ref (the PTX run on the CPU)"

    return Check(name, COMPILE, fn, hidden, tuple(needs))


def simulate(ptx: str, kernel, x, w, where: str):
    """(y, None) from the PTX run on the CPU, y poisoned (``checks.POISON``) before; (None,
    "not simulated: ...") where the simulator cannot run it. An endless loop and an access
    outside the tensors raise CheckFailed."""
    import torch

    from ..ptxsim import MemoryFault, SimError, StepLimit, run_ptx

    out = torch.full_like(x, POISON)
    try:
        return run_ptx(ptx, kernel, x, w, EPS, out=out, max_steps=STEP_BUDGET), None
    except StepLimit:
        raise CheckFailed(
            f"{where}: the kernel did not end within {STEP_BUDGET} simulated steps",
            expected=f"a few hundred steps per CTA at N={x.shape[1]}",
            seen=f"still running after {STEP_BUDGET}",
            hint=ENDLESS,
        ) from None
    except MemoryFault as e:
        raise CheckFailed(
            f"{where}: an access outside the kernel's tensors", seen=str(e), hint=OUT_OF_BOUNDS
        ) from None
    except Exception as e:  # noqa: BLE001 (the simulator's limit, never the learner's failure)
        reason = str(e)[:240] if isinstance(e, SimError) else hints.short_error(e, 240)
        return None, f"not simulated ({reason}): the values are checked on a GPU"


def compare(out, x, w, where: str, variants=()) -> None:
    """CheckFailed naming the first output that differs from ``rmsnorm_ref`` beyond the
    dtype's tolerance, with the hint of the known mistake that explains the values."""
    import torch

    from ..reference import TOLERANCES, rmsnorm_ref

    tol = TOLERANCES[x.dtype]
    ref = rmsnorm_ref(x, w, eps=EPS)
    o = out.float()
    bad = ~torch.isclose(o, ref, **tol)  # NaN (never written as a number) differs
    if not bool(bad.any()):
        return
    row, col = divmod(int(bad.flatten().nonzero()[0]), x.shape[1])
    poison = torch.tensor(POISON, dtype=x.dtype).item()
    hint = hints.diagnose_rmsnorm(out, ref, x, w, EPS, tol=tol, poison=poison, variants=variants)
    raise CheckFailed(
        f"{where}: {int(bad.sum())} of {bad.numel()} outputs differ from rmsnorm_ref beyond "
        f"atol=rtol={tol['rtol']:g} (your kernel's PTX run on the CPU)",
        expected=f"{ref[row, col].item():.6g} at row {row}, column {col} (the first wrong output)",
        seen=f"{o[row, col].item():.6g}",
        hint=hint or UNEXPLAINED,
    )
