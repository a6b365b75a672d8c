"""Red team 8 (blind, 2026-12-07): what a frame of the interpreter's stack, a reply that is not
data, and the learner's own text in a report could do to a grade, each scoring 0 or flagged.

A. a frame (through ``inspect``, a generator's ``gi_frame``, a traceback's ``tb_frame``, a
   signal handler's argument) walked up to the worker's ``main`` gave its globals: ``serve``
   replaced forged every reply, and the sandbox's record of compiled text switched off let the
   finished kernel, exec'd from encoded text, score full unflagged;
B. a reply nested past the JSON parser's depth, or with incidents of the wrong type, ended the
   grader (and a class run, with no gradebook);
C. a forged incident carried a hidden check's inputs into the student's feedback;
D. the feedback kept a learner's newlines and tabs.

Each test here failed before the fix (issue 49). The answer cells are judged with the screen off
(the boundary alone): the screen flags each of them by name too (``test_the_screen_names_frames``).
"""

from __future__ import annotations

import json

import pytest

from quack_edu.grading import get
from quack_edu.grading.answer_screen import screen
from quack_edu.grading.judge import judge_exercise

#: walks from a frame to the worker's ``main`` and replaces its ``serve`` by one that answers
#: every call with the right byte count, worked out from the request (no answer of its own)
FORGE = """
while _fr is not None:
    if _fr.f_code.co_name == "main" and _fr.f_code.co_filename.endswith("grading/worker.py"):
        _g = _fr.f_globals

        def _fake(req, answer, state, _real=_g["serve"], _enc=_g["encode"]):
            if req[0] == "call":
                M, N, dtype = req[1]
                size = torch.empty((), dtype=dtype).element_size()
                return {"value": _enc(2 * M * N * size + N * size)}
            return _real(req, answer, state)

        _g["serve"] = _fake
    _fr = _fr.f_back


def bytes_moved(M, N, dtype):
    return 0
"""

