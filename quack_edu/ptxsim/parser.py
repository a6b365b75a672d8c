"""Read the PTX of one kernel (``.entry``) into plain data the executor runs.

What it keeps of the text: the kernel's parameters (name, size in bytes), its register
declarations (``.reg .b32 %r<231>;`` declares ``%r0`` .. ``%r230``), the shared-memory variables
of the module and of the kernel, the labels, and every instruction with its guard predicate
(``@%p1`` / ``@!%p1``), its opcode split at the dots and its operands. Operands stay strings,
except an address ``[%rd4+512]`` (an ``Address``) and a vector ``{%r1, %r2}`` (a tuple).

Nothing is checked here beyond the syntax: whether the executor knows an instruction is the
executor's question (``executor.Program``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace


class PtxSyntaxError(ValueError):
    """PTX this parser cannot read (it reads what CuTe DSL / NVVM emits, not every PTX)."""


@dataclass(frozen=True)
class Address:
    """``[base+offset]``: base is a register or a symbol (a parameter, a shared variable)."""

    base: str
    offset: int = 0


@dataclass(frozen=True)
class Instruction:
    line: int  # 1-based line of the PTX text, for error messages
    text: str  # the instruction as written, without the ';'
    opcode: str  # "ld.global.v4.b32"
    operands: tuple  # strings, Address or tuples of strings (a vector)
    guard: str | None = None  # "%p1" for "@%p1 ..." and "@!%p1 ..."
    negated: bool = False  # True for "@!%p1 ..."

    @property
    def parts(self) -> list[str]:
        """The opcode split at the dots: ["ld", "global", "v4", "b32"]."""
        return self.opcode.split(".")

    def where(self) -> str:
        return f"PTX line {self.line}: `{self.text}`"


@dataclass(frozen=True)
class Param:
    name: str
    size: int  # bytes
    align: int


@dataclass(frozen=True)
class SharedVar:
    name: str
    align: int
    size: int | None  # bytes; None for an ``.extern`` array (dynamic shared memory)


@dataclass
class Kernel:
    name: str
    params: list[Param]
    #: register name -> declared type without the dot ("b32", "pred", "f32", ...)
    registers: dict[str, str]
    shared: list[SharedVar]
    instructions: list[Instruction]
    #: label -> index of the instruction that follows it
    labels: dict[str, int]
    #: ``.reqntid`` of the kernel, if it has one
    reqntid: tuple[int, ...] | None = None
    directives: list[str] = field(default_factory=list)


_ENTRY_HEAD = re.compile(r"\.entry\s+([\w$]+)\s*\(")
_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+([\w$]+)(?:\[(\d+)\])?")
_REG_DECL = re.compile(r"^\.reg\s+\.(\w+)\s+(.*)$")
_REG_RANGE = re.compile(r"^(%[\w$]+)<(\d+)>$")
_SHARED = re.compile(
    r"^(\.extern\s+)?\.shared\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+([\w$]+)(?:\[(\d*)\])?$"
)
_LABEL = re.compile(r"^([\w$]+):$")
_GUARD = re.compile(r"^@(!?)(%?[\w$]+)\s+")
_ADDRESS = re.compile(r"^\[\s*([%\w$.]+)\s*(?:\+\s*(-?\w+))?\s*\]$")

_TYPE_BYTES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2}
_TYPE_BYTES.update({t: 4 for t in ("b32", "u32", "s32", "f32")})
_TYPE_BYTES.update({t: 8 for t in ("b64", "u64", "s64", "f64")})


def parse(ptx: str, entry: str | None = None) -> Kernel:
    """The kernel ``entry`` of a PTX module (the only ``.entry`` when None)."""
    text = blank_comments(ptx)  # (line numbers kept)
    entries = _entries(text)
    if not entries:
        raise PtxSyntaxError("no .entry in this PTX")
    if entry is None:
        if len(entries) > 1:
            names = ", ".join(m.group(1) for m in entries)
            raise PtxSyntaxError(f"this PTX has several kernels ({names}); name one")
        match = entries[0]
    else:
        found = [m for m in entries if m.group(1) == entry]
        if not found:
            raise PtxSyntaxError(f"no .entry named {entry!r} in this PTX")
        match = found[0]

    params = [
        Param(m.group(3), int(m.group(4) or 1) * _TYPE_BYTES[m.group(2)], int(m.group(1) or 0))
        for m in _PARAM.finditer(match.group(2))
    ]
    reqntid = re.search(r"\.reqntid\s+([\d,\s]+)", match.group(3))
    body_start = match.end()
    body_end = _matching_brace(text, body_start - 1)

    kernel = Kernel(
        name=match.group(1),
        params=params,
        registers={},
        shared=[],
        instructions=[],
        labels={},
        reqntid=tuple(int(v) for v in reqntid.group(1).split(",")) if reqntid else None,
    )
    # Shared variables declared at module level, before the kernel (``__dynamic_shmem__0``).
    for line in text[: match.start()].split("\n"):
        _read_module_line(kernel, line.strip().rstrip(";").strip())
    first_line = text.count("\n", 0, body_start) + 1
    scopes = _Scopes()
    for line_no, line in enumerate(text[body_start:body_end].split("\n"), first_line):
        _read_body_line(kernel, line.strip(), line_no, scopes)
    scopes.resolve(kernel)
    return kernel


class _Scopes:
    """The ``{ }`` scopes of the body (NVVM wraps each inline-PTX block in one): a label
    declared inside one is local to it (CuTe DSL's mbarrier wait declares ``LAB_WAIT`` and
    ``DONE`` in each of its copies), so it is stored as ``LABEL@scope`` and a branch finds the
    label of its innermost scope first. Registers declared in a scope (``.reg .pred P1``) join
    the kernel's: a thread is in one scope at a time."""

    def __init__(self):
        self.stack = [0]
        self.count = 0
        self.of_instruction: list[tuple[int, ...]] = []

    def open(self):
        self.count += 1
        self.stack.append(self.count)

    def close(self):
        if len(self.stack) > 1:
            self.stack.pop()

    def label(self, name: str) -> str:
        return name if self.stack[-1] == 0 else f"{name}@{self.stack[-1]}"

    def resolve(self, kernel: Kernel) -> None:
        scoped = zip(kernel.instructions, self.of_instruction, strict=True)
        for i, (ins, stack) in enumerate(scoped):
            if ins.parts[0] != "bra" or not ins.operands:
                continue
            name = ins.operands[0]
            for scope in reversed(stack[1:]):
                if f"{name}@{scope}" in kernel.labels:
                    kernel.instructions[i] = replace(ins, operands=(f"{name}@{scope}",))
                    break


