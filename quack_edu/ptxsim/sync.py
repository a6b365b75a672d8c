"""Barriers, clusters, mbarriers and asynchronous copies: the instructions that wait or that
land later (handlers as in ``instructions``: ``handler(cta, ins, mask)``).

Blocking. A thread at a barrier that cannot complete yet is *blocked* (``CTA.block``): the
scheduler runs other threads, warps and CTAs, and the instruction that completes the barrier
unblocks it. ``bar.sync`` completes when every thread of the CTA is at it (``CTA.check_bar``);
``barrier.cluster.wait`` when every thread of the cluster that has not exited has arrived
(``Cluster.check_cluster_barrier``); ``mbarrier.try_wait``/``test_wait`` when the phase they
ask for has completed: a thread whose wait would return false is parked at the wait and runs
it again when that mbarrier completes a phase (a GPU's wait loop, without the spinning; the
simulator never returns false). A wait that nothing can complete is a ``Hang``.

mbarrier (PTX ISA, "Parallel synchronization and communication instructions: mbarrier"): an
opaque object in shared memory, kept here beside the bytes, keyed by (CTA rank, address): an
expected arrival count, the arrivals still pending in the current phase, a transaction count
(``expect_tx`` adds, ``complete_tx`` subtracts: it may go below zero until the expectation
comes) and the phase number. The phase completes when no arrival is pending and the
transaction count is zero; the next phase starts with the full count. ``try_wait.parity p``
waits for "the phase of parity p", which is the current phase when p is the current parity
and *the one before* otherwise (already complete: the wait returns at once). Using an mbarrier
that no ``mbarrier.init`` ordered before the use (a peer's store that arrives before the init)
is a ``Race``.

cp.async (``cp.async.ca/cg.shared.global [dst], [src], 4|8|16{, src-size}{, ignore-src}``):
the source is read at issue, the bytes past src-size are zeros, and the bytes land in shared
memory at the issuing thread's ``cp.async.wait_group N`` that covers their group (every group
but the N most recent), or ``wait_all``. Until then they are in flight: reading or writing
them is a ``Race`` naming the copy. In the ``random`` order committed groups may land earlier
(still in flight for the check): a legal GPU schedule.
"""

from __future__ import annotations

import numpy as np

from .instructions import _type, op_st, unsupported
from .order import check_access
from .values import TYPED, WARP, MemoryFault, OrderingError, Race, width_of

#: a shared::cluster address (``mapa``'s result) of CTA rank r is (r + 1) * CLUSTER_WINDOW plus
#: its shared::cta address; a shared::cta address (below the window) is the executing CTA's
CLUSTER_WINDOW = 1 << 24
#: why a thread is blocked (``CTA.kind``)
BAR, CLUSTER_WAIT, MBARRIER = 1, 2, 3


def _index(cta, ins) -> int:
    return cta.program.index[id(ins)]


# ---- CTA and warp barriers -----------------------------------------------------------------
def op_bar(cta, ins, mask):
    if ins.parts[1] == "cluster":
        return op_barrier_cluster(cta, ins, mask)
    if ins.parts[1] == "warp":  # bar.warp.sync membermask: orders memory among its lanes
        clocks = cta.cluster.clocks
        if clocks is not None:
            warp = np.arange(cta.n) // WARP
            for w in np.unique(warp[mask]):
                clocks.sync(cta.gids[mask & (warp == w)])
        return
    form = set(ins.parts[1:])
    if not form & {"sync"} or form - {"sync", "aligned", "cta"}:
        raise unsupported(ins)
    barrier, *count = ins.operands
    if cta.read(barrier, "u32", ins) != 0 or (
        count and int(cta.read(count[0], "u32", ins)) != cta.n
    ):
        raise unsupported(ins, "only barrier 0 of the whole CTA")
    cta.block(mask, BAR, ins)
    cta.check_bar()


