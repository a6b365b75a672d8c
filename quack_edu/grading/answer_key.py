"""The answer key: what a student's copy of the course leaves out, and what it keeps instead.

In an exercise module, ``# BEGIN KEY`` ... ``# END KEY`` encloses the reference answers, their
known wrong variants and the mutants (text edits of the solution); ``# BEGIN HIDDEN`` ...
``# END HIDDEN`` encloses the hidden checks. The instructor's copy (this repository) has them
all. ``quack-edu student --release OUT`` (``grading/release.py``) writes a student's copy:

- each KEY block becomes stubs (``removed("name")``, ``removed_variants(...)``, an empty
  mutant table), each HIDDEN block goes, and the solutions and the tests are left out;
- ``public_key.json`` beside this module keeps, for every value check a student's ``check()``
  runs, its cases' expected values and what each known wrong variant gives on them, recorded
  from the key with one seed: in a student's copy the public checks run with that seed (the
  class is graded with another, by the instructor, on every case, hidden ones included).

A check that needs a left-out answer beyond those cases raises ``KeyRemoved``: the runner
reports it as skipped, "graded by your instructor", never as the learner's failure.
"""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .hints import Variant

#: written into a student's copy by ``quack-edu student --release``; absent from the instructor's
PUBLIC_KEY = Path(__file__).with_name("public_key.json")
#: the format of ``PUBLIC_KEY`` (a copy written by another version is refused)
FORMAT = 1


class KeyRemoved(Exception):
    """A check needed an answer that only the instructor's copy has."""


class Removed:
    """A reference answer (or a wrong variant's formula) left out of a student's copy."""

    def __init__(self, name: str):
        self.__name__ = self.name = name

    def __call__(self, *args, **kwargs):
        calls = (public_key() or {}).get("calls", {}).get(self.name, {})
        if not kwargs and case_key(args) in calls:  # a call recorded by ``keyed``
            return as_recorded(calls[case_key(args)])
        raise KeyRemoved(f"{self.name} is in the instructor's answer key only")

    def __repr__(self) -> str:
        return f"removed({self.name!r})"


def removed(name: str) -> Removed:
    return Removed(name)


def removed_variants(rows) -> list[Variant]:
    """Known wrong variants whose formulas were left out: ``[(name, hint), ...]``."""
    return [Variant(name, Removed(name), hint) for name, hint in rows]


@functools.cache
def public_key() -> dict | None:
    """The recorded public cases of a student's copy; None in the instructor's."""
    if not PUBLIC_KEY.exists():
        return None
    data = json.loads(PUBLIC_KEY.read_text())
    if data.get("format") != FORMAT:
        raise RuntimeError(f"{PUBLIC_KEY} has format {data.get('format')}, not {FORMAT}")
    return data


def released() -> bool:
    """Whether this is a student's copy (``quack-edu student --release``)."""
    return public_key() is not None


def public_seed() -> int | None:
    """The seed the public checks of a student's copy run with (their cases were recorded
    with it); None in the instructor's copy."""
    key = public_key()
    return None if key is None else int(key["seed"])


def seed_for(seed: int | None) -> int:
    """The seed of a grading run: ``seed`` if given; else, in a student's copy, the one its
    public cases were recorded with; else a fresh one."""
    if seed is not None:
        return int(seed)
    public = public_seed()
    return public if public is not None else secrets.randbits(31)


# ---- recording and looking up ------------------------------------------------------------------
def case_key(case) -> str:
    """A case's arguments as text that a JSON file keeps: numbers, strings, torch dtypes, tuples."""

    def plain(a):
        if isinstance(a, bool | int | float | str) or a is None:
            return a
        if isinstance(a, list | tuple):
            return [plain(b) for b in a]
        if type(a).__name__ == "dtype":  # torch.dtype
            return f"dtype:{a}"
        raise KeyRemoved(f"a case argument of type {type(a).__name__} cannot be recorded")

    return json.dumps(plain(list(case)), sort_keys=True)


def _value(v):
    if isinstance(v, bool | int | float) or v is None:
        return v
    if isinstance(v, list | tuple):
        return [_value(b) for b in v]
    return float(v)  # a 0-d tensor or numpy number


_recording: dict | None = None


@contextmanager
def recording() -> Iterator[dict]:
    """While on, every value check records its cases, and every ``keyed`` reference its calls
    (``quack-edu student --release``): ``{"checks": ..., "calls": ...}``."""
    global _recording
    _recording = {"checks": {}, "calls": {}}
    try:
        yield _recording
    finally:
        _recording = None


def is_recording() -> bool:
    return _recording is not None


def keyed(fn):
    """A reference answer that checks call directly (not through ``value_check``): while a
    release records, its calls are kept, and in a student's copy its stub answers them."""

    @functools.wraps(fn)
    def wrapper(*args):
        out = fn(*args)
        if _recording is not None:
            try:
                _recording["calls"].setdefault(fn.__name__, {})[case_key(args)] = _value(out)
            except KeyRemoved:  # arguments a JSON file cannot keep: not recorded
                pass
        return out

    return wrapper


def record(ex_id: str, check: str, case, expected, variants: dict) -> None:
    table = _recording["checks"].setdefault(ex_id, {}).setdefault(check, {})
    table[case_key(case)] = {
        "expected": _value(expected),
        "variants": {k: (None if v is _FAILED else _value(v)) for k, v in variants.items()},
    }


_FAILED = object()


def variant_value(var: Variant, case):
    """What a known wrong variant gives on ``case``, or ``_FAILED`` if it raises."""
    try:
        return var.fn(*case)
    except Exception:  # noqa: BLE001 (a variant that does not apply to a case)
        return _FAILED


def explains(var: Variant, cases, got) -> bool:
    """Whether known wrong variant ``var`` gives the learner's values ``got`` on every one of
    ``cases`` (one it cannot be evaluated on, as in a student's copy without the key, explains
    nothing)."""
    return all(
        (v := variant_value(var, c)) is not _FAILED and v == g
        for c, g in zip(cases, got, strict=True)
    )


def lookup(ex_id: str, check: str, case) -> dict:
    """The recorded ``{"expected", "variants"}`` of a public case, or ``KeyRemoved``."""
    key = public_key() or {}
    try:
        return key["checks"][ex_id][check][case_key(case)]
    except KeyError:
        raise KeyRemoved(f"{ex_id}: no recorded case {case_key(case)} for {check!r}") from None


def as_recorded(v):
    """A value as the checks compare it (JSON lists back to tuples)."""
    return tuple(as_recorded(b) for b in v) if isinstance(v, list) else v
