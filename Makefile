# LightPipe: the README's two commands are `make demo` and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.lightpipe-setup
SCENARIO ?= scenarios/quickstart.yaml
OUT ?= runs/quickstart

.PHONY: setup demo test lint clean-runs grafana

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $(STAMP)

demo: setup
	$(BIN)/lightpipe run $(SCENARIO) --out $(OUT) --force

test: setup
	$(BIN)/python -m pytest tests

lint: setup
	$(BIN)/ruff check testbed controllers workloads tests bench grafana

# Regenerate grafana/dashboards/*.json from grafana/lightpipe_dashboards.py.
grafana: setup
	$(BIN)/lightpipe grafana build

clean-runs:
	rm -rf runs
