"""Hugging Face backend on tiny random transformers built from a config (no downloads):
greedy identity with `generate`, χ² losslessness with top-k, cache rollback, tree masks."""

import numpy as np
import pytest
import torch

from helpers import chi_square_pvalue, encode, exact_first_two_law, hf_greedy_tokens, tiny_transformer
from specbound.decoding import SamplingConfig, autoregressive_decode, speculative_decode
from specbound.errors import SpecboundError
from specbound.models import LanguageModel
from specbound.models.hf import HFModel

VOCAB = 48


@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_greedy_sd_token_identical_to_hf_generate(backend_pair, gamma):
    target, draft = backend_pair
    for seed in range(3):
        prompt = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(seed))
        ref = hf_greedy_tokens(target.model, prompt, 30)
        out = speculative_decode(target, draft, prompt, 30, gamma=gamma, temperature=0.0, seed=seed)
        assert out.tokens == ref
        assert autoregressive_decode(target, prompt, 30, temperature=0.0).tokens == ref
        assert 0 < sum(out.metrics.accepted_per_step) < 30 or gamma == 1


@pytest.mark.montecarlo
@pytest.mark.parametrize("gamma", [1, 3])
def test_first_two_tokens_follow_target_law_with_top_k(backend_pair, gamma):
    target, draft = backend_pair
    config = SamplingConfig(1.0, top_k=4)
    prompt = torch.tensor([[3, 17, 5]])
    law = exact_first_two_law(target, prompt, config, VOCAB)
    runs = 1500
    samples = np.array([speculative_decode(target, draft, prompt, 2, gamma=gamma, temperature=1.0, top_k=4,
                                           seed=i).tokens for i in range(runs)])
    assert chi_square_pvalue(encode(samples, VOCAB), law) > 1e-3


class CheckedModel(LanguageModel):
    """Wraps an HFModel; after every cached forward compares the logits with a fresh, cache-free
    forward over the full token history (catches stale KV entries after a rollback)."""

    def __init__(self, inner: HFModel):
        self.inner, self.vocab_size, self.name = inner, inner.vocab_size, inner.name
        self.history: list[int] = []
        self.max_error = 0.0
        self.checks = 0

    def reset(self):
        self.inner.reset()
        self.history = []

    @property
    def cache_length(self):
        return self.inner.cache_length

    def crop(self, length):
        self.inner.crop(length)
        self.history = self.history[:length]

    def forward(self, tokens, keep_logits=None):
        logits = self.inner.forward(tokens)
        self.history += tokens[0].tolist()
        with torch.inference_mode():
            fresh = self.inner.model(input_ids=torch.tensor([self.history])).logits[:, -tokens.shape[1]:]
        self.max_error = max(self.max_error, float((fresh - logits).abs().max()))
        self.checks += 1
        return logits


def test_cache_rollback_leaves_no_stale_entries(backend_pair):
    target, draft = (CheckedModel(m) for m in backend_pair)
    out = speculative_decode(target, draft, [1, 2, 3, 4], 40, gamma=5, temperature=1.0, seed=0)
    assert out.metrics.rejections >= 3                     # rollbacks really happened
    assert target.checks > 5 and draft.checks > 20
    assert target.max_error < 1e-4 and draft.max_error < 1e-4


def test_tree_forward_equals_separate_branch_forwards(backend_pair):
    target, _ = backend_pair
    prefix = [4, 8, 15, 16]
    tree_tokens = [23, 42, 7, 9, 11]           # two branches: 23→7→11 and 42→9
    parents = [3, 3, 4, 5, 6]                  # absolute cache slots: slot 3 is the last prefix token
    target.reset()
    target.forward(torch.tensor([prefix]))
    logits = target.forward_tree(torch.tensor([tree_tokens]), parents)[0]
    with torch.inference_mode():
        a = target.model(input_ids=torch.tensor([prefix + [23, 7, 11]])).logits[0, -3:]
        b = target.model(input_ids=torch.tensor([prefix + [42, 9]])).logits[0, -2:]
    torch.testing.assert_close(logits[[0, 2, 4]], a, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[[1, 3]], b, atol=1e-4, rtol=1e-4)
    # keep branch 42→9, then continue: equals a fresh forward over prefix + [42, 9, 5]
    target.keep_path(len(prefix), [5, 7])
    nxt = target.forward(torch.tensor([[5]]))[0, -1]
    with torch.inference_mode():
        ref = target.model(input_ids=torch.tensor([prefix + [42, 9, 5]])).logits[0, -1]
    torch.testing.assert_close(nxt, ref, atol=1e-4, rtol=1e-4)


def test_vocabulary_mismatch_is_reported(backend_pair):
    target, _ = backend_pair
    other = HFModel(tiny_transformer(2, vocab=VOCAB + 3), name="other")
    with pytest.raises(SpecboundError, match="vocabulary mismatch"):
        speculative_decode(target, other, [1, 2], 4)
