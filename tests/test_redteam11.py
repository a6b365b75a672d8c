"""Red team 11 (2026-12-06, had read the grader): four routes past the boundary, each now scoring
0 and flagged, or refused by the kernel (issue 49). Its notebooks: /work/rt11/attacks.

1. a ``--solutions`` folder outside the repository was readable by learner code (only the
   repository's own ``solutions/`` was secret): ``np.fromfile`` of the solution notebook, the
   answer taken out of its JSON, scored full unflagged (a01);
2. ``--executed DIR`` (the graded notebooks, answers and outputs) was readable by a later
   notebook (a03);
3. an existing file of ``/dev/shm`` was writable by native code (``torch.from_file(...,
   shared=True)``) and readable by a later grading, a channel that carried a hidden case's M
   into that grading's feedback (a04, a05);
4. device files were readable: a block device, the console (a02).

Each test failed before its fix (``judge.instructor_paths``, ``confine.devices``). With them,
what the next red teams left: a notebook whose cells share an id (red team 10: the second was
dropped without a word) and a checkout's test caches (red team 12 read .pytest_cache).
"""

from __future__ import annotations

import os
import shutil
import textwrap
import uuid
from pathlib import Path

import pytest

from quack_edu.grading import confine, get
from quack_edu.grading.judge import judge_exercise
from quack_edu.grading.notebook import find_cell, grade_notebook, notebooks_dir, read, write

ROOT = Path(__file__).resolve().parents[1]
LESSON = "00_setup_and_roofline"
EX = "00.eager_bytes"

#: an answer cell that defines the function only if it could read ``PATH`` (numpy's reader,
#: which the screen does not name); its body is wrong, so a read is the only way to points
READER = textwrap.dedent(
    """
    import numpy as np
    _seen = np.fromfile({path!r}, dtype=np.uint8)

    def eager_bytes(M, N, dtype):
        return int(_seen.size)
    """
)


def _attack(tmp_path: Path, source: str) -> Path:
    """The student notebook of lesson 00 with ``source`` in 00.eager_bytes's answer cell."""
    nb = read(notebooks_dir() / f"{LESSON}.ipynb")
    find_cell(nb, get(EX).cell_id).source = source
    path = tmp_path / "student" / f"{LESSON}.ipynb"
    path.parent.mkdir()
    write(nb, path)
    return path


def _judged(res):
    (ex,) = [e for e in res.exercises if e.id == EX]
    return ex


def test_a_solutions_folder_outside_the_repository_is_secret(tmp_path):
    private = tmp_path / "private" / "solutions"
    private.mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / f"{LESSON}.ipynb", private)
    nb = _attack(tmp_path, READER.format(path=str(private / f"{LESSON}.ipynb")))
    res = grade_notebook(nb, solutions=private, only=EX, seed=1)
    ex = _judged(res)
    assert ex.score == 0 and ex.flagged, res.table()
    assert "reading" in " ".join(ex.evidence), res.table()


def test_the_executed_notebooks_are_secret(tmp_path):
    executed = tmp_path / "executed"
    executed.mkdir()
    (executed / "ana.ipynb").write_text("{}")  # an earlier student's, answers and outputs
    nb = _attack(tmp_path, READER.format(path=str(executed / "ana.ipynb")))
    res = grade_notebook(nb, executed_dir=executed, only=EX, seed=1)
    ex = _judged(res)
    assert ex.score == 0 and ex.flagged, res.table()


def test_no_device_file_but_null_zero_random_and_a_gpus():
    allowed = confine.devices()
    assert "/dev/null" in allowed and "/dev/urandom" in allowed
    assert not [d for d in allowed if d.startswith(("/dev/shm", "/dev/loop", "/dev/sd", "/dev/vd"))]
    assert all(d in confine.PLAIN_DEVICES or d.startswith("/dev/nvidia") for d in allowed)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm here")
def test_an_existing_file_of_dev_shm_is_neither_opened_nor_written_natively():
    """Python's open (numpy's memmap) is refused by the audit hook (flagged); torch's native
    writer by Landlock where the kernel has it (the file keeps its bytes either way)."""
    channel = Path("/dev/shm") / f"quack_edu_rt11_{uuid.uuid4().hex[:8]}"
    channel.write_bytes(b"-" * 16)
    try:
        ex = get("00.bytes_moved")
        by_open = textwrap.dedent(
            f"""
            import numpy as np
            _m = np.memmap({str(channel)!r}, dtype=np.uint8, mode="r+")
            _m[:] = 66

            def bytes_moved(M, N, dtype):
                return 0
            """
        )
        res = judge_exercise(ex, by_open, seed=1)
        assert res.flagged and "device" in " ".join(res.evidence)
        native = textwrap.dedent(
            f"""
            import torch
            try:
                _t = torch.from_file({str(channel)!r}, shared=True, size=16, dtype=torch.uint8)
                _t[:] = 65
            except Exception:
                pass

            def bytes_moved(M, N, dtype):
                return 0
            """
        )
        judge_exercise(ex, native, seed=1)
        if confine.abi() >= 1 and confine.confine_default():
            assert channel.read_bytes() == b"-" * 16  # the kernel refused the open
    finally:
        channel.unlink()


def test_a_notebook_whose_cells_share_an_id_is_flagged(tmp_path):
    """Red team 10's open item: an answer cell copied in Jupyter keeps its id; the grader takes
    the first, and said nothing of the second (the learner's answer there went ungraded)."""
    import copy

    from quack_edu.grading.notebook import solutions_dir

    nb = read(notebooks_dir() / f"{LESSON}.ipynb")
    ex = get("00.bytes_moved")
    cell = find_cell(nb, ex.cell_id)
    answer = find_cell(read(solutions_dir() / f"{LESSON}.ipynb"), ex.cell_id)
    second = copy.deepcopy(cell)
    second.source = answer.source
    nb.cells.insert(nb.cells.index(cell) + 1, second)
    path = tmp_path / f"{LESSON}.ipynb"
    write(nb, path)
    res = grade_notebook(path, only=ex.id, seed=1)
    assert any("share an id" in f and ex.cell_id in f for f in res.flags), res.flags
    (got,) = res.exercises
    assert got.score == 0  # the first, the blank one, is graded


def test_a_checkouts_test_caches_are_secret(tmp_path):
    """Red team 12 (blind) read .pytest_cache's list of every test's name from a cell."""
    from quack_edu.grading.judge import TEST_DIRS, secret_paths

    assert {".pytest_cache", ".ruff_cache", "tests"} <= set(TEST_DIRS)
    cache = ROOT / ".pytest_cache"
    if cache.is_dir():  # (there whenever pytest ran in this checkout)
        assert str(cache) in secret_paths()
        nb = _attack(tmp_path, READER.format(path=str(cache / "v" / "cache" / "nodeids")))
        res = grade_notebook(nb, only=EX, seed=1)
        ex = _judged(res)
        assert ex.score == 0 and ex.flagged, res.table()
