# Every target creates .venv from pyproject.toml itself; nothing depends on a hand install.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench soak specs verify verify-full clean help system-tools

help:
	@echo "make run      install and start the service (simulated NPU, bundled tiny model)"
	@echo "make test     install and run the whole default test suite"
	@echo "make specs    regenerate specs/ from the machine declarations"
	@echo "make verify   run the z3 proofs (fast profile); verify-full for the full depth"
	@echo "make bench    run the benchmarks (figures, not pass/fail)"
	@echo "make soak     deep fuzzing, the slow tests, and a 24 h virtual-time soak with faults"

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python >= 3.11) on PATH"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

# System parts the tests drive for real (HAProxy for the fleet, promtool for metrics and alert rules),
# installed with the system package manager when missing: CI runs as root on a fresh machine.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
system-tools:
	@missing=""; \
	command -v haproxy >/dev/null 2>&1 || missing="$$missing haproxy"; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	if [ -n "$$missing" ]; then \
		echo "installing system packages:$$missing"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

run: $(STAMP)
	$(PY) -m calculet.run

# Two workers on CI's two cores (pytest-xdist); the slow tier runs in `make soak`.
test: $(STAMP) system-tools
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -q -n auto -m "not slow"

specs: $(STAMP)
	$(PY) -m calculet.specgen

verify: $(STAMP)
	$(PY) -m calculet.verify --fast

verify-full: $(STAMP)
	$(PY) -m calculet.verify

bench: $(STAMP)
	@for script in bench/*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

soak: $(STAMP)
	HYPOTHESIS_PROFILE=deep $(PY) -m pytest -q -n auto -m "slow or not slow" tests/property
	$(PY) -m pytest -q -n auto -m slow tests
	$(PY) -m calculet.bench soak --hours 24

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
