"""Lesson 07, the backward: the gradient of a row by hand, the kernel's g, and its dw partials.

07.dx_row   dx of RMSNorm rows in torch, fp32, from the saved rstd, derived by hand:
            rstd * (g - x_hat * mean(x_hat * g)) with g = dout * (w + weight_offset)
07.grad_in  the backward kernel's g = dout * (w + weight_offset) (dout alone without a weight)
07.dw_partial  the persistent CTA's dw: its accumulation (dout * x_hat, fp32, across its row
            blocks) and its partial store (the CTA's rows added in order through shared memory,
            one plain-stored row a CTA): two functions, made methods of the backward kernel

07.dx_row's compile tier runs the answer on the CPU and compares it with torch.autograd of the
forward in float64 (``bwd_strategies.autograd_bwd``), with a tolerance per row (``DX_RTOL``,
explained there); a known wrong formula that matches every case gives its hint. The answer's
source must not differentiate (autograd) nor call a finished backward. Its gpu tier runs the
answer on CUDA tensors against float64 autograd and against the kernel's own dx
(``quack_edu.rmsnorm_bwd``).

07.grad_in's compile tier reads the PTX of the backward kernel built around the answer with x
fp32, the weight bf16, dout fp16 and weight_offset=1.0, so that each operand of g is
recognisable by its conversion (``cvt.f32.bf16`` the weight, ``cvt.f32.f16`` dout) and the offset
is the fp32 constant 0f3F800000: following the dx stores back through the registers says
whether the weight, dout and the offset reach dx, and whether the offset was added to the
weight or after the multiply. Then it compiles the kernel without a weight (``w`` is None).
The gpu tier runs the learner's kernel class (a subclass of ``FinalBwdRMSNorm``) through its
``launch`` against ``rmsnorm_bwd_ref`` (dx and dw) with weights of every dtype, none, and both
offsets. Both tiers compile and launch the kernel where the answer lives
(``probes.lesson07``): what comes back is its PTX and its outputs, judged here.

07.dw_partial is checked in ``lesson07_dw_partial``.
"""

from __future__ import annotations

import io
import math
import tokenize

# learner_class and report_for: the lesson's cell shows the kernel the checks read, built by
# the same helpers (tests/test_evidence.py); the checks reach them through the probes
from ...lessons.evidence import (  # noqa: F401
    NO_WEIGHT_OFFSET,
    OFFSET,
    grad_flow,
    learner_class,
    report_for,
)
from ..checks import (
    CheckFailed,
    Ptx,
    f32_hex,
    fail_on_error,
)
from ..holes import GRAD_IN_HOLE as HOLE
from ..probes.lesson07 import grad_in_compiled, grad_in_launched
from ..registry import COMPILE, GPU, TIERS, Check, Exercise, mutants, register
from .whole_kernel import check_offset_flow

LESSON = "07_backward"
EPS = 1e-6

# ---- hints shared by both exercises -------------------------------------------------------------
OFFSET_AFTER = (
    "weight_offset is added after the multiply (dout * w + offset): the offset belongs to the "
    "weight, the layer's factor is (w + weight_offset)"
)
NO_OFFSET = (
    "weight_offset never reaches the gradient: the forward multiplied by (w + weight_offset), "
    "and your g leaves the offset out"
)
NO_WEIGHT_IN_G = (
    "the weight never reaches dx: the forward multiplied x_hat by (w + weight_offset), and the "
    "gradient you send back into x_hat leaves the weight out"
)
NO_DOUT_IN_G = (
    "dout never reaches dx: g is the gradient of the loss with respect to x_hat, and without "
    "dout it is not a gradient of anything"
)
OFFSET_WITHOUT_WEIGHT = (
    "w is None there, and your g still carries weight_offset: the offset belongs to the weight "
    "(the layer's factor is w + weight_offset), so a layer without a weight has no factor at "
    "all, whatever weight_offset says"
)
NO_WEIGHT_CASE = (
    "the kernel without a weight (weight=None) does not compile with your code: w is None there"
)

