"""scripts/sanitize.py on the CPU: reading each tool's output (sample texts in the tools'
formats), the per-case table, finding compute-sanitizer, ``--list``, the "not found" exit, and
the whole parent run against a stand-in for compute-sanitizer (no GPU needed)."""

import importlib.util
import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "sanitize.py"
_spec = importlib.util.spec_from_file_location("sanitize_script", SCRIPT)
S = importlib.util.module_from_spec(_spec)
sys.modules["sanitize_script"] = S  # dataclasses look their module up by name
_spec.loader.exec_module(S)

A, B, C = "final:37x4104:bf16:bf16", "final:37x4104:bf16:fp32", "final:5x65544:bf16:bf16"

MEMCHECK_CLEAN = f"""\
========= COMPUTE-SANITIZER
@@sanitize begin {A}
@@sanitize end {A} ok compile 0.41 s, launch 0.020 s
@@sanitize begin {B}
@@sanitize end {B} ok compile 0.38 s, launch 0.019 s
========= ERROR SUMMARY: 0 errors
"""

MEMCHECK_FINDINGS = f"""\
========= COMPUTE-SANITIZER
@@sanitize begin {A}
========= Invalid __global__ write of size 16 bytes
=========     at kernel_cutlass_FinalRMSNorm_0+0x1a30
=========     by thread (127,0,0) in block (36,0,0)
=========     Address 0x7f3a2c012340 is out of bounds
=========     and is 16 bytes after the nearest allocation at 0x7f3a2c000000 of size 74880 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2f1e3] in libcuda.so.1
=========
@@sanitize end {A} FAIL AssertionError: out: 3 of 151848 elements are not finite
@@sanitize begin {B}
@@sanitize end {B} ok compile 0.38 s, launch 0.019 s
========= Misaligned Shared or Local Address
=========     at kernel_cutlass_FinalRMSNorm_1+0x4e0
=========
========= ERROR SUMMARY: 2 errors
"""

RACECHECK_CLEAN = f"""\
========= COMPUTE-SANITIZER
@@sanitize begin {A}
@@sanitize end {A} ok compile 0.52 s, launch 0.410 s
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
"""

RACECHECK_FINDINGS = f"""\
========= COMPUTE-SANITIZER
========= Warning: Maximum number of hazards reached. Environment variable \
NV_COMPUTE_SANITIZER_MAX_RACECHECK_HAZARDS can be used to increase this count.
@@sanitize begin {A}
========= Warning: (Warp Level Programming) Potential RAW hazard detected (CUDA barrier \
operation) at __shared__ 0x700 in block (0,0,0) :
=========     Write Thread (31,0,0) at kernel_cutlass_kernel_ClusterRMSNorm_0+0xf0
=========     Read Thread (0,0,0) at kernel_cutlass_kernel_ClusterRMSNorm_0+0x100
=========     Current Value : 0
=========
========= Warning: Potential RAW hazard detected at __shared__ 0x404 in block (0,0,0) :
=========     Write Thread (31,0,0) at 0x1f20 in kernel_cutlass_ClusterRMSNorm_0
=========
@@sanitize end {A} ok compile 0.52 s, launch 0.410 s
@@sanitize begin {B}
========= Error: Race reported between Write access at kernel_cutlass_CpasyncRMSNorm_0+0x260
=========     and Read access at kernel_cutlass_CpasyncRMSNorm_0+0x200 [256 hazards]
=========
@@sanitize end {B} ok compile 0.49 s, launch 0.380 s
========= RACECHECK SUMMARY: 3 hazards displayed (1 error, 2 warnings)
"""

SYNCCHECK_CLEAN = f"""\
========= COMPUTE-SANITIZER
@@sanitize begin {A}
@@sanitize end {A} ok compile 0.40 s, launch 0.030 s
========= ERROR SUMMARY: 0 errors
"""

INITCHECK_FINDING = f"""\
========= COMPUTE-SANITIZER
@@sanitize begin {A}
========= Uninitialized __global__ memory read of size 2 bytes
=========     at void at::native::reduce_kernel<512, 1>(...)+0x1b40
=========     by thread (5,0,0) in block (0,0,0)
=========
@@sanitize end {A} FAIL AssertionError: out: 1 of 151848 elements are not finite
========= ERROR SUMMARY: 1 error
"""


