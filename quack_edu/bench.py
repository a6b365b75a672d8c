"""Benchmarks: GB/s from an explicit byte count, side by side with peers and the copy ceiling.

Method (the same for every kernel in a run):
* bytes = read x + write y + read weight = (2*M*N) * sizeof(x) + N * sizeof(w).
* Inputs rotate over enough independent buffers that one round moves > 3x the L2 cache (60 MB on
  an H200), so a timed call never finds its input in L2.
* Plain timing: CUDA events around each call, after warm-up; the median is reported. This
  includes the host's launch overhead when the kernel is shorter than it (small shapes).
* Graph timing (``graph=True``): the calls over all buffers are captured in one CUDA graph; a
  replay is timed with events and divided by the number of calls. This removes launch overhead.
* The ceiling is a device-to-device copy measured in the same run (bytes read + written).

Usage: ``python -m quack_edu.bench --stages naive,block --shapes 32768x4096 --peers --json F``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import math
import statistics
import sys
from collections.abc import Callable

import torch

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


def rmsnorm_bytes(M: int, N: int, dtype, weight_dtype=None) -> int:
    """The fewest bytes an RMSNorm forward must move: read x once, write y once, read w."""
    esize = torch.empty((), dtype=dtype).element_size()
    wsize = torch.empty((), dtype=weight_dtype or dtype).element_size()
    return 2 * M * N * esize + N * wsize


def _l2_bytes() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 60 << 20) or (60 << 20))


def rotation_count(bytes_per_call: int, budget: int = 6 << 30) -> int:
    """How many input sets make one round of calls move > 3x L2, within a memory budget."""
    need = math.ceil(3 * _l2_bytes() / max(1, bytes_per_call)) + 1
    return max(2, min(need, max(1, budget // max(1, bytes_per_call)), 64))


def _reps_for(fn, arg_sets, budget_s: float, lo: int, hi: int) -> int:
    """As many repetitions as fit in ``budget_s`` (slow kernels get fewer), within [lo, hi]."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for args in arg_sets[:3]:
        fn(*args)
    e.record()
    e.synchronize()
    per_call = s.elapsed_time(e) / 1e3 / min(3, len(arg_sets))
    return int(max(lo, min(hi, budget_s / max(per_call, 1e-7))))


def time_calls(
    fn: Callable, arg_sets: list, warmup: int = 10, reps: int | None = None, budget_s: float = 0.5
) -> float:
    """Median microseconds of one call, CUDA events around each call, rotating inputs."""
    reps = reps or _reps_for(fn, arg_sets, budget_s, 5, 200)
    for i in range(warmup):
        fn(*arg_sets[i % len(arg_sets)])
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        args = arg_sets[i % len(arg_sets)]
        starts[i].record()
        fn(*args)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)) * 1e3


def time_graph(fn: Callable, arg_sets: list, replays: int = 20) -> float:
    """Median microseconds per call from replays of one CUDA graph over all input sets."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for args in arg_sets:  # warm-up (compiles, allocator) outside the capture
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in arg_sets:
            fn(*args)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / len(arg_sets))
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 1 << 30, reps: int = 30) -> float:
    """Device-to-device copy GB/s (bytes read + bytes written), the ceiling that counts."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    us = time_calls(lambda: dst.copy_(src), [()], warmup=5, reps=reps)
    return 2 * nbytes / (us * 1e-6) / 1e9


# --- the kernels a run can time -------------------------------------------------------------


def split_name(name: str) -> tuple[str, str, str]:
    """``stage[@variant][#k]`` -> (stage, variant, k), the last two possibly empty."""
    head, _, index = name.partition("#")
    stage, _, variant = head.partition("@")
    return stage, variant, index


def resolve_config(name: str, N: int, dtype):
    """The config a stage kernel ``name`` runs with at N: its heuristic's, or with ``name#k`` the
    k-th entry of the stage's ``configs(N, dtype)`` (the alternatives the heuristic chooses
    between), so that they can be timed side by side."""
    from .stages import get_stage

    stage, _, index = split_name(name)
    mod = get_stage(stage)
    if not index:
        return mod.default_config(N, dtype)
    options = mod.configs(N, dtype)
    if int(index) >= len(options):
        raise ValueError(f"{stage} has {len(options)} configs at N={N}: {options}")
    return options[int(index)]


