# batchscope — set-up, demo, tests, benchmarks.
#   make demo   set up, start a CPU Triton testbed, collect while driving load, print status
#   make test   set up and run every test (unit, store on SQLite and PostgreSQL, real Triton)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
# Debian packages the tests need: a C compiler for the fake NVML library, and headless
# Chromium with its WebDriver for the dashboard's browser tests.
DEB_PACKAGES := gcc libc6-dev chromium chromium-driver

.PHONY: install system-deps demo test unit integration lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[testbed,test,browser]'
	touch $(STAMP)

# Installs missing Debian packages (needs root, as on CI); a no-op when all are present.
system-deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

demo: install
	$(VENV)/bin/batchscope demo

test: install system-deps
	$(PY) -m pytest -q

unit: install system-deps
	$(PY) -m pytest -q tests/unit

integration: install
	$(PY) -m pytest -q tests/integration

lint: install
	$(VENV)/bin/ruff check .

bench: install
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
