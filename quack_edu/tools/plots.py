"""The benchmark's figures, drawn from its records (no GPU needed): GB/s against N with the
copy ceiling (``plot``), the ladder at one shape (``plot_ladder``) and the speed-up over
PyTorch (``plot_speedup``); ``plot_all`` draws those a record asks for."""

from __future__ import annotations

import os

from ..stages import BACKWARD_STAGES, STAGE_ORDER
from .kernels import LIBRARY, split_name
from .records import pass_name, passes
from .records import row_weight_dtype as _wdt
from .runinfo import finish, pyplot


def _colors(plt, kernels) -> dict:
    """A colour per kernel, kept in every panel: matplotlib's ten, or twenty (paired shades)
    for a longer ladder."""
    if len(kernels) <= 10:
        return {k: f"C{i}" for i, k in enumerate(kernels)}
    cmap = plt.get_cmap("tab20")
    return {k: cmap(i % 20) for i, k in enumerate(kernels)}


def plot(result: dict, path: str | None = None):
    """GB/s against N, one panel per weight dtype (and residual mode), copy ceiling dotted,
    graph rows dashed; a kernel keeps its colour in every panel. A record of both passes: the
    forward's panels above the backward's. Saved to ``path``, else the figure is returned."""
    plt = pyplot()
    parts = passes(result)
    grid = [
        list(dict.fromkeys((_wdt(r), bool(r.get("residual"))) for r in p["rows"])) for p in parts
    ]
    ncols = max(len(g) for g in grid)
    fig, axes = plt.subplots(
        len(parts), ncols, figsize=(9 * ncols, 5 * len(parts)), squeeze=False, sharey=True
    )
    kernels = list(dict.fromkeys(r["kernel"] for p in parts for r in p["rows"]))
    colors = _colors(plt, kernels)
    for ax_row, part, panels in zip(axes, parts, grid, strict=True):
        for ax in ax_row[len(panels) :]:
            ax.set_visible(False)
        for ax, (w, res) in zip(ax_row, panels, strict=False):
            mine = [r for r in part["rows"] if (_wdt(r), bool(r.get("residual"))) == (w, res)]
            for g in sorted({r["graph"] for r in mine}):
                for k in kernels:
                    pts = sorted(
                        (r["N"], r["gbps"])
                        for r in mine
                        if r["kernel"] == k and r["graph"] == g and "gbps" in r
                    )
                    if pts:
                        ax.plot(
                            *zip(*pts, strict=True),
                            marker="o" if not g else "s",
                            color=colors[k],
                            ls="-" if not g else "--",
                            label=f"{k}{' (graph)' if g else ''}",
                        )
            copy = part["copy_gbps"]
            ax.axhline(copy, color="k", ls=":", label=f"D2D copy {copy:.0f} GB/s")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("N (row length)")
            ax.set_ylabel("GB/s")
            what = f"x {mine[0]['dtype']}, weights {w}" + (", with residual" if res else "")
            title = f"RMSNorm {pass_name(part)}, {what} - {part['gpu']}, {part['date']}"
            ax.set_title(title, fontsize=10)
            ax.legend(fontsize=8, ncol=2)
            ax.grid(alpha=0.3)
    return finish(plt, fig, path)


def ladder_shape(result: dict) -> tuple[int, int]:
    """The shape ``plot_ladder`` shows: 32768 x 16384 when the run has it (QuACK's post's
    running example of a long row), else the largest N at which most kernels ran."""
    rows = [r for p in passes(result) for r in p["rows"] if "gbps" in r and not r["graph"]]
    shapes = {(r["M"], r["N"]) for r in rows}
    if (32768, 16384) in shapes:
        return 32768, 16384
    count = {s: len({r["kernel"] for r in rows if (r["M"], r["N"]) == s}) for s in shapes}
    return max(shapes, key=lambda s: (count[s], s[1]))


def ladder_order(kernels) -> list[str]:
    """Stages in lesson order, then the library, then the peers."""
    rank = {k: i for i, k in enumerate(STAGE_ORDER + BACKWARD_STAGES + tuple(LIBRARY))}
    return sorted(kernels, key=lambda k: (rank.get(split_name(k)[0], len(rank)), k))


