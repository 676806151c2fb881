# specgate — every target bootstraps what it needs on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck unit system-deps bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

## demo: two emulated engines sharing one device timeline + the gateway on :8000
demo: $(STAMP)
	$(BIN)/specgate demo

## bench: policy benchmark through real sockets (emulated pair + gateway per policy and QPS, ~10 min)
bench: $(STAMP)
	$(BIN)/specgate bench --out loadtests/results/bench --update-readme README.md

## system-deps: Prometheus and nginx from Debian packages (real parts used by the tests)
system-deps:
	bash scripts/install-system-deps.sh

lint: $(STAMP)
	$(BIN)/ruff check gateway tests loadtests
	$(BIN)/ruff format --check gateway tests loadtests

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider

## test: the whole suite — lint, strict types, tests (what CI runs)
test: $(STAMP) system-deps lint typecheck unit

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
