"""A CPU executor for the PTX of the lesson kernels: see what a kernel computes without a GPU.

    >>> from quack_edu.ptxsim import run_stage
    >>> y = run_stage("warp", x, w, eps=1e-6)   # compiles for sm_90a, runs its PTX on NumPy

``parser`` reads a kernel's PTX, ``values`` maps PTX types to NumPy's, ``executor`` runs it
over a grid of CTAs (a register is a NumPy array over a CTA's threads), ``instructions`` says
what each instruction does, ``stages`` connects the ladder's kernels. Meant for small shapes (a
few rows of a few thousand columns): it runs about 30,000 instructions a second, each for all
the threads of a CTA (the naive stage at N=1000: 0.4 s on a 2-core machine).

Prior art, checked on PyPI (pip download) before writing this: ``ptx-parser`` 0.1.3 is a compiled
(Rust) PTX parser without documentation and without any execution; ``sentryward`` 0.1.1 is a
static verifier (races, synchronization, equivalence in real arithmetic, via an SMT solver) for
Blackwell kernels, shipped as a native binary: it proves properties but computes no concrete
values in float32. Neither runs PTX, so this package is written from the PTX ISA manual.
"""

from .executor import TensorArg, launch
from .parser import PtxSyntaxError, parse
from .stages import SIMULATED_STAGES, run_kernel, run_ptx, run_stage, stage_kernel
from .values import MemoryFault, SimError, StepLimit, UnsupportedInstruction

__all__ = [
    "SIMULATED_STAGES",
    "MemoryFault",
    "PtxSyntaxError",
    "SimError",
    "StepLimit",
    "TensorArg",
    "UnsupportedInstruction",
    "launch",
    "parse",
    "run_kernel",
    "run_ptx",
    "run_stage",
    "stage_kernel",
]
