"""Lesson 06's exercise inside the final kernel: a learner's loop over a CTA's row blocks
(``row_blocks``) in place of the kernel's own, for a cluster with two buffers, and the passes
it is handed. ``FinalRMSNorm`` mixes this in; the library's own loop never uses it."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from ..primitives import reduce as reduce_utils
from ..primitives.copy import store_as


@dataclass
class CtaParts:
    """What the passes read of one CTA (values of the kernel being traced): x's shared-memory
    partition ``tXsX`` and its copy ``thr_X`` and coordinates ``cX``; the weight and bias
    (global ``mW``/``mB``, shared ``sW``/``sB``, partitioned ``tWsW``/``tBsB``, or ``held`` in
    registers); the output and rstd; the rows ``M``; this thread's row, first column and rank."""

    tXsX: object
    thr_X: object
    cX: object
    mW: object
    mB: object
    sW: object
    sB: object
    tWsW: object
    tBsB: object
    held: tuple
    mO: object
    mRstd: object
    M: object
    row_in_cta: object
    first_col: object
    rank: object


class LearnerLoop:
    #: lesson 06's exercise: a loop over the CTA's row blocks that replaces the kernel's own
    #: for a cluster with two buffers (``row_blocks(n_iter, blk0, tidx, issue, first_pass,
    #: send, wait_peers, combine, rearm, second_pass)``); None: the kernel's own loop
    row_blocks = None

    def learner_loop(self, cta: CtaParts, n_iter, blk0, tidx, issue, ahead, red, mbar_ptr, eps):
        """Run ``row_blocks`` with its helpers: ``issue(blk, b)`` starts a block's copies into
        buffer b; the passes, the exchange (send, wait_peers, combine) and the re-arm are the
        kernel's, on buffer and mbarrier ``p``."""
        t = self.tiling
        self.row_blocks(
            n_iter,
            blk0,
            tidx,
            issue,
            lambda it, blk, b: self.lesson_first_pass(cta, it, blk, b, ahead),
            lambda val, p: self.cluster_exchange(
                self.warp_reduce(val), red[None, None, p], mbar_ptr + p
            ),
            lambda p, phase: cute.arch.mbarrier_wait(mbar_ptr + p, phase=phase),
            lambda p: reduce_utils.combine_buffer(
                red[None, None, p], operator.add, t.threads_per_row
            ),
            lambda p: cute.arch.mbarrier_arrive_and_expect_tx(
                mbar_ptr + p, self.expected_tx_bytes()
            ),
            lambda it, blk, b, val: self.lesson_second_pass(cta, blk, b, val, eps),
        )

    @cute.jit
    def lesson_first_pass(self, cta: CtaParts, it, blk, buf, ahead) -> Float32:
        """For ``row_blocks``: wait for block ``blk``'s copies into buffer ``buf`` (``ahead``
        groups of the next block may stay in flight) and return its rows' sums of squares (this
        thread's part). The kernel's loop does the same inline."""
        t, cfg = self.tiling, self.config
        stages = cfg.stages
        per_stage = t.vecs // stages
        row = blk * t.rows_per_cta + cta.row_in_cta
        sum_sq = Float32(0.0)
        for s in cutlass.range_constexpr(stages):
            if cutlass.const_expr(self.use_async):
                cute.arch.cp_async_wait_group(stages - 1 - s + ahead)
            if cutlass.const_expr(
                s == 0
                and (cta.sW is not None or cta.sB is not None)
                and (t.rows_per_cta > 1 or self.flat_slices)
            ):
                if it == 0:  # the weight and bias slices landed (copied by other threads)
                    cute.arch.barrier()
            if row < cta.M:
                pred = self.col_pred(cta.thr_X, cta.cX)
                for v in cutlass.range(s * per_stage, (s + 1) * per_stage, 1, unroll_full=True):
                    if cutlass.const_expr(t.even_cols) or pred[0, 0, v]:
                        xv = cta.tXsX[None, None, v, buf].load().to(Float32)
                        sum_sq += (xv * xv).reduce(
                            cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0
                        )
        return sum_sq

    @cute.jit
    def lesson_second_pass(self, cta: CtaParts, blk, buf, val, eps):
        """For ``row_blocks``: rstd from the row's sum ``val``, then block ``blk``'s output from
        buffer ``buf`` through the epilogue (``scale``)."""
        t = self.tiling
        rstd = self.rstd(val, eps)
        row = blk * t.rows_per_cta + cta.row_in_cta
        if cutlass.const_expr(cta.mRstd is not None):
            if cta.first_col == 0 and row < cta.M:
                cta.mRstd[row] = rstd
        tidx, _, _ = cute.arch.thread_idx()
        copy_O = self.stage_copy(cta.mO.element_type, False)
        tile = cute.local_tile(cta.mO, t.tiler, (blk, cta.rank))
        tOgO = copy_O.get_slice(tidx).partition_D(tile)
        rW, rB = cta.held
        if row < cta.M:
            pred = self.col_pred(cta.thr_X, cta.cX)
            for v in cutlass.range(t.vecs, unroll_full=True):
                if cutlass.const_expr(t.even_cols) or pred[0, 0, v]:
                    xv = cta.tXsX[None, None, v, buf].load().to(Float32)
                    w = b = None
                    if cutlass.const_expr(cta.mW is not None):
                        wv = cta.tWsW[None, None, v] if rW is None else rW[None, None, v]
                        w = wv.load().to(Float32)
                    if cutlass.const_expr(cta.mB is not None):
                        bv = cta.tBsB[None, None, v] if rB is None else rB[None, None, v]
                        b = bv.load().to(Float32)
                    y = self.scale(xv * rstd, w, b)
                    store_as(copy_O, y, cta.tXsX[None, None, v, 0], tOgO[None, None, v])
