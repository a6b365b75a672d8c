"""Running an exercise's checks: ``run_exercise(ex, answer)``.

It runs every check of ``ex`` on the learner's ``answer`` and returns an ``ExerciseResult``. It
never raises for the learner's sake: a missing answer or one that still raises
``NotImplementedError`` is "not attempted"; an answer that is not a function, or cannot take
the stub's arguments, fails the first check at once and blocks the rest; any other exception
is that check's failure, with the exception named; a call to a library RMSNorm is a failure
that zeroes the exercise. The checks themselves are built from ``checks``; what they get is a
``context.Context``.
"""

from __future__ import annotations

import functools
import inspect as _inspect
import time
from collections.abc import Callable
from contextlib import contextmanager

from . import answer_key, hints
from .context import Context, is_not_implemented, scan_source, shortcut_words
from .registry import GPU, MISSING, Check, CheckFailed, Exercise, ShortcutUsed
from .report import BLOCKED, FAIL, NOT_ATTEMPTED, PASS, SKIP, CheckResult, ExerciseResult

#: the grader sets this to "1" in the environment of a notebook it runs
ENV_GRADING = "QUACK_EDU_GRADING"


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
    from .. import MODE

    gpu = MODE.gpu if gpu is None else gpu
    seed = answer_key.seed_for(seed)
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
        message, hint = shortcut_words(ex, shortcut)
        return first_fails("blocked by the shortcut", shortcut=True, hint=hint, message=message)

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


#: a GPU check that runs the GPU out of memory is run again this many times, after a pause:
#: the memory is another grading's or test's, on the same GPU (issue 49: same scores under load)
OOM_RETRIES = 3
OOM_PAUSE_S = 5.0


def _out_of_memory(e: BaseException) -> bool:
    while e is not None:
        if "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError":
            return True
        e = e.__cause__ or e.__context__
    return False


def _run_check(c: Check, ctx: Context):
    """``c.fn(ctx)``; a GPU check that ran out of GPU memory again, ``OOM_RETRIES`` times."""
    for attempt in range(OOM_RETRIES + 1):
        try:
            return c.fn(ctx)
        except (CheckFailed, ShortcutUsed):
            raise
        except Exception as e:
            if c.tier != GPU or attempt == OOM_RETRIES or not _out_of_memory(e):
                raise
            import torch

            torch.cuda.empty_cache()
            time.sleep(OOM_PAUSE_S * (attempt + 1))


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
            detail = _run_check(c, ctx)
        except ShortcutUsed as e:
            message, hint = shortcut_words(ex, e.what) if e.what else (e.message, e.hint)
            add(
                c,
                FAIL,
                message=message,
                hint=hint,
                shortcut=True,
                seconds=time.perf_counter() - t0,
            )
        except answer_key.KeyRemoved as e:  # a student's copy: the instructor grades this one
            add(
                c,
                SKIP,
                message=f"graded by your instructor ({e})",
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
