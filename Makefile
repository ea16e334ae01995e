# `make test` and `make demo` do their own set-up on a fresh machine:
# a .venv, torch's CPU build where no torch is importable, then the package in editable mode.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fp8rl-installed
TORCH_PIN ?= torch==2.13.0

.PHONY: setup test test-all lint demo demo-quick clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "$(TORCH_PIN)"
	$(BIN)/python -m pip install -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts

demo: $(STAMP)
	$(BIN)/fp8rl demo --out runs/demo

demo-quick: $(STAMP)
	$(BIN)/fp8rl demo --quick --out runs/demo-quick

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache runs
