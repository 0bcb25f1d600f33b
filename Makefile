# Developer and CI entry points. `make test` is what .ci/run runs; it works on a fresh machine.

PYTHON ?= python3.11
PY = .venv/bin/python
# Reinstalls whenever pyproject.toml changes (new dependency, new extra).
VENV_STAMP = .venv/.installed-from-pyproject
LINT_PATHS = $(wildcard src tests bench demo)

.PHONY: .venv librdkafka tools postgres browser promtool test demo lint typecheck pytest unit integration fuzz chaos clean

.venv: $(VENV_STAMP)

$(VENV_STAMP): pyproject.toml $(wildcard src/redrive/*.c src/redrive/*/*.c src/redrive/*/*.h)
	@$(MAKE) --no-print-directory librdkafka
	test -x $(PY) || $(PYTHON) -m venv .venv
	$(PY) -m pip install -e '.[test]'
	touch $@

# librdkafka's headers, for the Spark source's C range reader (redrive.spark._rangeread).
librdkafka:
	@test -f /usr/include/librdkafka/rdkafka.h || { \
	  sudo=$$(test "$$(id -u)" -eq 0 || echo sudo); \
	  $$sudo apt-get update && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y librdkafka-dev; }

# kcat lets the integration tests check headers as a client other than confluent-kafka sees them.
tools:
	@command -v kcat >/dev/null 2>&1 || { \
	  sudo=$$(test "$$(id -u)" -eq 0 || echo sudo); \
	  $$sudo apt-get update && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y kcat; }

# A throwaway PostgreSQL server (initdb + postgres) for the retry store's tests and bench.
postgres:
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  sudo=$$(test "$$(id -u)" -eq 0 || echo sudo); \
	  $$sudo apt-get update && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql; }

# Debian's chromium, which the console's browser tests drive through Playwright (no browser is
# downloaded: Playwright is pointed at this one).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  sudo=$$(test "$$(id -u)" -eq 0 || echo sudo); \
	  $$sudo apt-get update && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }

# Debian's Prometheus, for promtool: the example alert rules are unit-tested with it.
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  sudo=$$(test "$$(id -u)" -eq 0 || echo sudo); \
	  $$sudo apt-get update && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; }

test: .venv tools postgres browser promtool lint typecheck pytest

lint: .venv
	$(PY) -m ruff check $(LINT_PATHS)

typecheck: .venv
	$(PY) -m mypy

# Three workers: two run the Spark tests in two halves, a JVM each (the Connect server's files in
# one), the third every other file meanwhile (tests/conftest.py, SparkFilesTogether). Two workers
# took 20-22 min, one of them running 15 min of Spark alone, with the CPU about a third idle
# while the broker-bound files waited on brokers; three took 14.
pytest: .venv tools postgres browser promtool
	$(PY) -m pytest -q -n 3 --dist loadfile

unit: .venv promtool
	$(PY) -m pytest -q tests/unit

integration: .venv tools postgres browser
	$(PY) -m pytest -q tests/integration

# The C readers built with AddressSanitizer and UndefinedBehaviorSanitizer: 2 x 1M fuzzed fetch
# answers, then their tests on those builds (tests/fuzz/run.py). `make test` runs a short fuzz.
fuzz: .venv tools
	PYTHONPATH=tests $(PY) -m fuzz.run

# Every fault of bench/chaos.py at full size (under 15 minutes on 2 cores): components killed,
# stopped and fed garbage, each record counted. `make test` runs a quick subset.
chaos: .venv tools postgres
	$(PY) bench/chaos.py

# The project's main job: a PySpark retry pipeline on the embedded broker (see README).
demo: .venv
	$(PY) demo/orders.py

clean:
	rm -rf build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis \
	  spark-warehouse metastore_db derby.log
	find . -path ./.venv -prune -o -name __pycache__ -type d -exec rm -rf {} +
