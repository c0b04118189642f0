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

.PHONY: install test demo lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[all]"
	@touch $@

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/moescope demo

lint: $(STAMP)
	$(BIN)/ruff check moescope tests bench
	$(BIN)/ruff format --check moescope tests bench

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) moescope-demo .pytest_cache
