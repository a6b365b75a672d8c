"""`quack-edu bench --pass both` on a CPU: the whole ladder, forward and backward, in one record.

The timing needs a GPU (tests/test_bench.py's GPU tests, scripts/gpu_check.py); here fake
kernels and a fake ``bench_one`` check what the run times, in which order, and what the record,
the tables, the verdicts and the plots make of it.
"""

from __future__ import annotations

import json
import stat
import types
from pathlib import Path

import matplotlib.image
import pytest
import torch

from quack_edu.lessons import results
from quack_edu.stages import BACKWARD_STAGES, STAGE_ORDER
from quack_edu.tools import bench

COPY = 4000.0
#: a fake kernel's GB/s by name (the library fastest, PyTorch's ops slowest)
SPEED = {"naive": 400.0, "cpasync": 3800.0, "final": 3900.0, "final_bwd": 3300.0,
         "lib": 3950.0, "quack": 3600.0, "torch-ops": 500.0}  # fmt: skip


def _fake_gpu(monkeypatch, calls: list) -> None:
    """``bench.run`` without a GPU: any name resolves to a fake kernel, timed at SPEED."""

    def resolve(names, residual=False, pass_="fwd"):
        fns, skipped = {}, {}
        for n in names:
            kind_ok = (bench.split_name(n)[0] in BACKWARD_STAGES) == (pass_ == "bwd")
            if bench.kernel_kind(n) == "stage" and not kind_ok:
                skipped[n] = "the other pass's stage"
            else:
                fns[n] = types.SimpleNamespace(__name__=n, pass_=pass_)
        return fns, skipped

    def fake_bench_one(fn, M, N, dtype, graph=False, weight_dtype=None, pass_="fwd", **kw):
        calls.append((pass_, fn.__name__, N))
        nbytes = 10**9
        gbps = SPEED[fn.__name__] * (0.9 if pass_ == "bwd" else 1.0)
        return {"M": M, "N": N, "dtype": "bf16", "weight_dtype": "bf16", "residual": False,
                "graph": graph, "pass": pass_, "bytes": nbytes, "us": nbytes / gbps / 1e3,
                "gbps": gbps, "first_call_s": 0.5}  # fmt: skip

    copies = []
    monkeypatch.setattr(bench, "resolve_kernels", resolve)
    monkeypatch.setattr(bench, "bench_one", fake_bench_one)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda: copies.append(1) or COPY)
    monkeypatch.setattr(bench, "gpu_clocks", lambda *a, **k: {"sm_mhz": 1980.0})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    calls.append(copies)  # the first item: how many times the copy was measured


def _both(monkeypatch, kernels=("naive", "cpasync", "final", "final_bwd", "quack", "torch-ops")):
    calls: list = []
    _fake_gpu(monkeypatch, calls)
    shapes = [(8, 4096), (8, 16384)]
    record = bench.run_both(list(kernels), shapes, log=lambda *a: None, meta={"command": "x"})
    copies, timed = calls[0], calls[1:]
    return record, copies, timed


def test_split_stages_gives_each_pass_its_stages_the_library_and_the_peers():
    got = bench.split_stages(["naive", "final", "final_bwd", "quack", "torch-ops"])
    assert got["fwd"] == ["naive", "final", "quack", "torch-ops", "lib"]
    assert got["bwd"] == ["final_bwd", "quack", "torch-ops", "lib"]
    assert bench.split_stages(["lib", "final_bwd#1"])["bwd"] == ["lib", "final_bwd#1"]


def test_a_stage_of_the_other_pass_is_skipped_with_the_reason():
    fns, skipped = bench.resolve_kernels(["cpasync", "final_bwd"], pass_="bwd")
    assert "final_bwd" in fns and "timed through final_bwd and the library" in skipped["cpasync"]
    fns, skipped = bench.resolve_kernels(["cpasync", "final_bwd"], pass_="fwd")
    assert "cpasync" in fns and "--pass bwd" in skipped["final_bwd"]


