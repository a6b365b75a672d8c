"""Pictures for the lessons, drawn from small NumPy models of what the hardware does.

Everything here runs on a CPU: the models are exact for the data movement they describe
(which lane reads which lane, which thread owns which element), so a figure is a statement a
test can check, not a sketch.
"""

from __future__ import annotations

import numpy as np

WARP = 32


# --- the warp butterfly ----------------------------------------------------------------------


def butterfly_rounds(values, width: int = WARP, offsets=None) -> list[np.ndarray]:
    """Model ``shfl.sync.bfly`` reductions: in each round lane i adds the value of lane i ^ offset.

    Returns the lane values before the first round and after each round. With offsets
    16, 8, 4, 2, 1 (or 1, 2, 4, 8, 16) every lane ends with the sum of all ``width`` lanes.
    """
    v = np.asarray(values, dtype=np.float64).copy()
    assert v.shape == (width,), f"need {width} lane values"
    if offsets is None:
        offsets = [width >> (k + 1) for k in range(int(np.log2(width)))]
    lanes = np.arange(width)
    history = [v.copy()]
    for off in offsets:
        v = v + v[lanes ^ off]
        history.append(v.copy())
    return history


def plot_butterfly(width: int = 8, offsets=None, ax=None):
    """Draw the butterfly exchange lane by lane (default 8 lanes so the lines stay readable)."""
    import matplotlib.pyplot as plt

    if offsets is None:
        offsets = [width >> (k + 1) for k in range(int(np.log2(width)))]
    vals = np.arange(1, width + 1)
    hist = butterfly_rounds(vals, width, offsets)
    if ax is None:
        _, ax = plt.subplots(figsize=(2.2 * (len(offsets) + 1), 0.45 * width + 1))
    for r, off in enumerate(offsets):
        for lane in range(width):
            ax.annotate(
                "",
                xy=(r + 1, lane),
                xytext=(r, lane ^ off),
                arrowprops=dict(arrowstyle="->", color=f"C{r}", alpha=0.6, lw=1),
            )
    for r, v in enumerate(hist):
        for lane in range(width):
            ax.text(
                r,
                lane,
                f"{v[lane]:g}",
                ha="center",
                va="center",
                fontsize=8,
                bbox=dict(boxstyle="round", fc="white", ec="0.6"),
            )
    ax.set_xticks(range(len(hist)))
    ax.set_xticklabels(["start"] + [f"xor {o}" for o in offsets])
    ax.set_yticks(range(width))
    ax.set_yticklabels([f"lane {i}" for i in range(width)])
    ax.invert_yaxis()
    ax.set_xlim(-0.5, len(hist) - 0.5)
    ax.set_title(f"Butterfly sum over {width} lanes: every lane ends with {hist[-1][0]:g}")
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    return ax


# --- who owns what: TV layouts ---------------------------------------------------------------


def row_tv_owner(threads_per_row: int, rows: int, vec: int, cols: int) -> np.ndarray:
    """Thread id owning each element of a (rows, cols) tile under the row-reduction TV layout.

    Threads ``t`` of a CTA split as (column thread ``t % threads_per_row``, row
    ``t // threads_per_row``); a thread owns ``vec`` consecutive elements (one 16-byte access),
    then skips ``threads_per_row * vec`` elements to its next vector, so that a warp's accesses
    to one row are consecutive in memory (coalesced).
    """
    owner = np.full((rows, cols), -1, dtype=int)
    span = threads_per_row * vec
    for r in range(rows):
        for c in range(cols):
            owner[r, c] = r * threads_per_row + (c % span) // vec
    return owner


def plot_tv_layout(threads_per_row=4, rows=2, vec=8, cols=64, ax=None):
    """Colour each element of a tile by the thread that loads it (labels: T<thread>.<value>)."""
    import matplotlib.pyplot as plt

    owner = row_tv_owner(threads_per_row, rows, vec, cols)
    if ax is None:
        _, ax = plt.subplots(figsize=(min(18, cols * 0.28), rows * 0.6 + 1))
    ax.imshow(owner, cmap="tab20", aspect="auto", interpolation="nearest")
    span = threads_per_row * vec
    for r in range(rows):
        for c in range(cols):
            v = (c // span) * vec + c % vec
            ax.text(c, r, f"T{owner[r, c]}\n{v}", ha="center", va="center", fontsize=5)
    ax.set_xlabel("column (element)")
    ax.set_ylabel("row")
    ax.set_yticks(range(rows))
    ax.set_title(
        f"{threads_per_row} threads per row, {vec} elements (16 B) per access: "
        "neighbouring threads read neighbouring vectors"
    )
    return ax


# --- cp.async: loads in flight while the reduction runs ---------------------------------------


def pipeline_timeline(stages: int, load_us: float, reduce_us: float):
    """Start/end of each stage's load and reduce when loads are issued up front (cp.async).

    All ``stages`` loads are issued at t=0 and share the bandwidth, so part k arrives at
    (k+1) * load_us; its reduction starts when it has arrived and the previous reduction is done.
    Returns a list of (stage, load_start, load_end, reduce_start, reduce_end) and the total.
    """
    rows, t_reduce = [], 0.0
    for k in range(stages):
        arrive = (k + 1) * load_us
        start = max(arrive, t_reduce)
        t_reduce = start + reduce_us
        rows.append((k, 0.0, arrive, start, t_reduce))
    return rows, t_reduce


def plot_timeline(stages=4, load_us=1.0, reduce_us=0.3, ax=None):
    import matplotlib.pyplot as plt

    rows, total = pipeline_timeline(stages, load_us, reduce_us)
    serial = stages * load_us + stages * reduce_us
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.5 * stages + 1.2))
    for k, ls, le, rs, re in rows:
        ax.barh(
            k, le - ls, left=ls, color="C0", alpha=0.35, label="load in flight" if k == 0 else ""
        )
        ax.barh(k, re - rs, left=rs, color="C1", label="reduce" if k == 0 else "")
    ax.set_yticks(range(stages))
    ax.set_yticklabels([f"part {k}" for k in range(stages)])
    ax.invert_yaxis()
    ax.set_xlabel("time (us)")
    ax.set_title(f"{stages} parts in flight: {total:.1f} us vs {serial:.1f} us load-then-reduce")
    ax.legend(loc="lower right", fontsize=8)
    return ax


def littles_law_bytes(bandwidth_gbps: float, latency_ns: float) -> float:
    """Bytes that must be in flight to sustain ``bandwidth`` at ``latency`` (Little's law)."""
    return bandwidth_gbps * 1e9 * latency_ns * 1e-9
