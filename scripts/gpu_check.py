#!/usr/bin/env python3
"""Every GPU check in one call, for the H200 reached through the device tool (or any Hopper box).

    source .gpu/env.sh; python3 scripts/gpu_check.py [--peers] [--graph] [--shapes ...]
        [--weight-dtype bf16,fp32] [--residual] [--overhead] [--ours lib]
        [--part all|gpu|timed|lessons] [--concurrency K] [--skip-bench]

1. `quack-edu doctor` (must say GPU mode);
2. the tests (``test_plan``): ``--part gpu`` the `gpu`-marked ones that only check values
   (every stage's values against the fp32 reference, one process per stage; the fuzz tests;
   the library's and the grader's value tests); ``--part timed`` the `gpu` tests that time
   something (the grader's speed tier, the bench's tests), ``--timed-jobs`` processes;
   ``--part lessons`` the grader in GPU mode (grading a solution runs its notebook top to
   bottom), then every other test (the compile checks run with the GPU's own toolchain
   there); ``all`` (default) all three. The value and fuzz runs share the GPU,
   ``--concurrency`` at a time;
3. the benchmark of every stage (and peers) with the D2D copy ceiling measured in the same run;
4. with ``--bench-pass bwd|both``, the backward's benchmark (the library against QuACK and
   torch.compile; with ``--residual`` the prenorm backward, a dresidual_out added, against
   QuACK), bench_bwd.json/png; ``--bench-pass ladder`` instead: the whole ladder in one record
   (``quack-edu bench --pass both``: every stage forward and backward and lesson 04's cluster
   variants, the library and every installed peer, a bf16 and an fp32 weight unless
   ``--weight-dtype``, CUDA-graph rows up to N = 2048), ladder.json and its three PNGs (~7
   minutes on an H200 at ``--rounds 2``).
Writes doctor.txt, tests.log (running/NAME.log while a run runs), bench.log, bench.json and
bench.png under $OUT (default ./out) and prints a short table and the bench's verdict
(``--ours`` against QuACK, the best peer and the copy) last. The device tool stops a command
after 10 minutes: there, run the tests in three calls (``--part gpu``, ``--part timed``,
``--part lessons``, each with ``--skip-bench``) and the bench in a fourth. On the H200: the
stage value runs and the fuzz tests ~150 s at ``--concurrency 3`` (2026-12-03); the 418 other
value tests 252 s at ``--jobs`` 10 (2026-12-03; unfinished in ~280 s at 6, and every `gpu` test
under one pytest at 15 ran out of GPU memory, 2026-12-02); the timed tests 208 s at 3
processes and the latency test 8 s alone (2026-12-03; the speed checks read 32% of the copy
at 14); the grader 165 s at 12 (2026-12-03); every other test in GPU mode 183 s at ``--jobs``
12 (2026-12-03).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = "32768x256,32768x1024,32768x4096,32768x8192,32768x16384"
# gpu test files that only check values (nothing timed): they share the GPU under xdist.
# The rest (the bench's tests, the grader's speed tier) time things: --timed-jobs processes.
#: the ladder's stages (--bench-pass ladder): every stage of both passes and lesson 04's two
#: cluster variants
LADDER_STAGES = "all,cluster@hold,cluster@late"
VALUE_ONLY = (
    "tests/test_grading_exercises.py",
    "tests/test_rmsnorm_gpu.py",
    "tests/test_rmsnorm_bwd_gpu.py",
    "tests/test_bad_inputs.py",
    "tests/test_bwd_strategies.py",
    "tests/test_cluster_guards.py",
    "tests/test_compile_cache.py",
    "tests/test_distributed.py",
)
# gpu tests that time single loads (latency): the bench tests' traffic beside them evicts the L2
# they measure (2026-12-03: a 16 MiB chase read 352 ns, the record's 145, at 3 processes), so
# they run last, alone on the GPU.
ALONE = ("tests/test_latency.py",)


def sh(cmd, log: Path, timeout=None) -> tuple[int, str, float]:
    """Run ``cmd`` in the repository root: (return code, its output, seconds). The output
    (stdout and stderr as they come, unbuffered) goes into ``log`` while it runs, so that a
    device call cut off still brings back what it had printed; 124 when ``timeout`` ran out."""
    t = time.time()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as f:
        try:
            done = subprocess.run(
                cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env
            )
            rc, tail = done.returncode, ""
        except subprocess.TimeoutExpired:
            rc, tail = 124, f"\n[timed out after {timeout} s]"
    text = log.read_text(errors="replace") + tail
    log.write_text(text)
    return rc, text, time.time() - t


def bench_commands(a, out: Path, py: str) -> list[tuple[str, list[str], Path]]:
    """(name, command, its JSON) of the benchmarks asked for: the forward (``--stages``,
    ``--peers``) and, with ``--bench-pass bwd|both``, the backward (the library against QuACK
    and torch.compile). ``--residual`` makes both the pre-norm kind (the backward's with a
    dresidual_out, timed against QuACK) on the residual shapes unless ``--shapes`` says."""
    if a.skip_bench:
        return []
    shapes = a.shapes or (None if a.residual else SHAPES)
    common = ["--shapes", shapes] if shapes else []
    common += ["--graph", "--graph-max-n", a.graph_max_n] if a.graph else []
    common += ["--residual"] if a.residual else []
    common += ["--rounds", str(a.rounds)]
    runs = []
    if a.bench_pass == "ladder":  # the record's command (ladder.json): the bench's own sweep
        # unless --shapes, every stage and lesson 04's cluster variants, CUDA-graph rows up to
        # 2048; no residual kind
        cmd = [py, "-m", "quack_edu", "bench", "--pass", "both", "--stages", LADDER_STAGES]
        cmd += ["--peers", "--weight-dtype", a.weight_dtype or "bf16,fp32"]
        cmd += ["--shapes", a.shapes] if a.shapes else []
        cmd += ["--graph", "--graph-max-n", "2048", "--rounds", str(a.rounds)]
        cmd += ["--rep-budget", "0.08", "--no-progress"]
        runs.append(("ladder", cmd, out / "ladder.json"))
    if a.bench_pass in ("fwd", "both"):
        cmd = [py, "-m", "quack_edu.tools.bench", "--stages", a.stages, "--ours", a.ours]
        cmd += ["--peers", a.peers] if a.peers else []
        cmd += ["--weight-dtype", a.weight_dtype] if a.weight_dtype else []
        cmd += ["--overhead"] if a.overhead else []
        runs.append(("bench", cmd + common, out / "bench.json"))
    if a.bench_pass in ("bwd", "both"):
        cmd = [py, "-m", "quack_edu.tools.bench", "--pass", "bwd", "--stages", "lib", "--peers"]
        cmd += ["quack" if a.residual else "quack,torch-compile"]
        cmd += ["--weight-dtype", a.weight_dtype or "bf16,fp32"]
        runs.append(("bench bwd", cmd + common, out / "bench_bwd.json"))
    for _, cmd, result in runs:
        cmd += ["--json", str(result), "--png", str(result.with_suffix(".png"))]
    if a.bench_pass in ("qk-rows", "host"):  # rows in two modes in place, a call's host cost
        qk = out / "qk_rows.json"
        runs.append(("qk rows", [py, "scripts/bench_qk_rows.py", "--json", str(qk)], qk))
    if a.bench_pass == "host":  # where a training step's host time goes, each norm, each x
        for norm in ("quack_edu", "torch"):
            for extra in ([], ["--strided", "--x-dtype", "bfloat16"]):
                tag = f"{norm}{'_strided' if extra else ''}"
                cmd = [py, "scripts/host_profile.py", "--norm", norm, "--dout", "dense"]
                cmd += [*extra, "--calls", "1500", "--top", "30"]
                runs.append((f"host profile {tag}", cmd, out / f"host_profile_{tag}.txt"))
    if a.bench_pass == "sim":  # ptxsim against the GPU: every simulated kernel's values
        sim = out / "sim_vs_gpu.json"
        runs.append(("sim vs gpu", [py, "scripts/sim_vs_gpu.py", "--out", str(sim)], sim))
    return runs


def bench_summary(path: Path, ours: str) -> str:
    """The bench's table, host costs and verdict, from its JSON: computed from the rows, so that
    a bench cut off by its timeout still gets a verdict over what it measured."""
    if not path.exists():
        return f"(no {path.name})"
    sys.path.insert(0, str(ROOT))
    from quack_edu.tools.bench import (
        format_verdict,
        host_table,
        passes,
        table,
        thresholds_for,
        verdict,
    )

    record, parts = json.loads(path.read_text()), []
    # a ladder record (--pass both) holds one result a pass (only the forward's while the run
    # is cut off in its forward)
    for result in passes(record):
        parts += [table(result), host_table(result)]
        thresholds = thresholds_for(result.get("pass", "fwd"))  # the backward has its own bar
        parts.append(format_verdict(verdict(result["rows"], ours=ours, **thresholds)))
    return "\n".join(p for p in parts if p)


def test_plan(a, stages) -> list[tuple[str, list[str], bool]]:
    """(name, pytest arguments, may run concurrently) of every test run ``--part`` asks for.

    One pytest process per stage for the value tests, each under a timeout: a kernel that hangs
    (a cluster barrier that never completes) costs that stage's tests, not the whole call.
    Those and the fuzz tests only check values, so they share the GPU, ``--concurrency`` at a
    time; the other runs bring processes of their own (the timed gpu tests, the grader's speed
    tier and the bench tests, ``--timed-jobs``; the grader, ``--grading-jobs``; the rest,
    ``--jobs``) and run one by one after them. ``ALONE``'s tests (latency) run by themselves.
    """
    gpu, xdist = ["-m", "gpu"], ["-n", str(a.jobs)]
    runs = []
    if a.part == "boundary":  # 10 processes ran the GPU out of memory (2026-12-06, an H100)
        grader = [
            "tests/test_cheats.py",
            "tests/test_grading_exercises.py",
            "tests/test_sandbox.py",
        ]
        # -v: each test's name and verdict as it ends (a run cut off still names its failures)
        sel = ["-k", a.grading_k] if a.grading_k else []
        return [("boundary", [*gpu, "-n", "6", "-v", "-rf", *grader, *sel], False)]
    timed = [f"--ignore={t}" for t in a.parallel_tests.split()]
    timed += ["--ignore=tests/test_stages_gpu.py", "--ignore=tests/test_fuzz_gpu.py"]
    timed += [f"--ignore={t}" for t in ALONE]
    if a.part in ("all", "gpu"):
        for s in stages:  # the final stage has the most configs to compile: 3 workers
            many = ["-n", "3"] if s == "final" else []
            runs.append((f"values:{s}", [*gpu, *many, "tests/test_stages_gpu.py", "-k", s], True))
        if not a.skip_fuzz:  # hypothesis, >= 500 cases each way, on its own longer timeout
            runs.append(("fuzz", [*gpu, "-s", "-rA", "tests/test_fuzz_gpu.py"], True))
        if a.parallel_tests:  # correctness only (no timing): several processes share the GPU
            runs.append(("gpu tests (parallel)", [*gpu, *xdist, *a.parallel_tests.split()], False))
    if a.part in ("all", "timed") and a.tests != "none":  # they time: few processes at once
        few = ["-n", str(a.timed_jobs)] if a.timed_jobs > 1 else []
        runs.append(("other gpu tests", [*gpu, *few, *a.tests.split(), *timed], False))
        runs.append(("gpu tests (alone)", [*gpu, *ALONE], False))
    if a.part in ("all", "lessons"):
        # The grader with both tiers: solutions get full points (which is also their run top
        # to bottom in GPU mode), students 0; without Jupyter there, in a child Python.
        grading = "tests/test_grading_cli.py"
        if a.grading_k != "none":
            sel = ["-k", a.grading_k] if a.grading_k else []
            many = ["-n", str(a.grading_jobs)]
            runs.append(("grading", ["-m", "not gpu", *many, grading, *sel], False))
        if not a.skip_other_tests:  # every other test, in GPU mode (the compile checks too)
            rest = [f"--ignore={grading}"]
            runs.append(("other tests", ["-m", "not gpu", *xdist, "tests", *rest], False))
    return runs


def run_tests(runs, a, out: Path, summary: list) -> None:
    """Run ``test_plan``'s runs; print each one's tail and keep its log in tests.log (written
    after every run: a call cut off still brings back what ran)."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    logs = {}

    live = out / "running"  # each run's output as it comes (a call cut off keeps it)
    live.mkdir(exist_ok=True)

    def one(name, args):
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
        log = live / (re.sub(r"[^\w]+", "_", name).strip("_") + ".log")
        timeout = a.fuzz_timeout if name == "fuzz" else a.test_timeout
        return (name, *sh(cmd, log, timeout=timeout))

    def report(name, rc, text, dt):
        tail = [ln for ln in text.strip().splitlines() if ln.strip()]
        logs[name] = f"==== {name} (rc={rc}, {dt:.0f} s)\n{text}"
        print(f"==== {name}: rc={rc} {dt:.0f} s", flush=True)
        print("\n".join(tail[-15:]), flush=True)
        # pytest's own verdict line, not a warning printed after it
        verdict = [ln for ln in tail if re.search(r"\b(passed|failed|error|skipped)\b", ln)]
        summary.append((name, (verdict or tail or [f"rc={rc}"])[-1][:120], dt))
        order = [n for n, _, _ in runs]
        (out / "tests.log").write_text("\n".join(logs[n] for n in order if n in logs))

    together = [(n, args) for n, args, concurrent in runs if concurrent]
    with ThreadPoolExecutor(max_workers=max(1, a.concurrency)) as pool:
        for fut in as_completed([pool.submit(one, *r) for r in together]):
            report(*fut.result())
    for name, args, concurrent in runs:
        if not concurrent:
            report(*one(name, args))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--peers", nargs="?", const="all", default=None, help="peers to benchmark")
    p.add_argument("--graph", action="store_true", help="also time through CUDA graphs")
    p.add_argument("--graph-max-n", default="4096", help="graph timing up to this N")
    p.add_argument("--stages", default="all")
    p.add_argument(
        "--shapes",
        default=None,
        help=f"bench shapes (default {SHAPES}; with --residual the bench's residual shapes)",
    )
    p.add_argument("--weight-dtype", default=None, help="bench: bf16, fp32, bf16,fp32 or same")
    p.add_argument("--residual", action="store_true", help="bench: the pre-norm residual table")
    p.add_argument(
        "--overhead", action="store_true", help="bench: host cost per call, first-call time"
    )
    p.add_argument("--ours", default="lib", help="the kernel the bench's verdict judges")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="bench: every kernel timed in turn, this many times (3 for a recorded run; 1 keeps "
        "the one call within the device's 10 minutes)",
    )
    p.add_argument(
        "--bench-pass",
        choices=("fwd", "bwd", "both", "ladder", "qk-rows", "host", "sim"),
        default="fwd",
        help="bench the forward (--stages, --peers), the backward (lib against QuACK and "
        "torch.compile, bench_bwd.json/png), both, the whole ladder in one record "
        "(bench --pass both: ladder.json/png), or qk-rows (scripts/bench_qk_rows.py: a fused "
        "projection's q rows in place against contiguous, and a training call's host cost), host "
        "(qk-rows and scripts/host_profile.py of both norms, contiguous and strided) or sim "
        "(scripts/sim_vs_gpu.py: ptxsim's values against the GPU's, every simulated kernel)",
    )
    p.add_argument(
        "--tests", default="tests", help="pytest paths for the other gpu tests (none: skip)"
    )
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument(
        "--skip-other-tests",
        action="store_true",
        help="without the not-gpu tests beyond the grader's",
    )
    p.add_argument("--skip-fuzz", action="store_true", help="without tests/test_fuzz_gpu.py")
    p.add_argument("--fuzz-timeout", type=int, default=400, help="seconds for the fuzz tests")
    p.add_argument(
        "--parallel-tests",
        default=" ".join(VALUE_ONLY),
        help="gpu tests that only check values: run under pytest-xdist (--jobs processes)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=10,
        help="pytest-xdist processes of the runs that use them (15 run out of GPU memory)",
    )
    p.add_argument(
        "--timed-jobs",
        type=int,
        default=3,
        help="processes of the timed gpu tests (--part timed); more share the GPU too much",
    )
    p.add_argument(
        "--grading-jobs", type=int, default=12, help="pytest-xdist processes of the grader's run"
    )
    p.add_argument("--grading-k", default=None, help="-k filter of the grading tests (none: skip)")
    p.add_argument("--value-stages", default=None, help="stages whose value tests run (all)")
    p.add_argument(
        "--concurrency",
        type=int,
        default=3,
        help="value and fuzz processes at a time (they only check values; 1: one by one)",
    )
    p.add_argument(
        "--part",
        choices=("all", "gpu", "timed", "lessons", "boundary"),
        default="all",
        help="gpu: the gpu tests that check values (stage values, fuzz, the others); timed: "
        "the gpu tests that time (the grader's speed tier, the bench's); lessons: the grader "
        "(the solution notebooks top to bottom) and every other (not gpu) test in GPU mode; "
        "all: the three, one after the other; boundary (alone): the grader's boundary on the "
        "GPU (the cheat, sandbox and exercise tests' gpu tier, 6 processes), then a made-up "
        "class graded serially and with -j 4 (scripts/class_check.py, --class-students)",
    )
    p.add_argument("--class-students", type=int, default=30)
    p.add_argument(
        "--landlock",
        choices=("default", "on", "off"),
        default="default",
        help="QUACK_EDU_LANDLOCK for the learner processes (grading/confine.py; default: off in "
        "GPU mode until verified there)",
    )
    p.add_argument("--class-lesson", default="00_setup_and_roofline")
    p.add_argument(
        "--class-jobs",
        default="1,4",
        help="the class's -j values, graded in turn (30 students of lesson 00 on an H100: "
        "-j 1 needs most of a device call alone)",
    )
    p.add_argument("--class-timeout", type=int, default=560, help="seconds for the class")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--test-timeout", type=int, default=300, help="seconds per pytest process")
    p.add_argument("--bench-timeout", type=int, default=300)
    return p


