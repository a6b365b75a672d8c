"""Lesson 04, the cluster stage: two holes in the cluster kernel's DSMEM exchange.

04.cluster_exchange   each warp's partial to every CTA of the cluster (remote st.async stores)
04.expected_tx_bytes  the byte count every CTA's mbarrier is armed with
04.cluster_kernel     the whole kernel: a slice per CTA, the exchange and its barriers
                      (its own module: ``lesson04_cluster_kernel``)

Both are graded with a cluster forced (``exchange_config``: 4 CTAs per row, 2 where N is too
short), since at the grader's row lengths the heuristic would pick none. A mistake here is a
hang as often as a wrong number, so the gpu tier launches nothing it can see would hang:

* the exchange is replayed from the learner's PTX for every thread and rank
  (``quack_edu.grading.dsmem_sim``): which CTA receives how many bytes, in which slot. That
  replay is a compile-tier check with a hint naming the CTA and the slot, and the gpu tier's
  guard: a CTA that would receive fewer bytes than it waits for (a hang) or more (a wait that
  completes while stores still land), or a store outside the cluster, is reported and not
  launched;
* the byte count is compared with the tiling's before a launch; any other count is reported and
  not launched (too few bytes: the wait completes early; too many: it never completes).

A wrong exchange the guard lets through (each CTA gets its bytes, in the wrong slots) is safe to
run and shows as wrong values with a cluster and right ones without (the ``cluster_n = 1``
baseline).
"""

from __future__ import annotations

import re

import torch

from .. import answer_key, hints
from ..checks import (
    KernelHole,
    Ptx,
    compiles,
    gpu_values,
    no_local_memory,
    ptx_probe,
    value_check,
)
from ..hints import Variant
from ..holes import EXCHANGE_HOLE, EXPECT_HOLE
from ..registry import COMPILE, GPU, TIERS, Check, CheckFailed, Exercise, mutants, register

LESSON = "04_cluster_reduction"


# ---- configs ---------------------------------------------------------------------------------
def exchange_config(N: int, dtype):
    """``stages.cluster.exchange_config``: 4 CTAs a row (2 where too short), whatever N."""
    from ...stages.cluster import exchange_config as four_ctas

    return four_ctas(N, dtype)


def wide_config(N: int, dtype):
    """2 CTAs per row, 2 warps per row, 2 rows per CTA: every index of a slot is exercised."""
    from ...config import RowConfig

    return RowConfig(threads_per_row=64, num_threads=128, cluster_n=2)


def baseline_config(N: int, dtype):
    """The same stage without a cluster (the exchange is not called): right if the rest is."""
    from ...config import cluster_config

    cfg = cluster_config(N, dtype)
    assert cfg.cluster_n == 1, cfg
    return cfg


def _dt(dtype):
    from ...runtime import torch_dtype

    return torch_dtype(dtype)


# ---- hints -----------------------------------------------------------------------------------
PEERS_NEVER = (
    "garbage only with cluster_n > 1: peers never receive this CTA's partials. Each warp's "
    "partial must reach every CTA of the cluster, its own included"
)
HANG_NOT_RUN = (
    "on the GPU that CTA's mbarrier wait never completes and the kernel hangs, so the grader did "
    "not launch it"
)
WRONG_SLOT = (
    "the right number of bytes reach every CTA, but into the wrong slots: every CTA must end "
    "up with one slot per sending CTA, and this index overwrites some slots and leaves others "
    "holding garbage"
)
OUT_OF_CLUSTER = (
    "a store to a rank outside the cluster (ranks 0..cluster_n-1): mapa into a CTA that does "
    "not exist is an illegal address on the GPU (the grader did not launch it)"
)
TOO_MANY = (
    "a CTA receives more stores than its mbarrier expects: its wait completes before the last "
    "ones land (garbage), and they may land after it has exited (the grader did not launch it); "
    "send each warp's partial to each CTA exactly once"
)
NO_REMOTE_STORE = (
    "no st.async in the kernel: the partial never travels to the peers (store_async_dsmem is the "
    "store that maps a slot and an mbarrier into a peer, mapa, and completes its bytes there)"
)
EXCHANGE_GPU = (
    "right without a cluster (cluster_n = 1: the exchange is not used), wrong with one: the "
    "exchange is at fault. " + hints.CLUSTER_SYNC
)

