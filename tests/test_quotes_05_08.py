"""Every percentage and GB/s figure in the prose of lessons 05-08 is one a quote test checks
against its record.

The quote tests (``test_lesson_numbers.py`` for lessons 05-07, ``test_lesson08_numbers.py`` for
08) recompute each quoted passage from ``benchmarks/results/*.json`` and find it in the lesson.
This file finds every figure in a lesson's markdown (a percentage, a GB/s value, a number in a
table of GB/s) and asserts that it lies inside one of those checked passages, or is one of the
few figures listed here with their own check (``OWN``). A figure added to a lesson without a
check fails here until it gets one.
"""

from __future__ import annotations

import functools
import re

import pytest
import test_lesson08_numbers as T08
import test_lesson_numbers as T

from quack_edu.grading.notebook import read, solutions_dir
from quack_edu.lessons import results

LESSONS = ("05_cp_async_pipelining", "06_final_kernel", "07_backward", "08_speed_of_light")
#: row lengths and shapes: numbers that are not figures
_SIZES = {2**k for k in range(8, 19)} | {32768, 16384, 8192, 4096, 1000, 2026}
_PCT = re.compile(r"[-+\u2212]?\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?%")
#: a 3-4 digit number that is not a count of something else (rows, bytes, registers, time)
_NUM = re.compile(
    r"(?<![\w.])\d{3,4}(?![\w.-])(?! ?(?:ns|µs|us|MB|KB|KiB|MiB|GiB|rows|CTAs|registers|additions"
    r"|partial|threads|vectors|columns|candidates)\b)"
)


def _words(text: str) -> str:
    return " ".join(text.split())


@functools.cache
def prose(lesson: str) -> str:
    nb = read(solutions_dir() / f"{lesson}.ipynb")
    return _words("\n".join(c.source for c in nb.cells if c.cell_type == "markdown"))


def figures(text: str) -> list[tuple[int, int, str]]:
    """(start, end, figure) of every percentage, and of every 3-4 digit number in a sentence
    or table row that speaks of GB/s (row lengths and years left out)."""
    out = [(m.start(), m.end(), m.group()) for m in _PCT.finditer(text)]
    for part in re.finditer(r"[^.|]*GB/s[^.]*|\|[^\n]*", text):
        for m in _NUM.finditer(part.group()):
            if int(m.group()) in _SIZES:
                continue
            s = part.start() + m.start()
            out.append((s, s + len(m.group()), m.group()))
    return out


def _quotes_05() -> list[str]:
    return [q for lesson, q, _ in T._ladder_quotes() if lesson == T.L05]


def _quotes_06() -> list[str]:
    return [
        *T._recomputed06(),
        *T._tuned_quotes(),
        *T._tuned_after_quotes(),
        *(str(p.values[0]) for p in T.QUOTED_06),
    ]


def _quotes_07() -> list[str]:
    out = list(T._recomputed07())
    if results.load("bwd_dw_strategies"):
        out += list(T._recomputed07_strategies())
    return out


def _quotes_08() -> list[str]:
    return list(T08._recomputed())


def _ladder(kernel, N, wdt="bf16", graph=False, pass_="fwd") -> dict:
    (row,) = results.rows(
        "ladder", **{"pass": pass_}, kernel=kernel, N=N, weight_dtype=wdt, graph=graph
    )
    return row


def _own_05() -> list[str]:
    import torch

    from quack_edu.tools.bench import rmsnorm_bytes

    behind = 100 * (1 - _ladder("cpasync", 16384)["gbps"] / _ladder("cluster", 16384)["gbps"])
    mb = rmsnorm_bytes(32768, 1024, torch.bfloat16, torch.bfloat16) / 1e6
    us = _ladder("cpasync", 1024)["us"]
    copy = results.load("ladder")["copy_gbps"]
    return [
        f"16384, where it is {behind:.1f}% behind (a tie)",
        f"moves {mb:.0f} MB in about {us:.0f} µs",
        f"the whole ladder in one run, copy {copy:.0f} GB/s",
    ]


