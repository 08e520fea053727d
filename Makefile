# The two commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-stop test lint bench install

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
	  || { echo "PostgreSQL binaries missing: installing Debian's postgresql"; \
	       (apt-get update -qq && apt-get install -y -qq postgresql >/dev/null) \
	       || { echo "could not install PostgreSQL; install it or set DATABASE_URL"; exit 1; }; }
	@command -v openssl >/dev/null 2>&1 \
	  || { echo "openssl missing (the TLS tests make certificates): installing Debian's"; \
	       (apt-get update -qq && apt-get install -y -qq openssl >/dev/null) \
	       || { echo "could not install openssl"; exit 1; }; }
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
	  || command -v google-chrome >/dev/null 2>&1 \
	  || { echo "Chromium missing (the live table page is tested in it): installing Debian's"; \
	       (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
	       || { echo "could not install chromium"; exit 1; }; }
	$(BIN)/txstream prepare \
	  || echo "no class archive: every Spark start loads its classes from jars (slower, works)"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/txstream demo

demo-stop: $(STAMP)
	$(BIN)/txstream demo --stop

# Two pytest workers (pytest-xdist), each with its own PostgreSQL, broker and SparkSession: most
# of the suite waits on subprocesses and brokers, so two overlap and finish sooner than one
# process; three took longer than two: the service and cluster tests then slow each other down
# (the measurements: docs/benchmarks.md, "History"). How long the suite takes is said in one
# place, the README's "Tests". TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
# Every JVM the tests start (their SparkSessions, the services' drivers, the standalone clusters'
# masters, workers and executors) compiles with C1 only: they live for seconds to minutes, and on
# two cores C2's compiler threads took CPU from their work (test_recovery alone: 108 s against
# 134 s). Production keeps the JVM's default tiers, whose C2 code a long-running service needs.
TEST_JAVA_OPTIONS ?= -XX:TieredStopAtLevel=1

test: $(STAMP)
	$(BIN)/ruff check .
	JAVA_TOOL_OPTIONS="$(TEST_JAVA_OPTIONS) $$JAVA_TOOL_OPTIONS" \
	  $(BIN)/python -m pytest --numprocesses $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/engine.py
