"""Kernel configurations: frozen dataclasses, one per stage family, and their heuristics.

Config is data. A heuristic picks one from (N, dtype); every kernel also accepts one
explicitly, so tests, exercises and the autotuner can force a path.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NaiveConfig:
    """One thread per row: only the block size is free."""

    threads_per_block: int = 128

    def __post_init__(self):
        if self.threads_per_block % 32 or not 32 <= self.threads_per_block <= 1024:
            raise ValueError(
                f"threads_per_block must be a multiple of 32 in [32, 1024], "
                f"got {self.threads_per_block}"
            )


def naive_config(N: int, dtype=None) -> NaiveConfig:
    return NaiveConfig()