# ---- 07.dx_row --------------------------------------------------------------------------------
#: dx is compared per row with float64 autograd: |dx - ref| <= DX_RTOL * rstd * max|g| of the
#: row. That is dx's natural scale (its two terms are rstd * g and rstd * x_hat * mean(x_hat*g),
#: both <= rstd * max|g| since mean(x_hat^2) <= 1). fp32 arithmetic over a row of N: the mean has
#: a relative error <= N * 2^-24 in the worst case (6e-5 at N = 1000, ~sqrt(N) * 2^-24 = 2e-6
#: typically), the saved fp32 rstd ~1e-7: 1e-4 passes any fp32 order of evaluation, and fails
#: g rounded to bf16 (2^-8 = 4e-3) and every wrong formula (errors of order 1).
DX_RTOL = 1e-4
NO_PROJECTION = (
    "dx has only the direct term rstd * g: rstd depends on every x_j of the row too, and its "
    "derivative adds a second term (the projection of g on x_hat) that yours leaves out"
)
SUM_NOT_MEAN_BWD = (
    "the projection uses the sum of x_hat * g over the row; d rstd / d x_j carries a 1/N (rstd "
    "is of the *mean* of squares): it is the mean, sum / N"
)
X_NOT_XHAT = (
    "the projection is along x (or rstd is missing from it): it is along the normalised row, "
    "x_hat, in both places"
)
NO_OUTER_RSTD = (
    "dx misses the factor rstd in front: every path from x to the output goes through x_hat, "
    "which carries one rstd"
)
NOT_FP32 = (
    "dx is right only to bf16/fp16 precision: compute in fp32 (the kernel's arithmetic), "
    "converting x, dout and w with .float() before any arithmetic; the grader's tolerance is "
    "fp32's"
)
DX_DTYPE = "return dx in float32 (the kernel's accumulator precision), of x's shape"
NOT_DERIVED = (
    "the answer differentiates (torch.autograd, .backward(), requires_grad) or calls a finished "
    "backward: write the formula derived on paper, in torch arithmetic"
)
_FORBIDDEN = {
    "autograd",
    "backward",
    "requires_grad",
    "requires_grad_",
    "rmsnorm_bwd",
    "rmsnorm_bwd_ref",
    "rmsnorm_bwd_tuned",
    "launch_bwd",
    "autograd_bwd",
    "vjp",
    "jacrev",
    "jacfwd",
}


def _dx(x, rstd, g, *, mean=True, proj_x=False, outer=True):
    """dx rows from fp32 x (M, N), rstd (M,), g (M, N), and the known wrong variants of it."""
    r = rstd.float().unsqueeze(-1)
    xh = x.float() * r
    s = (xh * g).sum(dim=-1, keepdim=True)
    c = s / x.shape[-1] if mean else s
    d = g - (x.float() if proj_x else xh) * c
    return r * d if outer else d


def _g(dout, w, off, *, offset_after=False, offset=True, native=False):
    """g = dout * (w + off) in fp32 (native: in the inputs' own dtypes, as torch promotes)."""
    if w is None:
        return dout.float()
    if native:
        return (dout * (w + off)).float()
    d, wf = dout.float(), w.float()
    if offset_after:
        return d * wf + off
    return d * (wf + off) if offset else d * wf


