# dflash-infra: one entry point for setting up, testing and rehearsing the deploy.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
SETUP_INPUTS := pyproject.toml constraints.txt Makefile
# The project's own Python (the CLI and library, Ansible's plugins and modules, the lab, tools and tests), byte-compiled
# by `make setup` beside the venv's: where PYTHONDONTWRITEBYTECODE is set (CI's machines set it) Python writes no
# bytecode, so each process would compile every module it imports from source (ansible-playbook, each forked task
# worker loading a plugin, each pytest worker): 0.9 s of 2.0 s for an `ansible -m ping`, and a third of the unit tier.
PY_SOURCES := dflash_infra action_plugins callback_plugins filter_plugins library module_utils lab tools tests
export PATH := $(abspath $(BIN)):$(PATH)
export ANSIBLE_CONFIG := $(abspath ansible.cfg)
PLAYBOOKS := deploy_dflash.yml $(wildcard playbooks/*.yml)
# What mypy checks strictly (pyproject.toml [tool.mypy]); library/ and module_utils/ once they exist.
TYPED := $(wildcard dflash_infra library module_utils action_plugins callback_plugins filter_plugins)
PYTEST_ARGS ?= --durations=25
# The slow tiers report a failure short (the failing line and its message first, not the test's whole source) and
# list the failures with their messages at the end: a long journey's message then stays in what a log's reader sees.
REPORT := --tb=short -rfE
# The unit tier: no lab, no SGLang parser venv, no engine stand-in wheel, no promtool; it runs first and stops at a
# failure.
UNIT := -m "not lab and not sglang_parser and not smg_parser and not standin and not promtool"

.PHONY: help setup lock locks wheelhouse lab-standin sglang-env sglang-flags lint syntax test test-unit plan bench-plan bench-sync bench-deploy bench-serve device-check lab-wheels lab-up lab-1-up lab-down lab-status demo clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

$(STAMP): $(SETUP_INPUTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt uv
	$(BIN)/uv pip install -q --python $(BIN)/python -c constraints.txt --compile-bytecode --upgrade pip setuptools wheel \
	  -e '.[test]'
	@touch $@

setup: $(STAMP) ## project venv (.venv) with ansible, molecule, linters and the dflash-infra CLI
	@$(BIN)/python -m compileall -q $(PY_SOURCES) > /dev/null
	@echo "setup: $(VENV) is ready (ansible-core $$($(BIN)/python -c "import ansible.release as r; print(r.__version__)"))"

lock: ## re-pin constraints.txt from a fresh resolution of pyproject.toml
	rm -rf .cache/lock-venv && $(PYTHON) -m venv .cache/lock-venv
	.cache/lock-venv/bin/pip install -q '.[test]'
	{ echo '# Exact versions CI and `make setup` install (pip install -c constraints.txt). Regenerate with `make lock`.'; \
	  .cache/lock-venv/bin/pip freeze --exclude-editable | grep -v '^dflash-infra'; } > constraints.txt

sglang-env: setup ## cached venv with the real SGLang argument parsers (.cache/sglang-parser)
	nice -n 10 bash tools/sglang_parser_env.sh

sglang-flags: sglang-env ## re-extract the SGLang flag tables from the real wheels
	$(BIN)/python tools/extract_sglang_flags.py

lint: setup ## ruff, mypy --strict, yamllint, ansible-lint (production profile), syntax-check of every playbook
	$(BIN)/ruff check .
	$(BIN)/mypy $(TYPED)
	$(BIN)/yamllint -s .
	$(BIN)/ansible-lint --offline -q
	$(MAKE) --no-print-directory syntax

syntax: setup
	@$(BIN)/ansible-playbook --syntax-check -i inventory/production $(PLAYBOOKS) >/dev/null
	@echo "syntax-check: $(words $(PLAYBOOKS)) playbooks OK"

test-unit: setup ## fast tests, first and failing fast: planner, parsers, modules, filters, wiring (no lab, no SGLang env)
	$(BIN)/pytest -x -n 2 $(UNIT) --durations=10

# The labs (rootfs and machines: mostly disk) are built in the background while the unit tier runs; a failing
# unit tier stops the build at once. Then the lab tier runs in two streams on two labs of this machine (lab 0 and
# lab 1, LAB_INSTANCE; each its own loopback addresses and state folder, one base rootfs): lab 1 takes the gateway
# journeys (with the on-demand ct201 joining ct200's endpoint) and the Proxmox journeys, lab 0 the rest: the demo
# (first, on the fresh lab), the deploy tests (on the gateway topology, the longest file), the molecule scenarios,
# the pct path and the lab builder's own. Balanced on a fresh clone's --durations (lab 0 575 s, lab 1 677 s with
# the engine's service scenario, 63 s, on lab 1; it moved to lab 0).
# Beside them run lint, then the SGLang parser venv's build (mostly downloads, at a lower CPU priority: no lab test
# needs it), then the tests that need no lab (the real parsers, the engine stand-in and the real gateway on this
# machine's loopback; not niced: the gateway's control-plane tests wait on real processes and flaked at nice 10).
BUILD_LOG := .cache/test-build.log
BESIDE_LOG := .cache/test-beside-lab.log
LAB_TIER := -m lab
LAB_1_LOG := .cache/test-lab-1.log
LAB_1_TESTS := tests/lab/test_gateway_lab.py tests/lab/test_proxmox_lab.py
# Lab 0 runs what lab 1 does not: its files ignored, its single tests (node ids) deselected.
LAB_0_ARGS := $(foreach t,$(LAB_1_TESTS),'--$(if $(findstring ::,$t),deselect,ignore)=$t')
LAB_1_ENV := LAB_INSTANCE=1 LAB_STATE_DIR=$(abspath .cache/lab-1)
BESIDE_TIER := -m "(sglang_parser or smg_parser or standin or promtool) and not lab"

test: setup ## everything CI runs: the unit tier first (with the slow set-up behind it), lint, real-parser and lab tests
	@mkdir -p .cache
	@setsid $(MAKE) --no-print-directory lab-1-up > $(BUILD_LOG) 2>&1 & build=$$!; \
	  if ! $(MAKE) --no-print-directory test-unit; then kill -- -$$build 2>/dev/null; wait || true; exit 1; fi; \
	  rc=0; wait $$build || rc=$$?; cat $(BUILD_LOG); exit $$rc
	@{ $(MAKE) --no-print-directory lint && $(MAKE) --no-print-directory sglang-env \
	    && $(BIN)/pytest -p no:cacheprovider $(BESIDE_TIER) $(REPORT) $(PYTEST_ARGS); } \
	  > $(BESIDE_LOG) 2>&1 & beside=$$!; \
	  $(LAB_1_ENV) $(BIN)/pytest -p no:cacheprovider --basetemp=.cache/pytest-lab-1 $(LAB_TIER) $(foreach t,$(LAB_1_TESTS),'$t') \
	    $(REPORT) $(PYTEST_ARGS) > $(LAB_1_LOG) 2>&1 & lab1=$$!; \
	  rc=0; $(BIN)/pytest $(LAB_TIER) $(LAB_0_ARGS) $(REPORT) $(PYTEST_ARGS) || rc=$$?; \
	  wait $$lab1 || rc=$$?; echo "== the lab tests on lab 1 ($(LAB_1_LOG))"; cat $(LAB_1_LOG); \
	  wait $$beside || rc=$$?; echo "== lint and the tests beside the lab ($(BESIDE_LOG))"; cat $(BESIDE_LOG); exit $$rc

plan: setup ## print the plans of the example requests (examples/*.yml)
	@for req in examples/*.yml; do echo "== $$req"; $(BIN)/dflash-infra plan "$$req" --format table || true; done

bench-plan: setup ## how long planning one host takes (in process, CLI, Ansible play)
	$(BIN)/python tools/bench_plan.py

bench-deploy: lab-up ## deploy on a fresh lab vs no-op re-run vs a bare fact-gathering play, and --check
	$(BIN)/python tools/bench_deploy.py

bench-serve: lab-up ## through the gateway vs straight to one replica (Locust), and failed requests of a rolling redeploy
	$(BIN)/python tools/bench_serve.py

device-check: ## on a GPU host: raw captures, read-only probe/preflight/plan, memory overheads (tests/device/run.sh)
	tests/device/run.sh $(OUT_DIR)

bench-sync: setup ## model sync vs raw rsync, no-op re-sync, resume after a kill (lab; GB-sized fixtures)
	$(BIN)/python tools/bench_sync.py

lab-standin: setup
	PYTHON=$(abspath $(BIN)/python) lab/engine/build_wheel.sh

lab-wheels: lab-standin ## the lab's wheels: the engine stand-in (built), the gateway's (downloaded), checked against their locks
	$(BIN)/python tools/make_locks.py wheelhouse --inventory lab --dest .cache/lab/gateway-wheels
	$(BIN)/python tools/make_locks.py lock --check --inventory lab

locks: lab-standin ## re-resolve the venvs' hash-locked requirement files (locks/) whose pin, platform or wheel changed
	$(BIN)/python tools/make_locks.py lock

# The locked wheels for containers without PyPI (docs/serving.md): INVENTORY's locks, or LOCKS="locks/a.txt ...".
INVENTORY ?= production
WHEELHOUSE ?= .cache/wheelhouse
wheelhouse: setup ## download the locked wheels of INVENTORY's containers (or of LOCKS) into WHEELHOUSE, hashes required
	$(BIN)/python tools/make_locks.py wheelhouse --dest $(WHEELHOUSE) $(if $(LOCKS),$(LOCKS),--inventory $(INVENTORY))

lab-up: setup lab-wheels ## boot the lab containers (ct200, ct129) on loopback addresses
	$(BIN)/python lab/labctl.py up

lab-1-up: lab-up ## a second lab beside the first (lab 1: 127.1.x.1, .cache/lab-1), for make test's second stream
	$(LAB_1_ENV) $(BIN)/python lab/labctl.py up

lab-down: ## stop and remove the lab containers, lab 1's too (keeps the cached rootfs)
	$(PYTHON) lab/labctl.py down
	test ! -d .cache/lab-1 || $(LAB_1_ENV) $(PYTHON) lab/labctl.py down

lab-status: ## state of the lab containers
	$(PYTHON) lab/labctl.py status

demo: lab-up ## rehearse the production deploy against the lab
	$(BIN)/ansible-playbook deploy_dflash.yml -i inventory/lab -l pro6000

clean: ## remove the venv and caches (the lab must be down)
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache
