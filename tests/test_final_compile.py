"""Compile-only checks of the final stage (quack_edu/stages/final.py) for sm_90a.

Every row length the library takes, every dtype, the weight in x's dtype and in fp32: the
kernel compiles with no stack and no spills, moves x in 128-bit cp.async copies and y in
128-bit stores wherever N allows them (narrower, correct accesses where it does not), and
its launch shape is the one its config says. Features (bias, residual, rstd, per-head,
weight_offset, out dtype) each reach the PTX. Values are checked on the GPU
(tests/test_rmsnorm_gpu.py).
"""

from __future__ import annotations

import re

import pytest
import torch

from quack_edu.config import FinalConfig
from quack_edu.primitives.tiling import ceil_div
from quack_edu.stages import final
from quack_edu.tools.inspect import compile_report, kernel_report

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
NS = [1, 7, 256, 1000, 4096, 65536, 262144]


def _cases():
    for N in NS:
        for dtype in DTYPES:
            for wdt in (dtype, torch.float32) if dtype != torch.float32 else (dtype,):
                yield pytest.param(N, dtype, wdt, id=f"{N}-{str(dtype)[6:]}-w{str(wdt)[6:]}")


def _vec_bytes(N: int, dtype) -> int:
    return final.widest_vec(N, dtype) * torch.empty((), dtype=dtype).element_size()


def _check(r, N: int, dtype, cfg: FinalConfig):
    assert r.target == "sm_90a"
    assert r.stack_bytes == 0 and r.spill_bytes == 0, r.summary()
    reqntid = re.search(r"\.reqntid\s+(\d+)", r.ptx)
    assert reqntid and int(reqntid.group(1)) == r.block[0] == cfg.num_threads
    rows = cfg.num_threads // cfg.threads_per_row
    assert r.grid == (ceil_div(ceil_div(r.M, rows), cfg.blocks_per_cta), cfg.cluster_n, 1)
    vb = _vec_bytes(N, dtype)
    if vb == 16:
        # x comes in by 16-byte cp.async only, y goes out in 16-byte stores only
        hinted = r"(\.L2::cache_hint)?"  # x's copies carry an L2 policy (see below)
        cp16 = r"cp\.async\.cg\.shared\.global" + hinted + r" \[[^]]+\], \[[^]]+\], 16"
        assert r.count(cp16, regex=True) > 0
        assert r.count("st.global") == r.count("st.global.v4") > 0, r.lines("st.global")
        # what global loads remain are the weight's (registers plan), 128-bit too
        assert r.count("ld.global") == r.count(
            r"ld\.global(\.nc|\.L2::cache_hint)?\.v4", regex=True
        )
    elif vb >= 4:
        assert r.count("cp.async.ca.shared.global") > 0 and r.count("cp.async.cg") == 0
    else:  # narrower than cp.async's 4 bytes: through registers
        assert r.count("cp.async") == 0 and r.count("ld.global") > 0
    if cfg.cluster_n > 1:
        # two mbarriers used alternately, each armed for one block's bytes
        assert r.count("mbarrier.init") == 2 and r.count("st.async") >= 1
        # one barrier after the init (arrive.relaxed, then the wait after the first copies);
        # none before the exit unless exit_sync asks for it (arrive + wait)
        assert r.count("barrier.cluster.arrive.relaxed") == 1
        assert r.count("barrier.cluster.arrive") == 1 + cfg.exit_sync
        assert r.count("barrier.cluster.wait") == 1 + cfg.exit_sync
    else:
        assert r.count("st.async") == 0 and r.count("barrier.cluster") == 0


@pytest.mark.parametrize("N,dtype,wdt", list(_cases()))
def test_default_config_compiles_without_spills(N, dtype, wdt):
    cfg = final.default_config(N, dtype, wdt)
    r = compile_report("final", N, dtype, weight_dtype=wdt, sass=False)
    assert r.config == cfg
    _check(r, N, dtype, cfg)