VERDICT_HINTS = {
    "self": PEERS_NEVER,
    "missing": PEERS_NEVER + "; " + HANG_NOT_RUN,
    "extra": TOO_MANY,
    "out_of_cluster": OUT_OF_CLUSTER,
    "slot": WRONG_SLOT,
}


# ---- 04.cluster_exchange ---------------------------------------------------------------------
def simulated_exchange(ctx, hole: KernelHole, N: int, dtype, config):
    """(kernel, Exchange or None, Verdict or None) of the learner's kernel at this config."""
    from ..dsmem_sim import exchange_from_ptx, judge_exchange

    key = ("exchange", hole, N, str(dtype), config)
    if key not in ctx.cache:
        rep = ctx.report(hole, N, dtype, config)
        kernel = ctx.kernel(hole, N, dtype, config)
        t = kernel.tiling
        ex = exchange_from_ptx(rep.ptx, t.cluster_n, t.num_threads)
        verdict = None
        if ex is not None:
            verdict = judge_exchange(
                ex,
                threads_per_row=t.threads_per_row,
                expected_bytes=t.rows_per_cta * t.warps_per_row * t.cluster_n * 4,
                rows_per_cta=t.rows_per_cta,
            )
        ctx.cache[key] = (kernel, ex, verdict)
    return ctx.cache[key]


def _exchange_cases(ctx, hidden: bool):
    if hidden:
        dt = "fp16"
        n = ctx.hidden_N(EXCHANGE_HOLE, dt)
        return [(n, dt, exchange_config(n, _dt(dt)))]
    return [
        (1000, "bf16", exchange_config(1000, torch.bfloat16)),
        (2000, "bf16", wide_config(2000, torch.bfloat16)),
        (1000, "fp32", exchange_config(1000, torch.float32)),
    ]


def exchange_replay_check(
    hole: KernelHole, *, hidden: bool = False, needs: tuple = ("compiles",)
) -> Check:
    def fn(ctx):
        seen = []
        for N, dt, cfg in _exchange_cases(ctx, hidden):
            kernel, ex, verdict = simulated_exchange(ctx, hole, N, dt, cfg)
            t = kernel.tiling
            where = (
                f"{dt} N={N}, cluster_n={t.cluster_n}, {t.rows_per_cta} rows x "
                f"{t.warps_per_row} warps per CTA"
            )
            if ex is None:  # (the gpu tier would not launch it either: ``_kernel_guard``)
                raise CheckFailed(
                    f"{where}: the exchange could not be replayed from the PTX",
                    expected="mapa, then st.async ... complete_tx into each peer's slot",
                    seen="no exchange the replay recognises",
                    hint="keep the exchange to the stage's cluster_exchange between the cluster "
                    "wait and the mbarrier wait",
                )
            if verdict.ok:
                per = len(ex.stores) // t.cluster_n
                seen.append(f"{where}: {per} st.async into each CTA, one per (row, warp, sender)")
                continue
            raise CheckFailed(
                f"{where}: {verdict.problem}",
                expected=f"every CTA receives {t.rows_per_cta * t.warps_per_row * t.cluster_n} "
                "stores, one per (row, warp, sending CTA), each in slot [row, (warp, sender)]",
                seen="; ".join(verdict.details) or verdict.problem,
                hint=VERDICT_HINTS.get(verdict.kind, hints.CLUSTER_SYNC),
            )
        return "; ".join(seen)

    name = (
        "the exchange replayed from the PTX at a random N (grading seed)"
        if hidden
        else "every CTA receives each warp's partial once, in its slot (replayed from the PTX)"
    )
    return Check(name, COMPILE, fn, hidden, needs)


