"""Happens-before for shared and distributed shared memory: which write a read may rely on.

A GPU promises that a read sees a write of another thread only when something orders the two:
a ``bar.sync`` both threads reach, an mbarrier phase the writer arrived at (or completed, by
``st.async``'s complete_tx) and the reader waited for, a cluster barrier (arrive, wait). A
kernel that reads without it may compute the right values in the order this simulator ran it,
and wrong ones on a GPU. This module finds such reads whatever the order.

Vector clocks, one epoch counter a thread. Thread ``u`` (numbered across the cluster: CTA rank
x threads per CTA + thread) writes in its current epoch ``E[u]``; a release (arriving at a
barrier) publishes what ``u`` knows, its own epoch included, and opens the next epoch;
``C[t, u]`` is the last epoch of ``u`` whose writes thread ``t`` may read (learnt by acquiring:
leaving a barrier, a successful mbarrier wait). Shared memory keeps, per byte, its last writer,
the epoch and the instruction; a read of a byte written by another thread ``u`` in an epoch
``C[reader, u]`` does not cover is a race (``Race``), reported with both instructions.

What counts as what (PTX ISA, memory consistency model and the barrier instructions):
``bar.sync`` and ``bar.warp.sync``: release and acquire among the threads that reach it;
``mbarrier.arrive`` (``.release``, the default), ``st.async``'s complete_tx: release into the
mbarrier's current phase; ``mbarrier.try_wait``/``test_wait`` that succeed: acquire of the phase
they observed complete (a wait on the wrong parity observes the phase *before*, which at the
mbarrier's start is no phase at all: it acquires nothing); ``barrier.cluster.arrive``: release
(``.relaxed``: only what a preceding ``fence`` published); ``barrier.cluster.wait``: acquire;
``fence.*`` (and ``membar``): closes the thread's epoch for a later relaxed arrive. A
``cp.async``'s bytes are written when its group lands (the issuing thread's wait), by that
thread; until then the bytes are "in flight" and any access to them is a race too.

What it does not track: global memory (the lesson kernels never communicate through it within
a launch), a write that races with an earlier unordered read (the simulator runs more than one
order instead, so that the read comes after the write in one of them), and the proxies
(``fence.proxy.async``: every access here is of the generic proxy).
"""

from __future__ import annotations

import numpy as np

from .values import Race


class Clocks:
    """The vector clocks of a cluster's ``T`` threads (``C``: T x T int32, 4 MiB at T = 1024)."""

    def __init__(self, T: int):
        self.C = np.zeros((T, T), np.int32)
        self.E = np.ones(T, np.int32)  # the epoch each thread writes in now
        self.F = np.zeros(T, np.int32)  # the epoch each thread's last fence closed (0: none)

    def release(self, gids: np.ndarray, relaxed: bool = False) -> np.ndarray:
        """What the threads ``gids`` publish (a clock over all threads), each closing its epoch
        (``relaxed``: only up to its last fence, and no epoch closes)."""
        rows = self.C[gids]
        rows[np.arange(len(gids)), gids] = self.F[gids] if relaxed else self.E[gids]
        if not relaxed:
            self.E[gids] += 1
        return rows.max(axis=0)

    def acquire(self, gids: np.ndarray, clock: np.ndarray | None) -> None:
        if clock is not None and len(gids):
            self.C[gids] = np.maximum(self.C[gids], clock)

    def sync(self, gids: np.ndarray) -> None:
        """A barrier among ``gids``: each publishes and each learns what all published."""
        self.acquire(gids, self.release(gids))

    def fence(self, gids: np.ndarray) -> None:
        self.F[gids] = self.E[gids]
        self.E[gids] += 1

    def knows(self, reader: np.ndarray, writer: np.ndarray, epoch: np.ndarray) -> np.ndarray:
        """Whether each reader may rely on a write by ``writer`` in ``epoch`` (writer < 0: never
        written)."""
        seen = self.C[reader, np.maximum(writer, 0)]
        return (writer < 0) | (writer == reader) | (seen >= epoch)


class Shadow:
    """Per byte of one CTA's shared memory: the last writer (thread across the cluster, -1:
    none), its epoch and instruction; and the instruction + 1 of a ``cp.async`` still writing
    it (0: none)."""

    def __init__(self, nbytes: int):
        self.writer = np.full(nbytes, -1, np.int32)
        self.epoch = np.zeros(nbytes, np.int32)
        self.at = np.zeros(nbytes, np.int32)
        self.busy = np.zeros(nbytes, np.int32)

    @staticmethod
    def span(offsets: np.ndarray, nbytes: int) -> np.ndarray:
        return offsets[:, None] + np.arange(nbytes)

    def write(self, offsets, nbytes: int, gids, epochs, at: int) -> None:
        idx = self.span(offsets, nbytes)
        self.writer[idx] = np.asarray(gids, np.int32)[:, None]
        self.epoch[idx] = np.asarray(epochs, np.int32)[:, None]
        self.at[idx] = at


def check_access(cluster, target, offsets, nbytes: int, gids, ins, kind: str) -> None:
    """Race if a thread ``gids[i]`` reads (``kind`` "read") bytes of CTA ``target``'s shared
    memory at ``offsets[i]`` that another thread wrote with nothing ordering the write before,
    or reads or writes bytes a cp.async is still writing."""
    shadow = target.shadow
    idx = Shadow.span(offsets, nbytes)
    busy = shadow.busy[idx]
    if busy.any():
        i, j = np.argwhere(busy)[0]
        copy = cluster.program.kernel.instructions[int(busy[i, j]) - 1]
        raise Race(
            f"{cluster.who(int(gids[i]))} {kind}s shared memory that a cp.async is still writing "
            f"(CTA {target.rank}, shared address {int(offsets[i]) + target.shared_base + j:#x}): "
            f"no cp.async.wait_group of the issuing thread has covered its group yet.\n"
            f"  the {kind}:     {ins.where()}\n  the cp.async: {copy.where()}"
        )
    if kind != "read" or cluster.clocks is None:
        return
    writer = shadow.writer[idx]
    reader = np.broadcast_to(np.asarray(gids)[:, None], writer.shape)
    ok = cluster.clocks.knows(reader, writer, shadow.epoch[idx])
    if ok.all():
        return
    i, j = np.argwhere(~ok)[0]
    w = int(writer[i, j])
    write = cluster.program.kernel.instructions[int(shadow.at[idx[i, j]])]
    raise Race(
        f"{cluster.who(int(gids[i]))} reads shared memory (CTA {target.rank}, address "
        f"{int(offsets[i]) + target.shared_base + j:#x}) written by {cluster.who(w)} with "
        "nothing ordering the write before the read (no bar.sync both reach, no mbarrier phase "
        "the write completes and the reader waits for, no cluster barrier between them).\n"
        f"  the read:  {ins.where()}\n  the write: {write.where()}"
    )
