"""Stage 1, warp: a warp per row, 16-byte vectors, and a reduction in registers.

Delta over naive: instead of one thread walking a whole row, the ``threads_per_row`` lanes of a
warp (32; 8 or 16 for rows under 32 vectors) share it, each moving 16 bytes per instruction:

* Coalesced, vectorized. One load instruction of a warp now reads 32 x 16 B = 512 contiguous
  bytes of one row: four full 128-byte lines, 100% of every sector used, and 8x fewer load
  instructions than 2-byte scalar loads (a bf16 vector is 8 elements). Naive's warp touched
  32 rows N elements apart per instruction.
* The sum of squares is a tree. Each lane sums its own vectors in fp32 registers, then
  log2(32) = 5 ``shfl.sync.bfly`` rounds (a register-to-register exchange of a few cycles
  each, no shared memory, no barrier) leave the row's total in every lane.
* x stays in registers between the two passes when the row fits: a lane holds up to
  ``max_vecs`` = 16 vectors (64 registers of bf16 data), so up to N = 32 x 16 x 8 = 4096 bf16
  (2048 fp32) the kernel moves exactly 2 x M x N x sizeof(dtype) bytes: read x, write y.
* The weight is loaded right after x, so its latency hides behind the reduction.

Four rows share a 128-thread CTA (a warp each). Every lane of a row past M still joins the
shuffles (with zeros) but loads and stores nothing.

Where it stops being fast: past 16 vectors per lane (N > 4096 bf16/fp16, > 2048 fp32) a row
no longer fits one warp's registers. The kernel then walks the row in chunks of 16 vectors per
lane, once for the sum and once more (re-reading x) for the output: 1.5x the bytes from DRAM
unless the re-read hits L2, and one warp issues every byte of a long row by itself. Spreading
a row over more warps is the next stage (block).

Constraints: N a multiple of the 16-byte vector (8 elements for bf16/fp16, 4 for fp32), rows
16-byte aligned (``runtime.check_inputs`` checks both); threads_per_row <= 32; any M.
"""

from __future__ import annotations

import operator

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from ..config import RowConfig, vector_elems, warp_config
from ..primitives import copy as copy_utils
from ..primitives import reduce as reduce_utils
from ..primitives.tiling import RowTiling, ceil_div
from ..runtime import LaunchShape, RMSNormKernel, default_config_for, run_forward

CONFIG = RowConfig
default_config = warp_config


def configs(N: int, dtype) -> list[RowConfig]:
    """Every config the heuristic can pick for (N, dtype), plus the alternatives a test or an
    autotuner may force: narrower rows (8/16 lanes), 256-thread CTAs, half-size chunks."""
    base = default_config(N, dtype)
    out = [base]
    for tpr in (8, 16, 32):
        out.append(RowConfig(threads_per_row=tpr, num_threads=128))
    out.append(RowConfig(threads_per_row=32, num_threads=256))
    out.append(RowConfig(threads_per_row=32, num_threads=128, max_vecs=8))
    return list(dict.fromkeys(out))


class WarpRMSNorm(RMSNormKernel):
    """Host side shared by the vectorized stages: tiling, validation, launch shape."""

    name = "warp"
    vector_bytes = 16

    #: the stage's heuristic, used when no config is given
    heuristic = staticmethod(warp_config)
    #: row blocks (of rows_per_cta rows) one CTA reduces one after the other; the cluster
    #: stage raises it, so a CTA of the grid covers rows_per_cta * seq rows
    seq = 1

    def __init__(self, dtype, N: int, config: RowConfig | None = None, weight_dtype=None):
        if config is None:
            config = self.heuristic(N, dtype)
        super().__init__(dtype, N, config, weight_dtype)
        self.check_config()
        self.tiling = RowTiling.make(self.N, self.dtype, config)
        self.check_tiling()
        # Load the weight before the reduction (its latency hides behind it) unless it would
        # cost more than 64 registers per thread: an fp32 weight next to 16 vectors of bf16 x
        # does, and pushes the kernel past 255 registers into spills.
        w_regs = self.tiling.vecs * self.tiling.vec * self.weight_dtype.width // 32
        self.early_weight = w_regs <= 64

    # -- validation (pure Python; raised before anything is traced) ----------------------------
    @classmethod
    def accepts(cls, N: int, dtype, config) -> bool:
        """Whether this stage takes ``config`` for rows of N (the checks below raise otherwise)."""
        try:
            cls(dtype, N, config)
        except ValueError:
            return False
        return True

    def fail(self, why: str):
        raise ValueError(
            f"'{self.name}' stage, N={self.N} {self.dtype.__name__}, {self.config}: {why}"
        )

    def check_common(self):
        """What every vectorized stage needs: a RowConfig, N in vectors, N within the stage."""
        cfg = self.config
        if not isinstance(cfg, RowConfig):
            raise TypeError(f"the '{self.name}' stage takes a RowConfig, got {type(cfg).__name__}")
        vec = vector_elems(self.dtype)
        if self.N <= 0 or self.N % vec:
            self.fail(f"N must be a positive multiple of the 16-byte vector ({vec} elements)")
        max_n = self.max_N_for(self.dtype)
        if max_n is not None and self.N > max_n:
            self.fail(
                f"N is beyond what this stage supports for {self.dtype.__name__} (at most {max_n})"
            )

    def check_config(self):
        self.check_common()
        cfg = self.config
        if cfg.threads_per_row > 32:
            self.fail(
                "threads_per_row must be <= 32: this stage reduces within one warp "
                "(use the 'block' stage for more)"
            )
        self.check_one_cta_no_stages()

    def check_one_cta_no_stages(self):
        """The warp and block stages: a row in one CTA, x loaded straight into registers."""
        cfg = self.config
        if cfg.cluster_n != 1:
            self.fail("this stage has no clusters; cluster_n must be 1 (see the 'cluster' stage)")
        if cfg.stages != 1:
            self.fail("stages > 1 needs cp.async (the 'cpasync' stage)")

    def check_tiling(self):
        """Hook for stages whose tile must fit somewhere (registers, shared memory)."""

    def launch_shape(self, M: int) -> LaunchShape:
        t = self.tiling
        return LaunchShape(
            grid=(ceil_div(M, t.rows_per_cta * self.seq), t.cluster_n, 1),
            block=(t.num_threads, 1, 1),
            cluster=(1, t.cluster_n, 1),
            smem_bytes=self.smem_bytes(),
        )

    def smem_bytes(self) -> int:
        return 0

    # -- pieces a lesson lets a learner rewrite --------------------------------------------------
    def warp_reduce(self, val: Float32) -> Float32:
        """Sum ``val`` over the lanes that share this row (butterfly shuffles)."""
        return reduce_utils.warp_reduce(
            val, operator.add, width=min(self.config.threads_per_row, 32)
        )

    def rstd(self, sum_sq: Float32, eps: Float32) -> Float32:
        """1 / sqrt(mean of squares + eps), in fp32."""
        return cute.math.rsqrt(sum_sq / self.N + eps, fastmath=True)

    def row_copy(self, dtype) -> cute.TiledCopy:
        """The tiled copy (TV layout + 128-bit atom) that moves a tensor of ``dtype`` between
        a CTA's tile of rows and registers; x, the weight and y each get one."""
        t = self.tiling
        return copy_utils.row_tiled_copy(dtype, t.threads_per_row, t.num_threads, t.vec)

    # -- how a thread's partial sum becomes the row's (later stages add levels) ------------------
    def reduction_buffer(self):
        """Shared memory the row reduction needs; a warp needs none."""
        return None

    def row_sum(self, val: Float32, buffer) -> Float32:
        """The row's sum of squares in every thread of the row, from this thread's partial."""
        return self.warp_reduce(val)

    # -- device code -------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, eps: Float32, stream):
        t = self.tiling
        self.kernel(mX, mW, mO, eps).launch(
            grid=[cute.ceil_div(mX.shape[0], t.rows_per_cta * self.seq), 1, 1],
            block=[t.num_threads, 1, 1],
            stream=stream,
        )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, eps: Float32):
        # mX, mO: (M, N); mW: (N,)
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        M = mX.shape[0]

        copy_X = self.row_copy(mX.element_type)
        copy_W = self.row_copy(mW.element_type)
        copy_O = self.row_copy(mO.element_type)
        thr_X, thr_W, thr_O = (c.get_slice(tidx) for c in (copy_X, copy_W, copy_O))
        mW2 = copy_utils.broadcast_rows(mW, t.rows_per_cta)  # (rows_per_cta, N), row stride 0
        idX = cute.make_identity_tensor(mX.shape)  # (M, N) -> (row, col)

        buffer = self.reduction_buffer()
        # Which row this thread works on (the same for every chunk).
        row = thr_X.partition_S(cute.local_tile(idX, t.tiler, (bidx, 0)))[0][0]

        if cutlass.const_expr(t.chunks == 1):
            # The whole row share fits: load x once, keep it in registers for both passes.
            gX = cute.local_tile(mX, t.tiler, (bidx, 0))  # (rows_per_cta, tile_cols)
            gO = cute.local_tile(mO, t.tiler, (bidx, 0))
            gW = cute.local_tile(mW2, t.tiler, (0, 0))
            cX = cute.local_tile(idX, t.tiler, (bidx, 0))
            tXgX = thr_X.partition_S(gX)  # ((vec, 1), 1, vecs)
            tXgO = thr_O.partition_D(gO)
            tWgW = thr_W.partition_S(gW)  # ((atom_vals, atoms), 1, vecs)
            tXcX = thr_X.partition_S(cX)
            tXpX = (
                None if cutlass.const_expr(t.even_cols) else copy_utils.predicate_cols(tXcX, self.N)
            )
            tWpW = (
                None
                if cutlass.const_expr(t.even_cols)
                else copy_utils.predicate_cols(thr_W.partition_S(cX), self.N)
            )

            tXrX = cute.make_rmem_tensor_like(tXgX)
            tXrW = cute.make_rmem_tensor_like(tXgX, mW.element_type)  # x's shape, w's type
            tXrO = cute.make_rmem_tensor_like(tXgO)
            tXrX.fill(0)  # masked vectors and rows past M add nothing to the sum
            if row < M:
                cute.copy(copy_X, tXgX, tXrX, pred=tXpX)
            if cutlass.const_expr(self.early_weight):
                cute.copy(copy_W, tWgW, thr_W.retile(tXrW), pred=tWpW)

            x = tXrX.load().to(Float32)
            sum_sq = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)
            sum_sq = self.row_sum(sum_sq, buffer)
            rstd = self.rstd(sum_sq, eps)
            if cutlass.const_expr(not self.early_weight):
                cute.copy(copy_W, tWgW, thr_W.retile(tXrW), pred=tWpW)
            y = x * rstd * tXrW.load().to(Float32)
            tXrO.store(y.to(mO.element_type))
            if row < M:
                cute.copy(copy_O, tXrO, tXgO, pred=tXpX)
        else:
            # The row is wider than a thread's registers: sum chunk by chunk, then read x again.
            sum_sq = Float32(0.0)
            for k in cutlass.range(t.chunks, unroll=1):
                gX = cute.local_tile(mX, t.tiler, (bidx, k))
                cX = cute.local_tile(idX, t.tiler, (bidx, k))
                tXgX = thr_X.partition_S(gX)  # ((vec, 1), 1, vecs)
                tXcX = thr_X.partition_S(cX)
                tXpX = (
                    None
                    if cutlass.const_expr(t.even_cols)
                    else copy_utils.predicate_cols(tXcX, self.N)
                )
                tXrX = cute.make_rmem_tensor_like(tXgX)
                tXrX.fill(0)
                if row < M:
                    cute.copy(copy_X, tXgX, tXrX, pred=tXpX)
                x = tXrX.load().to(Float32)
                sum_sq += (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)
            sum_sq = self.row_sum(sum_sq, buffer)
            rstd = self.rstd(sum_sq, eps)
            for k in cutlass.range(t.chunks, unroll=1):
                gX = cute.local_tile(mX, t.tiler, (bidx, k))
                gO = cute.local_tile(mO, t.tiler, (bidx, k))
                gW = cute.local_tile(mW2, t.tiler, (0, k))
                cX = cute.local_tile(idX, t.tiler, (bidx, k))
                tXgX = thr_X.partition_S(gX)
                tXgO = thr_O.partition_D(gO)
                tWgW = thr_W.partition_S(gW)
                tXcX = thr_X.partition_S(cX)
                tXpX = (
                    None
                    if cutlass.const_expr(t.even_cols)
                    else copy_utils.predicate_cols(tXcX, self.N)
                )
                tWpW = (
                    None
                    if cutlass.const_expr(t.even_cols)
                    else copy_utils.predicate_cols(thr_W.partition_S(cX), self.N)
                )
                tXrX = cute.make_rmem_tensor_like(tXgX)
                tXrW = cute.make_rmem_tensor_like(tXgX, mW.element_type)
                tXrO = cute.make_rmem_tensor_like(tXgO)
                if row < M:
                    cute.copy(copy_X, tXgX, tXrX, pred=tXpX)
                    cute.copy(copy_W, tWgW, thr_W.retile(tXrW), pred=tWpW)
                    y = tXrX.load().to(Float32) * rstd * tXrW.load().to(Float32)
                    tXrO.store(y.to(mO.element_type))
                    cute.copy(copy_O, tXrO, tXgO, pred=tXpX)


KERNEL = WarpRMSNorm


def rmsnorm_fwd(x, weight, eps: float = 1e-6, config: RowConfig | None = None, out=None):
    """y = x / sqrt(mean(x**2) + eps) * weight, a warp per row. x: (M, N) on a Hopper GPU."""
    config = config or default_config_for(x, default_config)
    return run_forward(WarpRMSNorm, x, weight, eps, config, out=out)


__all__ = [
    "WarpRMSNorm",
    "KERNEL",
    "CONFIG",
    "default_config",
    "configs",
    "rmsnorm_fwd",
]
