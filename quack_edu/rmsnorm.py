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
* **Host overhead.** Going through the dispatcher costs tens of microseconds a call, more than
  the kernel at small shapes. In eager mode the wrappers call the op's body directly (as QuACK's
  ``cute_op`` does); under ``torch.compile``, a ``TorchDispatchMode`` (``FakeTensorMode``,
  ``make_fx``) or with tensor subclasses, they call the registered op. Outputs are allocated
  with torch on the current device and the kernel runs on torch's current stream, with no host
  synchronisation: the eager path can be captured in a CUDA graph.

The backward is the ``final_bwd`` kernel behind the op ``quack_edu::rmsnorm_bwd`` (functional,
with a fake, like the forward's): ``rmsnorm`` and ``QuackRMSNorm`` are differentiable through
``RMSNormFunction``, which saves ``rstd`` only when a gradient may be asked for. Forward-only
use (inference, ``torch.no_grad``, inputs that need no gradient) skips the autograd.Function and
keeps nothing alive.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

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
    "MAX_N",
    "SUPPORTED_DTYPES",
]

#: dtypes of every tensor argument (x, weight, bias, residual) and of out/residual_out
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_SUPPORTED = frozenset(SUPPORTED_DTYPES)
_SUPPORTED_NAMES = "torch.float16, torch.bfloat16 or torch.float32"
#: the longest row the kernel handles (``final.max_N``; a test checks that they agree)
MAX_N = 262144


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


def _launch(x, weight, bias, residual, out, res_out, rstd, eps, weight_offset, config):
    """Launch on x's rows: (M, N), or (M, H, D) with a per-head weight; other leading shapes
    are flattened (a view when x's strides allow it, else a copy)."""
    p = weight if weight is not None else bias
    nd = 3 if p is not None and p.dim() == 2 else 2
    if x.dim() != nd:
        rows = (-1, *x.shape[1 - nd :])
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
    _check_device(x, ("weight", weight), ("bias", bias), ("residual", residual))
    return _forward(
        x, weight, bias, residual, out_dtype, residual_out_dtype, eps, store_rstd, weight_offset,
        None,
    )  # fmt: skip


def _fwd_tuned_body(
    x, weight, bias, residual, out_dtype, residual_out_dtype, eps, store_rstd, weight_offset
):
    _check_device(x, ("weight", weight), ("bias", bias), ("residual", residual))
    config = _tuned_config(
        x, weight, bias, residual, out_dtype, residual_out_dtype, eps, store_rstd, weight_offset
    )
    return _forward(
        x, weight, bias, residual, out_dtype, residual_out_dtype, eps, store_rstd, weight_offset,
        config,
    )  # fmt: skip


def _fwd_fake(
    x, weight, bias, residual, out_dtype, residual_out_dtype, eps, store_rstd, weight_offset
):
    outs = [x.new_empty(x.shape, dtype=out_dtype)]
    if residual_out_dtype is not None:
        outs.append(x.new_empty(x.shape, dtype=residual_out_dtype))
    if store_rstd:
        outs.append(x.new_empty(x.shape[:-1], dtype=torch.float32))
    return outs


def _define(name: str, body, schema: str, fake):
    """A functional custom op ``quack_edu::name`` (nothing mutated) with its fake."""
    op = torch.library.custom_op(f"quack_edu::{name}", body, mutates_args=(), schema=schema)
    op.register_fake(fake)
    return op


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
        or type(x) is not Tensor
    )


def _fwd(op, body, x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd, wo):
    eps, wo = _check_number(eps, "eps"), _check_number(wo, "weight_offset")
    _check_args(x, weight, bias, residual, out_dtype, residual_dtype, wo)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if residual is not None and residual_dtype is None:
        residual_dtype = residual.dtype
    # residual_out is x itself unless there is a residual or a different dtype is asked for
    res_out_dtype = None
    if residual is not None or (residual_dtype is not None and residual_dtype != x.dtype):
        res_out_dtype = residual_dtype
    call = op if _through_op(x) else body
    store_rstd, wo = bool(store_rstd), float(wo)
    outs = call(x, weight, bias, residual, out_dtype, res_out_dtype, float(eps), store_rstd, wo)
    if res_out_dtype is None:
        return outs[0], x, outs[1] if store_rstd else None
    return outs[0], outs[1], outs[2] if store_rstd else None


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
        and not store_rstd
        and weight_offset == 0
        and weight is not None
        and type(eps) is float  # the common case; anything else goes through the checks
    ):
        out = _plain(x, weight, eps)
        if out is not None:
            return out, x, None
    return _fwd(
        _fwd_op, _fwd_body, x, weight, bias, residual, out_dtype, residual_dtype, eps,
        store_rstd, weight_offset,
    )  # fmt: skip


