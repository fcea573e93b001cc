# One command runs the main job (`make demo`), one runs the tests (`make test`); both set themselves up.
# GPU machines: `make install CONSTRAINTS=` installs without the CPU torch pin (bring your own torch first).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS ?= constraints-cpu.txt
PIP := $(BIN)/python -m pip
PIP_C := $(if $(CONSTRAINTS),-c $(CONSTRAINTS),)
STAMP := $(VENV)/.installed
DATA_ROOT ?= data

.PHONY: install demo test test-all lint clean server server-stop bench

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(if $(CONSTRAINTS),$(PIP) install -q $(PIP_C) torch,)
	DS_BUILD_OPS=0 $(PIP) install -q --no-build-isolation $(PIP_C) "deepspeed>=0.16"
	$(PIP) install -q $(PIP_C) -e ".[dev]"
	$(BIN)/python -m ragen_core.native_ops  # DeepSpeed's CPU comm op, compiled once here, not in the first run
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/ragen train --config configs/bandit.yaml --data-root $(DATA_ROOT)

# Two workers, whole files each (a module's shared runs stay in one process), the files that use the session's
# `ragen server` all in one worker (tests/conftest.py: one server instead of one per worker): the tests wait on
# processes and servers often enough that a second worker fills the gaps on two cores. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) tests

# A local Prefect server on 127.0.0.1:$(PORT), the local-process pool, prefect.yaml deployed, and a worker.
PORT ?= 4200
server: $(STAMP)
	$(BIN)/ragen server start --port $(PORT)

server-stop:
	$(BIN)/ragen server stop

# Benchmarks side by side (benchmarks/RESULTS.md, benchmarks/results.json); installs the `bench` extra (TRL) once.
# BENCH_ARGS=--quick for a smoke run; on a GPU machine BENCH_ARGS="--device cuda".
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(PIP) install -q $(PIP_C) -e ".[bench]"
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check ragen_core schemas tasks flows tests

clean:
	rm -rf $(VENV) .pytest_cache
