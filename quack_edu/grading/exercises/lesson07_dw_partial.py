"""Lesson 07, the backward: the persistent CTA's dw partials (07.dw_partial).

07.dw_partial's compile tier reads the PTX of the backward built with x bf16, dout fp16 and an
fp32 weight at a short row (8 rows a CTA) and a long one (one row a CTA): every barrier reached
by every thread; no atomics (any memory); the partial stores (those not packed back to bf16, as
dx is) built from x and dout, through a sum carried around the row-block loop, never multiplied
by 0; with several rows, the drain (wait_group 0) and a barrier before the accumulators overwrite
the tiles, one before row 0 reads the other rows, exactly rows - 1 rows read, the stores under a
branch on the thread's row and, at a ragged N, some under a column test. Its gpu tier runs the
kernel twice on NaN-poisoned partial buffers with one poisoned row after them: dw against
``rmsnorm_bwd_ref`` (M=20000 gives each CTA several row blocks), nothing written past the last
row and the two runs bitwise equal; an answer with a divergent barrier is not launched. Without
a GPU its values are checked too: the same PTX run on the CPU (``ptxsim``, two persistent CTAs
walking the row blocks of a few rows), dw against ``rmsnorm_bwd_ref`` (``_dw_sim_values``).

The kernel is compiled, launched and timed where the answer lives (``probes.lesson07``: the two
functions of the cell are found there, through the answer's globals); the checks decide here
from its PTX, its partial buffers and its time, with the tiling of the grader's own copy of the
kernel (built around stand-ins, never compiled).
"""

from __future__ import annotations

import math

from ..checks import (
    CheckFailed,
    Ptx,
    divergent_barriers,
    fail_on_error,
    speed_vs_copy,
    stand_in,
    thread_guards,
    times_zero,
)

# the backward stage's hole: its row alignment and largest N for hidden_N
from ..holes import RED_ADD_HOLE as HOLE
from ..holes import dw_partial_class
from ..probes import report_of
from ..probes.lesson07 import DW_STAGE, dw_compiled, dw_launched, dw_time_us
from ..registry import COMPILE, GPU, TIERS, Check, Exercise, mutants, register
from .lesson07 import LESSON, row_inputs

# ---- 07.dw_partial ----------------------------------------------------------------------------
#: the compile tier's backward: x bf16, dout fp16 (each recognisable by its conversion), the
#: weight fp32 (no conversion: nothing else in the kernel converts from bf16 or fp16)
DW_N_ROWS, DW_N_ONE = 1000, 4096  # 8 rows a CTA (bf16, fp32 weight); one row a CTA
DW_M_BLOCKS = 20000  # 2500 row blocks of 8 rows at N=1000: more than one wave's CTAs
DW_COMPILES = "compiles: several rows a CTA (N=1000)"
DW_PROBE_ROWS = "the partial row, 8 rows a CTA: dout * x_hat, barriers, each other row once"
DW_ATOMICS = (
    "no atomics: each CTA stores its own partial row with plain stores, and adds its rows in "
    "row order itself. An atomic add (into shared or global memory) lands in an order that "
    "changes from run to run, and fp32 addition is not associative, so dw's low bits would "
    "change too"
)
DW_TERM = (
    "the stored partial sums do not come from dout * x_hat: dw_j is the sum over rows of "
    "dout_j * x_hat_j (the weight multiplies x_hat in the forward, so its gradient is what "
    "arrives at the output times x_hat)"
)
DW_OWN_ROW = (
    "row 0's partial row holds only what it read from shared memory (slots(r)): its own sums, "
    "the acc of its own threads, never reach it. Row 0 starts from its acc and adds the other "
    "rows' slots to it"
)
DW_VECTORS = (
    "not every vector of the thread's columns reaches the partial row: some that lie in the row "
    "are never written"
)
DW_TILES_BARRIER = (
    "the accumulators go to shared memory (`mine`) with no barrier after the last block's "
    "dx: `mine` overlays the x and dout tiles, which other rows of the CTA may still be "
    "reading"
)
DW_ROWS_BARRIER = (
    "row 0 reads the other rows' sums (slots(r)) with no barrier after they were stored: a "
    "row's threads may not have written them yet"
)
DW_OTHER_ROWS = (
    "the partial row holds only the first row's sums: the CTA's other rows never reach it"
)
DW_ROWS_MISSING = (
    "row 0 adds the sums of {got} of the CTA's {others} other rows, so {missing} of them "
    "never reach the partial row (a range stops before its end)"
)
DW_ROW0_TWICE = (
    "row 0 reads {got} rows' sums from shared memory where {others} other rows hold them: "
    "slots(0) is row 0's own, already in its acc, so its sums count twice"
)
DW_ZERO = (
    "the other rows' sums are read and then multiplied by 0 before they are added: the "
    "partial row must be the sum of every row's acc as it is"
)
DW_ONE_WRITER = (
    "every row's threads store the partial row: the CTA has one partial row, so they all write "
    "the same columns and whichever lands last wins"
)
DW_OVERWRITE = (
    "acc is overwritten, not added to: each row block the CTA walks replaces the sums of the "
    "blocks before it, so only its last block counts"
)
DW_DRAIN = (
    "`mine` overlays the x and dout tiles, and cp.async copies (the empty ones issued past "
    "the last row block) may still be landing there when the accumulators are stored"
)
DW_COLS = (
    "a vector past column N is written: the tiles are wider than a ragged row, and the "
    "partial row of a CTA ends at column N, so a store there lands in the next CTA's row (or "
    "past the buffer)"
)
DW_DIVERGENT = (
    "a barrier inside the branch only row 0's threads take: cute.arch.barrier() waits for "
    "every thread of the CTA, and the other rows' threads never reach it, so the kernel hangs"
)
DW_NOT_DETERMINISTIC = (
    "two runs on the same inputs gave different partial sums: the order of the additions into "
    "a column must not depend on timing (no atomics; one row per CTA, its rows added in order)"
)


