"""Lesson 08, speed of light: predict a pass's time from its bytes and the measured ceiling.

08.predict_us  predict_us(M, N, dtype, weight_dtype, copy_gbps, pass_): the time in µs of an
               RMSNorm forward ("fwd") or backward ("bwd") that moves its fewest bytes at the
               copy's speed: the forward reads x, writes y and reads the weight; the backward
               reads x and dout, writes dx, reads the weight and the saved rstd (fp32, one a
               row). The project's own counts are ``bench.rmsnorm_bytes`` and
               ``bench.rmsnorm_bwd_bytes`` (QuACK's for the backward).

The compile tier compares the answer with those counts on shapes where every term shows (M =
1 makes the weight a third of the bytes; N = 1 makes rstd most of them), every x dtype and
weight dtype; a known slip (a tensor forgotten, x's size for the weight, GiB for GB,
milliseconds) gives its hint. The gpu tier measures the copy now and times the library's
forward and backward at 32768 x 16384 (bf16 x, an fp32 weight): the prediction must be within
10% of each (the library runs at 97-101% of the copy there, ``benchmarks/results/ladder.json``).
"""

from __future__ import annotations

import torch

from .. import gpu_lock
from ..checks import Context, value_check
from ..hints import Variant
from ..registry import COMPILE, GPU, TIERS, CheckFailed, Exercise, mutants, register

LESSON = "08_speed_of_light"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: how far the library's measured time may be from the prediction (gpu tier)
GPU_TOLERANCE = 0.10


