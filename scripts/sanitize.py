#!/usr/bin/env python3
"""Every kernel of the project under compute-sanitizer's four tools, in one call.

    source .gpu/env.sh; python3 scripts/sanitize.py [--tools memcheck,racecheck,...]
        [--cases 'cluster:*,lib_bwd:*'] [--timeout S] [--jobs J] [--batch kernel|case|tool]
        [--json PATH] [--log-dir DIR] [--racecheck-report hazard|analysis|all] [--list]
        [--compile-only]

The kernels: every forward stage (``quack_edu.stages.STAGE_ORDER``), the library's forward
with bias, an fp32 (bf16 next to fp32 x) residual and ``store_rstd`` ("lib_fwd"), the same
with a bias and no weight ("lib_fwd_bias": its own kernel, the bias slice alone in shared
memory), and the library's backward with ``has_bias``, a ``dresidual_out`` (fp32, so that a
separate dresidual is written too) and ``has_residual`` ("lib_bwd"), and lesson 07's atomic dw
("bwd_atomic": ``FinalBwdAtomic``). Each at small, ragged and
cluster-sized shapes, with the weight (or bias) in x's dtype and in fp32 (bf16 for fp32 x):
104 cases, ``--list`` prints them.

The tools, and why their options:

* memcheck ``--report-api-errors no``: the CUDA runtime probes ``cuGetProcAddress_v2`` for
  symbols the driver may not have; memcheck counts each failed probe (34 here) as an error
  although no kernel is involved.
* racecheck ``--racecheck-report hazard``: every shared-memory hazard is reported and counted
  on its own, errors and warnings alike (the default detect level, ``warn``); a warning (a
  "Potential RAW hazard" without a barrier between) counts as a failure here.
* synccheck, initcheck: as they come. initcheck also catches an output element that a
  kernel leaves unwritten, when the value check then reads it.
* every tool ``--print-limit 0``: by default a process prints its first 100 reports only,
  and the summary's total could then not be split between its cases (a case's count comes
  from the reports printed while it ran).

The child checks values on the host (``_host``): torch's reduction kernels, run on the GPU
for a reference, would be sanitized too, and racecheck reports hazards in them.

How it runs. A child mode launches kernel cases (``--child CASE...``): for each, the kernel is
compiled first, then launched once, then ``torch.cuda.synchronize()`` and its values are
checked against ``quack_edu.reference``. The parent runs
``compute-sanitizer --tool T [options] python scripts/sanitize.py --child ...`` and parses the
tool's summary (``ERROR SUMMARY: n errors``; racecheck's ``RACECHECK SUMMARY: n hazards
displayed (e errors, w warnings)``).

Batching (``--batch``). Every process pays for its start before its first kernel (importing
torch and CuTe DSL, ~3 s, then the CUDA context and module loads under the sanitizer) and
compiles the kernels of its cases (0.2-1.2 s each), so one process per (tool, case), 288 of
them, would spend most of its time starting. The default runs one process per (tool, kernel),
the 8-12 cases of that kernel in a row (32 processes), ``--jobs`` at a time. Each
tool's summary is per process: a case's own count comes from the reports printed between its
begin and end markers (a report printed after a case's end, before the next begins, is that
case's: reports come when a kernel completes). ``--batch case`` gives every case a summary of
its own (to confirm a finding); ``--batch tool`` is one process per tool (fastest, least
isolated). A case that hangs is stopped by a per-case watchdog in the child (``--timeout``
seconds), and the cases that did not run are run again in a fresh process, once.

Exit code: 0 when every summary says 0 errors (and 0 racecheck warnings), every report is
zero and every case ran and matched the reference; 1 otherwise; 2 when there is no
compute-sanitizer or no Hopper GPU (nothing was checked).
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
TOOL_ARGS = {
    "memcheck": ["--report-api-errors", "no"],
    "racecheck": ["--racecheck-report", "hazard"],
    "synccheck": [],
    "initcheck": [],
}
#: (M, N, x dtype): ragged and small, one-CTA rows, cluster-sized rows, fp32
SHAPES = ((37, 4104, "bf16"), (5, 65544, "bf16"), (3, 131072, "fp16"), (9, 3000, "fp32"))
#: the library also at a row of 7 (narrow vectors, a single row), an odd N with many rows, a
#: short row that 512-thread CTAs of the backward hold 16 at a time and a long row with the
#: forward's residual plan (clusters of 4 walking row blocks)
LIB_SHAPES = SHAPES + ((1, 7, "bf16"), (199, 1001, "fp16"), (199, 512, "bf16"), (41, 60000, "bf16"))
LIBRARY = ("lib_fwd", "lib_fwd_bias", "lib_bwd", "bwd_atomic")
EPS = 1e-6
MARK = "@@sanitize"
#: what the process needs before its first case (imports, CUDA context under the sanitizer)
STARTUP_S = 120
NOT_FOUND = 2


# ---------------------------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    kernel: str  # a stage name, or one of LIBRARY
    M: int
    N: int
    dtype: str  # bf16, fp16, fp32 (x)
    wdtype: str  # the weight's

    @property
    def id(self) -> str:
        return f"{self.kernel}:{self.M}x{self.N}:{self.dtype}:{self.wdtype}"

    @classmethod
    def parse(cls, text: str) -> Case:
        """``kernel:MxN:dtype:wdtype`` (what ``id`` gives)."""
        try:
            kernel, shape, dtype, wdtype = text.split(":")
            M, N = (int(v) for v in shape.lower().split("x"))
        except ValueError:
            raise ValueError(f"a case is KERNEL:MxN:DTYPE:WDTYPE, got {text!r}") from None
        for dt in (dtype, wdtype):
            if dt not in ("bf16", "fp16", "fp32"):
                raise ValueError(f"dtype {dt!r} in {text!r}: one of bf16, fp16, fp32")
        return cls(kernel, M, N, dtype, wdtype)


def weight_dtypes(dtype: str) -> tuple[str, str]:
    """Both weight dtypes: x's and fp32 (for fp32 x, fp32 and bf16)."""
    return (dtype, "fp32") if dtype != "fp32" else ("fp32", "bf16")


