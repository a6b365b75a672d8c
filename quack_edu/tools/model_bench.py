"""The model benchmark: a Llama/Qwen3-style decoder timed with each RMSNorm, eager and compiled.

Why: the library's kernels win in isolation (``quack-edu bench``), but in a model a norm is a
few percent of the GPU's time and its host cost lands on every call. This measures the model.

The model (``quack_edu.tools.decoder``): a Llama/Qwen3-style decoder, AdamW, fp32 parameters
under bf16 autocast (``--precision bf16``: a bf16 model, as a server runs one), its norms by name
(``torch``, ``quack_edu``, ``quack``: ``decoder.NORMS``), one state dict for all; the record's
``norms`` says in which form each ran (the add fused into the norm, or not).

Method:
* Workloads: ``train`` (forward and loss, backward, AdamW step), ``prefill`` (B x S tokens, no
  grad, logits of the last position only, as a server computes them) and ``decode@M`` (M rows
  of one token through every block WITHOUT a KV cache: attention sees the token itself; the
  point is the norm's host cost at small M, not attention).
* Modes: ``eager``, ``default`` (torch.compile of the whole model) and ``reduce-overhead``
  (torch.compile with CUDA graphs); fullgraph, or without it where it fails (the row says why).
  A (mode, workload) pair is a group: each norm's model makes its first call (``compile_s``:
  its wall time, compilation included) and ``warmup`` more steps, then the norms take turns,
  ``rounds`` times, in alternating order (A B C, C B A, ...), so that drift in the host or the
  GPU lands on every norm alike. Dynamo's caches are reset between groups.
* Timing (``Device``): CUDA events around each step, the steps of a turn back to back and one
  sync at its end; ``step_ms`` is the median over every step of every turn. ``tokens_per_s`` =
  tokens of a step / step time; ``vs_torch`` = torch's step time / this norm's (>= 1.00: not
  slower), within the group; ``vs_torch_turns`` the same ratio round by round (torch's turn over
  this norm's turn of the same round: its spread is the run's noise). The norm ``control`` is
  nn.RMSNorm again, a second model: an A/A control whose ``vs_torch`` is 1.00 but for noise.
* GPU time: one step of each row under torch.profiler. ``gpu_busy_ms`` sums every kernel,
  memcpy and memset; ``norm_gpu_ms`` the kernels whose names match ``NORM_KERNEL_RULE`` (the row
  lists the largest): a rule on names, not a proof.
* Gradient check (eager, before any timing): one training forward/backward of every norm's model
  against a float64 copy of the same weights with nn.RMSNorm and no autocast, on one sequence of
  ``check_seq`` tokens: the relative error of every parameter's gradient and of the logits, and
  each norm's ratio to nn.RMSNorm's (goal: <= ``GOAL``).
* Time budget: a group is skipped when the run would pass ``budget_s`` by the cost predicted
  from the groups before it. The JSON is written after every first call and every group.

Usage (GPU): ``quack-edu bench --model --hidden 2048 --json m.json --png m.png`` (also ``python
-m quack_edu.tools.model_bench``); ``--summarize m.json`` prints a recorded run (no GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import gc
import json
import math
import platform
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..autotune import Progress
from .decoder import NORMS, PRESETS, Decoder, ModelConfig, TorchNorm, build_models, lm_loss
from .runinfo import finish as _finish
from .runinfo import gpu_clocks, no_gc
from .runinfo import pyplot as _pyplot
from .runinfo import version as _version
from .runinfo import why as _why

MODES = ("eager", "default", "reduce-overhead")
WORKLOADS = ("train", "prefill", "decode")
#: the gradient check's goal: a norm's error at most this times nn.RMSNorm's
GOAL = 1.1
#: a step-time ratio within 1.00 +- TIE is a tie: the goals state ratios to two decimals
TIE = 0.005
#: errors below this count as this in the ratios: in fp32 (the CPU tests) the roundoff moves
#: by 2x with the order of the ops alone; bf16 errors are far above any floor
ERR_FLOOR = {"amp": 0.0, "bf16": 0.0, "fp32": 1e-5}
#: a kernel belongs to a norm when its name matches this. The CuTe kernels (ours, QuACK's) have
#: RMSNorm in their names; eager torch runs ATen's layer_norm kernels, or separate pow, mean,
#: rsqrt, mul kernels when x's dtype is not the weight's (the QK-norms under autocast: only pow
#: and rsqrt match); inductor fuses the torch norm with its neighbours (the residual add, casts)
#: into triton kernels named after their ops: rsqrt (forward) or pow (backward) in the name.
NORM_KERNEL_RULE = re.compile(r"RMSNorm|rms_norm|layer_norm|GammaBeta|rsqrt|pow")
#: how a run on each kind of device times a step (the record's method.timing)
TIMING = {
    "cuda": "CUDA events around each step; a turn's steps back to back, one sync at its end",
    "cpu": "perf_counter around each step (the CPU tests' stand-in: plumbing only)",
}
#: what ``--precision`` runs (the record's method.precision); fp32 makes the gradient check
#: sharp: the matmuls' bf16 errors no longer hide a norm's (a wrong eps, say)
PRECISION = {
    "amp": "fp32 parameters, bf16 autocast (the residual stream is fp32: the embedding's dtype)",
    "bf16": "bf16 parameters and activations, no autocast (AdamW on bf16 parameters)",
    "fp32": "fp32 parameters and activations, no autocast",
}
#: the cost of a first group of its kind, before one has been measured (seconds, guesses)
PRIOR_S = {"eager": 15.0, "train": 120.0, "other": 60.0}


@dataclass
class Options:
    """What one run measures: the command line's flags (``--quick`` sets smaller ones)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    workloads: tuple = WORKLOADS
    modes: tuple = MODES
    norms: tuple = ("torch", "quack_edu", "quack")
    decode_m: tuple = (1, 8, 64)
    rounds: int = 5
    round_s: float = 0.25  # seconds of steps in a turn (2 to 200 steps)
    warmup: int = 3  # steps after the first call: reduce-overhead records its graphs in these
    budget_s: float = 420.0
    check_seq: int = 1024  # tokens of the gradient check; 0: no check
    profile: bool = True
    precision: str = "amp"  # fp32 weights, bf16 autocast; "bf16": bf16 weights; "fp32": neither
    backend: str = "inductor"
    progress: bool = False
    command: str = ""
    started: float = field(default_factory=time.perf_counter)