def _size(dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


# BEGIN KEY
def predict_ref(M, N, dtype, weight_dtype, copy_gbps, pass_="fwd"):
    from ...tools.bench import rmsnorm_bwd_bytes, rmsnorm_bytes

    count = rmsnorm_bytes if pass_ == "fwd" else rmsnorm_bwd_bytes
    return count(M, N, dtype, weight_dtype) / (copy_gbps * 1e9) * 1e6


# END KEY


def _cases(ctx: Context, hidden: bool):
    """Shapes where each term shows, both passes, every dtype pair; the hidden check draws
    twelve with the grading seed."""
    rng = ctx.rng("hidden cases" if hidden else "cases")
    drawn = [
        (
            rng.randint(1, 70000),
            rng.randint(1, 300000),
            rng.choice(DTYPES),
            rng.choice(DTYPES),
            rng.uniform(1000, 8000),
            rng.choice(("fwd", "bwd")),
        )
        for _ in range(12 if hidden else 4)
    ]
    if hidden:
        return drawn
    fixed = []
    for pass_ in ("fwd", "bwd"):
        fixed += [
            (32768, 16384, torch.bfloat16, torch.float32, 4253.0, pass_),  # the ladder's shape
            (1, 1000, torch.bfloat16, torch.float32, 4253.0, pass_),  # the weight: 1/3 of it
            (37, 1, torch.float16, torch.float16, 3000.0, pass_),  # rstd: most of a backward
            (199, 773, torch.float32, torch.bfloat16, 2039.0, pass_),
            (8192, 262144, torch.bfloat16, torch.bfloat16, 4253.0, pass_),
        ]
    return fixed + drawn


# BEGIN KEY
def _fwd_bwd(fwd, bwd):
    """A variant's time from its own byte counts of either pass."""

    def t(M, N, d, w, gbps, pass_="fwd"):
        nbytes = (fwd if pass_ == "fwd" else bwd)(M, N, _size(d), _size(w))
        return nbytes / (gbps * 1e9) * 1e6

    return t


def _right(M, N, xs, ws):
    return 2 * M * N * xs + N * ws


def _right_bwd(M, N, xs, ws):
    return 3 * M * N * xs + N * ws + 4 * M


VARIANTS = [
    Variant(
        "backward without dout",
        _fwd_bwd(_right, lambda M, N, xs, ws: 2 * M * N * xs + N * ws + 4 * M),
        "the backward reads dout as well as x, and writes dx: three M x N tensors, one more "
        "than the forward's two",
    ),
    Variant(
        "weight in x's size",
        _fwd_bwd(
            lambda M, N, xs, ws: 2 * M * N * xs + N * xs,
            lambda M, N, xs, ws: 3 * M * N * xs + N * xs + 4 * M,
        ),
        "the weight has a dtype of its own (an fp32 weight next to bf16 x is 4 bytes an "
        "element): count its N elements in weight_dtype's size",
    ),
    Variant(
        "backward without rstd",
        _fwd_bwd(_right, lambda M, N, xs, ws: 3 * M * N * xs + N * ws),
        "the backward reads the rstd the forward saved: one fp32 (4 bytes) a row, M of them "
        "(most of the bytes when rows are short)",
    ),
    Variant(
        "no weight",
        _fwd_bwd(
            lambda M, N, xs, ws: 2 * M * N * xs,
            lambda M, N, xs, ws: 3 * M * N * xs + 4 * M,
        ),
        "the weight is read too: N elements of weight_dtype in either pass (a third of the "
        "bytes of a single row)",
    ),
    Variant(
        "forward reads only",
        _fwd_bwd(lambda M, N, xs, ws: M * N * xs + N * ws, _right_bwd),
        "the forward writes y as well as reading x: count both, M x N elements each",
    ),
    Variant(
        "GiB",
        lambda *c: predict_ref(*c) * 1e9 / 2**30,
        "GB/s means 1e9 bytes a second (the bench's and the copy's unit), not 2**30",
    ),
    Variant(
        "milliseconds",
        lambda *c: predict_ref(*c) / 1e3,
        "the answer is in microseconds: seconds * 1e6",
    ),
]

# fmt: off
PREDICT_US_MUTANTS = [
    *mutants(TIERS,
        ("backward without dout", "dout", "3 * M * N * xs", "2 * M * N * xs"),
    ),
    *mutants(COMPILE,
        ("weight in x's size", "dtype of its own", "N * ws", "N * xs"),
        ("backward without rstd", "rstd", " + 4 * M", ""),
        ("GiB", "1e9 bytes", "1e9", "2**30"),
    ),
    *mutants(TIERS,
        ("milliseconds", "microseconds", "* 1e6", "* 1e3"),
    ),
]
# fmt: on
# END KEY

predict = register(
    Exercise(
        id="08.predict_us",
        lesson=LESSON,
        answer="predict_us",
        title="a pass's time at the copy's speed: predict_us(M, N, dtype, weight_dtype, "
        "copy_gbps, pass_)",
        points={COMPILE: 1, GPU: 1},
        mutants=PREDICT_US_MUTANTS,
    )
)
predict.add(
    value_check(
        "both passes, every dtype, shapes where each term shows",
        predict_ref,
        _cases,
        variants=VARIANTS,
    )
)
# BEGIN HIDDEN
predict.add(
    value_check(
        "random cases (grading seed)",
        predict_ref,
        _cases,
        variants=VARIANTS,
        hidden=True,
    )
)
# END HIDDEN


@predict.check("within 10% of the library timed now at 32768 x 16384, both passes", tier=GPU)
def _measured(ctx: Context):
    from ...tools import bench

    M, N, bf16, fp32 = 32768, 16384, torch.bfloat16, torch.float32
    measured = {}
    with gpu_lock.timing():  # alone on the GPU, and its 4 GiB of tensors given back after
        copy = bench.copy_bandwidth()
        for pass_ in ("fwd", "bwd"):
            fn = bench.library_fn("lib", pass_=pass_)
            measured[pass_] = bench.bench_one(
                fn, M, N, bf16, False, fp32, pass_=pass_, budget_s=0.2
            )["us"]
    for pass_, us in measured.items():
        got = float(ctx.call(M, N, bf16, fp32, copy, pass_))
        if not abs(got / us - 1) <= GPU_TOLERANCE:
            raise CheckFailed(
                f"{'forward' if pass_ == 'fwd' else 'backward'}: predicted {got:.1f} us at the "
                f"copy's {copy:.0f} GB/s, the library took {us:.1f} us",
                expected=f"{us:.1f} us within {GPU_TOLERANCE:.0%}",
                seen=f"{got:.1f} us",
                hint="the library moves its bytes at about the copy's speed here: count every "
                "tensor of the pass once, in its own dtype's bytes (the forward: x, y and the "
                "weight; the backward: x, dout, dx, the weight and rstd), divide by the copy's "
                "bytes a second (GB/s * 1e9) and give microseconds",
            )
