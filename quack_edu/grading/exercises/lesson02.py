"""Lesson 02, the warp stage: two holes in the warp kernel.

02.warp_reduce  the butterfly: sum a value over the lanes of a row with ``shfl.sync.bfly``
02.tv_layout    the thread and value layouts of the 128-bit tiled copy that moves a row
02.warp_kernel  the whole kernel: the warp stage's @cute.kernel for rows that fit one pass
"""

from __future__ import annotations

import re

import torch

from ...config import RowConfig
from .. import hints
from ..checks import (
    Ptx,
    compiles,
    gpu_speed,
    gpu_values,
    no_local_memory,
    ptx_probe,
)
from ..hints import Variant
from ..holes import COPY_HOLE, REDUCE_HOLE, WARP
from ..holes import WARP_KERNEL_HOLE as KERNEL_HOLE
from ..registry import COMPILE, GPU, TIERS, Check, CheckFailed, Exercise, mutants, register
from ..sim_values import sim_values
from .whole_kernel import (
    COLUMN_MUTANTS,
    GIVEN_COPY,
    SIM_VALUE_MUTANTS,
    STORE_Y,
    WHOLE_VARIANTS,
    WholeKernel,
)

LESSON = "02_warp_reduction"

# ---- 02.warp_reduce ---------------------------------------------------------------------------
SHUFFLE_DOWN = (
    "shfl.sync.down (or .up/.idx) moves values one way: after the rounds only lane 0 holds the "
    "total, but every lane of the row needs it to scale its own elements. The butterfly "
    "(shuffle_sync_bfly, lane i <-> lane i ^ offset) leaves the total in every lane"
)
WIDTH = (
    "with rows narrower than a warp (width 8 or 16 lanes), rounds with offset >= width add the "
    "lanes of other rows: stop after log2(width) rounds (offsets 1, 2, ..., width / 2)"
)
EXTRA_ROUNDS = (
    "more shuffle rounds than log2(width): a round whose offset is >= width reaches lanes of "
    "another row (or adds a lane twice)"
)

NOT_ADDED = (
    "a shuffle's result is never added: each round must add the value a lane receives to its "
    "own (val = val + shuffle_sync_bfly(val, ...)); as written, a lane ends the rounds holding "
    "another lane's partial sum, not the row's total"
)

_SHFL = re.compile(r"^shfl\.sync\.(bfly|down|up|idx)")
_COMBINE = ("add.", "max.", "fma.", "min.")


def _users(ptx: Ptx, reg: str) -> list:
    """The instructions that read ``reg``, looking through moves and conversions."""
    out, todo, seen = [], [reg], set()
    while todo:
        r = todo.pop()
        for ins in ptx.instrs:
            if r in ins.srcs and ins.index not in seen:
                seen.add(ins.index)
                if ins.opcode.startswith(("mov", "cvt")):
                    todo.extend(ins.dests)
                else:
                    out.append(ins)
    return out


def _probe_adds(rep, ctx):
    """Every butterfly round combines: some add (max, fma) reads both the value a lane sent and
    the one it received. A chain of shuffles whose results are never added passes the round
    count, and leaves a lane with another lane's partial."""
    ptx = Ptx(rep.ptx)
    shfl = ptx.find("shfl.sync.bfly")
    for ins in shfl:
        sent = ins.srcs[0] if ins.srcs else None
        ok = (
            any(
                u.opcode.startswith(_COMBINE) and (sent is None or sent in u.srcs)
                for u in _users(ptx, ins.dests[0])
            )
            if ins.dests
            else False
        )
        if not ok:
            users = sorted({u.opcode for u in _users(ptx, ins.dests[0])}) if ins.dests else []
            raise CheckFailed(
                "a shuffle's result is not added to the lane's own value",
                expected="shfl.sync.bfly d, v, ...; then add.f32 _, d, v (every round)",
                seen=f"`{ins.text}` feeds {', '.join(users) or 'nothing'}",
                hint=NOT_ADDED,
            )
    return f"each of the {len(shfl)} shuffles is added to the lane's own value"


