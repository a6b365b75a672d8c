"""Predictions: the learner writes a guess in a cell of its own (``guess_us = ...``), runs it,
and only then runs the cell that computes the answer; ``reveal`` puts the two side by side.

    guess_us = ...  # your prediction, in µs
    ...
    reveal(guess_us, t_us, "µs")   # your guess: 16 µs; computed: 15.9 µs (+0.6%)

A guess left at ``...`` is reported as missing, never as an error: a notebook runs headless
(``quack-edu grade``, the tests) with its guesses unfilled.
"""

from __future__ import annotations

import math
from numbers import Real


def _is_number(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _fmt(v, unit: str) -> str:
    if _is_number(v):
        text = f"{v:.4g}" if isinstance(v, float) else f"{v}"
    else:
        text = str(v)
    return f"{text} {unit}".rstrip()


def compare(guess, answer, unit: str = "") -> str:
    """One line: the guess and the answer, and how far apart when both are numbers."""
    if guess is Ellipsis or guess is None:
        return (
            f"no guess recorded: write yours in the cell above and run it first "
            f"(computed: {_fmt(answer, unit)})"
        )
    line = f"your guess: {_fmt(guess, unit)}; computed: {_fmt(answer, unit)}"
    if _is_number(guess) and _is_number(answer) and answer and math.isfinite(guess):
        line += f" ({100 * (guess / answer - 1):+.0f}%)"
    return line


def reveal(guess, answer, unit: str = "", label: str = "") -> None:
    """Print ``compare(guess, answer, unit)``; a tuple or dict of guesses is compared item by
    item with the answers of the same shape (``label``: a word before each line)."""
    if isinstance(answer, dict):
        guesses = guess if isinstance(guess, dict) else {}
        for key, value in answer.items():
            reveal(guesses.get(key, guess if guess is Ellipsis else None), value, unit, str(key))
        return
    if isinstance(answer, (tuple, list)):
        guesses = guess if isinstance(guess, (tuple, list)) else [guess] * len(answer)
        for i, value in enumerate(answer):
            g = guesses[i] if i < len(guesses) else None
            reveal(g, value, unit, f"{label} [{i}]".strip())
        return
    print(f"{label + ': ' if label else ''}{compare(guess, answer, unit)}")
