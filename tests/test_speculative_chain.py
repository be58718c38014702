"""Speculative decoding on exact Markov-chain models: Thm 1 by Monte Carlo, losslessness by χ²,
greedy identity, a planted-bias mutant that the same χ² test must catch, and bad input."""
import numpy as np
import pytest
import torch

from helpers import DelegatingModel, chain_models, chain_pair, chi_square_pvalue, encode, processed_chain
from specbound.decoding import (
    ChainDrafter, DraftTree, SamplingConfig, Speculator, autoregressive_decode, logits_to_probs, speculative_decode,
)
from specbound.decoding.engine import make_generator
from specbound.decoding.verify import AcceptanceRule
from specbound.errors import SpecboundError
from specbound.models import ChainModel
from specbound.theory import MarkovChain, expected_rejections, rejection_based_expected_rejections, standard_acceptance

P_MIN = 1e-3          # χ² significance level; seeds are fixed so each outcome is deterministic


def _first_tokens(decode, runs, length=3, context=0):
    out = np.empty((runs, length), dtype=np.int64)
    for i in range(runs):
        out[i] = decode(i)[:length]
    return out


# ------------------------------------------------------------------ Thm 1 by Monte Carlo
@pytest.mark.montecarlo
@pytest.mark.parametrize("seed", [11, 12])
def test_thm1_exact_matches_engine_monte_carlo(seed):
    horizon, runs = 10, 5000
    target, draft = chain_pair(seed, states=5, horizon=horizon, concentration=0.5, noise=0.6)
    tm, dm = ChainModel(target), ChainModel(draft)
    initial = target.sample(0, size=runs, seed=seed)[:, 0]           # x_0 ~ initial law
    rejections = np.array([
        speculative_decode(tm, dm, [int(initial[i])], horizon, gamma=None, seed=i).metrics.rejections
        for i in range(runs)
    ])
    exact = expected_rejections(target=target, draft=draft, horizon=horizon)
    se = rejections.std(ddof=1) / np.sqrt(runs)
    assert abs(rejections.mean() - exact) <= 4 * se, (rejections.mean(), exact, se)   # 4 standard errors
    assert 1.0 < exact < horizon - 1.0      # a non-trivial instance


def test_horizon_mode_calls_equal_rejections_plus_final_round():
    target, draft = chain_pair(3, states=5, horizon=12, noise=0.6)
    res = speculative_decode(ChainModel(target), ChainModel(draft), [0], 12, gamma=None, seed=0)
    m = res.metrics
    last_round_rejected = m.accepted_per_step[-1] < m.drafted_per_step[-1]
    assert m.target_calls == m.rejections + (0 if last_round_rejected else 1)
    assert sum(m.accepted_per_step) + m.rejections == 12
    assert len(res.tokens) == 12


# ------------------------------------------------------------------ Thm 2 by Monte Carlo
class ScaledAcceptance(AcceptanceRule):
    """b = min(1, target/draft)·(0.25 + 0.75·target): a member of the unbiased family (Thm 2)."""
    name = "scaled"

    def acceptance(self, *, target, draft):
        return super().acceptance(target=target, draft=draft) * (0.25 + 0.75 * target)


@pytest.mark.montecarlo
def test_thm2_family_member_is_unbiased_and_rejects_more_than_sd():
    horizon, runs = 6, 5000
    target, draft = chain_pair(21, states=3, horizon=horizon, noise=0.5)
    # every run starts from the prompt x_0 = 0, so the exact value is taken with x_0 = 0 too (the chains'
    # own initial laws would average over x_0: a +0.06 offset, 3.5-4.4 SE at this n)
    start = np.eye(3)[0]
    target, draft = MarkovChain(start, target.transitions), MarkovChain(start, draft.transitions)
    mats_t, mats_d = target.stack(horizon), draft.stack(horizon)
    accept = standard_acceptance(target=mats_t, draft=mats_d) * (0.25 + 0.75 * mats_t)
    exact = rejection_based_expected_rejections(target=target, draft=draft, accept=accept, horizon=horizon)
    assert exact > expected_rejections(target=target, draft=draft, horizon=horizon) + 0.1

    tm, dm = ChainModel(target), ChainModel(draft)
    rej, first = np.empty(runs), np.empty((runs, 3), dtype=np.int64)
    for i in range(runs):
        eng = Speculator(tm, ChainDrafter(dm, SamplingConfig(), None), rule=ScaledAcceptance(),
                         generator=make_generator(i))
        res = eng.run([0], horizon)
        rej[i], first[i] = res.metrics.rejections, res.tokens[:3]
    se = rej.std(ddof=1) / np.sqrt(runs)
    assert abs(rej.mean() - exact) <= 4 * se        # 4 standard errors
    assert chi_square_pvalue(encode(first, 3), target.sequence_law(0, 3)) > P_MIN


