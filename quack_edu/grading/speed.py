"""A speed check's measurement: the learner's kernel and the copy bandwidth timed together,
alone on the GPU (``gpu_lock``), again when it fails.

Speed is judged against the copy bandwidth measured at that moment on that machine (never a
fixed number); grading several submissions at once on one GPU must give the scores one at a
time gives, so every measurement holds the GPU's timing lock, and a failing one is taken again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from . import gpu_lock
from .registry import CheckFailed

#: eps of every kernel a check launches
EPS = 1e-6


def launch_time_us(launch, x, w, out, eps: float) -> float:
    """Microseconds a call of ``launch(x, w, out, eps)`` (a context's ``launcher``) takes, timed
    alone on the GPU (``gpu_lock``): where the answer lives in the grader's worker
    (``judge.RemoteLauncher``), the worker times it on inputs of x's shape and dtype while this
    process holds the lock (shipping the tensors every call would time the pipe)."""
    from ..tools.bench import cuda_time_us

    with gpu_lock.timing():
        if hasattr(launch, "time_us"):
            return launch.time_us(x.shape[0], eps)
        return cuda_time_us(lambda: launch(x, w, out, eps))


#: measurements a speed check takes before it fails (one that passes is enough): a kernel of
#: another process on the GPU, which the lock does not keep away, costs one measurement only
SPEED_MEASUREMENTS = 3
#: seconds between two measurements of a speed check
SPEED_PAUSE_S = 0.5


def _vs_copy(nbytes: int, us: float, copy: float, fraction: float, at: str) -> str:
    from ..tools.bench import gbps

    got = gbps(nbytes, us)
    if got < fraction * copy:
        raise CheckFailed(
            f"{got:.0f} GB/s at {at} = {100 * got / copy:.0f}% of the copy "
            f"bandwidth measured now ({copy:.0f} GB/s)",
            expected=f">= {100 * fraction:.0f}% ({fraction * copy:.0f} GB/s)",
            seen=f"{got:.0f} GB/s ({us:.1f} us)",
        )
    return f"{got:.0f} GB/s = {100 * got / copy:.0f}% of copy ({copy:.0f} GB/s)"


def speed_vs_copy(nbytes: int, us: float, fraction: float, at: str) -> str:
    """GB/s of ``nbytes`` moved in ``us`` against ``fraction`` of the copy bandwidth measured
    now, alone on the GPU (``gpu_lock``): below it the check fails. ``at``: the shape it ran,
    "32768x4096 bf16". ``speed_alone`` times the kernel and the copy under one hold, again
    when it fails."""
    from ..tools.bench import copy_bandwidth

    with gpu_lock.timing():
        copy = copy_bandwidth()
    return _vs_copy(nbytes, us, copy, fraction, at)


def speed_alone(time_us: Callable[[], float], nbytes: int, fraction: float, at: str) -> str:
    """``speed_vs_copy`` of the microseconds ``time_us()`` measures, the kernel and the copy
    timed together while this process holds the GPU's timing lock (``gpu_lock``; compile before:
    the lock is held while timing only). A measurement below ``fraction`` is taken again, up to
    ``SPEED_MEASUREMENTS`` in all; one that passes is enough, and a failure reports the best."""
    from ..tools.bench import copy_bandwidth

    fails = []
    for i in range(SPEED_MEASUREMENTS):
        if i:
            time.sleep(SPEED_PAUSE_S)
        with gpu_lock.timing() as alone:
            us, copy = time_us(), copy_bandwidth()
        try:
            return _vs_copy(nbytes, us, copy, fraction, at)
        except CheckFailed as e:
            fails.append((us * copy, alone, e))  # the least us * copy: the most of the copy's
    _, alone, e = min(fails, key=lambda f: f[0])
    how = "each alone on the GPU" if all(f[1] for f in fails) else "not all alone on the GPU"
    msg = f"{e.message}; the best of {SPEED_MEASUREMENTS} measurements, {how}"
    raise CheckFailed(msg, expected=e.expected, seen=e.seen, hint=e.hint)


def launch_speed(launch, x, w, out, fraction: float, at: str) -> str:
    """``speed_alone`` of a context's ``launcher`` on (x, w, out), eps = ``EPS``. A kernel in
    the grader's worker is launched on one row first, outside the lock: the worker compiles it
    at its first launch."""
    from ..tools.bench import rmsnorm_bytes

    if hasattr(launch, "time_us"):
        launch(x[:1], w, out[:1], EPS)
    nbytes = rmsnorm_bytes(x.shape[0], x.shape[1], x.dtype, w.dtype)
    return speed_alone(lambda: launch_time_us(launch, x, w, out, EPS), nbytes, fraction, at)