#: known wrong answers: (name, dx from (x, w, dout, rstd, off), hint)
DX_VARIANTS = (
    ("no projection", lambda x, w, d, r, o: r.float().unsqueeze(-1) * _g(d, w, o), NO_PROJECTION),
    ("sum, not mean", lambda x, w, d, r, o: _dx(x, r, _g(d, w, o), mean=False), SUM_NOT_MEAN_BWD),
    ("x, not x_hat", lambda x, w, d, r, o: _dx(x, r, _g(d, w, o), proj_x=True), X_NOT_XHAT),
    ("no outer rstd", lambda x, w, d, r, o: _dx(x, r, _g(d, w, o), outer=False), NO_OUTER_RSTD),
    ("offset after", lambda x, w, d, r, o: _dx(x, r, _g(d, w, o, offset_after=True)), OFFSET_AFTER),
    ("no offset", lambda x, w, d, r, o: _dx(x, r, _g(d, w, o, offset=False)), NO_OFFSET),
    ("no weight", lambda x, w, d, r, o: _dx(x, r, d.float()), NO_WEIGHT_IN_G),
    ("g in bf16", lambda x, w, d, r, o: _dx(x, r, _g(d, w, o, native=True)), NOT_FP32),
)


def dx_scale(x, w, dout, rstd, off):
    """rstd * max|g| per row, (M, 1): the scale the tolerance is relative to."""
    g = _g(dout, w, off)
    return rstd.float().unsqueeze(-1) * g.abs().amax(dim=-1, keepdim=True)


def dx_within(got, ref, scale, rtol: float = DX_RTOL):
    """Elementwise |got - ref| <= rtol * scale (the row's scale), as a Boolean tensor."""
    return (got.double() - ref.double()).abs() <= rtol * scale.double()


def row_inputs(M, N, xdt, wdt, off, gen, device="cpu"):
    """x with rows at different scales (a zero row when M > 2), dout, a weight (small around 0
    with an offset, as Gemma's; around 1 without), rstd as the forward saves it (fp32)."""
    import torch

    from ...reference import rstd_ref
    from ...runtime import torch_dtype

    x = torch.randn(M, N, generator=gen) * 2.0 ** torch.randint(-3, 3, (M, 1), generator=gen)
    if M > 2:
        x[1] = 0.0
    dout = torch.randn(M, N, generator=gen)
    w = None
    if wdt is not None:
        w = (1e-2 if off else 0.5) * torch.randn(N, generator=gen) + (0.0 if off else 1.0)
        w = w.to(device, torch_dtype(wdt))
    x, dout = x.to(device, torch_dtype(xdt)), dout.to(device, torch_dtype(xdt))
    return x, w, dout, rstd_ref(x, EPS)


#: (M, N, x/dout dtype, weight dtype or None, weight_offset) of the visible compile-tier cases
DX_CASES = (
    (37, 1000, "bf16", "bf16", 0.0),
    (37, 1000, "bf16", "fp32", 1.0),
    (5, 64, "fp32", "fp32", 1.0),
    (3, 100, "bf16", None, 0.0),
    (1, 4096, "fp16", "fp16", 1.0),
)


def _dx_cases(ctx, hidden: bool):
    if not hidden:
        return list(DX_CASES)
    from ..checks import HIDDEN_N

    rng = ctx.rng("dx cases")
    return [
        (
            rng.choice((3, 131)),
            rng.choice(HIDDEN_N),
            rng.choice(("bf16", "fp16", "fp32")),
            rng.choice((None, "bf16", "fp16", "fp32")),
            rng.choice((0.0, 1.0)),
        )
        for _ in range(6)
    ]


def _diagnose_dx(results) -> str | None:
    """results: [(got, x, w, dout, rstd, off, scale)]. The hint of the first known wrong formula
    that matches the answer in every case, else the precision hint when the answer is right to
    a bf16 tolerance only."""
    for _, fn, hint in DX_VARIANTS:
        if all(
            bool(dx_within(got, fn(x, w, d, r, o).to(got.device), s).all())
            for got, x, w, d, r, o, s in results
        ):
            return hint
    # right to a bf16 tolerance (2^-6 of the row's scale) but not to fp32's: the arithmetic
    for got, x, w, d, r, o, s in results:
        if not bool(dx_within(got, _dx(x, r, _g(d, w, o)).to(got.device), s, 2e-2).all()):
            return None
    return NOT_FP32


