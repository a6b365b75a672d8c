"""The GB/s that lessons 02-07 and docs/benchmarks.md quote are the recorded ones: lessons 02-05
from benchmarks/results/ladder.json (the whole ladder, forward and backward, in one run); lesson
06 from fwd_final_configs.json (the final kernel's config sweeps), fwd_final.json (the library
against its peers), fwd_final_residual.json and ab_configs.json (the A/B runs behind the
heuristic); lesson 07 from bwd_final.json (the library's backward) and the package's byte
counts; docs/benchmarks.md's library results from the same files. Re-recording the results
makes this fail until the prose is brought up to date."""

from __future__ import annotations

import datetime
import functools
import re
import statistics

import pytest
import torch
from conftest import ROOT

from quack_edu.grading.notebook import read, solutions_dir
from quack_edu.lessons import results

LADDER = "ladder"  # the whole ladder (quack-edu bench --pass both): lessons 02-05 read its forward
L02, L03 = "02_warp_reduction", "03_block_reduction"
L04, L05 = "04_cluster_reduction", "05_cp_async_pipelining"
LARGE = (32768, 65536, 131072, 262144)


@functools.cache  # ladder.json read once a row, not once a quote
def _row(kernel, N, graph=False, wdt="bf16") -> dict:
    (row,) = results.rows(LADDER, "fwd", kernel=kernel, N=N, graph=graph, weight_dtype=wdt)
    return row


def _g(kernel, N, graph=False) -> str:
    """A forward row's GB/s (bf16 x and weight), as the prose writes it."""
    return f"{_row(kernel, N, graph)['gbps']:.0f}"


def _gs(kernel, Ns=LARGE) -> str:
    return " / ".join(_g(kernel, N) for N in Ns)


def _pc(kernel, N, graph=False, digits=0) -> str:
    """Its share of the run's copy."""
    return f"{_row(kernel, N, graph)['pct_copy']:.{digits}f}%"


def _ratio(a, b, N, graph=False) -> float:
    return _row(a, N, graph)["gbps"] / _row(b, N, graph)["gbps"]


def _quoted_ratio(a, b, N, graph=False) -> float:
    """a / b from the GB/s as the prose quotes them (whole numbers): a percentage quoted beside
    them is the reader's division of the two."""
    return int(_g(a, N, graph)) / int(_g(b, N, graph))


def _gain(a, b, N, graph=False, digits=0) -> str:
    return f"{100 * (_ratio(a, b, N, graph) - 1):+.{digits}f}%".replace("-", "\u2212")


PLANS_04 = ("cluster@hold", "cluster@late", "cluster")  # lesson 04's register plans


def _round_spread(kernels, Ns) -> float:
    """The widest gap, in % of the median, between the rounds of one forward row (bf16)."""
    widest = 0.0
    for k in kernels:
        for N in Ns:
            row = _row(k, N)
            us = row["us_rounds"]
            widest = max(widest, 100 * (max(us) - min(us)) / row["us"])
    return widest


def _span(values, fmt="{:.0f}") -> str:
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


@functools.cache
def _ladder_quotes() -> list[tuple[str, str, str]]:
    """(lesson, quoted, recomputed from ladder.json): every speed lessons 02-05 quote."""
    copy = f"{results.load(LADDER)['copy_gbps']:.0f} GB/s"
    pct = {k: [_row(k, N)["pct_copy"] for N in LARGE] for k in ("cluster", "cpasync")}
    behind_q = [100 * (1 / _ratio("cluster", "quack", N) - 1) for N in LARGE]
    over_block = [100 * (_ratio("cluster", "block", N) - 1) for N in LARGE]
    cp_behind_q = [100 * (1 - _ratio("cpasync", "quack", N)) for N in LARGE]
    mid = (4096, 8192, 16384)
    return [
        # lesson 02: the warp stage
        (L02, "against the copy bandwidth of 4221 GB/s", f"against the copy bandwidth of {copy}"),
        (
            L02,
            "from about 200 GB/s to 3618 GB/s at N = 1024 and 3971 GB/s (94.1% of copy) at",
            "from about {} GB/s to {} GB/s at N = 1024 and {} GB/s ({} of copy) at".format(
                int(round(_row("naive", 1024)["gbps"], -2)),
                _g("warp", 1024),
                _g("warp", 4096),
                _pc("warp", 4096, digits=1),
            ),
        ),
        (
            L02,
            "Same bytes; 18-20x faster.",
            "Same bytes; {:.0f}-{:.0f}x faster.".format(
                _ratio("warp", "naive", 1024), _ratio("warp", "naive", 4096)
            ),
        ),
        (
            L02,
            "N = 256: 1072 GB/s (25%) launched plainly, but 3365 GB/s (80%) in a CUDA graph",
            "N = 256: {} GB/s ({}) launched plainly, but {} GB/s ({}) in a CUDA graph".format(
                _g("warp", 256), _pc("warp", 256), _g("warp", 256, True), _pc("warp", 256, True)
            ),
        ),
        (
            L02,
            "N = 8192: 3222 GB/s (76%); N = 16384: 2849 GB/s (67%); 32768 and 65536: 66%.",
            "N = 8192: {} GB/s ({}); N = 16384: {} GB/s ({}); 32768 and 65536: {}.".format(
                _g("warp", 8192),
                _pc("warp", 8192),
                _g("warp", 16384),
                _pc("warp", 16384),
                _span([_row("warp", N)["pct_copy"] for N in (32768, 65536)], "{:.0f}%"),
            ),
        ),
        (
            L02,
            "94.1% of the copy bandwidth at 32768 x 4096 bf16",
            f"{_pc('warp', 4096, digits=1)} of the copy bandwidth at 32768 x 4096 bf16",
        ),
        # lesson 03: the block stage
        (L03, "it measured 94.1% of copy", f"it measured {_pc('warp', 4096, digits=1)} of copy"),
        (
            L03,
            "76% of copy at 8192, 67% at 16384",
            f"{_pc('warp', 8192)} of copy at 8192, {_pc('warp', 16384)} at 16384",
        ),
        (L03, "copy bandwidth 4221 GB/s recorded", f"copy bandwidth {copy} recorded"),
        (
            L03,
            "read x twice (76%, 67%)",
            f"read x twice ({_pc('warp', 8192)}, {_pc('warp', 16384)})",
        ),
        (
            L03,
            "like the warp stage did at 4096 (94.1%)",
            f"like the warp stage did at 4096 ({_pc('warp', 4096, digits=1)})",
        ),
        (
            L03,
            "N = 4096: block 4006 GB/s (94.9% of copy), warp 3971 (94.1%)",
            "N = 4096: block {} GB/s ({} of copy), warp {} ({})".format(
                _g("block", 4096),
                _pc("block", 4096, digits=1),
                _g("warp", 4096),
                _pc("warp", 4096, digits=1),
            ),
        ),
        (
            L03,
            "N = 8192: block 4090 GB/s (96.9%) against warp's 3222 (76.3%); N = 16384: 4096 GB/s "
            "(97.0%) against 2849 (67.5%)",
            "N = 8192: block {} GB/s ({}) against warp's {} ({}); N = 16384: {} GB/s ({}) against "
            "{} ({})".format(
                *(
                    v
                    for k, N in (("block", 8192), ("warp", 8192), ("block", 16384), ("warp", 16384))
                    for v in (_g(k, N), _pc(k, N, digits=1))
                )
            ),
        ),
        (
            L03,
            "N = 32768: 3811 GB/s (90.3%)",
            f"N = 32768: {_g('block', 32768)} GB/s ({_pc('block', 32768, digits=1)})",
        ),
        (
            L03,
            "N = 65536: 3742 GB/s (88.6%) although x is read twice. 89% is far above",
            "N = 65536: {} GB/s ({}) although x is read twice. {} is far above".format(
                _g("block", 65536), _pc("block", 65536, digits=1), _pc("block", 65536)
            ),
        ),
        (
            L03,
            "N = 1024: 3710 GB/s (87.9%); N = 256: 1122 GB/s (27%)",
            "N = 1024: {} GB/s ({}); N = 256: {} GB/s ({})".format(
                _g("block", 1024), _pc("block", 1024, digits=1), _g("block", 256), _pc("block", 256)
            ),
        ),
        (
            L03,
            "N = 256 runs at 62%, and the warp stage, with no barrier, at 80%",
            "N = 256 runs at {}, and the warp stage, with no barrier, at {}".format(
                _pc("block", 256, True), _pc("warp", 256, True)
            ),
        ),
        (
            L03,
            "The block stage ran at 95-97% of",
            "The block stage ran at {} of".format(
                _span([_row("block", N)["pct_copy"] for N in mid], "{:.0f}%").replace("%-", "-")
            ),
        ),
        # lesson 04: the cluster stage
        (L04, "copy 4221 GB/s in the same run", f"copy {copy} in the same run"),
        *[
            (
                L04,
                f"| {N} | {_g('block', N)} | {_g('cluster', N)} | {_g('quack', N)} |",
                "| {} | {} | {} | {} |".format(
                    N, *(_g(k, N) for k in ("block", "cluster", "quack"))
                ),
            )
            for N in LARGE
        ],
        (
            L04,
            "it drops to 71% and 67% of the copy bandwidth",
            "it drops to {} and {} of the copy bandwidth".format(
                _pc("block", 131072), _pc("block", 262144)
            ),
        ),
        (
            L04,
            "stays at 94% and 92% (+31%, +36%)",
            "stays at {} and {} ({}, {})".format(
                _pc("cluster", 131072),
                _pc("cluster", 262144),
                _gain("cluster", "block", 131072),
                _gain("cluster", "block", 262144),
            ),
        ),
        (
            L04,
            "the cluster stage is ahead by 3% and 6%",
            "the cluster stage is ahead by {} and {}".format(
                *(f"{100 * (_ratio('cluster', 'block', N) - 1):.0f}%" for N in (32768, 65536))
            ),
        ),
        (
            L04,
            "QuACK is still 5%, 6%, 5% and 3% faster",
            "QuACK is still {} faster".format(
                ", ".join(f"{v:.0f}%" for v in behind_q[:3]) + f" and {behind_q[3]:.0f}%"
            ),
        ),
        (
            L04,
            "`late` is 2.9% slower than `hold` at 131K (3322 against 3420 GB/s) and 3.2% faster at "
            "262K (3226 against 3127)",
            # the percentages from the GB/s as quoted, so that a reader's division agrees (issue
            # 50: 3225.7 / 3127.4 is +3.1%, the quoted 3226 / 3127 +3.2%)
            "`late` is {:.1f}% slower than `hold` at 131K ({} against {} GB/s) and {:.1f}% faster "
            "at 262K ({} against {})".format(
                100 * (1 - _quoted_ratio("cluster@late", "cluster@hold", 131072)),
                _g("cluster@late", 131072),
                _g("cluster@hold", 131072),
                100 * (_quoted_ratio("cluster@late", "cluster@hold", 262144) - 1),
                _g("cluster@late", 262144),
                _g("cluster@hold", 262144),
            ),
        ),
        (
            L04,
            "Each row's two rounds agree within 0.3%",
            f"Each row's two rounds agree within {_round_spread(PLANS_04, LARGE):.1f}%",
        ),
        (
            L04,
            "the stage measures 3956 and 3865 GB/s, +16% and +24% over `hold`",
            "the stage measures {} and {} GB/s, {} and {} over `hold`".format(
                _g("cluster", 131072),
                _g("cluster", 262144),
                _gain("cluster", "cluster@hold", 131072),
                _gain("cluster", "cluster@hold", 262144),
            ),
        ),
        (
            L04,
            "took the stage from 3420 to 3956 GB/s at 131072",
            "took the stage from {} to {} GB/s at 131072".format(
                _g("cluster@hold", 131072), _g("cluster", 131072)
            ),
        ),
        (
            L04,
            "Measured: 92-94% of the copy bandwidth at 32K-262K bf16, +3% to +36% over the block",
            "Measured: {} of the copy bandwidth at 32K-262K bf16, +{:.0f}% to +{:.0f}% over the "
            "block".format(
                _span(pct["cluster"], "{:.0f}%").replace("%-", "-"),
                min(over_block),
                max(over_block),
            ),
        ),
        (L04, "3-6% behind QuACK.", f"{_span(behind_q)}% behind QuACK."),
        # lesson 05: cp.async
        (
            L05,
            "measured 92-94% of the copy bandwidth for rows of 32K-262K",
            "measured {} of the copy bandwidth for rows of 32K-262K".format(
                _span(pct["cluster"], "{:.0f}%").replace("%-", "-")
            ),
        ),
        (L05, "still 3-6% behind QuACK", f"still {_span(behind_q)}% behind QuACK"),
        (
            L05,
            "where it is at 92-94%",
            "where it is at {}".format(_span(pct["cluster"], "{:.0f}%").replace("%-", "-")),
        ),
        (
            L05,
            "cpasync 4124 / 4130 / 4047 / 3958 GB/s against the cluster stage's 3941 / 3980 / "
            "3956 / 3865: +5%, +4%, +2%, +2%, at 98%, 98%, 96% and 94% of the copy",
            "cpasync {} GB/s against the cluster stage's {}: {}, at {} of the copy".format(
                _gs("cpasync"),
                _gs("cluster"),
                ", ".join(f"{100 * (_ratio('cpasync', 'cluster', N) - 1):+.0f}%" for N in LARGE),
                ", ".join(f"{v:.0f}%" for v in pct["cpasync"][:3]) + f" and "
                f"{pct['cpasync'][3]:.0f}%",
            ),
        ),
        (
            L05,
            "QuACK: 4146 / 4208 / 4162 / 3969, cpasync 0.5%, 1.9%, 2.8% and 0.3% behind it",
            "QuACK: {}, cpasync {} behind it".format(
                _gs("quack"),
                ", ".join(f"{v:.1f}%" for v in cp_behind_q[:3]) + f" and {cp_behind_q[3]:.1f}%",
            ),
        ),
        (
            L05,
            "cpasync 4050 / 4080 / 4081 against cluster 4005 / 4077 / 4102: +1.1%, +0.1%, "
            "\u22120.5%",
            "cpasync {} against cluster {}: {}".format(
                _gs("cpasync", mid),
                _gs("cluster", mid),
                ", ".join(_gain("cpasync", "cluster", N, digits=1) for N in mid),
            ),
        ),
        (
            L05,
            "(96-97% of the copy)",
            "({} of the copy)".format(
                _span([_row("cpasync", N)["pct_copy"] for N in mid], "{:.0f}%").replace("%-", "-")
            ),
        ),
        (
            L05,
            "plain, cpasync 3729 and cluster 3709 (36.0 against 36.2 us a call",
            "plain, cpasync {} and cluster {} ({:.1f} against {:.1f} us a call".format(
                _g("cpasync", 1024),
                _g("cluster", 1024),
                _row("cpasync", 1024)["us"],
                _row("cluster", 1024)["us"],
            ),
        ),
        (
            L05,
            "inside a CUDA graph 3728 and 3709",
            "inside a CUDA graph {} and {}".format(
                _g("cpasync", 1024, True), _g("cluster", 1024, True)
            ),
        ),
        (
            L05,
            "plain 1146 against 1034, in a graph 3171 against 2598 (+22%)",
            "plain {} against {}, in a graph {} against {} ({})".format(
                _g("cpasync", 256),
                _g("cluster", 256),
                _g("cpasync", 256, True),
                _g("cluster", 256, True),
                _gain("cpasync", "cluster", 256, True),
            ),
        ),
        (L05, "4130 GB/s at 32768 x 65536", f"{_g('cpasync', 65536)} GB/s at 32768 x 65536"),
        (
            L05,
            "measured 94-98% of the copy bandwidth at 32K-262K bf16 on the H200 (cluster stage: "
            "92-94%), 0.3-2.8% behind QuACK",
            "measured {} of the copy bandwidth at 32K-262K bf16 on "
            "the H200 (cluster stage: {}), {} behind QuACK".format(
                _span(pct["cpasync"], "{:.0f}%").replace("%-", "-"),
                _span(pct["cluster"], "{:.0f}%").replace("%-", "-"),
                _span(cp_behind_q, "{:.1f}%").replace("%-", "-"),
            ),
        ),
    ]


