# Two commands do all the set-up: `make demo` and `make test`.
# Each creates or reuses .venv and installs the pinned dependencies itself.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -qq
STAMP  := $(VENV)/.stamp-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
SRC    := $(wildcard shardloader tests benchmarks examples)

.PHONY: test demo bench docs lint format clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(PIP) install -c constraints.txt -e '.[test]'
	rm -f $(VENV)/.stamp-* && touch $@

lint: $(STAMP)
	$(BIN)/ruff check $(SRC)
	$(BIN)/ruff format --check $(SRC)

test: lint
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/python -m shardloader demo

bench: $(STAMP)
	$(PIP) install -c constraints.txt -e '.[bench]'
	$(BIN)/python -m benchmarks.run

# The docs site: mkdocs with the Material theme and mkdocstrings, built into site/.
# --strict turns every warning (a broken link, a page missing from the nav, a docstring
# mkdocstrings cannot parse) into a failure.
docs: $(STAMP)
	$(PIP) install -c constraints.txt -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

format: $(STAMP)
	$(BIN)/ruff format $(SRC)
	$(BIN)/ruff check --fix $(SRC)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache site
