# Two commands do all the set-up: `make demo` and `make test`.
# TORCH_SPEC chooses the torch build. The default is this machine's CPU wheel; for CUDA, e.g.
#   make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON     ?= python3.11
TORCH_SPEC ?= torch==2.13.0
VENV       := .venv
BIN        := $(VENV)/bin
STAMP      := $(VENV)/.moescope-installed
PYTEST_ARGS ?=

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# The browser tests drive Debian's chromium through Playwright (tests/browser.py); another
# build can be named with CHROMIUM=/path/to/chromium.
CHROMIUM ?= $(firstword $(wildcard /usr/bin/chromium) $(shell command -v chromium 2>/dev/null))
export CHROMIUM

.PHONY: install check-prereqs test demo docs lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[all]"
	@touch $@

# What `make test` needs from the system, said in the first second rather than after the suite.
check-prereqs:
	@test -x $(BIN)/python || command -v $(PYTHON) >/dev/null || { echo "make test needs $(PYTHON) \
	to create $(VENV): install it with \`sudo apt-get install python3.11-venv\` or name another \
	Python 3.11 with PYTHON=." >&2; exit 1; }
	@test -x "$(CHROMIUM)" || { echo "make test needs chromium for its browser tests: install it \
	with \`sudo apt-get install chromium\`." >&2; exit 1; }

# pytest-xdist workers, one per core up to 4 (PYTEST_WORKERS=0: one process). Much of the suite
# is single-threaded Python or waits on a subprocess (a CLI, a notebook kernel, chromium), so on
# two cores two workers took the whole suite from 31:51 to 13:51 (measured side by side), though
# each worker repeats the session fixtures. Each worker gives torch its share of the cores; each
# test file goes to one worker whole (its module fixtures set up once), the longest files first
# (tests/conftest.py). The report ends with the tests that took over 20 s, so a CI log shows
# what spends the suite's 20-minute budget.
PYTEST_WORKERS ?= auto

test: check-prereqs $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadfile \
		--durations 30 --durations-min 20 $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/moescope demo

# The documentation site (Sphinx, MyST-NB, PyData theme; docs/conf.py says why) into build/docs,
# warnings as errors. Its tutorials are the notebooks as `make demo` executed them: the demo's
# report is reused, and run first when it is missing or older than a notebook.
DOCS_REPORT ?= moescope-demo
DOCS_OUT    ?= build/docs

docs: $(STAMP) $(DOCS_REPORT)/report.json
	MOESCOPE_DOCS_REPORT="$(abspath $(DOCS_REPORT))" $(BIN)/sphinx-build -b html -W --keep-going -q \
		-d build/docs-doctrees docs $(DOCS_OUT)
	@echo "documentation: $(abspath $(DOCS_OUT))/index.html"

$(DOCS_REPORT)/report.json: $(wildcard notebooks/*.ipynb)
	$(BIN)/moescope report --model toy --out $(DOCS_REPORT) --overwrite

lint: $(STAMP)
	$(BIN)/ruff check moescope tests bench docs
	$(BIN)/ruff format --check moescope tests bench
	$(BIN)/lint-imports --no-logo --no-cache

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) moescope-demo .pytest_cache build docs/tutorials/_notebooks docs/_static_widgets
