"""Running an exercise's checks, and the helpers exercises are built from.

``run_exercise(ex, answer)`` runs every check of ``ex`` on the learner's ``answer`` and returns
an ``ExerciseResult``. It never raises for the learner's sake: a missing answer or one that still
raises ``NotImplementedError`` is "not attempted"; any other exception is that check's failure,
with the exception named; a call to a library RMSNorm is a failure that zeroes the exercise.

Helpers, by tier:

* compile tier, host functions: ``value_check`` (cases against a reference, known wrong
  variants -> hints).
* compile tier, holes in a kernel: ``KernelHole`` says which piece of which stage kernel the
  answer fills; ``compiles``, ``ptx_probe``, ``ptx_count``, ``no_local_memory`` read what ptxas
  made of it. ``Ptx`` (module ``ptx``) is a small def-use view of PTX for probes such as "eps
  reaches the rsqrt".
* gpu tier: ``gpu_values`` (values against ``rmsnorm_ref`` on fresh random inputs at ragged
  shapes, all dtypes, poisoned outputs) and ``gpu_speed`` (GB/s against a fraction of the copy
  bandwidth measured with it, alone on the GPU, again if it fails: ``speed_alone``, for any
  timed callable; ``speed_vs_copy`` is the verdict on a time measured elsewhere).
* in any check: ``fail_on_error`` (an error of the learner's code, compiling or replaying it,
  fails the check with a hint), ``no_shortcuts`` (a call to a library RMSNorm fails it),
  ``not_launched`` (a guard's failure says the kernel was not launched), ``shared`` (what an
  answer's checks compute once, a compiled kernel).
"""

from __future__ import annotations

import functools
import inspect as _inspect
import io
import random
import re
import secrets
import time
import tokenize
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from . import hints
from .guard import _forbidden_targets, _hook_guard, shortcut_guard  # noqa: F401  (re-exported)
from .ptx import (  # noqa: F401  (re-exported: the exercises' probes import them from here)
    Ptx,
    PtxInstr,
    divergent_barriers,
    f32_hex,
    thread_guards,
    times_zero,
)
from .registry import COMPILE, GPU, MISSING, Check, CheckFailed, Exercise, ShortcutUsed
from .report import BLOCKED, FAIL, NOT_ATTEMPTED, PASS, SKIP, CheckResult, ExerciseResult
from .speed import (  # noqa: F401  (re-exported: the exercises' speed checks use them)
    EPS,
    launch_speed,
    launch_time_us,
    speed_alone,
    speed_vs_copy,
)

#: the grader sets this to "1" in the environment of a notebook it runs
ENV_GRADING = "QUACK_EDU_GRADING"

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


def shortcut_failure(what: str) -> ShortcutUsed:
    return ShortcutUsed(
        f"your answer calls {what} instead of computing RMSNorm itself", hint=hints.SHORTCUT
    )


# ---- the context a check runs in --------------------------------------------------------------
@dataclass
class Context:
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

    def hidden_N(self, hole: KernelHole | None = None, dtype="bf16") -> int:
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
    def kernel(self, hole: KernelHole, N: int, dtype, config=None, wdtype=None):
        """The learner's kernel for x of ``dtype`` and a weight of ``wdtype`` (default: x's)."""
        from ..runtime import torch_dtype
        from ..stages import get_stage

        dtype = torch_dtype(dtype)
        wdtype = torch_dtype(wdtype) if wdtype is not None else dtype
        module = get_stage(hole.stage)
        config = config if config is not None else module.default_config(N, dtype)
        return hole.build(self.answer)(dtype, N, config, wdtype)

    def report(self, hole: KernelHole, N: int, dtype="bf16", config=None, sass=False):
        """Compile the learner's kernel (cached per N, dtype, config) and report on it."""
        from ..tools.inspect import kernel_report

        def make():
            kernel = self.kernel(hole, N, dtype, config)
            stage = f"{hole.stage}+{self.exercise.id}"
            with no_shortcuts():
                return kernel_report(kernel, stage=stage, sass=sass)

        key = ("report", hole, N, _dtype_key(dtype), config, sass)
        if key not in self.cache:
            self.cache[key] = shared(self.answer, key, make)
        return self.cache[key]

    def launcher(self, hole: KernelHole, N: int, dtype, config=None, wdtype=None):
        """(kernel, a callable ``(x, w, out, eps)`` running the learner's kernel on the GPU)."""
        from ..runtime import compile_kernel

        def make():
            kernel = self.kernel(hole, N, dtype, config, wdtype)
            with no_shortcuts():
                return kernel, compile_kernel(kernel)

        wkey = _dtype_key(wdtype) if wdtype is not None else None
        key = ("launch", hole, N, _dtype_key(dtype), config, wkey)
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


