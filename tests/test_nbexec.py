"""The Jupyter-free notebook runner used on the GPU machine."""

import json

import pytest

from quack_edu.lessons.nbexec import run_notebook

nbformat = pytest.importorskip("nbformat")


def _nb(tmp_path, *cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    path = tmp_path / "t.ipynb"
    path.write_text(json.dumps(nb))
    return path


def test_cells_share_a_namespace_and_failures_do_not_stop_the_run(tmp_path):
    path = _nb(tmp_path, "%matplotlib inline\na = 2", "raise ValueError('boom')", "print(a * 21)")
    run = run_notebook(path)
    assert [c.ok for c in run.cells] == [True, False, True]
    assert "boom" in run.cells[1].error and run.cells[2].stdout.strip() == "42"


def test_a_cell_that_hangs_times_out(tmp_path):
    path = _nb(tmp_path, "while True:\n    pass", "b = 1")
    run = run_notebook(path, timeout=1)
    assert not run.cells[0].ok and "timeout of 1 s" in run.cells[0].error
    assert run.cells[1].ok


def test_a_cute_kernel_defined_in_a_cell_compiles(tmp_path):
    # CuTe DSL reads a kernel's source through inspect: the runner registers each cell's source.
    path = _nb(
        tmp_path,
        "import torch, quack_edu\nimport cutlass.cute as cute\nfrom cutlass import Float32\n"
        "from quack_edu.stages.naive import NaiveRMSNorm\n"
        "from quack_edu.config import NaiveConfig\n"
        "from quack_edu.runtime import compile_kernel",
        "@cute.jit\ndef half(v: Float32) -> Float32:\n    return v * Float32(0.5)\n\n"
        "class Mine(NaiveRMSNorm):\n    def rstd(self, sum_sq, eps):\n"
        "        return half(cute.math.rsqrt(sum_sq / self.N + eps))",
        "fn = compile_kernel(Mine(torch.float32, 300, NaiveConfig()))\nprint('compiled')",
    )
    run = run_notebook(path)
    assert run.ok, [c.error for c in run.failures]
    assert run.cells[2].stdout.strip() == "compiled"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["01_naive"])
def test_a_solution_notebook_runs_without_jupyter(name, monkeypatch):
    # `python -m quack_edu.lessons.nbexec` on a whole lesson. Lesson 04 (@cute.jit defined in a
    # cell) runs cell by cell through the same exec_cell in test_grading_cli's
    # test_grade_without_jupyter (the grader's child Python, the H200's path), every cell clean
    from quack_edu.grading.notebook import solutions_dir

    path = solutions_dir() / f"{name}.ipynb"
    monkeypatch.chdir(path.parent)
    run = run_notebook(path, timeout=300)
    assert run.ok, "\n".join(c.error for c in run.failures)


def test_a_cell_that_kills_its_process_keeps_no_old_output(tmp_path):
    # the engine clears a cell's outputs before running it: a child that dies writes none
    path = _nb(tmp_path, "import os\nos._exit(3)", "", "print('fresh')")
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "stale\n"}]
    path.write_text(json.dumps(nb))
    run = run_notebook(path)
    assert [c.stdout for c in run.cells] == ["", "", "fresh\n"]
    assert not run.cells[0].ok and "exited with 3" in run.cells[0].error
