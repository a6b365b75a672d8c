"""Compile-only checks of the vectorized stages (warp, block, cluster, cpasync) for sm_90a.

For every stage x dtype x N of a sweep x every config its ``configs(N, dtype)`` lists (the
heuristic's pick first, then the alternatives tests and autotuners force): the kernel compiles
for sm_90a with no stack frame and no spills, launches the block its PTX requires, and its PTX
shows what the stage is about (shuffles, 128-bit accesses, bar.sync, DSMEM stores and cluster
barriers, cp.async). Forced configs that cannot work, and N beyond a stage's limit, raise a
ValueError that says why. The pieces a lesson lets a learner rewrite are real hooks: a subclass
that overrides one changes the PTX.

Values are checked on the GPU by tests/test_stages_gpu.py.
"""

from __future__ import annotations

import inspect
import math
import operator
import re
import subprocess
import sys
import textwrap
from dataclasses import replace

import cutlass
import cutlass.cute as cute
import pytest
import torch

from quack_edu.config import RowConfig, vector_elems
from quack_edu.primitives.reduce import f32_bits, row_reduce
from quack_edu.primitives.tiling import ceil_div
from quack_edu.stages import STAGE_ORDER, get_stage
from quack_edu.stages.block import BlockRMSNorm
from quack_edu.stages.cluster import ClusterRMSNorm
from quack_edu.stages.cpasync import CpAsyncRMSNorm
from quack_edu.stages.warp import WarpRMSNorm
from quack_edu.tools.inspect import compile_report

EMPTY = inspect.Parameter.empty

VECTOR_STAGES = ("warp", "block", "cluster", "cpasync")
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
NS = [256, 760, 1024, 4096, 8192, 16384]
LONG_NS = [32768, 65536, 131072, 262144]


def _cases():
    for stage in VECTOR_STAGES:
        kernel = get_stage(stage).KERNEL
        for N in NS + (LONG_NS if stage in ("cluster", "cpasync") else []):
            for dtype in DTYPES:
                limit = kernel.max_N_for(dtype)
                if limit is None or N <= limit:
                    yield pytest.param(stage, N, dtype, id=f"{stage}-{N}-{str(dtype)[6:]}")


def _v4_loads(r) -> int:
    return r.count(r"ld\.global(\.nc)?\.v4", regex=True)


def _expect_tx_bytes(r) -> list[int]:
    """The byte counts the PTX arms its mbarrier with (immediate or through a mov)."""
    out = []
    for line in r.lines("mbarrier.arrive.expect_tx"):
        operand = line.rstrip(";").split(",")[-1].strip()
        if operand.isdigit():
            out.append(int(operand))
            continue
        mov = re.search(rf"mov\.b32\s+{re.escape(operand)},\s*(\d+);", r.ptx)
        out.append(int(mov.group(1)) if mov else -1)
    return out


