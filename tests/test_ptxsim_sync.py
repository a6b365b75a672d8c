"""ptxsim runs clusters, mbarriers and cp.async, and checks the order of shared-memory accesses.

The cluster, cpasync and final stages (forced 2- and 4-CTA clusters, 1, 2 and 4 commit groups;
the final kernel's weight in shared memory or registers, row blocks in turn) are compiled for
sm_90a and simulated at M = 1, 3, 7 in every dtype and mixed weight dtypes, in the forward order;
other orders (one warp at a time, reversed or seeded random) give the same bits.
Wrong kernels (a stage with one piece replaced, as the lessons' mutants do) are caught by the
ordering checks, which name both instructions: an mbarrier wait on the wrong parity, a store
into a peer before its mbarrier is initialised, a cluster wait with no arrive (a hang), a part
of the row read while its cp.async group may be in flight. Hand-written PTX checks the
pieces: a bar.sync under a branch, a missing bar.sync, a wait that never completes, cp.async's
zero fill and groups, mapa.

Each kernel is compiled once per test process (``ptxsim.stages`` caches the PTX).
"""

from __future__ import annotations

import operator
from dataclasses import replace

import cutlass
import cutlass.cute as cute
import numpy as np
import pytest
import torch

from quack_edu.primitives import reduce as reduce_utils
from quack_edu.ptxsim import (
    Hang,
    PartialBarrier,
    Race,
    Schedule,
    TensorArg,
    launch,
    run_kernel,
    run_stage,
)
from quack_edu.ptxsim.stages import compiled_kernel, run_ptx
from quack_edu.reference import assert_close, rmsnorm_ref
from quack_edu.stages.cluster import ClusterRMSNorm, forced_cluster
from quack_edu.stages.cpasync import CpAsyncRMSNorm, cpasync_config

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
DTYPES = [(BF16, BF16), (FP16, FP16), (FP32, FP32), (BF16, FP32), (FP16, BF16), (FP32, BF16)]


def _inputs(M, N, dtype, wdtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, N, generator=g).to(dtype)
    w = (1 + 0.5 * torch.randn(N, generator=g)).to(wdtype)
    return x, w


def _check(y, x, w):
    assert_close(y, rmsnorm_ref(x, w, eps=1e-6, compute_dtype=torch.float64), dtype=x.dtype)


def _cluster(cn):
    return lambda N, dt: forced_cluster(N, dt, cn)


def _cpasync(stages, cn=1):
    def make(N, dt):
        base = forced_cluster(N, dt, cn, max_vecs=16) if cn > 1 else cpasync_config(N, dt)
        return replace(base, stages=stages)

    return make


def _final(**changes):
    from quack_edu.stages.final import default_config

    return lambda N, dt: replace(default_config(N, dt), **changes)


def _cases():
    for dtype, wdtype in DTYPES:
        yield "cluster", 1000, dtype, wdtype, "2 CTAs", _cluster(2)
        yield "cpasync", 1000, dtype, wdtype, "2 groups", _cpasync(2)
        yield "final", 1000, dtype, wdtype, "default", _final()
    for dtype, wdtype in [(BF16, BF16), (FP32, FP32)]:
        yield "final", 2048, dtype, wdtype, "2 CTAs", _final(cluster_n=2)
        yield "final", 1000, dtype, wdtype, "2 groups", _final(stages=2)
        yield "final", 1000, dtype, wdtype, "weight in registers", _final(weight_in_smem=False)
        yield (
            "final",
            1000,
            dtype,
            wdtype,
            "2 blocks 2 buffers",
            _final(blocks_per_cta=2, buffers=2),
        )
    for dtype, wdtype in [(BF16, BF16), (FP32, FP32)]:
        yield "cluster", 2040, dtype, wdtype, "4 CTAs", _cluster(4)
        yield "cpasync", 1000, dtype, wdtype, "1 group", _cpasync(1)
        yield "cpasync", 2000, dtype, wdtype, "4 groups", _cpasync(4)
        yield "cpasync", 1000, dtype, wdtype, "2 CTAs 2 groups", _cpasync(2, cn=2)


