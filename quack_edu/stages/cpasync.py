"""Stage 4, cpasync: the row goes global -> shared memory with cp.async and stays there.

Delta over cluster: x no longer travels through registers on its way in. Each thread issues
its 16-byte ``cp.async.cg.shared.global`` copies (LDGSTS) for its share of the row, groups them
with ``cp.async.commit_group``, and only then waits (``cp.async.wait_group n``: "at most n of
my groups may still be in flight"). The row stays in shared memory for the second pass, so:

* Loads in flight cost no registers. In the cluster stage a thread's 8 vectors of x occupy
  32 registers from issue to use, and it holds two row blocks (one reduced, the next in
  flight) plus the weight: 128 registers a thread, two 256-thread CTAs per SM, 2 x 256 x 8 x
  16 B = 64 KiB of loads in flight per SM. Here a thread keeps 16 vectors in flight and holds
  only the weight (~90-128 registers): still two 256-thread CTAs per SM (shared memory would
  allow three at 64 KiB each), but 128 KiB in flight per SM at a row's start, against the
  ~11 KiB per SM of Little's law at the measured copy and idle latency (lessons/roofline.py,
  ``littles_law``). Larger tiles per
  CTA also mean smaller clusters for the same row: 4 CTAs at 131072 bf16 (the cluster stage
  needs 8), 8 at 262144 (it needs the non-portable 16).
* The scaling pass reads x back from shared memory (LDS.128 at ~30 TB/s device-wide) rather
  than from DRAM, and never spills: nothing of x is live in registers across the reduction.
* Stages (double buffering inside a row): with ``stages`` = 2 the copies go out in two commit
  groups; the thread waits for the first (``wait_group 1``), sums it while the second is still
  arriving, then waits for the rest (``wait_group 0``). The last bytes of a row arrive ~the
  same time either way, but the first half's shared-memory reads and FMAs leave the critical
  path.

Every thread reads back only the vectors it copied itself, so ``wait_group`` is all the
synchronisation the row needs (no ``bar.sync`` before reading shared memory).

Bytes moved: still the minimum, 2 x M x N x sizeof(dtype) (+ the weight from L2).
Constraints: sm_90 for clusters (sm_80 for cp.async); N a multiple of the 16-byte vector,
N <= 262144 for every dtype (``max_N_for``); the CTA's tile (rows_per_cta x tile_cols of x)
must fit the 227 KiB of shared memory of a CTA: fp32 at 262144 needs cluster_n >= 8 (a
128 KiB slice per CTA at 8; at 4 it would be 256 KiB). ``stages`` must divide a thread's
vectors. The cluster rules of the cluster stage apply unchanged.
"""

from __future__ import annotations

from dataclasses import replace

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.memory import SmemAllocator

from ..config import SMEM_PER_CTA, RowConfig, cpasync_config, vector_elems
from ..primitives import copy as copy_utils
from ..runtime import default_config_for, run_forward
from .cluster import ClusterRMSNorm, forced_cluster

CONFIG = RowConfig
default_config = cpasync_config


def stages_config(N: int, dtype, want: int = 4) -> RowConfig:
    """A config without a cluster whose thread holds a multiple of ``want`` vectors, so the
    row goes out in ``want`` commit groups (or fewer, down to 2, where no thread layout allows
    ``want``): what lesson 05's exercises (their grader, ``lessons.simulate``) run."""
    from ..primitives.tiling import RowTiling

    base = cpasync_config(N, dtype)
    cands = [replace(base, cluster_n=1)] + [
        RowConfig(threads_per_row=t, num_threads=max(128, t)) for t in (32, 16, 64, 8, 128, 256)
    ]
    for s in [want] + [k for k in (4, 2) if k < want]:
        for c in cands:
            t = RowTiling.make(N, dtype, c)
            if t.chunks == 1 and t.vecs % s == 0:
                cfg = replace(c, stages=s)
                if CpAsyncRMSNorm.accepts(N, dtype, cfg):
                    return cfg
    raise ValueError(f"no config with >= 2 commit groups fits N={N} {dtype}")


def configs(N: int, dtype) -> list[RowConfig]:
    """The heuristic's pick; the same with one commit group and with four; a forced cluster of
    2 (small N too) and, for rows of >= 4 vectors per thread at 16 x 256 threads, the
    non-portable cluster of 16."""
    base = default_config(N, dtype)
    out = [base, replace(base, stages=1), replace(base, stages=4)]
    out.append(forced_cluster(N, dtype, 2, max_vecs=16))
    if N // vector_elems(dtype) >= 16 * 256 * 4:
        out.append(forced_cluster(N, dtype, 16, max_vecs=16))
    return [c for c in dict.fromkeys(out) if c is not None and CpAsyncRMSNorm.accepts(N, dtype, c)]


