"""Batch speculative decoding (Yin et al. Alg. 4) on tiny Hugging Face transformers: M drafts scored
in one tree-masked target pass; greedy identity and χ² losslessness of the first two tokens."""
import numpy as np
import pytest
import torch

from helpers import chi_square_pvalue, encode, hf_greedy_tokens, tiny_pair
from specbound.decoding import SamplingConfig, logits_to_probs, speculative_decode
from specbound.models.hf import HFModel

VOCAB = 32


@pytest.fixture(scope="module")
def batch_pair():
    """This file's tiny HF pair: vocabulary 32, target seed 10, draft noise 0.5 (seed 11)."""
    return tiny_pair(10, VOCAB, noise=0.5, draft_seed=11, backend=HFModel)


@pytest.mark.parametrize("design", ["A", "B"])
@pytest.mark.parametrize("gamma", [3, None])
def test_greedy_batch_sd_matches_target_greedy(batch_pair, design, gamma):
    target, draft = batch_pair
    prompt = torch.tensor([[1, 5, 9, 2]])
    ref = hf_greedy_tokens(target.model, prompt, 20)
    out = speculative_decode(target, draft, prompt, 20, gamma=gamma, temperature=0.0, drafts=3, design=design)
    assert out.tokens == ref


@pytest.mark.montecarlo
@pytest.mark.parametrize("design", ["A", "B"])
def test_batch_sd_first_two_tokens_follow_target_law(batch_pair, design):
    target, draft = batch_pair
    config = SamplingConfig(1.0, top_k=4)
    prompt = torch.tensor([[7, 3, 8]])
    with torch.inference_mode():
        first = logits_to_probs(target.model(input_ids=prompt).logits[0, -1].double(), config)
        law = np.zeros((VOCAB, VOCAB))
        for tok in torch.nonzero(first).flatten().tolist():
            ext = torch.cat([prompt, torch.tensor([[tok]])], dim=1)
            law[tok] = first[tok].item() * logits_to_probs(target.model(input_ids=ext).logits[0, -1].double(),
                                                           config).numpy()
    samples = np.array([speculative_decode(target, draft, prompt, 2, gamma=2, temperature=1.0, top_k=4,
                                           drafts=3, design=design, seed=i).tokens for i in range(1200)])
    assert chi_square_pvalue(encode(samples, VOCAB), law / law.sum()) > 1e-3
