"""The shortcut guard: which library RMSNorms the learner's code called while it ran.

A learner's answer, or the kernel it builds, may not call a finished RMSNorm (torch's, the
project's reference or library, QuACK's). ``judge`` runs every answer and every learner compile
inside ``shortcut_guard()`` and fails it with ``checks.shortcut_failure``; the exercises' checks
wrap the learner's code in ``checks.no_shortcuts()``, which does both.
"""

from __future__ import annotations

import cProfile
import sys
from contextlib import contextmanager


def _forbidden_targets():
    """(code objects, built-in names as ``cProfile`` writes them) of the library RMSNorms."""
    import torch

    codes, builtins = {}, {}  # (in the order a report names them first: the outer call)
    mod = getattr(torch.nn, "RMSNorm", None)
    if mod is not None:
        codes[mod.forward.__code__] = "torch.nn.RMSNorm"
    fn = getattr(torch.nn.functional, "rms_norm", None)
    if fn is not None and hasattr(fn, "__code__"):
        codes[fn.__code__] = "torch.nn.functional.rms_norm"
    for name in ("torch.rms_norm", "torch._ops.aten.rms_norm"):  # an alias is the same object
        builtins[f"<built-in method {name}>"] = "torch.rms_norm"
    from .. import reference

    for name in ("rmsnorm_ref", "rstd_ref", "rmsnorm_bwd_ref"):
        codes[getattr(reference, name).__code__] = f"quack_edu.reference.{name}"
    from .. import runtime

    codes[runtime.run_forward.__code__] = "a finished quack_edu kernel (run_forward)"
    return codes, builtins


def _quack_norm_file(path: str) -> bool:
    """Whether ``path`` is one of QuACK's norm modules (``.../quack/rmsnorm.py`` ...)."""
    parts = path.replace("\\", "/").split("/")
    if "quack" not in parts:
        return False
    rest = "/".join(parts[len(parts) - parts[::-1].index("quack") :])
    return "norm" in rest or "rms" in rest


#: the guards' profilers now on, innermost last: one collects at a time (Python 3.12's cProfile
#: is a sys.monitoring tool, of which one may be active)
_GUARDS: list = []


#: how code switches cProfile off on this Python
_SWITCH = "sys.monitoring" if sys.version_info >= (3, 12) else "sys.setprofile"


def _still_profiling(prof) -> bool:
    """Whether ``prof`` saw the block to its end (code can switch a profiler off)."""
    if sys.version_info >= (3, 12):  # cProfile is the sys.monitoring profiler tool
        mon = sys.monitoring
        return mon.get_tool(mon.PROFILER_ID) is not None and mon.get_events(mon.PROFILER_ID) != 0
    return sys.getprofile() is prof


def _hits(prof, codes, builtins) -> list[str]:
    """The forbidden targets among what ``prof`` saw, the outermost call first."""
    seen = []
    for entry in prof.getstats():
        code = entry.code
        if isinstance(code, str):
            hit = builtins.get(code)
        else:
            hit = codes.get(code)
            if hit is None and _quack_norm_file(code.co_filename):
                hit = "QuACK (the quack package)"
        if hit and hit not in seen:
            seen.append(hit)
    order = [*codes.values(), "QuACK (the quack package)", *builtins.values()]
    return sorted(seen, key=order.index)


@contextmanager
def _hook_guard(codes, builtins):
    """The guard as a Python profile hook, where cProfile cannot be had: the same targets,
    several times slower (every call materialises a frame for the hook)."""
    seen: list[str] = []

    def hook(frame, event, arg):
        if event == "call":
            hit = codes.get(frame.f_code)
            if hit is None and _quack_norm_file(frame.f_code.co_filename):
                hit = "QuACK (the quack package)"
        elif event == "c_call":
            mod = getattr(arg, "__module__", None) or ""
            hit = builtins.get(f"<built-in method {mod}.{getattr(arg, '__name__', '')}>")
        else:
            return
        if hit and hit not in seen:
            seen.append(hit)

    old = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield seen
    finally:
        sys.setprofile(old)


@contextmanager
def shortcut_guard():
    """Record calls to library RMSNorms while the learner's code runs (yields a list of names,
    filled when the block ends).

    ``cProfile`` sees every Python and C call the block makes, so aliases (``from
    torch.nn.functional import rms_norm as f``) are caught too: what ran is named by its code
    object, or for a built-in by its own name. It is C: a kernel compile under it takes about
    as long as without (a Python profile hook doubled it). QuACK is caught by the file any
    executed code lives in: its norm modules (``quack/rmsnorm.py`` ...), not all of ``quack``:
    importing QuACK patches CuTe DSL process-wide (``quack.dsl``, ``quack.cute_dsl_utils``), so
    once a notebook has imported it to measure against, every kernel compile runs some QuACK
    code. Code that switches the profiler off is reported as a shortcut. Guards nest; a
    profiler that was on before (``cProfile`` around the grader) is paused, then resumed.
    """
    from . import sandbox

    if sandbox.locked():  # a learner process: its tripwires record what was reached
        seen: list[str] = []
        before = len(sandbox.incidents())
        try:
            yield seen
        finally:
            seen.extend(sandbox.reached(since=before))
        return
    codes, builtins = _forbidden_targets()
    seen = []
    outer = _GUARDS[-1] if _GUARDS else None
    before = None if outer is not None else sys.getprofile()
    if outer is not None:
        outer.disable()
    elif isinstance(before, cProfile.Profile):
        before.disable()
    prof = cProfile.Profile()
    try:
        prof.enable()
    except ValueError:  # Python 3.12+: another cProfile is on (a profiler around the grader)
        with _hook_guard(codes, builtins) as seen:
            yield seen
        return
    _GUARDS.append(prof)
    try:
        yield seen
    finally:
        switched_off = not _still_profiling(prof)
        try:
            prof.disable()
        except Exception:  # 3.12+: the block freed the profiler's sys.monitoring tool id
            if not switched_off:
                raise
        _GUARDS.pop()
        if outer is not None:
            outer.enable()
        elif isinstance(before, cProfile.Profile):
            before.enable()
        elif before is not None:
            sys.setprofile(before)
        seen.extend(_hits(prof, codes, builtins))
        if switched_off:
            seen.append(f"{_SWITCH} (the grader's view of the calls was switched off)")
