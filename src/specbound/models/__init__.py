"""Backends behind one protocol: exact Markov chains and Hugging Face causal LMs."""
from .base import LanguageModel, as_token_batch
from .chain import ChainModel

__all__ = ["ChainModel", "LanguageModel", "as_token_batch"]