# -- summaries ----------------------------------------------------------------------------


def test_parse_summary_of_each_tool():
    s = S.parse_summary("memcheck", MEMCHECK_CLEAN)
    assert (s.errors, s.warnings) == (0, 0)
    assert s.line == "========= ERROR SUMMARY: 0 errors"
    assert S.parse_summary("memcheck", MEMCHECK_FINDINGS).errors == 2
    assert S.parse_summary("synccheck", SYNCCHECK_CLEAN).errors == 0
    assert S.parse_summary("initcheck", INITCHECK_FINDING).errors == 1  # "1 error", singular
    r = S.parse_summary("racecheck", RACECHECK_CLEAN)
    assert (r.hazards, r.errors, r.warnings) == (0, 0, 0)
    assert r.line == "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
    r = S.parse_summary("racecheck", RACECHECK_FINDINGS)
    assert (r.hazards, r.errors, r.warnings) == (3, 1, 2)
    one = "========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)"
    assert S.parse_summary("racecheck", one).warnings == 1


def test_no_summary_when_the_tool_did_not_finish():
    cut = MEMCHECK_CLEAN.rsplit("=========", 1)[0]
    assert S.parse_summary("memcheck", cut) is None
    # racecheck needs its own summary line; an ERROR SUMMARY does not stand for it
    assert S.parse_summary("racecheck", "========= ERROR SUMMARY: 0 errors") is None


def test_classify_record():
    assert S.classify_record("memcheck", "========= Invalid __global__ read of size 4 bytes")
    assert S.classify_record("memcheck", "=========     at kernel+0x10") is None  # continuation
    assert S.classify_record("memcheck", "========= COMPUTE-SANITIZER") is None
    assert S.classify_record("memcheck", "========= ERROR SUMMARY: 0 errors") is None
    assert S.classify_record("memcheck", "@@sanitize begin x") is None
    warn = "========= Warning: Potential RAW hazard detected at __shared__ 0x0 in block (0,0,0) :"
    assert S.classify_record("racecheck", warn) == "warning"
    assert S.classify_record("racecheck", "========= WARN:(Warp Level Programming) Potential "
                             "WAR hazard detected at __shared__ 0x8") == "warning"  # fmt: skip
    err = "========= Error: Race reported between Write access at k+0x260"
    assert S.classify_record("racecheck", err) == "error"
    cap = "========= Warning: Maximum number of hazards reached. Environment variable ..."
    assert S.classify_record("racecheck", cap) is None


# -- per case -----------------------------------------------------------------------------


def test_memcheck_reports_are_attributed_to_their_case():
    r = S.analyse("memcheck", [A, B], MEMCHECK_FINDINGS, rc=1)
    assert r.status == "findings" and r.summary.errors == 2
    a, b = r.cases[A], r.cases[B]
    assert (a.status, a.errors) == ("FAIL", 1)
    assert "not finite" in a.detail and "Invalid __global__ write" in a.first_report
    # printed after B's end (before any other case began): B's
    assert (b.status, b.errors) == ("ok", 1)
    assert r.outside == 0


def test_racecheck_counts_errors_and_warnings_per_case():
    r = S.analyse("racecheck", [A, B], RACECHECK_FINDINGS, rc=0)
    assert r.status == "findings"
    assert (r.cases[A].errors, r.cases[A].warnings) == (0, 2)
    assert (r.cases[B].errors, r.cases[B].warnings) == (1, 0)
    assert r.outside == 0  # "Maximum number of hazards reached" is the tool talking
    # the first report's kernel, from the line after it (both location formats)
    assert r.cases[A].first_report_kernel == "kernel_cutlass_kernel_ClusterRMSNorm_0"
    assert r.cases[B].first_report_kernel == "kernel_cutlass_CpasyncRMSNorm_0"


def test_every_tool_prints_every_report():
    # the default print limit (100) would leave later cases' reports out of their counts
    for tool in S.TOOLS:
        cmd = S.sanitizer_command("cs", tool, ["python", "x"])
        assert cmd[cmd.index("--print-limit") + 1] == "0", cmd


