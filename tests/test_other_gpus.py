"""On a GPU that is not a Hopper, everything says so instead of failing later: the mode is
compile-only with the GPU named, the library refuses with a RuntimeError that names the GPU and
what it needs, and the doctor tells the learner what the lessons do there. Checked on the CPU
by feeding torch.cuda each GPU's name, compute capability and limits."""

from __future__ import annotations

import types

import pytest
import torch

from quack_edu import _env, runtime
from quack_edu.tools import doctor

#: (name, compute capability, cluster launch, opt-in shared memory per block in KiB)
GPUS = [
    ("NVIDIA A100-SXM4-80GB", (8, 0), False, 163),
    ("NVIDIA GeForce RTX 3090", (8, 6), False, 99),
    ("NVIDIA L4", (8, 9), False, 99),
    ("NVIDIA B200", (10, 0), True, 227),
    ("NVIDIA GeForce RTX 5090", (12, 0), True, 99),
]


@pytest.fixture(params=GPUS, ids=[g[0].split()[-1] for g in GPUS])
def gpu(request, monkeypatch):
    name, cap, clusters, smem_kib = request.param
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: cap)
    attrs = {
        "cluster_launch": clusters,
        "sms": 100,
        "smem_per_block_optin": smem_kib * 1024,
        "smem_per_sm": (smem_kib + 1) * 1024,
        "regs_per_sm": 65536,
    }
    monkeypatch.setattr(doctor, "_device_attributes", lambda index=0: attrs)
    monkeypatch.setattr(runtime, "_HOPPER", {})
    return name, cap


def test_the_mode_is_compile_only_and_names_the_gpu(gpu):
    name, cap = gpu
    mode = _env._detect()
    assert not mode.gpu and mode.capability == cap
    assert name in mode.reason and f"sm_{cap[0]}{cap[1]}" in mode.reason
    assert "need a Hopper GPU (sm_90)" in mode.reason


def test_the_library_refuses_with_the_gpu_named(gpu):
    name, cap = gpu
    x = types.SimpleNamespace(device=torch.device("cuda", 0), get_device=lambda: 0)
    with pytest.raises(RuntimeError) as e:
        runtime.check_device(x, without_gpu="")
    assert name in str(e.value) and f"sm_{cap[0]}{cap[1]}" in str(e.value)
    assert "Hopper (sm_90" in str(e.value)


def test_the_doctor_says_what_the_lessons_do_there(gpu, monkeypatch):
    name, cap = gpu
    monkeypatch.setattr(_env, "MODE", _env._detect())
    text = doctor.doctor_report(compile_check=False).text()
    assert f"{name}, compute capability {cap[0]}.{cap[1]}" in text
    assert "kernels need sm_90" in text and "lessons run compile-only" in text
    assert "Mode: compile-only" in text and "show recorded H200 results" in text


def test_the_doctor_names_the_clusters_a_hopper_holds(monkeypatch):
    """On a Hopper GPU the doctor prints the clusters held at once (the driver's count, which
    the backward's persistent grid uses), or says why it could not ask."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
    attrs = {"cluster_launch": True, "sms": 132, "smem_per_block_optin": 227 * 1024,
             "smem_per_sm": 228 * 1024, "regs_per_sm": 65536}  # fmt: skip
    monkeypatch.setattr(doctor, "_device_attributes", lambda index=0: attrs)
    held = {2: 66, 4: 30, 8: 15, 16: 7}
    monkeypatch.setattr(runtime, "resident_clusters", lambda dev, n, threads, ctas: held[n])
    text = doctor.doctor_report(compile_check=False).text()
    assert "66 of 2, 30 of 4, 15 of 8, 7 of 16 CTAs" in text
    monkeypatch.setattr(runtime, "resident_clusters", lambda *args: None)
    monkeypatch.setitem(runtime._RESIDENT_ERRORS, 0, "RuntimeError: CUDA driver error 999")
    text = doctor.doctor_report(compile_check=False).text()
    assert "unknown (RuntimeError: CUDA driver error 999)" in text
