"""The benchmark harness on a CPU: byte counts, kernel names, the verdict, tables and plots.

The timing itself needs a GPU (scripts/gpu_check.py); everything that turns rows into numbers,
criteria and figures is checked here on synthetic rows.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import types

import pytest
import torch
from test_rmsnorm_api import fake_kernel  # noqa: F401  (the fixture)

from quack_edu.tools import bench, kernels, timing
from quack_edu.tools.bench import (
    format_verdict,
    kernel_kind,
    parse_weight_dtypes,
    resolve_kernels,
    rmsnorm_bytes,
    split_name,
    table,
    verdict,
)

COPY = 4000.0


def test_bytes_count_weight_dtype_and_residual():
    M, N, bf16, fp32 = 4, 8, torch.bfloat16, torch.float32
    assert rmsnorm_bytes(M, N, bf16) == 2 * M * N * 2 + N * 2  # read x, write y, read w
    assert rmsnorm_bytes(M, N, bf16, fp32) == 2 * M * N * 2 + N * 4
    assert rmsnorm_bytes(M, N, fp32, bf16) == 2 * M * N * 4 + N * 2
    # + read residual, + write residual_out, both in x's dtype
    assert rmsnorm_bytes(M, N, bf16, residual=True) == 4 * M * N * 2 + N * 2
    assert rmsnorm_bytes(M, N, bf16, fp32, residual=True) == 4 * M * N * 2 + N * 4


def test_kernel_names_and_weight_dtypes():
    assert kernel_kind("lib") == kernel_kind("lib-tuned") == "library"
    assert kernel_kind("quack") == kernel_kind("torch-eager") == "peer"
    assert kernel_kind("final") == kernel_kind("cluster@hold#1") == "stage"
    assert split_name("lib-tuned") == ("lib-tuned", "", "")
    assert parse_weight_dtypes("bf16,fp32") == [torch.bfloat16, torch.float32]
    assert parse_weight_dtypes("same") == parse_weight_dtypes(None) == [None]
    assert parse_weight_dtypes("bf16, same,bf16") == [torch.bfloat16, None]
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_weight_dtypes("int8")


def test_library_kernels_resolve_lazily_and_skip_when_missing(monkeypatch):
    calls = []

    def rmsnorm_fwd(x, weight=None, bias=None, residual=None, eps=1e-6, **kw):
        calls.append((residual is not None, eps))
        out = x * 2
        return out, (x + residual if residual is not None else x), None

    fake = types.ModuleType("quack_edu.rmsnorm")
    fake.rmsnorm_fwd = rmsnorm_fwd  # no rmsnorm_fwd_tuned yet: skipped with the reason
    monkeypatch.setitem(sys.modules, "quack_edu.rmsnorm", fake)
    fns, skipped = resolve_kernels(["lib", "lib-tuned", "no-such-stage", "no-such-peer"])
    assert list(fns) == ["lib"]
    assert "rmsnorm_fwd_tuned" in skipped["lib-tuned"]
    assert "unknown stage" in skipped["no-such-stage"]
    x, w = torch.ones(2, 8), torch.ones(8)
    assert torch.equal(fns["lib"](x, w), x * 2)

    fns, skipped = resolve_kernels(["lib", "cpasync"], residual=True)
    out, res_out = fns["lib"](x, w, x)
    assert torch.equal(res_out, 2 * x) and calls[-1] == (True, bench.EPS)
    assert "no residual" in skipped["cpasync"]

    monkeypatch.setitem(sys.modules, "quack_edu.rmsnorm", None)  # not written yet
    fns, skipped = resolve_kernels(["lib"])
    assert not fns and "quack_edu.rmsnorm" in skipped["lib"]


def test_peer_names_unknown_and_modes():
    fns, missing = bench.peer_fns(names=("torch-ops", "bogus"))
    assert list(fns) == ["torch-ops"] and "unknown peer" in missing["bogus"]
    x, w = torch.randn(3, 16), torch.randn(16)
    from quack_edu.reference import rmsnorm_ref

    torch.testing.assert_close(fns["torch-ops"](x, w), rmsnorm_ref(x, w))
    fns, missing = bench.peer_fns(
        residual=True, names=("torch-ops", "torch-eager", "quack-autograd")
    )
    out, res = fns["torch-ops"](x, w, x)
    ref_out, ref_res = rmsnorm_ref(x, w, residual=x)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(res, ref_res)
    out, res = fns["torch-eager"](x, w, x)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    assert "quack-autograd" in missing  # the autograd entry is timed without a residual only


def test_peers_the_graders_sandbox_refuses_are_not_tried_while_graded(monkeypatch):
    # a lesson's bench cell under quack-edu grade: importing QuACK or Liger, or torch.compile's
    # C compiler, is refused there and flags the notebook (04, 05 and 08's solutions were flagged
    # on an H100, 2026-12-06); not even the import is tried
    import builtins

    tried = []
    real_import = builtins.__import__

    def spy(name, *args, **kwargs):
        if name.split(".")[0] in ("quack", "liger_kernel"):
            tried.append(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setenv("QUACK_EDU_GRADING", "1")
    monkeypatch.setattr(builtins, "__import__", spy)
    for pass_ in ("fwd", "bwd"):
        fns, missing = bench.peer_fns(names=bench.PEERS, pass_=pass_)
        assert set(kernels.GRADER_REFUSES) <= set(missing) and "torch-ops" in fns
        assert all("not run while quack-edu grade" in missing[k] for k in kernels.GRADER_REFUSES)
    assert tried == []
    monkeypatch.delenv("QUACK_EDU_GRADING")
    bench.peer_fns(names=("quack",))  # outside the grader it is tried
    assert tried


def test_per_call_us_counts_every_call_with_the_collector_off():
    gc_on = []
    us = bench.per_call_us(
        lambda: gc_on.append(gc.isenabled()), (), calls=50, sync=lambda: None, warmup=3
    )
    assert gc_on == [True] * 3 + [False] * 50 and us > 0  # timed calls: no collection pass
    assert gc.isenabled()  # and on again after


class _ClockEvent:
    """A CUDA event on a fake clock (ms) that the timed calls advance: no GPU needed."""

    now = 0.0

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        self.t = _ClockEvent.now

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return end.t - self.t


@pytest.mark.parametrize("call_us, batch", [(10.0, 100), (2000.0, 1)])
def test_time_calls_times_batches_of_back_to_back_calls(monkeypatch, call_us, batch):
    """time_calls(batch_s=1 ms): events around batches of calls spanning ~1 ms (a 2 ms call is
    a batch of its own), inputs rotating through every batch in order; the median batch over
    its calls. Without batch_s: events around each call, as before."""
    monkeypatch.setattr(torch.cuda, "Event", _ClockEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    _ClockEvent.now = 0.0
    seen = []

    def fn(i):
        seen.append(i)
        # every 7th call of the 10 us kernel is slow: a batch's median, not a call's, is kept
        slow = call_us < 100 and len(seen) % 7 == 0
        _ClockEvent.now += (call_us * (3 if slow else 1)) / 1e3

    sets = [(i,) for i in range(5)]
    us = bench.time_calls(fn, sets, warmup=4, budget_s=0.05, batch_s=1e-3)
    reps = int(0.05 / (call_us * 1e-6 * batch))
    assert len(seen) == 3 + 4 + reps * batch  # estimate, warm-up, the timed batches
    assert seen[7:] == [j % 5 for j in range(reps * batch)]
    expect = call_us * (1 + 2 / 7) if batch > 1 else call_us  # slow calls spread over batches
    assert us == pytest.approx(expect, rel=0.02)
    seen.clear()
    assert bench.time_calls(fn, sets, warmup=0, reps=6) == pytest.approx(call_us)  # per call
    assert len(seen) == 3 + 6


def _fake_gpu_run(monkeypatch, fns: dict, fake_bench_one) -> None:
    """``bench.run`` without a GPU: ``fns`` as the kernels, ``fake_bench_one`` timing them."""
    monkeypatch.setattr(bench, "resolve_kernels", lambda names, *a, **k: (fns, {}))
    monkeypatch.setattr(bench, "bench_one", fake_bench_one)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda: COPY)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


def test_rounds_take_turns_and_keep_each_kernels_median(monkeypatch):
    """run(rounds=3): at each shape every kernel is timed once a round, in turn (A B A B A B,
    not A A A B B B), and a row is the median of its rounds; a failing round is the row."""
    calls, times = [], {"a": iter([30.0, 10.0, 20.0]), "b": iter([5.0, 50.0, 6.0])}

    def fake_bench_one(fn, M, N, dtype, graph=False, weight_dtype=None, **kw):
        calls.append(fn.__name__)
        if fn.__name__ == "c":
            raise RuntimeError("c cannot do this")
        return {"M": M, "N": N, "dtype": "bf16", "weight_dtype": "bf16", "residual": False,
                "graph": graph, "bytes": 10**6, "us": next(times[fn.__name__]),
                "first_call_s": 1.0}  # fmt: skip

    fns = {n: types.SimpleNamespace(__name__=n) for n in "abc"}
    _fake_gpu_run(monkeypatch, fns, fake_bench_one)
    result = bench.run(["a", "b", "c"], [(8, 256)], bench.RunOptions(rounds=3), log=lambda *a: None)
    assert calls == list("abc" * 3) and result["rounds"] == 3
    by = {r["kernel"]: r for r in result["rows"]}
    assert by["a"]["us"] == 20.0 and by["a"]["us_rounds"] == [30.0, 10.0, 20.0]
    assert by["b"]["us"] == 6.0 and by["b"]["gbps"] == pytest.approx(1e6 / 6e-6 / 1e9)
    assert "c cannot do this" in by["c"]["error"] and "gbps" not in by["c"]
    with pytest.raises(ValueError, match="rounds"):
        bench.run(["a"], [(8, 256)], bench.RunOptions(rounds=0))


def test_launch_bound_shapes_get_more_rounds_of_fewer_calls(monkeypatch):
    """run(rounds=2, graph up to N = 2048): at N = 256 each kernel's plain and graph rows get
    LAUNCH_BOUND_ROUNDS x 2 rounds, each timed with that fraction of the budget; at N = 4096
    (plain only) 2 rounds of the whole budget; the record says how many."""
    seen = []

    def fake_bench_one(fn, M, N, dtype, graph=False, weight_dtype=None, budget_s=None, **kw):
        seen.append((N, graph, budget_s))
        return {"M": M, "N": N, "dtype": "bf16", "weight_dtype": "bf16", "residual": False,
                "graph": graph, "bytes": 10**6, "us": 10.0, "first_call_s": 1.0}  # fmt: skip

    fns = {"a": types.SimpleNamespace(__name__="a")}
    _fake_gpu_run(monkeypatch, fns, fake_bench_one)
    options = bench.RunOptions(rounds=2, graph=True, graph_max_n=2048, budget_s=0.6)
    result = bench.run(["a"], [(8, 256), (8, 4096)], options, log=lambda *a: None)
    k = bench.LAUNCH_BOUND_ROUNDS
    assert k >= 2
    short = [(g, b) for n, g, b in seen if n == 256]
    assert short == [(False, pytest.approx(0.6 / k)), (True, pytest.approx(0.6 / k))] * (2 * k)
    assert [(g, b) for n, g, b in seen if n == 4096] == [(False, 0.6)] * 2
    assert [len(r["us_rounds"]) for r in result["rows"]] == [2 * k, 2 * k, 2]
    assert result["rounds"] == 2 and result["rounds_launch_bound"] == 2 * k
    assert result["plain_batch_s"] == bench.PLAIN_BATCH_S  # the record says how plain rows time


def test_weight_dtypes_take_turns_inside_a_round(monkeypatch):
    """run(rounds=2, two weight dtypes): a round times every kernel with each weight dtype,
    a kernel's two next to each other (bf16 a, fp32 a, bf16 b, fp32 b, then again), so that
    fp32 against bf16 compares the same few seconds of the GPU; the rows come out grouped by
    weight dtype, each the median of its own rounds."""
    calls = []

    def fake_bench_one(fn, M, N, dtype, graph=False, weight_dtype=None, **kw):
        w = "fp32" if weight_dtype is torch.float32 else "bf16"
        calls.append(w + fn.__name__)
        us = {"bf16": 10.0, "fp32": 20.0}[w] + len(calls)  # distinct per call
        return {"M": M, "N": N, "dtype": "bf16", "weight_dtype": w, "residual": False,
                "graph": graph, "bytes": 10**6, "us": us, "first_call_s": 1.0}  # fmt: skip

    fns = {n: types.SimpleNamespace(__name__=n) for n in "ab"}
    _fake_gpu_run(monkeypatch, fns, fake_bench_one)
    wdts = [torch.bfloat16, torch.float32]
    options = bench.RunOptions(rounds=2, weight_dtypes=wdts)
    result = bench.run(["a", "b"], [(8, 256)], options, log=lambda *a: None)
    assert calls == ["bf16a", "fp32a", "bf16b", "fp32b"] * 2
    got = [(r["weight_dtype"], r["kernel"], r["us_rounds"]) for r in result["rows"]]
    assert got == [
        ("bf16", "a", [11.0, 15.0]),
        ("bf16", "b", [13.0, 17.0]),
        ("fp32", "a", [22.0, 26.0]),
        ("fp32", "b", [24.0, 28.0]),
    ]


def test_a_kernels_weight_dtypes_are_timed_next_to_each_other_in_each_mode(monkeypatch):
    """With graph rows too: bf16 then fp32 weight plain, then both through a graph, kernel by
    kernel (the pair the fp32-against-bf16 criterion compares has no other kernel between)."""
    calls = []

    def fake_bench_one(fn, M, N, dtype, graph=False, weight_dtype=None, **kw):
        w = "fp32" if weight_dtype is torch.float32 else "bf16"
        calls.append((fn.__name__, "graph" if graph else "plain", w))
        return {"M": M, "N": N, "dtype": "bf16", "weight_dtype": w, "residual": False,
                "graph": graph, "bytes": 10**6, "us": 10.0, "first_call_s": 1.0}  # fmt: skip

    fns = {n: types.SimpleNamespace(__name__=n) for n in "ab"}
    _fake_gpu_run(monkeypatch, fns, fake_bench_one)
    wdts = [torch.bfloat16, torch.float32]
    options = bench.RunOptions(rounds=1, weight_dtypes=wdts, graph=True, graph_max_n=2048)
    bench.run(["a", "b"], [(8, 256)], options, log=lambda *a: None)
    one_round = [(k, m, w) for k in "ab" for m in ("plain", "graph") for w in ("bf16", "fp32")]
    assert calls == one_round * bench.LAUNCH_BOUND_ROUNDS


# --- the verdict on synthetic rows ----------------------------------------------------------


def row(kernel, N, gbps, w="bf16", graph=False, residual=False, M=32768, **extra):
    r = {"kernel": kernel, "M": M, "N": N, "dtype": "bf16", "weight_dtype": w, "graph": graph}
    r.update(residual=residual, us=1.0, gbps=gbps, pct_copy=100 * gbps / COPY, **extra)
    return r


# ours GB/s per (N, graph): 1024 has no copy band; 4096 is in the 95% band, 131072 in the 93% one
OURS = {(1024, False): 3000.0, (1024, True): 3600.0, (4096, False): 3900.0, (131072, False): 3800}


def passing_rows(quack=1 / 1.1, liger=1 / 1.2, fp32_scale=1.0, residual=True):
    rows = []
    for w in ("bf16", "fp32"):
        for (N, g), got in OURS.items():
            got *= fp32_scale if w == "fp32" else 1.0
            rows += [
                row("lib", N, got, w, g),
                row("quack", N, got * quack, w, g),
                row("liger", N, got * liger, w, g),
                row("cpasync", N, got * 1.5, w, g),  # a stage of ours is not a peer
            ]
    if residual:
        for N in (4096, 16384, 65536):
            rows += [row("lib", N, 3900, residual=True), row("quack", N, 3800, residual=True)]
    return rows


def status(v, fragment):
    hits = [c for c in v["checks"] if fragment in c["name"]]
    assert len(hits) == 1, [c["name"] for c in v["checks"]]
    return hits[0]["status"], hits[0]["detail"]


def test_verdict_passes_every_criterion():
    v = verdict(passing_rows())
    assert v["overall"] == "PASS", format_verdict(v)
    assert {c["status"] for c in v["checks"]} == {"PASS"}
    bf16 = v["by_weight_dtype"]["bf16"]
    assert bf16["geomean_vs_quack"] == pytest.approx(1.1)
    assert bf16["geomean_vs_quack_all"] == pytest.approx(1.1)
    e = next(e for e in bf16["shapes"] if e["N"] == 4096)
    assert e["best_peer"] == "quack" and e["vs_best_peer"] == pytest.approx(1.1)
    assert e["pct_copy"] == pytest.approx(97.5)
    e = next(e for e in v["by_weight_dtype"]["fp32"]["shapes"] if e["N"] == 4096)
    assert e["fp32_vs_bf16"] == pytest.approx(1.0)
    assert len(v["fp32_vs_bf16"]) == 4  # every shape and mode that both weight dtypes ran
    text = format_verdict(v)
    assert "weights fp32:" in text and "overall: PASS" in text and "with a residual" in text
    assert json.dumps(v)


def test_verdict_fails_below_the_best_peer():
    rows = passing_rows()
    rows.append(row("liger", 4096, 3900 * 1.02, graph=False))  # a later row replaces the first
    ok, detail = status(verdict(rows), "[w bf16] every shape >= best peer - 1.5%")
    assert ok == "FAIL" and "32768x4096 0.980x liger" in detail
    assert status(verdict(rows), "[w fp32] every shape")[0] == "PASS"
    # within the margin: 1% behind the best peer still passes
    rows[-1] = row("liger", 4096, 3900 * 1.01)
    assert status(verdict(rows), "[w bf16] every shape")[0] == "PASS"


def test_verdict_fails_a_small_geomean():
    rows = [
        r for r in passing_rows() if not (r["kernel"] == "quack" and r["weight_dtype"] == "fp32")
    ]
    rows += [row("quack", N, got / 1.02, "fp32", g) for (N, g), got in OURS.items()]
    v = verdict(rows)
    ok, detail = status(v, "[w fp32] geomean vs QuACK >= 1.05x")
    assert ok == "FAIL" and "1.020x over 3 shapes" in detail
    assert status(v, "[w bf16] geomean")[0] == "PASS"
    assert verdict(rows, geomean_min=1.01)["overall"] == "PASS"  # thresholds are parameters


def test_verdict_fails_slow_fp32_weights():
    rows = passing_rows()
    rows.append(row("lib", 1024, 3000 * 0.97, "fp32"))
    ok, detail = status(verdict(rows), "fp32 weights within 2% of bf16 weights")
    assert ok == "FAIL" and "32768x1024 0.970" in detail
    rows[-1] = row("lib", 1024, 3000 * 0.985, "fp32")
    assert status(verdict(rows), "fp32 weights")[0] == "PASS"
    rows[-1] = row("lib", 1024, 3000 * 1.05, "fp32")  # faster with fp32 weights is no failure
    assert status(verdict(rows), "fp32 weights")[0] == "PASS"
    only_bf16 = [r for r in rows if r["weight_dtype"] == "bf16"]
    assert status(verdict(only_bf16), "fp32 weights")[0] == "N/A"


def test_verdict_fails_below_the_copy_band():
    rows = passing_rows()
    rows += [row("lib", 131072, 3700), row("quack", 131072, 3000)]  # 92.5% < 93%
    ok, detail = status(verdict(rows), "[w bf16] % of copy")
    assert ok == "FAIL" and "32768x131072 92.5% < 93%" in detail
    rows += [row("lib", 131072, 3740)]  # 93.5%
    assert status(verdict(rows), "[w bf16] % of copy")[0] == "PASS"
    rows += [row("lib", 4096, 3790), row("quack", 4096, 3000)]  # 94.75% < 95%
    assert status(verdict(rows), "[w bf16] % of copy")[0] == "FAIL"


def test_verdict_fails_a_residual_behind_quack_and_is_incomplete_without_one():
    rows = passing_rows()
    rows.append(row("quack", 16384, 3950, residual=True))
    ok, detail = status(verdict(rows), "residual >= 1x QuACK at N=4K,16K,64K")
    assert ok == "FAIL" and "32768x16384" in detail
    v = verdict(passing_rows(residual=False))
    assert status(v, "residual")[0] == "N/A" and v["overall"] == "INCOMPLETE"


def test_verdict_an_error_row_of_ours_fails_its_shape():
    rows = passing_rows()
    rows.append({**row("lib", 4096, 0), "error": "RuntimeError: boom"})
    for r in rows[-1:]:
        del r["gbps"], r["pct_copy"]
    v = verdict(rows)
    assert "32768x4096 error" in status(v, "[w bf16] every shape")[1]
    assert status(v, "[w bf16] geomean")[0] == "FAIL"
    assert status(v, "[w bf16] % of copy")[0] == "FAIL"
    assert "error" in format_verdict(v)


def test_verdict_judges_the_kernel_named_ours():
    rows = passing_rows() + [row("lib-tuned", 4096, 100.0)]
    assert verdict(rows, ours="lib")["overall"] == "PASS"
    v = verdict(rows, ours="lib-tuned")
    assert status(v, "[w bf16] every shape")[0] == "FAIL"
    assert list(v["by_weight_dtype"]) == ["bf16"]


# --- table, plot, command line --------------------------------------------------------------


def result_of(rows):
    return {"gpu": "NVIDIA H200", "date": "2026-12-01", "copy_gbps": COPY, "rows": rows}


def test_table_has_a_line_per_weight_dtype_and_mode():
    text = table(result_of(passing_rows()))
    lines = [ln.split() for ln in text.splitlines()]
    assert ["32768x4096", "bf16", "plain", "3900", "3545", "3250", "5850"] in lines, text
    assert ["32768x4096", "fp32", "plain", "3900", "3545", "3250", "5850"] in lines, text
    assert ["32768x4096", "bf16", "plain+res", "3900", "3800", "-", "-"] in lines, text
    assert "4000" in text.splitlines()[0]
    # rows recorded before weight dtypes were an option: x's dtype is the weight's
    old = [
        {k: v for k, v in r.items() if k not in ("weight_dtype", "residual")}
        for r in passing_rows()
    ]
    lines = [ln.split() for ln in table(result_of(old)).splitlines()]
    assert ["32768x4096", "bf16", "plain", "3900", "3545", "3250", "5850"] in lines


def test_plot_writes_a_png_with_a_panel_per_weight_dtype(tmp_path):
    path = tmp_path / "bench.png"
    bench.plot(result_of(passing_rows(residual=False)), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    height, width = matplotlib.image.imread(path).shape[:2]
    assert width > 1.5 * height  # two panels side by side


def test_summarize_recorded_runs_without_a_gpu(tmp_path, capsys):
    a, b = tmp_path / "sweep.json", tmp_path / "residual.json"
    rows = passing_rows(residual=False)
    res_rows = [r for r in passing_rows() if r["residual"]]
    overhead = [{"kernel": "lib", "M": 1, "N": 1024, "weight_dtype": "bf16", "calls": 2000}]
    overhead[0]["us_per_call"] = 6.5
    compile_rows = [{"kernel": "lib", "M": 1024, "N": 3000, "weight_dtype": "bf16"}]
    compile_rows[0].update(compile_s=1.25, second_call_s=1e-4, fresh_s=[0.7, 0.9, 0.8])
    compile_rows[0].update(fresh_median_s=0.8, fresh_import_s=[1.0, 1.1, 1.0])
    a.write_text(json.dumps({**result_of(rows), "overhead": overhead, "compile": compile_rows}))
    b.write_text(json.dumps(result_of(res_rows)))
    png = tmp_path / "all.png"
    assert bench.main(["--summarize", str(a), str(b), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "overall: PASS" in out and "6.5 us/call" in out and "first call 1.25 s" in out
    assert "in fresh processes 0.70/0.90/0.80 s (median 0.80)" in out
    assert png.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_bench_module_without_a_gpu_exits_2(subprocess_env):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "quack_edu.tools.bench",
            "--stages",
            "lib",
            "--weight-dtype",
            "bf16,fp32",
        ],
        capture_output=True,
        text=True,
        env=subprocess_env,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs a CUDA GPU" in done.stderr and "benchmarks/results" in done.stderr


def _script(name: str):
    """scripts/<name>.py as a module."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gpu_check():
    return _script("gpu_check")