def test_clean_runs():
    for tool, text in (
        ("memcheck", MEMCHECK_CLEAN),
        ("racecheck", RACECHECK_CLEAN),
        ("synccheck", SYNCCHECK_CLEAN),
    ):
        ids = [A, B] if text is MEMCHECK_CLEAN else [A]
        r = S.analyse(tool, ids, text, rc=0)
        assert r.status == "ok", (tool, r)
        assert all(c.status == "ok" and not c.errors for c in r.cases.values())


def test_a_report_before_any_case_counts_outside():
    text = "========= Invalid __global__ read of size 4 bytes\n" + MEMCHECK_CLEAN.replace(
        "0 errors", "1 error"
    )
    r = S.analyse("memcheck", [A, B], text, rc=0)
    assert r.outside == 1 and r.status == "findings"


def test_timed_out_case():
    # the child's watchdog (faulthandler) stopped case B; C never began
    text = f"""\
========= COMPUTE-SANITIZER
@@sanitize begin {A}
@@sanitize end {A} ok compile 0.41 s, launch 0.020 s
@@sanitize begin {B}
Timeout (0:02:00)!
Thread 0x00007f1b (most recent call first):
  File "scripts/sanitize.py", line 870 in run_child
========= Error: process didn't terminate successfully
========= Target application returned an error
========= ERROR SUMMARY: 0 errors
"""
    r = S.analyse("racecheck", [A, B, C], text, rc=1)
    assert r.status == "no summary"  # racecheck's summary is missing as well
    assert [r.cases[c].status for c in (A, B, C)] == ["ok", "timeout", "not run"]
    # the parent's own limit: killed, no summary at all
    cut = text.split("Timeout")[0] + "[@@sanitize: killed after 360 s]\n"
    r = S.analyse("memcheck", [A, B, C], cut, rc=-9, timed_out=True)
    assert r.status == "timeout" and r.summary is None
    assert [r.cases[c].status for c in (A, B, C)] == ["ok", "timeout", "not run"]


def test_crash_of_a_case():
    text = f"""\
@@sanitize begin {A}
========= Error: process didn't terminate successfully
========= ERROR SUMMARY: 0 errors
"""
    r = S.analyse("memcheck", [A, B], text, rc=-11)
    assert r.status == "crash" and r.cases[A].status == "crash"
    assert r.cases[B].status == "not run"


def test_missing_tool_and_refused_option():
    r = S.analyse("memcheck", [A], "FileNotFoundError: compute-sanitizer", None, missing=True)
    assert r.status == "missing" and r.cases[A].status == "not run"
    refused = "========= Error: Unrecognized option '--racecheck-report'\n"
    r = S.analyse("racecheck", [A], refused, rc=1)
    assert r.status == "no summary" and r.cases[A].status == "not run"


def test_no_gpu():
    text = "@@sanitize nogpu PyTorch sees no CUDA GPU\n========= ERROR SUMMARY: 0 errors\n"
    r = S.analyse("memcheck", [A], text, rc=3)
    assert r.status == "no GPU" and r.note == "PyTorch sees no CUDA GPU"


def test_case_table():
    cases = [S.Case.parse(c) for c in (A, B)]
    results = {}
    for tool, text in (("memcheck", MEMCHECK_FINDINGS), ("racecheck", RACECHECK_FINDINGS)):
        for cid, res in S.analyse(tool, [A, B], text, rc=1).cases.items():
            results[(tool, cid)] = res
    table, clean = S.case_table(cases, ["memcheck", "racecheck"], results)
    lines = table.splitlines()
    assert not clean
    assert lines[0].split() == ["case", "memcheck", "racecheck", "values"]
    assert lines[2].split() == [A, "1", "FAIL", "0/2", "FAIL"]
    assert lines[3].split() == [B, "1", "1/0", "ok"]
    assert lines[-1].split() == ["total", "2", "1/2", "FAIL"]
    ok = {("memcheck", A): S.CaseResult("ok"), ("memcheck", B): S.CaseResult("skip")}
    table, clean = S.case_table(cases, ["memcheck"], ok)
    assert clean and table.splitlines()[-1].split() == ["total", "0", "ok"]
    table, clean = S.case_table(cases, ["memcheck", "racecheck"], ok)  # racecheck missing
    assert not clean and table.splitlines()[2].split()[-1] == "?"


# -- cases, plan, finding the tool ------------------------------------------------------------


