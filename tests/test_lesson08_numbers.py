"""Every number lesson 08 quotes, recomputed from the record it reads (ladder.json, the whole
ladder of `quack-edu bench --pass both` on an H200), and the claims its prose makes of it."""

from __future__ import annotations

import pytest
import torch

from quack_edu import bench, results
from quack_edu.grading.exercises.lesson08 import predict_ref
from quack_edu.grading.notebook import read, solutions_dir

LADDER = "ladder"
SHAPE = (32768, 16384)


def _prose() -> str:
    nb = read(solutions_dir() / "08_speed_of_light.ipynb")
    text = " ".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return " ".join(text.split())  # one space between words: quotes may wrap


def _part(pass_) -> dict:
    return results.load(LADDER)[pass_]


def _pct(pass_, kernel, wdt, N=SHAPE[1]) -> float:
    part = _part(pass_)
    (row,) = [
        r
        for r in part["rows"]
        if (r["kernel"], r["N"], r["weight_dtype"]) == (kernel, N, wdt) and not r["graph"]
    ]
    return 100 * row["gbps"] / part["copy_gbps"]


def _p(pass_, kernel, wdt="bf16", N=SHAPE[1]) -> str:
    return f"{_pct(pass_, kernel, wdt, N):.0f}%"


def _gbps(pass_, kernel, wdt, N) -> str:
    (row,) = results.rows(LADDER, **{"pass": pass_}, kernel=kernel, weight_dtype=wdt, N=N)
    return f"{row['gbps']:.0f}"


def _speedups(pass_, kernel) -> list[float]:
    _, ups = bench.speedups(_part(pass_))
    return [u["speedup"] for u in ups if u["kernel"] == kernel]


def _span(values, fmt="{:.1f}") -> str:
    return f"{fmt.format(min(values))}-{fmt.format(max(values))}"


def _geo(pass_, wdt) -> str:
    return f"{_part(pass_)['verdict']['by_weight_dtype'][wdt]['geomean_vs_quack']:.3f}x"


def _predicted_over_measured(pass_, N) -> float:
    part = _part(pass_)
    (row,) = [
        r
        for r in part["rows"]
        if (r["kernel"], r["N"], r["weight_dtype"]) == ("lib", N, "fp32") and not r["graph"]
    ]
    t = predict_ref(row["M"], N, torch.bfloat16, torch.float32, part["copy_gbps"], pass_)
    return t / row["us"]


def _same(values) -> str:
    """The one value that several rows round to (two kernels quoted as one number)."""
    (value,) = set(values)
    return value