def test_ptx_compare_exits_1_when_a_kernel_differs(tmp_path, capsys):
    """scripts/ptx_compare.py compare: 0 only for the same PTX to the byte; 1 for the same
    instructions in another order, an instruction more or less, or folders of different cases."""
    pc = _script("ptx_compare")

    def dump(name, ops, cases=("fwd N=7",)):
        d = tmp_path / name
        d.mkdir()
        (d / "meta.json").write_text(json.dumps({"cases": list(cases), "times": {"0": 1.0}}))
        (d / "0.txt").write_text("\n".join(ops))
        (d / "0.ptx").write_text("\n".join(f"\t{op} %r1;" for op in ops))
        return str(d)

    a = dump("a", ["ld.global.v4", "st.global.v4"])
    assert pc.compare(a, dump("same", ["ld.global.v4", "st.global.v4"])) == 0
    assert "0 of 1 differ in instructions, 0 of 1 in bytes" in capsys.readouterr().out
    assert pc.compare(a, dump("moved", ["st.global.v4", "ld.global.v4"])) == 1
    assert "0 of 1 differ in instructions, 1 of 1 in bytes" in capsys.readouterr().out
    assert pc.compare(a, dump("more", ["ld.global.v4", "st.global.v4", "st.global.v4"])) == 1
    assert "1 of 1 differ" in capsys.readouterr().out
    assert pc.compare(a, dump("other", ["ld.global.v4", "st.global.v4"], ("bwd N=7",))) == 1
    capsys.readouterr()
    # a dump made before .ptx files were saved: its bytes are not compared, its instructions are
    old = dump("old", ["ld.global.v4", "st.global.v4"])
    (tmp_path / "old" / "0.ptx").unlink()
    assert pc.compare(old, a) == 0
    out = capsys.readouterr().out
    assert "bytes not compared" in out and "0 of 1 in bytes (1 not compared: no .ptx)" in out
    assert pc.compare(old, dump("old_more", ["ld.global.v4", "st.global.v4", "st.global.v4"])) == 1