class CpAsyncRMSNorm(ClusterRMSNorm):
    name = "cpasync"
    heuristic = staticmethod(cpasync_config)
    #: x is in shared memory: the weight is loaded before the reduction, its latency hidden
    #: behind the exchange (loading it after, for 78 instead of 128 registers and a third CTA
    #: per SM, measured on the H200 as fast at 32K bf16 and 13% slower at 262K)
    plan = "hold"
    seq_rows = 1  # one row block per CTA: this kernel does not walk several

    @classmethod
    def max_N_for(cls, dtype) -> int:
        return 262144

    def check_config(self):
        self.check_common()

    def check_tiling(self):
        super().check_tiling()
        t, cfg = self.tiling, self.config
        if t.vecs % cfg.stages:
            self.fail(f"stages={cfg.stages} must divide the {t.vecs} vectors a thread copies")
        if self.smem_bytes() > SMEM_PER_CTA:
            self.fail(
                f"the CTA's tile needs {self.smem_bytes()} bytes of shared memory, more than the "
                f"{SMEM_PER_CTA} a Hopper CTA can have: raise cluster_n"
            )

    def smem_bytes(self) -> int:
        # the x tile, then the reduction's buffer and mbarrier (exchange_smem)
        return self.tiling.x_tile_bytes() + super().smem_bytes()

    # -- the pieces a lesson lets a learner rewrite ----------------------------------------------
    def make_g2s_atom(self) -> cute.CopyAtom:
        """The copy instruction that brings x in: 16-byte cp.async, cached in L2 only (.cg)."""
        return copy_utils.g2s_atom(self.dtype)

    def wait_groups_pending(self, stage: int) -> int:
        """How many commit groups may still be in flight when part ``stage`` of the row is read:
        the groups are committed in order 0..stages-1, so part s is complete once at most
        stages - 1 - s are pending."""
        return self.config.stages - 1 - stage

    @cute.jit
    def load_and_sum_sq(
        self, g2s, tXgX: cute.Tensor, tXsX: cute.Tensor, tXpX, in_row, after_issue
    ) -> Float32:
        """The pipeline: this thread's vectors of x go out in ``stages`` commit groups, part 0
        first; then part s is summed (sum of squares, fp32) as soon as its group has landed,
        while the later parts are still in flight. ``tXpX`` is None when every column is in
        the row; ``in_row`` whether this thread's row exists; ``after_issue()`` is called once
        every part is out (the kernel issues the weight's loads there, behind x's copies)."""
        stages = self.config.stages
        per_stage = self.tiling.vecs // stages
        for s in cutlass.range_constexpr(stages):
            if in_row:
                for v in cutlass.range_constexpr(s * per_stage, (s + 1) * per_stage):
                    # A predicated cp.async would still be issued (zero-filling from an address
                    # past the row); a vector past N is simply not copied, and not summed below.
                    if cutlass.const_expr(tXpX is None):
                        cute.copy(g2s, tXgX[None, None, v], tXsX[None, None, v])
                    elif tXpX[0, 0, v]:
                        cute.copy(g2s, tXgX[None, None, v], tXsX[None, None, v])
            cute.arch.cp_async_commit_group()
        after_issue()
        sum_sq = Float32(0.0)
        for s in cutlass.range_constexpr(stages):
            cute.arch.cp_async_wait_group(self.wait_groups_pending(s))
            if in_row:
                for v in cutlass.range_constexpr(s * per_stage, (s + 1) * per_stage):
                    xv = tXsX[None, None, v].load().to(Float32)
                    sq = (xv * xv).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)
                    if cutlass.const_expr(tXpX is None):
                        sum_sq += sq
                    elif tXpX[0, 0, v]:  # masked vectors were never copied: skip their garbage
                        sum_sq += sq
        return sum_sq

    def load_weight_early(self, copy_W, thr_W, tWgW, tXrW, tWpW):
        """The weight's loads into registers before the sum (``early_weight``), or nothing."""
        if cutlass.const_expr(self.early_weight):
            cute.copy(copy_W, tWgW, thr_W.retile(tXrW), pred=tWpW)

    # -- device code -------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, eps: Float32):
        # mX, mO: (M, N); mW: (N,). CTA (bidx, rank) owns rows bidx*rows_per_cta.. and
        # columns rank*tile_cols.. of them.
        t = self.tiling
        clustered = cutlass.const_expr(t.cluster_n > 1)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        rank = cute.arch.block_idx_in_cluster() if clustered else 0
        M = mX.shape[0]

        smem = SmemAllocator()
        sX = smem.allocate_tensor(  # (rows_per_cta, tile_cols): this CTA's slice of its rows
            mX.element_type, cute.make_ordered_layout(t.tiler, order=(1, 0)), byte_alignment=16
        )
        (buffer,), mbar_ptr = self.exchange_smem(smem)

        g2s = self.make_g2s_atom()
        copy_S = copy_utils.tiled_copy_from_atom(g2s, t.threads_per_row, t.num_threads, t.vec)
        copy_W = copy_utils.row_tiled_copy(mW.element_type, t.threads_per_row, t.num_threads, t.vec)
        copy_O = copy_utils.row_tiled_copy(mO.element_type, t.threads_per_row, t.num_threads, t.vec)
        thr_S, thr_W, thr_O = (c.get_slice(tidx) for c in (copy_S, copy_W, copy_O))

        gX = cute.local_tile(mX, t.tiler, (bidx, rank))  # (rows_per_cta, tile_cols)
        gO = cute.local_tile(mO, t.tiler, (bidx, rank))
        gW = cute.local_tile(copy_utils.broadcast_rows(mW, t.rows_per_cta), t.tiler, (0, rank))
        cX = cute.local_tile(cute.make_identity_tensor(mX.shape), t.tiler, (bidx, rank))
        tXgX = thr_S.partition_S(gX)  # ((vec, 1), 1, vecs)
        tXsX = thr_S.partition_D(sX)  # ((vec, 1), 1, vecs): the same elements, in smem
        tXgO = thr_O.partition_D(gO)
        tWgW = thr_W.partition_S(gW)  # ((atom_vals, atoms), 1, vecs)
        tXcX = thr_S.partition_S(cX)
        row = tXcX[0][0]
        even = cutlass.const_expr(t.even_cols)
        tXpX = None if even else copy_utils.predicate_cols(tXcX, self.N)  # (atoms, 1, vecs)
        tWpW = None if even else copy_utils.predicate_cols(thr_W.partition_S(cX), self.N)
        # y's own predicate: its atoms need not be the cp.async atom's (a learner's 64-bit one)
        tOpO = None if even else copy_utils.predicate_cols(thr_O.partition_D(cX), self.N)

        tXrW = cute.make_rmem_tensor_like(tXgX, mW.element_type)  # x's shape, w's type
        # x's copies go out first, in `stages` commit groups; the weight's loads right after
        # them (early_weight), before the first wait
        sum_sq = self.load_and_sum_sq(
            g2s,
            tXgX,
            tXsX,
            tXpX,
            row < M,
            lambda: self.load_weight_early(copy_W, thr_W, tWgW, tXrW, tWpW),
        )
        sum_sq = self.row_sum(sum_sq, buffer, mbar_ptr)  # warp -> cluster | block
        rstd = self.rstd(sum_sq, eps)
        if cutlass.const_expr(not self.early_weight):
            cute.copy(copy_W, tWgW, thr_W.retile(tXrW), pred=tWpW)

        # Second pass from shared memory, a vector at a time: nothing of x stays in registers.
        tXrO = cute.make_rmem_tensor_like(tXgO)
        if row < M:
            for v in cutlass.range_constexpr(t.vecs):
                xv = tXsX[None, None, v].load().to(Float32)
                y = xv * rstd * tXrW[None, None, v].load().to(Float32)
                tXrO[None, None, v].store(y.to(mO.element_type))
                cute.copy(
                    copy_O,
                    tXrO[None, None, v],
                    tXgO[None, None, v],
                    pred=None if even else tOpO[None, None, v],
                )
        if cutlass.const_expr(clustered):
            cute.arch.cluster_wait()


KERNEL = CpAsyncRMSNorm


def rmsnorm_fwd(x, weight, eps: float = 1e-6, config: RowConfig | None = None, out=None):
    """y = x / sqrt(mean(x**2) + eps) * weight, x staged in shared memory by cp.async."""
    config = config or default_config_for(x, default_config)
    return run_forward(CpAsyncRMSNorm, x, weight, eps, config, out=out)
