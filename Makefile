# specsweep: `make` sets everything up and runs the main job; `make test` runs the tests.
# A GPU user installs a CUDA build of torch 2.13 into .venv first (see README); setup keeps it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: all setup test lint bench constraints

# The main job: the default DVC pipeline (offline, CPU): toy data and pairs, runs, Optuna, report.
all: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro

setup: $(VENV)/.installed

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