def all_cases(stages) -> list[Case]:
    cases = []
    for kernel in (*stages, *LIBRARY):
        for M, N, dtype in LIB_SHAPES if kernel in LIBRARY else SHAPES:
            cases += [Case(kernel, M, N, dtype, w) for w in weight_dtypes(dtype)]
    return cases


def _import_path() -> None:
    """This checkout's quack_edu first (as scripts/gpu_check.py)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def stage_order() -> tuple[str, ...]:
    _import_path()
    from quack_edu.stages import STAGE_ORDER

    return tuple(STAGE_ORDER)


def select_cases(cases: list[Case], patterns: str | None) -> list[Case]:
    """Cases whose id matches one of the comma-separated patterns: a glob (``cluster:*``,
    ``*:fp32``) or else a prefix of the id (``lib_bwd``, ``final:37x4104``)."""
    if not patterns:
        return list(cases)
    pats = [p.strip() for p in patterns.split(",") if p.strip()]

    def hit(case: Case, p: str) -> bool:
        if any(c in p for c in "*?["):
            return fnmatch.fnmatchcase(case.id, p)
        return case.id == p or case.id.startswith(p if p.endswith(":") else p + ":")

    return [c for c in cases if any(hit(c, p) for p in pats)]


def plan(cases: list[Case], tools, batch: str) -> list[tuple[str, tuple[Case, ...]]]:
    """(tool, cases) per process: one per (tool, kernel), (tool, case) or tool."""
    runs = []
    for tool in tools:
        if batch == "case":
            runs += [(tool, (c,)) for c in cases]
        elif batch == "tool":
            runs.append((tool, tuple(cases)))
        else:
            kernels = dict.fromkeys(c.kernel for c in cases)
            runs += [(tool, tuple(c for c in cases if c.kernel == k)) for k in kernels]
    return runs


# ---------------------------------------------------------------------------------------------
# Finding compute-sanitizer
# ---------------------------------------------------------------------------------------------

SEARCH_GLOBS = (
    "/usr/local/cuda/bin/compute-sanitizer",
    "/usr/local/cuda/compute-sanitizer/compute-sanitizer",
    "/usr/local/cuda-*/bin/compute-sanitizer",
    "/usr/local/cuda-*/compute-sanitizer/compute-sanitizer",
    "/opt/cuda*/bin/compute-sanitizer",
)


def _version_key(path: str):
    return [int(n) for n in re.findall(r"\d+", path)]


def find_sanitizer(explicit: str | None = None, env=None, globs=SEARCH_GLOBS):
    """(path or None, where it looked). Order: ``--sanitizer``, $COMPUTE_SANITIZER, PATH, the
    CUDA toolkits under /usr/local (the newest first), the pip wheel's copy next to Python."""
    env = os.environ if env is None else env
    looked = []
    for given in (explicit, env.get("COMPUTE_SANITIZER")):
        if given:
            looked.append(given)
            return (given if os.access(given, os.X_OK) else None), looked
    looked.append(f"PATH={env.get('PATH', '')}")
    hit = shutil.which("compute-sanitizer", path=env.get("PATH", ""))
    if hit:
        return hit, looked
    wheel = [  # the pip wheel nvidia-cuda-sanitizer-api, next to this Python's packages
        os.path.join(p, "nvidia", "cuda_sanitizer_api", "compute-sanitizer", "compute-sanitizer")
        for p in dict.fromkeys(sys.path)
        if p.endswith(("site-packages", "dist-packages"))
    ]
    for pattern in (*globs, *wheel):
        looked.append(pattern)
        found = sorted(glob.glob(pattern), key=_version_key, reverse=True)
        for path in found:
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path, looked
    return None, looked


