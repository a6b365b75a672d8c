"""Run a stage kernel of the ladder on the CPU: compile it for sm_90a, simulate its PTX.

    >>> y = run_stage("warp", x, w, eps=1e-6)     # x: (M, N) torch tensor on the CPU

The kernel is compiled exactly as for a GPU (``tools.inspect.kernel_report``: fake tensors,
``cute.compile``, ptxas), once per (kernel class, dtypes, N, config), and its PTX is run by
``executor.launch`` with the launch shape the stage's host code would use.

How CuTe DSL passes the tensors (read off the PTX of the naive and warp stages): each tensor is
one ``.param .align 8 .b8 [..]`` struct holding its pointer, then its dynamic shape values
(int32), then its dynamic strides (int64 for ``sym_int64``). x and y, of shape (M, N) with M and
the row stride dynamic, are 24 bytes: pointer, M at +8, row stride at +16. The weight, of a
static shape, is its pointer alone (8 bytes). eps is an ``.f32`` parameter. ``launch`` checks
each packed argument's size against the PTX's.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from .executor import Schedule, TensorArg, launch
from .parser import Kernel, parse

#: the stages whose kernels this simulator runs (``final``: its plain forward, x, weight and y;
#: not its bias, residual or rstd features, nor the backward ``final_bwd``)
SIMULATED_STAGES = ("naive", "warp", "block", "cluster", "cpasync", "final")


def stage_kernel(stage: str, N: int, dtype, weight_dtype=None, config=None):
    """The stage's kernel object for rows of N (its heuristic's config unless given)."""
    from ..runtime import torch_dtype
    from ..stages import get_stage

    if stage not in SIMULATED_STAGES:
        raise ValueError(f"ptxsim runs the stages {', '.join(SIMULATED_STAGES)}, not {stage!r}")
    module = get_stage(stage)
    dtype = torch_dtype(dtype)
    weight_dtype = torch_dtype(weight_dtype) if weight_dtype is not None else dtype
    if config is None:
        config = module.default_config(N, dtype)
    return module.KERNEL(dtype, N, config, weight_dtype)


@functools.cache
def _compiled(kernel_cls, dtype, weight_dtype, N: int, config) -> Kernel:
    from ..tools.inspect import kernel_report

    report = kernel_report(kernel_cls(dtype, N, config, weight_dtype), M=1)
    return parse(report.ptx)


def compiled_kernel(kernel) -> Kernel:
    """The parsed PTX of a kernel object, compiled once per (class, dtypes, N, config)."""
    return _compiled(type(kernel), kernel.dtype, kernel.weight_dtype, kernel.N, kernel.config)


def run_kernel(kernel, x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6):
    """Simulate a compiled stage kernel object (a stage's, or a subclass with a piece
    replaced) on x (M, N) and weight (N,); return y, a new CPU tensor of x's dtype."""
    return run_ptx(compiled_kernel(kernel), kernel, x, weight, eps)


def run_ptx(
    ptx,
    kernel,
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    out: torch.Tensor | None = None,
    max_steps: int = 5_000_000,
    order: str = "forward",
    seed: int = 0,
) -> torch.Tensor:
    """Simulate ``ptx`` (text or a parsed ``Kernel``), compiled elsewhere for ``kernel``, on x
    (M, N) and weight (N,); return y, a new CPU tensor of x's dtype.

    Only ``kernel``'s host side is used: its launch shape for M rows (grid, block, dynamic shared
    memory), which the stage computes from its config alone, so a copy of the kernel built
    around anything in its hole (never compiled) launches the PTX as the compiled one would.
    ``out``: y's contents before the launch (default: NaN bits, 0xFF bytes); ``max_steps``:
    the launch's budget; ``order``, ``seed``: how the threads run (``executor.Schedule``)."""
    M, N = x.shape
    if N != kernel.N:
        raise ValueError(f"the kernel was built for N={kernel.N}, x has N={N}")
    shape = kernel.launch_shape(M)
    x_bits = _bits(x.contiguous())
    y_bits = np.full_like(x_bits, 0xFF) if out is None else _bits(out.contiguous())
    row = (np.int32(M), np.int64(N))  # the dynamic M and row stride of an (M, N) tensor
    _, _, y_bits = launch(
        ptx if isinstance(ptx, Kernel) else parse(ptx),
        shape.grid,
        shape.block,
        [
            TensorArg(x_bits, row),
            TensorArg(_bits(weight.contiguous())),
            TensorArg(y_bits, row),
            np.float32(eps),
        ],
        dynamic_smem=shape.smem_bytes,
        cluster=shape.cluster,
        schedule=Schedule(order, seed),
        max_steps=max_steps,
    )
    return torch.from_numpy(y_bits).view(x.dtype)


def run_stage(stage: str, x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, config=None):
    """y = RMSNorm(x) * weight computed by simulating the stage's kernel (one of
    ``SIMULATED_STAGES``). No rstd is stored: only y is returned."""
    kernel = stage_kernel(stage, x.shape[1], x.dtype, weight.dtype, config)
    return run_kernel(kernel, x, weight, eps)


def _bits(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's elements as unsigned integers of its width (NumPy has no bfloat16)."""
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    out = t.detach().cpu().view(as_int).numpy()
    return out.view(f"u{t.element_size()}")
