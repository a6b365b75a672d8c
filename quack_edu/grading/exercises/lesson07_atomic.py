"""Lesson 07, the backward: strategy 1's atomic add of a CTA's dw sums into the one dw row.

07.red_add: ``red_add(r, dst)`` adds ``r``, a vector of fp32 partial sums of dout * x_hat in
registers, into ``dst``, the same columns of the one zeroed dw row in global memory, with
atomic adds; it becomes ``red_add`` of lesson 07's atomic backward (``final_bwd.FinalBwdAtomic``,
``holes.RED_ADD_HOLE``), whose row 0 threads call it once per vector of the CTA's sums.

Its compile tier reads the PTX of that backward with x bf16, dout fp16 and an fp32 weight at
N = 1000 (8 rows a CTA): atomic adds into global memory (``red`` or ``atom``, ``add``, ``f32``)
at gpu scope (or wider), covering exactly a thread's vec x vecs elements, each at its own
address and each of its own value; the values built from x and dout (``cvt.f32.bf16`` and
``cvt.f32.f16`` among their inputs); no plain ``st.global`` other than dx's (packed back to
bf16). Its gpu tier (not yet run on a GPU) launches the kernel three times on the same inputs
and compares each dw with ``rmsnorm_bwd_ref`` in float64, to the tolerance of fp32 additions
in any order; how the three runs differ is reported, never failed: the atomics' order changes.

The kernel is compiled and launched where the answer lives (``probes.lesson07``); the checks
decide here, with the tiling of the grader's own copy of the kernel (built around a stand-in,
never compiled).
"""

from __future__ import annotations

import math

from ..checks import CheckFailed, Ptx, fail_on_error, stand_in
from ..holes import RED_ADD_HOLE as HOLE
from ..probes import report_of
from ..probes.lesson07 import RED_STAGE, red_compiled, red_launched
from ..registry import COMPILE, GPU, TIERS, Check, Exercise, mutants, register
from .lesson07 import LESSON, row_inputs

#: the compile tier's backward: x bf16, dout fp16 (each recognisable by its conversion), the
#: weight fp32 (no conversion), 8 rows a CTA at N = 1000: row 0's threads add the CTA's sums
RED_N = 1000
RED_DTYPES = ("bf16", "fp32", "fp16")  # x, weight, dout
#: the gpu tier's rows: 1 to 199 rows (1 to 25 CTAs at N = 1000), and 20000 (every CTA of a
#: wave, each walking several row blocks, all adding into the same row); launches per case
RED_M_MANY = 20000
RUNS = 3
COMPILES = "compiles into the atomic backward (x bf16, weight fp32, dout fp16, N=1000)"
PROBE = "the PTX: an atomic add per element of the vector, of the sums of dout * x_hat (its scope)"

PLAIN_STORE = (
    "the partial sums are stored, not added: every CTA of the grid writes the same dw row, so a "
    "store replaces what the other CTAs put there and only the last one's sums survive. Add "
    'them with cute.arch.red and op="add"'
)
NO_ADDS = (
    "nothing reaches the dw row: red_add must add each element of r into dst (cute.arch.red, "
    'op="add")'
)
NARROW_SCOPE = (
    'the atomic add has scope="{scope}": its add is atomic only among the threads of one '
    "{what}, while every CTA of the grid adds into the same dw row: its scope must cover "
    "them all"
)
NOT_F32 = 'the adds are not of fp32 values (dtype="f32"): dw\'s row and r are fp32'
MISSING_ELEMENTS = (
    "only {got} of the vector's {want} elements are added: each thread's vector holds {want} "
    "fp32 sums (cute.size(dst)), and every one of them must reach the dw row"
)
EXTRA_ELEMENTS = (
    "{got} elements are added where the vector holds {want}: some element is added twice"
)
SAME_ADDRESS = (
    "several adds go to the same address: element i of r belongs at element i of dst, each at "
    "its own address (dst's layout maps the index i to its offset from dst's first element)"
)
SAME_VALUE = "the same value is added at several addresses: element i of dst gets element i of r"
NOT_THE_SUMS = (
    "the values added are not the CTA's sums of dout * x_hat: add the elements of r, the "
    "vector red_add is given"
)


