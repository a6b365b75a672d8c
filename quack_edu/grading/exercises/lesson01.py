"""Lesson 01, the naive stage: one counting exercise and two holes in the naive kernel.

01.sum_squares          the first pass over the row, compiled inside the naive kernel
01.rstd                 rstd = rsqrt(sum_sq / N + eps), compiled inside the naive kernel
01.sectors_per_request  32-byte sectors one warp-wide load touches (why naive is slow)
"""

from __future__ import annotations

import re

import torch

from .. import hints
from ..checks import (
    Ptx,
    compiles,
    f32_hex,
    gpu_values,
    no_local_memory,
    ptx_probe,
    value_check,
)
from ..hints import Variant
from ..holes import RSTD_HOLE, SUM_HOLE
from ..registry import COMPILE, GPU, TIERS, CheckFailed, Exercise, mutants, register
from ..sim_values import sim_values

LESSON = "01_naive"
#: the naive kernel's values on the CPU: a thread loops over its row, so a short ragged one
#: (37 columns, not a multiple of the loop's unroll of 4) keeps the simulation short
NAIVE_SIM = ((37, "fp32", "fp32", None), (37, "bf16", "bf16", None))

# ---- 01.sum_squares ---------------------------------------------------------------------------
FP32_HINT = (
    "square after converting to Float32 (`.to(Float32)`): bf16/fp16 keep 8/11 mantissa bits, "
    "and a sum of thousands of rounded squares drifts; the kernel accumulates in fp32"
)
_ARITH_16 = re.compile(r"^(add|sub|mul|fma)(\.rn)?\.(bf16|f16)(x2)?$")
_SQUARE = re.compile(r"^(mul|fma)(\.rn)?\.(f32|bf16|f16)(x2)?$")


def _probe_fp32(rep, ctx):
    if rep.dtype == torch.float32:
        return None
    bad = [i for i in Ptx(rep.ptx).instrs if _ARITH_16.match(i.opcode)]
    if bad:
        raise CheckFailed(
            f"{len(bad)} arithmetic instructions in 16 bits",
            expected="squares and sums in fp32 (fma.rn.f32)",
            seen=f"`{bad[0].text}`",
            hint=FP32_HINT,
        )
    return "fp32 arithmetic"


def _probe_squares(rep, ctx):
    ptx = Ptx(rep.ptx)
    for i in ptx.instrs:
        if _SQUARE.match(i.opcode) and len(i.srcs) >= 2 and i.srcs[0] == i.srcs[1]:
            if any(a.opcode.startswith("ld.global") for a in ptx.ancestors(i)):
                return f"`{i.opcode}` squares a loaded x"
    raise CheckFailed(
        "no square of x in the PTX",
        expected="v * v: a mul/fma whose two factors are the same loaded value",
        seen="no such instruction",
        hint=hints.NOT_SQUARED,
    )


def _probe_loop(rep, ctx):
    n = rep.count("ld.global")
    if n > 64:
        raise CheckFailed(
            "the loop is unrolled at trace time",
            expected="a device loop: <= 64 global loads",
            seen=f"{n} ld.global instructions for N={rep.N}",
            hint="cutlass.range_constexpr (or a Python list) copies the body N times; "
            "cutlass.range(N, unroll=4) makes a device loop",
        )
    return f"{n} ld.global in a device loop"


# BEGIN KEY
# fmt: off
SUM_SQUARES_MUTANTS = [
    *mutants(COMPILE,
        ("squares in bf16", "Float32", "v = mX[row, j].to(Float32)", "v = mX[row, j]"),
    ),
    *mutants(TIERS,
        ("sums x, not x*x", "not x * x", "acc += v * v", "acc += v"),
    ),
    *mutants(COMPILE,
        ("no @cute.jit", "@cute.jit", "@cute.jit\n", ""),
    ),
    *mutants(TIERS,
        ("skips the last column", "misses a column",
         "cutlass.range(N, unroll=4)", "cutlass.range(N - 1, unroll=4)"),
    ),
]
# fmt: on
# END KEY

