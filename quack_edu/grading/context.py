"""What a check runs in: the ``Context`` it gets, and the guards around the learner's code.

A check is a function ``fn(ctx)`` (``registry.Check``). ``ctx`` is a ``Context``: the exercise,
the learner's answer, whether the hidden cases run, the seed, and the learner's kernel compiled,
reported on (PTX, registers) and launched for a hole, each once per answer (``shared``: a check
cell's visible and hidden runs share the kernels). Around the learner's code:

* ``no_shortcuts`` (a call to a library RMSNorm fails the check), with ``scan_source`` (the same,
  read from the answer's source before anything runs);
* ``fail_on_error`` (an error of the learner's code, compiling or replaying it, fails the check
  with a hint) and ``not_launched`` (a guard's failure says the kernel was not launched);
* ``is_not_implemented`` (a blank's ``NotImplementedError``, however wrapped: not attempted).

The shapes every check draws from (``VISIBLE_M`` ... ``HIDDEN_N``) are here too.
"""

from __future__ import annotations

import inspect as _inspect
import io
import random
import re
import tokenize
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

from . import hints
from .guard import shortcut_guard
from .registry import CheckFailed, Exercise, ShortcutUsed

#: the shapes every gpu-tier value check runs (M ragged; N not a power of two)
VISIBLE_M = (1, 37, 199)
VISIBLE_N = (1000,)
#: ragged row lengths the hidden checks draw from with the grading seed
HIDDEN_N = (773, 1531, 2047, 3001, 4093, 5119, 6143)
HIDDEN_M = (3, 131, 1029)


def is_not_implemented(exc: BaseException | None) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NotImplementedError) or "NotImplementedError" in str(exc)[:2000]:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def plain_call(answer, nargs: int) -> str:
    """What calling ``answer`` as plain Python with ``nargs`` Nones does when that fails, in
    Python's own words (" (TypeError: 'int' object is not callable)", the wrong arguments, the
    answer's own exception); "" when it returns. For exercises whose answer is compiled into a
    kernel: a bad answer is reported as every other exercise reports it. A blank's
    NotImplementedError passes through (not attempted)."""
    try:
        answer(*[None] * nargs)
    except Exception as e:
        if is_not_implemented(e):
            raise
        return f" ({type(e).__name__}: {e})"
    return ""


# ---- anti-shortcut ----------------------------------------------------------------------------
_FORBIDDEN_NAMES = {
    "rms_norm": "torch's rms_norm",
    "RMSNorm": "an RMSNorm module",
    "rmsnorm_ref": "quack_edu's reference rmsnorm_ref",
    "rstd_ref": "quack_edu's reference rstd_ref",
    "rmsnorm_fwd": "a finished quack_edu kernel (rmsnorm_fwd)",
    "quack": "QuACK (the quack package)",
}


