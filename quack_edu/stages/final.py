"""Stage 5, final: the cpasync kernel with the library's features and a plan per row length.

Delta over cpasync, in bytes, registers and bytes in flight (the measurements behind each
choice: docs/06_design_notes.md and the records it names):

* Where the weight lives is a plan (``WeightPlan``). cpasync holds a thread's share of the
  weight in registers, 64 of them for bf16 but 128 for fp32 (the weight ``nn.RMSNorm(dim)``
  holds under bf16 activations). Here the CTA's slice can be copied once into shared memory
  instead (registers then no longer depend on the weight's dtype), before the first block's x
  or, when it is wider than x's vectors and copied flat (``flat_weight_copy``), after it; or be
  held in registers, loaded once per CTA when it fits 64 of them.
* A CTA walks ``blocks_per_cta`` row blocks, so its weight slice is read from L2 once per
  several blocks: at N = 262144 with an fp32 weight, per-block loads would move 1 MiB of
  weight from L2 for every 0.5 MiB of x.
* Two row blocks of x in shared memory (``buffers`` = 2): the next block's cp.async copies go
  out before this block is waited for, so a block is in flight while the previous one is
  reduced, exchanged and stored, without spending registers on it.
* x comes in under an L2 evict_last policy (``hint_copies``): the bytes are the same, but L2
  then evicts the output's dirty lines before x's (ladder.json: 98-101% of the D2D copy).
* Programmatic dependent launch (``pdl``): CTAs wait (``griddepcontrol.wait``) before their
  first global access, so launch and setup overlap the previous kernel's end; this matters
  for short rows (ab_configs.json).
* The plan depends on the row length (``final_config``; the rows of ``final_configs``).
* What the library needs: bias, a residual added in fp32 (``residual_out`` written in the
  first pass: the residual costs its read and that write), ``out``/residual dtypes of their
  own, rstd stored, ``weight_offset`` (Gemma's 1 + w, added in fp32), a per-head weight
  (H, D) (grid z = head), rows of any stride, any N from 1 to 262144: a row that is not a
  whole number of 16-byte vectors (or a stride or pointer that is not 16-byte aligned) takes
  narrower accesses (``vec`` elements, a power of two), through registers under 4 bytes.

The exchange is the cluster stage's, repeated over the CTA's row blocks with two reduction
buffers and two mbarriers that consecutive blocks use in turn; a barrier is armed again after
its wait, for the block that uses it next (the loop in ``kernel`` is the protocol). Two are
enough: a peer cannot reach the exchange two blocks ahead before every warp here has sent the
next block's partial, which each warp does only after reading this block's slots; so a slot is
never overwritten before it is read, and a re-arm never races a phase it could complete.
Without a cluster the block level uses the same two buffers for the same reason (a fast warp's
next write would land in a slot a slow warp has not read yet).
Unlike the cluster stage, a CTA leaves without a last cluster barrier (``exit_sync=False``):
the peers of a cluster walk the same blocks, and every store into a CTA's shared memory is one
that CTA waits for (its mbarrier counts the bytes) before it stores its last block, so none can
land after it exits.

Constraints: sm_90 (clusters, cp.async); 1 <= N <= 262144; a CTA's tile (x and residual times
``buffers``, plus the weight and bias slices when they live in shared memory) must fit its
shared memory; ``stages`` must divide a thread's vectors.
"""

from __future__ import annotations

import enum
import math
import operator
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64
from cutlass.memory import SmemAllocator

from .._env import gpu_kind
from ..config import (
    MAX_N,
    SMEM_PER_CTA,
    SMEM_PER_SM,
    SMEM_RESERVED_PER_CTA,
    VECTOR_BYTES,
    FinalConfig,
)
from ..primitives import reduce as reduce_utils
from ..primitives.copy import store_as
from ..primitives.tiling import RowTiling, ceil_div
from ..runtime import LaunchShape, cute_dtype, direct_call
from . import final_configs
from .cluster import ClusterRMSNorm
from .final_lesson import CtaParts, LearnerLoop
from .final_staging import RowStaging, SliceStaging

CONFIG = FinalConfig


@dataclass(frozen=True)
class Features:
    """What a compiled final kernel reads and writes besides x and out (the compile key).

    dtypes are torch dtypes; ``None`` means "as x" (out, residual_out) or "absent".
    """

    weight: bool = True
    bias_dtype: object = None
    residual_dtype: object = None
    residual_out_dtype: object = None
    out_dtype: object = None
    rstd: bool = False
    #: the weight and bias are (H, N), one row a head of x (M, H, N)
    per_head: bool = False
    weight_offset: float = 0.0
    #: x, the residual and the outputs are (M, H, N), rows in two modes with a stride each
    #: (a view of a fused projection's heads), the weight shared; one grid z a head
    head_rows: bool = False

    @property
    def two_modes(self) -> bool:
        """Rows in two modes (M, H): per-head parameters, or ``head_rows``."""
        return self.per_head or self.head_rows