#: The plain call (x, weight: nothing else), the one a model makes in every layer, by what
#: decides its kernel and its checks: dtypes, N, contiguity, devices, 16-byte alignment of the
#: pointers (rows of a contiguous x are N elements apart, a fact of the key's dtype and N). An
#: entry is made only after that call went once through every check (``_fwd``), so a hit
#: needs none of them again: the host cost per call is a few attribute reads, one
#: allocation and the launch (measured on the H200: see ``quack-edu bench --overhead``).
_PLAIN: dict = {}


def _plain(x, weight, eps):
    """``out`` of the plain call through the cache above, or None (then the checked path)."""
    if type(x) is not Tensor or type(weight) is not Tensor or weight.ndim != 1 or x.ndim < 2:
        return None
    if _through_op(x):
        return None
    shape = x.shape
    key = (
        x.dtype,
        weight.dtype,
        shape[-1],
        weight.numel(),
        x.is_contiguous(),
        weight.is_contiguous(),
        x.get_device(),
        weight.get_device(),
        (x.data_ptr() | weight.data_ptr()) & 15,
    )
    fn = _PLAIN.get(key)
    if fn is None:
        return _first_plain(x, weight, eps, key)
    out = torch.empty_like(x)
    if len(shape) == 2:
        if shape[0]:
            fn(x, weight, None, None, out, None, None, eps)
    elif x.numel():
        N = shape[-1]
        fn(x.view(-1, N), weight, None, None, out.view(-1, N), None, None, eps)
    return out


def _first_plain(x, weight, eps, key):
    """A plain call whose key is not cached: every check and the kernel compiled, then the
    entry made if the call qualifies (16-byte aligned rows, contiguous, on a GPU)."""
    aligned = not key[-1] and (key[2] * x.element_size()) % 16 == 0
    if not (aligned and key[4] and key[5] and key[6] >= 0):
        return None
    out, _, _ = _fwd(_fwd_op, _fwd_body, x, weight, None, None, None, None, eps, False, 0.0)
    rows = x.view(-1, x.shape[-1])  # the kernel the call above ran
    fn = _final().kernel_for(rows, weight, None, None, out.view(rows.shape), None, None)
    _PLAIN[key] = fn.call
    return out


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
    _check_device(
        x, ("weight", weight), ("dout", dout), ("rstd", rstd), ("dresidual_out", dresidual_out)
    )
    return _backward(
        x, weight, dout, rstd, dresidual_out, has_bias, dres_dtype, weight_offset, None
    )


def _bwd_tuned_body(x, weight, dout, rstd, dresidual_out, has_bias, dres_dtype, weight_offset):
    _check_device(
        x, ("weight", weight), ("dout", dout), ("rstd", rstd), ("dresidual_out", dresidual_out)
    )
    config = _tuned_bwd_config(
        x, weight, dout, rstd, dresidual_out, has_bias, dres_dtype, weight_offset
    )
    return _backward(
        x, weight, dout, rstd, dresidual_out, has_bias, dres_dtype, weight_offset, config
    )


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
    dx, k = outs[0], 1
    dw = db = None
    if weight is not None:
        dw, k = outs[k], k + 1
    if has_bias:
        db, k = outs[k], k + 1
    dresidual = outs[k] if dres_dtype is not None else (dx if has_residual else None)
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
    if dresidual_out is None and not has_bias and weight_offset == 0 and weight is not None:
        got = _plain_bwd(x, weight, dout, rstd)
        if got is not None:
            return got[0], got[1], None, got[0] if has_residual else None
    return _bwd(
        _bwd_op, _bwd_body, x, weight, dout, rstd, dresidual_out, has_bias, has_residual,
        weight_offset,
    )  # fmt: skip