@functools.cache  # the committed notebook, read once a process (not once a quote)
def _prose(lesson: str) -> str:
    nb = read(solutions_dir() / f"{lesson}.ipynb")
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return text


def _words(text: str) -> str:
    return " ".join(text.split())  # one space between words: quotes may wrap


@pytest.mark.parametrize("case", _ladder_quotes(), ids=lambda c: f"{c[0][:2]}-{c[1][:40]}")
def test_lessons_02_to_05_quote_the_ladder(case):
    lesson, quoted, recomputed = case
    assert recomputed == quoted
    assert _words(quoted) in _words(_prose(lesson)), quoted


def test_lessons_02_to_05_read_the_ladder():
    """Their code cells read ladder.json's forward with a bf16 weight where there is no GPU,
    and name no other record of the stages."""
    for lesson in (L02, L03, L04, L05):
        nb = read(solutions_dir() / f"{lesson}.ipynb")
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        assert '"ladder"' in code and 'weight_dtype="bf16"' in code, lesson
        assert "fwd_bf16" not in code + _prose(lesson), lesson


def test_lesson05_plain_rows_were_timed_back_to_back():
    # "launched back to back": the run timed plain rows in batches of calls
    assert results.load(LADDER)["fwd"]["plain_batch_s"] > 0
    assert "launched back to back" in _words(_prose(L05))


def test_lesson04_late_against_hold():
    # "`late` is 2.9% slower than `hold` at 131K ... and 3.2% faster at 262K": each gap is
    # wider than the spread of either row's two rounds, as the lesson says
    slower, faster = (_ratio("cluster@late", "cluster@hold", N) for N in (131072, 262144))
    assert slower < 1 < faster
    spread = _round_spread(PLANS_04, LARGE)
    assert min(1 - slower, faster - 1) * 100 > 5 * spread
    assert "`late` is 2.9% slower than `hold`" in _words(_prose(L04))


def test_the_recorded_cpasync_is_at_least_the_cluster_stage_but_at_16384():
    # lesson 05's claim, on the recorded ladder: every shape and timing mode but one, a tie
    behind = []
    for row in results.rows(LADDER, "fwd", kernel="cluster", weight_dtype="bf16"):
        ratio = _ratio("cpasync", "cluster", row["N"], row["graph"])
        if ratio < 1:
            behind.append((row["N"], row["graph"], round(ratio, 4)))
    assert [(N, g) for N, g, _ in behind] == [(16384, False)] and behind[0][2] > 0.99, behind
    assert "at every shape of the run but one, 16384, where it is 0.5% behind" in _words(
        _prose(L05)
    )


# --- lesson 06 and the README: the final kernel's sweeps and the library's recorded run --------
# fwd_final_configs.json: config sweeps "A" (weight in shared memory only, with cpasync and QuACK
# rows) and "B" (the committed kernel); fwd_final.json: the library ("lib") against its peers;
# fwd_final_residual.json.
L06 = "06_final_kernel"
CONFIGS, FINAL = "fwd_final_configs", "fwd_final"
RESIDUAL = "fwd_final_residual"
TUNED = "fwd_tuned"
TUNED_RUNS = (TUNED, "fwd_tuned_262144_fp32")
BIG = (65536, 131072, 262144)


def _plan(config) -> dict:
    """'FinalConfig(threads_per_row=256, cluster_n=8, ...)' -> {'threads_per_row': '256', ...}"""
    return dict(re.findall(r"(\w+)=(\w+)", config or ""))


def _q(value, result, pick="one", plan=None, **where):
    """A quoted GB/s: the one row of ``result`` matching ``where`` (and the config fields of
    ``plan``), or the max/min over the matching rows."""
    name = "-".join(
        [result, pick, *(str(v) for v in where.values()), *(str(v) for v in (plan or {}).values())]
    )
    return pytest.param(value, result, pick, plan or {}, where, id=f"{name}-{value}")


def _gbps(result, pick, plan, where) -> int:
    rows = [
        r
        for r in results.rows(result, **where)
        if all(_plan(r.get("config")).get(k) == str(v) for k, v in plan.items())
    ]
    values = [r["gbps"] for r in rows]
    if pick == "one":
        assert len(values) == 1, rows
        return round(values[0])
    return round({"max": max, "min": min}[pick](values))


def _sweep(kernel, N, wdt, sweep="A"):
    return {"sweep": sweep, "kernel": kernel, "N": N, "weight_dtype": wdt}


def _lib(kernel, N, wdt, graph=False):
    return {"kernel": kernel, "N": N, "weight_dtype": wdt, "graph": graph}


SMEM8 = {"buffers": 2, "blocks_per_cta": 8}
ONE = {"buffers": 1, "blocks_per_cta": 1}
QUOTED_06 = [
    # section 2: cpasync and QuACK at the long rows, sweep A
    *(
        _q(v, CONFIGS, **_sweep(k, N, w))
        for k, w, vs in (
            ("cpasync", "bf16", (4147, 4048, 3968)),
            ("cpasync", "fp32", (3052, 2821, 2762)),
            ("quack", "fp32", (3625, 3405, 3107)),
        )
        for N, v in zip(BIG, vs, strict=True)
    ),
    # the final kernel with an fp32 weight: the sweep's best, and that it is the quoted plan
    *(
        _q(v, CONFIGS, "max", **_sweep("final", N, "fp32"))
        for N, v in zip(BIG, (3962, 3912, 3286), strict=True)
    ),
    _q(3962, CONFIGS, plan={"cluster_n": 8, **SMEM8}, **_sweep("final", 65536, "fp32")),
    _q(3912, CONFIGS, plan={"cluster_n": 16, **SMEM8}, **_sweep("final", 131072, "fp32")),
    _q(3286, CONFIGS, plan={"cluster_n": 16, **SMEM8}, **_sweep("final", 262144, "fp32")),
    # one buffer, one block per CTA at 131072, fp32 weight: the range over the cluster sizes
    _q(1831, CONFIGS, "min", plan=ONE, **_sweep("final", 131072, "fp32")),
    _q(2382, CONFIGS, "max", plan=ONE, **_sweep("final", 131072, "fp32")),
    # the final kernel's best with a bf16 weight
    *(
        _q(v, CONFIGS, "max", **_sweep("final", N, "bf16"))
        for N, v in zip(BIG, (4019, 4014, 3972), strict=True)
    ),
    # sweep B: the weight in registers against the best shared-memory plan, fp32 weight
    _q(
        3917, CONFIGS, "max", plan={"weight_in_smem": False}, **_sweep("final", 131072, "fp32", "B")
    ),
    _q(3917, CONFIGS, "max", plan={"weight_in_smem": True}, **_sweep("final", 131072, "fp32", "B")),
    _q(3579, CONFIGS, "max", **_sweep("final", 262144, "fp32", "B")),
    _q(
        3579,
        CONFIGS,
        plan={
            "threads_per_row": 256,
            "cluster_n": 16,
            "buffers": 2,
            "blocks_per_cta": 4,
            "weight_in_smem": False,
        },
        **_sweep("final", 262144, "fp32", "B"),
    ),
    _q(3303, CONFIGS, "max", plan={"weight_in_smem": True}, **_sweep("final", 262144, "fp32", "B")),
    # N = 4096, bf16 weight, no cluster
    _q(4100, CONFIGS, plan={"cluster_n": 1, **ONE}, **_sweep("final", 4096, "bf16")),
    _q(
        3909,
        CONFIGS,
        plan={"cluster_n": 1, "buffers": 2, "blocks_per_cta": 4},
        **_sweep("final", 4096, "bf16"),
    ),
    # section 4: the fused residual, and the plain forward it is compared with
    *(
        _q(v, RESIDUAL, kernel=k, N=N)
        for k, vs in (("lib", (4231, 4275, 4314)), ("quack", (4063, 4115, 4120)))
        for N, v in zip((4096, 16384, 65536), vs, strict=True)
    ),
    *(
        _q(v, FINAL, **_lib("lib", N, "bf16"))
        for N, v in zip((4096, 16384, 65536), (4232, 4285, 4333), strict=True)
    ),
    # section 8: the library against its peers
    _q(4189, FINAL, **_lib("quack", 65536, "bf16")),
    _q(4259, FINAL, **_lib("torch-compile", 8192, "bf16")),
    _q(4265, FINAL, **_lib("lib", 8192, "bf16")),
    _q(1609, FINAL, **_lib("quack", 256, "bf16")),
    *(_q(v, FINAL, **_lib("lib", N, "fp32")) for N, v in zip(BIG, (4313, 4297, 4172), strict=True)),
    *(
        _q(v, FINAL, **_lib("quack", N, "fp32"))
        for N, v in zip(BIG, (3598, 3383, 3083), strict=True)
    ),
    _q(2007, FINAL, **_lib("lib", 256, "bf16")),
    _q(3982, FINAL, **_lib("lib", 512, "bf16")),
    _q(3290, FINAL, **_lib("quack", 512, "bf16")),
    _q(3635, FINAL, **_lib("lib", 256, "bf16", graph=True)),
    _q(3687, FINAL, **_lib("lib", 512, "bf16", graph=True)),
    _q(3465, FINAL, **_lib("torch-compile", 256, "bf16", graph=True)),
    _q(3552, FINAL, **_lib("torch-compile", 512, "bf16", graph=True)),
    _q(3322, FINAL, **_lib("quack", 256, "bf16", graph=True)),
    _q(3350, FINAL, **_lib("quack", 512, "bf16", graph=True)),
    _q(3689, FINAL, **_lib("lib", 512, "fp32", graph=True)),
    _q(3527, FINAL, **_lib("torch-compile", 512, "fp32", graph=True)),
    # section 5: what the autotuner picked (the bench's rows of the tuning run)
    _q(4353, TUNED, kernel="lib-tuned", N=65536, weight_dtype="bf16"),
    _q(4158, TUNED, kernel="lib", N=65536, weight_dtype="bf16"),
]


#: the A/B run that dropped the cluster barrier before a CTA's exit (ab_configs.json)
EXIT_AB = "exit_sync was then new"


