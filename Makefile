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

.PHONY: setup setup-demo demo test accuracy speed lint clean

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

# Everything the test suite imports: Keras 3 on its three backends, and the dev tools.
$(TEST_STAMP): pyproject.toml $(DEMO_STAMP)
	$(BIN)/pip install --quiet -e '.[torch,keras,jax,tensorflow,dev]'
	touch $@

setup-demo: $(DEMO_STAMP)

setup: $(TEST_STAMP)

demo: setup-demo
	$(BIN)/nnmem estimate mlp --batch 32 --optimizer adam

# Keras fixes its backend at import: tests/frontends/keras runs once per backend, each in its own process.
test: setup
	$(BIN)/python -m pytest -q
	KERAS_BACKEND=torch $(BIN)/python -m pytest -q -p no:cacheprovider tests/frontends/keras
	KERAS_BACKEND=jax $(BIN)/python -m pytest -q -p no:cacheprovider tests/frontends/keras
	KERAS_BACKEND=tensorflow $(BIN)/python -m pytest -q -p no:cacheprovider tests/frontends/keras

accuracy: setup
	$(BIN)/python benchmarks/accuracy.py

speed: setup
	$(BIN)/python benchmarks/speed.py

lint: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy src

clean:
	rm -rf $(VENV) build dist src/*.egg-info