def _check(stage: str, r, cfg: RowConfig):
    assert r.target == "sm_90a"
    assert r.stack_bytes == 0 and r.spill_bytes == 0, r.summary()
    # the block the PTX requires is the block the launch uses
    reqntid = re.search(r"\.reqntid\s+(\d+)", r.ptx)
    assert reqntid and int(reqntid.group(1)) == r.block[0] == cfg.num_threads, r.summary()
    rows_per_cta = cfg.num_threads // cfg.threads_per_row
    # a clustered CTA of the cluster stage reduces seq_rows row blocks one after the other
    seq = getattr(get_stage(stage).KERNEL, "seq_rows", 1) if cfg.cluster_n > 1 else 1
    assert r.grid == (ceil_div(r.M, rows_per_cta * seq), cfg.cluster_n, 1)
    assert r.cluster == (1, cfg.cluster_n, 1)

    # 128-bit accesses only: every global load of x and w, every store of y
    assert r.count("st.global") == r.count("st.global.v4") > 0, r.lines("st.global")
    assert r.count("ld.global") == _v4_loads(r) > 0, r.lines("ld.global")
    group = min(cfg.threads_per_row, 32)
    assert r.count("shfl.sync.bfly") >= int(math.log2(group)), r.summary()
    assert r.count("rsqrt") >= 1

    if stage == "block" or (
        stage in ("cluster", "cpasync") and cfg.cluster_n == 1 and cfg.threads_per_row > 32
    ):
        assert r.count("bar.sync") >= 1
    if stage in ("cluster", "cpasync") and cfg.cluster_n > 1:
        assert r.count("mapa.shared::cluster") >= 2  # the peer's slot and the peer's mbarrier
        assert r.count("st.async") >= seq and r.count("mbarrier::complete_tx::bytes") >= seq
        # one mbarrier per row block, each armed for one block's bytes
        assert r.count("mbarrier.init") == seq and r.count("mbarrier.try_wait") >= seq
        assert r.count("fence.mbarrier_init") == 1
        # arrive.relaxed + wait after the init (before the first exchange); arrive + wait
        # before the exit (after the last): the same two pairs for any number of blocks
        assert r.count("barrier.cluster.arrive.relaxed") == 1
        assert r.count("barrier.cluster.arrive") == 2 and r.count("barrier.cluster.wait") == 2
        t = get_stage(stage).KERNEL(r.dtype, r.N, cfg).tiling
        assert _expect_tx_bytes(r) == [t.rows_per_cta * t.warps_per_row * cfg.cluster_n * 4] * seq
        if seq > 1:
            # two blocks of x live at once: ptxas is held to 128 registers (minnctapersm)
            want = 65536 // (128 * cfg.num_threads)
            assert re.search(rf"\.minnctapersm\s+{want}\b", r.ptx), r.summary()
            assert r.registers <= 128, r.summary()
    else:
        assert r.count("st.async") == 0 and r.count("barrier.cluster") == 0
    if stage == "cpasync":
        assert r.count(r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 16", regex=True) > 0
        assert r.count("cp.async.ca") == 0
        assert r.count("cp.async.commit_group") == cfg.stages
        waits = [int(x) for x in re.findall(r"cp\.async\.wait_group\s+(\d+)", r.ptx)]
        assert waits == list(range(cfg.stages - 1, -1, -1))
        # x comes in by cp.async only: the global loads left are the weight's
        assert r.count("ld.shared.v4") > 0
    else:
        assert r.count("cp.async") == 0


@pytest.mark.parametrize("stage,N,dtype", list(_cases()))
def test_every_config_compiles_without_spills(stage, N, dtype):
    mod = get_stage(stage)
    cfgs = mod.configs(N, dtype)
    assert cfgs and cfgs[0] == mod.default_config(N, dtype)
    assert len(set(cfgs)) == len(cfgs)
    if dtype == torch.float16:
        # fp16 is bf16's code with another conversion (same vectors, registers, layouts): its
        # default config is compiled at every N here, its alternatives are bf16's (compiled in
        # the bf16 case), which keeps CI's 2 cores from compiling 86 near-copies
        assert cfgs == mod.configs(N, torch.bfloat16)
        cfgs = cfgs[:1]
    for cfg in cfgs:
        r = compile_report(stage, N, dtype, config=cfg, sass=False)
        _check(stage, r, cfg)


def test_stage_order_registers_the_ladder():
    # the ladder (benchmarks, tests, notebooks) loops over the stages through one entry each:
    # rmsnorm_fwd(x, weight, eps=1e-6, config=None, out=None), with the heuristic's pick among
    # the configs it may be forced to
    assert STAGE_ORDER == ("naive", "warp", "block", "cluster", "cpasync", "final")
    entry = [("x", EMPTY), ("weight", EMPTY), ("eps", 1e-6), ("config", None), ("out", None)]
    for name in STAGE_ORDER:
        mod = get_stage(name)
        params = inspect.signature(mod.rmsnorm_fwd).parameters.values()
        assert [(p.name, p.default) for p in params] == entry, name
        assert mod.KERNEL.name == name
        assert mod.default_config(4096, torch.bfloat16) in mod.configs(4096, torch.bfloat16)
    assert all(get_stage(name).CONFIG is RowConfig for name in VECTOR_STAGES)


@pytest.mark.parametrize("stage", VECTOR_STAGES)
def test_fp32_weight_next_to_16_bit_x(stage):
    # the weight comes in two 128-bit atoms per 16-byte vector of x, still without spills
    for N in (4096, 16384):
        cfg = get_stage(stage).default_config(N, torch.bfloat16)
        r = compile_report(stage, N, torch.bfloat16, weight_dtype=torch.float32, sass=False)
        _check(stage, r, cfg)


def test_warp_evidence_matches_the_lesson():
    r = compile_report("warp", 4096, torch.bfloat16, sass=False)
    assert r.count("shfl.sync.bfly") == 5 and r.count("bar.sync") == 0
    # 4096 bf16 / 32 lanes / 8 per vector = 16 vectors of x and 16 of w per lane, 16 stores
    assert _v4_loads(r) == 32 and r.count("st.global.v4") == 16
    r = compile_report("warp", 256, torch.float16, threads_per_row=8, sass=False)
    assert r.count("shfl.sync.bfly") == 3
    # past 16 vectors per lane the row is walked in chunks and x is read a second time
    r = compile_report("warp", 8192, torch.bfloat16, sass=False)
    assert _v4_loads(r) == 16 + 16 + 16


def test_sass_has_128_bit_loads_and_no_local_memory():
    for stage, N in (("block", 8192), ("cluster", 65536), ("cpasync", 65536)):
        r = compile_report(stage, N, torch.bfloat16, sass=True)
        assert r.sass_count("STL") == 0 and r.sass_count("LDL") == 0
        assert r.sass_count("STG.E.128") > 0
        if stage == "cpasync":
            assert r.sass_count("LDGSTS.E.BYPASS.128") > 0
        else:
            assert r.sass_count("LDG.E.128") > 0


# -- limits and forced configs ------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(threads_per_row=48), "power of two"),
        (dict(threads_per_row=32, num_threads=100), "multiple of 32"),
        (dict(threads_per_row=256, num_threads=128), "multiple of threads_per_row"),
        (dict(threads_per_row=32, cluster_n=3), "cluster_n must be one of"),
        (dict(threads_per_row=8, cluster_n=16), "threads_per_row >= cluster_n"),
        (dict(threads_per_row=32, stages=0), "stages"),
    ],
)
def test_row_config_rejects_bad_shapes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RowConfig(**kwargs)


