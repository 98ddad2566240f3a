# Every set-up step lives here: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
# Pinned here (not in setup.cfg): an unpinned torch pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
PILLOW_SIMD_SPEC ?= pillow-simd==12.1.1.post0
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.dsc-installed

.PHONY: install demo test bench install-simd clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(VENV)/bin/python setup.cfg pyproject.toml
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m dsc.demo --out build/demo

test: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) benchmarks/run.py

clean:
	rm -rf build .pytest_cache
