"""Lesson 03, the block stage: a hole in the block kernel and its heuristic.

03.block_reduce     the warps of a row meet through shared memory (a store, a barrier, loads)
03.threads_per_row  the heuristic: threads per row for N so that a thread holds <= 8 vectors
03.block_kernel     the whole kernel: the block stage's @cute.kernel, given block_reduce
"""

from __future__ import annotations

import re

import torch

from ...config import RowConfig, block_config, vector_elems
from .. import answer_key, hints
from ..checks import (
    EPS,
    Ptx,
    compiles,
    gpu_speed,
    gpu_values,
    no_local_memory,
    not_launched,
    ptx_probe,
    rmsnorm_inputs,
    thread_guards,
)
from ..hints import Variant
from ..holes import BLOCK_HOLE
from ..holes import BLOCK_KERNEL_HOLE as KERNEL_HOLE
from ..registry import COMPILE, GPU, TIERS, Check, CheckFailed, Exercise, mutants, register
from ..sim_values import sim_values
from .whole_kernel import (
    COLUMN_MUTANTS,
    GIVEN_COPY,
    SIM_VALUE_MUTANTS,
    STORE_Y,
    WHOLE_VARIANTS,
    WholeKernel,
    shape_pred,
    warp_total_first,
)

LESSON = "03_block_reduction"
WARP = 32

# ---- 03.block_reduce --------------------------------------------------------------------------
NO_STORE = (
    "nothing is written to shared memory: lane 0 of each warp must store the warp's total in "
    "its slot, buffer[row, warp_in_row], for the other warps of the row to read"
)
BARRIER_FIRST = (
    "the barrier comes before the writes: warps pass it, then read slots the other warps have "
    "not written yet; the barrier belongs between the writes and the reads"
)
OWN_PARTIAL = (
    "the result is off by about the number of warps per row: each warp used only its own "
    "partial; the cross-warp sum is missing"
)
DIVERGENT_BARRIER = (
    "a barrier inside a branch that depends on the thread: the threads that skip it never "
    "arrive, and the ones that reach it wait forever"
)
ROW_BRANCH_BARRIER = (
    "the block reduction's barrier (bar.sync) is inside a branch on the thread's row (a test "
    "of row against M): in the last CTA the threads whose row lies past M skip it, and the "
    "threads that reach it wait for them forever"
)
BUFFER_ROW = "rows of one CTA share the same slots: a row adds partials of another row's warps"

OWN_SLOT = (
    "each warp reads back only the slot it wrote itself, its own partial: the other warps' "
    "partials of the row are never added, and no warp ends with the row's total"
)
SOME_SLOTS = (
    "a warp reads back only some of its row's slots: the partials of the other warps of the "
    "row are missing from its sum; add all warps_per_row slots of the row"
)


class _SharedMachine:
    """Addresses of shared-memory accesses per thread, from the PTX (``dsmem_sim``'s
    interpreter: each address register evaluated from its one definition; %laneid added)."""

    def __init__(self, ptx: str):
        from ..dsmem_sim import Program

        self.prog = Program(ptx)

    def address(self, index: int, tid: int) -> int:
        from ..dsmem_sim import Machine

        m = Machine(self.prog, index, tid, 0)
        m.env["%laneid"] = tid % 32
        m.env["%warpid"] = tid // 32
        operand = self.prog.instrs[index][2][0 if self._is_store(index) else 1]
        base, _, off = operand.strip("[] ").partition("+")
        return int(m.val(base)) + (int(off) if off else 0)

    def _is_store(self, index: int) -> bool:
        return self.prog.instrs[index][1].startswith("st.")

    def accesses(self, kind: str) -> list[tuple[int, int]]:
        """(instruction index, 4-byte words) of each ``ld.shared``/``st.shared``."""
        out = []
        for i, (_, op, _, _) in enumerate(self.prog.instrs):
            if op.startswith(f"{kind}.shared") and "::cluster" not in op:
                v = re.search(r"\.v(\d)", op)
                out.append((i, int(v.group(1)) if v else 1))
        return out


