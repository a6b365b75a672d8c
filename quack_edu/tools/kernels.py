"""The kernels a benchmark can time, by name: the stages, the library and the peers.

* stages: ``cpasync``, ``cluster@hold`` (a kernel class of the stage's ``VARIANTS``),
  ``block#1`` (the k-th of the stage's ``configs(N)``): see ``split_name``;
* the library: ``lib`` = ``quack_edu.rmsnorm.rmsnorm_fwd``, ``lib-tuned`` =
  ``rmsnorm_fwd_tuned`` (their backward: ``rmsnorm_bwd``, ``rmsnorm_bwd_tuned``);
* the peers (``PEERS``): ``quack`` = QuACK's ``rmsnorm_fwd``, ``quack-autograd``,
  ``torch-compile``, ``liger``, ``torch-eager`` = ``F.rms_norm``, ``torch-ops``.

``resolve_kernels`` makes each name a callable (``fn(x, w) -> out``; with a residual ``fn(x,
w, r) -> (out, residual_out)``; the backward ``fn(x, w, dout, rstd) -> (dx, dw)``), or says
why it cannot run here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ..stages import BACKWARD_STAGES, STAGE_ORDER
from .runinfo import why
from .timing import EPS

#: the library's entries, by kernel name (``quack_edu.rmsnorm``, QuACK's signature)
LIBRARY = {"lib": "rmsnorm_fwd", "lib-tuned": "rmsnorm_fwd_tuned"}
LIBRARY_BWD = {"lib": "rmsnorm_bwd", "lib-tuned": "rmsnorm_bwd_tuned"}
#: every peer this harness knows, in the order "all" lists them
PEERS = ("quack", "quack-autograd", "torch-compile", "liger", "torch-eager", "torch-ops")
#: the peers a notebook's cell does not run while ``quack-edu grade`` runs it: importing QuACK or
#: Liger, or compiling (torch.compile's C compiler), is refused there and flags the notebook
GRADER_REFUSES = ("quack", "quack-autograd", "torch-compile", "liger")
#: the package whose version a record notes for a peer
PEER_PACKAGES = {
    "quack": "quack-kernels",
    "quack-autograd": "quack-kernels",
    "liger": "liger-kernel",
}


def split_name(name: str) -> tuple[str, str, str]:
    """``stage[@variant][#k]`` -> (stage, variant, k), the last two possibly empty."""
    head, _, index = name.partition("#")
    stage, _, variant = head.partition("@")
    return stage, variant, index


def kernel_kind(name: str) -> str:
    """'library' (``lib``, ``lib-tuned``), 'peer' (``PEERS``) or 'stage' (anything else)."""
    if name in LIBRARY:
        return "library"
    if name in PEERS:
        return "peer"
    return "stage"


def resolve_config(name: str, N: int, dtype, weight_dtype=None):
    """The config a stage kernel ``name`` runs with at N: its heuristic's, or with ``name#k`` the
    k-th entry of the stage's ``configs(N, dtype)`` (the alternatives the heuristic chooses
    between), so that they can be timed side by side. A stage whose heuristic knows the
    weight's dtype (final: an fp32 weight has plans of its own) is given ``weight_dtype``."""
    import inspect

    from ..stages import get_stage

    stage, _, index = split_name(name)
    mod = get_stage(stage)
    by_weight = "weight_dtype" in inspect.signature(mod.configs).parameters
    extra = {"weight_dtype": weight_dtype} if by_weight and weight_dtype is not None else {}
    if not index:
        return mod.default_config(N, dtype, **extra)
    options = mod.configs(N, dtype, **extra)
    if int(index) >= len(options):
        raise ValueError(f"{stage} has {len(options)} configs at N={N}: {options}")
    return options[int(index)]


def config_of(name: str, N: int, dtype, weight_dtype=None) -> str | None:
    """The config a stage kernel runs at N, for the record (None for peers and the library)."""
    if kernel_kind(name) != "stage" or split_name(name)[0] not in STAGE_ORDER:
        return None
    try:
        return repr(resolve_config(name, N, dtype, weight_dtype))
    except Exception:
        return None


def _variant(mod, stage: str, variant: str):
    """The kernel class a stage lists under ``variant`` in its ``VARIANTS`` (None: none
    asked for)."""
    if not variant:
        return None
    variants = getattr(mod, "VARIANTS", {})
    if variant not in variants:
        raise ValueError(f"{stage} has no variant {variant!r}; it has: {sorted(variants)}")
    return variants[variant]


def stage_fn(name: str, config=None):
    """A stage's forward with ``config``, or with the config ``resolve_config`` names.
    ``stage@variant`` runs the kernel class the stage lists under that name in ``VARIANTS``
    (the same tiling with another plan, e.g. ``cluster@hold``)."""
    from ..runtime import run_forward
    from ..stages import get_stage

    stage, variant, _ = split_name(name)
    mod = get_stage(stage)
    kernel = _variant(mod, stage, variant) or mod.KERNEL
    forced = functools.cache(lambda N, dtype, wdt: resolve_config(name, N, dtype, wdt))

    def fwd(x, w, eps=1e-6):
        wdt = None if w is None else w.dtype
        return run_forward(kernel, x, w, eps, config or forced(x.shape[1], x.dtype, wdt))

    return fwd


def stage_bwd_fn(name: str) -> Callable:
    """A backward stage (``BACKWARD_STAGES``: final_bwd) as ``fn(x, w, dout, rstd) -> (dx,
    dw)``: its launch with its heuristic's config, or ``#k`` the k-th of its ``configs`` for
    the weight's dtype (``@variant``: a kernel class of its ``VARIANTS``), then dw's partial
    sums added. The library's ``rmsnorm_bwd`` runs the same kernel behind its checks."""
    from ..stages import get_stage

    stage, variant, index = split_name(name)
    mod = get_stage(stage)
    kernel = _variant(mod, stage, variant) or mod.KERNEL

    @functools.cache
    def pick(N, dtype, wdt):  # None: kernel.launch's own, the heuristic's for the call's features
        return resolve_config(name, N, dtype, wdt) if index else None

    def bwd(x, w, dout, rstd):
        dx = torch.empty_like(x)
        config = pick(x.shape[1], x.dtype, w.dtype)
        dw_p, _ = kernel.launch(x, w, dout, None, rstd, dx, None, False, config=config)
        return dx, mod.sum_partials(dw_p, w.dtype)

    return bwd


def library_fn(name: str, residual: bool = False, pass_: str = "fwd") -> Callable:
    """The library's forward (``lib``: heuristic config; ``lib-tuned``: autotuned on the first
    call of a key) as ``fn(x, w) -> out``, or with ``residual`` ``fn(x, w, r) -> (out,
    residual_out)``; its backward (``pass_="bwd"``) as ``fn(x, w, dout, rstd) -> (dx, dw)``,
    with ``residual`` (a prenorm backward) ``fn(x, w, dout, rstd, dresidual_out)``, dx then
    holding dresidual_out added. Raises ImportError/AttributeError while the library lacks it."""
    import importlib

    mod = importlib.import_module("quack_edu.rmsnorm")
    if pass_ == "bwd":
        b = getattr(mod, LIBRARY_BWD[name])
        if residual:
            return lambda x, w, dout, rstd, dres: b(x, w, dout, rstd, dres, has_residual=True)[:2]
        return lambda x, w, dout, rstd: b(x, w, dout, rstd)[:2]
    f = getattr(mod, LIBRARY[name])
    if residual:
        return lambda x, w, r: tuple(f(x, w, residual=r, eps=EPS)[:2])
    return lambda x, w: f(x, w, eps=EPS)[0]


# --- the peers ------------------------------------------------------------------------------


def _composed(x, w):  # RMSNorm as a model writes it in PyTorch ops: one kernel per op
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def _composed_residual(x, w, r):  # the pre-norm block: h = x + r; (norm(h) * w, h)
    h = x.float() + r.float()
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * w.float()
    return out.to(x.dtype), h.to(x.dtype)


def _torch_compile(fn):
    # One specialisation per shape, as a model with fixed shapes gets; raise dynamo's limit on
    # recompiles so that a sweep of shapes (and weight dtypes) never falls back to eager.
    import torch._dynamo

    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    return torch.compile(fn, dynamic=False)


def autograd_bwd(forward: Callable) -> Callable:
    """A peer's backward as autograd runs it: ``fn(x, w, dout, rstd) -> (dx, dw)``. The forward
    runs once per input set, on its first call (outside the timing: ``timing.bench_one`` makes
    that first call before it times); every call then replays the recorded backward
    (``retain_graph``). ``fn.clear()`` drops the recorded graphs.

    Through CUDA graphs too: autograd runs a backward op on the stream its forward op ran on,
    so a capture must happen on the stream the forward was recorded on. ``fn.stream`` (None:
    the current stream) is where forwards are recorded; ``bench_one`` sets a side stream of
    its own before a graph-timed case, and ``timing.time_graph`` captures on ``fn.stream``."""
    recorded: dict = {}

    def fn(x, w, dout, rstd):
        key = (x.data_ptr(), w.data_ptr())
        hit = recorded.get(key)
        if hit is None:
            xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
            if fn.stream is None:
                with torch.enable_grad():
                    hit = recorded[key] = (forward(xg, wg), xg, wg)
            else:
                fn.stream.wait_stream(torch.cuda.current_stream())
                with torch.enable_grad(), torch.cuda.stream(fn.stream):
                    hit = recorded[key] = (forward(xg, wg), xg, wg)
                torch.cuda.current_stream().wait_stream(fn.stream)
        out, xg, wg = hit
        return torch.autograd.grad(out, (xg, wg), dout, retain_graph=True)

    fn.clear = recorded.clear
    fn.stream = None
    return fn


def _forward_peers(residual: bool) -> dict[str, Callable[[], Callable]]:
    """{peer: a function that makes its forward}; a maker raises where the peer cannot run."""
    import torch.nn.functional as F

    def quack():
        from quack.rmsnorm import rmsnorm_fwd  # the forward entry the issue compares with

        if residual:
            return lambda x, w, r: tuple(rmsnorm_fwd(x, w, residual=r, eps=EPS)[:2])
        return lambda x, w: rmsnorm_fwd(x, w, eps=EPS)[0]

    def quack_autograd():
        if residual:
            raise NotImplementedError("timed without a residual only")
        from quack.rmsnorm import rmsnorm

        return lambda x, w: rmsnorm(x, w, eps=EPS)

    def liger():
        if residual:
            from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward

            return lambda x, w, r: tuple(fused_add_rms_norm_forward(x, r, w, EPS, 0.0, "llama")[:2])
        from liger_kernel.ops.rms_norm import rms_norm_forward

        return lambda x, w: rms_norm_forward(x, w, EPS, 0.0, "llama", None)[0]

    def eager():  # torch >= 2.4 has a fused CUDA kernel behind F.rms_norm
        if residual:

            def fn(x, w, r):
                h = x + r
                return F.rms_norm(h, (h.shape[-1],), w, EPS), h

            return fn
        return lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS)

    composed = _composed_residual if residual else _composed
    return {
        "quack": quack,
        "quack-autograd": quack_autograd,
        "torch-compile": lambda: _torch_compile(composed),
        "liger": liger,
        "torch-eager": eager,
        "torch-ops": lambda: composed,  # the same maths in separate ops: one kernel per op
    }


