"""``quack-edu grade --isolate namespaces`` (``grading.isolate``): the learner processes inside
bubblewrap. What the namespaces stop is tested with the grader's other layers out of the way
(a child without the sandbox; a grade with Landlock off), so that it is theirs alone: no other
process in /proc, no file of the solutions, nothing written outside the scratch folder, even
by native code (``open`` through ctypes, ``torch.from_file``), no network; and a solution still
grades full. Skipped where bwrap is missing or cannot make the namespaces."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from quack_edu.grading import isolate

ROOT = Path(__file__).resolve().parents[1]
LESSON = "00_setup_and_roofline"


def _bwrap_or_skip() -> None:
    try:
        isolate.require()
    except isolate.IsolationUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture
def fresh_probe():
    """``isolate`` asks bwrap again, and this process's choice is undone after the test (the
    judge server started under it is replaced at the next start: ``judge.Server``)."""
    isolate._probe.cache_clear()
    yield
    isolate._probe.cache_clear()
    isolate._chosen.clear()


def test_namespaces_asked_for_where_bwrap_cannot_is_an_error(
    tmp_path, monkeypatch, capsys, fresh_probe
):
    monkeypatch.delenv(isolate.ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap
    with pytest.raises(isolate.IsolationUnavailable, match="apt-get install bubblewrap"):
        isolate.use("namespaces")
    fake = tmp_path / "bwrap"  # one the kernel refuses namespaces to
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    isolate._probe.cache_clear()
    with pytest.raises(isolate.IsolationUnavailable, match="No permissions.*user namespaces"):
        isolate.use("namespaces")
    from quack_edu.grading.cli import grade_main

    nb = ROOT / "solutions" / f"{LESSON}.ipynb"  # (nothing is run: it stops first)
    assert grade_main([str(nb), "--isolate", "namespaces"]) == 2
    assert "cannot create the namespaces" in capsys.readouterr().err
    assert isolate.use("none") == "none"  # (the default asks nothing of the machine)
    monkeypatch.setenv(isolate.ENV, "containers")
    with pytest.raises(ValueError, match="one of none, namespaces"):
        isolate.use(None)


#: run inside bwrap without the sandbox: libc's own calls, as native code makes them
CHILD = textwrap.dedent(
    """
    import ctypes, errno, json, os, socket, sys
    grader, secret, outside, readonly, scratch, port, fd = sys.argv[1:]
    libc = ctypes.CDLL(None, use_errno=True)

    def native_open(path, flags, text=b""):
        got = libc.open(path.encode(), flags, 0o644)
        if got < 0:
            return errno.errorcode[ctypes.get_errno()]
        os.write(got, text)
        os.close(got)
        return "opened"

    out = {
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "grader's /proc entry": os.path.exists(f"/proc/{grader}"),
        "read a solution": native_open(secret, os.O_RDONLY),
        "write outside (tmp)": native_open(outside, os.O_WRONLY | os.O_CREAT, b"x"),
        "write the package": native_open(readonly, os.O_WRONLY | os.O_APPEND),  # (writes none)
        "write in the scratch folder": native_open(scratch, os.O_WRONLY | os.O_CREAT, b"x"),
        "devices": sorted(os.listdir("/dev")),
    }
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
        out["connect to the grader's port"] = "connected"
    except OSError as e:
        out["connect to the grader's port"] = type(e).__name__
    os.write(int(fd), json.dumps(out).encode())  # (a descriptor the grader passed through bwrap)
    """
)


def test_a_process_in_the_namespaces_reaches_nothing_outside_its_scratch(tmp_path):
    _bwrap_or_skip()
    from quack_edu.grading.judge import secret_paths

    secret = next((ROOT / "solutions").glob("*.ipynb"))
    scratch, outside = tmp_path / "scratch", tmp_path / "outside"
    outside.mkdir()
    listener = socket.create_server(("127.0.0.1", 0))
    r, w = os.pipe()
    args = [os.getpid(), secret, outside / "x", ROOT / "pyproject.toml", scratch / "x",
            listener.getsockname()[1], w]  # fmt: skip
    cmd = isolate.command(
        [sys.executable, "-c", CHILD, *map(str, args)], env=dict(os.environ),
        writable=[scratch], hidden=secret_paths(),
    )  # fmt: skip
    try:
        done = subprocess.run(cmd, pass_fds=(w,), capture_output=True, text=True, timeout=60)
    finally:
        os.close(w)
        listener.close()
    with os.fdopen(r) as f:
        reply = f.read()
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(reply)
    assert os.getpid() not in out["pids"] and len(out["pids"]) <= 3, out  # bwrap's init, itself
    assert out["grader's /proc entry"] is False, out
    assert out["read a solution"] == "ENOENT", out  # the solutions folder is empty there
    assert out["write outside (tmp)"] == "ENOENT", out  # the temporary folder is its own
    assert out["write the package"] == "EROFS", out
    assert out["write in the scratch folder"] == "opened", out
    assert out["connect to the grader's port"] == "ConnectionRefusedError", out  # its own net
    # a /dev of its own: no disk, loop device or console of the machine (red team 11), a GPU's
    plain = {"core", "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin",
             "stdout", "tty", "urandom", "zero"}  # fmt: skip
    assert {d for d in out["devices"] if not d.startswith("nvidia")} <= plain, out["devices"]
    assert (scratch / "x").read_text() == "x" and not list(outside.iterdir())


#: appended to the lesson: what a cell's native code reaches (torch.from_file opens files in C++)
PROBE_CELL = textwrap.dedent(
    """
    import json, os, torch

    def _try(fn):
        try:
            fn()
            return "ran"
        except Exception as e:
            return str(e)[:300]

    print("ISOLATE", json.dumps({
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "read a solution": _try(lambda: torch.from_file(SECRET, size=8, dtype=torch.uint8)),
        "write outside": _try(lambda: torch.from_file(OUTSIDE, shared=True, size=8)),
        "open the package to write": _try(lambda: torch.from_file(README, shared=True, size=1)),
    }))
    """
)


@pytest.mark.slow
def test_a_solution_grades_full_under_namespaces(tmp_path, monkeypatch, fresh_probe):
    _bwrap_or_skip()
    from quack_edu.grading import judge
    from quack_edu.grading.cli import grade_main
    from quack_edu.grading.notebook import nbformat, read, solutions_dir, write

    monkeypatch.setenv("QUACK_EDU_LANDLOCK", "0")  # the namespaces alone
    outside = tmp_path / "outside"
    outside.mkdir()
    nb = read(solutions_dir() / f"{LESSON}.ipynb")
    names = {"SECRET": solutions_dir() / f"{LESSON}.ipynb", "OUTSIDE": outside / "x.bin",
             "README": ROOT / "README.md"}  # fmt: skip
    head = "".join(f"{k} = {str(v)!r}\n" for k, v in names.items())
    nb.cells.append(nbformat.v4.new_code_cell(head + PROBE_CELL))
    path = tmp_path / f"{LESSON}.ipynb"
    write(nb, path)
    forks = []  # each judge worker's NSpid: (its pid here, its pid in its namespace)
    real_fork = judge.Server.fork

    def fork():
        pid, conn, rec = real_fork()
        status = Path(f"/proc/{pid}/status").read_text()
        forks.append((pid, status.split("NSpid:")[1].split("\n")[0].split()))
        return pid, conn, rec

    monkeypatch.setattr(judge.Server, "fork", fork)
    out = tmp_path / "grade.json"
    rc = grade_main([str(path), "--isolate", "namespaces", "--json", str(out),
                     "--executed", str(tmp_path / "ran")])  # fmt: skip
    data = json.loads(out.read_text())
    assert rc == 0 and data["score"] == data["max_score"] > 0, data
    assert data["isolation"] == "namespaces"
    assert data["notebooks"][0]["boundary"]["isolation"].startswith("namespaces")
    assert data["notebooks"][0]["problems"] == [], data["notebooks"][0]["problems"]
    printed = [
        o["text"] for o in read(tmp_path / "ran" / path.name).cells[-1].outputs if "text" in o
    ]
    seen = json.loads("".join(printed).split("ISOLATE", 1)[1])
    assert os.getpid() not in seen["pids"] and len(seen["pids"]) <= 3, seen
    assert "No such file" in seen["read a solution"], seen
    assert "No such file" in seen["write outside"] and not list(outside.iterdir()), seen
    assert "Read-only file system" in seen["open the package to write"], seen
    # the grader kills a worker by the pid the kernel gave it here, not its namespace's
    assert forks and all(ns[0] == str(pid) and len(ns) == 2 for pid, ns in forks), forks