@pytest.mark.parametrize(
    "stage,N,dtype,wdtype,cfg",
    [
        pytest.param(s, N, d, w, c, id=f"{s}-{N}-{str(d)[6:]}-w{str(w)[6:]}-{name}")
        for s, N, d, w, name, c in _cases()
    ],
)
def test_stage_values(stage, N, dtype, wdtype, cfg):
    config = cfg(N, dtype)
    for i, M in enumerate((1, 3, 7)):
        x, w = _inputs(M, N, dtype, wdtype, seed=100 * i + N)
        y = run_stage(stage, x, w, eps=1e-6, config=config)
        assert y.shape == (M, N) and y.dtype == dtype
        _check(y, x, w)


@pytest.mark.parametrize(
    "cls,dtype,cfg",
    [
        pytest.param(ClusterRMSNorm, BF16, _cluster(2), id="cluster"),
        pytest.param(CpAsyncRMSNorm, FP32, _cpasync(2, cn=2), id="cpasync-cluster"),
        pytest.param(None, BF16, _final(cluster_n=2, blocks_per_cta=2, buffers=2), id="final"),
    ],
)
def test_orders_agree(cls, dtype, cfg):
    """Forward (CTAs in lockstep), reversed and two random orders (a warp at a time): the same
    bits, as a correct kernel must give whatever the order."""
    if cls is None:
        from quack_edu.stages.final import FinalRMSNorm as cls
    kernel = cls(dtype, 1000, cfg(1000, dtype), dtype)
    x, w = _inputs(7, 1000, dtype, dtype, seed=5)
    ptx = compiled_kernel(kernel)
    runs = [
        run_ptx(ptx, kernel, x, w, order=order, seed=seed)
        for order, seed in [("forward", 0), ("reversed", 0), ("random", 1), ("random", 2)]
    ]
    _check(runs[0], x, w)
    bits = torch.int16 if dtype != FP32 else torch.int32
    for y in runs[1:]:
        assert torch.equal(y.view(bits), runs[0].view(bits))


# ---- wrong cluster kernels: the exchange's ordering ----------------------------------------------
class _Exchange(ClusterRMSNorm):
    """The cluster stage's row_sum with its barriers as class flags, one row block a CTA."""

    seq_rows = 1
    parity = 0
    cluster_wait_first = True
    arrive_last = True

    def row_sum(self, val, buffer, mbar_ptr=None, first=True, last=True):
        val = self.warp_reduce(val)
        if cutlass.const_expr(first and self.cluster_wait_first):
            cute.arch.cluster_wait()
        self.cluster_exchange(val, buffer, mbar_ptr)
        cute.arch.mbarrier_wait(mbar_ptr, phase=self.parity)
        val = reduce_utils.combine_buffer(buffer, operator.add, self.tiling.threads_per_row)
        if cutlass.const_expr(last and self.arrive_last):
            cute.arch.cluster_arrive()
        return val


class WrongParity(_Exchange):
    parity = 1


class SendsEarly(_Exchange):
    cluster_wait_first = False


class FinalWaitAlone(_Exchange):
    arrive_last = False


def _run_wrong(cls, order="forward"):
    kernel = cls(BF16, 1000, forced_cluster(1000, BF16, 2), BF16)
    x, w = _inputs(3, 1000, BF16, BF16, seed=9)
    return run_ptx(compiled_kernel(kernel), kernel, x, w, order=order)


def test_the_flags_kernel_is_right():
    kernel = _Exchange(BF16, 1000, forced_cluster(1000, BF16, 2), BF16)
    x, w = _inputs(3, 1000, BF16, BF16, seed=9)
    _check(run_kernel(kernel, x, w), x, w)


