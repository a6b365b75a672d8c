"""What the whole-kernel exercises of lessons 02-04 share.

In ``02.warp_kernel``, ``03.block_kernel`` and ``04.cluster_kernel`` the learner writes a stage's
``@cute.kernel`` itself (the body, given the stage's named helpers: ``row_copy``,
``warp_reduce``, ``block_reduce``, ``cluster_exchange``, ``rstd``, ...). The grader puts it in
place of the stage's ``kernel`` on a subclass (``holes.kernel_hole``), so the stage's host side
tiles and launches it as it does its own, and then reads what the PTX can show:

* ``tensor_accesses``: which kernel argument (x, the weight, y) each global load and store
  addresses, found through the PTX's def-use chains back to the ``ld.param`` of that argument;
* ``probe_accesses``: x read once (one load per vector a thread holds), the weight read, y
  written once, all 16 bytes wide, and x's tile chosen by the CTA's index (``%ctaid``), and
  in a cluster by its rank too;

where ptxsim runs the stage (warp, block), it runs that PTX on the CPU and compares the values
with ``rmsnorm_ref`` (``sim_values``); and on a GPU (``mixed_values``) it compares values with
``rmsnorm_ref`` at ragged shapes in every dtype, with weights of another dtype than x (an fp32
weight beside bf16 x), the output poisoned before each launch. ``WholeKernel`` is the exercise
itself: a lesson states its kernel's hole, cases, probe, configs, hints and mutants, and
``WholeKernel(...).register()`` adds the checks every whole kernel gets, in the same order for
each.

Lesson 06's ``06.persistent_kernel`` is a ``WholeKernel`` on the block stage
(``lesson06_persistent``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

from ...ptxsim import SIMULATED_STAGES
from .. import hints
from ..checks import (
    EPS,
    HIDDEN_M,
    POISON,
    VISIBLE_M,
    KernelHole,
    Ptx,
    compiles,
    no_local_memory,
    not_launched,
    rmsnorm_inputs,
    stand_in,
    thread_guards,
)
from ..registry import COMPILE, GPU, TIERS, Check, CheckFailed, Exercise, mutants, register
from ..sim_values import sim_values

X, W, OUT = 0, 1, 2
_NAMES = {X: "x", W: "the weight", OUT: "y"}
ROWS_PAST_M = (
    "the last CTA's tile of rows runs past the end of the tensor (M is seldom a multiple of "
    "rows_per_cta), and its rows past M are loaded or stored anyway: reads and writes outside "
    "x and y. Guard the copies of x and y with the thread's row (its identity coordinate) < M"
)
COLS_PAST_N = (
    "the tile's columns run past N (N is not a multiple of the columns a tile covers), and the "
    "vectors past N are loaded or stored anyway: reads past the end of the row (the next row, "
    "or past the tensor) and writes outside y. Guard every copy of x, the weight and y with a "
    "column predicate, the column of each vector (its identity coordinate) < self.N: "
    "copy_utils.predicate_cols(...) and cute.copy(..., pred=...)"
)
SAME_WEIGHT_SLICE = (
    "every CTA of the cluster multiplies by the same slice of the weight: CTA rank r holds "
    "columns r * tile_cols ... of x, and needs the weight's columns there, so the weight's tile "
    "takes the rank as its column coordinate too"
)
FIXED_N = (
    "if your column predicate compares with a number you wrote (1000), that is it: the kernel "
    "is compiled for each row length, and the vectors past your number are never loaded; "
    "compare with self.N"
)
_PARAM = re.compile(r"_param_(\d+)(?:\+\d+)?\]")


#: what the whole-kernel exercises hand the learner from the library (``Exercise.given``): the
#: copy helpers (every public one), and in lesson 04 the reduction's buffer helpers. The
#: reductions that would stand in for the learner's own (cluster_reduce, row_reduce,
#: cluster_send) are not given.
GIVEN_COPY = {"quack_edu.primitives.copy": None}
#: every stage's finished kernel: a whole-kernel exercise's answer reaches none of them
#: (``Exercise.finished``: tripwires in the learner's process)
STAGE_KERNELS = tuple(
    f"quack_edu.stages.{stage}.kernel"
    for stage in (
        "naive.NaiveRMSNorm",
        "warp.WarpRMSNorm",
        "cluster.ClusterRMSNorm",
        "cpasync.CpAsyncRMSNorm",
        "final.FinalRMSNorm",
        "final_bwd.FinalBwdRMSNorm",
    )
)
GIVEN_COPY_REDUCE = {
    **GIVEN_COPY,
    "quack_edu.primitives.reduce": frozenset(
        {"ADD", "WARP", "combine_buffer", "warp_reduce", "block_reduce", "f32_bits"}
    ),
}


def _param_of(ptx: Ptx, ins) -> set[int]:
    out = set()
    for a in ptx.ancestors(ins):
        if a.opcode.startswith("ld.param"):
            m = _PARAM.search(a.text + "]") or _PARAM.search(a.text)
            if m:
                out.add(int(m.group(1)))
    return out


def tensor_accesses(ptx_text: str) -> dict:
    """{(ld|st, argument index): [instructions]} over the global loads and stores, each
    attributed to the kernel arguments its address derives from."""
    ptx = Ptx(ptx_text)
    out: dict = {}
    for ins in ptx.instrs:
        kind = "ld" if ins.opcode.startswith("ld.global") else None
        kind = kind or ("st" if ins.opcode.startswith("st.global") else None)
        if kind is None:
            continue
        for p in _param_of(ptx, ins) & {X, W, OUT}:
            out.setdefault((kind, p), []).append(ins)
    return out, ptx


def _words(ins) -> int:
    m = re.search(r"\.v(\d)", ins.opcode)
    return int(m.group(1)) if m else 1


def probe_accesses(
    rep,
    kernel,
    *,
    cluster: bool = False,
    hint_tile: str,
    hint_rank: str = "",
    hint_weight: str | None = None,
):
    """x read once and tiled by the CTA (and its rank in the cluster), the weight read, y
    written once; raises CheckFailed with a hint in the learner's terms (``hint_weight``: when
    the weight is not loaded, the exercise's own)."""
    t = kernel.tiling
    acc, ptx = tensor_accesses(rep.ptx)
    xb = kernel.dtype.width // 8
    wb = kernel.weight_dtype.width // 8
    x_loads = sum(_words(i) for i in acc.get(("ld", X), [])) * 4 // 16
    w_loads = sum(_words(i) for i in acc.get(("ld", W), [])) * 4 // 16
    y_stores = sum(_words(i) for i in acc.get(("st", OUT), [])) * 4 // 16
    want_w = t.vecs * t.chunks * wb // xb
    seen = f"{x_loads} x 16 B of x, {w_loads} of the weight, {y_stores} stores of y"
    where = f"N={kernel.N} {kernel.dtype.__name__}, {t.vecs} vectors per thread"
    if y_stores == 0 and acc.get(("st", X)):
        raise CheckFailed(
            f"{where}: y is never written, and x is",
            expected=f"{t.vecs} 16-byte stores of y per thread",
            seen=f"{len(acc[('st', X)])} stores into x's tensor, none into y's",
            hint="the output is stored into x's tensor: y's tile must be cut from y (mO), "
            "not from mX",
        )
    if y_stores == 0:
        raise CheckFailed(
            f"{where}: y is never written",
            expected=f"{t.vecs} 16-byte stores of y per thread",
            seen=seen,
            hint="the output is never stored: cute.copy the output fragment to y's tile "
            "(guarded by the row and column predicates)",
        )
    if x_loads > t.vecs:
        raise CheckFailed(
            f"{where}: x is loaded {x_loads} times per thread, for {t.vecs} vectors",
            expected=f"{t.vecs} loads of x (one per vector: the row stays in registers)",
            seen=seen,
            hint="x is read more than once: the row fits in registers, so load it once into a "
            "register fragment and use it for both the sum of squares and the output",
        )
    if x_loads < t.vecs:
        raise CheckFailed(
            f"{where}: {x_loads} loads of x for {t.vecs} vectors per thread",
            expected=f"{t.vecs}",
            seen=seen,
            hint="part of a thread's share of x is never loaded: copy the whole partitioned "
            "tile (all its vectors) into registers; " + FIXED_N,
        )
    if w_loads < want_w:
        raise CheckFailed(
            f"{where}: the weight is loaded {w_loads} times, for {want_w} 16-byte pieces",
            expected=f"{want_w} loads of the weight",
            seen=seen,
            hint=hint_weight
            or hints.NO_WEIGHT
            + ": load the weight's tile (broadcast over the CTA's rows) into a fragment of "
            "x's shape and multiply by it",
        )
    for kind, arg in (("st", OUT), ("ld", X)):
        bad = unguarded_by_rows(rep.ptx, kind, arg)
        if bad:
            what = "stores of y" if kind == "st" else "loads of x"
            raise CheckFailed(
                f"{where}: {len(bad)} {what} with no test of the row against M",
                expected=f"every {what[:-5]} inside `if row < M:` (or predicated on it)",
                seen=f"`{bad[0]}`",
                hint=ROWS_PAST_M,
            )
    _check_cols(rep, kernel, where)
    regs = ("%ctaid.x",)
    for ins in acc.get(("ld", X), []):
        chain = " ".join(a.text for a in ptx.ancestors(ins))
        if not any(r in chain for r in regs):
            raise CheckFailed(
                f"`{ins.text}`: the same rows for every CTA",
                expected="x's tile chosen by the CTA's index (block_idx)",
                seen="an address that does not depend on %ctaid.x",
                hint=hint_tile,
            )
        if cluster and not any(r in chain for r in ("%cluster_ctarank", "%ctaid.y")):
            raise CheckFailed(
                f"`{ins.text}`: the same columns in every CTA of the cluster",
                expected="x's tile chosen by the CTA's rank in the cluster (its slice)",
                seen="an address that does not depend on the rank",
                hint=hint_rank,
            )
    for ins in acc.get(("ld", W), []) if cluster else ():
        chain = " ".join(a.text for a in ptx.ancestors(ins))
        if not any(r in chain for r in ("%cluster_ctarank", "%ctaid.y")):
            raise CheckFailed(
                f"`{ins.text}`: the same slice of the weight in every CTA of the cluster",
                expected="the weight's tile chosen by the CTA's rank, as x's is",
                seen="a weight address that does not depend on the rank",
                hint=SAME_WEIGHT_SLICE,
            )
    return f"{seen}, all tiled by the CTA"


