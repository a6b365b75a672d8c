"""The library's face: QuACK 0.6.5's ``quack.rmsnorm`` API over the ``final`` kernel.

    rmsnorm_fwd(x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd,
                weight_offset) -> (out, residual_out, rstd)
    rmsnorm(x, weight, ..., prenorm) -> out or (out, residual_out)      (autograd.Function)
    rmsnorm_ref(x, w, bias, residual, eps, weight_offset)                (fp32 reference)
    QuackRMSNorm(dim, eps, elementwise_affine, device, dtype)            (a torch.nn.RMSNorm)
    rmsnorm_fwd_tuned(...)                                               (autotuned config)
    rmsnorm_bwd(x, weight, dout, rstd, dresidual_out, has_bias, has_residual,
                weight_offset) -> (dx, dw, db, dresidual)
    rmsnorm_bwd_tuned(...), rmsnorm_bwd_ref(x, w, dout, rstd, eps, weight_offset)

What this layer adds over the kernel (``quack_edu.stages.final.launch_fwd``):

* **Argument checks** with errors that name the argument and the fix. Shapes and dtypes are
  checked first, the device (CUDA, one GPU, Hopper) last, so every message can be seen on a
  machine without a GPU.
* **Any leading shape.** ``x`` is ``(..., N)``; rows are flattened for the kernel (a view when
  the strides allow, else a copy) and the outputs come back in ``x``'s shape. A per-head
  weight ``(H, D)`` normalises each head of ``x`` ``(..., H, D)`` on its own.
* **torch.library.** The kernel is the custom op ``quack_edu::rmsnorm_fwd``: functional (it
  allocates and returns its outputs, nothing is mutated) with a fake implementation, so
  ``torch.compile(fullgraph=True)`` traces through it and ``torch.library.opcheck`` passes.
  It returns a list: ``out``, then ``residual_out`` if ``residual_out_dtype`` is given, then
  ``rstd`` if ``store_rstd``. The "``residual_out`` is ``x`` itself" case of QuACK's API is an
  alias, which a custom op may not return: it is made here, in Python, outside the op.
* **Host overhead.** Every path (eager, the ops' bodies that inductor's code and CUDA-graph
  capture call, the tuned entries, the backward) runs a call through one cached launch plan
  per key (``_FWD_PLANS``, ``_BWD_PLANS``): the checks, the kernel lookup and its grid are
  done on a key's first call only. Eager calls skip the dispatcher; under ``torch.compile``,
  a ``TorchDispatchMode`` (``FakeTensorMode``, ``make_fx``) or with tensor subclasses the
  registered op is called, a plain ``torch.library.Library`` op (benchmarks/results/
  host_cost.json: ~5 us a norm in a compiled chain, against ~20 us eager). Outputs are
  allocated with torch on the current device and the kernel runs on torch's current stream,
  with no host synchronisation: the eager path can be captured in a CUDA graph.
* **torch.compile policy.** Inside a compiled model ``rmsnorm`` and ``QuackRMSNorm`` hand
  short rows to inductor and call the kernels for long ones (``CompilePolicy``).

This module is the face: the differentiable ``rmsnorm``, ``QuackRMSNorm`` and QuACK's
references are here; the layers behind them are in ``quack_edu.host`` (``checks``, ``ops``,
``forward``, ``backward``, ``policy``), and their public names are re-exported here (their
private names are read where they live).

The backward is the ``final_bwd`` kernel behind the op ``quack_edu::rmsnorm_bwd`` (functional,
with a fake, like the forward's): ``rmsnorm`` and ``QuackRMSNorm`` are differentiable through
``RMSNormFunction``, which saves ``rstd`` only when a gradient may be asked for; the plain call
(``norm(x)``, ``rmsnorm(x, weight)``), once its plan exists, through ``_PlainRMSNorm``, whose
plan holds what ``RMSNormFunction`` decides per call. Forward-only use (inference,
``torch.no_grad``, inputs that need no gradient) skips the autograd.Function and keeps nothing
alive.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .config import MAX_N
from .dtypes import SUPPORTED as SUPPORTED_DTYPES
from .host.backward import plain_backward, rmsnorm_bwd, rmsnorm_bwd_tuned
from .host.forward import _FWD_PLANS, fwd_key, rmsnorm_fwd, rmsnorm_fwd_tuned
from .host.ops import PLAIN_TYPES
from .host.policy import CompilePolicy, compile_policy, inductor_rmsnorm, set_compile_policy
from .reference import rmsnorm_bwd_ref as _rmsnorm_bwd_ref32
from .reference import rmsnorm_ref as _rmsnorm_ref32

__all__ = [
    "rmsnorm_fwd",
    "rmsnorm",
    "rmsnorm_ref",
    "rmsnorm_fwd_tuned",
    "rmsnorm_bwd",
    "rmsnorm_bwd_tuned",
    "rmsnorm_bwd_ref",
    "RMSNormFunction",
    "QuackRMSNorm",
    "CompilePolicy",
    "compile_policy",
    "set_compile_policy",
    "MAX_N",
    "SUPPORTED_DTYPES",
]


# --------------------------------------------------------------------------------------------
# Autograd and the module
# --------------------------------------------------------------------------------------------


_is_compiling = torch.compiler.is_compiling


def _contiguous_last(t, compiling=None):
    """The kernel reads rows with unit stride; ``rmsnorm`` (like QuACK's) accepts any strides
    (rows themselves may sit anywhere: ``host.rows``). Under torch.compile strides of fake
    tensors are not final, so always ask. ``compiling``: ``is_compiling()``, when known."""
    if not isinstance(t, Tensor) or t.dim() == 0:
        return t  # rmsnorm_fwd's checks say what is wrong with it
    if _is_compiling() if compiling is None else compiling:
        return t.contiguous()
    return t if t.stride(-1) == 1 else t.contiguous()


def _grad_of(t) -> bool:
    return isinstance(t, Tensor) and t.requires_grad


class RMSNormFunction(torch.autograd.Function):
    """``rmsnorm`` under autograd: the forward keeps ``rstd`` and the normalised input
    (``x``, or ``residual_out`` with a residual) when a gradient may be asked for."""

    @staticmethod
    def forward(
        ctx,
        x,
        weight,
        bias=None,
        residual=None,
        out_dtype=None,
        residual_dtype=None,
        eps=1e-6,
        prenorm=False,
        weight_offset=0.0,
    ):
        need = any(ctx.needs_input_grad[:4])
        out, residual_out, rstd = rmsnorm_fwd(
            x, weight, bias, residual, out_dtype, residual_dtype, eps, need, weight_offset
        )
        ctx.save_for_backward(x if residual is None else residual_out, weight, rstd)
        ctx.has_bias = bias is not None
        # a per-head bias (H, D) without a weight: rmsnorm_bwd's db would sum over the heads
        # (it only knows has_bias, as QuACK's), so that db is summed here, per head
        ctx.head_bias = None
        if bias is not None and weight is None and bias.dim() == 2:
            ctx.head_bias = (tuple(bias.shape), bias.dtype)
        ctx.has_residual = residual is not None
        ctx.prenorm = prenorm
        ctx.weight_offset = weight_offset
        return (out, residual_out) if prenorm else out

    @staticmethod
    def backward(ctx, dout, *rest):
        x, weight, rstd = ctx.saved_tensors
        # prenorm: residual_out's gradient flows into x's (and the residual's): residual_out is
        # x + residual, or x itself without a residual
        dres_out = rest[0] if ctx.prenorm and rest else None
        compiling = _is_compiling()
        dout = _contiguous_last(dout, compiling)
        if dres_out is not None:
            dres_out = _contiguous_last(dres_out, compiling)
        has_bias = ctx.has_bias and ctx.head_bias is None
        dx, dw, db, dres = rmsnorm_bwd(
            x, weight, dout, rstd, dres_out, has_bias, ctx.has_residual, ctx.weight_offset
        )
        if ctx.head_bias is not None and ctx.needs_input_grad[2]:
            shape, dtype = ctx.head_bias
            db = dout.float().reshape(-1, *shape).sum(dim=0).to(dtype)
        need = ctx.needs_input_grad
        return (
            dx if need[0] else None,
            dw if need[1] else None,
            db if need[2] else None,
            dres if need[3] else None,
            *([None] * 5),
        )


class _PlainRMSNorm(torch.autograd.Function):
    """The plain training call, ``norm(x)`` or ``rmsnorm(x, weight)`` (nothing else asked
    for, a contiguous x), through its launch plan: ``apply(x, weight, plan, eps)`` with the
    plan of the call with rstd saved. What ``RMSNormFunction`` decides per call (which
    outputs, which gradients, a bias's shape) this call's plan holds: the forward saves x's
    rows and rstd as the backward takes them, the backward runs the backward plan the forward's
    plan keeps (``host.backward.plain_backward``)."""

    @staticmethod
    def forward(ctx, x, weight, plan, eps):
        out, rows, rstd = plan.run_saving(x, weight, eps)
        ctx.save_for_backward(rows, weight, rstd)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx, dout):
        rows, weight, rstd = ctx.saved_tensors
        dx, dw = plain_backward(ctx.plan, rows, weight, dout, rstd)
        need = ctx.needs_input_grad
        return dx if need[0] else None, dw if need[1] else None, None, None


class _PrenormRMSNorm(torch.autograd.Function):
    """The module's pre-norm training call ``norm(x, residual)`` (contiguous x and residual of
    one shape, nothing else asked for), through its launch plan, as ``_PlainRMSNorm``:
    ``apply(x, residual, weight, plan, eps)`` -> ``(out, residual_out)``. The forward saves
    residual_out's rows and rstd as the backward takes them; the gradient of x and of the
    residual is one tensor, ``dx`` (``host.backward.plain_backward``), as
    ``RMSNormFunction``'s is."""

    @staticmethod
    def forward(ctx, x, residual, weight, plan, eps):
        out, res_out, rows, rstd = plan.run_prenorm(x, residual, weight, eps)
        ctx.save_for_backward(rows, weight, rstd)
        ctx.plan = plan
        return out, res_out

    @staticmethod
    def backward(ctx, dout, dres_out):
        rows, weight, rstd = ctx.saved_tensors
        dx, dw = plain_backward(ctx.plan, rows, weight, dout, rstd, dres_out)
        need = ctx.needs_input_grad
        return dx if need[0] else None, dx if need[1] else None, dw if need[2] else None, None, None


#: ``_PlainRMSNorm.apply`` without ``Function.apply``'s Python layer, which acts only under a
#: torch.func transform (``_plain_plan`` finds no plan then) or for a Function with a
#: ``setup_context`` (this one has none): 8 Python calls a training call fewer
#: (scripts/host_cost_cpu.py)
_plain_apply = super(torch.autograd.Function, _PlainRMSNorm).apply
_prenorm_apply = super(torch.autograd.Function, _PrenormRMSNorm).apply


_functorch_active = torch._C._are_functorch_transforms_active


def _plain_plan(x, weight, grad: bool):
    """The plan of the plain call ``(x, weight)`` (rstd saved when ``grad``), or None: x a
    ``Tensor`` (contiguous, or rows read in place) of a key that has one, a weight (N,) or
    none, nothing (a dispatch mode, a torch.func transform) that must see the op."""
    if _dispatch_depth() or _functorch_active():
        return None
    if weight is not None and (type(weight) not in PLAIN_TYPES or weight.dim() != 1):
        return None
    return _FWD_PLANS.get(fwd_key(x, weight, None, None, x.dtype, None, grad, 0.0))


def rmsnorm(
    x: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    residual: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    residual_dtype: torch.dtype | None = None,
    eps: float = 1e-6,
    prenorm: bool = False,
    weight_offset: float = 0.0,
):
    """RMSNorm as a differentiable function: ``out``, or ``(out, residual_out)`` with
    ``prenorm``. Arguments as in :func:`rmsnorm_fwd`; ``x`` and ``residual`` may have any
    strides (a copy is made when the last dim is not contiguous).

    Differentiable in x, weight, bias and residual (``rmsnorm_bwd``). Without a gradient to
    record (grad mode off, or no input requiring grad) the autograd.Function is skipped.
    """
    compiling = _is_compiling()
    if (
        not compiling
        and type(x) is Tensor
        and bias is None
        and residual is None
        and out_dtype is None
        and residual_dtype is None
        and not prenorm
        and type(eps) is float
        and type(weight_offset) is float
        and not weight_offset
    ):  # the plain call: through its plan, when it has one
        grad = torch.is_grad_enabled() and (x.requires_grad or _grad_of(weight))
        plan = _plain_plan(x, weight, grad)
        if plan is not None and grad:
            return _plain_apply(x, weight, plan, eps)
        if plan is not None:
            return plan.run_plain(x, weight, eps)
    x = _contiguous_last(x, compiling)
    if residual is not None:
        residual = _contiguous_last(residual, compiling)
    grad = torch.is_grad_enabled() and (
        _grad_of(x) or _grad_of(weight) or _grad_of(bias) or _grad_of(residual)
    )
    if compiling and compile_policy().path(x, grad) == "inductor":
        return inductor_rmsnorm(
            x, weight, bias, residual, out_dtype, residual_dtype, eps, prenorm, weight_offset
        )
    if not grad:
        out, residual_out, _ = rmsnorm_fwd(
            x, weight, bias, residual, out_dtype, residual_dtype, eps, False, weight_offset
        )
        return (out, residual_out) if prenorm else out
    return RMSNormFunction.apply(
        x, weight, bias, residual, out_dtype, residual_dtype, eps, prenorm, weight_offset,
    )  # fmt: skip


def rmsnorm_ref(x, w=None, bias=None, residual=None, eps=1e-6, weight_offset=0.0):
    """QuACK's reference: fp32 math, ``out`` in ``x.dtype``; with a residual also
    ``residual_out = x + residual`` in ``residual.dtype``. Built on the project's one fp32
    reference, ``quack_edu.reference.rmsnorm_ref``."""
    res = _rmsnorm_ref32(x, w, bias, residual, eps, weight_offset=weight_offset)
    if residual is None:
        return res.to(x.dtype)
    out, residual_out = res
    return out.to(x.dtype), residual_out.to(residual.dtype)


def rmsnorm_bwd_ref(x, w, dout, rstd, eps=1e-6, weight_offset=0.0):
    """QuACK's backward reference: ``(dx, dw)``, fp32 math, dx in ``x.dtype`` and dw in
    ``w.dtype`` (None without a weight). ``eps`` is unused (rstd is given), as in QuACK.
    Built on ``quack_edu.reference.rmsnorm_bwd_ref``."""
    dx, dw, _ = _rmsnorm_bwd_ref32(x, w, dout, rstd, weight_offset=weight_offset)
    return dx.to(x.dtype), None if w is None else dw.to(w.dtype)


_module_call = torch.nn.Module.__call__
#: the global hooks ``nn.Module``'s call runs (the short way in ``QuackRMSNorm`` is taken only
#: when there are none)
_GLOBAL_FWD_PRE_HOOKS = torch.nn.modules.module._global_forward_pre_hooks
_GLOBAL_FWD_HOOKS = torch.nn.modules.module._global_forward_hooks
_GLOBAL_BWD_PRE_HOOKS = torch.nn.modules.module._global_backward_pre_hooks
_GLOBAL_BWD_HOOKS = torch.nn.modules.module._global_backward_hooks
_tracing_state = torch._C._get_tracing_state
_dispatch_depth = torch._C._len_torch_dispatch_stack


def _requires_grad(t) -> bool:
    return t is not None and t.requires_grad


class QuackRMSNorm(torch.nn.RMSNorm):
    """A drop-in ``torch.nn.RMSNorm`` whose forward is the quack_edu kernel.

    Same parameters, state dict and meaning as ``nn.RMSNorm``: ``dim`` may be an int or a
    shape (normalise over the last ``len(dim)`` dims jointly: they are flattened into one row
    and the weight viewed as ``(N,)``); ``eps=None`` means ``torch.finfo(x.dtype).eps``;
    ``elementwise_affine=False`` has no weight. The default ``eps`` is QuACK's, 1e-6.

    Output dtype: ``x.dtype``, whatever the weight's dtype. That is what ``nn.RMSNorm`` returns
    in PyTorch 2.13 (bf16 ``x`` with an fp32 weight gives bf16: ``F.rms_norm`` casts the
    result back to the input's dtype) and what QuACK's module returns.
    """

    def __init__(
        self, dim, eps: float | None = 1e-6, elementwise_affine: bool = True, device=None,
        dtype=None,
    ):  # fmt: skip
        super().__init__(dim, eps, elementwise_affine, device=device, dtype=dtype)
        # N of a one-dim row: the inference call's fast path (0: the general path)
        self._row_n = self.normalized_shape[0] if len(self.normalized_shape) == 1 else 0
        self._plans = {}  # _plan's

    def __call__(self, *args, **kwargs):
        """``nn.Module``'s call, with a short way for the plain call ``norm(x)`` and the
        pre-norm call ``norm(x, residual)`` (training or inference) without hooks, tracing or
        compiling: straight to the key's plan, through ``_PlainRMSNorm`` or ``_PrenormRMSNorm``
        when autograd records it. ``nn.Module``'s own call and ``forward``'s checks cost as
        much as the rest of the call's Python (scripts/host_cost_cpu.py)."""
        # is_compiling first: under dynamo it is a constant, and what it skips adds no guards
        if not _is_compiling() and 0 < len(args) < 3 and not kwargs and self._row_n:
            x = args[0]
            if (
                type(x) is Tensor
                and type(self.eps) is float
                and self._compiled_call_impl is None
                and not (
                    self._forward_pre_hooks
                    or self._forward_hooks
                    or self._backward_pre_hooks
                    or self._backward_hooks
                    or _GLOBAL_FWD_PRE_HOOKS
                    or _GLOBAL_FWD_HOOKS
                    or _GLOBAL_BWD_PRE_HOOKS
                    or _GLOBAL_BWD_HOOKS
                )  # fmt: skip
                and not _tracing_state()
            ):
                w = self._parameters["weight"]  # (not through nn.Module's __getattr__)
                if len(args) == 1:
                    grad = torch.is_grad_enabled() and (x.requires_grad or _requires_grad(w))
                    plan = self._plan(x, w, grad)
                    if plan is not None:
                        if grad:
                            return _plain_apply(x, w, plan, self.eps)
                        return plan.run_plain(x, w, self.eps)
                elif type(args[1]) is Tensor:
                    r = args[1]
                    grad = torch.is_grad_enabled() and (
                        x.requires_grad or r.requires_grad or _requires_grad(w)
                    )
                    plan = self._prenorm_plan(x, r, w, grad)
                    if plan is not None:
                        if grad:
                            return _prenorm_apply(x, r, w, plan, self.eps)
                        return plan.run_prenorm(x, r, w, self.eps)[:2]
        return _module_call(self, *args, **kwargs)

    def _plan(self, x: Tensor, w, grad: bool):
        """The plan of the plain call ``norm(x)`` (rstd saved when ``grad``), or None where
        there is none yet (``_plain_plan``). The module keeps the plans it used, by what of
        the key can change from call to call (x's dtype, N, device, alignment, grad, a strided
        x's shape and strides): the weight is its own, so its part of the key is checked by
        identity and address, not recomputed."""
        if not x.dim():
            return None
        strided = None if x.is_contiguous() else (x.shape, x.stride())
        key = (x.dtype, x.shape[-1], x.get_device(), x.data_ptr() & 15, grad, strided)
        got = self._plans.get(key)
        if got is not None:
            if got[0] is w and (w is None or got[1] == w.data_ptr()):
                if _dispatch_depth() or _functorch_active():
                    return None
                return got[2]
            self._plans = {}  # another weight, or new data under it: the plans were the old's
        if x.shape[-1] != self._row_n:  # (a plan in the module's keeps this true)
            return None
        plan = _plain_plan(x, w, grad)
        if plan is not None:
            self._plans[key] = (w, None if w is None else w.data_ptr(), plan)
        return plan

    def _prenorm_plan(self, x: Tensor, r: Tensor, w, grad: bool):
        """The plan of the pre-norm call ``norm(x, residual)`` (rstd saved when ``grad``), or
        None: x and the residual contiguous, of one shape, with a plan of rows (M, N) that an
        earlier call through ``forward`` made (a key of ``_FWD_PLANS``). Kept in ``_plans``
        as ``_plan``'s are, by what can change from call to call."""
        if not (x.is_contiguous() and r.is_contiguous()) or x.shape != r.shape or not x.dim():
            return None
        key = ("prenorm", x.dtype, r.dtype, x.shape[-1], x.get_device(), r.get_device(),
               (x.data_ptr() | r.data_ptr()) & 15, grad)  # fmt: skip
        got = self._plans.get(key)
        if got is not None:
            if got[0] is w and (w is None or got[1] == w.data_ptr()):
                if _dispatch_depth() or _functorch_active():
                    return None
                return got[2]
            self._plans = {}  # another weight, or new data under it: the plans were the old's
        if x.shape[-1] != self._row_n or _dispatch_depth() or _functorch_active():
            return None
        if w is not None and (type(w) not in PLAIN_TYPES or w.dim() != 1):
            return None
        dtype = torch.promote_types(x.dtype, r.dtype)  # forward's out and residual_out dtype
        plan = _FWD_PLANS.get(fwd_key(x, w, None, r, dtype, dtype, grad, 0.0))
        if plan is None or not plan.plain:
            return None
        self._plans[key] = (w, None if w is None else w.data_ptr(), plan)
        return plan

    def __getstate__(self):  # the plans hold compiled kernels: a copy makes its own
        state = super().__getstate__()
        state.pop("_plans", None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._plans = {}

    def forward(self, x: Tensor, residual: Tensor | None = None):
        """``norm(x)``; with a ``residual``, the pre-norm form of serving engines: ``(out,
        residual_out)`` with ``residual_out = x + residual`` and ``out = norm(residual_out)``,
        both in the dtype of ``x + residual`` (what adding them and then calling
        ``nn.RMSNorm`` gives), in one kernel; differentiable in x, residual and the weight.
        (The short ways of the plain and the pre-norm call are ``__call__``'s.)"""
        shape = self.normalized_shape
        k = len(shape)
        if not isinstance(x, Tensor):
            raise TypeError(
                f"x must be a torch.Tensor of shape (..., *{shape}), got {type(x).__name__}"
            )
        if x.shape[-k:] != shape:
            got = tuple(x.shape)
            raise ValueError(f"QuackRMSNorm{shape} expects x of shape (..., *{shape}), got {got}")
        eps = self.eps
        if eps is None:  # nn.RMSNorm's default: x's machine epsilon (an int x: rmsnorm says why)
            eps = torch.finfo(x.dtype).eps if x.is_floating_point() else 0.0
        weight, shape_in = self.weight, x.shape
        if residual is not None:
            if not isinstance(residual, Tensor) or residual.shape != x.shape:
                got = getattr(residual, "shape", type(residual).__name__)
                raise ValueError(
                    f"residual must be a tensor of x's shape {tuple(x.shape)}, got {got}"
                )
            dtype = torch.promote_types(x.dtype, residual.dtype)
        if k > 1:  # the last k dims are one row
            rows = (*x.shape[:-k], -1)
            x = x.reshape(rows)
            residual = None if residual is None else residual.reshape(rows)
            weight = None if weight is None else weight.reshape(-1)
        if residual is None:
            out = rmsnorm(x, weight, eps=eps)
            return out if k == 1 else out.view(shape_in)
        out, res_out = rmsnorm(
            x, weight, residual=residual, out_dtype=dtype, residual_dtype=dtype, eps=eps,
            prenorm=True,
        )  # fmt: skip
        if k > 1:
            out, res_out = out.view(shape_in), res_out.view(shape_in)
        return out, res_out


from . import distributed  # noqa: E402,F401  (DTensor sharding rules of the ops above)
