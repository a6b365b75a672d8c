"""The verdict: the project's acceptance criteria, judged on a benchmark's rows.

Our kernel (``ours``, the library by default) is compared, case by case (weight dtype, shape,
plain or graph timing), with QuACK, the best peer and the copy ceiling (``judge_cases``). Each
criterion is a ``Criterion`` in ``CRITERIA``, with bars from ``Thresholds``;
``verdict`` walks the list and turns each finding into a PASS / FAIL / N/A line the same way.
The forward's bars are ``Thresholds``' defaults, the backward's ``BWD_THRESHOLDS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from .kernels import PEERS
from .records import row_weight_dtype

#: (smallest N, largest N, % of the copy) that our kernel must reach, plain timing
COPY_BANDS = ((4096, 65536, 95.0), (131072, 262144, 93.0))
#: the backward issue's acceptance criteria (``verdict``'s thresholds for ``--pass bwd``): no
#: shape below 0.98x the best peer, geomean >= 1.10x QuACK, >= 85% of copy at 4K-32K and
#: >= 75% at 64K-262K; no fp32-vs-bf16-weight criterion
BWD_THRESHOLDS = {
    "peer_margin": 0.02,
    "geomean_min": 1.10,
    "fp32_margin": None,
    "copy_bands": ((4096, 32768, 85.0), (65536, 262144, 75.0)),
    "residual_ns": (),
}


@dataclass(frozen=True)
class Thresholds:
    """The bars of the criteria (the forward's by default). ``fp32_margin`` None or
    ``residual_ns`` empty: that criterion is not judged."""

    #: every shape >= the best peer * (1 - peer_margin)
    peer_margin: float = 0.015
    #: geomean of ours / QuACK over the plain shapes >= geomean_min, per weight dtype
    geomean_min: float = 1.05
    #: ours with fp32 weights / ours with bf16 weights >= 1 - fp32_margin (faster is fine)
    fp32_margin: float | None = 0.02
    #: (smallest N, largest N, % of copy): the plain rows' % of copy, per weight dtype
    copy_bands: tuple = COPY_BANDS
    #: the row lengths where, with a residual, ours / QuACK >= residual_min
    residual_ns: tuple = (4096, 16384, 65536)
    residual_min: float = 1.0


def thresholds_for(pass_: str) -> dict:
    """``verdict``'s thresholds for a pass: the forward issue's (its defaults) or the
    backward's (``BWD_THRESHOLDS``)."""
    return dict(BWD_THRESHOLDS) if pass_ == "bwd" else {}


def _geomean(xs) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def _shape(e) -> str:
    return f"{e['M']}x{e['N']}{' graph' if e['graph'] else ''}"


# --- the cases: ours against QuACK, the best peer and the copy ------------------------------


@dataclass
class Cases:
    """Our kernel's cases, each an entry {M, N, graph, gbps, pct_copy, quack_gbps, vs_quack,
    best_peer, best_peer_gbps, vs_best_peer[, error][, fp32_vs_bf16]} (ratios None where a
    side is missing)."""

    #: weight dtype -> {"shapes": entries, "geomean_vs_quack" (plain rows),
    #: "geomean_vs_quack_all" (plain and graph rows)}
    by_weight_dtype: dict = field(default_factory=dict)
    #: {M, N, graph, ratio}: ours with fp32 weights / with bf16 weights, where both ran
    fp32_vs_bf16: list = field(default_factory=list)
    #: weight dtype -> entries of the rows with a residual
    residual: dict = field(default_factory=dict)


def judge_cases(rows, ours: str, quack: str, peers) -> Cases:
    """``ours`` against ``quack``, the best of ``peers`` and the copy, per case; the latest row
    of a case counts (runs merged in order)."""
    last = {}
    for r in rows:
        key = (bool(r.get("residual")), row_weight_dtype(r), r["M"], r["N"], bool(r["graph"]))
        last[(*key, r["kernel"])] = r

    def row_gbps(r):
        return r.get("gbps") if r is not None else None

    def entries(residual: bool, wdt: str) -> list[dict]:
        out = []
        for (res, w, M, N, g, k), r in last.items():
            if (res, w, k) != (residual, wdt, ours):
                continue
            e = {"M": M, "N": N, "graph": g, "gbps": row_gbps(r), "pct_copy": r.get("pct_copy")}
            if "error" in r:
                e["error"] = r["error"][:120]
            q = row_gbps(last.get((res, w, M, N, g, quack)))
            e["quack_gbps"] = q
            e["vs_quack"] = e["gbps"] / q if q and e["gbps"] else None
            best = max(
                (
                    (row_gbps(last.get((res, w, M, N, g, p))) or 0, p)
                    for p in peers
                    if p != ours and row_gbps(last.get((res, w, M, N, g, p)))
                ),
                default=(None, None),
            )
            e["best_peer"], e["best_peer_gbps"] = best[1], best[0]
            e["vs_best_peer"] = e["gbps"] / best[0] if best[0] and e["gbps"] else None
            out.append(e)
        return sorted(out, key=lambda e: (e["graph"], e["N"], e["M"]))

    cases = Cases()
    for w in dict.fromkeys(w for (res, w, *_, k) in last if not res and k == ours):
        es = entries(False, w)
        cases.by_weight_dtype[w] = {
            "shapes": es,
            "geomean_vs_quack": _geomean(e["vs_quack"] for e in es if not e["graph"]),
            "geomean_vs_quack_all": _geomean(e["vs_quack"] for e in es),
        }
    if "bf16" in cases.by_weight_dtype and "fp32" in cases.by_weight_dtype:
        b16 = {(e["M"], e["N"], e["graph"]): e for e in cases.by_weight_dtype["bf16"]["shapes"]}
        for e in cases.by_weight_dtype["fp32"]["shapes"]:
            other = b16.get((e["M"], e["N"], e["graph"]))
            if other is None:
                continue
            ratio = e["gbps"] / other["gbps"] if e["gbps"] and other["gbps"] else None
            e["fp32_vs_bf16"] = ratio
            case = {"M": e["M"], "N": e["N"], "graph": e["graph"]}
            cases.fp32_vs_bf16.append({**case, "ratio": ratio})
    for w in dict.fromkeys(w for (res, w, *_, k) in last if res and k == ours):
        cases.residual[w] = entries(True, w)
    return cases


# --- the criteria ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """What a criterion found: how many cases it judged (0: N/A), those that fail (as the
    verdict names them), and for a criterion on one figure (a geomean) that figure in words
    and whether it meets its bar."""

    judged: int
    failing: list = field(default_factory=list)
    figure: str | None = None
    ok: bool = True


@dataclass(frozen=True)
class Criterion:
    """One acceptance criterion: its verdict line's ``title`` from the bars, and ``check``,
    which judges the cases of one weight dtype (``per_weight_dtype``) or of all (weight dtype
    None). ``judged``: whether the bars ask for it at all."""

    title: Callable[[Thresholds], str]
    check: Callable[[Cases, Thresholds, str | None], Finding]
    per_weight_dtype: bool = False
    judged: Callable[[Thresholds], bool] = lambda t: True


def _vs_best_peer(cases: Cases, t: Thresholds, w: str | None) -> Finding:
    """Every shape (plain and graph rows) within a margin of the fastest peer."""
    judged = [e for e in cases.by_weight_dtype[w]["shapes"] if e["best_peer"]]
    bad = [
        f"{_shape(e)} {e['vs_best_peer']:.3f}x {e['best_peer']}"
        if e["vs_best_peer"]
        else f"{_shape(e)} error"
        for e in judged
        if not e["vs_best_peer"] or e["vs_best_peer"] < 1 - t.peer_margin
    ]
    return Finding(len(judged), bad)


def _geomean_vs_quack(cases: Cases, t: Thresholds, w: str | None) -> Finding:
    """The geometric mean of ours / QuACK over the plain shapes."""
    d = cases.by_weight_dtype[w]
    judged = [e for e in d["shapes"] if not e["graph"] and e["quack_gbps"]]
    if not judged:
        return Finding(0)
    errors = [f"{_shape(e)} error" for e in judged if not e["vs_quack"]]
    g_plain, g_all = d["geomean_vs_quack"], d["geomean_vs_quack_all"]
    figure = f"{g_plain:.3f}x over {len(judged) - len(errors)} shapes" if g_plain else ""
    if g_all:
        figure += f" ({g_all:.3f}x with graph rows)"
    ok = g_plain is not None and g_plain >= t.geomean_min
    return Finding(len(judged), errors, figure, ok)


def _pct_of_copy(cases: Cases, t: Thresholds, w: str | None) -> Finding:
    """The plain rows' GB/s as % of the copy, by bands of N."""
    bad, n = [], 0
    for e in cases.by_weight_dtype[w]["shapes"]:
        band = [p for lo, hi, p in t.copy_bands if lo <= e["N"] <= hi]
        if e["graph"] or not band:
            continue
        n += 1
        if not e["pct_copy"] or e["pct_copy"] < band[0]:
            got = f"{e['pct_copy']:.1f}%" if e["pct_copy"] else "error"
            bad.append(f"{_shape(e)} {got} < {band[0]:g}%")
    return Finding(n, bad)


