"""Batch speculative decoding theory (Yin et al. 2024, Thm 3, Prop. 1; docs/paper-notes.md, Yin §5 items 3, 4).

Design B (branch at the round start) has the derived f-recursion of docs/paper-notes.md, Yin §3.3;
design A (prefix-tree DFS) has a derived (state, surviving candidates) recursion. Both are checked
against the pure-NumPy simulator.
"""
import numpy as np
import pytest

from helpers import chi_square_pvalue, encode
from specbound.errors import SpecboundError
from specbound.theory import MarkovChain, expected_rejections
from specbound.theory.rejections import (
    _design_a_per_position, _simulate_batch, batch_expected_rejections, batch_expected_target_calls,
    batch_improvement, batch_rejections_limit, batch_rejections_per_position, batch_round_starts,
    batch_target_calls_limit, bernoulli_all_reject, bernoulli_batch_improvement, expected_target_calls,
    residual_chain, simulate_batch_rejections, uniform_all_reject, uniform_batch_improvement,
)
from specbound.theory.distributions import tv

DRAFT_2 = np.array([[0.6, 0.4], [0.3, 0.7]])
TARGET_2 = np.array([[0.2, 0.8], [0.5, 0.5]])
HAND_DRAFT = MarkovChain([1.0, 0.0], DRAFT_2)
HAND_TARGET = MarkovChain([1.0, 0.0], TARGET_2)

T7 = 12
DRAFT_7 = MarkovChain.random(7, horizon=T7, seed=11)
TARGET_7 = MarkovChain.random(7, horizon=T7, seed=12)
N_RUNS = 20_000


# ------------------------------------------------------------------ hand-checkable two-state table

@pytest.mark.parametrize("drafts, reference", [
    (1, 0.928), (2, 0.725504), (3, 0.611952), (4, 0.545919), (5, 0.506840),
])
def test_two_state_reference_table(drafts, reference):
    value = batch_expected_rejections(target=HAND_TARGET, draft=HAND_DRAFT, horizon=3, drafts=drafts)
    assert value == pytest.approx(reference, abs=1e-6)


def test_two_state_limit_and_sd():
    assert expected_rejections(target=HAND_TARGET, draft=HAND_DRAFT, horizon=3) == pytest.approx(0.928, abs=1e-12)
    assert batch_rejections_limit(target=HAND_TARGET, draft=HAND_DRAFT, horizon=3) == pytest.approx(0.448, abs=1e-6)
    # M → ∞ is approached from above: M = 200 is within 1e-9 of the limit
    assert batch_expected_rejections(target=HAND_TARGET, draft=HAND_DRAFT, horizon=3,
                                     drafts=200) == pytest.approx(0.448, abs=1e-9)


def test_two_state_design_a_hand_values():
    # Derived here (recursion over surviving candidates); A ≤ B, equal at M = 1.
    a_values = [batch_expected_rejections(target=HAND_TARGET, draft=HAND_DRAFT, horizon=3, drafts=m,
                                          design="A") for m in (1, 2, 3, 4, 5)]
    np.testing.assert_allclose(a_values, [0.928, 0.681776, 0.535437344, 0.442490094656, 0.3797593222887681],
                               atol=1e-12)
    # full support: design A's rejections vanish as M grows (unlike design B, Prop. 1)
    assert batch_expected_rejections(target=HAND_TARGET, draft=HAND_DRAFT, horizon=3, drafts=300, design="A") < 1e-6


# ------------------------------------------------------------------ exact properties on S = 7

@pytest.mark.parametrize("design", ["A", "B"])
def test_single_draft_equals_theorem_1(design):
    sd = expected_rejections(target=TARGET_7, draft=DRAFT_7, horizon=T7)
    assert batch_expected_rejections(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=1,
                                     design=design) == pytest.approx(sd, abs=1e-12)
    assert batch_improvement(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=1,
                             design=design) == pytest.approx(0.0, abs=1e-12)


def test_monotone_in_drafts_and_positive_at_1000():
    values_b = [batch_expected_rejections(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=m) for m in range(1, 21)]
    assert np.all(np.diff(values_b) < 0)
    limit = batch_rejections_limit(target=TARGET_7, draft=DRAFT_7, horizon=T7)
    big = batch_expected_rejections(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=1000)
    assert big > 0 and limit > 0
    # Dirichlet(0.5) rows give tiny draft probabilities, so ρ_M decays slowly: limit < E(1000) < E(20)
    assert limit < big < values_b[-1]
    values_a = [batch_expected_rejections(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=m,
                                          design="A") for m in range(1, 11)]
    assert np.all(np.diff(values_a) < 0)
    assert np.all(np.array(values_a) <= np.array(values_b[:10]) + 1e-12)      # A ≤ B


