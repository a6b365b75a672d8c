"""The learner's ``check`` (``quack_edu.lessons.check``) judges outside the notebook's process
(issue 49): the answer's cell text (or its data) goes to the grader's ``_checkserver``, which
judges as ``quack-edu grade`` does; the learner's process imports nothing of the grader."""

from __future__ import annotations

import json
import linecache
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from quack_edu import grading
from quack_edu.grading import get, wire
from quack_edu.grading._checkserver import judge_request
from quack_edu.grading.notebook import find_cell, notebooks_dir, read, solutions_dir
from quack_edu.lessons import selfcheck

LESSON00 = "00_setup_and_roofline"
#: the modules a learner's process must never hold
GRADER = ("quack_edu.grading",)


def solution_cell(ex_id: str) -> str:
    ex = get(ex_id)
    return find_cell(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex.cell_id).source


def in_cell(source: str, name: str, n=[0]):  # noqa: B006  (a counter: each cell its own name)
    """``name`` from ``source`` run as IPython runs a cell: compiled under a made-up file name
    that only ``linecache`` knows."""
    n[0] += 1
    filename = f"/tmp/ipykernel_{os.getpid()}/{n[0]}.py"  # IPython 8's form; no such file
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    ns = {"torch": torch}
    exec(compile(source, filename, "exec"), ns)
    return ns[name]


def test_the_client_speaks_the_wire_form():
    import numpy as np

    values = [
        None, True, 3, -(2**70), 0.1, float("inf"), "s", [1, (2.5, "x")], {"a": [1]},
        torch.float16, np.int64(7), np.float32(0.5), torch.arange(6).reshape(2, 3),
        torch.tensor([1.5, -2.0], dtype=torch.bfloat16), torch.empty(0, 4),
    ]  # fmt: skip
    for v in values:
        assert selfcheck.encode(v) == wire.encode(v), v
    with pytest.raises(TypeError):
        selfcheck.encode(object())
    assert selfcheck.ENV_GRADING == grading.ENV_GRADING


def test_a_cell_function_sends_its_cell_text():
    src = solution_cell("00.bytes_moved")
    fn = in_cell(src, "bytes_moved")
    req = selfcheck.request("00.bytes_moved", fn, hidden=True, seed=3)
    assert req == {"exercise": "00.bytes_moved", "hidden": True, "seed": 3,
                   "source": src, "name": "bytes_moved"}  # fmt: skip
    assert selfcheck.request("00.bytes_moved")["missing"]
    assert selfcheck.request("00.bytes_moved", (1, 2))["value"] == wire.encode((1, 2))
    assert "unencodable" in selfcheck.request("00.bytes_moved", object())


def test_a_cell_that_stopped_before_its_def_is_not_judged_by_the_old_function(monkeypatch, capsys):
    """A cold learner's: the exercise cell edited into a SyntaxError, ``check`` judged the
    function defined before it (2/2). Now the latest defining cell must be the function's."""
    import types

    src = solution_cell("00.bytes_moved")
    fn = in_cell(src, "bytes_moved")
    user_ns = {"In": ["", src, "check('00.bytes_moved', bytes_moved)"]}
    shell = types.SimpleNamespace(user_ns=user_ns)
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    assert selfcheck.stale_definition(fn) is None
    broken = src.replace("def bytes_moved(", "def bytes_moved((")  # a SyntaxError
    user_ns["In"].append(broken)
    assert "stopped before its def ran" in selfcheck.stale_definition(fn)
    asked = []
    monkeypatch.setattr(selfcheck, "_ask", asked.append)
    assert selfcheck.check("00.bytes_moved", fn) is None and not asked
    assert "not checked" in capsys.readouterr().out
    user_ns["In"].append(src)  # fixed and run again
    assert selfcheck.stale_definition(fn) is None
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: None))
    assert selfcheck.stale_definition(fn) is None  # a script, not a notebook


