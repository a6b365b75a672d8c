import os
import sys
from pathlib import Path

import pytest

import quack_edu  # noqa: F401  (decides the mode and the DSL target before cutlass loads)
from quack_edu._env import MODE


def pytest_collection_modifyitems(config, items):
    if MODE.gpu:
        return
    skip = pytest.mark.skip(reason=f"needs a Hopper GPU: compile-only mode ({MODE.reason})")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def subprocess_env():
    """Environment for a child Python that must import this checkout's quack_edu."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}


@pytest.fixture
def without_jupyter(monkeypatch):
    """Grade as on the H200 device machine: no Jupyter kernel, no nbformat."""
    from quack_edu.grading import executor, nblite

    monkeypatch.setattr(executor, "nbformat", nblite)


@pytest.fixture(autouse=True)
def _dsl_dump_dir(tmp_path, monkeypatch):
    # The DSL writes artifacts into the current directory (its CUTE_DSL_DUMP_DIR is read once, at
    # import, so setting it here would do nothing); keep parallel tests from clobbering each
    # other's files by running each in its own directory.
    monkeypatch.chdir(tmp_path)
