"""Speed-of-light bounds and entropy moments (Pankratov & Alistarh 2026, §3; docs/paper-notes.md,
Pankratov §5 T3, T4, T5, T7).

Reference numbers come from docs/paper-notes.md, Pankratov §5 (derived formulas and the best-first
search), not from this code.
"""
import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

from specbound.errors import SpecboundError
from specbound.theory import (
    bound_all_forms, bound_is_valid, entropy, entropy_moments, estimate_moments, optimal_tree, speed_of_light,
)

LN2 = math.log(2)
CAPS = np.array([16, 64, 256, 1024, 4096, 16384])


def constant(probs):
    probs = np.asarray(probs, dtype=np.float64)
    return lambda path: probs


# ------------------------------------------------------------------------------------ moments
def test_entropy_moments_reference_values():
    # docs/paper-notes.md, Pankratov §5 T3: the moments of the three identical environments
    for target, mu_ref, mu2_ref, places in [((0.6, 0.25, 0.1, 0.05), 1.0331, 1.6159, 4),
                                            ((0.5, 0.3, 0.2), 1.0297, 1.1931, 4),
                                            ((0.9, 0.05, 0.03, 0.02), 0.428, 1.134, 3)]:
        mu, mu2 = entropy_moments(np.array(target))
        assert mu == pytest.approx(mu_ref, abs=0.6 * 10 ** -places)
        assert mu2 == pytest.approx(mu2_ref, abs=0.6 * 10 ** -places)
    # uniform over V: every surprisal is ln V
    mu, mu2 = entropy_moments(np.full((3, 8), 1 / 8))
    np.testing.assert_allclose(mu, math.log(8))
    np.testing.assert_allclose(mu2, math.log(8) ** 2)
    # 0·ln 0 = 0, one-hot rows have zero moments
    mu, mu2 = entropy_moments(np.array([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]]))
    np.testing.assert_allclose(mu, [0.0, LN2], atol=1e-15)
    np.testing.assert_allclose(mu2, [0.0, LN2 ** 2], atol=1e-15)
    with pytest.raises(SpecboundError, match="stochastic"):
        entropy_moments([0.5, 0.6])


def test_estimate_moments_from_probs_and_logits_agree():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(50, 12)) * 3
    logits[0, :5] = -np.inf                                         # masked tokens
    probs = np.exp(log_softmax(logits, axis=-1))
    a = estimate_moments(probs)
    b = estimate_moments(logits, from_logits=True)
    H, m2 = entropy_moments(probs)
    for est in (a, b):
        assert est.n == 50
        assert est.mu == pytest.approx(H.mean(), rel=1e-10)
        assert est.mu2 == pytest.approx(m2.mean(), rel=1e-10)
        assert est.mean_H2 == pytest.approx((H ** 2).mean(), rel=1e-10)
        assert est.var_surprisal == pytest.approx(m2.mean() - H.mean() ** 2, rel=1e-10)
        assert est.se_mu == pytest.approx(H.std(ddof=1) / math.sqrt(50), rel=1e-8)
        assert est.se_mu2 == pytest.approx(m2.std(ddof=1) / math.sqrt(50), rel=1e-8)
        assert est.mean_H2 <= est.mu2                                # Jensen per row: H² ≤ Σ p ln² p
    # temperature: logits / T, and the same tempering applied to probabilities
    for temperature in (0.5, 2.0):
        ref = entropy(np.exp(log_softmax(logits / temperature, axis=-1))).mean()
        assert estimate_moments(logits, temperature, from_logits=True).mu == pytest.approx(ref, rel=1e-10)
        assert estimate_moments(probs, temperature).mu == pytest.approx(ref, rel=1e-9)
    # huge logits stay finite (stable log-softmax in float64)
    big = estimate_moments(np.array([[1e4, 0.0, -1e4], [3e3, 3e3, 0.0]]), from_logits=True)
    assert big.mu == pytest.approx(LN2 / 2) and math.isfinite(big.mu2)
    single = estimate_moments(np.full(4, 0.25))
    assert single.n == 1 and math.isnan(single.se_mu) and single.mu == pytest.approx(math.log(4))


