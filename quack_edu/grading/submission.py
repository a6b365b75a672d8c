"""Reading a submission: the notebook handed in, never a file it points to.

Red team 6 handed in a symbolic link to the instructor's solution notebook (a tar keeps one)
and scored full marks. The grader now reads a submission through its own path only:

- the notebook is opened with ``O_NOFOLLOW``: a symbolic link is refused, not followed;
- in a class, every folder from the submissions folder down to it is opened the same way: a
  student folder (or one inside it) that is a link is refused, so what is read lies in the
  submissions folder;
- a notebook that *is* one of the solution notebooks (the same file: through a linked folder,
  a hard link) is refused unless it is named by its own path in the solutions folder (an
  instructor grading the solutions).

A refused submission is not read at all: it scores 0 and is flagged with ``Refused``'s reason.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # (a FIFO does not block the open)


#: how the flag of a refused submission begins (the gradebook's status says "refused")
REFUSED = "the submission was refused, not read"


class Refused(ValueError):
    """A submission the grader does not read; its text names the path and why."""


def _open(name, shown: str, dir_fd=None, folder=False) -> int:
    try:
        return os.open(name, _NOFOLLOW | (os.O_DIRECTORY if folder else 0), dir_fd=dir_fd)
    except OSError as e:
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            raise e from None  # not a link: the usual error (missing, unreadable)
        raise Refused(
            f"{shown} is a symbolic link (to {target}): the grader reads the notebook handed "
            "in, never what a link points to"
        ) from None


def read_bytes(path, root=None, solutions=None) -> bytes:
    """The bytes of the submission at ``path``: ``Refused`` if it is a link, if a folder
    between ``root`` (a class's submissions folder) and it is one, or if it is a solution
    notebook outside ``solutions``."""
    path = Path(path)
    fds = []
    try:
        if root is None:
            fd = _open(path, str(path))
        else:
            try:
                rel = path.relative_to(root)
            except ValueError:
                raise Refused(f"{path} is not in the submissions folder {root}") from None
            if ".." in rel.parts or not rel.parts:
                raise Refused(f"{path} is not in the submissions folder {root}")
            fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY))
            for i, part in enumerate(rel.parts[:-1]):
                shown = Path(*rel.parts[: i + 1]).as_posix()
                fds.append(_open(part, shown, dir_fd=fds[-1], folder=True))
            fd = _open(rel.parts[-1], rel.as_posix(), dir_fd=fds[-1])
        fds.append(fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{path} is not a regular file")
        _not_a_solution(path, st, solutions)
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        for fd in fds:
            os.close(fd)


def _not_a_solution(path: Path, st: os.stat_result, solutions) -> None:
    if solutions is None or not Path(solutions).is_dir():
        return
    folder = Path(solutions).resolve()
    if Path(os.path.abspath(path)).parent == folder:
        return  # a solution named by its own path: the instructor grading it
    for sol in folder.glob("*.ipynb"):
        s = sol.stat()
        if (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino):
            raise Refused(
                f"{path} is the solution notebook {sol.name} itself (a hard link, or reached "
                "through a linked folder): not graded"
            )


def read_notebook(path, root=None, solutions=None):
    """The submission at ``path`` as a notebook (``read_bytes``'s refusals)."""
    from .nbfiles import nbformat

    return nbformat.reads(read_bytes(path, root, solutions).decode(), as_version=4)