def op_barrier_cluster(cta, ins, mask):
    """``barrier.cluster.arrive{.release|.relaxed}{.aligned}``, ``barrier.cluster.wait
    {.acquire}{.aligned}``: a thread's wait completes once the phase of its last arrive has."""
    cl, clocks = cta.cluster, cta.cluster.clocks
    op, mods = ins.parts[2], set(ins.parts[3:])
    gids = cta.gids[mask]
    if op == "arrive":
        if mods - {"relaxed", "release", "aligned"}:
            raise unsupported(ins)
        again = mask & (cta.cluster_arrived >= 0)
        if again.any():
            raise OrderingError(
                f"thread {int(np.argmax(again))} of CTA {cta.rank} arrives at the cluster barrier "
                f"again before it waited for its previous arrive ({ins.where()}): each "
                "barrier.cluster.arrive needs its barrier.cluster.wait before the next"
            )
        cta.cluster_arrived[mask] = cl.cluster_phase
        if clocks is not None:
            published = clocks.release(gids, relaxed="relaxed" in mods)
            cl.cluster_clock = np.maximum(cl.cluster_clock, published)
        cl.check_cluster_barrier()
    elif op == "wait":
        if mods - {"acquire", "aligned"}:
            raise unsupported(ins)
        arrived = cta.cluster_arrived
        ready = mask & (arrived >= 0) & (arrived < cl.cluster_phase)
        if clocks is not None:
            for phase in np.unique(arrived[ready]):
                sel = ready & (arrived == phase)
                clocks.acquire(cta.gids[sel], cl.cluster_released[int(phase)])
        arrived[ready] = -1
        cta.block(mask & ~ready, CLUSTER_WAIT, ins)
    else:
        raise unsupported(ins)


def op_fence(cta, ins, mask):
    """``fence.sc``/``acq_rel``/``mbarrier_init`` and ``membar``: close the thread's epoch for
    a later relaxed arrive (``order``); ``fence.proxy.*`` orders proxies, which this simulator
    does not tell apart: nothing to do."""
    kind = ins.parts[1] if len(ins.parts) > 1 else ""
    if ins.parts[0] == "membar" or kind in ("sc", "acq_rel", "release", "mbarrier_init"):
        if cta.cluster.clocks is not None:
            cta.cluster.clocks.fence(cta.gids[mask])
    elif kind != "proxy":
        raise unsupported(ins)


def op_createpolicy(cta, ins, mask):
    """``createpolicy`` makes an L2 cache policy for ``.L2::cache_hint`` accesses: a hint that
    changes no value. Its register gets 0."""
    cta.write(ins.operands[0], np.uint64(0), "b64", mask, ins)


def op_elect(cta, ins, mask):
    """``elect.sync d|p, membermask``: the lowest active lane of each warp named in the mask."""
    if ins.parts[1:] != ["sync"]:
        raise unsupported(ins)
    dest, membermask = ins.operands
    lane = np.arange(cta.n) % WARP
    members = np.asarray(cta.read(membermask, "u32", ins)).astype(np.int64)
    active = mask & (((members >> lane) & 1) == 1)
    warp = np.arange(cta.n) // WARP
    leader = np.full(cta.n, -1)
    for w in np.unique(warp[active]):
        leader[warp == w] = int(np.flatnonzero(active & (warp == w))[0]) % WARP
    d, _, p = dest.partition("|")
    cta.write(d, np.maximum(leader, 0).astype(np.uint32), "b32", mask, ins)
    if p:
        cta.write(p, active & (lane == leader), "pred", mask, ins)


# ---- distributed shared memory -------------------------------------------------------------
def op_mapa(cta, ins, mask):
    """``mapa.shared::cluster.u32/u64 d, a, rank``: CTA ``rank``'s address of the variable at
    shared::cta address ``a`` (``CLUSTER_WINDOW``)."""
    typ = _type(ins)
    if "shared::cluster" not in ins.parts or typ not in ("u32", "u64", "b32", "b64"):
        raise unsupported(ins, "only mapa.shared::cluster")
    d, a, b = ins.operands
    addr = np.broadcast_to(np.asarray(cta.read(a, typ, ins)).astype(np.int64), (cta.n,))
    rank = np.broadcast_to(np.asarray(cta.read(b, "u32", ins)).astype(np.int64), (cta.n,))
    bad = mask & (rank >= len(cta.cluster.ctas))
    if bad.any():
        t = int(np.argmax(bad))
        raise MemoryFault(
            f"thread {t} of CTA {cta.rank}: mapa to CTA rank {int(rank[t])} of a "
            f"{len(cta.cluster.ctas)}-CTA cluster ({ins.where()})"
        )
    out = (rank + 1) * CLUSTER_WINDOW + addr % CLUSTER_WINDOW
    cta.write(d, out.astype(TYPED[typ]), typ, mask, ins)


