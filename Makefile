# `make demo` and `make test` create .venv when missing and (re)install into it only when the requirements change.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sparknet-installed
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
# Tests and the demo never reach the Hugging Face Hub.
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# pip's warnings about this machine's optional local package indexes are noise.
QUIET_PIP := { grep -v "is ignored: it is neither a file nor a directory" || true; }
# The lock's install takes minutes: pip's own lines show it moving (one per package it fetches, then what it
# installs), less the ones for packages already there.
PIP_PROGRESS := { grep --line-buffered -v -e "is ignored: it is neither a file nor a directory" -e "^Requirement already satisfied" || true; }

.PHONY: install demo test test-all coverage lock docs lint bench bench-recipe clean-demo

install: $(STAMP)

# The exact versions of requirements.lock (requirements*.txt hold the ranges; `make lock` refreshes the lock).
$(STAMP): requirements.lock pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "SparkNet needs Python 3.11 or newer")'
	@test -x $(PY) || { echo "[1/4] creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "[2/4] installing requirements.lock into $(VENV) (about 2 minutes the first time; pip's lines follow)"
	@$(PY) -m pip install --progress-bar off -r requirements.lock 2>&1 | $(PIP_PROGRESS)
	@echo "[3/4] installing sparknet itself (editable)"
	@$(PY) -m pip install -q --no-deps -e . 2>&1 | $(QUIET_PIP)
	@echo "[4/4] checking $(VENV) against requirements.lock"
	@$(PY) tools/lock.py check
	@touch $(STAMP)
	@echo "installed: $(VENV) (next: make demo, or make test)"

demo: $(STAMP)
	$(OFFLINE) $(PY) scripts/demo.py $(DEMO_ARGS)

# The tests run on TEST_WORKERS processes (pytest-xdist: a module's tests and its fixtures stay on one worker), each
# with one compute thread: the tests' tiny models gain nothing from more, and 3 workers x 2 threads on 2 cores thrash
# (measured when the full tier took 13 minutes this way: 19 with 2 workers of 2 threads, 21+ on one process).
TEST_WORKERS ?= 3
PYTEST := $(OFFLINE) OMP_NUM_THREADS=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# the fast tier (3-5 minutes on 2 cores, by CPU kind: README's Tests): every test not marked slow
test: $(STAMP)
	$(PY) -m ruff check .
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

# everything, the end-to-end scenarios too (torchrun, kill -9, Hub faults, a full disk, the demo); the slowest 25 listed
test-all: $(STAMP)
	$(PY) -m ruff check .
	$(PYTEST) --durations=25 $(PYTEST_ARGS)

# line coverage of sparknet/ by each tier (the scripts and processes the tests start included): the README's figures
coverage: $(STAMP)
	rm -rf .coverage-data && mkdir .coverage-data
	COVERAGE_FILE=.coverage-data/fast $(PYTEST) -q -m "not slow" --cov --cov-report= $(PYTEST_ARGS)
	COVERAGE_FILE=.coverage-data/all $(PYTEST) -q --cov --cov-report= $(PYTEST_ARGS)
	@for tier in fast all; do printf '%s: %s%% of sparknet/\n' $$tier \
		"$$($(PY) -m coverage report --data-file=.coverage-data/$$tier --format=total --precision=1)"; done

# requirements.lock anew from a fresh install of the ranges in requirements*.txt, then the tests on it
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install -q -r requirements-dev.txt 2>&1 | $(QUIET_PIP)
	.venv-lock/bin/pip freeze --exclude-editable | .venv-lock/bin/python tools/lock.py write > requirements.lock.new
	mv requirements.lock.new requirements.lock && rm -rf .venv-lock
	$(MAKE) test

# docs/constants.md from the scripts' constants and their comments (tests/test_docs.py fails when it is stale)
docs: $(STAMP)
	$(OFFLINE) $(PY) tools/constants_doc.py write

lint: $(STAMP)
	$(PY) -m ruff check .

# every benchmark, the recipe bench in its short mode (the full table: make bench-recipe, about 20 minutes)
bench: $(STAMP)
	@for b in bench/[!_]*.py; do echo "== $$b"; $(OFFLINE) $(PY) $$b $$( [ $$b = bench/recipe.py ] && echo --short true ) || exit 1; done

bench-recipe: $(STAMP)
	$(OFFLINE) $(PY) bench/recipe.py

clean-demo:
	rm -rf data/demo tokenizer-demo datasets/demo datasets/.demo.building checkpoints/demo logs/demo eval/demo eval/suite \
		exports/demo
