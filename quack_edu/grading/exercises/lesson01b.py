"""Lesson 01b, the CuTe DSL (lesson 01's second part): a layout, a partition, a whole small kernel.

01.layout_offset    where a coordinate lands under a layout shape:stride (nested shapes too)
01.thread_elements  which (row, col) of a tile a thread of a tiled copy owns (the TV layout)
01.scale_kernel     a whole @cute.kernel: y = x * factor with local_tile, a TV partition,
                    register fragments, TensorSSA and a predicate for the tail; read from PTX

The first two run on the compile tier (any machine) by value against the DSL's own answers
(``tests/test_dsl_lesson.py`` checks the references against the DSL); the kernel is read from
the PTX it compiles to and that PTX is run on the CPU (``quack_edu.ptxsim``) on any machine,
and on a Hopper GPU the kernel runs too: y against ``x * factor``, the elements past N
poisoned and checked untouched.
"""

import math

from ...lessons.evidence import SCALE_THREADS, SCALE_TILE
from .. import checks, hints
from ..checks import Ptx, bounds, numbers_close, thread_guards, value_check
from ..hints import Variant
from ..registry import COMPILE, GPU, TIERS, CheckFailed, Exercise, mutants, register
from ..sandbox_rules import DSL_TRACE

LESSON = "01b_cute_dsl"


# ---- 01.layout_offset -------------------------------------------------------------------------
def layout_size(shape) -> int:
    return shape if isinstance(shape, int) else math.prod(layout_size(s) for s in shape)


# BEGIN KEY
def layout_offset_ref(shape, stride, coord, *, order=1, nested=True, by="stride"):
    """The offset of ``coord`` under ``shape:stride`` (CuTe's layout function). The keyword
    arguments make the known wrong versions: ``order=-1`` splits a 1-D index rightmost mode
    first, ``nested=False`` takes a nested mode's first size for its size, ``by="shape"``
    multiplies by the shape."""
    if isinstance(shape, int):
        return coord * (stride if by == "stride" else shape)
    if isinstance(coord, int):
        parts = []
        for s in shape[::order]:
            n = layout_size(s) if nested else (s if isinstance(s, int) else s[0])
            parts.append(coord % n)
            coord //= n
        coord = tuple(parts[::order])
    return sum(
        layout_offset_ref(s, d, c, order=order, nested=nested, by=by)
        for s, d, c in zip(shape, stride, coord, strict=True)
    )


# END KEY


def _layout_cases(ctx, hidden):
    if not hidden:
        return [
            (8, 1, 5),
            (8, 2, 3),
            ((4, 8), (8, 1), (1, 2)),
            ((4, 8), (1, 4), (3, 5)),
            ((4, 8), (8, 1), 13),
            ((4, 8), (1, 4), 13),
            ((2, 3), (3, 1), 4),
            ((4, (2, 4)), (2, (1, 8)), (3, (1, 2))),
            ((4, (2, 4)), (2, (1, 8)), (3, 5)),
            ((4, (2, 4)), (2, (1, 8)), 21),
            (((2, 2), 4), ((1, 8), 2), 11),
            ((3, 5, 2), (10, 1, 5), 17),
            ((128, 8), (8, 1), 130),
        ]
    rng = ctx.rng("layouts")
    cases = []
    for _ in range(24):
        shape, stride = [], []
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.35:
                shape.append((rng.randint(2, 4), rng.randint(2, 4)))
                stride.append((rng.randint(0, 16), rng.randint(0, 64)))
            else:
                shape.append(rng.randint(2, 9))
                stride.append(rng.randint(0, 64))
        shape, stride = tuple(shape), tuple(stride)
        i = rng.randrange(layout_size(shape))
        if rng.random() < 0.5:
            cases.append((shape, stride, i))
        else:  # the same index as a coordinate, nested modes given as 1-D indices of their own
            parts = []
            for s in shape:
                n = layout_size(s)
                parts.append(i % n)
                i //= n
            cases.append((shape, stride, tuple(parts)))
    return cases


