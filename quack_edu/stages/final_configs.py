"""The final kernels' configurations as data: which config a row length gets, forward and
backward, and what an autotuner may try instead.

A heuristic is a list of ``Row``\\ s, read top down: the first row whose range of row lengths
(in 16-byte vectors of x), weight width and residual match the call sets the config's fields.
Every row was chosen by a sweep on the H200; a forward row names the record that holds it
(``record``, a file under benchmarks/results/), the backward's table names its records in the
comment above it. Whatever a heuristic picks then meets one rule, ``fits``: the kernel
class accepts the config for that shape (shared memory, registers, lanes) and at least one
CTA fits an SM. A pick that does not fit (fp32 x doubles every tile, odd N has narrow
vectors) falls back, in order, to the first of its alternatives that does (``first_fitting``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from ..config import CLUSTER_SIZES, BwdConfig, FinalConfig, _next_pow2
from ..primitives.tiling import ceil_div

#: row lengths in vectors without an upper bound (the last row of a table)
ANY = 1 << 30


@dataclass(frozen=True)
class Row:
    """Configs for rows of ``above`` < vectors <= ``upto``, next to a weight that is ``wide``
    (True: wider than x, an fp32 weight next to bf16 x; False: not; None: either) and, when
    ``residual`` is not None, with or without a residual: the config's fields in ``set``.
    ``record``: the benchmark record that chose the row."""

    upto: int
    set: dict = field(hash=False)
    above: int = 0
    wide: bool | None = None
    residual: bool | None = None
    record: str = ""

    def matches(self, nvec: int, wide: bool, residual: bool) -> bool:
        return (
            self.above < nvec <= self.upto
            and self.wide in (None, wide)
            and self.residual in (None, residual)
        )


def first_row(rows: Iterable[Row], nvec: int, wide: bool, residual: bool = False) -> Row | None:
    return next((r for r in rows if r.matches(nvec, wide, residual)), None)


# -- the forward ---------------------------------------------------------------------------------

#: Short rows (<= 2048 vectors, 16K bf16) start from many small CTAs, one row block each, the
#: weight slice in shared memory (``forward_short``); these rows change that start.
FWD_SHORT = (
    # a wide weight next to rows of <= 512 B: in registers, 2 blocks a CTA in 2 buffers,
    # rather than 1 KiB of fp32 weight staged for every 2 KiB of x
    Row(32, dict(buffers=2, blocks_per_cta=2, weight_in_smem=False), wide=True,
        record="ab_configs.json"),
    # a narrow weight next to rows of 17-32 vectors (bf16 N = 256): 16 threads a row, 256 a CTA
    Row(32, dict(threads_per_row=16, num_threads=256, buffers=2, blocks_per_cta=2), above=16,
        wide=False, record="ab_configs.json"),
    # rows of 33-64 vectors (512): 256 threads a CTA, fewer and fuller CTAs
    Row(64, dict(num_threads=256), above=32, record="ab_configs.json"),
)  # fmt: skip

#: Rows a GPU kind (``_env.gpu_kind``) reads before ``FWD_SHORT``: its own sweep chose them.
#: A kind without rows, another GPU and compile-only mode read the tables as they are.
FWD_SHORT_BY_GPU = {
    "H100": (
        # a narrow weight next to rows of 17-32 vectors (bf16 N = 256): 32 threads a row, 128
        # a CTA, 2 blocks in 2 buffers; the H200's 16 threads a row, 256 a CTA: 3065 GB/s
        # against 3361 (32768 x 256 bf16, settled medians of 3 rounds)
        Row(32, dict(buffers=2, blocks_per_cta=2), above=16, wide=False,
            record="sweep_fwd256_h100.json"),
    ),
}  # fmt: skip

#: Long rows (> 2048 vectors): CTAs of 256 threads, by cluster size, buffers, row blocks a CTA
#: and where the weight lives.
FWD_LONG = (
    Row(4096, dict(cluster_n=1, buffers=1, blocks_per_cta=1, weight_in_smem=False),
        record="fwd_final_configs.json"),
    # x and a residual: two tiles a row
    Row(8192, dict(cluster_n=4, buffers=2, blocks_per_cta=2, weight_in_smem=True), wide=False,
        residual=True, record="ab_configs.json"),
    Row(8192, dict(cluster_n=4, buffers=1, blocks_per_cta=1, weight_in_smem=True), wide=False,
        record="fwd_tuned.json"),
    Row(8192, dict(cluster_n=4, buffers=2, blocks_per_cta=2, weight_in_smem=False), wide=True,
        record="ab_configs.json"),
    Row(16384, dict(cluster_n=4, buffers=2, blocks_per_cta=2, weight_in_smem=True), wide=False,
        record="ab_configs.json"),
    Row(16384, dict(cluster_n=8, buffers=2, blocks_per_cta=2, weight_in_smem=False), wide=True,
        record="ab_configs.json"),
    Row(ANY, dict(cluster_n=16, buffers=2, blocks_per_cta=2, weight_in_smem=True), wide=False,
        record="ab_configs.json"),
    Row(ANY, dict(cluster_n=16, buffers=2, blocks_per_cta=4, weight_in_smem=False), wide=True,
        record="ab_configs.json"),
)  # fmt: skip

#: longest rows, in vectors, that start from ``forward_short``
FWD_SHORT_UPTO = 2048
#: a wide weight slice over this many bytes a CTA goes to registers in short rows
FWD_SHORT_SMEM_W = 32 << 10


def forward_short(nvec: int, vec: int, wide: bool) -> FinalConfig:
    """The start for short rows (fwd_final_configs.json): >= 32 threads a row with <= 16
    vectors each (4 to 32 for the shortest), one row block a CTA in one buffer, the weight
    slice in shared memory unless it is wide and over ``FWD_SHORT_SMEM_W``."""
    tpr = min(256, max(4, min(32, _next_pow2(nvec)), _next_pow2(ceil_div(nvec, 16))))
    w_bytes = tpr * 16 * vec * (4 if wide else 2)
    return FinalConfig(
        tpr,
        max(128, tpr),
        buffers=1,
        blocks_per_cta=1,
        weight_in_smem=not (wide and w_bytes > FWD_SHORT_SMEM_W),
    )


def forward_pick(
    nvec: int, vec: int, wide: bool, residual: bool, gpu: str | None = None
) -> FinalConfig:
    """The forward heuristic's config for rows of ``nvec`` vectors of ``vec`` elements on a GPU
    of kind ``gpu`` (``_env.gpu_kind``; None: the default tables)."""
    if nvec <= FWD_SHORT_UPTO:
        pick = forward_short(nvec, vec, wide)
        row = first_row(FWD_SHORT_BY_GPU.get(gpu, ()) + FWD_SHORT, nvec, wide, residual)
        return replace(pick, **row.set) if row else pick
    return FinalConfig(256, 256, **first_row(FWD_LONG, nvec, wide, residual).set)


def forward_fallbacks(pick: FinalConfig) -> list[FinalConfig]:
    """``pick``, then (for narrow rows, whose accesses are one element wide) more threads a row
    or more vectors a thread, larger clusters, one buffer."""
    return [pick] + [
        replace(
            pick, threads_per_row=t, num_threads=max(128, t), max_vecs=mv, cluster_n=cn, buffers=b
        )
        for mv in (pick.max_vecs, 64)
        for t in (pick.threads_per_row, 512, 1024)
        if t >= pick.threads_per_row
        for b in (pick.buffers, 1)
        for cn in cluster_sizes(t, pick.cluster_n)
    ]


#: (buffers, blocks_per_cta, weight_in_smem) the forward's autotuner tries
FWD_PLANS = (
    (1, 1, False),
    (1, 1, True),
    (1, 4, True),
    (2, 2, True),
    (2, 4, True),
    (2, 8, True),
    (2, 4, False),
)


def forward_candidates(base: FinalConfig) -> list[FinalConfig]:
    """What the forward's autotuner tries: ``base``, base with two commit groups, then half and
    twice its threads a row, every cluster size, every plan of ``FWD_PLANS``."""
    out = [base, replace(base, stages=2)]
    t0 = base.threads_per_row
    for tpr in (t0, max(4, t0 // 2), min(512, 2 * t0)):
        for cn in cluster_sizes(tpr):
            for buffers, seq, in_smem in FWD_PLANS:
                out.append(
                    FinalConfig(
                        tpr,
                        max(128, tpr),
                        cluster_n=cn,
                        buffers=buffers,
                        blocks_per_cta=seq,
                        weight_in_smem=in_smem,
                    )
                )
    return out


# -- the backward --------------------------------------------------------------------------------

#: By row length in vectors (the next power of two at or above it): threads a row, threads a
#: CTA, cluster size, buffers. Rows of 32 to 256 vectors: 16 to 64 threads a row, two buffers,
#: 32 down to 4 rows a CTA (ab_configs.json; shorter rows: ``backward_pick``); 512 and 1024: a
#: row of 128 threads a CTA (one buffer at 512); from 2K vectors 512 threads a row, one buffer
#: from 4K, and from 8K (4K next to a wide weight, with two buffers) clusters of 2, 4, then 8:
#: the smallest that keeps a thread at 8 vectors, 64 accumulators (the clusters at 16K-32K
#: vectors: ab_configs.json; the rest from sweeps on the H200 of 2026-11-30 kept only as this
#: table). A wide weight is read from L2 in each pass from 8K vectors on (``BWD_WIDE_FROM_L2``).
BWD = (
    Row(32, dict(threads_per_row=16, num_threads=512, cluster_n=1, buffers=2)),
    Row(64, dict(threads_per_row=32, num_threads=512, cluster_n=1, buffers=2)),
    Row(128, dict(threads_per_row=32, num_threads=256, cluster_n=1, buffers=2)),
    Row(256, dict(threads_per_row=64, num_threads=256, cluster_n=1, buffers=2)),
    Row(512, dict(threads_per_row=128, num_threads=128, cluster_n=1, buffers=1)),
    Row(1024, dict(threads_per_row=128, num_threads=128, cluster_n=1, buffers=2)),
    Row(2048, dict(threads_per_row=512, num_threads=512, cluster_n=1, buffers=2)),
    # a wide weight at 32K: its slice does not fit beside one buffer
    Row(4096, dict(threads_per_row=512, num_threads=512, cluster_n=2, buffers=2), wide=True),
    Row(4096, dict(threads_per_row=512, num_threads=512, cluster_n=1, buffers=1)),
    Row(8192, dict(threads_per_row=512, num_threads=512, cluster_n=2, buffers=1)),
    Row(16384, dict(threads_per_row=512, num_threads=512, cluster_n=4, buffers=1)),
    Row(ANY, dict(threads_per_row=512, num_threads=512, cluster_n=8, buffers=1)),
)
#: rows of at least this many vectors (next power of two) read a wide weight from L2
BWD_WIDE_FROM_L2 = 8192
#: rows shorter than this many vectors: >= 4 threads a row with <= 4 vectors each
BWD_SHORT_BELOW = 32


def backward_pick(nvec: int, wide: bool) -> BwdConfig:
    """The backward table's config for rows of ``nvec`` vectors (before it is made to fit the
    accumulators, ``final_bwd.bwd_config``)."""
    key = _next_pow2(nvec)
    if key < BWD_SHORT_BELOW:
        return BwdConfig(max(4, _next_pow2(ceil_div(nvec, 4))), 128, buffers=2)
    return BwdConfig(
        **first_row(BWD, key, wide).set, weight_in_smem=not (wide and key >= BWD_WIDE_FROM_L2)
    )


def backward_fallbacks(pick: BwdConfig) -> list[BwdConfig]:
    """``pick``, then larger clusters and one buffer, then CTAs of 512 or 1024 threads in
    clusters of 16 with up to 64 vectors a thread."""
    out = [pick] + [
        replace(pick, cluster_n=cn, buffers=b)
        for b in (pick.buffers, 1)
        for cn in cluster_sizes(pick.threads_per_row, pick.cluster_n)
    ]
    wide_ctas = [(t, mv) for mv in (32, 64) for t in (512, 1024)]
    return out + [BwdConfig(t, t, cluster_n=16, buffers=1, max_vecs=mv) for t, mv in wide_ctas]


def backward_candidates(base: BwdConfig, wide_weight: bool) -> list[BwdConfig]:
    """What the backward's autotuner tries: ``base``, then half, twice and four times its
    threads a row, every cluster size, one or two buffers (one: also refilled early), CTAs of
    256 and 512 threads for short rows and, next to a wide weight, the weight read from L2."""
    out = [base]
    t0 = base.threads_per_row
    for tpr in dict.fromkeys((t0, max(4, t0 // 2), min(1024, 2 * t0), min(1024, 4 * t0))):
        for cn in cluster_sizes(tpr):
            for buffers in (2, 1):
                cfg = BwdConfig(tpr, max(128, tpr), cluster_n=cn, buffers=buffers)
                cfgs = [cfg]
                if tpr <= 64 and cn == 1:  # short rows: 4 to 32 rows a CTA
                    cfgs += [replace(cfg, num_threads=n) for n in (256, 512)]
                if buffers == 1:  # long rows: the buffer refilled a vector at a time
                    cfgs.append(replace(cfg, refill_early=True))
                for c in cfgs:
                    for in_smem in (True, False) if wide_weight else (True,):
                        out.append(replace(c, max_vecs=base.max_vecs, weight_in_smem=in_smem))
    return out


# -- what both share -----------------------------------------------------------------------------


def cluster_sizes(threads_per_row: int, at_least: int = 1) -> list[int]:
    """The cluster sizes a row of ``threads_per_row`` threads can spread over (a lane a peer
    CTA), from ``at_least`` up."""
    return [c for c in CLUSTER_SIZES if at_least <= c <= threads_per_row]


def builder(kernel_cls, N, dtype, weight_dtype, features, vec=None):
    """config -> ``kernel_cls`` built for this shape, or None where it does not take the
    config (its ValueError says why)."""

    def build(config):
        try:
            return kernel_cls(dtype, N, config, weight_dtype, features=features, vec=vec)
        except ValueError:
            return None

    return build


def fits(build: Callable[[object], object], config) -> bool:
    """The one pruning rule: the kernel class takes ``config`` for the shape (``build`` returns
    the kernel, or None where it raised ValueError) and at least one CTA fits an SM."""
    kernel = build(config)
    return kernel is not None and kernel.ctas_per_sm() >= 1


def first_fitting(build, candidates):
    """The first of ``candidates`` that ``fits``, or None."""
    return next((c for c in candidates if fits(build, c)), None)


def fitting(build, candidates) -> list:
    """Every distinct one of ``candidates`` that ``fits``, in order."""
    return [c for c in dict.fromkeys(candidates) if fits(build, c)]
