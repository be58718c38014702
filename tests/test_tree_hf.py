"""Tree speculative decoding on the Hugging Face backend with tiny random transformers (no downloads):
greedy identity for every tree drafter, χ² losslessness of the dynamic drafter with top-k, and the
tree-mask forward against separate per-branch forwards (Pankratov & Alistarh 2026, §1–§2)."""
import numpy as np
import pytest
import torch

from helpers import chi_square_pvalue, encode, exact_first_two_law, hf_greedy_tokens
from specbound.decoding import SamplingConfig, autoregressive_decode, speculative_decode
from specbound.models.hf import HFModel
from test_tree_engine import assert_tree_forward_matches_branches, random_tree

VOCAB = 48


@pytest.mark.parametrize("drafter", ["dynamic", "sampled", "chain", "oracle"])
def test_greedy_tree_sd_token_identical_to_target_greedy(backend_pair, drafter):
    target, draft = backend_pair
    capacity, budget = 6, 30
    accepted = 0
    for seed in range(3):
        prompt = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(seed))
        ref = hf_greedy_tokens(target.model, prompt, budget)
        assert autoregressive_decode(target, prompt, budget, temperature=0.0).tokens == ref
        out = speculative_decode(target, draft, prompt, budget, tree=capacity, tree_drafter=drafter,
                                 temperature=0.0, seed=seed)
        assert out.tokens == ref
        assert out.metrics.new_tokens == budget
        assert max(out.metrics.drafted_per_step) <= capacity
        accepted += sum(out.metrics.accepted_per_step)
        if drafter == "oracle":
            # greedy target: T*(P) is the arg-max chain, so every round accepts all of it (+ bonus)
            full = [a for a, d in zip(out.metrics.accepted_per_step, out.metrics.drafted_per_step) if d == capacity]
            assert full and all(a == capacity for a in full)
    assert accepted > 0                       # verification accepted drafts somewhere


@pytest.mark.montecarlo
def test_dynamic_tree_first_two_tokens_follow_target_law_with_top_k(backend_pair):
    target, draft = backend_pair
    config = SamplingConfig(1.0, top_k=4)
    prompt = torch.tensor([[3, 17, 5]])
    law = exact_first_two_law(target, prompt, config, VOCAB)
    runs = 1500
    samples = np.array([speculative_decode(target, draft, prompt, 2, tree=5, tree_drafter="dynamic",
                                           temperature=1.0, top_k=4, seed=i).tokens for i in range(runs)])
    assert chi_square_pvalue(encode(samples, VOCAB), law) > 1e-3


def test_tree_mask_forward_equals_separate_branch_forwards(backend_pair):
    target, _ = backend_pair
    for seed in range(3):
        tokens, parents = random_tree(VOCAB, 9, seed)
        assert_tree_forward_matches_branches(target, [4, 8, 15, 16], tokens, parents, atol=1e-4, rtol=1e-4)
    # the engine's layout: pending committed tokens as a leading chain with the draft tree below it
    assert_tree_forward_matches_branches(target, [1], [3, 0, 2, 2, 1], [-1, 0, 1, 1, 2], atol=1e-4, rtol=1e-4)