@pytest.mark.parametrize("order", ["forward", "reversed", "random"])
def test_wrong_parity_is_a_race_naming_both_instructions(order):
    """parity 1 at the mbarrier's first phase asks for the phase before, complete at once: the
    slots are read with nothing ordering the peers' st.async before."""
    with pytest.raises(Race) as e:
        _run_wrong(WrongParity, order)
    msg = str(e.value)
    assert "the read:  PTX line" in msg and "ld.shared" in msg
    assert "the write: PTX line" in msg and "st.async.shared::cluster" in msg


def test_a_store_before_the_peer_inits_its_mbarrier_is_a_race():
    for order in ("forward", "random"):
        with pytest.raises(Race, match=r"mbarrier.*(no mbarrier\.init|init)"):
            _run_wrong(SendsEarly, order)


def test_a_cluster_wait_with_no_arrive_hangs_naming_it():
    with pytest.raises(Hang, match=r"barrier\.cluster\.wait.*no arrive of its own"):
        _run_wrong(FinalWaitAlone)


class ReadsEarly(CpAsyncRMSNorm):
    """05.wait_groups' mutant: one group too many still in flight when a part is read."""

    def wait_groups_pending(self, stage: int) -> int:
        return self.config.stages - stage


def test_a_part_read_before_its_group_lands_is_a_race():
    kernel = ReadsEarly(BF16, 1000, _cpasync(2)(1000, BF16), BF16)
    x, w = _inputs(3, 1000, BF16, BF16, seed=2)
    with pytest.raises(Race, match=r"cp\.async is still writing(.|\n)*the cp\.async: PTX line"):
        run_kernel(kernel, x, w)


# ---- hand-written PTX ---------------------------------------------------------------------------
def _ptx(body: str, regs: str = "") -> str:
    return f"""
.version 8.8
.target sm_90a
.address_size 64
.extern .shared .align 16 .b8 smem[];
.visible .entry probe(.param .u64 out, .param .u64 inp)
{{
    .reg .pred %p<4>;
    .reg .b32 %r<20>;
    .reg .b64 %rd<12>;
    {regs}
    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd6, [inp];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    add.s64 %rd7, %rd6, %rd2;
    mov.u32 %r10, smem;
    shl.b32 %r11, %r1, 2;
    add.s32 %r12, %r10, %r11;
{body}
    ret;
}}
"""


def _run(body, n=64, inp=None, order="forward", **kw):
    inp = np.arange(n, dtype=np.uint32) + 100 if inp is None else inp
    kw["schedule"] = Schedule(order)
    out, _ = launch(
        _ptx(body), kw.pop("grid", (1,)), (n,),
        [TensorArg(np.zeros(n * kw.pop("cluster_n", 1), np.uint32)), TensorArg(inp)],
        dynamic_smem=1024, **kw,
    )  # fmt: skip
    return out


# every thread writes its slot; thread t then reads thread t ^ 32's (another warp's)
_EXCHANGE = """
    st.shared.b32 [%r12], %r1;
{between}
    xor.b32 %r13, %r11, 128;
    add.s32 %r14, %r10, %r13;
    ld.shared.b32 %r15, [%r14];
    st.global.b32 [%rd3], %r15;
"""


def test_bar_sync_orders_the_exchange():
    out = _run(_EXCHANGE.format(between="    bar.sync 0;"), order="reversed")
    assert (out == np.arange(64) ^ 32).all()


@pytest.mark.parametrize("order", ["forward", "reversed"])
def test_a_missing_bar_sync_is_a_race(order):
    """Forward (lockstep): every store before every load, the values right, the race found;
    reversed (warp 1 first): warp 1 reads before warp 0 writes, warp 0 then reads warp 1's
    write unordered."""
    with pytest.raises(Race, match=r"the read:  PTX line \d+: `ld\.shared(.|\n)*st\.shared"):
        _run(_EXCHANGE.format(between=""), order=order)


def test_a_bar_sync_under_a_thread_branch_is_a_partial_barrier():
    body = """
    setp.lt.u32 %p1, %r1, 32;
    @!%p1 bra $SKIP;
    bar.sync 0;
$SKIP:
    st.global.b32 [%rd3], %r1;
"""
    with pytest.raises(PartialBarrier, match=r"32 of its 64 threads wait at PTX line.*exited"):
        _run(body)