def _backward_peers(residual: bool) -> dict[str, Callable[[], Callable]]:
    """{peer: a function that makes its backward}; a maker raises where the peer cannot run."""
    import torch.nn.functional as F

    def quack():
        from quack.rmsnorm import rmsnorm_bwd

        if residual:
            return lambda x, w, dout, rstd, dres: rmsnorm_bwd(
                x, w, dout, rstd, dres, has_residual=True
            )[:2]
        return lambda x, w, dout, rstd: rmsnorm_bwd(x, w, dout, rstd)[:2]

    def autograd_of(make_forward):
        def make():
            if residual:
                raise NotImplementedError("its prenorm backward is not timed by this harness")
            return autograd_bwd(make_forward())

        return make

    def compiled():
        import torch._functorch.config as functorch_config

        # a compiled backward replayed with retain_graph must not donate its buffers
        functorch_config.donated_buffer = False
        return _torch_compile(_composed)

    def not_timed():
        raise NotImplementedError("its backward is not timed by this harness")

    return {
        "quack": quack,
        "quack-autograd": not_timed,
        "torch-compile": autograd_of(compiled),
        "liger": not_timed,
        "torch-eager": autograd_of(lambda: lambda x, w: F.rms_norm(x, x.shape[-1:], w, EPS)),
        "torch-ops": autograd_of(lambda: _composed),
    }


