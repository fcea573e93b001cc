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

.PHONY: install demo test test-all lint clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(if $(CONSTRAINTS),$(PIP) install -q $(PIP_C) torch,)
	DS_BUILD_OPS=0 $(PIP) install -q --no-build-isolation $(PIP_C) "deepspeed>=0.16"
	$(PIP) install -q $(PIP_C) -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/ragen train --config configs/bandit.yaml --data-root $(DATA_ROOT)

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

lint: $(STAMP)
	$(BIN)/ruff check ragen_core schemas tasks flows tests

clean:
	rm -rf $(VENV) .pytest_cache
