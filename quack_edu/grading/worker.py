"""The learner side of judging: one answer cell loaded in a locked-down process.

A worker is a fork of the judge server (``_judgeserver``), which imported torch, CuTe DSL and
the library but never the grader's exercises, their reference answers or the solutions. The
grader (``judge.Worker``) sends it one job; the worker then

1. leaves the server's process group for a session of its own (the grader kills the whole
   group when it is done: nothing the answer starts outlives the judging);
2. imports what the job needs and may hold: the library, the holes the answer fills and the
   probes a check may ask (``probes``), never an exercise's module;
3. sets tripwires on the finished versions of what is asked (torch's RMSNorm, the library's
   reference and kernels, the exercise's own pieces: ``job["finished"]``);
4. locks itself down (``sandbox.lock_down``: no files outside its scratch folder, no
   processes, no secrets);
5. loads the answer cell and answers the grader's requests with plain data (``wire``): the
   value of a call, the PTX of a compile, a kernel's output. What the refused and the reached
   tripwires were goes back with every reply (``incidents``).

No verdict is made here.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import sys
import types

from . import hints, record, sandbox, tripwires
from .context import is_not_implemented
from .registry import MISSING
from .sandbox_rules import MEASURED, REBOUND
from .wire import Unencodable, encode

#: what a learner process may never reach, in every exercise: torch's RMSNorm (its operators:
#: every Python route, ``torch.rms_norm``, ``F.rms_norm``, ``nn.RMSNorm``,
#: ``torch.ops.aten...``, ends in one of them), the library's reference and finished kernels
FINISHED_EVERYWHERE = (
    "torch._decomp.decompositions._fused_rms_norm",
    "torch._decomp.decompositions._fused_rms_norm_backward",
    "quack_edu.reference.rmsnorm_ref",
    "quack_edu.reference.rstd_ref",
    "quack_edu.reference.rmsnorm_bwd_ref",
    "quack_edu.runtime.run_forward",
    "quack_edu.rmsnorm",
    "quack_edu.rmsnorm_fwd",
    "quack_edu.rmsnorm_bwd",
    *(f"quack_edu.stages.{s}.rmsnorm_fwd" for s in ("naive", "warp", "block", "cluster")),
    *(f"quack_edu.stages.{s}.rmsnorm_fwd" for s in ("cpasync", "final")),
    # the library's other RMSNorms, forward and backward (red team 5 reached the first two)
    "quack_edu.tools.kernels._composed",
    "quack_edu.tools.kernels._composed_residual",
    "quack_edu.tools.kernels.autograd_bwd",
    "quack_edu.lessons.bwd_strategies.forward_ops",
    "quack_edu.lessons.bwd_strategies.autograd_bwd",
    "quack_edu.lessons.bwd_strategies.dw_float64",
    "quack_edu.lessons.bwd_strategies.run",
    "quack_edu.grading.hints._rms_variant",
    # the CPU simulator, which runs any compiled kernel, the library's finished ones too (red
    # team 19 ran the final backward's PTX in it for 07.dx_row): no answer needs it
    "quack_edu.ptxsim.executor.launch",
    "quack_edu.ptxsim.executor.CTA.run",
    "quack_edu.ptxsim.executor.Cluster.run",
)
#: torch's normalisations, every overload of each operator on every key it has a kernel for:
#: torch's RMSNorm, and the others, which compute one too (red team 15: layer_norm of [x, -x],
#: whose mean is 0 and variance mean(x^2), scored 00.eager_rmsnorm; its backward 07.dx_row)
TORCH_NORMS = r"^aten::_?(fused_|native_|cudnn_|miopen_)?(rms|layer|group|batch|instance)_norm"
_TORCH_KEYS = ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CPU", "CUDA")
#: the names torch's tripwires are reached under (the judge shows them to the student)
TORCH_NORMALISATION, TORCH_AUTOGRAD = "torch's normalisation", "torch's autograd"


def resolve(dotted: str):
    """The object a dotted name names: a module's attribute, or a class's (``a.b.C.method``)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:  # a class's own attribute: the function, not a bound method
            obj = vars(obj)[p] if isinstance(obj, type) and p in vars(obj) else getattr(obj, p)
        return obj
    raise ImportError(dotted)


