# trainstack: `make run` trains (any machine), `make test` runs the suite (`make check` its fast tier), `make up` brings
# up the GPU stack.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml requirements.lock requirements-dev.lock | cksum | cut -d' ' -f1)
ARGS ?=

.PHONY: setup run test check system-deps lint bench doctor help up down logs ps generate k8s-generate

help:
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP):
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.lock -r requirements-dev.lock
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP) ## create .venv and install trainstack with its pinned dependencies

run: setup ## train the default model on every GPU (2 CPU ranks without one); ARGS="--max-steps 500" to override
	$(BIN)/trainstack train $(ARGS)

# The tiers live in folders (tests/unit/<package>/, tests/process/, tests/infra/, tests/timing/) and are selected
# by their marks, which tests/unit/repo/test_suite_layout.py keeps in step with the folders.
# TEST_WORKERS=3: the tests that start processes wait on them (ranks starting, an exporter answering, a checkpoint
# landing, a diagnose window, docker) as well as compute: on a 2-core machine, 2 pytest-xdist workers, a module to a
# worker, kept the cores 81% busy and 3 keep them 97% busy (docs/benchmarks.md), the longest modules first
# (tests/helpers/module_order.py). The `timing` tests, which measure speed, run after, alone (from tests/timing/
# only, unless ARGS names what to run: collecting the whole suite again costs 6 s).
# TEST_WORKERS=1 runs everything in one process. Exit 5 (no test selected) is not a failure: ARGS may select tests of
# one kind only.
TEST_WORKERS ?= 3

test: setup ## the whole test suite (no GPU needed) on 3 workers, then tests/timing/ alone; TEST_WORKERS=1: one process
ifeq ($(TEST_WORKERS),1)
	$(BIN)/python -m pytest $(ARGS)
else
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder -m "not timing" $(ARGS) || [ $$? -eq 5 ]
	$(BIN)/python -m pytest -m timing $(or $(ARGS),tests/timing) || [ $$? -eq 5 ]
endif

check: setup ## the fast tier: every test that starts no process, tests/unit/ (-m "not slow"), under 2 minutes
	$(BIN)/python -m pytest -m "not slow" $(ARGS)

system-deps: ## Debian packages the tests use for real (prometheus/promtool, docker, mmdebstrap, chromium, slurm-wlm, munge); needs root
	@bash scripts/system-deps.sh

lint: setup ## ruff (lint and format) and mypy over trainstack/, train/ and monitoring/, as tests/process/test_lint.py checks them
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python scripts/typecheck.py

doctor: setup ## preflight checks: GPUs, CUDA, /dev/shm, ulimits, NCCL switches, ports, disk
	$(BIN)/trainstack doctor $(ARGS)

bench: setup ## benchmarks that print side-by-side ratios (docs/benchmarks.md; the GPU ones are listed there)
	$(BIN)/python bench/train_overhead.py
	$(BIN)/python bench/telemetry_overhead.py
	$(BIN)/python bench/scrape_cost.py
	$(BIN)/python bench/memory_per_rank.py
	$(BIN)/python bench/rank_heap.py

up: ## GPU host with Docker: build the image, train on every GPU, Prometheus + Grafana (docs/docker.md)
	@bash scripts/compose-up.sh $(ARGS)

down: ## stop the compose stack (runs and checkpoints stay in the volume)
	@bash scripts/compose-down.sh $(ARGS)

logs: ## follow the compose stack's logs
	@bash scripts/compose-logs.sh $(ARGS)

ps: ## the compose stack's services and their health
	@bash scripts/compose-ps.sh $(ARGS)

generate: setup ## rebuild every generated file from its table: rule files, dashboards, docs tables, k8s/common/generated
	$(BIN)/python monitoring/prometheus/build_rules.py
	$(BIN)/python monitoring/grafana/build_dashboards.py
	$(BIN)/python scripts/metrics-docs.py
	$(BIN)/python scripts/k8s-monitoring.py

k8s-generate: setup ## regenerate k8s/common/generated from monitoring/ (PrometheusRules, dashboard ConfigMaps)
	$(BIN)/python scripts/k8s-monitoring.py
