"""The child process that runs a notebook's cells for the grader where there is no Jupyter.

    python -m quack_edu.grading._cellworker REQUEST_FD REPLY_FD

The grader (``notebook._ChildRunner``) starts it with the grading environment and the
notebook's folder as its working directory, and talks to it over two pipes, one JSON object a
line: a request ``{"source", "name", "timeout"}`` runs one cell in the child's namespace
(``nbexec.exec_cell``: registered with linecache, stdout captured, Python code interrupted
after ``timeout`` seconds) and the reply is the cell's ``CellOutcome`` as a dict. The child
exists so that what cannot be interrupted (a GPU kernel that never finishes) or what kills a
process (an illegal memory access poisons its CUDA context; ``os._exit``) costs the child, not
the grader: the grader kills or loses it, starts another and replays the cells before.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys


def serve(requests, replies) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from ..lessons.nbexec import _display, exec_cell

    ns = {"__name__": "__main__", "display": _display}
    for line in requests:
        msg = json.loads(line)
        out = exec_cell(msg["source"], msg["name"], ns, msg.get("timeout"))
        replies.write(json.dumps(dataclasses.asdict(out)) + "\n")
        replies.flush()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    request_fd, reply_fd = (int(a) for a in argv)
    with os.fdopen(request_fd, "r") as requests, os.fdopen(reply_fd, "w") as replies:
        serve(requests, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
