"""Stage 0, naive: one thread per row, scalar loads, two passes over the row.

The starting point of the ladder. Thread ``i`` of the grid owns row ``i``: it walks the row once
to sum the squares (in fp32), takes the reciprocal of the root mean square (``rstd``), then
walks it again to write ``x * rstd * w``. It is correct for any M and any N, and it is slow on
purpose:

* Uncoalesced. In one load instruction the 32 threads of a warp touch 32 different rows, N
  elements apart: 32 memory sectors for 64 useful bytes (bf16). The L1 cache rescues part of it
  (the next 15 columns sit in the same 32-byte sectors), but only while those lines survive.
* Too little parallelism. M rows give M threads: at M=4096 that is 128 warps, about one per SM
  of a 132-SM GPU whose memory system needs tens of thousands of loads in flight.
* Scalar 2-byte accesses, and x read twice.

Bytes it must move, lesson 00's count (``bench.rmsnorm_bytes``): 2 * M * N * sizeof(dtype) +
N * sizeof(weight dtype) (read x, write y, read the weight once; the weight is small beside the
rows, but it is read). The next stage (warp) keeps that byte count and fixes how the bytes are
moved.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from ..config import NaiveConfig, naive_config
from ..runtime import LaunchShape, RMSNormKernel, run_forward

default_config = naive_config
CONFIG = NaiveConfig


def configs(N: int, dtype=None) -> list[NaiveConfig]:
    """Every config worth forcing (tests and autotuning loop over these)."""
    return [NaiveConfig(64), NaiveConfig(128), NaiveConfig(256)]


class NaiveRMSNorm(RMSNormKernel):
    name = "naive"
    vector_bytes = 0  # scalar accesses: any N, any alignment

    def launch_shape(self, M: int) -> LaunchShape:
        t = self.config.threads_per_block
        return LaunchShape(grid=((M + t - 1) // t, 1, 1), block=(t, 1, 1))

    @cute.jit
    def sum_squares(self, mX: cute.Tensor, row) -> Float32:
        """Sum of x[row, j]**2 over the row, in fp32. A piece of the kernel a lesson lets you
        rewrite (a device function with a loop: it needs @cute.jit)."""
        sum_sq = Float32(0.0)
        for j in cutlass.range(self.N, unroll=4):
            v = mX[row, j].to(Float32)
            sum_sq += v * v
        return sum_sq

    def rstd(self, sum_sq: Float32, eps: Float32) -> Float32:
        """1 / sqrt(mean of squares + eps). A piece of the kernel a lesson lets you rewrite."""
        return cute.math.rsqrt(sum_sq / self.N + eps)

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, eps: Float32, stream):
        t = self.config.threads_per_block
        self.kernel(mX, mW, mO, eps).launch(
            grid=[cute.ceil_div(mX.shape[0], t), 1, 1], block=[t, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, eps: Float32):
        # mX, mO: (M, N) in global memory; mW: (N,)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        row = bidx * self.config.threads_per_block + tidx
        if row < mX.shape[0]:
            sum_sq = self.sum_squares(mX, row)
            rstd = self.rstd(sum_sq, eps)
            for j in cutlass.range(self.N, unroll=4):
                y = mX[row, j].to(Float32) * rstd * mW[j].to(Float32)
                mO[row, j] = y.to(mO.element_type)


KERNEL = NaiveRMSNorm


def rmsnorm_fwd(x, weight, eps: float = 1e-6, config: NaiveConfig | None = None, out=None):
    """y = x / sqrt(mean(x**2) + eps) * weight, one thread per row. x: (M, N) on a Hopper GPU."""
    return run_forward(NaiveRMSNorm, x, weight, eps, config or NaiveConfig(), out=out)
