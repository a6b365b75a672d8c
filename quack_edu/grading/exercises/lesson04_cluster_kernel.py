"""Lesson 04, the cluster stage: the whole kernel (04.cluster_kernel).

The learner writes the cluster stage's ``@cute.kernel``: a slice of the row per CTA of the
cluster, the DSMEM exchange between a cluster wait and the mbarrier wait, and the barriers that
keep a CTA from leaving while its peers still read it. Its checks are every whole kernel's
(``whole_kernel.WholeKernel``) with a cluster forced (``lesson04.exchange_config``), the
protocol read from the PTX (``_protocol``) and the exchange replayed (``lesson04``'s
``exchange_replay_check``); the gpu tier launches nothing the replay or the protocol says could
hang (``_kernel_guard``). Without a GPU the whole cluster runs in ptxsim (``sim_values``, as
for every whole kernel of a simulated stage): its values, in three orders, with every read of
the slots checked against the mbarrier wait that must order it (a wait on the wrong parity is a
race there, a final cluster wait without its arrive a hang; ``ORDERING``: a race's hint).
"""

from __future__ import annotations

from .. import hints
from ..checks import gpu_speed, not_launched
from ..holes import CLUSTER_KERNEL_HOLE as KERNEL_HOLE
from ..ptx import split_operands
from ..registry import COMPILE, TIERS, Check, CheckFailed, mutants
from .lesson04 import LESSON, VERDICT_HINTS, exchange_config, exchange_replay_check, wide_config
from .whole_kernel import (
    COLUMN_MUTANTS,
    GIVEN_COPY_REDUCE,
    SIM_VALUE_MUTANTS,
    STORE_Y,
    WholeKernel,
    warp_total_first,
)

# ---- 04.cluster_kernel ------------------------------------------------------------------------
WEIGHT_TILE = "gW = cute.local_tile(mW2, t.tiler, (0, rank))"
# The whole kernel: the learner writes the cluster stage's @cute.kernel with one row block per
# CTA (seq_rows = 1), given exchange_smem (the buffer and the armed mbarrier), warp_reduce,
# cluster_exchange (the stage's send), combine_buffer and rstd. Graded with a cluster forced.
# Its hole: ``holes.CLUSTER_KERNEL_HOLE`` (KERNEL_HOLE here).

SAME_ROWS = (
    "every cluster loads the same rows: the tile of x (and of y) must be chosen by the CTA's "
    "row block (block_idx)"
)
SAME_SLICE = (
    "every CTA of the cluster loads the same columns: CTA rank r of the cluster owns the r-th "
    "slice of the row (tile_cols columns), for x, the weight and y"
)
SEND_TOO_EARLY = (
    "the first remote store is not behind a cluster wait: a peer that started late may not have "
    "initialised its mbarrier yet, and a store that lands before the init is lost (that peer "
    "then waits forever)"
)
READ_TOO_EARLY = (
    "the slots are read before the peers' partials have landed: nothing waits on this CTA's "
    "mbarrier between the exchange and the combine (its phase completes only when every "
    "expected byte has arrived)"
)
WRONG_PARITY = (
    "the mbarrier wait asks for phase parity 1: this mbarrier is in its first phase, phase 0, "
    "until the peers' bytes complete it, and a wait on the other parity takes that phase for "
    "one already completed (the one before), so it returns at once and the slots are read "
    "before the peers' partials have landed"
)
ORDERING = (
    "a CTA reads its slots with nothing ordering the peers' st.async before the read (or stores "
    "into a peer before its mbarrier is ready): the read must follow a wait on this CTA's "
    "mbarrier for the phase the stores complete (its first: parity 0), and the first remote "
    "store must follow the cluster wait that pairs with every peer's arrive after its init"
)
NO_COMBINE = (
    "the buffer is never read: the row's total is the sum of its slots, which the peers filled"
)


WARP_FIRST = (
    "the lanes of a warp are not summed before the exchange: cluster_exchange sends one value "
    "per warp (per row group), so it must already be the warp's total; the other lanes' squares "
    "are lost"
)
UNPAIRED_WAIT = (
    "a cluster_wait with no cluster_arrive of its own before it: a wait completes when every "
    "CTA of the cluster has arrived, and that arrive never comes, so the kernel hangs"
)
UNWAITED_ARRIVE = (
    "a cluster_arrive with no cluster_wait after it: this CTA may exit while a peer still "
    "stores into its shared memory"
)