def _prose06() -> str:
    """Lesson 06's markdown and its appendix (docs/06_design_notes.md), where the design notes
    and their numbers went; one space between words: quotes may wrap."""
    notes = (ROOT / "docs" / "06_design_notes.md").read_text()
    return " ".join((_prose(L06) + "\n" + notes).split())


@pytest.mark.parametrize("value,result,pick,plan,where", QUOTED_06)
def test_lesson06_quoted_gbps_are_the_recorded_ones(value, result, pick, plan, where):
    assert _gbps(result, pick, plan, where) == value
    assert str(value) in _prose06()


def _shape(wdt, N, graph=False) -> dict:
    es = results.load(FINAL)["verdict"]["by_weight_dtype"][wdt]["shapes"]
    return next(e for e in es if e["N"] == N and e["graph"] == graph)


def _sweep_a() -> dict:
    return {
        (r["kernel"], r["N"], r["weight_dtype"]): r["gbps"]
        for r in results.rows(CONFIGS, sweep="A")
    }


@functools.cache  # ~0.5 s of reading the records, once a process instead of once a quote
def _recomputed06() -> dict[str, str]:
    """Every ratio, percentage and range lesson 06 quotes -> the same, recomputed from the files
    and formatted as the prose writes it."""
    v = results.load(FINAL)["verdict"]["by_weight_dtype"]
    plain = [e for e in v["bf16"]["shapes"] if not e["graph"]]
    copy = [_shape("bf16", N)["pct_copy"] for N in (4096, 8192, 16384, 32768, 65536)]
    from_4k = [_shape(w, N)["pct_copy"] for w in ("bf16", "fp32") for N in LONG]
    closest = sorted(
        (e["fp32_vs_bf16"], e["N"], e["graph"]) for e in v["fp32"]["shapes"] if "fp32_vs_bf16" in e
    )[:3]
    closest_words = [f"{r:.3f}x at {N}{' through a graph' if g else ''}" for r, N, g in closest]
    # sweep A of fwd_final_configs.json, the one record of the fix: the fp32 weight's cost to
    # cpasync, and the final kernel's best with an fp32 weight against cpasync's bf16 weight
    a = _sweep_a()
    loss = [100 * (1 - a[("cpasync", N, "fp32")] / a[("cpasync", N, "bf16")]) for N in BIG]
    best32 = {
        N: max(r["gbps"] for r in results.rows(CONFIGS, **_sweep("final", N, "fp32"))) for N in BIG
    }
    fixed = [100 * best32[N] / a[("cpasync", N, "bf16")] for N in BIG]
    # the library's timing rounds (fwd_final.json): how far apart a row's rounds are, from 4096 up
    spread = [  # GB/s is bytes over time: the rounds' GB/s spread as their times do
        100 * (max(_rounds(N, w, False)) / min(_rounds(N, w, False)) - 1)
        for w in ("bf16", "fp32")
        for N in LONG
    ]
    dtype_cost = [100 * (1 - _shape("fp32", N)["fp32_vs_bf16"]) for N in LONG]
    res65 = results.rows(RESIDUAL, kernel="lib", N=65536)[0]
    quack65 = results.rows(RESIDUAL, kernel="quack", N=65536)[0]

    def x(r):
        return f"{r:.3f}x"

    def pct(p):
        return f"{p:.1f}%"

    def short(graph):  # an fp32 weight in registers, N = 256: against the staged weight
        return _ab_gain("fwd", 32768, 256, "fp32", SHORT_FP32, graph=graph, digits=0)

    from512 = [e["vs_quack"] for e in plain if e["N"] >= 512]
    host = [o["us_per_call"] for o in results.load(FINAL)["overhead"] if o["kernel"] == "lib"]

    def pdl(N, wdt):
        return _ab_gain("fwd", 32768, N, wdt, "pdl=True", graph=True)

    short_pdl = [float(pdl(N, w).rstrip("%")) for N in (256, 512) for w in ("bf16", "fp32")]
    smem512 = _smem512_over_regs()
    return {
        "loses 26-30% of its speed": f"loses {min(loss):.0f}-{max(loss):.0f}% of its speed",
        "went from 26-30% behind to 96-97% of the bf16 speed at 64K-128K": (
            f"went from {min(loss):.0f}-{max(loss):.0f}% behind to {fixed[0]:.0f}-{fixed[1]:.0f}% "
            "of the bf16 speed at 64K-128K"
        ),
        "96%, 97% and 83% of the bf16 speed": "{:.0f}%, {:.0f}% and {:.0f}% of the bf16 "
        "speed".format(*fixed),
        "five rounds agree within 0.4% at every row": (
            f"five rounds agree within {max(spread):.1f}% at every row"
        ),
        "the weight's dtype costs it at most 2%": (
            f"the weight's dtype costs it at most {max(dtype_cost):.0f}%"
        ),
        "(1.029-1.210x over the plain shapes from 512 up)": (
            f"({min(from512):.3f}-{max(from512):.3f}x over the plain shapes from 512 up)"
        ),
        "100.1-102.5%": f"{min(copy):.1f}-{max(copy):.1f}%",
        "101.2% at 131072 and 100.5% at 262144": "{} at 131072 and {} at 262144".format(
            pct(_shape("bf16", 131072)["pct_copy"]), pct(_shape("bf16", 262144)["pct_copy"])
        ),
        "4265 (1.001x)": "{:.0f} ({})".format(
            _shape("bf16", 8192)["gbps"], x(_shape("bf16", 8192)["vs_best_peer"])
        ),
        "(1.199x, 1.270x, 1.353x)": "({})".format(
            ", ".join(x(_shape("fp32", N)["vs_quack"]) for N in BIG)
        ),
        "102.0%, 101.7% and 98.7% of the copy": "{} and {} of the copy".format(
            ", ".join(pct(_shape("fp32", N)["pct_copy"]) for N in BIG[:2]),
            pct(_shape("fp32", 262144)["pct_copy"]),
        ),
        "(the closest: 0.980x at 2048 through a graph, 0.981x at 256 through a graph, and 0.982x "
        "at 262144)": "(the closest: {}, and {})".format(
            ", ".join(closest_words[:-1]), closest_words[-1]
        ),
        "3-4% below the bf16 weight at 131072 and 262144": (
            f"{_before_weight_once()} below the bf16 weight at 131072 and 262144"
        ),
        "98.7-102.5% of the copy from 4096 up": (
            f"{min(from_4k):.1f}-{max(from_4k):.1f}% of the copy from 4096 up"
        ),
        "1.082x": x(v["bf16"]["geomean_vs_quack"]),
        "1.083x": x(v["bf16"]["geomean_vs_quack_all"]),
        "1.155x": x(v["fp32"]["geomean_vs_quack"]),
        "1.139x": x(v["fp32"]["geomean_vs_quack_all"]),
        "through a graph the fp32 weight reads 1.000x": "through a graph the fp32 weight reads "
        + x(_shape("fp32", 512, graph=True)["fp32_vs_bf16"]),
        "0.995x of the bf16 weight now": f"{x(_shape('fp32', 65536)['fp32_vs_bf16'])} of the bf16 "
        "weight now",
        "(0.980x at the graph row at 2048, two levels of rounds; the kernel's own gap is at "
        "262144, 0.982x here and 0.977x in another run": "({} at the graph row at {}, "
        "two levels of rounds; the kernel's own gap is at 262144, {} here and {} in another "
        "run".format(
            x(closest[0][0]),
            closest[0][1],
            x(_shape("fp32", 262144)["fp32_vs_bf16"]),
            x(_other_run_262144()),
        ),
        "0.982x in this record and 0.977x in an earlier run": "{} in this record and {} in an "
        "earlier run".format(x(_shape("fp32", 262144)["fp32_vs_bf16"]), x(_other_run_262144())),
        # the plain row at 512: each weight's median round (batched timing: the kernel's time)
        "a median round of 16.85 µs a call with a bf16 weight, 16.98 with an fp32 one (0.993x)": (
            "a median round of {:.2f} µs a call with a bf16 weight, {:.2f} with an fp32 one "
            "({})".format(
                _row_us("lib", 512, "bf16", False),
                _row_us("lib", 512, "fp32", False),
                x(_shape("fp32", 512)["fp32_vs_bf16"]),
            )
        ),
        # the fp32 weight's closest rows: 256 and 2048 through graphs, 2048 plain, 262144
        "every fp32 round ran 0.15-0.27 µs slower than the bf16 round beside it": (
            "every fp32 round ran {:.2f}-{:.2f} µs slower than the bf16 round beside it".format(
                *_round_gaps(256, graph=True)
            )
        ),
        "fall at two levels, 67.1-68.5 and 72.9-73.8 µs a call (two fp32 rounds between, at 70.3 "
        "and 70.4)": "fall at two levels, {:.1f}-{:.1f} and {:.1f}-{:.1f} µs a call (two fp32 "
        "rounds between, at {:.1f} and {:.1f})".format(*_levels2048()),
        "the median of the round-by-round ratios is 0.995x": "the median of the round-by-round "
        f"ratios is {x(statistics.median(_round_ratios(2048, graph=True)))}",
        "plain, 2048 reads 1.004x": f"plain, 2048 reads {x(_shape('fp32', 2048)['fp32_vs_bf16'])}",
        "(as here: 2059-2060 µs a call against 2017-2024)": "(as here: {:.0f}-{:.0f} µs a call "
        "against {:.0f}-{:.0f})".format(
            *(f(_rounds(262144, w, False)) for w in ("fp32", "bf16") for f in (min, max))
        ),
        "80 registers and two CTAs an SM: -3.6%)": "80 registers and two CTAs an SM: {})".format(
            _ab_gain("fwd", 8192, 262144, "fp32", "split_wide_weight=True", note=SPLIT)
        ),
        # N = 256: plain (batched) against a graph, and the tiny-call host cost
        "(16.7 µs a call plain, 9.2 through a graph": "({:.1f} µs a call plain, {:.1f} through a "
        "graph".format(*(_row_us("lib", 256, "bf16", g) for g in (False, True))),
        "14.1 µs a tiny call": (
            f"{min(host):.1f}"
            + ("" if f"{min(host):.1f}" == f"{max(host):.1f}" else f"-{max(host):.1f}")
            + " µs a tiny call"
        ),
        # programmatic dependent launch for plain rows timed in batches (A/B)
        "-9.3% / -7.9% at 512 and -4.3% / -5.1% at 1024": "{} / {} at 512 and {} / {} at "
        "1024".format(
            *(
                _ab_gain("fwd", 32768, N, w, "pdl=False", note=PDL_OFF)
                for N in (512, 1024)
                for w in ("bf16", "fp32")
            )
        ),
        # the fp32 weight's gap at 512 with and without PDL (A/B, plain, batched)
        "the overlap it is 0.986x of the bf16 weight, with it 0.970x": "the overlap it is {} of "
        "the bf16 weight, with it {}".format(
            *(
                x(
                    _ab_side("fwd", 32768, 512, "fp32", side, PDL_OFF)
                    / _ab_side("fwd", 32768, 512, "bf16", side, PDL_OFF)
                )
                for side in ("pdl=False", "A")
            )
        ),
        # section 2: the fp32 weight's register plan across the 8192-vector entry (A/B)
        "+2.2% at 65536, +3.0% at 49152 and +9.7% / +12.7% / +15.8% at 57344 / 40960 / 36864": (
            "{} at 65536, {} at 49152 and {} / {} / {} at 57344 / 40960 / 36864".format(
                *(
                    _ab_gain("fwd", 32768, N, "fp32", WIDE8192)
                    for N in (65536, 49152, 57344, 40960, 36864)
                )
            )
        ),
        # programmatic dependent launch, through CUDA graphs (A/B)
        "+4.7% / +5.8% at N = 256": f"{pdl(256, 'bf16')} / {pdl(256, 'fp32')} at N = 256",
        "+3.1% / +2.9% at 512": f"{pdl(512, 'bf16')} / {pdl(512, 'fp32')} at 512",
        "+1.7% / +0.0% at 1024": f"{pdl(1024, 'bf16')} / {pdl(1024, 'fp32')} at 1024",
        "(+3-6% through CUDA graphs at N = 256-512)": (
            f"(+{min(short_pdl):.0f}-{max(short_pdl):.0f}% through CUDA graphs at N = 256-512)"
        ),
        # the 8192-vector plan that the autotuner had picked at 65536 (A/B)
        "+12.1% over the old plan at 65536 where the pick's 128-thread CTAs ran +12.8%, and both "
        "+9.2% at 49152": "{} over the old plan at 65536 where the pick's 128-thread CTAs ran {}, "
        "and both {} at 49152".format(
            _ab_gain("fwd", 32768, 65536, "bf16", C4),
            _ab_gain("fwd", 32768, 65536, "bf16", T128),
            " and ".join(sorted({_ab_gain("fwd", 32768, 49152, "bf16", c) for c in (C4, T128)})),
        ),
        **_tuned_after_quotes(),
        "16 KiB a CTA), and at 512 256 threads a CTA at +3.5%": (
            "16 KiB a CTA), and at 512 256 threads a CTA at {}".format(
                _ab_gain("fwd", 32768, 512, "bf16", "num_threads=256", graph=True, note=SHORT_AB)
            )
        ),
        "2 row blocks and 2 buffers at +3.8%": "2 row blocks and 2 buffers at {}".format(
            _ab_gain("fwd", 32768, 256, "bf16", SHORT_BF16, graph=True)
        ),
        "(1.047x at 65536)": f"({x(res65['gbps'] / quack65['gbps'])} at 65536)",
        "(+2.4% over 4 blocks a CTA with a cluster barrier": "({} over 4 blocks a CTA with a "
        "cluster barrier".format(
            _ab_gain("fwd", 32768, 65536, "bf16", "exit_sync=False,blocks_per_cta=2", residual=True)
        ),
        "+4.2% at 131072 and +4.6% at 262144": "{} at 131072 and {} at 262144".format(
            _ab_gain("fwd", 16384, 131072, "bf16", "exit_sync=False,blocks_per_cta=2"),
            _ab_gain("fwd", 8192, 262144, "bf16", "exit_sync=False,blocks_per_cta=2"),
        ),
        # the exit barrier's own share of that gain (issue 50: it was credited with all of it)
        "Dropping the barrier alone gained +1.3% at 131072 and +0.8% at 262144": "Dropping the "
        "barrier alone gained {} at 131072 and {} at 262144".format(
            _ab_gain("fwd", 16384, 131072, "bf16", "exit_sync=False", note=EXIT_AB),
            _ab_gain("fwd", 8192, 262144, "bf16", "exit_sync=False", note=EXIT_AB),
        ),
        # the A/B runs that moved the heuristic (ab_configs.json)
        "131072 (+1.0%)": f"131072 ({_ab_gain('fwd', 16384, 131072, 'fp32', 'blocks_per_cta=8')})",
        "262144 (+8.7%)": f"262144 ({_ab_gain('fwd', 8192, 262144, 'fp32', 'blocks_per_cta=32')})",
        "+19% plain": f"{short(False)} plain",
        # section 2: the register weight loaded once per CTA, then shorter CTA lives
        "block measured -1.2% at 262144": "block measured {} at 262144".format(
            _ab_gain("fwd", 8192, 262144, "fp32", "weight_once=False")
        ),
        "2 blocks at 131072 (+3.3%)": "2 blocks at 131072 ({})".format(
            _ab_gain("fwd", 16384, 131072, "fp32", "blocks_per_cta=2")
        ),
        "and 4 at 262144 (+1.3%,": "and 4 at 262144 ({},".format(
            _ab_gain("fwd", 8192, 262144, "fp32", "blocks_per_cta=4,hint_cluster_weights=True")
        ),
        # section 5: what the autotuner picked
        **_tuned_quotes(),
        # x's copies under an L2 evict_last policy, against the kernel before
        "+2.4% to +5.3% at 13 of 14 rows": _l2hint_range(),
        "+3.7% at 8192": f"{_ab_gain('fwd', 32768, 8192, 'bf16', L2HINT)} at 8192",
        "+5.1% at 131072 with an fp32": (
            f"{_ab_gain('fwd', 16384, 131072, 'fp32', L2HINT)} at 131072 with an fp32"
        ),
        "-1.0% at 32768 x 65536": (
            f"{_ab_gain('fwd', 32768, 65536, 'bf16', L2HINT)} at 32768 x 65536"
        ),
        "+54% through a graph": f"{short(True)} through a graph",
        # section 8: the flat copy of an fp32 weight's slice (session 17's A/B runs)
        "+1.5% at 1024 and +1.3% at 2048": "{} at 1024 and {} at 2048".format(
            *(
                _ab_gain("fwd", 32768, N, "fp32", "flat_weight_copy=True", note=FLAT)
                for N in (1024, 2048)
            )
        ),
        "passed the registers plan by 1.1-1.6% in three runs": "passed the registers plan by "
        f"{min(smem512):.1f}-{max(smem512):.1f}% in three runs",
        "(`weight_after_x`, +0.4% at 512)": "(`weight_after_x`, {:+.1f}% at 512)".format(
            100
            * (
                _ab_side("fwd", 32768, 512, "fp32", "A", SWITCHES)
                / _ab_side("fwd", 32768, 512, "fp32", "weight_after_x=False", SWITCHES)
                - 1
            )
        ),
        "one CTA an SM (-22%, `ab_configs.json`)": "one CTA an SM ({}, `ab_configs.json`)".format(
            _ab_gain("fwd", 8192, 262144, "fp32", "weight_in_smem=True", digits=0, note=P262144)
        ),
        "has the fp32 weight's plan 2.25% longer": "has the fp32 weight's plan "
        f"{100 * (_ncu262('fp32', 0) / _ncu262('bf16', 0) - 1):.2f}% longer",
        "about as much (1.9%)": "about as much ({:.1f}%)".format(
            100 * (_ncu262("bf16", 1) / _ncu262("bf16", 0) - 1)
        ),
    }