def test_run_both_times_the_forward_then_the_backward_with_one_copy(monkeypatch):
    record, copies, timed = _both(monkeypatch)
    assert len(copies) == 1  # measured once, first, for both passes
    fwd = [k for p, k, _ in timed if p == "fwd"]
    bwd = [k for p, k, _ in timed if p == "bwd"]
    assert timed.index(("bwd", "final_bwd", 4096)) > max(
        i for i, t in enumerate(timed) if t[0] == "fwd"
    )
    assert set(fwd) == {"naive", "cpasync", "final", "quack", "torch-ops", "lib"}
    assert set(bwd) == {"final_bwd", "quack", "torch-ops", "lib"}
    assert record["pass"] == "both" and record["copy_gbps"] == COPY
    for p in ("fwd", "bwd"):
        part = record[p]
        assert part["pass"] == p and part["copy_gbps"] == COPY and part["command"] == "x"
        assert part["clocks"] == {"start": {"sm_mhz": 1980.0}, "end": {"sm_mhz": 1980.0}}
        assert part["verdict"]["ours"] == "lib"
    assert record["clocks"]["start"] == {"sm_mhz": 1980.0}
    assert list(record)[-2:] == ["fwd", "bwd"]  # the passes last: the file reads top down


def test_a_both_record_reads_through_results_and_summarize(monkeypatch, tmp_path, capsys):
    record, _, _ = _both(monkeypatch)
    (tmp_path / "ladder.json").write_text(json.dumps(record))
    monkeypatch.setenv("QUACK_EDU_RESULTS", str(tmp_path))
    bwd = results.rows("ladder", **{"pass": "bwd"})
    assert {r["kernel"] for r in bwd} == {"final_bwd", "quack", "torch-ops", "lib"}
    assert len(results.rows("ladder", kernel="lib")) == 4  # 2 shapes x 2 passes
    png = tmp_path / "sum.png"
    assert bench.main(["--summarize", str(tmp_path / "ladder.json"), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert out.count("== verdict of the") == 2 and "(backward)" in out
    for name in ("sum.png", "sum_ladder.png", "sum_speedup.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_of_both_passes(monkeypatch, tmp_path):
    record, _, _ = _both(monkeypatch)
    paths = bench.plot_all(record, str(tmp_path / "l.png"))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["l.png", "l_ladder.png", "l_speedup.png"]
    h, w = matplotlib.image.imread(paths[0]).shape[:2]
    assert h > 1.5 * w / 2  # the forward's panel above the backward's
    h, w = matplotlib.image.imread(paths[1]).shape[:2]
    assert w > 2 * h  # a ladder panel per pass, side by side
    # one pass: only its GB/s plot
    assert bench.plot_all(record["fwd"], str(tmp_path / "f.png")) == [str(tmp_path / "f.png")]


def test_the_ladder_shape_and_order():
    assert bench.ladder_shape(
        {"rows": [{"M": 32768, "N": n, "kernel": "lib", "gbps": 1.0, "graph": False}
                  for n in (4096, 16384, 65536)]}
    ) == (32768, 16384)  # fmt: skip
    rows = [{"M": 8, "N": 4096, "kernel": k, "gbps": 1.0, "graph": False} for k in "ab"]
    rows.append({"M": 8, "N": 65536, "kernel": "a", "gbps": 1.0, "graph": False})
    assert bench.ladder_shape({"rows": rows}) == (8, 4096)  # most kernels ran there
    names = ["quack", "lib", "final", "naive", "final_bwd", "cpasync", "torch-ops"]
    assert bench.ladder_order(names) == [
        "naive", "cpasync", "final", "final_bwd", "lib", "quack", "torch-ops",
    ]  # fmt: skip


def test_speedups_are_over_pytorch_ops_else_f_rms_norm(monkeypatch):
    record, _, _ = _both(monkeypatch)
    base, ups = bench.speedups(record["fwd"])
    assert base == "torch-ops"
    lib = [u["speedup"] for u in ups if u["kernel"] == "lib"]
    assert lib == [pytest.approx(3950 / 500)] * 2
    part = {"rows": [r for r in record["fwd"]["rows"] if r["kernel"] != "torch-ops"]}
    assert bench.speedups(part) == ("", [])
    eager = [
        {**r, "kernel": "torch-eager"} for r in record["fwd"]["rows"] if r["kernel"] == "naive"
    ]
    base, ups = bench.speedups({"rows": part["rows"] + eager})
    assert base == "torch-eager"


def test_pass_all_names_each_pass_its_stages(monkeypatch):
    seen = {}

    def fake_run_both(stages, shapes, options, **kw):
        seen["both"] = stages
        return {"pass": "both"}

    def fake_run(stages, shapes, options, **kw):
        seen[options.pass_] = stages
        return {"pass": options.pass_, "verdict": {}}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "run_both", fake_run_both)
    monkeypatch.setattr(bench, "run", fake_run)
    monkeypatch.setattr(bench, "passes", lambda r: [])
    for p in ("fwd", "bwd", "both"):
        bench.main(["--pass", p, "--no-progress"])
    assert seen["fwd"] == list(STAGE_ORDER) and seen["bwd"] == list(BACKWARD_STAGES)
    assert seen["both"] == list(STAGE_ORDER + BACKWARD_STAGES)
    # 'all' in a list: the pass's stages where it stands, with the others named around it
    bench.main(["--pass", "both", "--stages", "all,cluster@hold", "--no-progress"])
    assert seen["both"] == [*STAGE_ORDER, *BACKWARD_STAGES, "cluster@hold"]


def test_the_progress_bar_counts_every_timing(monkeypatch):
    counted = []

    class Bar:
        def __init__(self, total, desc, enabled, unit="configs"):
            counted.append([total, 0, enabled, unit])

        def update(self):
            counted[-1][1] += 1

        def close(self):
            pass

    import quack_edu.autotune as autotune

    monkeypatch.setattr(autotune, "Progress", Bar)
    calls: list = []
    _fake_gpu(monkeypatch, calls)
    options = bench.RunOptions(rounds=2, graph=True, graph_max_n=2048, progress=True,
                               weight_dtypes=[torch.bfloat16, torch.float32])  # fmt: skip
    bench.run(["lib", "quack"], [(8, 256), (8, 4096)], options, log=lambda *a: None)
    k = bench.LAUNCH_BOUND_ROUNDS
    total = 2 * (2 * k * 2 * 2) + 2 * (2 * 1 * 2)  # kernels x (rounds x modes x weights)
    assert counted == [[total, total, True, "timings"]]
    assert len(calls) - 1 == total


def test_gpu_clocks_reads_nvidia_smi_for_this_device(monkeypatch, tmp_path):
    smi = tmp_path / "nvidia-smi"
    args = tmp_path / "args"
    smi.write_text(
        f'#!/bin/sh\necho "$@" > {args}\necho "1980, 3201, 1980, 3201, 402.5, 700.00, 41"\n'
    )
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    props = types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x19, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    got = bench.gpu_clocks(0, smi=str(smi))
    assert got == {"sm_mhz": 1980.0, "mem_mhz": 3201.0, "max_sm_mhz": 1980.0,
                   "max_mem_mhz": 3201.0, "power_w": 402.5, "power_limit_w": 700.0,
                   "temperature_c": 41.0}  # fmt: skip
    assert "--id=00000000:19:00.0" in args.read_text()
    assert bench.gpu_clocks(0, smi=str(tmp_path / "absent")) == {}
    smi.write_text("#!/bin/sh\nexit 9\n")
    assert bench.gpu_clocks(0, smi=str(smi)) == {}
    # not while quack-edu grade runs the notebook: its sandbox refuses the process and flags
    # the notebook (lesson 08's solution, on an H100, 2026-12-07)
    smi.write_text(f'#!/bin/sh\necho ran > {args}\necho "1, 1, 1, 1, 1, 1, 1"\n')
    monkeypatch.setenv("QUACK_EDU_GRADING", "1")
    assert bench.gpu_clocks(0, smi=str(smi)) == {} and "ran" not in args.read_text()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["final_bwd", "final_bwd#1", "final_bwd@atomic"])
@pytest.mark.parametrize("wdt", [torch.bfloat16, torch.float32])
def test_the_backward_stage_is_timed_after_its_values_are_checked(name, wdt):
    """bench_one checks dx and dw against the fp32 reference on the first call (fresh random
    inputs) before it times: at a ragged shape and a round one, either weight dtype."""
    fns, skipped = bench.resolve_kernels([name], pass_="bwd")
    assert not skipped, skipped
    for M, N in ((199, 1000), (1024, 4096)):
        r = bench.bench_one(fns[name], M, N, torch.bfloat16, False, wdt, pass_="bwd", budget_s=0.05)
        assert r["pass"] == "bwd" and r["gbps"] > 0


def test_the_final_stage_runs_the_plan_of_its_weights_dtype():
    """In the ladder, the stage 'final' with an fp32 weight runs the fp32 weight's plan (the
    library's), not the bf16 weight's; stages whose heuristic has no weight dtype ignore it."""
    from quack_edu.stages import cpasync, final

    bf16, fp32 = torch.bfloat16, torch.float32
    N = 262144
    assert bench.resolve_config("final", N, bf16, fp32) == final.default_config(N, bf16, fp32)
    assert bench.resolve_config("final", N, bf16, fp32) != bench.resolve_config("final", N, bf16)
    assert bench.resolve_config("final#1", N, bf16, fp32) == final.configs(N, bf16, fp32)[1]
    assert bench.resolve_config("cpasync", 4096, bf16, fp32) == cpasync.default_config(4096, bf16)
    assert "weight_in_smem=False" in bench.config_of("final", N, bf16, fp32)
    from quack_edu.stages import final_bwd  # the backward stage's #k (stage_bwd_fn) the same way

    assert (
        bench.resolve_config("final_bwd#1", 4096, bf16, fp32)
        == final_bwd.configs(4096, bf16, fp32)[1]
    )


def test_every_committed_plot_can_be_drawn_again_from_its_record(tmp_path):
    """Each PNG under benchmarks/results/ beside a bench record is drawn again from that JSON on
    the CPU: the records hold every field the plots need."""
    pngs = sorted(p for p in results.results_dir().glob("*.png")
                  if (p.with_suffix(".json")).exists())  # fmt: skip
    assert {"ladder.png", "fwd_final.png", "bwd_final.png"} <= {p.name for p in pngs}
    for png in pngs:
        record = results.load(png.stem)
        paths = bench.plot_all(record, str(tmp_path / png.name))
        assert paths and all(Path(p).stat().st_size > 10_000 for p in paths), png.name
        extra = {Path(p).name for p in paths} - {png.name}
        # the ladder's extra plots are committed beside it too
        assert all((png.parent / name).exists() for name in extra), (png.name, extra)


def _ladder_compare():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "ladder_compare.py"
    spec = importlib.util.spec_from_file_location("ladder_compare", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ladder_compare_flags_a_row_that_fell_against_its_peer_and_the_copy(tmp_path, capsys):
    """scripts/ladder_compare.py: the record against itself has no slower row; a copy whose
    library row at one point lost 10% (GB/s and % of copy, QuACK's unchanged) has exactly that
    one, and a row that lost GB/s on a slower machine instance (peer and copy lost as much)
    has none. A host-bound row whose kernels both gained the same microseconds (a slower host)
    reads ``ok (host)``; one where the library gained more than the peer is slower, and so is
    a CUDA-graph row (it does not time the host), whatever both gained."""
    lc = _ladder_compare()
    old = json.loads((results.results_dir() / "ladder.json").read_text())
    lines, slower = lc.compare(old, old)
    assert slower == 0 and len(lines) > 40
    new = json.loads(json.dumps(old))
    for r in new["fwd"]["rows"]:
        if r["kernel"] == "lib" and r["N"] == 4096 and not r.get("graph"):
            if r["weight_dtype"] == "bf16":
                r["gbps"] *= 0.9
                r["pct_copy"] *= 0.9
    for r in new["bwd"]["rows"]:  # a slower instance: everything in the run 20% lower
        if r["N"] == 8192:
            r["gbps"] *= 0.8
    # microseconds added per call, eager fp32-weight rows: a slower host (the same for both
    # kernels) at N=1024; the library's own host cost grown at N=2048
    added = {(1024, "lib"): 15.0, (1024, "quack"): 15.0, (2048, "lib"): 20.0, (2048, "quack"): 5.0}
    for r in new["fwd"]["rows"]:
        us = added.get((r["N"], r["kernel"]))
        if us and r["weight_dtype"] == "fp32" and not r.get("graph"):
            scale = r["us"] / (r["us"] + us)
            r["us"] += us
            r["gbps"] *= scale
            r["pct_copy"] *= scale
    # a graph row at N=1024 whose kernels gained about the same microseconds (the library's
    # within tol of QuACK's, its ratio down ~4%): a graph row does not time the host
    in_graph = {"lib": 10.0, "quack": 9.0}
    for r in new["fwd"]["rows"]:
        us = in_graph.get(r["kernel"])
        if us and r["N"] == 1024 and r["weight_dtype"] == "fp32" and r.get("graph"):
            scale = r["us"] / (r["us"] + us)
            r["us"] += us
            r["gbps"] *= scale
            r["pct_copy"] *= scale
    path = tmp_path / "new.json"
    path.write_text(json.dumps(new))
    assert lc.main([str(results.results_dir() / "ladder.json"), str(path)]) == 1
    out = capsys.readouterr().out
    flagged = [ln.split()[:4] for ln in out.splitlines() if ln.endswith("SLOWER")]
    slow = [
        ["fwd", "4096", "bf16", "no"],
        ["fwd", "2048", "fp32", "no"],
        ["fwd", "1024", "fp32", "yes"],
    ]
    assert flagged == slow, out
    host = [ln.split()[:4] for ln in out.splitlines() if ln.endswith("ok (host)")]
    assert host == [["fwd", "1024", "fp32", "no"]], out
