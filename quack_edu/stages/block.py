"""Stage 2, block: several warps per row, meeting through shared memory.

Delta over warp: a row is spread over ``threads_per_row`` = 64..512 threads (2..16 warps) of
one CTA instead of one warp. Each warp reduces its lanes with shuffles as before; then lane 0
of every warp writes the warp's partial into a small shared-memory buffer (one fp32 per warp),
one ``bar.sync`` makes them visible, and every warp re-reduces its row's slots itself
(log2(warps_per_row) more shuffles, no second barrier). That second level costs one
shared-memory store, one barrier and one load, a few hundred nanoseconds, once per row.

Why it is faster for wide rows: the warp stage caps a lane at 16 vectors, so past N = 4096
bf16 it re-reads x. Here the heuristic gives every thread 8 vectors (64..512 threads per
row), so up to 512 x 8 x 8 = 32768 bf16 (16384 fp32) columns the row is read once and kept
in registers between the sum and the scaling pass: the kernel moves the minimum,
2 x M x N x sizeof(dtype) bytes. At N = 4K-16K bf16 (LLM hidden sizes) a thread issues 8
independent LDG.128 for x up front and 8 for the weight right behind them, so the weight is
in flight while the reduction runs. At ~120 registers per thread four 128-thread CTAs (two
256-thread ones) share an SM: 4 x 128 x 8 x 16 B = 64 KiB of loads in flight per SM, several
times the ~11 KiB per SM that Little's law asks for at the copy's 4.22 TB/s and an idle load's
340 ns (``roofline.littles_law``: ladder.json, latency.json; under full traffic a load waits
longer). Expected on the H200: > 80% of the device-to-device copy bandwidth at N = 4K-16K bf16.

Constraints: as the warp stage (N a multiple of the 16-byte vector, any M), plus
threads_per_row >= 64 (a multiple of 32: whole warps). Past 32768 bf16 (16384 fp32) columns
it walks the row in chunks and re-reads x, like the warp stage; the cluster stage removes that.
"""

from __future__ import annotations

import operator

import cutlass.cute as cute
from cutlass import Float32
from cutlass.memory import SmemAllocator

from ..config import RowConfig, block_config
from ..primitives import reduce as reduce_utils
from ..runtime import default_config_for, run_forward
from .warp import WarpRMSNorm

CONFIG = RowConfig
default_config = block_config


def configs(N: int, dtype) -> list[RowConfig]:
    """The heuristic's pick, every threads_per_row it can pick (64, 128, 256), two rows per CTA,
    and 512 threads per row with 8 vectors per thread (512 threads leave 128 registers each)."""
    out = [default_config(N, dtype)]
    out += [RowConfig(threads_per_row=t, num_threads=max(128, t)) for t in (64, 128, 256)]
    out.append(RowConfig(threads_per_row=128, num_threads=256))
    out.append(RowConfig(threads_per_row=512, num_threads=512, max_vecs=8))
    return list(dict.fromkeys(out))


class BlockRMSNorm(WarpRMSNorm):
    name = "block"
    heuristic = staticmethod(block_config)

    def check_config(self):
        self.check_common()
        cfg = self.config
        if cfg.threads_per_row < 64:
            self.fail(
                "threads_per_row must be >= 64 (two warps or more per row); with one warp "
                "per row there is nothing to meet in shared memory: use the 'warp' stage"
            )
        self.check_one_cta_no_stages()

    def smem_bytes(self) -> int:
        return self.tiling.reduction_buffer_bytes()

    # -- the piece a lesson lets a learner rewrite ---------------------------------------------
    def block_reduce(self, val: Float32, buffer: cute.Tensor) -> Float32:
        """Combine the warps of a row: ``val`` is the warp's total, ``buffer`` is
        (rows_per_cta, warps_per_row) fp32 in shared memory. Returns the row's total."""
        return reduce_utils.block_reduce(val, operator.add, buffer)

    # -- two levels instead of one --------------------------------------------------------------
    def reduction_buffer(self):
        t = self.tiling
        layout = cute.make_ordered_layout((t.rows_per_cta, t.warps_per_row), order=(1, 0))
        return SmemAllocator().allocate_tensor(Float32, layout, byte_alignment=16)

    def row_sum(self, val: Float32, buffer) -> Float32:
        return self.block_reduce(self.warp_reduce(val), buffer)


class BlockPdl(BlockRMSNorm):
    """Lesson 08's exercise: the block kernel launched with programmatic dependent launch when
    ``pdl`` is set (``use_pdl``, as the final stage launches), so its griddepcontrol
    instructions take effect; the library's block stage launches without it."""

    pdl = False

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, eps: Float32, stream):
        t = self.tiling
        self.kernel(mX, mW, mO, eps).launch(
            grid=[cute.ceil_div(mX.shape[0], t.rows_per_cta * self.seq), 1, 1],
            block=[t.num_threads, 1, 1],
            stream=stream,
            use_pdl=self.pdl,
        )


KERNEL = BlockRMSNorm
#: lessons' variants of the kernel (``KernelHole.variant``)
VARIANTS = {"pdl": BlockPdl}


def rmsnorm_fwd(x, weight, eps: float = 1e-6, config: RowConfig | None = None, out=None):
    """y = x / sqrt(mean(x**2) + eps) * weight, 2-8 warps per row. x: (M, N) on a Hopper GPU."""
    config = config or default_config_for(x, default_config)
    return run_forward(BlockRMSNorm, x, weight, eps, config, out=out)
