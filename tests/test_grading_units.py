"""Units of the grader: hints on synthetic failures, the PTX def-use view, scoring, the
anti-shortcut guard, check(), single-source conversion, recorded results, the traffic counter."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from quack_edu.grading import COMPILE, GPU, Check, CheckFailed, Exercise, check, hints, run_exercise
from quack_edu.grading.checks import Ptx, bounds, f32_hex
from quack_edu.grading.context import answer_source, scan_source
from quack_edu.grading.notebook import (
    CODE_STUB,
    answer_from_source,
    nbgrader_meta,
    to_student,
)
from quack_edu.grading.report import CheckResult, ExerciseResult
from quack_edu.reference import TOLERANCES, rmsnorm_ref

TOL = TOLERANCES[torch.float32]


def _rms_inputs(M=64, N=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, N, generator=g)
    x[1] = 0
    return x, 1 + 0.5 * torch.randn(N, generator=g)


# ---- hints ------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 5])
def test_partial_warp_sum_hint(k):
    # the sum of squares of 1/2**k of the lanes: out is sqrt(2**k) too large
    x, w = _rms_inputs()
    ref = rmsnorm_ref(x, w)
    hint = hints.diagnose_rmsnorm(ref * math.sqrt(2**k), ref, x, w, 1e-6, tol=TOL)
    assert hint.startswith(hints.MISSING_SHUFFLE) and f"1/{2**k}" in hint


def test_double_count_hint():
    x, w = _rms_inputs()
    ref = rmsnorm_ref(x, w)
    assert hints.DOUBLE_COUNT in hints.diagnose_rmsnorm(ref / 2, ref, x, w, 1e-6, tol=TOL)


def test_tail_columns_hint():
    x, w = _rms_inputs(N=1000)
    ref = rmsnorm_ref(x, w)
    out = ref.clone()
    out[:, 992:] = 7.0  # garbage only after the last full 64-wide tile
    assert hints.diagnose_rmsnorm(out, ref, x, w, 1e-6, tol=TOL, tile_cols=64) == hints.TAIL_COLUMNS
    assert hints.diagnose_rmsnorm(out, ref, x, w, 1e-6, tol=TOL) == hints.TAIL_COLUMNS


def test_unwritten_rows_hint():
    x, w = _rms_inputs()
    ref = rmsnorm_ref(x, w)
    out = ref.clone()
    out[32:] = 4242.0
    hint = hints.diagnose_rmsnorm(out, ref, x, w, 1e-6, tol=TOL, poison=4242.0)
    n = x.shape[0] - 32
    assert hint.startswith(hints.NOT_WRITTEN)
    assert hint.endswith(f"({n} rows not written at all: 32, 33, 34, ...)"), hint
    out = ref.clone()
    out[6] = 4242.0  # one row: said as one (not "first [6] of 1")
    hint = hints.diagnose_rmsnorm(out, ref, x, w, 1e-6, tol=TOL, poison=4242.0)
    assert hint.endswith("(row 6 not written at all)"), hint


def test_a_lone_output_equal_to_the_poison_was_computed():
    """Wrong values at the poison's scale round to it now and then (bf16 steps by 32 near
    4242): a lone one is not "never written" (03.block_reduce, rows reading slots no warp
    wrote, issue 50); a vector of them, or a column in every row, is."""
    x, w = _rms_inputs()
    ref = rmsnorm_ref(x, w)
    out = ref * 3000.0
    out[3, 17] = out[40, 900] = 4242.0
    hint = hints.diagnose_rmsnorm(out, ref, x, w, 1e-6, tol=TOL, poison=4242.0)
    assert not (hint or "").startswith(hints.NOT_WRITTEN), hint
    out[5, 8:16] = 4242.0  # a vector never stored
    hint = hints.diagnose_rmsnorm(out, ref, x, w, 1e-6, tol=TOL, poison=4242.0)
    assert hint.startswith(hints.NOT_WRITTEN), hint
    out = ref.clone()
    out[:, -1] = 4242.0  # the last column, in every row
    hint = hints.diagnose_rmsnorm(out, ref, x, w, 1e-6, tol=TOL, poison=4242.0)
    assert hint.startswith(hints.NOT_WRITTEN), hint
    assert hint.endswith(f"(column {x.shape[1] - 1} not written at all)"), hint


@pytest.mark.parametrize("variant", hints.RSTD_VARIANTS + hints.SUM_VARIANTS, ids=lambda v: v.name)
def test_known_wrong_variants_are_recognised(variant):
    x, w = _rms_inputs()
    x = x * (2.0 ** torch.arange(-12, -12 + x.shape[0]).clamp(max=4)).unsqueeze(1) / 8
    ref = rmsnorm_ref(x, w)
    out = variant.fn(x, w, 1e-6)
    every = hints.RSTD_VARIANTS + hints.SUM_VARIANTS
    assert hints.diagnose_rmsnorm(out, ref, x, w, 1e-6, tol=TOL, variants=every) == variant.hint


def test_number_hints():
    assert "factor of 8" in hints.diagnose_number(800, 100)
    assert "1/1000" in hints.diagnose_number(1, 1000)
    assert hints.diagnose_number(101, 100) is None


def test_compile_error_hint_and_short_error():
    err = RuntimeError(
        "\x1b[91merror:\x1b[0m dynamic range should be always preprocessed to IR\n"
        "  note: This is a bug in the DSL\n  suggestion: report it"
    )
    assert hints.diagnose_compile_error(err) == hints.NOT_JIT
    short = hints.short_error(err)
    assert "\x1b" not in short and "bug in the DSL" not in short
    assert "preprocessed" in short


# ---- PTX def-use ------------------------------------------------------------------------------
PTX = """
.visible .entry k(
	.param .align 8 .b8 k_param_0[24],
	.param .f32 k_param_3
)
{
	ld.param.b32 	%r4, [k_param_3];
	ld.global.b16 	%rs1, [%rd13+-4];
	cvt.f32.bf16 	%r8, %rs1;
	fma.rn.f32 	%r9, %r8, %r8, %r33;
	div.rn.f32 	%r15, %r9, 0f447A0000;
	add.f32 	%r16, %r4, %r15;
	rsqrt.approx.f32 	%r2, %r16;
	@%p1 bra 	$L__BB0_5;
	st.global.b16 	[%rd16+-4], %rs7;
}
"""


def test_ptx_def_use():
    ptx = Ptx(PTX)
    assert ptx.scalar_params(".f32") == ["k_param_3"]
    rsqrt = ptx.find("rsqrt.")[0]
    ops = {a.opcode for a in ptx.ancestors(rsqrt)}
    assert {"ld.param.b32", "add.f32", "div.rn.f32", "fma.rn.f32", "ld.global.b16"} <= ops
    assert ptx.find("st.global")[0].dests == []
    assert f32_hex(1000.0) == "0f447A0000"


#: tail guards as the DSL compiles them (01.scale_kernel, N = 4104): a branch over the copies
#: when the coordinate is past the end, copies predicated on the test, the constant first, and
#: a loop's backward branch (no guard)
GUARDS = """
	setp.gt.u32 	%p1, %r6, 4103;
	@%p1 bra 	$L__BB0_2;
	ld.global.v4.b32 	{%r1, %r2, %r3, %r4}, [%rd1];
