"""Shared test helpers: exact processed laws of chains and a χ² goodness-of-fit test."""
from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from specbound.decoding.sampling import SamplingConfig, logits_to_probs
from specbound.models import LanguageModel
from specbound.theory import MarkovChain


def processed_chain(chain: MarkovChain, config: SamplingConfig) -> MarkovChain:
    """The chain whose rows are the processed (temperature/top-k/top-p) laws of ``chain``'s rows."""
    with np.errstate(divide="ignore"):
        logits = torch.from_numpy(np.log(chain.transitions))
    probs = logits_to_probs(logits, config).numpy()
    return MarkovChain(chain.initial, probs / probs.sum(-1, keepdims=True))


def chi_square_pvalue(samples: np.ndarray, law: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson χ² p-value of integer-coded samples against an exact law.

    Cells with expected count < ``min_expected`` are pooled into one cell (standard practice so
    the χ² approximation holds). Samples in cells of zero probability give p = 0.
    """
    law = np.asarray(law, dtype=np.float64).ravel()
    n = len(samples)
    counts = np.bincount(samples, minlength=law.size).astype(np.float64)
    if np.any(counts[law == 0] > 0):
        return 0.0
    expected = law * n
    small = expected < min_expected
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    if len(obs) < 2:
        return 1.0
    return float(stats.chisquare(obs, exp).pvalue)


def encode(sequences, n_states: int) -> np.ndarray:
    """Code each row (x_1..x_L) as one integer in [0, S^L) matching ``MarkovChain.sequence_law`` order."""
    seq = np.asarray(sequences)
    code = np.zeros(len(seq), dtype=np.int64)
    for j in range(seq.shape[1]):
        code = code * n_states + seq[:, j]
    return code


def tiny_transformer(seed: int, vocab: int = 48, layers: int = 2, init_range: float = 0.25):
    """A randomly initialised Qwen2-architecture causal LM built from a config (no download)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=init_range, tie_word_embeddings=False)
    return Qwen2ForCausalLM(config).eval()


def _hf_backends():
    from specbound.models.hf import HFModel
    from specbound.models.static import StaticCacheHFModel

    return {"dynamic-cache": HFModel, "static-cache": StaticCacheHFModel}


#: The two Hugging Face backends (the model's own forward over a DynamicCache; the static cache).
HF_BACKENDS = _hf_backends()


def perturbed_copy(model, noise: float, seed: int):
    """A draft-like model: a copy of ``model`` with Gaussian noise (relative scale ``noise``) on its weights."""
    import copy

    gen = torch.Generator().manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise * p.std().clamp_min(1e-3))
    return draft.eval()


class DelegatingModel(LanguageModel):
    """Base for test wrappers around a LanguageModel: every call goes to ``inner`` unless overridden."""

    def __init__(self, inner, name: str):
        self.inner, self.vocab_size, self.name = inner, inner.vocab_size, name
        self.info = inner.info

    def reset(self):
        self.inner.reset()

    @property
    def cache_length(self):
        return self.inner.cache_length

    @property
    def committed_length(self):
        return self.inner.committed_length

    def crop(self, length):
        self.inner.crop(length)

    def forward(self, tokens, keep_logits=None):
        return self.inner.forward(tokens, keep_logits)

    def forward_tree(self, tokens, parents):
        return self.inner.forward_tree(tokens, parents)

    def keep_path(self, base_length, path):
        self.inner.keep_path(base_length, path)