def shuffles_before(rep, opcode: str) -> tuple[int, bool]:
    """(lane shuffles, excluding ``shfl.sync.idx`` broadcasts, that come before the first
    ``opcode`` instruction in the PTX's order; whether there is one)."""
    n = 0
    for line in rep.instructions():
        parts = line.split()
        parts = parts[1:] if parts and parts[0].startswith("@") else parts
        op = parts[0].rstrip(";") if parts else ""
        if op.startswith(opcode):
            return n, True
        if op.startswith("shfl.sync") and not op.startswith("shfl.sync.idx"):
            n += 1
    return n, False


def warp_total_first(rep, kernel, opcode: str, what: str, hint: str) -> str:
    """The lanes of a warp are summed (log2 of the lanes per row, up to 32, shuffle rounds)
    before the first ``opcode`` (the step that takes one value per warp)."""
    width = min(kernel.config.threads_per_row, 32)
    want = width.bit_length() - 1
    n, found = shuffles_before(rep, opcode)
    if found and n < want:
        raise CheckFailed(
            f"{n} lane shuffles before the {what}, for {width} lanes per warp of a row",
            expected=f"{want} butterfly rounds (log2({width})) before the first {opcode}",
            seen=f"{n}",
            hint=hint,
        )
    return f"{n} shuffle rounds before the {what}"