def peer_fns(
    residual: bool = False, names=PEERS, pass_: str = "fwd"
) -> tuple[dict[str, Callable], dict[str, str]]:
    """The peers among ``names`` that are importable here, as ``fn(x, w) -> out`` (with
    ``residual``: ``fn(x, w, r) -> (out, residual_out)``; backward: ``fn(x, w, dout, rstd) ->
    (dx, dw)``), and why each other one is not."""
    from ..lessons.selfcheck import grading

    makers = _backward_peers(residual) if pass_ == "bwd" else _forward_peers(residual)
    fns: dict[str, Callable] = {}
    missing: dict[str, str] = {}
    for name, make in makers.items():
        if name not in names:
            continue
        if name in GRADER_REFUSES and grading():  # not even tried: the try would be flagged
            missing[name] = (
                "not run while quack-edu grade runs the notebook: its sandbox refuses QuACK, "
                "Liger and the C compiler torch.compile calls (quack-edu bench measures them)"
            )
            continue
        try:
            fns[name] = make()
        except Exception as e:  # not installed here, or this mode has no such kernel
            missing[name] = why(e, 200)
    for name in names:
        if name not in PEERS:
            missing[name] = f"unknown peer; known: {', '.join(PEERS)}"
    return fns, missing


def resolve_kernels(
    names, residual: bool = False, pass_: str = "fwd"
) -> tuple[dict[str, Callable], dict[str, str]]:
    """{name: fn} for every kernel name that can run here (stages, library, peers), and
    {name: why not} for the others, so that a run records what it skipped and why."""
    fns: dict[str, Callable] = {}
    skipped: dict[str, str] = {}
    peers = [n for n in names if kernel_kind(n) == "peer"]
    got, missing = peer_fns(residual, peers, pass_) if peers else ({}, {})
    for name in names:
        kind = kernel_kind(name)
        try:
            if kind == "peer":
                if name in missing:
                    skipped[name] = missing[name]
                else:
                    fns[name] = got[name]
            elif kind == "library":
                fns[name] = library_fn(name, residual, pass_)
            elif residual:
                raise NotImplementedError("stage kernels take no residual")
            elif (split_name(name)[0] in BACKWARD_STAGES) != (pass_ == "bwd"):
                raise NotImplementedError(
                    "a forward stage: the backward is timed through final_bwd and the library"
                    if pass_ == "bwd"
                    else "a backward stage: time it with --pass bwd"
                )
            elif pass_ == "bwd":
                fns[name] = stage_bwd_fn(name)
            else:
                fns[name] = stage_fn(name)
        except Exception as e:
            skipped[name] = why(e, 200)
    return fns, skipped
