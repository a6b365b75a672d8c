"""The forward: the ops ``quack_edu::rmsnorm_fwd`` and ``rmsnorm_fwd_tuned``, their launch plans,
and the public entries ``rmsnorm_fwd`` and ``rmsnorm_fwd_tuned``.

Every path (eager, the op's body that inductor's code and CUDA-graph capture call, the tuned
entry) runs a call through one cached launch plan per key (``_FWD_PLANS``): the checks, the
kernel lookup and its grid are done on a key's first call only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .checks import check_args, check_device, check_number, res_out_dtype_for
from .ops import (
    DENSE,
    PLAIN_TYPES,
    define_pair,
    dtype_name,
    key_head,
    the_tuner,
    through_op,
)
from .rows import in_place

_final_mod = None


def _final():
    """``quack_edu.stages.final``, imported on first use (it imports CuTe DSL)."""
    global _final_mod
    if _final_mod is None:
        from ..stages import final

        _final_mod = final
    return _final_mod


def _rows_shape(x, weight, bias) -> tuple:
    """The kernel's view of x: (-1, N) rows, or (-1, H, D) with a per-head weight or bias."""
    p = weight if weight is not None else bias
    return (-1, *x.shape[-2:]) if p is not None and p.dim() == 2 else (-1, x.shape[-1])


def _launch(x, weight, bias, residual, out, res_out, rstd, eps, weight_offset, config):
    """Launch on x's rows: (M, N), or (M, H, D) with a per-head weight; other leading shapes
    are flattened (a view when x's strides allow it, else a copy). A strided x whose rows
    ``rows.layout`` reaches (one or two row modes) is read in place, its outputs made by
    ``_forward`` in its layout."""
    lay = in_place(x, weight, bias)
    if lay is not None:
        x, out = lay.view(x), lay.view(out)
        residual = None if residual is None else lay.like(residual, x)
        res_out = None if res_out is None else lay.view(res_out)
        rstd = None if rstd is None else lay.view_rows(rstd)
        _final().launch_fwd(
            x, weight, bias, residual, out, res_out, rstd, eps, weight_offset, config
        )
        return
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
    """Allocate the outputs in x's shape and launch the kernel on x's rows (a first call's
    run, and the tuner's). Returns [out, residual_out if residual_out_dtype, rstd if store_rstd].
    The outputs are dense: contiguous, or for rows read in place (``rows.in_place``) dense in x's
    dim order (``torch.empty_like``'s for a dense x)."""
    lay = in_place(x, weight, bias)
    if lay is not None:
        outs = [lay.empty(x, out_dtype)]
    else:
        outs = [torch.empty_like(x, dtype=out_dtype, memory_format=DENSE)]
    res_out = rstd = None
    if residual_out_dtype is not None:
        if lay is not None:
            res_out = lay.empty(x, residual_out_dtype)
        else:
            res_out = torch.empty_like(x, dtype=residual_out_dtype, memory_format=DENSE)
        outs.append(res_out)
    if store_rstd:
        rstd = x.new_empty(x.shape[:-1], dtype=torch.float32) if lay is None else lay.empty_rows(x)
        outs.append(rstd)
    if x.numel():
        _launch(x, weight, bias, residual, outs[0], res_out, rstd, eps, weight_offset, config)
    return outs


