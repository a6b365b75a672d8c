"""The helpers exercises are built from: every exercise module imports its kit from here.

Checks, by tier (each a ``registry.Check`` whose ``fn(ctx)`` gets a ``context.Context``; the
runner is ``runner.run_exercise``):

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
* in any check (from ``context``): ``fail_on_error`` (an error of the learner's code, compiling
  or replaying it, fails the check with a hint), ``no_shortcuts`` (a call to a library RMSNorm
  fails it), ``not_launched`` (a guard's failure says the kernel was not launched), ``shared``
  (what an answer's checks compute once, a compiled kernel).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Real

from . import answer_key, hints
from .context import (  # noqa: F401  (re-exported: the exercises' kit)
    HIDDEN_M,
    HIDDEN_N,
    VISIBLE_M,
    VISIBLE_N,
    Context,
    answer_source,
    fail_on_error,
    not_launched,
    shared,
    your_kernel,
)
from .ptx import (  # noqa: F401  (re-exported: the exercises' probes import them from here)
    Ptx,
    PtxInstr,
    bounds,
    divergent_barriers,
    f32_hex,
    thread_guards,
    times_zero,
)
from .registry import COMPILE, GPU, Check, CheckFailed
from .speed import (  # noqa: F401  (re-exported: the exercises' speed checks use them)
    EPS,
    launch_speed,
    launch_time_us,
    speed_alone,
    speed_vs_copy,
)


# ---- compile tier: host functions -------------------------------------------------------------
def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v)


def _real(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _fmt_pair(expected, seen) -> tuple[str, str]:
    """Expected and seen as a failure prints them: 6 significant figures, and more where those
    read the same (an answer off in its seventh figure printed "1.05597" twice: issue 50)."""
    e, s = _fmt(expected), _fmt(seen)
    if e == s and _real(expected) and _real(seen) and float(expected) != float(seen):
        for digits in range(7, 18):
            e, s = f"{float(expected):.{digits}g}", f"{float(seen):.{digits}g}"
            if e != s:
                break
    return e, s


def _call_repr(name: str, args: tuple) -> str:
    def one(a):
        s = str(a)
        return s.replace("torch.", "") if s.startswith("torch.") else _fmt(a)

    return f"{name}({', '.join(one(a) for a in args)})"


def numbers_close(rel: float = 1e-6):
    """Equal within ``rel`` (relative); a value that is not finite equals only itself (inf is
    within any relative tolerance of anything: red team 6 scored full marks with it)."""

    def close(a, b):
        try:
            a, b = float(a), float(b)
        except (TypeError, ValueError):
            return False
        if not (math.isfinite(a) and math.isfinite(b)):
            return a == b
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
    diagnose: Callable | None = None,
    errors: Callable[[BaseException], str | None] | None = None,
) -> Check:
    """Call the answer on ``cases(ctx, hidden)`` and compare with ``reference(*case)``.

    On the first mismatch: if every case matches a known wrong variant, its hint; else
    ``diagnose(ctx, case, seen, expected)`` where the exercise has its own (None: no hint),
    else a ratio hint (``hints.diagnose_number``: bytes of a kernel's traffic, units).
    An answer that raises fails as the runner reports any error, unless ``errors(error)``
    knows the slip behind it: then the check fails with that hint (the error's type is
    matched by name, as the grader's worker rebuilds it: ``judge.LearnerError``).
    """
    close = close or numbers_close()
    keyless = isinstance(reference, answer_key.Removed)  # a student's copy: recorded values

    def expected_of(ctx, case):
        if keyless:
            return answer_key.as_recorded(
                answer_key.lookup(ctx.exercise.id, name, case)["expected"]
            )
        return reference(*case)

    def variant_of(ctx, var, case):
        if not isinstance(var.fn, answer_key.Removed):
            return var.fn(*case)
        got = answer_key.lookup(ctx.exercise.id, name, case)["variants"].get(var.name)
        if got is None:
            raise ValueError(f"variant {var.name} does not apply")
        return answer_key.as_recorded(got)

    def fn(ctx: Context):
        all_cases = list(cases(ctx, hidden))
        if answer_key.is_recording() and not keyless:  # quack-edu student --release
            for case in all_cases:
                wrong = {v.name: answer_key.variant_value(v, case) for v in variants}
                answer_key.record(ctx.exercise.id, name, case, reference(*case), wrong)
        seen_cache: dict[int, object] = {}

        def seen_of(i):
            if i not in seen_cache:
                try:
                    seen_cache[i] = ctx.call(*all_cases[i])
                except Exception as e:
                    hint = errors(e) if errors is not None else None
                    if hint is None:
                        raise
                    raise CheckFailed(
                        f"{_call_repr(ctx.exercise.answer, all_cases[i])} raised "
                        f"{hints.short_error(e)}",
                        hint=hint,
                    ) from None
            return seen_cache[i]

        for i, case in enumerate(all_cases):
            got, exp = seen_of(i), expected_of(ctx, case)
            if not close(got, exp):
                # a known wrong variant must match in every case, not just this one
                v = None
                for var in variants:
                    try:
                        if all(close(seen_of(j), variant_of(ctx, var, c))
                               for j, c in enumerate(all_cases)):  # fmt: skip
                            v = var
                            break
                    except (Exception, SystemExit) as e:
                        if isinstance(e, CheckFailed):
                            raise
                        continue
                if v:
                    hint = v.hint
                elif diagnose is not None:
                    hint = diagnose(ctx, case, got, exp)
                else:
                    hint = hints.diagnose_number(got, exp)
                expected, seen = _fmt_pair(exp, got)
                raise CheckFailed(
                    f"{_call_repr(ctx.exercise.answer, case)} is wrong",
                    expected=expected,
                    seen=seen,
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
    #: a lesson's variant of the stage's kernel to subclass instead (a key of the stage
    #: module's ``VARIANTS``, e.g. "atomic": ``final_bwd.FinalBwdAtomic``), or "" for the stage's
    variant: str = ""

    def build(self, answer):
        from ..stages import get_stage, kernel_class

        base = (
            get_stage(self.stage).VARIANTS[self.variant]
            if self.variant
            else kernel_class(self.stage)
        )
        if not hasattr(base, self.piece):
            raise AttributeError(f"{base.__name__} has no piece {self.piece!r} to override")
        method = self.adapt(answer)
        return type(
            f"Learner{base.__name__}",
            (base,),
            {self.piece: method, "__module__": __name__, **dict(self.attrs)},
        )

    def kernel(self, answer, N: int, dtype, config=None, wdtype=None):
        """The stage kernel with ``answer`` in the hole, for x of ``dtype`` and a weight of
        ``wdtype`` (default: x's); ``config`` None: the stage's heuristic."""
        from ..runtime import torch_dtype
        from ..stages import get_stage

        dtype = torch_dtype(dtype)
        wdtype = torch_dtype(wdtype) if wdtype is not None else dtype
        config = config if config is not None else get_stage(self.stage).default_config(N, dtype)
        return self.build(answer)(dtype, N, config, wdtype)


def stand_in(*args, **kwargs):
    """What the grader's own copy of a kernel holds in the hole (built for its tiling and launch
    shape, never compiled there: the learner's is compiled where the answer lives)."""
    raise RuntimeError("the grader's copy of the kernel is not compiled")


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
                what = f"{your_kernel(ctx, hole)} does not compile"
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


def describe_mismatch(out, ref, tol):
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
                        exp, seen, nbad, row, col = describe_mismatch(out, ref, tol)
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