# BEGIN KEY
_LAYOUT_VARIANTS = [
    Variant(
        "row-major split",
        lambda s, d, c: layout_offset_ref(s, d, c, order=-1),
        "a 1-D index counts the leftmost mode fastest (column-major, as CuTe does): for (4, 8), "
        "index 13 is coordinate (1, 3), not (1, 5)",
    ),
    Variant(
        "shape, not stride",
        lambda s, d, c: layout_offset_ref(s, d, c, by="shape"),
        "each coordinate is multiplied by its stride (the second half of shape:stride), "
        "not by its shape",
    ),
    Variant(
        "nested size",
        lambda s, d, c: layout_offset_ref(s, d, c, nested=False),
        "a nested mode such as (2, 4) holds 2 x 4 = 8 elements: split a 1-D index by the "
        "product of its sizes, then split it again inside the mode",
    ),
]

# fmt: off
LAYOUT_OFFSET_MUTANTS = mutants(COMPILE,
    ("splits an index row-major", "leftmost mode fastest", [
        ("for s in shape:", "for s in shape[::-1]:"),
        ("tuple(parts)", "tuple(parts[::-1])"),
    ]),
    ("multiplies by the shape", "multiplied by its stride",
     "return coord * stride", "return coord * shape"),
    ("a nested mode's size is its first size", "2 x 4 = 8 elements",
     "n = layout_size(s)", "n = s if isinstance(s, int) else s[0]"),
    ("flat modes only: a nested one raises", "splits again inside it",
     "return sum(layout_offset(s, d, c) for s, d, c in zip(shape, stride, coord))",
     "return sum(c * d for d, c in zip(stride, coord))"),
)
# fmt: on
# END KEY

#: a flat-only answer meets a nested mode: Python's TypeError says nothing of layouts
NESTED_MODE = (
    "a mode of the shape may itself be a tuple, as (2, 4) in (4, (2, 4)), with a tuple of "
    "strides and its own entry of the coordinate (a tuple, or an int: a 1-D index inside the "
    "mode); your code used such a mode as a number. A nested mode is a layout of its own: its "
    "entry of the coordinate splits again inside it, by the same rules as the whole layout"
)


def _nested_mode_error(e: BaseException) -> str | None:
    """A TypeError about a tuple (``can't multiply sequence by non-int of type 'tuple'``,
    ``unsupported operand type(s) for %: 'int' and 'tuple'``): arithmetic on a nested mode as
    on a number. Matched by name: the grader's worker rebuilds the error as its own class."""
    return NESTED_MODE if type(e).__name__ == "TypeError" and "tuple" in str(e) else None


#: the exercise is the layout function itself: an answer computes it, it does not ask the DSL
COMPUTE_IT = (
    "the exercise asks for the arithmetic of a layout: compute the offset in Python (split a "
    "1-D index, multiply by the strides), without a CuTe layout to evaluate"
)
#: torch's pure-Python copy of CuTe's layout algebra (red team 23: it evaluated the layout and
#: inverted the thread layout, no DSL trace run): tripwires where the exercise asks for it
PYCUTE = (
    *(f"torch.distributed._pycute.int_tuple.{f}" for f in ("crd2idx", "idx2crd", "crd2crd")),
    "torch.distributed._pycute.int_tuple.inner_product",
    "torch.distributed._pycute.layout.Layout.__call__",
    *(f"torch.distributed._pycute.layout.{f}" for f in ("left_inverse", "right_inverse")),
    "torch.distributed._pycute.layout.composition",
)
LAYOUT_CALLS = ("cute", "cutlass", "make_layout", "make_ordered_layout", "crd2idx", "Layout")