@pytest.mark.parametrize(
    "fields",
    [
        dict(cluster_n=8, buffers=2, blocks_per_cta=8, weight_in_smem=True),
        dict(cluster_n=4, buffers=1, blocks_per_cta=1, weight_in_smem=False),
        dict(cluster_n=16, buffers=2, blocks_per_cta=4, weight_in_smem=False, stages=2),
        dict(cluster_n=4, buffers=2, blocks_per_cta=2, weight_in_smem=True, exit_sync=True),
    ],
)
def test_the_plans_an_autotuner_tries_compile(fields):
    N, bf16, fp32 = 65536, torch.bfloat16, torch.float32
    cfg = FinalConfig(256, 256, **fields)
    r = compile_report("final", N, bf16, weight_dtype=fp32, config=cfg, sass=False)
    _check(r, N, bf16, cfg)
    waits = [int(w) for w in re.findall(r"cp\.async\.wait_group\s+(\d+)", r.ptx)]
    ahead = cfg.stages if cfg.buffers == 2 else 0  # the next block's groups stay in flight
    expected = {cfg.stages - 1 - s + ahead for s in range(cfg.stages)}
    if cfg.weight_in_smem:  # block 0 leaves the slice's group pending, then waits for it
        expected |= {cfg.stages - s + ahead for s in range(cfg.stages)} | {ahead}
    assert sorted(set(waits)) == sorted(expected)
    # registers do not depend on the weight's dtype when it lives in shared memory
    if cfg.weight_in_smem:
        assert r.registers <= 64, r.summary()


def test_x_comes_in_under_an_l2_evict_last_policy():
    """Every whole 16-byte cp.async of x (and of a weight slice that is one) goes under an L2
    evict_last policy (createpolicy, ``.L2::cache_hint``); a vector a predicate may switch off
    keeps the plain, zero-filling copy; weights loaded into registers carry the policy too."""
    bf16, fp32 = torch.bfloat16, torch.float32

    def report(N, wdt=bf16):
        return compile_report("final", N, bf16, weight_dtype=wdt, sass=False)

    r = report(8192)  # 2 rows a CTA, weight slice in shared memory, tiles cover N
    hinted = r.count(r"cp\.async\.cg\.shared\.global\.L2::cache_hint .*, 16, %rd", regex=True)
    assert hinted > 0 and r.count(r"cp\.async\.cg\.shared\.global \[", regex=True) == 0
    assert r.count("createpolicy.fractional.L2::evict_last") > 0
    ragged = report(8192 + 8)  # the last tile is partial: predicated copies, no hint
    assert ragged.count("L2::cache_hint") == 0 and ragged.count("cp.async.cg") > 0
    alone = report(32768)  # no cluster, the weight in registers: its loads hinted too
    assert not alone.config.weight_in_smem and alone.config.cluster_n == 1
    assert alone.count(r"ld\.global\.L2::cache_hint\.v4", regex=True) > 0
    clustered = report(262144, fp32)  # clusters, an fp32 weight in registers: hinted too
    assert not clustered.config.weight_in_smem and clustered.config.cluster_n > 1
    assert clustered.count(r"ld\.global\.L2::cache_hint\.v4", regex=True) > 0
    assert clustered.count("cp.async.cg.shared.global.L2::cache_hint") > 0


@pytest.mark.parametrize(
    "N, wdt", [(512, torch.float32), (8192, torch.bfloat16), (262144, torch.float32)]
)
def test_the_grid_waits_for_the_previous_one_before_it_touches_global_memory(N, wdt):
    """Programmatic dependent launch (``FinalRMSNorm.pdl``): the grid may start while the kernel
    before it on the stream drains, so ``griddepcontrol.wait`` must come before the first global
    load, copy or store; the switch off leaves neither instruction (so the check can fail)."""
    bf16 = torch.bfloat16
    ptx = compile_report("final", N, bf16, weight_dtype=wdt, sass=False).ptx
    accesses = ("ld.global", "cp.async", "st.global", "red.global", "atom.global")
    first = min(i for i in (ptx.find(a) for a in accesses) if i >= 0)
    assert 0 < ptx.find("griddepcontrol.wait") < first
    assert "griddepcontrol.launch_dependents" in ptx

    class Serialized(final.FinalRMSNorm):
        pdl = False

    off = compile_report(Serialized, N, bf16, weight_dtype=wdt, sass=False).ptx
    assert "griddepcontrol" not in off


def _loop_bodies(ptx: str) -> list[str]:
    """The text of every loop of a PTX listing: from a label to a later branch back to it."""
    lines = ptx.splitlines()
    where = {}
    bodies = []
    for i, line in enumerate(lines):
        m = re.match(r"\s*(\$L__\w+):", line)
        if m:
            where[m.group(1)] = i
        m = re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", line)
        if m and m.group(1) in where:
            bodies.append("\n".join(lines[where[m.group(1)] : i + 1]))
    return bodies