def _check_dx(ctx, cases, device: str):
    """Run the answer on each case (on ``device``) and compare with float64 autograd; raises
    CheckFailed with the case, the worst element and a hint."""
    import torch

    from ...lessons.bwd_strategies import autograd_bwd

    gen = ctx.torch_generator(salt="dx inputs")
    results = []
    first_bad = None
    for M, N, xdt, wdt, off in cases:
        x, w, dout, rstd = row_inputs(M, N, xdt, wdt, off, gen, device)
        got = ctx.call(x, w, dout, rstd, off)
        what = f"M={M} N={N} x {xdt}, weight {wdt or 'None'}, weight_offset={off}"
        if not torch.is_tensor(got) or tuple(got.shape) != (M, N):
            raise CheckFailed(
                f"{what}: dx_row returned {type(got).__name__}"
                + (f" of shape {tuple(got.shape)}" if torch.is_tensor(got) else ""),
                expected=f"a float32 tensor of shape ({M}, {N})",
                seen=str(getattr(got, "shape", type(got).__name__)),
                hint=DX_DTYPE,
            )
        if got.dtype != torch.float32 or got.device != x.device:
            raise CheckFailed(
                f"{what}: dx is {got.dtype} on {got.device}",
                expected=f"torch.float32 on {x.device}",
                seen=f"{got.dtype} on {got.device}",
                hint=DX_DTYPE,
            )
        ref, _, _ = autograd_bwd(x, w, dout, EPS, off)  # float64, x's device
        scale = dx_scale(x, w, dout, rstd, off)
        ok = dx_within(got, ref, scale)
        results.append((got, x, w, dout, rstd, off, scale))
        if first_bad is None and not bool(ok.all()):
            err = (got.double() - ref).abs() / scale.double()
            idx = int(err.flatten().argmax())
            row, col = divmod(idx, N)
            first_bad = (
                what,
                row,
                col,
                ref[row, col].item(),
                got[row, col].item(),
                int((~ok).sum()),
            )
    if first_bad is not None:
        what, row, col, exp, seen, nbad = first_bad
        raise CheckFailed(
            f"{what}: {nbad} of dx's elements differ from float64 autograd by more than "
            f"{DX_RTOL:g} x rstd * max|g| of their row (seed {ctx.seed})",
            expected=f"{exp:.7g} at row {row}, column {col}",
            seen=f"{seen:.7g}",
            hint=_diagnose_dx(results),
        )
    return len(cases)


def _not_derived(hidden: bool = False) -> Check:
    def fn(ctx):
        from ..checks import answer_source

        src = answer_source(ctx.answer) or ""
        names = set()
        try:
            for tok in tokenize.generate_tokens(io.StringIO(src).readline):
                if tok.type == tokenize.NAME:
                    names.add(tok.string)
        except (tokenize.TokenError, IndentationError, SyntaxError):
            pass
        found = sorted(names & _FORBIDDEN)
        if found:
            raise CheckFailed(
                f"the answer uses {', '.join(found)}",
                expected="dx from the derived formula, in torch arithmetic",
                seen=", ".join(found),
                hint=NOT_DERIVED,
            )
        return "no autograd, no finished backward"

    return Check("derived by hand (no autograd, no finished backward)", COMPILE, fn, hidden)


def _dx_values(hidden: bool) -> Check:
    def fn(ctx):
        n = _check_dx(ctx, _dx_cases(ctx, hidden), "cpu")
        return f"{n} cases match float64 autograd within {DX_RTOL:g} x rstd * max|g| per row"

    name = (
        "random shapes and dtypes vs float64 autograd (grading seed)"
        if hidden
        else "dx vs float64 autograd on the CPU (5 cases: dtypes, weights, offsets)"
    )
    return Check(
        name, COMPILE, fn, hidden, ("derived by hand (no autograd, no finished backward)",)
    )


