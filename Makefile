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

.PHONY: install demo test lint bench bench-recipe clean-demo

install: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "SparkNet needs Python 3.10 or newer")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing requirements into $(VENV) (about 2 minutes the first time)"
	@$(PY) -m pip install -q -r requirements-dev.txt 2>&1 | $(QUIET_PIP)
	@$(PY) -m pip install -q --no-deps -e . 2>&1 | $(QUIET_PIP)
	@$(PY) -c 'import sparknet, torch, transformers, datasets, tokenizers'
	@touch $(STAMP)

demo: $(STAMP)
	$(OFFLINE) $(PY) scripts/demo.py $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m ruff check .
	$(OFFLINE) $(PY) -m pytest

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