def test_ab_config_changes_only_the_fields_named():
    from quack_edu.stages.final import final_config
    from quack_edu.stages.final_bwd import bwd_config

    ab = _script("ab_config")
    bf16, fp32 = torch.bfloat16, torch.float32
    text = "refill_early=True, cluster_n=8"
    variants = {text: ab.parse_variant(text), "buffers=9": ab.parse_variant("buffers=9")}
    assert variants[text] == {"refill_early": True, "cluster_n": 8}
    got = ab.sides(131072, bf16, fp32, variants)
    a, b = got["A"], got[text]
    assert a == bwd_config(131072, bf16, fp32)
    assert (b.refill_early, b.cluster_n) == (True, 8) and b.num_threads == a.num_threads
    assert got["buffers=9"].startswith("does not fit")  # reported, not raised
    for bad in ("refill_early", "no_such_field=1", "cluster_n=eight"):
        with pytest.raises(SystemExit, match="--variant"):
            ab.parse_variant(bad)
    # the forward's fields are FinalConfig's: blocks_per_cta is one, refill_early is not
    fwd = {"blocks_per_cta=8": ab.parse_variant("blocks_per_cta=8", "fwd")}
    got = ab.sides(131072, bf16, fp32, fwd, "fwd")
    assert (
        got["A"] == final_config(131072, bf16, fp32) and got["blocks_per_cta=8"].blocks_per_cta == 8
    )
    with pytest.raises(SystemExit, match="--variant"):
        ab.parse_variant("refill_early=True", "fwd")
    # with a residual the forward's pick and fit are those of a kernel that reads one
    from quack_edu.stages.final import Features, FinalRMSNorm

    res = Features(residual_dtype=bf16)
    got = ab.sides(65536, bf16, bf16, {"buffers=2": {"buffers": 2}}, "fwd", residual=True)
    assert got["A"] == final_config(65536, bf16, bf16, res)
    k = FinalRMSNorm(bf16, 65536, got["A"], bf16, res)
    assert k.smem_bytes() > FinalRMSNorm(bf16, 65536, got["A"], bf16).smem_bytes()
    # the backward's: a kernel that reads dresidual_out
    from quack_edu.stages.final_bwd import BwdFeatures

    got = ab.sides(131072, bf16, fp32, {"plain": {"invariant_loads": False}}, "bwd", residual=True)
    assert got["A"] == bwd_config(131072, bf16, fp32, BwdFeatures(dres_out_dtype=bf16))
    assert got["A"].invariant_loads and not got["plain"].invariant_loads