NOT_ZEROED = (
    "the vectors the column predicate skips are never written in x's register fragment: they "
    "hold whatever those registers held, and their squares go into the row's sum. Fill the "
    "fragment with zeros (tXrX.fill(0)) before the predicated copy"
)


def unzeroed_loads(ptx_text: str) -> list[str]:
    """The column-guarded loads of x whose destination registers have no other definition: on
    the path that skips the load they are undefined (a fragment not filled before the copy)."""
    ptx = Ptx(ptx_text)
    good = set(guarded_by_cols(ptx_text, "ld", X)[0])
    # register -> the movs and cvts that copy, unpack (16-bit halves) or widen it: the zeros
    # may be set on any of these (the compiler moves them past the conversion to fp32)
    movs: dict[str, list] = {}
    for ins in ptx.instrs:
        if ins.opcode.startswith(("mov", "cvt")):
            for r in ins.srcs:
                movs.setdefault(r, []).append(ins)

    def zeroed(reg: str, depth: int = 0) -> bool:
        if len(ptx.defs.get(reg, [])) > 1:
            return True  # also set on the path that skips the load
        outs = [d for m in movs.get(reg, []) for d in m.dests]
        return depth < 4 and bool(outs) and all(zeroed(d, depth + 1) for d in outs)

    return [
        ins.text
        for ins in ptx.find("ld.global")
        if ins.text in good and not all(zeroed(d) for d in ins.dests)
    ]