FLAT = "Session 17, branch wip/flat-weight (afa9ba5"
SPLIT = "Session 18, branch wip/split-weight (1fe535f"
SWITCHES = "Session 17, the kernel of fd46a96"
P262144 = "Session 17, 8192 x 262144, plans for either weight"
SMEM512 = "num_threads=256,buffers=1,blocks_per_cta=1,weight_in_smem=True,flat_weight_copy=True"
REGS512 = "num_threads=128,buffers=2,blocks_per_cta=2,weight_in_smem=False"


def _smem512_over_regs() -> list[float]:
    """The fp32 weight at 32768 x 512, plain: the 256-thread shared-memory plan with the flat
    copy over the registers plan, % in each of session 17's three runs that timed both."""
    flat_runs = (FLAT, "Session 17, branch wip/flat-weight (53b4598")
    out = [
        100
        * (
            _ab_side("fwd", 32768, 512, "fp32", SMEM512, n)
            / _ab_side("fwd", 32768, 512, "fp32", "A", n)
            - 1
        )
        for n in flat_runs
    ]
    out.append(
        100
        * (
            _ab_side("fwd", 32768, 512, "fp32", "A", SWITCHES)
            / _ab_side("fwd", 32768, 512, "fp32", REGS512, SWITCHES)
            - 1
        )
    )
    return out  # fmt: skip


def _ncu262(wdt, nth) -> float:
    """Kernel time (ns) of the ``nth`` plan with weight ``wdt`` in fwd_ncu_262144.json."""
    rows = [r for r in results.load("fwd_ncu_262144")["rows"] if r["weight_dtype"] == wdt]
    return rows[nth]["metrics"]["gpu__time_duration.sum"]


def _other_run_262144() -> float:
    """fp32 / bf16 weight at 8192 x 262144 in the day's other run (fwd_final_after_x.json)."""
    shapes = results.load("fwd_final_after_x")["verdict"]["by_weight_dtype"]["fp32"]["shapes"]
    return next(e for e in shapes if e["N"] == 262144 and not e["graph"])["fp32_vs_bf16"]


AB = "ab_configs"
C4 = "cluster_n=4,weight_in_smem=True"
T128 = "threads_per_row=128,num_threads=128,cluster_n=4,weight_in_smem=True"
TUNED_AFTER = "fwd_tuned_65536"


def _row_us(kernel, N, wdt, graph) -> float:
    (row,) = results.rows(FINAL, kernel=kernel, N=N, weight_dtype=wdt, graph=graph)
    return row["us"]


def _rounds(N, wdt, graph) -> list[float]:
    """The library's per-round µs of one row of the record."""
    (row,) = results.rows(FINAL, kernel="lib", N=N, weight_dtype=wdt, graph=graph)
    return row["us_rounds"]


def _round_ratios(N, graph) -> list[float]:
    """fp32 / bf16 weight speed, round by round (the bench times a kernel's two weights back to
    back in a round)."""
    return [
        b / f for b, f in zip(_rounds(N, "bf16", graph), _rounds(N, "fp32", graph), strict=True)
    ]


def _round_gaps(N, graph) -> tuple[float, float]:
    """The least and most µs the fp32 weight's round took over the bf16 weight's beside it."""
    gaps = [
        f - b for b, f in zip(_rounds(N, "bf16", graph), _rounds(N, "fp32", graph), strict=True)
    ]
    return min(gaps), max(gaps)


def _levels2048() -> tuple[float, ...]:
    """2048 through a graph: the low level (< 69 µs) and the high one (> 72.5) over both weights,
    then the fp32 weight's rounds between (the bf16 weight has none there)."""
    both = _rounds(2048, "bf16", True) + _rounds(2048, "fp32", True)
    low, high = [u for u in both if u < 69], [u for u in both if u > 72.5]
    assert not [u for u in _rounds(2048, "bf16", True) if 69 <= u <= 72.5]
    mid = sorted(u for u in _rounds(2048, "fp32", True) if 69 <= u <= 72.5)
    assert len(mid) == 2 and min(high) > 1.06 * max(low)
    return min(low), max(low), min(high), max(high), *mid


WIDE8192 = "cluster_n=4,buffers=2,blocks_per_cta=2,weight_in_smem=False"
# the A/B that moved the narrow weight's short-row picks (later runs time the same variant
# names against those picks)
SHORT_AB = "Short rows (256-1024) through CUDA graphs, both weight dtypes, after the L2 policy"
PDL_OFF = "with ab_config's fixed host path (c7bf8ea): programmatic dependent launch off, plain"


def _tuned_after_quotes() -> dict[str, str]:
    """Section 5's re-tuning of 65536 (fwd_tuned_65536.json): the heuristic's place and how far
    behind the pick; how much slower 'None' (timed first) measured than its explicit twin."""
    t = _tuned((TUNED_AFTER,))
    nth = {1: "st", 2: "nd", 3: "rd"}

    def place(w):
        f = t[(65536, w)]
        return f"{f['place']}{nth.get(f['place'], 'th')} of {f['n']}, {f['behind']:.1f}% behind"

    slow = [
        100 * (e["candidates"]["None"] / e["candidates"][e["heuristic"]] - 1)
        for e in results.load(TUNED_AFTER)["autotune"].values()
    ]
    return {
        "3rd of 87, 0.1% behind the pick": f"{place('bf16')} the pick",
        "4th of 78, 0.4% behind": place("fp32"),
        "11-12% slower than its explicit twin": (
            f"{min(slow):.0f}-{max(slow):.0f}% slower than its explicit twin"
        ),
    }


SHORT_FP32 = "blocks_per_cta=2,buffers=2,weight_in_smem=False"
SHORT_BF16 = "threads_per_row=16,num_threads=256,buffers=2,blocks_per_cta=2"
LONG = (4096, 8192, 16384, 32768, 65536, 131072, 262144)
L2HINT = "x evict_last"


def _before_weight_once() -> str:
    """How far the fp32 weight was below the bf16 one at 131072 and 262144 before the weight
    was loaded once per CTA: the A/B run of weight_once, its variant (the old kernel) against
    the bf16 weight's side A of the same run, as 'a-b%'."""
    run = next(
        r for r in results.load(AB)["runs"] if "weight_once (session 13)" in r.get("note", "")
    )
    rows = {(r["N"], r["weight_dtype"]): r["sides"] for r in run["rows"]}
    loss = [
        100 * (1 - rows[(N, "fp32")]["weight_once=False"]["gbps"] / rows[(N, "bf16")]["A"]["gbps"])
        for N in (131072, 262144)
    ]
    return f"{min(loss):.0f}-{max(loss):.0f}%"


def _tuned(runs=TUNED_RUNS) -> dict:
    """(N, weight dtype) -> the tuning runs' facts: the pick's and the heuristic's ms (by the
    tuner's timing; 'None', the heuristic through the default path timed first, left out as the
    lesson's cell leaves it), the heuristic's place, candidates, GB/s of lib and lib-tuned and
    the tuned path's first call."""
    out = {}
    for name in runs:
        run = results.load(name)
        for key, entry in run["autotune"].items():
            f = dict(kv.split("=", 1) for kv in key.split(", "))
            N, w = int(f["N"]), {"bfloat16": "bf16", "float32": "fp32"}[f["weight"]]
            times = {c: ms for c, ms in entry["candidates"].items() if c != "None"}
            order = sorted(times, key=times.get)
            row = {
                k: results.rows(name, kernel=k, N=N, weight_dtype=w)[0]
                for k in ("lib", "lib-tuned")
            }
            out[(N, w)] = {
                "behind": 100 * (times[entry["heuristic"]] / times[order[0]] - 1),
                "place": order.index(entry["heuristic"]) + 1,
                "n": len(order),
                "bench": 100 * (row["lib-tuned"]["gbps"] / row["lib"]["gbps"] - 1),
                "first_call": row["lib-tuned"]["first_call_s"],
            }
    return out