def not_found_message(looked) -> str:
    where = "\n  ".join(looked)
    return (
        "compute-sanitizer not found; nothing was checked. It comes with the CUDA toolkit "
        "(bin/compute-sanitizer) or the pip wheel nvidia-cuda-sanitizer-api. Put it on PATH, "
        f"set COMPUTE_SANITIZER=/path/to/compute-sanitizer or pass --sanitizer PATH.\n"
        f"Looked in:\n  {where}"
    )


# ---------------------------------------------------------------------------------------------
# Reading the tools' output (pure functions: tests/test_sanitize_script.py)
# ---------------------------------------------------------------------------------------------

_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+errors?")
_RACE_SUMMARY = re.compile(
    r"RACECHECK SUMMARY:\s*(\d+)\s+hazards?\s+displayed\s*\(\s*(\d+)\s+errors?\s*,\s*"
    r"(\d+)\s+warnings?\s*\)"
)
#: a report's first line: the prefix, one space, text (its other lines are indented)
_RECORD = re.compile(r"^=+ (?P<body>\S.*)$")
#: first lines that are the tool talking, not a finding in the program
_NOT_A_FINDING = re.compile(
    r"COMPUTE-SANITIZER|SUMMARY:|^Target application returned an error"
    r"|^Error: process didn't terminate successfully|^Maximum number of"
    r"|^Warning: Maximum number of|^The application may have hit an error"
    r"|^Note:|^Generating|^No \S+ (errors|results)",
    re.IGNORECASE,
)
_MARK = re.compile(re.escape(MARK) + r" (?P<what>begin|end|nogpu)(?: (?P<rest>.*))?$")


@dataclass
class Summary:
    errors: int
    warnings: int = 0
    hazards: int | None = None  # racecheck: hazards displayed
    line: str = ""  # the summary line, verbatim


def parse_summary(tool: str, text: str) -> Summary | None:
    """The tool's summary (the last one printed), or None when there is none (the tool did not
    finish: a timeout, a crash of the sanitizer, an option it refused)."""
    if tool == "racecheck":
        found = list(_RACE_SUMMARY.finditer(text))
        if not found:
            return None
        m = found[-1]
        hazards, errors, warnings = (int(g) for g in m.groups())
        return Summary(errors, warnings, hazards, _line_of(text, m))
    found = list(_ERROR_SUMMARY.finditer(text))
    if not found:
        return None
    return Summary(int(found[-1].group(1)), 0, None, _line_of(text, found[-1]))


def _line_of(text: str, m: re.Match) -> str:
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    return text[start : end if end >= 0 else len(text)].strip()


def classify_record(tool: str, line: str) -> str | None:
    """ "error", "warning" (racecheck), "info" or None (not a report's first line)."""
    m = _RECORD.match(line.rstrip())
    if not m:
        return None
    body = m.group("body")
    if _NOT_A_FINDING.search(body):
        return None
    if tool == "racecheck":
        if not re.search(r"hazard|race", body, re.IGNORECASE):
            return None
        if re.match(r"warn", body, re.IGNORECASE):
            return "warning"
        if re.match(r"info", body, re.IGNORECASE):
            return "info"
        return "error"
    return "error"


@dataclass
class CaseResult:
    status: str = "not run"  # ok, FAIL, skip, running -> timeout / crash, not run
    errors: int = 0
    warnings: int = 0
    detail: str = ""
    first_report: str = ""
    first_report_kernel: str = ""  # where the first report points (a kernel's name)


@dataclass
class RunReport:
    tool: str
    case_ids: list[str]
    status: str  # ok, findings, failed, timeout, crash, no summary, no GPU, missing
    summary: Summary | None
    cases: dict[str, CaseResult]
    outside: int = 0  # reports printed outside every case (process start or exit)
    rc: int | None = None
    elapsed: float = 0.0
    command: list[str] = field(default_factory=list)
    note: str = ""


#: a report's location line: "Write Thread (31,0,0) at kernel+0xf0", "at 0x90 in kernel"
_AT_KERNEL = re.compile(r"\b(?:at|in) (?:void )?(?!block\b)([A-Za-z_][\w:]*)")


