"""The grader a learner's ``check`` talks to: a process of its own, outside the notebook.

    python -m quack_edu.grading._checkserver

``quack_edu.lessons.check`` (the learner's side) starts it once per notebook session and keeps
it. It speaks JSON lines: stdin carries requests, stdout the replies (anything else it or a
library prints goes to stderr). Its first line says it is ready::

    {"ready": true, "pid": 123, "mode": "compile-only"}

then each request ``{"exercise": "02.warp_reduce", "hidden": false, "seed": null, ...}`` with
one of

- ``"source"`` (+ ``"name"``): the text of the cell (or file) that defines the answer, judged
  as ``quack-edu grade`` judges an answer cell (``judge.judge_exercise``: screened, loaded in a
  locked-down worker, every verdict computed here);
- ``"value"``: plain data in ``wire``'s form (numbers, strings, lists, tensors' bytes), decoded
  and checked here; no learner code runs anywhere for it;
- ``"unencodable"``: the answer's type, for an object that is neither (it fails, as in ``judge``);
- ``"library"`` (+ ``"name"``): the library file that defines the answer (the learner passed
  the library's own function): it fails, naming it, and no text of that file is judged;
- ``"missing": true``: no answer (not attempted);

gets ``{"ok": true, "table": ..., "summary": ..., "result": ExerciseResult.to_record()}``, or
``{"ok": false, "error": ..., "type": "KeyError"}`` when the request itself is wrong (an unknown
exercise). The server exits when stdin closes (its notebook is gone) or on SIGTERM, and the
judge server and workers it started go with it.

Nothing is imported at module level: the judge's workers import every module of the library
(``worker.preload_library``), and this one must bring them nothing.
"""

from __future__ import annotations


def _binds(source: str, name: str) -> bool:
    """Whether the cell's top level binds ``name`` (a def, a class, an assignment, an import)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(t)):
                    return True
        elif isinstance(node, ast.Import | ast.ImportFrom):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
    return False


def judge_request(req: dict) -> dict:
    """One request's reply (see the module's doc)."""
    import dataclasses

    from .judge import judge_exercise
    from .registry import MISSING, get
    from .report import FAIL
    from .runner import run_exercise
    from .wire import decode

    ex = get(str(req["exercise"]))
    hidden, seed = bool(req.get("hidden")), req.get("seed")
    note = None
    if "library" in req:
        from .report import shown_text

        res = run_exercise(ex, MISSING, hidden=hidden, seed=seed)
        res.forced_status = FAIL
        where = shown_text(f"`{req.get('name') or '?'}` of {req['library']}", 200)
        res.forced_message = (
            f"not yours: the {ex.answer} you passed is {where}, the library's own, not a "
            f"function a cell of this notebook defines. Define {ex.answer} in the exercise's "
            "cell: the grade judges that cell alone (where importing the library's own version "
            "is flagged)"
        )
    elif "source" in req:
        source, name = str(req["source"]), str(req.get("name") or ex.answer)
        if not _binds(source, ex.answer) and name.isidentifier() and _binds(source, name):
            # what was passed, judged; the grade reads the answer cell's own name
            note = (
                f"note: the grader judges `{ex.answer}` in the exercise's answer cell; "
                f"this cell defines `{name}` and no `{ex.answer}`"
            )
            ex = dataclasses.replace(ex, answer=name)
        res = judge_exercise(ex, source, hidden=hidden, seed=seed)
    elif "value" in req:
        res = run_exercise(ex, decode(req["value"]), hidden=hidden, seed=seed)
    elif "unencodable" in req:
        res = run_exercise(ex, MISSING, hidden=hidden, seed=seed)
        res.forced_status = FAIL
        res.forced_message = (
            f"the answer is a {str(req['unencodable'])[:200]}: neither a function defined in "
            "a cell or file nor plain data (a number, a string, a list, a tensor)"
        )
    else:
        res = run_exercise(ex, MISSING, hidden=hidden, seed=seed)
    if note:
        res.notes.append(note)
    return {"ok": True, "table": res.table(), "summary": res.summary(), "result": res.to_record()}


def main() -> int:
    import json
    import os
    import signal
    import sys

    # the protocol owns the real stdout; whatever prints (the DSL, warnings) goes to stderr
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def stop(signum, frame):
        raise SystemExit(0)  # through ``finally`` blocks: a worker being judged is killed

    signal.signal(signal.SIGTERM, stop)
    from .. import MODE  # (quack_edu first: it pins the DSL's target)
    from .judge import Server
    from .registry import all_exercises

    Server.start()  # the judge server imports torch, the DSL and the library meanwhile
    all_exercises()
    from . import judge  # noqa: F401

    proto.write(json.dumps({"ready": True, "pid": os.getpid(), "mode": MODE.name}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        req = None
        try:
            req = json.loads(line)
            reply = judge_request(req)
        except Exception as e:  # noqa: BLE001  (a wrong request, not the grader's crash)
            msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            reply = {"ok": False, "error": str(msg), "type": type(e).__name__}
        if isinstance(req, dict) and "id" in req:
            reply["id"] = req["id"]
        proto.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
