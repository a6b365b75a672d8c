"""The library's face: QuACK 0.6.5's ``quack.rmsnorm`` API over the ``final`` kernel.

    rmsnorm_fwd(x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd,
                weight_offset) -> (out, residual_out, rstd)
    rmsnorm(x, weight, ..., prenorm) -> out or (out, residual_out)      (autograd.Function)
    rmsnorm_ref(x, w, bias, residual, eps, weight_offset)                (fp32 reference)
    QuackRMSNorm(dim, eps, elementwise_affine, device, dtype)            (a torch.nn.RMSNorm)
    rmsnorm_fwd_tuned(...)                                               (autotuned config)

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

The backward pass is not written yet: ``rmsnorm`` raises ``NotImplementedError`` when autograd
asks it for a gradient. Forward-only use (inference, ``torch.no_grad``, a model in eval mode)
works and keeps nothing alive for a backward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .reference import rmsnorm_ref as _rmsnorm_ref32

__all__ = [
    "rmsnorm_fwd",
    "rmsnorm",
    "rmsnorm_ref",
    "rmsnorm_fwd_tuned",
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

_NO_BACKWARD = (
    "the RMSNorm backward pass is not implemented in quack_edu yet (forward only): "
    "call it under torch.no_grad() / torch.inference_mode(), or detach the inputs"
)

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


def _define(name: str, body):
    op = torch.library.custom_op(
        f"quack_edu::{name}",
        body,
        mutates_args=(),
        schema=(
            "(Tensor x, Tensor? weight, Tensor? bias, Tensor? residual, ScalarType out_dtype, "
            "ScalarType? residual_out_dtype, float eps, bool store_rstd, float weight_offset) "
            "-> Tensor[]"
        ),
    )
    op.register_fake(_fwd_fake)
    return op


_fwd_op = _define("rmsnorm_fwd", _fwd_body)
_fwd_tuned_op = _define("rmsnorm_fwd_tuned", _fwd_tuned_body)


def _through_op(x) -> bool:
    """Call the registered op (not its body) when something has to see it: dynamo tracing,
    a dispatch mode (FakeTensorMode, make_fx, opcheck), or a tensor subclass."""
    return (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack() > 0
        or type(x) is not Tensor
    )


def _fwd(op, body, x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd, wo):
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
        and not weight_offset
        and weight is not None
    ):
        out = _plain(x, weight, eps)
        if out is not None:
            return out, x, None
    return _fwd(
        _fwd_op, _fwd_body, x, weight, bias, residual, out_dtype, residual_dtype, eps,
        store_rstd, weight_offset,
    )  # fmt: skip


#: The plain call (x, weight: nothing else), the one a model makes in every layer, by what
#: decides its kernel and its checks: dtypes, N, strides, devices, 16-byte alignment. An
#: entry is made only after that call went once through every check (``_fwd``), so a hit
#: needs none of them again: the host cost per call is a few attribute reads, one
#: allocation and the launch (measured on the H200: see ``quack-edu bench --overhead``).
_PLAIN: dict = {}


def _plain_key(x, weight):
    if type(x) is not Tensor or type(weight) is not Tensor or x.dim() < 2 or weight.dim() != 1:
        return None
    esize = x.element_size()
    return (
        x.dtype,
        weight.dtype,
        x.shape[-1],
        weight.shape[0],
        x.is_contiguous(),
        x.stride(-2),
        weight.stride(0),
        x.get_device(),
        weight.get_device(),
        (x.data_ptr() | weight.data_ptr() | x.stride(-2) * esize) & 15,
    )


def _plain(x, weight, eps):
    """``out`` of the plain call through the cache above, or None (then the checked path)."""
    if _through_op(x):
        return None
    key = _plain_key(x, weight)
    if key is None:
        return None
    fn = _PLAIN.get(key)
    if fn is None:
        if key[-1] or not key[4] or key[7] < 0:  # misaligned, strided, or not on a GPU
            return None
        out, _, _ = _fwd(
            _fwd_op, _fwd_body, x, weight, None, None, None, None, eps, False, 0.0
        )  # every check, and the kernel compiled
        rows = x.view(-1, x.shape[-1])  # the kernel the call above ran
        fn = _final().kernel_for(rows, weight, None, None, out.view(rows.shape), None, None)
        _PLAIN[key] = fn.compiled
        return out
    out = torch.empty_like(x)
    if x.numel():
        rows = x if x.dim() == 2 else x.view(-1, x.shape[-1])
        fn(rows, weight, None, None, out if x.dim() == 2 else out.view(rows.shape), None, None, eps)
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


def _tune_key(x, weight, bias, residual, out_dtype, res_out_dtype, store_rstd, weight_offset):
    index = x.get_device()
    gpu = _gpu_names.get(index)
    if gpu is None:
        gpu = _gpu_names[index] = torch.cuda.get_device_name(index)
    per_head = any(p is not None and p.dim() == 2 for p in (weight, bias))
    rows = x.numel() // max(1, x.shape[-1])
    return (
        ("op", "rmsnorm_fwd"),
        ("gpu", gpu),
        # the rows, to the next power of two: a config timed on 8 rows (launch-bound, one wave)
        # says little about 32768 (many waves), and one key per M would tune every batch size
        ("M", 1 << max(0, rows - 1).bit_length()),
        ("N", x.shape[-1]),
        ("x", _name(x.dtype)),
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
    global _tuner
    if _tuner is None:
        from .autotune import Autotuner

        _tuner = Autotuner()
    key = _tune_key(x, weight, bias, residual, out_dtype, res_out_dtype, store_rstd, wo)
    config = _tuner.cached(key, _tuner)  # the tuner itself as the "not tuned yet" sentinel
    if config is not _tuner:
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

    return _tuner.tune(key, candidates, run, bench=bench)


# --------------------------------------------------------------------------------------------
# Autograd and the module
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("quack_edu::rmsnorm_bwd_missing", mutates_args=())
def _bwd_missing(dout: Tensor, shape: list[int], dtype: torch.dtype) -> Tensor:
    raise NotImplementedError(_NO_BACKWARD)


@_bwd_missing.register_fake
def _(dout, shape, dtype):
    return dout.new_empty(shape, dtype=dtype)


def _contiguous_last(t):
    """The kernel reads rows with unit stride; ``rmsnorm`` (like QuACK's) accepts any strides.
    Under torch.compile strides of fake tensors are not final, so always ask."""
    if not isinstance(t, Tensor) or t.dim() == 0:
        return t  # rmsnorm_fwd's checks say what is wrong with it
    if torch.compiler.is_compiling():
        return t.contiguous()
    return t if t.stride(-1) == 1 else t.contiguous()


class RMSNormFunction(torch.autograd.Function):
    """``rmsnorm`` under autograd. Forward only for now: the backward raises."""

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
        out, residual_out, _ = rmsnorm_fwd(
            x, weight, bias, residual, out_dtype, residual_dtype, eps, False, weight_offset
        )
        # Nothing is saved: there is no backward to use it. Only what a traced (compiled)
        # backward needs to name the shapes of the gradients it cannot compute.
        ctx.like = [
            None if t is None else (list(t.shape), t.dtype) for t in (x, weight, bias, residual)
        ]
        return (out, residual_out) if prenorm else out

    @staticmethod
    def backward(ctx, dout, *rest):
        if not torch.compiler.is_compiling():
            raise NotImplementedError(_NO_BACKWARD)
        # torch.compile traces the backward of a graph whose inputs require grad even if it is
        # never run (a model in eval mode, outside no_grad): give it an op that raises when run.
        grads = [
            _bwd_missing(dout, *like) if like is not None and need else None
            for like, need in zip(ctx.like, ctx.needs_input_grad[:4], strict=True)
        ]
        return (*grads, None, None, None, None, None)


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

    The backward pass is not implemented yet: a gradient request raises NotImplementedError.
    Without one to record (grad mode off, or no input requiring grad) the autograd.Function is
    skipped altogether.
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
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        if k == 1:
            return rmsnorm(x, self.weight, eps=eps)
        weight = None if self.weight is None else self.weight.reshape(-1)
        out = rmsnorm(x.reshape(*x.shape[:-k], -1), weight, eps=eps)
        return out.view(x.shape)
