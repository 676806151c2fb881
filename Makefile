# specgate — every target bootstraps what it needs on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
LAB_STAMP := $(VENV)/.lab-stamp
DEV_STAMP := $(VENV)/.dev-stamp
# uv, where it is on PATH, builds the demo's environment (a few times faster than pip from
# a cold cache); `make demo UV=` uses pip even then (uv reads no pip configuration).
UV ?= $(shell command -v uv 2>/dev/null)
PIP_FLAGS := --progress-bar off --disable-pip-version-check

.PHONY: demo test lint typecheck unit system-deps bench loadtest clean
.DELETE_ON_ERROR:

# The venv gets the newest pip and setuptools (the local builds' floor) straight from the
# pip beside $(PY), unbytecompiled: faster than venv's own bootstrap (ensurepip bytecompiles
# an older pip, then both are upgraded). Without a usable pip there, ensurepip it is.
$(BIN)/python:
ifneq ($(UV),)
	$(UV) venv --seed --python $(PY) $(VENV)
else
	$(PY) -m venv --without-pip $(VENV)
	$(PY) -m pip --python $(BIN)/python install $(PIP_FLAGS) --no-compile --upgrade pip 'setuptools>=77' \
	  || { echo "no usable pip beside $(PY): bootstrapping the venv's own"; \
	       $(BIN)/python -m ensurepip --default-pip \
	       && $(BIN)/python -m pip install $(PIP_FLAGS) --no-compile --upgrade pip 'setuptools>=77'; }
endif

# The runtime (aiohttp, pydantic, prometheus-client, OpenTelemetry) and the lab tools beside
# it (./lab: the emulator and the demo, no dependency of their own): what `demo` needs.
# With pip both are built in the venv itself (no isolated build environment per project;
# its setuptools checked against the floor first: a venv made by an older Makefile had 65).
$(LAB_STAMP): pyproject.toml lab/pyproject.toml | $(BIN)/python
	@echo "installing specgate (the runtime) and specgate-lab (the tools) into $(VENV) ..."
ifneq ($(UV),)
	$(UV) pip install --python $(BIN)/python -e . -e ./lab
else
	$(BIN)/python -c 'import importlib.metadata as m, sys; sys.exit(int(m.version("setuptools").split(".")[0]) < 77)' \
	  || $(BIN)/python -m pip install $(PIP_FLAGS) --no-compile --upgrade 'setuptools>=77'
	$(BIN)/python -m pip install $(PIP_FLAGS) --no-build-isolation -e . -e ./lab
endif
	touch $@

# Everything the suite needs on top (lint, types, tests, Locust, plots): `test` and friends.
$(DEV_STAMP): pyproject.toml lab/pyproject.toml | $(BIN)/python
	@echo "installing specgate with its development tools into $(VENV) (a minute or two) ..."
	$(BIN)/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(BIN)/python -m pip install $(PIP_FLAGS) -e '.[dev]' -e './lab[plots]'
	touch $@ $(LAB_STAMP)

## demo: two emulated engines sharing one device timeline + the gateway on :8000 (DEMO_ARGS=--once: exit after the samples)
DEMO_ARGS ?=
demo: $(LAB_STAMP)
	$(BIN)/specgate demo $(DEMO_ARGS)

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
