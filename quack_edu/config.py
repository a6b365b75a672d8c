"""Kernel configurations: frozen dataclasses, one per stage family, and their heuristics.

Config is data. A heuristic picks one from (N, dtype); every kernel also accepts one
explicitly, so tests, exercises and the autotuner can force a path.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NaiveConfig:
    """One thread per row: only the block size is free."""

    threads_per_block: int = 128

    def __post_init__(self):
        if self.threads_per_block % 32 or not 32 <= self.threads_per_block <= 1024:
            raise ValueError(
                f"threads_per_block must be a multiple of 32 in [32, 1024], "
                f"got {self.threads_per_block}"
            )


def naive_config(N: int, dtype=None) -> NaiveConfig:
    return NaiveConfig()


# --------------------------------------------------------------------------------------------
# The vectorized stages (warp, block, cluster, cpasync) share one config.
# --------------------------------------------------------------------------------------------

#: bytes one thread moves per global access in the vectorized stages (LDG.128 / STG.128)
VECTOR_BYTES = 16
#: cluster sizes Hopper launches; 16 is "non-portable" (CuTe DSL sets the attribute on every
#: kernel it builds, so the driver accepts it where a GPC has 16 free SMs)
CLUSTER_SIZES = (1, 2, 4, 8, 16)
#: the longest row, in elements, the final kernels (forward and backward) and the library take,
#: for every dtype
MAX_N = 262144
#: usable shared memory per CTA on sm_90 (227 KiB opt-in), bytes
SMEM_PER_CTA = 232448


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class RowShape:
    """What follows from ``threads_per_row`` and ``num_threads`` (a config's, a tiling's)."""

    @property
    def rows_per_cta(self) -> int:
        return self.num_threads // self.threads_per_row

    @property
    def warps_per_row(self) -> int:
        return max(1, self.threads_per_row // 32)


@dataclass(frozen=True)
class RowConfig(RowShape):
    """How the vectorized stages lay a row out on threads, CTAs and clusters.

    * ``threads_per_row``: threads that share one row (a power of two, 4..1024). Up to 32 they sit
      in one warp; above that a row spans ``threads_per_row // 32`` warps of one CTA.
    * ``num_threads``: threads per CTA; the CTA holds ``num_threads // threads_per_row`` rows.
    * ``cluster_n``: CTAs of a cluster that share one row (1 = no cluster).
    * ``stages``: commit groups a thread splits its share of the row into (cpasync only).
    * ``max_vecs``: the most 16-byte vectors of x one thread holds per pass. A row that needs
      more is processed in chunks (warp and block stages) or refused (cluster, cpasync).

    Only the shape of the config is checked here; whether it fits a given (N, dtype) is the
    kernel class's job (``KERNEL(dtype, N, config)`` raises a ``ValueError`` that says why).
    """

    threads_per_row: int
    num_threads: int = 128
    cluster_n: int = 1
    stages: int = 1
    max_vecs: int = 16

    def __post_init__(self):
        tpr, nt = self.threads_per_row, self.num_threads
        if not (_pow2(tpr) and 4 <= tpr <= 1024):
            raise ValueError(f"threads_per_row must be a power of two in [4, 1024], got {tpr}")
        if nt % 32 or not 32 <= nt <= 1024:
            raise ValueError(f"num_threads must be a multiple of 32 in [32, 1024], got {nt}")
        if nt % tpr:
            raise ValueError(
                f"num_threads={nt} must be a multiple of threads_per_row={tpr} "
                "(a CTA holds whole rows)"
            )
        if self.cluster_n not in CLUSTER_SIZES:
            raise ValueError(f"cluster_n must be one of {CLUSTER_SIZES}, got {self.cluster_n}")
        if self.cluster_n > 1 and tpr < self.cluster_n:
            raise ValueError(
                f"cluster_n={self.cluster_n} needs threads_per_row >= cluster_n: one lane of "
                f"each row sends the row's partial sum to each peer CTA (got {tpr})"
            )
        if not 1 <= self.stages <= 8:
            raise ValueError(f"stages must be in [1, 8], got {self.stages}")
        if not 1 <= self.max_vecs <= 64:
            raise ValueError(f"max_vecs must be in [1, 64], got {self.max_vecs}")


def vector_elems(dtype) -> int:
    """Elements of ``dtype`` in one 16-byte vector (8 for bf16/fp16, 4 for fp32)."""
    from .dtypes import cute_dtype  # here: the library imports config (MAX_N) without the DSL

    return VECTOR_BYTES * 8 // cute_dtype(dtype).width


def _vectors(N: int, dtype) -> int:
    return max(1, -(-int(N) // vector_elems(dtype)))


def warp_config(N: int, dtype) -> RowConfig:
    """One warp per row (8 or 16 lanes for rows under 32 vectors), 4 rows per CTA."""
    nvec = _vectors(N, dtype)
    tpr = 8 if nvec <= 8 else 16 if nvec <= 16 else 32
    return RowConfig(threads_per_row=tpr, num_threads=128)


def block_config(N: int, dtype) -> RowConfig:
    """Enough warps per row that a thread holds 8 vectors (~120 registers: four 128-thread or
    two 256-thread CTAs per SM): 64..512 threads per row. bf16: 64 threads up to N=4K, 128 to
    8K, 256 to 16K, 512 above (chunks beyond 32K); 512-thread CTAs keep 8 vectors per pass
    (128 registers each is all the register file allows)."""
    nvec = _vectors(N, dtype)
    tpr = min(512, max(64, _next_pow2(-(-nvec // 8))))
    return RowConfig(
        threads_per_row=tpr, num_threads=max(128, tpr), max_vecs=8 if tpr >= 512 else 16
    )


def cluster_config(N: int, dtype) -> RowConfig:
    """The block config while a row fits one CTA at 256 threads x 8 vectors (16K bf16, 8K fp32);
    above, 256 threads per CTA and the smallest cluster that leaves each thread <= 8 vectors
    (~120 registers, two CTAs per SM): bf16 2 CTAs at 32K ... 16 at 262144; fp32 2 at 16K ...
    16 at 131072. Only the last step needs the non-portable cluster size 16; the alternative,
    8 CTAs x 512 threads, fits one CTA per SM and leaves the SM idle between rows."""
    nvec = _vectors(N, dtype)
    if nvec <= 256 * 8:
        return block_config(N, dtype)
    cluster_n = min(16, _next_pow2(-(-nvec // (256 * 8))))
    return RowConfig(threads_per_row=256, num_threads=256, cluster_n=cluster_n)


def cpasync_config(N: int, dtype) -> RowConfig:
    """x lives in shared memory, not registers, so a thread can keep 16 vectors in flight:
    up to 256 threads x 16 x 16 B = 64 KiB of row per CTA without a cluster (32K bf16, 16K
    fp32); clusters of <= 8 above, then 512 threads per CTA. Two commit groups once a thread
    has >= 4 vectors: reduce the first half while the second is still arriving."""
    nvec = _vectors(N, dtype)
    tpr = min(256, max(32, _next_pow2(-(-nvec // 16))))
    cluster_n = min(8, _next_pow2(-(-nvec // (tpr * 16))))
    if -(-nvec // (cluster_n * tpr)) > 16:
        tpr = 512
    vecs = -(-nvec // (cluster_n * tpr))
    return RowConfig(
        threads_per_row=tpr,
        num_threads=max(128, tpr),
        cluster_n=cluster_n,
        stages=2 if vecs >= 4 and vecs % 2 == 0 else 1,
    )


# --------------------------------------------------------------------------------------------
# The final kernel: the cpasync stage made persistent, with the weight in shared memory.
# --------------------------------------------------------------------------------------------

#: shared memory of one SM on sm_90 (228 KiB); each resident CTA also reserves 1 KiB of it
SMEM_PER_SM = 233472
SMEM_RESERVED_PER_CTA = 1024


@dataclass(frozen=True)
class FinalConfig(RowConfig):
    """``RowConfig`` plus
    * ``blocks_per_cta``: row blocks (of rows_per_cta rows) a CTA walks one after the other,
      reading the weight once for all of them;
    * ``buffers``: row blocks of x a CTA stages in shared memory at once. With 2, the next
      block's copies are in flight while this one is reduced and stored; with 1, they go out
      after this block's stores (less shared memory, more CTAs per SM);
    * ``weight_in_smem``: the weight (and bias) slice staged once per CTA in shared memory
      (True), or loaded into registers (False: no shared memory for it, so more CTAs per SM;
      once per CTA before its first block when it fits 64 registers a thread, else for every
      row block after the sum);
    * ``exit_sync``: with a cluster, a last cluster barrier before a CTA exits (True), or none
      (False, the default): every remote store into a CTA's shared memory is one that CTA
      waits for (its mbarrier counts the bytes) before it stores its last block, so it may
      leave without its peers. The barrier held each SM until the slowest CTA of its cluster
      was done (ab_configs.json).
    ``max_vecs`` bounds a thread's share of a row in shared memory, not in registers."""

    max_vecs: int = 32
    buffers: int = 2
    blocks_per_cta: int = 4
    weight_in_smem: bool = True
    exit_sync: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.buffers not in (1, 2):
            raise ValueError(f"buffers must be 1 or 2, got {self.buffers}")
        if not 1 <= self.blocks_per_cta <= 64:
            raise ValueError(f"blocks_per_cta must be in [1, 64], got {self.blocks_per_cta}")