def _dx_gpu(hidden: bool) -> Check:
    def run(ctx):
        import torch

        from ...reference import TOLERANCES
        from ...rmsnorm import rmsnorm_bwd
        from ..checks import HIDDEN_M, VISIBLE_M

        Ms = HIDDEN_M if hidden else VISIBLE_M
        N = ctx.rng("N").choice((773, 1531, 3001)) if hidden else 1000
        cases = [
            (M, N, "bf16", wdt, off) for M in Ms for wdt, off in (("bf16", 0.0), ("fp32", 1.0))
        ]
        n = _check_dx(ctx, cases, "cuda")
        # the same inputs through the kernel: its dx (bf16) is the formula rounded to bf16
        gen = ctx.torch_generator(salt="dx inputs")
        for M, N_, xdt, wdt, off in cases:
            x, w, dout, rstd = row_inputs(M, N_, xdt, wdt, off, gen, "cuda")
            mine = ctx.call(x, w, dout, rstd, off)
            kernel_dx = rmsnorm_bwd(x, w, dout, rstd, weight_offset=off)[0]
            torch.cuda.synchronize()
            scale = dx_scale(x, w, dout, rstd, off)
            tol = TOLERANCES[torch.bfloat16]["rtol"]
            diff = (kernel_dx.double() - mine.double()).abs()
            if not bool((diff <= tol * mine.double().abs() + DX_RTOL * scale.double()).all()):
                raise CheckFailed(
                    f"M={M} N={N_} weight {wdt}: your dx and the kernel's (rmsnorm_bwd) differ "
                    "beyond bf16 rounding",
                    expected="the kernel's dx = yours rounded to bf16",
                    seen=f"max difference {diff.max().item():.4g}",
                    hint=_diagnose_dx([(mine, x, w, dout, rstd, off, scale)]),
                )
        return f"{n} CUDA cases match float64 autograd and the kernel's dx"

    name = (
        "on the GPU: more shapes, grading seed"
        if hidden
        else "on the GPU: vs float64 autograd and the kernel's dx (M in 1/37/199, N=1000)"
    )
    return Check(name, GPU, run, hidden)


# BEGIN KEY
# fmt: off
DX_ROW_MUTANTS = mutants(TIERS,
    ("no projection term", "only the direct term", "rstd * (g - x_hat * c)", "rstd * g"),
    ("sum, not mean", "it is the mean, sum / N",
     ".mean(dim=-1, keepdim=True)", ".sum(dim=-1, keepdim=True)"),
    ("offset added after the multiply", "added after the multiply",
     "dout * (w.float() + weight_offset)", "dout * w.float() + weight_offset"),
    ("g in the inputs' dtype", "compute in fp32", [
        ("x, dout = x.float(), dout.float()", "dout = dout"),
        ("dout * (w.float() + weight_offset)", "dout * (w + weight_offset)"),
    ]),
)
# fmt: on
# END KEY

dx_row = register(
    Exercise(
        id="07.dx_row",
        # derived by hand: differentiating is reaching the finished backward (at run time, by
        # whatever name: the screen's _FORBIDDEN only reads the names the cell spells)
        finished=(
            "torch.autograd.grad",
            "torch.autograd.backward",
            "torch.Tensor.backward",
            "torch.func.vjp",
            "torch.func.grad",
            "torch.func.jacrev",
            "torch.func.jacfwd",
        ),
        lesson=LESSON,
        answer="dx_row",
        title="dx of RMSNorm rows by hand: rstd * (g - x_hat * mean(x_hat * g)), in fp32",
        points={COMPILE: 1, GPU: 1},
        mutants=DX_ROW_MUTANTS,
    )
)
dx_row.add(_not_derived(), _dx_values(hidden=False), _dx_values(hidden=True))
dx_row.add(_dx_gpu(hidden=False), _dx_gpu(hidden=True))