def _probe_remote_stores(rep, ctx):
    n_st = rep.count("st.async")
    n_tx = rep.count("mbarrier::complete_tx::bytes")
    n_mapa = rep.count("mapa.shared::cluster")
    plain = rep.count("st.shared::cluster")
    if n_st == 0:
        raise CheckFailed(
            "no remote store in the PTX",
            expected="st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 (and two mapa)",
            seen=f"{n_st} st.async, {n_mapa} mapa, {plain} st.shared::cluster",
            hint=NO_REMOTE_STORE
            if not plain
            else (
                "st.shared::cluster writes into the peer but credits no mbarrier: the peer "
                "cannot know the value has arrived; use store_async_dsmem (st.async ... "
                "complete_tx)"
            ),
        )
    if n_tx < n_st or n_mapa < 2 * n_st:
        raise CheckFailed(
            "a remote store without its mbarrier",
            expected="each st.async maps its slot and the mbarrier into the peer (2 mapa)",
            seen=f"{n_st} st.async, {n_tx} complete_tx, {n_mapa} mapa",
            hint=NO_REMOTE_STORE,
        )
    cn = rep.config.cluster_n
    if n_st not in (1, cn):
        raise CheckFailed(
            f"{n_st} st.async instructions for a cluster of {cn}",
            expected=f"1 (lane p stores to CTA p) or {cn} (one lane, a loop over the peers)",
            seen=f"{n_st}",
            hint="each warp sends its partial to each CTA of the cluster once: cluster_n "
            "stores per warp",
        )
    return f"{n_st} st.async (complete_tx on the peer's mbarrier), {n_mapa} mapa"


# BEGIN KEY
# fmt: off
CLUSTER_EXCHANGE_MUTANTS = mutants(TIERS,
    ("stores only into its own CTA", "peers never receive", "mbar_ptr, lane)", "mbar_ptr, rank)"),
    ("stores only into CTA 0", "peers never receive", "mbar_ptr, lane)", "mbar_ptr, 0)"),
    ("indexes the slot by the receiver's rank", "wrong slots",
     "(row, (warp_in_row, rank))", "(row, (warp_in_row, lane))"),
    ("skips the last CTA of the cluster", "peers never receive",
     "if lane < cluster_n:", "if lane < cluster_n - 1:"),
    ("sends nothing", "peers never receive",
     "cute.arch.store_async_dsmem(slot, f32_bits(val), mbar_ptr, lane)", "pass"),
)
# fmt: on
# END KEY

cluster_exchange = register(
    Exercise(
        id="04.cluster_exchange",
        finished=(
            "quack_edu.stages.cluster.ClusterRMSNorm.cluster_exchange",
            "quack_edu.primitives.reduce.cluster_send",
        ),
        lesson=LESSON,
        answer="cluster_exchange",
        title="the DSMEM exchange: each warp's partial into its slot in every CTA of the cluster",
        points={COMPILE: 2, GPU: 2},
        timeout_hint=hints.CLUSTER_SYNC,
        mutants=CLUSTER_EXCHANGE_MUTANTS,
    )
)


def _guarded_values(hole, *, hidden: bool, guard, wrong_hint, **kw) -> Check:
    """``gpu_values`` that first asks ``guard(ctx, N, dtype, config)`` whether the launch is safe
    (it raises CheckFailed to refuse), and replaces a value failure's hint with
    ``wrong_hint(ctx, N, dtype, config)`` when that knows better."""
    inner = gpu_values(hole, hidden=hidden, **kw)
    config, dtypes = kw["config"], kw.get("dtypes", ("bf16", "fp16", "fp32"))

    def fn(ctx):
        from ..checks import VISIBLE_N

        todo = []
        for dt in dtypes:
            for n in [ctx.hidden_N(hole, dt)] if hidden else list(VISIBLE_N):
                todo.append((n, dt, config(n, _dt(dt))))
        for n, dt, cfg in todo:
            guard(ctx, n, dt, cfg)
        try:
            return inner.fn(ctx)
        except CheckFailed as e:
            for n, dt, cfg in todo:
                better = wrong_hint(ctx, n, dt, cfg)
                if better:
                    e.hint = better
                    break
            raise

    return Check(inner.name, GPU, fn, hidden, inner.needs)


def _exchange_guard(ctx, N, dt, cfg):
    _, ex, verdict = simulated_exchange(ctx, EXCHANGE_HOLE, N, dt, cfg)
    if verdict is not None and not verdict.safe:
        raise CheckFailed(
            f"not launched ({dt} N={N}, cluster_n={cfg.cluster_n}): {verdict.problem}",
            expected="every CTA receives exactly the bytes its mbarrier waits for",
            seen="; ".join(verdict.details),
            hint=VERDICT_HINTS.get(verdict.kind, hints.CLUSTER_SYNC),
        )