NO_ACCUMULATE = (
    "accumulate_dw is not defined beside combine_partial: write both functions in the "
    "exercise's cell"
)


#: the compile tier's dtypes: x, weight, dout
DW_DTYPES = ("bf16", "fp32", "fp16")


def dw_report(ctx, N: int):
    """(report, tiling) of the backward with the learner's two functions at ``N`` (x bf16,
    weight fp32, dout fp16), once a run: compiled where the answer lives
    (``probes.lesson07.dw_compiled``), the tiling and launch shape the grader's own copy's,
    built around stand-ins (never compiled here)."""
    key = ("07.dw_partial report", N)
    if key not in ctx.cache:
        data = ctx.probe(dw_compiled, N, *DW_DTYPES)
        if isinstance(data, dict) and data.get("accumulate_dw") is False:
            raise CheckFailed(
                "no accumulate_dw" + str(data.get("plain_call") or ""),
                expected="def accumulate_dw(acc, v, dy, x_hat)",
                hint=NO_ACCUMULATE,
            )
        kernel = dw_kernel(N)
        ctx.cache[key] = (report_of(kernel, DW_STAGE, data), kernel.tiling)
    return ctx.cache[key]


def dw_kernel(N: int):
    """The grader's own copy of the compile tier's backward at ``N`` (x, weight and dout in
    ``DW_DTYPES``), built around stand-ins and never compiled: its tiling and launch shape."""
    from ...runtime import torch_dtype
    from ...stages.final_bwd import BwdFeatures

    xd, wd, dd = (torch_dtype(d) for d in DW_DTYPES)
    return dw_partial_class(stand_in, stand_in)(
        xd, N, None, wd, features=BwdFeatures(dout_dtype=dd)
    )


def _dw_compiles() -> Check:
    def fn(ctx):
        out = []
        for N in (DW_N_ROWS,):
            with fail_on_error(
                f"the backward with your accumulate_dw and combine_partial does not compile (N={N})"
            ):
                rep, t = dw_report(ctx, N)
            out.append(f"N={N}: {t.rows_per_cta} rows a CTA, {rep.registers} registers")
        return "; ".join(out)

    return Check(DW_COMPILES, COMPILE, fn)


def _idx(instrs, pred, start=0, end=None, last=False):
    rng = range(start, len(instrs) if end is None else end)
    hits = [i for i in rng if pred(instrs[i])]
    if not hits:
        return None
    return hits[-1] if last else hits[0]


def _loop_carried(ptx: Ptx, anc) -> bool:
    """Whether an fp32 add or fma among ``anc`` feeds itself (a sum carried around a loop)."""
    for a in anc:
        if a.opcode.startswith(("fma.", "add.")) and "f32" in a.opcode:
            if any(b.index == a.index for b in ptx.ancestors(a)):
                return True
    return False