def test_a_function_exercise_passes_its_solution_and_fails_a_mutant_with_the_hint(capsys):
    ex = get("00.bytes_moved")
    src = solution_cell(ex.id)
    res = selfcheck.check(ex.id, in_cell(src, "bytes_moved"))
    assert res.status == "pass" and res.score == res.max_score == 1
    assert "pass" in capsys.readouterr().out
    res = selfcheck.check(ex.id, in_cell(src, "bytes_moved"), hidden=True)
    assert res.status == "pass" and any(c["hidden"] for c in res.checks)

    mutant = ex.mutants[0]  # forgets the weight
    wrong = in_cell(mutant.apply(src), "bytes_moved")
    res = selfcheck.check(ex.id, wrong)
    out = capsys.readouterr().out
    assert res.status == "fail" and res.score == 0
    assert mutant.hint in out and "hint:" in out
    with pytest.raises(AssertionError, match="00.bytes_moved: 0/1"):
        selfcheck.check(ex.id, wrong, hidden=True)

    blank = in_cell("def bytes_moved(M, N, dtype):\n    raise NotImplementedError\n", "bytes_moved")
    assert selfcheck.check(ex.id, blank, quiet=True).status == "not attempted"
    with pytest.raises(KeyError, match="no exercise"):
        selfcheck.check("00.no_such_exercise", wrong)


def test_a_kernel_exercise_compiles_the_cell_in_the_judge():
    src = solution_cell("02.warp_reduce")
    ns_src = "import cutlass\nimport cutlass.cute as cute\nfrom cutlass import Float32, Int32\n"
    fn = in_cell(ns_src + src, "warp_reduce_sum")
    res = selfcheck.check("02.warp_reduce", fn, quiet=True)
    assert res.status in ("pass", "skip") and res.score == res.max_score > 0, res.failures


def test_a_value_is_sent_as_data_and_judged_on_the_server_side():
    # every exercise asks for a function: a value fails, with the hint to pass the function;
    # a tensor's bytes cross and are rebuilt on the grader's side (``judge_request``, in-process)
    req = selfcheck.request("00.bytes_moved", torch.ones(3, dtype=torch.bfloat16))
    reply = judge_request(json.loads(json.dumps(req)))
    assert reply["ok"] and reply["result"]["status"] == "fail"
    failures = "; ".join(reply["result"]["failures"])
    assert "not callable ('Tensor' object" in failures
    assert "check('00.bytes_moved', bytes_moved)" in failures
    res = selfcheck.check("00.bytes_moved", 12345, quiet=True)
    assert res.status == "fail" and "pass the function" in "; ".join(res.failures)