def _fp32_weights(cases: Cases, t: Thresholds, w: str | None) -> Finding:
    """Ours with fp32 weights against ours with bf16 weights, where both ran (one-sided)."""
    ratios = cases.fp32_vs_bf16
    bad = [
        f"{_shape(e)} {e['ratio']:.3f}" if e["ratio"] else f"{_shape(e)} error"
        for e in ratios
        if not e["ratio"] or e["ratio"] < 1 - t.fp32_margin
    ]
    return Finding(len(ratios), bad)


def _residual_vs_quack(cases: Cases, t: Thresholds, w: str | None) -> Finding:
    """With a residual, ours / QuACK at the named row lengths (plain rows)."""
    judged = [
        e
        for es in cases.residual.values()
        for e in es
        if not e["graph"] and e["N"] in t.residual_ns and e["quack_gbps"]
    ]
    bad = [
        f"{_shape(e)} {e['vs_quack']:.3f}x" if e["vs_quack"] else f"{_shape(e)} error"
        for e in judged
        if not e["vs_quack"] or e["vs_quack"] < t.residual_min
    ]
    return Finding(len(judged), bad)


def _bands(t: Thresholds) -> str:
    return ", ".join(f"{p:g}% at N {lo}-{hi}" for lo, hi, p in t.copy_bands)


