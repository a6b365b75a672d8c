"""Pictures and a small event model of the cluster exchange (lesson 04).

``plot_cluster_exchange`` draws who writes which slot of which CTA's reduction buffer.

``MBarrier`` is the phase logic of a PTX mbarrier as the cluster stage uses it: ``init`` sets
the pending arrivals, ``arrive_expect_tx`` arrives and adds the bytes to expect to the
transaction count (tx-count), every ``st.async ... mbarrier::complete_tx::bytes`` that lands
subtracts its bytes, and the phase completes at the moment both reach zero.

``simulate_exchange`` replays one row's exchange across the CTAs of a cluster as timed events
(start, mbarrier init, loads, remote stores landing, the wait completing, exit), with or
without the two cluster barriers and with any expect-tx byte count. The times are a stated
assumption, not a measurement; what the model shows exactly is what follows from an order of
events: a store that lands before its receiver initialised its mbarrier is lost (on the GPU
that is undefined behaviour: the init overwrites the barrier's state), so the receiver's wait
never completes; a count too small completes the wait before every slot is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SLOT_BYTES = 4  # one fp32 partial per st.async


# --- the picture -----------------------------------------------------------------------------


def exchange_slots(cluster_n: int, warps_per_row: int) -> list[tuple[int, int, int]]:
    """Every remote store of one row's exchange as (sender rank, warp, receiver rank): warp ``w``
    of CTA ``s`` writes slot ``(w, s)`` of every CTA's buffer, its own included."""
    return [
        (s, w, r) for s in range(cluster_n) for w in range(warps_per_row) for r in range(cluster_n)
    ]


def plot_cluster_exchange(cluster_n: int = 4, warps_per_row: int = 2, sender: int = 1, ax=None):
    """CTAs of a cluster side by side, each with its (warps_per_row x cluster_n) slots of one row,
    coloured by the CTA whose warp writes them; arrows show one sender's fan-out."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    if ax is None:
        _, ax = plt.subplots(figsize=(2.4 * cluster_n + 1, 0.5 * warps_per_row + 2.0))
    cell, gap = 0.5, 1.2
    width = cluster_n * cell
    colours = [f"C{s}" for s in range(cluster_n)]
    for r in range(cluster_n):
        x0 = r * (width + gap)
        ax.add_patch(
            Rectangle(
                (x0 - 0.15, -0.35),
                width + 0.3,
                warps_per_row * cell + 1.3,
                fill=False,
                ec="0.4",
                lw=1.2,
            )
        )
        ax.text(
            x0 + width / 2,
            warps_per_row * cell + 0.75,
            f"CTA rank {r}",
            ha="center",
            fontsize=10,
            weight="bold",
        )
        for w in range(warps_per_row):
            for s in range(cluster_n):
                y = (warps_per_row - 1 - w) * cell + 0.5
                ax.add_patch(
                    Rectangle(
                        (x0 + s * cell, y), cell, cell, fc=colours[s], alpha=0.45, ec="k", lw=0.6
                    )
                )
                ax.text(
                    x0 + (s + 0.5) * cell,
                    y + cell / 2,
                    f"w{w}\nr{s}",
                    ha="center",
                    va="center",
                    fontsize=6,
                )
        for w in range(warps_per_row):  # this CTA's warps, each holding its partial
            ax.text(
                x0 + (w + 0.5) * width / warps_per_row,
                0.05,
                f"warp {w}",
                ha="center",
                fontsize=7,
                color=colours[r],
                weight="bold",
            )
    for s, w, r in exchange_slots(cluster_n, warps_per_row):
        if s != sender:
            continue
        src = (s * (width + gap) + (w + 0.5) * width / warps_per_row, 0.2)
        y = (warps_per_row - 1 - w) * cell + 0.5
        dst = (r * (width + gap) + (s + 0.5) * cell, y)
        ax.add_patch(
            FancyArrowPatch(
                src,
                dst,
                arrowstyle="->",
                mutation_scale=9,
                connectionstyle="arc3,rad=-0.25",
                color=colours[s],
                lw=1.0,
            )
        )
    ax.set_xlim(-0.5, cluster_n * (width + gap))
    ax.set_ylim(-0.6, warps_per_row * cell + 1.2)
    ax.set_aspect("equal")
    ax.axis("off")
    n = len(exchange_slots(cluster_n, warps_per_row))
    ax.set_title(
        f"slot (w, r) of every CTA's buffer is written by warp w of CTA rank r\n"
        f"{n} st.async per row, {warps_per_row * cluster_n * SLOT_BYTES} B into each CTA "
        f"(arrows: CTA {sender}'s stores)",
        fontsize=9,
    )
    return ax


# --- the mbarrier and the event model --------------------------------------------------------


@dataclass
class MBarrier:
    """A PTX mbarrier's phase logic: pending arrivals and the transaction count (bytes)."""

    initialised: bool = False
    expected_arrivals: int = 0
    pending: int = 0
    tx: int = 0
    phase: int = 0
    lost_bytes: int = 0

    def init(self, count: int = 1) -> None:
        self.initialised, self.expected_arrivals, self.pending, self.tx = True, count, count, 0

    def arrive_expect_tx(self, nbytes: int) -> None:
        self.tx += nbytes
        self.pending -= 1
        self._complete()

    def complete_tx(self, nbytes: int) -> None:
        if not self.initialised:  # a store before the init: its credit is wiped by the init
            self.lost_bytes += nbytes
            return
        self.tx -= nbytes
        self._complete()

    def _complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.expected_arrivals


