"""Bias / rejection trade-off of over-acceptance decoding (Yin et al. 2024, §5: Thm 4, Thm 5).

One rejection step: a token y ~ draft is accepted with probability b(y); otherwise a token is drawn
from a resampling law P. The output law is draft·b + (1 − β)·P with β = Σ draft·b. Standard
speculative decoding is b = min(1, target/draft) with P = [target − draft]_+ normalised (unbiased).
Over-acceptance takes b ≥ min(1, target/draft): fewer rejections, some bias.

* Decoding-OPT resamples from P* = [target − b·draft]_+ normalised (Thm 4: minimal TV bias).
* Decoding-UNO resamples from P = target (same b, same rejection rate, more bias).

Naming follows docs/design.md (``target`` / ``draft``; never bare p/q). Every function that takes a
target and a draft takes them keyword-only, target first (the arrays share a shape, so a positional
swap would give silently wrong numbers). All functions work over the last axis and broadcast over
leading axes, except the LP cross-check and the Pareto sweep, which take single vectors.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SpecboundError
from .distributions import as_distribution, residual, tv

__all__ = [
    "OVER_ACCEPTANCE_FORMS",
    "over_acceptance",
    "optimal_residual",
    "minimal_bias",
    "tradeoff_point",
    "output_law",
    "tv_loss",
    "uno_bias",
    "lp_minimal_bias",
    "ParetoFront",
    "pareto_front",
]

#: Supported ways an over-acceptance threshold ε sets b (an open point: docs/paper-notes.md, Yin §6.2).
OVER_ACCEPTANCE_FORMS = ("additive", "ratio")


def _pair(target, draft):
    target = as_distribution(target, "target")
    draft = as_distribution(draft, "draft")
    if draft.shape[-1] != target.shape[-1]:
        raise SpecboundError(f"draft has {draft.shape[-1]} tokens but target has {target.shape[-1]}")
    return target, draft


def _accept(accept, shape, atol: float = 1e-12) -> np.ndarray:
    accept = np.asarray(accept, dtype=np.float64)
    try:
        np.broadcast_shapes(accept.shape, shape)
    except ValueError:
        raise SpecboundError(f"accept shape {accept.shape} does not broadcast with distributions {shape}") from None
    if not np.all(np.isfinite(accept)) or np.any(accept < -atol) or np.any(accept > 1 + atol):
        raise SpecboundError("accept (acceptance probabilities b) must lie in [0, 1]")
    return np.clip(accept, 0.0, 1.0)


def over_acceptance(*, target, draft, eps, form: str = "additive") -> np.ndarray:
    """Over-accepting acceptance probabilities b ≥ min(1, target/draft) (Yin et al. 2024, §5, Thm 5).

    ``form="additive"`` (default): b = min(1, (target + ε)/draft), the most likely reading of the
    paper's threshold ε (docs/paper-notes.md, Yin §2.3 and open point §6.2).
    ``form="ratio"``: b = min(1, target/draft + ε), the alternative reading.
    Both reduce to standard SD at ε = 0. Where draft = 0 the token is never drafted and b = 1.
    ``eps`` must be ≥ 0 and broadcasts against the leading axes (a scalar or an array ending in 1).
    """
    target, draft = _pair(target, draft)
    eps = np.asarray(eps, dtype=np.float64)
    if not np.all(np.isfinite(eps)) or np.any(eps < 0):
        raise SpecboundError(f"eps (over-acceptance threshold) must be finite and >= 0, got {eps!r}")
    if form not in OVER_ACCEPTANCE_FORMS:
        raise SpecboundError(f"form must be one of {OVER_ACCEPTANCE_FORMS}, got {form!r}")
    positive = draft > 0
    safe = np.where(positive, draft, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        if form == "additive":
            ratio = (target + eps) / safe
        else:
            ratio = target / safe + eps
    return np.where(positive, np.minimum(1.0, ratio), 1.0)


def optimal_residual(*, target, draft, accept) -> np.ndarray:
    """Optimal resampling law P* = [target − b·draft]_+ / Σ[target − b·draft]_+ (Yin et al. 2024, Thm 4).

    Minimises TV(draft·b + (1 − β)·P, target) over P for the given acceptance b (Decoding-OPT).
    Where the positive part has no mass nothing is ever rejected and the target is returned.
    """
    target, draft = _pair(target, draft)
    accept = _accept(accept, np.broadcast_shapes(draft.shape, target.shape))
    return residual(target=target, draft=draft, accept=accept)


def minimal_bias(*, target, draft, accept) -> np.ndarray:
    """Loss*_TV(b) = Σ [b·draft − target]_+, the least TV bias reachable with acceptance b (Yin et al. 2024, Thm 4)."""
    target, draft = _pair(target, draft)
    accept = _accept(accept, np.broadcast_shapes(draft.shape, target.shape))
    return np.clip(accept * draft - target, 0.0, None).sum(axis=-1)


def tradeoff_point(*, target, draft, accept) -> tuple[np.ndarray, np.ndarray]:
    """(rejection probability 1 − Σ draft·b, minimal bias Σ[b·draft − target]_+) (Yin et al. 2024, Thm 4, Thm 5).

    For over-accepting b (b ≥ min(1, target/draft)) the two add up to TV(draft, target) (Thm 5);
    for any b they add up to at least that.
    """
    target, draft = _pair(target, draft)
    accept = _accept(accept, np.broadcast_shapes(draft.shape, target.shape))
    rejection = 1.0 - (draft * accept).sum(axis=-1)
    bias = np.clip(accept * draft - target, 0.0, None).sum(axis=-1)
    return rejection, bias


def output_law(*, draft, accept, resample) -> np.ndarray:
    """Output law A_{b,P} = draft·b + (1 − β)·P with β = Σ draft·b (Yin et al. 2024, Thm 4).

    Keyword-only: ``draft`` and ``resample`` are laws of the same shape.
    """
    draft = as_distribution(draft, "draft")
    resample = as_distribution(resample, "resample")
    accept = _accept(accept, draft.shape)
    beta = (draft * accept).sum(axis=-1, keepdims=True)
    return draft * accept + (1.0 - beta) * resample


def tv_loss(*, target, draft, accept, resample=None) -> np.ndarray:
    """Loss_TV(b, P) = TV(draft·b + (1 − β)·P, target) (Yin et al. 2024, Thm 4).

    ``resample=None`` uses the optimal P* (:func:`optimal_residual`), giving Loss*_TV(b).
    """
    target, draft = _pair(target, draft)
    if resample is None:
        resample = optimal_residual(target=target, draft=draft, accept=accept)
    return tv(output_law(draft=draft, accept=accept, resample=resample), target)


def uno_bias(*, target, draft, accept) -> np.ndarray:
    """TV bias of Decoding-UNO (resample = target): ½ Σ |draft·b − β·target| (Yin et al. 2024, Thm 4, §5).

    Never below :func:`minimal_bias` (Decoding-OPT) for the same b.
    """
    target, draft = _pair(target, draft)
    return tv_loss(target=target, draft=draft, accept=accept,
                   resample=np.broadcast_to(target, np.broadcast_shapes(draft.shape, target.shape)))


def lp_minimal_bias(*, target, draft, accept) -> tuple[float, np.ndarray]:
    """min_P TV(draft·b + (1 − β)·P, target) solved as a linear program (Yin et al. 2024, Thm 4 cross-check).

    Variables (P, t) with t ≥ |draft·b + (1 − β)·P − target| elementwise, P in the simplex; the
    objective is ½ Σ t. Uses ``scipy.optimize.linprog`` (HiGHS). Single vectors only.
    Returns (minimal loss, a minimising P).
    """
    from scipy.optimize import linprog

    target, draft = _pair(target, draft)
    if draft.ndim != 1 or target.ndim != 1:
        raise SpecboundError("lp_minimal_bias takes single distributions (1-D vectors)")
    accept = _accept(accept, draft.shape)
    accept = np.broadcast_to(accept, draft.shape)
    size = draft.shape[0]
    accepted = draft * accept
    free = 1.0 - accepted.sum()
    eye = np.eye(size)
    # (1 − β)P − t ≤ target − draft·b  and  −(1 − β)P − t ≤ draft·b − target
    a_ub = np.block([[free * eye, -eye], [-free * eye, -eye]])
    b_ub = np.concatenate([target - accepted, accepted - target])
    a_eq = np.concatenate([np.ones(size), np.zeros(size)])[None, :]
    cost = np.concatenate([np.zeros(size), 0.5 * np.ones(size)])
    result = linprog(
        cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=[1.0], bounds=[(0, None)] * (2 * size),
        method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    if not result.success:
        raise SpecboundError(f"linprog failed: {result.message}")
    return float(result.fun), result.x[:size]


@dataclass(frozen=True)
class ParetoFront:
    """Points of the rejection/bias trade-off for an ε sweep, plus the line rej + bias = TV
    (Yin et al. 2024, Thm 5, Fig. 4)."""

    eps: np.ndarray
    rejection: np.ndarray        # 1 − Σ draft·b(ε)
    bias: np.ndarray             # Decoding-OPT bias Loss*_TV(b(ε))
    uno_bias: np.ndarray         # Decoding-UNO bias at the same b(ε)
    tv: float                    # TV(draft, target)
    line_rejection: np.ndarray   # endpoints of the line: (0, TV) ... (TV, 0)
    line_bias: np.ndarray


def pareto_front(*, target, draft, eps_grid, form: str = "additive") -> ParetoFront:
    """Rejection probability and minimal bias along an over-acceptance sweep (Yin et al. 2024, Thm 5, Fig. 4).

    For every ε in ``eps_grid``, b = :func:`over_acceptance` (``form`` as there); the OPT points lie on
    the line rejection + bias = TV(draft, target), from standard SD (TV, 0) towards accept-all (0, TV).
    Single distributions (1-D vectors).
    """
    target, draft = _pair(target, draft)
    if draft.ndim != 1 or target.ndim != 1:
        raise SpecboundError("pareto_front takes single distributions (1-D vectors)")
    eps = np.atleast_1d(np.asarray(eps_grid, dtype=np.float64))
    if eps.ndim != 1:
        raise SpecboundError("eps_grid must be a 1-D sequence of thresholds")
    accept = over_acceptance(target=target, draft=draft, eps=eps[:, None], form=form)      # (E, V)
    rejection, bias = tradeoff_point(target=target, draft=draft, accept=accept)
    distance = float(tv(draft, target))
    return ParetoFront(
        eps=eps,
        rejection=rejection,
        bias=bias,
        uno_bias=uno_bias(target=target, draft=draft, accept=accept),
        tv=distance,
        line_rejection=np.array([0.0, distance]),
        line_bias=np.array([distance, 0.0]),
    )