sum_squares = register(
    Exercise(
        id="01.sum_squares",
        finished=("quack_edu.stages.naive.NaiveRMSNorm.sum_squares",),
        lesson=LESSON,
        answer="sum_squares",
        title="the first pass: sum of x[row, j]**2 in fp32, inside the naive kernel",
        points={COMPILE: 1, GPU: 1},
        mutants=SUM_SQUARES_MUTANTS,
    )
)
sum_squares.add(
    compiles(SUM_HOLE, N=1000, dtypes=("bf16", "fp32")),
    ptx_probe(SUM_HOLE, "squares x", _probe_squares),
    ptx_probe(SUM_HOLE, "squares and sums in fp32", _probe_fp32, dtypes=("bf16", "fp16")),
    ptx_probe(SUM_HOLE, "a device loop, not N copies", _probe_loop),
    sim_values(SUM_HOLE, NAIVE_SIM, variants=hints.SUM_VARIANTS),
    no_local_memory(SUM_HOLE),
    compiles(SUM_HOLE, dtypes=("fp16",), hidden=True),
    gpu_values(SUM_HOLE, variants=hints.SUM_VARIANTS),
    gpu_values(
        SUM_HOLE,
        variants=hints.SUM_VARIANTS,
        hidden=True,
        name="values at more shapes, grading seed",
    ),
)


# ---- 01.rstd ----------------------------------------------------------------------------------
def _root(ptx: Ptx):
    """The instruction taking the (reciprocal) square root, and whether it is an rsqrt."""
    r = ptx.find("rsqrt.")
    if r:
        return r[0], True
    s = ptx.find("sqrt.")
    return (s[0], False) if s else (None, False)


def _probe_rsqrt(rep, ctx):
    ptx = Ptx(rep.ptx)
    root, is_rsqrt = _root(ptx)
    if is_rsqrt:
        return f"`{root.opcode}` (MUFU.RSQ in SASS)"
    if root is None:
        raise CheckFailed(
            "no square root in the PTX",
            expected="one rsqrt.approx.f32",
            seen="neither rsqrt nor sqrt",
            hint="rstd = 1 / sqrt(mean + eps): cute.math.rsqrt computes it in one instruction",
        )
    divides = [
        i
        for i in ptx.instrs
        if (i.opcode.startswith("rcp") and set(i.srcs) & set(root.dests))
        or (i.opcode.startswith("div") and i.srcs and i.srcs[-1] in root.dests)
    ]
    if divides:
        raise CheckFailed(
            "1/sqrt in two instructions",
            expected="one rsqrt.approx.f32 (MUFU.RSQ)",
            seen=f"`{root.opcode}` then `{divides[0].opcode}`",
            hint="the value is right but costs a square root and a division: cute.math.rsqrt "
            "is one instruction",
        )
    raise CheckFailed(
        "no rsqrt in the PTX",
        expected="rsqrt.approx.f32",
        seen=f"`{root.opcode}` whose result is not inverted",
        hint=hints.SQRT_NOT_RSQRT,
    )


def _probe_eps(rep, ctx):
    ptx = Ptx(rep.ptx)
    loads = [ld for p in ptx.scalar_params(".f32") for ld in ptx.param_loads(p)]
    if not loads:
        raise CheckFailed(
            "eps is never used",
            expected="eps added to the mean of squares",
            seen="the kernel's eps parameter is never read",
            hint=hints.NO_EPS,
        )
    root, _ = _root(ptx)
    if root is None:
        return None  # the rsqrt check reports this
    if not {ld.index for ld in loads} & {a.index for a in ptx.ancestors(root)}:
        raise CheckFailed(
            "eps does not reach the square root",
            expected=f"eps in the input of `{root.opcode}`",
            seen="eps used after it",
            hint=hints.EPS_OUTSIDE,
        )
    return "eps flows into the rsqrt"


def _probe_mean(rep, ctx):
    ptx = Ptx(rep.ptx)
    root, _ = _root(ptx)
    if root is None:
        return None
    N = rep.N
    want = {f32_hex(float(N)), f32_hex(1.0 / N)}
    chain = ptx.ancestors(root) + [root]
    ops = [o for a in chain for o in a.operands]
    if any(c in o for c in want for o in ops):
        return f"divides by N={N}"
    scale = [
        o
        for a in chain
        if a.opcode.startswith(("div", "mul", "fma", "rcp"))
        for o in a.operands
        if re.fullmatch(r"0f[0-9A-Fa-f]{8}", o)
    ]
    consts = sorted({c for c in scale if _f32(c) not in (0.0, 1.0)})
    seen = (
        "no division: the sum itself"
        if not consts
        else "a scale by " + ", ".join(f"{_f32(c):g}" for c in consts)
    )
    raise CheckFailed(
        f"the sum of squares is not divided by N={N}",
        expected=f"sum_sq / {N} (PTX constant {f32_hex(float(N))}) before the rsqrt",
        seen=seen,
        hint=hints.SUM_NOT_MEAN if not consts else hints.WRONG_COUNT,
    )