def test_an_mbarrier_wait_that_never_completes_hangs_naming_it():
    """The mbarrier expects 2 arrivals; only thread 0 arrives."""
    body = """
    setp.eq.u32 %p1, %r1, 0;
    @!%p1 bra $INIT_DONE;
    mov.b32 %r2, 2;
    mbarrier.init.shared.b64 [%r10], %r2;
    mbarrier.arrive.shared.b64 %rd8, [%r10];
$INIT_DONE:
    bar.sync 0;
$WAIT:
    mbarrier.try_wait.parity.shared.b64 %p2, [%r10], 0;
    @!%p2 bra $WAIT;
    st.global.b32 [%rd3], %r1;
"""
    with pytest.raises(Hang, match=r"threads 0-63 wait at PTX line \d+: `mbarrier\.try_wait"
                                   r"(.|\n)*still expects 1 arrival"):  # fmt: skip
        _run(body)


def test_mbarrier_phases_and_parity():
    """Every thread arrives twice on a barrier of 64: after phase 0 completes, parity 0 is
    complete at once and parity 1 waits for phase 1; the arrive's token waits likewise."""
    body = """
    setp.eq.u32 %p1, %r1, 0;
    @!%p1 bra $INIT_DONE;
    mov.b32 %r2, 64;
    mbarrier.init.shared.b64 [%r10], %r2;
$INIT_DONE:
    bar.sync 0;
    st.shared.b32 [%r12+64], %r1;
    mbarrier.arrive.shared.b64 %rd8, [%r10];
$W0:
    mbarrier.try_wait.shared.b64 %p2, [%r10], %rd8;
    @!%p2 bra $W0;
    mbarrier.try_wait.parity.shared.b64 %p3, [%r10], 0;
    xor.b32 %r13, %r11, 128;
    add.s32 %r14, %r10, %r13;
    ld.shared.b32 %r15, [%r14+64];
    mbarrier.arrive.shared.b64 %rd9, [%r10];
$W1:
    mbarrier.try_wait.parity.shared.b64 %p2, [%r10], 1;
    @!%p2 bra $W1;
    selp.b32 %r16, 1000, 0, %p3;
    add.s32 %r17, %r15, %r16;
    st.global.b32 [%rd3], %r17;
"""
    for order in ("forward", "reversed", "random"):
        out = _run(body, order=order)
        assert (out == (np.arange(64) ^ 32) + 1000).all(), order


def test_cp_async_lands_at_its_wait_with_zero_fill():
    """Thread t copies 16 bytes (4 words of the input at 4t) with src-size 8 for odd t: the
    last 8 bytes are zeros. Group 0 is waited for; group 1 (a second copy) is not read."""
    body = """
    mul.wide.u32 %rd4, %r1, 16;
    add.s64 %rd5, %rd6, %rd4;
    shl.b32 %r2, %r1, 4;
    add.s32 %r3, %r10, %r2;
    and.b32 %r4, %r1, 1;
    setp.eq.u32 %p1, %r4, 1;
    selp.b32 %r5, 8, 16, %p1;
    cp.async.ca.shared.global [%r3], [%rd5], 16, %r5;
    cp.async.commit_group;
    cp.async.cg.shared.global [%r3+512], [%rd5], 16;
    cp.async.commit_group;
    cp.async.wait_group 1;
    ld.shared.v4.b32 {%r6, %r7, %r8, %r9}, [%r3];
    add.s32 %r6, %r6, %r9;
    st.global.b32 [%rd3], %r6;
"""
    inp = np.arange(4 * 32, dtype=np.uint32) + 1
    out = _run(body, n=32, inp=inp)
    t = np.arange(32)
    assert (out == inp[4 * t] + np.where(t % 2, 0, inp[4 * t + 3])).all()
    early = body.replace("cp.async.wait_group 1;", "cp.async.wait_group 2;")
    with pytest.raises(Race, match="cp.async is still writing"):
        _run(early, n=32, inp=inp)


