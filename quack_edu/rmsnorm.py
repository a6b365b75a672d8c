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

The backward is the ``final_bwd`` kernel behind the op ``quack_edu::rmsnorm_bwd`` (functional,
with a fake, like the forward's): ``rmsnorm`` and ``QuackRMSNorm`` are differentiable through
``RMSNormFunction``, which saves ``rstd`` only when a gradient may be asked for. Forward-only
use (inference, ``torch.no_grad``, inputs that need no gradient) skips the autograd.Function and
keeps nothing alive.
"""

from __future__ import annotations

import dataclasses
import numbers
import os

import torch
from torch import Tensor

from .config import MAX_N
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

#: dtypes of every tensor argument (x, weight, bias, residual) and of out/residual_out
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_SUPPORTED = frozenset(SUPPORTED_DTYPES)
_SUPPORTED_NAMES = "torch.float16, torch.bfloat16 or torch.float32"


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def _check_tensor(t, name: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dtype not in _SUPPORTED:
        raise TypeError(f"{name} has dtype {t.dtype}; supported: {_SUPPORTED_NAMES}")
    if t.dim() and t.stride(-1) != 1:
        raise ValueError(
            f"{name} must have a last-dim stride of 1 (got strides {tuple(t.stride())}); "
            f"pass {name}.contiguous()"
        )


def _check_dtype_arg(dtype, name: str) -> None:
    if dtype is not None and dtype not in _SUPPORTED:
        raise TypeError(f"{name} must be None or one of {_SUPPORTED_NAMES}, got {dtype!r}")


def _check_args(x, weight, bias, residual, out_dtype, residual_dtype, weight_offset) -> None:
    """Shapes and dtypes, no device query: what can be checked on any machine."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., N), got a 0-d tensor")
    _check_tensor(x, "x")
    N = x.shape[-1]
    if N == 0:
        raise ValueError(f"x has shape {tuple(x.shape)}: N = 0, the mean of an empty row")
    if N > MAX_N:
        raise ValueError(f"x has N = {N} columns; the kernel handles rows of at most {MAX_N}")
    if weight is not None:
        _check_tensor(weight, "weight")
        _check_param_shape(weight, x, "weight")
    if bias is not None:
        _check_tensor(bias, "bias")
        if weight is not None and bias.shape != weight.shape:
            raise ValueError(
                f"bias must have weight's shape {tuple(weight.shape)}, got {tuple(bias.shape)}"
            )
        _check_param_shape(bias, x, "bias")
    if residual is not None:
        _check_tensor(residual, "residual")
        if residual.shape != x.shape:
            raise ValueError(
                f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}"
            )
    _check_dtype_arg(out_dtype, "out_dtype")
    _check_dtype_arg(residual_dtype, "residual_dtype")
    if weight_offset != 0.0 and weight is None:
        raise ValueError(f"weight_offset={weight_offset} needs a weight (it is added to it)")


def _check_number(value, name: str) -> float:
    """``value`` as a float, or a TypeError naming the argument (not a conversion error later,
    or a crash in the kernel's call)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a real number (a Python float such as 1e-6), got "
            f"{type(value).__name__} {value!r:.40}"
        )
    return float(value)


def _check_param_shape(p: Tensor, x: Tensor, name: str) -> None:
    if p.dim() == 1:
        if p.shape[0] != x.shape[-1]:
            raise ValueError(
                f"{name} must have shape ({x.shape[-1]},), x's last dim, got {tuple(p.shape)} "
                "(or (H, D) = x.shape[-2:] for a per-head weight)"
            )
    elif p.dim() == 2:
        if x.dim() < 2 or p.shape != x.shape[-2:]:
            raise ValueError(
                f"a 2-D (per-head) {name} must have shape (H, D) = x.shape[-2:], got "
                f"{tuple(p.shape)} for x of shape {tuple(x.shape)}"
            )
    else:
        raise ValueError(
            f"{name} must be 1-D (N,) or 2-D (H, D) for a per-head weight, got shape "
            f"{tuple(p.shape)}"
        )


def _check_device(x: Tensor, *others) -> None:
    """``runtime.check_device``: one CUDA device, a Hopper GPU. ``others``: (name, tensor)."""
    from .runtime import check_device

    check_device(x, *others, without_gpu="quack_edu.rmsnorm_ref computes the same thing")


# --------------------------------------------------------------------------------------------
# The custom op: body, fake, and the eager fast path
# --------------------------------------------------------------------------------------------

_final_mod = None
_DENSE = torch.contiguous_format  # outputs are dense whatever x's strides


def _final():
    """``quack_edu.stages.final``, imported on first use (it imports CuTe DSL)."""
    global _final_mod
    if _final_mod is None:
        from .stages import final

        _final_mod = final
    return _final_mod


def _rows_shape(x, weight, bias) -> tuple:
    """The kernel's view of x: (-1, N) rows, or (-1, H, D) with a per-head weight or bias."""
    p = weight if weight is not None else bias
    return (-1, *x.shape[-2:]) if p is not None and p.dim() == 2 else (-1, x.shape[-1])


def _launch(x, weight, bias, residual, out, res_out, rstd, eps, weight_offset, config):
    """Launch on x's rows: (M, N), or (M, H, D) with a per-head weight; other leading shapes
    are flattened (a view when x's strides allow it, else a copy)."""
    rows = _rows_shape(x, weight, bias)
    if x.dim() != len(rows):
        x, out = x.reshape(rows), out.view(rows)
        residual = None if residual is None else residual.reshape(rows)
        res_out = None if res_out is None else res_out.view(rows)
        rstd = None if rstd is None else rstd.view(rows[:-1])
    _final().launch_fwd(x, weight, bias, residual, out, res_out, rstd, eps, weight_offset, config)