def _fwd_planned_body(
    tuned, x, weight, bias, residual, out_dtype, res_out_dtype, eps, store_rstd, wo
):
    """The body of both ops (``tuned``: the tuned op's, with the autotuner's config): the
    call's launch plan when its key has one, else every check and a first run, which makes the
    key's plan. A tuned call has a plan per key and power of two of rows, the tuning key's M."""
    key = fwd_key(x, weight, bias, residual, out_dtype, res_out_dtype, store_rstd, wo)
    if key is not None and tuned:
        key = (key, max(0, x.numel() // x.shape[-1] - 1).bit_length())
    plan = _FWD_PLANS.get(key)
    if plan is not None and (residual is None or residual.shape == x.shape):
        return plan.run(x, weight, bias, residual, eps)
    outs, config = _fwd_first(
        tuned, x, weight, bias, residual, out_dtype, res_out_dtype, eps, store_rstd, wo
    )
    if key is not None and x.numel():  # a plan holds a kernel: only for a call that ran one
        _FWD_PLANS[key] = _fwd_plan(
            x, weight, bias, residual, outs, res_out_dtype, store_rstd, wo, config
        )
    return outs


# --------------------------------------------------------------------------------------------
# Launch plans: what a key of the call decides, found once
# --------------------------------------------------------------------------------------------

#: ``FwdKey`` -> ``_FwdPlan``. An entry is made only after a call with that key went through
#: every check and ran (``_fwd_first``), so a hit needs none of them again. What a key cannot
#: hold (a residual's shape) is compared on every hit.
_FWD_PLANS: dict = {}


class FwdKey(NamedTuple):
    """A forward call's plan key: every fact of the call that decides its kernel and its
    checks. ``weight``, ``bias``: (dtype, shape, device); ``residual``: (dtype, device), its
    shape compared on every hit; ``heads``: H of a per-head weight or bias (H, D), else 0;
    ``align``: the low 4 bits of every pointer, OR-ed (a contiguous tensor's rows are N
    elements apart: a fact of dtype and N); ``strided``: a strided x's (shape, strides), its
    ``rows.layout`` (None: x contiguous)."""

    x_dtype: torch.dtype
    N: int
    heads: int
    device: int
    weight: tuple | None
    bias: tuple | None
    residual: tuple | None
    out_dtype: torch.dtype
    res_out_dtype: torch.dtype | None
    store_rstd: bool
    weight_offset: float
    align: int
    strided: tuple | None


def fwd_key(x, weight, bias, residual, out_dtype, res_out_dtype, store_rstd, wo):
    """The call's ``FwdKey``, or None when the call cannot have a plan (a tensor subclass, a
    strided tensor whose rows are not read in place or with a residual, an argument of an
    unexpected type): then every call is checked. Built on every call that is not the
    module's (which keeps its plans): the plain call's parts are found first."""
    if type(x) not in PLAIN_TYPES or not x.dim():
        return None
    if type(out_dtype) is not torch.dtype or type(wo) is not float or type(store_rstd) is not bool:
        return None
    if res_out_dtype is not None and type(res_out_dtype) is not torch.dtype:
        return None
    strided = None
    if not x.is_contiguous():
        if residual is not None or in_place(x, weight, bias) is None:
            return None
        strided = (x.shape, x.stride())
    bits, heads, w = x.data_ptr(), 0, None
    if weight is not None:
        if type(weight) not in PLAIN_TYPES or not weight.is_contiguous():
            return None
        bits |= weight.data_ptr()
        w = (weight.dtype, weight.shape, weight.get_device())
    b = r = None
    if bias is not None or residual is not None:
        for t in (bias, residual):
            if t is not None and (type(t) not in PLAIN_TYPES or not t.is_contiguous()):
                return None
        if bias is not None:
            bits |= bias.data_ptr()
            b = (bias.dtype, bias.shape, bias.get_device())
        if residual is not None:
            bits |= residual.data_ptr()
            r = (residual.dtype, residual.get_device())
    p = weight if weight is not None else bias
    if p is not None and p.dim() == 2:
        if x.dim() < 3:
            return None
        heads = x.shape[-2]
    return FwdKey(
        x.dtype, x.shape[-1], heads, x.get_device(), w, b, r, out_dtype, res_out_dtype,
        store_rstd, wo, bits & 15, strided,
    )  # fmt: skip


class _FwdPlan:
    """A key's launch: the compiled kernel's call, the rows' shape, the outputs to allocate;
    ``lay``: a strided x's ``rows.RowLayout`` (None: x contiguous). ``bwd``: the backward plan
    of the plain training call (``run_saving``'s), found by its first backward
    (``backward.plain_backward``)."""

    __slots__ = ("fn", "rows", "N", "out_dtype", "res_out_dtype", "store_rstd", "lay", "plain")
    __slots__ += ("bwd", "bwd_dout")

    def __init__(self, fn, rows, out_dtype, res_out_dtype, store_rstd, lay=None):
        self.fn, self.rows, self.N, self.out_dtype = fn, rows, rows[-1], out_dtype
        self.res_out_dtype, self.store_rstd, self.lay = res_out_dtype, store_rstd, lay
        #: rows (M, N) of a contiguous x (not per-head, not strided): what ``run_plain`` takes
        self.plain = lay is None and len(rows) == 2
        #: a strided x's backward plan is for gradients of the strides ``bwd_dout`` names
        self.bwd = self.bwd_dout = None

    def run_strided(self, x, weight, bias, eps):
        """``run`` of a strided x's plan (no residual: its key has none)."""
        lay = self.lay
        out = lay.empty(x, self.out_dtype)
        outs = [out]
        res_out = rstd = None
        if self.res_out_dtype is not None:
            res_out = lay.empty(x, self.res_out_dtype)
            outs.append(res_out)
        if self.store_rstd:
            rstd = lay.empty_rows(x)
            outs.append(rstd)
        if x.numel():
            self.fn(
                lay.view(x), weight, bias, None, lay.view(out),
                None if res_out is None else lay.view(res_out),
                None if rstd is None else lay.view_rows(rstd), eps,
            )  # fmt: skip
        return outs

    def run_plain(self, x, weight, eps, store_rstd=False):
        """``out`` of a plain call's plan (a contiguous x, a weight (N,) or none, nothing
        else): ``run`` with nothing to decide;
        ``(out, rstd)`` with ``store_rstd``."""
        out = torch.empty_like(x)
        rstd = x.new_empty(x.shape[:-1], dtype=torch.float32) if store_rstd else None
        if x.dim() == 2:
            if x.shape[0]:
                self.fn(x, weight, None, None, out, None, rstd, eps)
        elif x.numel():
            rows = self.rows
            flat = None if rstd is None else rstd.view(-1)
            self.fn(x.view(rows), weight, None, None, out.view(rows), None, flat, eps)
        return (out, rstd) if store_rstd else out

    def run_saving(self, x, weight, eps):
        """The plain training call's forward (a plan with rstd, a weight (N,) or none):
        ``(out, saved x, rstd)`` as ``backward.plain_backward`` takes them (kept for it, never
        seen by the caller): x's rows ``(M, N)`` (or, x strided, ``(M, H, N)``: ``lay.view``)
        and rstd ``(M,)`` (``(M, H)``), the views the kernels take, made once. Shapes are
        passed as ints: a tuple argument costs a view ~0.5 us more (scripts/host_cost_cpu.py's
        machine)."""
        lay = self.lay
        if lay is not None:  # (a strided x is never empty: torch calls an empty x contiguous)
            rows = lay.view(x)
            out = lay.empty(x)
            rstd = rows.new_empty(rows.shape[:-1], dtype=torch.float32)
            self.fn(rows, weight, None, None, lay.view(out), None, rstd, eps)
            return out, rows, rstd
        rows = x.view(-1, self.N)
        out = torch.empty_like(rows)
        rstd = rows.new_empty(rows.shape[0], dtype=torch.float32)
        if rows.shape[0]:
            self.fn(rows, weight, None, None, out, None, rstd, eps)
        return out.view_as(x), rows, rstd

    def run_prenorm(self, x, residual, weight, eps):
        """The pre-norm call ``norm(x, residual)`` through a plan of rows ``(M, N)`` with a
        residual (x and residual contiguous, of one shape; a weight (N,) or none):
        ``(out, residual_out, residual_out's rows, rstd)``, the last two as
        ``backward.plain_backward`` takes them (rstd None where the plan keeps none)."""
        N = self.N
        rows = x.view(-1, N)
        out = rows.new_empty(rows.shape, dtype=self.out_dtype)
        res = rows.new_empty(rows.shape, dtype=self.res_out_dtype)
        rstd = rows.new_empty(rows.shape[0], dtype=torch.float32) if self.store_rstd else None
        if rows.shape[0]:
            self.fn(rows, weight, None, residual.view(-1, N), out, res, rstd, eps)
        return out.view_as(x), res.view_as(x), res, rstd

    def run(self, x, weight, bias, residual, eps):
        """[out, residual_out if asked, rstd if asked], as ``_forward``."""
        if self.lay is not None:
            return self.run_strided(x, weight, bias, eps)
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


def _fwd_first(tuned, x, weight, bias, residual, out_dtype, res_out_dtype, eps, store_rstd, wo):
    """A call without a plan: every check (the op may be called directly), the kernel compiled
    on first use and run. Returns the outputs and the config it ran (None: the heuristic's)."""
    check_args(x, weight, bias, residual, out_dtype, res_out_dtype, wo)
    check_device(x, ("weight", weight), ("bias", bias), ("residual", residual))
    config = None
    if tuned:
        config = _tuned_config(
            x, weight, bias, residual, out_dtype, res_out_dtype, eps, store_rstd, wo
        )
    outs = _forward(
        x, weight, bias, residual, out_dtype, res_out_dtype, eps, store_rstd, wo, config
    )
    return outs, config


def _fwd_plan(x, weight, bias, residual, outs, res_out_dtype, store_rstd, wo, config):
    """The plan of a call that ran the kernel (``_fwd_first``) on these tensors and ``outs``."""
    lay = in_place(x, weight, bias)
    rows = _rows_shape(x, weight, bias) if lay is None else lay.rows

    def view(t):
        return None if t is None else t.view(rows) if lay is None else lay.view(t)

    res_out = outs[1] if res_out_dtype is not None else None
    rstd = None
    if store_rstd:
        rstd = outs[-1].view(rows[:-1]) if lay is None else lay.view_rows(outs[-1])
    kernel = _final().kernel_for(
        view(x), weight, bias, view(residual), view(outs[0]), view(res_out), rstd, wo, config
    )  # the kernel the call above ran
    return _FwdPlan(kernel.call, rows, outs[0].dtype, res_out_dtype, store_rstd, lay)


def _fwd_fake(
    x, weight, bias, residual, out_dtype, residual_out_dtype, eps, store_rstd, weight_offset
):
    outs = [x.new_empty(x.shape, dtype=out_dtype)]
    if residual_out_dtype is not None:
        outs.append(x.new_empty(x.shape, dtype=residual_out_dtype))
    if store_rstd:
        outs.append(x.new_empty(x.shape[:-1], dtype=torch.float32))
    return outs


_FWD_SCHEMA = (
    "(Tensor x, Tensor? weight, Tensor? bias, Tensor? residual, ScalarType out_dtype, "
    "ScalarType? residual_out_dtype, float eps, bool store_rstd, float weight_offset) -> Tensor[]"
)
#: (``_fwd_body``, the op's body: a scratch op of the grader's runs it too)
_fwd_op, _fwd_tuned_op, _fwd_body = define_pair(
    "rmsnorm_fwd", _fwd_planned_body, _FWD_SCHEMA, _fwd_fake
)


def _fwd_outputs(outs, x, res_out_dtype, store_rstd):
    """The op's list as QuACK's ``(out, residual_out, rstd)``."""
    if res_out_dtype is None:
        return outs[0], x, outs[1] if store_rstd else None
    return outs[0], outs[1], outs[2] if store_rstd else None


def _planned(x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd, wo):
    """``rmsnorm_fwd``'s result through the call's plan, or None (then the checked path). A
    plan exists only for a key that passed every check, so a hit skips them all."""
    if type(eps) is not float or type(x) not in PLAIN_TYPES or through_op(x):
        return None
    if residual is not None and (type(residual) not in PLAIN_TYPES or residual.shape != x.shape):
        return None
    out_dtype = x.dtype if out_dtype is None else out_dtype
    rod = res_out_dtype_for(x, residual, residual_dtype)
    plan = _FWD_PLANS.get(fwd_key(x, weight, bias, residual, out_dtype, rod, store_rstd, wo))
    if plan is None:
        return None
    return _fwd_outputs(plan.run(x, weight, bias, residual, eps), x, rod, store_rstd)


def _fwd(tuned, x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd, wo):
    """The checked path of either entry (``tuned``: ``rmsnorm_fwd_tuned``'s): the op when
    something has to see it (``through_op``), else its body."""
    eps, wo = check_number(eps, "eps"), check_number(wo, "weight_offset")
    check_args(x, weight, bias, residual, out_dtype, residual_dtype, wo)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    res_out_dtype = res_out_dtype_for(x, residual, residual_dtype)
    store_rstd = bool(store_rstd)
    if through_op(x):
        op = _fwd_tuned_op if tuned else _fwd_op
        outs = op(x, weight, bias, residual, out_dtype, res_out_dtype, eps, store_rstd, wo)
    else:
        outs = _fwd_planned_body(
            tuned, x, weight, bias, residual, out_dtype, res_out_dtype, eps, store_rstd, wo
        )
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
        and type(store_rstd) is bool
        and type(x) in PLAIN_TYPES
        and type(eps) is float
        and type(weight_offset) is float
        and not weight_offset
        and not through_op(x)
    ):  # the plain call, a model's in every layer (autograd's saves rstd)
        plan = _FWD_PLANS.get(fwd_key(x, weight, None, None, x.dtype, None, store_rstd, 0.0))
        if plan is not None and not plan.plain:  # strided rows, a per-head weight
            return _fwd_outputs(plan.run(x, weight, None, None, eps), x, None, store_rstd)
        if plan is not None:
            if store_rstd:
                out, rstd = plan.run_plain(x, weight, eps, True)
                return out, x, rstd
            return plan.run_plain(x, weight, eps), x, None
    got = _planned(
        x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd, weight_offset
    )
    if got is not None:
        return got
    return _fwd(
        False, x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd,
        weight_offset,
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
        True, x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd,
        weight_offset,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Autotuned config
# --------------------------------------------------------------------------------------------


def _tune_key(x, weight, bias, residual, out_dtype, res_out_dtype, store_rstd, weight_offset):
    per_head = any(p is not None and p.dim() == 2 for p in (weight, bias))
    return (
        *key_head("rmsnorm_fwd", x),
        ("out", dtype_name(out_dtype)),
        ("residual", dtype_name(None if residual is None else residual.dtype)),
        ("residual_out", dtype_name(res_out_dtype)),
        ("weight", dtype_name(None if weight is None else weight.dtype)),
        ("bias", dtype_name(None if bias is None else bias.dtype)),
        ("per_head", per_head),
        ("store_rstd", bool(store_rstd)),
        ("weight_offset", weight_offset != 0.0),
    )


def _tuned_config(x, weight, bias, residual, out_dtype, res_out_dtype, eps, store_rstd, wo):
    tuner = the_tuner()
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