def red_report(ctx):
    """(report, tiling) of the atomic backward with the learner's red_add (x bf16, weight fp32,
    dout fp16, N = RED_N), once a run: compiled where the answer lives
    (``probes.lesson07.red_compiled``), the tiling the grader's own copy's, built around a
    stand-in (never compiled here)."""
    from ...runtime import torch_dtype
    from ...stages.final_bwd import BwdFeatures

    key = ("07.red_add report", RED_N)
    if key not in ctx.cache:
        data = ctx.probe(red_compiled, RED_N, *RED_DTYPES)
        xd, wd, dd = (torch_dtype(d) for d in RED_DTYPES)
        kernel = HOLE.build(stand_in)(xd, RED_N, None, wd, features=BwdFeatures(dout_dtype=dd))
        ctx.cache[key] = (report_of(kernel, RED_STAGE, data), kernel.tiling)
    return ctx.cache[key]


def _compiles() -> Check:
    def fn(ctx):
        with fail_on_error(f"the atomic backward with your red_add does not compile (N={RED_N})"):
            rep, t = red_report(ctx)
        return (
            f"N={RED_N}: {t.rows_per_cta} rows a CTA, {t.vecs} vectors of {t.vec} a thread, "
            f"{rep.registers} registers"
        )

    return Check(COMPILES, COMPILE, fn)


def _width(opcode: str) -> int:
    """fp32 elements one atomic instruction adds: 4 for .v4, 2 for .v2, else 1."""
    parts = opcode.split(".")
    return 4 if "v4" in parts else 2 if "v2" in parts else 1


def _value_regs(ins) -> list[str]:
    """The registers of an atomic's value operand(s): its last operand (``red``: the second,
    ``atom``: the third), a register or a ``{...}`` vector of them."""
    from ..ptx import REG

    return REG.findall(ins.operands[-1]) if ins.operands else []


def probe_red(ptx_text: str, vec: int, vecs: int) -> str:
    """The atomic adds of the compile tier's backward; raises CheckFailed."""
    ptx = Ptx(ptx_text)
    want = vec * vecs
    adds = [
        i
        for i in ptx.instrs
        if i.opcode.startswith(("red.", "atom."))
        and ".add" in i.opcode
        and "shared" not in i.opcode
    ]

    def packs(st):  # dx: converted back to bf16 before its store
        return any(a.opcode.startswith("cvt.rn.bf16") for a in ptx.ancestors(st))

    plain = [i for i in ptx.instrs if i.opcode.startswith("st.global") and not packs(i)]
    if plain:
        raise CheckFailed(
            f"{len(plain)} plain stores of fp32 partial sums",
            expected="only dx's stores (packed to bf16); the partial sums added atomically",
            seen=plain[0].text,
            hint=PLAIN_STORE,
        )
    if not adds:
        raise CheckFailed(
            "no atomic add into global memory in the PTX",
            expected=f"red.relaxed.gpu.global.add.f32 (or .v4.f32) covering {want} elements",
            seen="none",
            hint=NO_ADDS,
        )
    for i in adds:
        parts = i.opcode.split(".")
        for scope, what in (("cta", "CTA"), ("cluster", "cluster")):
            if scope in parts:
                raise CheckFailed(
                    f"an atomic add of scope .{scope}",
                    expected="a scope that covers every CTA of the grid",
                    seen=i.text,
                    hint=NARROW_SCOPE.format(scope=scope, what=what),
                )
        if parts[-1] != "f32":
            raise CheckFailed(
                "an atomic add that is not of fp32",
                expected="red...add.f32",
                seen=i.text,
                hint=NOT_F32,
            )
    got = sum(_width(i.opcode) for i in adds)
    if got != want:
        raise CheckFailed(
            f"the atomic adds cover {got} elements of a thread's {vecs} vectors of {vec}",
            expected=f"{want} fp32 elements ({vecs} calls of red_add, {vec} elements each)",
            seen=f"{got} in {len(adds)} instructions",
            hint=(MISSING_ELEMENTS if got < want else EXTRA_ELEMENTS).format(
                got=got // vecs if got < want else got, want=vec if got < want else want
            ),
        )
    addresses = [i.operands[0].replace(" ", "") for i in adds]
    if len(set(addresses)) < len(addresses):
        dup = next(a for a in addresses if addresses.count(a) > 1)
        raise CheckFailed(
            f"{len(addresses) - len(set(addresses))} atomic adds to an address already added to",
            expected=f"{len(adds)} distinct addresses",
            seen=f"{addresses.count(dup)} adds to {dup}",
            hint=SAME_ADDRESS,
        )
    for i in adds:
        src = [
            a
            for r in _value_regs(i)
            for d in ptx.defs.get(r, [])
            for a in (ptx.instrs[d], *ptx.ancestors(ptx.instrs[d]))
        ]
        from_x = any(a.opcode.startswith("cvt.f32.bf16") for a in src)
        from_dout = any(a.opcode.startswith("cvt.f32.f16") for a in src)
        if not (from_x and from_dout):
            seen = ", ".join(k for k, ok in (("x", from_x), ("dout", from_dout)) if ok) or "neither"
            raise CheckFailed(
                "a value added to the dw row is not built from dout * x_hat",
                expected="x (cvt.f32.bf16) and dout (cvt.f32.f16) among its inputs",
                seen=f"from {seen}: {i.text}",
                hint=NOT_THE_SUMS,
            )
    values = [r for i in adds for r in _value_regs(i)]
    if len(values) == got and len(set(values)) < len(values):
        raise CheckFailed(
            f"{len(values) - len(set(values))} atomic adds of a value already added elsewhere",
            expected=f"{got} distinct values",
            seen=f"{len(set(values))} distinct",
            hint=SAME_VALUE,
        )
    kinds = sorted({i.opcode for i in adds})
    return f"{len(adds)} atomic adds ({', '.join(kinds)}) of {got} sums of dout * x_hat"


