"""The exchange replayed from PTX (quack_edu.grading.dsmem_sim): the stages' own exchanges are
judged correct at every cluster config they use, and each way of getting it wrong is named
(the grader's hints and its gpu guard rest on this)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import pytest
import torch

from quack_edu.config import RowConfig
from quack_edu.grading.dsmem_sim import exchange_from_ptx, judge_exchange
from quack_edu.primitives.reduce import f32_bits
from quack_edu.stages.cluster import ClusterRMSNorm
from quack_edu.tools.inspect import compile_report


def _verdict(stage, N, cfg, base=0):
    r = compile_report(stage, N, torch.bfloat16, config=cfg, sass=False)
    ex = exchange_from_ptx(r.ptx, cfg.cluster_n, cfg.num_threads)
    assert ex is not None, "the interpreter gave up on the stage's own exchange"
    rows, warps = cfg.num_threads // cfg.threads_per_row, max(1, cfg.threads_per_row // 32)
    return ex, judge_exchange(
        ex,
        threads_per_row=cfg.threads_per_row,
        expected_bytes=rows * warps * cfg.cluster_n * 4,
        rows_per_cta=rows,
        base=base,
    )


@pytest.mark.parametrize(
    "N, cfg",
    [
        (1000, RowConfig(threads_per_row=16, num_threads=128, cluster_n=4)),
        (2000, RowConfig(threads_per_row=64, num_threads=128, cluster_n=2)),
        (65536, RowConfig(threads_per_row=256, num_threads=256, cluster_n=4)),
        (262144, RowConfig(threads_per_row=256, num_threads=256, cluster_n=16)),
    ],
)
def test_the_cluster_stage_exchange_is_correct(N, cfg):
    ex, v = _verdict("cluster", N, cfg)
    assert v.ok and v.safe, v.problem
    rows, warps = cfg.num_threads // cfg.threads_per_row, max(1, cfg.threads_per_row // 32)
    assert len(ex.stores) == cfg.cluster_n * rows * warps * cfg.cluster_n


def test_the_cpasync_stage_exchange_is_correct():
    # x's tile comes first in the cpasync stage's shared memory: the buffer is not at offset 0
    ex, v = _verdict("cpasync", 65536, RowConfig(256, 256, cluster_n=2, stages=2), base=None)
    assert v.ok, v.problem


def _lanes(self):
    tidx = cute.arch.thread_idx()[0]
    tpr = self.config.threads_per_row
    return tidx // tpr, (tidx % tpr) // 32, tidx % min(tpr, 32)


class ToSelf(ClusterRMSNorm):
    @cute.jit
    def cluster_exchange(self, val, buffer, mbar_ptr):
        row, warp, lane = _lanes(self)
        rank = cute.arch.block_idx_in_cluster()
        if lane < self.config.cluster_n:
            slot = buffer.iterator + cute.crd2idx((row, (warp, rank)), buffer.layout)
            cute.arch.store_async_dsmem(slot, f32_bits(val), mbar_ptr, rank)


class ToRankZero(ClusterRMSNorm):
    @cute.jit
    def cluster_exchange(self, val, buffer, mbar_ptr):
        row, warp, lane = _lanes(self)
        rank = cute.arch.block_idx_in_cluster()
        if lane < self.config.cluster_n:
            slot = buffer.iterator + cute.crd2idx((row, (warp, rank)), buffer.layout)
            cute.arch.store_async_dsmem(slot, f32_bits(val), mbar_ptr, 0)


class OneLaneShort(ClusterRMSNorm):
    @cute.jit
    def cluster_exchange(self, val, buffer, mbar_ptr):
        row, warp, lane = _lanes(self)
        rank = cute.arch.block_idx_in_cluster()
        if lane < self.config.cluster_n - 1:
            slot = buffer.iterator + cute.crd2idx((row, (warp, rank)), buffer.layout)
            cute.arch.store_async_dsmem(slot, f32_bits(val), mbar_ptr, lane)


class OneLaneLong(ClusterRMSNorm):
    @cute.jit
    def cluster_exchange(self, val, buffer, mbar_ptr):
        row, warp, lane = _lanes(self)
        rank = cute.arch.block_idx_in_cluster()
        if lane <= self.config.cluster_n:
            slot = buffer.iterator + cute.crd2idx((row, (warp, rank)), buffer.layout)
            cute.arch.store_async_dsmem(slot, f32_bits(val), mbar_ptr, lane)


class ReceiverSlot(ClusterRMSNorm):
    @cute.jit
    def cluster_exchange(self, val, buffer, mbar_ptr):
        row, warp, lane = _lanes(self)
        if lane < self.config.cluster_n:
            slot = buffer.iterator + cute.crd2idx((row, (warp, lane)), buffer.layout)
            cute.arch.store_async_dsmem(slot, f32_bits(val), mbar_ptr, lane)


class LoopOverPeers(ClusterRMSNorm):
    @cute.jit
    def cluster_exchange(self, val, buffer, mbar_ptr):
        row, warp, lane = _lanes(self)
        rank = cute.arch.block_idx_in_cluster()
        if lane == 0:
            for peer in cutlass.range(self.config.cluster_n, unroll=1):  # a device loop
                slot = buffer.iterator + cute.crd2idx((row, (warp, rank)), buffer.layout)
                cute.arch.store_async_dsmem(slot, f32_bits(val), mbar_ptr, peer)


@pytest.mark.parametrize(
    "cls, ok, safe, kind",
    [
        (LoopOverPeers, True, True, ""),
        (ToSelf, False, True, "self"),  # each CTA gets its bytes: safe to run, wrong values
        (ReceiverSlot, False, True, "slot"),
        (ToRankZero, False, False, "missing"),  # ranks 1..3 wait forever
        (OneLaneShort, False, False, "missing"),
        (OneLaneLong, False, False, "out_of_cluster"),
    ],
)
def test_each_wrong_exchange_is_named(cls, ok, safe, kind):
    _, v = _verdict(cls, 2000, RowConfig(threads_per_row=64, num_threads=128, cluster_n=4))
    assert (v.ok, v.safe, v.kind) == (ok, safe, kind), v.problem