def test_ab_config_forward_looks_its_kernel_up_once(monkeypatch):
    """A forward side finds its compiled kernel once per kind of input (as the library's plain
    path does), with the side's config and class, then only launches it: a lookup per call
    made the host the limit at N = 512."""
    from quack_edu.stages import final

    ab = _script("ab_config")
    looked, launched = [], []

    class Fake:
        def call(self, x, w, b, r, out, ro, rstd, eps):
            launched.append((x.data_ptr(), out.shape, eps))

    def kernel_for(x, w, b, r, out, ro, rstd, config=None, kernel_cls=None):
        looked.append((x.shape[-1], w.dtype, config, kernel_cls))
        return Fake()

    monkeypatch.setattr(final, "kernel_for", kernel_for)
    fn = ab.run_with("CFG", "fwd", kernel_cls="K")
    sets = [(torch.ones(4, 64), torch.ones(64)) for _ in range(3)]
    for x, w in sets * 2:
        assert fn(x, w).shape == x.shape
    assert looked == [(64, torch.float32, "CFG", "K")]  # one kind of input: one lookup
    assert [p for p, _, _ in launched] == [x.data_ptr() for x, _ in sets * 2]
    fn(torch.ones(4, 64, dtype=torch.bfloat16), torch.ones(64))  # another kind: looked up
    assert len(looked) == 2 and fn(torch.ones(0, 64), torch.ones(64)).shape == (0, 64)
    assert len(launched) == 7  # M = 0: nothing launched


