# Everything runs inside .venv/ in the repo root. `make test` and `make demo` install it when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of this torch lies on our machines; an unpinned torch would pull a multi-GB CUDA build.
TORCH_VERSION := 2.13.0
PYTEST_ARGS ?= --durations=25
# `make test` and `make test-versions` run one pytest process per core (pytest-xdist, at most 4), each test file whole
# in one of them (a file's module fixtures and its network namespaces stay in one process). Most of the suite is
# launches: on 2 cores two processes took 1006, 1154 and 1101 s (the last on a fresh clone, CI=true) where one took
# 1418 and 1432 s (fresh clones); both cores are then busy (vmstat: 0-2 % idle), so more processes would not help.
# Files go longest first (tests/file_seconds.json): 576 s on a fresh clone where the commit before took 609 s the same day.
# XDIST= runs everything in one process.
XDIST ?= -n auto --maxprocesses=4 --dist loadfile
# transformers and accelerate (adloco_hf/common/versions.py holds all three sets): `make install` installs the
# reference releases (the built-in corpus `builtin:python-source` is their source), `make test-versions` the oldest
# and the newest supported. Override to try another: make test-versions HIGHEST="transformers==5.25.0 accelerate==1.16.0"
VERSIONS := adloco_hf/common/versions.py
REFERENCE = $(shell $(PYTHON) $(VERSIONS) reference)
LOWEST ?= $(shell $(PYTHON) $(VERSIONS) lowest)
HIGHEST ?= $(shell $(PYTHON) $(VERSIONS) highest)
# The core tests run against both: the Trainer's overrides, the config's checks, the Hub, real multi-process launches
# and the README's commands, the version check itself (about 2 min each on 2 cores).
VERSION_TESTS := tests/reporting/test_hub.py tests/trainer tests/config tests/worker/test_multiprocess.py \
	tests/docs/test_readme.py tests/common/test_versions.py

.PHONY: install test test-slow test-all test-versions quality style demo demo-report clean gpu-check gpu-bench

install: $(VENV)/.installed

$(VENV)/.installed: setup.py $(VERSIONS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install -q -e ".[dev]" $(REFERENCE)
	touch $@

# Fast suite: everything but the `slow` tests (`cuda` tests skip themselves without a GPU).
test: install
	$(BIN)/python -m pytest -m "not slow" $(XDIST) $(PYTEST_ARGS)

test-slow: install
	$(BIN)/python -m pytest -m "slow" $(PYTEST_ARGS)

# Everything that needs CUDA (tests, fp16 runs, auto max batch, throughput): < 10 min on one H100, one table.
gpu-check: install
	$(BIN)/python -m recipes.benchmarks.gpu_check

# How fast AdLoCo trains on the GPU (throughput and MFU, compiled growing batches, 4 workers against 1, communication,
# time to target against DiLoCo): resumable steps of <= 9 minutes into docs/results/gpu/<device>-<date>/, whose
# tables it writes into docs/gpu.md. A later run finishes what an earlier one left
# (GPU_BENCH_ARGS="--max_minutes 8.5").
gpu-bench: install
	$(BIN)/python -m recipes.benchmarks.gpu_bench $(GPU_BENCH_ARGS)

test-all: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The core tests against the oldest and the newest supported transformers and accelerate, each in its own venv
# (.venv-lowest/, .venv-highest/; rebuilt when setup.py or the versions change). Needs the package index.
test-versions: .venv-lowest/.installed .venv-highest/.installed
	.venv-lowest/bin/python -m pytest -m "not slow" $(VERSION_TESTS) $(XDIST) $(PYTEST_ARGS)
	.venv-highest/bin/python -m pytest -m "not slow" $(VERSION_TESTS) $(XDIST) $(PYTEST_ARGS)

.venv-lowest/.installed: PINS = $(LOWEST)
.venv-highest/.installed: PINS = $(HIGHEST)
.venv-lowest/.installed .venv-highest/.installed: setup.py $(VERSIONS)
	rm -rf $(@D)
	$(PYTHON) -m venv $(@D)
	@for pin in $(PINS); do \
		$(@D)/bin/python -m pip index versions --timeout 20 --retries 1 "$${pin%%==*}" 2>/dev/null \
			| grep -qE "(: |, )$${pin#*==}(,|$$)" || { \
			echo "make test-versions: $$pin is not on the package index (unreachable, or without that release)." \
			"It installs the oldest and newest supported releases ($(PINS)), so it needs the index:" \
			"check the network or PIP_INDEX_URL, or run make test alone." >&2; exit 1; }; \
	done
	$(@D)/bin/python -m pip install -q --upgrade pip
	$(@D)/bin/python -m pip install -q torch==$(TORCH_VERSION)
	$(@D)/bin/python -m pip install -q -e ".[dev]" $(PINS)
	touch $@

quality: install
	$(BIN)/ruff check adloco_hf recipes tests
	$(BIN)/ruff format --check adloco_hf recipes tests

style: install
	$(BIN)/ruff check --fix adloco_hf recipes tests
	$(BIN)/ruff format adloco_hf recipes tests

# The main job on the built-in offline corpus: 4 CPU workers, 4 instances that merge. Writes outputs/demo/.
demo: install
	$(BIN)/accelerate launch --config_file accelerate_configs/cpu_4_workers.yaml \
		recipes/pretrain_c4.py --config recipes/configs/demo.yaml

# The demo again (into a fresh outputs/demo/), then the README's numbers from it: docs/results/demo_run.json and .png.
demo-report: install
	$(BIN)/python -m recipes.benchmarks.demo_report

clean:
	rm -rf outputs .pytest_cache .ruff_cache build *.egg-info .venv-lowest .venv-highest
