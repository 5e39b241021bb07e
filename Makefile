# The Quickstart: `make demo` and `make test` on a fresh machine with Python 3.11+ and make.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install -q -e .

install-test: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'

demo: install
	$(BIN)/replayproxy demo --keep demo-output

test: install-test
	$(BIN)/python -m pytest -q

lint: install-test
	$(BIN)/python -m pip install -q ruff mypy
	$(BIN)/ruff check replayproxy tests benchmarks
	$(BIN)/mypy replayproxy

clean:
	rm -rf $(VENV) build *.egg-info
