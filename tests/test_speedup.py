"""Cost model of theory/speedup.py (the sizing policy itself is tested in test_policy.py)."""
import numpy as np
import pytest

from specbound.decoding import speculative_decode
from specbound.errors import SpecboundError
from specbound.models import ChainModel
from specbound.theory import MarkovChain
from specbound.theory.speedup import CostProfile, best_gamma, expected_speedup, expected_tokens_per_step


def test_tokens_per_step_closed_form_and_positional_form():
    for alpha in (0.0, 0.3, 0.8, 0.99):
        for gamma in range(0, 9):
            closed = gamma + 1 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
            assert expected_tokens_per_step(alpha, gamma) == pytest.approx(closed)
    assert expected_tokens_per_step([0.5, 1.0, 0.5], 3) == pytest.approx(1 + 0.5 + 0.5 + 0.25)


@pytest.mark.montecarlo
def test_tokens_per_step_matches_engine_with_iid_acceptance():
    # a target that is uniform and a draft that is uniform on a subset: acceptance is exactly
    # |subset|/|vocab| at every position, i.i.d.
    vocab, subset, gamma = 5, 4, 3
    target = MarkovChain(np.full(vocab, 1 / vocab), np.full((vocab, vocab), 1 / vocab))
    rows = np.zeros((vocab, vocab))
    rows[:, :subset] = 1 / subset
    draft = MarkovChain(np.full(vocab, 1 / vocab), rows)
    alpha = subset / vocab
    calls, tokens = 0, 0
    for seed in range(300):
        res = speculative_decode(ChainModel(target), ChainModel(draft), [0], 40, gamma=gamma, seed=seed)
        full_rounds = res.metrics.drafted_per_step[:-1]          # the last round may be cut by the budget
        calls += len(full_rounds)
        tokens += sum(a + 1 for a in res.metrics.accepted_per_step[:-1])
    expected = expected_tokens_per_step(alpha, gamma)
    # per-round tokens have sd ≤ 1.3 here; with > 3000 rounds 4 SE < 0.1
    assert tokens / calls == pytest.approx(expected, abs=0.1)


def test_speedup_under_yin_assumption_is_tokens_per_step():
    free = CostProfile.constant(1.0)
    assert expected_speedup(0.8, 4, 0.0, free) == pytest.approx(expected_tokens_per_step(0.8, 4))


def test_best_gamma_falls_back_to_plain_decoding_when_speculation_loses():
    steep = CostProfile((1, 2, 4, 8), (1.0, 3.0, 4.0, 6.0))      # repacking GEMM: k=2 costs 3x k=1
    gamma, gain = best_gamma(0.6, 0.4, steep)
    assert gamma == 0 and gain == pytest.approx(1.0)
    flat = CostProfile((1, 2, 4, 8, 16), (1.0, 1.05, 1.1, 1.3, 1.9))
    gamma, gain = best_gamma(0.85, 0.1, flat)
    assert gamma >= 4 and gain > 2
    with pytest.raises(SpecboundError):
        CostProfile((2, 1), (1.0, 1.0))
    with pytest.raises(SpecboundError):
        expected_tokens_per_step(1.5, 3)


def test_auto_gamma_is_lossless_at_greedy():
    target = MarkovChain.random(6, seed=3, concentration=0.3)
    draft = target.perturbed(0.3, seed=4)
    tm, dm = ChainModel(target), ChainModel(draft)
    auto = speculative_decode(tm, dm, [1], 50, gamma="auto", temperature=0.0)
    fixed = speculative_decode(tm, dm, [1], 50, gamma=1, temperature=0.0)
    assert auto.tokens == fixed.tokens


def test_greedy_chain_rounds_follow_the_text():
    """Hand-worked: matches T T F T T T F F give run lengths 2 1 0 3 2 1 0 0; a chain of γ = 2 commits
    3, 3, 1, 1 tokens in 4 rounds, an unbounded chain 3, 4, 1 in 3 rounds, γ = 0 one per round."""
    from specbound.theory.speedup import accepted_run_lengths, greedy_chain_rounds

    matches = [True, True, False, True, True, True, False, False]
    assert accepted_run_lengths(matches).tolist() == [2, 1, 0, 3, 2, 1, 0, 0]
    assert greedy_chain_rounds(matches, 2) == (4, 8)
    assert greedy_chain_rounds(matches, 10) == (3, 8)
    assert greedy_chain_rounds(matches, 0) == (8, 8)
    assert greedy_chain_rounds([], 4) == (0, 0)


def test_speed_of_light_speedup_picks_the_capacity_by_hand():
    """Free drafting: speed-up(P) = (1 + E[X](P))·t(1)/t(P + 1). With t = 1 s up to 4 tokens, 2 s at 8,
    4 s at 16: P=1 → 1.8/1, P=3 → 2.9/1, P=7 → 3.6/2, P=15 → 4.2/4; the best is P = 3 at 2.9×."""
    from specbound.theory import CostProfile, speed_of_light_speedup

    cost = CostProfile((1, 2, 4, 8, 16), (1.0, 1.0, 1.0, 2.0, 4.0))
    best, speedup = speed_of_light_speedup({1: 0.8, 3: 1.9, 7: 2.6, 15: 3.2}, cost)
    assert best == 3 and speedup == pytest.approx(2.9, rel=1e-12)
    # a flat cost (Yin et al.'s Assumption 1) always prefers the largest tree value
    assert speed_of_light_speedup({1: 0.8, 3: 1.9, 7: 2.6}, CostProfile.constant()) == (7, pytest.approx(3.6))
    with pytest.raises(SpecboundError, match="at least one capacity"):
        speed_of_light_speedup({}, cost)


def test_whole_chains_and_the_reads_they_cost():
    """Hand-worked on matches T T F T T T F F (runs 2 1 0 3 2 1 0 0): γ = 1 rounds start at 0, 2, 3, 5, 7 and
    accept 1, 0, 1, 1, 0 — three whole; γ = 2 starts at 0, 3, 6, 7 (2, 2, 0, 0: two whole); γ = 10 never."""
    from specbound.errors import SpecboundError
    from specbound.theory.speedup import (
        chain_draft_seconds, chain_full_acceptance, greedy_chain_full_rounds, greedy_chain_rounds,
    )

    matches = [True, True, False, True, True, True, False, False]
    assert [greedy_chain_full_rounds(matches, g) for g in (1, 2, 10, 0)] == [3, 2, 0, 0]
    assert greedy_chain_rounds(matches, 1) == (5, 8)
    assert chain_full_acceptance([0.9, 0.8], 2) == pytest.approx(0.72)
    assert chain_full_acceptance([0.9, 0.8], 4) == pytest.approx(0.9 * 0.8 ** 3)     # the last rate reused
    assert chain_full_acceptance(0.5, 0) == 1.0
    # γ one-token reads, plus d(2) − d(1) for the share of rounds that follow a whole chain
    assert chain_draft_seconds(3, 0.010, 0.008, 0.5) == pytest.approx(0.034)
    assert chain_draft_seconds(0, 0.010, 0.008, 1.0) == 0.0
    with pytest.raises(SpecboundError, match="chain_draft_seconds"):
        chain_draft_seconds(2, 0.01, 0.008, 1.5)