def _recomputed() -> dict[str, str]:
    """Quoted -> the same, recomputed from ladder.json and formatted as the prose writes it."""
    f = "fwd"
    long_fwd = [_predicted_over_measured("fwd", N) for N in (4096, 8192, 16384, 32768, 65536,
                                                              131072, 262144)]  # fmt: skip
    within = max(abs(r - 1) for r in long_fwd)
    return {
        "**naive, 5% of the copy.**": f"**naive, {_p(f, 'naive')} of the copy.**",
        "**warp, 67%.**": f"**warp, {_p(f, 'warp')}.**",
        "**block, 97% (71% with an fp32 weight).**": (
            f"**block, {_p(f, 'block')} ({_p(f, 'block', 'fp32')} with an fp32 weight).**"
        ),
        "**cluster, 97% (71%).**": f"**cluster, {_p(f, 'cluster')} ({_p(f, 'cluster', 'fp32')}).**",
        "(262144: 91% against the block's 67% with a bf16 weight)": "(262144: {} against the "
        "block's {} with a bf16 weight)".format(
            _p(f, "cluster", N=262144), _p(f, "block", N=262144)
        ),
        "**cpasync, 97% (96%).**": f"**cpasync, {_p(f, 'cpasync')} ({_p(f, 'cpasync', 'fp32')}).**",
        "**final and lib, 101% (100%).**": "**final and lib, {} ({}).**".format(
            _same(_p(f, k) for k in ("final", "lib")),
            _same(_p(f, k, "fp32") for k in ("final", "lib")),
        ),
        "(65% against 32%": f"({_p(f, 'lib', N=256)} against {_p(f, 'final', N=256)}",
        "run at 99% of the copy with a bf16 weight and 97.5% with an fp32 one": "run at {} of "
        "the copy with a bf16 weight and {} with an fp32 one".format(
            _same(_p("bwd", k) for k in ("final_bwd", "lib")),
            _same(f"{_pct('bwd', k, 'fp32'):.1f}%" for k in ("final_bwd", "lib")),
        ),
        "QuACK's backward at 66% and 72%": "QuACK's backward at {} and {}".format(
            _p("bwd", "quack"), _p("bwd", "quack", "fp32")
        ),
        "backward of the reference at 76% and 75%": "backward of the reference at {} and {}".format(
            _p("bwd", "torch-compile"), _p("bwd", "torch-compile", "fp32")
        ),
        "1.087x with a bf16 weight and 1.172x with an fp32 one": "{} with a bf16 weight and {} "
        "with an fp32 one".format(_geo("fwd", "bf16"), _geo("fwd", "fp32")),
        "(3098 GB/s at 262144 against the library's 4185)": "({} GB/s at 262144 against the "
        "library's {})".format(_gbps(f, "quack", "fp32", 262144), _gbps(f, "lib", "fp32", 262144)),
        "geometric mean over QuACK's is 1.592x and 1.428x": "geometric mean over QuACK's is {} "
        "and {}".format(_geo("bwd", "bf16"), _geo("bwd", "fp32")),
        "drops at 65536 (1276 GB/s)": f"drops at 65536 ({_gbps(f, 'liger', 'bf16', 65536)} GB/s)",
        "(7% of the copy at 16384)": f"({_p(f, 'torch-eager', 'fp32')} of the copy at 16384)",
        "7.2-13.2x faster than PyTorch ops here": f"{_span(_speedups(f, 'quack'))}x faster than "
        "PyTorch ops here",
        "Its backward reaches 18.3x": f"Its backward reaches {max(_speedups('bwd', 'quack')):.1f}x",
        "forward runs 11.1-15.0x and its backward 8.9-20.3x": "forward runs {}x and its "
        "backward {}x".format(_span(_speedups(f, "lib")), _span(_speedups("bwd", "lib"))),
        "11-15x faster in the forward and 9-20x in the backward": "{}x faster in the forward and "
        "{}x in the backward".format(
            _span(_speedups(f, "lib"), "{:.0f}"), _span(_speedups("bwd", "lib"), "{:.0f}")
        ),
        "within 2% either way": f"within {100 * within:.0f}% either way",
        "meets it at 16384 (0.97)": "meets it at 16384 ({:.2f})".format(
            _predicted_over_measured("bwd", 16384)
        ),
        "0.80 at 262144": f"{_predicted_over_measured('bwd', 262144):.2f} at 262144",
    }


@pytest.mark.parametrize("quoted", list(_recomputed()) if results.load(LADDER) else [])
def test_lesson08_quotes_are_the_recorded_ones(quoted):
    assert _recomputed()[quoted] == quoted
    assert quoted in _prose()


def test_lesson08_claims_on_the_record():
    prose, run = _prose(), results.load(LADDER)
    assert run["pass"] == "both" and run["gpu"] == "NVIDIA H200"
    # the command the lesson shows is the record's
    for flag in ("--pass both", "--stages all", "--peers", "--weight-dtype bf16,fp32",
                 "--rounds 2", "--rep-budget 0.08"):  # fmt: skip
        assert flag in run["command"] and flag in prose, flag
    # "ahead of QuACK at every shape with either weight" (forward), and the summary's "forward
    # and backward"
    assert "the library's forward is ahead of QuACK at every shape with either weight" in prose
    assert "ahead of QuACK at every shape of the run, forward and backward, with either" in prose
    for pass_ in ("fwd", "bwd"):
        for v in _part(pass_)["verdict"]["by_weight_dtype"].values():
            assert all(e["vs_quack"] > 1 for e in v["shapes"])
    # Liger "does not run above" 65536
    assert "does not run above it" in prose
    above = [r for r in _part("fwd")["rows"] if r["kernel"] == "liger" and r["N"] > 65536]
    assert above and all("gbps" not in r for r in above)
    # "~5 minutes on an H200"
    assert "~5 minutes on an H200" in prose and 240 <= run["elapsed_s"] <= 360
    # the summary's climb: 5%, 67%, 97% (block), 97% and 96% (cpasync), 101% (final), 99% (bwd)
    climb = "from {} of the copy (one thread a row: latency) to {} (a warp a row), {} (a block"
    assert climb.format(_p("fwd", "naive"), _p("fwd", "warp"), _p("fwd", "block")) in prose
    assert "{} and {} with `cp.async`".format(
        _p("fwd", "cpasync"), _p("fwd", "cpasync", "fp32")
    ) in " ".join(read(solutions_dir() / "08_speed_of_light.ipynb").cells[-1].source.split())
    assert "and 101% for the final kernel; the backward's final kernel runs at 99%" in prose
    assert _p("fwd", "final") == "101%" and _p("bwd", "final_bwd") == "99%"
