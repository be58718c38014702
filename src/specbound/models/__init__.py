"""Language-model backends behind one protocol (:class:`LanguageModel`, ``base.py``), and their loading.

Backends: exact Markov chains (``chain.py``), unmodified Hugging Face causal LMs (``hf.py``, with
oneDNN-prepacked fp32 linears from ``fast.py``), Llama-family models over a static KV cache (``static.py``),
batch-invariant int8 targets and drafts (``int8.py``), the GGUF file's own Q4_K/Q6_K weights on specbound's
C++ kernel (``kquant.py``, the default target) and GGUF models on llama.cpp (``llamacpp.py``, with the file's
own tokenizer in ``llamacpp_tokenizer.py``). Around them: pairs and mixed backends (``loading.py``), a draft's
GGUF re-quantised once (``requant.py``), rows of a batch sharing passes (``rows.py``), calibration text
(``calibration.py``) and stop tokens (``tokens.py``).
"""
from .base import LanguageModel, as_token_batch
from .chain import ChainModel

__all__ = ["ChainModel", "LanguageModel", "as_token_batch"]
