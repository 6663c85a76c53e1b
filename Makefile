# Two entry points for a fresh machine (see README.md):
#   make demo   — set up .venv with PyTorch (CPU) only, and estimate the built-in example
#   make test   — set up .venv with every backend and the dev tools, and run the test suite
# Both use the same .venv: `make demo` then `make test` adds what the tests need to it.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# One stamp per install level; each is redone when pyproject.toml changes.
DEMO_STAMP := $(VENV)/.nnmem-demo
TEST_STAMP := $(VENV)/.nnmem-test

.PHONY: setup setup-demo demo test browser pictures accuracy speed lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first, pinned: a CPU build of 2.13.0 is what this project is tested with; an unpinned
# torch would pull a multi-GB CUDA build. numpy beside it: torch's CPU wheel does not require it but
# warns at import without it.
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet torch==2.13.0 numpy
	$(BIN)/pip install --quiet -e '.[torch]'
	touch $@

# Everything the test suite imports: Keras 3 on its three backends, the chart libraries, the dev tools, and
# a browser for the HTML reports' test (Debian's chromium, driven by playwright; as root or through sudo).
$(TEST_STAMP): pyproject.toml $(DEMO_STAMP)
	$(BIN)/pip install --quiet -e '.[torch,keras,jax,tensorflow,report,dev]'
	touch $@

CHROMIUM := $(shell command -v chromium || command -v chromium-browser || command -v google-chrome)

browser:
ifeq ($(CHROMIUM),)
	@echo "installing Debian's chromium for the HTML reports' browser test"
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; } \
	  || { echo "could not install chromium: install it (apt-get install chromium) or set NNMEM_CHROMIUM"; exit 1; }
endif

setup-demo: $(DEMO_STAMP)

setup: $(TEST_STAMP)

demo: setup-demo
	$(BIN)/nnmem estimate mlp --batch 32 --optimizer adam

# Keras fixes its backend at import: tests/frontends/keras runs once per backend, each in its own process.
# NNMEM_REQUIRE_BROWSER=1: the browser test fails, rather than skips, without chromium.
# -n 2: two pytest-xdist workers (the modules tests/conftest.py lists run whole on one, their shared results
# computed once) where a test's figures do not depend on what else runs (PyTorch's allocator,
# in-process or in the measuring child; TensorFlow's pinned diagnostic, one op at a time in the estimate's order,
# tests/frontends/keras/tensorflow/test_measure.py). JAX's and TensorFlow's plain steps take one of several peaks
# by how their threads meet, which load changes: those tests run one at a time.
TF_PINNED := tests/frontends/keras/tensorflow/test_measure.py
test: setup browser
	NNMEM_REQUIRE_BROWSER=1 $(BIN)/python -m pytest -q -n 2
	KERAS_BACKEND=torch $(BIN)/python -m pytest -q -n 2 -p no:cacheprovider tests/frontends/keras
	KERAS_BACKEND=jax $(BIN)/python -m pytest -q -p no:cacheprovider tests/frontends/keras
	KERAS_BACKEND=tensorflow $(BIN)/python -m pytest -q -n 2 -p no:cacheprovider $(TF_PINNED)
	KERAS_BACKEND=tensorflow $(BIN)/python -m pytest -q -p no:cacheprovider --ignore=$(TF_PINNED) tests/frontends/keras

# README's pictures: each chart, drawn by the command line from the built-in examples.
pictures: setup
	$(BIN)/nnmem estimate gpt --batch 8 --optimizer adam --png docs/img/estimate-gpt > /dev/null
	$(BIN)/nnmem measure mlp --batch 32 --optimizer adam --png docs/img/measure-mlp > /dev/null
	$(BIN)/nnmem fit mlp --budget 64MiB --optimizer adam --png docs/img/fit-mlp > /dev/null
	$(BIN)/nnmem explain mlp --budget 64MiB --optimizer adam --png docs/img/explain-mlp > /dev/null
	$(BIN)/nnmem whatif gpt --batch 8 --optimizer adam --budget 64MiB --png docs/img/whatif-gpt > /dev/null

accuracy: setup
	$(BIN)/python benchmarks/accuracy.py

speed: setup
	$(BIN)/python benchmarks/speed.py

lint: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy src

clean:
	rm -rf $(VENV) build dist src/*.egg-info
