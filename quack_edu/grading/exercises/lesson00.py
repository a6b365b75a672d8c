"""Lesson 00, setup and roofline: four host-side exercises (compile tier: they run anywhere).

00.bytes_moved       bytes a fused RMSNorm must move
00.roofline_time_us  the roofline's lower bound on time
00.eager_rmsnorm     RMSNorm the eager way, from separate PyTorch ops
00.eager_bytes       bytes that eager version moves (8 kernels, fp32 intermediates)
"""

from __future__ import annotations

import torch

from .. import hints
from ..checks import Context, value_check
from ..hints import Variant
from ..registry import COMPILE, CheckFailed, Exercise, mutants, register

LESSON = "00_setup_and_roofline"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _size(dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


def _shape_cases(ctx: Context, hidden: bool):
    """Fixed shapes (and two random ones); the hidden check draws eight with the grading seed."""
    rng = ctx.rng("hidden shapes" if hidden else "shapes")
    extra = [
        (rng.randint(1, 70000), rng.randint(1, 40000), rng.choice(DTYPES))
        for _ in range(8 if hidden else 2)
    ]
    if hidden:
        return extra
    return [
        (4096, 4096, torch.bfloat16),
        (1, 1000, torch.float32),
        (37, 1000, torch.float16),
        (32768, 8192, torch.bfloat16),
        (199, 773, torch.float32),
    ] + extra


# ---- 00.bytes_moved ---------------------------------------------------------------------------
# BEGIN KEY
def bytes_moved_ref(M, N, dtype):
    from ...tools.bench import rmsnorm_bytes  # the byte count every GB/s in the project uses

    return rmsnorm_bytes(M, N, dtype)


# fmt: off
BYTES_MOVED_MUTANTS = mutants(COMPILE,
    ("forgets the write of y", "both", "2 * M * N * size", "M * N * size"),
    ("bits for bytes", "bits", ".element_size()", ".element_size() * 8"),
    ("forgets the weight", "weight", " + N * size", ""),
    ("the weight in fp32", "the weight has x's dtype", " + N * size", " + N * 4"),
)
# fmt: on
# END KEY

bytes_moved = register(
    Exercise(
        id="00.bytes_moved",
        # the library's byte counts, the backward's too (red team 13: its count less the
        # backward's extra terms scored 1/1)
        finished=(
            "quack_edu.tools.timing.rmsnorm_bytes",
            "quack_edu.tools.timing.rmsnorm_bwd_bytes",
            "quack_edu.lessons.roofline.traffic",  # it measures a sequence (red team 21)
        ),
        lesson=LESSON,
        answer="bytes_moved",
        title="bytes a fused RMSNorm must move: bytes_moved(M, N, dtype)",
        points={COMPILE: 1},
        mutants=BYTES_MOVED_MUTANTS,
    )
)
# BEGIN KEY
_BYTES_VARIANTS = [
    Variant(
        "reads only",
        lambda M, N, d: M * N * _size(d) + N * _size(d),
        "count the output too: y is written, M*N elements, as many bytes as x is read "
        "(reads and writes both move bytes)",
    ),
    Variant(
        "no weight",
        lambda M, N, d: 2 * M * N * _size(d),
        "the weight vector is read too: N more elements (small, but it is traffic)",
    ),
    Variant(
        "bits",
        lambda M, N, d: 8 * bytes_moved_ref(M, N, d),
        "off by a factor of 8: bits where bytes are meant (element_size() is in bytes)",
    ),
    Variant(
        "weight in fp32",
        lambda M, N, d: 2 * M * N * _size(d) + 4 * N,
        "the weight has x's dtype here (one dtype for x, y and w, as the exercise says): N * "
        "element_size bytes, not 4 * N. An fp32 weight beside bf16 x is an option of later "
        "kernels, not of this count",
    ),
    *(
        Variant(
            f"{size} bytes an element whatever the dtype",
            lambda M, N, d, size=size: (2 * M * N + N) * size,
            "the element size is the dtype's, not a constant: bf16 and fp16 take 2 bytes an "
            "element, fp32 takes 4",
        )
        for size in (2, 4)
    ),
    Variant(
        "x read twice",
        lambda M, N, d: 3 * M * N * _size(d) + N * _size(d),
        "a fused kernel reads x once (the row stays on chip between the two passes): "
        "count the minimum traffic",
    ),
]
# END KEY
bytes_moved.add(
    value_check(
        "a fused RMSNorm's bytes at the lesson's shapes and dtypes",
        bytes_moved_ref,
        _shape_cases,
        variants=_BYTES_VARIANTS,
    )
)
# BEGIN HIDDEN
bytes_moved.add(
    value_check(
        "random shapes (grading seed)",
        bytes_moved_ref,
        _shape_cases,
        variants=_BYTES_VARIANTS,
        hidden=True,
    )
)
# END HIDDEN


# ---- 00.roofline_time_us ----------------------------------------------------------------------
# BEGIN KEY
def roofline_ref(nbytes, flops, gbps, tflops):
    return max(nbytes / (gbps * 1e9), flops / (tflops * 1e12)) * 1e6


# END KEY


def _roofline_cases(ctx: Context, hidden: bool):
    rng = ctx.rng("hidden roof" if hidden else "roof")
    rand = [
        (
            rng.uniform(1e5, 1e10),
            rng.uniform(1e5, 1e13),
            rng.uniform(1e3, 5e3),
            rng.uniform(10, 1000),
        )
        for _ in range(8 if hidden else 2)
    ]
    if hidden:
        return rand
    return rand + [
        (4 * 4096 * 4096, 4 * 4096 * 4096, 4270.0, 67.0),  # RMSNorm: memory-bound
        (3 * 2 * 4096 * 4096, 2 * 4096**3, 4800.0, 989.0),  # a GEMM: compute-bound
        (1e9, 206e9, 4800.0, 989.0),  # at the ridge: both bounds equal
        (2e9, 10e12, 3350.0, 67.0),  # compute-bound on CUDA cores
        (1e6, 1e6, 4800.0, 989.0),
    ]


# BEGIN KEY
# fmt: off
ROOFLINE_TIME_US_MUTANTS = mutants(COMPILE,
    ("min, not max", "larger", "max(", "min("),
    ("milliseconds", "unit", "* 1e6", "* 1e3"),
    ("adds the two", "overlap", "max(t_memory, t_compute)", "(t_memory + t_compute)"),
)
# fmt: on
# END KEY

roofline = register(
    Exercise(
        id="00.roofline_time_us",
        lesson=LESSON,
        answer="roofline_time_us",
        title="the roofline bound: roofline_time_us(nbytes, flops, gbps, tflops)",
        points={COMPILE: 1},
        mutants=ROOFLINE_TIME_US_MUTANTS,
    )
)
# BEGIN KEY
_ROOF_VARIANTS = [
    Variant(
        "sum",
        lambda b, f, g, t: (b / (g * 1e9) + f / (t * 1e12)) * 1e6,
        "memory and math overlap (other warps compute while some wait on memory): the "
        "bound is the larger of the two times, not their sum",
    ),
    Variant(
        "min",
        lambda b, f, g, t: min(b / (g * 1e9), f / (t * 1e12)) * 1e6,
        "the slower of the two bounds the kernel: take the larger time, not the smaller",
    ),
    Variant(
        "memory only",
        lambda b, f, g, t: b / (g * 1e9) * 1e6,
        "compute can bound too: take the larger of the memory time and flops / peak",
    ),
]
# END KEY
roofline.add(
    value_check(
        "memory-bound, compute-bound and ridge cases",
        roofline_ref,
        _roofline_cases,
        variants=_ROOF_VARIANTS,
    )
)
# BEGIN HIDDEN
roofline.add(
    value_check(
        "random cases (grading seed)",
        roofline_ref,
        _roofline_cases,
        variants=_ROOF_VARIANTS,
        hidden=True,
    )
)
# END HIDDEN


# ---- 00.eager_rmsnorm -------------------------------------------------------------------------
# BEGIN KEY
def eager_rmsnorm_ref(x, w, eps=1e-6):
    """The eager sequence lesson 00 counts: x.float(), pow, mean, add, rsqrt, mul, mul, to."""
    xf = x.float()
    ms = xf.pow(2).mean(dim=-1, keepdim=True)
    rstd = torch.rsqrt(ms + eps)
    y = xf * rstd * w
    return y.to(x.dtype)


# fmt: off
EAGER_RMSNORM_MUTANTS = mutants(COMPILE,
    ("calls torch's RMSNorm", "library RMSNorm",
     "    xf = x.float()\n",
     "    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)\n"
     "    xf = x.float()\n"),
    ("forgets eps", "eps", "ms + eps", "ms"),
    ("returns fp32", "dtype", "return y.to(x.dtype)", "return y"),
    ("mean over rows", "last dim", "dim=-1", "dim=0"),
    ("casts back before the weight (Llama's order)", "cast back last",
     "    y = xf * rstd * w\n    return y.to(x.dtype)",
     "    y = (xf * rstd).to(x.dtype)\n    return y * w"),
)
# fmt: on
# END KEY

eager = register(
    Exercise(
        id="00.eager_rmsnorm",
        copy_of=("quack_edu.reference.rmsnorm_ref",),  # (a tripwire everywhere: worker.py)
        lesson=LESSON,
        answer="eager_rmsnorm",
        title="RMSNorm from separate PyTorch ops (what eager mode runs): eager_rmsnorm(x, w, eps)",
        points={COMPILE: 1},
        mutants=EAGER_RMSNORM_MUTANTS,
    )
)


def _eager_inputs(ctx: Context, salt: str, shapes):
    g = ctx.torch_generator(salt=salt)
    for dtype in DTYPES:
        for M, N in shapes:
            x = torch.randn(M, N, generator=g) * 2.0 ** torch.randint(-10, 4, (M, 1), generator=g)
            if M > 2:
                x[1] = 0
            w = 1 + 0.5 * torch.randn(N, generator=g)
            yield x.to(dtype), w.to(dtype)


def _eager_values(shapes, salt):
    def fn(ctx: Context):
        from ...reference import TOLERANCES, rmsnorm_ref

        n = 0
        for x, w in _eager_inputs(ctx, salt, shapes(ctx)):
            y = ctx.call(x.clone(), w.clone(), 1e-6)
            where = f"x {tuple(x.shape)} {str(x.dtype).replace('torch.', '')}"
            if not isinstance(y, torch.Tensor):
                raise CheckFailed(
                    f"{where}: did not return a tensor",
                    expected="a torch.Tensor",
                    seen=type(y).__name__,
                )
            if y.shape != x.shape:
                hint = (
                    "reduce over the last dim (dim=-1, keepdim=True): one mean per row"
                    if y.numel() != x.numel()
                    else None
                )
                raise CheckFailed(
                    f"{where}: wrong shape", expected=tuple(x.shape), seen=tuple(y.shape), hint=hint
                )
            if y.dtype != x.dtype:
                raise CheckFailed(
                    f"{where}: wrong dtype",
                    expected=x.dtype,
                    seen=y.dtype,
                    hint="return the input's dtype: compute in fp32, then .to(x.dtype) "
                    "(that cast is one of the eager kernels)",
                )
            ref = rmsnorm_ref(x, w, eps=1e-6)
            tol = TOLERANCES[x.dtype]
            if not torch.allclose(y.float(), ref, **tol):
                bad = ~torch.isclose(y.float(), ref, **tol)
                idx = bad.nonzero()[0].tolist()
                variants = (
                    hints.NO_EPS_V,
                    hints.SUM_NOT_MEAN_V,
                    hints.SQRT_V,
                    hints.NO_WEIGHT_V,
                    hints.EPS_OUTSIDE_V,
                    Variant(
                        "mean over dim 0",
                        lambda x, w, eps: (
                            x.float()
                            * torch.rsqrt(x.float().pow(2).mean(0, keepdim=True) + eps)
                            * w.float()
                        ),
                        "reduce over the last dim (dim=-1, keepdim=True): one mean per row",
                    ),
                )
                hint = hints.diagnose_rmsnorm(y, ref, x, w, 1e-6, tol=tol, variants=variants)
                raise CheckFailed(
                    f"{where}: {int(bad.sum())} of {y.numel()} values differ from rmsnorm_ref",
                    expected=f"{ref[tuple(idx)].item():.6g} at {idx}",
                    seen=f"{y[tuple(idx)].float().item():.6g}",
                    hint=hint,
                )
            n += 1
        return f"{n} inputs (3 dtypes) match rmsnorm_ref"

    return fn


eager.check("values vs rmsnorm_ref (M in 1/37/199, N=1000, 3 dtypes)")(
    _eager_values(lambda ctx: [(1, 1000), (37, 1000), (199, 1000)], "v")
)


def _eager_ops(ctx: Context) -> list[str]:
    """The kernels the answer launches for a bf16 x on meta tensors, counted where the answer
    lives (once per run)."""
    from ..probes.lesson00_06 import eager_kernels

    if "eager ops" not in ctx.cache:
        ops = ctx.probe(eager_kernels, (8, 1000), torch.bfloat16)
        if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
            raise CheckFailed("the learner's process sent no kernel names back")
        ctx.cache["eager ops"] = ops
    return ctx.cache["eager ops"]


CAST_LAST = (
    "cast back last, after the multiply by w: the exercise's order multiplies by w in fp32 and "
    "then casts the product to x.dtype, and 00.eager_bytes counts the bytes of that order. "
    "Casting back before the weight multiply (as Hugging Face's LlamaRMSNorm does) is another "
    "sequence: its multiply reads and writes bf16, and its values are rounded twice"
)


@eager.check("launches separate kernels (eager, not a library call)")
def _eager_is_eager(ctx: Context):
    ops = _eager_ops(ctx)
    if len(ops) < 4:
        raise CheckFailed(
            "too few kernels for an eager RMSNorm",
            expected="at least 4 separate ops (cast, square, mean, rsqrt, multiply, cast back)",
            seen=", ".join(ops) or "none",
            hint="write it from elementwise ops and a mean, as a PyTorch model does",
        )
    return f"{len(ops)} kernels: {', '.join(ops)}"


#: the kernels of RMSNorm's own arithmetic, however it is spelt (``x * x`` or ``pow``, ``mean``
#: or ``sum`` and a division, ``rsqrt`` or ``sqrt`` and a reciprocal; in place or not)
OWN_ARITHMETIC = {"_to_copy", "pow", "mul", "mean", "sum", "div", "add", "rsqrt", "sqrt"}
OWN_ARITHMETIC |= {"reciprocal", "square", "clone", "copy"}
OWN_MEAN = (
    "the mean of squares is the exercise: square x (pow or a multiply), take the mean over the "
    "last dim (or a sum divided by N), add eps and take rsqrt, yourself. A norm, a variance, a "
    "normalize or a concatenation computes it for you"
)


@eager.check("its own mean of squares (no norm, variance or normalize)")
def _eager_own_arithmetic(ctx: Context):
    ops = _eager_ops(ctx)
    other = sorted({o for o in ops if o.rstrip("_") not in OWN_ARITHMETIC})
    if other or not {"mean", "sum"} & {o.rstrip("_") for o in ops}:
        raise CheckFailed(
            "kernels outside RMSNorm's own arithmetic, or no mean (sum) over the row",
            expected="casts, pow or mul, mean (or sum and div), add, rsqrt (or sqrt), mul",
            seen=", ".join(other or ops),
            hint=OWN_MEAN,
        )
    return "casts, squares, a mean, rsqrt and multiplies only"


@eager.check("the order asked: multiply by w in fp32, then cast back (bf16 x)")
def _eager_order(ctx: Context):
    ops = _eager_ops(ctx)
    last = ops[-2:]
    if len(last) < 2 or last[-1] != "_to_copy" or not last[0].startswith("mul"):
        raise CheckFailed(
            "the last two kernels for a bf16 x are not the weight multiply, then the cast back",
            expected="..., mul (by w, in fp32), _to_copy (to x.dtype)",
            seen=", ".join(ops[-3:]) or "no kernel",
            hint=CAST_LAST,
        )
    return "mul, then _to_copy: the product with w in fp32, cast back last"


eager.check("ragged shapes (grading seed)", hidden=True)(
    _eager_values(
        lambda ctx: [
            (ctx.rng("m").randint(2, 300), ctx.rng("n").randint(3, 3000)),
            (1, 1),
            (3, 4093),
        ],
        "h",
    )
)


# ---- 00.eager_bytes ---------------------------------------------------------------------------
# BEGIN KEY
def eager_bytes_ref(M, N, dtype):
    """Measured, not derived: the traffic of eager_rmsnorm_ref on meta tensors."""
    from ...lessons.roofline import traffic

    x = torch.empty(M, N, dtype=dtype, device="meta")
    w = torch.empty(N, dtype=dtype, device="meta")
    return sum(op.total for op in traffic(eager_rmsnorm_ref, x, w))


def _eager_bytes_formula(M, N, d, *, f=4, casts_for_fp32=False, row_ops=True, row_io=True):
    """The eager sequence's bytes, with the knobs a wrong count turns."""
    b = _size(d)
    full = M * N
    total = 2 * full * f + full * f + 2 * full * f + 2 * full * f + N * b  # pow, mean, mul, mul
    total += 4 * M * f if row_ops else 0  # + eps, rsqrt: read and write M floats each
    total += 2 * M * f if row_io else 0  # mean writes M floats, the first mul reads them
    if d != torch.float32 or casts_for_fp32:
        total += 2 * (full * b + full * f)  # x.float(), .to(x.dtype)
    return total


# fmt: off
EAGER_BYTES_MUTANTS = mutants(COMPILE,
    ("intermediates in the input dtype", "fp32", "f = 4  #", "f = b  #"),
    ("casts counted for fp32 too", "no kernel", [
        ("    if dtype != torch.float32:\n        ops.append(full * b + full * f)",
         "    ops.append(full * b + full * f)"),
        ("    if dtype != torch.float32:\n        ops.append(full * f + full * b)",
         "    ops.append(full * f + full * b)"),
    ]),
    ("forgets the per-row ops", "per-row", [
        ("        2 * row * f,                 # + eps\n", ""),
        ("        2 * row * f,                 # rsqrt\n", ""),
    ]),
)
# fmt: on
# END KEY

eager_bytes = register(
    Exercise(
        id="00.eager_bytes",
        # the lesson's counter of dispatched bytes measures what is asked (red team 19 ran it
        # on tiny meta tensors as the cell loaded and fitted the count)
        finished=("quack_edu.lessons.roofline.traffic",),
        watch_ops=True,  # counted from the cell's load on (red teams 21, 22: traced at load)
        lesson=LESSON,
        answer="eager_bytes",
        title="bytes eager PyTorch moves for RMSNorm: eager_bytes(M, N, dtype)",
        points={COMPILE: 1},
        mutants=EAGER_BYTES_MUTANTS,
    )
)
# BEGIN KEY
_EAGER_BYTES_VARIANTS = [
    Variant(
        "input dtype for intermediates",
        lambda M, N, d: _eager_bytes_formula(M, N, d, f=_size(d)),
        "x.float() makes every intermediate fp32 (4 bytes per element), whatever x's dtype",
    ),
    Variant(
        "casts for fp32",
        lambda M, N, d: _eager_bytes_formula(M, N, d, casts_for_fp32=True),
        "for fp32 input, x.float() and .to(torch.float32) return x itself: no kernel, no bytes",
    ),
    Variant(
        "no per-row ops",
        lambda M, N, d: _eager_bytes_formula(M, N, d, row_ops=False),
        "the per-row ops are kernels too: + eps and rsqrt each read and write M floats "
        "(small, but count them)",
    ),
    Variant(
        "no per-row traffic",
        lambda M, N, d: _eager_bytes_formula(M, N, d, row_ops=False, row_io=False),
        "the per-row values move bytes too: mean writes M floats, + eps and rsqrt read and "
        "write them, the multiply reads them (small, but count them)",
    ),
]
# END KEY
eager_bytes.add(
    value_check(
        "matches the traffic of the eager sequence (measured)",
        eager_bytes_ref,
        _shape_cases,
        variants=_EAGER_BYTES_VARIANTS,
    )
)
COUNTED = (
    "count the bytes from the table, in arithmetic on M, N and the dtype's size: running the "
    "eager sequence on meta or fake tensors (traffic, make_fx, a dispatch mode) measures them "
    "instead"
)


@eager_bytes.check("counted, not measured (no torch operator run on M x N tensors)")
def _eager_bytes_counted(ctx: Context):
    from ..probes.lesson00_06 import tensor_ops

    ops = ctx.probe(tensor_ops, [(37, 1000, torch.bfloat16), (199, 773, torch.float32)])
    if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
        raise CheckFailed("the learner's process sent no operator names back")
    if ops:
        raise CheckFailed(
            f"the answer runs {len(ops)} torch operators on tensors",
            expected="arithmetic on M, N and the element size only",
            seen=", ".join(dict.fromkeys(ops)),
            hint=COUNTED,
        )
    return "no torch operator on a tensor: counted"


# BEGIN HIDDEN
eager_bytes.add(
    value_check(
        "random shapes (grading seed)",
        eager_bytes_ref,
        _shape_cases,
        variants=_EAGER_BYTES_VARIANTS,
        hidden=True,
    )
)
# END HIDDEN
