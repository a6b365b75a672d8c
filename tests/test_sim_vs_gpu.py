"""scripts/sim_vs_gpu.py's CPU side: its cases, its comparison, its record (the GPU run itself
happens on the lead's H100; here the "GPU" is ptxsim again, ``--fake-gpu``).

The cases cover every stage ptxsim runs and every exercise the grader simulates, in every dtype
pair, at 20+ shapes with ragged row lengths; the comparison tells bit-equal outputs from ones a
rounding of fp32 apart and from wrong ones; a failing kernel is recorded, not raised; the record
is rewritten whole; the exit status says which of the three happened.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

from quack_edu.grading import all_exercises
from quack_edu.ptxsim import SIMULATED_STAGES

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _script():
    """The script as a module its pool's workers can import too (spawn passes sys.path on)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    return importlib.import_module("sim_vs_gpu")


def test_cases_cover_every_simulated_kernel_at_20_shapes_in_every_dtype():
    s = _script()
    specs = s.cases()
    assert len(s.shapes(specs)) >= 20 and {M for M, _ in s.shapes(specs)} == {1, 3, 7}
    simulated = {
        ex.id
        for ex in all_exercises()
        if any(c.name.startswith("values on the CPU") for c in ex.checks)
    }
    assert set(s.EXERCISES) | set(s.SCALE) == simulated
    assert not set(s.EXERCISES) & set(s.SCALE)
    for kind, names in (
        ("stage", SIMULATED_STAGES),
        ("backward", ("final_bwd",)),
        ("exercise", set(s.EXERCISES)),
    ):
        for name in names:
            mine = [x for x in specs if x.kind == kind and x.name == name]
            assert {(x.dtype, x.wdtype) for x in mine} >= set(s.DTYPES), name
            assert any(x.N & (x.N - 1) for x in mine), f"{name}: only powers of two"
    naive = {x.N for x in specs if x.name == "naive"}
    assert any(n % 8 for n in naive), "the naive stage takes any N: some N must be ragged"
    assert len({x.label for x in specs}) == len(specs)


def test_every_case_builds_its_kernel():
    """Configs and answers resolve for every spec (no compile: the objects only)."""
    s = _script()
    for spec in s.cases():
        if spec.kind == "scale":  # no kernel object: its answer in the exercise's launch
            continue
        kernel = s.kernel_of(spec)
        assert kernel.N == spec.N and kernel.launch_shape(7).grid[0] >= 1, spec.label


def _t(values, dtype):
    return torch.tensor(values, dtype=dtype)


def test_compare_tells_bitwise_rounding_and_differs():
    s = _script()
    a = _t([[1.0, -2.5, 0.0, 3.0e-3]], torch.bfloat16)
    assert s.compare(a, a.clone())["status"] == "bitwise"
    # one bf16 step at 1.0 is 2**-7: a rounding flip is within fp32 rounding, two steps are not
    b = a.clone()
    b[0, 0] = 1.0 + 2**-7
    got = s.compare(a, b)
    assert got["status"] == "fp32 rounding" and got["n_bits_differ"] == 1
    assert got["max_abs"] == pytest.approx(2**-7) and got["first_difference"]["index"] == [0, 0]
    b[0, 0] = 1.0 + 2**-6
    assert s.compare(a, b)["status"] == "differs"
    # fp32: a few ulps are rounding, 1e-4 relative is not
    f = _t([[1.0, 3.0, 0.0]], torch.float32)
    g = f.clone()
    g[0, 1] = torch.nextafter(g[0, 1], torch.tensor(9.0))
    assert s.compare(f, g)["status"] == "fp32 rounding"
    g[0, 1] = 3.0003
    got = s.compare(f, g)
    assert got["status"] == "differs" and got["max_rel"] == pytest.approx(1e-4, rel=1e-3)
    # NaN against a number differs, NaN against NaN is equal (never-written poison alike)
    n = f.clone()
    n[0, 2] = float("nan")
    assert s.compare(f, n)["status"] == "differs"
    assert s.compare(n, n.clone())["status"] == "bitwise"


def test_the_backward_is_bounded_by_its_terms_not_its_cancelled_value():
    """A dx element that is a difference of terms near 1 (an FFMA against two roundings moves
    it by an fp32 step of the terms) is within fp32 rounding of the terms, not of itself; a
    difference past the terms' bound still differs."""
    s = _script()
    gpu = _t([[3.0e-6, 1.0]], torch.float32)
    sim = gpu.clone()
    sim[0, 0] = 3.0e-6 + 2**-24  # one fp32 step at 1.0
    terms = torch.tensor([[2.0, 1.0]], dtype=torch.float64)
    assert s.compare(gpu, sim)["status"] == "differs"
    assert s.compare(gpu, sim, terms=terms)["status"] == "fp32 rounding"
    sim[0, 0] = 3.0e-6 + 2**-16
    assert s.compare(gpu, sim, terms=terms)["status"] == "differs"
    # the terms of dx and dw: x_hat = x * rstd, g = dout * w
    x, w, dout = (
        _t([[1.0, -1.0]], torch.float32),
        _t([2.0, 3.0], torch.float32),
        _t([[1.0, 1.0]], torch.float32),
    )
    dx_terms, dw_terms = s.bwd_terms(x, w, dout, torch.tensor([0.5]))
    assert dx_terms.tolist() == [[0.5 * (2 + 0.5 * 1.25), 0.5 * (3 + 0.5 * 1.25)]]
    assert dw_terms.tolist() == [0.5, 0.5]