@dataclass
class ExchangeRun:
    """Times (us) per CTA rank; None where the event never happens (a hang)."""

    cluster_n: int
    start: list[float]
    init: list[float]
    send: list[float | None]
    done: list[float | None]
    exit: list[float | None]
    #: (sender, receiver, time landed): stores that landed before the receiver's init
    lost: list[tuple[int, int, float]] = field(default_factory=list)
    #: (sender, receiver, time landed): stores that landed after the receiver read its slots
    stale: list[tuple[int, int, float]] = field(default_factory=list)
    #: (sender, receiver, time landed): stores that landed after the receiver had exited
    late: list[tuple[int, int, float]] = field(default_factory=list)
    landings: list[tuple[int, int, float]] = field(default_factory=list)

    @property
    def hung(self) -> list[int]:
        return [r for r in range(self.cluster_n) if self.exit[r] is None]

    def verdict(self) -> str:
        if self.hung:
            why = [r for r in range(self.cluster_n) if self.done[r] is None]
            return (
                f"hang: the wait of CTA {why} never completes"
                + (f" ({len(self.lost)} stores landed before its init)" if self.lost else "")
                + (
                    ", and the others wait for it at the exit barrier"
                    if len(self.hung) > len(why)
                    else ""
                )
            )
        problems = []
        if self.stale:
            problems.append(f"{len(self.stale)} slots read before they were written (garbage)")
        if self.late:
            problems.append(f"{len(self.late)} stores landed in a CTA that had exited")
        return "; ".join(problems) if problems else "correct: every slot written before it is read"


