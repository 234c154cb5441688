# Multi-Head Attention, Derived. The README's two commands:
#   make book   creates .venv, installs everything (the exact versions of requirements/lock-py311.txt), builds the HTML
#               book into _build/html
#   make test   same environment; runs the whole test suite (every notebook with nbval, then the unit tests, the book
#               build, reusing what nbval executed, and a browser check)
#   make lock   regenerates requirements/lock-py311.txt from pyproject.toml's ranges (keeping its pins where they
#               still fit; `make lock LOCK_ARGS=--upgrade` or `LOCK_ARGS="--upgrade-package torch"` to move them)
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
# Tiny Shakespeare: tests and CI read the shared copy beside the checkout when there is one.
ifneq ($(wildcard ../shared/data/tinyshakespeare/input.txt),)
export MHA_DATA_DIR ?= $(abspath ../shared/data)
endif
# mermaid's CLI (npm) draws the diagrams with the system's Chromium: puppeteer must never download a Chrome of its own.
export PUPPETEER_SKIP_DOWNLOAD := 1
# The Chinese edition's figures: the kernels that execute the pages draw each figure a second time with its words in
# Chinese (book/_ext/i18n_figures.py), through an IPython startup file in this IPYTHONDIR.
export IPYTHONDIR := $(abspath _build/ipython)
# NumPy's OpenBLAS threads fight torch's on a small machine (QR/SVD ran 10-20x slower under load): one is enough.
export OPENBLAS_NUM_THREADS ?= 1
PYTEST_ARGS ?=
JOBS ?= 2
# The exact versions the book is built and tested with: pyproject.toml's ranges resolved by uv for CPython 3.11 on
# x86_64 Linux. The install uses it as pip constraints (-c), so a CUDA or CPU build of the locked torch both fit.
LOCK := requirements/lock-py311.txt
UV_VERSION := 0.13.9
LOCK_ARGS ?=

.PHONY: install book book-all pdf test test-fast bench smoke gpu-run lock clean help

help:
	@echo "make book      build the HTML book into _build/html (creates .venv and installs everything first)"
	@echo "make test      run every test: unit tests, notebooks (nbval), book build with -W, browser check"
	@echo "make test-fast unit tests only"
	@echo "make smoke     run the smoke sweep (experiments/smoke.yaml)"
	@echo "make bench     run the benchmarks and write experiments/benchmarks/<device>.json"
	@echo "make gpu-run   on a CUDA machine: CUDA tests, benchmark, kernels, the GPU program's next pieces, in BUDGET s"
	@echo "make book-all  rebuild every page (after a _config.yml change)"
	@echo "make pdf       both editions as PDF into _build/pdf (needs texlive: README, The PDF editions)"
	@echo "make translations  update the Chinese catalogs after editing English prose (then translate, make book)"
	@echo "make lock      regenerate $(LOCK) (pinned versions) from pyproject.toml's ranges with uv"

$(VENV)/.installed: pyproject.toml $(LOCK)
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run make PYTHON=/path/to/python3.11"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e ".[dev]" -c $(LOCK)
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

install: $(VENV)/.installed node_modules/.installed

# The English edition (executing the chapters, cached in _build/.jupyter_cache), then the Chinese edition into
# _build/html/zh from the same executed cells and the catalogs in book/locales/zh_CN (tools/i18n.py).
book: install
	$(BIN)/python book/_ext/i18n_figures.py
	$(BIN)/python tools/i18n.py refresh-figures
	$(BIN)/jupyter-book build . -W -n --keep-going
	$(BIN)/python tools/i18n.py build

book-all: install
	$(BIN)/python book/_ext/i18n_figures.py
	$(BIN)/python tools/i18n.py refresh-figures
	$(BIN)/jupyter-book build . --all -W -n --keep-going
	$(BIN)/python tools/i18n.py build

# Both editions as PDF (tools/pdf.py), from the executed chapters make book leaves in the cache: xelatex, with xeCJK
# for Chinese. Needs Debian's texlive-xetex texlive-latex-extra texlive-lang-chinese latexmk (README).
pdf: book
	$(BIN)/python tools/pdf.py

# After editing English prose: the catalogs follow (new or edited paragraphs appear untranslated or fuzzy); translate
# them in book/locales/zh_CN/LC_MESSAGES/<page>.po, then `make book`. `python tools/i18n.py check` lists what is left.
translations: install
	$(BIN)/python tools/i18n.py extract
	$(BIN)/python tools/i18n.py update

# The test workers run side by side (-n $(JOBS)), so each keeps to one torch thread. Two passes, so that each chapter
# is executed once: first nbval runs the book's pages (every cell must run without error), and writes each page that
# passed into the build's execution cache (conftest.py); then the unit tests, the experiment templates and the book
# tests, whose build (-W) reuses those executions: MHA_NBVAL_RUN marks this run's records, and the build keeps only
# them (tests/test_book_site.py), executing itself any page nbval did not pass. Both passes always run; exit status 5
# (nothing selected, e.g. by PYTEST_ARGS=-k ...) counts as success.
test: install
	export OMP_NUM_THREADS=1 MHA_NBVAL_RUN="$$(date +%s)-$$$$"; \
	$(BIN)/python -m pytest book --nbval-lax -n $(JOBS) --dist loadfile $(PYTEST_ARGS); pages=$$?; \
	$(BIN)/python -m pytest tests experiments --nbval-lax -n $(JOBS) --dist loadfile --no-loadscope-reorder \
	    $(PYTEST_ARGS); rest=$$?; \
	for rc in $$pages $$rest; do [ $$rc -eq 0 ] || [ $$rc -eq 5 ] || { echo "make test: failed (the book's \
	notebooks: exit $$pages; the other tests: exit $$rest)"; exit 1; }; done

test-fast: install
	$(BIN)/python -m pytest tests -m "not book" -n $(JOBS) $(PYTEST_ARGS)

smoke: install
	$(BIN)/python -m mha.sweep experiments/smoke.yaml --out _build/smoke

bench: install
	$(BIN)/python -m mha.bench

# On a GPU machine, in the locked environment: the CUDA tests, the benchmark, the kernels, then the GPU program's next
# pieces (experiments/gpu/queue.yaml), every step time-boxed to BUDGET seconds in all; at most 8 files in OUT. On a
# stock GPU image no install is needed: PYTHONPATH=src python3 -m mha.experiments.gpu_run --budget 480 --out OUT
# (README, "On a GPU machine").
BUDGET ?= 480
OUT ?= _build/gpu-run
gpu-run: install
	$(BIN)/python -m mha.experiments.gpu_run --budget $(BUDGET) --out $(OUT)

# uv (pinned) in its own small venv. It keeps the lock's current pins where they still fit the ranges.
UV_COMPILE = uv pip compile pyproject.toml --extra dev --python-version 3.11.7 --python-platform x86_64-manylinux_2_28 \
    --index-url https://pypi.org/simple -o $(LOCK)
lock:
	test -x .venv-lock/bin/uv || { $(PYTHON) -m venv .venv-lock && .venv-lock/bin/python -m pip install uv==$(UV_VERSION); }
	.venv-lock/bin/$(UV_COMPILE) --quiet --custom-compile-command "make lock  # $(UV_COMPILE) (uv $(UV_VERSION))" $(LOCK_ARGS)

clean:
	rm -rf _build
