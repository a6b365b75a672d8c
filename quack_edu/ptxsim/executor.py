"""Run a parsed kernel on the CPU: the threads of a CTA as NumPy arrays, one CTA after another.

Every register is a NumPy array over the CTA's threads holding raw bits (``uint16``/``uint32``/
``uint64``; ``bool`` for predicates); an instruction reads them as its type says (``f32`` views
the bits as ``float32``, ``s32`` as ``int32``). Each thread has a program counter. One step runs
the instruction at the smallest counter among the threads that are neither finished nor waiting
at a barrier, for the threads at that counter (and whose guard predicate holds). This keeps the
threads of a structured kernel together: after a divergent branch, the side with the smaller
address runs first, and the others wait at the join for it. ``bar.sync`` parks a thread until
every thread of the CTA that has not exited is parked; ``shfl.sync`` requires every lane its
member mask names to be at the same instruction (an error otherwise, where a GPU would hang or
read garbage).

Memory: global memory holds the launch's tensors, each at its own address; an access outside
all of them (or misaligned for its width) is an error naming the thread and the PTX line. Shared
memory is one buffer per CTA filled with 0xFF bytes (NaN as floats) so that a read of a slot
nobody wrote shows. The parameters are byte blobs, one per ``.param``.

Instruction semantics live in ``instructions``; this module knows only how to read and write
registers, walk the program and launch the grid.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .instructions import HANDLERS
from .parser import Address, Instruction, Kernel, parse
from .values import (
    SINT,
    TYPED,
    UINT,
    WARP,
    MemoryFault,
    SimError,
    StepLimit,
    UnsupportedInstruction,
    as_type,
    immediate,
    width_of,
)

#: where the first global tensor lives (any address far from 0: a null pointer faults)
GLOBAL_BASE = 1 << 40
#: the shared-memory address of the first shared variable (sm_90 reserves the first 1 KiB)
SHARED_BASE = 1024


class Memory:
    """Byte buffers at addresses: the launch's global tensors, or one CTA's shared memory."""

    def __init__(self, space: str, base: int):
        self.space = space
        self.next_address = base
        self.starts: list[int] = []
        self.sizes: list[int] = []
        self.buffers: list[np.ndarray] = []

    def add(self, nbytes: int, fill: int = 0, align: int = 256) -> int:
        """A new buffer of ``nbytes``; returns its address."""
        address = -(-self.next_address // align) * align
        # padded to 16 bytes so that every width can view it; accesses are checked on nbytes
        self.buffers.append(np.full(-(-max(nbytes, 1) // 16) * 16, fill, np.uint8))
        self.starts.append(address)
        self.sizes.append(nbytes)
        self.next_address = address + nbytes
        return address

    def _locate(self, addresses: np.ndarray, nbytes: int, ins: Instruction, threads):
        """Which buffer each address falls in; an error if the access is not inside one."""
        starts = np.asarray(self.starts, np.int64)
        which = np.searchsorted(starts, addresses, side="right") - 1
        ok = which >= 0
        ends = (starts + np.asarray(self.sizes, np.int64))[np.maximum(which, 0)]
        ok &= addresses + nbytes <= ends
        if not ok.all():
            i = int(np.argmin(ok))
            raise MemoryFault(
                f"thread {int(threads[i])} accesses {nbytes} bytes of {self.space} memory at "
                f"{int(addresses[i]):#x}, outside every buffer ({ins.where()})"
            )
        if (addresses % nbytes).any():
            i = int(np.argmax(addresses % nbytes != 0))
            raise MemoryFault(
                f"thread {int(threads[i])}: {nbytes}-byte access at {int(addresses[i]):#x} is not "
                f"aligned to {nbytes} bytes ({ins.where()})"
            )
        return which

    def load(self, addresses, elem_bytes: int, count: int, ins: Instruction, threads):
        """(len(addresses), count) unsigned integers of elem_bytes each."""
        addresses = np.asarray(addresses, np.int64)
        which = self._locate(addresses, elem_bytes * count, ins, threads)
        out = np.empty((len(addresses), count), UINT[elem_bytes * 8])
        for b in np.unique(which):
            sel = which == b
            view = self.buffers[b].view(UINT[elem_bytes * 8])
            first = (addresses[sel] - self.starts[b]) // elem_bytes
            out[sel] = view[first[:, None] + np.arange(count)]
        return out

    def store(self, addresses, values, elem_bytes: int, ins: Instruction, threads) -> None:
        addresses = np.asarray(addresses, np.int64)
        count = values.shape[1]
        which = self._locate(addresses, elem_bytes * count, ins, threads)
        for b in np.unique(which):
            sel = which == b
            view = self.buffers[b].view(UINT[elem_bytes * 8])
            first = (addresses[sel] - self.starts[b]) // elem_bytes
            view[first[:, None] + np.arange(count)] = values[sel]


class Program:
    """A kernel ready to run: every opcode checked against the instruction table, labels
    resolved to instruction indices."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.handlers = []
        for ins in kernel.instructions:
            handler = HANDLERS.get(ins.parts[0])
            if handler is None:
                raise UnsupportedInstruction(
                    f"ptxsim does not know the instruction `{ins.opcode}` ({ins.where()})"
                )
            self.handlers.append(handler)
        self.params = {p.name: p for p in kernel.params}
        self.shared_offsets: dict[str, int] = {}
        offset = 0
        for var in kernel.shared:
            offset = -(-offset // var.align) * var.align
            self.shared_offsets[var.name] = offset
            offset += var.size or 0
        self.static_shared_bytes = offset


class CTA:
    """The threads of one CTA: their registers, program counters and shared memory."""

    def __init__(self, program: Program, ctaid, grid, block, params, memory, dynamic_smem):
        self.program = program
        self.kernel = program.kernel
        self.params = params  # param name -> bytes
        self.memory = memory
        self.shared = Memory("shared", SHARED_BASE)
        self.shared.add(program.static_shared_bytes + dynamic_smem, fill=0xFF, align=1024)
        self.n = int(np.prod(block))
        linear = np.arange(self.n, dtype=np.uint32)
        bx, by, _ = block
        self.special = {
            "%tid.x": linear % bx,
            "%tid.y": (linear // bx) % by,
            "%tid.z": linear // (bx * by),
            "%laneid": linear % WARP,
            "%warpid": linear // WARP,
        }
        for i, axis in enumerate("xyz"):
            self.special[f"%ntid.{axis}"] = np.uint32(block[i])
            self.special[f"%ctaid.{axis}"] = np.uint32(ctaid[i])
            self.special[f"%nctaid.{axis}"] = np.uint32(grid[i])
        self.special["%nwarpid"] = np.uint32(-(-self.n // WARP))
        self.regs: dict[str, np.ndarray] = {}
        self.pc = np.zeros(self.n, np.int64)
        self.done = np.zeros(self.n, bool)
        self.waiting = np.zeros(self.n, bool)  # parked at a bar.sync
        self.full = True  # the current step runs for every thread of the CTA

    # -- registers -------------------------------------------------------------------------
    def reg(self, name: str, ins: Instruction) -> np.ndarray:
        if name not in self.regs:
            typ = self.kernel.registers.get(name)
            if typ is None:
                raise SimError(f"register {name} is not declared ({ins.where()})")
            dtype = np.bool_ if typ == "pred" else UINT[width_of(typ)]
            self.regs[name] = np.zeros(self.n, dtype)
        return self.regs[name]

    def read(self, op: str, typ: str, ins: Instruction):
        """Operand ``op`` as PTX type ``typ``: an array over the threads, or a NumPy scalar."""
        if op.startswith("!"):
            return ~self.read(op[1:], "pred", ins)
        if op.startswith("%"):
            if op in self.special:
                return as_type(self.special[op], typ)
            return as_type(self.reg(op, ins), typ)
        if op in self.program.shared_offsets:
            return as_type(np.uint32(SHARED_BASE + self.program.shared_offsets[op]), typ)
        return immediate(op, typ, ins)

    def write(self, name: str, value, typ: str, mask: np.ndarray, ins: Instruction) -> None:
        """Store ``value`` (of PTX type ``typ``) into register ``name`` for the threads in mask."""
        if name == "_":
            return
        reg = self.reg(name, ins)
        value = np.asarray(value, TYPED[typ])
        if reg.dtype == np.bool_:
            bits = value.astype(np.bool_)
        else:
            width = reg.dtype.itemsize * 8
            if typ.startswith("s") and width_of(typ) < width:
                bits = value.astype(SINT[width]).view(UINT[width])  # sign-extend
            else:
                bits = value.view(UINT[width_of(typ)]).astype(UINT[width])
        if self.full:
            self.regs[name] = np.broadcast_to(bits, (self.n,)).astype(reg.dtype)
        else:
            reg[mask] = np.broadcast_to(bits, (self.n,))[mask]

    def address(self, addr: Address, ins: Instruction) -> np.ndarray:
        """The byte address of ``[base+offset]`` in every thread, as int64."""
        base = self.read(addr.base, "u64", ins)
        return np.broadcast_to(np.asarray(base, np.int64), (self.n,)) + addr.offset

    # -- running ---------------------------------------------------------------------------
    def run(self, max_steps: int) -> int:
        """Run the CTA to its end within ``max_steps`` steps; return the steps it took."""
        instructions = self.program.kernel.instructions
        handlers = self.program.handlers
        for step in range(max_steps):
            live = ~(self.done | self.waiting)
            if not live.any():
                if not self.waiting.any():
                    return step
                self.waiting[:] = False  # every thread still running reached a barrier
                continue
            pc = int(self.pc[live].min())
            if pc >= len(instructions):
                raise SimError("threads ran past the kernel's last instruction without ret")
            ins = instructions[pc]
            at = live & (self.pc == pc)
            mask = at
            if ins.guard is not None:
                pred = self.reg(ins.guard, ins)
                mask = at & (~pred if ins.negated else pred)
            self.pc[at] += 1
            self.full = bool(mask.all())
            if self.full or mask.any():
                handlers[pc](self, ins, mask)
        raise StepLimit(f"no end after {max_steps} steps: an endless loop? (raise max_steps)")

    def jump(self, label: str, mask: np.ndarray, ins: Instruction) -> None:
        target = self.program.kernel.labels.get(label)
        if target is None:
            raise SimError(f"branch to an unknown label {label} ({ins.where()})")
        self.pc[mask] = target


# ---- the launch -------------------------------------------------------------------------------
@dataclass
class TensorArg:
    """A tensor argument: its data goes to global memory; the kernel's ``.param`` gets its
    address followed by ``fields``, the dynamic shape and stride values CuTe passes with it
    (NumPy scalars, e.g. ``(np.int32(M), np.int64(row_stride))``, each at its natural
    alignment, the whole padded to 8 bytes)."""

    data: np.ndarray
    fields: tuple = ()


def pack_tensor(address: int, fields) -> bytes:
    out = bytearray(np.uint64(address).tobytes())
    for value in fields:
        value = np.asarray(value)
        out += bytes(-len(out) % value.itemsize)
        out += value.tobytes()
    out += bytes(-len(out) % 8)
    return bytes(out)


def launch(
    ptx,
    grid,
    block,
    args,
    *,
    entry: str | None = None,
    dynamic_smem: int = 0,
    max_steps: int = 5_000_000,
) -> list[np.ndarray]:
    """Run a kernel for the whole grid; return the data of every ``TensorArg`` afterwards.

    ``ptx``: PTX text (or a parsed ``Kernel``); ``grid``, ``block``: up to three dims; ``args``:
    one per ``.param`` of the kernel, a ``TensorArg`` or a NumPy scalar (``np.float32(eps)``).
    The inputs are copied: the arrays given are not modified. ``max_steps`` bounds the steps of
    the whole launch (a step: one instruction for the threads of a CTA at it; about 30 us): a
    kernel that does not end within them raises ``StepLimit``.
    """
    kernel = parse(ptx, entry) if isinstance(ptx, str) else ptx
    program = Program(kernel)
    grid = tuple(grid) + (1,) * (3 - len(grid))
    block = tuple(block) + (1,) * (3 - len(block))
    if kernel.reqntid and int(np.prod(kernel.reqntid)) != int(np.prod(block)):
        raise SimError(f"the kernel requires {kernel.reqntid} threads per CTA, launched {block}")
    if len(args) != len(kernel.params):
        raise SimError(f"the kernel takes {len(kernel.params)} parameters, given {len(args)}")

    memory = Memory("global", GLOBAL_BASE)
    params, tensors = {}, []
    for i, (param, arg) in enumerate(zip(kernel.params, args, strict=True)):
        if isinstance(arg, TensorArg):
            data = np.ascontiguousarray(arg.data)
            address = memory.add(data.nbytes)
            memory.buffers[-1][: data.nbytes] = data.reshape(-1).view(np.uint8)
            tensors.append((len(memory.buffers) - 1, data))
            blob = pack_tensor(address, arg.fields)
        else:
            blob = np.asarray(arg).tobytes()
        if len(blob) != param.size:
            raise SimError(
                f"parameter {i} is {param.size} bytes in the PTX; the argument packs {len(blob)}"
            )
        params[param.name] = blob

    left = max_steps  # the budget of the whole launch, spent CTA after CTA
    for z, y, x in itertools.product(*(range(n) for n in reversed(grid))):
        cta = CTA(program, (x, y, z), grid, block, params, memory, dynamic_smem)
        with np.errstate(all="ignore"):  # integer wrap-around and inf/NaN are PTX's semantics
            try:
                left -= cta.run(left)
            except StepLimit:
                raise StepLimit(
                    f"no end after {max_steps} steps in all (CTA {(x, y, z)} of a {grid} grid "
                    "still running): an endless loop? (raise max_steps)"
                ) from None

    return [
        memory.buffers[b][: data.nbytes].view(data.dtype).reshape(data.shape).copy()
        for b, data in tensors
    ]
