# specsweep: `make` sets everything up and runs the main job; `make test` runs the tests.
# A GPU user installs a CUDA build of torch 2.13 into .venv first (see README); setup keeps it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: all setup test lint bench constraints real real-setup publish docs check-docs

# The main job: the default DVC pipeline (offline, CPU): toy data and pairs, runs, Optuna, report.
all: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro

setup: $(VENV)/.installed

# The real profile (params.real.yaml; docs/pipeline.md, "Profiles"): real models on real data, offline on a CPU, in
# a workspace of its own, $(REAL)/: a DVC repository (no git) holding copies of dvc.yaml, params.real.yaml (as its
# params.yaml) and the profile's search space, with its own data, models, results and reports. The data stages read
# the test fixtures in $(SPECSWEEP_FIXTURES) (relative to this folder) when they are there, else the Hub. The time it
# takes: README.
REAL ?= real
SPECSWEEP_FIXTURES ?= ../shared/fixtures

real: real-setup
	@if [ -d "$(SPECSWEEP_FIXTURES)" ]; then echo "make real: data from the fixtures in $(SPECSWEEP_FIXTURES)"; \
	else echo "make real: no fixtures in $(SPECSWEEP_FIXTURES): data from the Hugging Face Hub"; fi
	cd $(REAL) && SPECSWEEP_FIXTURES="$(abspath $(SPECSWEEP_FIXTURES))" PATH="$(abspath $(BIN)):$$PATH" \
		$(abspath $(BIN))/dvc repro
	@echo "make real: the report is $(REAL)/reports/report.md (and report.html); what the profile does not run yet is its first section"

# The workspace only (no stage runs): `cd $(REAL) && dvc status` then lists the profile's stages.
real-setup: setup
	mkdir -p $(REAL)/sweeps
	cp dvc.yaml .dvcignore $(REAL)/
	cp params.real.yaml $(REAL)/params.yaml
	cp sweeps/optuna_space.real.yaml $(REAL)/sweeps/
	test -d $(REAL)/.dvc || (cd $(REAL) && $(abspath $(BIN))/dvc init --no-scm --quiet)

# Published results and the figures generated from them (docs/README.md, "Generated figures"). `make publish` copies
# what a profile's `dvc repro` wrote (PROFILE=default: results/runs after `make`; PROFILE=real: real/results/runs after
# `make real`) into results/published/$(PROFILE)/summary.json, small and committed; `make docs` rewrites every
# generated block of README.md and docs/*.md from the committed results; `make check-docs` changes nothing and fails
# (with a diff) when a block differs from what `make docs` would write.
PROFILE ?= default

publish: setup
	$(BIN)/python -m pipeline.analysis.publish --profile $(PROFILE)

docs: setup
	$(BIN)/python -m pipeline.analysis.docs

check-docs: setup
	$(BIN)/python -m pipeline.analysis.docs --check

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# An existing torch (e.g. a CUDA build the user installed first) is kept; otherwise torch 2.13, which
	# resolves to the CPU wheel on a machine set up for it.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "torch==2.13.*"
	$(BIN)/python -m pip install -c constraints.txt -e ".[dev]"
	touch $@

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .

constraints: setup
	$(BIN)/python -m pip freeze --exclude-editable | sed 's/^torch==\([0-9.]*\)+.*/torch==\1/' > constraints.new
	@echo "review constraints.new, then move it over constraints.txt (keep the header)"
