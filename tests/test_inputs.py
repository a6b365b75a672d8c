"""Bad input gets a clear Python error naming the problem (checked before any GPU is needed)."""

import pytest
import torch

from quack_edu.stages import STAGE_ORDER, get_stage


def _call(stage, x, w):
    return get_stage(stage).rmsnorm_fwd(x, w)


@pytest.mark.parametrize("stage", STAGE_ORDER)
def test_wrong_dtype(stage):
    with pytest.raises(TypeError, match="dtype torch.float64"):
        _call(stage, torch.zeros(4, 256, dtype=torch.float64), torch.ones(256))
    with pytest.raises(TypeError, match="weight has dtype torch.int32"):
        _call(stage, torch.zeros(4, 256), torch.ones(256, dtype=torch.int32))


@pytest.mark.parametrize("stage", STAGE_ORDER)
def test_wrong_shapes(stage):
    with pytest.raises(ValueError, match="2-D"):
        _call(stage, torch.zeros(2, 4, 256), torch.ones(256))
    with pytest.raises(ValueError, match=r"weight must have shape \(256,\)"):
        _call(stage, torch.zeros(4, 256), torch.ones(128))
    with pytest.raises(TypeError, match="torch.Tensor"):
        _call(stage, [[1.0, 2.0]], torch.ones(2))


@pytest.mark.parametrize("stage", STAGE_ORDER)
def test_cpu_tensor_names_the_device(stage):
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="on cpu.*CUDA GPU"):
        _call(stage, x, torch.ones(256, dtype=torch.bfloat16))


# the final stage takes any N (narrower accesses where 16-byte vectors do not fit)
@pytest.mark.parametrize("stage", [s for s in STAGE_ORDER if s not in ("naive", "final")])
def test_vector_stages_reject_ragged_N(stage):
    with pytest.raises(ValueError, match="multiple of 8"):
        _call(
            stage, torch.zeros(4, 250, dtype=torch.bfloat16), torch.ones(250, dtype=torch.bfloat16)
        )
