# Two commands do all the set-up: `make demo` and `make test`.
# Each creates or reuses .venv and installs the pinned dependencies itself, each with its own
# stamp, and only what it needs: `make demo` the `vision` extra, `make test-smoke` the
# `test-core` extra (pytest, OpenCV, ...), `make test` the `test` extra (test-core, gluoncv,
# gluon-nlp, ...), `make docs` the `docs` extra, `make bench` the `bench` extra. Every install
# shows pip's progress (a line per package, a bar per download).
#   make test-smoke  a few end-to-end checks of the default MXNet 1.9.1 setup
#                    (tests/test_smoke.py): under 30 s once the venv is built; the first time,
#                    1-3 minutes more to install test-core (about 500 MB)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# pip's own log (a line per package, and a progress bar for each download): a first install
# shows what it is doing instead of sitting silent.
PIP    := $(BIN)/python -m pip --disable-pip-version-check
INSTALL := $(PIP) install --progress-bar on
SUM    := $(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
STAMP  := $(VENV)/.stamp-$(SUM)
CORE_STAMP  := $(VENV)/.core-stamp-$(SUM)
DEMO_STAMP  := $(VENV)/.demo-stamp-$(SUM)
BENCH_STAMP := $(VENV)/.bench-stamp-$(SUM)
DOCS_STAMP  := $(VENV)/.docs-stamp-$(SUM)
SRC    := $(wildcard shardloader tests benchmarks examples)

# MXNet 2.0 (2.0.0b1) beside the default 1.9.1: its own venv, pinned by constraints-mx2.txt
# (constraints.txt with only the mxnet line changed), with the `test-core` extra: gluoncv and
# gluon-nlp, in `test`, do not import under mxnet 2.
#   make test-mx2        the whole suite under 2.0.0b1, no ruff (ARGS=... passes pytest options,
#                        e.g. ARGS=tests/test_loader.py); about 11 minutes on 2 cores
#   make test-mx2-smoke  what CI runs: the tests marked @pytest.mark.mx2_smoke (those of
#                        tests/test_mx2_smoke.py: loader against Gluon's batches, default
#                        array type and batchify, thread, fork and spawn workers, a worker's
#                        error, sharding, ctx=/device= placement, resume, positional order,
#                        try_nopython, 2.x's sampler and batchify names; and the
#                        fork-after-training scenario); ~25 s, about a minute with a fresh
#                        venv. Mark a test mx2_smoke to add it. It collects the whole suite, so
#                        a test file that fails to import under 2.0 fails it too.
VENV2  := .venv-mx2
BIN2   := $(VENV2)/bin
PIP2   := $(BIN2)/python -m pip --disable-pip-version-check
INSTALL2 := $(PIP2) install --progress-bar on
STAMP2 := $(VENV2)/.stamp-$(shell cat pyproject.toml constraints-mx2.txt | cksum | cut -d' ' -f1)
ARGS   ?=

.PHONY: test test-smoke test-quick demo bench bench-mx2 bench-peers docs lint format clean test-mx2 test-mx2-smoke

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	@echo "Installing shardloader and the test suite's dependencies into $(VENV) (MXNet 1.9.1,"
	@echo "gluoncv, gluon-nlp, which compiles for minutes without a line of output, OpenCV, scipy,"
	@echo "pandas, ...: about 1 GB, 3-6 minutes the first time)."
	$(INSTALL) -c constraints.txt -e '.[test]'
	@# gluoncv without its opencv-python, which would own cv2 beside opencv-python-headless.
	$(INSTALL) -c constraints.txt --no-deps gluoncv
	rm -f $(VENV)/.stamp-* && touch $@

# The smoke tests and the demo each need a part of the test extra: installed on its own,
# unless the venv already has the test extra, which includes it.
# $(call part_of_test_extra,EXTRA,STAMP-PREFIX,WHAT-IT-SAYS): the recipe of such a stamp.
define part_of_test_extra
	@if [ -e $(STAMP) ]; then \
		echo "$(VENV) already has the test extra, which includes the $(1) extra"; \
	else \
		printf '%s\n' $($(3)); \
		$(INSTALL) -c constraints.txt -e '.[$(1)]' || exit 1; \
	fi
	rm -f $(VENV)/.$(2)-stamp-* && touch $@
endef
CORE_SAYS = "Installing shardloader and what the smoke tests need into $(VENV): MXNet 1.9.1," \
	"pytest, hypothesis, psutil, simplejpeg and OpenCV (headless), ruff, mypy, matplotlib:" \
	"about 500 MB, 1-3 minutes the first time (pip shows each package as it goes)."
DEMO_SAYS = "Installing shardloader and what the demo needs into $(VENV): MXNet 1.9.1, numpy," \
	"tqdm, simplejpeg and OpenCV (headless), about 430 MB; 1-3 minutes the first time," \
	"most of it downloading MXNet (pip shows each package as it goes)."

$(CORE_STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(call part_of_test_extra,test-core,core,CORE_SAYS)

$(DEMO_STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(call part_of_test_extra,vision,demo,DEMO_SAYS)

# ruff, then mypy over the whole package (pyproject.toml's [tool.mypy]).
lint: $(STAMP)
	$(BIN)/ruff check $(SRC)
	$(BIN)/ruff format --check $(SRC)
	$(BIN)/mypy

# The whole suite: about 10 minutes on 2 cores (about 1,600 tests; pytest 585 s on a quiet machine).
test: lint
	$(BIN)/python -m pytest -q

test-smoke: $(CORE_STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "smoke and not slow" tests/test_smoke.py $(ARGS)

# A developer's loop: the whole suite less the tests marked slow (whole programs, soak,
# distributed, property sweeps), no ruff or mypy. `make test` (and CI) runs everything.
test-quick: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" $(ARGS)

$(BIN2)/python:
	$(PYTHON) -m venv $(VENV2)

$(STAMP2): $(BIN2)/python pyproject.toml constraints-mx2.txt
	$(INSTALL2) -c constraints-mx2.txt -e '.[test-core]'
	rm -f $(VENV2)/.stamp-* && touch $@

test-mx2: $(STAMP2)
	$(BIN2)/python -m pytest -q -p no:cacheprovider $(ARGS)

test-mx2-smoke: $(STAMP2)
	$(BIN2)/python -m pytest -q -p no:cacheprovider -m mx2_smoke $(ARGS)

# The demo trains through the fused image path, then again with Gluon's DataLoader, and
# prints the two speeds side by side (--gluon).
demo: $(DEMO_STAMP)
	$(BIN)/python -m shardloader demo --gluon

# The benchmarks (docs/benchmarks.md), about 11 minutes: ARGS=--publish rewrites the docs' tables,
# ARGS="--quick --workloads W5" a smoke run. bench-mx2 runs them under MXNet 2.0.0b1, against
# its own DataLoader, with and without try_nopython=True; its table is a section of its own.
$(BENCH_STAMP): $(BIN)/python pyproject.toml constraints.txt
	@echo "Installing shardloader and the benchmarks' dependencies into $(VENV)"
	$(INSTALL) -c constraints.txt -e '.[bench,vision]'
	rm -f $(VENV)/.bench-stamp-* && touch $@

bench: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks.run $(ARGS)

bench-mx2: $(STAMP2)
	$(INSTALL2) -c constraints-mx2.txt -e '.[bench]'
	$(BIN2)/python -m benchmarks.run $(ARGS)

# Against the loaders a user would pick instead (docs/benchmarks.md#against-torchvision-and-ffcv):
# torch's DataLoader with torchvision's own pipeline, and FFCV, beside shardloader, Gluon and
# ImageRecordIter on W5/W7's JPEGs; about 4 minutes (ARGS="--rounds 5", "--background train").
# The peers live in a venv of their own, .venv-peers, pinned by constraints-peers.txt, never in
# .venv: about 5.5 GB (torch's wheels bring CUDA's libraries), 2-5 minutes the first time.
# FFCV builds from source and needs libjpeg-turbo's and OpenCV's development files
# (Debian/Ubuntu: apt-get install libturbojpeg0-dev libopencv-dev pkg-config); without them
# its install fails, the benchmark leaves FFCV out, and the next `make bench-peers` tries again.
VENVP  := .venv-peers
BINP   := $(VENVP)/bin
INSTALLP := $(BINP)/python -m pip --disable-pip-version-check install --progress-bar on -c constraints-peers.txt
PEERS_SUM := $(shell cat constraints-peers.txt | cksum | cut -d' ' -f1)
PEERS_STAMP := $(VENVP)/.stamp-$(PEERS_SUM)
FFCV_STAMP  := $(VENVP)/.ffcv-stamp-$(PEERS_SUM)

$(BINP)/python:
	$(PYTHON) -m venv $(VENVP)

$(PEERS_STAMP): $(BINP)/python constraints-peers.txt
	@echo "Installing torch and torchvision into $(VENVP) (about 5.5 GB with CUDA's libraries)."
	$(INSTALLP) torch torchvision numpy Pillow psutil
	rm -f $(VENVP)/.stamp-* && touch $@

$(FFCV_STAMP): $(PEERS_STAMP)
	@echo "Building FFCV in $(VENVP) (needs libturbojpeg0-dev, libopencv-dev, pkg-config)."
	@if $(INSTALLP) ffcv; then rm -f $(VENVP)/.ffcv-stamp-* && touch $@; else \
		echo "FFCV did not build (see above): the benchmark runs without it."; fi

bench-peers: $(BENCH_STAMP) $(FFCV_STAMP)
	$(BIN)/python -m benchmarks.peers --peers-python $(BINP)/python $(ARGS)

# The docs site: mkdocs with the Material theme and mkdocstrings, built into site/.
# --strict turns every warning (a broken link, a page missing from the nav, a docstring
# mkdocstrings cannot parse) into a failure. mkdocstrings reads the source without importing
# it (mkdocs.yml), so the docs need the `docs` extra alone: no gluoncv, no test extra.
$(DOCS_STAMP): $(BIN)/python pyproject.toml constraints.txt
	@echo "Installing shardloader and the docs toolchain into $(VENV): mkdocs, mkdocs-material,"
	@echo "mkdocstrings, and MXNet 1.9.1 (shardloader's own requirement): 1-2 minutes the first time."
	$(INSTALL) -c constraints.txt -e '.[docs]'
	rm -f $(VENV)/.docs-stamp-* && touch $@

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

format: $(STAMP)
	$(BIN)/ruff format $(SRC)
	$(BIN)/ruff check --fix $(SRC)

clean:
	rm -rf $(VENV) $(VENV2) $(VENVP) build *.egg-info .pytest_cache site