layout_offset = register(
    Exercise(
        id="01.layout_offset",
        lesson=LESSON,
        answer="layout_offset",
        title="a layout is a function: the offset of a coordinate under shape:stride",
        points={COMPILE: 1},
        mutants=LAYOUT_OFFSET_MUTANTS,
        forbidden=dict.fromkeys(LAYOUT_CALLS, COMPUTE_IT),
        # the screen reads names; a name built as a string reaches the DSL all the same (red
        # teams 21 and 22): no DSL trace may run, and the lesson's helper is the answer
        finished=(DSL_TRACE, "quack_edu.lessons.dsl.layout_offsets", *PYCUTE),
    )
)
layout_offset.add(
    value_check(
        "flat and nested layouts, coordinates and 1-D indices",
        layout_offset_ref,
        _layout_cases,
        variants=_LAYOUT_VARIANTS,
        close=numbers_close(0),
        errors=_nested_mode_error,
    ),
)
# BEGIN HIDDEN
layout_offset.add(
    value_check(
        "random layouts (grading seed)",
        layout_offset_ref,
        _layout_cases,
        variants=_LAYOUT_VARIANTS,
        close=numbers_close(0),
        errors=_nested_mode_error,
        hidden=True,
    )
)
# END HIDDEN


# ---- 01.thread_elements -----------------------------------------------------------------------
# BEGIN KEY
def thread_elements_ref(t, thr_shape, thr_stride, vec, *, thread_order="layout", vals="blocked"):
    """(row, col) of each value thread ``t`` moves in one tile of
    ``make_tiled_copy_tv(atom, make_layout(thr_shape, stride=thr_stride), make_layout((1, vec)))``.
    The keywords make the known wrong versions."""
    rows, cols = thr_shape
    for r in range(rows):
        for c in range(cols):
            if thread_order == "layout":
                here = r * thr_stride[0] + c * thr_stride[1]
            else:  # row-major whatever the stride
                here = r * cols + c
            if here == t:
                if vals == "blocked":
                    return [(r, c * vec + j) for j in range(vec)]
                if vals == "swapped":
                    return [(c * vec + j, r) for j in range(vec)]
                return [(r, c + j * cols) for j in range(vec)]
    return []


# END KEY


def _same_list(a, b) -> bool:
    try:
        return [tuple(x) for x in a] == [tuple(x) for x in b]
    except TypeError:
        return False


def _thread_cases(ctx, hidden):
    if not hidden:
        return [
            (1, (2, 4), (1, 2), 2),
            (5, (2, 4), (1, 2), 2),
            (1, (2, 4), (4, 1), 2),
            (6, (4, 8), (8, 1), 4),
            (6, (4, 8), (1, 4), 4),
            (37, (4, 32), (1, 4), 8),
            (17, (2, 16), (16, 1), 8),
            (3, (8, 4), (1, 8), 1),
        ]
    rng = ctx.rng("threads")
    cases = []
    for _ in range(16):
        rows, cols = rng.choice((1, 2, 4, 8)), rng.choice((2, 4, 8, 16, 32))
        row_major = rng.random() < 0.5
        stride = (cols, 1) if row_major else (1, rows)
        cases.append((rng.randrange(rows * cols), (rows, cols), stride, rng.choice((1, 2, 4, 8))))
    return cases


# BEGIN KEY
_THREAD_VARIANTS = [
    Variant(
        "row-major threads",
        lambda t, s, d, v: thread_elements_ref(t, s, d, v, thread_order="row-major"),
        "the thread layout says which thread sits at (row, col): thread = row * stride[0] + "
        "col * stride[1]; with stride (1, rows) consecutive threads go down a column",
    ),
    Variant(
        "interleaved values",
        lambda t, s, d, v: thread_elements_ref(t, s, d, v, vals="interleaved"),
        "the value layout (1, vec) gives each thread vec contiguous columns (one 16-byte access "
        "when vec x element = 16 bytes): columns c * vec .. c * vec + vec - 1",
    ),
    Variant(
        "(col, row)",
        lambda t, s, d, v: thread_elements_ref(t, s, d, v, vals="swapped"),
        "return (row, column) pairs: the thread's row first",
    ),
]