def test_cases_and_plan():
    from quack_edu.stages import STAGE_ORDER

    cases = S.all_cases(STAGE_ORDER)
    assert len(cases) == len(STAGE_ORDER) * 8 + 4 * 16 == 112
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids)
    assert "cluster:5x65544:bf16:fp32" in ids and "naive:9x3000:fp32:bf16" in ids
    assert "lib_bwd:199x1001:fp16:fp32" in ids and "lib_fwd:1x7:bf16:bf16" in ids
    assert "lib_fwd_bias:37x4104:bf16:fp32" in ids and "bwd_atomic:5x65544:bf16:bf16" in ids
    assert all(S.Case.parse(i).id == i for i in ids)
    assert len(S.plan(cases, S.TOOLS, "kernel")) == 4 * (len(STAGE_ORDER) + 4)
    assert len(S.plan(cases, S.TOOLS, "case")) == 4 * 112
    assert len(S.plan(cases, S.TOOLS, "tool")) == 4
    assert {c.kernel for c in S.select_cases(cases, "lib_bwd")} == {"lib_bwd"}
    assert [c.id for c in S.select_cases(cases, "final:37x4104")] == [
        "final:37x4104:bf16:bf16",
        "final:37x4104:bf16:fp32",
    ]
    assert len(S.select_cases(cases, "*:fp32:*")) == 2 * len(STAGE_ORDER) + 8
    assert S.child_cases(["final", "37x4104", "bf16", "fp32"]) == [S.Case.parse(B)]
    with pytest.raises(ValueError, match="KERNEL:MxN"):
        S.Case.parse("final:37x4104:bf16")
    with pytest.raises(ValueError, match="fp64"):
        S.Case.parse("final:37x4104:fp64:bf16")