def test_ncu_plans_parses_a_weight_dtype_and_config_fields():
    ncu = _script("ncu_plans")
    assert ncu.parse_plan("fp32:cluster_n=8,buffers=2,weight_in_smem=True") == (
        "fp32",
        {"cluster_n": 8, "buffers": 2, "weight_in_smem": True},
    )
    assert ncu.parse_plan("bf16") == ("bf16", {})  # the heuristic's plan
    for bad in ("int8:buffers=2", "fp32:bufers=2", "fp32:buffers", "fp32:buffers=two"):
        with pytest.raises(SystemExit, match="--plan"):
            ncu.parse_plan(bad)


def test_ab_config_switches_a_kernel_attribute():
    """--variant hint_copies=False: the same config, run by a subclass with the attribute off
    (its own compile key), whose x copies carry no L2 cache policy."""
    from quack_edu.stages.final import FinalRMSNorm
    from quack_edu.tools.inspect import compile_report

    ab = _script("ab_config")
    bf16 = torch.bfloat16
    changes = ab.parse_variant("hint_copies=False", "fwd")
    assert changes == {"hint_copies": False} and ab.kernel_class({"buffers": 2}, "fwd") is None
    got = ab.sides(8192, bf16, bf16, {"off": changes}, "fwd")
    assert got["off"] == got["A"]
    off = ab.kernel_class(changes, "fwd")
    assert issubclass(off, FinalRMSNorm) and off.hint_copies is False and FinalRMSNorm.hint_copies
    plain = compile_report(off, 8192, bf16, sass=False)
    hinted = compile_report("final", 8192, bf16, sass=False)
    assert plain.count("L2::cache_hint") == 0 and plain.count("cp.async.cg.shared.global [") > 0
    assert hinted.count("cp.async.cg.shared.global.L2::cache_hint") > 0
    with pytest.raises(SystemExit, match="--variant"):
        ab.parse_variant("hint_copies", "fwd")