def _tuned_quotes() -> dict[str, str]:
    t = _tuned()
    odd = (65536, "bf16")
    rest = [v for k, v in t.items() if k != odd]
    calls = [v["first_call"] for v in t.values()]
    return {
        "within 0.5-1.4% of the pick": "within {:.1f}-{:.1f}% of the pick".format(
            min(v["behind"] for v in rest), max(v["behind"] for v in rest)
        ),
        "within -0.3% to +1.4%": "within {} to {}".format(
            _fmt_gain(min(v["bench"] for v in rest)), _fmt_gain(max(v["bench"] for v in rest))
        ),
        "comes 38th of 87, 2.9% behind": "comes {}th of {}, {:.1f}% behind".format(
            t[odd]["place"], t[odd]["n"], t[odd]["behind"]
        ),
        "(+4.7%). It was the one shape": f"({_fmt_gain(t[odd]['bench'])}). It was the one shape",
        "(26-59 s here)": f"({min(calls):.0f}-{max(calls):.0f} s here)",
    }


def test_lesson06_the_tuner_beat_the_heuristic_at_one_key_only():
    """Section 5: "at five of the six keys" within 1.5%; the sixth is 65536, bf16 weight."""
    t = _tuned()
    assert len(t) == 6 and "At five of the six keys" in _prose06()
    assert [k for k, v in t.items() if v["behind"] > 1.5] == [(65536, "bf16")]
    # what the prose says of the two plans at 65536: the heuristic's one CTA an SM (128 KiB of
    # x), its weight too big to load before the sum (> 64 registers), the pick's three an SM
    import torch

    from quack_edu.config import FinalConfig
    from quack_edu.stages import final

    def config(text):  # "FinalConfig(threads_per_row=128, ..., weight_in_smem=True, ...)"
        fields = _plan(text)
        return FinalConfig(
            **{k: v == "True" if v in ("True", "False") else int(v) for k, v in fields.items()}
        )

    entry = next(
        e for k, e in results.load(TUNED)["autotune"].items() if "N=65536" in k and "weight=bf" in k
    )
    pick = min((ms, c) for c, ms in entry["candidates"].items() if c != "None")[1]
    bf16 = torch.bfloat16
    for text, ctas in ((entry["heuristic"], 1), (pick, 3)):
        k = final.FinalRMSNorm(bf16, 65536, config(text), bf16)
        assert k.ctas_per_sm() == ctas, (text, k.ctas_per_sm())
    heur = final.FinalRMSNorm(bf16, 65536, config(entry["heuristic"]), bf16)
    assert heur.tiling.rows_per_cta * heur.tiling.tile_cols * 2 == 128 << 10
    assert not heur.config.weight_in_smem and heur.weight_regs() > 64
    assert "128 KiB of `x` in shared memory so one CTA an SM" in _prose06()
    assert "(three CTAs an SM)" in _prose06()


def _fmt_gain(g: float) -> str:
    return f"{g:+.1f}%"


def _l2hint_range() -> str:
    """The A/B of x's L2 evict_last policy: its gains' range and how many rows gained."""
    l2 = [g for _, name, g in _ab_gains() if name == L2HINT]
    lo, hi = _fmt_gain(min(g for g in l2 if g > 0)), _fmt_gain(max(l2))
    return f"{lo} to {hi} at {sum(g > 0 for g in l2)} of {len(l2)} rows"


def _ab_gains(note=None):
    """(row, variant, gain over side A in %) for every timed variant of the A/B records (of
    the runs whose note contains ``note``, when given)."""
    for run in results.load(AB)["runs"]:
        if note is not None and note not in run.get("note", ""):
            continue
        for r in run["rows"]:
            for name, side in r["sides"].items():
                if name != "A" and side.get("gbps"):
                    yield r, name, 100 * (side["gbps"] / r["sides"]["A"]["gbps"] - 1)


def _ab_gain(pass_, M, N, wdt, variant, graph=False, digits=1, residual=False, note=None) -> str:
    """A variant's gain over side A in the A/B records, as '+x.y%': the last run that has it
    (with a residual, or a dresidual_out for the backward, only when ``residual``; among the
    runs whose note contains ``note``, when given)."""
    want = (pass_, M, N, wdt, graph, residual)
    gains = [
        g
        for r, name, g in _ab_gains(note)
        if name == variant
        and (r["pass"], r["M"], r["N"], r["weight_dtype"], r["graph"], r.get("residual", False))
        == want
    ]
    assert gains, (variant, want)
    return f"{gains[-1]:+.{digits}f}%"


def _ab_side(pass_, M, N, wdt, side, note, graph=False) -> float:
    """GB/s of one side of the A/B run whose note contains ``note``."""
    run = next(r for r in results.load(AB)["runs"] if note in r.get("note", ""))
    row = next(
        r
        for r in run["rows"]
        if (r["pass"], r["M"], r["N"], r["weight_dtype"], r["graph"]) == (pass_, M, N, wdt, graph)
    )
    return row["sides"][side]["gbps"]


@pytest.mark.parametrize("quoted", list(_recomputed06()) if results.load(FINAL) else [])
def test_lesson06_quoted_ratios_are_the_recorded_ones(quoted):
    assert _recomputed06()[quoted] == quoted
    assert quoted in _prose06()


def test_lesson06_short_row_plan_counts(monkeypatch):
    """Section 8's count of what the short-row picks changed (the cell prints the same). The
    counts are the H200's tables (the notes' records): on an H100 its own row picks N = 256."""
    import torch

    from quack_edu.config import FinalConfig
    from quack_edu.stages import final

    monkeypatch.setattr(final, "gpu_kind", lambda: "H200")
    bf16, M, sms = torch.bfloat16, 32768, 132

    def plan(N, cfg):
        k = final.FinalRMSNorm(bf16, N, cfg, bf16)
        rows = k.tiling.rows_per_cta * cfg.blocks_per_cta
        return k.grid_x(M), k.ctas_per_sm(), rows * N * 2 // 1024

    before = FinalConfig(32, 128, buffers=1, blocks_per_cta=1)
    now = {N: final.default_config(N, bf16, bf16) for N in (256, 512)}
    assert plan(256, before) == (8192, 16, 2) and plan(256, now[256]) == (1024, 8, 16)
    assert plan(512, before) == (8192, 16, 4) and plan(512, now[512]) == (4096, 8, 8)
    assert round(8192 / (sms * 16)) == 4 and 1024 <= sms * 8  # "about four waves", "one wave"
    prose = _prose06()
    for claim in (
        "from 8192 CTAs, about four waves of 16 an SM holding 2 KiB each",
        "(32 KiB of `x` an SM), to 1024, one wave of 8 an SM with up to 16 KiB",
        "At 512 the bytes an SM holds stay 64 KiB",
    ):
        assert claim in prose, claim


def test_lesson06_claims_on_the_recorded_sweeps():
    prose = _prose06()
    a = _sweep_a()
    best = {
        (N, w): max(r["gbps"] for r in results.rows(CONFIGS, **_sweep("final", N, w)))
        for N in BIG
        for w in ("bf16", "fp32")
    }
    # "within 3% of the same kernel's best with a bf16 weight at 65536 and 131072"
    assert "within 3%" in prose
    assert all(best[(N, "fp32")] >= 0.97 * best[(N, "bf16")] for N in BIG[:2])
    # "faster than QuACK's fp32-weight path at all three N"
    assert all(best[(N, "fp32")] > a[("quack", N, "fp32")] for N in BIG)
    # "At 262144 it is still 17% behind the bf16 weight (final kernel and cpasync)"
    assert "17%" in prose
    for bf16 in (best[(262144, "bf16")], a[("cpasync", 262144, "bf16")]):
        assert round(100 * (1 - best[(262144, "fp32")] / bf16)) == 17
    # the residual: "runs at its plain speed" (within 1.5% at each N), the same day
    assert "runs at its plain speed" in prose
    assert results.load(RESIDUAL)["date"] == results.load(FINAL)["date"]
    assert "(`fwd_final.json`, the same session)" in prose
    for N in RES_NS:
        res = results.rows(RESIDUAL, kernel="lib", N=N)[0]["gbps"]
        assert res >= 0.985 * results.rows(FINAL, **_lib("lib", N, "bf16"))[0]["gbps"]
    # "and ahead of QuACK" with the residual, at every N
    assert "and ahead of QuACK (" in prose
    for N in RES_NS:
        lib, quack = (results.rows(RESIDUAL, kernel=k, N=N)[0]["gbps"] for k in ("lib", "quack"))
        assert lib > quack
    # section 8 and the summary: ahead of QuACK at every shape with either weight
    shapes = {w: _verdict()["by_weight_dtype"][w]["shapes"] for w in ("bf16", "fp32")}
    assert "Ahead of QuACK at every shape (1.029" in prose
    assert "ahead of QuACK at every shape with either weight" in prose
    assert all(e["vs_quack"] > 1 for w in shapes for e in shapes[w])
    # "and within 1.5% of the best peer at every shape"
    assert "within 1.5% of the best peer at every shape." in prose
    assert all(e["vs_best_peer"] >= 0.985 for w in shapes for e in shapes[w])
    # "every CUDA-graph row is ahead of every peer"; "ahead of every peer through CUDA graphs"
    assert "every CUDA-graph row is ahead of every peer" in prose
    assert "ahead of every peer through CUDA graphs" in prose
    assert all(e["vs_best_peer"] > 1 for w in shapes for e in shapes[w] if e["graph"])
    # "within 2% of the bf16 weight's speed at every shape": no row below 0.98x; "that row is
    # the timing's more than the kernel's": 2048 through a graph, at two levels (_levels2048),
    # the round-by-round ratios' median within 1% and plain 2048 within 2%; "the gap is the
    # plan's" at 256: every fp32 round slower than the bf16 round beside it
    assert "within 2% of the bf16 weight's speed at every shape," in prose
    assert [e["N"] for e in shapes["fp32"] if e["fp32_vs_bf16"] < 0.98] == []
    assert "that row is the timing's more than the kernel's" in prose
    assert statistics.median(_round_ratios(2048, graph=True)) > 0.99
    assert _shape("fp32", 2048)["fp32_vs_bf16"] >= 0.98
    assert "At 256 through a graph the gap is the plan's" in prose
    assert _round_gaps(256, graph=True)[0] > 0
    # "The gap left at the long rows is the kernel's own, at 262144": in an earlier run of the
    # same command every fp32 round slower than every bf16 one (there the failing row), as here
    other = results.load("fwd_final_after_x")
    v_other = other["verdict"]["by_weight_dtype"]["fp32"]["shapes"]
    assert [(e["N"], e["graph"]) for e in v_other if e["fp32_vs_bf16"] < 0.98] == [(262144, False)]
    rounds = {
        w: next(
            r["us_rounds"]
            for r in other["rows"]
            if (r["kernel"], r["N"], r["weight_dtype"], r["graph"]) == ("lib", 262144, w, False)
        )
        for w in ("bf16", "fp32")
    }
    assert max(rounds["bf16"]) < min(rounds["fp32"])
    assert max(_rounds(262144, "bf16", False)) < min(_rounds(262144, "fp32", False))
    assert (
        "where every round of the fp32 weight was slower than every round of the bf16 one" in prose
    )
    # fwd_ncu_262144.json: "with the same L2 sectors and two CTAs an SM each"
    b, f = (r["metrics"] for r in results.load("fwd_ncu_262144")["rows"][:2])  # the heuristics'
    sectors = "lts__t_sectors_srcunit_tex_op_read.sum"
    assert abs(f[sectors] / b[sectors] - 1) < 0.01
    assert b["launch__registers_per_thread"] < 64 < f["launch__registers_per_thread"]
    occupancy = ("launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem")
    assert min(b[k] for k in occupancy) == min(f[k] for k in occupancy) == 2
    assert "with the same L2 sectors and two CTAs an SM each" in prose
    # fwd_ncu_65536.json: "the four fastest plans ... the link between the two halves of the
    # L2, busy 92% of the kernel's time"; "locked at their base, the fp32 weight's two plans take
    # 12-14% longer and the bf16 weight's 0-1%"
    ncu = sorted(
        results.load("fwd_ncu_65536")["rows"], key=lambda r: r["metrics"]["gpu__time_duration.sum"]
    )
    link = "lts__ltcfabric2ltc_cycles_active.avg.pct_of_peak_sustained_elapsed"
    busy = [r["metrics"][link] for r in ncu[:4]]
    assert f"busy {min(busy):.1f}-{max(busy):.1f}% of the kernel's time (`fwd_ncu_65536" in prose
    assert ncu[4]["metrics"][link] < min(busy) - 5  # the slowest plan is held elsewhere
    assert {r["weight_dtype"] for r in ncu[:4]} == {"bf16", "fp32"}
    t = "gpu__time_duration.sum"
    longer = {
        w: [100 * (r["metrics_base_clocks"][t] / r["metrics"][t] - 1) for r in ncu[:4]
            if r["weight_dtype"] == w]
        for w in ("bf16", "fp32")
    }  # fmt: skip
    assert [round(v) for v in sorted(longer["fp32"])] == [12, 14]
    assert [round(v) for v in sorted(longer["bf16"])] == [0, 1]
    assert "fp32 weight's two plans take 12-14% longer and the bf16 weight's 0-1%" in prose
    # "the fastest candidate with an fp32 weight is 1.5% slower than the fastest with a bf16 one,
    # and the heuristic's plan is 0.4% behind it" (section 5's re-tuning of 65536)
    best = {}
    for key, entry in results.load(TUNED_AFTER)["autotune"].items():
        best["bf16" if "weight=bfloat16" in key else "fp32"] = min(
            ms for c, ms in entry["candidates"].items() if c != "None"
        )
    slower = f"{100 * (best['fp32'] / best['bf16'] - 1):.1f}%"
    assert f"an fp32 weight is {slower} slower than the fastest with a bf16 one" in prose
    assert "and the heuristic's plan is 0.4% behind it" in prose
    assert "fp32 weight 4th of 78, 0.4% behind" in prose  # the same 0.4%, section 5's quote
    # plain rows timed in batches of back-to-back calls: 10 rounds (twice the record's 5);
    # "at 512 it is the kernel's" (a call longer than the host's per tiny call), "at 256 the two
    # are close" (plain within 10% of the graph row); the library's host cost below QuACK's
    run = results.load(FINAL)
    assert run["rounds_launch_bound"] == 10 and run["plain_batch_s"] == 1e-3
    assert "a median round of" in prose  # of 10 (_recomputed06 checks the numbers)
    host = {(o["kernel"], o["M"], o["weight_dtype"]): o["us_per_call"] for o in run["overhead"]}
    assert all(
        host[("lib", M, w)] < host[("quack", M, w)] for M in (1, 8) for w in ("bf16", "fp32")
    )
    lib_host = [v for (k, *_), v in host.items() if k == "lib"]
    assert "At 512 it is the kernel's" in prose and "At 256 in this run it is the host's" in prose
    assert _row_us("lib", 512, "bf16", False) > max(lib_host)
    assert _row_us("lib", 256, "bf16", False) >= max(lib_host) > _row_us("lib", 256, "bf16", True)
    # the verdict: every criterion this file judges met (the residual's N/A here); with the
    # residual's file, PASS
    checks = {c["name"]: c["status"] for c in _verdict()["checks"]}
    assert [st for st in checks.values() if st != "PASS"] == ["N/A"]
    assert "Every criterion of the verdict that this file can judge is met" in prose
    from quack_edu.tools import bench

    summary = bench.summarize([results.results_dir() / f"{n}.json" for n in (FINAL, RESIDUAL)])
    assert "overall: PASS" in summary
    assert "`quack-edu bench --summarize` of the two files reads PASS" in prose
    # "Earlier runs of the same command that day failed the fp32 criterion by one row": at 262144
    # on the other kernel (checked above); the note names both
    assert "failed the fp32 criterion by one row" in prose
    assert "on a kernel that also put a bf16 weight's slice after `x`, at 262144 (0.977x)" in prose