def _check_cols(rep, kernel, where: str) -> None:
    """Where N is ragged, some load of x and of the weight and some store of y is guarded by a
    column test (``guarded_by_cols``), and the vectors of x it skips are zeros."""
    if kernel.tiling.even_cols:
        return
    for kind, arg in (("ld", X), ("ld", W), ("st", OUT)):
        good, bad = guarded_by_cols(rep.ptx, kind, arg)
        if bad and not good:
            what = f"{'loads' if kind == 'ld' else 'stores'} of {_NAMES[arg]}"
            raise CheckFailed(
                f"{where}: no column predicate on the {len(bad)} {what}",
                expected="the vectors past N skipped: a copy with pred= (a test of the column "
                f"against N = {kernel.N})",
                seen=f"`{bad[-1]}` with no test of its column",
                hint=COLS_PAST_N,
            )
    bad = unzeroed_loads(rep.ptx)
    if bad:
        raise CheckFailed(
            f"{where}: {len(bad)} predicated loads of x into registers that are not zeroed first",
            expected="the fragment's skipped vectors set to 0 (mov ..., 0 before the predicated "
            "load)",
            seen=f"`{bad[0]}`, its registers written nowhere else",
            hint=NOT_ZEROED,
        )


#: the store of y in the solutions of 02-04 (a mutant guards it further)
STORE_Y = "    if row < M:\n        cute.copy(copy_O, tXrO, tXgO, pred=tXpX)"

# BEGIN KEY
# fmt: off
#: mutants of every whole kernel, seen in its PTX (the compile tier) and refused a launch
COLUMN_MUTANTS = mutants(TIERS,
    ("no column predicates", "with a column predicate", [
        (", pred=tXpX)", ")"),
        (", pred=tWpW)", ")"),
    ]),
    ("the fragment of x not zeroed", "never written in x's register fragment",
     "    tXrX.fill(0)", "    pass"),
)
# fmt: on

# fmt: off
#: wrong values that compile to the right instructions: the gpu tier sees them, as known wrong
#: RMSNorms (``WHOLE_VARIANTS``), zeros or outputs never written; the compile tier too where
#: the stage's PTX is run on the CPU (``SIM_VALUE_MUTANTS``: the warp and block kernels).
VALUE_MUTANTS = mutants(GPU,
    ("rsqrt of the sum, not the mean", "the mean of squares is sum / N",
     "rstd = self.rstd(sum_sq, eps)", "rstd = cute.math.rsqrt(sum_sq + eps)"),
    ("sum of x, not of x * x", "you sum x, not x * x", "(x * x).reduce(", "x.reduce("),
    ("output multiplied by 0", "every output is 0",
     "y = x * rstd * tXrW.load().to(Float32)", "y = x * rstd * tXrW.load().to(Float32) * 0.0"),
    ("y = x * w, not normalised", "the row is never normalised",
     "y = x * rstd * tXrW.load().to(Float32)", "y = x * tXrW.load().to(Float32)"),
)
#: the same, and more wrong values the PTX cannot show, in both tiers where it is simulated
SIM_VALUE_MUTANTS = [dataclasses.replace(m, tiers=TIERS) for m in VALUE_MUTANTS] + mutants(TIERS,
    ("x * x + x * x summed", "the sum seen is about 2x the true one",
     "(x * x).reduce(", "(x * x + x * x).reduce("),
    ("the weight added to itself", "by the same factor in every row",
     "y = x * rstd * tXrW.load().to(Float32)",
     "y = x * rstd * (tXrW.load().to(Float32) + tXrW.load().to(Float32))"),
)
# fmt: on
# END KEY