def test_gpu_check_runs_every_test_file():
    from pathlib import Path

    from quack_edu.stages import STAGE_ORDER

    gpu_check = _gpu_check()
    runs = gpu_check.test_plan(gpu_check.parser().parse_args([]), STAGE_ORDER)
    names = [n for n, _, _ in runs]
    assert names == [
        *(f"values:{s}" for s in STAGE_ORDER),
        "fuzz",
        "gpu tests (parallel)",
        "other gpu tests",
        "gpu tests (alone)",
        "grading",
        "other tests",
    ]
    # only the runs that just check values share the GPU
    assert [n for n, _, together in runs if together] == names[: len(STAGE_ORDER) + 1]
    # every test file is in a gpu run (-m gpu) and in a not-gpu run (-m "not gpu")
    root = Path(__file__).resolve().parent
    files = {f"tests/{p.name}" for p in root.glob("test_*.py")}
    for marker in ("gpu", "not gpu"):
        covered = set()
        for _, args, _ in runs:
            if args[:2] != ["-m", marker]:
                continue
            paths = [x for x in args if x.startswith("tests")]
            ignored = {x.split("=", 1)[1] for x in args if x.startswith("--ignore=")}
            covered |= (files - ignored) if "tests" in paths else set(paths) & files
        assert covered == files, (marker, files - covered)
    # the timed tests share the GPU with few processes; the grader's with many
    args = {n: a for n, a, _ in runs}
    assert args["other gpu tests"][2:4] == ["-n", "3"] and args["grading"][2:4] == ["-n", "12"]
    # three calls where one would run past the device's 10 minutes
    parts = {
        p: [
            n
            for n, _, _ in gpu_check.test_plan(
                gpu_check.parser().parse_args(["--part", p]), STAGE_ORDER
            )
        ]
        for p in ("gpu", "timed", "lessons")
    }
    assert parts["gpu"] + parts["timed"] + parts["lessons"] == names
    assert parts["timed"] == ["other gpu tests", "gpu tests (alone)"]
    # a latency test shares the GPU with nothing (the bench tests' traffic evicts its L2)
    assert args["gpu tests (alone)"] == ["-m", "gpu", *gpu_check.ALONE]
    assert all(f"--ignore={t}" in args["other gpu tests"] for t in gpu_check.ALONE)


def test_gpu_check_keeps_what_a_run_cut_off_printed(tmp_path):
    """A run's output is in its log while it runs: a device call cut off from outside (the
    tool's 10 minutes) still brings back what the tests had printed."""
    import sys
    import threading
    import time

    gpu_check = _gpu_check()
    log = tmp_path / "run.log"
    code = "import time; print('first half'); time.sleep(30)"
    result = []
    run = threading.Thread(
        target=lambda: result.append(gpu_check.sh([sys.executable, "-c", code], log, timeout=5))
    )
    run.start()
    seen = False
    for _ in range(45):  # up to 4.5 s, while the command still sleeps
        seen = log.exists() and "first half" in log.read_text()
        if seen:
            break
        time.sleep(0.1)
    assert seen and run.is_alive()
    run.join()
    rc, text, dt = result[0]
    assert rc == 124 and dt < 25 and "[timed out after 5 s]" in text
    assert "first half" in text and log.read_text() == text
    code = "import sys; print('a'); sys.exit(3)"
    rc, text, _ = gpu_check.sh([sys.executable, "-c", code], log)
    assert (rc, text.strip(), log.read_text()) == (3, "a", text)


