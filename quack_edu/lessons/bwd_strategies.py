"""Lesson 07's helpers: the gradient by autograd in float64, the bytes of a backward, and three
ways of summing dw over the rows, measured side by side.

dw = sum over rows of dout * x_hat is a *column* reduction: N sums, each over all M rows, while
the rows are spread over every CTA of the grid. Three ways to finish it (the names are those of
the recorded file):

* ``atomic``: every CTA adds its columns' sums into one fp32 row with ``red.global.add``
  (``final_bwd.FinalBwdAtomic``); that row is dw. One row of partial bytes, no second
  reduction, but the adds land in a different order on every run: not bitwise deterministic.
* ``row_blocks``: one fp32 partial row per row block (the grid is the number of row blocks,
  each CTA does one), then a second reduction (``torch.sum`` over the P rows). Deterministic,
  but P x N x 4 bytes are written and read again, P = M / rows per CTA: up to M rows.
* ``persistent``: one partial row per *resident* CTA (the persistent grid ``grid_x``: a few
  hundred), each CTA walking many row blocks with its sums in registers, then the same second
  reduction. Deterministic, and P x N x 4 is ~1% of the traffic: the library's choice.

``measure()`` on an sm_90 GPU times all three (kernel + its reduction, GB/s over QuACK's byte
count for a backward), checks determinism over 3 runs on the same inputs and the error of dw
against a float64 sum, and returns the record that ``benchmarks/results/bwd_dw_strategies.json``
holds. One command writes it::

    python -m quack_edu.lessons.bwd_strategies --json benchmarks/results/bwd_dw_strategies.json

Lesson 07 reads it (``results.load("bwd_dw_strategies")``) where there is no GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch

from ..tools.timing import rmsnorm_bwd_bytes

RESULT = "bwd_dw_strategies"
STRATEGIES = ("atomic", "row_blocks", "persistent")
LABELS = {
    "atomic": "(1) global atomics",
    "row_blocks": "(2) one partial per row block",
    "persistent": "(3) one partial per resident CTA",
}
#: the shapes recorded: bf16 x and weight, M = 32768 rows
RECORD_M = 32768
RECORD_NS = (1024, 4096, 16384)
EPS = 1e-6


# ---- the gradient, by autograd ------------------------------------------------------------------
def forward_ops(x, w=None, eps: float = EPS, weight_offset: float = 0.0):
    """RMSNorm in plain torch ops, differentiable: x * rsqrt(mean(x^2) + eps) * (w + offset)."""
    y = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)
    return y if w is None else y * (w + weight_offset)


def autograd_bwd(x, w, dout, eps: float = EPS, weight_offset: float = 0.0, dtype=torch.float64):
    """(dx, dw, rstd) of ``forward_ops`` by torch.autograd, everything in ``dtype`` (float64: the
    reference a hand-derived formula is checked against). dw is None without a weight."""
    xd = x.detach().to(dtype).requires_grad_(True)
    wd = None if w is None else w.detach().to(dtype).requires_grad_(True)
    out = forward_ops(xd, wd, eps, weight_offset)
    out.backward(dout.detach().to(dtype))
    with torch.no_grad():
        rstd = torch.rsqrt(xd.square().mean(dim=-1) + eps)
    return xd.grad, None if wd is None else wd.grad, rstd


def dw_float64(x, dout, rstd, chunk: int = 4096) -> torch.Tensor:
    """sum over rows of dout * x * rstd in float64, a few thousand rows at a time (no float64
    copy of a whole 32768 x 16384 tensor)."""
    out = torch.zeros(x.shape[-1], dtype=torch.float64, device=x.device)
    for i in range(0, x.shape[0], chunk):
        xs, ds = x[i : i + chunk].double(), dout[i : i + chunk].double()
        out += (ds * xs * rstd[i : i + chunk].double().unsqueeze(-1)).sum(dim=0)
    return out


# ---- the three strategies -----------------------------------------------------------------------
def partial_rows(
    strategy: str,
    M: int,
    N: int,
    dtype=torch.bfloat16,
    weight_dtype=None,
    sm_count: int | None = None,
    device: int | None = None,
) -> int:
    """Rows of fp32 partial sums the strategy writes (and its second reduction reads back):
    1 for the atomics (their adds go to L2, not to HBM rows), the row blocks for
    ``row_blocks``, the persistent grid for ``persistent`` (on GPU ``device`` when given:
    the clusters it holds at once; else estimated from ``sm_count``, the H200's by
    default)."""
    from ..stages import final_bwd

    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if strategy == "atomic":
        return 1
    k = final_bwd.FinalBwdRMSNorm(dtype, N, None, weight_dtype)
    if strategy == "row_blocks":
        return -(-M // k.tiling.rows_per_cta)
    if device is not None:
        return k.grid_on(M, device)
    return k.grid_x(M, sm_count or final_bwd.SM_COUNT)


def partial_bytes(
    strategy: str,
    M: int,
    N: int,
    dtype=torch.bfloat16,
    weight_dtype=None,
    sm_count: int | None = None,
    device: int | None = None,
) -> int:
    """HBM bytes of partial sums beyond the backward's own: P x N x 4 written by the kernel and
    read by the second reduction (plus dw written, N x 4); the atomics: dw's row zeroed and
    its final value (their P x N x 4 bytes of adds are served by L2)."""
    P = partial_rows(strategy, M, N, dtype, weight_dtype, sm_count, device)
    if strategy == "atomic":
        return 2 * N * 4
    return 2 * P * N * 4 + N * 4


def run(strategy: str, x, w, dout, rstd, dx, weight_offset: float = 0.0):
    """dw in fp32 by ``strategy`` (dx written into ``dx``): the kernel, then its reduction."""
    from ..stages import final_bwd

    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    # the lesson's variants by name; "persistent" is the library's kernel
    kernel_cls = final_bwd.VARIANTS.get(strategy, final_bwd.FinalBwdRMSNorm)
    dw_p, _ = kernel_cls.launch(x, w, dout, None, rstd, dx, None, False, weight_offset)
    return dw_p[0] if strategy == "atomic" else dw_p.sum(dim=0)


def _inputs(M, N, dtype, weight_dtype, device="cuda", gen=None):
    x = torch.randn(M, N, device=device, dtype=dtype, generator=gen)
    w = (1.0 + 0.1 * torch.randn(N, device=device, generator=gen)).to(weight_dtype)
    dout = torch.randn(M, N, device=device, dtype=dtype, generator=gen)
    rstd = torch.rsqrt(x.float().square().mean(-1) + EPS)
    return x, w, dout, rstd, torch.empty_like(x)


def measure_one(
    strategy: str,
    M: int,
    N: int,
    dtype=torch.bfloat16,
    weight_dtype=None,
    runs: int = 3,
    budget_s: float = 0.5,
    copy_gbps: float | None = None,
    log=print,
) -> dict:
    """One row of the record: GB/s of the kernel + its dw reduction (QuACK's byte count for a
    backward: read x, dout, the weight and rstd, write dx), whether ``runs`` runs on the same
    inputs give bitwise the same dw, and dw's error against a float64 sum."""
    from ..reference import assert_close, rmsnorm_bwd_ref
    from ..stages import final_bwd
    from ..tools import timing
    from ..tools.records import dtype_name

    wdt = weight_dtype or dtype
    nbytes = rmsnorm_bwd_bytes(M, N, dtype, wdt)
    gen = torch.Generator(device="cuda").manual_seed(M * 7 + N)
    sets = [_inputs(M, N, dtype, wdt, gen=gen) for _ in range(timing.rotation_count(nbytes))]
    x, w, dout, rstd, dx = sets[0]
    grid = partial_rows(strategy, M, N, dtype, wdt) if strategy == "row_blocks" else None

    def call(*args):
        return run(strategy, *args)

    dws = []
    for _ in range(runs):
        dws.append(call(x, w, dout, rstd, dx).clone())
    torch.cuda.synchronize()
    ref_dx = rmsnorm_bwd_ref(x, w, dout, rstd)[0]
    assert_close(dx, ref_dx, dtype, what=f"dx ({strategy})")  # never time a wrong kernel
    del ref_dx
    ref = dw_float64(x, dout, rstd)
    err = (dws[0].double() - ref).abs().max().item()
    distinct = len({d.cpu().numpy().tobytes() for d in dws})
    us = timing.time_calls(call, sets, budget_s=budget_s)
    gbps = timing.gbps(nbytes, us)
    k = final_bwd.FinalBwdRMSNorm(dtype, N, None, wdt)
    dev = x.get_device()
    row = {
        "strategy": strategy,
        "M": M,
        "N": N,
        "dtype": dtype_name(dtype),
        "weight_dtype": dtype_name(wdt),
        "config": str(k.config),
        "grid": grid or partial_rows("persistent", M, N, dtype, wdt, device=dev),
        "P": partial_rows(strategy, M, N, dtype, wdt, device=dev),
        "partial_bytes": partial_bytes(strategy, M, N, dtype, wdt, device=dev),
        "bytes": nbytes,
        "us": us,
        "gbps": gbps,
        "pct_copy": 100 * gbps / copy_gbps if copy_gbps else None,
        "runs": runs,
        "distinct_dw": distinct,
        "deterministic": distinct == 1,
        "max_abs_err": err,
        "max_abs_ref": ref.abs().max().item(),
    }
    log(
        f"{strategy:11s} {M}x{N:<6} P={row['P']:<6} {us:8.1f} us {gbps:7.0f} GB/s  "
        f"deterministic={'yes' if distinct == 1 else 'no'} ({distinct} distinct of {runs})  "
        f"max|dw - fp64| {err:.3g}"
    )
    return row


