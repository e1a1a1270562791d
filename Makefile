# Every target creates .venv from pyproject.toml itself; nothing depends on a hand install.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# What each target installs (pyproject extras): `run` only what serving needs, `bench` adds the bench
# extras; `test` installs both extras (STAMP): the suite also tests the bench code and its plots. The installer is
# uv (from PyPI, into the venv): on this 2-core machine a fresh `make run` spent 23 s creating a venv
# with pip and 78 s in `pip install -e .`; a venv without pip, then uv, takes about 30 s in all. The
# venv has no pip of its own: `.venv/bin/uv pip install ...` adds packages to it.
UV := $(VENV)/bin/uv
INSTALL := $(UV) pip install --quiet --python $(PY)
STAMP_RUN := $(VENV)/.installed-run
STAMP_TEST := $(VENV)/.installed-test
STAMP_BENCH := $(VENV)/.installed-bench
STAMP := $(VENV)/.installed

.PHONY: run test bench soak specs verify verify-full clean help system-tools

help:
	@echo "make run      install and start the service (simulated NPU, bundled tiny model)"
	@echo "make test     install and run the whole default test suite"
	@echo "make specs    regenerate specs/ from the machine declarations"
	@echo "make verify   run the z3 proofs (fast profile); verify-full for the full depth"
	@echo "make bench    run the benchmarks (figures, not pass/fail)"
	@echo "make soak     deep fuzzing, the slow tests, and a 24 h virtual-time soak with faults"

$(STAMP_RUN): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python >= 3.11) on PATH"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv --without-pip $(VENV)
	@# uv comes from $(PYTHON)'s pip; a $(PYTHON) without pip (e.g. an activated venv made by uv) bootstraps
	@# the bundled pip into .venv (ensurepip, offline) and installs uv with that
	@test -x $(UV) || { echo "installing uv into $(VENV)"; if $(PYTHON) -m pip --version >/dev/null 2>&1; then \
		$(PYTHON) -m pip --python $(PY) install --quiet --disable-pip-version-check 'uv>=0.4,<1'; \
	else $(PY) -m ensurepip >/dev/null && $(PY) -m pip install --quiet --disable-pip-version-check 'uv>=0.4,<1'; fi; }
	$(INSTALL) -e .
	touch $(STAMP_RUN)

$(STAMP_TEST): $(STAMP_RUN)
	$(INSTALL) -e '.[test]'
	touch $(STAMP_TEST)

$(STAMP_BENCH): $(STAMP_RUN)
	$(INSTALL) -e '.[bench]'
	touch $(STAMP_BENCH)

$(STAMP): $(STAMP_TEST) $(STAMP_BENCH)
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

run: $(STAMP_RUN)
	$(PY) -m calculet.run

# Two workers on CI's two cores (pytest-xdist); the slow tier runs in `make soak`.
# --dist loadgroup: the fleet tests (one HAProxy + 3 boards, tests/fleet) stay on one worker.
test: $(STAMP) system-tools
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -q -n auto --dist loadgroup -m "not slow"

specs: $(STAMP)
	$(PY) -m calculet.specgen

verify: $(STAMP)
	$(PY) -m calculet.verify --fast

verify-full: $(STAMP)
	$(PY) -m calculet.verify

bench: $(STAMP_BENCH) system-tools
	@for script in bench/*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

soak: $(STAMP)
	HYPOTHESIS_PROFILE=deep $(PY) -m pytest -q -n auto -m "slow or not slow" tests/property
	$(PY) -m pytest -q -n auto -m slow tests
	$(PY) -m calculet.bench soak --hours 24

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