def _dtype_key(dtype) -> str:
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


# ---- running an exercise ----------------------------------------------------------------------
def not_attempted_message(ex: Exercise, missing: bool) -> str:
    if missing:
        return (
            f"not attempted: no `{ex.answer}` is defined (write it in the exercise cell "
            f"'{ex.cell_id}')"
        )
    return (
        f"not attempted: `{ex.answer}` still raises NotImplementedError; replace "
        "`raise NotImplementedError()` with your code"
    )


def run_exercise(
    ex: Exercise,
    answer=MISSING,
    *,
    hidden: bool = False,
    seed: int | None = None,
    gpu: bool | None = None,
    context: type | None = None,
    stop_after: Callable | None = None,
) -> ExerciseResult:
    """Run the checks of ``ex`` on ``answer``; never raises for the learner's mistakes.
    ``context``: the ``Context`` class the checks get (``judge.JudgeContext`` when the answer
    lives in another process). ``stop_after(check_result)``: True ends the run there, the
    checks left reported as blocked (the mutant tests stop at the failure they look for)."""
    from .._env import MODE

    gpu = MODE.gpu if gpu is None else gpu
    seed = secrets.randbits(31) if seed is None else int(seed)
    res = ExerciseResult(
        ex.id, ex.title, ex.lesson, dict(ex.points), mode="gpu" if gpu else "compile-only"
    )
    checks = [c for c in ex.checks if hidden or not c.hidden]
    ctx = (context or Context)(ex, answer, hidden, seed)
    skip_msg = "needs a Hopper GPU" if not gpu else ""

    def add(c: Check, status: str, **kw):
        res.checks.append(CheckResult(c.name, c.tier, status, hidden=c.hidden, **kw))

    def all_but_run(checks, status: str, message: str) -> ExerciseResult:
        """The checks reported with ``status`` (the gpu ones skipped without a GPU)."""
        for c in checks:
            if c.tier == GPU and not gpu:
                add(c, SKIP, message=skip_msg)
            else:
                add(c, status, message=message)
        return res

    def first_fails(blocked: str, **failure) -> ExerciseResult:
        """The first check fails with ``failure``, the others are blocked (``blocked``)."""
        first, *rest = checks
        add(first, FAIL, **failure)
        return all_but_run(rest, BLOCKED, blocked)

    if answer is MISSING or answer is None:
        return all_but_run(checks, NOT_ATTEMPTED, not_attempted_message(ex, True))

    if not callable(answer):  # every exercise's answer is a function: say so at once
        return first_fails(
            "blocked: the answer is not a function",
            hint=f"pass the function the exercise's cell defines: check({ex.id!r}, {ex.answer})",
            message=f"the answer is not callable ({type(answer).__name__!r} object is not "
            f"callable): {ex.answer} must be a function",
        )

    wrong_args = _wrong_arguments(ex, answer)
    if wrong_args:  # at once, in Python's words: the checks would compile kernels first
        return first_fails(
            "blocked: the answer's parameters",
            hint=f"keep the parameters of the cell's def {ex.answer}(...): the checks call it "
            "with them",
            message=f"your {ex.answer} cannot be called as the exercise calls it{wrong_args}",
        )

    shortcut = scan_source(answer, allow=(ex.answer,))
    if shortcut:
        return first_fails(
            "blocked by the shortcut",
            shortcut=True,
            hint=hints.SHORTCUT,
            message=f"your answer calls {shortcut} instead of computing RMSNorm itself",
        )

    with _one_cpu_thread():
        _run_checks(ex, checks, ctx, res, add, gpu, skip_msg, stop_after)
    return res


def _stub_arity(ex: Exercise) -> int | None:
    """How many positional parameters without a default the student notebook's ``def`` of the
    answer has (what every check passes), or None when that cannot be read."""
    return _stub_arity_of(ex.lesson, ex.cell_id, ex.answer)


