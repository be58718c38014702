"""Theory layer: distances, residuals, MarkovChain, Yin et al. Thm 1 and Thm 2 (exact values)."""
import numpy as np
import pytest

from specbound.errors import SpecboundError
from specbound.theory import (
    MarkovChain, entropy, expected_rejections, random_rejection_based_acceptance,
    rejection_based_expected_rejections, rejection_based_output, residual, standard_acceptance,
    surprisal_moments, tv,
)

DRAFT_2 = np.array([[0.6, 0.4], [0.3, 0.7]])
TARGET_2 = np.array([[0.2, 0.8], [0.5, 0.5]])


def test_tv_three_equivalent_forms():
    rng = np.random.default_rng(0)
    a, b = rng.dirichlet(np.ones(9), size=(2, 50))
    half_l1 = 0.5 * np.abs(a - b).sum(-1)
    positive_part = np.clip(b - a, 0, None).sum(-1)
    one_minus_overlap = 1 - np.minimum(a, b).sum(-1)
    np.testing.assert_allclose(tv(a, b), half_l1, atol=1e-15)
    np.testing.assert_allclose(tv(a, b), positive_part, atol=1e-12)
    np.testing.assert_allclose(tv(a, b), one_minus_overlap, atol=1e-12)


def test_residual_is_normalised_positive_part_and_makes_sd_unbiased():
    target = np.array([0.5, 0.3, 0.2, 0.0])
    draft = np.array([0.1, 0.6, 0.1, 0.2])
    np.testing.assert_allclose(residual(target=target, draft=draft), [0.4 / 0.5, 0.0, 0.1 / 0.5, 0.0])
    # accepted mass + rejected mass × residual reproduces the target (Alg. 1 is unbiased)
    accept = standard_acceptance(target=target, draft=draft)
    np.testing.assert_allclose(rejection_based_output(target=target, draft=draft, accept=accept), target, atol=1e-15)
    # identical laws: nothing to resample, the residual falls back to the target
    np.testing.assert_allclose(residual(target=target, draft=target), target)


def test_entropy_and_surprisal_moments_hand_values():
    p = np.array([0.5, 0.25, 0.25, 0.0])
    h, m2 = surprisal_moments(p)
    assert h == pytest.approx(1.5 * np.log(2))
    assert m2 == pytest.approx(0.5 * np.log(2) ** 2 + 0.5 * (2 * np.log(2)) ** 2)
    assert entropy(np.ones(8) / 8) == pytest.approx(np.log(8))


@pytest.mark.montecarlo
def test_chain_marginals_match_sampling():
    chain = MarkovChain.random(4, horizon=6, concentration=0.7, seed=1)
    n = 40_000
    paths = chain.sample(6, size=n, seed=2)
    exact = chain.marginals(6)
    for step in range(7):
        freq = np.bincount(paths[:, step], minlength=4) / n
        se = np.sqrt(exact[step] * (1 - exact[step]) / n)
        assert np.all(np.abs(freq - exact[step]) <= 4 * se + 1e-12), step  # 4 standard errors


def test_sequence_law_sums_to_one_and_factorises():
    chain = MarkovChain.random(3, horizon=4, seed=3)
    law = chain.sequence_law(context=1, length=3)
    assert law.shape == (3, 3, 3) and law.sum() == pytest.approx(1.0)
    t = chain.transitions
    assert law[2, 0, 1] == pytest.approx(t[0][1, 2] * t[1][2, 0] * t[2][0, 1])


def test_thm1_two_state_reference_value():
    draft = MarkovChain([1.0, 0.0], DRAFT_2)
    target = MarkovChain([1.0, 0.0], TARGET_2)
    assert expected_rejections(target=target, draft=draft, horizon=3) == pytest.approx(0.928, abs=1e-12)


def test_thm1_limits_identical_and_disjoint_chains():
    target = MarkovChain.random(5, horizon=10, seed=4)
    assert expected_rejections(target=target, draft=target, horizon=10) == pytest.approx(0.0, abs=1e-12)
    # draft that never proposes a token the target can produce: every position is rejected
    initial = np.full(4, 0.25)
    tgt = MarkovChain(initial, np.tile([0.5, 0.5, 0.0, 0.0], (4, 1)))
    drf = MarkovChain(initial, np.tile([0.0, 0.0, 0.5, 0.5], (4, 1)))
    assert expected_rejections(target=tgt, draft=drf, horizon=7) == pytest.approx(7.0)


def test_thm2_family_never_beats_sd_and_equality_only_at_standard_acceptance():
    rng = np.random.default_rng(5)
    for trial in range(20):
        target = MarkovChain.random(6, horizon=8, seed=rng)
        draft = target.perturbed(0.6, seed=rng)
        thm1 = expected_rejections(target=target, draft=draft, horizon=8)
        b_std = standard_acceptance(target=target.stack(8), draft=draft.stack(8))
        assert rejection_based_expected_rejections(target=target, draft=draft, accept=b_std,
                                                   horizon=8) == pytest.approx(thm1, abs=1e-12)
        b = random_rejection_based_acceptance(target=target, draft=draft, horizon=8, seed=rng)
        value = rejection_based_expected_rejections(target=target, draft=draft, accept=b, horizon=8)
        assert value > thm1 + 1e-6
        # the family is unbiased step by step: output law equals the target row exactly
        out = rejection_based_output(target=target.stack(8), draft=draft.stack(8), accept=b)
        np.testing.assert_allclose(out, target.stack(8), atol=1e-12)


def test_thm2_rejects_over_acceptance():
    target = MarkovChain.random(3, horizon=2, seed=6)
    draft = target.perturbed(0.5, seed=7)
    with pytest.raises(SpecboundError, match="over-accepts"):
        rejection_based_expected_rejections(target=target, draft=draft, accept=np.ones((2, 3, 3)), horizon=2)


@pytest.mark.parametrize("bad, match", [
    (dict(initial=[0.5, 0.6], transitions=np.eye(2)), "not stochastic"),
    (dict(initial=[0.5, 0.5], transitions=[[0.5, 0.6], [0.5, 0.5]]), "not stochastic"),
    (dict(initial=[0.5, 0.5], transitions=[[1.5, -0.5], [0.5, 0.5]]), "negative"),
    (dict(initial=[0.5, 0.5], transitions=[[np.nan, 1.0], [0.5, 0.5]]), "NaN"),
    (dict(initial=[0.5, 0.5], transitions=np.eye(3)), "shaped"),
])
def test_chain_rejects_bad_input(bad, match):
    with pytest.raises(SpecboundError, match=match):
        MarkovChain(**bad)


def test_expected_rejections_rejects_mismatched_states_and_long_horizon():
    a = MarkovChain.random(3, horizon=5, seed=0)
    b = MarkovChain.random(4, horizon=5, seed=0)
    with pytest.raises(SpecboundError, match="vocabularies must match"):
        expected_rejections(target=b, draft=a, horizon=5)
    with pytest.raises(SpecboundError, match="exceeds"):
        expected_rejections(target=a, draft=a, horizon=6)