def main() -> int:
    a = parser().parse_args()
    if a.landlock != "default":  # the learner processes the tests and the class start inherit it
        os.environ["QUACK_EDU_LANDLOCK"] = "1" if a.landlock == "on" else "0"
    out = Path(os.environ.get("OUT", ROOT / "out"))
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    summary = []

    rc, text, dt = sh([py, "-m", "quack_edu", "doctor"], out / "doctor.txt", timeout=120)
    print(text, flush=True)
    mode = "GPU" if "Mode: GPU" in text else "compile-only"
    summary.append(("doctor", f"rc={rc}, mode {mode}", dt))

    if not a.skip_tests:
        sys.path.insert(0, str(ROOT))
        from quack_edu.stages import STAGE_ORDER

        stages = (
            STAGE_ORDER
            if not a.value_stages
            else [s for s in a.value_stages.split(",") if s != "none"]
        )
        run_tests(test_plan(a, stages), a, out, summary)
    if a.part == "boundary" and a.class_students > 0:
        cmd = [py, "scripts/class_check.py", "--jobs", a.class_jobs, "--lesson", a.class_lesson,
               "--students", str(a.class_students), "--out", str(out / "class_check")]  # fmt: skip
        rc, text, dt = sh(cmd, out / "class_check.log", timeout=a.class_timeout)
        print(text[-3000:], flush=True)
        summary.append(("class check", f"rc={rc}", dt))

    bench_table = ""
    for name, cmd, result in bench_commands(a, out, py):
        result.unlink(missing_ok=True)  # never report an earlier run's numbers
        rc, text, dt = sh(cmd, result.with_suffix(".log"), timeout=a.bench_timeout)
        print(text[-6000:], flush=True)
        summary.append((name, f"rc={rc}", dt))
        if name == "qk rows" or name.startswith(("host profile", "sim vs")):  # own records,
            continue  # printed as they ran
        bench_table += ("\n" if bench_table else "") + bench_summary(
            result, a.ours if name == "bench" else "lib"
        )

    print("\n==== summary ====")
    for name, what, dt in summary:
        print(f"{name:<22} {dt:6.0f} s  {what}")
    print(bench_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