def _forward(
    x, weight, bias, residual, out_dtype, residual_out_dtype, eps, store_rstd, weight_offset, config
):
    """Allocate the outputs in x's shape and launch the kernel on x's rows: the op's body.
    Returns [out, residual_out if residual_out_dtype, rstd if store_rstd]."""
    outs = [torch.empty_like(x, dtype=out_dtype, memory_format=_DENSE)]
    res_out = rstd = None
    if residual_out_dtype is not None:
        res_out = torch.empty_like(x, dtype=residual_out_dtype, memory_format=_DENSE)
        outs.append(res_out)
    if store_rstd:
        rstd = x.new_empty(x.shape[:-1], dtype=torch.float32)
        outs.append(rstd)
    if x.numel():
        _launch(x, weight, bias, residual, outs[0], res_out, rstd, eps, weight_offset, config)
    return outs


def _fwd_body(
    x, weight, bias, residual, out_dtype, residual_out_dtype, eps, store_rstd, weight_offset
):
    """The op's body (what inductor's code and the eager wrappers run)."""
    return _fwd_planned_body(
        None, x, weight, bias, residual, out_dtype, residual_out_dtype, eps, store_rstd,
        weight_offset,
    )  # fmt: skip


def _fwd_tuned_body(
    x, weight, bias, residual, out_dtype, residual_out_dtype, eps, store_rstd, weight_offset
):
    """The tuned op's body: the autotuner's config."""
    return _fwd_planned_body(
        _tuned_config, x, weight, bias, residual, out_dtype, residual_out_dtype, eps,
        store_rstd, weight_offset,
    )  # fmt: skip