def _rounds_probe(expected: int):
    def probe(rep, ctx):
        ops = [ln.split()[0] for ln in rep.instructions() if _SHFL.match(ln)]
        bfly = sum(op.startswith("shfl.sync.bfly") for op in ops)
        other = sorted({op.split(".")[2] for op in ops if not op.startswith("shfl.sync.bfly")})
        width = min(rep.config.threads_per_row, WARP)
        seen = f"{bfly} shfl.sync.bfly" + (f", shfl.sync.{'/'.join(other)}" if other else "")
        want = f"{expected} shfl.sync.bfly (log2({width}) rounds)"
        if other:
            raise CheckFailed(
                "the reduction uses one-way shuffles", expected=want, seen=seen, hint=SHUFFLE_DOWN
            )
        if bfly < expected:
            raise CheckFailed(
                f"too few butterfly rounds for {width} lanes per row",
                expected=want,
                seen=seen,
                hint=hints.MISSING_SHUFFLE,
            )
        if bfly > expected:
            raise CheckFailed(
                f"too many butterfly rounds for {width} lanes per row",
                expected=want,
                seen=seen,
                hint=WIDTH if width < WARP else EXTRA_ROUNDS,
            )
        return f"{bfly} shfl.sync.bfly for {width} lanes"

    return probe


def _probe_mask(rep, ctx):
    for line in rep.lines("shfl.sync"):
        # shfl.sync.bfly.b32 dest, src, offset, clamp, membermask;
        mask = line.rstrip(";").split(",")[-1].strip()
        if mask not in ("-1", "0xffffffff", "0xFFFFFFFF", "4294967295"):
            raise CheckFailed(
                "a shuffle leaves lanes out of its member mask",
                expected="membermask -1 (0xFFFFFFFF: all 32 lanes)",
                seen=f"`{line}`",
                hint=hints.FULL_MASK,
            )
    return "all 32 lanes in every shuffle's mask"


def _reduce_check(name, N, dtype="bf16", config=None, hidden=False):
    """Rounds counted in the kernel compiled with ``config`` (None: the stage's heuristic)."""

    def fn(ctx):
        rep = ctx.report(REDUCE_HOLE, N, dtype, config)
        width = min(rep.config.threads_per_row, WARP)
        return _rounds_probe(width.bit_length() - 1)(rep, ctx)

    return Check(name, COMPILE, fn, hidden, ("compiles",))


def _rows_mixed(x, w, eps, lanes=8):
    """What a full 32-lane butterfly computes when a warp holds 32 // lanes rows: each row gets
    the sum of squares of all the rows in its warp (rows of a CTA are warp-aligned)."""
    xf = x.float()
    M, N = xf.shape
    per = WARP // lanes
    pad = (-M) % per
    ss = (xf * xf).sum(-1)
    ss = torch.cat([ss, ss.new_zeros(pad)]).view(-1, per).sum(-1).repeat_interleave(per)[:M]
    r = torch.rsqrt(ss[:, None] / N + eps)
    return xf * r * w.float()


ROWS_MIXED_V = Variant("rows of a warp summed together", _rows_mixed, WIDTH)

NARROW_CFG = RowConfig(threads_per_row=8, num_threads=128)

# BEGIN KEY
# fmt: off
WARP_REDUCE_MUTANTS = [
    *mutants(TIERS,
        ("one round short", "shuffle step is missing",
         "while offset < width:", "while offset < width // 2:"),
    ),
    *mutants(COMPILE,
        ("shuffle down instead of the butterfly", "only lane 0 holds the total",
         "shuffle_sync_bfly(", "shuffle_sync_down("),
    ),
    *mutants(TIERS,
        ("always five rounds", "lanes of other rows",
         "while offset < width:", "while offset < 32:"),
    ),
    *mutants(COMPILE,
        ("shuffles but never adds", "result is never added",
         "val = val + cute.arch.shuffle_sync_bfly(", "val = cute.arch.shuffle_sync_bfly("),
        ("half the lanes in the mask", "member mask must name all 32",
         "mask=0xFFFFFFFF", "mask=0x0000FFFF"),
    ),
]
# fmt: on
# END KEY

