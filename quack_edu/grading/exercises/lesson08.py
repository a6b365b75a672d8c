"""Lesson 08, programmatic dependent launch on lesson 03's block kernel (08.pdl_kernel).

The learner is handed the block kernel (rows that fit one pass) with a TODO and writes what
PDL adds to it: ``cute.arch.griddepcontrol_wait()`` before the kernel's first access to global
memory (what the previous kernel on the stream writes may be read only after it),
``cute.arch.griddepcontrol_launch_dependents()`` anywhere (the dependent grid's own wait still
waits for this grid's completion and its memory: PTX ISA, griddepcontrol; so its place changes
how early the next grid may start, never what it reads, and no order is checked), and the
launch flag (``use_pdl()`` beside the
kernel returns True), which ``block.BlockPdl``'s host side passes to ``launch(use_pdl=...)``
(``holes.PDL_KERNEL_HOLE``; the final stage does the same: ``stages/final.py``).

Its checks are every whole kernel's (``whole_kernel.WholeKernel``: the accesses, and the values
run on the CPU by ptxsim, which treats griddepcontrol as one grid at a time) and two of its
own: ``_waits_first``, read from the PTX (a ``griddepcontrol.wait`` that no predicate guards,
before the first global load or store, x's and the weight's loads included, in the PTX's order,
and a ``griddepcontrol.launch_dependents``), and the launch flag (``probes.lesson08``). On a
GPU the values are compared with ``rmsnorm_ref``, and launches at N = 256 back to back on one
stream are timed with the cell's flag and with PDL off: reported, not judged (the gap is a
fraction of a microsecond a launch and depends on the host).
"""

from __future__ import annotations

from ..checks import Context, thread_guards
from ..holes import PDL_KERNEL_HOLE as KERNEL_HOLE
from ..probes.lesson08 import launch_flag, pdl_time_us
from ..registry import COMPILE, GPU, Check, CheckFailed, mutants
from .lesson03 import one_pass_config, refuse_to_hang
from .whole_kernel import GIVEN_COPY, OUT, W, WholeKernel, X, tensor_accesses

LESSON = "08_speed_of_light"
#: the timing's shape: short rows, where a launch costs about what its bytes do
TIME_M, TIME_N, TIME_LAUNCHES = 8192, 256, 200

# ---- hints ------------------------------------------------------------------------------------
NO_WAIT = (
    "the PTX has no griddepcontrol.wait: launched with PDL, this grid may start while the "
    "previous kernel on the stream is still writing x (or the weight), and nothing holds its "
    "loads back. Call cute.arch.griddepcontrol_wait() before the kernel's first global access"
)
WAIT_LATE = (
    "a global access comes before griddepcontrol.wait: that load may read x or the weight "
    "before the previous kernel has finished writing them (a store, before it has finished "
    "reading). The wait goes before the first cute.copy from or to global memory"
)
WAIT_GUARDED = (
    "griddepcontrol.wait is under a condition: the threads that skip it read global memory "
    "without waiting. Every thread waits, outside any branch"
)
NO_TRIGGER = (
    "the PTX has no griddepcontrol.launch_dependents: without it the next kernel on the stream "
    "is launched only when this grid ends, and PDL overlaps nothing. Call "
    "cute.arch.griddepcontrol_launch_dependents() (before or after the wait: the next kernel's "
    "own wait still waits for this grid to end)"
)
FLAG_OFF = (
    "use_pdl() does not return True: the kernel is launched without programmatic dependent "
    "launch, so the next grid never starts early and the griddepcontrol instructions have "
    "nothing to act on. "
    "Make use_pdl(), beside the kernel, return True"
)

_GLOBAL = ("ld.global", "st.global", "cp.async.ca", "cp.async.cg", "red.global", "atom.global")


