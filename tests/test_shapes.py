"""``shape="auto"``: the drafted shape (chain / 2 drafts / sampled tree) chosen every round.

Losslessness by χ² of the first three tokens on an exact Markov chain at T > 0 (plain, top-k, top-p),
with the shapes switching every round, and a planted-bias mutant the same χ² catches; greedy
identity; the predicted value each shape is ranked by (E[X | drafted tree]) against the accepted
counts the engine realises; the choice rule's schedule on given rates; bad input.
"""
import numpy as np
import pytest

from helpers import chain_models, chain_pair, chi_square_pvalue, encode, processed_chain
from test_batch_engine import no_residual_update     # the planted bug: siblings tested without the residual update
from specbound.decoding import SamplingConfig, Speculator, autoregressive_decode, speculative_decode
from specbound.decoding import verify as verify_module
from specbound.decoding.drafters import ShapeDrafter
from specbound.decoding.drafters.shapes import drafted_value
from specbound.decoding.engine import DraftSpec, make_generator
from specbound.decoding.policy import ShapeChoice
from specbound.decoding.verify import BLOCK, STANDARD
from specbound.errors import SpecboundError
from specbound.models import ChainModel

P_MIN = 1e-3          # χ² significance level; seeds are fixed so each outcome is deterministic
RUNS = 3000           # 3 tokens over 4 states: 64 cells, ≥ 5 expected per pooled cell


class RotatingChoice(ShapeChoice):
    """Every round a different shape (starting at ``offset``): the hardest switching for the caches and
    the verifier — a chain round follows a tree round and vice versa."""

    def __init__(self, names, offset=0):
        super().__init__(names)
        self.offset = offset

    def _choose(self):
        return self.names[(self.round + self.offset) % len(self.names)]


def _law_and_samples(config, verification, runs=RUNS, seed=31):
    target, draft = chain_pair(seed, states=4, noise=0.7)
    tm, dm = ChainModel(target), ChainModel(draft)
    law = processed_chain(target, config).sequence_law(0, 3)
    rule = BLOCK if verification == "block" else STANDARD
    samples = []
    for i in range(runs):
        drafter = ShapeDrafter(dm, config, choice=RotatingChoice(["chain", "drafts", "sampled"], offset=i % 3))
        samples.append(Speculator(tm, drafter, config, rule, generator=make_generator(i)).run([0], 3).tokens)
    return law, np.array(samples)


SETTINGS = [(SamplingConfig(1.0), "block"), (SamplingConfig(0.8, top_k=2), "block"),
            (SamplingConfig(1.0, top_p=0.8), "token")]


@pytest.mark.montecarlo
@pytest.mark.parametrize("config,verification", SETTINGS, ids=["T=1,block", "T=0.8,top_k=2,block", "T=1,top_p=0.8,token"])
def test_output_law_of_first_three_tokens_is_the_target_law(config, verification):
    law, samples = _law_and_samples(config, verification)
    assert chi_square_pvalue(encode(samples, 4), law) > P_MIN


@pytest.mark.montecarlo
def test_chi_square_catches_a_biased_tree_round(monkeypatch):
    # same instance, runs and test as the lossless check (top-k setting); only the tree rounds are biased
    # (every sibling tested against the target itself: the residual is not updated after a rejection)
    monkeypatch.setattr(verify_module, "recursive_rejection_sampling", no_residual_update)
    law, samples = _law_and_samples(*SETTINGS[1])
    assert chi_square_pvalue(encode(samples, 4), law) < P_MIN


def test_greedy_is_the_targets_greedy_decoding():
    for seed in range(3):
        tm, dm = chain_models(seed, states=6, noise=0.8)
        ar = autoregressive_decode(tm, [seed % 6, 2], 30, temperature=0.0)
        sd = speculative_decode(tm, dm, [seed % 6, 2], 30, temperature=0.0, seed=seed, shape="auto")
        assert sd.tokens == ar.tokens and sd.metrics.rejections > 0
        assert "T = 0" in sd.method