def test_gpu_check_bench_commands(tmp_path):
    gpu_check = _gpu_check()

    def commands(*argv):
        a = gpu_check.parser().parse_args(list(argv))
        return {name: cmd for name, cmd, _ in gpu_check.bench_commands(a, tmp_path, "python3")}

    got = commands("--bench-pass", "both", "--peers", "quack")
    assert set(got) == {"bench", "bench bwd"}
    assert "--shapes" in got["bench bwd"] and "--residual" not in got["bench bwd"]
    assert all(cmd[cmd.index("--rounds") + 1] == "1" for cmd in got.values())  # one call's time
    got = commands("--bench-pass", "both", "--rounds", "3")  # a recorded run: kernels in turn
    assert all(cmd[cmd.index("--rounds") + 1] == "3" for cmd in got.values())
    assert got["bench bwd"][got["bench bwd"].index("--peers") + 1] == "quack,torch-compile"
    written = [str(tmp_path / "bench.json"), str(tmp_path / "bench.png")]
    assert got["bench"][-4:] == ["--json", written[0], "--png", written[1]]
    # the pre-norm kind: both passes with --residual, on the residual shapes, the backward
    # against QuACK (the autograd peers have no prenorm backward here)
    got = commands("--bench-pass", "both", "--residual")
    assert all("--residual" in cmd and "--shapes" not in cmd for cmd in got.values())
    assert got["bench bwd"][got["bench bwd"].index("--peers") + 1] == "quack"
    assert commands("--skip-bench") == {}
    # the whole ladder in one record: bench --pass both over the bench's own sweep
    got = commands("--bench-pass", "ladder", "--rounds", "2")
    assert set(got) == {"ladder"}
    cmd = got["ladder"]
    assert cmd[cmd.index("--pass") + 1] == "both"
    assert cmd[cmd.index("--stages") + 1] == "all,cluster@hold,cluster@late"
    assert cmd[cmd.index("--graph-max-n") + 1] == "2048"  # the record's command (ladder.json)
    assert cmd[cmd.index("--weight-dtype") + 1] == "bf16,fp32" and "--shapes" not in cmd
    assert cmd[cmd.index("--rounds") + 1] == "2" and cmd[-1] == str(tmp_path / "ladder.png")


def test_gpu_check_summary_prints_the_verdict(tmp_path):
    gpu_check = _gpu_check()
    path = tmp_path / "bench.json"
    assert gpu_check.bench_summary(path, "lib") == "(no bench.json)"
    path.write_text(json.dumps(result_of(passing_rows())))  # a run cut off has no "verdict" key
    text = gpu_check.bench_summary(path, "lib")
    assert "32768x4096" in text and "overall: PASS" in text
    text = gpu_check.bench_summary(path, "cpasync")  # --ours: another kernel judged
    assert "Verdict for cpasync" in text and "overall: INCOMPLETE" in text  # no residual rows
    # a backward run is judged by the backward's bar: no residual criterion, 85%/75% of copy
    path.write_text(json.dumps({**result_of(passing_rows(residual=False)), "pass": "bwd"}))
    text = gpu_check.bench_summary(path, "lib")
    assert "85% at N 4096-32768" in text and "residual" not in text.split("Verdict")[1]
    # a ladder record (--pass both): a table and a verdict a pass; cut off in its forward, one
    fwd = {**result_of(passing_rows(residual=False)), "pass": "fwd"}
    bwd = {**result_of(passing_rows(residual=False)), "pass": "bwd"}
    path.write_text(json.dumps({"pass": "both", "fwd": fwd, "bwd": bwd}))
    text = gpu_check.bench_summary(path, "lib")
    assert text.count("Verdict for lib") == 2 and "85% at N 4096-32768" in text
    path.write_text(json.dumps({"pass": "both", "fwd": fwd}))
    assert gpu_check.bench_summary(path, "lib").count("Verdict for lib") == 1


@pytest.mark.gpu
def test_bench_one_times_the_library_with_fp32_weights_and_a_residual():
    fn = bench.library_fn("lib", residual=True)
    r = bench.bench_one(fn, 1024, 1024, torch.bfloat16, True, torch.float32, residual=True)
    assert r["weight_dtype"] == "fp32" and r["residual"] and r["graph"] and r["gbps"] > 0
    assert r["bytes"] == rmsnorm_bytes(1024, 1024, torch.bfloat16, torch.float32, True)


# --- the backward pass ----------------------------------------------------------------------


def test_backward_bytes_are_quacks_count():
    # x and dout read, dx written (bf16), the weight, and rstd in fp32
    assert bench.rmsnorm_bwd_bytes(8, 1024, torch.bfloat16) == 3 * 8 * 1024 * 2 + 1024 * 2 + 32
    assert bench.rmsnorm_bwd_bytes(8, 1024, torch.bfloat16, torch.float32) == (
        3 * 8 * 1024 * 2 + 1024 * 4 + 32
    )
    # a prenorm backward reads dresidual_out (x's dtype) too
    assert bench.rmsnorm_bwd_bytes(8, 1024, torch.bfloat16, residual=True) == (
        4 * 8 * 1024 * 2 + 1024 * 2 + 32
    )


def test_autograd_peer_backward_is_autograds_and_replays():
    calls = []

    def forward(x, w):
        calls.append(1)
        return kernels._composed(x, w)

    fn = kernels.autograd_bwd(forward)
    x, w = torch.randn(5, 64), torch.randn(64)
    dout = torch.randn(5, 64)
    rstd = torch.rsqrt(x.square().mean(-1) + bench.EPS)
    for _ in range(3):
        dx, dw = fn(x, w, dout, rstd)
    assert len(calls) == 1 and fn.stream is None  # one forward, backward replayed
    timing.check_grads((dx, dw), (x, w, dout, rstd), torch.float32)
    with pytest.raises(AssertionError, match="dx"):
        timing.check_grads((dx * 1.1, dw), (x, w, dout, rstd), torch.float32)
    with pytest.raises(AssertionError, match="dw"):
        timing.check_grads((dx, dw + 0.1), (x, w, dout, rstd), torch.float32)
    fn.clear()
    fn(x, w, dout, rstd)
    assert len(calls) == 2


def test_backward_peers_and_kernels_resolve():
    fns, missing = bench.peer_fns(names=bench.PEERS, pass_="bwd")
    assert {"torch-eager", "torch-ops"} <= set(fns)
    assert "not timed" in missing["liger"] and "not timed" in missing["quack-autograd"]
    fns, skipped = bench.resolve_kernels(["lib", "cpasync"], pass_="bwd")
    assert "timed through final_bwd and the library" in skipped["cpasync"]
    # the prenorm backward (a dresidual_out): the library and QuACK; the autograd peers say so
    fns, skipped = bench.resolve_kernels(["lib", "torch-compile", "torch-eager"], True, "bwd")
    assert set(fns) == {"lib"}
    assert all("prenorm backward is not timed" in skipped[k] for k in skipped)


@pytest.mark.gpu
def test_bench_times_a_prenorm_backward_against_quack():
    pytest.importorskip("quack")
    options = bench.RunOptions(peers="quack", residual=True, pass_="bwd", budget_s=0.05)
    res = bench.run(["lib"], [(199, 4104)], options, log=lambda *_: None)
    assert {r["kernel"] for r in res["rows"]} == {"lib", "quack"}, res.get("skipped")
    nbytes = bench.rmsnorm_bwd_bytes(199, 4104, torch.bfloat16, residual=True)
    assert all(r["residual"] and r["bytes"] == nbytes for r in res["rows"])


