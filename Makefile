# Two commands do all the set-up themselves on a fresh machine:
#   make demo   - the examples under the plugin (CPU when no GPU), printing kernel tables
#   make test   - the project's own tests (what .ci/run calls)
# TORCH_SPEC picks the torch build: the default pins the CPU build these machines carry;
# on a GPU machine use e.g. `make test TORCH_SPEC=torch` or install torch into .venv first.
VENV ?= .venv
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# make test's pytest-xdist workers: two without a GPU (CI's two cores: ~10 min against ~17 serial); none on a
# machine with nvidia-smi, where tests that time kernels must not share the GPU with each other
TEST_WORKERS ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 0 || echo 2)

.PHONY: demo test install clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m pytest examples -p no:cacheprovider --fusion-report --fusion-baseline examples/fusion_baseline.json -q $(PYTEST_ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest tests -q -ra --timeout=600 -n $(TEST_WORKERS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
