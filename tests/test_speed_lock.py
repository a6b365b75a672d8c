"""Same scores under load (issue 49): the grader's speed checks time the kernel and the copy
alone on the GPU, under a machine-wide lock (``gpu_lock``), and measure again before failing.
CPU only: fakes stand for the kernel's time and the copy bandwidth."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
import types
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from quack_edu.grading import CheckFailed, checks, gpu_lock
from quack_edu.grading import speed as speed_checks
from quack_edu.tools import bench

#: a child that holds the lock at argv[1] until its stdin closes (the module loaded from its
#: file: it imports nothing of quack_edu, and the package's import would cost the child 1 s)
HOLDER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("gpu_lock", sys.argv[2])
gpu_lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_lock)
with gpu_lock.timing(sys.argv[1]) as held:
    print("held" if held else "not held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def lock(tmp_path, monkeypatch):
    """The GPU's timing lock, in this test's own directory; every lock taken is counted."""
    path = tmp_path / "gpu_timing.lock"
    monkeypatch.setattr(gpu_lock, "lock_path", lambda: path)
    taken = []
    acquire = gpu_lock._acquire

    def counted(fd, wait_s):
        taken.append(fd)
        return acquire(fd, wait_s)

    monkeypatch.setattr(gpu_lock, "_acquire", counted)
    return path, taken


@contextmanager
def held_by_another_process(path):
    """The lock at ``path`` held by a child process until the block ends."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), gpu_lock.__file__],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "held"
        yield child
    finally:
        child.kill()
        child.wait()


def test_the_timing_lock_is_one_process_at_a_time(lock):
    path, _ = lock
    entered = threading.Event()
    held = []

    def time_here():
        with gpu_lock.timing() as ok:
            held.append(ok)
            entered.set()

    with held_by_another_process(path) as first:
        t = threading.Thread(target=time_here)
        t.start()
        assert not entered.wait(0.5), "this process timed while another held the lock"
        first.stdin.close()  # the first process lets go
        assert entered.wait(10), "this process did not take the lock once it was free"
        t.join()
    assert held == [True]


def test_a_lock_held_too_long_is_not_waited_for(lock, monkeypatch):
    path, _ = lock
    monkeypatch.setattr(gpu_lock, "WAIT_S", 0.2)
    with held_by_another_process(path):
        t0 = time.monotonic()
        with gpu_lock.timing() as held:
            assert not held and not gpu_lock.held()
        assert time.monotonic() - t0 < 5


def test_a_locked_down_learner_process_creates_no_lock_file(lock, monkeypatch):
    # the grader's sandbox refuses (and flags) a file created outside the process's scratch
    # folder: such a process opens the lock only where it exists
    path, _ = lock
    sandbox = types.SimpleNamespace(locked=lambda: True)
    monkeypatch.setitem(sys.modules, "quack_edu.grading.sandbox", sandbox)
    with gpu_lock.timing() as held:
        assert not held
    assert not path.exists()
    path.touch()
    with gpu_lock.timing() as held:
        assert held


def test_every_process_agrees_on_the_lock_whatever_its_tmpdir(monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", "/somewhere/scratch/tmp")
    assert gpu_lock.lock_path().parent == gpu_lock.LOCK_DIR == Path("/tmp")


M, N = 64, 128
#: the copy bandwidth the fakes measure: the kernel's rate when it takes 10 us
COPY_GBPS = bench.gbps(bench.rmsnorm_bytes(M, N, torch.bfloat16, torch.bfloat16), 10.0)


@pytest.fixture
def speed(lock, monkeypatch):
    """``run(times)``: the verdict of ``gpu_speed`` (80% of copy) on a judged answer whose
    worker times the kernel at each of ``times`` in turn (us; 10 is the copy's rate), and
    ``seen``: what happened, in order, each with whether this process held the lock."""
    seen = []
    monkeypatch.setattr(speed_checks, "SPEED_PAUSE_S", 0.0)

    def copy_bandwidth():
        seen.append(("copy", gpu_lock.held()))
        return COPY_GBPS

    monkeypatch.setattr(bench, "copy_bandwidth", copy_bandwidth)
    monkeypatch.setattr(
        checks,
        "rmsnorm_inputs",
        lambda M, N, dtype, gen: (torch.zeros(M, N, dtype=dtype), torch.ones(N, dtype=dtype)),
    )

    def run(times):
        times = iter(times)

        class Remote:  # judge.RemoteLauncher's interface
            def __call__(self, x, w, out, eps):
                seen.append(("launch", x.shape[0], gpu_lock.held()))

            def time_us(self, M, eps):
                seen.append(("time", M, gpu_lock.held()))
                return next(times)

        class Ctx:
            def launcher(self, hole, N, dtype, config=None):
                return None, Remote()

            def torch_generator(self, salt=""):
                return torch.Generator()

        return checks.gpu_speed(None, fraction=0.8, M=M, N=N).fn(Ctx())

    return run, seen


def test_a_speed_check_that_fails_once_is_measured_again_and_passes(lock, speed):
    _, taken = lock
    run, seen = speed
    # 50% of copy (another grading's kernel on the GPU), then 100%
    assert "100% of copy" in run([20.0, 10.0])
    # the worker compiles the kernel at its first launch: one row launched before the lock is
    # taken; then each measurement, the kernel's time and the copy, under one hold of the lock
    assert seen == [("launch", 1, False), *[("time", M, True), ("copy", True)] * 2]
    assert len(taken) == 2


def test_a_speed_check_that_always_fails_says_how_often_it_measured(lock, speed):
    _, taken = lock
    run, seen = speed
    with pytest.raises(CheckFailed) as e:
        run([40.0, 20.0, 25.0])
    assert "the best of 3 measurements, each alone on the GPU" in e.value.message
    assert "50% of the copy bandwidth measured now" in e.value.message  # the best: 20 us
    assert e.value.seen.endswith("(20.0 us)")
    assert len(taken) == 3
    assert seen == [("launch", 1, False), *[("time", M, True), ("copy", True)] * 3]