def blank_comments(ptx: str) -> str:
    """``ptx`` with its comments (``// ...`` to the end of the line, ``/* ... */``) made spaces,
    newlines kept, in one pass: time linear in its length whatever it holds (the regex
    ``//[^\\n]*|/\\*.*?\\*/`` took > 300 s on ``'\\n/*x' * 100000``, red team 9). An
    unterminated ``/*`` is text, as it was."""
    out: list[str] = []
    i, n = 0, len(ptx)
    line, block = ptx.find("//"), ptx.find("/*")  # the next of each at or after i (-1: none)
    while i < n:
        if 0 <= line < i:
            line = ptx.find("//", i)
        if 0 <= block < i:
            block = ptx.find("/*", i)
        starts = [j for j in (line, block) if j >= 0]
        if not starts:
            break
        j = min(starts)
        if j == line:
            end = ptx.find("\n", j)
            end = n if end < 0 else end
        else:
            close = ptx.find("*/", j + 2)
            if close < 0:  # no comment closes after here: every later /* is text
                block = -1
                out.append(ptx[i : j + 2])
                i = j + 2
                continue
            end = close + 2
        out.append(ptx[i:j])
        comment = ptx[j:end]
        out.append(" " * len(comment) if "\n" not in comment else re.sub(r"[^\n]", " ", comment))
        i = end
    out.append(ptx[i:])
    return "".join(out)


