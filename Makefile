# Parley: `make demo` runs the seed scenario end to end; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-unit test-integration test-e2e lint chaos chaos-smoke bench bench-smoke clean

$(STAMP): pyproject.toml
	@command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install redis-server"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The seed scenario: a private redis-server unless PARLEY_REDIS_URL is set. It asks you at a
# prompt; ARGS=--yes or ARGS=--no answers for you (without a terminal it approves).
demo: $(STAMP)
	$(BIN)/parley demo $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

test-integration: $(STAMP)
	$(BIN)/python -m pytest -q tests/integration

test-e2e: $(STAMP)
	$(BIN)/python -m pytest -q tests/e2e

# 200 seed sessions while dispatchers and workers are killed and Redis restarted (a few minutes).
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos.run_chaos --sessions 200 --spread 60

# The bounded version CI runs (under a minute).
chaos-smoke: $(STAMP)
	$(BIN)/python -m tests.chaos.run_chaos --sessions 40 --spread 25 --timeout 120

# The benchmark (bench/README.md): five scenarios on real processes, a table, and
# bench/results/latest.json. Default sizes finish within 10 minutes on 2 cores; ARGS=--help.
bench: $(STAMP)
	$(BIN)/pip install -q -e '.[dev,bench]'
	$(BIN)/python -m bench.run $(ARGS)

# Every scenario at tiny sizes (under a minute; asserts nothing about speed).
bench-smoke: $(STAMP)
	$(BIN)/pip install -q -e '.[dev,bench]'
	$(BIN)/python -m bench.run --smoke $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