def op_st_async(cta, ins, mask):
    """``st.async.shared::cluster.mbarrier::complete_tx::bytes{.v2|.v4}.b32/b64 [a], b, [mbar]``:
    store into a CTA of the cluster and complete its bytes on that CTA's mbarrier."""
    parts = set(ins.parts[2:-1])
    vec = [p for p in parts if p in ("v2", "v4")]
    allowed = {"weak", "shared::cluster", "mbarrier::complete_tx::bytes", *vec}
    if "mbarrier::complete_tx::bytes" not in parts or parts - allowed:
        raise unsupported(ins)
    addr, src, mbar = ins.operands
    typ = _type(ins)
    elem = width_of(typ) // 8
    names = src if isinstance(src, tuple) else (src,)
    regs = [np.asarray(cta.read(n, f"b{elem * 8}", ins)) for n in names]
    values = np.stack([np.broadcast_to(r, (cta.n,))[mask] for r in regs], axis=1)
    cta.shared_store("cluster", cta.address(addr, ins)[mask], values, elem, ins, mask)
    complete_tx(cta, ins, mask, cta.address(mbar, ins)[mask], elem * len(names))


# ---- mbarrier --------------------------------------------------------------------------------
class MBarrier:
    def __init__(self, cluster, key: int, count: int, gid: int, at: int):
        self.cluster, self.key = cluster, key
        self.count = self.pending = count
        self.tx = 0
        self.phase = 0
        clocks = cluster.clocks
        self.clock = np.zeros(clocks.C.shape[0], np.int32) if clocks is not None else None
        self.released: dict[int, np.ndarray] = {}
        self.init_gid, self.init_at = gid, at
        self.init_epoch = int(clocks.E[gid]) if clocks is not None else 0

    def where(self) -> str:
        rank, address = divmod(self.key, CLUSTER_WINDOW)
        return f"the mbarrier at shared address {address:#x} of CTA {rank}"

    def describe(self) -> str:
        return (
            f"{self.where()}: its phase {self.phase} still expects {self.pending} "
            f"arrival(s) and {self.tx} transaction byte(s)"
        )

    def publish(self, gids, relaxed=False) -> None:
        if self.clock is not None:
            self.clock = np.maximum(self.clock, self.cluster.clocks.release(gids, relaxed))

    def settle(self) -> None:
        """Complete the phase when nothing is pending; unblock the threads waiting on it."""
        if self.pending or self.tx:
            return
        self.released[self.phase] = self.clock
        if self.clock is not None:
            self.clock = np.zeros_like(self.clock)
        self.released.pop(self.phase - 2, None)
        self.phase += 1
        self.pending = self.count
        for c in self.cluster.ctas:
            waiting = c.blocked & (c.kind == MBARRIER) & (c.block_key == self.key)
            if waiting.any():
                c.unblock(waiting)


def _mbarriers(cta, ins, addresses, mask, use: str):
    """(mbarrier, selection of the threads in mask) per mbarrier the threads address; Race
    for an mbarrier no init is ordered before this use."""
    threads = np.flatnonzero(mask)
    space = "cluster" if "shared::cluster" in ins.parts else "shared"
    ranks, local = cta.locate_shared(space, addresses, ins, threads)
    keys = ranks * CLUSTER_WINDOW + local
    cl = cta.cluster
    for key in np.unique(keys):
        sel = keys == key
        mb = cl.mbarriers.get(int(key))
        who = cl.who(int(cta.gids[threads[np.argmax(sel)]]))
        rank, address = divmod(int(key), CLUSTER_WINDOW)
        if mb is None:
            raise Race(
                f"{who} {use} the mbarrier at shared address {address:#x} of CTA {rank}, which "
                f"no mbarrier.init has initialised ({ins.where()}): a peer's init must be "
                "ordered before (fence.mbarrier_init, then a cluster arrive and wait)"
            )
        if cl.clocks is not None:
            gids = cta.gids[threads[sel]]
            ok = cl.clocks.knows(gids, np.full(len(gids), mb.init_gid), np.int32(mb.init_epoch))
            if not ok.all():
                init = cl.program.kernel.instructions[mb.init_at]
                raise Race(
                    f"{cl.who(int(gids[np.argmin(ok)]))} {use} {mb.where()} with nothing "
                    "ordering its mbarrier.init before (the init's CTA may not have run it "
                    "yet: fence.mbarrier_init, a cluster arrive, and a cluster wait before the "
                    f"first use).\n  the use:  {ins.where()}\n  the init: {init.where()}"
                )
        out = np.zeros(cta.n, bool)
        out[threads[sel]] = True
        yield mb, out


def complete_tx(cta, ins, mask, addresses, nbytes_each: int) -> None:
    for mb, sel in _mbarriers(cta, ins, addresses, mask, "completes bytes on"):
        mb.tx -= nbytes_each * int(sel.sum())
        mb.publish(cta.gids[sel])
        mb.settle()


