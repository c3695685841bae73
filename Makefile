# Each target sets itself up: a fresh machine needs only Python 3.10+.
comma  := ,
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
EXTRAS ?= test,bench,docs
# pytest workers of `make test` (pytest-xdist): CI's machine has 2 cores; `make test JOBS=1`
# runs the suite in one process
JOBS   ?= 2
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: test demo bench docs lint typecheck boundscheck venv clean test-cuda bench-cuda

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml constraints.txt | $(VENV)/bin/python
	$(PIP) install --upgrade pip
	$(PIP) install -c constraints.txt -e ".$(if $(EXTRAS),[$(EXTRAS)])"
	touch $@

venv: $(STAMP)

lint: venv
	$(PY) -m ruff check rbdata tests datasets docs
	$(PY) -m ruff format --check rbdata tests datasets docs

typecheck: venv
	$(PY) -m mypy

# The numba kernels once more with numba's bounds checking on: an index a kernel could use out
# of bounds raises IndexError here instead of reading or writing past a buffer. The on-disk
# kernel cache ignores the flag, so this run compiles into a cache directory of its own.
KERNEL_TESTS := \
	tests/samplers/test_sumtree.py \
	tests/samplers/test_prioritized.py \
	tests/samplers/test_slice.py \
	tests/samplers/test_sequence.py \
	tests/samplers/test_prioritized_slice.py \
	tests/samplers/test_prioritized_checks.py \
	tests/samplers/test_samplers_bounds.py \
	tests/storages/arrow/test_arrow.py \
	tests/storages/memmap/test_memmap_packed.py \
	tests/storages/test_add_fast.py \
	tests/storages/frames/test_frames.py \
	tests/transforms/test_episode_index.py \
	tests/transforms/test_hindsight.py \
	tests/transforms/test_nstep.py \
	tests/mixed/test_mixed_rows.py

boundscheck: venv
	NUMBA_BOUNDSCHECK=1 NUMBA_CACHE_DIR=$(VENV)/numba-boundscheck $(PY) -m pytest -q -p no:cacheprovider $(KERNEL_TESTS)

test: lint typecheck
	$(PY) -m pytest $(if $(filter-out 1,$(JOBS)),-n $(JOBS))
	$(MAKE) --no-print-directory boundscheck

# The demo needs rbdata's own dependencies only (no test, bench or docs extras): a fresh
# checkout installs just those; a venv already set up for anything else serves as it is.
demo:
	@ls $(VENV)/.installed-* >/dev/null 2>&1 || $(MAKE) --no-print-directory EXTRAS= venv
	$(PY) -m rbdata demo

bench: venv
	$(PY) tests/benchmarks/bench_foundation.py
	$(PY) tests/benchmarks/bench_samplers.py
	$(PY) tests/benchmarks/bench_her.py
	$(PY) tests/benchmarks/bench_nstep.py
	$(PY) tests/benchmarks/bench_arrow.py
	$(PY) tests/benchmarks/bench_checkpoint.py
	$(PY) tests/benchmarks/bench_datasets.py
	$(PY) tests/benchmarks/bench_distributed.py
	$(PY) tests/benchmarks/bench_nodes.py
	$(PY) tests/benchmarks/bench_online.py
	$(PY) tests/benchmarks/bench_compat.py
	$(PY) tests/benchmarks/bench_mixed.py
	$(PY) tests/benchmarks/bench_codecs.py
	$(PY) tests/benchmarks/bench_pixels.py

# On a machine with a GPU: the tests marked cuda (skipped elsewhere), then the GPU benchmark
# (tests/benchmarks/README.md). Without CUDA both run and report that nothing needed a GPU.
test-cuda: venv
	$(PY) -m pytest -m cuda -rs

bench-cuda: venv
	$(PY) tests/benchmarks/bench_cuda.py

docs: venv
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf $(VENV) docs/_build .mypy_cache .ruff_cache .pytest_cache
