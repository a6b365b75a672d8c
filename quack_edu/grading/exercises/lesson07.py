"""Lesson 07, the backward: the gradient of a row by hand, the atomic dw, and the dw partials.

07.dx_row   dx of RMSNorm rows in torch, fp32, from the saved rstd, derived by hand:
            rstd * (g - x_hat * mean(x_hat * g)) with g = dout * (w + weight_offset)
07.red_add  strategy 1's add of a vector of fp32 partial sums into the one dw row, with atomic
            adds (``red.global.add.f32``), in lesson 07's atomic backward: ``lesson07_atomic``
07.dw_partial  the persistent CTA's dw: its accumulation (dout * x_hat, fp32, across its row
            blocks) and its partial store (the CTA's rows added in order through shared memory,
            one plain-stored row a CTA): two functions, made methods of the backward kernel:
            ``lesson07_dw_partial``

07.dx_row's compile tier runs the answer on the CPU and compares it with torch.autograd of the
forward in float64 (``bwd_strategies.autograd_bwd``), with a tolerance per row (``DX_RTOL``,
explained there); a known wrong formula that matches every case gives its hint. The answer's
source must not differentiate (autograd) nor call a finished backward. Its gpu tier runs the
answer on CUDA tensors against float64 autograd and against the kernel's own dx
(``quack_edu.rmsnorm_bwd``).
"""

from __future__ import annotations

import io
import tokenize

from ..checks import CheckFailed
from ..registry import COMPILE, GPU, TIERS, Check, Exercise, mutants, register

LESSON = "07_backward"
EPS = 1e-6

# ---- hints of a wrong g (dx_row's known wrong formulas) ----------------------------------------
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
SAVED_RSTD = (
    "dx does not follow the rstd it is given: the backward reads the rstd the forward saved "
    "and never recomputes it from x (nor evaluates the forward again). Write dx from x, dout, "
    "w and that rstd"
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


def _check_saved_rstd(ctx, device: str) -> int:
    """The answer is given an rstd that is not x's own (each row's scaled by 1/2 to 2): its dx
    must be the formula of *that* rstd. An answer that differentiates the forward numerically
    (finite differences, a complex step) recomputes rstd from x and misses it (red team 18)."""
    import torch

    gen = ctx.torch_generator(salt="saved rstd")
    for M, N, xdt, wdt, off in ((37, 1000, "bf16", "fp32", 1.0), (5, 64, "fp32", None, 0.0)):
        x, w, dout, rstd = row_inputs(M, N, xdt, wdt, off, gen, device)
        c = torch.tensor((0.5, 0.75, 1.5, 2.0), device=device)[
            torch.randint(0, 4, (M,), generator=gen).to(device)
        ]
        given = rstd * c
        got = ctx.call(x, w, dout, given, off)
        if not torch.is_tensor(got) or tuple(got.shape) != (M, N):
            raise CheckFailed(f"M={M} N={N}: dx_row returned no ({M}, {N}) tensor", hint=DX_DTYPE)
        g = _g(dout, w, off).double()
        ref = _dx(x.double(), given.double(), g)
        # the projection term grows as c^2: the tolerance with it
        scale = dx_scale(x, w, dout, given, off) * c.unsqueeze(-1).clamp(min=1.0) ** 2
        if not bool(dx_within(got.to(ref.device), ref, scale).all()):
            raise CheckFailed(
                f"M={M} N={N}: given an rstd scaled by 1/2 to 2 per row, your dx is not the "
                "formula's for that rstd",
                expected="dx computed from the rstd argument",
                seen="dx that ignores it (rstd recomputed from x?)",
                hint=SAVED_RSTD,
            )
    return 2


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


def _uses_saved_rstd() -> Check:
    def fn(ctx):
        n = _check_saved_rstd(ctx, "cpu")
        return f"{n} cases follow the rstd given (not x's own)"

    needs = ("dx vs float64 autograd on the CPU (5 cases: dtypes, weights, offsets)",)
    return Check(
        "dx from the rstd it is given (the forward's saved rstd)", COMPILE, fn, False, needs
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
        _check_saved_rstd(ctx, "cuda")
        return f"{n} CUDA cases match float64 autograd and the kernel's dx, and follow rstd"

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
            # forward mode too (red team 16: one jvp of the unweighted norm, whose Jacobian is
            # symmetric, in the direction (w + offset) * dout)
            "torch.func.jvp",
            "torch.func.linearize",
            "torch.func.hessian",
            "torch.autograd.forward_ad.make_dual",
            "torch.autograd.forward_ad.unpack_dual",
            "torch.autograd.functional.jvp",
            "torch.autograd.functional.vjp",
            "torch.autograd.functional.jacobian",
            # the library's backward kernel, compiled and run by the answer (red team 19)
            "quack_edu.stages.final_bwd.FinalBwdRMSNorm.kernel",
            "quack_edu.stages.final_bwd.FinalBwdRMSNorm.__call__",
        ),
        autograd_off=True,  # (red team 17: the C engine on an nn.Parameter)
        lesson=LESSON,
        answer="dx_row",
        title="dx of RMSNorm rows by hand, in fp32, from the forward's rstd",
        points={COMPILE: 1, GPU: 1},
        mutants=DX_ROW_MUTANTS,
    )
)
dx_row.add(_not_derived(), _dx_values(hidden=False), _uses_saved_rstd(), _dx_values(hidden=True))
dx_row.add(_dx_gpu(hidden=False), _dx_gpu(hidden=True))
