# lit_amp — every target creates .venv on first use and installs what it needs.
PY        ?= python3
VENV      := .venv
VPY       := $(VENV)/bin/python
# One install stamp per purpose, each on top of the run set:
#   RUN_STAMP  torch, lit_amp and its dependencies (the default run's MNIST-1D included): demo
#   STAMP      + the test tools (the dev extra) and the docs tools (the suite builds the API
#              reference): test, lint, bench, gpu-report
#   DOCS_STAMP + the docs tools: docs
RUN_STAMP  := $(VENV)/.installed-run
STAMP      := $(VENV)/.installed-test
DOCS_STAMP := $(VENV)/.installed-docs
# On a machine without CUDA, take the CPU build of torch (it lies on disk here; an unpinned
# `torch` would pull a multi-GB CUDA build).
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test bench lint clean conformance-record docs gpu-wheels gpu-check gpu-report \
        cluster-tools

$(RUN_STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1; then $(VPY) -m pip install -q "torch>=2.11,<2.14"; \
	else $(VPY) -m pip install -q $(TORCH_PIN); fi
	$(VPY) -m pip install -q -e .
	touch $@

$(STAMP): $(RUN_STAMP)
	$(VPY) -m pip install -q -e ".[dev,docs]"
	touch $@

$(DOCS_STAMP): $(RUN_STAMP)
	$(VPY) -m pip install -q -e ".[docs]"
	touch $@

demo: $(RUN_STAMP)
	$(VPY) examples/demo.py

# The CPU suite (pytest's options live in pyproject.toml). A GPU, if the machine has one, is
# hidden: the suite asserts the CPU's behaviour (bf16 defaults, gloo). The CUDA subset
# (tests/cuda, `-m cuda`) runs here on the CPU, which checks its logic; `make gpu-check` runs
# it on a GPU (gpu/check.py runs the suite with these same two variables).
# The slurm-marked tests (tests/cluster) start a SLURM cluster of their own: cluster-tools
# installs slurm-wlm and munge when missing (as root, with apt-get; a no-op when installed).
test: $(STAMP) cluster-tools
	CUDA_VISIBLE_DEVICES= LIT_AMP_CUDA_TESTS_ON=cpu $(VPY) -m pytest -q --durations=15

cluster-tools:
	@sh tests/cluster/install_slurm.sh

# ---- the GPU kit (README "On a GPU") ----------------------------------------------------
# here, with the package registry: the wheels the GPU machine's image lacks, into .whl/
gpu-wheels:
	$(PY) gpu/wheels.py --dest .whl
# on the GPU machine, offline, .whl/ carried: PART=tests (= cuda,suite), bench, all, or a list
# such as PART=cuda,bench; results under $$GPU_OUT,
# $$OUT or gpu-out/ (refuses with exit status 2 where no CUDA device is visible)
PART   ?= all
GPU_PY ?= python3
gpu-check:
	$(GPU_PY) gpu/check.py --part $(PART)
# back here: the GPU results (a folder or its gpu_results.tgz) into bench/results/ and
# docs/benchmarks.md
gpu-report: $(STAMP)
	$(VPY) gpu/report.py $(GPU_OUT)

# every benchmark, one after the other (about 30 min on 2 idle cores); results land in
# bench/results/ and docs/benchmarks.md
bench: $(STAMP)
	$(VPY) bench/overhead.py
	$(VPY) bench/loss_scale.py
	$(VPY) bench/amp_levels.py
	$(VPY) -m bench.online
	$(VPY) bench/collectives.py
	$(VPY) bench/boost.py
	$(VPY) bench/thor.py

# the API reference from the docstrings (mkdocs-material + mkdocstrings), into site/
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(STAMP)
	$(VPY) -m ruff check lit_amp tests bench examples conformance gpu hydra_plugins

clean:
	rm -rf $(VENV) lightning_logs outputs multirun runs .pytest_cache site gpu-out

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