def _f32(hexconst: str) -> float:
    import struct

    return struct.unpack(">f", bytes.fromhex(hexconst[2:]))[0]


# BEGIN KEY
# fmt: off
RSTD_MUTANTS = mutants(TIERS,
    ("forgets eps", "eps must be added", "sum_sq / N + eps", "sum_sq / N"),
    ("sum, not mean", "sqrt(N)", "sum_sq / N + eps", "sum_sq + eps"),
    ("sqrt, not rsqrt", "RMS itself", "cute.math.rsqrt(", "cute.math.sqrt("),
)
# fmt: on
# END KEY

rstd = register(
    Exercise(
        id="01.rstd",
        finished=(
            "quack_edu.stages.naive.NaiveRMSNorm.rstd",
            "quack_edu.stages.warp.WarpRMSNorm.rstd",
        ),
        lesson=LESSON,
        answer="rstd",
        title="the reciprocal RMS of a row from its sum of squares, inside the naive kernel",
        points={COMPILE: 1, GPU: 1},
        mutants=RSTD_MUTANTS,
    )
)
rstd.add(
    compiles(RSTD_HOLE, N=1000, dtypes=("bf16", "fp32")),
    ptx_probe(RSTD_HOLE, "one rsqrt instruction", _probe_rsqrt),
    ptx_probe(RSTD_HOLE, "eps is added before the rsqrt", _probe_eps),
    ptx_probe(RSTD_HOLE, "the sum is divided by N (a mean)", _probe_mean),
    sim_values(RSTD_HOLE, NAIVE_SIM, variants=hints.RSTD_VARIANTS),
    compiles(RSTD_HOLE, dtypes=("fp16",), hidden=True),
    ptx_probe(RSTD_HOLE, "divides by N at a random N", _probe_mean, dtypes=("fp16",), hidden=True),
    gpu_values(RSTD_HOLE, variants=hints.RSTD_VARIANTS),
    gpu_values(
        RSTD_HOLE,
        variants=hints.RSTD_VARIANTS,
        hidden=True,
        name="values at more shapes, grading seed",
    ),
)


# ---- 01.sectors_per_request -------------------------------------------------------------------