def plot_ladder(result: dict, path: str | None = None, shape=None):
    """The ladder at one shape (``ladder_shape``): each kernel's plain GB/s as % of the run's
    copy, a bar per weight dtype, one panel per pass; stages in lesson order, then the
    library, then the peers. Saved to ``path``, else the figure is returned."""
    plt = pyplot()
    M, N = shape or ladder_shape(result)
    parts = passes(result)
    fig, axes = plt.subplots(1, len(parts), figsize=(8 * len(parts), 5.5), squeeze=False)
    for ax, part in zip(axes[0], parts, strict=True):
        mine = [
            r
            for r in part["rows"]
            if (r["M"], r["N"]) == (M, N) and not r["graph"] and not r.get("residual")
        ]
        kernels = ladder_order(dict.fromkeys(r["kernel"] for r in mine))
        wdts = list(dict.fromkeys(_wdt(r) for r in mine))
        width = 0.8 / max(1, len(wdts))
        for j, w in enumerate(wdts):
            pct = []
            for k in kernels:
                hit = [r for r in mine if r["kernel"] == k and _wdt(r) == w and "gbps" in r]
                pct.append(100 * hit[0]["gbps"] / part["copy_gbps"] if hit else 0.0)
            xs = [i + (j - (len(wdts) - 1) / 2) * width for i in range(len(kernels))]
            bars = ax.bar(xs, pct, width, label=f"weights {w}", color=f"C{j}")
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.axhline(100, color="k", ls=":", label=f"D2D copy {part['copy_gbps']:.0f} GB/s")
        ax.set_xticks(range(len(kernels)), kernels, rotation=30, ha="right")
        ax.set_ylim(0, 118)  # room above the bars for the legend
        ax.set_ylabel("% of the copy's GB/s")
        ax.set_title(
            f"RMSNorm {pass_name(part)}, {M} x {N}, x {part['dtype']} - {part['gpu']}, "
            f"{part['date']}",
            fontsize=10,
        )
        ax.legend(fontsize=8, loc="upper center", ncol=3)
        ax.grid(alpha=0.3, axis="y")
    return finish(plt, fig, path)


#: the baseline of ``plot_speedup``: RMSNorm as model code writes it in PyTorch ops, else
#: PyTorch's fused ``F.rms_norm``
SPEEDUP_BASES = ("torch-ops", "torch-eager")


def speedups(part: dict, base: str | None = None) -> tuple[str, list[dict]]:
    """(the base, [{kernel, N, weight_dtype, speedup}]) of one pass's plain rows: each
    kernel's time against the base's at the same shape and weight dtype."""
    rows = [r for r in part["rows"] if "us" in r and not r["graph"] and not r.get("residual")]
    have = {r["kernel"] for r in rows}
    base = base or next((b for b in SPEEDUP_BASES if b in have), None)
    if base is None:
        return "", []
    ref = {(r["N"], _wdt(r)): r["us"] for r in rows if r["kernel"] == base}
    out = [
        {"kernel": r["kernel"], "N": r["N"], "weight_dtype": _wdt(r),
         "speedup": ref[(r["N"], _wdt(r))] / r["us"]}
        for r in rows
        if r["kernel"] != base and (r["N"], _wdt(r)) in ref
    ]  # fmt: skip
    return base, out


def plot_speedup(result: dict, path: str | None = None):
    """Speed-up over PyTorch (``SPEEDUP_BASES``) against N, as QuACK's README reports it: a
    line per kernel, a row of panels per pass, a panel per weight dtype. Saved to ``path``,
    else the figure is returned."""
    plt = pyplot()
    parts = passes(result)
    grid = [[(p, w) for w in dict.fromkeys(_wdt(r) for r in p["rows"])] for p in parts]
    ncols = max(len(g) for g in grid)
    fig, axes = plt.subplots(len(parts), ncols, figsize=(8 * ncols, 5 * len(parts)), squeeze=False)
    kernels = ladder_order(dict.fromkeys(r["kernel"] for p in parts for r in p["rows"]))
    colors = _colors(plt, kernels)
    for ax_row, panels in zip(axes, grid, strict=True):
        for ax in ax_row[len(panels) :]:
            ax.set_visible(False)
        for ax, (part, w) in zip(ax_row, panels, strict=False):
            _speedup_panel(ax, part, w, kernels, colors)
    return finish(plt, fig, path)


def _speedup_panel(ax, part: dict, w: str, kernels, colors) -> None:
    """One panel of ``plot_speedup``: one pass, one weight dtype."""
    from matplotlib.ticker import FuncFormatter

    base, ups = speedups(part)
    for k in kernels:
        pts = sorted(
            (u["N"], u["speedup"]) for u in ups if u["kernel"] == k and u["weight_dtype"] == w
        )
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", color=colors[k], label=k)
    ax.axhline(1, color="k", ls=":", label=base or "no PyTorch row")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_xlabel("N (row length)")
    ax.set_ylabel(f"speed-up over {base}")
    ax.set_title(f"RMSNorm {pass_name(part)}, weights {w} - {part['gpu']}", fontsize=10)
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3, which="both")


def plot_all(result: dict, path: str) -> list[str]:
    """``plot`` into ``path``; a record of both passes also gets its ladder and its speed-ups
    (``<stem>_ladder.png``, ``<stem>_speedup.png``); a model benchmark's record its own plot.
    Returns the paths written."""
    if result.get("kind") == "model_bench":
        from .model_bench import plot as plot_model

        plot_model(result, path)
        return [path]
    plot(result, path)
    if result.get("pass") != "both":
        return [path]
    stem, ext = os.path.splitext(path)
    more = [f"{stem}_ladder{ext}", f"{stem}_speedup{ext}"]
    plot_ladder(result, more[0])
    plot_speedup(result, more[1])
    return [path, *more]
