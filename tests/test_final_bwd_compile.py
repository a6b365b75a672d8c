"""Compile-only checks of the backward (quack_edu/stages/final_bwd.py) for sm_90a.

Row lengths from one vector-rich short row to 262144, every dtype, the weight in x's dtype and
in fp32: the kernel compiles with no stack and no spills, brings x and dout in by 16-byte
cp.async, writes dx and the fp32 partial sums of dw with 16-byte stores and no atomics (so
the column sums are deterministic), and a cluster config exchanges through st.async and
mbarriers. Its values are checked on the GPU in tests/test_rmsnorm_bwd_gpu.py.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from quack_edu import stages
from quack_edu.primitives.tiling import ceil_div
from quack_edu.stages import final_bwd
from quack_edu.stages.final import widest_vec
from quack_edu.tools.inspect import compile_report, kernel_report

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
NS = [256, 1000, 4096, 65536, 262144]
CP_ASYNC_16 = r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 16"


def _cases():
    for N in NS:
        for dtype in DTYPES:
            for wdt in (dtype, torch.float32) if dtype != torch.float32 else (dtype,):
                yield pytest.param(N, dtype, wdt, id=f"{N}-{str(dtype)[6:]}-w{str(wdt)[6:]}")


def _stores_per_thread(k: final_bwd.FinalBwdRMSNorm, partials: int = 1) -> int:
    """16-byte stores a thread issues: per vector, dx's (1, or 2 for fp32 next to a 16-bit
    vector) and each fp32 partial's (vec x 4 bytes / 16)."""
    t = k.tiling
    return t.vecs * (t.vec * t.elem_bytes // 16 + partials * t.vec * 4 // 16)


def _check(r, k: final_bwd.FinalBwdRMSNorm, partials: int = 1):
    cfg = k.config
    assert r.target == "sm_90a"
    assert r.stack_bytes == 0 and r.spill_bytes == 0, r.summary()
    reqntid = re.search(r"\.reqntid\s+(\d+)", r.ptx)
    assert reqntid and int(reqntid.group(1)) == r.block[0] == cfg.num_threads
    rows = cfg.num_threads // cfg.threads_per_row
    assert 1 <= r.grid[0] <= ceil_div(r.M, rows) and r.grid[1:] == (cfg.cluster_n, 1)
    # x and dout (and the weight) by 16-byte cp.async only
    assert r.count(CP_ASYNC_16, regex=True) > 0 and r.count("cp.async.ca") == 0
    # dx and the partial sums: 16-byte stores only, all of them there (none folded away)
    assert r.count("st.global") == r.count("st.global.v4") == _stores_per_thread(k, partials), (
        r.lines("st.global")
    )
    # the partial sums are plain stores: no atomics, no reductions into global memory
    assert r.count(r"^(atom|red)\.", regex=True) == 0, r.lines(r"^(atom|red)\.", regex=True)
    if cfg.cluster_n > 1:
        # two mbarriers used alternately, each armed for one block's bytes
        assert r.count("mbarrier.init") == 2 and r.count("st.async") >= 1
        assert r.count("mbarrier.try_wait") >= 1
        assert r.count("barrier.cluster.arrive.relaxed") == 1
        assert r.count("barrier.cluster.wait") == 2
    else:
        assert r.count("st.async") == 0 and r.count("barrier.cluster") == 0


@pytest.mark.parametrize("N,dtype,wdt", list(_cases()))
def test_default_config_compiles_without_spills(N, dtype, wdt):
    cfg = final_bwd.default_config(N, dtype, wdt)
    r = compile_report("final_bwd", N, dtype, weight_dtype=wdt, sass=False)
    assert r.config == cfg
    k = final_bwd.FinalBwdRMSNorm(dtype, N, cfg, wdt)
    _check(r, k)
    assert r.smem_bytes == k.smem_bytes() <= 232448
    # rstd; x, dout (and the weight, when staged) come by cp.async; an unstaged weight is read
    # a vector at a time in each pass
    t = k.tiling
    wloads = 0 if cfg.weight_in_smem else 2 * t.vecs * max(1, t.vec * 4 // 16)
    assert r.count("ld.global") == 1 + wloads


def test_forced_cluster_and_one_buffer_compile():
    N, bf16, fp32 = 65536, torch.bfloat16, torch.float32
    for cfg in (
        final_bwd.BwdConfig(256, 256, cluster_n=4, buffers=1),
        final_bwd.BwdConfig(128, 128, cluster_n=16, buffers=2),
    ):
        r = compile_report("final_bwd", N, bf16, weight_dtype=fp32, config=cfg, sass=False)
        _check(r, final_bwd.FinalBwdRMSNorm(bf16, N, cfg, fp32))
        ahead = {1} if cfg.buffers == 2 else {0}  # the next block's group stays in flight
        waits = {int(w) for w in re.findall(r"cp\.async\.wait_group\s+(\d+)", r.ptx)}
        assert ahead <= waits <= ahead | {0}


@pytest.mark.parametrize("buffers", [3, 4])
@pytest.mark.parametrize("N,dtype", [(256, torch.bfloat16), (4104, torch.float16)])
def test_deeper_pipelines_keep_buffers_minus_one_blocks_in_flight(N, dtype, buffers):
    fp32 = torch.float32
    cfg = replace(final_bwd.default_config(N, dtype, fp32), buffers=buffers)
    assert cfg.cluster_n == 1 and cfg.weight_in_smem
    r = compile_report("final_bwd", N, dtype, weight_dtype=fp32, config=cfg, sass=False)
    k = final_bwd.FinalBwdRMSNorm(dtype, N, cfg, fp32)
    _check(r, k)
    # one group for the weight, buffers - 1 blocks before the loop, one block an iteration;
    # the loop waits until only the buffers - 1 newest groups are in flight
    assert r.count("cp.async.commit_group") == 1 + (buffers - 1) + 1
    waits = {int(w) for w in re.findall(r"cp\.async\.wait_group\s+(\d+)", r.ptx)}
    assert buffers - 1 in waits and waits <= {buffers - 1, 0}
    assert k.smem_bytes() == r.smem_bytes


def _transitions(ptx: str) -> int:
    """How often the kernel's sequence of cp.async and st.global switches between the two."""
    ops = re.findall(r"^\s*(cp\.async\.cg|st\.global)", ptx, re.M)
    return sum(a != b for a, b in zip(ops[:-1], ops[1:], strict=True))


@pytest.mark.parametrize(
    "N,wdt", [(131072, torch.bfloat16), (131072, torch.float32), (262144, torch.float32)]
)
def test_refill_early_copies_each_vector_once_read(N, wdt):
    # one buffer: with refill_early the next block's vector v goes out right after this block's
    # dx for v is stored (st.global and cp.async alternate in the second pass); without it, all
    # of the next block's copies follow the pass's stores
    bf16 = torch.bfloat16
    base = replace(final_bwd.default_config(N, bf16, wdt), refill_early=False)
    assert base.buffers == 1
    seen = {}
    for on in (False, True):
        cfg = replace(base, refill_early=on)
        r = compile_report("final_bwd", N, bf16, weight_dtype=wdt, config=cfg, sass=False)
        k = final_bwd.FinalBwdRMSNorm(bf16, N, cfg, wdt)
        _check(r, k)
        seen[on] = _transitions(r.ptx)
    vecs = final_bwd.FinalBwdRMSNorm(bf16, N, base, wdt).tiling.vecs
    assert seen[False] <= 3 and seen[True] >= 2 * vecs - 1, seen


def _ops(ptx: str) -> list[str]:
    """The kernel's global loads, stores, copies and waits in PTX order, shortened."""
    found = re.findall(
        r"^\s*(ld\.global\.nc|ld\.global|st\.global|cp\.async\.wait_group|cp\.async\.cg|"
        r"mbarrier\.try_wait)",
        ptx,
        re.M,
    )
    return found


@pytest.mark.parametrize("N", [65544, 131072])
def test_weight_from_l2_is_plain_loads(N):
    # an fp32 weight read from L2 (weight_in_smem=False): two 16-byte loads a vector in each
    # pass, plain ld.global (as ld.global.nc they measured 13-15% slower on the H200), and no
    # spills; invariant_loads, on by default, has nothing to change here
    bf16, fp32 = torch.bfloat16, torch.float32
    base = final_bwd.default_config(N, bf16, fp32)
    assert not base.weight_in_smem and base.invariant_loads
    vecs = final_bwd.FinalBwdRMSNorm(bf16, N, base, fp32).tiling.vecs
    r = compile_report("final_bwd", N, bf16, weight_dtype=fp32, config=base, sass=False)
    assert r.stack_bytes == 0, r.summary()
    ops = _ops(r.ptx)
    assert ops.count("ld.global") == 2 * 2 * vecs + 1  # the weight in both passes, + rstd
    assert "ld.global.nc" not in ops


def test_invariant_loads_reach_dresidual_out():
    # a prenorm backward reads dresidual_out in the second pass, a vector at a time between
    # the dx stores; invariant_loads (the default) makes those loads ld.global.nc, which
    # ptxas may issue ahead of the stores (rstd stays plain)
    bf16, N = torch.bfloat16, 16384
    feats = final_bwd.BwdFeatures(dres_out_dtype=bf16)
    base = final_bwd.FinalBwdRMSNorm(bf16, N, None, bf16, features=feats)
    vecs = base.tiling.vecs
    assert base.config.invariant_loads
    for on in (False, True):
        cfg = replace(base.config, invariant_loads=on)
        k = final_bwd.FinalBwdRMSNorm(bf16, N, cfg, bf16, features=feats)
        r = kernel_report(k, stage="final_bwd")
        assert r.stack_bytes == 0 and r.spill_bytes == 0, r.summary()
        ops = _ops(r.ptx)
        assert ops.count("ld.global.nc") == (vecs if on else 0)
        assert ops.count("ld.global") == (1 if on else 1 + vecs)


def test_heuristic_refills_long_rows_only_beside_a_staged_weight():
    # measured on the H200 (benchmarks/results/ab_configs.json): +3.5% / +5% at 131072 /
    # 262144 with a bf16 weight, -1% at 65536, 3-5% slower with an fp32 weight read from L2
    bf16, fp32 = torch.bfloat16, torch.float32
    picks = {
        (N, w): final_bwd.default_config(N, bf16, w).refill_early
        for N in (65536, 131072, 262144)
        for w in (bf16, fp32)
    }
    assert picks == {
        (65536, bf16): False,
        (65536, fp32): False,
        (131072, bf16): True,
        (131072, fp32): False,
        (262144, bf16): True,
        (262144, fp32): False,
    }


def test_features_reach_the_kernel():
    N, bf16, fp32 = 1000, torch.bfloat16, torch.float32
    feats = final_bwd.BwdFeatures(
        dout_dtype=fp32, dres_out_dtype=torch.float16, db=True, weight_offset=1.0
    )
    k = final_bwd.FinalBwdRMSNorm(bf16, N, None, fp32, features=feats)
    base = final_bwd.FinalBwdRMSNorm(bf16, N, k.config, fp32)  # the same tiles, no features
    r0 = kernel_report(base, stage="final_bwd")
    r = kernel_report(k, stage="final_bwd")
    assert r.stack_bytes == 0 and r.spill_bytes == 0, r.summary()
    # db: a second partial; dresidual_out: 16-byte invariant loads through registers
    assert r.count("st.global.v4") == _stores_per_thread(k, partials=2)
    assert r.count("ld.global.nc.v4") > 0 and r0.count("ld.global.nc.v4") == 0
    assert "0f3F800000" in r.ptx  # 1.0 added to the weight in fp32
    assert r.count(CP_ASYNC_16, regex=True) > r0.count(CP_ASYNC_16, regex=True)  # fp32 dout
    nw = final_bwd.FinalBwdRMSNorm(bf16, 4096, None, features=final_bwd.BwdFeatures(weight=False))
    rn = kernel_report(nw, stage="final_bwd")
    assert rn.stack_bytes == 0 and rn.spill_bytes == 0 and rn.count("st.global.v4") > 0


@pytest.mark.parametrize(
    "N, dtype, async_bytes",
    [(1004, torch.bfloat16, 8), (1002, torch.float16, 4), (1001, torch.bfloat16, 0)],
)
def test_narrow_rows_compile(N, dtype, async_bytes):
    """N not a whole number of 16-byte vectors: the widest vector that divides N, by cp.async
    of 8 or 4 bytes, or through registers (2-byte vectors), with no spills."""
    k = final_bwd.FinalBwdRMSNorm(dtype, N, None, torch.float32)
    r = kernel_report(k, stage="final_bwd")
    assert r.stack_bytes == 0 and r.spill_bytes == 0, r.summary()
    assert k.vec == widest_vec(N, dtype) and k.use_async == bool(async_bytes)
    if async_bytes:
        assert r.count("cp.async.ca.shared.global") > 0
        assert re.search(
            rf"cp\.async\.ca\.shared\.global \[[^]]+\], \[[^]]+\], {async_bytes}", r.ptx
        )
    else:
        assert r.count("cp.async") == 0 and k.config.buffers == 1
    assert r.count(r"^(atom|red)\.", regex=True) == 0


def test_the_stage_is_reachable_but_not_in_the_forward_ladder():
    assert stages.kernel_class("final_bwd") is final_bwd.FinalBwdRMSNorm
    assert stages.get_stage("final_bwd") is final_bwd
    assert "final_bwd" not in stages.STAGE_ORDER
    assert final_bwd.FinalBwdRMSNorm.max_N_for(torch.float32) == 262144


def test_configs_are_accepted_and_fit():
    for N in (1000, 4096, 131072, 262144):
        for dtype in (torch.bfloat16, torch.float32):
            cfgs = final_bwd.configs(N, dtype, torch.float32)
            assert cfgs[0] == final_bwd.default_config(N, dtype, torch.float32)
            assert len(set(cfgs)) == len(cfgs) >= 2
            for c in cfgs:
                k = final_bwd.FinalBwdRMSNorm(dtype, N, c, torch.float32)
                assert k.ctas_per_sm() >= 1 and k.smem_bytes() <= 232448


@pytest.mark.parametrize(
    "N, cfg, match",
    [
        (262152, None, r"N must be in \[1, 262144\]"),
        (4096, final_bwd.BwdConfig(32, 128, max_vecs=4), "max_vecs"),
        (262144, final_bwd.BwdConfig(256, 256, cluster_n=2, max_vecs=64), "shared memory"),
        (4096, final_bwd.BwdConfig(64, 128, stages=2), "stages must be 1"),
    ],
)
def test_what_cannot_work_says_why(N, cfg, match):
    with pytest.raises(ValueError, match=match):
        final_bwd.FinalBwdRMSNorm(torch.bfloat16, N, cfg)


def test_grid_is_one_wave_and_no_more_than_the_row_blocks():
    k = final_bwd.FinalBwdRMSNorm(torch.bfloat16, 4096)
    rows = k.tiling.rows_per_cta
    assert k.grid_x(1) == 1
    assert k.grid_x(1 << 20) == 132 * k.ctas_per_sm() // k.tiling.cluster_n
    assert k.grid_x(3 * rows) == 3
    assert k.grid_x(1 << 20, resident=100) == 100 and k.grid_x(3 * rows, resident=100) == 3
    # clusters: without the driver's count, three times SMs / cluster_n (see grid_x)
    kc = final_bwd.FinalBwdRMSNorm(torch.bfloat16, 131072)
    assert kc.tiling.cluster_n == 4 and kc.ctas_per_sm() == 1
    assert kc.grid_x(1 << 20) == 3 * (132 // 4) and kc.grid_x(1 << 20, resident=30) == 30
    with pytest.raises(ValueError, match="buffers"):
        final_bwd.BwdConfig(32, buffers=5)


def test_driver_structs_have_cuda_h_layout():
    """``resident_clusters`` hands these to cuOccupancyMaxActiveClusters through ctypes: their
    sizes and offsets must be cuda.h's (CUlaunchAttribute: id, value at 8, 72 bytes;
    CUlaunchConfig: 7 uints, hStream at 32, attrs at 40, numAttrs at 48, 56 bytes)."""
    import ctypes

    from quack_edu import runtime

    attribute, config = runtime._driver_structs()
    assert ctypes.sizeof(attribute) == 72 and attribute.value.offset == 8
    assert ctypes.sizeof(config) == 56
    assert (config.stream.offset, config.attrs.offset, config.num_attrs.offset) == (32, 40, 48)


# -- lesson 07: the atomics strategy (FinalBwdAtomic) --------------------------------------------
@pytest.mark.parametrize(
    "N, dtype, red",
    [
        # one row per CTA, 16-byte vectors: 16-byte reductions
        (4096, torch.bfloat16, "red.relaxed.gpu.global.add.v4.f32"),
        # 8 rows per CTA combined in shared memory first (96-register launch bound)
        (256, torch.float32, "red.relaxed.gpu.global.add.v4.f32"),
        # one-element vectors (odd N): scalar reductions
        (1001, torch.bfloat16, "red.relaxed.gpu.global.add.f32"),
    ],
    ids=["4096-bf16", "256-fp32-rows", "1001-bf16-narrow"],
)
def test_atomic_variant_adds_into_one_row_without_spills(N, dtype, red):
    """Strategy (1) of lesson 07: the library's kernel with its partial sums added into one
    fp32 row by red.global.add (no plain stores of partials), no stack, no spills."""
    k = final_bwd.FinalBwdAtomic(dtype, N)
    base = final_bwd.FinalBwdRMSNorm(dtype, N)
    assert k.config == base.config and k.partial_rows == 1
    r = kernel_report(k, stage="final_bwd (atomic)")
    assert r.target == "sm_90a"
    assert r.stack_bytes == 0 and r.spill_bytes == 0, r.summary()
    reds = r.lines(r"^red\.", regex=True)
    assert reds and all(ln.split()[0] == red for ln in reds), reds
    assert r.count(r"^atom\.", regex=True) == 0
    # dx's stores remain; the partials' stores became reductions, one per 16 bytes (or element)
    t = k.tiling
    per_red = 4 if "v4" in red else 1
    assert len(reds) == t.vecs * t.vec // per_red
    dx_stores = t.vecs * max(1, t.vec * t.elem_bytes // 16)
    assert r.count("st.global") == dx_stores, r.lines("st.global")
    if (N, dtype) == (4096, torch.bfloat16):  # lesson 07 quotes these: 4 dx stores, 8 reductions
        assert (dx_stores, len(reds)) == (4, 8)


def test_the_variants_leave_the_library_kernel_alone():
    lib, rows = final_bwd.FinalBwdRMSNorm, final_bwd.FinalBwdRowBlocks
    assert final_bwd.VARIANTS == {"atomic": final_bwd.FinalBwdAtomic, "row_blocks": rows}
    assert lib.partial_rows is None  # one row per CTA: stores, no adds
    assert final_bwd.FinalBwdAtomic.grad_in is lib.grad_in
    assert final_bwd.FinalBwdAtomic.kernel is lib.kernel
    # the row blocks' variant is the library's kernel on another grid: one CTA a row block
    assert {k for k, v in vars(rows).items() if callable(v)} == {"grid_x"}
    k, lib_k = rows(torch.bfloat16, 4096), lib(torch.bfloat16, 4096)
    assert k.config == lib_k.config and k.tiling.rows_per_cta == lib_k.tiling.rows_per_cta
    assert [k.grid_x(M) for M in (1, 37, 199)] == [
        -(-M // k.tiling.rows_per_cta) for M in (1, 37, 199)
    ]
    blocks = 10000  # more than the GPU holds at once: the library walks them, the variant not
    assert (
        lib_k.grid_x(blocks * k.tiling.rows_per_cta)
        < blocks
        == k.grid_x(blocks * k.tiling.rows_per_cta)
    )


# -- the second reduction: final_bwd.PartialSum ---------------------------------------------------
@pytest.mark.parametrize(("dtype", "groups"), [(torch.float32, 8), (torch.bfloat16, 1)])
def test_partial_sum_issues_its_loads_together(tmp_path, dtype, groups):
    """One round trip for ``unroll`` rows: the loop body's loads all come before its first add
    (a guarded load per row, as a plain unrolled loop compiles, waits for the one before), and
    a row past the last is selected away, not branched around; the groups meet through one
    barrier; the result is converted to the output's dtype."""
    from quack_edu.runtime import compile_kernel
    from quack_edu.tools.inspect import _read_artifact

    k = final_bwd.PartialSum(dtype, groups)
    ptx = _read_artifact(compile_kernel(k, f"--keep-ptx --dump-dir {tmp_path}").__ptx__)
    body = ptx[ptx.index("ld.global") : ptx.rindex("ld.global")]
    assert ptx.count("ld.global") == k.unroll and "add.f32" not in body and "bra" not in body
    assert ptx.count("selp.f32") == k.unroll - 1
    assert ptx.count("bar.sync") == (groups > 1)
    assert ("cvt.rn.bf16.f32" in ptx) == (dtype == torch.bfloat16)
    assert [final_bwd.PartialSum.plan(P) for P in (1, 8, 9, 132, 264, 1000)] == [
        1,
        1,
        2,
        32,
        32,
        32,
    ]
    assert final_bwd.PartialSum(dtype, 32).lanes * 32 == 1024
    with pytest.raises(ValueError, match="power of two"):
        final_bwd.PartialSum(dtype, 3)
