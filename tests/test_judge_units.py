"""Units of the judge and the report, no notebook run: the screen passes every solution and
mutant (honest answers are never flagged), the plain-data codec keeps data and nothing else,
and the report prints hints whole (wrapped, never clipped)."""

from __future__ import annotations

import pytest
import torch

from quack_edu.grading import all_exercises
from quack_edu.grading.answer_screen import screen
from quack_edu.grading.notebook import find_cell, read, solutions_dir
from quack_edu.grading.report import CheckResult, ExerciseResult, NotebookResult
from quack_edu.grading.wire import Unencodable, decode, encode


def test_no_solution_or_mutant_is_flagged():
    for ex in all_exercises():
        src = find_cell(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex.cell_id).source
        assert screen(src, ex) == [], ex.id
        for m in ex.mutants:
            assert screen(m.apply(src), ex) == [], (ex.id, m.name)


def _with(ex_id: str, *lines: str) -> str:
    from quack_edu.grading import get

    ex = get(ex_id)
    src = find_cell(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex.cell_id).source
    return "\n".join(lines) + "\n" + src


@pytest.mark.parametrize(
    "ex_id,lines,why",
    [
        # a module given to one exercise is not given to another
        ("02.warp_kernel", ["from quack_edu.primitives import reduce as r"], "imports reduce"),
        ("03.block_kernel", ["from quack_edu.primitives.reduce import row_reduce"], "row_reduce"),
        # a given module's helpers that are not given: the reductions the learner writes
        ("04.cluster_kernel", ["f = reduce_utils.cluster_reduce"], "reduce_utils.cluster_reduce"),
        ("04.cluster_kernel", ["from quack_edu.primitives.reduce import row_reduce"], "row_red"),
        # a module reached through a given one, or the given module passed around
        ("02.warp_kernel", ["c = copy_utils.cute"], "copy_utils.cute"),
        ("02.warp_kernel", ["m = copy_utils"], "other than to call"),
        ("02.warp_kernel", ["import quack_edu.primitives.copy"], "library's own"),
        # the stage's own kernel, which is the answer
        ("02.warp_kernel", ["from quack_edu.stages.warp import WarpRMSNorm"], "WarpRMSNorm"),
        ("04.cluster_kernel", ["import quack_edu.stages.cluster as s"], "stages.cluster"),
        ("03.block_kernel", ["k = super(type(self), self).kernel"], "super"),
        # the module a kernel exercise hands over holds this exercise's answer: the flag says so
        (
            "02.tv_layout",
            ["from quack_edu.primitives import copy as copy_utils"],
            "holds this exercise's answer, row_thread_layout, so it is off limits here; "
            "02.warp_kernel and 03.block_kernel hand it over",
        ),
        # the DSL that would compute what the exercise asks by hand, renamed on import
        ("01.thread_elements", ["import cutlass.cute as c"], "predict a partition by hand"),
        ("01.thread_elements", ["from cutlass import cute"], "predict a partition by hand"),
        ("01.layout_offset", ["from cutlass.cute import make_layout as ml"], "offset in Python"),
        # the loop that could tell the grader's replay from the compiled kernel
        ("06.row_loop", ["replayed = isinstance(1, int)"], "uses `isinstance`"),
        ("06.row_loop", ["replayed = type(cutlass.Int32)"], "uses `type`"),
        # the process's machinery imported from an allowed module under a name of its own
        # (red team 14: ``from torch import importlib as _il``, ``from typing import types``)
        ("00.bytes_moved", ["from torch import importlib as _il"], "imports importlib"),
        ("02.warp_kernel", ["from typing import types as _t"], "imports types"),
        ("02.warp_kernel", ["from torch import sys as s"], "imports sys"),
    ],
)
def test_given_helpers_only(ex_id, lines, why):
    # the whole-kernel exercises hand the learner the library's copy (and, in lesson 04,
    # reduction-buffer) helpers: those are allowed in their answer cells, nothing else is
    from quack_edu.grading import get

    flags = screen(_with(ex_id, *lines), get(ex_id))
    assert any(why in f for f in flags), flags


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        3,
        -(2**70),
        1.5e-300,
        float("inf"),
        "text",
        (1, [2.0, "x"], {"k": None}),
        torch.bfloat16,
        torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16),
        torch.empty(0, 5, dtype=torch.float16),
    ],
)
def test_plain_data_round_trips(value):
    back = decode(encode(value))
    if isinstance(value, torch.Tensor):
        assert back.dtype == value.dtype and back.shape == value.shape
        assert torch.equal(back, value)
    else:
        assert back == value and type(back) is type(value)