#: known wrong RMSNorms a whole kernel can compute, checked against its wrong values
WHOLE_VARIANTS = (
    hints.SUM_NOT_MEAN_V,
    hints.NOT_SQUARED_V,
    hints.NOT_NORMALISED_V,
    hints.NO_WEIGHT_V,
)

#: (x dtype, weight dtype) pairs the values are checked in: every dtype, and weights kept in
#: fp32 beside 16-bit activations (a model in mixed precision)
VISIBLE_PAIRS = (("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "fp32"), ("bf16", "fp32"))
HIDDEN_PAIRS = VISIBLE_PAIRS + (("fp16", "fp32"), ("fp32", "bf16"))


def mixed_values(
    hole: KernelHole,
    *,
    Ns: Callable,
    config: Callable,
    name: str,
    hidden: bool = False,
    guard: Callable | None = None,
    variants=(),
    needs=("compiles",),
) -> Check:
    """Values of the learner's kernel against ``rmsnorm_ref`` (gpu tier) for each (x, weight)
    dtype pair, ``Ns(ctx, hidden)`` row lengths and M in 1/37/199 (hidden: 3/131/1029), with
    the config ``config(N, dtype)``; fresh inputs per seed, the output poisoned.
    ``guard(ctx, kernel, report)`` may raise CheckFailed to refuse a launch (a kernel that would
    hang); a kernel whose loads or stores are not guarded by the row count is never launched."""

    def fn(ctx):
        import torch

        from ...reference import TOLERANCES, rmsnorm_ref
        from ...runtime import torch_dtype
        from ..checks import describe_mismatch

        gen = ctx.torch_generator(salt="whole" + ("h" if hidden else ""))
        n = 0
        for N in Ns(ctx, hidden):
            for xd, wd in HIDDEN_PAIRS if hidden else VISIBLE_PAIRS:
                xdt, wdt = torch_dtype(xd), torch_dtype(wd)
                cfg = config(N, xdt)
                key = ("whole", hole, N, xd, wd, cfg)
                if key not in ctx.cache:  # judged from its report before it is launched
                    kernel, rep = whole_report(ctx, hole, N, xd, wd, cfg)
                    _refuse_out_of_bounds(rep, f"x {xd}, weight {wd}, N={N}", kernel)
                    if guard is not None:
                        guard(ctx, kernel, rep)
                    ctx.cache[key] = ctx.launcher(hole, N, xdt, cfg, wdt)[1]
                launch = ctx.cache[key]
                tol = TOLERANCES[xdt]
                # the most rows first: a wrong kernel's first failure then has rows at eps's
                # scale and far above it, which tell a scaled output from a wrong sum of
                # squares (at M = 1 both read as "the output doubled": hints.diagnose_rmsnorm)
                for M in sorted(HIDDEN_M if hidden else VISIBLE_M, reverse=True):
                    x, w = rmsnorm_inputs(M, N, xdt, gen)
                    w = w.to(wdt)
                    out = torch.full_like(x, POISON)
                    poison = out[0, 0].item()
                    launch(x, w, out, EPS)
                    torch.cuda.synchronize()
                    ref = rmsnorm_ref(x, w, eps=EPS)
                    if not bool(torch.isclose(out.float().cpu(), ref.float().cpu(), **tol).all()):
                        exp, got, nbad, row, col = describe_mismatch(out, ref, tol)
                        raise CheckFailed(
                            f"x {xd}, weight {wd}, M={M} N={N} (seed {ctx.seed}): {nbad} of "
                            f"{M * N} outputs differ from rmsnorm_ref",
                            expected=f"{exp} at row {row}, column {col}",
                            seen=got,
                            hint=hints.diagnose_rmsnorm(
                                out, ref, x, w, EPS, tol=tol, poison=poison, variants=variants
                            ),
                        )
                    n += 1
        return f"{n} shapes x dtype pairs match rmsnorm_ref"

    return Check(name, GPU, fn, hidden, tuple(needs))


def _refuse_out_of_bounds(rep, where: str, kernel=None) -> None:
    """A kernel that loads or stores rows past M (or, given the kernel, columns past a ragged
    N) is not launched: it would read or write outside x and y (another tensor's memory, or an
    illegal address that ends the process's CUDA context). Nor is one whose skipped vectors of
    x are undefined registers (no fill): its values would depend on what they held."""
    for kind, arg in (("st", OUT), ("ld", X)):
        bad = unguarded_by_rows(rep.ptx, kind, arg)
        if bad:
            raise CheckFailed(
                f"not launched ({where}): {len(bad)} global {kind} of "
                f"{'y' if arg == OUT else 'x'} with no test of the row against M",
                seen=f"`{bad[0]}`",
                hint=ROWS_PAST_M,
            )
    if kernel is not None:
        with not_launched():
            _check_cols(rep, kernel, where)


def ragged_Ns(visible: tuple, hidden_choices: tuple, k: int = 2) -> Callable:
    """``Ns(ctx, hidden)``: the visible row lengths, or ``k`` drawn with the grading seed."""

    def Ns(ctx, hidden):
        if not hidden:
            return list(visible)
        return ctx.rng("whole N").sample(list(hidden_choices), k)

    return Ns


def hidden_cases(hidden_choices: tuple, config=None) -> Callable:
    """``cases(ctx)`` of the hidden ``access_check``: a row length drawn from ``hidden_choices``
    with the grading seed, x fp16 with an fp32 weight and x fp32 with a bf16 weight."""

    def cases(ctx):
        n = ctx.rng("kernel N").choice(hidden_choices)
        return ((n, "fp16", "fp32", config), (n, "fp32", "bf16", config))

    return cases


def whole_report(ctx, hole: KernelHole, N: int, xd: str, wd: str, config):
    """(kernel, report) of the learner's kernel for x of ``xd`` and a weight of ``wd``, cached
    for the run (``ctx.report`` compiles with the weight in x's dtype only). The kernel is built
    here around a stand-in (for its tiling and launch shape); the learner's is compiled where
    the answer lives (``probes.compiled``)."""
    from ...runtime import torch_dtype
    from ..probes import compiled, hole_name, report_of

    if xd == wd:  # the kernel ctx.report compiles (and shares with the other checks)
        return ctx.kernel(hole, N, xd, config), ctx.report(hole, N, xd, config)
    key = ("whole report", hole, N, xd, wd, config)
    if key not in ctx.cache:
        kernel = hole.build(stand_in)(torch_dtype(xd), N, config, torch_dtype(wd))
        data = ctx.probe(compiled, hole_name(hole), N, xd, wd, config)
        ctx.cache[key] = (kernel, report_of(kernel, f"{hole.stage}+{ctx.exercise.id}", data))
    return ctx.cache[key]


def access_check(
    hole: KernelHole,
    cases: tuple,
    *,
    name: str,
    hint_tile: str,
    hint_rank: str = "",
    hint_weight: str | None = None,
    cluster: bool = False,
    extra: Callable | None = None,
    hidden: bool = False,
) -> Check:
    """``probe_accesses`` (and ``extra(rep, kernel)``) on the learner's kernel at each
    ``(N, x dtype, weight dtype, config)`` of ``cases`` (or ``cases(ctx)``; a config may be a
    callable of (N, dtype))."""
    from ...runtime import torch_dtype
    from ..checks import fail_on_error, your_kernel

    def fn(ctx):
        msgs = []
        for N, xd, wd, cfg in cases(ctx) if callable(cases) else cases:
            cfg = cfg(N, torch_dtype(xd)) if callable(cfg) else cfg
            with fail_on_error(
                f"{your_kernel(ctx, hole)} does not compile (x {xd}, weight {wd}, N={N})"
            ):
                kernel, rep = whole_report(ctx, hole, N, xd, wd, cfg)
            msgs.append(
                f"x {xd}/w {wd} N={N}: "
                + probe_accesses(
                    rep,
                    kernel,
                    cluster=cluster,
                    hint_tile=hint_tile,
                    hint_rank=hint_rank,
                    hint_weight=hint_weight,
                )
            )
            if extra is not None:
                m = extra(rep, kernel)
                if m:
                    msgs.append(str(m))
        return "; ".join(msgs)

    return Check(name, "compile", fn, hidden, ("compiles",))


# ---- the exercise -----------------------------------------------------------------------------
#: the hint when every CTA reads the same rows (02, 03: one CTA per block of rows)
SAME_ROWS = (
    "every CTA loads the same rows: the tile of x (and of y) must be chosen by the CTA's index "
    "(block_idx), so that CTA b works on the b-th block of rows_per_cta rows"
)


@dataclass(frozen=True)
class WholeKernel:
    """A whole-kernel exercise as its lesson states it; ``register()`` makes the ``Exercise``
    (2 compile and 2 gpu points, every stage's finished kernel off limits) with the checks
    every whole kernel gets, in this order:

    * compile tier: it compiles (bf16, fp32; N=1000); ``access_check`` at ``cases`` named
      ``access``, with the lesson's own probe ``extra``; the lesson's checks ``more``; where
      ptxsim runs the stage (warp, block, cluster, cpasync), the values at ``cases`` from the PTX
      run on the CPU in three orders, the reads of shared memory checked against the barriers
      that order them (``sim_values``, ``ordering_hint``); no local memory; hidden: the
      accesses again at a row length drawn from ``hidden_Ns``, x fp16 with an fp32 weight and
      x fp32 with a bf16 weight, and their values on the CPU;
    * gpu tier: ``mixed_values`` at row lengths ``Ns`` (hidden: two drawn from ``hidden_Ns``)
      named ``values`` and ``hidden_values``, and the lesson's ``speed`` check between them;
      each of the three through ``launch_guard`` (the lesson's refusal to launch a kernel that
      could hang) when there is one.

    ``config(N, dtype)`` is the values' config; ``compile_config`` the one compiled for the
    compile tier's checks (None: the stage's heuristic).
    """

    id: str
    lesson: str
    answer: str
    title: str
    mutants: list
    given: dict
    hole: KernelHole
    #: (N, x dtype, weight dtype, config) of the visible access check, and its name
    cases: tuple
    access: str
    extra: Callable
    Ns: tuple
    hidden_Ns: tuple
    config: Callable
    values: str
    speed: Check
    #: the exercise's finished pieces beyond every stage's kernel (its stage's row_sum)
    finished: tuple = ()
    timeout_hint: str | None = None
    hint_tile: str = SAME_ROWS
    hint_rank: str = ""
    cluster: bool = False
    compile_config: Callable | None = None
    more: tuple = ()
    variants: tuple = WHOLE_VARIANTS
    guard: Callable | None = None
    launch_guard: Callable | None = None
    hidden_values: str = "values at more shapes and dtype pairs, grading seed"
    #: the hint of a race the simulator finds (``sim_values``' ``RACE`` when None)
    ordering_hint: str | None = None
    #: the hint when the weight is never loaded (``hints.NO_WEIGHT`` when None)
    hint_weight: str | None = None

    def register(self) -> Exercise:
        ex = register(
            Exercise(
                id=self.id,
                finished=(*STAGE_KERNELS, *self.finished),
                given=self.given,
                lesson=self.lesson,
                answer=self.answer,
                title=self.title,
                points={COMPILE: 2, GPU: 2},
                timeout_hint=self.timeout_hint,
                mutants=self.mutants,
            )
        )
        return ex.add(self.compile_checks(), self.gpu_checks())

    def compile_checks(self) -> list[Check]:
        hole, cfg = self.hole, self.compile_config
        access = dict(
            hint_tile=self.hint_tile,
            hint_rank=self.hint_rank,
            hint_weight=self.hint_weight,
            cluster=self.cluster,
            extra=self.extra,
        )
        simulated = hole.stage in SIMULATED_STAGES
        sim = dict(report=whole_report, variants=self.variants, ordering_hint=self.ordering_hint)
        return [
            compiles(hole, N=1000, dtypes=("bf16", "fp32"), config=cfg),
            access_check(hole, self.cases, name=self.access, **access),
            *self.more,
            *([sim_values(hole, self.cases, **sim)] if simulated else []),
            no_local_memory(hole, config=cfg),
            access_check(
                hole,
                hidden_cases(self.hidden_Ns, cfg),
                name="the same at a random N, fp16/fp32 (grading seed)",
                hidden=True,
                **access,
            ),
            *(
                [
                    sim_values(
                        hole,
                        hidden_cases(self.hidden_Ns, cfg),
                        name="values on the CPU at that N, fp16/fp32 (grading seed)",
                        hidden=True,
                        **sim,
                    )
                ]
                if simulated
                else []
            ),
        ]

    def gpu_checks(self) -> list[Check]:
        def values(name: str, hidden: bool) -> Check:
            return mixed_values(
                self.hole,
                Ns=ragged_Ns(self.Ns, self.hidden_Ns),
                config=self.config,
                name=name,
                hidden=hidden,
                guard=self.guard,
                variants=self.variants,
            )

        checks = [values(self.values, False), self.speed, values(self.hidden_values, True)]
        return [self.launch_guard(c) for c in checks] if self.launch_guard else checks


def _guards(ptx_text: str, kind: str, arg: int, is_guard: Callable) -> tuple[list, list]:
    """(guarded, unguarded) instruction texts of the global ``kind`` ("ld"/"st") accesses of
    argument ``arg``: an access is guarded when it is predicated on, or inside a forward branch
    over, a predicate ``p`` with ``is_guard(ptx, p)`` (``ptx.thread_guards``' scan)."""
    ptx = Ptx(ptx_text)
    guards = thread_guards(ptx_text, guard=is_guard)
    good, bad = [], []
    op = f"{kind}.global"
    for k, ins in enumerate(ptx.instrs):
        if ins.opcode.startswith(op) and arg in _param_of(ptx, ins):
            (good if guards[k] else bad).append(ins.text)
    return good, bad


def _reads_shape(chain) -> bool:
    """Some instruction of ``chain`` loads a tensor's shape (a 32-bit kernel parameter of x or
    y: M)."""
    for a in chain:
        if a.opcode.startswith("ld.param.b32") or a.opcode.startswith("ld.param.u32"):
            m = _PARAM.search(a.text + "]") or _PARAM.search(a.text)
            if m and int(m.group(1)) in (X, OUT):
                return True
    return False


def shape_pred(ptx: Ptx, pred: str) -> bool:
    """``pred`` is computed from a tensor's shape (M)."""
    return any(
        _reads_shape([ptx.instrs[j], *ptx.ancestors(ptx.instrs[j])]) for j in ptx.defs.get(pred, [])
    )


def _column_pred(ptx: Ptx, pred: str) -> bool:
    """``pred`` holds a test of the thread's own index that does not involve M (a comparison of
    its column with N, a compile-time constant, so an immediate), alone or combined with the
    row test (``or.pred``)."""
    for j in ptx.defs.get(pred, []):
        for s in [ptx.instrs[j], *ptx.ancestors(ptx.instrs[j])]:
            if not s.opcode.startswith("setp"):
                continue
            chain = [s, *ptx.ancestors(s)]
            if any("%tid" in a.text for a in chain) and not _reads_shape(chain):
                return True
    return False


def unguarded_by_rows(ptx_text: str, kind: str, arg: int) -> list[str]:
    """The global ``kind`` ("ld"/"st") accesses of argument ``arg`` that no test of the row
    count guards: neither predicated on, nor inside a forward branch over, a predicate computed
    from a tensor's shape (``mX.shape[0]``, a 32-bit kernel parameter of x or y). A tile of
    rows_per_cta rows runs past M in the last CTA; such an access reads or writes past the end
    of the tensor."""
    return _guards(ptx_text, kind, arg, shape_pred)[1]


def guarded_by_cols(ptx_text: str, kind: str, arg: int) -> tuple[list[str], list[str]]:
    """(guarded, unguarded) global ``kind`` accesses of argument ``arg`` by a column test (a
    predicate from the thread's index, not from M). Where N is not a multiple of the columns
    a tile covers, the vectors past N must be skipped: some access of x, the weight and y is
    guarded."""
    return _guards(ptx_text, kind, arg, _column_pred)
