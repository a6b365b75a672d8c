"""The host's cost of a norm call, eager and inside a ``torch.compile``d graph.

A short row's norm is over in a few microseconds on the GPU; what a model pays for it then is
the host's time to issue it. Two measurements:

* **chain**: a function that applies a norm 32 times in a chain (each output the next input,
  each with its own weight), eager and compiled (``torch.compile``, default mode, fullgraph),
  forward and forward+backward; wall-clock microseconds per call of the function, divided by
  32, so that torch.compile's own wrapper per call is shared by 32 norms. With the GPU idle
  between calls and tiny rows, this is the host's cost per norm.
* **module**: one eager inference call (``torch.no_grad``) of ``QuackRMSNorm`` (an fp32
  weight, as a model holds under autocast), of ``rmsnorm_fwd`` with a plain tensor weight,
  and of ``nn.RMSNorm`` with a weight of x's dtype (PyTorch's fused path).
* **kernel call**: the compiled kernel of that call alone, called with its eight arguments,
  as compiled in this process and as loaded from the disk cache (``quack_edu.compile_cache``,
  in a scratch folder): a new process's kernels are the loaded ones.

The norms: ``quack_edu`` with the compile policy "kernel" (the op's own host cost), ``quack_edu``
with the default policy ("auto"), QuACK's ``quack.rmsnorm.rmsnorm`` where installed, and
``F.rms_norm``. They take turns, round by round; the median round is reported.

    python -m quack_edu.tools.host_cost --json host_cost.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import time

import torch

CHAIN = 32
EPS = 1e-6


def _norms() -> dict:
    """name -> (function (x, w) -> y, compile policy or None). QuACK only where installed."""
    import torch.nn.functional as F

    import quack_edu

    norms = {
        "quack_edu": (lambda x, w: quack_edu.rmsnorm(x, w, eps=EPS), "kernel"),
        "quack_edu-auto": (lambda x, w: quack_edu.rmsnorm(x, w, eps=EPS), "auto"),
        "torch": (lambda x, w: F.rms_norm(x, x.shape[-1:], w, EPS), None),
    }
    try:
        from quack.rmsnorm import rmsnorm as quack_rmsnorm

        norms["quack"] = (lambda x, w: quack_rmsnorm(x, w, eps=EPS), None)
    except Exception as e:  # not installed, or it does not import here
        print(f"quack: not measured ({type(e).__name__}: {e})", file=sys.stderr)
    return norms


def _chain(norm):
    def chain(x, ws):
        for w in ws:
            x = norm(x, w)
        return x

    return chain


def _per_call_us(fn, calls: int) -> float:
    """``bench.per_call_us`` of a callable without arguments, after a short warm-up."""
    from .timing import per_call_us

    return per_call_us(fn, (), calls, warmup=5)


def chain_rows(Ms, Ns, rounds, calls, modes, passes, rows, names, save=None, log=print):
    """Microseconds per norm in a chain of ``CHAIN``, for every (M, N, pass, mode, norm of
    ``names``), appended to ``rows``; ``save()`` after each (M, N, pass)."""
    import quack_edu

    norms = {k: v for k, v in _norms().items() if k in names}
    for N in Ns:
        for M in Ms:
            for pass_ in passes:
                train = pass_ == "fwd+bwd"
                x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, requires_grad=train)
                ws = [torch.randn(N, device="cuda", requires_grad=train) for _ in range(CHAIN)]
                fns = {}
                for mode in modes:
                    for name, (norm, policy) in norms.items():
                        if policy == "auto" and mode == "eager":
                            continue  # eager calls always run the kernels
                        row = dict(M=M, N=N, pass_=pass_, mode=mode, norm=name, us_rounds=[])
                        old = quack_edu.set_compile_policy(policy or "auto")
                        try:
                            fn = _chain(norm)
                            if mode == "compiled":
                                torch._dynamo.reset()
                                fn = torch.compile(fn, fullgraph=True)
                            t = time.perf_counter()
                            step = _step(fn, x, ws, train)
                            step()  # the compile, for a compiled chain
                            torch.cuda.synchronize()
                            row["first_s"] = time.perf_counter() - t
                            fns[(mode, name)] = (step, row)
                        except Exception as e:
                            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                            rows.append(row)
                        finally:
                            quack_edu.set_compile_policy(old.mode)
                for _ in range(rounds):
                    for step, row in fns.values():
                        row["us_rounds"].append(_per_call_us(step, calls) / CHAIN)
                for (mode, name), (_, row) in fns.items():
                    row["us_per_norm"] = statistics.median(row["us_rounds"])
                    rows.append(row)
                    log(f"chain {pass_:<7} {mode:<8} {name:<15} {M:>4}x{N:<5} "
                        f"{row['us_per_norm']:7.2f} us/norm")  # fmt: skip
                if save:
                    save()
    return rows


def _step(fn, x, ws, train):
    if not train:

        def step():
            with torch.no_grad():
                return fn(x, ws)

        return step

    def step():
        fn(x, ws).sum().backward()

    return step


def module_rows(M: int, N: int, rounds: int, calls: int, log=print) -> list[dict]:
    """One eager inference call: QuackRMSNorm (fp32 weight), rmsnorm_fwd (plain tensor weight),
    nn.RMSNorm (a weight of x's dtype)."""
    import quack_edu

    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    ours = quack_edu.QuackRMSNorm(N, device="cuda")
    theirs = torch.nn.RMSNorm(N, eps=EPS, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, device="cuda")
    fns = {
        "QuackRMSNorm (fp32 weight)": lambda: ours(x),
        "rmsnorm_fwd (fp32 tensor weight)": lambda: quack_edu.rmsnorm_fwd(x, w, eps=EPS),
        "rmsnorm_fwd (fp32 Parameter weight)": lambda: quack_edu.rmsnorm_fwd(
            x, ours.weight, eps=EPS
        ),
        "nn.RMSNorm (bf16 weight)": lambda: theirs(x),
    }
    got = {name: [] for name in fns}
    with torch.no_grad():
        for _ in range(rounds):
            for name, fn in fns.items():
                got[name].append(_per_call_us(fn, calls))
    rows = []
    for name, us in got.items():
        rows.append(dict(M=M, N=N, call=name, us_rounds=us, us_per_call=statistics.median(us)))
        log(f"module {name:<34} {M}x{N} {rows[-1]['us_per_call']:6.2f} us/call")
    return rows


def kernel_call_rows(M: int, N: int, rounds: int, calls: int, log=print) -> list[dict]:
    """The raw call of one compiled kernel (x bf16, an fp32 weight), compiled here and loaded
    from a disk cache, taking turns."""
    import tempfile

    import cutlass.cute as cute

    from .. import compile_cache
    from ..runtime import direct_call
    from ..stages import final

    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, device="cuda")
    out = torch.empty_like(x)
    kernel = final.kernel_for(x, w, None, None, out, None, None).kernel
    opts = "--enable-tvm-ffi"

    def build():
        return cute.compile(kernel, *kernel.compile_args(), options=opts)

    fresh = direct_call(build())
    with tempfile.TemporaryDirectory() as d:
        compile_cache.cached_compile(kernel, opts, build, directory=d)  # compiles and stores
        loaded = compile_cache.cached_compile(kernel, opts, build, directory=d)
        if loaded is None or hasattr(loaded, "execution_args"):
            raise RuntimeError("the disk cache did not load the kernel it stored")
        fns = {
            "kernel compiled in this process": fresh,
            "kernel loaded from the disk cache": loaded,
        }
        for fn in fns.values():
            fn(x, w, None, None, out, None, None, EPS)
        torch.cuda.synchronize()
        ref = out.clone()
        loaded(x, w, None, None, out, None, None, EPS)
        torch.cuda.synchronize()
        if not torch.equal(out, ref):
            raise RuntimeError("the loaded kernel's output differs from the compiled one's")
        got = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                got[name].append(
                    _per_call_us(lambda fn=fn: fn(x, w, None, None, out, None, None, EPS), calls)
                )
    rows = []
    for name, us in got.items():
        rows.append(dict(M=M, N=N, call=name, us_rounds=us, us_per_call=statistics.median(us)))
        log(f"kernel call {name:<34} {M}x{N} {rows[-1]['us_per_call']:6.2f} us/call")
    return rows