@pytest.mark.parametrize("N", [256, 131072, 262144])
def test_a_weight_in_registers_is_loaded_once_per_cta(N):
    """The plans that hold an fp32 weight in registers with several row blocks a CTA load it
    before the loop over the blocks (``weight_once``), not in it; the switch off puts the loads
    back in the loop (so the check can fail)."""
    bf16, fp32 = torch.bfloat16, torch.float32
    r = compile_report("final", N, bf16, weight_dtype=fp32, sass=False)
    assert not r.config.weight_in_smem and r.config.blocks_per_cta > 1, r.config

    class EveryBlock(final.FinalRMSNorm):
        weight_once = False

    per_block = compile_report(EveryBlock, N, bf16, weight_dtype=fp32, sass=False)
    weight_load = re.compile(r"ld\.global\S*\.v4\.(?:f32|b32|u32)")
    assert r.count(weight_load.pattern, regex=True) > 0
    assert not any(weight_load.search(b) for b in _loop_bodies(r.ptx))
    assert any(weight_load.search(b) for b in _loop_bodies(per_block.ptx))


def _copy_sequence(ptx: str) -> list:
    """The kernel's cp.async copies, commits and waits in PTX order, runs of copies counted:
    e.g. [2, "commit", 1, "commit", "wait 1"]."""
    seq = []
    for line in ptx.splitlines():
        if re.search(r"\bcp\.async\.c[ag]\.", line):
            if seq and isinstance(seq[-1], int):
                seq[-1] += 1
            else:
                seq.append(1)
        elif "cp.async.commit_group" in line:
            seq.append("commit")
        elif m := re.search(r"cp\.async\.wait_group\s+(\d+)", line):
            seq.append(f"wait {m.group(1)}")
    return seq


def test_a_wide_weight_slice_is_copied_flat_after_the_first_block():
    """N = 512, bf16 x, fp32 weight: 256 threads, 8 rows a CTA, the slice in shared memory.
    x goes first (2 vectors a thread, one commit group), then the slice, 2 KiB in 16-byte pieces,
    one for each of the first 128 threads (``flat_weight_copy``), in a group of its own, and
    the first pass waits with that group still pending (``weight_after_x``). With both
    switches off: the first row's threads copy four 16-byte halves each, before x, and the
    first wait lets nothing pend (so the check can fail)."""
    bf16, fp32 = torch.bfloat16, torch.float32
    r = compile_report("final", 512, bf16, weight_dtype=fp32, sass=False)
    assert r.config.weight_in_smem and r.config.num_threads == 256, r.config

    class Before(final.FinalRMSNorm):
        flat_weight_copy = False
        weight_after_x = False

    old = compile_report(Before, 512, bf16, weight_dtype=fp32, config=r.config, sass=False)
    assert _copy_sequence(r.ptx)[:5] == [2, "commit", 1, "commit", "wait 1"]
    assert r.count(r"setp\.\w+\.u32\s+%p\d+, %r\d+, 127;", regex=True) == 1  # threads >= 128
    assert _copy_sequence(old.ptx)[:5] == [4, "commit", 2, "commit", "wait 0"]
    # the slice is waited for (and the CTA synchronised) once, before the scaling pass
    assert r.count("bar.sync") == old.count("bar.sync") == 1
    # a bf16 weight's slice (one 16-byte vector a thread) still goes first, as in every record
    # before (after x it measured -0.5..+0.1%, ab_configs.json)
    narrow = compile_report("final", 512, bf16, weight_dtype=bf16, sass=False)
    assert _copy_sequence(narrow.ptx)[:5] == [2, "commit", 2, "commit", "wait 0"]


