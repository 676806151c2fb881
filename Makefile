# specgate — every target bootstraps what it needs on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
LAB_STAMP := $(VENV)/.lab-stamp
DEV_STAMP := $(VENV)/.dev-stamp

.PHONY: demo test lint typecheck unit system-deps bench loadtest clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# The runtime (aiohttp, pydantic, prometheus-client, OpenTelemetry) and the lab tools beside
# it (./lab: the emulator and the demo, no dependency of their own): what `demo` needs.
# Both are built in the venv itself (its setuptools brought up to the build's floor first):
# one build environment instead of an isolated one per project, a few seconds less.
$(LAB_STAMP): pyproject.toml lab/pyproject.toml | $(BIN)/python
	@echo "installing specgate (the runtime) and specgate-lab (the tools) into $(VENV) ..."
	$(BIN)/python -m pip install --progress-bar off 'setuptools>=77'
	$(BIN)/python -m pip install --progress-bar off --no-build-isolation -e . -e ./lab
	touch $@

# Everything the suite needs on top (lint, types, tests, Locust, plots): `test` and friends.
$(DEV_STAMP): pyproject.toml lab/pyproject.toml | $(BIN)/python
	@echo "installing specgate with its development tools into $(VENV) (a minute or two) ..."
	$(BIN)/python -m pip install --progress-bar off --upgrade pip
	$(BIN)/python -m pip install --progress-bar off -e '.[dev]' -e './lab[plots]'
	touch $@ $(LAB_STAMP)

## demo: two emulated engines sharing one device timeline + the gateway on :8000
demo: $(LAB_STAMP)
	$(BIN)/specgate demo

## bench: policy benchmark through real sockets (emulated pair + gateway per policy and QPS, ~10 min)
bench: $(DEV_STAMP)
	$(BIN)/specgate bench --out loadtests/results/bench --update-readme docs/routing-results.md

## loadtest: Locust at QPS (200) req/s of short streamed answers through the gateway on emulated engines for DURATION (60) s; TTFT, ITL, TPOT distributions and failures in out/loadtest/summary.md
QPS ?= 200
DURATION ?= 60
loadtest: $(DEV_STAMP)
	$(BIN)/python loadtests/locust_rate.py --qps $(QPS) --duration $(DURATION) --out out/loadtest

## system-deps: Prometheus, nginx, Redis, buildah and mmdebstrap from Debian packages (real parts used by the tests)
system-deps:
	bash scripts/install-system-deps.sh

lint: $(DEV_STAMP)
	$(BIN)/ruff check gateway lab tests loadtests
	$(BIN)/ruff format --check gateway lab tests loadtests

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

unit: $(DEV_STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider

## test: the whole suite — lint, strict types, tests (what CI runs)
test: $(DEV_STAMP) system-deps lint typecheck unit

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