def _ns(t: Thresholds) -> str:
    return ",".join(f"{n // 1024}K" for n in t.residual_ns)


#: the acceptance criteria, in the verdict's order: per weight dtype the first three, then
#: the others
CRITERIA = (
    Criterion(
        lambda t: f"every shape >= best peer - {100 * t.peer_margin:g}%",
        _vs_best_peer,
        per_weight_dtype=True,
    ),
    Criterion(
        lambda t: f"geomean vs QuACK >= {t.geomean_min:g}x (plain)",
        _geomean_vs_quack,
        per_weight_dtype=True,
    ),
    Criterion(
        lambda t: f"% of copy ({_bands(t)})",
        _pct_of_copy,
        per_weight_dtype=True,
    ),
    Criterion(
        lambda t: f"fp32 weights within {100 * t.fp32_margin:g}% of bf16 weights",
        _fp32_weights,
        judged=lambda t: t.fp32_margin is not None,
    ),
    Criterion(
        lambda t: f"residual >= {t.residual_min:g}x QuACK at N={_ns(t)}",
        _residual_vs_quack,
        judged=lambda t: bool(t.residual_ns),
    ),
)


def _criterion(name: str, f: Finding) -> dict:
    """A criterion's line: N/A when nothing could be judged, FAIL with what failed."""
    if f.judged == 0:
        return {"name": name, "status": "N/A", "detail": "no rows to judge"}
    if f.figure is None:
        detail = f"{f.judged - len(f.failing)}/{f.judged} ok"
        detail += ("; failing: " + ", ".join(f.failing)) if f.failing else ""
    else:
        detail = f.figure + ("; " + ", ".join(f.failing) if f.failing else "")
    return {"name": name, "status": "FAIL" if f.failing or not f.ok else "PASS", "detail": detail}