def test_only_data_crosses():
    class Anything(float):
        def __eq__(self, other):
            return True

    assert type(decode(encode(Anything(2.0)))) is float  # the number, not the object
    with pytest.raises(Unencodable):
        encode(object())
    with pytest.raises(ValueError):
        decode({"t": "tensor", "dtype": "float32", "shape": [4], "data": ""})  # short bytes
    with pytest.raises(ValueError):
        decode({"t": "dtype", "v": "Tensor"})  # not a dtype


def test_hints_are_printed_whole():
    hint = "a hint " + " ".join(f"word{i}" for i in range(60)) + " the-end"
    c = CheckResult("values", "compile", "fail", message="m " * 40, hint=hint)
    ex = ExerciseResult("00.x", "title", "00_x", {"compile": 1}, checks=[c])
    nb = NotebookResult("nb.ipynb", "00_x", exercises=[ex])
    for text in (ex.table(width=70), nb.table(width=70)):
        assert "…" not in text
        assert "the-end" in text and all(f"word{i}" in text for i in range(60))
        assert max(len(line) for line in text.splitlines()) <= 80, text


def test_a_compile_tier_pass_without_a_gpu_says_values_were_not_checked():
    """A learner without a Hopper GPU sees "pass" on the compile tier only with the words that
    it checked the compiled code, not the values (a wrong kernel can compile to the right
    instructions); with the GPU tier run, or the compile tier failed, the note is not there."""
    from quack_edu.grading.report import COMPILE_ONLY_MEANS, COMPILE_RUN_MEANS, RunResult

    def result(compile_status, gpu_status):
        checks = [
            CheckResult("compiles", "compile", compile_status),
            CheckResult("values", "gpu", gpu_status, message="needs a Hopper GPU"),
        ]
        return ExerciseResult("02.x", "t", "02_x", {"compile": 1, "gpu": 1}, checks=checks)

    words = "not the values it computes"
    assert words in COMPILE_ONLY_MEANS
    flat = " ".join(result("pass", "skip").table(width=90).split())
    assert words in flat and "score 1/1" in flat
    assert words not in " ".join(result("pass", "pass").table(width=90).split())
    assert words not in " ".join(result("fail", "skip").table(width=90).split())
    nb = NotebookResult("nb.ipynb", "02_x", exercises=[result("pass", "skip")])
    assert "values on the GPU and speed not checked" in nb.table(width=90)
    run = RunResult([nb], "compile-only", "no GPU", hidden=True, seed=0)
    assert " ".join(COMPILE_RUN_MEANS.split()) in " ".join(run.table(width=90).split())
    assert "a host function by the values it returns here" in COMPILE_RUN_MEANS
    # an exercise whose compile tier ran its PTX on the CPU says that instead (ptxsim)
    simulated = result("pass", "skip")
    simulated.checks.insert(
        1, CheckResult("values on the CPU (the PTX simulated)", "compile", "pass")
    )
    flat = " ".join(simulated.table(width=90).split())
    assert words not in flat and "the values it computes at a few small shapes" in flat
    # a function run on the CPU, no kernel (07.dx_row, 06.fake_impl): its values were checked
    host = ExerciseResult(
        "07.x", "t", "07_x", {"compile": 1, "gpu": 1},
        checks=[CheckResult("dx vs float64 autograd on the CPU", "compile", "pass"),
                CheckResult("on the GPU", "gpu", "skip", message="needs a Hopper GPU")],
    )  # fmt: skip
    flat = " ".join(host.table(width=90).split())
    assert words not in flat and "ran your function here, on the CPU" in flat