def _own_06() -> list[str]:
    a = T._sweep_a()
    best = {
        (N, w): max(r["gbps"] for r in results.rows(T.CONFIGS, **T._sweep("final", N, w)))
        for N in (65536, 131072)
        for w in ("bf16", "fp32")
    }
    gap = max(100 * (1 - best[(N, "fp32")] / best[(N, "bf16")]) for N in (65536, 131072))
    assert a and 2 < gap <= 3, gap  # "within 3%": the larger of the two gaps rounds up to 3
    return ["the fp32 weight comes within 3% of the same kernel's bf16-weight best"]


def _own_07() -> list[str]:
    pct = {N: T._bwd("lib", N)["pct_copy"] for N in (4096, 8192, 16384, 32768, 65536)}
    mid = [pct[N] for N in (8192, 16384, 32768, 65536)]
    return [
        f"backward runs at {pct[4096]:.1f}% of the copy at N = 4096 and "
        f"{min(mid):.1f}-{max(mid):.1f}% from 8192 to 65536"
    ]


def _own_08() -> list[str]:
    checks = [c["name"] for c in T08._part("fwd")["verdict"]["checks"]]
    assert "fp32 weights within 2% of bf16 weights" in checks
    p = T08._p1  # the recap quotes the table's one-decimal figures
    return [
        "an fp32 weight within 2% of a bf16 one",
        "the ladder climbs from {} of the copy (one thread a row: latency) to {} (a warp a row), "
        "{} (a block a row: enough bytes in flight), {} and {} with `cp.async` for a bf16 and an "
        "fp32 weight, and {} for the final kernel; the backward's final kernel runs at {}".format(
            p("fwd", "naive"),
            p("fwd", "warp"),
            p("fwd", "block"),
            p("fwd", "cpasync"),
            p("fwd", "cpasync", "fp32"),
            p("fwd", "final"),
            p("bwd", "final_bwd"),
        ),
    ]


#: figures each lesson quotes beyond the quote tests', recomputed here
OWN = {
    "05_cp_async_pipelining": _own_05,
    "06_final_kernel": _own_06,
    "07_backward": _own_07,
    "08_speed_of_light": _own_08,
}
#: passages whose percentage is a concept, not a measurement
CONCEPTS = ("Over 100% is possible", "More than 100%: the copy is a measured reference")


@functools.cache
def checked_spans(lesson: str) -> list[tuple[int, int]]:
    quotes = (
        {
            "05_cp_async_pipelining": _quotes_05,
            "06_final_kernel": _quotes_06,
            "07_backward": _quotes_07,
            "08_speed_of_light": _quotes_08,
        }[lesson]()
        + OWN[lesson]()
        + list(CONCEPTS)
    )
    text = prose(lesson)
    spans = []
    for q in quotes:
        q = _words(q)
        for m in re.finditer(re.escape(q), text):
            spans.append((m.start(), m.end()))
    return spans


def unchecked(lesson: str) -> list[str]:
    text = prose(lesson)
    spans = checked_spans(lesson)
    bad = []
    for s, e, fig in figures(text):
        if not any(a <= s and e <= b for a, b in spans):
            bad.append(f"{fig!r} in ...{text[max(0, s - 60) : e + 20]}...")
    return bad


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_figure_in_the_prose_is_checked(lesson):
    assert unchecked(lesson) == []


def test_the_figure_finder_sees_percentages_and_gbps():
    text = "at 3964 GB/s, 93.8% of the copy; N = 4096, 528 rows and +4.2% | 3052 | 2821 |"
    got = [f for _, _, f in figures(text)]
    assert got == ["93.8%", "+4.2%", "3964", "3052", "2821"]


@pytest.mark.parametrize("lesson", LESSONS)
def test_a_figure_without_a_check_is_found(lesson):
    """The test above fails on a figure no quote covers: add one to the prose and see."""
    spans = checked_spans(lesson)
    text = prose(lesson) + " It ran at 4321 GB/s, 12.3% more."
    bad = [f for s, e, f in figures(text) if not any(a <= s and e <= b for a, b in spans)]
    assert "4321" in bad and "12.3%" in bad
