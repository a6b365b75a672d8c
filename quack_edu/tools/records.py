"""The benchmark's records and how they read: rows, passes, tables of GB/s and host costs.

A run's record (``bench.run``, saved as JSON under benchmarks/results/) holds the machine
(``gpu``, ``date``, versions, ``clocks``), the copy ceiling (``copy_gbps``), its options, and
``rows``: one per kernel, shape, weight dtype and timing mode, with ``us``, ``gbps`` and
``pct_copy``, or ``error``. A record of both passes (``--pass both``) holds one such result a
pass under ``fwd`` and ``bwd``. Nothing here needs a GPU.
"""

from __future__ import annotations

from ..dtypes import DTYPE_NAMES

#: torch dtype -> its short name (``dtypes.DTYPE_NAMES`` read the other way)
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPE_NAMES.items()}


def dtype_name(dtype) -> str:
    """A dtype's short name in a record: bf16, fp16, fp32 (else torch's name)."""
    return _DTYPE_NAMES.get(dtype, str(dtype))


def row_weight_dtype(r: dict) -> str:
    """A row's weight dtype; x's in rows recorded before weight dtypes were an option."""
    return r.get("weight_dtype") or r["dtype"]


def passes(result: dict) -> list[dict]:
    """A record's single-pass results: itself, or a ``--pass both`` record's two."""
    return (
        [result[p] for p in ("fwd", "bwd") if p in result]
        if result.get("pass") == "both"
        else [result]
    )


def pass_name(part: dict) -> str:
    """'forward' or 'backward': the pass of a single-pass result."""
    return "backward" if part.get("pass") == "bwd" else "forward"


def format_row(r: dict) -> str:
    """A row as the run logs it: kernel, shape, dtypes, mode, then its time or its error."""
    mode = "graph" if r["graph"] else "plain"
    res = " +res" if r.get("residual") else ""
    wdt = row_weight_dtype(r)
    head = f"{r['kernel']:<16} {r['M']:>6}x{r['N']:<7} {r['dtype']} w {wdt}{res} {mode}"
    if "error" in r:
        return f"{head}  error: {r['error'][:80]}"
    first = f"  (first call {r['first_call_s']:.2f} s)" if r.get("first_call_s", 0) > 1 else ""
    return (
        f"{head} {r['us']:9.1f} us {r['gbps']:7.0f} GB/s {r.get('pct_copy', 0):5.1f}% of copy"
        + first
    )


def table(result: dict) -> str:
    """A compact table: one line per shape (and weight dtype), one column per kernel (GB/s)."""
    rows = [r for r in result["rows"] if "gbps" in r]
    kernels = list(dict.fromkeys(r["kernel"] for r in result["rows"]))

    def key(r):
        return (r["M"], r["N"], row_weight_dtype(r), bool(r.get("residual")), r["graph"])

    cases = list(dict.fromkeys(key(r) for r in result["rows"]))
    width = max([13, *(len(k) + 1 for k in kernels)])
    head = f"{'M x N':>14} {'w':4} {'mode':9} " + " ".join(f"{k:>{width}}" for k in kernels)
    out = [
        f"{result['gpu']}  {result['date']}  copy {result['copy_gbps']:.0f} GB/s  (GB/s below;"
        " w: weight dtype; +res: with a residual)",
        head,
    ]
    for case in cases:
        M, N, w, res, g = case
        cells = []
        for k in kernels:
            hit = [r for r in rows if key(r) == case and r["kernel"] == k]
            cells.append(f"{hit[0]['gbps']:{width}.0f}" if hit else f"{'-':>{width}}")
        mode = ("graph" if g else "plain") + ("+res" if res else "")
        out.append(f"{M:>6}x{N:<7} {w:4} {mode:9} " + " ".join(cells))
    return "\n".join(out)


def first_call_words(r: dict) -> str:
    """A first-call row (``timing.measure_compile``) in words: the first and second call, and
    the first call in fresh processes where they ran."""
    if "error" in r:
        return r["error"][:80]
    words = f"first call {r['compile_s']:.2f} s, second {1e3 * r['second_call_s']:.2f} ms"
    if "fresh_s" in r:
        each = "/".join(f"{v:.2f}" for v in r["fresh_s"])
        words += f"; in fresh processes {each} s (median {r['fresh_median_s']:.2f})"
    return words


def host_table(result: dict) -> str:
    """The host costs of a run (``--overhead``): µs per tiny call, first-call seconds, µs per
    eager training call against nn.RMSNorm."""
    out = []
    for r in result.get("compile", []):
        what = first_call_words(r)
        out.append(f"compile  {r['kernel']:<14} {r['M']}x{r['N']} w {r['weight_dtype']}: {what}")
    for r in result.get("overhead", []):
        what = f"{r['us_per_call']:.1f} us/call" if "error" not in r else r["error"][:80]
        out.append(
            f"overhead {r['kernel']:<14} {r['M']}x{r['N']} w {r['weight_dtype']}: {what}"
            + (
                f" (median of {len(r['us_rounds'])} rounds, {r['calls']} calls in all)"
                if r.get("us_rounds")
                else f" ({r['calls']} calls, one sync)"
            )
        )
    for r in result.get("training_calls", []):
        n = len(r["us_rounds"]["nn.RMSNorm"])
        out.append(
            f"training call {r['case']:<20} {r.get('dout', 'dense'):<5} gradient: QuackRMSNorm "
            f"{r['QuackRMSNorm']:.1f} us, nn.RMSNorm "
            f"{r['nn.RMSNorm']:.1f} us: {r['ratio']:.2f}x (median of {n} rounds)"
        )
    return "\n".join(out)
