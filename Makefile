# One entry point for people and CI. `make install` builds .venv from scratch (CPU torch pinned).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export PYTHONPATH := $(CURDIR)

.PHONY: install demo test test-fast lint typecheck layers bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[trainer,dev]"

demo: install
	$(BIN)/python -m trainer run trainer/specs/demo.yaml --out runs/demo

test: install
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check trainer service worker tests bench
	$(BIN)/ruff format --check trainer service worker tests bench

typecheck: install
	$(BIN)/mypy

layers: install
	$(BIN)/lint-imports

bench: install
	$(BIN)/python bench/bench_kernels.py
	$(BIN)/python bench/bench_stare_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
