"""How the final kernels' tensors reach them. ``RowStaging`` (forward and backward): rows of x
(and the residual, or dout) copied into shared memory a row block at a time, by cp.async
under an L2 policy where it can, and the predicates of a ragged row. ``SliceStaging`` (the
forward): the weight and bias slices copied into shared memory once per CTA or loaded into
registers, as its ``WeightPlan`` says. The kernel's switches (``hint_copies``,
``flat_weight_copy``) say which copies it uses."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from ..primitives import copy as copy_utils
from ..primitives.tiling import ceil_div


class RowStaging:
    """Row blocks into shared memory (needs ``tiling``, ``config``, ``use_async``, ``N`` and,
    for its ``stage_in``, the ``hint_copies`` switch: the forward's; the backward has a
    ``stage_in`` of its own, without an L2 policy)."""

    def stage_copy(self, dtype, to_smem: bool) -> cute.TiledCopy:
        """The tiled copy that brings a tensor of ``dtype`` in: cp.async (16 bytes: .cg; 4 or
        8: .ca) when ``use_async``, else plain loads through registers."""
        t = self.tiling
        if to_smem and self.use_async:
            bits = min(copy_utils.COPY_BITS, t.vec * dtype.width)
            atom = copy_utils.g2s_atom(dtype, bits=bits)
            return copy_utils.tiled_copy_from_atom(atom, t.threads_per_row, t.num_threads, t.vec)
        return copy_utils.row_tiled_copy(dtype, t.threads_per_row, t.num_threads, t.vec)

    # -- device code -------------------------------------------------------------------------------

    def col_pred(self, thr, cX):
        """Per atom of this thread's partition of the tile ``cX`` (coordinates): column < N.
        None when the tiles cover N exactly."""
        if self.tiling.even_cols:
            return None
        return copy_utils.predicate_cols(thr.partition_S(cX), self.N)

    def stage_in(self, tiled, src: cute.Tensor, dst: cute.Tensor, pred, lo: int, hi: int):
        """Copy this thread's vectors ``lo..hi-1`` of ``src`` (global) into ``dst`` (shared);
        ``pred`` (atoms, 1, vecs) switches off the vectors past N (a cp.async then copies
        nothing and zero-fills). Through registers when cp.async cannot take them.
        All of a thread's vectors go as one predicated copy, traced once (it compiles faster
        than vector by vector). A part of them (one of several commit groups) goes vector by
        vector, unrolled while tracing: as a compiler-unrolled loop it changed ptxas's
        schedule of the fp32-weight long-row kernels (docs/06_design_notes.md).
        A whole 16-byte vector goes by ``cp.async`` under an L2 evict_last policy
        (``hint_copies``); vectors that a predicate may switch off (the zero fill) keep the
        unhinted copy."""
        whole = self.tiling.vec * src.element_type.width == 128
        if self.hint_copies and self.use_async and pred is None and whole:
            policy = copy_utils.l2_evict_last()
            for v in range(lo, hi):
                copy_utils.cp_async_16(dst[None, None, v], src[None, None, v], policy)
            return
        if self.use_async and lo == 0 and hi == self.tiling.vecs:
            cute.copy(tiled, src, dst, pred=pred)  # all of them: one copy
            return
        for v in range(lo, hi):
            p = None if pred is None else pred[None, None, v]
            if self.use_async:
                cute.copy(tiled, src[None, None, v], dst[None, None, v], pred=p)
            else:
                r = cute.make_rmem_tensor_like(src[None, None, v])
                cute.copy(tiled, src[None, None, v], r, pred=p)
                dst[None, None, v].store(r.load())

    @cute.jit
    def issue_block(
        self,
        mX: cute.Tensor,
        mRes,
        sX: cute.Tensor,
        sR,
        blk: Int32,
        buf: Int32,
        rank,
        row_end: Int32,
    ):
        """Start the copies of row block ``blk`` into buffer ``buf``: ``stages`` commit groups
        (empty ones too, for rows past ``row_end``, so that every thread counts groups the
        same way)."""
        per_stage = self.tiling.vecs // self.config.stages
        for s in cutlass.range_constexpr(self.config.stages):
            self.issue_vectors(
                mX, mRes, sX, sR, blk, buf, rank, row_end, s * per_stage, (s + 1) * per_stage
            )
            if cutlass.const_expr(self.use_async):
                cute.arch.cp_async_commit_group()

    @cute.jit
    def issue_vectors(
        self,
        mX: cute.Tensor,
        mRes,
        sX: cute.Tensor,
        sR,
        blk: Int32,
        buf: Int32,
        rank,
        row_end: Int32,
        lo: cutlass.Constexpr[int],
        hi: cutlass.Constexpr[int],
    ):
        """Start the copies of this thread's vectors ``lo..hi-1`` of row block ``blk`` (of x
        and, when given, the residual) into buffer ``buf``, none for rows past ``row_end``;
        the caller commits them."""
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        copy_X = self.stage_copy(mX.element_type, True)
        thr_X = copy_X.get_slice(tidx)
        cX = cute.local_tile(cute.make_identity_tensor(mX.shape), t.tiler, (blk, rank))
        tXcX = thr_X.partition_S(cX)
        row = tXcX[0][0]
        tXgX = thr_X.partition_S(cute.local_tile(mX, t.tiler, (blk, rank)))
        tXsX = thr_X.partition_D(sX[None, None, buf])
        if cutlass.const_expr(mRes is not None):
            copy_R = self.stage_copy(mRes.element_type, True)
            thr_R = copy_R.get_slice(tidx)
            tRgR = thr_R.partition_S(cute.local_tile(mRes, t.tiler, (blk, rank)))
            tRsR = thr_R.partition_D(sR[None, None, buf])
        if row < row_end:
            # (the predicates are made here: a tensor made outside this runtime branch reaches
            # it as a plain value)
            pX = self.col_pred(thr_X, cX)
            self.stage_in(copy_X, tXgX, tXsX, pX, lo, hi)
            if cutlass.const_expr(mRes is not None):
                self.stage_in(copy_R, tRgR, tRsR, self.col_pred(thr_R, cX), lo, hi)


class SliceStaging:
    """The forward's weight and bias slices (needs what ``RowStaging`` needs and the
    ``flat_weight_copy`` switch)."""

    def weight_regs(self) -> int:
        """Registers a thread needs to hold its share of the weight and bias."""
        t, f = self.tiling, self.features
        bits = (self.weight_dtype.width if f.weight else 0) + (
            self.bias_dtype.width if self.bias_dtype else 0
        )
        return t.vecs * t.vec * bits // 32

    def load_weights(self, mW, mB, tXsX, cX, rank):
        """This thread's share of the weight and bias, in registers, in x's vector shape."""
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        out = []
        for m in (mW, mB):
            if m is None:
                out.append(None)
                continue
            if self.hint_copies:
                # evict_last, as x's copies are: else the streamed x pushes the weight out of
                # L2 (ab_configs.json)
                op = cute.nvgpu.CopyG2ROp()
                copy_W = copy_utils.row_tiled_copy(
                    m.element_type, t.threads_per_row, t.num_threads, t.vec, op=op
                )
                hint = {"cache_policy": copy_utils.l2_evict_last()}
            else:
                copy_W, hint = self.stage_copy(m.element_type, False), {}
            thr_W = copy_W.get_slice(tidx)
            gW = cute.local_tile(copy_utils.broadcast_rows(m, t.rows_per_cta), t.tiler, (0, rank))
            rW = cute.make_rmem_tensor_like(tXsX[None, None, None, 0], m.element_type)
            pW = self.col_pred(thr_W, cX)
            cute.copy(copy_W, thr_W.partition_S(gW), thr_W.retile(rW), pred=pW, **hint)
            out.append(rW)
        return out

    def flat_copy(self, dtype) -> bool:
        """Does a slice of ``dtype`` go to shared memory by ``copy_slice_flat``?"""
        return self.flat_weight_copy and self.use_async and self.tiling.vec * dtype.width > 128

    @cute.jit
    def copy_slice_flat(self, m: cute.Tensor, s_: cute.Tensor, rank):
        """Copy this CTA's columns of the (N,) tensor ``m`` into ``s_`` (its shared-memory
        slice, read back with row stride 0) in 16-byte pieces: piece ``p`` by thread
        ``p % num_threads``, under an L2 evict_last policy (every CTA reads the slice). A piece
        never straddles N (N * itemsize is a multiple of 16 when a vector is wider than 16
        bytes); pieces past N are not copied, and nothing reads them."""
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        per = 128 // m.element_type.width  # elements a piece
        pieces = t.tile_cols // per
        col0 = rank * t.tile_cols
        policy = copy_utils.l2_evict_last()
        for k in cutlass.range_constexpr(ceil_div(pieces, t.num_threads)):
            p = k * t.num_threads + tidx
            if p < pieces and col0 + p * per < self.N:
                src = cute.make_tensor(m.iterator + col0 + p * per, cute.make_layout(per))
                dst = cute.make_tensor(s_.iterator + p * per, cute.make_layout(per))
                copy_utils.cp_async_16(dst, src, policy)

    @cute.jit
    def copy_slices(self, mW, mB, sW, sB, cX: cute.Tensor, rank, row_in_cta):
        """Start the copies of the CTA's weight and bias slices into shared memory and commit
        them as one group: a wide slice by all threads (``copy_slice_flat``), else by the
        threads of the CTA's first row in x's vector shape (every row reads the same columns)."""
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        for m, s_ in ((mW, sW), (mB, sB)):
            if cutlass.const_expr(m is not None and self.flat_copy(m.element_type)):
                self.copy_slice_flat(m, s_, rank)
        if row_in_cta == 0:
            for m, s_ in ((mW, sW), (mB, sB)):
                if cutlass.const_expr(m is not None and not self.flat_copy(m.element_type)):
                    copy_W = self.stage_copy(m.element_type, True)
                    thr_W = copy_W.get_slice(tidx)
                    gW = cute.local_tile(
                        copy_utils.broadcast_rows(m, t.rows_per_cta), t.tiler, (0, rank)
                    )
                    # the weight's own predicate: an fp32 vector is two 16-byte atoms
                    pW = self.col_pred(thr_W, cX)
                    self.stage_in(
                        copy_W, thr_W.partition_S(gW), thr_W.partition_D(s_), pW, 0, t.vecs
                    )
        if cutlass.const_expr(self.use_async):
            cute.arch.cp_async_commit_group()
