"""Lesson 01's figures against their record, and the naive docstring's warp count."""

import json
import re

from quack_edu.grading.notebook import solutions_dir
from quack_edu.lessons import results
from quack_edu.stages import naive


def _prose(name):
    nb = json.loads((solutions_dir() / f"{name}.ipynb").read_text())
    text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    return " ".join(text.split())


def _naive_rows() -> list[dict]:
    return results.rows("ladder", "fwd", kernel="naive", weight_dtype="bf16", graph=False)


def revisit_quote() -> str:
    """The N revisit's figures, recomputed from ladder.json (the naive stage at its shortest
    and longest row)."""
    rows = _naive_rows()
    lo, hi = min(rows, key=lambda r: r["N"]), max(rows, key=lambda r: r["N"])
    return (
        f"{lo['gbps']:.0f} GB/s at N = {lo['N']}, {hi['gbps']:.0f} GB/s at N = {hi['N']} "
        f"({lo['pct_copy']:.1f}-{hi['pct_copy']:.1f}% of the copy)"
    )


def test_the_n_revisit_quotes_ladder_json():
    assert revisit_quote() in _prose("01_naive")
    # flat: every N within 10% of the others
    gbps = [r["gbps"] for r in _naive_rows()]
    assert max(gbps) / min(gbps) < 1.1


def test_naive_docstring_counts_warps():
    m = re.search(r"at M=(\d+) that is (\d+) warps", " ".join(naive.__doc__.split()))
    assert m and int(m.group(2)) == int(m.group(1)) // 32


def test_lesson_01_does_not_print_its_answers_before_the_checks():
    nb = json.loads((solutions_dir() / "01_naive.ipynb").read_text())
    first_check = next(
        i
        for i, c in enumerate(nb["cells"])
        if c["metadata"].get("nbgrader", {}).get("grade_id") == "01_rstd_check"
    )
    before = "\n".join(
        "".join(c["source"]) for c in nb["cells"][:first_check] if c["cell_type"] == "code"
    )
    assert "getsource(naive.NaiveRMSNorm)" not in before
    assert "NaiveRMSNorm.sum_squares" not in before and "NaiveRMSNorm.rstd" not in before


def test_the_annotation_line_numbers_match_the_shown_kernel():
    from quack_edu.lessons.show import kernel_diff

    (shown,) = kernel_diff("naive")
    line = {i: s for i, (_, s) in enumerate(shown.lines, 1)}
    prose = _prose("01_naive")
    assert "**4-6**" in prose and "**7**" in prose and "**8-9**" in prose and "**10-12**" in prose
    assert "thread_idx" in line[4] and "block_idx" in line[5] and "row =" in line[6]
    assert "if row <" in line[7]
    assert "sum_squares" in line[8] and "rstd" in line[9]
    assert "cutlass.range" in line[10] and "mO[row, j]" in line[12] and len(line) == 12