@pytest.mark.parametrize("temperature", [0, -1.0, float("nan"), float("inf")])
def test_estimate_moments_rejects_bad_temperature(temperature):
    with pytest.raises(SpecboundError, match="temperature"):
        estimate_moments(np.zeros((2, 3)), temperature, from_logits=True)


def test_estimate_moments_rejects_bad_rows():
    with pytest.raises(SpecboundError, match="logits"):
        estimate_moments(np.array([[np.nan, 0.0]]), from_logits=True)
    with pytest.raises(SpecboundError, match="-inf"):
        estimate_moments(np.array([[-np.inf, -np.inf]]), from_logits=True)
    with pytest.raises(SpecboundError, match="from_logits"):
        estimate_moments(np.array([[2.0, -1.0]]))                  # logits passed as probabilities
    with pytest.raises(SpecboundError, match="shaped"):
        estimate_moments(np.zeros((2, 2, 2)))


# ------------------------------------------------------------------------------------ bound forms (T3)
@pytest.mark.parametrize("form,reference,tol", [
    ("asymptotic", [2.472, 3.814, 5.156, 6.498, 7.840, 9.182], 6e-4),
    ("renewal", [4.198, 5.540, 6.881, 8.223, 9.565, 10.907], 6e-4),
    # the reference (Pankratov §5 T3) is rounded to 2 dp from 4-dp moments: 24.0852 → 24.09
    # (exact moments give 24.0850)
    ("published", [6.88, 10.32, 13.76, 17.20, 20.64, 24.09], 6e-3),
])
def test_T3_bound_forms_reference_values(form, reference, tol):
    mu, mu2 = entropy_moments(np.array([0.6, 0.25, 0.1, 0.05]))
    np.testing.assert_allclose(speed_of_light(mu, mu2, CAPS, form=form), reference, atol=tol, rtol=0)


def test_T3_second_distribution_asymptotic_and_peaked_ordering():
    mu, mu2 = entropy_moments(np.array([0.5, 0.3, 0.2]))
    np.testing.assert_allclose(speed_of_light(mu, mu2, [64, 1024, 16384], form="asymptotic"),
                               [3.630, 6.323, 9.016], atol=6e-4, rtol=0)
    # peaked, near-lattice case: E* (reference values, Pankratov §5 T3) ≤ renewal ≤ published
    mu, mu2 = entropy_moments(np.array([0.9, 0.05, 0.03, 0.02]))
    e_star = np.array([9.742, 16.570, 22.665])
    caps = [64, 1024, 16384]
    renewal = speed_of_light(mu, mu2, caps)
    assert np.all(e_star <= speed_of_light(mu, mu2, caps, form="threshold"))
    assert np.all(speed_of_light(mu, mu2, caps, form="threshold") <= renewal)
    assert np.all(renewal <= speed_of_light(mu, mu2, caps, form="published"))


def test_threshold_form_is_the_minimum_over_t():
    for mu, mu2, cap in [(1.0331, 1.6159, 64), (0.428, 1.134, 1000), (0.05, 0.01, 3), (0.2, 0.5, 2)]:
        objective = lambda t: t / mu + mu2 / mu ** 2 - 1 + cap * math.exp(-t)
        numeric = minimize_scalar(objective, bounds=(0, 60), method="bounded", options={"xatol": 1e-10})
        best = min(numeric.fun, objective(0.0))
        assert speed_of_light(mu, mu2, cap, form="threshold") == pytest.approx(best, abs=1e-7)
        assert speed_of_light(mu, mu2, cap, form="threshold") <= speed_of_light(mu, mu2, cap) + 1e-12
    # μP < 1: clamp t = 0, bound = μ₂/μ² − 1 + P
    assert speed_of_light(0.05, 0.01, 3, form="threshold") == pytest.approx(0.01 / 0.0025 - 1 + 3)