def test_the_weight_in_shared_memory_costs_no_registers():
    N, bf16, fp32 = 65536, torch.bfloat16, torch.float32
    cfg = FinalConfig(256, 256, cluster_n=8, buffers=2, blocks_per_cta=8)
    rb = compile_report("final", N, bf16, weight_dtype=bf16, config=cfg, sass=False)
    rf = compile_report("final", N, bf16, weight_dtype=fp32, config=cfg, sass=False)
    # cpasync holds the weight: +64 registers a thread for fp32 (16 vectors x 8 x 32 bits more)
    cp_b = compile_report("cpasync", N, bf16, weight_dtype=bf16, sass=False)
    cp_f = compile_report("cpasync", N, bf16, weight_dtype=fp32, sass=False)
    assert cp_f.registers - cp_b.registers > 32 or cp_f.registers > 128, cp_f.summary()
    # here only the widening of one vector at a time differs
    assert rf.registers - rb.registers < 16 and rf.registers <= 64, (rb.summary(), rf.summary())
    assert rf.smem_bytes - rb.smem_bytes == 8192 * 2  # the slice: 8192 columns, 2 more bytes


def test_lesson06_quotes_the_registers_its_table_prints():
    """Lesson 06 names the cpasync stage's registers at 65536 with an fp32 weight as the table
    above it prints them (issue 50: "well over 128" beside a printed 130)."""
    from quack_edu.grading.notebook import read, solutions_dir

    rep = compile_report("cpasync", 65536, torch.bfloat16, weight_dtype=torch.float32, sass=False)
    cells = read(solutions_dir() / "06_final_kernel.ipynb").cells
    prose = " ".join(" ".join(c.source.split()) for c in cells if c.cell_type == "markdown")
    assert f"ptxas gives its thread {rep.registers} registers in all" in prose, rep.summary()


def _feature_report(features: final.Features, N=1000, dtype=torch.bfloat16, wdt=torch.float32):
    kernel = final.FinalRMSNorm(dtype, N, None, wdt, features=features)
    return kernel_report(kernel, stage="final")


def test_features_reach_the_kernel():
    base = _feature_report(final.Features())
    res = _feature_report(
        final.Features(residual_dtype=torch.bfloat16, residual_out_dtype=torch.float32, rstd=True)
    )
    # the residual comes in by cp.async next to x; residual_out and rstd are stores
    assert res.count("cp.async") > base.count("cp.async")
    assert res.count("st.global") > base.count("st.global")
    assert res.count("st.global.b32") >= 1  # rstd, one fp32 per row
    off = _feature_report(final.Features(weight_offset=1.0, bias_dtype=torch.float16))
    assert "0f3F800000" in off.ptx  # 1.0, added to the weight in fp32
    assert off.count("cvt.f32.f16") > 0  # the fp16 bias, widened
    head = _feature_report(final.Features(per_head=True))
    assert head.count("%ctaid.z") >= 1  # the head is the grid's z


def test_every_row_waits_for_the_slices_the_first_row_copies():
    # The weight and bias slices are copied once per CTA by the threads of its first row; the
    # other rows may read them only after a CTA barrier. With a bias and no weight the barrier
    # was missing: on the H200, under load, rows read the bias before it landed (1423 of 3.1M
    # outputs wrong, bf16 M=1029 N=3000). Short rows (16 threads a row, no block reduction,
    # hence no other bar.sync) at 1000 bf16, 8 rows a CTA.
    cfg = FinalConfig(16, 128, cluster_n=1)
    bf16, fp32 = torch.bfloat16, torch.float32

    def barriers(weight, bias_dtype):
        kernel = final.FinalRMSNorm(
            bf16, 1000, cfg, fp32, features=final.Features(weight=weight, bias_dtype=bias_dtype)
        )
        rep = kernel_report(kernel, stage="final")
        assert rep.count("cp.async") > 0  # the slices do come in by cp.async here
        return rep.count(r"\bbar(rier)?\.sync", regex=True)

    assert barriers(True, fp32) == barriers(True, None) == barriers(False, fp32) == 1
    assert barriers(False, None) == 0  # nothing shared between the rows


@pytest.mark.parametrize(
    "cfg, match",
    [
        (FinalConfig(32, 128, cluster_n=1, max_vecs=4), "max_vecs"),
        (FinalConfig(256, 256, cluster_n=1, buffers=2, max_vecs=64), "shared memory"),
        (FinalConfig(256, 256, cluster_n=16, stages=4), "stages=4 must divide"),
    ],
)
def test_configs_that_cannot_work_say_why(cfg, match):
    with pytest.raises(ValueError, match=match):
        final.FinalRMSNorm(torch.float32, 65536 if "shared" in match else 4096, cfg)