# --- where the model runs -------------------------------------------------------------------


class Device:
    """How a step is timed and profiled. ``cuda``: CUDA events around each step, the steps of
    a turn back to back, one sync at its end; the profiler's CUDA kernels. ``cpu`` (the tests'
    stand-in, for the plumbing only): perf_counter around each step; leaf aten ops as kernels."""

    def __init__(self, kind: str = "cuda"):
        self.kind, self.torch = kind, torch.device(kind)

    def name(self) -> str:
        return torch.cuda.get_device_name(0) if self.kind == "cuda" else platform.machine()

    def sync(self) -> None:
        if self.kind == "cuda":
            torch.cuda.synchronize()

    def wall_ms(self, step: Callable) -> float:
        """Milliseconds of one step, synced: a first call, a warm-up, a step on the CPU."""
        t = time.perf_counter()
        step()
        self.sync()
        return (time.perf_counter() - t) * 1e3

    def time_steps(self, step: Callable, n: int) -> list[float]:
        """Milliseconds of each of ``n`` steps run back to back."""
        with no_gc():
            if self.kind != "cuda":
                return [self.wall_ms(step) for _ in range(n)]
            events = [[torch.cuda.Event(enable_timing=True) for _ in range(2)] for _ in range(n)]
            for start, end in events:
                start.record()
                step()
                end.record()
            torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]

    def kernels(self, step: Callable) -> list[tuple[str, float]]:
        """(name, microseconds) of everything one step ran on the device."""
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        cuda = self.kind == "cuda"  # CUDA activity only: the CPU ops' events are many, and slow
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            step()
            self.sync()
        if cuda:  # as torch's own table: device events that are not annotations
            keep = [e for e in prof.events() if e.device_type == DeviceType.CUDA
                    and not getattr(e, "is_user_annotation", False)]  # fmt: skip
        else:
            keep = [e for e in prof.events() if e.name.startswith("aten::") and not e.cpu_children]
        return [(e.name, e.time_range.elapsed_us()) for e in keep]


# --- one run --------------------------------------------------------------------------------