def test_speed_of_light_is_vectorised_and_bound_all_forms():
    out = bound_all_forms(1.0331, 1.6159, [16, 64, 256])
    forms = ("published", "renewal", "threshold", "asymptotic")
    assert set(out) == {"capacity", *forms, *(f"{f}_is_bound" for f in forms)}
    for form in ("published", "renewal", "threshold", "asymptotic"):
        assert out[form].shape == (3,)
        np.testing.assert_allclose(out[form], [speed_of_light(1.0331, 1.6159, c, form=form) for c in (16, 64, 256)])
    assert isinstance(speed_of_light(1.0, 2.0, 10), float)
    assert speed_of_light(1.0, 2.0, np.array([[4, 8]])).shape == (1, 2)
    # broadcast over moments too
    assert speed_of_light(np.array([1.0, 2.0]), np.array([2.0, 5.0]), 64).shape == (2,)


@pytest.mark.parametrize("kwargs,match", [
    (dict(mu=0.0, mu2=1.0, capacity=8), "mu"),
    (dict(mu=-1.0, mu2=1.0, capacity=8), "mu"),
    (dict(mu=1.0, mu2=2.0, capacity=0.5), "capacity"),
    (dict(mu=1.0, mu2=2.0, capacity=[4, 0]), "capacity"),
    (dict(mu=1.0, mu2=2.0, capacity=8, form="tight"), "form"),
    (dict(mu=1.0, mu2=0.5, capacity=8), "Jensen"),                # Var(Y) or wrong units
    (dict(mu=np.nan, mu2=2.0, capacity=8), "finite"),
])
def test_speed_of_light_validation(kwargs, match):
    with pytest.raises(SpecboundError, match=match):
        speed_of_light(**kwargs)


# ------------------------------------------------------------------------------------ T4
def iid_environment_rows(rng, n):
    """Fresh softmax(β·g) per node, g ~ N(0, I_16), β uniform on {0.5, 2, 6} (Pankratov §5 T4)."""
    beta = rng.choice([0.5, 2.0, 6.0], size=(n, 1))
    return np.exp(log_softmax(beta * rng.normal(size=(n, 16)), axis=-1))


@pytest.mark.montecarlo
def test_T4_iid_random_environment_moments():
    rng = np.random.default_rng(2024)
    rows = iid_environment_rows(rng, 200_000)
    est = estimate_moments(rows)
    H, _ = entropy_moments(rows)
    se_H2 = (H ** 2).std(ddof=1) / math.sqrt(H.size)
    # reference estimates μ = 1.611, μ₂ = 4.164, E[H²] = 3.475 (3 dp); allow 4 SE + rounding
    assert est.mu == pytest.approx(1.611, abs=4 * est.se_mu + 5e-4)
    assert est.mu2 == pytest.approx(4.164, abs=4 * est.se_mu2 + 5e-4)
    assert est.mean_H2 == pytest.approx(3.475, abs=4 * se_H2 + 5e-4)
    # Var(Y) = μ₂ − μ²; its SE is at most se(μ₂) + 2μ·se(μ)
    se_var = est.se_mu2 + 2 * est.mu * est.se_mu
    assert est.var_surprisal == pytest.approx(4.164 - 1.611 ** 2, abs=4 * se_var + 2e-3)


