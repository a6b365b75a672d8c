"""Lesson 09, in a model: two host-side exercises (compile tier: they run anywhere).

09.call_us       call_us(M, N, dtype, weight_dtype, host_us, gbps): microseconds per norm call
                 in a long chain of them, where the host spends ``host_us`` issuing each call
                 and the GPU moves the call's fewest bytes (``bench.rmsnorm_bytes``) at ``gbps``
                 GB/s. The host issues the next call while the GPU runs this one, so the slower
                 of the two sets the pace: ``max(host_us, gpu_us)``.
09.step_speedup  step_speedup(norm_share, norm_speedup): how many times faster a step runs when
                 its norms, ``norm_share`` of its time, run ``norm_speedup`` times faster
                 (Amdahl's law; ``float("inf")``: norms that take no time at all).

The checks compare with the references on cases where each slip shows (host-bound decode
calls and GPU-bound long ones; shares from 1% to 60%, norms slower, unchanged, faster and
free); a known slip (the two times added, the host or the GPU forgotten, milliseconds, the weight
left out, GiB for GB; the new time for the speed-up, the norms' old time kept, the speed-up
weighted by the share, norm_speedup ignored) gives its hint.
"""

from __future__ import annotations

import math

import torch

from ..checks import Context, numbers_close, value_check
from ..hints import Variant
from ..registry import COMPILE, Exercise, mutants, register

