# Every set-up step lives here: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
# Pinned here (not in setup.cfg): an unpinned torch pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
PILLOW_SIMD_SPEC ?= pillow-simd==12.1.1.post0
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.dsc-installed
BENCH_STAMP := $(VENV)/.dsc-bench-installed
# Test processes (pytest-xdist); TEST_WORKERS=0 runs the suite in this one process.
TEST_WORKERS ?= 2
# Azure Blob on loopback for the tests (tests/object_servers.py): Azurite, from npm, under build/node.
AZURITE_SPEC ?= azurite@3
AZURITE := build/node/node_modules/.bin/azurite-blob

.PHONY: install demo test bench install-simd clean azurite

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(VENV)/bin/python setup.cfg pyproject.toml
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet -e ".[test]"
	touch $(STAMP)

# `make bench` also installs the bench extra (s3fs, for the remote benchmark's library comparison).
$(BENCH_STAMP): $(STAMP)
	$(PIP) install --quiet -e ".[test,bench]"
	touch $(BENCH_STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m dsc.demo --out build/demo

test: $(STAMP) azurite
	$(PY) -m pytest -q -n $(TEST_WORKERS) tests

# Without npm (or with the install failing) the Azure tests skip, saying why; the rest of the suite runs.
azurite:
	@test -x $(AZURITE) || { command -v npm >/dev/null 2>&1 \
		&& npm install --prefix build/node --no-audit --no-fund --loglevel=error "$(AZURITE_SPEC)" \
		|| echo "Azurite not installed (npm missing or failed): the az:// tests will skip"; }

bench: $(BENCH_STAMP)
	$(PY) benchmarks/run.py

# Replace Pillow with an AVX2 build of pillow-simd (compiled here, ~20 s; needs libjpeg and zlib headers).
# Run it after `make install`: any later install of a package that depends on Pillow brings Pillow back.
install-simd: $(STAMP)
	dpkg -s libjpeg62-turbo-dev zlib1g-dev >/dev/null 2>&1 || \
		(apt-get update -qq && apt-get install -y -qq libjpeg62-turbo-dev zlib1g-dev)
	$(PIP) uninstall -y -q pillow pillow-simd
	CC="cc -mavx2" $(PIP) install --quiet --no-cache-dir "$(PILLOW_SIMD_SPEC)"
	$(PY) -m dsc.cli info --env | grep -E "pil_|libjpeg"

clean:
	rm -rf build .pytest_cache