def simulate_exchange(
    cluster_n: int = 4,
    start_us=None,
    *,
    warps: int = 1,
    load_us: float = 1.0,
    hop_us: float = 0.3,
    step_us: float = 0.1,
    store_us: float = 0.5,
    wait_before_send: bool = True,
    wait_before_exit: bool = True,
    expect_bytes: int | None = None,
) -> ExchangeRun:
    """One row's exchange across ``cluster_n`` CTAs that start at ``start_us`` (default all 0).

    Each CTA: initialises and arms its mbarrier ``step_us`` after its start (expecting
    ``expect_bytes``, default ``warps * cluster_n * 4``) and arrives on the cluster barrier;
    its loads and warp reduction end ``load_us + step_us`` after its start; it then waits for
    every CTA's arrival (``wait_before_send``) and sends one 4-byte store per warp to every CTA,
    landing ``hop_us`` later; once its mbarrier's phase completes it reads its slots, arrives
    ``step_us`` later, writes y for ``store_us`` and exits, after every CTA's arrival when
    ``wait_before_exit``.
    """
    n = cluster_n
    start = [0.0] * n if start_us is None else [float(t) for t in start_us]
    if len(start) != n:
        raise ValueError(f"need {n} start times, got {len(start)}")
    expect = warps * n * SLOT_BYTES if expect_bytes is None else int(expect_bytes)
    init = [s + step_us for s in start]
    ready = max(init)  # the first cluster barrier: every CTA has initialised its mbarrier
    send = [
        max(s + load_us + step_us, ready) if wait_before_send else s + load_us + step_us
        for s in start
    ]
    landings = sorted(
        (send[s] + hop_us, s, r) for s in range(n) for _ in range(warps) for r in range(n)
    )
    run = ExchangeRun(n, start, init, list(send), [None] * n, [None] * n)
    run.landings = [(s, r, t) for t, s, r in landings]
    for r in range(n):
        bar = MBarrier()
        events = sorted(
            [(init[r], 0, "init", None)] + [(t, 1, "land", s) for t, s, rr in landings if rr == r]
        )
        for t, _, kind, s in events:
            if kind == "init":
                bar.init(1)
                bar.arrive_expect_tx(expect)
            else:
                if not bar.initialised:
                    run.lost.append((s, r, t))
                bar.complete_tx(SLOT_BYTES)
            if bar.phase > 0 and run.done[r] is None:
                run.done[r] = t
    arrive = [None if d is None else d + step_us for d in run.done]
    for r in range(n):
        if arrive[r] is None:
            continue
        if wait_before_exit:
            run.exit[r] = None if None in arrive else max(arrive[r] + store_us, max(arrive))
        else:
            run.exit[r] = arrive[r] + store_us
    for s, r, t in run.landings:
        if run.done[r] is not None and t > run.done[r]:
            run.stale.append((s, r, t))
        if run.exit[r] is not None and t > run.exit[r]:
            run.late.append((s, r, t))
    return run


def plot_exchange(run: ExchangeRun, ax=None, title: str | None = None):
    """A timeline per CTA: loads, mbarrier init (|), send (>), wait done (o), exit (s); the
    stores as arrows from sender to receiver, red when lost, stale or late."""
    import matplotlib.pyplot as plt

    n = run.cluster_n
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.55 * n + 1.4))
    ends = [t for t in run.exit + run.done + run.send if t is not None]
    t_end = max(ends + [t for *_, t in run.landings]) + 0.6
    bad = {(s, r, t) for s, r, t in run.lost + run.stale + run.late}
    for r in range(n):
        ax.barh(
            r,
            run.send[r] - run.start[r] if run.send[r] else 0,
            left=run.start[r],
            color="C0",
            alpha=0.25,
            label="loads, warp sums, waiting to send" if r == 0 else "",
        )
        ax.plot(run.init[r], r, "|", color="k", ms=14, label="mbarrier init" if r == 0 else "")
        if run.done[r] is not None:
            ax.plot(run.done[r], r, "o", color="C2", label="wait done" if r == 0 else "")
        if run.exit[r] is not None:
            ax.plot(run.exit[r], r, "s", color="0.3", label="exit" if r == 0 else "")
        else:
            ax.annotate(
                "",
                xy=(t_end, r),
                xytext=(run.init[r], r),
                arrowprops=dict(arrowstyle="->", color="C3", ls="--"),
            )
            ax.text(t_end, r + 0.25, "waits forever", color="C3", ha="right", fontsize=8)
    for s, r, t in run.landings:
        colour = "C3" if (s, r, t) in bad else "0.55"
        ax.annotate(
            "",
            xy=(t, r),
            xytext=(run.send[s], s),
            arrowprops=dict(arrowstyle="->", color=colour, lw=0.8, alpha=0.8),
        )
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"CTA {r}" for r in range(n)])
    ax.invert_yaxis()
    ax.set_xlim(min(run.start) - 0.2, t_end + 0.2)
    ax.set_xlabel("time (us, model)")
    ax.set_title(title or run.verdict(), fontsize=9)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.32), fontsize=7, ncol=4, frameon=False)
    return ax


__all__ = [
    "SLOT_BYTES",
    "exchange_slots",
    "plot_cluster_exchange",
    "MBarrier",
    "ExchangeRun",
    "simulate_exchange",
    "plot_exchange",
]
