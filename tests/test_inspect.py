"""Compile-only reports for the naive stage (later stages have their own compile tests)."""

import re

import pytest
import torch

from quack_edu.stages.naive import configs
from quack_edu.tools.inspect import compile_report


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("N", [256, 760, 4096, 16384])
def test_naive_compiles_for_sm90a_without_spills(N, dtype):
    for cfg in configs(N, dtype):
        r = compile_report("naive", N, dtype, config=cfg, sass=False)
        assert r.target == "sm_90a"
        assert r.stack_bytes == 0 and r.spill_bytes == 0, r.summary()
        # scalar loads of one element: no vector loads in the naive stage
        width = {torch.bfloat16: "b16", torch.float16: "b16", torch.float32: "b32"}[dtype]
        assert r.count(f"ld.global.{width}") > 0 and r.count("ld.global.v") == 0
        assert r.count("rsqrt") >= 1
        # the block the PTX requires is the block the launch uses
        reqntid = re.search(r"\.reqntid\s+(\d+)", r.ptx)
        assert reqntid and int(reqntid.group(1)) == r.block[0] == cfg.threads_per_block
        assert r.grid == ((r.M + cfg.threads_per_block - 1) // cfg.threads_per_block, 1, 1)


def test_report_counts_and_sass():
    r = compile_report("naive", 1000, "fp16")
    assert r.count("ld.global") == len(r.lines("ld.global")) > 0
    assert r.count(r"ld\.global\.b16", regex=True) == r.count("ld.global.b16")
    assert r.sass is not None and "LDG" in r.sass, "nvdisasm wheel should give SASS"
    assert r.sass_count("STL") == 0
    assert "registers" in r.summary()


def test_config_override_and_validation():
    r = compile_report("naive", 512, threads_per_block=256, sass=False)
    assert r.block == (256, 1, 1)
    with pytest.raises(ValueError, match="multiple of 32"):
        compile_report("naive", 512, threads_per_block=100)
    with pytest.raises(ValueError, match="unknown stage"):
        compile_report("nope", 512)
    with pytest.raises(ValueError, match="unknown dtype"):
        compile_report("naive", 512, "int8")


@pytest.mark.parametrize("tpr, nt, dtype", [(32, 128, "bf16"), (8, 128, "fp32"), (4, 64, "fp16")])
def test_tv_coords_of_the_row_copy_match_the_numpy_model(tpr, nt, dtype):
    from quack_edu.config import vector_elems
    from quack_edu.lessons import viz
    from quack_edu.primitives.copy import row_tiled_copy
    from quack_edu.runtime import cute_dtype
    from quack_edu.tools.inspect import tv_coords

    vec = vector_elems(dtype)
    m = tv_coords(lambda: row_tiled_copy(cute_dtype(dtype), tpr, nt, vec))
    rows, cols = m["tile"]
    assert (m["threads"], m["vals"], m["tile"]) == (nt, vec, (nt // tpr, tpr * vec))
    owner = viz.row_tv_owner(tpr, rows, vec, cols)
    for t, coords in m["coords"].items():
        assert all(owner[r, c] == t for r, c in coords)
        assert coords == [(t // tpr, (t % tpr) * vec + v) for v in range(vec)]