# ---- 07.grad_in -------------------------------------------------------------------------------
# OFFSET (``lessons.evidence``): Gemma's 1.0, recognisable as the fp32 constant 0f3F800000
#: the compile tier's dtypes: each operand of g recognisable by its conversion
X_DTYPE, W_DTYPE, DOUT_DTYPE = "fp32", "bf16", "fp16"
COMPILES = "compiles (x fp32, weight bf16, dout fp16, weight_offset=1.0)"
PROBE = "the PTX: dx from dout * (w + 1.0)"
#: after the probe: a wrong g is reported without compiling a second kernel
COMPILES_NO_WEIGHT = "compiles without a weight (w is None)"
# NO_WEIGHT_OFFSET (``lessons.evidence``): the no-weight kernel's, 0.375, which must not reach dx
PROBE_NO_WEIGHT = "the PTX without a weight: dx from dout alone (weight_offset=0.375 unused)"


#: the compile tier's row length (g does not depend on N)
GRAD_N = 1000


def _grad_report(ctx, weighted: bool = True) -> dict:
    """The PTX, registers and spills of the backward with the learner's grad_in (with a weight:
    x fp32, weight bf16, dout fp16, weight_offset 1.0; without: weight_offset NO_WEIGHT_OFFSET),
    compiled where the answer lives (``probes.lesson07.grad_in_compiled``, the kernel
    ``lessons.evidence.report_for`` shows), once a run."""
    key = ("07.grad_in report", GRAD_N, weighted)
    if key not in ctx.cache:
        data = ctx.probe(grad_in_compiled, GRAD_N, weighted)
        if not isinstance(data, dict) or not isinstance(data.get("ptx"), str):
            raise CheckFailed("the learner's process sent no PTX back")
        ctx.cache[key] = data
    return ctx.cache[key]


def _grad_compiles(weighted: bool = True) -> Check:
    def fn(ctx):
        N = GRAD_N
        what = f"x {X_DTYPE}, weight {W_DTYPE}, dout {DOUT_DTYPE}" if weighted else "no weight"
        with fail_on_error(
            f"the backward kernel with your grad_in does not compile ({what}, N={N})",
            hint=None if weighted else NO_WEIGHT_CASE,
        ):
            rep = _grad_report(ctx, weighted)
        spills = int(rep["spill_store_bytes"]) + int(rep["spill_load_bytes"])
        return f"N={N}: {int(rep['registers'])} registers, {spills} B of spills"

    if not weighted:
        return Check(COMPILES_NO_WEIGHT, COMPILE, fn, needs=(PROBE,))
    return Check(COMPILES, COMPILE, fn)


def _probe_grad(ptx_text: str) -> str:
    flow = grad_flow(ptx_text)
    expected = "dx built from dout * (w + 1.0): the weight, dout and the offset (added to w)"
    seen = ", ".join(k for k in ("weight", "dout", "offset") if flow[k])
    if not flow["weight"]:
        raise CheckFailed(
            "the weight (cvt.f32.bf16) reaches no dx store",
            expected=expected,
            seen="no dx store depends on the weight",
            hint=NO_WEIGHT_IN_G,
        )
    if not flow["dout"]:
        raise CheckFailed(
            "a dx store depends on the weight but not on dout (cvt.f32.f16)",
            expected=expected,
            seen=f"dx depends on {seen}",
            hint=NO_DOUT_IN_G,
        )
    check_offset_flow(
        flow,
        "dx",
        offset=OFFSET,
        depends_on="dout",
        multiplies="dout",
        missing=NO_OFFSET,
        late=OFFSET_AFTER,
    )
    return "dx depends on dout * (w + 1.0): the weight, dout, the offset added to w"


def offset_in_dx(ptx_text: str, off: float = NO_WEIGHT_OFFSET) -> list[str]:
    """The instructions among the dx stores' inputs that use the offset (``off``, ``1 + off``,
    ``1 - off`` or ``-off`` as an fp32 immediate)."""
    ptx = Ptx(ptx_text)
    consts = {f32_hex(v) for v in (off, 1 + off, 1 - off, -off)}
    seen = []
    for st in (i for i in ptx.instrs if i.opcode.startswith("st.global")):
        for a in ptx.ancestors(st):
            if any(k in o for o in a.operands for k in consts) and a.text not in seen:
                seen.append(a.text)
    return seen