#: each a way to a frame of the cell's own code, in ``_fr``
ROUTES = {
    "inspect": "import torch\n_fr = torch._jit_internal.inspect.currentframe()\n",
    "generator": (
        "import torch\n\ndef _gen():\n    yield _it.gi_frame.f_back\n\n"
        "_it = _gen()\n_fr = next(_it)\n"
    ),
    "traceback": (
        "import torch\ntry:\n    1 / 0\nexcept ZeroDivisionError as _e:\n"
        "    _fr = _e.__traceback__.tb_frame\n"
    ),
    "signal": (  # a handler is handed the frame that ran when the signal came
        "import torch, signal\n_got = []\n"
        "signal.signal(signal.SIGALRM, lambda s, f: _got.append(f))\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.01)\n"
        "while not _got:\n    pass\n_fr = _got[0]\n"
    ),
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_frame_forges_no_reply(route):
    src = ROUTES[route] + FORGE
    ex = get("00.bytes_moved")
    assert screen(src, ex)  # (the screen names it: f_back, f_globals, ...)
    res = judge_exercise(ex, src, seed=1, timeout=60, screened=False)
    assert res.score == 0, res.table()
    if route != "signal":  # (the handler gets None for a frame: nothing to refuse)
        assert res.flagged and "frame" in res.forced_message, res.table()


def test_the_compile_record_stays_on():
    """a04/a15: the sandbox's record of compiled text switched off through a frame, then the
    finished warp kernel exec'd from encoded text (2/2 unflagged before the fix)."""
    import inspect

    from quack_edu.stages.warp import WarpRMSNorm

    body = "class _K:\n" + inspect.getsource(WarpRMSNorm.kernel)
    src = (
        "import linecache, sys\n"
        "def _gen():\n    yield _it.gi_frame.f_back\n\n_it = _gen()\n_fr = next(_it)\n"
        "_fr.f_globals['quack_edu'].grading.sandbox._state['compiled_chars'] = 10 ** 9\n"
        f"_text = bytes.fromhex({body.encode().hex()!r}).decode()\n"
        "_f = '/tmp/enc.py'\n"
        "linecache.cache[_f] = (len(_text), None, _text.splitlines(True), _f)\n"
        "_g = dict(vars(sys.modules['quack_edu.stages.warp']))\n"
        "exec(compile(_text, _f, 'exec'), _g)\n"
        "warp_kernel = _g['_K'].kernel\n"
    )
    res = judge_exercise(get("02.warp_kernel"), src, seed=1, timeout=120, screened=False)
    assert res.score == 0 and res.flagged, res.table()


def _forged_reply(payload: bytes, where: str = "at load") -> str:
    """An answer cell that writes ``payload`` to the worker's socket as a reply of its own (a
    length header and the bytes, as ``Connection.send_bytes`` frames one), at load or from
    inside a call (with ``@M`` and ``@N`` in the payload the call's arguments)."""
    send = (
        "    import os, stat\n"
        "    for fd in range(3, 256):\n"
        "        try:\n"
        "            if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
        "                os.write(fd, len(_p).to_bytes(4, 'big') + _p)\n"
        "        except OSError:\n"
        "            pass\n"
    )
    if where == "at load":
        load = f"_send({payload!r})\n"
        return f"def _send(_p):\n{send}\n{load}\ndef bytes_moved(M, N, dtype):\n    return 0\n"
    return (
        f"def _send(_p):\n{send}\n"
        "def bytes_moved(M, N, dtype):\n"
        f"    _send({payload.decode()!r}.replace('@M', str(M)).replace('@N', str(N)).encode())\n"
        "    return 0\n"
    )


@pytest.mark.parametrize(
    "payload",
    [b"[" * 200_000, b'{"loaded": true, "kind": "missing", "incidents": 5}',
     b'{"loaded": true, "kind": "value", "value": ' + b'{"t": "list", "v": [' * 400 + b"]}" * 400
     + b', "incidents": []}',
     b'{"loaded": true, "kind": "missing", "incidents": [], "compiled": [[1, 2, 3]]}',
     b'{"loaded": true, "kind": "missing", "short": [[[[]]]]}'],
    ids=["nested past the parser", "incidents a number", "a value nested deep",
         "compiled of the wrong shape", "a field not a scalar"],
)  # fmt: skip
def test_a_reply_that_is_not_data_scores_zero(payload):
    res = judge_exercise(get("00.bytes_moved"), _forged_reply(payload), seed=1, timeout=60,
                         screened=False)  # fmt: skip
    assert res.score == 0, res.table()


def test_an_incident_carries_no_hidden_case_to_the_student():
    """a14b: each call's arguments written into a forged incident, in the reply to that call."""
    payload = b'{"value": null, "incidents": ["LEAK @M @N\\n=1+1\\t"]}'
    res = judge_exercise(get("00.bytes_moved"), _forged_reply(payload, "in a call"), seed=1,
                         timeout=60, screened=False)  # fmt: skip
    assert res.score == 0 and res.flagged, res.table()
    student = res.table(hidden_inputs=False) + json.dumps(res.to_json(hidden_inputs=False))
    assert "LEAK" not in student and "=1+1" not in student, student
    assert "something the sandbox refuses" in student, student
    record = json.dumps(res.to_record())  # the instructor's: whole, escaped
    assert "LEAK" in record and "\\\\n=1+1\\\\t" in record, record


def test_the_feedback_shows_a_learners_text_escaped():
    """a13: a newline and a tab in an exception's message, and in a refused path, are shown as
    their escapes in what the student reads."""
    from quack_edu.grading.class_grade import feedback_text
    from quack_edu.grading.report import NotebookResult

    ex = get("00.bytes_moved")
    raising = "def bytes_moved(M, N, dtype):\n    raise ValueError('x\\n=1+1,\"ana\",99\\t')\n"
    path = "import os\nopen('/tmp/=1+1,\"evil\"\\n@SUM(1)\\t', 'w')\n" + raising
    for src in (raising, path):
        nb = NotebookResult("x.ipynb", ex.lesson)
        nb.exercises = [judge_exercise(ex, src, seed=1, timeout=60, screened=False)]
        nb.flags = ["a flag with a newline\n=2+2"]
        text = feedback_text("ana", nb, late=False)
        for line in text.splitlines():
            assert not line.lstrip().startswith(("=1+1", "@SUM", "=2+2")), text
        assert "\t" not in text, text


def test_the_screen_names_frames():
    ex = get("00.bytes_moved")
    for route in ROUTES.values():
        assert screen(route + FORGE, ex)
    assert screen("def bytes_moved(M, N, dtype):\n    return bytes_moved.__globals__\n", ex)
    assert screen("import torch\nx = torch._jit_internal.inspect\n", ex)


def test_a_class_goes_on_past_a_submission_the_grader_fails_on(tmp_path, monkeypatch):
    """a06 in a class (red team 8's class1): a submission whose reply is nested past the parser
    scores 0, and one on which the grader itself raises is 0 and flagged with the error's name;
    every other student is graded and the gradebook written."""
    import csv

    from quack_edu.grading import notebook
    from quack_edu.grading.class_grade import ClassOptions, grade_class
    from quack_edu.grading.notebook import find_cell, notebooks_dir, read, solutions_dir, write

    lesson, ex = "00_setup_and_roofline", get("00.bytes_moved")
    subs = tmp_path / "submissions"
    write(read(solutions_dir() / f"{lesson}.ipynb"), subs / "ana" / f"{lesson}.ipynb")
    bomb = read(notebooks_dir() / f"{lesson}.ipynb")
    find_cell(bomb, ex.cell_id).source = _forged_reply(b"[" * 200_000)
    write(bomb, subs / "aaa" / f"{lesson}.ipynb")
    write(read(notebooks_dir() / f"{lesson}.ipynb"), subs / "zed" / f"{lesson}.ipynb")
    real = notebook.grade_notebook

    def grade(path, **kwargs):  # a grader bug that only zed's notebook finds
        if "zed" in str(path):
            raise RuntimeError("a bug\n=1+1")
        return real(path, **kwargs)

    monkeypatch.setattr(notebook, "grade_notebook", grade)
    out = tmp_path / "grades"
    opts = ClassOptions(lesson=lesson, only=ex.id, timeout=60)
    grade_class(subs, out, opts)
    rows = {r["student"]: r for r in csv.DictReader(open(out / "gradebook.csv"))}
    assert rows["ana"]["score"] == "1" and rows["ana"]["flagged"] == "no", rows["ana"]
    assert rows["aaa"]["score"] == "0", rows["aaa"]
    assert rows["zed"]["score"] == "0" and rows["zed"]["flagged"] == "yes", rows["zed"]
    assert "RuntimeError" in rows["zed"]["flags"], rows["zed"]
    feedback = (out / "feedback" / "zed" / f"{lesson}.txt").read_text()
    assert "RuntimeError" in feedback and "=1+1" not in feedback, feedback