def _names_in(source: str) -> set[str]:
    names = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NAME:
                names.add(tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        names.update(re.findall(r"[A-Za-z_]\w*", source))
    return names


def answer_source(answer) -> str | None:
    judged = getattr(answer, "_judge_source", None)  # judge.RemoteAnswer: the answer cell
    if isinstance(judged, str):
        return judged
    try:
        return _inspect.getsource(_inspect.unwrap(answer))
    except (TypeError, OSError, ValueError):
        return None


def scan_source(answer, allow=()) -> str | None:
    """The first library RMSNorm the answer's source names (comments and strings excluded;
    ``allow``: names the exercise itself asks for, e.g. an answer called ``rmsnorm_fwd``)."""
    src = answer_source(answer)
    if not src:
        return None
    own = {getattr(answer, "__name__", None), *allow}
    found = (_names_in(src) - own) & set(_FORBIDDEN_NAMES)
    return _FORBIDDEN_NAMES[sorted(found)[0]] if found else None


def shortcut_words(ex: Exercise | None, what: str) -> tuple[str, str]:
    """(message, hint) of an answer that calls ``what``, a library RMSNorm, in the words of its
    exercise (``Exercise.shortcut``)."""
    instead, why = (ex.shortcut if ex is not None else None) or (
        "computing RMSNorm itself",
        hints.SHORTCUT,
    )
    return f"your answer calls {what} instead of {instead}", why


def shortcut_failure(what: str, ex: Exercise | None = None) -> ShortcutUsed:
    message, hint = shortcut_words(ex, what)
    e = ShortcutUsed(message, hint=hint)
    e.what = what
    return e


# ---- the context a check runs in --------------------------------------------------------------
@dataclass
class Context:
    """What a check's ``fn(ctx)`` gets: the exercise, the learner's answer, the seed, and the
    learner's kernel compiled, reported on and launched for a ``hole`` (a ``checks.KernelHole``)
    once per answer."""

    exercise: Exercise
    answer: object
    hidden: bool
    seed: int
    cache: dict = field(default_factory=dict)

    def rng(self, salt: str = "") -> random.Random:
        return random.Random(f"{self.seed}:{self.exercise.id}:{salt}")

    def torch_generator(self, device="cpu", salt: str = ""):
        import torch

        g = torch.Generator(device=device)
        g.manual_seed(self.rng(salt).getrandbits(62))
        return g

    def hidden_N(self, hole=None, dtype="bf16") -> int:
        """A ragged row length drawn with the seed, fit for the stage (its row alignment and
        largest N) when ``hole`` is given."""
        n = self.rng("N").choice(HIDDEN_N)
        if hole is None:
            return n
        from ..runtime import torch_dtype
        from ..stages import kernel_class

        cls = kernel_class(hole.stage)
        align = cls.row_align_for(torch_dtype(dtype))
        top = cls.max_N_for(torch_dtype(dtype))
        if top is not None:
            n = min(n, top)
        return max(align, n - n % align)

    def call(self, *args, **kwargs):
        """Call the learner's answer, watching for library RMSNorms."""
        with no_shortcuts():
            return self.answer(*args, **kwargs)

    # kernels --------------------------------------------------------------------------------
    def kernel(self, hole, N: int, dtype, config=None, wdtype=None):
        """The learner's kernel for x of ``dtype`` and a weight of ``wdtype`` (default: x's)."""
        return hole.kernel(self.answer, N, dtype, config, wdtype)

    def report(self, hole, N: int, dtype="bf16", config=None, sass=False):
        """Compile the learner's kernel (cached per N, dtype, config) and report on it."""
        from ..tools.inspect import kernel_report

        def make():
            kernel = self.kernel(hole, N, dtype, config)
            stage = f"{hole.stage}+{self.exercise.id}"
            with no_shortcuts():
                return kernel_report(kernel, stage=stage, sass=sass)

        key = ("report", hole, N, dtype_key(dtype), config, sass)
        if key not in self.cache:
            self.cache[key] = shared(self.answer, key, make)
        return self.cache[key]

    def launcher(self, hole, N: int, dtype, config=None, wdtype=None):
        """(kernel, a callable ``(x, w, out, eps)`` running the learner's kernel on the GPU)."""
        from ..runtime import compile_kernel

        def make():
            kernel = self.kernel(hole, N, dtype, config, wdtype)
            with no_shortcuts():
                return kernel, compile_kernel(kernel)

        wkey = dtype_key(wdtype) if wdtype is not None else None
        key = ("launch", hole, N, dtype_key(dtype), config, wkey)
        if key not in self.cache:
            self.cache[key] = shared(self.answer, key, make)
        return self.cache[key]

    def probe(self, fn: Callable, *args):
        """``fn(answer, *args)``: what a check needs to learn from the answer by running or
        tracing it (a compiled kernel's PTX, a layout's coordinates), as plain data. ``fn`` is
        a module-level function of a module that holds no secret (``holes``, ``probes``):
        while grading it runs in the learner's process (``judge.JudgeContext.probe``) and only
        its data comes back; the check decides from the data, here."""
        with no_shortcuts():
            return fn(self.answer, *args)


#: Kernels compiled for an answer, shared by the runs of the same answer object (a check cell
#: runs ``check`` and then ``check(..., hidden=True)``: the same kernels, compiled once). Keyed
#: by the answer's id; the entry keeps the answer alive, so an id is never reused while cached.
_SHARED: dict = {}
_SHARED_MAX = 48


def dtype_key(dtype) -> str:
    from ..runtime import torch_dtype

    try:
        return str(torch_dtype(dtype))
    except (TypeError, ValueError):
        return str(dtype)


def _shared_get(answer, key):
    entry = _SHARED.get((id(answer), key))
    if entry is None or entry[0] is not answer:
        return None
    return entry[1]


def _shared_put(answer, key, value) -> None:
    if len(_SHARED) >= _SHARED_MAX:
        _SHARED.pop(next(iter(_SHARED)))
    _SHARED[(id(answer), key)] = (answer, value)


def shared(answer, key, make: Callable):
    """What ``make()`` returns, kept for the answer object under ``key`` (``_SHARED``): the
    runs of one answer compile a kernel once."""
    value = _shared_get(answer, key)
    if value is None:
        value = make()
        _shared_put(answer, key, value)
    return value


@contextmanager
def no_shortcuts():
    """Inside, the learner's code is watched for library RMSNorms: a call to one fails the
    check (``ShortcutUsed``) once the block is done."""
    with shortcut_guard() as seen:
        yield
    if seen:
        raise shortcut_failure(seen[0])


@contextmanager
def not_launched():
    """Inside, a ``CheckFailed`` is a guard's reason not to launch the learner's kernel: its
    message is prefixed with "not launched: "."""
    try:
        yield
    except CheckFailed as e:
        e.message = f"not launched: {e.message}"
        raise


def your_kernel(ctx, hole) -> str:
    """What a compile error names: "your persistent_kernel" for a whole kernel (the answer's
    own name, whatever stage it is built on), "the warp kernel with your row_copy" for a
    piece."""
    ex = getattr(ctx, "exercise", None)
    if hole.piece == "kernel" and ex is not None:
        return f"your {ex.answer}"
    return f"the {hole.stage} kernel with your {hole.piece}"


@contextmanager
def fail_on_error(what: str, hint: str | None = None, detail: Callable | None = None):
    """Inside, an error of the learner's code (compiling their kernel, replaying it) fails the
    check with ``"{what}: {detail(error)}"`` (default: the error in short) and ``hint``
    (default: the hint a compile error's message suggests). A ``CheckFailed`` and a blank's
    ``NotImplementedError`` pass through."""
    try:
        yield
    except (CheckFailed, NotImplementedError):
        raise
    except Exception as e:
        if is_not_implemented(e):
            raise
        raise CheckFailed(
            f"{what}: {hints.short_error(e, 400) if detail is None else detail(e)}",
            hint=hints.diagnose_compile_error(e) if hint is None else hint,
        ) from None