def test_compare_reports_each_side_against_the_reference():
    s = _script()
    ref = _t([[1.0, 2.0]], torch.float32)
    got = s.compare(ref.clone(), ref * 2, ref)
    assert got["gpu_matches_ref"] and not got["sim_matches_ref"] and got["status"] == "differs"


def test_the_scale_kernel_runs_in_its_own_launch_and_a_wrong_one_misses_the_reference(
    monkeypatch,
):
    """01.scale_kernel's solution through ``run_scale`` (``--fake-gpu``: both sides ptxsim):
    one case, y compared whole (past N too) and against x * factor; the solution with its
    arithmetic changed still agrees with itself but not with the reference."""
    from quack_edu.grading import get
    from quack_edu.grading.nbfiles import answer_from_source
    from quack_edu.grading.notebook import exercise_source, read, solutions_dir

    s = _script()
    spec = s.Spec("scale", "01.scale_kernel", "01 launch", 1000, "fp16", "none")
    (rec,) = s.run_scale(spec, fake_gpu=True)
    assert rec["status"] == "bitwise" and rec["M"] == 1, rec
    assert rec["gpu_matches_ref"] and rec["sim_matches_ref"]
    ex = get("01.scale_kernel")
    src = exercise_source(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex)
    assert "(x * factor)" in src
    wrong = answer_from_source(src.replace("(x * factor)", "(x * factor + x)"), ex.answer)
    monkeypatch.setattr(s, "_answer", lambda _: wrong)
    (rec,) = s.run_scale(spec, fake_gpu=True)
    assert rec["status"] == "bitwise" and not rec["sim_matches_ref"], rec


def test_run_spec_records_each_m_and_failures_without_raising():
    """One kernel through the worker's path (compile with its PTX, the "GPU" run, ptxsim, the
    comparison), and a spec whose config cannot be made: recorded as errors."""
    s = _script()
    spec = s.Spec("exercise", "01.rstd", "default", 37, "fp32", "bf16")
    recs = s.run_spec(spec, fake_gpu=True)
    assert [r["M"] for r in recs] == list(s.MS)
    for r in recs:
        assert r["status"] == "bitwise" and r["gpu_matches_ref"] and r["sim_matches_ref"], r
        assert {"max_abs", "max_rel", "config", "compile_s", "sim_s", "name", "N"} <= set(r)
    bad = s.run_spec(s.Spec("stage", "warp", "no such plan", 64, "bf16", "bf16"), fake_gpu=True)
    assert [r["status"] for r in bad] == ["error"] * 3 and "no plan" in bad[0]["error"]


def test_the_backward_compares_dx_and_dw():
    s = _script()
    (rec,) = s.run_spec(s.Spec("backward", "final_bwd", "default", 1001, "fp32", "bf16"), True)[:1]
    assert (
        rec["status"] == "bitwise" and rec["dx"]["sim_matches_ref"] and rec["dw"]["gpu_matches_ref"]
    )


def test_the_record_is_written_whole_and_the_exit_status_says_what_happened(tmp_path):
    s = _script()
    base = dict(kind="stage", name="warp", plan="default", N=64, dtype="bf16", wdtype="bf16")
    ok = [{**base, "M": M, "status": "bitwise", "max_rel": 0.0} for M in s.MS]
    head = {"gpu": "test", "date": "today"}
    path = tmp_path / "r.json"
    s.write_record(path, head, ok, expected=6, done=False)
    body = json.loads(path.read_text())
    assert body["gpu"] == "test" and not body["complete"] and len(body["cases"]) == 3
    assert body["summary"]["done"] == 3 and body["summary"]["cases"] == 6
    assert s.exit_status(ok, 3) == 0 and s.exit_status(ok, 6) == 2  # not every case ran
    worse = ok + [{**base, "M": 9, "status": "differs", "max_rel": 0.5}]
    assert s.exit_status(worse, 4) == 1
    assert s.exit_status(ok + [{**base, "M": 9, "status": "error"}], 4) == 2
    assert not list(tmp_path.glob("*.tmp"))


def test_the_script_runs_end_to_end_without_a_gpu(tmp_path):
    """main() with one kernel, its pool of one process, the "GPU" ptxsim again."""
    s = _script()
    out = tmp_path / "r.json"
    rc = s.main(["--fake-gpu", "--jobs", "1", "--only", "naive [default] N=37 x fp32 w fp32",
                 "--out", str(out)])  # fmt: skip
    body = json.loads(out.read_text())
    assert rc == 0 and body["complete"] and body["summary"]["by_status"] == {"bitwise": 3}
    assert body["gpu"].startswith("none") and "date" in body and "versions" in body


def test_the_recorded_h100_comparison_is_what_docs_testing_quotes():
    rec = json.loads((ROOT / "benchmarks" / "results" / "sim_vs_gpu_h100.json").read_text())
    assert rec["gpu"].startswith("NVIDIA H100") and rec["complete"]
    by = rec["summary"]["by_status"]
    assert (len(rec["cases"]), by["bitwise"], by["fp32 rounding"]) == (908, 658, 250), by
    assert set(by) == {"bitwise", "fp32 rounding"}  # none differs, none failed to run
    s = _script()
    assert len(rec["cases"]) == sum(len(s.ms_of(c)) for c in s.cases())  # every case ran
    assert all(c["gpu_matches_ref"] and c["sim_matches_ref"] for c in rec["cases"])
    text = " ".join((ROOT / "docs" / "testing.md").read_text().split())
    assert "908 cases (308 kernels" in text and "658 bit for bit, 250 within" in text
    assert "none beyond it" in text