def _values(cta, op, ins, sel, typ="u32") -> np.ndarray:
    return np.broadcast_to(np.asarray(cta.read(op, typ, ins)).astype(np.int64), (cta.n,))[sel]


def op_mbarrier(cta, ins, mask):
    op = ins.parts[1]
    mods = set(ins.parts[2:-1])
    known = {"shared", "shared::cta", "shared::cluster", "release", "acquire", "relaxed"}
    known |= {"cta", "cluster", "parity", "expect_tx"}
    if mods - known or ins.parts[-1] != "b64":
        raise unsupported(ins)
    cl = cta.cluster
    if op == "init":
        addr, count = ins.operands
        threads = np.flatnonzero(mask)
        ranks, local = cta.locate_shared("shared", cta.address(addr, ins)[mask], ins, threads)
        counts = _values(cta, count, ins, mask)
        for key in np.unique(ranks * CLUSTER_WINDOW + local):
            i = int(np.argmax(ranks * CLUSTER_WINDOW + local == key))
            gid = int(cta.gids[threads[i]])
            cl.mbarriers[int(key)] = MBarrier(cl, int(key), int(counts[i]), gid, _index(cta, ins))
    elif op in ("arrive", "arrive_drop"):
        state, addr, *rest = ins.operands
        expect = "expect_tx" in mods
        for mb, sel in _mbarriers(cta, ins, cta.address(addr, ins)[mask], mask, "arrives at"):
            amounts = _values(cta, rest[0], ins, sel) if rest else np.ones(int(sel.sum()), int)
            arrivals = int(sel.sum()) if expect else int(amounts.sum())
            if expect:
                mb.tx += int(amounts.sum())
            if arrivals > mb.pending:
                raise OrderingError(
                    f"{arrivals} arrival(s) at {mb.where()}, whose phase {mb.phase} expects "
                    f"{mb.pending} more ({ins.where()}): more arrivals than its init's count"
                )
            token = np.uint64(mb.phase)
            mb.pending -= arrivals
            if op == "arrive_drop":
                mb.count -= arrivals
            mb.publish(cta.gids[sel], relaxed="relaxed" in mods)
            cta.full = bool(sel.all())
            cta.write(state, token, "u64", sel, ins)
            mb.settle()
    elif op in ("expect_tx", "complete_tx"):
        addr, amount = ins.operands
        for mb, sel in _mbarriers(cta, ins, cta.address(addr, ins)[mask], mask, "expects bytes on"):
            nbytes = int(_values(cta, amount, ins, sel).sum())
            if op == "expect_tx":
                mb.tx += nbytes
            else:
                mb.tx -= nbytes
                mb.publish(cta.gids[sel])
            mb.settle()
    elif op in ("try_wait", "test_wait"):
        _wait(cta, ins, mask, "parity" in mods)
    else:
        raise unsupported(ins)


def _wait(cta, ins, mask, parity: bool) -> None:
    dest, addr, state, *_ = ins.operands
    clocks = cta.cluster.clocks
    done = np.zeros(cta.n, bool)
    for mb, sel in _mbarriers(cta, ins, cta.address(addr, ins)[mask], mask, "waits on"):
        if parity:
            asked = _values(cta, state, ins, sel) & 1
            ok = asked != mb.phase % 2
            seen = np.full(len(asked), mb.phase - 1)  # the phase before (-1: none yet)
        else:
            asked = _values(cta, state, ins, sel, "u64")
            ok = mb.phase > asked
            seen = asked
        threads = np.flatnonzero(sel)
        if clocks is not None:
            for phase in np.unique(seen[ok]):
                clocks.acquire(cta.gids[threads[ok & (seen == phase)]], mb.released.get(int(phase)))
        done[threads[ok]] = True
        stuck = np.zeros(cta.n, bool)
        stuck[threads[~ok]] = True
        if stuck.any():
            cta.pc[stuck] -= 1  # run the wait again once the mbarrier completes a phase
            cta.block(stuck, MBARRIER, ins, key=mb.key)
    cta.full = bool(done.all())
    cta.write(dest, np.True_, "pred", done, ins)


# ---- cp.async --------------------------------------------------------------------------------
def op_cp(cta, ins, mask):
    if ins.parts[1] != "async" or len(ins.parts) < 3:
        raise unsupported(ins)
    what = ins.parts[2]
    if what in ("ca", "cg"):
        _copy(cta, ins, mask)
    elif what == "commit_group":
        cta.cp_groups[mask] += 1
    elif what == "wait_group":
        (n,) = ins.operands
        land(cta, mask, int(cta.read(n, "u32", ins)))
    elif what == "wait_all":
        cta.cp_groups[mask] += 1
        land(cta, mask, 0)
    else:
        raise unsupported(ins, "cp.async copies global -> shared (ca/cg) and their groups only")