def _probe() -> Check:
    def fn(ctx):
        rep, t = red_report(ctx)
        return probe_red(rep.ptx, t.vec, t.vecs)

    return Check(PROBE, COMPILE, fn, needs=(COMPILES,))


#: (x dtype, weight dtype) of the gpu value cases: every weight dtype beside bf16 x, and x's own
RED_CASES = (("bf16", "bf16"), ("bf16", "fp32"), ("fp16", "fp16"), ("fp32", "fp32"))


def dw_tolerance(M: int) -> dict:
    """isclose's rtol and atol for a dw of M rows summed in fp32 in any order (the atomics'
    chain of P adds included): fp32's table, atol grown with the sum's scale, sqrt(M) (|dout *
    x_hat| ~ 1 a term), as 07.dw_partial's."""
    import torch

    from ...reference import TOLERANCES

    wt = TOLERANCES[torch.float32]
    return {"rtol": wt["rtol"], "atol": wt["atol"] * math.sqrt(M) * 10}


def _values(hidden: bool) -> Check:
    def fn(ctx):
        import torch

        from ...reference import rmsnorm_bwd_ref
        from ..checks import HIDDEN_M, VISIBLE_M

        rep, t = red_report(ctx)

        def ptx_hint():  # what the compile tier's probe says of the same answer, if anything
            try:
                probe_red(rep.ptx, t.vec, t.vecs)
            except CheckFailed as e:
                return e.hint
            return None

        gen = ctx.torch_generator(salt="red_add values" + str(hidden))
        cases = [
            (x, w, ctx.hidden_N(HOLE, x) if hidden else RED_N, M)
            for x, w in RED_CASES
            for M in (HIDDEN_M if hidden else VISIBLE_M)
        ]
        cases.append(("bf16", "fp32", RED_N, RED_M_MANY))
        if not hidden:
            cases.append(("bf16", "bf16", 4096, RED_M_MANY))  # one row a CTA
        n, spread = 0, []
        for xdt, wdt, N, M in cases:
            x, w, dout, rstd = row_inputs(M, N, xdt, wdt, 0.0, gen, "cuda")
            rows = ctx.probe(red_launched, x, w, dout, rstd, RUNS)
            if not (
                isinstance(rows, list | tuple)
                and len(rows) == RUNS
                and all(torch.is_tensor(r) and tuple(r.shape) == (1, N) for r in rows)
            ):
                raise CheckFailed("the learner's process sent no dw rows back")
            _, ew, _ = rmsnorm_bwd_ref(x, w, dout, rstd, compute_dtype=torch.float64)
            ew = ew.cpu()
            dws = [r[0].double().cpu() for r in rows]
            what = f"{xdt} x, {wdt} weight, M={M} N={N} (seed {ctx.seed})"
            for k, dw in enumerate(dws):
                bad = ~torch.isclose(dw, ew, **dw_tolerance(M))
                if bool(bad.any()):
                    col = int(bad.nonzero()[0])
                    zero = int(((dw == 0) & (ew != 0)).sum())
                    hint = ptx_hint() or (
                        MISSING_ELEMENTS.format(got="some", want=t.vec) if zero else None
                    )
                    raise CheckFailed(
                        f"{what}, run {k + 1} of {RUNS}: dw differs from rmsnorm_bwd_ref in "
                        f"{int(bad.sum())} of {N} columns"
                        + (f" ({zero} of them still 0)" if zero else ""),
                        expected=f"{ew[col].item():.6g} at column {col}",
                        seen=f"{dw[col].item():.6g}",
                        hint=hint,
                    )
            # information, not a verdict: the CTAs' adds land in another order on each run
            differ = sum(int((dws[0] != d).sum()) for d in dws[1:])
            diff = max(float((dws[0] - d).abs().max()) for d in dws[1:])
            if M == RED_M_MANY:
                spread.append(f"M={M} N={N}: {differ} column-runs differ, at most {diff:.2g}")
            n += 1
        info = "; ".join(spread) or "no case of many CTAs"
        return (
            f"{n} cases x {RUNS} runs: dw matches rmsnorm_bwd_ref each time. Between runs "
            f"(not graded: the order of the atomics changes): {info}"
        )

    name = (
        "dw at more shapes, grading seed"
        if hidden
        else f"dw vs rmsnorm_bwd_ref on each of {RUNS} runs (M 1/37/199/20000, N=1000 and 4096, "
        "all dtypes)"
    )
    return Check(name, GPU, fn, hidden, (COMPILES,))