def _pairing(ops: list[str]) -> str:
    """Every barrier.cluster.wait follows an arrive not yet waited for (an arrive, relaxed or
    not, then its wait), and no arrive is left unwaited at the end."""
    pending, seq = 0, []
    for o in ops:
        if not o.startswith("barrier.cluster"):
            continue
        seq.append(o.removeprefix("barrier.cluster."))
        if o.startswith("barrier.cluster.arrive"):
            pending += 1
        elif o.startswith("barrier.cluster.wait"):
            if pending == 0:
                raise CheckFailed(
                    f"cluster barrier {len(seq)} is a wait with no arrive before it",
                    expected="arrive.relaxed (exchange_smem), wait, ..., arrive, wait",
                    seen=" -> ".join(seq),
                    hint=UNPAIRED_WAIT,
                )
            pending -= 1
    if pending:
        raise CheckFailed(
            "the kernel ends with a cluster arrive no wait follows",
            expected="arrive.relaxed (exchange_smem), wait, ..., arrive, wait",
            seen=" -> ".join(seq),
            hint=UNWAITED_ARRIVE,
        )
    return " -> ".join(seq)


def _first_phase(wait: str) -> None:
    """``wait`` (``mbarrier.try_wait.parity ... [mbar], parity, ...``) waits for the phase the
    exchange completes, the mbarrier's first (parity 0). A parity in a register is left to the
    gpu tier (this kernel has no loop that would change it)."""
    ops = split_operands(wait.split(None, 1)[1].rstrip(";")) if " " in wait else []
    parity = ops[2].strip() if ".parity" in wait and len(ops) > 2 else "0"
    if not parity.startswith("%") and parity != "0":
        raise CheckFailed(
            f"the mbarrier wait is for phase parity {parity}",
            expected="a wait for the phase the exchange completes: this mbarrier's first",
            seen=f"`{wait.rstrip(';').strip()}`",
            hint=WRONG_PARITY,
        )


def _protocol(rep, kernel):
    """The order the PTX shows: cluster wait < first st.async; mbarrier wait between the last
    st.async and the first read of the buffer."""
    lines = rep.instructions()
    ops = [ln.split()[0].rstrip(";") for ln in lines]
    sends = [i for i, o in enumerate(ops) if o.startswith("st.async")]
    if not sends:
        return "no st.async (the exchange replay reports it)"
    waits = [i for i, o in enumerate(ops) if o == "barrier.cluster.wait"]
    if not any(i < sends[0] for i in waits):
        raise CheckFailed(
            "no barrier.cluster.wait before the first st.async",
            expected="barrier.cluster.arrive.relaxed (exchange_smem), barrier.cluster.wait, "
            "then st.async",
            seen=" -> ".join(o for o in ops if "barrier.cluster" in o or o.startswith("st.async"))
            or "nothing",
            hint=SEND_TOO_EARLY,
        )
    reads = [i for i, o in enumerate(ops) if o.startswith("ld.shared") and i > sends[0]]
    if not reads:
        raise CheckFailed(
            "no ld.shared after the exchange",
            expected="ld.shared of the row's slots after the mbarrier wait",
            seen="none",
            hint=NO_COMBINE,
        )
    mwaits = [i for i, o in enumerate(ops) if o.startswith("mbarrier.try_wait")]
    if not any(sends[-1] < i < reads[0] for i in mwaits):
        raise CheckFailed(
            "the buffer is read before any mbarrier wait",
            expected="st.async, then mbarrier.try_wait, then ld.shared",
            seen=f"{len(mwaits)} mbarrier.try_wait, none between the exchange and the first read",
            hint=READ_TOO_EARLY,
        )
    for i in (i for i in mwaits if sends[-1] < i < reads[0]):
        _first_phase(lines[i])
    _pairing(ops)
    warp_total_first(rep, kernel, "st.async", "exchange", WARP_FIRST)
    return "cluster wait -> st.async -> mbarrier wait -> ld.shared; arrive/wait paired"


def _kernel_guard(ctx, kernel, rep):
    """Refuse to launch a kernel that could hang: a wrong exchange (replayed) or a protocol
    out of order."""
    with not_launched():
        _protocol(rep, kernel)
    from ..dsmem_sim import exchange_from_ptx, judge_exchange

    t = kernel.tiling
    ex = exchange_from_ptx(rep.ptx, t.cluster_n, t.num_threads)
    if ex is None:
        raise CheckFailed(
            "not launched: the exchange could not be replayed from the PTX",
            hint="keep the exchange to the stage's cluster_exchange between the cluster wait "
            "and the mbarrier wait",
        )
    v = judge_exchange(
        ex,
        threads_per_row=t.threads_per_row,
        expected_bytes=t.rows_per_cta * t.warps_per_row * t.cluster_n * 4,
        rows_per_cta=t.rows_per_cta,
    )
    if not v.safe:
        raise CheckFailed(
            f"not launched: {v.problem}",
            seen="; ".join(v.details),
            hint=VERDICT_HINTS.get(v.kind, hints.CLUSTER_SYNC),
        )


def _guarded_speed(check: Check) -> Check:
    """``check`` (the speed at 65536 bf16, the heuristic's 4-CTA cluster) launched only when
    the kernel cannot hang there."""

    def fn(ctx):
        kernel = ctx.kernel(KERNEL_HOLE, 65536, "bf16")
        _kernel_guard(ctx, kernel, ctx.report(KERNEL_HOLE, 65536, "bf16"))
        return check.fn(ctx)

    return Check(check.name, check.tier, fn, check.hidden, check.needs)