class WeightPlan(enum.Enum):
    """Where the forward keeps the CTA's weight and bias slices and when it reads them: one of
    five, resolved when the kernel is built (``FinalRMSNorm.weight_plan``) from the config's
    ``weight_in_smem``, the registers the slices need and the kernel's switches."""

    #: copied into shared memory once per CTA, in a commit group of its own before the first
    #: row block's; waited for with the first block
    SMEM = "shared memory, before x"
    #: copied into shared memory once per CTA after the first block's x (a slice copied flat,
    #: ``weight_after_x``), waited for only before the first block's second pass
    SMEM_AFTER_X = "shared memory, after x"
    #: loaded into registers once per CTA, before its first row block (``weight_once``)
    REGS_ONCE = "registers, once"
    #: loaded into registers for every row block, before its sum
    REGS_EACH_BLOCK = "registers, every block"
    #: loaded into registers for every row block after its sum: a share of over 64 registers
    #: a thread would otherwise be held across the reduction
    REGS_AFTER_SUM = "registers, after the sum"

    @property
    def in_smem(self) -> bool:
        return self in (WeightPlan.SMEM, WeightPlan.SMEM_AFTER_X)


def _esize(dtype) -> int:
    return cute_dtype(dtype).width // 8


def round16(nbytes: int) -> int:
    """``nbytes`` rounded up to 16: what a 16-byte aligned shared-memory allocation takes."""
    return -(-nbytes // 16) * 16


def widest_vec(N: int, dtype) -> int:
    """The widest access (elements, a power of two, <= 16 bytes of x) that divides N."""
    vec = VECTOR_BYTES // _esize(dtype)
    return math.gcd(vec, int(N)) if N > 0 else vec


def final_config(N: int, dtype, weight_dtype=None, features: Features | None = None, vec=None):
    """The config the forward runs rows of N elements with: the heuristic's pick by row length
    in vectors, weight width and residual (``final_configs.forward_pick``: its rows say why and
    name their records), else the first of its fallbacks that fits (``forward_fallbacks``)."""
    if not 1 <= N <= MAX_N:
        raise ValueError(f"'final' stage: N must be in [1, {MAX_N}], got N={N}")
    features = features or Features()
    vec = vec or widest_vec(N, dtype)
    pick = final_configs.forward_pick(
        ceil_div(int(N), vec),
        vec,
        wide=_wider(features.weight and weight_dtype, dtype),
        residual=features.residual_dtype is not None,
        gpu=gpu_kind(),
    )
    build = final_configs.builder(FinalRMSNorm, N, dtype, weight_dtype, features, vec)
    found = final_configs.first_fitting(build, final_configs.forward_fallbacks(pick))
    if found is None:
        raise ValueError(f"no final config fits N={N} {dtype}")
    return found


def _wider(weight_dtype, dtype) -> bool:
    """Is ``weight_dtype`` (None or False: no weight) wider than x's ``dtype``?"""
    return bool(weight_dtype) and cute_dtype(weight_dtype).width > cute_dtype(dtype).width


def default_config(N: int, dtype, weight_dtype=None, features=None, vec=None) -> FinalConfig:
    return final_config(N, dtype, weight_dtype, features, vec)


def configs(N: int, dtype, weight_dtype=None, features=None, vec=None) -> list[FinalConfig]:
    """The heuristic's pick first, then what an autotuner may try instead
    (``final_configs.forward_candidates``): those that fit."""
    features = features or Features()
    vec = vec or widest_vec(N, dtype)
    base = final_config(N, dtype, weight_dtype, features, vec)
    build = final_configs.builder(FinalRMSNorm, N, dtype, weight_dtype, features, vec)
    return final_configs.fitting(build, final_configs.forward_candidates(base))


class FinalBase(RowStaging, ClusterRMSNorm):
    """What the final forward and backward kernels share: their shape (``place``), row blocks
    staged in shared memory (``RowStaging``), the row reduction's alternating buffers and, from
    the cluster stage, the reductions and the cluster protocol. Each kernel adds its own
    features, config, plan and device code."""

    plan = "hold"
    seq_rows = 1

    def place(self, dtype, N, config, weight_dtype, features, vec):
        """What every final kernel (forward and backward) sets first: the dtypes, N, the
        access width ``vec``, the config (the class's ``heuristic`` when None), checked, and
        its tiling. Returns the features."""
        self.features = features
        self.dtype = cute_dtype(dtype)
        self.weight_dtype = cute_dtype(weight_dtype if weight_dtype is not None else dtype)
        self.N = int(N)
        self.vec = vec or widest_vec(N, dtype)
        if config is None:
            config = self.heuristic(N, dtype, weight_dtype, features, self.vec)
        self.config = config
        self.check_config()
        self.tiling = RowTiling.make(self.N, self.dtype, config, vec=self.vec)
        self.check_tiling()
        self.seq = 1
        return features

    def async_copies(self, staged) -> bool:
        """Can every tensor of these dtypes (None: absent) come in by cp.async? It copies 4, 8
        or 16 bytes: narrower vectors go through registers."""
        return all(self.vec * d.width >= 32 for d in staged if d is not None)

    @classmethod
    def max_N_for(cls, dtype) -> int:
        return MAX_N

    def check_row(self):
        """What both kernels' ``check_config`` ask of the row: N in [1, MAX_N] and ``vec`` a
        power of two that divides N."""
        if not 1 <= self.N <= MAX_N:
            self.fail(f"N must be in [1, {MAX_N}]")
        if self.vec & (self.vec - 1) or self.N % self.vec:
            self.fail(f"vec={self.vec} must be a power of two that divides N")

    def check_tiling(self):
        t, cfg = self.tiling, self.config
        if t.chunks > 1:
            self.fail(
                f"a thread's share of the row is {t.vecs * t.chunks} vectors but max_vecs is "
                f"{cfg.max_vecs}: raise threads_per_row or cluster_n"
            )
        if t.vecs % cfg.stages:
            self.fail(f"stages={cfg.stages} must divide the {t.vecs} vectors a thread copies")
        if cfg.cluster_n > 1 and 2 * t.tiles_per_row <= cfg.cluster_n:
            self.fail(
                f"with {t.tile_cols} columns per CTA only {t.tiles_per_row} of the "
                f"{cfg.cluster_n} CTAs of the cluster would own columns"
            )
        if self.smem_bytes() > SMEM_PER_CTA:
            self.fail(
                f"the CTA needs {self.smem_bytes()} bytes of shared memory, more than the "
                f"{SMEM_PER_CTA} a Hopper CTA can have: raise cluster_n or use buffers=1"
            )

    def exchange_bytes(self) -> int:
        """Shared memory of ``alternating_exchange_smem``: two reduction buffers and, in a
        cluster, two mbarriers (16 bytes)."""
        t = self.tiling
        return 2 * round16(t.reduction_buffer_bytes()) + (16 if t.cluster_n > 1 else 0)

    def ctas_by_smem(self) -> int:
        """CTAs whose shared memory (``smem_bytes``, and what the driver reserves a CTA) fits
        an SM's together."""
        return SMEM_PER_SM // (self.smem_bytes() + SMEM_RESERVED_PER_CTA)

    def alternating_exchange_smem(self, smem: SmemAllocator):
        """The row reduction's shared memory, for blocks reduced one after the other: two
        buffers (rows_per_cta, (warps_per_row, cluster_n), 2) used alternately and, in a
        cluster, two mbarriers, armed. Returns (buffers, mbar_ptr or None)."""
        t = self.tiling
        layout = cute.make_ordered_layout(
            (t.rows_per_cta, (t.warps_per_row, t.cluster_n), 2), order=(1, 0, 2)
        )
        red = smem.allocate_tensor(Float32, layout, byte_alignment=16)
        mbar_ptr = None
        if t.cluster_n > 1:  # a trace-time (Python) decision
            mbar_ptr = smem.allocate_array(Int64, 2)
            self.arm_cluster_barrier(mbar_ptr, 2)
        return red, mbar_ptr


class FinalRMSNorm(SliceStaging, LearnerLoop, FinalBase):
    """The forward: the final kernel (the module's docstring says what it adds)."""

    name = "final"
    heuristic = staticmethod(final_config)

    #: a weight (and bias) held in registers is loaded once per CTA, before its first row
    #: block, rather than for every block (``WeightPlan.REGS_ONCE``; ab_configs.json)
    weight_once = True

    #: programmatic dependent launch: the grid may be launched while the previous kernel on
    #: the stream drains, its CTAs waiting (``griddepcontrol.wait``) before any global access,
    #: and it lets the next kernel launch once all its CTAs have started (``--variant pdl=False``)
    pdl = True

    #: the L2 evict_last policy on x's copies (``stage_in``) and on a weight's loads into
    #: registers; False: plain copies, as before it (``--variant hint_copies=False``)
    hint_copies = True

    #: a weight or bias slice wider than x's 16-byte vectors (fp32 next to bf16 x) is copied
    #: to shared memory by all the CTA's threads, 16 contiguous bytes each, rather than in x's
    #: vector shape, where every cp.async asked L2 for twice the sectors it used: the first
    #: wave's CTAs all read the same few L2 lines at once (ab_configs.json)
    flat_weight_copy = True

    #: a slice copied flat goes out after the first row block's copies, and lands while the
    #: row is summed (``WeightPlan.SMEM_AFTER_X``; ab_configs.json); a narrow slice goes first
    weight_after_x = True

    def __init__(
        self,
        dtype,
        N: int,
        config: FinalConfig | None = None,
        weight_dtype=None,
        features: Features | None = None,
        vec: int | None = None,
    ):
        f = self.place(dtype, N, config, weight_dtype, features or Features(), vec)
        self.min_ctas_per_sm = 0
        self.out_dtype = cute_dtype(f.out_dtype or dtype)
        self.res_dtype = cute_dtype(f.residual_dtype) if f.residual_dtype else None
        self.res_out_dtype = cute_dtype(f.residual_out_dtype) if f.residual_out_dtype else None
        self.bias_dtype = cute_dtype(f.bias_dtype) if f.bias_dtype else None
        staged = [
            self.dtype,
            self.res_dtype,
            self.weight_dtype if f.weight else None,
            self.bias_dtype,
        ]
        self.use_async = self.async_copies(staged)
        #: a weight or bias slice goes to shared memory by ``copy_slice_flat``
        self.flat_slices = any(
            d is not None and self.flat_copy(d) for d in (staged[2], self.bias_dtype)
        )
        self.weight_plan = self.resolve_weight_plan()

    def resolve_weight_plan(self) -> WeightPlan:
        if self.config.weight_in_smem:
            late = self.weight_after_x and self.use_async and self.flat_slices
            return WeightPlan.SMEM_AFTER_X if late else WeightPlan.SMEM
        if self.weight_regs() > 64:
            return WeightPlan.REGS_AFTER_SUM
        return WeightPlan.REGS_ONCE if self.weight_once else WeightPlan.REGS_EACH_BLOCK

    @classmethod
    def launch(
        cls, x, weight, bias, residual, out, residual_out, rstd, eps, weight_offset=0.0,
        config=None,
    ):  # fmt: skip
        """Run this kernel class on these tensors (compiled on first use; a subclass, such as
        a lesson's, compiles its own). x, residual, out, residual_out: (M, N), or (M, H, N)
        (rows in two modes: a per-head weight/bias (H, N), or the weight (N,) shared by the
        heads); rstd: fp32, x.shape[:-1], compact. Last dims contiguous;
        any other strides. Nothing is checked here beyond what picks the compiled kernel (the
        library's ``quack_edu.rmsnorm`` checks the user's arguments)."""
        if x.numel() == 0:
            return
        fn = kernel_for(x, weight, bias, residual, out, residual_out, rstd, weight_offset, config,
                        cls)  # fmt: skip
        fn.call(x, weight, bias, residual, out, residual_out, rstd, eps)

    @classmethod
    def run(cls, x, weight, eps, config, out=None):
        """``runtime.run_forward`` for this stage (the benchmark's and the grader's way in)."""
        import torch

        from ..runtime import check_inputs

        check_inputs(x, weight, stage="final", row_align=1, max_N=MAX_N, out=out)
        if out is None:
            out = torch.empty_like(x)
        cls.launch(x, weight, None, None, out, None, None, eps, config=config)
        return out

    def check_config(self):
        cfg = self.config
        if not isinstance(cfg, FinalConfig):
            raise TypeError(f"the 'final' stage takes a FinalConfig, got {type(cfg).__name__}")
        self.check_row()
        if self.vec * self.dtype.width > 8 * VECTOR_BYTES:
            self.fail(f"vec={self.vec} is wider than a 16-byte access of x")

    # -- sizes ---------------------------------------------------------------------------------
    def smem_bytes(self) -> int:
        """x (and residual) tiles x ``buffers``, the weight and bias slices, two reduction
        buffers and, in a cluster, two mbarriers (``exchange_bytes``); every allocation
        16-byte aligned."""
        t, cfg, f = self.tiling, self.config, self.features
        x_tile = t.rows_per_cta * t.tile_cols
        total = cfg.buffers * round16(x_tile * t.elem_bytes)
        if f.residual_dtype is not None:
            total += cfg.buffers * round16(x_tile * _esize(f.residual_dtype))
        if f.weight and cfg.weight_in_smem:
            total += round16(t.tile_cols * self.weight_dtype.width // 8)
        if f.bias_dtype is not None and cfg.weight_in_smem:
            total += round16(t.tile_cols * _esize(f.bias_dtype))
        return total + self.exchange_bytes()

    def ctas_per_sm(self) -> int:
        """CTAs that can share an SM, by shared memory and threads (registers are ~40)."""
        return max(0, min(self.ctas_by_smem(), 2048 // self.config.num_threads, 32))

    def grid_x(self, M: int) -> int:
        """CTAs (clusters) per head along the rows: one per ``blocks_per_cta`` row blocks."""
        return ceil_div(ceil_div(M, self.tiling.rows_per_cta), self.config.blocks_per_cta)

    def launch_shape(self, M: int, heads: int = 1) -> LaunchShape:
        t = self.tiling
        return LaunchShape(
            grid=(self.grid_x(M), t.cluster_n, heads),
            block=(t.num_threads, 1, 1),
            cluster=(1, t.cluster_n, 1),
            smem_bytes=self.smem_bytes(),
        )

    # -- compiling -----------------------------------------------------------------------------
    def compile_args(self):
        """Fake tensors for every argument of ``__call__`` (None where a feature is off)."""
        f, vec = self.features, self.vec
        M = cute.sym_int()
        H = cute.sym_int() if f.two_modes else None
        rows = (M, H) if f.two_modes else (M,)

        def stride(dt):  # in elements: a 16-byte access (or the whole narrow one) stays aligned
            div = max(1, min(vec, VECTOR_BYTES * 8 // dt.width))
            return cute.sym_int64(divisibility=div) if div > 1 else cute.sym_int64()

        def rows_tensor(dtype):
            if dtype is None:
                return None
            dt = cute_dtype(dtype)
            strides = tuple(stride(dt) for _ in rows) + (1,)
            align = min(VECTOR_BYTES, vec * dt.width // 8)
            return cute.runtime.make_fake_tensor(dt, (*rows, self.N), strides, assumed_align=align)

        def weight_tensor(dtype):
            if dtype is None:
                return None
            dt = cute_dtype(dtype)
            align = min(VECTOR_BYTES, vec * dt.width // 8)
            if f.per_head:
                return cute.runtime.make_fake_tensor(
                    dt, (H, self.N), (stride(dt), 1), assumed_align=align
                )
            return cute.runtime.make_fake_compact_tensor(dt, (self.N,), assumed_align=align)

        x = rows_tensor(self.dtype)
        out = rows_tensor(self.out_dtype)
        res = rows_tensor(self.res_dtype)
        res_out = rows_tensor(self.res_out_dtype)
        w = weight_tensor(self.weight_dtype if f.weight else None)
        b = weight_tensor(self.bias_dtype)
        rstd = (
            cute.runtime.make_fake_compact_tensor(
                Float32, rows, stride_order=tuple(reversed(range(len(rows)))), assumed_align=4
            )
            if f.rstd
            else None
        )
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return (x, w, b, res, out, res_out, rstd, Float32(1e-6), stream)

    def wrap_compiled(self, compiled):
        """The compiled kernel, callable like every stage's as ``fn(x, w, out, eps)`` too."""
        return CompiledFinal(self, compiled)

    # -- the pieces a lesson lets a learner rewrite ----------------------------------------------
    def scale(self, x_hat, w, b):
        """The epilogue of one vector, in fp32: ``x_hat * (w + weight_offset) + b`` (w or b may
        be None). The offset is added in fp32: Gemma's 1 + w rounded to bf16 first would lose
        the low bits of a small w."""
        y = x_hat
        if cutlass.const_expr(w is not None):
            if cutlass.const_expr(self.features.weight_offset != 0.0):
                w = w + Float32(self.features.weight_offset)
            y = y * w
        if cutlass.const_expr(b is not None):
            y = y + b
        return y

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor | None,
        mB: cute.Tensor | None,
        mRes: cute.Tensor | None,
        mO: cute.Tensor,
        mResO: cute.Tensor | None,
        mRstd: cute.Tensor | None,
        eps: Float32,
        stream,
    ):
        t = self.tiling
        heads = mX.shape[1] if cutlass.const_expr(self.features.two_modes) else 1
        grid_x = cute.ceil_div(
            cute.ceil_div(mX.shape[0], t.rows_per_cta), self.config.blocks_per_cta
        )
        self.kernel(mX, mW, mB, mRes, mO, mResO, mRstd, eps).launch(
            grid=[grid_x, t.cluster_n, heads],
            block=[t.num_threads, 1, 1],
            cluster=[1, t.cluster_n, 1] if cutlass.const_expr(t.cluster_n > 1) else None,
            stream=stream,
            use_pdl=self.pdl,
        )

    @cute.kernel
    def kernel(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor | None,
        mB: cute.Tensor | None,
        mRes: cute.Tensor | None,
        mO: cute.Tensor,
        mResO: cute.Tensor | None,
        mRstd: cute.Tensor | None,
        eps: Float32,
    ):
        # mX, mRes, mO, mResO: (M, N) or (M, H, N); mW, mB: (N,) or (H, N); mRstd: (M,) or
        # (M, H). CTA (bidx, rank, head) owns columns rank*tile_cols.. of the row blocks
        # bidx * blocks_per_cta .. + blocks_per_cta - 1 of its head.
        t, cfg = self.tiling, self.config
        stages, nbuf = cfg.stages, cfg.buffers
        per_stage = t.vecs // stages
        clustered = cutlass.const_expr(t.cluster_n > 1)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, head = cute.arch.block_idx()
        rank = cute.arch.block_idx_in_cluster() if clustered else 0
        if cutlass.const_expr(self.features.two_modes):
            mX, mRes, mO, mResO = [
                m[None, head, None] if cutlass.const_expr(m is not None) else None
                for m in (mX, mRes, mO, mResO)
            ]
            mRstd = mRstd[None, head] if cutlass.const_expr(mRstd is not None) else None
        if cutlass.const_expr(self.features.per_head):
            mW, mB = [
                m[head, None] if cutlass.const_expr(m is not None) else None for m in (mW, mB)
            ]
        M = mX.shape[0]

        # -- shared memory: x (+ residual) x buffers, the weight and bias slices, the exchange
        smem = SmemAllocator()
        x_layout = cute.make_ordered_layout((*t.tiler, nbuf), order=(1, 0, 2))
        sX = smem.allocate_tensor(mX.element_type, x_layout, byte_alignment=16)
        sR = None
        if cutlass.const_expr(mRes is not None):
            sR = smem.allocate_tensor(mRes.element_type, x_layout, byte_alignment=16)
        # (rows_per_cta, tile_cols) with row stride 0: every row of the CTA reads one slice
        w_layout = cute.make_layout(t.tiler, stride=(0, 1))
        plan = self.weight_plan
        smem_w = cutlass.const_expr(plan.in_smem)
        late_w = cutlass.const_expr(plan is WeightPlan.SMEM_AFTER_X)
        sW = sB = None
        if cutlass.const_expr(mW is not None and smem_w):
            sW = smem.allocate_tensor(mW.element_type, w_layout, byte_alignment=16)
        if cutlass.const_expr(mB is not None and smem_w):
            sB = smem.allocate_tensor(mB.element_type, w_layout, byte_alignment=16)
        red, mbar_ptr = self.alternating_exchange_smem(smem)

        # -- this thread's place: its row in the CTA, its columns (the same for every block)
        copy_X = self.stage_copy(mX.element_type, True)
        thr_X = copy_X.get_slice(tidx)
        cX = cute.local_tile(cute.make_identity_tensor(mX.shape), t.tiler, (0, rank))
        tXcX = thr_X.partition_S(cX)  # ((vec, 1), 1, vecs) -> (row, col)
        row_in_cta = tXcX[0][0]
        first_col = tXcX[0][1]
        even = cutlass.const_expr(t.even_cols)

        if cutlass.const_expr(self.pdl):
            # launched with programmatic stream serialization: this grid may start while the
            # previous kernel on the stream finishes; wait for it before the first global access
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()

        # -- the weight and bias slices, once per CTA, in a commit group of their own: before
        # the first block's, or after it (``WeightPlan``)
        if cutlass.const_expr(plan is WeightPlan.SMEM and (mW is not None or mB is not None)):
            self.copy_slices(mW, mB, sW, sB, cX, rank, row_in_cta)

        seq = cfg.blocks_per_cta
        blk0 = bidx * seq
        n_iter = cutlass.min(seq, cute.ceil_div(M, t.rows_per_cta) - blk0)
        # rows this CTA may load: its own blocks' (the next CTA's belong to the next CTA)
        row_end = cutlass.min(M, (blk0 + n_iter) * t.rows_per_cta)
        self.issue_block(mX, mRes, sX, sR, blk0, 0, rank, row_end)
        if cutlass.const_expr(late_w):
            self.copy_slices(mW, mB, sW, sB, cX, rank, row_in_cta)
        if cutlass.const_expr(clustered):
            # every peer's mbarriers are initialised and armed. Waited for here, after the first
            # block's copies went out, not inside the loop (fwd_final_wait_in_loop.json)
            cute.arch.cluster_wait()

        # shared memory is read back through x's partition whatever the dtype, so that every
        # vector has x's shape ((vec, 1), 1): (rows, cols, buffers) -> ((vec, 1), 1, vecs, buffers)
        tXsX = thr_X.partition_D(sX)
        tRsR = thr_X.partition_D(sR) if cutlass.const_expr(mRes is not None) else None
        tWsW = thr_X.partition_D(sW) if cutlass.const_expr(sW is not None) else None
        tBsB = thr_X.partition_D(sB) if cutlass.const_expr(sB is not None) else None
        # or registers: once per CTA, or for every block before or after its sum
        once = cutlass.const_expr(plan is WeightPlan.REGS_ONCE)
        if cutlass.const_expr(once):
            held = self.load_weights(mW, mB, tXsX, cX, rank)
        copy_O = self.stage_copy(mO.element_type, False)
        thr_O = copy_O.get_slice(tidx)
        if cutlass.const_expr(mResO is not None):
            copy_RO = self.stage_copy(mResO.element_type, False)
            thr_RO = copy_RO.get_slice(tidx)

        # groups still in flight beyond this block's: the next block's, with two buffers
        ahead = stages if cutlass.const_expr(nbuf == 2) else 0
        trips = n_iter
        if cutlass.const_expr(self.row_blocks is not None and clustered and nbuf == 2):
            # lesson 06's exercise: a learner's loop over the row blocks (final_lesson.py; the
            # library's own loop, below, then runs no iteration)
            if cutlass.const_expr(mRes is not None or mResO is not None or late_w):
                raise NotImplementedError("row_blocks: no residual, no late weight slice")
            if cutlass.const_expr(not smem_w and not once and mW is not None):
                raise NotImplementedError("row_blocks: a weight in shared memory or held once")
            cta = CtaParts(tXsX, thr_X, cX, mW, mB, sW, sB, tWsW, tBsB, (None, None), mO, mRstd,
                           M, row_in_cta, first_col, rank)  # fmt: skip
            if cutlass.const_expr(once):
                cta.held = held
            issue = lambda blk, b: self.issue_block(mX, mRes, sX, sR, blk, b, rank, row_end)  # noqa: E731
            self.learner_loop(cta, n_iter, blk0, tidx, issue, ahead, red, mbar_ptr, eps)
            trips = 0
        for it in cutlass.range(trips, unroll=1):
            blk = blk0 + it
            buf = it % nbuf
            row = blk * t.rows_per_cta + row_in_cta
            if cutlass.const_expr(nbuf == 2):  # the next block goes out before this one lands
                self.issue_block(mX, mRes, sX, sR, blk + 1, 1 - buf, rank, row_end)
            tOgO = thr_O.partition_D(cute.local_tile(mO, t.tiler, (blk, rank)))
            if cutlass.const_expr(mResO is not None):
                tRgRO = thr_RO.partition_D(cute.local_tile(mResO, t.tiler, (blk, rank)))

            if cutlass.const_expr(once):
                rW, rB = held
            elif cutlass.const_expr(plan is WeightPlan.REGS_EACH_BLOCK):
                rW, rB = self.load_weights(mW, mB, tXsX, cX, rank)
            # first pass: sum of squares of (x + residual), part s as soon as it has landed
            sum_sq = Float32(0.0)
            for s in cutlass.range_constexpr(stages):
                if cutlass.const_expr(self.use_async):
                    pending = stages - 1 - s + ahead  # groups that may stay in flight
                    if cutlass.const_expr(late_w):
                        if it == 0:  # block 0: the slices' group, after x's, may be pending too
                            cute.arch.cp_async_wait_group(pending + 1)
                        else:
                            cute.arch.cp_async_wait_group(pending)
                    else:
                        cute.arch.cp_async_wait_group(pending)
                if cutlass.const_expr(
                    s == 0
                    and plan is WeightPlan.SMEM
                    and (sW is not None or sB is not None)
                    and (t.rows_per_cta > 1 or self.flat_slices)
                ):
                    if it == 0:  # the weight and bias slices landed (copied by other threads)
                        cute.arch.barrier()
                if row < M:
                    pred = self.col_pred(thr_X, cX)  # (1, 1, vecs); made here: see issue_block
                    # unrolled by the compiler, not while tracing (both passes): the same PTX,
                    # compiled faster; stage_in's docstring says why its copies are not
                    for v in cutlass.range(s * per_stage, (s + 1) * per_stage, 1, unroll_full=True):
                        if cutlass.const_expr(even) or pred[0, 0, v]:
                            xv = tXsX[None, None, v, buf].load().to(Float32)
                            if cutlass.const_expr(mRes is not None):
                                xv = xv + tRsR[None, None, v, buf].load().to(Float32)
                            if cutlass.const_expr(mResO is not None):
                                store_as(copy_RO, xv, tXsX[None, None, v, 0], tRgRO[None, None, v])
                            sum_sq += (xv * xv).reduce(
                                cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0
                            )

            # the row's sum: warp, then the cluster (or the CTA), buffer and barrier it % 2
            parity = it % 2
            buffer = red[None, None, parity]
            val = self.warp_reduce(sum_sq)
            if cutlass.const_expr(clustered):
                self.cluster_exchange(val, buffer, mbar_ptr + parity)
                cute.arch.mbarrier_wait(mbar_ptr + parity, phase=(it // 2) % 2)
                val = reduce_utils.combine_buffer(buffer, operator.add, t.threads_per_row)
                if tidx == 0 and it + 2 < n_iter:  # armed again for block it + 2
                    cute.arch.mbarrier_arrive_and_expect_tx(
                        mbar_ptr + parity, self.expected_tx_bytes()
                    )
            elif cutlass.const_expr(t.warps_per_row > 1):
                val = self.block_reduce(val, buffer)
            rstd = self.rstd(val, eps)
            if cutlass.const_expr(mRstd is not None):
                if first_col == 0 and row < M:
                    mRstd[row] = rstd

            if cutlass.const_expr(plan is WeightPlan.REGS_AFTER_SUM):
                rW, rB = self.load_weights(mW, mB, tXsX, cX, rank)
            if cutlass.const_expr(late_w):
                if it == 0:  # the slices landed (only the next block's groups may be pending)
                    cute.arch.cp_async_wait_group(ahead)
                    cute.arch.barrier()
            # second pass, from shared memory a vector at a time
            if row < M:
                pred = self.col_pred(thr_X, cX)
                for v in cutlass.range(t.vecs, unroll_full=True):
                    if cutlass.const_expr(even) or pred[0, 0, v]:
                        xv = tXsX[None, None, v, buf].load().to(Float32)
                        if cutlass.const_expr(mRes is not None):
                            xv = xv + tRsR[None, None, v, buf].load().to(Float32)
                        w = b = None
                        if cutlass.const_expr(mW is not None):
                            wv = tWsW[None, None, v] if smem_w else rW[None, None, v]
                            w = wv.load().to(Float32)
                        if cutlass.const_expr(mB is not None):
                            bv = tBsB[None, None, v] if smem_w else rB[None, None, v]
                            b = bv.load().to(Float32)
                        y = self.scale(xv * rstd, w, b)
                        store_as(copy_O, y, tXsX[None, None, v, 0], tOgO[None, None, v])
            if cutlass.const_expr(nbuf == 1):  # the next block, into the buffer just read
                if it + 1 < n_iter:
                    self.issue_block(mX, mRes, sX, sR, blk + 1, 0, rank, row_end)
        if cutlass.const_expr(clustered and cfg.exit_sync):
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()  # no CTA leaves while a peer may still address its smem


KERNEL = FinalRMSNorm


class CompiledFinal:
    """A compiled final kernel and what it was compiled for. ``full(...)`` takes every tensor
    (None where the feature is off); calling it as ``fn(x, w, out, eps)`` runs the plain
    forward, as every other stage's compiled kernel is called."""

    def __init__(self, kernel: FinalRMSNorm, compiled):
        self.kernel = kernel
        self.compiled = compiled
        self.call = direct_call(compiled)  # the same call, fewer Python layers

    # __ptx__, __cubin__, __mlir__ of the compiled kernel (a kernel loaded from the disk cache,
    # quack_edu.compile_cache, has none: compiles that want them bypass it)
    def __getattr__(self, name):
        return getattr(self.compiled, name)

    def full(self, x, w, b, res, out, res_out, rstd, eps):
        self.call(x, w, b, res, out, res_out, rstd, eps)

    def __call__(self, x, w, out, eps):
        self.full(x, w, None, None, out, None, None, eps)


# -- host side: the compile key from the tensors, a cache of compiled kernels ----------------------

_COMPILED: dict = {}

#: compiled kernels of classes other than the library's (a lesson's variant, a learner's
#: subclass: each attempt is a new class) a cache keeps; the library's are never evicted
MAX_OTHER_CLASSES = 64


def cache_put(cache: dict, key: tuple, value, library_cls: type):
    """``cache[key] = value``, where ``key[-1]`` is the kernel class (never None: the
    library's own is ``library_cls``): once ``MAX_OTHER_CLASSES`` entries of other classes are
    kept, the oldest of them is dropped first. Returns ``value``."""
    if key[-1] is not library_cls:
        others = [k for k in cache if k[-1] is not library_cls]
        if len(others) >= MAX_OTHER_CLASSES:
            cache.pop(others[0])
    cache[key] = value
    return value


def _vec_limit(t) -> int:
    """The widest access (elements) that tensor ``t``'s pointer and strides allow: accesses
    are min(16, vec * itemsize) bytes, so a tensor 16-byte aligned allows any vec."""
    if t is None:
        return 1 << 30
    esize = t.element_size()
    g = t.data_ptr()
    for dim in range(t.dim() - 1):
        g |= t.stride(dim) * esize
    g = g & -g if g else 1 << 30
    return 1 << 30 if g >= VECTOR_BYTES else max(1, g // esize)


def access_vec(N: int, dtype, tensors) -> int:
    """The ``vec`` a call runs with: the widest that N allows (``widest_vec``) and that every
    tensor's pointer and strides allow (``_vec_limit``; None: absent)."""
    vec = widest_vec(N, dtype)
    for t in tensors:
        vec = min(vec, _vec_limit(t))
    return vec


def compiled_for(
    dtype, N, weight_dtype, features: Features, vec: int, config=None, kernel_cls=None
) -> CompiledFinal:
    kernel_cls = kernel_cls or FinalRMSNorm
    key = (dtype, N, weight_dtype, features, vec, config, kernel_cls)
    fn = _COMPILED.get(key)
    if fn is None:
        from ..runtime import compile_kernel

        kernel = kernel_cls(dtype, N, config, weight_dtype, features=features, vec=vec)
        fn = cache_put(_COMPILED, key, compile_kernel(kernel), FinalRMSNorm)
    return fn


#: (dtypes, N, rank, flags, alignment, config, class) -> compiled kernel: the per-call path
_BY_CALL: dict = {}


def _dt(t):
    return None if t is None else t.dtype


def _misaligned(*tensors) -> int:
    """The low 4 bits of every tensor's address and row strides, in bytes, OR-ed: 0 when every
    access can be a full 16-byte vector (the common case, checked on every call)."""
    bits = 0
    for t in tensors:
        if t is not None:
            e = t.element_size()
            bits |= t.data_ptr()
            for d in range(t.dim() - 1):
                bits |= t.stride(d) * e
    return bits & (VECTOR_BYTES - 1)


def kernel_for(
    x, weight, bias, residual, out, residual_out, rstd, weight_offset=0.0, config=None,
    kernel_cls=None,
):  # fmt: skip
    """The compiled kernel ``launch_fwd`` runs for these tensors (compiled on first use). Host
    cost matters for short rows: it is found with one dictionary lookup on a tuple of cheap
    facts (dtypes, N, rank, features, 16-byte alignment)."""
    tensors = (x, weight, bias, residual, out, residual_out)
    per_head = (weight is not None and weight.dim() == 2) or (bias is not None and bias.dim() == 2)
    misaligned = _misaligned(*tensors)
    key = (
        x.dtype,
        x.shape[-1],
        x.dim(),
        _dt(weight),
        _dt(bias),
        _dt(residual),
        _dt(out),
        _dt(residual_out),
        rstd is not None,
        per_head,
        weight_offset,
        misaligned,
        config,
        kernel_cls or FinalRMSNorm,
    )
    fn = _BY_CALL.get(key)
    if fn is None:
        N = x.shape[-1]
        features = Features(
            weight=weight is not None,
            bias_dtype=_dt(bias),
            residual_dtype=_dt(residual),
            residual_out_dtype=_dt(residual_out),
            out_dtype=out.dtype if out.dtype != x.dtype else None,
            rstd=rstd is not None,
            per_head=per_head,
            weight_offset=float(weight_offset),
            head_rows=x.dim() == 3 and not per_head,
        )
        vec = access_vec(N, x.dtype, tensors)
        fn = compiled_for(x.dtype, N, _dt(weight), features, vec, config, kernel_cls)
        # the key's alignment bits stand for vec only while they are a 16-byte fact; a
        # narrower access is decided per tensor, so only the common case is cached by bits
        if not misaligned:
            cache_put(_BY_CALL, key, fn, FinalRMSNorm)
    return fn


#: ``launch_fwd(x, weight, bias, residual, out, residual_out, rstd, eps, weight_offset=0.0,
#: config=None)``: the library's kernel on these tensors (``FinalRMSNorm.launch``)
launch_fwd = FinalRMSNorm.launch


def rmsnorm_fwd(x, weight, eps: float = 1e-6, config: FinalConfig | None = None, out=None):
    """y = x / sqrt(mean(x**2) + eps) * weight with the final kernel: the stage's entry point,
    like every stage's (the library's ``quack_edu.rmsnorm.rmsnorm_fwd`` has every feature)."""
    return FinalRMSNorm.run(x, weight, eps, config, out)


__all__ = [
    "FinalRMSNorm",
    "FinalConfig",
    "Features",
    "KERNEL",
    "CONFIG",
    "MAX_N",
    "default_config",
    "configs",
    "launch_fwd",
    "kernel_for",
    "rmsnorm_fwd",
    "widest_vec",
]