def test_a_function_defined_in_a_file_sends_the_file(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("import torch\n\n" + solution_cell("00.bytes_moved") + "\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import mine
    finally:
        sys.path.remove(str(tmp_path))
    req = selfcheck.request("00.bytes_moved", mine.bytes_moved)
    assert req["source"] == path.read_text()
    assert selfcheck.check("00.bytes_moved", mine.bytes_moved, quiet=True).status == "pass"


def test_the_library_own_function_is_named_not_judged_as_a_cell():
    """``rmsnorm_fwd_fake = forward._fwd_fake`` passes the library's function: its file is not
    the answer cell (a cold learner's flag listed forward.py's lines 9-204 as the cell's)."""
    from quack_edu.host import forward

    req = selfcheck.request("06.fake_impl", forward._fwd_fake)
    assert req["library"] == "quack_edu/host/forward.py" and "source" not in req
    reply = judge_request(json.loads(json.dumps(req)))
    assert reply["result"]["status"] == "fail" and reply["result"]["score"] == 0
    said = " ".join(reply["table"].split())
    assert "is `_fwd_fake` of quack_edu/host/forward.py, the library's own" in said
    assert "line 9" not in said and "defines `_fwd_fake`" not in said
    # a function of any other file (this test's, a learner's) is no library's
    assert selfcheck.library_file(test_the_client_speaks_the_wire_form) is None


def test_the_learner_process_holds_no_grader_module(subprocess_env, tmp_path):
    # a notebook's process: IPython's own shell where it is installed (each cell registered
    # in linecache as IPython does), else a cell simulated as in ``in_cell``
    src = solution_cell("00.bytes_moved")
    code = textwrap.dedent(f"""
        import json, linecache, sys
        import torch
        from quack_edu.lessons import check
        src = {src!r}
        try:
            from IPython.core.interactiveshell import InteractiveShell
        except ImportError:
            name = "/tmp/ipykernel_0/1.py"
            linecache.cache[name] = (len(src), None, src.splitlines(True), name)
            ns = {{"torch": torch}}
            exec(compile(src, name, "exec"), ns)
        else:
            shell = InteractiveShell.instance()
            shell.run_cell("import torch", store_history=True)
            shell.run_cell(src, store_history=True).raise_error()
            ns = shell.user_ns
        res = check("00.bytes_moved", ns["bytes_moved"], quiet=True)
        held = sorted(m for m in sys.modules if m.startswith({GRADER!r}))
        print(json.dumps({{"status": res.status, "held": held}}))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=subprocess_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"status": "pass", "held": []}


def test_while_graded_it_only_prints(monkeypatch, capsys):
    monkeypatch.setenv(grading.ENV_GRADING, "1")
    monkeypatch.setattr(selfcheck, "_ask", lambda req: pytest.fail("asked the grader"))
    monkeypatch.setattr(selfcheck, "_Server", lambda: pytest.fail("started the grader"))
    assert selfcheck.check("00.bytes_moved", lambda M, N, d: 0) is None
    assert capsys.readouterr().out.strip() == (
        "00.bytes_moved: judged by the grader, outside this notebook"
    )
    selfcheck.start()  # does nothing while graded
    assert selfcheck.check("00.bytes_moved", None, quiet=True) is None
    assert capsys.readouterr().out == ""


@pytest.fixture
def own_server(monkeypatch):
    """A server of this test's own (the module's shared one left alone)."""
    monkeypatch.setattr(selfcheck, "_server", None)
    yield
    selfcheck.stop()


def test_a_server_that_cannot_start_says_why(monkeypatch, own_server):
    monkeypatch.setattr(selfcheck, "SERVER_MODULE", "quack_edu.no_such_module")
    why = "(?s)exited .* while starting.*No module named"
    with pytest.raises(selfcheck.GraderUnavailable, match=why):
        selfcheck.check("00.bytes_moved", lambda M, N, d: 0)
    assert selfcheck._server is None  # the next check starts a fresh one


def test_a_server_that_hangs_is_stopped_at_the_timeout(monkeypatch, own_server):
    argv = [sys.executable, "-c", "import sys, time; print('starting', file=sys.stderr, "
            "flush=True); time.sleep(120)"]  # fmt: skip
    monkeypatch.setattr(selfcheck, "server_argv", lambda: argv)
    monkeypatch.setattr(selfcheck, "START_TIMEOUT", 2.0)
    why = "(?s)while starting within 2 s.*stopped.*log.*ends:\n    starting"
    with pytest.raises(selfcheck.GraderUnavailable, match=why):
        selfcheck.check("00.bytes_moved", lambda M, N, d: 0)


def test_a_server_started_long_before_the_first_check_is_not_timed_out(monkeypatch, own_server):
    """A notebook imports ``check`` (which starts the server) and checks minutes later: the
    ready line it sent long ago is read, not taken for a start that timed out (CI, 2026-12-07:
    a test process's server started by an earlier test)."""
    import time

    server = (
        "import json, sys\n"
        "print(json.dumps({'ready': True, 'pid': 0, 'mode': 'fake'}), flush=True)\n"
        "for line in sys.stdin:\n"
        "    req = json.loads(line)\n"
        "    print(json.dumps({'ok': False, 'error': 'answered', 'type': 'KeyError',"
        " 'id': req['id']}), flush=True)\n"
    )
    monkeypatch.setattr(selfcheck, "server_argv", lambda: [sys.executable, "-c", server])
    monkeypatch.setattr(selfcheck, "START_TIMEOUT", 1.0)
    selfcheck.start()
    time.sleep(2.0)  # past the start's deadline, with its ready line waiting in the pipe
    with pytest.raises(KeyError, match="answered"):
        selfcheck.check("00.bytes_moved", lambda M, N, d: 0)


@pytest.mark.parametrize("folder", [solutions_dir, notebooks_dir], ids=["solutions", "notebooks"])
def test_no_notebook_imports_the_grader(folder):
    paths = sorted(folder().glob("*.ipynb"))
    assert paths
    for path in paths:
        for i, cell in enumerate(read(path).cells):
            if cell.cell_type == "code":
                assert "quack_edu.grading" not in cell.source, f"{path.name} cell {i}"


def test_the_check_server_imports_nothing_at_import():
    # the judge's workers import every module of the library: this one must bring none of the
    # grader's exercises with it
    src = Path(selfcheck.__file__).parents[1] / "grading" / "_checkserver.py"
    import ast

    tree = ast.parse(src.read_text())
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    assert [ast.unparse(n) for n in top] == ["from __future__ import annotations"]
