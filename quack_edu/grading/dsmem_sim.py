"""Which CTA receives what: the cluster exchange of a compiled kernel, replayed from its PTX.

The cluster stage's exchange (lesson 04) is a short stretch of integer code between the cluster
barrier's ``barrier.cluster.wait`` and the first ``mbarrier.try_wait``: each thread computes a
slot address and a peer rank, ``mapa`` maps both the slot and the mbarrier into the peer, and
``st.async`` stores 4 bytes there. ``exchange_from_ptx`` runs that stretch for every thread of
a CTA and every rank of the cluster with a tiny interpreter (integer ops, predicates, branches;
registers defined before the stretch are evaluated from their single definition, ``%tid.x``
and ``%cluster_ctarank`` being the inputs) and returns every store as (sender rank, thread,
receiver rank, byte offset in shared memory).

``judge_exchange`` compares that with what the kernel's protocol needs: every CTA receives
exactly the bytes its mbarrier expects (fewer: its wait never completes, a hang; more: it
completes early), each in its own slot ``[row, (warp, sender rank)]``, once. The grader uses
it twice: as a compile-tier check (with a hint that names the CTA and the slot), and as a guard
that keeps the gpu tier from launching an exchange that would hang.

The interpreter gives up (returns None) on anything it does not model (a load, a float feeding
an address, an unknown instruction): a learner's unusual but correct exchange is then left to
the gpu tier, not failed.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from .ptx import split_operands as _split

MASK = (1 << 64) - 1


class Unknown(Exception):
    pass


@dataclass(frozen=True)
class Remote:
    rank: int
    offset: int


@dataclass
class Exchange:
    cluster_n: int
    num_threads: int
    #: (sender rank, sender thread, receiver rank, byte offset) for every st.async executed
    stores: list[tuple[int, int, int, int]] = field(default_factory=list)
    #: the sender rank of every store, as its st.async saw it (the kernel's own rank)
    store_bytes: int = 4

    def received(self, rank: int) -> list[tuple[int, int, int]]:
        """(sender rank, sender thread, offset) of every store into CTA ``rank``."""
        return [(s, t, off) for s, t, r, off in self.stores if r == rank]


_LINE = re.compile(r"^(@!?%\w+\s+)?([\w.:]+)\s*(.*?);?\s*$")


def _instrs(ptx: str) -> list[tuple[str | None, str, list[str], str]]:
    """(guard, opcode, operands, text) per instruction; labels as ('label', name)."""
    out = []
    for line in ptx.splitlines():
        s = line.split("//")[0].strip()
        if not s or s.startswith((".", "{", "}")):
            continue
        if s.endswith(":"):
            out.append((None, "label:", [s[:-1]], s))
            continue
        m = _LINE.match(s)
        if not m:
            continue
        guard = m.group(1).strip() if m.group(1) else None
        ops = [o.strip() for o in _split(m.group(3))] if m.group(3) else []
        out.append((guard, m.group(2), ops, s))
    return out


def _width(opcode: str) -> int:
    m = re.search(r"\.[subf](8|16|32|64)\b", opcode)
    return int(m.group(1)) if m else 32


def _signed(v: int, w: int) -> int:
    v &= (1 << w) - 1
    return v - (1 << w) if v >> (w - 1) else v


class Program:
    """The instructions of a kernel, their labels and where each register is defined."""

    def __init__(self, ptx: str):
        self.instrs = _instrs(ptx)
        self.labels = {ops[0]: i for i, (_, op, ops, _) in enumerate(self.instrs) if op == "label:"}
        self.defs: dict[str, list[int]] = {}
        for i, (_, op, ops, _) in enumerate(self.instrs):
            if op == "label:" or not ops or op.startswith(("st.", "bra", "mbarrier", "barrier")):
                continue
            for reg in re.findall(r"%\w+", ops[0].split("|")[0]):
                self.defs.setdefault(reg, []).append(i)


class Machine:
    def __init__(self, prog: Program, start: int, tid: int, rank: int):
        self.prog = prog
        self.instrs = prog.instrs
        self.defs = prog.defs
        self.start = start
        self.tid, self.rank = tid, rank
        self.env: dict[str, object] = {}
        self.cache: dict[str, object] = {}

    # values of operands ---------------------------------------------------------------------
    def val(self, operand: str):
        o = operand.strip()
        if o in self.env:
            if self.env[o] is _UNK:
                raise Unknown(f"{o}: a value the interpreter does not model")
            return self.env[o]
        if re.fullmatch(r"-?\d+", o):
            return int(o)
        if re.fullmatch(r"0[xX][0-9a-fA-F]+", o):
            return int(o, 16)
        if o.startswith("%tid.x"):
            return self.tid
        if o.startswith("%cluster_ctarank"):
            return self.rank
        if o.startswith("__dynamic_shmem__"):
            return 0
        if o.startswith("%"):
            return self._before(o)
        raise Unknown(o)

    def _before(self, reg: str):
        """A register defined before the stretch, from its one definition."""
        if reg in self.cache:
            return self.cache[reg]
        defs = [i for i in self.defs.get(reg, []) if i < self.start]
        if len(defs) != 1:
            raise Unknown(reg)
        saved = self.env
        self.env = {}
        try:
            value = self._eval(*self.instrs[defs[0]][1:3])
        finally:
            self.env = saved
        self.cache[reg] = value
        return value

    # one instruction --------------------------------------------------------------------------
    def _eval(self, op: str, ops: list[str]):
        base = op.split(".")[0]
        w = _width(op)
        signed = ".s" in op
        a = lambda i: self.val(ops[i])  # noqa: E731
        if base in ("mov", "cvt", "cvta"):
            return a(1)
        if base == "shfl" and ".idx" in op and ops[2].strip() == "0":
            return a(1)  # a broadcast from lane 0: only used on uniform values here
        if base == "add":
            return (a(1) + a(2)) & MASK
        if base == "sub":
            return (a(1) - a(2)) & MASK
        if base == "mul":
            return (a(1) * a(2)) & MASK
        if base == "mad":
            return (a(1) * a(2) + a(3)) & MASK
        if base in ("and", "or", "xor"):
            x, y = a(1), a(2)
            if isinstance(x, bool) or isinstance(y, bool):
                x, y = bool(x), bool(y)
                return {"and": x and y, "or": x or y, "xor": x != y}[base]
            return {"and": x & y, "or": x | y, "xor": x ^ y}[base]
        if base == "not":
            x = a(1)
            return (not x) if isinstance(x, bool) else (~x) & MASK
        if base == "shl":
            return (a(1) << a(2)) & ((1 << w) - 1)
        if base == "shr":
            x = _signed(a(1), w) if signed else a(1) & ((1 << w) - 1)
            return (x >> a(2)) & ((1 << w) - 1)
        if base in ("div", "rem", "min", "max"):
            x, y = a(1), a(2)
            if signed:
                x, y = _signed(x, w), _signed(y, w)
            if base in ("div", "rem") and y == 0:
                raise Unknown("division by zero")
            r = {
                "div": int(x / y) if signed else x // y,
                "rem": x - y * int(x / y) if signed else x % y,
                "min": min(x, y),
                "max": max(x, y),
            }[base]
            return r & MASK
        if base == "selp":
            return a(1) if a(3) else a(2)
        if base == "setp":
            cmp = op.split(".")[1]
            x, y = a(1), a(2)
            if signed:
                x, y = _signed(x, w), _signed(y, w)
            else:
                x, y = x & ((1 << w) - 1), y & ((1 << w) - 1)
            return {
                "eq": x == y,
                "ne": x != y,
                "lt": x < y,
                "lo": x < y,
                "le": x <= y,
                "ls": x <= y,
                "gt": x > y,
                "hi": x > y,
                "ge": x >= y,
                "hs": x >= y,
            }[cmp]
        if base == "mapa":
            addr = a(1)
            if isinstance(addr, Remote):
                raise Unknown("mapa of a mapped address")
            return Remote(int(a(2)), int(addr))
        raise Unknown(op)

    def run(self, end: int, max_steps: int = 20000) -> list[tuple[int, int]]:
        """Execute instrs[start:end] for this thread; the (rank, offset) of each st.async."""
        labels = self.prog.labels
        stores = []
        pc, steps = self.start, 0
        while pc < end:
            steps += 1
            if steps > max_steps:
                raise Unknown("too many steps")
            guard, op, ops, _ = self.instrs[pc]
            pc += 1
            if op == "label:":
                continue
            if guard:
                neg = guard.startswith("@!")
                p = self.val(guard.lstrip("@!"))
                if not isinstance(p, bool):
                    raise Unknown(guard)
                if p == neg:
                    continue
            if op.startswith("bra"):
                target = ops[0]
                if target not in labels:
                    raise Unknown(target)
                pc = labels[target]
                continue
            if op.startswith("st.async"):
                dest = self.val(ops[0].strip("[] "))
                mbar = self.val(ops[2].strip("[] ")) if len(ops) > 2 else dest
                if not isinstance(dest, Remote) or not isinstance(mbar, Remote):
                    raise Unknown("st.async to an unmapped address")
                if dest.rank != mbar.rank:
                    raise Unknown("data and mbarrier in different CTAs")
                stores.append((dest.rank, dest.offset))
                continue
            if op.startswith(("barrier", "bar.", "fence", "membar", "shfl") + ("mbarrier",)):
                if op.startswith("shfl") and ops:
                    try:
                        self.env[ops[0].split("|")[0]] = self._eval(op, ops)
                    except Unknown:
                        self.env[ops[0].split("|")[0]] = _UNK
                continue
            if not ops:
                continue
            dest = ops[0].split("|")[0].strip()
            try:
                self.env[dest] = self._eval(op, ops)
            except Unknown:
                self.env[dest] = _UNK
        return stores


class _Unk:
    def __repr__(self):
        return "?"


_UNK = _Unk()


def exchange_from_ptx(ptx: str, cluster_n: int, num_threads: int) -> Exchange | None:
    """Replay the stretch between the first ``barrier.cluster.wait`` before an ``st.async`` and
    the next ``mbarrier.try_wait``, for every thread and rank. None: cannot tell."""
    prog = Program(ptx)
    instrs = prog.instrs
    first_store = next((i for i, x in enumerate(instrs) if x[1].startswith("st.async")), None)
    if first_store is None:
        return Exchange(cluster_n, num_threads)
    start = max(
        (i for i, x in enumerate(instrs[:first_store]) if x[1].startswith("barrier.cluster.wait")),
        default=None,
    )
    end = next(
        (i for i, x in enumerate(instrs) if i > first_store and "mbarrier.try_wait" in x[3]),
        None,
    )
    if start is None or end is None:
        return None
    start += 1
    ex = Exchange(cluster_n, num_threads)
    for rank in range(cluster_n):
        for tid in range(num_threads):
            m = Machine(prog, start, tid, rank)
            try:
                for r, off in m.run(end):
                    ex.stores.append((rank, tid, int(r), int(off)))
            except (Unknown, KeyError, TypeError, ValueError, IndexError):
                return None
    return ex


@dataclass
class Verdict:
    ok: bool
    safe: bool  # every CTA receives exactly the bytes it waits for: launching cannot hang
    problem: str = ""
    kind: str = ""  # "" | "self" | "missing" | "extra" | "out_of_cluster" | "slot"
    details: list[str] = field(default_factory=list)


def judge_exchange(
    ex: Exchange,
    *,
    threads_per_row: int,
    expected_bytes: int,
    rows_per_cta: int,
    base: int | None = 0,
    slot_index=None,
) -> Verdict:
    """Does every CTA receive, once, each warp's partial in slot [row, (warp, sender rank)]?
    ``base``: the buffer's byte offset in shared memory (0: the first allocation, as in the
    cluster stage; None: the lowest offset stored to). ``slot_index(row, warp, rank)``: the
    slot's index in the buffer (default: the layout of ``primitives.reduce``, (rows_per_cta,
    (warps_per_row, cluster_n)) with the rows outermost and the warp innermost)."""
    cn = ex.cluster_n
    warps = max(1, threads_per_row // 32)
    slots = rows_per_cta * warps * cn
    if slot_index is None:
        slot_index = lambda row, warp, rank: (row * cn + rank) * warps + warp  # noqa: E731
    where = {
        slot_index(r, w, s): (r, w, s)
        for r in range(rows_per_cta)
        for w in range(warps)
        for s in range(cn)
    }
    out = [r for _, _, r, _ in ex.stores if not 0 <= r < cn]
    if out:
        return Verdict(
            False,
            False,
            f"stores to rank {sorted(set(out))[0]}, outside the cluster "
            f"of {cn} CTAs (ranks 0..{cn - 1})",
            "out_of_cluster",
        )
    per_cta = Counter(r for _, _, r, _ in ex.stores)
    want = expected_bytes // ex.store_bytes
    missing = [r for r in range(cn) if per_cta[r] < want]
    extra = [r for r in range(cn) if per_cta[r] > want]
    details = [
        f"CTA {r} receives {per_cta[r]} stores ({per_cta[r] * ex.store_bytes} B)" for r in range(cn)
    ]
    cross = [(s, r) for s, _, r, _ in ex.stores if s != r]
    if not cross and ex.stores:
        return Verdict(
            False,
            not missing and not extra,
            "every store goes to the sender's own CTA: peers never receive its partials",
            "self",
            details,
        )
    if missing:
        r = missing[0]
        return Verdict(
            False,
            False,
            f"CTA {r} receives {per_cta[r]} of the {want} stores its mbarrier waits for "
            f"({per_cta[r] * ex.store_bytes} of {expected_bytes} B): its wait never completes",
            "missing",
            details,
        )
    if extra:
        r = extra[0]
        return Verdict(
            False,
            False,
            f"CTA {r} receives {per_cta[r]} stores, more than the {want} its mbarrier expects: "
            "its wait completes before the last ones land",
            "extra",
            details,
        )
    # the right number everywhere: is each sender's partial in its own slot, once?
    if base is None:
        base = min(off for *_, off in ex.stores) if ex.stores else 0
    seen = Counter()
    for s, tid, r, off in ex.stores:
        row = tid // threads_per_row
        warp = (tid % threads_per_row) // 32
        want_off = base + 4 * slot_index(row, warp, s)
        if off != want_off:
            got = where.get((off - base) // 4) if (off - base) % 4 == 0 else None
            into = (
                f"slot [row {got[0]}, (warp {got[1]}, rank {got[2]})]"
                if got
                else f"byte {off - base} of the buffer, which is no slot"
            )
            return Verdict(
                False,
                True,
                f"warp {warp} of CTA {s} stores row {row}'s partial into {into} of CTA {r}; "
                f"it belongs in [row {row}, (warp {warp}, rank {s})]",
                "slot",
                details,
            )
        seen[(r, off)] += 1
    twice = [k for k, n in seen.items() if n > 1]
    if twice or len(seen) != cn * slots:
        return Verdict(
            False, True, "some slots are written twice and others never", "slot", details
        )
    return Verdict(True, True, "", "", details)


__all__ = ["Exchange", "Verdict", "exchange_from_ptx", "judge_exchange"]
