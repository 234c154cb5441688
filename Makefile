# Multi-Head Attention, Derived. The README's two commands:
#   make book   creates .venv, installs everything (pinned), builds the HTML book into _build/html
#   make test   same environment; runs the whole test suite (unit tests, every notebook, the book build, a browser check)
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
# Tiny Shakespeare: tests and CI read the shared copy beside the checkout when there is one.
ifneq ($(wildcard ../shared/data/tinyshakespeare/input.txt),)
export MHA_DATA_DIR ?= $(abspath ../shared/data)
endif
# NumPy's OpenBLAS threads fight torch's on a small machine (QR/SVD ran 10-20x slower under load): one is enough.
export OPENBLAS_NUM_THREADS ?= 1
PYTEST_ARGS ?=
JOBS ?= 2

.PHONY: install book book-all test test-fast bench smoke clean help

help:
	@echo "make book      build the HTML book into _build/html (creates .venv and installs everything first)"
	@echo "make test      run every test: unit tests, notebooks (nbval), book build with -W, browser check"
	@echo "make test-fast unit tests only"
	@echo "make smoke     run the smoke sweep (experiments/smoke.yaml)"
	@echo "make bench     run the benchmarks and write experiments/benchmarks/<device>.json"
	@echo "make book-all  rebuild every page (after a _config.yml change)"

$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run make PYTHON=/path/to/python3.11"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e ".[dev]"
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

install: $(VENV)/.installed node_modules/.installed

book: install
	$(BIN)/jupyter-book build . -W -n --keep-going

book-all: install
	$(BIN)/jupyter-book build . --all -W -n --keep-going

# The test workers run side by side (-n $(JOBS)), so each keeps to one torch thread.
test: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests book experiments --nbval-lax -n $(JOBS) --dist loadfile $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest tests -m "not book" -n $(JOBS) $(PYTEST_ARGS)

smoke: install
	$(BIN)/python -m mha.sweep experiments/smoke.yaml --out _build/smoke

bench: install
	$(BIN)/python -m mha.bench

clean:
	rm -rf _build