_KERNEL_CASES = (
    (1000, "bf16", "bf16", exchange_config),
    (1000, "bf16", "fp32", exchange_config),
    (1000, "fp32", "fp32", exchange_config),
    (2000, "bf16", "bf16", wide_config),  # 2 CTAs x 2 warps x 2 rows
)


# BEGIN KEY
# fmt: off
CLUSTER_KERNEL_MUTANTS = [
    *mutants(COMPILE,
        ("sends before the peers are ready", "not behind a cluster wait",
         "    cute.arch.cluster_wait()  # every peer's", "    pass  # every peer's"),
        ("reads the slots before they land", "read before the peers' partials have landed",
         "    cute.arch.mbarrier_wait(mbar_ptr, phase=0)", "    pass"),
        ("every CTA the same slice", "the same columns",
         "gX = cute.local_tile(mX, t.tiler, (bidx, rank))",
         "gX = cute.local_tile(mX, t.tiler, (bidx, 0))"),
        ("no exchange", "peers never receive",
         "    self.cluster_exchange(sum_sq, buffer, mbar_ptr)", "    pass"),
    ),
    *COLUMN_MUTANTS,
    *mutants(TIERS,
        ("waits on parity 1", "the mbarrier wait asks for phase parity 1",
         "mbarrier_wait(mbar_ptr, phase=0)", "mbarrier_wait(mbar_ptr, phase=1)"),
        ("the final wait with no arrive",
         "a cluster_wait with no cluster_arrive of its own before it",
         "    cute.arch.cluster_arrive()  # done reading the buffer\n", ""),
        ("the final wait before its arrive",
         "a cluster_wait with no cluster_arrive of its own before it", [
            ("    cute.arch.cluster_arrive()  # done reading",
             "    cute.arch.cluster_wait()  # done reading"),
            ("    cute.arch.cluster_wait()  # no CTA exits",
             "    cute.arch.cluster_arrive()  # no CTA exits"),
        ]),
        ("the exchange without warp_reduce",
         "the lanes of a warp are not summed before the exchange",
         "    sum_sq = self.warp_reduce(sum_sq)\n", ""),
    ),
    *SIM_VALUE_MUTANTS,
    *mutants(TIERS,
        ("the weight's slice of rank 0 in every CTA", "outputs differ from rmsnorm_ref",
         WEIGHT_TILE, WEIGHT_TILE.replace("(0, rank)", "(0, 0)")),
    ),
    *mutants(COMPILE,
        ("the weight's slice of rank 0 in every CTA (its PTX)", "the same slice of the weight",
         WEIGHT_TILE, WEIGHT_TILE.replace("(0, rank)", "(0, 0)")),
    ),
    *mutants(TIERS,
        ("y stored by thread 0 only", "some outputs were never written",
         STORE_Y, STORE_Y.replace("    cute.copy", "    if tidx == 0:\n            cute.copy")),
    ),
]
# fmt: on
# END KEY

#: the access check's name: the protocol's order in the PTX (``_protocol``), which the replay
#: waits for (a kernel without its cluster wait is named there, not as an unreadable exchange)
ACCESS = (
    "x read once, the weight read, y written once, a slice per CTA; cluster wait, "
    "exchange, mbarrier wait, read (x and weight dtypes)"
)

cluster_kernel = WholeKernel(
    id="04.cluster_kernel",
    lesson=LESSON,
    answer="cluster_kernel",
    title="the whole cluster kernel: a slice per CTA, the DSMEM reduction and its barriers",
    mutants=CLUSTER_KERNEL_MUTANTS,
    given=GIVEN_COPY_REDUCE,
    finished=("quack_edu.stages.cluster.ClusterRMSNorm.row_sum",),
    timeout_hint=hints.CLUSTER_SYNC,
    hole=KERNEL_HOLE,
    compile_config=exchange_config,
    cases=_KERNEL_CASES,
    access=ACCESS,
    hint_tile=SAME_ROWS,
    hint_rank=SAME_SLICE,
    cluster=True,
    extra=_protocol,
    more=(exchange_replay_check(KERNEL_HOLE, needs=("compiles", ACCESS)),),
    Ns=(1000,),
    hidden_Ns=(1544, 3000, 6136, 12296),
    config=exchange_config,
    guard=_kernel_guard,
    ordering_hint=ORDERING,
    values="values with a cluster vs rmsnorm_ref (M in 1/37/199, N=1000, x and weight dtypes)",
    hidden_values="values with a cluster at more shapes and dtype pairs, grading seed",
    speed=_guarded_speed(gpu_speed(KERNEL_HOLE, fraction=0.75, M=16384, N=65536)),
).register()