def attribute(tool: str, text: str, case_ids) -> tuple[dict[str, CaseResult], int, str]:
    """Per case: its child status and the reports printed while it was the latest case begun.
    Returns (cases, reports outside every case, the nogpu reason or "")."""
    cases = {cid: CaseResult() for cid in case_ids}
    current, outside, nogpu = None, 0, ""
    first_pending = False
    for raw in text.splitlines():
        m = _MARK.search(raw)
        if m:
            what, rest = m.group("what"), (m.group("rest") or "").strip()
            if what == "nogpu":
                nogpu = rest or "no Hopper GPU"
                continue
            cid, _, tail = rest.partition(" ")
            res = cases.setdefault(cid, CaseResult())
            if what == "begin":
                current, res.status = cid, "running"
            else:
                status, _, detail = tail.partition(" ")
                res.status, res.detail = status or "ok", detail
            continue
        kind = classify_record(tool, raw)
        if kind in ("error", "warning"):
            if current is None:
                outside += 1
                continue
            res = cases[current]
            if kind == "error":
                res.errors += 1
            else:
                res.warnings += 1
            if not res.first_report:
                res.first_report, first_pending = raw.strip(), True
            continue
        if first_pending and current is not None:  # the report's next line names the kernel
            m = _AT_KERNEL.search(raw)
            if m:
                cases[current].first_report_kernel = m.group(1)[:80]
                first_pending = False
    return cases, outside, nogpu


def analyse(tool, case_ids, text, rc, timed_out=False, missing=False) -> RunReport:
    """A process's outcome from its output, exit code and whether it was cut off."""
    if missing:
        cases = {cid: CaseResult() for cid in case_ids}
        return RunReport(tool, list(case_ids), "missing", None, cases, rc=rc, note=text)
    summary = parse_summary(tool, text)
    cases, outside, nogpu = attribute(tool, text, case_ids)
    for res in cases.values():
        if res.status == "running":  # begun, never ended: the watchdog or a crash
            res.status = "timeout" if timed_out or "Timeout (" in text else "crash"
    statuses = {r.status for r in cases.values()}
    if nogpu:
        status = "no GPU"
    elif timed_out:
        status = "timeout"
    elif summary is None:
        status = "no summary"
    elif statuses & {"crash", "timeout"}:
        status = "crash"
    elif (
        summary.errors
        or summary.warnings
        or outside
        or any(r.errors or r.warnings for r in cases.values())
    ):
        status = "findings"
    elif statuses - {"ok", "skip"}:
        status = "failed"
    else:
        status = "ok"
    return RunReport(tool, list(case_ids), status, summary, cases, outside, rc, note=nogpu)


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------


def cell(tool: str, res: CaseResult | None) -> str:
    if res is None:
        return "-"
    if res.status in ("ok", "FAIL"):
        counts = f"{res.errors}/{res.warnings}" if tool == "racecheck" else str(res.errors)
        return counts if res.status == "ok" else counts + " FAIL"
    return res.status


def case_table(cases, tools, results: dict) -> tuple[str, bool]:
    """One line per case with each tool's count (racecheck: errors/warnings) and whether the
    values matched the reference under every tool; a total line. ``results``:
    {(tool, case id): CaseResult}. Returns (text, every case clean)."""
    head = ["case", *tools, "values"]
    rows, clean = [], True
    totals = {t: [0, 0] for t in tools}
    for case in cases:
        got = [results.get((tool, case.id)) for tool in tools]
        statuses = [r.status if r is not None else "not run" for r in got]
        if "FAIL" in statuses:
            values = "FAIL"
        elif all(s == "skip" for s in statuses):
            values = "skip"
        elif all(s in ("ok", "skip") for s in statuses):
            values = "ok"
        else:
            values = "?"
        for tool, res in zip(tools, got, strict=True):
            if res is not None:
                totals[tool][0] += res.errors
                totals[tool][1] += res.warnings
                clean &= not (res.errors or res.warnings)
        clean &= values in ("ok", "skip")
        rows.append([case.id, *(cell(t, r) for t, r in zip(tools, got, strict=True)), values])
    total = ["total"]
    for tool in tools:
        e, w = totals[tool]
        total.append(f"{e}/{w}" if tool == "racecheck" else str(e))
    total.append("ok" if clean else "FAIL")
    widths = [max(len(r[i]) for r in [head, *rows, total]) for i in range(len(head))]

    def fmt(r):
        return "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()

    lines = [fmt(head), fmt(["-" * w for w in widths]), *map(fmt, rows), fmt(total)]
    return "\n".join(lines), clean


def run_lines(reports: list[RunReport]) -> str:
    """Per process: the tool, its cases, the time and the tool's own summary, verbatim."""
    out = []
    for r in reports:
        kernels = ",".join(dict.fromkeys(cid.split(":")[0] for cid in r.case_ids))
        what = r.summary.line if r.summary else f"(no summary: {r.status})"
        extra = f"  [{r.outside} reports outside any case]" if r.outside else ""
        extra += f"  [{r.note}]" if r.note and r.status != "ok" else ""
        out.append(
            f"{r.tool:<9} {kernels:<18} {len(r.case_ids):>3} cases {r.elapsed:6.1f} s  "
            f"{r.status:<10} {what}{extra}"
        )
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# The parent: run the tools
# ---------------------------------------------------------------------------------------------


def child_command(cases, case_timeout: float) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        *(c.id for c in cases),
        "--timeout",
        str(case_timeout),
    ]


