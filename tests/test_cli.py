import json
import subprocess
import sys

import pytest

from quack_edu._env import MODE
from quack_edu.tools.cli import main


def test_ptx_command_prints_ptx(capsys):
    assert main(["ptx", "--stage", "naive", "--N", "4096", "--dtype", "bf16"]) == 0
    out, err = capsys.readouterr()
    assert ".target sm_90a" in out and "ld.global" in out
    assert "registers" in err


def test_ptx_grep(capsys):
    assert main(["ptx", "--N", "512", "--grep", "rsqrt"]) == 0
    out, err = capsys.readouterr()
    assert all("rsqrt" in line for line in out.strip().splitlines())
    assert "instructions match" in err


def test_doctor_reports_the_mode(subprocess_env):
    done = subprocess.run(
        [sys.executable, "-m", "quack_edu", "doctor"],
        capture_output=True,
        text=True,
        env=subprocess_env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    if MODE.gpu:
        assert "Mode: GPU" in done.stdout
    else:
        assert "Mode: compile-only" in done.stdout and MODE.reason.split(" (")[0] in done.stdout
    assert "Compile check" in done.stdout and ".target sm_90a" in done.stdout


def test_doctor_fails_on_a_broken_install(tmp_path, subprocess_env):
    # Hide the CuTe DSL behind a module that cannot be imported: the doctor must say so and exit 1.
    (tmp_path / "cutlass").mkdir()
    (tmp_path / "cutlass" / "__init__.py").write_text("raise ImportError('simulated broken DSL')")
    code = "import sys; from quack_edu.tools.doctor import run_doctor; sys.exit(run_doctor())"
    env = {**subprocess_env, "PYTHONPATH": f"{tmp_path}:{subprocess_env['PYTHONPATH']}"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FIX" in done.stdout and "simulated broken DSL" in done.stdout


@pytest.mark.skipif(MODE.gpu, reason="checks the no-GPU message")
def test_bench_without_gpu_says_why(capsys):
    assert main(["bench"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_bench_table_formats_recorded_results():
    from quack_edu.tools.bench import table

    result = {
        "gpu": "NVIDIA H200",
        "date": "2026-11-29",
        "copy_gbps": 4273.0,
        "rows": [
            {
                "kernel": "naive",
                "M": 32768,
                "N": 4096,
                "dtype": "bf16",
                "graph": False,
                "us": 100.0,
                "gbps": 2684.0,
            },
            {
                "kernel": "quack",
                "M": 32768,
                "N": 4096,
                "dtype": "bf16",
                "graph": False,
                "error": "ImportError",
            },
        ],
    }
    text = table(result)
    assert "4273" in text and "2684" in text and json.dumps(result)


def test_bench_kernel_names_variants_and_configs():
    import pytest
    import torch

    from quack_edu.stages import cluster
    from quack_edu.tools.bench import resolve_config, split_name, stage_fn

    assert split_name("cluster@hold#1") == ("cluster", "hold", "1")
    assert split_name("cpasync") == ("cpasync", "", "")
    # a variant keeps its stage's configs; #k picks the k-th of them
    N, bf16 = 131072, torch.bfloat16
    assert resolve_config("cluster@hold#1", N, bf16) == cluster.configs(N, bf16)[1]
    assert resolve_config("cluster@late", N, bf16) == cluster.default_config(N, bf16)
    with pytest.raises(ValueError, match="no variant 'nope'.*hold"):
        stage_fn("cluster@nope")
    with pytest.raises(ValueError, match="configs at N"):
        resolve_config("cluster#99", N, bf16)
