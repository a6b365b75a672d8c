"""Benchmarks: GB/s from an explicit byte count, side by side with peers and the copy ceiling.

``quack-edu bench`` times kernels (``kernels``: the stages, the library ``lib`` / ``lib-tuned``
and the peers QuACK, torch.compile, Liger, PyTorch) at every shape and weight dtype, in rounds,
against a device-to-device copy measured in the same run (``timing``: the method). Its record
(``records``: rows, tables) ends with a verdict on our kernel (``--ours``) against QuACK, the
best peer and the copy (``criteria``: the acceptance criteria); ``--png`` draws it (``plots``).

``--pass both`` times the whole ladder in one record: the forward (its stages naive ... final,
the library, the peers), then the backward (final_bwd, the library, the peers), against one copy
measured first; its plots add the ladder at one shape and the speed-up over PyTorch.

Usage: ``quack-edu bench --stages lib,lib-tuned --peers quack,liger --weight-dtype
bf16,fp32 --graph --graph-max-n 2048 --json F``; ``--summarize F [G ...]`` prints the tables and
the verdict of recorded runs (no GPU needed).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from ..dtypes import torch_dtype
from ..stages import BACKWARD_STAGES, STAGE_ORDER
from .criteria import format_verdict, thresholds_for, verdict
from .kernels import (
    PEER_PACKAGES,
    PEERS,
    config_of,
    kernel_kind,
    library_fn,
    peer_fns,
    resolve_config,
    resolve_kernels,
    split_name,
    stage_fn,
)
from .plots import ladder_order, ladder_shape, plot, plot_all, plot_ladder, plot_speedup, speedups
from .records import dtype_name, format_row, host_table, pass_name, passes, table
from .runinfo import gpu_clocks, version, why
from .timing import (
    EPS,
    PLAIN_BATCH_S,
    bench_one,
    copy_bandwidth,
    cuda_time_us,
    first_call_child,
    gbps,
    measure_compile,
    measure_overhead,
    per_call_us,
    rmsnorm_bwd_bytes,
    rmsnorm_bytes,
    rotation_count,
    time_calls,
    time_graph,
)

__all__ = [
    # the run (this module)
    "DEFAULT_SHAPES", "HOST_TIMED", "LAUNCH_BOUND_ROUNDS", "RESIDUAL_SHAPES", "RunOptions",
    "main", "merge_rounds", "parse_shapes", "parse_weight_dtypes", "run", "run_both",
    "split_stages", "summarize",
    # timing
    "EPS", "PLAIN_BATCH_S", "bench_one", "copy_bandwidth", "cuda_time_us", "gbps",
    "measure_compile", "measure_overhead", "per_call_us", "rmsnorm_bwd_bytes", "rmsnorm_bytes",
    "rotation_count", "time_calls", "time_graph",
    # kernels
    "PEERS", "config_of", "kernel_kind", "library_fn", "peer_fns", "resolve_config",
    "resolve_kernels", "split_name", "stage_fn",
    # records, criteria, plots
    "dtype_name", "host_table", "pass_name", "passes", "table",
    "format_verdict", "thresholds_for", "verdict",
    "ladder_order", "ladder_shape", "plot", "plot_all", "plot_ladder", "plot_speedup", "speedups",
]  # fmt: skip

DEFAULT_SHAPES = [
    (32768, 256),
    (32768, 512),
    (32768, 1024),
    (32768, 2048),
    (32768, 4096),
    (32768, 8192),
    (32768, 16384),
    (32768, 32768),
    (32768, 65536),
    (16384, 131072),
    (8192, 262144),
]
#: the pre-norm residual benchmark's shapes (``--residual`` without ``--shapes``)
RESIDUAL_SHAPES = [(32768, 4096), (32768, 16384), (32768, 65536)]
#: the kernels whose host cost ``--overhead`` measures (and ``--ours``). Not ``lib-tuned``
#: unless it is ours: its tuning key has no M, and a tiny M must not choose its config.
HOST_TIMED = ("lib", "quack", "torch-eager")
#: rounds of a launch-bound shape per round asked for (``run``): the same calls in all, in
#: shorter turns, so that a slow moment of the host lands on every kernel's median alike
LAUNCH_BOUND_ROUNDS = 2


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What a run times and how (``run``, ``run_both``; the command line's flags)."""

    #: x's dtype
    dtype: torch.dtype = torch.bfloat16
    #: also time the peers: True or "all" (those installed), or a comma list
    peers: bool | str | None = False
    #: also time through CUDA graphs, for N up to ``graph_max_n`` (the launch-bound shapes)
    graph: bool = False
    graph_max_n: int | None = None
    #: {kernel: the largest N worth timing}
    max_n: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: the weight's dtypes, each timed (None: x's dtype)
    weight_dtypes: Sequence | None = None
    #: the pre-norm benchmark: x + residual, both outputs; the backward reads a dresidual_out
    #: and adds it to dx (QuACK's the only peer)
    residual: bool = False
    #: also the host cost per tiny call and the first-call time of ``ours`` (before the sweep)
    overhead: bool = False
    #: the kernel the verdict judges
    ours: str = "lib"
    #: seconds of timed calls a row, at most, in each round
    budget_s: float = 0.5
    #: the row lengths of the first-call timing (``overhead``)
    compile_ns: Sequence[int] = (3000, 5000)
    #: "fwd" or "bwd" (the library's ``rmsnorm_bwd``, QuACK's, autograd of torch.compile /
    #: F.rms_norm / PyTorch ops); "both" for ``run_both``
    pass_: str = "fwd"
    #: at each shape every kernel with every weight dtype is timed once a round, in turn, and a
    #: row is the median of its rounds (``merge_rounds``; why: docs/bench_notes.md)
    rounds: int = 1
    #: a progress bar of the timings on stderr
    progress: bool = False

    @property
    def timed_weight_dtypes(self) -> list:
        """The weight dtypes each shape is timed with, in order (None: x's dtype)."""
        return list(self.weight_dtypes or [None])


