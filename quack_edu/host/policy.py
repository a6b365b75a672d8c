"""Under torch.compile: which norms the CuTe kernels run and which inductor generates."""

from __future__ import annotations

import dataclasses
import os

import torch
from torch import Tensor

from ..reference import rmsnorm_ref as _rmsnorm_ref32
from .checks import check_args, check_number, res_out_dtype_for


@dataclasses.dataclass
class CompilePolicy:
    """Which path a norm takes inside a ``torch.compile``d model, decided when it is traced.

    * ``"kernel"``: always the CuTe kernels (the ops ``quack_edu::rmsnorm_fwd``/``_bwd``).
    * ``"inductor"``: always torch ops, which inductor fuses with the norm's neighbours (the
      residual add, casts, RoPE after a QK-norm) into its own kernels. A call nn.RMSNorm can
      make is written as nn.RMSNorm's users write it (add, then ``F.rms_norm``): the compiled
      graph is the one nn.RMSNorm gives, op for op; other calls (a bias, a weight offset,
      a per-head weight, other output dtypes) use the fp32 reference formula.
    * ``"auto"`` (default), in this order:

      1. the kernels for a norm that needs a gradient (grad mode on, an input requiring grad)
         over rows of at most ``grad_kernel_max_n`` elements and more than
         ``inductor_max_elems`` elements in all: the per-head QK-norms of a training step,
         whose forward and backward the kernels run in less GPU time than inductor's fused
         kernels (the norm kernels' time in a profiled step, model_h4096_aa.json);
      2. inductor for rows of at most ``inductor_max_n`` elements, where its fused norm is
         as fast as the kernels' and saves the passes the op cannot fuse (the cast after a
         hidden norm, the sum of the gradients flowing into it, RoPE after a QK-norm when
         nothing needs a gradient), and for calls of at most ``inductor_max_elems`` elements
         (decoding a few rows, where the op's host cost, a few microseconds, is longer than
         the kernel);
      3. the kernels for longer rows, where inductor's reductions fall behind (65536: 2959
         against 4336 GB/s forward, ladder.json).

      Measured in the decoder of ``quack_edu.tools.model_bench``: the records
      ``model_h2048_aa.json`` and ``model_h4096_aa.json`` (docs/benchmarks.md, "In a model").

    Eager calls always run the kernels. Set it with ``set_compile_policy`` or the environment
    (``QUACK_EDU_COMPILE_POLICY=auto|kernel|inductor``, ``QUACK_EDU_INDUCTOR_MAX_N``,
    ``QUACK_EDU_INDUCTOR_MAX_ELEMS``, ``QUACK_EDU_GRAD_KERNEL_MAX_N``); it is read when a model
    is traced, so a model compiled before a change keeps its path until it is traced again
    (``torch._dynamo.reset()``).
    """

    mode: str = "auto"
    inductor_max_n: int = 16384
    inductor_max_elems: int = 1 << 20
    grad_kernel_max_n: int = 256

    def __post_init__(self):
        if self.mode not in ("auto", "kernel", "inductor"):
            raise ValueError(
                f"compile policy mode must be 'auto', 'kernel' or 'inductor', got {self.mode!r}"
            )
        for name in ("inductor_max_n", "inductor_max_elems", "grad_kernel_max_n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")

    def path(self, x: Tensor, grad: bool = False) -> str:
        """``"kernel"`` or ``"inductor"`` for a norm over ``x`` (..., N); ``grad``: the norm
        needs a gradient (it is traced into a training step)."""
        if self.mode != "auto":
            return self.mode
        N, numel = x.shape[-1], x.numel()
        # a symbolic row count (dynamic shapes) is not known small
        small = isinstance(numel, int) and numel <= self.inductor_max_elems
        if grad and N <= self.grad_kernel_max_n and not small:
            return "kernel"
        if N <= self.inductor_max_n or small:
            return "inductor"
        return "kernel"


def _policy_from_env() -> CompilePolicy:
    env = os.environ
    try:
        return CompilePolicy(
            env.get("QUACK_EDU_COMPILE_POLICY", "auto").strip().lower() or "auto",
            int(env.get("QUACK_EDU_INDUCTOR_MAX_N", CompilePolicy.inductor_max_n)),
            int(env.get("QUACK_EDU_INDUCTOR_MAX_ELEMS", CompilePolicy.inductor_max_elems)),
            int(env.get("QUACK_EDU_GRAD_KERNEL_MAX_N", CompilePolicy.grad_kernel_max_n)),
        )
    except ValueError as e:
        raise ValueError(
            "QUACK_EDU_COMPILE_POLICY / QUACK_EDU_INDUCTOR_MAX_* / QUACK_EDU_GRAD_KERNEL_MAX_N: "
            f"{e}"
        ) from None


_POLICY = _policy_from_env()


def compile_policy() -> CompilePolicy:
    """The policy in force (see ``CompilePolicy``)."""
    return _POLICY


def set_compile_policy(
    mode: str | None = None,
    *,
    inductor_max_n: int | None = None,
    inductor_max_elems: int | None = None,
    grad_kernel_max_n: int | None = None,
) -> CompilePolicy:
    """Change the compile policy (``None`` keeps a field); returns the previous one. Models
    traced afterwards follow it (``torch._dynamo.reset()`` retraces the ones compiled before)."""
    global _POLICY
    old = _POLICY
    _POLICY = dataclasses.replace(
        old,
        **{
            k: v
            for k, v in dict(
                mode=mode,
                inductor_max_n=inductor_max_n,
                inductor_max_elems=inductor_max_elems,
                grad_kernel_max_n=grad_kernel_max_n,
            ).items()
            if v is not None
        },
    )
    return old


def inductor_rmsnorm(x, weight, bias, residual, out_dtype, residual_dtype, eps, prenorm, wo):
    """``rmsnorm`` in torch ops, for inductor to fuse, with the library's output dtypes and
    argument checks.

    A call that ``nn.RMSNorm`` can make (no bias or weight offset, a weight ``(N,)`` or none,
    out and residual_out in the dtype of ``x + residual``) is written as its users write it:
    ``h = x + residual``, then ``F.rms_norm(h)``. The compiled graph is then nn.RMSNorm's, op
    for op (a test compares them), so the swap cannot change what inductor makes of a model.
    Any other call: the project's fp32 reference formula."""
    eps, wo = check_number(eps, "eps"), check_number(wo, "weight_offset")
    check_args(x, weight, bias, residual, out_dtype, residual_dtype, wo)
    rod = res_out_dtype_for(x, residual, residual_dtype)
    h = x if residual is None else x + residual
    want = x.dtype if out_dtype is None else out_dtype
    if (
        bias is None
        and not wo
        and (weight is None or weight.dim() == 1)
        and want == h.dtype
        and (residual is None or rod == h.dtype)
    ):
        out = torch.nn.functional.rms_norm(h, (h.shape[-1],), weight, eps).to(want)
        res_out = h if residual is not None or rod is None else x.to(rod)
        return (out, res_out) if prenorm else out
    got = _rmsnorm_ref32(x, weight, bias, residual, eps, weight_offset=wo)
    if residual is None:
        out, res_out = got, (x if rod is None else x.to(rod))
    else:
        out, h = got
        res_out = h.to(rod)
    out = out.to(want)
    return (out, res_out) if prenorm else out