def test_lesson06_reads_two_records_and_says_what_they_are():
    """Lesson 06 measures from two records, and its words about them hold."""
    nb = read(solutions_dir() / f"{L06}.ipynb")
    code = " ".join(c.source for c in nb.cells if c.cell_type == "code")
    assert set(re.findall(r'results\.load\("([\w.]+)"\)', code)) == {CONFIGS, FINAL}
    prose = _words(_prose(L06))
    configs, final_run = results.load(CONFIGS), results.load(FINAL)
    # "the same H200 a day later", "each row timed in 5 rounds"
    assert configs["gpu"] == final_run["gpu"] == "NVIDIA H200"
    days = datetime.date.fromisoformat(final_run["date"]) - datetime.date.fromisoformat(
        configs["date"]
    )
    assert days.days == 1 and "the same H200 a day later" in prose
    assert final_run["rounds"] == 5 and "each row timed in 5 rounds" in prose
    # sweep A's shapes: "M = 32768, or 16384 x 131072 and 8192 x 262144"
    ms = {(r["N"], r["M"]) for r in results.rows(CONFIGS, sweep="A") if r["N"] in BIG}
    assert ms == {(65536, 32768), (131072, 16384), (262144, 8192)}
    assert "M = 32768, or 16384 x 131072 and 8192 x 262144" in prose
    # "At 262144 two buffers of a row block fill the SM's shared memory: one CTA an SM"
    from quack_edu.config import FinalConfig
    from quack_edu.stages import final

    best = max(results.rows(CONFIGS, **_sweep("final", 262144, "fp32")), key=lambda r: r["gbps"])
    p = {k: int(v) for k, v in _plan(best["config"]).items()}
    k = final.FinalRMSNorm(torch.bfloat16, 262144, FinalConfig(**p), torch.float32)
    assert p["buffers"] == 2 and k.ctas_per_sm() == 1
    assert "one CTA an SM is all that fits" in prose
    # "with 8 blocks a CTA": the best plan at every N of the quoted three
    for N in BIG:
        top = max(results.rows(CONFIGS, **_sweep("final", N, "fp32")), key=lambda r: r["gbps"])
        assert _plan(top["config"])["blocks_per_cta"] == "8", N
    assert "With 8 blocks a CTA the fp32 weight runs at" in prose


def _verdict() -> dict:
    return results.load(FINAL)["verdict"]


# --- docs/benchmarks.md, "Results recorded on an H200 / The library" ------------------------------
PEER_NAMES = {
    "quack": "QuACK",
    "torch-compile": "torch.compile",
    "liger": "Liger",
    "torch-eager": "F.rms_norm",
}


RES_NS = (4096, 16384, 65536)


def _readme() -> str:
    """docs/benchmarks.md: the recorded results the README once held."""
    return (ROOT / "docs" / "benchmarks.md").read_text()


