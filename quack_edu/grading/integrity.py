"""The grader's own files, hashed when it starts and checked before it writes or grades.

A learner's cell runs in a kernel that could write to the files that decide grades: the
grading package and its exercises, the library modules its checks import, and the solution
notebooks whose check cells the grader restores. The sandbox forbids that; this module is the
second line, detection. ``quack-edu grade`` takes a ``snapshot`` of their SHA-256 hashes at its
start and ``check``s it before it writes a result and, for a class, before each next
submission: a file changed, added or removed since the start raises ``GraderTampered`` and the
grade is refused.

    grader = snapshot(*grader_roots(solutions))   # at the start
    ...
    check(grader)                                 # before each write: raises GraderTampered

A check reads the files again (about 1.5 MB: milliseconds). It sees what is on disk at the
moment it runs: a file changed and put back between two checks goes unseen, and so does a
``__pycache__/*.pyc`` forged to match an unchanged source (Python rewrites those itself, so
they are not hashed).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

#: the files of a folder that decide a grade: code and solution notebooks
SUFFIXES = (".py", ".ipynb")


@dataclass(frozen=True)
class Manifest:
    """SHA-256 of every grader file under ``roots`` (files, or folders searched recursively)."""

    roots: tuple[str, ...]
    hashes: dict[str, str]  # file path -> hex digest

    def summary(self) -> str:
        """What the JSON output records: that the check was made, and over what."""
        return f"verified ({len(self.hashes)} files, sha256)"


class GraderTampered(RuntimeError):
    """The grader's files changed since it started; ``changes``: ``"changed PATH"`` ... each."""

    def __init__(self, changes):
        super().__init__(list(changes))  # args stay ``(changes,)``: it pickles across processes
        self.changes = list(changes)

    def __str__(self) -> str:
        return "\n".join(
            [
                "refusing to grade: the grader's files changed since it started "
                "(a notebook may have written to them); no further result was written",
                *(f"  {c}" for c in self.changes),
            ]
        )


def grader_roots(solutions: Path | str | None = None) -> list[Path]:
    """What decides a grade: the whole ``quack_edu`` package (the grading package, its
    exercises and the library modules the checks import) and the solution notebooks folder
    the grader restores check cells from (``solutions``, default ``solutions/``)."""
    from .nbfiles import solutions_dir

    package = Path(__file__).resolve().parents[1]
    return [package, Path(solutions).resolve() if solutions else solutions_dir()]


def _files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():  # no solutions/ (an installed package): nothing to hash there
        return []
    files = []
    for p in sorted(root.rglob("*")):
        if any(s.startswith(".") or s == "__pycache__" for s in p.relative_to(root).parts):
            continue
        if p.suffix in SUFFIXES and p.is_file():
            files.append(p)
    return files


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:  # removed or made unreadable while we looked: not the file it was
        return f"unreadable: {type(e).__name__}"


def snapshot(*roots: Path | str) -> Manifest:
    """Hash every ``.py`` and ``.ipynb`` file under ``roots`` (hidden folders, such as
    ``.ipynb_checkpoints``, and ``__pycache__`` left out)."""
    roots_ = tuple(str(Path(r).resolve()) for r in roots)
    hashes = {str(p): _sha256(p) for r in roots_ for p in _files(Path(r))}
    return Manifest(roots_, hashes)


def verify(manifest: Manifest) -> list[str]:
    """The files changed, added or removed since ``manifest`` was taken, one ``"changed PATH"``,
    ``"added PATH"`` or ``"removed PATH"`` each, by path; empty when nothing changed."""
    before, now = manifest.hashes, snapshot(*manifest.roots).hashes
    changes = {f: "changed" for f in before.keys() & now.keys() if before[f] != now[f]}
    changes.update({f: "removed" for f in before.keys() - now.keys()})
    changes.update({f: "added" for f in now.keys() - before.keys()})
    return [f"{what} {f}" for f, what in sorted(changes.items())]


def check(manifest: Manifest) -> None:
    """Raise ``GraderTampered`` naming the files if any changed since ``manifest``."""
    changes = verify(manifest)
    if changes:
        raise GraderTampered(changes)