class _Plan(NamedTuple):
    """How a shape is timed: its rounds, the budget of a row in each, the timing modes."""

    rounds: int
    budget_s: float
    modes: list


def _plan(o: RunOptions, N: int) -> _Plan:
    """A shape timed through graphs too (``graph_max_n``) is launch-bound: its plain rows time
    the host, so it gets ``LAUNCH_BOUND_ROUNDS`` times the rounds, each with that fraction of
    the budget (its inputs are small: a round is cheap)."""
    small = o.graph_max_n is None or N <= o.graph_max_n
    if o.graph and o.graph_max_n is not None and small:
        k = LAUNCH_BOUND_ROUNDS
        return _Plan(k * o.rounds, o.budget_s / k, [False, True])
    return _Plan(o.rounds, o.budget_s, [False, True] if o.graph and small else [False])


def _new_record(o: RunOptions, copy: float, clocks: dict, meta: dict | None) -> dict:
    """A run's record before its rows: the machine, the copy, the options that shape it."""
    weight_dtypes = o.timed_weight_dtypes
    return {
        "gpu": torch.cuda.get_device_name(0),
        "date": _dt.date.today().isoformat(),
        "torch": torch.__version__,
        "dsl": version("nvidia-cutlass-dsl"),
        "clocks": clocks,
        "copy_gbps": copy,
        "dtype": dtype_name(o.dtype),
        "weight_dtypes": [dtype_name(w or o.dtype) for w in weight_dtypes],
        "residual": o.residual,
        "pass": o.pass_,
        "rounds": o.rounds,
        "rounds_launch_bound": (
            LAUNCH_BOUND_ROUNDS * o.rounds if o.graph and o.graph_max_n else o.rounds
        ),
        "plain_batch_s": PLAIN_BATCH_S,
        **(meta or {}),
        "rows": [],
    }


def _resolve(stages, o: RunOptions, result: dict, log) -> dict:
    """The kernels a run times (``stages`` and the peers asked for); what it skips, and why,
    and the peers' versions go into the record."""
    names = list(stages)
    if o.peers:
        wanted = list(PEERS) if o.peers in (True, "all") else o.peers.split(",")
        names += [p for p in wanted if p not in names]
    fns, skipped = resolve_kernels(names, o.residual, o.pass_)
    if o.peers in (True, "all"):  # "all" = the peers that are installed: no noise about the rest
        skipped = {k: v for k, v in skipped.items() if kernel_kind(k) != "peer"}
    for name, reason in skipped.items():
        log(f"skipped {name}: {reason}")
    result["skipped"] = skipped
    result["peers"] = {k: version(PEER_PACKAGES[k]) for k in fns if k in PEER_PACKAGES}
    return fns