def slots_read(ptx: str, threads_per_row: int, num_threads: int):
    """{thread: the shared-memory words (byte offsets) its ld.shared read} and {first thread
    of a warp: the words its st.shared write}, replayed from the PTX; None when the
    interpreter cannot tell (a loop, a load feeding an address)."""
    from ..dsmem_sim import Unknown

    sm = _SharedMachine(ptx)
    loads, stores = sm.accesses("ld"), sm.accesses("st")
    if not loads or not stores:
        return None
    reads, written = {}, {}
    try:
        for tid in range(num_threads):
            if tid % 32 == 0:  # lane 0 of each warp writes its slot
                written[tid] = {sm.address(i, tid) for i, _ in stores}
            words = set()
            for i, n in loads:
                a = sm.address(i, tid)
                words.update(a + 4 * k for k in range(n))
            reads[tid] = words
    except (Unknown, KeyError, TypeError, ValueError, IndexError):
        return None
    return reads, written


def _probe_slots(rep, ctx):
    """Every warp reads back every slot its row's warps wrote (replayed from the PTX per
    thread): a warp that reads only its own slot compiles to st, bar, ld like a right answer."""
    cfg = rep.config
    got = slots_read(rep.ptx, cfg.threads_per_row, cfg.num_threads)
    if got is None:
        return "not replayable from the PTX; left to the gpu tier"
    reads, written = got
    tpr = cfg.threads_per_row
    for w0 in range(0, cfg.num_threads, 32):
        row = w0 // tpr
        slots = set().union(*(written[w] for w in range(row * tpr, (row + 1) * tpr, 32)))
        seen = set().union(*(reads[t] for t in range(w0, w0 + 32)))
        if slots - seen:
            own = seen & slots == written[w0]
            nslots = len(slots)
            raise CheckFailed(
                f"warp {w0 // 32} (row {row}) reads {len(seen & slots)} of its row's "
                f"{nslots} slots",
                expected=f"the {nslots} slots of row {row}, read after the barrier",
                seen=f"{len(seen)} distinct shared-memory word(s) read by the warp's lanes",
                hint=OWN_SLOT if own else SOME_SLOTS if seen & slots else BUFFER_ROW,
            )
    return "each warp reads all of its row's slots (replayed per thread)"


def _divergent_barrier(rep) -> tuple[str, str] | None:
    """(the first CTA barrier not every thread reaches, the hint for the branch it is under:
    a test of the row against M, or another test of the thread index), or None."""
    ptx = Ptx(rep.ptx)
    guards = thread_guards(rep.ptx)
    for k, ins in enumerate(ptx.instrs):
        if re.match(r"(bar|barrier)(\.cta)?\.sync", ins.opcode) and guards[k]:
            on_row = any(shape_pred(ptx, p) for p in guards[k])
            return ins.text, ROW_BRANCH_BARRIER if on_row else DIVERGENT_BARRIER
    return None


def no_divergent_barrier(rep):
    bad = _divergent_barrier(rep)
    if bad:
        raise CheckFailed(
            f"`{bad[0]}` is reached only by the threads of a branch",
            expected="a barrier that every thread of the CTA executes",
            seen="bar.sync under a condition on the thread index",
            hint=bad[1],
        )


def launch_guard(rep) -> str | None:
    """Why the learner's block kernel (a ``kernel_report``) must not be launched (it would
    hang), or None: what the gpu tier checks before a launch (the lesson's own cell asks
    ``ptx.divergent_barriers``, the same scan)."""
    bad = _divergent_barrier(rep)
    return f"`{bad[0]}` is inside a branch on the thread index" if bad else None


def _probe_barrier(rep, ctx):
    no_divergent_barrier(rep)
    instrs = rep.instructions()
    op = [ln.split()[0] for ln in instrs]
    stores = [i for i, o in enumerate(op) if o.startswith("st.shared")]
    loads = [i for i, o in enumerate(op) if o.startswith("ld.shared")]
    bars = [i for i, o in enumerate(op) if o.startswith(("bar.sync", "barrier.sync"))]
    if not stores:
        raise CheckFailed(
            "no st.shared in the PTX",
            expected="st.shared (lane 0 writes its warp's total)",
            seen="none",
            hint=NO_STORE,
        )
    if not bars:
        raise CheckFailed(
            "no barrier in the PTX",
            expected="st.shared, then bar.sync, then ld.shared",
            seen=f"{len(stores)} st.shared, {len(loads)} ld.shared, no bar.sync",
            hint=hints.MISSING_BARRIER,
        )
    between = [b for b in bars if b > stores[-1] and (not loads or b < loads[0])]
    if not between:
        where = "before the st.shared" if bars[0] < stores[0] else "after the first ld.shared"
        raise CheckFailed(
            "the barrier does not separate the writes from the reads",
            expected="st.shared, then bar.sync, then ld.shared",
            seen=f"bar.sync {where}",
            hint=BARRIER_FIRST if bars[0] < stores[0] else hints.MISSING_BARRIER,
        )
    return f"st.shared -> bar.sync -> {len(loads)} ld.shared"


