# The commands the README shows. `make lab` opens the lessons; `make test` runs the CPU test suite.
# Both create .venv (if missing) and install the project into it first.

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
# PyTorch: 2.13.0 by default (PyPI's Linux wheel is a CUDA build; on a machine that keeps a CPU
# wheel of it on disk, that one). Pick a CUDA flavour with e.g.
#   make lab TORCH_INDEX=https://download.pytorch.org/whl/cu130
TORCH       ?= torch==2.13.0
TORCH_INDEX ?=
# CuTe DSL runtime libraries: cu12 by default; DSL_EXTRA=cu13 matches a CUDA 13 torch.
DSL_EXTRA   ?=
DSL_PKG      = "nvidia-cutlass-dsl[$(DSL_EXTRA)]>=4.8,<4.9"
PYTEST_JOBS ?= auto

.PHONY: lab venv grade clean

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e ".[dev]" $(if $(DSL_EXTRA),$(DSL_PKG))
	@touch $@

venv: $(VENV)/.installed

lab: venv
	$(VENV)/bin/quack-edu doctor || true
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# BEGIN INSTRUCTORS
# (a students' copy, quack-edu student --release, has none of these: no tests/, no solutions/)
.PHONY: test student check-notebooks lint gpu-stage

# worksteal: an idle worker takes queued tests from a busy one (the slow notebook gradings
# otherwise pile up at the end of one worker: 382 s -> 323 s on 2 cores, 2026-11-30)
# env -u PYTHONDONTWRITEBYTECODE: where a machine sets it (this project's CI does), every test
# process would compile quack_edu and pytest would rewrite every test module again (~4 s a worker)
test: venv
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -n $(PYTEST_JOBS) --dist worksteal $(PYTEST_ARGS)

student: venv
	$(VENV)/bin/quack-edu student

# fails when notebooks/ is out of date with solutions/
check-notebooks: venv
	$(VENV)/bin/quack-edu student --check

lint: venv
	$(PY) -m ruff check quack_edu tests scripts
	$(PY) -m ruff format --check quack_edu tests scripts

# Stage the CuTe DSL (+ QuACK and Liger to measure against) for the device machine; see docs/testing.md.
gpu-stage:
	../shared/gpu/stage --peers
# END INSTRUCTORS

# grade notebooks: make grade NB="notebooks/01_naive.ipynb" (default: every solution, or in a
# students' copy every notebook)
NB ?= $(if $(wildcard solutions),solutions/*.ipynb,notebooks/*.ipynb)
grade: venv
	$(VENV)/bin/quack-edu grade $(NB)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