def _host_costs(o: RunOptions, result: dict, log) -> None:
    """``--overhead``: the first calls (at ``compile_ns``), the host cost per tiny call of
    ``ours`` and ``HOST_TIMED``, and (the forward pass's run) per eager training call of
    ``QuackRMSNorm`` against ``nn.RMSNorm`` (``host_cost.training_call_rows``), into the
    record. Before the sweep: the first call at ``compile_ns`` is then the library's first
    call."""
    weight_dtypes = o.timed_weight_dtypes
    host, _ = resolve_kernels(list(dict.fromkeys([o.ours, *HOST_TIMED])), pass_=o.pass_)
    t = time.perf_counter()
    first = {k: v for k, v in host.items() if k in (o.ours, "lib", "quack")}
    result["compile"] = measure_compile(
        first, o.compile_ns, o.dtype, weight_dtypes[0], log=log, pass_=o.pass_
    )
    result["overhead"] = measure_overhead(host, weight_dtypes, o.dtype, log=log, pass_=o.pass_)
    if o.pass_ == "fwd":  # a training call is forward and backward: once a run
        from .host_cost import training_call_rows

        result["training_calls"] = training_call_rows(log=log)
    log(f"host costs measured in {time.perf_counter() - t:.0f} s")


def _time_shape(fns: dict, M: int, N: int, o: RunOptions, plan: _Plan, bar) -> dict:
    """(weight dtype, kernel, graph) -> its row of every round at one shape. A round times
    every kernel in turn, a kernel's weight dtypes next to each other (bf16 then fp32 weight,
    plain then graph): the pair the fp32-against-bf16 criterion compares is timed over the same
    few seconds of the GPU."""
    tries: dict = {}
    weight_dtypes = o.timed_weight_dtypes
    for _ in range(plan.rounds):
        for name, fn in fns.items():
            for g in plan.modes:
                for wdt in weight_dtypes:
                    row = _try_one(fn, M, N, g, wdt, o, plan.budget_s)
                    tries.setdefault((wdt, name, g), []).append(row)
                    bar.update()
            torch.cuda.empty_cache()
    return tries


def run(
    stages, shapes, options: RunOptions | None = None, *, log=print, on_row=None, meta=None,
    copy_gbps=None,
) -> dict:  # fmt: skip
    """Time every kernel of ``stages`` (stages, ``lib``, ``lib-tuned``, also peers) at every
    shape and weight dtype, as ``options`` say (``RunOptions``): a row per kernel, shape,
    weight dtype and timing mode, the median of its rounds. ``on_row(result)`` is called after
    every shape (to save partial results); ``meta``: fields for the record (the command line);
    ``copy_gbps``: the copy ceiling measured earlier in this process (``run_both``), else
    measured first. The GPU's clocks are recorded before and after (``gpu_clocks``); the
    record ends with the verdict on ``options.ours``."""
    o = options or RunOptions()
    if o.rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {o.rounds}")
    if o.pass_ not in ("fwd", "bwd"):
        raise ValueError(f"pass_ must be 'fwd' or 'bwd', got {o.pass_!r}")
    t_run = time.perf_counter()
    weight_dtypes = o.timed_weight_dtypes
    clocks = {"start": gpu_clocks()}
    copy = copy_bandwidth() if copy_gbps is None else copy_gbps
    log(f"D2D copy: {copy:.0f} GB/s" + ("" if copy_gbps is None else " (measured before)"))
    result = _new_record(o, copy, clocks, meta)
    rows = result["rows"]
    fns = _resolve(stages, o, result, log)
    if o.overhead:
        _host_costs(o, result, log)
        if on_row:
            on_row(result)

    def timed(N):  # the kernels timed at N
        return {name: fn for name, fn in fns.items() if N <= o.max_n.get(name, N)}

    plans = {N: _plan(o, N) for _, N in shapes}
    total = sum(
        plans[N].rounds * len(plans[N].modes) * len(timed(N)) * len(weight_dtypes)
        for _, N in shapes
    )
    from ..autotune import Progress

    bar = Progress(total, f"bench {o.pass_}", o.progress, unit="timings")
    for M, N in shapes:
        tries = _time_shape(timed(N), M, N, o, plans[N], bar)
        by_weight = sorted(tries.items(), key=lambda kv: weight_dtypes.index(kv[0][0]))
        for (wdt, name, _g), rounds_rows in by_weight:  # a weight dtype's rows together
            row = merge_rounds(rounds_rows)
            row["kernel"] = name
            row["config"] = config_of(name, N, o.dtype, wdt)
            if "gbps" in row:
                row["pct_copy"] = 100 * row["gbps"] / copy
            rows.append(row)
            log(format_row(row))
        if on_row:
            on_row(result)
    bar.close()
    clocks["end"] = gpu_clocks()
    result["elapsed_s"] = time.perf_counter() - t_run
    result["verdict"] = verdict(rows, ours=o.ours, **thresholds_for(o.pass_))
    log(f"run took {result['elapsed_s']:.0f} s")
    return result