def verdict(rows, ours: str = "lib", quack: str = "quack", peers=PEERS, **bars) -> dict:
    """Judge ``ours`` on the rows of one or several runs (GB/s ratios per case, ``judge_cases``)
    by every criterion of ``CRITERIA``, with the bars given by keyword (``Thresholds``' fields,
    its defaults for the others). An error row of ours fails the shape; a criterion with no rows
    to judge is N/A, and makes the overall verdict INCOMPLETE where nothing fails."""
    t = Thresholds(**bars)
    cases = judge_cases(rows, ours, quack, peers)
    checks = []
    for w in cases.by_weight_dtype:
        for c in CRITERIA:
            if c.per_weight_dtype and c.judged(t):
                checks.append(_criterion(f"[w {w}] {c.title(t)}", c.check(cases, t, w)))
    for c in CRITERIA:
        if not c.per_weight_dtype and c.judged(t):
            checks.append(_criterion(c.title(t), c.check(cases, t, None)))
    statuses = {c["status"] for c in checks}
    overall = "FAIL" if "FAIL" in statuses else "INCOMPLETE" if "N/A" in statuses else "PASS"
    thresholds = asdict(t)
    thresholds.update(copy_bands=[list(b) for b in t.copy_bands], residual_ns=list(t.residual_ns))
    return {
        "ours": ours,
        "quack": quack,
        "thresholds": thresholds,
        "by_weight_dtype": cases.by_weight_dtype,
        "fp32_vs_bf16": cases.fp32_vs_bf16,
        "residual": cases.residual,
        "checks": checks,
        "overall": overall,
    }


def format_verdict(v: dict) -> str:
    """The verdict as text: a line per shape, then PASS/FAIL/N/A per criterion."""
    ours = v["ours"]

    def ratio(x):
        return f"{x:6.3f}" if x else f"{'-':>6}"

    def lines(es):
        out = [
            f"  {'M x N':^14} {'mode':5} {ours + ' GB/s':>10} {'%copy':>6} {'/quack':>6}"
            f" {'/best peer':>10} {'(who)':<14} {'fp32/bf16 w':>11}"
        ]
        for e in es:
            got = f"{e['gbps']:10.0f}" if e["gbps"] else f"{'error':>10}"
            pct = f"{e['pct_copy']:6.1f}" if e.get("pct_copy") else f"{'-':>6}"
            out.append(
                f"  {e['M']:>6}x{e['N']:<7} {'graph' if e['graph'] else 'plain':5} {got} {pct}"
                f" {ratio(e['vs_quack'])} {ratio(e['vs_best_peer']):>10}"
                f" {e['best_peer'] or '-':<14} {ratio(e.get('fp32_vs_bf16')):>11}"
            )
        return out

    out = [f"Verdict for {ours} (GB/s ratios; the latest row of each case)"]
    for w, d in v["by_weight_dtype"].items():
        out.append(f"weights {w}:")
        out += lines(d["shapes"])
        gp, ga = d["geomean_vs_quack"], d["geomean_vs_quack_all"]
        out.append(
            f"  geomean vs QuACK: {ratio(gp).strip()} plain, {ratio(ga).strip()} with graph rows"
        )
    for w, es in v["residual"].items():
        out.append(f"with a residual, weights {w}:")
        out += lines(es)
    for c in v["checks"]:
        out.append(f"{c['status']:<4}  {c['name']}: {c['detail']}")
    out.append(f"overall: {v['overall']}")
    return "\n".join(out)