def _readme_library_rows() -> list[str]:
    """The README's table of fwd_final.json, line by line, as it must read."""

    def gbps(kernel, N, wdt):
        rows = results.rows(FINAL, kernel=kernel, N=N, weight_dtype=wdt, graph=False)
        return rows[0].get("gbps") or 0 if rows else 0  # a peer that failed (Liger > 65536): 0

    lines = []
    for r in results.rows(FINAL, kernel="lib", weight_dtype="bf16", graph=False):
        N, cells = r["N"], [str(r["N"])]
        for w in ("bf16", "fp32"):
            lib = results.rows(FINAL, kernel="lib", N=N, weight_dtype=w, graph=False)[0]
            best, who = max((gbps(p, N, w), p) for p in PEER_NAMES)
            cells += [
                f"{lib['gbps']:.0f} ({lib['pct_copy']:.1f}%)",
                f"{gbps('quack', N, w):.0f}",
                f"{PEER_NAMES[who]} {best:.0f}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def test_readme_library_table_is_the_recorded_run():
    lines = _readme_library_rows()
    assert len(lines) == 11
    readme = _readme()
    for line in lines:
        assert line in readme, line


def _three(run) -> str:
    """The library's first calls at N = 3000 in fresh processes: 'a, b and c s'."""
    c = next(c for c in run["compile"] if (c["kernel"], c["N"]) == ("lib", 3000))
    each = [f"{s:.2f}" for s in c["fresh_s"]]
    return ", ".join(each[:-1]) + f" and {each[-1]} s"


@functools.cache  # read the records once a process, not once a quote
def _readme_quotes() -> dict[str, str]:
    """Every other number the README quotes from the library's runs -> recomputed."""
    from quack_edu.tools import bench

    run = results.load(FINAL)
    v = run["verdict"]["by_weight_dtype"]

    def x(r):
        return f"{r:.3f}x"

    def us(data, kernel):
        o = next(
            o
            for o in data["overhead"]
            if (o["kernel"], o["M"], o["weight_dtype"]) == (kernel, 1, "bf16")
        )
        return f"{o['us_per_call']:.1f}"

    def first_call(kernel):
        c = next(c for c in run["compile"] if (c["kernel"], c["N"]) == (kernel, 3000))
        return f"{c['compile_s']:.2f} s"

    res = {
        k: " / ".join(f"{results.rows(RESIDUAL, kernel=k, N=N)[0]['gbps']:.0f}" for N in RES_NS)
        for k in ("lib", "quack")
    }

    def peer(kernel, N, wdt, graph):
        return results.rows(FINAL, kernel=kernel, N=N, weight_dtype=wdt, graph=graph)[0]["gbps"]

    bf16_copy = [_shape("bf16", N)["pct_copy"] for N in (4096, 8192, 16384, 32768, 65536)]
    fp32_bf16 = [e["fp32_vs_bf16"] for e in v["fp32"]["shapes"]]

    def fresh(kernel):
        c = next(c for c in run["compile"] if (c["kernel"], c["N"]) == (kernel, 3000))
        return f"{c['fresh_median_s']:.2f} s"

    failing = [
        (w, e["N"], e["graph"])
        for w in ("bf16", "fp32")
        for e in v[w]["shapes"]
        if e["vs_best_peer"] < 0.985 or e.get("fp32_vs_bf16", 1) < 0.98
    ]
    behind = [(w, e["N"], e["graph"]) for w in v for e in v[w]["shapes"] if e["vs_quack"] <= 1]
    worst = min((e["fp32_vs_bf16"], e["N"], e["graph"]) for e in v["fp32"]["shapes"])
    graph_ahead = all(e["vs_best_peer"] > 1 for w in v for e in v[w]["shapes"] if e["graph"])
    return {
        "(2026-12-01, D2D copy 4227 GB/s, 5 rounds, 10 at N <= 2048)": (
            f"({run['date']}, D2D copy {run['copy_gbps']:.0f} GB/s, {run['rounds']} rounds, "
            f"{run['rounds_launch_bound']} at N <= 2048)"
        ),
        "1.082x with a bf16 weight": f"{x(v['bf16']['geomean_vs_quack'])} with a bf16 weight",
        "1.155x with an fp32": f"{x(v['fp32']['geomean_vs_quack'])} with an fp32",
        "(1.083x and 1.139x counting": (
            f"({x(v['bf16']['geomean_vs_quack_all'])} and "
            f"{x(v['fp32']['geomean_vs_quack_all'])} counting"
        ),
        # the run's own verdict leaves the residual N/A; with the residual's file it is PASS
        "is PASS with the residual run beside it": "is {} with the residual run beside it".format(
            "PASS"
            if not failing
            and "overall: PASS"
            in bench.summarize([results.results_dir() / f"{n}.json" for n in (FINAL, RESIDUAL)])
            else failing
        ),
        "the closest row is an fp32 weight at N = 2048 (graph), 0.980x of the bf16 weight's "
        "speed": "the closest row is an fp32 weight at N = {} ({}), {} of the bf16 weight's "
        "speed".format(worst[1], "graph" if worst[2] else "plain", x(worst[0])),
        "and 0.981x at 256 (graph) and 0.982x at 262144 are next": "and {} are next".format(
            " and ".join(
                f"{x(r)} at {N}{' (graph)' if g else ''}"
                for r, N, g in sorted(
                    (e["fp32_vs_bf16"], e["N"], e["graph"]) for e in v["fp32"]["shapes"]
                )[1:3]
            )
        ),
        "Every CUDA-graph row is ahead of every peer with either weight.": (
            "Every CUDA-graph row is ahead of every peer with either weight."
            if graph_ahead
            else "Not every CUDA-graph row is ahead of every peer."
        ),
        "Ahead of QuACK at every shape with either weight.": (
            "Ahead of QuACK at every shape with either weight." if not behind else str(behind)
        ),
        "100.1-102.5% of the copy from 4096 to 65536": (
            f"{min(bf16_copy):.1f}-{max(bf16_copy):.1f}% of the copy from 4096 to 65536"
        ),
        "(+12.1% in an A/B against the table's old one)": "({} in an A/B against the table's old "
        "one)".format(_ab_gain("fwd", 32768, 65536, "bf16", "cluster_n=4,weight_in_smem=True")),
        "(1.270x, 1.353x at 131072": (
            f"({x(_shape('fp32', 131072)['vs_quack'])}, "
            f"{x(_shape('fp32', 262144)['vs_quack'])} at 131072"
        ),
        "within 2% of its own bf16-weight speed at every shape (0.980x at the closest)": (
            ("within 2%" if min(fp32_bf16) >= 0.98 else "not within 2%")
            + f" of its own bf16-weight speed at every shape ({x(min(fp32_bf16))} at the closest)"
        ),
        "0.995x at 65536, where it now has a plan of its own": "{} at 65536, where it now has a "
        "plan of its own".format(x(_shape("fp32", 65536)["fp32_vs_bf16"])),
        "(clusters of 4, the weight in registers: +2.2% in an A/B": "(clusters of 4, the weight in "
        "registers: {} in an A/B".format(_ab_gain("fwd", 32768, 65536, "fp32", WIDE8192)),
        "0.982x at 262144, where the long rows meet": (
            f"{x(_shape('fp32', 262144)['fp32_vs_bf16'])} at 262144, where the long rows meet"
        ),
        "0.993x at 512 plain and 1.000x through a graph": "{} at 512 plain and {} through a "
        "graph".format(*(x(_shape("fp32", 512, graph=g)["fp32_vs_bf16"]) for g in (False, True))),
        "(+1.3-1.5% at 1024-2048 in an A/B)": "(+{:.1f}-{:.1f}% at 1024-2048 in an A/B)".format(
            *sorted(
                float(_ab_gain("fwd", 32768, N, "fp32", "flat_weight_copy=True", note=FLAT)[:-1])
                for N in (1024, 2048)
            )
        ),
        "at 262144 instead (0.977x, every round of the fp32 weight slower": (
            f"at 262144 instead ({x(_other_run_262144())}, every round of the fp32 weight slower"
        ),
        "N = 256 gives 3635 GB/s (torch.compile 3465, QuACK 3322)": "N = 256 gives {:.0f} GB/s "
        "(torch.compile {:.0f}, QuACK {:.0f})".format(
            _shape("bf16", 256, graph=True)["gbps"],
            peer("torch-compile", 256, "bf16", True),
            _shape("bf16", 256, graph=True)["quack_gbps"],
        ),
        "programmatic dependent launch (+4.7% in an A/B)": (
            "programmatic dependent launch ({} in an A/B)".format(
                _ab_gain("fwd", 32768, 256, "bf16", "pdl=True", graph=True)
            )
        ),
        "14.1 us": f"{us(run, 'lib')} us",
        "QuACK's 17.4": f"QuACK's {us(run, 'quack')}",
        "took 0.77 s in the benchmark's process, QuACK's 0.67 s": (
            f"took {first_call('lib')} in the benchmark's process, QuACK's {first_call('quack')}"
        ),
        "0.97 s in fresh processes (median of 3, QuACK's 0.74 s; the library's three: 1.00, 0.76 "
        "and 0.97 s)": "{} in fresh processes (median of 3, QuACK's {}; the library's three: "
        "{})".format(fresh("lib"), fresh("quack"), _three(run)),
        "(`fwd_final_residual.json`, the same day;": (
            "(`fwd_final_residual.json`, the same day;"
            if results.load(RESIDUAL)["date"] == run["date"]
            else "(`fwd_final_residual.json`, another day;"
        ),
        "+2.4% to +5.3% at 13 of 14 rows": _l2hint_range(),
        "4231 / 4275 / 4314 GB/s": f"{res['lib']} GB/s",
        "QuACK 4063 / 4115 / 4120": f"QuACK {res['quack']}",
    }


@pytest.mark.parametrize("quoted", list(_readme_quotes()) if results.load(FINAL) else [])
def test_readme_library_quotes_are_the_recorded_ones(quoted):
    assert _readme_quotes()[quoted] == quoted
    assert quoted in " ".join(_readme().split())


# --- lesson 07: the backward's recorded run (bwd_final.json) and its computed claims ---------
L07 = "07_backward"
BWD = "bwd_final"


def _prose07() -> str:
    """Lesson 07's markdown and its appendix (docs/07_design_notes.md), where the design notes
    and their numbers went."""
    notes = (ROOT / "docs" / "07_design_notes.md").read_text()
    return " ".join((_prose(L07) + "\n" + notes).split())


def _bwd(kernel, N, wdt="bf16"):
    rows = results.rows(BWD, kernel=kernel, N=N, weight_dtype=wdt, graph=False)
    assert len(rows) == 1, rows
    return rows[0]


BWD_RES = "bwd_final_residual"


def _readme_prenorm_quotes() -> dict[str, str]:
    """The README's prenorm backward (bwd_final_residual.json, and the A/B of its invariant
    dresidual_out loads in ab_configs.json)."""
    run = results.load(BWD_RES)

    def gbps(kernel, w):
        return " / ".join(
            f"{results.rows(BWD_RES, kernel=kernel, N=N, weight_dtype=w)[0]['gbps']:.0f}"
            for N in RES_NS
        )

    gains = {  # invariant loads (side A) over the plain ones they replaced
        (r["N"], r["weight_dtype"]): 100 * (r["sides"]["A"]["gbps"] / side["gbps"] - 1)
        for r, name, _ in _ab_gains()
        if r.get("residual") and name == "invariant_loads=False"
        for side in [r["sides"][name]]
    }
    bf16 = [g for (N, w), g in gains.items() if w == "bf16"]
    return {
        "2026-12-01, D2D copy 4225 GB/s": f"{run['date']}, D2D copy {run['copy_gbps']:.0f} GB/s",
        "4011 / 4198 / 3953 GB/s": f"{gbps('lib', 'bf16')} GB/s",
        "QuACK's 3869 / 3324 / 2208": f"QuACK's {gbps('quack', 'bf16')}",
        "3981 / 4332 / 3377 against 3845 / 3676 / 3390": (
            f"{gbps('lib', 'fp32')} against {gbps('quack', 'fp32')}"
        ),
        "+10-21% with a bf16 weight": f"+{min(bf16):.0f}-{max(bf16):.0f}% with a bf16 weight",
        "+0.4% with an fp32 one": f"+{gains[(65536, 'fp32')]:.1f}% with an fp32 one",
    }


def _weight_ahead_losses() -> list[float]:
    """Gains (%, all negative) of issuing an L2-read fp32 weight's loads ahead of the dx stores
    (ld.global.nc, weight_prefetch, both) in the backward A/B that measured them."""
    run = next(r for r in results.load(AB)["runs"] if "weight_prefetch" in r["command"])
    return [
        g
        for r, name, g in _ab_gains()
        if r in run["rows"] and "refill_early" not in name and not r.get("residual")
    ]


def _bwd_sum_quotes() -> dict[str, str]:
    """What bwd_sum.json says of the second reduction at N = 256-1024: microseconds it adds to
    the backward (kernel then sum, against the kernel alone, through CUDA graphs)."""
    rows = [r for r in results.load("bwd_sum")["rows"] if r["N"] <= 1024]

    def added(how):
        return [r["us"][f"kernel + {how}"] - r["us"]["kernel"] for r in rows]

    ours, torch_ = added("sum_partials"), added("torch.sum")
    kernel = [r["us"]["kernel"] for r in rows]
    return {
        "torch's sum and cast added 4.0-7.9 µs to a kernel of 18-56 µs, `sum_partials` adds "
        "1.4-2.6 µs": (
            f"torch's sum and cast added {min(torch_):.1f}-{max(torch_):.1f} µs to a kernel of "
            f"{min(kernel):.0f}-{max(kernel):.0f} µs, `sum_partials` adds "
            f"{min(ours):.1f}-{max(ours):.1f} µs"
        ),
        "it adds 1.4-2.6 us to the backward where torch's sum and cast added 4.0-7.9 us": (
            f"it adds {min(ours):.1f}-{max(ours):.1f} us to the backward where torch's sum and "
            f"cast added {min(torch_):.1f}-{max(torch_):.1f} us"
        ),
    }


def _grid_gains() -> str:
    """The persistent grid of one wave against the old estimate (ab_configs.json, the
    scripts/bwd_grid.py run), at 131072 and 262144, both weights: "lo-hi%"."""
    runs = results.load("ab_configs")["runs"]
    (run,) = [r for r in runs if r["command"].startswith("python3 scripts/bwd_grid.py")]
    gains = [
        100 * (side["gbps"] / row["sides"]["A"]["gbps"] - 1)
        for row in run["rows"]
        if row["N"] >= 131072
        for name, side in row["sides"].items()
        if name.startswith("grid=R (")
    ]
    assert len(gains) == 4
    return f"{min(gains):.0f}-{max(gains):.0f}%"


@functools.cache  # read the records once a process, not once a quote
def _recomputed07() -> dict[str, str]:
    """Every number lesson 07's prose quotes -> the same, recomputed from bwd_final.json (the
    recorded run) or from the package (byte counts, partial rows), formatted as the prose does."""
    import torch

    from quack_edu.lessons import bwd_strategies as bs
    from quack_edu.tools.bench import rmsnorm_bwd_bytes

    run = results.load(BWD)
    v = run["verdict"]["by_weight_dtype"]["bf16"]
    nbytes = rmsnorm_bwd_bytes(32768, 4096, torch.bfloat16)
    mid = [_bwd("lib", N)["pct_copy"] for N in (8192, 16384, 32768, 65536)]
    need = {N: rmsnorm_bwd_bytes(32768, N, torch.bfloat16) for N in bs.RECORD_NS}
    extra = {
        (s, N): 100 * bs.partial_bytes(s, 32768, N) / need[N]
        for s in bs.STRATEGIES
        for N in bs.RECORD_NS
    }
    persistent = [bs.partial_rows("persistent", 32768, N) for N in bs.RECORD_NS]
    rb = [extra[("row_blocks", N)] for N in bs.RECORD_NS]
    pe = [extra[("persistent", N)] for N in bs.RECORD_NS]
    losses = [-g for g in _weight_ahead_losses()]
    prenorm = _readme_prenorm_quotes()
    return {
        "4227 GB/s": f"{run['copy_gbps']:.0f} GB/s",
        "768.1 MiB": f"{nbytes / 2**20:.1f} MiB",
        "191 us": f"{nbytes / run['copy_gbps'] / 1e3:.0f} us",
        "3964 GB/s, 93.8% of the copy": (
            f"{_bwd('lib', 4096)['gbps']:.0f} GB/s, "
            f"{_bwd('lib', 4096)['pct_copy']:.1f}% of the copy"
        ),
        "(QuACK 3484)": f"(QuACK {_bwd('quack', 4096)['gbps']:.0f})",
        "96.7-100.5% of the copy": f"{min(mid):.1f}-{max(mid):.1f}% of the copy",
        "4246 GB/s at 16384 (100.5%, QuACK 2768)": (
            f"{_bwd('lib', 16384)['gbps']:.0f} GB/s at 16384 "
            f"({_bwd('lib', 16384)['pct_copy']:.1f}%, QuACK {_bwd('quack', 16384)['gbps']:.0f})"
        ),
        "1.513x": f"{v['geomean_vs_quack']:.3f}x",
        "verdict is PASS": f"verdict is {run['verdict']['overall']}",
        "N = 512 at 2.027x": f"N = 512 at {_shape_bwd(512)['vs_quack']:.3f}x",
        "N = 1024 at 1.270x": f"N = 1024 at {_shape_bwd(1024)['vs_quack']:.3f}x",
        "N = 1024 with an fp32 weight is at 1.019x": (
            f"N = 1024 with an fp32 weight is at {_shape_bwd(1024, 'fp32', True)['vs_quack']:.3f}x"
        ),
        "gained 1.5% at most": f"gained {_ab_best('weight_smem_vecs'):.1f}% at most",
        "measured 9-15% slower": f"measured {min(losses):.0f}-{max(losses):.0f}% slower",
        "+10-21% with a bf16 weight (`ab_configs.json`)": (
            f"{prenorm['+10-21% with a bf16 weight']} (`ab_configs.json`)"
        ),
        "runs at 4011 / 4198 / 3953 GB/s": f"runs at {prenorm['4011 / 4198 / 3953 GB/s']}",
        "QuACK's 3869 / 3324 / 2208.": prenorm["QuACK's 3869 / 3324 / 2208"] + ".",
        "82.3% and 80.9% of the copy": (
            f"{_bwd('lib', 131072, 'fp32')['pct_copy']:.1f}% and "
            f"{_bwd('lib', 262144, 'fp32')['pct_copy']:.1f}% of the copy"
        ),
        "gained +11-18% at 131072 and 262144": f"gained +{_grid_gains()} at 131072 and 262144",
        **{k: v for k, v in _bwd_sum_quotes().items() if "µs" in k},
        # section 4: the partial rows and bytes the strategies cost (M = 32768, bf16)
        "P = 32768": f"P = {bs.partial_rows('row_blocks', 32768, 4096)}",
        "133% on top of the backward's 768 MiB": (
            f"{extra[('row_blocks', 4096)]:.0f}% on top of the backward's {nbytes / 2**20:.0f} MiB"
        ),
        "528 rows (4 CTAs on each of 132 SMs) cost 2.2%": (
            f"{persistent[1]} rows ({persistent[1] // 132} CTAs on each of 132 SMs) cost "
            f"{extra[('persistent', 4096)]:.1f}%"
        ),
        "132 to 528 rows": f"{min(persistent)} to {max(persistent)} rows",
        "0.5-2.2%": f"{min(pe):.1f}-{max(pe):.1f}%",
        "17-133%": f"{min(rb):.0f}-{max(rb):.0f}%",
    }


def _shape_bwd(N, wdt="bf16", graph=False) -> dict:
    es = results.load(BWD)["verdict"]["by_weight_dtype"][wdt]["shapes"]
    return next(e for e in es if e["N"] == N and e["graph"] == graph)


def _ab_best(field: str) -> float:
    """The largest gain (%) over side A of any A/B variant that sets ``field``."""
    return max(g for _, name, g in _ab_gains() if field in name)


@pytest.mark.parametrize("quoted", list(_recomputed07()) if results.load(BWD) else [])
def test_lesson07_quotes_are_the_recorded_and_computed_ones(quoted):
    assert _recomputed07()[quoted] == quoted
    assert quoted in _prose07()


def test_lesson07_says_what_to_do_without_the_strategies_record():
    """bwd_dw_strategies.json is printed by a cell (bwd_strategies.table); until it is recorded
    the lesson says so, and quotes none of it."""
    prose = _prose07()
    assert "bwd_dw_strategies.json" in prose
    if results.load("bwd_dw_strategies") is None:
        assert "has not been recorded yet" in prose
        assert "What the H200 recorded" not in prose


def _recomputed07_strategies() -> dict[str, str]:
    """What lesson 07's prose quotes from bwd_dw_strategies.json, recomputed from it."""
    from quack_edu.lessons import bwd_strategies as bs

    rec = results.load("bwd_dw_strategies")

    def row(strategy, N):
        (r,) = [r for r in rec["rows"] if r["strategy"] == strategy and r["N"] == N]
        return r

    ns = sorted({r["N"] for r in rec["rows"]})
    gain = [100 * (row("atomic", N)["gbps"] / row("persistent", N)["gbps"] - 1) for N in ns]
    distinct = {row("atomic", N)["distinct_dw"] for N in ns}
    assert all(row(s, N)["deterministic"] for s in ("row_blocks", "persistent") for N in ns)
    return {
        "by 1-8% over the persistent partials": (
            f"by {min(gain):.0f}-{max(gain):.0f}% over the persistent partials"
        ),
        "(3932 against 3809 GB/s at N = 4096)": (
            f"({row('atomic', 4096)['gbps']:.0f} against "
            f"{row('persistent', 4096)['gbps']:.0f} GB/s at N = 4096)"
        ),
        "gave 3 different dw in 3 runs": f"gave {min(distinct)} different dw in "
        f"{row('atomic', 4096)['runs']} runs",
        "ran at 37% of the copy at N = 4096": (
            f"ran at {row('row_blocks', 4096)['pct_copy']:.0f}% of the copy at N = 4096"
        ),
        "the persistent grid's 90%": (
            f"the persistent grid's {row('persistent', 4096)['pct_copy']:.0f}%"
        ),
        "(6.3e-4 at N = 1024, against 1.1e-4": (
            f"({row('atomic', 1024)['max_abs_err']:.1e} at N = 1024, against "
            f"{row('persistent', 1024)['max_abs_err']:.1e}"
        ).replace("e-04", "e-4"),
        # the record's P beside the bytes table's (today's kernel), and the rows a CTA of each
        "(at N = 1024 its P is 8192, not the table's 4096: that day's kernel took 4 rows a CTA, "
        "today's 8)": (
            f"(at N = 1024 its P is {row('row_blocks', 1024)['P']}, not the table's "
            f"{bs.partial_rows('row_blocks', 32768, 1024)}: that day's kernel took "
            f"{32768 // row('row_blocks', 1024)['P']} rows a CTA, today's "
            f"{32768 // bs.partial_rows('row_blocks', 32768, 1024)})"
        ),
    }


@pytest.mark.parametrize(
    "quoted", list(_recomputed07_strategies()) if results.load("bwd_dw_strategies") else []
)
def test_lesson07_strategy_quotes_are_the_recorded_ones(quoted):
    assert _recomputed07_strategies()[quoted] == quoted
    assert quoted in _prose07()


# --- docs/benchmarks.md, "Results recorded on an H200 / The library's backward" (bwd_final.json)


def _readme_bwd_rows() -> list[str]:
    """The README's table of bwd_final.json, line by line, as it must read."""
    lines = []
    for r in results.rows(BWD, kernel="lib", weight_dtype="bf16", graph=False):
        cells = [str(r["N"])]
        for w in ("bf16", "fp32"):
            lib = _bwd("lib", r["N"], w)
            cells += [f"{lib['gbps']:.0f} ({lib['pct_copy']:.1f}%)"]
            cells += [f"{_bwd(k, r['N'], w)['gbps']:.0f}" for k in ("quack", "torch-compile")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def test_readme_backward_table_is_the_recorded_run():
    if results.load(BWD) is None:
        pytest.skip("bwd_final.json is not recorded")
    lines = _readme_bwd_rows()
    assert len(lines) == 11
    readme = _readme()
    for line in lines:
        assert line in readme, line


def _readme_bwd_quotes() -> dict[str, str]:
    run = results.load(BWD)
    v = run["verdict"]["by_weight_dtype"]

    def graph(kernel, N):
        return results.rows(BWD, kernel=kernel, N=N, weight_dtype="bf16", graph=True)[0]["gbps"]

    ns = (256, 512, 1024)
    return {
        "D2D copy 4227 GB/s": f"D2D copy {run['copy_gbps']:.0f} GB/s",
        "1.513x (bf16 weight)": f"{v['bf16']['geomean_vs_quack']:.3f}x (bf16 weight)",
        "1.423x (fp32 weight)": f"{v['fp32']['geomean_vs_quack']:.3f}x (fp32 weight)",
        "1.413x and 1.323x": (
            f"{v['bf16']['geomean_vs_quack_all']:.3f}x and {v['fp32']['geomean_vs_quack_all']:.3f}x"
        ),
        "2539 / 2947 / 3523 GB/s against 1863 / 2631 / 3257": (
            " / ".join(f"{graph('lib', N):.0f}" for N in ns)
            + " GB/s against "
            + " / ".join(f"{graph('quack', N):.0f}" for N in ns)
        ),  # fmt: skip
        "way, 1897 / 2406 / 2798": "way, "
        + " / ".join(f"{graph('torch-compile', N):.0f}" for N in ns),
        "82.3% and 80.9% of the copy": (
            f"{_bwd('lib', 131072, 'fp32')['pct_copy']:.1f}% and "
            f"{_bwd('lib', 262144, 'fp32')['pct_copy']:.1f}% of the copy"
        ),
        "1.019x QuACK": f"{_shape_bwd(1024, 'fp32', True)['vs_quack']:.3f}x QuACK",
        "is PASS on every criterion": f"is {run['verdict']['overall']} on every criterion",
        **{k: v for k, v in _bwd_sum_quotes().items() if "µs" not in k},
        "(+11-18% at 131072 and 262144": f"(+{_grid_gains()} at 131072 and 262144",
        **_readme_prenorm_quotes(),
    }


@pytest.mark.parametrize("quoted", list(_readme_bwd_quotes()) if results.load(BWD) else [])
def test_readme_backward_quotes_are_the_recorded_ones(quoted):
    assert _readme_bwd_quotes()[quoted] == quoted
    assert quoted in " ".join(_readme().split())


# --- docs/benchmarks.md's ladder: ladder.json, every stage and peer, both passes, both weights ----
SWEEP = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
LADDER_SHAPES = [(N, False) for N in SWEEP] + [(N, True) for N in SWEEP[:4]]
LADDER_TABLES = {  # (pass, weight dtype, title): columns (kernel, heading)
    ("fwd", "bf16"): [("naive", "naive"), ("warp", "warp"), ("block", "block"),
                      ("cluster", "cluster"), ("cpasync", "cpasync"), ("final", "final"),
                      ("quack", "QuACK"), ("torch-compile", "torch.compile"), ("liger", "Liger"),
                      ("torch-ops", "PyTorch ops")],
    ("fwd", "fp32"): [("block", "block"), ("cluster", "cluster"), ("cpasync", "cpasync"),
                      ("final", "final"), ("quack", "QuACK"), ("torch-compile", "torch.compile"),
                      ("liger", "Liger"), ("torch-eager", "F.rms_norm")],
    ("bwd", "bf16"): [("final_bwd", "final_bwd"), ("quack", "QuACK"),
                      ("torch-compile", "torch.compile"), ("torch-ops", "PyTorch ops")],
    ("bwd", "fp32"): [("final_bwd", "final_bwd"), ("quack", "QuACK"),
                      ("torch-compile", "torch.compile"), ("torch-ops", "PyTorch ops")],
}  # fmt: skip


def _ladder_table(pass_: str, wdt: str) -> list[str]:
    """The README's table of one pass and weight dtype, line by line, from ladder.json."""
    cols = LADDER_TABLES[(pass_, wdt)]
    lines = ["| N | " + " | ".join(h for _, h in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for N, graph in LADDER_SHAPES:
        cells = []
        for kernel, _ in cols:
            got = results.rows(LADDER, pass_, kernel=kernel, N=N, graph=graph, weight_dtype=wdt)
            cells.append(f"{got[0]['gbps']:.0f}" if got and "gbps" in got[0] else "-")
        lines.append(f"| {N}{' (graph)' if graph else ''} | " + " | ".join(cells) + " |")
    return lines


def test_readme_ladder_tables_are_the_recorded_run():
    readme = _readme()
    for pass_, wdt in LADDER_TABLES:
        table = "\n".join(_ladder_table(pass_, wdt))
        assert table in readme, f"{pass_} {wdt}:\n{table}"
    run = results.load(LADDER)
    head = "`ladder.json`, {}, D2D copy {:.0f} GB/s".format(run["date"], run["copy_gbps"])
    assert head in " ".join(readme.split()), head
    assert run["command"] in readme  # the command, as recorded
    assert "403 s" in readme and round(run["elapsed_s"]) == 403
    # "the stages lose up to 32% of their speed at long rows" with an fp32 weight
    loss = max(
        1 - _row(k, N, wdt="fp32")["gbps"] / _row(k, N)["gbps"]
        for k in ("block", "cluster", "cpasync")
        for N in LARGE
    )
    assert f"lose up to {100 * loss:.0f}% of their speed at long rows" in " ".join(readme.split())


@functools.cache  # the records read once a process, not once a quote
def _copy_quotes() -> list[tuple[str, str]]:
    """(lesson, quote recomputed): the copy bandwidth lessons 00 and 01 build on (ladder.json's
    run), the byte counts and times that follow from it, and the idle load of latency.json that
    lessons 01, 03 and 05 put in Little's law."""
    import json

    from quack_edu.lessons.roofline import H200, littles_law
    from quack_edu.tools.bench import rmsnorm_bytes

    run = results.load(LADDER)
    copy = run["copy_gbps"]
    tbs = f"{copy / 1e3:.2f} TB/s"
    same_day = [
        json.loads(f.read_text()).get("copy_gbps")
        for f in results.results_dir().glob("*.json")
        if json.loads(f.read_text()).get("date") == run["date"]
    ]
    top = max(c for c in same_day if c)

    def floor_us(M, N):
        return rmsnorm_bytes(M, N, torch.bfloat16) / (copy * 1e9) * 1e6

    small = f"{rmsnorm_bytes(4096, 4096, torch.bfloat16) / 1e6:.0f} MB"
    lat = results.load("latency")
    (ns,) = [
        r["ns_per_load"] for r in lat["rows"] if (r["level"], r["order"]) == ("dram", "random")
    ]
    mb = copy * 1e9 * ns * 1e-9 / 1e6
    law = littles_law()  # the one figure lessons 03-05 put in Little's law
    assert (law.copy_gbps, law.latency_ns) == (H200.copy_gbps, ns) and round(copy) == H200.copy_gbps
    per_sm = f"{law.per_sm_kb:.0f} KB per SM"
    L00, L01 = "00_setup_and_roofline", "01_naive"
    # the copy is no bound: the library's kernel beats it in the same run (the `lib` rows, as
    # the lesson names them: issue 50, a learner read 102.7 there where `final` reads 102.8)
    lib = [_row("lib", N)["pct_copy"] for N in (4096, 8192, 16384, 32768, 65536)]
    assert min(lib) > 100
    beat = f"{min(lib):.1f}-{max(lib):.1f}%"
    return [
        (L00, f"**{tbs}, measured on an H200 on {run['date']}** (in the run of"),
        (L00, f"other runs that day read up to {top / 1e3:.2f})"),
        (
            L00,
            f"{small} at {tbs}: about {floor_us(4096, 4096):.0f} µs. For a batch of 32768 "
            f"tokens, {floor_us(32768, 4096):.0f} µs.",
        ),
        (L00, f"bandwidth ({tbs}), not the datasheet's {H200.hbm_gbps / 1e3:.1f} TB/s: a"),
        (L00, f"the record's `lib` rows, bf16) runs at {beat} of it from N = 4096 to 65536:"),
        (L01, f"One load takes {ns:.0f} ns on an idle H200"),
        (L01, f"at least {tbs} × {ns:.0f} ns ≈ {mb:.1f} MB"),
        (L03, f"{per_sm} that Little's law asks for at the copy's {tbs} and the {ns:.0f} ns of"),
        ("04_cluster_reduction", f"(Little's law, lesson 03: {per_sm} at the least)"),
        (L05, f"{ns:.0f} ns on an idle H200 (lesson 01's pointer chase"),
        (L05, f"At least **{per_sm}**."),
        (L05, f"several times Little's {per_sm} in flight"),
        (L05, f"Little's {per_sm}, the least."),
        (L05, f"near Little's {per_sm[:-7]} (more under load)"),
        (L05, f"{tbs} x {ns:.0f} ns (an idle load) = {law.gpu_bytes / 1e6:.1f} MB in flight"),
        (L05, f"GPU, {per_sm}, all the time"),
    ]


def test_lessons_00_and_01_quote_the_ladders_copy():
    """The copy bandwidth lessons 00 and 01 build on is the one measured in ladder.json's run."""
    from quack_edu.lessons.roofline import H200

    assert H200.copy_gbps == round(results.load(LADDER)["copy_gbps"])
    assert results.load("latency")["gpu"] == "NVIDIA H200"
    for lesson, quote in _copy_quotes():
        assert quote in _words(_prose(lesson)), (lesson, quote)
