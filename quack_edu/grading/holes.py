"""The holes of the exercises: which piece of which stage kernel a learner's answer fills, and
how the answer is adapted to fill it (``checks.KernelHole``).

This is all the judge's worker, the process that runs learner code, needs to build the
learner's kernel around a stage, so it holds nothing a learner must not see: no reference
answer, no check, no mutant, no solution text. It imports no exercise module (they hold all of
those; ``tests/test_holes.py``). Each exercise module imports its holes from here under the
names its checks use (``from ..holes import WARP_KERNEL_HOLE as KERNEL_HOLE``).

A hole is a module-level name here: the judge finds a hole by the module and name that hold it.
One hole is no ``KernelHole``: 07.dw_partial fills two pieces from two functions of one cell
(``dw_partial_class``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .checks import KernelHole

#: lanes in a warp (``quack_edu.primitives.reduce.WARP``; not imported, which loads cutlass)
WARP = 32


def kernel_hole(stage: str, attrs: tuple = ()) -> KernelHole:
    """The learner's ``@cute.kernel`` function in place of the stage's ``kernel`` method."""
    return KernelHole(stage=stage, piece="kernel", adapt=lambda answer: answer, attrs=attrs)


class NotGiven(RuntimeError):
    """A whole-kernel answer called a method of the stage that its exercise does not give."""


def not_given(name: str, what: str) -> tuple:
    """The ``(name, method)`` attribute of a kernel hole that takes the stage's method ``name``
    out of the learner's reach: ``what`` it is, the part of the kernel the exercise asks for.
    Called while the kernel is traced, it fails the compile with that message (the hint:
    ``hints.NOT_GIVEN``). An answer that calls the library's method by its class's name reaches
    its tripwire instead (``Exercise.finished``)."""

    def method(self, *args, **kwargs):
        raise NotGiven(f"self.{name} is not given in this exercise: it is {what}")

    return (name, method)


# ---- 01_naive ----------------------------------------------------------------------------------
#: 01.sum_squares: the naive kernel's first pass, answer(mX, row, N)
SUM_HOLE = KernelHole(
    stage="naive",
    piece="sum_squares",
    adapt=lambda answer: lambda self, mX, row: answer(mX, row, self.N),
)

#: 01.rstd: the naive kernel's rstd, answer(sum_sq, eps, N)
RSTD_HOLE = KernelHole(
    stage="naive",
    piece="rstd",
    adapt=lambda answer: lambda self, sum_sq, eps: answer(sum_sq, eps, self.N),
)


# ---- 02_warp_reduction -------------------------------------------------------------------------
#: 02.warp_reduce: the warp kernel's butterfly, answer(val, width). The answer gets the width of
#: its row group: 32, or 8/16 when a warp holds rows of fewer than 32 vectors (the warp stage's
#: heuristic picks those for N <= 128 bf16)
REDUCE_HOLE = KernelHole(
    stage="warp",
    piece="warp_reduce",
    adapt=lambda answer: lambda self, val: answer(val, min(self.config.threads_per_row, WARP)),
)


def tiled_copy_of(answer, threads_per_row: int, num_threads: int, x_dtype, dtype):
    """The tiled copy the kernel builds around the learner's layouts: their (thr, val) layouts
    for a row of ``x_dtype``, and one copy atom of ``size(val)`` elements of ``dtype`` (at most
    128 bits; a wider weight dtype moves the same columns in several atoms)."""
    import cutlass.cute as cute

    thr, val = answer(threads_per_row, num_threads, x_dtype)
    bits = min(128, cute.size(val) * dtype.width)
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=bits)
    return cute.make_tiled_copy_tv(atom, thr, val)


def _adapt_copy(answer):
    def row_copy(self, dtype):
        cfg = self.config
        return tiled_copy_of(answer, cfg.threads_per_row, cfg.num_threads, self.dtype, dtype)

    return row_copy


#: 02.tv_layout: the warp kernel's row copy, built from answer(threads_per_row, num_threads,
#: dtype) -> (thread layout, value layout)
COPY_HOLE = KernelHole(stage="warp", piece="row_copy", adapt=_adapt_copy)

#: 02.warp_kernel: the warp stage's whole @cute.kernel, its reduction written with
#: ``self.warp_reduce`` (the stage's own kernel, pasted, calls ``row_sum`` and
#: ``reduction_buffer``, the hooks the later stages fill: a cold learner's paste scored 2/2)
WARP_KERNEL_HOLE = kernel_hole(
    "warp",
    (
        not_given("reduction_buffer", "the later stages' shared-memory buffer; a warp needs none"),
        not_given(
            "row_sum", "the stage's row reduction, which this kernel makes with self.warp_reduce"
        ),
    ),
)


# ---- 03_block_reduction ------------------------------------------------------------------------
#: 03.block_reduce: the block kernel's meeting of the warps of a row, answer(val, buffer)
BLOCK_HOLE = KernelHole(
    stage="block",
    piece="block_reduce",
    adapt=lambda answer: lambda self, val, buffer: answer(val, buffer),
)

#: 03.block_kernel: the block stage's whole @cute.kernel, written without the stage's own
#: buffer and row reduction (the warp stage's kernel calls both: pasted, it compiles to the
#: right PTX without the shared-memory step the exercise is about)
BLOCK_KERNEL_HOLE = kernel_hole(
    "block",
    (
        not_given(
            "reduction_buffer",
            "the block stage's own shared-memory buffer, which this kernel allocates itself",
        ),
        not_given(
            "row_sum",
            "the block stage's own row reduction, the two levels (warp, then block) this kernel "
            "makes itself",
        ),
    ),
)


# ---- 04_cluster_reduction ----------------------------------------------------------------------
#: The stage reduces seq_rows row blocks per CTA, each with the same exchange; the grader reads
#: and runs one block per CTA so that the PTX holds exactly one exchange and one arming.
ONE_BLOCK = (("seq_rows", 1),)

#: 04.cluster_exchange: the cluster kernel's DSMEM send, answer(val, buffer, mbar_ptr,
#: threads_per_row)
EXCHANGE_HOLE = KernelHole(
    stage="cluster",
    piece="cluster_exchange",
    adapt=lambda answer: (
        lambda self, val, buffer, mbar_ptr: answer(
            val, buffer, mbar_ptr, self.config.threads_per_row
        )
    ),
    attrs=ONE_BLOCK,
)

#: 04.expected_tx_bytes: the bytes the cluster kernel's mbarrier is armed with,
#: answer(rows_per_cta, warps_per_row, cluster_n)
EXPECT_HOLE = KernelHole(
    stage="cluster",
    piece="expected_tx_bytes",
    adapt=lambda answer: (
        lambda self: answer(
            self.tiling.rows_per_cta, self.tiling.warps_per_row, self.tiling.cluster_n
        )
    ),
    attrs=ONE_BLOCK,
)

#: 04.cluster_kernel: the cluster stage's whole @cute.kernel, one row block per CTA
CLUSTER_KERNEL_HOLE = kernel_hole("cluster", ONE_BLOCK)


# ---- 05_cp_async_pipelining --------------------------------------------------------------------
#: 05.g2s_atom: the cpasync kernel's global -> shared copy atom, answer(dtype)
ATOM_HOLE = KernelHole(
    stage="cpasync",
    piece="make_g2s_atom",
    adapt=lambda answer: lambda self: answer(self.dtype),
)

#: 05.wait_groups: the commit groups still in flight when part ``stage`` is read,
#: answer(stage, stages)
WAIT_HOLE = KernelHole(
    stage="cpasync",
    piece="wait_groups_pending",
    adapt=lambda answer: lambda self, stage: answer(stage, self.config.stages),
)

#: 05.pipeline: the cpasync kernel's first pass, answer(g2s, tXgX, tXsX, tXpX, in_row, stages,
#: after_issue)
PIPE_HOLE = KernelHole(
    stage="cpasync",
    piece="load_and_sum_sq",
    adapt=lambda answer: (
        lambda self, g2s, tXgX, tXsX, tXpX, in_row, after_issue: answer(
            g2s, tXgX, tXsX, tXpX, in_row, self.config.stages, after_issue
        )
    ),
)


# ---- 06_final_kernel ---------------------------------------------------------------------------
#: 06.persistent_kernel: the row blocks a CTA of its grid walks (the block stage's ``seq``, which
#: its host side divides the grid by)
BLOCKS_PER_CTA = 4


def _persistent_smem(self) -> int:
    """The shared memory 06.persistent_kernel's kernel allocates, for ptxsim's launch (a GPU
    launch takes the kernel's own allocations): the weight's slice and two reduction buffers,
    each 16-byte aligned, and room for their alignment."""
    t = self.tiling

    def r16(n: int) -> int:
        return -(-n // 16) * 16

    w = r16(t.tile_cols * self.weight_dtype.width // 8)
    return w + 2 * r16(t.reduction_buffer_bytes()) + 64


#: 06.persistent_kernel: the block stage's whole @cute.kernel, persistent: a CTA walks
#: BLOCKS_PER_CTA row blocks, its weight slice staged in shared memory once, two reduction
#: buffers used in turn; without the block stage's single buffer and row reduction
PERSISTENT_KERNEL_HOLE = kernel_hole(
    "block",
    (
        ("seq", BLOCKS_PER_CTA),
        ("smem_bytes", _persistent_smem),
        not_given(
            "reduction_buffer",
            "the block stage's single buffer: this kernel allocates its two buffers itself",
        ),
        not_given("row_sum", "the block stage's row reduction, through one buffer"),
    ),
)

#: the helpers in row_blocks's order, by the names the replay records their calls under
HELPER_KINDS = ("issue", "first", "send", "wait", "combine", "rearm", "second")
#: the helper calls of the latest compile of a learner's loop, in the order traced: (kind,
#: {argument index: value} of the arguments that were Python constants, not values of the kernel)
_TRACE: list[tuple[str, dict]] = []


def _recording(kind, helper):
    def call(*args):
        consts = {i: a for i, a in enumerate(args) if isinstance(a, int)}
        _TRACE.append((kind, consts))
        return helper(*args)

    return call


def _traced(answer):
    """The kernel's ``row_blocks``: the learner's loop, each helper call recorded while the
    kernel is traced (one pass over the loop's body, each branch of a runtime ``if`` once)."""

    def method(self, n_iter, blk0, tidx, *helpers):
        _TRACE.clear()
        rec = [_recording(k, h) for k, h in zip(HELPER_KINDS, helpers, strict=True)]
        return answer(n_iter, blk0, tidx, *rec)

    return method


#: 06.row_loop: the final kernel's loop over a CTA's row blocks, answer(n_iter, blk0, tidx,
#: issue, first, send, wait, combine, rearm, second), its helper calls recorded in ``_TRACE``
LOOP_HOLE = KernelHole(stage="final", piece="row_blocks", adapt=_traced)


# ---- 07_backward -------------------------------------------------------------------------------
#: 07.red_add: lesson 07's atomic backward (``final_bwd.FinalBwdAtomic``, strategy 1) with the
#: learner's ``red_add(r, dst)``: add the fp32 vector ``r`` (registers) into ``dst`` (the CTA's
#: columns of the one zeroed dw row, global memory). Its stage is the backward's: 07.dw_partial
#: draws its hidden row lengths for that stage through this hole too
RED_ADD_HOLE = KernelHole(
    stage="final_bwd",
    piece="red_add",
    adapt=lambda answer: lambda self, r, dst: answer(r, dst),
    variant="atomic",
)


def accumulate_dw_of(combine_partial):
    """07.dw_partial: the ``accumulate_dw`` defined beside the answer ``combine_partial`` in
    its cell (the function's globals, or its ``__wrapped__`` function's), or None."""
    acc_fn = getattr(combine_partial, "__globals__", {}).get("accumulate_dw")
    if acc_fn is None:
        acc_fn = getattr(getattr(combine_partial, "__wrapped__", None), "__globals__", {}).get(
            "accumulate_dw"
        )
    return acc_fn


def dw_partial_class(accumulate_dw, combine_partial):
    """07.dw_partial: the backward kernel class with the learner's two functions as its
    ``accumulate_dw`` and ``combine_partial`` methods. Not a ``KernelHole``, which fills one
    piece with one answer: this hole is two pieces, from two functions of one cell."""
    from ..stages.final_bwd import FinalBwdRMSNorm

    methods = {
        "__module__": __name__,
        "accumulate_dw": lambda self, acc, v, dy, x_hat: accumulate_dw(acc, v, dy, x_hat),
        "combine_partial": (
            lambda self, acc, mine, slots, write, in_cols, row, rows: combine_partial(
                acc, mine, slots, write, in_cols, row, rows, self.drain_copies
            )
        ),
    }
    return type("LearnerDwPartials", (FinalBwdRMSNorm,), methods)


# ---- 08_speed_of_light -------------------------------------------------------------------------
#: the name of 08.pdl_kernel's launch flag, a function beside the kernel in its cell
PDL_FLAG = "use_pdl"


def launch_flag_of(kernel_fn) -> bool:
    """08.pdl_kernel: what ``use_pdl()``, defined beside the answer ``kernel_fn`` in its cell
    (the function's globals, or its ``__wrapped__`` function's), returns; False where there is
    none."""
    for fn in (kernel_fn, getattr(kernel_fn, "__wrapped__", None)):
        g = getattr(fn, "__globals__", None)
        if g is not None and callable(g.get(PDL_FLAG)):
            return g[PDL_FLAG]() is True
    return False


@dataclass(frozen=True)
class LaunchFlagHole(KernelHole):
    """A kernel hole whose class also takes the cell's launch flag (``launch_flag_of``) as its
    ``pdl``, which its host side passes to ``launch(use_pdl=...)``."""

    def build(self, answer):
        cls = super().build(answer)
        cls.pdl = launch_flag_of(answer)
        return cls


#: 08.pdl_kernel: the block stage's whole @cute.kernel, handed to the learner, with the
#: griddepcontrol instructions added; launched by ``block.BlockPdl`` with the cell's flag
PDL_KERNEL_HOLE = LaunchFlagHole(stage="block", piece="kernel", adapt=lambda a: a, variant="pdl")