@dataclass(frozen=True)
class BwdConfig(RowConfig):
    """``RowConfig`` plus ``buffers``: row blocks of x and dout staged in shared memory at once
    (2: the next block's copies are in flight while this one is computed; 3 or 4: the next two
    or three, for short rows whose CTAs have shared memory to spare). ``stages`` must be 1
    here. ``max_vecs`` bounds a thread's share of a row in shared memory."""

    max_vecs: int = 32
    buffers: int = 2
    #: the CTA's weight slice copied once into shared memory (True), or read from global
    #: memory (L2: the weight is at most 1 MiB) a vector at a time in each pass: what lets a
    #: wide (fp32) weight next to long rows leave shared memory to x and dout
    weight_in_smem: bool = True
    #: with one buffer, each vector of the next row block is copied in as soon as the second
    #: pass has read it (True), rather than once the whole pass is done: the next block's
    #: loads are in flight while this one's dx is computed and stored (with a bf16 weight;
    #: an fp32 weight read from L2 waits behind the refill: ab_configs.json)
    refill_early: bool = False
    #: a prenorm backward's dresidual_out loaded with ``ld.global.nc``: the compiler may then
    #: issue them together, ahead of the second pass's dx stores, rather than each behind the
    #: last store (a plain load may not pass a store that could alias it)
    invariant_loads: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.buffers not in (1, 2, 3, 4):
            raise ValueError(f"buffers must be 1 to 4, got {self.buffers}")