def _probe_reads(rep, ctx):
    n = rep.count("ld.shared")
    if n == 0:
        raise CheckFailed(
            "nothing is read back from shared memory",
            expected="ld.shared of the row's slots after the barrier",
            seen="no ld.shared (the compiler dropped the reads: their values are never used)",
            hint=OWN_PARTIAL,
        )
    return f"{n} ld.shared"


def _probe_rows(rep, ctx):
    """With several rows per CTA, every shared-memory address must depend on the thread index
    (the row and the warp are functions of it); a constant address is one slot for all rows."""
    if rep.config.num_threads // rep.config.threads_per_row < 2:
        return "one row per CTA"
    ptx = Ptx(rep.ptx)
    for ins in ptx.find("ld.shared") + ptx.find("st.shared"):
        if not any("%tid" in a.text for a in ptx.ancestors(ins)):
            raise CheckFailed(
                f"`{ins.text}`: the same slot for every row of the CTA",
                expected="a shared-memory address computed from the row of the thread",
                seen="an address that does not depend on the thread index",
                hint=BUFFER_ROW,
            )
    return "every row addresses its own slots"


def _thread_of_column(N: int, dtype, cfg: RowConfig) -> torch.Tensor:
    """Thread of the row that owns each column (the row TV layout; chunks repeat it)."""
    vec = vector_elems(dtype)
    return (torch.arange(N) // vec) % cfg.threads_per_row


def own_warp_variant(config_fn=block_config) -> Variant:
    """Every warp scales its elements with its own partial sum, not the row's."""

    def fn(x, w, eps):
        xf = x.float()
        M, N = xf.shape
        cfg = config_fn(N, x.dtype)
        warp = _thread_of_column(N, x.dtype, cfg) // WARP
        part = torch.zeros(M, cfg.warps_per_row).index_add_(1, warp, xf * xf)
        r = torch.rsqrt(part[:, warp] / N + eps)
        return xf * r * w.float()

    return Variant("each warp its own partial", fn, OWN_PARTIAL)


def first_row_variant(config_fn=block_config) -> Variant:
    """Every row of a CTA gets the sum of the CTA's first row."""

    def fn(x, w, eps):
        xf = x.float()
        M, N = xf.shape
        rows = config_fn(N, x.dtype).rows_per_cta
        ss = (xf * xf).sum(-1)
        ss = ss[(torch.arange(M) // rows) * rows]
        return xf * torch.rsqrt(ss[:, None] / N + eps) * w.float()

    return Variant("the first row's sum for every row of a CTA", fn, BUFFER_ROW)


WIDE_CFG = RowConfig(threads_per_row=256, num_threads=256)


def _wide(ctx):
    rep = ctx.report(BLOCK_HOLE, 16384, "bf16", WIDE_CFG)
    return f"{_probe_barrier(rep, ctx)}; {rep.registers} regs"


def _same_every_run(ctx):
    """A race on the buffer shows as outputs that change from run to run (same inputs)."""
    import torch as _t

    for N, cfg in ((4096, None), (4096, RowConfig(threads_per_row=512, num_threads=512))):
        _, launch = ctx.launcher(BLOCK_HOLE, N, _t.bfloat16, cfg)
        x, w = rmsnorm_inputs(8192, N, _t.bfloat16, ctx.torch_generator(salt="race"))
        outs = []
        for _ in range(5):
            out = _t.empty_like(x)
            launch(x, w, out, EPS)
            outs.append(out)
        _t.cuda.synchronize()
        for k, o in enumerate(outs[1:], 1):
            if not _t.equal(o, outs[0]):
                nbad = int((o != outs[0]).any(-1).sum())
                raise CheckFailed(
                    f"N={N}, {cfg or 'default config'}: run {k} differs from run 0 in {nbad} rows",
                    expected="bit-identical outputs for identical inputs",
                    seen=f"{nbad} of {x.shape[0]} rows changed",
                    hint=hints.MISSING_BARRIER,
                )
    return "5 runs bit-identical (2 configs, up to 16 warps per row)"


# BEGIN KEY
# fmt: off
BLOCK_REDUCE_MUTANTS = [
    *mutants(COMPILE,
        ("no barrier", "a barrier (cute.arch.barrier(), bar.sync in PTX) must sit",
         "    cute.arch.barrier()\n", ""),
    ),
    *mutants(TIERS,
        ("only the warp's own partial", "the cross-warp sum is missing",
         "    return total\n", "    return val\n"),
    ),
    *mutants(COMPILE,
        ("returns its own slot", "reads back only the slot it wrote itself",
         "    total = Float32(0.0)\n"
         "    for w in cutlass.range_constexpr(warps_per_row):\n"
         "        total += buffer[row, w]\n"
         "    return total\n",
         "    return buffer[row, warp % warps_per_row]\n"),
    ),
    *mutants(TIERS,
        ("every row reads row 0's slots", "rows of one CTA share the same slots",
         "total += buffer[row, w]", "total += buffer[0, w]"),
    ),
    *mutants(COMPILE,
        ("no @cute.jit", "@cute.jit", "@cute.jit\n", ""),
    ),
    *mutants(TIERS,
        ("barrier inside the lane-0 branch",
         "a barrier inside a branch that depends on the thread", [
            ("    cute.arch.barrier()\n", ""),
            ("= val\n", "= val\n        cute.arch.barrier()\n"),
        ]),
    ),
    *mutants(COMPILE,
        ("barrier before the writes", "the barrier comes before the writes", [
            ("    cute.arch.barrier()\n", ""),
            ("    if lane == 0:\n", "    cute.arch.barrier()\n    if lane == 0:\n"),
        ]),
    ),
]
# fmt: on
# END KEY

block_reduce = register(
    Exercise(
        id="03.block_reduce",
        finished=(
            "quack_edu.stages.block.BlockRMSNorm.block_reduce",
            "quack_edu.primitives.reduce.block_reduce",
        ),
        lesson=LESSON,
        answer="block_reduce_sum",
        title="the warps of a row meet in shared memory: store, barrier, load",
        points={COMPILE: 1, GPU: 1},
        mutants=BLOCK_REDUCE_MUTANTS,
    )
)
_VARIANTS = (own_warp_variant(), first_row_variant())
BLOCK_SIM = ((1000, "bf16", "bf16", None), (16384, "bf16", "bf16", WIDE_CFG))


def _refuse_divergent(rep) -> None:
    """Fail, before a launch, when not every thread reaches the kernel's barrier: a hung kernel
    cannot be interrupted inside the process that launched it."""
    bad = _divergent_barrier(rep)
    if bad:
        why = launch_guard(rep)
        raise CheckFailed(
            f"not launched: {why}; it would wait forever",
            expected="a barrier that every thread of the CTA executes",
            seen=why,
            hint=bad[1],
        )


def _guarded(check: Check) -> Check:
    """``check`` (gpu tier) refusing to launch a kernel whose barrier not every thread reaches
    (``_refuse_divergent``)."""

    def fn(ctx):
        _refuse_divergent(ctx.report(BLOCK_HOLE, 16384, "bf16", WIDE_CFG))
        return check.fn(ctx)

    return Check(check.name, check.tier, fn, check.hidden, check.needs)


def refuse_to_hang(ctx, kernel, rep) -> None:
    """The values' guard (``mixed_values(guard=)``): each config they launch is refused when
    a barrier is divergent there (a branch on the row diverges only with 2 rows per CTA)."""
    _refuse_divergent(rep)


def _guarded_kernel(check: Check) -> Check:
    """``_guarded`` for the whole-kernel exercise, the learner's kernel at 8 warps per row: not
    launched when a barrier is divergent, or when its shared-memory step (replayed) is wrong."""

    def fn(ctx):
        rep = ctx.report(KERNEL_HOLE, 16384, "bf16", None)
        _refuse_divergent(rep)
        # a buffer of the wrong shape: slots past its end (shared memory out of bounds)
        with not_launched():
            _warps_meet(rep, ctx.kernel(KERNEL_HOLE, 16384, "bf16"))
        return check.fn(ctx)

    return Check(check.name, check.tier, fn, check.hidden, check.needs)


#: the checks that replay the shared-memory slots from the PTX
_SLOT_CHECKS = (
    "every warp reads all of its row's slots",
    "every warp reads all of its row's slots, 8 warps per row (N=16384)",
    "each row of the CTA uses its own slots",
)
block_reduce.add(
    compiles(BLOCK_HOLE, N=1000, dtypes=("bf16", "fp32")),
    Check(
        "8 warps per row (N=16384): barrier between writes and reads",
        COMPILE,
        _wide,
        needs=("compiles",),
    ),
    ptx_probe(BLOCK_HOLE, "a barrier between the shared-memory writes and reads", _probe_barrier),
    ptx_probe(BLOCK_HOLE, "reads the row's slots back", _probe_reads),
    ptx_probe(BLOCK_HOLE, _SLOT_CHECKS[0], _probe_slots),
    Check(
        _SLOT_CHECKS[1],
        COMPILE,
        lambda ctx: _probe_slots(ctx.report(BLOCK_HOLE, 16384, "bf16", WIDE_CFG), ctx),
        needs=("compiles",),
    ),
    ptx_probe(BLOCK_HOLE, _SLOT_CHECKS[2], _probe_rows),
    # the values run when the reads of the PTX found the slots right: a wrong slot they name
    # leaves values no hint explains (a row reading slots it never wrote: garbage, or by chance
    # the poison value), and a second, unrelated hint would mislead
    sim_values(BLOCK_HOLE, BLOCK_SIM, variants=_VARIANTS, needs=("compiles", *_SLOT_CHECKS)),
    no_local_memory(BLOCK_HOLE),
    compiles(BLOCK_HOLE, dtypes=("fp16",), hidden=True),
    ptx_probe(
        BLOCK_HOLE,
        "barrier and reads at a random N",
        lambda rep, ctx: f"{_probe_barrier(rep, ctx)}; {_probe_reads(rep, ctx)}",
        dtypes=("fp16",),
        hidden=True,
    ),
    _guarded(gpu_values(BLOCK_HOLE, variants=_VARIANTS)),
    _guarded(
        gpu_values(
            BLOCK_HOLE,
            name="values with 8 warps per row (threads_per_row=256)",
            config=lambda N, dtype: WIDE_CFG,
            variants=(own_warp_variant(lambda N, dtype: WIDE_CFG),),
        )
    ),
    _guarded(
        Check("the same output on every run (no race)", GPU, _same_every_run, False, ("compiles",))
    ),
    _guarded(
        gpu_values(
            BLOCK_HOLE, variants=_VARIANTS, hidden=True, name="values at more shapes, grading seed"
        )
    ),
)


# ---- 03.threads_per_row -----------------------------------------------------------------------
# BEGIN KEY
@answer_key.keyed  # (the check calls it directly)
def tpr_ref(N, dtype):
    return block_config(N, dtype).threads_per_row


# END KEY


def _elems(dtype) -> int:
    return 16 // torch.tensor([], dtype=dtype).element_size()


VEC_BYTES = (
    "count 16-byte vectors: a vector holds 16 // element_size elements (8 bf16/fp16 but 4 fp32), "
    "so an fp32 row has twice the vectors of a bf16 row of the same N"
)
MAX_512 = (
    "at most 512 threads per row: a 512-thread CTA at 8 vectors per thread already takes the "
    "whole register file (65536 / 512 = 128 registers each); longer rows are walked in chunks "
    "(lesson 04 spreads them over a cluster instead)"
)
MIN_64 = (
    "at least 64 threads (two warps) per row: with one warp there is nothing to meet in shared "
    "memory (the block stage refuses it; short rows belong to the warp stage)"
)
AT_MOST_8 = (
    "too few threads: each would hold more than 8 vectors; the block stage keeps a thread at "
    "<= 8 vectors (~120 registers, so four 128-thread CTAs fit an SM and keep loads in flight)"
)
TOO_MANY = (
    "more threads than needed: half as many would still hold <= 8 vectors each; extra threads "
    "hold nothing, and fewer rows fit an SM"
)
POW2 = (
    "threads_per_row must be a power of two: the butterfly pairs lane i with lane i ^ offset, "
    "and the row's vectors must split evenly over its threads"
)
NOT_INT = "return the number of threads as an int"
ROUND_UP = (
    "a row whose N is not a whole number of vectors ends in a part of one, which a thread still "
    "loads (its missing elements masked): count the vectors rounded up"
)


# BEGIN KEY
def _tpr(N, elems, *, lo=64, hi=512, per=8):
    vectors = -(-N // elems)
    t = lo
    while t < hi and t * per < vectors:
        t *= 2
    return t


_TPR_VARIANTS = [
    Variant("8 elements per vector for every dtype", lambda N, dt: _tpr(N, 8), VEC_BYTES),
    Variant("no upper limit", lambda N, dt: _tpr(N, _elems(dt), hi=1 << 20), MAX_512),
    Variant("one warp minimum", lambda N, dt: _tpr(N, _elems(dt), lo=32), MIN_64),
    Variant("16 vectors per thread", lambda N, dt: _tpr(N, _elems(dt), per=16), AT_MOST_8),
    Variant(
        "the vectors rounded down", lambda N, dt: _tpr(N - N % _elems(dt), _elems(dt)), ROUND_UP
    ),
]
# END KEY
_DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: (4097 bf16 and 8193 fp32 end in a part of a vector: the vectors rounded down cross a power
#: of two there, a cold learner's floor passed every case that divides evenly)
_TPR_CASES = [(256, "bf16"), (1000, "bf16"), (4096, "bf16"), (4097, "bf16"), (4104, "bf16"),
              (8192, "fp16"), (16384, "bf16"), (32768, "bf16"), (65536, "bf16"), (1024, "fp32"),
              (2048, "fp32"), (8192, "fp32"), (8193, "fp32"), (16384, "fp32"),
              (40000, "fp32")]  # fmt: skip


def _constraint_hint(got, N, dtype) -> tuple[str, str]:
    """(what is wrong, hint) for an answer no known variant explains."""
    if isinstance(got, bool) or not isinstance(got, int):
        return f"returned {got!r} ({type(got).__name__})", NOT_INT
    if got <= 0 or got & (got - 1):
        return f"{got} is not a power of two", POW2
    if got < 64:
        return f"{got} threads = {max(got, 1) / 32:g} warp(s) per row", MIN_64
    if got > 512:
        return f"{got} threads per row", MAX_512
    vectors = -(-N // _elems(dtype))
    if -(-vectors // got) > 8 and got < 512:
        return f"{vectors} vectors over {got} threads = {-(-vectors // got)} per thread", AT_MOST_8
    return f"{vectors} vectors would fit {got // 2} threads at <= 8 each", TOO_MANY


def _tpr_cases(ctx, hidden):
    if not hidden:
        return [(N, _DT[d]) for N, d in _TPR_CASES]
    rng = ctx.rng("tpr")
    out = []
    for _ in range(12):
        dt = rng.choice(list(_DT.values()))
        n = _elems(dt) * rng.randint(1, 16384)
        out.append((n - rng.randint(0, _elems(dt) - 1) if rng.random() < 0.5 else n, dt))
    return out


def _tpr_check(hidden: bool) -> Check:
    def fn(ctx):
        cases = _tpr_cases(ctx, hidden)
        got = [ctx.call(N, dt) for N, dt in cases]
        for (N, dt), g in zip(cases, got, strict=True):
            want = tpr_ref(N, dt)
            if g == want and type(g) is int:
                continue
            hint = next((v.hint for v in _TPR_VARIANTS if answer_key.explains(v, cases, got)), None)
            what, fallback = _constraint_hint(g, N, dt)
            name = str(dt).replace("torch.", "")
            raise CheckFailed(
                f"threads_per_row({N}, {name}) = {g!r}: {what}",
                expected=f"{want} (a power of two in [64, 512], <= 8 vectors per thread, the "
                "fewest such)",
                seen=repr(g),
                hint=hint or fallback,
            )
        return f"{len(cases)} (N, dtype) cases agree with quack_edu.config.block_config"

    name = "random N and dtypes (grading seed)" if hidden else "N = 256 .. 65536, three dtypes"
    return Check(name, COMPILE, fn, hidden)


# BEGIN KEY
# fmt: off
THREADS_PER_ROW_MUTANTS = mutants(COMPILE,
    ("8 elements per vector for every dtype", "count 16-byte vectors",
     "elems = 16 // torch.tensor([], dtype=dtype).element_size()", "elems = 8"),
    ("no upper limit", "at most 512 threads per row",
     "while tpr < 512 and tpr * 8 < vectors:", "while tpr * 8 < vectors:"),
    ("starts at one warp", "at least 64", "tpr = 64 ", "tpr = 32 "),
    ("16 vectors per thread", "more than 8 vectors", "tpr * 8 < vectors", "tpr * 16 < vectors"),
    ("the vectors rounded down", "count the vectors rounded up", "-(-N // elems)", "N // elems"),
)
# fmt: on
# END KEY

threads_per_row = register(
    Exercise(
        id="03.threads_per_row",
        finished=("quack_edu.config.block_config",),  # its answer (red team 20 called it)
        lesson=LESSON,
        answer="threads_per_row",
        title="the block heuristic: threads per row so that a thread holds <= 8 vectors",
        points={COMPILE: 1},
        mutants=THREADS_PER_ROW_MUTANTS,
    )
)
threads_per_row.add(_tpr_check(hidden=False), _tpr_check(hidden=True))


# ---- 03.block_kernel --------------------------------------------------------------------------
# The whole kernel: the learner writes the block stage's @cute.kernel (rows that fit one pass),
# given the stage's helpers: row_copy, warp_reduce, block_reduce (the stage's), rstd.
# Its hole: ``holes.BLOCK_KERNEL_HOLE`` (KERNEL_HOLE here).

NEVER_MEET = (
    "the warps of a row never meet: each warp scales its elements with its own warp's sum, "
    "and the row's other warps never add theirs"
)
SHARED_SLOT = (
    "two warps write the same shared-memory slot, so one partial overwrites another: the buffer "
    "needs one fp32 slot per (row of the CTA, warp of the row), shape "
    "(rows_per_cta, warps_per_row)"
)


BUFFER_SHAPE = (
    "a warp does not read all of its row's partials back: the buffer given to block_reduce "
    "needs one fp32 slot per (row of the CTA, warp of the row), shape (rows_per_cta, "
    "warps_per_row); block_reduce takes the warps per row from the buffer's second mode"
)


WARP_FIRST = (
    "the lanes of a warp are not summed before the shared-memory step: block_reduce stores one "
    "value per warp (lane 0's), so it must already be the warp's total; lanes 1..31's squares "
    "are lost. self.warp_reduce(sum_sq) first, then block_reduce"
)


def _warps_meet(rep, kernel):
    ptx = rep.ptx
    if "bar.sync" not in ptx and "st.shared" not in ptx:
        raise CheckFailed(
            f"{kernel.config.threads_per_row} threads per row and no shared-memory step",
            expected="st.shared (each warp's partial), bar.sync, ld.shared (the row's slots)",
            seen="no st.shared, no bar.sync",
            hint=NEVER_MEET,
        )
    no_divergent_barrier(rep)
    warp_total_first(rep, kernel, "st.shared", "shared-memory store", WARP_FIRST)
    cfg = kernel.config
    got = slots_read(ptx, cfg.threads_per_row, cfg.num_threads)
    if got is not None:
        _, written = got
        owners: dict = {}
        for w0, words in written.items():
            for a in words:
                if a in owners:
                    raise CheckFailed(
                        f"warps {owners[a] // 32} and {w0 // 32} write the same slot",
                        expected="one slot per (row, warp)",
                        seen=f"byte {a} of shared memory written by both",
                        hint=SHARED_SLOT,
                    )
                owners[a] = w0
    try:
        return _probe_slots(rep, None)
    except CheckFailed as e:
        e.hint = BUFFER_SHAPE
        raise


def one_pass_config(N: int, dtype):
    """The block stage's heuristic; the exercise's row lengths all fit one pass."""
    from ...primitives.tiling import RowTiling

    cfg = block_config(N, dtype)
    assert RowTiling.make(N, dtype, cfg).chunks == 1, (N, dtype)
    return cfg


_KERNEL_CASES = (
    (1000, "bf16", "bf16", None),  # 64 threads per row: 2 rows x 2 warps per CTA
    (1000, "bf16", "fp32", None),
    (1000, "fp32", "fp32", None),
    (16384, "bf16", "bf16", None),  # 256 threads per row: 8 warps
)


#: the solution's shared-memory buffer and its two levels of reduction (mutants replace them)
OWN_BUFFER = (
    "    layout = cute.make_ordered_layout((t.rows_per_cta, t.warps_per_row), order=(1, 0))\n"
    "    buffer = SmemAllocator().allocate_tensor(Float32, layout, byte_alignment=16)\n"
)
TWO_LEVELS = (
    "    sum_sq = self.warp_reduce(sum_sq)  # the warp's sum, in every lane\n"
    "    sum_sq = self.block_reduce(sum_sq, buffer)  # the row's sum, in every thread of the row\n"
)

# BEGIN KEY
# fmt: off
BLOCK_KERNEL_MUTANTS = [
    *mutants(COMPILE,
        ("warps never meet", "the warps of a row never meet",
         "    sum_sq = self.block_reduce(sum_sq, buffer)", "    pass"),
        ("one slot per row", "one fp32 slot per (row of the CTA, warp of the row)",
         "(t.rows_per_cta, t.warps_per_row), order", "(t.rows_per_cta, 1), order"),
        ("every CTA the same rows", "every CTA loads the same rows",
         "gX = cute.local_tile(mX, t.tiler, (bidx, 0))",
         "gX = cute.local_tile(mX, t.tiler, (0, 0))"),
        ("stores rows past M", "runs past the end of the tensor",
         "    if row < M:\n        cute.copy(copy_O", "    cute.copy(copy_O"),
        ("weight never used", "not multiplied by the weight",
         "y = x * rstd * tXrW.load().to(Float32)", "y = x * rstd"),
    ),
    *COLUMN_MUTANTS,
    *mutants(COMPILE,  # the warp stage's kernel pasted: the stage's own buffer and row_sum
        ("the stage's buffer and row_sum", "self.reduction_buffer is not given", [
            (OWN_BUFFER, "    buffer = self.reduction_buffer()\n"),
            (TWO_LEVELS, "    sum_sq = self.row_sum(sum_sq, buffer)\n"),
        ]),
        ("its own buffer, the stage's row_sum", "the block stage's own row reduction",
         TWO_LEVELS, "    sum_sq = self.row_sum(sum_sq, buffer)\n"),
    ),
    *mutants(TIERS,
        ("the block reduction under `if row < M:`", "inside a branch on the thread's row",
         TWO_LEVELS, "    if row < M:\n" + TWO_LEVELS.replace("    sum_sq", "        sum_sq")),
        ("block_reduce without warp_reduce",
         "the lanes of a warp are not summed before the shared-memory step",
         "    sum_sq = self.warp_reduce(sum_sq)  # the warp's sum, in every lane\n", ""),
    ),
    *SIM_VALUE_MUTANTS,
    *mutants(TIERS,
        ("only the first row of each CTA stored", "some outputs were never written",
         STORE_Y,
         STORE_Y.replace("    cute.copy",
                         "    if tidx < t.threads_per_row:\n            cute.copy")),
    ),
]
# fmt: on
# END KEY

block_kernel = WholeKernel(
    id="03.block_kernel",
    lesson=LESSON,
    answer="block_kernel",
    title="the whole block kernel: a shared-memory buffer and two levels of reduction",
    mutants=BLOCK_KERNEL_MUTANTS,
    given=GIVEN_COPY,
    finished=(
        "quack_edu.stages.block.BlockRMSNorm.row_sum",
        "quack_edu.stages.block.BlockRMSNorm.reduction_buffer",
    ),
    hole=KERNEL_HOLE,
    cases=_KERNEL_CASES,
    access="x read once, the weight read, y written once; the warps of a row meet in shared "
    "memory (2 to 8 warps per row) at a barrier every thread reaches",
    extra=_warps_meet,
    Ns=(1000, 8200),
    hidden_Ns=(1544, 3000, 6136, 12296),
    config=one_pass_config,
    values="values vs rmsnorm_ref (M in 1/37/199, N in 1000/8200, x and weight dtypes)",
    variants=(*_VARIANTS, *WHOLE_VARIANTS),
    speed=gpu_speed(KERNEL_HOLE, fraction=0.85, N=8192),
    guard=refuse_to_hang,
    launch_guard=_guarded_kernel,
).register()