def split_stages(kernels) -> dict[str, list[str]]:
    """The kernels of ``--pass both`` by pass: the forward gets the forward stages, the
    library and the peers; the backward the backward stages (``BACKWARD_STAGES``), the library
    and the peers. Each pass times ``lib``, named or not: the ladder ends with it."""
    fwd = [k for k in kernels if split_name(k)[0] not in BACKWARD_STAGES]
    bwd = [k for k in kernels if kernel_kind(k) != "stage" or split_name(k)[0] in BACKWARD_STAGES]
    return {p: ks + ["lib"] * ("lib" not in ks) for p, ks in (("fwd", fwd), ("bwd", bwd))}


def run_both(
    stages, shapes, options: RunOptions | None = None, *, log=print, on_row=None, meta=None
) -> dict:
    """The forward and the backward in one record (``--pass both``): ``{"pass": "both",
    "gpu", "date", ..., "copy_gbps", "fwd": <run's result>, "bwd": <run's result>}``, the copy
    measured once, first, for both. ``stages``: kernels of either pass (``split_stages``);
    ``options``: ``run``'s (their ``pass_`` aside). ``on_row(record)`` after every shape of
    either pass."""
    o = options or RunOptions()
    kernels = split_stages(stages)
    copy = copy_bandwidth()
    record: dict = {"pass": "both", **(meta or {})}

    def saving(pass_):
        def on(result):
            record[pass_] = result
            if on_row:
                on_row(record)

        return on

    for pass_ in ("fwd", "bwd"):
        log(f"--- {'forward' if pass_ == 'fwd' else 'backward'}: {', '.join(kernels[pass_])}")
        record[pass_] = run(kernels[pass_], shapes, dataclasses.replace(o, pass_=pass_), log=log,
                            on_row=saving(pass_), meta=meta, copy_gbps=copy)  # fmt: skip
    fwd, bwd = record["fwd"], record["bwd"]
    for key in ("gpu", "date", "torch", "dsl", "copy_gbps", "dtype", "weight_dtypes", "rounds"):
        record[key] = fwd[key]
    record["peers"] = {**fwd["peers"], **bwd["peers"]}
    record["clocks"] = {"start": fwd["clocks"]["start"], "end": bwd["clocks"]["end"]}
    record["elapsed_s"] = fwd["elapsed_s"] + bwd["elapsed_s"]
    # the keys first, the passes last (the file reads top down)
    return {k: record[k] for k in sorted(record, key=lambda k: k in ("fwd", "bwd"))}


def _try_one(fn, M, N, graph, wdt, o: RunOptions, budget_s) -> dict:
    """``bench_one``, or the row of a kernel that doesn't support the case: why."""
    try:
        return bench_one(
            fn, M, N, o.dtype, graph, wdt, residual=o.residual, budget_s=budget_s, pass_=o.pass_
        )
    except Exception as e:
        return {
            "M": M,
            "N": N,
            "dtype": dtype_name(o.dtype),
            "weight_dtype": dtype_name(wdt or o.dtype),
            "residual": o.residual,
            "pass": o.pass_,
            "error": why(e, 300),
            "graph": graph,
        }