class _Entry:
    """An ``.entry`` header: ``group(1)`` its name, ``group(2)`` its parameters, ``group(3)``
    what lies between them and the body's ``{``; ``start()``/``end()`` as a match's."""

    def __init__(self, head: re.Match, close: int, brace: int, text: str):
        self._groups = (head.group(1), text[head.end() : close], text[close + 1 : brace])
        self._span = (head.start(), brace + 1)

    def group(self, i: int) -> str:
        return self._groups[i - 1]

    def start(self) -> int:
        return self._span[0]

    def end(self) -> int:
        return self._span[1]


def _entries(text: str) -> list[_Entry]:
    """Every ``.entry NAME ( params ) ... {``, in one pass (the regex it replaces, with two
    lazy ``.*?`` under ``re.S``, was quadratic on headers that never close)."""
    out, pos = [], 0
    while (head := _ENTRY_HEAD.search(text, pos)) is not None:
        close = text.find(")", head.end())
        brace = text.find("{", close + 1) if close >= 0 else -1
        if brace < 0:
            break  # no later header closes either
        out.append(_Entry(head, close, brace, text))
        pos = brace + 1
    return out


def _matching_brace(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    raise PtxSyntaxError("the kernel's body has no closing brace")


def _read_module_line(kernel: Kernel, line: str) -> None:
    m = _SHARED.match(line)
    if m:
        _add_shared(kernel, m)


def _add_shared(kernel: Kernel, m: re.Match) -> None:
    extern, align, typ, name, count = m.groups()
    size = None if extern or count == "" else int(count or 1) * _TYPE_BYTES[typ]
    kernel.shared.append(SharedVar(name, int(align or _TYPE_BYTES[typ]), size))


def _read_body_line(kernel: Kernel, line: str, line_no: int, scopes: _Scopes) -> None:
    # A line holds a label, a directive or one instruction (NVVM writes one per line), or a
    # brace that opens or closes a scope (inline PTX: ``_Scopes``).
    if line.startswith("{") and not line.startswith("{%"):
        scopes.open()
    if (
        line.endswith("}")
        and not line.rstrip("}").rstrip().endswith(("{", ","))
        and "{%" not in line
    ):
        scopes.close()
    line = line.strip("{} \t")
    if not line:
        return
    label = _LABEL.match(line)
    if label:
        kernel.labels[scopes.label(label.group(1))] = len(kernel.instructions)
        return
    for statement in filter(None, (s.strip() for s in line.split(";"))):
        if statement.startswith("."):
            _read_directive(kernel, statement)
        else:
            kernel.instructions.append(_instruction(statement, line_no))
            scopes.of_instruction.append(tuple(scopes.stack))


def _read_directive(kernel: Kernel, statement: str) -> None:
    m = _REG_DECL.match(statement)
    if m:
        typ, names = m.groups()
        for name in (n.strip() for n in names.split(",")):
            rng = _REG_RANGE.match(name)
            if rng:
                for i in range(int(rng.group(2))):
                    kernel.registers[f"{rng.group(1)}{i}"] = typ
            else:
                kernel.registers[name] = typ
        return
    m = _SHARED.match(statement)
    if m:
        _add_shared(kernel, m)
        return
    kernel.directives.append(statement)  # .pragma, .loc ...: nothing to execute


def _instruction(statement: str, line_no: int) -> Instruction:
    guard, negated = None, False
    g = _GUARD.match(statement)
    body = statement
    if g:
        negated, guard = g.group(1) == "!", g.group(2)
        body = statement[g.end() :]
    opcode, _, rest = body.replace("\t", " ").partition(" ")
    rest = rest.strip()
    operands = tuple(_operand(op) for op in split_operands(rest)) if rest else ()
    return Instruction(line_no, statement, opcode, operands, guard, negated)


def split_operands(text: str) -> list[str]:
    """Split at the commas that are not inside ``{}`` or ``[]``."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return out


def _operand(text: str):
    if text.startswith("{"):
        return tuple(s.strip() for s in text.strip("{}").split(","))
    if text.startswith("["):
        m = _ADDRESS.match(text)
        if not m:
            raise PtxSyntaxError(f"cannot read the address {text!r}")
        return Address(m.group(1), int(m.group(2), 0) if m.group(2) else 0)
    return text
