# lit_amp — every target creates .venv on first use and installs what it needs.
PY        ?= python3
VENV      := .venv
VPY       := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
# On a machine without CUDA, take the CPU build of torch (it lies on disk here; an unpinned
# `torch` would pull a multi-GB CUDA build).
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test bench lint clean conformance-record docs

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1; then $(VPY) -m pip install -q torch; \
	else $(VPY) -m pip install -q $(TORCH_PIN); fi
	$(VPY) -m pip install -q -e ".[dev,examples,docs]"
	touch $(STAMP)

demo: $(STAMP)
	$(VPY) examples/demo.py

# A 2-process gloo worker on this 2-core VM is, now and then, killed by SIGABRT in c10d/gloo's
# thread teardown after its work is done ("terminate called without an active exception"):
# such a test runs once more. Only that signal is retried; an assertion failure never is.
RERUN_ABORTED := --reruns 1 --only-rerun "terminated with signal SIGABRT"

test: $(STAMP)
	$(VPY) -m pytest -q --durations=15 --doctest-modules lit_amp tests $(RERUN_ABORTED)

# every benchmark, one after the other (about 30 min on 2 idle cores); results land in
# bench/results/ and docs/benchmarks.md
bench: $(STAMP)
	$(VPY) bench/overhead.py
	$(VPY) bench/loss_scale.py
	$(VPY) bench/amp_levels.py
	$(VPY) bench/online.py
	$(VPY) bench/collectives.py
	$(VPY) bench/boost.py
	$(VPY) bench/thor.py

# the API reference from the docstrings (mkdocs-material + mkdocstrings), into site/
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(STAMP)
	$(VPY) -m ruff check lit_amp tests bench examples conformance

clean:
	rm -rf $(VENV) lightning_logs outputs multirun runs .pytest_cache site

# MindSpore itself, in its own venv (never a dependency of `make test`): mindspore 2.10 wheels
# need CPython <= 3.11 and numpy < 2
MS_PY_BASE ?= python3.11
MS_VENV    := .ms-venv
MS_PY      := $(MS_VENV)/bin/python

$(MS_VENV)/.installed:
	test -x $(MS_PY) || $(MS_PY_BASE) -m venv $(MS_VENV)
	$(MS_PY) -m pip install -q mindspore==2.10.0 'numpy<2'
	touch $@

# re-record conformance/goldens from real MindSpore (PyNative, CPU); commit the result
conformance-record: $(MS_VENV)/.installed
	MS_PYTHON=$(MS_PY) $(PY) conformance/record.py
