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

Ordering. The simulator also checks what values alone cannot show (``ptxsim.order``): a read
of shared or distributed shared memory that no barrier orders after its write (an mbarrier wait
on the wrong parity, a missing bar.sync, a cp.async group read before its wait), a store into a
peer before its mbarrier is initialised, a bar.sync only part of the CTA reaches, and a kernel
that hangs (a wait nothing completes). Each fails the check, naming the instructions, with the
exercise's hint for it (``ordering_hint``) or a general one. The first case runs in two more
orders (one warp at a time, reversed and seeded random), whose values must be the same: a
kernel that is right only in the order the threads happened to run is not.

Bounds: a few rows (M = 7, 3, 1; the 7 first, for it holds a zero row and a row at eps's scale
that tell the wrong statistics apart) of row lengths the exercise compiles for its other checks
anyway, and ``STEP_BUDGET`` simulated steps per launch (about 1.5 s): a kernel that does not end
within them fails as an endless loop. An access outside the tensors fails too. Whatever else the
simulator cannot run (an instruction it does not know, PTX it cannot read) is named in the
check's message and the check passes: the compile tier never fails a kernel for the
simulator's sake, and the gpu tier still checks the values.
"""

from __future__ import annotations

from collections.abc import Callable

from . import hints
from .checks import EPS, POISON, KernelHole, fail_on_error, rmsnorm_inputs, your_kernel
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
RACE = (
    "a thread reads shared memory that another thread wrote, and nothing orders the write "
    "before the read: on a GPU it may read the old bytes. Between them there must be a barrier "
    "both pass (bar.sync for the threads of a CTA; for a peer's st.async, a wait on the "
    "mbarrier phase the store completes, with the parity of that phase; for a cluster, "
    "cluster_arrive then cluster_wait), or, for a cp.async, the wait_group that covers its group"
)
HANG = (
    "the kernel hangs: every thread still running waits for something that never comes (a "
    "cluster_wait with no cluster_arrive of its own before it, an mbarrier armed for more "
    "arrivals or bytes than arrive, a bar.sync some threads never reach)"
)
PARTIAL_BARRIER = (
    "a bar.sync (sync_threads) reached by only part of the CTA: a barrier under a branch that "
    "depends on the thread or the row, or after some threads returned. Every thread of the CTA "
    "must reach the same barrier: keep it outside `if row < M` and the like"
)
DIVERGENT_SHUFFLE = (
    "a shuffle (shfl.sync) waits for every lane its mask names, and some of them never reach "
    "it: it sits under a branch that depends on the row or the thread (or after a return). On "
    "a GPU that is undefined: wrong sums or a hang. Every lane of the warp must run the "
    "reduction; rows past M take part with zeros, and only their loads and stores are guarded"
)
DIFFERENT_ORDERS = (
    "the values depend on the order the threads run in: warps or CTAs that run in another order "
    "(as they may on a GPU) compute other values, so something is read before a barrier makes "
    "it safe"
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
    ordering_hint: str | None = None,
) -> Check:
    """Values of the learner's kernel, its PTX simulated on the CPU (compile tier), at each
    ``(N, x dtype, weight dtype, config)`` of ``cases`` (or ``cases(ctx)``; a config may be a
    callable of (N, torch dtype); None: the stage's heuristic) and M = 7, 3, 1. ``report(ctx,
    hole, N, xd, wd, config)`` gives (kernel, compile report); by default ``ctx.kernel`` and
    ``ctx.report`` (the kernels the other compile checks compiled: no compile of its own).
    ``name``: by default ``sim_name(cases)``; ``ordering_hint``: the hint of a race (default
    ``RACE``)."""
    report = report or _own_report
    name = name or sim_name(cases)

    def fn(ctx):
        from ..ptxsim import ORDERS
        from ..runtime import torch_dtype

        gen = ctx.torch_generator(salt="sim values" + ("h" if hidden else ""))
        n = 0
        orders = ORDERS
        for N, xd, wd, cfg in cases(ctx) if callable(cases) else cases:
            xdt, wdt = torch_dtype(xd), torch_dtype(wd)
            cfg = cfg(N, xdt) if callable(cfg) else cfg
            with fail_on_error(f"{your_kernel(ctx, hole)} does not compile (x {xd}, N={N})"):
                kernel, rep = report(ctx, hole, N, xd, wd, cfg)
            where = f"x {xd}, weight {wd}" if xd != wd else xd
            for M in SIM_M:
                x, w = cpu_inputs(M, N, xdt, wdt, gen)
                at = f"{where}, M={M} N={N}"
                out, note = simulate(rep.ptx, kernel, x, w, at, ordering_hint=ordering_hint)
                if note:
                    return note
                compare(out, x, w, at, variants)
                n += 1
                for order in orders[1:]:  # the first case, in the other orders
                    seed = ctx.rng("sim order").randrange(1 << 16)
                    other, skipped = simulate(
                        rep.ptx, kernel, x, w, f"{at}, {order} order",
                        order=order, seed=seed, ordering_hint=ordering_hint,
                    )  # fmt: skip
                    if not skipped:
                        _same(out, other, f"{at}: the {order} order (seed {seed})")
                orders = orders[:1]
        return (
            f"{n} shapes x dtypes match rmsnorm_ref (the PTX run on the CPU); 3 "
            "orders agree, every shared-memory read ordered after its write"
        )

    return Check(name, COMPILE, fn, hidden, tuple(needs))


def _same(out, other, where: str) -> None:
    import torch

    bits = {2: torch.int16, 4: torch.int32}[out.element_size()]
    differ = out.view(bits) != other.view(bits)
    if bool(differ.any()):
        row, col = (int(i) for i in differ.nonzero()[0])
        raise CheckFailed(
            f"{where}: {int(differ.sum())} outputs differ from the forward order's",
            expected=f"{out[row, col].item():.6g} at row {row}, column {col} (the forward order)",
            seen=f"{other[row, col].item():.6g}",
            hint=DIFFERENT_ORDERS,
        )


def simulate(ptx: str, kernel, x, w, where: str, *, order="forward", seed=0, ordering_hint=None):
    """(y, None) from the PTX run on the CPU in ``order``, y poisoned (``checks.POISON``)
    before. A kernel it cannot run, an endless loop, an access outside the tensors, a race, a
    hang and a partial barrier raise CheckFailed."""
    import torch

    from ..ptxsim import run_ptx

    out = torch.full_like(x, POISON)
    return simulated(
        lambda: run_ptx(
            ptx, kernel, x, w, EPS, out=out, max_steps=STEP_BUDGET, order=order, seed=seed
        ),
        where,
        ordering_hint,
    )


def simulated(run: Callable, where: str, ordering_hint=None):
    """(``run()``, None), a simulation of the learner's PTX; what the simulator cannot run, and
    what the simulation finds wrong, raise CheckFailed."""
    from ..ptxsim import (
        DivergentShuffle,
        Hang,
        MemoryFault,
        OrderingError,
        PartialBarrier,
        SimError,
        StepLimit,
    )

    try:
        return run(), None
    except Hang as e:
        raise CheckFailed(
            f"{where}: the kernel hangs (simulated)", seen=str(e), hint=HANG
        ) from None
    except PartialBarrier as e:
        raise CheckFailed(
            f"{where}: a barrier only part of the CTA reaches", seen=str(e), hint=PARTIAL_BARRIER
        ) from None
    except DivergentShuffle as e:
        raise CheckFailed(
            f"{where}: a warp shuffle part of its warp does not reach (simulated)",
            seen=str(e),
            hint=DIVERGENT_SHUFFLE,
        ) from None
    except OrderingError as e:
        raise CheckFailed(
            f"{where}: a shared-memory read nothing orders after its write (simulated)",
            seen=str(e),
            hint=ordering_hint or RACE,
        ) from None
    except StepLimit:
        raise CheckFailed(
            f"{where}: the kernel did not end within its simulated steps",
            expected="a few hundred steps per CTA",
            seen="still running",
            hint=ENDLESS,
        ) from None
    except MemoryFault as e:
        raise CheckFailed(
            f"{where}: an access outside the kernel's tensors", seen=str(e), hint=OUT_OF_BOUNDS
        ) from None
    except Exception as e:  # noqa: BLE001 (what the simulator cannot run is not judged right:
        # red team 16 put an instruction it does not know into a wrong kernel, which then passed)
        reason = str(e)[:240] if isinstance(e, SimError) else hints.short_error(e, 240)
        raise CheckFailed(
            f"{where}: not simulated", seen=reason, hint=hints.NOT_SIMULATED
        ) from None


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
