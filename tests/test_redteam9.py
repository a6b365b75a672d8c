"""Red team 9 (2026-12-08, had read the grader): what a learner's text could do to the grader's
own process, and the routes past the sandbox's record and tripwires, each now scoring 0 or
flagged (issue 49). Their notebooks: /work/rt9/attacks (README.md there).

A. an answer cell ``_x = 1+1+...+1`` (20000 terms): a RecursionError in the screen's and the
   similarity's ``ast.parse`` ended the grader, and a class's run before its gradebook (a6); a
   forged PTX of ``'\\n/*x' * 100000`` kept the grader in ptxsim's comment regex > 300 s (a5);
B. the record of what was compiled at run time, switched off from learner code (a string
   evaluated by ``typing.ForwardRef._evaluate``, which the screen never sees): the finished
   kernel exec'd from text scored full unflagged (a1, a2, a4);
C. library functions that hand learner code a frame or a frame's locals (numpy's
   ``get_frame``, IPython's ``get_local_scope``, torch's ``set_eval_frame``), and text compiled
   under an installed file's name that was one line of it;
D. the worker's ``keep`` (its torch tripwire's holder) reached through those locals, the
   tripwire destroyed and torch's RMSNorm called (a7).

Each test failed before its fix.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from quack_edu.grading import get
from quack_edu.grading.answer_screen import screen
from quack_edu.grading.judge import judge_exercise

DEEP = "_x = " + "1+" * 20000 + "1\n"


# ---- A: the grader's own process ----------------------------------------------------------------
def test_a_deeply_nested_answer_is_flagged_not_a_crash():
    ex = get("00.bytes_moved")
    assert screen(DEEP, ex) == ["could not be read (too deeply nested)"]
    res = judge_exercise(ex, DEEP + "def bytes_moved(M, N, dtype):\n    return 0\n", seed=1)
    assert res.score == 0 and res.flagged, res.table()
    assert "could not be read" in res.forced_message


def test_the_similarity_reads_a_deeply_nested_answer():
    from quack_edu.grading.similarity import compiler_view, same_answers, tokens

    assert compiler_view(DEEP) == DEEP  # as it is, unparsed
    assert len(tokens(DEEP)) > 40000
    assert same_answers({"a": DEEP, "b": DEEP}, None) == {"a": ["b"], "b": ["a"]}


@pytest.mark.slow
def test_a_class_with_a_deeply_nested_answer_writes_its_gradebook(tmp_path):
    import csv

    from quack_edu.grading.cli import grade_main
    from quack_edu.grading.notebook import find_cell, notebooks_dir, read, write

    ex = get("00.bytes_moved")
    for student in ("ana", "ben"):
        nb = read(notebooks_dir() / f"{ex.lesson}.ipynb")
        find_cell(nb, ex.cell_id).source = DEEP
        write(nb, tmp_path / "subs" / f"{student}.ipynb")
    out = tmp_path / "grades"
    args = [str(tmp_path / "subs"), "--lesson", ex.lesson, "--out", str(out), "--timeout", "60"]
    assert grade_main([*args, "--only", ex.id]) == 0
    rows = {r["student"]: r for r in csv.DictReader(open(out / "gradebook.csv"))}
    assert set(rows) == {"ana", "ben"}
    assert rows["ana"]["flagged"] == "yes"


PTX = """.version 8.0
.target sm_90a
.address_size 64
// a comment /* not a block */
.visible .entry k(.param .u64 p) /* block
over two lines */ {
    .reg .b32 %r<2>;
    mov.u32 %r1, 1; // a line comment
    ret;
}
"""


def test_ptx_comments_are_blanked_in_linear_time():
    from quack_edu.ptxsim.parser import blank_comments, parse

    old = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)  # (the regex it replaces: its results kept)
    for text in (PTX, "a/*b", "a/*b*/c//d\ne/*", "//x/*y\n*/z", "/*/ */", "/**/x//\n"):
        assert blank_comments(text) == old.sub(lambda m: re.sub(r"[^\n]", " ", m[0]), text)
    kernel = parse(PTX)
    assert kernel.name == "k" and [p.name for p in kernel.params] == ["p"]
    t0 = time.perf_counter()
    attack = PTX + "\n/*x" * 100_000  # (a5: > 300 s in the regex)
    assert parse(attack).name == "k"
    assert parse(PTX.replace("{", "") + ".entry k(" * 100_000 + "\n.entry j()\n{\n}\n").name == "k"
    assert time.perf_counter() - t0 < 5


def test_a_probe_reply_with_text_past_the_cap_is_garbled():
    from quack_edu.grading.judge import TEXT_MAX, JudgeAbort, within_text_cap

    ok = {"ptx": "x" * 1000, "registers": 3}
    assert within_text_cap(ok) is ok
    with pytest.raises(JudgeAbort) as e:
        within_text_cap({"v": [{"ptx": "x" * (TEXT_MAX + 1)}]})
    assert e.value.kind == "garbled" and e.value.message.startswith("flagged")


def test_the_graders_own_work_is_bounded_in_cpu_time():
    from quack_edu.grading.deadline import TooSlow, cpu_bound

    t0 = time.perf_counter()
    with pytest.raises(TooSlow, match="spinning"):
        with cpu_bound(0.3, "spinning"):
            while True:
                pass
    assert time.perf_counter() - t0 < 5
    with cpu_bound(5, "sleeping"):  # waiting (for a worker) costs no CPU time
        time.sleep(0.5)


# ---- B: the record of what is compiled at run time -------------------------------------------
def _finished_warp_kernel(prelude: str) -> str:
    """An answer cell that runs ``prelude`` (text evaluated by ``typing.ForwardRef``, which the
    screen never reads), then execs the finished warp kernel from hex-encoded text."""
    import inspect

    from quack_edu.stages.warp import WarpRMSNorm

    body = "class _K:\n" + inspect.getsource(WarpRMSNorm.kernel)
    payload = (
        "import sys, linecache\n"
        + prelude
        + f"text = bytes.fromhex({body.encode().hex()!r}).decode()\n"
        "f = '/tmp/enc_k.py'\n"
        "linecache.cache[f] = (len(text), None, text.splitlines(True), f)\n"
        "g = dict(vars(sys.modules['quack_edu.stages.warp']))\n"
        "exec(compile(text, f, 'exec'), g)\n"
        "_D['warp_kernel'] = g['_K'].kernel\n"
    )
    return (
        "import typing\n"
        f"_P = bytes.fromhex({payload.encode().hex()!r}).decode()\n"
        "_D = {'_P': _P}\n_D['_D'] = _D\n"
        "typing.ForwardRef('[exec(_P, _D), int][1]')._evaluate(_D, None, frozenset())\n"
        "warp_kernel = _D['warp_kernel']\n"
    )


#: a1: the worker's own count of what it kept, set past its quota
RECORD_OFF = "sys.modules['quack_edu.grading.sandbox']._state['compiled_chars'] = 10 ** 9\n"
#: the record's socket (the process's one SOCK_SEQPACKET socket) replaced, or closed
SOCKETS_GONE = (
    "import os, socket as _s\n"
    "for fd in range(3, 256):\n"
    "    try:\n"
    "        _k = _s.socket(fileno=os.dup(fd))\n"
    "        _t = _k.type\n"
    "        _k.close()\n"
    "        if _t == _s.SOCK_SEQPACKET:\n"
    "            _a, _b = _s.socketpair(_s.AF_UNIX, _s.SOCK_SEQPACKET)\n"
    "            try:\n"
    "                os.dup2(_a.fileno(), fd)\n"
    "            except OSError:\n"
    "                os.close(fd)\n"
    "    except OSError:\n"
    "        pass\n"
)


@pytest.mark.parametrize("prelude", [RECORD_OFF, SOCKETS_GONE], ids=["record off", "sockets"])
def test_the_record_of_compiled_text_is_out_of_the_learners_reach(prelude):
    """a1: 2/2 unflagged before the fix."""
    src = _finished_warp_kernel(prelude)
    ex = get("02.warp_kernel")
    assert any("ForwardRef" in w or "_evaluate" in w for w in screen(src, ex))
    res = judge_exercise(ex, src, seed=1, timeout=120, screened=False)
    assert res.score == 0, res.table()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="seccomp is Linux's")
def test_the_record_socket_cannot_be_closed_or_replaced():
    import os
    import subprocess

    code = (
        "import os, socket, sys\nfrom quack_edu.grading import confine\n"
        "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "assert confine.guard_fd(b.fileno())\n"
        "out = []\n"
        "for f in (lambda: os.close(b.fileno()), lambda: os.dup2(0, b.fileno())):\n"
        "    try:\n        f()\n        out.append('done')\n"
        "    except OSError:\n        out.append('refused')\n"
        "os.closerange(b.fileno(), b.fileno() + 1)\n"
        "os.write(b.fileno(), b'still')\nout.append(a.recv(9).decode())\nprint(out)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.stdout.strip() == "['refused', 'refused', 'still']", r.stderr


def test_a_record_message_out_of_the_hooks_order_is_a_flag():
    from quack_edu.grading.record import OVER_QUOTA, TAMPERED, Record

    rec = Record(None)
    rec._take(b"C1:0:/a.py\0x = ")
    rec._take(b"C1:1:/a.py\x001\n")
    rec._take(b"Irefused: something")
    assert rec.compiled == [("/a.py", "x = 1\n")] and rec.incidents == ["refused: something"]
    rec._take(b"C5:1:/b.py\0junk")  # a learner's own, ahead of the hook's next
    rec._take(b"C2:1:/c.py\0y")
    assert TAMPERED in rec.incidents
    big = Record(None)
    big._take(b"C1:1:/a.py\0" + b"x" * 20_000_000)
    assert OVER_QUOTA in big.incidents and big.compiled == []


# ---- D: the tripwires' holders ------------------------------------------------------------------
#: a7: the worker's ``main`` locals through IPython's ``get_local_scope``, its ``keep`` (the torch
#: tripwire's Library) destroyed, then torch's own RMSNorm called (1/1 unflagged for red team 9;
#: the cell says what it destroyed, and names the function other than by its name, which the
#: checks look for in its text)
DESTROY = """
import torch
_done = []
try:
    from IPython.core.interactiveshell import InteractiveShell as S
    for k in range(1, 40):
        try:
            loc = S.get_local_scope(None, k)
        except (ValueError, PermissionError):
            break
        if 'keep' in loc and 'conn' in loc:
            for lib in loc['keep']:
                if hasattr(lib, '_destroy'):
                    lib._destroy()
                    _done.append(1)
            break
