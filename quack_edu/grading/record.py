"""The judge's end of a worker's record: what its answer compiled at run time, and its incidents,
as the sandbox's audit hook sent them, at once, on a socket of their own.

Red team 9 switched the record off from learner code (the count of what was kept, in the
worker's memory, set past its quota): the finished kernel exec'd from text scored full. Now
the record is kept here, in the grader's process: the hook writes each compiled text and each
incident to a ``SOCK_SEQPACKET`` socket (``RECORD_FORMAT``) that nothing a learner can
reach holds, and refuses a compile it cannot send (fail closed); where seccomp is available
the socket cannot be closed or replaced (``confine.guard_fd``). A learner's own writes to it
can only add to the record; a message out of the hook's order is a flag. The quota is the
judge's: past ``COMPILED_MAX`` characters nothing more is kept and the answer is flagged.
"""

from __future__ import annotations

import socket

#: characters of compiled text in one message of the record
RECORD_CHUNK = 8192
#: the record's messages (one ``write`` each on a ``SOCK_SEQPACKET`` socket: never merged,
#: never split): ``b"C" + b"<seq>:<last>:" + file name + b"\0" + a piece of the text`` (a
#: text's pieces in order, ``<seq>`` counting texts from 1, ``<last>`` 1 on its last piece),
#: ``b"I" + an incident`` ("refused: ...", "reached: ...")
RECORD_FORMAT = "C<seq>:<last>:<file>\0<text> | I<incident>"
#: characters of compiled text the judge keeps of one answer (beyond: flagged)
COMPILED_MAX = 16_000_000
#: the most bytes one message of the record may hold (the hook's are under 33 kB)
MESSAGE_MAX = 1 << 17
#: the incident a record out of the hook's order, or past the quota, adds
TAMPERED = "refused: writing to the grader's record (messages not the hook's)"
OVER_QUOTA = "refused: compiling more text at run time than the grader's record keeps"


def pair() -> tuple[socket.socket, socket.socket]:
    """(the judge's end, the worker's end) of a new record socket."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    mine.setblocking(False)
    return mine, theirs


class Record:
    """What one worker's hook sent: ``compiled`` ((file name, text) pairs) and ``incidents``."""

    def __init__(self, sock: socket.socket | None):
        self.sock = sock
        self.compiled: list[tuple[str, str]] = []
        self.incidents: list[str] = []
        self._open: tuple[int, str, list[str]] | None = None  # (seq, file, pieces so far)
        self._next, self._chars = 1, 0

    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    def drain(self) -> None:
        """Read every message waiting (the socket never blocks)."""
        while self.sock is not None:
            try:
                msg = self.sock.recv(MESSAGE_MAX)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                msg = b""
            if not msg:  # the worker ended
                self.close()
                return
            self._take(msg)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _flag(self, what: str) -> None:
        if what not in self.incidents:
            self.incidents.append(what)

    def _take(self, msg: bytes) -> None:
        kind, body = msg[:1], msg[1:]
        if kind == b"I":
            self._flag(body.decode("utf-8", "replace"))
            return
        try:
            seq_s, last_s, rest = body.split(b":", 2)
            name, text = rest.split(b"\0", 1)
            seq, last = int(seq_s), int(last_s)
        except ValueError:
            self._flag(TAMPERED)
            return
        if self._open is None:
            if seq != self._next:
                self._flag(TAMPERED)
                self._next = max(self._next, seq)
            self._open = (seq, name.decode("utf-8", "replace"), [])
        elif seq != self._open[0]:
            self._flag(TAMPERED)
            return
        piece = text.decode("utf-8", "replace")
        self._chars += len(piece)
        if self._chars > COMPILED_MAX:
            self._flag(OVER_QUOTA)
        else:
            self._open[2].append(piece)
        if last:
            seq, name_s, pieces = self._open
            if pieces:
                self.compiled.append((name_s, "".join(pieces)))
            self._open, self._next = None, seq + 1


#: text a learner process keeps of what it compiled at run time (``compiled``: a worker without
#: a record socket sends it with its replies), in characters
KEPT_MAX = 2_000_000
_kept: dict = {"texts": [], "chars": 0}


def keep_compiled(args) -> None:
    """Keep, in this learner process, the text of a run-time compile (``exec``/``eval``/
    ``compile`` of text, ``ast.parse``, an import) with the file name it was given (the sandbox's
    hook calls it): what the answer runs beyond its cell's own text is judged too (red team 6
    pasted the finished kernel hex-encoded and exec'd it). A name is only a claim: the judge
    drops a text only where it is that file's content. (Code made from no text is refused:
    ``sandbox``'s rules for ``code.__new__`` and ``marshal``.)"""
    src, filename = (tuple(args) + (None, None))[:2]
    room = KEPT_MAX - _kept["chars"]
    if room <= 0:
        return
    # text only: a tree (the DSL compiles every jit function's, the library's helpers among
    # them, and their union resembles a finished version an honest answer never ran) is left
    # out; text made into code passes here first (``ast.parse`` of it too)
    if isinstance(src, bytes | bytearray):
        text = bytes(src).decode("utf-8", "replace")
    elif isinstance(src, str):
        text = src
    else:
        return
    if text:
        _kept["texts"].append((str(filename), text[:room]))
        _kept["chars"] += min(len(text), room)


def compiled(since: int = 0) -> list[tuple[str, str]]:
    """(file name, text) of what this process compiled at run time since the sandbox locked it
    down (from index ``since`` on)."""
    return list(_kept["texts"][since:])
