"""The library's argument checks, with errors that name the argument and the fix.

Shapes and dtypes are checked first, the device (CUDA, one GPU, Hopper) last, so every message
can be seen on a machine without a GPU. A call that has a launch plan has passed them all once
for its key, and runs none of them again (``forward``, ``backward``).
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from ..config import MAX_N
from ..dtypes import SUPPORTED, SUPPORTED_WORDS, unsupported_dtype

_SUPPORTED = frozenset(SUPPORTED)


def check_tensor(t, name: str) -> None:
    """A tensor argument (x, weight, bias, residual, dout, ...): a supported dtype, rows of unit
    stride."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dtype not in _SUPPORTED:
        raise unsupported_dtype(name, t.dtype)
    if t.dim() and t.stride(-1) != 1:
        raise ValueError(
            f"{name} must have a last-dim stride of 1 (got strides {tuple(t.stride())}); "
            f"pass {name}.contiguous()"
        )


def _check_dtype_arg(dtype, name: str) -> None:
    """An output dtype argument (out_dtype, residual_dtype): None or a supported dtype."""
    if dtype is not None and dtype not in _SUPPORTED:
        raise TypeError(f"{name} must be None or one of {SUPPORTED_WORDS}, got {dtype!r}")


def check_args(x, weight, bias, residual, out_dtype, residual_dtype, weight_offset) -> None:
    """Shapes and dtypes, no device query: what can be checked on any machine."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., N), got a 0-d tensor")
    check_tensor(x, "x")
    N = x.shape[-1]
    if N == 0:
        raise ValueError(f"x has shape {tuple(x.shape)}: N = 0, the mean of an empty row")
    if N > MAX_N:
        raise ValueError(f"x has N = {N} columns; the kernel handles rows of at most {MAX_N}")
    if weight is not None:
        check_tensor(weight, "weight")
        _check_param_shape(weight, x, "weight")
    if bias is not None:
        check_tensor(bias, "bias")
        if weight is not None and bias.shape != weight.shape:
            raise ValueError(
                f"bias must have weight's shape {tuple(weight.shape)}, got {tuple(bias.shape)}"
            )
        _check_param_shape(bias, x, "bias")
    if residual is not None:
        check_tensor(residual, "residual")
        if residual.shape != x.shape:
            raise ValueError(
                f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}"
            )
    _check_dtype_arg(out_dtype, "out_dtype")
    _check_dtype_arg(residual_dtype, "residual_dtype")
    if weight_offset != 0.0 and weight is None:
        raise ValueError(f"weight_offset={weight_offset} needs a weight (it is added to it)")


def check_number(value, name: str) -> float:
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


def check_bwd_args(x, weight, dout, rstd, dresidual_out, weight_offset) -> None:
    """Shapes and dtypes of ``rmsnorm_bwd``'s arguments (no device query)."""
    check_args(x, weight, None, None, None, None, weight_offset)
    for t, name in ((dout, "dout"), (dresidual_out, "dresidual_out")):
        if t is None:
            if name == "dout":
                raise TypeError("dout must be a torch.Tensor (the gradient of out), got None")
            continue
        check_tensor(t, name)
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


def check_device(x: Tensor, *others) -> None:
    """``runtime.check_device``: one CUDA device, a Hopper GPU. ``others``: (name, tensor)."""
    from ..runtime import check_device as check_on_gpu

    check_on_gpu(x, *others, without_gpu="quack_edu.rmsnorm_ref computes the same thing")


def res_out_dtype_for(x, residual, residual_dtype):
    """residual_out's dtype; None where residual_out is x itself (no residual, and no other
    dtype asked for)."""
    if residual is not None:
        return residual.dtype if residual_dtype is None else residual_dtype
    if residual_dtype is not None and residual_dtype != x.dtype:
        return residual_dtype
    return None