warp_reduce = register(
    Exercise(
        id="02.warp_reduce",
        finished=(
            "quack_edu.stages.warp.WarpRMSNorm.warp_reduce",
            "quack_edu.primitives.reduce.warp_reduce",
            "cutlass.cute.arch.nvvm_wrappers.warp_reduction",  # the DSL's own butterfly
        ),
        lesson=LESSON,
        answer="warp_reduce_sum",
        title="the butterfly: sum a value over the lanes of a row (shfl.sync.bfly)",
        points={COMPILE: 1, GPU: 1},
        mutants=WARP_REDUCE_MUTANTS,
    )
)
warp_reduce.add(
    compiles(REDUCE_HOLE, N=1000, dtypes=("bf16", "fp32")),
    _reduce_check("5 butterfly rounds for a 32-lane row (N=1000)", 1000),
    _reduce_check(
        "3 butterfly rounds for an 8-lane row (N=64, 4 rows per warp)", 64, config=NARROW_CFG
    ),
    ptx_probe(REDUCE_HOLE, "every shuffle names all 32 lanes", _probe_mask),
    ptx_probe(REDUCE_HOLE, "each round adds what the lane receives", _probe_adds),
    sim_values(
        REDUCE_HOLE,
        ((1000, "bf16", "bf16", None), (64, "bf16", "bf16", NARROW_CFG)),
        name="values on the CPU (the PTX simulated, M in 1/3/7, N=1000, N=64 at 8 lanes a row)",
        variants=(ROWS_MIXED_V,),
    ),
    no_local_memory(REDUCE_HOLE),
    compiles(REDUCE_HOLE, dtypes=("fp16",), hidden=True),
    _reduce_check(
        "4 butterfly rounds for a 16-lane row (N=128 fp16)",
        128,
        "fp16",
        config=RowConfig(threads_per_row=16, num_threads=128),
        hidden=True,
    ),
    gpu_values(REDUCE_HOLE),
    gpu_values(
        REDUCE_HOLE,
        name="values with 8 lanes per row (4 rows share a warp)",
        config=lambda N, dtype: NARROW_CFG,
        variants=(ROWS_MIXED_V,),
    ),
    gpu_values(REDUCE_HOLE, hidden=True, name="values at more shapes, grading seed"),
)


# ---- 02.tv_layout -----------------------------------------------------------------------------
NARROW = (
    "each thread moves fewer than 16 bytes per access, so the kernel needs more load "
    "instructions for the same bytes; a vector is 128 bits. dtype.width is in bits (16 for "
    "bf16/fp16, 32 for fp32): 16 bytes are 128 // dtype.width elements (8 bf16/fp16, 4 fp32)"
)


def narrow_hint(nbytes: int) -> str:
    """NARROW, naming the access width the learner's layout gives (2 bytes is a vec of 1: e.g.
    16 // dtype.width, bytes divided by bits)."""
    ptx = {8: " (ld.global.v2.b32)", 4: " (ld.global.b32)"}.get(nbytes, "")
    return f"{nbytes}-byte accesses{ptx}: " + NARROW


ZERO_VEC = (
    "a layout got a size of 0: your value layout's vec (elements per 16-byte access) came out 0 "
    "for this dtype. dtype.width is in bits, so 16 // dtype.width is 0 for fp32; a 16-byte "
    "vector holds 128 // dtype.width elements"
)

