# rackplane: the two quick-start commands are `make demo` and `make test`; each sets up what it needs.
SHELL := /bin/bash
# The first interpreter that actually runs and is >= 3.11 (pyenv shims may exist but not run).
PYTHON ?= $(shell for p in python3 python3.13 python3.12 python3.11; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { echo $$p; break; }; \
	done)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.rackplane-installed
DURATION ?=
DEMO_ARGS ?=
# pytest-xdist, 2 workers, a test file on one worker (--dist loadfile): module-scoped servers (a
# NATS cluster, a secure broker) start once, and test_commands_fuzz's last test reads what its
# first two counted. (loadgroup: pytest-xdist 3.8 cannot rename pytest 9's node ids, its
# xdist_group marks are ignored.) Serial: make test PYTEST_ARGS=-n0
PYTEST_ARGS ?= -n 2 --dist loadfile
QUICK ?=
BENCH_OUT ?= bench-results
SCENARIOS_OUT ?= scenario-results

.PHONY: help venv demo test servers bench-tools lint bench scenarios clean

help:
	@echo "make demo [DURATION=s] [RACKS=n]  a row of 2 racks (RACKS=1..4) on the simulators, each its valvey and racky, under rlc when nats-server is there (installed if it can be), ~3 min"
	@echo "make test               run the whole test suite (installs Mosquitto and VictoriaMetrics if missing)"
	@echo "make lint               ruff and mypy"
	@echo "make bench [QUICK=1]    benchmark suite into bench-results/ (results.json, results.md, PNGs)"
	@echo "make scenarios [QUICK=1] scenario quality report into scenario-results/"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "rackplane needs Python >= 3.11: install it or set PYTHON=/path/to/python3.11" >&2; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -e '.[tools,test]'
	@touch $@

# nats-server for the row's rlc (the default 2 racks, RACKS=2..4), installed as make test
# does; never fatal: the row then runs without rlc and says so
demo: $(STAMP)
	@./scripts/ensure-servers --nats
	$(BIN)/rackctl demo $(if $(DURATION),--duration $(DURATION)) $(if $(RACKS),--racks $(RACKS)) $(DEMO_ARGS)

servers:
	@./scripts/ensure-servers

# the servers plus valgrind and gcc (bench.lockstep.*.instructions_per_plant_s, harness/callgrind.py)
bench-tools:
	@./scripts/ensure-servers --bench

test: $(STAMP) servers
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# Exit 1 when a figure misses its target: the results are written either way.
bench: $(STAMP) bench-tools
	$(BIN)/rackctl bench --out $(BENCH_OUT) $(if $(QUICK),--quick)

scenarios: $(STAMP)
	$(BIN)/rackctl scenarios --out $(SCENARIOS_OUT) $(if $(QUICK),--quick)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache demo-output
