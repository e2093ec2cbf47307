# sm120kit developer and CI entry points. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROFILE ?= core
INVENTORY ?= inventory/localhost.yml
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-k doctor"`.
PYTEST_ARGS ?=
# `make test` runs the suite in this many pytest-xdist workers, three on two cores (most slow tests wait on podman,
# Ansible, downloads or llama-server, not on a core). Each file's tests, and the files sharing a converged node or the
# SGLang releases, stay in one worker (tests/conftest.py). PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 3

.PHONY: help venv dev provision fleet wheelhouse lab llama-server lint test test-fast test-full test-gpu sglang-stack bench readmes clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

venv: $(BIN)/.installed  ## what provisioning needs: Ansible and the checker (requirements.txt)

$(BIN)/.installed: requirements.txt python/sm120check/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -r requirements.txt
	$(BIN)/pip install --disable-pip-version-check -q -e python/sm120check
	touch $@

dev: $(BIN)/.dev-installed  ## venv plus the developer tools (pytest, ruff, mypy, CPU torch: requirements-dev.txt)

$(BIN)/.dev-installed: $(BIN)/.installed requirements-dev.txt
	$(BIN)/pip install --disable-pip-version-check -q -r requirements-dev.txt
	touch $@

provision: venv  ## the main job: converge this machine (inventory/localhost.yml) in PROFILE (core, or full on a GPU box)
	$(BIN)/ansible-playbook site.yml -e sm120kit_profile=$(PROFILE)

fleet: venv  ## the doctor on every node of INVENTORY, one matrix (build/fleet/latest)
	$(BIN)/ansible-playbook -i $(INVENTORY) playbooks/doctor.yml

wheelhouse: venv  ## collect every wheel of PROFILE (core or full) into build/wheelhouse/PROFILE
	$(BIN)/ansible-playbook playbooks/wheelhouse.yml -e wheelhouse_profile=$(PROFILE)

lab:  ## install podman and build the node image for the container tests (root, idempotent)
	scripts/lab/setup

llama-server: dev  ## build llama.cpp's llama-server for the real-engine tests (cached outside the checkout)
	$(BIN)/python tests/lab/llamacpp.py build

lint: dev  ## ruff, mypy, role README tables, the GPU coverage table, no test that checks nothing (ansible-lint in the tests)
	$(BIN)/ruff check python tests benchmarks scripts roles
	$(BIN)/ruff format --check python tests benchmarks scripts roles
	$(BIN)/mypy
	$(BIN)/python scripts/role_readme.py --check
	$(BIN)/python scripts/coverage_table.py --check
	$(BIN)/python scripts/test_asserts.py

test: dev lab lint  ## every test this machine can run: unit, Ansible, container integration
	$(BIN)/pytest -m "not gpu and not full" -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

test-fast: dev  ## the fast tier: no containers, no downloads
	$(BIN)/pytest -m "not container and not slow and not gpu and not full" $(PYTEST_ARGS)

test-full: dev lab  ## converge the full profile (torch, FlashInfer, SGLang) into a container from a wheelhouse
	$(BIN)/pytest -m full $(PYTEST_ARGS)

sglang-stack:  ## build the SGLang 0.5.16 server stack the GPU machine carries (.carry/sglang-0.5.16, about 45 MiB)
	$(PYTHON) scripts/device/sglang_stack.py build

test-gpu:  ## on a GPU machine: the stack venv from .carry/sglang-0.5.16, then pytest -m gpu tests/gpu (summary in OUT/pytest-gpu.txt)
	bash scripts/device/sglang-server.sh stack gputests

bench: dev  ## benchmarks: print tables and write benchmarks/results/*.json
	$(BIN)/python benchmarks/run_all.py

readmes: dev  ## regenerate the role README variable tables from the argument specs
	$(BIN)/python scripts/role_readme.py

clean:  ## remove build outputs (keeps caches under .cache)
	rm -rf build .pytest_cache .mypy_cache .ruff_cache