def _trip_torch(keep: list) -> None:
    """Torch's normalisation operators raise (a dispatcher override for this process only)."""
    import re
    import warnings
    import weakref

    import torch

    lib = torch.library.Library("aten", "IMPL")

    def reached(*args, **kwargs):
        sys.audit("quack_edu.sandbox.reached", TORCH_NORMALISATION)
        raise PermissionError(f"{tripwires.REACHED} {TORCH_NORMALISATION}: an answer computes it")

    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in torch._C._dispatch_get_all_op_names():
            if re.match(TORCH_NORMS, name):
                for key in _TORCH_KEYS:
                    if has_kernel(name, key):
                        lib.impl(name.removeprefix("aten::"), reached, key)
    # held by this list alone, which the caller keeps out of reach: not by torch's finalizer
    # registry, where a learner could find the library and undo it
    for f in list(weakref.finalize._registry):  # noqa: SLF001
        info = f.peek()
        if info is not None and info[0] is lib:
            f.detach()
    keep.append(lib)


def _no_grad_mode() -> None:
    """Autograd records nothing in this process, and nothing can switch it back on: for an
    exercise that asks a gradient by hand, whose answer may not differentiate by any entry
    (red team 17 ran the C engine, ``torch._C._ImperativeEngine().run_backward``, on an
    ``nn.Parameter``: the Python entries are tripwires, the engine is not). Only the C setter
    switches the mode (``torch.enable_grad`` and ``set_grad_enabled`` call it), and no one
    holds it once replaced."""
    import torch

    torch._C._set_grad_enabled(False)

    def _set_grad_enabled(mode) -> None:
        if mode:
            sys.audit("quack_edu.sandbox.reached", TORCH_AUTOGRAD)
            raise PermissionError(f"{tripwires.REACHED} {TORCH_AUTOGRAD}: an answer derives it")

    torch._C._set_grad_enabled = _set_grad_enabled


def _watch_ops():
    """A dispatch mode, on for the rest of the job, that reports (``MEASURED``) the first torch
    operator that computes (not one that only makes a tensor) on a tensor of more than one
    element: for an exercise that asks a count, whose answer may not measure one, at its cell's
    load either (red teams 21 and 22 traced the eager sequence on meta tensors as the cell
    loaded, then fitted). Returns ``intact()``, which reports the mode gone from the stack as a
    change to the grader."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
    from torch.utils._pytree import tree_leaves

    # the size by the base class's own method, and any subclass reported (red team 23's wrapper
    # subclass said numel() == 1 of every tensor it measured)
    Tensor, numel, told = torch.Tensor, torch.Tensor.numel, []
    # a tensor made to read a dtype's size is no measurement (an honest answer may): only an
    # operator that computes is reported
    makes = {"empty", "empty_strided", "empty_like", "zeros", "ones", "full", "fill_", "zero_"}

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if (
                not told
                and func.overloadpacket.__name__ not in makes
                and any(
                    isinstance(t, Tensor) and (type(t) is not Tensor or numel(t) > 1)
                    for t in tree_leaves((args, kwargs, out))
                )
            ):
                told.append(1)
                sys.audit("quack_edu.sandbox.reached", MEASURED)
            return out

    mode = Watch()
    mode.__enter__()

    def intact() -> None:
        if not told and not any(m is mode for m in _get_current_dispatch_mode_stack()):
            told.append(1)
            sys.audit("quack_edu.sandbox.reached", f"{REBOUND} the grader's operator watch")

    return intact


def _set_tripwires(names, keep: list) -> None:
    import torch  # noqa: F401

    _trip_torch(keep)
    for name in names:
        try:
            obj = resolve(name)
        except (ImportError, AttributeError, KeyError):
            continue  # a name this version of the library does not have
        if callable(obj) and not isinstance(obj, type):
            keep.append(tripwires.tripwire(obj, name))


def preload_library() -> None:
    """Import every module of the library (never the exercises): once locked, a worker reads
    none of the package's files, so nothing of it may be left to import later."""
    import pkgutil

    import quack_edu

    skip = ("quack_edu.grading.exercises", "quack_edu.__main__")
    for info in pkgutil.walk_packages(quack_edu.__path__, "quack_edu."):
        if not info.name.startswith(skip):
            try:
                importlib.import_module(info.name)
            except Exception:  # noqa: BLE001  (a tool whose own dependency is absent here)
                pass


