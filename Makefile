# `make demo`: set up .venv and run pyfuser on every bundled example.
# `make test`: set up .venv and run the whole test suite (GPU tests skip without a GPU).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: setup demo test clean

setup: $(VENV)/.installed

# The venv sees system packages, so a CUDA torch already installed there is used as it is;
# where no torch is importable, the CPU build is installed.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# bytecode ahead of the first import (an editable install does not compile it)
	-$(PY) -m compileall -q pyfuser
	# the native cached-call runner, built once here (never on a call); optional
	-$(PY) -m pyfuser.runtime.native
	touch $@

demo: setup
	$(PY) -m pyfuser.cli demo examples

test: setup
	$(PY) -m pytest tests

clean:
	rm -rf $(VENV) build *.egg-info