def make_inputs(cfg: ModelConfig, workload: str, device) -> tuple:
    """(tokens, targets, start): B x S for train and prefill; M rows of one token at the last
    position for ``decode@M``. The same tokens for every norm (a fixed seed)."""
    g = torch.Generator(device).manual_seed(0)
    if workload.startswith("decode@"):
        shape, start = (int(workload.split("@")[1]), 1), cfg.seq - 1
    else:
        shape, start = (cfg.batch, cfg.seq), 0
    tokens = torch.randint(cfg.vocab, shape, generator=g, device=device)
    return tokens, torch.randint(cfg.vocab, shape, generator=g, device=device), start


def make_step(workload: str, fn, opt, batch: tuple, autocast: Callable, graphs: bool):
    """One step of a workload through ``fn`` (the model, or its compiled form)."""
    tokens, targets, start = batch

    def train():
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with autocast():
            loss = fn(tokens, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer():
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad(), autocast():
            fn(tokens, start=start, last_only=True)

    return train if workload == "train" else infer


def rel_err(got, ref) -> float:
    """||got - ref|| / ||ref|| in float64; a missing gradient is all wrong (1.0)."""
    if got is None:
        return 1.0
    return float((got.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def norm_gpu_time(kernels: list[tuple[str, float]]) -> dict:
    """Busy time, the norm's kernels (``NORM_KERNEL_RULE``) and their share, from a profile."""
    busy = sum(us for _, us in kernels)
    mine: dict[str, list] = {}
    for name, us in kernels:
        if NORM_KERNEL_RULE.search(name):
            mine.setdefault(name, [0.0, 0])
            mine[name][0] += us
            mine[name][1] += 1
    norm = sum(us for us, _ in mine.values())
    top = sorted(mine.items(), key=lambda kv: -kv[1][0])[:8]
    return {
        "gpu_busy_ms": busy / 1e3,
        "norm_gpu_ms": norm / 1e3,
        "norm_share": norm / busy if busy else None,
        "norm_kernels": [{"name": k[:160], "ms": us / 1e3, "calls": c} for k, (us, c) in top],
    }


def groups_of(opts: Options) -> list[tuple[str, str]]:
    """(mode, workload) in run order: mode by mode (eager first: cheap), decode per M."""
    loads = [w for w in opts.workloads if w != "decode"]
    loads += [f"decode@{m}" for m in opts.decode_m] if "decode" in opts.workloads else []
    return [(mode, w) for mode in opts.modes for w in loads]


class Run:
    """One run of the benchmark: models, optimizers and the record, group by group."""

    def __init__(self, opts: Options, device: Device, makers=None, log=print, save=None):
        self.opts, self.device, self.log = opts, device, log
        self._save = save or (lambda result: None)
        self.classes, forms, skipped = {}, {}, {}
        makers = NORMS if makers is None else makers
        for name in opts.norms:
            try:
                self.classes[name], forms[name] = makers[name]()
            except Exception as e:  # not installed, or an unknown name
                skipped[name] = "unknown norm" if name not in makers else _why(e)
                log(f"skipped norm {name}: {skipped[name]}")
        self.models = build_models(opts.model, self.classes, device.torch)
        for m in self.models.values() if opts.precision == "bf16" else ():
            m.to(torch.bfloat16)
        self.optims = {
            k: torch.optim.AdamW(m.parameters(), lr=1e-5) for k, m in self.models.items()
        }
        cfg, options = opts.model, dataclasses.asdict(opts)
        for k in ("model", "command", "started", "progress"):
            del options[k]
        versions = {k: _version(k) for k in ("triton", "nvidia-cutlass-dsl", "quack-kernels")}
        params = sum(p.numel() for m in list(self.models.values())[:1] for p in m.parameters())
        self.result = {
            "kind": "model_bench",
            "gpu": device.name(),
            "date": _dt.date.today().isoformat(),
            "command": opts.command,
            "versions": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                **versions,
            },
            "clocks": {"start": gpu_clocks() if device.kind == "cuda" else {}},
            "model": {**dataclasses.asdict(cfg), "head_dim": cfg.head_dim, "params": params},
            "options": options,
            "method": {
                "timing": TIMING[device.kind],
                "precision": PRECISION[opts.precision],
                "decode": "M rows of one token, no KV cache: attention over the token itself",
                "prefill": "B x S tokens, no grad, logits of the last position only",
                "compile_s": "wall time of the first call (compilation included), synced",
                "norm_kernel_rule": NORM_KERNEL_RULE.pattern,
            },
            "norms": {
                k: {"class": c.__qualname__, "form": forms[k]} for k, c in self.classes.items()
            },
            "skipped": skipped,
            "grad_check": None,
            "rows": [],
            "skipped_groups": [],
        }

    def save(self):
        self._save(self.result)

    def autocast(self):
        if self.opts.precision != "amp":
            return contextlib.nullcontext()
        return torch.autocast(self.device.kind, dtype=torch.bfloat16)

    def go(self) -> dict:
        with warnings.catch_warnings():  # nn.RMSNorm on a bf16 q with an fp32 weight, each call
            warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
            return self._go()

    def _go(self) -> dict:
        if self.opts.check_seq and self.models:
            try:
                self.result["grad_check"] = self.grad_check()
            except Exception as e:  # the float64 copy did not fit, say: the timings still run
                self.result["grad_check"] = {"error": _why(e)}
            self.save()
        groups = groups_of(self.opts) if self.models else []
        bar = Progress(len(groups) * len(self.models) * self.opts.rounds, "model bench",
                       self.opts.progress, unit="turns")  # fmt: skip
        spent: list[tuple[str, str, float]] = []
        self.log(HEADER)
        for mode, workload in groups:
            elapsed = time.perf_counter() - self.opts.started
            need = predicted_s(mode, workload, spent)
            if elapsed + need > self.opts.budget_s:
                why = f"{elapsed:.0f} s spent + {need:.0f} s predicted > {self.opts.budget_s:.0f} s"
                self.result["skipped_groups"].append({"mode": mode, "workload": workload,
                                                      "why": why})  # fmt: skip
                self.log(f"skipped {workload} / {mode}: {why}")
                continue
            t = time.perf_counter()
            self.group(mode, workload, bar)
            spent.append((mode, workload, time.perf_counter() - t))
            torch.compiler.reset()  # the next group compiles afresh; frees its CUDA graphs
            gc.collect()
            if self.device.kind == "cuda":
                torch.cuda.empty_cache()
        bar.close()
        if self.device.kind == "cuda":
            self.result["clocks"]["end"] = gpu_clocks()
        self.result["elapsed_s"] = time.perf_counter() - self.opts.started
        self.save()
        return self.result

    def grad_check(self) -> dict:
        cfg, dev = self.opts.model, self.device.torch
        seq = min(cfg.seq, self.opts.check_seq)
        g = torch.Generator(dev).manual_seed(1)
        ids = torch.randint(cfg.vocab, (1, seq + 1), generator=g, device=dev)
        tokens, targets = ids[:, :-1], ids[:, 1:]
        with torch.device(dev):
            ref = Decoder(cfg, TorchNorm).double()
        ref.load_state_dict(next(iter(self.models.values())).state_dict())
        logits_ref = ref(tokens)
        lm_loss(logits_ref, targets).backward()
        grads_ref = {n: p.grad for n, p in ref.named_parameters()}
        out = {"tokens": seq, "goal": GOAL, "norms": {},
               "reference": "float64 weights (the same), nn.RMSNorm, no autocast"}  # fmt: skip
        for name, model in self.models.items():
            try:
                with self.autocast():
                    logits = model(tokens)
                    loss = lm_loss(logits, targets)
                loss.backward()
                errs = {n: rel_err(p.grad, grads_ref[n]) for n, p in model.named_parameters()}
                out["norms"][name] = {"logits_err": rel_err(logits.detach(), logits_ref.detach()),
                                      "grad_err": errs}  # fmt: skip
            except Exception as e:
                out["norms"][name] = {"error": _why(e)}
            model.zero_grad(set_to_none=True)
        del ref, grads_ref, logits_ref
        check_ratios(out, ERR_FLOOR[self.opts.precision])
        self.log("\n".join(check_lines(out)))
        return out

    def group(self, mode: str, workload: str, bar: Progress) -> None:
        """One (mode, workload): every norm's first call and warm-up, then turns, then a
        profiled step each; rows go into the record as they are made."""
        batch = make_inputs(self.opts.model, workload, self.device.torch)
        rows, steps, warm = {}, {}, {}
        for name in self.models:
            row = {"workload": workload, "mode": mode, "norm": name, "tokens": batch[0].numel()}
            self.result["rows"].append(row)
            rows[name] = row
            try:
                steps[name], warm[name] = self.first_call(row, name, mode, workload, batch)
            except Exception as e:
                row["error"] = _why(e)
                self.log(f"{workload} / {mode} / {name}: {row['error']}")
            self.save()
        if not steps:
            return
        per_step = max(statistics.median(w) for w in warm.values()) / 1e3
        n = max(2, min(200, round(self.opts.round_s / max(per_step, 1e-6))))
        times: dict[str, list] = {k: [] for k in steps}
        order = list(steps)
        for r in range(self.opts.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                if name in steps:
                    try:
                        times[name].append(self.device.time_steps(steps[name], n))
                    except Exception as e:
                        rows[name]["error"] = _why(e)
                        del steps[name]
                bar.update()
        for name, step in steps.items():
            row, turns = rows[name], times[name]
            row["step_ms"] = statistics.median(t for turn in turns for t in turn)
            row["turn_ms"] = [statistics.median(turn) for turn in turns]
            row["steps_per_turn"] = n
            row["tokens_per_s"] = row["tokens"] / (row["step_ms"] / 1e3)
            if self.opts.profile:
                try:
                    kernels = self.device.kernels(step)
                    row.update(
                        norm_gpu_time(kernels) if kernels else {"profile_error": "none seen"}
                    )
                except Exception as e:
                    row["profile_error"] = _why(e)
        base = rows.get("torch", {}).get("step_ms")
        base_turns = rows.get("torch", {}).get("turn_ms")
        for row in rows.values():
            if base and "step_ms" in row:
                row["vs_torch"] = base / row["step_ms"]
                if base_turns and len(base_turns) == len(row["turn_ms"]):
                    # round by round: how far one pair of turns alone can put the ratio
                    pairs = zip(base_turns, row["turn_ms"], strict=True)
                    row["vs_torch_turns"] = [a / b for a, b in pairs]
        judge(list(rows.values()))
        for row in rows.values():
            if "step_ms" in row:
                self.log(format_row(row))
        self.save()

    def first_call(self, row: dict, name: str, mode: str, workload: str, batch: tuple):
        """The step function of one row, compiled (fullgraph first) and warmed up."""
        from torch._dynamo.utils import counters

        for fullgraph in [None] if mode == "eager" else [True, False]:
            fn = self.models[name]
            if mode != "eager":  # the tests' backends (not inductor) have no modes
                how = (
                    {"mode": mode} if mode != "default" and self.opts.backend == "inductor" else {}
                )
                fn = torch.compile(fn, backend=self.opts.backend, fullgraph=fullgraph, **how)
            step = make_step(workload, fn, self.optims[name], batch, self.autocast,
                             graphs=mode == "reduce-overhead")  # fmt: skip
            skips = counters["inductor"]["cudagraph_skips"]
            try:
                first_ms = self.device.wall_ms(step)
            except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as e:
                if fullgraph is not True:  # a graph break: again without fullgraph
                    raise
                row["fullgraph_error"] = _why(e)
                continue
            row["compile_s"], row["fullgraph"] = first_ms / 1e3, fullgraph
            self.log(f"{workload} / {mode} / {name}: first call {row['compile_s']:.1f} s")
            row["warmup_ms"] = warm = [self.device.wall_ms(step) for _ in range(self.opts.warmup)]
            if mode == "reduce-overhead":  # inductor's count of graphs it would not capture
                row["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"] - skips
            return step, warm or [first_ms]
        raise AssertionError("unreachable")


def median_ci(values: list, level: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median of ``values``: the k-th smallest and k-th
    largest, k the largest with P(k-1 or fewer of n fair coins come up heads) * 2 <= 1 - level
    (n = 15: the 4th and the 12th, 96.5%). Below 6 values no k reaches 95%: the min and max."""
    v, n = sorted(values), len(values)
    k, tail = 0, 0.0  # tail: P(Binomial(n, 1/2) <= k - 1)
    while k < n // 2:
        nxt = tail + math.comb(n, k) / 2**n
        if 2 * nxt > 1 - level:
            break
        k, tail = k + 1, nxt
    k = max(k, 1)
    return v[k - 1], v[n - k]


def judge(rows: list) -> None:
    """Each row's ``vs_torch_ci`` (95% interval of the median round-by-round ratio) and
    ``verdict`` within its (workload, mode) group: ``faster`` / ``slower`` when the interval
    lies wholly above / below 1.00 by more than ``noise``, else ``tie``. ``noise`` is how far
    the A/A control's interval reaches from 1.00 (two copies of the same model, by position
    in the turns or placement in memory, differ that much in this run), and at least ``TIE``.
    The control's row gives the noise and has no verdict."""
    groups: dict = {}
    for r in rows:
        if r.get("vs_torch_turns") and r["norm"] != "torch":
            r["vs_torch_ci"] = list(median_ci(r["vs_torch_turns"]))
            groups.setdefault((r["workload"], r["mode"]), []).append(r)
    for group in groups.values():
        ci = {r["norm"]: r["vs_torch_ci"] for r in group}
        c = ci.get("control")
        noise = max(TIE, 1 - c[0], c[1] - 1) if c else TIE
        for r in group:
            if r["norm"] != "control":
                lo, hi = r["vs_torch_ci"]
                r["noise"] = noise
                r["verdict"] = "faster" if lo > 1 + noise else "slower" if hi < 1 - noise else "tie"


def predicted_s(mode: str, workload: str, spent: list) -> float:
    """A group's cost: the last measured group of its kind (eager or compiled, a training step
    or not: the compiler's caches make later groups cheaper), else ``PRIOR_S``."""
    kind = lambda m, w: "eager" if m == "eager" else "train" if w == "train" else "other"  # noqa: E731
    seen = [s for m, w, s in spent if kind(m, w) == kind(mode, workload)]
    return seen[-1] if seen else PRIOR_S[kind(mode, workload)]


def check_ratios(check: dict, floor: float) -> None:
    """Each norm's worst gradient error and, against torch's, its ratios (errors below
    ``floor`` count as the floor) and whether they are within ``GOAL``."""
    floor = max(floor, 1e-30)  # an exact gradient (0 error) must not divide by zero
    base = check["norms"].get("torch", {})
    for c in check["norms"].values():
        if "error" in c:
            continue
        errs = c["grad_err"]
        c["grad_err_max_param"], c["grad_err_max"] = max(errs.items(), key=lambda kv: kv[1])
        if "grad_err" not in base:
            continue
        ratio = {p: max(e, floor) / max(base["grad_err"][p], floor) for p, e in errs.items()}
        c["ratio_max_param"], c["ratio_max"] = max(ratio.items(), key=lambda kv: kv[1])
        c["ratio_median"] = statistics.median(ratio.values())
        c["logits_ratio"] = max(c["logits_err"], floor) / max(base["logits_err"], floor)
        c["within_goal"] = c["ratio_max"] <= GOAL and c["logits_ratio"] <= GOAL


# --- the record: table, plot, command line --------------------------------------------------


def _num(v, fmt: str, width: int) -> str:
    return f"{v:{width}{fmt}}" if isinstance(v, int | float) else f"{'-':>{width}}"


HEADER = (
    f"{'workload':<10} {'mode':<15} {'norm':<10} {'step ms':>9} {'tokens/s':>11} "
    f"{'vs torch':>8} {'compile s':>9} {'busy ms':>8} {'norm ms':>8} {'norm %':>6}"
)


def format_row(r: dict) -> str:
    if "error" in r and "step_ms" not in r:
        return f"{r['workload']:<10} {r['mode']:<15} {r['norm']:<10} error: {r['error'][:80]}"
    share = r.get("norm_share")
    return (
        f"{r['workload']:<10} {r['mode']:<15} {r['norm']:<10} {_num(r.get('step_ms'), '.3f', 9)}"
        f" {_num(r.get('tokens_per_s'), ',.0f', 11)} {_num(r.get('vs_torch'), '.3f', 8)}"
        f" {_num(r.get('compile_s'), '.1f', 9)} {_num(r.get('gpu_busy_ms'), '.3f', 8)}"
        f" {_num(r.get('norm_gpu_ms'), '.3f', 8)} {_num(share and 100 * share, '.1f', 6)}"
        + ("" if r.get("fullgraph") is not False else "  (not fullgraph)")
        + (f"  turns {min(pairs):.3f}-{max(pairs):.3f}" if (pairs := r.get("vs_torch_turns"))
           and r["norm"] != "torch" else "")
        + (f", median's 95% {ci[0]:.3f}-{ci[1]:.3f}" if (ci := r.get("vs_torch_ci"))
           and r["norm"] != "torch" else "")
        + (f", A/A +-{r['noise']:.3f}: {r['verdict']}" if "verdict" in r
           and r["norm"] not in ("torch", "control") else "")
        + (" (the A/A noise)" if r["norm"] == "control" and "vs_torch_ci" in r else "")
    )  # fmt: skip


def table(result: dict) -> str:
    """The record as text: the rows, the gradient check, the norms' forms, what was skipped."""
    judge(result["rows"])  # (records made before the verdicts get them here)
    m = result["model"]
    out = [
        f"{result['gpu']}, {result['date']}: hidden {m['hidden']}, {m['layers']} layers, "
        f"{m['heads']} heads x {m['head_dim']}{', fused qkv' if m.get('fused_qkv') else ''}, "
        f"ffn {m['ffn']}, vocab {m['vocab']}; train and "
        f"prefill {m['batch']} x {m['seq']} tokens; {result['method']['timing']}",
        HEADER,
    ]
    out += [format_row(r) for r in result["rows"]]
    out += check_lines(result.get("grad_check") or {})
    out += [f"norm {k}: {v['form']}" for k, v in result["norms"].items()]
    out += [f"skipped norm {k}: {v}" for k, v in result.get("skipped", {}).items()]
    out += [f"skipped {g['workload']} / {g['mode']}: {g['why']}" for g in result["skipped_groups"]]
    if "elapsed_s" in result:
        out.append(f"run took {result['elapsed_s']:.0f} s")
    return "\n".join(out)


def check_lines(check: dict) -> list[str]:
    """The gradient check as text, a line per norm."""
    if "error" in check or not check:
        return [f"gradient check: {check['error']}"] if check else []
    out = [f"gradient check (eager, {check['tokens']} tokens), {check['reference']}:"]
    for name, c in check["norms"].items():
        if "error" in c:
            out.append(f"  {name:<10} error: {c['error']}")
            continue
        line = (f"  {name:<10} logits err {c['logits_err']:.2e}, worst grad err "
                f"{c['grad_err_max']:.2e} ({c['grad_err_max_param']})")  # fmt: skip
        if "ratio_max" in c:
            ok = "within" if c["within_goal"] else "NOT within"
            line += (f"; vs torch: worst {c['ratio_max']:.2f} ({c['ratio_max_param']}), "
                     f"median {c['ratio_median']:.2f}, logits {c['logits_ratio']:.2f}: "
                     f"{ok} {check['goal']}x")  # fmt: skip
        out.append(line)
    return out


def plot(result: dict, path: str | None = None):
    """Step-time ratio to nn.RMSNorm (>= 1: not slower), a panel per mode, bars per norm."""
    plt = _pyplot()
    rows = [r for r in result["rows"] if "vs_torch" in r and r["norm"] != "torch"]
    modes = list(dict.fromkeys(r["mode"] for r in rows)) or ["(no ratios)"]
    loads = list(dict.fromkeys(r["workload"] for r in rows))
    norms = list(dict.fromkeys(r["norm"] for r in rows))
    fig, axes = plt.subplots(1, len(modes), figsize=(4.5 * len(modes) + 1, 4.5), squeeze=False,
                             sharey=True)  # fmt: skip
    width = 0.8 / max(1, len(norms))
    for ax, mode in zip(axes[0], modes, strict=True):
        for j, norm in enumerate(norms):
            mine = [r for r in rows if (r["mode"], r["norm"]) == (mode, norm)]
            got = {r["workload"]: r["vs_torch"] for r in mine}
            ys = [got.get(w, float("nan")) for w in loads]
            xs = [i + (j - (len(norms) - 1) / 2) * width for i in range(len(loads))]
            bars = ax.bar(xs, ys, width, label=norm, color=f"C{j + 1}")
            ax.bar_label(bars, labels=[f"{y:.2f}" if y == y else "" for y in ys], fontsize=7)
        ax.axhline(1.0, color="k", ls=":", label="nn.RMSNorm")
        ax.set_xticks(range(len(loads)), loads, rotation=30, ha="right")
        ax.set_title(mode, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("nn.RMSNorm's step time / the norm's")
    axes[0][0].legend(fontsize=8)
    m = result["model"]
    qkv = ", fused qkv" if m.get("fused_qkv") else ""
    fig.suptitle(f"Decoder, hidden {m['hidden']}{qkv}, {m['layers']} layers - {result['gpu']}, "
                 f"{result['date']}", fontsize=10)  # fmt: skip
    return _finish(plt, fig, path)


#: hidden -> (seq, batch) of a full run: the same 4096 tokens at 1024 and 2048
SEQ_BATCH = {1024: (512, 8), 2048: (2048, 2), 4096: (4096, 1)}


def options_from(a: argparse.Namespace, argv: list) -> Options:
    quick = a.quick
    heads, ffn = PRESETS.get(a.hidden, (a.hidden // 128, 256 * -(-8 * a.hidden // 3 // 256)))
    seq, batch = SEQ_BATCH.get(a.hidden, (2048, 2) if a.hidden < 4096 else (4096, 1))

    def pick(value, full, small):
        return value if value is not None else (small if quick else full)

    cfg = ModelConfig(
        hidden=a.hidden, layers=pick(a.layers, 4, 2), heads=a.heads or heads, ffn=a.ffn or ffn,
        vocab=a.vocab, seq=pick(a.seq, seq, 1024),
        batch=pick(a.batch, batch, 1), rope=not a.no_rope,
        fused_qkv=a.fused_qkv,
    )  # fmt: skip
    ints = lambda s: tuple(int(v) for v in s.split(",") if v)  # noqa: E731
    names = lambda s: tuple(v for v in s.split(",") if v)  # noqa: E731
    return Options(
        model=cfg, workloads=names(a.workloads), modes=names(a.modes), norms=names(a.norms),
        decode_m=ints(pick(a.decode_m, "1,8,64", "1,64")), rounds=pick(a.rounds, 5, 3),
        round_s=pick(a.round_s, 0.25, 0.1), warmup=a.warmup, budget_s=a.budget_s,
        check_seq=pick(a.check_seq, 1024, 256), profile=not a.no_profile, precision=a.precision,
        backend=a.backend, progress=sys.stderr.isatty() if a.progress is None else a.progress,
        command=" ".join(["quack-edu bench --model", *argv]),
    )  # fmt: skip


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="quack-edu bench --model", description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=2048, help="1024, 2048 or 4096 (presets)")
    p.add_argument("--layers", type=int, default=None, help="blocks (default 4; --quick 2)")
    p.add_argument("--heads", type=int, default=None, help="default: hidden / 128")
    p.add_argument("--ffn", type=int, default=None, help="default: 4096, 5632, 11008")
    p.add_argument("--seq", type=int, default=None, help="default 512, 2048, 4096 by hidden")
    p.add_argument("--batch", type=int, default=None, help="default 8, 2, 1 by hidden")
    p.add_argument(
        "--fused-qkv",
        action="store_true",
        help="q, k, v from one projection (QK-norms on strided views)",
    )
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--no-rope", action="store_true")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--norms", default="torch,quack_edu,quack", help="of " + ",".join(NORMS))
    p.add_argument("--decode-m", default=None, help="decode rows (default 1,8,64; --quick 1,64)")
    p.add_argument("--rounds", type=int, default=None, help="turns of each norm (default 5)")
    p.add_argument("--round-s", type=float, default=None, help="seconds of steps a turn (0.25)")
    p.add_argument("--warmup", type=int, default=3, help="steps after the first call")
    p.add_argument("--budget-s", type=float, default=420.0, help="skip groups past this (s)")
    p.add_argument("--check-seq", type=int, default=None, help="gradient check tokens; 0: none")
    p.add_argument("--no-profile", action="store_true", help="no profiled step (GPU time)")
    p.add_argument(
        "--precision",
        choices=tuple(PRECISION),
        default="amp",
        help="amp: fp32 weights, bf16 autocast",
    )
    p.add_argument("--quick", action="store_true", help="2 layers, 1 x 1024 tokens, 3 rounds")
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--summarize", default=None, metavar="JSON", help="print a recorded run")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: tests only
    p.add_argument("--backend", default="inductor", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.summarize:
        with open(a.summarize) as f:
            result = json.load(f)
        print(table(result))
        if a.png:
            plot(result, a.png)
            print(f"wrote {a.png}")
        return 0
    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench --model needs a CUDA GPU, and PyTorch sees none here; "
              "--summarize FILE prints a recorded run", file=sys.stderr)  # fmt: skip
        return 2
    opts = options_from(a, argv)

    def save(result):
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)

    result = Run(opts, Device(a.device), log=print, save=save).go()
    if a.png:
        plot(result, a.png)
        print(f"wrote {a.png}")
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
