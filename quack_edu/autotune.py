"""A small autotuner: time every candidate config once per key, keep the fastest on disk.

A *key* names everything a config's speed depends on (the GPU, N, the dtypes, the features
used): a tuple of ``(name, value)`` pairs, e.g. ``(("gpu", "NVIDIA H200"), ("N", 4096), ...)``.
For a key never seen, :meth:`Autotuner.tune`

1. runs the first candidate (by convention the heuristic's pick) and keeps its output as the
   expected one;
2. runs every other candidate once (this compiles it) and drops it if it fails to compile or
   launch, or if its output differs from the expected one: a wrong config never wins;
3. times each survivor (``timer``: CUDA events, a warm-up, then the median of several calls);
4. keeps the fastest, in memory and in a JSON file meant to be read by people.

A key found in memory, then on disk, is never tuned again. The file is, by default,
``~/.cache/quack_edu/autotune.json`` (``$XDG_CACHE_HOME`` is honoured);
``QUACK_EDU_AUTOTUNE_CACHE=/some/file.json`` moves it and ``QUACK_EDU_AUTOTUNE_CACHE=0`` (or
``off``) turns the disk off: then each process tunes each key once. Configs are stored as
their dataclass fields and rebuilt with the candidates' class; a stored config that is no
longer a candidate (the package changed) is tuned again. Writes go to a temporary file that
is renamed over the old one, so two processes tuning at once never leave a broken file (the
last writer's other keys may be lost; they are tuned again next time).

A candidate may be ``None``, standing for "whatever the kernel's heuristic picks" (stored as
``null``).

Everything GPU-specific is injectable (``run``, ``bench``, ``timer``), so the logic is tested
on a CPU.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ._env import cache_location

ENV_VAR = "QUACK_EDU_AUTOTUNE_CACHE"
FORMAT_VERSION = 1
_HEURISTIC = object()  # "the file says: the heuristic's pick (None) won"


def cache_path() -> Path | None:
    """Where winners are stored, from ``QUACK_EDU_AUTOTUNE_CACHE``; None when it is disabled."""
    return cache_location(ENV_VAR, "autotune.json")


def key_str(key) -> str:
    """The key as it appears in the JSON file: ``"gpu=NVIDIA H200, N=4096, ..."``."""
    return ", ".join(f"{name}={value}" for name, value in key)


def cuda_timer(fn: Callable[[], object], warmup: int = 3, reps: int = 10) -> float:
    """Milliseconds per call of ``fn`` (one kernel launch): the median of ``reps`` calls, each
    between its own pair of CUDA events on the current stream, after ``warmup`` calls."""
    import torch

    for _ in range(warmup):
        fn()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(reps)
    ]
    for start, end in events:
        start.record()
        fn()
        end.record()
    events[-1][1].synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def outputs_match(got: Sequence, expected: Sequence) -> bool:
    """Every tensor of ``got`` is finite where ``expected`` is and within the dtype's tolerance
    of it (two configs sum a row in different orders: the last bits may differ)."""
    import torch

    from .reference import TOLERANCES

    if len(got) != len(expected):
        return False
    for g, e in zip(got, expected, strict=True):
        if g.shape != e.shape or g.dtype != e.dtype:
            return False
        tol = TOLERANCES.get(g.dtype, TOLERANCES[torch.float32])
        # NaN where the input makes NaN (a NaN or Inf in x) is a match, not a failed config
        if not torch.allclose(g.float(), e.float(), **tol, equal_nan=True):
            return False
    return True


class Progress:
    """A progress bar: tqdm when it is installed, else one line on stderr rewritten in place
    (``unit``: what is counted). Also the benchmark's (``quack_edu.tools.bench``)."""

    def __init__(self, total: int, desc: str, enabled: bool, unit: str = "configs"):
        self.total, self.desc, self.enabled, self.done = total, desc, enabled, 0
        self.unit = unit
        self._bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total, desc=desc, unit=f" {unit}", leave=False)
            except ImportError:
                self._show()

    def _show(self):
        print(f"\r{self.desc}: {self.done}/{self.total} {self.unit}", end="", file=sys.stderr)

    def update(self):
        self.done += 1
        if self._bar is not None:
            self._bar.update()
        elif self.enabled:
            self._show()

    def close(self):
        if self._bar is not None:
            self._bar.close()
        elif self.enabled:
            print(file=sys.stderr)