@pytest.mark.parametrize(
    "stage, N, dtype, fields, match",
    [
        ("warp", 4096, "bf16", dict(threads_per_row=64), "threads_per_row must be <= 32"),
        ("warp", 4096, "bf16", dict(cluster_n=2), "no clusters"),
        ("warp", 4096, "bf16", dict(stages=2), "needs cp.async"),
        ("block", 4096, "bf16", dict(threads_per_row=32), "threads_per_row must be >= 64"),
        ("block", 4096, "bf16", dict(cluster_n=2), "no clusters"),
        ("cluster", 4096, "bf16", dict(stages=2), "needs cp.async"),
        ("cluster", 65536, "bf16", dict(cluster_n=1), "never re-reads x"),
        ("cluster", 256, "bf16", dict(threads_per_row=16, cluster_n=16), "only 2 of the 16 CTAs"),
        ("cpasync", 4096, "bf16", dict(stages=3), "stages=3 must divide"),
        ("cpasync", 262144, "fp32", dict(cluster_n=4, max_vecs=32), "shared memory"),
        ("warp", 1001, "bf16", {}, "multiple of the 16-byte vector"),
    ],
)
def test_forced_configs_that_cannot_work_say_why(stage, N, dtype, fields, match):
    with pytest.raises(ValueError, match=match):
        compile_report(stage, N, dtype, sass=False, **fields)


@pytest.mark.parametrize(
    "stage, dtype, limit",
    [
        ("cluster", torch.float32, 131072),
        ("cluster", torch.bfloat16, 262144),
        ("cluster", torch.float16, 262144),
        ("cpasync", torch.float32, 262144),
        ("cpasync", torch.bfloat16, 262144),
    ],
)
def test_N_beyond_the_stage_limit(stage, dtype, limit):
    mod = get_stage(stage)
    assert mod.KERNEL.max_N_for(dtype) == limit
    N = 2 * limit
    with pytest.raises(ValueError, match=f"at most {limit}"):
        compile_report(stage, N, dtype, sass=False)
    # the torch entry point says so before it needs a GPU
    x = torch.zeros(2, N, dtype=dtype)
    with pytest.raises(
        ValueError, match=f"beyond what the '{stage}' stage supports.*at most {limit}"
    ):
        mod.rmsnorm_fwd(x, torch.ones(N, dtype=dtype))