def test_the_predicted_value_is_the_mean_accepted_count_of_each_shape():
    """The shapes are ranked by E[X | drafted tree] (block rule: Σ P(τ ≥ i); trees: recursive rejection,
    coins integrated out). Over many rounds its mean must equal the mean accepted count the engine
    realises, per shape. Tolerance: 4 standard errors of the per-round difference (accepted − value),
    whose mean is 0 when the value is exact; a value that ignored the residual update (each sibling
    accepted with min(1, p/q)) over-rates the 2-draft rounds by 0.21 tokens here (6.2 SE: checked by
    patching theory.rejections.residual_chain to return the target for every sibling)."""
    target, draft = chain_pair(7, states=5, noise=0.8)
    tm, dm = ChainModel(target), ChainModel(draft)
    config = SamplingConfig(1.0)
    diffs = {"chain": [], "drafts": [], "sampled": []}

    class Recording(ShapeDrafter):
        def observe(self, feedback):
            super().observe(feedback)
            if len(feedback.tree) and feedback.target_laws is not None:
                diffs[feedback.tree.shape].append(feedback.verdict.accepted - drafted_value(feedback))

    for i in range(60):
        drafter = Recording(dm, config, choice=RotatingChoice(["chain", "drafts", "sampled"], offset=i % 3))
        Speculator(tm, drafter, config, BLOCK, generator=make_generator(100 + i)).run([i % 5], 60)
    for name, d in diffs.items():
        d = np.asarray(d)
        assert len(d) > 300, name
        se = d.std(ddof=1) / np.sqrt(len(d))
        assert abs(d.mean()) < 4 * se + 1e-12, (name, d.mean(), se)


def test_tree_rounds_are_verified_by_recursive_rejection_chain_rounds_by_block():
    tm, dm = chain_models(2, states=5, noise=0.7)
    config = SamplingConfig(1.0)
    seen = {}

    class Recording(ShapeDrafter):
        def observe(self, feedback):
            super().observe(feedback)
            if len(feedback.tree):
                seen.setdefault(feedback.tree.shape, []).append(feedback.verdict.block_accept_probs is not None)

    drafter = Recording(dm, config, choice=RotatingChoice(["chain", "drafts", "sampled"]))
    out = Speculator(tm, drafter, config, BLOCK, generator=make_generator(0)).run([1], 40)
    assert all(seen["chain"]) and not any(seen["drafts"]) and not any(seen["sampled"])
    assert "block verification of its chain rounds" in out.method


# ------------------------------------------------------------------ the choice rule
def test_choice_schedule_warmup_trials_then_the_best_with_doubling_retries():
    choice = ShapeChoice(["chain", "drafts", "sampled"], warmup=4, trial=2, explore_every=8)
    rates = {"chain": 10.0, "drafts": 6.0, "sampled": 14.0}       # tokens per second of each shape
    picks = []
    for _ in range(200):
        name = choice.choose()
        picks.append(name)
        choice.record(name, rates[name] * 0.1, 0.1)
    assert picks[:4] == ["chain"] * 4
    assert picks[4:8] == ["drafts", "drafts", "sampled", "sampled"]
    assert choice.best() == "sampled"
    assert picks.count("sampled") > 180
    # losers are retried after 8 rounds, then 16, 32, 64, 128 (doubling, capped at 16 x 8)
    retries = [i + 1 for i, p in enumerate(picks) if p == "chain" and i >= 8]
    assert len(retries) <= 5 and np.all(np.diff(retries) >= 16)


def test_a_retried_shape_that_now_wins_takes_over():
    choice = ShapeChoice(["chain", "drafts"], warmup=0, trial=1, explore_every=2, memory=0.5)
    rates = {"chain": 10.0, "drafts": 5.0}
    for _ in range(10):
        n = choice.choose()
        choice.record(n, rates[n], 1.0)
    assert choice.best() == "chain"
    rates = {"chain": 5.0, "drafts": 20.0}                        # the text changes
    picks = []
    for _ in range(60):
        n = choice.choose()
        picks.append(n)
        choice.record(n, rates[n], 1.0)
    assert choice.best() == "drafts" and picks[-20:].count("drafts") >= 18


def test_bad_input():
    tm, dm = chain_models(0)
    with pytest.raises(SpecboundError, match="shape must be"):
        speculative_decode(tm, dm, [0], 5, shape="tree")
    for kwargs in (dict(gamma=4), dict(tree=4), dict(drafts=2), dict(relaxation="opt:0.1")):
        with pytest.raises(SpecboundError, match="shape='auto'"):
            DraftSpec(shape="auto", **kwargs)
    with pytest.raises(SpecboundError, match="distinct"):
        ShapeChoice(["chain", "chain"])
    with pytest.raises(SpecboundError, match="rank"):
        ShapeDrafter(dm, SamplingConfig(1.0), choice=ShapeChoice(["chain"]))
    assert DraftSpec(shape="auto", verification="auto").verification == "block"
