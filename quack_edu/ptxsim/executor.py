"""Run a parsed kernel on the CPU: the threads of a CTA as NumPy arrays, the CTAs of a cluster
together, one cluster after another.

Every register is a NumPy array over the CTA's threads holding raw bits (``uint16``/``uint32``/
``uint64``; ``bool`` for predicates); an instruction reads them as its type says (``f32`` views
the bits as ``float32``, ``s32`` as ``int32``). Each thread has a program counter. One step runs
the instruction at the smallest counter among the threads of the running group (a CTA, or one
warp of it) that are neither finished nor blocked, for the threads at that counter (and whose
guard predicate holds). This keeps the threads of a structured kernel together: after a
divergent branch, the side with the smaller address runs first, and the others wait at the
join for it. A group runs until none of its threads can go on; then the next group runs
(``Cluster``: the order of the groups is the launch's ``order``). A thread blocks at a barrier
that cannot complete yet (``sync``: ``bar.sync``, a cluster wait, an mbarrier wait) until the
instruction that completes it unblocks it; when every unfinished thread of the cluster is
blocked, the kernel hangs (``Hang``). ``shfl.sync`` requires every lane its member mask names
to be at the same instruction (an error otherwise, where a GPU would hang or read garbage).

Memory: global memory holds the launch's tensors, each at its own address; an access outside
all of them (or misaligned for its width) is an error naming the thread and the PTX line. Shared
memory is one buffer per CTA filled with 0xFF bytes (NaN as floats) so that a read of a slot
nobody wrote shows; a CTA reaches a peer's through shared::cluster addresses (``mapa``;
``sync.CLUSTER_WINDOW``), and every access to shared memory goes through the happens-before
check (``order``). The parameters are byte blobs, one per ``.param``.

Instruction semantics live in ``instructions`` and ``sync``; this module knows how to read and
write registers and shared memory, walk the program, schedule the threads and launch the grid.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .instructions import HANDLERS
from .order import Clocks, Shadow, check_access
from .parser import Address, Instruction, Kernel, parse
from .sync import BAR, CLUSTER_WAIT, CLUSTER_WINDOW, MBARRIER, SYNC_HANDLERS, land_some
from .values import (
    SINT,
    TYPED,
    UINT,
    WARP,
    Hang,
    MemoryFault,
    PartialBarrier,
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

    def _locate(self, addresses: np.ndarray, nbytes: int, ins: Instruction, threads, align=True):
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
        if align and (addresses % nbytes).any():
            i = int(np.argmax(addresses % nbytes != 0))
            raise MemoryFault(
                f"thread {int(threads[i])}: {nbytes}-byte access at {int(addresses[i]):#x} is not "
                f"aligned to {nbytes} bytes ({ins.where()})"
            )
        return which

    def load(self, addresses, elem_bytes: int, count: int, ins: Instruction, threads, align=True):
        """(len(addresses), count) unsigned integers of elem_bytes each (``align``: the
        addresses must be multiples of the access's bytes)."""
        addresses = np.asarray(addresses, np.int64)
        which = self._locate(addresses, elem_bytes * count, ins, threads, align)
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
            handler = SYNC_HANDLERS.get(ins.parts[0]) or HANDLERS.get(ins.parts[0])
            if handler is None:
                raise UnsupportedInstruction(
                    f"ptxsim does not know the instruction `{ins.opcode}` ({ins.where()})"
                )
            self.handlers.append(handler)
        self.index = {id(ins): i for i, ins in enumerate(kernel.instructions)}
        self.params = {p.name: p for p in kernel.params}
        self.shared_offsets: dict[str, int] = {}
        offset = 0
        for var in kernel.shared:
            offset = -(-offset // var.align) * var.align
            self.shared_offsets[var.name] = offset
            offset += var.size or 0
        self.static_shared_bytes = offset


class CTA:
    """The threads of one CTA: their registers, program counters, shared memory and what each
    waits for. ``rank``: its rank in the cluster; its threads are numbered ``gid0 + tid``
    across the cluster (``order.Clocks``)."""

    def __init__(
        self, program: Program, cluster, rank, ctaid, grid, block, cdims, params, memory, smem
    ):
        self.program = program
        self.kernel = program.kernel
        self.cluster = cluster
        self.rank = rank
        self.params = params  # param name -> bytes
        self.memory = memory
        self.shared = Memory("shared", SHARED_BASE)
        self.shared_base = self.shared.add(
            program.static_shared_bytes + smem, fill=0xFF, align=1024
        )
        self.n = int(np.prod(block))
        self.gid0 = rank * self.n
        self.gids = self.gid0 + np.arange(self.n)
        self.shadow = Shadow(len(self.shared.buffers[0]))
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
            self.special[f"%cluster_ctaid.{axis}"] = np.uint32(ctaid[i] % cdims[i])
            self.special[f"%cluster_nctaid.{axis}"] = np.uint32(cdims[i])
            self.special[f"%clusterid.{axis}"] = np.uint32(ctaid[i] // cdims[i])
            self.special[f"%nclusterid.{axis}"] = np.uint32(grid[i] // cdims[i])
        self.special["%cluster_ctarank"] = np.uint32(rank)
        self.special["%cluster_nctarank"] = np.uint32(int(np.prod(cdims)))
        self.special["%is_explicit_cluster"] = np.uint32(int(np.prod(cdims)) > 1)
        self.special["%nwarpid"] = np.uint32(-(-self.n // WARP))
        self.regs: dict[str, np.ndarray] = {}
        self.pc = np.zeros(self.n, np.int64)
        self.done = np.zeros(self.n, bool)
        self.exited_at = np.full(self.n, -1, np.int64)  # the ret/exit each thread ended at
        self.blocked = np.zeros(self.n, bool)
        self.kind = np.zeros(self.n, np.int8)  # BAR, CLUSTER_WAIT or MBARRIER while blocked
        self.block_at = np.zeros(self.n, np.int64)  # the instruction a blocked thread waits at
        self.block_key = np.zeros(self.n, np.int64)  # the mbarrier a MBARRIER thread waits on
        self.cluster_arrived = np.full(self.n, -1, np.int64)  # phase arrived at, not waited yet
        self.cp_groups = np.zeros(self.n, np.int64)  # cp.async.commit_group executed so far
        self.cp_copies: list[dict] = []  # cp.async copies not landed (``sync.op_cp``)
        self.full = True  # the current step runs for every thread of the CTA

    # -- registers -------------------------------------------------------------------------
    def reg(self, name: str, ins: Instruction) -> np.ndarray:
        if name not in self.regs:
            typ = self.kernel.registers.get(name)
            if typ is None:
                raise SimError(f"register {name} is not declared ({ins.where()})")
            if typ == "pred":
                self.regs[name] = np.zeros(self.n, np.bool_)
            else:
                # never written: every bit set (NaN as fp32, and as each bf16 or fp16 half; -1
                # as an integer). A GPU's register holds whatever it held, not zero: a
                # fragment of x whose skipped vectors are never zeroed must not sum as if
                # they were
                dtype = UINT[width_of(typ)]
                self.regs[name] = np.full(self.n, np.iinfo(dtype).max, dtype)
        return self.regs[name]

    def read(self, op: str, typ: str, ins: Instruction):
        """Operand ``op`` as PTX type ``typ``: an array over the threads, or a NumPy scalar."""
        if op.startswith("!"):
            return ~self.read(op[1:], "pred", ins)
        if op in self.special:
            return as_type(self.special[op], typ)
        if op.startswith("%") or op in self.kernel.registers:
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
        """The byte address of ``[base+offset]`` in every thread, as int64. A 32-bit base (a
        shared address) wraps at 2**32 with its offset, as the hardware's does: a base below
        the buffer plus an offset back into it (the backward's second buffer) is in it."""
        base = self.read(addr.base, "u64", ins)
        out = np.broadcast_to(np.asarray(base, np.int64), (self.n,)) + addr.offset
        is_reg = addr.base.startswith("%") or addr.base in self.kernel.registers
        if is_reg and self.reg(addr.base, ins).dtype.itemsize == 4:
            out = out & 0xFFFFFFFF
        return out

    # -- shared and distributed shared memory ----------------------------------------------
    def locate_shared(self, space: str, addresses: np.ndarray, ins, threads):
        """(rank, local address) of shared addresses: ``space`` "shared" (this CTA's window)
        or "cluster" (a ``mapa`` address names its CTA; a local one is this CTA's)."""
        addresses = np.asarray(addresses, np.int64)
        remote = addresses >= CLUSTER_WINDOW
        if space != "cluster" and remote.any():
            i = int(np.argmax(remote))
            raise MemoryFault(
                f"thread {int(threads[i])}: a shared::cluster address ({int(addresses[i]):#x}, "
                f"from mapa) in a .shared::cta access ({ins.where()})"
            )
        ranks = np.where(remote, addresses // CLUSTER_WINDOW - 1, self.rank)
        bad = (ranks < 0) | (ranks >= len(self.cluster.ctas))
        if bad.any():
            i = int(np.argmax(bad))
            raise MemoryFault(
                f"thread {int(threads[i])}: shared::cluster address {int(addresses[i]):#x} is "
                f"in no CTA of this {len(self.cluster.ctas)}-CTA cluster ({ins.where()})"
            )
        return ranks, addresses % CLUSTER_WINDOW

    def _targets(self, space, addresses, ins, threads, kind):
        ranks, local = self.locate_shared(space, addresses, ins, threads)
        for r in np.unique(ranks):
            sel = ranks == r
            target = self.cluster.ctas[int(r)]
            if target is not self and target.done.all():
                raise MemoryFault(
                    f"thread {int(threads[np.argmax(sel)])} of CTA {self.rank} {kind}s the shared "
                    f"memory of CTA {int(r)}, which has exited: nothing kept CTA {int(r)} "
                    f"waiting (a cluster barrier before its exit) ({ins.where()})"
                )
            yield target, sel, local[sel]

    def shared_load(self, space, addresses, elem: int, count: int, ins, mask) -> np.ndarray:
        threads = np.flatnonzero(mask)
        out = np.empty((len(threads), count), UINT[elem * 8])
        for target, sel, local in self._targets(space, addresses, ins, threads, "read"):
            out[sel] = target.shared.load(local, elem, count, ins, threads[sel])
            offsets = local - target.shared_base
            gids = self.gids[threads[sel]]
            check_access(self.cluster, target, offsets, elem * count, gids, ins, "read")
        return out

    def shared_store(self, space, addresses, values, elem: int, ins, mask) -> None:
        threads = np.flatnonzero(mask)
        nbytes = elem * values.shape[1]
        for target, sel, local in self._targets(space, addresses, ins, threads, "write"):
            target.shared.store(local, values[sel], elem, ins, threads[sel])
            self.record_write(target, local, nbytes, threads[sel], ins)

    def record_write(self, target, local, nbytes: int, threads, ins) -> None:
        gids = self.gids[threads]
        offsets = np.asarray(local, np.int64) - target.shared_base
        check_access(self.cluster, target, offsets, nbytes, gids, ins, "write")
        clocks = self.cluster.clocks
        epochs = clocks.E[gids] if clocks is not None else np.zeros(len(gids), np.int32)
        target.shadow.write(offsets, nbytes, gids, epochs, self.program.index[id(ins)])

    # -- barriers ----------------------------------------------------------------------------
    def block(self, mask, kind: int, ins, key: int = 0) -> None:
        self.blocked[mask] = True
        self.kind[mask] = kind
        self.block_at[mask] = self.program.index[id(ins)]
        self.block_key[mask] = key

    def unblock(self, mask) -> None:
        self.blocked[mask] = False
        self.kind[mask] = 0

    def check_bar(self) -> None:
        """Release the CTA barrier once every thread is at one; PartialBarrier if some exited
        or wait at another ``bar.sync``."""
        at_bar = self.blocked & (self.kind == BAR)
        if not at_bar.any() or not (at_bar | self.done).all():
            return
        where = np.unique(self.block_at[at_bar])
        if self.done.any() or len(where) > 1:
            first = self.kernel.instructions[int(where[0])]
            parts = []
            for w in where[1:]:
                who = _threads(np.flatnonzero(at_bar & (self.block_at == w)))
                parts.append(f"{who} wait at {self.kernel.instructions[int(w)].where()}")
            for e in np.unique(self.exited_at[self.done]):
                who = _threads(np.flatnonzero(self.done & (self.exited_at == e)))
                parts.append(f"{who} exited at {self.kernel.instructions[int(e)].where()}")
            reached = int((at_bar & (self.block_at == where[0])).sum())
            raise PartialBarrier(
                f"a barrier reached by only part of CTA {self.rank}: {reached} of its {self.n} "
                f"threads wait at {first.where()}; " + "; ".join(parts) + ". bar.sync waits for "
                "every thread of the CTA: a barrier under a branch that depends on the thread "
                "or the row (or after some threads returned) hangs or releases early on a GPU"
            )
        if self.cluster.clocks is not None:
            self.cluster.clocks.sync(self.gids)
        self.unblock(at_bar)

    # -- running ---------------------------------------------------------------------------
    def run(self, group: np.ndarray, max_steps: int) -> int:
        """Run the threads of ``group`` until none can go on (finished or blocked), within
        ``max_steps`` steps; return the steps taken."""
        instructions = self.kernel.instructions
        handlers = self.program.handlers
        for step in range(max_steps):
            live = group & ~(self.done | self.blocked)
            if not live.any():
                return step
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
        target = self.kernel.labels.get(label)
        if target is None:
            raise SimError(f"branch to an unknown label {label} ({ins.where()})")
        self.pc[mask] = target

    def exit(self, mask, ins) -> None:
        self.done[mask] = True
        self.exited_at[mask] = self.program.index[id(ins)]
        self.check_bar()
        self.cluster.check_cluster_barrier()


def _threads(idx) -> str:
    """ "threads 0-31, 64-95" for the thread indices ``idx`` (at most 4 ranges named)."""
    idx = np.asarray(idx)
    if len(idx) == 1:
        return f"thread {int(idx[0])}"
    breaks = np.flatnonzero(np.diff(idx) != 1)
    starts = np.r_[idx[0], idx[breaks + 1]]
    ends = np.r_[idx[breaks], idx[-1]]
    ranges = [f"{a}" if a == b else f"{a}-{b}" for a, b in zip(starts, ends, strict=True)]
    more = f" and {len(ranges) - 4} more ranges" if len(ranges) > 4 else ""
    return "threads " + ", ".join(ranges[:4]) + more


#: the orders ``launch`` runs threads in (``Cluster.groups``)
ORDERS = ("forward", "reversed", "random")


@dataclass(frozen=True)
class Schedule:
    """How ``launch`` runs the threads: ``order`` (one of ``ORDERS``), the ``seed`` of the
    random one, and ``check``: the happens-before check of shared memory (``order`` module: a
    ``Race`` names both instructions)."""

    order: str = "forward"
    seed: int = 0
    check: bool = True

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"order is one of {ORDERS}, not {self.order!r}")


class Cluster:
    """The CTAs of one cluster, run together: each runs until it blocks, then the next.

    Orders: ``forward`` runs each CTA's threads in lockstep (the smallest program counter
    first), CTA 0 first; ``reversed`` runs one warp at a time, the last warp of the last CTA
    first; ``random`` runs one warp at a time in an order drawn anew each round (seeded), and
    lets committed cp.async groups land at random points before their wait. Threads, warps and
    CTAs run until they block; when none can go on and some have not finished, the kernel
    hangs (``Hang``, naming where each waits)."""

    def __init__(self, program, ranks, make_cta, order: str, rng, check: bool):
        self.program = program
        self.ctas = [make_cta(self, r) for r in ranks]
        self.order = order
        self.rng = rng
        T = sum(c.n for c in self.ctas)
        self.clocks = Clocks(T) if check else None
        self.cluster_phase = 0
        self.cluster_clock = np.zeros(T, np.int32) if check else None
        self.cluster_released: dict[int, np.ndarray] = {}
        self.mbarriers: dict[int, object] = {}  # key (rank * CLUSTER_WINDOW + address)

    def who(self, gid: int) -> str:
        rank, tid = divmod(gid, self.ctas[0].n)
        return f"thread {tid} of CTA {rank}" if len(self.ctas) > 1 else f"thread {tid}"

    def groups(self):
        if self.order == "forward":
            return [(c, np.ones(c.n, bool)) for c in self.ctas]
        warps = []
        for c in self.ctas:
            w = np.arange(c.n) // WARP
            warps += [(c, w == i) for i in range(int(w.max()) + 1)]
        if self.order == "reversed":
            return warps[::-1]
        return [warps[i] for i in self.rng.permutation(len(warps))]

    def run(self, max_steps: int) -> int:
        steps = 0
        while True:
            ran = False
            for cta, group in self.groups():
                if not (group & ~(cta.done | cta.blocked)).any():
                    continue
                steps += cta.run(group, max_steps - steps)
                ran = True
                if self.order == "random":
                    land_some(self, self.rng)
            if all(c.done.all() for c in self.ctas):
                return steps
            if not ran:
                raise Hang(self.hang_report())

    # -- the cluster barrier ------------------------------------------------------------------
    def check_cluster_barrier(self) -> None:
        """Complete the cluster barrier's phase once every thread not exited has arrived."""
        phase = self.cluster_phase
        if not any((c.cluster_arrived == phase).any() for c in self.ctas):
            return
        if not all(((c.cluster_arrived == phase) | c.done).all() for c in self.ctas):
            return
        self.cluster_released[phase] = self.cluster_clock
        if self.clocks is not None:
            self.cluster_clock = np.zeros_like(self.cluster_clock)
        self.cluster_phase += 1
        for c in self.ctas:
            waiting = c.blocked & (c.kind == CLUSTER_WAIT) & (c.cluster_arrived == phase)
            if waiting.any():
                if self.clocks is not None:
                    self.clocks.acquire(c.gids[waiting], self.cluster_released[phase])
                c.cluster_arrived[waiting] = -1
                c.unblock(waiting)

    def hang_report(self) -> str:
        lines = []
        for c in self.ctas:
            stuck = c.blocked & ~c.done
            for at in np.unique(c.block_at[stuck]):
                sel = stuck & (c.block_at == at)
                ins = self.program.kernel.instructions[int(at)]
                what = self.why_blocked(c, sel)
                cta = f"CTA {c.rank}: " if len(self.ctas) > 1 else ""
                lines.append(f"  {cta}{_threads(np.flatnonzero(sel))} wait at {ins.where()}{what}")
        head = (
            "the kernel hangs: every thread that has not finished waits, and nothing can release it"
        )
        return head + ".\n" + "\n".join(lines)

    def why_blocked(self, cta, sel) -> str:
        kind = int(cta.kind[np.argmax(sel)])
        if kind == CLUSTER_WAIT:
            if (cta.cluster_arrived[sel] < 0).any():
                return (
                    " (a cluster wait with no arrive of its own before it: its phase needs "
                    "this thread's arrive, which never comes)"
                )
            missing = [c.rank for c in self.ctas if not ((c.cluster_arrived >= 0) | c.done).all()]
            return f" (a cluster barrier CTAs {missing} never arrive at)"
        if kind == MBARRIER:
            mb = self.mbarriers.get(int(cta.block_key[np.argmax(sel)]))
            return f" ({mb.describe()})" if mb is not None else ""
        return " (bar.sync: the other threads of the CTA are elsewhere)"


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
    cluster=(1, 1, 1),
    schedule: Schedule = Schedule(),
    max_steps: int = 5_000_000,
) -> list[np.ndarray]:
    """Run a kernel for the whole grid; return the data of every ``TensorArg`` afterwards.

    ``ptx``: PTX text (or a parsed ``Kernel``); ``grid``, ``block``, ``cluster``: up to three
    dims (the cluster's divide the grid's); ``args``: one per ``.param`` of the kernel, a
    ``TensorArg`` or a NumPy scalar (``np.float32(eps)``). The inputs are copied: the arrays
    given are not modified. Clusters run one after another, the CTAs of a cluster together
    (``Cluster``), as ``schedule`` says (its order and seed, and whether shared memory is
    checked). ``max_steps`` bounds the steps of the whole launch (a step: one instruction for
    the threads of a CTA, or of a warp, at it; about 30 us): a kernel that does not end within
    them raises ``StepLimit``.
    """
    order = schedule.order
    kernel = parse(ptx, entry) if isinstance(ptx, str) else ptx
    program = Program(kernel)
    grid = tuple(grid) + (1,) * (3 - len(grid))
    block = tuple(block) + (1,) * (3 - len(block))
    cdims = tuple(cluster or (1,)) + (1,) * (3 - len(cluster or (1,)))
    if kernel.reqntid and int(np.prod(kernel.reqntid)) != int(np.prod(block)):
        raise SimError(f"the kernel requires {kernel.reqntid} threads per CTA, launched {block}")
    if any(g % c for g, c in zip(grid, cdims, strict=True)):
        raise SimError(f"a grid of {grid} CTAs is not a whole number of {cdims} clusters")
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

    rng = np.random.default_rng(schedule.seed)
    clusters = list(itertools.product(*(range(g // c) for g, c in zip(grid, cdims, strict=True))))
    if order == "reversed":
        clusters.reverse()
    elif order == "random":
        clusters = [clusters[i] for i in rng.permutation(len(clusters))]
    members = [(x, y, z) for z in range(cdims[2]) for y in range(cdims[1]) for x in range(cdims[0])]
    left = max_steps  # the budget of the whole launch, spent cluster after cluster
    for cid in clusters:

        def make_cta(cl, rank, cid=cid):
            ctaid = tuple(cid[i] * cdims[i] + members[rank][i] for i in range(3))
            return CTA(program, cl, rank, ctaid, grid, block, cdims, params, memory, dynamic_smem)

        group = Cluster(program, range(len(members)), make_cta, order, rng, schedule.check)
        with np.errstate(all="ignore"):  # integer wrap-around and inf/NaN are PTX's semantics
            try:
                left -= group.run(left)
            except StepLimit:
                raise StepLimit(
                    f"no end after {max_steps} steps in all (cluster {cid} of a {grid} grid "
                    "still running): an endless loop? (raise max_steps)"
                ) from None

    return [
        memory.buffers[b][: data.nbytes].view(data.dtype).reshape(data.shape).copy()
        for b, data in tensors
    ]
