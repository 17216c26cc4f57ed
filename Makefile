# Two commands set up a fresh machine:  `make run` (the self-play pipeline) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: setup run test lint bench

setup: $(VENV)/.installed

# torch goes in first as the local CPU wheel; a bare `torch` pulls several GB of CUDA packages.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[dev,diplomacy,gguf,textarena]"
	touch $@

run: setup
	$(VENV)/bin/sparring run

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -n 2 --dist loadfile

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
