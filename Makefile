# specsweep: `make` sets everything up and runs the default profile; `make test` runs the tests.
# Every experiment is a profile, params.<name>.yaml, that `dvc repro` runs (docs/pipeline.md, "Profiles").
# A GPU user installs a CUDA build of torch 2.13 into .venv first (README, "On a GPU"); setup keeps it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: all setup profile publish docs check-docs test test-all lint constraints

# The default profile (params.yaml: toy pairs, offline, CPU) in this folder: data, models, runs, Optuna, reports/.
all: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro $(if $(FORCE),--force)

setup: $(VENV)/.installed

# `make profile PROFILE=name`: params.<name>.yaml in a workspace of its own, $(WORKSPACES)/<name>/, a DVC repository
# (no git) holding copies of dvc.yaml, the profile (as its params.yaml) and sweeps/, with its own data, models,
# results and reports. The data stages read the test fixtures in $(SPECSWEEP_FIXTURES) when they are there. FORCE=1
# runs every stage again (stages depend on data, models and settings, not on specsweep's code).
PROFILE ?= default
WORKSPACES ?= workspaces
SPECSWEEP_FIXTURES ?= ../shared/fixtures
WORKSPACE = $(WORKSPACES)/$(PROFILE)

profile: setup
	@test -f params.$(PROFILE).yaml || { echo "make: no params.$(PROFILE).yaml: name a profile (ls params.*.yaml) \
	or write one (specsweep init)" >&2; exit 2; }
	mkdir -p $(WORKSPACE)/sweeps
	cp dvc.yaml .dvcignore $(WORKSPACE)/
	cp params.$(PROFILE).yaml $(WORKSPACE)/params.yaml
	cp sweeps/*.yaml $(WORKSPACE)/sweeps/
	test -d $(WORKSPACE)/.dvc || (cd $(WORKSPACE) && $(abspath $(BIN))/dvc init --no-scm --quiet && \
		$(abspath $(BIN))/dvc config cache.type reflink,hardlink,copy)
	cd $(WORKSPACE) && SPECSWEEP_FIXTURES="$(abspath $(SPECSWEEP_FIXTURES))" PATH="$(abspath $(BIN)):$$PATH" \
		$(abspath $(BIN))/dvc repro $(if $(FORCE),--force)
	@echo "make: the report is $(WORKSPACE)/reports/report.md (and report.html)"

# `make publish PROFILE=name` copies what the profile's `dvc repro` wrote into results/published/<name>/summary.json
# (small, committed); `make docs` rewrites every generated block of README.md and docs/*.md from committed results;
# `make check-docs` changes nothing and fails with a diff where a block differs. KEEP=1 keeps published records
# whose runs the workspace lacks.
publish: setup
	$(BIN)/python -m pipeline.analysis.publish --profile $(PROFILE) --workspaces $(WORKSPACES) $(if $(KEEP),--keep)

docs: setup
	$(BIN)/python -m pipeline.analysis.docs

check-docs: setup
	$(BIN)/python -m pipeline.analysis.docs --check

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# An existing torch (a CUDA build the user installed first) is kept; otherwise torch 2.13's CPU wheel.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "torch==2.13.*"
	$(BIN)/python -m pip install -c constraints.txt -e ".[dev]"
	touch $@

# The suite in parallel processes (pytest-xdist): one per core, at most 4, a test file's tests in one process.
# `make test` leaves out the tests marked slow (end to end: `dvc repro`, several processes, compilers; budget 10 min);
# `make test-all` runs every test, as CI does. PYTEST_WORKERS=0 runs either in this process.
PYTEST_WORKERS ?= auto
PYTEST = $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadfile

test: setup
	$(PYTEST) -m "not slow"

test-all: setup
	$(PYTEST)

lint: setup
	$(BIN)/ruff check .

constraints: setup
	$(BIN)/python -m pip freeze --exclude-editable | sed 's/^torch==\([0-9.]*\)+.*/torch==\1/' > constraints.new
	@echo "review constraints.new, then move it over constraints.txt (keep the header)"
