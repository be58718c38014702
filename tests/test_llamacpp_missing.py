"""Without llama-cpp-python the llama.cpp backend says how to install it (runs with or without it)."""
import sys

import pytest

from specbound.errors import ModelNotAvailable


def test_missing_llama_cpp_names_the_extra(monkeypatch, tmp_path):
    import specbound.models.llamacpp as backend

    monkeypatch.setitem(sys.modules, "llama_cpp", None)        # import llama_cpp -> ImportError
    with pytest.raises(ModelNotAvailable, match=r"pip install 'specbound\[llamacpp\]'"):
        backend.load_llama_cpp()
    with pytest.raises(ModelNotAvailable, match=r"specbound\[llamacpp\]"):
        backend.LlamaCppModel(tmp_path / "model.gguf")
