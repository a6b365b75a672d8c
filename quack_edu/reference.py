"""The one fp32 reference for RMSNorm, used by tests, lessons, benchmarks and the grader.

    y = x / sqrt(mean(x**2) + eps) * weight + bias        (per row, over the last dim)

With ``residual``, the normalised input is ``x + residual`` (the pre-norm residual stream of a
transformer block) and that sum is returned too, as ``residual_out``.

Everything is computed in ``compute_dtype`` (float32 by default; tests may pass float64)
whatever the input dtype, and returned in it: compare a kernel's output after ``.float()``.
"""

from __future__ import annotations

import torch


def rstd_ref(x: torch.Tensor, eps: float = 1e-6, compute_dtype=torch.float32) -> torch.Tensor:
    """1 / sqrt(mean(x**2) + eps) per row, shape ``x.shape[:-1]``."""
    xf = x.to(compute_dtype)
    return torch.rsqrt(xf.square().mean(dim=-1) + eps)


def rmsnorm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    eps: float = 1e-6,
    compute_dtype=torch.float32,
    weight_offset: float = 0.0,
):
    """RMSNorm forward. Returns ``out``, or ``(out, residual_out)`` when ``residual`` is given.

    ``weight_offset`` is added to the weight in ``compute_dtype`` (Gemma's ``x_hat * (1 + w)``
    is ``weight_offset=1.0``). A per-head weight of shape (H, D) broadcasts over x's (..., H, D).
    """
    xf = x.to(compute_dtype)
    if residual is not None:
        xf = xf + residual.to(compute_dtype)
    out = xf * rstd_ref(xf, eps, compute_dtype).unsqueeze(-1)
    if weight is not None:
        out = out * (weight.to(compute_dtype) + weight_offset)
    if bias is not None:
        out = out + bias.to(compute_dtype)
    return (out, xf) if residual is not None else out


def rmsnorm_bwd_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    dout: torch.Tensor,
    rstd: torch.Tensor,
    dresidual_out: torch.Tensor | None = None,
    has_bias: bool = False,
    compute_dtype=torch.float32,
    weight_offset: float = 0.0,
):
    """RMSNorm backward from the saved ``rstd``.

    ``x`` is the normalised input (``x + residual`` when the forward had a residual), ``dout``
    the gradient of ``out`` and ``dresidual_out`` the gradient of ``residual_out``, if any.
    With x_hat = x * rstd and g = dout * (weight + weight_offset):

        dx      = rstd * (g - x_hat * mean(g * x_hat))  (+ dresidual_out)
        dweight = sum over rows of dout * x_hat
        dbias   = sum over rows of dout

    Returns ``(dx, dweight, dbias)``; ``dweight`` is None without weight, ``dbias`` None
    unless ``has_bias``. With a residual, the gradient of ``residual`` equals ``dx``.
    """
    N = x.shape[-1]
    xf, doutf = x.to(compute_dtype), dout.to(compute_dtype)
    rstdf = rstd.to(compute_dtype).unsqueeze(-1)
    x_hat = xf * rstdf
    g = doutf * (weight.to(compute_dtype) + weight_offset) if weight is not None else doutf
    dx = rstdf * (g - x_hat * (g * x_hat).sum(dim=-1, keepdim=True) / N)
    if dresidual_out is not None:
        dx = dx + dresidual_out.to(compute_dtype)
    # a per-head weight (H, D) keeps its heads: sum over the dims before them
    rows = tuple(range(x.dim() - (weight.dim() if weight is not None else 1)))
    dweight = (doutf * x_hat).sum(dim=rows) if weight is not None else None
    dbias = doutf.sum(dim=rows) if has_bias else None
    return dx, dweight, dbias


# One tolerance table, by the dtype of the kernel's output. A kernel that reduces in fp32
# differs from this reference by the output's rounding (bf16: 2**-8 relative, fp16: 2**-11)
# plus a few fp32 ulps from a different summation order.
TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype=None, what="output") -> None:
    """Compare a kernel result with the fp32 reference using the tolerance table.

    Every element must be finite (a poisoned, unwritten output is NaN and fails here).
    """
    dtype = dtype or actual.dtype
    if actual.shape != expected.shape:
        raise AssertionError(
            f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
        )
    # Compare where the tensors live: copying a 1G-element output to the host costs seconds.
    a = actual.detach().float()
    e = expected.detach().float().to(a.device)
    bad = ~torch.isfinite(a)
    if bad.any():
        idx = bad.nonzero()[0].tolist()
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {a.numel()} elements are not finite "
            f"(first at {idx}); was every element written?"
        )
    torch.testing.assert_close(a, e, **TOLERANCES[dtype], msg=lambda m: f"{what}: {m}")