# fmt: off
THREAD_ELEMENTS_MUTANTS = mutants(COMPILE,
    ("reads the thread layout row-major", "col * stride[1]",
     "r * thr_stride[0] + c * thr_stride[1] == t", "r * cols + c == t"),
    ("interleaves the values", "contiguous columns", "(r, c * vec + j)", "(r, c + j * cols)"),
    ("swaps row and column", "(row, column)", "(r, c * vec + j)", "(c * vec + j, r)"),
)
# fmt: on
# END KEY

#: the exercise is the partition itself, predicted by hand: as for 01.layout_offset, an answer
#: computes it and does not ask the DSL (a tiled copy traced in a @cute.jit function)
PREDICT_IT = (
    "the exercise asks you to predict a partition by hand: compute each (row, col) in Python "
    "from the thread layout's strides and the value layout, without a CuTe layout or tiled "
    "copy to evaluate"
)
PARTITION_CALLS = (
    *LAYOUT_CALLS,
    "make_tiled_copy_tv",
    "make_copy_atom",
    "make_identity_tensor",
    "tv_coords",
)

thread_elements = register(
    Exercise(
        id="01.thread_elements",
        lesson=LESSON,
        answer="thread_elements",
        title="predict a partition: the (row, col) elements one thread of a tiled copy owns",
        points={COMPILE: 1},
        mutants=THREAD_ELEMENTS_MUTANTS,
        forbidden=dict.fromkeys(PARTITION_CALLS, PREDICT_IT),
        finished=(DSL_TRACE, "quack_edu.tools.inspect.tv_coords", *PYCUTE),  # (as layout_offset)
    )
)
thread_elements.add(
    value_check(
        "row- and column-major thread layouts",
        thread_elements_ref,
        _thread_cases,
        variants=_THREAD_VARIANTS,
        close=_same_list,
    ),
)
# BEGIN HIDDEN
thread_elements.add(
    value_check(
        "random tiled copies (grading seed)",
        thread_elements_ref,
        _thread_cases,
        variants=_THREAD_VARIANTS,
        close=_same_list,
        hidden=True,
    )
)
# END HIDDEN


# ---- 01.scale_kernel --------------------------------------------------------------------------
#: the launch the exercise states: a CTA of 128 threads owns a tile of 1024 elements, 8 a thread
#: (``lessons.evidence``, where the lesson's cell after the check compiles the same launch)
TILE, THREADS = SCALE_TILE, SCALE_THREADS
VEC = TILE // THREADS  # elements a thread copies: 8 (16 bytes of bf16/fp16)
RAGGED_N = 4104  # 4 full tiles and 8 elements: the fifth CTA must not run past the end


def _ptx(ctx, N, dtype="bf16") -> Ptx:
    """The PTX of the answer in the exercise's launch, compiled where the answer lives
    (``probes.lesson01b_02.scale_kernel_ptx``); an answer that is no kernel fails here."""
    from ..probes.lesson01b_02 import scale_kernel_ptx

    key = ("scale_ptx", N, dtype)
    if key not in ctx.cache:
        got = ctx.probe(scale_kernel_ptx, N, dtype)
        if not isinstance(got, dict):
            raise CheckFailed("the learner's process sent no PTX back")
        kind = str(got.get("kind"))
        if "kernel" not in kind.lower():
            raise CheckFailed(
                "scale_kernel is not a kernel" + str(got.get("call") or ""),
                expected="a function decorated with @cute.kernel (it is launched)",
                seen=f"{kind.rsplit('.', 1)[-1]}",
                hint="decorate scale_kernel with @cute.kernel: only a kernel can be "
                "launched (kernel(...).launch(grid=..., block=...)); @cute.jit is for "
                "host functions and device helpers",
            )
        if not isinstance(got.get("ptx"), str):
            raise CheckFailed("the learner's process sent no PTX back")
        ctx.cache[key] = Ptx(got["ptx"])
    return ctx.cache[key]


def _hidden_N(ctx) -> int:
    return 8 * ctx.rng("N").randint(200, 4000) + 8 * ctx.rng("tail").randint(0, 1)