WIDE = (
    "a thread's vector is more than one 16-byte access (8 fp32 = 32 bytes): it becomes two "
    "loads, and in one load instruction neighbouring lanes land 32 bytes apart, so each "
    "instruction uses half of every sector it touches; a vector is 128 // dtype.width elements"
)
ALONG_ROW = (
    "a thread's values go down a column (one element in each of several rows): a 16-byte "
    "access needs contiguous elements of one row, a value layout of shape (1, vec)"
)
THREAD_ORDER = (
    "the threads of a row must be consecutive: thread t works on row t // threads_per_row (that "
    "is how warp_reduce groups lanes). Order the (rows, threads_per_row) thread layout "
    "row-major, order=(1, 0)"
)
THREAD_COUNT = (
    "the thread layout must hold every thread of the CTA: shape (num_threads // "
    "threads_per_row, threads_per_row)"
)
NEIGHBOURS = (
    "neighbouring threads of a row must read neighbouring 16-byte vectors (thread j of the row "
    "starts at column j * vec), so that one warp-wide load covers contiguous bytes"
)


def tv_map(ctx, threads_per_row: int, num_threads: int, dtype: str) -> dict:
    """The learner's layouts traced where the answer lives (no kernel is built;
    ``probes.lesson01b_02.tv_layout_map``): ``{"threads", "vals", "tile", "coords": {t: [(row,
    col) of each value]}}`` in one tile of the tiled copy (``quack_edu.tools.inspect.tv_coords``'s
    form)."""
    from ..probes.lesson01b_02 import tv_layout_map

    m = ctx.probe(tv_layout_map, threads_per_row, num_threads, dtype)
    try:
        coords = {t: [(int(r), int(c)) for r, c in cs] for t, cs in enumerate(m["coords"])}
        return {
            "threads": int(m["threads"]),
            "vals": int(m["vals"]),
            "tile": tuple(int(x) for x in m["tile"]),
            "coords": coords,
        }
    except (TypeError, ValueError, KeyError) as e:
        raise CheckFailed(f"the learner's process sent no layout map back ({e})") from None


