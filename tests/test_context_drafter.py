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


def _trust_the_context(monkeypatch):
    """A planted bias: a context round whose first token the target rejected accepts it anyway."""
    real = engine_module.verify

    def trusting(tree, target_probs, law_mask=None, rule=None, generator=None):
        verdict = real(tree, target_probs, law_mask, rule, generator)
        if len(tree) and tree.from_context is not None and not verdict.path:
            nxt = int(torch.multinomial(target_probs[1], 1, generator=generator))
            return Verdict([0], nxt, RoundEnd.RECOVERED if len(tree) > 1 else RoundEnd.BONUS, [1.0], [0.0])
        return verdict

    monkeypatch.setattr(engine_module, "verify", trusting)


@pytest.mark.montecarlo
def test_the_chi_square_catches_a_verifier_that_trusts_the_context(backend_pair, monkeypatch):
    """The same test with the first drafted token always accepted: its law is no longer the target's."""
    target, _ = backend_pair
    _trust_the_context(monkeypatch)
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


# --- the context mixed into the draft model's chain (γ = auto, context = "auto") ---------------------------

def _fixed_costs(monkeypatch, draft_seconds=0.010):
    """Fixed costs (a draft read half a flat target pass: context rounds pay where the context repeats)
    and a clock that stands still, so which rounds come from the context depends on the seed only."""
    import time

    from specbound.decoding.costs import CostMeasurement, CostModel, CostProfile
    from specbound.decoding.drafters.chain import ChainDrafter

    ks = (1, 2, 4, 8, 16)
    fixed = CostMeasurement(CostProfile(ks, (0.020,) * len(ks)), CostProfile(ks, (draft_seconds,) * len(ks)))
    monkeypatch.setattr(ChainDrafter, "calibrated_costs", lambda self, target: CostModel(fixed))
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)


def _sources(monkeypatch):
    """Record, per drafted round, whether the context or the draft model proposed it."""
    from specbound.decoding.drafters.chain import ChainDrafter

    seen, propose = [], ChainDrafter.propose

    def recording(self, committed, max_depth, generator):
        tree = propose(self, committed, max_depth, generator)
        if len(tree):
            seen.append("context" if tree.from_context is not None else "model")
        return tree

    monkeypatch.setattr(ChainDrafter, "propose", recording)
    return seen


def test_mixed_chain_greedy_output_is_the_targets(backend_pair, monkeypatch):
    target, draft = backend_pair
    _fixed_costs(monkeypatch)
    seen = _sources(monkeypatch)
    for seed in range(3):
        base = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(seed))
        prompt = torch.cat([base, base, base[:, :3]], dim=1)
        plain = autoregressive_decode(target, prompt, 30, temperature=0.0).tokens
        out = speculative_decode(target, draft, prompt, 30, temperature=0.0, gamma="auto", context="auto")
        assert out.tokens == plain
    assert "context" in seen and "model" in seen               # both sources drafted rounds


def test_mixed_chain_greedy_on_exact_chains(monkeypatch):
    _fixed_costs(monkeypatch)
    seen = _sources(monkeypatch)
    for seed in range(4):
        target, draft = chain_models(seed, states=6)
        prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
        plain = autoregressive_decode(target, prompt, 40, temperature=0.0).tokens
        assert speculative_decode(target, draft, prompt, 40, temperature=0.0, gamma="auto",
                                  context="auto").tokens == plain
    assert "context" in seen


def _mixed_first_two(target, draft, prompt, runs):
    return np.array([speculative_decode(target, draft, prompt, 2, temperature=1.0, top_k=4, seed=i,
                                        gamma="auto", context="auto").tokens for i in range(runs)])


@pytest.mark.montecarlo
def test_mixed_chain_first_two_tokens_follow_the_target_law(backend_pair, monkeypatch):
    """1,500 runs; under the null the p-value is uniform, so p > 1e-3 fails a correct sampler 1 time in 1,000."""
    target, draft = backend_pair
    _fixed_costs(monkeypatch)
    seen = _sources(monkeypatch)
    prompt = torch.tensor([[3, 17, 5, 9, 3, 17]])
    law = exact_first_two_law(target, prompt, engine_module.SamplingConfig(1.0, top_k=4), VOCAB)
    samples = _mixed_first_two(target, draft, prompt, 1500)
    assert chi_square_pvalue(encode(samples, VOCAB), law) > 1e-3
    assert seen.count("context") > 500                          # the context proposed most first rounds


@pytest.mark.montecarlo
def test_mixed_chain_chi_square_catches_a_trusting_verifier(backend_pair, monkeypatch):
    target, draft = backend_pair
    _fixed_costs(monkeypatch)
    _trust_the_context(monkeypatch)
    prompt = torch.tensor([[3, 17, 5, 9, 3, 17]])
    law = exact_first_two_law(target, prompt, engine_module.SamplingConfig(1.0, top_k=4), VOCAB)
    samples = _mixed_first_two(target, draft, prompt, 1500)
    assert chi_square_pvalue(encode(samples, VOCAB), law) < 1e-3


def test_context_option_is_checked():
    target, draft = chain_models(0, states=4)
    with pytest.raises(SpecboundError, match="context must be 'auto' or 'off'"):
        speculative_decode(target, draft, [1, 2], 4, gamma="auto", context="on")
    with pytest.raises(SpecboundError, match="context='auto' needs gamma='auto'"):
        speculative_decode(target, draft, [1, 2], 4, gamma=3, context="auto")


def test_generate_with_no_draft_model_decodes_the_targets_tokens(monkeypatch, tmp_path, capsys):
    """``generate --draft none`` loads the target alone and drafts from the context; its greedy tokens
    are the plain run's (the baseline it runs beside)."""
    import json

    from helpers import CharTokenizer, tiny_pair
    from specbound.cli import main
    from specbound.models import loading
    from specbound.models.static import StaticCacheHFModel

    target = StaticCacheHFModel(tiny_pair(0, noise=0.3, draft_seed=1)[0], CharTokenizer(), name="tiny-target")
    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path))
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: target)
    monkeypatch.setattr(loading, "load_pair", lambda *a, **k: pytest.fail("--draft none loaded a draft"))
    argv = ["generate", "--draft", "none", "--prompt", "abcabcabcabcabc", "--max-new-tokens", "20", "--threads",
            "1", "--baseline", "--target-precision", "int8", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["baseline"]["identical_tokens"] is True
    assert len(report["text_tokens"]) == 20


@pytest.mark.parametrize("extra", [["--gamma", "3"], ["--tree", "8"], ["--drafts", "2"]])
def test_generate_with_no_draft_model_refuses_model_draft_options(extra, no_model_loads, capsys):
    from specbound.cli import main

    assert main(["generate", "--draft", "none", "--prompt", "x", "--target-precision", "int8"] + extra) == 2
    assert "--draft none drafts from the context" in capsys.readouterr().err
