"""A CPU executor for the PTX of the lesson kernels: see what a kernel computes without a GPU.

    >>> from quack_edu.ptxsim import run_stage
    >>> y = run_stage("warp", x, w, eps=1e-6)   # compiles for sm_90a, runs its PTX on NumPy

``parser`` reads a kernel's PTX, ``executor`` runs it over a grid of CTAs (a register is a NumPy
array over a CTA's threads), ``instructions`` says what each instruction does, ``stages``
connects the ladder's kernels. Meant for small shapes (a few rows of a few thousand columns):
a few hundred thousand instructions per second.

Prior art, checked before writing this (2026-12, PyPI): ``ptx-parser`` 0.1.3 is a compiled
(Rust) PTX parser without documentation and without any execution; ``sentryward`` 0.1.1 is a
static verifier (races, synchronization, equivalence in real arithmetic, via an SMT solver) for
Blackwell kernels, shipped as a native binary: it proves properties but computes no concrete
values in float32. Neither runs PTX, so this package is written from the PTX ISA manual.
"""

from .executor import SimError, TensorArg, UnsupportedInstruction, launch
from .parser import PtxSyntaxError, parse
from .stages import SIMULATED_STAGES, run_kernel, run_stage, stage_kernel

__all__ = [
    "SIMULATED_STAGES",
    "PtxSyntaxError",
    "SimError",
    "TensorArg",
    "UnsupportedInstruction",
    "launch",
    "parse",
    "run_kernel",
    "run_stage",
    "stage_kernel",
]
