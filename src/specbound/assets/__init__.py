"""Where models and prompt sets come from: one package lookup, one cache root, verified caches.

- :mod:`.packages` finds installed PyPI packages and their data files without importing them.
- :mod:`.cache` is the one cache root (``$SPECBOUND_CACHE`` or ``~/.cache/specbound``), atomic
  writes and manifests of verified files.
- :mod:`.models` resolves and loads models: packaged GGUF models (:mod:`.catalog`, :mod:`.gguf`,
  :mod:`.convert`) converted once into a checked cache, or local Hugging Face directories.
- :mod:`.prompts` reads HumanEval, MT-Bench and GSM8K from packages, with builtin fallbacks.

Importing this package sets no environment variables and imports neither torch nor transformers.
Command line: ``specbound assets {list,install,convert,verify,show}`` (:mod:`specbound.cli.assets`), also
run as ``python -m specbound.assets ...``; the installing itself is :mod:`.install`.
"""
from .cache import cache_root
from .catalog import DEFAULT_DRAFT, DEFAULT_TARGET, PACKAGED_MODELS
from .models import gguf_path, list_models, load_hf_model, model_identity, resolve_model, verify_model
from .prompts import Prompt, format_prompt, load_prompts

__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "PACKAGED_MODELS",
    "Prompt",
    "cache_root",
    "format_prompt",
    "gguf_path",
    "list_models",
    "load_hf_model",
    "load_prompts",
    "model_identity",
    "resolve_model",
    "verify_model",
]