#: The plain backward call (x, weight, dout, rstd: what autograd makes in every layer), by what
#: decides its kernel and its checks: dtypes, N, contiguity, devices, 16-byte alignment. As
#: the forward's ``_PLAIN``: an entry is made only after such a call passed every check, and
#: holds the compiled kernel with what its grid needs (rows a CTA, the most CTAs).
_PLAIN_BWD: dict = {}


def _plain_bwd_key(x, weight, dout, rstd):
    if type(x) is not Tensor or type(weight) is not Tensor or weight.dim() != 1:
        return None
    if type(dout) is not Tensor or type(rstd) is not Tensor:
        return None
    return (
        x.dtype,
        weight.dtype,
        dout.dtype,
        rstd.dtype,
        x.shape[-1] if x.dim() else None,
        weight.shape[0],
        x.is_contiguous() and dout.is_contiguous() and rstd.is_contiguous(),
        weight.stride(0),
        x.get_device(),
        weight.get_device(),
        dout.get_device(),
        rstd.get_device(),
        (x.data_ptr() | weight.data_ptr() | dout.data_ptr()) & 15,
    )


def _plain_bwd(x, weight, dout, rstd):
    """``(dx, dw)`` of the plain backward through the cache above, or None (the checked path)."""
    if _through_op(x):
        return None
    key = _plain_bwd_key(x, weight, dout, rstd)
    if key is None:
        return None
    hit = _PLAIN_BWD.get(key)
    if hit is None:
        if key[-1] or not key[6] or key[8] < 0 or not x.numel():  # misaligned, strided, CPU
            return None
        dx, dw, _, _ = _bwd(_bwd_op, _bwd_body, x, weight, dout, rstd, None, False, False, 0.0)
        fb, N = _final_bwd(), x.shape[-1]
        features = fb.BwdFeatures(dout_dtype=dout.dtype if dout.dtype != x.dtype else None)
        vec = _final().widest_vec(N, x.dtype)
        kernel, fn = fb.compiled_for(x.dtype, N, weight.dtype, features, vec)  # what ran
        dev = x.get_device()
        most = kernel.grid_x(1 << 40, fb.sm_count(dev), kernel.resident(dev))
        from .runtime import direct_call

        _PLAIN_BWD[key] = (direct_call(fn), kernel.tiling.rows_per_cta, most)
        return dx, dw
    if dout.shape != x.shape or rstd.shape != x.shape[:-1] or not x.numel():
        return None  # the checked path says what is wrong (or returns zeros for no rows)
    fn, rows, most = hit
    N = x.shape[-1]
    M = x.numel() // N
    P = min(-(-M // rows), most)
    dx = torch.empty_like(x)
    dw_p = x.new_empty((P, N), dtype=torch.float32)
    fn(
        x.view(M, N),
        weight,
        dout.view(M, N),
        None,
        rstd.view(M),
        dx.view(M, N),
        None,
        dw_p,
        None,
        P,
    )
    return dx, _final_bwd().sum_partials(dw_p, weight.dtype)


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
    features = fb.BwdFeatures(
        weight=weight is not None,
        dout_dtype=dout.dtype if dout.dtype != x.dtype else None,
        dres_out_dtype=None if dres_out is None else dres_out.dtype,
        dw=weight is not None,
        db=bool(has_bias),
        weight_offset=wo,
        dres_dtype=dres_dtype,
    )

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
    if not torch.is_grad_enabled() or not any(
        isinstance(t, Tensor) and t.requires_grad for t in (x, weight, bias, residual)
    ):
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

    def forward(self, x: Tensor) -> Tensor:
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
        if k == 1:
            return rmsnorm(x, self.weight, eps=eps)
        weight = None if self.weight is None else self.weight.reshape(-1)
        out = rmsnorm(x.reshape(*x.shape[:-k], -1), weight, eps=eps)
        return out.view(x.shape)