def _grad_probe_no_weight() -> Check:
    def fn(ctx):
        used = offset_in_dx(_grad_report(ctx, weighted=False)["ptx"])
        if used:
            raise CheckFailed(
                f"without a weight, weight_offset={NO_WEIGHT_OFFSET} still reaches dx",
                expected="g = dy: no weight, so no (w + weight_offset) factor",
                seen=used[0],
                hint=OFFSET_WITHOUT_WEIGHT,
            )
        return "without a weight, g is dout alone (the offset never reaches dx)"

    return Check(PROBE_NO_WEIGHT, COMPILE, fn, needs=(COMPILES_NO_WEIGHT,))


def _grad_probe() -> Check:
    def fn(ctx):
        return _probe_grad(_grad_report(ctx)["ptx"])

    return Check(PROBE, COMPILE, fn, needs=(COMPILES,))


#: (x dtype, weight dtype or None, weight_offset) of the gpu value cases
GRAD_CASES = (
    ("bf16", "bf16", 0.0),
    ("bf16", "fp32", OFFSET),
    ("fp16", "fp16", OFFSET),
    ("fp32", "fp32", 0.0),
    ("bf16", None, 0.0),
    ("bf16", None, OFFSET),  # no weight: the offset must not reach g
)

#: known wrong g's as functions of fp32 (dout, w, off), and their hints
G_VARIANTS = (
    ("offset after", lambda d, w, o: d * w + o, OFFSET_AFTER),
    ("no offset", lambda d, w, o: d * w, NO_OFFSET),
    ("no weight", lambda d, w, o: d, NO_WEIGHT_IN_G),
    ("no dout", lambda d, w, o: (w + o).expand_as(d), NO_DOUT_IN_G),
)


def _diagnose_grad(dx, x, w, dout, rstd, off, scale) -> str | None:
    if w is None:
        if off == 0.0:
            return None
        cand = _dx(x.float().cpu(), rstd.cpu(), dout.float().cpu() * (1 + off))
        if bool(dx_within(dx.float().cpu(), cand, scale.cpu(), 2e-2).all()):
            return OFFSET_WITHOUT_WEIGHT
        return None
    d, wf = dout.float().cpu(), w.float().cpu()
    for _, fn, hint in G_VARIANTS:
        cand = _dx(x.float().cpu(), rstd.cpu(), fn(d, wf, off))
        if bool(dx_within(dx.float().cpu(), cand, scale.cpu(), 2e-2).all()):
            return hint
    return None


