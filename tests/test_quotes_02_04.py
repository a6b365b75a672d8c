"""Every percentage and GB/s figure in the prose of lessons 02-04 is checked against its record.

The figures are found in the lessons' markdown (``94.1%``, ``95–97%``, ``3971 GB/s``, ``3711 /
3559 / 3420 / 3127 GB/s``). Each must appear in a quote that a test recomputes from its record:
the ladder quotes of ``test_lesson_numbers`` (ladder.json) or the quotes below (the same record,
and the few figures that are arithmetic rather than measurement). A figure added to the prose
without such a quote fails here, naming the figure; a quote whose recomputation no longer
matches the record fails too.
"""

from __future__ import annotations

import functools
import math
import re

import pytest
from test_lesson_numbers import LADDER, _ladder_quotes, _pc, _row, _span, _words

from quack_edu.grading.notebook import read, solutions_dir
from quack_edu.lessons import results

L02, L03, L04 = "02_warp_reduction", "03_block_reduction", "04_cluster_reduction"
LESSONS = (L02, L03, L04)
MID = (4096, 8192, 16384)


def _ratio(a, b, N) -> float:
    return _row(a, N)["gbps"] / _row(b, N)["gbps"]


@functools.cache
def _quotes() -> list[tuple[str, str, str]]:
    """(lesson, quoted, recomputed) for the figures the ladder quotes do not hold."""
    naive = [
        r for r in results.rows(LADDER, "fwd", kernel="naive", graph=False, weight_dtype="bf16")
    ]
    naive_top = max(r["pct_copy"] for r in naive)
    block_mid = _span([_row("block", N)["pct_copy"] for N in MID], "{:.0f}%")
    return [
        (
            L02,
            "ran at about 200 GB/s, under 5% of the copy bandwidth",
            "ran at about {} GB/s, under {}% of the copy bandwidth".format(
                int(round(_row("naive", 1024)["gbps"], -2)), math.ceil(naive_top)
            ),
        ),
        (
            L02,
            "94.1% of the copy bandwidth at 32768 x 4096 bf16",
            f"{_pc('warp', 4096, digits=1)} of the copy bandwidth at 32768 x 4096 bf16",
        ),
        (
            L03,
            "reached 94.1% of the copy bandwidth at 32768 × 4096 bf16 on the H200, and then fell "
            "to 67% at N = 16384",
            "reached {} of the copy bandwidth at 32768 × 4096 bf16 on the H200, and then fell "
            "to {} at N = 16384".format(_pc("warp", 4096, digits=1), _pc("warp", 16384)),
        ),
        (
            L03,
            "95–97% of the copy bandwidth at N = 4K–16K bf16",
            "{} of the copy bandwidth at N = 4K–16K bf16".format(block_mid.replace("%-", "–")),
        ),
        (L03, "it measured 94.1% of copy", f"it measured {_pc('warp', 4096, digits=1)} of copy"),
        (
            L03,
            "76% of copy at 8192, 67% at 16384",
            f"{_pc('warp', 8192)} of copy at 8192, {_pc('warp', 16384)} at 16384",
        ),
        (
            L03,
            "where the warp stage read x twice (76%, 67%)",
            f"where the warp stage read x twice ({_pc('warp', 8192)}, {_pc('warp', 16384)})",
        ),
        (
            L03,
            "like the warp stage did at 4096 (94.1%)",
            f"like the warp stage did at 4096 ({_pc('warp', 4096, digits=1)})",
        ),
    ]


def _all_quotes() -> list[tuple[str, str, str]]:
    return [q for q in _ladder_quotes() if q[0] in LESSONS] + _quotes()


@functools.cache
def _prose(lesson: str) -> str:
    nb = read(solutions_dir() / f"{lesson}.ipynb")
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


#: a percentage or a GB/s figure: 94.1%, 95–97%, +31%, 3971 GB/s, 3711 / 3559 / 3127 GB/s
_FIGURE = re.compile(
    r"[+−-]?\d+(?:\.\d+)?(?:\s*[–-]\s*[+]?\d+(?:\.\d+)?)?\s*%"
    r"|\d+(?:\s*/\s*\d+)*\s*GB/s"
)


def figures(text: str) -> list[str]:
    return [_words(m.group(0)) for m in _FIGURE.finditer(_words(text))]


@pytest.mark.parametrize("case", _quotes(), ids=lambda c: f"{c[0][:2]}-{c[1][:40]}")
def test_quote_is_the_record(case):
    lesson, quoted, recomputed = case
    assert recomputed == quoted
    assert _words(quoted) in _words(_prose(lesson)), quoted


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_figure_in_the_prose_is_checked(lesson):
    checked = " ".join(_words(q) for ls, q, _ in _all_quotes() if ls == lesson)
    covered = set(figures(checked))
    missing = [f for f in figures(_prose(lesson)) if f not in covered]
    assert not missing, f"{lesson}: figures no test checks against a record: {missing}"


def test_the_figure_pattern():
    assert figures("3971 GB/s (94.1% of copy), 95–97% and +31%, 3711 / 3559 GB/s") == [
        "3971 GB/s",
        "94.1%",
        "95–97%",
        "+31%",
        "3711 / 3559 GB/s",
    ]