def probe_dw(ptx_text: str, rows: int, vec: int, vecs: int, even_cols: bool = True) -> str:
    """The partial store in the PTX of the compile tier's backward; raises CheckFailed."""
    ptx = Ptx(ptx_text)
    ins = ptx.instrs
    bad = divergent_barriers(ptx_text)  # a hang on the GPU
    if bad:
        raise CheckFailed(
            "a barrier that not every thread of the CTA reaches",
            expected="bar.sync outside any branch on the thread's row",
            seen=bad[0],
            hint=DW_DIVERGENT,
        )
    atomics = [i.text for i in ins if i.opcode.startswith(("red.", "atom."))]
    if atomics:
        raise CheckFailed(
            "atomic adds in the PTX",
            expected="plain st.global of the partial row, the rows added in order",
            seen=atomics[0],
            hint=DW_ATOMICS,
        )
    stores = [i for i in ins if i.opcode.startswith("st.global")]
    anc = {i.index: ptx.ancestors(i) for i in stores}

    def packs(i):  # dx: converted back to bf16 before its store
        return any(a.opcode.startswith("cvt.rn.bf16") for a in anc[i.index])

    dx = [i for i in stores if packs(i)]
    partial = [i for i in stores if not packs(i)]
    per_row = max(1, vec * 4 // 16) * vecs
    if len(partial) < per_row:
        raise CheckFailed(
            f"{len(partial)} stores of the partial row for {vecs} vectors of {vec} fp32",
            expected=f"{per_row} st.global of fp32 partial sums",
            seen=f"{len(partial)}",
            hint=DW_VECTORS,
        )
    for st in partial:
        from_x = any(a.opcode.startswith("cvt.f32.bf16") for a in anc[st.index])
        from_dout = any(a.opcode.startswith("cvt.f32.f16") for a in anc[st.index])
        if not (from_x and from_dout):
            seen = ", ".join(k for k, ok in (("x", from_x), ("dout", from_dout)) if ok) or "neither"
            # nothing of this thread's own rows, only other threads' sums from shared memory:
            # row 0 left its own acc out (the reads' data flow is another thread's, not here)
            own_left_out = (
                rows > 1
                and not (from_x or from_dout)
                and any(a.opcode.startswith("ld.shared") for a in anc[st.index])
                and not _loop_carried(ptx, anc[st.index])
            )
            raise CheckFailed(
                "a partial sum is not built from dout * x_hat",
                expected="x (cvt.f32.bf16) and dout (cvt.f32.f16) among its inputs",
                seen=f"from {seen}" + (", only from shared memory" if own_left_out else ""),
                hint=DW_OWN_ROW if own_left_out else DW_TERM,
            )
    if not _loop_carried(ptx, anc[partial[0].index]):
        raise CheckFailed(
            "the partial sums are not carried from one row block to the next",
            expected="an fp32 add (or fma) into acc that feeds the next block's",
            seen="only the last block's dout * x_hat reaches the store",
            hint=DW_OVERWRITE,
        )
    zeroed = [a.text for st in partial for a in anc[st.index] if times_zero(a)]
    if zeroed:
        raise CheckFailed(
            "a value on the way to the partial row is multiplied by 0",
            expected="the rows' sums added as they are",
            seen=zeroed[0],
            hint=DW_ZERO,
        )
    if rows > 1 and dx:
        last_dx = max(i.index for i in dx)
        first_sh = _idx(ins, lambda i: i.opcode.startswith("st.shared"), last_dx)
        if first_sh is None:
            raise CheckFailed(
                "no store into shared memory after the last dx",
                expected=f"each of the {rows} rows' sums into `mine`, then row 0 adds them",
                seen="none",
                hint=DW_OTHER_ROWS,
            )
        bar = _idx(ins, lambda i: i.opcode.startswith("bar.sync"), last_dx, first_sh, last=True)
        if bar is None:
            raise CheckFailed(
                "no barrier between the last dx and the accumulators' stores into shared memory",
                expected="bar.sync, then st.shared",
                seen="st.shared right after the main loop",
                hint=DW_TILES_BARRIER,
            )
        if any(i.opcode.startswith("cp.async") for i in ins) and (
            _idx(
                ins,
                lambda i: i.opcode.startswith("cp.async.wait_group") and i.operands == ["0"],
                last_dx,
                bar,
            )
            is None
        ):
            raise CheckFailed(
                "copies may still be in flight when the accumulators go to shared memory",
                expected="cp.async.wait_group 0, bar.sync, then st.shared",
                seen="bar.sync with no cp.async.wait_group 0 before it",
                hint=DW_DRAIN,
            )
        last_sh = _idx(ins, lambda i: i.opcode.startswith("st.shared"), first_sh, last=True)
        first_ld = _idx(ins, lambda i: i.opcode.startswith("ld.shared"), last_sh)
        loads = sum(1 for i in ins[last_sh:] if i.opcode.startswith("ld.shared"))
        need = (rows - 1) * per_row
        if first_ld is None or loads != need:
            got = loads // per_row
            if loads == 0:
                hint = DW_OTHER_ROWS
            elif loads < need:
                hint = DW_ROWS_MISSING.format(got=got, others=rows - 1, missing=rows - 1 - got)
            else:
                hint = DW_ROW0_TWICE.format(got=got, others=rows - 1)
            raise CheckFailed(
                f"row 0 reads {loads} vectors of the other rows' sums",
                expected=f"{need} ld.shared ({rows - 1} other rows x {vecs} vectors)",
                seen=f"{loads} ({got} rows)",
                hint=hint,
            )
        if _idx(ins, lambda i: i.opcode.startswith("bar.sync"), last_sh, first_ld) is None:
            raise CheckFailed(
                "no barrier between the rows' stores into shared memory and row 0's reads",
                expected="st.shared, bar.sync, then ld.shared",
                seen="ld.shared with no bar.sync before it",
                hint=DW_ROWS_BARRIER,
            )
        guards = thread_guards(ptx_text)
        open_ = [st for st in partial if not guards[st.index]]
        if open_:
            raise CheckFailed(
                f"{len(open_)} of the {len(partial)} partial-row stores run in every row's threads",
                expected="st.global of the partial row under a branch on the thread's row",
                seen=open_[0].text,
                hint=DW_ONE_WRITER,
            )
        if not even_cols and len({guards[st.index] for st in partial}) == 1:
            raise CheckFailed(
                "no vector of the partial row is tested against column N (a ragged row)",
                expected="the last vector's stores under a column test (in_cols(v))",
                seen="every partial store under the same condition",
                hint=DW_COLS,
            )
    how = f"{rows} rows added through shared memory" if rows > 1 else "one row a CTA"
    return f"{len(partial)} plain stores of dout * x_hat sums, {how}, no atomics"


def _dw_probe(N: int, name: str, hidden: bool = False) -> Check:
    def fn(ctx):
        rep, t = dw_report(ctx, N)
        return probe_dw(rep.ptx, t.rows_per_cta, t.vec, t.vecs, t.even_cols)

    return Check(name, COMPILE, fn, hidden, needs=(DW_COMPILES,))


#: the CPU's values: persistent CTAs, each walking several row blocks of DW_N_ROWS, the last
#: block ragged (one row)
DW_SIM_CTAS, DW_SIM_BLOCKS = 2, 5


def _dw_sim_values() -> Check:
    """dw from the answer's PTX (the compile tier's, x bf16, dout fp16, weight fp32) run on the
    CPU (``ptxsim.stages.bwd_partial``, in the grader's process: our code on that text) with
    the launch shape of the grader's own copy of the kernel, against ``rmsnorm_bwd_ref``: a
    partial row built from the wrong product reads right in the PTX, not in the values."""

    def fn(ctx):
        import torch

        from ...ptxsim.stages import bwd_partial
        from ...reference import TOLERANCES, rmsnorm_bwd_ref
        from ...runtime import torch_dtype
        from ..sim_values import STEP_BUDGET, simulated

        rep, t = dw_report(ctx, DW_N_ROWS)
        kernel = dw_kernel(DW_N_ROWS)
        M = (DW_SIM_BLOCKS - 1) * t.rows_per_cta + 1
        gen = ctx.torch_generator(salt="dw on the CPU")
        x, w, dout, rstd = row_inputs(M, DW_N_ROWS, DW_DTYPES[0], DW_DTYPES[1], 0.0, gen)
        dout = dout.to(torch_dtype(DW_DTYPES[2]))
        where = f"M={M} N={DW_N_ROWS}, {DW_SIM_CTAS} CTAs (the PTX run on the CPU)"
        got, why_not = simulated(
            lambda: bwd_partial(
                rep.ptx, kernel, x, w, dout, rstd, grid_x=DW_SIM_CTAS, max_steps=20 * STEP_BUDGET
            ),
            where,
        )
        if got is None:
            return why_not
        parts = got[1]
        _, ew, _ = rmsnorm_bwd_ref(x, w, dout, rstd, compute_dtype=torch.float64)
        dw = parts.double().sum(dim=0)
        wt = TOLERANCES[torch.float32]
        bad = ~torch.isclose(dw, ew, rtol=wt["rtol"], atol=wt["atol"] * math.sqrt(M) * 10)
        if bool(bad.any()):
            col = int(bad.nonzero()[0])
            nan_rows = int(parts.isnan().any(dim=1).sum())
            raise CheckFailed(
                f"{where}: dw (the partial rows' sum) differs from rmsnorm_bwd_ref in "
                f"{int(bad.sum())} of {DW_N_ROWS} columns"
                + (f"; {nan_rows} partial rows never written" if nan_rows else ""),
                expected=f"{ew[col].item():.6g} at column {col}",
                seen=f"{dw[col].item():.6g}",
                hint=DW_VECTORS if nan_rows else DW_TERM,
            )
        return f"{where}: dw matches rmsnorm_bwd_ref"

    name = "dw's values on the CPU (the PTX simulated: 2 CTAs over 5 row blocks, N=1000)"
    return Check(name, COMPILE, fn, needs=(DW_COMPILES, DW_PROBE_ROWS))


#: (x dtype, weight dtype) of the gpu value cases: every weight dtype beside bf16 x, and x's own
DW_CASES = (("bf16", "bf16"), ("bf16", "fp32"), ("fp16", "fp16"), ("fp32", "fp32"))


def _launchable(ctx):
    """The compile tier's (report, tiling) of the answer; CheckFailed, before any launch, where
    a barrier is not reached by every thread (the kernel would hang the GPU)."""
    rep, t = dw_report(ctx, DW_N_ROWS)
    bad = divergent_barriers(rep.ptx)
    if bad:
        raise CheckFailed(
            "not run: a barrier that not every thread of the CTA reaches would hang it",
            expected="bar.sync outside any branch on the thread's row",
            seen=bad[0],
            hint=DW_DIVERGENT,
        )
    return rep, t


def _dw_values(hidden: bool) -> Check:
    def fn(ctx):
        import torch

        from ...reference import TOLERANCES, rmsnorm_bwd_ref
        from ..checks import HIDDEN_M, VISIBLE_M

        rep, t = _launchable(ctx)

        def ptx_hint():  # what the compile tier's probe says of the same answer, if anything
            try:
                probe_dw(rep.ptx, t.rows_per_cta, t.vec, t.vecs, t.even_cols)
            except CheckFailed as e:
                return e.hint
            return None

        gen = ctx.torch_generator(salt="dw values" + str(hidden))
        n = 0
        # N = 1000: several rows a CTA; N = 4096 (bf16): one row a CTA, combine_partial's
        # other branch. The M of DW_M_BLOCKS gives each CTA several row blocks (the grid is one
        # wave, at most 132 SMs x 8 CTAs of 256 threads), at both N.
        cases = [
            (x, w, ctx.hidden_N(HOLE, x) if hidden else DW_N_ROWS, M)
            for x, w in DW_CASES
            for M in (HIDDEN_M if hidden else VISIBLE_M)
        ]
        cases.append(("bf16", "fp32", DW_N_ROWS, DW_M_BLOCKS))
        if not hidden:
            cases += [("bf16", "bf16", DW_N_ONE, M) for M in (*VISIBLE_M, DW_M_BLOCKS)]
        for xdt, wdt, N, M in cases:
            x, w, dout, rstd = row_inputs(M, N, xdt, wdt, 0.0, gen, "cuda")
            # two launches where the answer lives, each on a NaN-poisoned buffer of P + 1 rows:
            # one more row, poisoned too: a store past column N of the last CTA's row lands there
            bufs = ctx.probe(dw_launched, x, w, dout, rstd, 2)
            if not (
                isinstance(bufs, list | tuple)
                and len(bufs) == 2
                and all(torch.is_tensor(b) and b.dim() == 2 for b in bufs)
                and bufs[0].shape == bufs[1].shape
                and bufs[0].shape[0] >= 2
                and bufs[0].shape[1] == N
            ):
                raise CheckFailed("the learner's process sent no partial buffers back")
            buf = bufs[1].to(x.device)
            P = buf.shape[0] - 1
            parts = [b.to(x.device)[:P] for b in bufs]
            what = f"{xdt} x, {wdt} weight, M={M} N={N} (seed {ctx.seed})"
            spill = int((~buf[P].isnan()).sum())
            if spill:
                raise CheckFailed(
                    f"{what}: {spill} values written past the end of the last CTA's partial row",
                    expected=f"the partial rows' {N} columns only",
                    seen=f"{spill} columns of the row after the last written",
                    hint=DW_COLS,
                )
            _, ew, _ = rmsnorm_bwd_ref(x, w, dout, rstd, compute_dtype=torch.float64)
            dw = parts[0].sum(dim=0).double()
            wt = TOLERANCES[torch.float32]
            bad = ~torch.isclose(dw, ew, rtol=wt["rtol"], atol=wt["atol"] * math.sqrt(M) * 10)
            if bool(bad.any()):
                col = int(bad.nonzero()[0])
                nan_rows = int(parts[0].isnan().any(dim=1).sum())
                # every partial row written and the sum wrong: what is summed is not
                # dout * x_hat (dout alone, dout * x_hat^2, dout + x_hat: the GPU tier named
                # only the first, 2026-12-07, an H100), as the compile tier says
                hint = DW_VECTORS if nan_rows else DW_TERM
                hint = ptx_hint() or hint  # a mistake the PTX shows names itself best
                raise CheckFailed(
                    f"{what}: dw (the partial rows' sum) differs from rmsnorm_bwd_ref in "
                    f"{int(bad.sum())} of {N} columns"
                    + (f"; {nan_rows} partial rows never written" if nan_rows else ""),
                    expected=f"{ew[col].item():.6g} at column {col}",
                    seen=f"{dw[col].item():.6g}",
                    hint=hint,
                )
            if not torch.equal(parts[0], parts[1]):
                raise CheckFailed(
                    f"{what}: two runs gave different partial sums",
                    expected="the same bits on every run",
                    seen=f"{int((parts[0] != parts[1]).sum())} elements differ",
                    hint=DW_NOT_DETERMINISTIC,
                )
            n += 1
        return f"{n} cases: dw matches rmsnorm_bwd_ref, bitwise the same on two runs"

    name = (
        "dw at more shapes, grading seed"
        if hidden
        else "dw vs rmsnorm_bwd_ref, twice bitwise equal (M 1/37/199/20000, N=1000 and 4096, "
        "all dtypes)"
    )
    return Check(name, GPU, fn, hidden, (DW_COMPILES,))


def _dw_speed(fraction: float = 0.8, M: int = 32768, N: int = 4096) -> Check:
    def fn(ctx):
        import torch

        from ...tools.bench import rmsnorm_bwd_bytes

        _launchable(ctx)
        us = float(ctx.probe(dw_time_us, M, N, 1))  # timed where the answer lives
        nbytes = rmsnorm_bwd_bytes(M, N, torch.bfloat16, torch.bfloat16)
        return speed_vs_copy(nbytes, us, fraction, f"{M}x{N} bf16")

    return Check(
        f"speed >= {100 * fraction:.0f}% of copy bandwidth ({M}x{N} bf16 backward)",
        GPU,
        fn,
        needs=(DW_COMPILES,),
    )


#: the solution's row-0 block, which two mutants rewrite
_SOL_TAIL = (
    "        if row == 0:\n"
    "            for v in cutlass.range_constexpr(vecs):\n"
    "                if in_cols(v):\n"
    "                    tot = acc[None, None, v].load()\n"
    "                    for r in cutlass.range_constexpr(1, rows):\n"
    "                        tot = tot + slots(r)[None, None, v].load()\n"
    "                    write(tot, v)\n"
)


def _dedent(text: str, by: int = 4) -> str:
    return "".join(line[by:] if line.strip() else line for line in text.splitlines(True))


# BEGIN KEY
# fmt: off
DW_PARTIAL_MUTANTS = [
    *mutants(TIERS,
        ("accumulates dout, not dout * x_hat", "do not come from dout * x_hat",
         "acc[None, None, v].load() + dy * x_hat", "acc[None, None, v].load() + dy"),
        # (a cold learner's two: the PTX reads as dout * x_hat, only the values tell)
        ("accumulates dout * x_hat * x_hat", "do not come from dout * x_hat",
         "+ dy * x_hat", "+ dy * x_hat * x_hat"),
        ("accumulates dout + x_hat", "do not come from dout * x_hat",
         "+ dy * x_hat", "+ (dy + x_hat)"),
    ),
    *mutants(COMPILE,
        ("no barrier before the accumulators overwrite the tiles", "overlays the x and dout tiles",
         "        cute.arch.barrier()  # every row is done with the tiles\n", ""),
        ("no barrier before row 0 reads the other rows",
         "a row's threads may not have written them yet",
         "        cute.arch.barrier()  # every row's sums are in `mine`\n", ""),
        ("only row 0's own sums", "the CTA's other rows never reach it",
         "                    for r in cutlass.range_constexpr(1, rows):\n"
         "                        tot = tot + slots(r)[None, None, v].load()\n",
         ""),
    ),
    *mutants(TIERS,
        ("the last row left out", "so 1 of them never reach the partial row",
         "range_constexpr(1, rows)", "range_constexpr(1, rows - 1)"),
        ("every row's threads store the partial row", "whichever lands last wins",
         _SOL_TAIL, _dedent(_SOL_TAIL.replace("        if row == 0:\n", ""))),
        ("row 0 counted twice", "so its sums count twice",
         "range_constexpr(1, rows)", "range_constexpr(0, rows)"),
        ("row 0 leaves its own sums out", "its own sums, the acc of its own threads", [
            ("tot = acc[None, None, v].load()", "tot = slots(1)[None, None, v].load()"),
            ("range_constexpr(1, rows)", "range_constexpr(2, rows)"),
        ]),
        ("acc overwritten, not added to", "only its last block counts",
         "acc[None, None, v].load() + dy * x_hat", "dy * x_hat"),
    ),
    *mutants(COMPILE,
        ("no drain() before the barrier", "may still be landing there",
         "        drain()\n", ""),
    ),
    *mutants(TIERS,
        ("in_cols ignored", "a vector past column N is written",
         "                if in_cols(v):\n                    tot",
         "                if True:\n                    tot"),
        ("the second barrier inside if row == 0",
         "the other rows' threads never reach it, so the kernel hangs",
         "        cute.arch.barrier()  # every row's sums are in `mine`\n"
         "        if row == 0:\n",
         "        if row == 0:\n"
         "            cute.arch.barrier()  # every row's sums are in `mine`\n"),
        ("cheat: the other rows' sums times 0.0", "multiplied by 0 before they are added",
         "slots(r)[None, None, v].load()", "slots(r)[None, None, v].load() * 0.0"),
    ),
    *mutants(COMPILE,
        ("row 0 adds the other rows with atomics",
         "no atomics: each CTA stores its own partial row",
         _SOL_TAIL,
         "        if row != 0:\n"
         "            for v in cutlass.range_constexpr(vecs):\n"
         "                a = acc[None, None, v]\n"
         "                t = slots(0)[None, None, v]\n"
         "                for i in cutlass.range_constexpr(cute.size(a)):\n"
         "                    cute.arch.atomic_add(t.iterator + t.layout(i), a[i])\n"
         "        cute.arch.barrier()\n"
         "        if row == 0:\n"
         "            for v in cutlass.range_constexpr(vecs):\n"
         "                if in_cols(v):\n"
         "                    write(mine[None, None, v].load(), v)\n"),
    ),
]
# fmt: on
# END KEY

dw_partial = register(
    Exercise(
        id="07.dw_partial",
        finished=("quack_edu.stages.final_bwd.FinalBwdRMSNorm.combine_partial",),
        lesson=LESSON,
        answer="combine_partial",
        title="the persistent CTA's dw: accumulate dout * x_hat, then store one partial row",
        points={COMPILE: 2, GPU: 2},
        mutants=DW_PARTIAL_MUTANTS,
    )
)
dw_partial.add(
    _dw_compiles(),
    _dw_probe(DW_N_ROWS, DW_PROBE_ROWS),
    _dw_sim_values(),
    _dw_probe(DW_N_ONE, "the partial row, one row a CTA (N=4096): plain stores", hidden=True),
    _dw_values(hidden=False),
    _dw_values(hidden=True),
    _dw_speed(),
)