def expected_coords(threads_per_row: int, num_threads: int, vec: int) -> dict:
    """What the row layout gives: thread t, value v -> (t // tpr, (t % tpr) * vec + v)."""
    return {
        t: [(t // threads_per_row, (t % threads_per_row) * vec + v) for v in range(vec)]
        for t in range(num_threads)
    }


def diagnose_tv(m: dict, threads_per_row: int, num_threads: int, elem_bytes: int):
    """None when the traced map is the row layout; else (what is wrong, hint)."""
    vec = 16 // elem_bytes
    if m["threads"] != num_threads:
        return f"the thread layout holds {m['threads']} threads, not {num_threads}", THREAD_COUNT
    coords = m["coords"]
    for t, cs in coords.items():
        if len({r for r, _ in cs}) > 1:
            return f"thread {t}'s values sit in rows {sorted({r for r, _ in cs})}", ALONG_ROW
    for t, cs in coords.items():
        cols = sorted(c for _, c in cs)
        if cols != list(range(cols[0], cols[0] + len(cols))):
            return f"thread {t}'s values are not contiguous columns: {cols[:8]}", NEIGHBOURS
    nbytes = m["vals"] * elem_bytes
    if nbytes < 16:
        return f"a thread moves {m['vals']} elements = {nbytes} bytes per access", narrow_hint(
            nbytes
        )
    if nbytes > 16:
        return f"a thread's vector is {m['vals']} elements = {nbytes} bytes", WIDE
    for t, cs in coords.items():
        if cs[0][0] != t // threads_per_row:
            return (
                f"thread {t} works on row {cs[0][0]} of the tile, not {t // threads_per_row}",
                THREAD_ORDER,
            )
    for t, cs in coords.items():
        start = min(c for _, c in cs)
        if start != (t % threads_per_row) * vec:
            return (
                f"thread {t} starts at column {start}, not {(t % threads_per_row) * vec}",
                NEIGHBOURS,
            )
    return None


_LAYOUT_CASES = [(32, 128, "bf16"), (32, 128, "fp32"), (8, 128, "fp16"), (16, 256, "fp32")]
_LAYOUT_HIDDEN = [(4, 128, "bf16"), (32, 256, "fp16"), (32, 512, "fp32"), (16, 64, "bf16")]


def _layout_check(hidden: bool):
    from ...runtime import cute_dtype

    def fn(ctx):
        cases = _LAYOUT_HIDDEN if hidden else _LAYOUT_CASES
        for tpr, nt, dt in cases:
            dtype = cute_dtype(dt)
            try:
                m = tv_map(ctx, tpr, nt, dt)
            except Exception as e:
                if "strictly positive" not in str(e):
                    raise
                raise CheckFailed(
                    f"threads_per_row={tpr}, num_threads={nt}, {dt}: a layout shape holds a 0",
                    expected=f"val_layout of shape (1, {128 // dtype.width}) for {dt}",
                    seen=hints.short_error(e, 200),
                    hint=ZERO_VEC,
                ) from None
            bad = diagnose_tv(m, tpr, nt, dtype.width // 8)
            if bad:
                what, hint = bad
                vec = 128 // dtype.width
                cols = f"columns (t % {tpr}) * {vec} + 0..{vec - 1}"
                raise CheckFailed(
                    f"threads_per_row={tpr}, num_threads={nt}, {dt}: {what}",
                    expected=f"thread t -> row t // {tpr}, {cols}",
                    seen=_describe(m),
                    hint=hint,
                )
        return f"{len(cases)} (threads_per_row, num_threads, dtype) cases map like the row layout"

    name = "more layouts (4..32 threads per row, 64..512 threads)" if hidden else _LAYOUT_CHECK
    return Check(name, COMPILE, fn, hidden)


_LAYOUT_CHECK = "thread t owns 16 contiguous bytes of row t // threads_per_row"


def _describe(m: dict) -> str:
    c = m["coords"]
    show = [t for t in (0, 1, 2, len(c) - 1) if t in c]
    return "; ".join(f"T{t}: {c[t][0]}..{c[t][-1]}" for t in show)


_ACCESS = re.compile(r"^(?:@!?%\w+\s+)?(ld|st)\.global(?:\.\w+)*?(?:\.v(\d))?\.[bufs](\d+)\s")


def access_bytes(rep) -> dict[tuple[str, int], int]:
    """{(ld|st, bytes per thread): count} over the global loads and stores of the PTX."""
    out: dict[tuple[str, int], int] = {}
    for line in rep.instructions():
        m = _ACCESS.match(line)
        if m:
            key = (m.group(1), int(m.group(2) or 1) * int(m.group(3)) // 8)
            out[key] = out.get(key, 0) + 1
    return out


def _probe_128(rep, ctx):
    acc = access_bytes(rep)
    narrow = {k: n for k, n in acc.items() if k[1] < 16}
    if narrow or not acc:
        seen = ", ".join(f"{n} x {op} of {b} B" for (op, b), n in sorted(acc.items()))
        raise CheckFailed(
            "global accesses narrower than 16 bytes",
            expected="only 16-byte accesses (ld.global.v4.b32 / st.global.v4.b32)",
            seen=seen or "no global access",
            hint=narrow_hint(min(b for _, b in narrow)) if narrow else NARROW,
        )
    return ", ".join(f"{n} x {op}.128" for (op, _), n in sorted(acc.items()))


# BEGIN KEY
# fmt: off
TV_LAYOUT_MUTANTS = mutants(COMPILE,
    ("64-bit accesses", "fewer than 16 bytes", "128 // dtype.width", "64 // dtype.width"),
    ("bytes divided by bits", "dtype.width is in bits",
     "vec = 128 // dtype.width", "vec = 16 // dtype.width"),
    ("no elements", "vec (elements per 16-byte access) came out 0",
     "vec = 128 // dtype.width", "vec = 0"),
    ("8 elements for every dtype", "more than one 16-byte access",
     "vec = 128 // dtype.width", "vec = 8"),
    ("threads ordered down the rows", "threads of a row must be consecutive",
     "order=(1, 0)", "order=(0, 1)"),
    ("vector down a column", "down a column",
     "cute.make_layout((1, vec))", "cute.make_layout((vec, 1))"),
)
# fmt: on
# END KEY

tv_layout = register(
    Exercise(
        id="02.tv_layout",
        finished=("quack_edu.primitives.copy.row_thread_layout",),
        lesson=LESSON,
        answer="row_tv_layouts",
        title="the TV layout of the row copy: (thr_layout, val_layout) for make_tiled_copy_tv",
        points={COMPILE: 1, GPU: 1},
        mutants=TV_LAYOUT_MUTANTS,
    )
)
tv_layout.add(
    _layout_check(hidden=False),
    compiles(COPY_HOLE, N=1000, dtypes=("bf16", "fp32")),
    ptx_probe(
        COPY_HOLE, "every global load and store is 16 bytes", _probe_128, dtypes=("bf16", "fp32")
    ),
    # the values run on a layout the map above found right: a wrong map's values only echo it,
    # under a hint of their own (a row's threads split over warps read as a missing shuffle)
    sim_values(
        COPY_HOLE,
        ((1000, "bf16", "bf16", None), (1000, "fp32", "fp32", None)),
        needs=("compiles", _LAYOUT_CHECK),
    ),
    no_local_memory(COPY_HOLE),
    _layout_check(hidden=True),
    compiles(COPY_HOLE, dtypes=("fp16",), hidden=True),
    gpu_values(COPY_HOLE),
    gpu_values(COPY_HOLE, hidden=True, name="values at more shapes, grading seed"),
)


# ---- 02.warp_kernel ---------------------------------------------------------------------------
# The whole kernel: the learner writes the warp stage's @cute.kernel for rows that fit one pass
# (a thread holds its whole share of the row), given the stage's helpers (row_copy, warp_reduce,
# rstd) and copy_utils (broadcast_rows, predicate_cols).
# Its hole: ``holes.WARP_KERNEL_HOLE`` (KERNEL_HOLE here).

NO_ROW_SUM = (
    "the lanes of a row never add their partial sums: each lane scales its elements by its own "
    "partial. After the per-thread sum of squares, self.warp_reduce(sum_sq) gives every lane "
    "of the row the row's total"
)


def one_pass_config(N: int, dtype):
    """The warp stage's heuristic; the exercise's row lengths all fit one pass (chunks == 1)."""
    from ...config import warp_config
    from ...primitives.tiling import RowTiling

    cfg = warp_config(N, dtype)
    assert RowTiling.make(N, dtype, cfg).chunks == 1, (N, dtype)
    return cfg


def _lanes_combine(rep, kernel):
    width = min(kernel.config.threads_per_row, WARP)
    n = rep.count("shfl.sync.bfly")
    if n != width.bit_length() - 1:
        raise CheckFailed(
            f"{n} shfl.sync.bfly for rows of {width} lanes",
            expected=f"{width.bit_length() - 1} (log2({width}) butterfly rounds)",
            seen=f"{n}",
            hint=NO_ROW_SUM if n == 0 else hints.MISSING_SHUFFLE,
        )
    return f"{n} shfl.sync.bfly ({width} lanes per row)"


_KERNEL_CASES = (
    (1000, "bf16", "bf16", None),
    (1000, "bf16", "fp32", None),
    (1000, "fp32", "fp32", None),
    (64, "bf16", "bf16", None),  # 8 lanes per row: four rows share a warp
    (1544, "fp32", "fp32", None),  # 13 vectors per thread, past 1000 (a bound fixed at 1000)
)


# BEGIN KEY
# fmt: off
WARP_KERNEL_MUTANTS = [
    *mutants(COMPILE,
        ("every CTA the same rows", "every CTA loads the same rows",
         "gX = cute.local_tile(mX, t.tiler, (bidx, 0))",
         "gX = cute.local_tile(mX, t.tiler, (0, 0))"),
        ("lanes never combine", "the lanes of a row never add their partial sums",
         "    sum_sq = self.warp_reduce(sum_sq)", "    pass"),
        ("stores rows past M", "runs past the end of the tensor",
         "    if row < M:\n        cute.copy(copy_O", "    cute.copy(copy_O"),
        ("weight never used", "not multiplied by the weight",
         "y = x * rstd * tXrW.load().to(Float32)", "y = x * rstd"),
    ),
    *COLUMN_MUTANTS,
    *mutants(COMPILE,
        ("the column bound fixed at 1000", "compare with self.N", [
            ("tXcX, self.N)  # columns < N", "tXcX, 1000)  # columns < N"),
            ("thr_W.partition_S(cX), self.N)", "thr_W.partition_S(cX), 1000)"),
        ]),
        ("y's tile cut from x", "the output is stored into x's tensor",
         "gO = cute.local_tile(mO,", "gO = cute.local_tile(mX,"),
        ("the weight's predicate from x's partition", "the partition of the copy that uses it",
         "predicate_cols(thr_W.partition_S(cX), self.N)", "predicate_cols(tXcX, self.N)"),
        ("the weight's fragment not retiled", "thr_W.retile(tXrW)", "thr_W.retile(tXrW)", "tXrW"),
    ),
    *SIM_VALUE_MUTANTS,
    *mutants(COMPILE,  # (a cold learner's, 2/2 before: the simulator named it and passed)
        ("the reduction under `if row < M`", "part of its warp does not reach", [
            ("    x = tXrX.load().to(Float32)\n",
             "    if row < M:\n        x = tXrX.load().to(Float32)\n"),
            ("    sum_sq = (x * x)", "        sum_sq = (x * x)"),
            ("    sum_sq = self.warp_reduce(sum_sq)", "        sum_sq = self.warp_reduce(sum_sq)"),
            ("    rstd = self.rstd(sum_sq, eps)", "        rstd = self.rstd(sum_sq, eps)"),
            ("    y = x * rstd", "        y = x * rstd"),
            ("    tXrO.store(y.to(mO.element_type))\n    if row < M:\n        cute.copy(copy_O",
             "        tXrO.store(y.to(mO.element_type))\n        cute.copy(copy_O"),
        ]),
    ),
    *mutants(COMPILE,  # the stage's own kernel pasted (a cold learner's, 2/2 before)
        ("the stage's row_sum", "is not given in this exercise",
         "    sum_sq = self.warp_reduce(sum_sq)",
         "    sum_sq = self.row_sum(sum_sq, self.reduction_buffer())"),
    ),
    *mutants(TIERS,
        ("y stored by lane 0 of each warp only", "some outputs were never written",
         STORE_Y,
         STORE_Y.replace("    cute.copy", "    if tidx % 32 == 0:\n            cute.copy")),
    ),
]
# fmt: on
# END KEY

warp_kernel = WholeKernel(
    id="02.warp_kernel",
    lesson=LESSON,
    answer="warp_kernel",
    title="the whole warp kernel: tile, load, reduce, normalise, store",
    mutants=WARP_KERNEL_MUTANTS,
    given=GIVEN_COPY,
    hole=KERNEL_HOLE,
    cases=_KERNEL_CASES,
    access="x read once, the weight read, y written once, tiled by the CTA (x and weight dtypes)",
    extra=_lanes_combine,
    more=(
        ptx_probe(
            KERNEL_HOLE,
            "every global load and store is 16 bytes",
            _probe_128,
            dtypes=("bf16", "fp32"),
        ),
    ),
    Ns=(64, 1000),
    hidden_Ns=(136, 520, 1544, 2040),
    config=one_pass_config,
    values="values vs rmsnorm_ref (M in 1/37/199, N in 64/1000, x and weight dtypes)",
    variants=(ROWS_MIXED_V, *WHOLE_VARIANTS),
    speed=gpu_speed(KERNEL_HOLE, fraction=0.85, N=4096),
).register()
