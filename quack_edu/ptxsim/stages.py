"""Run a stage kernel of the ladder on the CPU: compile it for sm_90a, simulate its PTX.

    >>> y = run_stage("warp", x, w, eps=1e-6)     # x: (M, N) torch tensor on the CPU
    >>> dx, dw = run_stage("final_bwd", x, w, dout=dout, rstd=rstd)   # the backward, two kernels

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

#: the stages whose forward kernels this simulator runs (``final``: its plain forward, x,
#: weight and y; not its bias, residual or rstd features). The backward: ``run_bwd``.
SIMULATED_STAGES = ("naive", "warp", "block", "cluster", "cpasync", "final")
#: the backward stage ptxsim runs (its library kernel: the atomic variant of lesson 07 needs
#: ``red.global.add.f32`` (.v2, .v4), which ptxsim does not run)
BACKWARD = "final_bwd"


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


def run_stage(
    stage: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    config=None,
    *,
    dout: torch.Tensor | None = None,
    rstd: torch.Tensor | None = None,
):
    """y = RMSNorm(x) * weight computed by simulating the stage's kernel (one of
    ``SIMULATED_STAGES``). No rstd is stored: only y is returned. ``"final_bwd"`` (with
    ``dout`` and the forward's ``rstd``; eps unused) returns (dx, dw): ``run_bwd``."""
    if stage == BACKWARD:
        if dout is None or rstd is None:
            raise ValueError("final_bwd needs dout and the forward's rstd")
        return run_bwd(x, weight, dout, rstd, config)
    kernel = stage_kernel(stage, x.shape[1], x.dtype, weight.dtype, config)
    return run_kernel(kernel, x, weight, eps)


@functools.cache
def _compiled_ptx(kernel_cls, *key) -> Kernel:
    """The parsed PTX of ``kernel_cls(*key)``, compiled once (any kernel with compile_args)."""
    import tempfile

    from ..runtime import compile_kernel
    from ..tools.inspect import _read_artifact

    with tempfile.TemporaryDirectory(prefix="ptxsim_") as tmp:
        compiled = compile_kernel(kernel_cls(*key), f"--keep-ptx --dump-dir {tmp}")
        return parse(_read_artifact(compiled.__ptx__))


def bwd_partial(
    ptx,
    kernel,
    x: torch.Tensor,
    weight: torch.Tensor,
    dout: torch.Tensor,
    rstd: torch.Tensor,
    *,
    grid_x: int | None = None,
    order: str = "forward",
    seed: int = 0,
    max_steps: int = 5_000_000,
):
    """(dx, dw_partial) of a ``final_bwd.FinalBwdRMSNorm`` kernel's PTX (``ptx``: text or
    parsed) launched as ``kernel`` (its host side: grid, block, shared memory, cluster) says:
    ``grid_x`` persistent CTAs (default: the kernel's, at most the row blocks) each walk the
    row blocks b, b + grid_x, ... and store row b of the (grid_x, N) fp32 partial sums of dw
    (NaN-poisoned before the launch, as dx is).

    How the arguments are packed (read off the PTX): x, dout and dx as the forward's x (pointer,
    M, row stride); rstd (M,) fp32 its pointer and M; dw_partial (P, N) fp32 its pointer, P and
    its row stride; grid_x a ``.u32``."""
    M, N = x.shape
    shape = kernel.launch_shape(M)
    P = int(grid_x or shape.grid[0])
    row = (np.int32(M), np.int64(N))
    x_bits = _bits(x.contiguous())
    _, _, _, _, dx_bits, partial, *_ = launch(
        parse(ptx) if isinstance(ptx, str) else ptx,
        (P, *shape.grid[1:]),
        shape.block,
        [
            TensorArg(x_bits, row),
            TensorArg(_bits(weight.contiguous())),
            TensorArg(_bits(dout.contiguous()), row),
            TensorArg(_bits(rstd.float().contiguous()), (np.int32(M),)),
            TensorArg(np.full_like(x_bits, np.iinfo(x_bits.dtype).max), row),  # NaN
            TensorArg(np.full((P, N), 0xFFFFFFFF, np.uint32), (np.int32(P), np.int64(N))),
            np.int32(P),
        ],
        dynamic_smem=shape.smem_bytes,
        cluster=shape.cluster,
        schedule=Schedule(order, seed),
        max_steps=max_steps,
    )
    dx = torch.from_numpy(dx_bits).view(x.dtype)
    return dx, torch.from_numpy(partial.view(np.float32).reshape(P, N).copy())


def run_bwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    dout: torch.Tensor,
    rstd: torch.Tensor,
    config=None,
    *,
    grid_x: int | None = None,
    order: str = "forward",
    seed: int = 0,
    max_steps: int = 5_000_000,
):
    """(dx, dw) of the final stage's backward (``final_bwd.FinalBwdRMSNorm``: x, weight, dout,
    rstd; no bias, residual or weight offset), both kernels simulated: the backward
    (``bwd_partial``), then ``PartialSum``, which adds the partial rows in order into dw in the
    weight's dtype. PartialSum's partial (P, N) passes P, N and the stride, its output N."""
    from ..stages.final_bwd import FinalBwdRMSNorm, PartialSum, default_config

    M, N = x.shape
    config = config or default_config(N, x.dtype, weight.dtype)
    kernel = FinalBwdRMSNorm(x.dtype, N, config, weight.dtype)
    ptx = _compiled_ptx(FinalBwdRMSNorm, x.dtype, N, config, weight.dtype)
    dx, partial = bwd_partial(ptx, kernel, x, weight, dout, rstd, grid_x=grid_x, order=order,
                              seed=seed, max_steps=max_steps)  # fmt: skip
    P = partial.shape[0]
    groups = PartialSum.plan(P)
    summer = PartialSum(weight.dtype, groups)
    w_bits = _bits(torch.empty(N, dtype=weight.dtype))
    _, dw_bits = launch(
        _compiled_ptx(PartialSum, weight.dtype, groups),
        (-(-N // summer.lanes),),
        (summer.lanes * groups,),
        [
            TensorArg(partial.numpy().view(np.uint32), (np.int32(P), np.int32(N), np.int64(N))),
            TensorArg(np.full_like(w_bits, 0xFF), (np.int32(N),)),
        ],
        schedule=Schedule(order, seed),
        max_steps=max_steps,
    )
    return dx, torch.from_numpy(dw_bits).view(weight.dtype)


def _bits(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's elements as unsigned integers of its width (NumPy has no bfloat16)."""
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    out = t.detach().cpu().view(as_int).numpy()
    return out.view(f"u{t.element_size()}")
