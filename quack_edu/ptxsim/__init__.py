"""A CPU executor for the PTX of the lesson kernels: see what a kernel computes without a GPU.

    >>> from quack_edu.ptxsim import run_stage
    >>> y = run_stage("cluster", x, w, eps=1e-6, config=cfg)  # compiles for sm_90a, runs its PTX

``parser`` reads a kernel's PTX, ``values`` maps PTX types to NumPy's, ``executor`` runs it
over a grid of clusters of CTAs (a register is a NumPy array over a CTA's threads),
``instructions`` says what each instruction does, ``sync`` the barriers, clusters, mbarriers
and cp.async, ``order`` checks that every read of shared memory is ordered after the write it
reads, ``stages`` connects the ladder's kernels.

What it runs: the stages naive, warp, block, cluster (2- to 4-CTA clusters: ``mapa``,
``ld``/``st.shared::cluster``, ``st.async`` completing on a peer's mbarrier, ``barrier.cluster``)
and cpasync (``cp.async`` with commit and wait groups, ``.L2::cache_hint`` policies ignored), the
final stage's plain forward (x, weight, y) and its backward (``run_bwd``: dx and dw from x, weight,
dout and rstd, persistent CTAs walking row blocks, then the partial sums added by ``PartialSum``),
and the exercises built on them, in every dtype; the threads of a CTA in lockstep or a warp at a
time, in three orders (forward, reversed, seeded random) that a correct kernel computes the same
values in. What it checks on the way: accesses outside the tensors or shared memory, shuffles of
diverged lanes, races on shared and distributed shared memory (``Race``, naming both PTX lines),
hangs (``Hang``, naming where each thread waits), barriers only part of a CTA reaches
(``PartialBarrier``), and instructions it does not know (``UnsupportedInstruction``, naming the
instruction). What it does not run: the final kernel's other features (bias, residual, rstd), the
backward's (bias, residual, weight offset) and lesson 07's atomic variant of it
(``red.global.add``), TMA (``cp.async.bulk``), atomics and reductions on memory, textures, and
timing of any kind (a simulated step is not a cycle). Meant for small shapes (a few rows of a few
thousand columns): about 30,000 steps a second, a step one instruction for the threads of a CTA (or
of a warp) at it (the naive stage at N=1000: 0.4 s on a 2-core machine; a 2-CTA cluster stage at
N=1000, M=7: 0.03 s forward, 0.1 s a warp at a time).

Prior art, checked on PyPI (pip download) before writing this: ``ptx-parser`` 0.1.3 is a compiled
(Rust) PTX parser without documentation and without any execution; ``sentryward`` 0.1.1 is a
static verifier (races, synchronization, equivalence in real arithmetic, via an SMT solver) for
Blackwell kernels, shipped as a native binary: it proves properties but computes no concrete
values in float32. Neither runs PTX, and GPGPU-Sim / Accel-Sim (C++, a CUDA runtime to link
against) predate clusters and mbarriers; so this package is written from the PTX ISA manual.
"""

from .executor import ORDERS, Schedule, TensorArg, launch
from .parser import PtxSyntaxError, parse
from .stages import (
    BACKWARD,
    SIMULATED_STAGES,
    run_bwd,
    run_kernel,
    run_ptx,
    run_stage,
    stage_kernel,
)
from .values import (
    DivergentShuffle,
    Hang,
    MemoryFault,
    OrderingError,
    PartialBarrier,
    Race,
    SimError,
    StepLimit,
    UnsupportedInstruction,
)

__all__ = [
    "BACKWARD",
    "ORDERS",
    "SIMULATED_STAGES",
    "DivergentShuffle",
    "Hang",
    "MemoryFault",
    "OrderingError",
    "PartialBarrier",
    "Race",
    "Schedule",
    "PtxSyntaxError",
    "SimError",
    "StepLimit",
    "TensorArg",
    "UnsupportedInstruction",
    "launch",
    "parse",
    "run_bwd",
    "run_kernel",
    "run_ptx",
    "run_stage",
    "stage_kernel",
]