def test_mapa_reaches_the_peer_and_cluster_barriers_order_it():
    """Two CTAs of a cluster: each stores its rank into the peer's shared memory through mapa,
    then (arrive, wait) reads its own slot; without the barrier, a race."""
    body = """
    mov.u32 %r2, %cluster_ctarank;
    xor.b32 %r3, %r2, 1;
    mapa.shared::cluster.u32 %r4, %r12, %r3;
    add.s32 %r5, %r2, 7;
    st.shared::cluster.b32 [%r4], %r5;
{between}
    ld.shared.b32 %r6, [%r12];
    mov.u32 %r7, %ctaid.x;
    mul.wide.u32 %rd4, %r7, 128;
    add.s64 %rd5, %rd3, %rd4;
    st.global.b32 [%rd5], %r6;
    barrier.cluster.arrive.release;
    barrier.cluster.wait.acquire;
"""
    synced = "    barrier.cluster.arrive.release.aligned;\n    barrier.cluster.wait.aligned;"
    for order in ("forward", "reversed"):
        out = _run(body.format(between=synced), n=32, grid=(2,), cluster=(2,), cluster_n=2,
                   order=order)  # fmt: skip
        assert (out.reshape(2, 32) == [[8], [7]]).all()
    with pytest.raises(Race, match="CTA"):
        _run(body.format(between=""), n=32, grid=(2,), cluster=(2,), cluster_n=2,
             order="reversed")  # fmt: skip
    # the check off (Schedule(check=False)): the values of that order, the peer's slot unwritten
    inp = np.arange(32, dtype=np.uint32)
    out, _ = launch(
        _ptx(body.format(between="")), (2,), (32,),
        [TensorArg(np.zeros(64, np.uint32)), TensorArg(inp)],
        dynamic_smem=1024, cluster=(2,), schedule=Schedule("reversed", check=False),
    )  # fmt: skip
    assert (out.reshape(2, 32)[1] == 0xFFFFFFFF).all()  # CTA 1 ran first: CTA 0 had not stored


def test_cluster_registers_elect_and_transaction_bytes():
    """A grid of 2 clusters of 2: each thread stores %cluster_ctarank, %cluster_nctarank,
    %clusterid.x and whether elect.sync chose it; one elected thread per CTA arms the mbarrier
    with 8 bytes that two complete_tx of 4 settle, and everyone waits for that phase."""
    body = """
    setp.eq.u32 %p1, %r1, 0;
    @!%p1 bra $INIT_DONE;
    mov.b32 %r2, 1;
    mbarrier.init.shared.b64 [%r10], %r2;
$INIT_DONE:
    bar.sync 0;
    elect.sync %r3|%p2, -1;
    @!%p2 bra $ARMED;
    mbarrier.arrive.expect_tx.shared.b64 %rd8, [%r10], 8;
    mbarrier.complete_tx.shared.b64 [%r10], 4;
    mbarrier.complete_tx.shared.b64 [%r10], 4;
$ARMED:
    mbarrier.try_wait.parity.shared.b64 %p3, [%r10], 0;
    @!%p3 bra $ARMED;
    mov.u32 %r4, %cluster_ctarank;
    mov.u32 %r5, %cluster_nctarank;
    mov.u32 %r6, %clusterid.x;
    selp.b32 %r7, 1, 0, %p2;
    mad.lo.s32 %r8, %r6, 1000, %r5;
    mad.lo.s32 %r8, %r4, 100, %r8;
    mad.lo.s32 %r8, %r7, 10000, %r8;
    mov.u32 %r9, %ctaid.x;
    mul.wide.u32 %rd4, %r9, 128;
    add.s64 %rd5, %rd3, %rd4;
    st.global.b32 [%rd5], %r8;
"""
    out = _run(body, n=32, grid=(4,), cluster=(2,), cluster_n=4).reshape(4, 32)
    cta = np.arange(4)[:, None]
    want = (cta // 2) * 1000 + 2 + (cta % 2) * 100 + np.where(np.arange(32) == 0, 10000, 0)
    assert (out == want).all()