def merge_rounds(tries: list[dict]) -> dict:
    """One row from a kernel's rows of every round at one shape: the median time and the GB/s
    of it, each round's time kept (``us_rounds``), the first round's first call (the compile).
    A round that failed makes the row its error."""
    for t in tries:
        if "error" in t:
            return dict(t)
    row = dict(tries[0])
    if len(tries) > 1:
        row["us_rounds"] = [t["us"] for t in tries]
        row["us"] = statistics.median(row["us_rounds"])
        row["gbps"] = gbps(row["bytes"], row["us"])
    return row


# --- the command line -----------------------------------------------------------------------


def parse_shapes(text: str):
    """``32768x4096,8192x262144`` -> [(32768, 4096), (8192, 262144)]."""
    return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s]


def parse_weight_dtypes(text: str | None) -> list:
    """``bf16,fp32`` -> [torch.bfloat16, torch.float32]; ``same`` -> None (x's dtype)."""
    out = []
    for part in (text or "same").split(","):
        part = part.strip()
        if part:
            out.append(None if part == "same" else torch_dtype(part))
    return list(dict.fromkeys(out)) or [None]


def summarize(paths, ours: str = "lib", png: str | None = None, **thresholds) -> str:
    """The tables of recorded runs and a verdict per pass over all their rows (later files
    win); a record of both passes counts as its two. ``png``: the plots of the rows
    (``plot_all``: with both passes, the ladder and the speed-ups too)."""
    records = [json.loads(open(p).read()) for p in paths]
    out, by_pass = [], {}
    for p, res in zip(paths, records, strict=True):
        for part in passes(res):
            pass_ = part.get("pass", "fwd")
            out += [f"== {p}" + (f" ({pass_name(part)})" if res.get("pass") == "both" else ""),
                    table(part)]  # fmt: skip
            if part.get("compile") or part.get("overhead"):
                out.append(host_table(part))
            by_pass.setdefault(pass_, []).append(part)
    merged = {}
    for pass_, parts in by_pass.items():
        rows = [r for part in parts for r in part["rows"]]
        if len(by_pass) > 1:
            out.append(f"== verdict of the {pass_name(parts[0])}")
        out.append(
            format_verdict(verdict(rows, ours=ours, **{**thresholds_for(pass_), **thresholds}))
        )
        merged[pass_] = {**parts[0], "rows": rows}
    if png:
        both = len(merged) > 1
        plot_all(
            {**merged["fwd"], "pass": "both", **merged} if both else next(iter(merged.values())),
            png,
        )
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    """The command line's flags (``quack-edu bench -h``)."""
    p = argparse.ArgumentParser(prog="quack-edu bench", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model",
        action="store_true",
        help="the model benchmark instead: a decoder with each RMSNorm, eager and compiled "
        "(quack-edu bench --model -h; quack_edu.tools.model_bench)",
    )
    p.add_argument(
        "--stages",
        default="all",
        help="comma-separated kernels; 'all' among them is every stage of the pass (naive ... "
        "final forward, final_bwd backward); stage@variant (a stage's VARIANTS, e.g. "
        "cluster@hold) and stage#k (the k-th of its configs(N)) are kernels too, and so are lib "
        "(quack_edu.rmsnorm's rmsnorm_fwd / rmsnorm_bwd) and lib-tuned (their autotuned forms)",
    )
    p.add_argument("--shapes", default=None, help="e.g. 32768x4096,8192x262144 (default: sweep)")
    p.add_argument(
        "--pass",
        dest="pass_",
        choices=("fwd", "bwd", "both"),
        default="fwd",
        help="the forward, the backward (dx and dw from x, dout, rstd: the library's "
        "rmsnorm_bwd against QuACK's and autograd's), or both in one record (the copy measured "
        "once, lib timed in each; --png also writes the ladder and the speed-ups over PyTorch)",
    )
    p.add_argument("--dtype", default="bf16")
    p.add_argument(
        "--weight-dtype",
        default="same",
        help="the weight's dtype, or a list of them timed in one run: bf16,fp32 (same: x's)",
    )
    p.add_argument(
        "--peers",
        nargs="?",
        const="all",
        default=None,
        help="also time peers: all (those installed) or a list of " + ",".join(PEERS),
    )
    p.add_argument(
        "--residual",
        action="store_true",
        help="the pre-norm benchmark: (x + residual) normalised, residual_out written too "
        "(default shapes 32768x{4096,16384,65536})",
    )
    p.add_argument("--graph", action="store_true", help="also time through CUDA graphs")
    p.add_argument("--graph-max-n", type=int, default=None, help="graph timing only up to this N")
    p.add_argument(
        "--max-n", default="naive=16384", help="kernel=N,...: skip a kernel above that N"
    )
    p.add_argument(
        "--overhead",
        action="store_true",
        help="also the host cost per tiny call (M=1,8 N=1024, 2000 calls), the first-call "
        "(compile) time of the library at --compile-n (of the pass timed: --pass bwd, the "
        "backward's) and, with the forward, the host cost per eager training call of "
        "QuackRMSNorm against nn.RMSNorm (contiguous, an unbind view, the pre-norm call)",
    )
    p.add_argument("--compile-n", default="3000,5000", help="row lengths of the first-call timing")
    p.add_argument("--ours", default="lib", help="the kernel the verdict judges")
    p.add_argument(
        "--rep-budget", type=float, default=0.5, help="seconds of timed calls per row (at most)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time every kernel of a shape this many times, in turn, and keep each one's median: "
        "launch-bound rows measure the host too, whose speed moves, so kernels are then "
        "compared at the same moments (the recorded sweeps use 3)",
    )
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None)
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar on stderr (default: when stderr is a terminal)",
    )
    p.add_argument(
        "--summarize",
        nargs="+",
        default=None,
        metavar="JSON",
        help="print the tables and one verdict of recorded runs (no GPU); --png plots them",
    )
    p.add_argument("--first-call-child", default=None, help=argparse.SUPPRESS)
    return p