def measure(
    Ns=RECORD_NS,
    M: int = RECORD_M,
    dtype=torch.bfloat16,
    weight_dtype=None,
    runs: int = 3,
    budget_s: float = 0.5,
    command: str | None = None,
    log=print,
) -> dict:
    """Every strategy at every N (on an sm_90 GPU), with the copy bandwidth of the same run:
    the record of ``benchmarks/results/bwd_dw_strategies.json``."""
    from ..tools.runinfo import version
    from ..tools.timing import copy_bandwidth

    if not torch.cuda.is_available():
        raise RuntimeError("measuring the strategies needs a CUDA GPU (sm_90)")
    copy = copy_bandwidth()
    log(f"{torch.cuda.get_device_name()}: D2D copy {copy:.0f} GB/s")
    rows = [
        measure_one(s, M, N, dtype, weight_dtype, runs, budget_s, copy, log)
        for N in Ns
        for s in STRATEGIES
    ]
    return {
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "dsl": version("nvidia-cutlass-dsl"),
        "copy_gbps": copy,
        "command": command,
        "what": "dw summed over rows three ways: GB/s of kernel + its reduction over QuACK's "
        "backward byte count; deterministic: the same dw bits in every run of the same inputs; "
        "max_abs_err: max over columns of |dw (fp32) - a float64 sum|",
        "rows": rows,
    }


