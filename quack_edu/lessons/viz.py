"""Pictures for the lessons, drawn from small NumPy models of what the hardware does.

Everything here runs on a CPU: the models are exact for the data movement they describe
(which lane reads which lane, which thread owns which element), so a figure is a statement a
test can check, not a sketch.
"""

from __future__ import annotations

import numpy as np

WARP = 32


# --- the warp butterfly ----------------------------------------------------------------------


def _shuffle_rounds(values, width, offsets, source) -> list[np.ndarray]:
    """Lane values before the first round and after each: in the round of offset ``off`` lane i
    adds the value of lane ``source(lanes, off)[i]`` (offsets: width/2, ..., 1 by default)."""
    v = np.asarray(values, dtype=np.float64).copy()
    assert v.shape == (width,), f"need {width} lane values"
    if offsets is None:
        offsets = [width >> (k + 1) for k in range(int(np.log2(width)))]
    lanes = np.arange(width)
    history = [v.copy()]
    for off in offsets:
        v = v + v[source(lanes, off)]
        history.append(v.copy())
    return history


def butterfly_rounds(values, width: int = WARP, offsets=None) -> list[np.ndarray]:
    """Model ``shfl.sync.bfly`` reductions: in each round lane i adds the value of lane i ^ offset.

    Returns the lane values before the first round and after each round. With offsets
    16, 8, 4, 2, 1 (or 1, 2, 4, 8, 16) every lane ends with the sum of all ``width`` lanes.
    """
    return _shuffle_rounds(values, width, offsets, lambda lanes, off: lanes ^ off)


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


# --- one-way shuffles, for contrast -----------------------------------------------------------


def shuffle_down_rounds(values, width: int = WARP, offsets=None) -> list[np.ndarray]:
    """Model ``shfl.sync.down`` reductions: lane i adds the value of lane i + offset; a lane whose
    source is past the last lane (``i + offset >= width``) reads its own value, as the hardware
    does with the default clamp. Only lane 0 is sure to end with the sum of all lanes."""
    return _shuffle_rounds(
        values, width, offsets, lambda lanes, off: np.where(lanes + off < width, lanes + off, lanes)
    )


# --- warps of a row meet in shared memory ----------------------------------------------------


def block_reduce_model(warp_totals):
    """The block level of the reduction, for warp totals of shape (rows, warps_per_row).

    Lane 0 of warp w of row r stores its total in ``buffer[r, w]``; after the barrier every warp
    of row r adds the slots ``buffer[r, :]``. Returns (buffer, result of each warp), both
    (rows, warps_per_row): every warp of a row ends with the row's total.
    """
    buffer = np.asarray(warp_totals, dtype=np.float64).copy()
    result = np.repeat(buffer.sum(axis=1, keepdims=True), buffer.shape[1], axis=1)
    return buffer, result


def _warp_box(ax, x0, width, y, color, label):
    """A warp's rounded box at (x0, y), ``width`` wide, its label in the middle."""
    from matplotlib.patches import FancyBboxPatch

    box = (x0, y - 0.3), width, 0.6
    ax.add_patch(FancyBboxPatch(*box, boxstyle="round,pad=0.02", fc=color, alpha=0.25, ec=color))
    ax.text(x0 + width / 2, y, label, ha="center", va="center", fontsize=7)


def plot_block_reduction(rows: int = 2, warps_per_row: int = 4, ax=None, seed: int = 0):
    """Draw the two-level reduction of a CTA holding ``rows`` rows of ``warps_per_row`` warps:
    each warp's butterfly total -> its slot of the shared buffer (rows, warps_per_row) ->
    bar.sync -> every warp reads its row's slots and adds them."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    rng = np.random.default_rng(seed)
    totals = rng.integers(1, 20, size=(rows, warps_per_row)).astype(float)
    buffer, result = block_reduce_model(totals)
    n = rows * warps_per_row
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.55 * n + 1.6))

    def warp_y(r, w):
        return n - 1 - (r * warps_per_row + w)

    cell = 0.8
    grid_x0, grid_y0 = 3.2, (n - rows * cell) / 2 - 0.4
    for r in range(rows):
        for w in range(warps_per_row):
            y, color = warp_y(r, w), f"C{r}"
            k = r * warps_per_row + w
            _warp_box(
                ax, 0, 2.1, y, color, f"warp {k} (row {r}): 32 lanes\nbutterfly -> {totals[r, w]:g}"
            )
            # the buffer is drawn row-major: row r at the top, slot w to the right
            cx = grid_x0 + w * cell + cell / 2
            cy = grid_y0 + (rows - 1 - r) * cell + cell / 2
            ax.annotate(
                "",
                xy=(cx, cy),
                xytext=(2.15, y),
                arrowprops=dict(arrowstyle="->", color=color, alpha=0.6, lw=0.8, shrinkB=10),
            )
            ax.add_patch(
                Rectangle((cx - cell / 2, cy - cell / 2), cell, cell, fc=color, alpha=0.2, ec="k")
            )
            ax.text(cx, cy, f"{buffer[r, w]:g}", ha="center", va="center", fontsize=8)
            _warp_box(ax, 7.6, 1.9, y, color, f"warp {k}: sum of row {r}\n= {result[r, w]:g}")
        gx = grid_x0 + warps_per_row * cell
        gy = grid_y0 + (rows - 1 - r) * cell + cell / 2
        for w in range(warps_per_row):
            ax.annotate(
                "",
                xy=(7.55, warp_y(r, w)),
                xytext=(gx + 0.05, gy),
                arrowprops=dict(arrowstyle="->", color=f"C{r}", alpha=0.5, lw=0.8),
            )
    ax.text(
        grid_x0 + warps_per_row * cell / 2,
        grid_y0 + rows * cell + 0.25,
        f"shared memory buffer\n({rows} rows_per_cta, {warps_per_row} warps_per_row) fp32",
        ha="center",
        va="bottom",
        fontsize=8,
    )
    bx = grid_x0 + warps_per_row * cell + 0.9
    ax.axvline(bx, color="k", ls="--", lw=1)
    ax.text(bx, n - 0.2, "bar.sync", ha="center", va="bottom", fontsize=8)
    ax.set_xlim(-0.2, 9.7)
    ax.set_ylim(-0.8, n + 0.4)
    ax.axis("off")
    ax.set_title("Block reduction: warp totals meet in shared memory, one barrier, one more sum")
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
