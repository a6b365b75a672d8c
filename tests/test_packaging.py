"""pyproject.toml and environment.yml describe the same environment; the CLI entry point exists."""

import tomllib

import yaml
from conftest import ROOT
from packaging.requirements import Requirement


def _reqs(lines):
    out = {}
    for line in lines:
        r = Requirement(line)
        out[r.name.lower()] = str(r.specifier)
    return out


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = _reqs(project["dependencies"] + project["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = _reqs([p for p in pip_section if not p.startswith("-e")])
    assert listed == wanted
    assert "-e ." in pip_section


def test_console_script_and_makefile_targets():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["quack-edu"] == "quack_edu.tools.cli:main"
    make = (ROOT / "Makefile").read_text()
    for target in ("lab:", "test:", "student:"):
        assert target in make
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()