def test_config_fields_are_checked():
    with pytest.raises(ValueError, match="buffers"):
        FinalConfig(32, buffers=3)
    with pytest.raises(ValueError, match="blocks_per_cta"):
        FinalConfig(32, blocks_per_cta=0)
    with pytest.raises(ValueError, match=r"N must be in \[1, 262144\]"):
        final.FinalRMSNorm(torch.bfloat16, 262152)


def test_every_listed_config_is_accepted():
    for N in (256, 512, 1000, 4096, 131072):  # 256: a 16-thread row pick, halved to 8
        for wdt in (torch.bfloat16, torch.float32):
            cfgs = final.configs(N, torch.bfloat16, wdt)
            assert cfgs[0] == final.default_config(N, torch.bfloat16, wdt)
            assert len(set(cfgs)) == len(cfgs) > 10
            for c in cfgs:
                k = final.FinalRMSNorm(torch.bfloat16, N, c, wdt)
                assert k.ctas_per_sm() >= 1


def test_the_narrow_path_is_chosen_by_alignment():
    # vec: the widest power of two dividing N, at most 16 bytes of x
    assert final.widest_vec(4096, torch.bfloat16) == 8
    assert final.widest_vec(1000, torch.bfloat16) == 8
    assert final.widest_vec(1004, torch.bfloat16) == 4
    assert final.widest_vec(7, torch.float32) == 1
    x = torch.zeros(4, 576, dtype=torch.bfloat16)
    assert final._vec_limit(x) >= 8  # 1152-byte rows: 16-byte aligned
    assert final._vec_limit(x[:, 3:]) == 1  # 6 bytes past an aligned start
    assert final._misaligned(x, x[:, :512]) == 0 and final._misaligned(x[:, 1:]) == 2


def test_every_row_length_has_a_config():
    # odd N means one element per access: the long ones need 512 threads a row (262143 fp32)
    for N in (1, 2, 3, 7, 4097, 99999, 100001, 131074, 262143, 262144):
        for dtype in DTYPES:
            for wdt in (dtype, torch.float32):
                cfg = final.default_config(N, dtype, wdt)
                final.FinalRMSNorm(dtype, N, cfg, wdt)  # accepted: fits, <= max_vecs
    cfg = final.default_config(262143, torch.float32, torch.float32)
    r = compile_report("final", 262143, torch.float32, sass=False)
    assert r.config == cfg and r.spill_bytes == 0 and r.stack_bytes == 0, r.summary()


def test_the_plain_call_skips_the_dsl_wrapper():
    # CompiledFinal.call is the TVM-FFI function inside the compiled kernel (the library's
    # per-call path, ~1 us less host time a call); whatever lacks it, or takes defaults or
    # keywords, is called through its wrapper. A kernel loaded from the disk cache is that
    # function already (then call and compiled are one), so the type is what is checked: the
    # wrapper subclasses tvm_ffi.Function, the function inside is one
    from quack_edu.runtime import direct_call
    from quack_edu.stages.final import Features

    fn = final.compiled_for(torch.bfloat16, 1024, torch.bfloat16, Features(), 8, None, None)
    tvm_ffi = pytest.importorskip("tvm_ffi")
    assert type(fn.call) is tvm_ffi.Function

    class Wrapped:
        def __init__(self, wrapper):
            self._kwargs_wrapper, self._tvm_ffi_function = wrapper, object()
            self.execution_args = type("Args", (), {"has_pointer_address_arg_specs": False})

    assert direct_call(print) is print
    plain = Wrapped(lambda a, b: None)
    assert direct_call(plain) is plain._tvm_ffi_function
    with_default = Wrapped(lambda a, b=1: None)
    assert direct_call(with_default) is with_default


def test_the_library_class_and_no_class_share_one_compile():
    """``launch_fwd``/``launch_bwd`` pass the library's class (``FinalRMSNorm.launch``), the
    plan caches of quack_edu.host look the kernel up with none: one compile serves both."""
    from quack_edu.stages import final_bwd
    from quack_edu.stages.final import Features

    bf = torch.bfloat16
    args = (bf, 1024, bf, Features(), 8, None)
    assert final.compiled_for(*args, None) is final.compiled_for(*args, final.FinalRMSNorm)
    bargs = (bf, 1024, bf, final_bwd.BwdFeatures(), 8, None)
    lib = final_bwd.FinalBwdRMSNorm
    assert final_bwd.compiled_for(*bargs, None) is final_bwd.compiled_for(*bargs, lib)
