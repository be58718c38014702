"""The context drafter (``speculative_decode(target, None, ...)``, ``generate --draft none``): tokens found
earlier in the prompt and output, no draft model. Lossless: greedy output equals the target's own on
exact chains and tiny transformers with repetitive prompts, and at T = 1 with top-k the first two tokens
follow the target's exact law (χ², 1,500 runs, p > 1e-3), while a verifier that trusts the context
(a planted bias) fails the same test. It drafts where the context repeats and not elsewhere."""
import numpy as np
import pytest
import torch

from helpers import chain_models, chi_square_pvalue, encode, exact_first_two_law
from specbound.decoding import autoregressive_decode, speculative_decode
from specbound.decoding import engine as engine_module
from specbound.decoding.verify import RoundEnd, Verdict
from specbound.errors import SpecboundError

VOCAB = 48


@pytest.mark.parametrize("seed", range(4))
def test_greedy_output_is_the_targets_on_exact_chains(seed):
    target, _ = chain_models(seed, states=6)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    plain = autoregressive_decode(target, prompt, 40, temperature=0.0).tokens
    out = speculative_decode(target, None, prompt, 40, temperature=0.0)
    assert out.tokens == plain and out.metrics.new_tokens == 40


def test_greedy_output_is_the_targets_on_a_tiny_transformer(backend_pair):
    target, _ = backend_pair
    drafted = 0
    for seed in range(3):
        base = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(seed))
        prompt = torch.cat([base, base, base[:, :3]], dim=1)             # the prompt repeats itself
        plain = autoregressive_decode(target, prompt, 30, temperature=0.0).tokens
        out = speculative_decode(target, None, prompt, 30, temperature=0.0, seed=seed)
        assert out.tokens == plain
        drafted += sum(out.metrics.drafted_per_step)
    assert drafted > 0                                                    # the context was drafted from


def _first_two(target, prompt, runs):
    return np.array([speculative_decode(target, None, prompt, 2, temperature=1.0, top_k=4, seed=i).tokens
                     for i in range(runs)])


@pytest.mark.montecarlo
def test_first_two_tokens_follow_the_target_law_with_top_k(backend_pair):
    target, _ = backend_pair
    prompt = torch.tensor([[3, 17, 5, 9, 3, 17]])                       # "3 17" was followed by "5 9"
    law = exact_first_two_law(target, prompt, engine_module.SamplingConfig(1.0, top_k=4), VOCAB)
    samples = _first_two(target, prompt, 1500)
    assert chi_square_pvalue(encode(samples, VOCAB), law) > 1e-3


@pytest.mark.montecarlo
def test_the_chi_square_catches_a_verifier_that_trusts_the_context(backend_pair, monkeypatch):
    """The same test with the first drafted token always accepted: its law is no longer the target's."""
    target, _ = backend_pair
    real = engine_module.verify

    def trusting(tree, target_probs, law_mask=None, rule=None, generator=None):
        verdict = real(tree, target_probs, law_mask, rule, generator)
        if len(tree) and not verdict.path:
            nxt = int(torch.multinomial(target_probs[1], 1, generator=generator))
            return Verdict([0], nxt, RoundEnd.RECOVERED if len(tree) > 1 else RoundEnd.BONUS, [1.0], [0.0])
        return verdict

    monkeypatch.setattr(engine_module, "verify", trusting)
    prompt = torch.tensor([[3, 17, 5, 9, 3, 17]])
    law = exact_first_two_law(target, prompt, engine_module.SamplingConfig(1.0, top_k=4), VOCAB)
    samples = _first_two(target, prompt, 1500)
    assert chi_square_pvalue(encode(samples, VOCAB), law) < 1e-3


def test_without_a_draft_model_only_context_options_are_accepted():
    target, _ = chain_models(0, states=4)
    with pytest.raises(SpecboundError, match="without a draft model"):
        speculative_decode(target, None, [1, 2], 4, gamma=3)
    with pytest.raises(SpecboundError, match="without a draft model"):
        speculative_decode(target, None, [1, 2], 4, drafts=2, gamma=2)