def stage_fn(name: str, config=None):
    """A stage's forward with ``config``, or with the config ``resolve_config`` names.
    ``stage@variant`` runs the kernel class the stage lists under that name in ``VARIANTS``
    (the same tiling with another plan, e.g. ``cluster@hold``)."""
    from .runtime import run_forward
    from .stages import get_stage

    stage, variant, _ = split_name(name)
    mod = get_stage(stage)
    kernel = mod.KERNEL
    if variant:
        variants = getattr(mod, "VARIANTS", {})
        if variant not in variants:
            raise ValueError(f"{stage} has no variant {variant!r}; it has: {sorted(variants)}")
        kernel = variants[variant]
    forced = functools.cache(lambda N, dtype: resolve_config(name, N, dtype))

    def fwd(x, w, eps=1e-6):
        return run_forward(kernel, x, w, eps, config or forced(x.shape[1], x.dtype))

    return fwd


def peer_fns() -> dict[str, Callable]:
    """The peers that are importable here: QuACK, torch.compile, Liger, eager PyTorch."""
    import torch.nn.functional as F

    def composed(x, w):  # RMSNorm as a model writes it in PyTorch ops: one kernel per op
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)

    peers: dict[str, Callable] = {
        # torch >= 2.4 has a fused CUDA kernel behind F.rms_norm ...
        "torch-eager": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
        # ... while the same maths in separate ops launches one kernel per op
        "torch-ops": composed,
    }
    try:
        from quack.rmsnorm import rmsnorm as quack_rmsnorm

        peers["quack"] = lambda x, w: quack_rmsnorm(x, w, eps=1e-6)
    except Exception:
        pass
    try:
        from liger_kernel.ops.rms_norm import rms_norm_forward

        peers["liger"] = lambda x, w: rms_norm_forward(x, w, 1e-6, 0.0, "llama", None)[0]
    except Exception:
        pass

    # One specialisation per shape, as a model with fixed shapes gets; raise dynamo's limit on
    # recompiles so that a sweep of shapes never falls back to eager.
    import torch._dynamo

    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    peers["torch-compile"] = torch.compile(composed, dynamic=False)
    return peers


def bench_one(fn, M, N, dtype, graph=False, weight_dtype=None, check=True) -> dict:
    from .reference import assert_close, rmsnorm_ref

    nbytes = rmsnorm_bytes(M, N, dtype, weight_dtype)
    k = rotation_count(nbytes)
    wdt = weight_dtype or dtype
    sets = [
        (torch.randn(M, N, device="cuda", dtype=dtype), torch.randn(N, device="cuda", dtype=wdt))
        for _ in range(k)
    ]
    if check:  # never time a kernel whose answer is wrong
        x, w = sets[0]
        assert_close(fn(x, w), rmsnorm_ref(x, w), dtype)
    with torch.no_grad():
        us = time_graph(fn, sets) if graph else time_calls(fn, sets)
    del sets
    return {
        "M": M,
        "N": N,
        "dtype": _short(dtype),
        "us": us,
        "gbps": nbytes / (us * 1e-6) / 1e9,
        "bytes": nbytes,
        "graph": graph,
    }


def _short(dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]


def run(
    stages,
    shapes,
    dtype=torch.bfloat16,
    peers=False,
    graph=False,
    graph_max_n=None,
    max_n=None,
    log=print,
    on_row=None,
) -> dict:
    """Time every kernel at every shape. ``graph``: also through CUDA graphs (for N up to
    ``graph_max_n``: the launch-bound shapes). ``max_n``: {kernel: largest N worth timing}.
    ``on_row(result)`` is called after every row (to save partial results)."""
    max_n = max_n or {}
    copy = copy_bandwidth()
    log(f"D2D copy: {copy:.0f} GB/s")
    rows = []
    result = {
        "gpu": torch.cuda.get_device_name(0),
        "date": _dt.date.today().isoformat(),
        "torch": torch.__version__,
        "dsl": _version("nvidia-cutlass-dsl"),
        "copy_gbps": copy,
        "rows": rows,
    }
    fns = {s: stage_fn(s) for s in stages}
    if peers:
        available = peer_fns()
        wanted = list(available) if peers in (True, "all") else peers.split(",")
        fns.update({k: available[k] for k in wanted if k in available})
        packages = {"quack": "quack-kernels", "liger": "liger-kernel"}
        result["peers"] = {k: _version(packages[k]) for k in fns if k in packages}
    for M, N in shapes:
        for name, fn in fns.items():
            if N > max_n.get(name, N):
                continue
            small = graph_max_n is None or N <= graph_max_n
            for g in [False, True] if graph and small else [False]:
                try:
                    row = bench_one(fn, M, N, dtype, graph=g)
                except Exception as e:  # a stage that doesn't support a shape: record why
                    row = {
                        "M": M,
                        "N": N,
                        "dtype": _short(dtype),
                        "error": f"{type(e).__name__}: {e}"[:300],
                        "graph": g,
                    }
                row["kernel"] = name
                row["config"] = _config_of(name, N, dtype)
                if "gbps" in row:
                    row["pct_copy"] = 100 * row["gbps"] / copy
                rows.append(row)
                log(_fmt_row(row))
                if on_row:
                    on_row(result)
            torch.cuda.empty_cache()
    return result


