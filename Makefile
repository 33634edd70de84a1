# Parley: `make demo` runs the seed scenario end to end; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Python caches compiled modules in __pycache__/ unless PYTHONDONTWRITEBYTECODE is set, as it
# is on some CI images: then every process compiles each module it imports from source again,
# and each pytest process rewrites and compiles all 130 test modules (12 CPU-s a process here).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: restate-server install system-packages screenshots demo test test-unit test-integration test-e2e lint chaos chaos-smoke chaos-shards chaos-shards-smoke fleet fleet-smoke bench bench-smoke clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# An editable install of the one package `parley` (parley/; its schemas, dispatcher and
	# workers are links to the top-level folders). setuptools announces every editable install
	# with an InformationOnly warning that is about no fault of ours; it is filtered by its text.
	PYTHONWARNINGS='ignore:Editable installation' $(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The seed scenario: a private redis-server unless PARLEY_REDIS_URL is set. It asks you at a
# prompt; ARGS=--yes or ARGS=--no answers for you (without a terminal it approves).
demo: $(STAMP)
	@command -v redis-server >/dev/null || { echo "redis-server is missing: sudo apt-get install -y redis-server"; exit 1; }
	$(BIN)/parley demo $(ARGS)

# Six pytest processes (pytest-xdist) on 2 cores: the tests mostly wait on the Redis servers,
# dispatchers and workers they start, and those are forked from a warm interpreter
# (tests/forkserver.py), so the CPU is no longer full. Measured on a 2-core VM: -n 3 5:16,
# -n 4 3:58, -n 6 3:11 (60 % of the two cores); -n 8 2:57 with a timing-sensitive test failing.
# `--dist loadgroup`: a module marked xdist_group (the browser tests) runs on one process, so
# its one deployment and one chromium are started once.
test: $(STAMP) system-packages
	$(BIN)/python -m pytest -q -n 6 --dist loadgroup --durations=25

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

test-integration: $(STAMP) system-packages
	$(BIN)/python -m pytest -q tests/integration

test-e2e: $(STAMP) system-packages
	$(BIN)/python -m pytest -q tests/e2e

# The Debian packages the tests need (redis-server, chromium, prometheus's promtool): installed
# when run as root with apt, else it stops at once saying the one command to run.
system-packages:
	@sh tests/debian-packages.sh

# 200 seed sessions while dispatchers and workers are killed and Redis restarted (a few minutes).
# As deployed: the shipped redis.conf and users.acl, each process and the driver under its login;
# what ran and what the driver saw is kept in fsynced files outside Redis and compared at the
# end; fails on any violation, any session whose `ver` went back across the restart, any CRITICAL
# line in Redis's log, any ACL refusal.
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos.run_chaos --sessions 200 --spread 60

# The bounded version CI runs (under a minute).
chaos-smoke: $(STAMP)
	$(BIN)/python -m tests.chaos.run_chaos --sessions 40 --spread 25 --timeout 120

# Two shards, one of them Sentinel-managed: kills, shard 0's Redis restarted, a failover of
# shard 1's primary (killed -9), and two partitions moved (`parley partitions move`, one each
# way, each in its own window, kills going on) mid-run; 0 violations (a few minutes). As
# deployed, with the same checks as `chaos`; shard 1's replicas and sentinels log in as
# parley-replica and parley-sentinel.
chaos-shards: $(STAMP)
	$(BIN)/python -m tests.chaos.run_chaos_shards --sessions 120 --spread 45

# The bounded version CI runs (under two minutes), with the same restart, failover and moves.
chaos-shards-smoke: $(STAMP)
	$(BIN)/python -m tests.chaos.run_chaos_shards --sessions 24 --spread 20 --timeout 100

# A fleet that grows while it runs (tests/chaos/run_fleet.py): 16 shards as deployed, 64
# partitions, a dispatcher and a worker per shard, the seed scenario on every session; 4 shards
# added under load and the partitions rebalanced over all 20, four moves at once; every session
# checked (applied once, on its shard only), each move's freeze time in fleet.json; then shard 0
# killed for good, and a partition moved between two others without it (a few minutes).
fleet: $(STAMP)
	$(BIN)/python -m tests.chaos.run_fleet --lose 0

# The bounded version CI runs (under a minute): 4 shards grown to 6, 16 partitions, shard 0 lost.
fleet-smoke: $(STAMP)
	$(BIN)/python -m tests.chaos.run_fleet --shards 4 --add 2 --partitions 16 --sessions 40 --timeout 120 --lose 0

# Scenario 5's Restate server (npm, pinned in bench/restate/package-lock.json). Without npm or
# the registry the row is skipped with the reason, so a failed install does not stop the run.
restate-server:
	@command -v npm >/dev/null && (cd bench/restate && npm ci --no-audit --no-fund --silent) \
	  || echo "bench: the Restate server was not installed (npm ci in bench/restate failed); its row will say so"

# The benchmark (bench/README.md): fourteen scenarios on real processes, a table, and
# bench/results/latest.json. Default sizes finish within 10 minutes on 2 cores; ARGS=--help.
bench: $(STAMP)
	PYTHONWARNINGS='ignore:Editable installation' $(BIN)/pip install -q -e '.[dev,bench]'
	@$(MAKE) -s restate-server
	$(BIN)/python -m bench.run $(ARGS)

# Every scenario at tiny sizes (under a minute; asserts nothing about speed).
bench-smoke: $(STAMP)
	PYTHONWARNINGS='ignore:Editable installation' $(BIN)/pip install -q -e '.[dev,bench]'
	@$(MAKE) -s restate-server
	$(BIN)/python -m bench.run --smoke $(ARGS)

# The inbox's pages at phone (375 px) and desk (1280 px) widths, as docs/screenshots/ holds them:
# the browser test that checks each page (no sideways scroll, axe-core) also saves it here.
screenshots: $(STAMP) system-packages
	PARLEY_SCREENSHOTS=docs/screenshots $(BIN)/python -m pytest -q -p no:cacheprovider \
	  tests/e2e/test_inbox_pages.py -k every_page_fits

# parley/ is the package whole (parley/schemas, parley/dispatcher and parley/workers link to the
# top-level folders): mypy reads it as it is installed, with no tree of its own to build.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy --config-file pyproject.toml -p parley

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache *.egg-info bench/restate/node_modules