def test_improvement_is_theorem_1_minus_theorem_3():
    sd = expected_rejections(target=TARGET_7, draft=DRAFT_7, horizon=T7)
    for m in (2, 5, 8):
        for design in ("A", "B"):
            batch = batch_expected_rejections(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=m, design=design)
            assert batch_improvement(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=m,
                                     design=design) == pytest.approx(sd - batch, abs=1e-12)
    per_position = batch_rejections_per_position(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=4)
    assert per_position.shape == (T7,)
    assert per_position.sum() == pytest.approx(batch_expected_rejections(target=TARGET_7, draft=DRAFT_7, horizon=T7,
                                                                         drafts=4), abs=1e-12)
    # first position: a round surely starts there, so P(R_1) = E_{x_0}[ρ_M]
    rho = residual_chain(target=TARGET_7.transitions[0], draft=DRAFT_7.transitions[0], drafts=4)[1][:, -1]
    assert per_position[0] == pytest.approx(TARGET_7.initial @ rho, abs=1e-14)
    f = batch_round_starts(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=4)
    mu = TARGET_7.marginals(T7)[:-1]
    assert np.all(f >= -1e-15) and np.all(f <= mu + 1e-15)


def test_design_a_recursion_without_branching_is_design_b():
    for m in (2, 3, 6):
        no_branch = _design_a_per_position(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=m, branching=False)
        np.testing.assert_allclose(no_branch, batch_rejections_per_position(target=TARGET_7, draft=DRAFT_7,
                                                                            horizon=T7, drafts=m),
                                   atol=1e-12)


def test_support_mismatch_limit():
    # the target puts mass where the draft has none: ρ_M stays ≥ that mass for every M
    draft = MarkovChain([1.0, 0.0, 0.0], [[0.5, 0.5, 0.0]] * 3)
    target = MarkovChain([1.0, 0.0, 0.0], [[0.2, 0.3, 0.5]] * 3)
    residuals, rho = residual_chain(target=target.transitions[0], draft=draft.transitions[0], drafts=50)
    assert rho[-1] == pytest.approx(0.5, abs=1e-12)
    np.testing.assert_allclose(residuals[-1], [0, 0, 1], atol=1e-12)
    limit = batch_rejections_limit(target=target, draft=draft, horizon=4)
    assert batch_expected_rejections(target=target, draft=draft, horizon=4, drafts=60) == pytest.approx(limit,
                                                                                                        abs=1e-12)
    assert limit >= 4 * 0.5 - 1e-12


# ------------------------------------------------------------------ horizon 0

def test_horizon_zero_gives_zero_or_empty_everywhere():
    kw = dict(target=TARGET_7, draft=DRAFT_7, horizon=0)
    assert expected_rejections(**kw) == 0.0
    assert expected_target_calls(**kw) == 0.0
    for design in ("A", "B"):
        assert batch_rejections_per_position(**kw, drafts=3, design=design).shape == (0,)
        assert batch_expected_rejections(**kw, drafts=3, design=design) == 0.0
        assert batch_improvement(**kw, drafts=3, design=design) == 0.0
        assert batch_expected_target_calls(**kw, drafts=3, design=design) == 0.0
        assert simulate_batch_rejections(**kw, drafts=3, design=design, n_runs=5, seed=0).tolist() == [0] * 5
    assert batch_rejections_limit(**kw) == 0.0
    assert batch_target_calls_limit(**kw) == 0.0
    assert batch_round_starts(**kw, drafts=3).shape == (0, 7)
    assert batch_round_starts(**kw, drafts=None).shape == (0, 7)


# ------------------------------------------------------------------ target calls (rounds) when drafting to T

