# Everything runs inside .venv/ in the repo root. `make test` and `make demo` install it when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of this torch lies on our machines; an unpinned torch would pull a multi-GB CUDA build.
TORCH_VERSION := 2.13.0
PYTEST_ARGS ?= --durations=25

.PHONY: install test test-slow test-all quality style demo demo-report clean gpu-check

install: $(VENV)/.installed

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

# Fast suite: everything but the `slow` tests (`cuda` tests skip themselves without a GPU).
test: install
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: install
	$(BIN)/python -m pytest -m "slow" $(PYTEST_ARGS)

# Everything that needs CUDA (tests, fp16 runs, auto max batch, throughput): < 10 min on one H100, one table.
gpu-check: install
	$(BIN)/python -m recipes.benchmarks.gpu_check

test-all: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

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

# The demo again (into a fresh outputs/demo/), then the README's numbers from it: docs/demo_run.json and .png.
demo-report: install
	$(BIN)/python -m recipes.benchmarks.demo_report

clean:
	rm -rf outputs .pytest_cache .ruff_cache build *.egg-info