def _check_vectors(ptx: Ptx, N: int) -> str:
    moves = ptx.find("ld.global") + ptx.find("st.global")
    if not ptx.find("ld.global") or not ptx.find("st.global"):
        raise CheckFailed(
            "the kernel does not load x and store y",
            expected="ld.global and st.global in the PTX",
            seen=f"{len(ptx.find('ld.global'))} loads, {len(ptx.find('st.global'))} stores",
            hint="cute.copy(tiled_copy, tXgX, tXrX) loads the thread's slice into registers; "
            "a second copy stores the result fragment into y's slice",
        )
    narrow = [i for i in moves if ".v4" not in i.opcode]
    if narrow:
        raise CheckFailed(
            f"{len(narrow)} of {len(moves)} global accesses are narrower than 16 bytes",
            expected="ld.global.v4.b32 / st.global.v4.b32: 8 bf16 (16 bytes) per instruction",
            seen=f"`{narrow[0].text}`",
            hint="each thread moves 8 elements = 16 bytes: make the copy atom with "
            "num_bits_per_copy=128 so one instruction moves them all",
        )
    return f"{len(moves)} 16-byte accesses"


def _check_scale(ptx: Ptx, N: int) -> str:
    params = {
        ld.dests[0] for p in ptx.scalar_params(".f32") for ld in ptx.param_loads(p) if ld.dests
    }
    for i in ptx.instrs:
        if i.opcode.startswith(("mul", "fma")) and set(i.srcs) & params:
            if any(a.opcode.startswith("ld.global") for a in ptx.ancestors(i)):
                if ".f32" not in i.opcode:
                    raise CheckFailed(
                        "the product is not computed in fp32",
                        expected="mul.f32 of the widened x and factor",
                        seen=f"`{i.opcode}`",
                        hint="widen x first: tXrX.load().to(Float32) * factor, then .to(the "
                        "output's dtype) before the store",
                    )
                return f"`{i.opcode}` scales the loaded x by factor"
    raise CheckFailed(
        "y is not x * factor",
        expected="a mul.f32 whose inputs are a loaded x and the factor argument",
        seen="factor never multiplies a loaded value",
        hint="y = x * factor: multiply the TensorSSA value from tXrX.load() (in Float32) by "
        "factor, then store it in the result fragment",
    )


def _check_tile(ptx: Ptx, N: int) -> str:
    for ld in ptx.find("ld.global"):
        if any("%ctaid.x" in a.text for a in ptx.ancestors(ld)):
            return "the load address depends on the CTA index"
    raise CheckFailed(
        "every CTA reads the same elements",
        expected="a load address that depends on %ctaid.x (the CTA's index)",
        seen="addresses that do not",
        hint="CTA bidx owns tile bidx: cute.local_tile(mX, (TILE,), (bidx,)) with bidx from "
        "cute.arch.block_idx()",
    )


OFF_BY_ONE = (
    "the tail guard is off by one: it lets in a thread whose first element is at index N, one "
    "past the last (x holds indices 0 .. N - 1), and that thread loads and stores its 8 "
    "elements past the end"
)


#: what a guard compares and why, without the line that does it (a learner asked for a hint,
#: not the answer)
TAIL_GUARD = (
    "the last tile runs past the end when N is not a multiple of it (4104 is 4 tiles and 8 "
    "elements): the last CTA's threads whose elements start at N or later must copy nothing, "
    "or they read and write past the vectors. Each thread can know where its elements sit: "
    "an identity tensor of x's shape, tiled and partitioned exactly like x (section 4), holds "
    "their coordinates. Compare the coordinate of the thread's first element with x's size (a "
    "comparison of a coordinate with a bound, section 5), and run the load, the multiply and "
    "the store only when it is inside"
)


STORE_UNGUARDED = (
    "the store of y is not guarded: the tail test keeps the load of x inside the vector, but "
    "the store runs for every thread, and the last CTA's threads past N write 16 bytes each "
    "past the end of y. The store needs the same test as the load"
)


def _unguarded(ptx: Ptx, near) -> list:
    """The global loads and stores that no test of a coordinate against ``near`` (N - 8 .. N)
    guards: neither predicated on such a predicate (or one made from it: ``and.pred``), nor
    inside a forward branch over one (``ptx.thread_guards``)."""
    consts = {str(v) for v in near}

    def tail(p: Ptx, pred: str) -> bool:
        return any(
            s.opcode.startswith("setp") and any(o.strip() in consts for o in s.operands)
            for j in p.defs.get(pred, [])
            for s in (p.instrs[j], *p.ancestors(p.instrs[j]))
        )

    guards = thread_guards(ptx.text, guard=tail)
    return [
        i
        for i in ptx.instrs
        if i.opcode.startswith(("ld.global", "st.global")) and not guards.get(i.index)
    ]


def _check_guard(ptx: Ptx, N: int) -> str:
    """Some comparison of a coordinate with N (or with N - 8 .. N - 1: the same test on a
    thread's first element, a multiple of 8) guards the tail, and none whose use the PTX shows
    (``bounds``: a branch over the copies, or copies predicated on it) lets in the thread whose
    first element is N, past the end; every load of x and store of y is under such a test.
    (A guard that shuts out the last vector leaves outputs unwritten: the gpu tier's values
    show it.)"""
    near = range(N - VEC, N + 1)
    for b in bounds(ptx.text, near):
        if b.admits(N):
            raise CheckFailed(
                f"`{b.text}` lets a thread whose first element is at {N} copy",
                expected=f"the thread at {N - VEC} (the last 8 elements) in, the one at {N} out",
                seen=f"`{b.text}` {'holds' if b.runs_if else 'fails'} for {N}, and the copies "
                "run then",
                hint=OFF_BY_ONE,
            )
    for s in ptx.find("setp"):
        if any(o.strip() in {str(v) for v in near} for o in s.operands):
            loose = _unguarded(ptx, near)
            if loose:
                what = "store of y" if loose[0].opcode.startswith("st") else "load of x"
                raise CheckFailed(
                    f"a {what} that the tail test does not guard",
                    expected=f"every ld.global and st.global under `{s.text}` (a branch over "
                    "them, or predicated on it)",
                    seen=f"`{loose[0].text}` runs for every thread",
                    hint=STORE_UNGUARDED
                    if what.startswith("store")
                    else "the load of x is "
                    "not guarded: the last CTA's threads past N read 16 bytes each past the "
                    "end of x. The load needs the tail test too",
                )
            return f"`{s.text}` guards the tail, the load and the store"
    raise CheckFailed(
        f"nothing keeps the last CTA inside the {N} elements",
        expected=f"a comparison of the element's coordinate with N = {N} (setp ... {N - 1})",
        seen="no such comparison: threads of the last tile read and write past the end",
        hint=TAIL_GUARD,
    )


def _ptx_check(name, probe, N, dtype="bf16", hidden=False, needs=("compiles",)):
    def fn(ctx):
        n = _hidden_N(ctx) if hidden and N is None else N
        return probe(_ptx(ctx, n, dtype), n)

    return checks.Check(name, COMPILE, fn, hidden, tuple(needs))


def _compare_scaled(x, y, N: int, where: str, factor: float) -> None:
    """CheckFailed unless ``y[:N]`` is ``x[:N] * factor`` (in fp32, rounded to x's dtype) and
    ``y[N:]``, the rest of the last tile, still holds the poison it was filled with."""
    import torch

    want = (x[:N].float() * factor).to(x.dtype)
    got = y[:N]
    if not torch.equal(y[N:], torch.full_like(y[N:], checks.POISON)):
        raise CheckFailed(
            f"{where}: elements past N were written",
            expected=f"y[{N}:] untouched",
            seen=f"{int((y[N:] != checks.POISON).sum())} of them changed",
            hint=TAIL_GUARD,
        )
    if torch.equal(got, x[:N]):
        raise CheckFailed(
            f"{where}: y is x",
            expected=f"y = x * {factor}",
            seen="y = x",
            hint="y = x * factor: multiply the loaded value by factor before the store",
        )
    bad = (got.float() - want.float()).abs() > 1e-2 * want.float().abs() + 1e-6
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise CheckFailed(
            f"{where}: {int(bad.sum())} of {N} elements are wrong",
            expected=f"y[{i}] = {float(want[i]):g}",
            seen=f"{float(got[i]):g}",
            hint=_wrong_values_hint(x[:N], got, factor),
        )


