"""A small def-use view of PTX for the probes of the compile tier (``Ptx``: "eps reaches the
rsqrt"), and the facts read from it: barriers not every thread reaches, the thread-dependent
branches an instruction is under, the bounds a tail guard compares with and which side of them
it lets through, multiplies by zero, fp32 constants as PTX writes them."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

#: a register named in a PTX operand (%r12, %rd3, %tid)
REG = re.compile(r"%[A-Za-z_]+\d*")
_NO_DEST = (
    "st.",
    "bra",
    "ret",
    "bar.",
    "barrier.",
    "membar",
    "fence",
    "red.",
    "cp.async",
    "prefetch",
    "trap",
    "exit",
)


_NOT_INSTRUCTION = ("//", ".", "$", "{", "}", ")")


def instruction_lines(text: str) -> list[tuple[int, str]]:
    """(line number, stripped line) of each PTX instruction of ``text``, in order: no blank
    lines, directives, labels, braces or comments. ``Ptx.instrs`` holds these, by index; the
    scans that also need the labels between them walk the lines and take these numbers. A line
    is tested as written, its trailing comment included (as ``Ptx`` always has)."""
    out = []
    for n, line in enumerate(text.splitlines()):
        s = line.strip()
        if s and not s.startswith(_NOT_INSTRUCTION) and not s.endswith(":"):
            out.append((n, s))
    return out


@dataclass
class PtxInstr:
    index: int
    opcode: str
    dests: list[str]
    srcs: list[str]
    operands: list[str]
    text: str


class Ptx:
    """A def-use view of PTX, enough for probes such as "rsqrt's input depends on eps"."""

    def __init__(self, text: str):
        self.text = text
        self.instrs: list[PtxInstr] = []
        self.params: list[tuple[str, str]] = []
        for m in re.finditer(r"\.param\s+(?:\.align\s+\d+\s+)?(\.[a-z0-9]+)\s+([\w$]+)", text):
            self.params.append((m.group(2), m.group(1)))
        for _, s in instruction_lines(text):
            s = s.rstrip(";").split("//")[0].strip()
            s = re.sub(r"^@!?%\w+\s+", "", s)
            parts = s.split(None, 1)
            opcode = parts[0]
            ops = [o.strip() for o in split_operands(parts[1])] if len(parts) > 1 else []
            if opcode.startswith(_NO_DEST) or not ops:
                dests, srcs = [], [r for o in ops for r in REG.findall(o)]
            else:
                dests = REG.findall(ops[0])
                srcs = [r for o in ops[1:] for r in REG.findall(o)]
            self.instrs.append(PtxInstr(len(self.instrs), opcode, dests, srcs, ops, s))
        self.defs: dict[str, list[int]] = {}
        for ins in self.instrs:
            for d in ins.dests:
                self.defs.setdefault(d, []).append(ins.index)

    def find(self, opcode_prefix: str) -> list[PtxInstr]:
        return [i for i in self.instrs if i.opcode.startswith(opcode_prefix)]

    def ancestors(self, ins: PtxInstr) -> list[PtxInstr]:
        """Every instruction whose result flows into ``ins`` (through registers)."""
        seen: set[int] = set()
        todo = list(ins.srcs)
        while todo:
            reg = todo.pop()
            for j in self.defs.get(reg, []):
                if j not in seen:
                    seen.add(j)
                    todo.extend(self.instrs[j].srcs)
        return [self.instrs[j] for j in sorted(seen)]

    def param_loads(self, param_name: str) -> list[PtxInstr]:
        return [i for i in self.find("ld.param") if any(param_name in o for o in i.operands)]

    def scalar_params(self, ptx_type: str = ".f32") -> list[str]:
        return [n for n, t in self.params if t == ptx_type]


#: special registers that differ between the threads of a CTA
_THREAD_REGS = ("%tid", "%laneid", "%warpid")


def divergent_barriers(ptx_text: str) -> list[str]:
    """The CTA barriers (``bar.sync``) that not every thread may reach: predicated on, or inside
    a forward branch over, a predicate computed from the thread's index (``%tid``, ``%laneid``,
    ``%warpid``). Such a barrier waits for the threads that skipped it: forever (a hung
    kernel). Branches on what every thread of the CTA shares (the block index, a loop count)
    are not reported; nor is a barrier in the ``else`` part of an if/else (a simple scan: the
    common mistake is a barrier inside ``if lane == 0:``)."""
    ptx = Ptx(ptx_text)

    def per_thread(pred: str) -> bool:
        for j in ptx.defs.get(pred, []):
            chain = [ptx.instrs[j], *ptx.ancestors(ptx.instrs[j])]
            if any(r in ins.text for ins in chain for r in _THREAD_REGS):
                return True
        return False

    seen, open_, out = set(), [], []
    for line in ptx_text.splitlines():
        s = line.split("//")[0].strip()
        label = re.match(r"^(\$[\w.$]+):$", s)
        if label:
            seen.add(label.group(1))
            open_ = [t for t in open_ if t != label.group(1)]
            continue
        branch = re.match(r"^@!?(%\w+)\s+bra(?:\.uni)?\s+(\$[\w.$]+)\s*;", s)
        if branch:
            if branch.group(2) not in seen and per_thread(branch.group(1)):
                open_.append(branch.group(2))
            continue
        bar = re.match(r"^(?:@!?(%\w+)\s+)?(?:bar|barrier)(?:\.cta)?\.sync\b", s)
        if bar and (open_ or (bar.group(1) and per_thread(bar.group(1)))):
            out.append(s.rstrip(";").strip())
    return out


def thread_guards(
    ptx_text: str, any_predicate: bool = False, *, guard: Callable[[Ptx, str], bool] | None = None
) -> dict[int, frozenset[str]]:
    """For each instruction of ``Ptx(ptx_text)`` (by index), the predicates computed from the
    thread's index (``%tid``, ``%laneid``, ``%warpid``) under which it runs: those of the forward
    branches it lies inside and its own ``@%p`` (the same simple scan as
    ``divergent_barriers``: a forward ``@%p bra`` opens a region that its label closes). With
    ``any_predicate``, every predicate counts, also those every thread of the CTA shares; with
    ``guard``, the predicates ``p`` with ``guard(ptx, p)``."""
    ptx = Ptx(ptx_text)
    memo: dict[str, bool] = {}

    def counts(pred: str) -> bool:
        if any_predicate:
            return True
        if pred not in memo:
            memo[pred] = (
                guard(ptx, pred)
                if guard is not None
                else any(
                    r in ins.text
                    for j in ptx.defs.get(pred, [])
                    for ins in (ptx.instrs[j], *ptx.ancestors(ptx.instrs[j]))
                    for r in _THREAD_REGS
                )
            )
        return memo[pred]

    instrs = dict(instruction_lines(ptx_text))
    seen: set[str] = set()
    open_: list[tuple[str, str]] = []
    out: dict[int, frozenset[str]] = {}
    for n, line in enumerate(ptx_text.splitlines()):
        label = re.match(r"^(\$[\w.$]+):$", line.split("//")[0].strip())
        if label:
            seen.add(label.group(1))
            open_ = [(t, p) for t, p in open_ if t != label.group(1)]
            continue
        if n not in instrs:
            continue
        s = instrs[n].rstrip(";").split("//")[0].strip()
        branch = re.match(r"^@!?(%\w+)\s+bra(?:\.uni)?\s+(\$[\w.$]+)", s)
        own = re.match(r"^@!?(%\w+)\s+", s)
        preds = {p for _, p in open_}
        if own and not branch and counts(own.group(1)):
            preds.add(own.group(1))
        out[len(out)] = frozenset(preds)
        if branch and branch.group(2) not in seen and counts(branch.group(1)):
            open_.append((branch.group(2), branch.group(1)))
    return out


#: a setp's comparison, register first, as Python compares (unsigned and signed alike)
_COMPARE = {
    "lt": operator.lt,
    "lo": operator.lt,
    "le": operator.le,
    "ls": operator.le,
    "gt": operator.gt,
    "hi": operator.gt,
    "ge": operator.ge,
    "hs": operator.ge,
    "eq": operator.eq,
    "ne": operator.ne,
}
#: the same comparison with its operands swapped (``K < r`` is ``r > K``)
_SWAPPED = {"lt": "gt", "lo": "hi", "le": "ge", "ls": "hs", "gt": "lt", "hi": "lo", "ge": "le"}
_SWAPPED |= {v: k for k, v in _SWAPPED.items()} | {"eq": "eq", "ne": "ne"}


@dataclass(frozen=True)
class Bound:
    """A comparison of a register with a constant that decides whether some code runs (a tail
    guard): that code runs when the comparison holds (``runs_if``) or when it fails."""

    text: str
    compare: str  # the setp's comparison with the register first: "lt", "gt", ...
    constant: int
    runs_if: bool

    def admits(self, value: int) -> bool:
        """Whether the guarded code runs for a register holding ``value``."""
        return _COMPARE[self.compare](value, self.constant) == self.runs_if


def bounds(ptx_text: str, constants) -> list[Bound]:
    """Each ``setp`` of a register against an immediate of ``constants`` whose predicate guards
    code, with the way it guards: an instruction predicated on it (``@%p st``) runs when it
    holds, a forward branch on it (``@%p bra``) skips code when it holds (``@!%p``: the other
    way). A predicate used both ways, by a loop's backward branch, or only in other
    instructions (``and.pred``, ``selp``) gives no ``Bound``: it cannot be judged here."""
    ptx = Ptx(ptx_text)
    wanted = {str(c) for c in constants}
    uses: dict[str, set[bool | None]] = {}
    seen: set[str] = set()
    for line in ptx_text.splitlines():
        s = line.split("//")[0].strip()
        label = re.match(r"^(\$[\w.$]+):$", s)
        if label:
            seen.add(label.group(1))
            continue
        m = re.match(r"^@(!?)(%\w+)\s+(\S+)\s*([^,;]*)", s)
        if not m:
            continue
        negated, pred, op, target = m.group(1) == "!", m.group(2), m.group(3), m.group(4)
        if op.startswith("bra"):
            runs_if = negated if target.strip() not in seen else None  # backward: a loop
        else:
            runs_if = not negated
        uses.setdefault(pred, set()).add(runs_if)
    out = []
    for ins in ptx.find("setp"):
        parts = ins.opcode.split(".")
        if len(parts) < 3 or parts[1] not in _COMPARE or len(ins.operands) != 3:
            continue
        dest, a, b = (o.strip() for o in ins.operands)
        ways = uses.get(dest, set())
        if len(ways) != 1 or None in ways:
            continue
        if b in wanted and a.startswith("%"):
            compare, constant = parts[1], int(b)
        elif a in wanted and b.startswith("%"):
            compare, constant = _SWAPPED[parts[1]], int(a)
        else:
            continue
        out.append(Bound(ins.text, compare, constant, next(iter(ways))))
    return out


_ZEROS = ("0f00000000", "0f80000000")


def times_zero(i) -> bool:
    """Whether a PTX instruction is an fp32 multiply (mul, or fma's two factors) by the
    constant 0: a cheat's way of keeping a value's loads while dropping the value."""
    if "f32" not in i.opcode:
        return False
    if i.opcode.startswith("mul"):
        return any(o in _ZEROS for o in i.operands[1:])
    if i.opcode.startswith("fma"):
        return any(o in _ZEROS for o in i.operands[1:3])
    return False


def split_operands(s: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return out


def f32_hex(value: float) -> str:
    """How PTX writes an fp32 constant: 0f447A0000 for 1000.0."""
    import struct

    return "0f" + struct.pack(">f", value).hex().upper()