def _copy(cta, ins, mask):
    spaces = [p for p in ins.parts[3:] if not p.startswith("L2::")]
    if spaces not in (["shared", "global"], ["shared::cta", "global"]):
        raise unsupported(ins)
    dst, src, size, *rest = ins.operands
    if "L2::cache_hint" in ins.parts:  # the last operand is a cache policy (createpolicy)
        rest = rest[:-1]
    size = int(cta.read(size, "u32", ins))
    if size not in ((16,) if ins.parts[2] == "cg" else (4, 8, 16)):
        raise unsupported(ins, f"cp.async.{ins.parts[2]} of {size} bytes")
    threads = np.flatnonzero(mask)
    src_size = np.full(len(threads), size, np.int64)
    for op in rest:
        if cta.kernel.registers.get(op.lstrip("!")) == "pred":  # ignore-src
            src_size[np.asarray(cta.read(op, "pred", ins), bool)[mask]] = 0
        else:
            src_size = np.minimum(_values(cta, op, ins, mask), size)
    data = np.zeros((len(threads), size), np.uint8)
    src_addr = cta.address(src, ins)[mask]
    if (src_addr % size).any():
        i = int(np.argmax(src_addr % size != 0))
        raise MemoryFault(
            f"thread {int(threads[i])}: cp.async of {size} bytes from {int(src_addr[i]):#x}, not "
            f"aligned to {size} bytes ({ins.where()})"
        )
    for ss in np.unique(src_size):
        if ss > 0:  # src-size 0: nothing is read (a predicated-off copy), zeros land
            sel = src_size == ss
            data[sel, :ss] = cta.memory.load(src_addr[sel], 1, int(ss), ins, threads[sel], False)
    ranks, local = cta.locate_shared("shared", cta.address(dst, ins)[mask], ins, threads)
    cta.shared._locate(local, size, ins, threads)  # inside the CTA's shared memory, aligned
    offsets = local - cta.shared_base
    check_access(cta.cluster, cta, offsets, size, cta.gids[threads], ins, "write")
    at = _index(cta, ins)
    cta.shadow.busy[offsets[:, None] + np.arange(size)] = at + 1
    cta.cp_copies.append(
        dict(threads=threads, group=cta.cp_groups[threads].copy(), local=local, data=data, at=at)
    )


def land(cta, mask, pending: int) -> None:
    """The copies of the threads in mask whose group is older than their ``pending`` most
    recent land: their bytes are written, by their thread, now."""
    clocks = cta.cluster.clocks
    keep = []
    for copy in cta.cp_copies:
        t = copy["threads"]
        sel = mask[t] & (copy["group"] < cta.cp_groups[t] - pending)
        if sel.any():
            size = copy["data"].shape[1]
            ins = cta.kernel.instructions[copy["at"]]
            cta.shared.store(copy["local"][sel], copy["data"][sel], 1, ins, t[sel])
            offsets = copy["local"][sel] - cta.shared_base
            cta.shadow.busy[offsets[:, None] + np.arange(size)] = 0
            gids = cta.gids[t[sel]]
            epochs = clocks.E[gids] if clocks is not None else np.zeros(len(gids), np.int32)
            cta.shadow.write(offsets, size, gids, epochs, copy["at"])
        if not sel.all():
            keep.append({k: (v[~sel] if isinstance(v, np.ndarray) else v) for k, v in copy.items()})
    cta.cp_copies = keep


def land_some(cluster, rng) -> None:
    """The ``random`` order: each committed copy's bytes land now or not, at random (they stay
    in flight for the check until the wait)."""
    for cta in cluster.ctas:
        for copy in cta.cp_copies:
            t = copy["threads"]
            sel = (copy["group"] < cta.cp_groups[t]) & (rng.random(len(t)) < 0.5)
            if sel.any():
                ins = cta.kernel.instructions[copy["at"]]
                cta.shared.store(copy["local"][sel], copy["data"][sel], 1, ins, t[sel])


SYNC_HANDLERS = {
    "bar": op_bar,
    "barrier": op_bar,
    "fence": op_fence,
    "membar": op_fence,
    "elect": op_elect,
    "createpolicy": op_createpolicy,
    "mapa": op_mapa,
    "mbarrier": op_mbarrier,
    "cp": op_cp,
    "st": lambda cta, ins, mask: (op_st_async if ins.parts[1] == "async" else op_st)(
        cta, ins, mask
    ),
}