def _wrong_values_hint(x, got, factor: float) -> str:
    """Every element x times one other number: the arithmetic is wrong; else the elements
    are in the wrong places."""
    nz = x.float() != 0
    k = (got.float()[nz] / x.float()[nz]).median().item() if bool(nz.any()) else 0.0
    if k == k and abs(k - factor) > 1e-2 * abs(factor):  # (k == k: not NaN)
        scaled = (got.float() - k * x.float()).abs() <= 1e-2 * (k * x.float()).abs() + 1e-6
        if bool(scaled.all()):
            return (
                f"every element of y is x times {k:g}, not x times factor ({factor:g}): the "
                "elements are the right ones, the arithmetic between the load and the store "
                "is not (y = x * factor, in fp32, then converted to y's type)"
            )
    return (
        "each thread must store its own VEC elements of its CTA's tile: local_tile by "
        "block_idx, get_slice by thread_idx"
    )


SIM_FAULT = (
    "the kernel reads or writes outside x and y: a thread copies elements past the last tile, "
    "or an address is computed from something other than its CTA's tile and its own slice "
    "(local_tile by block_idx, get_slice by thread_idx)"
)


def _sim_values(ctx) -> str:
    """y from the answer's PTX run on the CPU (``quack_edu.ptxsim``) in the exercise's launch at
    N = 4104 (bf16), x and y whole tiles long, y poisoned past N as on a GPU: the values of
    the gpu tier's first case, on any machine (a few hundred simulated steps)."""
    import torch

    from ...lessons.evidence import scale_simulated
    from ...ptxsim import MemoryFault, SimError, StepLimit
    from ..sim_values import ENDLESS, STEP_BUDGET

    N, factor = RAGGED_N, 2.5
    ptx = _ptx(ctx, N)
    padded = -(-N // TILE) * TILE  # the last CTA's tile, whole: nothing past it is read
    x = torch.randn(padded, generator=ctx.torch_generator(salt="scale sim")).to(torch.bfloat16)
    y = torch.full_like(x, checks.POISON)
    where = f"N={N} bf16 (the PTX run on the CPU)"
    try:
        y_sim = scale_simulated(ptx.text, x, y, factor, max_steps=STEP_BUDGET)
    except StepLimit:
        raise CheckFailed(
            f"{where}: the kernel did not end within {STEP_BUDGET} simulated steps",
            seen=f"still running after {STEP_BUDGET}",
            hint=ENDLESS,
        ) from None
    except MemoryFault as e:
        raise CheckFailed(
            f"{where}: an access outside x and y", seen=str(e), hint=SIM_FAULT
        ) from None
    except Exception as e:  # noqa: BLE001 (what the simulator cannot run is not judged right)
        reason = str(e)[:240] if isinstance(e, SimError) else hints.short_error(e, 240)
        raise CheckFailed(
            f"{where}: not simulated", seen=reason, hint=hints.NOT_SIMULATED
        ) from None
    _compare_scaled(x, y_sim, N, where, factor)
    return f"y = x * {factor} at N={N}, y past N untouched (the PTX run on the CPU)"


def _gpu_values(hidden: bool):
    def fn(ctx):
        import torch

        from ..probes.lesson01b_02 import scale_kernel_run

        tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}
        cases = [(_hidden_N(ctx), "fp16")] if hidden else [(RAGGED_N, "bf16"), (4096, "fp16")]
        gen = ctx.torch_generator("cuda", "scale")
        for N, dtype in cases:
            _ptx(ctx, N, dtype)  # the compile-tier reasons first (not a kernel, ...)
            padded = -(-N // TILE) * TILE  # the last CTA's tile, whole: nothing past it is read
            x = torch.randn(padded, device="cuda", dtype=tdt[dtype], generator=gen)
            y = torch.full_like(x, checks.POISON)
            factor = 2.5
            # launched where the answer lives; y comes back whole, past N too
            y = ctx.probe(scale_kernel_run, x, y, N, dtype, factor)
            if not isinstance(y, torch.Tensor) or y.shape != x.shape or y.dtype != x.dtype:
                raise CheckFailed(f"N={N} {dtype}: the learner's process sent no y back")
            _compare_scaled(x, y.to(x.device), N, f"N={N} {dtype}", factor)
        return ", ".join(f"N={n} {d}" for n, d in cases)

    name = "values on the GPU, grading seed" if hidden else "values on the GPU (y past N kept)"
    return checks.Check(name, GPU, fn, hidden)


# BEGIN KEY
# fmt: off
SCALE_KERNEL_MUTANTS = [
    *mutants(COMPILE,
        ("2-byte accesses", "num_bits_per_copy=128",
         "num_bits_per_copy=128", "num_bits_per_copy=16"),
    ),
    *mutants(TIERS,
        ("forgets the factor", "y = x * factor", "x * factor", "x"),
    ),
    *mutants(COMPILE,
        ("every CTA takes tile 0", "CTA bidx owns tile bidx", "(bidx,)", "(0,)"),
    ),
    *mutants(TIERS,
        ("no guard for the tail", "the last tile runs past the end",
         "if cute.elem_less(tXcX[0], mX.shape):", "if True:"),
    ),
    *mutants(COMPILE,
        ("a <= tail guard", "the tail guard is off by one",
         "if cute.elem_less(tXcX[0], mX.shape):", "if tXcX[0][0] <= mX.shape[0]:"),
    ),
    *mutants(COMPILE,
        ("not a kernel", "@cute.kernel", "@cute.kernel\n", ""),
    ),
    *mutants(TIERS,  # (the PTX reads right: only the values show it)
        ("x * factor + x", "not x times factor", "(x * factor)", "(x * factor + x)"),
    ),
    *mutants(COMPILE,
        ("the store of y after the guard", "the store of y is not guarded",
         "        cute.copy(copy, tYrY, tYgY)\n", "    cute.copy(copy, tYrY, tYgY)\n"),
    ),
]
# fmt: on
# END KEY

scale_kernel = register(
    Exercise(
        id="01.scale_kernel",
        lesson=LESSON,
        answer="scale_kernel",
        title="a whole kernel: y = x * factor, a 1024-element tile per CTA, 16 bytes per thread",
        points={COMPILE: 2, GPU: 1},
        mutants=SCALE_KERNEL_MUTANTS,
    )
)
scale_kernel.add(
    _ptx_check("compiles", lambda p, n: f"{len(p.instrs)} PTX instructions", RAGGED_N, needs=()),
    _ptx_check("16-byte loads and stores", _check_vectors, RAGGED_N),
    _ptx_check("y = x * factor in fp32", _check_scale, RAGGED_N),
    _ptx_check("each CTA its own tile", _check_tile, RAGGED_N),
    # (after the tile: with every CTA on tile 0 the compiler folds a right guard away)
    _ptx_check("the tail is guarded", _check_guard, RAGGED_N, needs=("each CTA its own tile",)),
    checks.Check(  # the net for what reading the PTX misses: a mistake it names is not repeated
        f"values on the CPU (the PTX simulated, N={RAGGED_N} bf16, y past N kept)",
        COMPILE,
        _sim_values,
        needs=(
            "compiles",
            "y = x * factor in fp32",
            "each CTA its own tile",
            "the tail is guarded",
        ),
    ),
    _ptx_check("fp16 at a random N: compiles", lambda p, n: f"N={n}", None, "fp16", True, ()),
    _ptx_check("fp16 at a random N: 16-byte accesses", _check_vectors, None, "fp16", True),
    _ptx_check("fp16 at a random N: scaled", _check_scale, None, "fp16", True),
    _gpu_values(hidden=False),
    _gpu_values(hidden=True),
)