def hole_of(ref):
    return getattr(importlib.import_module(ref[0]), ref[1])


def raised(e: BaseException) -> dict:
    cause = e.__cause__ or e.__context__
    return {
        "raised": type(e).__name__,
        "module": type(e).__module__ or "",
        "evalue": str(e)[:20000],
        "cause": f"{type(cause).__name__}: {str(cause)[:4000]}" if cause is not None else "",
        "not_implemented": is_not_implemented(e),
        "short": hints.short_error(e, 400),
    }


def main(conn, record_fd: int | None = None) -> None:
    """The worker's life: the job, the lock-down, the answer cell, then the grader's requests.
    ``record_fd``: the socket on which the sandbox's hook sends the judge what is compiled at
    run time and every incident (``record.RECORD_FORMAT``)."""
    job = pickle.loads(conn.recv_bytes())
    os.setsid()  # a session of its own: the grader kills the group
    for k in [k for k in os.environ if k.startswith("QUACK_EDU_GRAD") or k in ("PWD", "OLDPWD")]:
        del os.environ[k]  # nothing of the grading run, nor where the grader was started
    sys.argv = ["quack-edu-judge"]
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    import matplotlib

    matplotlib.use("Agg")
    import tvm_ffi  # noqa: F401  (loaded now: no native library is loaded once locked)

    from .nbfiles import answer_from_source

    preload_library()  # the stages, the holes answers fill, the probes checks ask
    try:  # torch.compile reads the file of each function it traces: primed by hide_sources
        import torch._dynamo.pgo  # noqa: F401
    except ImportError:
        pass
    keep: list = []
    if job.get("autograd_off"):  # a gradient asked by hand
        _no_grad_mode()
    _set_tripwires((*FINISHED_EVERYWHERE, *job.get("finished", ())), keep)
    # the library's text: in the line cache with the finished functions blanked, and its files
    # out of reach (re-running a module's source would make fresh, untripped functions)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tripwires.hide_sources(package)
    # the tripwires' holders and codes are the hook's alone from here (red team 9 reached
    # ``keep`` through this frame's locals and destroyed the torch tripwire): not in this frame
    sandbox.lock_down(
        job["scratch"],
        secrets=[*job.get("secrets", ()), package],
        record_fd=record_fd,
        hold=tuple(keep),
    )
    keep.clear()
    del keep
    _sent["recorded"] = record_fd is not None
    # what the grader's code here calls by name, taken before any learner code runs: a probe is
    # served by the function bound now, and a function rebound in any module is reported with
    # every reply but a call's (red team 19 reached every module by a torch helper that
    # imports by a string)
    bound, serve_, seen_ = Bindings(), serve, _seen
    state = {"launchers": {}, "probes": bound.probes()}
    watched = _watch_ops() if job.get("watch_ops") else lambda: None
    try:
        answer = answer_from_source(job["source"], job["answer"])
    except BaseException as e:  # SystemExit and KeyboardInterrupt are the learner's too
        conn.send_bytes(json.dumps({"loaded": False, **raised(e), **_seen()}).encode())
        return
    if answer is MISSING:
        kind, value = "missing", None
    elif callable(answer):
        kind, value = "callable", None
    else:
        try:
            kind, value = "value", encode(answer)
        except Unencodable:
            kind, value = "object", None
    bound.check()
    watched()
    reply = {"loaded": True, "kind": kind, "value": value, **seen_()}
    conn.send_bytes(json.dumps(reply).encode())
    while True:
        try:
            req = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        # around each request but a call (whose value is the answer's anyway: ~20 ms saved a
        # call): before, since a call may rebind what a probe then uses and put it back from
        # inside the probe (red team 22); after, for what the request itself ran
        if req[0] != "call":
            bound.check()
        try:
            reply = serve_(req, answer, state)
        except BaseException as e:
            reply = raised(e)
        if req[0] != "call":
            bound.check()
        watched()
        reply.update(seen_())
        try:
            data = json.dumps(reply, allow_nan=True).encode()
        except (TypeError, ValueError) as e:
            data = json.dumps({**raised(e), **seen_()}).encode()
        conn.send_bytes(data)