def _grad_values(hidden: bool) -> Check:
    def fn(ctx):
        import torch

        from ...reference import TOLERANCES, rmsnorm_bwd_ref
        from ..checks import HIDDEN_M, VISIBLE_M

        gen = ctx.torch_generator(salt="grad values" + str(hidden))
        n = 0
        for xdt, wdt, off in GRAD_CASES:
            N = ctx.hidden_N(HOLE, xdt) if hidden else 1000
            for M in HIDDEN_M if hidden else VISIBLE_M:
                x, w, dout, rstd = row_inputs(M, N, xdt, wdt, off, gen, "cuda")
                # launched where the answer lives, dx NaN before (probes.lesson07)
                got = ctx.probe(grad_in_launched, x, w, dout, rstd, off)
                dx, dw_p = got if isinstance(got, tuple | list) and len(got) == 2 else (None, None)
                if not torch.is_tensor(dx) or tuple(dx.shape) != tuple(x.shape):
                    raise CheckFailed("the learner's process sent no dx back")
                dx = dx.to(x.device)
                ex, ew, _ = rmsnorm_bwd_ref(
                    x, w, dout, rstd, compute_dtype=torch.float64, weight_offset=off
                )
                scale = dx_scale(x, w, dout, rstd, off)
                tol = TOLERANCES[x.dtype]
                # dx is rounded to x's dtype: the table's rtol, plus fp32's error at the row scale
                ok = (dx.double() - ex).abs() <= tol["rtol"] * ex.abs() + DX_RTOL * scale.double()
                what = (
                    f"{xdt} M={M} N={N}, weight {wdt or 'None'}, weight_offset={off} "
                    f"(seed {ctx.seed})"
                )
                if not bool(ok.all()):
                    idx = int((~ok).flatten().nonzero()[0])
                    row, col = divmod(idx, N)
                    raise CheckFailed(
                        f"{what}: {int((~ok).sum())} of {M * N} dx elements differ from "
                        "rmsnorm_bwd_ref",
                        expected=f"{ex[row, col].item():.6g} at row {row}, column {col}",
                        seen=f"{dx[row, col].item():.6g}",
                        hint=_diagnose_grad(dx, x, w, dout, rstd, off, scale),
                    )
                if w is not None:  # dw does not go through grad_in; checked all the same
                    if not torch.is_tensor(dw_p) or dw_p.dim() != 2 or dw_p.shape[1] != N:
                        raise CheckFailed("the learner's process sent no dw partials back")
                    dw = dw_p.to(ew.device).sum(dim=0).double()
                    wt = TOLERANCES[torch.float32]
                    if not torch.allclose(
                        dw, ew, rtol=wt["rtol"], atol=wt["atol"] * math.sqrt(M) * 10
                    ):
                        raise CheckFailed(
                            f"{what}: dw (the partial sums' total) differs from rmsnorm_bwd_ref",
                            expected=f"max |dw| {ew.abs().max().item():.6g}",
                            seen=f"max error {(dw - ew).abs().max().item():.3g}",
                        )
                n += 1
        return f"{n} cases: dx and dw match rmsnorm_bwd_ref (weights bf16/fp16/fp32/None)"

    name = (
        "values vs rmsnorm_bwd_ref at more shapes, grading seed"
        if hidden
        else "dx and dw vs rmsnorm_bwd_ref (M in 1/37/199, N=1000, weights and offsets)"
    )
    return Check(name, GPU, fn, hidden, (COMPILES,))


# BEGIN KEY
# fmt: off
GRAD_IN_MUTANTS = [
    *mutants(TIERS,
        ("offset added after the multiply", "added after the multiply",
         "dy * (w + weight_offset)", "dy * w + weight_offset"),
        ("offset forgotten", "weight_offset never reaches the gradient",
         "dy * (w + weight_offset)", "dy * w"),
        ("weight ignored", "the weight never reaches dx",
         "return dy * (w + weight_offset)", "return dy"),
        ("the offset applied without a weight", "the offset belongs to the weight",
         "        return dy\n", "        return dy * (1 + weight_offset)\n"),
    ),
    *mutants(COMPILE,
        ("no case for a missing weight", "w is None there",
         "    if w is None:\n        return dy\n", ""),
    ),
]
# fmt: on
# END KEY

grad_in = register(
    Exercise(
        id="07.grad_in",
        finished=("quack_edu.stages.final_bwd.FinalBwdRMSNorm.grad_in",),
        lesson=LESSON,
        answer="grad_in",
        title="the backward kernel's g = dout * (w + weight_offset), in fp32",
        points={COMPILE: 1, GPU: 1},
        mutants=GRAD_IN_MUTANTS,
    )
)
# No compile-tier check at a random N: the piece does not depend on N (the kernel around it
# does, and the gpu tier's hidden check runs it at random ragged N); each compile of the
# backward costs ~1-2 s on a 2-core CI machine.
grad_in.add(
    _grad_compiles(),
    _grad_probe(),
    _grad_compiles(weighted=False),
    _grad_probe_no_weight(),
    _grad_values(hidden=False),
    _grad_values(hidden=True),
)