$L__BB0_2:
	setp.lt.s32 	%p2, %r7, 4104;
	@%p2 st.global.v4.b32 	[%rd2], {%r1, %r2, %r3, %r4};
	setp.gt.s32 	%p3, 4104, %r8;
	@!%p3 bra 	$L__BB0_3;
	st.global.v4.b32 	[%rd2], {%r1, %r2, %r3, %r4};
$L__BB0_3:
$L__BB0_4:
	setp.lt.u32 	%p4, %r9, 4104;
	@%p4 bra 	$L__BB0_4;
"""


def test_bounds_read_which_side_of_a_tail_guard_runs():
    got = {b.text.split()[1].rstrip(","): b for b in bounds(GUARDS, range(4096, 4105))}
    assert set(got) == {"%p1", "%p2", "%p3"}  # %p4 closes a loop: not a guard
    for b in got.values():  # each lets in the last vector (4096) and shuts out 4104
        assert b.admits(4096) and b.admits(4103) and not b.admits(4104), b
    assert not got["%p1"].runs_if and got["%p2"].runs_if and got["%p3"].runs_if
    # the same branch over the copies with the bound one higher: 4104 gets in (a <= guard)
    le = bounds(GUARDS.replace("%r6, 4103", "%r6, 4104"), [4104])
    assert [b.admits(4104) for b in le if "%p1" in b.text] == [True]


# ---- scoring ----------------------------------------------------------------------------------
def test_scoring_counts_only_tiers_that_ran():
    r = ExerciseResult("01.x", "t", "01_x", {COMPILE: 1, GPU: 2}, mode="compile-only")
    r.checks = [CheckResult("a", COMPILE, "pass"), CheckResult("b", GPU, "skip")]
    assert (r.score, r.max_score, r.skipped_points, r.status) == (1, 1, 2, "pass")
    r.checks[0].status = "fail"
    assert (r.score, r.max_score, r.status) == (0, 1, "fail")
    r.forced_status = "fail"  # e.g. a timeout: the gpu tier stays skipped on a CPU machine
    assert r.tiers()[GPU]["status"] == "skip" and r.max_score == 1
    back = ExerciseResult.from_json(json.loads(json.dumps(r.to_record())))
    assert back.to_json() == r.to_json()


# ---- running learner code: exceptions, shortcuts ----------------------------------------------
def _toy(points=None, fn=None):
    ex = Exercise("99.toy", "99_toy", "toy", "a toy", points or {COMPILE: 1})

    def value(ctx):
        got = ctx.call(torch.ones(2, 4), torch.ones(4), 1e-6)
        if not torch.allclose(got.float(), rmsnorm_ref(torch.ones(2, 4), torch.ones(4))):
            raise CheckFailed("wrong", expected=1, seen=got)
        return "ok"

    ex.add(Check("values", COMPILE, fn or value))
    ex.add(Check("values hidden", COMPILE, fn or value, hidden=True))
    return ex


def _fn(src, name="toy"):
    return answer_from_source(src, name)


def test_learner_exception_is_a_failure_not_a_crash():
    res = run_exercise(_toy(), _fn("def toy(x, w, eps):\n    return 1 / 0\n"))
    assert res.status == "fail" and "ZeroDivisionError" in res.failures[0]


def test_not_implemented_is_not_attempted():
    stub = CODE_STUB.replace("\n", "\n    ")
    res = run_exercise(_toy(), _fn(f"def toy(x, w, eps):\n    {stub}\n"))
    assert res.status == "not attempted" and res.score == 0


@pytest.mark.parametrize(
    "body",
    [
        "return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)",
        "return getattr(torch.nn.functional, 'rms' + '_norm')(x, (x.shape[-1],), w, eps)",
        "return getattr(torch, 'rms' + '_norm')(x, (x.shape[-1],), w, eps)",
        "f = getattr(torch.nn, 'RMS' + 'Norm')(x.shape[-1], eps=eps)\n    return f(x)",
        "from quack_edu import reference as r\n    return getattr(r, 'rmsnorm' + '_ref')(x, w)",
    ],
    ids=["F.rms_norm", "aliased F.rms_norm", "torch.rms_norm", "nn.RMSNorm", "rmsnorm_ref"],
)
def test_calling_a_library_rmsnorm_fails_with_that_reason(body):
    res = run_exercise(_toy(), _fn(f"def toy(x, w, eps):\n    {body}\n"))
    assert res.status == "fail" and res.score == 0, res.table()
    shortcut = [c for c in res.checks if c.shortcut]
    assert shortcut and "instead of computing RMSNorm itself" in shortcut[0].message
    assert shortcut[0].hint == hints.SHORTCUT


def test_source_scan_ignores_comments_and_strings():
    f = _fn('def toy(x, w, eps):\n    "not torch.rms_norm"\n    # nor nn.RMSNorm\n    return x\n')
    assert "rms_norm" in answer_source(f) and scan_source(f) is None
    g = _fn("def toy(x, w, eps):\n    return torch.nn.functional.rms_norm(x, (4,), w, eps)\n")
    assert scan_source(g) == "torch's rms_norm"


# ---- check() in a notebook --------------------------------------------------------------------
def test_check_prints_a_table_and_hidden_raises(capsys):
    good = _fn(
        "def bytes_moved(M, N, dtype):\n"
        "    s = torch.tensor([], dtype=dtype).element_size()\n"
        "    return 2 * M * N * s + N * s\n",
        "bytes_moved",
    )
    res = check("00.bytes_moved", good, hidden=True)
    out = capsys.readouterr().out
    assert "pass" in out and "00.bytes_moved" in out and res.score == 1
    bad = _fn("def bytes_moved(M, N, dtype):\n    return M * N\n", "bytes_moved")
    res = check("00.bytes_moved", bad)  # visible: prints, does not raise
    out = capsys.readouterr().out
    assert "FAIL" in out and "expected" in out and "seen" in out and res.score == 0
    with pytest.raises(AssertionError, match="00.bytes_moved"):
        check("00.bytes_moved", bad, hidden=True, quiet=True)


# ---- single source ----------------------------------------------------------------------------
def _nbformat():
    """nbformat, or a skip with the reason (the H200 has no Jupyter packages)."""
    return pytest.importorskip("nbformat", reason="nbformat is not installed here")


def _nb(*cells):
    nb = _nbformat().v4.new_notebook()
    nb.cells = list(cells)
    return nb


def test_to_student_replaces_solutions_and_removes_hidden_tests():
    nbformat = _nbformat()
    ans = nbformat.v4.new_code_cell(
        "def f(x):\n    '''doc'''\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n"
    )
    ans.metadata["nbgrader"] = nbgrader_meta("00_f", solution=True)
    ans.outputs = [nbformat.v4.new_output("stream", text="hi")]
    ans.execution_count = 3
    test = nbformat.v4.new_code_cell(
        'check("00.f", f)\n### BEGIN HIDDEN TESTS\ncheck("00.f", f, hidden=True)\n'
        "### END HIDDEN TESTS"
    )
    test.metadata["nbgrader"] = nbgrader_meta("00_f_check", grade=True, locked=True, points=2)
    whole = nbformat.v4.new_code_cell("x = 42")
    whole.metadata["nbgrader"] = nbgrader_meta("00_g", solution=True)
    text = nbformat.v4.new_markdown_cell("### BEGIN SOLUTION\nthe answer\n### END SOLUTION")
    text.metadata["nbgrader"] = nbgrader_meta("00_t", solution=True, grade=True, points=1)
    src = _nb(ans, test, whole, text)
    out = to_student(src)
    assert out.cells[0].source == (
        "def f(x):\n    '''doc'''\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"
    )
    assert out.cells[0].outputs == [] and out.cells[0].execution_count is None
    assert out.cells[0].metadata["nbgrader"] == ans.metadata["nbgrader"]
    assert out.cells[1].source == 'check("00.f", f)'
    assert out.cells[1].metadata["nbgrader"]["points"] == 2
    assert out.cells[2].source == CODE_STUB
    assert out.cells[3].source == "YOUR ANSWER HERE"
    assert src.cells[0].outputs, "the solution notebook itself is not changed"


def test_to_student_refuses_unmarked_regions():
    nbformat = _nbformat()
    cell = nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION")
    with pytest.raises(ValueError, match="not marked nbgrader.solution"):
        to_student(_nb(cell))
    cell = nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n")
    cell.metadata["nbgrader"] = nbgrader_meta("a", solution=True)
    with pytest.raises(ValueError, match="without"):
        to_student(_nb(cell))


# ---- recorded results, traffic ----------------------------------------------------------------
def test_results_load_and_show(tmp_path, monkeypatch, capsys):
    from quack_edu.lessons import results

    monkeypatch.setenv("QUACK_EDU_RESULTS", str(tmp_path))
    assert results.load("ladder_fwd") is None
    results.show("ladder_fwd")
    assert "no recorded result yet" in capsys.readouterr().out
    data = {
        "gpu": "NVIDIA H200",
        "date": "2026-11-29",
        "copy_gbps": 4270.0,
        "rows": [
            {
                "kernel": "naive",
                "M": 4096,
                "N": 4096,
                "dtype": "bf16",
                "us": 800.0,
                "gbps": 83.9,
                "pct_copy": 1.96,
            },
            {
                "kernel": "torch-ops",
                "M": 4096,
                "N": 4096,
                "dtype": "bf16",
                "us": 160.0,
                "gbps": 419.5,
                "pct_copy": 9.8,
            },
        ],
    }
    (tmp_path / "ladder_fwd.json").write_text(json.dumps(data))
    assert results.rows("ladder_fwd", kernel="naive")[0]["us"] == 800.0
    results.show("ladder_fwd", kernel="naive")
    out = capsys.readouterr().out
    assert "NVIDIA H200" in out and "naive" in out and "torch-ops" not in out


def test_recorded_results_are_there_for_the_lessons():
    from quack_edu.lessons import results
    from quack_edu.stages import BACKWARD_STAGES, STAGE_ORDER

    data = results.load("ladder")  # lessons 02-05 and 08 read its forward without a GPU
    assert data and data["gpu"].startswith("NVIDIA H200") and data["copy_gbps"] > 3000
    assert data["pass"] == "both" and {"date", "command", "clocks", "torch", "dsl"} <= set(data)
    for p, stages in (("fwd", STAGE_ORDER), ("bwd", BACKWARD_STAGES)):
        part = data[p]
        kernels = {r["kernel"] for r in part["rows"]}
        assert {*stages, "lib", "quack", "torch-compile", "torch-ops"} <= kernels, p
        assert {r["weight_dtype"] for r in part["rows"]} == {"bf16", "fp32"}
        assert part["verdict"]["by_weight_dtype"] and part["copy_gbps"] == data["copy_gbps"]
        for r in part["rows"]:  # every GB/s is the byte count over the time
            assert {"M", "N", "graph", "dtype", "weight_dtype", "kernel"} <= set(r)
            if "error" in r:  # a peer that does not run at a shape says why
                continue
            assert r["pass"] == p
            assert abs(r["gbps"] - r["bytes"] / (r["us"] * 1e-6) / 1e9) < 1e-6 * r["gbps"]
    # a pass picked by name: the forward's warp rows with a bf16 weight, plain and graph
    warp = results.rows("ladder", "fwd", kernel="warp", weight_dtype="bf16")
    assert warp and all(r["pass"] == "fwd" for r in warp)
    assert {r["graph"] for r in warp} == {False, True}
    assert not results.rows("ladder", "bwd", kernel="warp")
    # a row that says why a peer did not run is found by its pass too (Liger above 65536)
    (liger,) = results.rows("ladder", "fwd", kernel="liger", N=262144, weight_dtype="bf16")
    assert "error" in liger and "gbps" not in liger


def test_traffic_counts_kernels_and_bytes():
    from quack_edu.lessons.roofline import traffic

    x = torch.empty(8, 16, dtype=torch.bfloat16, device="meta")
    ops = traffic(lambda t: (t.float() * 2).view(-1), x)
    assert [o.op for o in ops] == ["_to_copy", "mul"]
    assert ops[0].read == 8 * 16 * 2 and ops[0].written == 8 * 16 * 4
    assert traffic(lambda t: t.float(), torch.empty(4, device="meta")) == []  # fp32: no kernel


# ---- the pattern a later lesson follows -------------------------------------------------------
def test_a_kernel_hole_exercise_in_a_few_lines():
    from quack_edu.grading import checks

    hole = checks.KernelHole(
        stage="naive",
        piece="rstd",
        adapt=lambda answer: lambda self, s, eps: answer(s, eps, self.N),
    )
    ex = Exercise("98.rsqrt", "98_demo", "rstd", "rstd again", {COMPILE: 1, GPU: 1})
    ex.add(
        checks.compiles(hole, N=1000),
        checks.ptx_count(hole, "rsqrt.approx", 1, hint="use cute.math.rsqrt"),
        checks.no_local_memory(hole),
        checks.compiles(hole, hidden=True),
        checks.gpu_values(hole),
    )
    ex.validate()
    src = "@cute.jit\ndef rstd(s, eps, N):\n    return cute.math.rsqrt(s / N + eps)\n"
    res = run_exercise(ex, _fn(src, "rstd"), hidden=True, gpu=False)
    assert res.status == "pass" and res.score == 1 and res.skipped_points == 1, res.table()
    bad = "@cute.jit\ndef rstd(s, eps, N):\n    return 1.0 / cute.math.sqrt(s / N + eps)\n"
    res = run_exercise(ex, _fn(bad, "rstd"), gpu=False)
    assert res.status == "fail" and "use cute.math.rsqrt" in res.failures[0], res.table()


def test_shortcut_in_compile_only_mode_leaves_the_gpu_tier_skipped():
    ex = _toy(points={COMPILE: 1, GPU: 1})
    ex.add(Check("gpu values", GPU, lambda ctx: None))
    res = run_exercise(
        ex, _fn("def toy(x, w, eps):\n    return torch.rms_norm(x, (4,), w, eps)\n"), gpu=False
    )
    assert res.tiers()[GPU]["status"] == "skip" and res.max_score == 1 and res.score == 0


def test_an_answer_may_be_named_like_a_library_function():
    f = _fn("def rmsnorm_fwd(x, w, eps):\n    return x\n", "rmsnorm_fwd")
    assert scan_source(f, allow=("rmsnorm_fwd",)) is None


def test_shortcut_guard_flags_quack_rmsnorm_but_not_its_dsl_patches():
    # QuACK patches CuTe DSL when imported: its helper code then runs inside every compile
    # (a notebook that measured QuACK earlier); only its norm code is a shortcut.
    import types

    import torch

    from quack_edu.grading.guard import shortcut_guard

    def fake_module(name, src):  # as installed: site-packages/quack/...
        mod = types.ModuleType(name)
        path = "/venv/lib/python3.11/site-packages/" + name.replace(".", "/") + ".py"
        exec(compile(src, path, "exec"), mod.__dict__)
        return mod

    dsl = fake_module("quack.dsl.cute_tensor_indexing", "def helper(x):\n    return x + 1\n")
    norm = fake_module("quack.rmsnorm", "def rmsnorm(x):\n    return x * 2\n")
    ours = fake_module("quack_edu.rmsnorm", "def rmsnorm(x):\n    return x * 2\n")
    with shortcut_guard() as seen:
        ours.rmsnorm(1)  # quack_edu is not quack
    assert seen == []
    with shortcut_guard() as seen:
        dsl.helper(1)
    assert seen == []
    with shortcut_guard() as seen:
        dsl.helper(1)
        norm.rmsnorm(1)
    assert seen == ["QuACK (the quack package)"]
    with shortcut_guard() as seen:
        torch.nn.functional.rms_norm(torch.ones(2, 4), (4,))
    assert seen[0] == "torch.nn.functional.rms_norm"  # (and the torch.rms_norm it calls)


def test_shortcut_guard_sees_aliases_builtins_and_a_switched_off_profiler():
    import sys

    import torch
    from torch import rms_norm as alias

    from quack_edu.grading.guard import shortcut_guard
    from quack_edu.reference import rmsnorm_ref

    x = torch.randn(3, 8)
    calls = {
        "a built-in under another name": (lambda: alias(x, (8,)), ["torch.rms_norm"]),
        "the aten op": (lambda: torch.ops.aten.rms_norm(x, [8]), ["torch.rms_norm"]),
        "the module (the outer call named first)": (
            lambda: torch.nn.RMSNorm(8)(x),
            ["torch.nn.RMSNorm", "torch.nn.functional.rms_norm", "torch.rms_norm"],
        ),
        "the reference": (
            lambda: rmsnorm_ref(x, None),
            ["quack_edu.reference.rmsnorm_ref", "quack_edu.reference.rstd_ref"],  # (it calls)
        ),
        "its own arithmetic": (lambda: x * torch.rsqrt((x * x).mean(-1, keepdim=True)), []),
    }
    for what, (call, want) in calls.items():
        with shortcut_guard() as seen:
            call()
        assert seen == want, what
    # nested: the inner block's calls are the inner's; the outer goes on after it
    with shortcut_guard() as outer:
        with shortcut_guard() as inner:
            torch.nn.functional.rms_norm(x, (8,))
        alias(x, (8,))
    assert inner[0] == "torch.nn.functional.rms_norm" and outer == ["torch.rms_norm"]
    # code that switches the profiler off is reported, and the profiler before is restored;
    # from 3.12 cProfile is a sys.monitoring tool (sys.setprofile(None) no longer stops it)
    if sys.version_info >= (3, 12):
        mon = sys.monitoring
        switches = {
            "events off": lambda: mon.set_events(mon.PROFILER_ID, 0),
            "tool freed": lambda: mon.free_tool_id(mon.PROFILER_ID),
        }
    else:
        switches = {"sys.setprofile(None)": lambda: sys.setprofile(None)}
    before = sys.getprofile()
    for what, switch_off in switches.items():
        with shortcut_guard() as seen:
            switch_off()
            alias(x, (8,))
        assert seen and "the grader's view of the calls was switched off" in seen[-1], what
        assert sys.getprofile() is before, what
        with shortcut_guard() as seen:  # and the next guard sees calls again
            alias(x, (8,))
        assert seen == ["torch.rms_norm"], what
    if sys.version_info >= (3, 12):  # the 3.11 way to hide the call hides nothing
        with shortcut_guard() as seen:
            sys.setprofile(None)
            alias(x, (8,))
        assert seen == ["torch.rms_norm"]


def test_shortcut_guard_under_a_profiler_and_its_fallback_hook():
    import cProfile

    import torch
    from torch import rms_norm as alias

    from quack_edu.grading import guard

    x = torch.randn(3, 8)
    outside = cProfile.Profile()  # someone profiling the grader: paused, then resumed
    outside.enable()
    with guard.shortcut_guard() as seen:
        alias(x, (8,))
    torch.relu(x)
    outside.disable()
    assert seen == ["torch.rms_norm"]
    assert "<built-in method torch.relu>" in {e.code for e in outside.getstats()}
    # the Python hook a guard falls back to where cProfile cannot be had (Python 3.12+ with
    # another profiler on): the same names
    with guard._hook_guard(*guard._forbidden_targets()) as seen:
        torch.nn.functional.rms_norm(x, (8,))
    assert seen == ["torch.nn.functional.rms_norm", "torch.rms_norm"]


# ---- error messages without terminal colours --------------------------------------------------
def test_colour_codes_are_stripped_even_without_their_escape_character():
    assert hints.ansi_free("\x1b[91m\x1b[1merror\x1b[0m: x") == "error: x"
    assert hints.ansi_free("[91m[1merror[INTERNAL]:[0m The compiler") == (
        "error[INTERNAL]: The compiler"
    )
    assert hints.ansi_free("in `[92mkernel[0m(...)`") == "in `kernel(...)`"
    assert hints.ansi_free("x[i] = a[0m] [3]") == "x[i] = a[0m] [3]"  # code is left alone


def test_a_notebook_cell_error_names_the_rule_without_colours():
    # a 64-bit cp.async with .cg: the DSL's error is coloured and says "could not build valid
    # IR"; a report names the rule (16 bytes for .cg) instead
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import cpasync

    from quack_edu.grading.notebook import CellEvent
    from quack_edu.stages.cpasync import CpAsyncRMSNorm
    from quack_edu.tools.inspect import compile_report

    class Cg64(CpAsyncRMSNorm):
        def make_g2s_atom(self):
            op = cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL)
            return cute.make_copy_atom(op, self.dtype, num_bits_per_copy=64)

    with pytest.raises(Exception) as caught:
        compile_report(Cg64, 1024, torch.bfloat16, sass=False)
    raw = str(caught.value)
    assert "\x1b[" in raw  # the DSL's own message is coloured
    text = CellEvent(19, "05_g2s_atom", "error", type(caught.value).__name__, raw).describe(60)
    assert "\x1b" not in text and "[91m" not in text and "[0m" not in text, text
    assert "16 bytes" in text and "LoadCacheMode.ALWAYS" in text, text


@pytest.mark.parametrize("scale", [2.0**-10, 2.0**-9, 1.0])
def test_double_count_hint_on_a_row_near_eps(scale):
    # a row whose mean square is near eps: its sum counted twice moves rstd much less than
    # 1/sqrt(2) (eps is added after the sum), and it is still the same mistake
    x, w = _rms_inputs(M=2)
    x = x[:1] * scale
    xf = x.float()
    out = xf * torch.rsqrt(2 * xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    ref = rmsnorm_ref(x, w)
    hint = hints.diagnose_rmsnorm(out, ref, x, w, 1e-6, tol=TOL)
    assert hint is not None and "about 2x" in hint, hint


def test_a_cell_worker_that_exits_at_once_says_so(tmp_path):
    # a child that cannot import quack_edu exits before its first reply: its return code, not
    # "did not start in 120 s"
    from quack_edu.grading.executor import ChildEngine

    (tmp_path / "quack_edu").mkdir()
    (tmp_path / "quack_edu" / "__init__.py").write_text("raise ImportError('broken')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    with pytest.raises(RuntimeError, match="exited with 1 before it started"):
        with ChildEngine(env, str(tmp_path), timeout=5, log=tmp_path / "log"):
            pass


def test_a_gpu_check_that_ran_out_of_memory_runs_again(monkeypatch):
    # another grading's tensors on the same GPU are not the learner's failure (issue 49: same
    # scores under load); a compile check, or a GPU check that fails for its own reasons, is
    # not run again
    import torch

    from quack_edu.grading import runner
    from quack_edu.grading.registry import COMPILE, GPU, Check, CheckFailed

    monkeypatch.setattr(runner, "OOM_PAUSE_S", 0.0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    calls = []

    def flaky(ctx):
        calls.append(1)
        if len(calls) < 3:
            try:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            except torch.OutOfMemoryError as e:  # as torch.testing wraps it
                raise RuntimeError(
                    "Comparing\n... resulted in the unexpected exception above"
                ) from e
        return "ok"

    assert runner._run_check(Check("t", GPU, flaky), None) == "ok" and len(calls) == 3
    calls.clear()
    with pytest.raises(RuntimeError):
        runner._run_check(Check("t", COMPILE, flaky), None)
    assert len(calls) == 1

    def wrong(ctx):
        calls.append(1)
        raise CheckFailed("wrong")

    calls.clear()
    with pytest.raises(CheckFailed):
        runner._run_check(Check("t", GPU, wrong), None)
    assert len(calls) == 1

    def never(ctx):
        calls.append(1)
        raise torch.OutOfMemoryError("CUDA out of memory")

    calls.clear()
    with pytest.raises(torch.OutOfMemoryError):
        runner._run_check(Check("t", GPU, never), None)
    assert len(calls) == runner.OOM_RETRIES + 1


def test_a_wrapped_error_line_is_kept_whole_with_its_hint():
    """The DSL wraps a long ``error:`` line; its continuation, indented deeper, is part of it
    (the cause of 05.g2s_atom's num_bits_per_copy=dtype.width was on the second line)."""
    text = (
        "\x1b[91merror[INTERNAL]:\x1b[0m The compiler could not build valid IR for this code.\n"
        "\n  --> /x/cpasync.py:148:24\n   |\n> 148 |     cute.copy(g2s, a, b)\n"
        "  \x1b[91merror:\x1b[0m IR verification failed: 'cute.copy' op "
        "'!cute_nvgpu.atom.simt_async_copy<bf16, cache =\n"
        "         global, 16 b>' 'cp_size' only supports (32, 64, 128), but got 16.\n"
        "  \x1b[92msuggestion:\x1b[0m Check the source location above for invalid primitive\n"
        "              spaces. If the code looks valid, report this.\n"
    )
    err = RuntimeError(text)
    short = hints.short_error(err, 400)
    assert short.endswith("'cp_size' only supports (32, 64, 128), but got 16."), short
    assert "suggestion" not in short and "spaces" not in short
    assert "not an element's width" in hints.diagnose_compile_error(err)


def test_short_error_names_the_cause_torch_testing_wrapped():
    from quack_edu.grading.hints import short_error

    try:
        try:
            raise MemoryError("out of memory at 2 GiB")
        except MemoryError as e:
            raise RuntimeError(
                "Comparing\nTensorLikePair(id=(),\nresulted in the unexpected exception above."
            ) from e
    except RuntimeError as e:
        assert short_error(e).startswith("MemoryError: out of memory")


def test_a_vector_handed_to_red_gets_a_hint():
    """Cold learner, 07.red_add: red(dst.iterator, r.load()) failed with the DSL's raw verifier
    error."""
    from quack_edu.grading import hints

    text = "DSLRuntimeError: 'nvvm.red' op operand #1 must be 32-bit signless integer or 64-bit"
    assert "a red adds one scalar at one address" in hints.diagnose_compile_text(text)


def _numbers_exercise(**kw) -> Exercise:
    from quack_edu.grading.checks import value_check

    ex = Exercise(id="99.half", lesson="99_toy", answer="half", title="half", points={COMPILE: 1})
    ex.add(value_check("halves", lambda v: v / 2, lambda ctx, hidden: [(2.1119424,)], **kw))
    return ex


def test_a_failure_prints_the_figure_where_expected_and_seen_differ():
    """Off in the seventh figure: 6 significant figures read the same (issue 50), so the
    failure prints as many as it takes to tell them apart."""
    off = _fn("def half(v):\n    return v / 2 * (1 + 3e-6)\n", "half")
    (r,) = run_exercise(_numbers_exercise(), off).checks
    assert (r.status, r.expected, r.seen) == ("fail", "1.055971", "1.055974")
    (r,) = run_exercise(_numbers_exercise(), _fn("def half(v):\n    return v / 3\n", "half")).checks
    assert (r.expected, r.seen) == ("1.05597", "0.703981")


def test_an_error_an_exercise_knows_gets_its_hint():
    """``errors=``: a learner's exception it recognises fails with its hint; others fail as
    any error does (the runner's "raised ...", a compile error's hint or none)."""
    known = _numbers_exercise(errors=lambda e: "a hint" if "tuple" in str(e) else None)
    res = run_exercise(known, _fn("def half(v):\n    return (v,) * (v,)\n", "half"))
    assert "raised TypeError" in res.checks[0].message and res.checks[0].hint == "a hint"
    res = run_exercise(known, _fn("def half(v):\n    return 1 / 0\n", "half"))
    assert "ZeroDivisionError" in res.failures[0] and res.checks[0].hint != "a hint"
