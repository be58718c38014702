"""Shared test helpers (plain functions; the fixtures built on them are in conftest.py).

- exact laws and the χ² test: ``processed_chain``, ``chi_square_pvalue``, ``encode``, ``exact_first_two_law``;
- the greedy reference of a transformer: ``hf_greedy_tokens`` (its own ``generate``);
- toy pairs: ``chain_pair`` / ``chain_models`` (exact Markov chains), ``tiny_transformer`` /
  ``perturbed_copy`` / ``tiny_pair`` (random-init Qwen2 transformers built in code), ``HF_BACKENDS``;
- stand-ins: ``CharTokenizer``, ``DelegatingModel``.
"""
from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from specbound.decoding.sampling import SamplingConfig, logits_to_probs
from specbound.models import ChainModel, LanguageModel
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


def exact_first_two_law(model, prompt, config: SamplingConfig, vocab: int = 48) -> np.ndarray:
    """Law of (x_1, x_2) under an HF model's processed distribution, by enumerating x_1 (cache-free forwards)."""
    model.reset()
    with torch.inference_mode():
        first = logits_to_probs(model.model(input_ids=prompt).logits[0, -1].double(), config)
        law = np.zeros((vocab, vocab))
        for tok in torch.nonzero(first).flatten().tolist():
            ext = torch.cat([prompt, torch.tensor([[tok]])], dim=1)
            second = logits_to_probs(model.model(input_ids=ext).logits[0, -1].double(), config)
            law[tok] = first[tok].item() * second.numpy()
    return law / law.sum()


def hf_greedy_tokens(model, prompt: torch.Tensor, n: int) -> list[int]:
    """The ``n`` tokens that transformers' own ``generate`` appends to ``prompt`` (shape (1, L)) greedily:
    exactly ``n`` (no end-of-sequence stop), the reference for greedy token identity."""
    with torch.inference_mode():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, prompt.shape[1]:].tolist()


def chain_pair(seed: int, states: int = 4, *, noise: float = 0.7, horizon: int | None = None,
               concentration: float = 1.0, draft_seed: int | None = None) -> tuple[MarkovChain, MarkovChain]:
    """An exact toy (target, draft): a random chain and a perturbed copy of it.

    The target is ``MarkovChain.random(states, horizon, concentration, seed)``; the draft mixes each of
    its rows with a random row, weight ``noise``, drawn with ``draft_seed`` (default ``seed + 1000``).
    """
    target = MarkovChain.random(states, horizon=horizon, concentration=concentration, seed=seed)
    draft = target.perturbed(noise, seed=seed + 1000 if draft_seed is None else draft_seed)
    return target, draft


def chain_models(seed: int, states: int = 4, **kwargs) -> tuple[ChainModel, ChainModel]:
    """``chain_pair(seed, states, **kwargs)`` as language models (ChainModel target, ChainModel draft)."""
    target, draft = chain_pair(seed, states, **kwargs)
    return ChainModel(target), ChainModel(draft)


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


def tiny_pair(seed: int = 0, vocab: int = 48, *, noise: float = 0.35, draft_seed: int = 1, backend=None,
              tokenizer=None):
    """The tiny HF (target, draft): ``tiny_transformer(seed, vocab)`` and its ``perturbed_copy(noise, draft_seed)``.

    ``backend=None`` returns the two torch modules; a backend class (``HFModel``, ``StaticCacheHFModel``,
    a value of ``HF_BACKENDS``) wraps them as ``backend(model, tokenizer, name="tiny-target"/"tiny-draft")``.
    """
    target = tiny_transformer(seed, vocab=vocab)
    draft = perturbed_copy(target, noise, seed=draft_seed)
    if backend is None:
        return target, draft
    return backend(target, tokenizer, name="tiny-target"), backend(draft, tokenizer, name="tiny-draft")


class CharTokenizer:
    """Just enough tokenizer for the bench and the command line: characters → ids 1..47, ids → letters."""

    chat_template = None

    def __init__(self, eos_token_id: int | None = None):
        self.eos_token_id = eos_token_id

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        return type("Enc", (), {"input_ids": torch.tensor([[1 + ord(c) % 47 for c in text]])})()

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids)

    def get_vocab(self):
        return {str(i): i for i in range(48)}


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
