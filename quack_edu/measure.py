"""Timing on the GPU, the way every number in the lessons and the grader is taken.

``cuda_time_us`` times a callable with CUDA events and reports the median; ``copy_gbps``
measures the device-to-device copy bandwidth *now*, the ceiling a memory-bound kernel is judged
against (the datasheet's 4.8 TB/s for the H200 is not reachable; a D2D copy reached 4.27 TB/s
on 2026-11-29). Buffers are far larger than the 60 MB L2 so the cache does not flatter.
"""

from __future__ import annotations

import statistics

import torch


def cuda_time_us(fn, *, warmup: int = 3, reps: int = 20) -> float:
    """Median time of ``fn()`` in microseconds, measured with CUDA events around each call."""
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_time_us needs a CUDA GPU")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def copy_gbps(nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth now, in GB/s (10^9 B/s), counting read + write bytes."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = cuda_time_us(lambda: dst.copy_(src), reps=reps)
    return 2 * nbytes / (us * 1e-6) / 1e9


def gbps(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e9