def _exchange_wrong_hint(ctx, N, dt, cfg):
    _, _, verdict = simulated_exchange(ctx, EXCHANGE_HOLE, N, dt, cfg)
    if verdict is not None and not verdict.ok:
        return VERDICT_HINTS.get(verdict.kind)
    return None


cluster_exchange.add(
    compiles(EXCHANGE_HOLE, N=1000, dtypes=("bf16", "fp32"), config=exchange_config),
    ptx_probe(
        EXCHANGE_HOLE,
        "remote stores: st.async completing on the peer's mbarrier, mapa",
        _probe_remote_stores,
        config=exchange_config,
    ),
    exchange_replay_check(EXCHANGE_HOLE),
    no_local_memory(EXCHANGE_HOLE, config=exchange_config),
    compiles(EXCHANGE_HOLE, dtypes=("fp16",), hidden=True, config=exchange_config),
    exchange_replay_check(EXCHANGE_HOLE, hidden=True),
    _guarded_values(
        EXCHANGE_HOLE,
        hidden=False,
        guard=_exchange_guard,
        wrong_hint=_exchange_wrong_hint,
        config=exchange_config,
        baseline=baseline_config,
        baseline_hint=EXCHANGE_GPU,
        name="values vs rmsnorm_ref with 4 CTAs per row (M in 1/37/199, N=1000, 3 dtypes)",
    ),
    _guarded_values(
        EXCHANGE_HOLE,
        hidden=True,
        guard=_exchange_guard,
        wrong_hint=_exchange_wrong_hint,
        config=exchange_config,
        baseline=baseline_config,
        baseline_hint=EXCHANGE_GPU,
        name="values with a cluster at more shapes, grading seed",
    ),
)


# ---- 04.expected_tx_bytes --------------------------------------------------------------------
# BEGIN KEY
@answer_key.keyed  # (the PTX probe and the launch guard call it directly)
def expected_tx_ref(rows_per_cta, warps_per_row, cluster_n):
    return rows_per_cta * warps_per_row * cluster_n * 4


# END KEY


EARLY_WHY = (
    "the wait completes early, as soon as that many bytes have landed, so this CTA reads slots "
    "its peers have not written yet (garbage), and late stores may land after it exits"
)
EARLY = "too few bytes: " + EARLY_WHY
NEVER = (
    "too many bytes: fewer than that ever land, so the phase never completes and every thread "
    "of the CTA waits in mbarrier_wait forever: the kernel hangs"
)
NO_CLUSTER_N = (
    "1/cluster_n of the bytes: you count the slots of one sender, but every CTA of the cluster "
    "sends each (row, warp) partial, so " + EARLY_WHY
)
ELEMENTS = (
    "a quarter of the bytes: you count slots (fp32 elements), but the mbarrier counts bytes and "
    "each st.async of an fp32 credits 4, so " + EARLY_WHY
)
BITS = "8 x the bytes (bits?): " + NEVER
PEERS_ONLY = (
    "the slots of cluster_n - 1 senders: each CTA's own slot is written too (its own partials "
    "go through the same exchange, lane p storing into CTA p, its own rank included), so "
    "cluster_n stores land per (row, warp), and " + EARLY_WHY
)
CONSTANT = (
    "your count is the same at every config, but the bytes that land in a CTA change with "
    "rows_per_cta, warps_per_row and cluster_n: count them from the three arguments (your "
    "exchange above says who sends what)"
)

# BEGIN KEY
_TX_VARIANTS = [
    Variant("no cluster_n", lambda r, w, c: r * w * 4, NO_CLUSTER_N),
    Variant("peers only", lambda r, w, c: r * w * (c - 1) * 4, PEERS_ONLY),
    Variant("elements", lambda r, w, c: r * w * c, ELEMENTS),
    Variant("bits", lambda r, w, c: r * w * c * 32, BITS),
    Variant(
        "no rows",
        lambda r, w, c: w * c * 4,
        "a CTA holds rows_per_cta rows and each row has its own slots: your count leaves the "
        "rows out",
    ),
    Variant(
        "no warps",
        lambda r, w, c: r * c * 4,
        "each warp of a row sends its own partial (one slot per warp): your count leaves the "
        "warps out",
    ),
]
# END KEY