@functools.cache
def _stub_arity_of(lesson: str, cell_id: str, name: str) -> int | None:
    try:
        import ast

        from .nbfiles import find_cell, notebooks_dir, read

        src = find_cell(read(notebooks_dir() / f"{lesson}.ipynb"), cell_id).source
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef) and node.name == name:
                a = node.args
                return len(a.posonlyargs) + len(a.args) - len(a.defaults)
    except Exception:  # noqa: BLE001 (no notebook, a cell that does not parse: no check)
        return None
    return None


def _wrong_arguments(ex: Exercise, answer) -> str:
    """ " (TypeError: ...)" when ``answer`` cannot take the stub's required positional
    arguments (Python's words, from a call that fails before the answer's body runs); "" when
    it can, or when that cannot be known (not a plain function)."""
    import types

    if not isinstance(answer, types.FunctionType | types.MethodType):
        return ""  # (a judged answer's proxy, a class: the checks say what is wrong)
    n = _stub_arity(ex)
    if n is None:
        return ""
    try:
        sig = _inspect.signature(answer)
    except (TypeError, ValueError):
        return ""
    try:
        sig.bind(*[None] * n)
    except TypeError as e:
        try:
            answer(*[None] * n)  # raises before the body runs: the arguments do not bind
        except TypeError as call_error:
            return f" ({type(call_error).__name__}: {call_error})"
        except Exception:  # noqa: BLE001
            pass
        return f" (TypeError: {e})"
    return ""