LESSON = "09_in_a_model"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _size(dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


# ---- 09.call_us -------------------------------------------------------------------------------
def gpu_us(M, N, dtype, weight_dtype, gbps) -> float:
    """A call's fewest bytes at ``gbps`` GB/s, in microseconds."""
    from ...tools.bench import rmsnorm_bytes  # the byte count every GB/s in the project uses

    return rmsnorm_bytes(M, N, dtype, weight_dtype) / (gbps * 1e9) * 1e6


# BEGIN KEY
def call_us_ref(M, N, dtype, weight_dtype, host_us, gbps):
    return max(host_us, gpu_us(M, N, dtype, weight_dtype, gbps))


# END KEY


def _call_cases(ctx: Context, hidden: bool):
    """Host-bound decode calls, GPU-bound long calls and one near the crossing, every dtype; the
    hidden check draws ten with the grading seed (half of them GPU-bound)."""
    rng = ctx.rng("hidden calls" if hidden else "calls")
    drawn = []
    for i in range(10 if hidden else 4):
        M = rng.randint(1, 64) if i % 2 else rng.randint(20000, 70000)
        drawn.append(
            (
                M,
                rng.choice((1024, 2048, 4096, 8192, 16384)),
                rng.choice(DTYPES),
                rng.choice(DTYPES),
                rng.uniform(3.0, 100.0),
                rng.uniform(2000.0, 4800.0),
            )
        )
    if hidden:
        return drawn
    bf16, fp32 = torch.bfloat16, torch.float32
    return [
        (1, 2048, bf16, fp32, 20.9, 4253.0),  # a decode row, eager: host-bound
        (8, 4096, bf16, fp32, 5.0, 4253.0),  # decode, compiled
        (4096, 2048, bf16, fp32, 5.0, 4253.0),  # a prefill: the GPU's time
        (32768, 16384, bf16, bf16, 20.9, 4253.0),  # a long call: the GPU's time
        (1300, 4096, fp32, fp32, 10.0, 4000.0),  # near the crossing, fp32
        (5000, 4096, torch.float16, bf16, 20.0, 4200.0),
        # a fraction of a microsecond a kernel: a CUDA graph's replay, long calls
        (32768, 16384, bf16, bf16, 0.2, 4253.0),
        (65536, 16384, fp32, fp32, 0.3, 3000.0),
    ] + drawn


# BEGIN KEY
_CALL_VARIANTS = [
    Variant(
        "sum",
        lambda M, N, d, w, h, g: h + gpu_us(M, N, d, w, g),
        "the host issues the next call while the GPU runs this one: the two overlap, so the "
        "slower of them sets the pace (the larger time), not their sum",
    ),
    Variant(
        "min",
        lambda M, N, d, w, h, g: min(h, gpu_us(M, N, d, w, g)),
        "the slower of the host and the GPU sets the pace: take the larger time, not the smaller",
    ),
    Variant(
        "GPU only",
        lambda M, N, d, w, h, g: gpu_us(M, N, d, w, g),
        "a call is not over before the host has issued it: with a few rows the GPU is done "
        "long before the host's host_us, so count the host's time too (the larger of the two)",
    ),
    Variant(
        "host only",
        lambda M, N, d, w, h, g: h,
        "with many rows the GPU's time (the call's bytes at gbps) is longer than the host's: "
        "count it too (the larger of the two)",
    ),
    Variant(
        "milliseconds",
        lambda M, N, d, w, h, g: max(h, gpu_us(M, N, d, w, g) / 1e3),
        "the GPU's time must be in microseconds too, as host_us is: bytes / (gbps * 1e9) "
        "seconds, times 1e6",
    ),
    Variant(
        "weight in x's size",
        lambda M, N, d, w, h, g: max(h, gpu_us(M, N, d, d, g)),
        "the weight has a dtype of its own (an fp32 weight next to bf16 x is 4 bytes an "
        "element): count its N elements in weight_dtype's size",
    ),
    Variant(
        "reads only",
        lambda M, N, d, w, h, g: max(h, gpu_us(M, N, d, w, g) - M * N * _size(d) / g * 1e-3),
        "a call writes y as well as reading x: M x N elements each, both in dtype",
    ),
    Variant(
        "no weight",
        lambda M, N, d, w, h, g: max(h, gpu_us(M, N, d, w, g) - N * _size(w) / g * 1e-3),
        "a call reads the weight too, N elements in weight_dtype: few bytes beside a long "
        "call's rows, but they are among its fewest bytes (lesson 00's count)",
    ),
    Variant(
        "GiB",
        lambda M, N, d, w, h, g: max(h, gpu_us(M, N, d, w, g) * 1e9 / 2**30),
        "gbps counts GB of 1e9 bytes a second, as the exercise says, not GiB of 2**30: the "
        "GPU's time comes out 7% short",
    ),
]

# fmt: off
CALL_US_MUTANTS = mutants(COMPILE,
    ("adds the two", "overlap", "max(host_us, gpu_us)", "host_us + gpu_us"),
    ("smaller of the two", "not the smaller", "max(host_us, gpu_us)", "min(host_us, gpu_us)"),
    ("forgets the host", "count the host's time", "max(host_us, gpu_us)", "gpu_us"),
    ("forgets the GPU", "GPU's time (the call's bytes", "max(host_us, gpu_us)", "host_us"),
    ("milliseconds", "microseconds", "* 1e6", "* 1e3"),
    ("forgets the weight", "reads the weight too", " + N * ws", ""),
    ("GB as 2**30 bytes", "not GiB of 2**30", "gbps * 1e9", "gbps * 2**30"),
)
# fmt: on
# END KEY

call = register(
    Exercise(
        id="09.call_us",
        # the library's byte counts give its GPU term (red team 20 called one by a string)
        finished=(
            "quack_edu.tools.timing.rmsnorm_bytes",
            "quack_edu.tools.timing.rmsnorm_bwd_bytes",
            "quack_edu.lessons.roofline.traffic",  # it measures a sequence (red team 21)
        ),
        lesson=LESSON,
        answer="call_us",
        title="a norm call's time in a chain, host and GPU: call_us(M, N, dtype, weight_dtype, "
        "host_us, gbps)",
        points={COMPILE: 1},
        mutants=CALL_US_MUTANTS,
    )
)
call.add(
    value_check(
        "host-bound and GPU-bound calls, every dtype",
        call_us_ref,
        _call_cases,
        variants=_CALL_VARIANTS,
        close=numbers_close(),
    )
)
# BEGIN HIDDEN
call.add(
    value_check(
        "random calls (grading seed)",
        call_us_ref,
        _call_cases,
        variants=_CALL_VARIANTS,
        close=numbers_close(),
        hidden=True,
    )
)
# END HIDDEN


# ---- 09.step_speedup --------------------------------------------------------------------------
# BEGIN KEY
def step_speedup_ref(norm_share, norm_speedup):
    return 1.0 / ((1.0 - norm_share) + norm_share / norm_speedup)


# END KEY


def _speedup_cases(ctx: Context, hidden: bool):
    """Shares from 1% to 60%; norms slower, unchanged, faster and free; the hidden check draws
    ten with the grading seed."""
    rng = ctx.rng("hidden speedups" if hidden else "speedups")
    drawn = [
        (rng.uniform(0.005, 0.6), rng.choice((rng.uniform(0.5, 20.0), math.inf)))
        for _ in range(10 if hidden else 3)
    ]
    if hidden:
        return drawn
    inf = math.inf
    return [
        (0.053, inf),  # a compiled training step's norms, made free
        (0.114, inf),  # a compiled prefill's
        (0.029, 1.5),
        (0.25, 2.0),
        (0.6, 10.0),
        (0.1, 1.0),  # the same norms: no change
        (0.137, 0.8),  # slower norms: a step slower than 1.0
    ] + drawn


def _time(s, k):
    return (1.0 - s) + s / k


# BEGIN KEY
_SPEEDUP_VARIANTS = [
    Variant(
        "new time",
        _time,
        "that is the new step's time as a share of the old one, not a speed-up: a speed-up "
        "says how many times faster the new step runs than the old",
    ),
    Variant(
        "no rest",
        lambda s, k: k / s,
        "the rest of the step (1 - norm_share of it) still takes its time: the new step is "
        "the rest plus the norms' new time",
    ),
    Variant(
        "norms counted twice",
        lambda s, k: 1.0 / (1.0 + s / k),
        "the rest of the step is 1 - norm_share of the old step, not all of it: the norms' "
        "new time replaces their old time, norm_share",
    ),
    Variant(
        "whole step",
        lambda s, k: k,
        "only the norms run faster, norm_share of the step: the rest of the step takes as "
        "long as before (Amdahl's law)",
    ),
    Variant(
        "saved plus one",
        lambda s, k: 1.0 + s - s / k,
        "that is 1 + the time saved, as a share of the old step; a speed-up is a ratio of "
        "the two steps' times, not a sum (the two agree only when little is saved)",
    ),
    Variant(
        "slower norms clamped",
        lambda s, k: 1.0 if k < 1 else step_speedup_ref(s, k),
        "norms slower than before (norm_speedup below 1) make the step slower too: the same "
        "arithmetic holds for any norm_speedup, and the step's speed-up comes out below 1",
    ),
    Variant(
        "norms times speed-up",
        lambda s, k: 1.0 / ((1.0 - s) + s * k),
        "norms norm_speedup times faster take norm_share / norm_speedup of the old step, not "
        "norm_share * norm_speedup",
    ),
    Variant(
        "speed-ups weighted",
        lambda s, k: 1.0 + s * (k - 1.0),
        "that weighs the norms' speed-up by their share, as if speed-ups added up: they do not "
        "(free norms would make any step infinitely fast). Times add up: find the new step's "
        "time as a share of the old one, then the ratio of the two times",
    ),
    Variant(
        "free norms",
        lambda s, k: 1.0 / (1.0 - s),
        "that is the step with norms that take no time at all, whatever norm_speedup says: "
        "norms norm_speedup times faster still take part of their old time",
    ),
]

# fmt: off
STEP_SPEEDUP_MUTANTS = mutants(COMPILE,
    ("the new time", "not a speed-up: a speed-up",
     "return 1.0 / (rest + norms)", "return rest + norms"),
    ("the norms counted twice", "rest of the step", "rest = 1.0 - norm_share", "rest = 1.0"),
    ("the whole step", "only the norms run faster",
     "return 1.0 / (rest + norms)", "return norm_speedup"),
    ("1 + the time saved", "1 + the time saved",
     "return 1.0 / (rest + norms)", "return 1.0 + norm_share - norms"),
    ("slower norms clamped to no change", "make the step slower too",
     "return 1.0 / (rest + norms)", "return max(1.0, 1.0 / (rest + norms))"),
    ("speed-ups weighted by the share", "as if speed-ups added up",
     "return 1.0 / (rest + norms)", "return 1.0 + norm_share * (norm_speedup - 1)"),
    ("norm_speedup ignored: free norms", "whatever norm_speedup says",
     "norms = norm_share / norm_speedup", "norms = 0.0"),
)
# fmt: on
# END KEY

speedup = register(
    Exercise(
        id="09.step_speedup",
        lesson=LESSON,
        answer="step_speedup",
        title="what faster norms can give a step (Amdahl): step_speedup(norm_share, norm_speedup)",
        points={COMPILE: 1},
        mutants=STEP_SPEEDUP_MUTANTS,
    )
)
speedup.add(
    value_check(
        "shares 1-60%, norms slower, unchanged, faster and free",
        step_speedup_ref,
        _speedup_cases,
        variants=_SPEEDUP_VARIANTS,
        close=numbers_close(),
    )
)
# BEGIN HIDDEN
speedup.add(
    value_check(
        "random cases (grading seed)",
        step_speedup_ref,
        _speedup_cases,
        variants=_SPEEDUP_VARIANTS,
        close=numbers_close(),
        hidden=True,
    )
)
# END HIDDEN