# BEGIN KEY
#: the solution's add, which a mutant rewrites
_RED = 'cute.arch.red(ptr, r[i], op="add", dtype="f32", sem="relaxed", scope="gpu")'
# fmt: off
RED_ADD_MUTANTS = [
    *mutants(TIERS,
        ("a plain store instead of the atomic add", "a store replaces what the other CTAs put",
         _RED, "dst[i] = r[i]"),
        ("only the vector's first element", "of the vector's",
         "range_constexpr(cute.size(dst))", "range_constexpr(1)"),
        ("every element added at the first address", "each at its own address",
         "ptr = dst.iterator + dst.layout(i)", "ptr = dst.iterator"),
        ("the first element added everywhere", "element i of dst gets element i of r",
         "r[i], op=", "r[0], op="),
        ("a constant added", "not the CTA's sums of dout * x_hat",
         "r[i], op=", "cutlass.Float32(1.0), op="),
    ),
    *mutants(COMPILE,
        ("scope cta", "its add is atomic only among the threads of one CTA",
         'scope="gpu"', 'scope="cta"'),
    ),
]
# fmt: on
# END KEY

red_add = register(
    Exercise(
        id="07.red_add",
        finished=("quack_edu.stages.final_bwd.FinalBwdAtomic.red_add",),
        lesson=LESSON,
        answer="red_add",
        title="strategy 1: add a vector of fp32 dw sums into the one dw row with atomic adds",
        points={COMPILE: 1, GPU: 1},
        mutants=RED_ADD_MUTANTS,
    )
)
# No compile-tier check at a random N: the piece does not depend on N (the kernel around it
# does, and the gpu tier's hidden check runs it at random ragged N); each compile of the
# backward costs ~1-2 s on a 2-core CI machine.
red_add.add(_compiles(), _probe(), _values(hidden=False), _values(hidden=True))