@contextmanager
def _one_cpu_thread():
    """Checks use small CPU tensors: one intra-op thread is far faster than waking a pool (a
    40k-element op took 16 ms with 2 threads and 0.02 ms with 1 on a 2-core CI machine)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _run_checks(ex, checks, ctx, res, add, gpu, skip_msg, stop_after=None) -> None:
    passed: set[str] = set()
    not_attempted = False
    stopped = False
    for c in checks:
        if not stopped and stop_after is not None and res.checks:
            stopped = bool(stop_after(res.checks[-1]))
        if stopped:
            add(c, BLOCKED, message="not run: the run stopped at an earlier check")
            continue
        if c.tier == GPU and not gpu:
            add(c, SKIP, message=skip_msg)
            continue
        if not_attempted:
            add(c, NOT_ATTEMPTED, message=not_attempted_message(ex, False))
            continue
        if any(n not in passed for n in c.needs):
            add(c, BLOCKED, message=f"blocked: needs {', '.join(c.needs)}")
            continue
        t0 = time.perf_counter()
        try:
            detail = c.fn(ctx)
        except ShortcutUsed as e:
            add(
                c,
                FAIL,
                message=e.message,
                hint=e.hint,
                shortcut=True,
                seconds=time.perf_counter() - t0,
            )
        except CheckFailed as e:
            add(
                c,
                FAIL,
                message=e.message,
                expected=e.expected,
                seen=e.seen,
                hint=e.hint,
                seconds=time.perf_counter() - t0,
            )
        except KeyboardInterrupt:
            add(
                c,
                FAIL,
                message="interrupted (ran past the time limit?)",
                hint=hints.TIMEOUT,
                seconds=time.perf_counter() - t0,
            )
            raise
        except (Exception, SystemExit) as e:  # the learner's code raised: that is the failure
            if is_not_implemented(e):
                not_attempted = True
                add(c, NOT_ATTEMPTED, message=not_attempted_message(ex, False))
                continue
            add(
                c,
                FAIL,
                message=f"raised {hints.short_error(e)}",
                hint=hints.diagnose_compile_error(e),
                seconds=time.perf_counter() - t0,
            )
        else:
            passed.add(c.name)
            add(c, PASS, message=str(detail) if detail else "", seconds=time.perf_counter() - t0)
    if not_attempted:  # a check that ran before NotImplementedError surfaced does not count
        for r in res.checks:
            if r.status in (PASS, BLOCKED):
                r.status, r.message = NOT_ATTEMPTED, not_attempted_message(ex, False)


# ---- compile tier: host functions -------------------------------------------------------------
def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v)


def _call_repr(name: str, args: tuple) -> str:
    def one(a):
        s = str(a)
        return s.replace("torch.", "") if s.startswith("torch.") else _fmt(a)

    return f"{name}({', '.join(one(a) for a in args)})"


def numbers_close(rel: float = 1e-6):
    def close(a, b):
        try:
            a, b = float(a), float(b)
        except (TypeError, ValueError):
            return False
        return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)

    return close


def value_check(
    name: str,
    reference: Callable,
    cases: Callable[[Context, bool], Sequence[tuple]],
    *,
    variants: Sequence[hints.Variant] = (),
    close: Callable = None,
    hidden: bool = False,
    tier: str = COMPILE,
) -> Check:
    """Call the answer on ``cases(ctx, hidden)`` and compare with ``reference(*case)``.

    On the first mismatch: if every case matches a known wrong variant, its hint; else a ratio
    hint (``hints.diagnose_number``).
    """
    close = close or numbers_close()

    def fn(ctx: Context):
        all_cases = list(cases(ctx, hidden))
        seen_cache: dict[int, object] = {}

        def seen_of(i):
            if i not in seen_cache:
                seen_cache[i] = ctx.call(*all_cases[i])
            return seen_cache[i]

        for i, case in enumerate(all_cases):
            got, exp = seen_of(i), reference(*case)
            if not close(got, exp):
                # a known wrong variant must match in every case, not just this one
                v = None
                for var in variants:
                    try:
                        if all(close(seen_of(j), var.fn(*c)) for j, c in enumerate(all_cases)):
                            v = var
                            break
                    except (Exception, SystemExit) as e:
                        if isinstance(e, CheckFailed):
                            raise
                        continue
                hint = v.hint if v else hints.diagnose_number(got, exp)
                raise CheckFailed(
                    f"{_call_repr(ctx.exercise.answer, case)} is wrong",
                    expected=_fmt(exp),
                    seen=_fmt(got),
                    hint=hint,
                )
        return f"{len(all_cases)} cases"

    return Check(name, tier, fn, hidden)


# ---- compile tier: holes in a kernel ----------------------------------------------------------
@dataclass(frozen=True)
class KernelHole:
    """Which piece of which stage kernel the learner's answer fills.

    ``adapt(answer)`` returns the method that replaces ``piece`` on a subclass of the stage's
    kernel class, e.g. ``lambda answer: lambda self, sum_sq, eps: answer(sum_sq, eps, self.N)``.
    The real kernel is then compiled (and on a GPU, launched) around the learner's code.
    """

    stage: str
    piece: str
    adapt: Callable = field(compare=False)
    #: (name, value) class attributes set on the subclass too, e.g. (("seq_rows", 1),): the
    #: cluster kernel with one row block per CTA, so its PTX holds one exchange to judge
    attrs: tuple = ()

    def build(self, answer):
        from ..stages import kernel_class

        base = kernel_class(self.stage)
        if not hasattr(base, self.piece):
            raise AttributeError(f"{base.__name__} has no piece {self.piece!r} to override")
        method = self.adapt(answer)
        return type(
            f"Learner{base.__name__}",
            (base,),
            {self.piece: method, "__module__": __name__, **dict(self.attrs)},
        )


def _config(config: Callable | None, N: int, dtype):
    """``config(N, dtype)`` with dtype as a torch dtype, or None (the stage's heuristic)."""
    if config is None:
        return None
    from ..runtime import torch_dtype

    return config(N, torch_dtype(dtype))


def compiles(
    hole: KernelHole,
    N: int = 1000,
    dtypes=("bf16",),
    name: str | None = None,
    hidden: bool = False,
    config: Callable | None = None,
) -> Check:
    """The learner's kernel compiles for sm_90a (ptxas included) for each dtype. Named
    "compiles" (hidden: "compiles at a random N"), the name other checks ``need``.
    ``config(N, dtype)`` (optional) forces a config, e.g. a cluster where the heuristic would
    pick none at this N (as ``gpu_values`` does)."""

    def fn(ctx: Context):
        out = []
        for dt in dtypes:
            for n in [ctx.hidden_N(hole, dt)] if hidden else [N]:
                what = f"the {hole.stage} kernel with your {hole.piece} does not compile"
                with fail_on_error(f"{what} ({dt}, N={n})"):
                    rep = ctx.report(hole, n, dt, _config(config, n, dt))
                if rep.target != "sm_90a":
                    raise CheckFailed(
                        "compiled for the wrong GPU",
                        expected=".target sm_90a",
                        seen=f".target {rep.target}",
                        hint="import quack_edu before cutlass (it pins the DSL's target to "
                        "sm_90a when no Hopper GPU is present), then restart the kernel",
                    )
                out.append(f"{dt} N={n}: {rep.registers} regs")
        return "; ".join(out)

    return Check(name or ("compiles at a random N" if hidden else "compiles"), COMPILE, fn, hidden)


def ptx_probe(
    hole: KernelHole,
    name: str,
    probe: Callable,
    *,
    N: int = 1000,
    dtypes=("bf16",),
    hidden: bool = False,
    needs=("compiles",),
    sass: bool = False,
    config: Callable | None = None,
) -> Check:
    """``probe(report, ctx)`` looks at the compiled learner kernel and raises CheckFailed.
    ``config(N, dtype)``: as in ``compiles``."""

    def fn(ctx: Context):
        msgs = []
        for dt in dtypes:
            for n in [ctx.hidden_N(hole, dt)] if hidden else [N]:
                rep = ctx.report(hole, n, dt, _config(config, n, dt), sass=sass)
                m = probe(rep, ctx)
                if m:
                    msgs.append(str(m))
        return "; ".join(dict.fromkeys(msgs))

    return Check(name, COMPILE, fn, hidden, tuple(needs))


def ptx_count(
    hole: KernelHole,
    pattern: str,
    expected: int | tuple[int, int],
    *,
    hint: str,
    what: str | None = None,
    **kw,
) -> Check:
    """The PTX has ``expected`` instructions containing ``pattern`` (an int or a (lo, hi) range)."""
    lo, hi = (expected, expected) if isinstance(expected, int) else expected

    def probe(rep, ctx):
        n = rep.count(pattern)
        if not lo <= n <= hi:
            want = f"{lo}" if lo == hi else f"{lo}..{hi}"
            raise CheckFailed(
                f"{what or pattern}: {n} in the PTX",
                expected=f"{want} `{pattern}`",
                seen=f"{n}",
                hint=hint,
            )
        return f"{n} `{pattern}`"

    return ptx_probe(hole, what or f"{expected} `{pattern}` in the PTX", probe, **kw)


def no_local_memory(hole: KernelHole, **kw) -> Check:
    """ptxas reports no stack frame and no spills (judged on the cubin, not on PTX ld.local)."""

    def probe(rep, ctx):
        if rep.stack_bytes or rep.spill_bytes:
            raise CheckFailed(
                "the kernel uses local memory",
                expected="0 bytes stack frame, 0 bytes spills",
                seen=f"{rep.stack_bytes} B stack, {rep.spill_bytes} B spills, {rep.registers} regs",
                hint="a per-thread array indexed by a runtime value, or too many live values: "
                "local memory is as slow as global memory",
            )
        return f"{rep.registers} registers, no spills"

    return ptx_probe(hole, "no local memory (stack, spills)", probe, **kw)


# ---- gpu tier ---------------------------------------------------------------------------------
POISON = 4242.0


def rmsnorm_inputs(M: int, N: int, dtype, gen, device="cuda"):
    """x with rows at very different scales (tiny rows make eps matter; a zero row when M > 2),
    and a weight near 1. Returns (x, w)."""
    import torch

    x = torch.randn(M, N, generator=gen, device="cpu")
    scale = 2.0 ** torch.randint(-12, 6, (M, 1), generator=gen).float()
    x = x * scale
    if M > 2:
        x[1] = 0.0
    w = 1.0 + 0.5 * torch.randn(N, generator=gen)
    return x.to(device=device, dtype=dtype), w.to(device=device, dtype=dtype)


def _describe_mismatch(out, ref, tol):
    import torch

    o, r = out.float().cpu(), ref.float().cpu()
    err = (o - r).abs()
    err = torch.where(torch.isnan(err), torch.full_like(err, float("inf")), err)
    bad = ~(torch.isclose(o, r, **tol))
    nbad = int(bad.sum())
    idx = int(err.flatten().argmax())
    row, col = divmod(idx, o.shape[-1])
    return f"{r[row, col].item():.6g}", f"{o[row, col].item():.6g}", nbad, row, col


def gpu_values(
    hole: KernelHole,
    *,
    name: str | None = None,
    hidden: bool = False,
    dtypes=("bf16", "fp16", "fp32"),
    variants: Sequence[hints.Variant] = (),
    tile_cols: Callable | None = None,
    config: Callable | None = None,
    baseline: Callable | None = None,
    baseline_hint: str | None = None,
    needs=("compiles",),
) -> Check:
    """Values of the learner's kernel against ``rmsnorm_ref`` (gpu tier).

    Fresh random inputs (the seed changes every run; the grading seed when grading), rows at
    very different scales and a zero row, the output poisoned before the launch, ragged shapes
    (M in {1, 37, 199}, N=1000; hidden: bigger M and a random ragged N) and every dtype.
    ``tile_cols(N, dtype)`` (optional) lets the tail-column hint name the tile boundary;
    ``config(N, dtype)`` forces a config. With ``baseline(N, dtype)`` (another config, e.g.
    ``cluster_n=1`` when ``config`` has ``cluster_n=4``), a failure is re-run on the baseline
    config and, if that one is right, reported with ``baseline_hint`` (e.g. hints.CLUSTER_SYNC:
    wrong only with a cluster means the cluster exchange is wrong).
    """

    def fn(ctx: Context):
        import torch

        from ..reference import TOLERANCES, rmsnorm_ref
        from ..runtime import check_inputs, torch_dtype

        Ms = HIDDEN_M if hidden else VISIBLE_M
        gen = ctx.torch_generator(salt="values" + ("h" if hidden else ""))
        n = 0
        for dt in dtypes:
            dtype = torch_dtype(dt)
            tol = TOLERANCES[dtype]
            for N in [ctx.hidden_N(hole, dt)] if hidden else list(VISIBLE_N):
                cfg = config(N, dtype) if config else None
                kernel, launch = ctx.launcher(hole, N, dtype, cfg)
                for M in Ms:
                    x, w = rmsnorm_inputs(M, N, dtype, gen)
                    check_inputs(
                        x,
                        w,
                        stage=hole.stage,
                        row_align=kernel.row_align,
                        max_N=kernel.max_N_for(dtype),
                    )
                    out = torch.full_like(x, POISON)
                    poison = out[0, 0].item()
                    launch(x, w, out, EPS)
                    torch.cuda.synchronize()
                    ref = rmsnorm_ref(x, w, eps=EPS)
                    o = out.float().cpu()
                    ok = bool(torch.isclose(o, ref.float().cpu(), **tol).all())
                    if not ok:
                        exp, seen, nbad, row, col = _describe_mismatch(out, ref, tol)
                        hint = hints.diagnose_rmsnorm(
                            out,
                            ref,
                            x,
                            w,
                            EPS,
                            tol=tol,
                            poison=poison,
                            variants=variants,
                            tile_cols=tile_cols(N, dtype) if tile_cols else None,
                        )
                        if baseline is not None and _right_with(
                            ctx, hole, baseline(N, dtype), x, w, ref, tol
                        ):
                            hint = baseline_hint or hint
                        raise CheckFailed(
                            f"{dt} M={M} N={N} (seed {ctx.seed}): {nbad} of {M * N} outputs differ "
                            f"from rmsnorm_ref beyond atol=rtol={tol['rtol']:g}",
                            expected=f"{exp} at row {row}, column {col}",
                            seen=seen,
                            hint=hint,
                        )
                    n += 1
        return f"{n} shapes x dtypes match rmsnorm_ref"

    default = "values vs rmsnorm_ref" + (
        ", more shapes, grading seed" if hidden else " (M in 1/37/199, N=1000, 3 dtypes)"
    )
    return Check(name or default, GPU, fn, hidden, tuple(needs))


def _right_with(ctx: Context, hole: KernelHole, cfg, x, w, ref, tol) -> bool:
    """Whether the learner's kernel is right on these inputs with another config."""
    import torch

    _, launch = ctx.launcher(hole, x.shape[-1], x.dtype, cfg)
    out = torch.full_like(x, POISON)
    launch(x, w, out, EPS)
    torch.cuda.synchronize()
    return bool(torch.isclose(out.float().cpu(), ref.float().cpu(), **tol).all())


def gpu_speed(
    hole: KernelHole,
    *,
    fraction: float,
    M: int = 32768,
    N: int = 4096,
    dtype="bf16",
    name: str | None = None,
    hidden: bool = False,
    needs=("compiles",),
) -> Check:
    """GB/s of the learner's kernel at (M, N) against ``fraction`` of the copy bandwidth
    measured with it, on this machine (never a fixed number): ``launch_speed``."""

    def fn(ctx: Context):
        import torch

        from ..runtime import torch_dtype

        dt = torch_dtype(dtype)
        kernel, launch = ctx.launcher(hole, N, dt)
        gen = ctx.torch_generator(salt="speed")
        x, w = rmsnorm_inputs(M, N, dt, gen)
        return launch_speed(launch, x, w, torch.empty_like(x), fraction, f"{M}x{N} {dtype}")

    return Check(
        name or f"speed >= {100 * fraction:.0f}% of copy bandwidth ({M}x{N} {dtype})",
        GPU,
        fn,
        hidden,
        tuple(needs),
    )