class Bindings:
    """Every function, class and module bound in a loaded module, as they are now (before any
    learner code runs; ``__main__`` aside). ``check()`` reports, by the tripwires' audit event
    (which only the sandbox's hook keeps), each one since rebound or deleted: the grader's code
    in this process (probes, holes, the wire) and the library and torch under it call them by
    name. Its own names are bound here too, out of the learner's reach (the instance lives in
    ``main``'s frame only; an installed class's attributes cannot be set). ``__main__`` (and
    its alias ``__mp_main__``) is the learner's own."""

    KINDS = (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType)

    def __init__(self):
        self._audit, self._get, self._told = sys.audit, dict.get, set()
        self._snap = [
            (name, d, k, v)
            for name, d in [(n, getattr(m, "__dict__", None)) for n, m in list(sys.modules.items())]
            if name not in ("__main__", "__mp_main__") and isinstance(d, dict)
            for k, v in list(d.items())
            if isinstance(v, self.KINDS)
        ]

    def probes(self) -> dict:
        """{(module, name): function} a check may probe (``Context.probe``: the grader's
        learner-side modules)."""
        mine = [(n, k, v) for n, _, k, v in self._snap if n.startswith(f"{__package__}.")]
        return {(n, k): v for n, k, v in mine if ".exercises" not in n}

    def check(self) -> None:
        get, told = self._get, self._told
        for name, d, k, v in self._snap:
            if get(d, k) is not v and (name, k) not in told:
                told.add((name, k))
                self._audit("quack_edu.sandbox.reached", f"{REBOUND} {name}.{k}")


_sent = {"compiled": 0, "recorded": False}


def _seen() -> dict:
    """What goes back with every reply: the sandbox's incidents, and the text compiled at run
    time since the last reply (``record.compiled``), which the judge holds against the
    library's finished version."""
    if _sent["recorded"]:  # the hook sent them already, to the judge's record
        return {"incidents": sandbox.incidents()}
    new = record.compiled(_sent["compiled"])
    _sent["compiled"] += len(new)
    return {"incidents": sandbox.incidents(), "compiled": new}


def build(answer, ref, N, dtype, config, wdtype=None):
    return hole_of(ref).kernel(answer, N, dtype, config, wdtype)


def serve(req, answer, state) -> dict:
    from .guard import shortcut_guard

    op = req[0]
    if op == "call":
        _, args, kwargs = req
        with shortcut_guard() as seen:
            out = answer(*args, **kwargs)
        if seen:
            return {"shortcut": seen[0]}
        try:
            return {"value": encode(out)}
        except Unencodable as e:
            return {"unencodable": str(e), "module": type(out).__module__ or ""}
    if op in ("launch", "time"):
        import torch

        from ..runtime import compile_kernel

        _, ref, N, dtype, config, wdtype, args = req
        key = (ref, N, str(dtype), repr(config), str(wdtype))
        if key not in state["launchers"]:
            kernel = build(answer, ref, N, dtype, config, wdtype)
            with shortcut_guard() as seen:
                fn = compile_kernel(kernel)
            if seen:
                return {"shortcut": seen[0]}
            state["launchers"][key] = fn
        fn = state["launchers"][key]
        if op == "launch":
            x, w, out, eps = args
            fn(x, w, out, eps)
            torch.cuda.synchronize()
            return {"value": encode(out)}
        from ..tools.bench import cuda_time_us

        M, eps = args
        x = torch.randn(M, N, device="cuda", dtype=dtype)
        w = torch.randn(N, device="cuda", dtype=dtype)
        out = torch.empty_like(x)
        return {"value": encode(float(cuda_time_us(lambda: fn(x, w, out, eps))))}
    if op == "probe":  # a check's question, answered with data (``Context.probe``)
        _, (module, name), args = req
        fn = state["probes"][module, name]  # as bound before the answer cell ran
        with shortcut_guard() as seen:
            out = fn(answer, *args)
        if seen:
            return {"shortcut": seen[0]}
        try:
            return {"value": encode(out)}
        except Unencodable as e:
            return {"unencodable": str(e), "module": type(out).__module__ or ""}
    raise ValueError(f"unknown request {op!r}")