def _enumerate_rounds(target, draft, horizon, drafts):
    """(E[#rounds], E[N_rej]) of Alg. 1 (drafts=1) or batch design B, by exhaustive enumeration of every
    draft sequence and every accept/reject outcome — an independent implementation of the algorithms,
    not of the formulas. Exponential: tiny S, T, M only."""
    from functools import lru_cache
    from itertools import product

    states = target.n_states

    def accept_prob(resid, draft_row, y):
        return 1.0 if draft_row[y] <= resid[y] else resid[y] / draft_row[y]

    def chain_rest(t, prev, rest):
        """Alg. 1 along one draft sequence from position t (x_{t-1} = prev); returns (rounds, rejections)."""
        if t > horizon:
            return 0.0, 0.0                              # position T accepted: the round ends, no rejection
        target_row, draft_row = target.transition(t - 1)[prev], draft.transition(t - 1)[prev]
        a = accept_prob(target_row, draft_row, rest[0])
        rounds = rejections = 0.0
        if a > 0:
            r, k = chain_rest(t + 1, rest[0], rest[1:])
            rounds, rejections = a * r, a * k
        if a < 1:
            excess = np.clip(target_row - draft_row, 0, None)
            resid = excess / excess.sum()
            r, k = after_rejection(t, resid)
            rounds, rejections = rounds + (1 - a) * r, rejections + (1 - a) * k
        return rounds, rejections

    def after_rejection(t, resid):
        rounds, rejections = 0.0, 1.0
        for z in range(states):
            if resid[z] > 0:
                r, k = round_from(t + 1, z)
                rounds, rejections = rounds + resid[z] * r, rejections + resid[z] * k
        return rounds, rejections

    @lru_cache(maxsize=None)
    def round_from(n, s):
        """A new round starts at position n with x_{n-1} = s (one target call) — design B / Alg. 1."""
        if n > horizon:
            return 0.0, 0.0
        seqs = list(product(range(states), repeat=horizon - n + 1))
        probs = []
        for seq in seqs:
            prob, prev = 1.0, s
            for i, y in enumerate(seq):
                prob *= draft.transition(n - 1 + i)[prev, y]
                prev = y
            probs.append(prob)
        target_row, draft_row = target.transition(n - 1)[s], draft.transition(n - 1)[s]
        rounds, rejections = 1.0, 0.0
        for combo in product(range(len(seqs)), repeat=drafts):
            weight = float(np.prod([probs[c] for c in combo]))
            if weight == 0:
                continue
            resid, reach = target_row.copy(), 1.0         # recursive rejection sampling at position n
            for c in combo:
                y = seqs[c][0]
                a = accept_prob(resid, draft_row, y)
                r, k = chain_rest(n + 1, y, seqs[c][1:])
                rounds, rejections = rounds + weight * reach * a * r, rejections + weight * reach * a * k
                reach *= 1 - a
                if reach == 0:
                    break
                excess = np.clip(resid - draft_row, 0, None)
                resid = excess / excess.sum()
            if reach > 0:                                 # every candidate rejected: x_n ~ r^M
                r, k = after_rejection(n, resid)
                rounds, rejections = rounds + weight * reach * r, rejections + weight * reach * k
        return rounds, rejections

    out = [round_from(1, s) for s in range(states)]
    return (float(target.initial @ np.array([o[0] for o in out])),
            float(target.initial @ np.array([o[1] for o in out])))


SMALL_TARGET = MarkovChain.random(3, horizon=3, concentration=0.8, seed=21)
SMALL_DRAFT = SMALL_TARGET.perturbed(0.8, seed=22)


@pytest.mark.parametrize("target, draft, horizon", [(HAND_TARGET, HAND_DRAFT, 3), (SMALL_TARGET, SMALL_DRAFT, 3),
                                                    (HAND_TARGET, HAND_DRAFT, 1)])
@pytest.mark.parametrize("drafts", [1, 2, 3])
def test_target_calls_match_exhaustive_enumeration(target, draft, horizon, drafts):
    rounds, rejections = _enumerate_rounds(target, draft, horizon, drafts)
    kw = dict(target=target, draft=draft, horizon=horizon)
    assert batch_expected_rejections(**kw, drafts=drafts) == pytest.approx(rejections, abs=1e-12)
    assert batch_expected_target_calls(**kw, drafts=drafts) == pytest.approx(rounds, abs=1e-12)
    if drafts == 1:
        assert expected_target_calls(**kw) == pytest.approx(rounds, abs=1e-12)
    # rounds ≠ rejections on these instances: the final round often ends by accepting position T
    assert rounds - rejections > 0.1