# ------------------------------------------------------------------ losslessness (χ²)
SETTINGS = [
    dict(temperature=0.7, gamma=2),
    dict(temperature=1.0, gamma=None),
    dict(temperature=1.3, gamma=3),
    dict(temperature=1.0, top_k=2, gamma=2),
    dict(temperature=0.8, top_p=0.7, gamma=1),
]


def _law_and_samples(drafter_cls, setting, runs=5000, seed=31):
    target, draft = chain_pair(seed, states=4, noise=0.7, concentration=1.0)
    tm, dm = ChainModel(target), ChainModel(draft)
    gamma = setting.get("gamma")
    config = SamplingConfig(setting["temperature"], setting.get("top_k"), setting.get("top_p"))
    law = processed_chain(target, config).sequence_law(0, 3)

    def decode(i):
        return Speculator(tm, drafter_cls(dm, config, gamma), generator=make_generator(i)).run([0], 3).tokens
    return law, _first_tokens(decode, runs)


@pytest.mark.montecarlo
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_output_law_of_first_three_tokens_is_target_law(setting):
    law, samples = _law_and_samples(ChainDrafter, setting)
    assert chi_square_pvalue(encode(samples, 4), law) > P_MIN


class RawDraftProbsDrafter(ChainDrafter):
    """Planted bug (a known trap): samples from the processed draft law but records the raw softmax
    of the draft's logits as the law for the acceptance ratio min(1, target/draft)."""

    def propose(self, committed, max_depth, generator):
        k = min(self.gamma or max_depth, max_depth)
        logits = self.cache.start(committed)
        tokens, raw = [], []
        for i in range(k):
            tokens.append(int(torch.multinomial(logits_to_probs(logits, self.sampling), 1, generator=generator)))
            raw.append(torch.softmax(logits, dim=-1))
            if i < k - 1:
                logits = self.cache.read([i], [tokens[-1]], [i - 1])[0]
        return DraftTree.chain(tokens, torch.stack(raw))


@pytest.mark.montecarlo
@pytest.mark.parametrize("setting", [SETTINGS[0], SETTINGS[3]], ids=["T=0.7", "top_k=2"])
def test_chi_square_catches_the_raw_draft_probs_mutant(setting):
    law, samples = _law_and_samples(RawDraftProbsDrafter, setting)
    assert chi_square_pvalue(encode(samples, 4), law) < P_MIN


@pytest.mark.montecarlo
def test_chi_square_has_power_against_a_slightly_wrong_law():
    # the test's power on its own: sampling from a 15% mixture of target and draft rows is detected
    target, draft = chain_pair(31, states=4, noise=0.7)
    mixed = MarkovChain(target.initial, 0.85 * target.transitions + 0.15 * draft.transitions)
    rng = np.random.default_rng(0)
    x, steps = np.zeros(5000, dtype=np.int64), []
    for _ in range(3):
        x = (rng.random(5000)[:, None] > mixed.transitions[x].cumsum(1)).sum(1).clip(max=3)
        steps.append(x)
    assert chi_square_pvalue(encode(np.stack(steps, 1), 4), target.sequence_law(0, 3)) < P_MIN
    assert chi_square_pvalue(encode(np.stack(steps, 1), 4), mixed.sequence_law(0, 3)) > P_MIN


