"""Over-acceptance trade-off (Yin et al. 2024, Thm 4, Thm 5; docs/paper-notes.md, Yin §5 item 5)."""
import numpy as np
import pytest

from specbound.errors import SpecboundError
from specbound.theory.distributions import tv
from specbound.theory.rejections import standard_acceptance
from specbound.theory.tradeoff import (
    lp_minimal_bias, minimal_bias, optimal_residual, output_law, over_acceptance, pareto_front,
    tradeoff_point, tv_loss, uno_bias,
)

EPS = [0.0, 0.01, 0.05, 0.1, 0.2, 0.4, 0.8]
V = 10


def _instances(n, seed):
    rng = np.random.default_rng(seed)
    return [(rng.dirichlet(np.full(V, 0.7)), rng.dirichlet(np.full(V, 0.7))) for _ in range(n)]


@pytest.mark.parametrize("form", ["additive", "ratio"])
def test_lp_agrees_with_closed_form_and_pareto_identity(form):
    for draft, target in _instances(6, seed=1 if form == "additive" else 2):
        distance = tv(draft, target)
        for eps in EPS:
            accept = over_acceptance(target=target, draft=draft, eps=eps, form=form)
            assert np.all(accept >= standard_acceptance(target=target, draft=draft) - 1e-15)      # over-accepting
            lp_loss, lp_resample = lp_minimal_bias(target=target, draft=draft, accept=accept)
            closed = minimal_bias(target=target, draft=draft, accept=accept)
            assert lp_loss == pytest.approx(closed, abs=1e-8)
            # P* attains the optimum, and its loss is Σ[b·draft − target]_+ (Thm 4)
            assert tv_loss(target=target, draft=draft, accept=accept) == pytest.approx(closed, abs=1e-12)
            lp_loss_closed_form = tv_loss(target=target, draft=draft, accept=accept, resample=lp_resample)
            assert lp_loss_closed_form == pytest.approx(closed, abs=1e-8)
            rejection, bias = tradeoff_point(target=target, draft=draft, accept=accept)
            assert rejection + bias == pytest.approx(distance, abs=1e-10)                # Thm 5


def test_eps_zero_is_standard_sd_and_forms_differ():
    draft, target = _instances(1, seed=3)[0]
    for form in ("additive", "ratio"):
        accept = over_acceptance(target=target, draft=draft, eps=0.0, form=form)
        np.testing.assert_allclose(accept, standard_acceptance(target=target, draft=draft), atol=1e-15)
        rejection, bias = tradeoff_point(target=target, draft=draft, accept=accept)
        assert rejection == pytest.approx(tv(draft, target), abs=1e-12) and bias == pytest.approx(0, abs=1e-12)
        np.testing.assert_allclose(output_law(draft=draft, accept=accept, resample=optimal_residual(target=target,
                                                                                                    draft=draft,
                                                                                                    accept=accept)),
                                   target,
                                   atol=1e-14)
    additive = over_acceptance(target=target, draft=draft, eps=0.1, form="additive")
    ratio = over_acceptance(target=target, draft=draft, eps=0.1, form="ratio")
    assert not np.allclose(additive, ratio)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(additive, np.minimum(1, (target + 0.1) / draft))
        np.testing.assert_allclose(ratio, np.minimum(1, target / draft + 0.1))


def test_arbitrary_acceptance_and_resampling_never_beat_the_line():
    rng = np.random.default_rng(4)
    for draft, target in _instances(50, seed=5):
        distance = tv(draft, target)
        accept = rng.random(V)
        resample = rng.dirichlet(np.ones(V))
        rejection = 1 - (draft * accept).sum()
        for law in (resample, target, optimal_residual(target=target, draft=draft, accept=accept)):
            assert rejection + tv_loss(target=target, draft=draft, accept=accept, resample=law) >= distance - 1e-12
        # Thm 4: P* is at least as good as any other resampling law, in particular UNO's
        best = tv_loss(target=target, draft=draft, accept=accept)
        assert best == pytest.approx(minimal_bias(target=target, draft=draft, accept=accept), abs=1e-12)
        assert tv_loss(target=target, draft=draft, accept=accept, resample=resample) >= best - 1e-12
        assert uno_bias(target=target, draft=draft, accept=accept) >= best - 1e-12