def tool_args(tool: str) -> list[str]:
    """The options every run of ``tool`` gets (``--print-limit 0``: see the module docstring)."""
    return [*TOOL_ARGS[tool], "--print-limit", "0"]


def sanitizer_command(
    sanitizer: str, tool: str, child: list[str], extra=(), race_report: str = "hazard"
) -> list[str]:
    args = tool_args(tool)
    if tool == "racecheck":
        args[args.index("--racecheck-report") + 1] = race_report
    return [sanitizer, "--tool", tool, *args, *extra, *child]


def run_process(cmd, timeout: float, env=None) -> tuple[str, int | None, bool, bool, float]:
    """(output, rc, timed out, missing binary, seconds). The process runs in a session of its
    own so that a timeout stops the sanitizer and the Python under it together."""
    t0 = time.time()
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
    except (FileNotFoundError, PermissionError) as e:
        return f"{type(e).__name__}: {e}", None, False, True, time.time() - t0
    try:
        out, _ = proc.communicate(timeout=timeout)
        return out, proc.returncode, False, False, time.time() - t0
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        out += f"\n[{MARK}: killed after {timeout:.0f} s]"
        return out, proc.returncode, True, False, time.time() - t0


def sanitizer_version(sanitizer: str) -> str:
    try:
        done = subprocess.run([sanitizer, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(--version failed: {e})"
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "(no version)"


def run_all(args, cases, tools, sanitizer) -> tuple[list[RunReport], bool]:
    """Every (tool, batch) process, ``--jobs`` at a time; the cases a timeout or a crash kept
    from running go again in a fresh process, once. Returns (reports, a GPU was there)."""
    log_dir = Path(args.log_dir) if args.log_dir else None
    if log_dir:
        log_dir.mkdir(parents=True, exist_ok=True)
    extra = args.sanitizer_args.split() if args.sanitizer_args else []
    queue = [(tool, batch, False) for tool, batch in plan(cases, tools, args.batch)]
    reports: list[RunReport] = []
    nogpu = ""

    def job(tool, batch, retry):
        child = child_command(batch, args.timeout)
        cmd = sanitizer_command(sanitizer, tool, child, extra, args.racecheck_report)
        limit = STARTUP_S + args.timeout * len(batch)
        out, rc, timed_out, missing, dt = run_process(cmd, limit)
        report = analyse(tool, [c.id for c in batch], out, rc, timed_out, missing)
        report.elapsed, report.command = dt, cmd
        if log_dir:
            kernels = "+".join(dict.fromkeys(c.kernel for c in batch))
            name = f"{tool}-{kernels}" if len(batch) > 1 else f"{tool}-{batch[0].id}"
            name = re.sub(r"[^A-Za-z0-9_.+-]", "_", name) + ("-retry" if retry else "")
            (log_dir / f"{name}.log").write_text(" ".join(cmd) + "\n\n" + out)
        return report

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        pending = {pool.submit(job, *q): q for q in queue}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                tool, batch, retry = pending.pop(fut)
                report = fut.result()
                reports.append(report)
                print(run_lines([report]), flush=True)
                if report.status == "no GPU":
                    nogpu = report.note
                if report.status in ("missing", "no GPU"):
                    for f in pending:
                        f.cancel()
                    continue
                left = tuple(c for c in batch if report.cases[c.id].status == "not run")
                if left and len(left) < len(batch) and not retry:
                    pending[pool.submit(job, tool, left, True)] = (tool, left, True)
            pending = {f: q for f, q in pending.items() if not f.cancelled()}
    return reports, not nogpu


def merge(reports: list[RunReport]) -> dict:
    """{(tool, case id): CaseResult}, a later (retry) run filling what an earlier did not."""
    results = {}
    for r in reports:
        for cid, res in r.cases.items():
            old = results.get((r.tool, cid))
            if old is None or (old.status == "not run" and res.status != "not run"):
                results[(r.tool, cid)] = res
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over every "
        "kernel of quack_edu",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tools", default=",".join(TOOLS), help="comma-separated (default: all 4)")
    p.add_argument("--cases", default=None, help="comma-separated globs or id prefixes")
    p.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds a case may take in the child (compile, launch, check) before it is "
        f"stopped; a process gets {STARTUP_S} s more to start",
    )
    p.add_argument("--jobs", type=int, default=min(8, max(1, (os.cpu_count() or 2) // 2)))
    p.add_argument("--batch", choices=("kernel", "case", "tool"), default="kernel")
    p.add_argument("--json", default=None, help="write every result here")
    p.add_argument("--log-dir", default=None, help="keep each process's full output here")
    p.add_argument("--list", action="store_true", help="print the cases and exit")
    p.add_argument("--sanitizer", default=None, help="path of compute-sanitizer")
    p.add_argument("--sanitizer-args", default="", help="more options for every tool")
    p.add_argument(
        "--racecheck-report",
        choices=("hazard", "analysis", "all"),
        default="hazard",
        help="hazard: every hazard its own report (default); analysis: grouped by location",
    )
    p.add_argument(
        "--compile-only",
        action="store_true",
        help="compile every selected case in this process, no launch (works without a GPU)",
    )
    p.add_argument("--child", nargs="+", metavar="CASE", help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.child:
        return run_child(child_cases(a.child), case_timeout=a.timeout)
    tools = [t.strip() for t in a.tools.split(",") if t.strip()]
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        print(f"unknown tool(s) {unknown}; choose from {', '.join(TOOLS)}", file=sys.stderr)
        return 1
    sanitizer = None
    if not (a.list or a.compile_only):  # say so at once, before importing torch and the DSL
        sanitizer, looked = find_sanitizer(a.sanitizer)
        if sanitizer is None:
            print(not_found_message(looked), file=sys.stderr)
            return NOT_FOUND
    cases = select_cases(all_cases(stage_order()), a.cases)
    if a.list:
        for c in cases:
            print(c.id)
        print(f"{len(cases)} cases", file=sys.stderr)
        return 0
    if not cases:
        print(f"no case matches --cases {a.cases!r} (see --list)", file=sys.stderr)
        return 1
    if a.compile_only:
        return run_child(cases, case_timeout=a.timeout, compile_only=True)
    version = sanitizer_version(sanitizer)
    runs = plan(cases, tools, a.batch)
    print(
        f"{sanitizer} ({version}): {len(cases)} cases x {len(tools)} tools in {len(runs)} "
        f"processes, {a.jobs} at a time (--batch {a.batch})",
        flush=True,
    )
    t0 = time.time()
    reports, gpu = run_all(a, cases, tools, sanitizer)
    if not gpu:
        why = next(r.note for r in reports if r.status == "no GPU")
        print(f"\nno Hopper GPU, nothing was checked: {why}", file=sys.stderr)
        return NOT_FOUND
    if any(r.status == "missing" for r in reports):
        r = next(r for r in reports if r.status == "missing")
        print(f"\ncould not start {sanitizer}: {r.note}", file=sys.stderr)
        return NOT_FOUND
    results = merge(reports)
    table, clean = case_table(cases, tools, results)
    clean &= all(r.status == "ok" for r in reports)
    print(f"\n==== per process ({time.time() - t0:.0f} s in all) ====")
    print(run_lines(sorted(reports, key=lambda r: (tools.index(r.tool), r.case_ids[0]))))
    print("\n==== per case (errors; racecheck errors/warnings) ====")
    print(table)
    firsts = [
        f"{tool} {cid}: {res.first_report}"
        + (f"\n    in {res.first_report_kernel}" if res.first_report_kernel else "")
        for (tool, cid), res in results.items()
        if res.first_report
    ]
    if firsts:
        print("\nfirst report of each case with findings:\n  " + "\n  ".join(firsts))
    failed = [
        f"{tool} {cid}: {res.status} {res.detail}".rstrip()
        for (tool, cid), res in results.items()
        if res.status not in ("ok", "skip")
    ]
    if failed:
        print("\nnot clean:\n  " + "\n  ".join(failed))
    print(f"\n{'CLEAN' if clean else 'NOT CLEAN'}: {sanitizer} ({version})")
    if a.json:
        payload = {
            "sanitizer": sanitizer,
            "version": version,
            "tools": tools,
            "tool_args": {t: tool_args(t) for t in tools},
            "batch": a.batch,
            "clean": clean,
            "cases": [c.id for c in cases],
            "results": {
                f"{tool} {cid}": asdict(res) for (tool, cid), res in sorted(results.items())
            },
            "runs": [asdict(r) for r in reports],
        }
        Path(a.json).write_text(json.dumps(payload, indent=1))
    return 0 if clean else 1


# ---------------------------------------------------------------------------------------------
# The child: compile, launch once, synchronise, check (runs under the sanitizer)
# ---------------------------------------------------------------------------------------------


class Skip(Exception):
    """The kernel does not take this shape (said with its reason)."""


def child_cases(tokens: list[str]) -> list[Case]:
    """``KERNEL SHAPE DTYPE WDTYPE`` (one case) or any number of ``KERNEL:MxN:DTYPE:WDTYPE``."""
    if all(":" not in t for t in tokens):
        if len(tokens) % 4:
            raise SystemExit(
                "--child takes KERNEL SHAPE DTYPE WDTYPE (e.g. final 37x4104 bf16 fp32)"
            )
        tokens = [":".join(tokens[i : i + 4]) for i in range(0, len(tokens), 4)]
    return [Case.parse(t) for t in tokens]


def _dtypes():
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _stage_case(case: Case, device: str):
    """(compile, launch, check) for a forward stage: ``rmsnorm_fwd(x, weight, eps)``."""
    import torch

    from quack_edu import runtime
    from quack_edu.reference import assert_close, rmsnorm_ref
    from quack_edu.stages import get_stage

    dt = _dtypes()
    mod = get_stage(case.kernel)
    dtype, wdtype = dt[case.dtype], dt[case.wdtype]
    limit, align = mod.KERNEL.max_N_for(dtype), mod.KERNEL.row_align_for(dtype)
    if limit is not None and case.N > limit:
        raise Skip(f"N={case.N} > the stage's max_N={limit} for {case.dtype}")
    if case.kernel != "final" and case.N % align:  # final takes any N (narrow vectors)
        raise Skip(f"N={case.N} is not a multiple of the stage's {align}-element vectors")
    x = torch.randn(case.M, case.N, device=device).to(dtype)
    w = torch.randn(case.N, device=device).to(wdtype)
    out = torch.empty_like(x)
    if case.kernel == "final":
        config = None

        def compile_():
            mod.kernel_for(x, w, None, None, out, None, None)
    else:
        config = mod.default_config(case.N, dtype)

        def compile_():
            runtime._compiled(mod.KERNEL, dtype, wdtype, case.N, config)

    def launch():
        mod.rmsnorm_fwd(x, w, EPS, config=config, out=out)

    def check():
        hx, hw, hout = _host(x, w, out)
        assert_close(hout, rmsnorm_ref(hx, hw, eps=EPS), dtype, what=case.id)

    return compile_, launch, check


def _lib_fwd_case(case: Case, device: str):
    """rmsnorm_fwd with a bias, a residual of another dtype (fp32, or bf16 for fp32 x) and
    store_rstd: every tensor the forward reads and writes. "lib_fwd_bias": a bias and no
    weight, no residual (the bias slice alone in shared memory: a kernel of its own)."""
    import importlib

    import torch

    from quack_edu.reference import assert_close, rmsnorm_ref, rstd_ref
    from quack_edu.stages import final

    R = importlib.import_module("quack_edu.rmsnorm")
    dt = _dtypes()
    dtype, wdtype = dt[case.dtype], dt[case.wdtype]
    rdtype = torch.float32 if dtype != torch.float32 else torch.bfloat16
    M, N = case.M, case.N
    x = torch.randn(M, N, device=device).to(dtype)
    bias_only = case.kernel == "lib_fwd_bias"
    w = None if bias_only else torch.randn(N, device=device).to(wdtype)
    b = torch.randn(N, device=device).to(wdtype)
    res = None if bias_only else torch.randn(M, N, device=device).to(rdtype)
    got = {}

    def compile_():  # the kernel rmsnorm_fwd picks for these tensors (outputs like its own)
        out = torch.empty_like(x)
        res_out = None if bias_only else torch.empty_like(x, dtype=rdtype)
        rstd = torch.empty(M, device=device)
        final.kernel_for(x, w, b, res, out, res_out, rstd, 0.0)

    def launch():
        got["out"], got["res_out"], got["rstd"] = R.rmsnorm_fwd(
            x, w, b, res, eps=EPS, store_rstd=True
        )

    def check():
        hx, hw, hb, hres = _host(x, w, b, res)
        if bias_only:  # the sum of squares is over x itself
            out, h = rmsnorm_ref(hx, None, hb, eps=EPS), hx.float()
        else:  # ... over x + residual, which residual_out holds
            out, h = rmsnorm_ref(hx, hw, hb, hres, eps=EPS)
        gout, gres, grstd = _host(got["out"], got["res_out"], got["rstd"])
        assert_close(gout, out, dtype, what=f"{case.id} out")
        if not bias_only:
            assert_close(gres, h, rdtype, what=f"{case.id} residual_out")
        torch.testing.assert_close(grstd, rstd_ref(h, EPS), rtol=1e-4, atol=0)

    return compile_, launch, check


def _lib_bwd_case(case: Case, device: str):
    """rmsnorm_bwd with has_bias, a dresidual_out (fp32: for 16-bit x a separate dresidual is
    written as well) and has_residual. "bwd_atomic": lesson 07's strategy 1 (``FinalBwdAtomic``,
    dw added into one fp32 row with red.global.add), dx and dw of the plain backward."""
    import importlib
    import math

    import torch

    from quack_edu.reference import TOLERANCES, rmsnorm_bwd_ref, rstd_ref
    from quack_edu.stages import final_bwd

    R = importlib.import_module("quack_edu.rmsnorm")
    dt = _dtypes()
    dtype, wdtype = dt[case.dtype], dt[case.wdtype]
    M, N = case.M, case.N
    atomic = case.kernel == "bwd_atomic"
    kernel_cls = final_bwd.FinalBwdAtomic if atomic else final_bwd.FinalBwdRMSNorm
    x = torch.randn(M, N, device=device).to(dtype)
    w = torch.randn(N, device=device).to(wdtype)
    dout = torch.randn(M, N, device=device).to(dtype)
    dres_out = None if atomic else torch.randn(M, N, device=device)
    rstd = rstd_ref(x.cpu(), EPS, torch.float64).float().to(device)
    got = {}

    def compile_():
        # launch_bwd with no row compiles the kernel rmsnorm_bwd picks and launches nothing
        dx = torch.empty_like(x)
        dres = None
        if dres_out is not None and dres_out.dtype != dtype:
            dres = torch.empty_like(x, dtype=dres_out.dtype)
        kernel_cls.launch(
            x[:0], w, dout[:0], None if atomic else dres_out[:0], rstd[:0], dx[:0],
            None if dres is None else dres[:0], not atomic,
        )  # fmt: skip

    def launch():
        if atomic:
            from quack_edu.lessons import bwd_strategies

            got["dx"] = torch.empty_like(x)
            got["dw"] = bwd_strategies.run("atomic", x, w, dout, rstd, got["dx"])
            return
        got["dx"], got["dw"], got["db"], got["dres"] = R.rmsnorm_bwd(
            x, w, dout, rstd, dres_out, has_bias=True, has_residual=True
        )

    def check():
        ex, ew, eb = rmsnorm_bwd_ref(
            *_host(x, w, dout, rstd, dres_out), has_bias=not atomic, compute_dtype=torch.float64
        )
        # dw, db: sums over M rows, their error grows like sqrt(M) (tests/test_rmsnorm_bwd_gpu)
        wanted = [("dx", ex, dtype, 1), ("dw", ew, torch.float32 if atomic else wdtype, M)]
        if not atomic:  # the atomics' dw is the fp32 row itself, before any cast
            wanted += [("db", eb, wdtype, M), ("dres", ex, dres_out.dtype, 1)]
        for name, e, d, rows in wanted:
            (a,) = _host(got[name])
            assert a.dtype == d, f"{case.id} {name}: dtype {a.dtype}, expected {d}"
            assert torch.isfinite(a).all(), f"{case.id} {name}: not every element is finite"
            tol = dict(TOLERANCES[d])
            tol["atol"] *= math.sqrt(rows)
            torch.testing.assert_close(a.double(), e, **tol, msg=lambda m, n=name: f"{n}: {m}")

    return compile_, launch, check


def _host(*tensors):
    """Copies on the host (None stays None). The checks compute their references and compare
    there: on the GPU, torch's own reduction kernels (the reference's mean of squares) would
    run under the sanitizer too, and racecheck reports hazards in them (it did, in
    ``at::native::reduce_kernel<..., MeanOps>``, 2025.3 on the H200), which are not ours."""
    return tuple(None if t is None else t.detach().cpu() for t in tensors)


def _case_fns(case: Case, device: str):
    if case.kernel in ("lib_fwd", "lib_fwd_bias"):
        return _lib_fwd_case(case, device)
    if case.kernel in ("lib_bwd", "bwd_atomic"):
        return _lib_bwd_case(case, device)
    return _stage_case(case, device)


def run_child(cases: list[Case], case_timeout: float | None = None, compile_only=False) -> int:
    """Run the cases in this process, one after the other, each between begin and end markers
    on stdout (the parent attributes the sanitizer's reports by them). Exit code 0 when every
    case passed, 1 when one failed, 3 without a Hopper GPU (unless ``compile_only``)."""
    import faulthandler
    import traceback

    _import_path()
    import quack_edu  # noqa: F401  (the mode and the DSL target, before cutlass loads)
    from quack_edu._env import MODE

    if not compile_only and not MODE.gpu:
        print(f"{MARK} nogpu {MODE.reason}", flush=True)
        return 3
    import torch

    device = "cuda" if MODE.gpu else "cpu"
    torch.manual_seed(0)
    if device == "cuda":  # the CUDA context before the first case: its reports are no case's
        torch.zeros(1, device=device)
        torch.cuda.synchronize()
    failed = 0
    for case in cases:
        print(f"{MARK} begin {case.id}", flush=True)
        if case_timeout:
            faulthandler.dump_traceback_later(case_timeout, exit=True)
        try:
            compile_, launch, check = _case_fns(case, device)
            t0 = time.time()
            compile_()
            t1 = time.time()
            if compile_only:
                print(f"{MARK} end {case.id} ok compile {t1 - t0:.2f} s", flush=True)
                continue
            launch()
            torch.cuda.synchronize()
            t2 = time.time()
            check()
            torch.cuda.synchronize()
            print(
                f"{MARK} end {case.id} ok compile {t1 - t0:.2f} s, launch {t2 - t1:.3f} s",
                flush=True,
            )
        except Skip as e:
            print(f"{MARK} end {case.id} skip {e}", flush=True)
        except Exception as e:  # noqa: BLE001  (reported, and the next case runs)
            failed += 1
            traceback.print_exc(file=sys.stdout)
            msg = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            print(f"{MARK} end {case.id} FAIL {msg}", flush=True)
        finally:
            if case_timeout:
                faulthandler.cancel_dump_traceback_later()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