def test_target_calls_hand_value_and_limits():
    # 2-state chain, T = 3: E[N_rej] = 0.4 + 0.24 + 0.288, P(R_3) = 0.44·0.4 + 0.56·0.2 = 0.288
    assert expected_target_calls(target=HAND_TARGET, draft=HAND_DRAFT, horizon=3) == pytest.approx(
        0.928 + 1 - 0.288, abs=1e-12)
    # identical chains: one round accepts everything (the speed-up is T, not T/0 = ∞)
    assert expected_target_calls(target=TARGET_7, draft=TARGET_7, horizon=T7) == pytest.approx(1.0, abs=1e-12)
    assert batch_expected_target_calls(target=TARGET_7, draft=TARGET_7, horizon=T7, drafts=4) == pytest.approx(
        1.0, abs=1e-12)
    # disjoint supports: every position is rejected, one call per token
    initial = np.full(4, 0.25)
    tgt = MarkovChain(initial, np.tile([0.5, 0.5, 0.0, 0.0], (4, 1)))
    drf = MarkovChain(initial, np.tile([0.0, 0.0, 0.5, 0.5], (4, 1)))
    assert expected_target_calls(target=tgt, draft=drf, horizon=7) == pytest.approx(7.0)
    assert batch_target_calls_limit(target=tgt, draft=drf, horizon=7) == pytest.approx(7.0)


def test_target_calls_decrease_with_drafts_toward_the_limit():
    calls = [batch_expected_target_calls(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=m) for m in (1, 2, 4, 8)]
    assert calls[0] == pytest.approx(expected_target_calls(target=TARGET_7, draft=DRAFT_7, horizon=T7), abs=1e-12)
    assert np.all(np.diff(calls) < 0)
    limit = batch_target_calls_limit(target=TARGET_7, draft=DRAFT_7, horizon=T7)
    assert 1.0 <= limit < calls[-1]
    # full-support two-state chain: M = 200 is already at the M → ∞ value (ρ_M decays geometrically)
    hand = dict(target=HAND_TARGET, draft=HAND_DRAFT, horizon=3)
    assert batch_target_calls_limit(**hand) == pytest.approx(batch_expected_target_calls(**hand, drafts=200),
                                                             abs=1e-9)


# ------------------------------------------------------------------ residual chain and closed forms

