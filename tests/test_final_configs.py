"""The final kernels' heuristics as data (quack_edu/stages/final_configs.py): every row is
reachable and names a record that exists, the picks at the shapes the records measured are the
rows' (a changed row fails here), and the pruning rule is the one both passes use."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from quack_edu.config import BwdConfig, FinalConfig
from quack_edu.stages import final, final_bwd
from quack_edu.stages import final_configs as fc

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
BF16, FP32 = torch.bfloat16, torch.float32


@pytest.mark.parametrize("name", ["FWD_SHORT", "FWD_LONG", "BWD"])
def test_every_row_is_the_first_match_somewhere(name):
    """No row is shadowed by the rows above it: some (length, weight, residual) reaches it."""
    rows = getattr(fc, name)
    lengths = [2**k for k in range(0, 17)] + [2**k + 1 for k in range(0, 16)]
    reached = {
        id(fc.first_row(rows, n, wide, residual))
        for n in lengths
        for wide in (False, True)
        for residual in (False, True)
    }
    assert all(id(r) in reached for r in rows), [r for r in rows if id(r) not in reached]


def test_forward_rows_name_a_record_that_exists():
    by_gpu = [r for rows in fc.FWD_SHORT_BY_GPU.values() for r in rows]
    for row in (*fc.FWD_SHORT, *fc.FWD_LONG, *by_gpu):
        assert row.record and (RESULTS / row.record).is_file(), row


def test_rows_set_only_config_fields():
    for rows, cls in ((fc.FWD_SHORT, FinalConfig), (fc.FWD_LONG, FinalConfig), (fc.BWD, BwdConfig)):
        fields = set(cls.__dataclass_fields__)
        for row in rows:
            assert set(row.set) <= fields, (row, set(row.set) - fields)


#: (N, weight dtype) -> (threads_per_row, num_threads, cluster_n, buffers, blocks_per_cta,
#: weight_in_smem) of the forward, bf16 x: what the rows say (their records chose them)
FWD_PICKS = {
    (256, BF16): (16, 256, 1, 2, 2, True),
    (256, FP32): (32, 128, 1, 2, 2, False),
    (512, FP32): (32, 256, 1, 1, 1, True),
    (4096, BF16): (32, 128, 1, 1, 1, True),
    (16384, FP32): (128, 128, 1, 1, 1, False),
    (32768, BF16): (256, 256, 1, 1, 1, False),
    (65536, BF16): (256, 256, 4, 1, 1, True),
    (65536, FP32): (256, 256, 4, 2, 2, False),
    (131072, FP32): (256, 256, 8, 2, 2, False),
    (262144, BF16): (256, 256, 16, 2, 2, True),
    (262144, FP32): (256, 256, 16, 2, 4, False),
}


@pytest.mark.parametrize(("N", "wdt"), list(FWD_PICKS))
def test_forward_picks_are_the_rows(N, wdt, monkeypatch):
    monkeypatch.setattr(final, "gpu_kind", lambda: "H200")  # the default tables (an H100 has a row)
    c = final.final_config(N, BF16, wdt)
    got = (c.threads_per_row, c.num_threads, c.cluster_n, c.buffers, c.blocks_per_cta)
    assert (*got, c.weight_in_smem) == FWD_PICKS[N, wdt]


def test_a_gpu_kind_reads_its_own_rows_first(monkeypatch):
    """The H100's row (its sweep, sweep_fwd256_h100.json) changes bf16 N = 256 next to a
    bf16 weight there, and only there; an H200, an unknown GPU and no GPU read the tables."""
    from quack_edu import _env

    def pick(N, wdt):
        c = final.final_config(N, BF16, wdt)
        return (c.threads_per_row, c.num_threads, c.cluster_n, c.buffers, c.blocks_per_cta,
                c.weight_in_smem)  # fmt: skip

    monkeypatch.setattr(final, "gpu_kind", lambda: "H100")
    assert pick(256, BF16) == (32, 128, 1, 2, 2, True)
    for N, wdt in FWD_PICKS:
        if (N, wdt) != (256, BF16):
            assert pick(N, wdt) == FWD_PICKS[N, wdt], (N, wdt)
    for kind in ("H200", None):
        monkeypatch.setattr(final, "gpu_kind", lambda kind=kind: kind)
        assert pick(256, BF16) == FWD_PICKS[256, BF16]
    names = {"NVIDIA H100 80GB HBM3": "H100", "NVIDIA H200": "H200", "NVIDIA A100": None}
    for name, kind in names.items():
        assert _env.gpu_kind(_env.Mode("gpu", "", name, (9, 0))) == kind
    assert _env.gpu_kind(_env.Mode("compile-only", "no GPU")) is None


def test_a_residual_has_its_own_row_at_8k_vectors():
    plain = final.final_config(65536, BF16, BF16)
    res = final.final_config(65536, BF16, BF16, final.Features(residual_dtype=BF16))
    assert (plain.buffers, plain.blocks_per_cta) == (1, 1)
    assert (res.cluster_n, res.buffers, res.blocks_per_cta, res.weight_in_smem) == (4, 2, 2, True)


#: the backward's: (threads_per_row, num_threads, cluster_n, buffers, weight_in_smem,
#: refill_early), bf16 x
BWD_PICKS = {
    (256, BF16): (16, 512, 1, 2, True, False),
    (4096, BF16): (128, 128, 1, 1, True, False),
    (16384, BF16): (512, 512, 1, 2, True, False),
    (32768, FP32): (512, 512, 2, 2, True, False),
    (65536, FP32): (512, 512, 2, 1, False, False),
    (262144, BF16): (512, 512, 8, 1, True, True),
    (262144, FP32): (512, 512, 8, 1, False, False),
}


@pytest.mark.parametrize(("N", "wdt"), list(BWD_PICKS))
def test_backward_picks_are_the_rows(N, wdt):
    c = final_bwd.bwd_config(N, BF16, wdt)
    got = (c.threads_per_row, c.num_threads, c.cluster_n, c.buffers, c.weight_in_smem)
    assert (*got, c.refill_early) == BWD_PICKS[N, wdt]


def test_one_pruning_rule_for_both_passes():
    """``fits``: the kernel takes the config and a CTA fits an SM; a pick that does not fit
    falls back to the first alternative that does (odd N: one-element accesses)."""
    too_big = FinalConfig(32, 128, buffers=2, blocks_per_cta=1)  # 262144 bf16 in one CTA
    build = fc.builder(final.FinalRMSNorm, 262144, BF16, BF16, final.Features())
    assert build(too_big) is None and not fc.fits(build, too_big)
    for N in (1, 37, 199, 262143):
        for mod, pick in ((final, final.final_config), (final_bwd, final_bwd.bwd_config)):
            cfg = pick(N, BF16, FP32)
            kernel = mod.KERNEL(BF16, N, cfg, FP32)
            assert kernel.ctas_per_sm() >= 1, (N, cfg)
    assert fc.cluster_sizes(8, 2) == [2, 4, 8] and fc.cluster_sizes(4) == [1, 2, 4]