def options_from_args(a: argparse.Namespace) -> RunOptions:
    """The ``RunOptions`` the command line's flags ask for."""
    return RunOptions(
        dtype=torch_dtype(a.dtype),
        peers=a.peers,
        graph=a.graph,
        graph_max_n=a.graph_max_n,
        max_n={k: int(v) for k, v in (kv.split("=") for kv in a.max_n.split(",") if kv)},
        weight_dtypes=parse_weight_dtypes(a.weight_dtype),
        residual=a.residual,
        overhead=a.overhead,
        ours=a.ours,
        budget_s=a.rep_budget,
        compile_ns=[int(n) for n in a.compile_n.split(",") if n],
        pass_=a.pass_,
        rounds=a.rounds,
        progress=sys.stderr.isatty() if a.progress is None else a.progress,
    )


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--model" in argv:  # the model benchmark has its own flags
        from .model_bench import main as model_main

        return model_main([v for v in argv if v != "--model"])
    a = parser().parse_args(argv)
    if a.first_call_child:
        return first_call_child(a.first_call_child, resolve_kernels)
    if a.summarize:
        print(summarize(a.summarize, ours=a.ours, png=a.png))
        return 0
    if not torch.cuda.is_available():
        from ..lessons.results import results_dir

        ladder = results_dir() / "ladder.json"
        print(
            "bench needs a CUDA GPU, and PyTorch sees none here. The results recorded on an "
            f"H200 are in {results_dir()}/ (the whole ladder: {ladder.name}); print one with\n"
            f"    quack-edu bench --summarize {ladder}",
            file=sys.stderr,
        )
        return 2
    every = {"fwd": STAGE_ORDER, "bwd": BACKWARD_STAGES, "both": STAGE_ORDER + BACKWARD_STAGES}
    stages = [s for name in a.stages.split(",") if name
              for s in (every[a.pass_] if name == "all" else [name])]  # fmt: skip
    default = RESIDUAL_SHAPES if a.residual else DEFAULT_SHAPES
    shapes = parse_shapes(a.shapes) if a.shapes else default

    def save(result):  # after every row, so that a run cut short still leaves its numbers
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)

    runner = run_both if a.pass_ == "both" else run
    meta = {"command": " ".join(["quack-edu bench", *(argv or sys.argv[1:])])}
    result = runner(stages, shapes, options_from_args(a), on_row=save, meta=meta)
    save(result)
    if a.png:
        for path in plot_all(result, a.png):
            print(f"wrote {path}")
    for part in passes(result):
        if result.get("pass") == "both":
            print(f"\n=== {pass_name(part)}")
        print(table(part))
        if a.overhead:
            print(host_table(part))
        print(format_verdict(part["verdict"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