class Autotuner:
    """Winners by key: memory first, then the JSON file, then a tuning run.

    ``timer(fn) -> ms`` times a zero-argument call (default :func:`cuda_timer`); ``check(got,
    expected) -> bool`` compares a candidate's outputs with the first candidate's (default
    :func:`outputs_match`); ``path`` overrides the environment's choice of file (``False``: no
    file); ``progress`` shows a bar while tuning.
    """

    def __init__(self, timer=None, check=None, path=None, progress: bool = True, log=None):
        self.timer = timer or cuda_timer
        self.check = check or outputs_match
        self._path = path
        self.progress = progress
        self.log = log or (lambda msg: print(f"quack_edu autotune: {msg}", file=sys.stderr))
        self.memory: dict[tuple, object] = {}
        self.notes: list[str] = []  # what was skipped, and why, in the last tuning runs

    @property
    def path(self) -> Path | None:
        if self._path is False:
            return None
        return Path(self._path) if self._path is not None else cache_path()

    def cached(self, key, default=None):
        """The winner for ``key`` if this process already has it (no disk access), else
        ``default`` (pass a sentinel when None is a candidate)."""
        return self.memory.get(key, default)

    def tune(self, key, candidates, run, bench=None):
        """The best config for ``key``.

        ``candidates``: a list of configs, or a function returning one (called only on a
        memory miss), the heuristic's pick first. ``run(config)`` launches with ``config`` and
        returns its outputs (a sequence of tensors) for the check; ``bench(config)`` is the
        call that is timed (default ``run``).
        """
        if key in self.memory:
            return self.memory[key]
        if callable(candidates):
            candidates = candidates()
        candidates = list(candidates)
        if not candidates:
            raise ValueError(f"no candidate configs for {key_str(key)}")
        path = self.path
        config = self._from_disk(path, key, candidates) if path is not None else None
        if config is _HEURISTIC:
            config = None
        elif config is None:
            config, ms, timings = self._measure(key, candidates, run, bench or run)
            if path is not None:
                self._save(path, key, config, ms, timings)
        self.memory[key] = config
        return config

    # -- measuring --------------------------------------------------------------------------

    def _skip(self, config, why: str):
        note = f"skipped {config!r}: {why}"
        self.notes.append(note)
        self.log(note)

    def _measure(self, key, candidates, run, bench):
        base = candidates[0]
        expected = [t.clone() for t in run(base)]  # the heuristic must work: errors propagate
        timings = []
        bar = Progress(len(candidates), f"tuning {key_str(key)}", self.progress)
        try:
            for config in candidates:
                try:
                    if config is not base:
                        got = run(config)
                        if not self.check(got, expected):
                            self._skip(config, "its output differs from the heuristic config's")
                            continue
                    ms = float(self.timer(lambda c=config: bench(c)))
                except Exception as e:  # a config the compiler or the driver refuses
                    self._skip(config, f"{type(e).__name__}: {e}")
                    continue
                finally:
                    bar.update()
                timings.append((ms, config))
        finally:
            bar.close()
        if not timings:
            raise RuntimeError(f"no candidate config ran for {key_str(key)}: {self.notes[-1]}")
        ms, best = min(timings, key=lambda t: t[0])
        return best, ms, timings

    # -- the file ---------------------------------------------------------------------------

    def _load(self, path: Path) -> dict:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            self.log(f"ignoring unreadable cache {path} ({type(e).__name__}: {e})")
            return {}
        entries = data.get("entries") if isinstance(data, dict) else None
        if not isinstance(entries, dict) or data.get("version") != FORMAT_VERSION:
            self.log(f"ignoring cache {path}: not a version-{FORMAT_VERSION} autotune file")
            return {}
        return entries

    def _from_disk(self, path: Path, key, candidates):
        entry = self._load(path).get(key_str(key))
        if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict | None):
            return None
        fields = entry["config"]
        if fields is None:
            return None if None not in candidates else _HEURISTIC
        cls = next((type(c) for c in candidates if c is not None), None)
        try:
            config = cls(**fields)
        except (TypeError, ValueError):
            return None  # written by another version of the config class
        return config if config in candidates else None

    def _save(self, path: Path, key, config, ms: float, timings):
        entries = self._load(path)
        entries[key_str(key)] = {
            "config": None if config is None else dataclasses.asdict(config),
            "config_class": type(config).__name__,
            "ms": round(ms, 5),
            "candidates": {repr(c): round(t, 5) for t, c in sorted(timings, key=lambda t: t[0])},
            "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        text = json.dumps({"version": FORMAT_VERSION, "entries": entries}, indent=2)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(text + "\n")
                os.replace(tmp, path)  # atomic: readers see the old file or the new one
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as e:
            self.log(f"could not write {path} ({e}); the result is kept in memory only")
