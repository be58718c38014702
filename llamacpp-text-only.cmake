# Included by llama.cpp's own project() when the Makefile builds llama-cpp-python (CMAKE_PROJECT_llama.cpp_INCLUDE):
# a plain variable set here takes precedence over llama.cpp's option(LLAMA_BUILD_COMMON ...) (policy CMP0077),
# which llama-cpp-python forces on in its cache for its multimodal library. specbound loads libllama and
# libggml only, so the common utilities (about half of the build's compile time) are not built.
set(LLAMA_BUILD_COMMON OFF)
