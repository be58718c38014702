"""Prompt sets for benchmarks (HumanEval, MT-Bench, GSM8K from data packages, and a builtin set).

Names are imported lazily so that ``python -m specbound.data.prompts`` runs without a
double-import warning.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "BUILTIN_PROMPTS",
    "PROMPT_SETS",
    "Prompt",
    "available_prompt_sets",
    "format_prompt",
    "load_prompts",
]


def __getattr__(name: str) -> Any:
    """Forward the public names to :mod:`specbound.data.prompts` on first access."""
    if name in __all__:
        return getattr(importlib.import_module(".prompts", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
