"""Expected rejections of speculative decoding on Markov chains (Yin et al. 2024, §3).

Conventions: ``draft`` and ``target`` are :class:`MarkovChain` s over the same states; the prefix
x_{1:n-1} is summarised by the current state, and prefixes are distributed as under the target
(the accepted prefix has the target's law, Thm 1).
"""
from __future__ import annotations

import numpy as np

from ..errors import SpecboundError
from .chains import MarkovChain
from .distributions import residual, tv

__all__ = [
    "standard_acceptance",
    "expected_rejections",
    "rejections_per_position",
    "check_rejection_based",
    "rejection_based_output",
    "rejection_based_expected_rejections",
    "random_rejection_based_acceptance",
]


def _check_pair(draft: MarkovChain, target: MarkovChain, horizon: int) -> int:
    if not isinstance(draft, MarkovChain) or not isinstance(target, MarkovChain):
        raise SpecboundError("draft and target must be specbound.theory.MarkovChain instances")
    if draft.n_states != target.n_states:
        raise SpecboundError(
            f"draft has {draft.n_states} states but target has {target.n_states}: vocabularies must match"
        )
    horizon = target.check_horizon(horizon)
    draft.check_horizon(horizon)
    return horizon


def standard_acceptance(draft_probs, target_probs) -> np.ndarray:
    """b(x) = min(1, target(x)/draft(x)), the acceptance of Alg. 1 (1 where the draft has no mass)."""
    draft_probs = np.asarray(draft_probs, dtype=np.float64)
    target_probs = np.asarray(target_probs, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(draft_probs > 0, target_probs / np.where(draft_probs > 0, draft_probs, 1.0), 1.0)
    return np.minimum(1.0, ratio)


def rejections_per_position(draft: MarkovChain, target: MarkovChain, horizon: int) -> np.ndarray:
    """P(R_n = 1) for n = 1..T: E_{x_{n-1} ~ target}[TV(draft_n, target_n)] (Yin et al. 2024, Thm 1)."""
    horizon = _check_pair(draft, target, horizon)
    mu = target.marginals(horizon)[:-1]                       # laws of x_0..x_{T-1}
    per_state_tv = tv(draft.stack(horizon), target.stack(horizon))  # (T, S)
    return (mu * per_state_tv).sum(axis=1)


def expected_rejections(draft: MarkovChain, target: MarkovChain, horizon: int) -> float:
    """Exact E[N_rej] of speculative decoding drafting to the horizon (Yin et al. 2024, Thm 1).

    E[N_rej] = Σ_{n=1}^T E_{x_{1:n-1} ~ target}[ TV(draft_n(·|x_{1:n-1}), target_n(·|x_{1:n-1})) ].
    With drafting to the horizon every round ends at a rejection, so the speed-up over
    autoregressive decoding under Assumption 1 is T / E[N_rej].
    """
    return float(rejections_per_position(draft, target, horizon).sum())


def check_rejection_based(draft_probs, target_probs, accept, atol: float = 1e-12) -> np.ndarray:
    """Validate an acceptance b of the unbiased rejection-based family: 0 ≤ b ≤ min(1, target/draft)."""
    accept = np.asarray(accept, dtype=np.float64)
    if accept.shape != np.shape(draft_probs):
        raise SpecboundError(f"acceptance shape {accept.shape} != distribution shape {np.shape(draft_probs)}")
    if np.any(accept < -atol) or np.any(accept > 1 + atol):
        raise SpecboundError("acceptance probabilities must lie in [0, 1]")
    excess = accept * np.asarray(draft_probs) - np.asarray(target_probs)
    if np.any(excess > atol):
        raise SpecboundError(
            "acceptance exceeds min(1, target/draft): this over-accepts and biases the output "
            "(use the relaxed/biased decoders for that)"
        )
    return np.clip(accept, 0.0, 1.0)


def rejection_based_output(draft_probs, target_probs, accept, resample=None) -> np.ndarray:
    """Output law of one rejection step: draft·b + (1 − β)·P with β = Σ draft·b (Yin et al. 2024, Thm 2).

    ``resample`` defaults to the residual [target − b·draft]_+ normalised.
    """
    draft_probs = np.asarray(draft_probs, dtype=np.float64)
    accept = np.asarray(accept, dtype=np.float64)
    if resample is None:
        resample = residual(target_probs, draft_probs, accept)
    beta = (draft_probs * accept).sum(axis=-1, keepdims=True)
    return draft_probs * accept + (1.0 - beta) * np.asarray(resample, dtype=np.float64)


def rejection_based_expected_rejections(
    draft: MarkovChain, target: MarkovChain, accept, horizon: int
) -> float:
    """Exact E[N_rej] of an unbiased rejection-based algorithm with acceptance b (Yin et al. 2024, Thm 2).

    ``accept`` has the shape of the transitions, (S, S) or (T, S, S): accept[n, s, y] is the
    probability of accepting drafted token y at step n+1 from state s. Because the algorithm is
    unbiased the prefix law is the target's, so E[N_rej] = Σ_n E_{x ~ target}[1 − Σ_y draft·b].
    Thm 2: this is never below :func:`expected_rejections`, with equality iff b = min(1, target/draft).
    """
    horizon = _check_pair(draft, target, horizon)
    draft_mats = draft.stack(horizon)
    accept = np.asarray(accept, dtype=np.float64)
    if accept.ndim == 2:
        accept = np.broadcast_to(accept, draft_mats.shape)
    else:
        accept = accept[:horizon]
    accept = check_rejection_based(draft_mats, target.stack(horizon), accept)
    mu = target.marginals(horizon)[:-1]
    reject = 1.0 - (draft_mats * accept).sum(axis=-1)      # (T, S)
    return float((mu * reject).sum())


def random_rejection_based_acceptance(draft: MarkovChain, target: MarkovChain, horizon: int, seed=None):
    """A random member of the unbiased family: b = u · min(1, target/draft), u ~ U[0, 1] per entry."""
    horizon = _check_pair(draft, target, horizon)
    rng = np.random.default_rng(seed)
    base = standard_acceptance(draft.stack(horizon), target.stack(horizon))
    return base * rng.random(base.shape)
