"""Values of every stage on the GPU against the fp32 reference (marked `gpu`).

Fresh random inputs every call, ragged shapes, all dtypes, outputs poisoned with NaN before the
call so an unwritten element fails. A stage that does not support a shape is skipped with its
own error message as the reason.
"""

import pytest
import torch

from quack_edu.reference import assert_close, rmsnorm_ref
from quack_edu.stages import STAGE_ORDER, get_stage

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
MS = [1, 37, 199, 4096]
NS = [256, 760, 4096, 16384]


def _supports(mod, N, dtype):
    kernel = mod.KERNEL
    limit = kernel.max_N_for(dtype)
    if limit is not None and N > limit:
        return f"N={N} > max_N={limit} for {dtype}"
    if N % kernel.row_align_for(dtype):
        return f"N={N} is not a multiple of {kernel.row_align_for(dtype)}"
    return None


def _check(mod, M, N, dtype, config=None, weight_dtype=None, x=None):
    x = torch.randn(M, N, device="cuda", dtype=dtype) if x is None else x
    w = torch.randn(N, device="cuda", dtype=weight_dtype or dtype)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
    got = mod.rmsnorm_fwd(x, w, 1e-6, config=config, out=out)
    torch.cuda.synchronize()
    assert got.data_ptr() == out.data_ptr()
    assert_close(got, rmsnorm_ref(x, w, eps=1e-6), dtype, what=f"M={M} N={N} {dtype} {config}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("stage", STAGE_ORDER)
def test_default_config_values(stage, N, dtype):
    mod = get_stage(stage)
    if why := _supports(mod, N, dtype):
        pytest.skip(why)
    for M in MS:
        _check(mod, M, N, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("stage", STAGE_ORDER)
def test_every_config_values(stage, N, dtype):
    mod = get_stage(stage)
    if why := _supports(mod, N, dtype):
        pytest.skip(why)
    cfgs = mod.configs(N, dtype)
    if stage == "final":  # an autotuner's ~80 candidates: every 6th (each is a compile)
        cfgs = cfgs[::6]
    for cfg in cfgs:
        _check(mod, 37, N, dtype, config=cfg)


@pytest.mark.parametrize("stage", STAGE_ORDER)
def test_fp32_weight_and_padded_rows(stage):
    mod = get_stage(stage)
    _check(mod, 199, 4096, torch.bfloat16, weight_dtype=torch.float32)
    # rows that are not adjacent in memory: a slice of a wider tensor
    wide = torch.randn(199, 4096 + 64, device="cuda", dtype=torch.bfloat16)
    _check(mod, 199, 4096, torch.bfloat16, x=wide[:, :4096])


@pytest.mark.parametrize("stage", STAGE_ORDER)
def test_empty_input_and_eps(stage):
    mod = get_stage(stage)
    x = torch.empty(0, 256, device="cuda", dtype=torch.bfloat16)
    assert mod.rmsnorm_fwd(x, torch.ones(256, device="cuda", dtype=torch.bfloat16)).shape == (
        0,
        256,
    )
    # eps matters when a row is all zeros: y = 0, never NaN
    z = torch.zeros(3, 256, device="cuda", dtype=torch.float32)
    y = mod.rmsnorm_fwd(z, torch.ones(256, device="cuda"), eps=1e-5)
    assert torch.equal(y, z)


LARGE_NS = [32768, 65536, 100000, 131072, 262144]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("N", LARGE_NS)
@pytest.mark.parametrize("stage", STAGE_ORDER)
def test_large_rows(stage, N, dtype):
    """Rows up to 256K: the default config at M in {1, 37, 4096}, every config at M=37."""
    mod = get_stage(stage)
    if why := _supports(mod, N, dtype):
        pytest.skip(why)
    if stage in ("naive", "warp") and N > 32768:
        pytest.skip("one thread/warp per row: covered up to 32K (slow beyond, same code path)")
    for M in (1, 37, 4096):
        _check(mod, M, N, dtype)
    cfgs = mod.configs(N, dtype)
    if stage == "final":  # an autotuner's ~80 candidates: every 6th (each is a compile)
        cfgs = cfgs[::6]
    for cfg in cfgs:
        _check(mod, 37, N, dtype, config=cfg)


def test_values_catch_a_cluster_kernel_that_leaves_rows_unwritten():
    # the value check above fails on a wrong kernel: this one launches half the CTAs it needs,
    # so half the row blocks are never written and keep their NaN poison
    import cutlass.cute as cute

    from quack_edu.runtime import run_forward
    from quack_edu.stages.cluster import ClusterRMSNorm

    class HalfGrid(ClusterRMSNorm):
        @cute.jit
        def __call__(self, mX, mW, mO, eps, stream):
            t = self.tiling
            self.kernel(mX, mW, mO, eps).launch(
                grid=[cute.ceil_div(mX.shape[0], t.rows_per_cta * self.seq * 2), t.cluster_n, 1],
                block=[t.num_threads, 1, 1],
                cluster=[1, t.cluster_n, 1],
                stream=stream,
                min_blocks_per_mp=self.min_ctas_per_sm,
                preferred_smem_carveout=100,
            )

    M, N, dtype = 4096, 65536, torch.bfloat16
    cfg = get_stage("cluster").default_config(N, dtype)
    x = torch.randn(M, N, device="cuda", dtype=dtype)
    w = torch.randn(N, device="cuda", dtype=dtype)
    ref = rmsnorm_ref(x, w, eps=1e-6)
    for kernel, wrong in ((ClusterRMSNorm, False), (HalfGrid, True)):
        out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
        run_forward(kernel, x, w, 1e-6, cfg, out=out)
        torch.cuda.synchronize()
        if wrong:
            with pytest.raises(AssertionError):
                assert_close(out, ref, dtype)
            assert out[: M // 2].isfinite().all() and out[-(M // 4) :].isnan().all()
        else:
            assert_close(out, ref, dtype)