@pytest.mark.montecarlo
def test_T4_iid_random_environment_slope_and_bounds():
    rng = np.random.default_rng(7)
    caps = np.array([64, 256, 1024])
    # 80 environments (the reference values used 200) keep this test ~2 s: the per-environment slope has a
    # relative SD of ~4 %, so the slope's SE is ~0.45 %, far inside the 5 % tolerance
    n_env = 80
    pool = iid_environment_rows(rng, n_env * 1100)      # each node's law is a fresh row
    cursor = [0]
    def next_probs(path):
        cursor[0] += 1
        return pool[cursor[0] - 1]
    values = np.empty((n_env, caps.size))
    for env in range(n_env):
        tree = optimal_tree(next_probs, int(caps[-1]))        # adapts to the realised environment
        values[env] = np.cumsum(tree.path_probs)[caps - 1]    # nested: E*(64), E*(256), E*(1024)
    mean = values.mean(axis=0)
    se = values.std(axis=0, ddof=1) / math.sqrt(n_env)
    # reference (Pankratov §5 T4): E* ≈ 2.70, 3.54, 4.40 (its own 200 environments, 2 dp); tolerance 4 SE + rounding
    np.testing.assert_array_less(np.abs(mean - [2.70, 3.54, 4.40]), 4 * se + 0.005)
    mu, mu2 = 1.611, 4.164
    np.testing.assert_allclose(speed_of_light(mu, mu2, caps, form="asymptotic"), [2.68, 3.54, 4.40], atol=0.006)
    # slope of E* versus ln P is 1/μ within 5 %
    slope = np.polyfit(np.log(caps), mean, 1)[0]
    assert slope == pytest.approx(1 / mu, rel=0.05)
    # the bounds hold for the adaptive oracle tree (on the mean over environments)
    assert np.all(mean <= speed_of_light(mu, mu2, caps, form="threshold"))
    assert np.all(mean <= speed_of_light(mu, mu2, caps, form="renewal"))
    assert np.all(mean <= speed_of_light(mu, mu2, caps, form="published"))


# ------------------------------------------------------------------------------------ T5
@pytest.mark.parametrize("target", [(0.6, 0.25, 0.1, 0.05), (0.5, 0.3, 0.2), (0.9, 0.05, 0.03, 0.02),
                                    (0.25, 0.25, 0.25, 0.25), (0.99, 0.01), (0.5, 0.5)])
def test_T5_bounds_hold_for_every_P_at_least_3(target):
    caps = np.arange(3, 1501)
    values = np.cumsum(optimal_tree(constant(target), int(caps[-1])).path_probs)[caps - 1]
    mu, mu2 = entropy_moments(np.array(target))
    threshold = speed_of_light(mu, mu2, caps, form="threshold")
    renewal = speed_of_light(mu, mu2, caps, form="renewal")
    published = speed_of_light(mu, mu2, caps, form="published")
    assert np.all(values <= threshold + 1e-12)
    assert np.all(threshold <= renewal + 1e-12)
    assert np.all(renewal <= published + 1e-12)                 # needs ln P ≥ 1, i.e. P ≥ 3


def test_published_form_is_below_renewal_for_P_2():
    # (μ+μ₂)·ln P ≥ μ ln P + μ₂ fails when ln P < 1: the published rewriting needs P ≥ 3
    assert speed_of_light(1.0, 2.0, 2, form="published") < speed_of_light(1.0, 2.0, 2, form="renewal")


@pytest.mark.parametrize("target", [(0.6, 0.25, 0.1, 0.05), (0.5, 0.5), (0.9, 0.05, 0.03, 0.02)])
def test_published_form_is_flagged_not_a_bound_below_P_3_against_the_optimal_tree(target):
    mu, mu2 = entropy_moments(np.array(target))
    caps = [1, 2, 3, 4, 16]
    optimum = np.cumsum(optimal_tree(constant(target), caps[-1]).path_probs)[np.array(caps) - 1]
    assert optimum[0] == pytest.approx(max(target))                       # E*(1) = the most likely token
    out = bound_all_forms(mu, mu2, caps)
    # P = 1: the published form is 0, below the optimum: it is not a bound there, and is flagged so
    assert out["published"][0] == 0.0 < optimum[0]
    # P = 2: its derivation (ln P ≥ 1) fails, it sits below the renewal bound: flagged not a bound
    assert out["published"][1] < out["renewal"][1]
    np.testing.assert_array_equal(out["published_is_bound"], [False, False, True, True, True])
    np.testing.assert_array_equal(out["asymptotic_is_bound"], [False] * 5)
    # every form flagged as a bound is ≥ the optimal tree value (for these i.i.d. targets)
    for form in ("published", "renewal", "threshold"):
        np.testing.assert_array_equal(out[f"{form}_is_bound"], [bound_is_valid(form, c) for c in caps])
        flagged = out[f"{form}_is_bound"]
        assert np.all(out[form][flagged] >= optimum[flagged] - 1e-12), form
    assert np.all(out["renewal_is_bound"]) and np.all(out["threshold_is_bound"])
    # real capacities just above 1: published → 0 while the optimum stays max p
    assert speed_of_light(mu, mu2, 1.01, form="published") < max(target)
    assert bound_is_valid("published", 2.99) is False and bound_is_valid("published", 3) is True
    with pytest.raises(SpecboundError, match="form"):
        bound_is_valid("loose", 4)