def _version(package: str) -> str:
    """'package version' as installed, for the record."""
    from .doctor import installed_version

    return f"{package} {installed_version(package) or '(not installed)'}"


def _config_of(name: str, N: int, dtype) -> str | None:
    """The config a stage kernel runs at N, for the record (None for peers)."""
    from .stages import STAGE_ORDER

    if split_name(name)[0] not in STAGE_ORDER:
        return None
    try:
        return repr(resolve_config(name, N, dtype))
    except Exception:
        return None


def _fmt_row(r) -> str:
    mode = "graph" if r["graph"] else "plain"
    head = f"{r['kernel']:<16} {r['M']:>6}x{r['N']:<7} {r['dtype']} {mode}"
    if "error" in r:
        return f"{head}  error: {r['error'][:80]}"
    return f"{head} {r['us']:9.1f} us {r['gbps']:7.0f} GB/s {r.get('pct_copy', 0):5.1f}% of copy"


def table(result: dict) -> str:
    """A compact table: one line per shape, one column per kernel (GB/s)."""
    rows = [r for r in result["rows"] if "gbps" in r]
    kernels = list(dict.fromkeys(r["kernel"] for r in result["rows"]))
    shapes = list(dict.fromkeys((r["M"], r["N"], r["graph"]) for r in result["rows"]))
    head = f"{'M x N':>14} {'mode':5} " + " ".join(f"{k:>13}" for k in kernels)
    out = [
        f"{result['gpu']}  {result['date']}  copy {result['copy_gbps']:.0f} GB/s  (GB/s below)",
        head,
    ]
    for M, N, g in shapes:
        cells = []
        for k in kernels:
            hit = [r for r in rows if (r["M"], r["N"], r["graph"], r["kernel"]) == (M, N, g, k)]
            cells.append(f"{hit[0]['gbps']:13.0f}" if hit else f"{'-':>13}")
        out.append(f"{M:>6}x{N:<7} {'graph' if g else 'plain':5} " + " ".join(cells))
    return "\n".join(out)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    kernels = list(dict.fromkeys(r["kernel"] for r in result["rows"]))
    colors = {k: f"C{i % 10}" for i, k in enumerate(kernels)}  # a kernel keeps its colour
    for g in sorted({r["graph"] for r in result["rows"]}):
        for k in kernels:
            pts = sorted(
                (r["N"], r["gbps"])
                for r in result["rows"]
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
    ax.axhline(
        result["copy_gbps"], color="k", ls=":", label=f"D2D copy {result['copy_gbps']:.0f} GB/s"
    )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N (row length)")
    ax.set_ylabel("GB/s")
    ax.set_title(
        f"RMSNorm forward, {result['rows'][0]['dtype']} - {result['gpu']}, {result['date']}"
    )
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_shapes(text: str):
    return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="quack-edu bench", description=__doc__.split("\n")[0])
    p.add_argument(
        "--stages",
        default="all",
        help="comma-separated stages, or 'all'; stage@variant (a stage's VARIANTS, e.g. "
        "cluster@hold) and stage#k (the k-th of its configs(N)) are kernels too",
    )
    p.add_argument("--shapes", default=None, help="e.g. 32768x4096,8192x262144 (default: sweep)")
    p.add_argument("--dtype", default="bf16")
    p.add_argument(
        "--peers",
        nargs="?",
        const="all",
        default=None,
        help="also time peers: all (QuACK, Liger, torch.compile, torch eager and ops) or a list",
    )
    p.add_argument("--graph", action="store_true", help="also time through CUDA graphs")
    p.add_argument("--graph-max-n", type=int, default=None, help="graph timing only up to this N")
    p.add_argument(
        "--max-n", default="naive=16384", help="kernel=N,...: skip a kernel above that N"
    )
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "bench needs a CUDA GPU; recorded H200 results are in benchmarks/results/",
            file=sys.stderr,
        )
        return 2
    from .runtime import torch_dtype
    from .stages import STAGE_ORDER

    stages = list(STAGE_ORDER) if a.stages == "all" else a.stages.split(",")
    shapes = parse_shapes(a.shapes) if a.shapes else DEFAULT_SHAPES
    max_n = {k: int(v) for k, v in (kv.split("=") for kv in a.max_n.split(",") if kv)}

    def save(result):  # after every row, so that a run cut short still leaves its numbers
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)

    result = run(
        stages,
        shapes,
        torch_dtype(a.dtype),
        peers=a.peers,
        graph=a.graph,
        graph_max_n=a.graph_max_n,
        max_n=max_n,
        on_row=save,
    )
    save(result)
    if a.png:
        plot(result, a.png)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