def _fwd_planned_body(tune, x, weight, bias, residual, out_dtype, res_out_dtype, eps, store_rstd,
                      wo):  # fmt: skip
    """Either body: the call's launch plan when its key has one, else ``_fwd_first``. A tuned
    call (``tune``: the tuner) has a plan per key and power of two of rows, the tuning key's M."""
    key = _fwd_key(x, weight, bias, residual, out_dtype, res_out_dtype, store_rstd, wo)
    if key is not None and tune is not None:
        key = (key, max(0, x.numel() // x.shape[-1] - 1).bit_length())
    plan = _FWD_PLANS.get(key)
    if plan is not None and (residual is None or residual.shape == x.shape):
        return plan.run(x, weight, bias, residual, eps)
    return _fwd_first(
        key, tune, x, weight, bias, residual, out_dtype, res_out_dtype, eps, store_rstd, wo
    )


# --------------------------------------------------------------------------------------------
# Launch plans: what a key of the call decides, found once
# --------------------------------------------------------------------------------------------

#: The tensor types a plan takes: a parameter is a tensor. Subclasses that must see the op
#: (DTensor, FakeTensor, FunctionalTensor) are not in it, and go through the op.
_PLAIN_TYPES = (Tensor, torch.nn.Parameter)

#: key -> ``_FwdPlan``. A key holds every fact of a call that decides its kernel and its
#: checks: dtypes, N (and H for a per-head weight), the weight's and bias's shapes, devices,
#: contiguity, the 16-byte alignment of the pointers (a contiguous tensor's rows are N elements
#: apart: a fact of dtype and N), the outputs asked for. An entry is made only after a call
#: with that key went through every check and ran (``_fwd_first``), so a hit needs none of
#: them again. What a key cannot hold (a residual's shape) is compared on every hit.
_FWD_PLANS: dict = {}


def _fwd_key(x, weight, bias, residual, out_dtype, res_out_dtype, store_rstd, wo):
    """The call's plan key, or None when the call cannot have a plan (a tensor subclass, a
    strided tensor, an argument of an unexpected type): then every call is checked."""
    if type(x) not in _PLAIN_TYPES or not x.is_contiguous() or not x.dim():
        return None
    if type(out_dtype) is not torch.dtype or type(wo) is not float or type(store_rstd) is not bool:
        return None
    if res_out_dtype is not None and type(res_out_dtype) is not torch.dtype:
        return None
    bits = x.data_ptr()
    parts = []
    for t in (weight, bias, residual):
        if t is None:
            parts.append(None)
            continue
        if type(t) not in _PLAIN_TYPES or not t.is_contiguous():
            return None
        bits |= t.data_ptr()
        parts.append((t.dtype, t.shape if t is not residual else None, t.get_device()))
    p = weight if weight is not None else bias
    head = 0
    if p is not None and p.dim() == 2:
        if x.dim() < 3:
            return None
        head = x.shape[-2]
    return (
        x.dtype, x.shape[-1], head, x.get_device(), *parts, out_dtype, res_out_dtype,
        store_rstd, wo, bits & 15,
    )  # fmt: skip


def _plain_key(x, w):
    """``_fwd_key`` of the plain call ``(x, w)`` (nothing else, out in x's dtype): the same
    tuple, with less work, for the module's inference call."""
    if not x.dim() or not x.is_contiguous():
        return None
    if w is not None and (type(w) not in _PLAIN_TYPES or w.dim() != 1):
        return None
    if w is None:
        return (x.dtype, x.shape[-1], 0, x.get_device(), None, None, None, x.dtype, None,
                False, 0.0, x.data_ptr() & 15)  # fmt: skip
    if not w.is_contiguous():
        return None
    return (
        x.dtype, x.shape[-1], 0, x.get_device(), (w.dtype, w.shape, w.get_device()), None, None,
        x.dtype, None, False, 0.0, (x.data_ptr() | w.data_ptr()) & 15,
    )  # fmt: skip


class _FwdPlan:
    """A key's launch: the compiled kernel's call, the rows' shape, the outputs to allocate."""

    __slots__ = ("fn", "rows", "out_dtype", "res_out_dtype", "store_rstd")

    def __init__(self, fn, rows, out_dtype, res_out_dtype, store_rstd):
        self.fn, self.rows, self.out_dtype = fn, rows, out_dtype
        self.res_out_dtype, self.store_rstd = res_out_dtype, store_rstd

    def run_plain(self, x, weight, eps):
        """``out`` of a plain call's plan (``_plain_key``): ``run`` with nothing to decide."""
        out = torch.empty_like(x)
        if x.dim() == 2:
            if x.shape[0]:
                self.fn(x, weight, None, None, out, None, None, eps)
        elif x.numel():
            rows = self.rows
            self.fn(x.view(rows), weight, None, None, out.view(rows), None, None, eps)
        return out

    def run(self, x, weight, bias, residual, eps):
        """[out, residual_out if asked, rstd if asked], as ``_forward``; x contiguous."""
        out = torch.empty_like(x, dtype=self.out_dtype)
        outs = [out]
        res_out = rstd = None
        if self.res_out_dtype is not None:
            res_out = torch.empty_like(x, dtype=self.res_out_dtype)
            outs.append(res_out)
        if self.store_rstd:
            rstd = x.new_empty(x.shape[:-1], dtype=torch.float32)
            outs.append(rstd)
        if not x.numel():
            return outs
        rows = self.rows
        if x.dim() != len(rows):
            x, out = x.view(rows), out.view(rows)
            if residual is not None:
                residual = residual.view(rows)
            if res_out is not None:
                res_out = res_out.view(rows)
            if rstd is not None:
                rstd = rstd.view(rows[:-1])
        self.fn(x, weight, bias, residual, out, res_out, rstd, eps)
        return outs


def _fwd_first(key, tune, x, weight, bias, residual, out_dtype, res_out_dtype, eps, store_rstd, wo):
    """A call without a plan: every check (the op may be called directly), the kernel compiled
    on first use and run; then the key's plan is made, for a call with rows."""
    _check_args(x, weight, bias, residual, out_dtype, res_out_dtype, wo)
    _check_device(x, ("weight", weight), ("bias", bias), ("residual", residual))
    config = None
    if tune is not None:
        config = tune(x, weight, bias, residual, out_dtype, res_out_dtype, eps, store_rstd, wo)
    outs = _forward(
        x, weight, bias, residual, out_dtype, res_out_dtype, eps, store_rstd, wo, config
    )
    if key is not None and x.numel():  # a plan holds a kernel: only for a call that ran one
        rows = _rows_shape(x, weight, bias)

        def view(t):
            return None if t is None else t.view(rows)

        res_out = outs[1] if res_out_dtype is not None else None
        rstd = outs[-1].view(rows[:-1]) if store_rstd else None
        kernel = _final().kernel_for(
            view(x), weight, bias, view(residual), view(outs[0]), view(res_out), rstd, wo, config
        )  # the kernel the call above ran
        _FWD_PLANS[key] = _FwdPlan(kernel.call, rows, out_dtype, res_out_dtype, store_rstd)
    return outs


def _fwd_fake(
    x, weight, bias, residual, out_dtype, residual_out_dtype, eps, store_rstd, weight_offset
):
    outs = [x.new_empty(x.shape, dtype=out_dtype)]
    if residual_out_dtype is not None:
        outs.append(x.new_empty(x.shape, dtype=residual_out_dtype))
    if store_rstd:
        outs.append(x.new_empty(x.shape[:-1], dtype=torch.float32))
    return outs


#: One library for the package's ops. ``torch.library.custom_op`` would add ~25 µs of Python
#: layers to every call of an op (its autograd and aliasing wrappers), which is what inductor's
#: compiled code and CUDA-graph capture call; a plain ``Library`` registration costs the
#: dispatcher alone (~4 µs against ~28 µs a call on the project's CPU machine, 2026-12-02;
#: in a compiled graph on the H200: benchmarks/results/host_cost.json).
#: The ops have no autograd kernel: ``rmsnorm`` / ``RMSNormFunction`` make them differentiable,
#: as QuACK's ops are through its autograd.Function.
_LIB = torch.library.Library("quack_edu", "DEF")


def _define(name: str, body, schema: str, fake):
    """A functional op ``quack_edu::name`` (nothing mutated, every output new) with its fake.
    Returns the ``OpOverload`` that inductor and the wrappers call."""
    _LIB.define(name + schema)
    _LIB.impl(name, body, "CompositeExplicitAutograd")
    torch.library.register_fake(f"quack_edu::{name}", fake, lib=_LIB)
    return getattr(torch.ops.quack_edu, name).default


_FWD_SCHEMA = (
    "(Tensor x, Tensor? weight, Tensor? bias, Tensor? residual, ScalarType out_dtype, "
    "ScalarType? residual_out_dtype, float eps, bool store_rstd, float weight_offset) -> Tensor[]"
)
_fwd_op = _define("rmsnorm_fwd", _fwd_body, _FWD_SCHEMA, _fwd_fake)
_fwd_tuned_op = _define("rmsnorm_fwd_tuned", _fwd_tuned_body, _FWD_SCHEMA, _fwd_fake)


def _through_op(x) -> bool:
    """Call the registered op (not its body) when something has to see it: dynamo tracing,
    a dispatch mode (FakeTensorMode, make_fx, opcheck), or a tensor subclass."""
    return (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack() > 0
        or type(x) not in _PLAIN_TYPES
    )


def _res_out_dtype(x, residual, residual_dtype):
    """residual_out's dtype; None where residual_out is x itself (no residual, and no other
    dtype asked for)."""
    if residual is not None:
        return residual.dtype if residual_dtype is None else residual_dtype
    if residual_dtype is not None and residual_dtype != x.dtype:
        return residual_dtype
    return None


def _fwd_outputs(outs, x, res_out_dtype, store_rstd):
    """The op's list as QuACK's ``(out, residual_out, rstd)``."""
    if res_out_dtype is None:
        return outs[0], x, outs[1] if store_rstd else None
    return outs[0], outs[1], outs[2] if store_rstd else None


def _planned(x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd, wo):
    """``rmsnorm_fwd``'s result through the call's plan, or None (then the checked path). A
    plan exists only for a key that passed every check, so a hit skips them all."""
    if type(eps) is not float or type(x) not in _PLAIN_TYPES or _through_op(x):
        return None
    if residual is not None and (type(residual) not in _PLAIN_TYPES or residual.shape != x.shape):
        return None
    out_dtype = x.dtype if out_dtype is None else out_dtype
    rod = _res_out_dtype(x, residual, residual_dtype)
    plan = _FWD_PLANS.get(_fwd_key(x, weight, bias, residual, out_dtype, rod, store_rstd, wo))
    if plan is None:
        return None
    return _fwd_outputs(plan.run(x, weight, bias, residual, eps), x, rod, store_rstd)


def _fwd(op, body, x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd, wo):
    eps, wo = _check_number(eps, "eps"), _check_number(wo, "weight_offset")
    _check_args(x, weight, bias, residual, out_dtype, residual_dtype, wo)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    res_out_dtype = _res_out_dtype(x, residual, residual_dtype)
    call = op if _through_op(x) else body
    store_rstd = bool(store_rstd)
    outs = call(x, weight, bias, residual, out_dtype, res_out_dtype, eps, store_rstd, wo)
    return _fwd_outputs(outs, x, res_out_dtype, store_rstd)


def rmsnorm_fwd(
    x: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    residual: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    residual_dtype: torch.dtype | None = None,
    eps: float = 1e-6,
    store_rstd: bool = False,
    weight_offset: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """RMSNorm forward on the GPU: ``(out, residual_out, rstd)``.

    ``x`` ``(..., N)``; ``weight``/``bias`` ``(N,)``, or ``(H, D)`` to normalise each head of
    ``x`` ``(..., H, D)`` separately; ``residual`` like ``x``. With a residual the normalised
    input is ``x + residual``, returned as ``residual_out`` (in ``residual_dtype``, default
    ``residual.dtype``); without one ``residual_out`` is ``x`` itself, unless ``residual_dtype``
    asks for another dtype (then a converted copy). ``out`` is in ``out_dtype`` (default
    ``x.dtype``); ``rstd`` (float32, ``x.shape[:-1]``) only with ``store_rstd``, else None.
    ``out = (x + residual) * rstd * (weight + weight_offset) + bias``, all in fp32.
    """
    if (
        bias is None
        and residual is None
        and out_dtype is None
        and residual_dtype is None
        and store_rstd is False
        and type(x) in _PLAIN_TYPES
        and type(eps) is float
        and type(weight_offset) is float
        and not weight_offset
        and not _through_op(x)
    ):  # the plain call, a model's in every layer
        plan = _FWD_PLANS.get(_plain_key(x, weight))
        if plan is not None:
            return plan.run_plain(x, weight, eps), x, None
    got = _planned(
        x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd, weight_offset
    )
    if got is not None:
        return got
    return _fwd(
        _fwd_op, _fwd_body, x, weight, bias, residual, out_dtype, residual_dtype, eps,
        store_rstd, weight_offset,
    )  # fmt: skip


def rmsnorm_fwd_tuned(
    x: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    residual: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    residual_dtype: torch.dtype | None = None,
    eps: float = 1e-6,
    store_rstd: bool = False,
    weight_offset: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``rmsnorm_fwd`` with the kernel config chosen by timing every candidate.

    The first call for a key (GPU, N, every dtype, the features used) tunes: each candidate of
    ``final.configs`` is compiled, checked against the heuristic config's output and timed;
    the fastest is kept in memory and in the on-disk cache (``quack_edu.autotune``). Later
    calls, in this process or the next, launch it directly. Tuning synchronises the GPU, so
    the first call must not be inside CUDA-graph capture.
    """
    return _fwd(
        _fwd_tuned_op, _fwd_tuned_body, x, weight, bias, residual, out_dtype, residual_dtype,
        eps, store_rstd, weight_offset,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Autotuned config
# --------------------------------------------------------------------------------------------

_tuner = None
_gpu_names: dict[int, str] = {}


def _name(t) -> str:
    return "-" if t is None else str(t).removeprefix("torch.")


def _key_head(op: str, x) -> tuple:
    """The first fields of a tuning key: the op, the GPU, the rows to the next power of two (a
    config timed on 8 rows, launch-bound, one wave, says little about 32768, many waves; one
    key per M would tune every batch size), N and x's dtype."""
    index = x.get_device()
    gpu = _gpu_names.get(index)
    if gpu is None:
        gpu = _gpu_names[index] = torch.cuda.get_device_name(index)
    rows = x.numel() // max(1, x.shape[-1])
    return (
        ("op", op),
        ("gpu", gpu),
        ("M", 1 << max(0, rows - 1).bit_length()),
        ("N", x.shape[-1]),
        ("x", _name(x.dtype)),
    )


def _the_tuner():
    global _tuner
    if _tuner is None:
        from .autotune import Autotuner

        _tuner = Autotuner()
    return _tuner


def _tune_key(x, weight, bias, residual, out_dtype, res_out_dtype, store_rstd, weight_offset):
    per_head = any(p is not None and p.dim() == 2 for p in (weight, bias))
    return (
        *_key_head("rmsnorm_fwd", x),
        ("out", _name(out_dtype)),
        ("residual", _name(None if residual is None else residual.dtype)),
        ("residual_out", _name(res_out_dtype)),
        ("weight", _name(None if weight is None else weight.dtype)),
        ("bias", _name(None if bias is None else bias.dtype)),
        ("per_head", per_head),
        ("store_rstd", bool(store_rstd)),
        ("weight_offset", weight_offset != 0.0),
    )


def _tuned_config(x, weight, bias, residual, out_dtype, res_out_dtype, eps, store_rstd, wo):
    tuner = _the_tuner()
    key = _tune_key(x, weight, bias, residual, out_dtype, res_out_dtype, store_rstd, wo)
    config = tuner.cached(key, tuner)  # the tuner itself as the "not tuned yet" sentinel
    if config is not tuner:
        return config
    if not x.numel():
        return None  # nothing to time: the heuristic (nothing is launched anyway)
    final = _final()
    wdtype = weight.dtype if weight is not None else None

    def candidates():
        # None: the heuristic's pick for these very tensors (launch_fwd's config=None), which
        # also gives the output every other candidate must match
        return [None, *final.configs(x.shape[-1], x.dtype, wdtype)]

    # Time on copies, so tuning never writes over anything the caller holds.
    xc, rc = x.clone(), None if residual is None else residual.clone()
    outs = _forward(xc, weight, bias, rc, out_dtype, res_out_dtype, eps, store_rstd, wo, None)
    res_out = outs[1] if res_out_dtype is not None else None
    rstd = outs[-1] if store_rstd else None

    def bench(config):
        _launch(xc, weight, bias, rc, outs[0], res_out, rstd, eps, wo, config)
        return outs

    def run(config):
        for t in outs:
            t.fill_(float("nan"))  # an element the config forgets to write fails the check
        return bench(config)

    return tuner.tune(key, candidates, run, bench=bench)


# --------------------------------------------------------------------------------------------
# Autograd and the module
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# The backward: checks, the custom op, the public functions
# --------------------------------------------------------------------------------------------


def _check_bwd_args(x, weight, dout, rstd, dresidual_out, weight_offset) -> None:
    """Shapes and dtypes of ``rmsnorm_bwd``'s arguments (no device query)."""
    _check_args(x, weight, None, None, None, None, weight_offset)
    for t, name in ((dout, "dout"), (dresidual_out, "dresidual_out")):
        if t is None:
            if name == "dout":
                raise TypeError("dout must be a torch.Tensor (the gradient of out), got None")
            continue
        _check_tensor(t, name)
        if t.shape != x.shape:
            raise ValueError(f"{name} must have x's shape {tuple(x.shape)}, got {tuple(t.shape)}")
    if not isinstance(rstd, Tensor):
        raise TypeError(
            "rstd must be a torch.Tensor (rmsnorm_fwd(..., store_rstd=True)'s third output), "
            f"got {type(rstd).__name__}"
        )
    if rstd.dtype != torch.float32 or rstd.shape != x.shape[:-1]:
        raise ValueError(
            f"rstd must be float32 of shape x.shape[:-1] = {tuple(x.shape[:-1])} (as "
            f"rmsnorm_fwd(..., store_rstd=True) returns it), got {rstd.dtype} of shape "
            f"{tuple(rstd.shape)}"
        )


def _final_bwd():
    from .stages import final_bwd

    return final_bwd


def _backward(x, weight, dout, rstd, dres_out, has_bias, dres_dtype, weight_offset, config):
    """The op's body: dx (and dres) in x's shape, dense; dw, db summed from the kernel's fp32
    partials. Returns [dx, dw if weight, db if has_bias, dresidual if dres_dtype]."""
    fb = _final_bwd()
    dx = torch.empty_like(x, memory_format=_DENSE)
    dres = None
    if dres_dtype is not None:
        dres = torch.empty_like(x, dtype=dres_dtype, memory_format=_DENSE)
    per_head = weight is not None and weight.dim() == 2
    nd = 3 if per_head else 2
    rows = (-1, *x.shape[1 - nd :])

    def flat(t, view=False):
        if t is None or t.dim() == nd:
            return t
        return t.view(rows) if view else t.reshape(rows)

    xr, dr, dxr = flat(x), flat(dout), flat(dx, True)
    dor, dsr = flat(dres_out), flat(dres, True)
    rr = rstd.reshape(rows[:-1])
    # dw (and db) summed from the partials in the weight's dtype (db in fp32 without one)
    pdtype = weight.dtype if weight is not None else torch.float32
    if per_head:  # one launch a head: x[:, h] is (M, D) with rows H x D apart
        H, D = weight.shape
        sums = [weight.new_empty((H, D), dtype=pdtype), None]
        if has_bias:
            sums[1] = weight.new_empty((H, D), dtype=pdtype)
        for h in range(xr.shape[1]):
            parts = fb.launch_bwd(
                xr[:, h], weight[h], dr[:, h], None if dor is None else dor[:, h],
                rr[:, h].contiguous(), dxr[:, h], None if dsr is None else dsr[:, h],
                has_bias, weight_offset, config,
            )  # fmt: skip
            for p, s in zip(parts, sums, strict=True):
                if p is not None:
                    fb.sum_partials(p, pdtype, out=s[h])
    else:
        parts = fb.launch_bwd(
            xr, weight, dr, dor, rr.contiguous(), dxr, dsr, has_bias, weight_offset, config
        )
        sums = [None if p is None else fb.sum_partials(p, pdtype) for p in parts]
    outs = [dx]
    if weight is not None:
        outs.append(sums[0])
    if has_bias:
        outs.append(sums[1])
    if dres is not None:
        outs.append(dres)
    return outs


def _bwd_body(x, weight, dout, rstd, dresidual_out, has_bias, dres_dtype, weight_offset):
    """The op's body."""
    return _bwd_planned_body(
        None, x, weight, dout, rstd, dresidual_out, has_bias, dres_dtype, weight_offset
    )


def _bwd_tuned_body(x, weight, dout, rstd, dresidual_out, has_bias, dres_dtype, weight_offset):
    """The tuned op's body: the autotuner's config."""
    return _bwd_planned_body(
        _tuned_bwd_config, x, weight, dout, rstd, dresidual_out, has_bias, dres_dtype,
        weight_offset,
    )  # fmt: skip


def _bwd_planned_body(tune, x, weight, dout, rstd, dres_out, has_bias, dres_dtype, wo):
    """Either body: the call's launch plan when its key has one, else ``_bwd_first`` (a plan
    per key and power of two of rows for a tuned call, as the forward's)."""
    key = _bwd_key(x, weight, dout, rstd, dres_out, has_bias, dres_dtype, wo)
    if key is not None and tune is not None:
        key = (key, max(0, x.numel() // x.shape[-1] - 1).bit_length())
    plan = _BWD_PLANS.get(key)
    if plan is not None and _bwd_shapes_agree(x, dout, rstd, dres_out):
        return plan.run(x, weight, dout, rstd, dres_out)
    return _bwd_first(key, tune, x, weight, dout, rstd, dres_out, has_bias, dres_dtype, wo)


#: key -> ``_BwdPlan``, as the forward's ``_FWD_PLANS``: made after a call with that key passed
#: every check and ran. A per-head weight has none (one launch a head).
_BWD_PLANS: dict = {}


def _bwd_key(x, weight, dout, rstd, dres_out, has_bias, dres_dtype, wo):
    """The backward call's plan key, or None (see ``_fwd_key``)."""
    if type(x) not in _PLAIN_TYPES or not x.is_contiguous() or not x.numel():
        return None
    if type(has_bias) is not bool or type(wo) is not float:
        return None
    if dres_dtype is not None and type(dres_dtype) is not torch.dtype:
        return None
    bits = x.data_ptr()
    parts = []
    for t in (weight, dout, rstd, dres_out):
        if t is None:
            parts.append(None)
            continue
        if type(t) not in _PLAIN_TYPES or not t.is_contiguous():
            return None
        bits |= t.data_ptr()
        parts.append((t.dtype, t.get_device()))
    if weight is not None:
        if weight.dim() != 1:
            return None
        parts.append(weight.shape[0])
    return (x.dtype, x.shape[-1], x.get_device(), *parts, has_bias, dres_dtype, wo, bits & 15)


def _plain_bwd_key(x, w, dout, rstd):
    """``_bwd_key`` of the plain backward ``(x, w, dout, rstd)``: the same tuple, less work."""
    if not x.numel() or not (x.is_contiguous() and dout.is_contiguous() and rstd.is_contiguous()):
        return None
    if w is None:
        return (x.dtype, x.shape[-1], x.get_device(), None, (dout.dtype, dout.get_device()),
                (rstd.dtype, rstd.get_device()), None, False, None, 0.0,
                (x.data_ptr() | dout.data_ptr() | rstd.data_ptr()) & 15)  # fmt: skip
    if type(w) not in _PLAIN_TYPES or w.dim() != 1 or not w.is_contiguous():
        return None
    return (
        x.dtype, x.shape[-1], x.get_device(), (w.dtype, w.get_device()),
        (dout.dtype, dout.get_device()), (rstd.dtype, rstd.get_device()), None, w.shape[0],
        False, None, 0.0, (x.data_ptr() | w.data_ptr() | dout.data_ptr() | rstd.data_ptr()) & 15,
    )  # fmt: skip


def _bwd_shapes_agree(x, dout, rstd, dres_out) -> bool:
    """What a backward key cannot hold: the per-call shapes (rows) of the other tensors."""
    shape = x.shape
    return (
        dout.shape == shape
        and rstd.shape == shape[:-1]
        and (dres_out is None or dres_out.shape == shape)
    )


class _BwdPlan:
    """A backward key's launch: the compiled kernel's call, its rows a CTA and the most CTAs
    (P = the rows of the partials), the dtype the partials are summed into, the outputs."""

    __slots__ = ("fn", "N", "rows", "most", "pdtype", "dw", "db", "dres_dtype")

    def __init__(self, fn, N, rows, most, pdtype, dw, db, dres_dtype):
        self.fn, self.N, self.rows, self.most, self.pdtype = fn, N, rows, most, pdtype
        self.dw, self.db, self.dres_dtype = dw, db, dres_dtype

    def run(self, x, weight, dout, rstd, dres_out):
        """[dx, dw if a weight, db if a bias, dresidual if its own dtype], as ``_backward``."""
        N = self.N
        M = x.numel() // N
        P = min(-(-M // self.rows), self.most)
        dx = torch.empty_like(x)
        dres = None if self.dres_dtype is None else torch.empty_like(x, dtype=self.dres_dtype)
        f32 = torch.float32
        dw_p = x.new_empty((P, N), dtype=f32) if self.dw else None
        db_p = x.new_empty((P, N), dtype=f32) if self.db else None
        rows = (M, N)
        dro = None if dres_out is None else dres_out.view(rows)
        dr = None if dres is None else dres.view(rows)
        self.fn(
            x.view(rows), weight, dout.view(rows), dro, rstd.view(M), dx.view(rows), dr, dw_p,
            db_p, P,
        )  # fmt: skip
        outs = [dx]
        fb = _final_bwd()
        if self.dw:
            outs.append(fb.sum_partials(dw_p, self.pdtype))
        if self.db:
            outs.append(fb.sum_partials(db_p, self.pdtype))
        if dres is not None:
            outs.append(dres)
        return outs


def _bwd_first(key, tune, x, weight, dout, rstd, dres_out, has_bias, dres_dtype, wo):
    """A backward call without a plan: every check, the kernel compiled on first use and run;
    then the key's plan."""
    _check_bwd_args(x, weight, dout, rstd, dres_out, wo)
    _check_device(
        x, ("weight", weight), ("dout", dout), ("rstd", rstd), ("dresidual_out", dres_out)
    )
    config = None
    if tune is not None:
        config = tune(x, weight, dout, rstd, dres_out, has_bias, dres_dtype, wo)
    outs = _backward(x, weight, dout, rstd, dres_out, has_bias, dres_dtype, wo, config)
    if key is not None:  # x.numel() > 0: the call ran a kernel
        fb, N, dev = _final_bwd(), x.shape[-1], x.get_device()
        rows = (-1, N)
        dres = outs[-1].view(rows) if dres_dtype is not None else None
        dro = None if dres_out is None else dres_out.view(rows)
        kernel, fn = fb.kernel_for(  # the kernel the call above ran
            x.view(rows), weight, dout.view(rows), dro, outs[0].view(rows), dres, has_bias, wo,
            config,
        )  # fmt: skip
        most = kernel.grid_x(1 << 40, fb.sm_count(dev), kernel.resident(dev))
        from .runtime import direct_call

        pdtype = weight.dtype if weight is not None else torch.float32
        _BWD_PLANS[key] = _BwdPlan(
            direct_call(fn), N, kernel.tiling.rows_per_cta, most, pdtype, weight is not None,
            has_bias, dres_dtype,
        )  # fmt: skip
    return outs


def _bwd_fake(x, weight, dout, rstd, dresidual_out, has_bias, dres_dtype, weight_offset):
    outs = [x.new_empty(x.shape)]
    pdtype = weight.dtype if weight is not None else torch.float32
    if weight is not None:
        outs.append(weight.new_empty(weight.shape))
    if has_bias:
        shape = weight.shape if weight is not None else x.shape[-1:]
        outs.append(x.new_empty(shape, dtype=pdtype))
    if dres_dtype is not None:
        outs.append(x.new_empty(x.shape, dtype=dres_dtype))
    return outs


_BWD_SCHEMA = (
    "(Tensor x, Tensor? weight, Tensor dout, Tensor rstd, Tensor? dresidual_out, "
    "bool has_bias, ScalarType? dres_dtype, float weight_offset) -> Tensor[]"
)
_bwd_op = _define("rmsnorm_bwd", _bwd_body, _BWD_SCHEMA, _bwd_fake)
_bwd_tuned_op = _define("rmsnorm_bwd_tuned", _bwd_tuned_body, _BWD_SCHEMA, _bwd_fake)


def _bwd(op, body, x, weight, dout, rstd, dresidual_out, has_bias, has_residual, weight_offset):
    weight_offset = _check_number(weight_offset, "weight_offset")
    _check_bwd_args(x, weight, dout, rstd, dresidual_out, weight_offset)
    # dresidual is a tensor of its own only when dresidual_out has another dtype than dx
    dres_dtype = None
    if dresidual_out is not None and dresidual_out.dtype != x.dtype:
        dres_dtype = dresidual_out.dtype
    call = op if _through_op(x) else body
    has_bias, wo = bool(has_bias), float(weight_offset)
    outs = call(x, weight, dout, rstd, dresidual_out, has_bias, dres_dtype, wo)
    return _bwd_outputs(outs, weight, has_bias, dresidual_out, has_residual, x)


def _bwd_outputs(outs, weight, has_bias, dres_out, has_residual, x):
    """The op's list as QuACK's ``(dx, dw, db, dresidual)``."""
    dx, k = outs[0], 1
    dw = db = None
    if weight is not None:
        dw, k = outs[k], k + 1
    if has_bias:
        db, k = outs[k], k + 1
    own = dres_out is not None and dres_out.dtype != x.dtype  # dresidual of its own dtype
    dresidual = outs[k] if own else (dx if has_residual else None)
    return dx, dw, db, dresidual


def rmsnorm_bwd(
    x: Tensor,
    weight: Tensor | None,
    dout: Tensor,
    rstd: Tensor,
    dresidual_out: Tensor | None = None,
    has_bias: bool = False,
    has_residual: bool = False,
    weight_offset: float = 0.0,
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """RMSNorm backward on the GPU: ``(dx, dw, db, dresidual)``.

    ``x`` is the forward's normalised input (``residual_out`` when it had a residual), ``rstd``
    its saved ``rstd``, ``dout`` the gradient of ``out`` (any supported dtype) and
    ``dresidual_out`` that of ``residual_out``, added to ``dx``. ``dx`` is in ``x``'s dtype;
    ``dw`` in the weight's (None without one); ``db`` (with ``has_bias``) in the weight's,
    fp32 without a weight. ``dresidual``: a tensor of ``dresidual_out``'s dtype when that is
    not x's, else ``dx`` itself when ``has_residual``, else None (QuACK's return values).

    dw and db are summed over rows in fp32 without atomics: each CTA stores its partial sums,
    which are added in a fixed order, so two runs on the same inputs give the same bits.
    """
    if (
        dresidual_out is None
        and has_bias is False
        and type(weight_offset) is float
        and not weight_offset
        and type(x) in _PLAIN_TYPES
        and type(dout) in _PLAIN_TYPES
        and type(rstd) in _PLAIN_TYPES
        and not _through_op(x)
    ):  # the plain backward, autograd's in every layer
        plan = _BWD_PLANS.get(_plain_bwd_key(x, weight, dout, rstd))
        if plan is not None and dout.shape == x.shape and rstd.shape == x.shape[:-1]:
            dx, *rest = plan.run(x, weight, dout, rstd, None)
            return dx, rest[0] if rest else None, None, dx if has_residual else None
    got = _bwd_planned(x, weight, dout, rstd, dresidual_out, has_bias, weight_offset)
    if got is not None:
        return _bwd_outputs(got, weight, has_bias, dresidual_out, has_residual, x)
    return _bwd(
        _bwd_op, _bwd_body, x, weight, dout, rstd, dresidual_out, has_bias, has_residual,
        weight_offset,
    )  # fmt: skip


def _bwd_planned(x, weight, dout, rstd, dres_out, has_bias, wo):
    """The op's list through the call's plan, or None (then the checked path)."""
    if type(x) not in _PLAIN_TYPES or _through_op(x) or type(dout) not in _PLAIN_TYPES:
        return None
    if type(rstd) not in _PLAIN_TYPES or (
        dres_out is not None and type(dres_out) not in _PLAIN_TYPES
    ):
        return None
    dres_dtype = None
    if dres_out is not None and dres_out.dtype != x.dtype:
        dres_dtype = dres_out.dtype
    plan = _BWD_PLANS.get(_bwd_key(x, weight, dout, rstd, dres_out, has_bias, dres_dtype, wo))
    if plan is None or not _bwd_shapes_agree(x, dout, rstd, dres_out):
        return None
    return plan.run(x, weight, dout, rstd, dres_out)


def rmsnorm_bwd_tuned(
    x: Tensor,
    weight: Tensor | None,
    dout: Tensor,
    rstd: Tensor,
    dresidual_out: Tensor | None = None,
    has_bias: bool = False,
    has_residual: bool = False,
    weight_offset: float = 0.0,
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """``rmsnorm_bwd`` with the kernel config chosen by timing every candidate of
    ``final_bwd.configs`` on first use of a key (as ``rmsnorm_fwd_tuned``)."""
    return _bwd(
        _bwd_tuned_op, _bwd_tuned_body, x, weight, dout, rstd, dresidual_out, has_bias,
        has_residual, weight_offset,
    )  # fmt: skip


def _tuned_bwd_config(x, weight, dout, rstd, dres_out, has_bias, dres_dtype, wo):
    tuner = _the_tuner()
    key = (
        *_key_head("rmsnorm_bwd", x),
        ("dout", _name(dout.dtype)),
        ("weight", _name(None if weight is None else weight.dtype)),
        ("dresidual_out", _name(None if dres_out is None else dres_out.dtype)),
        ("per_head", weight is not None and weight.dim() == 2),
        ("bias", bool(has_bias)),
        ("weight_offset", wo != 0.0),
    )
    config = tuner.cached(key, tuner)
    if config is not tuner:
        return config
    if not x.numel():
        return None
    fb = _final_bwd()
    wdtype = weight.dtype if weight is not None else None
    features = fb.features_for(x, weight, dout, dres_out, dres_dtype, has_bias, wo)

    def candidates():
        return [None, *fb.configs(x.shape[-1], x.dtype, wdtype, features)]

    def bench(config):
        return _backward(x, weight, dout, rstd, dres_out, has_bias, dres_dtype, wo, config)

    return tuner.tune(key, candidates, bench, bench=bench)


# --------------------------------------------------------------------------------------------
# Autograd and the module
# --------------------------------------------------------------------------------------------


def _contiguous_last(t):
    """The kernel reads rows with unit stride; ``rmsnorm`` (like QuACK's) accepts any strides.
    Under torch.compile strides of fake tensors are not final, so always ask."""
    if not isinstance(t, Tensor) or t.dim() == 0:
        return t  # rmsnorm_fwd's checks say what is wrong with it
    if torch.compiler.is_compiling():
        return t.contiguous()
    return t if t.stride(-1) == 1 else t.contiguous()


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
        dout, dres_out = _contiguous_last(dout), _contiguous_last(dres_out)
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


# --------------------------------------------------------------------------------------------
# Under torch.compile: which norms the CuTe kernels run and which inductor generates
# --------------------------------------------------------------------------------------------


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
      ``model_h2048_aa.json`` and ``model_h4096_aa.json`` (README, "In a model").

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


def _inductor_rmsnorm(x, weight, bias, residual, out_dtype, residual_dtype, eps, prenorm, wo):
    """``rmsnorm`` in torch ops, for inductor to fuse, with the library's output dtypes.

    A call that ``nn.RMSNorm`` can make (no bias or weight offset, a weight ``(N,)`` or none,
    out and residual_out in the dtype of ``x + residual``) is written as its users write it:
    ``h = x + residual``, then ``F.rms_norm(h)``. The compiled graph is then nn.RMSNorm's, op
    for op (a test compares them), so the swap cannot change what inductor makes of a model.
    Any other call: the project's fp32 reference formula."""
    rod = _res_out_dtype(x, residual, residual_dtype)
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
    x, residual = _contiguous_last(x), _contiguous_last(residual)
    grad = torch.is_grad_enabled() and any(
        isinstance(t, Tensor) and t.requires_grad for t in (x, weight, bias, residual)
    )
    if torch.compiler.is_compiling() and _POLICY.path(x, grad) == "inductor":
        eps, wo = _check_number(eps, "eps"), _check_number(weight_offset, "weight_offset")
        _check_args(x, weight, bias, residual, out_dtype, residual_dtype, wo)
        return _inductor_rmsnorm(
            x, weight, bias, residual, out_dtype, residual_dtype, eps, prenorm, wo
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
        self._plans = {}  # _inference_plan's

    def __call__(self, *args, **kwargs):
        """``nn.Module``'s call, with a short way for inference: ``norm(x)`` without autograd,
        hooks, tracing or compiling, through the key's plan (``nn.Module``'s own call costs
        about 2 us on the H200's host, as much as the rest of the call's Python)."""
        # is_compiling first: under dynamo it is a constant, and what it skips adds no guards
        if (
            not torch.compiler.is_compiling()
            and len(args) == 1
            and not kwargs
            and self._row_n
            and not torch.is_grad_enabled()
        ):
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
                and not _dispatch_depth()
            ):
                plan = self._inference_plan(x)
                if plan is not None:
                    return plan.run_plain(x, self._parameters["weight"], self.eps)
        return _module_call(self, *args, **kwargs)

    def _inference_plan(self, x: Tensor):
        """The plan of the plain call ``norm(x)`` (x a contiguous ``Tensor``), or None where
        there is none yet. The module keeps the plans it used, by what of the key can change
        from call to call (x's dtype, N, device, alignment): the weight is its own, so its part
        of the key is checked by identity and address, not recomputed (~0.6 us a call)."""
        if not x.dim() or not x.is_contiguous():
            return None
        w = self._parameters["weight"]
        key = (x.dtype, x.shape[-1], x.get_device(), x.data_ptr() & 15)
        got = self._plans.get(key)
        if got is not None:
            if got[0] is w and (w is None or got[1] == w.data_ptr()):
                return got[2]
            self._plans = {}  # another weight, or new data under it: the plans were the old's
        if x.shape[-1] != self._row_n:  # (a plan in the module's keeps this true)
            return None
        plan = _FWD_PLANS.get(_plain_key(x, w))
        if plan is not None:
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
        ``nn.RMSNorm`` gives), in one kernel; differentiable in x, residual and the weight."""
        if (
            not torch.compiler.is_compiling()  # (first, as in __call__)
            and residual is None
            and type(x) is Tensor
            and self._row_n
        ):
            w = self._parameters["weight"]  # (not through nn.Module's __getattr__: host cost)
            if (
                not (torch.is_grad_enabled() and (x.requires_grad or _requires_grad(w)))
                and type(self.eps) is float
                and not _dispatch_depth()
            ):  # inference's call: straight to the plan, when there is one
                plan = self._inference_plan(x)
                if plan is not None:
                    return plan.run_plain(x, w, self.eps)
        return self._forward(x, residual)

    def _forward(self, x, residual):
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
