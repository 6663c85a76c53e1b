# Two entry points for a fresh machine (see README.md):
#   make demo   — set up .venv and estimate the built-in example
#   make test   — set up .venv and run the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.nnmem-installed

.PHONY: setup demo test accuracy speed lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: a CPU build of 2.13.0 is what this project is tested with; an unpinned
	# torch would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[torch,keras,jax,tensorflow,dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
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
