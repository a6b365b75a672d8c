"""Lesson 07's helpers (quack_edu/lessons/bwd_strategies.py): the float64 autograd reference, the
partial rows and bytes of the three dw strategies, and the record's table (which says "not
recorded yet" rather than inventing numbers). The strategies' values and the recording itself
need a Hopper GPU (marked ``gpu``)."""

from __future__ import annotations

import json

import pytest
import torch

from quack_edu.lessons import bwd_strategies as bs
from quack_edu.lessons import results
from quack_edu.reference import rmsnorm_bwd_ref
from quack_edu.tools.bench import rmsnorm_bwd_bytes


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("weight", [True, False])
def test_autograd_agrees_with_the_formula_in_float64(offset, weight):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 300, generator=g, dtype=torch.float64) * 3
    w = torch.randn(300, generator=g, dtype=torch.float64) if weight else None
    dout = torch.randn(9, 300, generator=g, dtype=torch.float64)
    dx, dw, rstd = bs.autograd_bwd(x, w, dout, 0.25, offset)
    ex, ew, _ = rmsnorm_bwd_ref(x, w, dout, rstd, compute_dtype=torch.float64, weight_offset=offset)
    torch.testing.assert_close(dx, ex, rtol=1e-12, atol=1e-12)
    if weight:
        torch.testing.assert_close(dw, ew, rtol=1e-12, atol=1e-12)
    else:
        assert dw is None
    torch.testing.assert_close(
        bs.dw_float64(x.float(), dout.float(), rstd, chunk=4),
        (dout.float().double() * x.float().double() * rstd.unsqueeze(-1)).sum(0),
    )


def test_partial_rows_and_bytes():
    from quack_edu.stages import final_bwd

    M, N = 32768, 4096
    k = final_bwd.FinalBwdRMSNorm(torch.bfloat16, N)
    assert bs.partial_rows("atomic", M, N) == 1
    assert bs.partial_rows("row_blocks", M, N) == -(-M // k.tiling.rows_per_cta)
    assert bs.partial_rows("persistent", M, N) == k.grid_x(M) == 132 * k.ctas_per_sm()
    assert bs.partial_rows("persistent", M, N, sm_count=66) == k.grid_x(M, 66)
    assert bs.partial_bytes("atomic", M, N) == 2 * N * 4
    P = bs.partial_rows("persistent", M, N)
    assert bs.partial_bytes("persistent", M, N) == 2 * P * N * 4 + N * 4
    # the ordering the lesson predicts from: row blocks >> persistent >> atomics
    need = rmsnorm_bwd_bytes(M, N, torch.bfloat16)
    by = {s: bs.partial_bytes(s, M, N) / need for s in bs.STRATEGIES}
    assert by["row_blocks"] > 1.0 > 0.05 > by["persistent"] > by["atomic"]
    with pytest.raises(ValueError, match="strategy"):
        bs.partial_rows("tree", M, N)


def _record(tmp_path):
    rows = [
        {"strategy": s, "M": 1024, "N": 4096, "dtype": "bf16", "weight_dtype": "bf16",
         "config": "BwdConfig()", "grid": 528, "P": bs.partial_rows(s, 1024, 4096),
         "partial_bytes": bs.partial_bytes(s, 1024, 4096), "bytes": 1, "us": 1.0,
         "gbps": 1000.0 + i, "pct_copy": 23.5, "runs": 3, "distinct_dw": 2 if s == "atomic" else 1,
         "deterministic": s != "atomic", "max_abs_err": 1e-4, "max_abs_ref": 90.0}
        for i, s in enumerate(bs.STRATEGIES)
    ]  # fmt: skip
    rec = {"gpu": "TEST GPU", "date": "2000-01-01", "copy_gbps": 4000.0, "rows": rows}
    (tmp_path / f"{bs.RESULT}.json").write_text(json.dumps(rec))
    return rec


def test_table_says_not_recorded_yet_and_reads_a_record(tmp_path, monkeypatch):
    monkeypatch.setenv("QUACK_EDU_RESULTS", str(tmp_path))
    assert results.load(bs.RESULT) is None
    text = bs.table(results.load(bs.RESULT))
    assert "not recorded yet" in text and "GB/s" not in text
    _record(tmp_path)
    text = bs.table(results.load(bs.RESULT))
    assert "TEST GPU" in text and "not recorded" not in text
    lines = text.splitlines()
    assert len(lines) == 2 + len(bs.STRATEGIES)
    for s, line in zip(bs.STRATEGIES, lines[2:], strict=True):
        assert bs.LABELS[s] in line
        assert line.split()[-3] == ("no" if s == "atomic" else "yes")


def test_the_command_line_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the command would measure")
    with pytest.raises(RuntimeError, match="GPU"):
        bs.main(["--N", "1024", "--M", "64"])


# ---- on a Hopper GPU ----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("N", [1000, 4096, 65536])
def test_every_strategy_gives_dw_and_the_same_dx(N):
    from quack_edu.stages import final_bwd

    M = 777
    x, w, dout, rstd, _ = bs._inputs(M, N, torch.bfloat16, torch.bfloat16)
    ref = bs.dw_float64(x, dout, rstd)
    dxs = {}
    for s in bs.STRATEGIES:
        dx = torch.full_like(x, float("nan"))
        dw = bs.run(s, x, w, dout, rstd, dx)
        torch.cuda.synchronize()
        assert dw.dtype == torch.float32 and dw.shape == (N,)
        torch.testing.assert_close(dw.double(), ref, rtol=1e-5, atol=1e-5 * M**0.5 * 10)
        dxs[s] = dx
    assert torch.equal(dxs["atomic"], dxs["persistent"]) and torch.equal(
        dxs["row_blocks"], dxs["persistent"]
    )
    # the persistent grid is the library's: the same partial rows
    dw_p, _ = final_bwd.launch_bwd(x, w, dout, None, rstd, torch.empty_like(x), None, False)
    assert dw_p.shape[0] == bs.partial_rows("persistent", M, N, device=0)


@pytest.mark.gpu
def test_measure_makes_the_record(tmp_path):
    rec = bs.measure(Ns=(1024,), M=2048, budget_s=0.05, command="test", log=lambda *a: None)
    assert {"gpu", "date", "copy_gbps", "rows", "command"} <= set(rec)
    assert [r["strategy"] for r in rec["rows"]] == list(bs.STRATEGIES)
    for r in rec["rows"]:
        assert r["gbps"] > 0 and r["runs"] == 3 and r["max_abs_err"] < 1e-2
        if r["strategy"] != "atomic":  # fixed orders: the same bits on every run
            assert r["deterministic"] and r["distinct_dw"] == 1
    (tmp_path / f"{bs.RESULT}.json").write_text(json.dumps(rec))
    assert "not recorded" not in bs.table(json.loads((tmp_path / f"{bs.RESULT}.json").read_text()))