@pytest.mark.parametrize("stage", VECTOR_STAGES)
def test_rows_of_a_few_vectors(stage):
    # one vector, an odd number of vectors, a row that leaves most lanes idle
    for dtype, N in ((torch.bfloat16, 8), (torch.float32, 12), (torch.float16, 264)):
        cfg = get_stage(stage).default_config(N, dtype)
        _check(stage, compile_report(stage, N, dtype, sass=False), cfg)


@pytest.mark.parametrize("stage", ["warp", "block"])
def test_chunked_stages_take_any_N(stage):
    assert get_stage(stage).KERNEL.max_N_for(torch.float32) is None
    r = compile_report(stage, 1 << 20, torch.float32, sass=False)
    assert r.spill_bytes == 0


@pytest.mark.parametrize("stage", VECTOR_STAGES)
def test_every_listed_config_is_accepted_by_the_kernel(stage):
    mod = get_stage(stage)
    for dtype in DTYPES:
        for N in NS + LONG_NS:
            limit = mod.KERNEL.max_N_for(dtype)
            if limit is not None and N > limit:
                continue
            for cfg in mod.configs(N, dtype):
                k = mod.KERNEL(dtype, N, cfg)
                assert k.N == N and k.tiling.chunks >= 1
                assert k.launch_shape(37).block == (cfg.num_threads, 1, 1)


def test_heuristics_pick_the_documented_shapes():
    from quack_edu.stages import block, cluster, cpasync, warp

    bf16, fp32 = torch.bfloat16, torch.float32
    assert warp.default_config(64, bf16).threads_per_row == 8
    assert warp.default_config(4096, bf16).threads_per_row == 32
    assert block.default_config(4096, bf16).threads_per_row == 64
    assert block.default_config(16384, bf16).threads_per_row == 256
    assert cluster.default_config(16384, bf16).cluster_n == 1
    assert [cluster.default_config(n, bf16).cluster_n for n in LONG_NS] == [2, 4, 8, 16]
    assert cluster.default_config(131072, fp32).cluster_n == 16
    assert [cpasync.default_config(n, bf16).cluster_n for n in LONG_NS] == [1, 2, 4, 8]
    assert cpasync.default_config(262144, fp32).cluster_n == 8
    # the non-portable cluster size only at the top of the cluster stage's range
    for mod in (cluster, cpasync):
        for N in NS + LONG_NS:
            for dtype in DTYPES:
                limit = mod.KERNEL.max_N_for(dtype)
                if N < limit or (mod is cpasync and N == limit):
                    assert mod.default_config(N, dtype).cluster_n <= 8, (mod, N, dtype)
    # and a portable alternative there
    for dtype in DTYPES:
        top = cluster.ClusterRMSNorm.max_N_for(dtype)
        assert any(c.cluster_n == 8 for c in cluster.configs(top, dtype))