def test_uno_loss_at_least_opt_loss_on_the_sweep():
    for draft, target in _instances(10, seed=6):
        for form in ("additive", "ratio"):
            front = pareto_front(target=target, draft=draft, eps_grid=EPS, form=form)
            assert np.all(front.uno_bias >= front.bias - 1e-12)
            np.testing.assert_allclose(front.rejection + front.bias, front.tv, atol=1e-10)
            assert np.all(np.diff(front.rejection) <= 1e-15)                  # more ε, fewer rejections
            accept = over_acceptance(target=target, draft=draft, eps=np.array(EPS)[:, None], form=form)
            beta = (draft * accept).sum(-1, keepdims=True)
            np.testing.assert_allclose(front.uno_bias, 0.5 * np.abs(draft * accept - beta * target).sum(-1),
                                       atol=1e-14)
    assert front.line_rejection.tolist() == [0.0, front.tv] and front.line_bias.tolist() == [front.tv, 0.0]


def _sample_one_step(draft, accept, resample, size, rng):
    """The one-step over-acceptance sampler: y ~ draft, accept w.p. b(y), else z ~ resample."""
    drafted = rng.choice(V, size=size, p=draft)
    keep = rng.random(size) < accept[drafted]
    recovered = rng.choice(V, size=size, p=resample)
    return np.where(keep, drafted, recovered)


@pytest.mark.montecarlo
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.4])
def test_monte_carlo_opt_sampler_bias(eps):
    rng = np.random.default_rng(7)
    draft, target = _instances(1, seed=8)[0]
    accept = over_acceptance(target=target, draft=draft, eps=eps)
    samples = _sample_one_step(draft, accept, optimal_residual(target=target, draft=draft, accept=accept), 200_000, rng)
    empirical = np.bincount(samples, minlength=V) / len(samples)
    tolerance = 3 * np.sqrt(V / len(samples))        # ≈ 0.021
    assert abs(tv(empirical, target) - minimal_bias(target=target, draft=draft, accept=accept)) <= tolerance
    # the empirical law is the predicted output law to within sampling error
    assert tv(empirical, output_law(draft=draft, accept=accept, resample=optimal_residual(target=target, draft=draft,
                                                                                          accept=accept))) <= tolerance


def test_broadcasting_over_leading_axes():
    rng = np.random.default_rng(9)
    draft = rng.dirichlet(np.ones(V), size=(3, 4))
    target = rng.dirichlet(np.ones(V), size=(3, 4))
    accept = over_acceptance(target=target, draft=draft, eps=0.05)
    rejection, bias = tradeoff_point(target=target, draft=draft, accept=accept)
    assert rejection.shape == bias.shape == (3, 4)
    np.testing.assert_allclose(rejection + bias, tv(draft, target), atol=1e-12)
    assert optimal_residual(target=target, draft=draft, accept=accept).shape == (3, 4, V)
    assert uno_bias(target=target, draft=draft, accept=accept).shape == (3, 4)


def test_bad_inputs_raise():
    draft, target = _instances(1, seed=10)[0]
    with pytest.raises(SpecboundError):
        over_acceptance(target=target, draft=draft, eps=-0.1)
    with pytest.raises(SpecboundError):
        over_acceptance(target=target, draft=draft, eps=0.1, form="multiplicative")
    with pytest.raises(SpecboundError):
        optimal_residual(target=target, draft=draft, accept=np.full(V, 1.5))
    with pytest.raises(SpecboundError):
        tradeoff_point(target=target[:-1] / target[:-1].sum(), draft=draft, accept=np.ones(V - 1))
    with pytest.raises(SpecboundError):
        lp_minimal_bias(target=np.tile(target, (2, 1)), draft=np.tile(draft, (2, 1)), accept=np.ones(V))


def test_public_exports():
    import specbound.theory as theory
    for name in ("optimal_residual", "tradeoff_point", "over_acceptance", "pareto_front",
                 "batch_expected_rejections", "residual_chain", "batch_rejections_limit"):
        assert name in theory.__all__ and hasattr(theory, name)