def _executable(path: Path, text="#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_find_sanitizer(tmp_path):
    none = dict(PATH=str(tmp_path / "empty"))
    assert S.find_sanitizer(env=none, globs=())[0] is None
    old = _executable(tmp_path / "cuda-12.4" / "bin" / "compute-sanitizer")
    new = _executable(tmp_path / "cuda-13.0" / "bin" / "compute-sanitizer")
    pattern = str(tmp_path / "cuda-*" / "bin" / "compute-sanitizer")
    assert S.find_sanitizer(env=none, globs=(pattern,))[0] == str(new)  # the newest
    on_path = dict(PATH=str(old.parent))
    assert S.find_sanitizer(env=on_path, globs=(pattern,))[0] == str(old)
    assert S.find_sanitizer(env={**none, "COMPUTE_SANITIZER": str(old)})[0] == str(old)
    path, looked = S.find_sanitizer(str(tmp_path / "nope"), env=on_path)
    assert path is None and looked == [str(tmp_path / "nope")]


# -- the command line -------------------------------------------------------------------------


def _run(args, env):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_list(capsys):
    assert S.main(["--list", "--cases", "cluster,lib_bwd"]) == 0
    out, err = capsys.readouterr()
    ids = out.split()
    assert len(ids) == 8 + 16 and ids[0] == "cluster:37x4104:bf16:bf16"
    assert "24 cases" in err


def test_no_sanitizer_found(tmp_path, subprocess_env):
    env = {**subprocess_env, "PATH": str(tmp_path)}
    env.pop("COMPUTE_SANITIZER", None)
    done = _run(["--sanitizer", str(tmp_path / "compute-sanitizer")], env)
    assert done.returncode == 2
    assert "compute-sanitizer not found; nothing was checked" in done.stderr
    assert "--sanitizer PATH" in done.stderr
    if S.find_sanitizer(env=env)[0] is None:  # the search itself (this machine has none)
        done = _run(["--tools", "memcheck"], env)
        assert done.returncode == 2 and "not found" in done.stderr


# -- the parent, end to end, against a stand-in for compute-sanitizer ---------------------------

FAKE = """\
#!{python}
# Stands in for compute-sanitizer: prints the markers the child would, and a summary.
import os, sys, time
args = sys.argv[1:]
if args == ["--version"]:
    print("Copyright (c) 2020-2025 NVIDIA Corporation")
    print("Version 2025.3.0 (fake)")
    sys.exit(0)
tool = args[args.index("--tool") + 1]
ids = args[args.index("--child") + 1 : args.index("--timeout")]
bad = os.environ.get("FAKE_FINDING", "")        # "tool case-id": one report in that case
hang = os.environ.get("FAKE_HANG", "")          # "tool case-id": the watchdog stops it
log = os.environ.get("FAKE_LOG")
if log:
    with open(log, "a") as f:
        f.write(tool + " " + " ".join(ids) + "\\n")
print("========= COMPUTE-SANITIZER", flush=True)
n = 0
for cid in ids:
    print("@@sanitize begin " + cid, flush=True)
    if hang == tool + " " + cid:
        print("Timeout (0:02:00)!", flush=True)
        print("========= Error: process didn't terminate successfully")
        break
    if bad == tool + " " + cid:
        n += 1
        kind = "Warning: Potential RAW hazard detected at __shared__ 0x0" if tool == "racecheck" \\
            else "Invalid __global__ read of size 4 bytes"
        print("========= " + kind + "\\n=========     at k+0x10\\n=========")
    print("@@sanitize end " + cid + " ok compile 0.10 s, launch 0.001 s", flush=True)
if tool == "racecheck":
    print("========= RACECHECK SUMMARY: %d hazards displayed (0 errors, %d warnings)" % (n, n))
else:
    print("========= ERROR SUMMARY: %d errors" % n)
sys.exit(1 if hang else 0)
"""


@pytest.fixture
def fake(tmp_path):
    return _executable(tmp_path / "fake-sanitizer", FAKE.format(python=sys.executable))


def test_parent_end_to_end_clean(fake, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = S.main(["--sanitizer", str(fake), "--cases", "lib_bwd,final", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "Version 2025.3.0 (fake)" in printed and "CLEAN" in printed
    assert "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" in printed
    data = json.loads(out.read_text())
    assert data["clean"] and len(data["cases"]) == 24 and len(data["runs"]) == 8
    assert data["tool_args"]["memcheck"] == ["--report-api-errors", "no", "--print-limit", "0"]
    race = next(r["command"] for r in data["runs"] if r["tool"] == "racecheck")
    assert race[1:5] == ["--tool", "racecheck", "--racecheck-report", "hazard"]
    assert race[5:7] == ["--print-limit", "0"]
    assert race[7:9] == [sys.executable, str(SCRIPT)] and race[9] == "--child"
    assert all(r["status"] == "ok" for r in data["results"].values())


def test_parent_end_to_end_findings_and_a_hang(fake, tmp_path, capsys, monkeypatch):
    log = tmp_path / "calls.txt"
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_FINDING", "racecheck lib_bwd:5x65544:bf16:fp32")
    monkeypatch.setenv("FAKE_HANG", "memcheck lib_bwd:3x131072:fp16:fp16")
    rc = S.main(["--sanitizer", str(fake), "--cases", "lib_bwd", "--jobs", "2"])
    printed = capsys.readouterr().out
    assert rc == 1
    rows = {ln.split()[0]: ln.split()[1:] for ln in printed.splitlines() if ln.startswith("lib_")}
    assert rows["lib_bwd:5x65544:bf16:fp32"] == ["0", "0/1", "0", "0", "ok"]
    assert rows["lib_bwd:3x131072:fp16:fp16"][0] == "timeout"
    # the cases after the hang ran again, in a process of their own
    assert rows["lib_bwd:3x131072:fp16:fp32"][:2] == ["0", "0/0"]
    retried = [ln for ln in log.read_text().splitlines() if ln.startswith("memcheck")]
    assert len(retried) == 2 and retried[1].split()[1] == "lib_bwd:3x131072:fp16:fp32"
    assert "NOT CLEAN" in printed


def test_child_refuses_without_a_gpu(capsys):
    from quack_edu._env import MODE

    if MODE.gpu:
        pytest.skip("this machine has a Hopper GPU: the child would run the case")
    assert S.main(["--child", "final", "37x4104", "bf16", "fp32"]) == 3
    assert "@@sanitize nogpu" in capsys.readouterr().out


def test_every_tool_and_its_options_are_documented():
    doc = S.__doc__ or ""
    for tool in S.TOOLS:
        assert tool in doc
        assert all(opt in doc for opt in S.TOOL_ARGS[tool] if opt.startswith("--"))
