"""Stage 5b, final_bwd: the backward of the final kernel, behind ``quack_edu.rmsnorm_bwd``.

What it adds: the gradients. Per row, in fp32, with x the normalised input (x + residual when
the forward had one) and rstd the forward's:

    x_hat = x * rstd,  g = dout * (w + weight_offset)        (g = dout without a weight)
    c     = sum_j(x_hat_j * g_j) / N                         (one row reduction)
    dx    = rstd * (g - x_hat * c)  (+ dresidual_out)
    dw    = sum over rows of dout * x_hat,  db = sum over rows of dout

Bytes a backward must move: read x and dout, write dx, 3 x M x N x size (4 with
dresidual_out), plus the weight once per CTA and the partial sums of dw (and db), P x N x 4
bytes written and read back, P (the grid) a few hundred: ~1% of the traffic at M = 32768.
What is new is the column reduction over rows (dw, db):

* Persistent CTAs. The grid is a runtime argument (``grid_x``: the CTAs, or clusters, that
  the GPU holds at once, asked of the CUDA driver): CTA (or cluster) ``b`` walks the row
  blocks b, b + grid_x, b + 2 grid_x, ... and keeps its columns' dw (and db) in fp32
  *registers* across all of them. At the end the rows of the CTA meet in shared memory (in
  a fixed order) and one row of threads stores them to ``dw_partial[b, cols]``: no atomics,
  so bitwise the same on every run. A second, small kernel (``PartialSum``) sums dw_partial
  over its P rows in a fixed order and writes dw in the weight's dtype.
* x and dout of a row block come in by cp.async into shared memory (``issue_block`` of
  ``RowStaging``, shared with the forward, dout in the residual's place), with one or two
  buffers (two for short rows, one from 32K: ``final_configs.BWD``); from rows of 256 KiB the
  one buffer is refilled a vector at a time (``refill_early``). The weight slice is copied
  once per CTA into shared memory or, for an fp32 weight next to rows from 64K, read from L2 a
  vector at a time so that shared memory holds x and dout only. A prenorm backward's
  dresidual_out is read in the second pass between the dx stores, marked invariant
  (``ld.global.nc``, ``invariant_loads``) so that ptxas may issue those loads ahead of the
  stores. Registers hold the accumulators: vecs x vec fp32 a thread each for dw and db (<= 64
  at 512 threads). What was measured on the way: docs/07_design_notes.md and ab_configs.json.
* The reduction of c is the forward's: shuffles, then the CTA (two alternating buffers) or
  the cluster (two alternating buffers and mbarriers, ``st.async`` to every peer), and dx is
  written with 128-bit stores from the same shared-memory tiles.

Rows that are not a whole number of 16-byte vectors take narrower vectors (the forward's
``widest_vec``), by cp.async down to 4 bytes and through registers below that.

Constraints: sm_90; 1 <= N <= 262144; a per-head weight is the host's loop over heads
(``quack_edu.rmsnorm``); a CTA's tiles (x and dout x ``buffers``, the weight slice) must fit
its shared memory.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32
from cutlass.memory import SmemAllocator

from ..config import (
    VECTOR_BYTES,
    BwdConfig,
    _next_pow2,
)
from ..primitives import copy as copy_utils
from ..primitives import reduce as reduce_utils
from ..primitives.copy import _like, store_as
from ..primitives.tiling import ceil_div
from ..runtime import LaunchShape, cute_dtype, resident_clusters, sm_count
from . import final_configs
from .final import MAX_N, FinalBase, _wider, access_vec, cache_put, round16, widest_vec

#: SMs of an H200 (the default the host's grid is computed for)
SM_COUNT = 132


CONFIG = BwdConfig


@dataclass(frozen=True)
class BwdFeatures:
    """What a compiled backward reads and writes besides x, dout, rstd and dx (the compile key).
    dtypes are torch dtypes; ``None`` means "as x" (dout) or "absent" (dresidual_out)."""

    weight: bool = True
    dout_dtype: object = None
    dres_out_dtype: object = None
    dw: bool = True
    db: bool = False
    weight_offset: float = 0.0
    #: dresidual written as a tensor of its own in this dtype (QuACK's when ``dresidual_out``
    #: has another dtype than x), from the same fp32 value as dx
    dres_dtype: object = None
    #: x, dout, dres_out, dx and dres are (M, H, N) and rstd (M, H): rows in two modes with a
    #: stride each (a view of a fused projection's heads); the weight (N,) shared
    head_rows: bool = False


def bwd_config(N: int, dtype, weight_dtype=None, features: BwdFeatures | None = None, vec=None):
    """The config the backward runs rows of N elements with: the table's entry for the row's
    length in vectors (``final_configs.backward_pick``), made to fit: db doubles a thread's
    accumulators, so threads (then the cluster) double while a thread would hold more than its
    registers allow; rows of narrow vectors copied through registers take one buffer, long rows
    with one buffer refill it early. Then the first of that pick and its fallbacks
    (``final_configs.backward_fallbacks``) that fits."""
    if not 1 <= N <= MAX_N:
        raise ValueError(f"'final_bwd' stage: N must be in [1, {MAX_N}], got N={N}")
    features = features or BwdFeatures()
    vec = vec or widest_vec(N, dtype)
    nvec = ceil_div(int(N), vec)
    pick = final_configs.backward_pick(nvec, _wider(weight_dtype, dtype))
    accs = int(features.dw) + int(features.db)
    # accumulators a thread may hold: 128 below 512 threads (255 registers), 64 at 512 (128
    # registers; fp16 x, whose conversions need more of them, spilled 8 bytes there: 32)
    fp16 = cute_dtype(dtype) is cutlass.Float16
    while accs * ceil_div(nvec, pick.threads_per_row * pick.cluster_n) * vec > (
        (32 if fp16 else 64) if pick.num_threads >= 512 else 128
    ):
        if pick.threads_per_row < 512:
            t = 2 * pick.threads_per_row
            pick = replace(pick, threads_per_row=t, num_threads=max(pick.num_threads, t))
        elif pick.cluster_n < 16:
            pick = replace(pick, cluster_n=2 * pick.cluster_n)
        else:
            break
    staged = [dtype, features.dout_dtype or dtype, weight_dtype or dtype]
    if min(vec * cute_dtype(d).width for d in staged) < 32:
        pick = replace(pick, buffers=1)  # copies through registers: nothing is in flight
    elif pick.buffers == 1 and pick.weight_in_smem and _next_pow2(nvec) >= 16384:
        pick = replace(pick, refill_early=True)  # rows of 256 KiB and more: see BwdConfig
    build = final_configs.builder(FinalBwdRMSNorm, N, dtype, weight_dtype, features, vec)
    found = final_configs.first_fitting(build, final_configs.backward_fallbacks(pick))
    if found is None:
        raise ValueError(f"no final_bwd config fits N={N} {dtype} (vectors of {vec})")
    return found


def default_config(N: int, dtype, weight_dtype=None, features=None, vec=None) -> BwdConfig:
    return bwd_config(N, dtype, weight_dtype, features, vec)


def configs(N: int, dtype, weight_dtype=None, features=None, vec=None) -> list[BwdConfig]:
    """The heuristic's pick first, then what an autotuner may try instead
    (``final_configs.backward_candidates``): those that fit."""
    features = features or BwdFeatures()
    base = bwd_config(N, dtype, weight_dtype, features, vec)
    wide = features.weight and _wider(weight_dtype, dtype)
    candidates = final_configs.backward_candidates(base, wide)
    build = final_configs.builder(FinalBwdRMSNorm, N, dtype, weight_dtype, features, vec)
    return final_configs.fitting(build, candidates)


class PartialView:
    """What a CTA's partial store works with, made once at the end of the backward kernel:

    * ``rows``, ``vecs``: rows of the CTA and vectors of a thread (Python ints);
    * ``row``: this thread's row in the CTA (a run-time value);
    * ``in_cols(v)``: whether vector ``v`` lies before column N (a run-time Boolean, or True);
    * ``mine``: this thread's slots of its own row in shared memory, ((vec, 1), 1, vecs) fp32
      (they overlay the x and dout tiles: write them only once every row is done with those);
    * ``slots(r)``: this thread's columns of row ``r``'s slots, the same shape;
    * ``write(value, v)``: store an fp32 vector as vector ``v`` of this CTA's partial row;
    * ``red_add(value, v)``: add it there atomically instead (lesson 07's strategy 1)."""

    def __init__(self, kernel, acc: cute.Tensor, mP: cute.Tensor, sAcc, bidx, rank):
        t = kernel.tiling
        self.acc = acc  # the accumulators: their vectors are the register copies' shape
        self.kernel, self.rows, self.vecs = kernel, t.rows_per_cta, t.vecs
        tidx, _, _ = cute.arch.thread_idx()
        copy_X = kernel.stage_copy(kernel.dtype, True)
        self.thr_X = copy_X.get_slice(tidx)
        cX = cute.local_tile(cute.make_identity_tensor(mP.shape), t.tiler, (0, rank))
        self.tXcX = self.thr_X.partition_S(cX)
        self.row = self.tXcX[0][0]
        self.copy_P = kernel.stage_copy(Float32, False)
        thr_P = self.copy_P.get_slice(tidx)
        gP = cute.local_tile(
            copy_utils.broadcast_rows(mP[kernel.partial_row(bidx, mP), None], t.rows_per_cta),
            t.tiler,
            (0, rank),
        )
        self.tPgP = thr_P.partition_D(gP)  # ((atom_vals, atoms), 1, vecs)
        self.sAcc = sAcc
        self.mine = self.thr_X.partition_D(sAcc) if sAcc is not None else None

    def in_cols(self, v: int):
        if cutlass.const_expr(self.kernel.tiling.even_cols):
            return True
        return self.kernel.in_cols(self.tXcX, v)

    def slots(self, r: int) -> cute.Tensor:
        t = self.kernel.tiling
        row_layout = cute.make_layout(t.tiler, stride=(0, 1))
        sRow = cute.make_tensor(self.sAcc.iterator + r * t.tile_cols, row_layout)
        return self.thr_X.partition_D(sRow)

    def _reg(self, value, v: int) -> cute.Tensor:
        rT = cute.make_rmem_tensor_like(self.acc[None, None, v], Float32)
        rT.store(value)
        return rT

    def write(self, value, v: int) -> None:
        self.kernel.write_partial(self.copy_P, self._reg(value, v), self.tPgP[None, None, v])

    def red_add(self, value, v: int) -> None:
        FinalBwdAtomic.red_add(self.kernel, self._reg(value, v), self.tPgP[None, None, v])


class FinalBwdRMSNorm(FinalBase):
    """dx, and per-CTA partial sums of dw and db, for the final forward. Shares the forward's
    shape, row-block copies (``stage_copy``, ``issue_block``; ``stage_in`` and ``col_pred``
    are its own, without Boolean tensors and without an L2 policy), reductions
    (``warp_reduce``, ``block_reduce``, ``cluster_exchange``) and cluster protocol
    (``arm_cluster_barrier``, ``expected_tx_bytes``) through ``FinalBase``."""

    name = "final_bwd"
    heuristic = staticmethod(bwd_config)

    def __init__(
        self,
        dtype,
        N: int,
        config: BwdConfig | None = None,
        weight_dtype=None,
        features: BwdFeatures | None = None,
        vec: int | None = None,
    ):
        f = self.place(dtype, N, config, weight_dtype, features or BwdFeatures(), vec)
        # the launch bound that makes ``ctas_per_sm`` true (see there)
        self.min_ctas_per_sm = max(1, self.ctas_per_sm())
        self.dout_dtype = cute_dtype(f.dout_dtype or dtype)
        self.dres_out_dtype = cute_dtype(f.dres_out_dtype) if f.dres_out_dtype else None
        self.dres_dtype = cute_dtype(f.dres_dtype) if f.dres_dtype else None
        staged = [self.dtype, self.dout_dtype, self.weight_dtype if f.weight else None]
        self.use_async = self.async_copies(staged)

    @classmethod
    def launch(cls, x, weight, dout, dres_out, rstd, dx, dres, db: bool, weight_offset=0.0,
               config=None):  # fmt: skip
        """Run this backward class on rows: x, dout, dres_out, dx, dres (M, N), last dim
        contiguous, any row strides; weight (N,) or None; rstd (M,) fp32 contiguous. dx (and
        dres, when given) are written; returns the fp32 partial sums ``(dw_partial,
        db_partial)``, (P, N) each (None when absent), whose sum over rows is dw (db); P is the
        kernel's ``grid_x`` (``FinalBwdRowBlocks``: one per row block). A variant whose
        ``partial_rows`` is set gets that many zeroed rows to add into. dres_out is read as
        invariant (``ld.global.nc``): it must not share memory with dx or dres. Nothing else is
        checked here: the library's ``quack_edu.rmsnorm.rmsnorm_bwd`` checks the arguments."""
        N = x.shape[-1]
        M = x.numel() // N  # rows, of every head with rows in two modes (x (M, H, N))
        kernel, fn = kernel_for(x, weight, dout, dres_out, dx, dres, db, weight_offset, config,
                                cls)  # fmt: skip
        features = kernel.features
        P = kernel.grid_on(M, x.get_device())
        rows = kernel.partial_rows
        alloc = x.new_zeros if rows else x.new_empty  # a variant that adds needs zeros
        dw_p = alloc((rows or P, N), dtype=torch.float32) if features.dw else None
        db_p = alloc((rows or P, N), dtype=torch.float32) if features.db else None
        if M:
            fn(x, weight, dout, dres_out, rstd, dx, dres, dw_p, db_p, P)
        else:  # no row: nothing to sum
            for t in (dw_p, db_p):
                if t is not None:
                    t.zero_()
        return dw_p, db_p

    @classmethod
    def run(cls, *args, **kwargs):
        """The forward's way in (``runtime.run_forward``) does not apply to a backward."""
        raise NotImplementedError(
            "final_bwd is a backward: it has no rmsnorm_fwd entry; run it with launch_bwd or "
            "quack_edu.rmsnorm_bwd"
        )

    def check_config(self):
        cfg = self.config
        if not isinstance(cfg, BwdConfig):
            raise TypeError(f"the 'final_bwd' stage takes a BwdConfig, got {type(cfg).__name__}")
        self.check_row()
        if cfg.stages != 1:
            self.fail("stages must be 1 (one commit group per row block)")

    # -- sizes ---------------------------------------------------------------------------------
    def smem_bytes(self) -> int:
        """x and dout tiles x ``buffers``, the weight slice, two reduction buffers and, in a
        cluster, two mbarriers. The rows' accumulators (a CTA of several rows) reuse the x and
        dout tiles at the end."""
        t, cfg, f = self.tiling, self.config, self.features
        tile = t.rows_per_cta * t.tile_cols
        total = cfg.buffers * round16(tile * t.elem_bytes)
        total += cfg.buffers * round16(tile * cute_dtype(f.dout_dtype or self.dtype).width // 8)
        if f.weight and cfg.weight_in_smem:
            total += round16(t.tile_cols * self.weight_dtype.width // 8)
        return total + self.exchange_bytes()

    def acc_regs(self) -> int:
        """fp32 registers a thread holds its dw (and db) partial sums in."""
        t, f = self.tiling, self.features
        return t.vecs * t.vec * (int(f.dw) + int(f.db))

    def ctas_per_sm(self) -> int:
        """CTAs that share an SM, by shared memory, threads and registers. Registers are
        estimated (ptxas keeps a vector's loads of both passes in flight: ~2 per accumulator
        + 56, at most 255; measured 95..255 for 16..128 accumulators) and then *enforced*: the
        kernel is compiled with this many CTAs an SM as its launch bound (.minnctapersm), so
        the persistent grid (``grid_x``) is exactly one wave. An estimate that is too high
        would leave a second, partial wave; one too low, idle SMs (both measured: up to 2x)."""
        regs = min(256, -(-(2 * self.acc_regs() + 56) // 8) * 8)
        by_regs = max(1, 65536 // (regs * self.config.num_threads))  # 1: ptxas makes it fit
        return max(0, min(self.ctas_by_smem(), by_regs, 2048 // self.config.num_threads, 32))

    def grid_x(self, M: int, sm_count: int = SM_COUNT, resident: int | None = None) -> int:
        """CTAs (clusters) along the rows, no more than row blocks; also P, the rows of
        dw_partial: one wave, ``resident`` (the CTAs or clusters the GPU holds at once: see
        ``resident``). Where that is unknown, SMs x CTAs an SM / cluster_n, and with clusters
        three times that: a cluster's CTAs must share a GPC, so fewer are resident than SMs /
        cluster_n (the H200 holds 30 clusters of 4, not 33, and 15 of 8, not 16), and a grid
        of 33 would run as a wave of 30 and a second of 3 for the last rows, where 99 runs as
        30, 30, 30 and 9: exactly one wave keeps every cluster busy until the end
        (docs/07_design_notes.md)."""
        t = self.tiling
        if resident:
            waves = resident
        else:
            waves = max(1, sm_count // t.cluster_n * self.min_ctas_per_sm)
            if t.cluster_n > 1:
                waves *= 3
        return max(1, min(ceil_div(M, t.rows_per_cta), waves))

    def grid_on(self, M: int, device_index: int) -> int:
        """``grid_x`` for ``M`` rows on GPU ``device_index``: its SMs and ``resident``."""
        return self.grid_x(M, sm_count(device_index), self.resident(device_index))

    def resident(self, device_index: int) -> int | None:
        """CTAs (clusters) of this kernel that GPU ``device_index`` holds at once: SMs x CTAs an
        SM without a cluster; with one, the CUDA driver's count
        (``runtime.resident_clusters``), None where it cannot say."""
        t, ctas = self.tiling, self.min_ctas_per_sm  # ctas_per_sm(), computed once
        if t.cluster_n == 1:
            return sm_count(device_index) * ctas
        return resident_clusters(device_index, t.cluster_n, t.num_threads, ctas)

    def launch_shape(self, M: int, sm_count: int = SM_COUNT) -> LaunchShape:
        t = self.tiling
        return LaunchShape(
            grid=(self.grid_x(M, sm_count), t.cluster_n, 1),
            block=(t.num_threads, 1, 1),
            cluster=(1, t.cluster_n, 1),
            smem_bytes=self.smem_bytes(),
        )

    # -- compiling -----------------------------------------------------------------------------
    def compile_args(self):
        """Fakes of (x, w, dout, dres_out, rstd, dx, dres, dw_partial, db_partial), grid_x,
        stream; M and P symbolic, row strides keeping the vector's accesses aligned."""
        f, vec, N = self.features, self.vec, self.N
        M, P = cute.sym_int(), cute.sym_int()
        rows = (M, cute.sym_int()) if f.head_rows else (M,)

        def rows_tensor(dt, rows):
            if dt is None:
                return None
            div = max(1, min(vec, VECTOR_BYTES * 8 // dt.width))
            align, sym = min(VECTOR_BYTES, vec * dt.width // 8), cute.sym_int64
            strides = [sym(divisibility=div) if div > 1 else sym() for _ in rows]
            return cute.runtime.make_fake_tensor(dt, (*rows, N), (*strides, 1), assumed_align=align)

        x = rows_tensor(self.dtype, rows)
        dout = rows_tensor(self.dout_dtype, rows)
        dres_out = rows_tensor(self.dres_out_dtype, rows)
        dx = rows_tensor(self.dtype, rows)
        dres = rows_tensor(self.dres_dtype, rows)
        w = None
        if f.weight:
            align = min(VECTOR_BYTES, vec * self.weight_dtype.width // 8)
            w = cute.runtime.make_fake_compact_tensor(self.weight_dtype, (N,), assumed_align=align)
        dw = rows_tensor(Float32, (P,)) if f.dw else None
        db = rows_tensor(Float32, (P,)) if f.db else None
        rstd = cute.runtime.make_fake_compact_tensor(
            Float32, rows, stride_order=tuple(reversed(range(len(rows)))), assumed_align=4
        )
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return (x, w, dout, dres_out, rstd, dx, dres, dw, db, Int32(SM_COUNT), stream)

    def wrap_compiled(self, compiled):
        """The compiled kernel, called as ``fn(x, w, dout, dres_out, rstd, dx, dres,
        dw_partial, db_partial, grid_x)`` (None where a tensor is absent; dw_partial:
        (grid_x, N) fp32)."""
        return compiled

    # -- g, the gradient that reaches x_hat --------------------------------------------------------
    def grad_in(self, dy, w):
        """g = dout * (w + weight_offset) in fp32 (dout alone without a weight)."""
        if cutlass.const_expr(w is None):
            return dy
        if cutlass.const_expr(self.features.weight_offset != 0.0):
            w = w + Float32(self.features.weight_offset)
        return dy * w

    # -- device code -------------------------------------------------------------------------------
    def in_cols(self, tXcX: cute.Tensor, v: int):
        """Whether vector ``v`` of this thread (all in or all out: N is a whole number of
        vectors) lies before column N. A comparison per use rather than a Boolean tensor:
        made per block and passed to cute.copy, the forward's predicate tensors made ptxas
        spill 16 bytes at 80 registers (N=1000 bf16, two buffers)."""
        return cute.elem_less(tXcX[(0, 0), 0, v][1], self.N)

    def col_pred(self, thr, cX):
        """Not a Boolean tensor here but the thread's partition of the coordinates ``cX`` (None
        when the tiles cover N exactly): ``stage_in`` and the passes compare a vector's first
        column with N where they use it (see ``in_cols``)."""
        if self.tiling.even_cols:
            return None
        return thr.partition_S(cX)

    @cute.jit
    def stage_in(
        self,
        tiled: cute.TiledCopy,
        src: cute.Tensor,
        dst: cute.Tensor,
        coords,
        lo: cutlass.Constexpr[int],
        hi: cutlass.Constexpr[int],
    ):
        """cp.async this thread's vectors ``lo..hi-1`` of ``src`` (global) into ``dst``
        (shared), skipping those past N (never read back: the passes skip them too). Vectors
        narrower than cp.async's 4 bytes go through registers (read back by the same thread,
        so no barrier is needed)."""
        for v in cutlass.range_constexpr(lo, hi):
            if cutlass.const_expr(coords is None):
                self.copy_in(tiled, src[None, None, v], dst[None, None, v])
            elif self.in_cols(coords, v):
                self.copy_in(tiled, src[None, None, v], dst[None, None, v])

    def copy_in(self, tiled, src: cute.Tensor, dst: cute.Tensor):
        if cutlass.const_expr(self.use_async):
            cute.copy(tiled, src, dst)
        else:
            r = cute.make_rmem_tensor_like(src)
            cute.copy(tiled, src, r)
            dst.store(r.load())

    def load_copy(self, dtype) -> cute.TiledCopy:
        """How the second pass loads dresidual_out: with ``invariant_loads`` loads marked
        invariant (``ld.global.nc``), which the compiler may move above the pass's dx stores
        (a plain load may not pass a store that could alias it), else plain loads."""
        if not self.config.invariant_loads:
            return self.stage_copy(dtype, False)
        t = self.tiling
        return copy_utils.row_tiled_copy(
            dtype, t.threads_per_row, t.num_threads, t.vec, cute.nvgpu.CopyG2ROp(), invariant=True
        )

    def weight_vector(self, tWsW, tWgW, copy_Wg, v: int, like):
        """Vector ``v`` of this thread's weight in fp32: from shared memory, from global
        memory (L2) through registers, or None without a weight."""
        if cutlass.const_expr(tWsW is not None):
            return tWsW[None, None, v].load().to(Float32)
        if cutlass.const_expr(tWgW is not None):
            src = tWgW[None, None, v]
            r = cute.make_rmem_tensor_like(like, src.element_type)  # x's vector shape
            cute.copy(copy_Wg, src, _like(r, src))
            return r.load().to(Float32)
        return None

    #: rows of the partial buffer a kernel writes whatever its grid (None: one per CTA or
    #: cluster, ``grid_x`` of them; a variant that adds into one zeroed row says 1)
    partial_rows = None

    def partial_row(self, bidx, mP: cute.Tensor):
        """The row of the partial buffer this CTA (cluster) ``bidx`` writes: its own."""
        return bidx

    def write_partial(self, copy_P: cute.TiledCopy, r: cute.Tensor, dst: cute.Tensor):
        """Write one vector of partial sums ``r`` (fp32, x's vector shape) to ``dst``: a plain
        store (the variants of lesson 07 add instead)."""
        cute.copy(copy_P, _like(r, dst), dst)

    def accumulate_dw(self, acc: cute.Tensor, v: int, dy, x_hat) -> None:
        """Add this row's contribution to dw, ``dout * x_hat`` (fp32), into vector ``v`` of the
        thread's accumulators ``acc`` (x's vector shape, fp32, kept across its row blocks)."""
        acc[None, None, v].store(acc[None, None, v].load() + dy * x_hat)

    @cute.jit
    def store_partial(
        self,
        acc: cute.Tensor,
        mP: cute.Tensor,
        sAcc,
        bidx: Int32,
        rank,
    ):
        """Row ``bidx`` of ``mP`` (P, N) fp32, this CTA's columns := the sum of ``acc`` over
        the rows of the CTA (``combine_partial``, given the views of a ``PartialView``)."""
        p = PartialView(self, acc, mP, sAcc, bidx, rank)
        self.combine_partial(acc, p.mine, p.slots, p.write, p.in_cols, p.row, p.rows)

    @cute.jit
    def combine_partial(
        self, acc: cute.Tensor, mine, slots, write, in_cols, row, rows: cutlass.Constexpr[int]
    ):
        """The CTA's rows' sums ``acc`` added in row order (through shared memory when the CTA
        holds several rows) and stored by the threads of its first row, plain stores: one
        partial row per CTA, the same bits on every run. The arguments: ``PartialView``'s."""
        vecs = cute.size(acc, mode=[2])
        if cutlass.const_expr(rows > 1):
            self.drain_copies()
            cute.arch.barrier()  # every row is done with the tiles, or with the last sum
            for v in cutlass.range_constexpr(vecs):
                mine[None, None, v].store(acc[None, None, v].load())
            cute.arch.barrier()
            if row == 0:
                for v in cutlass.range_constexpr(vecs):
                    if in_cols(v):
                        tot = acc[None, None, v].load()
                        for r in cutlass.range_constexpr(1, rows):
                            tot = tot + slots(r)[None, None, v].load()
                        write(tot, v)
        else:
            for v in cutlass.range_constexpr(vecs):
                if in_cols(v):
                    write(acc[None, None, v].load(), v)

    def drain_copies(self) -> None:
        """Wait for every cp.async still in flight (the last block's, empty ones)."""
        if cutlass.const_expr(self.use_async):
            cute.arch.cp_async_wait_group(0)

    # -- rows in two modes (``head_rows``): the launch's row block g is block g % n_head of
    # head g // n_head (a block past the last: past the last head's rows, nothing is touched)
    def head_block(self, g, n_head, H):
        if not self.features.head_rows:
            return 0, g
        head = cutlass.min(g // n_head, H - 1)
        return head, g - head * n_head

    def in_head(self, m, head):  # (M, H, N) -> (M, N), rstd's (M, H) -> (M,)
        if m is None or not self.features.head_rows:
            return m
        return m[None, head] if len(m.shape) == 2 else m[None, head, None]

    def issue_rows(self, mX, mdO, sX, sdO, g, buf, rank, M, n_head, H):
        head, blk = self.head_block(g, n_head, H)  # issue_block of the launch's block g
        self.issue_block(
            self.in_head(mX, head), self.in_head(mdO, head), sX, sdO, blk, buf, rank, M
        )

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor | None,
        mdO: cute.Tensor,
        mdResO: cute.Tensor | None,
        mRstd: cute.Tensor,
        mdX: cute.Tensor,
        mdRes: cute.Tensor | None,
        mdW: cute.Tensor | None,
        mdB: cute.Tensor | None,
        grid_x: Int32,
        stream,
    ):
        t = self.tiling
        self.kernel(mX, mW, mdO, mdResO, mRstd, mdX, mdRes, mdW, mdB, grid_x).launch(
            grid=[grid_x, t.cluster_n, 1],
            block=[t.num_threads, 1, 1],
            cluster=[1, t.cluster_n, 1] if cutlass.const_expr(t.cluster_n > 1) else None,
            stream=stream,
            **self.occupancy(),
        )

    @cute.kernel
    def kernel(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor | None,
        mdO: cute.Tensor,
        mdResO: cute.Tensor | None,
        mRstd: cute.Tensor,
        mdX: cute.Tensor,
        mdRes: cute.Tensor | None,
        mdW: cute.Tensor | None,
        mdB: cute.Tensor | None,
        grid_x: Int32,
    ):
        # mX, mdO, mdResO, mdX, mdRes: (M, N); mW: (N,); mRstd: (M,); mdW, mdB: (grid_x, N) fp32.
        # CTA (bidx, rank) owns columns rank*tile_cols.. of the row blocks bidx, bidx + grid_x,
        # ... (rows_per_cta rows each), and row bidx of the partials.
        t, cfg = self.tiling, self.config
        nbuf = cfg.buffers
        clustered = cutlass.const_expr(t.cluster_n > 1)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        rank = cute.arch.block_idx_in_cluster() if clustered else 0
        M = mX.shape[0]  # rows (of a head, with rows in two modes)
        H = mX.shape[1] if cutlass.const_expr(self.features.head_rows) else 1
        n_head = (M + t.rows_per_cta - 1) // t.rows_per_cta  # row blocks of a head

        # -- shared memory: x and dout x buffers, the weight slice, the rows' accumulators,
        # the exchange
        smem = SmemAllocator()
        x_layout = cute.make_ordered_layout((*t.tiler, nbuf), order=(1, 0, 2))
        sX = smem.allocate_tensor(mX.element_type, x_layout, byte_alignment=16)
        sdO = smem.allocate_tensor(mdO.element_type, x_layout, byte_alignment=16)
        sW = None
        if cutlass.const_expr(mW is not None and cfg.weight_in_smem):
            w_layout = cute.make_layout(t.tiler, stride=(0, 1))
            sW = smem.allocate_tensor(mW.element_type, w_layout, byte_alignment=16)
        sAcc = None
        if cutlass.const_expr(t.rows_per_cta > 1 and (mdW is not None or mdB is not None)):
            # the rows' accumulators meet at the end in the x and dout tiles, done with by then:
            # (2+ bytes of x + 2+ of dout) x buffers per element >= the 4 of fp32, contiguous
            acc_layout = cute.make_ordered_layout(t.tiler, order=(1, 0))
            sAcc = cute.make_tensor(cute.recast_ptr(sX.iterator, dtype=Float32), acc_layout)
        red, mbar_ptr = self.alternating_exchange_smem(smem)

        copy_X = self.stage_copy(mX.element_type, True)
        thr_X = copy_X.get_slice(tidx)
        cX = cute.local_tile(
            cute.make_identity_tensor(self.in_head(mX, 0).shape), t.tiler, (0, rank)
        )
        tXcX = thr_X.partition_S(cX)  # ((vec, 1), 1, vecs) -> (row, col)
        row_in_cta = tXcX[0][0]
        even = cutlass.const_expr(t.even_cols)

        # -- the weight slice, once per CTA, by the threads of its first row (first group)
        if cutlass.const_expr(sW is not None):
            if row_in_cta == 0:
                copy_W = self.stage_copy(mW.element_type, True)
                thr_W = copy_W.get_slice(tidx)
                gW = cute.local_tile(
                    copy_utils.broadcast_rows(mW, t.rows_per_cta), t.tiler, (0, rank)
                )
                cW = self.col_pred(thr_W, cX)
                self.stage_in(copy_W, thr_W.partition_S(gW), thr_W.partition_D(sW), cW, 0, t.vecs)
            if cutlass.const_expr(self.use_async):
                cute.arch.cp_async_commit_group()

        n_blocks = n_head * H
        n_iter = (cutlass.max(n_blocks - bidx, 0) + grid_x - 1) // grid_x
        self.issue_rows(mX, mdO, sX, sdO, bidx, 0, rank, M, n_head, H)
        for k in cutlass.range_constexpr(1, nbuf - 1):  # a deeper pipeline: more blocks ahead
            self.issue_rows(mX, mdO, sX, sdO, bidx + k * grid_x, k, rank, M, n_head, H)
        if cutlass.const_expr(clustered):
            cute.arch.cluster_wait()  # every peer's mbarriers are initialised and armed

        # (rows, cols, buffers) -> ((vec, 1), 1, vecs, buffers), read back through x's partition
        tXsX = thr_X.partition_D(sX)
        tDsD = thr_X.partition_D(sdO)
        tWsW = thr_X.partition_D(sW) if cutlass.const_expr(sW is not None) else None
        tWgW = copy_Wg = None
        if cutlass.const_expr(mW is not None and not cfg.weight_in_smem):
            copy_Wg = self.stage_copy(mW.element_type, False)
            thr_Wg = copy_Wg.get_slice(tidx)
            gWg = cute.local_tile(copy_utils.broadcast_rows(mW, t.rows_per_cta), t.tiler, (0, rank))
            tWgW = thr_Wg.partition_S(gWg)
        copy_dX = self.stage_copy(mdX.element_type, False)
        thr_dX = copy_dX.get_slice(tidx)
        if cutlass.const_expr(mdResO is not None):
            copy_dR = self.load_copy(mdResO.element_type)
            thr_dR = copy_dR.get_slice(tidx)
        if cutlass.const_expr(mdRes is not None):
            copy_dS = self.stage_copy(mdRes.element_type, False)
            thr_dS = copy_dS.get_slice(tidx)

        # this thread's columns' dw and db over the rows it walks, fp32
        rdW = rdB = None
        if cutlass.const_expr(mdW is not None):
            rdW = cute.make_rmem_tensor_like(tXsX[None, None, None, 0], Float32)
            rdW.fill(0.0)
        if cutlass.const_expr(mdB is not None):
            rdB = cute.make_rmem_tensor_like(tXsX[None, None, None, 0], Float32)
            rdB.fill(0.0)

        ahead = nbuf - 1  # the groups of the next blocks, in flight while this one is used
        inv_n = Float32(1.0 / self.N)
        for it in cutlass.range(n_iter, unroll=1):
            gblk = bidx + it * grid_x  # the launch's row block; block blk of its head
            head, blk = self.head_block(gblk, n_head, H)
            buf = it % nbuf
            row = blk * t.rows_per_cta + row_in_cta
            if cutlass.const_expr(nbuf == 2):  # the next block goes out before this one lands
                self.issue_rows(mX, mdO, sX, sdO, gblk + grid_x, 1 - buf, rank, M, n_head, H)
            elif cutlass.const_expr(nbuf > 2):  # into the buffer the last iteration read
                g_ahead = gblk + (nbuf - 1) * grid_x
                self.issue_rows(
                    mX, mdO, sX, sdO, g_ahead, (it + nbuf - 1) % nbuf, rank, M, n_head, H
                )
            if cutlass.const_expr(self.use_async):
                cute.arch.cp_async_wait_group(ahead)
            if cutlass.const_expr(t.rows_per_cta > 1 and sW is not None):
                if it == 0:
                    cute.arch.barrier()  # the weight slice, copied by the first row, landed
            rstd = self.in_head(mRstd, head)[cutlass.min(row, M - 1)]

            # first pass: sum(x_hat * g) for c, and dw, db
            dot = Float32(0.0)
            if row < M:
                for v in cutlass.range_constexpr(t.vecs):
                    if cutlass.const_expr(even) or self.in_cols(tXcX, v):
                        x_hat = tXsX[None, None, v, buf].load().to(Float32) * rstd
                        dy = tDsD[None, None, v, buf].load().to(Float32)
                        w = self.weight_vector(tWsW, tWgW, copy_Wg, v, tXsX[None, None, v, 0])
                        g = self.grad_in(dy, w)
                        dot += (x_hat * g).reduce(
                            cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0
                        )
                        if cutlass.const_expr(rdW is not None):
                            self.accumulate_dw(rdW, v, dy, x_hat)
                        if cutlass.const_expr(rdB is not None):
                            rdB[None, None, v].store(rdB[None, None, v].load() + dy)

            # the row's sum: warp, then the cluster (or the CTA), buffer and barrier it % 2
            parity = it & 1
            buffer = red[None, None, parity]
            val = self.warp_reduce(dot)
            if cutlass.const_expr(clustered):
                self.cluster_exchange(val, buffer, mbar_ptr + parity)
                cute.arch.mbarrier_wait(mbar_ptr + parity, phase=(it >> 1) & 1)
                val = reduce_utils.combine_buffer(buffer, operator.add, t.threads_per_row)
                if tidx == 0 and it + 2 < n_iter:  # armed again for block it + 2
                    cute.arch.mbarrier_arrive_and_expect_tx(
                        mbar_ptr + parity, self.expected_tx_bytes()
                    )
            elif cutlass.const_expr(t.warps_per_row > 1):
                val = self.block_reduce(val, buffer)
            c = val * inv_n

            # second pass: dx, from shared memory a vector at a time; with one buffer and
            # refill_early, each vector of the next block is copied into its slot once read
            refill = cutlass.const_expr(nbuf == 1 and cfg.refill_early and self.use_async)
            more = it + 1 < n_iter
            if row < M:
                gdX = cute.local_tile(self.in_head(mdX, head), t.tiler, (blk, rank))
                tXgdX = thr_dX.partition_D(gdX)
                if cutlass.const_expr(mdResO is not None):
                    gdR = cute.local_tile(self.in_head(mdResO, head), t.tiler, (blk, rank))
                    tRgdR = thr_dR.partition_S(gdR)
                if cutlass.const_expr(mdRes is not None):
                    gdS = cute.local_tile(self.in_head(mdRes, head), t.tiler, (blk, rank))
                    tSgdS = thr_dS.partition_D(gdS)
                for v in cutlass.range_constexpr(t.vecs):
                    if cutlass.const_expr(even) or self.in_cols(tXcX, v):
                        x_hat = tXsX[None, None, v, buf].load().to(Float32) * rstd
                        dy = tDsD[None, None, v, buf].load().to(Float32)
                        w = self.weight_vector(tWsW, tWgW, copy_Wg, v, tXsX[None, None, v, 0])
                        dx = (self.grad_in(dy, w) - x_hat * c) * rstd
                        if cutlass.const_expr(mdResO is not None):
                            rR = cute.make_rmem_tensor_like(
                                tXsX[None, None, v, 0], mdResO.element_type
                            )
                            src = tRgdR[None, None, v]
                            cute.copy(copy_dR, src, _like(rR, src))
                            dx = dx + rR.load().to(Float32)
                        like = tXsX[None, None, v, 0]
                        store_as(copy_dX, dx, like, tXgdX[None, None, v])
                        if cutlass.const_expr(mdRes is not None):
                            store_as(copy_dS, dx, like, tSgdS[None, None, v])
                    if cutlass.const_expr(refill):  # a thread reads back only what it copied
                        if more:
                            nh, nb = self.head_block(gblk + grid_x, n_head, H)
                            self.issue_vectors(
                                self.in_head(mX, nh), self.in_head(mdO, nh), sX, sdO, nb, 0,
                                rank, M, v, v + 1,
                            )  # fmt: skip
            if cutlass.const_expr(refill):
                if more:
                    cute.arch.cp_async_commit_group()
            elif cutlass.const_expr(nbuf == 1):  # the next block, into the buffer just read
                if more:
                    self.issue_rows(mX, mdO, sX, sdO, gblk + grid_x, 0, rank, M, n_head, H)

        # -- the partial sums of this CTA's columns, row bidx of dw_partial / db_partial
        if cutlass.const_expr(mdW is not None):
            self.store_partial(rdW, mdW, sAcc, bidx, rank)
        if cutlass.const_expr(mdB is not None):
            self.store_partial(rdB, mdB, sAcc, bidx, rank)
        if cutlass.const_expr(clustered):
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()  # no CTA leaves while a peer may still address its smem


KERNEL = FinalBwdRMSNorm


# -- host side: the compiled kernel for a call's tensors, and its launch -------------------------

_COMPILED: dict = {}


def compiled_for(
    dtype, N, weight_dtype, features: BwdFeatures, vec: int, config=None, kernel_cls=None
):
    """(kernel object, compiled kernel) for a compile key, compiled on first use. Another
    ``kernel_cls`` (a lesson's variant, a learner's subclass) is compiled once per class; at
    most ``MAX_OTHER_CLASSES`` of those are kept (``cache_put``)."""
    kernel_cls = kernel_cls or FinalBwdRMSNorm
    key = (dtype, N, weight_dtype, features, vec, config, kernel_cls)
    hit = _COMPILED.get(key)
    if hit is None:
        from ..runtime import compile_kernel

        kernel = kernel_cls(dtype, N, config, weight_dtype, features=features, vec=vec)
        hit = cache_put(_COMPILED, key, (kernel, compile_kernel(kernel)), FinalBwdRMSNorm)
    return hit


def features_for(x, weight, dout, dres_out, dres_dtype, db: bool, weight_offset=0.0):
    """The ``BwdFeatures`` of a backward call: what its tensors (dres as its dtype) ask for."""
    return BwdFeatures(
        head_rows=x.dim() == 3,
        weight=weight is not None,
        dout_dtype=dout.dtype if dout.dtype != x.dtype else None,
        dres_out_dtype=None if dres_out is None else dres_out.dtype,
        dw=weight is not None,
        db=bool(db),
        weight_offset=float(weight_offset),
        dres_dtype=dres_dtype,
    )


def kernel_for(x, weight, dout, dres_out, dx, dres, db: bool, weight_offset=0.0, config=None,
               kernel_cls=None):  # fmt: skip
    """(kernel object, compiled kernel) that ``launch_bwd`` runs for these tensors (rows, as
    ``launch_bwd`` takes them): the features they use and the widest access they allow."""
    N = x.shape[-1]
    dres_dtype = None if dres is None else dres.dtype
    features = features_for(x, weight, dout, dres_out, dres_dtype, db, weight_offset)
    vec = access_vec(N, x.dtype, (x, weight, dout, dres_out, dx, dres))
    return compiled_for(
        x.dtype, N, None if weight is None else weight.dtype, features, vec, config, kernel_cls
    )


#: ``launch_bwd(x, weight, dout, dres_out, rstd, dx, dres, db, weight_offset=0.0,
#: config=None)``: the library's backward on these rows (``FinalBwdRMSNorm.launch``)
launch_bwd = FinalBwdRMSNorm.launch


class PartialSum:
    """The backward's second reduction: ``out[j] = sum over r of partial[r, j]`` in fp32, rows
    in a fixed order (so bitwise the same on every run), written in ``out``'s dtype (the
    weight's: the cast is fused). It replaces ``partial.sum(0).to(dtype)``, which cost short
    rows several microseconds more (bwd_sum.json).

    A CTA owns ``lanes`` adjacent columns (one a thread across, so each load instruction of a
    warp reads contiguous bytes) and ``groups`` row groups: group g sums rows g, g + groups,
    g + 2 groups, ... in order, ``unroll`` loads issued together, then group 0 adds the
    groups' sums in order through shared memory and stores. ``groups`` is picked per call
    from P (``plan``) so that a thread reads ~8 rows: one round trip to L2 for the short,
    tall partials of short rows; one group and wide CTAs for the few rows (one per cluster)
    of long ones. P and N are runtime values: one compile per (dtype, groups)."""

    unroll = 8

    def __init__(self, out_dtype, groups: int):
        if groups not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"groups must be a power of two up to 32, got {groups}")
        self.out_dtype = cute_dtype(out_dtype)
        self.groups = groups
        self.lanes = max(32, 256 // groups)  # columns a CTA: 256 threads, or 32 x groups

    @staticmethod
    def plan(P: int) -> int:
        """Row groups for P partial rows: ~8 rows a thread, 1 to 32 groups."""
        return min(32, _next_pow2(max(1, -(-P // 8))))

    def compile_args(self):
        P, N = cute.sym_int(), cute.sym_int()
        partial = cute.runtime.make_fake_tensor(Float32, (P, N), (cute.sym_int64(), 1))
        out = cute.runtime.make_fake_compact_tensor(self.out_dtype, (N,))
        return (partial, out, cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True))

    def wrap_compiled(self, compiled):
        return compiled

    @cute.jit
    def __call__(self, mP: cute.Tensor, mO: cute.Tensor, stream):
        self.kernel(mP, mO).launch(
            grid=[cute.ceil_div(mP.shape[1], self.lanes), 1, 1],
            block=[self.lanes * self.groups, 1, 1],
            stream=stream,
        )

    @cute.kernel
    def kernel(self, mP: cute.Tensor, mO: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane, group = tidx % self.lanes, tidx // self.lanes
        col = bidx * self.lanes + lane
        acc = Float32(0.0)
        if col < mP.shape[1]:
            last = mP.shape[0] - 1
            step = self.groups * self.unroll
            for first in cutlass.range(group, mP.shape[0], step):
                # ``unroll`` loads issued together (rows past the last one read the last row,
                # and are not added): no branch between them, one round trip for all
                rows = [first + u * self.groups for u in range(self.unroll)]
                vals = [mP[cutlass.min(r, last), col] for r in rows]
                for r, v in zip(rows, vals, strict=True):
                    acc += Float32(cutlass.select_(r <= last, v, Float32(0.0)))
        if cutlass.const_expr(self.groups == 1):
            if col < mP.shape[1]:
                mO[col] = acc.to(mO.element_type)
        else:
            sums = SmemAllocator().allocate_tensor(
                Float32, cute.make_layout((self.groups, self.lanes), stride=(self.lanes, 1)), 16
            )
            sums[group, lane] = acc
            cute.arch.barrier()
            if group == 0 and col < mP.shape[1]:
                total = sums[0, lane]
                for g in cutlass.range_constexpr(1, self.groups):
                    total += sums[g, lane]
                mO[col] = total.to(mO.element_type)


_SUMS: dict = {}


def partial_sum_fn(dtype, P: int):
    """The compiled ``PartialSum`` call ``fn(partial, out)`` of P rows into torch ``dtype``."""
    key = (dtype, PartialSum.plan(P))
    if key not in _SUMS:
        from ..runtime import compile_kernel, direct_call

        _SUMS[key] = direct_call(compile_kernel(PartialSum(*key)))
    return _SUMS[key]


def sum_partials(partial, dtype, out=None):
    """``partial.sum(0)`` in fp32, as a tensor of ``dtype`` (a torch dtype), by ``PartialSum``:
    one launch, rows added in a fixed order. ``partial``: (P, N) fp32 on the GPU, unit column
    stride; ``out``: where to write it (N contiguous elements of ``dtype``), else a new one."""
    P, N = partial.shape
    out = partial.new_empty(N, dtype=dtype) if out is None else out
    if P and N:
        partial_sum_fn(dtype, P)(partial, out)
    elif N:
        out.zero_()
    return out


__all__ = [
    *("FinalBwdRMSNorm", "BwdConfig", "BwdFeatures", "KERNEL", "CONFIG", "MAX_N", "SM_COUNT"),
    *("bwd_config", "default_config", "configs", "compiled_for", "features_for", "kernel_for"),
    *("launch_bwd", "sm_count", "PartialSum", "partial_sum_fn", "sum_partials"),
]


# -- lesson 07: the atomics and row-block strategies -------------------------------------------
# Everything below is for lesson 07 (solutions/07_backward.ipynb), which sets three ways of
# summing dw over rows side by side; the library above uses none of it.


class FinalBwdAtomic(FinalBwdRMSNorm):
    """Strategy (1) of lesson 07: every CTA adds its columns' dw (and db) into *one* fp32 row,
    row 0 of the partial buffer, with ``red.global.add.f32`` (an atomic add whose old value is
    not returned), instead of storing row ``bidx`` of a (P, N) buffer. The buffer is one row,
    zeroed before the launch (``launch`` does both), and that row is dw: no second
    reduction. Fast to write and P times fewer partial bytes, but the order in which the CTAs'
    adds land changes from run to run, and fp32 addition is not associative: the low bits of
    dw change too (not bitwise deterministic). Everything else is the library's kernel."""

    #: rows of the partial buffer this kernel writes, whatever its grid (zeroed before launch)
    partial_rows = 1

    def partial_row(self, bidx, mP: cute.Tensor):
        """Row ``bidx`` mod the buffer's rows: row 0 of the one-row buffer. A runtime row, not
        the constant 0: with 0 the addresses were computed before the main loop and kept live
        through it (72 bytes of spills at N = 256 fp32 under a 96-register bound)."""
        return bidx % mP.shape[0]

    def write_partial(self, copy_P: cute.TiledCopy, r: cute.Tensor, dst: cute.Tensor):
        """dst += r with ``red.global.add`` (see ``red_add``)."""
        self.red_add(r, dst)

    @cute.jit
    def red_add(self, r: cute.Tensor, dst: cute.Tensor):
        """dst += r (fp32, x's vector shape): one ``red.global.add.v4.f32`` (sm_90) per 16
        bytes, .v2 for 8, a scalar ``red.global.add.f32`` for rows of one-element vectors."""
        src = _like(r, dst)  # ((atom_vals, atoms), 1), elements in order
        n = cute.size(dst, mode=[0, 0])
        for j in cutlass.range_constexpr(cute.size(dst, mode=[0, 1])):
            ptr = dst[(None, j), 0].iterator.llvm_ptr
            if cutlass.const_expr(n == 1):
                val = src[(0, j), 0]
            else:
                val = src[(None, j), 0].load()
            cute.arch.red(ptr, val, op="add", dtype="f32", sem="relaxed", scope="gpu")


class FinalBwdRowBlocks(FinalBwdRMSNorm):
    """Strategy (2) of lesson 07: the library's kernel on a grid of one CTA (cluster) per row
    block, so that no CTA walks two blocks: a partial row per row block, P up to M."""

    def grid_x(self, M: int, sm_count: int = SM_COUNT, resident: int | None = None) -> int:
        return max(1, ceil_div(M, self.tiling.rows_per_cta))


#: the lesson's kernel variants by name (the library's kernel is ``FinalBwdRMSNorm``)
VARIANTS = {"atomic": FinalBwdAtomic, "row_blocks": FinalBwdRowBlocks}

__all__ += ["FinalBwdAtomic", "FinalBwdRowBlocks", "VARIANTS"]