def test_cluster_launch_attributes_reach_the_launch(subprocess_env):
    # The cluster shape is a launch attribute (not in PTX): read it from the MLIR, which the DSL
    # keeps only when CUTE_DSL_KEEP is set before cutlass is imported, hence the subprocess.
    code = textwrap.dedent(
        """
        import os, re
        os.environ["CUTE_DSL_KEEP"] = "ir"
        import quack_edu
        from dataclasses import replace
        from quack_edu.runtime import compile_kernel
        from quack_edu.stages import get_stage
        import torch
        for stage, N, cn in (("cluster", 32768, 2), ("cpasync", 262144, 16)):
            mod = get_stage(stage)
            cfg = replace(mod.default_config(N, torch.bfloat16), cluster_n=cn)
            mlir = compile_kernel(mod.KERNEL(torch.bfloat16, N, cfg)).__mlir__
            dim = r"%c(\\d+)_i32"
            dims = re.findall(rf"cluster_dim\\[%\\w+\\] \\({dim}, {dim}, {dim}\\)", mlir)
            print(stage, dims, "non_portable_cluster_size_allowed = 1" in mlir)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=subprocess_env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cluster [('1', '2', '1')] True" in done.stdout, done.stdout
    assert "cpasync [('1', '16', '1')] True" in done.stdout, done.stdout


# -- the pieces a lesson lets a learner rewrite ---------------------------------------------------


class WarpDown(WarpRMSNorm):
    def warp_reduce(self, val):
        for i in (16, 8, 4, 2, 1):  # a tree with shfl.down: only lane 0 ends up with the sum
            val = val + cute.arch.shuffle_sync_down(val, offset=i)
        return cute.arch.shuffle_sync(val, 0)


# An override that branches on runtime values is a @cute.jit function, like the helpers it replaces.
class BlockTwoBarriers(BlockRMSNorm):
    @cute.jit
    def block_reduce(self, val, buffer):
        lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
        wpr = cute.size(buffer, mode=[1])
        if lane == 0:
            buffer[warp // wpr, warp % wpr] = val
        cute.arch.barrier()
        total = cutlass.Float32(0.0)
        for i in cutlass.range_constexpr(wpr):
            total += buffer[warp // wpr, i]
        cute.arch.barrier()
        return total


class ClusterOneSender(ClusterRMSNorm):
    @cute.jit
    def cluster_exchange(self, val, buffer, mbar_ptr):
        # one lane per row group loops over the peers instead of one lane per peer
        row, warp_in_row, lane = (
            cute.arch.thread_idx()[0] // self.config.threads_per_row,
            (cute.arch.thread_idx()[0] % self.config.threads_per_row) // 32,
            cute.arch.thread_idx()[0] % min(self.config.threads_per_row, 32),
        )
        rank = cute.arch.block_idx_in_cluster()
        if lane == 0:
            for peer in cutlass.range_constexpr(self.config.cluster_n):
                slot = buffer.iterator + cute.crd2idx((row, (warp_in_row, rank)), buffer.layout)
                cute.arch.store_async_dsmem(slot, f32_bits(val), mbar_ptr, peer)


class ClusterWrongBytes(ClusterRMSNorm):
    def expected_tx_bytes(self):
        return 4


class ClusterOneBarrier(ClusterRMSNorm):
    @cute.jit
    def arm_cluster_barrier(self, mbar_ptr, count: cutlass.Constexpr[int] = 1):
        # arms the first row block's mbarrier only: the later blocks would wait forever
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            cute.arch.mbarrier_init(mbar_ptr, 1)
            cute.arch.mbarrier_arrive_and_expect_tx(mbar_ptr, self.expected_tx_bytes())
        cute.arch.mbarrier_init_fence()
        cute.arch.cluster_arrive_relaxed()


class ClusterWaitEveryBlock(ClusterRMSNorm):
    def row_sum(self, val, buffer, mbar_ptr=None, first=True, last=True):
        # a cluster wait before every block's exchange: unpaired with the arrives
        return super().row_sum(val, buffer, mbar_ptr, True, last)


class ClusterNoLaunchBound(ClusterRMSNorm):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.min_ctas_per_sm = 0  # ptxas is free to take ~200 registers: one CTA per SM


class CpAsyncWaitAll(CpAsyncRMSNorm):
    def make_g2s_atom(self):
        from cutlass.cute.nvgpu import cpasync

        return cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.ALWAYS),
            self.dtype,
            num_bits_per_copy=128,
        )

    def wait_groups_pending(self, stage):
        return 0


class ClusterViaRowReduce(ClusterRMSNorm):
    def row_sum(self, val, buffer, mbar_ptr, first=True, last=True):
        # the one-call helper of primitives.reduce in place of the stage's explicit levels
        clustered = self.config.cluster_n > 1
        val = row_reduce(
            val,
            operator.add,
            self.config.threads_per_row,
            buffer,
            mbar_ptr if clustered else None,
            send=self.cluster_exchange,
            hook_fn=cute.arch.cluster_wait if clustered and first else None,
        )
        if clustered and last:
            cute.arch.cluster_arrive()
        return val


@pytest.mark.parametrize(
    "N, fields",
    [(256, dict(threads_per_row=16, cluster_n=2)), (4096, {}), (65536, {}), (262144, {})],
)
def test_row_reduce_matches_the_stage_reduction(N, fields):
    # warp only (256 bf16 at 16 lanes is one level + cluster), block, cluster 4, cluster 16
    ref = compile_report("cluster", N, torch.bfloat16, sass=False, **fields)
    got = compile_report(ClusterViaRowReduce, N, torch.bfloat16, sass=False, **fields)
    _check("cluster", got, got.config)
    for pattern in ("shfl.sync.bfly", "bar.sync", "st.async", "mbarrier", "barrier.cluster"):
        assert got.count(pattern) == ref.count(pattern), pattern


def test_overridden_pieces_end_up_in_the_kernel():
    bf16 = torch.bfloat16
    r = compile_report(WarpDown, 1024, bf16, sass=False)
    assert r.stage == "warp" and r.count("shfl.sync.down") == 5 and r.count("shfl.sync.bfly") == 0

    r = compile_report(BlockTwoBarriers, 8192, bf16, sass=False)
    assert r.stage == "block" and r.count("bar.sync") == 2

    seq = ClusterRMSNorm.seq_rows  # row blocks per CTA, one exchange each
    r = compile_report(ClusterOneSender, 65536, bf16, sass=False)
    assert r.count("st.async") == 4 * seq  # cluster_n = 4, unrolled
    r = compile_report(ClusterWrongBytes, 65536, bf16, sass=False)
    assert _expect_tx_bytes(r) == [4] * seq

    r = compile_report(CpAsyncWaitAll, 8192, bf16, sass=False)
    assert r.count("cp.async.ca.shared.global") > 0 and r.count("cp.async.cg") == 0
    assert re.findall(r"cp\.async\.wait_group\s+(\d+)", r.ptx) == ["0", "0"]


def test_vector_width_and_the_cluster_byte_count():
    assert vector_elems(torch.bfloat16) == 8 and vector_elems(torch.float32) == 4
    # 256 threads per row (8 warps), one row per CTA, 4 CTAs: each receives 8 x 4 fp32 partials
    k = ClusterRMSNorm(torch.bfloat16, 65536, replace(RowConfig(256, 256), cluster_n=4))
    assert k.expected_tx_bytes() == 1 * 8 * 4 * 4


class CpAsync64(CpAsyncRMSNorm):
    def make_g2s_atom(self):
        from cutlass.cute.nvgpu import cpasync

        # .ca is the cache mode that takes 4-, 8- and 16-byte copies (.cg takes only 16)
        return cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.ALWAYS),
            self.dtype,
            num_bits_per_copy=64,
        )


@pytest.mark.parametrize("N", [1000, 1024])
def test_a_narrower_cp_async_atom_compiles_at_ragged_N(N):
    # y is stored with its own predicate, so an atom other than 128 bits (a learner's) compiles
    r = compile_report(CpAsync64, N, torch.bfloat16, sass=False)
    assert r.count(r"cp\.async\.ca\.shared\.global \[[^]]+\], \[[^]]+\], 8", regex=True) > 0
    assert r.count("cp.async.cg") == 0 and r.count("st.global.v4") > 0


class WarpNarrowCopy(WarpRMSNorm):
    def row_copy(self, dtype):  # 64-bit accesses: half the vector per instruction
        t = self.tiling
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=64)
        thr = cute.make_ordered_layout((t.rows_per_cta, t.threads_per_row), order=(1, 0))
        return cute.make_tiled_copy_tv(atom, thr, cute.make_layout((1, t.vec // 2)))


def test_the_row_copy_piece_is_every_copy_of_the_warp_and_block_kernels():
    r = compile_report(WarpNarrowCopy, 1024, torch.bfloat16, sass=False)
    # x, w and y all move through the overridden copy: 8-byte accesses only (4 x bf16 = v4.b16
    # or v2.b32), 32 elements of x per lane = 8 loads of x, 8 of w, 8 stores of y
    eight = r"\.(v4\.b16|v2\.b32)\s"
    assert r.count("ld.global" + eight, regex=True) == r.count("ld.global") == 16
    assert r.count("st.global" + eight, regex=True) == r.count("st.global") == 8


@pytest.mark.parametrize(
    "mutant, why",
    [
        (ClusterOneBarrier, "mbarrier.init"),
        (ClusterWaitEveryBlock, "barrier.cluster.wait"),
        (ClusterNoLaunchBound, "minnctapersm"),
    ],
)
def test_row_block_checks_catch_a_wrong_cluster_kernel(mutant, why):
    # the checks the cluster stage passes above fail on a kernel that gets the row blocks wrong
    N, bf16 = 131072, torch.bfloat16
    cfg = get_stage("cluster").default_config(N, bf16)
    _check("cluster", compile_report("cluster", N, bf16, config=cfg, sass=False), cfg)
    r = compile_report(mutant, N, bf16, config=cfg, sass=False)
    with pytest.raises(AssertionError) as caught:
        _check("cluster", r, cfg)
    assert why in str(caught.value)  # failed on the check that concerns it
