# trainstack: `make run` trains (any machine), `make test` runs the suite, `make up` brings up the GPU stack.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml requirements.lock requirements-dev.lock | cksum | cut -d' ' -f1)
ARGS ?=

.PHONY: setup run test system-deps lint bench doctor help

help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP):
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.lock -r requirements-dev.lock
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP) ## create .venv and install trainstack with its pinned dependencies

run: setup ## train the default model on every GPU (2 CPU ranks without one); ARGS="--max-steps 500" to override
	$(BIN)/trainstack train $(ARGS)

test: setup ## the whole test suite (no GPU needed)
	$(BIN)/python -m pytest $(ARGS)

system-deps: ## Debian packages the tests use for real (prometheus/promtool, docker, debootstrap, chromium); needs root
	@bash scripts/system-deps.sh

lint: setup ## ruff
	$(BIN)/ruff check .