# BEGIN KEY
def sectors_ref(stride_bytes, elem_bytes=2, threads=32):
    sectors = set()
    for t in range(threads):
        first = t * stride_bytes
        sectors.update(range(first // 32, (first + elem_bytes - 1) // 32 + 1))
    return len(sectors)


# END KEY


def _lines_128(stride_bytes, elem_bytes=2, threads=32):
    return len({(t * stride_bytes + k) // 128 for t in range(threads) for k in (0, elem_bytes - 1)})


def _sector_cases(ctx, hidden):
    rng = ctx.rng("hidden sectors" if hidden else "sectors")
    cases = []
    for _ in range(12 if hidden else 2):
        e = rng.choice((1, 2, 4, 8, 16))
        cases.append((e * rng.randint(1, 300), e, rng.choice((8, 16, 32))))
    if hidden:
        return cases + _sector_edges(rng)
    return [
        (2, 2, 32),
        (2000, 2, 32),
        (8192, 2, 32),
        (16, 16, 32),
        (4, 4, 32),
        (64, 4, 32),
        (8, 2, 32),
        (4000, 4, 32),
        (2, 2, 16),
        (0, 2, 32),  # every thread the same element: the naive kernel's load of w[j]
        (40, 12, 32),  # 12-byte elements 40 bytes apart: some cross into the next sector
        (2, 2, 8),  # 8 threads, 16 bytes: part of a sector
        (128, 80, 32),  # 80 bytes a thread: three sectors each, the middle one too
    ] + cases


def _sector_edges(rng):
    """The hidden check's cases that elem_bytes decides: every thread at one address, elements
    that cross a sector boundary into a sector no other thread touches (threads 64 bytes or
    more apart), and a few threads close together, their span not a whole number of sectors."""
    e = rng.choice((6, 12))
    s = rng.randint(64, 300)
    while not any((t * s) % 32 + e > 32 for t in range(32)):
        s = rng.randint(64, 300)
    small = rng.choice((1, 2, 4))
    return [
        (0, rng.choice((1, 2, 4, 8, 16)), rng.choice((8, 16, 32))),
        (s, e, 32),
        (small * rng.randrange(1, 8, 2), small, rng.randrange(3, 32, 2)),
    ]


# BEGIN KEY
# fmt: off
SECTORS_PER_REQUEST_MUTANTS = mutants(COMPILE,
    ("counts 128-byte lines", "sector is 32 bytes", "// 32", "// 128"),
    ("ignores the stride", "stride", "first = t * stride_bytes", "first = t * elem_bytes"),
    ("only the first byte's sector", "an element can cross a sector boundary",
     "last = first + elem_bytes - 1", "last = first"),
    ("the warp's span over 32", "not the span of the warp",
     "    return len(sectors)", "    return min(threads, -(-threads * stride_bytes // 32))"),
    ("the first and last byte's sectors only", "every sector between its first",
     "sectors.update(range(first // 32, last // 32 + 1))",
     "sectors.update({first // 32, last // 32})"),
    ("ignores elem_bytes", "depends on elem_bytes too",
     "    return len(sectors)",
     "    return threads * stride_bytes // 32 if stride_bytes < 32 else threads"),
)
# fmt: on
# END KEY

sectors = register(
    Exercise(
        id="01.sectors_per_request",
        lesson=LESSON,
        answer="sectors_per_request",
        title=(
            "32-byte sectors one warp-wide load touches: sectors_per_request(stride, elem, threads)"
        ),
        points={COMPILE: 1},
        mutants=SECTORS_PER_REQUEST_MUTANTS,
    )
)


# BEGIN KEY
def _ends_only(stride_bytes, elem_bytes=2, threads=32):
    firsts = [t * stride_bytes for t in range(threads)]
    return len({f // 32 for f in firsts} | {(f + elem_bytes - 1) // 32 for f in firsts})


_SECTOR_VARIANTS = [
    Variant(
        "first and last byte",
        _ends_only,
        "an element longer than a sector touches every sector between its first and its last "
        "byte too (80 bytes at byte 0: sectors 0, 1 and 2)",
    ),
    Variant(
        "128-byte lines",
        _lines_128,
        "a sector is 32 bytes (a 128-byte cache line holds 4 sectors); DRAM and L2 move sectors",
    ),
    Variant(
        "contiguous",
        lambda s, e, t: sectors_ref(e, e, t),
        "thread t reads at byte t * stride_bytes: threads are stride bytes apart, not elem_bytes",
    ),
    Variant(
        "one per thread",
        lambda s, e, t: t,
        "threads close together share a sector: count distinct sectors, not threads",
    ),
    Variant(
        "first byte only",
        lambda s, e, t: len({k * s // 32 for k in range(t)}),
        "an element can cross a sector boundary: thread t reads bytes t * stride_bytes to "
        "t * stride_bytes + elem_bytes - 1, and every sector one of them falls in is touched "
        "(a 12-byte element at byte 120 touches sectors 3 and 4)",
    ),
    Variant(
        "span over 32",
        lambda s, e, t: min(t, -(-t * s // 32)),
        "count the distinct sectors the bytes fall in, not the span of the warp divided by 32: "
        "at stride 0 every thread reads the same sector (1, not 0), the last thread's element "
        "ends elem_bytes (not stride_bytes) past its address, and an element that crosses a "
        "sector boundary touches two, so a load can touch more sectors than it has threads",
    ),
    Variant(
        "no elem_bytes",
        lambda s, e, t: t * s // 32 if s < 32 else t,
        "the count depends on elem_bytes too: each thread reads elem_bytes bytes from its "
        "address, and its sectors run from its first byte's to its last byte's (at stride 0 "
        "every thread reads the same sector: 1, not 0; a 12-byte element at byte 120 touches "
        "sectors 3 and 4)",
    ),
]
# END KEY
sectors.add(
    value_check(
        "naive, coalesced and vector strides", sectors_ref, _sector_cases, variants=_SECTOR_VARIANTS
    )
)
# BEGIN HIDDEN
sectors.add(
    value_check(
        "random strides (grading seed)",
        sectors_ref,
        _sector_cases,
        variants=_SECTOR_VARIANTS,
        hidden=True,
    )
)
# END HIDDEN