def make_step(norm, dout: str, strided: bool, device="cuda", autocast="cuda", dtype=None,
              residual: bool = False):  # fmt: skip
    """An eager training step of ``norm`` on a tiny x (1, 4, 8, 128) that requires grad (fp32
    unless ``dtype``):
    forward under bf16 autocast, then ``y.sum().backward()`` (``dout="sum"``) or
    ``y.backward(g)`` with a dense g made once (``"dense"``). ``strided``: x is q of a fused
    projection, ``qkv.view(1, 4, 3, 8, 128).unbind(2)[0]``. ``residual``: the pre-norm call,
    ``out, res = norm(x, r)`` with an fp32 residual r that requires grad too, both outputs
    given a gradient (``sum``: ones). (scripts/host_cost_cpu.py's steps are these, on the
    CPU, and ``training_call_rows``'s.)"""
    H, D = 8, 128
    if strided:
        qkv = torch.randn(1, 4, 3 * H * D, device=device, dtype=dtype, requires_grad=True)

        def get_x():
            return qkv.view(1, 4, 3, H, D).unbind(2)[0]
    else:
        x = torch.randn(1, 4, H, D, device=device, dtype=dtype, requires_grad=True)

        def get_x():
            return x

    if residual:
        r = torch.randn(1, 4, H, D, device=device, requires_grad=True)
        with torch.autocast(autocast, dtype=torch.bfloat16):
            likes = [t.detach() for t in norm(get_x(), r)]
        gs = [torch.randn_like(t, memory_format=torch.contiguous_format) for t in likes]
        if dout == "sum":
            gs = [torch.ones_like(t) for t in likes]

        def step():
            with torch.autocast(autocast, dtype=torch.bfloat16):
                outs = norm(get_x(), r)
            torch.autograd.backward(outs, gs)

        return step

    with torch.autocast(autocast, dtype=torch.bfloat16):
        like = norm(get_x()).detach()
    g = torch.randn_like(like, memory_format=torch.contiguous_format)

    if dout == "sum":

        def step():
            with torch.autocast(autocast, dtype=torch.bfloat16):
                y = norm(get_x())
            y.sum().backward()
    else:

        def step():
            with torch.autocast(autocast, dtype=torch.bfloat16):
                y = norm(get_x())
            y.backward(g)

    return step