# ------------------------------------------------------------------ greedy identity
@pytest.mark.parametrize("gamma", [1, 3, None])
def test_greedy_speculative_equals_target_greedy(gamma):
    for seed in range(5):
        target, draft = chain_pair(seed, states=6, noise=0.8)
        tm, dm = ChainModel(target), ChainModel(draft)
        sd = speculative_decode(tm, dm, [seed % 6, 2], 25, gamma=gamma, temperature=0.0, seed=seed)
        ar = autoregressive_decode(tm, [seed % 6, 2], 25, temperature=0.0)
        walk, x = [], 2
        for _ in range(25):
            x = int(np.argmax(target.transitions[x]))
            walk.append(x)
        assert sd.tokens == ar.tokens == walk
        assert sd.metrics.rejections > 0      # the draft disagreed somewhere: verification did work


# ------------------------------------------------------------------ bad input
class BrokenModel(DelegatingModel):
    def __init__(self, inner, value):
        super().__init__(inner, "broken")
        self.value = value

    def forward(self, tokens, keep_logits=None):
        logits = self.inner.forward(tokens, keep_logits).clone()
        logits[..., 1] = self.value
        return logits


@pytest.fixture
def models():
    return chain_models(0, states=4, noise=0.6)


def test_bad_input_errors(models):
    tm, dm = models
    other = ChainModel(MarkovChain.random(5, seed=0))
    cases = [
        (lambda: speculative_decode(tm, other, [0], 4), "vocabulary mismatch"),
        (lambda: speculative_decode(tm, dm, [], 4), "empty"),
        (lambda: speculative_decode(tm, dm, [0], 4, temperature=-0.5), "temperature"),
        (lambda: speculative_decode(tm, dm, [0], 4, temperature=float("nan")), "temperature"),
        (lambda: speculative_decode(tm, dm, [0], 4, top_p=0.0), "top_p"),
        (lambda: speculative_decode(tm, dm, [0], 4, top_p=1.5), "top_p"),
        (lambda: speculative_decode(tm, dm, [0], 4, top_k=0), "top_k"),
        (lambda: speculative_decode(tm, dm, [0], 4, gamma=0), "gamma"),
        (lambda: speculative_decode(tm, dm, [0], -1), "max_new_tokens"),
        (lambda: speculative_decode(tm, dm, [7], 4), "outside"),
        (lambda: speculative_decode(BrokenModel(tm, float("nan")), dm, [0], 4), "NaN"),
        (lambda: speculative_decode(tm, BrokenModel(dm, float("inf")), [0], 4), r"\+inf"),
        (lambda: autoregressive_decode(BrokenModel(tm, float("nan")), [0], 4), "NaN"),
    ]
    for call, match in cases:
        with pytest.raises(SpecboundError, match=match):
            call()


def test_chain_model_refuses_positions_beyond_horizon():
    target = ChainModel(MarkovChain.random(3, horizon=4, seed=0))
    with pytest.raises(SpecboundError, match="context of 4 positions"):      # checked before any read
        autoregressive_decode(target, [0], 5)
    assert len(autoregressive_decode(target, [0], 4).tokens) == 4             # x_1..x_4 read positions 0..3
    with pytest.raises(SpecboundError, match="horizon"):
        target.forward(torch.tensor([[0, 1, 2, 0, 1]]))


def test_decoding_stops_right_after_a_stop_token():
    target, draft = chain_pair(7, states=5, noise=0.5)
    tm, dm = ChainModel(target), ChainModel(draft)
    full = speculative_decode(tm, dm, [0], 60, gamma=4, temperature=0.0).tokens
    stop = full[10]
    first = full.index(stop)
    out = speculative_decode(tm, dm, [0], 60, gamma=4, temperature=0.0, stop_token_ids=[stop])
    assert out.tokens == full[:first + 1]
    assert out.metrics.new_tokens == first + 1


def test_relaxed_decoding_honours_stop_tokens():
    target, draft = chain_pair(8, states=5, noise=0.5)
    tm, dm = ChainModel(target), ChainModel(draft)
    full = speculative_decode(tm, dm, [0], 40, gamma=3, seed=1, relaxation=("opt", 0.1)).tokens
    stop = full[5]
    out = speculative_decode(tm, dm, [0], 40, gamma=3, seed=1, relaxation=("opt", 0.1), stop_token_ids=[stop])
    assert out.tokens == full[:full.index(stop) + 1] and not out.lossless