def test_residual_chain_shapes_normalisation_and_product():
    rng = np.random.default_rng(5)
    draft = rng.dirichlet(np.ones(6), size=(3, 4))
    target = rng.dirichlet(np.ones(6), size=(3, 4))
    residuals, rho = residual_chain(target=target, draft=draft, drafts=5)
    assert residuals.shape == (3, 4, 6, 6) and rho.shape == (3, 4, 6)
    np.testing.assert_allclose(residuals.sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(residuals[..., 0, :], target)
    np.testing.assert_allclose(rho[..., 1], tv(draft, target), atol=1e-14)
    product = np.cumprod(tv(draft[..., None, :], residuals[..., :-1, :]), axis=-1)
    np.testing.assert_allclose(rho[..., 1:], product, atol=1e-14)
    # the mixture of accepted mass and final residual reproduces the target (RRS is unbiased)
    accepted = sum(np.minimum(rho[..., k, None] * draft, rho[..., k, None] * residuals[..., k, :])
                   for k in range(5))
    np.testing.assert_allclose(accepted + rho[..., 5, None] * residuals[..., 5, :], target, atol=1e-13)


def test_residual_chain_stops_when_tv_vanishes():
    law = np.array([0.2, 0.3, 0.5])
    residuals, rho = residual_chain(target=law, draft=law, drafts=3)
    np.testing.assert_array_equal(rho, [1.0, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(residuals, np.broadcast_to(law, (4, 3)))


@pytest.mark.parametrize("draft_p1, target_p1", [(0.6, 0.2), (0.3, 0.9), (0.1, 0.15), (0.0, 0.4), (0.5, 0.5)])
def test_bernoulli_closed_form_matches_residual_chain(draft_p1, target_p1):
    draft = np.array([1 - draft_p1, draft_p1])
    target = np.array([1 - target_p1, target_p1])
    rho = residual_chain(target=target, draft=draft, drafts=12)[1]
    drafts = np.arange(1, 13)
    np.testing.assert_allclose(bernoulli_all_reject(target_p1=target_p1, draft_p1=draft_p1, drafts=drafts), rho[1:],
                               atol=1e-12, rtol=0)
    np.testing.assert_allclose(bernoulli_batch_improvement(target_p1=target_p1, draft_p1=draft_p1, drafts=drafts),
                               rho[1] - rho[1:],
                               atol=1e-12, rtol=0)


@pytest.mark.parametrize("k, m", [(5, 2), (10, 1), (7, 7), (20, 13)])
def test_uniform_closed_form_matches_residual_chain(k, m):
    draft = np.full(k, 1.0 / k)
    target = np.zeros(k)
    target[:m] = 1.0 / m
    rho = residual_chain(target=target, draft=draft, drafts=15)[1]
    drafts = np.arange(1, 16)
    np.testing.assert_allclose(uniform_all_reject(target_support=m, draft_support=k, drafts=drafts), rho[1:],
                               atol=1e-12, rtol=0)
    np.testing.assert_allclose(uniform_batch_improvement(target_support=m, draft_support=k, drafts=drafts),
                               rho[1] - rho[1:], atol=1e-12, rtol=0)
    gains = uniform_batch_improvement(target_support=m, draft_support=k, drafts=drafts)
    assert np.all(np.diff(gains) >= 0) and np.all(gains <= 1 - m / k + 1e-15)   # saturates at TV


def test_bad_inputs_raise():
    with pytest.raises(SpecboundError):
        batch_expected_rejections(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=0)
    with pytest.raises(SpecboundError):
        batch_expected_rejections(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=2.5)
    with pytest.raises(SpecboundError):
        batch_expected_rejections(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=2, design="C")
    with pytest.raises(SpecboundError):
        batch_expected_rejections(target=TARGET_7, draft=HAND_DRAFT, horizon=3, drafts=2)
    with pytest.raises(SpecboundError):
        residual_chain(target=[0.5, 0.5], draft=[0.5, 0.6], drafts=2)
    with pytest.raises(SpecboundError):
        uniform_all_reject(target_support=4, draft_support=3, drafts=2)
    with pytest.raises(SpecboundError):
        bernoulli_all_reject(target_p1=0.3, draft_p1=1.2, drafts=2)
    with pytest.raises(SpecboundError):
        simulate_batch_rejections(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=2, design="B", n_runs=0)


# ------------------------------------------------------------------ Monte Carlo (design A and B)

MC_REJECTIONS = {}


def _mc(drafts, design):
    key = (drafts, design)
    if key not in MC_REJECTIONS:
        seed = 1000 * drafts + ord(design)
        MC_REJECTIONS[key] = simulate_batch_rejections(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=drafts,
                                                       design=design, n_runs=N_RUNS, seed=seed)
    return MC_REJECTIONS[key]


@pytest.mark.montecarlo
@pytest.mark.parametrize("design", ["B", "A"])
@pytest.mark.parametrize("drafts", [1, 2, 4, 5, 8])
def test_monte_carlo_matches_exact(drafts, design):
    rejections = _mc(drafts, design)
    exact = batch_expected_rejections(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=drafts, design=design)
    # SE = sample std / sqrt(N); with N = 20 000 runs and std ≈ 1.3–1.7 rejections, SE ≈ 0.009–0.012
    se = rejections.std(ddof=1) / np.sqrt(len(rejections))
    assert 0.005 < se < 0.02
    assert abs(rejections.mean() - exact) <= 4 * se, (rejections.mean(), exact, se)


def _frozen_residual(resid, *, target_rows, draft_rows):
    """Planted bug: after any rejection the plain [target − draft]_+ residual is reused (no RRS update)."""
    excess = np.clip(target_rows - draft_rows, 0.0, None)
    return excess / excess.sum(-1, keepdims=True)


def _first_two_tokens_pvalue(paths):
    # exact target law of (x_1, x_2) with x_0 ~ target.initial
    law = np.einsum("a,ab,bc->bc", TARGET_7.initial, TARGET_7.transitions[0], TARGET_7.transitions[1])
    return chi_square_pvalue(encode(paths[:, 1:3], 7), law)


@pytest.mark.montecarlo
@pytest.mark.parametrize("design", ["A", "B"])
def test_batch_output_is_unbiased_and_planted_bias_is_caught(design):
    _, paths = simulate_batch_rejections(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=4, design=design,
                                         n_runs=N_RUNS, seed=77, return_paths=True)
    assert _first_two_tokens_pvalue(paths) > 1e-3
    # per-position marginals also match the target chain within 4 standard errors
    exact = TARGET_7.marginals(T7)
    for step in (3, 7, T7):
        freq = np.bincount(paths[:, step], minlength=7) / N_RUNS
        se = np.sqrt(exact[step] * (1 - exact[step]) / N_RUNS)
        assert np.all(np.abs(freq - exact[step]) <= 4 * se + 1e-12), step
    _, bad_paths = _simulate_batch(target=TARGET_7, draft=DRAFT_7, horizon=T7, drafts=4, design=design, n_runs=N_RUNS,
                                   rng=np.random.default_rng(77), residual_step=_frozen_residual)
    assert _first_two_tokens_pvalue(bad_paths) < 1e-3
