#!/usr/bin/env python3
"""Markdown words per lesson and per cell, against the limits a lesson keeps.

    python scripts/lesson_words.py [NOTEBOOK ...] [--lesson-max 2500] [--cell-max 300]

Without arguments it reads every lesson in ``solutions/`` (appendix notebooks, whose name holds
``appendix``, and anything under ``docs/`` are not lessons and are left out). A word is a run
of non-space characters in a markdown cell, fenced code blocks excluded (code is not prose).
Prints one row per lesson (total words, its largest cell) and one per cell over the limit;
exits 1 when a lesson's markdown is over ``--lesson-max`` words or one of its cells over
``--cell-max``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LESSON_MAX = 2500
CELL_MAX = 300

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)


def words(markdown: str) -> int:
    """Words in a markdown text, fenced code blocks excluded."""
    return len(_FENCE.sub(" ", markdown).split())


@dataclass(frozen=True)
class LessonWords:
    name: str
    cells: tuple[tuple[int, int], ...]  # (cell index in the notebook, words), markdown only

    @property
    def total(self) -> int:
        return sum(w for _, w in self.cells)

    @property
    def largest(self) -> tuple[int, int]:
        return max(self.cells, key=lambda c: c[1], default=(-1, 0))

    def violations(self, lesson_max: int = LESSON_MAX, cell_max: int = CELL_MAX) -> list[str]:
        out = []
        if self.total > lesson_max:
            out.append(f"{self.name}: {self.total} words of markdown (limit {lesson_max})")
        out += [
            f"{self.name} cell {i}: {w} words (limit {cell_max})"
            for i, w in self.cells
            if w > cell_max
        ]
        return out


def count(path: Path) -> LessonWords:
    cells = json.loads(Path(path).read_text())["cells"]
    per_cell = tuple(
        (i, words("".join(c["source"]) if isinstance(c["source"], list) else c["source"]))
        for i, c in enumerate(cells)
        if c["cell_type"] == "markdown"
    )
    return LessonWords(Path(path).stem, per_cell)


def lessons(root: Path = ROOT) -> list[Path]:
    """The lesson notebooks (the solutions are the source), appendices left out."""
    return sorted(p for p in (root / "solutions").glob("*.ipynb") if "appendix" not in p.name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--lesson-max", type=int, default=LESSON_MAX)
    ap.add_argument("--cell-max", type=int, default=CELL_MAX)
    args = ap.parse_args(argv)
    paths = args.notebooks or lessons()
    bad = []
    print(f"{'lesson':<32} {'words':>6} {'cells':>5} {'largest cell':>13}")
    for p in paths:
        lw = count(p)
        i, w = lw.largest
        flag = "  OVER" if lw.violations(args.lesson_max, args.cell_max) else ""
        print(f"{lw.name:<32} {lw.total:>6} {len(lw.cells):>5} {w:>8} (#{i}){flag}")
        bad += lw.violations(args.lesson_max, args.cell_max)
    if bad:
        print(f"\nover the limits ({args.lesson_max} a lesson, {args.cell_max} a cell):")
        print("\n".join("  " + b for b in bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
