# specgate — every target bootstraps what it needs on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME_STAMP := $(VENV)/.runtime-stamp
DEV_STAMP := $(VENV)/.dev-stamp

.PHONY: demo test lint typecheck unit system-deps bench loadtest clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# The runtime alone (aiohttp, pydantic, prometheus-client, OpenTelemetry): what `demo` needs.
$(RUNTIME_STAMP): pyproject.toml | $(BIN)/python
	@echo "installing specgate's runtime dependencies into $(VENV) ..."
	$(BIN)/python -m pip install --progress-bar off -e .
	touch $@

# Everything the suite needs on top (lint, types, tests, Locust, plots): `test` and friends.
$(DEV_STAMP): pyproject.toml | $(BIN)/python
	@echo "installing specgate with its development tools into $(VENV) (a minute or two) ..."
	$(BIN)/python -m pip install --progress-bar off --upgrade pip
	$(BIN)/python -m pip install --progress-bar off -e '.[dev]'
	touch $@ $(RUNTIME_STAMP)

## demo: two emulated engines sharing one device timeline + the gateway on :8000
demo: $(RUNTIME_STAMP)
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
	$(BIN)/ruff check gateway tests loadtests
	$(BIN)/ruff format --check gateway tests loadtests

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

unit: $(DEV_STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider

## test: the whole suite — lint, strict types, tests (what CI runs)
test: $(DEV_STAMP) system-deps lint typecheck unit

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