def _waits_first(rep, kernel) -> str:
    """An unguarded griddepcontrol.wait before every global access (x's and the weight's loads
    named), in the PTX's order, and a griddepcontrol.launch_dependents."""
    acc, ptx = tensor_accesses(rep.ptx)
    waits = [i for i in ptx.instrs if i.opcode.startswith("griddepcontrol.wait")]
    if not waits:
        raise CheckFailed(
            "no griddepcontrol.wait in the PTX",
            expected="griddepcontrol.wait before the first ld.global",
            seen="none",
            hint=NO_WAIT,
        )
    names = {i.index: what for (k, a), what in (
        (("ld", X), "x"), (("ld", W), "the weight"), (("st", OUT), "y"))
        for i in acc.get((k, a), [])}  # fmt: skip
    accesses = [i for i in ptx.instrs if i.opcode.startswith(_GLOBAL)]
    first = min(accesses, key=lambda i: i.index, default=None)
    wait = waits[0]
    if first is not None and first.index < wait.index:
        raise CheckFailed(
            f"a global access of {names.get(first.index, 'memory')} before griddepcontrol.wait",
            expected="griddepcontrol.wait, then the first ld.global",
            seen=f"`{first.text}` before `{wait.text}`",
            hint=WAIT_LATE,
        )
    guards = thread_guards(rep.ptx, any_predicate=True)
    guarded = [i for i in waits if guards.get(i.index)]
    if guarded:
        raise CheckFailed(
            "griddepcontrol.wait under a predicate",
            expected="every thread waits",
            seen=f"`{guarded[0].text}`",
            hint=WAIT_GUARDED,
        )
    if not any(i.opcode.startswith("griddepcontrol.launch_dependents") for i in ptx.instrs):
        raise CheckFailed(
            "no griddepcontrol.launch_dependents in the PTX",
            expected="griddepcontrol.launch_dependents",
            seen="griddepcontrol.wait only",
            hint=NO_TRIGGER,
        )
    return f"griddepcontrol.wait before all {len(accesses)} global accesses; launch_dependents"


def _flag(ctx: Context) -> str:
    if not ctx.probe(launch_flag):
        raise CheckFailed(
            "the kernel is launched without programmatic dependent launch",
            expected="use_pdl() returns True",
            seen="it does not",
            hint=FLAG_OFF,
        )
    return "launched with use_pdl=True"


def _timed(ctx: Context) -> str:
    """Reported, not judged: a launch's time with the cell's flag and with PDL off."""
    t = ctx.probe(pdl_time_us, TIME_M, TIME_N, TIME_LAUNCHES, 1)
    return (
        f"{TIME_LAUNCHES} launches at {TIME_M}x{TIME_N} bf16 back to back: {t['flag']:.2f} us a "
        f"launch with your flag, {t['off']:.2f} us with PDL off (information, not graded)"
    )


_KERNEL_CASES = (
    (1000, "bf16", "bf16", None),  # 64 threads a row: 2 rows x 2 warps a CTA
    (1000, "bf16", "fp32", None),
    (1000, "fp32", "fp32", None),
    (16384, "bf16", "bf16", None),  # 256 threads a row: 8 warps
)

#: the solution's lines that mutants move or remove
WAIT = "    cute.arch.griddepcontrol_wait()\n"
TRIGGER = "    cute.arch.griddepcontrol_launch_dependents()\n"
W_COPY = "    cute.copy(copy_W, tWgW, thr_W.retile(tXrW), pred=tWpW)\n"

# BEGIN KEY
# fmt: off
PDL_KERNEL_MUTANTS = mutants(COMPILE,
    ("wait missing", "no griddepcontrol.wait", WAIT, ""),
    ("wait after x's load", "a global access comes before griddepcontrol.wait",
     [(WAIT, ""), (W_COPY, WAIT + W_COPY)]),
    ("wait after every load", "a global access comes before griddepcontrol.wait",
     [(WAIT, ""), ("    x = tXrX.load()", WAIT + "    x = tXrX.load()")]),
    ("wait only for the rows in the tensor", "griddepcontrol.wait is under a condition",
     WAIT, "    if row < M:\n    " + WAIT),
    ("launch_dependents missing", "no griddepcontrol.launch_dependents", TRIGGER, ""),
    ("launch flag off", "use_pdl() does not return True", "    return True\n",
     "    return False\n"),
)
# fmt: on
# END KEY

pdl_kernel = WholeKernel(
    id="08.pdl_kernel",
    lesson=LESSON,
    answer="pdl_kernel",
    title="programmatic dependent launch: where the kernel waits for the previous one, when it "
    "lets the next one go, and the launch flag",
    mutants=PDL_KERNEL_MUTANTS,
    given=GIVEN_COPY,
    hole=KERNEL_HOLE,
    cases=_KERNEL_CASES,
    access="x read once, the weight read, y written once; griddepcontrol.wait before the first "
    "global access, and launch_dependents",
    extra=_waits_first,
    Ns=(1000, 8200),
    hidden_Ns=(1544, 3000, 6136, 12296),
    config=one_pass_config,
    values="values vs rmsnorm_ref launched with PDL (M in 1/37/199, N in 1000/8200, x and "
    "weight dtypes)",
    speed=Check(
        f"{TIME_LAUNCHES} launches at N = {TIME_N} timed, PDL against none (information)",
        GPU,
        _timed,
        needs=("compiles",),
    ),
    guard=refuse_to_hang,
).register()
pdl_kernel.add(Check("launched with use_pdl=True", COMPILE, _flag, needs=("compiles",)))