def test_T5_zero_entropy_has_no_bound_but_chain_of_P():
    assert optimal_tree(constant([1.0, 0.0]), 25).value == 25
    mu, mu2 = entropy_moments(np.array([1.0, 0.0]))
    with pytest.raises(SpecboundError, match="chain"):
        speed_of_light(mu, mu2, 25)


def test_T5_log_base_switch():
    mu, mu2 = entropy_moments(np.array([0.6, 0.25, 0.1, 0.05]))
    mu_bits, mu2_bits = mu / LN2, mu2 / LN2 ** 2
    for form in ("published", "renewal", "threshold", "asymptotic"):
        np.testing.assert_allclose(speed_of_light(mu_bits, mu2_bits, CAPS, form=form, units="bits"),
                                   speed_of_light(mu, mu2, CAPS, form=form), rtol=1e-12)
    # the renewal form is base-free even when evaluated literally with log2 P and bit moments …
    literal_renewal = np.log2(CAPS) / mu_bits + mu2_bits / mu_bits ** 2
    np.testing.assert_allclose(literal_renewal, speed_of_light(mu, mu2, CAPS), rtol=1e-12)
    # … the published form is not: (μ + μ₂/ln 2)·ln P/μ² in nats-equivalent
    # (docs/paper-notes.md, Pankratov §3.1; logged, not a bug)
    literal_published = (mu_bits + mu2_bits) * np.log2(CAPS) / mu_bits ** 2
    np.testing.assert_allclose(literal_published, (mu + mu2 / LN2) * np.log(CAPS) / mu ** 2, rtol=1e-12)
    assert np.all(literal_published > speed_of_light(mu, mu2, CAPS, form="published"))
    print("published form, literal base 2 vs nats:", literal_published.round(2),
          speed_of_light(mu, mu2, CAPS, form="published").round(2))


# ------------------------------------------------------------------------------------ T7
def test_T7_units_bits_are_converted_or_rejected():
    mu, mu2 = entropy_moments(np.array([0.6, 0.25, 0.1, 0.05]))
    # converting explicitly gives the nats answer
    assert speed_of_light(mu / LN2, mu2 / LN2 ** 2, 64, units="bits") == pytest.approx(speed_of_light(mu, mu2, 64))
    # μ in bits with μ₂ in nats violates Jensen (μ₂ < μ²) → raise, naming the units confusion
    with pytest.raises(SpecboundError, match="bits"):
        speed_of_light(mu / LN2, mu2, 64)
    # μ₂ given as Var(Y) (< μ² here) is caught by the same check
    with pytest.raises(SpecboundError, match="Var"):
        speed_of_light(mu, mu2 - mu ** 2, 64)
    with pytest.raises(SpecboundError, match="units"):
        speed_of_light(mu, mu2, 64, units="log10")
    with pytest.raises(SpecboundError, match="units"):
        bound_all_forms(mu, mu2, [64], units="bit")
    # bits mode also applies Jensen after conversion
    with pytest.raises(SpecboundError, match="Jensen"):
        speed_of_light(2.0, 1.0, 64, units="bits")
