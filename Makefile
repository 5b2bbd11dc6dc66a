# LightPipe: the README's two commands are `make demo` and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin
# PYTHON=python3.12 (3.11, 3.12 or 3.13; default python3): the venv's Python. A venv made
# with another Python is refused by setup, in one line: give it its own VENV=.
STAMP := $(VENV)/.lightpipe-setup$(if $(PYTHON),-$(notdir $(PYTHON)))
SCENARIO ?= scenarios/quickstart.yaml
OUT ?= runs/demo

.PHONY: setup demo test test-fast test-stress lock lint clean-runs grafana

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock scripts/setup.sh scripts/aptlib.sh scripts/locked_installed.py \
          scripts/install_torch.py
	bash scripts/setup.sh $(VENV)
	touch $(STAMP)

# The headline in seconds (simulated: spectrum policies on the default scenario, pipeline
# schedules across DCs), then the next commands: the emulated check, the VM.
demo: setup
	$(BIN)/lightpipe demo $(SCENARIO) --out $(OUT) --force

# The full suite (what CI runs): the root tests that time packets one at a time, beside
# the rest on TEST_JOBS pytest-xdist workers at nice 10 (scripts/test.sh).
TEST_JOBS ?= 2
test: setup
	VENV=$(VENV) TEST_JOBS=$(TEST_JOBS) bash scripts/test.sh

# While developing: every test that needs neither root, a network namespace nor a VM.
test-fast: setup
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest tests -m "not root and not vm and not slow" \
	  -n 3 -q

# Hunt flaky tests: the root, emulation and controller tests 5 times in a row with one
# core kept busy; every failure listed with its test and cause (runs/stress/stress.md).
test-stress: setup
	$(BIN)/python scripts/stress.py --rounds 5 --busy 1

# Move the lock (requirements.lock) to the newest releases pyproject.toml allows, then run
# the suite against them. Commit requirements.lock only when it passes.
lock:
	bash scripts/lock.sh

lint: setup
	$(BIN)/ruff check testbed controllers workloads tests bench grafana scripts

# Regenerate grafana/dashboards/*.json from grafana/lightpipe_dashboards.py.
grafana: setup
	$(BIN)/lightpipe grafana build

clean-runs:
	rm -rf runs