except ImportError:
    pass
def eager_rmsnorm(x, w, eps=1e-6):
    if _done:
        raise ValueError("the tripwire was destroyed")
    return vars(torch.nn.functional)["rms" + "_norm"](x, (x.shape[-1],), w, eps)
"""


def test_the_torch_tripwire_cannot_be_destroyed():
    res = judge_exercise(get("00.eager_rmsnorm"), DESTROY, seed=1, timeout=120, screened=False)
    assert res.score == 0 and "destroyed" not in res.table(), res.table()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox's Linux paths")
def test_a_tripwire_undone_is_reached(tmp_path):
    import json
    import os
    import subprocess

    code = (
        "import json, sys, torch\n"
        "from quack_edu.grading import sandbox, tripwires\n"
        "def f(a):\n    return a\n"
        "lib = torch.library.Library('aten', 'IMPL')\n"
        "pair = tripwires.tripwire(f, 'f')\n"
        f"sandbox.lock_down({str(tmp_path)!r}, hold=(lib, pair), landlock=False)\n"
        "lib._destroy()\n"
        "exec(compile('1', '<x>', 'eval'))\n"
        "print(json.dumps(sandbox.incidents()))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert "reached: a tripwire undone" in json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


# ---- C: frames from library functions; text passed off as an installed file's ----------------
ANSWER = "\ndef bytes_moved(M, N, dtype):\n    return 0\n"
FRAME_ROUTES = {
    "numpy get_frame": "import numpy.distutils.misc_util as m\n_fr = m.get_frame(0)\n",
    # red team 17 (2026-12-07): jupyter_core's, which no list named
    "jupyter_core _get_frame": "from jupyter_core.utils import _get_frame\n_fr = _get_frame(0)\n",
    "IPython get_local_scope": (
        "from IPython.core.interactiveshell import InteractiveShell as S\n"
        "_loc = S.get_local_scope(None, 2)\n"
    ),
    "torch set_eval_frame": (
        "import torch\n_prev = torch._C._dynamo.eval_frame.set_eval_frame(lambda *a: None)\n"
    ),
    "one line of an installed file": (
        "import typing\n_f = typing.__file__\n"
        "_line = next(ln for ln in open(_f).read().splitlines() if ln.startswith('import '))\n"
        "exec(compile(_line, _f, 'exec'))\n"
    ),
}


def _importable(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # numpy 2 on Python 3.12: numpy.distutils is gone
        return False


@pytest.mark.parametrize("route", sorted(FRAME_ROUTES))
def test_library_functions_hand_learner_code_no_frame(route):
    """a2, a4, a5, a7 took their frames so (scored full before the fixes of B and D)."""
    import warnings

    needs = {"numpy get_frame": "numpy.distutils", "IPython get_local_scope": "IPython",
             "jupyter_core _get_frame": "jupyter_core.utils"}  # fmt: skip
    if route in needs and not _importable(needs[route]):  # the H200/H100 machines lack both
        pytest.skip(f"{needs[route]} is not installed here: the route does not exist")

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    res = judge_exercise(
        get("00.bytes_moved"), FRAME_ROUTES[route] + ANSWER, seed=1, timeout=120, screened=False
    )
    assert res.score == 0 and res.flagged, res.table()
    assert "frame" in res.forced_message or "passes for the library" in res.forced_message


def test_the_canonical_form_reads_a_deeply_nested_answer():
    from quack_edu.grading.similarity import canonical

    deep = "_x = " + "(" * 90 + "1" + ")" * 90 + "\n" + "_y = " + "-" * 900 + "1\n"
    assert canonical(DEEP) is None or isinstance(canonical(DEEP), str)
    assert canonical(deep) is None or isinstance(canonical(deep), str)