def test_backward_verdict_thresholds():
    # 85% of copy at 4K-32K, 75% at 64K-262K, geomean >= 1.10x QuACK, >= 0.98x the best peer
    t = bench.thresholds_for("bwd")
    rows = []
    for w in ("bf16", "fp32"):
        for N, pct in ((4096, 86.0), (65536, 76.0)):
            got = COPY * pct / 100
            rows += [row("lib", N, got, w), row("quack", N, got / 1.2, w)]
            rows += [row("torch-compile", N, got / 1.01, w)]
    v = verdict(rows, **t)
    assert v["overall"] == "PASS", format_verdict(v)
    slow = [dict(r, gbps=r["gbps"] * 0.95, pct_copy=r["pct_copy"] * 0.95) for r in rows]
    slow = [r if r["kernel"] == "lib" else rows[i] for i, r in enumerate(slow)]
    v = verdict(slow, **t)
    for w in ("bf16", "fp32"):
        assert status(v, f"[w {w}] % of copy")[0] == "FAIL"
        assert status(v, f"[w {w}] every shape")[0] == "FAIL"  # 0.95 / 1.01 < 0.98
        assert status(v, f"[w {w}] geomean")[0] == "PASS"  # 1.2 * 0.95 = 1.14
    assert not [c for c in v["checks"] if "residual" in c["name"] or "fp32 w" in c["name"]]


@pytest.mark.gpu
def test_ab_config_times_a_prenorm_backward():
    # the A/B's backward with a dresidual_out: values checked by bench_one, its bytes counted
    from quack_edu.stages.final_bwd import BwdFeatures, bwd_config

    ab = _script("ab_config")
    bf16 = torch.bfloat16
    cfg = bwd_config(4096, bf16, bf16, BwdFeatures(dres_out_dtype=bf16))
    fn = ab.run_with(cfg, "bwd", residual=True)
    r = bench.bench_one(fn, 1024, 4096, bf16, False, bf16, residual=True, pass_="bwd")
    assert r["bytes"] == bench.rmsnorm_bwd_bytes(1024, 4096, bf16, residual=True) and r["gbps"] > 0


@pytest.mark.gpu
def test_bench_one_times_the_library_backward_and_an_autograd_peer():
    fns, _ = bench.resolve_kernels(["lib", "torch-eager"], pass_="bwd")
    r = bench.bench_one(fns["lib"], 1024, 1024, torch.bfloat16, True, torch.float32, pass_="bwd")
    assert r["pass"] == "bwd" and r["graph"] and r["gbps"] > 0
    assert r["bytes"] == bench.rmsnorm_bwd_bytes(1024, 1024, torch.bfloat16, torch.float32)
    r = bench.bench_one(fns["torch-eager"], 1024, 1024, torch.bfloat16, False, pass_="bwd")
    assert r["gbps"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("peer", ["torch-eager", "torch-compile"])
def test_an_autograd_peer_backward_is_timed_through_a_cuda_graph(peer):
    """Its forwards are recorded on the stream the capture then uses (autograd runs a backward
    op where its forward op ran); the graph replays give its time, and the stream is handed
    back for plain timing."""
    fns, _ = bench.resolve_kernels([peer], pass_="bwd")
    fn = fns[peer]
    r = bench.bench_one(fn, 1024, 1024, torch.bfloat16, True, torch.float32, pass_="bwd")
    assert r["graph"] and r["gbps"] > 0 and fn.stream is None
    plain = bench.bench_one(fn, 1024, 1024, torch.bfloat16, False, torch.float32, pass_="bwd")
    assert plain["gbps"] > 0


@pytest.mark.gpu
def test_backward_host_cost_and_first_call_are_measured():
    fns, _ = bench.resolve_kernels(["lib"], pass_="bwd")
    rows = bench.measure_overhead(fns, [torch.float32], torch.bfloat16, Ms=(1,), calls=20,
                                  pass_="bwd")  # fmt: skip
    assert rows[0]["us_per_call"] > 0 and "error" not in rows[0]
    assert len(rows[0]["us_rounds"]) == 5  # rounds, the kernels taking turns
    rows = bench.measure_compile(fns, [1000], torch.bfloat16, M=8, pass_="bwd", fresh=2)
    assert rows[0]["compile_s"] > rows[0]["second_call_s"] > 0
    # two new processes, each timing its first call (a compile: far above a launch)
    assert len(rows[0]["fresh_s"]) == 2 and min(rows[0]["fresh_s"]) > 20 * rows[0]["second_call_s"]


def test_overhead_times_training_calls_against_nn_rmsnorm(fake_kernel):  # noqa: F811
    # issue 47: `quack-edu bench --overhead` records the host cost per eager training call of
    # QuackRMSNorm against nn.RMSNorm, in three cases; here on the CPU with the reference
    # kernels (the numbers mean nothing, the rows' shape and the table's lines do)
    from quack_edu.tools import host_cost, records

    logged = []
    rows = host_cost.training_call_rows(rounds=2, calls=3, device="cpu", log=logged.append)
    assert [r["case"] for r in rows] == [c for c, _, _ in host_cost.TRAINING_CASES]
    assert {r["dout"] for r in rows} == {"dense"}
    for r in rows:
        assert r["QuackRMSNorm"] > 0 and r["nn.RMSNorm"] > 0
        assert r["ratio"] == pytest.approx(r["QuackRMSNorm"] / r["nn.RMSNorm"])
        assert len(r["us_rounds"]["QuackRMSNorm"]) == 2
    assert len(logged) == 3
    table = records.host_table({"training_calls": rows}).splitlines()
    assert len(table) == 3 and all(ln.startswith("training call") for ln in table)
    both = host_cost.training_call_rows(rounds=1, calls=2, device="cpu", log=logged.append,
                                        douts=("sum", "dense"))  # fmt: skip
    assert [(r["case"], r["dout"]) for r in both] == [
        (c, d) for c, _, _ in host_cost.TRAINING_CASES for d in ("sum", "dense")
    ]
