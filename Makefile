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

# The whole suite in two passes (tests/conftest.py says why): everything but the `serial` tests on
# six workers, then the `serial` tests, which measure wall-clock timing, alone. Most tests wait on
# sockets, child processes and schedules (the first pass uses about a third of a core per worker),
# so six keep two cores busy. Tests are handed out one at a time, long ones first, so no long test
# waits behind another (idle, two cores: first pass 3:25, was 4:15 with worksteal; whole suite 5:32).
TEST_WORKERS ?= 6
test: install-test
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist load --maxschedchunk 1 -m "not serial"
	$(BIN)/python -m pytest -q -m serial

lint: install-test
	$(BIN)/python -m pip install -q ruff==0.17.6 mypy  # ruff pinned: its format style changes between releases
	$(BIN)/ruff check replayproxy tests benchmarks
	$(BIN)/ruff format --check replayproxy tests benchmarks
	$(BIN)/mypy replayproxy

clean:
	rm -rf $(VENV) build *.egg-info