def add_then(norm):
    """``norm`` as the pre-norm call a model writes without the fused form:
    ``(norm(x + r), x + r)``."""

    def call(x, r):
        h = x + r
        return norm(h), h

    return call


#: the training calls ``training_call_rows`` times: (name, x strided, the pre-norm call)
TRAINING_CASES = (
    ("contiguous", False, False),
    ("unbind view", True, False),
    ("pre-norm norm(x, r)", False, True),
)


def training_call_rows(
    rounds: int = 5, calls: int = 1000, device="cuda", log=print, douts=("dense",)
) -> list:
    """us per eager training call, ``QuackRMSNorm`` against ``nn.RMSNorm`` (the pre-norm case:
    ``x + r`` then nn.RMSNorm), taking turns round by round, the median round: a tiny x
    (1, 4, 8, 128), fp32, under bf16 autocast, an fp32 weight, each upstream gradient of
    ``douts`` (``make_step``: "dense", or "sum", the expanded gradient of ``y.sum()``), so the
    GPU waits on the host and the time is the host's (issue 47)."""
    from ..rmsnorm import QuackRMSNorm

    D = 128
    ours = QuackRMSNorm(D).to(device)
    theirs = torch.nn.RMSNorm(D, eps=EPS).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    for case, strided, res in TRAINING_CASES:
        for dout in douts:
            steps = {
                "QuackRMSNorm": make_step(ours, dout, strided, device, device, residual=res),
                "nn.RMSNorm": make_step(
                    add_then(theirs) if res else theirs, dout, strided, device, device,
                    residual=res,
                ),
            }  # fmt: skip
            per = {name: [] for name in steps}
            for _ in range(rounds):
                for name, step in steps.items():
                    for _ in range(20):
                        step()
                    sync()
                    t = time.perf_counter()
                    for _ in range(calls):
                        step()
                    sync()
                    per[name].append((time.perf_counter() - t) / calls * 1e6)
            row = {"case": case, "dout": dout, **{k: statistics.median(v) for k, v in per.items()}}
            row["ratio"] = row["QuackRMSNorm"] / row["nn.RMSNorm"]
            row.update(x="(1, 4, 8, 128) fp32, bf16 autocast, fp32 weight", calls=calls,
                       us_rounds=per)  # fmt: skip
            log(f"training call, {case}, {dout} gradient: QuackRMSNorm "
                f"{row['QuackRMSNorm']:.1f} us, nn.RMSNorm {row['nn.RMSNorm']:.1f} us "
                f"({row['ratio']:.2f}x)")  # fmt: skip
            rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m quack_edu.tools.host_cost", description=__doc__)
    ap.add_argument("--M", default="1,8,128", help="rows (default 1,8,128)")
    ap.add_argument("--N", default="1024,4096", help="row lengths (default 1024,4096)")
    ap.add_argument("--modes", default="eager,compiled")
    ap.add_argument("--passes", default="fwd,fwd+bwd")
    ap.add_argument(
        "--norms", default="quack_edu,quack,torch",
        help="of quack_edu, quack_edu-auto (the default policy), quack, torch",
    )  # fmt: skip
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200, help="calls a round (of a chain of 32)")
    ap.add_argument("--json", help="write the record here")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_cost needs a CUDA GPU, and PyTorch sees none here", file=sys.stderr)
        return 2
    from .runinfo import gpu_clocks
    from .runinfo import version as _version

    t = time.perf_counter()
    record = {
        "gpu": torch.cuda.get_device_name(0),
        "date": _dt.date.today().isoformat(),
        "torch": torch.__version__,
        "dsl": _version("nvidia-cutlass-dsl"),
        "quack": _version("quack-kernels"),
        "command": "python -m quack_edu.tools.host_cost " + " ".join(argv or sys.argv[1:]),
        "chain": CHAIN,
        "clocks": {"start": gpu_clocks()},
    }

    def save():
        record["seconds"] = time.perf_counter() - t
        if a.json:
            with open(a.json, "w") as f:
                json.dump(record, f, indent=1)

    record["module"] = module_rows(8, 4096, a.rounds, a.calls * 10)
    record["kernel_call"] = kernel_call_rows(8, 4096, a.rounds, a.calls * 10)
    record["rows"] = []
    chain_rows(
        [int(m) for m in a.M.split(",")], [int(n) for n in a.N.split(",")], a.rounds, a.calls,
        a.modes.split(","), a.passes.split(","), record["rows"], a.norms.split(","), save,
    )  # fmt: skip
    record["clocks"]["end"] = gpu_clocks()
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