def test_the_judge_server_on_a_gpu_preloads_the_dsl_but_not_quack_edu():
    """A process that forks must not have initialised CUDA, and importing quack_edu does (its
    GPU detection). The server is started as a file, so that with ``dsl`` (the GPU default) it
    holds torch and CuTe DSL but never imported quack_edu; on the H200 a fork of a process that
    had imported it failed every GPU check ("Cannot re-initialize CUDA")."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    import quack_edu.grading.judge as judge

    server = Path(judge.__file__).with_name("_judgeserver.py")
    probe = (
        "import runpy, sys\n"
        f"sys.argv = [{str(server)!r}, sys.argv[1]]\n"
        "try:\n"
        f"    runpy.run_path({str(server)!r}, run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in ('quack_edu', 'cutlass', 'torch') if m in sys.modules))\n"
    )
    mine, theirs = socket.socketpair()
    mine.close()  # the server sees its control socket closed and returns at once
    env = {**os.environ, "QUACK_EDU_JUDGE_PRELOAD": "dsl"}
    done = subprocess.run(
        [sys.executable, "-c", probe, str(theirs.fileno())],
        pass_fds=(theirs.fileno(),), env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    theirs.close()
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "['cutlass', 'torch']", done.stdout


def test_every_solution_takes_the_arguments_its_stub_requires():
    """run_exercise fails an answer at once when it cannot take the student stub's required
    positional arguments (instead of compiling kernels around it first). Every solution's
    def must take them, or a right answer would be failed there."""
    import ast

    from quack_edu.grading.runner import _stub_arity

    for ex in all_exercises():
        need = _stub_arity(ex)
        assert need is not None, ex.id
        src = find_cell(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex.cell_id).source
        (fn,) = [
            n for n in ast.walk(ast.parse(src))
            if isinstance(n, ast.FunctionDef) and n.name == ex.answer
        ]  # fmt: skip
        a = fn.args
        most = len(a.posonlyargs) + len(a.args)
        least = most - len(a.defaults)
        assert least <= need and (need <= most or a.vararg), (ex.id, least, most, need)


BODY = ["issue", "first", "send", "wait", "combine", "rearm", "second"]


@pytest.mark.parametrize(
    "trace,why",
    [
        ([(k, {}) for k in BODY if k != "rearm"], "not armed again"),
        ([(k, {}) for k in BODY if k != "wait"], "no wait"),
        ([("issue", {})] + [(k, {}) for k in BODY], "calls issue 2 times"),
        (
            [(k, {}) for k in ["issue", "first", "send", "rearm", "wait", "combine", "second"]],
            "order",
        ),
        ([(k, {1: 0} if k == "wait" else {}) for k in BODY], "phase is the constant 0"),
    ],
)
def test_row_loop_compiled_calls_must_be_the_replayed_ones(trace, why):
    # 06.row_loop: the helper calls traced while compiling against one replayed iteration's
    from quack_edu.grading.checks import CheckFailed
    from quack_edu.grading.exercises.lesson06_row_loop import judge_trace

    judge_trace([(k, {}) for k in BODY], BODY)  # the solution's
    with pytest.raises(CheckFailed) as e:
        judge_trace(trace, BODY)
    assert why in f"{e.value} {e.value.hint}", (str(e.value), e.value.hint)


def test_a_remote_launch_is_timed_in_the_worker():
    # the GPU tier's speed checks time a judged answer where it lives: one request to the
    # worker, never a launch per timed call (that would ship x and out through the pipe:
    # 06.row_loop's 512 MiB input timed at 20 s a call on the H200)
    import torch

    from quack_edu.grading.checks import launch_time_us

    asked = []

    class Remote:
        def __call__(self, *a):
            raise AssertionError("launched through the pipe")

        def time_us(self, M, eps):
            asked.append((M, eps))
            return 12.5

    x = torch.zeros(37, 8)
    assert launch_time_us(Remote(), x, x[0], x, 1e-6) == 12.5
    assert asked == [(37, 1e-6)]


@pytest.mark.parametrize(
    "t",
    [torch.tensor(3.5), torch.tensor(7, dtype=torch.int64), torch.tensor(1.5).bfloat16()],
    ids=["fp32", "int64", "bf16"],
)
def test_a_zero_dim_tensor_crosses_the_wire(t):
    """Red team 7: an honest answer returned as a 0-d tensor failed to encode."""
    back = decode(encode(t))
    assert back.shape == () and back.dtype == t.dtype and torch.equal(back, t)