# ---- reading the record -------------------------------------------------------------------------
NOT_RECORDED = (
    "not recorded yet: benchmarks/results/bwd_dw_strategies.json does not exist (it is "
    "recorded on an H200 with `python -m quack_edu.lessons.bwd_strategies --json ...`); no numbers "
    "are shown rather than invented ones"
)


def table(record: dict | None) -> str:
    """The record as the lesson prints it, or the sentence saying it is not recorded yet."""
    if record is None:
        return NOT_RECORDED
    lines = [
        f"{record['gpu']}, {record['date']}, copy {record['copy_gbps']:.0f} GB/s in the same run",
        f"  {'strategy':34s} {'M x N':>12} {'P':>6} {'partial MiB':>11} {'GB/s':>6} "
        f"{'% copy':>6} {'deterministic':>13} {'max|dw - fp64|':>14} {'(of max|dw|)':>12}",
    ]
    for r in record["rows"]:
        pct = r.get("pct_copy")
        lines.append(
            f"  {LABELS.get(r['strategy'], r['strategy']):34s} {r['M']:>6}x{r['N']:<5} "
            f"{r['P']:>6} {r['partial_bytes'] / 2**20:>11.1f} {r['gbps']:>6.0f} "
            f"{'-' if pct is None else f'{pct:.1f}':>6} "
            f"{'yes' if r['deterministic'] else 'no':>13} {r['max_abs_err']:>14.3g} "
            f"{r['max_abs_ref']:>12.3g}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m quack_edu.lessons.bwd_strategies",
        description="Time the three ways of summing dw (lesson 07) on an sm_90 GPU.",
    )
    p.add_argument(
        "--json", help="write the record here (e.g. benchmarks/results/bwd_dw_strategies.json)"
    )
    p.add_argument(
        "--N", default=",".join(map(str, RECORD_NS)), help="row lengths, comma-separated"
    )
    p.add_argument("--M", type=int, default=RECORD_M)
    p.add_argument("--runs", type=int, default=3, help="runs on the same inputs (determinism)")
    args = p.parse_args(argv)
    command = "python -m quack_edu.lessons.bwd_strategies " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    rec = measure(
        tuple(int(n) for n in args.N.split(",")), args.M, runs=args.runs, command=command.strip()
    )
    print(table(rec))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rec, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "LABELS",
    "NOT_RECORDED",
    "RESULT",
    "STRATEGIES",
    "autograd_bwd",
    "dw_float64",
    "forward_ops",
    "measure",
    "measure_one",
    "partial_bytes",
    "partial_rows",
    "run",
    "table",
]
