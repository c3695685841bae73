# Each target sets itself up: a fresh machine needs only Python 3.10+.
comma  := ,
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
EXTRAS ?= test,bench,docs
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: test demo bench docs lint typecheck venv clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml constraints.txt | $(VENV)/bin/python
	$(PIP) install --upgrade pip
	$(PIP) install -c constraints.txt -e ".[$(EXTRAS)]"
	touch $@

venv: $(STAMP)

lint: venv
	$(PY) -m ruff check rbdata tests datasets docs
	$(PY) -m ruff format --check rbdata tests datasets docs

typecheck: venv
	$(PY) -m mypy

test: lint typecheck
	$(PY) -m pytest

demo: venv
	$(PY) -m rbdata demo

bench: venv
	$(PY) tests/benchmarks/bench_foundation.py
	$(PY) tests/benchmarks/bench_samplers.py
	$(PY) tests/benchmarks/bench_arrow.py
	$(PY) tests/benchmarks/bench_checkpoint.py
	$(PY) tests/benchmarks/bench_datasets.py

docs: venv
	$(PY) -m sphinx -W -b html docs docs/_build/html

clean:
	rm -rf $(VENV) docs/_build .mypy_cache .ruff_cache .pytest_cache