def _tx_cases(ctx, hidden: bool):
    rng = ctx.rng("hidden tx" if hidden else "tx")
    rand = []
    for _ in range(10 if hidden else 2):
        tpr = rng.choice((4, 8, 16, 32, 64, 128, 256, 512))
        nt = max(tpr, rng.choice((128, 256, 512)))
        cn = rng.choice((2, 4, 8, 16))
        rand.append((nt // tpr, max(1, tpr // 32), cn))
    if hidden:
        return rand
    # (rows_per_cta, warps_per_row, cluster_n) of configs the stage uses
    return [(1, 8, 4), (1, 8, 2), (1, 8, 16), (8, 1, 4), (2, 2, 2), (4, 1, 4), (1, 16, 8)] + rand


def _expect_operand(rep) -> list[int]:
    """The byte counts the PTX arms its mbarrier with: an immediate, or a register set by mov."""
    ptx = Ptx(rep.ptx)
    out = []
    for ins in ptx.instrs:
        if not ins.opcode.startswith("mbarrier.arrive.expect_tx"):
            continue
        operand = ins.operands[-1].strip()
        if re.fullmatch(r"\d+", operand):
            out.append(int(operand))
            continue
        defs = [ptx.instrs[j] for j in ptx.defs.get(operand, [])]
        consts = [
            int(d.operands[1])
            for d in defs
            if d.opcode.startswith("mov") and re.fullmatch(r"\d+", d.operands[1].strip())
        ]
        out.append(consts[0] if len(defs) == 1 and consts else -1)
    return out


def _tx_hint(got: int, want: int, cluster_n: int, ctx=None) -> str:
    """Why a count is off: the known wrong formula the answer follows over many configs (one
    count alone is ambiguous: a quarter is both "no cluster_n" and "no x 4" at cluster_n = 4),
    else too few (the wait completes early) or too many (it never completes)."""
    if ctx is not None:
        cases = _tx_cases(ctx, False)
        try:
            seen = [ctx.call(*c) for c in cases]
        except CheckFailed:
            raise
        except Exception:
            seen = None
        for v in _TX_VARIANTS if seen else ():
            if answer_key.explains(v, cases, seen):
                return v.hint
        if seen and len(set(map(repr, seen))) == 1:
            return CONSTANT
    if got > want:
        return BITS if got == 8 * want else NEVER
    causes = [
        h
        for h, hit in ((NO_CLUSTER_N, got * cluster_n == want), (ELEMENTS, got * 4 == want))
        if hit
    ]
    if len(causes) == 1:
        return causes[0]
    if causes:  # cluster_n = 4: a quarter either way
        return (
            "a quarter of the bytes: the slots of one sender only (cluster_n missing), or slots "
            "counted instead of bytes (x 4 missing), so " + EARLY_WHY
        )
    return EARLY


def _tx_diagnose(ctx, case, got, want):
    """``value_check``'s hint for a count no known wrong formula explains (not its default
    ratio hints, which are about a kernel's traffic)."""
    if isinstance(got, bool) or not isinstance(got, int | float):
        return None
    return _tx_hint(got, want, case[2], ctx)


def _probe_expect_tx(rep, ctx):
    t = ctx.kernel(EXPECT_HOLE, rep.N, rep.dtype, rep.config).tiling
    want = expected_tx_ref(t.rows_per_cta, t.warps_per_row, t.cluster_n)
    got = _expect_operand(rep)
    where = f"cluster_n={t.cluster_n}, {t.rows_per_cta} rows x {t.warps_per_row} warps per CTA"
    if got != [want]:
        seen = ", ".join(str(g) if g >= 0 else "a value not known at compile time" for g in got)
        raise CheckFailed(
            f"{where}: the mbarrier is armed with {seen or 'nothing'} bytes",
            expected=f"mbarrier.arrive.expect_tx ... {want} (bytes)",
            seen=seen or "no mbarrier.arrive.expect_tx",
            hint=_tx_hint(got[0], want, t.cluster_n, ctx)
            if len(got) == 1 and got[0] >= 0
            else None,
        )
    return f"{where}: expect_tx {want} B in the PTX"


# BEGIN KEY
# fmt: off
EXPECTED_TX_BYTES_MUTANTS = mutants(TIERS,
    ("forgets cluster_n", "completes early",
     "rows_per_cta * warps_per_row * cluster_n", "rows_per_cta * warps_per_row"),
    ("counts elements, not bytes", "counts bytes", "return slots * 4", "return slots"),
    ("counts bits, not bytes", "never completes", "return slots * 4", "return slots * 32"),
    ("counts the peers only", "each CTA's own slot is written too",
     "warps_per_row * cluster_n", "warps_per_row * (cluster_n - 1)"),
    ("one config's count for every config", "the same at every config",
     "return slots * 4", "return 128"),
)
# fmt: on
# END KEY

expected_tx = register(
    Exercise(
        id="04.expected_tx_bytes",
        finished=("quack_edu.stages.cluster.ClusterRMSNorm.expected_tx_bytes",),
        lesson=LESSON,
        answer="expected_tx_bytes",
        title="the mbarrier's expected transaction bytes for one row reduction",
        points={COMPILE: 1, GPU: 1},
        timeout_hint=hints.CLUSTER_SYNC,
        mutants=EXPECTED_TX_BYTES_MUTANTS,
    )
)


def _tx_guard(ctx, N, dt, cfg):
    kernel = ctx.kernel(EXPECT_HOLE, N, _dt(dt), cfg)
    t = kernel.tiling
    want = expected_tx_ref(t.rows_per_cta, t.warps_per_row, t.cluster_n)
    got = ctx.call(t.rows_per_cta, t.warps_per_row, t.cluster_n)
    if got != want:
        raise CheckFailed(
            f"not launched ({dt} N={N}, cluster_n={t.cluster_n}, {t.rows_per_cta} rows x "
            f"{t.warps_per_row} warps per CTA): your count is {got} bytes",
            expected=f"{want} bytes",
            seen=f"{got}",
            hint=_tx_hint(int(got), want, t.cluster_n, ctx) if isinstance(got, int) else None,
        )


expected_tx.add(
    value_check(
        "the byte count at the stage's configs",
        expected_tx_ref,
        _tx_cases,
        variants=_TX_VARIANTS,
        diagnose=_tx_diagnose,
    ),
    compiles(EXPECT_HOLE, N=1000, dtypes=("bf16", "fp32"), config=exchange_config),
    ptx_probe(
        EXPECT_HOLE,
        "the PTX arms the mbarrier with your count (expect_tx immediate)",
        _probe_expect_tx,
        dtypes=("bf16", "fp32"),
        config=exchange_config,
    ),
    ptx_probe(
        EXPECT_HOLE,
        "expect_tx with 2 warps x 2 rows per CTA",
        _probe_expect_tx,
        N=2000,
        config=wide_config,
    ),
    ptx_probe(
        EXPECT_HOLE,
        "expect_tx at a random N (grading seed)",
        _probe_expect_tx,
        dtypes=("fp16",),
        hidden=True,
        config=exchange_config,
    ),
    _guarded_values(
        EXPECT_HOLE,
        hidden=False,
        guard=_tx_guard,
        wrong_hint=lambda *a: None,
        config=exchange_config,
        baseline=baseline_config,
        baseline_hint=hints.CLUSTER_SYNC,
        name="values vs rmsnorm_ref with 4 CTAs per row (M in 1/37/199, N=1000, 3 dtypes)",
    ),
    _guarded_values(
        EXPECT_HOLE,
        hidden=True,
        guard=_tx_guard,
        wrong_hint=lambda *a: None,
        config=exchange_config,
        baseline=baseline_config,
        baseline_hint=hints.CLUSTER_SYNC,
        name="values with a cluster at more shapes, grading seed",
    ),
)
# BEGIN HIDDEN
expected_tx.add(
    value_check(
        "random configs (grading seed)",
        expected_tx_ref,
        _tx_cases,
        variants=_TX_VARIANTS,
        diagnose=_tx_diagnose,
        hidden=True,
    )
)
# END HIDDEN
